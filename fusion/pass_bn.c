/*
 * pass_bn.c: folds a per-output-channel affine epilogue, y' = y * s[c] + t[c],
 * into the weights of the anchor op that computes y. Epilogues: a
 * BatchNormalization in inference form, a Mul by a constant and (for convs)
 * an Add of a constant, each broadcasting per output channel, also when the
 * constant reaches them through Unsqueeze/Reshape. Anchors: Conv,
 * ConvTranspose, Gemm and MatMul with constant weights. New weights and
 * biases are computed in double, stored in the weight's dtype as new
 * initializers; old ones fall to dead-code elimination once nothing reads
 * them. A BatchNormalization in inference form that no anchor absorbs
 * becomes a Mul and an Add by per-channel constants computed here, so it
 * fuses as elementwise ops. Node-local C-callback rules, registered through
 * passes.def.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"

typedef enum anchor_kind { A_CONV = 1 << 0, A_CONVT = 1 << 1, A_GEMM = 1 << 2, A_MATMUL = 1 << 3 } anchor_kind;

/* The op computing y, and what its output channels are. */
typedef struct anchor {
    anchor_kind kind;
    kf_id node, y;
    kf_id w, b;          /* weight and bias values; b 0 when absent */
    kf_tensor wv, bv;    /* views of their data (not owned); bv.data NULL when absent */
    int64_t cout;        /* output channels */
    int chan_axis, out_rank;
    int64_t group;       /* ConvTranspose */
    bool trans_b;        /* Gemm */
} anchor;

/* y' = y * s[c] + t[c]; the arrays hold cout entries and are owned. */
typedef struct affine {
    double *s, *t;
    bool scales, shifts; /* some s != 1, some t != 0 */
} affine;

/* One rule: which epilogue op it starts from and which anchors it folds into. */
typedef struct rule_spec {
    kf_op epilogue;
    unsigned anchors;
} rule_spec;

/* Ops whose output holds the input's elements in the same order. */
static bool same_elements_op(kf_op op) {
    return op == KF_OP_UNSQUEEZE || op == KF_OP_SQUEEZE || op == KF_OP_RESHAPE || op == KF_OP_FLATTEN ||
           op == KF_OP_IDENTITY;
}

/* Longest Unsqueeze/Reshape chain looked through to reach a constant; real
 * exporters write one or two. */
#define CONST_CHAIN_MAX 8

/* Causes const_view gives; "why" strings below are built from them. */
static const char NOT_CONST[] = "is not a constant";
static const char OVERRIDABLE[] = "is an initializer the caller may override (a graph input, IR version >= 4)";

/* Near-miss reasons of two parts live here until the driver copies them. */
static _Thread_local char why_buf[192];
static const char *because(const char *what, const char *cause) {
    snprintf(why_buf, sizeof why_buf, "%s %s", what, cause);
    return why_buf;
}

/* The data of constant v without copying (*out is a view, not owned): an
 * initializer the caller cannot override, a Constant node's value, or
 * either reshaped by a chain of same-element ops, in which case the view
 * takes v's inferred static shape. Returns NULL, or NOT_CONST / OVERRIDABLE. */
static const char *const_view(const kf_model *m, kf_id v, kf_tensor *out) {
    const kf_graph *g = m->graph;
    const kf_type *outer = &g->values[v].type;
    const kf_tensor *t = NULL;
    for (int depth = 0; v && depth < CONST_CHAIN_MAX && !t; depth++) {
        const kf_value *x = &g->values[v];
        if (x->init) {
            if (x->is_input && m->ir_version >= 4) return OVERRIDABLE;
            t = x->init;
            break;
        }
        const kf_node *n = x->producer ? &g->nodes[x->producer] : NULL;
        if (n && n->op == KF_OP_CONSTANT) t = kf_attr_t(n, "value");
        else if (n && same_elements_op(n->op) && n->nin >= 1) v = n->in[0];
        else return NOT_CONST;
    }
    if (!t || (!t->data && t->numel)) return NOT_CONST;
    *out = *t;
    if (outer->rank != t->rank || memcmp(outer->dims, t->dims, sizeof(int64_t) * (size_t)t->rank)) {
        int64_t numel = 1;
        if (!kf_type_is_static(outer) || outer->dtype != t->dtype) return NOT_CONST;
        for (int d = 0; d < outer->rank; d++)
            if (!kf_mul_ok(numel, outer->dims[d], &numel)) return NOT_CONST;
        if (numel != t->numel) return NOT_CONST;
        out->rank = outer->rank;
        memcpy(out->dims, outer->dims, sizeof(int64_t) * (size_t)outer->rank);
    }
    return NULL;
}

