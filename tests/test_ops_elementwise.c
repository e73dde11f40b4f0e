/* test_ops_elementwise.c: the elementwise family (ops_elementwise*.c)
 * against references written out here: libm formulas for unary ops,
 * hand-indexed broadcasting for binary/variadic ops, hand-computed integer
 * edge cases, numpy's printing for Cast to/from strings, and the errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---- helpers -------------------------------------------------------------- */

static kf_node *mk(const char *op, int nin, int64_t opset) {
    kf_node *n = tu_node(op, nin, 1, opset);
    cr_assert_neq(n->op, 0, "%s is in the op table", op);
    return n;
}

static kf_tensor eval_n(const kf_node *n, int nin, const kf_tensor *const *in) {
    kf_tensor out = {0};
    tu_eval(n, nin, in, &out);
    return out;
}

static void expect_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol,
                         const char *what) {
    char why[256];
    cr_assert(tu_close(got, want, atol, rtol, why, sizeof why), "%s: %s", what, why);
}

/* The node fails with code and a message naming it. */
static void expect_fail(kf_node *n, int nin, const kf_tensor *const *in, kf_status code) {
    free(n->name);
    n->name = strdup("the_node");
    kf_tensor out = {0};
    kf_status st = kf_eval_node(n, nin, in, &out);
    cr_assert_eq(st, code, "%s: status %d, expected %d (%s)", n->op_type, st, code, kf_last_error());
    cr_assert(strstr(kf_last_error(), "the_node") != NULL, "message names the node: %s", kf_last_error());
    kf_tensor_release(&out);
}

/* Offset in t of output multi-index idx (rank orank), numpy alignment. */
static int64_t bidx(const kf_tensor *t, const int64_t *idx, int orank) {
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) {
        int64_t i = t->dims[d] == 1 ? 0 : idx[orank - t->rank + d];
        off = off * t->dims[d] + i;
    }
    return off;
}

/* Integral values in [lo, hi] stored in dtype dt, so comparisons hit equality. */
static kf_tensor rand_small(kf_dtype dt, int rank, const int64_t *dims, int lo, int hi) {
    kf_tensor t = tu_rand(dt, rank, dims, lo, hi + 1);
    for (int64_t i = 0; i < t.numel; i++) kf_set_f64(&t, i, floor(kf_get_f64(&t, i)));
    return t;
}

static kf_tensor alloc_like(kf_dtype dt, int rank, const int64_t *dims) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, dt, rank, dims), KF_OK);
    return t;
}

static kf_tensor str_tensor(int count, const char *const *s) {
    int64_t d[1] = {count};
    kf_tensor t = alloc_like(KF_DT_STRING, 1, d);
    kf_bytes *b = t.data;
    for (int i = 0; i < count; i++) {
        b[i].len = strlen(s[i]);
        b[i].ptr = strdup(s[i]);
    }
    return t;
}

static void release(int count, kf_tensor *t) {
    for (int i = 0; i < count; i++) kf_tensor_release(&t[i]);
}

/* ---- unary ops against libm formulas ---------------------------------------- */

static double r_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_hsig(double x) { return fmax(0, fmin(1, (double)0.2f * x + 0.5)); }
static double r_hswish(double x) { return x * fmax(0, fmin(1, x / 6 + 0.5)); }
static double r_relu(double x) { return x > 0 ? x : 0; }
static double r_leaky(double x) { return x > 0 ? x : (double)0.01f * x; }
static double r_elu(double x) { return x > 0 ? x : exp(x) - 1; }
static double r_selu(double x) { /* the defaults are float attributes */
    const double g = (float)1.0507009873554804934193349852946, a = (float)1.6732632423543772848170429916717;
    return x > 0 ? g * x : g * a * (exp(x) - 1);
}
static double r_celu(double x) { return fmax(0, x) + fmin(0, exp(x) - 1); }
static double r_thr(double x) { return x > 1 ? x : 0; }
static double r_softplus(double x) { return log(exp(x) + 1); }
static double r_softsign(double x) { return x / (1 + fabs(x)); }
static double r_mish(double x) { return x * tanh(log(1 + exp(x))); }
static double r_gelu(double x) { return x * 0.5 * (1 + erf(x / sqrt(2))); }
static double r_shrink(double x) { return x < -0.5 ? x : x > 0.5 ? x : 0; }
static double r_swish(double x) { return x / (1 + exp(-x)); }
static double r_neg(double x) { return -x; }
static double r_recip(double x) { return 1 / x; }

static const struct {
    const char *op;
    int64_t opset;
    double (*ref)(double);
    double lo, hi;
} unary[] = {
    {"Abs", 13, fabs, -5, 5},          {"Neg", 13, r_neg, -5, 5},
    {"Reciprocal", 13, r_recip, 0.5, 5}, {"Floor", 13, floor, -5, 5},
    {"Ceil", 13, ceil, -5, 5},         {"Round", 11, nearbyint, -5, 5},
    {"Sqrt", 13, sqrt, 0.01, 9},       {"Exp", 13, exp, -5, 5},
    {"Log", 13, log, 0.01, 9},         {"Sin", 7, sin, -5, 5},
    {"Cos", 7, cos, -5, 5},            {"Tan", 7, tan, -1.5, 1.5},
    {"Asin", 7, asin, -0.99, 0.99},    {"Acos", 7, acos, -0.99, 0.99},
    {"Atan", 7, atan, -5, 5},          {"Sinh", 9, sinh, -3, 3},
    {"Cosh", 9, cosh, -3, 3},          {"Tanh", 13, tanh, -3, 3},
    {"Asinh", 9, asinh, -5, 5},        {"Acosh", 9, acosh, 1.01, 5},
    {"Atanh", 9, atanh, -0.99, 0.99},  {"Erf", 13, erf, -3, 3},
    {"Sign", 13, r_sign, -5, 5},       {"Sigmoid", 13, r_sigmoid, -8, 8},
    {"HardSigmoid", 6, r_hsig, -4, 4}, {"HardSwish", 14, r_hswish, -5, 5},
    {"Relu", 14, r_relu, -5, 5},       {"LeakyRelu", 16, r_leaky, -5, 5},
    {"Elu", 6, r_elu, -5, 5},          {"Selu", 6, r_selu, -5, 5},
    {"Celu", 12, r_celu, -5, 5},       {"ThresholdedRelu", 10, r_thr, -3, 3},
    {"Softplus", 1, r_softplus, -8, 8}, {"Softsign", 1, r_softsign, -5, 5},
    {"Mish", 18, r_mish, -5, 5},       {"Gelu", 20, r_gelu, -4, 4},
    {"Shrink", 9, r_shrink, -2, 2},    {"Swish", 24, r_swish, -6, 6},
};

Test(ew_unary, every_float_op_matches_its_formula) {
    const kf_dtype dts[3] = {KF_DT_FLOAT, KF_DT_DOUBLE, KF_DT_FLOAT16};
    const double tol[3][2] = {{1e-6, 1e-5}, {1e-12, 1e-12}, {1e-3, 1e-3}};
    for (size_t u = 0; u < sizeof unary / sizeof unary[0]; u++) {
        for (int k = 0; k < 3; k++) {
            int64_t dims[2] = {3, 7};
            kf_tensor x = tu_rand(dts[k], 2, dims, unary[u].lo, unary[u].hi);
            kf_tensor want = alloc_like(dts[k], 2, dims);
            for (int64_t i = 0; i < x.numel; i++) kf_set_f64(&want, i, unary[u].ref(kf_get_f64(&x, i)));
            kf_node *n = mk(unary[u].op, 1, unary[u].opset);
            const kf_tensor *in[1] = {&x};
            kf_tensor got = eval_n(n, 1, in);
            char what[64];
            snprintf(what, sizeof what, "%s on %s", unary[u].op, kf_dtype_name(dts[k]));
            /* float16 inputs are rounded, so compare against the same inputs */
            expect_close(&got, &want, tol[k][0], tol[k][1], what);
            tu_node_free(n);
            kf_tensor_release(&x);
            kf_tensor_release(&want);
            kf_tensor_release(&got);
        }
    }
}

/* Swish (24) reads alpha; SwiGLU (28) is Swish of the gate times the
 * value, with the same alpha, and refuses shapes that would broadcast. */
