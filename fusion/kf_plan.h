/*
 * kf_plan.h: the fusion planner's result. Every live node of a model belongs
 * to exactly one kernel group; groups are what codegen turns into kernels.
 * Every edge between two groups carries the reason they were not merged
 * (the same static string the legality function returned), so the report,
 * the trace and the negative tests all read one source.
 */
#ifndef KF_PLAN_H
#define KF_PLAN_H

#include <stdio.h>

#include "kf_ref.h"

typedef enum kf_group_kind {
    KF_GROUP_ELEMWISE = 0,  /* elementwise/broadcast/injective chain */
    KF_GROUP_REDUCTION = 1, /* a reduction with fused prologue/epilogue */
    KF_GROUP_ANCHOR = 2,    /* GEMM/conv with a fused epilogue */
    KF_GROUP_OPAQUE = 3,    /* one node that is never fused */
    KF_GROUP_CONST = 4      /* nothing to launch (Constant, Shape of static dims...) */
} kf_group_kind;

typedef struct kf_group {
    kf_group_kind kind;
    kf_id *nodes;       /* in topological order */
    uint32_t nnodes;
    kf_id *inputs;      /* values read from outside the group, first-use order */
    uint32_t ninputs;
    kf_id *outputs;     /* values the group writes that are read outside it or are graph outputs */
    uint32_t noutputs;
    kf_id anchor;       /* the anchor/reduction node, 0 if none; in an anchor
                         * group the first (upstream) anchor */
    kf_id anchor2;      /* back-to-back: the second anchor, which reads the
                         * first one's output rows as its left operand from
                         * on chip; 0 if none (see KF_PLAN_ONCHIP_BYTES) */
    kf_id reduction;    /* anchor groups: the row reduction (LayerNorm,
                         * Softmax, ReduceX over the last axis) fused after an
                         * anchor, whose rows are that anchor's output rows;
                         * 0 if none */
    bool view;          /* metadata only: every node is a pure reshape
                         * (Reshape/Flatten/Squeeze/Unsqueeze) of a dense
                         * tensor, so the output is the input's buffer under a
                         * new shape. No kernel: launch is UINT32_MAX and the
                         * modeled bytes are 0. A runtime may alias the buffer
                         * or copy it; both are correct. Never set in a
                         * disabled plan (the one-kernel-per-node baseline). */
    uint32_t launch;    /* launch index: horizontally batched groups share one */
    int64_t bytes_read, bytes_written; /* modeled DRAM traffic; -1 if shapes unknown */
    int64_t flops;      /* modeled; -1 if shapes unknown */
    uint32_t level;     /* longest path from a graph input in the group DAG */
    /* the cost model's estimate on the plan's target (kf_cost.h); est_us
     * is -1 when the plan has no target */
    double est_us;      /* time of the group's kernel(s), launch included */
    int64_t est_blocks; /* grid of its kernel form */
    const char *est_form;  /* kernel form ("ew", "reduce", "lib_gemm", "gemm_b2b", ...) */
    const char *est_bound; /* what limits it ("memory", "compute", "latency", "launch") */
    double est_epilogue_us; /* a library form's generated epilogue kernel, part of est_us */
    double est_lib_us;  /* > 0: the library could run this group, but its generated kernel is
                         * estimated faster (est_us against this); the runtime then generates it */
} kf_group;

/* Why two adjacent groups were not merged: value `value` flows from a node
 * of group `from` to a node of group `to`. */
typedef struct kf_boundary {
    uint32_t from, to;
    kf_id value;
    const char *reason; /* static string from the legality function */
} kf_boundary;

typedef struct kf_plan {
    kf_group *groups;
    uint32_t ngroups;
    uint32_t *group_of;   /* node id -> group index; UINT32_MAX for dead nodes */
    kf_boundary *bounds;
    uint32_t nbounds;
    uint32_t launches;    /* kernel launches after horizontal batching */
    int64_t bytes_unfused;  /* modeled bytes with one kernel per node */
    int64_t bytes_fused;    /* modeled bytes of the plan */
    int64_t bytes_lower_bound; /* every weight, input and output touched once */
    uint32_t nodes;       /* live nodes planned */
    uint32_t merges;      /* vertical + horizontal merges done (what fuel counts) */
    char target[32];      /* the cost model's device profile ("" when none) */
    double est_us;        /* estimated time of one run: the groups' estimates, one
                           * launch per batched launch; -1 without a target */
    uint32_t cost_refusals; /* legal merges the cost model refused */
    uint32_t est_unsized;   /* launched groups whose sizes are symbolic: the cost model priced them at the
                             * launch floor, so est_us is no time of any run and no merge between
                             * them was refused as slower (plan at sizes: kf_plan_build_at) */
    struct kf_plan_state *state; /* private: what kf_plan_merge_reason asks */
} kf_plan;

