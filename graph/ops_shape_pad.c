/*
 * ops_shape_pad.c: shape functions and reference kernels of Pad (constant,
 * reflect, edge and wrap modes; negative pads crop) and CenterCropPad, which
 * is a Pad whose amounts come from a target shape. Both run one kernel:
 * per dim a table maps each output index to an input index (or to the pad
 * value), then one pass over the output gathers.
 */
#include <string.h>

#include "ops_shape.h"

enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

/* Pad amounts per input dim; begin/end may be negative (crop). */
typedef struct pad_plan {
    bool known; /* pads (and axes) values are known */
    bool touched[KF_MAX_RANK];
    int64_t begin[KF_MAX_RANK], end[KF_MAX_RANK];
} pad_plan;

static kf_status pad_mode(const kf_node *n, enum pad_mode *mode) {
    const char *m = kf_attr_s(n, "mode", "constant");
    if (strcmp(m, "constant") == 0) *mode = PAD_CONSTANT;
    else if (strcmp(m, "reflect") == 0) *mode = PAD_REFLECT;
    else if (strcmp(m, "edge") == 0) *mode = PAD_EDGE;
    else if (strcmp(m, "wrap") == 0 && kf_layout_opset(n) >= 19) *mode = PAD_WRAP;
    else
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): unknown mode '%s' at opset %lld",
                       kf_node_label(n), n->op_type, m, (long long)n->opset);
    return KF_OK;
}

/* Marks axes[0..cnt) (normalised against rank) in touched; repeats are errors. */
static kf_status pad_axes(const kf_node *n, const int64_t *axes, int64_t cnt, int rank, int *norm) {
    bool seen[KF_MAX_RANK] = {false};
    for (int64_t k = 0; k < cnt; k++) {
        int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
        if (a < 0 || a >= rank)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is out of range for rank %d",
                           kf_node_label(n), n->op_type, (long long)axes[k], rank);
        if (seen[a])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is repeated", kf_node_label(n),
                           n->op_type, (long long)axes[k]);
        seen[a] = true;
        norm[k] = (int)a;
    }
    return KF_OK;
}

/* pads: attribute before opset 11, input 1 after; axes: input 3 from 18. */
static kf_status pad_read(const kf_node *n, int nin, const kf_type *const *in,
                          const kf_tensor *const *val, int rank, pad_plan *p) {
    memset(p, 0, sizeof *p);
    int64_t *pads = NULL, npads = 0, *axes = NULL, naxes = rank;
    bool present, known, apresent = false, aknown = true;
    KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "pads", 11, &pads, &npads, &present, &known));
    kf_status st = KF_OK;
    if (!present) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): pads are required", kf_node_label(n),
                     n->op_type);
        goto done;
    }
    if (kf_layout_opset(n) >= 18 &&
        (st = kf_layout_int_list(n, nin, in, val, 3, "axes", 0, &axes, &naxes, &apresent, &aknown)))
        goto done;
    if (!apresent) naxes = rank;
    p->known = known && aknown;
    if (!p->known) goto done;
    if (naxes > rank || npads != 2 * naxes) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %lld pads for %lld axes of a rank-%d input",
                     kf_node_label(n), n->op_type, (long long)npads, (long long)naxes, rank);
        goto done;
    }
    int norm[KF_MAX_RANK];
    if (apresent) {
        if ((st = pad_axes(n, axes, naxes, rank, norm))) goto done;
    } else {
        for (int d = 0; d < rank; d++) norm[d] = d;
    }
    for (int64_t k = 0; k < naxes; k++) {
        p->touched[norm[k]] = true;
        p->begin[norm[k]] = pads[k];
        p->end[norm[k]] = pads[naxes + k];
    }
done:
    kf_free(pads);
    kf_free(axes);
    return st;
}

/* Output size of one dim (dim >= 0), checking what the mode can produce. */
static kf_status pad_dim(const kf_node *n, int d, int64_t dim, int64_t b, int64_t e,
                         enum pad_mode mode, int64_t *out) {
    int64_t r;
    if (!kf_add_ok(dim, b, &r) || !kf_add_ok(r, e, &r) || r < 0)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): pads %lld, %lld on dim %d of size %lld give no valid size",
                       kf_node_label(n), n->op_type, (long long)b, (long long)e, d, (long long)dim);
    if (mode != PAD_CONSTANT && (b > 0 || e > 0)) {
        int64_t kept;
        if (!kf_add_ok(dim, b < 0 ? b : 0, &kept) || !kf_add_ok(kept, e < 0 ? e : 0, &kept) || kept <= 0)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): dim %d has no elements left to pad from",
                           kf_node_label(n), n->op_type, d);
    }
    *out = r;
    return KF_OK;
}

