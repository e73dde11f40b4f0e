/*
 * ops_reduce.c: shape functions and reference kernels of the axis
 * reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare},
 * ArgMax/ArgMin, MeanVarianceNormalization, CumSum, CumProd and TopK. Floats
 * accumulate in double; integer sums, products and extrema are exact
 * (wrapping like the fixed-width ONNX types do). Softmax and losses live in
 * ops_reduce_softmax.c, the other normalisations in ops_reduce_norm.c.
 */
#include "ops_reduce.h"

/* ---- iterating a subset of a tensor's axes -------------------------------- */

/* The axes of a tensor selected by a mask, iterated row-major: k-th element
 * of the subset is at offset axis_set_offset(k) (plus a base offset). */
typedef struct axis_set {
    int n;
    int64_t dims[KF_MAX_RANK];
    int64_t strides[KF_MAX_RANK]; /* element strides in the full tensor */
    int64_t count;                /* product of dims, 0 when one is 0 */
} axis_set;

static void axis_set_init(axis_set *s, int rank, const int64_t *dims, const bool *mask, bool want) {
    int64_t strides[KF_MAX_RANK];
    kf_strides(rank, dims, strides);
    s->n = 0;
    for (int d = 0; d < rank; d++) {
        if (mask[d] != want) continue;
        s->dims[s->n] = dims[d];
        s->strides[s->n] = strides[d];
        s->n++;
    }
    s->count = red_prod(s->dims, 0, s->n);
}

static int64_t axis_set_offset(const axis_set *s, int64_t k) {
    int64_t off = 0;
    for (int i = s->n - 1; i >= 0; i--) {
        off += (k % s->dims[i]) * s->strides[i];
        k /= s->dims[i];
    }
    return off;
}

/* Walks every element of an axis_set from a base offset (an odometer, so a
 * whole group costs O(count), not O(count * rank)). */
typedef struct cursor {
    const axis_set *s;
    int64_t idx[KF_MAX_RANK];
    int64_t off;
    int64_t left;
} cursor;

static void cursor_start(cursor *c, const axis_set *s, int64_t base) {
    c->s = s;
    memset(c->idx, 0, sizeof c->idx);
    c->off = base;
    c->left = s->count;
}

static bool cursor_next(cursor *c, int64_t *off) {
    if (c->left <= 0) return false;
    *off = c->off;
    if (--c->left == 0) return true;
    for (int i = c->s->n - 1; i >= 0; i--) {
        c->idx[i]++;
        c->off += c->s->strides[i];
        if (c->idx[i] < c->s->dims[i]) break;
        c->off -= c->idx[i] * c->s->strides[i];
        c->idx[i] = 0;
    }
    return true;
}

/* Sets mask[d] for every axis in list (normalised); duplicates and axes out
 * of range are KF_ERR_BAD_MODEL naming the node. */
static kf_status mask_axes(const kf_node *n, const int64_t *list, int64_t count, int rank, bool *mask) {
    for (int d = 0; d < KF_MAX_RANK; d++) mask[d] = false;
    for (int64_t i = 0; i < count; i++) {
        int a;
        KF_TRY(kf_norm_axis(n, list[i], rank, &a));
        if (rank == 0) continue;
        if (mask[a])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is listed twice", kf_node_label(n),
                           n->op_type, (long long)list[i]);
        mask[a] = true;
    }
    return KF_OK;
}

/* ---- Reduce* -------------------------------------------------------------- */

typedef enum rkind { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L1, R_L2, R_LOGSUM, R_LOGSUMEXP, R_SUMSQ } rkind;

/* First opset where the axes come from input 1 instead of an attribute. */
static int64_t axes_input_opset(rkind kind) { return kind == R_SUM ? 13 : 18; }

/* Which axes node n reduces for an input of rank `rank`.
 *   given   the axes input slot is present
 *   axes_t  its value, or NULL when not known yet (then *known = false)
 * Absent or empty axes mean every axis, or none with noop_with_empty_axes
 * (each output element then reduces a single input element). */
