/*
 * pass_fold.c: constant folding, a whole-graph pass (passes.def:
 * KF_GRAPH_PASS(fold)). A node whose inputs are all constants of the model
 * runs once on the reference evaluator and its outputs become initializers.
 * Constant nodes become initializers on the way. Shape inference tracks
 * what shape computations hold (kf_sym.h): one whose elements are all
 * known folds to them (Shape and Size of a static value, Gather of the
 * static dims out of a partly symbolic Shape, arithmetic whose symbols
 * cancel), and a
 * Reshape or Expand whose target holds symbols gets a constant target
 * instead (0 where Reshape keeps the input's dim, one -1 for the dim the
 * rest implies, 1 where Expand keeps it), so the Shape -> Gather -> Concat
 * chain feeding it dies.
 * A size cap keeps folding from ever inflating the model; a caller that
 * compiles the model instead of saving it may raise it (kf_pass_ctx).
 */
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"
#include "kf_sym.h"

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
        kf_graph_touch(g, v, KF_TOUCH_DEF);
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
    for (int i = 0; i < n->nin; i++) /* the kernels read data: a deferred merge is assembled */
        if (in[i] && in[i]->parts) KF_TRY(kf_tensor_settle(g->values[n->in[i]].init));
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

/* A node whose output 0 inference knows to hold constants only (a shape
 * computation whose symbols cancelled): the output becomes them. */
static kf_status fold_symval(kf_graph *g, kf_id node, bool *done) {
    const kf_node *n = &g->nodes[node];
    *done = false;
    if (n->nout != 1 || !n->out[0]) return KF_OK;
    const kf_value *o = &g->values[n->out[0]];
    if (!o->symval || !kf_symvec_const(o->symval) || !kf_dtype_valid(o->type.dtype)) return KF_OK;
    kf_tensor t = {0};
    KF_TRY(kf_symvec_tensor(o->symval, o->type.dtype, &t));
    kf_status st = commit(g, node, &t);
    kf_tensor_release(&t);
    *done = st == KF_OK;
    return st;
}

/* Targets the pass built this sweep, so equal targets share one value. */
typedef struct target_cache {
    kf_symvec *keys;
    kf_id *vals;
    uint32_t n, capk, capv;
    kf_id *shape_of; /* [value id] -> Shape(value) output built, 0 if none */
} target_cache;

static void cache_free(target_cache *c) {
    kf_free(c->keys);
    kf_free(c->vals);
    kf_free(c->shape_of);
}

static bool const_input(const kf_model *m, const kf_node *n, int i) {
    return i < n->nin && n->in[i] && kf_value_is_constant(m, n->in[i]);
}

/* A real graph input (not an initializer) with a dim whose symbol is sym;
 * *pos gets the dim. */
static kf_id input_with(const kf_model *m, uint32_t sym, int *pos) {
    const kf_graph *g = m->graph;
    for (uint32_t i = 0; i < g->ninputs; i++) {
        kf_id v = g->inputs[i];
        if (kf_value_is_constant(m, v) || g->values[v].init) continue;
        const kf_type *t = &g->values[v].type;
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] < 0 && t->syms[d] == sym) {
                *pos = d;
                return v;
            }
    }
    return 0;
}

/* True when v is already the form build_target writes: Shape(a graph
 * input), Gather(Shape(a graph input), constant), or a Concat of those and
 * constants. (A Gather of every dim in order is the Shape alone: the rules
 * take such a Gather away, and rebuilding it would undo them each round.) */
static bool built_form(const kf_model *m, kf_id v) {
    const kf_graph *g = m->graph;
    kf_id p = g->values[v].producer;
    const kf_node *n = p ? &g->nodes[p] : NULL;
    if (!n) return false;
    if (n->op == KF_OP_SHAPE)
        return kf_node_onnx_nin(n) == 1 && n->nattrs == 0 && n->in[0] && g->values[n->in[0]].is_input;
    if (n->op == KF_OP_GATHER) {
        kf_id sp = n->in[0] ? g->values[n->in[0]].producer : 0;
        const kf_node *s = sp ? &g->nodes[sp] : NULL;
        return s && s->op == KF_OP_SHAPE && s->in[0] && g->values[s->in[0]].is_input && const_input(m, n, 1);
    }
    if (n->op != KF_OP_CONCAT) return false;
    for (int i = 0; i < n->nin; i++)
        if (!const_input(m, n, i) && !built_form(m, n->in[i])) return false;
    return true;
}

