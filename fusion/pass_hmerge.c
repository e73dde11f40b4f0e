/*
 * pass_hmerge.c: horizontal merge of sibling matrix products. MatMuls (or
 * Gemms) that read the same input A with constant 2-D weights become one
 * product whose weights are concatenated once along N, then a Split whose
 * outputs take over the old results. When every MatMul sibling is followed
 * by an Add of a constant per-column bias, the biases are concatenated too
 * and one Add runs before the Split. Typical source: the Q/K/V projections
 * of attention. Node-local C-callback rules registered through passes.def.
 *
 * Weights may also be DequantizeLinears of constants (a QDQ model kept
 * quantized, as an int8 plan keeps it): the quantized weights are
 * concatenated, their scales and zero points become one per column (or
 * stay one per tensor where every sibling has the same), so the merged
 * DequantizeLinear gives exactly the siblings' float weights side by side
 * and pass_qint turns the one product into one integer anchor.
 *
 * For a model that is saved next (kfuse opt), a large merged weight keeps
 * the siblings' weights as its parts (kf_graph.defer_concat_bytes,
 * kf_tensor_concat_deferred): the save writes them side by side straight
 * into the file, so the merged bytes are never assembled in memory. For
 * BERT-base that is 85 MB not copied.
 *
 *      A ──┬─ MatMul(·, Wq) ─ Add(bq) ─▶ q          A ─ MatMul(·, [Wq Wk Wv])
 *          ├─ MatMul(·, Wk) ─ Add(bk) ─▶ k    =>     ─ Add([bq bk bv]) ─ Split ─▶ q, k, v
 *          └─ MatMul(·, Wv) ─ Add(bv) ─▶ v
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_opt.h"

/* Siblings merged at once; attention has 3 and a fan-out far past this is
 * unusual enough that leaving it alone costs nothing real. */
#define HMERGE_MAX_SIBLINGS 64

typedef struct sibling {
    kf_id node;
    const kf_tensor *w;    /* constant weight (quantized, when dq) */
    kf_id dq;              /* the weight's DequantizeLinear, 0: a plain constant */
    const kf_tensor *scale, *zero; /* dq: its scale and zero point (NULL: none) */
    const kf_tensor *bias; /* MatMul: the following Add's constant; Gemm: C; NULL: none */
    kf_id add;             /* MatMul: that Add node, 0 when biases are not merged */
    int64_t n;             /* output columns */
} sibling;

typedef struct group {
    sibling s[HMERGE_MAX_SIBLINGS];
    int count;
    kf_id a;        /* the shared input */
    kf_dtype dtype; /* of the weights as the products read them (and of the biases) */
    kf_dtype wtype; /* of the stored weights: dtype, or the quantized type */
    bool dq;        /* the weights are DequantizeLinears of constants */
    bool per_column; /* dq: scales (and zero points) become one per column */
    int64_t k;      /* shared inner dimension */
    int64_t total;  /* sum of the columns */
    int out_rank;   /* -1 when unknown (the Split then uses axis -1) */
    bool biases;
} group;

/* An initializer the caller cannot replace: from IR version 4 on, an
 * initializer that is also a graph input is only a default value. */
static const kf_tensor *const_init(const kf_model *m, kf_id v) {
    const kf_value *x = &m->graph->values[v];
    if (!x->init || (x->is_input && m->ir_version >= 4)) return NULL;
    return x->init;
}

static int cmp_id(const void *a, const void *b) {
    kf_id x = *(const kf_id *)a, y = *(const kf_id *)b;
    return (x > y) - (x < y);
}

/* Live nodes of op `op` reading a as input 0, in id order, without repeats.
 * *count may exceed HMERGE_MAX_SIBLINGS (then ids holds the first ones). */
