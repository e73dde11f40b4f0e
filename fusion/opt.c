/*
 * opt.c: the optimizer pipeline. Gathers rules (built-in text rules, user
 * files, C-callback rules of the passes listed in passes.def) and runs, until
 * nothing changes: the rewrite driver, then each whole-graph pass, then
 * dead-code elimination. Reports node counts and per-rule statistics (graph
 * passes appear as rules with their change counts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kf_onnx.h"
#include "kf_opset_raise.h"
#include "kf_opt.h"

/* Rounds of (rules, graph passes) before giving up on a fixed point; each
 * round already runs the rules to their own fixed point. */
#define KF_OPT_MAX_ROUNDS 16

typedef struct graph_pass {
    const char *name;
    kf_graph_pass_fn fn;
} graph_pass;

static const graph_pass graph_passes[] = {
#define KF_RULE_PASS(name)
#define KF_GRAPH_PASS(name) {#name, kf_pass_##name},
#include "passes.def"
#undef KF_RULE_PASS
#undef KF_GRAPH_PASS
    {NULL, NULL}};

void kf_opt_options_default(kf_opt_options *o) {
    memset(o, 0, sizeof *o);
    o->fuel = -1;
    const char *fuel = getenv("KFUSE_FUEL");
    if (fuel && *fuel) o->fuel = strtoll(fuel, NULL, 10);
    const char *trace = getenv("KFUSE_TRACE");
    o->trace = trace && strstr(trace, "rules");
    o->trace_time = trace && strstr(trace, "time");
    o->disable = getenv("KFUSE_DISABLE_PASSES");
    const char *rw = getenv("KFUSE_REWRITE");
    o->every_node = rw && !strcmp(rw, "all");
    o->check_inference = rw && !strcmp(rw, "check");
}

