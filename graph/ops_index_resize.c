/*
 * ops_index_resize.c: shape functions and reference kernels for resampling:
 * Resize (opsets 10-19 semantics), Upsample (7-9), GridSample, RoiAlign and
 * NonMaxSuppression. Nearest sampling copies elements bitwise; linear and
 * cubic interpolate in double, one axis at a time (both are separable), with
 * the coordinate rules of the ONNX reference implementation.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kf_ref.h"

/* Resize taps per output position are bounded by the antialias footprint,
 * about 4 / scale; scale >= 1 / input length whenever the output is not empty,
 * so this many taps per input element is never exceeded by a valid model. */
#define RESIZE_MAX_TAPS_PER_ELEM 8
/* GridSample evaluates taps^spatial_rank points per output element; 4096
 * covers bicubic in 6-D, far beyond any real use. */
#define GRID_MAX_TAPS 4096
/* RoiAlign samples per output bin: a sampling grid larger than this comes
 * only from absurd ROI coordinates and would stall the evaluator. */
#define ROI_MAX_SAMPLES ((int64_t)1 << 20)

/* dst[di] = src[si], bitwise; strings deep-copied. */
static kf_status copy_elem(kf_tensor *dst, int64_t di, const kf_tensor *src, int64_t si) {
    if (src->dtype == KF_DT_STRING) {
        kf_bytes *d = (kf_bytes *)dst->data + di;
        const kf_bytes *s = (const kf_bytes *)src->data + si;
        char *p = kf_strndup(s->ptr ? s->ptr : "", s->len);
        if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory copying strings");
        kf_free(d->ptr);
        d->ptr = p;
        d->len = s->len;
        return KF_OK;
    }
    size_t esz = kf_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)di * esz, (const char *)src->data + (size_t)si * esz, esz);
    return KF_OK;
}

static bool is_real(kf_dtype dt) { return kf_dtype_is_float(dt) || kf_dtype_is_int(dt); }

/* Stores an interpolated value: integers round half to even and saturate
 * (the reference's saturate_cast), floats round to the dtype. */
static void store_rounded(kf_tensor *t, int64_t i, double v) {
    kf_set_f64(t, i, kf_dtype_is_float(t->dtype) ? v : nearbyint(v));
}

/* Reads up to max numbers of a 1-D tensor (NULL or empty: count 0). */
static kf_status read_f64s(const kf_node *n, const kf_tensor *t, const char *what, bool want_int,
                           double *buf, int max, int *count) {
    *count = 0;
    if (!t || t->numel == 0) return KF_OK;
    if (t->rank > 1 || (want_int ? !kf_dtype_is_int(t->dtype) : !kf_dtype_is_float(t->dtype)))
        return kf_node_fail(n, KF_ERR_SHAPE, "%s must be a 1-D %s tensor", what, want_int ? "integer" : "float");
    if (t->numel > max)
        return kf_node_fail(n, KF_ERR_SHAPE, "%s has %lld elements, at most %d expected", what, (long long)t->numel, max);
    for (int64_t i = 0; i < t->numel; i++) buf[i] = want_int ? (double)kf_get_i64(t, i) : kf_get_f64(t, i);
    *count = (int)t->numel;
    return KF_OK;
}

/* ---- Resize / Upsample: parameters ---------------------------------------- */

enum { CT_HALF_PIXEL, CT_HALF_PIXEL_SYM, CT_PYTORCH, CT_ALIGN, CT_ASYM, CT_TF_NN, CT_TF_CROP };
enum { NM_PREFER_FLOOR, NM_PREFER_CEIL, NM_FLOOR, NM_CEIL, NM_SIMPLE };
enum { MODE_NEAREST, MODE_LINEAR, MODE_CUBIC };

typedef struct rplan {
    int rank;
    int64_t in[KF_MAX_RANK], out[KF_MAX_RANK];
    double scale[KF_MAX_RANK], roi_lo[KF_MAX_RANK], roi_hi[KF_MAX_RANK];
    bool ident[KF_MAX_RANK]; /* axis passes through unchanged */
    int mode, coord, nearest;
    double cubic_a, extrapolation;
    bool exclude_outside, antialias;
} rplan;

