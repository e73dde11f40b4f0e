/*
 * kf_ref.h: the reference evaluator: helpers shared by every reference
 * kernel and shape function (broadcasting, axes, index iteration, reading
 * shape-like inputs), and the driver that runs a whole graph on the CPU.
 * Kernels favour clarity over speed but never loop quadratically by accident.
 */
#ifndef KF_REF_H
#define KF_REF_H

#include "kf_ops.h"

/* ---- broadcasting ------------------------------------------------------ */

/* Numpy-style broadcast of nin shapes into out (rank = max rank). Unknown
 * dims (-1) stay unknown unless another operand fixes them (1 vs -1 gives
 * -1). Mismatch is KF_ERR_SHAPE naming node n. */
kf_status kf_broadcast_shapes(const kf_node *n, int nin, const kf_type *const *in, kf_type *out);

#define KF_BCAST_MAX_IN 8
/* Iterates the output of a broadcast op: for each output linear index it
 * gives the element offset into every input. */
typedef struct kf_bcast {
    int rank;
    int nin;
    int64_t dims[KF_MAX_RANK];
    int64_t numel;
    int64_t strides[KF_BCAST_MAX_IN][KF_MAX_RANK]; /* 0 on broadcast dims */
} kf_bcast;
/* Prepares iteration over inputs in[0..nin) (nin <= KF_BCAST_MAX_IN). */
kf_status kf_bcast_init(kf_bcast *b, const kf_node *n, int nin, const kf_tensor *const *in);
/* Offsets of output element `linear` in each input. */
void kf_bcast_offsets(const kf_bcast *b, int64_t linear, int64_t *offs);

/* ---- generic shape functions ------------------------------------------- */

/* out[0] = in[0] (dtype and shape); for unary elementwise ops. */
kf_status kf_shape_same(const kf_node *n, int nin, const kf_type *const *in,
                        const kf_tensor *const *val, int nout, kf_type *out);
/* out[0] = broadcast of all present inputs, dtype of in[0]. */
kf_status kf_shape_bcast(const kf_node *n, int nin, const kf_type *const *in,
                         const kf_tensor *const *val, int nout, kf_type *out);
/* Like kf_shape_bcast but the dtype is bool (comparisons, logic). */
kf_status kf_shape_bcast_bool(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out);
/* Leaves every output unknown; for ops whose shape needs their data. */
kf_status kf_shape_unknown(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out);

/* ---- small helpers ------------------------------------------------------ */

/* Normalises a possibly negative axis into [0, rank); KF_ERR_BAD_MODEL
 * naming the node when out of range. */
kf_status kf_norm_axis(const kf_node *n, int64_t axis, int rank, int *out);
/* Reads a 1-D (or scalar) integer tensor into a malloc'ed int64 array the
 * caller frees; *count gets its length. what names the input in errors. */
kf_status kf_read_ints(const kf_node *n, const kf_tensor *t, const char *what, int64_t **vals,
                       int64_t *count);
/* Multi-index <-> linear index for a row-major shape. */
void kf_unravel(int rank, const int64_t *dims, int64_t linear, int64_t *idx);
int64_t kf_ravel(int rank, const int64_t *strides, const int64_t *idx);
/* Checks that input i exists and has one of the listed dtypes (terminated
 * by KF_DT_UNDEFINED); KF_ERR_SHAPE naming node and input otherwise. */
kf_status kf_check_dtype(const kf_node *n, const kf_tensor *t, int i, ...);

