/*
 * kf_cost.h: device profiles and the cost model that decides fusion.
 *
 * A target is data (one text file per device, fusion/targets/NAME.target,
 * embedded at build time; users may pass their own file): SM count,
 * bandwidths, per-dtype rates, on-chip limits, launch cost, and the
 * calibrated rates of kfuse's own kernel templates. One function estimates
 * a kernel group's time on a target (kf_cost_group); the planner merges two
 * groups only when that estimate says the merged kernel is not slower than
 * the two apart, and the report prints the same figure.
 *
 * The model, per group (DESIGN.md "The cost model"):
 *
 *   time = max(bytes / bandwidth, work / (rate per block x blocks that run
 *              at once)) x waves + fixed cost of the kernel form
 *
 * where the grid is the one codegen will launch (tiles, row tiles, pixels
 * per block), a block's rate comes from the template's calibration (a
 * generated GEMM on row tiles of 8 does a fifth of the work per block of
 * one on 64x64 tiles), and a library call (cuBLASLt, cuDNN) is modeled
 * from the datasheet rate at the precision, split-K and wave quantization.
 * Every figure is an estimate; its error against measured kernels is
 * published (bench/RESULTS.md, "Cost model calibration").
 */
#ifndef KF_COST_H
#define KF_COST_H

#include <stdio.h>

#include "kf_plan.h"

/* A device profile. Rates are per second; "frac" fields are fractions of
 * the matching peak, so a calibration carries over between GPUs of one
 * generation (see fusion/targets/README.md for each field). */
typedef struct kf_target {
    char name[32];
    char desc[96];
    int sms;                  /* streaming multiprocessors */
    double clock_ghz;         /* SM clock under load */
    int max_threads_sm;       /* resident threads per SM */
    int max_blocks_sm;        /* resident blocks per SM */
    int regs_sm;              /* 32-bit registers per SM */
    int smem_sm_kib;          /* shared memory per SM */
    double dram_gbs;          /* device copy bandwidth, bytes read + written (measured where possible) */
    double l2_mib;            /* L2 size */
    double l2_gbs;            /* L2 bandwidth, all SMs */
    double fma_tflops_fp32;   /* SIMT FMA rate (2 FLOPs per FMA) */
    double fma_tflops_fp16;   /* SIMT half rate (packed) */
    double tc_tflops_tf32;    /* tensor cores, dense */
    double tc_tflops_fp16;    /* fp16 and bf16 */
    double tc_tops_int8;
    double tc_tflops_fp8;     /* 0: no fp8 tensor cores */
    double launch_us;         /* one kernel node of a replayed CUDA Graph */
    double kernel_min_us;     /* the shortest a kernel that touches DRAM takes */
    int vendor_lib;           /* 1: GEMM/conv anchors go to cuBLASLt/cuDNN where they map */
    /* calibrated rates of kfuse's templates (fractions of the peaks above) */
    double ew_frac;           /* elementwise template: fraction of dram_gbs */
    double red_pass_clk;      /* row reductions: row elements per SM clock per pass over the row */
    double red_pass_us;       /* row reductions: fixed cost of one pass (a block reduce + sync) */
    double gemm_blk_base;     /* generated GEMM family: per-block rate as a fraction of one SM's */
    double gemm_blk_per_out;  /*   FMA peak = base + per_out x outputs each work-item holds */
    double conv_blk_frac;     /* generated convolutions: per-block rate, fraction of an SM's peak */
    double gen_blk_cap;       /* a whole SM of generated-GEMM blocks reaches at most this fraction */
    double lib_gemm_frac;     /* cuBLASLt: fraction of the peak rate at full occupancy */
    double lib_conv_frac;     /* cuDNN: the same */
    double lib_fixed_us;      /* a library GEMM's fixed cost (the small-problem floor) */
    double lib_conv_fixed_us; /* a library convolution's */
    double attn_tc_frac;      /* streaming attention, 16-bit: fraction of an SM's tensor-core peak */
    double attn_fma_frac;     /* streaming attention, float32: fraction of an SM's FMA peak */
    double igemm_dp4a_gain;   /* generated integer GEMM (dp4a): its per-block rate over the float
                               * tile's of the same outputs per work-item */
    double imma_blk_frac;     /* generated integer convolution on tensor cores: a 64 x 64 tile
                               * block's rate, fraction of one SM's int8 tensor-core peak */
} kf_target;

