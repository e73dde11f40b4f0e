/* test_ops_nn.c: the nn-family kernels (matrix products, convolution,
 * pooling, quantisation, Einsum, Det) against straightforward loops written
 * here, on random data, plus rejection of bad attributes and shapes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* A node named "nn_<op>" so messages can be checked for the name. */
static kf_node *mk(const char *op, int nin, int nout, int64_t opset) {
    kf_node *n = tu_node(op, nin, nout, opset);
    cr_assert_neq(n->op, KF_OP_UNKNOWN, "op %s is not in the table", op);
    free(n->name);
    n->name = malloc(strlen(op) + 4);
    strcpy(n->name, "nn_");
    strcat(n->name, op);
    return n;
}

static void check_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol) {
    char why[256];
    cr_assert(tu_close(got, want, atol, rtol, why, sizeof why), "%s", why);
}

/* Runs n and expects failure with code and a message naming the node. */
static void expect_fail(const kf_node *n, int nin, const kf_tensor *const *in, kf_status code) {
    kf_tensor out[3] = {{0}};
    kf_status st = kf_eval_node(n, nin, in, out);
    cr_assert_eq(st, code, "expected status %d, got %d (%s)", code, st, kf_last_error());
    cr_assert(strstr(kf_last_error(), n->name) != NULL, "message names the node: %s",
              kf_last_error());
    for (int j = 0; j < 3; j++) kf_tensor_release(&out[j]);
}

static double at(const kf_tensor *t, int64_t i) { return kf_get_f64(t, i); }

/* Wraps a double array (owned by the caller) as a tensor of dtype dt. */
static kf_tensor from(kf_dtype dt, int rank, const int64_t *dims, const double *v) {
    return tu_tensor(dt, rank, dims, v);
}

/* ---- MatMul / Gemm ----------------------------------------------------------------- */

Test(nn_matmul, batched_broadcast_matches_loops) {
    int64_t da[4] = {2, 1, 3, 4}, db[3] = {3, 4, 5}, dy[4] = {2, 3, 3, 5};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 4, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 3, db, -1, 1);
    double want[90];
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 5; j++) {
                    double s = 0;
                    for (int k = 0; k < 4; k++)
                        s += at(&a, (p * 3 + i) * 4 + k) * at(&b, (q * 4 + k) * 5 + j);
                    want[((p * 3 + q) * 3 + i) * 5 + j] = s;
                }
    kf_tensor w = from(KF_DT_FLOAT, 4, dy, want), y = {0};
    kf_node *n = mk("MatMul", 2, 1, 13);
    const kf_tensor *in[2] = {&a, &b};
    tu_eval(n, 2, in, &y);
    check_close(&y, &w, 1e-6, 1e-5);
    kf_tensor_release(&y);
    kf_tensor_release(&w);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    tu_node_free(n);
}

Test(nn_matmul, vector_operands_drop_their_dim) {
    int64_t da[1] = {4}, db[3] = {2, 4, 3};
    kf_tensor a = tu_rand(KF_DT_DOUBLE, 1, da, -2, 2), b = tu_rand(KF_DT_DOUBLE, 3, db, -2, 2),
              y = {0};
    kf_node *n = mk("MatMul", 2, 1, 13);
    const kf_tensor *in[2] = {&a, &b};
    tu_eval(n, 2, in, &y);
    cr_assert_eq(y.rank, 2);
    cr_assert_eq(y.dims[0], 2);
    cr_assert_eq(y.dims[1], 3);
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < 3; j++) {
            double s = 0;
            for (int k = 0; k < 4; k++) s += at(&a, k) * at(&b, (p * 4 + k) * 3 + j);
            cr_assert_float_eq(at(&y, p * 3 + j), s, 1e-12);
        }
    kf_tensor_release(&y);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    tu_node_free(n);
}

Test(nn_matmul, int64_is_exact_beyond_2_pow_53) {
    int64_t da[2] = {1, 2}, db[2] = {2, 1};
    int64_t av[2] = {((int64_t)1 << 60) + 1, 3}, bv[2] = {1, ((int64_t)1 << 40) + 7};
    kf_tensor a = tu_i64(2, da, av), b = tu_i64(2, db, bv), y = {0};
    kf_node *n = mk("MatMul", 2, 1, 13);
    const kf_tensor *in[2] = {&a, &b};
    tu_eval(n, 2, in, &y);
    cr_assert_eq(((int64_t *)y.data)[0], av[0] + 3 * bv[1]);
    kf_tensor_release(&y);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    tu_node_free(n);
}

Test(nn_matmul, shape_keeps_symbols_and_rejects_bad_k) {
    kf_node *n = mk("MatMul", 2, 1, 13);
    const kf_op_info *info = kf_op_get(n->op);
    kf_type a, b, y;
    kf_type_unknown(&a);
    kf_type_unknown(&b);
    a.dtype = b.dtype = KF_DT_FLOAT;
    a.rank = 3;
    a.dims[0] = -1;
    a.syms[0] = 7;
    a.dims[1] = 5;
    a.dims[2] = 4;
    b.rank = 2;
    b.dims[0] = 4;
    b.dims[1] = 6;
    const kf_type *in[2] = {&a, &b};
    kf_type_unknown(&y);
    cr_assert_eq(info->shape(n, 2, in, NULL, 1, &y), KF_OK);
    cr_assert_eq(y.rank, 3);
    cr_assert_eq(y.syms[0], 7);
    cr_assert_eq(y.dims[2], 6);
    b.dims[0] = 3;
    cr_assert_eq(info->shape(n, 2, in, NULL, 1, &y), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "nn_MatMul"));
    tu_node_free(n);
}

Test(nn_gemm, transposes_alpha_beta_and_bias_broadcast) {
    int64_t da[2] = {4, 3}, db[2] = {5, 4}, dc[1] = {5}, dy[2] = {3, 5};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 2, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 2, db, -1, 1);
    kf_tensor c = tu_rand(KF_DT_FLOAT, 1, dc, -1, 1), y = {0};
    double want[15];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            double s = 0;
            for (int k = 0; k < 4; k++) s += at(&a, k * 3 + i) * at(&b, j * 4 + k);
            want[i * 5 + j] = 0.5 * s + 2.0 * at(&c, j);
        }
    kf_tensor w = from(KF_DT_FLOAT, 2, dy, want);
    kf_node *n = mk("Gemm", 3, 1, 13);
    tu_attr_i(n, "transA", 1);
    tu_attr_i(n, "transB", 1);
    tu_attr_f(n, "alpha", 0.5f);
    tu_attr_f(n, "beta", 2.0f);
    const kf_tensor *in[3] = {&a, &b, &c};
    tu_eval(n, 3, in, &y);
    check_close(&y, &w, 1e-6, 1e-5);
    /* C is optional from opset 11 only */
    kf_tensor_release(&y);
    tu_eval(n, 2, in, &y);
    kf_node *old = mk("Gemm", 3, 1, 9);
    tu_attr_i(old, "transA", 1);
    tu_attr_i(old, "transB", 1);
    expect_fail(old, 2, in, KF_ERR_BAD_MODEL);
    /* before opset 7, C must be (M, N) unless broadcast is set */
    kf_node *v6 = mk("Gemm", 3, 1, 6);
    tu_attr_i(v6, "transA", 1);
    tu_attr_i(v6, "transB", 1);
    expect_fail(v6, 3, in, KF_ERR_SHAPE);
    tu_attr_i(v6, "broadcast", 1);
    tu_eval(v6, 3, in, &y);
    kf_tensor_release(&y);
    kf_tensor_release(&w);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    kf_tensor_release(&c);
    tu_node_free(n);
    tu_node_free(old);
    tu_node_free(v6);
}

