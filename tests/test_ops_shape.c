/*
 * test_ops_shape.c: shape and layout ops (ops_shape*.c). Each kernel runs on
 * random data of several dtypes (strings and bool included) and is compared
 * bit for bit with a plain index computation written here; shape functions
 * are checked for static and symbolic dims; bad attributes must fail with
 * the right code and a message naming the node.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------ */

static const kf_dtype all_dtypes[] = {KF_DT_FLOAT,  KF_DT_UINT8,  KF_DT_INT8,    KF_DT_UINT16,
                                      KF_DT_INT16,  KF_DT_INT32,  KF_DT_INT64,   KF_DT_STRING,
                                      KF_DT_BOOL,   KF_DT_FLOAT16, KF_DT_DOUBLE, KF_DT_UINT32,
                                      KF_DT_UINT64, KF_DT_COMPLEX64, KF_DT_COMPLEX128,
                                      KF_DT_BFLOAT16};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* Random tensor of any dtype: strings get random text, 64-bit integers get
 * values beyond 2^53, complex types random bytes. */
static kf_tensor rnd(kf_dtype dt, int rank, const int64_t *dims) {
    if (kf_dtype_is_float(dt) || dt == KF_DT_BOOL || (kf_dtype_is_int(dt) && kf_dtype_size(dt) < 8))
        return tu_rand(dt, rank, dims, dt == KF_DT_BOOL ? 0 : kf_dtype_is_signed(dt) || kf_dtype_is_float(dt) ? -100 : 0,
                       dt == KF_DT_BOOL ? 2 : 100);
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, dt, rank, dims), KF_OK);
    for (int64_t i = 0; i < t.numel; i++) {
        if (dt == KF_DT_STRING) {
            char buf[32];
            int len = snprintf(buf, sizeof buf, "s%d_%lld", (int)tu_uniform(0, 1e6), (long long)i);
            ((kf_bytes *)t.data)[i].ptr = strdup(buf);
            ((kf_bytes *)t.data)[i].len = (size_t)len;
        } else {
            uint8_t *p = (uint8_t *)t.data + (size_t)i * kf_dtype_size(dt);
            for (size_t b = 0; b < kf_dtype_size(dt); b++) p[b] = (uint8_t)tu_uniform(0, 256);
        }
    }
    return t;
}

/* dst[j] = src[i], written independently of the library's helpers. */
static void put(kf_tensor *dst, int64_t j, const kf_tensor *src, int64_t i) {
    if (src->dtype == KF_DT_STRING) {
        kf_bytes *d = (kf_bytes *)dst->data + j;
        const kf_bytes *s = (const kf_bytes *)src->data + i;
        free(d->ptr);
        d->ptr = malloc(s->len + 1);
        memcpy(d->ptr, s->ptr, s->len);
        d->ptr[s->len] = 0;
        d->len = s->len;
        return;
    }
    size_t e = kf_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)j * e, (const char *)src->data + (size_t)i * e, e);
}

/* Fills string slots still NULL with "" so expected tensors compare. */
static void fill_empty_strings(kf_tensor *t) {
    if (t->dtype != KF_DT_STRING) return;
    for (int64_t i = 0; i < t->numel; i++) {
        kf_bytes *b = (kf_bytes *)t->data + i;
        if (!b->ptr) b->ptr = strdup("");
    }
}

static kf_tensor alloc_t(kf_dtype dt, int rank, const int64_t *dims) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, dt, rank, dims), KF_OK, "%s", kf_last_error());
    return t;
}

/* Row-major helpers written out here rather than taken from the library. */
static void unravel(int rank, const int64_t *dims, int64_t lin, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = lin % dims[d];
        lin /= dims[d];
    }
}
static int64_t ravel(int rank, const int64_t *dims, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off = off * dims[d] + idx[d];
    return off;
}

static void assert_same(const kf_tensor *got, const kf_tensor *want, const char *what) {
    char why[256] = "";
    if (got->dtype == want->dtype && got->dtype != KF_DT_STRING && kf_dtype_is_float(got->dtype))
        cr_assert(tu_close(got, want, 0, 0, why, sizeof why), "%s: %s", what, why);
    cr_assert(kf_tensor_equal(got, want), "%s: %s (dtype %s, rank %d/%d, numel %lld/%lld)", what,
              why, kf_dtype_name(got->dtype), got->rank, want->rank, (long long)got->numel,
              (long long)want->numel);
}

static void release_all(kf_tensor *t, int n) {
    for (int i = 0; i < n; i++) kf_tensor_release(&t[i]);
}

/* Expects eval to fail with code, naming the node. */
static void expect_fail(kf_node *n, int nin, const kf_tensor *const *in, kf_status code) {
    kf_tensor out[4] = {{0}};
    kf_status st = kf_eval_node(n, nin, in, out);
    cr_assert_eq(st, code, "%s: expected status %d, got %d (%s)", n->op_type, code, st, kf_last_error());
    cr_assert(strstr(kf_last_error(), n->name) != NULL, "message names the node: %s", kf_last_error());
    release_all(out, 4);
}

/* Runs node n's shape function on types. */
static kf_status shape_of(const kf_node *n, int nin, const kf_type *const *in,
                          const kf_tensor *const *val, int nout, kf_type *out) {
    const kf_op_info *info = kf_op_get(n->op);
    cr_assert(info && info->shape, "op %s has a shape function", n->op_type);
    for (int j = 0; j < nout; j++) kf_type_unknown(&out[j]);
    return info->shape(n, nin, in, val, nout, out);
}

static kf_type sym_type(kf_dtype dt, int rank, const int64_t *dims, const uint32_t *syms) {
    kf_type t;
    kf_type_unknown(&t);
    t.dtype = dt;
    t.rank = rank;
    for (int d = 0; d < rank; d++) {
        t.dims[d] = dims[d];
        t.syms[d] = syms ? syms[d] : 0;
    }
    return t;
}

static kf_tensor i64v(int count, const int64_t *v) {
    int64_t d = count;
    return tu_i64(1, &d, v);
}

/* ---- Identity / Dropout -------------------------------------------------------- */

Test(shape_identity, copies_every_dtype) {
    int64_t dims[3] = {2, 0, 3}, dims2[3] = {2, 3, 4};
    for (int k = 0; k < NDTYPES; k++) {
        for (int z = 0; z < 2; z++) {
            kf_tensor x = rnd(all_dtypes[k], 3, z ? dims : dims2), out[1] = {{0}};
            const kf_tensor *in[1] = {&x};
            kf_node *n = tu_node("Identity", 1, 1, 16);
            tu_eval(n, 1, in, out);
            assert_same(&out[0], &x, kf_dtype_name(all_dtypes[k]));
            if (x.dtype == KF_DT_STRING && x.numel)
                cr_assert_neq(((kf_bytes *)out[0].data)[0].ptr, ((kf_bytes *)x.data)[0].ptr,
                              "strings are deep-copied");
            tu_node_free(n);
            kf_tensor_release(&x);
            release_all(out, 1);
        }
    }
}

Test(shape_dropout, inference_is_identity_with_true_mask) {
    int64_t dims[2] = {3, 5};
    kf_tensor x = rnd(KF_DT_FLOAT, 2, dims), out[2] = {{0}};
    float r = 0.3f;
    int64_t one = 1;
    kf_tensor ratio = tu_f32(0, &one, &r);
    double f = 0;
    kf_tensor train = tu_tensor(KF_DT_BOOL, 0, &one, &f);
    const kf_tensor *in[3] = {&x, &ratio, &train};
    kf_node *n = tu_node("Dropout", 3, 2, 13);
    tu_eval(n, 3, in, out);
    assert_same(&out[0], &x, "output");
    cr_assert_eq(out[1].dtype, KF_DT_BOOL);
    for (int64_t i = 0; i < out[1].numel; i++) cr_assert_eq(((uint8_t *)out[1].data)[i], 1);
    release_all(out, 2);
    tu_node_free(n);

    /* opset 7: the mask has the data's dtype */
    n = tu_node("Dropout", 1, 2, 7);
    tu_attr_f(n, "ratio", 0.2f);
    tu_eval(n, 1, in, out);
    assert_same(&out[0], &x, "output");
    cr_assert_eq(out[1].dtype, KF_DT_FLOAT);
    cr_assert_eq(((float *)out[1].data)[4], 1.0f);
    release_all(out, 2);
    tu_node_free(n);

    /* training with ratio 0 is still the identity */
    kf_set_f64(&train, 0, 1);
    ((float *)ratio.data)[0] = 0;
    n = tu_node("Dropout", 3, 1, 13);
    tu_eval(n, 3, in, out);
    assert_same(&out[0], &x, "ratio 0");
    release_all(out, 2);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&ratio);
    kf_tensor_release(&train);
}

Test(shape_dropout, training_is_unsupported) {
    int64_t dims[1] = {4}, one = 1;
    kf_tensor x = rnd(KF_DT_FLOAT, 1, dims);
    double t = 1;
    kf_tensor train = tu_tensor(KF_DT_BOOL, 0, &one, &t);
    const kf_tensor *in[3] = {&x, NULL, &train};
    kf_node *n = tu_node("Dropout", 3, 2, 13);
    expect_fail(n, 3, in, KF_ERR_UNSUPPORTED);
    tu_node_free(n);
    n = tu_node("Dropout", 1, 1, 6); /* is_test defaults to 0 */
    expect_fail(n, 1, in, KF_ERR_UNSUPPORTED);
    tu_attr_i(n, "is_test", 1);
    kf_tensor out[1] = {{0}};
    tu_eval(n, 1, in, out);
    assert_same(&out[0], &x, "is_test");
    release_all(out, 1);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&train);
}

/* ---- Transpose -------------------------------------------------------------------- */

