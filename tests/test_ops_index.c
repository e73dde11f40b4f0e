/* test_ops_index.c: indexing, gather/scatter and resampling kernels against
 * straightforward loops written here, hand-computed ONNX examples, and the
 * errors for bad attributes, shapes and out-of-range indices. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* A node with a distinctive name, so error tests can look for it. */
static kf_node *node(const char *op, int nin, int nout, int64_t opset) {
    kf_node *n = tu_node(op, nin, nout, opset);
    free(n->name);
    n->name = strdup("idx_under_test");
    return n;
}

static int64_t rand_int(int64_t lo, int64_t hi) { return (int64_t)floor(tu_uniform((double)lo, (double)hi)); }

static kf_tensor rand_idx(int rank, const int64_t *dims, int64_t lo, int64_t hi) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_INT64, rank, dims), KF_OK);
    for (int64_t i = 0; i < t.numel; i++) ((int64_t *)t.data)[i] = rand_int(lo, hi);
    return t;
}

/* Runs n expecting failure with code; checks the message names the node. */
static void expect_fail(kf_node *n, int nin, const kf_tensor *const *in, kf_status code) {
    kf_tensor out[4] = {{0}};
    kf_status st = kf_eval_node(n, nin, in, out);
    cr_assert_eq(st, code, "expected status %d, got %d (%s)", code, st, kf_last_error());
    cr_assert(strstr(kf_last_error(), "idx_under_test") != NULL, "message names the node: %s", kf_last_error());
}

static void release(int count, kf_tensor *t) {
    for (int i = 0; i < count; i++) kf_tensor_release(&t[i]);
}

static kf_tensor strings(int count, const char *const *s) {
    int64_t d[1] = {count};
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_STRING, 1, d), KF_OK);
    for (int i = 0; i < count; i++) {
        ((kf_bytes *)t.data)[i].ptr = strdup(s[i]);
        ((kf_bytes *)t.data)[i].len = strlen(s[i]);
    }
    return t;
}

/* ---- Gather family ------------------------------------------------------ */

Test(index_gather, random_axis_and_negative_indices_match_a_loop) {
    int64_t dd[3] = {3, 4, 5}, di[2] = {2, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dd, -5, 5), ix = rand_idx(2, di, -4, 4), y = {0};
    kf_node *n = node("Gather", 2, 1, 13);
    tu_attr_i(n, "axis", -2);
    const kf_tensor *in[2] = {&x, &ix};
    tu_eval(n, 2, in, &y);
    cr_assert_eq(y.rank, 4);
    cr_assert(y.dims[0] == 3 && y.dims[1] == 2 && y.dims[2] == 3 && y.dims[3] == 5);
    const float *xv = x.data, *yv = y.data;
    const int64_t *iv = ix.data;
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++)
            for (int c = 0; c < 5; c++) {
                int64_t k = iv[j] < 0 ? iv[j] + 4 : iv[j];
                cr_assert_eq(yv[(a * 6 + j) * 5 + c], xv[(a * 4 + k) * 5 + c]);
            }
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&ix);
}

Test(index_gather, strings_are_deep_copied_and_int64_stays_exact) {
    const char *s[3] = {"alpha", "", "gamma"};
    kf_tensor x = strings(3, s), y = {0};
    int64_t di[1] = {4}, iv[4] = {2, 0, -1, 1};
    kf_tensor ix = tu_i64(1, di, iv);
    kf_node *n = node("Gather", 2, 1, 13);
    const kf_tensor *in[2] = {&x, &ix};
    tu_eval(n, 2, in, &y);
    kf_bytes *o = y.data, *src = x.data;
    cr_assert_str_eq(o[0].ptr, "gamma");
    cr_assert_str_eq(o[1].ptr, "alpha");
    cr_assert_str_eq(o[2].ptr, "gamma");
    cr_assert_eq(o[3].len, 0);
    cr_assert_neq(o[0].ptr, src[2].ptr, "deep copy");
    release(1, &y);
    int64_t big[3] = {INT64_MAX - 1, (1LL << 53) + 1, -7}, d3[1] = {3};
    kf_tensor xb = tu_i64(1, d3, big);
    const kf_tensor *in2[2] = {&xb, &ix};
    tu_eval(n, 2, in2, &y);
    cr_assert_eq(((int64_t *)y.data)[0], -7);
    cr_assert_eq(((int64_t *)y.data)[1], INT64_MAX - 1);
    cr_assert_eq(((int64_t *)y.data)[3], (1LL << 53) + 1);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&xb);
    kf_tensor_release(&ix);
}

Test(index_gather, out_of_range_index_is_a_runtime_error) {
    int64_t dd[2] = {3, 4}, di[1] = {2}, iv[2] = {1, 4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dd, -1, 1), ix = tu_i64(1, di, iv);
    kf_node *n = node("Gather", 2, 1, 13);
    tu_attr_i(n, "axis", 1);
    const kf_tensor *in[2] = {&x, &ix};
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    iv[1] = -5;
    kf_tensor ix2 = tu_i64(1, di, iv);
    const kf_tensor *in2[2] = {&x, &ix2};
    expect_fail(n, 2, in2, KF_ERR_RUNTIME);
    tu_node_free(n);
    n = node("Gather", 2, 1, 13);
    tu_attr_i(n, "axis", 2);
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&ix);
    kf_tensor_release(&ix2);
}