Test(ew_unary, swish_and_swiglu_with_alpha) {
    int64_t dims[2] = {5, 9}, row[1] = {9};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 2, dims, -6, 6), b = tu_rand(KF_DT_FLOAT, 2, dims, -3, 3);
    float alpha = (float)tu_uniform(0.3, 2.5);
    for (int glu = 0; glu < 2; glu++) {
        kf_node *n = mk(glu ? "SwiGLU" : "Swish", glu ? 2 : 1, glu ? 28 : 24);
        tu_attr_f(n, "alpha", alpha);
        const kf_tensor *in[2] = {&a, &b};
        kf_tensor got = eval_n(n, glu ? 2 : 1, in);
        kf_tensor want = alloc_like(KF_DT_FLOAT, 2, dims);
        for (int64_t i = 0; i < a.numel; i++) {
            double x = kf_get_f64(&a, i), s = x / (1 + exp(-(double)alpha * x));
            kf_set_f64(&want, i, glu ? s * kf_get_f64(&b, i) : s);
        }
        expect_close(&got, &want, 1e-6, 1e-5, glu ? "SwiGLU" : "Swish");
        tu_node_free(n);
        kf_tensor_release(&got);
        kf_tensor_release(&want);
    }
    kf_tensor r = tu_rand(KF_DT_FLOAT, 1, row, -1, 1);
    kf_node *n = mk("SwiGLU", 2, 28);
    const kf_tensor *bad[2] = {&a, &r};
    expect_fail(n, 2, bad, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor i32 = tu_rand(KF_DT_INT32, 2, dims, -5, 5);
    n = mk("Swish", 1, 24);
    const kf_tensor *ints[1] = {&i32};
    expect_fail(n, 1, ints, KF_ERR_SHAPE);
    tu_node_free(n);
    release(1, &a), release(1, &b), release(1, &r), release(1, &i32);
}

Test(ew_unary, activations_read_their_attributes) {
    int64_t dims[1] = {40};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 1, dims, -4, 4);
    double alpha = tu_uniform(0.1, 2), beta = tu_uniform(0.1, 0.9), gamma = tu_uniform(0.5, 2);
    const char *ops[] = {"LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "ThresholdedRelu", "Shrink", "Gelu"};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        kf_node *n = mk(ops[o], 1, 20);
        const char *op = ops[o];
        if (strcmp(op, "Shrink") == 0) {
            tu_attr_f(n, "lambd", (float)alpha);
            tu_attr_f(n, "bias", (float)beta);
        } else if (strcmp(op, "Gelu") == 0) {
            tu_attr_s(n, "approximate", "tanh");
        } else {
            tu_attr_f(n, "alpha", (float)alpha);
            tu_attr_f(n, "beta", (float)beta);
            tu_attr_f(n, "gamma", (float)gamma);
        }
        double a = (float)alpha, b = (float)beta, g = (float)gamma;
        kf_tensor want = alloc_like(KF_DT_FLOAT, 1, dims);
        for (int64_t i = 0; i < x.numel; i++) {
            double v = kf_get_f64(&x, i), r = 0;
            if (strcmp(op, "LeakyRelu") == 0) r = v >= 0 ? v : a * v;
            else if (strcmp(op, "Elu") == 0) r = v >= 0 ? v : a * (exp(v) - 1);
            else if (strcmp(op, "Selu") == 0) r = v > 0 ? g * v : g * (a * exp(v) - a);
            else if (strcmp(op, "Celu") == 0) r = fmax(0, v) + fmin(0, a * (exp(v / a) - 1));
            else if (strcmp(op, "HardSigmoid") == 0) r = fmax(0, fmin(1, a * v + b));
            else if (strcmp(op, "ThresholdedRelu") == 0) r = v > a ? v : 0;
            else if (strcmp(op, "Shrink") == 0) r = v < -a ? v + b : v > a ? v - b : 0;
            else r = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * pow(v, 3))));
            kf_set_f64(&want, i, r);
        }
        const kf_tensor *in[1] = {&x};
        kf_tensor got = eval_n(n, 1, in);
        expect_close(&got, &want, 1e-6, 1e-5, op);
        tu_node_free(n);
        kf_tensor_release(&want);
        kf_tensor_release(&got);
    }
    kf_tensor_release(&x);
}

Test(ew_unary, round_ties_go_to_even_and_specials) {
    int64_t d[1] = {7};
    float xs[7] = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 2.4f, -2.6f};
    float want[7] = {0, 2, 2, -0.0f, -2, 2, -3};
    kf_tensor x = tu_f32(1, d, xs), w = tu_f32(1, d, want);
    kf_node *n = mk("Round", 1, 11);
    const kf_tensor *in[1] = {&x};
    kf_tensor got = eval_n(n, 1, in);
    expect_close(&got, &w, 0, 0, "Round");
    tu_node_free(n);
    release(1, &got);

    float sp[4] = {NAN, INFINITY, -INFINITY, 1.0f};
    int64_t d4[1] = {4};
    kf_tensor s = tu_f32(1, d4, sp);
    const kf_tensor *sin[1] = {&s};
    n = mk("IsNaN", 1, 13);
    got = eval_n(n, 1, sin);
    cr_assert_eq(got.dtype, KF_DT_BOOL);
    cr_assert(kf_get_i64(&got, 0) == 1 && kf_get_i64(&got, 1) == 0 && kf_get_i64(&got, 3) == 0);
    tu_node_free(n);
    kf_tensor_release(&got);
    const int64_t pos_neg[3][2] = {{1, 1}, {1, 0}, {0, 1}};
    for (int k = 0; k < 3; k++) {
        n = mk("IsInf", 1, 10);
        tu_attr_i(n, "detect_positive", pos_neg[k][0]);
        tu_attr_i(n, "detect_negative", pos_neg[k][1]);
        got = eval_n(n, 1, sin);
        cr_assert_eq(kf_get_i64(&got, 0), 0);
        cr_assert_eq(kf_get_i64(&got, 1), pos_neg[k][0]);
        cr_assert_eq(kf_get_i64(&got, 2), pos_neg[k][1]);
        cr_assert_eq(kf_get_i64(&got, 3), 0);
        tu_node_free(n);
        kf_tensor_release(&got);
    }
    /* NaN stays NaN through Relu, Sign, Clip and Max */
    n = mk("Relu", 1, 14);
    got = eval_n(n, 1, sin);
    cr_assert(isnan(kf_get_f64(&got, 0)));
    cr_assert_eq(kf_get_f64(&got, 2), 0);
    tu_node_free(n);
    kf_tensor_release(&got);
    release(1, &x), release(1, &w), release(1, &s);
}

Test(ew_unary, integer_abs_neg_sign_relu_bitwise_not_are_exact) {
    int64_t d[1] = {6};
    int64_t xs[6] = {INT64_MIN, -((int64_t)1 << 60) - 1, -7, 0, 9, ((int64_t)1 << 60) + 3};
    kf_tensor x = tu_i64(1, d, xs);
    const kf_tensor *in[1] = {&x};
    const char *ops[5] = {"Abs", "Neg", "Sign", "Relu", "BitwiseNot"};
    for (int o = 0; o < 5; o++) {
        kf_node *n = mk(ops[o], 1, 18);
        kf_tensor got = eval_n(n, 1, in);
        for (int i = 0; i < 6; i++) {
            int64_t v = xs[i], w;
            uint64_t uv = (uint64_t)v;
            if (o == 0) w = v < 0 ? (int64_t)(0 - uv) : v; /* INT64_MIN stays (wraps) */
            else if (o == 1) w = (int64_t)(0 - uv);
            else if (o == 2) w = v > 0 ? 1 : v < 0 ? -1 : 0;
            else if (o == 3) w = v > 0 ? v : 0;
            else w = ~v;
            cr_assert_eq(kf_get_i64(&got, i), w, "%s(%lld) = %lld, expected %lld", ops[o], (long long)v,
                         (long long)kf_get_i64(&got, i), (long long)w);
        }
        tu_node_free(n);
        kf_tensor_release(&got);
    }
    /* random int8 / uint16 through Abs and BitwiseNot */
    int64_t dd[1] = {50};
    kf_tensor a = tu_rand(KF_DT_INT8, 1, dd, -128, 128), b = tu_rand(KF_DT_UINT16, 1, dd, 0, 65536);
    kf_node *n = mk("Abs", 1, 13), *m = mk("BitwiseNot", 1, 18);
    const kf_tensor *ia[1] = {&a}, *ib[1] = {&b};
    kf_tensor ga = eval_n(n, 1, ia), gb = eval_n(m, 1, ib);
    for (int i = 0; i < 50; i++) {
        int8_t v = (int8_t)kf_get_i64(&a, i);
        cr_assert_eq((int8_t)kf_get_i64(&ga, i), (int8_t)(v < 0 ? -v : v));
        cr_assert_eq((uint16_t)kf_get_i64(&gb, i), (uint16_t)~(uint16_t)kf_get_i64(&b, i));
    }
    tu_node_free(n), tu_node_free(m);
    release(1, &x), release(1, &a), release(1, &b), release(1, &ga), release(1, &gb);
}

Test(ew_unary, not_flips_booleans) {
    int64_t d[2] = {4, 5};
    kf_tensor x = rand_small(KF_DT_BOOL, 2, d, 0, 1);
    kf_node *n = mk("Not", 1, 1);
    const kf_tensor *in[1] = {&x};
    kf_tensor got = eval_n(n, 1, in);
    cr_assert_eq(got.dtype, KF_DT_BOOL);
    for (int64_t i = 0; i < x.numel; i++) cr_assert_eq(kf_get_i64(&got, i), !kf_get_i64(&x, i));
    tu_node_free(n);
    release(1, &x), release(1, &got);
}

