/* test_ops_reduce.c: reductions, ArgMax/ArgMin, softmax family, CumSum, TopK,
 * normalisations and losses against straightforward computations written
 * here, plus the errors for bad attributes, shapes and indices. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "test_util.h"

/* ---- helpers ------------------------------------------------------------- */

static const kf_tensor *const *ins(const kf_tensor **a) { return a; }

static void expect_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, const char *what) {
    char why[256];
    cr_assert(tu_close(got, want, atol, rtol, why, sizeof why), "%s: %s", what, why);
}

/* Evaluation must fail with code and name the node. */
static void expect_fail(kf_node *n, int nin, const kf_tensor **in, kf_status code) {
    kf_tensor out[5] = {0};
    kf_status st = kf_eval_node(n, nin, ins(in), out);
    cr_assert_eq(st, code, "%s: status %d, expected %d (%s)", n->op_type, st, code, kf_last_error());
    cr_assert(strstr(kf_last_error(), n->name) != NULL, "message names the node: %s", kf_last_error());
    for (int j = 0; j < 5; j++) kf_tensor_release(&out[j]);
}

static void release(kf_tensor *t, int count) {
    for (int i = 0; i < count; i++) kf_tensor_release(&t[i]);
}

/* A double tensor of the given shape filled with vals (or zeros). */
static kf_tensor dbl(int rank, const int64_t *dims) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_DOUBLE, rank, dims), KF_OK);
    return t;
}

/* Linear index of input element `lin` in the keepdims-shaped output that
 * zeroes the reduced coordinates. */
static int64_t out_index(int rank, const int64_t *dims, const bool *mask, int64_t lin) {
    int64_t idx[KF_MAX_RANK], o = 0;
    kf_unravel(rank, dims, lin, idx);
    for (int d = 0; d < rank; d++) o = o * (mask[d] ? 1 : dims[d]) + (mask[d] ? 0 : idx[d]);
    return o;
}

/* ---- Reduce* ------------------------------------------------------------- */

static const char *const reduce_ops[10] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                           "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                                           "ReduceSumSquare"};

/* Straightforward reduction of x over mask into a double tensor of dims
 * (keepdims shape), one accumulator per output element. */
static kf_tensor naive_reduce(const char *op, const kf_tensor *x, const bool *mask, int rank, const int64_t *odims) {
    kf_tensor r = dbl(rank, odims);
    double *acc = r.data;
    int64_t *cnt = calloc((size_t)r.numel + 1, sizeof *cnt);
    bool prod = !strcmp(op, "ReduceProd"), max = !strcmp(op, "ReduceMax"), min = !strcmp(op, "ReduceMin");
    for (int64_t o = 0; o < r.numel; o++) acc[o] = prod ? 1 : max ? -INFINITY : min ? INFINITY : 0;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t o = out_index(x->rank, x->dims, mask, i);
        double v = kf_get_f64(x, i);
        cnt[o]++;
        if (prod) acc[o] *= v;
        else if (max) acc[o] = fmax(acc[o], v);
        else if (min) acc[o] = fmin(acc[o], v);
        else if (!strcmp(op, "ReduceL1")) acc[o] += fabs(v);
        else if (!strcmp(op, "ReduceL2") || !strcmp(op, "ReduceSumSquare")) acc[o] += v * v;
        else if (!strcmp(op, "ReduceLogSumExp")) acc[o] += exp(v);
        else acc[o] += v;
    }
    for (int64_t o = 0; o < r.numel; o++) {
        if (!strcmp(op, "ReduceMean")) acc[o] /= (double)cnt[o];
        if (!strcmp(op, "ReduceL2")) acc[o] = sqrt(acc[o]);
        if (!strcmp(op, "ReduceLogSum") || !strcmp(op, "ReduceLogSumExp")) acc[o] = log(acc[o]);
    }
    free(cnt);
    return r;
}

/* Copies want's values into a tensor of dtype dt and shape (rank, dims). */
static kf_tensor as(const kf_tensor *want, kf_dtype dt, int rank, const int64_t *dims) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, dt, rank, dims), KF_OK);
    for (int64_t i = 0; i < t.numel; i++) kf_set_f64(&t, i, kf_get_f64(want, i));
    return t;
}

Test(red_reduce, every_op_with_axes_attribute_and_input) {
    int64_t dims[3] = {3, 4, 5};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, 0.1, 2.0); /* positive so LogSum is defined */
    bool mask[3] = {true, false, true};
    int64_t kdims[3] = {1, 4, 1}, ndims[1] = {4};
    for (int k = 0; k < 10; k++) {
        const char *op = reduce_ops[k];
        kf_tensor want = naive_reduce(op, &x, mask, 3, kdims);
        /* old form: axes attribute, keepdims = 1 */
        kf_node *n = tu_node(op, 1, 1, 11);
        int64_t axes[2] = {0, -1};
        tu_attr_ints(n, "axes", 2, axes);
        const kf_tensor *in[1] = {&x};
        kf_tensor out[1] = {0};
        tu_eval(n, 1, in, out);
        kf_tensor w = as(&want, KF_DT_FLOAT, 3, kdims);
        expect_close(&out[0], &w, 1e-6, 1e-5, op);
        tu_node_free(n);
        release(out, 1);
        kf_tensor_release(&w);
        /* new form: axes input, keepdims = 0 */
        n = tu_node(op, 2, 1, 18);
        tu_attr_i(n, "keepdims", 0);
        int64_t adims[1] = {2};
        kf_tensor at = tu_i64(1, adims, (int64_t[]){2, 0});
        const kf_tensor *in2[2] = {&x, &at};
        tu_eval(n, 2, in2, out);
        w = as(&want, KF_DT_FLOAT, 1, ndims);
        expect_close(&out[0], &w, 1e-6, 1e-5, op);
        tu_node_free(n);
        release(out, 1);
        kf_tensor_release(&w);
        kf_tensor_release(&at);
        kf_tensor_release(&want);
    }
    kf_tensor_release(&x);
}

Test(red_reduce, reduce_sum_takes_axes_input_from_opset_13) {
    int64_t dims[2] = {4, 6};
    kf_tensor x = tu_rand(KF_DT_DOUBLE, 2, dims, -3, 3);
    bool mask[2] = {false, true};
    int64_t kd[2] = {4, 1};
    kf_tensor want = naive_reduce("ReduceSum", &x, mask, 2, kd);
    kf_node *n = tu_node("ReduceSum", 2, 1, 13);
    int64_t one[1] = {1};
    kf_tensor at = tu_i64(1, one, (int64_t[]){1});
    const kf_tensor *in[2] = {&x, &at};
    kf_tensor out[1] = {0};
    tu_eval(n, 2, in, out);
    expect_close(&out[0], &want, 1e-12, 1e-12, "ReduceSum-13");
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&at);
    kf_tensor_release(&want);
    kf_tensor_release(&x);
}

