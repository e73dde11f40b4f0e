/*
 * pass_cse.c: common-subexpression elimination, a whole-graph pass
 * (passes.def: KF_GRAPH_PASS(cse)). Equal initializers (dtype, shape, every
 * byte) become one, then nodes computing the same op on the same inputs
 * with equal attributes become one: the first in topological order stays
 * and the readers of the others read it. One hash table each, so the pass
 * is linear in the graph and deterministic (ids and order decide ties).
 */
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"

/* Initializers over this size are not compared: duplicated weights are
 * rare, while hashing every large tensor on every round is not free. */

/* ---- hashing (FNV-1a) --------------------------------------------------------------- */

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

#define HASH_SEED 0xcbf29ce484222325ULL

/* Tensor bytes, eight at a time (FNV's step on words, with a rotation so
 * high bits reach the low ones the table indexes by): weights are hashed on
 * every round, and byte steps made this pass the optimizer's largest cost
 * on ResNet-50. Any function of the bytes serves; equality decides. */
static uint64_t mix_word(uint64_t h, const unsigned char *b) {
    uint64_t w;
    memcpy(&w, b, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* Four independent chains over interleaved words, joined at the end: one
 * chain waits on each multiply, four keep the multiplier busy. */
static uint64_t mix_bulk(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t words = n / 8, i = 0;
    if (words >= 8) {
        uint64_t l[4] = {h, h ^ 0x9e3779b97f4a7c15ULL, h ^ 0xbf58476d1ce4e5b9ULL, h ^ 0x94d049bb133111ebULL};
        for (; i + 4 <= words; i += 4)
            for (int k = 0; k < 4; k++) l[k] = mix_word(l[k], b + 8 * (i + k));
        h = l[0];
        for (int k = 1; k < 4; k++) h = mix(h, &l[k], sizeof l[k]);
    }
    for (; i < words; i++) h = mix_word(h, b + 8 * i);
    return mix(h, b + 8 * words, n % 8);
}

/* Tensor bytes up to 512 whole; past that, 64 words spread evenly over the
 * data, and its last word. Equal tensors hash alike either way, and
 * equality is decided by comparing every byte; the sample keeps the pass
 * from reading every weight that shares its shape with another (each
 * layer's, in a transformer) every round, when real weights already differ
 * in their first few words. */
#define HASH_WHOLE_BYTES 512
#define HASH_SAMPLE_WORDS 64
static uint64_t mix_tensor_bytes(uint64_t h, const void *p, size_t n) {
    if (n <= HASH_WHOLE_BYTES) return mix_bulk(h, p, n);
    const unsigned char *b = p;
    size_t step = (n / 8) / HASH_SAMPLE_WORDS * 8;
    for (size_t i = 0; i < HASH_SAMPLE_WORDS; i++) h = mix_bulk(h, b + i * step, 8);
    return mix_bulk(mix(h, &n, sizeof n), b + n - 8, 8);
}

static uint64_t mix_str(uint64_t h, const char *s) { return mix(h, s ? s : "", s ? strlen(s) + 1 : 1); }

static uint64_t hash_tensor(uint64_t h, const kf_tensor *t) {
    h = mix(h, &t->dtype, sizeof t->dtype);
    h = mix(h, &t->rank, sizeof t->rank);
    h = mix(h, t->dims, sizeof(int64_t) * (size_t)t->rank);
    if (t->dtype == KF_DT_STRING) {
        const kf_bytes *s = t->data;
        for (int64_t i = 0; s && i < t->numel; i++) h = mix(mix(h, &s[i].len, sizeof s[i].len), s[i].ptr, s[i].len);
        return h;
    }
    return t->data ? mix_tensor_bytes(h, t->data, (size_t)t->numel * kf_dtype_size(t->dtype)) : h;
}

static uint64_t hash_attr(const kf_attr *a) {
    uint64_t h = mix_str(HASH_SEED, a->name);
    h = mix(h, &a->type, sizeof a->type);
    switch (a->type) {
    case KF_ATTR_INT: return mix(h, &a->i, sizeof a->i);
    case KF_ATTR_FLOAT: return mix(h, &a->f, sizeof a->f);
    case KF_ATTR_STRING: return mix(h, a->s.ptr, a->s.len);
    case KF_ATTR_INTS: return mix(h, a->ints, sizeof(int64_t) * (size_t)a->n);
    case KF_ATTR_FLOATS: return mix(h, a->floats, sizeof(float) * (size_t)a->n);
    case KF_ATTR_TENSOR: return a->t ? hash_tensor(h, a->t) : h;
    default: return a->packed ? mix(h, a->packed, a->packed_len) : h;
    }
}

/* ---- equality ------------------------------------------------------------------------- */

static bool same_bytes(const void *a, const void *b, size_t n) { return n == 0 || (a && b && !memcmp(a, b, n)); }

static bool same_str(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }

static bool attr_equal(const kf_attr *a, const kf_attr *b) {
    if (a->type != b->type || !same_str(a->name, b->name) || !same_str(a->ref_attr_name, b->ref_attr_name))
        return false;
    switch (a->type) {
    case KF_ATTR_INT: return a->i == b->i;
    case KF_ATTR_FLOAT: return same_bytes(&a->f, &b->f, sizeof a->f); /* -0 differs from 0 */
    case KF_ATTR_STRING: return a->s.len == b->s.len && same_bytes(a->s.ptr, b->s.ptr, a->s.len);
    case KF_ATTR_INTS: return a->n == b->n && same_bytes(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n);
    case KF_ATTR_FLOATS: return a->n == b->n && same_bytes(a->floats, b->floats, sizeof(float) * (size_t)a->n);
    case KF_ATTR_STRINGS:
        if (a->n != b->n || a->packed || b->packed) return a->n == b->n && a->packed_len == b->packed_len &&
                                                           same_bytes(a->packed, b->packed, a->packed_len);
        for (int i = 0; i < a->n; i++)
            if (a->strings[i].len != b->strings[i].len ||
                !same_bytes(a->strings[i].ptr, b->strings[i].ptr, a->strings[i].len))
                return false;
        return true;
    case KF_ATTR_TENSOR: return a->t && b->t ? kf_tensor_equal(a->t, b->t) : a->t == b->t;
    default: return a->packed_len == b->packed_len && same_bytes(a->packed, b->packed, a->packed_len);
    }
}

/* Attributes are equal as sets by name (files may list them in any order). */
static bool attrs_equal(const kf_node *a, const kf_node *b) {
    if (a->nattrs != b->nattrs) return false;
    for (int i = 0; i < a->nattrs; i++) {
        const kf_attr *o = kf_attr_find(b, a->attrs[i].name);
        if (!o || !attr_equal(&a->attrs[i], o)) return false;
    }
    return true;
}

/* Two-input ops the op table calls commutative compare their inputs as a
 * pair in either order. Longer operand lists keep their order: reordering
 * a floating-point sum changes its rounding. */
static bool swappable(const kf_node *n) {
    const kf_op_info *info = kf_op_get(n->op);
    return info && (info->flags & KF_F_COMMUTATIVE) && n->nin == 2;
}

static bool inputs_equal(const kf_node *a, const kf_node *b) {
    if (a->nin != b->nin) return false;
    if (swappable(a) && a->in[0] == b->in[1] && a->in[1] == b->in[0]) return true;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return false;
    return true;
}

static bool nodes_equal(const kf_node *a, const kf_node *b) {
    return a->op == b->op && a->opset == b->opset && a->nout == b->nout && same_str(a->op_type, b->op_type) &&
           same_str(a->domain, b->domain) && inputs_equal(a, b) && attrs_equal(a, b);
}

static uint64_t hash_node(const kf_node *n) {
    uint64_t h = mix_str(mix_str(HASH_SEED, n->op_type), n->domain);
    h = mix(h, &n->nout, sizeof n->nout);
    if (swappable(n)) {
        kf_id lo = n->in[0] < n->in[1] ? n->in[0] : n->in[1], hi = n->in[0] ^ n->in[1] ^ lo;
        h = mix(mix(h, &lo, sizeof lo), &hi, sizeof hi);
    } else {
        h = mix(h, n->in, sizeof(kf_id) * (size_t)n->nin);
    }
    uint64_t ah = 0; /* a sum, so attribute order does not matter */
    for (int i = 0; i < n->nattrs; i++) ah += hash_attr(&n->attrs[i]);
    return mix(h, &ah, sizeof ah);
}

/* ---- the table ------------------------------------------------------------------------ */

/* Open addressing over ids, sized to at least twice the entries. */
typedef struct table {
    kf_id *slot;
    uint64_t *hash;
    uint32_t cap; /* power of two */
} table;

static void table_free(table *t) {
    kf_free(t->slot);
    kf_free(t->hash);
    t->slot = NULL;
    t->hash = NULL;
}

static kf_status table_init(table *t, uint32_t entries) {
    t->cap = 16;
    while (t->cap < 2 * entries + 2) t->cap *= 2;
    t->slot = kf_calloc(t->cap, sizeof *t->slot);
    t->hash = kf_calloc(t->cap, sizeof *t->hash);
    if (!t->slot || !t->hash) {
        table_free(t);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    return KF_OK;
}

/* Returns the first earlier entry equal to id, or inserts id and returns 0. */
static kf_id table_find_or_add(table *t, uint64_t h, kf_id id, const kf_graph *g,
                               bool (*eq)(const kf_graph *, kf_id, kf_id)) {
    uint32_t i = (uint32_t)h & (t->cap - 1);
    for (; t->slot[i]; i = (i + 1) & (t->cap - 1))
        if (t->hash[i] == h && eq(g, t->slot[i], id)) return t->slot[i];
    t->slot[i] = id;
    t->hash[i] = h;
    return 0;
}

static bool node_eq(const kf_graph *g, kf_id a, kf_id b) { return nodes_equal(&g->nodes[a], &g->nodes[b]); }

static bool init_eq(const kf_graph *g, kf_id a, kf_id b) {
    return kf_tensor_equal(g->values[a].init, g->values[b].init);
}

/* ---- the pass --------------------------------------------------------------------------- */

/* Can readers of `from` read `to` instead? A graph output keeps its name by
 * moving it onto `to`, which must not have a name of its own to keep. */
static bool can_redirect(const kf_graph *g, kf_id from, kf_id to) {
    const kf_value *f = &g->values[from], *t = &g->values[to];
    return !f->is_output || !(t->is_input || t->is_output || t->init);
}

static void note(kf_pass_ctx *ctx, const char *what, const char *dup, const char *kept) {
    ctx->changes++;
    if (ctx->fuel > 0) ctx->fuel--;
    if (ctx->trace) fprintf(stderr, "kfuse: cse %s '%s' -> '%s'\n", what, dup, kept);
}

static bool same_header(const kf_graph *g, kf_id a, kf_id b) {
    const kf_tensor *x = g->values[a].init, *y = g->values[b].init;
    return x->dtype == y->dtype && x->rank == y->rank && !memcmp(x->dims, y->dims, sizeof(int64_t) * (size_t)x->rank);
}

/* An initializer CSE compares: a constant someone reads, small enough. */
static bool cse_candidate(const kf_value *val) {
    const kf_tensor *x = val->init;
    if (!x || x->parts || val->is_input || val->is_output || !val->nusers || x->dtype == KF_DT_STRING) return false;
    return x->numel * (int64_t)kf_dtype_size(x->dtype) <= KF_CSE_MAX_INIT_BYTES;
}

/* Each initializer equal to an earlier one (lowest id first) is replaced by
 * it. Only initializers whose dtype and shape another candidate shares can
 * have an equal, so the others' bytes are never hashed: on a real model
 * that is nearly every weight, on every round of the optimizer. */
static kf_status merge_initializers(kf_graph *g, kf_pass_ctx *ctx) {
    table t, shapes;
    KF_TRY(table_init(&shapes, g->nvalues));
    bool *shared = kf_calloc(g->nvalues, sizeof *shared);
    if (!shared) {
        table_free(&shapes);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (kf_id v = 1; v < g->nvalues; v++) {
        if (!cse_candidate(&g->values[v])) continue;
        const kf_tensor *x = g->values[v].init;
        uint64_t h = mix(mix(HASH_SEED, &x->dtype, sizeof x->dtype), &x->rank, sizeof x->rank);
        kf_id first = table_find_or_add(&shapes, mix(h, x->dims, sizeof(int64_t) * (size_t)x->rank), v, g, same_header);
        if (first) shared[first] = shared[v] = true;
    }
    table_free(&shapes);
    kf_status st = table_init(&t, g->nvalues);
    for (kf_id v = 1; v < g->nvalues && !st && ctx->fuel != 0; v++) {
        if (!shared[v] || !cse_candidate(&g->values[v])) continue;
        kf_id first = table_find_or_add(&t, hash_tensor(HASH_SEED, g->values[v].init), v, g, init_eq);
        if (!first) continue;
        if ((st = kf_graph_replace_uses(g, v, first))) break;
        note(ctx, "initializer", g->values[v].name, g->values[first].name);
    }
    table_free(&t);
    kf_free(shared);
    return st;
}

/* Readers of b's outputs read a's; false (nothing changed) when some output
 * of b cannot be redirected. */
static bool node_redirectable(const kf_graph *g, const kf_node *a, const kf_node *b) {
    for (int j = 0; j < b->nout; j++) {
        kf_id vb = b->out[j], va = a->out[j];
        if (!vb || (!g->values[vb].nusers && !g->values[vb].is_output)) continue;
        if (!va || !can_redirect(g, vb, va)) return false;
    }
    return true;
}

static kf_status merge_nodes(kf_graph *g, kf_pass_ctx *ctx) {
    kf_id *order;
    uint32_t norder;
    KF_TRY(kf_graph_topo(g, &order, &norder));
    table t = {0};
    kf_status st = table_init(&t, norder);
    for (uint32_t k = 0; k < norder && !st && ctx->fuel != 0; k++) {
        kf_id id = order[k];
        const kf_node *n = &g->nodes[id];
        /* unknown ops may be random or have effects; a Dropout may be training */
        if (n->dead || !n->op || n->op == KF_OP_DROPOUT) continue;
        kf_id first = table_find_or_add(&t, hash_node(n), id, g, node_eq);
        if (!first || !node_redirectable(g, &g->nodes[first], n)) continue;
        for (int j = 0; j < n->nout && !st; j++) {
            kf_id vb = g->nodes[id].out[j];
            if (vb && (g->values[vb].nusers || g->values[vb].is_output))
                st = kf_graph_replace_uses(g, vb, g->nodes[first].out[j]);
        }
        if (st) break;
        char dup[256];
        snprintf(dup, sizeof dup, "%s", kf_node_label(&g->nodes[id]));
        note(ctx, "node", dup, kf_node_label(&g->nodes[first]));
    }
    table_free(&t);
    kf_free(order);
    return st;
}

kf_status kf_pass_cse(kf_model *m, kf_pass_ctx *ctx) {
    KF_TRY(merge_initializers(m->graph, ctx));
    if (ctx->fuel == 0) return KF_OK;
    return merge_nodes(m->graph, ctx);
}
