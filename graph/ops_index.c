/*
 * ops_index.c: shape functions and reference kernels for the indexing family:
 * Gather, GatherElements, GatherND, ScatterND, ScatterElements (and the old
 * Scatter), OneHot, NonZero, Compress, Unique, ReverseSequence and
 * TensorScatter. They move
 * elements bitwise (strings are deep-copied); every index read from a tensor
 * is range-checked and a bad one is a KF_ERR_RUNTIME naming the node.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kf_ref.h"

/* ---- helpers ------------------------------------------------------------ */

/* Copies count elements src[si..] to dst[di..] (same dtype); strings are
 * deep-copied, replacing what dst held. */
static kf_status copy_block(kf_tensor *dst, int64_t di, const kf_tensor *src, int64_t si,
                            int64_t count) {
    if (count <= 0) return KF_OK;
    if (src->dtype == KF_DT_STRING) {
        kf_bytes *d = (kf_bytes *)dst->data + di;
        const kf_bytes *s = (const kf_bytes *)src->data + si;
        for (int64_t k = 0; k < count; k++) {
            char *p = kf_strndup(s[k].ptr ? s[k].ptr : "", s[k].len);
            if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory copying strings");
            kf_free(d[k].ptr);
            d[k].ptr = p;
            d[k].len = s[k].len;
        }
        return KF_OK;
    }
    size_t esz = kf_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)di * esz, (const char *)src->data + (size_t)si * esz,
           (size_t)count * esz);
    return KF_OK;
}

/* Element i of index tensor t, negative values counted from dim; anything
 * outside [-dim, dim) is a run-time error. */
static kf_status read_index(const kf_node *n, const kf_tensor *t, int64_t i, int64_t dim,
                            int64_t *out) {
    int64_t v = kf_get_i64(t, i);
    int64_t w = v < 0 ? v + dim : v;
    if (w < 0 || w >= dim)
        return kf_node_fail(n, KF_ERR_RUNTIME, "index %lld is out of range for a dimension of size %lld",
                     (long long)v, (long long)dim);
    *out = w;
    return KF_OK;
}

static int64_t prod(const int64_t *dims, int lo, int hi) {
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d]; /* dims of a live tensor: no overflow */
    return p;
}

/* Copies dims[lo..hi) of a type into out at position at (dims and syms). */
static void put_dims(kf_type *out, int at, const kf_type *src, int lo, int hi) {
    for (int d = lo; d < hi; d++, at++) {
        out->dims[at] = src->dims[d];
        out->syms[at] = src->syms[d];
    }
}

static bool is_index_dtype(kf_dtype dt) { return dt == KF_DT_INT32 || dt == KF_DT_INT64; }

/* ---- Gather ----------------------------------------------------------------- */

kf_status kf_index_shape_gather(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0], *ix = in[1];
    out[0].dtype = x->dtype;
    if (x->rank < 0 || !ix || ix->rank < 0) return KF_OK;
    if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "data must have rank >= 1");
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
    int r = x->rank + ix->rank - 1;
    if (r > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KF_MAX_RANK);
    out[0].rank = r;
    put_dims(&out[0], 0, x, 0, axis);
    put_dims(&out[0], axis, ix, 0, ix->rank);
    put_dims(&out[0], axis + ix->rank, x, axis + 1, x->rank);
    return KF_OK;
}

kf_status kf_index_eval_gather(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *ix = in[1];
    if (!is_index_dtype(ix->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "indices must be int32 or int64, not %s", kf_dtype_name(ix->dtype));
    if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "data must have rank >= 1");
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
    int r = x->rank + ix->rank - 1;
    if (r > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KF_MAX_RANK);
    int64_t dims[KF_MAX_RANK];
    memcpy(dims, x->dims, sizeof(int64_t) * (size_t)axis);
    memcpy(dims + axis, ix->dims, sizeof(int64_t) * (size_t)ix->rank);
    memcpy(dims + axis + ix->rank, x->dims + axis + 1, sizeof(int64_t) * (size_t)(x->rank - axis - 1));
    int64_t outer = prod(x->dims, 0, axis), adim = x->dims[axis];
    int64_t inner = prod(x->dims, axis + 1, x->rank), nidx = ix->numel, w = 0;
    for (int64_t j = 0; j < nidx; j++) KF_TRY(read_index(n, ix, j, adim, &w));
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, r, dims));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < nidx; j++) {
            KF_TRY(read_index(n, ix, j, adim, &w));
            KF_TRY(copy_block(&out[0], (o * nidx + j) * inner, x, (o * adim + w) * inner, inner));
        }
    return KF_OK;
}

/* ---- GatherElements ---------------------------------------------------------- */

kf_status kf_index_shape_gather_elements(const kf_node *n, int nin, const kf_type *const *in,
                                         const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    if (in[1]) out[0] = *in[1];
    out[0].dtype = in[0]->dtype;
    if (in[0]->rank >= 0 && in[1] && in[1]->rank >= 0 && in[0]->rank != in[1]->rank)
        return kf_node_fail(n, KF_ERR_SHAPE, "indices rank %d differs from data rank %d", in[1]->rank, in[0]->rank);
    return KF_OK;
}

/* Checks the ScatterElements/GatherElements shape rule: same rank as data,
 * no larger than data on every axis but `axis`. */
