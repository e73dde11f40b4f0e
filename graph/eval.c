/*
 * eval.c: the reference evaluator's driver. It runs nodes in topological
 * order, asks each op's shape function for output types (the same function
 * shape inference uses), allocates outputs when their shape is static, calls
 * the op's reference kernel and frees intermediates after their last use.
 * It is the oracle for every other backend and the engine of constant folding.
 * A call of a model-local function (what `kfuse fuse` writes) runs the
 * function's body the same way, nested calls included; so do the bodies of
 * If, Loop and Scan (ops_control.c calls back into kf_eval_graph).
 */
#include <stdio.h>
#include <string.h>

#include "kf_onnx.h"
#include "kf_ref.h"

/* Why op version `ver` of node n cannot run, or NULL. */
static const char *unsupported_reason(const kf_node *n) {
    static _Thread_local char buf[512];
    const kf_op_info *info = kf_op_get(n->op);
    if (!info) {
        snprintf(buf, sizeof buf, "unsupported op %s%s%s", n->domain[0] ? n->domain : "",
                 n->domain[0] ? "::" : "", n->op_type);
        return buf;
    }
    if (!info->eval) {
        snprintf(buf, sizeof buf, "op %s has no reference kernel", n->op_type);
        return buf;
    }
    if (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi)) {
        snprintf(buf, sizeof buf, "op %s at opset %lld is not supported (supported %d..%d)",
                 n->op_type, (long long)n->opset, info->ver_lo, info->ver_hi);
        return buf;
    }
    return NULL;
}

kf_status kf_eval_node(const kf_node *n, int nin, const kf_tensor *const *in, kf_tensor *out) {
    const char *why = unsupported_reason(n);
    if (why) return kf_fail(KF_ERR_UNSUPPORTED, "node '%s': %s", kf_node_label(n), why);
    const kf_op_info *info = kf_op_get(n->op);
    if (info->flags & KF_F_SUBGRAPHS) return kf_control_run(NULL, n, in, out, 0);
    /* The float8/float6/float4/int4/int2 storage types reach only the
     * kernels that convert them (Cast, CastLike), move elements without
     * reading them as numbers (Identity, the injective ops), keep their
     * bits (BitCast), read only the shape (Shape, Size) or write one
     * tensor's elements into another (TensorScatter), or quantise to and
     * from them (QuantizeLinear, DequantizeLinear). */
    bool moves = n->op == KF_OP_CAST || n->op == KF_OP_CAST_LIKE || n->op == KF_OP_IDENTITY ||
                 n->op == KF_OP_BIT_CAST || n->op == KF_OP_SHAPE || n->op == KF_OP_SIZE ||
                 n->op == KF_OP_TENSOR_SCATTER || n->op == KF_OP_QUANTIZE_LINEAR ||
                 n->op == KF_OP_DEQUANTIZE_LINEAR ||
                 info->fclass == KF_FC_INJECTIVE;
    for (int i = 0; i < nin && !moves; i++)
        if (in[i] && kf_dtype_is_small(in[i]->dtype))
            return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' (%s): element type %s is not supported by the reference kernel",
                           kf_node_label(n), n->op_type, kf_dtype_name(in[i]->dtype));
    if (nin < info->in_min || (info->in_max >= 0 && nin > info->in_max))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d inputs, expected %d..%d", kf_node_label(n),
                       n->op_type, nin, info->in_min, info->in_max);
    if (n->nout < info->out_min || (info->out_max >= 0 && n->nout > info->out_max))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d outputs, expected %d..%d", kf_node_label(n),
                       n->op_type, n->nout, info->out_min, info->out_max);
    for (int i = 0; i < info->in_min && i < nin; i++)
        if (!in[i])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): required input %d is missing",
                           kf_node_label(n), n->op_type, i);

    kf_status st = KF_ERR_NOMEM;
    kf_type *types = kf_calloc((size_t)nin + 1, sizeof(kf_type));
    const kf_type **tp = kf_calloc((size_t)nin + 1, sizeof(kf_type *));
    kf_type *otypes = kf_calloc((size_t)n->nout + 1, sizeof(kf_type));
    if (!types || !tp || !otypes) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        kf_type_of_tensor(&types[i], in[i]);
        tp[i] = &types[i];
    }
    for (int j = 0; j < n->nout; j++) {
        kf_tensor_release(&out[j]);
        kf_type_unknown(&otypes[j]);
    }
    if (info->shape && (st = info->shape(n, nin, tp, in, n->nout, otypes)) != KF_OK) goto done;
    for (int j = 0; j < n->nout; j++) {
        if (kf_dtype_valid(otypes[j].dtype) && kf_type_is_static(&otypes[j])) {
            st = kf_tensor_alloc(&out[j], otypes[j].dtype, otypes[j].rank, otypes[j].dims);
            if (st) {
                kf_fail_context(st, "node '%s' (%s) output %d", kf_node_label(n), n->op_type, j);
                goto done;
            }
        }
    }
    st = info->eval(n, nin, in, n->nout, out);
    if (st) goto done;
    for (int j = 0; j < n->nout; j++) {
        if (!n->out[j]) continue;
        if (!out[j].data && out[j].numel == 0 && !kf_dtype_valid(out[j].dtype)) {
            st = kf_fail(KF_ERR_INTERNAL, "node '%s' (%s): kernel produced no output %d",
                         kf_node_label(n), n->op_type, j);
            goto done;
        }
    }
