/*
 * ops_nn_util.c: shared pieces of the nn-family reference kernels: window
 * geometry of conv and pooling ops (ONNX output-shape and auto_pad rules),
 * the strided matrix-product core, numpy.matmul batching and expansion of
 * per-tensor / per-axis quantisation parameters. See ops_nn_util.h.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops_nn_util.h"

kf_status kf_nn_fail(const kf_node *n, kf_status code, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return kf_fail(code, "node '%s' (%s): %s", kf_node_label(n), n->op_type, buf);
}

const kf_dtype kf_nn_float_types[] = {KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_FLOAT, KF_DT_DOUBLE,
                                      KF_DT_UNDEFINED};
const kf_dtype kf_nn_q8_types[] = {KF_DT_INT8, KF_DT_UINT8, KF_DT_UNDEFINED};

bool kf_nn_dtype_in(kf_dtype dt, const kf_dtype *list) {
    for (; *list; list++)
        if (*list == dt) return true;
    return false;
}

kf_status kf_nn_check_dtype(const kf_node *n, kf_dtype dt, const char *what, const kf_dtype *list) {
    if (dt == KF_DT_UNDEFINED || kf_nn_dtype_in(dt, list)) return KF_OK;
    return kf_nn_fail(n, KF_ERR_SHAPE, "input '%s' has unsupported dtype %s", what,
                      kf_dtype_name(dt));
}

double *kf_nn_to_f64(const kf_tensor *t) {
    double *r = kf_malloc(((size_t)t->numel + 1) * sizeof(double));
    if (!r) {
        kf_fail(KF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (t->dtype == KF_DT_FLOAT) {
        const float *f = t->data;
        for (int64_t i = 0; i < t->numel; i++) r[i] = f[i];
    } else if (t->dtype == KF_DT_DOUBLE) {
        if (t->numel) memcpy(r, t->data, (size_t)t->numel * sizeof(double));
    } else {
        for (int64_t i = 0; i < t->numel; i++) r[i] = kf_get_f64(t, i);
    }
    return r;
}

int64_t *kf_nn_to_i64(const kf_tensor *t) {
    int64_t *r = kf_malloc(((size_t)t->numel + 1) * sizeof(int64_t));
    if (!r) {
        kf_fail(KF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < t->numel; i++) r[i] = kf_get_i64(t, i);
    return r;
}

/* ---- geometry ------------------------------------------------------------------ */

/* Reads an INTS attribute of exactly `len` entries, each >= min, into out;
 * absent leaves out untouched and sets *present false. */
static kf_status read_list(const kf_node *n, const char *name, int len, int64_t min, int64_t *out,
                           bool *present) {
    const kf_attr *a = kf_attr_find(n, name);
    if (present) *present = false;
    if (!a) return KF_OK;
    if (a->type != KF_ATTR_INTS)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute '%s' must be a list of ints", name);
    if (a->n != len)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute '%s' has %d entries, expected %d", name,
                          a->n, len);
    for (int i = 0; i < len; i++) {
        if (a->ints[i] < min)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute '%s'[%d] = %lld is below %lld", name,
                              i, (long long)a->ints[i], (long long)min);
        out[i] = a->ints[i];
    }
    if (present) *present = true;
    return KF_OK;
}