static kf_status check_elements_shape(const kf_node *n, const kf_tensor *x, const kf_tensor *ix,
                                      int *axis) {
    if (!is_index_dtype(ix->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "indices must be int32 or int64, not %s", kf_dtype_name(ix->dtype));
    if (x->rank < 1 || ix->rank != x->rank)
        return kf_node_fail(n, KF_ERR_SHAPE, "indices rank %d must equal data rank %d (>= 1)", ix->rank, x->rank);
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, axis));
    for (int d = 0; d < x->rank; d++)
        if (d != *axis && ix->dims[d] > x->dims[d])
            return kf_node_fail(n, KF_ERR_SHAPE, "indices dim %d (%lld) exceeds data dim (%lld)", d,
                         (long long)ix->dims[d], (long long)x->dims[d]);
    return KF_OK;
}

kf_status kf_index_eval_gather_elements(const kf_node *n, int nin, const kf_tensor *const *in,
                                        int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *ix = in[1];
    int axis;
    KF_TRY(check_elements_shape(n, x, ix, &axis));
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, ix->rank, ix->dims));
    int64_t xs[KF_MAX_RANK], pos[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, xs);
    for (int64_t i = 0; i < ix->numel; i++) {
        kf_unravel(ix->rank, ix->dims, i, pos);
        KF_TRY(read_index(n, ix, i, x->dims[axis], &pos[axis]));
        KF_TRY(copy_block(&out[0], i, x, kf_ravel(x->rank, xs, pos), 1));
    }
    return KF_OK;
}

/* ---- GatherND ------------------------------------------------------------------ */

kf_status kf_index_shape_gather_nd(const kf_node *n, int nin, const kf_type *const *in,
                                   const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0], *ix = in[1];
    out[0].dtype = x->dtype;
    if (x->rank < 0 || !ix || ix->rank < 0) return KF_OK;
    int64_t b = kf_attr_i(n, "batch_dims", 0);
    if (ix->rank < 1 || x->rank < 1 || b < 0 || b >= ix->rank || b >= x->rank)
        return kf_node_fail(n, KF_ERR_SHAPE, "ranks %d (data) and %d (indices) do not fit batch_dims %lld",
                     x->rank, ix->rank, (long long)b);
    int64_t m = ix->dims[ix->rank - 1];
    if (m < 0) return KF_OK;
    if (m > x->rank - b)
        return kf_node_fail(n, KF_ERR_SHAPE, "index tuples of length %lld exceed data rank %d - batch_dims",
                     (long long)m, x->rank);
    out[0].rank = ix->rank - 1 + x->rank - (int)b - (int)m;
    put_dims(&out[0], 0, ix, 0, ix->rank - 1);
    put_dims(&out[0], ix->rank - 1, x, (int)(b + m), x->rank);
    return KF_OK;
}

kf_status kf_index_eval_gather_nd(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                  kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *ix = in[1];
    if (ix->dtype != KF_DT_INT64)
        return kf_node_fail(n, KF_ERR_SHAPE, "indices must be int64, not %s", kf_dtype_name(ix->dtype));
    int64_t b64 = kf_attr_i(n, "batch_dims", 0);
    if (ix->rank < 1 || x->rank < 1 || b64 < 0 || b64 >= ix->rank || b64 >= x->rank)
        return kf_node_fail(n, KF_ERR_SHAPE, "ranks %d (data) and %d (indices) do not fit batch_dims %lld",
                     x->rank, ix->rank, (long long)b64);
    int b = (int)b64, q = ix->rank;
    int64_t m = ix->dims[q - 1];
    if (m > x->rank - b)
        return kf_node_fail(n, KF_ERR_SHAPE, "index tuples of length %lld exceed data rank %d - batch_dims",
                     (long long)m, x->rank);
    for (int d = 0; d < b; d++)
        if (ix->dims[d] != x->dims[d])
            return kf_node_fail(n, KF_ERR_SHAPE, "batch dim %d differs: %lld (indices) vs %lld (data)", d,
                         (long long)ix->dims[d], (long long)x->dims[d]);
    int r = q - 1 + x->rank - b - (int)m;
    int64_t dims[KF_MAX_RANK];
    memcpy(dims, ix->dims, sizeof(int64_t) * (size_t)(q - 1));
    memcpy(dims + q - 1, x->dims + b + m, sizeof(int64_t) * (size_t)(x->rank - b - m));
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, r, dims));
    int64_t nb = prod(x->dims, 0, b), nt = prod(ix->dims, b, q - 1);
    int64_t slice = prod(x->dims, b + (int)m, x->rank), bstride = prod(x->dims, b, x->rank);
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t t = 0; t < nt; t++) {
            int64_t base = (bi * nt + t) * m, off = bi * bstride;
            for (int64_t k = 0; k < m; k++) {
                int64_t w = 0;
                KF_TRY(read_index(n, ix, base + k, x->dims[b + k], &w));
                off += w * prod(x->dims, b + (int)k + 1, x->rank);
            }
            KF_TRY(copy_block(&out[0], (bi * nt + t) * slice, x, off, slice));
        }
    return KF_OK;
}

/* ---- ScatterND / ScatterElements / Scatter ----------------------------------- */

enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

kf_status kf_index_shape_scatter(const kf_node *n, int nin, const kf_type *const *in,
                                 const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)val;
    if (nin >= 1 && in[0] && nout >= 1) out[0] = *in[0];
    return KF_OK;
}

/* The reduction attribute (opset 16+) and whether dtype dt supports it. */
static kf_status parse_reduction(const kf_node *n, kf_dtype dt, int *red) {
    *red = RED_NONE;
    if (n->op == KF_OP_SCATTER) return KF_OK;
    const char *s = kf_attr_s(n, "reduction", "none");
    if (strcmp(s, "none") == 0) *red = RED_NONE;
    else if (strcmp(s, "add") == 0) *red = RED_ADD;
    else if (strcmp(s, "mul") == 0) *red = RED_MUL;
    else if (strcmp(s, "max") == 0) *red = RED_MAX;
    else if (strcmp(s, "min") == 0) *red = RED_MIN;
    else return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown reduction '%s'", s);
    if (*red == RED_NONE) return KF_OK;
    if (dt == KF_DT_STRING || ((dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) && *red >= RED_MAX))
        return kf_node_fail(n, KF_ERR_UNSUPPORTED, "reduction '%s' on %s", s, kf_dtype_name(dt));
    return KF_OK;
}