/* Index of s in names[0..count), or -1. */
static int pick(const char *s, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* Attributes: mode, coordinate mapping and its options, by op and opset. */
static kf_status resize_attrs(const kf_node *n, rplan *p) {
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const coords[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                         "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                                         "tf_crop_and_resize"};
    static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    int64_t v = n->opset;
    bool old = n->op == KF_OP_UPSAMPLE || v == 10; /* Upsample and Resize-10 */
    const char *mode = kf_attr_s(n, "mode", "nearest");
    p->mode = pick(mode, modes, old ? 2 : 3);
    if (p->mode < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown mode '%s'", mode);
    p->cubic_a = kf_attr_f(n, "cubic_coeff_a", -0.75f);
    p->extrapolation = kf_attr_f(n, "extrapolation_value", 0.0f);
    p->exclude_outside = !old && kf_attr_i(n, "exclude_outside", 0) != 0;
    p->antialias = !old && (v == 0 || v >= 18) && kf_attr_i(n, "antialias", 0) != 0;
    if (p->antialias && p->mode == MODE_NEAREST)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "antialias applies to linear and cubic modes only");
    if (old) { /* ONNX Runtime's rule for these: asymmetric, floor up / ceil down */
        p->coord = CT_ASYM;
        p->nearest = NM_SIMPLE;
        return KF_OK;
    }
    const char *ct = kf_attr_s(n, "coordinate_transformation_mode", "half_pixel");
    p->coord = pick(ct, coords, 7);
    if (p->coord < 0 || (p->coord == CT_TF_NN && v >= 13) || (p->coord == CT_HALF_PIXEL_SYM && v && v < 19))
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "coordinate_transformation_mode '%s' is not valid at opset %lld",
                     ct, (long long)v);
    const char *nm = kf_attr_s(n, "nearest_mode", "round_prefer_floor");
    p->nearest = pick(nm, nearests, 4);
    if (p->nearest < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown nearest_mode '%s'", nm);
    return KF_OK;
}

static bool close1(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) || a == b; }

/* Output dims and per-axis scale and ROI. in[] may hold -1 (shape inference
 * on unknown dims): the affected outputs become -1. scales/sizes/roi are the
 * input values (count 0 when absent or empty). */
static kf_status resize_plan(const kf_node *n, int rank, const int64_t *in, const double *scales,
                             int nscales, const double *sizes, int nsizes, const double *roi, int nroi,
                             rplan *p) {
    p->rank = rank;
    int axes[KF_MAX_RANK], naxes = rank;
    for (int d = 0; d < rank; d++) {
        axes[d] = d;
        p->in[d] = p->out[d] = in[d];
        p->scale[d] = 1.0;
        p->roi_lo[d] = 0.0;
        p->roi_hi[d] = 1.0;
        p->ident[d] = true;
    }
    int cnt;
    const int64_t *ax = kf_attr_ints(n, "axes", &cnt);
    if (ax && n->op == KF_OP_RESIZE && (n->opset == 0 || n->opset >= 18)) {
        if (cnt > rank) return kf_node_fail(n, KF_ERR_BAD_MODEL, "%d axes for rank %d", cnt, rank);
        bool seen[KF_MAX_RANK] = {false};
        for (int i = 0; i < cnt; i++) {
            KF_TRY(kf_norm_axis(n, ax[i], rank, &axes[i]));
            if (seen[axes[i]]) return kf_node_fail(n, KF_ERR_BAD_MODEL, "axis %lld repeats", (long long)ax[i]);
            seen[axes[i]] = true;
        }
        naxes = cnt;
    }
    if ((nscales > 0) == (nsizes > 0))
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "exactly one of scales and sizes must be given");
    if (nscales + nsizes != naxes)
        return kf_node_fail(n, KF_ERR_SHAPE, "%s has %d elements for %d axes", nscales ? "scales" : "sizes",
                     nscales + nsizes, naxes);
    if (nroi && nroi != 2 * naxes)
        return kf_node_fail(n, KF_ERR_SHAPE, "roi has %d elements, expected %d", nroi, 2 * naxes);
    for (int i = 0; i < naxes && nroi; i++) {
        p->roi_lo[axes[i]] = roi[i];
        p->roi_hi[axes[i]] = roi[naxes + i];
    }
    if (nscales) {
        for (int i = 0; i < naxes; i++) {
            int a = axes[i];
            double s = scales[i];
            if (!(s > 0) || isinf(s)) return kf_node_fail(n, KF_ERR_RUNTIME, "scale %g must be positive and finite", s);
            p->scale[a] = s;
            p->ident[a] = s == 1.0;
            if (in[a] < 0) continue;
            double o = floor(s * (double)in[a]);
            if (o > (double)KF_MAX_TENSOR_BYTES)
                return kf_node_fail(n, KF_ERR_RUNTIME, "scale %g makes dim %d too large", s, a);
            p->out[a] = (int64_t)o;
        }
        return KF_OK;
    }
    const char *policy = n->opset == 0 || n->opset >= 18 ? kf_attr_s(n, "keep_aspect_ratio_policy", "stretch") : "stretch";
    static const char *const policies[] = {"stretch", "not_larger", "not_smaller"};
    int pol = pick(policy, policies, 3);
    if (pol < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown keep_aspect_ratio_policy '%s'", policy);
    double common = pol == 1 ? INFINITY : 0;
    bool known = true;
    for (int i = 0; i < naxes; i++) {
        int a = axes[i];
        if (sizes[i] < 0 || sizes[i] > (double)KF_MAX_TENSOR_BYTES)
            return kf_node_fail(n, KF_ERR_RUNTIME, "size %g is out of range", sizes[i]);
        p->ident[a] = false;
        p->out[a] = (int64_t)sizes[i];
        if (in[a] < 0) {
            known = false;
            continue;
        }
        p->scale[a] = in[a] ? sizes[i] / (double)in[a] : 1.0;
        if (pol == 1) common = fmin(common, p->scale[a]);
        if (pol == 2) common = fmax(common, p->scale[a]);
    }
    if (pol == 0) return KF_OK;
    for (int i = 0; i < naxes; i++) {
        int a = axes[i];
        if (!known) {
            p->out[a] = -1;
            continue;
        }
        double o = common * (double)in[a] + 0.5;
        if (!(o <= (double)KF_MAX_TENSOR_BYTES)) return kf_node_fail(n, KF_ERR_RUNTIME, "sizes make dim %d too large", a);
        p->scale[a] = common;
        p->out[a] = (int64_t)o;
    }
    return KF_OK;
}

/* Which input slots hold roi, scales and sizes for this op and opset. */
static void resize_slots(const kf_node *n, int *roi, int *scales, int *sizes) {
    *roi = *sizes = -1;
    *scales = 1;
    if (n->op == KF_OP_RESIZE && n->opset != 10) {
        *roi = 1;
        *scales = 2;
        *sizes = 3;
    }
}

/* Reads roi/scales/sizes from tensors t[] (NULL when absent) into the plan. */
static kf_status resize_plan_from(const kf_node *n, int rank, const int64_t *in,
                                  const kf_tensor *roi_t, const kf_tensor *scales_t,
                                  const kf_tensor *sizes_t, rplan *p) {
    double scales[KF_MAX_RANK], sizes[KF_MAX_RANK], roi[2 * KF_MAX_RANK];
    int ns = 0, nz = 0, nr = 0;
    if (n->op == KF_OP_UPSAMPLE && !scales_t) {
        int cnt;
        const float *f = kf_attr_floats(n, "scales", &cnt);
        if (!f || cnt > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_BAD_MODEL, "needs a scales attribute of at most %d values", KF_MAX_RANK);
        for (int i = 0; i < cnt; i++) scales[i] = f[i];
        ns = cnt;
    } else {
        KF_TRY(read_f64s(n, scales_t, "scales", false, scales, KF_MAX_RANK, &ns));
    }
    KF_TRY(read_f64s(n, sizes_t, "sizes", true, sizes, KF_MAX_RANK, &nz));
    KF_TRY(read_f64s(n, roi_t, "roi", false, roi, 2 * KF_MAX_RANK, &nr));
    KF_TRY(resize_plan(n, rank, in, scales, ns, sizes, nz, roi, nr, p));
    if (n->op == KF_OP_UPSAMPLE)
        for (int d = 0; d < rank; d++)
            if (p->scale[d] < 1) return kf_node_fail(n, KF_ERR_BAD_MODEL, "Upsample scale %g is below 1", p->scale[d]);
    return KF_OK;
}

kf_status kf_index_shape_resize(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    if (nin < 1 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    out[0].rank = x->rank;
    for (int d = 0; d < x->rank; d++) out[0].dims[d] = -1;
    int sr, ss, sz;
    resize_slots(n, &sr, &ss, &sz);
    const kf_tensor *t[2] = {NULL, NULL};
    int slots[2] = {ss, sz};
    for (int k = 0; k < 2; k++) {
        int s = slots[k];
        if (s < 0 || s >= nin || !in[s]) continue;
        if (val && val[s]) t[k] = val[s];
        else if (!(kf_type_is_static(in[s]) && in[s]->rank == 1 && in[s]->dims[0] == 0)) return KF_OK;
    }
    if (n->op == KF_OP_RESIZE && !t[0] && !t[1]) return KF_OK; /* e.g. only a type known */
    rplan p;
    KF_TRY(resize_plan_from(n, x->rank, x->dims, NULL, t[0], t[1], &p));
    for (int d = 0; d < x->rank; d++) {
        out[0].dims[d] = p.out[d];
        if (p.out[d] < 0 && p.ident[d]) out[0].syms[d] = x->syms[d];
    }
    return KF_OK;
}

/* ---- Resize / Upsample: kernels -------------------------------------------- */

/* Source coordinate of output index x along an axis; *outside is set when
 * tf_crop_and_resize lands outside the input (the extrapolation value). */
static double map_coord(const rplan *p, int a, double x, bool *outside) {
    double s = p->scale[a], in = (double)p->in[a], ow = s * in, oi = (double)p->out[a], r;
    *outside = false;
    switch (p->coord) {
    case CT_HALF_PIXEL: return (x + 0.5) / s - 0.5;
    case CT_HALF_PIXEL_SYM: {
        double offset = in / 2 * (1 - oi / ow);
        return offset + (x + 0.5) / s - 0.5;
    }
    case CT_PYTORCH: return ow == 1 ? -0.5 : (x + 0.5) / s - 0.5;
    case CT_ALIGN: return ow == 1 ? 0.0 : x * (in - 1) / (ow - 1);
    case CT_ASYM: return x / s;
    case CT_TF_NN: return (x + 0.5) / s;
    default:
        r = ow == 1 ? (p->roi_hi[a] - p->roi_lo[a]) * (in - 1) / 2
                    : x * (p->roi_hi[a] - p->roi_lo[a]) * (in - 1) / (ow - 1);
        r += p->roi_lo[a] * (in - 1);
        *outside = !(r >= 0 && r <= in - 1);
        return r;
    }
}

/* Source index of nearest sampling, clamped into [0, in). */
static int64_t nearest_index(const rplan *p, int a, double x) {
    int64_t in = p->in[a];
    if (isnan(x) || x < 0) return 0;
    if (x > (double)in) return in - 1;
    double f = floor(x), r = x - f;
    int64_t i = (int64_t)f;
    if (r != 0) {
        switch (p->nearest) {
        case NM_PREFER_FLOOR: i += r > 0.5; break;
        case NM_PREFER_CEIL: i += r >= 0.5; break;
        case NM_FLOOR: break;
        case NM_CEIL: i += 1; break;
        default: i += p->scale[a] < 1; break;
        }
    }
    return i < 0 ? 0 : (i >= in ? in - 1 : i);
}

static kf_status resize_nearest(const kf_node *n, const rplan *p, const kf_tensor *x, kf_tensor *y) {
    int rank = p->rank;
    int64_t *map[KF_MAX_RANK] = {NULL}, xs[KF_MAX_RANK], pos[KF_MAX_RANK];
    kf_status st = KF_OK;
    kf_strides(rank, p->in, xs);
    for (int a = 0; a < rank; a++) {
        map[a] = kf_calloc((size_t)p->out[a], sizeof(int64_t));
        if (!map[a]) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int64_t o = 0; o < p->out[a]; o++) {
            bool outside;
            double c = map_coord(p, a, (double)o, &outside);
            map[a][o] = outside ? -1 : nearest_index(p, a, c);
        }
    }
    for (int64_t i = 0; i < y->numel; i++) {
        kf_unravel(rank, p->out, i, pos);
        int64_t off = 0;
        bool outside = false;
        for (int a = 0; a < rank; a++) {
            if (map[a][pos[a]] < 0) outside = true;
            off += map[a][pos[a]] * xs[a];
        }
        if (!outside) {
            if ((st = copy_elem(y, i, x, off))) goto done;
        } else if (is_real(y->dtype)) {
            store_rounded(y, i, p->extrapolation);
        } else {
            st = kf_node_fail(n, KF_ERR_UNSUPPORTED, "extrapolation of %s elements", kf_dtype_name(y->dtype));
            goto done;
        }
    }
done:
    for (int a = 0; a < rank; a++) kf_free(map[a]);
    return st;
}

static double cubic_w(double x, double A) {
    x = fabs(x);
    if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0;
}

/* Taps of one output position: weights w[0..taps) for the inputs starting
 * at *start (before clamping). ratio is in (0, 1]. */
static void resize_weights(const rplan *p, double ratio, double scale, int64_t taps, double *w) {
    if (!p->antialias) {
        if (p->mode == MODE_LINEAR) {
            w[0] = 1 - ratio;
            w[1] = ratio;
        } else {
            for (int k = 0; k < 4; k++) w[k] = cubic_w(ratio + 1 - k, p->cubic_a);
        }
        return;
    }
    double s = fmin(scale, 1.0), sum = 0;
    int64_t first = 1 - taps / 2;
    for (int64_t k = 0; k < taps; k++) {
        double arg = (first + k - ratio) * s;
        w[k] = p->mode == MODE_LINEAR ? fmax(0.0, 1 - fabs(arg)) : cubic_w(arg, p->cubic_a);
        sum += w[k];
    }
    if (sum != 0)
        for (int64_t k = 0; k < taps; k++) w[k] /= sum;
}

/* One separable pass along axis a: src has dims cur, dst the same dims with
 * cur[a] replaced by p->out[a]. */
static kf_status resize_axis(const kf_node *n, const rplan *p, int a, const int64_t *cur,
                             const double *src, double *dst) {
    int64_t in = p->in[a], out = p->out[a];
    if (out == 0) return KF_OK;
    int64_t taps = p->mode == MODE_LINEAR ? 2 : 4, nw;
    if (p->antialias && p->scale[a] < 1) {
        double inv = 1 / p->scale[a];
        if (inv > (double)RESIZE_MAX_TAPS_PER_ELEM * (double)(in + 1))
            return kf_node_fail(n, KF_ERR_RUNTIME, "scale %g is too small for axis %d", p->scale[a], a);
        int64_t half = (int64_t) - (floor(-(p->mode == MODE_LINEAR ? 1 : 2) * inv) + 1);
        taps = 2 + 2 * half;
    }
    if (!kf_mul_ok(out, taps, &nw)) return kf_node_fail(n, KF_ERR_RUNTIME, "too many interpolation taps");
    double *w = kf_calloc((size_t)nw, sizeof(double));
    int64_t *start = kf_calloc((size_t)out, sizeof(int64_t));
    bool *outside = kf_calloc((size_t)out, sizeof(bool));
    kf_status st = KF_OK;
    if (!w || !start || !outside) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t o = 0; o < out; o++) {
        double x = map_coord(p, a, (double)o, &outside[o]);
        if (outside[o]) continue;
        if (isnan(x)) x = 0;
        x = fmin(fmax(x, -(double)taps - 2), (double)(in + taps + 2)); /* far outside reads the edge */
        double f = floor(x);
        bool integral = x == f;
        double *wo = w + o * taps;
        resize_weights(p, integral ? 1.0 : x - f, p->scale[a], taps, wo);
        start[o] = (int64_t)f - taps / 2 + (integral ? 0 : 1);
        if (p->exclude_outside) {
            double sum = 0;
            for (int64_t k = 0; k < taps; k++) {
                int64_t i = start[o] + k;
                if (i < 0 || i >= in) wo[k] = 0;
                sum += wo[k];
            }
            if (sum != 0)
                for (int64_t k = 0; k < taps; k++) wo[k] /= sum;
        }
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < a; d++) outer *= cur[d];
    for (int d = a + 1; d < p->rank; d++) inner *= cur[d];
    for (int64_t b = 0; b < outer; b++)
        for (int64_t o = 0; o < out; o++) {
            double *row = dst + (b * out + o) * inner;
            if (outside[o]) {
                for (int64_t i = 0; i < inner; i++) row[i] = p->extrapolation;
                continue;
            }
            for (int64_t i = 0; i < inner; i++) row[i] = 0;
            for (int64_t k = 0; k < taps; k++) {
                double wk = w[o * taps + k];
                if (wk == 0) continue;
                int64_t s = start[o] + k;
                s = s < 0 ? 0 : (s >= in ? in - 1 : s);
                const double *from = src + (b * in + s) * inner;
                for (int64_t i = 0; i < inner; i++) row[i] += wk * from[i];
            }
        }
done:
    kf_free(w);
    kf_free(start);
    kf_free(outside);
    return st;
}

