/*
 * test_pass_noop.c: the no-op removal rules (fusion/pass_noop.c). Each rule
 * has a positive test (op counts after, outputs bitwise equal to the
 * original on random inputs) and a does_not_* test checking the near-miss
 * reason; ONNX Runtime's transform models check the expected reductions.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define ORT_TRANSFORM KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/test/testdata/transform/"


/* Parses text, removes no-ops, expects `op` to be gone and outputs to stay
 * bitwise equal. */
static void expect_removed(const char *text, const char *op, const char *rule) {
    kf_model *m = gt_parse(text);
    kf_model *orig = gt_copy(m);
    cr_assert_geq(gt_count(m, op), 1);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    cr_expect_eq(gt_count(m, op), 0, "%s left behind (%s: %s)", op, rule, gt_reasons(&rs, rule));
    cr_expect_eq(gt_hits(&rs, rule), 1, "rule %s", rule);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

/* Parses text, runs the rules, expects `op` to stay with reason `why`. */
static void expect_kept(const char *text, const char *op, const char *rule, const char *why) {
    kf_model *m = gt_parse(text);
    uint32_t before = gt_count(m, op);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    cr_expect_eq(gt_count(m, op), before, "%s was removed", op);
    cr_expect(strstr(gt_reasons(&rs, rule), why), "rule %s: reason '%s', want '%s'", rule, gt_reasons(&rs, rule), why);
    kf_rules_free(&rs);
    kf_model_free(m);
}

Test(pass_noop, identity) {
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Identity(a)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Identity", "remove_identity");
}

Test(pass_noop, identity_before_a_graph_output_keeps_the_name) {
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "a = Relu(x)\n"
                           "y = Identity(a)\n"
                           "output y\n");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    cr_expect_eq(gt_count(m, "Identity"), 0);
    cr_expect_str_eq(m->graph->values[m->graph->outputs[0]].name, "y");
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_noop, does_not_remove_identity_between_graph_input_and_output) {
    expect_kept("input x float[2, 3]\n"
                "y = Identity(x)\n"
                "output y\n",
                "Identity", "remove_identity", "would rename one of them");
}

Test(pass_noop, dropout_at_inference) {
    expect_removed("opset 13\n"
                   "input x float[2, 3]\n"
                   "const r float[] = 0.3\n"
                   "a = Relu(x)\n"
                   "b, mask = Dropout(a, r)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Dropout", "remove_inference_dropout");
}

Test(pass_noop, does_not_remove_dropout_whose_mask_is_used) {
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "b, mask = Dropout(a)\n"
                "y = Neg(b)\n"
                "output y, mask\n",
                "Dropout", "remove_inference_dropout", "the mask output is used");
}

Test(pass_noop, does_not_remove_training_dropout) {
    expect_kept("opset 13\n"
                "input x float[2, 3]\n"
                "const r float[] = 0.3\n"
                "const t bool[] = 1\n"
                "a = Relu(x)\n"
                "b = Dropout(a, r, t)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Dropout", "remove_inference_dropout", "training mode");
}

Test(pass_noop, cast_to_same_type) {
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Cast(a) {to=1}\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Cast", "remove_cast_to_same_type");
    expect_removed("input x float[2, 3]\n"
                   "input z float[4]\n"
                   "a = Relu(x)\n"
                   "b = CastLike(a, z)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "CastLike", "remove_castlike_to_same_type");
}

Test(pass_noop, does_not_remove_cast_to_another_type) {
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "b = Cast(a) {to=11}\n"
                "y = Neg(b)\n"
                "output y\n",
                "Cast", "remove_cast_to_same_type", "the target dtype differs");
}

Test(pass_noop, reshape_to_same_shape) {
    expect_removed("input x float[2, 3]\n"
                   "const s int64[2] = 2 -1\n"
                   "a = Relu(x)\n"
                   "b = Reshape(a, s)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Reshape", "remove_reshape_to_same_shape");
}

Test(pass_noop, reshape_keeping_a_symbolic_dim) {
    expect_removed("input x float[N, 3]\n"
                   "const s int64[2] = 0 3\n"
                   "a = Relu(x)\n"
                   "b = Reshape(a, s)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Reshape", "remove_reshape_to_same_shape");
}