done:
    if (st)
        for (int j = 0; j < n->nout; j++) kf_tensor_release(&out[j]);
    kf_free(types);
    kf_free(tp);
    kf_free(otypes);
    return st;
}

kf_status kf_graph_real_inputs(const kf_graph *g, kf_id **ids, uint32_t *count) {
    kf_id *r = kf_calloc(g->ninputs + 1, sizeof(kf_id));
    if (!r) return kf_fail(KF_ERR_NOMEM, "out of memory");
    uint32_t c = 0;
    for (uint32_t i = 0; i < g->ninputs; i++)
        if (!g->values[g->inputs[i]].init) r[c++] = g->inputs[i];
    *ids = r;
    *count = c;
    return KF_OK;
}

/* Checks a caller's tensor against the declared type of graph input v. */
static kf_status check_input(const kf_graph *g, kf_id v, const kf_tensor *t) {
    const kf_value *val = &g->values[v];
    const kf_type *ty = &val->type;
    if (ty->dtype && t->dtype != ty->dtype)
        return kf_fail(KF_ERR_SHAPE, "input '%s' has dtype %s, the model declares %s", val->name,
                       kf_dtype_name(t->dtype), kf_dtype_name(ty->dtype));
    if (ty->rank >= 0) {
        if (t->rank != ty->rank)
            return kf_fail(KF_ERR_SHAPE, "input '%s' has rank %d, the model declares %d", val->name,
                           t->rank, ty->rank);
        for (int d = 0; d < ty->rank; d++)
            if (ty->dims[d] >= 0 && ty->dims[d] != t->dims[d])
                return kf_fail(KF_ERR_SHAPE, "input '%s' dim %d is %lld, the model declares %lld",
                               val->name, d, (long long)t->dims[d], (long long)ty->dims[d]);
    }
    return KF_OK;
}

#define MAX_CALL_DEPTH KF_MAX_EVAL_DEPTH

static const char *node_unsupported(const kf_model *m, const kf_node *n, int depth);

/* Why a body of control-flow node n cannot run (a node in it, at any
 * depth, or a body that does not decode), or NULL. */
static const char *bodies_unsupported(const kf_model *m, const kf_node *n, int depth) {
    static _Thread_local char buf[600];
    const char *const *names = kf_control_bodies(n);
    if (depth >= MAX_CALL_DEPTH) {
        snprintf(buf, sizeof buf, "bodies nested deeper than %d levels", MAX_CALL_DEPTH);
        return buf;
    }
    for (int k = 0; names[k]; k++) {
        kf_body b;
        if (kf_control_body(m, n, names[k], &b)) {
            snprintf(buf, sizeof buf, "%s", kf_last_error());
            kf_clear_error();
            return buf;
        }
        const char *r = NULL;
        for (kf_id i = 1; i < b.g->nnodes && !r; i++)
            if (!b.g->nodes[i].dead) r = node_unsupported(m, &b.g->nodes[i], depth + 1);
        if (r) {
            char inner[512];
            snprintf(inner, sizeof inner, "%s", r);
            snprintf(buf, sizeof buf, "in body '%s' of node '%s': %s", names[k], kf_node_label(n), inner);
        }
        kf_body_release(&b);
        if (r) return buf;
    }
    return NULL;
}