Test(red_reduce, absent_axes_reduce_everything_unless_noop) {
    int64_t dims[3] = {2, 3, 2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -2, 2);
    bool all[3] = {true, true, true};
    int64_t ones[3] = {1, 1, 1};
    kf_tensor want = naive_reduce("ReduceSumSquare", &x, all, 3, ones);
    kf_tensor w = as(&want, KF_DT_FLOAT, 3, ones);
    const kf_tensor *in[2] = {&x, NULL};
    kf_tensor out[1] = {0};
    kf_node *n = tu_node("ReduceSumSquare", 1, 1, 18);
    tu_eval(n, 1, in, out);
    expect_close(&out[0], &w, 1e-6, 1e-5, "all axes");
    tu_node_free(n);
    /* noop_with_empty_axes and an empty axes input: a plain Square */
    n = tu_node("ReduceSumSquare", 2, 1, 18);
    tu_attr_i(n, "noop_with_empty_axes", 1);
    int64_t zero[1] = {0};
    kf_tensor empty = tu_i64(1, zero, (int64_t[]){0});
    in[1] = &empty;
    tu_eval(n, 2, in, out);
    kf_tensor sq = tu_rand(KF_DT_FLOAT, 3, dims, 0, 1);
    for (int64_t i = 0; i < x.numel; i++) kf_set_f64(&sq, i, kf_get_f64(&x, i) * kf_get_f64(&x, i));
    expect_close(&out[0], &sq, 1e-6, 1e-5, "noop");
    tu_node_free(n);
    /* the same empty input without noop reduces everything */
    n = tu_node("ReduceSumSquare", 2, 1, 18);
    tu_eval(n, 2, in, out);
    expect_close(&out[0], &w, 1e-6, 1e-5, "empty axes");
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&sq);
    kf_tensor_release(&empty);
    kf_tensor_release(&w);
    kf_tensor_release(&want);
    kf_tensor_release(&x);
}

Test(red_reduce, integer_sums_products_and_extrema_are_exact) {
    int64_t dims[2] = {2, 3};
    int64_t big = ((int64_t)1 << 60) + (int64_t)tu_uniform(1, 1000);
    int64_t v[6] = {big, 3, -7, big + 1, 5, (int64_t)tu_uniform(-50, 50)};
    kf_tensor x = tu_i64(2, dims, v);
    const kf_tensor *in[1] = {&x};
    kf_tensor out[1] = {0};
    int64_t axes[1] = {1};

    kf_node *n = tu_node("ReduceSum", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, axes);
    tu_attr_i(n, "keepdims", 0);
    tu_eval(n, 1, in, out);
    cr_assert_eq(((int64_t *)out[0].data)[0], big - 4);
    cr_assert_eq(((int64_t *)out[0].data)[1], big + 6 + v[5]);
    tu_node_free(n);

    n = tu_node("ReduceMax", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, axes);
    tu_eval(n, 1, in, out);
    cr_assert_eq(((int64_t *)out[0].data)[0], big);
    cr_assert_eq(((int64_t *)out[0].data)[1], big + 1);
    tu_node_free(n);

    n = tu_node("ReduceProd", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, axes);
    tu_eval(n, 1, in, out);
    cr_assert_eq(((int64_t *)out[0].data)[0], (int64_t)((uint64_t)big * 3u * (uint64_t)-7));
    tu_node_free(n);

    n = tu_node("ReduceL1", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, axes);
    tu_eval(n, 1, in, out);
    cr_assert_eq(((int64_t *)out[0].data)[0], big + 10);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&x);

    /* uint64 above 2^63 compares unsigned */
    kf_tensor u = {0};
    int64_t d3[1] = {3};
    cr_assert_eq(kf_tensor_alloc(&u, KF_DT_UINT64, 1, d3), KF_OK);
    uint64_t *ud = u.data;
    ud[0] = 5;
    ud[1] = UINT64_MAX - (uint64_t)tu_uniform(0, 100);
    ud[2] = 7;
    in[0] = &u;
    n = tu_node("ReduceMax", 1, 1, 18);
    tu_attr_i(n, "keepdims", 0);
    tu_eval(n, 1, in, out);
    cr_assert_eq(((uint64_t *)out[0].data)[0], ud[1]);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&u);
}

Test(red_reduce, empty_sets_give_the_identity) {
    int64_t dims[3] = {2, 0, 3};
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 3, dims), KF_OK);
    kf_tensor xi = {0};
    cr_assert_eq(kf_tensor_alloc(&xi, KF_DT_INT32, 3, dims), KF_OK);
    struct {
        const char *op;
        double f;
        double i;
    } cases[] = {{"ReduceSum", 0, 0},           {"ReduceProd", 1, 1},
                 {"ReduceMax", -INFINITY, INT32_MIN}, {"ReduceMin", INFINITY, INT32_MAX},
                 {"ReduceLogSum", -INFINITY, INT32_MIN}, {"ReduceLogSumExp", -INFINITY, INT32_MIN},
                 {"ReduceL1", 0, 0},            {"ReduceSumSquare", 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kf_node *n = tu_node(cases[c].op, 1, 1, 11);
        int64_t axes[1] = {1};
        tu_attr_ints(n, "axes", 1, axes);
        const kf_tensor *in[1] = {&x};
        kf_tensor out[1] = {0};
        tu_eval(n, 1, in, out);
        cr_assert_eq(out[0].numel, 6);
        for (int64_t i = 0; i < 6; i++)
            cr_assert_eq(kf_get_f64(&out[0], i), cases[c].f, "%s float", cases[c].op);
        in[0] = &xi;
        tu_eval(n, 1, in, out);
        for (int64_t i = 0; i < 6; i++)
            cr_assert_eq(kf_get_f64(&out[0], i), cases[c].i, "%s int32", cases[c].op);
        tu_node_free(n);
        release(out, 1);
    }
    kf_tensor_release(&x);
    kf_tensor_release(&xi);
}

Test(red_reduce, bool_max_is_any_and_min_is_all) {
    int64_t dims[2] = {2, 2};
    kf_tensor b = tu_tensor(KF_DT_BOOL, 2, dims, (double[]){1, 0, 1, 1});
    const kf_tensor *in[1] = {&b};
    kf_tensor out[1] = {0};
    kf_node *n = tu_node("ReduceMin", 2, 1, 20);
    tu_attr_i(n, "keepdims", 0);
    int64_t one[1] = {1};
    kf_tensor ax = tu_i64(1, one, (int64_t[]){1});
    const kf_tensor *in2[2] = {&b, &ax};
    tu_eval(n, 2, in2, out);
    cr_assert_eq(out[0].dtype, KF_DT_BOOL);
    cr_assert_eq(kf_get_i64(&out[0], 0), 0);
    cr_assert_eq(kf_get_i64(&out[0], 1), 1);
    tu_node_free(n);
    n = tu_node("ReduceMax", 1, 1, 20);
    tu_eval(n, 1, in, out);
    cr_assert_eq(kf_get_i64(&out[0], 0), 1);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&ax);
    kf_tensor_release(&b);
}

