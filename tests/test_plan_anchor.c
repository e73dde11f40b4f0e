/*
 * test_plan_anchor.c: the planner's anchor group shapes (fusion/plan.c,
 * anchor_union): layout and elementwise prologues, layout epilogues (Split
 * included), a row reduction after a GEMM, back-to-back GEMMs and convs,
 * attention as one group, and isolated pure reshapes as views (no kernel).
 * Positive tests check the grouping and that the fused model (groups as
 * ai.kfuse functions) computes what the original does on random inputs;
 * negative tests build each new refusal and check its exact string.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_fuse.h"
#include "kf_plan.h"

static kf_plan *plan(kf_model *m) {
    kf_plan_options o = {.fuel = -1};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    return p;
}

static kf_id producer(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].producer, "no produced value %s", name);
    return m->graph->values[v].producer;
}

static uint32_t grp(const kf_model *m, const kf_plan *p, const char *name) { return p->group_of[producer(m, name)]; }

/* Reason on the boundary carrying value v into the group producing `to`. */
static const char *breason(const kf_model *m, const kf_plan *p, const char *v, const char *to) {
    kf_id id = kf_graph_find(m->graph, v);
    uint32_t gt = grp(m, p, to);
    for (uint32_t i = 0; i < p->nbounds; i++)
        if (p->bounds[i].value == id && p->bounds[i].to == gt) return p->bounds[i].reason;
    return NULL;
}

/* The plan's groups written as functions compute what the original model
 * computes (DESIGN.md fp32 tolerances; random inputs with a printed seed). */
static void expect_fused_equal(kf_model *m) {
    kf_plan *built = plan(m), *p = NULL;
    cr_assert_eq(kf_fuse_plan_copy(m, built, &p), KF_OK, "%s", kf_last_error());
    kf_plan_free(built);
    kf_model *f = gt_copy(m);
    kf_fuse_stats st;
    cr_assert_eq(kf_fuse_apply(f, p, &st), KF_OK, "%s", kf_last_error());
    cr_expect_geq(st.functions, 1);
    gt_expect_same_outputs(m, f, 1e-5, 1e-4);
    kf_fuse_simple_plan_free(p);
    kf_model_free(f);
}

/* ---- prologues and epilogues ------------------------------------------------ */

Test(plan_anchor, elementwise_and_layout_prologues_are_applied_on_load) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[8, 4]\n"
                           "const w float[8, 16] = random\n"
                           "const s float[] = 0.5\n"
                           "t = Transpose(x) {perm=[1, 0]}\n"
                           "r = Relu(t)\n"
                           "h = Mul(r, s)\n"
                           "y = MatMul(h, w)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    cr_expect_eq(p->groups[0].anchor, producer(m, "y"));
    cr_expect_eq(p->groups[0].anchor2, 0);
    cr_expect_eq(p->groups[0].reduction, 0);
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

Test(plan_anchor, qkv_split_per_head_is_a_store_epilogue) {
    /* one GEMM writes Q, K, V already split into heads and transposed */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[1, 4, 8]\n"
                           "const w float[8, 24] = random\n"
                           "const b float[24] = random\n"
                           "const sp int64[3] = 8\n"
                           "const hs int64[4] = 1 4 2 4\n"
                           "y = MatMul(x, w)\n"
                           "z = Add(y, b)\n"
                           "q, k, v = Split(z, sp) {axis=2}\n"
                           "q2 = Reshape(q, hs)\n"
                           "k2 = Reshape(k, hs)\n"
                           "v2 = Reshape(v, hs)\n"
                           "qt = Transpose(q2) {perm=[0, 2, 1, 3]}\n"
                           "kt = Transpose(k2) {perm=[0, 2, 3, 1]}\n"
                           "vt = Transpose(v2) {perm=[0, 2, 1, 3]}\n"
                           "output qt, kt, vt\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    cr_expect_eq(p->groups[0].noutputs, 3);
    cr_expect_eq(p->nbounds, 0);
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

Test(plan_anchor, scalar_gather_selects_a_slice_in_the_epilogue) {
    /* ViT's stacked QKV: one GEMM, then q/k/v picked by a scalar index */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 24] = random\n"
                           "const sh int64[3] = 4 3 8\n"
                           "const i0 int64[] = 0\n"
                           "const i2 int64[] = 2\n"
                           "y = MatMul(x, w)\n"
                           "r = Reshape(y, sh)\n"
                           "q = Gather(r, i0) {axis=1}\n"
                           "v = Gather(r, i2) {axis=1}\n"
                           "output q, v\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_gather_an_index_tensor_after_an_anchor) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "const idx int64[2] = 3 1\n"
                           "y = MatMul(x, w)\n"
                           "t = Gather(y, idx) {axis=1}\n"
                           "output t\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "t"), KF_REASON_ANCHOR_INJECTIVE);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- row reductions after an anchor ---------------------------------------------- */

Test(plan_anchor, gemm_bias_residual_layernorm_is_one_group) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 3, 8]\n"
                           "input res float[2, 3, 16]\n"
                           "const w float[8, 16] = random\n"
                           "const b float[16] = random\n"
                           "const gam float[16] = random\n"
                           "const bet float[16] = random\n"
                           "y = MatMul(x, w)\n"
                           "a = Add(y, b)\n"
                           "c = Add(a, res)\n"
                           "n = LayerNormalization(c, gam, bet) {axis=-1}\n"
                           "g = Relu(n)\n"
                           "output g\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    cr_expect_eq(p->groups[0].anchor, producer(m, "y"));
    cr_expect_eq(p->groups[0].reduction, producer(m, "n"));
    /* reads x, w, b, res, gamma, beta once; writes g */
    cr_expect_eq(p->bytes_fused, p->bytes_lower_bound);
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

