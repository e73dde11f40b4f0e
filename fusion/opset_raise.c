/*
 * opset_raise.c: raising a model's default-domain opset (e.g. 11 -> 20) so
 * rewrites into newer ops can apply. A table lists, per op, every opset
 * where its schema changed and what the change needs: nothing (new types,
 * new optional attributes whose defaults keep the old behaviour), dropping
 * legacy attributes, or an op-specific conversion. A change the table does
 * not describe, or describes as not convertible, blocks the whole model:
 * every node is checked first, then every node is converted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_opset_raise.h"
#include "kf_ref.h"

/* Schema history of the default-domain ops: since-versions, each with a
 * kind letter (none: compatible; L: legacy consumed_inputs dropped; B: the
 * opset-7 switch from broadcast/axis attributes to numpy broadcasting; C:
 * converted by convert_step; X: not convertible). Versions past an op's
 * last change need nothing. Source: ONNX docs/Changelog.md.
 * Versions 22-28 (ONNX 1.23.2) are compatible for a raise: new element
 * types, or new attributes whose defaults keep the old behaviour (Cast 24
 * round_mode, Range 27 stash_type for float16/bfloat16 which Range did not
 * take before, SpaceToDepth 28 mode = DCR, QuantizeLinear 23 precision).
 * Two narrow: ReduceLogSum/ReduceLogSumExp 28 drop the integer types, which
 * only matters once raising goes past 23 (KF_RAISE_MAX_OPSET). Ops new
 * in 24-28 that kfuse runs are listed with their one version. */
typedef struct history {
    const char *op;
    const char *versions;
} history;

