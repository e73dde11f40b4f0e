/*
 * ops_shape_gen.c: shape functions and reference kernels of the ops that
 * create tensors from attributes, shapes or scalars rather than moving an
 * input: Constant, ConstantOfShape, Range, EyeLike, and Trilu (which keeps
 * or zeroes elements by position). Constant folding runs these through the
 * reference evaluator, so their shapes are static whenever values are known.
 */
#include <math.h>
#include <string.h>

#include "ops_shape.h"

/* Stores the dtype's zero (empty string, false, 0) at t[i]. */
static kf_status set_zero(kf_tensor *t, int64_t i) {
    if (t->dtype == KF_DT_STRING) return kf_layout_set_empty_string(t, i);
    size_t esz = kf_dtype_size(t->dtype);
    memset((char *)t->data + (size_t)i * esz, 0, esz);
    return KF_OK;
}

/* ---- Constant ---------------------------------------------------------------- */

static const char *const constant_attrs[] = {"value",        "sparse_value", "value_float",
                                             "value_floats", "value_int",    "value_ints",
                                             "value_string", "value_strings"};

kf_status kf_constant_value_attr(const kf_node *n, const kf_attr **out) {
    const kf_attr *found = NULL;
    for (size_t k = 0; k < sizeof constant_attrs / sizeof constant_attrs[0]; k++) {
        const kf_attr *a = kf_attr_find(n, constant_attrs[k]);
        if (!a) continue;
        if (found)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): both '%s' and '%s' are set",
                           kf_node_label(n), n->op_type, found->name, a->name);
        found = a;
    }
    if (!found)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): no value attribute", kf_node_label(n),
                       n->op_type);
    if (strcmp(found->name, "sparse_value") == 0)
        return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' (%s): sparse_value constants are not supported",
                       kf_node_label(n), n->op_type);
    static const kf_attr_type kinds[] = {KF_ATTR_TENSOR, KF_ATTR_SPARSE_TENSOR, KF_ATTR_FLOAT,
                                         KF_ATTR_FLOATS, KF_ATTR_INT,           KF_ATTR_INTS,
                                         KF_ATTR_STRING, KF_ATTR_STRINGS};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (strcmp(found->name, constant_attrs[k]) == 0 &&
            (found->type != kinds[k] || (kinds[k] == KF_ATTR_TENSOR && !found->t)))
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' has the wrong kind",
                           kf_node_label(n), n->op_type, found->name);
    *out = found;
    return KF_OK;
}

kf_status kf_layout_constant_shape(const kf_node *n, int nin, const kf_type *const *in,
                                   const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nin;
    (void)in;
    (void)val;
    (void)nout;
    const kf_attr *a;
    KF_TRY(kf_constant_value_attr(n, &a));
    kf_type *o = &out[0];
    o->rank = 1;
    memset(o->syms, 0, sizeof o->syms);
    switch (a->type) {
    case KF_ATTR_TENSOR: kf_type_of_tensor(o, a->t); break;
    case KF_ATTR_FLOAT: o->dtype = KF_DT_FLOAT; o->rank = 0; break;
    case KF_ATTR_FLOATS: o->dtype = KF_DT_FLOAT; o->dims[0] = a->n; break;
    case KF_ATTR_INT: o->dtype = KF_DT_INT64; o->rank = 0; break;
    case KF_ATTR_INTS: o->dtype = KF_DT_INT64; o->dims[0] = a->n; break;
    case KF_ATTR_STRING: o->dtype = KF_DT_STRING; o->rank = 0; break;
    default: o->dtype = KF_DT_STRING; o->dims[0] = a->n; break; /* STRINGS */
    }
    return KF_OK;
}