Test(pass_noop, does_not_remove_reshape_to_another_shape) {
    expect_kept("input x float[2, 3]\n"
                "const s int64[2] = 3 2\n"
                "a = Relu(x)\n"
                "b = Reshape(a, s)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Reshape", "remove_reshape_to_same_shape", "output shape differs");
}

Test(pass_noop, does_not_remove_reshape_by_an_overridable_shape) {
    expect_kept("input x float[2, 3]\n"
                "const s int64[2] = 2 3\n"
                "input s int64[2]\n"
                "a = Relu(x)\n"
                "b = Reshape(a, s)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Reshape", "remove_reshape_to_same_shape", "is a graph input");
}

Test(pass_noop, squeeze_unsqueeze_flatten_expand_tile_split_without_effect) {
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Squeeze(a)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Squeeze", "remove_noop_squeeze");
    expect_removed("input x float[2, 3]\n"
                   "const ax int64[0] =\n"
                   "a = Relu(x)\n"
                   "b = Unsqueeze(a, ax)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Unsqueeze", "remove_noop_unsqueeze");
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Flatten(a) {axis=1}\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Flatten", "remove_noop_flatten");
    expect_removed("input x float[2, 3]\n"
                   "const s int64[2] = 1 3\n"
                   "a = Relu(x)\n"
                   "b = Expand(a, s)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Expand", "remove_noop_expand");
    expect_removed("input x float[2, 3]\n"
                   "const r int64[2] = 1 1\n"
                   "a = Relu(x)\n"
                   "b = Tile(a, r)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Tile", "remove_noop_tile");
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Split(a) {axis=1}\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Split", "remove_single_output_split");
}

Test(pass_noop, does_not_remove_squeeze_or_expand_that_change_the_shape) {
    expect_kept("input x float[2, 1, 3]\n"
                "a = Relu(x)\n"
                "b = Squeeze(a)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Squeeze", "remove_noop_squeeze", "output shape differs");
    expect_kept("input x float[2, 3]\n"
                "const s int64[3] = 4 1 1\n"
                "a = Relu(x)\n"
                "b = Expand(a, s)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Expand", "remove_noop_expand", "output shape differs");
}

Test(pass_noop, single_input_concat) {
    expect_removed("input x float[2, 3]\n"
                   "a = Relu(x)\n"
                   "b = Concat(a) {axis=1}\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Concat", "remove_single_input_concat");
}

Test(pass_noop, does_not_remove_concat_of_two) {
    expect_kept("input x float[2, 3]\n"
                "a = Relu(x)\n"
                "b = Concat(a, a) {axis=1}\n"
                "y = Neg(b)\n"
                "output y\n",
                "Concat", "remove_single_input_concat", "more than one input");
}

Test(pass_noop, identity_transpose) {
    expect_removed("input x float[2, 3, 4]\n"
                   "a = Relu(x)\n"
                   "b = Transpose(a) {perm=[0, 1, 2]}\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Transpose", "remove_identity_transpose");
}

Test(pass_noop, does_not_remove_transpose_of_a_square_matrix) {
    expect_kept("input x float[3, 3]\n"
                "a = Relu(x)\n"
                "b = Transpose(a) {perm=[1, 0]}\n"
                "y = Neg(b)\n"
                "output y\n",
                "Transpose", "remove_identity_transpose", "perm is not the identity");
}

Test(pass_noop, zero_pad) {
    expect_removed("input x float[2, 3]\n"
                   "const p int64[4] = 0 0 0 0\n"
                   "a = Relu(x)\n"
                   "b = Pad(a, p)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Pad", "remove_zero_pad");
}

Test(pass_noop, does_not_remove_pad_that_shifts) {
    /* same shape, but the data moves by one column */
    expect_kept("input x float[2, 3]\n"
                "const p int64[4] = 0 1 0 -1\n"
                "a = Relu(x)\n"
                "b = Pad(a, p)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Pad", "remove_zero_pad", "pads are not all zero");
}

Test(pass_noop, full_slice) {
    expect_removed("input x float[2, 3]\n"
                   "const s int64[2] = 0 -5\n"
                   "const e int64[2] = 9223372036854775807 3\n"
                   "const ax int64[2] = 0 -1\n"
                   "a = Relu(x)\n"
                   "b = Slice(a, s, e, ax)\n"
                   "y = Neg(b)\n"
                   "output y\n",
                   "Slice", "remove_full_slice");
}