static double red_f64(double a, double b, int red) {
    switch (red) {
    case RED_ADD: return a + b;
    case RED_MUL: return a * b;
    case RED_MAX: return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b);
    default: return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b);
    }
}

/* o[oi] = reduce(o[oi], u[ui]); numpy semantics: integers wrap, bool add/max
 * is "or", mul/min is "and", NaN propagates through max/min. */
static kf_status scatter_one(kf_tensor *o, int64_t oi, const kf_tensor *u, int64_t ui, int red) {
    if (red == RED_NONE) return copy_block(o, oi, u, ui, 1);
    kf_dtype dt = o->dtype;
    if (kf_dtype_is_float(dt)) {
        kf_set_f64(o, oi, red_f64(kf_get_f64(o, oi), kf_get_f64(u, ui), red));
    } else if (dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) {
        double a[2], b[2];
        for (int k = 0; k < 2; k++) {
            a[k] = dt == KF_DT_COMPLEX64 ? ((float *)o->data)[2 * oi + k] : ((double *)o->data)[2 * oi + k];
            b[k] = dt == KF_DT_COMPLEX64 ? ((const float *)u->data)[2 * ui + k]
                                         : ((const double *)u->data)[2 * ui + k];
        }
        double re = red == RED_ADD ? a[0] + b[0] : a[0] * b[0] - a[1] * b[1];
        double im = red == RED_ADD ? a[1] + b[1] : a[0] * b[1] + a[1] * b[0];
        if (dt == KF_DT_COMPLEX64) {
            ((float *)o->data)[2 * oi] = (float)re;
            ((float *)o->data)[2 * oi + 1] = (float)im;
        } else {
            ((double *)o->data)[2 * oi] = re;
            ((double *)o->data)[2 * oi + 1] = im;
        }
    } else if (dt == KF_DT_BOOL) {
        int64_t a = kf_get_i64(o, oi), b = kf_get_i64(u, ui);
        kf_set_i64(o, oi, (red == RED_ADD || red == RED_MAX) ? (a || b) : (a && b));
    } else if (dt == KF_DT_UINT64) {
        uint64_t a = kf_get_u64(o, oi), b = kf_get_u64(u, ui), r;
        if (red == RED_ADD) r = a + b;
        else if (red == RED_MUL) r = a * b;
        else if (red == RED_MAX) r = a > b ? a : b;
        else r = a < b ? a : b;
        kf_set_u64(o, oi, r);
    } else {
        int64_t a = kf_get_i64(o, oi), b = kf_get_i64(u, ui), r;
        if (red == RED_ADD) r = (int64_t)((uint64_t)a + (uint64_t)b);
        else if (red == RED_MUL) r = (int64_t)((uint64_t)a * (uint64_t)b);
        else if (red == RED_MAX) r = a > b ? a : b;
        else r = a < b ? a : b;
        kf_set_i64(o, oi, r);
    }
    return KF_OK;
}

kf_status kf_index_eval_scatter_nd(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                   kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *ix = in[1], *up = in[2];
    if (ix->dtype != KF_DT_INT64)
        return kf_node_fail(n, KF_ERR_SHAPE, "indices must be int64, not %s", kf_dtype_name(ix->dtype));
    if (up->dtype != x->dtype)
        return kf_node_fail(n, KF_ERR_SHAPE, "updates dtype %s differs from data dtype %s",
                     kf_dtype_name(up->dtype), kf_dtype_name(x->dtype));
    int red;
    KF_TRY(parse_reduction(n, x->dtype, &red));
    int q = ix->rank;
    if (x->rank < 1 || q < 1) return kf_node_fail(n, KF_ERR_SHAPE, "data and indices must have rank >= 1");
    int64_t k = ix->dims[q - 1];
    if (k > x->rank) return kf_node_fail(n, KF_ERR_SHAPE, "index tuples of length %lld exceed data rank %d", (long long)k, x->rank);
    bool ok = up->rank == q - 1 + x->rank - (int)k;
    for (int d = 0; ok && d < q - 1; d++) ok = up->dims[d] == ix->dims[d];
    for (int d = (int)k; ok && d < x->rank; d++) ok = up->dims[q - 1 + d - k] == x->dims[d];
    if (!ok) return kf_node_fail(n, KF_ERR_SHAPE, "updates shape must be indices.shape[:-1] + data.shape[k:]");
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    KF_TRY(copy_block(&out[0], 0, x, 0, x->numel));
    int64_t nt = prod(ix->dims, 0, q - 1), slice = prod(x->dims, (int)k, x->rank);
    for (int64_t t = 0; t < nt; t++) {
        int64_t off = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t w = 0;
            KF_TRY(read_index(n, ix, t * k + j, x->dims[j], &w));
            off += w * prod(x->dims, (int)j + 1, x->rank);
        }
        for (int64_t s = 0; s < slice; s++) KF_TRY(scatter_one(&out[0], off + s, up, t * slice + s, red));
    }
    return KF_OK;
}

