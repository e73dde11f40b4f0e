/*
 * ir.c: the graph object: values and nodes in growable arrays named by dense
 * ids, a name -> value hash, use lists, symbolic-dim interning, attribute
 * ownership and topological ordering. Import, passes and the evaluator all
 * build on these few operations.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "kf_ir.h"
#include "kf_ops.h"

kf_graph *kf_graph_new(void) {
    kf_graph *g = kf_calloc(1, sizeof *g);
    if (!g) return NULL;
    /* slot 0 of each array is the "none" id */
    if (kf_grow((void **)&g->values, &g->capvalues, 16, sizeof(kf_value)) ||
        kf_grow((void **)&g->nodes, &g->capnodes, 16, sizeof(kf_node)) ||
        kf_grow((void **)&g->syms, &g->capsyms, 8, sizeof(char *))) {
        kf_graph_free(g);
        return NULL;
    }
    g->nvalues = g->nnodes = g->nsyms = 1;
    return g;
}

void kf_attr_release(kf_attr *a) {
    kf_free(a->name);
    kf_free(a->s.ptr);
    kf_free(a->ints);
    kf_free(a->floats);
    if (a->strings)
        for (int i = 0; i < a->n; i++) kf_free(a->strings[i].ptr);
    kf_free(a->strings);
    kf_tensor_free(a->t);
    kf_free(a->ref_attr_name);
    kf_free(a->doc);
    kf_free(a->packed);
    memset(a, 0, sizeof *a);
}

static void node_release(kf_node *n) {
    kf_free(n->name);
    kf_free(n->op_type);
    kf_free(n->domain);
    kf_free(n->doc);
    kf_free(n->in);
    kf_free(n->upos);
    kf_free(n->out);
    for (int k = 0; k < n->ncap; k++) kf_free(n->capname[k]);
    kf_free(n->capname);
    for (int i = 0; i < n->nattrs; i++) kf_attr_release(&n->attrs[i]);
    kf_free(n->attrs);
}

void kf_graph_free(kf_graph *g) {
    if (!g) return;
    kf_infer_scratch_free(g);
    for (uint32_t i = 1; i < g->nvalues; i++) {
        kf_value *v = &g->values[i];
        kf_free(v->name);
        kf_free(v->doc);
        kf_tensor_free(v->init);
        kf_free(v->users);
        kf_free(v->symval);
    }
    for (uint32_t i = 1; i < g->nnodes; i++) node_release(&g->nodes[i]);
    for (uint32_t i = 1; i < g->nsyms; i++) kf_free(g->syms[i]);
    for (uint32_t i = 1; i < g->nsymx; i++) kf_free(g->symx[i]);
    kf_free(g->symx);
    kf_free(g->sdim_memo);
    kf_free(g->values);
    kf_free(g->nodes);
    kf_free(g->syms);
    kf_free(g->inputs);
    kf_free(g->outputs);
    kf_free(g->touched);
    kf_free(g->inferq);
    kf_graph_fresh_free(g);
    kf_free(g->name);
    kf_free(g->doc);
    kf_free(g->hash);
    kf_free(g);
}

/* ---- name hash ---------------------------------------------------------- */