/* A ReduceX after a GEMM: the epilogue kernel after a library call
 * computes it, so it joins where the target's library takes the GEMM
 * (without one it stays apart: test_plan.c, RED_KIND). */
Test(plan_anchor, row_reduce_over_the_last_axis_follows_a_gemm) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 16] = random\n"
                           "y = MatMul(x, w)\n"
                           "r = ReduceMax(y) {axes=[1], keepdims=1}\n"
                           "d = Sub(y, r)\n"
                           "output d\n");
    kf_plan_options o = {.fuel = -1, .target = "h200", .legal_only = true};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].reduction, producer(m, "r"));
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

/* ---- back-to-back --------------------------------------------------------------- */

static const char *ATTENTION = "opset 17\n"
                               "input q float[1, 2, 8, 4]\n"
                               "input k float[1, 2, 8, 4]\n"
                               "input v float[1, 2, 8, 4]\n"
                               "input mask float[1, 1, 1, 8]\n"
                               "const scale float[] = 2\n"
                               "const os int64[3] = 1 8 8\n"
                               "kt = Transpose(k) {perm=[0, 1, 3, 2]}\n"
                               "s = MatMul(q, kt)\n"
                               "d = Div(s, scale)\n"
                               "e = Add(d, mask)\n"
                               "pr = Softmax(e) {axis=-1}\n"
                               "c = MatMul(pr, v)\n"
                               "ct = Transpose(c) {perm=[0, 2, 1, 3]}\n"
                               "o = Reshape(ct, os)\n"
                               "output o\n";

Test(plan_anchor, attention_is_one_group) {
    kf_model *m = gt_parse(ATTENTION);
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->launches, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    cr_expect_eq(p->groups[0].anchor, producer(m, "s"));
    cr_expect_eq(p->groups[0].anchor2, producer(m, "c"));
    cr_expect_eq(p->groups[0].reduction, producer(m, "pr"));
    /* the scores and probabilities never reach memory */
    cr_expect_eq(p->bytes_fused, p->bytes_lower_bound);
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

Test(plan_anchor, gemm_relu_gemm_is_back_to_back) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 16] = random\n"
                           "const w2 float[16, 8] = random\n"
                           "y = MatMul(x, w)\n"
                           "r = Relu(y)\n"
                           "z = MatMul(r, w2)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].anchor, producer(m, "y"));
    cr_expect_eq(p->groups[0].anchor2, producer(m, "z"));
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

Test(plan_anchor, conv3x3_then_conv1x1_is_back_to_back) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[1, 3, 6, 6]\n"
                           "const w float[4, 3, 3, 3] = random\n"
                           "const b float[4] = random\n"
                           "const w2 float[8, 4, 1, 1] = random\n"
                           "y = Conv(x, w, b) {pads=[1, 1, 1, 1]}\n"
                           "r = Relu(y)\n"
                           "z = Conv(r, w2)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].anchor2, producer(m, "z"));
    kf_plan_free(p);
    expect_fused_equal(m);
    kf_model_free(m);
}

/* ---- views ----------------------------------------------------------------------- */

Test(plan_anchor, isolated_reshape_is_a_view_without_a_kernel) {
    /* between two opaque CumSums the Reshape is alone: metadata only */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const ax int64[] = 1\n"
                           "const sh int64[2] = 8 4\n"
                           "a = CumSum(x, ax)\n"
                           "r = Reshape(a, sh)\n"
                           "c = CumSum(r, ax)\n"
                           "output c\n");
    kf_plan *p = plan(m);
    uint32_t gr = grp(m, p, "r");
    cr_expect_eq(p->ngroups, 3);
    cr_expect(p->groups[gr].view);
    cr_expect_eq(p->groups[gr].launch, UINT32_MAX);
    cr_expect_eq(p->groups[gr].bytes_read, 0);
    cr_expect_eq(p->groups[gr].bytes_written, 0);
    cr_expect_eq(p->launches, 2);
    cr_expect(!p->groups[grp(m, p, "a")].view);
    /* CumSum reads x and its int64 axis, writes a; CumSum reads r (a's
     * bytes) and the axis, writes c; the Reshape moves nothing */
    cr_expect_eq(p->bytes_fused, 4 * 128 + 2 * 8);
    cr_expect_geq(p->bytes_fused, p->bytes_lower_bound);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor, transpose_is_not_a_view) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const ax int64[] = 1\n"
                           "a = CumSum(x, ax)\n"
                           "t = Transpose(a) {perm=[1, 0]}\n"
                           "c = CumSum(t, ax)\n"
                           "output c\n");
    kf_plan *p = plan(m);
    cr_expect(!p->groups[grp(m, p, "t")].view);
    cr_expect_eq(p->launches, 3);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor, reshape_of_an_input_to_an_output_costs_nothing) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const sh int64[1] = 32\n"
                           "r = Reshape(x, sh)\n"
                           "output r\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->launches, 0);
    cr_expect_eq(p->bytes_fused, 0);
    cr_expect_eq(p->bytes_lower_bound, 0);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- negative: one test per new reason --------------------------------------------- */

