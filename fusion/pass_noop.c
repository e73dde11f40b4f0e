/*
 * pass_noop.c: rules that remove nodes whose output equals their input:
 * Identity, Dropout at inference with its mask unused, Cast/CastLike to the
 * input's own dtype, Slice that selects everything, Transpose by the
 * identity permutation, Pad by zero, Concat of one input, and the shape ops
 * (Reshape, Squeeze, Unsqueeze, Flatten, Expand, Tile, Split into one) whose
 * output has the input's shape; and a Gather of every index in order, which
 * is a Reshape. C-callback rules (passes.def:
 * KF_RULE_PASS(noop)), run by the rewrite driver with the text rules.
 */
#include <string.h>

#include "kf_opt.h"

/* Near-miss reason shared by every rule: ONNX names a graph output and a
 * graph input (or initializer) separately, so a node that only copies one to
 * the other is the one place that can carry both names. */
static const char *const KEEPS_NAMES =
    "a graph output copied straight from a graph input, output or constant: removing the node would "
    "rename one of them, so it stays";

static int64_t opset_of(const kf_node *n) { return n->opset ? n->opset : INT64_MAX; }

/* A value that holds the same data on every run: an initializer that no
 * caller can override by feeding a graph input of the same name. */
static const kf_tensor *fixed(const kf_model *m, kf_id v) {
    return v && kf_value_is_constant(m, v) ? m->graph->values[v].init : NULL;
}

/* Every input but the data (input 0) is absent or fixed by the model. An
 * overridable initializer would make inference's shapes a guess. */
static bool params_fixed(const kf_model *m, const kf_node *n) {
    for (int i = 1; i < n->nin; i++)
        if (n->in[i] && m->graph->values[n->in[i]].init && !kf_value_is_constant(m, n->in[i])) return false;
    return true;
}

/* dtype and every dim known equal (or the same named symbol) */
static bool same_type(const kf_type *a, const kf_type *b) {
    return a->dtype && a->dtype == b->dtype && kf_type_same_shape(a, b);
}

/* Readers of the node's first output read x instead. Declines (reason in
 * *why) when that output is a graph output and x already has a name the
 * file must keep. */
static kf_status forward(kf_model *m, kf_id node, kf_id x, bool *applied, const char **why) {
    kf_graph *g = m->graph;
    kf_id y = g->nodes[node].out[0];
    if (!x || !y) {
        *why = "an input or output slot is empty";
        return KF_OK;
    }
    const kf_value *vx = &g->values[x], *vy = &g->values[y];
    if (vy->is_output && (vx->is_input || vx->is_output || vx->init)) {
        *why = KEEPS_NAMES;
        return KF_OK;
    }
    KF_TRY(kf_graph_replace_uses(g, y, x));
    *applied = true;
    return KF_OK;
}

/* int_list's reason when it ran out of memory: callers turn it into
 * KF_ERR_NOMEM instead of declining (compared by address). */
static const char int_list_oom[] = "out of memory";

/* An integer list given as attribute `attr` below opset `input_from`, else
 * as input idx. *vals is malloc'ed (caller frees; NULL when absent). Returns
 * false with *why when the list is present but not a fixed constant. */
static bool int_list(const kf_model *m, const kf_node *n, int idx, const char *attr, int64_t input_from, int64_t **vals,
                     int64_t *count, const char **why) {
    *vals = NULL;
    *count = 0;
    if (opset_of(n) < input_from) {
        int cnt;
        const int64_t *a = kf_attr_ints(n, attr, &cnt);
        if (!a) return true;
        *vals = kf_malloc(sizeof(int64_t) * ((size_t)cnt + 1));
        if (!*vals) {
            *why = int_list_oom;
            return false;
        }
        memcpy(*vals, a, sizeof(int64_t) * (size_t)cnt);
        *count = cnt;
        return true;
    }
    if (idx >= n->nin || !n->in[idx]) return true;
    const kf_tensor *t = fixed(m, n->in[idx]);
    kf_status st = t ? kf_read_ints(n, t, attr, vals, count) : KF_ERR_BAD_MODEL;
    if (st) {
        *vals = NULL;
        *why = st == KF_ERR_NOMEM ? int_list_oom : "a parameter input is not a constant of the model";
        if (st != KF_ERR_NOMEM) kf_clear_error();
        return false;
    }
    return true;
}

/* ---- rules ------------------------------------------------------------------------ */

/* Identity(x) -> x */
static kf_status remove_identity(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    return forward(m, node, m->graph->nodes[node].in[0], applied, why);
}