kf_status kf_index_eval_scatter_elements(const kf_node *n, int nin, const kf_tensor *const *in,
                                         int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *ix = in[1], *up = in[2];
    int axis, red;
    KF_TRY(check_elements_shape(n, x, ix, &axis));
    bool same = up->dtype == x->dtype && up->rank == ix->rank;
    for (int d = 0; same && d < ix->rank; d++) same = up->dims[d] == ix->dims[d];
    if (!same) return kf_node_fail(n, KF_ERR_SHAPE, "updates must have the indices' shape and the data's dtype");
    KF_TRY(parse_reduction(n, x->dtype, &red));
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    KF_TRY(copy_block(&out[0], 0, x, 0, x->numel));
    int64_t xs[KF_MAX_RANK], pos[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, xs);
    for (int64_t i = 0; i < ix->numel; i++) {
        kf_unravel(ix->rank, ix->dims, i, pos);
        KF_TRY(read_index(n, ix, i, x->dims[axis], &pos[axis]));
        KF_TRY(scatter_one(&out[0], kf_ravel(x->rank, xs, pos), up, i, red));
    }
    return KF_OK;
}

/* ---- OneHot ------------------------------------------------------------------ */

static kf_status read_depth(const kf_node *n, const kf_tensor *t, int64_t *depth) {
    if (t->numel != 1 || t->rank > 1 || t->dtype == KF_DT_STRING)
        return kf_node_fail(n, KF_ERR_SHAPE, "depth must be a numeric scalar or one-element tensor");
    double v = kf_get_f64(t, 0);
    if (!(v >= 0)) return kf_node_fail(n, KF_ERR_RUNTIME, "depth %g is negative", v);
    *depth = kf_get_i64(t, 0);
    return KF_OK;
}

kf_status kf_index_shape_one_hot(const kf_node *n, int nin, const kf_type *const *in,
                                 const kf_tensor *const *val, int nout, kf_type *out) {
    if (nin < 3 || nout < 1) return KF_OK;
    if (in[2]) out[0].dtype = in[2]->dtype;
    if (!in[0] || in[0]->rank < 0) return KF_OK;
    int r = in[0]->rank + 1, axis;
    if (r > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KF_MAX_RANK);
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), r, &axis));
    out[0].rank = r;
    put_dims(&out[0], 0, in[0], 0, axis);
    put_dims(&out[0], axis + 1, in[0], axis, in[0]->rank);
    out[0].dims[axis] = -1;
    if (val && val[1]) KF_TRY(read_depth(n, val[1], &out[0].dims[axis]));
    return KF_OK;
}

kf_status kf_index_eval_one_hot(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *ix = in[0], *values = in[2];
    if (ix->dtype == KF_DT_STRING || ix->dtype == KF_DT_BOOL || ix->dtype == KF_DT_COMPLEX64 ||
        ix->dtype == KF_DT_COMPLEX128)
        return kf_node_fail(n, KF_ERR_SHAPE, "indices must be numeric, not %s", kf_dtype_name(ix->dtype));
    if (values->numel != 2)
        return kf_node_fail(n, KF_ERR_SHAPE, "values must hold two elements [off, on], not %lld",
                     (long long)values->numel);
    int64_t depth = 0;
    KF_TRY(read_depth(n, in[1], &depth));
    int r = ix->rank + 1, axis;
    if (r > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KF_MAX_RANK);
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), r, &axis));
    int64_t dims[KF_MAX_RANK];
    memcpy(dims, ix->dims, sizeof(int64_t) * (size_t)axis);
    dims[axis] = depth;
    memcpy(dims + axis + 1, ix->dims + axis, sizeof(int64_t) * (size_t)(ix->rank - axis));
    KF_TRY(kf_output_prepare(n, &out[0], values->dtype, r, dims));
    /* opset 9 defines only [0, depth); opset 11 adds [-depth, 0) */
    bool wrap = n->opset == 0 || n->opset >= 11;
    int64_t outer = prod(ix->dims, 0, axis), inner = prod(ix->dims, axis, ix->rank);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t v = kf_get_i64(ix, o * inner + i);
            if (kf_dtype_is_float(ix->dtype)) { /* a non-integral index matches no class */
                double f = kf_get_f64(ix, o * inner + i);
                if (floor(f) != f) v = -1 - depth;
            }
            if (v < 0 && wrap) v += depth;
            for (int64_t d = 0; d < depth; d++)
                KF_TRY(copy_block(&out[0], (o * depth + d) * inner + i, values, v == d ? 1 : 0, 1));
        }
    return KF_OK;
}

/* ---- NonZero ------------------------------------------------------------------- */

static bool elem_nonzero(const kf_tensor *t, int64_t i) {
    switch (t->dtype) {
    case KF_DT_STRING: return ((const kf_bytes *)t->data)[i].len != 0;
    case KF_DT_COMPLEX64:
        return ((const float *)t->data)[2 * i] != 0 || ((const float *)t->data)[2 * i + 1] != 0;
    case KF_DT_COMPLEX128:
        return ((const double *)t->data)[2 * i] != 0 || ((const double *)t->data)[2 * i + 1] != 0;
    default: return kf_dtype_is_float(t->dtype) ? kf_get_f64(t, i) != 0 : kf_get_i64(t, i) != 0;
    }
}

kf_status kf_index_shape_non_zero(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    if (nin < 1 || nout < 1) return KF_OK;
    out[0].dtype = KF_DT_INT64;
    out[0].rank = 2;
    out[0].dims[0] = (in[0] && in[0]->rank >= 0) ? (in[0]->rank ? in[0]->rank : 1) : -1;
    out[0].dims[1] = -1;
    if (val && val[0]) {
        int64_t c = 0;
        for (int64_t i = 0; i < val[0]->numel; i++) c += elem_nonzero(val[0], i);
        out[0].dims[1] = c;
    }
    return KF_OK;
}