static void find_siblings(const kf_graph *g, kf_id a, kf_op op, kf_id *ids, int *count) {
    const kf_value *v = &g->values[a];
    kf_id all[HMERGE_MAX_SIBLINGS + 1];
    int n = 0, over = 0;
    for (uint32_t u = 0; u < v->nusers; u++) {
        const kf_node *x = &g->nodes[v->users[u]];
        if (x->dead || x->op != op || x->nin < 2 || x->in[0] != a) continue;
        bool seen = false;
        for (int i = 0; i < n; i++) seen = seen || all[i] == v->users[u];
        if (seen) continue;
        if (n <= HMERGE_MAX_SIBLINGS) all[n++] = v->users[u];
        else over++;
    }
    qsort(all, (size_t)n, sizeof(kf_id), cmp_id);
    memcpy(ids, all, sizeof(kf_id) * (size_t)(n < HMERGE_MAX_SIBLINGS ? n : HMERGE_MAX_SIBLINGS));
    *count = n + over;
}

/* Whether b is a per-column bias of an output of rank r (-1: unknown, at
 * least 1) with n columns: rank <= r, every dim 1 except the last, which is
 * n or 1. */
static bool per_column(const kf_tensor *b, int r, int64_t n) {
    if (b->rank > (r < 0 ? 1 : r)) return false;
    for (int i = 0; i + 1 < b->rank; i++)
        if (b->dims[i] != 1) return false;
    return b->rank == 0 || b->dims[b->rank - 1] == 1 || b->dims[b->rank - 1] == n;
}

/* A MatMul sibling's output feeds exactly one Add with a constant
 * per-column bias: fills s->add and s->bias. */
static bool bias_add(const kf_model *m, const group *gr, sibling *s) {
    const kf_graph *g = m->graph;
    const kf_value *y = &g->values[g->nodes[s->node].out[0]];
    if (y->is_output || y->nusers != 1) return false;
    kf_id e = y->users[0];
    const kf_node *en = &g->nodes[e];
    if (en->dead || en->op != KF_OP_ADD || en->nin != 2 || (en->opset < 7 && kf_attr_i(en, "broadcast", 0)))
        return false;
    kf_id yid = g->nodes[s->node].out[0];
    kf_id other = en->in[0] == yid ? en->in[1] : en->in[0];
    const kf_tensor *b = other && other != yid ? const_init(m, other) : NULL;
    if (!b || b->dtype != gr->dtype || !per_column(b, gr->out_rank, s->n)) return false;
    s->add = e;
    s->bias = b;
    return true;
}

/* ---- checks -------------------------------------------------------------------------- */

/* Whether t is one value (per tensor) or, with n > 0, n values along one
 * dimension (rank 1). */
static bool one_or_row(const kf_tensor *t, int64_t n) {
    return t->numel == 1 ? t->rank <= 1 : t->rank == 1 && t->dims[0] == n;
}

/* The weight of product n (slot 1), read in layout trans (the columns on
 * dim 0 when set): a constant, or a DequantizeLinear of constants whose
 * scale is per tensor or per column. Fills s->w (and s->dq, s->scale,
 * s->zero) or returns why not. */
static const char *weight_of(const kf_model *m, const kf_node *n, bool trans, sibling *s) {
    const kf_graph *g = m->graph;
    if (!n->in[1]) return "a sibling's weight is not a constant";
    if ((s->w = const_init(m, n->in[1]))) return s->w->rank == 2 ? NULL : "a sibling's weight is not 2-D";
    kf_id d = g->values[n->in[1]].producer;
    const kf_node *dn = d ? &g->nodes[d] : NULL;
    if (!dn || dn->dead || dn->op != KF_OP_DEQUANTIZE_LINEAR || dn->nin < 2 || !dn->in[0] || !dn->in[1] ||
        !(s->w = const_init(m, dn->in[0])) || !(s->scale = const_init(m, dn->in[1])) ||
        (dn->nin > 2 && dn->in[2] && !(s->zero = const_init(m, dn->in[2]))))
        return "a sibling's weight is not a constant";
    if (s->w->rank != 2) return "a sibling's weight is not 2-D";
    if (kf_attr_i(dn, "block_size", 0) != 0) return "a sibling's weight is dequantized in blocks";
    int64_t cols = s->w->dims[trans ? 0 : 1], axis = kf_attr_i(dn, "axis", 1);
    if (axis < 0) axis += 2;
    if (!one_or_row(s->scale, cols) || (s->scale->numel != 1 && axis != (trans ? 0 : 1)))
        return "a sibling's weight scale is not per tensor or per column";
    if (s->zero && (s->zero->numel != s->scale->numel || s->zero->dtype != s->w->dtype))
        return "a sibling's weight zero point does not match its scale";
    s->dq = d;
    return NULL;
}