/* Fails with code and "node 'NAME' (OP): <message>" (printf-style). */
kf_status kf_node_fail(const kf_node *n, kf_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Makes out a tensor of the given dtype and shape: allocates it, or checks
 * the one the evaluator pre-allocated from the shape function (a mismatch
 * is KF_ERR_INTERNAL naming the node: the shape function and the kernel
 * disagree). */
kf_status kf_output_prepare(const kf_node *n, kf_tensor *out, kf_dtype dt, int rank, const int64_t *dims);

/* ---- graph evaluation ---------------------------------------------------- */

/* Options of one evaluation. */
typedef struct kf_eval_opts {
    /* called after each node with its outputs; NULL for none */
    void (*on_node)(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs);
    void *user;
} kf_eval_opts;

/* Runs the model's graph on the reference evaluator.
 *   inputs[i]  tensors for the graph inputs that are not initializers, in
 *              file order (ninputs of them); a missing input whose value
 *              has an initializer uses the initializer
 *   outputs    receives m->graph->noutputs tensors (caller releases each)
 * Errors: KF_ERR_UNSUPPORTED for unknown ops or opset versions (naming
 * them), shape errors and run-time errors naming the node. */
kf_status kf_eval_model(const kf_model *m, const kf_tensor *inputs, int ninputs,
                        kf_tensor *outputs, const kf_eval_opts *opts);

/* Evaluates one node from input tensors (used by constant folding and
 * tests). Output tensors out[0..n->nout) are released and refilled. */
kf_status kf_eval_node(const kf_node *n, int nin, const kf_tensor *const *in, kf_tensor *out);

/* Function calls and control-flow bodies nested deeper than this are
 * refused: real models nest two or three levels (a layer calling an
 * activation, a Loop holding an If); a function that calls itself would
 * otherwise recurse until the stack runs out. */
#define KF_MAX_EVAL_DEPTH 32

/* Runs graph g (a control-flow body, see kf_body) of model m (NULL when
 * none is at hand: body nodes then cannot call model-local functions).
 * bound[i] is the tensor for g->inputs[i] (copied; NULL only where an
 * initializer supplies it); outputs receives g->noutputs tensors the caller
 * releases. depth counts the bodies and calls around g. */
kf_status kf_eval_graph(const kf_model *m, const kf_graph *g, const kf_tensor *const *bound, kf_tensor *outputs,
                        int depth);

/* The one value attribute of Constant node n (value, value_float, ...),
 * checked for its kind, in *out. Errors name the node: none or several set,
 * the wrong kind, sparse_value (unsupported). (ops_shape_gen.c) */
kf_status kf_constant_value_attr(const kf_node *n, const kf_attr **out);

/* ---- control flow (ops_control.c) ------------------------------------------ */

struct kf_body;
/* Runs If, Loop or Scan node n (of a graph of m, which may be NULL) from
 * its inputs (captured values included) into out[0..n->nout). Errors name
 * the node: a condition that is not one bool, bodies whose outputs do not
 * fit, scanned inputs of different lengths, a Loop past its iteration cap. */
kf_status kf_control_run(const kf_model *m, const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int depth);
/* Where the bodies of the If, Loop and Scan nodes a thread runs are run:
 * the evaluator (kf_eval_graph) unless a backend sets a runner for the
 * thread around such a node (kernels/exec.c runs each body as a compiled
 * plan of its own). fn gets the node, the body attribute, the decoded body
 * (struct kf_body: formal inputs, then the names read from around it),
 * its inputs bound as kf_eval_graph takes them, room for its outputs, and
 * the nesting depth; it runs the body once. Only the bodies of a node run
 * at depth 0 go through it (nested ones run wherever their body runs).
 * kf_set_body_runner returns the runner it replaces through prev/prev_ctx,
 * to be put back. */
typedef kf_status (*kf_body_run_fn)(void *ctx, const kf_node *n, const char *attr, const struct kf_body *b,
                                    const kf_tensor *const *bound, kf_tensor *outputs, int depth);
void kf_set_body_runner(kf_body_run_fn fn, void *ctx, kf_body_run_fn *prev, void **prev_ctx);
/* Names of the graph attributes node n runs (NULL-terminated; empty for
 * other ops). */
const char *const *kf_control_bodies(const kf_node *n);
/* KF_ERR_BAD_MODEL naming the node when body `attr` with bnin formal
 * inputs and bnout outputs does not fit node n (and its attributes). */
kf_status kf_control_check_body(const kf_node *n, const char *attr, int bnin, int bnout);
/* Decodes and checks body `attr` of n (node versions from m's imports, or
 * n's own opset when m is NULL); the caller releases *b. */
kf_status kf_control_body(const kf_model *m, const kf_node *n, const char *attr, struct kf_body *b);

/* Graph inputs that need data from the caller (not initializers), in order;
 * *ids malloc'ed. */
kf_status kf_graph_real_inputs(const kf_graph *g, kf_id **ids, uint32_t *count);

/* The exclusive upper bound that keeps value v's elements valid indices
 * wherever they reach one: the smallest known size of a dimension that v
 * indexes in a Gather, GatherElements or GatherND, directly or through ops
 * that copy elements (KF_F_COPIES: Cast, Unsqueeze, Reshape, Concat, ...).
 * 0 when v reaches no index of known size (or out of memory): then nothing
 * bounds it, as far as the graph says. Random test inputs use it (token
 * type ids index a 2-row table). */
int64_t kf_index_bound(const kf_graph *g, kf_id v);

/* Why the model cannot be evaluated (unknown op, unsupported opset), or
 * NULL when every node is supported. Static or thread-local storage. */
const char *kf_eval_unsupported_reason(const kf_model *m);

/* ---- shape inference ------------------------------------------------------ */

/* Largest constant (in elements) that shape inference computes on the way,
 * so shape subgraphs (Shape -> Gather -> Concat -> Reshape) resolve without
 * inference ever doing real work. */
#define KF_INFER_CONST_MAX 4096

/* Infers dtype and shape of every value from the graph inputs, initializers
 * and each op's shape function, keeping symbolic dims by name. Operands
 * that do not fit an op (Add of [3] and [4]) are KF_ERR_SHAPE naming the
 * node. Declared types in the file are checked against what is inferred: a
 * different dtype is KF_ERR_SHAPE; a different shape is counted in
 * m->shape_warnings and the inferred shape wins (as ONNX Runtime does).
 * Unknown ops leave their outputs as declared. Values' types are updated
 * in place. */
kf_status kf_infer_shapes(kf_model *m);

/* Infers the output types of one node (e.g. one a rewrite just created)
 * from its inputs' current types and constant values. */
kf_status kf_infer_node(kf_model *m, kf_id node);

#endif
