/*
 * ir_edit.c: the few edits every rewrite is made of: redirect uses, remove
 * a node, set an input, add fresh values and constants, dead-code
 * elimination. Passes never touch use lists directly; going through here
 * keeps them consistent.
 */
#include <stdio.h>
#include <string.h>

#include "kf_ir.h"
#include "kf_sym.h"

/* Use lists and position hints:
 *
 *   value v:  users = [ n7, n3, n9, n3 ]      node n3: in = [ v, w, v ]
 *                        0   1   2   3                 upos = [ 1, ., 3 ]
 *
 * Dropping n3's slot 0 takes users[upos[0]] out by moving the last entry
 * (n3's slot 2, found as the slot of n3 reading v whose hint is 3) into
 * its place: O(1) plus the moved node's input count, so removing all
 * 1M users of a shared constant is linear. Entries of one node are
 * interchangeable (one per slot that reads v), so a hint is good whenever
 * users[hint] is that node; when it is not (a slot added by growing in[]
 * by hand), the list is scanned as before. */
kf_status kf_graph_add_use(kf_graph *g, kf_id node, int i) {
    kf_node *n = &g->nodes[node];
    kf_value *v = &g->values[n->in[i]];
    KF_TRY(kf_grow((void **)&v->users, &v->capusers, v->nusers + 1, sizeof(kf_id)));
    if (i < n->nupos) n->upos[i] = v->nusers;
    v->users[v->nusers++] = node;
    kf_graph_touch(g, n->in[i], KF_TOUCH_USERS);
    return KF_OK;
}

void kf_graph_inferq_clear(kf_graph *g) {
    for (uint32_t i = 0; i < g->ninferq; i++)
        if (g->inferq[i] < g->nvalues) g->values[g->inferq[i]].infer_queued = false;
    g->ninferq = 0;
    g->inferq_lost = false;
}

void kf_graph_track(kf_graph *g, bool on) {
    for (uint32_t i = 0; i < g->ntouched; i++) g->values[g->touched[i]].touch = 0;
    kf_free(g->touched);
    g->touched = NULL;
    g->ntouched = g->captouched = 0;
    g->touch_all = false;
    bool was = g->track;
    g->track = on;
    if (on != was) kf_graph_inferq_clear(g); /* the rewrite driver restarts the list, not inference's */
    if (!on) {
        kf_infer_scratch_free(g);
        kf_free(g->inferq);
        g->inferq = NULL;
        g->capinferq = 0;
    }
}

/* Appends v to list *l (n, cap) unless *listed; a list that cannot grow
 * sets *lost instead (grown by hand, not kf_grow: a failure here is no
 * error of the edit, nor may it overwrite the message of one in progress;
 * the reader then looks everywhere). */
static void list_once(kf_id **l, uint32_t *n, uint32_t *cap, bool *listed, bool *lost, kf_id v) {
    if (*listed) return;
    if (*n == *cap) {
        uint32_t ncap = *cap ? 2 * *cap : 64;
        kf_id *t = ncap > *cap ? kf_realloc(*l, (size_t)ncap * sizeof *t) : NULL;
        if (!t) {
            *lost = true;
            return;
        }
        *l = t;
        *cap = ncap;
    }
    (*l)[(*n)++] = v;
    *listed = true;
}

void kf_graph_touch(kf_graph *g, kf_id v, uint8_t how) {
    if (!g->track || !v) return;
    kf_value *val = &g->values[v];
    list_once(&g->inferq, &g->ninferq, &g->capinferq, &val->infer_queued, &g->inferq_lost, v);
    if (g->touch_all) return;
    bool listed = val->touch != 0;
    list_once(&g->touched, &g->ntouched, &g->captouched, &listed, &g->touch_all, v);
    if (listed) val->touch |= how;
}

/* Removes the use of in[i] by node (in[i] still names the value). */
static void drop_use(kf_graph *g, kf_id node, int i) {
    kf_node *n = &g->nodes[node];
    kf_id vid = n->in[i];
    kf_value *v = &g->values[vid];
    uint32_t at = v->nusers;
    if (i < n->nupos && n->upos[i] < v->nusers && v->users[n->upos[i]] == node) {
        at = n->upos[i];
    } else {
        for (uint32_t u = v->nusers; u-- > 0;) /* no hint: newest users first */
            if (v->users[u] == node) {
                at = u;
                break;
            }
        if (at == v->nusers) return; /* not listed: cannot happen, but stay safe */
    }
    uint32_t last = --v->nusers;
    kf_graph_touch(g, vid, KF_TOUCH_USERS);
    if (at == last) return;
    kf_id moved = v->users[last];
    v->users[at] = moved;
    kf_node *m = &g->nodes[moved];
    for (int j = 0; j < m->nupos; j++)
        if (m->in[j] == vid && m->upos[j] == last) {
            m->upos[j] = at;
            break;
        }
}

/* Removes one entry of node from v's use list, for an entry no input slot
 * accounts for. */
