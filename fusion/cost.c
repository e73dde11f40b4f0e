/*
 * cost.c: the cost model (kf_cost.h). Estimates the time of one kernel
 * group on a device profile, roofline style, from the grid the group's
 * kernel form launches. The planner (plan_build.c) asks it before every
 * merge; the report and --json print its answer per group.
 *
 * Forms and their grids mirror what codegen/ and kernels/ launch (numbers
 * here must follow codegen/README.md "Templates"):
 *
 *   ew         one work-item per element, 256 per block, at most
 *              KF_COST_MAX_BLOCKS blocks (the CUDA launcher's cap)
 *   reduce     segments of T = clamp(pow2 >= row / 4, 32, 256) lanes per
 *              row, 256 / T rows per block; a few passes over each row
 *   gemm       64 x 64 output tiles, 256 work-items of 4 x 4 outputs
 *   gemm_rows  RM whole rows per block, RM = min(16, 24 KiB / (4 N))
 *   gemm_b2b   the same row tiles holding the first GEMM's rows
 *   conv       one work-item per output pixel and 4 channels
 *   conv_b2b   P pixels per block, P = min(64, 24 KiB / (4 C1))
 *   iconv      ConvInteger of one group: 64 x 64 or 32 x 32 tiles of channels x
 *              pixels, 4 warps of int8 tensor-core fragments (mma.sync)
 *   lib_gemm   cuBLASLt: 128- or 64-wide tiles, split-K to fill the SMs
 *   lib_igemm  the same at the int8 tensor-core rate (IMMA), int32 out
 *   lib_conv   cuDNN: implicit GEMM tiles, split-K likewise
 *
 * A generated block's rate is calibrated per form as a fraction of one
 * SM's FMA peak: the GEMM family's grows with the outputs a work-item
 * keeps in registers (a 4 x 4 tile reuses each loaded value 4 times, a row
 * tile of 8 rows barely twice), the convolutions' is flat. Waves: blocks
 * beyond what the SMs hold at once run after the first ones finish.
 */
#include <math.h>
#include <string.h>

#include "kf_cost.h"

/* The CUDA launcher's grid cap (kernels/cuda.c CU_MAX_BLOCKS): grid-stride
 * loops do the rest of the work in the same blocks. */
#define KF_COST_MAX_BLOCKS 4224
/* Work-items per block of every generated template. */
#define KF_COST_BLOCK 256
/* Shared memory a row-tile anchor keeps its rows in (cg_anchor.c). */
#define KF_COST_ROW_BYTES (24 * 1024)
/* Registers per work-item assumed for a generated anchor (the planner's
 * register estimate gives 96 per anchor): sets how many blocks an SM holds. */
#define KF_COST_ANCHOR_REGS 96

static int64_t numel_of(const kf_graph *g, kf_id v) {
    if (!v) return -1;
    const kf_type *t = &g->values[v].type;
    int64_t n;
    if (!kf_type_is_static(t) || kf_shape_numel(t->rank, t->dims, 1, &n)) return -1;
    return n;
}

static int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

static double sm_peak(const kf_target *t, double tflops) { return tflops * 1e12 / t->sms; }

/* Fixed part of a kernel plus its launch. */
static double finish(const kf_target *t, kf_cost *c, double body_us, double floor_us) {
    c->us = (body_us > floor_us ? body_us : floor_us) + t->launch_us;
    return c->us;
}

static double mem_us(const kf_target *t, double bytes, double fill) {
    if (bytes <= 0) return 0;
    if (fill > 1) fill = 1;
    if (fill <= 0) fill = 1e-3;
    return bytes / (t->dram_gbs * 1e9 * t->ew_frac * fill) * 1e6;
}

static int64_t bytes_of(const kf_cost_group *cg) {
    int64_t b;
    if (cg->bytes_read < 0 || cg->bytes_written < 0 || !kf_add_ok(cg->bytes_read, cg->bytes_written, &b)) return -1;
    return b;
}

static void elementwise(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    int64_t n = numel_of(g, cg->space), bytes = bytes_of(cg);
    c->form = "ew";
    if (n < 0 || bytes < 0) return;
    c->known = true;
    c->blocks = ceil_div(n, KF_COST_BLOCK);
    if (c->blocks > KF_COST_MAX_BLOCKS) c->blocks = KF_COST_MAX_BLOCKS;
    if (c->blocks < 1) c->blocks = 1;
    c->resident = t->max_threads_sm / KF_COST_BLOCK;
    double m = mem_us(t, bytes, (double)c->blocks / t->sms);
    c->bound = m > t->kernel_min_us ? "memory" : "latency";
    finish(t, c, m, t->kernel_min_us);
}

/* Passes a row reduction makes over its row (codegen/README.md "Row
 * reduction"): max then sum of exp(x - max) then the write; mean, squared
 * deviations, write; one fold for plain Reduce*. */
static int red_passes(const kf_node *r) {
    switch (r->op) {
    case KF_OP_SOFTMAX:
    case KF_OP_LOG_SOFTMAX:
    case KF_OP_LAYER_NORMALIZATION:
    case KF_OP_GROUP_NORMALIZATION:
    case KF_OP_INSTANCE_NORMALIZATION:
    case KF_OP_MEAN_VARIANCE_NORMALIZATION: return 3;
    case KF_OP_RMS_NORMALIZATION: return 2;
    default: return 1;
    }
}

/* Rows and row length of reduction node r: a shape-keeping one (Softmax,
 * a norm) reduces the trailing dims from its axis, a Reduce* gives one
 * row per output element. */
static void red_rows(const kf_graph *g, const kf_node *r, int64_t *rows, int64_t *row) {
    int64_t in = numel_of(g, r->nin ? r->in[0] : 0), out = numel_of(g, r->nout ? r->out[0] : 0);
    *rows = *row = -1;
    if (in < 0 || out < 0) return;
    if (out > 0 && out < in) {
        *rows = out;
        *row = in / out;
        return;
    }
    const kf_type *ti = &g->values[r->in[0]].type;
    int64_t axis = kf_attr_i(r, "axis", -1);
    if (axis < 0) axis += ti->rank;
    if (axis < 0 || axis >= ti->rank) axis = ti->rank > 0 ? ti->rank - 1 : 0; /* a scalar: one row of 1 */
    int64_t len = 1;
    for (int d = (int)axis; d < ti->rank; d++) len *= ti->dims[d] > 0 ? ti->dims[d] : 1;
    *row = len;
    *rows = len > 0 ? in / len : 0;
}

/* ---- row reductions ------------------------------------------------------
 *
 * Segments (KF_CG_SEGMENT in codegen): a work-group is cut into segments
 * of T consecutive lanes, each reducing one row. T is the smallest power
 * of two >= K / 4, at least 32 for rows of 32 and more, at least 4 for
 * rows of 8..31, at most 256:
 *  - >= K / 4: each lane folds about 4 elements before the log2(T) reduce
 *    steps, so loads, not the reduce, set the time;
 *  - >= 32 for rows of 32 and more: a segment is whole warps, so on CUDA a
 *    segment of 32 reduces with shuffles alone and a warp never holds two
 *    rows' loads;
 *  - 4..16 for rows of 8..31: a warp holds 2..8 rows, its loads are runs
 *    of consecutive addresses instead of one item per row striding K
 *    apart; a segment under a warp still reduces with shuffles (T divides
 *    32);
 *  - <= 256: rows of 1024 and more have a work-group of 256 to themselves.
 * Rows shorter than 8 run one work-item per row: a few lanes would each
 * fold 1..3 elements and the reduce steps would cost what they replace.
 *
 * Row cache (KF_CG_ROW_CACHE): when the reduced axes are the innermost
 * ones, the last a multiple of V (8 for 16-bit data when the row has 32+
 * steps of 8, else 4) and a lane's share fits in KF_ROW_CACHE_MAX
 * registers, each lane loads its steps of the row once with 16-byte
 * vector loads before any statistic, and T counts steps, not elements
 * (the smallest power of two >= steps / 4, 32..256).
 *
 * Work-group: T times a power of two of rows, at least a warp (CUDA's
 * shuffles name all 32 lanes), at most 256, and more rows per group only
 * while the grid keeps KF_ROW_FILL_GROUPS groups (two per SM of a 132-SM
 * GPU): BERT-base's 128 rows of 768 run as 128 groups of 64 lanes, not 32
 * groups of 256 that leave 100 SMs idle; 32768 rows of 1024 still pack 4
 * rows into each of 8192 groups of 256. */
