/*
 * memplan.c: liveness-based arena planning for a fusion plan (DESIGN.md
 * "Plan": one arena per plan). Finds which values cross group boundaries,
 * the steps each one is alive, and packs them into one arena greedily by
 * size with best fit. Sits between the planner (fusion/) and the runtime,
 * which allocates arena_bytes once and binds each value to arena + offset.
 */
#include <stdlib.h>
#include <string.h>

#include "kf_memplan.h"

/* One value that needs arena bytes; first/last are plan steps (group
 * indices), both alive. */
typedef struct mp_item {
    kf_id value;
    uint32_t first, last;
    int64_t size;
    int64_t offset;
} mp_item;

static int by_size_desc(const void *pa, const void *pb) {
    const mp_item *a = pa, *b = pb;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return a->value < b->value ? -1 : a->value > b->value;
}

static bool meet(const mp_item *a, const mp_item *b) { return a->first <= b->last && b->first <= a->last; }

/* Smallest multiple of align (a power of two) >= x; false on overflow. */
static bool align_up(int64_t x, int64_t align, int64_t *r) {
    int64_t t;
    if (!kf_add_ok(x, align - 1, &t)) return false;
    *r = t & ~(align - 1);
    return true;
}

void kf_memplan_release(kf_memplan *mp) {
    if (!mp) return;
    kf_free(mp->offset);
    memset(mp, 0, sizeof *mp);
}

/* Step range of a group: its own index, widened to every group of its
 * launch when it is batched with others (span_first/span_last per launch). */
static void group_span(const kf_plan *p, const uint32_t *span_first, const uint32_t *span_last, uint32_t k,
                       uint32_t *first, uint32_t *last) {
    uint32_t l = p->groups[k].launch;
    if (l == UINT32_MAX || l >= p->launches) {
        *first = *last = k;
        return;
    }
    *first = span_first[l];
    *last = span_last[l];
}

/* The bytes of value v, or KF_ERR_SHAPE naming it. */
static kf_status value_bytes(const kf_graph *g, kf_id v, uint32_t group, int64_t *bytes) {
    const kf_value *val = &g->values[v];
    size_t esz = kf_dtype_size(val->type.dtype);
    if (!esz || !kf_type_is_static(&val->type))
        return kf_fail(KF_ERR_SHAPE,
                       "memory plan: value '%s' (written by group %u) has an unknown %s; fix symbolic "
                       "dimensions before planning memory",
                       val->name, group, esz ? "shape" : "dtype");
    int64_t numel, b;
    if (kf_shape_numel(val->type.rank, val->type.dims, esz, &numel) != KF_OK || !kf_mul_ok(numel, (int64_t)esz, &b))
        return kf_fail(KF_ERR_SHAPE, "memory plan: value '%s' (written by group %u) is too large", val->name, group);
    *bytes = b;
    return KF_OK;
}

/* A view group (kf_group.view: only Reshape/Flatten/Squeeze/Unsqueeze, no
 * kernel) gives its outputs the bytes of its input under a new shape. The
 * value whose bytes w really are: follow producers through view groups. */
static kf_id alias_root(const kf_graph *g, const kf_plan *p, kf_id w) {
    for (uint32_t hops = 0; hops < g->nnodes; hops++) {
        kf_id pr = g->values[w].producer;
        if (!pr || pr >= g->nnodes || g->nodes[pr].dead || g->nodes[pr].nin < 1) break;
        uint32_t k = p->group_of[pr];
        if (k >= p->ngroups || !p->groups[k].view) break;
        kf_id src = g->nodes[pr].in[0];
        if (!src || src >= g->nvalues) break;
        w = src;
    }
    return w;
}

/* Whether value r, written at run time by a kernel group, may be given
 * arena bytes: not a weight, graph input or output, plan-time constant or
 * string tensor. *group receives its producer's group. */
static bool arena_kind(const kf_graph *g, const kf_plan *p, kf_id r, uint32_t *group) {
    const kf_value *val = &g->values[r];
    kf_id pr = val->producer;
    if (!pr || pr >= g->nnodes || g->nodes[pr].dead) return false;
    uint32_t k = p->group_of[pr];
    if (k >= p->ngroups || p->groups[k].kind == KF_GROUP_CONST || p->groups[k].view) return false;
    *group = k;
    return !val->is_output && !val->is_input && !val->init && val->type.dtype != KF_DT_STRING;
}