Test(nn_gemm, rejects_mismatched_inner_dims) {
    int64_t da[2] = {3, 4}, db[2] = {3, 5};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 2, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 2, db, -1, 1);
    kf_node *n = mk("Gemm", 2, 1, 13);
    const kf_tensor *in[2] = {&a, &b};
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    tu_node_free(n);
}

/* ---- Conv / ConvTranspose ---------------------------------------------------------- */

/* Plain 2-D grouped convolution. */
static void conv2d_ref(const kf_tensor *x, const kf_tensor *w, const kf_tensor *b, int group,
                       const int64_t *s, const int64_t *d, const int64_t *p, int64_t oh, int64_t ow,
                       double *y) {
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    int64_t M = w->dims[0], Cg = w->dims[1], KH = w->dims[2], KW = w->dims[3], Mg = M / group;
    for (int64_t nn = 0; nn < N; nn++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? at(b, m) : 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t u = 0; u < KH; u++)
                            for (int64_t v = 0; v < KW; v++) {
                                int64_t hh = i * s[0] + u * d[0] - p[0],
                                        ww = j * s[1] + v * d[1] - p[1];
                                if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                                int64_t ci = (m / Mg) * Cg + c;
                                acc += at(x, ((nn * C + ci) * H + hh) * W + ww) *
                                       at(w, ((m * Cg + c) * KH + u) * KW + v);
                            }
                    y[((nn * M + m) * oh + i) * ow + j] = acc;
                }
}

Test(nn_conv, grouped_strided_dilated_padded_2d) {
    int64_t dx[4] = {2, 4, 7, 6}, dw[4] = {6, 2, 3, 2}, db[1] = {6};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -1, 1), w = tu_rand(KF_DT_FLOAT, 4, dw, -1, 1);
    kf_tensor b = tu_rand(KF_DT_FLOAT, 1, db, -1, 1), y = {0};
    int64_t s[2] = {2, 1}, d[2] = {1, 2}, pads[4] = {1, 0, 2, 1};
    /* oh = (7 + 3 - 3) / 2 + 1 = 4, ow = (6 + 1 - 3) / 1 + 1 = 5 */
    int64_t dy[4] = {2, 6, 4, 5};
    double want[240];
    conv2d_ref(&x, &w, &b, 2, s, d, pads, 4, 5, want);
    kf_tensor wt = from(KF_DT_FLOAT, 4, dy, want);
    kf_node *n = mk("Conv", 3, 1, 11);
    tu_attr_i(n, "group", 2);
    tu_attr_ints(n, "strides", 2, s);
    tu_attr_ints(n, "dilations", 2, d);
    tu_attr_ints(n, "pads", 4, pads);
    const kf_tensor *in[3] = {&x, &w, &b};
    tu_eval(n, 3, in, &y);
    check_close(&y, &wt, 1e-5, 1e-5);
    kf_tensor_release(&y);
    kf_tensor_release(&wt);
    kf_tensor_release(&x);
    kf_tensor_release(&w);
    kf_tensor_release(&b);
    tu_node_free(n);
}

Test(nn_conv, same_upper_and_lower_pad_differently) {
    int64_t dx[4] = {1, 1, 5, 5}, dw[4] = {1, 1, 2, 2};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 4, dx, -1, 1), w = tu_rand(KF_DT_DOUBLE, 4, dw, -1, 1),
              y = {0};
    int64_t s[2] = {1, 1}, d[2] = {1, 1};
    const char *modes[2] = {"SAME_UPPER", "SAME_LOWER"};
    int64_t pads[2][4] = {{0, 0, 1, 1}, {1, 1, 0, 0}};
    for (int k = 0; k < 2; k++) {
        double want[25];
        conv2d_ref(&x, &w, NULL, 1, s, d, pads[k], 5, 5, want);
        kf_node *n = mk("Conv", 2, 1, 11);
        tu_attr_s(n, "auto_pad", modes[k]);
        const kf_tensor *in[2] = {&x, &w};
        tu_eval(n, 2, in, &y);
        kf_tensor wt = from(KF_DT_DOUBLE, 4, (int64_t[]){1, 1, 5, 5}, want);
        check_close(&y, &wt, 1e-12, 1e-12);
        kf_tensor_release(&wt);
        kf_tensor_release(&y);
        tu_node_free(n);
    }
    kf_tensor_release(&x);
    kf_tensor_release(&w);
}

Test(nn_conv, rejects_bad_attributes_and_channels) {
    int64_t dx[4] = {1, 4, 5, 5}, dw[4] = {2, 3, 3, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -1, 1), w = tu_rand(KF_DT_FLOAT, 4, dw, -1, 1);
    const kf_tensor *in[2] = {&x, &w};
    kf_node *n = mk("Conv", 2, 1, 11);
    expect_fail(n, 2, in, KF_ERR_SHAPE); /* 4 channels vs 3 x group 1 */
    tu_node_free(n);
    int64_t dw2[4] = {2, 4, 3, 3};
    kf_tensor w2 = tu_rand(KF_DT_FLOAT, 4, dw2, -1, 1);
    in[1] = &w2;
    n = mk("Conv", 2, 1, 11);
    int64_t neg[4] = {0, -1, 0, 0};
    tu_attr_ints(n, "pads", 4, neg);
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Conv", 2, 1, 11);
    tu_attr_s(n, "auto_pad", "SOMETIMES");
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Conv", 2, 1, 11);
    int64_t zero[2] = {0, 1};
    tu_attr_ints(n, "strides", 2, zero);
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Conv", 2, 1, 11);
    int64_t big[2] = {9, 9};
    tu_attr_ints(n, "dilations", 2, big);
    expect_fail(n, 2, in, KF_ERR_SHAPE); /* window larger than the input */
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&w);
    kf_tensor_release(&w2);
}

