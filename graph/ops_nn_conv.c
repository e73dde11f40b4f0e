/*
 * ops_nn_conv.c: reference kernels and shape functions of the convolutions:
 * Conv, ConvTranspose, ConvInteger and QLinearConv, any number of spatial
 * dims, groups, dilations, strides, explicit or automatic padding. One
 * direct loop nest per direction, instantiated for double (float types) and
 * wrapping 64-bit integers (quantised types), so integer results are exact.
 * CausalConvWithState (opset 27) is a depthwise 1-D loop of its own.
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

/* What a convolution needs beyond the window geometry. */
typedef struct conv_plan {
    kf_nn_geom g;
    bool transpose;
    int64_t N, C, M, group, Cg, Mg;
    int64_t insz, outsz, ksz; /* spatial element counts */
    int64_t *taps;            /* ksz x nsp dilated kernel offsets, malloc'ed */
} conv_plan;

static int64_t floor_half(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

/* ConvTranspose output dims and pads (needs in and kernel known). */
static kf_status convt_geom(const kf_node *n, kf_nn_geom *g) {
    int nsp = g->nsp;
    int64_t opad[KF_MAX_RANK] = {0}, oshape[KF_MAX_RANK + 2];
    const kf_attr *a = kf_attr_find(n, "output_padding");
    if (a) {
        if (a->type != KF_ATTR_INTS || a->n != nsp)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output_padding must list %d ints", nsp);
        for (int i = 0; i < nsp; i++) {
            if (a->ints[i] < 0 || a->ints[i] > ((int64_t)1 << 40))
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output_padding[%d] = %lld is out of range",
                                  i, (long long)a->ints[i]);
            opad[i] = a->ints[i];
        }
    }
    const kf_attr *os = kf_attr_find(n, "output_shape");
    int osoff = 0;
    if (os) {
        /* the spatial dims; some exporters also list N and C first */
        if (os->type != KF_ATTR_INTS || (os->n != nsp && os->n != nsp + 2))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output_shape must list %d ints", nsp);
        osoff = os->n - nsp;
        for (int i = 0; i < os->n; i++) {
            if (os->ints[i] < 0)
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output_shape[%d] is negative", i);
            oshape[i] = os->ints[i];
        }
    }
    bool upper = g->auto_pad == KF_NN_SAME_UPPER;
    bool same = upper || g->auto_pad == KF_NN_SAME_LOWER;
    for (int i = 0; i < nsp; i++) {
        g->out[i] = -1;
        if (g->in[i] < 0 || g->kernel[i] < 0) continue;
        if (g->in[i] == 0) return kf_nn_fail(n, KF_ERR_SHAPE, "spatial dim %d of X is 0", i);
        int64_t ext, nat;
        if (!kf_mul_ok(g->kernel[i] - 1, g->dil[i], &ext) || !kf_add_ok(ext, 1, &ext) ||
            !kf_mul_ok(g->stride[i], g->in[i] - 1, &nat) || !kf_add_ok(nat, ext, &nat) ||
            !kf_add_ok(nat, opad[i], &nat))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output size of dim %d overflows", i);
        if (os || same) {
            int64_t out;
            if (os) out = oshape[osoff + i];
            else if (!kf_mul_ok(g->in[i], g->stride[i], &out))
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output size of dim %d overflows", i);
            int64_t total = nat - out;
            /* opset 1 and 11 describe opposite splits for SAME_UPPER */
            bool half_first = (n->opset && n->opset < 11) ? !upper : upper;
            if (half_first) {
                g->pb[i] = floor_half(total);
                g->pe[i] = total - g->pb[i];
            } else {
                g->pe[i] = floor_half(total);
                g->pb[i] = total - g->pe[i];
            }
            g->out[i] = out;
        } else {
            int64_t out = nat - g->pb[i] - g->pe[i]; /* pads bounded by parse checks below */
            if (out < 0)
                return kf_nn_fail(n, KF_ERR_SHAPE, "pads exceed the output size in spatial dim %d",
                                  i);
            g->out[i] = out;
        }
    }
    return KF_OK;
}

