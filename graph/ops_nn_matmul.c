/*
 * ops_nn_matmul.c: reference kernels and shape functions of the matrix
 * products: MatMul (numpy.matmul rules), Gemm (every opset's C rules),
 * MatMulInteger and QLinearMatMul (exact integer accumulation, per-tensor,
 * per-row or per-column quantisation parameters) and Det.
 * Float products accumulate in double; integer ones in wrapping 64 bits.
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

static const kf_dtype matmul_types[] = {KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_FLOAT,
                                        KF_DT_DOUBLE,  KF_DT_INT32,    KF_DT_INT64,
                                        KF_DT_UINT32,  KF_DT_UINT64,   KF_DT_UNDEFINED};

/* Allocates out when the driver did not (shape was not static). */
static kf_status ensure_out(kf_tensor *out, kf_dtype dt, int rank, const int64_t *dims) {
    if (out->data || (out->dtype && out->numel == 0 && out->dtype == dt)) return KF_OK;
    return kf_tensor_alloc(out, dt, rank, dims);
}

static kf_status check_same_dtype(const kf_node *n, kf_dtype a, kf_dtype b, const char *what) {
    if (a && b && a != b)
        return kf_nn_fail(n, KF_ERR_SHAPE, "input '%s' has dtype %s, expected %s", what,
                          kf_dtype_name(b), kf_dtype_name(a));
    return KF_OK;
}

/* ---- MatMul ------------------------------------------------------------------------ */

kf_status kf_nn_matmul_shape_fn(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "A", matmul_types));
    KF_TRY(check_same_dtype(n, in[0]->dtype, in[1]->dtype, "B"));
    return kf_nn_matmul_shape(n, in[0], in[1], &out[0]);
}

/* Y = A x B (numpy.matmul) for any dtype; float in double, int modular. */
static kf_status matmul_any(const kf_node *n, const kf_tensor *A, const kf_tensor *B,
                            kf_tensor *Y) {
    kf_nn_mm mm;
    KF_TRY(kf_nn_mm_init(n, A, B, &mm));
    KF_TRY(ensure_out(Y, A->dtype, mm.out.rank, mm.out.dims));
    int64_t mn = mm.M * mm.N;
    bool isf = kf_dtype_is_float(A->dtype);
    kf_status st = KF_OK;
    void *a = isf ? (void *)kf_nn_to_f64(A) : (void *)kf_nn_to_i64(A);
    void *b = isf ? (void *)kf_nn_to_f64(B) : (void *)kf_nn_to_i64(B);
    void *c = kf_calloc((size_t)mn + 1, 8);
    if (!a || !b || !c) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t bi = 0; bi < mm.nbatch; bi++) {
        int64_t ao, bo;
        kf_nn_mm_batch(&mm, bi, &ao, &bo);
        memset(c, 0, (size_t)mn * 8);
        if (isf) {
            kf_nn_gemm_f64(mm.M, mm.N, mm.K, (double *)a + ao, mm.K, 1, (double *)b + bo, mm.N, 1,
                           c);
            for (int64_t i = 0; i < mn; i++) kf_set_f64(Y, bi * mn + i, ((double *)c)[i]);
        } else {
            kf_nn_gemm_u64(mm.M, mm.N, mm.K, (uint64_t *)a + ao, mm.K, 1, (uint64_t *)b + bo, mm.N,
                           1, c);
            for (int64_t i = 0; i < mn; i++) kf_set_u64(Y, bi * mn + i, ((uint64_t *)c)[i]);
        }
    }
done:
    kf_free(a);
    kf_free(b);
    kf_free(c);
    return st;
}

kf_status kf_nn_matmul_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out) {
    (void)nin;
    (void)nout;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "A", matmul_types));
    KF_TRY(check_same_dtype(n, in[0]->dtype, in[1]->dtype, "B"));
    return matmul_any(n, in[0], in[1], &out[0]);
}

/* ---- Gemm ------------------------------------------------------------------------------ */

