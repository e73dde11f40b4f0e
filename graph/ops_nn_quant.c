/*
 * ops_nn_quant.c: reference kernels and shape functions of linear
 * quantisation: QuantizeLinear and DequantizeLinear (per tensor, per axis
 * and, from opset 21, per block) and DynamicQuantizeLinear. Rounding is to
 * nearest, ties to even, in float32 arithmetic as the ONNX formulas state;
 * results saturate to the integer type. Opset 23 lets the scale's type
 * differ from x's and adds QuantizeLinear's `precision` (the type the
 * division rounds to) and DequantizeLinear's `output_dtype`; 23-28 also
 * add float8/float4/int4/int2/float6 quantised types (handled) and
 * float8e8m0 scales (refused by name).
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

static const kf_dtype q_in_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_INT32,
                                      KF_DT_UNDEFINED};
/* The small types (graph/dtype_small.c) are read and written through
 * kf_get_f64/kf_set_f64 like the others; float8 ignores the zero point
 * and may not saturate, float4/float6 add it as a value. */
static const kf_dtype q_out_types[] = {KF_DT_INT8,         KF_DT_UINT8,          KF_DT_INT16,
                                       KF_DT_UINT16,       KF_DT_INT4,           KF_DT_UINT4,
                                       KF_DT_INT2,         KF_DT_UINT2,          KF_DT_FLOAT8E4M3FN,
                                       KF_DT_FLOAT8E4M3FNUZ, KF_DT_FLOAT8E5M2,   KF_DT_FLOAT8E5M2FNUZ,
                                       KF_DT_FLOAT4E2M1,   KF_DT_FLOAT6E2M3,     KF_DT_FLOAT6E3M2,
                                       KF_DT_UNDEFINED};
static const kf_dtype dq_in_types[] = {KF_DT_INT8,         KF_DT_UINT8,          KF_DT_INT16,
                                       KF_DT_UINT16,       KF_DT_INT32,          KF_DT_INT4,
                                       KF_DT_UINT4,        KF_DT_INT2,           KF_DT_UINT2,
                                       KF_DT_FLOAT8E4M3FN, KF_DT_FLOAT8E4M3FNUZ, KF_DT_FLOAT8E5M2,
                                       KF_DT_FLOAT8E5M2FNUZ, KF_DT_FLOAT4E2M1,   KF_DT_FLOAT6E2M3,
                                       KF_DT_FLOAT6E3M2,   KF_DT_UNDEFINED};

/* float8 quantised values carry no zero point (ONNX's reference ignores it) */
static bool is_float8(kf_dtype dt) {
    return dt == KF_DT_FLOAT8E4M3FN || dt == KF_DT_FLOAT8E4M3FNUZ || dt == KF_DT_FLOAT8E5M2 ||
           dt == KF_DT_FLOAT8E5M2FNUZ;
}
static const kf_dtype scale_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_UNDEFINED};

/* Output dtype of QuantizeLinear: the zero point's, else output_dtype
 * (opset 21), else uint8. */
static kf_status q_out_dtype(const kf_node *n, const kf_type *zp, kf_dtype *dt) {
    int64_t od = kf_attr_i(n, "output_dtype", 0);
    if (od && !kf_dtype_valid((int)od))
        return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "output_dtype %lld is not supported",
                          (long long)od);
    kf_dtype want = zp && zp->dtype ? zp->dtype : od ? (kf_dtype)od : KF_DT_UINT8;
    if (zp && zp->dtype && od && zp->dtype != (kf_dtype)od)
        return kf_nn_fail(n, KF_ERR_SHAPE, "output_dtype %s differs from the zero point's %s",
                          kf_dtype_name((kf_dtype)od), kf_dtype_name(zp->dtype));
    if (!kf_nn_dtype_in(want, q_out_types))
        return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "quantised dtype %s is not supported",
                          kf_dtype_name(want));
    *dt = want;
    return KF_OK;
}

/* A float type attribute of opset 23+ (precision, output_dtype): 0 when
 * absent, else float/float16/bfloat16. */