Test(red_reduce, log_sum_exp_is_stable_and_float16_rounds_once) {
    int64_t dims[2] = {2, 3};
    double base = tu_uniform(900, 1000);
    kf_tensor x = tu_tensor(KF_DT_FLOAT, 2, dims, (double[]){base, base, base - 1, -base, -base, -base});
    kf_node *n = tu_node("ReduceLogSumExp", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, (int64_t[]){1});
    tu_attr_i(n, "keepdims", 0);
    const kf_tensor *in[1] = {&x};
    kf_tensor out[1] = {0};
    tu_eval(n, 1, in, out);
    cr_assert_float_eq(kf_get_f64(&out[0], 0), (float)base + log(2 + exp(-1.0)), 1e-3);
    cr_assert_float_eq(kf_get_f64(&out[0], 1), (float)-base + log(3.0), 1e-3);
    tu_node_free(n);
    release(out, 1);
    /* float16: accumulate in double, round once (2048 + 1 + 1 = 2050 is exact in half,
     * while rounding after each step would stay at 2048) */
    int64_t d3[1] = {3};
    kf_tensor h = tu_tensor(KF_DT_FLOAT16, 1, d3, (double[]){2048, 1, 1});
    in[0] = &h;
    n = tu_node("ReduceSum", 1, 1, 11);
    tu_eval(n, 1, in, out);
    cr_assert_eq(out[0].dtype, KF_DT_FLOAT16);
    cr_assert_eq(kf_get_f64(&out[0], 0), 2050.0);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&h);
    kf_tensor_release(&x);
}

Test(red_reduce, bad_axes_are_errors_naming_the_node) {
    int64_t dims[2] = {2, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    const kf_tensor *in[2] = {&x, NULL};
    kf_node *n = tu_node("ReduceMean", 1, 1, 11);
    tu_attr_ints(n, "axes", 2, (int64_t[]){1, -1});
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* duplicate */
    tu_node_free(n);
    n = tu_node("ReduceMean", 1, 1, 11);
    tu_attr_ints(n, "axes", 1, (int64_t[]){2});
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* out of range */
    tu_node_free(n);
    n = tu_node("ReduceMean", 1, 1, 18);
    tu_attr_ints(n, "axes", 1, (int64_t[]){0});
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* attribute where an input is due */
    tu_node_free(n);
    int64_t one[1] = {1};
    kf_tensor ax = tu_i64(1, one, (int64_t[]){0});
    in[1] = &ax;
    n = tu_node("ReduceMean", 2, 1, 17);
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL); /* input before opset 18 */
    tu_node_free(n);
    kf_tensor s = {0};
    cr_assert_eq(kf_tensor_alloc(&s, KF_DT_STRING, 2, dims), KF_OK);
    in[0] = &s;
    n = tu_node("ReduceMax", 1, 1, 20);
    expect_fail(n, 1, in, KF_ERR_SHAPE); /* dtype */
    tu_node_free(n);
    kf_tensor_release(&s);
    kf_tensor_release(&ax);
    kf_tensor_release(&x);
}

Test(red_reduce, shape_function_handles_unknown_axes_and_dims) {
    kf_node *n = tu_node("ReduceSum", 2, 1, 13);
    const kf_op_info *info = kf_op_get(n->op);
    kf_type x;
    kf_type_unknown(&x);
    x.dtype = KF_DT_FLOAT;
    x.rank = 3;
    x.dims[0] = -1;
    x.syms[0] = 7;
    x.dims[1] = 4;
    x.dims[2] = 5;
    kf_type ax;
    kf_type_unknown(&ax);
    ax.dtype = KF_DT_INT64;
    ax.rank = 1;
    ax.dims[0] = 1;
    const kf_type *in[2] = {&x, &ax};
    const kf_tensor *val[2] = {NULL, NULL};
    kf_type out[1];
    kf_type_unknown(&out[0]);
    cr_assert_eq(info->shape(n, 2, in, val, 1, out), KF_OK);
    cr_assert_eq(out[0].rank, 3); /* keepdims: rank known, dims not */
    int64_t one[1] = {1};
    kf_tensor axv = tu_i64(1, one, (int64_t[]){2});
    val[1] = &axv;
    kf_type_unknown(&out[0]);
    cr_assert_eq(info->shape(n, 2, in, val, 1, out), KF_OK);
    cr_assert_eq(out[0].rank, 3);
    cr_assert_eq(out[0].dims[0], -1);
    cr_assert_eq(out[0].syms[0], 7);
    cr_assert_eq(out[0].dims[1], 4);
    cr_assert_eq(out[0].dims[2], 1);
    kf_tensor_release(&axv);
    tu_node_free(n);
}

/* ---- ArgMax / ArgMin ----------------------------------------------------- */

Test(red_arg, argmax_argmin_with_ties_and_select_last_index) {
    int64_t dims[3] = {3, 5, 4};
    kf_tensor x = tu_rand(KF_DT_INT32, 3, dims, 0, 3); /* small range: many ties */
    for (int opi = 0; opi < 2; opi++)
        for (int last = 0; last < 2; last++)
            for (int keep = 0; keep < 2; keep++) {
                const char *op = opi ? "ArgMin" : "ArgMax";
                kf_node *n = tu_node(op, 1, 1, 13);
                tu_attr_i(n, "axis", -2);
                tu_attr_i(n, "keepdims", keep);
                tu_attr_i(n, "select_last_index", last);
                const kf_tensor *in[1] = {&x};
                kf_tensor out[1] = {0};
                tu_eval(n, 1, in, out);
                cr_assert_eq(out[0].rank, keep ? 3 : 2);
                cr_assert_eq(out[0].dims[keep ? 2 : 1], 4);
                for (int64_t a = 0; a < 3; a++)
                    for (int64_t c = 0; c < 4; c++) {
                        int64_t best = -1, bv = 0;
                        for (int64_t b = 0; b < 5; b++) {
                            int64_t v = kf_get_i64(&x, (a * 5 + b) * 4 + c);
                            bool better = best < 0 || (opi ? v < bv : v > bv) || (last && v == bv);
                            if (better) {
                                best = b;
                                bv = v;
                            }
                        }
                        cr_assert_eq(((int64_t *)out[0].data)[a * 4 + c], best, "%s last=%d", op, last);
                    }
                tu_node_free(n);
                release(out, 1);
            }
    kf_tensor_release(&x);
}

Test(red_arg, empty_axis_is_a_runtime_error) {
    int64_t dims[2] = {2, 0};
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 2, dims), KF_OK);
    kf_node *n = tu_node("ArgMax", 1, 1, 13);
    tu_attr_i(n, "axis", 1);
    const kf_tensor *in[1] = {&x};
    expect_fail(n, 1, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    n = tu_node("ArgMin", 1, 1, 13);
    tu_attr_i(n, "axis", 2);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&x);
}

/* ---- Softmax family ------------------------------------------------------ */

/* Softmax / LogSoftmax / Hardmax of x over rows [outer, len, inner]. */
static kf_tensor naive_softmax(const kf_tensor *x, int64_t outer, int64_t len, int64_t inner, int kind) {
    kf_tensor y = dbl(x->rank, x->dims);
    double *yd = y.data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double sum = 0, m = -INFINITY;
            int64_t arg = 0;
            for (int64_t k = 0; k < len; k++) {
                double v = kf_get_f64(x, (o * len + k) * inner + i);
                if (v > m) {
                    m = v;
                    arg = k;
                }
            }
            for (int64_t k = 0; k < len; k++) sum += exp(kf_get_f64(x, (o * len + k) * inner + i) - m);
            for (int64_t k = 0; k < len; k++) {
                int64_t p = (o * len + k) * inner + i;
                double e = exp(kf_get_f64(x, p) - m);
                yd[p] = kind == 0 ? e / sum : kind == 1 ? log(e / sum) : (k == arg);
            }
        }
    return y;
}