static void check_transpose(kf_dtype dt, int rank, const int64_t *dims, const int64_t *perm) {
    kf_tensor x = rnd(dt, rank, dims), out[1] = {{0}};
    const kf_tensor *in[1] = {&x};
    kf_node *n = tu_node("Transpose", 1, 1, 13);
    if (perm) tu_attr_ints(n, "perm", rank, perm);
    tu_eval(n, 1, in, out);
    int64_t p[KF_MAX_RANK], odims[KF_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        p[d] = perm ? perm[d] : rank - 1 - d;
        odims[d] = dims[p[d]];
    }
    kf_tensor want = alloc_t(dt, rank, odims);
    for (int64_t e = 0; e < want.numel; e++) {
        int64_t oi[KF_MAX_RANK], ii[KF_MAX_RANK];
        unravel(rank, odims, e, oi);
        for (int d = 0; d < rank; d++) ii[p[d]] = oi[d];
        put(&want, e, &x, ravel(rank, dims, ii));
    }
    fill_empty_strings(&want);
    assert_same(&out[0], &want, "transpose");
    kf_tensor_release(&want);
    release_all(out, 1);
    kf_tensor_release(&x);
    tu_node_free(n);
}

Test(shape_transpose, random_permutations_match_index_math) {
    int64_t dims[4] = {2, 3, 4, 5};
    for (int trial = 0; trial < 12; trial++) {
        int64_t perm[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) { /* Fisher-Yates */
            int j = (int)tu_uniform(0, i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        check_transpose(all_dtypes[trial % NDTYPES], 4, dims, perm);
    }
    check_transpose(KF_DT_STRING, 4, dims, NULL);
    int64_t z[3] = {2, 0, 3}, zp[3] = {2, 0, 1};
    check_transpose(KF_DT_FLOAT, 3, z, zp);
}

Test(shape_transpose, shape_keeps_symbols_and_rejects_bad_perm) {
    int64_t dims[3] = {-1, 3, -1};
    uint32_t syms[3] = {7, 0, 9};
    kf_type x = sym_type(KF_DT_FLOAT, 3, dims, syms), out[1];
    const kf_type *in[1] = {&x};
    kf_node *n = tu_node("Transpose", 1, 1, 13);
    int64_t perm[3] = {2, 0, 1};
    tu_attr_ints(n, "perm", 3, perm);
    cr_assert_eq(shape_of(n, 1, in, NULL, 1, out), KF_OK);
    cr_assert_eq(out[0].syms[0], 9);
    cr_assert_eq(out[0].syms[1], 7);
    cr_assert_eq(out[0].dims[2], 3);
    tu_node_free(n);
    int64_t bad[3] = {0, 0, 1};
    n = tu_node("Transpose", 1, 1, 13);
    tu_attr_ints(n, "perm", 3, bad);
    int64_t d3[3] = {1, 2, 3};
    kf_tensor t = rnd(KF_DT_FLOAT, 3, d3);
    const kf_tensor *tin[1] = {&t};
    expect_fail(n, 1, tin, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&t);
}

/* ---- Reshape / Flatten / Squeeze / Unsqueeze ------------------------------------------ */

/* These only relabel: the output holds the input's elements in order. */
static void check_relabel(kf_node *n, int nin, const kf_tensor *const *in, int rank,
                          const int64_t *want_dims) {
    kf_tensor out[1] = {{0}};
    tu_eval(n, nin, in, out);
    cr_assert_eq(out[0].rank, rank, "%s rank %d, expected %d", n->op_type, out[0].rank, rank);
    for (int d = 0; d < rank; d++)
        cr_assert_eq(out[0].dims[d], want_dims[d], "%s dim %d is %lld, expected %lld", n->op_type, d,
                     (long long)out[0].dims[d], (long long)want_dims[d]);
    kf_tensor want = {0};
    cr_assert_eq(kf_tensor_copy(&want, in[0]), KF_OK);
    want.rank = rank;
    for (int d = 0; d < rank; d++) want.dims[d] = want_dims[d];
    assert_same(&out[0], &want, n->op_type);
    kf_tensor_release(&want);
    release_all(out, 1);
}

Test(shape_reshape, zero_minus_one_and_allowzero) {
    int64_t dims[3] = {2, 3, 4};
    for (int k = 0; k < NDTYPES; k++) {
        kf_tensor x = rnd(all_dtypes[k], 3, dims);
        int64_t s1[2] = {0, -1};
        kf_tensor sh = i64v(2, s1);
        const kf_tensor *in[2] = {&x, &sh};
        kf_node *n = tu_node("Reshape", 2, 1, 14);
        int64_t w1[2] = {2, 12};
        check_relabel(n, 2, in, 2, w1);
        tu_node_free(n);
        kf_tensor_release(&sh);
        kf_tensor_release(&x);
    }
    /* opset 1..4: the shape is an attribute */
    kf_tensor x = rnd(KF_DT_INT64, 3, dims);
    const kf_tensor *in1[1] = {&x};
    kf_node *n = tu_node("Reshape", 1, 1, 4);
    int64_t s2[3] = {4, -1, 2}, w2[3] = {4, 3, 2};
    tu_attr_ints(n, "shape", 3, s2);
    check_relabel(n, 1, in1, 3, w2);
    tu_node_free(n);
    /* allowzero: 0 is a real zero-size dim */
    int64_t zd[2] = {0, 5};
    kf_tensor z = rnd(KF_DT_FLOAT, 2, zd);
    int64_t s3[3] = {5, 0, 7};
    kf_tensor sh3 = i64v(3, s3);
    const kf_tensor *in3[2] = {&z, &sh3};
    n = tu_node("Reshape", 2, 1, 14);
    tu_attr_i(n, "allowzero", 1);
    check_relabel(n, 2, in3, 3, s3);
    tu_node_free(n);
    kf_tensor_release(&z);
    kf_tensor_release(&sh3);
    kf_tensor_release(&x);
}

Test(shape_reshape, errors_name_the_node) {
    int64_t dims[2] = {2, 3};
    kf_tensor x = rnd(KF_DT_FLOAT, 2, dims);
    int64_t two_neg[2] = {-1, -1}, wrong[2] = {4, 2}, tooshort[3] = {0, 0, 0};
    int64_t *cases[3] = {two_neg, wrong, tooshort};
    int counts[3] = {2, 2, 3};
    kf_status codes[3] = {KF_ERR_BAD_MODEL, KF_ERR_SHAPE, KF_ERR_SHAPE};
    for (int c = 0; c < 3; c++) {
        kf_tensor sh = i64v(counts[c], cases[c]);
        const kf_tensor *in[2] = {&x, &sh};
        kf_node *n = tu_node("Reshape", 2, 1, 13);
        expect_fail(n, 2, in, codes[c]);
        tu_node_free(n);
        kf_tensor_release(&sh);
    }
    kf_tensor_release(&x);
}

Test(shape_reshape, symbolic_batch_survives) {
    int64_t dims[3] = {-1, 3, 4};
    uint32_t syms[3] = {5, 0, 0};
    kf_type x = sym_type(KF_DT_FLOAT, 3, dims, syms);
    int64_t two = 2;
    kf_type st = sym_type(KF_DT_INT64, 1, &two, NULL), out[1];
    int64_t s[2] = {0, -1};
    kf_tensor sh = i64v(2, s);
    const kf_type *in[2] = {&x, &st};
    const kf_tensor *val[2] = {NULL, &sh};
    kf_node *n = tu_node("Reshape", 2, 1, 13);
    cr_assert_eq(shape_of(n, 2, in, val, 1, out), KF_OK, "%s", kf_last_error());
    cr_assert_eq(out[0].rank, 2);
    cr_assert_eq(out[0].dims[0], -1);
    cr_assert_eq(out[0].syms[0], 5);
    cr_assert_eq(out[0].dims[1], 12);
    /* shape value unknown: rank from the shape input's length */
    const kf_tensor *noval[2] = {NULL, NULL};
    cr_assert_eq(shape_of(n, 2, in, noval, 1, out), KF_OK);
    cr_assert_eq(out[0].rank, 2);
    cr_assert_eq(out[0].dims[1], -1);
    tu_node_free(n);
    kf_tensor_release(&sh);
}

Test(shape_flatten, every_axis) {
    int64_t dims[4] = {2, 3, 0, 5}, dims2[4] = {2, 3, 4, 5};
    for (int z = 0; z < 2; z++) {
        const int64_t *d = z ? dims : dims2;
        kf_tensor x = rnd(z ? KF_DT_STRING : KF_DT_BFLOAT16, 4, d);
        const kf_tensor *in[1] = {&x};
        for (int axis = -4; axis <= 4; axis++) {
            kf_node *n = tu_node("Flatten", 1, 1, 13);
            tu_attr_i(n, "axis", axis);
            int a = axis < 0 ? axis + 4 : axis;
            int64_t w[2] = {1, 1};
            for (int k = 0; k < 4; k++) w[k >= a] *= d[k];
            check_relabel(n, 1, in, 2, w);
            tu_node_free(n);
        }
        kf_node *n = tu_node("Flatten", 1, 1, 13);
        tu_attr_i(n, "axis", 5);
        expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
        tu_node_free(n);
        n = tu_node("Flatten", 1, 1, 9);
        tu_attr_i(n, "axis", -1);
        expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
        tu_node_free(n);
        kf_tensor_release(&x);
    }
}

Test(shape_squeeze, attribute_and_input_forms) {
    int64_t dims[5] = {1, 3, 1, 4, 1};
    kf_tensor x = rnd(KF_DT_INT16, 5, dims);
    const kf_tensor *in1[1] = {&x};
    kf_node *n = tu_node("Squeeze", 1, 1, 11);
    int64_t w_all[2] = {3, 4};
    check_relabel(n, 1, in1, 2, w_all);
    int64_t ax[2] = {-1, 0}, w2[3] = {3, 1, 4};
    tu_attr_ints(n, "axes", 2, ax);
    check_relabel(n, 1, in1, 3, w2);
    tu_node_free(n);
    kf_tensor axes = i64v(2, ax);
    const kf_tensor *in2[2] = {&x, &axes};
    n = tu_node("Squeeze", 2, 1, 13);
    check_relabel(n, 2, in2, 3, w2);
    int64_t bad[1] = {1};
    kf_tensor badax = i64v(1, bad);
    const kf_tensor *in3[2] = {&x, &badax};
    expect_fail(n, 2, in3, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&badax);
    kf_tensor_release(&axes);
    kf_tensor_release(&x);
}

Test(shape_unsqueeze, axes_index_the_output) {
    int64_t dims[2] = {3, 4};
    kf_tensor x = rnd(KF_DT_STRING, 2, dims);
    int64_t ax[3] = {4, 0, -3}, w[5] = {1, 3, 1, 4, 1};
    kf_tensor axes = i64v(3, ax);
    const kf_tensor *in[2] = {&x, &axes};
    kf_node *n = tu_node("Unsqueeze", 2, 1, 13);
    check_relabel(n, 2, in, 5, w);
    tu_node_free(n);
    n = tu_node("Unsqueeze", 1, 1, 11);
    tu_attr_ints(n, "axes", 3, ax);
    check_relabel(n, 1, in, 5, w);
    tu_node_free(n);
    int64_t dup[2] = {1, -3};
    n = tu_node("Unsqueeze", 1, 1, 11);
    tu_attr_ints(n, "axes", 2, dup);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = tu_node("Unsqueeze", 1, 1, 13);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* axes input missing */
    tu_node_free(n);
    /* symbols move with their dims */
    int64_t sd[2] = {-1, 4};
    uint32_t ss[2] = {3, 0};
    kf_type t = sym_type(KF_DT_FLOAT, 2, sd, ss), out[1];
    const kf_type *tin[2] = {&t, NULL};
    n = tu_node("Unsqueeze", 1, 1, 11);
    int64_t a0[1] = {0};
    tu_attr_ints(n, "axes", 1, a0);
    cr_assert_eq(shape_of(n, 1, tin, NULL, 1, out), KF_OK);
    cr_assert_eq(out[0].rank, 3);
    cr_assert_eq(out[0].dims[0], 1);
    cr_assert_eq(out[0].syms[1], 3);
    tu_node_free(n);
    kf_tensor_release(&axes);
    kf_tensor_release(&x);
}

/* ---- Concat / Split ---------------------------------------------------------------------- */

Test(shape_concat, random_inputs_along_each_axis) {
    for (int k = 0; k < NDTYPES; k++) {
        kf_dtype dt = all_dtypes[k];
        int axis = k % 3;
        int64_t sizes[3] = {2, 0, 3};
        kf_tensor xs[3];
        int64_t base[3] = {2, 3, 4};
        for (int i = 0; i < 3; i++) {
            int64_t d[3] = {base[0], base[1], base[2]};
            d[axis] = sizes[i];
            xs[i] = rnd(dt, 3, d);
        }
        const kf_tensor *in[3] = {&xs[0], &xs[1], &xs[2]};
        kf_node *n = tu_node("Concat", 3, 1, 13);
        tu_attr_i(n, "axis", axis - 3);
        kf_tensor out[1] = {{0}};
        tu_eval(n, 3, in, out);
        int64_t od[3] = {base[0], base[1], base[2]};
        od[axis] = 5;
        kf_tensor want = alloc_t(dt, 3, od);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t idx[3];
            unravel(3, od, e, idx);
            int i = 0;
            while (idx[axis] >= sizes[i]) idx[axis] -= sizes[i++];
            put(&want, e, &xs[i], ravel(3, xs[i].dims, idx));
        }
        fill_empty_strings(&want);
        assert_same(&out[0], &want, kf_dtype_name(dt));
        kf_tensor_release(&want);
        release_all(out, 1);
        release_all(xs, 3);
        tu_node_free(n);
    }
}

Test(shape_concat, mismatches_and_symbols) {
    int64_t a[2] = {2, 3}, b[2] = {2, 4};
    kf_tensor x = rnd(KF_DT_FLOAT, 2, a), y = rnd(KF_DT_FLOAT, 2, b);
    const kf_tensor *in[2] = {&x, &y};
    kf_node *n = tu_node("Concat", 2, 1, 13);
    tu_attr_i(n, "axis", 0);
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    tu_node_free(n);
    n = tu_node("Concat", 2, 1, 13); /* axis is required */
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    int64_t sd[2] = {-1, 3}, sd2[2] = {-1, -1};
    uint32_t ss[2] = {4, 0}, ss2[2] = {4, 6};
    kf_type t1 = sym_type(KF_DT_FLOAT, 2, sd, ss), t2 = sym_type(KF_DT_FLOAT, 2, sd2, ss2), out[1];
    const kf_type *tin[2] = {&t1, &t2};
    n = tu_node("Concat", 2, 1, 13);
    tu_attr_i(n, "axis", 1);
    cr_assert_eq(shape_of(n, 2, tin, NULL, 1, out), KF_OK);
    cr_assert_eq(out[0].syms[0], 4, "batch symbol kept");
    cr_assert_eq(out[0].dims[1], -1);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&y);
}

