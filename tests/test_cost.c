/*
 * test_cost.c: device profiles (fusion/target.c) and the cost model
 * (fusion/cost.c, plan_cost.c): profile parsing and its errors, estimates
 * on the made-up "test" device worked out by hand, and the planner's
 * time-based decisions: a back-to-back GEMM that would starve an H200 is
 * refused with its reason, the same one kf_plan_merge_reason gives, while
 * a tiny one (one small kernel beats two library calls) is kept; without
 * a target, or with legal_only, every legal merge is made.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_cost.h"
#include "kf_plan.h"

/* ---- profiles ---------------------------------------------------------------- */

Test(cost, builtin_profiles_load) {
    size_t n = 0;
    for (; kf_target_builtin_name(n); n++) {
        kf_target *t = NULL;
        cr_assert_eq(kf_target_get(kf_target_builtin_name(n), &t), KF_OK, "%s: %s", kf_target_builtin_name(n),
                     kf_last_error());
        cr_expect_str_eq(t->name, kf_target_builtin_name(n));
        cr_expect_gt(t->sms, 0);
        cr_expect_gt(t->dram_gbs, 0);
        kf_target_free(t);
    }
    cr_expect_geq(n, 4, "h200, h100, a100 and test at least");
    kf_target *t = NULL;
    cr_assert_eq(kf_target_get("h200", &t), KF_OK);
    cr_expect_eq(t->sms, 132);
    cr_expect_float_eq(t->dram_gbs, 4210, 1e-9);
    kf_target_free(t);
}

Test(cost, unknown_name_lists_the_builtin_ones) {
    kf_target *t = (kf_target *)1;
    cr_expect_eq(kf_target_get("h9000", &t), KF_ERR_INVALID_ARG);
    cr_expect_null(t);
    cr_expect(strstr(kf_last_error(), "h9000") && strstr(kf_last_error(), "h200"), "%s", kf_last_error());
}

static char *builtin_text(const char *drop_key, const char *extra) {
    /* the test profile as text, with one key left out and a line added */
    static const char *lines[] = {
        "name = mine", "desc = a profile from a file", "sms = 4", "clock_ghz = 1", "max_threads_sm = 1024",
        "max_blocks_sm = 4", "regs_sm = 65536", "smem_sm_kib = 64", "dram_gbs = 100", "l2_mib = 1", "l2_gbs = 400",
        "fma_tflops_fp32 = 1", "fma_tflops_fp16 = 2", "tc_tflops_tf32 = 8", "tc_tflops_fp16 = 16", "tc_tops_int8 = 32",
        "tc_tflops_fp8 = 0", "launch_us = 1", "kernel_min_us = 2", "vendor_lib = 1", "ew_frac = 0.5",
        "red_pass_clk = 1", "red_pass_us = 1", "gemm_blk_base = 0.01", "gemm_blk_per_out = 0.01",
        "conv_blk_frac = 0.02", "gen_blk_cap = 0.5", "lib_gemm_frac = 0.5", "lib_conv_frac = 0.25",
        "lib_fixed_us = 4", "lib_conv_fixed_us = 6", "attn_tc_frac = 0.5", "attn_fma_frac = 0.25",
        "igemm_dp4a_gain = 2", "imma_blk_frac = 0.1"};
    size_t cap = 4096;
    char *s = malloc(cap);
    cr_assert(s);
    strcpy(s, "# a comment line\n\n");
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (drop_key && !strncmp(lines[i], drop_key, strlen(drop_key)) && lines[i][strlen(drop_key)] == ' ') continue;
        strcat(s, lines[i]);
        strcat(s, "   # trailing comment\n");
    }
    if (extra) strcat(s, extra);
    return s;
}