static kf_status resize_interp(const kf_node *n, const rplan *p, const kf_tensor *x, kf_tensor *y) {
    if (!is_real(x->dtype))
        return kf_node_fail(n, KF_ERR_UNSUPPORTED, "%s interpolation of %s elements",
                     p->mode == MODE_LINEAR ? "linear" : "cubic", kf_dtype_name(x->dtype));
    int64_t cur[KF_MAX_RANK];
    memcpy(cur, p->in, sizeof(int64_t) * (size_t)p->rank);
    double *buf = kf_calloc((size_t)x->numel, sizeof(double));
    if (!buf) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < x->numel; i++) buf[i] = kf_get_f64(x, i);
    kf_status st = KF_OK;
    for (int a = 0; a < p->rank; a++) {
        if (p->out[a] == p->in[a] && close1(p->scale[a], 1.0) &&
            (p->coord != CT_TF_CROP || (p->roi_lo[a] == 0 && p->roi_hi[a] == 1)))
            continue; /* identity along this axis */
        int64_t next[KF_MAX_RANK], numel;
        memcpy(next, cur, sizeof next);
        next[a] = p->out[a];
        if ((st = kf_shape_numel(p->rank, next, sizeof(double), &numel))) break;
        double *nb = kf_calloc((size_t)numel, sizeof(double));
        if (!nb) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            break;
        }
        st = resize_axis(n, p, a, cur, buf, nb);
        kf_free(buf);
        buf = nb;
        if (st) break;
        memcpy(cur, next, sizeof cur);
    }
    if (!st)
        for (int64_t i = 0; i < y->numel; i++) store_rounded(y, i, buf[i]);
    kf_free(buf);
    return st;
}