kf_status kf_index_eval_non_zero(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0];
    int64_t c = 0, pos[KF_MAX_RANK];
    for (int64_t i = 0; i < x->numel; i++) c += elem_nonzero(x, i);
    int coords = x->rank ? x->rank : 1; /* a scalar reads as one element of a 1-D tensor */
    int64_t dims[2] = {coords, c};
    KF_TRY(kf_output_prepare(n, &out[0], KF_DT_INT64, 2, dims));
    int64_t *o = out[0].data, k = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        if (!elem_nonzero(x, i)) continue;
        if (x->rank == 0) {
            o[k++] = 0;
            continue;
        }
        kf_unravel(x->rank, x->dims, i, pos);
        for (int d = 0; d < x->rank; d++) o[d * c + k] = pos[d];
        k++;
    }
    return KF_OK;
}

/* ---- Compress ------------------------------------------------------------------ */

/* Selected count of condition over a dimension of length dim; a true entry
 * past the end is a run-time error. */
static kf_status compress_count(const kf_node *n, const kf_tensor *cond, int64_t dim, int64_t *count) {
    if (cond->dtype != KF_DT_BOOL || cond->rank != 1)
        return kf_node_fail(n, KF_ERR_SHAPE, "condition must be a 1-D bool tensor");
    int64_t c = 0;
    for (int64_t i = 0; i < cond->numel; i++) {
        if (!kf_get_i64(cond, i)) continue;
        if (i >= dim)
            return kf_node_fail(n, KF_ERR_RUNTIME, "condition selects entry %lld of a dimension of size %lld",
                         (long long)i, (long long)dim);
        c++;
    }
    *count = c;
    return KF_OK;
}

kf_status kf_index_shape_compress(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    bool has_axis = kf_attr_find(n, "axis") != NULL;
    if (!has_axis) {
        out[0].rank = 1;
        out[0].dims[0] = -1;
        if (val && val[1] && kf_type_is_static(x)) {
            int64_t numel = prod(x->dims, 0, x->rank);
            KF_TRY(compress_count(n, val[1], numel, &out[0].dims[0]));
        }
        return KF_OK;
    }
    if (x->rank < 0) return KF_OK;
    int axis;
    if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "input must have rank >= 1 when axis is given");
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
    out[0] = *x;
    out[0].dims[axis] = -1;
    out[0].syms[axis] = 0;
    if (val && val[1] && x->dims[axis] >= 0) KF_TRY(compress_count(n, val[1], x->dims[axis], &out[0].dims[axis]));
    return KF_OK;
}

kf_status kf_index_eval_compress(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *cond = in[1];
    int64_t outer = 1, dim = x->numel, inner = 1, count = 0, dims[KF_MAX_RANK];
    int rank = 1;
    if (kf_attr_find(n, "axis")) {
        int axis;
        if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "input must have rank >= 1 when axis is given");
        KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
        outer = prod(x->dims, 0, axis);
        dim = x->dims[axis];
        inner = prod(x->dims, axis + 1, x->rank);
        KF_TRY(compress_count(n, cond, dim, &count));
        rank = x->rank;
        memcpy(dims, x->dims, sizeof(int64_t) * (size_t)rank);
        dims[axis] = count;
    } else {
        KF_TRY(compress_count(n, cond, dim, &count));
        dims[0] = count;
    }
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, rank, dims));
    for (int64_t o = 0; o < outer; o++) {
        int64_t k = 0;
        for (int64_t j = 0; j < cond->numel && j < dim; j++) {
            if (!kf_get_i64(cond, j)) continue;
            KF_TRY(copy_block(&out[0], (o * count + k) * inner, x, (o * dim + j) * inner, inner));
            k++;
        }
    }
    return KF_OK;
}

/* ---- Unique -------------------------------------------------------------------- */

/* Total order on elements i and j of t: numbers ascending with every NaN
 * equal and last (numpy's np.unique), strings bytewise, complex by (re, im). */
static int cmp_elem(const kf_tensor *t, int64_t i, int64_t j) {
    kf_dtype dt = t->dtype;
    if (kf_dtype_is_float(dt) || dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) {
        int parts = kf_dtype_is_float(dt) ? 1 : 2;
        for (int p = 0; p < parts; p++) {
            double a, b;
            if (dt == KF_DT_COMPLEX64) {
                a = ((const float *)t->data)[2 * i + p];
                b = ((const float *)t->data)[2 * j + p];
            } else if (dt == KF_DT_COMPLEX128) {
                a = ((const double *)t->data)[2 * i + p];
                b = ((const double *)t->data)[2 * j + p];
            } else {
                a = kf_get_f64(t, i);
                b = kf_get_f64(t, j);
            }
            if (isnan(a) || isnan(b)) {
                if (isnan(a) && isnan(b)) continue;
                return isnan(a) ? 1 : -1;
            }
            if (a != b) return a < b ? -1 : 1;
        }
        return 0;
    }
    if (dt == KF_DT_STRING) {
        const kf_bytes *a = (const kf_bytes *)t->data + i, *b = (const kf_bytes *)t->data + j;
        size_t m = a->len < b->len ? a->len : b->len;
        int c = m ? memcmp(a->ptr, b->ptr, m) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a->len == b->len ? 0 : (a->len < b->len ? -1 : 1);
    }
    if (kf_dtype_is_signed(dt)) {
        int64_t a = kf_get_i64(t, i), b = kf_get_i64(t, j);
        return a == b ? 0 : (a < b ? -1 : 1);
    }
    uint64_t a = kf_get_u64(t, i), b = kf_get_u64(t, j);
    return a == b ? 0 : (a < b ? -1 : 1);
}