/* ConvTranspose as a gather: y[o] = sum over taps k with (o + p - k d) = i s. */
Test(nn_convtranspose, grouped_strided_with_output_padding) {
    int64_t dx[3] = {2, 4, 5}, dw[3] = {4, 3, 3}, db[1] = {6};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dx, -1, 1), w = tu_rand(KF_DT_FLOAT, 3, dw, -1, 1);
    kf_tensor b = tu_rand(KF_DT_FLOAT, 1, db, -1, 1), y = {0};
    int64_t s = 2, d = 2, pb = 1, pe = 2, op = 1, group = 2;
    int64_t L = s * (5 - 1) + op + (3 - 1) * d + 1 - pb - pe; /* 11 */
    int64_t dy[3] = {2, 6, L};
    double want[2 * 6 * 11];
    for (int64_t nn = 0; nn < 2; nn++)
        for (int64_t m = 0; m < 6; m++)
            for (int64_t o = 0; o < L; o++) {
                double acc = at(&b, m);
                int64_t g = m / 3, mm = m % 3;
                for (int64_t c = 0; c < 2; c++)
                    for (int64_t k = 0; k < 3; k++) {
                        int64_t t = o + pb - k * d;
                        if (t < 0 || t % s) continue;
                        int64_t i = t / s;
                        if (i >= 5) continue;
                        int64_t ci = g * 2 + c;
                        acc += at(&x, (nn * 4 + ci) * 5 + i) * at(&w, (ci * 3 + mm) * 3 + k);
                    }
                want[(nn * 6 + m) * L + o] = acc;
            }
    kf_tensor wt = from(KF_DT_FLOAT, 3, dy, want);
    kf_node *n = mk("ConvTranspose", 3, 1, 11);
    tu_attr_i(n, "group", group);
    tu_attr_ints(n, "strides", 1, &s);
    tu_attr_ints(n, "dilations", 1, &d);
    tu_attr_ints(n, "pads", 2, (int64_t[]){pb, pe});
    tu_attr_ints(n, "output_padding", 1, &op);
    const kf_tensor *in[3] = {&x, &w, &b};
    tu_eval(n, 3, in, &y);
    check_close(&y, &wt, 1e-5, 1e-5);
    kf_tensor_release(&y);
    /* output_shape fixes the size and derives the pads */
    kf_node *n2 = mk("ConvTranspose", 3, 1, 11);
    tu_attr_i(n2, "group", group);
    tu_attr_ints(n2, "strides", 1, &s);
    tu_attr_ints(n2, "dilations", 1, &d);
    tu_attr_ints(n2, "output_padding", 1, &op);
    tu_attr_ints(n2, "output_shape", 1, &L);
    tu_eval(n2, 3, in, &y);
    cr_assert_eq(y.dims[2], L);
    /* the total padding 3 now goes 2 before and 1 after: the result above shifted by one */
    for (int64_t i = 0; i + 1 < L; i++) cr_assert_float_eq(at(&y, i), at(&wt, i + 1), 1e-5);
    kf_tensor_release(&y);
    kf_tensor_release(&wt);
    kf_tensor_release(&x);
    kf_tensor_release(&w);
    kf_tensor_release(&b);
    tu_node_free(n);
    tu_node_free(n2);
}

/* ---- pooling -------------------------------------------------------------------------- */

Test(nn_pool, maxpool_ceil_mode_pads_and_indices) {
    int64_t dx[4] = {1, 2, 6, 5};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -1, 1);
    kf_tensor out[2] = {{0}};
    kf_node *n = mk("MaxPool", 1, 2, 12);
    int64_t k[2] = {3, 2}, s[2] = {2, 2}, p[4] = {1, 0, 0, 0};
    tu_attr_ints(n, "kernel_shape", 2, k);
    tu_attr_ints(n, "strides", 2, s);
    tu_attr_ints(n, "pads", 4, p);
    tu_attr_i(n, "ceil_mode", 1);
    const kf_tensor *in[1] = {&x};
    cr_assert_eq(kf_eval_node(n, 1, in, out), KF_OK, "%s", kf_last_error());
    /* H: ceil((6 + 1 - 3) / 2) + 1 = 3; W: ceil((5 - 2) / 2) + 1 = 3 */
    cr_assert_eq(out[0].dims[2], 3);
    cr_assert_eq(out[0].dims[3], 3);
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                double best = -INFINITY;
                int64_t arg = -1;
                for (int u = 0; u < 3; u++)
                    for (int v = 0; v < 2; v++) {
                        int hh = i * 2 - 1 + u, ww = j * 2 + v;
                        if (hh < 0 || hh >= 6 || ww >= 5) continue;
                        int64_t idx = (c * 6 + hh) * 5 + ww;
                        if (at(&x, idx) > best) {
                            best = at(&x, idx);
                            arg = idx;
                        }
                    }
                int64_t o = (c * 3 + i) * 3 + j;
                cr_assert_float_eq(at(&out[0], o), best, 0);
                cr_assert_eq(((int64_t *)out[1].data)[o], arg);
            }
    kf_tensor_release(&out[0]);
    kf_tensor_release(&out[1]);
    kf_tensor_release(&x);
    tu_node_free(n);
}

Test(nn_pool, averagepool_counts_pads_only_when_asked) {
    int64_t dx[3] = {2, 3, 7};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 3, dx, -1, 1), y = {0};
    for (int cip = 0; cip < 2; cip++) {
        kf_node *n = mk("AveragePool", 1, 1, 11);
        int64_t k = 3, s = 2, p[2] = {1, 2};
        tu_attr_ints(n, "kernel_shape", 1, &k);
        tu_attr_ints(n, "strides", 1, &s);
        tu_attr_ints(n, "pads", 2, p);
        tu_attr_i(n, "count_include_pad", cip);
        const kf_tensor *in[1] = {&x};
        tu_eval(n, 1, in, &y);
        cr_assert_eq(y.dims[2], 4); /* (7 + 3 - 3) / 2 + 1 */
        for (int pl = 0; pl < 6; pl++)
            for (int o = 0; o < 4; o++) {
                double sum = 0;
                int cnt = 0;
                for (int t = 0; t < 3; t++) {
                    int q = o * 2 - 1 + t;
                    if (q >= 0 && q < 7) {
                        sum += at(&x, pl * 7 + q);
                        cnt++;
                    }
                }
                if (cip) cnt = 3;
                cr_assert_float_eq(at(&y, pl * 4 + o), sum / cnt, 1e-12);
            }
        kf_tensor_release(&y);
        tu_node_free(n);
    }
    kf_tensor_release(&x);
}