static const history histories[] = {
    {"Abs", "1 6L 13"}, {"Ceil", "1 6L 13"}, {"Exp", "1 6L 13"}, {"Floor", "1 6L 13"}, {"Log", "1 6L 13"},
    {"Neg", "1 6L 13"}, {"Reciprocal", "1 6L 13"}, {"Relu", "1 6L 13 14"}, {"Sigmoid", "1 6L 13"},
    {"Sqrt", "1 6L 13"}, {"Tanh", "1 6L 13"}, {"Elu", "1 6L 22"}, {"HardSigmoid", "1 6L 22"},
    {"LeakyRelu", "1 6L 16"}, {"Selu", "1 6L 22"}, {"ThresholdedRelu", "10 22"}, {"Softplus", "1 22"},
    {"Softsign", "1 22"}, {"PRelu", "1 6L 7C 9 16"}, {"Acos", "7 22"}, {"Asin", "7 22"}, {"Atan", "7 22"},
    {"Cos", "7 22"}, {"Sin", "7 22"}, {"Tan", "7 22"}, {"Acosh", "9 22"}, {"Asinh", "9 22"}, {"Atanh", "9 22"},
    {"Cosh", "9 22"}, {"Sinh", "9 22"}, {"Erf", "9 13"}, {"Sign", "9 13"}, {"IsNaN", "9 13 20"},
    {"IsInf", "10 20"}, {"Round", "11 22"}, {"Not", "1"}, {"Celu", "12 28"}, {"Gelu", "20"}, {"HardSwish", "14 22"},
    {"Mish", "18 22"}, {"Shrink", "9"},
    {"Add", "1 6L 7B 13 14"}, {"Sub", "1 6L 7B 13 14"}, {"Mul", "1 6L 7B 13 14"}, {"Div", "1 6L 7B 13 14"},
    {"Pow", "1 7B 12 13 15"}, {"And", "1 7B"}, {"Or", "1 7B"}, {"Xor", "1 7B"}, {"Equal", "1 7B 11 13 19"},
    {"Greater", "1 7B 9 13"}, {"Less", "1 7B 9 13"}, {"GreaterOrEqual", "12 16"}, {"LessOrEqual", "12 16"},
    {"Mod", "10 13 28"}, {"BitShift", "11 28"}, {"Sum", "1 6L 8 13"}, {"Mean", "1 6L 8 13"}, {"Max", "1 6L 8 12 13"},
    {"Min", "1 6L 8 12 13"}, {"Clip", "1 6L 11C 12 13"}, {"Cast", "1 6C 9 13 19 21 23 24 25 28"}, {"CastLike", "15 19 21 23 24 25"},
    {"Identity", "1 13 14 16 19 21 23 24 25"}, {"Where", "9 16"}, {"Expand", "8 13"}, {"Tile", "1 6X 13"},
    {"Gemm", "1 6L 7C 9 11 13"}, {"MatMul", "1 9 13"}, {"Conv", "1 11 22"}, {"ConvTranspose", "1 11C 22"},
    {"MaxPool", "1 8 10 11 12 22"}, {"AveragePool", "1 7 10 11 19 22"}, {"GlobalAveragePool", "1 22"},
    {"GlobalMaxPool", "1 22"}, {"LpPool", "1 2X 11 18 22"}, {"GlobalLpPool", "1 2X 22"},
    {"BatchNormalization", "1 6L 7C 9C 14C 15"}, {"InstanceNormalization", "1 6L 22"}, {"LRN", "1 13"},
    {"LpNormalization", "1 22"}, {"MeanVarianceNormalization", "1 9X 13"}, {"LayerNormalization", "17"},
    {"GroupNormalization", "18 21X"}, {"Dropout", "1 6L 7C 10C 12C 13 22"}, {"Softmax", "1 11 13C"},
    {"LogSoftmax", "1 11 13C"}, {"Hardmax", "1 11 13C"}, {"Flatten", "1 9 11 13 21 23 24 25"},
    {"Reshape", "1 5C 13 14 19 21 23 24 25"}, {"Squeeze", "1 11 13C 21 23 24 25"}, {"Unsqueeze", "1 11 13C 21 23 24 25"},
    {"Transpose", "1 13 21 23 24 25"}, {"Concat", "1 4C 11 13"}, {"Split", "1 2C 11 13C 18C"}, {"Slice", "1 10C 11 13"},
    {"Pad", "1 2C 11C 13 18 19 21 23 24 25"}, {"Gather", "1 11 13"}, {"GatherElements", "11 13"}, {"GatherND", "11 12 13"},
    {"Scatter", "9 11C"}, {"ScatterElements", "11 13 16 18"}, {"ScatterND", "11 13 16 18"},
    {"Upsample", "1X 7 9C 10C"}, {"Resize", "10 11C 13 18C 19"}, {"Shape", "1 13 15 19 21 23 24 25"},
    {"Size", "1 13 19 21 23 24 25"}, {"ConstantOfShape", "9 20 21 23 24 25"}, {"Constant", "1 9 11 12 13 19 21 23 24 25"}, {"Range", "11 27"},
    {"NonZero", "9 13"}, {"OneHot", "9 11 28"}, {"TopK", "1 10C 11 24"}, {"ArgMax", "1 11 12 13"},
    {"ArgMin", "1 11 12 13"}, {"CumSum", "11 14"}, {"Einsum", "12 28"}, {"Trilu", "14"}, {"DepthToSpace", "1 11 13 28"},
    {"SpaceToDepth", "1 13 28"}, {"Compress", "9 11 28"}, {"EyeLike", "9 22"}, {"Det", "11 22"},
    {"ReverseSequence", "10 28"}, {"Unique", "11 28"}, {"NonMaxSuppression", "10 11"}, {"RoiAlign", "10 16C 22"},
    {"GridSample", "16 20C 22"}, {"ReduceSum", "1 11 13C"}, {"ReduceMean", "1 11 13 18C"},
    {"ReduceProd", "1 11 13 18C"}, {"ReduceL1", "1 11 13 18C"}, {"ReduceL2", "1 11 13 18C"},
    {"ReduceLogSum", "1 11 13 18C 28"}, {"ReduceLogSumExp", "1 11 13 18C 28"}, {"ReduceSumSquare", "1 11 13 18C"},
    {"ReduceMax", "1 11 12 13 18C 20"}, {"ReduceMin", "1 11 12 13 18C 20"}, {"QuantizeLinear", "10 13 19 21 23 24 25 28"},
    {"DequantizeLinear", "10 13 19 21 23 24 25 28"}, {"DynamicQuantizeLinear", "11"}, {"QLinearConv", "10"},
    {"QLinearMatMul", "10 21"}, {"ConvInteger", "10"}, {"MatMulInteger", "10"},
    {"NegativeLogLikelihoodLoss", "12 13 22"}, {"SoftmaxCrossEntropyLoss", "12 13"}, {"RNN", "1X 7 14 22"},
    {"GRU", "1X 3X 7 14 22"}, {"LSTM", "1X 7 14 22"}, {"MaxUnpool", "9 11 22"}, {"MaxRoiPool", "1 22"},
    {"Col2Im", "18"}, {"CenterCropPad", "18"}, {"AffineGrid", "20"}, {"RMSNormalization", "23"},
    {"RotaryEmbedding", "23"}, {"Attention", "23 24 25C"}, {"Swish", "24"}, {"TensorScatter", "24"},
    {"CumProd", "26"}, {"BitCast", "26"}, {"SwiGLU", "28"}, {"CausalConvWithState", "27"},
    {"LinearAttention", "27"},
};

