/*
 * test_pass_fold.c: constant folding (fusion/pass_fold.c): constant
 * subgraphs, Constant nodes, Shape/Size of static values and the shape
 * subgraphs exporters write become initializers, outputs stay equal; the
 * size cap, overridable initializers, unknown ops and training-mode
 * Dropout keep their nodes.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define ORT_TRANSFORM KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/test/testdata/transform/"

/* Shape inference, one fold pass (fuel as given), dead-code elimination;
 * returns the pass's change count. */
static uint64_t run_fold(kf_model *m, int64_t fuel) {
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_pass_ctx ctx = {fuel, false, 0, 0, false, NULL, 0};
    cr_assert_eq(kf_pass_fold(m, &ctx), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_dce(m->graph, NULL), KF_OK);
    return ctx.changes;
}

static kf_node *find_op(kf_model *m, const char *op) {
    for (kf_id i = 1; i < m->graph->nnodes; i++)
        if (!m->graph->nodes[i].dead && !strcmp(m->graph->nodes[i].op_type, op)) return &m->graph->nodes[i];
    cr_assert_fail("no live %s", op);
    return NULL;
}

Test(pass_fold, constant_subgraph_becomes_an_initializer) {
    kf_model *m = gt_parse("input x float[2, 4]\n"
                           "const w float[3, 4] = random\n"
                           "const s float[] = 0.5\n"
                           "t = Transpose(w) {perm=[1, 0]}\n"
                           "u = Mul(t, s)\n"
                           "y = MatMul(x, u)\n"
                           "output y\n");
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_fold(m, -1), 2);
    cr_expect_eq(gt_count(m, "Transpose"), 0);
    cr_expect_eq(gt_count(m, "Mul"), 0);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 1);
    const kf_node *mm = find_op(m, "MatMul");
    cr_expect_neq(m->graph->values[mm->in[1]].init, NULL, "MatMul reads the folded weight");
    gt_expect_same_outputs(orig, m, 1e-5, 1e-4);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_fold, constant_node_becomes_an_initializer) {
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "c = Constant()\n"
                           "y = Add(x, c)\n"
                           "output y\n");
    int64_t dims[2] = {2, 3};
    kf_tensor t = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    kf_node *c = find_op(m, "Constant");
    tu_attr_t(c, "value", &t);
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_fold(m, -1), 1);
    cr_expect_eq(gt_count(m, "Constant"), 0);
    const kf_value *v = &m->graph->values[kf_graph_find(m->graph, "c")];
    cr_assert_neq(v->init, NULL);
    cr_expect(kf_tensor_equal(v->init, &t), "the initializer holds the attribute's tensor");
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_tensor_release(&t);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_fold, shape_subgraph_of_a_static_value) {
    /* Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write it */
    kf_model *m = gt_parse("input x float[2, 12, 8]\n"
                           "const i0 int64[] = 0\n"
                           "const i1 int64[] = 1\n"
                           "const ax int64[1] = 0\n"
                           "const tail int64[2] = 4 2\n"
                           "s = Shape(x)\n"
                           "d0 = Gather(s, i0) {axis=0}\n"
                           "d1 = Gather(s, i1) {axis=0}\n"
                           "u0 = Unsqueeze(d0, ax)\n"
                           "u1 = Unsqueeze(d1, ax)\n"
                           "shape = Concat(u0, u1, tail) {axis=0}\n"
                           "y = Reshape(x, shape)\n"
                           "n = Size(x)\n"
                           "output y, n\n");
    kf_model *orig = gt_copy(m);
    run_fold(m, -1);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 1, "only the Reshape is left");
    const kf_node *r = find_op(m, "Reshape");
    const kf_tensor *shape = m->graph->values[r->in[1]].init;
    cr_assert_neq(shape, NULL);
    int64_t want[4] = {2, 12, 4, 2};
    cr_assert_eq(shape->numel, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(kf_get_i64(shape, i), want[i]);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_fold, static_dims_of_a_partly_dynamic_shape) {
    /* dim 1 is static and folds; dim 0 (N) stays computed */
    kf_model *m = gt_parse("input x float[N, 12]\n"
                           "const i0 int64[] = 0\n"
                           "const i1 int64[] = -1\n"
                           "s = Shape(x)\n"
                           "d0 = Gather(s, i0) {axis=0}\n"
                           "d1 = Gather(s, i1) {axis=0}\n"
                           "p = Mul(d0, d1)\n"
                           "output p\n");
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_fold(m, -1), 1);
    cr_expect_eq(gt_count(m, "Gather"), 1);
    cr_expect_eq(gt_count(m, "Shape"), 1);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_fold, folded_graph_output_becomes_an_initializer_output) {
    kf_model *m = gt_parse("input x float[3, 2]\n"
                           "const w float[2, 3] = random\n"
                           "t = Transpose(w) {perm=[1, 0]}\n"
                           "y = Add(x, t)\n"
                           "output y, t\n");
    kf_model *orig = gt_copy(m);
    cr_expect_eq(run_fold(m, -1), 1);
    cr_expect_eq(gt_count(m, "Transpose"), 0);
    kf_id t = m->graph->outputs[1];
    cr_expect_str_eq(m->graph->values[t].name, "t");
    cr_expect_neq(m->graph->values[t].init, NULL);
    /* the file written keeps "t" as an output holding the data */
    kf_model *back = gt_copy(m);
    cr_assert_eq(back->graph->noutputs, 2);
    cr_expect_str_eq(back->graph->values[back->graph->outputs[1]].name, "t");
    gt_expect_same_outputs(orig, back, 0, 0);
    kf_model_free(back);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_fold, fuel_limits_the_folds) {
    kf_model *m = gt_parse("input x float[2, 2]\n"
                           "const w float[2, 2] = random\n"
                           "a = Neg(w)\n"
                           "b = Abs(a)\n"
                           "y = Add(x, b)\n"
                           "output y\n");
    cr_expect_eq(run_fold(m, 1), 1);
    cr_expect_eq(gt_count(m, "Neg"), 0);
    cr_expect_eq(gt_count(m, "Abs"), 1);
    kf_model_free(m);
}