/* Output type of a (transposed) convolution of x by w; fills g. */
static kf_status conv_types(const kf_node *n, const kf_type *x, const kf_type *w, bool transpose,
                            kf_type *y, kf_nn_geom *g, int64_t *group_out) {
    kf_type_unknown(y);
    y->dtype = x->dtype;
    int64_t group = kf_attr_i(n, "group", 1);
    if (group < 1)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "group must be >= 1, not %lld", (long long)group);
    *group_out = group;
    int rank = x->rank >= 0 ? x->rank : (w && w->rank >= 0 ? w->rank : -1);
    if (rank < 0) return KF_OK;
    if (rank < 3) return kf_nn_fail(n, KF_ERR_SHAPE, "X must have rank >= 3, not %d", rank);
    if (w && w->rank >= 0 && w->rank != rank)
        return kf_nn_fail(n, KF_ERR_SHAPE, "W has rank %d, X has rank %d", w->rank, rank);
    int nsp = rank - 2;
    int64_t wk[KF_MAX_RANK];
    for (int i = 0; i < nsp; i++) wk[i] = (w && w->rank >= 0) ? w->dims[i + 2] : -1;
    KF_TRY(kf_nn_geom_parse(n, nsp, wk, true, false, g));
    if (x->rank < 0) {
        y->rank = rank;
        for (int d = 0; d < rank; d++) y->dims[d] = -1;
        return KF_OK;
    }
    for (int i = 0; i < nsp; i++) g->in[i] = x->dims[i + 2];
    if (transpose) KF_TRY(convt_geom(n, g));
    else KF_TRY(kf_nn_geom_forward(n, g));
    int64_t C = x->dims[1];
    int64_t w0 = w && w->rank >= 0 ? w->dims[0] : -1, w1 = w && w->rank >= 0 ? w->dims[1] : -1;
    int64_t M = -1;
    if (!transpose) {
        if (C >= 0 && w1 >= 0 && (w1 > INT64_MAX / group || C != w1 * group))
            return kf_nn_fail(n, KF_ERR_SHAPE, "X has %lld channels, W expects %lld x group %lld",
                              (long long)C, (long long)w1, (long long)group);
        if (w0 >= 0 && w0 % group)
            return kf_nn_fail(n, KF_ERR_SHAPE,
                              "%lld output channels are not divisible by group %lld", (long long)w0,
                              (long long)group);
        M = w0;
    } else {
        if (C >= 0 && w0 >= 0 && C != w0)
            return kf_nn_fail(n, KF_ERR_SHAPE, "X has %lld channels, W has %lld", (long long)C,
                              (long long)w0);
        if (C >= 0 && C % group)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%lld channels are not divisible by group %lld",
                              (long long)C, (long long)group);
        if (w1 >= 0 && !kf_mul_ok(w1, group, &M))
            return kf_nn_fail(n, KF_ERR_SHAPE, "output channel count overflows");
    }
    y->rank = rank;
    y->dims[0] = x->dims[0];
    y->syms[0] = x->syms[0];
    y->dims[1] = M;
    for (int i = 0; i < nsp; i++) {
        y->dims[i + 2] = g->out[i];
        if (g->out[i] < 0) continue;
        if (g->out[i] == x->dims[i + 2]) y->syms[i + 2] = x->syms[i + 2];
    }
    return KF_OK;
}

/* Geometry of a concrete convolution; also allocates y when needed. */
static kf_status conv_prepare(const kf_node *n, const kf_tensor *X, const kf_tensor *W,
                              bool transpose, kf_dtype ydt, kf_tensor *Y, conv_plan *p) {
    memset(p, 0, sizeof *p);
    p->transpose = transpose;
    kf_type tx, tw, ty;
    kf_type_of_tensor(&tx, X);
    kf_type_of_tensor(&tw, W);
    KF_TRY(conv_types(n, &tx, &tw, transpose, &ty, &p->g, &p->group));
    for (int i = 0; i < p->g.nsp; i++)
        if (p->g.out[i] < 0) return kf_nn_fail(n, KF_ERR_SHAPE, "cannot compute the output shape");
    if (!Y->data) KF_TRY(kf_tensor_alloc(Y, ydt, ty.rank, ty.dims));
    p->N = X->dims[0];
    p->C = X->dims[1];
    p->M = ty.dims[1];
    p->Cg = p->C / p->group;
    p->Mg = p->M / p->group;
    p->insz = p->outsz = p->ksz = 1;
    for (int i = 0; i < p->g.nsp; i++) {
        p->insz *= p->g.in[i];
        p->outsz *= p->g.out[i];
        p->ksz *= p->g.kernel[i]; /* W exists, so these products fit */
    }
    p->taps = kf_malloc(((size_t)p->ksz * (size_t)p->g.nsp + 1) * sizeof(int64_t));
    if (!p->taps) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t k[KF_MAX_RANK] = {0};
    for (int64_t t = 0; t < p->ksz; t++) {
        for (int i = 0; i < p->g.nsp; i++) p->taps[t * p->g.nsp + i] = k[i] * p->g.dil[i];
        kf_nn_next(p->g.nsp, p->g.kernel, k);
    }
    return KF_OK;
}

