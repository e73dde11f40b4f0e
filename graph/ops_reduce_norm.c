/*
 * ops_reduce_norm.c: shape functions and reference kernels of the
 * normalisations: LayerNormalization, RMSNormalization, InstanceNormalization,
 * GroupNormalization, BatchNormalization (inference at every opset, training
 * mode from opset 14) and LRN. Statistics are two-pass (mean, then the mean
 * squared deviation) in double; results are rounded once into the output.
 */
#include "ops_reduce.h"

/* Mean and population variance of x[base .. base+count). */
static void block_stats(const kf_tensor *x, int64_t base, int64_t count, double *mean, double *var) {
    double sum = 0, sq = 0;
    for (int64_t k = 0; k < count; k++) sum += kf_get_f64(x, base + k);
    *mean = sum / (double)count;
    for (int64_t k = 0; k < count; k++) {
        double d = kf_get_f64(x, base + k) - *mean;
        sq += d * d;
    }
    *var = sq / (double)count;
}

static kf_status check_epsilon(const kf_node *n, double eps) {
    if (!(eps >= 0))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): epsilon must be >= 0, not %g", kf_node_label(n), n->op_type,
                       eps);
    return KF_OK;
}

/* Input i must be a float vector of exactly `len` elements. */
static kf_status check_vector(const kf_node *n, const kf_tensor *t, int i, const char *what, int64_t len) {
    KF_TRY(red_check_float(n, t, i));
    if (t->rank != 1 || t->dims[0] != len)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %s must have shape [%lld]", kf_node_label(n), n->op_type, what,
                       (long long)len);
    return KF_OK;
}

/* Input must be float with rank >= 2 (N, C, ...). */
static kf_status check_nc(const kf_node *n, const kf_tensor *x) {
    KF_TRY(red_check_float(n, x, 0));
    if (x->rank < 2)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must have rank >= 2 (N, C, ...), not %d", kf_node_label(n),
                       n->op_type, x->rank);
    return KF_OK;
}

/* ---- LayerNormalization ---------------------------------------------------- */

static kf_status stash_dtype(const kf_node *n, kf_dtype *dt) {
    int64_t s = kf_attr_i(n, "stash_type", KF_DT_FLOAT);
    if (!kf_dtype_valid((int)s) || !kf_dtype_is_float((kf_dtype)s))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): stash_type %lld is not a float type", kf_node_label(n),
                       n->op_type, (long long)s);
    *dt = (kf_dtype)s;
    return KF_OK;
}

/* Y has X's type; Mean and InvStdDev are X.shape[:axis] + [1]*(rank - axis)
 * in the stash type. */
kf_status kf_red_shape_layer_norm(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nout < 1 || nin < 1 || !in[0]) return KF_OK;
    out[0] = *in[0];
    kf_dtype st = KF_DT_FLOAT;
    KF_TRY(stash_dtype(n, &st));
    int axis = 0;
    if (in[0]->rank >= 0) KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), in[0]->rank, &axis));
    for (int j = 1; j < nout && j < 3; j++) {
        out[j].dtype = st;
        if (in[0]->rank < 0) continue;
        out[j].rank = in[0]->rank;
        for (int d = 0; d < in[0]->rank; d++) {
            out[j].dims[d] = d < axis ? in[0]->dims[d] : 1;
            out[j].syms[d] = d < axis ? in[0]->syms[d] : 0;
        }
    }
    return KF_OK;
}