/* Why the node, in a graph of m, cannot run (a function call is checked
 * through its body), or NULL. */
static const char *node_unsupported(const kf_model *m, const kf_node *n, int depth) {
    static _Thread_local char buf[600];
    const kf_function *f = kf_model_function(m, n->domain, n->op_type);
    if (!f) {
        const char *r = unsupported_reason(n);
        if (!r && (kf_op_get(n->op)->flags & KF_F_SUBGRAPHS)) r = bodies_unsupported(m, n, depth);
        return r;
    }
    if (depth >= MAX_CALL_DEPTH) {
        snprintf(buf, sizeof buf, "function calls nested deeper than %d levels (at %s::%s; recursive?)",
                 MAX_CALL_DEPTH, f->domain, f->name);
        return buf;
    }
    const kf_graph *b = f->body;
    for (kf_id i = 1; i < b->nnodes; i++) {
        if (b->nodes[i].dead) continue;
        const char *r = node_unsupported(m, &b->nodes[i], depth + 1);
        if (r) {
            if (r != buf) {
                char inner[512];
                snprintf(inner, sizeof inner, "%s", r);
                snprintf(buf, sizeof buf, "in function %s::%s: %s", f->domain, f->name, inner);
            }
            return buf;
        }
    }
    return NULL;
}

const char *kf_eval_unsupported_reason(const kf_model *m) {
    static _Thread_local char buf[700];
    const kf_graph *g = m->graph;
    for (kf_id i = 1; i < g->nnodes; i++) {
        if (g->nodes[i].dead) continue;
        const char *r = node_unsupported(m, &g->nodes[i], 0);
        if (!r) continue;
        /* say so when the model moves values kfuse has no type for */
        for (kf_id v = 1; v < g->nvalues; v++)
            if (g->values[v].other_kind) {
                char inner[600];
                snprintf(inner, sizeof inner, "%s", r);
                snprintf(buf, sizeof buf, "%s (value '%s' is of kind %s, which kfuse has no type for)", inner,
                         g->values[v].name, g->values[v].other_kind);
                return buf;
            }
        return r;
    }
    return NULL;
}

/* A node of a function body with every attribute that refers to a caller
 * attribute (ref_attr_name) replaced by the caller's value under the body
 * attribute's name, or dropped when the caller does not set it (the op's
 * default then applies; defaults a FunctionProto declares are not read).
 * The copy is shallow: *tmp and *attrs are the only allocations, freed by
 * the caller with kf_free(*attrs). Returns n itself when nothing refers. */
static kf_status resolve_refs(const kf_node *n, const kf_node *caller, kf_node *tmp, kf_attr **attrs,
                              const kf_node **out) {
    *attrs = NULL;
    *out = n;
    bool any = false;
    for (int i = 0; i < n->nattrs; i++) any |= n->attrs[i].ref_attr_name != NULL;
    if (!any) return KF_OK;
    if (!caller)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' refers to a caller attribute outside a function",
                       kf_node_label(n), n->op_type, n->attrs[0].name);
    kf_attr *a = kf_calloc((size_t)n->nattrs + 1, sizeof(kf_attr));
    if (!a) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < n->nattrs; i++) {
        const kf_attr *src = &n->attrs[i];
        if (src->ref_attr_name) {
            const kf_attr *c = kf_attr_find(caller, src->ref_attr_name);
            if (!c) continue;
            src = c;
        }
        a[k] = *src;
        a[k].name = n->attrs[i].name;
        a[k].ref_attr_name = NULL;
        k++;
    }
    *tmp = *n;
    tmp->attrs = a;
    tmp->nattrs = k;
    *attrs = a;
    *out = tmp;
    return KF_OK;
}

