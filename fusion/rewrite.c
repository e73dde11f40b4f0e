/*
 * rewrite.c: the rewrite driver. Runs a rule set over the graph in
 * topological sweeps until nothing changes, with a sweep cap, per-rule
 * statistics, fuel (KFUSE_FUEL: stop after N rewrites, to bisect a bad
 * rule) and tracing (KFUSE_TRACE=rules). Dead code left by each sweep is
 * removed before the next.
 */
#include <stdio.h>
#include <string.h>

#include "kf_pattern.h"

/* A node is worth rewriting only while something reads one of its outputs;
 * rules leave the nodes they replaced behind until dead-code elimination. */
static bool node_live(const kf_graph *g, const kf_node *n) {
    if (n->dead) return false;
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (v && (g->values[v].nusers || g->values[v].is_output)) return true;
    }
    return false;
}

void kf_rules_reset_stats(kf_ruleset *rs) {
    for (uint32_t i = 0; i < rs->n; i++) {
        kf_rule *r = rs->rules[i];
        r->attempts = r->hits = r->misses = r->opset_misses = 0;
        for (int k = 0; k < r->nnear; k++) {
            kf_free(r->near[k].node);
            kf_free(r->near[k].reason);
        }
        r->nnear = 0;
    }
}

/* ---- where to try again ----------------------------------------------------
 * A rule rooted at node n reads the graph at most `reach` nodes upstream of
 * n: the nodes it matches, their inputs (types, contents, use lists) and
 * their attributes. So after an edit touches value v, the nodes that can
 * newly match are v's producer (which may read its output's users) and the
 * nodes up to `reach` steps downstream of v. (A rule that reads beside its
 * root, like the merge of sibling MatMuls, gives the same rewrite from any
 * of the siblings, so the one woken suffices.) A use-list change on a value
 * with more than KF_TOUCH_FANOUT users wakes only its producer: no rule asks
 * more of such a value than that it is shared. The sweep visits nodes in
 * topological order, so a node woken ahead of the sweep is tried in it and
 * one behind in the next, exactly when trying every node every sweep would
 * first find the match. */
#define KF_TOUCH_FANOUT 64

typedef struct wake {
    uint8_t *dirty;    /* per node: try it */
    uint8_t *left;     /* per node: steps downstream still to wake, this drain */
    uint32_t cap;
    kf_id **bucket;    /* bucket[k]: nodes woken with k steps left (stale entries skipped) */
    uint32_t *nbucket, *capbucket;
    int nbuckets;
} wake;

static kf_status wake_init(wake *w, int reach) {
    w->nbuckets = reach + 1;
    w->bucket = kf_calloc((size_t)w->nbuckets, sizeof *w->bucket);
    w->nbucket = kf_calloc((size_t)w->nbuckets, sizeof *w->nbucket);
    w->capbucket = kf_calloc((size_t)w->nbuckets, sizeof *w->capbucket);
    return w->bucket && w->nbucket && w->capbucket ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
}

static void wake_free(wake *w) {
    kf_free(w->dirty);
    kf_free(w->left);
    for (int k = 0; w->bucket && k < w->nbuckets; k++) kf_free(w->bucket[k]);
    kf_free(w->bucket);
    kf_free(w->nbucket);
    kf_free(w->capbucket);
}

/* Wakes node n with `steps` left to go downstream (0: itself only). */
static kf_status wake_node(wake *w, const kf_graph *g, kf_id n, int steps) {
    if (!n || g->nodes[n].dead) return KF_OK;
    w->dirty[n] = 1;
    if (steps < 0) steps = 0;
    if (steps >= w->nbuckets) steps = w->nbuckets - 1;
    if (steps + 1 <= w->left[n]) return KF_OK;
    w->left[n] = (uint8_t)(steps + 1);
    KF_TRY(kf_grow((void **)&w->bucket[steps], &w->capbucket[steps], w->nbucket[steps] + 1, sizeof(kf_id)));
    w->bucket[steps][w->nbucket[steps]++] = n;
    return KF_OK;
}

