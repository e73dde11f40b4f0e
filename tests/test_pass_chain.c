/*
 * test_pass_chain.c: the chain-folding rules (fusion/pass_chain.c):
 * reshape-like chains into one Reshape, Transpose pairs into one (or none),
 * Cast pairs whose first Cast is exact. Positive tests check op counts and
 * bitwise-equal outputs on random inputs; does_not_* tests check reasons.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define ORT_TRANSFORM KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/test/testdata/transform/"



/* Runs the chain rules on text; expects `gone` to vanish, `left` ops of
 * type `left_op` to remain, rule to hit, and bitwise-equal outputs. */
static void expect_folded(const char *text, const char *gone, const char *left_op, uint32_t left, const char *rule) {
    kf_model *m = gt_parse(text);
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_chain_rules);
    if (gone) cr_expect_eq(gt_count(m, gone), 0, "%s left (%s: %s)", gone, rule, gt_reasons(&rs, rule));
    cr_expect_eq(gt_count(m, left_op), left, "%s count (%s: %s)", left_op, rule, gt_reasons(&rs, rule));
    cr_expect_geq(gt_hits(&rs, rule), 1, "rule %s did not hit: %s", rule, gt_reasons(&rs, rule));
    for (int64_t base = 1; base <= 5; base += 2) gt_expect_same_outputs_sized(orig, m, 0, 0, base);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

static void expect_kept(const char *text, const char *op, const char *rule, const char *why) {
    kf_model *m = gt_parse(text);
    uint32_t before = gt_count(m, op), nodes = kf_graph_live_nodes(m->graph);
    kf_ruleset rs = gt_run_rules(m, kf_pass_chain_rules);
    cr_expect_eq(gt_count(m, op), before, "%s count changed", op);
    cr_expect_eq(kf_graph_live_nodes(m->graph), nodes);
    cr_expect_eq(gt_hits(&rs, rule), 0);
    cr_expect(strstr(gt_reasons(&rs, rule), why), "rule %s: reason '%s', want '%s'", rule, gt_reasons(&rs, rule), why);
    kf_rules_free(&rs);
    kf_model_free(m);
}

/* ---- reshape-like chains ---------------------------------------------------------- */