kf_status kf_nn_geom_parse(const kf_node *n, int nsp, const int64_t *wkernel, bool use_dil,
                           bool use_ceil, kf_nn_geom *g) {
    memset(g, 0, sizeof *g);
    if (nsp < 0 || nsp > KF_MAX_RANK - 2)
        return kf_nn_fail(n, KF_ERR_SHAPE, "%d spatial dims are not supported", nsp);
    g->nsp = nsp;
    for (int i = 0; i < nsp; i++) {
        g->in[i] = -1;
        g->out[i] = -1;
        g->kernel[i] = wkernel ? wkernel[i] : -1;
        g->stride[i] = 1;
        g->dil[i] = 1;
    }
    bool has_k = false;
    int64_t k[KF_MAX_RANK];
    KF_TRY(read_list(n, "kernel_shape", nsp, 1, k, &has_k));
    if (has_k) {
        for (int i = 0; i < nsp; i++) {
            if (wkernel && wkernel[i] >= 0 && wkernel[i] != k[i])
                return kf_nn_fail(n, KF_ERR_SHAPE, "kernel_shape[%d] = %lld but W has %lld", i,
                                  (long long)k[i], (long long)wkernel[i]);
            g->kernel[i] = k[i];
        }
    } else if (!wkernel) {
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute 'kernel_shape' is required");
    }
    KF_TRY(read_list(n, "strides", nsp, 1, g->stride, NULL));
    if (use_dil) KF_TRY(read_list(n, "dilations", nsp, 1, g->dil, NULL));
    int64_t pads[2 * KF_MAX_RANK];
    bool has_pads = false;
    KF_TRY(read_list(n, "pads", 2 * nsp, 0, pads, &has_pads));
    if (has_pads)
        for (int i = 0; i < nsp; i++) {
            g->pb[i] = pads[i];
            g->pe[i] = pads[nsp + i];
        }
    const char *ap = kf_attr_s(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") == 0 || ap[0] == 0) g->auto_pad = KF_NN_NOTSET;
    else if (strcmp(ap, "SAME_UPPER") == 0) g->auto_pad = KF_NN_SAME_UPPER;
    else if (strcmp(ap, "SAME_LOWER") == 0) g->auto_pad = KF_NN_SAME_LOWER;
    else if (strcmp(ap, "VALID") == 0) g->auto_pad = KF_NN_VALID;
    else
        return kf_nn_fail(n, KF_ERR_BAD_MODEL,
                          "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", ap);
    if (g->auto_pad != KF_NN_NOTSET)
        for (int i = 0; i < nsp; i++) g->pb[i] = g->pe[i] = 0;
    if (use_ceil) {
        int64_t c = kf_attr_i(n, "ceil_mode", 0);
        if (c != 0 && c != 1)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "ceil_mode must be 0 or 1, not %lld",
                              (long long)c);
        g->ceil_mode = c == 1;
    }
    return KF_OK;
}

/* Floor division for b > 0. */
static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b) != 0 && (a < 0)) q--;
    return q;
}

kf_status kf_nn_geom_forward(const kf_node *n, kf_nn_geom *g) {
    for (int i = 0; i < g->nsp; i++) {
        g->out[i] = -1;
        int64_t in = g->in[i], k = g->kernel[i], s = g->stride[i], d = g->dil[i];
        if (in < 0 || k < 0) continue;
        int64_t ext;
        if (!kf_mul_ok(k - 1, d, &ext) || !kf_add_ok(ext, 1, &ext))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "kernel extent of dim %d overflows", i);
        if (g->auto_pad == KF_NN_SAME_UPPER || g->auto_pad == KF_NN_SAME_LOWER) {
            int64_t out = in == 0 ? 0 : (in - 1) / s + 1; /* ceil(in / s) */
            int64_t total = 0;
            if (out > 0) {
                int64_t span;
                if (!kf_mul_ok(out - 1, s, &span) || !kf_add_ok(span, ext, &span))
                    return kf_nn_fail(n, KF_ERR_BAD_MODEL, "window geometry of dim %d overflows",
                                      i);
                total = span - in > 0 ? span - in : 0;
            }
            if (g->auto_pad == KF_NN_SAME_UPPER) {
                g->pb[i] = total / 2;
                g->pe[i] = total - total / 2;
            } else {
                g->pe[i] = total / 2;
                g->pb[i] = total - total / 2;
            }
            g->out[i] = out;
            continue;
        }
        int64_t padded;
        if (!kf_add_ok(in, g->pb[i], &padded) || !kf_add_ok(padded, g->pe[i], &padded))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "padded size of dim %d overflows", i);
        int64_t room = padded - ext;
        if (room < 0)
            return kf_nn_fail(n, KF_ERR_SHAPE,
                              "window of extent %lld does not fit the padded input of size %lld in "
                              "spatial dim %d",
                              (long long)ext, (long long)padded, i);
        int64_t out;
        if (g->ceil_mode && g->auto_pad == KF_NN_NOTSET) {
            out = floor_div(room + s - 1, s) + 1;
            /* a window may not start in the end padding */
            if ((out - 1) * s >= in + g->pb[i]) out--;
        } else {
            out = room / s + 1;
        }
        g->out[i] = out;
    }
    return KF_OK;
}