kf_status kf_nn_gemm_shape(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "A", matmul_types));
    KF_TRY(check_same_dtype(n, in[0]->dtype, in[1]->dtype, "B"));
    out[0].dtype = in[0]->dtype;
    if (in[0]->rank < 0 || in[1]->rank < 0) return KF_OK;
    if (in[0]->rank != 2 || in[1]->rank != 2)
        return kf_nn_fail(n, KF_ERR_SHAPE, "A and B must be 2-D (ranks %d, %d)", in[0]->rank,
                          in[1]->rank);
    int ta = kf_attr_i(n, "transA", 0) != 0, tb = kf_attr_i(n, "transB", 0) != 0;
    int64_t ka = in[0]->dims[ta ? 0 : 1], kb = in[1]->dims[tb ? 1 : 0];
    if (ka >= 0 && kb >= 0 && ka != kb)
        return kf_nn_fail(n, KF_ERR_SHAPE, "inner dimensions differ (%lld vs %lld)", (long long)ka,
                          (long long)kb);
    out[0].rank = 2;
    out[0].dims[0] = in[0]->dims[ta ? 1 : 0];
    out[0].syms[0] = in[0]->syms[ta ? 1 : 0];
    out[0].dims[1] = in[1]->dims[tb ? 0 : 1];
    out[0].syms[1] = in[1]->syms[tb ? 0 : 1];
    return KF_OK;
}

kf_status kf_nn_gemm_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                          kf_tensor *out) {
    (void)nout;
    const kf_tensor *A = in[0], *B = in[1], *C = nin > 2 ? in[2] : NULL;
    KF_TRY(kf_nn_check_dtype(n, A->dtype, "A", matmul_types));
    KF_TRY(check_same_dtype(n, A->dtype, B->dtype, "B"));
    if (C) KF_TRY(check_same_dtype(n, A->dtype, C->dtype, "C"));
    if (!C && n->opset && n->opset < 11)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "input C is required before opset 11");
    if (A->rank != 2 || B->rank != 2)
        return kf_nn_fail(n, KF_ERR_SHAPE, "A and B must be 2-D (ranks %d, %d)", A->rank, B->rank);
    int ta = kf_attr_i(n, "transA", 0) != 0, tb = kf_attr_i(n, "transB", 0) != 0;
    double alpha = kf_attr_f(n, "alpha", 1.0f), beta = kf_attr_f(n, "beta", 1.0f);
    int64_t M = A->dims[ta ? 1 : 0], K = A->dims[ta ? 0 : 1];
    int64_t N = B->dims[tb ? 0 : 1], KB = B->dims[tb ? 1 : 0];
    if (K != KB)
        return kf_nn_fail(n, KF_ERR_SHAPE, "inner dimensions differ (%lld vs %lld)", (long long)K,
                          (long long)KB);
    int64_t ydims[2] = {M, N};
    /* C: unidirectional broadcast to (M, N); before opset 7 only when the
     * `broadcast` attribute is set, otherwise it must be (M, N) exactly. */
    int64_t cs0 = 0, cs1 = 0;
    if (C) {
        bool legacy_exact = n->opset && n->opset < 7 && kf_attr_i(n, "broadcast", 0) == 0;
        int64_t c0 = C->rank >= 2 ? C->dims[C->rank - 2] : 1,
                c1 = C->rank >= 1 ? C->dims[C->rank - 1] : 1;
        bool ok = C->rank <= 2 && (c0 == 1 || c0 == M) && (c1 == 1 || c1 == N);
        if (legacy_exact) ok = C->rank == 2 && c0 == M && c1 == N;
        if (!ok)
            return kf_nn_fail(n, KF_ERR_SHAPE, "C of rank %d cannot be broadcast to (%lld, %lld)",
                              C->rank, (long long)M, (long long)N);
        cs0 = c0 == 1 ? 0 : c1;
        cs1 = c1 == 1 ? 0 : 1;
    }
    KF_TRY(ensure_out(&out[0], A->dtype, 2, ydims));
    kf_tensor *Y = &out[0];
    int64_t mn = M * N; /* the output exists, so this fits */
    bool isf = kf_dtype_is_float(A->dtype);
    /* integer Gemm stays exact (modular) when alpha and beta are integers */
    bool int_exact = !isf && alpha == floor(alpha) && beta == floor(beta) && fabs(alpha) < 9e15 &&
                     fabs(beta) < 9e15;
    kf_status st = KF_OK;
    void *a = NULL, *b = NULL, *c = kf_calloc((size_t)mn + 1, 8);
    if (isf || !int_exact) {
        a = kf_nn_to_f64(A);
        b = kf_nn_to_f64(B);
    } else {
        a = kf_nn_to_i64(A);
        b = kf_nn_to_i64(B);
    }
    if (!a || !b || !c) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    int64_t ars = ta ? 1 : K, acs = ta ? M : 1, brs = tb ? 1 : N, bcs = tb ? K : 1;
    if (int_exact) {
        uint64_t *cu = c;
        kf_nn_gemm_u64(M, N, K, a, ars, acs, b, brs, bcs, cu);
        uint64_t al = (uint64_t)(int64_t)alpha, be = (uint64_t)(int64_t)beta;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                uint64_t v = al * cu[i * N + j];
                if (C) v += be * (uint64_t)kf_get_i64(C, i * cs0 + j * cs1);
                kf_set_u64(Y, i * N + j, v);
            }
    } else {
        double *cd = c;
        kf_nn_gemm_f64(M, N, K, a, ars, acs, b, brs, bcs, cd);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double v = alpha * cd[i * N + j];
                if (C) v += beta * kf_get_f64(C, i * cs0 + j * cs1);
                kf_set_f64(Y, i * N + j, v);
            }
    }