/* ---- anchors ------------------------------------------------------------------------ */

static anchor_kind kind_of(kf_op op) {
    switch (op) {
    case KF_OP_CONV: return A_CONV;
    case KF_OP_CONV_TRANSPOSE: return A_CONVT;
    case KF_OP_GEMM: return A_GEMM;
    case KF_OP_MATMUL: return A_MATMUL;
    default: return 0;
    }
}

/* The anchor producing y when it is of a kind in mask; 0 otherwise. */
static kf_id anchor_node(const kf_graph *g, kf_id y, unsigned mask) {
    kf_id p = y ? g->values[y].producer : 0;
    return p && !g->nodes[p].dead && (kind_of(g->nodes[p].op) & mask) ? p : 0;
}

/* Fills *a for the anchor producing y, or returns why its weights cannot
 * absorb an epilogue. */
static const char *read_anchor(const kf_model *m, kf_id node, anchor *a) {
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    memset(a, 0, sizeof *a);
    a->kind = kind_of(n->op);
    a->node = node;
    a->y = n->out[0];
    const kf_value *y = &g->values[a->y];
    if (y->is_output) return "the anchor's output is a graph output";
    if (y->nusers != 1) return "the anchor's output has other consumers";
    if (n->nin < 2 || !n->in[0] || !n->in[1]) return "the anchor has no weight input";
    a->w = n->in[1];
    const char *c;
    if ((c = const_view(m, a->w, &a->wv))) return because("the weight", c);
    if (!kf_dtype_is_float(a->wv.dtype)) return "the weight is not floating point";
    if (a->wv.numel <= 0) return "the weight is empty";
    if (n->nin > 2 && n->in[2]) {
        a->b = n->in[2];
        if ((c = const_view(m, a->b, &a->bv))) return because("the bias", c);
        if (!kf_dtype_is_float(a->bv.dtype)) return "the bias is not floating point";
    }
    a->out_rank = y->type.rank;
    a->chan_axis = 1;
    switch (a->kind) {
    case A_CONV:
        if (a->wv.rank < 3) return "the conv weight has rank below 3";
        a->cout = a->wv.dims[0];
        break;
    case A_CONVT:
        if (a->wv.rank < 3) return "the conv weight has rank below 3";
        a->group = kf_attr_i(n, "group", 1);
        if (a->group <= 0 || a->wv.dims[0] % a->group) return "the group does not divide the input channels";
        if (!kf_mul_ok(a->group, a->wv.dims[1], &a->cout)) return "the output channel count overflows";
        break;
    case A_GEMM:
        if (n->opset < 7) return "Gemm before opset 7 broadcasts C only through an attribute";
        if (a->wv.rank != 2) return "the Gemm weight is not 2-D";
        a->trans_b = kf_attr_i(n, "transB", 0) != 0;
        a->cout = a->wv.dims[a->trans_b ? 0 : 1];
        if (a->b && a->bv.rank > 2) return "C has rank above 2";
        if (a->b && a->bv.rank >= 1 && a->bv.dims[a->bv.rank - 1] != 1 && a->bv.dims[a->bv.rank - 1] != a->cout)
            return "C does not broadcast to the output columns";
        break;
    case A_MATMUL:
        if (a->wv.rank != 2) return "the MatMul weight is not 2-D";
        if (a->out_rank < 1) return "the MatMul output rank is unknown";
        a->cout = a->wv.dims[1];
        a->chan_axis = a->out_rank - 1;
        break;
    }
    if (a->cout <= 0) return "the anchor has no output channels";
    if (a->out_rank <= a->chan_axis) return "the anchor's output rank is unknown";
    if ((a->kind & (A_CONV | A_CONVT)) && a->b && a->bv.numel != a->cout)
        return "the conv bias does not hold one value per output channel";
    return NULL;
}

/* ---- epilogues ----------------------------------------------------------------------- */

static void affine_free(affine *f) {
    kf_free(f->s);
    kf_free(f->t);
    f->s = f->t = NULL;
}

