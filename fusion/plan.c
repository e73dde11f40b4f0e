/*
 * plan.c: the fusion planner (`kfuse fuse`, later codegen). After the
 * rewriter, it assigns every live node to one kernel group: vertical merges
 * greedily by modeled DRAM bytes saved, then horizontal merges of siblings,
 * then launch batching. Legality is one function (legal(), exported as
 * kf_plan_merge_reason); each boundary keeps the reason it returned.
 * Costs and the final kf_plan are assembled in plan_build.c.
 */
#include <stdlib.h>
#include <string.h>

#include "kf_cost.h"
#include "plan_int.h"
#include "kf_sym.h"

/* ---- node facts ---------------------------------------------------------- */

/* An 8-bit integer type, as quantised values are stored. */
static bool int8_type(kf_dtype dt) { return dt == KF_DT_INT8 || dt == KF_DT_UINT8; }
/* Integers a quantized value is held in, other than 8 bits: 4 bits (one
 * byte a value in memory, graph/dtype_small.c) and 16. */
static bool int_type_4_16(kf_dtype dt) {
    return dt == KF_DT_INT4 || dt == KF_DT_UINT4 || dt == KF_DT_INT16 || dt == KF_DT_UINT16;
}
/* A small float format generated kernels store a byte a value (codegen.c,
 * KF_CG_PART_F8 and KF_CG_PART_F4). */
static bool small_float_type(kf_dtype dt) {
    return dt == KF_DT_FLOAT8E4M3FN || dt == KF_DT_FLOAT8E4M3FNUZ || dt == KF_DT_FLOAT8E5M2 ||
           dt == KF_DT_FLOAT8E5M2FNUZ || dt == KF_DT_FLOAT4E2M1;
}

/* Input `slot` of n is absent or a static tensor of one element, or (when
 * len > 0) a 1-D one of len elements, of dtype dt (0: any). */
static bool param_in(const kf_graph *g, const kf_node *n, int slot, int64_t len, kf_dtype dt) {
    if (slot >= n->nin || !n->in[slot]) return true;
    const kf_type *t = &g->values[n->in[slot]].type;
    if (!kf_type_is_static(t) || (dt && t->dtype != dt)) return false;
    int64_t e = 1;
    for (int d = 0; d < t->rank; d++) e *= t->dims[d];
    return e == 1 || (len > 0 && t->rank == 1 && t->dims[0] == len);
}

/* Input `slot` of n is absent or a static tensor of dtype dt shaped as
 * x's blocks of `block` along `axis` (opset 21: x's dims, that one divided
 * rounding up). */
static bool param_blocked(const kf_graph *g, const kf_node *n, int slot, const kf_type *xt, int64_t axis,
                          int64_t block, kf_dtype dt) {
    if (slot >= n->nin || !n->in[slot]) return true;
    const kf_type *t = &g->values[n->in[slot]].type;
    if (!kf_type_is_static(t) || t->dtype != dt || t->rank != xt->rank) return false;
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] != (d == axis ? xt->dims[d] / block + (xt->dims[d] % block != 0) : xt->dims[d])) return false;
    return true;
}

/* QuantizeLinear and DequantizeLinear in the form generated kernels
 * compute (codegen.c, emit_qdq): 4-, 8- or 16-bit integers, float8 or
 * float4 on one side, float32, float16 or bfloat16 on the other (fp16/bf16
 * plans), a scale of that float type (and a zero point of the quantized
 * type) per tensor, along one axis or per block of an axis (opset 21), no
 * opset-23 precision or output_dtype. A QuantizeLinear to float4 has no
 * zero point (the reference adds one as a value in double). Then they map
 * elements one to one: elementwise. */
static bool qdq_elementwise(const kf_graph *g, const kf_node *n) {
    if (n->nin < 2 || !n->in[0] || !n->in[1] || n->nout < 1 || !n->out[0]) return false;
    const kf_type *xt = &g->values[n->in[0]].type, *yt = &g->values[n->out[0]].type;
    kf_dtype q = n->op == KF_OP_QUANTIZE_LINEAR ? yt->dtype : xt->dtype;
    kf_dtype f = n->op == KF_OP_QUANTIZE_LINEAR ? xt->dtype : yt->dtype;
    int64_t od = kf_attr_i(n, "output_dtype", 0);
    bool real = f == KF_DT_FLOAT || f == KF_DT_FLOAT16 || f == KF_DT_BFLOAT16;
    int64_t block = kf_attr_i(n, "block_size", 0);
    if (!(int8_type(q) || int_type_4_16(q) || small_float_type(q)) || !real || block < 0 ||
        kf_attr_i(n, "precision", 0) != 0 || (od && od != (int64_t)(n->op == KF_OP_QUANTIZE_LINEAR ? q : f)))
        return false;
    if (q == KF_DT_FLOAT4E2M1 && n->op == KF_OP_QUANTIZE_LINEAR && n->nin > 2 && n->in[2]) return false;
    int64_t along = -1, axis = kf_attr_i(n, "axis", 1);
    if (xt->rank > 0 && kf_type_is_static(xt)) {
        if (axis < 0) axis += xt->rank;
        if (axis >= 0 && axis < xt->rank) along = xt->dims[axis];
    }
    if (block)
        return along > 0 && param_blocked(g, n, 1, xt, axis, block, f) && param_blocked(g, n, 2, xt, axis, block, q);
    return param_in(g, n, 1, along, f) && param_in(g, n, 2, along, q);
}

/* MatMulInteger and ConvInteger over 8-bit operands with zero points per
 * tensor (B's and W's also per output column / channel), as the anchor
 * templates take them (cg_anchor.c): anchors, like MatMul and Conv. */
static bool int_anchor(const kf_graph *g, const kf_node *n) {
    if (n->nin < 2 || !n->in[0] || !n->in[1]) return false;
    const kf_type *at = &g->values[n->in[0]].type, *bt = &g->values[n->in[1]].type;
    if (!int8_type(at->dtype) || !int8_type(bt->dtype) || bt->rank < 1) return false;
    int64_t cols = n->op == KF_OP_CONV_INTEGER ? bt->dims[0] : bt->dims[bt->rank - 1];
    return param_in(g, n, 2, 0, at->dtype) && param_in(g, n, 3, cols, bt->dtype);
}

kf_fclass pl_fclass(const kf_graph *g, const kf_node *n) {
    const kf_op_info *oi = kf_node_op(n); /* a malformed or other-version node is opaque */
    if (!oi) return KF_FC_OPAQUE;
    switch (n->op) {
    case KF_OP_QUANTIZE_LINEAR:
    case KF_OP_DEQUANTIZE_LINEAR: return qdq_elementwise(g, n) ? KF_FC_ELEMWISE : KF_FC_OPAQUE;
    case KF_OP_MATMUL_INTEGER:
    case KF_OP_CONV_INTEGER: return int_anchor(g, n) ? KF_FC_ANCHOR : KF_FC_OPAQUE;
    default: return oi->fclass;
    }
}

/* Register cost of one node (see pl_regs): an elementwise op keeps about
 * one live result (a layout op none: pl_init_node; it only changes the
 * index a value is read or stored at); a row reduction keeps accumulators, the row statistics
 * and warp-shuffle temporaries (~16); a GEMM/conv tile keeps its output
 * accumulators and operand fragments (128x128 tile over 256 threads = 64
 * floats, plus ~32 for fragments). */
