/*
 * ref_util.c: helpers shared by the reference kernels and shape functions:
 * numpy broadcasting, generic shape functions, axis normalisation, reading
 * shape-like integer inputs and index arithmetic.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kf_ref.h"

kf_status kf_broadcast_shapes(const kf_node *n, int nin, const kf_type *const *in, kf_type *out) {
    int rank = 0;
    kf_dtype dt = KF_DT_UNDEFINED;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        if (!dt) dt = in[i]->dtype;
        if (in[i]->rank < 0) {
            kf_type_unknown(out);
            out->dtype = dt;
            return KF_OK;
        }
        if (in[i]->rank > rank) rank = in[i]->rank;
    }
    kf_type_unknown(out);
    out->dtype = dt;
    out->rank = rank;
    for (int d = 0; d < rank; d++) {
        int64_t dim = 1;
        uint32_t sym = 0;
        bool unknown = false;
        for (int i = 0; i < nin; i++) {
            if (!in[i]) continue;
            int off = rank - in[i]->rank;
            if (d < off) continue;
            int64_t x = in[i]->dims[d - off];
            if (x < 0) {
                unknown = true;
                if (!sym) sym = in[i]->syms[d - off];
                continue;
            }
            if (x == 1) continue;
            if (dim != 1 && dim != x)
                return kf_fail(KF_ERR_SHAPE,
                               "node '%s' (%s): inputs cannot be broadcast (dim %d: %lld vs %lld)",
                               kf_node_label(n), n->op_type, d, (long long)dim, (long long)x);
            dim = x;
        }
        if (dim != 1 || !unknown) {
            out->dims[d] = dim;
        } else {
            out->dims[d] = -1;
            out->syms[d] = sym;
        }
    }
    return KF_OK;
}

kf_status kf_bcast_init(kf_bcast *b, const kf_node *n, int nin, const kf_tensor *const *in) {
    if (nin > KF_BCAST_MAX_IN)
        return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' (%s): more than %d broadcast inputs",
                       kf_node_label(n), n->op_type, KF_BCAST_MAX_IN);
    kf_type types[KF_BCAST_MAX_IN];
    const kf_type *tp[KF_BCAST_MAX_IN];
    for (int i = 0; i < nin; i++) {
        kf_type_of_tensor(&types[i], in[i]);
        tp[i] = &types[i];
    }
    kf_type out;
    KF_TRY(kf_broadcast_shapes(n, nin, tp, &out));
    memset(b, 0, sizeof *b);
    b->rank = out.rank;
    b->nin = nin;
    b->numel = 1;
    for (int d = 0; d < out.rank; d++) {
        b->dims[d] = out.dims[d];
        b->numel *= out.dims[d]; /* each input's numel was checked, so no overflow */
    }
    for (int i = 0; i < nin; i++) {
        int off = out.rank - in[i]->rank;
        int64_t s = 1;
        for (int d = in[i]->rank - 1; d >= 0; d--) {
            b->strides[i][d + off] = in[i]->dims[d] == 1 ? 0 : s;
            s *= in[i]->dims[d];
        }
    }
    return KF_OK;
}

void kf_bcast_offsets(const kf_bcast *b, int64_t linear, int64_t *offs) {
    for (int i = 0; i < b->nin; i++) offs[i] = 0;
    for (int d = b->rank - 1; d >= 0; d--) {
        int64_t idx = b->dims[d] ? linear % b->dims[d] : 0;
        linear = b->dims[d] ? linear / b->dims[d] : 0;
        for (int i = 0; i < b->nin; i++) offs[i] += idx * b->strides[i][d];
    }
}

kf_status kf_shape_same(const kf_node *n, int nin, const kf_type *const *in,
                        const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)val;
    if (nin > 0 && in[0] && nout > 0) out[0] = *in[0];
    return KF_OK;
}

kf_status kf_shape_bcast(const kf_node *n, int nin, const kf_type *const *in,
                         const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nout < 1) return KF_OK;
    return kf_broadcast_shapes(n, nin, in, &out[0]);
}

kf_status kf_shape_bcast_bool(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out) {
    KF_TRY(kf_shape_bcast(n, nin, in, val, nout, out));
    if (nout >= 1) out[0].dtype = KF_DT_BOOL;
    return KF_OK;
}

kf_status kf_shape_unknown(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)nin;
    (void)in;
    (void)val;
    for (int j = 0; j < nout; j++) kf_type_unknown(&out[j]);
    return KF_OK;
}

kf_status kf_norm_axis(const kf_node *n, int64_t axis, int rank, int *out) {
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= (rank ? rank : 1))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is out of range for rank %d",
                       kf_node_label(n), n->op_type, (long long)axis, rank);
    *out = (int)a;
    return KF_OK;
}

kf_status kf_read_ints(const kf_node *n, const kf_tensor *t, const char *what, int64_t **vals,
                       int64_t *count) {
    *vals = NULL;
    *count = 0;
    if (!t) return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing input '%s'", kf_node_label(n), n->op_type, what);
    if (!kf_dtype_is_int(t->dtype) || t->rank > 1)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): input '%s' must be a 1-D integer tensor",
                       kf_node_label(n), n->op_type, what);
    int64_t *v = kf_calloc((size_t)t->numel, sizeof(int64_t));
    if (!v) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->numel; i++) v[i] = kf_get_i64(t, i);
    *vals = v;
    *count = t->numel;
    return KF_OK;
}

void kf_unravel(int rank, const int64_t *dims, int64_t linear, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = dims[d] ? linear % dims[d] : 0;
        linear = dims[d] ? linear / dims[d] : 0;
    }
}

int64_t kf_ravel(int rank, const int64_t *strides, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off += idx[d] * strides[d];
    return off;
}

kf_status kf_check_dtype(const kf_node *n, const kf_tensor *t, int i, ...) {
    if (!t) return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): input %d is missing", kf_node_label(n), n->op_type, i);
    va_list ap;
    va_start(ap, i);
    for (;;) {
        int dt = va_arg(ap, int);
        if (dt == KF_DT_UNDEFINED) break;
        if (dt == (int)t->dtype) {
            va_end(ap);
            return KF_OK;
        }
    }
    va_end(ap);
    return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d has unsupported dtype %s", kf_node_label(n),
                   n->op_type, i, kf_dtype_name(t->dtype));
}

kf_status kf_node_fail(const kf_node *n, kf_status code, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kf_fail(code, "node '%s' (%s): %s", kf_node_label(n), n->op_type, msg);
}

kf_status kf_output_prepare(const kf_node *n, kf_tensor *t, kf_dtype dt, int rank, const int64_t *dims) {
    if (rank > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", rank, KF_MAX_RANK);
    if (t->data) {
        bool same = t->dtype == dt && t->rank == rank;
        for (int d = 0; same && d < rank; d++) same = t->dims[d] == dims[d];
        if (same) return KF_OK;
        return kf_node_fail(n, KF_ERR_INTERNAL, "pre-allocated output disagrees with the kernel's shape");
    }
    kf_status st = kf_tensor_alloc(t, dt, rank, dims);
    if (st) return kf_fail_context(st, "node '%s' (%s) output", kf_node_label(n), n->op_type);
    return KF_OK;
}