Test(index_gather, shape_keeps_symbolic_dims) {
    kf_node *n = node("Gather", 2, 1, 13);
    tu_attr_i(n, "axis", 1);
    kf_type x, ix, out;
    kf_type_unknown(&x);
    kf_type_unknown(&ix);
    kf_type_unknown(&out);
    x.dtype = KF_DT_FLOAT;
    x.rank = 3;
    x.dims[0] = -1;
    x.syms[0] = 7;
    x.dims[1] = 10;
    x.dims[2] = 4;
    ix.dtype = KF_DT_INT64;
    ix.rank = 1;
    ix.dims[0] = -1;
    ix.syms[0] = 9;
    const kf_type *in[2] = {&x, &ix};
    const kf_tensor *val[2] = {NULL, NULL};
    cr_assert_eq(kf_index_shape_gather(n, 2, in, val, 1, &out), KF_OK);
    cr_assert_eq(out.rank, 3);
    cr_assert(out.syms[0] == 7 && out.syms[1] == 9 && out.dims[2] == 4);
    tu_node_free(n);
}

Test(index_gather_elements, random_matches_a_loop) {
    int64_t dd[2] = {4, 5}, di[2] = {3, 7};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 2, dd, -5, 5), ix = rand_idx(2, di, -4, 4), y = {0};
    kf_node *n = node("GatherElements", 2, 1, 13);
    tu_attr_i(n, "axis", 0);
    di[1] = 7;
    const kf_tensor *in[2] = {&x, &ix};
    /* dim 1 of the indices (7) exceeds the data's (5) */
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    kf_tensor_release(&ix);
    di[1] = 5;
    ix = rand_idx(2, di, -4, 4);
    tu_eval(n, 2, in, &y);
    const double *xv = x.data, *yv = y.data;
    const int64_t *iv = ix.data;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            int64_t k = iv[i * 5 + j] < 0 ? iv[i * 5 + j] + 4 : iv[i * 5 + j];
            cr_assert_eq(yv[i * 5 + j], xv[k * 5 + j]);
        }
    ((int64_t *)ix.data)[3] = 4;
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&ix);
}

Test(index_gather_nd, random_batch_dims_match_a_loop) {
    int64_t dd[4] = {2, 3, 4, 5}, di[3] = {2, 6, 2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dd, -5, 5), ix = rand_idx(3, di, -3, 3), y = {0};
    kf_node *n = node("GatherND", 2, 1, 13);
    tu_attr_i(n, "batch_dims", 1);
    const kf_tensor *in[2] = {&x, &ix};
    tu_eval(n, 2, in, &y);
    cr_assert(y.rank == 3 && y.dims[0] == 2 && y.dims[1] == 6 && y.dims[2] == 5);
    const float *xv = x.data, *yv = y.data;
    const int64_t *iv = ix.data;
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++) {
            int64_t i0 = iv[(b * 6 + t) * 2], i1 = iv[(b * 6 + t) * 2 + 1];
            i0 += i0 < 0 ? 3 : 0;
            i1 += i1 < 0 ? 4 : 0;
            for (int c = 0; c < 5; c++)
                cr_assert_eq(yv[(b * 6 + t) * 5 + c], xv[((b * 3 + i0) * 4 + i1) * 5 + c]);
        }
    ((int64_t *)ix.data)[0] = 3;
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    n = node("GatherND", 2, 1, 13);
    tu_attr_i(n, "batch_dims", 3);
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&ix);
}

/* ---- Scatter family ------------------------------------------------------ */

static int64_t reduce_i64(int64_t a, int64_t b, const char *red) {
    if (!strcmp(red, "add")) return (int64_t)((uint64_t)a + (uint64_t)b);
    if (!strcmp(red, "mul")) return (int64_t)((uint64_t)a * (uint64_t)b);
    if (!strcmp(red, "max")) return a > b ? a : b;
    if (!strcmp(red, "min")) return a < b ? a : b;
    return b;
}

Test(index_scatter_nd, every_reduction_on_int64_matches_a_loop) {
    const char *reds[5] = {"none", "add", "mul", "max", "min"};
    for (int r = 0; r < 5; r++) {
        int64_t dd[3] = {4, 3, 2}, di[2] = {5, 2}, du[2] = {5, 2};
        kf_tensor x = rand_idx(3, dd, -1000, 1000), ix = rand_idx(2, di, -3, 3);
        kf_tensor up = rand_idx(2, du, -1000, 1000), y = {0};
        ((int64_t *)x.data)[0] = INT64_MAX - 3; /* stays exact where untouched */
        kf_node *n = node("ScatterND", 3, 1, 18);
        tu_attr_s(n, "reduction", reds[r]);
        const kf_tensor *in[3] = {&x, &ix, &up};
        tu_eval(n, 3, in, &y);
        int64_t want[24];
        memcpy(want, x.data, sizeof want);
        for (int t = 0; t < 5; t++) {
            int64_t i0 = ((int64_t *)ix.data)[2 * t], i1 = ((int64_t *)ix.data)[2 * t + 1];
            i0 += i0 < 0 ? 4 : 0;
            i1 += i1 < 0 ? 3 : 0;
            for (int s = 0; s < 2; s++) {
                int64_t *w = &want[(i0 * 3 + i1) * 2 + s];
                *w = reduce_i64(*w, ((int64_t *)up.data)[t * 2 + s], reds[r]);
            }
        }
        for (int i = 0; i < 24; i++)
            cr_assert_eq(((int64_t *)y.data)[i], want[i], "%s: element %d", reds[r], i);
        tu_node_free(n);
        release(1, &y);
        kf_tensor_release(&x);
        kf_tensor_release(&ix);
        kf_tensor_release(&up);
    }
}

Test(index_scatter_nd, bad_shapes_and_indices_fail) {
    int64_t dd[2] = {4, 3}, di[2] = {2, 1}, du[2] = {2, 2}, iv[2] = {0, 4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dd, -1, 1), ix = tu_i64(2, di, iv);
    kf_tensor up = tu_rand(KF_DT_FLOAT, 2, du, -1, 1);
    kf_node *n = node("ScatterND", 3, 1, 16);
    const kf_tensor *in[3] = {&x, &ix, &up};
    expect_fail(n, 3, in, KF_ERR_SHAPE); /* updates must be [2, 3] */
    kf_tensor_release(&up);
    du[1] = 3;
    up = tu_rand(KF_DT_FLOAT, 2, du, -1, 1);
    expect_fail(n, 3, in, KF_ERR_RUNTIME); /* index 4 of 4 rows */
    tu_node_free(n);
    n = node("ScatterND", 3, 1, 16);
    tu_attr_s(n, "reduction", "avg");
    expect_fail(n, 3, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&ix);
    kf_tensor_release(&up);
}