Test(cost, profile_file_round_trip_and_errors) {
    char *text = builtin_text(NULL, NULL);
    kf_target *t = NULL;
    cr_assert_eq(kf_target_parse(text, strlen(text), "mine.target", &t), KF_OK, "%s", kf_last_error());
    cr_expect_str_eq(t->name, "mine");
    cr_expect_eq(t->sms, 4);
    cr_expect_float_eq(t->lib_conv_fixed_us, 6, 1e-12);
    kf_target_free(t);
    /* the same text from a file, named by path */
    char path[64];
    snprintf(path, sizeof path, "/tmp/kfuse_target_%ld.target", (long)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(kf_target_get(path, &t), KF_OK, "%s", kf_last_error());
    cr_expect_str_eq(t->name, "mine");
    kf_target_free(t);
    remove(path);
    free(text);

    struct {
        const char *drop, *extra, *want;
    } bad[] = {
        {"dram_gbs", NULL, "missing key 'dram_gbs'"},
        {NULL, "dram_gb = 5\n", "unknown key 'dram_gb'"},
        {NULL, "sms = 8\n", "given twice"},
        {"sms", "sms = 4.5\n", "whole number"},
        {"dram_gbs", "dram_gbs = 4.2e9\n", "dram_gbs must be a number"},
        {"ew_frac", "ew_frac = fast\n", "ew_frac must be"},
        {NULL, "just words\n", "expected 'key = value'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *b = builtin_text(bad[i].drop, bad[i].extra);
        t = (kf_target *)1;
        cr_expect_eq(kf_target_parse(b, strlen(b), "bad.target", &t), KF_ERR_BAD_MODEL, "case %zu", i);
        cr_expect_null(t);
        cr_expect(strstr(kf_last_error(), bad[i].want) && strstr(kf_last_error(), "bad.target"), "case %zu: %s", i,
                  kf_last_error());
        free(b);
    }
    cr_expect_eq(kf_target_get("/nonexistent/dir/x.target", &t), KF_ERR_IO);
}

/* ---- estimates worked out by hand on the test device ----------------------------
 * test.target: 4 SMs at 1 GHz, 100 GB/s at ew_frac 0.5, 1 TFLOP/s fp32,
 * launch 1 us, smallest kernel 2 us, library GEMMs at 0.5 of the peak with
 * a 4 us fixed cost; a reduction pass 1 element per SM clock plus 1 us. */

static kf_plan *plan_on(kf_model *m, const char *target, bool legal_only) {
    kf_plan_options o = {.fuel = -1, .target = target, .legal_only = legal_only};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    return p;
}

static uint32_t group_of(const kf_model *m, const kf_plan *p, const char *value) {
    kf_id v = kf_graph_find(m->graph, value);
    cr_assert(v && m->graph->values[v].producer, "no produced value %s", value);
    return p->group_of[m->graph->values[v].producer];
}

Test(cost, elementwise_chain_is_memory_bound) {
    kf_model *m = gt_parse("input x float[262144]\n"
                           "y = Relu(x)\n"
                           "z = Exp(y)\n"
                           "output z\n");
    kf_plan *p = plan_on(m, "test", false);
    cr_assert_eq(p->ngroups, 1);
    const kf_group *G = &p->groups[0];
    /* 1 MiB read + 1 MiB written at 100 GB/s x 0.5; 1024 blocks fill 4 SMs */
    double want = 2097152.0 / 50e9 * 1e6 + 1;
    cr_expect_float_eq(G->est_us, want, 1e-9, "%.6f vs %.6f", G->est_us, want);
    cr_expect_eq(G->est_blocks, 1024);
    cr_expect_str_eq(G->est_form, "ew");
    cr_expect_str_eq(G->est_bound, "memory");
    cr_expect_float_eq(p->est_us, want, 1e-9);
    cr_expect_str_eq(p->target, "test");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, softmax_rows_read_once_when_they_fit_in_registers) {
    /* 64 rows of 1024: 256 steps of 4 held in registers, segments of 64
     * lanes, 64 blocks on 4 SMs; one read of 65536 elements at 1 per SM
     * clock, plus 1 us for each of the 3 passes' block reduces */
    kf_model *m = gt_parse("input x float[64, 1024]\n"
                           "y = Softmax(x) {axis=-1}\n"
                           "output y\n");
    kf_plan *p = plan_on(m, "test", false);
    cr_assert_eq(p->ngroups, 1);
    const kf_group *G = &p->groups[0];
    double want = 65536.0 / (4 * 1e9) * 1e6 + 3 + 1;
    cr_expect_float_eq(G->est_us, want, 1e-9, "%.6f vs %.6f", G->est_us, want);
    cr_expect_eq(G->est_blocks, 64);
    cr_expect_str_eq(G->est_form, "reduce");
    cr_expect_str_eq(G->est_bound, "compute");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, softmax_rows_are_pass_bound_when_they_stay_in_memory) {
    /* rows of 1023 are not whole vector steps: 3 passes over the row in
     * memory, 256-lane segments, 64 blocks */
    kf_model *m = gt_parse("input x float[64, 1023]\n"
                           "y = Softmax(x) {axis=-1}\n"
                           "output y\n");
    kf_plan *p = plan_on(m, "test", false);
    cr_assert_eq(p->ngroups, 1);
    const kf_group *G = &p->groups[0];
    double want = 64.0 * 1023 * 3 / (4 * 1e9) * 1e6 + 3 + 1;
    cr_expect_float_eq(G->est_us, want, 1e-9, "%.6f vs %.6f", G->est_us, want);
    cr_expect_eq(G->est_blocks, 64);
    cr_expect_str_eq(G->est_bound, "compute");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, library_gemm_splits_tiles_to_fill_the_sms) {
    kf_model *m = gt_parse("input x float[64, 256]\n"
                           "const w float[256, 128] = random\n"
                           "y = MatMul(x, w)\n"
                           "output y\n");
    kf_plan *p = plan_on(m, "test", false);
    cr_assert_eq(p->ngroups, 1);
    const kf_group *G = &p->groups[0];
    /* 128x64 tiles: 2 of them (K = 256 allows no split) fill 2 of 4 SMs;
     * 4.19 MFLOP at 1 TFLOP/s x 0.5 x 0.5, then the 4 us fixed cost */
    double want = 2.0 * 64 * 128 * 256 / (1e12 * 0.5 * 0.5) * 1e6 + 4 + 1;
    cr_expect_float_eq(G->est_us, want, 1e-9, "%.6f vs %.6f", G->est_us, want);
    cr_expect_str_eq(G->est_form, "lib_gemm");
    cr_expect_eq(G->est_blocks, 2);
    /* TF32 on the same call: 8x the rate */
    kf_plan_options o = {.fuel = -1, .target = "test", .math = KF_MATH_TF32};
    kf_plan *q = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &q), KF_OK);
    double tf32 = 2.0 * 64 * 128 * 256 / (8e12 * 0.5 * 0.5) * 1e6;
    double mem = (64.0 * 256 * 4 + 256.0 * 128 * 4 + 64.0 * 128 * 4) / 50e9 * 1e6; /* now the larger term */
    cr_expect_float_eq(q->groups[0].est_us, (tf32 > mem ? tf32 : mem) + 4 + 1, 1e-9, "%.6f", q->groups[0].est_us);
    kf_plan_free(q);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, unknown_shapes_give_a_floor_and_leave_the_decision_to_legality) {
    kf_model *m = gt_parse("input x float[N, 8]\n"
                           "y = Relu(x)\n"
                           "z = Exp(y)\n"
                           "output z\n");
    kf_plan *p = plan_on(m, "h200", false);
    cr_expect_eq(p->ngroups, 1, "the chain still fuses");
    cr_expect_float_eq(p->groups[0].est_us, 2.5 + 1.0, 1e-9, "kernel_min_us + launch_us of h200");
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- the planner's decisions ------------------------------------------------------ */

/* BERT-base at sequence 128, attention output into the FFN: back-to-back
 * on chip would hold 8 rows of 768 a block, 16 blocks for 132 SMs
 * (measured on an H200: 5.8 ms, against tens of microseconds for two
 * library GEMMs). */
static const char *ffn =
    "input x float[128, 768]\n"
    "const w1 float[768, 768] = random\n"
    "const w2 float[768, 3072] = random\n"
    "h = MatMul(x, w1)\n"
    "a = Relu(h)\n"
    "y = MatMul(a, w2)\n"
    "output y\n";

Test(cost, back_to_back_that_starves_the_gpu_is_refused_with_its_reason) {
    kf_model *m = gt_parse(ffn);
    kf_plan *p = plan_on(m, "h200", false);
    uint32_t g1 = group_of(m, p, "a"), g2 = group_of(m, p, "y");
    cr_assert_neq(g1, g2, "the two GEMMs stay apart");
    cr_expect_eq(p->groups[g1].anchor2, 0);
    cr_expect_str_eq(p->groups[g1].est_form, "lib_gemm");
    cr_expect_str_eq(p->groups[g2].est_form, "lib_gemm");
    const char *why = NULL;
    for (uint32_t i = 0; i < p->nbounds; i++)
        if (p->bounds[i].from == g1 && p->bounds[i].to == g2) why = p->bounds[i].reason;
    cr_assert_not_null(why);
    cr_expect_str_eq(why, KF_REASON_COST_BLOCKS);
    cr_expect_str_eq(kf_plan_merge_reason(p, g1, g2, false), KF_REASON_COST_BLOCKS, "one decision function");
    cr_expect_geq(p->cost_refusals, 1);
    double apart = p->est_us;
    kf_plan_free(p);

    /* legal_only: the bytes-only planner's back-to-back group, estimated */
    p = plan_on(m, "h200", true);
    g1 = group_of(m, p, "a");
    cr_expect_eq(g1, group_of(m, p, "y"));
    cr_expect_neq(p->groups[g1].anchor2, 0);
    cr_expect_str_eq(p->groups[g1].est_form, "gemm_b2b");
    cr_expect_eq(p->groups[g1].est_blocks, 16);
    cr_expect_gt(p->est_us, 20 * apart, "b2b %.1f us vs apart %.1f us", p->est_us, apart);
    cr_expect_eq(p->cost_refusals, 0);
    kf_plan_free(p);

    /* no target: the same legal merges, no estimates */
    p = plan_on(m, "none", false);
    cr_expect_eq(group_of(m, p, "a"), group_of(m, p, "y"));
    cr_expect_float_eq(p->est_us, -1, 1e-12);
    cr_expect_str_eq(p->target, "");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, tiny_back_to_back_beats_two_library_calls) {
    kf_model *m = gt_parse("input x float[4, 8]\n"
                           "const w1 float[8, 8] = random\n"
                           "const w2 float[8, 8] = random\n"
                           "h = MatMul(x, w1)\n"
                           "a = Relu(h)\n"
                           "y = MatMul(a, w2)\n"
                           "output y\n");
    kf_plan *p = plan_on(m, "h200", false);
    uint32_t g = group_of(m, p, "y");
    cr_expect_eq(g, group_of(m, p, "a"));
    cr_expect_neq(p->groups[g].anchor2, 0);
    cr_expect_str_eq(p->groups[g].est_form, "gemm_b2b");
    kf_plan_free(p);
    kf_model_free(m);
}

/* A library call's fixed cost dominates a small GEMM: its generated kernel
 * is estimated faster, and the group keeps the call's estimate (the
 * runtime then generates it: kernels/exec.c). A BERT-sized GEMM stays the
 * call, and so does a small convolution (the generated direct
 * convolution's rate is assumed, not calibrated). */
Test(cost, a_small_gemm_is_generated_where_the_call_costs_more) {
    kf_model *m = gt_parse("input x float[8, 32]\nconst w float[32, 16] = random\ny = MatMul(x, w)\n"
                           "input a float[128, 768]\nconst v float[768, 768] = random\nz = MatMul(a, v)\n"
                           "input c float[1, 4, 8, 8]\nconst k float[4, 4, 3, 3] = random\nq = Conv(c, k)\n"
                           "output y, z, q\n");
    kf_plan *p = plan_on(m, "h200", false);
    const kf_group *gy = &p->groups[group_of(m, p, "y")], *gz = &p->groups[group_of(m, p, "z")],
                   *gq = &p->groups[group_of(m, p, "q")];
    cr_expect_str_eq(gy->est_form, "gemm");
    cr_expect_gt(gy->est_lib_us, gy->est_us, "the call %.2f us, generated %.2f us", gy->est_lib_us, gy->est_us);
    cr_expect_str_eq(gz->est_form, "lib_gemm");
    cr_expect_float_eq(gz->est_lib_us, 0, 1e-12);
    cr_expect_str_eq(gq->est_form, "lib_conv");
    cr_expect_float_eq(gq->est_lib_us, 0, 1e-12);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cost, a_bias_epilogue_joins_the_library_call) {
    kf_model *m = gt_parse("input x float[128, 768]\n"
                           "const w float[768, 768] = random\n"
                           "const b float[768] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = Add(y, b)\n"
                           "r = Relu(z)\n"
                           "output r\n");
    kf_plan *p = plan_on(m, "h200", false);
    cr_assert_eq(p->ngroups, 1, "bias and ReLU ride in the library's epilogue");
    cr_expect_str_eq(p->groups[0].est_form, "lib_gemm");
    cr_expect_float_eq(p->groups[0].est_epilogue_us, 0, 1e-12, "no generated epilogue kernel");
    kf_plan_free(p);
    kf_model_free(m);
}

/* ResNet's block end (conv with bias, skip Add, ReLU): cuDNN's fused op
 * adds the skip as its z, so the group is one call with no epilogue
 * kernel, priced with the skip's bytes read by the call; a residual the
 * call cannot add (broadcast along a spatial dim) keeps the epilogue. */
Test(cost, a_conv_residual_joins_the_library_call) {
    const char *fmt = "input x float16[1, 256, 14, 14]\nconst w float16[256, 256, 3, 3] = random\n"
                      "const b float16[256] = random\ninput s float16[%s]\n"
                      "y = Conv(x, w, b) {pads=[1,1,1,1]}\nz = Add(y, s)\nr = Relu(z)\noutput r\n";
    const char *shape[2] = {"1, 256, 14, 14", "1, 256, 1, 14"};
    double us[2], call[2];
    for (int i = 0; i < 2; i++) {
        char text[512];
        snprintf(text, sizeof text, fmt, shape[i]);
        kf_model *m = gt_parse(text);
        kf_plan *p = plan_on(m, "h200", false);
        cr_assert_eq(p->ngroups, 1, "%s", shape[i]);
        cr_expect_str_eq(p->groups[0].est_form, "lib_conv");
        us[i] = p->groups[0].est_us, call[i] = us[i] - p->groups[0].est_epilogue_us;
        if (i == 0) cr_expect_float_eq(p->groups[0].est_epilogue_us, 0, 1e-12, "no generated epilogue kernel");
        else cr_expect_gt(p->groups[0].est_epilogue_us, 0, "the broadcast residual needs the epilogue kernel");
        kf_plan_free(p);
        kf_model_free(m);
    }
    cr_expect_lt(us[0], us[1], "one call against a call and a kernel");
    cr_expect_geq(call[0], call[1], "the call reads the residual's bytes too");
}

Test(cost, a_bad_target_is_an_error_of_the_planner) {
    kf_model *m = gt_parse("input x float[4]\n"
                           "y = Relu(x)\n"
                           "output y\n");
    kf_plan_options o = {.fuel = -1, .target = "no-such-gpu"};
    kf_plan *p = (kf_plan *)1;
    cr_expect_eq(kf_plan_build(m, &o, &p), KF_ERR_INVALID_ARG);
    cr_expect_null(p);
    cr_expect(strstr(kf_last_error(), "no-such-gpu"), "%s", kf_last_error());
    kf_model_free(m);
}

/* What the library path's epilogue kernel takes and what it does not
 * (kernels/libanchor.c): a merged QKV projection split three ways stays a
 * library call; a select of the first token after the LayerNorm (BERT's
 * pooler input) would force the generated row-tile kernel, so the planner
 * leaves it out of the group. */
Test(cost, library_epilogues_the_runtime_takes_and_the_one_it_does_not) {
    kf_model *m = gt_parse("input x float[128, 768]\n"
                           "const w float[768, 2304] = random\n"
                           "const b float[2304] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = Add(y, b)\n"
                           "q, k, v = Split(z) {axis=1}\n"
                           "output q, k, v\n");
    kf_plan *p = plan_on(m, "h200", false);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_str_eq(p->groups[0].est_form, "lib_gemm");
    kf_plan_free(p);
    kf_model_free(m);

    m = gt_parse("opset 17\n"
                 "input x float[128, 768]\n"
                 "const w float[768, 768] = random\n"
                 "const gam float[768] = random\n"
                 "const i int64[] = 0\n"
                 "y = MatMul(x, w)\n"
                 "n = LayerNormalization(y, gam) {axis=-1}\n"
                 "f = Gather(n, i) {axis=0}\n"
                 "output n, f\n");
    p = plan_on(m, "h200", true); /* every legal merge: the select joins, the group is generated */
    cr_expect_eq(group_of(m, p, "f"), group_of(m, p, "y"));
    cr_expect_str_eq(p->groups[group_of(m, p, "y")].est_form, "gemm_rows");
    kf_plan_free(p);
    p = plan_on(m, "h200", false);
    cr_expect_neq(group_of(m, p, "f"), group_of(m, p, "y"), "the select stays out");
    cr_expect_str_eq(p->groups[group_of(m, p, "y")].est_form, "lib_gemm");
    kf_plan_free(p);
    kf_model_free(m);
}

/* Layout ops (Reshape, Transpose, Squeeze, ...) are index maps: they hold
 * no registers, so an attention group near the register cap still takes
 * a long chain of them (ViT's q/k/v cut by Reshape, Transpose, Squeeze and
 * Gather, its output's Transpose and Reshape). At one register each, the
 * 30 Transposes of k here pass the cap (255) and were refused. */
Test(cost, layout_ops_hold_no_registers) {
    char text[4096];
    int n = snprintf(text, sizeof text, "opset 17\ninput q float16[1, 2, 16, 8]\ninput k0 float16[1, 2, 8, 16]\n"
                                        "input v float16[1, 2, 16, 8]\nconst c float16[] = 0.35\n");
    for (int i = 1; i <= 30; i++) /* an even count: k comes back to [1, 2, 8, 16] */
        n += snprintf(text + n, sizeof text - (size_t)n, "k%d = Transpose(k%d) {perm=[0, 1, 3, 2]}\n", i, i - 1);
    snprintf(text + n, sizeof text - (size_t)n,
             "s = MatMul(q, k30)\nm = Mul(s, c)\np = Softmax(m) {axis=-1}\no = MatMul(p, v)\n"
             "t = Transpose(o) {perm=[0, 2, 1, 3]}\nr = Flatten(t) {axis=2}\noutput r\n");
    kf_model *m = gt_parse(text);
    kf_plan *p = plan_on(m, "h200", false);
    uint32_t g = group_of(m, p, "o");
    cr_expect_eq(group_of(m, p, "k1"), g, "the Transposes of k are the attention's prologue");
    cr_expect_eq(group_of(m, p, "r"), g, "the output's Transpose and Flatten its epilogue");
    cr_expect_str_eq(p->groups[g].est_form, "attention");
    kf_plan_free(p);
    kf_model_free(m);
}

/* BERT's merged Q/K/V projection: the attention group takes the Split as
 * a prologue (offered its select first: plan_build.c, select_edge), so
 * the library call keeps only its bias, with no epilogue kernel. */
Test(cost, attention_takes_the_split_so_the_projection_is_one_call) {
    kf_model *m = gt_parse("opset 13\ninput x float16[1, 128, 768]\nconst w float16[768, 2304] = random\n"
                           "const b float16[2304] = random\nconst sp int64[3] = 768 768 768\n"
                           "const shp int64[4] = 1 128 12 64\nconst s float16[] = 0.125\n"
                           "input mask float16[1, 1, 1, 128]\n"
                           "y = MatMul(x, w)\nz = Add(y, b)\nq, k, v = Split(z, sp) {axis=-1}\n"
                           "qr = Reshape(q, shp)\nqt = Transpose(qr) {perm=[0,2,1,3]}\nkr = Reshape(k, shp)\n"
                           "kt = Transpose(kr) {perm=[0,2,3,1]}\nvr = Reshape(v, shp)\n"
                           "vt = Transpose(vr) {perm=[0,2,1,3]}\nm = MatMul(qt, kt)\nsc = Mul(m, s)\n"
                           "a = Add(sc, mask)\np = Softmax(a) {axis=-1}\no = MatMul(p, vt)\noutput o\n");
    kf_plan *p = plan_on(m, "h200", false);
    uint32_t proj = group_of(m, p, "z"), att = group_of(m, p, "o");
    cr_expect_eq(group_of(m, p, "q"), att, "the Split reads where q, k and v lie");
    cr_expect_neq(proj, att);
    cr_expect_str_eq(p->groups[proj].est_form, "lib_gemm");
    cr_expect_float_eq(p->groups[proj].est_epilogue_us, 0, 1e-12, "bias only: no generated epilogue kernel");
    cr_expect_str_eq(p->groups[att].est_form, "attention");
    kf_plan_free(p);
    kf_model_free(m);
}

/* GPT-2's MLP: Gemm on rows, a Reshape back to [batch, seq, N], tanh
 * GELU, a Reshape to rows again. The call writes the reshaped bytes and
 * applies the GELU itself (kernels/libanchor.c take_epilogue), so the
 * model prices no epilogue kernel; an erf GELU keeps one. */
Test(cost, reshapes_around_a_tanh_gelu_stay_in_the_library_call) {
    const char *fmt = "opset 20\ninput x float16[128, 768]\nconst w float16[768, 3072] = random\n"
                      "const b float16[3072] = random\nconst s3 int64[3] = 1 128 3072\nconst s2 int64[2] = 128 3072\n"
                      "y = Gemm(x, w, b)\nr = Reshape(y, s3)\ng = Gelu(r) {approximate=\"%s\"}\n"
                      "o = Reshape(g, s2)\noutput o\n";
    const char *approx[2] = {"tanh", "none"};
    for (int i = 0; i < 2; i++) {
        char text[640];
        snprintf(text, sizeof text, fmt, approx[i]);
        kf_model *m = gt_parse(text);
        kf_plan *p = plan_on(m, "h200", false);
        cr_assert_eq(p->ngroups, 1, "%s", approx[i]);
        cr_expect_str_eq(p->groups[0].est_form, "lib_gemm");
        if (i == 0) cr_expect_float_eq(p->groups[0].est_epilogue_us, 0, 1e-12, "tanh: one call");
        else cr_expect_gt(p->groups[0].est_epilogue_us, 0, "erf: the GELU needs the epilogue kernel");
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* An int8 plan's attention quantizes the probabilities between Softmax and
 * the second product: the streaming kernel runs it in two passes over the
 * keys (kf_att_passes), priced with the scores computed twice, so above
 * the same group with an Identity there; any other op between (a Relu)
 * leaves the back-to-back group to its whole-row form. */
Test(cost, probabilities_quantized_before_the_second_product_stream_in_two_passes) {
    const char *fmt = "opset 14\ninput q float[1, 12, 128, 64]\ninput kt float[1, 12, 64, 128]\n"
                      "input v float[1, 12, 128, 64]\nconst s float[] = 0.003921569\nconst z uint8[] = 0\n"
                      "x = MatMul(q, kt)\np = Softmax(x) {axis=-1}\n%s"
                      "y = MatMul(pd, v)\noutput y\n";
    const char *mid[3] = {"pq = QuantizeLinear(p, s, z)\npd = DequantizeLinear(pq, s, z)\n", "pd = Identity(p)\n",
                          "pd = Relu(p)\n"};
    const char *form[3] = {"attention", "attention", "gemm_b2b"};
    double us[3];
    for (int i = 0; i < 3; i++) {
        char text[1024];
        snprintf(text, sizeof text, fmt, mid[i]);
        kf_model *m = gt_parse(text);
        kf_plan *p = plan_on(m, "h200", true); /* every legal merge: one group */
        const kf_group *g = &p->groups[group_of(m, p, "y")];
        cr_assert_eq(group_of(m, p, "x"), group_of(m, p, "y"), "one back-to-back group: %s", mid[i]);
        cr_assert_str_eq(g->est_form, form[i], "%s", mid[i]);
        us[i] = g->est_us;
        kf_plan_free(p);
        kf_model_free(m);
    }
    cr_assert_gt(us[0], us[1], "two passes over the keys cost more than one: %g vs %g us", us[0], us[1]);
}

/* Attention, decomposed (MatMul -> scale -> mask -> Softmax -> MatMul, one
 * back-to-back group) or as the opset-23 node, is the same streaming kernel
 * and costs the same: 12 heads of 128 queries in blocks of 64 rows = 24
 * blocks; on the test profile (100 GB/s at ew_frac 0.5) its 786688 bytes
 * take longer than its 50 MFLOP at attn_tc_frac 0.5 of 16 TFLOP/s. */
Test(cost, attention_decomposed_and_node_cost_the_same) {
    kf_model *a = gt_parse("opset 14\ninput q float16[1, 12, 128, 64]\ninput k float16[1, 12, 128, 64]\n"
                           "input v float16[1, 12, 128, 64]\ninput m float16[1, 1, 1, 128]\nconst s float16[] = 0.125\n"
                           "kt = Transpose(k) {perm=[0,1,3,2]}\nx = MatMul(q, kt)\nsc = Mul(x, s)\nb = Add(sc, m)\n"
                           "p = Softmax(b) {axis=-1}\ny = MatMul(p, v)\noutput y\n");
    kf_model *b = gt_parse("opset 23\ninput q float16[1, 12, 128, 64]\ninput k float16[1, 12, 128, 64]\n"
                           "input v float16[1, 12, 128, 64]\ninput m float16[1, 1, 1, 128]\n"
                           "y = Attention(q, k, v, m)\noutput y\n");
    kf_plan *pa = plan_on(a, "test", false), *pb = plan_on(b, "test", false);
    const kf_group *ga = &pa->groups[group_of(a, pa, "y")], *gb = &pb->groups[group_of(b, pb, "y")];
    cr_assert_str_eq(ga->est_form, "attention");
    cr_assert_str_eq(gb->est_form, "attention");
    cr_expect_eq(ga->est_blocks, 24);
    cr_expect_eq(gb->est_blocks, 24);
    /* q, k, v and y (4 x 12 x 128 x 64 halves) and the mask (128 halves) */
    double bytes = 4.0 * 12 * 128 * 64 * 2 + 128 * 2, want = bytes / 50e9 * 1e6 + 1;
    cr_expect_float_eq(gb->est_us, want, 1e-6, "%.6f vs %.6f", gb->est_us, want);
    cr_expect_str_eq(gb->est_bound, "memory");
    /* the decomposed group also reads the scale constant (2 bytes) */
    cr_expect_float_eq(ga->est_us, gb->est_us, 1e-3, "%.6f vs %.6f", ga->est_us, gb->est_us);
    kf_plan_free(pa);
    kf_plan_free(pb);
    kf_model_free(a);
    kf_model_free(b);
}

/* ---- float8 convolutions: the tile or the library ---- */

/* ResNet-50 layer1's 3x3 (64 x 64 channels at 56 x 56: 196 tiles of the
 * float8 tile) and layer4's (512 x 512 at 7 x 7: 32 tiles of 32) with
 * float8 operands. On the H200 the first takes the float8 tile, its two
 * DequantizeLinears in its group; the second is faster as the library's
 * float16 convolution, so its weights are dequantized once at plan time
 * (a constant group) and the library form is planned. Without a target
 * bytes decide: float8 for both. */
#define FP8_CONVS                                                                                      \
    "opset 21\ninput x float8e4m3fn[1, 64, 56, 56]\ninput x4 float8e4m3fn[1, 512, 7, 7]\n"             \
    "const w float8e4m3fn[64, 64, 3, 3] = random\nconst w4 float8e4m3fn[512, 512, 3, 3] = random\n"     \
    "const s float[] = 0.05\n"                                                                         \
    "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, s)\n"                                       \
    "xd4 = DequantizeLinear(x4, s)\nwd4 = DequantizeLinear(w4, s)\n"                                   \
    "c = Conv(xd, wd) {pads=[1,1,1,1]}\nc4 = Conv(xd4, wd4) {pads=[1,1,1,1]}\n"                        \
    "output c\noutput c4\n"

static kf_id producer_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].producer, "no node writes '%s'", name);
    return m->graph->values[v].producer;
}