kf_status kf_index_eval_resize(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    (void)nout;
    const kf_tensor *x = in[0];
    int sr, ss, sz;
    resize_slots(n, &sr, &ss, &sz);
    const kf_tensor *roi = sr >= 0 && sr < nin ? in[sr] : NULL;
    const kf_tensor *scales = ss < nin ? in[ss] : NULL;
    const kf_tensor *sizes = sz >= 0 && sz < nin ? in[sz] : NULL;
    rplan p;
    KF_TRY(resize_attrs(n, &p));
    KF_TRY(resize_plan_from(n, x->rank, x->dims, roi, scales, sizes, &p));
    if (p.coord == CT_TF_CROP && (!roi || roi->numel == 0))
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "tf_crop_and_resize needs roi");
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, x->rank, p.out));
    if (out[0].numel == 0) return KF_OK;
    if (x->numel == 0) return kf_node_fail(n, KF_ERR_SHAPE, "cannot resize an empty input to a non-empty output");
    if (p.mode == MODE_NEAREST) return resize_nearest(n, &p, x, &out[0]);
    return resize_interp(n, &p, x, &out[0]);
}

/* ---- GridSample ------------------------------------------------------------ */

kf_status kf_index_shape_grid_sample(const kf_node *n, int nin, const kf_type *const *in,
                                     const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)val;
    if (nin < 2 || !in[0] || nout < 1) return KF_OK;
    const kf_type *x = in[0], *g = in[1];
    out[0].dtype = x->dtype;
    int rank = x->rank >= 0 ? x->rank : (g && g->rank >= 0 ? g->rank : -1);
    if (rank < 0) return KF_OK;
    if (rank < 3 || (x->rank >= 0 && g && g->rank >= 0 && g->rank != x->rank))
        return kf_node_fail(n, KF_ERR_SHAPE, "X and grid must have the same rank (>= 3)");
    out[0].rank = rank;
    for (int d = 0; d < rank; d++) out[0].dims[d] = -1;
    if (x->rank >= 0) {
        for (int d = 0; d < 2; d++) {
            out[0].dims[d] = x->dims[d];
            out[0].syms[d] = x->syms[d];
        }
    }
    if (g && g->rank >= 0)
        for (int d = 1; d < rank - 1; d++) {
            out[0].dims[d + 1] = g->dims[d];
            out[0].syms[d + 1] = g->syms[d];
        }
    return KF_OK;
}

