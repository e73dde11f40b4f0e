/*
 * test_pass_gemm.c: MatMul + Add -> Gemm and Add folded into a Gemm's C
 * (fusion/pass_gemm.c). Each rule has positive tests (op counts after,
 * outputs equal to the original on random inputs within fp32 tolerance) and
 * does_not_* tests checking the reason; ONNX Runtime's matmul_add_fusion
 * models check the expected result.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define ORT_MATMUL_ADD KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/test/testdata/transform/matmul_add_fusion/"
#define ATOL 1e-5
#define RTOL 1e-4

/* Parses text, runs the rules, expects one Gemm and nothing else, outputs
 * equal to the original's. */
static void expect_one_gemm(const char *text, const char *rule) {
    kf_model *m = gt_parse(text);
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    cr_expect_eq(gt_count(m, "Gemm"), 1, "%s: %s", rule, gt_reasons(&rs, rule));
    cr_expect_eq(kf_graph_live_nodes(m->graph), 1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

/* Parses text, runs the rules, expects nothing to change and rule's
 * reason to contain why. */
static void expect_declined(const char *text, const char *rule, const char *why) {
    kf_model *m = gt_parse(text);
    uint32_t before = kf_graph_live_nodes(m->graph);
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    cr_expect_eq(kf_graph_live_nodes(m->graph), before, "the graph changed");
    cr_expect_eq(gt_count(m, "Gemm"), strstr(text, "Gemm(") ? 1 : 0);
    cr_expect(strstr(gt_reasons(&rs, rule), why), "%s: reason '%s', expected '%s'", rule, gt_reasons(&rs, rule), why);
    kf_rules_free(&rs);
    kf_model_free(m);
}

Test(pass_gemm, fuses_matmul_add_with_a_constant_row_bias) {
    expect_one_gemm("input a float[3, 4]\n"
                    "input b float[4, 5]\n"
                    "const c float[5] = random\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(c, p)\n"
                    "output y\n",
                    "fuse_matmul_add_into_gemm");
}

Test(pass_gemm, fuses_matmul_add_with_a_full_bias_from_an_input) {
    expect_one_gemm("opset 9\n"
                    "input a float[3, 4]\n"
                    "const b float[4, 5] = random\n"
                    "input c float[3, 1]\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(p, c)\n"
                    "output y\n",
                    "fuse_matmul_add_into_gemm");
}

Test(pass_gemm, folds_add_into_a_gemm_without_c) {
    expect_one_gemm("input a float[5, 3]\n"
                    "const b float[4, 5] = random\n"
                    "input x float[1, 4]\n"
                    "p = Gemm(a, b) {transA=1, transB=1, alpha=0.7, beta=0.3}\n"
                    "y = Add(p, x)\n"
                    "output y\n",
                    "fold_add_into_gemm_bias");
}

Test(pass_gemm, folds_a_constant_add_into_a_constant_c) {
    kf_model *m = gt_parse("input a float[3, 5]\n"
                           "const b float[5, 4] = random\n"
                           "const c float[4] = random\n"
                           "const x float[3, 1] = random\n"
                           "p = Gemm(a, b, c) {beta=0.5}\n"
                           "y = Add(x, p)\n"
                           "output y\n");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    cr_assert_eq(gt_count(m, "Add"), 0, "%s", gt_reasons(&rs, "fold_add_into_gemm_bias"));
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[g->values[g->outputs[0]].producer];
    cr_expect_str_eq(n->op_type, "Gemm");
    const kf_tensor *c = g->values[n->in[2]].init;
    cr_assert(c, "C is a constant");
    cr_expect(c->rank == 2 && c->dims[0] == 3 && c->dims[1] == 4, "C takes the broadcast shape");
    cr_expect_eq(kf_attr_f(n, "beta", 1.0f), 1.0f);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_gemm, graph_output_keeps_its_name) {
    kf_model *m = gt_parse("input a float[2, 3]\n"
                           "const b float[3, 2] = random\n"
                           "const c float[2] = random\n"
                           "p = MatMul(a, b)\n"
                           "y = Add(p, c)\n"
                           "output y\n");
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    const kf_graph *g = m->graph;
    cr_expect_str_eq(g->values[g->outputs[0]].name, "y");
    cr_expect_str_eq(g->nodes[g->values[g->outputs[0]].producer].op_type, "Gemm");
    kf_rules_free(&rs);
    kf_model_free(m);
}

Test(pass_gemm, does_not_fuse_a_rank3_matmul) {
    expect_declined("input a float[2, 3, 4]\n"
                    "const b float[4, 5] = random\n"
                    "const c float[5] = random\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(p, c)\n"
                    "output y\n",
                    "fuse_matmul_add_into_gemm", "A is not 2-D");
}

Test(pass_gemm, does_not_fuse_when_the_add_broadcasts_the_product_up) {
    expect_declined("input a float[1, 4]\n"
                    "const b float[4, 5] = random\n"
                    "input c float[3, 5]\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(p, c)\n"
                    "output y\n",
                    "fuse_matmul_add_into_gemm", "larger shape");
}

Test(pass_gemm, does_not_fuse_when_the_product_has_other_consumers) {
    expect_declined("input a float[2, 4]\n"
                    "const b float[4, 5] = random\n"
                    "const c float[5] = random\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(p, c)\n"
                    "r = Relu(p)\n"
                    "output y, r\n",
                    "fuse_matmul_add_into_gemm", "other consumers");
}

Test(pass_gemm, does_not_fuse_integer_products) {
    expect_declined("input a int32[2, 4]\n"
                    "input b int32[4, 5]\n"
                    "input c int32[5]\n"
                    "p = MatMul(a, b)\n"
                    "y = Add(p, c)\n"
                    "output y\n",
                    "fuse_matmul_add_into_gemm", "dtype");
}

Test(pass_gemm, does_not_fold_into_a_c_computed_at_run_time) {
    expect_declined("input a float[3, 5]\n"
                    "const b float[5, 4] = random\n"
                    "input c float[4]\n"
                    "const x float[4] = random\n"
                    "p = Gemm(a, b, c)\n"
                    "y = Add(p, x)\n"
                    "output y\n",
                    "fold_add_into_gemm_bias", "C that is not a constant");
}

/* Loads an ONNX Runtime model; skips (a known import limitation) when
 * kfuse rejects the file. */
static kf_model *load_ort(const char *path) {
    kf_model *m;
    if (kf_model_load(path, &m) != KF_OK) cr_skip_test("import rejects %s: %s", path, kf_last_error());
    return m;
}

Test(pass_gemm, ort_matmul_add_2input_becomes_one_gemm) {
    kf_model *m = load_ort(ORT_MATMUL_ADD "2Input/model.onnx");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 1);
    cr_expect_eq(gt_count(m, "Gemm"), 1, "%s", gt_reasons(&rs, "fuse_matmul_add_into_gemm"));
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

/* A is 1-D there: numpy matmul, not a Gemm */
Test(pass_gemm, ort_matmul_add_3input_neg_model_stays) {
    kf_model *m = load_ort(ORT_MATMUL_ADD "3Input/neg_model.onnx");
    kf_ruleset rs = gt_run_rules(m, kf_pass_gemm_rules);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 2);
    cr_expect_eq(gt_count(m, "Gemm"), 0);
    cr_expect(strstr(gt_reasons(&rs, "fuse_matmul_add_into_gemm"), "A is not 2-D"), "%s",
              gt_reasons(&rs, "fuse_matmul_add_into_gemm"));
    kf_rules_free(&rs);
    kf_model_free(m);
}