static kf_status affine_alloc(affine *f, int64_t cout) {
    f->s = kf_calloc((size_t)cout, sizeof(double));
    f->t = kf_calloc((size_t)cout, sizeof(double));
    f->scales = f->shifts = false;
    if (!f->s || !f->t) {
        affine_free(f);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (int64_t c = 0; c < cout; c++) f->s[c] = 1;
    return KF_OK;
}

/* True when k broadcasts per channel of the anchor's output: rank at most
 * the output's, every dim 1 except, at the channel axis, 1 or cout. */
static bool per_channel(const anchor *a, const kf_tensor *k) {
    if (k->rank > a->out_rank) return false;
    for (int i = 0; i < k->rank; i++) {
        int axis = i + a->out_rank - k->rank;
        if (k->dims[i] != 1 && !(axis == a->chan_axis && k->dims[i] == a->cout)) return false;
    }
    return true;
}

/* The value channel c reads from a per-channel constant. */
static double channel_value(const kf_tensor *k, int64_t c) { return kf_get_f64(k, k->numel == 1 ? 0 : c); }

/* Why BatchNormalization e is not in inference form over channels, or NULL. */
static const char *bn_inference_form(const kf_node *e) {
    if (e->nin < 5) return "BatchNormalization has fewer than five inputs";
    for (int j = 1; j < e->nout; j++)
        if (e->out[j]) return "BatchNormalization computes running statistics (training form)";
    if (e->opset >= 14 && kf_attr_i(e, "training_mode", 0) != 0) return "BatchNormalization is in training mode";
    if (e->opset < 7 && kf_attr_i(e, "is_test", 0) == 0) return "BatchNormalization is in training mode (is_test = 0)";
    if (e->opset < 9 && kf_attr_i(e, "spatial", 1) == 0) return "BatchNormalization is not spatial";
    return NULL;
}

/* BatchNormalization at node e reading the anchor's output: s = scale /
 * sqrt(var + epsilon), t = B - mean * s (inference form only). */
static const char *read_batchnorm(const kf_model *m, const kf_node *e, const anchor *a, affine *f,
                                  kf_status *st) {
    const char *why = bn_inference_form(e);
    if (why) return why;
    if (a->chan_axis != 1) return "BatchNormalization normalises axis 1, which is not the MatMul's output columns";
    kf_tensor p[4];
    static const char *const names[4] = {"BatchNormalization scale", "BatchNormalization B",
                                         "BatchNormalization mean", "BatchNormalization var"};
    for (int i = 0; i < 4; i++) {
        const char *c = e->in[i + 1] ? const_view(m, e->in[i + 1], &p[i]) : NOT_CONST;
        if (c) return because(names[i], c);
        if (!kf_dtype_is_float(p[i].dtype)) return "BatchNormalization parameters are not floating point";
        if (p[i].numel != a->cout) return "BatchNormalization parameters do not hold one value per output channel";
    }
    double eps = kf_attr_f(e, "epsilon", 1e-5f);
    if (!(eps >= 0)) return "BatchNormalization epsilon is negative";
    for (int64_t c = 0; c < a->cout; c++)
        if (!(kf_get_f64(&p[3], c) + eps > 0)) return "BatchNormalization variance plus epsilon is not positive";
    if ((*st = affine_alloc(f, a->cout))) return "out of memory";
    for (int64_t c = 0; c < a->cout; c++) {
        double s = kf_get_f64(&p[0], c) / sqrt(kf_get_f64(&p[3], c) + eps);
        f->s[c] = s;
        f->t[c] = kf_get_f64(&p[1], c) - kf_get_f64(&p[2], c) * s;
    }
    f->scales = f->shifts = true;
    return NULL;
}

/* Mul or Add of the anchor's output by constant k. */
static const char *read_binary(const kf_model *m, const kf_node *e, const anchor *a, kf_id kid, affine *f,
                               kf_status *st) {
    if (e->opset < 7 && kf_attr_i(e, "broadcast", 0) != 0) return "legacy broadcast attribute (opset < 7)";
    kf_tensor k;
    const char *c = const_view(m, kid, &k);
    if (c) return because("the other operand", c);
    if (k.dtype != m->graph->values[a->y].type.dtype) return "the constant's dtype differs from the anchor's";
    if (!per_channel(a, &k)) return "the constant does not broadcast per output channel";
    if ((*st = affine_alloc(f, a->cout))) return "out of memory";
    bool mul = e->op == KF_OP_MUL;
    for (int64_t c = 0; c < a->cout; c++) {
        double v = channel_value(&k, c);
        if (mul) f->s[c] = v;
        else f->t[c] = v;
    }
    f->scales = mul;
    f->shifts = !mul;
    return NULL;
}

/* ---- the rewrite ------------------------------------------------------------------------ */

/* Output channel that weight element i belongs to. */
static int64_t weight_channel(const anchor *a, int64_t i) {
    const kf_tensor *w = &a->wv;
    switch (a->kind) {
    case A_CONV: return i / (w->numel / w->dims[0]);
    case A_CONVT: {
        /* W is (C_in, C_out / group, k...); input channel ci is in group ci / (C_in / group) */
        int64_t per = w->numel / (w->dims[0] * w->dims[1]);
        int64_t ci = i / (w->dims[1] * per), j = (i / per) % w->dims[1];
        return ci / (w->dims[0] / a->group) * w->dims[1] + j;
    }
    case A_GEMM: return a->trans_b ? i / w->dims[1] : i % w->dims[1];
    case A_MATMUL: return i % w->dims[1];
    }
    return 0;
}

/* New weight: W scaled per output channel, in W's dtype. *id gets it. */
static kf_status scaled_weight(kf_model *m, const anchor *a, const affine *f, kf_id *id) {
    kf_tensor *w = kf_tensor_new();
    if (!w) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_copy(w, &a->wv);
    if (st) {
        kf_tensor_free(w);
        return st;
    }
    for (int64_t i = 0; i < w->numel; i++) kf_set_f64(w, i, kf_get_f64(w, i) * f->s[weight_channel(a, i)]);
    return kf_graph_add_constant(m->graph, m->graph->values[a->w].name, w, id);
}

/* New conv bias b * s + t (b = 0 when absent), shape [cout]. */
static kf_status conv_bias(kf_model *m, const anchor *a, const affine *f, kf_id *id) {
    kf_tensor *b = kf_tensor_new();
    if (!b) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(b, a->b ? a->bv.dtype : a->wv.dtype, 1, &a->cout);
    if (st) {
        kf_tensor_free(b);
        return st;
    }
    for (int64_t c = 0; c < a->cout; c++)
        kf_set_f64(b, c, (a->b ? kf_get_f64(&a->bv, c) : 0.0) * f->s[c] + f->t[c]);
    return kf_graph_add_constant(m->graph, a->b ? m->graph->values[a->b].name : "bias", b, id);
}

/* New Gemm C = beta * C * s + t, shape [R, cout] when C has R > 1 rows,
 * else [cout]. */
static kf_status gemm_bias(kf_model *m, const anchor *a, const affine *f, kf_id *id) {
    const kf_node *n = &m->graph->nodes[a->node];
    double beta = kf_attr_f(n, "beta", 1.0f);
    const kf_tensor *c = a->b ? &a->bv : NULL;
    int64_t rows = c && c->rank == 2 ? c->dims[0] : 1;
    int64_t dims[2] = {rows, a->cout};
    kf_tensor *b = kf_tensor_new();
    if (!b) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(b, c ? c->dtype : a->wv.dtype, rows > 1 ? 2 : 1, rows > 1 ? dims : dims + 1);
    if (st) {
        kf_tensor_free(b);
        return st;
    }
    int64_t cs = c && c->rank >= 1 && c->dims[c->rank - 1] != 1; /* 1 when C varies along columns */
    int64_t cn = c && c->rank >= 1 ? c->dims[c->rank - 1] : 1;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < a->cout; k++) {
            double v = c ? beta * kf_get_f64(c, r * cn + k * cs) : 0.0;
            kf_set_f64(b, r * a->cout + k, v * f->s[k] + f->t[k]);
        }
    return kf_graph_add_constant(m->graph, a->b ? m->graph->values[a->b].name : "C", b, id);
}