static kf_status float_attr(const kf_node *n, const char *name, kf_dtype *dt) {
    int64_t v = kf_attr_i(n, name, 0);
    *dt = (kf_dtype)0;
    if (!v) return KF_OK;
    if (!kf_dtype_valid((int)v) || !kf_nn_dtype_in((kf_dtype)v, scale_types))
        return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "%s %lld is not float, float16 or bfloat16", name, (long long)v);
    *dt = (kf_dtype)v;
    return KF_OK;
}

/* The output dtype of DequantizeLinear: output_dtype (opset 23), else the
 * scale's. */
static kf_status dq_out_dtype(const kf_node *n, kf_dtype scale, kf_dtype *dt) {
    kf_dtype od = (kf_dtype)0;
    if (!n->opset || n->opset >= 23) KF_TRY(float_attr(n, "output_dtype", &od));
    *dt = od ? od : scale;
    return KF_OK;
}

kf_status kf_nn_quant_shape(const kf_node *n, int nin, const kf_type *const *in,
                            const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "x", q_in_types));
    if (in[1]) KF_TRY(kf_nn_check_dtype(n, in[1]->dtype, "y_scale", scale_types));
    out[0] = *in[0];
    return q_out_dtype(n, nin > 2 ? in[2] : NULL, &out[0].dtype);
}

kf_status kf_nn_dequant_shape(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "x", dq_in_types));
    out[0] = *in[0];
    out[0].dtype = KF_DT_UNDEFINED;
    if (in[1]) {
        KF_TRY(kf_nn_check_dtype(n, in[1]->dtype, "x_scale", scale_types));
        if (in[1]->dtype) KF_TRY(dq_out_dtype(n, in[1]->dtype, &out[0].dtype));
    }
    if (nin > 2 && in[2] && in[2]->dtype && in[0]->dtype && in[2]->dtype != in[0]->dtype)
        return kf_nn_fail(n, KF_ERR_SHAPE, "x_zero_point has dtype %s, x has %s",
                          kf_dtype_name(in[2]->dtype), kf_dtype_name(in[0]->dtype));
    return KF_OK;
}

/*
 * For every element of x, the offset of its scale and zero point:
 *   per tensor  scale has one element
 *   per axis    scale is 1-D with x.dims[axis] elements (opset 13+)
 *   per block   block_size > 0: scale has x's rank, dims[axis] =
 *               ceil(x.dims[axis] / block_size), other dims equal (opset 21)
 */
static kf_status param_offsets(const kf_node *n, const kf_tensor *x, const kf_tensor *scale,
                               const kf_tensor *zp, int64_t **offs) {
    if (scale->numel == 0) return kf_nn_fail(n, KF_ERR_SHAPE, "scale is empty");
    /* a one-element scale and zero point are both per tensor, whatever
     * their ranks ([] and [1] in ONNX's own int4/float8 tests) */
    bool one = scale->numel == 1 && zp && zp->numel == 1;
    if (zp && !one && (zp->rank != scale->rank ||
                       memcmp(zp->dims, scale->dims, sizeof(int64_t) * (size_t)scale->rank)))
        return kf_nn_fail(n, KF_ERR_SHAPE, "scale and zero point must have the same shape");
    int64_t block = kf_attr_i(n, "block_size", 0);
    if (block < 0) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "block_size must be >= 0");
    bool per_tensor = scale->numel == 1 && block == 0;
    if (!per_tensor && n->opset && n->opset < 13)
        return kf_nn_fail(n, KF_ERR_SHAPE, "scale must be a scalar before opset 13");
    int axis = 0;
    if (!per_tensor) KF_TRY(kf_norm_axis(n, kf_attr_i(n, "axis", 1), x->rank, &axis));
    if (!per_tensor && x->rank == 0)
        return kf_nn_fail(n, KF_ERR_SHAPE, "a scalar x needs a scalar scale");
    int64_t *o = kf_calloc((size_t)x->numel + 1, sizeof(int64_t));
    if (!o) return kf_fail(KF_ERR_NOMEM, "out of memory");
    *offs = o;
    if (per_tensor) return KF_OK;
    int64_t idx[KF_MAX_RANK] = {0}, sstr[KF_MAX_RANK];
    if (block == 0) {
        if (scale->rank != 1 || scale->dims[0] != x->dims[axis]) goto bad;
        for (int d = 0; d < x->rank; d++) sstr[d] = d == axis ? 1 : 0;
    } else {
        if (scale->rank != x->rank) goto bad;
        for (int d = 0; d < x->rank; d++) {
            int64_t want = d == axis ? (x->dims[d] + block - 1) / block : x->dims[d];
            if (x->dims[d] > INT64_MAX - block) want = x->dims[d] / block + 1;
            if (scale->dims[d] != want) goto bad;
        }
        kf_strides(scale->rank, scale->dims, sstr);
    }
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++)
            off += (d == axis && block ? idx[d] / block : idx[d]) * sstr[d];
        o[i] = off;
        kf_nn_next(x->rank, x->dims, idx);
    }
    return KF_OK;