/* The IR version an opset needs at least (ONNX docs/Versioning.md). */
static int64_t ir_for_opset(int64_t opset) {
    static const int64_t ir[] = {3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 5, 6, 7, 7, 7, 8, 8, 8, 8, 9, 9,
                                 10, 10, 11, 12, 13, 13, 13, 14};
    return opset < (int64_t)(sizeof ir / sizeof *ir) ? ir[opset] : 14;
}

static const history *history_of(const char *op) {
    for (size_t i = 0; i < sizeof histories / sizeof *histories; i++)
        if (!strcmp(histories[i].op, op)) return &histories[i];
    return NULL;
}

static _Thread_local char why_buf[512];

/* One raise in progress: apply false checks only. */
typedef struct raise_ctx {
    kf_model *m;
    bool apply;
    kf_status st; /* first error while applying */
    /* history_of by op id, filled as ops are met (&no_history: none) */
    const struct history *by_op[KF_OP_MAX_];
} raise_ctx;

static const history no_history;

/* history_of(op) for a node of op id `id`, looked up once per id. */
static const history *history_for(raise_ctx *c, kf_op id, const char *op) {
    if (id <= 0 || id >= KF_OP_MAX_) return history_of(op);
    if (!c->by_op[id]) c->by_op[id] = history_of(op) ? history_of(op) : &no_history;
    return c->by_op[id] == &no_history ? NULL : c->by_op[id];
}

/* ---- small edits ---------------------------------------------------------- */

static void drop_attr(kf_node *n, const char *name) {
    for (int i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].name, name)) {
            kf_attr_release(&n->attrs[i]);
            n->attrs[i] = n->attrs[--n->nattrs];
            return;
        }
}

/* Replaces (or adds) an attribute; a may point into n's own attributes. */
static kf_status set_attr(kf_node *n, const kf_attr *a) {
    kf_attr copy;
    KF_TRY(kf_attr_copy(&copy, a));
    drop_attr(n, copy.name);
    kf_status st = kf_node_add_attr(n, &copy);
    kf_attr_release(&copy);
    return st;
}

static kf_status set_attr_s(kf_node *n, const char *name, const char *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_STRING, .s = {(char *)v, strlen(v)}};
    return set_attr(n, &a);
}

static kf_status set_attr_i(kf_node *n, const char *name, int64_t v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INT, .i = v};
    return set_attr(n, &a);
}

/* Sets input slot `slot` of node id to v, growing the input list (new
 * slots absent). */
static kf_status put_input(kf_graph *g, kf_id id, int slot, kf_id v) {
    kf_node *n = &g->nodes[id];
    if (slot >= n->nin) {
        kf_id *in = kf_realloc(n->in, sizeof(kf_id) * (size_t)(slot + 1));
        if (!in) return kf_fail(KF_ERR_NOMEM, "out of memory");
        for (int i = n->nin; i <= slot; i++) in[i] = 0;
        n->in = in;
        n->nin = slot + 1;
    }
    return kf_graph_set_input(g, id, slot, v);
}

/* A new initializer: 1-D int64 from vals, or a scalar of dtype dt. */
static kf_status const_ints(kf_graph *g, const kf_node *n, const int64_t *vals, int count, kf_id *id) {
    kf_tensor *t = kf_tensor_new();
    int64_t dim = count;
    kf_status st = t ? kf_tensor_alloc(t, KF_DT_INT64, 1, &dim) : kf_fail(KF_ERR_NOMEM, "out of memory");
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    for (int i = 0; i < count; i++) kf_set_i64(t, i, vals[i]);
    return kf_graph_add_constant(g, n->name && *n->name ? n->name : n->op_type, t, id);
}

static kf_status const_scalar(kf_graph *g, const kf_node *n, kf_dtype dt, double v, kf_id *id) {
    kf_tensor *t = kf_tensor_new();
    kf_status st = t ? kf_tensor_alloc(t, dt, 0, NULL) : kf_fail(KF_ERR_NOMEM, "out of memory");
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    kf_set_f64(t, 0, v);
    return kf_graph_add_constant(g, n->name && *n->name ? n->name : n->op_type, t, id);
}