/* ---- binary ops with broadcasting ------------------------------------------- */

static double b_add(double a, double b) { return a + b; }
static double b_sub(double a, double b) { return a - b; }
static double b_mul(double a, double b) { return a * b; }
static double b_div(double a, double b) { return a / b; }
static double b_pow(double a, double b) { return exp(b * log(a)); }
static double b_fmod(double a, double b) { return a - b * trunc(a / b); }
static double b_eq(double a, double b) { return a == b; }
static double b_lt(double a, double b) { return a < b; }
static double b_gt(double a, double b) { return a > b; }
static double b_le(double a, double b) { return a <= b; }
static double b_ge(double a, double b) { return a >= b; }
static double b_max(double a, double b) { return a > b ? a : b; }
static double b_min(double a, double b) { return a < b ? a : b; }
static double b_mean(double a, double b) { return (a + b) / 2; }
static double b_prelu(double a, double b) { return a >= 0 ? a : a * b; }

static const struct {
    const char *op;
    double (*ref)(double, double);
    bool boolean, small;
    double lo, hi;
} binary[] = {
    {"Add", b_add, false, false, -5, 5},  {"Sub", b_sub, false, false, -5, 5},
    {"Mul", b_mul, false, false, -5, 5},  {"Div", b_div, false, false, 0.5, 5},
    {"Pow", b_pow, false, false, 0.1, 3}, {"Mod", b_fmod, false, false, 0.5, 5},
    {"Equal", b_eq, true, true, -2, 2},   {"Less", b_lt, true, true, -2, 2},
    {"Greater", b_gt, true, true, -2, 2}, {"LessOrEqual", b_le, true, true, -2, 2},
    {"GreaterOrEqual", b_ge, true, true, -2, 2},
    {"Max", b_max, false, false, -5, 5},  {"Min", b_min, false, false, -5, 5},
    {"Sum", b_add, false, false, -5, 5},  {"Mean", b_mean, false, false, -5, 5},
    {"PRelu", b_prelu, false, false, -5, 5},
};

Test(ew_binary, float_ops_broadcast_like_numpy) {
    /* a [2,3,4] with b [3,1]: b repeats along dims 0 and 2 */
    int64_t da[3] = {2, 3, 4}, db[2] = {3, 1};
    const kf_dtype dts[2] = {KF_DT_FLOAT, KF_DT_DOUBLE};
    for (size_t o = 0; o < sizeof binary / sizeof binary[0]; o++) {
        for (int k = 0; k < 2; k++) {
            kf_tensor a, b;
            if (binary[o].small) {
                a = rand_small(dts[k], 3, da, -2, 2);
                b = rand_small(dts[k], 2, db, -2, 2);
            } else {
                a = tu_rand(dts[k], 3, da, binary[o].lo, binary[o].hi);
                b = tu_rand(dts[k], 2, db, binary[o].lo, binary[o].hi);
                if (strcmp(binary[o].op, "PRelu") == 0) /* x of both signs */
                    for (int64_t i = 0; i < a.numel; i++) kf_set_f64(&a, i, kf_get_f64(&a, i) * (i % 2 ? -1 : 1));
            }
            kf_tensor want = alloc_like(binary[o].boolean ? KF_DT_BOOL : dts[k], 3, da);
            int64_t idx[3];
            for (idx[0] = 0; idx[0] < 2; idx[0]++)
                for (idx[1] = 0; idx[1] < 3; idx[1]++)
                    for (idx[2] = 0; idx[2] < 4; idx[2]++) {
                        double x = kf_get_f64(&a, bidx(&a, idx, 3)), y = kf_get_f64(&b, bidx(&b, idx, 3));
                        kf_set_f64(&want, (idx[0] * 3 + idx[1]) * 4 + idx[2], binary[o].ref(x, y));
                    }
            kf_node *n = mk(binary[o].op, 2, 16);
            if (strcmp(binary[o].op, "Mod") == 0) tu_attr_i(n, "fmod", 1);
            const kf_tensor *in[2] = {&a, &b};
            kf_tensor got = eval_n(n, 2, in);
            char what[64];
            snprintf(what, sizeof what, "%s on %s", binary[o].op, kf_dtype_name(dts[k]));
            expect_close(&got, &want, 1e-6, 1e-5, what);
            tu_node_free(n);
            release(1, &a), release(1, &b), release(1, &want), release(1, &got);
        }
    }
}

/* Python's %: the sign of the divisor. */
static int64_t py_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

Test(ew_binary, integer_ops_are_exact_and_wrap) {
    int64_t d[1] = {64};
    kf_tensor a = tu_rand(KF_DT_INT32, 1, d, -1000, 1000), b = tu_rand(KF_DT_INT32, 1, d, -20, 20);
    kf_set_f64(&b, 0, 0); /* division by zero is defined as 0 */
    kf_set_f64(&a, 1, -2147483648.0);
    kf_set_f64(&b, 1, -1); /* INT32_MIN / -1 wraps */
    kf_set_f64(&a, 2, 2147483647.0);
    kf_set_f64(&b, 2, 7); /* the product wraps */
    const char *ops[] = {"Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Equal", "Less", "Greater",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor"};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (int fm = 0; fm < (strcmp(ops[o], "Mod") == 0 ? 2 : 1); fm++) {
            kf_node *n = mk(ops[o], 2, 18);
            if (fm) tu_attr_i(n, "fmod", 1);
            const kf_tensor *in[2] = {&a, &b};
            kf_tensor got = eval_n(n, 2, in);
            for (int i = 0; i < 64; i++) {
                int32_t x = (int32_t)kf_get_i64(&a, i), y = (int32_t)kf_get_i64(&b, i);
                int64_t w;
                switch (o) {
                case 0: w = (int32_t)((uint32_t)x + (uint32_t)y); break;
                case 1: w = (int32_t)((uint32_t)x - (uint32_t)y); break;
                case 2: w = (int32_t)((uint32_t)x * (uint32_t)y); break;
                case 3: w = y == 0 ? 0 : (y == -1 ? (int32_t)(0 - (uint32_t)x) : x / y); break;
                case 4: w = y == 0 ? 0 : fm ? (int64_t)x % y : py_mod(x, y); break;
                case 5: w = x > y ? x : y; break;
                case 6: w = x < y ? x : y; break;
                case 7: w = x == y; break;
                case 8: w = x < y; break;
                case 9: w = x > y; break;
                case 10: w = x & y; break;
                case 11: w = x | y; break;
                default: w = x ^ y; break;
                }
                cr_assert_eq(kf_get_i64(&got, i), w, "%s%s(%d, %d) = %lld, expected %lld", ops[o],
                             fm ? "[fmod]" : "", x, y, (long long)kf_get_i64(&got, i), (long long)w);
            }
            tu_node_free(n);
            kf_tensor_release(&got);
        }
    }
    release(1, &a), release(1, &b);
}

Test(ew_binary, int64_beyond_2_53_and_uint64_above_2_63_stay_exact) {
    int64_t d[1] = {3};
    int64_t av[3] = {((int64_t)1 << 60) + 1, INT64_MIN, 9007199254740993};
    int64_t bv[3] = {3, -1, 1};
    kf_tensor a = tu_i64(1, d, av), b = tu_i64(1, d, bv);
    const kf_tensor *in[2] = {&a, &b};
    kf_node *n = mk("Add", 2, 14);
    kf_tensor got = eval_n(n, 2, in);
    cr_assert_eq(kf_get_i64(&got, 0), ((int64_t)1 << 60) + 4);
    cr_assert_eq(kf_get_i64(&got, 2), 9007199254740994);
    tu_node_free(n), kf_tensor_release(&got);
    n = mk("Div", 2, 14);
    got = eval_n(n, 2, in);
    cr_assert_eq(kf_get_i64(&got, 1), INT64_MIN, "INT64_MIN / -1 wraps");
    tu_node_free(n), kf_tensor_release(&got);
    n = mk("Mod", 2, 13);
    got = eval_n(n, 2, in);
    cr_assert_eq(kf_get_i64(&got, 0), (((int64_t)1 << 60) + 1) % 3);
    cr_assert_eq(kf_get_i64(&got, 1), 0);
    tu_node_free(n), kf_tensor_release(&got);

    kf_tensor ua = alloc_like(KF_DT_UINT64, 1, d), ub = alloc_like(KF_DT_UINT64, 1, d);
    uint64_t uav[3] = {UINT64_MAX, (uint64_t)1 << 63, 5}, ubv[3] = {3, 1, (uint64_t)1 << 63};
    memcpy(ua.data, uav, sizeof uav);
    memcpy(ub.data, ubv, sizeof ubv);
    const kf_tensor *uin[2] = {&ua, &ub};
    n = mk("Greater", 2, 13);
    got = eval_n(n, 2, uin);
    cr_assert(kf_get_i64(&got, 0) == 1 && kf_get_i64(&got, 1) == 1 && kf_get_i64(&got, 2) == 0);
    tu_node_free(n), kf_tensor_release(&got);
    const char *uops[3] = {"Div", "Mod", "Max"};
    for (int o = 0; o < 3; o++) {
        n = mk(uops[o], 2, 13);
        got = eval_n(n, 2, uin);
        for (int i = 0; i < 3; i++) {
            uint64_t w = o == 0 ? uav[i] / ubv[i] : o == 1 ? uav[i] % ubv[i] : (uav[i] > ubv[i] ? uav[i] : ubv[i]);
            cr_assert_eq(kf_get_u64(&got, i), w, "%s on uint64 element %d", uops[o], i);
        }
        tu_node_free(n), kf_tensor_release(&got);
    }
    release(1, &a), release(1, &b), release(1, &ua), release(1, &ub);
}