/* The items Unique compares: slices j = 0..count of x along an axis (each
 * outer*inner elements) or, without an axis, single elements. */
typedef struct slices {
    const kf_tensor *x;
    int64_t count, outer, inner;
} slices;

static int cmp_slices(const slices *s, int64_t a, int64_t b) {
    for (int64_t o = 0; o < s->outer; o++)
        for (int64_t i = 0; i < s->inner; i++) {
            int c = cmp_elem(s->x, (o * s->count + a) * s->inner + i, (o * s->count + b) * s->inner + i);
            if (c) return c;
        }
    return 0;
}

/* Stable bottom-up merge sort of ids[0..m) by cmp_slices; tmp holds m. */
static void sort_ids(const slices *s, int64_t *ids, int64_t *tmp, int64_t m) {
    for (int64_t w = 1; w < m; w *= 2) {
        for (int64_t lo = 0; lo < m; lo += 2 * w) {
            int64_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            int64_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = cmp_slices(s, ids[b], ids[a]) < 0 ? ids[b++] : ids[a++];
            while (a < mid) tmp[k++] = ids[a++];
            while (b < hi) tmp[k++] = ids[b++];
        }
        memcpy(ids, tmp, sizeof(int64_t) * (size_t)m);
    }
}

kf_status kf_index_shape_unique(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 1 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0];
    bool has_axis = kf_attr_find(n, "axis") != NULL;
    int axis = 0;
    if (has_axis && x->rank >= 0) {
        if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "input must have rank >= 1 when axis is given");
        KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
    }
    out[0].dtype = x->dtype;
    if (has_axis && x->rank >= 0) {
        out[0] = *x;
        out[0].dims[axis] = -1;
        out[0].syms[axis] = 0;
    } else if (!has_axis) {
        out[0].rank = 1;
        out[0].dims[0] = -1;
    }
    for (int j = 1; j < nout && j < 4; j++) {
        out[j].dtype = KF_DT_INT64;
        out[j].rank = 1;
        out[j].dims[0] = -1;
    }
    if (nout > 2 && x->rank >= 0) {
        if (has_axis) {
            out[2].dims[0] = x->dims[axis];
            out[2].syms[0] = x->syms[axis];
        } else if (kf_type_is_static(x)) {
            out[2].dims[0] = prod(x->dims, 0, x->rank);
        }
    }
    return KF_OK;
}

kf_status kf_index_eval_unique(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    (void)nin;
    const kf_tensor *x = in[0];
    slices s = {x, x->numel, 1, 1};
    int axis = -1;
    if (kf_attr_find(n, "axis")) {
        if (x->rank < 1) return kf_node_fail(n, KF_ERR_SHAPE, "input must have rank >= 1 when axis is given");
        KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
        s.count = x->dims[axis];
        s.outer = prod(x->dims, 0, axis);
        s.inner = prod(x->dims, axis + 1, x->rank);
    }
    bool sorted = kf_attr_i(n, "sorted", 1) != 0;
    int64_t m = s.count;
    kf_status st = KF_OK;
    /* ids: items in sorted order; group: item -> group; first/cnt per group;
     * pos: group -> output position */
    int64_t *ids = kf_calloc((size_t)m, sizeof(int64_t)), *tmp = kf_calloc((size_t)m, sizeof(int64_t));
    int64_t *group = kf_calloc((size_t)m, sizeof(int64_t)), *first = kf_calloc((size_t)m, sizeof(int64_t));
    int64_t *cnt = kf_calloc((size_t)m, sizeof(int64_t)), *pos = kf_calloc((size_t)m, sizeof(int64_t));
    if (!ids || !tmp || !group || !first || !cnt || !pos) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < m; i++) ids[i] = i;
    sort_ids(&s, ids, tmp, m);
    int64_t u = 0;
    for (int64_t k = 0; k < m; k++) {
        if (k == 0 || cmp_slices(&s, ids[k - 1], ids[k]) != 0) first[u++] = ids[k];
        group[ids[k]] = u - 1;
        cnt[u - 1]++;
    }
    if (sorted) {
        for (int64_t g = 0; g < u; g++) pos[g] = g;
    } else { /* order of first occurrence: walk the input once */
        int64_t next = 0;
        for (int64_t i = 0; i < m; i++)
            if (first[group[i]] == i) pos[group[i]] = next++;
    }
    int64_t dims[KF_MAX_RANK];
    int rank = 1;
    dims[0] = u;
    if (axis >= 0) {
        rank = x->rank;
        memcpy(dims, x->dims, sizeof(int64_t) * (size_t)rank);
        dims[axis] = u;
    }
    if ((st = kf_output_prepare(n, &out[0], x->dtype, rank, dims))) goto done;
    for (int64_t g = 0; g < u; g++)
        for (int64_t o = 0; o < s.outer; o++)
            if ((st = copy_block(&out[0], (o * u + pos[g]) * s.inner, x, (o * m + first[g]) * s.inner,
                                 s.inner)))
                goto done;
    int64_t len[4] = {0, u, m, u};
    for (int j = 1; j < nout && j < 4; j++) {
        if ((st = kf_output_prepare(n, &out[j], KF_DT_INT64, 1, &len[j]))) goto done;
        int64_t *o = out[j].data;
        if (j == 2)
            for (int64_t i = 0; i < m; i++) o[i] = pos[group[i]];
        else
            for (int64_t g = 0; g < u; g++) o[pos[g]] = j == 1 ? first[g] : cnt[g];
    }