/* Output type from an input type and a plan (shared with CenterCropPad). */
static kf_status pad_type(const kf_node *n, const kf_type *x, const pad_plan *p, enum pad_mode mode,
                          kf_type *o) {
    o->dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    o->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        o->dims[d] = -1;
        o->syms[d] = 0;
        if (p->known && (!p->touched[d] || (p->begin[d] == 0 && p->end[d] == 0))) {
            o->dims[d] = x->dims[d];
            o->syms[d] = x->syms[d];
        } else if (p->known && x->dims[d] >= 0) {
            KF_TRY(pad_dim(n, d, x->dims[d], p->begin[d], p->end[d], mode, &o->dims[d]));
        }
    }
    return KF_OK;
}

kf_status kf_layout_pad_shape(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    enum pad_mode mode;
    KF_TRY(pad_mode(n, &mode));
    out[0].dtype = in[0]->dtype;
    if (kf_layout_opset(n) >= 11 && nin > 2 && in[2] && in[2]->dtype && in[0]->dtype &&
        in[2]->dtype != in[0]->dtype)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): constant_value is %s, data is %s",
                       kf_node_label(n), n->op_type, kf_dtype_name(in[2]->dtype),
                       kf_dtype_name(in[0]->dtype));
    if (in[0]->rank < 0) return KF_OK;
    pad_plan p;
    KF_TRY(pad_read(n, nin, in, val, in[0]->rank, &p));
    return pad_type(n, in[0], &p, mode, &out[0]);
}

/* Input index along one dim for output index o, or -1 for the pad value.
 * Non-constant modes pad from the kept (uncropped) range [lo, lo + m);
 * pad_dim has checked that range is non-empty, so -b and -e fit. */
static int64_t pad_source(int64_t o, int64_t dim, int64_t b, int64_t e, enum pad_mode mode) {
    if (mode == PAD_CONSTANT) {
        if (b < 0 && o > INT64_MAX + b) return -1; /* o - b would overflow: far outside */
        int64_t i = o - b;
        return i >= 0 && i < dim ? i : -1;
    }
    int64_t lo = b < 0 ? -b : 0, m = dim - lo - (e < 0 ? -e : 0);
    int64_t j = o - (b > 0 ? b : 0);
    if (j >= 0 && j < m) return lo + j;
    switch (mode) {
    case PAD_EDGE: j = j < 0 ? 0 : m - 1; break;
    case PAD_WRAP: j = ((j % m) + m) % m; break;
    default: { /* reflect, mirrored on the edge elements: period 2(m-1) */
        if (m == 1) {
            j = 0;
            break;
        }
        int64_t period = 2 * (m - 1);
        j = ((j % period) + period) % period;
        if (j >= m) j = period - j;
        break;
    }
    }
    return lo + j;
}

/* The Pad kernel. value: one element of x's dtype, NULL for the zero. */
static kf_status pad_run(const kf_tensor *x, kf_tensor *o, const pad_plan *p,
                         enum pad_mode mode, const kf_tensor *value) {
    if (o->numel == 0) return KF_OK;
    int rank = x->rank;
    int64_t *map[KF_MAX_RANK] = {NULL};
    int64_t istr[KF_MAX_RANK], idx[KF_MAX_RANK] = {0};
    kf_strides(rank, x->dims, istr);
    kf_status st = KF_OK;
    kf_tensor zero = {0};
    /* non-empty output: each dim is at most numel long */
    for (int d = 0; d < rank; d++) {
        map[d] = kf_calloc((size_t)o->dims[d], sizeof(int64_t));
        if (!map[d]) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto done;
        }
        int64_t b = p->touched[d] ? p->begin[d] : 0, e = p->touched[d] ? p->end[d] : 0;
        for (int64_t k = 0; k < o->dims[d]; k++) map[d][k] = pad_source(k, x->dims[d], b, e, mode);
    }
    if (!value) {
        int64_t one = 1;
        if ((st = kf_tensor_alloc(&zero, x->dtype, 0, &one))) goto done;
        if (x->dtype == KF_DT_STRING && (st = kf_layout_set_empty_string(&zero, 0))) goto done;
        value = &zero;
    }
    for (int64_t e = 0; e < o->numel && !st; e++) {
        int64_t off = 0;
        for (int d = 0; d < rank && off >= 0; d++) {
            int64_t s = map[d][idx[d]];
            off = s < 0 ? -1 : off + s * istr[d];
        }
        st = off < 0 ? kf_layout_copy_elem(o, e, value, 0) : kf_layout_copy_elem(o, e, x, off);
        for (int d = rank - 1; d >= 0; d--) {
            if (++idx[d] < o->dims[d]) break;
            idx[d] = 0;
        }
    }
