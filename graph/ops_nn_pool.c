/*
 * ops_nn_pool.c: reference kernels and shape functions of pooling:
 * MaxPool (with Indices), AveragePool, LpPool, their Global forms and
 * MaxUnpool. Windows follow the ONNX geometry rules in ops_nn_util.c; values
 * are combined in double and stored in the input dtype.
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

enum { POOL_MAX, POOL_AVG, POOL_LP };

static const kf_dtype maxpool_types[] = {KF_DT_FLOAT16,  KF_DT_BFLOAT16, KF_DT_FLOAT,
                                         KF_DT_DOUBLE,   KF_DT_INT8,     KF_DT_UINT8,
                                         KF_DT_UNDEFINED};

/* The p of LpPool / GlobalLpPool: a float before opset 2, an int after. */
static kf_status lp_order(const kf_node *n, double *p) {
    const kf_attr *a = kf_attr_find(n, "p");
    *p = 2.0;
    if (a && a->type == KF_ATTR_INT) *p = (double)a->i;
    else if (a && a->type == KF_ATTR_FLOAT) *p = a->f;
    else if (a) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute 'p' must be a number");
    if (!(*p > 0) || !isfinite(*p))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "p must be positive, not %g", *p);
    return KF_OK;
}

static int pool_kind(const kf_node *n) {
    if (strcmp(n->op_type, "MaxPool") == 0 || strcmp(n->op_type, "GlobalMaxPool") == 0)
        return POOL_MAX;
    if (strcmp(n->op_type, "LpPool") == 0 || strcmp(n->op_type, "GlobalLpPool") == 0)
        return POOL_LP;
    return POOL_AVG;
}

/* Which optional attributes the node's opset has. */
static kf_status pool_attrs(const kf_node *n, int kind, bool *use_dil, bool *use_ceil) {
    bool latest = n->opset == 0;
    if (kind == POOL_MAX) {
        *use_dil = *use_ceil = true; /* both absent before opset 10: default values */
    } else if (kind == POOL_AVG) {
        *use_ceil = true;
        *use_dil = latest || n->opset >= 19;
    } else {
        *use_dil = *use_ceil = latest || n->opset >= 18;
    }
    if (!*use_dil) {
        int cnt = 0;
        const int64_t *d = kf_attr_ints(n, "dilations", &cnt);
        for (int i = 0; i < cnt; i++)
            if (d[i] != 1)
                return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "dilations are not part of opset %lld",
                                  (long long)n->opset);
    }
    return KF_OK;
}

/* Output type and geometry of a windowed pool of x. */
static kf_status pool_types(const kf_node *n, const kf_type *x, kf_type *y, kf_nn_geom *g) {
    int kind = pool_kind(n);
    kf_type_unknown(y);
    y->dtype = x->dtype;
    KF_TRY(
        kf_nn_check_dtype(n, x->dtype, "X", kind == POOL_MAX ? maxpool_types : kf_nn_float_types));
    if (x->rank < 0) return KF_OK;
    if (x->rank < 3) return kf_nn_fail(n, KF_ERR_SHAPE, "X must have rank >= 3, not %d", x->rank);
    bool use_dil, use_ceil;
    KF_TRY(pool_attrs(n, kind, &use_dil, &use_ceil));
    int nsp = x->rank - 2;
    KF_TRY(kf_nn_geom_parse(n, nsp, NULL, use_dil, use_ceil, g));
    if (kind == POOL_AVG) {
        int64_t cip = kf_attr_i(n, "count_include_pad", 0);
        if (cip != 0 && cip != 1)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "count_include_pad must be 0 or 1");
    }
    if (kind == POOL_MAX) {
        int64_t so = kf_attr_i(n, "storage_order", 0);
        if (so != 0 && so != 1)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "storage_order must be 0 or 1");
    }
    for (int i = 0; i < nsp; i++) g->in[i] = x->dims[i + 2];
    KF_TRY(kf_nn_geom_forward(n, g));
    y->rank = x->rank;
    for (int d = 0; d < 2; d++) {
        y->dims[d] = x->dims[d];
        y->syms[d] = x->syms[d];
    }
    for (int i = 0; i < nsp; i++) {
        y->dims[i + 2] = g->out[i];
        if (g->out[i] < 0 && x->dims[i + 2] < 0 && g->kernel[i] == 1 && g->stride[i] == 1 &&
            g->pb[i] == 0 && g->pe[i] == 0)
            y->syms[i + 2] = x->syms[i + 2];
    }
    return KF_OK;
}