done:
    kf_free(a);
    kf_free(b);
    kf_free(c);
    return st;
}

/* ---- MatMulInteger / QLinearMatMul ------------------------------------------------------ */

/* x - zero_point as int64 over x's shape; the zero point is per tensor or
 * per row (rows=true: axis rank-2) / per column (axis rank-1). */
static kf_status centred(const kf_node *n, const kf_tensor *x, const kf_tensor *zp,
                         const char *what, bool rows, int64_t **out) {
    int axis = rows ? (x->rank >= 2 ? x->rank - 2 : -1) : x->rank - 1;
    if (zp && zp->dtype != x->dtype)
        return kf_nn_fail(n, KF_ERR_SHAPE, "input '%s' has dtype %s, its data is %s", what,
                          kf_dtype_name(zp->dtype), kf_dtype_name(x->dtype));
    int64_t *z = NULL;
    KF_TRY(kf_nn_expand_param_i64(n, zp, what, x->rank, x->dims, axis, &z));
    for (int64_t i = 0; i < x->numel; i++) z[i] = kf_get_i64(x, i) - z[i];
    *out = z;
    return KF_OK;
}

/* Shape of the integer products: numpy.matmul of inputs ia, ib; dtype dt
 * (or the dtype of input idt when dt is 0). */
static kf_status qmm_shape(const kf_node *n, int nin, const kf_type *const *in, int ia, int ib,
                           kf_dtype dt, int idt, kf_type *out) {
    if (nin <= ib || !in[ia] || !in[ib]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[ia]->dtype, "A", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, in[ib]->dtype, "B", kf_nn_q8_types));
    KF_TRY(kf_nn_matmul_shape(n, in[ia], in[ib], out));
    out->dtype = dt ? dt : (nin > idt && in[idt] ? in[idt]->dtype : KF_DT_UNDEFINED);
    if (out->dtype) KF_TRY(kf_nn_check_dtype(n, out->dtype, "y_zero_point", kf_nn_q8_types));
    return KF_OK;
}

kf_status kf_nn_matmulint_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "A", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, in[1]->dtype, "B", kf_nn_q8_types));
    KF_TRY(kf_nn_matmul_shape(n, in[0], in[1], &out[0]));
    out[0].dtype = KF_DT_INT32;
    return KF_OK;
}