/* True when name appears in the comma-separated list. */
static bool listed(const char *list, const char *name) {
    if (!list) return false;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

static kf_status add_rule_passes(kf_ruleset *rs) {
    (void)rs;
#define KF_RULE_PASS(name) KF_TRY(kf_pass_##name##_rules(rs));
#define KF_GRAPH_PASS(name)
#include "passes.def"
#undef KF_RULE_PASS
#undef KF_GRAPH_PASS
    return KF_OK;
}

static kf_status optimize(kf_model *m, const kf_opt_options *o, kf_opt_result *res);
static kf_status optimize_bodies(kf_model *m, const kf_opt_options *o, kf_opt_result *res);

/* KFUSE_TRACE=time: the milliseconds since the previous mark, per stage. */
typedef struct stage_clock {
    bool on;
    struct timespec last;
} stage_clock;

static void stage_mark(stage_clock *c, const char *stage, int round) {
    if (!c->on) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double ms = (double)(now.tv_sec - c->last.tv_sec) * 1e3 + (double)(now.tv_nsec - c->last.tv_nsec) * 1e-6;
    if (stage) fprintf(stderr, "kfuse: opt %-10s round %2d %8.3f ms\n", stage, round, ms);
    c->last = now;
}

/* Values the caller asked to keep are made graph outputs for the length of
 * the optimization, so every pass protects them exactly as it protects
 * outputs (one mechanism, not a second flag to check everywhere), and are
 * taken off the output list afterwards. */
kf_status kf_optimize(kf_model *m, const kf_opt_options *o, kf_opt_result *res) {
    memset(res, 0, sizeof *res);
    kf_graph *g = m->graph;
    uint32_t nout = g->noutputs;
    for (int i = 0; i < o->nkeep; i++) {
        kf_id v = kf_graph_find(g, o->keep[i]);
        if (!v) return kf_fail(KF_ERR_INVALID_ARG, "--keep: the model has no value named '%s'", o->keep[i]);
        if (!g->values[v].is_output) KF_TRY(kf_graph_mark_output(g, v));
    }
    kf_status st = optimize(m, o, res);
    if (!st) st = optimize_bodies(m, o, res);
    for (uint32_t i = nout; i < g->noutputs; i++) {
        kf_id v = g->outputs[i];
        bool listed = false;
        for (uint32_t k = 0; k < nout; k++) listed |= g->outputs[k] == v;
        g->values[v].is_output = listed;
    }
    g->noutputs = nout;
    return st;
}

static kf_status optimize(kf_model *m, const kf_opt_options *o, kf_opt_result *res) {
    stage_clock clk = {o->trace_time, {0, 0}};
    stage_mark(&clk, NULL, 0);
    res->nodes_before = kf_graph_live_nodes(m->graph);
    kf_status st = KF_OK;
    if (!o->no_builtin) {
        st = kf_rules_add_builtin(&res->rules);
        if (!st) st = add_rule_passes(&res->rules);
    }
    for (int i = 0; !st && i < o->npattern_files; i++) st = kf_rules_load_file(&res->rules, o->pattern_files[i]);
    if (st) return st;
    /* rules the caller disabled are taken out of the set, not skipped one by one */
    uint32_t keep = 0;
    kf_ruleset off = {0};
    for (uint32_t i = 0; i < res->rules.n; i++) {
        kf_rule *r = res->rules.rules[i];
        if (listed(o->disable, r->name) || (r->opt_in && o->opset <= 0)) {
            if ((st = kf_grow((void **)&off.rules, &off.cap, off.n + 1, sizeof(kf_rule *)))) {
                /* put the set back whole (keep + off.n == i), so the
                 * caller's kf_rules_free frees each rule once */
                for (uint32_t k = 0; k < off.n; k++) res->rules.rules[keep++] = off.rules[k];
                kf_free(off.rules);
                for (; i < res->rules.n; i++) res->rules.rules[keep++] = res->rules.rules[i];
                res->rules.n = keep;
                return st;
            }
            off.rules[off.n++] = r;
        } else {
            res->rules.rules[keep++] = r;
        }
    }
    res->rules.n = keep;
    /* graph passes are reported as rules with their change counts */
    kf_rule *gp_stats[sizeof graph_passes / sizeof *graph_passes] = {0};
    for (int p = 0; graph_passes[p].name; p++) {
        if (listed(o->disable, graph_passes[p].name)) continue;
        if ((st = kf_rules_add_callback(&res->rules, graph_passes[p].name, NULL, NULL, NULL))) break;
        gp_stats[p] = res->rules.rules[res->rules.n - 1];
    }
    kf_rules_reset_stats(&res->rules);
    stage_mark(&clk, "ruleset", 0);
    kf_rewrite_opts ro = {o->fuel, o->trace};
    uint64_t graph_changes[sizeof graph_passes / sizeof *graph_passes] = {0};
    res->opset_before = res->opset_after = kf_model_opset(m, "");
    bool raise_tried = o->opset > 0; /* the caller chose the opset: no raise beyond it */
    if (!st && o->opset > res->opset_before) {
        const char *why = NULL;
        kf_status rs = kf_model_raise_opset_ex(m, o->opset, false, &why); /* kf_rewrite infers first */
        if (rs == KF_ERR_UNSUPPORTED) {
            snprintf(res->raise_declined, sizeof res->raise_declined, "opset %lld not reached: %s",
                     (long long)o->opset, why ? why : kf_last_error());
            kf_clear_error();
        } else if ((st = rs) == KF_OK) {
            res->opset_after = kf_model_opset(m, ""); /* types: kf_rewrite infers them first */
        }
    }
    /* the rules retry only where edits reached (rewrite.c): every node the
     * first time and after an opset raise */
    kf_graph_track(m->graph, !o->every_node);
    m->graph->touch_all = true;
    m->graph->infer_check = o->check_inference;
    m->graph->defer_concat_bytes = o->defer_concat_bytes;
    for (int p = 0; !st && graph_passes[p].name; p++) /* constants first (kf_pass_fold_constant_nodes) */
        if (gp_stats[p] && graph_passes[p].fn == kf_pass_fold) {
            kf_pass_ctx ctx = {ro.fuel, ro.trace, 0, o->fold_cap_bytes, o->keep_quantized, NULL, 0};
            st = kf_pass_fold_constant_nodes(m, &ctx);
            ro.fuel = ctx.fuel;
            graph_changes[p] += ctx.changes;
            res->rewrites += ctx.changes;
        }
    for (int round = 0; !st && round < KF_OPT_MAX_ROUNDS; round++) {
        uint64_t n = 0;
        st = kf_rewrite(m, &res->rules, &ro, &n);
        stage_mark(&clk, "rules", round);
        res->rewrites += n;
        uint64_t changed = n;
        for (int p = 0; !st && graph_passes[p].name; p++) {
            if (!gp_stats[p] || ro.fuel == 0) continue;
            kf_pass_ctx ctx = {ro.fuel, ro.trace, 0, o->fold_cap_bytes, o->keep_quantized, NULL, 0};
            st = graph_passes[p].fn(m, &ctx);
            ro.fuel = ctx.fuel;
            graph_changes[p] += ctx.changes;
            changed += ctx.changes;
            res->rewrites += ctx.changes;
            if (!st) st = kf_graph_dce(m->graph, NULL);
            stage_mark(&clk, graph_passes[p].name, round);
        }
        res->rounds = round + 1;
        if (o->trace) fprintf(stderr, "kfuse: optimizer round %d: %llu changes\n", round, (unsigned long long)changed);
        if (st || ro.fuel == 0) break;
        /* If a rule declined only because the model's opset is too old,
         * raise it once (all or nothing) and go on. */
        int64_t want = 0;
        for (uint32_t i = 0; i < res->rules.n; i++) {
            const kf_rule *r = res->rules.rules[i];
            if (r->opset_misses && r->min_opset > want) want = r->min_opset;
        }
        if (!raise_tried && !o->no_raise && want > kf_model_opset(m, "")) {
            raise_tried = true;
            const char *why = NULL;
            kf_status rs = kf_model_raise_opset_ex(m, want, false, &why); /* the next kf_rewrite infers first */
            if (rs == KF_ERR_UNSUPPORTED) {
                snprintf(res->raise_declined, sizeof res->raise_declined, "opset %lld not reached: %s", (long long)want,
                         why ? why : "unsupported");
                kf_clear_error();
            } else if ((st = rs)) {
                break;
            } else {
                res->opset_after = kf_model_opset(m, "");
                if (o->trace)
                    fprintf(stderr, "kfuse: raised the model's opset %lld -> %lld for rules that need it\n",
                            (long long)res->opset_before, (long long)res->opset_after);
                m->graph->touch_all = m->graph->track; /* types: the next kf_rewrite infers them first */
                stage_mark(&clk, "raise", round);
                continue;
            }
        }
        if (!changed) {
            res->converged = true;
            break;
        }
    }
    kf_graph_track(m->graph, false);
    m->graph->infer_check = false;
    m->graph->defer_concat_bytes = 0;
    for (int p = 0; graph_passes[p].name; p++)
        if (gp_stats[p]) gp_stats[p]->hits = gp_stats[p]->attempts = graph_changes[p];
    for (uint32_t i = 0; i < off.n; i++) {
        kf_status st2 = kf_grow((void **)&res->rules.rules, &res->rules.cap, res->rules.n + 1, sizeof(kf_rule *));
        if (st2) {
            kf_rules_free(&off);
            return st2;
        }
        res->rules.rules[res->rules.n++] = off.rules[i];
    }
    kf_free(off.rules);
    res->nodes_after = kf_graph_live_nodes(m->graph);
    return st;
}

/* ---- control-flow bodies ---------------------------------------------------
 * Each If branch, Loop and Scan body is decoded into a model of its own
 * (its formal inputs and the names it reads from around it are graph
 * inputs, typed from the values the node captures; its outputs are graph
 * outputs), optimized with the caller's options (its own bodies too, by
 * recursion), and packed back into the node when something changed. The
 * opset is never raised (the model's one import covers every scope). New
 * names avoid the enclosing graphs' (kf_graph.outer). A body the loader
 * carries unchecked (KF_ERR_UNSUPPORTED when decoded) stays as it is.
 * Rewrites count in the caller's statistics. */

static void add_stats(kf_ruleset *to, const kf_ruleset *from) {
    for (uint32_t i = 0; i < from->n; i++) {
        const kf_rule *r = from->rules[i];
        if (!r->hits && !r->attempts) continue;
        for (uint32_t k = 0; k < to->n; k++)
            if (!strcmp(to->rules[k]->name, r->name)) {
                to->rules[k]->hits += r->hits;
                to->rules[k]->attempts += r->attempts;
                break;
            }
    }
}

static kf_status optimize_body(kf_model *m, kf_id nid, const char *attr, const kf_opt_options *o, kf_opt_result *res) {
    kf_graph *g = m->graph;
    kf_body b;
    kf_status dst = kf_onnx_node_body(&g->nodes[nid], attr, m->opsets, m->nopsets, m->dir, &b);
    if (dst == KF_ERR_UNSUPPORTED) { /* what the loader carries without checking, the optimizer leaves alone */
        kf_clear_error();
        return KF_OK;
    }
    KF_TRY(dst);
    kf_model *bm = kf_calloc(1, sizeof *bm);
    kf_status st = bm ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st && !(bm->opsets = kf_calloc((size_t)m->nopsets + 1, sizeof(kf_opset)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < m->nopsets; i++) {
        bm->opsets[bm->nopsets].version = m->opsets[i].version;
        if (!(bm->opsets[bm->nopsets++].domain = kf_strdup(m->opsets[i].domain ? m->opsets[i].domain : "")))
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (st) {
        kf_body_release(&b);
        kf_model_free(bm);
        return st;
    }
    bm->graph = b.g;
    bm->ir_version = m->ir_version;
    b.g->outer = g;
    /* what the node captures gives the outer names their types */
    const kf_node *n = &g->nodes[nid];
    for (int k = 0; k < n->ncap; k++) {
        kf_id bv = kf_graph_find(b.g, n->capname[k]), ov = n->in[n->nin - n->ncap + k];
        if (bv && ov && (!b.g->values[bv].has_type || b.g->values[bv].type.rank < 0) && g->values[ov].type.dtype &&
            g->values[ov].type.rank >= 0) {
            b.g->values[bv].type = g->values[ov].type;
            for (int d = 0; d < b.g->values[bv].type.rank; d++) b.g->values[bv].type.syms[d] = 0; /* symbols are per graph */
            b.g->values[bv].has_type = true;
        }
    }
    kf_opt_options bo = *o;
    bo.no_raise = true;
    bo.opset = 0;
    bo.defer_concat_bytes = 0; /* a body is written back into its node whole */
    bo.keep = NULL;
    bo.nkeep = 0;
    bo.trace_time = false;
    kf_opt_result br;
    st = kf_optimize(bm, &bo, &br);
    if (!st && br.rewrites) {
        uint8_t *packed = NULL;
        size_t len = 0;
        b.g->outer = NULL;
        if (!(st = kf_onnx_body_pack(bm, b.nin, attr, &packed, &len))) {
            kf_attr *a = NULL;
            kf_node *nn = &g->nodes[nid];
            for (int i = 0; i < nn->nattrs && !a; i++)
                if (!strcmp(nn->attrs[i].name, attr)) a = &nn->attrs[i];
            kf_free(a->packed);
            a->packed = packed;
            a->packed_len = len;
            res->rewrites += br.rewrites;
            add_stats(&res->rules, &br.rules);
        }
    }
    if (st) kf_fail_context(st, "node '%s' (%s) attribute '%s'", kf_node_label(&g->nodes[nid]), g->nodes[nid].op_type, attr);
    kf_rules_free(&br.rules);
    kf_model_free(bm);
    return st;
}

static kf_status optimize_bodies(kf_model *m, const kf_opt_options *o, kf_opt_result *res) {
    kf_graph *g = m->graph;
    for (kf_id nid = 1; nid < g->nnodes; nid++) {
        if (g->nodes[nid].dead) continue;
        for (const char *const *attr = kf_control_bodies(&g->nodes[nid]); *attr; attr++)
            KF_TRY(optimize_body(m, nid, *attr, o, res));
    }
    return KF_OK;
}