/* Spatial offset of input position base + tap, or -1 when outside. */
static inline int64_t tap_offset(const conv_plan *p, const int64_t *base, int64_t t) {
    int64_t off = 0;
    const int64_t *tp = p->taps + t * p->g.nsp;
    for (int i = 0; i < p->g.nsp; i++) {
        int64_t q = base[i] + tp[i];
        if (q < 0 || q >= p->g.in[i]) return -1;
        off = off * p->g.in[i] + q;
    }
    return off;
}

/*
 * Forward:   y[n, m, o] = sum_{c, t} x[n, g*Cg + c, o*s - pb + tap(t)] * w[m, c, t]
 * Transpose: y[n, g*Mg + m, i*s - pb + tap(t)] += x[n, c, i] * w[c, m, t]
 * where m's group g = m / Mg. y must be zero-filled.
 */
#define DEFINE_CONV(NAME, T)                                                                       \
    static void NAME(const conv_plan *p, const T *x, const T *w, T *y, T *acc) {                   \
        int nsp = p->g.nsp;                                                                        \
        int64_t pos[KF_MAX_RANK], base[KF_MAX_RANK];                                               \
        const int64_t *it = p->transpose ? p->g.in : p->g.out;                                     \
        int64_t itsz = p->transpose ? p->insz : p->outsz;                                          \
        for (int64_t b = 0; b < p->N; b++)                                                         \
            for (int64_t gr = 0; gr < p->group; gr++) {                                            \
                memset(pos, 0, sizeof pos);                                                        \
                for (int64_t o = 0; o < itsz; o++) {                                               \
                    for (int i = 0; i < nsp; i++) base[i] = pos[i] * p->g.stride[i] - p->g.pb[i];  \
                    if (!p->transpose) {                                                           \
                        for (int64_t m = 0; m < p->Mg; m++) acc[m] = 0;                            \
                        for (int64_t t = 0; t < p->ksz; t++) {                                     \
                            int64_t xo = tap_offset(p, base, t);                                   \
                            if (xo < 0) continue;                                                  \
                            const T *xc = x + (b * p->C + gr * p->Cg) * p->insz + xo;              \
                            for (int64_t m = 0; m < p->Mg; m++) {                                  \
                                const T *wm = w + (gr * p->Mg + m) * p->Cg * p->ksz + t;           \
                                T s = 0;                                                           \
                                for (int64_t c = 0; c < p->Cg; c++)                                \
                                    s += xc[c * p->insz] * wm[c * p->ksz];                         \
                                acc[m] += s;                                                       \
                            }                                                                      \
                        }                                                                          \
                        for (int64_t m = 0; m < p->Mg; m++)                                        \
                            y[(b * p->M + gr * p->Mg + m) * p->outsz + o] = acc[m];                \
                    } else {                                                                       \
                        for (int64_t t = 0; t < p->ksz; t++) {                                     \
                            int64_t yo = 0;                                                        \
                            const int64_t *tp = p->taps + t * nsp;                                 \
                            for (int i = 0; i < nsp && yo >= 0; i++) {                             \
                                int64_t q = base[i] + tp[i];                                       \
                                yo = (q < 0 || q >= p->g.out[i]) ? -1 : yo * p->g.out[i] + q;      \
                            }                                                                      \
                            if (yo < 0) continue;                                                  \
                            const T *xc = x + (b * p->C + gr * p->Cg) * p->insz + o;               \
                            for (int64_t m = 0; m < p->Mg; m++) {                                  \
                                T s = 0;                                                           \
                                for (int64_t c = 0; c < p->Cg; c++)                                \
                                    s += xc[c * p->insz] *                                         \
                                         w[((gr * p->Cg + c) * p->Mg + m) * p->ksz + t];           \
                                y[(b * p->M + gr * p->Mg + m) * p->outsz + yo] += s;               \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                    kf_nn_next(nsp, it, pos);                                                      \
                }                                                                                  \
            }                                                                                      \
    }

/* Let the integer instantiation wrap instead of overflowing: uint64. */
DEFINE_CONV(conv_f64, double)
DEFINE_CONV(conv_u64, uint64_t)

/* Runs the convolution in double: y (N*M*outsz) is malloc'ed for the caller. */
static kf_status run_f64(const conv_plan *p, const kf_tensor *X, const kf_tensor *W,
                         double **yout) {
    int64_t ysz = p->N * p->M * p->outsz; /* the output tensor exists */
    double *x = kf_nn_to_f64(X), *w = kf_nn_to_f64(W);
    double *y = kf_calloc((size_t)ysz + 1, sizeof(double));
    double *acc = kf_calloc((size_t)p->Mg + 1, sizeof(double));
    if (!x || !w || !y || !acc) {
        kf_free(x);
        kf_free(w);
        kf_free(y);
        kf_free(acc);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    conv_f64(p, x, w, y, acc);
    kf_free(x);
    kf_free(w);
    kf_free(acc);
    *yout = y;
    return KF_OK;
}

/* Integer convolution of centred operands (x, w as int64 arrays). */
static kf_status run_i64(const conv_plan *p, const int64_t *x, const int64_t *w, int64_t **yout) {
    int64_t ysz = p->N * p->M * p->outsz;
    uint64_t *y = kf_calloc((size_t)ysz + 1, sizeof(uint64_t));
    uint64_t *acc = kf_calloc((size_t)p->Mg + 1, sizeof(uint64_t));
    if (!y || !acc) {
        kf_free(y);
        kf_free(acc);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    conv_u64(p, (const uint64_t *)x, (const uint64_t *)w, y, acc);
    kf_free(acc);
    *yout = (int64_t *)y;
    return KF_OK;
}

static kf_status check_bias(const kf_node *n, const kf_tensor *B, int64_t M) {
    if (B && (B->rank != 1 || B->dims[0] != M))
        return kf_nn_fail(n, KF_ERR_SHAPE, "bias B must be 1-D with %lld elements", (long long)M);
    return KF_OK;
}

/* ---- Conv / ConvTranspose ----------------------------------------------------------- */

static kf_status float_conv_shape(const kf_node *n, int nin, const kf_type *const *in, kf_type *out,
                                  bool transpose) {
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "X", kf_nn_float_types));
    if (in[1]->dtype && in[0]->dtype && in[1]->dtype != in[0]->dtype)
        return kf_nn_fail(n, KF_ERR_SHAPE, "W has dtype %s, X has %s", kf_dtype_name(in[1]->dtype),
                          kf_dtype_name(in[0]->dtype));
    kf_nn_geom g;
    int64_t group;
    return conv_types(n, in[0], in[1], transpose, &out[0], &g, &group);
}

kf_status kf_nn_conv_shape(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    return float_conv_shape(n, nin, in, out, false);
}

kf_status kf_nn_convt_shape(const kf_node *n, int nin, const kf_type *const *in,
                            const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    return float_conv_shape(n, nin, in, out, true);
}

static kf_status float_conv_eval(const kf_node *n, int nin, const kf_tensor *const *in,
                                 kf_tensor *out, bool transpose) {
    const kf_tensor *X = in[0], *W = in[1], *B = nin > 2 ? in[2] : NULL;
    KF_TRY(kf_nn_check_dtype(n, X->dtype, "X", kf_nn_float_types));
    if (W->dtype != X->dtype || (B && B->dtype != X->dtype))
        return kf_nn_fail(n, KF_ERR_SHAPE, "X, W and B must share one dtype");
    conv_plan p;
    double *y = NULL;
    kf_status st = conv_prepare(n, X, W, transpose, X->dtype, &out[0], &p);
    if (!st) st = check_bias(n, B, p.M);
    if (!st) st = run_f64(&p, X, W, &y);
    if (!st)
        for (int64_t i = 0; i < out[0].numel; i++) {
            double v = y[i];
            if (B) v += kf_get_f64(B, (i / p.outsz) % p.M);
            kf_set_f64(&out[0], i, v);
        }
    kf_free(p.taps);
    kf_free(y);
    return st;
}

kf_status kf_nn_conv_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                          kf_tensor *out) {
    (void)nout;
    return float_conv_eval(n, nin, in, out, false);
}

kf_status kf_nn_convt_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                           kf_tensor *out) {
    (void)nout;
    return float_conv_eval(n, nin, in, out, true);
}

/* ---- ConvInteger / QLinearConv --------------------------------------------------------- */

/* Centred int64 copies of x (per-tensor zero point) and w (per-tensor or
 * per-output-channel zero point). */
static kf_status centre_xw(const kf_node *n, const kf_tensor *X, const kf_tensor *xzp,
                           const kf_tensor *W, const kf_tensor *wzp, int64_t **xo, int64_t **wo) {
    if (xzp && xzp->numel != 1) return kf_nn_fail(n, KF_ERR_SHAPE, "x_zero_point must be a scalar");
    if ((xzp && xzp->dtype != X->dtype) || (wzp && wzp->dtype != W->dtype))
        return kf_nn_fail(n, KF_ERR_SHAPE, "zero points must have the dtype of their data");
    if (wzp && wzp->numel != 1 && (wzp->rank != 1 || W->rank < 1 || wzp->dims[0] != W->dims[0]))
        return kf_nn_fail(n, KF_ERR_SHAPE,
                          "w_zero_point must be a scalar or have one value per output channel");
    int64_t *x = NULL, *w = NULL;
    KF_TRY(kf_nn_expand_param_i64(n, xzp, "x_zero_point", X->rank, X->dims, -1, &x));
    kf_status st = kf_nn_expand_param_i64(n, wzp, "w_zero_point", W->rank, W->dims, 0, &w);
    if (st) {
        kf_free(x);
        return st;
    }
    for (int64_t i = 0; i < X->numel; i++) x[i] = kf_get_i64(X, i) - x[i];
    for (int64_t i = 0; i < W->numel; i++) w[i] = kf_get_i64(W, i) - w[i];
    *xo = x;
    *wo = w;
    return KF_OK;
}

kf_status kf_nn_convint_shape(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "x", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, in[1]->dtype, "w", kf_nn_q8_types));
    kf_nn_geom g;
    int64_t group;
    KF_TRY(conv_types(n, in[0], in[1], false, &out[0], &g, &group));
    out[0].dtype = KF_DT_INT32;
    return KF_OK;
}