Test(ew_binary, integer_pow_is_exact) {
    int64_t d[1] = {5};
    int64_t av[5] = {3, -2, 7, 1, -1}, bv[5] = {39, 63, 0, -5, -3};
    kf_tensor a = tu_i64(1, d, av), b = tu_i64(1, d, bv);
    kf_node *n = mk("Pow", 2, 15);
    const kf_tensor *in[2] = {&a, &b};
    kf_tensor got = eval_n(n, 2, in);
    cr_assert_eq(kf_get_i64(&got, 0), 4052555153018976267LL, "3^39");
    cr_assert_eq(kf_get_i64(&got, 1), INT64_MIN, "(-2)^63");
    cr_assert_eq(kf_get_i64(&got, 2), 1);
    cr_assert_eq(kf_get_i64(&got, 3), 1);
    cr_assert_eq(kf_get_i64(&got, 4), -1);
    kf_tensor_release(&got);
    /* int base, float exponent: the real result truncated to the base's type */
    float ev[5] = {0.5f, 2.0f, 1.5f, 3.0f, 2.0f};
    kf_tensor e = tu_f32(1, d, ev);
    int64_t bases[5] = {10, -3, 4, 2, 5};
    kf_tensor base = tu_i64(1, d, bases);
    const kf_tensor *in2[2] = {&base, &e};
    got = eval_n(n, 2, in2);
    cr_assert_eq(got.dtype, KF_DT_INT64);
    int64_t want[5] = {3, 9, 8, 8, 25};
    for (int i = 0; i < 5; i++) cr_assert_eq(kf_get_i64(&got, i), want[i], "element %d", i);
    tu_node_free(n);
    release(1, &a), release(1, &b), release(1, &got), release(1, &e), release(1, &base);
}

Test(ew_binary, mod_follows_the_divisor_or_fmod) {
    int64_t d[1] = {40};
    kf_tensor a = tu_rand(KF_DT_DOUBLE, 1, d, -10, 10), b = tu_rand(KF_DT_DOUBLE, 1, d, 0.5, 4);
    for (int64_t i = 0; i < 40; i += 2) kf_set_f64(&b, i, -kf_get_f64(&b, i));
    for (int fm = 0; fm < 2; fm++) {
        kf_node *n = mk("Mod", 2, 13);
        tu_attr_i(n, "fmod", fm);
        const kf_tensor *in[2] = {&a, &b};
        kf_tensor got = eval_n(n, 2, in);
        for (int64_t i = 0; i < 40; i++) {
            double x = kf_get_f64(&a, i), y = kf_get_f64(&b, i);
            double w = fm ? x - y * trunc(x / y) : x - y * floor(x / y);
            cr_assert(fabs(kf_get_f64(&got, i) - w) < 1e-9, "mod(%g, %g) fmod=%d: %g, expected %g", x, y, fm,
                      kf_get_f64(&got, i), w);
        }
        tu_node_free(n);
        kf_tensor_release(&got);
    }
    release(1, &a), release(1, &b);
}

Test(ew_binary, bit_shift_both_directions) {
    int64_t d[1] = {30};
    const kf_dtype dts[2] = {KF_DT_UINT8, KF_DT_UINT64};
    for (int k = 0; k < 2; k++) {
        kf_tensor a = tu_rand(dts[k], 1, d, 0, 250), s = tu_rand(dts[k], 1, d, 0, 10);
        if (k == 1) ((uint64_t *)a.data)[0] = UINT64_MAX, ((uint64_t *)s.data)[0] = 3;
        kf_set_f64(&s, 1, 70); /* past the width */
        for (int dir = 0; dir < 2; dir++) {
            kf_node *n = mk("BitShift", 2, 11);
            tu_attr_s(n, "direction", dir ? "RIGHT" : "LEFT");
            const kf_tensor *in[2] = {&a, &s};
            kf_tensor got = eval_n(n, 2, in);
            for (int i = 0; i < 30; i++) {
                uint64_t x = kf_get_u64(&a, i), sh = kf_get_u64(&s, i), w;
                w = sh >= 64 ? 0 : dir ? x >> sh : x << sh;
                if (k == 0) w &= 0xff;
                cr_assert_eq(kf_get_u64(&got, i), w, "%s %llu by %llu", dir ? "RIGHT" : "LEFT",
                             (unsigned long long)x, (unsigned long long)sh);
            }
            tu_node_free(n);
            kf_tensor_release(&got);
        }
        release(1, &a), release(1, &s);
    }
}

/* Opset 28: signed operands shift arithmetically to the right; counts that
 * are negative or at least the width leave the sign fill; before 28 a
 * signed input is refused with the node and dtype named. */
Test(ew_binary, bit_shift_signed_from_opset_28) {
    int64_t d[1] = {40};
    const kf_dtype dts[2] = {KF_DT_INT8, KF_DT_INT32};
    const int width[2] = {8, 32};
    for (int k = 0; k < 2; k++) {
        double lim = k ? 2e9 : 127;
        kf_tensor a = tu_rand(dts[k], 1, d, -lim, lim), s = tu_rand(dts[k], 1, d, 0, width[k]);
        kf_set_f64(&s, 0, -1);
        kf_set_f64(&s, 1, width[k]);
        kf_set_f64(&s, 2, width[k] + 3);
        kf_set_f64(&a, 1, -5);
        kf_set_f64(&a, 2, -7);
        for (int dir = 0; dir < 2; dir++) {
            kf_node *n = mk("BitShift", 2, 28);
            tu_attr_s(n, "direction", dir ? "RIGHT" : "LEFT");
            const kf_tensor *in[2] = {&a, &s};
            kf_tensor got = eval_n(n, 2, in);
            for (int i = 0; i < 40; i++) {
                int64_t x = kf_get_i64(&a, i), sh = kf_get_i64(&s, i), w;
                if (sh < 0 || sh >= width[k]) {
                    w = (dir && x < 0) ? -1 : 0;
                } else if (dir) {
                    w = (int64_t)floor((double)x / ldexp(1, (int)sh));
                } else { /* keep the low width bits, read back as signed */
                    uint64_t m = (((uint64_t)x) << sh) & ((width[k] == 64 ? 0 : (1ull << width[k])) - 1);
                    w = m >= (1ull << (width[k] - 1)) ? (int64_t)m - (int64_t)(1ull << width[k]) : (int64_t)m;
                }
                cr_assert_eq(kf_get_i64(&got, i), w, "%s %lld by %lld: %lld", dir ? "RIGHT" : "LEFT",
                             (long long)x, (long long)sh, (long long)kf_get_i64(&got, i));
            }
            tu_node_free(n);
            kf_tensor_release(&got);
        }
        kf_node *old = mk("BitShift", 2, 11);
        tu_attr_s(old, "direction", "LEFT");
        const kf_tensor *in[2] = {&a, &s};
        kf_tensor out[1] = {{0}};
        cr_assert_eq(kf_eval_node(old, 2, in, out), KF_ERR_SHAPE);
        cr_assert(strstr(kf_last_error(), "BitShift") && strstr(kf_last_error(), kf_dtype_name(dts[k])),
                  "%s", kf_last_error());
        kf_tensor_release(&out[0]);
        tu_node_free(old);
        release(1, &a), release(1, &s);
    }
}

/* BitCast (26): float32 <-> int32 and float64 -> uint64 keep each
 * element's bits (checked through a union, not through the kernel's
 * memcpy); int4 <-> uint4 keep the 4-bit code (sign-extended for int4);
 * a width mismatch and a string input are refused naming both dtypes. */
