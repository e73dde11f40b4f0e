/*
 * test_cg_batch.c: horizontal launches (codegen/cg_batch.c, kernels/exec.c).
 * Batches of 2..8 independent elementwise and reduction groups of a plan's
 * launch index become one kernel, run for real on OpenCL (PoCL) and compared
 * with the reference evaluator; members are checked independent (no path
 * in the group DAG); the union of parameters passes a shared input once;
 * through kf_exec, launches per run drop to the plan's launch count with
 * outputs still equal to ref; the CUDA text compiles with NVRTC for sm_80
 * and sm_90 with 0 spill bytes; the batches codegen declines, with reasons.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cg_util.h"
#include "kf_exec.h"
#include "kf_run.h"

/* ---- graphs ------------------------------------------------------------- */

/* siblings that cannot merge (a reduction beside elementwise ops, two
 * reductions), all reading x: one batch reading x once */
#define SIBLINGS                                                                                      \
    "opset 17\ninput x float[24, 40]\nconst ax int64[1] = 1\n"                                          \
    "s = Softmax(x) {axis=-1}\nr = ReduceSum(x, ax) {keepdims=1}\nm = ReduceMax(x) {axes=[0], keepdims=0}\n" \
    "e = Relu(x)\nl = LogSoftmax(x) {axis=0}\n"                                                        \
    "output s\noutput r\noutput m\noutput e\noutput l\n"
/* eight independent groups: different element counts, float32 and
 * float16, elementwise, broadcast, row and column reductions, short rows
 * (one work-item per row) */
#define INDEPENDENT8                                                                                  \
    "opset 17\ninput a float16[16, 50]\ninput b float[300]\ninput c float[7, 9, 11]\n"                   \
    "input d float16[2, 130]\ninput e float[33]\ninput f float[5, 64]\ninput g float[9, 1]\n"            \
    "input h float[9, 4]\nconst ax int64[1] = 1\n"                                                       \
    "ya = Sigmoid(a)\nyb = Tanh(b)\nyc = ReduceMean(c) {axes=[2], keepdims=0}\nyd = Softmax(d) {axis=-1}\n" \
    "ye = Exp(e)\nyf = ReduceSumSquare(f) {axes=[1], keepdims=0}\nyg = Mul(g, h)\nyh = ReduceL2(h) {axes=[0]}\n" \
    "output ya\noutput yb\noutput yc\noutput yd\noutput ye\noutput yf\noutput yg\noutput yh\n"
/* three members whose wishes pass the launch's cap (800000-element
 * float16 loops in steps of 8: 391 work-groups each alone) beside a small
 * one, so work-groups are shared out; the grid-stride loops cover the rest */
#define CAPPED                                                                                        \
    "opset 17\ninput a float16[800000]\ninput b float16[800000]\ninput c float16[250, 400]\n"           \
    "input d float[6, 7]\n"                                                                             \
    "ya = Neg(a)\nyb = Sqrt(b)\nyc = Softmax(c) {axis=-1}\nyd = Abs(d)\n"                               \
    "output ya\noutput yb\noutput yc\noutput yd\n"

/* independent groups reading and writing float8 beside a float one: the
 * batch takes the members' prelude part */
#define FLOAT8_MEMBERS                                                                                \
    "opset 21\ninput a float[40]\ninput b float8e4m3fn[30]\ninput c float[7, 3]\nconst s float[] = 0.01\n" \
    "ya = QuantizeLinear(a, s) {output_dtype=18}\nyb = Cast(b) {to=1}\nyc = Relu(c)\n"                  \
    "output ya\noutput yb\noutput yc\n"

/* ---- helpers -------------------------------------------------------------- */