bool kf_nn_next(int rank, const int64_t *dims, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        if (++idx[d] < dims[d]) return true;
        idx[d] = 0;
    }
    return false;
}

/* ---- matrix products -------------------------------------------------------------- */

void kf_nn_gemm_f64(int64_t M, int64_t N, int64_t K, const double *a, int64_t ars, int64_t acs,
                    const double *b, int64_t brs, int64_t bcs, double *c) {
    for (int64_t i = 0; i < M; i++) {
        double *crow = c + i * N;
        for (int64_t k = 0; k < K; k++) {
            double av = a[i * ars + k * acs];
            const double *brow = b + k * brs;
            if (bcs == 1)
                for (int64_t j = 0; j < N; j++) crow[j] += av * brow[j];
            else
                for (int64_t j = 0; j < N; j++) crow[j] += av * brow[j * bcs];
        }
    }
}

void kf_nn_gemm_u64(int64_t M, int64_t N, int64_t K, const uint64_t *a, int64_t ars, int64_t acs,
                    const uint64_t *b, int64_t brs, int64_t bcs, uint64_t *c) {
    for (int64_t i = 0; i < M; i++) {
        uint64_t *crow = c + i * N;
        for (int64_t k = 0; k < K; k++) {
            uint64_t av = a[i * ars + k * acs];
            const uint64_t *brow = b + k * brs;
            for (int64_t j = 0; j < N; j++) crow[j] += av * brow[j * bcs];
        }
    }
}

kf_status kf_nn_matmul_shape(const kf_node *n, const kf_type *a, const kf_type *b, kf_type *out) {
    kf_type_unknown(out);
    out->dtype = a->dtype ? a->dtype : b->dtype;
    if (a->rank < 0 || b->rank < 0) return KF_OK;
    if (a->rank == 0 || b->rank == 0)
        return kf_nn_fail(n, KF_ERR_SHAPE, "matrix product operands must have rank >= 1");
    int64_t ka = a->dims[a->rank - 1];
    int64_t kb = b->rank == 1 ? b->dims[0] : b->dims[b->rank - 2];
    if (ka >= 0 && kb >= 0 && ka != kb)
        return kf_nn_fail(n, KF_ERR_SHAPE, "inner dimensions differ (%lld vs %lld)", (long long)ka,
                          (long long)kb);
    kf_type ba, bb, bo;
    kf_type_unknown(&ba);
    kf_type_unknown(&bb);
    ba.rank = a->rank > 2 ? a->rank - 2 : 0;
    bb.rank = b->rank > 2 ? b->rank - 2 : 0;
    for (int d = 0; d < ba.rank; d++) {
        ba.dims[d] = a->dims[d];
        ba.syms[d] = a->syms[d];
    }
    for (int d = 0; d < bb.rank; d++) {
        bb.dims[d] = b->dims[d];
        bb.syms[d] = b->syms[d];
    }
    const kf_type *bt[2] = {&ba, &bb};
    KF_TRY(kf_broadcast_shapes(n, 2, bt, &bo));
    int r = bo.rank;
    if (r + 2 > KF_MAX_RANK) return kf_nn_fail(n, KF_ERR_SHAPE, "rank too large");
    for (int d = 0; d < r; d++) {
        out->dims[d] = bo.dims[d];
        out->syms[d] = bo.syms[d];
    }
    if (a->rank >= 2) {
        out->dims[r] = a->dims[a->rank - 2];
        out->syms[r] = a->syms[a->rank - 2];
        r++;
    }
    if (b->rank >= 2) {
        out->dims[r] = b->dims[b->rank - 1];
        out->syms[r] = b->syms[b->rank - 1];
        r++;
    }
    out->rank = r;
    return KF_OK;
}