static int node_cost(kf_fclass fc) {
    switch (fc) {
    case KF_FC_REDUCTION: return 16;
    case KF_FC_ANCHOR: return 96;
    case KF_FC_OPAQUE: return 0;
    default: return 1;
    }
}

/* Fixed per-thread registers of any generated kernel: thread/block indices,
 * loop bound, the linear index and its unravelled coordinates. */
#define PL_REG_BASE 16
/* Each input or output costs a 64-bit pointer (2 registers). */
#define PL_REG_PER_VALUE 2

/* ---- iteration spaces ------------------------------------------------------ */

/* Are two types the same iteration space (same element count)? With
 * symbolic dims, when the counts are equal as expressions ([N, S, 64]
 * against [N*S, 64]); different symbols count as different. */
pl_same pl_space_cmp(const pl_state *s, kf_id va, kf_id vb) {
    if (!va || !vb) return PL_UNKNOWN;
    if (va == vb || s->sc[va] == s->sc[vb]) return PL_SAME;
    int c = kf_type_numel_cmp(s->g, &s->g->values[va].type, &s->g->values[vb].type);
    return c < 0 ? PL_UNKNOWN : c ? PL_SAME : PL_DIFFERENT;
}

/* Output shape equals input 0's shape whatever the shapes are. */
static bool same_shape_op(const kf_graph *g, const kf_node *n) {
    switch (n->op) {
    case KF_OP_SOFTMAX:
    case KF_OP_LOG_SOFTMAX:
    case KF_OP_HARDMAX:
    case KF_OP_LAYER_NORMALIZATION:
    case KF_OP_BATCH_NORMALIZATION:
    case KF_OP_INSTANCE_NORMALIZATION:
    case KF_OP_GROUP_NORMALIZATION:
    case KF_OP_MEAN_VARIANCE_NORMALIZATION:
    case KF_OP_RMS_NORMALIZATION:
    case KF_OP_DROPOUT: return true;
    default: return pl_fclass(g, n) == KF_FC_ELEMWISE;
    }
}

/* A static one-element operand: broadcasting it may add 1-dims but never
 * changes the element count, which is what an iteration space compares. */
static bool scalar_operand(const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    if (!kf_type_is_static(t)) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] != 1) return false;
    return true;
}

/* Space classes, in topological order: an op whose output provably has
 * its input's shape (unary elementwise, softmax/norms, or a broadcast op
 * whose non-scalar operands are all in one class) puts its output in that
 * input's class. So x -> Relu -> Softmax fuses even when x's shape is
 * unknown. */
void pl_space_classes(pl_state *s) {
    const kf_graph *g = s->g;
    for (kf_id v = 0; v < g->nvalues; v++) s->sc[v] = v;
    for (uint32_t i = 0; i < s->norder; i++) {
        const kf_node *n = &g->nodes[s->order[i]];
        if (n->nout < 1 || !n->out[0] || n->nin < 1) continue;
        if (same_shape_op(g, n)) {
            if (n->in[0]) s->sc[n->out[0]] = s->sc[n->in[0]];
            continue;
        }
        if (pl_fclass(g, n) != KF_FC_BROADCAST || n->op == KF_OP_EXPAND) continue;
        uint32_t c = 0;
        bool ok = true;
        for (int k = 0; k < n->nin && ok; k++) {
            kf_id v = n->in[k];
            if (!v || scalar_operand(g, v)) continue;
            if (!c) c = s->sc[v];
            else ok = s->sc[v] == c;
        }
        if (ok && c) s->sc[n->out[0]] = c;
    }
}

/* ---- union-find ------------------------------------------------------------- */

uint32_t pl_find(pl_state *s, uint32_t x) {
    uint32_t r = x;
    while (s->parent[r] != r) r = s->parent[r];
    while (s->parent[x] != r) { /* path compression */
        uint32_t nx = s->parent[x];
        s->parent[x] = r;
        x = nx;
    }
    return r;
}

static uint32_t root_of_producer(pl_state *s, kf_id v) {
    kf_id p = s->g->values[v].producer;
    if (!p || s->pos[p] == UINT32_MAX) return 0;
    return pl_find(s, p);
}

/* A value leaves the union {ra, rb}: it is a graph output or some user is
 * outside both. */
static bool leaves(pl_state *s, kf_id v, uint32_t ra, uint32_t rb) {
    const kf_value *val = &s->g->values[v];
    if (val->is_output) return true;
    for (uint32_t i = 0; i < val->nusers; i++) {
        uint32_t r = pl_find(s, val->users[i]);
        if (r != ra && r != rb) return true;
    }
    return false;
}

static uint32_t next_vstamp(pl_state *s) {
    if (++s->vstampv == 0) { /* wrapped: clear */
        memset(s->vstamp, 0, (size_t)s->g->nvalues * sizeof *s->vstamp);
        s->vstampv = 1;
    }
    return s->vstampv;
}

/* Inputs of the union {ra, rb} into out (may be NULL); returns the count. */
uint32_t pl_union_inputs(pl_state *s, uint32_t ra, uint32_t rb, kf_id *out) {
    uint32_t st = next_vstamp(s), n = 0;
    const pl_group *gs[2] = {&s->gs[ra], &s->gs[rb]};
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < gs[k]->nin; i++) {
            kf_id v = gs[k]->in[i];
            if (s->vstamp[v] == st) continue;
            s->vstamp[v] = st;
            uint32_t r = root_of_producer(s, v);
            if (r && (r == ra || r == rb)) continue;
            if (out) out[n] = v;
            n++;
        }
    return n;
}

uint32_t pl_union_outputs(pl_state *s, uint32_t ra, uint32_t rb, kf_id *out) {
    uint32_t st = next_vstamp(s), n = 0;
    const pl_group *gs[2] = {&s->gs[ra], &s->gs[rb]};
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < gs[k]->nout; i++) {
            kf_id v = gs[k]->out[i];
            if (s->vstamp[v] == st) continue;
            s->vstamp[v] = st;
            if (!leaves(s, v, ra, rb)) continue;
            if (out) out[n] = v;
            n++;
        }
    return n;
}

static bool value_const(pl_state *s, kf_id v);

/* Do the groups read one same value that a kernel must load? Plan-time
 * constants (shape tensors, scalars) shared by many Reshapes do not count:
 * reading them once saves nothing. */
static bool share_input(pl_state *s, uint32_t ra, uint32_t rb) {
    uint32_t st = next_vstamp(s);
    for (uint32_t i = 0; i < s->gs[ra].nin; i++) s->vstamp[s->gs[ra].in[i]] = st;
    for (uint32_t i = 0; i < s->gs[rb].nin; i++)
        if (s->vstamp[s->gs[rb].in[i]] == st && !value_const(s, s->gs[rb].in[i])) return true;
    return false;
}

/* ---- the cycle check ----------------------------------------------------------
 *
 * Merging A and B is illegal when a path leaves A and reaches B (or the
 * reverse) through a group X outside both: the merged kernel would have to
 * run both before and after X.
 *
 *      A ──v──► X ──► B          A+B ──► X ──► A+B   (cycle)
 *      └──────────────┘
 *
 * The search walks the group graph (a group runs as one kernel, so reaching
 * any node of X reaches all of X's outputs) from A's outputs, skipping the
 * direct edges A->B. It gives up after KF_PLAN_CYCLE_BUDGET edges, refusing
 * the merge: planning stays near linear, at the price of rare missed merges
 * in huge fan-outs.
 *
 * No group is pruned by its position: a group whose nodes all come after
 * B's can still reach B through a merged group that spans both earlier and
 * later nodes (X -> Y -> B with Y = {y1 before B, y2 after X}); pruning
 * such X by its first position let a cycle through (random graph 24291).
 */