static kf_status reduce_axes(const kf_node *n, rkind kind, bool given, const kf_tensor *axes_t, int rank,
                             bool *mask, bool *known) {
    int64_t from = axes_input_opset(kind);
    bool from_input = red_opset(n) >= from;
    int64_t *owned = NULL;
    const int64_t *list = NULL;
    int64_t count = 0;
    *known = true;
    if (from_input) {
        if (kf_attr_find(n, "axes"))
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axes is an input, not an attribute, from opset %lld",
                           kf_node_label(n), n->op_type, (long long)from);
        if (given) {
            if (!axes_t) {
                *known = false;
                return KF_OK;
            }
            KF_TRY(kf_read_ints(n, axes_t, "axes", &owned, &count));
            list = owned;
        }
    } else {
        if (given)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): no axes input before opset %lld", kf_node_label(n),
                           n->op_type, (long long)from);
        int c = 0;
        list = kf_attr_ints(n, "axes", &c);
        count = c;
    }
    kf_status st = mask_axes(n, list, count, rank, mask);
    kf_free(owned);
    if (st) return st;
    if (count == 0) {
        bool noop = from_input && kf_attr_i(n, "noop_with_empty_axes", 0) != 0;
        for (int d = 0; d < rank; d++) mask[d] = !noop;
    }
    return KF_OK;
}

/* Output dims: reduced axes become 1 (keepdims) or disappear. */
static int reduced_dims(int rank, const int64_t *dims, const bool *mask, bool keep, int64_t *out) {
    int r = 0;
    for (int d = 0; d < rank; d++) {
        if (!mask[d]) out[r++] = dims[d];
        else if (keep) out[r++] = 1;
    }
    return r;
}

static kf_status reduce_shape(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out, rkind kind) {
    if (nout < 1 || nin < 1 || !in[0]) return KF_OK;
    out[0].dtype = in[0]->dtype;
    if (in[0]->rank < 0) return KF_OK;
    bool given = nin > 1 && in[1];
    bool mask[KF_MAX_RANK], known;
    KF_TRY(reduce_axes(n, kind, given, given && val ? val[1] : NULL, in[0]->rank, mask, &known));
    bool keep = kf_attr_i(n, "keepdims", 1) != 0;
    if (!known) {
        if (keep) out[0].rank = in[0]->rank; /* dims stay unknown */
        return KF_OK;
    }
    int r = 0;
    for (int d = 0; d < in[0]->rank; d++) {
        if (mask[d] && !keep) continue;
        out[0].dims[r] = mask[d] ? 1 : in[0]->dims[d];
        out[0].syms[r] = mask[d] ? 0 : in[0]->syms[d];
        r++;
    }
    out[0].rank = r;
    return KF_OK;
}

/* Float (and non-exact integer) reduction of one group, in double. */
static double reduce_group_f64(const kf_tensor *x, rkind kind, const axis_set *red, int64_t base) {
    cursor c;
    int64_t off;
    double acc = kind == R_PROD ? 1.0 : kind == R_MAX ? -INFINITY : kind == R_MIN ? INFINITY : 0.0;
    double shift = 0.0;
    bool nan = false;
    if (kind == R_LOGSUMEXP) {
        double m = -INFINITY;
        cursor_start(&c, red, base);
        while (cursor_next(&c, &off)) {
            double v = kf_get_f64(x, off);
            if (v > m) m = v;
        }
        shift = isfinite(m) ? m : 0.0;
    }
    cursor_start(&c, red, base);
    while (cursor_next(&c, &off)) {
        double v = kf_get_f64(x, off);
        switch (kind) {
        case R_SUM:
        case R_MEAN:
        case R_LOGSUM: acc += v; break;
        case R_L1: acc += fabs(v); break;
        case R_L2:
        case R_SUMSQ: acc += v * v; break;
        case R_PROD: acc *= v; break;
        case R_LOGSUMEXP: acc += exp(v - shift); break;
        case R_MAX:
            if (isnan(v)) nan = true;
            else if (v > acc) acc = v;
            break;
        case R_MIN:
            if (isnan(v)) nan = true;
            else if (v < acc) acc = v;
            break;
        }
    }
    if (nan) return NAN;
    switch (kind) {
    case R_MEAN: return acc / (double)red->count; /* empty set: 0/0 = NaN */
    case R_L2: return sqrt(acc);
    case R_LOGSUM: return log(acc);
    case R_LOGSUMEXP: return log(acc) + shift;
    default: return acc;
    }
}

/* Exact integer reduction of one group into y[o]: sums and products wrap
 * modulo 2^64, which is exact modulo the width of every integer dtype. */