/* Math the libraries may use for float32 data (the precision option):
 * strict float32 FMA, or TF32 tensor cores. float16/bfloat16 data always
 * takes the tensor-core rate. */
typedef enum kf_cost_math { KF_MATH_FP32 = 0, KF_MATH_TF32 = 1 } kf_cost_math;

/* Looks up a built-in profile ("h200", "h100", "a100", "test") or, when
 * name contains a '/' or ends in ".target", reads that file. On success
 * *out is the caller's (kf_target_free). Errors: KF_ERR_INVALID_ARG
 * (unknown name: the message lists the built-in ones), KF_ERR_IO, and
 * KF_ERR_BAD_MODEL naming file:line for a bad or missing field. */
kf_status kf_target_get(const char *name, kf_target **out);
/* Parses profile text; `where` names it in errors. */
kf_status kf_target_parse(const char *text, size_t len, const char *where, kf_target **out);
void kf_target_free(kf_target *t);
/* Name of built-in profile i (0, 1, ...); NULL past the last. */
const char *kf_target_builtin_name(size_t i);

/* What the model says about one kernel group. */
typedef struct kf_cost {
    double us;          /* estimated time, launch included; 0 for no kernel */
    int64_t blocks;     /* grid the form launches (its library tiles for a library call) */
    int64_t resident;   /* blocks one SM holds at once */
    const char *form;   /* "none", "ew", "reduce", "gemm", "gemm_rows", "gemm_b2b", "conv",
                         * "conv_b2b", "lib_gemm", "lib_conv", "host" */
    const char *bound;  /* "memory", "l2" (operand tiles re-read per block), "compute",
                         * "latency", "launch" */
    bool known;         /* false: shapes unknown, us is a floor (launch only) */
    double epilogue_us; /* library forms: the generated epilogue kernel's part of us (0: none) */
    double lib_us;      /* a group the library could run, estimated faster as the generated
                         * kernel of `form`: the library call's estimate (0: not so) */
} kf_cost;

/* A group as the cost model sees it; kf_cost_of_group fills one from a
 * finished plan, the planner from its working state. */
typedef struct kf_cost_group {
    kf_group_kind kind;
    bool view;                 /* no kernel (kf_group.view) */
    kf_id anchor, anchor2;     /* kf_group.anchor / anchor2 */
    kf_id reduction;           /* the row reduction of an anchor group, or a reduction group's master */
    bool prologue;             /* an anchor operand is computed inside the group (other than
                                * the float8 operands below) */
    bool fp8;                  /* a float8 product or convolution (kf_fp8_anchor) whose two
                                * DequantizeLinears are in the group (their inputs not): the library
                                * call or the tensor-core tile reads their float8 inputs */
    bool epilogue;             /* nodes after the anchor other than bias/activation the library absorbs */
    bool epilogue_declined;    /* an epilogue the kernel after a library call cannot take (a select
                                * after the row reduction): the group runs as its generated kernel */
    int64_t bytes_read, bytes_written, flops; /* as kf_group; -1 unknown */
    int64_t operand_bytes;     /* anchor groups: bytes of the anchor's operands read from outside */
    kf_dtype operand_dtype;    /* anchor groups: the dtype the anchor computes on when priced before
                                * the precision pass sets it (0: its first operand's) */
    kf_id space;               /* elementwise: the value whose elements the kernel walks */
} kf_cost_group;

/* Estimates one group on target t with math mode `math`. Always fills *c
 * (unknown shapes give a launch-only floor with known false). Pure: no
 * allocation, no error. */
