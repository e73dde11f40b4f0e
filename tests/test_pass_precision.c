/*
 * test_pass_precision.c: the fp16/bf16 pass (fusion/pass_precision.c).
 * Graphs as text in, the pass, then the facts: which values became 16-bit,
 * where Casts sit, that declared inputs and outputs keep float32, that
 * shape parameters and nodes without a float result stay float32, and
 * that the reference evaluator runs the rewritten graph to the original's
 * outputs at the precision's tolerance (random inputs, printed seed).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "graph_text.h"
#include "kf_precision.h"
#include "kf_run.h"
#include "test_util.h"

static kf_dtype dtype_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value '%s'", name);
    return m->graph->values[v].type.dtype;
}

/* The op type of the node writing value `name` ("" for none). */
static const char *producer_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value '%s'", name);
    kf_id p = m->graph->values[v].producer;
    return p ? m->graph->nodes[p].op_type : "";
}

/* The dtype node `op` (its only live instance) reads at input i. */
static kf_dtype operand_dtype(const kf_model *m, const char *op, int i) {
    const kf_graph *g = m->graph;
    for (kf_id n = 1; n < g->nnodes; n++)
        if (!g->nodes[n].dead && !strcmp(g->nodes[n].op_type, op)) return g->values[g->nodes[n].in[i]].type.dtype;
    cr_assert_fail("no %s node", op);
    return KF_DT_UNDEFINED;
}

/* Runs the pass on a copy of text's model; the original and the copy must
 * agree on ref, on random inputs, as `run --check` holds a plan at the 16-bit
 * precision to its reference (kf_run_close_model: the tolerance scaled by
 * the roundings stacked on each output; a Softmax after a MatMul of 16
 * rounded products moves an output past the flat element bound on some
 * inputs). The copy is the caller's. */
static kf_model *converted(const char *text, kf_dtype low, kf_precision_stats *st) {
    kf_model *orig = gt_parse(text), *m = gt_copy(orig);
    cr_assert_eq(kf_fuse_precision(m, low, st), KF_OK, "%s", kf_last_error());
    kf_precision p = low == KF_DT_FLOAT16 ? KF_PRECISION_FP16 : KF_PRECISION_BF16;
    uint32_t no = orig->graph->noutputs, *depth = calloc(no + 1, sizeof *depth);
    kf_tensor *ins, *want = calloc(no + 1, sizeof *want), *got = calloc(no + 1, sizeof *got);
    uint32_t nins;
    cr_assert(depth && want && got);
    cr_assert_eq(kf_run_output_depths(orig, depth), KF_OK, "%s", kf_last_error());
    gt_random_inputs(orig, &ins, &nins);
    cr_assert_eq(kf_eval_model(orig, ins, (int)nins, want, NULL), KF_OK, "original: %s", kf_last_error());
    cr_assert_eq(kf_eval_model(m, ins, (int)nins, got, NULL), KF_OK, "converted: %s", kf_last_error());
    for (uint32_t o = 0; o < no; o++) {
        char why[256];
        cr_assert(kf_run_close_model(&got[o], &want[o], p, depth[o], why, sizeof why), "output %u: %s", o, why);
        kf_tensor_release(&got[o]);
        kf_tensor_release(&want[o]);
    }
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins), free(want), free(got), free(depth);
    kf_model_free(orig);
    return m;
}

static const char *MLP = "opset 17\n"
                         "input x float[4, 16]\n"
                         "const w float[16, 8] = random\n"
                         "const b float[8] = random\n"
                         "h = MatMul(x, w)\n"
                         "a = Add(h, b)\n"
                         "r = Relu(a)\n"
                         "s = Softmax(r) {axis=1}\n"
                         "output s\n";