Test(ew_bitcast, keeps_bits_and_refuses_other_widths) {
    int64_t d[2] = {4, 7};
    kf_tensor f = tu_rand(KF_DT_FLOAT, 2, d, -1e6, 1e6);
    kf_node *n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_INT32);
    const kf_tensor *in[1] = {&f};
    kf_tensor i32 = eval_n(n, 1, in);
    cr_assert_eq(i32.dtype, KF_DT_INT32);
    cr_assert_eq(i32.rank, 2);
    for (int64_t i = 0; i < f.numel; i++) {
        union { float f; int32_t i; } u = {.f = ((float *)f.data)[i]};
        cr_assert_eq(((int32_t *)i32.data)[i], u.i, "element %lld", (long long)i);
    }
    tu_node_free(n);
    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_FLOAT);
    const kf_tensor *back_in[1] = {&i32};
    kf_tensor back = eval_n(n, 1, back_in);
    cr_assert(kf_tensor_equal(&back, &f), "float -> int32 -> float changed bits");
    tu_node_free(n);

    kf_tensor g = tu_rand(KF_DT_DOUBLE, 2, d, -50, 50);
    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_UINT64);
    const kf_tensor *gin[1] = {&g};
    kf_tensor u64 = eval_n(n, 1, gin);
    for (int64_t i = 0; i < g.numel; i++) {
        union { double d; uint64_t u; } u = {.d = ((double *)g.data)[i]};
        cr_assert_eq(((uint64_t *)u64.data)[i], u.u);
    }
    tu_node_free(n);

    kf_tensor i4 = tu_rand(KF_DT_INT4, 2, d, -8, 8);
    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_UINT4);
    const kf_tensor *i4in[1] = {&i4};
    kf_tensor u4 = eval_n(n, 1, i4in);
    for (int64_t i = 0; i < i4.numel; i++) {
        int64_t v = kf_get_i64(&i4, i);
        cr_assert_eq(kf_get_i64(&u4, i), v < 0 ? v + 16 : v, "int4 %lld", (long long)v);
    }
    tu_node_free(n);
    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_INT4);
    const kf_tensor *u4in[1] = {&u4};
    kf_tensor i4b = eval_n(n, 1, u4in);
    cr_assert(kf_tensor_equal(&i4b, &i4), "int4 -> uint4 -> int4 changed values");
    tu_node_free(n);

    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_INT64);
    expect_fail(n, 1, in, KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "float") && strstr(kf_last_error(), "int64"), "%s", kf_last_error());
    tu_node_free(n);
    const char *words[2] = {"ab", "cd"};
    kf_tensor s = str_tensor(2, words);
    n = mk("BitCast", 1, 26);
    tu_attr_i(n, "to", KF_DT_INT8);
    const kf_tensor *sin[1] = {&s};
    expect_fail(n, 1, sin, KF_ERR_SHAPE);
    tu_node_free(n);
    release(1, &f), release(1, &i32), release(1, &back), release(1, &g), release(1, &u64);
    release(1, &i4), release(1, &u4), release(1, &i4b), release(1, &s);
}

Test(ew_binary, logic_ops_on_bool) {
    int64_t da[2] = {3, 4}, db[1] = {4};
    kf_tensor a = rand_small(KF_DT_BOOL, 2, da, 0, 1), b = rand_small(KF_DT_BOOL, 1, db, 0, 1);
    const char *ops[4] = {"And", "Or", "Xor", "Equal"};
    for (int o = 0; o < 4; o++) {
        kf_node *n = mk(ops[o], 2, 7);
        const kf_tensor *in[2] = {&a, &b};
        kf_tensor got = eval_n(n, 2, in);
        cr_assert_eq(got.dtype, KF_DT_BOOL);
        for (int i = 0; i < 12; i++) {
            int x = (int)kf_get_i64(&a, i), y = (int)kf_get_i64(&b, i % 4);
            int w = o == 0 ? x && y : o == 1 ? x || y : o == 2 ? x != y : x == y;
            cr_assert_eq(kf_get_i64(&got, i), w, "%s(%d, %d)", ops[o], x, y);
        }
        tu_node_free(n);
        kf_tensor_release(&got);
    }
    release(1, &a), release(1, &b);
}

Test(ew_binary, equal_compares_strings) {
    const char *x[3] = {"abc", "", "tail"}, *y[3] = {"abc", "", "tails"};
    kf_tensor a = str_tensor(3, x), b = str_tensor(3, y);
    kf_node *n = mk("Equal", 2, 19);
    const kf_tensor *in[2] = {&a, &b};
    kf_tensor got = eval_n(n, 2, in);
    cr_assert(kf_get_i64(&got, 0) == 1 && kf_get_i64(&got, 1) == 1 && kf_get_i64(&got, 2) == 0);
    tu_node_free(n);
    release(1, &a), release(1, &b), release(1, &got);
}

Test(ew_binary, prelu_slope_broadcasts_one_way_and_per_channel_before_7) {
    int64_t dx[3] = {2, 3, 4}, ds[1] = {3}, ds2[2] = {3, 1};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dx, -3, 3), s = tu_rand(KF_DT_FLOAT, 1, ds, 0.1, 1);
    kf_tensor s2 = s;
    s2.rank = 2;
    memcpy(s2.dims, ds2, sizeof ds2);
    kf_tensor want = alloc_like(KF_DT_FLOAT, 3, dx);
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < 3; c++)
            for (int k = 0; k < 4; k++) {
                int64_t o = (i * 3 + c) * 4 + k;
                double v = kf_get_f64(&x, o);
                kf_set_f64(&want, o, v >= 0 ? v : v * kf_get_f64(&s, c));
            }
    kf_node *old = mk("PRelu", 2, 6), *now = mk("PRelu", 2, 16);
    const kf_tensor *in_old[2] = {&x, &s}, *in_now[2] = {&x, &s2};
    kf_tensor g1 = eval_n(old, 2, in_old), g2 = eval_n(now, 2, in_now);
    expect_close(&g1, &want, 1e-6, 1e-6, "PRelu-6 per channel");
    expect_close(&g2, &want, 1e-6, 1e-6, "PRelu-16 [3,1]");
    /* at opset 16 a [3] slope aligns with the last dim (4): no broadcast */
    expect_fail(now, 2, in_old, KF_ERR_SHAPE);
    /* the slope may not grow the output */
    int64_t dbig[4] = {5, 2, 3, 4};
    kf_tensor big = tu_rand(KF_DT_FLOAT, 4, dbig, -1, 1);
    const kf_tensor *in_big[2] = {&x, &big};
    expect_fail(now, 2, in_big, KF_ERR_SHAPE);
    tu_node_free(old), tu_node_free(now);
    release(1, &x), release(1, &s), release(1, &want), release(1, &g1), release(1, &g2), release(1, &big);
}

Test(ew_binary, legacy_broadcast_attribute_before_opset_7) {
    int64_t da[4] = {2, 3, 4, 5}, db[2] = {3, 4};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 4, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 2, db, -1, 1);
    kf_node *n = mk("Add", 2, 6);
    tu_attr_i(n, "broadcast", 1);
    tu_attr_i(n, "axis", 1);
    const kf_tensor *in[2] = {&a, &b};
    kf_tensor got = eval_n(n, 2, in);
    cr_assert_eq(got.rank, 4);
    for (int64_t i = 0; i < a.numel; i++) {
        int64_t c = (i / 5 / 4) % 3, h = (i / 5) % 4;
        double w = (float)(kf_get_f64(&a, i) + kf_get_f64(&b, c * 4 + h));
        cr_assert_eq(kf_get_f64(&got, i), w, "element %lld", (long long)i);
    }
    kf_tensor_release(&got);
    /* suffix matching without axis: [5] along the last dim */
    int64_t dc[1] = {5};
    kf_tensor c = tu_rand(KF_DT_FLOAT, 1, dc, -1, 1);
    kf_node *m = mk("Mul", 2, 6);
    tu_attr_i(m, "broadcast", 1);
    const kf_tensor *in2[2] = {&a, &c};
    got = eval_n(m, 2, in2);
    for (int64_t i = 0; i < a.numel; i++)
        cr_assert_eq(kf_get_f64(&got, i), (double)(float)(kf_get_f64(&a, i) * kf_get_f64(&c, i % 5)));
    kf_tensor_release(&got);
    /* axis that does not fit, and broadcast=0 with different shapes */
    kf_node *bad = mk("Add", 2, 6);
    tu_attr_i(bad, "broadcast", 1);
    tu_attr_i(bad, "axis", 3);
    expect_fail(bad, 2, in, KF_ERR_SHAPE);
    kf_node *nob = mk("Sub", 2, 1);
    expect_fail(nob, 2, in2, KF_ERR_SHAPE);
    tu_node_free(n), tu_node_free(m), tu_node_free(bad), tu_node_free(nob);
    release(1, &a), release(1, &b), release(1, &c);
}

/* ---- variadic, Where, Clip ---------------------------------------------------- */

