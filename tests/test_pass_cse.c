/*
 * test_pass_cse.c: common-subexpression elimination (fusion/pass_cse.c):
 * equal nodes (commutative operands in either order) and equal
 * initializers merge, outputs stay equal; different attributes, operand
 * orders of non-commutative ops, -0 vs 0, two graph outputs, unknown ops
 * and Dropout stay apart.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_opt.h"

static uint64_t run_cse(kf_model *m) {
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_pass_ctx ctx = {-1, false, 0, 0, false, NULL, 0};
    cr_assert_eq(kf_pass_cse(m, &ctx), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_dce(m->graph, NULL), KF_OK);
    return ctx.changes;
}

/* Runs CSE on text; expects `changes` merges, `left` nodes of `op`, equal outputs. */
static void expect_merged(const char *text, uint64_t changes, const char *op, uint32_t left) {
    kf_model *m = gt_parse(text);
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_cse(m), changes);
    cr_expect_eq(gt_count(m, op), left, "%s count", op);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

static void expect_apart(const char *text, const char *op) {
    kf_model *m = gt_parse(text);
    uint32_t before = gt_count(m, op);
    cr_expect_eq(run_cse(m), 0);
    cr_expect_eq(gt_count(m, op), before);
    kf_model_free(m);
}

Test(pass_cse, equal_nodes_merge_down_a_chain) {
    expect_merged("input x float[2, 3]\n"
                  "a1 = Relu(x)\n"
                  "a2 = Relu(x)\n"
                  "b1 = LeakyRelu(a1) {alpha=0.2}\n"
                  "b2 = LeakyRelu(a2) {alpha=0.2}\n"
                  "y = Sub(b1, b2)\n"
                  "output y\n",
                  2, "LeakyRelu", 1);
}

Test(pass_cse, commutative_operands_in_either_order) {
    expect_merged("input x float[2, 3]\n"
                  "input z float[2, 3]\n"
                  "a = Mul(x, z)\n"
                  "b = Mul(z, x)\n"
                  "y = Sub(a, b)\n"
                  "output y\n",
                  1, "Mul", 1);
}

Test(pass_cse, attributes_in_any_order) {
    expect_merged("opset 11\n"
                  "input x float[2, 3, 4]\n"
                  "a = ReduceSum(x) {axes=[1], keepdims=0}\n"
                  "b = ReduceSum(x) {keepdims=0, axes=[1]}\n"
                  "y = Sub(a, b)\n"
                  "output y\n",
                  1, "ReduceSum", 1);
}

Test(pass_cse, equal_initializers_merge_then_their_readers) {
    expect_merged("input x float[2, 3]\n"
                  "const c1 float[3] = 1.5 -2 0.25\n"
                  "const c2 float[3] = 1.5 -2 0.25\n"
                  "a = Add(x, c1)\n"
                  "b = Add(x, c2)\n"
                  "y = Div(a, b)\n"
                  "output y\n",
                  2, "Add", 1);
}

Test(pass_cse, one_graph_output_keeps_its_name) {
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "a = Relu(x)\n"
                           "b = Relu(x)\n"
                           "y = Neg(a)\n"
                           "output y, b\n");
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_cse(m), 1);
    cr_expect_eq(gt_count(m, "Relu"), 1);
    cr_expect_str_eq(m->graph->values[m->graph->outputs[1]].name, "b");
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_cse, does_not_merge_different_attributes_or_operand_orders) {
    expect_apart("input x float[2, 3]\n"
                 "a = LeakyRelu(x) {alpha=0.2}\n"
                 "b = LeakyRelu(x) {alpha=0.3}\n"
                 "y = Sub(a, b)\n"
                 "output y\n",
                 "LeakyRelu");
    expect_apart("input x float[2, 3]\n"
                 "input z float[2, 3]\n"
                 "a = Sub(x, z)\n"
                 "b = Sub(z, x)\n"
                 "y = Add(a, b)\n"
                 "output y\n",
                 "Sub");
}

Test(pass_cse, does_not_merge_initializers_differing_in_a_bit) {
    /* -0 and 0 compare equal but are different bytes (1/x tells them apart) */
    expect_apart("input x float[2, 3]\n"
                 "const c1 float[3] = 0\n"
                 "const c2 float[3] = -0.0\n"
                 "a = Add(x, c1)\n"
                 "b = Add(x, c2)\n"
                 "y = Div(a, b)\n"
                 "output y\n",
                 "Add");
}

Test(pass_cse, does_not_merge_two_graph_outputs) {
    /* each output needs its own name, so both nodes stay */
    expect_apart("input x float[2, 3]\n"
                 "a = Relu(x)\n"
                 "b = Relu(x)\n"
                 "output a, b\n",
                 "Relu");
}

Test(pass_cse, does_not_merge_unknown_ops_or_dropout) {
    expect_apart("input x float[2, 3]\n"
                 "a = MysteryRandom(x)\n"
                 "b = MysteryRandom(x)\n"
                 "y = Sub(a, b)\n"
                 "output y\n",
                 "MysteryRandom");
    expect_apart("opset 13\n"
                 "input x float[2, 3]\n"
                 "const r float[] = 0.5\n"
                 "const on bool[] = 1\n"
                 "a = Dropout(x, r, on)\n"
                 "b = Dropout(x, r, on)\n"
                 "y = Sub(a, b)\n"
                 "output y\n",
                 "Dropout");
}

/* Equal initializers merge into the lowest id whatever else shares their
 * shape, bytes past the last whole word count, and a tensor whose shape
 * nobody else has is left alone (it is not even hashed). */
Test(pass_cse, initializers_merge_only_with_equal_bytes_of_equal_shape) {
    kf_model *m = gt_parse("input x float[4, 5]\n"
                           "const c1 float[5] = 1 2 3 4 5\n"
                           "const c2 float[5] = 1 2 3 4 6\n"
                           "const c3 float[5] = 1 2 3 4 5\n"
                           "const c4 float[5] = 1 2 3 4 6\n"
                           "const d float[1, 5] = 1 2 3 4 5\n"
                           "a1 = Add(x, c1)\n"
                           "a2 = Mul(x, c2)\n"
                           "a3 = Sub(x, c3)\n"
                           "a4 = Div(x, c4)\n"
                           "a5 = Max(x, d)\n"
                           "s = Sum(a1, a2, a3, a4, a5)\n"
                           "output s\n");
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_cse(m), 2, "c3 -> c1 and c4 -> c2; d differs in shape");
    const kf_graph *g = m->graph;
    kf_id c1 = kf_graph_find(g, "c1"), c2 = kf_graph_find(g, "c2"), d = kf_graph_find(g, "d");
    cr_expect_eq(g->values[c1].nusers, 2);
    cr_expect_eq(g->values[c2].nusers, 2);
    cr_expect_eq(g->values[d].nusers, 1);
    cr_expect_eq(g->values[kf_graph_find(g, "c3")].nusers, 0);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}