/* Turns the touched values of g into woken nodes and empties the list. */
static kf_status drain(kf_graph *g, wake *w, int reach) {
    if (g->nnodes > w->cap) {
        uint32_t c = w->cap;
        KF_TRY(kf_grow((void **)&w->dirty, &c, g->nnodes, sizeof *w->dirty));
        c = w->cap;
        KF_TRY(kf_grow((void **)&w->left, &c, g->nnodes, sizeof *w->left));
        w->cap = c;
    }
    if (g->touch_all) {
        for (kf_id n = 1; n < g->nnodes; n++) w->dirty[n] = !g->nodes[n].dead;
        kf_graph_track(g, true);
        return KF_OK;
    }
    for (uint32_t t = 0; t < g->ntouched; t++) {
        kf_id v = g->touched[t];
        kf_value *val = &g->values[v];
        bool def = val->touch & KF_TOUCH_DEF;
        val->touch = 0;
        KF_TRY(wake_node(w, g, val->producer, 0));
        if (!def && val->nusers > KF_TOUCH_FANOUT) continue;
        for (uint32_t u = 0; u < val->nusers; u++) KF_TRY(wake_node(w, g, val->users[u], reach - 1));
    }
    g->ntouched = 0;
    /* downstream, most steps left first, so a node goes on from the most it
     * was given: one with k steps left wakes its outputs' readers with k - 1 */
    for (int k = w->nbuckets - 1; k >= 0; k--) {
        for (uint32_t q = 0; q < w->nbucket[k]; q++) {
            kf_id n = w->bucket[k][q];
            if (w->left[n] != k + 1) continue; /* went on from a larger count */
            if (k == 0) continue;
            const kf_node *nn = &g->nodes[n];
            for (int j = 0; j < nn->nout; j++) {
                const kf_value *o = &g->values[nn->out[j]];
                if (!nn->out[j]) continue;
                for (uint32_t u = 0; u < o->nusers; u++) KF_TRY(wake_node(w, g, o->users[u], k - 1));
            }
        }
    }
    for (int k = 0; k < w->nbuckets; k++) {
        for (uint32_t q = 0; q < w->nbucket[k]; q++) w->left[w->bucket[k][q]] = 0;
        w->nbucket[k] = 0;
    }
    return KF_OK;
}

/* ---- ops a rule needs ------------------------------------------------------
 * A text rule matches only where the graph has every op of its source
 * (a Gelu rule needs Erf or Tanh, a norm rule ReduceMean or Pow), so a
 * sweep tries a rule only when those ops are there: `present` is taken
 * from the live nodes when a sweep starts and grows with each rewrite's
 * new nodes and its root. An op a rewrite gives an older node in place is
 * not seen until the next sweep, so a node passed over then might never be
 * woken again: the ops that made a rule be passed over are remembered,
 * and when the rules settle while one of them is in the graph, every node
 * is tried once more. So the fixed point is the one of trying every rule. */
typedef struct op_filter {
    uint8_t present[KF_OP_MAX_];
    uint8_t skipped[KF_OP_MAX_]; /* an op whose absence passed a rule over */
    bool any_skipped;
} op_filter;

static void ops_present(const kf_graph *g, op_filter *f) {
    memset(f->present, 0, sizeof f->present);
    for (kf_id n = 1; n < g->nnodes; n++)
        if (!g->nodes[n].dead && g->nodes[n].op > 0 && g->nodes[n].op < KF_OP_MAX_) f->present[g->nodes[n].op] = 1;
}

/* The rules of each root op in rule-set order: rs->rules[idx[first[op]]]
 * .. rs->rules[idx[first[op + 1] - 1]] (a counting sort by root op), and
 * each rule's source ops besides the root: need[need_at[i] .. need_at[i + 1]). */
typedef struct rule_index {
    uint32_t first[KF_OP_MAX_ + 1];
    uint32_t *idx;
    uint32_t *need_at;
    kf_op *need;
} rule_index;

/* Whether rule i may match: every op it needs is in the graph. */
static bool rule_possible(const rule_index *x, op_filter *f, uint32_t i) {
    for (uint32_t k = x->need_at[i]; k < x->need_at[i + 1]; k++)
        if (!f->present[x->need[k]]) {
            f->skipped[x->need[k]] = 1;
            f->any_skipped = true;
            return false;
        }
    return true;
}