/* Moves int-list attribute `name` into input `slot` as a constant (nothing
 * when the attribute is absent). */
static kf_status ints_attr_to_input(kf_graph *g, kf_id id, const char *name, int slot) {
    kf_node *n = &g->nodes[id];
    int count;
    const int64_t *vals = kf_attr_ints(n, name, &count);
    if (!vals) return KF_OK;
    kf_id c;
    KF_TRY(const_ints(g, n, vals, count, &c));
    KF_TRY(put_input(g, id, slot, c));
    drop_attr(&g->nodes[id], name);
    return KF_OK;
}

static bool output_used(const kf_graph *g, const kf_node *n, int j) {
    if (j >= n->nout || !n->out[j]) return false;
    const kf_value *v = &g->values[n->out[j]];
    return v->nusers || v->is_output;
}

static const kf_type *in_type(const kf_graph *g, const kf_node *n, int i) {
    return i < n->nin && n->in[i] ? &g->values[n->in[i]].type : NULL;
}

/* ---- conversions ------------------------------------------------------------ */

#define DECLINE(msg) return (msg)
/* In a conversion: run an edit when applying; the first error stops it. */
#define EDIT(expr)                                                                                                     \
    do {                                                                                                               \
        if (c->apply && !c->st) c->st = (expr);                                                                        \
    } while (0)

/* Opset-7 broadcasting: with legacy broadcast=1, B is aligned at `axis`
 * (default: as a suffix), which numpy broadcasting reproduces only when B
 * is a suffix of A. */
static const char *convert_broadcast(raise_ctx *c, kf_node *n) {
    kf_graph *g = c->m->graph;
    if (kf_attr_i(n, "broadcast", 0) && kf_attr_find(n, "axis")) {
        const kf_type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
        if (!a || !b || a->rank < 0 || b->rank < 0) DECLINE("legacy broadcast with an axis and unknown ranks");
        if (kf_attr_i(n, "axis", 0) != a->rank - b->rank) DECLINE("legacy broadcast at an axis that is not a suffix");
    }
    if (c->apply) {
        drop_attr(n, "broadcast");
        drop_attr(n, "axis");
    }
    return NULL;
}

/* Softmax, LogSoftmax and Hardmax at 13: from "flatten to 2-D at axis" to
 * "along axis"; the same when every dim after the axis is 1. */
static const char *convert_softmax13(raise_ctx *c, kf_node *n) {
    const kf_type *t = in_type(c->m->graph, n, 0);
    if (!t || t->rank < 0) DECLINE("input rank unknown (axis semantics changed at opset 13)");
    int64_t axis = kf_attr_i(n, "axis", 1);
    if (axis < 0) axis += t->rank;
    if (t->rank == 0) axis = 0;
    else if (axis < 0 || axis >= t->rank) DECLINE("axis out of range");
    for (int d = (int)axis + 1; d < t->rank; d++)
        if (t->dims[d] != 1) DECLINE("axis is not the last one (axis semantics changed at opset 13)");
    EDIT(set_attr_i(n, "axis", t->rank == 0 ? -1 : axis));
    return NULL;
}

