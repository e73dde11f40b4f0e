/*
 * test_pass_bn.c: per-channel epilogues folded into weights
 * (fusion/pass_bn.c): BatchNormalization into Conv, ConvTranspose, Gemm and
 * MatMul, channel Mul into weights, bias Add into convs. Each rule has a
 * positive test (op counts after, outputs equal to the original on random
 * inputs within fp32 tolerance) and does_not_* tests checking the reason;
 * ONNX Runtime's transform models check the expected reductions.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define ORT_FUSION KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/test/testdata/transform/fusion/"
#define ATOL 1e-5
#define RTOL 1e-4


/* Makes the random constant `name` positive (a variance): |v| + 0.1. */
static void make_positive(kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].init, "no constant %s", name);
    kf_tensor *t = m->graph->values[v].init;
    for (int64_t i = 0; i < t->numel; i++) kf_set_f64(t, i, fabs(kf_get_f64(t, i)) + 0.1);
}

/* The live node of op_type (the only one expected). */
static const kf_node *only(const kf_model *m, const char *op_type) {
    cr_assert_eq(gt_count(m, op_type), 1, "expected one %s", op_type);
    for (kf_id i = 1; i < m->graph->nnodes; i++)
        if (!m->graph->nodes[i].dead && !strcmp(m->graph->nodes[i].op_type, op_type)) return &m->graph->nodes[i];
    return NULL;
}

/* Parses text (var made positive), folds, checks that `gone` ops vanished,
 * `kept` stays once, rule hit, outputs equal. */