Test(red_softmax, one_axis_from_opset_13_and_coerced_before) {
    static const char *const ops[3] = {"Softmax", "LogSoftmax", "Hardmax"};
    int64_t dims[3] = {2, 3, 4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -30, 30);
    for (int k = 0; k < 3; k++) {
        const kf_tensor *in[1] = {&x};
        kf_tensor out[1] = {0};
        /* opset 13: along axis 1 only */
        kf_node *n = tu_node(ops[k], 1, 1, 13);
        tu_attr_i(n, "axis", 1);
        tu_eval(n, 1, in, out);
        kf_tensor want = naive_softmax(&x, 2, 3, 4, k);
        kf_tensor w = as(&want, KF_DT_FLOAT, 3, dims);
        expect_close(&out[0], &w, 1e-6, 1e-5, ops[k]);
        kf_tensor_release(&w);
        kf_tensor_release(&want);
        tu_node_free(n);
        /* opset 11: coerced to [2, 12] at axis 1 */
        n = tu_node(ops[k], 1, 1, 11);
        tu_eval(n, 1, in, out);
        want = naive_softmax(&x, 2, 12, 1, k);
        w = as(&want, KF_DT_FLOAT, 3, dims);
        expect_close(&out[0], &w, 1e-6, 1e-5, ops[k]);
        kf_tensor_release(&w);
        kf_tensor_release(&want);
        tu_node_free(n);
        /* opset 13 default axis -1 */
        n = tu_node(ops[k], 1, 1, 13);
        tu_eval(n, 1, in, out);
        want = naive_softmax(&x, 6, 4, 1, k);
        w = as(&want, KF_DT_FLOAT, 3, dims);
        expect_close(&out[0], &w, 1e-6, 1e-5, ops[k]);
        kf_tensor_release(&w);
        kf_tensor_release(&want);
        tu_node_free(n);
        release(out, 1);
    }
    kf_tensor_release(&x);
}

Test(red_softmax, hardmax_picks_the_first_of_tied_maxima) {
    int64_t dims[2] = {2, 4};
    double v = tu_uniform(1, 2);
    kf_tensor x = tu_tensor(KF_DT_FLOAT, 2, dims, (double[]){0, v, v, -1, 3 * v, 0, 3 * v, 3 * v});
    kf_node *n = tu_node("Hardmax", 1, 1, 13);
    const kf_tensor *in[1] = {&x};
    kf_tensor out[1] = {0};
    tu_eval(n, 1, in, out);
    double want[8] = {0, 1, 0, 0, 1, 0, 0, 0};
    for (int i = 0; i < 8; i++) cr_assert_eq(kf_get_f64(&out[0], i), want[i], "element %d", i);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&x);
}

/* One op of a composed Softmax, evaluated by the reference in x's type. */
static kf_tensor eval1(const char *op, int nin, const kf_tensor *a, const kf_tensor *b, int64_t axis) {
    kf_node *n = tu_node(op, nin, 1, 11);
    if (!strncmp(op, "Reduce", 6)) {
        tu_attr_ints(n, "axes", 1, &axis);
        tu_attr_i(n, "keepdims", 1);
    }
    const kf_tensor *in[2] = {a, b};
    kf_tensor out[1] = {0};
    tu_eval(n, nin, in, out);
    tu_node_free(n);
    return out[0];
}

/* A 16-bit Softmax is its ONNX function body run in that type, as the
 * ONNX reference and its test data compute it: it equals ReduceMax -> Sub
 * -> Exp -> ReduceSum -> Div evaluated op by op, bit for bit. */
Test(red_softmax, sixteen_bit_rounds_each_step_of_the_function_body) {
    int64_t dims[2] = {5, 37};
    const kf_dtype types[2] = {KF_DT_FLOAT16, KF_DT_BFLOAT16};
    for (int t = 0; t < 2; t++)
        for (int axis = 0; axis < 2; axis++) {
            kf_tensor x = tu_rand(types[t], 2, dims, -8, 8);
            kf_tensor mx = eval1("ReduceMax", 1, &x, NULL, axis);
            kf_tensor d = eval1("Sub", 2, &x, &mx, 0);
            kf_tensor e = eval1("Exp", 1, &d, NULL, 0);
            kf_tensor sum = eval1("ReduceSum", 1, &e, NULL, axis);
            kf_tensor want = eval1("Div", 2, &e, &sum, 0);
            kf_node *n = tu_node("Softmax", 1, 1, 13);
            tu_attr_i(n, "axis", axis);
            const kf_tensor *in[1] = {&x};
            kf_tensor out[1] = {0};
            tu_eval(n, 1, in, out);
            cr_assert_eq(out[0].dtype, types[t]);
            for (int64_t i = 0; i < x.numel; i++)
                cr_assert_eq(kf_get_f64(&out[0], i), kf_get_f64(&want, i),
                             "%s axis %d element %lld: %.9g, composed %.9g", kf_dtype_name(types[t]), axis,
                             (long long)i, kf_get_f64(&out[0], i), kf_get_f64(&want, i));
            tu_node_free(n);
            release(out, 1);
            kf_tensor all[6] = {x, mx, d, e, sum, want};
            release(all, 6);
        }
}

Test(red_softmax, bad_axis_and_dtype_are_errors) {
    int64_t dims[2] = {2, 4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    const kf_tensor *in[1] = {&x};
    kf_node *n = tu_node("Softmax", 1, 1, 13);
    tu_attr_i(n, "axis", 2);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = tu_node("LogSoftmax", 1, 1, 11);
    tu_attr_i(n, "axis", -3);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor xi = tu_rand(KF_DT_INT32, 2, dims, -5, 5);
    in[0] = &xi;
    n = tu_node("Softmax", 1, 1, 13);
    expect_fail(n, 1, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&xi);
    kf_tensor_release(&x);
}

/* ---- CumSum -------------------------------------------------------------- */

Test(red_cumsum, every_flag_combination_along_an_axis) {
    int64_t dims[3] = {2, 5, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -4, 4);
    int64_t one[1] = {1};
    kf_tensor axis = tu_i64(1, one, (int64_t[]){-2});
    for (int excl = 0; excl < 2; excl++)
        for (int rev = 0; rev < 2; rev++) {
            kf_node *n = tu_node("CumSum", 2, 1, 14);
            tu_attr_i(n, "exclusive", excl);
            tu_attr_i(n, "reverse", rev);
            const kf_tensor *in[2] = {&x, &axis};
            kf_tensor out[1] = {0};
            tu_eval(n, 2, in, out);
            kf_tensor want = dbl(3, dims);
            for (int64_t a = 0; a < 2; a++)
                for (int64_t c = 0; c < 3; c++)
                    for (int64_t b = 0; b < 5; b++) {
                        double s = 0;
                        for (int64_t k = 0; k < 5; k++) {
                            bool take = rev ? (excl ? k > b : k >= b) : (excl ? k < b : k <= b);
                            if (take) s += kf_get_f64(&x, (a * 5 + k) * 3 + c);
                        }
                        ((double *)want.data)[(a * 5 + b) * 3 + c] = s;
                    }
            kf_tensor w = as(&want, KF_DT_FLOAT, 3, dims);
            expect_close(&out[0], &w, 1e-5, 1e-5, "CumSum");
            kf_tensor_release(&w);
            kf_tensor_release(&want);
            release(out, 1);
            tu_node_free(n);
        }
    kf_tensor_release(&axis);
    kf_tensor_release(&x);
}

Test(red_cumsum, int64_is_exact_and_bad_axis_fails) {
    int64_t dims[1] = {3};
    int64_t big = ((int64_t)1 << 55) + (int64_t)tu_uniform(1, 99);
    kf_tensor x = tu_i64(1, dims, (int64_t[]){big, 1, big});
    kf_tensor axis = tu_i64(0, NULL, (int64_t[]){0});
    kf_node *n = tu_node("CumSum", 2, 1, 11);
    const kf_tensor *in[2] = {&x, &axis};
    kf_tensor out[1] = {0};
    tu_eval(n, 2, in, out);
    cr_assert_eq(((int64_t *)out[0].data)[2], 2 * big + 1);
    release(out, 1);
    kf_tensor_release(&axis);
    axis = tu_i64(0, NULL, (int64_t[]){1});
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&axis);
    kf_tensor_release(&x);
}