/* Is group `to` reachable from group `from` in p's group DAG? */
static bool reaches(const kf_model *m, const kf_plan *p, uint32_t from, uint32_t to) {
    const kf_graph *g = m->graph;
    bool *seen = calloc(p->ngroups + 1, sizeof *seen);
    uint32_t *stack = calloc(p->ngroups + 1, sizeof *stack), n = 0;
    stack[n++] = from;
    seen[from] = true;
    bool found = false;
    while (n && !found) {
        uint32_t a = stack[--n];
        for (uint32_t b = 0; b < p->ngroups && !found; b++) {
            if (seen[b]) continue;
            const kf_group *gb = &p->groups[b];
            bool edge = false;
            for (uint32_t i = 0; i < gb->ninputs && !edge; i++) {
                kf_id pr = g->values[gb->inputs[i]].producer;
                edge = pr && p->group_of[pr] == a;
            }
            if (!edge) continue;
            if (b == to) found = true;
            seen[b] = true;
            stack[n++] = b;
        }
    }
    free(seen);
    free(stack);
    return found;
}

/* Runs batched kernel k on OpenCL with inputs from r and compares every
 * output with the reference (DESIGN.md tolerance per dtype). */
static void run_against_ref(const kf_cg_kernel *k, const cgu_refvals *r) {
    const kf_tensor *in[KF_CG_BATCH_MAX_PARAMS];
    for (uint32_t i = 0; i < k->nins; i++) in[i] = &r->t[k->ins[i].value];
    kf_tensor out[KF_CG_BATCH_MAX_PARAMS] = {0};
    kf_status st = kf_cl_run_kernel(k, in, out);
    cr_assert_eq(st, KF_OK, "%s\n%s", kf_last_error(), k->body);
    for (uint32_t o = 0; o < k->nouts; o++) {
        char why[256];
        cr_assert(kf_run_close(&out[o], &r->t[k->outs[o].value], why, sizeof why), "output %u: %s\n%s", o, why, k->body);
        kf_tensor_release(&out[o]);
    }
}

/* run_against_ref on the reference of m's own random inputs. */
static void run_against_model(const kf_cg_kernel *k, const kf_model *m) {
    cgu_refvals r = cgu_reference(m);
    run_against_ref(k, &r);
    cgu_refvals_free(&r);
}

typedef struct batch_figures {
    uint32_t batches, most;   /* batches generated; members of the largest */
    uint32_t shared;          /* parameters saved by the union (inputs passed once) */
} batch_figures;

/* Every launch of text's plan with 2+ elementwise/reduction groups: the
 * members are independent, the batch is deterministic, and its OpenCL run
 * equals the reference evaluator (run_opencl) or its CUDA text compiles
 * without spills (nvrtc). */
static batch_figures check_batches(const char *text, bool run_opencl, bool nvrtc) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cgu_refvals r = {0};
    if (run_opencl) r = cgu_reference(m);
    batch_figures f = {0};
    for (uint32_t l = 0; l < p->launches; l++) {
        uint32_t gs[KF_PLAN_MAX_BATCH], n = 0;
        for (uint32_t gi = 0; gi < p->ngroups; gi++)
            if (p->groups[gi].launch == l && (p->groups[gi].kind == KF_GROUP_ELEMWISE || p->groups[gi].kind == KF_GROUP_REDUCTION)) {
                cr_assert_lt(n, KF_PLAN_MAX_BATCH, "launch %u has more than %d groups", l, KF_PLAN_MAX_BATCH);
                gs[n++] = gi;
            }
        if (n < 2) continue;
        for (uint32_t a = 0; a < n; a++)
            for (uint32_t b = 0; b < n; b++) {
                cr_assert_eq(p->groups[gs[a]].level, p->groups[gs[b]].level);
                cr_assert(a == b || !reaches(m, p, gs[a], gs[b]), "launch %u: group %u reaches group %u", l, gs[a], gs[b]);
            }
        kf_cg_kernel k, k2;
        cr_assert_eq(kf_cg_batch(m, p, gs, n, &k), KF_OK, "launch %u: %s", l, kf_last_error());
        cr_assert_eq(kf_cg_batch(m, p, gs, n, &k2), KF_OK, "%s", kf_last_error());
        cr_assert_str_eq(k.body, k2.body, "batched text is not deterministic");
        kf_cg_kernel_release(&k2);
        cr_assert_gt(k.block, 0);
        cr_assert_eq(k.numel % k.block, 0);
        cr_assert_leq(k.numel, KF_CG_BATCH_MAX_ITEMS);
        uint32_t sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            kf_cg_kernel mk;
            cr_assert_eq(kf_cg_group(m, p, gs[i], &mk), KF_OK, "%s", kf_last_error());
            sum += mk.nins + mk.nouts;
            kf_cg_kernel_release(&mk);
        }
        cr_assert_leq(k.nins + k.nouts, sum);
        f.shared += sum - (k.nins + k.nouts);
        if (run_opencl) run_against_ref(&k, &r);
        if (nvrtc) {
            cgu_nvrtc_check(&k, "sm_80");
            cgu_nvrtc_check(&k, "sm_90");
        }
        f.batches++;
        if (n > f.most) f.most = n;
        kf_cg_kernel_release(&k);
    }
    if (run_opencl) cgu_refvals_free(&r);
    kf_plan_free(p);
    kf_model_free(m);
    return f;
}