void kf_cost_estimate(const kf_target *t, kf_cost_math math, const kf_graph *g, const kf_cost_group *cg, kf_cost *c);

/* Fills the anchor fields of cg (prologue, epilogue, operand_bytes) from
 * the group's member nodes; cg->anchor must be set. member(ctx, node)
 * says whether a node is in the group. */
void kf_cost_describe_anchor(const kf_model *m, const kf_id *nodes, uint32_t n, kf_cost_group *cg,
                             bool (*member)(const void *ctx, kf_id node), const void *ctx);

/* The cost description of group k of plan p over model m. */
void kf_cost_of_group(const kf_model *m, const kf_plan *p, uint32_t k, kf_cost_group *cg);

/* Is n a float8 product cuBLASLt runs on its float8 values (kernels/
 * libanchor.c)? A MatMul, or a Gemm without transA, alpha or beta other
 * than 1, whose two operands are DequantizeLinear of float8 E4M3FN or
 * E5M2 values (not both E5M2) with a constant scale of one element and no
 * blocks, each read by n alone: the left one of a 2-D or batched
 * activation, the right one of a constant 2-D weight matrix that only this
 * DequantizeLinear reads (the library stores it transposed); K and N
 * multiples of 16 (the library's alignment of float8 rows). fmt (may be
 * NULL) gets the two formats (left, right). Shapes must be static. */
bool kf_fp8_product(const kf_model *m, const kf_node *n, kf_dtype fmt[2]);
/* kf_fp8_product, and with per_column also the form whose weight scale
 * holds one value per output column (what kf_fuse_fp8 rewrites). */
bool kf_fp8_product_form(const kf_model *m, const kf_node *n, bool per_column, kf_dtype fmt[2]);

/* Is n a float8 convolution the generated tensor-core tile runs on its
 * float8 values (codegen/cg_anchor.c, gen_iconv)? A Conv of one group,
 * static shapes, whose input is a DequantizeLinear of float8 E4M3FN or
 * E5M2 values with a constant scale of one element, and whose weights are
 * a DequantizeLinear of a constant float8 tensor only it reads, scaled per
 * tensor or per output channel (axis 0); each DequantizeLinear read by n
 * alone. fmt (may be NULL) gets the formats (input, weights). */
bool kf_fp8_conv(const kf_model *m, const kf_node *n, kf_dtype fmt[2]);
/* kf_fp8_product or kf_fp8_conv: an anchor whose float8 operands stay float8. */
bool kf_fp8_anchor(const kf_model *m, const kf_node *n);
/* Does float8 convolution `conv` (kf_fp8_conv) run faster on t as the
 * float8 tile, reading the float8 codes, than as the library's float16
 * convolution on dequantized operands (its weights folded)? Anchors alone
 * (both take bias and ReLU). True without a target (bytes favour float8)
 * or where shapes are unknown. */
bool kf_fp8_conv_pays(const kf_target *t, kf_cost_math math, const kf_model *m, kf_id conv);

/* Does an anchor group of this shape run as a library call on t? Always
 * false for back-to-back anchors and operand prologues (a generated kernel),
 * true for one MatMul/Gemm/Conv otherwise when t has vendor libraries, for
 * a MatMulInteger of the form cuBLASLt's int8 GEMM takes, and for a float8
 * product (cg->fp8) when t has float8 tensor cores. */
bool kf_cost_library(const kf_target *t, const kf_graph *g, const kf_cost_group *cg);

/* How a row reduction is laid out on the device: one rule that the
 * generator follows and the cost model mirrors (codegen/README.md "Row
 * reduction"). */