Test(nn_pool, lppool_and_global_pools) {
    int64_t dx[4] = {2, 3, 4, 5};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -2, 2), y = {0};
    const kf_tensor *in[1] = {&x};
    const char *ops[3] = {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"};
    for (int o = 0; o < 3; o++) {
        kf_node *n = mk(ops[o], 1, 1, 2);
        if (o == 2) tu_attr_i(n, "p", 3);
        tu_eval(n, 1, in, &y);
        cr_assert_eq(y.rank, 4);
        cr_assert_eq(y.dims[2], 1);
        for (int pl = 0; pl < 6; pl++) {
            double acc = o == 1 ? -INFINITY : 0;
            for (int i = 0; i < 20; i++) {
                double v = at(&x, pl * 20 + i);
                if (o == 0) acc += v / 20;
                else if (o == 1) acc = v > acc ? v : acc;
                else acc += fabs(v) * fabs(v) * fabs(v);
            }
            if (o == 2) acc = cbrt(acc);
            cr_assert_float_eq(at(&y, pl), acc, 1e-5);
        }
        kf_tensor_release(&y);
        tu_node_free(n);
    }
    kf_node *n = mk("LpPool", 1, 1, 11);
    int64_t k[2] = {2, 2};
    tu_attr_ints(n, "kernel_shape", 2, k);
    tu_eval(n, 1, in, &y);
    cr_assert_eq(y.dims[2], 3);
    cr_assert_eq(y.dims[3], 4);
    double v0 = sqrt(pow(at(&x, 0), 2) + pow(at(&x, 1), 2) + pow(at(&x, 5), 2) + pow(at(&x, 6), 2));
    cr_assert_float_eq(at(&y, 0), v0, 1e-5);
    kf_tensor_release(&y);
    kf_tensor_release(&x);
    tu_node_free(n);
}

Test(nn_pool, rejects_missing_kernel_and_old_dilations) {
    int64_t dx[4] = {1, 1, 4, 4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -1, 1);
    const kf_tensor *in[1] = {&x};
    kf_node *n = mk("MaxPool", 1, 1, 12);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("AveragePool", 1, 1, 11);
    int64_t k[2] = {2, 2}, d[2] = {2, 2};
    tu_attr_ints(n, "kernel_shape", 2, k);
    tu_attr_ints(n, "dilations", 2, d);
    expect_fail(n, 1, in, KF_ERR_UNSUPPORTED);
    tu_node_free(n);
    n = mk("MaxPool", 1, 1, 12);
    int64_t k3[3] = {2, 2, 2};
    tu_attr_ints(n, "kernel_shape", 3, k3);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
}

Test(nn_pool, maxunpool_scatters_and_checks_indices) {
    int64_t dx[4] = {1, 1, 2, 2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -1, 1), y = {0};
    int64_t iv[4] = {0, 3, 10, 13};
    kf_tensor ind = tu_i64(4, dx, iv);
    kf_node *n = mk("MaxUnpool", 2, 1, 11);
    int64_t k[2] = {2, 2}, s[2] = {2, 2};
    tu_attr_ints(n, "kernel_shape", 2, k);
    tu_attr_ints(n, "strides", 2, s);
    const kf_tensor *in[2] = {&x, &ind};
    tu_eval(n, 2, in, &y);
    cr_assert_eq(y.dims[2], 4);
    for (int i = 0, j = 0; i < 16; i++) {
        double want = (j < 4 && iv[j] == i) ? at(&x, j++) : 0.0;
        cr_assert_float_eq(at(&y, i), want, 0);
    }
    kf_tensor_release(&y);
    ((int64_t *)ind.data)[2] = 16;
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    kf_tensor_release(&x);
    kf_tensor_release(&ind);
    tu_node_free(n);
}

/* ---- Einsum / Det ------------------------------------------------------------------------ */

Test(nn_einsum, batched_chain_and_diagonal) {
    int64_t da[3] = {2, 3, 4}, db[3] = {2, 4, 5}, dc[2] = {5, 2};
    kf_tensor a = tu_rand(KF_DT_FLOAT, 3, da, -1, 1), b = tu_rand(KF_DT_FLOAT, 3, db, -1, 1);
    kf_tensor c = tu_rand(KF_DT_FLOAT, 2, dc, -1, 1), y = {0};
    kf_node *n = mk("Einsum", 3, 1, 12);
    tu_attr_s(n, "equation", "bij, bjk, kl -> bil");
    const kf_tensor *in[3] = {&a, &b, &c};
    tu_eval(n, 3, in, &y);
    cr_assert_eq(y.rank, 3);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 3; i++)
            for (int l = 0; l < 2; l++) {
                double s = 0;
                for (int j = 0; j < 4; j++)
                    for (int k = 0; k < 5; k++)
                        s += at(&a, (p * 3 + i) * 4 + j) * at(&b, (p * 4 + j) * 5 + k) *
                             at(&c, k * 2 + l);
                cr_assert_float_eq(at(&y, (p * 3 + i) * 2 + l), s, 1e-5);
            }
    kf_tensor_release(&y);
    tu_node_free(n);
    /* implicit output of a repeated label: the trace */
    int64_t dm[2] = {4, 4};
    kf_tensor m = tu_rand(KF_DT_INT32, 2, dm, -50, 50);
    n = mk("Einsum", 1, 1, 12);
    tu_attr_s(n, "equation", "ii");
    const kf_tensor *in1[1] = {&m};
    tu_eval(n, 1, in1, &y);
    cr_assert_eq(y.rank, 0);
    int64_t tr = 0;
    for (int i = 0; i < 4; i++) tr += kf_get_i64(&m, i * 5);
    cr_assert_eq(kf_get_i64(&y, 0), tr);
    kf_tensor_release(&y);
    tu_node_free(n);
    /* ellipsis broadcasting, implicit output ordered alphabetically */
    int64_t de[3] = {3, 1, 2}, df[2] = {4, 2};
    kf_tensor e = tu_rand(KF_DT_DOUBLE, 3, de, -1, 1), f = tu_rand(KF_DT_DOUBLE, 2, df, -1, 1);
    n = mk("Einsum", 2, 1, 12);
    tu_attr_s(n, "equation", "...b,...b");
    const kf_tensor *in2[2] = {&e, &f};
    tu_eval(n, 2, in2, &y);
    cr_assert_eq(y.rank, 2);
    cr_assert_eq(y.dims[0], 3);
    cr_assert_eq(y.dims[1], 4);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            cr_assert_float_eq(
                at(&y, i * 4 + j),
                at(&e, i * 2) * at(&f, j * 2) + at(&e, i * 2 + 1) * at(&f, j * 2 + 1), 1e-12);
    kf_tensor_release(&y);
    tu_node_free(n);
    n = mk("Einsum", 2, 1, 12);
    tu_attr_s(n, "equation", "ij,jk->iz");
    const kf_tensor *mm[2] = {&m, &m};
    expect_fail(n, 2, mm, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = mk("Einsum", 2, 1, 12);
    tu_attr_s(n, "equation", "ij,jk");
    const kf_tensor *bad[2] = {&a, &c};
    expect_fail(n, 2, bad, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    kf_tensor_release(&c);
    kf_tensor_release(&m);
    kf_tensor_release(&e);
    kf_tensor_release(&f);
}

Test(nn_det, matches_cofactor_expansion) {
    int64_t dx[3] = {4, 3, 3};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 3, dx, -2, 2), y = {0};
    kf_node *n = mk("Det", 1, 1, 11);
    const kf_tensor *in[1] = {&x};
    tu_eval(n, 1, in, &y);
    cr_assert_eq(y.rank, 1);
    for (int b = 0; b < 4; b++) {
        const double *m = (const double *)x.data + b * 9;
        double d = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                   m[2] * (m[3] * m[7] - m[4] * m[6]);
        cr_assert_float_eq(at(&y, b), d, 1e-12);
    }
    kf_tensor_release(&y);
    int64_t bad[2] = {2, 3};
    kf_tensor r = tu_rand(KF_DT_FLOAT, 2, bad, -1, 1);
    in[0] = &r;
    expect_fail(n, 1, in, KF_ERR_SHAPE);
    kf_tensor_release(&r);
    kf_tensor_release(&x);
    tu_node_free(n);
}