/* TensorScatter (24): cache [B, H, L, D] with update rows written from
 * write_indices[b], linear and circular (random indices, some wrapping),
 * axis -2 and an explicit axis 1; checked element by element against the
 * definition; a linear write past the end, axis 0 and a mismatched update
 * fail. */
Test(index_tensor_scatter, linear_and_circular_match_the_definition) {
    enum { B = 3, H = 2, L = 7, D = 4, S = 3 };
    int64_t dp[4] = {B, H, L, D}, du[4] = {B, H, S, D}, dw[1] = {B};
    kf_tensor past = tu_rand(KF_DT_FLOAT, 4, dp, -1, 1), upd = tu_rand(KF_DT_FLOAT, 4, du, 2, 3);
    for (int circ = 0; circ < 2; circ++) {
        int64_t w[B];
        for (int b = 0; b < B; b++) w[b] = circ ? rand_int(0, 2 * L) : rand_int(0, L - S + 1);
        kf_tensor wi = tu_i64(1, dw, w);
        for (int with_w = 0; with_w < 2; with_w++) {
            kf_node *n = node("TensorScatter", with_w ? 3 : 2, 1, 24);
            if (circ) tu_attr_s(n, "mode", "circular");
            const kf_tensor *in[3] = {&past, &upd, &wi};
            kf_tensor out[1] = {{0}};
            tu_eval(n, with_w ? 3 : 2, in, out);
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int l = 0; l < L; l++)
                        for (int d = 0; d < D; d++) {
                            int64_t start = with_w ? w[b] : 0, rel = ((l - start) % L + L) % L;
                            bool written = circ ? rel < S : (l >= start && l < start + S);
                            int64_t s = circ ? rel : l - start;
                            double want = written ? kf_get_f64(&upd, ((b * H + h) * S + s) * D + d)
                                                  : kf_get_f64(&past, ((b * H + h) * L + l) * D + d);
                            cr_assert_eq(kf_get_f64(&out[0], ((b * H + h) * L + l) * D + d), want,
                                         "circ %d, b %d h %d l %d d %d", circ, b, h, l, d);
                        }
            release(1, out);
            tu_node_free(n);
        }
        kf_tensor_release(&wi);
    }
    /* axis 1 of a [B, L, D] cache equals axis -2 */
    int64_t d3[3] = {B, L, D}, u3[3] = {B, S, D};
    kf_tensor p3 = tu_rand(KF_DT_INT32, 3, d3, -100, 100), q3 = tu_rand(KF_DT_INT32, 3, u3, -100, 100);
    kf_node *a1 = node("TensorScatter", 2, 1, 24), *a2 = node("TensorScatter", 2, 1, 24);
    tu_attr_i(a1, "axis", 1);
    const kf_tensor *in3[2] = {&p3, &q3};
    kf_tensor o1[1] = {{0}}, o2[1] = {{0}};
    tu_eval(a1, 2, in3, o1);
    tu_eval(a2, 2, in3, o2);
    cr_assert(kf_tensor_equal(&o1[0], &o2[0]));
    cr_assert_eq(kf_get_i64(&o1[0], D + 1), kf_get_i64(&q3, D + 1));
    release(1, o1), release(1, o2);
    tu_node_free(a1), tu_node_free(a2);
    /* errors */
    int64_t late[B] = {0, L - S + 1, 0};
    kf_tensor wl = tu_i64(1, dw, late);
    kf_node *n = node("TensorScatter", 3, 1, 24);
    const kf_tensor *bad[3] = {&past, &upd, &wl};
    expect_fail(n, 3, bad, KF_ERR_RUNTIME);
    tu_node_free(n);
    n = node("TensorScatter", 2, 1, 24);
    tu_attr_i(n, "axis", 0);
    expect_fail(n, 2, bad, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = node("TensorScatter", 2, 1, 24);
    const kf_tensor *mism[2] = {&past, &p3};
    expect_fail(n, 2, mism, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&wl), kf_tensor_release(&p3), kf_tensor_release(&q3);
    kf_tensor_release(&past), kf_tensor_release(&upd);
}

Test(index_scatter_elements, float_reductions_and_old_scatter_match_a_loop) {
    const char *reds[5] = {"none", "add", "mul", "max", "min"};
    for (int r = 0; r < 6; r++) {
        int64_t dd[2] = {3, 4}, di[2] = {5, 3};
        kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dd, -5, 5), ix = rand_idx(2, di, -3, 3);
        kf_tensor up = tu_rand(KF_DT_FLOAT, 2, di, -5, 5), y = {0};
        kf_node *n = r < 5 ? node("ScatterElements", 3, 1, 18) : node("Scatter", 3, 1, 9);
        if (r < 5) tu_attr_s(n, "reduction", reds[r]);
        tu_attr_i(n, "axis", 0);
        const kf_tensor *in[3] = {&x, &ix, &up};
        tu_eval(n, 3, in, &y);
        float want[12];
        memcpy(want, x.data, sizeof want);
        const char *red = r < 5 ? reds[r] : "none";
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 3; j++) {
                int64_t k = ((int64_t *)ix.data)[i * 3 + j];
                k += k < 0 ? 3 : 0;
                float a = want[k * 4 + j], b = ((float *)up.data)[i * 3 + j];
                float v = !strcmp(red, "add") ? a + b : !strcmp(red, "mul") ? a * b
                        : !strcmp(red, "max") ? fmaxf(a, b) : !strcmp(red, "min") ? fminf(a, b) : b;
                want[k * 4 + j] = v;
            }
        for (int i = 0; i < 12; i++) cr_assert_eq(((float *)y.data)[i], want[i], "%s: element %d", red, i);
        tu_node_free(n);
        release(1, &y);
        kf_tensor_release(&x);
        kf_tensor_release(&ix);
        kf_tensor_release(&up);
    }
}