/* Adds a node like `like` (op, domain, attributes) with the given inputs
 * and one fresh output named after base; infers its type. */
static kf_status clone_node(kf_model *m, kf_id like, const kf_id *in, int nin, const char *base, kf_id *node,
                            kf_id *out) {
    kf_graph *g = m->graph;
    KF_TRY(kf_graph_fresh_value(g, base, out));
    const kf_node *src = &g->nodes[like];
    KF_TRY(kf_graph_add_node(g, src->op_type, src->domain, src->name, in, nin, out, 1, node));
    kf_node *n = &g->nodes[*node];
    src = &g->nodes[like];
    n->op = src->op;
    n->opset = src->opset;
    for (int i = 0; i < src->nattrs; i++) KF_TRY(kf_node_add_attr(n, &src->attrs[i]));
    return KF_OK;
}

/* Sets float attribute name of node to v (adding it when absent). */
static kf_status set_float_attr(kf_node *n, const char *name, float v) {
    for (int i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].name, name) && n->attrs[i].type == KF_ATTR_FLOAT) {
            n->attrs[i].f = v;
            return KF_OK;
        }
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_FLOAT, .f = v};
    return kf_node_add_attr(n, &a);
}

/* Replaces anchor + epilogue e by the anchor with folded weights (and, for
 * MatMul with a shift, an Add of the shift). */