uint32_t kf_hash_str(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

static void hash_insert(kf_graph *g, kf_id id) {
    uint32_t mask = g->hashcap - 1;
    uint32_t i = kf_hash_str(g->values[id].name) & mask;
    while (g->hash[i]) i = (i + 1) & mask;
    g->hash[i] = id;
}

static kf_status hash_reserve(kf_graph *g, uint32_t nvalues) {
    if ((uint64_t)nvalues * 2 <= g->hashcap) return KF_OK;
    uint64_t cap = g->hashcap ? g->hashcap : 64;
    while (cap < (uint64_t)nvalues * 2) cap *= 2;
    if (cap > UINT32_MAX / 2) return kf_fail(KF_ERR_NOMEM, "too many values (%u)", nvalues);
    kf_id *h = kf_calloc((size_t)cap, sizeof(kf_id));
    if (!h) return kf_fail(KF_ERR_NOMEM, "out of memory for the value table");
    kf_free(g->hash);
    g->hash = h;
    g->hashcap = (uint32_t)cap;
    for (kf_id v = 1; v < g->nvalues; v++) hash_insert(g, v);
    return KF_OK;
}

kf_id kf_graph_find(const kf_graph *g, const char *name) {
    if (!g->hashcap || !name) return 0;
    uint32_t mask = g->hashcap - 1;
    uint32_t i = kf_hash_str(name) & mask;
    while (g->hash[i]) {
        if (strcmp(g->values[g->hash[i]].name, name) == 0) return g->hash[i];
        i = (i + 1) & mask;
    }
    return 0;
}

kf_status kf_graph_add_value(kf_graph *g, const char *name, kf_id *id) {
    if (!name) name = "";
    if (kf_graph_find(g, name)) return kf_fail(KF_ERR_BAD_MODEL, "tensor name '%s' is defined twice", name);
    KF_TRY(kf_grow((void **)&g->values, &g->capvalues, g->nvalues + 1, sizeof(kf_value)));
    KF_TRY(hash_reserve(g, g->nvalues + 1));
    kf_value *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    v->name = kf_strdup(name);
    if (!v->name) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_type_unknown(&v->type);
    *id = g->nvalues++;
    hash_insert(g, *id);
    return KF_OK;
}

kf_status kf_graph_intern_value(kf_graph *g, const char *name, kf_id *id) {
    kf_id v = kf_graph_find(g, name);
    if (v) {
        *id = v;
        return KF_OK;
    }
    return kf_graph_add_value(g, name, id);
}

kf_status kf_graph_add_node(kf_graph *g, const char *op_type, const char *domain,
                            const char *name, const kf_id *in, int nin, const kf_id *out,
                            int nout, kf_id *id) {
    if (nin < 0 || nout < 0) return kf_fail(KF_ERR_INVALID_ARG, "negative arity");
    for (int j = 0; j < nout; j++) {
        if (out[j] && g->values[out[j]].producer)
            return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s' is produced by two nodes ('%s' and '%s')",
                           g->values[out[j]].name, name ? name : "",
                           g->nodes[g->values[out[j]].producer].name);
        if (out[j] && (g->values[out[j]].init || g->values[out[j]].is_input))
            return kf_fail(KF_ERR_BAD_MODEL,
                           "node '%s' writes '%s', which is a graph input or initializer",
                           name ? name : "", g->values[out[j]].name);
    }
    /* An output listed twice: the producer slots (all 0 here) mark the ones
     * seen, so a node with many outputs is not a quadratic check. */
    const kf_id seen = (kf_id)-1;
    for (int j = 0; j < nout; j++) {
        if (!out[j]) continue;
        if (g->values[out[j]].producer == seen) {
            for (int k = 0; k < j; k++)
                if (out[k]) g->values[out[k]].producer = 0;
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' lists output '%s' twice",
                           name ? name : "", g->values[out[j]].name);
        }
        g->values[out[j]].producer = seen;
    }
    for (int j = 0; j < nout; j++)
        if (out[j]) g->values[out[j]].producer = 0;
    KF_TRY(kf_grow((void **)&g->nodes, &g->capnodes, g->nnodes + 1, sizeof(kf_node)));
    kf_id nid = g->nnodes;
    kf_node *n = &g->nodes[nid];
    memset(n, 0, sizeof *n);
    n->op_type = kf_strdup(op_type ? op_type : "");
    n->domain = kf_strdup(domain ? domain : "");
    n->name = kf_strdup(name ? name : "");
    n->in = kf_calloc((size_t)nin, sizeof(kf_id));
    n->upos = kf_calloc((size_t)nin, sizeof(uint32_t));
    n->out = kf_calloc((size_t)nout, sizeof(kf_id));
    if (!n->op_type || !n->domain || !n->name || !n->in || !n->upos || !n->out) {
        node_release(n);
        memset(n, 0, sizeof *n);
        return kf_fail(KF_ERR_NOMEM, "out of memory adding node");
    }
    g->nnodes++;
    n->op = kf_op_lookup(n->domain, n->op_type); /* callers that know it may set it again */
    n->nin = n->nupos = nin;
    n->nout = nout;
    for (int i = 0; i < nin; i++) {
        n->in[i] = in[i];
        if (in[i]) KF_TRY(kf_graph_add_use(g, nid, i));
    }
    for (int j = 0; j < nout; j++) {
        n->out[j] = out[j];
        if (out[j]) g->values[out[j]].producer = nid;
        kf_graph_touch(g, out[j], KF_TOUCH_DEF);
    }
    if (id) *id = nid;
    return KF_OK;
}