static uint32_t row_seg(int64_t n, uint32_t t) {
    while (t < KF_ROW_SEG_MAX && (int64_t)t * 4 < n) t *= 2;
    return t;
}

kf_row_form kf_row_form_of(int64_t rows, int64_t K, int64_t W, bool narrow, bool trailing) {
    kf_row_form f = {0};
    if (K < KF_ROW_PER_ITEM || rows < 1) return f;
    f.seg = row_seg(K, K < KF_ROW_SEG_MIN_WARP ? KF_ROW_SEG_MIN : KF_ROW_SEG_MIN_WARP);
    int v = narrow && W % 8 == 0 && K / 8 >= KF_ROW_SEG_MIN_WARP ? 8 : W % 4 == 0 ? 4 : 0;
    if (f.seg >= KF_ROW_SEG_MIN_WARP && trailing && v && K / v >= KF_ROW_SEG_MIN_WARP) {
        uint32_t t = row_seg(K / v, KF_ROW_SEG_MIN_WARP);
        int64_t p = ceil_div(K / v, t);
        if (p * v <= KF_ROW_CACHE_MAX) {
            f.seg = t;
            f.vec = v;
            f.steps = (int)p;
        }
    }
    uint32_t b = f.seg < KF_ROW_BLOCK_MIN ? KF_ROW_BLOCK_MIN : f.seg;
    while (b < KF_ROW_SEG_MAX && ceil_div(rows, 2 * (int64_t)(b / f.seg)) >= KF_ROW_FILL_GROUPS) b *= 2;
    f.block = b;
    return f;
}

int kf_igemm_tile(int64_t m, int64_t n, int64_t batch) {
    return ceil_div(m, 64) * ceil_div(n, 64) * (batch > 0 ? batch : 1) >= KF_GEMM_FILL_TILES ? 64 : 32;
}

int kf_iconv_tile(const kf_graph *g, const kf_node *n) {
    if (n->op != KF_OP_CONV_INTEGER || kf_attr_i(n, "group", 1) != 1 || n->nin < 2 || !n->in[0] || !n->in[1] ||
        !n->out[0])
        return 0;
    const kf_type *xt = &g->values[n->in[0]].type, *wt = &g->values[n->in[1]].type, *ot = &g->values[n->out[0]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(wt) || !kf_type_is_static(ot) || xt->rank < 3 ||
        wt->rank != xt->rank || ot->rank != xt->rank)
        return 0;
    bool x8 = xt->dtype == KF_DT_INT8 || xt->dtype == KF_DT_UINT8, w8 = wt->dtype == KF_DT_INT8 || wt->dtype == KF_DT_UINT8;
    if (!x8 || !w8) return 0;
    if (n->nin > 2 && n->in[2] && numel_of(g, n->in[2]) != 1) return 0;
    if (n->nin > 3 && n->in[3]) {
        const kf_type *zt = &g->values[n->in[3]].type;
        int64_t zn = numel_of(g, n->in[3]);
        if (zn != 1 && (zt->rank != 1 || zn != ot->dims[1])) return 0;
    }
    /* sums of K products of 8-bit differences must fit an int */
    if (ot->dims[1] < 1 || numel_of(g, n->in[1]) / ot->dims[1] > INT32_MAX / (255 * 255)) return 0;
    return kf_mma_conv_tile(ot);
}

int kf_imma_gemm_tile(const kf_graph *g, const kf_node *n) {
    if (n->op != KF_OP_MATMUL_INTEGER || n->nin < 2 || !n->in[0] || !n->in[1] || !n->out[0]) return 0;
    const kf_type *at = &g->values[n->in[0]].type, *bt = &g->values[n->in[1]].type, *ot = &g->values[n->out[0]].type;
    if (!kf_type_is_static(at) || !kf_type_is_static(bt) || !kf_type_is_static(ot) || at->rank < 2 || bt->rank < 2 ||
        ot->rank < 2)
        return 0;
    bool a8 = at->dtype == KF_DT_INT8 || at->dtype == KF_DT_UINT8, b8 = bt->dtype == KF_DT_INT8 || bt->dtype == KF_DT_UINT8;
    int64_t k = at->dims[at->rank - 1];
    if (!a8 || !b8 || k > INT32_MAX / (255 * 255)) return 0;
    int64_t batch = 1;
    for (int d = 0; d < ot->rank - 2; d++) batch *= ot->dims[d];
    int64_t m = ot->dims[ot->rank - 2], nn = ot->dims[ot->rank - 1];
    return ceil_div(m, 64) * ceil_div(nn, 64) * batch >= KF_GEMM_FILL_TILES ? 64 : 32;
}

int kf_mma_conv_tile(const kf_type *ot) {
    int64_t cols = ot->dims[0];
    for (int d = 2; d < ot->rank; d++) cols *= ot->dims[d];
    return ceil_div(ot->dims[1], 64) * ceil_div(cols, 64) >= KF_GEMM_FILL_TILES ? 64 : 32;
}

static bool same_static_dims(const kf_type *x, const kf_type *y) {
    if (!kf_type_is_static(x) || !kf_type_is_static(y) || x->rank != y->rank) return false;
    for (int d = 0; d < x->rank; d++)
        if (x->dims[d] != y->dims[d]) return false;
    return true;
}

int kf_att_passes(const kf_graph *g, const kf_node *a, const kf_node *r, const kf_node *b) {
    if (r->op != KF_OP_SOFTMAX || !r->out[0] || !r->in[0] || b->nin < 1 || !b->in[0]) return 0;
    int passes = 1;
    kf_id v = b->in[0];
    for (int depth = 0; v != r->out[0]; depth++) {
        kf_id p = g->values[v].producer;
        if (depth > 8 || !p || g->values[v].nusers != 1 || g->values[v].is_output) return 0;
        const kf_node *n = &g->nodes[p];
        if (n->op == KF_OP_IDENTITY) {
            v = n->in[0];
            continue;
        }
        bool qdq = n->op == KF_OP_QUANTIZE_LINEAR || n->op == KF_OP_DEQUANTIZE_LINEAR;
        if (!qdq && n->op != KF_OP_CAST) return 0;
        for (int i = 1; qdq && i < n->nin; i++)
            if (n->in[i] && numel_of(g, n->in[i]) != 1) return 0;
        if (!n->in[0] || !same_static_dims(&g->values[n->in[0]].type, &g->values[v].type)) return 0;
        passes = 2;
        v = n->in[0];
    }
    if (passes == 2 && (g->values[v].nusers != 1 || g->values[v].is_output ||
                        !same_static_dims(&g->values[a->out[0]].type, &g->values[r->in[0]].type)))
        return 0;
    return passes;
}

/* A reduction kernel over `rows` rows laid out as f: `passes` passes over
 * each row (one read from memory when the row is cached in registers; the
 * block reduces of every pass remain). */
