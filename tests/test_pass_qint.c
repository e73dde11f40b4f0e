/*
 * test_pass_qint.c: fusion/pass_qint.c, precision INT8. Conv, MatMul and
 * Gemm between DequantizeLinears become ConvInteger/MatMulInteger, a
 * Cast and a per-channel scale (and the bias); forms it does not take stay
 * float; the rewritten graph matches the float QDQ graph within one
 * quantisation step; an int8 plan on OpenCL equals the reference on the
 * rewritten graph bit for bit in its quantised outputs; `kfuse run
 * --precision int8 --check` on a quantised model.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"
#include "kf_cost.h"
#include "kf_opt.h"
#include "kf_precision.h"
#include "kf_ref.h"
#include "kf_run.h"

/* A quantised conv block and a dense layer, QDQ as quantisers write them:
 * per-channel int8 weights (zero points 0), uint8 activations; the conv
 * has a bias, the dense layer is a MatMul, a Gemm with transB stays float
 * (MatMulInteger has no transposes). q and z are the quantised outputs. */
#define QDQ_NET                                                                                        \
    "opset 13\ninput x float[2, 3, 8, 8]\n"                                                            \
    "const w float[4, 3, 3, 3] = random\nconst b float[4] = random\n"                                  \
    "const sw float[4] = 0.016 0.012 0.02 0.01\nconst zw int8[4] = 0\n"                                \
    "const sx float[] = 0.016\nconst zx uint8[] = 128\n"                                               \
    "const sr float[] = 0.05\nconst zr uint8[] = 0\n"                                                  \
    "const fw float[256, 5] = random\nconst sf float[] = 0.016\nconst zf int8[] = 0\n"                 \
    "const gw float[5, 256] = random\nconst sg float[5] = 0.01 0.02\nconst zg int8[5] = 0\n"            \
    "const shp int64[2] = 2 256\nconst so float[] = 0.2\nconst zo uint8[] = 128\n"                     \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                              \
    "wq = QuantizeLinear(w, sw, zw) {axis=0}\nwd = DequantizeLinear(wq, sw, zw) {axis=0}\n"            \
    "c = Conv(xd, wd, b) {pads=[1,1,1,1]}\nr = Relu(c)\n"                                              \
    "q = QuantizeLinear(r, sr, zr)\nrd = DequantizeLinear(q, sr, zr)\n"                                \
    "f = Reshape(rd, shp)\n"                                                                           \
    "fq = QuantizeLinear(fw, sf, zf)\nfd = DequantizeLinear(fq, sf, zf)\n"                             \
    "y = MatMul(f, fd)\nz = QuantizeLinear(y, so, zo)\n"                                               \
    "g = Gemm(f, gw) {transB=1}\n"                                                                     \
    "gq = QuantizeLinear(gw, sg, zg) {axis=0}\ngd = DequantizeLinear(gq, sg, zg) {axis=0}\n"          \
    "h = Gemm(f, gd) {transB=1}\nhz = QuantizeLinear(h, so, zo)\n"                                     \
    "output q\noutput z\noutput g\noutput hz\n"

/* A copy of m optimized as an int8 plan is (weights quantised once by
 * folding, their DequantizeLinear kept; graph text draws its random
 * constants anew at each parse: compare copies, never two parses). */
static kf_model *optimized_quantized(const kf_model *m) {
    kf_model *c = gt_copy(m);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.keep_quantized = true;
    kf_opt_result res;
    cr_assert_eq(kf_optimize(c, &o, &res), KF_OK, "%s", kf_last_error());
    kf_rules_free(&res.rules);
    return c;
}

/* optimized_quantized, then rewritten for INT8. */
static kf_model *int8_of(const kf_model *m, kf_int8_stats *st) {
    kf_model *c = optimized_quantized(m);
    cr_assert_eq(kf_fuse_int8(c, st), KF_OK, "%s", kf_last_error());
    return c;
}

/* m's plan at precision p (INT8 or INT8_FP16) on OpenCL: nothing on the
 * host, outputs equal to the reference on want, m's integer graph, at p's
 * whole-model bound (at INT8 the quantised ones bit for bit: kf_run_close
 * holds integers exact), `runs` times. */
static void plan_matches_integer_ref(const kf_model *m, const kf_model *want, kf_precision p, int runs) {
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_OPENCL;
    o.precision = p;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref_model(x, want, runs, p);
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_exec_free(x);
}

/* The int8 plan of graph text on OpenCL against the reference on its
 * integer graph (3 runs: a float Gemm's 256-term sums may cancel). */
static void int8_plan_matches_ref(const char *text) {
    cgu_need_opencl();
    kf_model *m = gt_parse(text), *want = int8_of(m, NULL);
    plan_matches_integer_ref(m, want, KF_PRECISION_INT8, 3);
    kf_model_free(m);
    kf_model_free(want);
}

Test(pass_qint, conv_and_matmul_between_dequantizes_become_integer_anchors) {
    kf_int8_stats st;
    kf_model *q = gt_parse(QDQ_NET), *m = int8_of(q, &st);
    kf_model_free(q);
    cr_assert_eq(st.anchors, 3);
    cr_assert_eq(gt_count(m, "ConvInteger"), 1);
    cr_assert_eq(gt_count(m, "MatMulInteger"), 2, "the MatMul and the Gemm of quantised weights");
    cr_assert_eq(gt_count(m, "Conv"), 0);
    cr_assert_eq(gt_count(m, "MatMul"), 0);
    cr_assert_eq(gt_count(m, "Gemm"), 1, "the Gemm of float weights stays float");
    /* the weights' and the inputs' DequantizeLinear are gone; rd feeds
     * the Reshape, which the float Gemm reads */
    cr_assert_eq(gt_count(m, "DequantizeLinear"), 1);
    cr_assert_eq(gt_count(m, "Cast"), 3);
    kf_model_free(m);
}