kf_status kf_node_add_capture(kf_graph *g, kf_id node, kf_id v, const char *name) {
    kf_node *n = &g->nodes[node];
    if (!v || v >= g->nvalues) return kf_fail(KF_ERR_INVALID_ARG, "node '%s': captured value id %u", kf_node_label(n), v);
    if (n->nin == INT_MAX) return kf_fail(KF_ERR_BAD_MODEL, "node '%s' has too many inputs", kf_node_label(n));
    kf_id *in = kf_realloc(n->in, (size_t)(n->nin + 1) * sizeof(kf_id));
    if (!in) return kf_fail(KF_ERR_NOMEM, "out of memory");
    n->in = in;
    if (n->nupos == n->nin) { /* keep the hints dense; without one the slot just has none */
        uint32_t *upos = kf_realloc(n->upos, (size_t)(n->nin + 1) * sizeof(uint32_t));
        if (!upos) return kf_fail(KF_ERR_NOMEM, "out of memory");
        n->upos = upos;
    }
    char **names = kf_realloc(n->capname, (size_t)(n->ncap + 1) * sizeof(char *));
    if (!names) return kf_fail(KF_ERR_NOMEM, "out of memory");
    n->capname = names;
    if (!(n->capname[n->ncap] = kf_strdup(name))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    n->in[n->nin++] = v;
    if (n->nupos == n->nin - 1) n->nupos++;
    kf_status st = kf_graph_add_use(g, node, n->nin - 1);
    if (st) {
        n->nin--;
        n->nupos = n->nupos > n->nin ? n->nin : n->nupos;
        kf_free(n->capname[n->ncap]);
        return st;
    }
    n->ncap++;
    return KF_OK;
}

uint32_t kf_graph_sym(kf_graph *g, const char *name) {
    for (uint32_t i = 1; i < g->nsyms; i++)
        if (strcmp(g->syms[i], name) == 0) return i;
    if (kf_grow((void **)&g->syms, &g->capsyms, g->nsyms + 1, sizeof(char *))) return 0;
    g->syms[g->nsyms] = kf_strdup(name);
    if (!g->syms[g->nsyms]) return 0;
    return g->nsyms++;
}

kf_status kf_graph_mark_input(kf_graph *g, kf_id v) {
    KF_TRY(kf_grow((void **)&g->inputs, &g->capinputs, g->ninputs + 1, sizeof(kf_id)));
    g->inputs[g->ninputs++] = v;
    g->values[v].is_input = true;
    return KF_OK;
}

kf_status kf_graph_mark_output(kf_graph *g, kf_id v) {
    KF_TRY(kf_grow((void **)&g->outputs, &g->capoutputs, g->noutputs + 1, sizeof(kf_id)));
    g->outputs[g->noutputs++] = v;
    g->values[v].is_output = true;
    kf_graph_touch(g, v, KF_TOUCH_DEF);
    return KF_OK;
}

/* ---- attributes ----------------------------------------------------------- */

static kf_status dup_bytes(kf_bytes *dst, const kf_bytes *src) {
    dst->len = 0;
    dst->ptr = NULL;
    if (!src->ptr) return KF_OK;
    dst->ptr = kf_strndup(src->ptr, src->len);
    if (!dst->ptr) return kf_fail(KF_ERR_NOMEM, "out of memory");
    dst->len = src->len;
    return KF_OK;
}

kf_status kf_attr_copy(kf_attr *dst, const kf_attr *src) {
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    dst->i = src->i;
    dst->f = src->f;
    dst->n = src->n;
    kf_status st = KF_ERR_NOMEM;
    if (!(dst->name = kf_strdup(src->name ? src->name : ""))) goto fail;
    if (src->ref_attr_name && !(dst->ref_attr_name = kf_strdup(src->ref_attr_name))) goto fail;
    if (src->doc && !(dst->doc = kf_strdup(src->doc))) goto fail;
    if (dup_bytes(&dst->s, &src->s)) goto fail;
    if (src->ints) {
        if (!(dst->ints = kf_calloc((size_t)src->n, sizeof(int64_t)))) goto fail;
        memcpy(dst->ints, src->ints, (size_t)src->n * sizeof(int64_t));
    }
    if (src->floats) {
        if (!(dst->floats = kf_calloc((size_t)src->n, sizeof(float)))) goto fail;
        memcpy(dst->floats, src->floats, (size_t)src->n * sizeof(float));
    }
    if (src->strings) {
        if (!(dst->strings = kf_calloc((size_t)src->n, sizeof(kf_bytes)))) goto fail;
        for (int i = 0; i < src->n; i++)
            if (dup_bytes(&dst->strings[i], &src->strings[i])) goto fail;
    }
    if (src->t) {
        if (!(dst->t = kf_tensor_new())) goto fail;
        if ((st = kf_tensor_copy(dst->t, src->t))) goto fail;
    }
    if (src->packed) {
        if (!(dst->packed = kf_malloc(src->packed_len))) goto fail;
        memcpy(dst->packed, src->packed, src->packed_len);
        dst->packed_len = src->packed_len;
    }
    return KF_OK;
fail:
    kf_attr_release(dst);
    return st == KF_ERR_NOMEM ? kf_fail(KF_ERR_NOMEM, "out of memory copying attribute") : st;
}

kf_status kf_node_add_attr(kf_node *n, const kf_attr *a) {
    kf_attr *na = kf_realloc(n->attrs, (size_t)(n->nattrs + 1) * sizeof(kf_attr));
    if (!na) return kf_fail(KF_ERR_NOMEM, "out of memory adding attribute");
    n->attrs = na;
    KF_TRY(kf_attr_copy(&n->attrs[n->nattrs], a));
    n->nattrs++;
    return KF_OK;
}

const kf_attr *kf_attr_find(const kf_node *n, const char *name) {
    for (int i = 0; i < n->nattrs; i++)
        if (n->attrs[i].name && strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t kf_attr_i(const kf_node *n, const char *name, int64_t def) {
    const kf_attr *a = kf_attr_find(n, name);
    return a && a->type == KF_ATTR_INT ? a->i : def;
}

float kf_attr_f(const kf_node *n, const char *name, float def) {
    const kf_attr *a = kf_attr_find(n, name);
    if (a && a->type == KF_ATTR_FLOAT) return a->f;
    return def;
}

const char *kf_attr_s(const kf_node *n, const char *name, const char *def) {
    const kf_attr *a = kf_attr_find(n, name);
    return a && a->type == KF_ATTR_STRING && a->s.ptr ? a->s.ptr : def;
}

const int64_t *kf_attr_ints(const kf_node *n, const char *name, int *count) {
    const kf_attr *a = kf_attr_find(n, name);
    if (a && a->type == KF_ATTR_INTS) {
        *count = a->n;
        return a->ints ? a->ints : (const int64_t *)"";
    }
    *count = 0;
    return NULL;
}

const float *kf_attr_floats(const kf_node *n, const char *name, int *count) {
    const kf_attr *a = kf_attr_find(n, name);
    if (a && a->type == KF_ATTR_FLOATS) {
        *count = a->n;
        return a->floats ? a->floats : (const float *)"\0\0\0";
    }
    *count = 0;
    return NULL;
}

const kf_tensor *kf_attr_t(const kf_node *n, const char *name) {
    const kf_attr *a = kf_attr_find(n, name);
    return a && a->type == KF_ATTR_TENSOR ? a->t : NULL;
}

const char *kf_node_label(const kf_node *n) {
    static _Thread_local char buf[256];
    if (n->name && n->name[0]) return n->name;
    snprintf(buf, sizeof buf, "<unnamed %s>", n->op_type ? n->op_type : "?");
    return buf;
}

/* ---- topological order ------------------------------------------------------ */

/* Depth-first: visit nodes in id order and emit a node once all its
 * producers are emitted, so a graph that is already sorted keeps its order
 * exactly. Iterative (an explicit stack), since graphs can be deep chains.
 *
 *   state 0 = unvisited, 1 = on the stack (its producers pending), 2 = emitted;
 *   meeting a node in state 1 again means a cycle.
 */
kf_status kf_graph_topo(const kf_graph *g, kf_id **order, uint32_t *count) {
    uint32_t nn = g->nnodes;
    uint8_t *state = kf_calloc(nn, 1);
    kf_id *out = kf_calloc(nn, sizeof(kf_id));
    kf_id *stack = kf_calloc(nn, sizeof(kf_id));
    int *next_in = kf_calloc(nn, sizeof(int)); /* next input slot to look at */
    if (!state || !out || !stack || !next_in) {
        kf_free(state);
        kf_free(out);
        kf_free(stack);
        kf_free(next_in);
        return kf_fail(KF_ERR_NOMEM, "out of memory sorting the graph");
    }
    uint32_t nout = 0;
    kf_id bad = 0;
    for (kf_id root = 1; root < nn && !bad; root++) {
        if (g->nodes[root].dead || state[root]) continue;
        uint32_t sp = 0;
        stack[sp++] = root;
        state[root] = 1;
        while (sp && !bad) {
            kf_id i = stack[sp - 1];
            const kf_node *n = &g->nodes[i];
            if (next_in[i] < n->nin) {
                kf_id v = n->in[next_in[i]++];
                kf_id p = v ? g->values[v].producer : 0;
                if (!p || g->nodes[p].dead || state[p] == 2) continue;
                if (state[p] == 1) {
                    bad = p;
                    break;
                }
                state[p] = 1;
                stack[sp++] = p;
                continue;
            }
            state[i] = 2;
            out[nout++] = i;
            sp--;
        }
    }
    kf_free(state);
    kf_free(stack);
    kf_free(next_in);
    if (bad) {
        kf_free(out);
        return kf_fail(KF_ERR_BAD_MODEL, "graph has a cycle through node '%s' (%s)", kf_node_label(&g->nodes[bad]),
                       g->nodes[bad].op_type);
    }
    *order = out;
    *count = nout;
    return KF_OK;
}

int64_t kf_model_opset(const kf_model *m, const char *domain) {
    int def = !domain || !domain[0] || strcmp(domain, "ai.onnx") == 0;
    for (int i = 0; i < m->nopsets; i++) {
        const char *d = m->opsets[i].domain ? m->opsets[i].domain : "";
        int ddef = !d[0] || strcmp(d, "ai.onnx") == 0;
        if (def ? ddef : strcmp(d, domain) == 0) return m->opsets[i].version;
    }
    return 0;
}