/* The quantized siblings of gr (all dq) keep one scale and zero point per
 * tensor when they share them; else per column, which DequantizeLinear
 * takes from opset 13. Returns why not, or NULL. */
static const char *dq_layout(const kf_model *m, group *gr) {
    const sibling *f = &gr->s[0];
    gr->per_column = false;
    for (int i = 0; i < gr->count; i++) {
        const sibling *s = &gr->s[i];
        if (s->scale->dtype != f->scale->dtype) return "the siblings' weight scales differ in dtype";
        bool same = s->scale->numel == 1 && f->scale->numel == 1 &&
                    !memcmp(s->scale->data, f->scale->data, kf_dtype_size(s->scale->dtype)) && !s->zero == !f->zero &&
                    (!s->zero || !memcmp(s->zero->data, f->zero->data, kf_dtype_size(s->zero->dtype)));
        if (!same) gr->per_column = true;
    }
    if (gr->per_column && kf_model_opset(m, "") < 13)
        return "the siblings' weight scales differ (one per column needs DequantizeLinear of opset 13)";
    return NULL;
}

/* Sibling i's weight (node gr->s[i].node, read in layout trans): taken by
 * weight_of, and like the first sibling's in kind (plain or dequantized),
 * dtypes and inner dimension; its columns added to gr->total. */
static const char *sibling_weight(const kf_model *m, group *gr, int i, bool trans) {
    const kf_graph *g = m->graph;
    sibling *s = &gr->s[i];
    const kf_node *n = &g->nodes[s->node];
    const char *why = weight_of(m, n, trans, s);
    if (why) return why;
    kf_dtype read = g->values[n->in[1]].type.dtype;
    int64_t k = s->w->dims[trans ? 1 : 0];
    if (i == 0) {
        gr->dq = s->dq != 0;
        gr->wtype = s->w->dtype;
        gr->dtype = read;
        gr->k = k;
    }
    if ((s->dq != 0) != gr->dq) return "some siblings' weights are dequantized, some not";
    if (s->w->dtype != gr->wtype || read != gr->dtype) return "the siblings' weights differ in dtype";
    if (k != gr->k) return "the siblings' weights differ in their inner dimension";
    s->n = s->w->dims[trans ? 0 : 1];
    if (!kf_add_ok(gr->total, s->n, &gr->total)) return "the merged weight is too large";
    return NULL;
}

/* Fills gr for the MatMul siblings of root, or returns why they cannot
 * merge. *alone: fewer than two siblings (no reason to give). */
static const char *matmul_group(const kf_model *m, kf_id root, group *gr, bool *alone) {
    const kf_graph *g = m->graph;
    memset(gr, 0, sizeof *gr);
    gr->a = g->nodes[root].in[0];
    kf_id ids[HMERGE_MAX_SIBLINGS];
    find_siblings(g, gr->a, KF_OP_MATMUL, ids, &gr->count);
    *alone = gr->count < 2;
    if (*alone) return NULL;
    if (gr->count > HMERGE_MAX_SIBLINGS) return "more sibling MatMuls than HMERGE_MAX_SIBLINGS";
    gr->out_rank = g->values[gr->a].type.rank;
    if (gr->out_rank == 0) return "the shared input is a scalar";
    if (gr->out_rank < 0 && kf_model_opset(m, "") < 11) return "the shared input's rank is unknown (Split takes axis -1 from opset 11)";
    for (int i = 0; i < gr->count; i++) {
        gr->s[i].node = ids[i];
        const char *why = sibling_weight(m, gr, i, false);
        if (why) return why;
    }
    gr->biases = true;
    for (int i = 0; i < gr->count && gr->biases; i++) gr->biases = bias_add(m, gr, &gr->s[i]);
    if (!gr->biases)
        for (int i = 0; i < gr->count; i++) {
            gr->s[i].add = 0;
            gr->s[i].bias = NULL;
        }
    return NULL;
}