static const char *reaches(pl_state *s, uint32_t src, uint32_t dst) {
    if (++s->stampv == 0) {
        memset(s->stamp, 0, (size_t)s->ngs * sizeof *s->stamp);
        s->stampv = 1;
    }
    uint32_t st = s->stampv, sp = 0, budget = 0;
    uint32_t cur = src;
    for (;;) {
        const pl_group *G = &s->gs[cur];
        for (uint32_t i = 0; i < G->nout; i++) {
            const kf_value *val = &s->g->values[G->out[i]];
            for (uint32_t u = 0; u < val->nusers; u++) {
                if (++budget > KF_PLAN_CYCLE_BUDGET) return KF_REASON_CYCLE_BUDGET;
                uint32_t r = pl_find(s, val->users[u]);
                if (r == dst) {
                    if (cur != src) return KF_REASON_CYCLE;
                    continue; /* the direct edge itself */
                }
                if (r == src || s->stamp[r] == st) continue;
                s->stamp[r] = st;
                s->stack[sp++] = r; /* each root pushed once: sp < nnodes */
            }
        }
        if (!sp) return NULL;
        cur = s->stack[--sp];
    }
}

/* ---- anchor group shapes ------------------------------------------------------- */

/* Layout ops: an anchor applies them as a tile load/store index map. A
 * Gather with one scalar index selects one slice along its axis (a fixed
 * offset, like one output of a Split). */
bool pl_layout_op(const kf_graph *g, const kf_node *n) {
    switch (n->op) {
    case KF_OP_RESHAPE:
    case KF_OP_FLATTEN:
    case KF_OP_SQUEEZE:
    case KF_OP_UNSQUEEZE:
    case KF_OP_TRANSPOSE:
    case KF_OP_SPLIT: return true;
    case KF_OP_GATHER: return n->nin == 2 && n->in[1] && g->values[n->in[1]].type.rank == 0;
    default: return false;
    }
}

bool kf_plan_row_epilogue(const kf_node *r) {
    return r->op == KF_OP_SOFTMAX || r->op == KF_OP_LOG_SOFTMAX || r->op == KF_OP_LAYER_NORMALIZATION ||
           r->op == KF_OP_RMS_NORMALIZATION;
}

bool kf_plan_is_reshape(const kf_node *n) {
    switch (n->op) {
    case KF_OP_RESHAPE:
    case KF_OP_FLATTEN:
    case KF_OP_SQUEEZE:
    case KF_OP_UNSQUEEZE: return true;
    default: return false;
    }
}

static bool dim_eq(const kf_type *a, int da, const kf_type *b, int db) {
    return a->dims[da] == b->dims[db] && (a->dims[da] >= 0 || (a->syms[da] && a->syms[da] == b->syms[db]));
}

/* Does reduction r reduce (or normalize) over exactly the last axis of its
 * input? Softmax-like ops and norms by their axis attribute; ReduceX by its
 * shapes (the output drops or keeps-as-1 the last dim only), so axes given
 * as an input need not be read. */
static bool last_axis_reduction(const pl_state *s, const kf_node *r) {
    if (r->nin < 1 || !r->in[0] || r->nout < 1 || !r->out[0]) return false;
    const kf_type *in = &s->g->values[r->in[0]].type, *out = &s->g->values[r->out[0]].type;
    int rank = in->rank;
    if (rank < 1) return false;
    int64_t a;
    switch (r->op) {
    case KF_OP_SOFTMAX:
    case KF_OP_LOG_SOFTMAX:
    case KF_OP_HARDMAX: /* before opset 13 rows are coerced to 2-D at axis (default 1) */
        a = kf_attr_i(r, "axis", kf_model_opset(s->m, "") < 13 ? 1 : -1);
        return (a < 0 ? a + rank : a) == rank - 1;
    case KF_OP_LAYER_NORMALIZATION:
    case KF_OP_RMS_NORMALIZATION: /* normalizes over [axis, rank) */
        a = kf_attr_i(r, "axis", -1);
        return (a < 0 ? a + rank : a) == rank - 1;
    case KF_OP_REDUCE_SUM:
    case KF_OP_REDUCE_MEAN:
    case KF_OP_REDUCE_MAX:
    case KF_OP_REDUCE_MIN:
    case KF_OP_REDUCE_PROD:
    case KF_OP_REDUCE_L1:
    case KF_OP_REDUCE_L2:
    case KF_OP_REDUCE_LOG_SUM:
    case KF_OP_REDUCE_LOG_SUM_EXP:
    case KF_OP_REDUCE_SUM_SQUARE:
        if (out->rank == rank) {
            if (out->dims[rank - 1] != 1 || in->dims[rank - 1] == 1) return false;
        } else if (out->rank != rank - 1) {
            return false;
        }
        for (int d = 0; d < rank - 1; d++)
            if (!dim_eq(in, d, out, d)) return false;
        return true;
    default: return false;
    }
}

/* A 1x1, stride-1, unpadded, ungrouped Conv: per pixel a GEMM over the
 * input channels, so it can read another conv's output rows (one pixel's
 * channels) from on chip with no halo. */
static bool conv_1x1(const pl_state *s, const kf_node *n) {
    if (n->op != KF_OP_CONV || n->nin < 2 || !n->in[1] || kf_attr_i(n, "group", 1) != 1) return false;
    const kf_type *w = &s->g->values[n->in[1]].type;
    if (w->rank < 3) return false;
    for (int d = 2; d < w->rank; d++)
        if (w->dims[d] != 1) return false;
    int c = 0;
    const int64_t *v = kf_attr_ints(n, "strides", &c);
    for (int i = 0; v && i < c; i++)
        if (v[i] != 1) return false;
    v = kf_attr_ints(n, "pads", &c);
    for (int i = 0; v && i < c; i++)
        if (v[i] != 0) return false;
    return true;
}

/* Does the row tile of an anchor output `v` (rows of `row` elements) fit
 * KF_PLAN_ROW_TILE_M rows in KF_PLAN_ONCHIP_BYTES? */
static bool row_fits(const pl_state *s, kf_id v, int64_t row) {
    int64_t esz = (int64_t)kf_dtype_size(s->g->values[v].type.dtype), b;
    if (esz <= 0) esz = 4;
    return row > 0 && kf_mul_ok(row, esz * KF_PLAN_ROW_TILE_M, &b) && b <= KF_PLAN_ONCHIP_BYTES;
}

/* Is Softmax r after MatMul x the middle of attention that the streaming
 * kernel runs (codegen/cg_attention.c), so its rows need not fit on chip?
 * Its output is the left operand of a MatMul (directly, or through an int8
 * plan's Q/DQ: kf_att_passes), and both head dims (x's K, the second
 * MatMul's N) are at most 128: the streamed tiles fit in every storage
 * type. */
