/*
 * kf_ir.h: the graph IR. One kf_graph owns its values (tensors) and nodes,
 * stored in growable arrays and named by dense 32-bit ids; id 0 means "none".
 * Every value keeps its use list, so "who consumes this" is O(1). Analyses
 * are plain arrays indexed by id.
 */
#ifndef KF_IR_H
#define KF_IR_H

#include "kf_tensor.h"

typedef uint32_t kf_id;

/* Attribute kinds; numbers equal ONNX AttributeProto.AttributeType. */
typedef enum kf_attr_type {
    KF_ATTR_UNDEFINED = 0,
    KF_ATTR_FLOAT = 1,
    KF_ATTR_INT = 2,
    KF_ATTR_STRING = 3,
    KF_ATTR_TENSOR = 4,
    KF_ATTR_GRAPH = 5,
    KF_ATTR_FLOATS = 6,
    KF_ATTR_INTS = 7,
    KF_ATTR_STRINGS = 8,
    KF_ATTR_TENSORS = 9,
    KF_ATTR_GRAPHS = 10,
    KF_ATTR_SPARSE_TENSOR = 11,
    KF_ATTR_SPARSE_TENSORS = 12,
    KF_ATTR_TYPE_PROTO = 13,
    KF_ATTR_TYPE_PROTOS = 14
} kf_attr_type;

typedef struct kf_attr {
    char *name;
    kf_attr_type type;
    int64_t i;
    float f;
    kf_bytes s;
    int64_t *ints;    /* KF_ATTR_INTS */
    float *floats;    /* KF_ATTR_FLOATS */
    kf_bytes *strings; /* KF_ATTR_STRINGS */
    int n;            /* element count of ints/floats/strings */
    kf_tensor *t;     /* KF_ATTR_TENSOR */
    char *ref_attr_name; /* inside functions: refers to a caller attribute */
    char *doc;
    /* Kinds kfuse does not interpret (graphs, sparse tensors, type protos,
     * tensor lists) are kept as the packed AttributeProto and written back
     * byte for byte. */
    uint8_t *packed;
    size_t packed_len;
} kf_attr;

/* Sub-kinds of opaque ops live in the op table; KF_OP_UNKNOWN is 0. */
typedef int kf_op;

typedef struct kf_node {
    char *name;
    char *op_type;
    char *domain; /* "" for the default ONNX domain */
    char *doc;
    kf_op op;     /* op table entry, 0 when kfuse does not know it (opaque) */
    int64_t opset; /* version of `domain` the model imports */
    kf_id *in;    /* value ids; 0 = absent optional input */
    int nin;
    /* upos[i] (i < nupos): where this node's use of in[i] sits in that
     * value's use list, so dropping the use is O(1) however many users the
     * value has. Only a hint, checked before use (ir_edit.c, drop_user):
     * slots added by growing in[] by hand have none, and a stale hint costs
     * one scan, never a wrong list. */
    uint32_t *upos;
    int nupos;
    /* Values of the enclosing graph that the node's subgraph attributes (If
     * branches, Loop and Scan bodies, at any nesting depth) read by name.
     * They are the last ncap entries of in[], so use lists, topological
     * order, DCE, CSE, liveness and fusion boundaries count them like any
     * input; they are not ONNX inputs: export writes in[0..nin-ncap) and
     * the bodies keep naming them. capname[k] is the name the bodies use for
     * in[nin-ncap+k]; when a rewrite redirects the slot to another value,
     * export renames the bodies' references to that value's name. */
    int ncap;
    char **capname;
    kf_id *out;   /* value ids; 0 = absent optional output */
    int nout;
    kf_attr *attrs;
    int nattrs;
    bool dead;    /* removed; slot kept so ids stay stable */
} kf_node;

typedef struct kf_value {
    char *name;
    char *doc;
    kf_type type;
    kf_tensor *init;  /* initializer / constant data, owned; NULL otherwise */
    kf_id producer;   /* producing node, 0 for inputs and initializers */
    kf_id *users;     /* consuming nodes, once per input slot */
    uint32_t nusers, capusers;
    bool is_input;    /* listed in graph.input */
    bool is_output;   /* listed in graph.output */
    bool has_info;    /* appeared in value_info (keep it on export) */
    bool has_type;    /* the file declared a type for it */
    /* the file declared it a sequence, optional, map or sparse tensor (this
     * word, a static string), kinds kfuse has no type for; NULL otherwise */
    const char *other_kind;
    /* what shape inference knows of the contents of a small integer value
     * that is not a constant (Shape's output and what is computed from it;
     * kf_sym.h), owned; NULL when nothing symbolic is known */
    struct kf_symvec *symval;
    /* changes pending in kf_graph.touched (KF_TOUCH_*), 0 when listed none */
    uint8_t touch;
    /* listed in kf_graph.inferq */
    bool infer_queued;
    /* init's bytes are region [ext_offset, + size) of the model's external
     * data file ext_file (1-based in kf_model.ext), mapped, not copied;
     * 0 otherwise. Only the loader sets it; a pass that changes the data
     * replaces the tensor (or its data pointer), which ends the tie. */
    uint32_t ext_file;
    int64_t ext_offset;
} kf_value;