static void expect_folded(const char *text, const char *rule, const char *kept, const char *const *gone, int ngone) {
    kf_model *m = gt_parse(text);
    if (kf_graph_find(m->graph, "var")) make_positive(m, "var");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_geq(gt_hits(&rs, rule), 1, "rule %s did not fire: %s", rule, gt_reasons(&rs, rule));
    for (int i = 0; i < ngone; i++) cr_expect_eq(gt_count(m, gone[i]), 0, "%s left behind", gone[i]);
    cr_expect_eq(gt_count(m, kept), 1, "%s count", kept);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

/* Parses text (var made positive), runs the rules, expects rule not to
 * fire (a BatchNormalization left alone may still become elementwise ops),
 * its reason to contain why, and the outputs to stay. */
static void expect_declined(const char *text, const char *rule, const char *why) {
    kf_model *m = gt_parse(text);
    if (kf_graph_find(m->graph, "var")) make_positive(m, "var");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_eq(gt_hits(&rs, rule), 0, "%s fired", rule);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    cr_expect(strstr(gt_reasons(&rs, rule), why), "%s: reason '%s', expected '%s'", rule, gt_reasons(&rs, rule), why);
    kf_rules_free(&rs);
    kf_model_free(m);
}

static const char *const BN[] = {"BatchNormalization"};

Test(pass_bn, folds_batchnorm_into_conv_without_bias) {
    expect_folded("input x float[2, 3, 6, 6]\n"
                  "const w float[4, 3, 3, 3] = random\n"
                  "const scale float[4] = random\n"
                  "const bias float[4] = random\n"
                  "const mean float[4] = random\n"
                  "const var float[4] = random\n"
                  "c = Conv(x, w) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
                  "y = BatchNormalization(c, scale, bias, mean, var) {epsilon=0.001}\n"
                  "output y\n",
                  "fold_batchnorm_into_conv", "Conv", BN, 1);
}

Test(pass_bn, folds_batchnorm_into_grouped_conv_with_bias) {
    kf_model *m = gt_parse("opset 11\n"
                           "input x float[1, 4, 5, 5]\n"
                           "const w float[6, 2, 3, 3] = random\n"
                           "const b float[6] = random\n"
                           "const scale float[6] = random\n"
                           "const bias float[6] = random\n"
                           "const mean float[6] = random\n"
                           "const var float[6] = random\n"
                           "c = Conv(x, w, b) {group=2}\n"
                           "y = BatchNormalization(c, scale, bias, mean, var)\n"
                           "output y\n");
    make_positive(m, "var");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_assert_eq(gt_count(m, "BatchNormalization"), 0, "%s", gt_reasons(&rs, "fold_batchnorm_into_conv"));
    const kf_node *c = only(m, "Conv");
    cr_expect_eq(c->nin, 3);
    cr_expect_neq(c->in[1], kf_graph_find(m->graph, "w"), "the weight is a new initializer");
    cr_expect_eq(kf_attr_i(c, "group", 1), 2, "attributes are kept");
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_bn, folds_batchnorm_into_grouped_conv_transpose) {
    expect_folded("input x float[1, 4, 3, 3]\n"
                  "const w float[4, 3, 2, 2] = random\n" /* group 2: 6 output channels */
                  "const scale float[6] = random\n"
                  "const bias float[6] = random\n"
                  "const mean float[6] = random\n"
                  "const var float[6] = random\n"
                  "c = ConvTranspose(x, w) {group=2, strides=[2, 2]}\n"
                  "y = BatchNormalization(c, scale, bias, mean, var)\n"
                  "output y\n",
                  "fold_batchnorm_into_conv_transpose", "ConvTranspose", BN, 1);
}

Test(pass_bn, folds_batchnorm_into_gemm) {
    expect_folded("input a float[3, 5]\n"
                  "const w float[4, 5] = random\n"
                  "const c float[4] = random\n"
                  "const scale float[4] = random\n"
                  "const bias float[4] = random\n"
                  "const mean float[4] = random\n"
                  "const var float[4] = random\n"
                  "g = Gemm(a, w, c) {transB=1, alpha=1.5, beta=0.5}\n"
                  "y = BatchNormalization(g, scale, bias, mean, var)\n"
                  "output y\n",
                  "fold_batchnorm_into_gemm", "Gemm", BN, 1);
}

Test(pass_bn, folds_batchnorm_into_matmul_as_matmul_and_add) {
    static const char *const gone[] = {"BatchNormalization", "Mul", "Sub"};
    expect_folded("input a float[3, 5]\n"
                  "const w float[5, 4] = random\n"
                  "const scale float[4] = random\n"
                  "const bias float[4] = random\n"
                  "const mean float[4] = random\n"
                  "const var float[4] = random\n"
                  "g = MatMul(a, w)\n"
                  "y = BatchNormalization(g, scale, bias, mean, var)\n"
                  "output y\n",
                  "fold_batchnorm_into_matmul", "Add", gone, 3);
}

/* ONNX Runtime's fuse-conv-bn-mul-add-unsqueeze, written out */
Test(pass_bn, folds_conv_batchnorm_mul_add_through_unsqueeze) {
    static const char *const gone[] = {"BatchNormalization", "Mul", "Add", "Unsqueeze"};
    expect_folded("opset 7\n"
                  "input x float[1, 3, 8, 8]\n"
                  "const mean_img float[1, 3, 8, 8] = random\n"
                  "const w float[5, 3, 3, 3] = random\n"
                  "const b float[5] = random\n"
                  "const scale float[5] = random\n"
                  "const bias float[5] = random\n"
                  "const mean float[5] = random\n"
                  "const var float[5] = random\n"
                  "const sw float[5] = random\n"
                  "const sb float[5] = random\n"
                  "s = Sub(mean_img, x)\n"
                  "c = Conv(s, w, b) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
                  "n = BatchNormalization(c, scale, bias, mean, var) {epsilon=0.00001}\n"
                  "uw = Unsqueeze(sw) {axes=[1, 2]}\n"
                  "ml = Mul(n, uw)\n"
                  "ub = Unsqueeze(sb) {axes=[1, 2]}\n"
                  "ad = Add(ml, ub)\n"
                  "y = Flatten(ad) {axis=0}\n"
                  "output y\n",
                  "fold_channel_mul_into_weights", "Conv", gone, 4);
}

Test(pass_bn, folds_bias_add_into_conv) {
    static const char *const gone[] = {"Add"};
    expect_folded("input x float[2, 3, 5, 5]\n"
                  "const w float[4, 3, 3, 3] = random\n"
                  "const b float[4, 1, 1] = random\n"
                  "c = Conv(x, w)\n"
                  "y = Add(b, c)\n" /* either operand order */
                  "output y\n",
                  "fold_bias_add_into_conv", "Conv", gone, 1);
}

Test(pass_bn, folds_channel_mul_into_matmul_columns) {
    static const char *const gone[] = {"Mul"};
    expect_folded("input x float[2, 3, 5]\n"
                  "const w float[5, 4] = random\n"
                  "const k float[1, 4] = random\n"
                  "c = MatMul(x, w)\n"
                  "y = Mul(c, k)\n"
                  "output y\n",
                  "fold_channel_mul_into_weights", "MatMul", gone, 1);
}

Test(pass_bn, keeps_a_shared_weight_for_its_other_reader) {
    kf_model *m = gt_parse("input x float[1, 3, 5, 5]\n"
                           "input z float[1, 3, 5, 5]\n"
                           "const w float[4, 3, 3, 3] = random\n"
                           "const scale float[4] = random\n"
                           "const bias float[4] = random\n"
                           "const mean float[4] = random\n"
                           "const var float[4] = random\n"
                           "c = Conv(x, w)\n"
                           "y = BatchNormalization(c, scale, bias, mean, var)\n"
                           "d = Conv(z, w)\n"
                           "output y, d\n");
    make_positive(m, "var");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_eq(gt_count(m, "BatchNormalization"), 0);
    cr_expect_eq(gt_count(m, "Conv"), 2);
    const kf_graph *g = m->graph;
    kf_id w = kf_graph_find(g, "w");
    cr_expect_eq(g->nodes[g->values[g->outputs[1]].producer].in[1], w, "the other conv still reads w");
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_bn, does_not_fold_batchnorm_in_training_mode) {
    expect_declined("opset 15\n"
                    "input x float[2, 3, 4, 4]\n"
                    "const w float[4, 3, 3, 3] = random\n"
                    "const scale float[4] = random\n"
                    "const bias float[4] = random\n"
                    "const mean float[4] = random\n"
                    "const var float[4] = random\n"
                    "c = Conv(x, w)\n"
                    "y = BatchNormalization(c, scale, bias, mean, var) {training_mode=1}\n"
                    "output y\n",
                    "fold_batchnorm_into_conv", "training mode");
}

Test(pass_bn, does_not_fold_batchnorm_when_the_conv_output_has_other_consumers) {
    expect_declined("input x float[2, 3, 4, 4]\n"
                    "const w float[4, 3, 3, 3] = random\n"
                    "const scale float[4] = random\n"
                    "const bias float[4] = random\n"
                    "const mean float[4] = random\n"
                    "const var float[4] = random\n"
                    "c = Conv(x, w)\n"
                    "y = BatchNormalization(c, scale, bias, mean, var)\n"
                    "r = Relu(c)\n"
                    "output y, r\n",
                    "fold_batchnorm_into_conv", "other consumers");
}

Test(pass_bn, does_not_fold_batchnorm_with_parameters_computed_at_run_time) {
    expect_declined("input x float[2, 3, 4, 4]\n"
                    "input scale float[4]\n"
                    "const w float[4, 3, 3, 3] = random\n"
                    "const bias float[4] = random\n"
                    "const mean float[4] = random\n"
                    "const var float[4] = random\n"
                    "c = Conv(x, w)\n"
                    "y = BatchNormalization(c, scale, bias, mean, var)\n"
                    "output y\n",
                    "fold_batchnorm_into_conv", "scale is not a constant");
}

Test(pass_bn, does_not_fold_batchnorm_after_a_rank3_matmul) {
    expect_declined("input a float[2, 4, 5]\n"
                    "const w float[5, 3] = random\n"
                    "const scale float[4] = random\n"
                    "const bias float[4] = random\n"
                    "const mean float[4] = random\n"
                    "const var float[4] = random\n"
                    "g = MatMul(a, w)\n"
                    "y = BatchNormalization(g, scale, bias, mean, var)\n"
                    "output y\n",
                    "fold_batchnorm_into_matmul", "normalises axis 1");
}

Test(pass_bn, does_not_fold_an_add_that_is_not_per_channel) {
    expect_declined("input x float[2, 3, 6, 6]\n"
                    "const w float[4, 3, 3, 3] = random\n"
                    "const b float[4] = random\n" /* aligns with the width, not the channels */
                    "c = Conv(x, w)\n"
                    "y = Add(c, b)\n"
                    "output y\n",
                    "fold_bias_add_into_conv", "does not broadcast per output channel");
}

/* ONNX Runtime's negative-fuse-conv-add-no-bias: from IR version 4 an
 * initializer that is also a graph input may be replaced by the caller, so
 * it is not a constant; before IR 4 every initializer was listed as an
 * input and stays constant. */
static const char *overridable = "input x float[1, 3, 5, 5]\n"
                                 "const w float[4, 3, 3, 3] = random\n"
                                 "const b float[4] = random\n"
                                 "c = Conv(x, w)\n"
                                 "u = Unsqueeze(b) {axes=[1, 2]}\n"
                                 "y = Add(c, u)\n"
                                 "output y\n";

Test(pass_bn, does_not_fold_a_bias_the_caller_may_override) {
    for (int ir = 3; ir <= 4; ir++) {
        kf_model *m = gt_parse(overridable);
        m->ir_version = ir;
        m->opsets[0].version = 7;
        for (kf_id v = 1; v < m->graph->nvalues; v++)
            if (m->graph->values[v].init) cr_assert_eq(kf_graph_mark_input(m->graph, v), KF_OK);
        for (kf_id i = 1; i < m->graph->nnodes; i++) m->graph->nodes[i].opset = 7;
        kf_model *orig = gt_copy(m);
        kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
        if (ir == 4) {
            cr_expect_eq(gt_count(m, "Add"), 1);
            cr_expect(strstr(gt_reasons(&rs, "fold_bias_add_into_conv"), "may override"), "%s",
                      gt_reasons(&rs, "fold_bias_add_into_conv"));
        } else {
            cr_expect_eq(gt_count(m, "Add"), 0, "IR 3: initializers listed as inputs are constants: %s",
                         gt_reasons(&rs, "fold_bias_add_into_conv"));
            gt_expect_same_outputs(orig, m, ATOL, RTOL);
        }
        kf_rules_free(&rs);
        kf_model_free(m);
        kf_model_free(orig);
    }
}

/* Loads an ONNX Runtime model; skips (a known import limitation) when
 * kfuse rejects the file. */
static kf_model *load_ort(const char *path) {
    kf_model *m;
    if (kf_model_load(path, &m) != KF_OK) cr_skip_test("import rejects %s: %s", path, kf_last_error());
    return m;
}

static void expect_ort(const char *file, uint32_t nodes_after, uint32_t convs, int conv_inputs) {
    kf_model *m = load_ort(file);
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_eq(kf_graph_live_nodes(m->graph), nodes_after, "nodes after");
    cr_expect_eq(gt_count(m, "Conv"), convs);
    if (conv_inputs) cr_expect_eq(only(m, "Conv")->nin, conv_inputs);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_bn, ort_fuse_conv_bn_no_bias) { expect_ort(ORT_FUSION "fuse-conv-bn-no-bias.onnx", 2, 1, 3); }

/* Sub, Conv, Flatten remain: Conv, BN, Mul, Add -> 1 Conv */
Test(pass_bn, ort_fuse_conv_bn_mul_add_unsqueeze) {
    expect_ort(ORT_FUSION "fuse-conv-bn-mul-add-unsqueeze.onnx", 3, 1, 3);
}

Test(pass_bn, ort_negative_fuse_conv_add_no_bias_stays) {
    expect_ort(ORT_FUSION "negative-fuse-conv-add-no-bias.onnx", 4, 1, 0);
}

/* ---- BatchNormalization no anchor absorbs: x * s[c] + t[c] ----------------------- */

/* 4-D after an input, 2-D [N, C], 3-D after a conv whose output has other
 * consumers */
Test(pass_bn, rewrites_batchnorm_alone_as_mul_add) {
    static const char *const texts[] = {
        "opset 15\ninput x float[2, 3, 4, 5]\nconst scale float[3] = random\nconst bias float[3] = random\n"
        "const mean float[3] = random\nconst var float[3] = random\n"
        "y = BatchNormalization(x, scale, bias, mean, var) {epsilon=0.001}\noutput y\n",
        "opset 9\ninput x float[6, 4]\nconst scale float[4] = random\nconst bias float[4] = random\n"
        "const mean float[4] = random\nconst var float[4] = random\n"
        "y = BatchNormalization(x, scale, bias, mean, var)\nr = Relu(y)\noutput r\n",
        "input x float[2, 3, 9]\nconst w float[4, 3, 3] = random\nconst scale float[4] = random\n"
        "const bias float[4] = random\nconst mean float[4] = random\nconst var float[4] = random\n"
        "c = Conv(x, w)\ny = BatchNormalization(c, scale, bias, mean, var)\nr = Relu(c)\noutput y, r\n",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        kf_model *m = gt_parse(texts[i]);
        make_positive(m, "var");
        kf_model *orig = gt_copy(m);
        kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
        cr_expect_eq(gt_hits(&rs, "batchnorm_to_mul_add"), 1, "graph %zu: %s", i, gt_reasons(&rs, "batchnorm_to_mul_add"));
        cr_expect_eq(gt_count(m, "BatchNormalization"), 0);
        cr_expect_eq(gt_count(m, "Mul"), 1);
        cr_expect_eq(gt_count(m, "Add"), 1);
        gt_expect_same_outputs(orig, m, ATOL, RTOL);
        kf_rules_free(&rs);
        kf_model_free(m);
        kf_model_free(orig);
    }
}

/* a conv that can take it folds it; the rewrite leaves it to that rule */
Test(pass_bn, does_not_rewrite_batchnorm_that_folds_into_its_conv) {
    kf_model *m = gt_parse("input x float[2, 3, 4, 4]\nconst w float[4, 3, 3, 3] = random\n"
                           "const scale float[4] = random\nconst bias float[4] = random\n"
                           "const mean float[4] = random\nconst var float[4] = random\n"
                           "c = Conv(x, w)\ny = BatchNormalization(c, scale, bias, mean, var)\noutput y\n");
    make_positive(m, "var");
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_eq(gt_hits(&rs, "fold_batchnorm_into_conv"), 1);
    cr_expect_eq(gt_hits(&rs, "batchnorm_to_mul_add"), 0);
    cr_expect_eq(gt_count(m, "Mul"), 0);
    kf_rules_free(&rs);
    kf_model_free(m);
}

/* parameters that are graph inputs: (x - mean) * (scale / sqrt(var + eps)) + B
 * with each parameter reshaped to [C, 1, 1] */
Test(pass_bn, rewrites_batchnorm_with_parameters_computed_at_run_time_as_elementwise_ops) {
    kf_model *m = gt_parse("opset 15\ninput x float[2, 3, 4, 4]\ninput scale float[3]\ninput bias float[3]\n"
                           "input mean float[3]\ninput var float[3]\nconst one float[] = 1\nva = Abs(var)\nvp = Add(va, one)\n"
                           "y = BatchNormalization(x, scale, bias, mean, vp) {epsilon=0.01}\noutput y\n");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_bn_rules);
    cr_expect_eq(gt_hits(&rs, "batchnorm_to_mul_add"), 1, "%s", gt_reasons(&rs, "batchnorm_to_mul_add"));
    cr_expect_eq(gt_count(m, "BatchNormalization"), 0);
    cr_expect_eq(gt_count(m, "Sqrt"), 1);
    cr_expect_eq(gt_count(m, "Reshape"), 4);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_bn, does_not_rewrite_batchnorm_with_run_time_parameters_of_another_dtype) {
    expect_declined("opset 15\ninput x float[2, 3, 4, 4]\ninput scale double[3]\nconst bias float[3] = random\n"
                    "const mean float[3] = random\nconst var float[3] = random\n"
                    "y = BatchNormalization(x, scale, bias, mean, var)\noutput y\n",
                    "batchnorm_to_mul_add", "not 1-D of the input's dtype");
}

Test(pass_bn, does_not_rewrite_batchnorm_in_training_mode) {
    expect_declined("opset 15\ninput x float[2, 3, 4, 4]\nconst scale float[3] = random\nconst bias float[3] = random\n"
                    "const mean float[3] = random\nconst var float[3] = random\n"
                    "y = BatchNormalization(x, scale, bias, mean, var) {training_mode=1}\noutput y\n",
                    "batchnorm_to_mul_add", "training mode");
}