/* Checks Split outputs against slices of x along axis with the given lengths. */
static void check_split(const kf_tensor *x, int axis, const kf_tensor *out, int nout,
                        const int64_t *lens) {
    int64_t off = 0;
    for (int j = 0; j < nout; j++) {
        int64_t od[KF_MAX_RANK];
        for (int d = 0; d < x->rank; d++) od[d] = x->dims[d];
        od[axis] = lens[j];
        kf_tensor want = alloc_t(x->dtype, x->rank, od);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t idx[KF_MAX_RANK];
            unravel(x->rank, od, e, idx);
            idx[axis] += off;
            put(&want, e, x, ravel(x->rank, x->dims, idx));
        }
        fill_empty_strings(&want);
        assert_same(&out[j], &want, "split part");
        kf_tensor_release(&want);
        off += lens[j];
    }
}

Test(shape_split, every_way_of_giving_lengths) {
    int64_t dims[2] = {3, 7};
    kf_tensor x = rnd(KF_DT_STRING, 2, dims), out[4] = {{0}};
    const kf_tensor *in1[1] = {&x};
    /* opset 18 num_outputs: uneven, the last part smaller */
    kf_node *n = tu_node("Split", 1, 3, 18);
    tu_attr_i(n, "axis", 1);
    tu_attr_i(n, "num_outputs", 3);
    tu_eval(n, 1, in1, out);
    int64_t l1[3] = {3, 3, 1};
    check_split(&x, 1, out, 3, l1);
    release_all(out, 4);
    tu_node_free(n);
    /* opset 13: uneven without lengths is an error */
    n = tu_node("Split", 1, 3, 13);
    tu_attr_i(n, "axis", 1);
    expect_fail(n, 1, in1, KF_ERR_SHAPE);
    tu_node_free(n);
    /* opset 13: lengths as input, including a zero-size part */
    int64_t l2[3] = {2, 0, 5};
    kf_tensor sp = i64v(3, l2);
    const kf_tensor *in2[2] = {&x, &sp};
    n = tu_node("Split", 2, 3, 13);
    tu_attr_i(n, "axis", -1);
    tu_eval(n, 2, in2, out);
    check_split(&x, 1, out, 3, l2);
    release_all(out, 4);
    tu_node_free(n);
    /* opset 11: lengths as attribute, default axis 0 */
    int64_t l3[2] = {1, 2};
    n = tu_node("Split", 1, 2, 11);
    tu_attr_ints(n, "split", 2, l3);
    tu_eval(n, 1, in1, out);
    check_split(&x, 0, out, 2, l3);
    release_all(out, 4);
    tu_node_free(n);
    /* equal parts */
    n = tu_node("Split", 1, 3, 13);
    tu_eval(n, 1, in1, out);
    int64_t l4[3] = {1, 1, 1};
    check_split(&x, 0, out, 3, l4);
    release_all(out, 4);
    tu_node_free(n);
    /* lengths that do not add up */
    int64_t l5[2] = {1, 1};
    n = tu_node("Split", 1, 2, 11);
    tu_attr_ints(n, "split", 2, l5);
    expect_fail(n, 1, in1, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&sp);
    kf_tensor_release(&x);
}

/* ---- Slice -------------------------------------------------------------------------------- */

/* The spec's rules written out: negative starts/ends count from the back,
 * then clamp (start to [0, dim] or [0, dim-1], end to [0, dim] or
 * [-1, dim-1] by the sign of step); the indices are found by walking. */
static int64_t ref_slice_indices(int64_t s, int64_t e, int64_t step, int64_t dim, int64_t *idx) {
    if (dim == 0) return 0;
    if (s < 0) s = (s < -dim ? -dim : s) + dim;
    if (e < 0) e = (e < -dim - 1 ? -dim - 1 : e) + dim;
    if (step > 0) {
        s = s > dim ? dim : s;
        e = e < 0 ? 0 : e > dim ? dim : e;
    } else {
        s = s > dim - 1 ? dim - 1 : s;
        e = e > dim - 1 ? dim - 1 : e;
    }
    int64_t c = 0;
    for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
        idx[c++] = i;
        if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    return c;
}