kf_status kf_nn_convint_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                             kf_tensor *out) {
    (void)nout;
    const kf_tensor *X = in[0], *W = in[1];
    KF_TRY(kf_nn_check_dtype(n, X->dtype, "x", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, W->dtype, "w", kf_nn_q8_types));
    conv_plan p;
    int64_t *x = NULL, *w = NULL, *y = NULL;
    kf_status st = conv_prepare(n, X, W, false, KF_DT_INT32, &out[0], &p);
    if (!st) st = centre_xw(n, X, nin > 2 ? in[2] : NULL, W, nin > 3 ? in[3] : NULL, &x, &w);
    if (!st) st = run_i64(&p, x, w, &y);
    if (!st)
        for (int64_t i = 0; i < out[0].numel; i++) kf_set_i64(&out[0], i, y[i]);
    kf_free(p.taps);
    kf_free(x);
    kf_free(w);
    kf_free(y);
    return st;
}

static const kf_dtype qscale_types[] = {KF_DT_FLOAT, KF_DT_UNDEFINED};

kf_status kf_nn_qlinearconv_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 8 || !in[0] || !in[3]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "x", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, in[3]->dtype, "w", kf_nn_q8_types));
    static const int sidx[3] = {1, 4, 6};
    for (int i = 0; i < 3; i++)
        if (sidx[i] < nin && in[sidx[i]])
            KF_TRY(kf_nn_check_dtype(n, in[sidx[i]]->dtype, "scale", qscale_types));
    kf_nn_geom g;
    int64_t group;
    KF_TRY(conv_types(n, in[0], in[3], false, &out[0], &g, &group));
    out[0].dtype = in[7] ? in[7]->dtype : KF_DT_UNDEFINED;
    return KF_OK;
}