static void reduce_rows(const kf_target *t, const kf_row_form *f, int64_t rows, int64_t row, int passes, double bytes,
                        kf_cost *c) {
    int64_t block = f->seg ? f->block : KF_COST_BLOCK, per = f->seg ? f->block / f->seg : KF_COST_BLOCK;
    c->blocks = ceil_div(rows, per);
    if (c->blocks > KF_COST_MAX_BLOCKS) c->blocks = KF_COST_MAX_BLOCKS;
    if (c->blocks < 1) c->blocks = 1;
    c->resident = t->max_threads_sm / block;
    if (c->resident > t->max_blocks_sm) c->resident = t->max_blocks_sm;
    double sms = c->blocks < t->sms ? (double)c->blocks : (double)t->sms;
    int reads = f->vec ? 1 : passes;
    double issue = (double)(rows * row) * reads / (sms * t->red_pass_clk * t->clock_ghz * 1e9) * 1e6;
    double m = mem_us(t, bytes, (double)c->blocks / t->sms);
    c->bound = m > issue ? "memory" : "compute";
    finish(t, c, (m > issue ? m : issue) + passes * t->red_pass_us, t->kernel_min_us);
}

/* The row form codegen gives reduction node r over `rows` rows of `row`
 * elements. Trailing axes are read from the shapes: the rows are a prefix
 * of the input's dims (Softmax and the norms reduce from their axis to the
 * end; a Reduce* over inner axes keeps a prefix). */
static kf_row_form red_form(const kf_graph *g, const kf_node *r, int64_t rows, int64_t row) {
    const kf_type *ti = &g->values[r->in[0]].type;
    bool narrow = ti->dtype == KF_DT_FLOAT16 || ti->dtype == KF_DT_BFLOAT16, trailing = false;
    int64_t lead = 1;
    for (int d = 0; d < ti->rank && !trailing; d++) {
        if (lead == rows) trailing = true;
        lead *= ti->dims[d];
    }
    if (r->op == KF_OP_SOFTMAX || r->op == KF_OP_LOG_SOFTMAX) { /* opset 13+: one axis, trailing only when last */
        int64_t axis = kf_attr_i(r, "axis", r->opset >= 13 || r->opset <= 0 ? -1 : 1);
        if ((r->opset >= 13 || r->opset <= 0) && axis != -1 && axis != ti->rank - 1) trailing = false;
    }
    return kf_row_form_of(rows, row, ti->rank ? ti->dims[ti->rank - 1] : 1, narrow, trailing);
}

static void reduction(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    c->form = "reduce";
    const kf_node *r = cg->reduction ? &g->nodes[cg->reduction] : NULL;
    int64_t bytes = bytes_of(cg), rows, row;
    if (!r || bytes < 0) return;
    red_rows(g, r, &rows, &row);
    if (rows < 0) return;
    c->known = true;
    kf_row_form f = red_form(g, r, rows, row);
    reduce_rows(t, &f, rows, row, red_passes(r), bytes, c);
}

/* ---- anchors ------------------------------------------------------------- */

typedef struct gemm_dims {
    int64_t m, n, k, batch;
} gemm_dims;

/* M, N, K and batch of a MatMul/Gemm from its operand and output shapes. */
static bool gemm_shape(const kf_graph *g, const kf_node *a, gemm_dims *d) {
    if (a->nin < 2 || a->nout < 1 || !a->in[0] || !a->in[1] || !a->out[0]) return false;
    const kf_type *x = &g->values[a->in[0]].type, *y = &g->values[a->out[0]].type;
    if (!kf_type_is_static(x) || !kf_type_is_static(y) || x->rank < 1 || y->rank < 1) return false;
    int64_t out = numel_of(g, a->out[0]);
    if (a->op == KF_OP_GEMM) {
        d->k = x->dims[kf_attr_i(a, "transA", 0) ? 0 : x->rank - 1];
        d->n = y->dims[y->rank - 1];
        d->m = y->rank > 1 ? y->dims[y->rank - 2] : 1;
        d->batch = 1;
    } else {
        d->k = x->dims[x->rank - 1];
        d->n = y->rank >= 2 || (a->in[1] && g->values[a->in[1]].type.rank >= 2) ? y->dims[y->rank - 1] : 1;
        d->m = x->rank >= 2 ? x->dims[x->rank - 2] : 1;
        int64_t mn = d->m * d->n;
        d->batch = mn > 0 ? out / mn : 1;
    }
    if (d->batch < 1) d->batch = 1;
    return d->m > 0 && d->n > 0 && d->k > 0;
}

/* Output channels, output pixels per image and batch of a Conv. */
static bool conv_shape(const kf_graph *g, const kf_node *a, int64_t *cout, int64_t *pix, int64_t *batch) {
    if (a->nout < 1 || !a->out[0]) return false;
    const kf_type *y = &g->values[a->out[0]].type;
    if (!kf_type_is_static(y) || y->rank < 3) return false;
    *batch = y->dims[0];
    *cout = y->dims[1];
    *pix = 1;
    for (int d = 2; d < y->rank; d++) *pix *= y->dims[d];
    return *batch > 0 && *cout > 0 && *pix > 0;
}

static int64_t value_bytes(const kf_graph *g, kf_id v) {
    int64_t n = numel_of(g, v);
    size_t esz = v ? kf_dtype_size(g->values[v].type.dtype) : 0;
    return n < 0 || !esz ? -1 : n * (int64_t)esz;
}

/* Blocks one SM holds of a generated anchor using `smem` bytes per block. */
static int64_t anchor_resident(const kf_target *t, int64_t smem) {
    int64_t r = t->max_threads_sm / KF_COST_BLOCK;
    int64_t by_regs = t->regs_sm / (KF_COST_ANCHOR_REGS * KF_COST_BLOCK);
    int64_t by_smem = smem > 0 ? (int64_t)t->smem_sm_kib * 1024 / smem : r;
    if (by_regs < r) r = by_regs;
    if (by_smem < r) r = by_smem;
    if (t->max_blocks_sm < r) r = t->max_blocks_sm;
    return r < 1 ? 1 : r;
}

/* A generated anchor kernel: `blocks` blocks sharing `flops` evenly, each
 * at `frac` of one SM's share of peak_tflops (the FMA peak; the int8
 * tensor-core peak for the integer convolution), reading `l2_bytes`
 * through L2 (operand tiles re-read per block) and `bytes` from DRAM. */
static void generated_at(const kf_target *t, double peak_tflops, int64_t flops, int64_t blocks, double frac, int64_t smem,
                         int64_t bytes, double l2_bytes, kf_cost *c) {
    if (blocks < 1) blocks = 1;
    c->blocks = blocks;
    c->resident = anchor_resident(t, smem);
    int64_t conc = ceil_div(blocks, t->sms);
    if (conc > c->resident) conc = c->resident;
    double peak = sm_peak(t, peak_tflops);
    double rate = frac * peak, cap = t->gen_blk_cap * peak / (double)conc;
    if (rate > cap) rate = cap;
    int64_t waves = ceil_div(blocks, t->sms * conc);
    double comp = (double)waves * ((double)flops / (double)blocks) / rate * 1e6;
    double m = mem_us(t, bytes, (double)blocks / t->sms);
    double l2 = l2_bytes / (t->l2_gbs * 1e9) * 1e6;
    double body = comp;
    c->bound = "compute";
    if (m > body) body = m, c->bound = "memory";
    if (l2 > body) body = l2, c->bound = "l2";
    finish(t, c, body, t->kernel_min_us);
}

static void generated(const kf_target *t, int64_t flops, int64_t blocks, double frac, int64_t smem, int64_t bytes,
                      double l2_bytes, kf_cost *c) {
    generated_at(t, t->fma_tflops_fp32, flops, blocks, frac, smem, bytes, l2_bytes, c);
}