/* Quantised output o of the integer graph (b) against the QDQ graph's
 * (a): every code within one step; adds the steps moved to *moved and the
 * codes to *total. */
static void codes_within_one_step(const kf_tensor *a, const kf_tensor *b, int o, int64_t *moved, int64_t *total) {
    cr_assert_eq(b->numel, a->numel, "output %d", o);
    for (int64_t i = 0; i < a->numel; i++) {
        int64_t d = llabs(kf_get_i64(a, i) - kf_get_i64(b, i));
        cr_assert_leq(d, 1, "output %d element %lld moved by %lld steps", o, (long long)i, (long long)d);
        *moved += d;
    }
    *total += a->numel;
}

/* Quantised outputs within one step of the float QDQ graph, float ones
 * within the rounding of a dot product of quantised values, plus what the
 * moved codes of q that the float Gemm reads account for (sr times the
 * weights they meet). */
Test(pass_qint, rewritten_graph_matches_the_qdq_graph_within_one_step) {
    kf_model *a = gt_parse(QDQ_NET), *b = int8_of(a, NULL);
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(a, &ins, &nins);
    kf_tensor wa[4] = {0}, wb[4] = {0};
    cr_assert_eq(kf_eval_model(a, ins, nins, wa, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_eval_model(b, ins, nins, wb, NULL), KF_OK, "%s", kf_last_error());
    int64_t moved = 0, total = 0;
    for (int o = 0; o < 4; o++) {
        if (o == 2) continue; /* the float Gemm */
        cr_assert_eq(wa[o].dtype, KF_DT_UINT8);
        codes_within_one_step(&wa[o], &wb[o], o, &moved, &total);
    }
    cr_assert_lt(moved * 100, total, "%lld of %lld codes moved", (long long)moved, (long long)total);
    /* g[r, n] = sum_k f[r, k] gw[n, k], f = rd = sr * q reshaped to [2, 256] */
    const kf_tensor *gw = a->graph->values[kf_graph_find(a->graph, "gw")].init;
    cr_assert(gw && wa[2].numel == 2 * 5 && gw->numel == 5 * 256 && wa[0].numel == 2 * 256);
    for (int64_t r = 0; r < 2; r++)
        for (int64_t n = 0; n < 5; n++) {
            double ga = kf_get_f64(&wa[2], r * 5 + n), gb = kf_get_f64(&wb[2], r * 5 + n), moved_part = 0;
            for (int64_t k = 0; k < 256; k++)
                moved_part += 0.05 * fabs(kf_get_f64(&wa[0], r * 256 + k) - kf_get_f64(&wb[0], r * 256 + k)) *
                              fabs(kf_get_f64(gw, n * 256 + k));
            cr_assert_leq(fabs(ga - gb), 1e-5 + 1e-5 * fabs(ga) + moved_part * (1 + 1e-5),
                          "the float Gemm [%lld, %lld]: %.9g against %.9g (moved codes account for %.3g)", (long long)r,
                          (long long)n, gb, ga, moved_part);
        }
    for (int o = 0; o < 4; o++) kf_tensor_release(&wa[o]), kf_tensor_release(&wb[o]);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_model_free(a);
    kf_model_free(b);
}

/* ONNX Runtime's quantize_static spelling of a conv bias: int32 values
 * dequantised with the scale sx * sw per channel. The int8 plan keeps that
 * DequantizeLinear unfolded, and the rewrite evaluates it into the float
 * bias it adds; the result stays within one step of the QDQ graph and the
 * OpenCL plan equals the rewritten graph's reference. */
#define QDQ_CONV_INT32_BIAS                                                                            \
    "opset 13\ninput x float[2, 3, 8, 8]\n"                                                            \
    "const w float[4, 3, 3, 3] = random\n"                                                             \
    "const sw float[4] = 0.016 0.012 0.02 0.01\nconst zw int8[4] = 0\n"                                \
    "const sx float[] = 0.016\nconst zx uint8[] = 128\n"                                               \
    "const bq int32[4] = 250 -1200 37 9000\nconst sb float[4] = 0.000256 0.000192 0.00032 0.00016\n"   \
    "const sr float[] = 0.05\nconst zr uint8[] = 100\n"                                                \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                              \
    "wq = QuantizeLinear(w, sw, zw) {axis=0}\nwd = DequantizeLinear(wq, sw, zw) {axis=0}\n"            \
    "bd = DequantizeLinear(bq, sb) {axis=0}\n"                                                         \
    "c = Conv(xd, wd, bd) {pads=[1,1,1,1]}\nq = QuantizeLinear(c, sr, zr)\n"                           \
    "output q\n"

Test(pass_qint, an_int32_bias_dequantized_from_constants_is_added_as_floats) {
    kf_int8_stats st;
    kf_model *a = gt_parse(QDQ_CONV_INT32_BIAS), *b = int8_of(a, &st);
    cr_assert_eq(st.anchors, 1);
    cr_assert_eq(gt_count(b, "ConvInteger"), 1);
    cr_assert_eq(gt_count(b, "DequantizeLinear"), 0, "the bias's DequantizeLinear is evaluated once");
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(a, &ins, &nins);
    kf_tensor wa = {0}, wb = {0};
    cr_assert_eq(kf_eval_model(a, ins, nins, &wa, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_eval_model(b, ins, nins, &wb, NULL), KF_OK, "%s", kf_last_error());
    int64_t moved = 0, total = 0, distinct = 0;
    codes_within_one_step(&wa, &wb, 0, &moved, &total);
    for (int64_t i = 0; i < wa.numel; i++) distinct += kf_get_i64(&wa, i) != kf_get_i64(&wa, 0);
    cr_assert_lt(moved * 100, wa.numel, "%lld of %lld codes moved", (long long)moved, (long long)wa.numel);
    cr_assert_gt(distinct, wa.numel / 4, "the outputs are not one saturated code");
    kf_tensor_release(&wa);
    kf_tensor_release(&wb);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_model_free(a);
    kf_model_free(b);
}

Test(pass_qint, an_int32_bias_plan_on_opencl_equals_the_integer_reference) {
    int8_plan_matches_ref(QDQ_CONV_INT32_BIAS);
}

/* A dense layer with power-of-two scales, so the QDQ graph, the integer
 * graph and every exact rewrite of it give the same floats bit for bit;
 * inputs in [-2, 2] saturate the activation at both ends of its range. */
#define QDQ_DENSE(extra_output)                                                                        \
    "opset 13\ninput x float[4, 8]\nconst sx float[] = 0.0078125\nconst zx uint8[] = 131\n"            \
    "const w int8[8, 6] = 3 -7 1 0 5 -2 9 -4 2\nconst sw float[6] = 1\nconst zw int8[6] = 0\n"         \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                              \
    "wd = DequantizeLinear(w, sw, zw) {axis=1}\ny = MatMul(xd, wd)\noutput y\n" extra_output

/* The two exact rewrites that leave the integer product with signed
 * operands and no zero points (what cuBLASLt's int8 GEMM takes): a uint8
 * activation read only by DequantizeLinears becomes int8 with its zero
 * point shifted by 128, and the activation's zero point leaves the product
 * as an int32 Add per column. One read elsewhere (a graph output) keeps
 * the activation uint8; its zero point still leaves the product. */
Test(pass_qint, activations_become_int8_and_zero_points_leave_the_product) {
    const struct {
        const char *text;
        uint32_t signed_;
    } cases[] = {{QDQ_DENSE(""), 1}, {QDQ_DENSE("output xq\n"), 0}};
    for (int c = 0; c < 2; c++) {
        kf_int8_stats st;
        kf_model *a = gt_parse(cases[c].text), *b = int8_of(a, &st);
        cr_assert_eq(st.anchors, 1, "case %d", c);
        cr_assert_eq(st.activations_signed, cases[c].signed_, "case %d", c);
        const kf_graph *g = b->graph;
        uint32_t products = 0, int_adds = 0;
        for (kf_id id = 1; id < g->nnodes; id++) {
            const kf_node *n = &g->nodes[id];
            if (n->dead) continue;
            if (n->op == KF_OP_MATMUL_INTEGER) {
                products++;
                cr_assert_eq(n->nin, 2, "case %d: the product keeps a zero point", c);
                cr_assert_eq(g->values[n->in[0]].type.dtype, cases[c].signed_ ? KF_DT_INT8 : KF_DT_UINT8, "case %d", c);
            }
            int_adds += n->op == KF_OP_ADD && g->values[n->out[0]].type.dtype == KF_DT_INT32;
        }
        cr_assert_eq(products, 1, "case %d", c);
        cr_assert_eq(int_adds, 1, "case %d: the zero point's columns", c);
        kf_tensor *ins;
        uint32_t nins;
        gt_random_inputs(a, &ins, &nins);
        kf_tensor wa[2] = {0}, wb[2] = {0};
        cr_assert_eq(kf_eval_model(a, ins, nins, wa, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_eval_model(b, ins, nins, wb, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(wb[0].numel, wa[0].numel);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < wa[0].numel; i++) {
            float fa = ((const float *)wa[0].data)[i], fb = ((const float *)wb[0].data)[i];
            cr_assert_eq(fa, fb, "case %d element %lld: %g, want %g", c, (long long)i, fb, fa);
            nonzero += fa != 0;
        }
        cr_assert_gt(nonzero, wa[0].numel / 2, "case %d: mostly zeros", c);
        if (c == 1) { /* the quantized activation itself, as a graph output, is unchanged */
            cr_assert_eq(wb[1].dtype, KF_DT_UINT8);
            cr_assert_eq(memcmp(wa[1].data, wb[1].data, (size_t)wa[1].numel), 0);
        }
        for (int o = 0; o < 2; o++) kf_tensor_release(&wa[o]), kf_tensor_release(&wb[o]);
        for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
        free(ins);
        kf_model_free(a);
        kf_model_free(b);
        int8_plan_matches_ref(cases[c].text);
    }
}

/* Q/K/V-like products of one quantised activation, weights per column
 * with their biases: the sibling merge leaves one integer product with
 * per-column scales; its quantised outputs stay within one step of the
 * float QDQ graph, and an int8 plan on OpenCL equals the reference. */
#define QDQ_SIBLINGS                                                                                   \
    "opset 13\ninput x float[2, 6, 8]\n"                                                                 \
    "const sx float[] = 0.02\nconst zx uint8[] = 120\n"                                                  \
    "const w1 float[8, 4] = random\nconst s1 float[4] = 0.016 0.012 0.02 0.01\nconst z1 int8[4] = 0\n"  \
    "const w2 float[8, 6] = random\nconst s2 float[6] = 0.015 0.011\nconst z2 int8[6] = 0\n"            \
    "const b1 float[4] = random\nconst b2 float[6] = random\n"                                          \
    "const so float[] = 0.05\nconst zo uint8[] = 128\n"                                                 \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                               \
    "q1 = QuantizeLinear(w1, s1, z1) {axis=1}\nd1 = DequantizeLinear(q1, s1, z1) {axis=1}\n"           \
    "q2 = QuantizeLinear(w2, s2, z2) {axis=1}\nd2 = DequantizeLinear(q2, s2, z2) {axis=1}\n"           \
    "p1 = MatMul(xd, d1)\np2 = MatMul(xd, d2)\ny1 = Add(p1, b1)\ny2 = Add(p2, b2)\n"                    \
    "o1 = QuantizeLinear(y1, so, zo)\no2 = QuantizeLinear(y2, so, zo)\noutput o1, o2\n"

Test(pass_qint, sibling_products_become_one_integer_product) {
    kf_int8_stats st;
    kf_model *a = gt_parse(QDQ_SIBLINGS), *b = int8_of(a, &st);
    cr_assert_eq(st.anchors, 1);
    cr_assert_eq(gt_count(b, "MatMulInteger"), 1);
    cr_assert_eq(gt_count(b, "MatMul"), 0);
    cr_assert_eq(gt_count(b, "Split"), 1);
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(a, &ins, &nins);
    kf_tensor wa[2] = {0}, wb[2] = {0};
    cr_assert_eq(kf_eval_model(a, ins, nins, wa, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_eval_model(b, ins, nins, wb, NULL), KF_OK, "%s", kf_last_error());
    int64_t moved = 0, total = 0, spread = 0;
    for (int o = 0; o < 2; o++) {
        codes_within_one_step(&wa[o], &wb[o], o, &moved, &total);
        for (int64_t i = 0; i < wa[o].numel; i++) spread += kf_get_i64(&wa[o], i) != 128;
    }
    cr_assert_lt(moved * 20, total, "%lld of %lld codes moved", (long long)moved, (long long)total);
    cr_assert_gt(spread * 2, total, "mostly the zero point");
    for (int o = 0; o < 2; o++) kf_tensor_release(&wa[o]), kf_tensor_release(&wb[o]);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_model_free(a);
    kf_model_free(b);
    int8_plan_matches_ref(QDQ_SIBLINGS);
}

/* A quantised output projection as BERT has it: the integer product, its
 * scale and bias, the residual and the LayerNorm in one group; the
 * generated kernel sums the integers exactly in its row tiles and equals
 * the reference on OpenCL. */
#define QDQ_PROJECTION_NORM                                                                            \
    "opset 17\ninput x float[2, 6, 64]\ninput res float[2, 6, 48]\n"                                     \
    "const sx float[] = 0.02\nconst zx uint8[] = 128\n"                                                  \
    "const w float[64, 48] = random\nconst sw float[48] = 0.016 0.012\nconst zw int8[48] = 0\n"          \
    "const b float[48] = random\nconst sc float[48] = random\nconst sh float[48] = random\n"           \
    "const so float[] = 0.05\nconst zo uint8[] = 128\n"                                                 \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                               \
    "wq = QuantizeLinear(w, sw, zw) {axis=1}\nwd = DequantizeLinear(wq, sw, zw) {axis=1}\n"            \
    "p = MatMul(xd, wd)\ny = Add(p, b)\nr = Add(y, res)\n"                                              \
    "n = LayerNormalization(r, sc, sh) {axis=-1}\nq = QuantizeLinear(n, so, zo)\noutput q\n"

/* m planned on the H200 profile (the cost model's choices). */
static kf_plan *h200_plan(kf_model *m) {
    kf_plan_options po;
    kf_plan_options_default(&po);
    po.target = "h200";
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &po, &p), KF_OK, "%s", kf_last_error());
    return p;
}

Test(pass_qint, integer_product_and_layernorm_rows_in_one_group) {
    kf_model *a = gt_parse(QDQ_PROJECTION_NORM), *b = int8_of(a, NULL);
    kf_plan *p = h200_plan(b);
    uint32_t with_rows = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *gr = &p->groups[gi];
        with_rows += gr->kind == KF_GROUP_ANCHOR && gr->anchor &&
                     b->graph->nodes[gr->anchor].op == KF_OP_MATMUL_INTEGER && gr->reduction;
    }
    cr_assert_eq(with_rows, 1, "the LayerNorm joins the integer product");
    kf_plan_free(p);
    kf_model_free(a);
    kf_model_free(b);
    int8_plan_matches_ref(QDQ_PROJECTION_NORM);
}

/* Q/K/V as BERT has them after the sibling merge: one integer product,
 * then a Split whose slices each go through Reshape, Transpose (heads) and
 * their own QuantizeLinear: the slices' tails join the product's group
 * (each is an iteration space of its epilogue), and the int8 plan on
 * OpenCL equals the reference. */
#define QDQ_HEADS                                                                                      \
    "opset 13\ninput x float[2, 16, 64]\n"                                                              \
    "const sx float[] = 0.02\nconst zx uint8[] = 128\nconst shp int64[4] = 2 16 4 16\n"                 \
    "const w1 float[64, 64] = random\nconst w2 float[64, 64] = random\nconst w3 float[64, 64] = random\n" \
    "const s1 float[64] = 0.016 0.012\nconst s2 float[64] = 0.015\nconst s3 float[64] = 0.011 0.013\n"  \
    "const z8 int8[64] = 0\nconst b1 float[64] = random\nconst b2 float[64] = random\n"                 \
    "const b3 float[64] = random\nconst so float[] = 0.08\nconst zo uint8[] = 128\n"                    \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                               \
    "q1 = QuantizeLinear(w1, s1, z8) {axis=1}\nd1 = DequantizeLinear(q1, s1, z8) {axis=1}\n"           \
    "q2 = QuantizeLinear(w2, s2, z8) {axis=1}\nd2 = DequantizeLinear(q2, s2, z8) {axis=1}\n"           \
    "q3 = QuantizeLinear(w3, s3, z8) {axis=1}\nd3 = DequantizeLinear(q3, s3, z8) {axis=1}\n"           \
    "p1 = MatMul(xd, d1)\np2 = MatMul(xd, d2)\np3 = MatMul(xd, d3)\n"                                  \
    "y1 = Add(p1, b1)\ny2 = Add(p2, b2)\ny3 = Add(p3, b3)\n"                                            \
    "r1 = Reshape(y1, shp)\nr2 = Reshape(y2, shp)\nr3 = Reshape(y3, shp)\n"                             \
    "t1 = Transpose(r1) {perm=[0,2,1,3]}\nt2 = Transpose(r2) {perm=[0,2,3,1]}\n"                       \
    "t3 = Transpose(r3) {perm=[0,2,1,3]}\n"                                                              \
    "o1 = QuantizeLinear(t1, so, zo)\no2 = QuantizeLinear(t2, so, zo)\no3 = QuantizeLinear(t3, so, zo)\n" \
    "output o1, o2, o3\n"

Test(pass_qint, the_slices_of_a_merged_product_join_its_group) {
    kf_model *a = gt_parse(QDQ_HEADS), *b = int8_of(a, NULL);
    cr_assert_eq(gt_count(b, "MatMulInteger"), 1);
    kf_plan *p = h200_plan(b);
    uint32_t gi = 0;
    while (gi < p->ngroups && !(p->groups[gi].anchor && b->graph->nodes[p->groups[gi].anchor].op == KF_OP_MATMUL_INTEGER))
        gi++;
    cr_assert_lt(gi, p->ngroups);
    const kf_graph *g = b->graph;
    for (uint32_t o = 0; o < g->noutputs; o++)
        cr_assert_eq(p->group_of[g->values[g->outputs[o]].producer], gi, "slice %u's QuantizeLinear in another group", o);
    cr_assert_eq(p->groups[gi].noutputs, 3);
    kf_plan_free(p);
    kf_model_free(a);
    kf_model_free(b);
    int8_plan_matches_ref(QDQ_HEADS);
}

/* What the integer anchor does not take stays float: a dequantised
 * operand with a per-tensor scale that is not a constant, a transposed or
 * scaled Gemm, a float weight. */
Test(pass_qint, other_forms_stay_float) {
    static const char *texts[] = {
        "opset 13\ninput x uint8[2, 4]\ninput s float[]\nconst w int8[4, 3] = 1 -2 3\nconst t float[] = 0.1\n"
        "a = DequantizeLinear(x, s)\nd = DequantizeLinear(w, t)\ny = MatMul(a, d)\noutput y\n",
        "opset 13\ninput x uint8[2, 4]\nconst w int8[4, 3] = 1 -2 3\nconst t float[] = 0.1\n"
        "a = DequantizeLinear(x, t)\nd = DequantizeLinear(w, t)\ny = Gemm(a, d) {alpha=0.5}\noutput y\n",
        "opset 13\ninput x uint8[2, 4]\nconst w float[4, 3] = random\nconst t float[] = 0.1\n"
        "a = DequantizeLinear(x, t)\ny = MatMul(a, w)\noutput y\n",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        kf_int8_stats st;
        kf_model *q = gt_parse(texts[i]), *m = int8_of(q, &st);
        kf_model_free(q);
        cr_assert_eq(st.anchors, 0, "case %zu", i);
        cr_assert_eq(gt_count(m, "MatMulInteger"), 0, "case %zu", i);
        kf_model_free(m);
    }
}

/* An int8 plan on OpenCL: nothing on the host, and its outputs equal the
 * reference evaluator on the rewritten graph (the quantised ones bit for
 * bit: kf_run_close holds integers exact). */
Test(pass_qint, int8_plan_on_opencl_equals_the_integer_reference) {
    int8_plan_matches_ref(QDQ_NET);
}

/* INT8_FP16: integer sums far past float16's 65504 (K 256 of codes up to
 * 127 against weights of 114), scaled by 1/127^2 into range. The Cast of
 * the sums and the Mul by the scale stay float32, the rest is float16; the
 * OpenCL plan matches the reference on the integer graph at the float16
 * tolerance, nothing on the host. */
#define QDQ_WIDE_SUMS                                                                                  \
    "opset 13\ninput x float[4, 256]\n"                                                                \
    "const w float[256, 8] = 0.9\nconst b float[8] = random\n"                                         \
    "const sx float[] = 0.007874016\nconst zx int8[] = 0\nconst sw float[8] = 0.007874016\nconst zw int8[8] = 0\n" \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                              \
    "wq = QuantizeLinear(w, sw, zw) {axis=1}\nwd = DequantizeLinear(wq, sw, zw) {axis=1}\n"            \
    "y = MatMul(xd, wd)\na = Add(y, b)\nr = Relu(a)\n"                                                   \
    "output r\n"

Test(pass_qint, int8_fp16_scales_the_sums_in_float32_before_float16) {
    cgu_need_opencl();
    kf_model *m = gt_parse(QDQ_WIDE_SUMS), *want = int8_of(m, NULL), *low = int8_of(m, NULL);
    cr_assert_eq(kf_fuse_precision(low, KF_DT_FLOAT16, NULL), KF_OK, "%s", kf_last_error());
    const kf_graph *g = low->graph;
    int kept = 0;
    for (kf_id id = 1; id < g->nnodes; id++) {
        const kf_node *n = &g->nodes[id];
        if (n->dead || n->op != KF_OP_CAST || g->values[n->in[0]].type.dtype != KF_DT_INT32) continue;
        const kf_value *c = &g->values[n->out[0]];
        cr_assert_eq(c->type.dtype, KF_DT_FLOAT, "the Cast of the sums went to %s", kf_dtype_name(c->type.dtype));
        cr_assert_eq(c->nusers, 1);
        const kf_node *mul = &g->nodes[c->users[0]];
        cr_assert_eq(mul->op, KF_OP_MUL);
        cr_assert_eq(g->values[mul->out[0]].type.dtype, KF_DT_FLOAT, "the scaled sums went to %s",
                     kf_dtype_name(g->values[mul->out[0]].type.dtype));
        kept++;
    }
    cr_assert_eq(kept, 1);
    cr_assert_eq(gt_count(low, "Relu"), 1);
    kf_model_free(low);
    plan_matches_integer_ref(m, want, KF_PRECISION_INT8_FP16, 2);
    kf_model_free(m);
    kf_model_free(want);
}

/* Weights no integer anchor takes (float8 here) fold after the int8 pass,
 * at the executor's cap, instead of dequantizing on every run; the int8
 * product beside them keeps its 8-bit weights; the plan matches the
 * integer reference with nothing on the host. */
#define QDQ_MIXED_WEIGHTS                                                                              \
    "opset 21\ninput x float[6, 40]\n"                                                                 \
    "const w float[40, 24] = random\nconst v float[40, 24] = random\nconst s float[24] = 0.01\n"        \
    "const sx float[] = 0.01\nconst zx int8[] = 0\nconst zw int8[24] = 0\n"                             \
    "xq = QuantizeLinear(x, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"                              \
    "wq = QuantizeLinear(w, s, zw) {axis=1}\nwd = DequantizeLinear(wq, s, zw) {axis=1}\n"              \
    "vq = QuantizeLinear(v, s) {axis=1, output_dtype=17}\nvd = DequantizeLinear(vq, s) {axis=1}\n"     \
    "a = MatMul(xd, wd)\nb = MatMul(x, vd)\n"                                                          \
    "output a\noutput b\n"

Test(pass_qint, weights_no_integer_anchor_takes_fold_after_the_pass) {
    kf_model *m = gt_parse(QDQ_MIXED_WEIGHTS), *c = optimized_quantized(m);
    cr_assert_eq(gt_count(c, "DequantizeLinear"), 3, "the optimizer kept the weights' DequantizeLinear");
    cr_assert_eq(kf_precision_passes(c, KF_PRECISION_INT8, KF_EXEC_FOLD_CAP_BYTES, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(gt_count(c, "MatMulInteger"), 1);
    const kf_graph *g = c->graph;
    for (kf_id id = 1; id < g->nnodes; id++) {
        const kf_node *n = &g->nodes[id];
        if (n->dead || n->op != KF_OP_DEQUANTIZE_LINEAR) continue;
        cr_assert(!kf_value_is_constant(c, n->in[0]), "a DequantizeLinear of a constant is left");
    }
    kf_model_free(c);
    int8_plan_matches_ref(QDQ_MIXED_WEIGHTS);
    kf_model_free(m);
}

/* ---- float8 products with weights scaled per column (kf_fuse_fp8) ---- */

/* A per-channel float8 dense layer (MatMul + bias + ReLU) and a Gemm with
 * transB and C, as `kfuse quantize --type fp8 --per-channel` and PyTorch's
 * Linear give them, on float8 inputs (codes the same on every backend;
 * rows enough that the H200 model keeps the products apart). */
#define FP8_PER_COLUMN                                                                                 \
    "opset 21\ninput xq float8e4m3fn[512, 64]\ninput rq float8e4m3fn[512, 256]\nconst sx float[] = 0.02\n"\
    "const w float[64, 256] = random\nconst sw float[256] = random\nconst b float[256] = random\n"     \
    "const v float[128, 256] = random\nconst sv float[128] = random\nconst c float[128] = random\n"    \
    "xd = DequantizeLinear(xq, sx)\n"                                                                 \
    "wq = QuantizeLinear(w, sw) {axis=1, output_dtype=17}\nwd = DequantizeLinear(wq, sw) {axis=1}\n"    \
    "y = MatMul(xd, wd)\nz = Add(y, b)\nr = Relu(z)\n"                                                 \
    "rd = DequantizeLinear(rq, sx)\n"                                                                 \
    "vq = QuantizeLinear(v, sv) {axis=0, output_dtype=17}\nvd = DequantizeLinear(vq, sv) {axis=0}\n"    \
    "g = Gemm(rd, vd, c) {transB=1}\noutput g\noutput r\n"

/* Both products run on the float8 values with unit scales and a Mul per
 * column after (Gemm's C after that), the same function up to rounding;
 * the products are then the library's float8 GEMMs. */
Test(pass_qint, fp8_per_column_products_scale_after) {
    kf_model *m = gt_parse(FP8_PER_COLUMN), *c = optimized_quantized(m);
    uint32_t n = 0;
    cr_assert_eq(kf_fuse_fp8(c, &n), KF_OK, "%s", kf_last_error());
    cr_assert_eq(n, 2, "%u rewritten", n);
    uint32_t products = 0;
    const kf_graph *g = c->graph;
    for (kf_id id = 1; id < g->nnodes; id++) products += kf_fp8_product(c, &g->nodes[id], NULL);
    cr_assert_eq(products, 2, "the rewritten products are float8 products of unit scales");
    cr_assert_eq(gt_count(c, "Mul"), 2);
    gt_expect_same_outputs(m, c, 1e-4, 1e-4);
    /* a second run has nothing left to rewrite */
    cr_assert_eq(kf_fuse_fp8(c, &n), KF_OK);
    cr_assert_eq(n, 0);
    kf_model_free(c);
    kf_model_free(m);
}

/* At FP8 the unit-scale products, their DequantizeLinears and the Mul by
 * the column scales stay float32 (their sums pass float16's range), the
 * rest is float16; on OpenCL with the host model of the library, the
 * products are its float8 GEMMs writing float32, and the outputs equal
 * the float model's at the float16 bound. */
Test(pass_qint, fp8_per_column_plan_keeps_the_sums_float32) {
    cgu_need_opencl();
    kf_model *m = gt_parse(FP8_PER_COLUMN), *c = optimized_quantized(m);
    cr_assert_eq(kf_precision_passes(c, KF_PRECISION_FP8, KF_EXEC_FOLD_CAP_BYTES, NULL), KF_OK, "%s", kf_last_error());
    const kf_graph *g = c->graph;
    uint32_t products = 0;
    for (kf_id id = 1; id < g->nnodes; id++) {
        const kf_node *nd = &g->nodes[id];
        if (!kf_fp8_product(c, nd, NULL)) continue;
        products++;
        cr_assert_eq(g->values[nd->out[0]].type.dtype, KF_DT_FLOAT, "node '%s': the sums are float32", kf_node_label(nd));
        cr_assert_eq(g->values[nd->in[0]].type.dtype, KF_DT_FLOAT);
        const kf_value *sums = &g->values[nd->out[0]];
        cr_assert_eq(sums->nusers, 1);
        const kf_node *mul = &g->nodes[sums->users[0]];
        cr_assert(mul->op == KF_OP_MUL && g->values[mul->out[0]].type.dtype == KF_DT_FLOAT, "the Mul is float32");
    }
    cr_assert_eq(products, 2);
    kf_model_free(c);
    char *trace = cgu_exec_host_lib_trace(m, m, KF_EXEC_OPENCL, KF_PRECISION_FP8);
    cr_assert_not_null(strstr(trace, "2 float8 products keep their weights (2 scaled per column after)"), "%s", trace);
    cr_assert_not_null(strstr(trace, "on float8e4m3fn weights + epilogue kernel"), "%s", trace);
    free(trace);
    kf_model_free(m);
}


/* A float model with float8 QDQ around two convolutions (weights per
 * output channel, then per tensor; the first's output requantized to E4M3
 * for the second) at precision fp8 on OpenCL: both keep their float8
 * weights, each runs as one float8 tile group with its two
 * DequantizeLinears, its bias, ReLU and requantization, and the outputs
 * match the reference on the same graph (the check's float8 floor after
 * the requantization). */
#define FP8_CONV_CHAIN                                                                                 \
    "opset 21\ninput x float[2, 16, 12, 12]\n"                                                         \
    "const w1 float[32, 16, 3, 3] = random\nconst w2 float[24, 32, 1, 1] = random\n"                   \
    "const sx float[] = 0.02\nconst s1 float[32] = 0.01 0.012 0.014 0.016\nconst s2 float[] = 0.015\n" \
    "const b1 float[32] = random\nconst b2 float[24] = random\nconst sh float[] = 0.1\n"                \
    "const z float8e4m3fn[] = 0\nconst z1 float8e4m3fn[32] = 0\n"                                       \
    "xq = QuantizeLinear(x, sx, z)\nxd = DequantizeLinear(xq, sx, z)\n"                                \
    "q1 = QuantizeLinear(w1, s1, z1) {axis=0}\nd1 = DequantizeLinear(q1, s1, z1) {axis=0}\n"           \
    "c1 = Conv(xd, d1, b1) {pads=[1,1,1,1]}\nr1 = Relu(c1)\n"                                          \
    "hq = QuantizeLinear(r1, sh, z)\nhd = DequantizeLinear(hq, sh, z)\n"                               \
    "q2 = QuantizeLinear(w2, s2, z)\nd2 = DequantizeLinear(q2, s2, z)\n"                               \
    "c2 = Conv(hd, d2, b2) {strides=[2,2]}\n"                                                          \
    "output c2\n"

/* The fp8 plan of m on OpenCL (library calls through their host model)
 * against the reference on m, three random inputs. */
static void fp8_exec_matches_ref(const kf_model *m) {
    setenv("KFUSE_LIBANCHOR_HOST", "1", 1);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_OPENCL;
    o.precision = KF_PRECISION_FP8;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref_requant(x, m, 3, KF_PRECISION_FP8);
    kf_exec_free(x);
}

/* Plans c (after the fp8 passes) for the H200 and checks that each float8
 * convolution runs as the float8 tile with both its DequantizeLinears in
 * its group; returns how many there are. */
static uint32_t fp8_convs_on_the_tile(kf_model *c) {
    const kf_graph *g = c->graph;
    kf_plan_options po = {.fuel = -1, .target = "h200"};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(c, &po, &p), KF_OK, "%s", kf_last_error());
    uint32_t convs = 0;
    for (kf_id id = 1; id < g->nnodes; id++) {
        const kf_node *nd = &g->nodes[id];
        if (!kf_fp8_conv(c, nd, NULL)) continue;
        convs++;
        uint32_t gi = p->group_of[id];
        for (int i = 0; i < 2; i++)
            cr_assert_eq(p->group_of[g->values[nd->in[i]].producer], gi, "node '%s': a DequantizeLinear is not in its group",
                         kf_node_label(nd));
        kf_cg_kernel k;
        cr_assert_eq(kf_cg_group(c, p, gi, &k), KF_OK, "%s", kf_last_error());
        cr_assert_str_eq(k.name, "kf_f8conv", "node '%s'", kf_node_label(nd));
        kf_cg_kernel_release(&k);
    }
    kf_plan_free(p);
    return convs;
}

Test(pass_qint, fp8_plan_runs_float8_convolutions_on_the_tile) {
    cgu_need_opencl();
    kf_model *m = gt_parse(FP8_CONV_CHAIN), *c = optimized_quantized(m);
    cr_assert_eq(kf_precision_passes(c, KF_PRECISION_FP8, KF_EXEC_FOLD_CAP_BYTES, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(fp8_convs_on_the_tile(c), 2);
    kf_model_free(c);
    uint32_t requant;
    cr_assert_eq(kf_run_output_requants(m, &requant), KF_OK);
    cr_assert(requant & KF_RUN_REQUANT_SMALL_FLOAT, "the output comes after a float8 requantization");
    fp8_exec_matches_ref(m);
    kf_model_free(m);
}

/* ResNet's downsampling block: the block's first conv and the shortcut
 * conv read one float8 DequantizeLinear. Each gets its own copy, so both
 * run as the float8 tile; a grouped conv reading it too (no float8 form)
 * keeps the original. */
Test(pass_qint, fp8_convolutions_sharing_their_input_each_get_its_dequantization) {
    cgu_need_opencl();
    kf_model *m = gt_parse("opset 21\ninput x float[2, 16, 12, 12]\n"
                           "const w1 float[32, 16, 3, 3] = random\nconst w2 float[24, 16, 1, 1] = random\n"
                           "const w3 float[16, 8, 3, 3] = random\n"
                           "const sx float[] = 0.02\nconst s1 float[] = 0.01\nconst s2 float[] = 0.015\n"
                           "const s3 float[] = 0.02\nconst b1 float[32] = random\n"
                           "const z float8e4m3fn[] = 0\n"
                           "xq = QuantizeLinear(x, sx, z)\nxd = DequantizeLinear(xq, sx, z)\n"
                           "q1 = QuantizeLinear(w1, s1, z)\nd1 = DequantizeLinear(q1, s1, z)\n"
                           "q2 = QuantizeLinear(w2, s2, z)\nd2 = DequantizeLinear(q2, s2, z)\n"
                           "q3 = QuantizeLinear(w3, s3, z)\nd3 = DequantizeLinear(q3, s3, z)\n"
                           "c1 = Conv(xd, d1, b1) {pads=[1,1,1,1], strides=[2,2]}\nr1 = Relu(c1)\n"
                           "c2 = Conv(xd, d2) {strides=[2,2]}\n"
                           "c3 = Conv(xd, d3) {pads=[1,1,1,1], group=2}\n"
                           "output r1, c2, c3\n");
    kf_model *c = optimized_quantized(m);
    kf_id xd = kf_graph_find(c->graph, "xd");
    cr_assert(xd && c->graph->values[xd].nusers == 3, "the three convs share xd before the pass");
    cr_assert_eq(kf_precision_passes(c, KF_PRECISION_FP8, KF_EXEC_FOLD_CAP_BYTES, NULL), KF_OK, "%s", kf_last_error());
    const kf_graph *g = c->graph;
    xd = kf_graph_find(g, "xd");
    cr_assert(xd && g->values[xd].nusers == 1, "the grouped conv alone keeps xd");
    cr_assert_eq(g->nodes[g->values[xd].users[0]].op, KF_OP_CONV);
    cr_assert_eq(kf_attr_i(&g->nodes[g->values[xd].users[0]], "group", 1), 2);
    cr_assert_eq(fp8_convs_on_the_tile(c), 2);
    kf_model_free(c);
    fp8_exec_matches_ref(m);
    kf_model_free(m);
}

/* The CLI on a model `kfuse quantize` wrote: an int8 plan passes --check
 * against the integer graph with nothing on the host; `fuse` writes it. */
static char bin[512], dir[256], out[8192];
static void cli_setup(void) { tu_cli_setup("pass_qint", bin, sizeof bin, dir, sizeof dir); }
static void cli_teardown(void) { tu_cli_dir_remove(dir); }
#define kfuse(...) tu_cli_runf(bin, out, sizeof out, __VA_ARGS__)

Test(pass_qint, cli_run_int8_check_on_a_quantized_model, .init = cli_setup, .fini = cli_teardown) {
    cgu_need_opencl();
    cr_assert_eq(kfuse("quantize %s/bench/models/small/resnet50/model.onnx -o %s/q.onnx --per-channel --random 2 "
                       "--dim batch=1", KF_SOURCE_DIR, dir), 0, "%s", out);
    cr_assert_eq(kfuse("run %s/q.onnx --backend opencl --check --precision int8 --dim batch=1", dir), 0, "%s", out);
    cr_assert_not_null(strstr(out, "0 on the reference evaluator (int8)"), "%s", out);
    cr_assert_not_null(strstr(out, "match ref (ref on the graph with integer anchors)"), "%s", out);
    cr_assert_eq(kfuse("fuse %s/q.onnx --precision int8 --dim batch=1 --json -o %s/f.onnx", dir, dir), 0, "%s", out);
    cr_assert_eq(kfuse("run %s/q.onnx --backend opencl --check --precision int8-fp16 --dim batch=1", dir), 0, "%s", out);
    cr_assert_not_null(strstr(out, "0 on the reference evaluator (int8-fp16)"), "%s", out);
}

/* The same for fp8 on a BERT `kfuse quantize --type fp8` wrote (weights per
 * tensor): the float8 products keep their float8 weights, those the cost
 * model gives the library run as its float8 GEMM (host model on OpenCL),
 * nothing runs on the host, and --check passes against the float model. */
Test(pass_qint, cli_run_fp8_check_on_a_float8_quantized_model, .init = cli_setup, .fini = cli_teardown) {
    cgu_need_opencl();
    cr_assert_eq(kfuse("quantize %s/bench/models/small/bert/model.onnx -o %s/q.onnx --type fp8 --random 2 "
                       "--dim batch=1 --dim seq=8", KF_SOURCE_DIR, dir), 0, "%s", out);
    char args[1024];
    snprintf(args, sizeof args, "run %s/q.onnx --backend opencl --check --precision fp8 --dim batch=1 --dim seq=8", dir);
    cr_assert_eq(tu_cli_run(bin, "KFUSE_LIBANCHOR_HOST=1 KFUSE_TRACE=backend", args, out, sizeof out), 0, "%s", out);
    /* 7 products of the file, and the two merged Q/K/V products (their
     * weights' per-tensor scales became per column) */
    cr_assert_not_null(strstr(out, "fp8: 9 float8 products keep their weights (2 scaled per column after)"), "%s", out);
    cr_assert_not_null(strstr(out, "on float8e4m3fn weights"), "%s", out);
    cr_assert_not_null(strstr(out, "0 on the reference evaluator (fp8)"), "%s", out);
    cr_assert_not_null(strstr(out, "outputs match ref (float16 tolerance"), "%s", out);
}