kf_status kf_red_eval_layer_norm(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    const kf_tensor *x = in[0], *scale = in[1], *bias = nin > 2 ? in[2] : NULL;
    KF_TRY(red_check_float(n, x, 0));
    KF_TRY(red_check_float(n, scale, 1));
    if (bias) KF_TRY(red_check_float(n, bias, 2));
    kf_dtype st = KF_DT_FLOAT;
    KF_TRY(stash_dtype(n, &st));
    /* the spec sets no bound on epsilon: it is added to the variance exactly
     * as the decomposed form that rewrites recognise adds it */
    double eps = kf_attr_f(n, "epsilon", 1e-5f);
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), x->rank, &axis));
    /* Scale and B broadcast one way onto X (the ONNX function multiplies
     * and adds them with numpy broadcasting). */
    kf_bcast bc;
    const kf_tensor *ops[3] = {x, scale, bias};
    KF_TRY(kf_bcast_init(&bc, n, bias ? 3 : 2, ops));
    bool same = bc.rank == x->rank;
    for (int d = 0; same && d < x->rank; d++) same = bc.dims[d] == x->dims[d];
    if (!same)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): Scale and B must broadcast to the shape of X", kf_node_label(n),
                       n->op_type);

    int64_t sdims[KF_MAX_RANK];
    for (int d = 0; d < x->rank; d++) sdims[d] = d < axis ? x->dims[d] : 1;
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    for (int j = 1; j < nout && j < 3; j++) KF_TRY(red_prepare(n, &out[j], st, x->rank, sdims));
    if (x->numel == 0) return KF_OK;
    int64_t rows = red_prod(x->dims, 0, axis), cols = red_prod(x->dims, axis, x->rank);
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        block_stats(x, r * cols, cols, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t k = 0; k < cols; k++) {
            int64_t i = r * cols + k, offs[3];
            kf_bcast_offsets(&bc, i, offs);
            double v = (kf_get_f64(x, i) - mean) * inv * kf_get_f64(scale, offs[1]);
            if (bias) v += kf_get_f64(bias, offs[2]);
            kf_set_f64(&out[0], i, v);
        }
        if (nout > 1) kf_set_f64(&out[1], r, mean);
        if (nout > 2) kf_set_f64(&out[2], r, inv);
    }
    return KF_OK;
}

/* ---- RMSNormalization ------------------------------------------------------ */

/* Y = X / sqrt(mean(X^2 over axes axis..rank-1) + epsilon) * Scale, the
 * mean in double (at least the stash type's precision), Scale broadcast
 * one way onto X. */
kf_status kf_red_eval_rms_norm(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *scale = in[1];
    KF_TRY(red_check_float(n, x, 0));
    KF_TRY(red_check_float(n, scale, 1));
    kf_dtype st = KF_DT_FLOAT;
    KF_TRY(stash_dtype(n, &st));
    double eps = kf_attr_f(n, "epsilon", 1e-5f);
    if (x->rank < 1)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): X must have rank >= 1", kf_node_label(n), n->op_type);
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), x->rank, &axis));
    kf_bcast bc;
    const kf_tensor *ops[2] = {x, scale};
    KF_TRY(kf_bcast_init(&bc, n, 2, ops));
    bool same = bc.rank == x->rank;
    for (int d = 0; same && d < x->rank; d++) same = bc.dims[d] == x->dims[d];
    if (!same)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): scale must broadcast to the shape of X", kf_node_label(n),
                       n->op_type);
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    int64_t rows = red_prod(x->dims, 0, axis), cols = red_prod(x->dims, axis, x->rank);
    for (int64_t r = 0; r < rows; r++) {
        double sq = 0;
        for (int64_t k = 0; k < cols; k++) {
            double v = kf_get_f64(x, r * cols + k);
            sq += v * v;
        }
        double inv = 1.0 / sqrt(sq / (double)cols + eps);
        for (int64_t k = 0; k < cols; k++) {
            int64_t i = r * cols + k, offs[2];
            kf_bcast_offsets(&bc, i, offs);
            kf_set_f64(&out[0], i, kf_get_f64(x, i) * inv * kf_get_f64(scale, offs[1]));
        }
    }
    return KF_OK;
}

/* ---- InstanceNormalization and GroupNormalization ------------------------ */

/* Normalises every (n, group) block of X [N, C, ...] with G groups; scale
 * and bias have one value per channel (per_group false) or per group. */
