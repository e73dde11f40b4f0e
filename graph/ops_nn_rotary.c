/*
 * ops_nn_rotary.c: shape function and reference kernel of RotaryEmbedding
 * (opset 23): rotates the first rotary_embedding_dim values of every head
 * of X (4-D: batch, heads, seq, size; 3-D: batch, seq, heads * size) by
 * the angles whose cosines and sines the caches hold, per position (from
 * position_ids, or the caches given per batch and position). Pairs are
 * (k, k + dim/2), or (2k, 2k + 1) when interleaved. Each product and sum is
 * rounded to X's type as the ONNX reference computes it.
 */
#include "ops_nn_util.h"

static const kf_dtype rotary_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_UNDEFINED};

/* Head count and head size of X; -1 where its type does not say. */
static kf_status heads_of(const kf_node *n, const kf_type *x, int64_t *heads, int64_t *size) {
    *heads = *size = -1;
    if (x->rank < 0) return KF_OK;
    if (x->rank != 3 && x->rank != 4)
        return kf_nn_fail(n, KF_ERR_SHAPE, "input must have rank 3 or 4, not %d", x->rank);
    if (x->rank == 4) {
        *heads = x->dims[1];
        *size = x->dims[3];
        return KF_OK;
    }
    int64_t nh = kf_attr_i(n, "num_heads", 0);
    if (nh <= 0) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "a 3-D input needs a positive num_heads attribute");
    *heads = nh;
    if (x->dims[2] < 0) return KF_OK;
    if (x->dims[2] % nh != 0)
        return kf_nn_fail(n, KF_ERR_SHAPE, "hidden size %lld is not a multiple of num_heads %lld",
                          (long long)x->dims[2], (long long)nh);
    *size = x->dims[2] / nh;
    return KF_OK;
}

/* rotary_embedding_dim (0: the head size) once the head size is known;
 * it must be even and at most the head size. */
static kf_status rotary_dim(const kf_node *n, int64_t size, int64_t *dim) {
    *dim = kf_attr_i(n, "rotary_embedding_dim", 0);
    if (*dim < 0)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "rotary_embedding_dim must be >= 0, not %lld", (long long)*dim);
    if (size < 0) {
        if (*dim == 0) *dim = -1;
        return KF_OK;
    }
    if (*dim == 0) *dim = size;
    if (*dim % 2 != 0 || *dim > size)
        return kf_nn_fail(n, KF_ERR_SHAPE, "rotary_embedding_dim %lld must be even and at most the head size %lld",
                          (long long)*dim, (long long)size);
    return KF_OK;
}

/* With position_ids (B, S) the caches are (positions, dim / 2); without,
 * (B, S, dim / 2). Batch and sequence dims of 1 broadcast. */
static kf_status check_caches(const kf_node *n, const kf_type *x, const kf_type *const *cs, const kf_type *pos,
                              int64_t dim) {
    int64_t B = x->rank >= 1 ? x->dims[0] : -1;
    int64_t S = x->rank == 4 ? x->dims[2] : x->rank == 3 ? x->dims[1] : -1;
    static const char *const names[2] = {"cos_cache", "sin_cache"};
    for (int c = 0; c < 2; c++) {
        const kf_type *t = cs[c];
        if (t->rank < 0) continue;
        int want = pos ? 2 : 3;
        if (t->rank != want)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s must have rank %d %s position_ids, not %d", names[c], want,
                              pos ? "with" : "without", t->rank);
        int64_t last = t->dims[want - 1];
        if (dim >= 0 && last >= 0 && last != dim / 2)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s has %lld values per position, expected rotary dim / 2 = %lld",
                              names[c], (long long)last, (long long)(dim / 2));
        if (!pos) {
            int64_t b = t->dims[0], s = t->dims[1];
            if ((b >= 0 && B >= 0 && b != 1 && b != B) || (s >= 0 && S >= 0 && s != 1 && s != S))
                return kf_nn_fail(n, KF_ERR_SHAPE, "%s must have shape (batch_size, sequence_length, dim / 2)",
                                  names[c]);
        }
    }
    if (pos && pos->rank >= 0) {
        int64_t b = pos->rank == 2 ? pos->dims[0] : -1, s = pos->rank == 2 ? pos->dims[1] : -1;
        if (pos->rank != 2 || (b >= 0 && B >= 0 && b != 1 && b != B) || (s >= 0 && S >= 0 && s != 1 && s != S))
            return kf_nn_fail(n, KF_ERR_SHAPE, "position_ids must have shape (batch_size, sequence_length)");
    }
    return KF_OK;
}