static void drop_stale_user(kf_graph *g, kf_id vid, kf_id node) {
    kf_value *v = &g->values[vid];
    for (uint32_t u = v->nusers; u-- > 0;)
        if (v->users[u] == node) {
            v->users[u] = v->users[--v->nusers];
            kf_graph_touch(g, vid, KF_TOUCH_USERS);
            return;
        }
}

kf_status kf_graph_set_input(kf_graph *g, kf_id node, int i, kf_id v) {
    kf_node *n = &g->nodes[node];
    if (i < 0 || i >= n->nin) return kf_fail(KF_ERR_INVALID_ARG, "node '%s' has no input %d", kf_node_label(n), i);
    if (n->in[i] == v) return KF_OK;
    if (v) KF_TRY(kf_grow((void **)&g->values[v].users, &g->values[v].capusers, g->values[v].nusers + 1, sizeof(kf_id)));
    if (n->in[i]) drop_use(g, node, i);
    n->in[i] = v;
    return v ? kf_graph_add_use(g, node, i) : KF_OK; /* cannot fail: room was made above */
}

/* Gives the name of value a to value b and a fresh name to a. */
static kf_status swap_names(kf_graph *g, kf_id a, kf_id b) {
    char *na = g->values[a].name, *nb = g->values[b].name;
    g->values[a].name = nb;
    g->values[b].name = na;
    /* each hash slot keyed by a name now belongs to the other id */
    for (uint32_t i = 0; i < g->hashcap; i++) {
        if (g->hash[i] == a) g->hash[i] = b;
        else if (g->hash[i] == b) g->hash[i] = a;
    }
    return KF_OK;
}

kf_status kf_graph_replace_uses(kf_graph *g, kf_id from, kf_id to) {
    if (from == to) return KF_OK;
    kf_value *vf = &g->values[from], *vt = &g->values[to];
    if (vf->is_output) {
        if (vt->is_input || vt->is_output || vt->init)
            return kf_fail(KF_ERR_UNSUPPORTED, "cannot redirect graph output '%s' to '%s'", vf->name, vt->name);
        KF_TRY(swap_names(g, from, to));
        vt->is_output = true;
        vf->is_output = false;
        for (uint32_t i = 0; i < g->noutputs; i++)
            if (g->outputs[i] == from) g->outputs[i] = to;
        /* the declared type of the output stays with its name */
        if (vf->has_type && vt->type.rank < 0) vt->type = vf->type;
        vt->has_type |= vf->has_type;
        kf_graph_touch(g, from, KF_TOUCH_DEF);
        kf_graph_touch(g, to, KF_TOUCH_DEF);
    }
    while (vf->nusers) {
        kf_id node = vf->users[0];
        kf_node *n = &g->nodes[node];
        bool moved = false;
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] == from) {
                KF_TRY(kf_graph_set_input(g, node, i, to));
                vf = &g->values[from];
                moved = true;
                break;
            }
        if (!moved) drop_stale_user(g, from, node); /* stale entry: cannot happen, but stay safe */
    }
    return KF_OK;
}

void kf_graph_remove_node(kf_graph *g, kf_id node) {
    kf_node *n = &g->nodes[node];
    if (n->dead) return;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i]) drop_use(g, node, i);
    for (int j = 0; j < n->nout; j++)
        if (n->out[j] && g->values[n->out[j]].producer == node) {
            g->values[n->out[j]].producer = 0;
            kf_graph_touch(g, n->out[j], KF_TOUCH_DEF);
        }
    n->dead = true;
}

static bool name_taken(const kf_graph *g, const char *name) {
    for (; g; g = g->outer)
        if (kf_graph_find(g, name)) return true;
    return false;
}

typedef struct kf_fresh_slot {
    char *base; /* NULL: empty */
    uint32_t last;
} kf_fresh_slot;

/* The slot of base (empty when it has none). */
static kf_fresh_slot *fresh_slot(const kf_graph *g, const char *base) {
    uint32_t mask = g->capfresh - 1, i = kf_hash_str(base) & mask;
    while (g->fresh[i].base && strcmp(g->fresh[i].base, base)) i = (i + 1) & mask;
    return &g->fresh[i];
}

/* Remembers that base took number k; a failure to remember only costs the
 * next call its search from 1. */
static void fresh_remember(kf_graph *g, const char *base, uint32_t k) {
    if ((g->nfresh + 1) * 2 > g->capfresh) {
        uint32_t cap = g->capfresh ? g->capfresh * 2 : 64;
        kf_fresh_slot *t = cap > g->capfresh ? kf_calloc(cap, sizeof *t) : NULL;
        if (!t) return;
        kf_fresh_slot *old = g->fresh;
        uint32_t oldcap = g->capfresh;
        g->fresh = t;
        g->capfresh = cap;
        for (uint32_t i = 0; i < oldcap; i++)
            if (old[i].base) *fresh_slot(g, old[i].base) = old[i];
        kf_free(old);
    }
    kf_fresh_slot *sl = fresh_slot(g, base);
    if (!sl->base) {
        if (!(sl->base = kf_strdup(base))) return;
        g->nfresh++;
    }
    sl->last = k;
}