/* CumProd (26): the product of the elements each position takes along the
 * axis, for every flag; int32 products wrap like the type. */
Test(red_cumprod, every_flag_combination_and_int32_wraps) {
    int64_t dims[3] = {2, 6, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, 0.5, 1.8);
    for (int64_t i = 0; i < x.numel; i += 4) kf_set_f64(&x, i, -kf_get_f64(&x, i));
    int64_t one[1] = {1};
    kf_tensor axis = tu_i64(1, one, (int64_t[]){1});
    for (int excl = 0; excl < 2; excl++)
        for (int rev = 0; rev < 2; rev++) {
            kf_node *n = tu_node("CumProd", 2, 1, 26);
            tu_attr_i(n, "exclusive", excl);
            tu_attr_i(n, "reverse", rev);
            const kf_tensor *in[2] = {&x, &axis};
            kf_tensor out[1] = {0};
            tu_eval(n, 2, in, out);
            kf_tensor want = dbl(3, dims);
            for (int64_t a = 0; a < 2; a++)
                for (int64_t c = 0; c < 3; c++)
                    for (int64_t b = 0; b < 6; b++) {
                        double p = 1;
                        for (int64_t k = 0; k < 6; k++) {
                            bool take = rev ? (excl ? k > b : k >= b) : (excl ? k < b : k <= b);
                            if (take) p *= kf_get_f64(&x, (a * 6 + k) * 3 + c);
                        }
                        ((double *)want.data)[(a * 6 + b) * 3 + c] = p;
                    }
            kf_tensor w = as(&want, KF_DT_FLOAT, 3, dims);
            expect_close(&out[0], &w, 1e-6, 1e-5, "CumProd");
            kf_tensor_release(&w);
            kf_tensor_release(&want);
            release(out, 1);
            tu_node_free(n);
        }
    int64_t d1[1] = {5};
    kf_tensor xi = tu_rand(KF_DT_INT32, 1, d1, 1000, 60000);
    kf_tensor ax0 = tu_i64(0, NULL, (int64_t[]){0});
    kf_node *n = tu_node("CumProd", 2, 1, 26);
    const kf_tensor *in[2] = {&xi, &ax0};
    kf_tensor out[1] = {0};
    tu_eval(n, 2, in, out);
    uint32_t p = 1;
    for (int i = 0; i < 5; i++) {
        p *= (uint32_t)kf_get_i64(&xi, i);
        cr_assert_eq(kf_get_i64(&out[0], i), (int64_t)(int32_t)p, "element %d", i);
    }
    release(out, 1);
    tu_node_free(n);
    kf_tensor_release(&ax0);
    kf_tensor_release(&xi);
    kf_tensor_release(&axis);
    kf_tensor_release(&x);
}

/* ---- TopK ---------------------------------------------------------------- */

static void check_topk(const kf_tensor *x, const kf_tensor *vals, const kf_tensor *idx, int64_t k, bool largest) {
    /* x is [rows, len] along the last axis */
    int64_t rows = x->dims[0], len = x->dims[1];
    for (int64_t r = 0; r < rows; r++) {
        bool *used = calloc((size_t)len, 1);
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t p = 0; p < len; p++) {
                if (used[p]) continue;
                double v = kf_get_f64(x, r * len + p), bv = best < 0 ? 0 : kf_get_f64(x, r * len + best);
                if (best < 0 || (largest ? v > bv : v < bv)) best = p;
            }
            used[best] = true;
            cr_assert_eq(kf_get_i64(idx, r * k + j), best, "row %lld rank %lld", (long long)r, (long long)j);
            cr_assert_eq(kf_get_f64(vals, r * k + j), kf_get_f64(x, r * len + best));
        }
        free(used);
    }
}

Test(red_topk, largest_and_smallest_with_ties_by_lower_index) {
    int64_t dims[2] = {4, 9};
    kf_tensor x = tu_rand(KF_DT_INT64, 2, dims, -3, 3);
    int64_t one[1] = {1};
    kf_tensor kt = tu_i64(1, one, (int64_t[]){4});
    for (int largest = 0; largest < 2; largest++) {
        kf_node *n = tu_node("TopK", 2, 2, 11);
        tu_attr_i(n, "largest", largest);
        const kf_tensor *in[2] = {&x, &kt};
        kf_tensor out[2] = {{0}};
        tu_eval(n, 2, in, out);
        cr_assert_eq(out[0].dims[1], 4);
        cr_assert_eq(out[1].dtype, KF_DT_INT64);
        check_topk(&x, &out[0], &out[1], 4, largest);
        release(out, 2);
        tu_node_free(n);
    }
    /* opset 1: k attribute, float input */
    kf_tensor xf = tu_rand(KF_DT_FLOAT, 2, dims, -3, 3);
    kf_node *n = tu_node("TopK", 1, 2, 1);
    tu_attr_i(n, "k", 3);
    const kf_tensor *in[1] = {&xf};
    kf_tensor out[2] = {{0}};
    tu_eval(n, 1, in, out);
    check_topk(&xf, &out[0], &out[1], 3, true);
    release(out, 2);
    tu_node_free(n);
    kf_tensor_release(&xf);
    kf_tensor_release(&kt);
    kf_tensor_release(&x);
}