done:
    kf_free(ids);
    kf_free(tmp);
    kf_free(group);
    kf_free(first);
    kf_free(cnt);
    kf_free(pos);
    return st;
}

/* ---- ReverseSequence --------------------------------------------------------- */

static kf_status reverse_axes(const kf_node *n, int rank, int *batch, int *time) {
    int64_t b = kf_attr_i(n, "batch_axis", 1), t = kf_attr_i(n, "time_axis", 0);
    if (rank < 2) return kf_node_fail(n, KF_ERR_SHAPE, "input must have rank >= 2, not %d", rank);
    if (!((b == 0 && t == 1) || (b == 1 && t == 0)))
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "batch_axis %lld and time_axis %lld must be 0 and 1 in some order",
                     (long long)b, (long long)t);
    *batch = (int)b;
    *time = (int)t;
    return KF_OK;
}

kf_status kf_index_shape_reverse_sequence(const kf_node *n, int nin, const kf_type *const *in,
                                          const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 1 || !in[0] || nout < 1) return KF_OK;
    out[0] = *in[0];
    int b, t;
    if (in[0]->rank >= 0) KF_TRY(reverse_axes(n, in[0]->rank, &b, &t));
    return KF_OK;
}

kf_status kf_index_eval_reverse_sequence(const kf_node *n, int nin, const kf_tensor *const *in,
                                         int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *lens = in[1];
    int ba, ta;
    KF_TRY(reverse_axes(n, x->rank, &ba, &ta));
    int64_t nb = x->dims[ba], nt = x->dims[ta], inner = prod(x->dims, 2, x->rank);
    if (lens->dtype != KF_DT_INT64 || lens->rank != 1 || lens->numel != nb)
        return kf_node_fail(n, KF_ERR_SHAPE, "sequence_lens must be a 1-D int64 tensor of the batch size %lld",
                     (long long)nb);
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    KF_TRY(copy_block(&out[0], 0, x, 0, x->numel));
    for (int64_t b = 0; b < nb; b++) {
        int64_t len = kf_get_i64(lens, b);
        if (len < 0 || len > nt)
            return kf_node_fail(n, KF_ERR_RUNTIME, "sequence length %lld is outside [0, %lld]", (long long)len,
                         (long long)nt);
        for (int64_t t = 0; t < len; t++) {
            int64_t src = len - 1 - t;
            int64_t to = ta == 0 ? (t * nb + b) : (b * nt + t), from = ta == 0 ? (src * nb + b) : (b * nt + src);
            KF_TRY(copy_block(&out[0], to * inner, x, from * inner, inner));
        }
    }
    return KF_OK;
}

/* ---- the range index values must keep ----------------------------------------- */

/* Exclusive bound on the values of input `slot` of Gather-family node n
 * used as indices: the known size of the data dim (dims, for GatherND) they
 * select; 0 when n reads no indices there or the size is not known. */
static int64_t index_slot_bound(const kf_node *n, int slot, const kf_graph *g) {
    if (slot != 1 || !n->in[0]) return 0;
    const kf_type *x = &g->values[n->in[0]].type;
    if (x->rank < 1) return 0;
    int lo, hi; /* the data dims an index selects along */
    if (n->op == KF_OP_GATHER || n->op == KF_OP_GATHER_ELEMENTS) {
        int64_t a = kf_attr_i(n, "axis", 0);
        if (a < -x->rank || a >= x->rank) return 0;
        lo = (int)(a < 0 ? a + x->rank : a);
        hi = lo + 1;
    } else if (n->op == KF_OP_GATHER_ND) { /* a tuple of k indexes the k dims after batch_dims, one each */
        int64_t b = kf_attr_i(n, "batch_dims", 0);
        if (b < 0 || b >= x->rank) return 0;
        const kf_type *ix = &g->values[n->in[1]].type;
        int64_t k = ix->rank >= 1 ? ix->dims[ix->rank - 1] : -1; /* unknown: any of them */
        lo = (int)b;
        hi = k >= 1 && k <= x->rank - b ? lo + (int)k : x->rank;
    } else {
        return 0;
    }
    int64_t bound = 0;
    for (int d = lo; d < hi; d++)
        if (x->dims[d] >= 0 && (!bound || x->dims[d] < bound)) bound = x->dims[d];
    return bound;
}

/* A breadth-first walk over the values v's elements are copied into
 * (KF_F_COPIES ops, from their data inputs), taking the smallest bound at
 * every Gather-family index slot on the way:
 *
 *   token_type_ids ─► Cast ─► Unsqueeze ─► Gather(table[2, H], ·) ──► bound 2
 *          └────────────────────────────► Gather(other[16, H], ·) ─┘  (min)
 */
int64_t kf_index_bound(const kf_graph *g, kf_id v) {
    kf_id *queue = kf_calloc(g->nvalues + 1, sizeof(kf_id));
    bool *seen = kf_calloc(g->nvalues + 1, sizeof(bool));
    int64_t bound = 0;
    uint32_t head = 0, tail = 0;
    if (queue && seen && v && v < g->nvalues) {
        queue[tail++] = v;
        seen[v] = true;
    }
    while (head < tail) {
        kf_id x = queue[head++];
        const kf_value *val = &g->values[x];
        for (uint32_t u = 0; u < val->nusers; u++) {
            const kf_node *n = &g->nodes[val->users[u]];
            const kf_op_info *info = kf_node_op(n);
            if (n->dead || !info) continue;
            for (int k = 0; k < n->nin; k++) {
                if (n->in[k] != x) continue;
                int64_t b = index_slot_bound(n, k, g);
                if (b > 0 && (!bound || b < bound)) bound = b;
                if (!(info->flags & KF_F_COPIES) || (k > 0 && info->in_max >= 0)) continue;
                for (int o = 0; o < n->nout; o++) {
                    kf_id y = n->out[o];
                    if (y && !seen[y]) {
                        seen[y] = true;
                        queue[tail++] = y;
                    }
                }
            }
        }
    }
    kf_free(queue);
    kf_free(seen);
    return bound;
}