static kf_status check_types(const kf_node *n, int nin, const kf_type *const *in) {
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "X", rotary_types));
    static const char *const names[2] = {"cos_cache", "sin_cache"};
    for (int c = 1; c <= 2; c++)
        if (in[0]->dtype && in[c]->dtype && in[c]->dtype != in[0]->dtype)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s has dtype %s, X has %s", names[c - 1], kf_dtype_name(in[c]->dtype),
                              kf_dtype_name(in[0]->dtype));
    const kf_type *pos = nin > 3 ? in[3] : NULL;
    if (pos && pos->dtype && pos->dtype != KF_DT_INT64)
        return kf_nn_fail(n, KF_ERR_SHAPE, "position_ids has dtype %s, expected int64", kf_dtype_name(pos->dtype));
    int64_t heads, size, dim;
    KF_TRY(heads_of(n, in[0], &heads, &size));
    KF_TRY(rotary_dim(n, size, &dim));
    return check_caches(n, in[0], in + 1, pos, dim);
}

/* Y is X's type and shape. */
kf_status kf_nn_rotary_shape(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                             int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 3 || !in[0] || !in[1] || !in[2]) return KF_OK;
    KF_TRY(check_types(n, nin, in));
    out[0] = *in[0];
    return KF_OK;
}

/* Y like X. Errors name the node: bad ranks, head counts, rotary dims or
 * cache shapes (as the shape function judges them), and position ids
 * outside the caches (KF_ERR_RUNTIME). */
kf_status kf_nn_rotary_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nout;
    const kf_tensor *x = in[0], *cosc = in[1], *sinc = in[2], *pos = nin > 3 ? in[3] : NULL;
    kf_type t[4];
    const kf_type *tp[4] = {NULL};
    for (int i = 0; i < nin && i < 4; i++)
        if (in[i]) {
            kf_type_of_tensor(&t[i], in[i]);
            tp[i] = &t[i];
        }
    KF_TRY(check_types(n, nin < 4 ? nin : 4, tp));
    int64_t H, D, dim;
    KF_TRY(heads_of(n, tp[0], &H, &D));
    KF_TRY(rotary_dim(n, D, &dim));
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    int64_t B = x->dims[0], S = x->rank == 4 ? x->dims[2] : x->dims[1], half = dim / 2;
    /* strides of the (batch, position) grid of position_ids or the caches */
    const kf_tensor *grid = pos ? pos : cosc;
    int64_t gb = grid->dims[0] == 1 ? 0 : grid->dims[1], gs = grid->dims[1] == 1 ? 0 : 1;
    int64_t npos = pos ? cosc->dims[0] : 0;
    kf_dtype dt = x->dtype;
    bool il = kf_attr_i(n, "interleaved", 0) != 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t row = b * gb + s * gs;
            if (pos) {
                int64_t p = kf_get_i64(pos, row);
                if (p < 0 || p >= npos)
                    return kf_nn_fail(n, KF_ERR_RUNTIME, "position id %lld is outside the caches' %lld positions",
                                      (long long)p, (long long)npos);
                row = p;
            }
            for (int64_t h = 0; h < H; h++) {
                int64_t base = x->rank == 4 ? ((b * H + h) * S + s) * D : ((b * S + s) * H + h) * D;
                for (int64_t k = 0; k < half; k++) {
                    int64_t i1 = base + (il ? 2 * k : k), i2 = base + (il ? 2 * k + 1 : k + half);
                    double c = kf_get_f64(cosc, row * half + k), sn = kf_get_f64(sinc, row * half + k);
                    double x1 = kf_get_f64(x, i1), x2 = kf_get_f64(x, i2);
                    double re = kf_nn_round_to(dt, kf_nn_round_to(dt, c * x1) - kf_nn_round_to(dt, sn * x2));
                    double im = kf_nn_round_to(dt, kf_nn_round_to(dt, sn * x1) + kf_nn_round_to(dt, c * x2));
                    kf_set_f64(&out[0], i1, re);
                    kf_set_f64(&out[0], i2, im);
                }
                for (int64_t d = dim; d < D; d++) kf_set_f64(&out[0], base + d, kf_get_f64(x, base + d));
            }
        }
    return KF_OK;
}