Test(ew_variadic, max_min_sum_mean_of_many_broadcast_inputs) {
    enum { K = 10 };
    kf_tensor t[K];
    const kf_tensor *in[K];
    int64_t shapes[3][2] = {{4, 3}, {1, 3}, {4, 1}};
    for (int k = 0; k < K; k++) {
        t[k] = tu_rand(KF_DT_DOUBLE, 2, shapes[k % 3], -5, 5);
        in[k] = &t[k];
    }
    const char *ops[4] = {"Max", "Min", "Sum", "Mean"};
    for (int o = 0; o < 4; o++) {
        kf_node *n = mk(ops[o], K, 13);
        kf_tensor got = eval_n(n, K, in);
        cr_assert(got.rank == 2 && got.dims[0] == 4 && got.dims[1] == 3);
        for (int64_t r = 0; r < 4; r++)
            for (int64_t c = 0; c < 3; c++) {
                int64_t idx[2] = {r, c};
                double acc = o == 0 ? -INFINITY : o == 1 ? INFINITY : 0;
                for (int k = 0; k < K; k++) {
                    double v = kf_get_f64(&t[k], bidx(&t[k], idx, 2));
                    acc = o == 0 ? fmax(acc, v) : o == 1 ? fmin(acc, v) : acc + v;
                }
                if (o == 3) acc /= K;
                cr_assert(fabs(kf_get_f64(&got, r * 3 + c) - acc) < 1e-12, "%s at (%lld,%lld)", ops[o],
                          (long long)r, (long long)c);
            }
        tu_node_free(n);
        kf_tensor_release(&got);
    }
    /* integer Max/Min and a single input */
    int64_t d[1] = {20};
    kf_tensor a = tu_rand(KF_DT_INT16, 1, d, -300, 300), b = tu_rand(KF_DT_INT16, 1, d, -300, 300);
    const kf_tensor *ii[2] = {&a, &b};
    kf_node *n = mk("Min", 2, 13);
    kf_tensor got = eval_n(n, 2, ii);
    for (int i = 0; i < 20; i++) {
        int64_t x = kf_get_i64(&a, i), y = kf_get_i64(&b, i);
        cr_assert_eq(kf_get_i64(&got, i), x < y ? x : y);
    }
    kf_tensor_release(&got);
    got = eval_n(n, 1, ii);
    cr_assert(kf_tensor_equal(&got, &a));
    /* NaN propagates */
    int64_t d2[1] = {2};
    float nv[2] = {NAN, 1}, ov[2] = {3, NAN};
    kf_tensor na = tu_f32(1, d2, nv), nb = tu_f32(1, d2, ov);
    const kf_tensor *nn[2] = {&na, &nb};
    kf_node *mx = mk("Max", 2, 13);
    kf_tensor gm = eval_n(mx, 2, nn);
    cr_assert(isnan(kf_get_f64(&gm, 0)) && isnan(kf_get_f64(&gm, 1)));
    tu_node_free(n), tu_node_free(mx);
    release(K, t), release(1, &a), release(1, &b), release(1, &got), release(1, &na), release(1, &nb),
        release(1, &gm);
}

Test(ew_where, selects_with_three_way_broadcast_for_every_dtype) {
    int64_t dc[2] = {3, 1}, dx[1] = {4}, dy[2] = {1, 4};
    kf_tensor c = rand_small(KF_DT_BOOL, 2, dc, 0, 1);
    kf_set_f64(&c, 0, 1), kf_set_f64(&c, 1, 0);
    const kf_dtype dts[3] = {KF_DT_FLOAT, KF_DT_INT64, KF_DT_FLOAT16};
    for (int k = 0; k < 3; k++) {
        kf_tensor x = tu_rand(dts[k], 1, dx, -100, 100), y = tu_rand(dts[k], 2, dy, -100, 100);
        if (dts[k] == KF_DT_INT64) ((int64_t *)x.data)[0] = ((int64_t)1 << 62) + 1;
        kf_node *n = mk("Where", 3, 16);
        const kf_tensor *in[3] = {&c, &x, &y};
        kf_tensor got = eval_n(n, 3, in);
        cr_assert(got.dtype == dts[k] && got.rank == 2 && got.dims[0] == 3 && got.dims[1] == 4);
        for (int r = 0; r < 3; r++)
            for (int j = 0; j < 4; j++) {
                const kf_tensor *src = kf_get_i64(&c, r) ? &x : &y;
                cr_assert_eq(kf_get_i64(&got, r * 4 + j), kf_get_i64(src, j));
                cr_assert_eq(kf_get_f64(&got, r * 4 + j), kf_get_f64(src, j));
            }
        tu_node_free(n);
        release(1, &x), release(1, &y), release(1, &got);
    }
    const char *xs[2] = {"yes", "ja"}, *ys[2] = {"no", "nein"};
    int64_t d2[1] = {2};
    kf_tensor sc = alloc_like(KF_DT_BOOL, 1, d2);
    kf_set_i64(&sc, 0, 1);
    kf_tensor sx = str_tensor(2, xs), sy = str_tensor(2, ys);
    kf_node *n = mk("Where", 3, 16);
    const kf_tensor *in[3] = {&sc, &sx, &sy};
    kf_tensor got = eval_n(n, 3, in);
    cr_assert_eq(got.dtype, KF_DT_STRING);
    cr_assert_str_eq(((kf_bytes *)got.data)[0].ptr, "yes");
    cr_assert_str_eq(((kf_bytes *)got.data)[1].ptr, "nein");
    /* the condition must be bool, x and y alike */
    const kf_tensor *bad[3] = {&sx, &sx, &sy};
    expect_fail(n, 3, bad, KF_ERR_SHAPE);
    int64_t d4[1] = {4};
    kf_tensor fx = tu_rand(KF_DT_FLOAT, 1, d4, 0, 1), ix = tu_rand(KF_DT_INT32, 1, d4, 0, 9);
    const kf_tensor *mixed[3] = {&c, &fx, &ix};
    expect_fail(n, 3, mixed, KF_ERR_SHAPE);
    tu_node_free(n);
    release(1, &c), release(1, &sc), release(1, &sx), release(1, &sy), release(1, &got), release(1, &fx),
        release(1, &ix);
}

Test(ew_clip, attributes_before_11_inputs_after_and_integers) {
    int64_t d[1] = {50};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 1, d, -5, 5);
    double lo = tu_uniform(-3, -0.5), hi = tu_uniform(0.5, 3);
    kf_node *old = mk("Clip", 1, 6);
    tu_attr_f(old, "min", (float)lo);
    tu_attr_f(old, "max", (float)hi);
    int64_t d0[1] = {0};
    kf_tensor tlo = tu_tensor(KF_DT_FLOAT, 0, d0, &lo), thi = tu_tensor(KF_DT_FLOAT, 0, d0, &hi);
    kf_node *now = mk("Clip", 3, 13);
    const kf_tensor *in1[1] = {&x}, *in3[3] = {&x, &tlo, &thi}, *in_hi[3] = {&x, NULL, &thi};
    kf_tensor g1 = eval_n(old, 1, in1), g2 = eval_n(now, 3, in3), g3 = eval_n(now, 3, in_hi);
    for (int i = 0; i < 50; i++) {
        double v = kf_get_f64(&x, i), l = (float)lo, h = (float)hi;
        double w = v < l ? l : v > h ? h : v;
        cr_assert_eq(kf_get_f64(&g1, i), w);
        cr_assert_eq(kf_get_f64(&g2, i), w);
        cr_assert_eq(kf_get_f64(&g3, i), v > h ? h : v);
    }
    /* min > max: everything becomes max */
    const kf_tensor *swapped[3] = {&x, &thi, &tlo};
    kf_tensor g4 = eval_n(now, 3, swapped);
    for (int i = 0; i < 50; i++) cr_assert_eq(kf_get_f64(&g4, i), (double)(float)lo);
    /* integers, including uint64 beyond int64 */
    kf_tensor xi = tu_rand(KF_DT_INT32, 1, d, -100, 100);
    double ilo = -10, ihi = 20;
    kf_tensor til = tu_tensor(KF_DT_INT32, 0, d0, &ilo), tih = tu_tensor(KF_DT_INT32, 0, d0, &ihi);
    const kf_tensor *ini[3] = {&xi, &til, &tih};
    kf_tensor g5 = eval_n(now, 3, ini);
    for (int i = 0; i < 50; i++) {
        int64_t v = kf_get_i64(&xi, i);
        cr_assert_eq(kf_get_i64(&g5, i), v < -10 ? -10 : v > 20 ? 20 : v);
    }
    int64_t d2[1] = {2};
    kf_tensor ux = alloc_like(KF_DT_UINT64, 1, d2), uh = alloc_like(KF_DT_UINT64, 0, d0);
    ((uint64_t *)ux.data)[0] = UINT64_MAX, ((uint64_t *)ux.data)[1] = 7;
    ((uint64_t *)uh.data)[0] = (uint64_t)1 << 63;
    const kf_tensor *inu[3] = {&ux, NULL, &uh};
    kf_tensor g6 = eval_n(now, 3, inu);
    cr_assert_eq(kf_get_u64(&g6, 0), (uint64_t)1 << 63);
    cr_assert_eq(kf_get_u64(&g6, 1), 7);
    /* a bound that is not a scalar, a bound of another dtype */
    const kf_tensor *notscalar[3] = {&x, &x, NULL};
    expect_fail(now, 3, notscalar, KF_ERR_SHAPE);
    const kf_tensor *mixed[3] = {&x, &til, NULL};
    expect_fail(now, 3, mixed, KF_ERR_SHAPE);
    tu_node_free(old), tu_node_free(now);
    release(1, &x), release(1, &tlo), release(1, &thi), release(1, &g1), release(1, &g2), release(1, &g3),
        release(1, &g4), release(1, &xi), release(1, &til), release(1, &tih), release(1, &g5), release(1, &ux),
        release(1, &uh), release(1, &g6);
}