Test(plan_anchor_reason, does_not_recompute_a_prologue_read_elsewhere) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "r = Relu(x)\n"
                           "y = MatMul(r, w)\n"
                           "output y, r\n");
    kf_plan *p = plan(m);
    cr_expect_neq(grp(m, p, "r"), grp(m, p, "y"));
    cr_expect_str_eq(breason(m, p, "r", "y"), KF_REASON_PROLOGUE_SHARED);
    cr_expect_str_eq(breason(m, p, "r", "y"), "anchor prologue value is also read outside the group");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_fuse_a_reduction_across_gemm_rows) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 16] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = Softmax(y) {axis=0}\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "z"), KF_REASON_RED_AXIS);
    cr_expect_str_eq(breason(m, p, "y", "z"), "reduction after an anchor is not over the anchor's output rows");
    kf_plan_free(p);
    kf_model_free(m);
}

/* ConvNeXt between stages: the block's last GEMM (channels last), back to
 * NCHW for the residual, then channels last again for the downsampling
 * LayerNorm. The two Transposes undo each other, but a row tile between
 * them would hold a column of the GEMM's output: codegen cannot generate
 * the group, so the planner must not form it. */
Test(plan_anchor_reason, does_not_fuse_a_reduction_behind_transposes_of_the_rows) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[1, 4, 4, 8]\n"
                           "input r float[1, 8, 4, 4]\n"
                           "const w float[8, 8] = random\n"
                           "const gam float[8] = random\n"
                           "y = MatMul(x, w)\n"
                           "t = Transpose(y) {perm=[0,3,1,2]}\n"
                           "a = Add(t, r)\n"
                           "u = Transpose(a) {perm=[0,2,3,1]}\n"
                           "z = LayerNormalization(u, gam) {axis=-1}\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_neq(grp(m, p, "y"), grp(m, p, "z"), "GEMM and LayerNorm stay apart");
    cr_expect_str_eq(kf_plan_merge_reason(p, grp(m, p, "y"), grp(m, p, "z"), false), KF_REASON_RED_AXIS);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_fuse_a_reduction_over_a_row_too_long) {
    /* 2048 fp32 x 16 rows = 128 KiB > KF_PLAN_ONCHIP_BYTES */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 4]\n"
                           "const w float[4, 2048] = random\n"
                           "const gam float[2048] = random\n"
                           "y = MatMul(x, w)\n"
                           "n = LayerNormalization(y, gam) {axis=-1}\n"
                           "output n\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "n"), KF_REASON_ROW_CAP);
    cr_expect_str_eq(breason(m, p, "y", "n"), "row too long for an anchor+reduction epilogue (on-chip row tile cap)");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, row_of_1536_floats_still_fits) {
    /* the cap's edge: 1536 x 16 x 4 bytes = 96 KiB exactly */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 4]\n"
                           "const w float[4, 1536] = random\n"
                           "const gam float[1536] = random\n"
                           "y = MatMul(x, w)\n"
                           "n = LayerNormalization(y, gam) {axis=-1}\n"
                           "output n\n");
    kf_plan *p = plan(m);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "n"));
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_chain_anchors_through_the_right_operand) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[8, 8]\n"
                           "input u float[8, 8]\n"
                           "const w float[8, 8] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = MatMul(u, y)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "z"), KF_REASON_B2B_OPERAND);
    cr_expect_str_eq(breason(m, p, "y", "z"),
                     "back-to-back anchors: the second must read only the first's rows, as its left operand");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_chain_into_a_3x3_conv) {
    /* a 3x3 conv needs its neighbours' rows (a halo) */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[1, 3, 6, 6]\n"
                           "const w float[4, 3, 1, 1] = random\n"
                           "const w2 float[4, 4, 3, 3] = random\n"
                           "y = Conv(x, w)\n"
                           "z = Conv(y, w2) {pads=[1, 1, 1, 1]}\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "z"), KF_REASON_B2B_OPERAND);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_anchor_reason, does_not_chain_anchors_over_a_row_too_long) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 4]\n"
                           "const w float[4, 2048] = random\n"
                           "const w2 float[2048, 4] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = MatMul(y, w2)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "z"), KF_REASON_B2B_CAP);
    cr_expect_str_eq(breason(m, p, "y", "z"),
                     "back-to-back anchors: the first anchor's output row is too long to stay on chip");
    kf_plan_free(p);
    kf_model_free(m);
}