Test(cost, float8_convolutions_take_the_tile_where_it_pays) {
    kf_model *m = gt_parse(FP8_CONVS);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_id c = producer_of(m, "c"), c4 = producer_of(m, "c4");
    cr_assert(kf_fp8_conv(m, &m->graph->nodes[c], NULL) && kf_fp8_conv(m, &m->graph->nodes[c4], NULL));
    kf_target *t = NULL;
    cr_assert_eq(kf_target_get("h200", &t), KF_OK);
    cr_assert(kf_fp8_conv_pays(t, KF_MATH_FP32, m, c), "layer1's 3x3 on the float8 tile");
    cr_assert_not(kf_fp8_conv_pays(t, KF_MATH_FP32, m, c4), "layer4's 3x3 on the library");
    cr_assert(kf_fp8_conv_pays(NULL, KF_MATH_FP32, m, c) && kf_fp8_conv_pays(NULL, KF_MATH_FP32, m, c4));

    kf_plan_options o = {.fuel = -1, .target = "h200"};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    uint32_t g = p->group_of[c], g4 = p->group_of[c4];
    cr_assert_eq(p->group_of[producer_of(m, "xd")], g);
    cr_assert_eq(p->group_of[producer_of(m, "wd")], g);
    cr_assert_eq(p->groups[p->group_of[producer_of(m, "wd4")]].kind, KF_GROUP_CONST, "layer4's weights at plan time");
    const char *want[2] = {"f8conv", "lib_conv"};
    for (int i = 0; i < 2; i++) {
        kf_cost_group cg;
        kf_cost_of_group(m, p, i ? g4 : g, &cg);
        kf_cost e;
        kf_cost_estimate(t, KF_MATH_FP32, m->graph, &cg, &e);
        cr_assert_str_eq(e.form, want[i]);
    }
    kf_plan_free(p);
    kf_target_free(t);
    kf_model_free(m);
}

