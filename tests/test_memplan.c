/*
 * test_memplan.c: the arena planner (kernels/memplan.c). Small plans with a
 * known optimum; an independent checker that recomputes which values need
 * arena bytes and when they are alive, then checks at every step that no
 * two live values share a byte, that offsets are aligned and inside the
 * arena, and that the reported lower bound is the true peak; run on random
 * DAGs and on real models (bench/models/small, ../shared/models).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_memplan.h"
#include "kf_opt.h"
#include "kf_plan.h"

#define SMALL_MODELS KF_SOURCE_DIR "/bench/models/small"
#define SHARED_MODELS KF_SOURCE_DIR "/../shared/models/ort"

static kf_plan *plan_of(kf_model *m, bool disable) {
    kf_plan_options o = {.disable = disable, .fuel = -1};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    return p;
}

static kf_memplan memplan_of(const kf_model *m, const kf_plan *p, int64_t align) {
    kf_memplan mp;
    cr_assert_eq(kf_memplan_build(m, p, align, &mp), KF_OK, "%s", kf_last_error());
    return mp;
}

static int64_t off(const kf_model *m, const kf_memplan *mp, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value %s", name);
    return mp->offset[v];
}

typedef struct span {
    uint32_t first, last;
    int64_t size;
} span;

/* Steps a group occupies: every group of its launch (batched groups run together). */
static void launch_range(const kf_plan *p, uint32_t k, uint32_t *lo, uint32_t *hi) {
    *lo = *hi = k;
    uint32_t l = p->groups[k].launch;
    if (l == UINT32_MAX) return;
    for (uint32_t j = 0; j < p->ngroups; j++)
        if (p->groups[j].launch == l) {
            if (j < *lo) *lo = j;
            if (j > *hi) *hi = j;
        }
}

/* The value whose bytes w are: through producers in view groups. */
static kf_id root_of(const kf_graph *g, const kf_plan *p, kf_id w) {
    while (g->values[w].producer && p->groups[p->group_of[g->values[w].producer]].view)
        w = g->nodes[g->values[w].producer].in[0];
    return w;
}

/* Recomputes from the graph (producers and use lists, not group output
 * lists) which values need arena bytes and their lifetimes; checks mp
 * against that. Returns arena / lower bound (1 when both are 0). */