static kf_status add_node(kf_model *m, const char *op, kf_op code, const char *base, const kf_id *in, int nin,
                          kf_id *out) {
    kf_graph *g = m->graph;
    kf_id node;
    KF_TRY(kf_graph_fresh_value(g, base, out));
    KF_TRY(kf_graph_add_node(g, op, "", base, in, nin, out, 1, &node));
    g->nodes[node].op = code;
    g->nodes[node].opset = kf_model_opset(m, "");
    if (code == KF_OP_CONCAT) {
        kf_attr axis = {.name = "axis", .type = KF_ATTR_INT, .i = 0};
        KF_TRY(kf_node_add_attr(&g->nodes[node], &axis));
    }
    return kf_infer_node(m, node);
}

static kf_status int64_const(kf_graph *g, const int64_t *v, int n, kf_id *id) {
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t dims[1] = {n};
    kf_status st = kf_tensor_alloc(t, KF_DT_INT64, 1, dims);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    for (int k = 0; k < n; k++) kf_set_i64(t, k, v[k]);
    return kf_graph_add_constant(g, "shape", t, id);
}

/* The smallest computation of target s that stays: dims read off the graph
 * inputs that carry their symbols (one Shape per input, one Gather per run
 * of symbols), constants between, one Concat. *out 0: no input carries
 * some symbol. */
static kf_status build_target(kf_model *m, target_cache *c, const kf_symvec *s, kf_id *out) {
    kf_graph *g = m->graph;
    *out = 0;
    for (uint32_t i = 0; i < c->n; i++)
        if (kf_symvec_equal(&c->keys[i], s)) {
            *out = c->vals[i];
            return KF_OK;
        }
    kf_id src[KF_SYMVEC_MAX];
    int pos[KF_SYMVEC_MAX];
    for (int d = 0; d < s->n; d++) {
        src[d] = 0;
        if (!kf_sdim_known(s->e[d])) return KF_OK;
        if (s->e[d].sym && !(src[d] = input_with(m, s->e[d].sym, &pos[d]))) return KF_OK;
    }
    if (!c->shape_of) {
        c->shape_of = kf_calloc(g->nvalues, sizeof(kf_id));
        if (!c->shape_of) return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_id pieces[KF_SYMVEC_MAX];
    int np = 0;
    for (int d = 0; d < s->n;) {
        int e = d;
        int64_t vals[KF_SYMVEC_MAX];
        int nv = 0;
        if (!src[d]) {
            while (e < s->n && !src[e]) vals[nv++] = s->e[e++].v;
            KF_TRY(int64_const(g, vals, nv, &pieces[np++]));
        } else {
            kf_id from = src[d];
            while (e < s->n && src[e] == from) vals[nv++] = pos[e++];
            if (!c->shape_of[from]) {
                kf_id in[1] = {from};
                KF_TRY(add_node(m, "Shape", KF_OP_SHAPE, "input_shape", in, 1, &c->shape_of[from]));
            }
            bool whole = nv == g->values[from].type.rank;
            for (int k = 0; k < nv && whole; k++) whole = vals[k] == k;
            if (whole) {
                pieces[np++] = c->shape_of[from];
                d = e;
                continue;
            }
            kf_id idx, in[2];
            KF_TRY(int64_const(g, vals, nv, &idx));
            in[0] = c->shape_of[from];
            in[1] = idx;
            KF_TRY(add_node(m, "Gather", KF_OP_GATHER, "dims", in, 2, &pieces[np++]));
        }
        d = e;
    }
    if (np == 1 && src[0]) *out = pieces[0];
    else KF_TRY(add_node(m, "Concat", KF_OP_CONCAT, "target", pieces, np, out));
    KF_TRY(kf_grow((void **)&c->keys, &c->capk, c->n + 1, sizeof *c->keys));
    KF_TRY(kf_grow((void **)&c->vals, &c->capv, c->n + 1, sizeof *c->vals));
    c->keys[c->n] = *s;
    c->vals[c->n++] = *out;
    return KF_OK;
}

/* Reshape/Expand whose target inference knows symbolically: a constant
 * target replaces it, else the smallest computation of it from the graph
 * inputs' shapes. */
static kf_status fold_sym_target(kf_model *m, target_cache *c, kf_id node, bool *done) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    *done = false;
    if (kf_node_onnx_nin(n) != 2 || !n->in[0] || !n->in[1]) return KF_OK;
    const kf_value *t = &g->values[n->in[1]];
    if (t->init || !t->symval || t->symval->n > KF_MAX_RANK || t->symval->rank != 1) return KF_OK;
    int64_t vals[KF_MAX_RANK];
    kf_id cv = 0;
    kf_symvec key = *t->symval;
    const kf_type *x = &g->values[n->in[0]].type;
    bool allowzero = n->op == KF_OP_RESHAPE && kf_attr_i(n, "allowzero", 0);
    if (kf_symvec_target(x, &key, n->op == KF_OP_RESHAPE, allowzero, vals)) {
        KF_TRY(int64_const(g, vals, key.n, &cv));
    } else {
        if (built_form(m, n->in[1])) return KF_OK;
        KF_TRY(build_target(m, c, &key, &cv));
        if (!cv) return KF_OK;
    }
    KF_TRY(kf_graph_set_input(g, node, 1, cv));
    *done = true;
    return KF_OK;
}