static void check_slice(kf_dtype dt, int64_t opset, int rank, const int64_t *dims, int m,
                        const int64_t *starts, const int64_t *ends, const int64_t *axes,
                        const int64_t *steps) {
    kf_tensor x = rnd(dt, rank, dims), out[1] = {{0}};
    kf_tensor ts = i64v(m, starts), te = i64v(m, ends), ta = {0}, tst = {0};
    kf_node *n;
    int nin = 1;
    const kf_tensor *in[5] = {&x, &ts, &te, NULL, NULL};
    if (opset < 10) {
        n = tu_node("Slice", 1, 1, opset);
        tu_attr_ints(n, "starts", m, starts);
        tu_attr_ints(n, "ends", m, ends);
        if (axes) tu_attr_ints(n, "axes", m, axes);
    } else {
        nin = steps ? 5 : axes ? 4 : 3;
        n = tu_node("Slice", nin, 1, opset);
        if (axes) {
            ta = i64v(m, axes);
            in[3] = &ta;
        }
        if (steps) {
            tst = i64v(m, steps);
            in[4] = &tst;
        }
    }
    tu_eval(n, nin, in, out);
    int64_t sel[KF_MAX_RANK][64], cnt[KF_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        cnt[d] = dims[d];
        for (int64_t i = 0; i < dims[d]; i++) sel[d][i] = i;
    }
    for (int k = 0; k < m; k++) {
        int a = (int)(axes ? (axes[k] < 0 ? axes[k] + rank : axes[k]) : k);
        cnt[a] = ref_slice_indices(starts[k], ends[k], steps ? steps[k] : 1, dims[a], sel[a]);
    }
    kf_tensor want = alloc_t(dt, rank, cnt);
    for (int64_t e = 0; e < want.numel; e++) {
        int64_t idx[KF_MAX_RANK];
        unravel(rank, cnt, e, idx);
        for (int d = 0; d < rank; d++) idx[d] = sel[d][idx[d]];
        put(&want, e, &x, ravel(rank, dims, idx));
    }
    fill_empty_strings(&want);
    assert_same(&out[0], &want, "slice");
    kf_tensor_release(&want);
    release_all(out, 1);
    kf_tensor_release(&x);
    kf_tensor_release(&ts);
    kf_tensor_release(&te);
    kf_tensor_release(&ta);
    kf_tensor_release(&tst);
    tu_node_free(n);
}

Test(shape_slice, random_slices_match_python_rules) {
    int64_t dims[3] = {5, 6, 7};
    for (int trial = 0; trial < 200; trial++) {
        int m = 1 + (int)tu_uniform(0, 3);
        int64_t starts[3], ends[3], axes[3] = {0, 1, 2}, steps[3];
        for (int i = 2; i > 0; i--) {
            int j = (int)tu_uniform(0, i + 1);
            int64_t t = axes[i];
            axes[i] = axes[j];
            axes[j] = t;
        }
        for (int k = 0; k < m; k++) {
            starts[k] = (int64_t)tu_uniform(-10, 10);
            ends[k] = (int64_t)tu_uniform(-10, 10);
            steps[k] = (int64_t)tu_uniform(-3, 3);
            if (steps[k] == 0) steps[k] = 1;
            if (tu_uniform(0, 1) < 0.15) ends[k] = steps[k] > 0 ? INT64_MAX : INT64_MIN;
            if (tu_uniform(0, 1) < 0.1) starts[k] = steps[k] > 0 ? INT64_MIN : INT64_MAX;
            if (tu_uniform(0, 1) < 0.3) axes[k] -= 3;
        }
        check_slice(all_dtypes[trial % NDTYPES], 13, 3, dims, m, starts, ends, axes, steps);
    }
    /* opset 1: attributes, no steps */
    int64_t s[2] = {1, -3}, e[2] = {INT64_MAX, -1}, a[2] = {2, 0};
    check_slice(KF_DT_FLOAT, 1, 3, dims, 2, s, e, a, NULL);
    check_slice(KF_DT_STRING, 9, 3, dims, 2, s, e, NULL, NULL);
    /* zero-size input */
    int64_t zd[2] = {0, 4}, zs[1] = {1}, ze[1] = {3};
    check_slice(KF_DT_INT32, 13, 2, zd, 1, zs, ze, NULL, NULL);
}

Test(shape_slice, bad_parameters) {
    int64_t dims[2] = {4, 4};
    kf_tensor x = rnd(KF_DT_FLOAT, 2, dims);
    int64_t s[1] = {0}, e[1] = {3}, zero[1] = {0}, ax[1] = {2}, e2[2] = {1, 2};
    kf_tensor ts = i64v(1, s), te = i64v(1, e), tz = i64v(1, zero), tax = i64v(1, ax), te2 = i64v(2, e2);
    const kf_tensor *step0[5] = {&x, &ts, &te, NULL, &tz};
    kf_node *n = tu_node("Slice", 5, 1, 13);
    expect_fail(n, 5, step0, KF_ERR_BAD_MODEL);
    const kf_tensor *badaxis[4] = {&x, &ts, &te, &tax};
    expect_fail(n, 4, badaxis, KF_ERR_BAD_MODEL);
    const kf_tensor *lens[3] = {&x, &ts, &te2};
    expect_fail(n, 3, lens, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor *all[6] = {&x, &ts, &te, &tz, &tax, &te2};
    for (int i = 0; i < 6; i++) kf_tensor_release(all[i]);
}

Test(shape_slice, shape_function_keeps_untouched_symbols) {
    int64_t dims[2] = {-1, 10};
    uint32_t syms[2] = {8, 0};
    kf_type x = sym_type(KF_DT_FLOAT, 2, dims, syms), one = sym_type(KF_DT_INT64, 1, (int64_t[]){1}, NULL), out[1];
    int64_t s[1] = {2}, e[1] = {-2}, a[1] = {1};
    kf_tensor ts = i64v(1, s), te = i64v(1, e), ta = i64v(1, a);
    const kf_type *in[4] = {&x, &one, &one, &one};
    const kf_tensor *val[4] = {NULL, &ts, &te, &ta};
    kf_node *n = tu_node("Slice", 4, 1, 13);
    cr_assert_eq(shape_of(n, 4, in, val, 1, out), KF_OK, "%s", kf_last_error());
    cr_assert_eq(out[0].syms[0], 8);
    cr_assert_eq(out[0].dims[1], 6);
    tu_node_free(n);
    kf_tensor_release(&ts);
    kf_tensor_release(&te);
    kf_tensor_release(&ta);
}

/* ---- Expand / Tile ------------------------------------------------------------------------- */

Test(shape_expand, bidirectional_broadcast) {
    int64_t xd[3] = {3, 1, 4};
    int64_t shape[4] = {2, 1, 5, 1};
    for (int k = 0; k < NDTYPES; k++) {
        kf_tensor x = rnd(all_dtypes[k], 3, xd), sh = i64v(4, shape), out[1] = {{0}};
        const kf_tensor *in[2] = {&x, &sh};
        kf_node *n = tu_node("Expand", 2, 1, 13);
        tu_eval(n, 2, in, out);
        int64_t od[4] = {2, 3, 5, 4};
        kf_tensor want = alloc_t(x.dtype, 4, od);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t idx[4], ii[3];
            unravel(4, od, e, idx);
            for (int d = 0; d < 3; d++) ii[d] = xd[d] == 1 ? 0 : idx[d + 1];
            put(&want, e, &x, ravel(3, xd, ii));
        }
        fill_empty_strings(&want);
        assert_same(&out[0], &want, kf_dtype_name(x.dtype));
        kf_tensor_release(&want);
        release_all(out, 1);
        kf_tensor_release(&x);
        kf_tensor_release(&sh);
        tu_node_free(n);
    }
    kf_tensor x = rnd(KF_DT_FLOAT, 3, xd);
    int64_t bad[2] = {2, 4}; /* [3, 2] against [2, 4]: 2 vs 4 */
    kf_tensor sh = i64v(2, bad);
    int64_t bd[2] = {3, 2};
    kf_tensor y = rnd(KF_DT_FLOAT, 2, bd);
    const kf_tensor *in[2] = {&y, &sh};
    kf_node *n = tu_node("Expand", 2, 1, 13);
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&y);
    kf_tensor_release(&sh);
}

Test(shape_tile, repeats_each_dim) {
    int64_t xd[3] = {2, 3, 2};
    int64_t reps[3] = {2, 1, 3};
    for (int k = 0; k < NDTYPES; k++) {
        kf_tensor x = rnd(all_dtypes[k], 3, xd), r = i64v(3, reps), out[1] = {{0}};
        const kf_tensor *in[2] = {&x, &r};
        kf_node *n = tu_node("Tile", 2, 1, 13);
        tu_eval(n, 2, in, out);
        int64_t od[3] = {4, 3, 6};
        kf_tensor want = alloc_t(x.dtype, 3, od);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t idx[3];
            unravel(3, od, e, idx);
            for (int d = 0; d < 3; d++) idx[d] %= xd[d];
            put(&want, e, &x, ravel(3, xd, idx));
        }
        fill_empty_strings(&want);
        assert_same(&out[0], &want, kf_dtype_name(x.dtype));
        kf_tensor_release(&want);
        release_all(out, 1);
        kf_tensor_release(&x);
        kf_tensor_release(&r);
        tu_node_free(n);
    }
    kf_tensor x = rnd(KF_DT_FLOAT, 3, xd);
    int64_t neg[3] = {1, -1, 1}, shortr[2] = {1, 1};
    kf_tensor r1 = i64v(3, neg), r2 = i64v(2, shortr);
    kf_node *n = tu_node("Tile", 2, 1, 13);
    const kf_tensor *in1[2] = {&x, &r1}, *in2[2] = {&x, &r2};
    expect_fail(n, 2, in1, KF_ERR_BAD_MODEL);
    expect_fail(n, 2, in2, KF_ERR_BAD_MODEL);
    int64_t zero[3] = {1, 0, 2};
    kf_tensor r3 = i64v(3, zero), out[1] = {{0}};
    const kf_tensor *in3[2] = {&x, &r3};
    tu_eval(n, 2, in3, out);
    cr_assert_eq(out[0].numel, 0);
    cr_assert_eq(out[0].dims[2], 4);
    release_all(out, 1);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&r1);
    kf_tensor_release(&r2);
    kf_tensor_release(&r3);
}

/* ---- Shape / Size ---------------------------------------------------------------------------- */