static void mlp(kf_dtype low) {
    kf_precision_stats st;
    kf_model *m = converted(MLP, low, &st);
    cr_expect_eq(st.nodes_low, 4);
    cr_expect_eq(st.nodes_kept, 0);
    cr_expect_eq(st.weights_converted, 2, "w and b, in place");
    cr_expect_eq(st.casts, 2, "x in, s out");
    cr_expect_eq(gt_count(m, "Cast"), 2);
    /* the caller's view: float32 in and out */
    cr_expect_eq(dtype_of(m, "x"), KF_DT_FLOAT);
    cr_expect_eq(dtype_of(m, "s"), KF_DT_FLOAT);
    cr_expect_str_eq(producer_of(m, "s"), "Cast");
    /* inside: 16-bit values and weights */
    cr_expect_eq(dtype_of(m, "w"), low);
    cr_expect_eq(dtype_of(m, "b"), low);
    cr_expect_eq(dtype_of(m, "h"), low);
    cr_expect_eq(dtype_of(m, "r"), low);
    cr_expect_eq(operand_dtype(m, "MatMul", 0), low);
    kf_id w = kf_graph_find(m->graph, "w");
    cr_expect_eq(m->graph->values[w].init->dtype, low, "the weight's data is converted, not only its type");
    kf_model_free(m);
}

Test(pass_precision, mlp_float16) { mlp(KF_DT_FLOAT16); }
Test(pass_precision, mlp_bfloat16) { mlp(KF_DT_BFLOAT16); }

/* A constant a float32 node also reads keeps its float32 data; low
 * readers get one converted copy. */
Test(pass_precision, shared_constant_is_copied_once) {
    kf_precision_stats st;
    kf_model *m = converted("opset 17\n"
                            "input x float[4, 8]\n"
                            "const k float[8] = random\n"
                            "a = Mul(x, k)\n"
                            "b = Add(a, k)\n"
                            "g = Greater(x, k)\n"
                            "output b\n"
                            "output g\n",
                            KF_DT_FLOAT16, &st);
    cr_expect_eq(st.weights_converted, 1);
    cr_expect_eq(dtype_of(m, "k"), KF_DT_FLOAT, "Greater (no float result) reads the float32 original");
    cr_expect_eq(operand_dtype(m, "Mul", 1), KF_DT_FLOAT16);
    cr_expect_eq(m->graph->values[m->graph->nodes[1].in[1]].type.dtype, KF_DT_FLOAT16);
    cr_expect_eq(operand_dtype(m, "Greater", 0), KF_DT_FLOAT);
    cr_expect_eq(operand_dtype(m, "Greater", 1), KF_DT_FLOAT);
    kf_model_free(m);
}

/* Nodes without a float result (comparisons, ArgMax, Cast to an integer)
 * read a 16-bit operand as it is, and round their constants with it; on
 * float32 sources alone they stay float32 and exact. The two models agree
 * exactly on inputs float16 holds (multiples of 1/16): on others, two
 * values of a row within a float16 rounding of each other may swap
 * ArgMax's answer, and one that close to an integer Cast's. */