static kf_status fold(kf_model *m, const anchor *a, kf_id e, const affine *f) {
    kf_graph *g = m->graph;
    kf_id e_out = g->nodes[e].out[0];
    kf_id w = a->w, b = a->b;
    if (f->scales) KF_TRY(scaled_weight(m, a, f, &w));
    bool need_bias = (a->kind & (A_CONV | A_CONVT | A_GEMM)) && (f->shifts || (a->b && f->scales));
    if (need_bias) KF_TRY(a->kind == A_GEMM ? gemm_bias(m, a, f, &b) : conv_bias(m, a, f, &b));
    const kf_node *an = &g->nodes[a->node];
    kf_id in[3] = {an->in[0], w, b};
    int nin = b ? 3 : 2;
    kf_id node, out;
    char base[256];
    bool add_after = a->kind == A_MATMUL && f->shifts;
    snprintf(base, sizeof base, "%s%s", g->values[e_out].name, add_after ? "_matmul" : "");
    KF_TRY(clone_node(m, a->node, in, nin, base, &node, &out));
    if (need_bias && a->kind == A_GEMM) KF_TRY(set_float_attr(&g->nodes[node], "beta", 1.0f));
    KF_TRY(kf_infer_node(m, node));
    if (add_after) {
        kf_tensor *t = kf_tensor_new();
        if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_status st = kf_tensor_alloc(t, a->wv.dtype, 1, &a->cout);
        if (st) {
            kf_tensor_free(t);
            return st;
        }
        for (int64_t c = 0; c < a->cout; c++) kf_set_f64(t, c, f->t[c]);
        kf_id tid, add_in[2], add_out, add;
        KF_TRY(kf_graph_add_constant(g, "bias", t, &tid));
        add_in[0] = out;
        add_in[1] = tid;
        KF_TRY(kf_graph_fresh_value(g, g->values[e_out].name, &add_out));
        KF_TRY(kf_graph_add_node(g, "Add", "", g->nodes[e].name, add_in, 2, &add_out, 1, &add));
        g->nodes[add].op = KF_OP_ADD;
        g->nodes[add].opset = kf_model_opset(m, "");
        KF_TRY(kf_infer_node(m, add));
        out = add_out;
    }
    KF_TRY(kf_graph_replace_uses(g, e_out, out));
    kf_graph_remove_node(g, e);
    kf_graph_remove_node(g, a->node);
    return KF_OK;
}

/* The callback of every rule here: e is the epilogue; spec says which
 * anchors this rule folds into. Declines silently when no operand comes
 * from such an anchor (another rule's business). */
static kf_status fold_epilogue(kf_model *m, kf_id e, void *user, bool *applied, const char **why) {
    const rule_spec *spec = user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[e];
    *applied = false;
    if (n->nin < 1 || !n->out[0]) return KF_OK;
    kf_id an = 0, other = 0;
    if (spec->epilogue == KF_OP_BATCH_NORMALIZATION) {
        an = anchor_node(g, n->in[0], spec->anchors);
    } else if (n->nin == 2) {
        int orders = kf_op_get(n->op)->flags & KF_F_COMMUTATIVE ? 2 : 1;
        for (int i = 0; i < orders && !an; i++)
            if ((an = anchor_node(g, n->in[i], spec->anchors))) other = n->in[1 - i];
    }
    if (!an) return KF_OK;
    anchor a;
    if ((*why = read_anchor(m, an, &a))) return KF_OK;
    affine f = {0};
    kf_status st = KF_OK;
    *why = spec->epilogue == KF_OP_BATCH_NORMALIZATION ? read_batchnorm(m, n, &a, &f, &st)
                                                        : read_binary(m, n, &a, other, &f, &st);
    if (!st && !*why) {
        st = fold(m, &a, e, &f);
        *applied = !st;
    }
    affine_free(&f);
    return st;
}