static void reduce_group_int(const kf_tensor *x, rkind kind, const axis_set *red, int64_t base, kf_tensor *y,
                             int64_t o) {
    cursor c;
    int64_t off;
    cursor_start(&c, red, base);
    if (kind == R_MAX || kind == R_MIN) {
        int64_t best = -1;
        while (cursor_next(&c, &off)) {
            int r = best < 0 ? 0 : red_cmp(x, off, best);
            if (best < 0 || (kind == R_MAX ? r > 0 : r < 0)) best = off;
        }
        if (best >= 0) kf_set_u64(y, o, kf_get_u64(x, best));
        else if (x->dtype == KF_DT_BOOL) kf_set_i64(y, o, kind == R_MIN);
        else kf_set_f64(y, o, kind == R_MAX ? -INFINITY : INFINITY); /* saturates to the type's range */
        return;
    }
    bool is_signed = kf_dtype_is_signed(x->dtype);
    uint64_t acc = kind == R_PROD ? 1 : 0;
    while (cursor_next(&c, &off)) {
        uint64_t v = kf_get_u64(x, off);
        switch (kind) {
        case R_SUM: acc += v; break;
        case R_PROD: acc *= v; break;
        case R_SUMSQ: acc += v * v; break;
        case R_L1: acc += (is_signed && kf_get_i64(x, off) < 0) ? 0 - v : v; break;
        default: break;
        }
    }
    kf_set_u64(y, o, acc);
}

static bool exact_int_kind(rkind kind) {
    return kind == R_SUM || kind == R_PROD || kind == R_SUMSQ || kind == R_L1 || kind == R_MAX || kind == R_MIN;
}

static kf_status reduce_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out,
                             rkind kind) {
    (void)nout;
    const kf_tensor *x = in[0];
    if (kind == R_MAX || kind == R_MIN) {
        if (!x || x->dtype != KF_DT_BOOL) KF_TRY(red_check_numeric(n, x, 0));
    } else {
        KF_TRY(red_check_numeric(n, x, 0));
    }
    bool given = nin > 1 && in[1];
    bool mask[KF_MAX_RANK], known;
    KF_TRY(reduce_axes(n, kind, given, given ? in[1] : NULL, x->rank, mask, &known));
    int64_t dims[KF_MAX_RANK];
    int r = reduced_dims(x->rank, x->dims, mask, kf_attr_i(n, "keepdims", 1) != 0, dims);
    kf_tensor *y = &out[0];
    KF_TRY(red_prepare(n, y, x->dtype, r, dims));

    axis_set kept, red;
    axis_set_init(&kept, x->rank, x->dims, mask, false);
    axis_set_init(&red, x->rank, x->dims, mask, true);
    bool exact = (!kf_dtype_is_float(x->dtype)) && exact_int_kind(kind);
    for (int64_t o = 0; o < y->numel; o++) {
        int64_t base = axis_set_offset(&kept, o);
        if (exact) reduce_group_int(x, kind, &red, base, y, o);
        else kf_set_f64(y, o, reduce_group_f64(x, kind, &red, base));
    }
    return KF_OK;
}

#define REDUCE_OP(fn, kind)                                                                                \
    kf_status kf_red_shape_##fn(const kf_node *n, int nin, const kf_type *const *in,                      \
                                const kf_tensor *const *val, int nout, kf_type *out) {                    \
        return reduce_shape(n, nin, in, val, nout, out, kind);                                             \
    }                                                                                                      \
    kf_status kf_red_eval_##fn(const kf_node *n, int nin, const kf_tensor *const *in, int nout,           \
                               kf_tensor *out) {                                                           \
        return reduce_eval(n, nin, in, nout, out, kind);                                                   \
    }

/* Shape functions and kernels of the ten Reduce ops (contracts: kf_ops.h). */
REDUCE_OP(reduce_sum, R_SUM)
REDUCE_OP(reduce_mean, R_MEAN)
REDUCE_OP(reduce_max, R_MAX)
REDUCE_OP(reduce_min, R_MIN)
REDUCE_OP(reduce_prod, R_PROD)
REDUCE_OP(reduce_l1, R_L1)
REDUCE_OP(reduce_l2, R_L2)
REDUCE_OP(reduce_log_sum, R_LOGSUM)
REDUCE_OP(reduce_log_sum_exp, R_LOGSUMEXP)
REDUCE_OP(reduce_sum_square, R_SUMSQ)