typedef struct kf_graph {
    kf_value *values; /* [0] unused */
    uint32_t nvalues, capvalues;
    kf_node *nodes;   /* [0] unused */
    uint32_t nnodes, capnodes;
    kf_id *inputs, *outputs; /* in file order */
    uint32_t ninputs, noutputs, capinputs, capoutputs;
    char **syms;      /* symbolic dim names; [0] unused */
    uint32_t nsyms, capsyms;
    /* symx[i]: the expression symbol i stands for (kf_sym.h), NULL for a
     * name of the file; entries past nsymx are NULL */
    struct kf_symexpr **symx;
    uint32_t nsymx, capsymx;
    /* an expression could not be interned for lack of memory (the dim it
     * would have named became unknown); kf_sym_take_nomem reports it */
    bool sym_nomem;
    /* answers of the dim arithmetic on symbols (symdim.c), made on first use */
    struct kf_sdim_memo *sdim_memo;
    char *name;
    char *doc;
    /* name -> value id hash (open addressing), rebuilt as values grow */
    kf_id *hash;
    uint32_t hashcap;
    /* Edit tracking for an incremental rewrite driver (kf_graph_track): the
     * values an edit touched since the list was last drained; touch_all
     * when the list cannot say (it could not grow, or a whole-graph change
     * such as an opset raise). */
    bool track;
    bool touch_all;
    /* whole-graph inference's work arrays, kept between its calls while
     * tracking is on (an optimizer run infers every round); shape.c */
    struct kf_infer_scratch *infer_scratch;
    /* > 0: a merge of weights this large or larger may defer its copy
     * (kf_opt_options.defer_concat_bytes, set for the optimizer's run) */
    int64_t defer_concat_bytes;
    kf_id *touched;
    uint32_t ntouched, captouched;
    /* kf_graph_fresh_value: per base name that was taken, the last number
     * it appended (names are never given back, so every smaller one is
     * taken too); open addressing */
    struct kf_fresh_slot *fresh;
    uint32_t nfresh, capfresh;
    /* The values an edit touched since whole-graph inference last ran
     * (kept apart from touched, which the rewrite driver drains, and
     * recorded under touch_all too): while tracking, inference looks again
     * only downstream of these. inferq_lost when the list could not grow. */
    kf_id *inferq;
    uint32_t ninferq, capinferq;
    bool inferq_lost;
    /* debugging: each incremental inference is checked against a whole
     * one (kf_opt_options.check_inference) */
    bool infer_check;
    /* a control-flow body being rewritten: the graph around it, whose names
     * fresh names must avoid too (ONNX names are unique across scopes);
     * not owned, NULL otherwise */
    const struct kf_graph *outer;
} kf_graph;

typedef struct kf_extfile kf_extfile; /* graph/kf_extdata.h */

typedef struct kf_opset {
    char *domain;
    int64_t version;
} kf_opset;

/* A model-local ONNX function (FunctionProto). Its body is a graph of its
 * own: body->inputs and body->outputs are the formal parameters in order
 * (names are local to the body), body nodes may refer to the caller's
 * attributes through kf_attr.ref_attr_name, and the body has no
 * initializers (ONNX functions cannot hold any; constants are Constant nodes
 * or inputs). A node whose (domain, op_type) equals (domain, name) calls it. */
typedef struct kf_function {
    char *name;
    char *domain;
    char **attrs;      /* attribute parameter names */
    int nattrs;
    kf_opset *opsets;  /* the function's own opset imports */
    int nopsets;
    kf_graph *body;
    char *doc;
    /* the FunctionProto it was read from (inside kf_model.proto), NULL for
     * functions kfuse created: fields the IR does not model (newer fields
     * kept by protobuf-c as unknown fields) are written back from it */
    const void *proto;
} kf_function;