/* ---- BatchNormalization on its own ------------------------------------------------
 *
 * An inference BatchNormalization that no anchor absorbs becomes
 * x * s[c] + t[c] with s and t computed once here, in double, as constants of
 * x's dtype shaped [C, 1, ..., 1] so they broadcast along axis 1: two
 * elementwise ops that fuse with their neighbours. */


/* Adds constant `base` of dtype dt and shape [C, 1 x (rank - 2)] holding v. */
static kf_status channel_constant(kf_graph *g, const char *base, kf_dtype dt, int rank, int64_t C, const double *v,
                                  kf_id *id) {
    int64_t dims[KF_MAX_RANK];
    dims[0] = C;
    for (int d = 1; d < rank - 1; d++) dims[d] = 1;
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, dt, rank > 1 ? rank - 1 : 1, dims);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    for (int64_t c = 0; c < C; c++) kf_set_f64(t, c, v[c]);
    return kf_graph_add_constant(g, base, t, id);
}

/* Adds `op`(a, b) named after node e, output named after base; infers it. */
static kf_status binary_node(kf_model *m, const char *op, kf_op code, kf_id e, kf_id a, kf_id b, const char *base,
                             kf_id *out) {
    kf_graph *g = m->graph;
    kf_id in[2] = {a, b}, node;
    KF_TRY(kf_graph_fresh_value(g, base, out));
    KF_TRY(kf_graph_add_node(g, op, "", g->nodes[e].name, in, 2, out, 1, &node));
    g->nodes[node].op = code;
    g->nodes[node].opset = kf_model_opset(m, "");
    return kf_infer_node(m, node);
}

/* Adds `op`(a) named after node e; infers it. */
static kf_status unary_node(kf_model *m, const char *op, kf_op code, kf_id e, kf_id a, const char *base, kf_id *out) {
    kf_graph *g = m->graph;
    kf_id node;
    KF_TRY(kf_graph_fresh_value(g, base, out));
    KF_TRY(kf_graph_add_node(g, op, "", g->nodes[e].name, &a, 1, out, 1, &node));
    g->nodes[node].op = code;
    g->nodes[node].opset = kf_model_opset(m, "");
    return kf_infer_node(m, node);
}

/* Parameter p of one value per channel as [C, 1 x (rank - 2)] (itself for
 * rank 2), so it broadcasts along axis 1. */
static kf_status channel_view(kf_model *m, kf_id e, kf_id p, int rank, kf_id *out) {
    if (rank <= 2) {
        *out = p;
        return KF_OK;
    }
    kf_graph *g = m->graph;
    int64_t dims[1] = {rank - 1};
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_INT64, 1, dims);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    kf_set_i64(t, 0, -1);
    for (int d = 1; d < rank - 1; d++) kf_set_i64(t, d, 1);
    kf_id shp, in[2], node;
    KF_TRY(kf_graph_add_constant(g, "bn_channel_shape", t, &shp));
    in[0] = p;
    in[1] = shp;
    char base[272];
    snprintf(base, sizeof base, "%s_channels", g->values[p].name);
    KF_TRY(kf_graph_fresh_value(g, base, out));
    KF_TRY(kf_graph_add_node(g, "Reshape", "", g->nodes[e].name, in, 2, out, 1, &node));
    g->nodes[node].op = KF_OP_RESHAPE;
    g->nodes[node].opset = kf_model_opset(m, "");
    return kf_infer_node(m, node);
}

/* The run-time form: (x - mean) * (scale / sqrt(var + eps)) + B, each
 * parameter seen as [C, 1, ...]; elementwise ops with broadcasting. */