/* ---- limits (each says why it has its value) ------------------------- */

/* Values a group reads from outside. A CUDA kernel's parameters are capped
 * at 4 KiB; each input costs a pointer plus broadcast strides (8 dims x
 * 8 bytes x 2), about 136 bytes, so 16 inputs plus 8 outputs stay near
 * 3.3 KiB with room for scalars. */
#define KF_PLAN_MAX_INPUTS 16
/* Values a group writes (read outside or graph outputs); same budget. */
#define KF_PLAN_MAX_OUTPUTS 8
/* Estimated registers per thread: 255 is the CUDA hardware maximum; past it
 * the compiler spills to local memory, which is DRAM traffic again. */
#define KF_PLAN_MAX_REGS 255
/* Nodes a cycle check may visit before refusing the merge: keeps one check
 * bounded (planning stays near linear) at the price of rare missed merges. */
#define KF_PLAN_CYCLE_BUDGET 4096
/* A group moving at most this many bytes is "small" and may share a launch
 * with independent groups at the same depth: a launch costs about 4 us, in
 * which an H100-class GPU moves several MB, so below 1 MiB a kernel is
 * dominated by its launch. */
#define KF_PLAN_SMALL_BYTES ((int64_t)1 << 20)
/* Groups batched into one launch: sub-kernels are chosen by block range
 * with a switch; 8 bodies keep the batched kernel text small. */
#define KF_PLAN_MAX_BATCH 8

/* Back-to-back and row-reduction epilogues keep a whole output row tile of
 * an anchor on chip: at least KF_PLAN_ROW_TILE_M rows of N elements (N =
 * the anchor's output row: a GEMM's N, a conv's output channels) in at most
 * KF_PLAN_ONCHIP_BYTES of shared memory.
 * 96 KiB is the shared memory every CUDA GPU since Volta (sm_70) can give one
 * block (A100 gives 164 KiB, H100 228 KiB, so the rest stays free for operand
 * staging there); 16 rows is the height of one tensor-core MMA fragment
 * (m16), the smallest tile that keeps the tensor cores busy. So fp32 rows up
 * to 1536 elements fit (BERT-base's 768 do, its FFN's 3072 do not). */
#define KF_PLAN_ONCHIP_BYTES ((int64_t)96 * 1024)
#define KF_PLAN_ROW_TILE_M 16

/* ---- the planner ------------------------------------------------------- */

typedef struct kf_plan_options {
    bool disable;  /* every node its own group, no batching (KFUSE_DISABLE_FUSION=1) */
    int64_t fuel;  /* merges allowed; < 0 unlimited (KFUSE_FUEL=N) */
    bool trace;    /* each merge and refusal to stderr (KFUSE_TRACE contains "fusion") */
    /* The device the plan is for (kf_target_get: "h200", "h100", "a100",
     * "test" or a .target file; KFUSE_TARGET). NULL or "none": no cost
     * model, every legal merge is made (largest values first) and no
     * estimate is given. */
    const char *target;
    int math;      /* kf_cost_math: library math for float32 (strict or TF32) */
    /* With a target: false (default) merges only when the estimated time
     * does not go up; true makes every legal merge, as without a target,
     * and only estimates (what a bytes-only planner would have run). */
    bool legal_only;
    /* The device runs no vendor library (OpenCL, unless the library's host
     * model stands in): every anchor is generated, so an anchor group
     * takes only the epilogues a generated anchor has, even where the
     * target's library path would take more. */
    bool no_library;
} kf_plan_options;

/* Defaults from the environment: KFUSE_DISABLE_FUSION, KFUSE_FUEL,
 * KFUSE_TRACE, KFUSE_TARGET (a pointer into the environment). */
void kf_plan_options_default(kf_plan_options *o);

/* The target the runtime and CLI plan for when KFUSE_TARGET is unset. */
#define KF_PLAN_DEFAULT_TARGET "h200"