/* CausalConvWithState (27): each output is bias + the k taps over the past
 * state followed by the input; present_state holds the last k-1 of them
 * (reaching into the past when the input is shorter); silu multiplies by
 * the sigmoid. Checked against direct sums for a long and a short input,
 * with and without past, bias and activation. */
Test(nn_conv, causal_conv_with_state_matches_direct_sums) {
    enum { B = 2, C = 3, K = 4, H = K - 1 };
    for (int shape = 0; shape < 2; shape++) {
        int64_t L = shape ? 2 : 6; /* shorter than k-1 the second time */
        int64_t dx[3] = {B, C, L}, dw[3] = {C, 1, K}, db[1] = {C}, dp[3] = {B, C, H};
        kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dx, -2, 2), w = tu_rand(KF_DT_FLOAT, 3, dw, -1, 1);
        kf_tensor bias = tu_rand(KF_DT_FLOAT, 1, db, -1, 1), past = tu_rand(KF_DT_FLOAT, 3, dp, -2, 2);
        for (int variant = 0; variant < 4; variant++) {
            bool with_past = variant & 1, silu = variant & 2;
            kf_node *n = tu_node("CausalConvWithState", 4, 2, 27);
            if (silu) tu_attr_s(n, "activation", variant == 3 ? "silu" : "swish");
            const kf_tensor *in[4] = {&x, &w, silu ? &bias : NULL, with_past ? &past : NULL};
            kf_tensor out[2] = {{0}};
            cr_assert_eq(kf_eval_node(n, 4, in, out), KF_OK, "%s", kf_last_error());
            cr_assert_eq(out[1].dims[2], H);
            for (int64_t b = 0; b < B; b++)
                for (int64_t c = 0; c < C; c++) {
                    double padded[H + 6];
                    for (int64_t p = 0; p < H; p++) padded[p] = with_past ? at(&past, (b * C + c) * H + p) : 0;
                    for (int64_t t = 0; t < L; t++) padded[H + t] = at(&x, (b * C + c) * L + t);
                    for (int64_t t = 0; t < L; t++) {
                        double s = silu ? at(&bias, c) : 0;
                        for (int j = 0; j < K; j++) s += at(&w, c * K + j) * padded[t + j];
                        if (silu) s = s / (1 + exp(-s));
                        cr_assert_float_eq(at(&out[0], (b * C + c) * L + t), s, 1e-5, "y[%lld,%lld,%lld]",
                                           (long long)b, (long long)c, (long long)t);
                    }
                    for (int64_t p = 0; p < H; p++)
                        cr_assert_eq(at(&out[1], (b * C + c) * H + p), padded[L + p], "state %lld", (long long)p);
                }
            kf_tensor_release(&out[0]);
            kf_tensor_release(&out[1]);
            tu_node_free(n);
        }
        kf_node *bad = tu_node("CausalConvWithState", 2, 2, 27);
        tu_attr_s(bad, "activation", "relu");
        const kf_tensor *in2[2] = {&x, &w};
        kf_tensor o2[2] = {{0}};
        cr_assert_eq(kf_eval_node(bad, 2, in2, o2), KF_ERR_BAD_MODEL);
        tu_node_free(bad);
        kf_tensor_release(&x), kf_tensor_release(&w), kf_tensor_release(&bias), kf_tensor_release(&past);
    }
}

/* ---- quantisation --------------------------------------------------------------------------- */

Test(nn_quant, quantize_per_axis_rounds_half_even_and_saturates) {
    int64_t dx[2] = {3, 4}, ds[1] = {4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dx, -300, 300), s = tu_rand(KF_DT_FLOAT, 1, ds, 0.5, 2);
    kf_tensor z = tu_rand(KF_DT_INT8, 1, ds, -20, 20), y = {0};
    ((float *)s.data)[0] = 0.5f;
    ((float *)x.data)[0] = 1.25f; /* x / s = 2.5 exactly: a tie, rounds to 2 */
    kf_node *n = mk("QuantizeLinear", 3, 1, 13);
    tu_attr_i(n, "axis", -1);
    const kf_tensor *in[3] = {&x, &s, &z};
    tu_eval(n, 3, in, &y);
    cr_assert_eq(y.dtype, KF_DT_INT8);
    for (int i = 0; i < 12; i++) {
        float q = ((float *)x.data)[i] / ((float *)s.data)[i % 4];
        double v = nearbyint(q) + kf_get_i64(&z, i % 4);
        v = v < -128 ? -128 : v > 127 ? 127 : v;
        cr_assert_eq(kf_get_i64(&y, i), (int64_t)v, "element %d", i);
    }
    cr_assert_eq(kf_get_i64(&y, 0), 2 + kf_get_i64(&z, 0));
    kf_tensor_release(&y);
    /* opset 10 has no axis: a vector scale is an error */
    kf_node *old = mk("QuantizeLinear", 3, 1, 10);
    expect_fail(old, 3, in, KF_ERR_SHAPE);
    /* a scale that fits no axis */
    int64_t d3[1] = {3};
    kf_tensor s3 = tu_rand(KF_DT_FLOAT, 1, d3, 0.5, 2);
    in[1] = &s3;
    in[2] = NULL;
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    kf_tensor_release(&s3);
    kf_tensor_release(&x);
    kf_tensor_release(&s);
    kf_tensor_release(&z);
    tu_node_free(n);
    tu_node_free(old);
}