/* ---- Cast ------------------------------------------------------------------------- */

static kf_tensor cast_to(const kf_tensor *x, kf_dtype to, int64_t opset) {
    kf_node *n = mk("Cast", 1, opset);
    tu_attr_i(n, "to", to);
    const kf_tensor *in[1] = {x};
    kf_tensor got = eval_n(n, 1, in);
    tu_node_free(n);
    return got;
}

Test(ew_cast, every_numeric_pair) {
    const kf_dtype all[] = {KF_DT_FLOAT, KF_DT_UINT8, KF_DT_INT8, KF_DT_UINT16, KF_DT_INT16, KF_DT_INT32,
                            KF_DT_INT64, KF_DT_BOOL, KF_DT_FLOAT16, KF_DT_DOUBLE, KF_DT_UINT32, KF_DT_UINT64,
                            KF_DT_BFLOAT16};
    int nall = sizeof all / sizeof all[0];
    int64_t d[1] = {32};
    for (int s = 0; s < nall; s++) {
        /* values every dtype holds: integers in [0,100] and, for floats, fractions */
        kf_tensor x = tu_rand(all[s], 1, d, 0, all[s] == KF_DT_BOOL ? 2 : 100);
        if (all[s] == KF_DT_DOUBLE) /* keep the expected narrowing below a single rounding */
            for (int i = 0; i < 32; i++) kf_set_f64(&x, i, (float)kf_get_f64(&x, i));
        for (int t = 0; t < nall; t++) {
            kf_tensor got = cast_to(&x, all[t], 13);
            cr_assert_eq(got.dtype, all[t]);
            for (int i = 0; i < 32; i++) {
                double v = kf_get_f64(&x, i), w;
                if (all[t] == KF_DT_BOOL) w = v != 0;
                else if (kf_dtype_is_float(all[t])) {
                    w = all[t] == KF_DT_FLOAT16 ? kf_half_to_float(kf_float_to_half((float)v))
                        : all[t] == KF_DT_BFLOAT16 ? kf_bf16_to_float(kf_float_to_bf16((float)v))
                        : all[t] == KF_DT_FLOAT ? (float)v : v;
                } else w = trunc(v);
                cr_assert_eq(kf_get_f64(&got, i), w, "%s -> %s of %.9g: %.9g, expected %.9g",
                             kf_dtype_name(all[s]), kf_dtype_name(all[t]), v, kf_get_f64(&got, i), w);
            }
            kf_tensor_release(&got);
        }
        kf_tensor_release(&x);
    }
}

Test(ew_cast, wraps_truncates_and_rounds_once) {
    int64_t d[1] = {4};
    int64_t iv[4] = {300, -1, ((int64_t)1 << 62) + 1, -129};
    kf_tensor x = tu_i64(1, d, iv);
    kf_tensor u8 = cast_to(&x, KF_DT_UINT8, 13), f = cast_to(&x, KF_DT_FLOAT, 13);
    cr_assert(kf_get_i64(&u8, 0) == 44 && kf_get_i64(&u8, 1) == 255 && kf_get_i64(&u8, 3) == 127);
    cr_assert_eq(((float *)f.data)[2], (float)(((int64_t)1 << 62) + 1));
    double dv[4] = {-2.7, 2.7, 1e30, 1.00048828125 + 0x1p-30}; /* just above a float16 tie: float alone would hit it */
    kf_tensor xd = tu_tensor(KF_DT_DOUBLE, 1, d, dv);
    kf_tensor i32 = cast_to(&xd, KF_DT_INT32, 13), h = cast_to(&xd, KF_DT_FLOAT16, 13);
    cr_assert(kf_get_i64(&i32, 0) == -2 && kf_get_i64(&i32, 1) == 2 && kf_get_i64(&i32, 2) == INT32_MAX);
    cr_assert_eq(((uint16_t *)h.data)[3], 0x3c01, "rounded up, not to even via float: 0x%04x",
                 ((uint16_t *)h.data)[3]);
    cr_assert(isinf(kf_get_f64(&h, 2)));
    release(1, &x), release(1, &u8), release(1, &f), release(1, &xd), release(1, &i32), release(1, &h);
}

Test(ew_cast, numbers_print_like_numpy) {
    int64_t d[1] = {9};
    float fv[9] = {0.1f, 1e-5f, 12345678.0f, 100.0f, -0.0f, NAN, -INFINITY, 0.039187793f, 999999.9f};
    const char *fs[9] = {"0.1", "1e-05", "1.2345678e+07", "100.0", "-0.0", "nan", "-inf", "0.039187793", "999999.9"};
    kf_tensor x = tu_f32(1, d, fv);
    kf_tensor s = cast_to(&x, KF_DT_STRING, 13);
    for (int i = 0; i < 9; i++) cr_assert_str_eq(((kf_bytes *)s.data)[i].ptr, fs[i]);
    int64_t d3[1] = {3};
    double hv[3] = {1.0 / 3, 65504, 1000};
    const char *hs[3] = {"0.3333", "6.55e+04", "1e+03"};
    kf_tensor xh = tu_tensor(KF_DT_FLOAT16, 1, d3, hv), sh = cast_to(&xh, KF_DT_STRING, 13);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(((kf_bytes *)sh.data)[i].ptr, hs[i]);
    double dv[3] = {1.0 / 3, 1e15, 1e16};
    const char *ds[3] = {"0.3333333333333333", "1000000000000000.0", "1e+16"};
    kf_tensor xd = tu_tensor(KF_DT_DOUBLE, 1, d3, dv), sd = cast_to(&xd, KF_DT_STRING, 13);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(((kf_bytes *)sd.data)[i].ptr, ds[i]);
    int64_t iv[3] = {-42, 0, INT64_MAX};
    kf_tensor xi = tu_i64(1, d3, iv), si = cast_to(&xi, KF_DT_STRING, 13);
    cr_assert_str_eq(((kf_bytes *)si.data)[2].ptr, "9223372036854775807");
    cr_assert_str_eq(((kf_bytes *)si.data)[0].ptr, "-42");
    kf_tensor xb = rand_small(KF_DT_BOOL, 1, d3, 0, 1);
    kf_set_i64(&xb, 0, 1), kf_set_i64(&xb, 1, 0);
    kf_tensor sb = cast_to(&xb, KF_DT_STRING, 13);
    cr_assert_str_eq(((kf_bytes *)sb.data)[0].ptr, "True");
    cr_assert_str_eq(((kf_bytes *)sb.data)[1].ptr, "False");
    release(1, &x), release(1, &s), release(1, &xh), release(1, &sh), release(1, &xd), release(1, &sd),
        release(1, &xi), release(1, &si), release(1, &xb), release(1, &sb);
}

Test(ew_cast, random_floats_survive_a_string_round_trip) {
    int64_t d[1] = {200};
    const kf_dtype dts[3] = {KF_DT_FLOAT, KF_DT_DOUBLE, KF_DT_FLOAT16};
    for (int k = 0; k < 3; k++) {
        kf_tensor x = tu_rand(dts[k], 1, d, -1000, 1000);
        for (int i = 0; i < 200; i += 3) kf_set_f64(&x, i, kf_get_f64(&x, i) * 1e-7);
        kf_tensor s = cast_to(&x, KF_DT_STRING, 13), back = cast_to(&s, dts[k], 13);
        cr_assert(kf_tensor_equal(&back, &x), "%s round trip", kf_dtype_name(dts[k]));
        release(1, &x), release(1, &s), release(1, &back);
    }
}