done:
    kf_tensor_release(&zero);
    for (int d = 0; d < rank; d++) kf_free(map[d]);
    return st;
}

/* Types of up to `max` concrete inputs, for re-reading parameters. */
static void types_of(int nin, const kf_tensor *const *in, kf_type *buf, const kf_type **tp, int max) {
    for (int i = 0; i < max; i++) {
        tp[i] = NULL;
        if (i < nin && in[i]) {
            kf_type_of_tensor(&buf[i], in[i]);
            tp[i] = &buf[i];
        }
    }
}

kf_status kf_layout_pad_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                             kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_pad_shape));
    const kf_tensor *x = in[0];
    enum pad_mode mode;
    KF_TRY(pad_mode(n, &mode));
    kf_type buf[4];
    const kf_type *tp[4];
    int nn = nin < 4 ? nin : 4;
    types_of(nn, in, buf, tp, 4);
    pad_plan p;
    KF_TRY(pad_read(n, nn, tp, in, x->rank, &p));
    kf_tensor attr_value = {0};
    const kf_tensor *value = NULL;
    if (kf_layout_opset(n) < 11) {
        float f = kf_attr_f(n, "value", 0.0f);
        if (f != 0 && x->dtype != KF_DT_STRING) {
            int64_t one = 1;
            KF_TRY(kf_tensor_alloc(&attr_value, x->dtype, 0, &one));
            kf_set_f64(&attr_value, 0, f);
            value = &attr_value;
        }
    } else if (nin > 2 && in[2]) {
        if (in[2]->numel != 1)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): constant_value must have one element",
                           kf_node_label(n), n->op_type);
        value = in[2];
    }
    kf_status st = pad_run(x, &out[0], &p, mode, value);
    kf_tensor_release(&attr_value);
    return st;
}

/* ---- CenterCropPad ---------------------------------------------------------------- */

/* Plan from the target shape: each axis is cropped or padded around its
 * centre (the odd element goes to the end). shape unknown: plan unknown. */
static kf_status ccp_plan(const kf_node *n, const kf_type *x, const kf_tensor *shape, pad_plan *p,
                          int64_t *target) {
    memset(p, 0, sizeof *p);
    int cnt;
    const int64_t *axes = kf_attr_ints(n, "axes", &cnt);
    int norm[KF_MAX_RANK];
    if (axes) {
        if (cnt > x->rank)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d axes for a rank-%d input",
                           kf_node_label(n), n->op_type, cnt, x->rank);
        KF_TRY(pad_axes(n, axes, cnt, x->rank, norm));
    } else {
        cnt = x->rank;
        for (int d = 0; d < cnt; d++) norm[d] = d;
    }
    for (int k = 0; k < cnt; k++) p->touched[norm[k]] = true;
    if (!shape) return KF_OK;
    int64_t *sh, ns;
    KF_TRY(kf_read_ints(n, shape, "shape", &sh, &ns));
    kf_status st = KF_OK;
    if (ns != cnt) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): shape has %lld entries for %d axes",
                     kf_node_label(n), n->op_type, (long long)ns, cnt);
        goto done;
    }
    p->known = true;
    for (int k = 0; k < cnt; k++) {
        int a = norm[k];
        if (sh[k] < 0) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): negative target dim %lld",
                         kf_node_label(n), n->op_type, (long long)sh[k]);
            goto done;
        }
        target[a] = sh[k];
        if (x->dims[a] < 0) continue;
        int64_t diff = sh[k] - x->dims[a]; /* both non-negative: no overflow */
        int64_t mag = diff < 0 ? -diff : diff, half = mag / 2;
        p->begin[a] = diff < 0 ? -half : half;
        p->end[a] = diff < 0 ? -(mag - half) : mag - half;
    }
done:
    kf_free(sh);
    return st;
}

kf_status kf_layout_centercroppad_shape(const kf_node *n, int nin, const kf_type *const *in,
                                        const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    pad_plan p;
    int64_t target[KF_MAX_RANK];
    KF_TRY(ccp_plan(n, x, nin > 1 && val ? val[1] : NULL, &p, target));
    out[0].rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out[0].dims[d] = p.touched[d] ? (p.known ? target[d] : -1) : x->dims[d];
        out[0].syms[d] = p.touched[d] ? 0 : x->syms[d];
    }
    return KF_OK;
}

kf_status kf_layout_centercroppad_eval(const kf_node *n, int nin, const kf_tensor *const *in,
                                       int nout, kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_centercroppad_shape));
    kf_type x;
    kf_type_of_tensor(&x, in[0]);
    pad_plan p;
    int64_t target[KF_MAX_RANK];
    KF_TRY(ccp_plan(n, &x, in[1], &p, target));
    return pad_run(in[0], &out[0], &p, PAD_CONSTANT, NULL);
}