/* Plans fusion for m: runs kf_infer_shapes (its error is returned), then
 * assigns every live node to exactly one group. On success *out is owned
 * by the caller (kf_plan_free). The model is not changed beyond inferred
 * types, and must outlive the plan (kf_plan_merge_reason reads it).
 * Groups are listed in a topological order of the group graph (producer
 * groups first); each group's nodes are in topological order. Errors:
 * shape errors from inference, KF_ERR_NOMEM, KF_ERR_BAD_MODEL (a cycle). */
kf_status kf_plan_build(kf_model *m, const kf_plan_options *o, kf_plan **out);

/* kf_plan_build with the symbolic dims names[i] sized values[i] while
 * planning: legality and the cost model's merge decisions see those sizes
 * (a symbolic model otherwise gets no cost refusals, as nothing can be
 * sized), then every value's type is put back, so the model keeps its
 * symbolic dims. The plan's figures are for those sizes; its groups are
 * legal at them (a runtime plans again per concrete shape). A name the
 * model lacks is ignored. Errors as kf_plan_build, KF_ERR_INVALID_ARG for
 * a negative size. */
kf_status kf_plan_build_at(kf_model *m, const kf_plan_options *o, const char *const *names, const int64_t *values,
                           int n, kf_plan **out);

/* The ONE fusion decision function. Would merging groups a and b of plan
 * p (vertical: a produces a value b reads; horizontal: a and b read one
 * same input side by side) be refused? Returns NULL when the planner would
 * merge them, else a static reason string (one of KF_REASON_* below): a
 * legality reason, or with a target the cost model's (KF_REASON_COST_*).
 * The planner calls the same code on its working state, so a boundary's
 * reason is exactly what this returns for its two groups. Cost: bounded by
 * KF_PLAN_CYCLE_BUDGET. */
const char *kf_plan_merge_reason(const kf_plan *p, uint32_t a, uint32_t b, bool horizontal);

/* Is n a view: data movement that keeps every element (Reshape, Flatten,
 * Squeeze, Unsqueeze, Identity, Transpose)? What a reduction kernel may
 * write after its rows (codegen.c view_chain; the planner's
 * row_epilogue_reason). */
bool kf_plan_is_view(const kf_node *n);

/* Is n a pure reshape: the same elements in the same order, only the
 * shape changes (Reshape, Flatten, Squeeze, Unsqueeze)? */
bool kf_plan_is_reshape(const kf_node *n);

/* Is reduction r one a generated anchor computes over its output rows
 * (Softmax, LogSoftmax, LayerNormalization, RMSNormalization: codegen's
 * row epilogues, and what the planner lets follow a generated anchor)? */
bool kf_plan_row_epilogue(const kf_node *r);

/* Frees a plan (NULL is fine). */
void kf_plan_free(kf_plan *p);

/* Prints a one-line-per-group summary (for tests and debugging). */
void kf_plan_print(const kf_model *m, const kf_plan *p, FILE *f);