Test(red_topk, k_beyond_the_axis_or_negative_fails) {
    int64_t dims[2] = {2, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    int64_t one[1] = {1};
    kf_tensor kt = tu_i64(1, one, (int64_t[]){4});
    const kf_tensor *in[2] = {&x, &kt};
    kf_node *n = tu_node("TopK", 2, 2, 11);
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    kf_tensor_release(&kt);
    kt = tu_i64(1, one, (int64_t[]){-1});
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    n = tu_node("TopK", 1, 2, 9); /* k attribute missing */
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor_release(&kt);
    kf_tensor_release(&x);
}

/* ---- normalisations ------------------------------------------------------ */

/* Normalises x (viewed as [rows, cols]) row by row into y (double). */
static void naive_norm_rows(const kf_tensor *x, int64_t rows, int64_t cols, double eps, double *y, double *means,
                            double *invs) {
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < cols; c++) m += kf_get_f64(x, r * cols + c) / (double)cols;
        for (int64_t c = 0; c < cols; c++) v += pow(kf_get_f64(x, r * cols + c) - m, 2) / (double)cols;
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = (kf_get_f64(x, r * cols + c) - m) / sqrt(v + eps);
        if (means) means[r] = m;
        if (invs) invs[r] = 1 / sqrt(v + eps);
    }
}

Test(red_norm, layer_normalization_with_mean_and_inv_std_dev) {
    int64_t dims[3] = {2, 3, 4}, sdims[2] = {3, 4}, mdims[3] = {2, 1, 1};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -2, 2);
    kf_tensor s = tu_rand(KF_DT_FLOAT, 2, sdims, 0.5, 1.5), b = tu_rand(KF_DT_FLOAT, 2, sdims, -1, 1);
    kf_node *n = tu_node("LayerNormalization", 3, 3, 17);
    tu_attr_i(n, "axis", 1);
    tu_attr_f(n, "epsilon", 1e-3f);
    const kf_tensor *in[3] = {&x, &s, &b};
    kf_tensor out[3] = {{0}};
    tu_eval(n, 3, in, out);
    kf_tensor y = dbl(3, dims), m = dbl(3, mdims), iv = dbl(3, mdims);
    naive_norm_rows(&x, 2, 12, 1e-3f, y.data, m.data, iv.data);
    for (int64_t i = 0; i < 24; i++)
        ((double *)y.data)[i] = ((double *)y.data)[i] * kf_get_f64(&s, i % 12) + kf_get_f64(&b, i % 12);
    kf_tensor yw = as(&y, KF_DT_FLOAT, 3, dims), mw = as(&m, KF_DT_FLOAT, 3, mdims), iw = as(&iv, KF_DT_FLOAT, 3, mdims);
    expect_close(&out[0], &yw, 1e-5, 1e-4, "Y");
    expect_close(&out[1], &mw, 1e-6, 1e-5, "Mean");
    expect_close(&out[2], &iw, 1e-5, 1e-5, "InvStdDev");
    release(out, 3);
    /* Scale that does not broadcast onto X */
    int64_t bad[1] = {5};
    kf_tensor sb = tu_rand(KF_DT_FLOAT, 1, bad, 0.5, 1.5);
    in[1] = &sb;
    expect_fail(n, 3, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&sb);
    kf_tensor_release(&yw);
    kf_tensor_release(&mw);
    kf_tensor_release(&iw);
    kf_tensor_release(&y);
    kf_tensor_release(&m);
    kf_tensor_release(&iv);
    kf_tensor_release(&s);
    kf_tensor_release(&b);
    kf_tensor_release(&x);
}

Test(red_norm, rms_normalization_over_trailing_axes_with_broadcast_scale) {
    int64_t dims[3] = {2, 3, 5}, sdims[1] = {5};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -2, 2);
    kf_tensor s = tu_rand(KF_DT_FLOAT, 1, sdims, 0.5, 1.5);
    for (int axis = 1; axis <= 2; axis++) {
        kf_node *n = tu_node("RMSNormalization", 2, 1, 23);
        tu_attr_i(n, "axis", axis == 2 ? -1 : 1);
        tu_attr_f(n, "epsilon", 1e-2f);
        const kf_tensor *in[2] = {&x, &s};
        kf_tensor out[1] = {{0}};
        tu_eval(n, 2, in, out);
        int64_t cols = axis == 2 ? 5 : 15, rows = 30 / cols;
        kf_tensor y = dbl(3, dims);
        for (int64_t r = 0; r < rows; r++) {
            double ms = 0;
            for (int64_t c = 0; c < cols; c++) ms += pow(kf_get_f64(&x, r * cols + c), 2) / (double)cols;
            for (int64_t c = 0; c < cols; c++) {
                int64_t i = r * cols + c;
                ((double *)y.data)[i] = kf_get_f64(&x, i) / sqrt(ms + (double)1e-2f) * kf_get_f64(&s, i % 5);
            }
        }
        kf_tensor yw = as(&y, KF_DT_FLOAT, 3, dims);
        expect_close(&out[0], &yw, 1e-5, 1e-4, "Y");
        release(out, 1);
        kf_tensor_release(&yw);
        kf_tensor_release(&y);
        /* a scale that does not broadcast onto X, and an axis out of range */
        int64_t bad[1] = {4};
        kf_tensor sb = tu_rand(KF_DT_FLOAT, 1, bad, 0.5, 1.5);
        in[1] = &sb;
        expect_fail(n, 2, in, KF_ERR_SHAPE);
        kf_tensor_release(&sb);
        in[1] = &s;
        ((kf_attr *)kf_attr_find(n, "axis"))->i = 3;
        expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
        tu_node_free(n);
    }
    kf_tensor_release(&s);
    kf_tensor_release(&x);
}

Test(red_norm, instance_and_group_normalization) {
    int64_t dims[4] = {2, 4, 3, 2}, c[1] = {4}, g[1] = {2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dims, -2, 2);
    kf_tensor s = tu_rand(KF_DT_FLOAT, 1, c, 0.5, 1.5), b = tu_rand(KF_DT_FLOAT, 1, c, -1, 1);
    kf_tensor sg = tu_rand(KF_DT_FLOAT, 1, g, 0.5, 1.5), bg = tu_rand(KF_DT_FLOAT, 1, g, -1, 1);
    kf_tensor y = dbl(4, dims);
    double *yd = y.data;

    /* InstanceNormalization: rows are (n, c) */
    naive_norm_rows(&x, 8, 6, 1e-5f, yd, NULL, NULL);
    for (int64_t i = 0; i < 48; i++) yd[i] = yd[i] * kf_get_f64(&s, (i / 6) % 4) + kf_get_f64(&b, (i / 6) % 4);
    kf_tensor w = as(&y, KF_DT_FLOAT, 4, dims);
    kf_node *n = tu_node("InstanceNormalization", 3, 1, 6);
    const kf_tensor *in[3] = {&x, &s, &b};
    kf_tensor out[1] = {0};
    tu_eval(n, 3, in, out);
    expect_close(&out[0], &w, 1e-5, 1e-4, "InstanceNormalization");
    tu_node_free(n);
    kf_tensor_release(&w);

    /* GroupNormalization-21 (per-channel scale), 2 groups: rows are (n, g) */
    naive_norm_rows(&x, 4, 12, 1e-5f, yd, NULL, NULL);
    for (int64_t i = 0; i < 48; i++) yd[i] = yd[i] * kf_get_f64(&s, (i / 6) % 4) + kf_get_f64(&b, (i / 6) % 4);
    w = as(&y, KF_DT_FLOAT, 4, dims);
    n = tu_node("GroupNormalization", 3, 1, 21);
    tu_attr_i(n, "num_groups", 2);
    tu_eval(n, 3, in, out);
    expect_close(&out[0], &w, 1e-5, 1e-4, "GroupNormalization-21");
    kf_tensor_release(&w);
    /* per-group scale is an error at 21 */
    const kf_tensor *ing[3] = {&x, &sg, &bg};
    expect_fail(n, 3, ing, KF_ERR_SHAPE);
    tu_node_free(n);

    /* GroupNormalization-18: one scale per group */
    naive_norm_rows(&x, 4, 12, 1e-5f, yd, NULL, NULL);
    for (int64_t i = 0; i < 48; i++) yd[i] = yd[i] * kf_get_f64(&sg, (i / 12) % 2) + kf_get_f64(&bg, (i / 12) % 2);
    w = as(&y, KF_DT_FLOAT, 4, dims);
    n = tu_node("GroupNormalization", 3, 1, 18);
    tu_attr_i(n, "num_groups", 2);
    tu_eval(n, 3, ing, out);
    expect_close(&out[0], &w, 1e-5, 1e-4, "GroupNormalization-18");
    tu_node_free(n);
    kf_tensor_release(&w);
    n = tu_node("GroupNormalization", 3, 1, 18);
    tu_attr_i(n, "num_groups", 3); /* does not divide C */
    expect_fail(n, 3, ing, KF_ERR_BAD_MODEL);
    tu_node_free(n);

    release(out, 1);
    kf_tensor_release(&y);
    kf_tensor_release(&s);
    kf_tensor_release(&b);
    kf_tensor_release(&sg);
    kf_tensor_release(&bg);
    kf_tensor_release(&x);
}