kf_status kf_nn_pool_shape(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 1 || !in[0]) return KF_OK;
    kf_nn_geom g;
    KF_TRY(pool_types(n, in[0], &out[0], &g));
    if (nout > 1) {
        out[1] = out[0];
        out[1].dtype = KF_DT_INT64;
    }
    return KF_OK;
}

kf_status kf_nn_pool_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                          kf_tensor *out) {
    (void)nin;
    const kf_tensor *X = in[0];
    int kind = pool_kind(n);
    kf_type tx, ty;
    kf_nn_geom g;
    kf_type_of_tensor(&tx, X);
    KF_TRY(pool_types(n, &tx, &ty, &g));
    bool want_idx = kind == POOL_MAX && nout > 1 && n->out[1];
    if (!out[0].data) KF_TRY(kf_tensor_alloc(&out[0], X->dtype, ty.rank, ty.dims));
    if (want_idx && !out[1].data) KF_TRY(kf_tensor_alloc(&out[1], KF_DT_INT64, ty.rank, ty.dims));
    double p = 2.0;
    if (kind == POOL_LP) KF_TRY(lp_order(n, &p));
    bool include_pad = kind == POOL_AVG && kf_attr_i(n, "count_include_pad", 0) == 1;
    bool col_major = kf_attr_i(n, "storage_order", 0) == 1;
    int nsp = g.nsp;
    int64_t insz = 1, outsz = 1, ksz = 1;
    for (int i = 0; i < nsp; i++) {
        insz *= g.in[i];
        outsz *= g.out[i];
        ksz *= g.kernel[i]; /* bounded: each kernel dim fits in its padded input */
    }
    int64_t planes = X->dims[0] * X->dims[1];
    int64_t cstride[KF_MAX_RANK]; /* column-major strides for storage_order 1 */
    for (int i = 0; i < nsp; i++) {
        cstride[i] = 1;
        for (int j = 0; j < i; j++) cstride[i] *= g.in[j];
    }
    double *x = kf_nn_to_f64(X);
    if (!x) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t pos[KF_MAX_RANK], k[KF_MAX_RANK];
    for (int64_t pl = 0; pl < planes; pl++) {
        memset(pos, 0, sizeof pos);
        for (int64_t o = 0; o < outsz; o++) {
            double acc = kind == POOL_MAX ? NAN : 0.0;
            int64_t best = -1, count = 0;
            memset(k, 0, sizeof k);
            for (int64_t t = 0; t < ksz; t++) {
                int64_t off = 0, coff = 0;
                bool inside = true, in_padded = true;
                for (int i = 0; i < nsp; i++) {
                    int64_t q = pos[i] * g.stride[i] - g.pb[i] + k[i] * g.dil[i];
                    if (q < 0 || q >= g.in[i]) {
                        inside = false;
                        if (q < -g.pb[i] || q >= g.in[i] + g.pe[i]) in_padded = false;
                    }
                    off = off * g.in[i] + q;
                    coff += q * cstride[i];
                }
                kf_nn_next(nsp, g.kernel, k);
                if (include_pad && in_padded) count++;
                if (!inside) continue;
                double v = x[pl * insz + off];
                if (!include_pad) count++;
                if (kind == POOL_MAX) {
                    if (!isnan(v) && (best < 0 || isnan(acc) || v > acc)) {
                        acc = v;
                        best = col_major ? coff : off;
                    } else if (best < 0 && isnan(v)) {
                        best = col_major ? coff : off;
                    }
                } else if (kind == POOL_AVG) {
                    acc += v;
                } else {
                    acc += pow(fabs(v), p);
                }
            }
            double r;
            if (kind == POOL_MAX) r = best < 0 ? -INFINITY : acc;
            else if (kind == POOL_AVG) r = acc / (double)count;
            else r = pow(acc, 1.0 / p);
            kf_set_f64(&out[0], pl * outsz + o, r);
            if (want_idx) kf_set_i64(&out[1], pl * outsz + o, best < 0 ? -1 : pl * insz + best);
            kf_nn_next(nsp, g.out, pos);
        }
    }
    kf_free(x);
    return KF_OK;
}