/* Integer product of centred operands; acc receives nbatch*M*N int64. */
static kf_status int_product(const kf_node *n, const kf_tensor *A, const int64_t *a,
                             const kf_tensor *B, const int64_t *b, kf_nn_mm *mm, int64_t **acc) {
    KF_TRY(kf_nn_mm_init(n, A, B, mm));
    int64_t total;
    if (!kf_mul_ok(mm->nbatch, mm->M * mm->N, &total))
        return kf_nn_fail(n, KF_ERR_SHAPE, "output too large");
    KF_TRY(kf_shape_numel(1, &total, 8, &total));
    uint64_t *c = kf_calloc((size_t)total + 1, sizeof(uint64_t));
    if (!c) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t mn = mm->M * mm->N;
    for (int64_t bi = 0; bi < mm->nbatch; bi++) {
        int64_t ao, bo;
        kf_nn_mm_batch(mm, bi, &ao, &bo);
        kf_nn_gemm_u64(mm->M, mm->N, mm->K, (const uint64_t *)a + ao, mm->K, 1,
                       (const uint64_t *)b + bo, mm->N, 1, c + bi * mn);
    }
    *acc = (int64_t *)c;
    return KF_OK;
}

kf_status kf_nn_matmulint_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    (void)nout;
    const kf_tensor *A = in[0], *B = in[1];
    KF_TRY(kf_nn_check_dtype(n, A->dtype, "A", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, B->dtype, "B", kf_nn_q8_types));
    int64_t *a = NULL, *b = NULL, *acc = NULL;
    kf_nn_mm mm;
    kf_status st = centred(n, A, nin > 2 ? in[2] : NULL, "a_zero_point", true, &a);
    if (!st) st = centred(n, B, nin > 3 ? in[3] : NULL, "b_zero_point", false, &b);
    if (!st) st = int_product(n, A, a, B, b, &mm, &acc);
    if (!st) st = ensure_out(&out[0], KF_DT_INT32, mm.out.rank, mm.out.dims);
    if (!st)
        for (int64_t i = 0; i < out[0].numel; i++) kf_set_i64(&out[0], i, acc[i]);
    kf_free(a);
    kf_free(b);
    kf_free(acc);
    return st;
}

static const kf_dtype scale_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_UNDEFINED};

kf_status kf_nn_qlinearmatmul_shape(const kf_node *n, int nin, const kf_type *const *in,
                                    const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    static const int sidx[3] = {1, 4, 6};
    for (int i = 0; i < 3; i++)
        if (sidx[i] < nin && in[sidx[i]])
            KF_TRY(kf_nn_check_dtype(n, in[sidx[i]]->dtype, "scale", scale_types));
    return qmm_shape(n, nin, in, 0, 3, KF_DT_UNDEFINED, 7, &out[0]);
}

kf_status kf_nn_qlinearmatmul_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                   kf_tensor *out) {
    (void)nout;
    (void)nin;
    const kf_tensor *A = in[0], *B = in[3], *yzp = in[7];
    KF_TRY(kf_nn_check_dtype(n, A->dtype, "a", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, B->dtype, "b", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, yzp->dtype, "y_zero_point", kf_nn_q8_types));
    static const char *snames[3] = {"a_scale", "b_scale", "y_scale"};
    for (int i = 0; i < 3; i++)
        KF_TRY(kf_nn_check_dtype(n, in[i == 2 ? 6 : 1 + 3 * i]->dtype, snames[i], scale_types));
    int64_t *a = NULL, *b = NULL, *acc = NULL, *yz = NULL;
    double *as = NULL, *bs = NULL, *ys = NULL;
    kf_nn_mm mm;
    kf_status st = centred(n, A, in[2], "a_zero_point", true, &a);
    if (!st) st = centred(n, B, in[5], "b_zero_point", false, &b);
    if (!st) st = int_product(n, A, a, B, b, &mm, &acc);
    if (!st)
        st = kf_nn_expand_param_f64(n, in[1], "a_scale", A->rank, A->dims,
                                    A->rank >= 2 ? A->rank - 2 : -1, &as);
    if (!st) st = kf_nn_expand_param_f64(n, in[4], "b_scale", B->rank, B->dims, B->rank - 1, &bs);
    if (!st)
        st = kf_nn_expand_param_f64(n, in[6], "y_scale", mm.out.rank, mm.out.dims, mm.out.rank - 1,
                                    &ys);
    if (!st)
        st = kf_nn_expand_param_i64(n, yzp, "y_zero_point", mm.out.rank, mm.out.dims,
                                    mm.out.rank - 1, &yz);
    if (!st) st = ensure_out(&out[0], yzp->dtype, mm.out.rank, mm.out.dims);
    if (st) goto done;
    double lo, hi;
    kf_nn_int_range(yzp->dtype, &lo, &hi);
    int64_t mn = mm.M * mm.N;
    for (int64_t bi = 0; bi < mm.nbatch; bi++) {
        int64_t ao, bo;
        kf_nn_mm_batch(&mm, bi, &ao, &bo);
        for (int64_t i = 0; i < mm.M; i++)
            for (int64_t j = 0; j < mm.N; j++) {
                int64_t o = bi * mn + i * mm.N + j;
                /* a scale is constant along a row, b's along a column; with
                 * K == 0 the product is 0 and the scales do not matter */
                float sa = mm.K ? (float)as[ao + i * mm.K] : 1.0f;
                float sb = mm.K ? (float)bs[bo + j] : 1.0f;
                float mult = sa * sb / (float)ys[o];
                double v = kf_nn_round_even((double)acc[o] * (double)mult) + (double)yz[o];
                kf_set_f64(&out[0], o, v < lo ? lo : v > hi ? hi : v);
            }
    }
done:
    kf_free(a);
    kf_free(b);
    kf_free(acc);
    kf_free(yz);
    kf_free(as);
    kf_free(bs);
    kf_free(ys);
    return st;
}