Test(index_scatter_elements, out_of_range_and_string_reduction_fail) {
    int64_t di[1] = {2}, iv[2] = {0, -4};
    const char *s[3] = {"a", "b", "c"}, *u[2] = {"x", "y"};
    kf_tensor x = strings(3, s), up = strings(2, u), ix = tu_i64(1, di, iv), y = {0};
    kf_node *n = node("ScatterElements", 3, 1, 18);
    const kf_tensor *in[3] = {&x, &ix, &up};
    expect_fail(n, 3, in, KF_ERR_RUNTIME);
    ((int64_t *)ix.data)[1] = -1;
    tu_eval(n, 3, in, &y);
    cr_assert_str_eq(((kf_bytes *)y.data)[0].ptr, "x");
    cr_assert_str_eq(((kf_bytes *)y.data)[1].ptr, "b");
    cr_assert_str_eq(((kf_bytes *)y.data)[2].ptr, "y");
    tu_node_free(n);
    n = node("ScatterElements", 3, 1, 18);
    tu_attr_s(n, "reduction", "add");
    expect_fail(n, 3, in, KF_ERR_UNSUPPORTED);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&up);
    kf_tensor_release(&ix);
}

/* ---- OneHot, NonZero, Compress ------------------------------------------- */

Test(index_one_hot, random_indices_axis_and_versions) {
    for (int v = 0; v < 2; v++) {
        int64_t di[2] = {3, 4}, one[1] = {1}, two[1] = {2};
        kf_tensor ix = rand_idx(2, di, -7, 7), y = {0};
        double dv = 5, vv[2] = {tu_uniform(-3, -1), tu_uniform(1, 3)};
        kf_tensor depth = tu_tensor(KF_DT_FLOAT, 1, one, &dv), vals = tu_tensor(KF_DT_DOUBLE, 1, two, vv);
        kf_node *n = node("OneHot", 3, 1, v ? 11 : 9);
        tu_attr_i(n, "axis", 1);
        const kf_tensor *in[3] = {&ix, &depth, &vals};
        tu_eval(n, 3, in, &y);
        cr_assert(y.dtype == KF_DT_DOUBLE && y.rank == 3 && y.dims[0] == 3 && y.dims[1] == 5 && y.dims[2] == 4);
        for (int a = 0; a < 3; a++)
            for (int d = 0; d < 5; d++)
                for (int b = 0; b < 4; b++) {
                    int64_t k = ((int64_t *)ix.data)[a * 4 + b];
                    if (v && k < 0) k += 5;
                    double want = k == d ? vv[1] : vv[0];
                    cr_assert_eq(((double *)y.data)[(a * 5 + d) * 4 + b], want);
                }
        tu_node_free(n);
        n = node("OneHot", 3, 1, 11);
        tu_attr_i(n, "axis", 3);
        expect_fail(n, 3, in, KF_ERR_BAD_MODEL);
        tu_node_free(n);
        release(1, &y);
        kf_tensor_release(&ix);
        kf_tensor_release(&depth);
        kf_tensor_release(&vals);
    }
}

Test(index_non_zero, random_matches_a_loop) {
    int64_t dd[3] = {3, 4, 2};
    kf_tensor x = tu_rand(KF_DT_INT32, 3, dd, -1, 2), y = {0};
    kf_node *n = node("NonZero", 1, 1, 13);
    const kf_tensor *in[1] = {&x};
    tu_eval(n, 1, in, &y);
    int64_t c = 0;
    for (int i = 0; i < 24; i++) c += ((int32_t *)x.data)[i] != 0;
    cr_assert(y.dtype == KF_DT_INT64 && y.rank == 2 && y.dims[0] == 3 && y.dims[1] == c);
    int64_t k = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int d = 0; d < 2; d++) {
                if (!((int32_t *)x.data)[(a * 4 + b) * 2 + d]) continue;
                const int64_t *o = y.data;
                cr_assert(o[k] == a && o[c + k] == b && o[2 * c + k] == d);
                k++;
            }
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
}

Test(index_compress, random_with_and_without_axis) {
    int64_t dd[3] = {2, 5, 3}, dc[1] = {4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dd, -5, 5), cond = tu_rand(KF_DT_BOOL, 1, dc, 0, 2), y = {0};
    ((uint8_t *)cond.data)[2] = 1;
    kf_node *n = node("Compress", 2, 1, 11);
    tu_attr_i(n, "axis", -2);
    const kf_tensor *in[2] = {&x, &cond};
    tu_eval(n, 2, in, &y);
    int64_t c = 0;
    for (int j = 0; j < 4; j++) c += ((uint8_t *)cond.data)[j];
    cr_assert(y.rank == 3 && y.dims[1] == c);
    for (int a = 0; a < 2; a++) {
        int64_t k = 0;
        for (int j = 0; j < 4; j++) {
            if (!((uint8_t *)cond.data)[j]) continue;
            for (int b = 0; b < 3; b++)
                cr_assert_eq(((float *)y.data)[(a * c + k) * 3 + b], ((float *)x.data)[(a * 5 + j) * 3 + b]);
            k++;
        }
    }
    tu_node_free(n);
    release(1, &y);
    n = node("Compress", 2, 1, 11); /* flattened */
    tu_eval(n, 2, in, &y);
    cr_assert(y.rank == 1 && y.dims[0] == c);
    for (int j = 0, k = 0; j < 4; j++)
        if (((uint8_t *)cond.data)[j]) cr_assert_eq(((float *)y.data)[k++], ((float *)x.data)[j]);
    release(1, &y);
    tu_node_free(n);
    n = node("Compress", 2, 1, 11);
    tu_attr_i(n, "axis", 0); /* condition selects entry 2 of a dim of 2 */
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&cond);
}