static double check_memplan(const kf_model *m, const kf_plan *p, const kf_memplan *mp, int64_t align) {
    const kf_graph *g = m->graph;
    span *sp = calloc(g->nvalues, sizeof *sp);
    bool *in = calloc(g->nvalues, sizeof *in);
    cr_assert(sp && in);
    cr_assert_geq(mp->nvalues, g->nvalues - 1);
    for (kf_id v = 1; v < g->nvalues; v++) sp[v].first = UINT32_MAX;
    /* lifetimes of roots from the readers of every alias */
    for (kf_id w = 1; w < g->nvalues; w++) {
        kf_id v = root_of(g, p, w);
        const kf_value *val = &g->values[v];
        kf_id pr = val->producer;
        if (!pr || g->nodes[pr].dead || val->is_output || val->is_input || val->init ||
            val->type.dtype == KF_DT_STRING)
            continue;
        uint32_t gp = p->group_of[pr], lo, hi;
        if (p->groups[gp].kind == KF_GROUP_CONST || p->groups[gp].view) continue;
        for (uint32_t u = 0; u < g->values[w].nusers; u++) {
            kf_id node = g->values[w].users[u];
            if (g->nodes[node].dead || p->group_of[node] == gp) continue;
            if (sp[v].first == UINT32_MAX) launch_range(p, gp, &sp[v].first, &sp[v].last);
            launch_range(p, p->group_of[node], &lo, &hi);
            if (hi > sp[v].last) sp[v].last = hi;
            if (lo < sp[v].first) sp[v].first = lo;
        }
    }
    uint32_t count = 0;
    for (kf_id v = 1; v < g->nvalues; v++) {
        const kf_value *val = &g->values[v];
        kf_id r = root_of(g, p, v);
        if (r != v) {
            int64_t want = sp[r].first != UINT32_MAX && !val->is_output ? mp->offset[r] : -1;
            cr_assert_eq(mp->offset[v], want, "view '%s' of '%s': offset %lld, want %lld", val->name,
                         g->values[r].name, (long long)mp->offset[v], (long long)want);
            continue;
        }
        if (sp[v].first == UINT32_MAX) {
            cr_assert_eq(mp->offset[v], -1, "value '%s' needs no arena bytes but has offset %lld", val->name,
                         (long long)mp->offset[v]);
            continue;
        }
        int64_t numel;
        cr_assert(kf_type_is_static(&val->type));
        cr_assert_eq(kf_shape_numel(val->type.rank, val->type.dims, kf_dtype_size(val->type.dtype), &numel), KF_OK);
        sp[v].size = numel * (int64_t)kf_dtype_size(val->type.dtype);
        in[v] = true;
        count++;
        cr_assert_geq(mp->offset[v], 0, "value '%s' crosses groups but has no arena offset", val->name);
        cr_assert_eq(mp->offset[v] % align, 0, "value '%s' at %lld is not %lld-aligned", val->name,
                     (long long)mp->offset[v], (long long)align);
        cr_assert_leq(mp->offset[v] + sp[v].size, mp->arena_bytes, "value '%s' ends past the arena", val->name);
    }
    /* every step: the live values, sorted by offset, must not overlap; their
     * total at the worst step is the lower bound */
    kf_id *live = calloc(count ? count : 1, sizeof *live);
    int64_t peak = 0;
    for (uint32_t s = 0; s < p->ngroups; s++) {
        uint32_t n = 0;
        int64_t total = 0;
        for (kf_id v = 1; v < g->nvalues; v++)
            if (in[v] && sp[v].size && sp[v].first <= s && s <= sp[v].last) {
                uint32_t k = n++; /* insertion sort by offset */
                while (k && mp->offset[live[k - 1]] > mp->offset[v]) live[k] = live[k - 1], k--;
                live[k] = v;
                total += sp[v].size;
            }
        for (uint32_t k = 1; k < n; k++)
            cr_assert_leq(mp->offset[live[k - 1]] + sp[live[k - 1]].size, mp->offset[live[k]],
                          "step %u: '%s' [%lld, +%lld) overlaps '%s' at %lld", s, g->values[live[k - 1]].name,
                          (long long)mp->offset[live[k - 1]], (long long)sp[live[k - 1]].size,
                          g->values[live[k]].name, (long long)mp->offset[live[k]]);
        if (total > peak) peak = total;
    }
    cr_assert_eq(mp->live_lower_bound, peak, "lower bound %lld, recomputed peak %lld",
                 (long long)mp->live_lower_bound, (long long)peak);
    cr_assert_geq(mp->arena_bytes, mp->live_lower_bound);
    free(live);
    free(sp);
    free(in);
    return mp->live_lower_bound ? (double)mp->arena_bytes / (double)mp->live_lower_bound : 1.0;
}

/* ---- small plans with a known optimum ------------------------------------ */