static double gemm_rate(const kf_target *t, double outs) {
    return t->gemm_blk_base + t->gemm_blk_per_out * outs;
}

/* The streaming attention kernel (codegen/cg_attention.c): batch x heads
 * of m queries against n keys, head sizes k (queries, keys) and nv
 * (values): a block of 4 warps (2 for float32 head sizes over 64) per 64
 * (32) query rows of one head, keys and values streamed through shared
 * memory, every block reading its head's K and V (from L2 after the
 * first). On a busy SM it reaches attn_tc_frac of the tensor-core peak
 * (16-bit tiles) or attn_fma_frac of the FMA peak (float32). */
static void attention_kernel(const kf_target *t, const kf_cost_group *cg, bool narrow, int64_t batch, int64_t m,
                             int64_t n, int64_t k, int64_t nv, double flops, kf_cost *c) {
    int64_t esz = narrow ? 2 : 4, bq = !narrow && k > 64 ? 32 : 64, bk = !narrow && k > 64 ? 16 : narrow ? 64 : 32;
    int64_t blocks = ceil_div(m, bq) * batch;
    int64_t smem = esz * (bq * (k + 8) + bk * (k + 8) + nv * (bk + 8) + bq * (bk + 8)) + 4 * bq * 2;
    double peak = narrow && t->tc_tflops_fp16 > 0 ? sm_peak(t, t->tc_tflops_fp16) * t->attn_tc_frac
                                                  : sm_peak(t, t->fma_tflops_fp32) * t->attn_fma_frac;
    c->known = true;
    c->form = "attention";
    c->blocks = blocks;
    c->resident = anchor_resident(t, smem);
    double sms = blocks < t->sms ? (double)blocks : (double)t->sms;
    double comp = flops / (sms * peak) * 1e6;
    double mm = mem_us(t, (double)bytes_of(cg), (double)blocks / t->sms);
    double l2 = (double)blocks * (double)n * (double)(k + nv) * (double)esz / (t->l2_gbs * 1e9) * 1e6;
    double body = comp;
    c->bound = "compute";
    if (mm > body) body = mm, c->bound = "memory";
    if (l2 > body) body = l2, c->bound = "l2";
    finish(t, c, body, t->kernel_min_us);
}

/* A back-to-back group MatMul -> Softmax -> MatMul (d: the first MatMul's
 * shape, d.n the keys) as the attention kernel; false: not that shape (the
 * whole-row form is estimated instead). */
static bool attention(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, const kf_node *a,
                      const gemm_dims *d, kf_cost *c) {
    const kf_node *r = &g->nodes[cg->reduction], *b = &g->nodes[cg->anchor2];
    gemm_dims d2;
    if (r->op != KF_OP_SOFTMAX || a->op != KF_OP_MATMUL || b->op != KF_OP_MATMUL || !gemm_shape(g, b, &d2) ||
        d->k > 128 || d2.n > 128)
        return false;
    /* the streaming kernel takes the probabilities into the second product
     * straight or, in two passes over the keys (the scores computed twice),
     * through an int8 plan's QuantizeLinear and DequantizeLinear of them */
    int passes = kf_att_passes(g, a, r, b);
    if (!passes) return false;
    kf_dtype dt = g->values[a->in[0]].type.dtype;
    double flops = (double)(cg->flops > 0 ? cg->flops : 0);
    if (passes == 2) flops += 2.0 * (double)d->batch * (double)d->m * (double)d->n * (double)d->k;
    attention_kernel(t, cg, dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16, d->batch, d->m, d->n, d->k, d2.n, flops, c);
    return true;
}

/* An Attention node (opset 23+) alone in its group, from its shapes: false
 * when the shapes are not known. */
static bool attention_node(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    kf_id p = cg->space ? g->values[cg->space].producer : 0;
    if (!p || strcmp(g->nodes[p].op_type, "Attention") || g->nodes[p].nin < 3) return false;
    const kf_node *n = &g->nodes[p];
    const kf_type *q = &g->values[n->in[0]].type, *k = &g->values[n->in[1]].type, *v = &g->values[n->in[2]].type;
    if (!kf_type_is_static(q) || !kf_type_is_static(k) || !kf_type_is_static(v) || q->rank != k->rank ||
        (q->rank != 3 && q->rank != 4))
        return false;
    int64_t hq = q->rank == 4 ? q->dims[1] : kf_attr_i(n, "q_num_heads", 1);
    int64_t hkv = k->rank == 4 ? k->dims[1] : kf_attr_i(n, "kv_num_heads", 1);
    if (hq <= 0 || hkv <= 0) return false;
    int64_t b = q->dims[0], sq = q->dims[q->rank - 2], tk = k->dims[k->rank - 2];
    int64_t dq = q->rank == 4 ? q->dims[3] : q->dims[2] / hq, dv = v->rank == 4 ? v->dims[3] : v->dims[2] / hkv;
    double flops = 2.0 * (double)b * (double)hq * (double)sq * (double)tk * (double)(dq + dv);
    attention_kernel(t, cg, q->dtype == KF_DT_FLOAT16 || q->dtype == KF_DT_BFLOAT16, b * hq, sq, tk, dq, dv, flops, c);
    return true;
}

/* Rows a row-tile anchor keeps on chip for a row of `row` floats. */
static int64_t row_tile(int64_t row) {
    int64_t rm = row > 0 ? KF_COST_ROW_BYTES / (4 * row) : 16;
    return rm > 16 ? 16 : rm < 1 ? 1 : rm;
}

/* The library's peak for the anchor's dtype and the math mode. Tensor
 * cores need the reduction dim in whole 8-element fragments: a convolution
 * with fewer than 8 input channels per group (an RGB stem) runs on FMA
 * (measured: cuDNN's implicit_convolve_sgemm for ResNet's 3-channel stem
 * while the other convolutions ran TF32). */
static double lib_peak(const kf_target *t, kf_cost_math math, kf_dtype dt, bool tc_ok) {
    if (dt == KF_DT_FLOAT8E4M3FN) return t->tc_tflops_fp8;
    if (dt == KF_DT_INT8) return t->tc_tops_int8 > 0 ? t->tc_tops_int8 : t->fma_tflops_fp32 * 4; /* else dp4a */
    if (dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16)
        return tc_ok && t->tc_tflops_fp16 > 0 ? t->tc_tflops_fp16 : t->fma_tflops_fp16;
    if (math == KF_MATH_TF32 && tc_ok && t->tc_tflops_tf32 > 0) return t->tc_tflops_tf32;
    return t->fma_tflops_fp32;
}

/* Work units of a library call: output tiles times a split of K chosen to
 * fill the SMs (at least 256 of K per split); returns the fraction of the
 * machine its waves keep busy. */
static double lib_fill(const kf_target *t, int64_t tiles, int64_t k, int64_t *units) {
    int64_t split = 1;
    if (tiles < t->sms) {
        split = t->sms / tiles;
        if (split > k / 256) split = k / 256;
        if (split < 1) split = 1;
    }
    *units = tiles * split;
    int64_t waves = ceil_div(*units, t->sms);
    return (double)*units / (double)(waves * t->sms);
}

/* Output tiles of a library GEMM: of 128x128, 64x128, 128x64 and 64x64,
 * the one that keeps the most of the machine busy (as a library heuristic
 * would pick; ties: the larger tile, which reuses operands more). */
static int64_t lib_tiles(const kf_target *t, int64_t m, int64_t n, int64_t batch, int64_t k) {
    static const int64_t shapes[4][2] = {{128, 128}, {64, 128}, {128, 64}, {64, 64}};
    int64_t best = 0;
    double best_fill = -1;
    for (int i = 0; i < 4; i++) {
        int64_t tiles = ceil_div(m, shapes[i][0]) * ceil_div(n, shapes[i][1]) * batch, units;
        double f = lib_fill(t, tiles, k, &units);
        if (f > best_fill + 1e-9) best_fill = f, best = tiles;
    }
    return best;
}