/* ---- MeanVarianceNormalization -------------------------------------------- */

/* Y = (X - mean) / (sqrt(variance) + 1e-9) over `axes` (default 0, 2, 3),
 * the epsilon placement of the ONNX function body. */
#define MVN_EPSILON 1e-9

kf_status kf_red_eval_mvn(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0];
    KF_TRY(red_check_float(n, x, 0));
    static const int64_t default_axes[3] = {0, 2, 3};
    int c = 0;
    const int64_t *list = kf_attr_ints(n, "axes", &c);
    if (!kf_attr_find(n, "axes")) {
        list = default_axes;
        c = 3;
    }
    bool mask[KF_MAX_RANK];
    KF_TRY(mask_axes(n, list, c, x->rank, mask));
    kf_tensor *y = &out[0];
    KF_TRY(red_prepare(n, y, x->dtype, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    axis_set kept, red;
    axis_set_init(&kept, x->rank, x->dims, mask, false);
    axis_set_init(&red, x->rank, x->dims, mask, true);
    for (int64_t o = 0; o < kept.count; o++) {
        int64_t base = axis_set_offset(&kept, o), off;
        cursor cur;
        double sum = 0, sq = 0;
        cursor_start(&cur, &red, base);
        while (cursor_next(&cur, &off)) sum += kf_get_f64(x, off);
        double mean = sum / (double)red.count;
        cursor_start(&cur, &red, base);
        while (cursor_next(&cur, &off)) {
            double d = kf_get_f64(x, off) - mean;
            sq += d * d;
        }
        double denom = sqrt(sq / (double)red.count) + MVN_EPSILON;
        cursor_start(&cur, &red, base);
        while (cursor_next(&cur, &off)) kf_set_f64(y, off, (kf_get_f64(x, off) - mean) / denom);
    }
    return KF_OK;
}

/* ---- ArgMax / ArgMin ------------------------------------------------------ */

kf_status kf_red_shape_arg(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                           int nout, kf_type *out) {
    (void)val;
    if (nout < 1 || nin < 1 || !in[0]) return KF_OK;
    out[0].dtype = KF_DT_INT64;
    if (in[0]->rank < 0) return KF_OK;
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), in[0]->rank, &axis));
    bool keep = kf_attr_i(n, "keepdims", 1) != 0;
    int r = 0;
    for (int d = 0; d < in[0]->rank; d++) {
        if (d == axis && !keep) continue;
        out[0].dims[r] = d == axis ? 1 : in[0]->dims[d];
        out[0].syms[r] = d == axis ? 0 : in[0]->syms[d];
        r++;
    }
    out[0].rank = r;
    return KF_OK;
}

/* >0 when element a beats element b, 0 on a tie. NaN beats every number
 * for both directions, as numpy's argmax/argmin do. */
static int arg_better(const kf_tensor *x, int64_t a, int64_t b, bool max) {
    if (kf_dtype_is_float(x->dtype)) {
        bool na = isnan(kf_get_f64(x, a)), nb = isnan(kf_get_f64(x, b));
        if (na || nb) return (int)na - (int)nb;
    }
    int c = red_cmp(x, a, b);
    return max ? c : -c;
}

static kf_status arg_eval(const kf_node *n, const kf_tensor *const *in, kf_tensor *out, bool max) {
    const kf_tensor *x = in[0];
    KF_TRY(red_check_numeric(n, x, 0));
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, &axis));
    bool keep = kf_attr_i(n, "keepdims", 1) != 0;
    bool last = kf_attr_i(n, "select_last_index", 0) != 0;
    int64_t dims[KF_MAX_RANK];
    int r = 0;
    for (int d = 0; d < x->rank; d++) {
        if (d == axis && !keep) continue;
        dims[r++] = d == axis ? 1 : x->dims[d];
    }
    KF_TRY(red_prepare(n, &out[0], KF_DT_INT64, r, dims));
    int64_t outer, len, inner;
    red_split(x->rank, x->dims, axis, &outer, &len, &inner);
    if (out[0].numel == 0) return KF_OK;
    if (len == 0)
        return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): axis %d is empty", kf_node_label(n), n->op_type, axis);
    int64_t *y = out[0].data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i, best = 0;
            for (int64_t k = 1; k < len; k++) {
                int c = arg_better(x, base + k * inner, base + best * inner, max);
                if (c > 0 || (c == 0 && last)) best = k;
            }
            y[o * inner + i] = best;
        }
    return KF_OK;
}