Test(red_norm, batch_normalization_inference_and_training) {
    int64_t dims[3] = {3, 2, 4}, c[1] = {2};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -2, 2);
    kf_tensor s = tu_rand(KF_DT_FLOAT, 1, c, 0.5, 1.5), b = tu_rand(KF_DT_FLOAT, 1, c, -1, 1);
    kf_tensor mean = tu_rand(KF_DT_FLOAT, 1, c, -0.5, 0.5), var = tu_rand(KF_DT_FLOAT, 1, c, 0.5, 2);
    const kf_tensor *in[5] = {&x, &s, &b, &mean, &var};
    kf_tensor y = dbl(3, dims);
    double *yd = y.data;
    for (int64_t i = 0; i < 24; i++) {
        int64_t ch = (i / 4) % 2;
        yd[i] = (kf_get_f64(&x, i) - kf_get_f64(&mean, ch)) / sqrt(kf_get_f64(&var, ch) + 1e-5f) * kf_get_f64(&s, ch) +
                kf_get_f64(&b, ch);
    }
    kf_tensor w = as(&y, KF_DT_FLOAT, 3, dims);
    int64_t versions[4] = {6, 7, 9, 15};
    for (int v = 0; v < 4; v++) {
        kf_node *n = tu_node("BatchNormalization", 5, 1, versions[v]);
        if (versions[v] < 7) tu_attr_i(n, "is_test", 1);
        kf_tensor out[1] = {0};
        tu_eval(n, 5, in, out);
        expect_close(&out[0], &w, 1e-5, 1e-4, "BatchNormalization inference");
        release(out, 1);
        tu_node_free(n);
    }
    kf_tensor_release(&w);

    /* training mode: batch statistics, running statistics with momentum */
    double bm[2] = {0}, bv[2] = {0};
    for (int64_t i = 0; i < 24; i++) bm[(i / 4) % 2] += kf_get_f64(&x, i) / 12;
    for (int64_t i = 0; i < 24; i++) bv[(i / 4) % 2] += pow(kf_get_f64(&x, i) - bm[(i / 4) % 2], 2) / 12;
    for (int64_t i = 0; i < 24; i++) {
        int64_t ch = (i / 4) % 2;
        yd[i] = (kf_get_f64(&x, i) - bm[ch]) / sqrt(bv[ch] + 1e-5f) * kf_get_f64(&s, ch) + kf_get_f64(&b, ch);
    }
    w = as(&y, KF_DT_FLOAT, 3, dims);
    kf_node *n = tu_node("BatchNormalization", 5, 3, 15);
    tu_attr_i(n, "training_mode", 1);
    tu_attr_f(n, "momentum", 0.8f);
    kf_tensor out[3] = {{0}};
    tu_eval(n, 5, in, out);
    expect_close(&out[0], &w, 1e-5, 1e-4, "BatchNormalization training");
    for (int ch = 0; ch < 2; ch++) {
        cr_assert_float_eq(kf_get_f64(&out[1], ch), kf_get_f64(&mean, ch) * 0.8f + bm[ch] * (1 - 0.8f), 1e-5);
        cr_assert_float_eq(kf_get_f64(&out[2], ch), kf_get_f64(&var, ch) * 0.8f + bv[ch] * (1 - 0.8f), 1e-5);
    }
    release(out, 3);
    tu_node_free(n);
    kf_tensor_release(&w);

    /* declined: training before opset 14 */
    n = tu_node("BatchNormalization", 5, 1, 6);
    expect_fail(n, 5, in, KF_ERR_UNSUPPORTED); /* is_test defaults to 0 */
    tu_node_free(n);
    n = tu_node("BatchNormalization", 5, 5, 9);
    expect_fail(n, 5, in, KF_ERR_UNSUPPORTED);
    tu_node_free(n);
    /* bad parameter shape */
    int64_t c3[1] = {3};
    kf_tensor s3 = tu_rand(KF_DT_FLOAT, 1, c3, 0.5, 1.5);
    in[1] = &s3;
    n = tu_node("BatchNormalization", 5, 1, 15);
    expect_fail(n, 5, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&s3);
    kf_tensor_release(&y);
    kf_tensor_release(&s);
    kf_tensor_release(&b);
    kf_tensor_release(&mean);
    kf_tensor_release(&var);
    kf_tensor_release(&x);
}

