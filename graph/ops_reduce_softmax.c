/*
 * ops_reduce_softmax.c: reference kernels of Softmax, LogSoftmax and Hardmax
 * (rows coerced to 2-D before opset 13, one axis from 13 on) and of the two
 * losses built on them, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
 * Everything is computed in double (max-shifted exponentials) and rounded
 * once into the output dtype, except a float16/bfloat16 Softmax, which
 * rounds each step of its function body to its type as the ONNX reference
 * does.
 */
#include "ops_nn_util.h"
#include "ops_reduce.h"

typedef enum smkind { SM_SOFT, SM_LOG, SM_HARD } smkind;

/* Rows of a Softmax-family node as [outer, len, inner]: before opset 13 the
 * input is coerced to 2-D at `axis` (default 1, range [-r, r]); from 13 on
 * the op runs along the one axis (default -1). */
static kf_status softmax_rows(const kf_node *n, const kf_tensor *x, int64_t *outer, int64_t *len,
                              int64_t *inner) {
    if (red_opset(n) >= 13) {
        int axis;
        KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), x->rank, &axis));
        red_split(x->rank, x->dims, axis, outer, len, inner);
        return KF_OK;
    }
    int64_t a = kf_attr_i(n, "axis", 1);
    if (a < 0) a += x->rank;
    if (a < 0 || a > x->rank)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is out of range for rank %d", kf_node_label(n),
                       n->op_type, (long long)kf_attr_i(n, "axis", 1), x->rank);
    *outer = red_prod(x->dims, 0, (int)a);
    *len = red_prod(x->dims, (int)a, x->rank);
    *inner = 1;
    return KF_OK;
}

/* y = softmax / log-softmax / hardmax of x along the middle of
 * [outer, len, inner]; x and y have the same element count (any dtypes). */
static void softmax_apply(const kf_tensor *x, kf_tensor *y, int64_t outer, int64_t len, int64_t inner,
                          smkind kind) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            if (kind == SM_HARD) {
                /* first maximum wins; a NaN beats every number, like numpy's argmax */
                int64_t best = 0;
                double bv = len ? kf_get_f64(x, base) : 0;
                for (int64_t k = 1; k < len && !isnan(bv); k++) {
                    double v = kf_get_f64(x, base + k * inner);
                    if (isnan(v) || v > bv) {
                        best = k;
                        bv = v;
                    }
                }
                for (int64_t k = 0; k < len; k++) kf_set_f64(y, base + k * inner, k == best);
                continue;
            }
            double m = -INFINITY, sum = 0;
            for (int64_t k = 0; k < len; k++) {
                double v = kf_get_f64(x, base + k * inner);
                if (v > m || isnan(v)) m = v;
            }
            for (int64_t k = 0; k < len; k++) sum += exp(kf_get_f64(x, base + k * inner) - m);
            double lsum = log(sum);
            for (int64_t k = 0; k < len; k++) {
                double d = kf_get_f64(x, base + k * inner) - m;
                kf_set_f64(y, base + k * inner, kind == SM_LOG ? d - lsum : exp(d) / sum);
            }
        }
}

static kf_status softmax_eval(const kf_node *n, const kf_tensor *const *in, kf_tensor *out, smkind kind) {
    const kf_tensor *x = in[0];
    KF_TRY(red_check_float(n, x, 0));
    int64_t outer = 0, len = 0, inner = 0;
    KF_TRY(softmax_rows(n, x, &outer, &len, &inner));
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, x->dims));
    if (!x->numel) return KF_OK;
    if (kind != SM_SOFT || (x->dtype != KF_DT_FLOAT16 && x->dtype != KF_DT_BFLOAT16)) {
        softmax_apply(x, &out[0], outer, len, inner, kind);
        return KF_OK;
    }
    /* a 16-bit Softmax is its function body (ReduceMax, Sub, Exp,
     * ReduceSum, Div) evaluated op by op in that type, as the ONNX
     * reference and its test data compute it */
    double *row = kf_malloc((size_t)len * sizeof *row);
    if (!row) return kf_fail(KF_ERR_NOMEM, "node '%s': out of memory", kf_node_label(n));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            for (int64_t k = 0; k < len; k++) row[k] = kf_get_f64(x, base + k * inner);
            kf_nn_softmax_row(x->dtype, row, len, false, false);
            for (int64_t k = 0; k < len; k++) kf_set_f64(&out[0], base + k * inner, row[k]);
        }
    kf_free(row);
    return KF_OK;
}

/* Kernels of Softmax, LogSoftmax and Hardmax (shape: kf_shape_same). */
kf_status kf_red_eval_softmax(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return softmax_eval(n, in, out, SM_SOFT);
}

kf_status kf_red_eval_log_softmax(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                  kf_tensor *out) {
    (void)nin;
    (void)nout;
    return softmax_eval(n, in, out, SM_LOG);
}

kf_status kf_red_eval_hardmax(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return softmax_eval(n, in, out, SM_HARD);
}

/* ---- losses ----------------------------------------------------------------- */

typedef enum reduction { RED_NONE, RED_SUM, RED_MEAN } reduction;

static kf_status loss_reduction(const kf_node *n, reduction *r) {
    const char *s = kf_attr_s(n, "reduction", "mean");
    if (strcmp(s, "none") == 0) *r = RED_NONE;
    else if (strcmp(s, "sum") == 0) *r = RED_SUM;
    else if (strcmp(s, "mean") == 0) *r = RED_MEAN;
    else
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): unknown reduction '%s'", kf_node_label(n), n->op_type, s);
    return KF_OK;
}