kf_status kf_red_eval_argmax(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return arg_eval(n, in, out, true);
}

kf_status kf_red_eval_argmin(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return arg_eval(n, in, out, false);
}

/* ---- CumSum, CumProd ------------------------------------------------------ */

/* The running sum or product along the axis input, inclusive or exclusive
 * (the first element sees 0 or 1), forward or reversed. Floats accumulate
 * in double and are rounded once per element; integers wrap like the
 * fixed-width type. */
static kf_status cumulate(const kf_node *n, const kf_tensor *const *in, kf_tensor *out, bool prod) {
    const kf_tensor *x = in[0];
    KF_TRY(red_check_numeric(n, x, 0));
    KF_TRY(kf_check_dtype(n, in[1], 1, KF_DT_INT32, KF_DT_INT64, KF_DT_UNDEFINED));
    if (in[1]->numel != 1 || in[1]->rank > 1)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis must hold exactly one value", kf_node_label(n),
                       n->op_type);
    int axis;
    KF_TRY(kf_norm_axis(n, kf_get_i64(in[1], 0), x->rank, &axis));
    bool exclusive = kf_attr_i(n, "exclusive", 0) != 0, reverse = kf_attr_i(n, "reverse", 0) != 0;
    kf_tensor *y = &out[0];
    KF_TRY(red_prepare(n, y, x->dtype, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    int64_t outer, len, inner;
    red_split(x->rank, x->dims, axis, &outer, &len, &inner);
    bool exact = !kf_dtype_is_float(x->dtype);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double facc = prod ? 1 : 0;
            uint64_t iacc = prod ? 1 : 0; /* wraps like the fixed-width type */
            for (int64_t s = 0; s < len; s++) {
                int64_t k = reverse ? len - 1 - s : s;
                int64_t off = (o * len + k) * inner + i;
                if (exact) {
                    uint64_t v = kf_get_u64(x, off);
                    if (exclusive) kf_set_u64(y, off, iacc);
                    iacc = prod ? iacc * v : iacc + v;
                    if (!exclusive) kf_set_u64(y, off, iacc);
                } else {
                    double v = kf_get_f64(x, off);
                    if (exclusive) kf_set_f64(y, off, facc);
                    facc = prod ? facc * v : facc + v;
                    if (!exclusive) kf_set_f64(y, off, facc);
                }
            }
        }
    return KF_OK;
}

kf_status kf_red_eval_cumsum(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return cumulate(n, in, out, false);
}

kf_status kf_red_eval_cumprod(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return cumulate(n, in, out, true);
}

/* ---- TopK ----------------------------------------------------------------- */

/* k from the attribute (before opset 10) or input 1. *known false when the
 * input has no value yet. */
static kf_status topk_k(const kf_node *n, int nin, bool have_k, const kf_tensor *kt, int64_t *k, bool *known) {
    *known = true;
    if (red_opset(n) < 10) {
        if (nin > 1 && have_k)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): k is an attribute before opset 10", kf_node_label(n),
                           n->op_type);
        const kf_attr *a = kf_attr_find(n, "k");
        if (!a || a->type != KF_ATTR_INT)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing integer attribute k", kf_node_label(n),
                           n->op_type);
        *k = a->i;
    } else {
        if (nin < 2 || !have_k)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing input K", kf_node_label(n), n->op_type);
        if (!kt) {
            *known = false;
            return KF_OK;
        }
        if (!kf_dtype_is_int(kt->dtype) || kt->numel != 1 || kt->rank > 1)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): K must be a 1-D integer tensor of one value",
                           kf_node_label(n), n->op_type);
        *k = kf_get_i64(kt, 0);
    }
    if (*k < 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): k is negative (%lld)", kf_node_label(n), n->op_type,
                       (long long)*k);
    return KF_OK;
}