Test(shape_shape, start_end_clamp) {
    int64_t xd[4] = {2, 0, 5, 7};
    kf_tensor x = rnd(KF_DT_STRING, 4, xd);
    const kf_tensor *in[1] = {&x};
    struct {
        int64_t opset, start, end;
        int has_start, has_end;
        int64_t lo, hi;
    } cases[] = {
        {13, 0, 0, 0, 0, 0, 4}, {15, 1, 0, 1, 0, 1, 4},  {15, -1, 0, 1, 0, 3, 4},
        {15, 0, -1, 0, 1, 0, 3}, {15, -10, 10, 1, 1, 0, 4}, {15, 3, 1, 1, 1, 3, 3},
        {13, 2, 3, 1, 1, 0, 4}, /* start/end are ignored before opset 15 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kf_node *n = tu_node("Shape", 1, 1, cases[c].opset);
        if (cases[c].has_start) tu_attr_i(n, "start", cases[c].start);
        if (cases[c].has_end) tu_attr_i(n, "end", cases[c].end);
        kf_tensor out[1] = {{0}};
        tu_eval(n, 1, in, out);
        kf_tensor want = i64v((int)(cases[c].hi - cases[c].lo), xd + cases[c].lo);
        assert_same(&out[0], &want, "shape");
        kf_tensor_release(&want);
        release_all(out, 1);
        tu_node_free(n);
    }
    kf_node *n = tu_node("Size", 1, 1, 13);
    kf_tensor out[1] = {{0}};
    tu_eval(n, 1, in, out);
    cr_assert_eq(out[0].rank, 0);
    cr_assert_eq(((int64_t *)out[0].data)[0], 0);
    release_all(out, 1);
    int64_t yd[2] = {3, 5};
    kf_tensor y = rnd(KF_DT_BOOL, 2, yd);
    const kf_tensor *iny[1] = {&y};
    tu_eval(n, 1, iny, out);
    cr_assert_eq(((int64_t *)out[0].data)[0], 15);
    release_all(out, 1);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&y);
}

/* ---- Constant / ConstantOfShape / Range / EyeLike ------------------------------------------- */

Test(shape_constant, every_attribute_kind) {
    kf_tensor out[1] = {{0}};
    int64_t td[2] = {2, 3};
    kf_tensor val = rnd(KF_DT_UINT64, 2, td);
    kf_node *n = tu_node("Constant", 0, 1, 13);
    tu_attr_t(n, "value", &val);
    tu_eval(n, 0, NULL, out);
    assert_same(&out[0], &val, "value");
    release_all(out, 1);
    tu_node_free(n);

    float f = (float)tu_uniform(-5, 5);
    n = tu_node("Constant", 0, 1, 13);
    tu_attr_f(n, "value_float", f);
    tu_eval(n, 0, NULL, out);
    cr_assert_eq(out[0].rank, 0);
    cr_assert_eq(((float *)out[0].data)[0], f);
    release_all(out, 1);
    tu_node_free(n);

    int64_t ints[3] = {INT64_MAX, -((int64_t)1 << 60) - 1, 7};
    n = tu_node("Constant", 0, 1, 13);
    tu_attr_ints(n, "value_ints", 3, ints);
    tu_eval(n, 0, NULL, out);
    kf_tensor wi = i64v(3, ints);
    assert_same(&out[0], &wi, "value_ints");
    release_all(out, 1);
    tu_node_free(n);

    n = tu_node("Constant", 0, 1, 13);
    tu_attr_s(n, "value_string", "hello");
    tu_eval(n, 0, NULL, out);
    cr_assert_eq(out[0].dtype, KF_DT_STRING);
    cr_assert_str_eq(((kf_bytes *)out[0].data)[0].ptr, "hello");
    release_all(out, 1);
    tu_node_free(n);

    kf_bytes strs[2] = {{"ab", 2}, {"", 0}};
    kf_attr sa = {.name = "value_strings", .type = KF_ATTR_STRINGS, .strings = strs, .n = 2};
    n = tu_node("Constant", 0, 1, 13);
    cr_assert_eq(kf_node_add_attr(n, &sa), KF_OK);
    tu_eval(n, 0, NULL, out);
    cr_assert_eq(out[0].dims[0], 2);
    cr_assert_str_eq(((kf_bytes *)out[0].data)[0].ptr, "ab");
    cr_assert_eq(((kf_bytes *)out[0].data)[1].len, 0);
    release_all(out, 1);
    tu_node_free(n);

    float fs[2] = {1.5f, -2.25f};
    n = tu_node("Constant", 0, 1, 13);
    tu_attr_floats(n, "value_floats", 2, fs);
    tu_eval(n, 0, NULL, out);
    cr_assert_eq(((float *)out[0].data)[1], -2.25f);
    release_all(out, 1);
    tu_node_free(n);

    n = tu_node("Constant", 0, 1, 13);
    expect_fail(n, 0, NULL, KF_ERR_BAD_MODEL);
    tu_attr_i(n, "value_int", 3);
    tu_attr_f(n, "value_float", 3);
    expect_fail(n, 0, NULL, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_attr sp = {.name = "sparse_value", .type = KF_ATTR_SPARSE_TENSOR};
    n = tu_node("Constant", 0, 1, 13);
    cr_assert_eq(kf_node_add_attr(n, &sp), KF_OK);
    expect_fail(n, 0, NULL, KF_ERR_UNSUPPORTED);
    tu_node_free(n);
    kf_tensor_release(&val);
    kf_tensor_release(&wi);
}

Test(shape_constantofshape, fills_with_value) {
    int64_t sh[3] = {2, 0, 3}, sh2[2] = {3, 4};
    int64_t one = 1;
    kf_tensor v = rnd(KF_DT_INT64, 1, &one);
    for (int z = 0; z < 2; z++) {
        kf_tensor s = z ? i64v(3, sh) : i64v(2, sh2), out[1] = {{0}};
        const kf_tensor *in[1] = {&s};
        kf_node *n = tu_node("ConstantOfShape", 1, 1, 20);
        tu_attr_t(n, "value", &v);
        tu_eval(n, 1, in, out);
        cr_assert_eq(out[0].dtype, KF_DT_INT64);
        cr_assert_eq(out[0].rank, (int)s.numel);
        for (int64_t i = 0; i < out[0].numel; i++)
            cr_assert_eq(((int64_t *)out[0].data)[i], ((int64_t *)v.data)[0]);
        release_all(out, 1);
        tu_node_free(n);
        n = tu_node("ConstantOfShape", 1, 1, 9); /* default: float zeros */
        tu_eval(n, 1, in, out);
        cr_assert_eq(out[0].dtype, KF_DT_FLOAT);
        release_all(out, 1);
        tu_node_free(n);
        kf_tensor_release(&s);
    }
    /* empty shape: a scalar */
    int64_t zero = 0;
    kf_tensor es = {0};
    cr_assert_eq(kf_tensor_alloc(&es, KF_DT_INT64, 1, &zero), KF_OK);
    const kf_tensor *in[1] = {&es};
    kf_tensor out[1] = {{0}};
    kf_node *n = tu_node("ConstantOfShape", 1, 1, 20);
    tu_attr_t(n, "value", &v);
    tu_eval(n, 1, in, out);
    cr_assert_eq(out[0].rank, 0);
    cr_assert_eq(((int64_t *)out[0].data)[0], ((int64_t *)v.data)[0]);
    release_all(out, 1);
    int64_t negs[1] = {-2};
    kf_tensor ns = i64v(1, negs);
    const kf_tensor *inn[1] = {&ns};
    expect_fail(n, 1, inn, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&ns);
    kf_tensor_release(&es);
    kf_tensor_release(&v);
}

/* Range 27 steps float16/bfloat16 outputs in float32 (stash_type 1, the
 * default: the step is the difference of the first two float32 values, as
 * numpy fills) or double (11), rounding each value once; other stash
 * types are refused. */
Test(shape_range, stash_type_from_opset_27) {
    int64_t one = 1;
    const kf_dtype dts[2] = {KF_DT_FLOAT16, KF_DT_BFLOAT16};
    for (int k = 0; k < 2; k++) {
        double s = tu_uniform(-300, -200), d = tu_uniform(0.5, 1.5), l = s + 600 * d + 0.25 * d;
        kf_tensor ts = tu_tensor(dts[k], 0, &one, &s), tl = tu_tensor(dts[k], 0, &one, &l),
                  td = tu_tensor(dts[k], 0, &one, &d);
        double sv = kf_get_f64(&ts, 0), dv = kf_get_f64(&td, 0), lv = kf_get_f64(&tl, 0);
        int64_t count = (int64_t)ceil((lv - sv) / dv);
        const kf_tensor *in[3] = {&ts, &tl, &td};
        for (int st = 0; st < 3; st++) { /* default, float, double */
            kf_node *n = tu_node("Range", 3, 1, 27);
            if (st) tu_attr_i(n, "stash_type", st == 1 ? KF_DT_FLOAT : KF_DT_DOUBLE);
            kf_tensor out[1] = {{0}};
            tu_eval(n, 3, in, out);
            cr_assert_eq(out[0].dtype, dts[k]);
            cr_assert_eq(out[0].dims[0], count);
            kf_tensor want = {0};
            cr_assert_eq(kf_tensor_alloc(&want, dts[k], 1, &count), KF_OK);
            float fs = (float)sv, fd = (float)(sv + dv) - fs;
            for (int64_t i = 0; i < count; i++)
                kf_set_f64(&want, i, st == 2 ? sv + (double)i * dv : (double)(fs + (float)i * fd));
            cr_assert(kf_tensor_equal(&out[0], &want), "Range %s stash %d", kf_dtype_name(dts[k]), st);
            release_all(out, 1);
            kf_tensor_release(&want);
            tu_node_free(n);
        }
        kf_node *bad = tu_node("Range", 3, 1, 27);
        tu_attr_i(bad, "stash_type", KF_DT_FLOAT16);
        expect_fail(bad, 3, in, KF_ERR_BAD_MODEL);
        tu_node_free(bad);
        kf_tensor_release(&ts);
        kf_tensor_release(&tl);
        kf_tensor_release(&td);
    }
}

Test(shape_range, integer_exact_and_float) {
    int64_t one = 1;
    int64_t big = ((int64_t)1 << 60) + 1 + (int64_t)tu_uniform(0, 1000);
    int64_t s = big, l = big + 10, d = 3;
    kf_tensor ts = tu_i64(0, &one, &s), tl = tu_i64(0, &one, &l), td = tu_i64(0, &one, &d);
    const kf_tensor *in[3] = {&ts, &tl, &td};
    kf_node *n = tu_node("Range", 3, 1, 11);
    kf_tensor out[1] = {{0}};
    tu_eval(n, 3, in, out);
    cr_assert_eq(out[0].dims[0], 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(((int64_t *)out[0].data)[i], big + 3 * i);
    release_all(out, 1);
    /* negative delta, full int64 span without overflow */
    *(int64_t *)ts.data = INT64_MAX;
    *(int64_t *)tl.data = INT64_MIN;
    *(int64_t *)td.data = INT64_MIN;
    tu_eval(n, 3, in, out);
    cr_assert_eq(out[0].dims[0], 2);
    cr_assert_eq(((int64_t *)out[0].data)[0], INT64_MAX);
    cr_assert_eq(((int64_t *)out[0].data)[1], -1);
    release_all(out, 1);
    *(int64_t *)td.data = 0;
    expect_fail(n, 3, in, KF_ERR_RUNTIME);
    kf_tensor_release(&ts);
    kf_tensor_release(&tl);
    kf_tensor_release(&td);

    double fs = tu_uniform(-3, 3), fl = fs + tu_uniform(1, 5), fd = tu_uniform(0.1, 0.7);
    kf_tensor a = tu_tensor(KF_DT_DOUBLE, 0, &one, &fs), b = tu_tensor(KF_DT_DOUBLE, 0, &one, &fl),
              c = tu_tensor(KF_DT_DOUBLE, 0, &one, &fd);
    const kf_tensor *fin[3] = {&a, &b, &c};
    tu_eval(n, 3, fin, out);
    int64_t cnt = (int64_t)ceil((fl - fs) / fd);
    cr_assert_eq(out[0].dims[0], cnt);
    for (int64_t i = 0; i < cnt; i++) cr_assert_eq(((double *)out[0].data)[i], fs + (double)i * fd);
    release_all(out, 1);
    /* limit below start with positive delta: empty */
    const kf_tensor *rev[3] = {&b, &a, &c};
    tu_eval(n, 3, rev, out);
    cr_assert_eq(out[0].dims[0], 0);
    release_all(out, 1);
    kf_tensor wrong = tu_i64(0, &one, &s);
    const kf_tensor *mixed[3] = {&a, &wrong, &c};
    expect_fail(n, 3, mixed, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    kf_tensor_release(&c);
    kf_tensor_release(&wrong);
}

Test(shape_eyelike, diagonals_and_dtype) {
    int64_t dims[2] = {4, 6};
    kf_tensor x = rnd(KF_DT_INT32, 2, dims);
    const kf_tensor *in[1] = {&x};
    for (int64_t k = -5; k <= 7; k++) {
        kf_node *n = tu_node("EyeLike", 1, 1, 9);
        tu_attr_i(n, "k", k);
        if (k & 1) tu_attr_i(n, "dtype", KF_DT_DOUBLE);
        kf_tensor out[1] = {{0}};
        tu_eval(n, 1, in, out);
        cr_assert_eq(out[0].dtype, (k & 1) ? KF_DT_DOUBLE : KF_DT_INT32);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++)
                cr_assert_eq(kf_get_f64(&out[0], i * 6 + j), j - i == k ? 1.0 : 0.0, "k=%lld (%lld,%lld)",
                             (long long)k, (long long)i, (long long)j);
        release_all(out, 1);
        tu_node_free(n);
    }
    kf_node *n = tu_node("EyeLike", 1, 1, 9);
    tu_attr_i(n, "dtype", KF_DT_STRING);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    int64_t d3[3] = {2, 2, 2};
    kf_tensor y = rnd(KF_DT_FLOAT, 3, d3);
    const kf_tensor *in3[1] = {&y};
    n = tu_node("EyeLike", 1, 1, 9);
    expect_fail(n, 1, in3, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&y);
}

/* ---- Trilu ------------------------------------------------------------------------------------ */

Test(shape_trilu, upper_and_lower_with_k) {
    int64_t dims[3] = {2, 4, 5}, one = 1;
    for (int k = 0; k < NDTYPES; k++) {
        kf_dtype dt = all_dtypes[k];
        kf_tensor x = rnd(dt, 3, dims);
        int64_t kk = (int64_t)tu_uniform(-5, 6);
        kf_tensor tk = tu_i64(0, &one, &kk);
        const kf_tensor *in[2] = {&x, &tk};
        int upper = k & 1;
        kf_node *n = tu_node("Trilu", 2, 1, 14);
        tu_attr_i(n, "upper", upper);
        kf_tensor out[1] = {{0}};
        tu_eval(n, 2, in, out);
        kf_tensor want = alloc_t(dt, 3, dims);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t idx[3];
            unravel(3, dims, e, idx);
            int64_t diff = idx[2] - idx[1];
            if (upper ? diff >= kk : diff <= kk) put(&want, e, &x, e);
        }
        fill_empty_strings(&want);
        assert_same(&out[0], &want, kf_dtype_name(dt));
        kf_tensor_release(&want);
        release_all(out, 1);
        kf_tensor_release(&x);
        kf_tensor_release(&tk);
        tu_node_free(n);
    }
    int64_t d1[1] = {4};
    kf_tensor v = rnd(KF_DT_FLOAT, 1, d1);
    const kf_tensor *in[1] = {&v};
    kf_node *n = tu_node("Trilu", 1, 1, 14);
    expect_fail(n, 1, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&v);
}

/* ---- SpaceToDepth / DepthToSpace ----------------------------------------------------------------- */

Test(shape_depthtospace, dcr_crd_and_inverse) {
    int64_t bs = 2, xd[4] = {2, 8, 3, 2};
    for (int k = 0; k < NDTYPES; k += 3) {
        kf_dtype dt = all_dtypes[k];
        kf_tensor x = rnd(dt, 4, xd);
        const kf_tensor *in[1] = {&x};
        for (int crd = 0; crd < 2; crd++) {
            kf_node *n = tu_node("DepthToSpace", 1, 1, 13);
            tu_attr_i(n, "blocksize", bs);
            tu_attr_s(n, "mode", crd ? "CRD" : "DCR");
            kf_tensor out[1] = {{0}};
            tu_eval(n, 1, in, out);
            int64_t od[4] = {2, 2, 6, 4};
            kf_tensor want = alloc_t(dt, 4, od);
            for (int64_t e = 0; e < want.numel; e++) {
                int64_t o[4];
                unravel(4, od, e, o);
                int64_t by = o[2] % bs, bx = o[3] % bs;
                int64_t c = crd ? o[1] * bs * bs + by * bs + bx : (by * bs + bx) * od[1] + o[1];
                int64_t ii[4] = {o[0], c, o[2] / bs, o[3] / bs};
                put(&want, e, &x, ravel(4, xd, ii));
            }
            fill_empty_strings(&want);
            assert_same(&out[0], &want, crd ? "CRD" : "DCR");
            if (!crd) { /* SpaceToDepth undoes DCR */
                kf_node *m = tu_node("SpaceToDepth", 1, 1, 13);
                tu_attr_i(m, "blocksize", bs);
                kf_tensor back[1] = {{0}};
                const kf_tensor *bin[1] = {&out[0]};
                tu_eval(m, 1, bin, back);
                assert_same(&back[0], &x, "SpaceToDepth(DepthToSpace(x))");
                release_all(back, 1);
                tu_node_free(m);
            }
            kf_tensor_release(&want);
            release_all(out, 1);
            tu_node_free(n);
        }
        kf_tensor_release(&x);
    }
}

/* Opset 28 gives SpaceToDepth a mode: CRD puts block (by, bx) of channel
 * c at c*b*b + by*b + bx; each mode is undone by DepthToSpace of the same
 * mode. Before 28 the attribute is not read (DCR). */
Test(shape_spacetodepth, crd_mode_from_opset_28) {
    int64_t bs = 2, xd[4] = {2, 3, 4, 6};
    kf_tensor x = rnd(KF_DT_FLOAT, 4, xd);
    const kf_tensor *in[1] = {&x};
    for (int crd = 0; crd < 2; crd++) {
        kf_node *n = tu_node("SpaceToDepth", 1, 1, 28);
        tu_attr_i(n, "blocksize", bs);
        tu_attr_s(n, "mode", crd ? "CRD" : "DCR");
        kf_tensor out[1] = {{0}};
        tu_eval(n, 1, in, out);
        int64_t od[4] = {2, 12, 2, 3};
        kf_tensor want = alloc_t(x.dtype, 4, od);
        for (int64_t e = 0; e < want.numel; e++) {
            int64_t o[4];
            unravel(4, od, e, o);
            int64_t c = crd ? o[1] / (bs * bs) : o[1] % 3, blk = crd ? o[1] % (bs * bs) : o[1] / 3;
            int64_t ii[4] = {o[0], c, o[2] * bs + blk / bs, o[3] * bs + blk % bs};
            put(&want, e, &x, ravel(4, xd, ii));
        }
        assert_same(&out[0], &want, crd ? "SpaceToDepth CRD" : "SpaceToDepth DCR");
        kf_node *m = tu_node("DepthToSpace", 1, 1, 13);
        tu_attr_i(m, "blocksize", bs);
        tu_attr_s(m, "mode", crd ? "CRD" : "DCR");
        kf_tensor back[1] = {{0}};
        const kf_tensor *bin[1] = {&out[0]};
        tu_eval(m, 1, bin, back);
        assert_same(&back[0], &x, "DepthToSpace(SpaceToDepth(x))");
        release_all(back, 1);
        tu_node_free(m);
        if (crd) { /* at opset 13 the mode is not an attribute of SpaceToDepth */
            kf_node *o13 = tu_node("SpaceToDepth", 1, 1, 13);
            tu_attr_i(o13, "blocksize", bs);
            tu_attr_s(o13, "mode", "CRD");
            kf_tensor o2[1] = {{0}};
            tu_eval(o13, 1, in, o2);
            cr_assert(!kf_tensor_equal(&o2[0], &want), "opset 13 read the mode");
            release_all(o2, 1);
            tu_node_free(o13);
        }
        kf_tensor_release(&want);
        release_all(out, 1);
        tu_node_free(n);
    }
    kf_node *bad = tu_node("SpaceToDepth", 1, 1, 28);
    tu_attr_i(bad, "blocksize", bs);
    tu_attr_s(bad, "mode", "XYZ");
    expect_fail(bad, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(bad);
    kf_tensor_release(&x);
}

Test(shape_spacetodepth, index_math_and_errors) {
    int64_t bs = 3, xd[4] = {1, 2, 6, 3};
    kf_tensor x = rnd(KF_DT_FLOAT16, 4, xd), out[1] = {{0}};
    const kf_tensor *in[1] = {&x};
    kf_node *n = tu_node("SpaceToDepth", 1, 1, 13);
    tu_attr_i(n, "blocksize", bs);
    tu_eval(n, 1, in, out);
    int64_t od[4] = {1, 18, 2, 1};
    kf_tensor want = alloc_t(x.dtype, 4, od);
    for (int64_t e = 0; e < want.numel; e++) {
        int64_t o[4];
        unravel(4, od, e, o);
        int64_t c = o[1] % 2, blk = o[1] / 2, by = blk / bs, bx = blk % bs;
        int64_t ii[4] = {o[0], c, o[2] * bs + by, o[3] * bs + bx};
        put(&want, e, &x, ravel(4, xd, ii));
    }
    assert_same(&out[0], &want, "SpaceToDepth");
    release_all(out, 1);
    kf_tensor_release(&want);
    tu_node_free(n);
    n = tu_node("SpaceToDepth", 1, 1, 13);
    tu_attr_i(n, "blocksize", 4);
    expect_fail(n, 1, in, KF_ERR_SHAPE);
    tu_node_free(n);
    n = tu_node("DepthToSpace", 1, 1, 13);
    tu_attr_i(n, "blocksize", 2);
    tu_attr_s(n, "mode", "XYZ");
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = tu_node("DepthToSpace", 1, 1, 13);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* blocksize missing */
    tu_node_free(n);
    kf_tensor_release(&x);
}

/* ---- Pad / CenterCropPad -------------------------------------------------------------------------- */

/* numpy.pad index for one dim after cropping negative pads; -1 = constant.
 * Reflect walks from the edge, turning round at either end. */
static int64_t ref_pad_index(int64_t o, int64_t dim, int64_t b, int64_t e, const char *mode) {
    int64_t lo = b < 0 ? -b : 0, hi = dim - (e < 0 ? -e : 0), m = hi - lo;
    int64_t j = o - (b > 0 ? b : 0);
    if (j >= 0 && j < m) return lo + j;
    if (!strcmp(mode, "constant")) return -1;
    if (!strcmp(mode, "edge")) return j < 0 ? lo : hi - 1;
    if (!strcmp(mode, "wrap")) {
        while (j < 0) j += m;
        return lo + j % m;
    }
    if (m == 1) return lo;
    int64_t pos = j < 0 ? 0 : m - 1, dir = j < 0 ? 1 : -1;
    int64_t steps = j < 0 ? -j : j - (m - 1);
    for (int64_t k = 0; k < steps; k++) {
        if (pos + dir < 0 || pos + dir >= m) dir = -dir;
        pos += dir;
    }
    return lo + pos;
}

static void check_pad(kf_dtype dt, const char *mode, int64_t opset, int rank, const int64_t *dims,
                      const int64_t *pads, const int64_t *axes, int naxes) {
    kf_tensor x = rnd(dt, rank, dims), out[1] = {{0}};
    int64_t one = 1;
    kf_tensor cv = rnd(dt, 0, &one);
    kf_tensor tp = i64v(2 * naxes, pads), ta = axes ? i64v(naxes, axes) : (kf_tensor){0};
    const kf_tensor *in[4] = {&x, &tp, &cv, axes ? &ta : NULL};
    int nin = axes ? 4 : 3;
    kf_node *n = tu_node("Pad", nin, 1, opset);
    tu_attr_s(n, "mode", mode);
    tu_eval(n, nin, in, out);
    int64_t b[KF_MAX_RANK] = {0}, e[KF_MAX_RANK] = {0}, od[KF_MAX_RANK];
    for (int k = 0; k < naxes; k++) {
        int a = (int)(axes ? (axes[k] < 0 ? axes[k] + rank : axes[k]) : k);
        b[a] = pads[k];
        e[a] = pads[naxes + k];
    }
    for (int d = 0; d < rank; d++) od[d] = dims[d] + b[d] + e[d];
    kf_tensor want = alloc_t(dt, rank, od);
    for (int64_t q = 0; q < want.numel; q++) {
        int64_t idx[KF_MAX_RANK];
        unravel(rank, od, q, idx);
        bool constant = false;
        for (int d = 0; d < rank; d++) {
            idx[d] = ref_pad_index(idx[d], dims[d], b[d], e[d], mode);
            constant |= idx[d] < 0;
        }
        if (constant) put(&want, q, &cv, 0);
        else put(&want, q, &x, ravel(rank, dims, idx));
    }
    fill_empty_strings(&want);
    char what[64];
    snprintf(what, sizeof what, "Pad %s %s", mode, kf_dtype_name(dt));
    assert_same(&out[0], &want, what);
    kf_tensor_release(&want);
    release_all(out, 1);
    kf_tensor_release(&x);
    kf_tensor_release(&cv);
    kf_tensor_release(&tp);
    kf_tensor_release(&ta);
    tu_node_free(n);
}

Test(shape_pad, all_modes_random_pads) {
    static const char *modes[4] = {"constant", "reflect", "edge", "wrap"};
    int64_t dims[3] = {3, 4, 5};
    for (int trial = 0; trial < 80; trial++) {
        const char *mode = modes[trial % 4];
        int64_t pads[6];
        for (int k = 0; k < 6; k++) pads[k] = (int64_t)floor(tu_uniform(-1, 7)); /* keeps >= 1 */
        check_pad(all_dtypes[trial % NDTYPES], mode, 19, 3, dims, pads, NULL, 3);
    }
    /* axes input (opset 18), negative axis */
    int64_t ax[2] = {-1, 0}, pads[4] = {2, 1, 0, 3};
    check_pad(KF_DT_STRING, "constant", 18, 3, dims, pads, ax, 2);
    check_pad(KF_DT_BOOL, "edge", 18, 3, dims, pads, ax, 2);
}

Test(shape_pad, old_opsets_and_errors) {
    int64_t dims[2] = {2, 3};
    kf_tensor x = rnd(KF_DT_DOUBLE, 2, dims), out[1] = {{0}};
    const kf_tensor *in1[1] = {&x};
    kf_node *n = tu_node("Pad", 1, 1, 2);
    int64_t pads[4] = {1, 0, 0, 2};
    float value = (float)tu_uniform(1, 9);
    tu_attr_ints(n, "pads", 4, pads);
    tu_attr_f(n, "value", value);
    tu_eval(n, 1, in1, out);
    cr_assert_eq(out[0].dims[0], 3);
    cr_assert_eq(out[0].dims[1], 5);
    for (int64_t q = 0; q < 15; q++) {
        int64_t r = q / 5, c = q % 5;
        double want = r == 0 || c >= 3 ? value : ((double *)x.data)[(r - 1) * 3 + c];
        cr_assert_eq(((double *)out[0].data)[q], want, "element %lld", (long long)q);
    }
    release_all(out, 1);
    tu_node_free(n);
    /* wrap before opset 19 */
    kf_tensor tp = i64v(4, pads);
    const kf_tensor *in2[2] = {&x, &tp};
    n = tu_node("Pad", 2, 1, 18);
    tu_attr_s(n, "mode", "wrap");
    expect_fail(n, 2, in2, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    /* reflect from an axis cropped to nothing */
    int64_t crop[4] = {0, -3, 0, 1};
    kf_tensor tc = i64v(4, crop);
    const kf_tensor *in3[2] = {&x, &tc};
    n = tu_node("Pad", 2, 1, 13);
    tu_attr_s(n, "mode", "reflect");
    expect_fail(n, 2, in3, KF_ERR_SHAPE);
    tu_node_free(n);
    /* wrong pads length; too much cropping */
    int64_t three[3] = {1, 1, 1}, over[4] = {-2, 0, -1, 0};
    kf_tensor t3 = i64v(3, three), to = i64v(4, over);
    const kf_tensor *in4[2] = {&x, &t3}, *in5[2] = {&x, &to};
    n = tu_node("Pad", 2, 1, 13);
    expect_fail(n, 2, in4, KF_ERR_BAD_MODEL);
    expect_fail(n, 2, in5, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&tp);
    kf_tensor_release(&tc);
    kf_tensor_release(&t3);
    kf_tensor_release(&to);
}

Test(shape_centercroppad, crops_and_pads_around_the_centre) {
    int64_t dims[3] = {5, 4, 3};
    kf_tensor x = rnd(KF_DT_INT8, 3, dims), out[1] = {{0}};
    int64_t target[2] = {2, 7};
    kf_tensor ts = i64v(2, target);
    const kf_tensor *in[2] = {&x, &ts};
    kf_node *n = tu_node("CenterCropPad", 2, 1, 18);
    int64_t axes[2] = {0, -1};
    tu_attr_ints(n, "axes", 2, axes);
    tu_eval(n, 2, in, out);
    int64_t od[3] = {2, 4, 7};
    kf_tensor want = alloc_t(x.dtype, 3, od);
    /* axis 0: 5 -> 2 crops 1 at the start; axis 2: 3 -> 7 pads 2 at the start */
    for (int64_t q = 0; q < want.numel; q++) {
        int64_t idx[3];
        unravel(3, od, q, idx);
        idx[0] += 1;
        idx[2] -= 2;
        if (idx[2] >= 0 && idx[2] < 3) put(&want, q, &x, ravel(3, dims, idx));
    }
    assert_same(&out[0], &want, "CenterCropPad");
    kf_tensor_release(&want);
    release_all(out, 1);
    int64_t wrong[1] = {3};
    kf_tensor tw = i64v(1, wrong);
    const kf_tensor *in2[2] = {&x, &tw};
    expect_fail(n, 2, in2, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&ts);
    kf_tensor_release(&tw);
}

/* ---- shape functions on partial knowledge ---------------------------------------------------------- */

Test(shape_inference, unknown_inputs_give_unknown_outputs) {
    static const char *ops[] = {"Identity", "Dropout", "Transpose", "Reshape", "Flatten",
                                "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
                                "Expand", "Tile", "Shape", "Size", "ConstantOfShape",
                                "Range", "EyeLike", "Trilu", "SpaceToDepth", "DepthToSpace",
                                "Pad", "CenterCropPad"};
    kf_type unk[5], out[3];
    const kf_type *in[5];
    for (int i = 0; i < 5; i++) {
        kf_type_unknown(&unk[i]);
        in[i] = &unk[i];
    }
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        const kf_op_info *info = kf_op_get(kf_op_lookup("", ops[k]));
        cr_assert(info, "%s is in the op table", ops[k]);
        int nin = info->in_max < 0 ? 2 : info->in_max, nout = info->out_max < 0 ? 2 : info->out_max;
        kf_node *n = tu_node(ops[k], nin, nout, 18);
        if (!strcmp(ops[k], "Concat")) tu_attr_i(n, "axis", 0);
        if (strstr(ops[k], "To")) tu_attr_i(n, "blocksize", 2);
        kf_status st = shape_of(n, nin, in, NULL, nout, out);
        cr_assert_eq(st, KF_OK, "%s: %s", ops[k], kf_last_error());
        for (int j = 0; j < nout; j++)
            cr_assert(!kf_type_is_static(&out[j]) || !strcmp(ops[k], "Size"), "%s output %d static", ops[k], j);
        tu_node_free(n);
    }
}

Test(shape_inference, values_make_shapes_static) {
    int64_t one = 1, three = 3, two = 2;
    kf_type i64_3 = sym_type(KF_DT_INT64, 1, &three, NULL), i64_2 = sym_type(KF_DT_INT64, 1, &two, NULL),
            scal = sym_type(KF_DT_INT64, 0, NULL, NULL), out[2];
    /* ConstantOfShape and Range */
    int64_t shv[3] = {2, 0, 4};
    kf_tensor sh = i64v(3, shv);
    const kf_type *in1[1] = {&i64_3};
    const kf_tensor *v1[1] = {&sh};
    kf_node *n = tu_node("ConstantOfShape", 1, 1, 20);
    cr_assert_eq(shape_of(n, 1, in1, v1, 1, out), KF_OK);
    cr_assert(kf_type_is_static(&out[0]));
    cr_assert_eq(out[0].dims[2], 4);
    tu_node_free(n);
    int64_t a = 10, b = -3, c = -4;
    kf_tensor ta = tu_i64(0, &one, &a), tb = tu_i64(0, &one, &b), tc = tu_i64(0, &one, &c);
    const kf_type *in3[3] = {&scal, &scal, &scal};
    const kf_tensor *v3[3] = {&ta, &tb, &tc};
    n = tu_node("Range", 3, 1, 11);
    cr_assert_eq(shape_of(n, 3, in3, v3, 1, out), KF_OK);
    cr_assert_eq(out[0].dims[0], 4); /* 10, 6, 2, -2 */
    tu_node_free(n);
    /* Pad keeps the symbol of an unpadded dim and sizes the padded one */
    int64_t xd[2] = {-1, 5};
    uint32_t xs[2] = {11, 0};
    kf_type x = sym_type(KF_DT_FLOAT, 2, xd, xs);
    int64_t pv[4] = {0, 2, 0, -1};
    kf_tensor pads = i64v(4, pv);
    int64_t four = 4;
    kf_type i64_4 = sym_type(KF_DT_INT64, 1, &four, NULL);
    const kf_type *pin[2] = {&x, &i64_4};
    const kf_tensor *pval[2] = {NULL, &pads};
    n = tu_node("Pad", 2, 1, 13);
    cr_assert_eq(shape_of(n, 2, pin, pval, 1, out), KF_OK);
    cr_assert_eq(out[0].syms[0], 11);
    cr_assert_eq(out[0].dims[1], 6);
    tu_node_free(n);
    /* Split by num_outputs keeps the other dims' symbols */
    n = tu_node("Split", 1, 2, 18);
    tu_attr_i(n, "axis", 1);
    tu_attr_i(n, "num_outputs", 2);
    const kf_type *sin[1] = {&x};
    cr_assert_eq(shape_of(n, 1, sin, NULL, 2, out), KF_OK);
    cr_assert_eq(out[0].dims[1], 3);
    cr_assert_eq(out[1].dims[1], 2);
    cr_assert_eq(out[1].syms[0], 11);
    tu_node_free(n);
    /* Squeeze with unknown axes: only the rank is known */
    int64_t sq[3] = {1, -1, 1};
    kf_type y = sym_type(KF_DT_FLOAT, 3, sq, NULL);
    const kf_type *qin[2] = {&y, &i64_2};
    n = tu_node("Squeeze", 2, 1, 13);
    cr_assert_eq(shape_of(n, 2, qin, NULL, 1, out), KF_OK);
    cr_assert_eq(out[0].rank, 1);
    tu_node_free(n);
    /* Flatten keeps a lone symbolic dim */
    n = tu_node("Flatten", 1, 1, 13);
    cr_assert_eq(shape_of(n, 1, sin, NULL, 1, out), KF_OK);
    cr_assert_eq(out[0].syms[0], 11);
    cr_assert_eq(out[0].dims[1], 5);
    tu_node_free(n);
    kf_tensor_release(&sh);
    kf_tensor_release(&ta);
    kf_tensor_release(&tb);
    kf_tensor_release(&tc);
    kf_tensor_release(&pads);
}

/* ---- hostile parameters ------------------------------------------------------------------------------ */

/* Random, often invalid, integer parameters: each op either succeeds or
 * fails with a message naming the node; it never crashes (the sanitizer
 * build checks the memory side). */
static int64_t wild(void) {
    static const int64_t edge[] = {0, 1, -1, 2, -2, 3, 5, INT64_MAX, INT64_MIN, INT64_MAX / 2, -7, 6};
    return tu_uniform(0, 1) < 0.5 ? edge[(int)tu_uniform(0, 12)] : (int64_t)tu_uniform(-6, 7);
}

Test(shape_robustness, wild_parameters_fail_cleanly) {
    static const char *ops[] = {"Reshape", "Squeeze", "Unsqueeze", "Split", "Slice", "Expand",
                                "Tile", "ConstantOfShape", "Pad", "CenterCropPad", "Transpose",
                                "Flatten", "Concat", "Trilu", "SpaceToDepth", "DepthToSpace", "Range"};
    int64_t dims[3] = {2, 3, 4};
    kf_tensor x = rnd(KF_DT_STRING, 3, dims);
    for (int trial = 0; trial < 3000; trial++) {
        const char *op = ops[trial % (int)(sizeof ops / sizeof ops[0])];
        int nvals = 1 + (int)tu_uniform(0, 6);
        int64_t v[8];
        for (int k = 0; k < nvals; k++) v[k] = wild();
        kf_tensor p[4];
        for (int k = 0; k < 4; k++) p[k] = i64v(nvals, v);
        int64_t one = 1;
        kf_tensor sc[3] = {tu_i64(0, &one, &v[0]), tu_i64(0, &one, &v[nvals - 1]), tu_i64(0, &one, &v[nvals / 2])};
        int nin = !strcmp(op, "Slice") ? 5 : !strcmp(op, "Pad") ? 2 : !strcmp(op, "Range") ? 3 : 2;
        static const int64_t opsets[4] = {4, 11, 13, 18};
        kf_node *n = tu_node(op, nin, 2, opsets[(trial / 17) % 4]);
        const kf_tensor *in[5] = {&x, &p[0], &p[1], &p[2], &p[3]};
        if (!strcmp(op, "Range")) in[0] = &sc[0], in[1] = &sc[1], in[2] = &sc[2];
        if (!strcmp(op, "Trilu")) in[1] = &sc[0];
        if (!strcmp(op, "ConstantOfShape")) in[0] = &p[0], nin = 1;
        if (!strcmp(op, "Split")) tu_attr_ints(n, "split", nvals, v);
        else if (!strcmp(op, "Transpose")) tu_attr_ints(n, "perm", nvals, v);
        else tu_attr_ints(n, "axes", nvals, v);
        tu_attr_i(n, "axis", v[0]);
        tu_attr_i(n, "blocksize", v[nvals - 1]);
        tu_attr_ints(n, "pads", nvals, v);
        tu_attr_ints(n, "shape", nvals, v);
        if (strcmp(op, "Split") != 0) n->nout = 1;
        kf_tensor out[2] = {{0}};
        kf_status st = kf_eval_node(n, nin, in, out);
        if (st == KF_OK) {
            for (int j = 0; j < n->nout; j++) {
                int64_t cnt = 1;
                for (int d = 0; d < out[j].rank; d++) cnt *= out[j].dims[d];
                cr_assert_eq(cnt, out[j].numel, "%s: output %d dims disagree with numel", op, j);
            }
        } else {
            cr_assert(strstr(kf_last_error(), op) != NULL, "%s: message names the node: %s", op, kf_last_error());
        }
        release_all(out, 2);
        release_all(p, 4);
        release_all(sc, 3);
        tu_node_free(n);
    }
    kf_tensor_release(&x);
}