kf_status kf_layout_constant_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                  kf_tensor *out) {
    const kf_attr *a;
    KF_TRY(kf_constant_value_attr(n, &a));
    if (a->type == KF_ATTR_TENSOR) return kf_tensor_copy(&out[0], a->t);
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_constant_shape));
    kf_tensor *o = &out[0];
    switch (a->type) {
    case KF_ATTR_FLOAT: kf_set_f64(o, 0, a->f); break;
    case KF_ATTR_FLOATS:
        for (int k = 0; k < a->n; k++) kf_set_f64(o, k, a->floats[k]);
        break;
    case KF_ATTR_INT: kf_set_i64(o, 0, a->i); break;
    case KF_ATTR_INTS:
        for (int k = 0; k < a->n; k++) kf_set_i64(o, k, a->ints[k]);
        break;
    default: {
        int cnt = a->type == KF_ATTR_STRING ? 1 : a->n;
        const kf_bytes *src = a->type == KF_ATTR_STRING ? &a->s : a->strings;
        kf_bytes *dst = o->data;
        for (int k = 0; k < cnt; k++) {
            size_t len = src[k].ptr ? src[k].len : 0;
            char *p = kf_strndup(src[k].ptr ? src[k].ptr : "", len);
            if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory");
            kf_free(dst[k].ptr);
            dst[k].ptr = p;
            dst[k].len = len;
        }
        break;
    }
    }
    return KF_OK;
}

/* ---- ConstantOfShape ---------------------------------------------------------- */

/* The fill value: the one-element 'value' tensor, or NULL for float 0. */
static kf_status cos_value(const kf_node *n, const kf_tensor **v) {
    *v = NULL;
    const kf_attr *a = kf_attr_find(n, "value");
    if (!a) return KF_OK;
    if (a->type != KF_ATTR_TENSOR || !a->t || a->t->numel != 1)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): 'value' must be a one-element tensor",
                       kf_node_label(n), n->op_type);
    *v = a->t;
    return KF_OK;
}

/* Reads a shape given as a 1-D integer tensor into dims/rank; negative dims
 * and ranks over KF_MAX_RANK are errors naming the node. */
static kf_status read_shape(const kf_node *n, const kf_tensor *t, const char *what, int *rank,
                            int64_t *dims) {
    int64_t *v, cnt;
    KF_TRY(kf_read_ints(n, t, what, &v, &cnt));
    kf_status st = KF_OK;
    if (cnt > KF_MAX_RANK) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): '%s' has %lld dims, more than %d",
                     kf_node_label(n), n->op_type, what, (long long)cnt, KF_MAX_RANK);
        goto done;
    }
    for (int64_t k = 0; k < cnt; k++) {
        if (v[k] < 0) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): '%s' has negative dim %lld",
                         kf_node_label(n), n->op_type, what, (long long)v[k]);
            goto done;
        }
        dims[k] = v[k];
    }
    *rank = (int)cnt;
done:
    kf_free(v);
    return st;
}

kf_status kf_layout_constantofshape_shape(const kf_node *n, int nin, const kf_type *const *in,
                                          const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    const kf_tensor *v;
    KF_TRY(cos_value(n, &v));
    out[0].dtype = v ? v->dtype : KF_DT_FLOAT;
    if (nin < 1 || !in[0]) return KF_OK;
    if (val && val[0]) return read_shape(n, val[0], "input", &out[0].rank, out[0].dims);
    if (in[0]->rank == 1 && in[0]->dims[0] >= 0 && in[0]->dims[0] <= KF_MAX_RANK) {
        out[0].rank = (int)in[0]->dims[0];
        for (int d = 0; d < out[0].rank; d++) out[0].dims[d] = -1;
    }
    return KF_OK;
}

kf_status kf_layout_constantofshape_eval(const kf_node *n, int nin, const kf_tensor *const *in,
                                         int nout, kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_constantofshape_shape));
    const kf_tensor *v;
    KF_TRY(cos_value(n, &v));
    for (int64_t i = 0; i < out[0].numel; i++)
        KF_TRY(v ? kf_layout_copy_elem(&out[0], i, v, 0) : set_zero(&out[0], i));
    return KF_OK;
}

/* ---- Range ------------------------------------------------------------------------ */

/* Element count of Range(start, limit, delta):
 * max(ceil((limit - start) / delta), 0), exact for integer dtypes. */