/* ---- batches run on OpenCL against ref -------------------------------------- */

Test(cg_batch, siblings_sharing_an_input_read_it_once) {
    cgu_need_opencl();
    tu_seed();
    batch_figures f = check_batches(SIBLINGS, true, false);
    cr_assert_eq(f.batches, 1);
    cr_assert_geq(f.most, 4, "a softmax, two reductions and the rest: %u members", f.most);
    cr_assert_geq(f.shared, f.most - 1, "x must be passed once, saved %u parameters", f.shared);
}

Test(cg_batch, float8_members_bring_their_prelude_part) {
    cgu_need_opencl();
    tu_seed();
    kf_model *m = gt_parse(FLOAT8_MEMBERS);
    kf_plan *p = cgu_plan(m);
    uint32_t gs[3] = {cgu_group_of(m, p, "ya"), cgu_group_of(m, p, "yb"), cgu_group_of(m, p, "yc")};
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_batch(m, p, gs, 3, &k), KF_OK, "%s", kf_last_error());
    cr_assert_eq(k.parts, KF_CG_PART_F8);
    run_against_model(&k, m);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg_batch, eight_independent_groups_of_mixed_dtypes_and_sizes) {
    cgu_need_opencl();
    tu_seed();
    batch_figures f = check_batches(INDEPENDENT8, true, false);
    cr_assert_eq(f.batches, 1);
    cr_assert_eq(f.most, KF_PLAN_MAX_BATCH);
}

Test(cg_batch, members_past_the_launch_cap_share_it_out) {
    cgu_need_opencl();
    tu_seed();
    kf_model *m = gt_parse(CAPPED);
    kf_plan *p = cgu_plan(m);
    uint32_t gs[4] = {cgu_group_of(m, p, "ya"), cgu_group_of(m, p, "yb"), cgu_group_of(m, p, "yc"), cgu_group_of(m, p, "yd")};
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_batch(m, p, gs, 4, &k), KF_OK, "%s", kf_last_error());
    int64_t want = 0;
    for (int i = 0; i < 4; i++) {
        kf_cg_kernel mk;
        cr_assert_eq(kf_cg_group(m, p, gs[i], &mk), KF_OK, "%s", kf_last_error());
        want += mk.block ? mk.numel / mk.block : (mk.numel + k.block - 1) / k.block;
        kf_cg_kernel_release(&mk);
    }
    cr_assert_gt(want * k.block, KF_CG_BATCH_MAX_ITEMS, "the members must ask for more than the cap (%lld groups)", (long long)want);
    cr_assert_eq(k.numel, KF_CG_BATCH_MAX_ITEMS / k.block * k.block, "the cap is used, not passed: %lld", (long long)k.numel);
    run_against_model(&k, m);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- what is declined ---------------------------------------------------------- */