Test(memplan, chain_reuses_every_other_buffer) {
    /* a [0,1], b [1,2], c [2,3]: a and c share; two buffers of 1 KiB */
    kf_model *m = gt_parse("input x float[256]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(a)\n"
                           "c = Relu(b)\n"
                           "d = Sigmoid(c)\n"
                           "output d\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(mp.arena_bytes, 2048);
    cr_expect_eq(mp.live_lower_bound, 2048);
    cr_expect_eq(off(m, &mp, "a"), off(m, &mp, "c"));
    cr_expect_neq(off(m, &mp, "a"), off(m, &mp, "b"));
    cr_expect_eq(off(m, &mp, "x"), -1, "graph input");
    cr_expect_eq(off(m, &mp, "d"), -1, "graph output");
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, skip_connection_keeps_three_alive) {
    /* a lives [0,3] across b [1,2] and c [2,3]: three buffers at step 2 */
    kf_model *m = gt_parse("input x float[64, 4]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(a)\n"
                           "c = Tanh(b)\n"
                           "d = Add(a, c)\n"
                           "output d\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(mp.live_lower_bound, 3 * 1024);
    cr_expect_eq(mp.arena_bytes, 3 * 1024);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, small_value_fills_the_hole_of_a_large_one) {
    /* a [0,1] and b [1,2] take 1 KiB each; s (4 bytes, [2,3]) meets only b,
     * so it goes into a's old bytes (the hole before b), not past the end */
    kf_model *m = gt_parse("input x float[256]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(a)\n"
                           "s = ReduceMax(b) {axes=[0], keepdims=1}\n"
                           "y = Neg(s)\n"
                           "output y\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(off(m, &mp, "s"), off(m, &mp, "a"));
    cr_expect_eq(mp.live_lower_bound, 2048);
    cr_expect_eq(mp.arena_bytes, 2048);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, offsets_are_aligned) {
    /* 4-byte values at alignment 256: the second lands at 256, the arena
     * ends 4 bytes after it; the lower bound counts bytes, not padding */
    kf_model *m = gt_parse("input x float[1]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(a)\n"
                           "c = Relu(b)\n"
                           "output c\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(mp.arena_bytes, 260);
    cr_expect_eq(mp.live_lower_bound, 8);
    kf_memplan_release(&mp);
    mp = memplan_of(m, p, 1);
    check_memplan(m, p, &mp, 1);
    cr_expect_eq(mp.arena_bytes, 8);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, values_inside_one_group_take_no_arena) {
    kf_model *m = gt_parse("input x float[32, 8]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(a)\n"
                           "c = Tanh(b)\n"
                           "output c\n");
    kf_plan *p = plan_of(m, false);
    cr_assert_eq(p->ngroups, 1, "one elementwise chain is one group");
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(mp.arena_bytes, 0);
    cr_expect_eq(off(m, &mp, "a"), -1);
    cr_expect_eq(off(m, &mp, "b"), -1);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, weights_and_plan_time_constants_take_no_arena) {
    kf_model *m = gt_parse("input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "input k int64[2]\n"
                           "s = Shape(x)\n"
                           "n = Add(s, k)\n"
                           "y = MatMul(x, w)\n"
                           "z = Relu(y)\n"
                           "t = Transpose(z) {perm=[1,0]}\n"
                           "output t\n"
                           "output n\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(off(m, &mp, "w"), -1);
    cr_expect_eq(off(m, &mp, "s"), -1, "Shape of static dims is a plan-time constant");
    cr_expect_geq(off(m, &mp, "y"), 0);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, batched_launch_widens_lifetimes) {
    /* a [ga, gb] and y2 [gy, gc] cross; c is written after a's last read,
     * so unbatched it reuses a's bytes (three buffers). When b's and c's
     * groups (same level, independent) share a launch, c is written while a
     * is read: four buffers, and c may not take a's bytes. */
    static const char *text = "input x float[256]\n"
                              "input y float[256]\n"
                              "a = Relu(x)\n"
                              "y2 = Relu(y)\n"
                              "b = Sigmoid(a)\n"
                              "c = Tanh(y2)\n"
                              "d = Add(b, c)\n"
                              "output d\n";
    kf_model *m = gt_parse(text);
    kf_plan *p = plan_of(m, true);
    uint32_t ga = p->group_of[m->graph->values[kf_graph_find(m->graph, "a")].producer];
    uint32_t gb = p->group_of[m->graph->values[kf_graph_find(m->graph, "b")].producer];
    uint32_t gc = p->group_of[m->graph->values[kf_graph_find(m->graph, "c")].producer];
    cr_assert(ga < gb && gb < gc, "groups in order a, b, c (%u %u %u)", ga, gb, gc);
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(off(m, &mp, "a"), off(m, &mp, "c"), "unbatched: c reuses a");
    cr_expect_eq(mp.arena_bytes, 3 * 1024);
    kf_memplan_release(&mp);
    p->groups[gc].launch = p->groups[gb].launch;
    mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_neq(off(m, &mp, "a"), off(m, &mp, "c"), "batched with b: c is written while a is read");
    cr_expect_eq(mp.arena_bytes, 4 * 1024);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, views_share_bytes_and_keep_their_source_alive) {
    /* r is a reshape of a. As a copy kernel, r has its own bytes and a dies
     * when r is written, so b or c (whichever is written later in the plan's
     * order) reuses a's bytes. As a view group (no kernel), r IS a's bytes:
     * a stays alive until d reads r, and neither b nor c may take them. */
    kf_model *m = gt_parse("input x float[16, 16]\n"
                           "input y float[256]\n"
                           "const shp int64[1] = 256\n"
                           "a = Relu(x)\n"
                           "r = Reshape(a, shp)\n"
                           "b = Sigmoid(y)\n"
                           "c = Tanh(b)\n"
                           "d = Add(r, c)\n"
                           "output d\n");
    kf_plan *p = plan_of(m, true);
    uint32_t gr = p->group_of[m->graph->values[kf_graph_find(m->graph, "r")].producer];
    p->groups[gr].view = false; /* as if a kernel copied it */
    kf_memplan mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect(off(m, &mp, "b") == off(m, &mp, "a") || off(m, &mp, "c") == off(m, &mp, "a"), "copied: a is reused");
    kf_memplan_release(&mp);
    p->groups[gr].view = true;
    p->groups[gr].launch = UINT32_MAX;
    mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(off(m, &mp, "r"), off(m, &mp, "a"), "the view shares its source's bytes");
    cr_expect_neq(off(m, &mp, "b"), off(m, &mp, "a"), "a is alive while r is read");
    cr_expect_neq(off(m, &mp, "c"), off(m, &mp, "a"), "a is alive while r is read");
    cr_expect_eq(mp.arena_bytes, 3 * 1024);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, unknown_size_is_a_shape_error_naming_the_value) {
    kf_model *m = gt_parse("input x float[N, 4]\n"
                           "mid = Relu(x)\n"
                           "y = Softmax(mid) {axis=-1}\n"
                           "output y\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp;
    cr_expect_eq(kf_memplan_build(m, p, 256, &mp), KF_ERR_SHAPE);
    cr_expect(strstr(kf_last_error(), "'mid'"), "message names the value: %s", kf_last_error());
    cr_expect_null(mp.offset);
    cr_assert_eq(kf_graph_bind_sym(m->graph, "N", 3), KF_OK);
    kf_plan_free(p);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    p = plan_of(m, true);
    mp = memplan_of(m, p, 256);
    check_memplan(m, p, &mp, 256);
    cr_expect_eq(mp.arena_bytes, 3 * 4 * 4);
    kf_memplan_release(&mp);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(memplan, bad_alignment_is_refused) {
    kf_model *m = gt_parse("input x float[4]\n"
                           "a = Relu(x)\n"
                           "b = Softmax(a)\n"
                           "output b\n");
    kf_plan *p = plan_of(m, true);
    kf_memplan mp;
    static const int64_t bad[] = {0, -256, 3, 96, (int64_t)KF_MEMPLAN_MAX_ALIGN * 2};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(kf_memplan_build(m, p, bad[i], &mp), KF_ERR_INVALID_ARG, "align %lld", (long long)bad[i]);
    cr_expect_eq(kf_memplan_build(NULL, p, 256, &mp), KF_ERR_INVALID_ARG);
    kf_memplan_release(&mp);
    kf_memplan_release(NULL);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- random DAGs ------------------------------------------------------------ */

/* A random graph of 1-D float values: unary ops keep the length, Concat adds
 * lengths, so sizes vary and lifetimes cross. Every value nobody reads is a
 * graph output. */
static kf_model *random_dag(int nodes) {
    static char text[32768];
    int nv = 0, used[128] = {0};
    size_t at = 0;
    at += snprintf(text + at, sizeof text - at, "input x float[%d]\n", 1 + (int)tu_uniform(0, 300));
    nv++;
    static const char *const unary[] = {"Relu", "Sigmoid", "Tanh", "Neg", "Abs"};
    for (int i = 0; i < nodes && nv < 128; i++) {
        int a = (int)tu_uniform(0, nv), b = (int)tu_uniform(0, nv), k = (int)tu_uniform(0, 7);
        char an[16], bn[16];
        snprintf(an, sizeof an, a ? "v%d" : "x", a);
        snprintf(bn, sizeof bn, b ? "v%d" : "x", b);
        if (k < 5) at += snprintf(text + at, sizeof text - at, "v%d = %s(%s)\n", nv, unary[k], an);
        else at += snprintf(text + at, sizeof text - at, "v%d = Concat(%s, %s) {axis=0}\n", nv, an, bn);
        used[a] = 1;
        if (k >= 5) used[b] = 1;
        nv++;
    }
    for (int v = 1; v < nv; v++)
        if (!used[v] || v == nv - 1) at += snprintf(text + at, sizeof text - at, "output v%d\n", v);
    return gt_parse(text);
}

Test(memplan, random_dags_never_overlap_live_values) {
    tu_seed();
    double worst = 1;
    for (int t = 0; t < 40; t++) {
        kf_model *m = random_dag(10 + (int)tu_uniform(0, 40));
        for (int disable = 0; disable < 2; disable++) {
            kf_plan *p = plan_of(m, disable);
            int64_t align = (int64_t)1 << (int)tu_uniform(0, 9);
            kf_memplan mp = memplan_of(m, p, align);
            double r = check_memplan(m, p, &mp, align);
            if (align == 1 && r > worst) worst = r;
            kf_memplan_release(&mp);
            kf_plan_free(p);
        }
        kf_model_free(m);
    }
    cr_log_info("random DAGs: worst arena / lower bound at alignment 1: %.3f", worst);
}

/* ---- real models --------------------------------------------------------- */

typedef struct tally {
    int planned, unknown;
    int64_t arena, bound;
    double worst;
    char worst_name[256];
} tally;

/* Loads, fixes every symbolic dim (batch and sequence alike) to 2, optimizes,
 * plans fusion and memory, and checks the memory plan. Models whose sizes
 * still depend on data are counted as unknown. */
static kf_status plan_model(const char *path, tally *t, bool must) {
    kf_model *m;
    kf_status st = kf_model_load(path, &m);
    if (st) return st;
    for (uint32_t s = 1; s < m->graph->nsyms && !st; s++) st = kf_graph_bind_sym(m->graph, m->graph->syms[s], 2);
    kf_opt_options o;
    kf_opt_options_default(&o);
    kf_opt_result res;
    if (!st) {
        st = kf_optimize(m, &o, &res);
        kf_rules_free(&res.rules);
    }
    kf_plan *p = NULL;
    kf_plan_options po = {.fuel = -1};
    if (!st) st = kf_plan_build(m, &po, &p);
    if (st) {
        kf_model_free(m);
        return st;
    }
    kf_memplan mp;
    st = kf_memplan_build(m, p, KF_MEMPLAN_ALIGN, &mp);
    if (st == KF_ERR_SHAPE && !must) {
        t->unknown++;
        cr_log_info("memplan: %s: sizes depend on data (%s)", path, kf_last_error());
    } else {
        cr_assert_eq(st, KF_OK, "%s: %s", path, kf_last_error());
        double r = check_memplan(m, p, &mp, KF_MEMPLAN_ALIGN);
        kf_memplan packed = memplan_of(m, p, 1); /* packing alone, without alignment padding */
        double r1 = check_memplan(m, p, &packed, 1);
        cr_log_info("memplan: %s: %u groups, arena %lld bytes, live lower bound %lld, ratio %.4f (%.4f unaligned)",
                    path, p->ngroups, (long long)mp.arena_bytes, (long long)mp.live_lower_bound, r, r1);
        kf_memplan_release(&packed);
        t->planned++;
        t->arena += mp.arena_bytes;
        t->bound += mp.live_lower_bound;
        if (r > t->worst) t->worst = r, snprintf(t->worst_name, sizeof t->worst_name, "%s", path);
        kf_memplan_release(&mp);
    }
    kf_plan_free(p);
    kf_model_free(m);
    return KF_OK;
}

Test(memplan_models, small_bench_models, .timeout = 300) {
    static const char *const names[] = {"bert", "resnet50", "gpt2", "mobilenetv2", "vit_b16"};
    tally t = {0};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s/model.onnx", SMALL_MODELS, names[i]);
        cr_assert_eq(plan_model(path, &t, true), KF_OK, "%s: %s", path, kf_last_error());
    }
    cr_log_info("memplan small models: %d planned, arena %lld vs lower bound %lld (%.4f), worst %.4f (%s)", t.planned,
                (long long)t.arena, (long long)t.bound, t.bound ? (double)t.arena / t.bound : 1.0, t.worst,
                t.worst_name);
    cr_expect_gt(t.bound, 0);
}

static void shared_one(const char *model, const char *data_dir, void *user) {
    (void)data_dir;
    tally *t = user;
    /* whole models must plan; the small transform tests may carry data-dependent shapes */
    bool must = strstr(model, "BertForQuestionAnswering") || strstr(model, "mnist");
    kf_status st = plan_model(model, t, must);
    if (st) cr_log_info("memplan: %s does not load or optimize (%s): not counted", model, kf_last_error());
}

Test(memplan_models, shared_models, .timeout = 300) {
    tally t = {0};
    int seen = gt_walk_models(SHARED_MODELS, shared_one, &t);
    if (!seen) cr_skip_test("../shared/models is not beside the repository (%s)", SHARED_MODELS);
    cr_log_info("memplan shared models: %d found, %d planned, %d with data-dependent sizes, arena %lld vs lower "
                "bound %lld, worst ratio %.4f (%s)",
                seen, t.planned, t.unknown, (long long)t.arena, (long long)t.bound, t.worst, t.worst_name);
    cr_expect_geq(t.planned, seen / 2, "most shared models plan (%d of %d)", t.planned, seen);
}