static bool streams_keys(const pl_state *s, kf_id x, kf_id r) {
    const kf_node *an = &s->g->nodes[x], *rn = &s->g->nodes[r];
    if (an->op != KF_OP_MATMUL || rn->op != KF_OP_SOFTMAX || !rn->out[0]) return false;
    /* the second product: the one node the probabilities reach through
     * the chain kf_att_passes walks (single users all the way) */
    kf_id v = rn->out[0];
    const kf_node *b = NULL;
    for (int depth = 0; depth <= 9; depth++) {
        const kf_value *p = &s->g->values[v];
        if (p->nusers != 1 || p->is_output) return false;
        b = &s->g->nodes[p->users[0]];
        if (b->op == KF_OP_MATMUL || !b->nout || !b->out[0]) break;
        v = b->out[0];
    }
    if (!b || b->op != KF_OP_MATMUL || kf_att_passes(s->g, an, rn, b) == 0 || b->in[1] == v) return false;
    const kf_type *ta = &s->g->values[an->in[0]].type, *tb = &s->g->values[b->in[1]].type;
    int64_t k = ta->rank ? ta->dims[ta->rank - 1] : -1, nv = tb->rank >= 2 ? tb->dims[tb->rank - 1] : -1;
    return k > 0 && k <= 128 && nv > 0 && nv <= 128;
}

/* Masters of a tentative union, as bits in pl_state.up/dn. */
#define PL_M_X0 1 /* the first anchor (by position) */
#define PL_M_X1 2 /* the second anchor */
#define PL_M_R 4  /* the reduction */
#define PL_M_X (PL_M_X0 | PL_M_X1)

static bool in_union(pl_state *s, kf_id node, uint32_t ra, uint32_t rb) {
    if (!node || s->pos[node] == UINT32_MAX) return false;
    uint32_t r = pl_find(s, node);
    return r == ra || r == rb;
}

/* Masters upstream of value v inside the union (v's producer included). */
static uint8_t dep_of(pl_state *s, kf_id v, uint32_t ra, uint32_t rb, const kf_id *X, kf_id R) {
    kf_id p = v ? s->g->values[v].producer : 0;
    if (!in_union(s, p, ra, rb)) return 0;
    uint8_t bit = p == X[0] ? PL_M_X0 : p == X[1] ? PL_M_X1 : p == R ? PL_M_R : 0;
    return (uint8_t)(s->up[p] | bit);
}

/* Two chained anchors x1 -> x2 (see "back-to-back" in kf_plan.h). */
static const char *b2b_reason(pl_state *s, uint32_t ra, uint32_t rb, const kf_id *X, kf_id R) {
    const kf_node *a = &s->g->nodes[X[0]], *b = &s->g->nodes[X[1]];
    bool gemm = (a->op == KF_OP_MATMUL || a->op == KF_OP_GEMM) &&
                (b->op == KF_OP_MATMUL || (b->op == KF_OP_GEMM && !kf_attr_i(b, "transA", 0)));
    bool conv = a->op == KF_OP_CONV && conv_1x1(s, b);
    if (!gemm && !conv) return KF_REASON_B2B_OPERAND;
    if (!(dep_of(s, b->in[0], ra, rb, X, R) & PL_M_X0)) return KF_REASON_B2B_OPERAND;
    for (int k = 1; k < b->nin; k++)
        if (dep_of(s, b->in[k], ra, rb, X, R) & PL_M_X0) return KF_REASON_B2B_OPERAND;
    kf_id ao = a->out[0], bi = b->in[0];
    pl_same c = pl_space_cmp(s, ao, bi);
    if (c == PL_UNKNOWN) return KF_REASON_SHAPES;
    if (c == PL_DIFFERENT) return KF_REASON_B2B_OPERAND;
    const kf_type *to = &s->g->values[ao].type, *ti = &s->g->values[bi].type;
    if (to->rank < 2 || ti->rank < 2) return KF_REASON_B2B_OPERAND;
    int da = gemm ? to->rank - 1 : 1, db = gemm ? ti->rank - 1 : 1;
    kf_sdim rowa = kf_type_sdim(to, da), rowb = kf_type_sdim(ti, db);
    if (!kf_sdim_known(rowa) || !kf_sdim_known(rowb)) return KF_REASON_SHAPES;
    if (!kf_sdim_eq(rowa, rowb)) return rowa.sym || rowb.sym ? KF_REASON_SHAPES : KF_REASON_B2B_OPERAND;
    if (R && gemm && streams_keys(s, X[0], R)) return NULL; /* any row length, symbolic too */
    if (rowa.sym) return KF_REASON_SHAPES;
    return row_fits(s, ao, to->dims[da]) ? NULL : KF_REASON_B2B_CAP;
}

/* Reduction r after anchor x (see "row reduction" in kf_plan.h). */
static const char *row_reduction_reason(pl_state *s, kf_id x, kf_id r) {
    const kf_node *an = &s->g->nodes[x], *rn = &s->g->nodes[r];
    /* conv rows are channels: not last in NCHW; an integer product's rows
     * are its int32 sums, scaled in the epilogue before the reduction */
    if (an->op != KF_OP_MATMUL && an->op != KF_OP_GEMM && an->op != KF_OP_MATMUL_INTEGER) return KF_REASON_RED_AXIS;
    /* after a library call the epilogue is a kernel of its own, which
     * computes any reduction (kernels/libanchor.c) */
    if (!kf_plan_row_epilogue(rn) && !s->lib) return KF_REASON_RED_KIND;
    if (!last_axis_reduction(s, rn)) return KF_REASON_RED_AXIS;
    kf_id xo = an->out[0], ri = rn->in[0];
    pl_same c = pl_space_cmp(s, xo, ri);
    if (c == PL_UNKNOWN) return KF_REASON_SHAPES_RED;
    if (c == PL_DIFFERENT) return KF_REASON_RED_AXIS;
    const kf_type *to = &s->g->values[xo].type, *ti = &s->g->values[ri].type;
    if (to->rank < 1 || ti->rank < 1) return KF_REASON_SHAPES_RED;
    kf_sdim n = kf_type_sdim(to, to->rank - 1), m = kf_type_sdim(ti, ti->rank - 1);
    if (!kf_sdim_known(n) || !kf_sdim_known(m)) return KF_REASON_SHAPES_RED;
    if (!kf_sdim_eq(n, m)) return n.sym || m.sym ? KF_REASON_SHAPES_RED : KF_REASON_RED_AXIS;
    if (streams_keys(s, x, r)) return NULL; /* any row length, symbolic too */
    if (n.sym) return KF_REASON_SHAPES_RED;
    return row_fits(s, xo, n.v) ? NULL : KF_REASON_ROW_CAP;
}

/* Is node u of the union a select (Split, Gather of one index: a slice of
 * its input) after an anchor? Each of its outputs is an iteration space of
 * the epilogue: the anchor's elements in that slice (q, k and v of a merged
 * projection, each with its own tail). */
static bool select_after_anchor(const pl_state *s, kf_id u) {
    const kf_node *n = &s->g->nodes[u];
    return (n->op == KF_OP_SPLIT || n->op == KF_OP_GATHER) && pl_layout_op(s->g, n) && (s->up[u] & PL_M_X);
}