/* Reflects x into [lo, hi] (PyTorch's rule, as in the ONNX reference). */
static double reflect(double x, double lo, double hi) {
    double rng = hi - lo;
    if (rng <= 0) return lo;
    if (x < lo) {
        double dx = lo - x, k = floor(dx / rng), r = dx - k * rng;
        return fmod(k, 2) == 0 ? lo + r : hi - r;
    }
    if (x > hi) {
        double dx = x - hi, k = floor(dx / rng), r = dx - k * rng;
        return fmod(k, 2) == 0 ? hi - r : lo + r;
    }
    return x;
}

enum { PAD_ZEROS, PAD_BORDER, PAD_REFLECT };

/* Index i on an axis of length len after padding; -1 when it reads zero. */
static int64_t grid_pixel(double i, int64_t len, int pad, double lo, double hi) {
    if (pad == PAD_ZEROS) return (i >= 0 && i < (double)len) ? (int64_t)i : -1;
    if (pad == PAD_BORDER) return i < 0 ? 0 : (i > (double)(len - 1) ? len - 1 : (int64_t)i);
    double r = trunc(reflect(i, lo, hi));
    return r < 0 ? 0 : (r > (double)(len - 1) ? len - 1 : (int64_t)r);
}

kf_status kf_index_eval_grid_sample(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                    kf_tensor *out) {
    (void)nin;
    (void)nout;
    static const char *const modes[] = {"nearest", "bilinear", "bicubic", "linear", "cubic"};
    static const char *const pads[] = {"zeros", "border", "reflection"};
    const kf_tensor *x = in[0], *g = in[1];
    const char *ms = kf_attr_s(n, "mode", n->opset && n->opset < 20 ? "bilinear" : "linear");
    const char *ps = kf_attr_s(n, "padding_mode", "zeros");
    int mode = pick(ms, modes, 5), pad = pick(ps, pads, 3);
    if (mode < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown mode '%s'", ms);
    if (pad < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown padding_mode '%s'", ps);
    if (mode >= 3) mode -= 2;
    bool align = kf_attr_i(n, "align_corners", 0) != 0;
    int rank = x->rank, k = rank - 2;
    if (rank < 3 || g->rank != rank || g->dims[0] != x->dims[0] || g->dims[rank - 1] != k)
        return kf_node_fail(n, KF_ERR_SHAPE, "grid must be [N, spatial..., %d] for X of rank %d", k, rank);
    if (!kf_dtype_is_float(g->dtype)) return kf_node_fail(n, KF_ERR_SHAPE, "grid must be a float tensor");
    if (mode != 0 && !is_real(x->dtype))
        return kf_node_fail(n, KF_ERR_UNSUPPORTED, "interpolating %s elements", kf_dtype_name(x->dtype));
    int taps1 = mode == 0 ? 1 : (mode == 1 ? 2 : 4);
    int64_t combos = 1;
    for (int d = 0; d < k; d++) combos *= taps1;
    if (combos > GRID_MAX_TAPS) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "%d spatial dims in this mode", k);
    int64_t dims[KF_MAX_RANK];
    dims[0] = x->dims[0];
    dims[1] = x->dims[1];
    for (int d = 1; d <= k; d++) dims[d + 1] = g->dims[d];
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, rank, dims));
    int64_t nb = dims[0], nc = dims[1], npts = 1, plane = 1;
    for (int d = 0; d < k; d++) {
        npts *= g->dims[d + 1];
        plane *= x->dims[d + 2];
    }
    if (plane == 0 && out[0].numel) return kf_node_fail(n, KF_ERR_SHAPE, "X has an empty spatial dim");
    int64_t xs[KF_MAX_RANK];
    kf_strides(k, x->dims + 2, xs);
    int64_t idx[KF_MAX_RANK][4];
    double wt[KF_MAX_RANK][4];
    for (int64_t b = 0; b < nb; b++)
        for (int64_t p = 0; p < npts; p++) {
            /* taps per spatial dim: the grid's last axis lists x (width) first */
            for (int d = 0; d < k; d++) {
                int64_t len = x->dims[d + 2];
                double gv = kf_get_f64(g, (b * npts + p) * k + (k - 1 - d));
                double c = align ? (gv + 1) / 2 * (double)(len - 1) : ((gv + 1) * (double)len - 1) / 2;
                double lo = align ? 0 : -0.5, hi = align ? (double)len - 1 : (double)len - 0.5;
                if (mode == 0) c = nearbyint(c);
                if (isnan(c)) c = lo;
                if (c < lo || c > hi) {
                    if (pad == PAD_BORDER) c = c < 0 ? 0 : (c > (double)(len - 1) ? (double)(len - 1) : c);
                    else if (pad == PAD_REFLECT) c = reflect(c, lo, hi);
                    else c = fmin(fmax(c, -8.0), (double)len + 8); /* reads zeros either way */
                    if (isnan(c)) c = lo; /* reflection of an infinity */
                }
                double f = mode == 0 ? c : floor(c), t = c - f;
                for (int j = 0; j < taps1; j++) {
                    double at = mode == 2 ? f - 1 + j : f + j;
                    idx[d][j] = grid_pixel(at, len, pad, lo, hi);
                    wt[d][j] = mode == 0 ? 1 : (mode == 1 ? (j ? t : 1 - t) : cubic_w(t + 1 - j, -0.75));
                }
            }
            for (int64_t c = 0; c < nc; c++) {
                int64_t base = (b * nc + c) * plane, oi = (b * nc + c) * npts + p;
                if (mode == 0) {
                    int64_t off = 0;
                    bool zero = false;
                    for (int d = 0; d < k; d++) {
                        if (idx[d][0] < 0) zero = true;
                        off += idx[d][0] * xs[d];
                    }
                    if (!zero) KF_TRY(copy_elem(&out[0], oi, x, base + off));
                    continue; /* a zero element is what the output already holds */
                }
                double sum = 0;
                for (int64_t cb = 0; cb < combos; cb++) {
                    int64_t rest = cb, off = 0;
                    double w = 1;
                    for (int d = k - 1; d >= 0 && w != 0; d--) {
                        int j = (int)(rest % taps1);
                        rest /= taps1;
                        if (idx[d][j] < 0) w = 0;
                        else {
                            w *= wt[d][j];
                            off += idx[d][j] * xs[d];
                        }
                    }
                    if (w != 0) sum += w * kf_get_f64(x, base + off);
                }
                kf_set_f64(&out[0], oi, sum);
            }
        }
    return KF_OK;
}