/* Fills gr for the Gemm siblings of root, or returns why they cannot merge. */
static const char *gemm_group(const kf_model *m, kf_id root, group *gr, bool *alone) {
    const kf_graph *g = m->graph;
    memset(gr, 0, sizeof *gr);
    gr->a = g->nodes[root].in[0];
    kf_id ids[HMERGE_MAX_SIBLINGS];
    find_siblings(g, gr->a, KF_OP_GEMM, ids, &gr->count);
    *alone = gr->count < 2;
    if (*alone) return NULL;
    if (gr->count > HMERGE_MAX_SIBLINGS) return "more sibling Gemms than HMERGE_MAX_SIBLINGS";
    gr->out_rank = 2;
    const kf_node *first = &g->nodes[ids[0]];
    for (int i = 0; i < gr->count; i++) {
        sibling *s = &gr->s[i];
        s->node = ids[i];
        const kf_node *n = &g->nodes[s->node];
        if (n->opset < 7) return "Gemm before opset 7 broadcasts C only through an attribute";
        if (kf_attr_i(n, "transA", 0) != kf_attr_i(first, "transA", 0) ||
            kf_attr_f(n, "alpha", 1.0f) != kf_attr_f(first, "alpha", 1.0f) ||
            kf_attr_f(n, "beta", 1.0f) != kf_attr_f(first, "beta", 1.0f))
            return "the sibling Gemms differ in transA, alpha or beta";
        const char *why = sibling_weight(m, gr, i, kf_attr_i(n, "transB", 0) != 0);
        if (why) return why;
        if (n->nin > 2 && n->in[2]) {
            if (!(s->bias = const_init(m, n->in[2]))) return "a sibling's C is not a constant";
            if (s->bias->dtype != gr->dtype || !per_column(s->bias, 2, s->n))
                return "a sibling's C is not one value per column";
            gr->biases = true;
        }
    }
    return NULL;
}

/* ---- the rewrite ------------------------------------------------------------------------ */

/* The value holding sibling s's stored weight (s->w). */
static kf_id weight_value(const kf_graph *g, const sibling *s) {
    return s->dq ? g->nodes[s->dq].in[0] : g->nodes[s->node].in[1];
}

/* Whether the merged weight may keep the siblings' weights as its parts
 * (kf_graph.defer_concat_bytes): plain weights of one layout, large enough,
 * each read by its product alone, so that the product's removal frees it
 * to move into the merged tensor. */
static bool deferrable(const kf_graph *g, const group *gr, bool trans) {
    int64_t bytes;
    if (g->defer_concat_bytes <= 0 || gr->dq || gr->wtype == KF_DT_STRING || kf_dtype_is_small(gr->wtype) ||
        !kf_mul_ok(gr->k * gr->total, (int64_t)kf_dtype_size(gr->wtype), &bytes) || bytes < g->defer_concat_bytes)
        return false;
    for (int i = 0; i < gr->count; i++) {
        const kf_node *n = &g->nodes[gr->s[i].node];
        const kf_value *w = &g->values[weight_value(g, &gr->s[i])];
        if ((n->op == KF_OP_GEMM && kf_attr_i(n, "transB", 0) != 0) != trans || w->nusers != 1 || w->is_input ||
            w->is_output)
            return false;
    }
    return true;
}

/* The merged weight as parts (deferrable above): the siblings' tensors side
 * by side, borrowed until merge adopts them. */
static kf_status defer_weights(kf_graph *g, const group *gr, bool trans, kf_tensor *w) {
    kf_tensor *parts[HMERGE_MAX_SIBLINGS];
    for (int i = 0; i < gr->count; i++) parts[i] = g->values[weight_value(g, &gr->s[i])].init;
    return kf_tensor_concat_deferred(w, parts, gr->count, trans ? 0 : 1);
}

/* Weights side by side: [K, total] (trans 0) or [total, K] (trans 1), each
 * sibling read in its own layout (Gemm transB; MatMul never transposed);
 * elements copied byte for byte. */
