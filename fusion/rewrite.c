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

kf_status kf_rewrite(kf_model *m, kf_ruleset *rs, kf_rewrite_opts *opts, uint64_t *rewrites) {
    kf_graph *g = m->graph;
    uint64_t total = 0;
    const char *last_rule = NULL;
    kf_status st = kf_infer_shapes(m);
    int sweep = 0;
    bool out_of_fuel = false;
    for (; !st && sweep < KF_REWRITE_MAX_SWEEPS && !out_of_fuel; sweep++) {
        kf_id *order;
        uint32_t norder;
        if ((st = kf_graph_topo(g, &order, &norder))) break;
        uint64_t before = total;
        for (uint32_t k = 0; k < norder && !st && !out_of_fuel; k++) {
            kf_id nid = order[k];
            for (uint32_t i = 0; i < rs->n && !st; i++) {
                const kf_node *n = &g->nodes[nid];
                if (!node_live(g, n)) break;
                if (rs->rules[i]->root_opid != n->op || !n->op) continue;
                if (opts && opts->fuel == 0) {
                    out_of_fuel = true;
                    break;
                }
                bool applied = false;
                st = kf_rule_try(rs->rules[i], m, nid, &applied);
                if (st || !applied) continue;
                total++;
                last_rule = rs->rules[i]->name;
                if (opts && opts->fuel > 0) opts->fuel--;
                if (opts && opts->trace)
                    fprintf(stderr, "kfuse: rule %s at node '%s'\n", rs->rules[i]->name,
                            kf_node_label(&g->nodes[nid]));
            }
        }
        kf_free(order);
        if (!st) st = kf_graph_dce(g, NULL);
        if (total == before) break;
    }
    if (!st && sweep >= KF_REWRITE_MAX_SWEEPS)
        st = kf_fail(KF_ERR_INTERNAL, "rewriting did not reach a fixed point after %d sweeps; last rule applied: %s",
                     KF_REWRITE_MAX_SWEEPS, last_rule ? last_rule : "(none)");
    if (rewrites) *rewrites = total;
    return st;
}