kf_status kf_red_shape_topk(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                            int nout, kf_type *out) {
    if (nout < 2 || nin < 1 || !in[0]) return KF_OK;
    out[0].dtype = in[0]->dtype;
    out[1].dtype = KF_DT_INT64;
    if (in[0]->rank < 0) return KF_OK;
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), in[0]->rank, &axis));
    int64_t k = 0;
    bool known;
    bool have_k = nin > 1 && in[1];
    KF_TRY(topk_k(n, nin, have_k, have_k && val ? val[1] : NULL, &k, &known));
    for (int j = 0; j < 2; j++) {
        out[j].rank = in[0]->rank;
        for (int d = 0; d < in[0]->rank; d++) {
            out[j].dims[d] = in[0]->dims[d];
            out[j].syms[d] = in[0]->syms[d];
        }
        out[j].syms[axis] = 0;
        /* k beyond the axis is the kernel's run-time error */
        bool fits = known && (in[0]->dims[axis] < 0 || k <= in[0]->dims[axis]);
        out[j].dims[axis] = fits ? k : -1;
    }
    return KF_OK;
}

typedef struct topk_slice {
    const kf_tensor *x;
    int64_t base, stride;
    bool largest;
} topk_slice;

/* True when position a of the slice must come before position b. */
static bool topk_before(const topk_slice *s, int64_t a, int64_t b) {
    int c = red_cmp(s->x, s->base + a * s->stride, s->base + b * s->stride);
    return s->largest ? c > 0 : c < 0;
}

/* Stable bottom-up merge sort of positions (ties keep the lower index). */
static void topk_sort(int64_t *pos, int64_t *tmp, int64_t len, const topk_slice *s) {
    for (int64_t width = 1; width < len; width *= 2) {
        for (int64_t lo = 0; lo < len; lo += 2 * width) {
            int64_t mid = lo + width < len ? lo + width : len;
            int64_t hi = lo + 2 * width < len ? lo + 2 * width : len;
            int64_t i = lo, j = mid, t = lo;
            while (i < mid && j < hi) tmp[t++] = topk_before(s, pos[j], pos[i]) ? pos[j++] : pos[i++];
            while (i < mid) tmp[t++] = pos[i++];
            while (j < hi) tmp[t++] = pos[j++];
        }
        memcpy(pos, tmp, (size_t)len * sizeof *pos);
    }
}

kf_status kf_red_eval_topk(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nout;
    const kf_tensor *x = in[0];
    KF_TRY(red_check_numeric(n, x, 0));
    int axis;
    KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", -1), x->rank, &axis));
    if (x->rank == 0)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must have rank >= 1", kf_node_label(n), n->op_type);
    int64_t k;
    bool known;
    bool have_k = nin > 1 && in[1];
    KF_TRY(topk_k(n, nin, have_k, have_k ? in[1] : NULL, &k, &known));
    if (k > x->dims[axis])
        return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): k = %lld exceeds the axis size %lld", kf_node_label(n),
                       n->op_type, (long long)k, (long long)x->dims[axis]);
    bool largest = red_opset(n) < 11 || kf_attr_i(n, "largest", 1) != 0;
    int64_t dims[KF_MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[axis] = k;
    KF_TRY(red_prepare(n, &out[0], x->dtype, x->rank, dims));
    KF_TRY(red_prepare(n, &out[1], KF_DT_INT64, x->rank, dims));
    if (out[0].numel == 0) return KF_OK;
    int64_t outer, len, inner;
    red_split(x->rank, x->dims, axis, &outer, &len, &inner);
    int64_t *pos = kf_calloc((size_t)len, sizeof *pos), *tmp = kf_calloc((size_t)len, sizeof *tmp);
    if (!pos || !tmp) {
        kf_free(pos);
        kf_free(tmp);
        return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
    }
    int64_t *yi = out[1].data;
    /* 'sorted' = 0 leaves the order unspecified; sorted order is a valid one. */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            topk_slice s = {x, o * len * inner + i, inner, largest};
            for (int64_t p = 0; p < len; p++) pos[p] = p;
            topk_sort(pos, tmp, len, &s);
            for (int64_t j = 0; j < k; j++) {
                int64_t dst = (o * k + j) * inner + i;
                red_copy_elem(&out[0], dst, x, s.base + pos[j] * inner);
                yi[dst] = pos[j];
            }
        }
    kf_free(pos);
    kf_free(tmp);
    return KF_OK;
}