void kf_graph_fresh_free(kf_graph *g) {
    for (uint32_t i = 0; i < g->capfresh; i++) kf_free(g->fresh[i].base);
    kf_free(g->fresh);
    g->fresh = NULL;
    g->nfresh = g->capfresh = 0;
}

kf_status kf_graph_fresh_value(kf_graph *g, const char *base, kf_id *id) {
    char name[512];
    if (!name_taken(g, base)) return kf_graph_add_value(g, base, id);
    /* base__1, base__2, ...: the first that is free, searched from past
     * the last one this graph handed out for base */
    uint32_t k = 1;
    if (g->capfresh) {
        const kf_fresh_slot *sl = fresh_slot(g, base);
        if (sl->base) k = sl->last + 1;
    }
    for (;; k++) {
        int w = snprintf(name, sizeof name, "%.480s__%u", base, k);
        if (w < 0) return kf_fail(KF_ERR_INTERNAL, "name formatting failed");
        if (!name_taken(g, name)) break;
    }
    KF_TRY(kf_graph_add_value(g, name, id));
    fresh_remember(g, base, k);
    return KF_OK;
}

kf_status kf_graph_add_constant(kf_graph *g, const char *base, kf_tensor *t, kf_id *id) {
    kf_status st = kf_graph_fresh_value(g, base, id);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    kf_value *v = &g->values[*id];
    v->init = t;
    kf_type_of_tensor(&v->type, t);
    v->has_type = true;
    return KF_OK;
}

uint32_t kf_graph_live_nodes(const kf_graph *g) {
    uint32_t n = 0;
    for (kf_id i = 1; i < g->nnodes; i++) n += !g->nodes[i].dead;
    return n;
}

kf_status kf_graph_dce(kf_graph *g, uint32_t *removed) {
    uint32_t count = 0;
    /* a worklist of candidates; removing a node can make its producers dead */
    kf_id *work = kf_calloc(g->nnodes + 1, sizeof(kf_id));
    if (!work) return kf_fail(KF_ERR_NOMEM, "out of memory");
    uint32_t top = 0;
    for (kf_id i = g->nnodes - 1; i >= 1; i--)
        if (!g->nodes[i].dead) work[top++] = i;
    bool *queued = kf_calloc(g->nnodes + 1, 1);
    if (!queued) {
        kf_free(work);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t k = 0; k < top; k++) queued[work[k]] = true;
    while (top) {
        kf_id i = work[--top];
        queued[i] = false;
        kf_node *n = &g->nodes[i];
        if (n->dead) continue;
        bool used = false;
        for (int j = 0; j < n->nout && !used; j++) {
            kf_id v = n->out[j];
            used = v && (g->values[v].nusers || g->values[v].is_output);
        }
        if (used) continue;
        kf_graph_remove_node(g, i);
        count++;
        for (int k = 0; k < n->nin; k++) {
            kf_id v = n->in[k];
            kf_id p = v ? g->values[v].producer : 0;
            if (p && !g->nodes[p].dead && !queued[p]) {
                queued[p] = true;
                work[top++] = p;
            }
        }
    }
    kf_free(work);
    kf_free(queued);
    if (removed) *removed = count;
    return KF_OK;
}

kf_status kf_graph_settle(kf_graph *g) {
    for (kf_id v = 1; v < g->nvalues; v++) KF_TRY(kf_tensor_settle(g->values[v].init));
    return KF_OK;
}

bool kf_value_is_constant(const kf_model *m, kf_id v) {
    const kf_value *val = &m->graph->values[v];
    if (!val->init) return false;
    return !(val->is_input && m->ir_version >= 4);
}

kf_status kf_graph_bind_sym(kf_graph *g, const char *name, int64_t value) {
    uint32_t sym = 0;
    for (uint32_t i = 1; i < g->nsyms; i++)
        if (!kf_sym_is_expr(g, i) && !strcmp(g->syms[i], name)) sym = i;
    if (!sym) return kf_fail(KF_ERR_INVALID_ARG, "the model has no symbolic dimension named '%s'", name);
    if (value < 0) return kf_fail(KF_ERR_INVALID_ARG, "dimension '%s' cannot be %lld", name, (long long)value);
    for (kf_id v = 1; v < g->nvalues; v++) {
        kf_type *t = &g->values[v].type;
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] < 0 && t->syms[d]) kf_type_set_sdim(t, d, kf_sdim_bind(g, kf_type_sdim(t, d), sym, value));
        kf_symvec *sv = g->values[v].symval;
        for (int k = 0; sv && k < sv->n; k++) sv->e[k] = kf_sdim_bind(g, sv->e[k], sym, value);
    }
    return kf_sym_take_nomem(g);
}