/* ---- Unique ------------------------------------------------------------- */

static void check_i64(const kf_tensor *t, int count, const int64_t *want, const char *what) {
    cr_assert(t->dtype == KF_DT_INT64 && t->rank == 1 && t->dims[0] == count, "%s shape", what);
    for (int i = 0; i < count; i++)
        cr_assert_eq(((int64_t *)t->data)[i], want[i], "%s[%d]", what, i);
}

Test(index_unique, onnx_examples_sorted_and_unsorted) {
    /* x = [2, 1, 1, 3, 4, 3] */
    double xv[6] = {2, 1, 1, 3, 4, 3};
    int64_t d[1] = {6};
    kf_tensor x = tu_tensor(KF_DT_FLOAT, 1, d, xv), y[4] = {{0}};
    const kf_tensor *in[1] = {&x};
    kf_node *n = node("Unique", 1, 4, 11);
    tu_attr_i(n, "sorted", 0);
    tu_eval(n, 1, in, y);
    float yu[4] = {2, 1, 3, 4};
    for (int i = 0; i < 4; i++) cr_assert_eq(((float *)y[0].data)[i], yu[i]);
    check_i64(&y[1], 4, (int64_t[]){0, 1, 3, 4}, "indices");
    check_i64(&y[2], 6, (int64_t[]){0, 1, 1, 2, 3, 2}, "inverse");
    check_i64(&y[3], 4, (int64_t[]){1, 2, 2, 1}, "counts");
    tu_node_free(n);
    release(4, y);
    n = node("Unique", 1, 4, 11);
    tu_eval(n, 1, in, y);
    float ys[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) cr_assert_eq(((float *)y[0].data)[i], ys[i]);
    check_i64(&y[1], 4, (int64_t[]){1, 0, 3, 4}, "indices");
    check_i64(&y[2], 6, (int64_t[]){1, 0, 0, 2, 3, 2}, "inverse");
    check_i64(&y[3], 4, (int64_t[]){2, 1, 2, 1}, "counts");
    tu_node_free(n);
    release(4, y);
    kf_tensor_release(&x);
}

Test(index_unique, axis_slices_sorted_and_unsorted) {
    /* x = [[1, 0, 0], [1, 0, 0], [2, 3, 4]] along axis 0 and along axis -1 */
    double xv[9] = {1, 0, 0, 1, 0, 0, 2, 3, 4};
    int64_t d[2] = {3, 3};
    kf_tensor x = tu_tensor(KF_DT_INT32, 2, d, xv), y[4] = {{0}};
    const kf_tensor *in[1] = {&x};
    kf_node *n = node("Unique", 1, 4, 11);
    tu_attr_i(n, "axis", 0);
    tu_eval(n, 1, in, y);
    cr_assert(y[0].rank == 2 && y[0].dims[0] == 2 && y[0].dims[1] == 3);
    check_i64(&y[1], 2, (int64_t[]){0, 2}, "indices");
    check_i64(&y[2], 3, (int64_t[]){0, 0, 1}, "inverse");
    check_i64(&y[3], 2, (int64_t[]){2, 1}, "counts");
    tu_node_free(n);
    release(4, y);
    /* columns [1,1,2], [0,0,3], [0,0,4]: sorted [0,0,3] < [0,0,4] < [1,1,2] */
    n = node("Unique", 1, 4, 11);
    tu_attr_i(n, "axis", -1);
    tu_attr_i(n, "sorted", 1);
    tu_eval(n, 1, in, y);
    int32_t want[9] = {0, 0, 1, 0, 0, 1, 3, 4, 2};
    for (int i = 0; i < 9; i++) cr_assert_eq(((int32_t *)y[0].data)[i], want[i]);
    check_i64(&y[1], 3, (int64_t[]){1, 2, 0}, "indices");
    check_i64(&y[2], 3, (int64_t[]){2, 0, 1}, "inverse");
    tu_node_free(n);
    release(4, y);
    n = node("Unique", 1, 4, 11);
    tu_attr_i(n, "axis", 2);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
}

Test(index_unique, random_unsorted_matches_a_quadratic_scan) {
    int64_t d[1] = {40};
    kf_tensor x = tu_rand(KF_DT_INT64, 1, d, -6, 6), y[4] = {{0}};
    const kf_tensor *in[1] = {&x};
    kf_node *n = node("Unique", 1, 4, 11);
    tu_attr_i(n, "sorted", 0);
    tu_eval(n, 1, in, y);
    const int64_t *xv = x.data;
    int64_t u = 0, vals[40], firsts[40], counts[40];
    for (int i = 0; i < 40; i++) {
        int64_t g = -1;
        for (int k = 0; k < u; k++)
            if (vals[k] == xv[i]) g = k;
        if (g < 0) {
            vals[u] = xv[i];
            firsts[u] = i;
            counts[u++] = 0;
            g = u - 1;
        }
        counts[g]++;
        cr_assert_eq(((int64_t *)y[2].data)[i], g);
    }
    check_i64(&y[0], (int)u, vals, "y");
    check_i64(&y[1], (int)u, firsts, "indices");
    check_i64(&y[3], (int)u, counts, "counts");
    tu_node_free(n);
    release(4, y);
    kf_tensor_release(&x);
}

/* ---- ReverseSequence ------------------------------------------------------- */