/* The tensor of a Constant node that holds its value as a `value` tensor
 * (the form its evaluation copies whole), else NULL; a malformed node is
 * left to the evaluation, which names what is wrong. */
static kf_attr *value_tensor(kf_node *n) {
    const kf_attr *a;
    if (kf_constant_value_attr(n, &a)) {
        kf_clear_error();
        return NULL;
    }
    if (strcmp(a->name, "value") || a->t->parts || n->nout != 1 || !n->out[0]) return NULL;
    return (kf_attr *)a;
}

kf_status kf_pass_fold_constant_nodes(kf_model *m, kf_pass_ctx *ctx) {
    kf_graph *g = m->graph;
    const kf_tensor *none[1] = {NULL};
    for (kf_id id = 1; id < g->nnodes && ctx->fuel != 0; id++) {
        kf_node *n = &g->nodes[id];
        if (n->dead || n->op != KF_OP_CONSTANT || n->nin || !output_used(g, n) || (id < ctx->nkeep && ctx->keep[id]))
            continue;
        int64_t cap;
        bool done = false;
        if (foldable(m, n, none, &cap) || !fits_before(n, none, cap)) continue;
        kf_attr *a = value_tensor(n);
        if (a) { /* the node goes: its tensor moves into the initializer rather than being copied */
            kf_tensor t = {0};
            kf_tensor_move(&t, a->t);
            kf_status st = commit(g, id, &t);
            if (st) {
                kf_tensor_move(a->t, &t); /* commit changed nothing */
                return st;
            }
            done = true;
        } else {
            KF_TRY(eval_and_commit(g, id, none, cap, &done));
        }
        if (!done) continue;
        ctx->changes++;
        if (ctx->fuel > 0) ctx->fuel--;
        if (ctx->trace) fprintf(stderr, "kfuse: fold at node '%s'\n", kf_node_label(&g->nodes[id]));
    }
    return KF_OK;
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
    target_cache cache = {0};
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
        bool done = false;
        int64_t cap;
        bool kept = (ctx->keep_quantized && n->op == KF_OP_DEQUANTIZE_LINEAR) || (id < ctx->nkeep && ctx->keep[id]);
        if (!kept && !foldable(m, n, in, &cap)) {
            if (ctx->fold_cap_bytes > cap) cap = ctx->fold_cap_bytes;
            if (fits_before(n, in, cap)) st = eval_and_commit(g, id, in, cap, &done);
        }
        if (!done && !st && (n->op == KF_OP_RESHAPE || n->op == KF_OP_EXPAND))
            st = fold_sym_target(m, &cache, id, &done);
        if (!done && !st) st = fold_symval(g, id, &done);
        if (!done) continue;
        ctx->changes++;
        if (ctx->fuel > 0) ctx->fuel--;
        if (ctx->trace) fprintf(stderr, "kfuse: fold at node '%s'\n", kf_node_label(&g->nodes[id])); /* dead nodes keep their names */
    }
    cache_free(&cache);
    kf_free(in);
    kf_free(order);
    return st;
}
