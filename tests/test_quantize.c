/*
 * test_quantize.c: post-training quantization (fusion/quantize.c, `kfuse
 * quantize`). Quantized models run on the reference evaluator and stay
 * close to float (SQNR computed here, not by the code under test); weights
 * dequantize within half a step; per-channel scales are max|w| / 127 per
 * channel; the three methods clip a distribution with outliers
 * differently; --exclude keeps nodes float; fp8 writes float8e4m3fn Q/DQ;
 * the extra op types get Q/DQ; the committed small models quantize; bad
 * input gives typed errors.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_quantize.h"

/* Output SQNR bounds. 8-bit activations and weights keep each layer near
 * 40-50 dB on random data (6 dB per bit, less the clipping and the
 * rounding of both operands); a few layers in series lose a few dB. The
 * bounds leave room for that and for the spread of random weights. */
#define INT8_MIN_DB 30.0
/* The small graphs here are measured on their calibration samples, as
 * `kfuse quantize` reports: on fresh samples, values past the calibrated
 * range clip, and in these graphs (random weights of very different
 * channel sizes, a few hundred values per tensor) a fresh sample can reach
 * 2x past it: 15-38 dB measured over seeds on CONV_MODEL, nothing a test
 * can bound. */
/* float8e4m3fn has 3 mantissa bits: about 25-30 dB per rounding. */
#define FP8_MIN_DB 18.0

/* Random calibration samples for m's real inputs: floats in [-1, 1). */
static kf_tensor *random_sample(const kf_model *m, uint32_t *n) {
    kf_id *real;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, n), KF_OK);
    kf_tensor *t = calloc(*n + 1, sizeof(kf_tensor));
    for (uint32_t i = 0; i < *n; i++) {
        const kf_type *ty = &m->graph->values[real[i]].type;
        int64_t dims[KF_MAX_RANK];
        for (int d = 0; d < ty->rank; d++) dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : 2;
        t[i] = tu_rand(ty->dtype, ty->rank, dims, -1, 1);
    }
    free(real);
    return t;
}

static void free_sample(kf_tensor *t, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) kf_tensor_release(&t[i]);
    free(t);
}

/* Calibration samples per test graph */
#define CALIB_SAMPLES 8

/* The samples the last quantize() calibrated on (each test runs in a
 * process of its own) */
static kf_tensor *calib[CALIB_SAMPLES];
static uint32_t ncalib, calib_inputs;

/* Quantizes m on nsamples random samples with options o; the quantizer
 * (kept in *qout when not NULL) and the quantized model. */
static kf_model *quantize(kf_model *m, const kf_quant_options *o, int nsamples, kf_quantizer **qout) {
    kf_quantizer *q;
    cr_assert_eq(kf_quant_new(m, o, &q), KF_OK, "%s", kf_last_error());
    for (uint32_t s = 0; s < ncalib; s++) free_sample(calib[s], calib_inputs);
    ncalib = 0;
    for (int s = 0; s < nsamples; s++) {
        uint32_t n;
        kf_tensor *ins = random_sample(m, &n);
        cr_assert_eq(kf_quant_observe(q, ins, (int)n, NULL), KF_OK, "%s", kf_last_error());
        if (s < CALIB_SAMPLES) {
            calib[ncalib++] = ins;
            calib_inputs = n;
        } else
            free_sample(ins, n);
    }
    cr_assert_eq(kf_quant_finish(q), KF_OK, "%s", kf_last_error());
    kf_model *qm;
    cr_assert_eq(kf_quant_apply(q, &qm), KF_OK, "%s", kf_last_error());
    if (qout) *qout = q;
    else kf_quant_free(q);
    return qm;
}

/* SQNR in dB of qm's outputs against m's over the input sets
 * sets[0..nsets) (nin tensors each), computed here from both models'
 * outputs. */