static void library(const kf_target *t, kf_cost_math math, double flops, kf_dtype dt, bool tc_ok, double frac,
                    double fixed_us, int64_t tiles, int64_t k, double bytes, kf_cost *c) {
    int64_t units;
    double fill = lib_fill(t, tiles, k, &units);
    c->blocks = units;
    c->resident = 1;
    double comp = flops / (lib_peak(t, math, dt, tc_ok) * 1e12 * frac * fill) * 1e6;
    double m = mem_us(t, bytes, 1);
    c->bound = comp > m ? "compute" : "memory";
    finish(t, c, (comp > m ? comp : m) + fixed_us, t->kernel_min_us);
}

/* The generated kernel after a library call: reads the library's output
 * and the group's other inputs, writes the group's outputs; a row
 * reduction in it makes it a reduction kernel. */
static double epilogue_us(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, const kf_node *a) {
    int64_t out = value_bytes(g, a->out[0]);
    int64_t other = cg->bytes_read >= 0 && cg->operand_bytes >= 0 ? cg->bytes_read - cg->operand_bytes : 0;
    double bytes = (double)out + (double)(other > 0 ? other : 0) + (double)(cg->bytes_written > 0 ? cg->bytes_written : 0);
    kf_cost e = {0};
    if (cg->reduction) {
        int64_t rows, row;
        red_rows(g, &g->nodes[cg->reduction], &rows, &row);
        if (rows > 0) {
            kf_row_form f = red_form(g, &g->nodes[cg->reduction], rows, row);
            reduce_rows(t, &f, rows, row, red_passes(&g->nodes[cg->reduction]), bytes, &e);
            return e.us;
        }
    }
    int64_t n = numel_of(g, a->out[0]);
    int64_t blocks = n > 0 ? ceil_div(n, KF_COST_BLOCK) : 1;
    return finish(t, &e, mem_us(t, bytes, (double)blocks / t->sms), t->kernel_min_us);
}

/* The float8 DequantizeLinear feeding operand slot of n, of the form
 * kf_fp8_product_form takes (scale of one element, or with columns > 0 of
 * that many along axis `axis` of the weights); 0 otherwise. Its format in
 * *fmt. */
static kf_id fp8_operand(const kf_model *m, const kf_node *n, int slot, int64_t columns, int axis, int wrank,
                         kf_dtype *fmt) {
    const kf_graph *g = m->graph;
    kf_id v = n->in[slot], d = v ? g->values[v].producer : 0;
    if (!d || g->values[v].nusers != 1 || g->values[v].is_output) return 0;
    const kf_node *dn = &g->nodes[d];
    if (dn->op != KF_OP_DEQUANTIZE_LINEAR || dn->nin < 2 || !dn->in[0] || !dn->in[1] || dn->nout != 1 ||
        kf_attr_i(dn, "block_size", 0) != 0 || !kf_value_is_constant(m, dn->in[1]))
        return 0;
    const kf_value *q = &g->values[dn->in[0]];
    const kf_tensor *s = g->values[dn->in[1]].init;
    int64_t a = kf_attr_i(dn, "axis", 1);
    if (q->type.rank > 0 && a < 0) a += q->type.rank;
    if (s->numel != 1 && !(columns > 0 && s->rank == 1 && s->numel == columns && a == axis)) return 0;
    if (q->type.dtype != KF_DT_FLOAT8E4M3FN && q->type.dtype != KF_DT_FLOAT8E5M2) return 0;
    if (slot == 1 && (!kf_value_is_constant(m, dn->in[0]) || q->type.rank != wrank || q->nusers != 1)) return 0;
    *fmt = q->type.dtype;
    return d;
}

bool kf_fp8_product(const kf_model *m, const kf_node *n, kf_dtype fmt[2]) { return kf_fp8_product_form(m, n, false, fmt); }

bool kf_fp8_product_form(const kf_model *m, const kf_node *n, bool per_column, kf_dtype fmt[2]) {
    const kf_graph *g = m->graph;
    if (n->dead || (n->op != KF_OP_MATMUL && n->op != KF_OP_GEMM) || n->nin < 2 || !n->in[0] || !n->in[1] ||
        n->nout < 1 || !n->out[0])
        return false;
    if (n->op == KF_OP_GEMM && (kf_attr_i(n, "transA", 0) || kf_attr_f(n, "alpha", 1.0f) != 1.0f ||
                                kf_attr_f(n, "beta", 1.0f) != 1.0f))
        return false;
    const kf_type *xt = &g->values[n->in[0]].type, *wt = &g->values[n->in[1]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(wt) || xt->rank < 2 || wt->rank != 2) return false;
    bool tb = n->op == KF_OP_GEMM && kf_attr_i(n, "transB", 0);
    int64_t K = wt->dims[tb ? 1 : 0], N = wt->dims[tb ? 0 : 1];
    if (K % 16 || N % 16 || xt->dims[xt->rank - 1] != K) return false;
    kf_dtype f[2];
    if (!fp8_operand(m, n, 0, 0, 0, 0, &f[0]) || !fp8_operand(m, n, 1, per_column ? N : 0, tb ? 0 : 1, 2, &f[1]) ||
        (f[0] == KF_DT_FLOAT8E5M2 && f[1] == KF_DT_FLOAT8E5M2))
        return false;
    if (fmt) fmt[0] = f[0], fmt[1] = f[1];
    return true;
}

bool kf_fp8_conv(const kf_model *m, const kf_node *n, kf_dtype fmt[2]) {
    const kf_graph *g = m->graph;
    if (n->dead || n->op != KF_OP_CONV || kf_attr_i(n, "group", 1) != 1 || n->nin < 2 || !n->in[0] || !n->in[1] ||
        n->nout < 1 || !n->out[0])
        return false;
    const kf_type *xt = &g->values[n->in[0]].type, *wt = &g->values[n->in[1]].type, *ot = &g->values[n->out[0]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(wt) || !kf_type_is_static(ot) || xt->rank < 3 ||
        wt->rank != xt->rank || ot->rank != xt->rank || wt->dims[0] < 1)
        return false;
    kf_dtype f[2];
    if (!fp8_operand(m, n, 0, 0, 0, 0, &f[0]) || !fp8_operand(m, n, 1, wt->dims[0], 0, wt->rank, &f[1])) return false;
    if (fmt) fmt[0] = f[0], fmt[1] = f[1];
    return true;
}

bool kf_fp8_anchor(const kf_model *m, const kf_node *n) { return kf_fp8_product(m, n, NULL) || kf_fp8_conv(m, n, NULL); }

bool kf_fp8_conv_pays(const kf_target *t, kf_cost_math math, const kf_model *m, kf_id conv) {
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[conv];
    if (!kf_fp8_conv(m, n, NULL)) return false;
    int64_t cout, pix, batch, flops;
    if (!t || !conv_shape(g, n, &cout, &pix, &batch)) return true;
    int64_t k = numel_of(g, n->in[1]) / cout, out = value_bytes(g, n->out[0]);
    if (!kf_mul_ok(batch, pix, &flops) || !kf_mul_ok(flops, cout, &flops) || !kf_mul_ok(flops, k, &flops) ||
        !kf_mul_ok(flops, 2, &flops) || out < 0)
        return true;
    kf_id xq = g->nodes[g->values[n->in[0]].producer].in[0], wq = g->nodes[g->values[n->in[1]].producer].in[0];
    kf_cost_group cg = {.kind = KF_GROUP_ANCHOR, .anchor = conv, .flops = flops, .space = n->out[0], .fp8 = true,
                        .bytes_written = out, .operand_dtype = KF_DT_FLOAT16};
    cg.operand_bytes = cg.bytes_read = value_bytes(g, xq) + value_bytes(g, wq);
    kf_cost f8, lib;
    kf_cost_estimate(t, math, g, &cg, &f8);
    cg.fp8 = false;
    cg.operand_bytes = cg.bytes_read = 2 * (numel_of(g, n->in[0]) + numel_of(g, n->in[1]));
    kf_cost_estimate(t, math, g, &cg, &lib);
    return !f8.known || !lib.known || f8.us <= lib.us;
}