kf_status kf_nn_qlinearconv_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    (void)nout;
    const kf_tensor *X = in[0], *W = in[3], *ys = in[6], *yzp = in[7];
    const kf_tensor *B = nin > 8 ? in[8] : NULL;
    KF_TRY(kf_nn_check_dtype(n, X->dtype, "x", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, W->dtype, "w", kf_nn_q8_types));
    KF_TRY(kf_nn_check_dtype(n, yzp->dtype, "y_zero_point", kf_nn_q8_types));
    static const char *snames[3] = {"x_scale", "w_scale", "y_scale"};
    for (int i = 0; i < 3; i++)
        KF_TRY(kf_nn_check_dtype(n, in[i == 2 ? 6 : 1 + 3 * i]->dtype, snames[i], qscale_types));
    if (in[1]->numel != 1 || ys->numel != 1 || yzp->numel != 1)
        return kf_nn_fail(n, KF_ERR_SHAPE, "x_scale, y_scale and y_zero_point must be scalars");
    if (B && B->dtype != KF_DT_INT32) return kf_nn_fail(n, KF_ERR_SHAPE, "bias B must be int32");
    conv_plan p;
    int64_t *x = NULL, *w = NULL, *y = NULL;
    double *ws = NULL;
    kf_status st = conv_prepare(n, X, W, false, yzp->dtype, &out[0], &p);
    if (!st) st = check_bias(n, B, p.M);
    if (!st && in[4]->numel != 1 && (in[4]->rank != 1 || in[4]->dims[0] != p.M))
        st = kf_nn_fail(n, KF_ERR_SHAPE,
                        "w_scale must be a scalar or have one value per output channel");
    if (!st) {
        int64_t m = p.M;
        st = kf_nn_expand_param_f64(n, in[4], "w_scale", 1, &m, 0, &ws);
    }
    if (!st) st = centre_xw(n, X, in[2], W, in[5], &x, &w);
    if (!st) st = run_i64(&p, x, w, &y);
    if (st) goto done;
    double lo, hi;
    kf_nn_int_range(yzp->dtype, &lo, &hi);
    float xs = (float)kf_get_f64(in[1], 0), yscale = (float)kf_get_f64(ys, 0);
    double zp = (double)kf_get_i64(yzp, 0);
    for (int64_t i = 0; i < out[0].numel; i++) {
        int64_t m = (i / p.outsz) % p.M;
        int64_t acc = y[i];
        if (B) acc = (int64_t)((uint64_t)acc + (uint64_t)kf_get_i64(B, m));
        float mult = xs * (float)ws[m] / yscale;
        double v = kf_nn_round_even((double)acc * (double)mult) + zp;
        kf_set_f64(&out[0], i, v < lo ? lo : v > hi ? hi : v);
    }