/* ---- Global pools -------------------------------------------------------------------- */

kf_status kf_nn_gpool_shape(const kf_node *n, int nin, const kf_type *const *in,
                            const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "X", kf_nn_float_types));
    out[0] = *in[0];
    if (in[0]->rank < 0) return KF_OK;
    if (in[0]->rank < 2)
        return kf_nn_fail(n, KF_ERR_SHAPE, "X must have rank >= 2, not %d", in[0]->rank);
    for (int d = 2; d < in[0]->rank; d++) {
        out[0].dims[d] = 1;
        out[0].syms[d] = 0;
    }
    return KF_OK;
}

kf_status kf_nn_gpool_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                           kf_tensor *out) {
    kf_type tx, ty;
    const kf_type *tp[1] = {&tx};
    kf_type_of_tensor(&tx, in[0]);
    kf_type_unknown(&ty);
    KF_TRY(kf_nn_gpool_shape(n, nin, tp, in, nout, &ty));
    if (!out[0].data) KF_TRY(kf_tensor_alloc(&out[0], ty.dtype, ty.rank, ty.dims));
    int kind = pool_kind(n);
    double p = 2.0;
    if (kind == POOL_LP) KF_TRY(lp_order(n, &p));
    const kf_tensor *X = in[0];
    int64_t planes = X->dims[0] * X->dims[1];
    int64_t sz = planes ? X->numel / planes : 0;
    for (int64_t pl = 0; pl < planes; pl++) {
        double acc = kind == POOL_MAX ? NAN : 0.0;
        for (int64_t i = 0; i < sz; i++) {
            double v = kf_get_f64(X, pl * sz + i);
            if (kind == POOL_MAX) {
                if (!isnan(v) && (isnan(acc) || v > acc)) acc = v;
            } else if (kind == POOL_AVG) {
                acc += v;
            } else {
                acc += pow(fabs(v), p);
            }
        }
        if (kind == POOL_AVG) acc /= (double)sz;
        else if (kind == POOL_LP) acc = pow(acc, 1.0 / p);
        else if (sz == 0) acc = -INFINITY;
        kf_set_f64(&out[0], pl, acc);
    }
    return KF_OK;
}

/* ---- MaxUnpool ------------------------------------------------------------------------- */

/* The unpooled shape (x rank and dims, unknown dims -1) from the attributes. */
static kf_status unpool_dims(const kf_node *n, const kf_type *x, kf_type *y) {
    kf_type_unknown(y);
    y->dtype = x->dtype;
    KF_TRY(kf_nn_check_dtype(n, x->dtype, "X", kf_nn_float_types));
    if (x->rank < 0) return KF_OK;
    if (x->rank < 3) return kf_nn_fail(n, KF_ERR_SHAPE, "X must have rank >= 3, not %d", x->rank);
    kf_nn_geom g;
    KF_TRY(kf_nn_geom_parse(n, x->rank - 2, NULL, false, false, &g));
    if (g.auto_pad != KF_NN_NOTSET)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "MaxUnpool has no auto_pad");
    y->rank = x->rank;
    for (int d = 0; d < 2; d++) {
        y->dims[d] = x->dims[d];
        y->syms[d] = x->syms[d];
    }
    for (int i = 0; i < g.nsp; i++) {
        int64_t in = x->dims[i + 2], v;
        y->dims[i + 2] = -1;
        if (in < 0) continue;
        if (in == 0) return kf_nn_fail(n, KF_ERR_SHAPE, "spatial dim %d of X is 0", i);
        if (!kf_mul_ok(in - 1, g.stride[i], &v) || !kf_add_ok(v, g.kernel[i], &v))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output size of dim %d overflows", i);
        int64_t pads;
        if (!kf_add_ok(g.pb[i], g.pe[i], &pads) || pads > v)
            return kf_nn_fail(n, KF_ERR_SHAPE, "pads exceed the output size of dim %d", i);
        y->dims[i + 2] = v - pads;
    }
    return KF_OK;
}