struct kf_model {
    kf_graph *graph;
    kf_opset *opsets;
    int nopsets;
    int64_t ir_version;
    char *dir;    /* folder external data is resolved in; may be NULL */
    void *proto;  /* the unpacked Onnx__ModelProto the model came from:
                   * fields kfuse does not model are written back from it */
    void *proto_arena; /* what proto's small pieces were cut from (onnx.c); NULL: the heap */
    /* declared shapes that disagreed with what the graph computes (the
     * computed one wins, as in ONNX Runtime); the first is described */
    uint32_t shape_warnings;
    char shape_warning[256];
    /* declarations the loader read leniently (a negative dim_value, which
     * some exporters write for a dynamic axis, is an unnamed symbolic dim);
     * the first is described */
    uint32_t load_warnings;
    char load_warning[256];
    kf_function **funcs; /* model-local functions, file order; owned */
    int nfuncs;
    kf_extfile *ext;     /* mapped external data files (kf_extdata.h); owned */
    int next;
};

/* ---- graph construction ---------------------------------------------- */

/* New empty graph / free everything it owns. NULL on out of memory. */
kf_graph *kf_graph_new(void);
void kf_graph_free(kf_graph *g);

static inline kf_node *kf_node_at(const kf_graph *g, kf_id id) { return &g->nodes[id]; }
static inline kf_value *kf_value_at(const kf_graph *g, kf_id id) { return &g->values[id]; }

/* Finds a value by name; 0 if absent. */
kf_id kf_graph_find(const kf_graph *g, const char *name);
/* Adds a value with a unique name (copied). *id receives the new id.
 * Fails with KF_ERR_BAD_MODEL if the name exists. */
kf_status kf_graph_add_value(kf_graph *g, const char *name, kf_id *id);
/* Returns the id of the value named name, creating it if needed. */
kf_status kf_graph_intern_value(kf_graph *g, const char *name, kf_id *id);
/* Adds a node. op_type/domain/name are copied; in/out value ids must exist
 * (0 for absent). Use lists and producers are updated; a value that already
 * has a producer is a KF_ERR_BAD_MODEL naming it. */
kf_status kf_graph_add_node(kf_graph *g, const char *op_type, const char *domain,
                            const char *name, const kf_id *in, int nin, const kf_id *out,
                            int nout, kf_id *id);
/* Interns a symbolic dim name; returns id > 0 or 0 on out of memory. */
uint32_t kf_graph_sym(kf_graph *g, const char *name);
kf_status kf_graph_mark_input(kf_graph *g, kf_id v);
kf_status kf_graph_mark_output(kf_graph *g, kf_id v);
/* Records that the subgraphs of node `node` read value v under `name`
 * (copied): v is appended to in[] as a captured input (see kf_node.ncap)
 * and the node becomes one of its users. */
kf_status kf_node_add_capture(kf_graph *g, kf_id node, kf_id v, const char *name);
/* Inputs the node has in ONNX terms (captured values excluded). */
static inline int kf_node_onnx_nin(const kf_node *n) { return n->nin - n->ncap; }
/* Appends a copy of an attribute to the node (deep copy). */
kf_status kf_node_add_attr(kf_node *n, const kf_attr *a);
void kf_attr_release(kf_attr *a);
kf_status kf_attr_copy(kf_attr *dst, const kf_attr *src);

/* Node ids in a topological order (producers first; ties keep file order).
 * *order is malloc'ed (caller frees) with *count live nodes. A cycle is
 * KF_ERR_BAD_MODEL naming one node on it. */
kf_status kf_graph_topo(const kf_graph *g, kf_id **order, uint32_t *count);

/* ---- editing (ir_edit.c) ------------------------------------------------ */

/* Every use of value `from` now reads `to` (use lists updated). When `from`
 * is a graph output, the output keeps its name: `to` takes over the name
 * and `from` is renamed, unless `to` is itself a graph input, output or
 * initializer, in which case KF_ERR_UNSUPPORTED is returned and nothing
 * changes (the caller keeps the node that writes the output). */
kf_status kf_graph_replace_uses(kf_graph *g, kf_id from, kf_id to);
/* Records that input slot i of node reads in[i] (appends the node to that
 * value's use list and keeps the node's position hint). For graph/ only:
 * kf_graph_add_node, kf_node_add_capture and kf_graph_set_input call it. */
kf_status kf_graph_add_use(kf_graph *g, kf_id node, int i);
/* Marks node id dead: drops it from its inputs' use lists and clears the
 * producer of its outputs. Values stay (ids are stable). */
void kf_graph_remove_node(kf_graph *g, kf_id node);
/* Sets input slot i of node id to value v, keeping use lists right. */
kf_status kf_graph_set_input(kf_graph *g, kf_id node, int i, kf_id v);
/* Adds a value with a fresh name derived from base ("base__1", ...), taken
 * neither in g nor in the graphs around it (g->outer). */