/* ---- reasons (the exact strings; tests compare against them) -----------
 *
 * CYCLE            a path leaves one group and re-enters the other through
 *                  a third group: the merged kernel would run before and
 *                  after it.
 * CYCLE_BUDGET     that search visited KF_PLAN_CYCLE_BUDGET edges without an
 *                  answer; refused to stay safe and near linear.
 * PRODUCER_/CONSUMER_OPAQUE  ops without a fusable class (unknown ops,
 *                  control flow, NonZero, CumSum, pooling...) run alone.
 * PRODUCER_CONST   Constant, Shape of static dims, and small all-constant
 *                  ops: known before anything runs, no kernel (launch
 *                  UINT32_MAX); their outputs are read like weights.
 * TWO_REDUCTIONS, TWO_ANCHORS, ANCHOR_REDUCTION  the lattice rule: a group
 *                  holds one "master" (reduction or anchor) with
 *                  elementwise/broadcast/injective ops around it, except the
 *                  anchor group shapes below; anything else with two masters
 *                  gets these reasons (two reductions always; two anchors
 *                  that are siblings or three anchors; a reduction beside an
 *                  anchor rather than after it).
 * Anchor group shapes (what a kernel can do with a tiled GEMM/conv):
 *   prologue       elementwise/broadcast ops and layout ops (Reshape,
 *                  Flatten, Squeeze, Unsqueeze, Transpose, Split, and
 *                  Gather of one scalar index: a select) on an operand,
 *                  applied as the tile is loaded (a load index map plus a
 *                  per-element function);
 *   epilogue       elementwise/broadcast ops on the output (bias,
 *                  activation, residual, scale) and the same layout ops,
 *                  applied as the tile is stored (a store index map: e.g.
 *                  QKV written per head); after a select (Split, Gather
 *                  of one index) each slice is an iteration space of its
 *                  own, so elementwise ops on one slice join too (a merged
 *                  Q/K/V product's per-head QuantizeLinear);
 *   row reduction  after the anchor and its epilogue, one row reduction
 *                  (LayerNorm, RMSNorm, Softmax, LogSoftmax) whose rows are
 *                  the anchor's output rows, then its own epilogue: the
 *                  block holds whole output rows (GEMM + LayerNorm, QK^T +
 *                  scale + mask + Softmax); with the target's vendor
 *                  library (and a device that has it) also any ReduceX over
 *                  the last axis, which the epilogue kernel after the
 *                  library call computes;
 *   back-to-back   anchor -> epilogue [-> row reduction -> epilogue] ->
 *                  anchor, the second reading the first's output rows as its
 *                  left operand (its K = the first's N) from on chip:
 *                  CUTLASS's back-to-back GEMM / 3x3-conv -> 1x1-conv, and
 *                  FlashAttention's QK^T -> softmax -> xV with whole rows.
 *                  The second is a MatMul/Gemm (no transA) after a GEMM, or
 *                  a 1x1 stride-1 unpadded ungrouped Conv after a Conv.
 * ANCHOR_PROLOGUE  something other than elementwise/layout ops feeds an
 *                  anchor operand (a reduction with no anchor before it: its
 *                  rows would be recomputed per output tile).
 * PROLOGUE_SHARED  a prologue value is also read outside the group: the
 *                  anchor recomputes it per tile load, it has no single
 *                  place to be written from.
 * ANCHOR_INJECTIVE data movement next to an anchor other than the layout
 *                  ops above (Slice, Gather of an index tensor, Concat, Pad,
 *                  Expand, Tile...): not an index map a tile load/store
 *                  can apply.
 * RED_AXIS         a reduction after an anchor that is not over the last
 *                  axis, or whose rows are not the anchor's output rows
 *                  (a layout op or broadcast changed them).
 * EPI_PARTS        where the anchor is generated (no vendor library), an
 *                  epilogue op reading two parts of the anchor's output:
 *                  two slices of a select (SwiGLU's gate and up halves of
 *                  one product) or the output and a transposed copy; the
 *                  kernel holds one element of the output at a time.
 * RED_KIND         a ReduceX after an anchor where the anchor is generated
 *                  (no vendor library): the generated row epilogues are
 *                  Softmax, LogSoftmax, LayerNormalization, RMSNormalization.
 * ROW_CAP          the anchor's output row is too long to hold
 *                  KF_PLAN_ROW_TILE_M rows in KF_PLAN_ONCHIP_BYTES (not
 *                  asked of attention: a MatMul -> Softmax whose output is
 *                  the left operand of a MatMul, head dims <= 128, streams
 *                  its keys through codegen/cg_attention.c instead).
 * B2B_OPERAND      two chained anchors, but the second does not read the
 *                  first's rows as its left operand only, or is not a GEMM
 *                  after a GEMM / a 1x1 conv after a conv.
 * B2B_CAP          the same cap as ROW_CAP, for the first anchor's rows that
 *                  the second anchor reads from on chip (attention as above
 *                  excepted).
 * INPUTS, OUTPUTS, REGS  resource caps (see the limits above); the register
 *                  estimate is 16 + 2 per input/output + 1 per elementwise
 *                  op, 16 per reduction, 96 per anchor.
 * SHAPES_RED       an elementwise part next to a reduction must iterate over
 *                  the reduction's input or output; with unknown dims that
 *                  cannot be shown.
 * SHAPES           the same for two elementwise/anchor groups.
 * SPACE            the element counts provably differ (a broadcast into a
 *                  larger space would recompute the producer per element).
 *                  One exception: a small elementwise producer (at most
 *                  4 ops: plan.c, PL_BCAST_MAX_NODES) whose every output is
 *                  read only by the consumer, by elementwise ops through a
 *                  broadcast into its space (a mask's Cast and Reshape) or
 *                  by a Concat (rotary embedding's rotate-half), joins it;
 *                  the kernel walks the consumer's space and recomputes the
 *                  producer at the index each reader maps.
 * H_NO_SHARED      horizontal merging pays only when one input is read once
 *                  (a shared plan-time constant does not count).
 * H_KIND           horizontal merging joins elementwise/injective groups only
 *                  (sibling GEMMs sharing an input are concatenated by kfuse
 *                  opt's horizontal-merge pass before planning).
 * COST_*           legal, but the cost model estimates the merged kernel
 *                  slower than the two apart on the plan's target:
 *                  BLOCKS when the merged kernel's grid leaves SMs idle
 *                  that the two apart kept busy (a back-to-back GEMM on
 *                  16 blocks of 132 SMs), REREAD when every block of a
 *                  back-to-back kernel re-reads the second anchor's
 *                  weights, LIBRARY when it takes the anchor off a vendor
 *                  library call (a prologue or second anchor forces a
 *                  generated kernel), SLOWER otherwise.
 * DISABLED, FUEL, ROUNDS  not legality: the planner was told to stop
 *                  (KFUSE_DISABLE_FUSION, KFUSE_FUEL) or hit its round cap
 *                  (a safety net; real graphs settle in 2-3 rounds).
 *
 * No "graph output would be swallowed" reason is needed: a value that is a
 * graph output is always among its group's outputs (written to memory),
 * wherever it is produced.
 */