/* Conversion at version v of the node's op (kind 'C'). */
static const char *convert_step(raise_ctx *c, kf_id id, const char *op, int v, int64_t target) {
    kf_graph *g = c->m->graph;
    kf_node *n = &g->nodes[id];
    if (!strcmp(op, "Clip") && v == 11) { /* min/max attributes -> inputs */
        const kf_type *t = in_type(g, n, 0);
        bool has_min = kf_attr_find(n, "min"), has_max = kf_attr_find(n, "max");
        if ((has_min || has_max) && (!t || !kf_dtype_is_float(t->dtype))) DECLINE("input dtype unknown");
        if (!c->apply) return NULL;
        kf_dtype dt = t ? t->dtype : KF_DT_FLOAT; /* values grow below: t may move */
        kf_id lo = 0, hi = 0;
        if (has_min) EDIT(const_scalar(g, n, dt, kf_attr_f(n, "min", 0), &lo));
        if (has_max) EDIT(const_scalar(g, n, dt, kf_attr_f(n, "max", 0), &hi));
        if (hi) EDIT(put_input(g, id, 2, hi));
        if (lo) EDIT(put_input(g, id, 1, lo));
        n = &g->nodes[id];
        drop_attr(n, "min");
        drop_attr(n, "max");
        return NULL;
    }
    if (!strcmp(op, "Cast") && v == 6) {
        const kf_attr *to = kf_attr_find(n, "to");
        if (to && to->type == KF_ATTR_STRING) DECLINE("'to' is a type name (opset 1)");
        return NULL;
    }
    if (!strcmp(op, "Gemm") && v == 7) {
        if (c->apply) drop_attr(n, "broadcast");
        return NULL;
    }
    if (!strcmp(op, "ConvTranspose") && v == 11) {
        const char *pad = kf_attr_s(n, "auto_pad", "NOTSET");
        if (strcmp(pad, "NOTSET") && strcmp(pad, "VALID")) DECLINE("SAME auto_pad split changed at opset 11");
        return NULL;
    }
    if (!strcmp(op, "BatchNormalization")) {
        if (v == 7) {
            for (int j = 1; j < n->nout; j++)
                if (output_used(g, n, j)) DECLINE("training outputs are used");
            if (c->apply) drop_attr(n, "is_test");
            return NULL;
        }
        if (v == 9) {
            if (kf_attr_i(n, "spatial", 1) == 0) DECLINE("spatial=0 was removed at opset 9");
            if (c->apply) drop_attr(n, "spatial");
            return NULL;
        }
        if (v == 14) {
            for (int j = 1; j < n->nout; j++)
                if (output_used(g, n, j)) DECLINE("training outputs are used");
            if (c->apply && n->nout > 1) {
                for (int j = 1; j < n->nout; j++)
                    if (n->out[j]) g->values[n->out[j]].producer = 0;
                n->nout = 1;
            }
            return NULL;
        }
    }
    if (!strcmp(op, "Dropout")) {
        if (v == 7) {
            if (c->apply) drop_attr(n, "is_test");
            return NULL;
        }
        if (v == 10) {
            if (output_used(g, n, 1)) DECLINE("the mask output (its dtype became bool at opset 10) is used");
            return NULL;
        }
        if (v == 12) {
            if (kf_attr_find(n, "ratio")) {
                kf_id r = 0;
                EDIT(const_scalar(g, n, KF_DT_FLOAT, kf_attr_f(n, "ratio", 0.5f), &r));
                EDIT(put_input(g, id, 1, r));
                if (c->apply) drop_attr(&g->nodes[id], "ratio");
            }
            return NULL;
        }
    }
    if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax") || !strcmp(op, "Hardmax")) return convert_softmax13(c, n);
    if (!strcmp(op, "Reshape") && v == 5) {
        if (!kf_attr_find(n, "shape")) DECLINE("no shape attribute");
        EDIT(ints_attr_to_input(g, id, "shape", 1));
        return NULL;
    }
    if ((!strcmp(op, "Squeeze") || !strcmp(op, "Unsqueeze")) && v == 13) {
        EDIT(ints_attr_to_input(g, id, "axes", 1));
        return NULL;
    }
    if (!strcmp(op, "Concat") && v == 4) {
        if (!kf_attr_find(n, "axis")) EDIT(set_attr_i(n, "axis", 1));
        return NULL;
    }
    if (!strcmp(op, "Split")) {
        if (v == 2) {
            if (n->nin > 1 && n->in[1]) DECLINE("split given as an input (opset 1)");
            return NULL;
        }
        if (v == 13) {
            EDIT(ints_attr_to_input(g, id, "split", 1));
            return NULL;
        }
        if (v == 18) {
            bool given = (n->nin > 1 && n->in[1]) || kf_attr_find(n, "split");
            if (!given) EDIT(set_attr_i(n, "num_outputs", n->nout));
            return NULL;
        }
    }
    if (!strcmp(op, "Slice") && v == 10) {
        if (!kf_attr_find(n, "starts") || !kf_attr_find(n, "ends")) DECLINE("starts or ends missing");
        EDIT(ints_attr_to_input(g, id, "axes", 3));
        EDIT(ints_attr_to_input(g, id, "ends", 2));
        EDIT(ints_attr_to_input(g, id, "starts", 1));
        return NULL;
    }
    if (!strcmp(op, "Pad")) {
        if (v == 2) {
            const kf_attr *p = kf_attr_find(n, "paddings");
            if (p && c->apply) {
                kf_attr a = *p;
                a.name = (char *)"pads";
                EDIT(kf_node_add_attr(n, &a));
                drop_attr(&g->nodes[id], "paddings");
            }
            return NULL;
        }
        if (v == 11) {
            if (!kf_attr_find(n, "pads") && !kf_attr_find(n, "paddings")) DECLINE("no pads attribute");
            const kf_type *t = in_type(g, n, 0);
            bool has_value = kf_attr_find(n, "value") && kf_attr_f(n, "value", 0) != 0;
            if (has_value && (!t || !t->dtype)) DECLINE("input dtype unknown");
            if (has_value) {
                kf_id val = 0;
                EDIT(const_scalar(g, n, t->dtype, kf_attr_f(n, "value", 0), &val));
                EDIT(put_input(g, id, 2, val));
            }
            EDIT(ints_attr_to_input(g, id, "pads", 1));
            if (c->apply) drop_attr(&g->nodes[id], "value");
            return NULL;
        }
    }
    if (!strcmp(op, "Scatter") && v == 11) return NULL; /* renamed by the caller */
    if (!strcmp(op, "Upsample")) {
        if (v == 9) {
            int cnt;
            if (!kf_attr_floats(n, "scales", &cnt)) DECLINE("no scales attribute");
            if (c->apply) {
                const float *s = kf_attr_floats(n, "scales", &cnt);
                kf_tensor *t = kf_tensor_new();
                int64_t dim = cnt;
                kf_status st = t ? kf_tensor_alloc(t, KF_DT_FLOAT, 1, &dim) : kf_fail(KF_ERR_NOMEM, "out of memory");
                if (st) kf_tensor_free(t);
                for (int i = 0; !st && i < cnt; i++) kf_set_f64(t, i, s[i]);
                kf_id sc = 0;
                if (!st) st = kf_graph_add_constant(g, n->name && *n->name ? n->name : "scales", t, &sc);
                EDIT(st);
                EDIT(put_input(g, id, 1, sc));
                drop_attr(&g->nodes[id], "scales");
            }
            return NULL;
        }
        if (v == 10) return NULL; /* renamed to Resize by the caller */
    }
    if (!strcmp(op, "Resize") && v == 11) {
        /* Resize-10 (and Upsample) map output x to input x / scale and
         * nearest rounds down; 11 made both attributes with new defaults.
         * X, scales -> X, roi, scales (roi optional from 13). */
        const char *mode = kf_attr_s(n, "mode", "nearest");
        if (strcmp(mode, "nearest") && strcmp(mode, "linear")) DECLINE("unknown mode");
        bool scales_pending = n->nin == 1 && kf_attr_find(n, "scales"); /* Upsample-7, converted earlier */
        if (n->nin != 2 && !scales_pending) DECLINE("expected X and scales");
        EDIT(set_attr_s(n, "coordinate_transformation_mode", "asymmetric"));
        if (!strcmp(mode, "nearest")) EDIT(set_attr_s(&g->nodes[id], "nearest_mode", "floor"));
        if (c->apply && !c->st && g->nodes[id].nin == 2) {
            kf_id scales = g->nodes[id].in[1], roi = 0;
            if (target < 13) {
                kf_tensor *t = kf_tensor_new();
                int64_t zero = 0;
                kf_status st = t ? kf_tensor_alloc(t, KF_DT_FLOAT, 1, &zero) : kf_fail(KF_ERR_NOMEM, "out of memory");
                if (st) kf_tensor_free(t);
                else st = kf_graph_add_constant(g, "roi", t, &roi);
                EDIT(st);
            }
            EDIT(put_input(g, id, 2, scales));
            EDIT(kf_graph_set_input(g, id, 1, roi));
        }
        return NULL;
    }
    if (!strcmp(op, "Resize") && v == 18) {
        if (!strcmp(kf_attr_s(n, "coordinate_transformation_mode", ""), "tf_half_pixel_for_nn"))
            DECLINE("coordinate_transformation_mode tf_half_pixel_for_nn was removed at opset 18");
        return NULL;
    }
    if (!strcmp(op, "PRelu") && v == 7) {
        /* before 7 a slope vector runs along the channel axis (1); from 7 it
         * broadcasts numpy-style (along the last axis) */
        const kf_type *x = in_type(g, n, 0), *sl = in_type(g, n, 1);
        const kf_tensor *st = n->nin > 1 && n->in[1] ? g->values[n->in[1]].init : NULL;
        if (!x || !sl || x->rank < 0 || sl->rank < 0) DECLINE("ranks unknown (slope broadcasting changed at opset 7)");
        if (sl->rank == x->rank || x->rank <= 2) return NULL;
        int64_t numel = 1;
        for (int d = 0; d < sl->rank; d++) numel = sl->dims[d] < 0 ? -1 : numel * sl->dims[d];
        if (numel == 1) return NULL;
        if (sl->rank != 1 || !st) DECLINE("a slope along the channel axis that is not a constant vector");
        if (!c->apply) return NULL;
        kf_tensor *t = kf_tensor_new();
        int64_t dims[KF_MAX_RANK];
        dims[0] = st->numel;
        for (int d = 1; d < x->rank - 1; d++) dims[d] = 1;
        kf_status e = t ? kf_tensor_alloc(t, st->dtype, x->rank - 1, dims) : kf_fail(KF_ERR_NOMEM, "out of memory");
        if (e) kf_tensor_free(t);
        else {
            for (int64_t i = 0; i < st->numel; i++) kf_set_f64(t, i, kf_get_f64(st, i));
            kf_id sc = 0;
            e = kf_graph_add_constant(g, "slope", t, &sc);
            if (!e) e = kf_graph_set_input(g, id, 1, sc);
        }
        EDIT(e);
        return NULL;
    }
    if (!strcmp(op, "TopK") && v == 10) {
        if (!kf_attr_find(n, "k")) DECLINE("no k attribute");
        int64_t k = kf_attr_i(n, "k", 0);
        kf_id kc = 0;
        EDIT(const_ints(g, n, &k, 1, &kc));
        EDIT(put_input(g, id, 1, kc));
        if (c->apply) drop_attr(&g->nodes[id], "k");
        return NULL;
    }
    if (!strncmp(op, "Reduce", 6) && (v == 13 || v == 18)) {
        EDIT(ints_attr_to_input(g, id, "axes", 1));
        return NULL;
    }
    if (!strcmp(op, "RoiAlign") && v == 16) {
        if (!kf_attr_find(n, "coordinate_transformation_mode"))
            EDIT(set_attr_s(n, "coordinate_transformation_mode", "output_half_pixel"));
        return NULL;
    }
    if (!strcmp(op, "Attention") && v == 25) {
        /* 24 added an optional input, 25 window attributes whose defaults keep
         * the old behaviour; but from 25 head counts given for 4-D inputs are
         * an error */
        const kf_type *q = in_type(g, n, 0);
        bool heads = kf_attr_find(n, "q_num_heads") || kf_attr_find(n, "kv_num_heads");
        if (heads && (!q || q->rank != 3)) DECLINE("q_num_heads/kv_num_heads are refused for 4-D inputs from opset 25");
        return NULL;
    }
    if (!strcmp(op, "GridSample") && v == 20) {
        const char *mode = kf_attr_s(n, "mode", "bilinear");
        const char *to = !strcmp(mode, "bilinear") ? "linear" : !strcmp(mode, "bicubic") ? "cubic" : mode;
        EDIT(set_attr_s(n, "mode", to));
        return NULL;
    }
    DECLINE("no conversion for this change");
}

