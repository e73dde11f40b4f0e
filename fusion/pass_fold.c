/*
 * pass_fold.c: constant folding, a whole-graph pass (passes.def:
 * KF_GRAPH_PASS(fold)). A node whose inputs are all constants of the model
 * runs once on the reference evaluator and its outputs become initializers;
 * so do Shape and Size of a value whose type is static, and Gather of the
 * static dims out of a Shape. Constant nodes become initializers on the way.
 * A size cap keeps folding from ever inflating the model; a caller that
 * compiles the model instead of saving it may raise it (kf_pass_ctx).
 */
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"

/* Folded outputs of one node may hold up to the larger of this and the
 * bytes of its constant inputs (attribute tensors included): small shape
 * and index tensors always fold, and a weight transform may produce as much
 * as it consumed, so folding never makes the model grow past what it
 * already stores by more than 1 MiB per node. */
#define KF_FOLD_MIN_CAP_BYTES ((int64_t)1 << 20)

/* An initializer no caller can override through a graph input. */
static const kf_tensor *fixed(const kf_model *m, kf_id v) {
    return v && kf_value_is_constant(m, v) ? m->graph->values[v].init : NULL;
}

/* Bytes a tensor takes in a file (strings: their lengths plus one each). */
static int64_t tensor_bytes(const kf_tensor *t) {
    if (t->dtype != KF_DT_STRING) return t->numel * (int64_t)kf_dtype_size(t->dtype);
    int64_t b = 0;
    const kf_bytes *s = t->data;
    for (int64_t i = 0; s && i < t->numel; i++) b += (int64_t)s[i].len + 1;
    return b;
}

static int64_t type_bytes(const kf_type *ty) {
    int64_t numel, bytes;
    size_t esz = kf_dtype_size(ty->dtype);
    if (!kf_type_is_static(ty) || kf_shape_numel(ty->rank, ty->dims, 1, &numel) != KF_OK) return -1;
    if (!kf_mul_ok(numel, esz ? (int64_t)esz : 1, &bytes)) return -1;
    return bytes;
}

static bool output_used(const kf_graph *g, const kf_node *n) {
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (v && (g->values[v].nusers || g->values[v].is_output)) return true;
    }
    return false;
}

/* Turns node's outputs into initializers holding outs[] (moved). The
 * values keep their ids and names, so readers and graph outputs stay. */
static kf_status commit(kf_graph *g, kf_id node, kf_tensor *outs) {
    kf_node *n = &g->nodes[node];
    kf_tensor **held = kf_calloc((size_t)n->nout + 1, sizeof *held);
    bool ok = held != NULL;
    for (int j = 0; ok && j < n->nout; j++)
        if (n->out[j]) ok = (held[j] = kf_tensor_new()) != NULL;
    if (!ok) {
        for (int j = 0; held && j < n->nout; j++) kf_tensor_free(held[j]);
        kf_free(held);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_graph_remove_node(g, node);
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (!v) continue;
        kf_value *val = &g->values[v];
        kf_tensor_move(held[j], &outs[j]);
        val->init = held[j];
        kf_type_of_tensor(&val->type, held[j]);
        val->has_type = true;
    }
    kf_free(held);
    return KF_OK;
}

/* Why node cannot fold (NULL: it can), given its constant inputs. cap gets
 * the byte budget of its outputs. */
static const char *foldable(const kf_model *m, const kf_node *n, const kf_tensor **in, int64_t *cap) {
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || !info->eval) return "unknown op or no reference kernel";
    int64_t bytes = 0;
    for (int i = 0; i < n->nin; i++) {
        in[i] = NULL;
        if (!n->in[i]) continue;
        if (!(in[i] = fixed(m, n->in[i]))) return "an input is not a constant";
        bytes += tensor_bytes(in[i]);
    }
    for (int k = 0; k < n->nattrs; k++)
        if (n->attrs[k].type == KF_ATTR_TENSOR && n->attrs[k].t) bytes += tensor_bytes(n->attrs[k].t);
    *cap = bytes > KF_FOLD_MIN_CAP_BYTES ? bytes : KF_FOLD_MIN_CAP_BYTES;
    return NULL;
}

/* Output types from the op's shape function; a static output over the cap
 * declines before anything runs. */
static bool fits_before(const kf_node *n, const kf_tensor **in, int64_t cap) {
    const kf_op_info *info = kf_op_get(n->op);
    if (!info->shape || n->nin > 64 || n->nout > 64) return true;
    kf_type tin[64], tout[64];
    const kf_type *tp[64];
    for (int i = 0; i < n->nin; i++) {
        tp[i] = NULL;
        if (!in[i]) continue;
        kf_type_of_tensor(&tin[i], in[i]);
        tp[i] = &tin[i];
    }
    for (int j = 0; j < n->nout; j++) kf_type_unknown(&tout[j]);
    if (info->shape(n, n->nin, tp, in, n->nout, tout) != KF_OK) {
        kf_clear_error();
        return false;
    }
    int64_t total = 0;
    for (int j = 0; j < n->nout; j++) {
        if (!n->out[j]) continue;
        int64_t b = type_bytes(&tout[j]);
        if (b < 0) continue; /* known only after running; checked then */
        if (!kf_add_ok(total, b, &total) || total > cap) return false;
    }
    return true;
}

static bool fits_after(const kf_node *n, const kf_tensor *outs, int64_t cap) {
    int64_t total = 0;
    for (int j = 0; j < n->nout; j++)
        if (n->out[j] && (!kf_add_ok(total, tensor_bytes(&outs[j]), &total) || total > cap)) return false;
    return true;
}