bad:
    kf_free(o);
    *offs = NULL;
    return kf_nn_fail(n, KF_ERR_SHAPE, "scale of rank %d does not fit x along axis %d", scale->rank,
                      axis);
}

kf_status kf_nn_quant_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                           kf_tensor *out) {
    (void)nout;
    const kf_tensor *x = in[0], *scale = in[1], *zp = nin > 2 ? in[2] : NULL;
    KF_TRY(kf_nn_check_dtype(n, x->dtype, "x", q_in_types));
    KF_TRY(kf_nn_check_dtype(n, scale->dtype, "y_scale", scale_types));
    kf_type zt;
    if (zp) kf_type_of_tensor(&zt, zp);
    kf_dtype odt;
    KF_TRY(q_out_dtype(n, zp ? &zt : NULL, &odt));
    int64_t *offs = NULL;
    KF_TRY(param_offsets(n, x, scale, zp, &offs));
    if (!out[0].data) {
        kf_status st = kf_tensor_alloc(&out[0], odt, x->rank, x->dims);
        if (st) {
            kf_free(offs);
            return st;
        }
    }
    kf_dtype prec = (kf_dtype)0;
    if (!n->opset || n->opset >= 23) {
        kf_status st = float_attr(n, "precision", &prec);
        if (st) {
            kf_free(offs);
            return st;
        }
    }
    double lo, hi;
    kf_nn_int_range(odt, &lo, &hi);
    bool saturate = kf_attr_i(n, "saturate", 1) != 0;
    for (int64_t i = 0; i < x->numel && kf_dtype_is_small_float(odt); i++) {
        float s = (float)kf_get_f64(scale, offs[i]);
        float xv = (float)kf_get_f64(x, i);
        if (prec == KF_DT_FLOAT16 || prec == KF_DT_BFLOAT16) {
            s = (float)kf_nn_round_to(prec, s);
            xv = (float)kf_nn_round_to(prec, xv);
        }
        double q = (double)(xv / s);
        if (prec == KF_DT_FLOAT16 || prec == KF_DT_BFLOAT16) q = kf_nn_round_to(prec, q);
        if (!is_float8(odt) && zp) q += kf_get_f64(zp, offs[i]);
        ((uint8_t *)out[0].data)[i] = kf_f64_to_small(odt, q, saturate || !is_float8(odt));
    }
    for (int64_t i = 0; i < x->numel && !kf_dtype_is_small_float(odt); i++) {
        float s = (float)kf_get_f64(scale, offs[i]);
        float xv = (float)kf_get_f64(x, i);
        if (prec == KF_DT_FLOAT16 || prec == KF_DT_BFLOAT16) { /* operands and quotient in that type */
            s = (float)kf_nn_round_to(prec, s);
            xv = (float)kf_nn_round_to(prec, xv);
        }
        float q = xv / s;
        if (prec == KF_DT_FLOAT16 || prec == KF_DT_BFLOAT16) q = (float)kf_nn_round_to(prec, q);
        double v = kf_nn_round_even((double)q) + (zp ? (double)kf_get_i64(zp, offs[i]) : 0.0);
        kf_set_f64(&out[0], i, v < lo ? lo : v > hi ? hi : v);
    }
    kf_free(offs);
    return KF_OK;
}