Test(pass_precision, no_float_result) {
    kf_precision_stats st;
    kf_model *orig = gt_parse("opset 17\n"
                              "input x float[4, 8]\n"
                              "const t float[] = 0.7534\n"
                              "r = Relu(x)\n"
                              "i = ArgMax(r) {axis=1}\n"
                              "c = Cast(r) {to=7}\n"
                              "g = Greater(r, t)\n"
                              "e = Less(x, t)\n"
                              "output i\n"
                              "output c\n"
                              "output g\n"
                              "output e\n"),
             *m = gt_copy(orig);
    cr_assert_eq(kf_fuse_precision(m, KF_DT_FLOAT16, &st), KF_OK, "%s", kf_last_error());
    const int64_t xd[2] = {4, 8};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, xd, -2, 2), a[4] = {0}, b[4] = {0};
    for (int64_t k = 0; k < x.numel; k++) kf_set_f64(&x, k, round(kf_get_f64(&x, k) * 16) / 16);
    cr_assert_eq(kf_eval_model(orig, &x, 1, a, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_eval_model(m, &x, 1, b, NULL), KF_OK, "%s", kf_last_error());
    for (int o = 0; o < 4; o++) {
        cr_assert(a[o].dtype == b[o].dtype && a[o].numel == b[o].numel, "output %d", o);
        cr_assert(!memcmp(a[o].data, b[o].data, (size_t)a[o].numel * kf_dtype_size(a[o].dtype)), "output %d differs", o);
        kf_tensor_release(&a[o]);
        kf_tensor_release(&b[o]);
    }
    kf_tensor_release(&x);
    kf_model_free(orig);
    cr_expect_eq(dtype_of(m, "r"), KF_DT_FLOAT16);
    cr_expect_eq(operand_dtype(m, "ArgMax", 0), KF_DT_FLOAT16);
    cr_expect_eq(operand_dtype(m, "Greater", 0), KF_DT_FLOAT16);
    cr_expect_eq(operand_dtype(m, "Greater", 1), KF_DT_FLOAT16, "the threshold rounds with the value");
    cr_expect_eq(operand_dtype(m, "Less", 0), KF_DT_FLOAT, "on a graph input: exact");
    cr_expect_eq(operand_dtype(m, "Less", 1), KF_DT_FLOAT);
    cr_expect_eq(dtype_of(m, "i"), KF_DT_INT64);
    cr_expect_eq(dtype_of(m, "g"), KF_DT_BOOL);
    cr_expect_eq(st.nodes_low, 4, "Relu, ArgMax, Cast, Greater");
    cr_expect_eq(st.casts, 1, "x in; nothing casts back");
    cr_expect_eq(st.weights_converted, 1, "t: a float16 copy, the float32 original stays for Less");
    kf_model_free(m);
}

/* A graph output that low nodes also read: written by a Cast, while its
 * readers read the 16-bit result directly. */
Test(pass_precision, output_read_inside) {
    kf_model *m = converted("opset 17\n"
                            "input x float[3, 5]\n"
                            "y = Tanh(x)\n"
                            "z = Exp(y)\n"
                            "output y\n"
                            "output z\n",
                            KF_DT_BFLOAT16, NULL);
    cr_expect_eq(dtype_of(m, "y"), KF_DT_FLOAT);
    cr_expect_str_eq(producer_of(m, "y"), "Cast");
    cr_expect_eq(operand_dtype(m, "Exp", 0), KF_DT_BFLOAT16);
    cr_expect_eq(dtype_of(m, "z"), KF_DT_FLOAT);
    cr_expect_eq(m->graph->values[m->graph->outputs[0]].type.dtype, KF_DT_FLOAT);
    cr_expect_str_eq(m->graph->values[m->graph->outputs[0]].name, "y", "outputs keep their names and order");
    kf_model_free(m);
}

/* Range's bounds give a shape: they, and the arithmetic computing them,
 * stay float32; the data the range is added to goes low. */
Test(pass_precision, shape_parameters_stay_float32) {
    kf_precision_stats st;
    kf_model *m = converted("opset 17\n"
                            "input x float[7]\n"
                            "input n float[]\n"
                            "const start float[] = 0.5\n"
                            "const step float[] = 1.3\n"
                            "const two float[] = 2\n"
                            "l = Mul(n, two)\n"
                            "r = Range(start, l, step)\n"
                            "y = Tanh(x)\n"
                            "output r\n"
                            "output y\n",
                            KF_DT_FLOAT16, &st);
    cr_expect_eq(dtype_of(m, "l"), KF_DT_FLOAT, "Mul computes Range's limit");
    cr_expect_eq(operand_dtype(m, "Mul", 0), KF_DT_FLOAT);
    cr_expect_eq(operand_dtype(m, "Range", 1), KF_DT_FLOAT);
    cr_expect_eq(operand_dtype(m, "Tanh", 0), KF_DT_FLOAT16);
    cr_expect_eq(st.nodes_kept, 2, "Mul and Range");
    kf_model_free(m);
}