/* ---- Det ------------------------------------------------------------------------------------ */

kf_status kf_nn_det_shape(const kf_node *n, int nin, const kf_type *const *in,
                          const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "X", kf_nn_float_types));
    out[0].dtype = in[0]->dtype;
    if (in[0]->rank < 0) return KF_OK;
    int r = in[0]->rank;
    if (r < 2) return kf_nn_fail(n, KF_ERR_SHAPE, "input must have rank >= 2, not %d", r);
    int64_t a = in[0]->dims[r - 2], b = in[0]->dims[r - 1];
    if (a >= 0 && b >= 0 && a != b)
        return kf_nn_fail(n, KF_ERR_SHAPE, "matrices must be square (%lld x %lld)", (long long)a,
                          (long long)b);
    out[0].rank = r - 2;
    for (int d = 0; d < r - 2; d++) {
        out[0].dims[d] = in[0]->dims[d];
        out[0].syms[d] = in[0]->syms[d];
    }
    return KF_OK;
}

/* Determinant by LU decomposition with partial pivoting; m is destroyed. */
static double det_lu(double *m, int64_t k) {
    double det = 1.0;
    for (int64_t c = 0; c < k; c++) {
        int64_t p = c;
        for (int64_t r = c + 1; r < k; r++)
            if (fabs(m[r * k + c]) > fabs(m[p * k + c])) p = r;
        if (m[p * k + c] == 0.0) return 0.0;
        if (p != c) {
            for (int64_t j = 0; j < k; j++) {
                double t = m[c * k + j];
                m[c * k + j] = m[p * k + j];
                m[p * k + j] = t;
            }
            det = -det;
        }
        double piv = m[c * k + c];
        det *= piv;
        for (int64_t r = c + 1; r < k; r++) {
            double f = m[r * k + c] / piv;
            if (f == 0.0) continue;
            for (int64_t j = c + 1; j < k; j++) m[r * k + j] -= f * m[c * k + j];
        }
    }
    return det;
}

kf_status kf_nn_det_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                         kf_tensor *out) {
    (void)nout;
    kf_type t;
    const kf_type *tp[1] = {&t};
    kf_type_of_tensor(&t, in[0]);
    kf_type o;
    kf_type_unknown(&o);
    KF_TRY(kf_nn_det_shape(n, nin, tp, in, 1, &o));
    KF_TRY(ensure_out(&out[0], o.dtype, o.rank, o.dims));
    const kf_tensor *X = in[0];
    int64_t k = X->dims[X->rank - 1], kk = 0;
    if (out[0].numel) kk = k * k; /* then k * k divides X's element count */
    double *m = kf_malloc(((size_t)kk + 1) * sizeof(double));
    if (!m) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < out[0].numel; b++) {
        for (int64_t i = 0; i < kk; i++) m[i] = kf_get_f64(X, b * kk + i);
        kf_set_f64(&out[0], b, det_lu(m, k));
    }
    kf_free(m);
    return KF_OK;
}