static kf_status bn_elementwise(kf_model *m, kf_id e, const char **why, bool *applied) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[e];
    kf_id x = n->in[0], y = n->out[0], prm[4];
    const kf_type *xt = &g->values[x].type;
    int rank = xt->rank;
    kf_dtype dt = xt->dtype;
    for (int i = 0; i < 4; i++) {
        prm[i] = n->in[i + 1];
        const kf_type *pt = &g->values[prm[i]].type;
        if (pt->dtype != dt || pt->rank != 1) {
            *why = "BatchNormalization parameters computed at run time are not 1-D of the input's dtype";
            return KF_OK;
        }
    }
    double eps = kf_attr_f(n, "epsilon", 1e-5f);
    if (!(eps >= 0)) {
        *why = "BatchNormalization epsilon is negative";
        return KF_OK;
    }
    kf_tensor *et = kf_tensor_new();
    if (!et) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(et, dt, 0, NULL);
    if (st) {
        kf_tensor_free(et);
        return st;
    }
    kf_set_f64(et, 0, eps);
    char base[256], part[288];
    snprintf(base, sizeof base, "%s", g->values[y].name);
    kf_id eid, v[4], ve, sd, sc, xc, xs, out;
    KF_TRY(kf_graph_add_constant(g, "bn_epsilon", et, &eid));
    for (int i = 0; i < 4; i++) KF_TRY(channel_view(m, e, prm[i], rank, &v[i]));
    snprintf(part, sizeof part, "%s_var_eps", base);
    KF_TRY(binary_node(m, "Add", KF_OP_ADD, e, v[3], eid, part, &ve));
    snprintf(part, sizeof part, "%s_std", base);
    KF_TRY(unary_node(m, "Sqrt", KF_OP_SQRT, e, ve, part, &sd));
    snprintf(part, sizeof part, "%s_scale", base);
    KF_TRY(binary_node(m, "Div", KF_OP_DIV, e, v[0], sd, part, &sc));
    snprintf(part, sizeof part, "%s_centred", base);
    KF_TRY(binary_node(m, "Sub", KF_OP_SUB, e, x, v[2], part, &xc));
    snprintf(part, sizeof part, "%s_scaled", base);
    KF_TRY(binary_node(m, "Mul", KF_OP_MUL, e, xc, sc, part, &xs));
    KF_TRY(binary_node(m, "Add", KF_OP_ADD, e, xs, v[1], base, &out));
    KF_TRY(kf_graph_replace_uses(g, y, out));
    kf_graph_remove_node(g, e);
    *applied = true;
    return KF_OK;
}

/* batchnorm(x, scale, B, mean, var) -> add(mul(x, s), t), s = scale / sqrt(var + eps), t = B - mean * s */
static kf_status bn_to_mul_add(kf_model *m, kf_id e, void *user, bool *applied, const char **why) {
    (void)user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[e];
    *applied = false;
    if (n->nin < 1 || !n->in[0] || !n->out[0]) return KF_OK;
    if ((*why = bn_inference_form(n))) return KF_OK;
    /* an anchor that takes it folds it into its weights instead */
    kf_id an = anchor_node(g, n->in[0], A_CONV | A_CONVT | A_GEMM | A_MATMUL);
    if (an) {
        anchor a;
        affine f = {0};
        kf_status st = KF_OK;
        bool folds = !read_anchor(m, an, &a) && !read_batchnorm(m, n, &a, &f, &st);
        affine_free(&f);
        if (st) return st;
        if (folds) {
            *why = "the BatchNormalization folds into its anchor";
            return KF_OK;
        }
    }
    if (kf_model_opset(m, "") < 7) {
        *why = "Mul and Add broadcast numpy-style only from opset 7";
        return KF_OK;
    }
    const kf_type *xt = &g->values[n->in[0]].type;
    if (xt->rank < 2) {
        *why = "BatchNormalization input rank is unknown or below 2";
        return KF_OK;
    }
    if (!kf_dtype_is_float(xt->dtype)) {
        *why = "BatchNormalization input is not floating point";
        return KF_OK;
    }
    kf_tensor p[4];
    static const char *const names[4] = {"BatchNormalization scale", "BatchNormalization B",
                                         "BatchNormalization mean", "BatchNormalization var"};
    int64_t C = xt->dims[1];
    for (int i = 0; i < 4; i++)
        if (!n->in[i + 1]) {
            *why = because(names[i], NOT_CONST);
            return KF_OK;
        }
    for (int i = 0; i < 4; i++) {
        if (const_view(m, n->in[i + 1], &p[i])) return bn_elementwise(m, e, why, applied);
        if (!kf_dtype_is_float(p[i].dtype)) {
            *why = "BatchNormalization parameters are not floating point";
            return KF_OK;
        }
        if (C < 0) C = p[i].numel;
        if (p[i].numel != C || C <= 0) {
            *why = "BatchNormalization parameters do not hold one value per channel";
            return KF_OK;
        }
    }
    double eps = kf_attr_f(n, "epsilon", 1e-5f);
    if (!(eps >= 0)) {
        *why = "BatchNormalization epsilon is negative";
        return KF_OK;
    }
    for (int64_t c = 0; c < C; c++)
        if (!(kf_get_f64(&p[3], c) + eps > 0)) {
            *why = "BatchNormalization variance plus epsilon is not positive";
            return KF_OK;
        }
    affine f = {0};
    KF_TRY(affine_alloc(&f, C));
    for (int64_t c = 0; c < C; c++) {
        f.s[c] = kf_get_f64(&p[0], c) / sqrt(kf_get_f64(&p[3], c) + eps);
        f.t[c] = kf_get_f64(&p[1], c) - kf_get_f64(&p[2], c) * f.s[c];
    }
    kf_id x = n->in[0], y = n->out[0], sid, tid, mul_out, add_out;
    kf_dtype dt = xt->dtype;
    int rank = xt->rank;
    char base[256];
    snprintf(base, sizeof base, "%s", g->values[y].name);
    kf_status st = channel_constant(g, "bn_scale", dt, rank, C, f.s, &sid);
    if (!st) st = channel_constant(g, "bn_shift", dt, rank, C, f.t, &tid);
    affine_free(&f);
    KF_TRY(st);
    char mbase[272];
    snprintf(mbase, sizeof mbase, "%s_scaled", base);
    KF_TRY(binary_node(m, "Mul", KF_OP_MUL, e, x, sid, mbase, &mul_out));
    KF_TRY(binary_node(m, "Add", KF_OP_ADD, e, mul_out, tid, base, &add_out));
    KF_TRY(kf_graph_replace_uses(g, y, add_out));
    kf_graph_remove_node(g, e);
    *applied = true;
    return KF_OK;
}