/* The float8 convolution's form: one group (not grouped convolutions), a
 * float8 input scaled per tensor, constant float8 weights scaled per
 * tensor or per output channel, each read by this convolution alone;
 * E4M3FN and E5M2 only (the tensor cores' formats). */
Test(cost, float8_convolution_form) {
    static const struct {
        const char *text;
        bool is;
    } cases[] = {
        {"input x float8e5m2[1, 8, 6, 6]\nconst w float8e4m3fn[16, 8, 3, 3] = random\nconst sw float[16] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw) {axis=0}\nc = Conv(xd, wd)\n", true},
        {"input x float8e4m3fn[1, 8, 6, 6]\nconst w float8e4m3fn[16, 4, 3, 3] = random\nconst sw float[] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw)\nc = Conv(xd, wd) {group=2}\n", false},
        {"input x float8e4m3fn[1, 8, 6, 6]\nconst w float8e4m3fn[16, 8, 3, 3] = random\nconst sw float[8] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw) {axis=1}\nc = Conv(xd, wd)\n", false},
        {"input x float8e4m3fnuz[1, 8, 6, 6]\nconst w float8e4m3fn[16, 8, 3, 3] = random\nconst sw float[] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw)\nc = Conv(xd, wd)\n", false},
        {"input x float8e4m3fn[1, 8, 6, 6]\ninput w float8e4m3fn[16, 8, 3, 3]\nconst sw float[] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw)\nc = Conv(xd, wd)\n", false},
        {"input x float8e4m3fn[1, 8, 6, 6]\nconst w float8e4m3fn[16, 8, 3, 3] = random\nconst sw float[] = 0.1\n"
         "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, sw)\nc = Conv(xd, wd)\nr = Relu(wd)\noutput r\n", false},
        {"input x float[1, 8, 6, 6]\nconst w float8e4m3fn[16, 8, 3, 3] = random\nconst sw float[] = 0.1\n"
         "xd = Relu(x)\nwd = DequantizeLinear(w, sw)\nc = Conv(xd, wd)\n", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "opset 21\nconst s float[] = 0.05\n%soutput c\n", cases[i].text);
        kf_model *m = gt_parse(text);
        cr_assert_eq(kf_infer_shapes(m), KF_OK, "case %zu: %s", i, kf_last_error());
        cr_assert_eq(kf_fp8_conv(m, &m->graph->nodes[producer_of(m, "c")], NULL), cases[i].is, "case %zu", i);
        kf_model_free(m);
    }
}