static kf_status range_count(const kf_node *n, const kf_tensor *const *v, int64_t *count) {
    kf_dtype dt = v[0]->dtype;
    int64_t cap = KF_MAX_TENSOR_BYTES / (int64_t)kf_dtype_size(dt);
    if (kf_dtype_is_float(dt)) {
        double s = kf_get_f64(v[0], 0), l = kf_get_f64(v[1], 0), d = kf_get_f64(v[2], 0);
        double c = ceil((l - s) / d);
        if (d == 0 || !isfinite(c))
            return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): Range(%g, %g, %g) has no finite length",
                           kf_node_label(n), n->op_type, s, l, d);
        if (c > (double)cap)
            return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): Range of %g elements is too large",
                           kf_node_label(n), n->op_type, c);
        *count = c > 0 ? (int64_t)c : 0;
        return KF_OK;
    }
    int64_t s = kf_get_i64(v[0], 0), l = kf_get_i64(v[1], 0), d = kf_get_i64(v[2], 0);
    if (d == 0)
        return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): delta is 0", kf_node_label(n), n->op_type);
    uint64_t span, step;
    if (d > 0 && l > s) {
        span = (uint64_t)l - (uint64_t)s;
        step = (uint64_t)d;
    } else if (d < 0 && l < s) {
        span = (uint64_t)s - (uint64_t)l;
        step = (uint64_t)0 - (uint64_t)d;
    } else {
        *count = 0;
        return KF_OK;
    }
    uint64_t c = span / step + (span % step != 0);
    if (c > (uint64_t)cap)
        return kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): Range of %llu elements is too large",
                       kf_node_label(n), n->op_type, (unsigned long long)c);
    *count = (int64_t)c;
    return KF_OK;
}

static kf_status range_check(const kf_node *n, int nin, const kf_type *const *in) {
    for (int i = 0; i < 3 && i < nin; i++) {
        if (!in[i]) continue;
        kf_dtype dt = in[i]->dtype;
        if (dt && !kf_dtype_is_float(dt) && !kf_dtype_is_int(dt))
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d has unsupported dtype %s",
                           kf_node_label(n), n->op_type, i, kf_dtype_name(dt));
        if (in[0] && dt && in[0]->dtype && dt != in[0]->dtype)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): inputs have different dtypes",
                           kf_node_label(n), n->op_type);
        bool scalar = in[i]->rank == 0 || (in[i]->rank == 1 && in[i]->dims[0] == 1);
        if (in[i]->rank >= 0 && !scalar && !(in[i]->rank == 1 && in[i]->dims[0] < 0))
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d must be a scalar",
                           kf_node_label(n), n->op_type, i);
    }
    return KF_OK;
}

kf_status kf_layout_range_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    KF_TRY(range_check(n, nin, in));
    out[0].dtype = nin > 0 && in[0] ? in[0]->dtype : KF_DT_UNDEFINED;
    out[0].rank = 1;
    out[0].dims[0] = -1;
    if (nin < 3 || !val || !val[0] || !val[1] || !val[2]) return KF_OK;
    return range_count(n, val, &out[0].dims[0]);
}

/* Range 27's stash_type: the precision of the steps for float16 and
 * bfloat16 outputs, float (1, the default) or double (11). */
static kf_status range_stash(const kf_node *n, int64_t *stash) {
    const kf_attr *a = kf_attr_find(n, "stash_type");
    *stash = a && a->type == KF_ATTR_INT ? a->i : KF_DT_FLOAT;
    if (*stash != KF_DT_FLOAT && *stash != KF_DT_DOUBLE)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): stash_type %lld is not float (1) or double (11)",
                       kf_node_label(n), n->op_type, (long long)*stash);
    return KF_OK;
}