typedef struct kf_row_form {
    uint32_t seg;   /* lanes per row; 0: one work-item walks each row */
    uint32_t block; /* the preferred work-group (0 with seg 0) */
    int vec;        /* > 0: the row is read once into registers in vector steps of vec elements
                     * (4, or 8 for 16-bit data); 0: the passes walk the row in memory */
    int steps;      /* with vec: vector steps each lane holds */
} kf_row_form;
/* Grid constants of the row form (see kf_row_form_of in cost.c). */
#define KF_ROW_SEG_MAX 256     /* a row this long or longer has a work-group to itself */
#define KF_ROW_SEG_MIN_WARP 32 /* segments of rows of 32 and more: whole warps */
#define KF_ROW_SEG_MIN 4       /* the smallest segment, rows of 8..31 */
#define KF_ROW_BLOCK_MIN 32    /* the smallest work-group: one warp */
#define KF_ROW_PER_ITEM 8      /* rows shorter than this: one work-item per row */
#define KF_ROW_CACHE_MAX 32    /* values one lane may hold of its row */
#define KF_ROW_FILL_GROUPS 264 /* work-groups a grid keeps before it packs more rows per group */
/* The form for `rows` rows of K elements each, whose innermost reduced axis
 * is W long; narrow: 16-bit data; trailing: the reduced axes are the
 * innermost ones, the last among them. */
kf_row_form kf_row_form_of(int64_t rows, int64_t K, int64_t W, bool narrow, bool trailing);

/* The integer GEMM kernel's tiles (codegen/cg_anchor.c, gen_igemm): 64 x 64
 * (a 4 x 4 register tile per work-item of 256) while an M x N output of
 * `batch` matrices gives at least KF_GEMM_FILL_TILES of them, else 32 x 32
 * (2 x 2 per work-item): four times the work-groups, so BERT-base's
 * 128 x 768 projections keep 96 SMs busy instead of 24. */
#define KF_GEMM_FILL_TILES 132
int kf_igemm_tile(int64_t m, int64_t n, int64_t batch);

/* The integer convolution on tensor cores (codegen/cg_anchor.c, gen_iconv):
 * a ConvInteger of one group, static shapes, 8-bit operands, a per-tensor
 * input zero point, a per-tensor or per-channel weight zero point and
 * windows of at most INT32_MAX / 255^2 products (exact int sums) runs
 * as an implicit GEMM of output channels x (batch x output pixels) in
 * T x T tiles, 4 warps a work-group. The tile T: 64 while the output gives
 * at least KF_GEMM_FILL_TILES of them, else 32; 0 when the node is not
 * such a convolution (it keeps the direct template). */
int kf_iconv_tile(const kf_graph *g, const kf_node *n);
/* The tile T of that kernel for a convolution output of (static) type ot;
 * a float8 convolution (kf_fp8_conv) runs on the same kernel. */
int kf_mma_conv_tile(const kf_type *ot);
/* MatMulInteger on the same tensor-core tile (codegen/cg_anchor.c,
 * gen_mma8): static shapes, 8-bit operands of rank 2 or more (batch dims
 * broadcast), K of at most INT32_MAX / 255^2 (exact int sums); rows are M,
 * columns N, per batch. T: 64 while the output gives at least
 * KF_GEMM_FILL_TILES tiles, else 32; 0 when n is not such a MatMulInteger
 * (a 1-D operand keeps the packed GEMM of kf_igemm_tile). */
int kf_imma_gemm_tile(const kf_graph *g, const kf_node *n);

/* The streaming attention kernel's passes over the keys for back-to-back
 * MatMuls a -> b with Softmax r (over the keys) between
 * (codegen/cg_attention.c): 1 when the probabilities go straight into b's
 * left operand (through Identity); 2 when they go through a chain of
 * Identity, Cast and per-tensor QuantizeLinear/DequantizeLinear of their
 * own shape, the Softmax's input having a's output shape (an int8 plan's
 * Q/DQ of the probabilities: the first pass finds each row's max and sum,
 * the second normalizes each probability before the chain); 0 otherwise.
 * Every value on the way is read by the next node alone. */
int kf_att_passes(const kf_graph *g, const kf_node *a, const kf_node *r, const kf_node *b);

#endif