#define KF_REASON_CYCLE "would create a cycle through a node outside the group"
#define KF_REASON_CYCLE_BUDGET "cycle check exceeded its search budget"
#define KF_REASON_PRODUCER_OPAQUE "producer is an opaque op"
#define KF_REASON_CONSUMER_OPAQUE "consumer is an opaque op"
#define KF_REASON_PRODUCER_CONST "producer is a plan-time constant (no kernel)"
#define KF_REASON_TWO_REDUCTIONS "two reductions in one group"
#define KF_REASON_TWO_ANCHORS "two anchors in one group"
#define KF_REASON_ANCHOR_REDUCTION "an anchor and a reduction in one group"
#define KF_REASON_ANCHOR_PROLOGUE "anchor prologues are elementwise or layout ops only"
#define KF_REASON_PROLOGUE_SHARED "anchor prologue value is also read outside the group"
#define KF_REASON_ANCHOR_INJECTIVE "anchor data movement is reshape/transpose/split/select only (load/store index maps)"
#define KF_REASON_RED_AXIS "reduction after an anchor is not over the anchor's output rows"
#define KF_REASON_EPI_PARTS "an epilogue op would combine two parts of the anchor's output (two slices, or a transposed copy)"
#define KF_REASON_RED_KIND "reduction after an anchor is not a row epilogue (Softmax, LogSoftmax, LayerNormalization, RMSNormalization)"
#define KF_REASON_ROW_CAP "row too long for an anchor+reduction epilogue (on-chip row tile cap)"
#define KF_REASON_B2B_OPERAND "back-to-back anchors: the second must read only the first's rows, as its left operand"
#define KF_REASON_B2B_CAP "back-to-back anchors: the first anchor's output row is too long to stay on chip"
#define KF_REASON_INPUTS "group would exceed 16 inputs"
#define KF_REASON_OUTPUTS "group would exceed 8 outputs"
#define KF_REASON_REGS "estimated registers exceed the cap"
#define KF_REASON_SHAPES_RED "shapes unknown: cannot prove the elementwise op matches the reduction's iteration space"
#define KF_REASON_SHAPES "shapes unknown: cannot prove the iteration spaces match"
#define KF_REASON_SPACE "different iteration spaces"
#define KF_REASON_H_NO_SHARED "horizontal: siblings do not read the same input"
#define KF_REASON_H_KIND "horizontal: only elementwise/injective groups merge side by side"
#define KF_REASON_COST_BLOCKS "estimated slower: the merged kernel has too few blocks to fill the SMs"
#define KF_REASON_COST_REREAD "estimated slower: every block re-reads the second anchor's weights"
#define KF_REASON_COST_LIBRARY "estimated slower: the anchor would leave the vendor library for a generated kernel"
#define KF_REASON_COST_SLOWER "estimated slower merged than apart"
#define KF_REASON_DISABLED "fusion disabled (KFUSE_DISABLE_FUSION=1)"
#define KF_REASON_FUEL "fuel exhausted (KFUSE_FUEL)"
#define KF_REASON_ROUNDS "planner round limit reached"

#endif