static kf_status group_norm(const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int64_t groups,
                           bool per_group) {
    const kf_tensor *x = in[0];
    KF_TRY(check_nc(n, x));
    int64_t C = x->dims[1];
    if (groups <= 0 || C % groups != 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): num_groups %lld must be positive and divide C = %lld",
                       kf_node_label(n), n->op_type, (long long)groups, (long long)C);
    int64_t plen = per_group ? groups : C;
    KF_TRY(check_vector(n, in[1], 1, "scale", plen));
    KF_TRY(check_vector(n, in[2], 2, "bias", plen));
    double eps = kf_attr_f(n, "epsilon", 1e-5f);
    KF_TRY(check_epsilon(n, eps));
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    int64_t D = red_prod(x->dims, 2, x->rank), cpg = C / groups, block = cpg * D;
    for (int64_t b = 0; b < x->dims[0] * groups; b++) {
        double mean, var;
        block_stats(x, b * block, block, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t k = 0; k < block; k++) {
            int64_t i = b * block + k;
            int64_t p = per_group ? b % groups : (b % groups) * cpg + k / D;
            kf_set_f64(&out[0], i, (kf_get_f64(x, i) - mean) * inv * kf_get_f64(in[1], p) + kf_get_f64(in[2], p));
        }
    }
    return KF_OK;
}

kf_status kf_red_eval_instance_norm(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                    kf_tensor *out) {
    (void)nin;
    (void)nout;
    KF_TRY(check_nc(n, in[0]));
    return group_norm(n, in, out, in[0]->dims[1] ? in[0]->dims[1] : 1, false);
}

/* Opset 18 has one scale and bias per group; opset 21 one per channel. */
kf_status kf_red_eval_group_norm(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_attr *g = kf_attr_find(n, "num_groups");
    if (!g || g->type != KF_ATTR_INT)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing integer attribute num_groups", kf_node_label(n),
                       n->op_type);
    if (red_opset(n) >= 21) {
        kf_dtype st = KF_DT_FLOAT;
        KF_TRY(stash_dtype(n, &st));
    }
    return group_norm(n, in, out, g->i, red_opset(n) < 21);
}

/* ---- BatchNormalization --------------------------------------------------- */

/* Y like X; running_mean and running_var like input_mean and input_var. */
kf_status kf_red_shape_batch_norm(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nout < 1 || nin < 1 || !in[0]) return KF_OK;
    out[0] = *in[0];
    if (red_opset(n) >= 14)
        for (int j = 1; j < nout && j < 3; j++)
            if (nin > j + 2 && in[j + 2]) out[j] = *in[j + 2];
    return KF_OK;
}

/* Training mode before opset 14 (is_test = 0 before opset 7, or the
 * optional statistics outputs) leaves the meaning of saved_var unspecified,
 * so those forms are declined. */
static kf_status batch_norm_mode(const kf_node *n, int nout, bool *training) {
    int64_t ver = red_opset(n);
    bool extra = false;
    for (int j = 1; j < nout; j++) extra = extra || n->out[j];
    *training = false;
    if (ver >= 14) {
        *training = kf_attr_i(n, "training_mode", 0) != 0;
        if (extra && !*training)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): running_mean/running_var need training_mode = 1",
                           kf_node_label(n), n->op_type);
        return KF_OK;
    }
    if ((ver < 7 && kf_attr_i(n, "is_test", 0) == 0) || extra)
        return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' (%s): training mode before opset 14 is not supported",
                       kf_node_label(n), n->op_type);
    return KF_OK;
}