kf_status kf_nn_dequant_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                             kf_tensor *out) {
    (void)nout;
    const kf_tensor *x = in[0], *scale = in[1], *zp = nin > 2 ? in[2] : NULL;
    KF_TRY(kf_nn_check_dtype(n, x->dtype, "x", dq_in_types));
    KF_TRY(kf_nn_check_dtype(n, scale->dtype, "x_scale", scale_types));
    if (zp && zp->dtype != x->dtype)
        return kf_nn_fail(n, KF_ERR_SHAPE, "x_zero_point has dtype %s, x has %s",
                          kf_dtype_name(zp->dtype), kf_dtype_name(x->dtype));
    kf_dtype odt;
    KF_TRY(dq_out_dtype(n, scale->dtype, &odt));
    int64_t *offs = NULL;
    KF_TRY(param_offsets(n, x, scale, zp, &offs));
    if (!out[0].data) {
        kf_status st = kf_tensor_alloc(&out[0], odt, x->rank, x->dims);
        if (st) {
            kf_free(offs);
            return st;
        }
    }
    for (int64_t i = 0; i < x->numel; i++) {
        if (kf_dtype_is_small_float(x->dtype)) {
            bool use_zp = zp && !is_float8(x->dtype) && x->dtype != KF_DT_FLOAT4E2M1;
            double dx = kf_get_f64(x, i) - (use_zp ? kf_get_f64(zp, offs[i]) : 0);
            kf_set_f64(&out[0], i, (double)(float)dx * kf_get_f64(scale, offs[i]));
            continue;
        }
        int64_t c = kf_get_i64(x, i) - (zp ? kf_get_i64(zp, offs[i]) : 0);
        kf_set_f64(&out[0], i, (double)c * kf_get_f64(scale, offs[i]));
    }
    kf_free(offs);
    return KF_OK;
}

/* ---- DynamicQuantizeLinear ----------------------------------------------------------- */

kf_status kf_nn_dynquant_shape(const kf_node *n, int nin, const kf_type *const *in,
                               const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    static const kf_dtype f32[] = {KF_DT_FLOAT, KF_DT_UNDEFINED};
    if (nin < 1 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "x", f32));
    out[0] = *in[0];
    out[0].dtype = KF_DT_UINT8;
    if (nout > 1) {
        out[1].dtype = KF_DT_FLOAT;
        out[1].rank = 0;
    }
    if (nout > 2) {
        out[2].dtype = KF_DT_UINT8;
        out[2].rank = 0;
    }
    return KF_OK;
}

/*
 * Range [min(0, min x), max(0, max x)] onto uint8 [0, 255] in float32:
 *   scale = (max - min) / 255 (1/255 when the range is empty)
 *   zero_point = rint(clamp(-min / scale, 0, 255))
 *   y = clamp(rint(x / scale) + zero_point, 0, 255)
 */
kf_status kf_nn_dynquant_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                              kf_tensor *out) {
    kf_type tx, to[3];
    const kf_type *tp[1] = {&tx};
    kf_type_of_tensor(&tx, in[0]);
    for (int j = 0; j < 3; j++) kf_type_unknown(&to[j]);
    KF_TRY(kf_nn_dynquant_shape(n, nin, tp, in, 3, to));
    for (int j = 0; j < nout && j < 3; j++)
        if (!out[j].data) KF_TRY(kf_tensor_alloc(&out[j], to[j].dtype, to[j].rank, to[j].dims));
    const kf_tensor *x = in[0];
    float mn = 0.0f, mx = 0.0f;
    for (int64_t i = 0; i < x->numel; i++) {
        float v = (float)kf_get_f64(x, i);
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    float scale = (mx == mn ? 1.0f : (mx - mn)) / 255.0f;
    float zpf = 0.0f - mn / scale;
    zpf = zpf < 0.0f ? 0.0f : zpf > 255.0f ? 255.0f : zpf;
    double zp = kf_nn_round_even(zpf);
    for (int64_t i = 0; i < x->numel; i++) {
        float q = (float)kf_get_f64(x, i) / scale;
        double v = kf_nn_round_even(q) + zp;
        kf_set_f64(&out[0], i, v < 0 ? 0 : v > 255 ? 255 : v);
    }
    if (nout > 1 && out[1].data) kf_set_f64(&out[1], 0, scale);
    if (nout > 2 && out[2].data) kf_set_f64(&out[2], 0, zp);
    return KF_OK;
}