/* Which part of the anchor's output union value v is computed from: the
 * output of the select (after an anchor) or of the Transpose it descends
 * from (q, k or v of a merged projection; a transposed copy), the anchor's
 * output itself, 0 when v is not computed from an anchor in the union, or
 * PL_PARTS_MIXED when it combines two parts, or the search ran out of
 * *visits. A generated anchor's epilogue has one element of the output at
 * a time: it cannot combine two parts (SwiGLU's gate and up halves of one
 * product, `Transpose(y) + y`). */
#define PL_PARTS_MIXED ((kf_id)UINT32_MAX)

static kf_id part_of(pl_state *s, kf_id v, uint32_t ra, uint32_t rb, int *visits) {
    kf_id p = s->g->values[v].producer;
    if (!p || !in_union(s, p, ra, rb)) return 0;
    if (--*visits < 0) return PL_PARTS_MIXED;
    const kf_node *n = &s->g->nodes[p];
    if (pl_fclass(s->g, n) == KF_FC_ANCHOR) return v;
    kf_id r = 0;
    for (int k = 0; k < n->nin; k++) {
        kf_id q = n->in[k] ? part_of(s, n->in[k], ra, rb, visits) : 0;
        if (!q) continue;
        if (q == PL_PARTS_MIXED || (r && r != q)) return PL_PARTS_MIXED;
        r = q;
    }
    /* a slice or a transposed copy of a part is a part of its own (a
     * Transpose of a value the anchor does not compute is not) */
    if (r && (select_after_anchor(s, p) || n->op == KF_OP_TRANSPOSE)) return v;
    return r;
}

/* Does epilogue node x combine two parts of an anchor's output (part_of)? */
static bool mixes_parts(pl_state *s, const kf_node *x, uint32_t ra, uint32_t rb) {
    int visits = 64;
    kf_id r = 0;
    for (int k = 0; k < x->nin; k++) {
        kf_id q = x->in[k] ? part_of(s, x->in[k], ra, rb, &visits) : 0;
        if (!q) continue;
        if (q == PL_PARTS_MIXED || (r && r != q)) return true;
        r = q;
    }
    return false;
}

/* Does the output of non-master node x sit in one of the union's
 * iteration spaces? Anchor outputs, the reduction's input and output, the
 * slices a select after an anchor makes (ub: the union's nu nodes), and
 * (for prologue ops) the anchors' operands. */
static const char *node_space(pl_state *s, kf_id x, const kf_id *X, int nx, kf_id R, bool prologue, const kf_id *ub,
                              uint32_t nu) {
    const kf_node *n = &s->g->nodes[x];
    kf_id v = n->nout > 0 ? n->out[0] : 0;
    kf_id sp[8];
    int ns = 0;
    for (int i = 0; i < nx; i++) {
        const kf_node *a = &s->g->nodes[X[i]];
        sp[ns++] = a->out[0];
        if (prologue)
            for (int k = 0; k < a->nin && k < 2; k++) sp[ns++] = a->in[k];
    }
    if (R) {
        sp[ns++] = s->g->nodes[R].in[0];
        sp[ns++] = s->g->nodes[R].out[0];
    }
    bool unknown = false;
    for (int i = 0; i < ns; i++) {
        pl_same c = pl_space_cmp(s, v, sp[i]);
        if (c == PL_SAME) return NULL;
        unknown |= c == PL_UNKNOWN;
    }
    /* an elementwise tail of one slice: only downstream of the select */
    for (uint32_t i = 0; !prologue && i < nu; i++) {
        if (!select_after_anchor(s, ub[i])) continue;
        const kf_node *sn = &s->g->nodes[ub[i]];
        for (int j = 0; j < sn->nout; j++) {
            pl_same c = pl_space_cmp(s, v, sn->out[j]);
            if (c == PL_SAME && (s->up[x] & PL_M_X)) return NULL;
            unknown |= c == PL_UNKNOWN;
        }
    }
    return unknown ? KF_REASON_SHAPES : KF_REASON_SPACE;
}

/* Does Transpose node n reorder dims of more than one element? (Moving
 * dims of 1 keeps every element's linear index, so rows stay rows.) */
static bool moves_rows(const pl_state *s, const kf_node *n) {
    if (n->op != KF_OP_TRANSPOSE || n->nin < 1 || !n->in[0]) return false;
    const kf_type *t = &s->g->values[n->in[0]].type;
    int np = 0;
    const int64_t *perm = kf_attr_ints(n, "perm", &np);
    int last = -1;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = perm && np == t->rank ? perm[i] : t->rank - 1 - i; /* no perm: reversed */
        if (d < 0 || d >= t->rank) return true;
        if (t->dims[d] == 1) continue;
        if (d < last) return true;
        last = (int)d;
    }
    return false;
}

bool kf_plan_is_view(const kf_node *n) {
    return n->op == KF_OP_RESHAPE || n->op == KF_OP_FLATTEN || n->op == KF_OP_SQUEEZE || n->op == KF_OP_UNSQUEEZE ||
           n->op == KF_OP_IDENTITY || n->op == KF_OP_TRANSPOSE;
}

/* The members of the union of groups ra and rb in s->ubuf, in
 * topological (position) order; returns their count. */
static uint32_t union_members(pl_state *s, uint32_t ra, uint32_t rb) {
    uint32_t n = 0;
    /* merge the two position-sorted member lists */
    uint32_t x = s->gs[ra].head, y = s->gs[rb].head;
    while (x || y) {
        if (!y || (x && s->pos[x] < s->pos[y])) s->ubuf[n++] = x, x = s->next[x];
        else s->ubuf[n++] = y, y = s->next[y];
    }
    return n;
}