/* ---- RoiAlign ---------------------------------------------------------------- */

kf_status kf_index_shape_roi_align(const kf_node *n, int nin, const kf_type *const *in,
                                   const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 3 || !in[0] || nout < 1) return KF_OK;
    out[0].dtype = in[0]->dtype;
    out[0].rank = 4;
    out[0].dims[0] = -1;
    if (in[2] && in[2]->rank == 1) {
        out[0].dims[0] = in[2]->dims[0];
        out[0].syms[0] = in[2]->syms[0];
    } else if (in[1] && in[1]->rank == 2) {
        out[0].dims[0] = in[1]->dims[0];
        out[0].syms[0] = in[1]->syms[0];
    }
    out[0].dims[1] = -1;
    if (in[0]->rank >= 0) {
        if (in[0]->rank != 4) return kf_node_fail(n, KF_ERR_SHAPE, "X must be 4-D, not %d-D", in[0]->rank);
        out[0].dims[1] = in[0]->dims[1];
        out[0].syms[1] = in[0]->syms[1];
    }
    out[0].dims[2] = kf_attr_i(n, "output_height", 1);
    out[0].dims[3] = kf_attr_i(n, "output_width", 1);
    if (out[0].dims[2] < 1 || out[0].dims[3] < 1)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "output_height and output_width must be positive");
    return KF_OK;
}

/* Bilinear sample of one channel plane at (y, x), as RoiAlign's reference:
 * zero outside [-1, size], edges clamped; w[4]/pos[4] get the corner terms. */
static void roi_corners(double y, double x, int64_t h, int64_t w, int64_t *pos, double *wt) {
    if (y < -1.0 || y > (double)h || x < -1.0 || x > (double)w) {
        for (int k = 0; k < 4; k++) {
            pos[k] = 0;
            wt[k] = 0;
        }
        return;
    }
    y = fmax(y, 0);
    x = fmax(x, 0);
    int64_t yl = (int64_t)y, xl = (int64_t)x, yh, xh;
    if (yl >= h - 1) {
        yh = yl = h - 1;
        y = (double)yl;
    } else {
        yh = yl + 1;
    }
    if (xl >= w - 1) {
        xh = xl = w - 1;
        x = (double)xl;
    } else {
        xh = xl + 1;
    }
    double ly = y - (double)yl, lx = x - (double)xl, hy = 1 - ly, hx = 1 - lx;
    pos[0] = yl * w + xl;
    pos[1] = yl * w + xh;
    pos[2] = yh * w + xl;
    pos[3] = yh * w + xh;
    wt[0] = hy * hx;
    wt[1] = hy * lx;
    wt[2] = ly * hx;
    wt[3] = ly * lx;
}

/* ceil(v) as a loop count; negative counts mean no samples. */
static int64_t grid_count(double v) {
    if (!(v > 0)) return 0;
    return v > (double)ROI_MAX_SAMPLES ? ROI_MAX_SAMPLES + 1 : (int64_t)ceil(v);
}