bool kf_cost_library(const kf_target *t, const kf_graph *g, const kf_cost_group *cg) {
    if (!t->vendor_lib || cg->kind != KF_GROUP_ANCHOR || !cg->anchor || cg->anchor2 || cg->prologue ||
        cg->epilogue_declined)
        return false;
    const kf_node *a = &g->nodes[cg->anchor];
    /* kf_cost_describe_anchor checked the form; no library runs a float8
     * convolution (cuDNN's legacy API has no float8) */
    if (cg->fp8) return a->op != KF_OP_CONV && t->tc_tflops_fp8 > 0;
    if (a->op == KF_OP_MATMUL_INTEGER) {
        /* cuBLASLt's int8 GEMM, as kernels/libanchor.c maps it: int8 x int8
         * without zero points, constant weights read by this product alone
         * (stored transposed), K and N multiples of 4 */
        if (kf_node_onnx_nin(a) != 2 || !a->in[0] || !a->in[1]) return false;
        const kf_type *xt = &g->values[a->in[0]].type, *wt = &g->values[a->in[1]].type;
        const kf_value *wv = &g->values[a->in[1]];
        return xt->dtype == KF_DT_INT8 && wt->dtype == KF_DT_INT8 && xt->rank >= 2 && wt->rank == 2 && wv->init &&
               wv->nusers == 1 && wt->dims[0] % 4 == 0 && wt->dims[1] % 4 == 0;
    }
    if (a->op != KF_OP_MATMUL && a->op != KF_OP_GEMM && a->op != KF_OP_CONV) return false;
    if (a->nin < 2 || !a->in[0] || !a->in[1]) return false;
    kf_dtype dt = cg->operand_dtype ? cg->operand_dtype : g->values[a->in[0]].type.dtype;
    /* the library path's dtypes: cuBLASLt takes bfloat16 too, cuDNN's NCHW
     * convolutions do not (kernels/libanchor.c) */
    if (dt != KF_DT_FLOAT && dt != KF_DT_FLOAT16 && (dt != KF_DT_BFLOAT16 || a->op == KF_OP_CONV)) return false;
    if (a->op == KF_OP_MATMUL)
        return g->values[a->in[0]].type.rank >= 2 && g->values[a->in[1]].type.rank >= 2; /* 1-D: generated */
    if (a->op == KF_OP_CONV) {
        const char *ap = kf_attr_s(a, "auto_pad", "NOTSET");
        if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID")) return false;
        int np = 0;
        const int64_t *pads = kf_attr_ints(a, "pads", &np);
        for (int i = 0; pads && i < np / 2; i++)
            if (pads[i] != pads[i + np / 2]) return false; /* cuDNN pads both sides alike */
        return g->values[a->in[0]].type.rank <= 5;
    }
    return true;
}

static void generated_anchor(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, kf_cost *c);

/* An anchor group: the library call (with its epilogue kernel) where the
 * target's library takes the group, unless it is a float GEMM whose
 * generated kernel is estimated faster (a small one, where the call's
 * fixed cost dominates); the runtime follows the form (kernels/exec.c). */
static void anchor(const kf_target *t, kf_cost_math math, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    const kf_node *a = &g->nodes[cg->anchor];
    int64_t bytes = bytes_of(cg);
    if (bytes < 0 || cg->flops < 0) {
        c->form = a->op == KF_OP_CONV ? "conv" : "gemm";
        return;
    }
    bool conv = a->op == KF_OP_CONV || a->op == KF_OP_CONV_TRANSPOSE || a->op == KF_OP_CONV_INTEGER;
    kf_dtype dt = cg->operand_dtype ? cg->operand_dtype : a->nin && a->in[0] ? g->values[a->in[0]].type.dtype : KF_DT_FLOAT;
    if (!kf_cost_library(t, g, cg)) {
        generated_anchor(t, g, cg, c);
        return;
    }
    double flops = 0; /* doubles: products of dims may pass 64 bits on hostile shapes */
    int64_t tiles = 1, k = 1;
    bool tc_ok = true;
    if (conv) {
        int64_t cout, pix, batch;
        const kf_type *w = &g->values[a->in[1]].type;
        if (!conv_shape(g, a, &cout, &pix, &batch) || !kf_type_is_static(w)) return;
        int64_t wn = numel_of(g, a->in[1]);
        k = w->dims[0] > 0 ? wn / w->dims[0] : 1;
        tc_ok = w->rank > 1 && w->dims[1] >= 8;
        flops = 2.0 * (double)batch * (double)pix * (double)cout * (double)k;
        tiles = ceil_div(batch * pix, 128) * ceil_div(cout, 64);
    } else {
        gemm_dims d;
        if (!gemm_shape(g, a, &d)) return;
        k = d.k;
        flops = 2.0 * (double)d.m * (double)d.n * (double)d.k * (double)d.batch;
        tiles = lib_tiles(t, d.m, d.n, d.batch, d.k);
    }
    c->known = true;
    c->form = conv ? "lib_conv" : a->op == KF_OP_MATMUL_INTEGER ? "lib_igemm" : cg->fp8 ? "lib_gemm_fp8" : "lib_gemm";
    if (cg->fp8) dt = KF_DT_FLOAT8E4M3FN; /* float8 tensor cores */
    /* the call reads its operands and writes its output; the rest is
     * the epilogue kernel's */
    double call_bytes = (double)(cg->operand_bytes > 0 ? cg->operand_bytes : 0) + (double)value_bytes(g, a->out[0]);
    library(t, math, flops, dt, tc_ok, conv ? t->lib_conv_frac : t->lib_gemm_frac,
            conv ? t->lib_conv_fixed_us : t->lib_fixed_us, tiles, k, call_bytes, c);
    if (cg->epilogue || cg->reduction) {
        c->epilogue_us = epilogue_us(t, g, cg, a);
        c->us += c->epilogue_us;
    }
    /* only where the generated kernel's rate is calibrated (kf_gemm,
     * kf_gemm_rows: bench/RESULTS.md); the direct convolution's and the
     * 8-bit tiles' are assumed */
    if (conv || a->op == KF_OP_MATMUL_INTEGER || cg->fp8) return;
    kf_cost gen = {.form = "none", .bound = "launch"};
    generated_anchor(t, g, cg, &gen);
    if (gen.known && gen.us < c->us) {
        gen.lib_us = c->us;
        *c = gen;
    }
}