static kf_status index_rules(const kf_ruleset *rs, rule_index **out) {
    rule_index *x = kf_calloc(1, sizeof *x);
    uint32_t nneed = 0;
    for (uint32_t i = 0; i < rs->n; i++) nneed += rs->rules[i]->fn ? 0 : (uint32_t)rs->rules[i]->nsrc;
    if (!x || !(x->idx = kf_malloc(sizeof(uint32_t) * (rs->n + 1))) ||
        !(x->need_at = kf_malloc(sizeof(uint32_t) * (rs->n + 1))) || !(x->need = kf_malloc(sizeof(kf_op) * (nneed + 1)))) {
        if (x) kf_free(x->idx), kf_free(x->need_at);
        kf_free(x);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    nneed = 0;
    for (uint32_t i = 0; i < rs->n; i++) {
        const kf_rule *r = rs->rules[i];
        x->need_at[i] = nneed;
        for (int k = 0; !r->fn && k < r->nsrc - 1; k++) { /* the root is the node tried */
            kf_op op = r->src[k].opid;
            bool seen = op <= 0 || op >= KF_OP_MAX_;
            for (uint32_t j = x->need_at[i]; j < nneed && !seen; j++) seen = x->need[j] == op;
            if (!seen) x->need[nneed++] = op;
        }
    }
    x->need_at[rs->n] = nneed;
    for (uint32_t i = 0; i < rs->n; i++) {
        kf_op op = rs->rules[i]->root_opid;
        if (op > 0 && op < KF_OP_MAX_) x->first[op + 1]++;
    }
    for (int op = 0; op < KF_OP_MAX_; op++) x->first[op + 1] += x->first[op];
    uint32_t fill[KF_OP_MAX_];
    memcpy(fill, x->first, sizeof fill);
    for (uint32_t i = 0; i < rs->n; i++) {
        kf_op op = rs->rules[i]->root_opid;
        if (op > 0 && op < KF_OP_MAX_) x->idx[fill[op]++] = i;
    }
    *out = x;
    return KF_OK;
}

/* [*r, *hi): op's rules after rule `after` (-1: all of them). */
static void rule_span(const rule_index *x, kf_op op, int64_t after, uint32_t *r, uint32_t *hi) {
    *r = *hi = 0;
    if (op <= 0 || op >= KF_OP_MAX_) return;
    *r = x->first[op];
    *hi = x->first[op + 1];
    while (*r < *hi && (int64_t)x->idx[*r] <= after) ++*r;
}

static void index_free(rule_index *x) {
    if (x) kf_free(x->idx), kf_free(x->need_at), kf_free(x->need);
    kf_free(x);
}

kf_status kf_rewrite(kf_model *m, kf_ruleset *rs, kf_rewrite_opts *opts, uint64_t *rewrites) {
    kf_graph *g = m->graph;
    uint64_t total = 0;
    const char *last_rule = NULL;
    bool incremental = g->track;
    int reach = 1;
    for (uint32_t i = 0; i < rs->n; i++)
        if (rs->rules[i]->reach > reach) reach = rs->rules[i]->reach;
    if (reach > 64) reach = 64;
    wake w = {0};
    rule_index *ri = NULL;
    op_filter *f = kf_calloc(1, sizeof *f);
    kf_status st = !f ? kf_fail(KF_ERR_NOMEM, "out of memory") : incremental ? wake_init(&w, reach) : KF_OK;
    if (!st) st = index_rules(rs, &ri);
    if (!st) st = kf_rules_share_match_pool(rs);
    if (!st) st = kf_infer_shapes(m);
    int sweep = 0;
    bool out_of_fuel = false;
    for (; !st && sweep < KF_REWRITE_MAX_SWEEPS && !out_of_fuel; sweep++) {
        kf_id *order;
        uint32_t norder;
        if (incremental && (st = drain(g, &w, reach))) break;
        if ((st = kf_graph_topo(g, &order, &norder))) break;
        ops_present(g, f);
        uint64_t before = total;
        for (uint32_t k = 0; k < norder && !st && !out_of_fuel; k++) {
            kf_id nid = order[k];
            if (incremental) {
                if (!w.dirty[nid]) continue;
                w.dirty[nid] = 0;
            }
            kf_op op = 0;
            uint32_t r = 0, hi = 0;
            int64_t last = -1; /* rules are tried in set order: those after the last one tried */
            while (!st) {
                const kf_node *n = &g->nodes[nid];
                if (!node_live(g, n)) break;
                if (last < 0 || n->op != op) /* first, or a rule changed the node's op in place */
                    rule_span(ri, op = n->op, last, &r, &hi);
                if (r >= hi) break;
                uint32_t i = ri->idx[r++];
                last = i;
                if (!rule_possible(ri, f, i)) continue;
                if (opts && opts->fuel == 0) {
                    out_of_fuel = true;
                    break;
                }
                bool applied = false;
                uint32_t nodes_before = g->nnodes;
                st = kf_rule_try(rs->rules[i], m, nid, &applied);
                if (st || !applied) continue;
                for (kf_id k = nodes_before; k < g->nnodes; k++) /* new nodes, and the root changed in place */
                    if (g->nodes[k].op > 0 && g->nodes[k].op < KF_OP_MAX_) f->present[g->nodes[k].op] = 1;
                if (g->nodes[nid].op > 0 && g->nodes[nid].op < KF_OP_MAX_) f->present[g->nodes[nid].op] = 1;
                total++;
                last_rule = rs->rules[i]->name;
                if (opts && opts->fuel > 0) opts->fuel--;
                if (opts && opts->trace)
                    fprintf(stderr, "kfuse: rule %s at node '%s'\n", rs->rules[i]->name,
                            kf_node_label(&g->nodes[nid]));
                if (incremental) st = drain(g, &w, reach);
            }
        }
        kf_free(order);
        if (!st) st = kf_graph_dce(g, NULL);
        if (total == before && !st && f->any_skipped) { /* settled: was a rule passed over for an op there now? */
            ops_present(g, f);
            bool again = false;
            for (int op = 0; op < KF_OP_MAX_ && !again; op++) again = f->skipped[op] && f->present[op];
            memset(f->skipped, 0, sizeof f->skipped);
            f->any_skipped = false;
            if (again) {
                if (incremental) g->touch_all = true; /* the next drain wakes every node */
                continue;
            }
        }
        if (total == before) break;
    }
    wake_free(&w);
    index_free(ri);
    kf_free(f);
    if (!st && sweep >= KF_REWRITE_MAX_SWEEPS)
        st = kf_fail(KF_ERR_INTERNAL, "rewriting did not reach a fixed point after %d sweeps; last rule applied: %s",
                     KF_REWRITE_MAX_SWEEPS, last_rule ? last_rule : "(none)");
    if (rewrites) *rewrites = total;
    return st;
}