Test(index_reverse_sequence, random_batch_major_matches_a_loop) {
    int64_t dd[3] = {3, 5, 2}, dl[1] = {3}, lv[3] = {5, 0, rand_int(1, 5)};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dd, -5, 5), lens = tu_i64(1, dl, lv), y = {0};
    kf_node *n = node("ReverseSequence", 2, 1, 10);
    tu_attr_i(n, "batch_axis", 0);
    tu_attr_i(n, "time_axis", 1);
    const kf_tensor *in[2] = {&x, &lens};
    tu_eval(n, 2, in, &y);
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < 5; t++)
            for (int c = 0; c < 2; c++) {
                int src = t < lv[b] ? (int)lv[b] - 1 - t : t;
                cr_assert_eq(((float *)y.data)[(b * 5 + t) * 2 + c], ((float *)x.data)[(b * 5 + src) * 2 + c]);
            }
    ((int64_t *)lens.data)[1] = 6;
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    n = node("ReverseSequence", 2, 1, 10);
    tu_attr_i(n, "batch_axis", 1);
    tu_attr_i(n, "time_axis", 1);
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&lens);
}

/* ---- Resize / Upsample --------------------------------------------------- */

Test(index_resize, linear_half_pixel_matches_bilinear_formula) {
    int64_t dd[4] = {1, 2, 4, 5}, ds[1] = {4};
    double sv[4] = {1, 1, 1.5, 0.8};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dd, -5, 5), sc = tu_tensor(KF_DT_FLOAT, 1, ds, sv), y = {0};
    kf_node *n = node("Resize", 3, 1, 13);
    tu_attr_s(n, "mode", "linear");
    const kf_tensor *in[3] = {&x, NULL, &sc};
    tu_eval(n, 3, in, &y);
    cr_assert(y.dims[2] == 6 && y.dims[3] == 4);
    const float *xv = x.data;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) {
                double fy = fmin(fmax((i + 0.5) / 1.5 - 0.5, 0), 3), fx = fmin(fmax((j + 0.5) / 0.8 - 0.5, 0), 4);
                int y0 = (int)fy, x0 = (int)fx, y1 = y0 < 3 ? y0 + 1 : 3, x1 = x0 < 4 ? x0 + 1 : 4;
                double ty = fy - y0, tx = fx - x0;
                const float *p = xv + c * 20;
                double want = (1 - ty) * ((1 - tx) * p[y0 * 5 + x0] + tx * p[y0 * 5 + x1]) +
                              ty * ((1 - tx) * p[y1 * 5 + x0] + tx * p[y1 * 5 + x1]);
                double got = ((float *)y.data)[(c * 6 + i) * 4 + j];
                cr_assert(fabs(got - want) < 1e-5, "(%d,%d,%d): %g vs %g", c, i, j, got, want);
            }
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&sc);
}

Test(index_resize, cubic_asymmetric_matches_keys_kernel) {
    int64_t dd[1] = {7}, ds[1] = {1};
    double sv[1] = {2.0};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 1, dd, -5, 5), sc = tu_tensor(KF_DT_FLOAT, 1, ds, sv), y = {0};
    kf_node *n = node("Resize", 3, 1, 13);
    tu_attr_s(n, "mode", "cubic");
    tu_attr_s(n, "coordinate_transformation_mode", "asymmetric");
    tu_attr_f(n, "cubic_coeff_a", -0.5f);
    const kf_tensor *in[3] = {&x, NULL, &sc};
    tu_eval(n, 3, in, &y);
    const double *xv = x.data, A = -0.5;
    for (int o = 0; o < 14; o++) {
        double s = o / 2.0, want = 0;
        for (int k = (int)floor(s) - 1; k <= (int)floor(s) + 2; k++) {
            double d = fabs(s - k);
            double w = d <= 1 ? (A + 2) * d * d * d - (A + 3) * d * d + 1
                      : d < 2 ? A * d * d * d - 5 * A * d * d + 8 * A * d - 4 * A : 0;
            want += w * xv[k < 0 ? 0 : (k > 6 ? 6 : k)];
        }
        cr_assert(fabs(((double *)y.data)[o] - want) < 1e-12, "%d: %g vs %g", o, ((double *)y.data)[o], want);
    }
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&sc);
}

Test(index_resize, nearest_sizes_and_integer_rounding) {
    /* sizes [1, 3] on [1, 4] with round_prefer_ceil and half_pixel:
     * x = (o + 0.5) * 4/3 - 0.5 = 0.1667, 1.5, 2.8333 -> 0, 2, 3 */
    int64_t dd[2] = {1, 4}, dz[1] = {2}, zv[2] = {1, 3};
    double xv[4] = {10, 21, 30, 40};
    kf_tensor x = tu_tensor(KF_DT_UINT8, 2, dd, xv), sz = tu_i64(1, dz, zv), y = {0};
    kf_node *n = node("Resize", 4, 1, 13);
    tu_attr_s(n, "nearest_mode", "round_prefer_ceil");
    const kf_tensor *in[4] = {&x, NULL, NULL, &sz};
    tu_eval(n, 4, in, &y);
    uint8_t want[3] = {10, 30, 40};
    for (int i = 0; i < 3; i++) cr_assert_eq(((uint8_t *)y.data)[i], want[i]);
    tu_node_free(n);
    release(1, &y);
    /* linear on uint8 rounds half to even: 15.5 -> 16, 25.5 -> 26 */
    zv[1] = 8;
    kf_tensor sz2 = tu_i64(1, dz, zv);
    const kf_tensor *in2[4] = {&x, NULL, NULL, &sz2};
    n = node("Resize", 4, 1, 13);
    tu_attr_s(n, "mode", "linear");
    tu_attr_s(n, "coordinate_transformation_mode", "asymmetric");
    tu_eval(n, 4, in2, &y);
    uint8_t want2[8] = {10, 16, 21, 26, 30, 35, 40, 40};
    for (int i = 0; i < 8; i++) cr_assert_eq(((uint8_t *)y.data)[i], want2[i], "element %d", i);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&sz);
    kf_tensor_release(&sz2);
}