/* Shared by both losses: out[0] is the target's shape for reduction "none",
 * else a scalar; SoftmaxCrossEntropyLoss's out[1] (log_prob) is the scores'
 * shape. */
kf_status kf_red_shape_loss(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                            int nout, kf_type *out) {
    (void)val;
    if (nout < 1 || nin < 2 || !in[0]) return KF_OK;
    reduction r;
    KF_TRY(loss_reduction(n, &r));
    out[0].dtype = in[0]->dtype;
    if (r != RED_NONE) out[0].rank = 0;
    else if (in[1]) {
        out[0].rank = in[1]->rank;
        memcpy(out[0].dims, in[1]->dims, sizeof out[0].dims);
        memcpy(out[0].syms, in[1]->syms, sizeof out[0].syms);
    }
    if (nout > 1) out[1] = *in[0];
    return KF_OK;
}

/* NegativeLogLikelihoodLoss over log-probabilities lp [N, C, d1..dk] (any
 * float dtype) with targets [N, d1..dk]: loss = -lp[n, t, d] * weight[t];
 * targets equal to ignore_index weigh 0; "mean" divides by the sum of the
 * weights taken (0/0 = NaN when every target is ignored). y is allocated
 * with y_dtype. */
static kf_status nll(const kf_node *n, const kf_tensor *lp, const kf_tensor *target, const kf_tensor *weight,
                     kf_dtype y_dtype, kf_tensor *y) {
    reduction red = RED_NONE;
    KF_TRY(loss_reduction(n, &red));
    KF_TRY(kf_check_dtype(n, target, 1, KF_DT_INT32, KF_DT_INT64, KF_DT_UNDEFINED));
    if (lp->rank < 2)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must have rank >= 2 (N, C, ...), not %d",
                       kf_node_label(n), n->op_type, lp->rank);
    bool same = target->rank == lp->rank - 1 && target->dims[0] == lp->dims[0];
    for (int d = 1; same && d < target->rank; d++) same = target->dims[d] == lp->dims[d + 1];
    if (!same)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): target shape must be the input's without dim 1",
                       kf_node_label(n), n->op_type);
    int64_t N = lp->dims[0], C = lp->dims[1], D = red_prod(lp->dims, 2, lp->rank);
    if (weight) {
        KF_TRY(red_check_float(n, weight, 2));
        if (weight->rank != 1 || weight->dims[0] != C)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): weight must have shape [%lld]", kf_node_label(n),
                           n->op_type, (long long)C);
    }
    const kf_attr *ia = kf_attr_find(n, "ignore_index");
    bool has_ignore = ia && ia->type == KF_ATTR_INT;
    int64_t ignore = has_ignore ? ia->i : 0;
    if (red == RED_NONE) KF_TRY(red_prepare(n, y, y_dtype, target->rank, target->dims));
    else KF_TRY(red_prepare(n, y, y_dtype, 0, NULL));

    double acc = 0, wsum = 0;
    for (int64_t i = 0; target->numel && i < N; i++)
        for (int64_t d = 0; d < D; d++) {
            int64_t t = kf_get_i64(target, i * D + d);
            double loss = 0, w = 0;
            if (!has_ignore || t != ignore) {
                if (t < 0 || t >= C)
                    return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): target %lld is outside [0, %lld)",
                                   kf_node_label(n), n->op_type, (long long)t, (long long)C);
                w = weight ? kf_get_f64(weight, t) : 1.0;
                loss = -kf_get_f64(lp, (i * C + t) * D + d) * w;
            }
            if (red == RED_NONE) kf_set_f64(y, i * D + d, loss);
            acc += loss;
            wsum += w;
        }
    if (red == RED_SUM) kf_set_f64(y, 0, acc);
    if (red == RED_MEAN) kf_set_f64(y, 0, acc / wsum);
    return KF_OK;
}

kf_status kf_red_eval_nll_loss(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nout;
    KF_TRY(red_check_float(n, in[0], 0));
    return nll(n, in[0], in[1], nin > 2 ? in[2] : NULL, in[0]->dtype, &out[0]);
}

kf_status kf_red_eval_sce_loss(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    const kf_tensor *x = in[0];
    KF_TRY(red_check_float(n, x, 0));
    if (x->rank < 2)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): scores must have rank >= 2 (N, C, ...), not %d",
                       kf_node_label(n), n->op_type, x->rank);
    kf_tensor lp = {0}; /* log-probabilities, kept in double */
    kf_status st = kf_tensor_alloc(&lp, KF_DT_DOUBLE, x->rank, x->dims);
    if (st) return kf_fail_context(st, "node '%s' (%s)", kf_node_label(n), n->op_type);
    int64_t outer = 0, len = 0, inner = 0;
    red_split(x->rank, x->dims, 1, &outer, &len, &inner);
    if (x->numel) softmax_apply(x, &lp, outer, len, inner, SM_LOG);
    st = nll(n, &lp, in[1], nin > 2 ? in[2] : NULL, x->dtype, &out[0]);
    if (!st && nout > 1 && n->out[1]) {
        st = red_prepare(n, &out[1], x->dtype, x->rank, x->dims);
        for (int64_t i = 0; !st && i < x->numel; i++) kf_set_f64(&out[1], i, kf_get_f64(&lp, i));
    }
    kf_tensor_release(&lp);
    return st;
}