Test(nn_quant, dequantize_per_axis_and_dynamic_quantize) {
    int64_t dx[3] = {2, 3, 2}, ds[1] = {3};
    kf_tensor x = tu_rand(KF_DT_UINT8, 3, dx, 0, 256), s = tu_rand(KF_DT_FLOAT, 1, ds, 0.01, 1);
    kf_tensor z = tu_rand(KF_DT_UINT8, 1, ds, 0, 256), y = {0};
    kf_node *n = mk("DequantizeLinear", 3, 1, 13);
    const kf_tensor *in[3] = {&x, &s, &z};
    tu_eval(n, 3, in, &y);
    for (int i = 0; i < 12; i++) {
        int c = (i / 2) % 3;
        double want = (kf_get_i64(&x, i) - kf_get_i64(&z, c)) * at(&s, c);
        cr_assert_float_eq(at(&y, i), (float)want, 0);
    }
    kf_tensor_release(&y);
    tu_node_free(n);

    int64_t dv[1] = {6};
    double vals[6] = {-1.0, 0.5, 2.0, 3.0, -0.25, 1.0};
    kf_tensor v = from(KF_DT_FLOAT, 1, dv, vals);
    kf_tensor out[3] = {{0}};
    n = mk("DynamicQuantizeLinear", 1, 3, 11);
    const kf_tensor *in1[1] = {&v};
    cr_assert_eq(kf_eval_node(n, 1, in1, out), KF_OK, "%s", kf_last_error());
    float scale = 4.0f / 255.0f;
    cr_assert_float_eq(at(&out[1], 0), scale, 0);
    double zp = nearbyint(1.0f / scale);
    cr_assert_eq(kf_get_i64(&out[2], 0), (int64_t)zp);
    for (int i = 0; i < 6; i++) {
        double q = nearbyint((float)vals[i] / scale) + zp;
        cr_assert_eq(kf_get_i64(&out[0], i), (int64_t)(q > 255 ? 255 : q < 0 ? 0 : q));
    }
    for (int j = 0; j < 3; j++) kf_tensor_release(&out[j]);
    tu_node_free(n);
    kf_tensor_release(&v);
    kf_tensor_release(&x);
    kf_tensor_release(&s);
    kf_tensor_release(&z);
}

/* Opset 23: QuantizeLinear divides in `precision` (here float16: both
 * operands and the quotient rounded to it) with a float16 scale for
 * float32 x; DequantizeLinear writes `output_dtype`. The small quantised
 * types: float8 takes x / scale converted (saturating, zero point
 * ignored), int4 rounds, adds the zero point and clips to [-8, 7], and
 * int2 dequantises as (x - zero point) * scale; a float8e8m0 scale is
 * refused naming node and type. */
Test(nn_quant, opset_23_precision_output_dtype_and_refused_types) {
    int64_t dx[2] = {4, 6};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dx, -100, 100), y = {0};
    double sv = tu_uniform(0.3, 3);
    kf_tensor s = from(KF_DT_FLOAT16, 0, NULL, &sv);
    kf_node *n = mk("QuantizeLinear", 2, 1, 25);
    tu_attr_i(n, "precision", KF_DT_FLOAT16);
    tu_attr_i(n, "output_dtype", KF_DT_INT16);
    const kf_tensor *in[2] = {&x, &s};
    tu_eval(n, 2, in, &y);
    cr_assert_eq(y.dtype, KF_DT_INT16);
    float sh = kf_half_to_float(kf_float_to_half((float)kf_get_f64(&s, 0)));
    for (int i = 0; i < 24; i++) {
        float xh = kf_half_to_float(kf_float_to_half((float)kf_get_f64(&x, i)));
        float q = kf_half_to_float(kf_float_to_half(xh / sh));
        cr_assert_eq(kf_get_i64(&y, i), (int64_t)nearbyint(q), "element %d", i);
    }
    kf_tensor_release(&y);
    tu_node_free(n);

    kf_tensor xi = tu_rand(KF_DT_INT8, 2, dx, -128, 128), sf = from(KF_DT_FLOAT, 0, NULL, &sv);
    n = mk("DequantizeLinear", 2, 1, 23);
    tu_attr_i(n, "output_dtype", KF_DT_BFLOAT16);
    const kf_tensor *din[2] = {&xi, &sf};
    tu_eval(n, 2, din, &y);
    cr_assert_eq(y.dtype, KF_DT_BFLOAT16);
    for (int i = 0; i < 24; i++) {
        float want = kf_bf16_to_float(kf_float_to_bf16((float)(kf_get_i64(&xi, i) * kf_get_f64(&sf, 0))));
        cr_assert_float_eq(at(&y, i), want, fabsf(want) * 1e-2f, "element %d", i);
    }
    kf_tensor_release(&y);
    tu_node_free(n);

    const kf_tensor *fin[2] = {&x, &sf};
    n = mk("QuantizeLinear", 2, 1, 25);
    tu_attr_i(n, "output_dtype", KF_DT_FLOAT8E4M3FN);
    tu_eval(n, 2, fin, &y);
    cr_assert_eq(y.dtype, KF_DT_FLOAT8E4M3FN);
    for (int i = 0; i < 24; i++) {
        float q = (float)kf_get_f64(&x, i) / (float)kf_get_f64(&sf, 0);
        cr_assert_eq(((uint8_t *)y.data)[i], kf_f64_to_small(KF_DT_FLOAT8E4M3FN, q, true), "element %d", i);
    }
    kf_tensor_release(&y);
    tu_node_free(n);
    double zv = tu_uniform(-3, 3);
    kf_tensor z4 = {0};
    cr_assert_eq(kf_tensor_alloc(&z4, KF_DT_INT4, 0, NULL), KF_OK);
    kf_set_f64(&z4, 0, nearbyint(zv));
    const kf_tensor *qin[3] = {&x, &sf, &z4};
    n = mk("QuantizeLinear", 3, 1, 21);
    tu_eval(n, 3, qin, &y);
    cr_assert_eq(y.dtype, KF_DT_INT4);
    for (int i = 0; i < 24; i++) {
        double v = nearbyint((float)kf_get_f64(&x, i) / (float)kf_get_f64(&sf, 0)) + nearbyint(zv);
        cr_assert_eq(kf_get_i64(&y, i), (int64_t)(v < -8 ? -8 : v > 7 ? 7 : v), "element %d", i);
    }
    kf_tensor_release(&y);
    tu_node_free(n);
    kf_tensor x2 = {0}, z2 = {0};
    cr_assert_eq(kf_tensor_alloc(&x2, KF_DT_INT2, 2, dx), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&z2, KF_DT_INT2, 0, NULL), KF_OK);
    for (int i = 0; i < 24; i++) kf_set_i64(&x2, i, (int64_t)floor(tu_uniform(-2, 2)));
    kf_set_i64(&z2, 0, -1);
    n = mk("DequantizeLinear", 3, 1, 25);
    const kf_tensor *in2[3] = {&x2, &sf, &z2};
    tu_eval(n, 3, in2, &y);
    for (int i = 0; i < 24; i++)
        cr_assert_float_eq(at(&y, i), (float)((kf_get_i64(&x2, i) + 1) * kf_get_f64(&sf, 0)), 1e-6, "element %d", i);
    kf_tensor_release(&y);
    tu_node_free(n);
    kf_tensor e8 = {0};
    cr_assert_eq(kf_tensor_alloc(&e8, KF_DT_FLOAT8E8M0, 0, NULL), KF_OK);
    ((uint8_t *)e8.data)[0] = 127;
    n = mk("DequantizeLinear", 2, 1, 25);
    const kf_tensor *ine[2] = {&x2, &e8};
    cr_assert_neq(kf_eval_node(n, 2, ine, &y), KF_OK);
    cr_assert(strstr(kf_last_error(), "float8e8m0") && strstr(kf_last_error(), kf_node_label(n)), "%s",
              kf_last_error());
    tu_node_free(n);
    kf_tensor_release(&x2), kf_tensor_release(&z2), kf_tensor_release(&z4), kf_tensor_release(&e8);
    kf_tensor_release(&xi), kf_tensor_release(&sf);
    kf_tensor_release(&x), kf_tensor_release(&s);
}