static kf_status eval_graph(const kf_model *m, const kf_graph *g, const kf_tensor *const *bound,
                            const kf_node *caller, kf_tensor *outputs, const kf_eval_opts *opts, int depth);

/* Runs node n (of a graph of m) from its input tensors into out[0..nout):
 * a call of a model-local function runs the function's body, anything else
 * the op's kernel. caller: the node whose function body holds n (for
 * ref_attr_name), NULL at the top level. */
static kf_status eval_call(const kf_model *m, const kf_node *n, const kf_node *caller, const kf_tensor *const *in,
                           kf_tensor *out, int depth) {
    kf_node tmp;
    kf_attr *attrs;
    const kf_node *rn;
    KF_TRY(resolve_refs(n, caller, &tmp, &attrs, &rn));
    kf_status st;
    const kf_function *f = kf_model_function(m, n->domain, n->op_type);
    if (!f) {
        const kf_op_info *info = kf_op_get(n->op);
        st = info && (info->flags & KF_F_SUBGRAPHS) && !unsupported_reason(n) ? kf_control_run(m, rn, in, out, depth)
                                                                               : kf_eval_node(rn, rn->nin, in, out);
    } else if (depth >= MAX_CALL_DEPTH) {
        st = kf_fail(KF_ERR_UNSUPPORTED, "node '%s': function calls nested deeper than %d levels (recursive?)",
                     kf_node_label(n), MAX_CALL_DEPTH);
    } else if ((uint32_t)n->nin > f->body->ninputs || (uint32_t)n->nout > f->body->noutputs) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' calls %s::%s with %d inputs and %d outputs; it takes %u and %u",
                     kf_node_label(n), f->domain, f->name, n->nin, n->nout, f->body->ninputs, f->body->noutputs);
    } else {
        const kf_graph *b = f->body;
        const kf_tensor **bound = kf_calloc(b->ninputs + 1, sizeof(kf_tensor *));
        kf_tensor *res = kf_calloc(b->noutputs + 1, sizeof(kf_tensor));
        if (!bound || !res) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
        } else {
            for (int i = 0; i < n->nin; i++) bound[i] = in[i]; /* missing trailing inputs stay absent */
            st = eval_graph(m, b, bound, rn, res, NULL, depth + 1);
            if (st) kf_fail_context(st, "node '%s' (%s::%s)", kf_node_label(n), f->domain, f->name);
            for (int j = 0; j < n->nout; j++) {
                kf_tensor_release(&out[j]);
                if (!st) kf_tensor_move(&out[j], &res[j]);
            }
            for (uint32_t j = 0; j < b->noutputs; j++) kf_tensor_release(&res[j]);
        }
        kf_free(bound);
        kf_free(res);
    }
    kf_free(attrs);
    return st;
}

/* Runs graph g of m. bound[i]: the tensor for g->inputs[i], NULL where the
 * caller gives none (an initializer then supplies it, or, in a function
 * body, the input is absent). outputs receives g->noutputs tensors. */