/* A shape-from-data op's data goes low; its shape operand is untouched. */
Test(pass_precision, reshape_data_low_shape_exact) {
    kf_model *m = converted("opset 17\n"
                            "input x float[2, 6]\n"
                            "const s int64[2] = 3 4\n"
                            "e = Exp(x)\n"
                            "r = Reshape(e, s)\n"
                            "output r\n",
                            KF_DT_FLOAT16, NULL);
    cr_expect_eq(operand_dtype(m, "Reshape", 0), KF_DT_FLOAT16);
    cr_expect_eq(operand_dtype(m, "Reshape", 1), KF_DT_INT64);
    kf_model_free(m);
}

/* Nothing float32: nothing changes. */
Test(pass_precision, integer_graph_unchanged) {
    kf_precision_stats st;
    kf_model *m = converted("opset 17\n"
                            "input x int64[5]\n"
                            "const k int64[] = 3\n"
                            "y = Add(x, k)\n"
                            "output y\n",
                            KF_DT_FLOAT16, &st);
    cr_expect_eq(st.nodes_low + st.casts + st.weights_converted, 0);
    cr_expect_eq(gt_count(m, "Cast"), 0);
    kf_model_free(m);
}

/* A float16 model is left as it is (only float32 values convert). */
Test(pass_precision, float16_model_unchanged) {
    kf_precision_stats st;
    kf_model *m = converted("opset 17\n"
                            "input x float16[5]\n"
                            "y = Sigmoid(x)\n"
                            "output y\n",
                            KF_DT_BFLOAT16, &st);
    cr_expect_eq(st.nodes_low + st.casts, 0);
    cr_expect_eq(dtype_of(m, "y"), KF_DT_FLOAT16);
    kf_model_free(m);
}

Test(pass_precision, does_not_take_other_types) {
    kf_model *m = gt_parse(MLP);
    cr_expect_eq(kf_fuse_precision(m, KF_DT_FLOAT, NULL), KF_ERR_INVALID_ARG);
    cr_expect(strstr(kf_last_error(), "float16 or bfloat16"), "%s", kf_last_error());
    cr_expect_eq(kf_fuse_precision(m, KF_DT_DOUBLE, NULL), KF_ERR_INVALID_ARG);
    cr_expect_eq(gt_count(m, "Cast"), 0);
    kf_model_free(m);
}

/* ---- the whole-model tolerance of `kfuse run --check` at a low precision ---- */

static kf_tensor vec(const double *v, int n) {
    kf_tensor t = {0};
    int64_t d = n;
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_FLOAT, 1, &d), KF_OK);
    for (int i = 0; i < n; i++) kf_set_f64(&t, i, v[i]);
    return t;
}