/* Runs node on in[] and commits. *done says whether it folded; evaluation
 * errors (unsupported version, a training-mode Dropout...) only decline;
 * running out of memory is returned. */
static kf_status eval_and_commit(kf_graph *g, kf_id node, const kf_tensor **in, int64_t cap, bool *done) {
    kf_node *n = &g->nodes[node];
    *done = false;
    kf_tensor *outs = kf_calloc((size_t)n->nout + 1, sizeof(kf_tensor));
    if (!outs) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_eval_node(n, n->nin, in, outs);
    if (st == KF_ERR_NOMEM) {
        /* out of memory is an error, not a reason to decline */
    } else if (st != KF_OK) {
        st = KF_OK;
        kf_clear_error();
    } else if (fits_after(n, outs, cap)) {
        st = commit(g, node, outs);
        *done = st == KF_OK;
    }
    for (int j = 0; j < n->nout; j++) kf_tensor_release(&outs[j]);
    kf_free(outs);
    return st;
}

/* Shape(x) / Size(x) with x's type static: they read only the dims, so a
 * tensor header without data stands in for x. */
static kf_status fold_shape_of(kf_graph *g, kf_id node, bool *done) {
    const kf_node *n = &g->nodes[node];
    *done = false;
    if (n->nin != 1 || !n->in[0]) return KF_OK;
    const kf_type *ty = &g->values[n->in[0]].type;
    if (!kf_type_is_static(ty) || !kf_dtype_valid(ty->dtype)) return KF_OK;
    kf_tensor header = {.dtype = ty->dtype, .rank = ty->rank};
    memcpy(header.dims, ty->dims, sizeof(int64_t) * (size_t)ty->rank);
    if (kf_shape_numel(ty->rank, ty->dims, 1, &header.numel) != KF_OK) {
        kf_clear_error();
        return KF_OK;
    }
    const kf_tensor *in[1] = {&header};
    return eval_and_commit(g, node, in, KF_FOLD_MIN_CAP_BYTES, done);
}

/* Gather(Shape(x), k) along axis 0 with constant k picking static dims of
 * x: what exporters write for one dim of a partly dynamic shape. */
static kf_status fold_gather_of_shape(kf_model *m, kf_id node, bool *done) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    *done = false;
    if (n->nin != 2 || !n->in[0] || !n->in[1] || n->nout != 1) return KF_OK;
    kf_id sp = g->values[n->in[0]].producer;
    const kf_node *s = sp ? &g->nodes[sp] : NULL;
    if (!s || s->dead || s->op != KF_OP_SHAPE || !s->in[0]) return KF_OK;
    if (kf_attr_find(s, "start") || kf_attr_find(s, "end")) return KF_OK;
    const kf_type *x = &g->values[s->in[0]].type;
    const kf_tensor *k = fixed(m, n->in[1]);
    int64_t axis = kf_attr_i(n, "axis", 0);
    if (x->rank < 0 || !k || !kf_dtype_is_int(k->dtype) || (axis != 0 && axis != -1) || k->numel > KF_MAX_RANK)
        return KF_OK;
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_INT64, k->rank, k->dims);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    for (int64_t i = 0; i < k->numel; i++) {
        int64_t d = kf_get_i64(k, i);
        if (d < 0) d += x->rank;
        if (d < 0 || d >= x->rank || x->dims[d] < 0) {
            kf_tensor_free(t);
            return KF_OK;
        }
        kf_set_i64(t, i, x->dims[d]);
    }
    st = commit(g, node, t);
    kf_tensor_free(t);
    *done = st == KF_OK;
    return st;
}

kf_status kf_pass_fold(kf_model *m, kf_pass_ctx *ctx) {
    kf_graph *g = m->graph;
    kf_id *order;
    uint32_t norder;
    KF_TRY(kf_graph_topo(g, &order, &norder));
    uint32_t maxin = 1;
    for (uint32_t k = 0; k < norder; k++)
        if ((uint32_t)g->nodes[order[k]].nin > maxin) maxin = (uint32_t)g->nodes[order[k]].nin;
    const kf_tensor **in = kf_calloc(maxin, sizeof *in);
    if (!in) {
        kf_free(order);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_status st = KF_OK;
    for (uint32_t k = 0; k < norder && !st && ctx->fuel != 0; k++) {
        kf_id id = order[k];
        const kf_node *n = &g->nodes[id];
        if (n->dead || !output_used(g, n)) continue;
        /* Refresh this node's types from its inputs first: folding a shape
         * computation earlier in this sweep makes a Reshape's output static,
         * and a Shape of it further down can then fold in the same sweep
         * instead of one layer per optimizer round. */
        if ((st = kf_infer_node(m, id))) break;
        n = &g->nodes[id];
        char label[256];
        snprintf(label, sizeof label, "%s", kf_node_label(n));
        bool done = false;
        int64_t cap;
        if (!foldable(m, n, in, &cap)) {
            if (ctx->fold_cap_bytes > cap) cap = ctx->fold_cap_bytes;
            if (fits_before(n, in, cap)) st = eval_and_commit(g, id, in, cap, &done);
        } else if (n->op == KF_OP_SHAPE || n->op == KF_OP_SIZE) {
            st = fold_shape_of(g, id, &done);
        } else if (n->op == KF_OP_GATHER) {
            st = fold_gather_of_shape(m, id, &done);
        }
        if (!done) continue;
        ctx->changes++;
        if (ctx->fuel > 0) ctx->fuel--;
        if (ctx->trace) fprintf(stderr, "kfuse: fold at node '%s'\n", label);
    }
    kf_free(in);
    kf_free(order);
    return st;
}