done:
    kf_free(p.taps);
    kf_free(x);
    kf_free(w);
    kf_free(y);
    kf_free(ws);
    return st;
}

/* ---- CausalConvWithState (opset 27) ------------------------------------------------- */

/*
 * A causal depthwise 1-D convolution with a carried state, for decoding one
 * chunk at a time. x [B, C, L], weight [C, 1, k], bias [C], past [B, C, k-1]
 * (zeros when absent). Over padded = past ++ x along the length:
 *
 *   y[b, c, t]          = bias[c] + sum_j w[c, 0, j] * padded[b, c, t + j]
 *   present[b, c, 0..k-1) = the last k-1 positions of padded
 *
 * then y rounds to x's type and, for activation "silu"/"swish", becomes
 * y * sigmoid(y) in float32, as ONNX's reference computes it.
 */
static const kf_dtype ccs_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_DOUBLE, KF_DT_UNDEFINED};

static kf_status ccs_activation(const kf_node *n, bool *silu) {
    const char *a = kf_attr_s(n, "activation", "none");
    *silu = !strcmp(a, "silu") || !strcmp(a, "swish");
    if (!*silu && strcmp(a, "none"))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "activation '%s' is not none, silu or swish", a);
    return KF_OK;
}

kf_status kf_nn_causal_conv_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    bool silu;
    KF_TRY(ccs_activation(n, &silu));
    if (nin < 2 || !in[0] || !in[1]) return KF_OK;
    const kf_type *x = in[0], *w = in[1];
    const char *names[4] = {"input", "weight", "bias", "past_state"};
    for (int i = 0; i < nin && i < 4; i++) {
        if (!in[i]) continue;
        KF_TRY(kf_nn_check_dtype(n, in[i]->dtype, names[i], ccs_types));
        if (x->dtype && in[i]->dtype && in[i]->dtype != x->dtype)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s is %s, input %s", names[i], kf_dtype_name(in[i]->dtype),
                              kf_dtype_name(x->dtype));
    }
    if ((x->rank >= 0 && x->rank != 3) || (w->rank >= 0 && w->rank != 3))
        return kf_nn_fail(n, KF_ERR_SHAPE, "input and weight must be rank 3, they have %d and %d", x->rank, w->rank);
    out[0] = *x;
    if (nout > 1) {
        out[1].dtype = x->dtype;
        out[1].rank = 3;
        out[1].dims[0] = x->rank == 3 ? x->dims[0] : -1;
        out[1].dims[1] = x->rank == 3 ? x->dims[1] : -1;
        out[1].dims[2] = w->rank == 3 && w->dims[2] >= 1 ? w->dims[2] - 1 : -1;
        if (x->rank == 3) {
            out[1].syms[0] = x->syms[0];
            out[1].syms[1] = x->syms[1];
        }
    }
    if (x->rank != 3 || w->rank != 3) return KF_OK;
    int64_t C = x->dims[1], k = w->dims[2];
    if ((w->dims[0] >= 0 && C >= 0 && w->dims[0] != C) || (w->dims[1] >= 0 && w->dims[1] != 1) || k == 0)
        return kf_nn_fail(n, KF_ERR_SHAPE, "weight must be [channels, 1, k>=1]");
    if (nin > 2 && in[2] && in[2]->rank >= 0 &&
        (in[2]->rank != 1 || (in[2]->dims[0] >= 0 && C >= 0 && in[2]->dims[0] != C)))
        return kf_nn_fail(n, KF_ERR_SHAPE, "bias must be [channels]");
    if (nin > 3 && in[3] && in[3]->rank >= 0) {
        const kf_type *p = in[3];
        bool bad = p->rank != 3;
        for (int d = 0; !bad && d < 3; d++) {
            int64_t want = d < 2 ? x->dims[d] : (k >= 1 ? k - 1 : -1);
            if (p->dims[d] >= 0 && want >= 0 && p->dims[d] != want) bad = true;
        }
        if (bad) return kf_nn_fail(n, KF_ERR_SHAPE, "past_state must be [batch, channels, k-1]");
    }
    return KF_OK;
}