Test(pass_precision, model_tolerance) {
    const double want_v[3] = {10.0, 0.01, -3.0};
    const double near_v[3] = {10.02, 0.02, -3.0};  /* 0.01 off near 0: an fp16 rounding of a value ~10 */
    const double far_v[3] = {10.0, 0.5, -3.0};     /* 5% of the output's scale: a wrong result */
    kf_tensor want = vec(want_v, 3), near = vec(near_v, 3), far = vec(far_v, 3);
    char why[256];
    /* fp32 allows only float32 rounding on the output's scale: 0.01 is far outside */
    cr_expect(!kf_run_close_model(&near, &want, KF_PRECISION_FP32, 100, why, sizeof why));
    {
        /* full-size ResNet-50 on generated kernels: 4.3e-5 off an element of 0.047 */
        const double rw[3] = {5.0, 0.0467689298, -1.0}, rg[3] = {5.0, 0.046811644, -1.0}, rb[3] = {5.0, 0.0517, -1.0};
        kf_tensor w = vec(rw, 3), g = vec(rg, 3), b = vec(rb, 3);
        cr_expect(!kf_run_close_prec(&g, &w, KF_PRECISION_FP32, why, sizeof why), "the element tolerance alone");
        cr_expect(kf_run_close_model(&g, &w, KF_PRECISION_FP32, 70, why, sizeof why), "%s", why);
        cr_expect(!kf_run_close_model(&b, &w, KF_PRECISION_FP32, 70, why, sizeof why), "0.1%% of the scale is a bug");
        cr_expect(!kf_run_close_model(&g, &w, KF_PRECISION_FP32, 1, why, sizeof why), "one node: the element tolerance");
        kf_tensor_release(&w);
        kf_tensor_release(&g);
        kf_tensor_release(&b);
    }
    cr_expect(!kf_run_close_prec(&near, &want, KF_PRECISION_FP16, why, sizeof why), "element tolerance");
    cr_expect(kf_run_close_model(&near, &want, KF_PRECISION_FP16, 4, why, sizeof why), "%s", why);
    cr_expect(!kf_run_close_model(&far, &want, KF_PRECISION_FP16, 4, why, sizeof why));
    cr_expect(!kf_run_close_model(&far, &want, KF_PRECISION_BF16, 4, why, sizeof why));
    cr_expect(!kf_run_close_model(&far, &want, KF_PRECISION_FP16, 50, why, sizeof why), "50 roundings deep");
    kf_tensor_release(&want);
    kf_tensor_release(&near);
    kf_tensor_release(&far);
}

Test(pass_precision, output_depths) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4]\n"
                           "const k float[4] = random\n"
                           "a = Add(x, k)\n"
                           "b = Relu(a)\n"
                           "c = Mul(b, a)\n"
                           "output c\n"
                           "output a\n"
                           "output x\n");
    uint32_t d[3];
    cr_assert_eq(kf_run_output_depths(m, d), KF_OK);
    cr_expect_eq(d[0], 3);
    cr_expect_eq(d[1], 1);
    cr_expect_eq(d[2], 1, "an input passed through counts as one");
    kf_model_free(m);
}

/* Requantizations upstream of each output: a QuantizeLinear of a graph
 * input does not count (its codes are the same on every backend), one of
 * a computed value does, and the most on any path is kept. */
Test(pass_precision, output_requants) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[2, 4]\n"
                           "const w float[4, 4] = random\n"
                           "const s float[] = 0.02\nconst z uint8[] = 128\n"
                           "xq = QuantizeLinear(x, s, z)\nxd = DequantizeLinear(xq, s, z)\n"
                           "y = MatMul(xd, w)\n"
                           "yq = QuantizeLinear(y, s, z)\nyd = DequantizeLinear(yq, s, z)\n"
                           "r = Relu(yd)\nrq = QuantizeLinear(r, s, z)\nrd = DequantizeLinear(rq, s, z)\n"
                           "o = Add(rd, xd)\n"
                           "output o\noutput xd\noutput yd\n");
    uint32_t q[3];
    cr_assert_eq(kf_run_output_requants(m, q), KF_OK);
    cr_expect_eq(q[0], 2);
    cr_expect_eq(q[1], 0, "the input's own quantization");
    cr_expect_eq(q[2], 1);
    kf_model_free(m);
    /* a float8 requantization upstream marks the count */
    m = gt_parse("opset 21\ninput x float[2, 4]\nconst s float[] = 0.02\n"
                 "y = Relu(x)\nyq = QuantizeLinear(y, s) {output_dtype=17}\nyd = DequantizeLinear(yq, s)\n"
                 "const z float8e5m2[] = 0\nv = Abs(x)\nvq = QuantizeLinear(v, s, z)\nvd = DequantizeLinear(vq, s, z)\n"
                 "xq = QuantizeLinear(x, s) {output_dtype=17}\nxd = DequantizeLinear(xq, s)\n"
                 "output yd\noutput xd\noutput vd\n");
    cr_assert_eq(kf_run_output_requants(m, q), KF_OK);
    cr_expect_eq(q[0], 1u | KF_RUN_REQUANT_SMALL_FLOAT);
    cr_expect_eq(q[1], 0, "the input's own quantization");
    cr_expect_eq(q[2], 1u | KF_RUN_REQUANT_SMALL_FLOAT, "float8 by the zero point's type");
    kf_model_free(m);
}