static double sqnr_over(const kf_model *m, const kf_model *qm, kf_tensor *const *sets, uint32_t nsets, uint32_t nin) {
    double sig = 0, noise = 0;
    for (uint32_t k = 0; k < nsets; k++) {
        uint32_t no = m->graph->noutputs;
        kf_tensor *a = calloc(no + 1, sizeof(kf_tensor)), *b = calloc(no + 1, sizeof(kf_tensor));
        cr_assert_eq(kf_eval_model(m, sets[k], (int)nin, a, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_eval_model(qm, sets[k], (int)nin, b, NULL), KF_OK, "quantized model: %s", kf_last_error());
        for (uint32_t o = 0; o < no; o++) {
            cr_assert_eq(a[o].numel, b[o].numel);
            for (int64_t i = 0; i < a[o].numel; i++) {
                double r = kf_get_f64(&a[o], i), d = kf_get_f64(&b[o], i) - r;
                sig += r * r;
                noise += d * d;
            }
            kf_tensor_release(&a[o]);
            kf_tensor_release(&b[o]);
        }
        free(a);
        free(b);
    }
    cr_assert_gt(sig, 0, "the float outputs are all zero: the test would prove nothing");
    cr_assert_gt(noise, 0, "quantization changed nothing: Q/DQ are not in the path");
    return 10 * log10(sig / noise);
}

/* sqnr_over the last calibration samples */
static double output_sqnr(const kf_model *m, const kf_model *qm) { return sqnr_over(m, qm, calib, ncalib, calib_inputs); }

/* The node of qm with this name (asserts it exists). */
static const kf_node *node_named(const kf_model *qm, const char *name) {
    const kf_graph *g = qm->graph;
    for (kf_id i = 1; i < g->nnodes; i++)
        if (!g->nodes[i].dead && g->nodes[i].name && !strcmp(g->nodes[i].name, name)) return &g->nodes[i];
    cr_assert_fail("no node '%s'", name);
    return NULL;
}

/* The DequantizeLinear node producing input slot s of n, or NULL. */
static const kf_node *dq_of(const kf_model *qm, const kf_node *n, int s) {
    kf_id p = qm->graph->values[n->in[s]].producer;
    if (!p || strcmp(qm->graph->nodes[p].op_type, "DequantizeLinear")) return NULL;
    return &qm->graph->nodes[p];
}

static const kf_tensor *init_of(const kf_model *qm, kf_id v) {
    cr_assert(qm->graph->values[v].init, "'%s' is not an initializer", qm->graph->values[v].name);
    return qm->graph->values[v].init;
}

#define CONV_MODEL                                                                                                     \
    "input x float[2, 3, 10, 10]\n"                                                                                    \
    "const w1 float[8, 3, 3, 3] = random\n"                                                                            \
    "const b1 float[8] = random\n"                                                                                     \
    "const w2 float[4, 8, 3, 3] = random\n"                                                                            \
    "const w3 float[6, 100] = random\n"                                                                                \
    "const w4 float[6, 5] = random\n"                                                                                  \
    "c1 = Conv(x, w1, b1) {pads=[1,1,1,1]}\n"                                                                          \
    "r1 = Relu(c1)\n"                                                                                                  \
    "c2 = Conv(r1, w2) {strides=[2,2], pads=[1,1,1,1]}\n"                                                              \
    "f = Flatten(c2)\n"                                                                                                \
    "g = Gemm(f, w3) {transB=1}\n"                                                                                     \
    "y = MatMul(g, w4)\n"                                                                                              \
    "output y\n"

/* Gives every output channel of the weights its own magnitude (channel c
 * scaled by 1 + c), so per-channel and per-tensor scales differ. */
static void spread_channels(kf_model *m) {
    const char *names[] = {"w1", "w2", "w3", "w4"};
    for (int k = 0; k < 4; k++) {
        kf_tensor *t = m->graph->values[kf_graph_find(m->graph, names[k])].init;
        for (int64_t i = 0; i < t->numel; i++) {
            /* the output axis: 0 for Conv and Gemm with transB, 1 for MatMul */
            int64_t c = k == 3 ? i % t->dims[1] : i / (t->numel / t->dims[0]);
            kf_set_f64(t, i, kf_get_f64(t, i) * (1.0 + (double)c));
        }
    }
}

Test(quantize, conv_gemm_matmul_model_runs_with_int8_qdq) {
    kf_model *m = gt_parse(CONV_MODEL);
    spread_channels(m);
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.per_channel = true;
    kf_model *qm = quantize(m, &o, CALIB_SAMPLES, NULL);
    /* four activations (x, r1, f, g), four weights */
    cr_expect_eq(gt_count(qm, "QuantizeLinear"), 4);
    cr_expect_eq(gt_count(qm, "DequantizeLinear"), 8);
    const char *ops[] = {"c1", "c2", "g", "y"};
    for (int k = 0; k < 4; k++) {
        kf_id v = kf_graph_find(qm->graph, ops[k]);
        const kf_node *n = &qm->graph->nodes[qm->graph->values[v].producer];
        for (int s = 0; s < 2; s++) cr_expect(dq_of(qm, n, s), "%s input %d is not dequantized", ops[k], s);
        if (n->nin > 2) cr_expect_null(dq_of(qm, n, 2), "the bias must stay float");
    }
    const kf_node *xq = &qm->graph->nodes[qm->graph->values[kf_graph_find(qm->graph, "x_quantized")].producer];
    cr_expect_eq(qm->graph->values[xq->out[0]].type.dtype, KF_DT_UINT8, "activations are uint8");
    double db = output_sqnr(m, qm);
    cr_expect_gt(db, INT8_MIN_DB, "output SQNR %.2f dB", db);
    /* through ONNX and back: a standard file */
    void *data;
    size_t len;
    cr_assert_eq(kf_model_save_memory(qm, &data, &len), KF_OK, "%s", kf_last_error());
    kf_model *back;
    cr_assert_eq(kf_model_load_memory(data, len, NULL, &back), KF_OK, "%s", kf_last_error());
    free(data);
    cr_expect_eq(gt_count(back, "DequantizeLinear"), 8);
    kf_model_free(back);
    kf_model_free(qm);
    kf_model_free(m);
}

/* max |w| over the elements of channel c along axis (all when axis < 0) */
static double channel_max(const kf_tensor *w, int axis, int64_t c) {
    int64_t inner = 1;
    for (int d = axis + 1; axis >= 0 && d < w->rank; d++) inner *= w->dims[d];
    double mx = 0;
    for (int64_t i = 0; i < w->numel; i++)
        if (axis < 0 || (i / inner) % w->dims[axis] == c) mx = fmax(mx, fabs(kf_get_f64(w, i)));
    return mx;
}

/* Each quantized weight of qm: scale per channel equals max|w_c| / 127
 * (computed here from the float weight of m), int8 zero point 0, and
 * q * scale within half a step of w. */
static void check_weights(const kf_model *m, const kf_model *qm, bool per_channel) {
    const char *names[] = {"w1", "w2", "w3", "w4"};
    const int axes[] = {0, 0, 0, 1};
    for (int k = 0; k < 4; k++) {
        char dqname[64];
        snprintf(dqname, sizeof dqname, "%s_DequantizeLinear", names[k]);
        const kf_node *dq = node_named(qm, dqname);
        const kf_tensor *w = m->graph->values[kf_graph_find(m->graph, names[k])].init;
        const kf_tensor *wq = init_of(qm, dq->in[0]), *s = init_of(qm, dq->in[1]), *zp = init_of(qm, dq->in[2]);
        int axis = per_channel ? axes[k] : -1;
        cr_assert_eq(wq->dtype, KF_DT_INT8, "%s", names[k]);
        cr_assert_eq(s->numel, per_channel ? w->dims[axis] : 1, "%s: %lld scales", names[k], (long long)s->numel);
        cr_expect_eq(kf_attr_i(dq, "axis", -1), per_channel ? axis : -1, "%s axis", names[k]);
        for (int64_t c = 0; c < s->numel; c++) {
            double want = channel_max(w, axis, c) / 127.0, got = kf_get_f64(s, c);
            cr_expect(fabs(got - want) <= 1e-6 * want, "%s channel %lld: scale %.9g, max|w|/127 = %.9g", names[k],
                      (long long)c, got, want);
            cr_expect_eq(kf_get_i64(zp, c), 0);
        }
        int64_t inner = 1;
        for (int d = axis + 1; axis >= 0 && d < w->rank; d++) inner *= w->dims[d];
        int64_t worst = -1;
        for (int64_t i = 0; i < w->numel; i++) {
            double sc = kf_get_f64(s, axis >= 0 ? (i / inner) % w->dims[axis] : 0);
            double err = fabs(kf_get_i64(wq, i) * sc - kf_get_f64(w, i));
            if (err > sc * (0.5 + 1e-6) && worst < 0) worst = i;
        }
        cr_expect_eq(worst, -1, "%s element %lld dequantizes further than half a step", names[k], (long long)worst);
    }
}

Test(quantize, weights_dequantize_within_half_a_step_with_scales_per_channel) {
    kf_model *m = gt_parse(CONV_MODEL);
    spread_channels(m);
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.per_channel = true;
    kf_model *qm = quantize(m, &o, 1, NULL);
    check_weights(m, qm, true);
    kf_model_free(qm);
    kf_model_free(m);
}

Test(quantize, weights_per_tensor_without_per_channel) {
    kf_model *m = gt_parse(CONV_MODEL);
    spread_channels(m);
    kf_quant_options o;
    kf_quant_options_default(&o);
    kf_model *qm = quantize(m, &o, 1, NULL);
    check_weights(m, qm, false);
    /* per-channel scales fit channels of different sizes better: every
     * weight dequantizes closer to the float one */
    kf_quant_options_default(&o);
    o.per_channel = true;
    kf_model *pm = quantize(m, &o, 1, NULL);
    const char *names[] = {"w1", "w2", "w3", "w4"};
    for (int k = 0; k < 4; k++) {
        double err[2] = {0, 0};
        const kf_model *qs[2] = {qm, pm};
        char dqname[64];
        snprintf(dqname, sizeof dqname, "%s_DequantizeLinear", names[k]);
        const kf_tensor *w = m->graph->values[kf_graph_find(m->graph, names[k])].init;
        for (int v = 0; v < 2; v++) {
            const kf_node *dq = node_named(qs[v], dqname);
            kf_tensor deq = {0};
            const kf_tensor *in[3] = {init_of(qs[v], dq->in[0]), init_of(qs[v], dq->in[1]), init_of(qs[v], dq->in[2])};
            tu_eval(dq, 3, in, &deq);
            for (int64_t i = 0; i < w->numel; i++) err[v] += pow(kf_get_f64(&deq, i) - kf_get_f64(w, i), 2);
            kf_tensor_release(&deq);
        }
        cr_expect_lt(err[1], err[0], "%s: squared error per channel %g, per tensor %g", names[k], err[1], err[0]);
    }
    kf_model_free(pm);
    kf_model_free(qm);
    kf_model_free(m);
}

/* One sample of a normal-looking distribution (sums of uniforms) with a
 * few outliers at +-40, through a MatMul so x gets a Q/DQ pair; the
 * quantizer's chosen range [lo, hi] for x under method `method`. */
static void clip_range(kf_quant_method method, double *lo, double *hi, double *mn, double *mx) {
    kf_model *m = gt_parse("input x float[256, 256]\n"
                           "const w float[256, 4] = random\n"
                           "y = MatMul(x, w)\n"
                           "output y\n");
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.method = method;
    o.percentile = 99.9;
    kf_quantizer *q;
    cr_assert_eq(kf_quant_new(m, &o, &q), KF_OK, "%s", kf_last_error());
    int64_t dims[2] = {256, 256};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, 0, 1);
    for (int64_t i = 0; i < x.numel; i++)
        kf_set_f64(&x, i, tu_uniform(-1, 1) + tu_uniform(-1, 1) + tu_uniform(-1, 1) + tu_uniform(-1, 1));
    for (int k = 0; k < 12; k++) kf_set_f64(&x, 1000 * k + 7, k % 2 ? -40.0 : 40.0);
    /* a second, narrower sample: the histogram keeps both */
    kf_tensor x2 = tu_rand(KF_DT_FLOAT, 2, dims, -0.5, 0.5);
    cr_assert_eq(kf_quant_observe(q, &x2, 1, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_quant_observe(q, &x, 1, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_quant_finish(q), KF_OK, "%s", kf_last_error());
    uint32_t n;
    const kf_quant_act *a = kf_quant_acts(q, &n);
    cr_assert_eq(n, 1);
    *lo = a[0].lo, *hi = a[0].hi, *mn = a[0].min, *mx = a[0].max;
    /* the scale and zero point cover [lo, hi] in 255 steps, 0 exact */
    cr_expect(fabs(a[0].scale - (a[0].hi - a[0].lo) / 255.0) <= 1e-6 * a[0].scale);
    cr_expect(fabs(a[0].zero_point - (-a[0].lo / a[0].scale)) <= 0.5 + 1e-6);
    kf_tensor_release(&x);
    kf_tensor_release(&x2);
    kf_quant_free(q);
    kf_model_free(m);
}

Test(quantize, methods_clip_outliers_differently) {
    double lo[3], hi[3], mn, mx;
    for (int k = 0; k < 3; k++) clip_range((kf_quant_method)k, &lo[k], &hi[k], &mn, &mx);
    cr_expect_eq(mx, 40.0, "observed max %g", mx);
    cr_expect_eq(mn, -40.0, "observed min %g", mn);
    cr_expect_eq(hi[KF_QUANT_MINMAX], 40.0);
    cr_expect_eq(lo[KF_QUANT_MINMAX], -40.0);
    /* the bulk lies within +-4 (sums of four uniforms); 12 outliers in
     * 65536 values are past the 99.9th percentile */
    cr_expect(hi[KF_QUANT_PERCENTILE] < 5.0 && hi[KF_QUANT_PERCENTILE] > 1.5, "percentile hi %g", hi[KF_QUANT_PERCENTILE]);
    cr_expect(lo[KF_QUANT_PERCENTILE] > -5.0 && lo[KF_QUANT_PERCENTILE] < -1.5, "percentile lo %g", lo[KF_QUANT_PERCENTILE]);
    cr_expect(hi[KF_QUANT_ENTROPY] < 40.0 && hi[KF_QUANT_ENTROPY] > 1.0, "entropy hi %g", hi[KF_QUANT_ENTROPY]);
    cr_expect_neq(hi[KF_QUANT_ENTROPY], hi[KF_QUANT_PERCENTILE], "entropy and percentile chose the same %g",
                  hi[KF_QUANT_ENTROPY]);
}

/* A ReLU output: half its values exactly 0, the rest the positive half of
 * a bell curve. The entropy threshold must keep nearly all of them: the
 * spike at 0 once drove it to clip 13% of a layer's values. */
Test(quantize, entropy_is_not_misled_by_the_zeros_of_a_relu_output) {
    kf_model *m = gt_parse("input x float[256, 256]\n"
                           "const w float[256, 4] = random\n"
                           "y = MatMul(x, w)\n"
                           "output y\n");
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.method = KF_QUANT_ENTROPY;
    kf_quantizer *q;
    cr_assert_eq(kf_quant_new(m, &o, &q), KF_OK, "%s", kf_last_error());
    int64_t dims[2] = {256, 256};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, 0, 1);
    for (int64_t i = 0; i < x.numel; i++) {
        double v = tu_uniform(-1, 1) + tu_uniform(-1, 1) + tu_uniform(-1, 1) + tu_uniform(-1, 1);
        kf_set_f64(&x, i, v > 0 ? v : 0);
    }
    cr_assert_eq(kf_quant_observe(q, &x, 1, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_quant_finish(q), KF_OK, "%s", kf_last_error());
    uint32_t n;
    const kf_quant_act *a = kf_quant_acts(q, &n);
    int64_t above = 0;
    for (int64_t i = 0; i < x.numel; i++) above += kf_get_f64(&x, i) > a[0].hi;
    cr_expect_eq(a[0].lo, 0.0);
    cr_expect_lt(above, x.numel / 100, "entropy threshold %g clips %lld of %lld values (max %g)", a[0].hi,
                 (long long)above, (long long)x.numel, a[0].max);
    kf_tensor_release(&x);
    kf_quant_free(q);
    kf_model_free(m);
}

Test(quantize, exclude_keeps_nodes_float) {
    kf_model *m = gt_parse("input x float[2, 3, 8, 8]\n"
                           "const w1 float[4, 3, 3, 3] = random\n"
                           "const w2 float[4, 4, 1, 1] = random\n"
                           "const w3 float[4, 8] = random\n"
                           "a = Conv(x, w1) {pads=[1,1,1,1]}\n"
                           "b = Conv(a, w2)\n"
                           "p = GlobalAveragePool(b)\n"
                           "f = Flatten(p)\n"
                           "y = Gemm(f, w3)\n"
                           "output y\n");
    /* name the nodes as an exporter would */
    for (kf_id i = 1; i < m->graph->nnodes; i++) {
        kf_node *n = &m->graph->nodes[i];
        free(n->name);
        n->name = strdup(m->graph->values[n->out[0]].name);
        n->name[0] = (char)(n->name[0] - 'a' + 'A'); /* "A", "B", ... differ from the value names */
    }
    const char *ex[] = {"B", "Gemm", "NoSuchThing"};
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.exclude = ex;
    o.nexclude = 3;
    kf_quantizer *q;
    kf_model *qm = quantize(m, &o, CALIB_SAMPLES, &q);
    cr_expect(strstr(kf_quant_warnings(q), "'NoSuchThing'"), "warnings: %s", kf_quant_warnings(q));
    const kf_node *a = node_named(qm, "A"), *b = node_named(qm, "B"), *y = node_named(qm, "Y");
    cr_expect(dq_of(qm, a, 0) && dq_of(qm, a, 1), "conv A is quantized");
    cr_expect(!dq_of(qm, b, 0) && !dq_of(qm, b, 1), "conv B stays float");
    cr_expect(qm->graph->values[b->in[1]].init && qm->graph->values[b->in[1]].init->dtype == KF_DT_FLOAT);
    cr_expect(!dq_of(qm, y, 0) && !dq_of(qm, y, 1), "Gemm stays float");
    cr_expect_eq(gt_count(qm, "QuantizeLinear"), 1);
    double db = output_sqnr(m, qm);
    cr_expect_gt(db, INT8_MIN_DB, "output SQNR %.2f dB", db);
    kf_quant_free(q);
    kf_model_free(qm);
    kf_model_free(m);
}

Test(quantize, fp8_writes_float8e4m3fn_qdq_raises_the_opset_and_runs) {
    kf_model *m = gt_parse("opset 13\n" CONV_MODEL);
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.type = KF_QUANT_FP8;
    o.per_channel = true;
    kf_model *qm = quantize(m, &o, CALIB_SAMPLES, NULL);
    cr_expect_geq(kf_model_opset(qm, ""), 19);
    cr_expect_eq(gt_count(qm, "QuantizeLinear"), 4);
    int dqs = 0;
    for (kf_id i = 1; i < qm->graph->nnodes; i++) {
        const kf_node *n = &qm->graph->nodes[i];
        if (n->dead) continue;
        if (!strcmp(n->op_type, "QuantizeLinear"))
            cr_expect_eq(qm->graph->values[n->out[0]].type.dtype, KF_DT_FLOAT8E4M3FN);
        if (strcmp(n->op_type, "DequantizeLinear")) continue;
        dqs++;
        kf_id x = n->in[0];
        kf_dtype dt = qm->graph->values[x].init ? qm->graph->values[x].init->dtype : qm->graph->values[x].type.dtype;
        cr_expect_eq(dt, KF_DT_FLOAT8E4M3FN, "DequantizeLinear of %s", kf_dtype_name(dt));
        const kf_tensor *zp = init_of(qm, n->in[2]);
        cr_expect_eq(zp->dtype, KF_DT_FLOAT8E4M3FN);
        for (int64_t k = 0; k < zp->numel; k++) cr_expect_eq(kf_get_f64(zp, k), 0.0);
        /* scales: max / 448 */
        const kf_tensor *s = init_of(qm, n->in[1]);
        if (qm->graph->values[x].init) {
            const kf_tensor *wq = qm->graph->values[x].init;
            double mx = 0;
            for (int64_t k = 0; k < wq->numel; k++) mx = fmax(mx, fabs(kf_get_f64(wq, k)));
            cr_expect_eq(mx, 448.0, "a weight's largest code is the largest float8 (%g)", mx);
            cr_expect_gt(kf_get_f64(s, 0), 0);
        }
    }
    cr_expect_eq(dqs, 8);
    double db = output_sqnr(m, qm);
    cr_expect_gt(db, FP8_MIN_DB, "output SQNR %.2f dB", db);
    kf_model_free(qm);
    kf_model_free(m);
}

Test(quantize, included_op_types_get_qdq_on_their_float_inputs) {
    kf_model *m = gt_parse("input x float[2, 4, 8, 8]\n"
                           "input z float[2, 4, 8, 8]\n"
                           "const s float[4, 1, 1] = random\n"
                           "a = Add(x, z)\n"
                           "b = Mul(a, s)\n"
                           "c = Concat(b, x, z) {axis=1}\n"
                           "d = MaxPool(c) {kernel_shape=[2,2], strides=[2,2]}\n"
                           "e = AveragePool(d) {kernel_shape=[2,2], strides=[2,2]}\n"
                           "y = GlobalAveragePool(e)\n"
                           "output y\n");
    const char *inc[] = {"Add", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool"};
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.include = inc;
    o.ninclude = 6;
    kf_model *qm = quantize(m, &o, CALIB_SAMPLES, NULL);
    const char *outs[] = {"a", "b", "c", "d", "e", "y"};
    const int nin[] = {2, 1, 3, 1, 1, 1}; /* Mul's constant stays float */
    for (int k = 0; k < 6; k++) {
        const kf_node *n = &qm->graph->nodes[qm->graph->values[kf_graph_find(qm->graph, outs[k])].producer];
        for (int s = 0; s < nin[k]; s++) cr_expect(dq_of(qm, n, s), "%s input %d is not dequantized", n->op_type, s);
        if (k == 1) cr_expect_null(dq_of(qm, n, 1), "Mul's constant stays float");
    }
    /* x, z, a, b, c, d, e: one pair each, shared by every reader */
    cr_expect_eq(gt_count(qm, "QuantizeLinear"), 7);
    double db = output_sqnr(m, qm);
    cr_expect_gt(db, INT8_MIN_DB, "output SQNR %.2f dB", db);
    /* and an op type that cannot be quantized is refused by name */
    const char *bad[] = {"Softmax"};
    o.include = bad;
    o.ninclude = 1;
    kf_quantizer *q;
    cr_expect_eq(kf_quant_new(m, &o, &q), KF_ERR_INVALID_ARG);
    cr_expect(strstr(kf_last_error(), "Softmax"), "%s", kf_last_error());
    kf_model_free(qm);
    kf_model_free(m);
}

/* Concat's inputs past the third are quantized like the first ones, also
 * when those are constants. */
Test(quantize, concat_inputs_past_the_third_get_qdq) {
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "input z float[2, 3]\n"
                           "const a float[2, 3] = random\n"
                           "const b float[2, 3] = random\n"
                           "const c float[2, 3] = random\n"
                           "y = Concat(a, b, c, x, z) {axis=1}\n"
                           "output y\n");
    const char *inc[] = {"Concat"};
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.include = inc;
    o.ninclude = 1;
    kf_model *qm = quantize(m, &o, CALIB_SAMPLES, NULL);
    const kf_node *n = &qm->graph->nodes[qm->graph->values[kf_graph_find(qm->graph, "y")].producer];
    for (int s = 0; s < 3; s++) cr_expect_null(dq_of(qm, n, s), "constant input %d stays float", s);
    for (int s = 3; s < 5; s++) cr_expect(dq_of(qm, n, s), "input %d is not dequantized", s);
    cr_expect_eq(gt_count(qm, "QuantizeLinear"), 2);
    double db = output_sqnr(m, qm);
    cr_expect_gt(db, INT8_MIN_DB, "output SQNR %.2f dB", db);
    kf_model_free(qm);
    kf_model_free(m);
}

/* A committed small model: calibrated on its test data set, the quantized
 * model on the same inputs keeps its outputs within min_db of float; the
 * report agrees with the SQNR computed here. */
static void small_model(const char *name, double min_db) {
    char path[PATH_MAX], data[PATH_MAX];
    snprintf(path, sizeof path, "%s/bench/models/small/%s/model.onnx", tu_source_dir(), name);
    snprintf(data, sizeof data, "%s/bench/models/small/%s/test_data_set_0", tu_source_dir(), name);
    kf_model *m;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    kf_quant_options o;
    kf_quant_options_default(&o);
    o.per_channel = true;
    kf_quantizer *q;
    cr_assert_eq(kf_quant_new(m, &o, &q), KF_OK, "%s", kf_last_error());
    kf_id *real;
    uint32_t nreal;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &nreal), KF_OK);
    kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
    cr_assert(gt_load_dataset_inputs(m, data, ins, nreal, real), "%s", data);
    uint32_t no = m->graph->noutputs;
    kf_tensor *fo = calloc(no + 1, sizeof(kf_tensor));
    cr_assert_eq(kf_quant_observe(q, ins, (int)nreal, fo), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_quant_finish(q), KF_OK, "%s", kf_last_error());
    kf_model *qm;
    cr_assert_eq(kf_quant_apply(q, &qm), KF_OK, "%s", kf_last_error());
    uint32_t nn;
    kf_quant_nodes(q, &nn);
    cr_expect_eq(nn, gt_count(m, "Conv") + gt_count(m, "MatMul") + gt_count(m, "Gemm"), "%s: every Conv/MatMul/Gemm",
                 name);
    /* with the layers, and again from the outputs calibration kept: the same totals */
    kf_quant_report r = {0}, r2 = {0};
    cr_assert_eq(kf_quant_report_add(q, m, qm, ins, (int)nreal, NULL, true, &r), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_quant_report_add(q, m, qm, ins, (int)nreal, fo, false, &r2), KF_OK, "%s", kf_last_error());
    kf_quant_report_finish(&r);
    kf_quant_report_finish(&r2);
    cr_expect_eq(r.total.signal, r2.total.signal);
    cr_expect_eq(r.total.noise, r2.total.noise);
    kf_quant_report_release(&r2);
    for (uint32_t k = 0; k < no; k++) kf_tensor_release(&fo[k]);
    free(fo);
    double db = sqnr_over(m, qm, &ins, 1, nreal);
    cr_expect_gt(db, min_db, "%s: output SQNR %.2f dB", name, db);
    cr_expect(fabs(r.total.db - db) < 1e-6, "%s: report %.4f dB, computed %.4f dB", name, r.total.db, db);
    cr_expect_eq(r.nlayers, nn);
    for (uint32_t i = 1; i < r.nlayers; i++)
        cr_expect(!(r.layers[i].db < r.layers[i - 1].db), "%s: layers not sorted worst first", name);
    kf_quant_report_release(&r);
    for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
    free(ins);
    free(real);
    kf_quant_free(q);
    kf_model_free(qm);
    kf_model_free(m);
}