Test(cg_batch, declines_anchors_dependent_groups_and_too_many_parameters) {
    kf_model *m = gt_parse("opset 17\ninput x float[8, 16]\nconst w float[16, 16] = random\n"
                           "a = MatMul(x, w)\nb = Softmax(x) {axis=-1}\nd = Softmax(b) {axis=0}\n"
                           "output a\noutput d\n");
    kf_plan *p = cgu_plan(m);
    uint32_t ga = cgu_group_of(m, p, "a"), gb = cgu_group_of(m, p, "b"), gd = cgu_group_of(m, p, "d");
    cr_assert_neq(gb, gd, "two reductions are two groups");
    kf_cg_kernel k;
    uint32_t anchor[2] = {ga, gb}, chain[2] = {gb, gd};
    cr_assert_eq(kf_cg_batch(m, p, anchor, 2, &k), KF_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(kf_last_error(), "only elementwise and reduction"), "%s", kf_last_error());
    cr_assert_eq(kf_cg_batch(m, p, chain, 2, &k), KF_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(kf_last_error(), "different levels"), "%s", kf_last_error());
    cr_assert_eq(kf_cg_batch(m, p, chain, 1, &k), KF_ERR_UNSUPPORTED);
    /* a member that reads another's output, given at the kernel level */
    kf_cg_kernel mk[2];
    cr_assert_eq(kf_cg_group(m, p, gb, &mk[0]), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_cg_group(m, p, gd, &mk[1]), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_cg_batch_kernels(mk, 2, &k), KF_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(kf_last_error(), "not independent"), "%s", kf_last_error());
    cr_assert_null(k.body);
    kf_cg_kernel_release(&mk[0]);
    kf_cg_kernel_release(&mk[1]);
    kf_plan_free(p);
    kf_model_free(m);

    /* two 12-input Sums: 24 inputs + 2 outputs pass the launchers' 24 */
    char text[2048] = "opset 17\n";
    for (int i = 0; i < 24; i++) snprintf(text + strlen(text), sizeof text - strlen(text), "input x%d float[5]\n", i);
    strcat(text, "s = Sum(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11)\n"
                 "t = Sum(x12, x13, x14, x15, x16, x17, x18, x19, x20, x21, x22, x23)\noutput s\noutput t\n");
    m = gt_parse(text);
    p = cgu_plan(m);
    uint32_t two[2] = {cgu_group_of(m, p, "s"), cgu_group_of(m, p, "t")};
    cr_assert_eq(p->groups[two[0]].launch, p->groups[two[1]].launch, "the planner batches them");
    cr_assert_eq(kf_cg_batch(m, p, two, 2, &k), KF_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(kf_last_error(), "parameters"), "%s", kf_last_error());
    kf_plan_free(p);
    kf_model_free(m);
}

/* Every allocation of kf_cg_batch failed in turn (alone, then with all after
 * it): out of memory with a message and nothing kept (the sanitizer build
 * checks leaks), or, past the last allocation, the normal text. */
Test(cg_batch, allocation_failures_are_out_of_memory) {
    kf_model *m = gt_parse(SIBLINGS);
    kf_plan *p = cgu_plan(m);
    uint32_t gs[KF_PLAN_MAX_BATCH], n = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++)
        if (p->groups[gi].launch == p->groups[0].launch) gs[n++] = gi;
    cr_assert_geq(n, 2);
    kf_cg_kernel want;
    cr_assert_eq(kf_cg_batch(m, p, gs, n, &want), KF_OK, "%s", kf_last_error());
    for (int sticky = 0; sticky < 2; sticky++)
        for (uint64_t nth = 1;; nth++) {
            kf_cg_kernel k;
            kf_alloc_fault_set(nth, sticky);
            kf_status st = kf_cg_batch(m, p, gs, n, &k);
            bool fired = kf_alloc_fault_fired();
            kf_alloc_fault_set(0, false);
            if (!fired) {
                cr_assert_eq(st, KF_OK, "%s", kf_last_error());
                cr_assert_str_eq(k.body, want.body);
                kf_cg_kernel_release(&k);
                break;
            }
            cr_assert_eq(st, KF_ERR_NOMEM, "allocation %llu%s: %s: %s", (unsigned long long)nth, sticky ? " (sticky)" : "",
                         kf_status_name(st), kf_last_error());
            cr_assert(kf_last_error()[0]);
            cr_assert_null(k.body);
        }
    kf_cg_kernel_release(&want);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- through kf_exec ------------------------------------------------------------ */