Test(index_resize, opset10_and_upsample_nearest) {
    /* Resize-10 downsample [1,1,0.6,0.6] of [[1,2,3,4],[5,6,7,8]] -> [[1, 3]] */
    int64_t dd[4] = {1, 1, 2, 4}, ds[1] = {4};
    double xv[8] = {1, 2, 3, 4, 5, 6, 7, 8}, sv[4] = {1, 1, 0.6, 0.6};
    kf_tensor x = tu_tensor(KF_DT_FLOAT, 4, dd, xv), sc = tu_tensor(KF_DT_FLOAT, 1, ds, sv), y = {0};
    kf_node *n = node("Resize", 2, 1, 10);
    const kf_tensor *in[2] = {&x, &sc};
    tu_eval(n, 2, in, &y);
    cr_assert(y.dims[2] == 1 && y.dims[3] == 2);
    cr_assert(((float *)y.data)[0] == 1 && ((float *)y.data)[1] == 3);
    tu_node_free(n);
    release(1, &y);
    /* Upsample-7 (attribute) repeats: scales [1,1,2,3] */
    n = node("Upsample", 1, 1, 7);
    float up[4] = {1, 1, 2, 3};
    tu_attr_floats(n, "scales", 4, up);
    tu_eval(n, 1, in, &y);
    cr_assert(y.dims[2] == 4 && y.dims[3] == 12);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 12; j++) cr_assert_eq(((float *)y.data)[i * 12 + j], xv[(i / 2) * 4 + j / 3]);
    tu_node_free(n);
    release(1, &y);
    n = node("Upsample", 2, 1, 9); /* scales below 1 are invalid for Upsample */
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&sc);
}

Test(index_resize, bad_inputs_fail) {
    int64_t dd[2] = {2, 3}, ds[1] = {2}, d3[1] = {3};
    double sv[2] = {2, -1}, s3[3] = {1, 1, 1};
    int64_t zv[2] = {4, 6};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dd, -1, 1), sc = tu_tensor(KF_DT_FLOAT, 1, ds, sv);
    kf_tensor sz = tu_i64(1, ds, zv), sc3 = tu_tensor(KF_DT_FLOAT, 1, d3, s3);
    kf_node *n = node("Resize", 4, 1, 13);
    const kf_tensor *neg[3] = {&x, NULL, &sc};
    expect_fail(n, 3, neg, KF_ERR_RUNTIME);
    const kf_tensor *both[4] = {&x, NULL, &sc, &sz};
    expect_fail(n, 4, both, KF_ERR_BAD_MODEL);
    const kf_tensor *len[3] = {&x, NULL, &sc3};
    expect_fail(n, 3, len, KF_ERR_SHAPE);
    tu_node_free(n);
    n = node("Resize", 4, 1, 13);
    tu_attr_s(n, "mode", "area");
    const kf_tensor *ok[4] = {&x, NULL, NULL, &sz};
    expect_fail(n, 4, ok, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = node("Resize", 4, 1, 13);
    tu_attr_s(n, "coordinate_transformation_mode", "tf_half_pixel_for_nn"); /* removed in 13 */
    expect_fail(n, 4, ok, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&sc);
    kf_tensor_release(&sz);
    kf_tensor_release(&sc3);
}

/* ---- GridSample, RoiAlign, NonMaxSuppression ------------------------------ */

Test(index_grid_sample, bilinear_zeros_matches_a_direct_formula) {
    int64_t dx[4] = {2, 3, 4, 5}, dg[4] = {2, 3, 6, 2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dx, -5, 5), g = tu_rand(KF_DT_FLOAT, 4, dg, -1.2, 1.2), y = {0};
    kf_node *n = node("GridSample", 2, 1, 16);
    const kf_tensor *in[2] = {&x, &g};
    tu_eval(n, 2, in, &y);
    cr_assert(y.rank == 4 && y.dims[0] == 2 && y.dims[1] == 3 && y.dims[2] == 3 && y.dims[3] == 6);
    const float *xv = x.data, *gv = g.data;
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 18; p++) {
                double fx = ((gv[(b * 18 + p) * 2] + 1) * 5 - 1) / 2, fy = ((gv[(b * 18 + p) * 2 + 1] + 1) * 4 - 1) / 2;
                int x0 = (int)floor(fx), y0 = (int)floor(fy);
                double want = 0;
                for (int dy = 0; dy < 2; dy++)
                    for (int dxx = 0; dxx < 2; dxx++) {
                        int yy = y0 + dy, xx = x0 + dxx;
                        if (yy < 0 || yy >= 4 || xx < 0 || xx >= 5) continue;
                        double w = (dy ? fy - y0 : 1 - (fy - y0)) * (dxx ? fx - x0 : 1 - (fx - x0));
                        want += w * xv[((b * 3 + c) * 4 + yy) * 5 + xx];
                    }
                double got = ((float *)y.data)[(b * 3 + c) * 18 + p];
                cr_assert(fabs(got - want) < 1e-4, "%g vs %g", got, want);
            }
    tu_node_free(n);
    n = node("GridSample", 2, 1, 16);
    tu_attr_s(n, "padding_mode", "mirror");
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&g);
    dg[3] = 3;
    g = tu_rand(KF_DT_FLOAT, 4, dg, -1, 1);
    n = node("GridSample", 2, 1, 16);
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&g);
}