Test(ew_cast, strings_parse_to_numbers) {
    const char *sv[6] = {"0.47892547", "NaN", "INF", "+INF", "-INF", " 2.5 "};
    kf_tensor s = str_tensor(6, sv), f = cast_to(&s, KF_DT_FLOAT, 13);
    cr_assert_eq(((float *)f.data)[0], 0.47892547f);
    cr_assert(isnan(kf_get_f64(&f, 1)));
    cr_assert(kf_get_f64(&f, 2) == INFINITY && kf_get_f64(&f, 3) == INFINITY && kf_get_f64(&f, 4) == -INFINITY);
    cr_assert_eq(kf_get_f64(&f, 5), 2.5);
    const char *iv[3] = {"-3", "18446744073709551615", "7"};
    kf_tensor si = str_tensor(3, iv), i8 = cast_to(&si, KF_DT_INT8, 13), u64 = cast_to(&si, KF_DT_UINT64, 13);
    cr_assert_eq(kf_get_i64(&i8, 0), -3);
    cr_assert_eq(kf_get_u64(&u64, 1), UINT64_MAX);
    const char *bv[3] = {"True", "false", "0"};
    kf_tensor sb = str_tensor(3, bv), b = cast_to(&sb, KF_DT_BOOL, 13);
    cr_assert(kf_get_i64(&b, 0) == 1 && kf_get_i64(&b, 1) == 0 && kf_get_i64(&b, 2) == 0);
    /* unparsable text is a run-time error naming the node */
    const char *bad[1] = {"12abc"};
    kf_tensor sbad = str_tensor(1, bad);
    kf_node *n = mk("Cast", 1, 13);
    tu_attr_i(n, "to", KF_DT_INT32);
    const kf_tensor *in[1] = {&sbad};
    expect_fail(n, 1, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    release(1, &s), release(1, &f), release(1, &si), release(1, &i8), release(1, &u64), release(1, &sb),
        release(1, &b), release(1, &sbad);
}

Test(ew_cast, cast_1_names_the_type_and_castlike_takes_it_from_input_1) {
    int64_t d[1] = {10};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 1, d, -50, 50);
    kf_node *n = mk("Cast", 1, 1);
    tu_attr_s(n, "to", "INT32");
    const kf_tensor *in[1] = {&x};
    kf_tensor got = eval_n(n, 1, in);
    cr_assert_eq(got.dtype, KF_DT_INT32);
    for (int i = 0; i < 10; i++) cr_assert_eq(kf_get_f64(&got, i), trunc(kf_get_f64(&x, i)));
    kf_tensor like = tu_rand(KF_DT_FLOAT16, 1, d, 0, 1);
    kf_node *cl = mk("CastLike", 2, 15);
    const kf_tensor *in2[2] = {&x, &like};
    kf_tensor g2 = eval_n(cl, 2, in2);
    cr_assert_eq(g2.dtype, KF_DT_FLOAT16);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(((uint16_t *)g2.data)[i], kf_float_to_half(((float *)x.data)[i]));
    tu_node_free(n), tu_node_free(cl);
    release(1, &x), release(1, &got), release(1, &like), release(1, &g2);
}

Test(ew_cast, bad_targets_are_errors) {
    int64_t d[1] = {2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 1, d, 0, 1);
    const kf_tensor *in[1] = {&x};
    kf_node *n = mk("Cast", 1, 13);
    tu_attr_i(n, "to", 99);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Cast", 1, 19);
    tu_attr_i(n, "to", KF_DT_FLOAT8E4M3FN);
    tu_attr_i(n, "saturate", 2); /* 0 or 1 */
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Cast", 1, 25);
    tu_attr_i(n, "to", KF_DT_FLOAT8E8M0);
    tu_attr_s(n, "round_mode", "sideways"); /* up, down or nearest */
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Cast", 1, 13);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* no `to` */
    tu_node_free(n);
    n = mk("Cast", 1, 1);
    tu_attr_s(n, "to", "QUATERNION");
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    release(1, &x);
}

/* ---- errors and shape inference ---------------------------------------------------- */

Test(ew_errors, bad_attributes_dtypes_and_shapes) {
    int64_t d23[2] = {2, 3}, d4[1] = {4};
    kf_tensor f = tu_rand(KF_DT_FLOAT, 2, d23, -1, 1), g = tu_rand(KF_DT_FLOAT, 1, d4, -1, 1);
    kf_tensor i = tu_rand(KF_DT_INT32, 2, d23, 0, 9), u = tu_rand(KF_DT_UINT8, 2, d23, 0, 9);
    const kf_tensor *ff[2] = {&f, &f}, *fg[2] = {&f, &g}, *fi[2] = {&f, &i}, *uu[2] = {&u, &u};
    const kf_tensor *f1[1] = {&f}, *i1[1] = {&i};

    kf_node *n = mk("Add", 2, 14);
    expect_fail(n, 2, fg, KF_ERR_SHAPE); /* [2,3] + [4] */
    expect_fail(n, 2, fi, KF_ERR_SHAPE); /* float + int32 */
    tu_node_free(n);
    n = mk("BitShift", 2, 11);
    tu_attr_s(n, "direction", "UP");
    expect_fail(n, 2, uu, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("BitShift", 2, 11); /* direction is required */
    expect_fail(n, 2, uu, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Gelu", 1, 20);
    tu_attr_s(n, "approximate", "fast");
    expect_fail(n, 1, f1, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Mod", 2, 13);
    tu_attr_i(n, "fmod", 2);
    expect_fail(n, 2, ff, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Celu", 1, 12);
    tu_attr_f(n, "alpha", 0);
    expect_fail(n, 1, f1, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("LeakyRelu", 1, 16);
    tu_attr_s(n, "alpha", "big");
    expect_fail(n, 1, f1, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("IsInf", 1, 10);
    tu_attr_i(n, "detect_positive", 3);
    expect_fail(n, 1, f1, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Sqrt", 1, 13);
    expect_fail(n, 1, i1, KF_ERR_SHAPE); /* no integer Sqrt */
    tu_node_free(n);
    n = mk("And", 2, 7);
    expect_fail(n, 2, ff, KF_ERR_SHAPE);
    tu_node_free(n);
    n = mk("Clip", 1, 6); /* integer Clip needs opset 12 */
    expect_fail(n, 1, i1, KF_ERR_SHAPE);
    tu_node_free(n);
    release(1, &f), release(1, &g), release(1, &i), release(1, &u);
}

Test(ew_shape, types_propagate_with_symbols_and_unknowns) {
    kf_type a, b, o;
    kf_type_unknown(&a);
    kf_type_unknown(&b);
    a.dtype = b.dtype = KF_DT_FLOAT;
    a.rank = 3;
    a.dims[0] = -1, a.syms[0] = 7, a.dims[1] = 3, a.dims[2] = 1;
    b.rank = 2;
    b.dims[0] = 1, b.dims[1] = 5;
    const kf_type *in[2] = {&a, &b};
    kf_node *n = mk("Less", 2, 13);
    const kf_op_info *info = kf_op_get(n->op);
    kf_type_unknown(&o);
    cr_assert_eq(info->shape(n, 2, in, NULL, 1, &o), KF_OK, "%s", kf_last_error());
    cr_assert(o.dtype == KF_DT_BOOL && o.rank == 3 && o.dims[0] == -1 && o.syms[0] == 7 && o.dims[1] == 3 &&
              o.dims[2] == 5);
    tu_node_free(n);
    /* unknown rank gives unknown shape, a known dtype still comes through */
    b.rank = -1;
    n = mk("Add", 2, 14);
    kf_type_unknown(&o);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 2, in, NULL, 1, &o), KF_OK);
    cr_assert(o.rank == -1 && o.dtype == KF_DT_FLOAT);
    /* a missing operand type: nothing known, no error */
    const kf_type *half[2] = {&a, NULL};
    kf_type_unknown(&o);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 2, half, NULL, 1, &o), KF_OK);
    cr_assert_eq(o.rank, -1);
    tu_node_free(n);
    /* Cast: dtype from `to`, symbols kept */
    n = mk("Cast", 1, 13);
    tu_attr_i(n, "to", KF_DT_INT64);
    kf_type_unknown(&o);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 1, in, NULL, 1, &o), KF_OK);
    cr_assert(o.dtype == KF_DT_INT64 && o.rank == 3 && o.syms[0] == 7);
    tu_node_free(n);
    /* Where takes its dtype from x */
    kf_type c;
    kf_type_unknown(&c);
    c.dtype = KF_DT_BOOL, c.rank = 0;
    b.rank = 2, b.dtype = KF_DT_FLOAT;
    const kf_type *w[3] = {&c, &a, &b};
    n = mk("Where", 3, 16);
    kf_type_unknown(&o);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 3, w, NULL, 1, &o), KF_OK, "%s", kf_last_error());
    cr_assert(o.dtype == KF_DT_FLOAT && o.rank == 3 && o.dims[2] == 5);
    tu_node_free(n);
}

Test(ew_table, rows_carry_versions_and_flags) {
    const kf_op_info *add = kf_op_get(kf_op_lookup("", "Add"));
    cr_assert(add && add->ver_lo == 1 && add->ver_hi >= 17);
    cr_assert(add->flags & KF_F_COMMUTATIVE);
    cr_assert(!(kf_op_get(kf_op_lookup("", "Sub"))->flags & KF_F_COMMUTATIVE));
    cr_assert_eq(kf_op_get(kf_op_lookup("", "Gelu"))->ver_lo, 20);
    const char *ops[] = {"Abs", "Mish", "Shrink", "BitwiseXor", "Mean", "Where", "Clip", "CastLike", "PRelu"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        kf_op op = kf_op_lookup("ai.onnx", ops[i]);
        cr_assert(op > 0 && op < 200, "%s has an elementwise id", ops[i]);
        cr_assert_not_null(kf_op_get(op)->eval);
    }
}