Test(pass_fold, does_not_fold_past_the_size_cap) {
    /* 2x2 floats tiled to 1024x512: 2 MiB out of 16 bytes in, over the
     * 1 MiB floor, so the Tile stays */
    kf_model *m = gt_parse("input x float[1024, 512]\n"
                           "const w float[2, 2] = random\n"
                           "const r int64[2] = 512 256\n"
                           "t = Tile(w, r)\n"
                           "y = Add(x, t)\n"
                           "output y\n");
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(gt_count(m, "Tile"), 1);
    kf_model_free(m);
}

/* a compiled (never saved) model raises the cap: a ConstantOfShape of a
 * constant shape over 1 MiB folds then, and only then */
Test(pass_fold, raised_cap_folds_a_large_constant_of_shape) {
    const char *text = "opset 13\ninput x float[1024, 512]\nconst shp int64[2] = 1024 512\n"
                       "const k float[512] = random\nc = ConstantOfShape(shp)\nd = Add(c, k)\ny = Add(x, d)\noutput y\n";
    kf_model *m = gt_parse(text);
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(gt_count(m, "ConstantOfShape"), 1);
    kf_model_free(m);
    m = gt_parse(text);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_pass_ctx ctx = {-1, false, 0, (int64_t)4 << 20, false, NULL, 0};
    cr_assert_eq(kf_pass_fold(m, &ctx), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_dce(m->graph, NULL), KF_OK);
    cr_expect_eq(ctx.changes, 2);
    cr_expect_eq(gt_count(m, "ConstantOfShape"), 0);
    cr_expect_eq(gt_count(m, "Add"), 1);
    const kf_tensor *t = m->graph->values[kf_graph_find(m->graph, "d")].init, *k = m->graph->values[kf_graph_find(m->graph, "k")].init;
    cr_assert_not_null(t);
    cr_expect_eq(t->numel, 1024 * 512);
    cr_expect_eq(kf_get_f64(t, t->numel - 1), kf_get_f64(k, 511));
    kf_model_free(m);
}

Test(pass_fold, does_not_fold_overridable_initializers_unknown_ops_or_training_dropout) {
    /* w is also a graph input: a caller may feed another value */
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "const w float[3, 2] = random\n"
                           "input w float[3, 2]\n"
                           "t = Transpose(w) {perm=[1, 0]}\n"
                           "y = Add(x, t)\n"
                           "output y\n");
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(gt_count(m, "Transpose"), 1);
    kf_model_free(m);
    /* an op kfuse does not know may be random or have effects */
    m = gt_parse("input x float[2, 3]\n"
                 "const w float[2, 3] = random\n"
                 "t = MysteryOp(w)\n"
                 "y = Add(x, t)\n"
                 "output y\n");
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(gt_count(m, "MysteryOp"), 1);
    kf_model_free(m);
    /* a training-mode Dropout is random */
    m = gt_parse("opset 13\n"
                 "input x float[2, 3]\n"
                 "const w float[2, 3] = random\n"
                 "const r float[] = 0.5\n"
                 "const on bool[] = 1\n"
                 "t = Dropout(w, r, on)\n"
                 "y = Add(x, t)\n"
                 "output y\n");
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(gt_count(m, "Dropout"), 1);
    kf_model_free(m);
}

Test(pass_fold, does_not_fold_shape_of_a_dynamic_value) {
    kf_model *m = gt_parse("input x float[N, 3]\n"
                           "s = Shape(x)\n"
                           "n = Size(x)\n"
                           "output s, n\n");
    cr_expect_eq(run_fold(m, -1), 0);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 2);
    kf_model_free(m);
}

Test(pass_fold, ort_reshape_shape_subgraph_becomes_a_constant) {
    kf_model *m;
    if (kf_model_load(ORT_TRANSFORM "fusion/reshape.onnx", &m) != KF_OK)
        cr_skip_test("cannot load fusion/reshape.onnx: %s", kf_last_error());
    kf_model *orig = gt_copy(m);
    run_fold(m, -1);
    cr_expect_eq(gt_count(m, "Shape"), 0);
    cr_expect_eq(gt_count(m, "Concat"), 0);
    cr_expect_eq(kf_graph_live_nodes(m->graph), 2, "Add and Reshape are left");
    const kf_node *r = find_op(m, "Reshape");
    const kf_tensor *shape = m->graph->values[r->in[1]].init;
    cr_assert_neq(shape, NULL);
    int64_t want[4] = {1, 128, 12, 64};
    cr_assert_eq(shape->numel, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(kf_get_i64(shape, i), want[i]);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}