/* Dropout(x) -> x at inference (the mask output unused) */
static kf_status remove_inference_dropout(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    if (n->nout > 1 && n->out[1] && (g->values[n->out[1]].nusers || g->values[n->out[1]].is_output)) {
        *why = "the mask output is used";
        return KF_OK;
    }
    int64_t ops = opset_of(n);
    bool training = false, ratio_zero = false;
    if (ops < 7) {
        training = kf_attr_i(n, "is_test", 0) == 0;
        ratio_zero = kf_attr_f(n, "ratio", 0.5f) == 0;
    } else if (ops < 12) {
        training = false; /* versions 7-11 only describe inference */
    } else {
        const kf_tensor *mode = n->nin > 2 && n->in[2] ? fixed(m, n->in[2]) : NULL;
        const kf_tensor *ratio = n->nin > 1 && n->in[1] ? fixed(m, n->in[1]) : NULL;
        if (n->nin > 2 && n->in[2]) training = !mode || mode->numel != 1 || kf_get_f64(mode, 0) != 0;
        ratio_zero = ratio && ratio->numel == 1 && kf_get_f64(ratio, 0) == 0;
    }
    if (training && !ratio_zero) {
        *why = "training mode (or training_mode not a constant false) with a nonzero ratio: the output is random";
        return KF_OK;
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Cast(x, to=dtype(x)) -> x;  CastLike(x, y) -> x when dtype(y) == dtype(x) */
static kf_status remove_cast_to_same_type(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    kf_dtype from = n->in[0] ? g->values[n->in[0]].type.dtype : KF_DT_UNDEFINED;
    kf_dtype to = g->values[n->out[0]].type.dtype;
    if (!from || !to) {
        *why = "a dtype is unknown";
        return KF_OK;
    }
    if (from != to) {
        *why = "the target dtype differs";
        return KF_OK;
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Reshape/Squeeze/Unsqueeze/Flatten/Expand/Tile/Split(x) -> x when the
 * result has x's shape: these ops keep the element order, so equal shapes
 * mean equal tensors. */
static kf_status remove_same_shape_op(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    int outs = 0;
    for (int j = 0; j < n->nout; j++) outs += n->out[j] != 0;
    if (outs != 1 || !n->out[0]) {
        *why = "more than one output";
        return KF_OK;
    }
    if (!params_fixed(m, n)) {
        *why = "a parameter input is a graph input, so the output shape can change";
        return KF_OK;
    }
    if (!n->in[0] || !same_type(&g->values[n->in[0]].type, &g->values[n->out[0]].type)) {
        *why = "the output shape differs from the input's or is not known to equal it";
        return KF_OK;
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Concat(x) -> x */
static kf_status remove_single_input_concat(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_node *n = &m->graph->nodes[node];
    if (n->nin != 1) {
        *why = "more than one input";
        return KF_OK;
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Transpose(x, perm=[0, 1, ..., r-1]) -> x */
static kf_status remove_identity_transpose(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    int cnt;
    const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
    int rank = n->in[0] ? g->values[n->in[0]].type.rank : -1;
    if (!perm) {
        /* the default reverses the dims: the identity only up to rank 1 */
        if (rank < 0 || rank > 1) {
            *why = rank < 0 ? "no perm and the rank is unknown" : "no perm: the dims are reversed";
            return KF_OK;
        }
    } else {
        for (int d = 0; d < cnt; d++)
            if (perm[d] != d) {
                *why = "perm is not the identity";
                return KF_OK;
            }
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Gather(x, idx) {axis=a} -> Reshape(x, shape of the result) when idx is a
 * constant holding 0, 1, ..., x.dims[a]-1 in order (any shape): every
 * element is read once, in order, so only the dims change. Today's
 * PyTorch exporter writes such Gathers for as_strided views (ConvNeXt's
 * head). */
static kf_status gather_arange_to_reshape(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    if (n->nin != 2 || !n->in[0] || !n->in[1] || n->nout != 1 || !n->out[0]) {
        *why = "not a two-input Gather";
        return KF_OK;
    }
    const kf_tensor *idx = fixed(m, n->in[1]);
    if (!idx || (idx->dtype != KF_DT_INT64 && idx->dtype != KF_DT_INT32)) {
        *why = "the indices are not a constant of int32/int64";
        return KF_OK;
    }
    const kf_type *xt = &g->values[n->in[0]].type, *yt = &g->values[n->out[0]].type;
    int64_t axis = kf_attr_i(n, "axis", 0);
    if (xt->rank < 1 || axis < -xt->rank || axis >= xt->rank) {
        *why = "the data's rank is unknown or the axis is out of range";
        return KF_OK;
    }
    if (axis < 0) axis += xt->rank;
    if (!kf_type_is_static(yt) || xt->dims[axis] < 0 || idx->numel != xt->dims[axis]) {
        *why = "the result's shape is not static or the indices do not cover the axis once";
        return KF_OK;
    }
    for (int64_t i = 0; i < idx->numel; i++)
        if (kf_get_i64(idx, i) != i) {
            *why = "the indices are not 0, 1, 2, ... in order";
            return KF_OK;
        }
    for (int d = 0; d < yt->rank; d++)
        if (yt->dims[d] == 0) {
            *why = "an empty result (Reshape would read 0 as 'copy the dim')";
            return KF_OK;
        }
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t r = yt->rank;
    kf_status st = kf_tensor_alloc(t, KF_DT_INT64, 1, &r);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    for (int d = 0; d < yt->rank; d++) ((int64_t *)t->data)[d] = yt->dims[d];
    kf_id shape, in[2], out = n->out[0], rn;
    KF_TRY(kf_graph_add_constant(g, "gather_shape", t, &shape));
    in[0] = n->in[0];
    in[1] = shape;
    char name[256];
    snprintf(name, sizeof name, "%s", n->name ? n->name : "gather");
    kf_graph_remove_node(g, node);
    KF_TRY(kf_graph_add_node(g, "Reshape", "", name, in, 2, &out, 1, &rn));
    g->nodes[rn].op = KF_OP_RESHAPE;
    g->nodes[rn].opset = kf_model_opset(m, "");
    KF_TRY(kf_infer_node(m, rn));
    *applied = true;
    return KF_OK;
}

/* Pad(x, pads=0...) -> x */
static kf_status remove_zero_pad(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    int64_t *pads;
    int64_t cnt;
    /* Pad-1 calls the attribute `paddings`, 2-10 `pads`, 11 on an input */
    const char *attr = opset_of(n) < 2 ? "paddings" : "pads";
    if (!int_list(m, n, 1, attr, 11, &pads, &cnt, why))
        return *why == int_list_oom ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    bool zero = pads != NULL;
    for (int64_t i = 0; i < cnt && zero; i++) zero = pads[i] == 0;
    kf_free(pads);
    if (!zero) {
        *why = "pads are not all zero";
        return KF_OK;
    }
    return forward(m, node, n->in[0], applied, why);
}

/* Slice(x) -> x when, on every sliced axis, it starts at 0, steps forward
 * and reaches the end (a step over a dim of 1 also keeps its one element). */
static const char *slice_takes_all(const kf_model *m, const kf_node *n) {
    const kf_graph *g = m->graph;
    const kf_type *x = n->in[0] ? &g->values[n->in[0]].type : NULL;
    int64_t *starts = NULL, *ends = NULL, *axes = NULL, *steps = NULL;
    int64_t ns = 0, ne = 0, na = 0, nst = 0;
    const char *why = NULL;
    if (!int_list(m, n, 1, "starts", 10, &starts, &ns, &why) || !int_list(m, n, 2, "ends", 10, &ends, &ne, &why) ||
        !int_list(m, n, 3, "axes", 10, &axes, &na, &why) || !int_list(m, n, 4, "steps", 10, &steps, &nst, &why))
        goto done;
    if (!starts || !ends || ns != ne || (axes && na != ns) || (steps && nst != ns)) {
        why = "starts, ends, axes and steps do not line up";
        goto done;
    }
    for (int64_t i = 0; i < ns; i++) {
        int64_t axis = axes ? axes[i] : i;
        if (axis < 0) axis += x ? x->rank : 0;
        if (!x || x->rank < 0 || axis < 0 || axis >= x->rank) {
            why = "the input's rank is unknown or an axis is out of range";
            goto done;
        }
        int64_t dim = x->dims[axis], s = starts[i], e = ends[i], step = steps ? steps[i] : 1;
        if (step <= 0) {
            why = "a step is not positive";
            goto done;
        }
        if (!(s == 0 || (dim >= 0 && s <= -dim))) {
            why = "a start is not 0";
            goto done;
        }
        if (!(e == INT64_MAX || (dim >= 0 && e >= dim))) {
            why = "an end stops before the dim";
            goto done;
        }
        if (step != 1 && !(dim >= 0 && dim <= 1)) {
            why = "a step skips elements";
            goto done;
        }
    }
done:
    kf_free(starts);
    kf_free(ends);
    kf_free(axes);
    kf_free(steps);
    return why;
}

static kf_status remove_full_slice(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    const kf_node *n = &m->graph->nodes[node];
    if ((*why = slice_takes_all(m, n)))
        return *why == int_list_oom ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    return forward(m, node, n->in[0], applied, why);
}

kf_status kf_pass_noop_rules(kf_ruleset *rs) {
    static const struct {
        const char *name, *op;
        kf_rule_fn fn;
    } rules[] = {
        {"remove_identity", "Identity", remove_identity},
        {"remove_inference_dropout", "Dropout", remove_inference_dropout},
        {"remove_cast_to_same_type", "Cast", remove_cast_to_same_type},
        {"remove_castlike_to_same_type", "CastLike", remove_cast_to_same_type},
        {"remove_reshape_to_same_shape", "Reshape", remove_same_shape_op},
        {"remove_noop_squeeze", "Squeeze", remove_same_shape_op},
        {"remove_noop_unsqueeze", "Unsqueeze", remove_same_shape_op},
        {"remove_noop_flatten", "Flatten", remove_same_shape_op},
        {"remove_noop_expand", "Expand", remove_same_shape_op},
        {"remove_noop_tile", "Tile", remove_same_shape_op},
        {"remove_single_output_split", "Split", remove_same_shape_op},
        {"remove_single_input_concat", "Concat", remove_single_input_concat},
        {"remove_identity_transpose", "Transpose", remove_identity_transpose},
        {"remove_zero_pad", "Pad", remove_zero_pad},
        {"remove_full_slice", "Slice", remove_full_slice},
        {"gather_arange_to_reshape", "Gather", gather_arange_to_reshape},
    };
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        KF_TRY(kf_rules_add_callback(rs, rules[i].name, rules[i].op, rules[i].fn, NULL));
    return KF_OK;
}