/* The SQNR fallback of the check: an output past the elementwise bound
 * passes on a model that requantizes when its SQNR is at least
 * KF_RUN_REQUANT_MIN_DB, and never on one that does not; a scaled output
 * (a wrong scale: 20 log10(1 / 0.05) = 26 dB) fails, as does a NaN where
 * the reference has a number. */
Test(pass_precision, requantized_outputs_are_held_to_an_sqnr) {
    const int64_t dims[1] = {4096};
    kf_tensor want = tu_rand(KF_DT_FLOAT, 1, dims, -1, 1), near = {0}, scaled = {0}, nan = {0};
    cr_assert_eq(kf_tensor_copy(&near, &want), KF_OK);
    cr_assert_eq(kf_tensor_copy(&scaled, &want), KF_OK);
    cr_assert_eq(kf_tensor_copy(&nan, &want), KF_OK);
    for (int64_t i = 0; i < want.numel; i++) {
        double w = kf_get_f64(&want, i);
        /* every 16th element a step of 1/127 off: flips, SQNR about 47 dB */
        kf_set_f64(&near, i, i % 16 ? w : w + 1.0 / 127);
        kf_set_f64(&scaled, i, w * 1.05);
    }
    kf_set_f64(&nan, 7, NAN);
    char why[640];
    double db;
    cr_assert_not(kf_run_close_model(&near, &want, KF_PRECISION_FP32, 10, why, sizeof why), "past the elementwise bound");
    cr_assert(kf_run_close_requant(&near, &want, KF_PRECISION_FP32, 10, 3, &db, why, sizeof why), "%s", why);
    cr_expect(db > 40 && db < 55, "%g", db);
    cr_expect_not_null(strstr(why, "256 of 4096 elements"), "%s", why);
    cr_assert_not(kf_run_close_requant(&near, &want, KF_PRECISION_FP32, 10, 0, &db, why, sizeof why),
                  "no requantization: the elementwise bound alone");
    cr_assert_not(kf_run_close_requant(&scaled, &want, KF_PRECISION_FP32, 10, 3, &db, why, sizeof why));
    cr_expect(db > 25 && db < 27, "%g", db);
    cr_expect_not_null(strstr(why, "under the 30 dB"), "%s", why);
    /* after a float8 requantization the floor is 20 dB: 5% off passes,
     * 20% off (14 dB) does not */
    cr_assert(kf_run_close_requant(&scaled, &want, KF_PRECISION_FP32, 10, 3 | KF_RUN_REQUANT_SMALL_FLOAT, &db, why,
                                   sizeof why), "%s", why);
    cr_expect_not_null(strstr(why, "3 float8 requantizations"), "%s", why);
    for (int64_t i = 0; i < want.numel; i++) kf_set_f64(&scaled, i, kf_get_f64(&want, i) * 1.2);
    cr_assert_not(kf_run_close_requant(&scaled, &want, KF_PRECISION_FP32, 10, 3 | KF_RUN_REQUANT_SMALL_FLOAT, &db, why,
                                       sizeof why));
    cr_expect_not_null(strstr(why, "under the 20 dB of float8 requantization"), "%s", why);
    cr_assert_not(kf_run_close_requant(&nan, &want, KF_PRECISION_FP32, 10, 3, &db, why, sizeof why));
    cr_expect(isnan(kf_run_sqnr_db(&nan, &want)));
    cr_expect(isinf(kf_run_sqnr_db(&want, &want)));
    cr_assert(kf_run_close_requant(&want, &want, KF_PRECISION_FP32, 10, 3, &db, why, sizeof why));
    cr_expect(isnan(db), "within the elementwise bound: no SQNR taken");
    kf_tensor_release(&want);
    kf_tensor_release(&near);
    kf_tensor_release(&scaled);
    kf_tensor_release(&nan);
}