kf_status kf_index_eval_roi_align(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                  kf_tensor *out) {
    (void)nin;
    (void)nout;
    const kf_tensor *x = in[0], *rois = in[1], *bi = in[2];
    if (x->rank != 4 || !kf_dtype_is_float(x->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "X must be a 4-D float tensor");
    if (rois->rank != 2 || rois->dims[1] != 4 || !kf_dtype_is_float(rois->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "rois must be a float tensor [num_rois, 4]");
    if (bi->rank != 1 || bi->dims[0] != rois->dims[0] || !kf_dtype_is_int(bi->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "batch_indices must be an integer tensor [num_rois]");
    const char *ms = kf_attr_s(n, "mode", "avg");
    bool avg = strcmp(ms, "avg") == 0;
    if (!avg && strcmp(ms, "max") != 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown mode '%s'", ms);
    /* opset 10 behaves as output_half_pixel; 16 added the attribute, default half_pixel */
    const char *ct = n->opset && n->opset < 16 ? "output_half_pixel"
                                               : kf_attr_s(n, "coordinate_transformation_mode", "half_pixel");
    bool half = strcmp(ct, "half_pixel") == 0;
    if (!half && strcmp(ct, "output_half_pixel") != 0)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "unknown coordinate_transformation_mode '%s'", ct);
    int64_t oh = kf_attr_i(n, "output_height", 1), ow = kf_attr_i(n, "output_width", 1);
    int64_t ratio = kf_attr_i(n, "sampling_ratio", 0);
    double sscale = kf_attr_f(n, "spatial_scale", 1.0f);
    if (oh < 1 || ow < 1 || ratio < 0 || ratio > ROI_MAX_SAMPLES)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "bad output size or sampling_ratio");
    int64_t nr = rois->dims[0], nc = x->dims[1], h = x->dims[2], w = x->dims[3];
    int64_t dims[4] = {nr, nc, oh, ow};
    KF_TRY(kf_output_prepare(n, &out[0], x->dtype, 4, dims));
    if (out[0].numel == 0) return KF_OK;
    if (h == 0 || w == 0) return kf_node_fail(n, KF_ERR_SHAPE, "X has an empty spatial dim");
    for (int64_t r = 0; r < nr; r++) {
        int64_t b = kf_get_i64(bi, r);
        if (b < 0 || b >= x->dims[0])
            return kf_node_fail(n, KF_ERR_RUNTIME, "batch index %lld is out of range for batch %lld", (long long)b,
                         (long long)x->dims[0]);
        double off = half ? 0.5 : 0.0;
        double x0 = kf_get_f64(rois, r * 4) * sscale - off, y0 = kf_get_f64(rois, r * 4 + 1) * sscale - off;
        double x1 = kf_get_f64(rois, r * 4 + 2) * sscale - off, y1 = kf_get_f64(rois, r * 4 + 3) * sscale - off;
        double rw = x1 - x0, rh = y1 - y0;
        if (!half) {
            rw = fmax(rw, 1.0);
            rh = fmax(rh, 1.0);
        }
        double bh = rh / (double)oh, bw = rw / (double)ow;
        int64_t gh = ratio > 0 ? ratio : grid_count(rh / (double)oh);
        int64_t gw = ratio > 0 ? ratio : grid_count(rw / (double)ow);
        if (gh > ROI_MAX_SAMPLES || gw > ROI_MAX_SAMPLES || gh * gw > ROI_MAX_SAMPLES)
            return kf_node_fail(n, KF_ERR_RUNTIME, "roi %lld needs a sampling grid over %lld points", (long long)r,
                         (long long)ROI_MAX_SAMPLES);
        double count = (double)(gh * gw > 1 ? gh * gw : 1);
        for (int64_t c = 0; c < nc; c++) {
            int64_t base = (b * nc + c) * h * w;
            for (int64_t ph = 0; ph < oh; ph++)
                for (int64_t pw = 0; pw < ow; pw++) {
                    double acc = 0;
                    bool first = true;
                    for (int64_t iy = 0; iy < gh; iy++) {
                        double yy = y0 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh;
                        for (int64_t ix = 0; ix < gw; ix++) {
                            double xx = x0 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
                            int64_t pos[4];
                            double wt[4], v[4];
                            roi_corners(yy, xx, h, w, pos, wt);
                            for (int q = 0; q < 4; q++) v[q] = wt[q] * kf_get_f64(x, base + pos[q]);
                            if (avg) {
                                acc += v[0] + v[1] + v[2] + v[3];
                            } else {
                                double m = fmax(fmax(v[0], v[1]), fmax(v[2], v[3]));
                                acc = first ? m : fmax(acc, m);
                                first = false;
                            }
                        }
                    }
                    kf_set_f64(&out[0], ((r * nc + c) * oh + ph) * ow + pw, avg ? acc / count : acc);
                }
        }
    }
    return KF_OK;
}

/* ---- NonMaxSuppression ----------------------------------------------------- */

kf_status kf_index_shape_nms(const kf_node *n, int nin, const kf_type *const *in,
                             const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)nin;
    (void)in;
    (void)val;
    if (nout < 1) return KF_OK;
    out[0].dtype = KF_DT_INT64;
    out[0].rank = 2;
    out[0].dims[0] = -1;
    out[0].dims[1] = 3;
    return KF_OK;
}

typedef struct nms_box {
    double y0, x0, y1, x1;
} nms_box;

static nms_box nms_read(const kf_tensor *boxes, int64_t i, bool center) {
    double a = kf_get_f64(boxes, 4 * i), b = kf_get_f64(boxes, 4 * i + 1);
    double c = kf_get_f64(boxes, 4 * i + 2), d = kf_get_f64(boxes, 4 * i + 3);
    nms_box r;
    if (center) { /* [x_center, y_center, width, height] */
        r.x0 = a - c / 2;
        r.x1 = a + c / 2;
        r.y0 = b - d / 2;
        r.y1 = b + d / 2;
    } else { /* [y1, x1, y2, x2], corners in either order */
        r.y0 = fmin(a, c);
        r.y1 = fmax(a, c);
        r.x0 = fmin(b, d);
        r.x1 = fmax(b, d);
    }
    return r;
}

/* True when the IoU of a and b exceeds threshold (degenerate boxes never do). */
static bool nms_suppresses(const nms_box *a, const nms_box *b, double threshold) {
    double iw = fmin(a->x1, b->x1) - fmax(a->x0, b->x0), ih = fmin(a->y1, b->y1) - fmax(a->y0, b->y0);
    if (iw <= 0 || ih <= 0) return false;
    double inter = iw * ih;
    double area_a = (a->x1 - a->x0) * (a->y1 - a->y0), area_b = (b->x1 - b->x0) * (b->y1 - b->y0);
    double uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
    return inter / uni > threshold;
}

/* Stable merge sort of ids by descending score (ties keep lower index first). */
static void nms_sort(const double *score, int64_t *ids, int64_t *tmp, int64_t m) {
    for (int64_t w = 1; w < m; w *= 2) {
        for (int64_t lo = 0; lo < m; lo += 2 * w) {
            int64_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            int64_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = score[ids[b]] > score[ids[a]] ? ids[b++] : ids[a++];
            while (a < mid) tmp[k++] = ids[a++];
            while (b < hi) tmp[k++] = ids[b++];
        }
        memcpy(ids, tmp, sizeof(int64_t) * (size_t)m);
    }
}

kf_status kf_index_eval_nms(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out) {
    (void)nout;
    const kf_tensor *boxes = in[0], *scores = in[1];
    if (boxes->rank != 3 || boxes->dims[2] != 4 || !kf_dtype_is_float(boxes->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "boxes must be a float tensor [batches, boxes, 4]");
    if (scores->rank != 3 || scores->dims[0] != boxes->dims[0] || scores->dims[2] != boxes->dims[1] ||
        !kf_dtype_is_float(scores->dtype))
        return kf_node_fail(n, KF_ERR_SHAPE, "scores must be a float tensor [batches, classes, boxes]");
    for (int i = 2; i < nin && i < 5; i++)
        if (in[i] && (in[i]->numel != 1 || in[i]->rank > 1))
            return kf_node_fail(n, KF_ERR_SHAPE, "input %d must be a scalar", i);
    int64_t max_out = nin > 2 && in[2] ? kf_get_i64(in[2], 0) : 0;
    double iou = nin > 3 && in[3] ? kf_get_f64(in[3], 0) : 0;
    bool has_thr = nin > 4 && in[4];
    double thr = has_thr ? kf_get_f64(in[4], 0) : 0;
    if (!(iou >= 0 && iou <= 1)) return kf_node_fail(n, KF_ERR_RUNTIME, "iou_threshold %g is outside [0, 1]", iou);
    int64_t cpb = kf_attr_i(n, "center_point_box", 0);
    if (cpb != 0 && cpb != 1) return kf_node_fail(n, KF_ERR_BAD_MODEL, "center_point_box must be 0 or 1");
    int64_t nb = boxes->dims[0], ncls = scores->dims[1], nbox = boxes->dims[1];
    if (max_out < 0) max_out = 0;
    if (max_out > nbox) max_out = nbox;
    kf_status st = KF_OK;
    int64_t cap = 64, nsel = 0; /* selected triples, grown by doubling */
    int64_t *sel = kf_calloc((size_t)cap * 3, sizeof(int64_t));
    int64_t *ids = kf_calloc((size_t)nbox, sizeof(int64_t)), *tmp = kf_calloc((size_t)nbox, sizeof(int64_t));
    int64_t *kept = kf_calloc((size_t)nbox, sizeof(int64_t));
    double *score = kf_calloc((size_t)nbox, sizeof(double));
    nms_box *bx = kf_calloc((size_t)nbox, sizeof(nms_box));
    if (!sel || !ids || !tmp || !kept || !score || !bx) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t b = 0; b < nb && max_out > 0; b++) {
        for (int64_t i = 0; i < nbox; i++) bx[i] = nms_read(boxes, b * nbox + i, cpb == 1);
        for (int64_t c = 0; c < ncls; c++) {
            int64_t m = 0, nk = 0;
            for (int64_t i = 0; i < nbox; i++) {
                score[i] = kf_get_f64(scores, (b * ncls + c) * nbox + i);
                if (!has_thr || score[i] > thr) ids[m++] = i;
            }
            nms_sort(score, ids, tmp, m);
            for (int64_t k = 0; k < m && nk < max_out; k++) {
                bool keep = true;
                for (int64_t j = 0; j < nk && keep; j++)
                    if (nms_suppresses(&bx[ids[k]], &bx[kept[j]], iou)) keep = false;
                if (!keep) continue;
                kept[nk++] = ids[k];
                if (nsel == cap) {
                    int64_t *grown = kf_realloc(sel, (size_t)cap * 6 * sizeof(int64_t));
                    if (!grown) {
                        st = kf_fail(KF_ERR_NOMEM, "out of memory");
                        goto done;
                    }
                    sel = grown;
                    cap *= 2;
                }
                sel[3 * nsel] = b;
                sel[3 * nsel + 1] = c;
                sel[3 * nsel + 2] = ids[k];
                nsel++;
            }
        }
    }
    int64_t dims[2] = {nsel, 3};
    if ((st = kf_output_prepare(n, &out[0], KF_DT_INT64, 2, dims))) goto done;
    if (nsel) memcpy(out[0].data, sel, sizeof(int64_t) * (size_t)(3 * nsel));
done:
    kf_free(sel);
    kf_free(ids);
    kf_free(tmp);
    kf_free(kept);
    kf_free(score);
    kf_free(bx);
    return st;
}