kf_status kf_nn_mm_init(const kf_node *n, const kf_tensor *a, const kf_tensor *b, kf_nn_mm *mm) {
    memset(mm, 0, sizeof *mm);
    kf_type ta, tb;
    kf_type_of_tensor(&ta, a);
    kf_type_of_tensor(&tb, b);
    KF_TRY(kf_nn_matmul_shape(n, &ta, &tb, &mm->out));
    mm->M = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
    mm->K = a->dims[a->rank - 1];
    mm->N = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
    int ra = a->rank > 2 ? a->rank - 2 : 0, rb = b->rank > 2 ? b->rank - 2 : 0;
    int r = ra > rb ? ra : rb;
    mm->brank = r;
    mm->nbatch = 1;
    int64_t sa = mm->M * mm->K, sb = mm->K * mm->N; /* sizes of one matrix, bounded by numel */
    for (int d = r - 1; d >= 0; d--) {
        int da = d - (r - ra), db = d - (r - rb);
        int64_t xa = da >= 0 ? a->dims[da] : 1, xb = db >= 0 ? b->dims[db] : 1;
        mm->bdims[d] = xa > xb ? xa : xb;
        if (xa == 0 || xb == 0) mm->bdims[d] = 0;
        mm->astr[d] = xa == 1 ? 0 : sa;
        mm->bstr[d] = xb == 1 ? 0 : sb;
        sa *= xa;
        sb *= xb;
        mm->nbatch *= mm->bdims[d]; /* the output numel bounds this (checked at alloc) */
    }
    return KF_OK;
}

void kf_nn_mm_batch(const kf_nn_mm *mm, int64_t i, int64_t *aoff, int64_t *boff) {
    int64_t ao = 0, bo = 0;
    for (int d = mm->brank - 1; d >= 0; d--) {
        int64_t x = mm->bdims[d] ? i % mm->bdims[d] : 0;
        i = mm->bdims[d] ? i / mm->bdims[d] : 0;
        ao += x * mm->astr[d];
        bo += x * mm->bstr[d];
    }
    *aoff = ao;
    *boff = bo;
}

/* ---- quantisation parameters -------------------------------------------------------- */

/* For each element of the target, the offset into p (see expand_param). */
static kf_status param_offsets(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                               const int64_t *dims, int axis1d, int64_t numel, int64_t *offs) {
    int64_t pstr[KF_MAX_RANK] = {0};
    if (p->numel == 1) {
        for (int64_t i = 0; i < numel; i++) offs[i] = 0;
        return KF_OK;
    }
    if (p->rank == 1 && axis1d >= 0 && axis1d < rank && p->dims[0] == dims[axis1d]) {
        pstr[axis1d] = 1;
    } else {
        if (p->rank > rank) goto bad;
        int off = rank - p->rank;
        int64_t s = 1;
        for (int d = p->rank - 1; d >= 0; d--) {
            if (p->dims[d] != 1 && p->dims[d] != dims[d + off]) goto bad;
            pstr[d + off] = p->dims[d] == 1 ? 0 : s;
            s *= p->dims[d];
        }
    }
    int64_t idx[KF_MAX_RANK] = {0};
    for (int64_t i = 0; i < numel; i++) {
        offs[i] = kf_ravel(rank, pstr, idx);
        kf_nn_next(rank, dims, idx);
    }
    return KF_OK;
bad:
    return kf_nn_fail(n, KF_ERR_SHAPE,
                      "input '%s' (%lld elements, rank %d) does not match the data shape", what,
                      (long long)p->numel, p->rank);
}

