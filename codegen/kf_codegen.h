/*
 * kf_codegen.h: one kernel text per fusion group, in the portable dialect
 * (DESIGN.md "codegen/"). A kernel is a target-independent BODY plus a
 * per-target PRELUDE of macros (KF_KERNEL, KF_GLOBAL, KF_RESTRICT,
 * KF_GLOBAL_ID, KF_GLOBAL_SIZE, kf_i64, KF_<MATH>); the body is byte-identical
 * for CUDA and OpenCL.
 *
 * Generated, for static shapes (codegen/README.md has the details):
 *  - elementwise groups: one grid-stride loop over the group's space; each
 *    value is read at an index map of its consumer's index (broadcast,
 *    Transpose, Reshape family, Expand, Slice, Concat, Gather, Pad), so
 *    injective ops fuse without intermediate buffers;
 *  - reduction groups (Reduce*, Softmax, LogSoftmax, LayerNormalization):
 *    each row reduced by a segment of T lanes of a work-group (T from the
 *    row length, 4..256, so one work-group holds several short rows or one
 *    long one) with a segmented reduce (KF_SHARED, KF_BARRIER and kf_seg_*
 *    from the prelude; rows of 8..31 take segments under a warp on CUDA and
 *    one lane per row on OpenCL, KF_SEG_NARROW), or one work-item per row
 *    for rows shorter than 8; prologue and epilogue ops fused in the same
 *    kernel;
 *  - anchor groups (cg_anchor.c): a tiled GEMM for MatMul/Gemm, the same
 *    with a whole-row Softmax/LogSoftmax/LayerNorm epilogue, GEMM -> GEMM
 *    through on-chip rows, a direct convolution for Conv and conv -> 1x1
 *    conv, with operand prologues and epilogues fused;
 *  - dtypes float32, float16 and bfloat16 (stored 16-bit, computed in
 *    float), int32, int64, bool.
 *
 * cg_expr conventions (graph/ops_*.def, last column), read only here:
 *   x0, x1, ...     operands (input slots of the node)
 *   exp(...), ...   C99 math names from the table in codegen.c; each becomes
 *                   KF_EXP(...) etc. in the body and the prelude maps it
 *   0.5, 1e-3       decimal literals get an `f` suffix (fp32 arithmetic)
 *   {alpha=0.01}    the node's float attribute `alpha`, or the default
 *   variadic ops    (in_max -1: Max, Min, Sum) give a binary expression over
 *                   x0, x1 that is folded left over all operands
 */
#ifndef KF_CODEGEN_H
#define KF_CODEGEN_H

#include "kf_plan.h"

/* ---- growable string (owns its memory; STYLE "Generated code") --------- */

typedef struct kf_cg_str {
    char *p;     /* NUL-terminated; NULL while empty */
    size_t len, cap;
    bool oom;    /* an append failed; the text is incomplete */
} kf_cg_str;

