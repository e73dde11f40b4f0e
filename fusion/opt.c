/*
 * opt.c: the optimizer pipeline: gather rules (built-in text rules, user
 * files, C-callback passes), run them to a fixed point with the rewrite
 * driver, and report node counts and per-rule statistics.
 */
#include <stdlib.h>
#include <string.h>

#include "kf_opt.h"

void kf_opt_options_default(kf_opt_options *o) {
    memset(o, 0, sizeof *o);
    o->fuel = -1;
    const char *fuel = getenv("KFUSE_FUEL");
    if (fuel && *fuel) o->fuel = strtoll(fuel, NULL, 10);
    const char *trace = getenv("KFUSE_TRACE");
    o->trace = trace && strstr(trace, "rules");
}

kf_status kf_optimize(kf_model *m, const kf_opt_options *o, kf_opt_result *res) {
    memset(res, 0, sizeof *res);
    res->nodes_before = kf_graph_live_nodes(m->graph);
    kf_status st = KF_OK;
    if (!o->no_builtin) st = kf_rules_add_builtin(&res->rules);
    for (int i = 0; !st && i < o->npattern_files; i++) st = kf_rules_load_file(&res->rules, o->pattern_files[i]);
    if (st) return st;
    kf_rewrite_opts ro = {o->fuel, o->trace};
    st = kf_rewrite(m, &res->rules, &ro, &res->rewrites);
    res->nodes_after = kf_graph_live_nodes(m->graph);
    return st;
}