Test(quantize, small_resnet50) { small_model("resnet50", INT8_MIN_DB); }
Test(quantize, small_bert) { small_model("bert", INT8_MIN_DB); }
Test(quantize, small_mobilenetv2) { small_model("mobilenetv2", INT8_MIN_DB); }
/* 14 quantized matrix products in series with the residual stream, on one
 * sample: measured 30-31 dB; the bound leaves room */
Test(quantize, small_vit_b16) { small_model("vit_b16", 25.0); }
Test(quantize, small_gpt2) { small_model("gpt2", INT8_MIN_DB); }

/* ---- the CLI ---------------------------------------------------------------- */

static char bin[PATH_MAX], out[65536], dir[PATH_MAX];

static void cli_setup(void) { tu_cli_setup("quantize", bin, sizeof bin, dir, sizeof dir); }

static void cli_cleanup(void) { tu_cli_dir_remove(dir); }

#define kfuse(...) tu_cli_runf(bin, out, sizeof out, __VA_ARGS__)

#define SMALL KF_SOURCE_DIR "/bench/models/small"

Test(quantize, cli_calib_folder_report_and_summary, .init = cli_setup, .fini = cli_cleanup) {
    cr_assert_eq(kfuse("quantize %s/resnet50/model.onnx -o %s/q.onnx --calib %s/resnet50 --per-channel --report", SMALL,
                       dir, SMALL),
                 0, "%s", out);
    cr_expect(strstr(out, "calibrating sample 1/1"), "%s", out);
    cr_expect(strstr(out, "54 of 54 Conv/MatMul/Gemm"), "%s", out);
    cr_expect(strstr(out, "output SQNR"), "%s", out);
    cr_expect(strstr(out, "/layer1/layer1.0/conv1/Conv"), "the per-layer table: %s", out);
    /* the written model runs on ref */
    cr_assert_eq(kfuse("run %s/q.onnx --inputs %s/resnet50/test_data_set_0", dir, SMALL), 0, "%s", out);
}