static kf_status expand_param(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                              const int64_t *dims, int axis1d, double **fo, int64_t **io) {
    int64_t numel = 1;
    for (int d = 0; d < rank; d++) numel *= dims[d]; /* dims of an existing tensor */
    int64_t *offs = kf_malloc(((size_t)numel + 1) * sizeof(int64_t));
    double *f = fo ? kf_calloc((size_t)numel + 1, sizeof(double)) : NULL;
    int64_t *v = io ? kf_calloc((size_t)numel + 1, sizeof(int64_t)) : NULL;
    if (!offs || (fo && !f) || (io && !v)) {
        kf_free(offs);
        kf_free(f);
        kf_free(v);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_status st = KF_OK;
    if (p) {
        if (p->numel == 0) st = kf_nn_fail(n, KF_ERR_SHAPE, "input '%s' is empty", what);
        else st = param_offsets(n, p, what, rank, dims, axis1d, numel, offs);
        if (!st)
            for (int64_t i = 0; i < numel; i++) {
                if (f) f[i] = kf_get_f64(p, offs[i]);
                if (v) v[i] = kf_get_i64(p, offs[i]);
            }
    }
    kf_free(offs);
    if (st) {
        kf_free(f);
        kf_free(v);
        return st;
    }
    if (fo) *fo = f;
    if (io) *io = v;
    return KF_OK;
}

kf_status kf_nn_expand_param_f64(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                                 const int64_t *dims, int axis1d, double **out) {
    return expand_param(n, p, what, rank, dims, axis1d, out, NULL);
}

kf_status kf_nn_expand_param_i64(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                                 const int64_t *dims, int axis1d, int64_t **out) {
    return expand_param(n, p, what, rank, dims, axis1d, NULL, out);
}

double kf_nn_round_even(double v) {
    if (!isfinite(v)) return v;
    double r = nearbyint(v); /* default rounding mode: to nearest, ties to even */
    return r;
}

double kf_nn_round_to(kf_dtype dt, double v) {
    switch (dt) {
    case KF_DT_FLOAT: return (float)v;
    case KF_DT_FLOAT16: return kf_half_to_float(kf_float_to_half((float)v));
    case KF_DT_BFLOAT16: return kf_bf16_to_float(kf_float_to_bf16((float)v));
    default: return v;
    }
}

void kf_nn_softmax_row(kf_dtype p, double *x, int64_t n, bool masked_zero, bool bf16_step_sum) {
    double m = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        if (x[j] > m || isnan(x[j])) m = x[j];
    if (m == -INFINITY && masked_zero) m = 0;
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        x[j] = kf_nn_round_to(p, exp(kf_nn_round_to(p, x[j] - m)));
        sum = p == KF_DT_BFLOAT16 && bf16_step_sum ? kf_nn_round_to(p, sum + x[j]) : sum + x[j];
    }
    sum = kf_nn_round_to(p, sum);
    if (sum == 0 && masked_zero) sum = 1;
    for (int64_t j = 0; j < n; j++) x[j] = kf_nn_round_to(p, x[j] / sum);
}

void kf_nn_int_range(kf_dtype dt, double *lo, double *hi) {
    switch (dt) {
    case KF_DT_INT8:
        *lo = -128;
        *hi = 127;
        break;
    case KF_DT_UINT8:
        *lo = 0;
        *hi = 255;
        break;
    case KF_DT_INT16:
        *lo = -32768;
        *hi = 32767;
        break;
    case KF_DT_UINT16:
        *lo = 0;
        *hi = 65535;
        break;
    case KF_DT_INT4:
        *lo = -8;
        *hi = 7;
        break;
    case KF_DT_UINT4:
        *lo = 0;
        *hi = 15;
        break;
    case KF_DT_INT2:
        *lo = -2;
        *hi = 1;
        break;
    case KF_DT_UINT2:
        *lo = 0;
        *hi = 3;
        break;
    case KF_DT_INT32:
        *lo = -2147483648.0;
        *hi = 2147483647.0;
        break;
    case KF_DT_UINT32:
        *lo = 0;
        *hi = 4294967295.0;
        break;
    default:
        *lo = -INFINITY;
        *hi = INFINITY;
        break;
    }
}