static kf_status concat_weights(const kf_model *m, const group *gr, bool trans, kf_tensor *w) {
    int64_t dims[2] = {trans ? gr->total : gr->k, trans ? gr->k : gr->total};
    KF_TRY(kf_tensor_alloc(w, gr->wtype, 2, dims));
    size_t esz = kf_dtype_size(gr->wtype);
    char *dst = w->data;
    int64_t off = 0;
    for (int i = 0; i < gr->count; i++) {
        const sibling *s = &gr->s[i];
        const kf_node *n = &m->graph->nodes[s->node];
        bool tb = n->op == KF_OP_GEMM && kf_attr_i(n, "transB", 0) != 0;
        const char *src = s->w->data;
        if (tb == trans && trans) { /* [n, K] rows become rows off.. of [total, K]: one block */
            memcpy(dst + (size_t)(off * gr->k) * esz, src, (size_t)(s->n * gr->k) * esz);
        } else if (tb == trans) { /* row k of [K, n] is columns off.. of row k of [K, total] */
            for (int64_t k = 0; k < gr->k; k++)
                memcpy(dst + (size_t)(k * gr->total + off) * esz, src + (size_t)(k * s->n) * esz, (size_t)s->n * esz);
        } else {
            for (int64_t k = 0; k < gr->k; k++)
                for (int64_t j = 0; j < s->n; j++) {
                    int64_t from = tb ? j * gr->k + k : k * s->n + j;
                    int64_t to = trans ? (off + j) * gr->k + k : k * gr->total + off + j;
                    memcpy(dst + (size_t)to * esz, src + (size_t)from * esz, esz);
                }
        }
        off += s->n;
    }
    return KF_OK;
}

/* What concat_columns puts side by side: each sibling's bias, or (dq) its
 * weight scale or zero point. */
typedef enum { COL_BIAS, COL_SCALE, COL_ZERO } column_kind;

/* One value per column of the merged product, [total] of dtype dt: each
 * sibling's tensor of that kind, a one-element one repeated over its
 * columns, an absent one (no bias, no zero point) as zeros. */
static kf_status concat_columns(const group *gr, column_kind kind, kf_dtype dt, kf_tensor *t) {
    KF_TRY(kf_tensor_alloc(t, dt, 1, &gr->total));
    size_t esz = kf_dtype_size(dt);
    char *dst = t->data;
    int64_t off = 0;
    for (int i = 0; i < gr->count; i++) {
        const sibling *s = &gr->s[i];
        const kf_tensor *q = kind == COL_BIAS ? s->bias : kind == COL_SCALE ? s->scale : s->zero;
        if (q && q->numel != 1) /* one per column: the block at once */
            memcpy(dst + (size_t)off * esz, q->data, (size_t)s->n * esz);
        for (int64_t j = 0; q && q->numel == 1 && j < s->n; j++) /* one for all: repeated */
            memcpy(dst + (size_t)(off + j) * esz, q->data, esz);
        off += s->n;
    }
    return KF_OK;
}

/* Adds a constant built by fill (ownership moves to the graph). */
static kf_status add_const(kf_graph *g, const char *base, kf_tensor *t, kf_status fill_st, kf_id *id) {
    if (fill_st) {
        kf_tensor_free(t);
        return fill_st;
    }
    return kf_graph_add_constant(g, base, t, id);
}

/* Adds node op(in) with nout fresh outputs named after names[j]; infers. */
static kf_status add_node(kf_model *m, const char *op_type, kf_op op, const char *name, const kf_id *in, int nin,
                          const char *const *names, kf_id *out, int nout, kf_id *node) {
    kf_graph *g = m->graph;
    for (int j = 0; j < nout; j++) KF_TRY(kf_graph_fresh_value(g, names[j], &out[j]));
    KF_TRY(kf_graph_add_node(g, op_type, "", name, in, nin, out, nout, node));
    g->nodes[*node].op = op;
    g->nodes[*node].opset = kf_model_opset(m, "");
    return KF_OK;
}

static kf_status add_int_attr(kf_graph *g, kf_id node, const char *name, int64_t v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INT, .i = v};
    return kf_node_add_attr(&g->nodes[node], &a);
}

/* The merged quantized weight w dequantized: per tensor with the first
 * sibling's scale and zero point, or per column along the columns' axis.
 * *w becomes the float weight. */