/* An anchor group as a generated kernel. */
static void generated_anchor(const kf_target *t, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    const kf_node *a = &g->nodes[cg->anchor];
    int64_t bytes = bytes_of(cg);
    bool conv = a->op == KF_OP_CONV || a->op == KF_OP_CONV_TRANSPOSE || a->op == KF_OP_CONV_INTEGER;
    kf_dtype dt = cg->operand_dtype ? cg->operand_dtype : a->nin && a->in[0] ? g->values[a->in[0]].type.dtype : KF_DT_FLOAT;
    c->known = true;
    if (!conv) {
        gemm_dims d;
        if (!gemm_shape(g, a, &d)) {
            c->known = false;
            c->form = "gemm";
            return;
        }
        int64_t esz = (int64_t)kf_dtype_size(dt);
        double wbytes = (double)d.k * (double)d.n * (double)esz, xbytes = (double)d.m * (double)d.k * (double)esz;
        if (cg->anchor2 && cg->reduction && attention(t, g, cg, a, &d, c)) return;
        if (cg->anchor2 || cg->reduction) {
            /* row tiles: every block reads all of the right operand(s) */
            int64_t row = d.n;
            double w2 = 0;
            if (cg->anchor2) {
                gemm_dims d2;
                const kf_node *b = &g->nodes[cg->anchor2];
                if (gemm_shape(g, b, &d2)) {
                    w2 = (double)d2.k * (double)d2.n * (double)esz;
                    /* a row reduction after the second GEMM keeps its rows too */
                    if (cg->reduction && g->nodes[cg->reduction].nin &&
                        numel_of(g, g->nodes[cg->reduction].in[0]) == numel_of(g, b->out[0]))
                        row += d2.n;
                }
            }
            int64_t rm = row_tile(row);
            int64_t blocks = ceil_div(d.m, rm) * d.batch;
            c->form = cg->anchor2 ? "gemm_b2b" : "gemm_rows";
            generated(t, cg->flops, blocks, gemm_rate(t, (double)rm / 4), KF_COST_ROW_BYTES + 8704, bytes,
                      (double)blocks * (wbytes + w2), c);
            return;
        }
        int it = kf_imma_gemm_tile(g, a);
        if (it) {
            /* the integer tensor-core tile: priced as the integer conv's
             * below, each T x T tile reading T rows of A and T columns of B
             * per k */
            int64_t tiles = ceil_div(d.m, it) * ceil_div(d.n, it) * d.batch;
            double peak = t->tc_tops_int8 > 0 ? t->tc_tops_int8 : t->fma_tflops_fp32;
            c->form = "imma";
            generated_at(t, peak, cg->flops, tiles, t->imma_blk_frac * (it == 64 ? 1.0 : 0.25), (int64_t)it * 12 * 4 * 2 + it * 64,
                         bytes, (double)tiles * 2.0 * (double)it * (double)d.k, c);
            return;
        }
        if (a->op == KF_OP_MATMUL_INTEGER) {
            /* four 8-bit products per instruction (dp4a) and a quarter of the
             * shared-memory reads of a float tile: igemm_dp4a_gain times the
             * float tile's rate per work-item output */
            int64_t tile = kf_igemm_tile(d.m, d.n, d.batch), r = tile / 16;
            int64_t tm = ceil_div(d.m, tile), tn = ceil_div(d.n, tile);
            c->form = "igemm";
            generated(t, cg->flops, tm * tn * d.batch, gemm_rate(t, (double)(r * r)) * t->igemm_dp4a_gain,
                      (int64_t)(4 * (2 * tile + 1)) * 4, bytes,
                      (double)d.batch * ((double)tm * wbytes + (double)tn * xbytes), c);
            return;
        }
        int64_t tm = ceil_div(d.m, 64), tn = ceil_div(d.n, 64);
        c->form = "gemm";
        generated(t, cg->flops, tm * tn * d.batch, gemm_rate(t, 16), 8704, bytes,
                  (double)d.batch * ((double)tm * wbytes + (double)tn * xbytes), c);
        return;
    }
    int64_t cout, pix, batch;
    if (!conv_shape(g, a, &cout, &pix, &batch)) {
        c->known = false;
        c->form = "conv";
        return;
    }
    int it = cg->anchor2 ? 0 : kf_iconv_tile(g, a);
    bool f8 = !it && !cg->anchor2 && cg->fp8 && a->op == KF_OP_CONV;
    if (f8) it = kf_mma_conv_tile(&g->values[a->out[0]].type);
    if (it) {
        /* the integer convolution's implicit GEMM on tensor cores: T x T
         * tiles of channels x pixels, each reading T rows of the weights
         * and T gathered columns of the input per k (from L2 after the
         * first); a 32-wide tile does a quarter of the 64-wide one's MMAs
         * per k step and waits as long for its loads: a quarter the rate */
        int64_t k = numel_of(g, a->in[1]) / (cout > 0 ? cout : 1);
        int64_t tiles = ceil_div(cout, it) * ceil_div(batch * pix, it);
        /* float8 tiles: mma.sync of float8 operands, which sm_90 has no
         * float8 form of: ptxas unpacks the codes to float16 pairs for the
         * float16 tensor cores (bench/sass/check.sh), so the float16 rate
         * where the target has float8 tensor cores; else the decoding twin
         * on FMAs */
        double tc = f8 ? (t->tc_tflops_fp8 > 0 ? t->tc_tflops_fp16 : 0) : t->tc_tops_int8;
        double peak = tc > 0 ? tc : t->fma_tflops_fp32;
        c->form = f8 ? "f8conv" : "iconv";
        generated_at(t, peak, cg->flops, tiles, t->imma_blk_frac * (it == 64 ? 1.0 : 0.25), (int64_t)it * 12 * 4 * 2 + it * 64,
                     bytes, (double)tiles * 2.0 * (double)it * (double)k, c);
        return;
    }
    if (cg->anchor2) {
        int64_t p = cout > 0 ? KF_COST_ROW_BYTES / (4 * cout) : 64;
        if (p > 64) p = 64;
        if (p < 1) p = 1;
        c->form = "conv_b2b";
        int64_t w2 = a->nin > 1 ? value_bytes(g, g->nodes[cg->anchor2].in[1]) : 0;
        int64_t blocks = ceil_div(pix, p) * batch;
        generated(t, cg->flops, blocks, t->conv_blk_frac, KF_COST_ROW_BYTES, bytes, (double)blocks * (double)(w2 > 0 ? w2 : 0),
                  c);
        return;
    }
    /* direct convolution: a work-item per pixel and 4 output channels */
    int64_t items = batch * pix * ceil_div(cout, 4);
    int64_t blocks = ceil_div(items, KF_COST_BLOCK);
    if (blocks > KF_COST_MAX_BLOCKS) blocks = KF_COST_MAX_BLOCKS;
    c->form = "conv";
    generated(t, cg->flops, blocks, t->conv_blk_frac * 4, 0, bytes, 0, c);
}

void kf_cost_estimate(const kf_target *t, kf_cost_math math, const kf_graph *g, const kf_cost_group *cg, kf_cost *c) {
    memset(c, 0, sizeof *c);
    c->form = "none";
    c->bound = "launch";
    if (cg->kind == KF_GROUP_CONST || cg->view) {
        c->known = true;
        return;
    }
    switch (cg->kind) {
    case KF_GROUP_ELEMWISE: elementwise(t, g, cg, c); break;
    case KF_GROUP_OPAQUE:
        if (!attention_node(t, g, cg, c)) elementwise(t, g, cg, c);
        break;
    case KF_GROUP_REDUCTION: reduction(t, g, cg, c); break;
    case KF_GROUP_ANCHOR: anchor(t, math, g, cg, c); break;
    default: break;
    }
    if (cg->kind == KF_GROUP_OPAQUE && strcmp(c->form, "attention")) c->form = "opaque";
    if (!c->known) {
        c->bound = "launch";
        c->us = t->kernel_min_us + t->launch_us;
    }
}

/* ---- describing groups ----------------------------------------------------- */

/* The value a conv's library call adds as its residual when node n is
 * that Add (kernels/libanchor.c, take_epilogue: cuDNN's z): n adds the
 * conv's biased output (the conv's own bias, or a bias Add right after it)
 * and a value from outside the group of the output's shape and dtype.
 * 0 otherwise. */