static bool same_dims(const kf_type *a, const kf_type *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

#define PL_M_AFTER_R 8 /* downstream of the row reduction (row_epilogue_reason) */
#define PL_M_MOVED 16  /* ... through a view that changes the dims */

/* A reduction kernel (no anchor) whose result lies on its input's rows
 * (LayerNormalization, Softmax...: same dims) writes its epilogue on those
 * rows, its outputs there or views of them (codegen.c, gen_reduction and
 * view_chain): after it, data movement is a view (Reshape family,
 * Transpose), and nothing computes on a view that changed the dims. (An
 * anchor's row epilogue takes a select: cg_anchor.c.) Members of the union
 * in s->ubuf[0..n), R the reduction. */
static const char *row_epilogue_reason(pl_state *s, uint32_t n, uint32_t ra, uint32_t rb, kf_id R) {
    const kf_graph *g = s->g;
    const kf_node *rn = &g->nodes[R];
    if (rn->nin < 1 || !rn->in[0] || !rn->out[0] ||
        !same_dims(&g->values[rn->in[0]].type, &g->values[rn->out[0]].type))
        return NULL; /* statistics on their own space: written at their linear index */
    for (uint32_t i = 0; i < n; i++) {
        kf_id id = s->ubuf[i];
        const kf_node *nd = &g->nodes[id];
        uint8_t f = 0;
        for (int k = 0; k < nd->nin; k++) {
            kf_id pr = nd->in[k] ? g->values[nd->in[k]].producer : 0;
            if (pr == R) f |= PL_M_AFTER_R;
            else if (pr != id && in_union(s, pr, ra, rb)) f |= s->up[pr] & (PL_M_AFTER_R | PL_M_MOVED);
        }
        if (id != R && (f & PL_M_AFTER_R)) {
            if (pl_layout_op(g, nd)) {
                if (!kf_plan_is_view(nd)) return KF_REASON_SPACE;
                if (!nd->out[0] || !same_dims(&g->values[nd->in[0]].type, &g->values[nd->out[0]].type)) f |= PL_M_MOVED;
            } else if (f & PL_M_MOVED) {
                return KF_REASON_SPACE;
            }
        }
        s->up[id] = (uint8_t)((s->up[id] & (PL_M_X | PL_M_R)) | f);
    }
    return NULL;
}

/* Legality of a union holding at least one anchor: the anchor group shapes
 * of kf_plan.h, checked node by node over the members in topological
 * order (groups stay small: the register cap bounds them). */
static const char *anchor_union(pl_state *s, uint32_t ra, uint32_t rb) {
    uint32_t n = union_members(s, ra, rb);
    kf_id X[2] = {0, 0}, R = 0;
    int nx = 0;
    for (uint32_t i = 0; i < n; i++) {
        kf_fclass fc = pl_fclass(s->g, &s->g->nodes[s->ubuf[i]]);
        if (fc == KF_FC_ANCHOR) {
            if (nx == 2) return KF_REASON_TWO_ANCHORS;
            X[nx++] = s->ubuf[i];
        } else if (fc == KF_FC_REDUCTION) {
            R = s->ubuf[i];
        }
    }
    /* masters upstream of each member */
    for (uint32_t i = 0; i < n; i++) {
        const kf_node *nd = &s->g->nodes[s->ubuf[i]];
        uint8_t up = 0;
        for (int k = 0; k < nd->nin; k++) up |= dep_of(s, nd->in[k], ra, rb, X, R);
        s->up[s->ubuf[i]] = up;
    }
    /* masters downstream, in reverse order */
    for (uint32_t i = n; i-- > 0;) {
        const kf_node *nd = &s->g->nodes[s->ubuf[i]];
        uint8_t dn = 0;
        for (int j = 0; j < nd->nout; j++) {
            if (!nd->out[j]) continue;
            const kf_value *val = &s->g->values[nd->out[j]];
            for (uint32_t u = 0; u < val->nusers; u++) {
                kf_id c = val->users[u];
                if (!in_union(s, c, ra, rb)) continue;
                dn |= s->dn[c] | (c == X[0] ? PL_M_X0 : c == X[1] ? PL_M_X1 : c == R ? PL_M_R : 0);
            }
        }
        s->dn[s->ubuf[i]] = dn;
    }
    if (nx == 2) {
        if (!(s->up[X[1]] & PL_M_X0)) return KF_REASON_TWO_ANCHORS; /* siblings, not a chain */
        const char *why = b2b_reason(s, ra, rb, X, R);
        if (why) return why;
    }
    if (R) {
        uint8_t d = dep_of(s, s->g->nodes[R].in[0], ra, rb, X, R);
        if (!(d & PL_M_X)) return (s->dn[R] & PL_M_X) ? KF_REASON_ANCHOR_PROLOGUE : KF_REASON_ANCHOR_REDUCTION;
        const char *why = row_reduction_reason(s, (d & PL_M_X1) ? X[1] : X[0], R);
        if (why) return why;
    }
    for (uint32_t i = 0; i < n; i++) {
        kf_id id = s->ubuf[i];
        const kf_node *nd = &s->g->nodes[id];
        kf_fclass fc = pl_fclass(s->g, nd);
        if (fc == KF_FC_ANCHOR || fc == KF_FC_REDUCTION) continue;
        bool layout = pl_layout_op(s->g, nd);
        if (fc == KF_FC_INJECTIVE && !layout) return KF_REASON_ANCHOR_INJECTIVE;
        uint8_t up = s->up[id], dn = s->dn[id];
        bool prologue = !(up & (PL_M_X | PL_M_R)) && (dn & PL_M_X);
        if (prologue) { /* recomputed at each tile load: nobody else may read it */
            for (int j = 0; j < nd->nout; j++)
                if (nd->out[j] && leaves(s, nd->out[j], ra, rb)) return KF_REASON_PROLOGUE_SHARED;
        }
        if (layout) {
            /* rows between chained anchors stay rows */
            if (nx == 2 && (up & PL_M_X0) && (dn & PL_M_X1)) return KF_REASON_B2B_OPERAND;
            /* and between an anchor and its row reduction: a Transpose of
             * non-unit dims there (even one a later Transpose undoes)
             * changes which elements a row tile holds */
            if ((up & PL_M_X) && (dn & PL_M_R) && moves_rows(s, nd)) return KF_REASON_RED_AXIS;
            continue;
        }
        const char *why = node_space(s, id, X, nx, R, prologue, s->ubuf, n);
        if (why) return why;
        /* after a library call the epilogue kernel reads the output from memory, any element */
        if (!prologue && !s->lib && (up & PL_M_X) && mixes_parts(s, nd, ra, rb)) return KF_REASON_EPI_PARTS;
    }
    return NULL;
}

/* ---- broadcast producers ------------------------------------------------------- */

/* Is elementwise group A (ra) a small producer whose every output is read
 * only by elementwise group B (rb), in B's space (which pl_space_cmp says
 * differs from A's), either through a broadcast or as an operand of a
 * Concat? A mask is the usual broadcast: Cast and Reshape of [B, S] ids,
 * read by an And over [B, 1, S, S]; rotary embedding's rotate-half the
 * usual Concat: the two halves' Slices and the Neg of one, concatenated
 * back. Merged, the kernel walks B's space and asks A's values at each
 * element's index as its reader maps it (the broadcast index, or the
 * operand's shifted index: codegen's emit), recomputing A's few ops there
 * instead of launching a kernel for them; a Concat reads each element of
 * its operands once. Symbolic dims broadcast when they are the same
 * symbol or a literal 1. */
#define PL_BCAST_MAX_NODES 4 /* ops recomputed per element of the reader's space, at most */

static bool broadcast_producer(pl_state *s, uint32_t ra, uint32_t rb) {
    const pl_group *A = &s->gs[ra], *B = &s->gs[rb];
    if (A->kind != KF_GROUP_ELEMWISE || B->kind != KF_GROUP_ELEMWISE || A->master || B->master ||
        A->nnodes > PL_BCAST_MAX_NODES || !B->space)
        return false;
    const kf_type *bt = &s->g->values[B->space].type;
    for (uint32_t i = 0; i < A->nout; i++) {
        const kf_value *v = &s->g->values[A->out[i]];
        const kf_type *vt = &v->type;
        if (v->is_output || vt->rank > bt->rank) return false;
        bool bcast = true; /* v's dims broadcast into B's space */
        for (int d = 1; d <= vt->rank && bcast; d++) {
            kf_sdim x = kf_type_sdim(vt, vt->rank - d), y = kf_type_sdim(bt, bt->rank - d);
            bcast = kf_sdim_known(y) && (kf_sdim_eq(x, y) || kf_sdim_eq(x, kf_sdim_const(1)));
        }
        for (uint32_t u = 0; u < v->nusers; u++) {
            const kf_node *c = &s->g->nodes[v->users[u]];
            /* a reader whose output is B's space: an elementwise op
             * broadcasts its operands to it, a Concat places each at its
             * offset; a layout op would index v by its own shape */
            if (pl_find(s, v->users[u]) != rb || !c->nout || !c->out[0] ||
                pl_space_cmp(s, c->out[0], B->space) != PL_SAME)
                return false;
            if (c->op == KF_OP_CONCAT) continue;
            if (!bcast || pl_layout_op(s->g, c) || pl_fclass(s->g, c) == KF_FC_INJECTIVE) return false;
        }
    }
    return true;
}

/* ---- legality ------------------------------------------------------------------ */

/* Does a node of group a produce a value a node of group b reads? */
static bool feeds(pl_state *s, uint32_t ra, uint32_t rb) {
    const pl_group *A = &s->gs[ra];
    for (uint32_t i = 0; i < A->nout; i++) {
        const kf_value *val = &s->g->values[A->out[i]];
        for (uint32_t u = 0; u < val->nusers; u++)
            if (pl_find(s, val->users[u]) == rb) return true;
    }
    return false;
}

/* See kf_plan_merge_reason. ra/rb are roots; vertical: ra is the producer. */
const char *pl_legal(pl_state *s, uint32_t ra, uint32_t rb, bool horizontal) {
    const pl_group *A = &s->gs[ra], *B = &s->gs[rb];
    if (ra == rb) return NULL;
    if (A->kind == KF_GROUP_CONST || B->kind == KF_GROUP_CONST) return KF_REASON_PRODUCER_CONST;
    if (horizontal) {
        if (A->kind != KF_GROUP_ELEMWISE || B->kind != KF_GROUP_ELEMWISE) return KF_REASON_H_KIND;
        if (!share_input(s, ra, rb)) return KF_REASON_H_NO_SHARED;
    } else {
        if (A->kind == KF_GROUP_OPAQUE) return KF_REASON_PRODUCER_OPAQUE;
        if (B->kind == KF_GROUP_OPAQUE) return KF_REASON_CONSUMER_OPAQUE;
    }
    /* the lattice: one reduction; anchors only in the shapes anchor_union allows */
    int nred = A->nred + B->nred, nanc = A->nanchor + B->nanchor;
    if (nred > 1) return KF_REASON_TWO_REDUCTIONS;
    if (nanc > 2) return KF_REASON_TWO_ANCHORS;
    if (nanc) {
        const char *why = anchor_union(s, ra, rb);
        if (why) return why;
    } else {
        /* iteration spaces */
        const pl_group *M = A->master ? A : B->master ? B : NULL;
        if (M && M->nred) {
            const pl_group *E = M == A ? B : A; /* pure elementwise */
            pl_same a = pl_space_cmp(s, E->space, M->space), b = pl_space_cmp(s, E->space, M->red_out);
            if (a != PL_SAME && b != PL_SAME) return (a == PL_UNKNOWN || b == PL_UNKNOWN) ? KF_REASON_SHAPES_RED : KF_REASON_SPACE;
            const char *why = row_epilogue_reason(s, union_members(s, ra, rb), ra, rb, M->red);
            if (why) return why;
        } else {
            pl_same c = pl_space_cmp(s, A->space, B->space);
            if (c == PL_UNKNOWN) return KF_REASON_SHAPES;
            if (c == PL_DIFFERENT && (horizontal || !broadcast_producer(s, ra, rb))) return KF_REASON_SPACE;
        }
    }
    /* resource caps */
    uint32_t nin = pl_union_inputs(s, ra, rb, NULL);
    if (nin > KF_PLAN_MAX_INPUTS) return KF_REASON_INPUTS;
    uint32_t nout = pl_union_outputs(s, ra, rb, NULL);
    if (nout > KF_PLAN_MAX_OUTPUTS) return KF_REASON_OUTPUTS;
    if (pl_regs(nin, nout, A->cost + B->cost) > KF_PLAN_MAX_REGS) return KF_REASON_REGS;
    /* no path between them through an outside group, either way; when A
     * feeds B directly, a path from B back to A would already close a cycle
     * in the group graph, which is acyclic: only A -> ... -> B is searched */
    const char *why = reaches(s, ra, rb);
    if (!why && (horizontal || !feeds(s, ra, rb))) why = reaches(s, rb, ra);
    return why;
}

int64_t pl_regs(uint32_t nin, uint32_t nout, int64_t cost) {
    return PL_REG_BASE + PL_REG_PER_VALUE * (int64_t)(nin + nout) + cost;
}

/* ---- merging ---------------------------------------------------------------------- */

/* Merges the groups rooted at ra and rb (legality already checked). The
 * larger group's root survives (ties: lower id) so finds stay short. */
kf_status pl_merge(pl_state *s, uint32_t ra, uint32_t rb) {
    pl_group *A = &s->gs[ra], *B = &s->gs[rb];
    uint32_t nin = pl_union_inputs(s, ra, rb, NULL), nout = pl_union_outputs(s, ra, rb, NULL);
    kf_id *in = kf_malloc((size_t)(nin ? nin : 1) * sizeof *in);
    kf_id *out = kf_malloc((size_t)(nout ? nout : 1) * sizeof *out);
    if (!in || !out) {
        kf_free(in);
        kf_free(out);
        return kf_fail(KF_ERR_NOMEM, "fusion planner: out of memory");
    }
    pl_union_inputs(s, ra, rb, in);
    pl_union_outputs(s, ra, rb, out);
    /* a broadcast producer joining its reader: the reader's space */
    kf_id bspace = !A->master && !B->master && pl_space_cmp(s, A->space, B->space) == PL_DIFFERENT &&
                           broadcast_producer(s, ra, rb)
                       ? B->space
                       : 0;
    uint32_t keep = ra, gone = rb;
    if (B->nnodes > A->nnodes || (B->nnodes == A->nnodes && rb < ra)) keep = rb, gone = ra;
    pl_group *K = &s->gs[keep], *G = &s->gs[gone];
    pl_group m = *K;
    /* member lists, merged by position */
    uint32_t x = A->head, y = B->head, head = 0, tail = 0;
    while (x || y) {
        uint32_t t;
        if (!y || (x && s->pos[x] < s->pos[y])) t = x, x = s->next[x];
        else t = y, y = s->next[y];
        if (tail) s->next[tail] = t;
        else head = t;
        tail = t;
    }
    s->next[tail] = 0;
    m.head = head;
    m.tail = tail;
    if (!m.master && G->master) {
        m.master = G->master;
        m.space = G->space;
        m.red_out = G->red_out;
        m.kind = G->kind;
    } else if (!m.master && G->space && !kf_type_is_static(&s->g->values[m.space].type) &&
               kf_type_is_static(&s->g->values[G->space].type)) {
        m.space = G->space; /* the same space (checked); keep the more static name */
    }
    if (bspace) m.space = bspace;
    m.nred = A->nred + B->nred;
    m.nanchor = A->nanchor + B->nanchor;
    m.red = A->red ? A->red : B->red;
    m.layout_only = A->layout_only && B->layout_only;
    if (m.nanchor) { /* anchors by position: the first is the group's master */
        kf_id an[4] = {0, 0, 0, 0};
        int na = 0;
        for (int i = 0; i < A->nanchor && i < 2; i++) an[na++] = A->anc[i];
        for (int i = 0; i < B->nanchor && i < 2; i++) an[na++] = B->anc[i];
        for (int i = 1; i < na; i++)
            for (int j = i; j > 0 && s->pos[an[j - 1]] > s->pos[an[j]]; j--) {
                kf_id t = an[j]; an[j] = an[j - 1]; an[j - 1] = t;
            }
        m.anc[0] = an[0];
        m.anc[1] = na > 1 ? an[1] : 0;
        m.master = an[0];
        m.kind = KF_GROUP_ANCHOR;
        m.space = s->g->nodes[an[0]].nout > 0 ? s->g->nodes[an[0]].out[0] : 0;
        m.red_out = 0;
    }
    m.ninj = A->ninj + B->ninj;
    m.minpos = A->minpos < B->minpos ? A->minpos : B->minpos;
    m.maxpos = A->maxpos > B->maxpos ? A->maxpos : B->maxpos;
    m.nnodes = A->nnodes + B->nnodes;
    m.cost = A->cost + B->cost;
    if (A->flops < 0 || B->flops < 0 || !kf_add_ok(A->flops, B->flops, &m.flops)) m.flops = -1;
    kf_free(A->in);
    kf_free(A->out);
    kf_free(B->in);
    kf_free(B->out);
    memset(G, 0, sizeof *G);
    m.in = in;
    m.nin = nin;
    m.out = out;
    m.nout = nout;
    *K = m;
    s->parent[gone] = keep;
    return KF_OK;
}

/* ---- initial groups ------------------------------------------------------------------- */

/* Is value v known before anything runs (initializer the model fixes, or
 * the output of a CONST node)? */
static bool value_const(pl_state *s, kf_id v) {
    const kf_value *val = &s->g->values[v];
    if (kf_value_is_constant(s->m, v)) return true;
    return val->producer && s->pos[val->producer] != UINT32_MAX && s->gs[val->producer].kind == KF_GROUP_CONST;
}

/* A node needs no kernel: Constant; Shape/Size; or any non-opaque-data op
 * whose inputs are all constant and whose outputs are small static tensors
 * (what shape inference already computes on the way) or have symbolic
 * dims. With symbolic dims, Shape/Size and what is computed from them and
 * constants alone (an exporter's shape arithmetic, a position-id Range, a
 * causal mask) are known once the shapes are: a runtime binds the dims and
 * computes them once per shape, as a static model folds them. */
static bool node_const(pl_state *s, const kf_node *n) {
    if (n->op == KF_OP_CONSTANT) return true;
    if ((n->op == KF_OP_SHAPE || n->op == KF_OP_SIZE) && n->nin >= 1 && n->in[0]) {
        const kf_type *t = &s->g->values[n->in[0]].type;
        if (kf_type_is_static(t) || value_const(s, n->in[0])) return true;
        if (t->rank < 0) return false;
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] < 0 && !t->syms[d]) return false;
        return true;
    }
    if (!n->op || n->nin == 0) return false;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && !value_const(s, n->in[i])) return false;
    /* the weights of a float8 product stay float8 on the device, however
     * small: the product reads them through this DequantizeLinear; so do a
     * float8 convolution's where the float8 tile pays on the target, else
     * they are dequantized once here, however large, for the library */
    if (n->op == KF_OP_DEQUANTIZE_LINEAR && n->nout == 1 && n->out[0] && s->g->values[n->out[0]].nusers == 1) {
        kf_id u = s->g->values[n->out[0]].users[0];
        if (kf_fp8_product(s->m, &s->g->nodes[u], NULL)) return false;
        if (kf_fp8_conv(s->m, &s->g->nodes[u], NULL)) return !kf_fp8_conv_pays(s->target, s->math, s->m, u);
    }
    for (int j = 0; j < n->nout; j++) {
        if (!n->out[j]) continue;
        const kf_type *t = &s->g->values[n->out[j]].type;
        int64_t numel;
        if (kf_type_is_static(t) && (kf_shape_numel(t->rank, t->dims, 1, &numel) || numel > KF_INFER_CONST_MAX))
            return false;
    }
    return true;
}