void kf_cg_puts(kf_cg_str *s, const char *text);
void kf_cg_printf(kf_cg_str *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Hands the text to the caller (kf_free; "" when nothing was appended) and
 * empties s. NULL when an append ran out of memory. */
char *kf_cg_take(kf_cg_str *s);
void kf_cg_str_release(kf_cg_str *s);

/* ---- kernels ------------------------------------------------------------ */

typedef enum kf_cg_target { KF_CG_OPENCL = 0, KF_CG_CUDA = 1 } kf_cg_target;

/* One kernel parameter: a dense row-major buffer of a group input/output. */
typedef struct kf_cg_param {
    kf_id value;     /* value id in the model the kernel was generated from */
    kf_dtype dtype;  /* float32, float16, bfloat16 (16-bit storage), int32, int64, bool (one
                      * byte); another dtype only for a parameter the body never
                      * reads (a Reshape's shape, say) */
    int rank;
    int64_t dims[KF_MAX_RANK];
    int64_t numel;
} kf_cg_param;

/* An index a kernel reads from a tensor at run time (Gather's indices).
 * An index outside [-dim, dim) is clamped, so every load stays in bounds,
 * and reported: the first such element of the launch writes its check's
 * code (position in kf_cg_kernel.checks + 1) to kf_err[0] and the index to
 * kf_err[1] (low 32 bits) and kf_err[2] (high 32 bits); the launcher reads
 * them after the run and fails it naming the node, as the reference does. */
typedef struct kf_cg_check {
    kf_id node;  /* the node whose index it is */
    int64_t dim; /* the dimension the index addresses */
} kf_cg_check;
#define KF_CG_ERR_INTS 4

typedef struct kf_cg_kernel {
    char *name;          /* entry point in the body ("kf_ew") */
    char *body;          /* the target-independent text, owned */
    kf_cg_param *ins;    /* parameters in order: ins, then outs */
    kf_cg_param *outs;
    uint32_t nins, nouts;
    int64_t numel;       /* work items worth launching (a multiple of block when block > 0) */
    uint32_t block;      /* preferred work-group size (a power of two, 32..256) of a
                          * reduction kernel (its rows per work-group are block / the
                          * segment size, codegen.c KF_CG_SEGMENT), 0 for a kernel with no
                          * work-group cooperation; the body is correct for ANY work-group
                          * size up to KF_MAX_BLOCK (CUDA: a multiple of 32) and any
                          * work-group count, so a launcher that ignores this field
                          * stays correct, only slower. EXCEPT
                          * the anchor kernels that cooperate (kf_gemm, kf_gemm_rows,
                          * kf_gemm_b2b, kf_conv_b2b): their body needs a work-group
                          * of exactly block (256) work-items, and the reductions that
                          * hold their rows in registers, whose body needs at least
                          * min_block */
    uint32_t min_block;  /* the least work-group the body is correct with: the row
                          * segment of a reduction holding its rows in registers
                          * (codegen.c KF_CG_ROW_CACHE), never above block; 0: any */
    kf_cg_check *checks; /* indices read from data that the body checks, in code order */
    uint32_t nchecks;    /* > 0: the kernel takes one more parameter after the outputs,
                          * kf_err, KF_CG_ERR_INTS zeroed ints (see kf_cg_check) */
    uint32_t parts;      /* KF_CG_PART_* bits: the optional prelude parts the body uses */
} kf_cg_kernel;

/* Optional parts of the prelude: text that only some kernels need, written
 * after the prelude by kf_cg_source when the kernel's `parts` asks for it,
 * so that the kernels which do not use it keep their text (and the kernel
 * caches keyed by it). */
enum {
    KF_CG_PART_F8 = 1u, /* float8 storage: KF_LOAD_F8, KF_STORE_F8, KF_ROUND_F8 and the
                         * formats KF_E4M3FN, KF_E4M3FNUZ, KF_E5M2, KF_E5M2FNUZ */
    KF_CG_PART_F4 = 2u, /* float4 storage: KF_LOAD_F4, KF_STORE_F4, KF_ROUND_F4 (KF_E2M1) */
    KF_CG_PART_F8MMA = 4u, /* float8 tile products KF_MMA_F8 (with KF_CG_PART_F8): tensor cores
                            * on CUDA sm_89+, the decoding twin elsewhere */
};

/* Why group gi of plan p (planned on model m) cannot be generated by this
 * slice, or NULL when kf_cg_group will succeed. The reason is written to
 * why (cut to whylen) and why is returned. Reasons name the node/value,
 * e.g. "node 'mm': back-to-back anchors (-> 'mm2') are not generated
 * yet". It runs the generator itself, so it is never wrong the other way:
 * a group for which this returns NULL generates a correct kernel. */
const char *kf_cg_unsupported(const kf_model *m, const kf_plan *p, uint32_t gi, char *why,
                              size_t whylen);

/* Generates the kernel of group gi. Deterministic: the same group (same
 * ops, attributes, shapes and dtypes) gives the same body, byte for byte;
 * node and value names do not reach the text, so equal groups share one.
 * On success *k owns its memory (kf_cg_kernel_release). Errors:
 * KF_ERR_UNSUPPORTED with kf_cg_unsupported's reason, KF_ERR_NOMEM. */
kf_status kf_cg_group(const kf_model *m, const kf_plan *p, uint32_t gi, kf_cg_kernel *k);
void kf_cg_kernel_release(kf_cg_kernel *k);

/* The prelude of a target, appended to s (static text built from one math
 * table, so both targets map the same names). */
void kf_cg_prelude(kf_cg_target t, kf_cg_str *s);

/* Self-contained source: prelude + the parts k->parts names + body. *text is the caller's (kf_free).
 * KF_ERR_NOMEM only. */
kf_status kf_cg_source(const kf_cg_kernel *k, kf_cg_target t, char **text);

/* ---- horizontal launches (cg_batch.c) ------------------------------------
 *
 * Independent small groups that the planner gave one launch index
 * (kf_group.launch) become ONE kernel whose work-groups are split by range:
 *
 *   work-group  0 ......... b0-1 | b0 ........ b1-1 | ... | b(n-2) ... total-1
 *               sub-kernel 0     | sub-kernel 1     | ... | sub-kernel n-1
 *
 * Each sub-kernel is its member's body, unchanged except that it reads
 * its own work-group id/count and global id/size (as if launched alone, so
 * grid-stride loops stay correct) and the batch's parameter names. The
 * branch is uniform per work-group, so barriers inside a member are legal.
 * Parameters are the union: a value two members read is passed once.
 * One work-group size for the launch: the largest preferred block among
 * members (reductions), else KF_CG_BATCH_BLOCK; members are only templates
 * whose body is correct for any work-group size (kf_ew, kf_reduce).
 * Work-groups per member: what it would get alone (elementwise: numel /
 * block rounded up; block reductions: one per row), at least 1; when the
 * sum passes the launch cap, each keeps 1 and the rest of the cap is
 * shared in proportion to the excess over 1, rounded down, with what the
 * rounding leaves to the member that asked most (grid-stride loops cover
 * the rest). */

/* Work-items one launch may have: the launchers cap a launch there
 * (KF_CL_MAX_GLOBAL on OpenCL; CUDA's cap, 4224 blocks of 256, is larger),
 * and a batched launch must get every work-group it counts on, or the last
 * members' ranges would never run. */
#define KF_CG_BATCH_MAX_ITEMS 65536
/* Work-group size of a batch of elementwise members: CUDA's launcher uses
 * 256 threads for them too (8 blocks per SM), a multiple of the warp. */
#define KF_CG_BATCH_BLOCK 256
/* Parameters of a batched kernel: the launchers pass at most this many
 * buffers (the same budget as one group's inputs plus outputs). */
#define KF_CG_BATCH_MAX_PARAMS (KF_PLAN_MAX_INPUTS + KF_PLAN_MAX_OUTPUTS)
/* Buffers one kernel may take. The planner caps what merging adds
 * (KF_PLAN_MAX_INPUTS/OUTPUTS), but a single node can read more (DenseNet's
 * Concat of 25 feature maps): a kernel parameter is one 8-byte pointer (the
 * shapes are compiled in), so 64 of them are 512 bytes, within CUDA's 4 KiB
 * and OpenCL's minimum CL_DEVICE_MAX_PARAMETER_SIZE of 1 KiB. A group with
 * more is declined with its reason. */
#define KF_CG_MAX_PARAMS 64

/* Parameters a batch of these member kernels would take (distinct input
 * values plus every output). Callers use it to cut batches to
 * KF_CG_BATCH_MAX_PARAMS before asking for the kernel. */
uint32_t kf_cg_batch_params(const kf_cg_kernel *members, uint32_t n);

/* One kernel running n (2..KF_PLAN_MAX_BATCH) already generated member
 * kernels side by side. The caller promises the members are independent
 * (no member reads what another writes, directly or through other groups):
 * the planner's launch index guarantees it (same level). Members are not
 * changed. Deterministic: the same members in the same order give the same
 * body, byte for byte. k->numel is exactly k->block times the work-groups
 * the body splits, and a launcher must launch exactly that (it is at most
 * KF_CG_BATCH_MAX_ITEMS, so no launcher caps it). On success *k owns its
 * memory (kf_cg_kernel_release). Errors: KF_ERR_UNSUPPORTED (a member that
 * needs its own launch, an input that is another member's output, more
 * than KF_CG_BATCH_MAX_PARAMS parameters, a bad n) with the reason: the
 * members then run as separate launches, which is always correct;
 * KF_ERR_NOMEM. */
kf_status kf_cg_batch_kernels(const kf_cg_kernel *members, uint32_t n, kf_cg_kernel *k);

/* The batched kernel of groups[0..n) of plan p: each must be an elementwise
 * or reduction group that kf_cg_group generates, and all must be at the
 * same level of the group DAG (no path between them). Errors: those of
 * kf_cg_group for a member, and those of kf_cg_batch_kernels. */
kf_status kf_cg_batch(const kf_model *m, const kf_plan *p, const uint32_t *groups, uint32_t n, kf_cg_kernel *k);

#endif