static const rule_spec bn_conv = {KF_OP_BATCH_NORMALIZATION, A_CONV};
static const rule_spec bn_convt = {KF_OP_BATCH_NORMALIZATION, A_CONVT};
static const rule_spec bn_gemm = {KF_OP_BATCH_NORMALIZATION, A_GEMM};
static const rule_spec bn_matmul = {KF_OP_BATCH_NORMALIZATION, A_MATMUL};
static const rule_spec mul_any = {KF_OP_MUL, A_CONV | A_CONVT | A_GEMM | A_MATMUL};
static const rule_spec add_conv = {KF_OP_ADD, A_CONV | A_CONVT};

kf_status kf_pass_bn_rules(kf_ruleset *rs) {
    /* batchnorm(conv(x, W, b)) -> conv(x, W * s, (b - mean) * s + beta), s = scale / sqrt(var + eps) */
    KF_TRY(kf_rules_add_callback(rs, "fold_batchnorm_into_conv", "BatchNormalization", fold_epilogue, (void *)&bn_conv));
    /* batchnorm(conv_transpose(x, W, b)) -> conv_transpose(x, W * s, (b - mean) * s + beta) */
    KF_TRY(kf_rules_add_callback(rs, "fold_batchnorm_into_conv_transpose", "BatchNormalization", fold_epilogue,
                                 (void *)&bn_convt));
    /* batchnorm(gemm(a, B, C)) -> gemm(a, B * s, (beta_g * C - mean) * s + beta), on B's columns */
    KF_TRY(kf_rules_add_callback(rs, "fold_batchnorm_into_gemm", "BatchNormalization", fold_epilogue, (void *)&bn_gemm));
    /* batchnorm(matmul(a, B)) -> add(matmul(a, B * s), beta - mean * s), a of rank 2 */
    KF_TRY(kf_rules_add_callback(rs, "fold_batchnorm_into_matmul", "BatchNormalization", fold_epilogue,
                                 (void *)&bn_matmul));
    /* mul(anchor(x, W, b), k[c]) -> anchor(x, W * k[c], b * k[c]), k per output channel */
    KF_TRY(kf_rules_add_callback(rs, "fold_channel_mul_into_weights", "Mul", fold_epilogue, (void *)&mul_any));
    /* add(conv(x, W, b), k[c]) -> conv(x, W, b + k[c]), k per output channel */
    KF_TRY(kf_rules_add_callback(rs, "fold_bias_add_into_conv", "Add", fold_epilogue, (void *)&add_conv));
    /* batchnorm(x, scale, B, mean, var) -> add(mul(x, s[c]), t[c]) when no anchor absorbs it */
    KF_TRY(kf_rules_add_callback(rs, "batchnorm_to_mul_add", "BatchNormalization", bn_to_mul_add, NULL));
    return KF_OK;
}