Test(quantize, cli_random_exclude_warning_and_method, .init = cli_setup, .fini = cli_cleanup) {
    cr_assert_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --random 2 --seed 5 --method entropy --exclude Nope "
                       "--exclude MatMul",
                       SMALL, dir),
                 0, "%s", out);
    cr_expect(strstr(out, "warning: --exclude 'Nope'"), "%s", out);
    cr_expect(strstr(out, "calibrating sample 2/2"), "%s", out);
    cr_expect(strstr(out, "entropy"), "%s", out);
}

Test(quantize, cli_bad_input_is_a_typed_error, .init = cli_setup, .fini = cli_cleanup) {
    /* resnet's inputs given to bert: the message names the file or input */
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --calib %s/resnet50/test_data_set_0", SMALL, dir, SMALL),
                 3, "%s", out);
    cr_expect(strstr(out, "resnet50/test_data_set_0"), "%s", out);
    /* a folder without samples */
    char empty[PATH_MAX + 8];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "mkdir '%s'", empty);
    cr_assert_eq(system(cmd), 0);
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --calib %s", SMALL, dir, empty), 3, "%s", out);
    cr_expect(strstr(out, "holds no sample"), "%s", out);
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --calib %s/nope", SMALL, dir, dir), 3, "%s", out);
    /* usage errors */
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --include Softmax", SMALL, dir), 2, "%s", out);
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --method median", SMALL, dir), 2, "%s", out);
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --random 2 --calib %s", SMALL, dir, dir), 2, "%s", out);
    cr_expect_eq(kfuse("quantize %s/bert/model.onnx -o %s/q.onnx --percentile 30", SMALL, dir), 2, "%s", out);
    /* a file that is not a model */
    cr_expect_eq(kfuse("quantize %s/bert/test_data_set_0/input_0.pb -o %s/q.onnx", SMALL, dir), 3, "%s", out);
}