/* Checks (c->apply false) or converts node id from opset `from` to
 * `target`; returns NULL or why it cannot. */
static const char *convert_node(raise_ctx *c, kf_id id, int64_t from, int64_t target, int *at_version) {
    kf_graph *g = c->m->graph;
    const kf_node *n = &g->nodes[id];
    for (int a = 0; a < n->nattrs; a++)
        if (n->attrs[a].type == KF_ATTR_GRAPH || n->attrs[a].type == KF_ATTR_GRAPHS)
            DECLINE("has subgraphs (their nodes would need raising too)");
    const char *op = n->op_type;
    *at_version = 0;
    const history *h = history_for(c, n->op, op);
    if (!h) DECLINE("no schema history known for this op");
    const char *p = h->versions;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        char kind = *end && *end != ' ' ? *end++ : 0;
        while (*end == ' ') end++;
        p = end;
        if (v <= from || v > target) continue;
        *at_version = (int)v;
        const char *why = NULL;
        switch (kind) {
        case 0: break;
        case 'L':
            if (c->apply) drop_attr(&g->nodes[id], "consumed_inputs");
            break;
        case 'B': why = convert_broadcast(c, &g->nodes[id]); break;
        case 'C': why = convert_step(c, id, op, (int)v, target); break;
        default: why = "changed in a way kfuse does not convert"; break;
        }
        if (why) return why;
        /* deprecated ops continue as their replacements */
        const char *renamed = v == 10 && !strcmp(op, "Upsample")   ? "Resize"
                              : v == 11 && !strcmp(op, "Scatter") ? "ScatterElements"
                                                                   : NULL;
        if (renamed) {
            if (c->apply && !c->st) {
                kf_node *nn = &g->nodes[id];
                char *t = kf_strdup(renamed);
                if (!t) c->st = kf_fail(KF_ERR_NOMEM, "out of memory");
                else {
                    kf_free(nn->op_type);
                    nn->op_type = t;
                    nn->op = kf_op_lookup("", t);
                }
            }
            op = renamed;
            if (!(h = history_of(op))) DECLINE("no schema history known for its replacement");
            p = h->versions;
        }
    }
    const kf_node *now = &g->nodes[id]; /* conversions may have added nodes */
    const kf_op_info *info = kf_op_get(op == now->op_type ? now->op : kf_op_lookup("", op));
    if (info && target > info->ver_hi) {
        snprintf(why_buf, sizeof why_buf, "kfuse's kernel covers opsets %d..%d only", info->ver_lo, info->ver_hi);
        return why_buf;
    }
    return NULL;
}