/* Attention rounds each of its steps on a 16-bit type (as the ONNX
 * reference does): it counts as KF_OP_STEP_ROUNDINGS layers, so a
 * LayerNorm after it is held to the bound of that many roundings (a
 * bf16 Attention into a LayerNorm over two values once failed at the
 * two-layer bound: random graph seed 278). */
Test(pass_precision, output_depths_count_the_steps_attention_rounds) {
    kf_model *m = gt_parse("opset 23\n"
                           "input q float[1, 2, 3, 4]\n"
                           "input k float[1, 2, 5, 4]\n"
                           "input v float[1, 2, 5, 2]\n"
                           "const g float[2] = random\n"
                           "y = Attention(q, k, v)\n"
                           "n = LayerNormalization(y, g) {axis=-1}\n"
                           "output n\n"
                           "output y\n");
    uint32_t d[2];
    cr_assert_eq(kf_run_output_depths(m, d), KF_OK);
    cr_expect_eq(d[0], KF_OP_STEP_ROUNDINGS + 1);
    cr_expect_eq(d[1], KF_OP_STEP_ROUNDINGS);
    kf_model_free(m);
}

/* An exporter's mask (float32's lowest value where a key is masked) turned
 * 16-bit saturates to the low type's lowest finite value instead of
 * rounding to -inf: a Softmax row whose every key is masked stays finite
 * and uniform, as in float32, where -inf would give NaN. */
static void mask_saturates(kf_dtype low, double lowest) {
    const char *text = "opset 17\n"
                       "input s float[2, 4]\n"
                       "const m float[2, 4] = -3.40282347e38 -3.40282347e38 -3.40282347e38 -3.40282347e38 "
                       "0 0 -3.40282347e38 0\n"
                       "y = Add(s, m)\n"
                       "p = Softmax(y) {axis=-1}\n"
                       "output p\n";
    kf_model *f = gt_parse(text), *m = converted(text, low, NULL);
    const kf_tensor *c = m->graph->values[kf_graph_find(m->graph, "m")].init;
    cr_assert_eq(c->dtype, low);
    cr_expect_eq(kf_get_f64(c, 0), lowest, "%g", kf_get_f64(c, 0));
    cr_expect_eq(kf_get_f64(c, 4), 0.0);
    kf_tensor in = {0};
    int64_t d[2] = {2, 4};
    cr_assert_eq(kf_tensor_alloc(&in, KF_DT_FLOAT, 2, d), KF_OK);
    const double sv[8] = {0.5, -0.25, 0.75, -1.0, 0.3, -0.6, 0.9, 0.1};
    for (int i = 0; i < 8; i++) kf_set_f64(&in, i, sv[i]);
    kf_tensor want = {0}, got = {0};
    cr_assert_eq(kf_eval_model(f, &in, 1, &want, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_eval_model(m, &in, 1, &got, NULL), KF_OK, "%s", kf_last_error());
    for (int i = 0; i < 4; i++) cr_expect_float_eq(kf_get_f64(&got, i), 0.25, 1e-6, "a fully masked row is uniform");
    char why[256];
    cr_expect(kf_run_close_model(&got, &want, low == KF_DT_FLOAT16 ? KF_PRECISION_FP16 : KF_PRECISION_BF16, 2, why,
                                 sizeof why),
              "%s", why);
    kf_tensor_release(&in);
    kf_tensor_release(&want);
    kf_tensor_release(&got);
    kf_model_free(f);
    kf_model_free(m);
}

Test(pass_precision, lowest_float_mask_saturates_float16) { mask_saturates(KF_DT_FLOAT16, -65504.0); }
Test(pass_precision, lowest_float_mask_saturates_bfloat16) { mask_saturates(KF_DT_BFLOAT16, -3.3895313892515355e38); }