Test(nn_quant, matmulinteger_and_qlinearmatmul) {
    int64_t da[2] = {3, 4}, db[2] = {4, 2}, dza[1] = {3}, dzb[1] = {2};
    kf_tensor a = tu_rand(KF_DT_UINT8, 2, da, 0, 256), b = tu_rand(KF_DT_INT8, 2, db, -128, 128);
    kf_tensor za = tu_rand(KF_DT_UINT8, 1, dza, 0, 256), zb = tu_rand(KF_DT_INT8, 1, dzb, -5, 5),
              y = {0};
    kf_node *n = mk("MatMulInteger", 4, 1, 10);
    const kf_tensor *in[4] = {&a, &b, &za, &zb};
    tu_eval(n, 4, in, &y);
    cr_assert_eq(y.dtype, KF_DT_INT32);
    int64_t acc[6];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            int64_t s = 0;
            for (int k = 0; k < 4; k++)
                s += (kf_get_i64(&a, i * 4 + k) - kf_get_i64(&za, i)) *
                     (kf_get_i64(&b, k * 2 + j) - kf_get_i64(&zb, j));
            acc[i * 2 + j] = s;
            cr_assert_eq(kf_get_i64(&y, i * 2 + j), s);
        }
    kf_tensor_release(&y);
    tu_node_free(n);
    /* zero point with the wrong length */
    int64_t d5[1] = {5};
    kf_tensor z5 = tu_rand(KF_DT_UINT8, 1, d5, 0, 256);
    in[2] = &z5;
    n = mk("MatMulInteger", 4, 1, 10);
    expect_fail(n, 4, in, KF_ERR_SHAPE);
    tu_node_free(n);

    /* QLinearMatMul with per-tensor parameters */
    double one[1];
    one[0] = 0.02;
    kf_tensor as = from(KF_DT_FLOAT, 0, NULL, one);
    one[0] = 0.5;
    kf_tensor ys = from(KF_DT_FLOAT, 0, NULL, one);
    one[0] = 10;
    kf_tensor yz = from(KF_DT_INT8, 0, NULL, one);
    one[0] = 0;
    kf_tensor bz0 = from(KF_DT_INT8, 0, NULL, one);
    one[0] = 128;
    kf_tensor az0 = from(KF_DT_UINT8, 0, NULL, one);
    const kf_tensor *qin[8] = {&a, &as, &az0, &b, &as, &bz0, &ys, &yz};
    n = mk("QLinearMatMul", 8, 1, 10);
    tu_eval(n, 8, qin, &y);
    cr_assert_eq(y.dtype, KF_DT_INT8);
    float mult = 0.02f * 0.02f / 0.5f;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            int64_t s = 0;
            for (int k = 0; k < 4; k++)
                s += (kf_get_i64(&a, i * 4 + k) - 128) * kf_get_i64(&b, k * 2 + j);
            double v = nearbyint((double)s * mult) + 10;
            v = v < -128 ? -128 : v > 127 ? 127 : v;
            cr_assert_eq(kf_get_i64(&y, i * 2 + j), (int64_t)v);
        }
    (void)acc;
    kf_tensor_release(&y);
    tu_node_free(n);
    kf_tensor *all[] = {&a, &b, &za, &zb, &z5, &as, &ys, &yz, &bz0, &az0};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) kf_tensor_release(all[i]);
}

Test(nn_quant, convinteger_and_qlinearconv_per_channel) {
    int64_t dx[4] = {1, 2, 4, 4}, dw[4] = {3, 2, 2, 2}, dm[1] = {3};
    kf_tensor x = tu_rand(KF_DT_UINT8, 4, dx, 0, 256), w = tu_rand(KF_DT_INT8, 4, dw, -128, 128);
    kf_tensor wz = tu_rand(KF_DT_INT8, 1, dm, -3, 3), y = {0};
    double xzv[1] = {100};
    kf_tensor xz = from(KF_DT_UINT8, 0, NULL, xzv);
    kf_node *n = mk("ConvInteger", 4, 1, 10);
    int64_t p[4] = {1, 0, 0, 1};
    tu_attr_ints(n, "pads", 4, p);
    const kf_tensor *in[4] = {&x, &w, &xz, &wz};
    tu_eval(n, 4, in, &y);
    cr_assert_eq(y.dims[2], 4);
    cr_assert_eq(y.dims[3], 4);
    int64_t ref[48];
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                int64_t s = 0;
                for (int c = 0; c < 2; c++)
                    for (int u = 0; u < 2; u++)
                        for (int v = 0; v < 2; v++) {
                            int hh = i - 1 + u, ww = j + v;
                            if (hh < 0 || hh >= 4 || ww >= 4) continue;
                            s += (kf_get_i64(&x, (c * 4 + hh) * 4 + ww) - 100) *
                                 (kf_get_i64(&w, ((m * 2 + c) * 2 + u) * 2 + v) -
                                  kf_get_i64(&wz, m));
                        }
                ref[(m * 4 + i) * 4 + j] = s;
                cr_assert_eq(kf_get_i64(&y, (m * 4 + i) * 4 + j), s);
            }
    kf_tensor_release(&y);
    /* QLinearConv: the same accumulators, scaled per output channel */
    kf_tensor ws = tu_rand(KF_DT_FLOAT, 1, dm, 0.001, 0.01);
    double sv[1] = {0.05};
    kf_tensor xs = from(KF_DT_FLOAT, 0, NULL, sv);
    sv[0] = 0.2;
    kf_tensor ys = from(KF_DT_FLOAT, 0, NULL, sv);
    sv[0] = 3;
    kf_tensor yz = from(KF_DT_UINT8, 0, NULL, sv);
    kf_tensor bias = tu_rand(KF_DT_INT32, 1, dm, -500, 500);
    const kf_tensor *qin[9] = {&x, &xs, &xz, &w, &ws, &wz, &ys, &yz, &bias};
    kf_node *q = mk("QLinearConv", 9, 1, 10);
    tu_attr_ints(q, "pads", 4, p);
    tu_eval(q, 9, qin, &y);
    cr_assert_eq(y.dtype, KF_DT_UINT8);
    for (int i = 0; i < 48; i++) {
        int m = i / 16;
        float mult = 0.05f * ((float *)ws.data)[m] / 0.2f;
        double v = nearbyint((double)(ref[i] + kf_get_i64(&bias, m)) * mult) + 3;
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        cr_assert_eq(kf_get_i64(&y, i), (int64_t)v, "element %d", i);
    }
    kf_tensor_release(&y);
    /* a per-channel scale of the wrong length */
    int64_t d2[1] = {2};
    kf_tensor ws2 = tu_rand(KF_DT_FLOAT, 1, d2, 0.001, 0.01);
    qin[4] = &ws2;
    expect_fail(q, 9, qin, KF_ERR_SHAPE);
    kf_tensor *all[] = {&x, &w, &wz, &xz, &ws, &xs, &ys, &yz, &bias, &ws2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) kf_tensor_release(all[i]);
    tu_node_free(n);
    tu_node_free(q);
}