Test(index_roi_align, averages_a_linear_image_exactly) {
    /* bilinear sampling of a linear image is exact, so each bin's average is
     * the image at the bin centre */
    double a = tu_uniform(-2, 2), b = tu_uniform(-2, 2), c0 = tu_uniform(-2, 2);
    int64_t dx[4] = {2, 1, 10, 12}, dr[2] = {2, 4}, di[1] = {2}, bv[2] = {1, 0};
    kf_tensor x = {0}, y = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 4, dx), KF_OK);
    for (int n2 = 0; n2 < 2; n2++)
        for (int i = 0; i < 10; i++)
            for (int j = 0; j < 12; j++) ((float *)x.data)[(n2 * 10 + i) * 12 + j] = (float)(a * i + b * j + c0 + n2);
    double rv[8] = {tu_uniform(1, 3), tu_uniform(1, 3), tu_uniform(6, 9), tu_uniform(5, 8),
                    tu_uniform(0.5, 2), tu_uniform(2, 3), tu_uniform(4, 10), tu_uniform(6, 8)};
    kf_tensor rois = tu_tensor(KF_DT_FLOAT, 2, dr, rv), bi = tu_i64(1, di, bv);
    kf_node *n = node("RoiAlign", 3, 1, 16);
    tu_attr_i(n, "output_height", 3);
    tu_attr_i(n, "output_width", 2);
    tu_attr_i(n, "sampling_ratio", 2);
    tu_attr_s(n, "coordinate_transformation_mode", "output_half_pixel");
    const kf_tensor *in[3] = {&x, &rois, &bi};
    tu_eval(n, 3, in, &y);
    cr_assert(y.rank == 4 && y.dims[0] == 2 && y.dims[2] == 3 && y.dims[3] == 2);
    for (int r = 0; r < 2; r++) {
        double x0 = (float)rv[4 * r], y0 = (float)rv[4 * r + 1], x1 = (float)rv[4 * r + 2], y1 = (float)rv[4 * r + 3];
        for (int ph = 0; ph < 3; ph++)
            for (int pw = 0; pw < 2; pw++) {
                double cy = y0 + (ph + 0.5) * (y1 - y0) / 3, cx = x0 + (pw + 0.5) * (x1 - x0) / 2;
                double want = a * cy + b * cx + c0 + (double)bv[r];
                double got = ((float *)y.data)[(r * 3 + ph) * 2 + pw];
                cr_assert(fabs(got - want) < 1e-4, "roi %d bin (%d,%d): %g vs %g", r, ph, pw, got, want);
            }
    }
    ((int64_t *)bi.data)[1] = 2;
    expect_fail(n, 3, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    release(1, &y);
    kf_tensor_release(&x);
    kf_tensor_release(&rois);
    kf_tensor_release(&bi);
}

Test(index_nms, onnx_example_and_disjoint_random_boxes) {
    /* the ONNX suppress_by_IOU example */
    double bx[24] = {0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, -0.1, 1, 0.9, 0, 10, 1, 11, 0, 10.1, 1, 11.1, 0, 100, 1, 101};
    double sc[6] = {0.9, 0.75, 0.6, 0.95, 0.5, 0.3};
    int64_t db[3] = {1, 6, 4}, ds[3] = {1, 1, 6}, one[1] = {1}, mo = 3;
    double iou = 0.5, thr = 0.0;
    kf_tensor boxes = tu_tensor(KF_DT_FLOAT, 3, db, bx), scores = tu_tensor(KF_DT_FLOAT, 3, ds, sc);
    kf_tensor maxo = tu_i64(1, one, &mo), ti = tu_tensor(KF_DT_FLOAT, 1, one, &iou);
    kf_tensor ts = tu_tensor(KF_DT_FLOAT, 1, one, &thr), y = {0};
    kf_node *n = node("NonMaxSuppression", 5, 1, 11);
    const kf_tensor *in[5] = {&boxes, &scores, &maxo, &ti, &ts};
    tu_eval(n, 5, in, &y);
    int64_t want[9] = {0, 0, 3, 0, 0, 0, 0, 0, 5};
    cr_assert(y.rank == 2 && y.dims[0] == 3 && y.dims[1] == 3);
    for (int i = 0; i < 9; i++) cr_assert_eq(((int64_t *)y.data)[i], want[i]);
    release(1, &y);
    /* disjoint boxes, random scores: all kept above the threshold, best first */
    for (int i = 0; i < 6; i++) {
        bx[4 * i] = 3 * i;
        bx[4 * i + 1] = 0;
        bx[4 * i + 2] = 3 * i + 2;
        bx[4 * i + 3] = 2;
        sc[i] = tu_uniform(0, 1);
    }
    thr = 0.25;
    mo = 10;
    kf_tensor b2 = tu_tensor(KF_DT_FLOAT, 3, db, bx), s2 = tu_tensor(KF_DT_FLOAT, 3, ds, sc);
    kf_tensor m2 = tu_i64(1, one, &mo), t2 = tu_tensor(KF_DT_FLOAT, 1, one, &thr);
    const kf_tensor *in2[5] = {&b2, &s2, &m2, &ti, &t2};
    tu_eval(n, 5, in2, &y);
    int64_t kept = 0;
    for (int i = 0; i < 6; i++) kept += (float)sc[i] > (float)thr;
    cr_assert_eq(y.dims[0], kept);
    for (int64_t k = 1; k < kept; k++)
        cr_assert(((float *)s2.data)[((int64_t *)y.data)[3 * k + 2]] <= ((float *)s2.data)[((int64_t *)y.data)[3 * k - 1]]);
    iou = 1.5;
    kf_tensor t3 = tu_tensor(KF_DT_FLOAT, 1, one, &iou);
    const kf_tensor *in3[5] = {&b2, &s2, &m2, &t3, &t2};
    expect_fail(n, 5, in3, KF_ERR_RUNTIME);
    tu_node_free(n);
    release(1, &y);
    kf_tensor *all[10] = {&boxes, &scores, &maxo, &ti, &ts, &b2, &s2, &m2, &t2, &t3};
    for (int i = 0; i < 10; i++) kf_tensor_release(all[i]);
}