static bool default_domain(const char *d) { return !d || !*d || !strcmp(d, "ai.onnx"); }

/* Checks every node of the default domain, then (nothing declined)
 * converts them all from opset cur to target. */
static kf_status raise_nodes(raise_ctx *c, int64_t cur, int64_t target, const char **why_not) {
    kf_graph *g = c->m->graph;
    for (int pass = 0; pass < 2; pass++) {
        c->apply = pass == 1;
        uint32_t nnodes = g->nnodes;
        for (kf_id id = 1; id < nnodes; id++) {
            kf_node *n = &g->nodes[id];
            if (n->dead || !default_domain(n->domain)) continue;
            int64_t from = n->opset ? n->opset : cur;
            int at = 0;
            const char *why = convert_node(c, id, from, target, &at);
            if (c->st) return c->st;
            if (why) { /* the checking pass: the node is as it was */
                char msg[sizeof why_buf];
                char ver[32] = "";
                if (at) snprintf(ver, sizeof ver, " (changed at opset %d)", at);
                snprintf(msg, sizeof msg, "node '%s' (%s)%s: %s", kf_node_label(&g->nodes[id]), g->nodes[id].op_type, ver,
                         why);
                snprintf(why_buf, sizeof why_buf, "%s", msg);
                if (why_not) *why_not = why_buf;
                KF_ASSERT(!c->apply); /* every decline is found by the checking pass */
                return kf_fail(KF_ERR_UNSUPPORTED, "cannot raise opset %lld to %lld: %s", (long long)cur,
                               (long long)target, why_buf);
            }
            if (c->apply) {
                g->nodes[id].opset = target;
                /* while edits are tracked, shape inference looks again at
                 * the nodes whose op changed between the two opsets (the
                 * others read the same under either) */
                for (int j = 0; at && j < g->nodes[id].nout; j++) kf_graph_touch(g, g->nodes[id].out[j], KF_TOUCH_DEF);
            }
        }
    }
    return KF_OK;
}