Test(pass_noop, does_not_remove_slices_that_drop_or_reverse) {
    expect_kept("input x float[2, 3]\n"
                "const s int64[1] = 1\n"
                "const e int64[1] = 3\n"
                "const ax int64[1] = 1\n"
                "a = Relu(x)\n"
                "b = Slice(a, s, e, ax)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Slice", "remove_full_slice", "a start is not 0");
    expect_kept("input x float[2, 3]\n"
                "const s int64[1] = 0\n"
                "const e int64[1] = 3\n"
                "const ax int64[1] = 1\n"
                "const st int64[1] = -1\n"
                "a = Relu(x)\n"
                "b = Slice(a, s, e, ax, st)\n"
                "y = Neg(b)\n"
                "output y\n",
                "Slice", "remove_full_slice", "a step is not positive");
}

/* ---- ONNX Runtime's transform models ----------------------------------------------- */

static kf_model *load_ort(const char *name) {
    kf_model *m;
    if (kf_model_load(name, &m) != KF_OK) cr_skip_test("cannot load %s: %s", name, kf_last_error());
    return m;
}

Test(pass_noop, ort_abs_id_max_loses_its_identity) {
    kf_model *m = load_ort(ORT_TRANSFORM "abs-id-max.onnx");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    cr_expect_eq(gt_count(m, "Identity"), 0);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 2);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_noop, ort_dropout_keeps_used_masks_and_output_names) {
    kf_model *m = load_ort(ORT_TRANSFORM "dropout.onnx");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    /* two Dropouts have a used mask (one feeds Identity, one is a graph
     * output); two Identities copy the graph input X to a graph output */
    cr_expect_eq(gt_count(m, "Dropout"), 2);
    cr_expect_eq(gt_count(m, "Identity"), 2);
    const char *names[] = {"O1", "O2", "O3", "O4", "O5", "M3"};
    cr_assert_eq(m->graph->noutputs, 6);
    for (int i = 0; i < 6; i++) cr_expect_str_eq(m->graph->values[m->graph->outputs[i]].name, names[i]);
    cr_expect(strstr(gt_reasons(&rs, "remove_identity"), "would rename"));
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_noop, ort_slice_v11_elim_removes_the_slices_that_select_everything) {
    kf_model *m = load_ort(ORT_TRANSFORM "slice-v11-elim.onnx");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_noop_rules);
    /* kept: a start of -1, and ends fed by the overridable graph input endsG
     * (ORT also keeps the step-3 Slice, which here runs over a dim of 1 and
     * so keeps everything) */
    cr_expect_eq(gt_count(m, "Slice"), 2);
    cr_expect_eq(gt_hits(&rs, "remove_full_slice"), 4);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_noop, gather_of_every_index_in_order_becomes_a_reshape) {
    /* the as_strided form of today's PyTorch exporter: [768] gathered by
     * 0..767 laid out as [1, 768, 1, 1] */
    expect_removed("input x float[6, 1, 1]\n"
                   "const i int64[1, 6, 1] = 0 1 2 3 4 5\n"
                   "a = Relu(x)\n"
                   "g = Gather(a, i) {axis=0}\n"
                   "y = Neg(g)\n"
                   "output y\n",
                   "Gather", "gather_arange_to_reshape");
    expect_removed("input x float[2, 4, 3]\n"
                   "const i int32[4] = 0 1 2 3\n"
                   "g = Gather(x, i) {axis=-2}\n"
                   "y = Neg(g)\n"
                   "output y\n",
                   "Gather", "gather_arange_to_reshape");
}

Test(pass_noop, does_not_turn_other_gathers_into_reshapes) {
    expect_kept("input x float[4, 3]\n"
                "const i int64[4] = 0 2 1 3\n"
                "y = Gather(x, i) {axis=0}\n"
                "output y\n",
                "Gather", "gather_arange_to_reshape", "not 0, 1, 2, ... in order");
    expect_kept("input x float[4, 3]\n"
                "const i int64[3] = 0 1 2\n"
                "y = Gather(x, i) {axis=0}\n"
                "output y\n",
                "Gather", "gather_arange_to_reshape", "do not cover the axis once");
    expect_kept("input x float[4, 3]\n"
                "input i int64[4]\n"
                "y = Gather(x, i) {axis=0}\n"
                "output y\n",
                "Gather", "gather_arange_to_reshape", "not a constant");
}