static kf_id conv_residual(const kf_graph *g, const kf_node *a, const kf_node *n,
                           bool (*member)(const void *ctx, kf_id node), const void *ctx) {
    if (a->op != KF_OP_CONV || n->op != KF_OP_ADD || n->nin != 2 || !n->in[0] || !n->in[1] || n->in[0] == n->in[1])
        return 0;
    const kf_type *yt = &g->values[a->out[0]].type;
    for (int i = 0; i < 2; i++) {
        kf_id r = n->in[i], o = n->in[1 - i], rp = g->values[r].producer, op = g->values[o].producer;
        bool biased = r == a->out[0] ? a->nin > 2 && a->in[2]
                                     : rp && g->nodes[rp].op == KF_OP_ADD && member(ctx, rp) &&
                                           (g->nodes[rp].in[0] == a->out[0] || g->nodes[rp].in[1] == a->out[0]);
        if (biased && !(op && member(ctx, op)) && g->values[o].type.dtype == yt->dtype &&
            kf_type_is_static(yt) && kf_type_same_shape(&g->values[o].type, yt))
            return o;
    }
    return 0;
}

/* Would the library take node n, after the anchor, into its own epilogue?
 * A ReLU, a tanh GELU (cuBLASLt), the Add of a constant bias vector
 * along the output row, a GEMM's pure reshape that keeps the row length,
 * or a conv's residual (conv_residual); anything else needs the generated
 * epilogue kernel (kernels/libanchor.c, take_epilogue, is the call's side). */
static bool absorbed(const kf_model *m, const kf_node *a, const kf_node *n,
                     bool (*member)(const void *ctx, kf_id node), const void *ctx) {
    if (a->op == KF_OP_MATMUL_INTEGER) return false; /* the int8 GEMM takes no epilogue */
    if (n->op == KF_OP_RELU) return true;
    if (n->op == KF_OP_GELU && a->op != KF_OP_CONV) return !strcmp(kf_attr_s(n, "approximate", "none"), "tanh");
    const kf_graph *g = m->graph;
    if (kf_plan_is_reshape(n) && a->op != KF_OP_CONV) { /* the same bytes, rows of N still: the call writes them */
        const kf_type *yt = a->nout && a->out[0] ? &g->values[a->out[0]].type : NULL;
        const kf_type *vt = n->nout && n->out[0] ? &g->values[n->out[0]].type : NULL;
        return yt && vt && yt->rank > 0 && vt->rank > 0 && yt->dims[yt->rank - 1] > 0 &&
               vt->dims[vt->rank - 1] == yt->dims[yt->rank - 1];
    }
    if (n->op != KF_OP_ADD || n->nin != 2) return false;
    if (conv_residual(g, a, n, member, ctx)) return true;
    for (int i = 0; i < 2; i++) {
        kf_id b = n->in[i];
        if (!b || !kf_value_is_constant(m, b)) continue;
        const kf_type *bt = &g->values[b].type, *yt = a->nout && a->out[0] ? &g->values[a->out[0]].type : NULL;
        if (!yt || !kf_type_is_static(bt) || !kf_type_is_static(yt) || yt->rank < 1) continue;
        int64_t bn = numel_of(g, b);
        int64_t along = a->op == KF_OP_CONV ? (yt->rank > 1 ? yt->dims[1] : -1) : yt->dims[yt->rank - 1];
        if (bn == along) return true;
    }
    return false;
}

void kf_cost_describe_anchor(const kf_model *m, const kf_id *nodes, uint32_t n, kf_cost_group *cg,
                             bool (*member)(const void *ctx, kf_id node), const void *ctx) {
    const kf_graph *g = m->graph;
    cg->prologue = cg->epilogue = cg->epilogue_declined = cg->fp8 = false;
    cg->operand_bytes = 0;
    if (!cg->anchor) return;
    const kf_node *a = &g->nodes[cg->anchor];
    /* a float8 product with its two DequantizeLinears (and only them) in
     * the group: the library reads their float8 inputs (kernels/
     * libanchor.c, map_fp8) */
    if (!cg->anchor2 && kf_fp8_anchor(m, a)) {
        cg->fp8 = true;
        for (int i = 0; i < 2; i++) {
            kf_id d = g->values[a->in[i]].producer, q = g->values[g->nodes[d].in[0]].producer;
            cg->fp8 &= member(ctx, d) && !(q && member(ctx, q));
        }
    }
    for (int i = 0; i < a->nin; i++) {
        kf_id v = a->in[i];
        if (!v) continue;
        bool dup = false;
        for (int q = 0; q < i && !dup; q++) dup = a->in[q] == v;
        if (dup) continue;
        kf_id pr = g->values[v].producer;
        if (cg->fp8 && i < 2) v = g->nodes[pr].in[0]; /* the float8 values */
        else if (pr && member(ctx, pr)) {
            cg->prologue = true;
            continue;
        }
        int64_t b = value_bytes(g, v);
        if (b < 0 || cg->operand_bytes < 0 || !kf_add_ok(cg->operand_bytes, b, &cg->operand_bytes))
            cg->operand_bytes = -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        kf_id x = nodes[i];
        if (x == cg->anchor || x == cg->anchor2) continue;
        const kf_node *nd = &g->nodes[x];
        bool after = false; /* reads the anchor's result (directly or through the epilogue) */
        for (int k = 0; k < nd->nin && !after; k++) {
            kf_id pr = nd->in[k] ? g->values[nd->in[k]].producer : 0;
            after = pr && member(ctx, pr);
        }
        if (after && !absorbed(m, a, nd, member, ctx)) cg->epilogue = true;
        /* the call reads the residual it adds */
        kf_id z = after ? conv_residual(g, a, nd, member, ctx) : 0;
        int64_t zb = z ? value_bytes(g, z) : 0;
        if (zb < 0 || cg->operand_bytes < 0 || !kf_add_ok(cg->operand_bytes, zb, &cg->operand_bytes))
            cg->operand_bytes = -1;
        /* what the epilogue kernel after a library call declines
         * (kernels/libanchor.c through codegen): a Gather select of the
         * reduced rows */
        if (nd->op == KF_OP_GATHER && cg->reduction) cg->epilogue_declined = true;
    }
}

typedef struct plan_ctx {
    const kf_plan *p;
    uint32_t k;
} plan_ctx;

static bool in_plan_group(const void *ctx, kf_id node) {
    const plan_ctx *c = ctx;
    return c->p->group_of[node] == c->k;
}

void kf_cost_of_group(const kf_model *m, const kf_plan *p, uint32_t k, kf_cost_group *cg) {
    const kf_group *G = &p->groups[k];
    memset(cg, 0, sizeof *cg);
    cg->kind = G->kind;
    cg->view = G->view;
    cg->anchor = G->kind == KF_GROUP_ANCHOR ? G->anchor : 0;
    cg->anchor2 = G->anchor2;
    cg->reduction = G->kind == KF_GROUP_ANCHOR ? G->reduction : G->kind == KF_GROUP_REDUCTION ? G->anchor : 0;
    cg->bytes_read = G->bytes_read;
    cg->bytes_written = G->bytes_written;
    cg->flops = G->flops;
    cg->space = G->noutputs ? G->outputs[0] : 0;
    if (G->kind == KF_GROUP_ELEMWISE || G->kind == KF_GROUP_OPAQUE) {
        /* the largest output is the space the loop walks */
        for (uint32_t i = 1; i < G->noutputs; i++)
            if (numel_of(m->graph, G->outputs[i]) > numel_of(m->graph, cg->space)) cg->space = G->outputs[i];
    }
    plan_ctx c = {p, k};
    if (cg->anchor) kf_cost_describe_anchor(m, G->nodes, G->nnodes, cg, in_plan_group, &c);
}