kf_status kf_nn_causal_conv_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    const kf_tensor *x = in[0], *w = in[1], *bias = nin > 2 ? in[2] : NULL, *past = nin > 3 ? in[3] : NULL;
    kf_type ty[4], to[2];
    const kf_type *tp[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < nin && i < 4; i++)
        if (in[i]) {
            kf_type_of_tensor(&ty[i], in[i]);
            tp[i] = &ty[i];
        }
    kf_type_unknown(&to[0]);
    kf_type_unknown(&to[1]);
    KF_TRY(kf_nn_causal_conv_shape(n, nin < 4 ? nin : 4, tp, NULL, 2, to));
    bool silu;
    KF_TRY(ccs_activation(n, &silu));
    for (int j = 0; j < nout && j < 2; j++)
        if (!out[j].data) KF_TRY(kf_tensor_alloc(&out[j], to[j].dtype, to[j].rank, to[j].dims));
    int64_t B = x->dims[0], C = x->dims[1], L = x->dims[2], k = w->dims[2], h = k - 1;
    kf_dtype dt = x->dtype;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            int64_t row = b * C + c;
            /* padded[p]: past (or 0) for p < h, then x */
#define PADDED(p) ((p) < h ? (past ? kf_get_f64(past, row * h + (p)) : 0.0) : kf_get_f64(x, row * L + (p)-h))
            for (int64_t t = 0; t < L; t++) {
                double acc = bias ? kf_get_f64(bias, c) : 0.0;
                for (int64_t j = 0; j < k; j++) acc += kf_get_f64(w, c * k + j) * PADDED(t + j);
                acc = kf_nn_round_to(dt, dt == KF_DT_FLOAT ? (double)(float)acc : acc);
                if (silu) {
                    float v = (float)acc;
                    acc = (double)(v * (1.0f / (1.0f + expf(-v))));
                }
                kf_set_f64(&out[0], row * L + t, acc);
            }
            for (int64_t p = 0; nout > 1 && p < h; p++) kf_set_f64(&out[1], row * h + p, PADDED(L + p));
#undef PADDED
        }
    return KF_OK;
}