static kf_status eval_graph(const kf_model *m, const kf_graph *g, const kf_tensor *const *bound,
                            const kf_node *caller, kf_tensor *outputs, const kf_eval_opts *opts, int depth) {
    kf_status st = KF_OK;
    kf_id *order = NULL;
    uint32_t norder = 0;
    kf_tensor *vals = NULL;       /* one slot per value id */
    uint32_t *remaining = NULL;   /* uses left before a value can be freed */
    const kf_tensor **inp = NULL;
    kf_tensor *outs = NULL;
    uint32_t maxio = 1;

    if ((st = kf_graph_topo(g, &order, &norder))) return st;
    vals = kf_calloc(g->nvalues, sizeof(kf_tensor));
    remaining = kf_calloc(g->nvalues, sizeof(uint32_t));
    if (!vals || !remaining) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t k = 0; k < norder; k++) {
        const kf_node *n = &g->nodes[order[k]];
        if (n->nin > (int)maxio) maxio = (uint32_t)n->nin;
        if (n->nout > (int)maxio) maxio = (uint32_t)n->nout;
        const char *why = node_unsupported(m, n, depth);
        if (why) {
            st = kf_fail(KF_ERR_UNSUPPORTED, "node '%s': %s", kf_node_label(n), why);
            goto done;
        }
        for (int i = 0; i < n->nin; i++)
            if (n->in[i]) remaining[n->in[i]]++;
    }
    inp = kf_calloc(maxio, sizeof(kf_tensor *));
    outs = kf_calloc(maxio, sizeof(kf_tensor));
    if (!inp || !outs) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < g->ninputs; i++)
        if (bound[i] && (st = kf_tensor_copy(&vals[g->inputs[i]], bound[i]))) goto done;
    for (uint32_t k = 0; k < norder; k++) {
        const kf_node *n = &g->nodes[order[k]];
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i];
            inp[i] = NULL;
            if (!v) continue;
            const kf_value *val = &g->values[v];
            if (vals[v].data || vals[v].dtype) inp[i] = &vals[v];
            else if (val->init) inp[i] = val->init;
            else if (caller && val->is_input) continue; /* optional function input the call omits */
            else {
                st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): input '%s' has no value",
                             kf_node_label(n), n->op_type, val->name);
                goto done;
            }
        }
        if ((st = eval_call(m, n, caller, inp, outs, depth))) goto done;
        for (int j = 0; j < n->nout; j++) {
            if (n->out[j]) kf_tensor_move(&vals[n->out[j]], &outs[j]);
            else kf_tensor_release(&outs[j]);
        }
        if (opts && opts->on_node) {
            /* outputs now live in vals */
            for (int j = 0; j < n->nout; j++)
                if (n->out[j]) outs[j] = vals[n->out[j]];
            opts->on_node(opts->user, g, order[k], outs);
            memset(outs, 0, sizeof(kf_tensor) * (size_t)n->nout);
        }
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i];
            if (v && --remaining[v] == 0 && !g->values[v].is_output) kf_tensor_release(&vals[v]);
        }
    }
    for (uint32_t o = 0; o < g->noutputs; o++) {
        kf_id v = g->outputs[o];
        const kf_tensor *src = (vals[v].data || vals[v].dtype) ? &vals[v] : g->values[v].init;
        if (!src) {
            st = kf_fail(KF_ERR_BAD_MODEL, "%s output '%s' is never computed", caller ? "function" : "graph",
                         g->values[v].name);
            goto done;
        }
        if ((st = kf_tensor_copy(&outputs[o], src))) goto done;
    }
done:
    if (st && outputs)
        for (uint32_t o = 0; o < g->noutputs; o++) kf_tensor_release(&outputs[o]);
    if (vals)
        for (uint32_t v = 0; v < g->nvalues; v++) kf_tensor_release(&vals[v]);
    kf_free(vals);
    kf_free(remaining);
    kf_free(inp);
    kf_free(outs);
    kf_free(order);
    return st;
}

kf_status kf_eval_graph(const kf_model *m, const kf_graph *g, const kf_tensor *const *bound, kf_tensor *outputs,
                        int depth) {
    return eval_graph(m, g, bound, NULL, outputs, NULL, depth);
}

kf_status kf_eval_model(const kf_model *m, const kf_tensor *inputs, int ninputs,
                        kf_tensor *outputs, const kf_eval_opts *opts) {
    const kf_graph *g = m->graph;
    kf_id *real = NULL;
    uint32_t nreal = 0;
    KF_TRY(kf_graph_real_inputs(g, &real, &nreal));
    kf_status st = KF_OK;
    const kf_tensor **bound = NULL;
    if ((uint32_t)ninputs != nreal) {
        st = kf_fail(KF_ERR_INVALID_ARG, "model has %u inputs, %d were given", nreal, ninputs);
        goto done;
    }
    if (!(bound = kf_calloc(g->ninputs + 1, sizeof(kf_tensor *)))) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* real inputs are the graph inputs without initializer, in order */
    for (uint32_t i = 0, r = 0; i < g->ninputs; i++) {
        if (g->values[g->inputs[i]].init) continue;
        if ((st = check_input(g, real[r], &inputs[r]))) goto done;
        bound[i] = &inputs[r++];
    }
    st = eval_graph(m, g, bound, NULL, outputs, opts, 0);
done:
    kf_free(bound);
    kf_free(real);
    return st;
}
