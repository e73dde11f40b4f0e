/*
 * ops_reduce.h: small helpers shared by the reduction, softmax/loss and
 * normalisation kernels (ops_reduce*.c) and by nothing else: splitting a
 * shape around an axis, exact element comparison, opset defaults and output
 * preparation. Everything is static inline so no symbol leaves the family.
 */
#ifndef KF_OPS_REDUCE_H
#define KF_OPS_REDUCE_H

#include <math.h>
#include <string.h>

#include "kf_ref.h"

/* The newest default-domain opset these kernels implement; a node without
 * an opset (built by a pass or a test) gets these semantics. */
#define RED_LATEST_OPSET 21

static inline int64_t red_opset(const kf_node *n) { return n->opset > 0 ? n->opset : RED_LATEST_OPSET; }

/* Product of dims[lo..hi); saturates at INT64_MAX (callers only iterate
 * when the tensor has elements, and then the product is at most numel). */
static inline int64_t red_prod(const int64_t *dims, int lo, int hi) {
    int64_t p = 1;
    for (int d = lo; d < hi; d++)
        if (dims[d] == 0) return 0;
    for (int d = lo; d < hi; d++)
        if (!kf_mul_ok(p, dims[d], &p)) return INT64_MAX;
    return p;
}

/* Row-major view of a shape as [outer, len, inner] around axis. */
static inline void red_split(int rank, const int64_t *dims, int axis, int64_t *outer, int64_t *len,
                             int64_t *inner) {
    *outer = red_prod(dims, 0, axis);
    *len = axis < rank ? dims[axis] : 1;
    *inner = red_prod(dims, axis + 1, rank);
}

/* Compares elements i and j of t: -1, 0 or 1. Integers compare exactly
 * (uint64 as unsigned); floats compare as doubles with NaN above every
 * number and equal to NaN, so sorting is a total order. */
static inline int red_cmp(const kf_tensor *t, int64_t i, int64_t j) {
    if (t->dtype == KF_DT_UINT64) {
        uint64_t a = kf_get_u64(t, i), b = kf_get_u64(t, j);
        return (a > b) - (a < b);
    }
    if (!kf_dtype_is_float(t->dtype)) {
        int64_t a = kf_get_i64(t, i), b = kf_get_i64(t, j);
        return (a > b) - (a < b);
    }
    double a = kf_get_f64(t, i), b = kf_get_f64(t, j);
    if (isnan(a) || isnan(b)) return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* dst[di] = src[si], bit for bit; both tensors have the same (non-string)
 * dtype. */
static inline void red_copy_elem(kf_tensor *dst, int64_t di, const kf_tensor *src, int64_t si) {
    size_t esz = kf_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)di * esz, (const char *)src->data + (size_t)si * esz, esz);
}

/* Makes t a zero-filled tensor of the given dtype and shape, keeping it
 * when the evaluator already allocated exactly that. */
static inline kf_status red_prepare(const kf_node *n, kf_tensor *t, kf_dtype dt, int rank,
                                    const int64_t *dims) {
    if (t->dtype == dt && t->rank == rank && t->data) {
        bool same = true;
        for (int d = 0; d < rank; d++) same = same && t->dims[d] == dims[d];
        if (same) return KF_OK;
    }
    kf_status st = kf_tensor_alloc(t, dt, rank, dims);
    if (st) return kf_fail_context(st, "node '%s' (%s) output", kf_node_label(n), n->op_type);
    return KF_OK;
}

/* Checks that input i exists and is a float tensor (float16, bfloat16,
 * float, double). */
static inline kf_status red_check_float(const kf_node *n, const kf_tensor *t, int i) {
    return kf_check_dtype(n, t, i, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_FLOAT, KF_DT_DOUBLE,
                          KF_DT_UNDEFINED);
}

/* Checks that input i exists and is numeric (float or integer, not bool). */
static inline kf_status red_check_numeric(const kf_node *n, const kf_tensor *t, int i) {
    return kf_check_dtype(n, t, i, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_FLOAT, KF_DT_DOUBLE,
                          KF_DT_INT8, KF_DT_INT16, KF_DT_INT32, KF_DT_INT64, KF_DT_UINT8,
                          KF_DT_UINT16, KF_DT_UINT32, KF_DT_UINT64, KF_DT_UNDEFINED);
}

#endif
