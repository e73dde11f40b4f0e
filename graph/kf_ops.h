/*
 * kf_ops.h: the op table, the single source of truth per op. Each op is one
 * X-macro row in one of the graph/ops_*.def files:
 *
 *   KF_OP(SYM, ID, "OnnxName", "domain", in_min, in_max, out_min, out_max,
 *         ver_lo, ver_hi, FCLASS, FLAGS, shape_fn, eval_fn, cg_expr)
 *
 *   SYM      enum suffix: KF_OP_<SYM>
 *   ID       explicit number; never reused or shifted (it reaches cache keys
 *            and files). Ranges: 1-199 elementwise, 200-299 reductions and
 *            normalisation, 300-399 linear algebra, conv, pooling and
 *            quantisation, 400-499 shape and layout ops, 500-599 indexing,
 *            gather/scatter and resampling, 600-699
 *            control flow.
 *   domain   "" for the default ONNX domain
 *   in/out   arity bounds (counting absent optional slots); max -1 = variadic
 *   ver_*    opset versions of `domain` whose semantics the kernel implements
 *            (a model importing another version is skipped with that reason)
 *   FCLASS   fusion class, ordered as a lattice (see kf_fclass)
 *   FLAGS    KF_F_* algebraic facts the matcher and passes ask for
 *   shape_fn kf_shape_fn: output dtypes and shapes from input types
 *   eval_fn  kf_eval_fn: the reference kernel
 *   cg_expr  elementwise expression for codegen over operands x0, x1, ...
 *            (NULL where codegen uses a template instead)
 */
#ifndef KF_OPS_H
#define KF_OPS_H

#include "kf_ir.h"

typedef enum kf_fclass {
    KF_FC_ELEMWISE = 0,  /* out[i] = f(in[i]), same shape */
    KF_FC_BROADCAST = 1, /* elementwise with numpy broadcasting */
    KF_FC_INJECTIVE = 2, /* each output element reads one input element (transpose, slice) */
    KF_FC_REDUCTION = 3, /* many-to-one along axes */
    KF_FC_ANCHOR = 4,    /* GEMM/conv: fuses elementwise epilogues */
    KF_FC_OPAQUE = 5     /* never fused */
} kf_fclass;

enum {
    KF_F_COMMUTATIVE = 1 << 0, /* f(a,b) == f(b,a) */
    KF_F_ASSOCIATIVE = 1 << 1, /* f(f(a,b),c) == f(a,f(b,c)) */
    KF_F_IDEMPOTENT = 1 << 2,  /* f(f(x)) == f(x), or f(x,x) == x for binary ops */
    KF_F_SHAPE_FROM_DATA = 1 << 3, /* an output shape depends on input values */
    KF_F_READS_SUBSET = 1 << 4,    /* reads only the elements of input 0 its output
                                    * selects (Gather, Slice): cost models charge the
                                    * output's size, not the whole input */
    KF_F_COPIES = 1 << 5,          /* every output element is an element of input 0 (of
                                    * any input when variadic: Concat), moved or, for
                                    * Cast, converted: integers keep their values, so
                                    * kf_index_bound follows index values through it */
    KF_F_SUBGRAPHS = 1 << 6,       /* runs graph attributes (If, Loop, Scan): the
                                    * evaluator hands it the model and nesting depth
                                    * (kf_control_run), and the loader checks the bodies */
    KF_F_ROUNDS_STEPS = 1 << 7     /* on a 16-bit type rounds each step to it, as the
                                    * ONNX reference does (Attention: scaled query,
                                    * scores, biased scores, probabilities, result;
                                    * Softmax: its function body, max, difference,
                                    * exp, sum, quotient):
                                    * tolerances count it as KF_OP_STEP_ROUNDINGS layers */
};

/* Layers of rounding a KF_F_ROUNDS_STEPS node stands for. */
#define KF_OP_STEP_ROUNDINGS 5

/* Shape and dtype of every output from the inputs' types.
 *   in[i]   NULL when optional input i is absent
 *   val[i]  the input's data when known (constant, or while evaluating),
 *           else NULL; data-dependent ops read shapes from it
 *   out[j]  pre-set to unknown (dtype 0, rank -1); fill what can be known
 * Returns KF_OK, or an error naming the node when the inputs are
 * inconsistent. Unknown inputs give unknown outputs, never an error. */
typedef kf_status (*kf_shape_fn)(const kf_node *n, int nin, const kf_type *const *in,
                                 const kf_tensor *const *val, int nout, kf_type *out);

/* The reference kernel.
 *   in[i]   NULL when optional input i is absent
 *   out[j]  when the shape function determined a static shape, out[j] is
 *           already allocated with that dtype and shape (zero-filled) and
 *           the kernel only writes elements; otherwise out[j].data is NULL
 *           and the kernel allocates it with kf_tensor_alloc.
 * Returns KF_OK or an error (kf_fail) naming the node. */
typedef kf_status (*kf_eval_fn)(const kf_node *n, int nin, const kf_tensor *const *in,
                                int nout, kf_tensor *out);

typedef struct kf_op_info {
    const char *name;
    const char *domain;
    int in_min, in_max, out_min, out_max;
    int ver_lo, ver_hi;
    kf_fclass fclass;
    unsigned flags;
    kf_shape_fn shape;
    kf_eval_fn eval;
    const char *cg_expr;
} kf_op_info;

/* Declarations of every shape and eval function named in the tables. */
#define KF_OP(sym, id, name, dom, imin, imax, omin, omax, vlo, vhi, fc, fl, shp, ev, cg) \
    kf_status shp(const kf_node *, int, const kf_type *const *, const kf_tensor *const *, int, \
                  kf_type *);                                                            \
    kf_status ev(const kf_node *, int, const kf_tensor *const *, int, kf_tensor *);
#include "kf_ops_all.def"
#undef KF_OP

enum kf_op_id {
    KF_OP_UNKNOWN = 0,
#define KF_OP(sym, id, ...) KF_OP_##sym = id,
#include "kf_ops_all.def"
#undef KF_OP
    KF_OP_MAX_ = 1024
};

/* Table entry for op, or NULL for KF_OP_UNKNOWN / unused numbers. */
const kf_op_info *kf_op_get(kf_op op);
/* Op for (domain, op_type); "ai.onnx" and "" are the same domain.
 * Returns KF_OP_UNKNOWN when kfuse does not know it. */
kf_op kf_op_lookup(const char *domain, const char *op_type);

/* The op table entry of n when n is an instance kfuse implements: a known
 * op, at an opset version in the entry's range (or no version recorded),
 * with an input and output count the op allows and its required inputs
 * present. NULL otherwise: the loader carries such nodes (unknown ops, other
 * versions) without judgement, so stages that read a node's inputs by
 * position (planner, codegen) ask this, not kf_op_get, and treat the rest
 * as opaque. */
const kf_op_info *kf_node_op(const kf_node *n);

#endif