static kf_status dequantize_merged(kf_model *m, const group *gr, bool trans, const char *base, kf_id *w) {
    kf_graph *g = m->graph;
    const kf_node *d0 = &g->nodes[gr->s[0].dq];
    kf_id in[3] = {*w, d0->in[1], d0->nin > 2 ? d0->in[2] : 0}, node;
    bool zeros = false;
    for (int i = 0; i < gr->count; i++) zeros |= gr->s[i].zero != NULL;
    if (gr->per_column) {
        kf_tensor *st = kf_tensor_new(), *zt = NULL;
        if (!st) return kf_fail(KF_ERR_NOMEM, "out of memory");
        KF_TRY(add_const(g, "merged_weight_scale", st, concat_columns(gr, COL_SCALE, gr->s[0].scale->dtype, st), &in[1]));
        in[2] = 0;
        if (zeros) {
            if (!(zt = kf_tensor_new())) return kf_fail(KF_ERR_NOMEM, "out of memory");
            KF_TRY(add_const(g, "merged_weight_zero_point", zt, concat_columns(gr, COL_ZERO, gr->wtype, zt), &in[2]));
        }
    }
    char name[300];
    snprintf(name, sizeof name, "%s_dequantize", base);
    const char *dname[1] = {"merged_weight_float"};
    KF_TRY(add_node(m, "DequantizeLinear", KF_OP_DEQUANTIZE_LINEAR, name, in, in[2] ? 3 : 2, dname, w, 1, &node));
    if (gr->per_column) KF_TRY(add_int_attr(g, node, "axis", trans ? 0 : 1));
    return kf_infer_node(m, node);
}

/* Product with merged weights (and biases), then Split into the siblings'
 * results; the old products and Adds are removed. */
static kf_status merge(kf_model *m, const group *gr) {
    kf_graph *g = m->graph;
    const kf_node *first = &g->nodes[gr->s[0].node];
    bool gemm = first->op == KF_OP_GEMM;
    bool trans = gemm && kf_attr_i(first, "transB", 0) != 0;
    char name[256], bias_name[280], split_name[280];
    snprintf(name, sizeof name, "%s_merged", kf_node_label(first));
    snprintf(bias_name, sizeof bias_name, "%s_bias", name);
    snprintf(split_name, sizeof split_name, "%s_split", name);
    kf_id w, b = 0;
    kf_tensor *wt = kf_tensor_new(), *bt = NULL;
    if (!wt) return kf_fail(KF_ERR_NOMEM, "out of memory");
    bool defer = deferrable(g, gr, trans);
    for (int i = 0; i < gr->count && !defer; i++) { /* an earlier merge's deferred weight */
        kf_status st = kf_tensor_settle(g->values[weight_value(g, &gr->s[i])].init);
        if (st) {
            kf_tensor_free(wt);
            return st;
        }
    }
    KF_TRY(add_const(g, "merged_weight", wt, defer ? defer_weights(g, gr, trans, wt) : concat_weights(m, gr, trans, wt),
                     &w));
    if (gr->dq) KF_TRY(dequantize_merged(m, gr, trans, name, &w));
    if (gr->biases) {
        if (!(bt = kf_tensor_new())) return kf_fail(KF_ERR_NOMEM, "out of memory");
        KF_TRY(add_const(g, "merged_bias", bt, concat_columns(gr, COL_BIAS, gr->dtype, bt), &b));
    }
    /* the product */
    kf_id in[3] = {gr->a, w, gemm ? b : 0}, prod, node;
    const char *pname[1] = {"merged_product"};
    KF_TRY(add_node(m, gemm ? "Gemm" : "MatMul", gemm ? KF_OP_GEMM : KF_OP_MATMUL, name, in, gemm && b ? 3 : 2,
                    pname, &prod, 1, &node));
    first = &g->nodes[gr->s[0].node];
    if (gemm)
        for (int i = 0; i < first->nattrs; i++) {
            KF_TRY(kf_node_add_attr(&g->nodes[node], &first->attrs[i]));
            first = &g->nodes[gr->s[0].node];
        }
    KF_TRY(kf_infer_node(m, node));
    if (!gemm && b) {
        kf_id add_in[2] = {prod, b};
        const char *aname[1] = {"merged_biased"};
        KF_TRY(add_node(m, "Add", KF_OP_ADD, bias_name, add_in, 2, aname, &prod, 1, &node));
        KF_TRY(kf_infer_node(m, node));
    }
    /* the Split */
    int64_t opset = kf_model_opset(m, "");
    kf_id split_in[2] = {prod, 0};
    int64_t sizes[HMERGE_MAX_SIBLINGS];
    kf_id results[HMERGE_MAX_SIBLINGS], outs[HMERGE_MAX_SIBLINGS];
    const char *names[HMERGE_MAX_SIBLINGS];
    for (int i = 0; i < gr->count; i++) {
        const sibling *s = &gr->s[i];
        sizes[i] = s->n;
        results[i] = s->add ? g->nodes[s->add].out[0] : g->nodes[s->node].out[0];
    }
    for (int i = 0; i < gr->count; i++) names[i] = g->values[results[i]].name;
    if (opset >= 13) {
        kf_tensor *st = kf_tensor_new();
        if (!st) return kf_fail(KF_ERR_NOMEM, "out of memory");
        int64_t n = gr->count;
        kf_status fs = kf_tensor_alloc(st, KF_DT_INT64, 1, &n);
        if (!fs) memcpy(st->data, sizes, sizeof(int64_t) * (size_t)n);
        KF_TRY(add_const(g, "merged_split", st, fs, &split_in[1]));
    }
    KF_TRY(add_node(m, "Split", KF_OP_SPLIT, split_name, split_in, opset >= 13 ? 2 : 1, names, outs, gr->count, &node));
    KF_TRY(add_int_attr(g, node, "axis", gr->out_rank < 0 ? -1 : gr->out_rank - 1));
    if (opset < 13) {
        kf_attr a = {.name = "split", .type = KF_ATTR_INTS, .ints = sizes, .n = gr->count};
        KF_TRY(kf_node_add_attr(&g->nodes[node], &a));
    }
    KF_TRY(kf_infer_node(m, node));
    kf_tensor *parts[HMERGE_MAX_SIBLINGS];
    for (int i = 0; i < gr->count; i++) {
        parts[i] = g->values[weight_value(g, &gr->s[i])].init;
        KF_TRY(kf_graph_replace_uses(g, results[i], outs[i]));
        if (gr->s[i].add) kf_graph_remove_node(g, gr->s[i].add);
        kf_graph_remove_node(g, gr->s[i].node);
    }
    if (defer) kf_tensor_adopt_parts(wt, parts); /* the old weights are read by nothing now */
    return KF_OK;
}