/* ---- TensorScatter (opset 24) ------------------------------------------- */

/* A key/value cache update: present = past, with update's rows written
 * along `axis` (not the batch dim 0) from write_indices[b] on (0 without
 * the input) for every position of the dims before the axis, b being the
 * first of them. "circular" wraps the row index modulo the cache length;
 * "linear" requires it inside the cache, and a write past the end is a
 * KF_ERR_RUNTIME naming the node.
 *
 *   past [B, H, L, D], update [B, H, S, D], axis 2:
 *   present[b, h, w[b] + s, :] = update[b, h, s, :]   for s < S */
static kf_status tscatter_attrs(const kf_node *n, int rank, int *axis, bool *circular) {
    if (rank < 2) return kf_node_fail(n, KF_ERR_SHAPE, "the cache needs a batch and a sequence dim, it has rank %d", rank);
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -2), rank, axis));
    if (*axis == 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "axis cannot be the batch dim 0");
    const char *mode = kf_attr_s(n, "mode", "linear");
    *circular = strcmp(mode, "circular") == 0;
    if (!*circular && strcmp(mode, "linear") != 0)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "mode '%s' is not \"linear\" or \"circular\"", mode);
    return KF_OK;
}

kf_status kf_index_shape_tensor_scatter(const kf_node *n, int nin, const kf_type *const *in,
                                        const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    const kf_type *past = in[0], *upd = in[1];
    out[0] = *past;
    if (upd && past->dtype && upd->dtype && upd->dtype != past->dtype)
        return kf_node_fail(n, KF_ERR_SHAPE, "update is %s, the cache %s", kf_dtype_name(upd->dtype),
                            kf_dtype_name(past->dtype));
    if (nin > 2 && in[2] && in[2]->dtype && in[2]->dtype != KF_DT_INT64)
        return kf_node_fail(n, KF_ERR_SHAPE, "write_indices must be int64, not %s", kf_dtype_name(in[2]->dtype));
    if (past->rank < 0) return KF_OK;
    int axis;
    bool circular;
    KF_TRY(tscatter_attrs(n, past->rank, &axis, &circular));
    if (!upd || upd->rank < 0) return KF_OK;
    if (upd->rank != past->rank)
        return kf_node_fail(n, KF_ERR_SHAPE, "update has rank %d, the cache %d", upd->rank, past->rank);
    for (int d = 0; d < past->rank; d++) {
        int64_t p = past->dims[d], u = upd->dims[d];
        if (p < 0 || u < 0) continue;
        if (d == axis ? u > p : u != p)
            return kf_node_fail(n, KF_ERR_SHAPE, "update dim %d is %lld, the cache's %lld", d, (long long)u,
                                (long long)p);
    }
    return KF_OK;
}

kf_status kf_index_eval_tensor_scatter(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                       kf_tensor *out) {
    (void)nout;
    const kf_tensor *past = in[0], *upd = in[1], *wi = nin > 2 ? in[2] : NULL;
    kf_type tp, tu, tw, res;
    const kf_type *ty[3] = {&tp, &tu, NULL};
    kf_type_of_tensor(&tp, past);
    kf_type_of_tensor(&tu, upd);
    if (wi) {
        kf_type_of_tensor(&tw, wi);
        ty[2] = &tw;
    }
    kf_type_unknown(&res);
    KF_TRY(kf_index_shape_tensor_scatter(n, wi ? 3 : 2, ty, NULL, 1, &res));
    int axis;
    bool circular;
    KF_TRY(tscatter_attrs(n, past->rank, &axis, &circular));
    int64_t batch = past->dims[0];
    if (wi && (wi->rank != 1 || wi->numel != batch))
        return kf_node_fail(n, KF_ERR_SHAPE, "write_indices must have shape [%lld]", (long long)batch);
    if (!out[0].data || out[0].dtype != past->dtype) KF_TRY(kf_tensor_alloc(&out[0], past->dtype, past->rank, past->dims));
    KF_TRY(copy_block(&out[0], 0, past, 0, past->numel));
    int64_t outer = 1, inner = 1, len = past->dims[axis], seq = upd->dims[axis];
    for (int d = 0; d < axis; d++) outer *= past->dims[d];
    for (int d = axis + 1; d < past->rank; d++) inner *= past->dims[d];
    if (past->numel == 0 || upd->numel == 0) return KF_OK;
    int64_t per_batch = outer / batch;
    for (int64_t o = 0; o < outer; o++) {
        int64_t w = wi ? ((const int64_t *)wi->data)[o / per_batch] : 0;
        for (int64_t s = 0; s < seq; s++) {
            int64_t row;
            if (circular) {
                row = (w % len + s) % len; /* w % len > -len and s < len: no overflow */
                if (row < 0) row += len;
            } else {
                if (w < 0 || w > len - seq)
                    return kf_node_fail(n, KF_ERR_RUNTIME, "write index %lld with %lld rows leaves a cache of %lld",
                                        (long long)w, (long long)seq, (long long)len);
                row = w + s;
            }
            KF_TRY(copy_block(&out[0], (o * len + row) * inner, upd, (o * seq + s) * inner, inner));
        }
    }
    return KF_OK;
}