/* ---- recurrent ops ------------------------------------------------------------------------- */

static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* Row k of M (rows x cols) dotted with v. */
static double dotrow(const kf_tensor *m, int64_t base, int64_t k, int64_t cols, const double *v) {
    double s = 0;
    for (int64_t j = 0; j < cols; j++) s += at(m, base + k * cols + j) * v[j];
    return s;
}

/* One direction of RNN / GRU (linear_before_reset 0) / LSTM (peepholes) over
 * X [S, B, I]; writes Y [S, 1, B, H] at direction 0 of D. */
static void rnn_ref(int kind, const kf_tensor *X, const kf_tensor *W, const kf_tensor *R,
                    const kf_tensor *Bs, const kf_tensor *P, int64_t H, const int *lens, bool rev,
                    int64_t dir, int64_t D, double *Y, double *Yh) {
    int64_t B = X->dims[1], I = X->dims[2];
    int64_t G = kind == 0 ? 1 : kind == 1 ? 3 : 4, GH = G * H;
    int64_t wo = dir * GH * I, ro = dir * GH * H, bo = dir * 2 * GH;
    for (int64_t b = 0; b < B; b++) {
        double h[8] = {0}, c[8] = {0}, x[8], nh[8];
        for (int s = 0; s < lens[b]; s++) {
            int64_t t = rev ? lens[b] - 1 - s : s;
            for (int64_t i = 0; i < I; i++) x[i] = at(X, (t * B + b) * I + i);
            for (int64_t j = 0; j < H; j++) {
#define PRE(k)                                                                                     \
    (dotrow(W, wo, (k), I, x) + dotrow(R, ro, (k), H, h) + at(Bs, bo + (k)) + at(Bs, bo + GH + (k)))
                if (kind == 0) {
                    nh[j] = tanh(PRE(j));
                } else if (kind == 1) {
                    double z = sigm(PRE(j));
                    double rh[8];
                    for (int64_t q = 0; q < H; q++) rh[q] = sigm(PRE(H + q)) * h[q];
                    double cand =
                        tanh(dotrow(W, wo, 2 * H + j, I, x) + dotrow(R, ro, 2 * H + j, H, rh) +
                             at(Bs, bo + 2 * H + j) + at(Bs, bo + GH + 2 * H + j));
                    nh[j] = (1 - z) * cand + z * h[j];
                } else {
                    double ig = sigm(PRE(j) + at(P, dir * 3 * H + j) * c[j]);
                    double fg = sigm(PRE(2 * H + j) + at(P, dir * 3 * H + 2 * H + j) * c[j]);
                    double cc = tanh(PRE(3 * H + j));
                    double cn = fg * c[j] + ig * cc;
                    double og = sigm(PRE(H + j) + at(P, dir * 3 * H + H + j) * cn);
                    nh[j] = og * tanh(cn);
                    c[j + 4] = cn; /* new cell, committed below */
                }
#undef PRE
            }
            for (int64_t j = 0; j < H; j++) {
                h[j] = nh[j];
                if (kind == 2) c[j] = c[j + 4];
                Y[((t * D + dir) * B + b) * H + j] = h[j];
            }
        }
        for (int64_t j = 0; j < H; j++) Yh[(dir * B + b) * H + j] = h[j];
    }
}

Test(nn_rnn, all_three_match_step_loops) {
    const char *ops[3] = {"RNN", "GRU", "LSTM"};
    int64_t S = 3, B = 2, I = 3, H = 2;
    for (int kind = 0; kind < 3; kind++) {
        int64_t G = kind == 0 ? 1 : kind == 1 ? 3 : 4;
        int64_t D = kind == 0 ? 2 : 1; /* RNN bidirectional with sequence lengths */
        int64_t dx[3] = {S, B, I}, dw[3] = {D, G * H, I}, dr[3] = {D, G * H, H},
                db[2] = {D, 2 * G * H};
        int64_t dp[2] = {D, 3 * H}, dl[1] = {B};
        kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dx, -1, 1), w = tu_rand(KF_DT_FLOAT, 3, dw, -1, 1);
        kf_tensor r = tu_rand(KF_DT_FLOAT, 3, dr, -1, 1), bs = tu_rand(KF_DT_FLOAT, 2, db, -1, 1);
        kf_tensor p = tu_rand(KF_DT_FLOAT, 2, dp, -1, 1);
        int lens[2] = {3, kind == 0 ? 2 : 3};
        double lv[2] = {lens[0], lens[1]};
        kf_tensor sl = from(KF_DT_INT32, 1, dl, lv);
        double Y[3 * 2 * 2 * 2] = {0}, Yh[2 * 2 * 2] = {0};
        for (int64_t dir = 0; dir < D; dir++)
            rnn_ref(kind, &x, &w, &r, &bs, &p, H, lens, dir == 1, dir, D, Y, Yh);
        kf_node *n = mk(ops[kind], kind == 2 ? 8 : 5, 2, 14);
        tu_attr_i(n, "hidden_size", H);
        if (kind == 0) tu_attr_s(n, "direction", "bidirectional");
        const kf_tensor *in[8] = {&x, &w, &r, &bs, &sl, NULL, NULL, &p};
        kf_tensor out[2] = {{0}};
        cr_assert_eq(kf_eval_node(n, kind == 2 ? 8 : 5, in, out), KF_OK, "%s: %s", ops[kind],
                     kf_last_error());
        int64_t dy[4] = {S, D, B, H}, dh[3] = {D, B, H};
        kf_tensor wy = from(KF_DT_FLOAT, 4, dy, Y), wh = from(KF_DT_FLOAT, 3, dh, Yh);
        check_close(&out[0], &wy, 1e-5, 1e-5);
        check_close(&out[1], &wh, 1e-5, 1e-5);
        kf_tensor_release(&out[0]);
        kf_tensor_release(&out[1]);
        /* a sequence length beyond the sequence */
        ((int32_t *)sl.data)[1] = 4;
        expect_fail(n, kind == 2 ? 8 : 5, in, KF_ERR_RUNTIME);
        tu_node_free(n);
        n = mk(ops[kind], 3, 2, 14);
        tu_attr_s(n, "direction", "sideways");
        expect_fail(n, 3, in, KF_ERR_BAD_MODEL);
        tu_node_free(n);
        kf_tensor *all[] = {&x, &w, &r, &bs, &p, &sl, &wy, &wh};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) kf_tensor_release(all[i]);
    }
}