kf_status kf_model_raise_opset(kf_model *m, int64_t target, const char **why_not) {
    return kf_model_raise_opset_ex(m, target, true, why_not);
}

kf_status kf_model_raise_opset_ex(kf_model *m, int64_t target, bool infer_after, const char **why_not) {
    if (why_not) *why_not = NULL;
    int64_t cur = kf_model_opset(m, "");
    if (cur >= target) return KF_OK;
    if (target > KF_RAISE_MAX_OPSET || cur < 1) {
        snprintf(why_buf, sizeof why_buf, "cannot raise opset %lld to %lld (kfuse knows opsets 1..%d)", (long long)cur,
                 (long long)target, KF_RAISE_MAX_OPSET);
        if (why_not) *why_not = why_buf;
        return kf_fail(KF_ERR_UNSUPPORTED, "%s", why_buf);
    }
    (void)kf_infer_shapes(m); /* conversions that need a type decline when it stays unknown */
    raise_ctx *c = kf_calloc(1, sizeof *c);
    if (!c) return kf_fail(KF_ERR_NOMEM, "out of memory");
    c->m = m;
    kf_status st = raise_nodes(c, cur, target, why_not);
    kf_free(c);
    if (st) return st;
    for (int i = 0; i < m->nopsets; i++)
        if (default_domain(m->opsets[i].domain)) m->opsets[i].version = target;
    if (m->ir_version < ir_for_opset(target)) m->ir_version = ir_for_opset(target);
    if (infer_after) (void)kf_infer_shapes(m); /* refreshes types; a failure here is no reason to undo */
    return KF_OK;
}