Test(red_norm, lrn_and_mean_variance_normalization) {
    int64_t dims[4] = {2, 5, 2, 3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, dims, -2, 2);
    const kf_tensor *in[1] = {&x};
    kf_tensor out[1] = {0};
    kf_tensor y = dbl(4, dims);
    double *yd = y.data;
    /* LRN with size 4: window [c-1, c+2] */
    for (int64_t i = 0; i < x.numel; i++) {
        int64_t idx[4];
        kf_unravel(4, dims, i, idx);
        double sq = 0;
        for (int64_t k = idx[1] - 1; k <= idx[1] + 2; k++) {
            if (k < 0 || k >= 5) continue;
            double v = kf_get_f64(&x, ((idx[0] * 5 + k) * 2 + idx[2]) * 3 + idx[3]);
            sq += v * v;
        }
        yd[i] = kf_get_f64(&x, i) / pow(2.0 + 0.5f / 4 * sq, 0.6f);
    }
    kf_tensor w = as(&y, KF_DT_FLOAT, 4, dims);
    kf_node *n = tu_node("LRN", 1, 1, 13);
    tu_attr_i(n, "size", 4);
    tu_attr_f(n, "alpha", 0.5f);
    tu_attr_f(n, "beta", 0.6f);
    tu_attr_f(n, "bias", 2.0f);
    tu_eval(n, 1, in, out);
    expect_close(&out[0], &w, 1e-6, 1e-5, "LRN");
    tu_node_free(n);
    kf_tensor_release(&w);
    n = tu_node("LRN", 1, 1, 13);
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL); /* size is required */
    tu_node_free(n);

    /* MVN over the default axes (0, 2, 3): one group per channel */
    for (int64_t ch = 0; ch < 5; ch++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < x.numel; i++)
            if ((i / 6) % 5 == ch) m += kf_get_f64(&x, i) / 12;
        for (int64_t i = 0; i < x.numel; i++)
            if ((i / 6) % 5 == ch) v += pow(kf_get_f64(&x, i) - m, 2) / 12;
        for (int64_t i = 0; i < x.numel; i++)
            if ((i / 6) % 5 == ch) yd[i] = (kf_get_f64(&x, i) - m) / (sqrt(v) + 1e-9);
    }
    w = as(&y, KF_DT_FLOAT, 4, dims);
    n = tu_node("MeanVarianceNormalization", 1, 1, 13);
    tu_eval(n, 1, in, out);
    expect_close(&out[0], &w, 1e-5, 1e-4, "MVN");
    tu_node_free(n);
    kf_tensor_release(&w);
    n = tu_node("MeanVarianceNormalization", 1, 1, 13);
    tu_attr_ints(n, "axes", 2, (int64_t[]){0, 4});
    expect_fail(n, 1, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    release(out, 1);
    kf_tensor_release(&y);
    kf_tensor_release(&x);
}

/* ---- losses -------------------------------------------------------------- */

/* NLL over lp [N, C, D] (double), targets [N, D]; returns per-element losses
 * in loss[] and the mean/sum through *mean, *sum. */
static void naive_nll(const kf_tensor *lp, const kf_tensor *t, const kf_tensor *w, bool has_ii, int64_t ii,
                      double *loss, double *sum, double *mean) {
    int64_t N = lp->dims[0], C = lp->dims[1], D = lp->numel / (N * C);
    double ws = 0;
    *sum = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t d = 0; d < D; d++) {
            int64_t c = kf_get_i64(t, i * D + d);
            double wt = (has_ii && c == ii) ? 0 : w ? kf_get_f64(w, c) : 1;
            double l = wt == 0 ? 0 : -kf_get_f64(lp, (i * C + c) * D + d) * wt;
            loss[i * D + d] = l;
            *sum += l;
            ws += wt;
        }
    *mean = *sum / ws;
}

Test(red_loss, nll_every_reduction_with_weights_and_ignore_index) {
    int64_t dims[3] = {3, 4, 5}, tdims[2] = {3, 5}, c[1] = {4};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -3, 0);
    kf_tensor t = tu_rand(KF_DT_INT64, 2, tdims, 0, 4);
    kf_set_i64(&t, 2, 1);
    kf_set_i64(&t, 7, 1); /* make sure ignore_index = 1 occurs */
    kf_tensor w = tu_rand(KF_DT_FLOAT, 1, c, 0.2, 2);
    static const char *const reds[3] = {"none", "sum", "mean"};
    double loss[15], sum, mean;
    for (int with_w = 0; with_w < 2; with_w++)
        for (int ii = 0; ii < 2; ii++)
            for (int r = 0; r < 3; r++) {
                naive_nll(&x, &t, with_w ? &w : NULL, ii, 1, loss, &sum, &mean);
                kf_node *n = tu_node("NegativeLogLikelihoodLoss", with_w ? 3 : 2, 1, 13);
                tu_attr_s(n, "reduction", reds[r]);
                if (ii) tu_attr_i(n, "ignore_index", 1);
                const kf_tensor *in[3] = {&x, &t, &w};
                kf_tensor out[1] = {0};
                tu_eval(n, with_w ? 3 : 2, in, out);
                if (r == 0) {
                    cr_assert_eq(out[0].rank, 2);
                    for (int i = 0; i < 15; i++)
                        cr_assert_float_eq(kf_get_f64(&out[0], i), loss[i], 1e-5, "loss %d", i);
                } else {
                    cr_assert_eq(out[0].rank, 0);
                    cr_assert_float_eq(kf_get_f64(&out[0], 0), r == 1 ? sum : mean, 1e-4 * (1 + fabs(sum)),
                                       "w=%d ii=%d %s", with_w, ii, reds[r]);
                }
                release(out, 1);
                tu_node_free(n);
            }
    /* errors: target out of range, bad reduction, bad target shape */
    kf_set_i64(&t, 4, 4);
    const kf_tensor *in[3] = {&x, &t, NULL};
    kf_node *n = tu_node("NegativeLogLikelihoodLoss", 2, 1, 13);
    expect_fail(n, 2, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    kf_set_i64(&t, 4, 0);
    n = tu_node("NegativeLogLikelihoodLoss", 2, 1, 13);
    tu_attr_s(n, "reduction", "average");
    expect_fail(n, 2, in, KF_ERR_BAD_MODEL);
    tu_node_free(n);
    kf_tensor t2 = tu_rand(KF_DT_INT64, 2, (int64_t[]){3, 4}, 0, 4);
    in[1] = &t2;
    n = tu_node("NegativeLogLikelihoodLoss", 2, 1, 13);
    expect_fail(n, 2, in, KF_ERR_SHAPE);
    tu_node_free(n);
    kf_tensor_release(&t2);
    kf_tensor_release(&w);
    kf_tensor_release(&t);
    kf_tensor_release(&x);
}

Test(red_loss, softmax_cross_entropy_with_log_prob) {
    int64_t dims[3] = {2, 3, 4}, tdims[2] = {2, 4}, c[1] = {3};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 3, dims, -5, 5);
    kf_tensor t = tu_rand(KF_DT_INT32, 2, tdims, 0, 3);
    kf_set_i64(&t, 3, -1);
    kf_tensor w = tu_rand(KF_DT_FLOAT, 1, c, 0.2, 2);
    kf_tensor lp = naive_softmax(&x, 2, 3, 4, 1);
    double loss[8], sum, mean;
    naive_nll(&lp, &t, &w, true, -1, loss, &sum, &mean);
    kf_node *n = tu_node("SoftmaxCrossEntropyLoss", 3, 2, 13);
    tu_attr_i(n, "ignore_index", -1);
    const kf_tensor *in[3] = {&x, &t, &w};
    kf_tensor out[2] = {{0}};
    tu_eval(n, 3, in, out);
    cr_assert_eq(out[0].rank, 0);
    cr_assert_float_eq(kf_get_f64(&out[0], 0), mean, 1e-5 * (1 + fabs(mean)));
    kf_tensor lw = as(&lp, KF_DT_FLOAT, 3, dims);
    expect_close(&out[1], &lw, 1e-5, 1e-5, "log_prob");
    release(out, 2);
    tu_node_free(n);
    /* label out of range without ignore_index */
    n = tu_node("SoftmaxCrossEntropyLoss", 3, 1, 13);
    expect_fail(n, 3, in, KF_ERR_RUNTIME);
    tu_node_free(n);
    kf_tensor_release(&lw);
    kf_tensor_release(&lp);
    kf_tensor_release(&w);
    kf_tensor_release(&t);
    kf_tensor_release(&x);
}