/* Collects the arena values of p into items (caller frees), with their
 * lifetimes; root[v] (caller's, nvalues entries) receives each value's
 * alias root. A value is in the arena when a group other than its
 * producer's reads it or one of its views. */
static kf_status collect(const kf_model *m, const kf_plan *p, kf_id *root, mp_item **out, uint32_t *count) {
    const kf_graph *g = m->graph;
    uint32_t nl = p->launches, nv = g->nvalues;
    uint32_t *span_first = kf_malloc((size_t)(nl ? nl : 1) * 2 * sizeof *span_first);
    uint32_t *first = kf_malloc((size_t)nv * 2 * sizeof *first);
    uint32_t cap = 0, n = 0;
    mp_item *items = NULL;
    kf_status st = KF_OK;
    if (!span_first || !first) {
        kf_free(span_first);
        kf_free(first);
        return kf_fail(KF_ERR_NOMEM, "memory plan: out of memory");
    }
    uint32_t *span_last = span_first + (nl ? nl : 1), *last = first + nv;
    for (uint32_t l = 0; l < nl; l++) span_first[l] = UINT32_MAX, span_last[l] = 0;
    for (uint32_t k = 0; k < p->ngroups; k++) {
        uint32_t l = p->groups[k].launch;
        if (l == UINT32_MAX || l >= nl) continue;
        if (span_first[l] == UINT32_MAX) span_first[l] = k;
        span_last[l] = k;
    }
    for (kf_id v = 0; v < nv; v++) first[v] = UINT32_MAX, root[v] = v ? alias_root(g, p, v) : 0;
    /* lifetimes of roots, from the readers of every alias */
    for (kf_id w = 1; w < nv && !st; w++) {
        kf_id r = root[w];
        uint32_t gp, f, l;
        if (!arena_kind(g, p, r, &gp)) continue;
        const kf_value *val = &g->values[w];
        for (uint32_t u = 0; u < val->nusers; u++) {
            kf_id node = val->users[u];
            if (node >= g->nnodes || g->nodes[node].dead) continue;
            uint32_t rk = p->group_of[node];
            if (rk == UINT32_MAX || rk == gp) continue;
            if (rk >= p->ngroups) {
                st = kf_fail(KF_ERR_INVALID_ARG, "memory plan: node '%s' is in group %u of %u",
                             kf_node_label(&g->nodes[node]), rk, p->ngroups);
                break;
            }
            if (first[r] == UINT32_MAX) group_span(p, span_first, span_last, gp, &first[r], &last[r]);
            group_span(p, span_first, span_last, rk, &f, &l);
            if (l > last[r]) last[r] = l;
            if (f < first[r]) first[r] = f; /* a reader batched with the producer's launch: cannot happen, stay safe */
        }
    }
    for (kf_id r = 1; r < nv && !st; r++) {
        if (first[r] == UINT32_MAX) continue;
        int64_t bytes = 0;
        if ((st = value_bytes(g, r, p->group_of[g->values[r].producer], &bytes))) break;
        if (n == cap && (st = kf_grow((void **)&items, &cap, n + 1, sizeof *items))) break;
        items[n++] = (mp_item){r, first[r], last[r], bytes, -1};
    }
    kf_free(span_first);
    kf_free(first);
    if (st) {
        kf_free(items);
        return st;
    }
    *out = items;
    *count = n;
    return KF_OK;
}

/* Max over steps of the bytes alive at that step (a sweep over a difference
 * array, O(n + steps)). */
static kf_status live_bound(const mp_item *items, uint32_t n, uint32_t nsteps, int64_t *bound) {
    int64_t *diff = kf_calloc((size_t)nsteps + 1, sizeof *diff);
    if (!diff) return kf_fail(KF_ERR_NOMEM, "memory plan: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        diff[items[i].first] += items[i].size;
        diff[items[i].last + 1] -= items[i].size;
    }
    int64_t live = 0, best = 0;
    kf_status st = KF_OK;
    for (uint32_t s = 0; s < nsteps; s++) {
        if (!kf_add_ok(live, diff[s], &live)) {
            st = kf_fail(KF_ERR_NOMEM, "memory plan: live bytes overflow at step %u", s);
            break;
        }
        if (live > best) best = live;
    }
    kf_free(diff);
    *bound = best;
    return st;
}