kf_status kf_layout_range_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_range_shape));
    kf_tensor *o = &out[0];
    if (kf_dtype_is_float(o->dtype)) {
        double s = kf_get_f64(in[0], 0), d = kf_get_f64(in[2], 0);
        int64_t stash = KF_DT_DOUBLE;
        if ((o->dtype == KF_DT_FLOAT16 || o->dtype == KF_DT_BFLOAT16) && kf_layout_opset(n) >= 27)
            KF_TRY(range_stash(n, &stash));
        if (stash == KF_DT_FLOAT) {
            /* steps in float32, as numpy's arange fills a float32 array:
             * the step is the difference of the first two values */
            float fs = (float)s, fd = (float)(s + d) - fs;
            for (int64_t i = 0; i < o->numel; i++) kf_set_f64(o, i, (double)(fs + (float)i * fd));
            return KF_OK;
        }
        for (int64_t i = 0; i < o->numel; i++) kf_set_f64(o, i, s + (double)i * d);
        return KF_OK;
    }
    /* every value lies between start and limit, so wrapping arithmetic is exact */
    uint64_t s = (uint64_t)kf_get_i64(in[0], 0), d = (uint64_t)kf_get_i64(in[2], 0);
    for (int64_t i = 0; i < o->numel; i++) kf_set_i64(o, i, (int64_t)(s + (uint64_t)i * d));
    return KF_OK;
}

/* ---- EyeLike ------------------------------------------------------------------------ */

static kf_status eyelike_dtype(const kf_node *n, kf_dtype in_dt, kf_dtype *dt) {
    const kf_attr *a = kf_attr_find(n, "dtype");
    int64_t v = a && a->type == KF_ATTR_INT ? a->i : (int64_t)in_dt;
    if (!kf_dtype_valid((int)v) || v != (int)v || v == KF_DT_STRING || v == KF_DT_COMPLEX64 ||
        v == KF_DT_COMPLEX128)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): output dtype %lld is not supported",
                       kf_node_label(n), n->op_type, (long long)v);
    *dt = (kf_dtype)v;
    return KF_OK;
}

kf_status kf_layout_eyelike_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    if (in[0]->rank >= 0 && in[0]->rank != 2)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must be 2-D, it has rank %d",
                       kf_node_label(n), n->op_type, in[0]->rank);
    out[0] = *in[0];
    if (!in[0]->dtype && !kf_attr_find(n, "dtype")) return KF_OK;
    return eyelike_dtype(n, in[0]->dtype, &out[0].dtype);
}

kf_status kf_layout_eyelike_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_eyelike_shape));
    kf_tensor *o = &out[0];
    int64_t rows = o->dims[0], cols = o->dims[1], k = kf_attr_i(n, "k", 0);
    memset(o->data, 0, (size_t)o->numel * kf_dtype_size(o->dtype));
    if (k >= cols || k <= -rows) return KF_OK;
    for (int64_t i = k < 0 ? -k : 0; i < rows && i + k < cols; i++) kf_set_f64(o, i * cols + i + k, 1.0);
    return KF_OK;
}

/* ---- Trilu -------------------------------------------------------------------------- */

static kf_status trilu_k(const kf_node *n, int nin, const kf_tensor *const *in, int64_t *k) {
    *k = 0;
    if (nin < 2 || !in[1]) return KF_OK;
    if (in[1]->numel != 1 || !kf_dtype_is_int(in[1]->dtype))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): k must be an integer scalar",
                       kf_node_label(n), n->op_type);
    *k = kf_get_i64(in[1], 0);
    return KF_OK;
}

kf_status kf_layout_trilu_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    if (in[0]->rank >= 0 && in[0]->rank < 2)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must have rank >= 2, it has %d",
                       kf_node_label(n), n->op_type, in[0]->rank);
    out[0] = *in[0];
    return KF_OK;
}

/* Keeps element (i, j) of each matrix where j - i >= k (upper) or j - i <= k
 * (lower); the rest become the dtype's zero. */
kf_status kf_layout_trilu_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_trilu_shape));
    int64_t k;
    KF_TRY(trilu_k(n, nin, in, &k));
    bool upper = kf_attr_i(n, "upper", 1) != 0;
    const kf_tensor *x = in[0];
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    for (int64_t e = 0; e < x->numel; e++) {
        int64_t j = e % cols, i = (e / cols) % rows;
        bool keep = upper ? j - i >= k : j - i <= k;
        KF_TRY(keep ? kf_layout_copy_elem(&out[0], e, x, e) : set_zero(&out[0], e));
    }
    return KF_OK;
}