/* Singleton group of node x (called in topological order). */
kf_status pl_init_node(pl_state *s, kf_id x) {
    const kf_node *n = &s->g->nodes[x];
    pl_group *G = &s->gs[x];
    memset(G, 0, sizeof *G);
    kf_fclass fc = pl_fclass(s->g, n);
    if (node_const(s, n)) G->kind = KF_GROUP_CONST;
    else if (fc == KF_FC_OPAQUE) G->kind = KF_GROUP_OPAQUE;
    else if (fc == KF_FC_REDUCTION) G->kind = KF_GROUP_REDUCTION, G->nred = 1, G->master = x, G->red = x;
    else if (fc == KF_FC_ANCHOR) G->kind = KF_GROUP_ANCHOR, G->nanchor = 1, G->master = x, G->anc[0] = x;
    else G->kind = KF_GROUP_ELEMWISE, G->ninj = fc == KF_FC_INJECTIVE;
    G->layout_only = G->kind == KF_GROUP_ELEMWISE && pl_layout_op(s->g, n);
    G->head = G->tail = x;
    s->next[x] = 0;
    G->minpos = G->maxpos = s->pos[x];
    G->nnodes = 1;
    G->cost = G->kind == KF_GROUP_CONST || G->layout_only ? 0 : node_cost(fc);
    G->flops = G->kind == KF_GROUP_CONST ? 0 : pl_node_flops(s->g, n);
    kf_id out0 = n->nout > 0 ? n->out[0] : 0, in0 = n->nin > 0 ? n->in[0] : 0;
    if (G->kind == KF_GROUP_REDUCTION) {
        G->space = in0;
        G->red_out = out0;
    } else {
        G->space = out0;
    }
    G->in = kf_malloc((size_t)(n->nin ? n->nin : 1) * sizeof(kf_id));
    G->out = kf_malloc((size_t)(n->nout ? n->nout : 1) * sizeof(kf_id));
    if (!G->in || !G->out) return kf_fail(KF_ERR_NOMEM, "fusion planner: out of memory");
    uint32_t st = next_vstamp(s);
    for (int i = 0; i < n->nin; i++) {
        kf_id v = n->in[i];
        if (!v || s->vstamp[v] == st) continue;
        s->vstamp[v] = st;
        G->in[G->nin++] = v;
    }
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (!v) continue;
        const kf_value *val = &s->g->values[v];
        if (val->is_output || val->nusers) G->out[G->nout++] = v;
    }
    return KF_OK;
}

void pl_state_free(pl_state *s) {
    if (!s) return;
    if (s->gs)
        for (uint32_t i = 0; i < s->ngs; i++) {
            kf_free(s->gs[i].in);
            kf_free(s->gs[i].out);
        }
    kf_free(s->gs);
    kf_free(s->parent);
    kf_free(s->pos);
    kf_free(s->stamp);
    kf_free(s->vstamp);
    kf_free(s->stack);
    kf_free(s->sc);
    kf_free(s->order);
    kf_free(s->root_of_group);
    kf_free(s->next);
    kf_free(s->ubuf);
    kf_free(s->up);
    kf_free(s->dn);
    kf_free(s->cbuf);
    kf_free(s->vbuf);
    kf_target_free(s->target);
    kf_free(s);
}

/* ---- exported legality ------------------------------------------------------------------ */

const char *kf_plan_merge_reason(const kf_plan *p, uint32_t a, uint32_t b, bool horizontal) {
    if (!p || !p->state || a >= p->ngroups || b >= p->ngroups || a == b) return NULL;
    pl_state *s = p->state;
    return pl_decide(s, s->root_of_group[a], s->root_of_group[b], horizontal);
}