kf_status kf_graph_fresh_value(kf_graph *g, const char *base, kf_id *id);
/* The hash of string s (FNV-1a) the graph's name tables use. */
uint32_t kf_hash_str(const char *s);
/* Frees what kf_graph_fresh_value remembers (kf_graph_free). */
void kf_graph_fresh_free(kf_graph *g);
/* Adds an initializer value holding t (ownership of t moves to the graph). */
kf_status kf_graph_add_constant(kf_graph *g, const char *base, kf_tensor *t, kf_id *id);
/* Removes nodes none of whose outputs is used or a graph output, repeatedly;
 * *removed (may be NULL) gets how many. Initializers nobody uses are not
 * written on export. */
kf_status kf_graph_dce(kf_graph *g, uint32_t *removed);
/* Edit tracking. While g->track is on, the edits above (and shape
 * inference, for the types and symbolic contents it changes) record the
 * values they touch in g->touched, each once, with what changed:
 * KF_TOUCH_USERS (its use list) or KF_TOUCH_DEF (its producer, type,
 * contents or graph-output flag). An edit made by hand that bypasses these
 * functions (a node's op or attributes changed in place) touches that
 * node's outputs itself (KF_TOUCH_DEF). Turning tracking off drops the
 * list. The same touches go to g->inferq for shape inference. */
enum { KF_TOUCH_USERS = 1, KF_TOUCH_DEF = 2 };
void kf_graph_track(kf_graph *g, bool on);
void kf_graph_touch(kf_graph *g, kf_id v, uint8_t how);
/* Empties g->inferq (whole-graph inference, once it has looked). */
void kf_graph_inferq_clear(kf_graph *g);
/* Fixes the symbolic dim `name` to `value` in every value's type (graph
 * inputs included), so shapes and cost figures become static.
 * KF_ERR_INVALID_ARG when the graph has no such symbol or value < 0. */
kf_status kf_graph_bind_sym(kf_graph *g, const char *name, int64_t value);
/* Live node count. */
uint32_t kf_graph_live_nodes(const kf_graph *g);

/* True when value v is a constant the model fixes: an initializer that is
 * not also a graph input the caller may override (from IR version 4 on, an
 * initializer listed among the inputs is only a default). Passes that fold
 * or specialise on values ask this, never `init != NULL` alone. */
bool kf_value_is_constant(const kf_model *m, kf_id v);
/* Assembles every deferred initializer of g (kf_tensor_settle): what a
 * model optimized with kf_opt_options.defer_concat_bytes needs before
 * anything but a save reads its weights. */
kf_status kf_graph_settle(kf_graph *g);
/* Frees what kf_infer_shapes kept in g->infer_scratch (kf_graph_track
 * off, kf_graph_free). */
void kf_infer_scratch_free(kf_graph *g);

/* ---- attribute lookup (for shape functions and kernels) ---------------- */

const kf_attr *kf_attr_find(const kf_node *n, const char *name);
/* Value of an attribute or def when absent. A present attribute of another
 * kind also yields def (shape functions validate kinds where it matters). */
int64_t kf_attr_i(const kf_node *n, const char *name, int64_t def);
float kf_attr_f(const kf_node *n, const char *name, float def);
/* NUL-terminated string attribute or def. */
const char *kf_attr_s(const kf_node *n, const char *name, const char *def);
/* Lists: pointer to the elements and *count, or NULL (count 0) if absent. */
const int64_t *kf_attr_ints(const kf_node *n, const char *name, int *count);
const float *kf_attr_floats(const kf_node *n, const char *name, int *count);
const kf_tensor *kf_attr_t(const kf_node *n, const char *name);

/* A printable name for messages: the node's name, or "#id op_type" if none. */
const char *kf_node_label(const kf_node *n);

/* ---- model ------------------------------------------------------------ */

/* Opset version the model imports for domain ("" / "ai.onnx" alike), 0 if
 * none. */
int64_t kf_model_opset(const kf_model *m, const char *domain);

/* ---- model-local functions (graph/onnx.c) ----------------------------------- */

/* A new function with an empty body; NULL on out of memory. */
kf_function *kf_function_new(const char *domain, const char *name);
void kf_function_free(kf_function *f);
/* The function a node with (domain, op_type) calls, or NULL. Domains compare
 * exactly, except that "" and "ai.onnx" are one domain. */
const kf_function *kf_model_function(const kf_model *m, const char *domain, const char *name);
/* Adds f to m (ownership moves to m, also on failure). A second function
 * with the same (domain, name) is KF_ERR_BAD_MODEL naming it. */
kf_status kf_model_add_function(kf_model *m, kf_function *f);
/* Version of `domain` that function f imports, 0 if none. */
int64_t kf_function_opset(const kf_function *f, const char *domain);
/* Sets the model's import of `domain` to version (adding it if absent). */
kf_status kf_model_set_opset(kf_model *m, const char *domain, int64_t version);

#endif