/*
 * Greedy by size, best fit. `placed` holds the items already given an
 * offset, sorted by offset. For the next (smaller or equal) item, walk them
 * in offset order, looking only at those alive at some common step; the
 * holes between them are candidate places:
 *
 *   offset 0                                              ->
 *   | A (steps 0-3) |  hole  | B (steps 2-5) | ...          end
 *                   ^ aligned start of the hole
 *
 * The smallest hole that holds the item wins (lowest offset on ties);
 * without one, the item goes past the end of the last such value.
 */
static kf_status pack(mp_item *items, uint32_t n, int64_t align, int64_t *arena) {
    uint32_t *placed = kf_malloc((size_t)(n ? n : 1) * sizeof *placed);
    if (!placed) return kf_fail(KF_ERR_NOMEM, "memory plan: out of memory");
    uint32_t np = 0;
    int64_t top = 0;
    for (uint32_t i = 0; i < n; i++) {
        mp_item *it = &items[i];
        if (it->size == 0) { /* takes no bytes, overlaps nothing */
            it->offset = 0;
            continue;
        }
        int64_t end = 0, best = -1, best_gap = INT64_MAX, at;
        for (uint32_t j = 0; j < np; j++) {
            const mp_item *q = &items[placed[j]];
            if (!meet(it, q)) continue;
            int64_t start;
            if (!align_up(end, align, &start)) goto overflow;
            if (q->offset >= start && q->offset - start >= it->size && q->offset - start < best_gap) {
                best_gap = q->offset - start;
                best = start;
            }
            if (q->offset + q->size > end) end = q->offset + q->size;
        }
        if (best < 0 && !align_up(end, align, &best)) goto overflow;
        it->offset = best;
        if (!kf_add_ok(best, it->size, &at)) goto overflow;
        if (at > top) top = at;
        uint32_t lo = 0, hi = np; /* insertion point by offset */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (items[placed[mid]].offset <= best) lo = mid + 1;
            else hi = mid;
        }
        memmove(placed + lo + 1, placed + lo, (size_t)(np - lo) * sizeof *placed);
        placed[lo] = i;
        np++;
    }
    kf_free(placed);
    *arena = top;
    return KF_OK;
overflow:
    kf_free(placed);
    return kf_fail(KF_ERR_NOMEM, "memory plan: arena size overflows");
}

kf_status kf_memplan_build(const kf_model *m, const kf_plan *p, int64_t align, kf_memplan *out) {
    if (!out) return kf_fail(KF_ERR_INVALID_ARG, "memory plan: no output");
    memset(out, 0, sizeof *out);
    if (!m || !m->graph || !p) return kf_fail(KF_ERR_INVALID_ARG, "memory plan: no model or plan");
    if (align < 1 || align > KF_MEMPLAN_MAX_ALIGN || (align & (align - 1)))
        return kf_fail(KF_ERR_INVALID_ARG, "memory plan: alignment %lld is not a power of two in 1..%d",
                       (long long)align, KF_MEMPLAN_MAX_ALIGN);
    const kf_graph *g = m->graph;
    mp_item *items = NULL;
    uint32_t n = 0;
    kf_id *root = kf_malloc((size_t)g->nvalues * sizeof *root);
    if (!root) return kf_fail(KF_ERR_NOMEM, "memory plan: out of memory");
    kf_status st = collect(m, p, root, &items, &n);
    if (!st) st = live_bound(items, n, p->ngroups, &out->live_lower_bound);
    if (!st) {
        if (n) qsort(items, n, sizeof *items, by_size_desc); /* items is NULL when n is 0 */
        st = pack(items, n, align, &out->arena_bytes);
    }
    if (!st) {
        out->offset = kf_malloc(((size_t)g->nvalues + 1) * sizeof *out->offset);
        if (!out->offset) st = kf_fail(KF_ERR_NOMEM, "memory plan: out of memory");
    }
    if (!st) {
        out->nvalues = g->nvalues;
        for (uint32_t v = 0; v <= g->nvalues; v++) out->offset[v] = -1;
        for (uint32_t i = 0; i < n; i++) out->offset[items[i].value] = items[i].offset;
        for (kf_id w = 1; w < g->nvalues; w++) /* views share their root's bytes; graph outputs are the caller's */
            if (root[w] != w && !g->values[w].is_output) out->offset[w] = out->offset[root[w]];
    }
    kf_free(items);
    kf_free(root);
    if (st) kf_memplan_release(out);
    return st;
}