Test(pass_chain, reshape_of_reshape) {
    expect_folded("input x float[2, 3, 4]\n"
                  "const s1 int64[2] = 6 4\n"
                  "const s2 int64[2] = 4 6\n"
                  "a = Relu(x)\n"
                  "b = Reshape(a, s1)\n"
                  "c = Reshape(b, s2)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  NULL, "Reshape", 1, "collapse_reshape_chain");
}

Test(pass_chain, reshape_of_reshape_with_a_dynamic_dim) {
    /* the outer shape has no 0, so it needs only the element count */
    expect_folded("input x float[N, 3, 4]\n"
                  "const s1 int64[2] = 0 12\n"
                  "const s2 int64[3] = -1 2 6\n"
                  "a = Relu(x)\n"
                  "b = Reshape(a, s1)\n"
                  "c = Reshape(b, s2)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  NULL, "Reshape", 1, "collapse_reshape_chain");
}

Test(pass_chain, squeeze_unsqueeze_flatten_chains) {
    expect_folded("input x float[2, 3]\n"
                  "const ax int64[1] = 0\n"
                  "a = Relu(x)\n"
                  "b = Unsqueeze(a, ax)\n"
                  "c = Flatten(b) {axis=2}\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Unsqueeze", "Reshape", 1, "collapse_flatten_chain");
    expect_folded("input x float[2, 1, 3]\n"
                  "const ax int64[1] = 1\n"
                  "const ax2 int64[2] = 0 3\n"
                  "a = Relu(x)\n"
                  "b = Squeeze(a, ax)\n"
                  "c = Unsqueeze(b, ax2)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Squeeze", "Reshape", 1, "collapse_unsqueeze_chain");
    expect_folded("input x float[2, 3]\n"
                  "const s int64[3] = 1 6 1\n"
                  "a = Relu(x)\n"
                  "b = Reshape(a, s)\n"
                  "c = Squeeze(b)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Squeeze", "Reshape", 1, "collapse_squeeze_chain");
}

Test(pass_chain, three_reshapes_become_one) {
    expect_folded("input x float[2, 3, 4]\n"
                  "const s1 int64[1] = 24\n"
                  "const s2 int64[2] = 4 6\n"
                  "const s3 int64[3] = 3 2 4\n"
                  "a = Relu(x)\n"
                  "b = Reshape(a, s1)\n"
                  "c = Reshape(b, s2)\n"
                  "d = Reshape(c, s3)\n"
                  "y = Neg(d)\n"
                  "output y\n",
                  NULL, "Reshape", 1, "collapse_reshape_chain");
}

Test(pass_chain, collapses_a_symbolic_squeeze_chain) {
    /* [N, 1, 3] -> [N, 3] -> [1, N, 3]: one Reshape to [1, -1, 3] */
    expect_folded("input x float[N, 1, 3]\n"
                  "const ax int64[1] = 1\n"
                  "const ax2 int64[1] = 0\n"
                  "a = Relu(x)\n"
                  "b = Squeeze(a, ax)\n"
                  "c = Unsqueeze(b, ax2)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Squeeze", "Reshape", 1, "collapse_unsqueeze_chain");
}

Test(pass_chain, collapses_a_reshape_that_copies_dims) {
    /* the 0 in the outer shape copies a dim of the inner result, which is
     * x's N in place: [0, 3, 4] */
    expect_folded("input x float[N, 4, 3]\n"
                  "const s1 int64[2] = 0 12\n"
                  "const s2 int64[3] = 0 3 -1\n"
                  "a = Relu(x)\n"
                  "b = Reshape(a, s1)\n"
                  "c = Reshape(b, s2)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  NULL, "Reshape", 1, "collapse_reshape_chain");
}

Test(pass_chain, does_not_collapse_when_two_symbols_move) {
    /* [A, B, C] -> [A, B*C] -> [1, A, B*C]: A and B*C both leave their
     * places, and one -1 can stand for only one of them */
    expect_kept("input x float[A, B, C]\n"
                "const ax int64[1] = 0\n"
                "a = Relu(x)\n"
                "b = Flatten(a) {axis=1}\n"
                "c = Unsqueeze(b, ax)\n"
                "y = Neg(c)\n"
                "output y\n",
                "Unsqueeze", "collapse_unsqueeze_chain", "neither static");
}

/* ---- transposes -------------------------------------------------------------------- */

Test(pass_chain, transposes_compose) {
    expect_folded("input x float[2, 3, 4]\n"
                  "a = Relu(x)\n"
                  "b = Transpose(a) {perm=[1, 2, 0]}\n"
                  "c = Transpose(b) {perm=[0, 2, 1]}\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  NULL, "Transpose", 1, "compose_transposes");
}

Test(pass_chain, inverse_transposes_cancel) {
    expect_folded("input x float[2, 3, 4]\n"
                  "a = Relu(x)\n"
                  "b = Transpose(a) {perm=[1, 2, 0]}\n"
                  "c = Transpose(b) {perm=[2, 0, 1]}\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Transpose", "Relu", 1, "compose_transposes");
    /* two default (reversing) transposes cancel too */
    expect_folded("input x float[2, 3, 4]\n"
                  "a = Relu(x)\n"
                  "b = Transpose(a)\n"
                  "c = Transpose(b)\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Transpose", "Relu", 1, "compose_transposes");
}

Test(pass_chain, does_not_cancel_transposes_between_graph_input_and_output) {
    expect_kept("input x float[2, 3]\n"
                "b = Transpose(x) {perm=[1, 0]}\n"
                "y = Transpose(b) {perm=[1, 0]}\n"
                "output y\n",
                "Transpose", "compose_transposes", "would rename one of them");
}

Test(pass_chain, does_not_compose_a_transpose_of_something_else) {
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "y = Transpose(a) {perm=[1, 0]}\n"
                "output y\n",
                "Transpose", "compose_transposes", "not computed by a Transpose");
}

/* ---- casts ---------------------------------------------------------------------------- */

Test(pass_chain, cast_round_trip_through_a_wider_type) {
    /* float -> double -> float is exact: both Casts go */
    expect_folded("input x float[2, 3]\n"
                  "a = Relu(x)\n"
                  "b = Cast(a) {to=11}\n"
                  "c = Cast(b) {to=1}\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  "Cast", "Relu", 1, "fold_cast_chain");
}

Test(pass_chain, cast_through_a_wider_int) {
    /* int32 -> int64 is exact, so int64 -> float sees the same numbers */
    expect_folded("input x int32[2, 3]\n"
                  "a = Abs(x)\n"
                  "b = Cast(a) {to=7}\n"
                  "c = Cast(b) {to=1}\n"
                  "y = Neg(c)\n"
                  "output y\n",
                  NULL, "Cast", 1, "fold_cast_chain");
}

Test(pass_chain, does_not_fold_a_rounding_cast) {
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "b = Cast(a) {to=6}\n"
                "c = Cast(b) {to=1}\n"
                "y = Neg(c)\n"
                "output y\n",
                "Cast", "fold_cast_chain", "may round or overflow");
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "b = Cast(a) {to=10}\n"
                "c = Cast(b) {to=1}\n"
                "y = Neg(c)\n"
                "output y\n",
                "Cast", "fold_cast_chain", "may round or overflow");
}

Test(pass_chain, does_not_fold_int_float_int_that_would_wrap) {
    /* int8 -128 -> float -> uint8 saturates to 0; int8 -> uint8 wraps to 128 */
    expect_kept("input x int8[2, 3]\n"
                "a = Neg(x)\n"
                "b = Cast(a) {to=1}\n"
                "c = Cast(b) {to=2}\n"
                "output c\n",
                "Cast", "fold_cast_chain", "saturates");
}

Test(pass_chain, ort_triple_cast_keeps_two_casts) {
    kf_model *m;
    if (kf_model_load(ORT_TRANSFORM "triple-cast.onnx", &m) != KF_OK)
        cr_skip_test("cannot load triple-cast.onnx: %s", kf_last_error());
    cr_assert_eq(gt_count(m, "Cast"), 4);
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_chain_rules);
    cr_expect_eq(gt_count(m, "Cast"), 2);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}