/* The callback of both rules: root is one of the siblings; user is the op. */
static kf_status merge_siblings(kf_model *m, kf_id root, void *user, bool *applied, const char **why) {
    kf_op op = (kf_op)(intptr_t)user;
    *applied = false;
    const kf_node *n = &m->graph->nodes[root];
    if (n->nin < 2 || !n->in[0] || !n->out[0]) return KF_OK;
    group *gr = kf_calloc(1, sizeof *gr);
    if (!gr) return kf_fail(KF_ERR_NOMEM, "out of memory");
    bool alone;
    *why = op == KF_OP_GEMM ? gemm_group(m, root, gr, &alone) : matmul_group(m, root, gr, &alone);
    if (!alone && !*why && gr->dq) *why = dq_layout(m, gr);
    kf_status st = KF_OK;
    if (!alone && !*why) {
        st = merge(m, gr);
        *applied = !st;
    }
    kf_free(gr);
    return st;
}

kf_status kf_pass_hmerge_rules(kf_ruleset *rs) {
    /* matmul(a, W1) .. matmul(a, Wn) [+ b1 .. + bn] -> split(matmul(a, [W1 .. Wn]) [+ [b1 .. bn]]) */
    KF_TRY(kf_rules_add_callback(rs, "merge_sibling_matmuls", "MatMul", merge_siblings, (void *)(intptr_t)KF_OP_MATMUL));
    /* gemm(a, W1, C1) .. gemm(a, Wn, Cn) -> split(gemm(a, [W1 .. Wn], [C1 .. Cn])) */
    KF_TRY(kf_rules_add_callback(rs, "merge_sibling_gemms", "Gemm", merge_siblings, (void *)(intptr_t)KF_OP_GEMM));
    return KF_OK;
}