/* Runs text through kf_exec on OpenCL (no optimizer, so the default plan
 * of the text is the one it runs) three times against ref; returns its
 * stats, and the plan's launches and groups. */
static kf_exec_stats exec_run(const char *text, uint32_t *launches, uint32_t *groups) {
    kf_model *m = gt_parse(text);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.optimize = false;
    char cache[64] = "/tmp/kf-batch-test-XXXXXX"; /* a fresh kernel cache, removed after */
    cr_assert_not_null(mkdtemp(cache));
    o.cache_dir = cache;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    kf_exec_free(x);
    kf_cache *c = NULL;
    if (kf_cache_open(cache, &c) == KF_OK) kf_cache_clear(c, NULL, NULL);
    kf_cache_close(c);
    rmdir(cache);
    kf_plan *p = cgu_plan(m);
    *launches = p->launches;
    *groups = p->ngroups;
    kf_plan_free(p);
    kf_model_free(m);
    return s;
}

/* small siblings, a dependent layer after them (its own batch), and an
 * anchor beside: launches per run = the plan's launches */
#define LAYERS                                                                                        \
    "opset 17\ninput x float[16, 40]\ninput y float[40]\nconst w float[40, 8] = random\nconst ax int64[1] = 1\n" \
    "a = Softmax(x) {axis=-1}\nb = ReduceMax(x) {axes=[1], keepdims=1}\nc = Sigmoid(y)\nd = LayerNormalization(x, y, y) {axis=-1}\n" \
    "mm = MatMul(x, w)\n"                                                                              \
    "a2 = ReduceSum(a, ax) {keepdims=1}\nb2 = Sub(x, b)\nc2 = Softmax(c) {axis=0}\nd2 = ReduceMean(d) {axes=[1], keepdims=0}\n" \
    "output a2\noutput b2\noutput c2\noutput d2\noutput mm\noutput d\n"

Test(cg_batch, exec_launches_drop_to_the_plan_launch_count) {
    cgu_need_opencl();
    tu_seed();
    uint32_t plan_launches, ngroups;
    unsetenv("KFUSE_DISABLE_BATCHING");
    kf_exec_stats on = exec_run(LAYERS, &plan_launches, &ngroups);
    setenv("KFUSE_DISABLE_BATCHING", "1", 1);
    kf_exec_stats off = exec_run(LAYERS, &plan_launches, &ngroups);
    unsetenv("KFUSE_DISABLE_BATCHING");
    cr_log_info("groups %u, plan launches %u; exec launches %u batched, %u one per group", ngroups, plan_launches,
                on.launches, off.launches);
    cr_assert_eq(on.groups_ref, 0, "every group is generated here");
    cr_assert_eq(off.launches, on.groups_dev, "without batching every group is a launch");
    cr_assert_eq(on.launches, plan_launches, "batched: the plan's launch count");
    cr_assert_lt(on.launches, off.launches);
    cr_assert_leq(on.kernels_unique, off.kernels_unique, "members' own kernels are not compiled");
}

/* ---- NVRTC ------------------------------------------------------------------------ */

Test(cg_batch, cuda_text_compiles_with_nvrtc_sm80_sm90_without_spills) {
    const char *why = kf_nvrtc_unavailable();
    if (why) cr_skip_test("NVRTC: %s", why);
    batch_figures f = check_batches(INDEPENDENT8, false, true);
    cr_assert_eq(f.batches, 1);
    f = check_batches(SIBLINGS, false, true);
    cr_assert_eq(f.batches, 1);
}