/* The requested output_shape, validated against the unpooled shape u. */
static kf_status unpool_request(const kf_node *n, const kf_tensor *os, const kf_type *u,
                                kf_type *y) {
    int64_t *v = NULL, cnt = 0;
    KF_TRY(kf_read_ints(n, os, "output_shape", &v, &cnt));
    kf_status st = KF_OK;
    if (u->rank >= 0 && cnt != u->rank) {
        st = kf_nn_fail(n, KF_ERR_SHAPE, "output_shape has %lld entries, X has rank %d",
                        (long long)cnt, u->rank);
        goto done;
    }
    if (cnt > KF_MAX_RANK) {
        st = kf_nn_fail(n, KF_ERR_SHAPE, "output_shape has too many entries");
        goto done;
    }
    *y = *u;
    y->rank = (int)cnt;
    for (int d = 0; d < (int)cnt; d++) {
        bool spatial = d >= 2;
        if (v[d] < 0 || (u->dims[d] >= 0 && (spatial ? v[d] < u->dims[d] : v[d] != u->dims[d]))) {
            st = kf_nn_fail(n, KF_ERR_SHAPE,
                            "output_shape[%d] = %lld does not hold the unpooled size %lld", d,
                            (long long)v[d], (long long)u->dims[d]);
            goto done;
        }
        y->dims[d] = v[d];
        if (v[d] != u->dims[d]) y->syms[d] = 0;
    }
done:
    kf_free(v);
    return st;
}

kf_status kf_nn_unpool_shape(const kf_node *n, int nin, const kf_type *const *in,
                             const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 2 || !in[0]) return KF_OK;
    if (in[1] && in[1]->dtype && in[1]->dtype != KF_DT_INT64)
        return kf_nn_fail(n, KF_ERR_SHAPE, "indices must be int64");
    kf_type u;
    KF_TRY(unpool_dims(n, in[0], &u));
    if (nin < 3 || !in[2]) {
        out[0] = u;
        return KF_OK;
    }
    out[0].dtype = u.dtype;
    if (val && val[2]) return unpool_request(n, val[2], &u, &out[0]);
    out[0].rank = u.rank;
    for (int d = 0; d < u.rank; d++) out[0].dims[d] = d < 2 ? u.dims[d] : -1;
    return KF_OK;
}

/*
 * Scatters X into the unpooled shape at the flat positions I (as the ONNX
 * reference does), then places that block at the origin of output_shape.
 */
kf_status kf_nn_unpool_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out) {
    (void)nout;
    const kf_tensor *X = in[0], *I = in[1], *os = nin > 2 ? in[2] : NULL;
    if (I->dtype != KF_DT_INT64) return kf_nn_fail(n, KF_ERR_SHAPE, "indices must be int64");
    if (I->rank != X->rank || memcmp(I->dims, X->dims, sizeof(int64_t) * (size_t)X->rank))
        return kf_nn_fail(n, KF_ERR_SHAPE, "indices must have the shape of X");
    kf_type tx, u, y;
    kf_type_of_tensor(&tx, X);
    KF_TRY(unpool_dims(n, &tx, &u));
    y = u;
    if (os) KF_TRY(unpool_request(n, os, &u, &y));
    if (!out[0].data) KF_TRY(kf_tensor_alloc(&out[0], X->dtype, y.rank, y.dims));
    int64_t unum;
    KF_TRY(kf_shape_numel(u.rank, u.dims, kf_dtype_size(X->dtype), &unum));
    int64_t ustr[KF_MAX_RANK], ystr[KF_MAX_RANK], idx[KF_MAX_RANK];
    kf_strides(u.rank, u.dims, ustr);
    kf_strides(y.rank, y.dims, ystr);
    for (int64_t j = 0; j < X->numel; j++) {
        int64_t at = kf_get_i64(I, j);
        if (at < 0 || at >= unum)
            return kf_nn_fail(n, KF_ERR_RUNTIME, "index %lld at position %lld is outside [0, %lld)",
                              (long long)at, (long long)j, (long long)unum);
        kf_unravel(u.rank, u.dims, at, idx);
        kf_set_f64(&out[0], kf_ravel(y.rank, ystr, idx), kf_get_f64(X, j));
    }
    return KF_OK;
}