kf_status kf_red_eval_batch_norm(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    (void)nin;
    const kf_tensor *x = in[0];
    KF_TRY(check_nc(n, x));
    bool training;
    KF_TRY(batch_norm_mode(n, nout, &training));
    /* before opset 9, spatial = 0 gives every activation (C x D1 x ...) its own statistics */
    bool spatial = red_opset(n) >= 9 || kf_attr_i(n, "spatial", 1) != 0;
    int64_t N = x->dims[0], C = x->dims[1], D = red_prod(x->dims, 2, x->rank);
    int64_t plen = spatial ? C : red_prod(x->dims, 1, x->rank);
    static const char *const names[4] = {"scale", "B", "mean", "var"};
    for (int i = 1; i < 5; i++) {
        if (spatial) {
            KF_TRY(check_vector(n, in[i], i, names[i - 1], plen));
        } else {
            KF_TRY(red_check_float(n, in[i], i));
            if (in[i]->numel != plen)
                return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %s must hold C x D1 x ... = %lld values",
                               kf_node_label(n), n->op_type, names[i - 1], (long long)plen);
        }
    }
    double eps = kf_attr_f(n, "epsilon", 1e-5f), momentum = kf_attr_f(n, "momentum", 0.9f);
    KF_TRY(check_epsilon(n, eps));
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    for (int j = 1; j < nout && j < 3; j++) KF_TRY(red_prepare(n, &out[j], in[j + 2]->dtype, 1, &C));

    for (int64_t c = 0; c < plen; c++) {
        double mean = kf_get_f64(in[3], c), var = kf_get_f64(in[4], c);
        int64_t count = spatial ? N * D : N, step = spatial ? D : 1, stride = spatial ? C * D : plen;
        int64_t start = spatial ? c * D : c;
        if (training) {
            /* batch statistics over N and the spatial dims */
            double sum = 0, sq = 0;
            for (int64_t b = 0; b < N; b++)
                for (int64_t s = 0; s < step; s++) sum += kf_get_f64(x, start + b * stride + s);
            double bm = sum / (double)count;
            for (int64_t b = 0; b < N; b++)
                for (int64_t s = 0; s < step; s++) {
                    double d = kf_get_f64(x, start + b * stride + s) - bm;
                    sq += d * d;
                }
            double bv = sq / (double)count;
            if (nout > 1) kf_set_f64(&out[1], c, mean * momentum + bm * (1 - momentum));
            if (nout > 2) kf_set_f64(&out[2], c, var * momentum + bv * (1 - momentum));
            mean = bm;
            var = bv;
        }
        double a = kf_get_f64(in[1], c) / sqrt(var + eps), b0 = kf_get_f64(in[2], c);
        for (int64_t b = 0; b < N; b++)
            for (int64_t s = 0; s < step; s++) {
                int64_t i = start + b * stride + s;
                kf_set_f64(&out[0], i, (kf_get_f64(x, i) - mean) * a + b0);
            }
    }
    return KF_OK;
}

/* ---- LRN ------------------------------------------------------------------ */

/* y = x / (bias + alpha / size * sum of x^2 over the channel window
 * [c - floor((size-1)/2), c + ceil((size-1)/2)]) ^ beta. The window is
 * clamped to C, so the cost is O(numel * min(size, C)). */
kf_status kf_red_eval_lrn(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0];
    KF_TRY(check_nc(n, x));
    const kf_attr *sa = kf_attr_find(n, "size");
    if (!sa || sa->type != KF_ATTR_INT || sa->i <= 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute size must be a positive integer", kf_node_label(n),
                       n->op_type);
    int64_t size = sa->i;
    double alpha = kf_attr_f(n, "alpha", 1e-4f), beta = kf_attr_f(n, "beta", 0.75f), bias = kf_attr_f(n, "bias", 1.0f);
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    int64_t N = x->dims[0], C = x->dims[1], D = red_prod(x->dims, 2, x->rank);
    int64_t before = (size - 1) / 2, after = size / 2; /* floor and ceil of (size-1)/2 */
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < C; c++) {
            int64_t lo = c - before < 0 ? 0 : c - before;
            int64_t hi = after > C - 1 - c ? C - 1 : c + after;
            for (int64_t s = 0; s < D; s++) {
                double sq = 0;
                for (int64_t k = lo; k <= hi; k++) {
                    double v = kf_get_f64(x, (b * C + k) * D + s);
                    sq += v * v;
                }
                int64_t i = (b * C + c) * D + s;
                kf_set_f64(&out[0], i, kf_get_f64(x, i) / pow(bias + alpha / (double)size * sq, beta));
            }
        }
    return KF_OK;
}
