/*
 * run.c: `kfuse run --backend opencl|cuda`: one run of a model through a
 * compiled plan (exec.c) made and freed around it, and the tolerance
 * comparison `--check` and the tests use.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kf_run.h"

kf_status kf_run_backend_steps(kf_model *m, kf_exec_backend b, kf_precision prec, const kf_tensor *inputs,
                               int ninputs, kf_tensor *outputs, FILE *trace, FILE *host_steps, kf_run_summary *sum) {
    if (sum) memset(sum, 0, sizeof *sum);
    if (ninputs < 0) return kf_fail(KF_ERR_INVALID_ARG, "%d inputs", ninputs);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = b;
    o.precision = prec;
    o.trace = trace;
    o.host_steps = host_steps;
    kf_exec *x;
    KF_TRY(kf_exec_create(m, &o, &x));
    kf_status st = kf_exec_run(x, inputs, (uint32_t)ninputs, outputs);
    kf_exec_stats es;
    kf_exec_get_stats(x, &es);
    if (sum) {
        sum->groups_cl = es.groups_dev;
        sum->groups_ref = es.groups_ref;
        sum->groups_lib = es.groups_lib;
    }
    kf_exec_free(x);
    return st;
}

kf_status kf_run_backend(kf_model *m, kf_exec_backend b, kf_precision prec, const kf_tensor *inputs, int ninputs,
                         kf_tensor *outputs, FILE *trace, kf_run_summary *sum) {
    return kf_run_backend_steps(m, b, prec, inputs, ninputs, outputs, trace, NULL, sum);
}

kf_status kf_run_opencl(kf_model *m, const kf_tensor *inputs, int ninputs, kf_tensor *outputs, FILE *trace,
                        kf_run_summary *sum) {
    kf_exec_options o;
    kf_exec_options_default(&o); /* KFUSE_PRECISION */
    return kf_run_backend(m, KF_EXEC_OPENCL, o.precision, inputs, ninputs, outputs, trace, sum);
}

/* ---- --check comparison ------------------------------------------------- */

/* DESIGN.md numerics: fused vs unfused tolerances per dtype */
#define RUN_F32_ATOL 1e-5
#define RUN_F32_RTOL 1e-4
#define RUN_F16_ATOL 2.5e-3
#define RUN_F16_RTOL 1e-3
#define RUN_BF16_ATOL 2e-2 /* bfloat16 keeps 8 mantissa bits to float16's 11 */
#define RUN_BF16_RTOL 1e-2

void kf_run_tolerance(kf_dtype dt, double *atol, double *rtol) {
    if (!kf_dtype_is_float(dt)) {
        *atol = *rtol = 0;
        return;
    }
    *atol = dt == KF_DT_FLOAT16 ? RUN_F16_ATOL : dt == KF_DT_BFLOAT16 ? RUN_BF16_ATOL : RUN_F32_ATOL;
    *rtol = dt == KF_DT_FLOAT16 ? RUN_F16_RTOL : dt == KF_DT_BFLOAT16 ? RUN_BF16_RTOL : RUN_F32_RTOL;
}

void kf_run_tolerance_prec(kf_dtype dt, kf_precision p, double *atol, double *rtol) {
    kf_run_tolerance(dt, atol, rtol);
    if (!kf_dtype_is_float(dt) || p == KF_PRECISION_FP32 || p == KF_PRECISION_INT8) return;
    double a, r;
    kf_run_tolerance(p == KF_PRECISION_BF16 ? KF_DT_BFLOAT16 : KF_DT_FLOAT16, &a, &r);
    if (a > *atol) *atol = a;
    if (r > *rtol) *rtol = r;
}

bool kf_run_close(const kf_tensor *got, const kf_tensor *want, char *why, size_t whylen) {
    return kf_run_close_prec(got, want, KF_PRECISION_FP32, why, whylen);
}

/* got against want with float elements held to atol + rtol * |want|. */
static bool close_at(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, char *why, size_t whylen);

bool kf_run_close_prec(const kf_tensor *got, const kf_tensor *want, kf_precision p, char *why, size_t whylen) {
    double atol, rtol;
    kf_run_tolerance_prec(got->dtype, p, &atol, &rtol);
    return close_at(got, want, atol, rtol, why, whylen);
}

bool kf_run_close_model(const kf_tensor *got, const kf_tensor *want, kf_precision p, uint32_t depth, char *why,
                        size_t whylen) {
    double atol, rtol;
    kf_run_tolerance_prec(got->dtype, p, &atol, &rtol);
    if (p != KF_PRECISION_FP32 && kf_dtype_is_float(got->dtype) && got->dtype == want->dtype) {
        double big = 0, s = sqrt(depth > 1 ? (double)depth : 1.0);
        for (int64_t i = 0; i < want->numel; i++) {
            double w = fabs(kf_get_f64(want, i));
            if (isfinite(w) && w > big) big = w;
        }
        atol = s * (atol + rtol * big);
        rtol *= s;
    } else if (kf_dtype_is_float(got->dtype) && got->dtype == want->dtype && depth > 1) {
        /* float32 against the reference's double accumulation: one unit of
         * rounding per dot product grown by sqrt(K) (K up to
         * KF_RUN_FP32_LONG_DOT), per layer by sqrt(L), on the output's scale */
        double big = 0;
        for (int64_t i = 0; i < want->numel; i++) {
            double w = fabs(kf_get_f64(want, i));
            if (isfinite(w) && w > big) big = w;
        }
        atol += sqrt((double)KF_RUN_FP32_LONG_DOT) * 0x1p-24 * sqrt((double)depth) * big;
    }
    return close_at(got, want, atol, rtol, why, whylen);
}

/* The heaviest path to each graph output, a node adding weight(g, n) to
 * the heaviest of its inputs (graph inputs and constants weigh 0). */
static kf_status heaviest_paths(const kf_model *m, uint32_t (*weight)(const kf_graph *, const kf_node *), uint32_t *out) {
    const kf_graph *g = m->graph;
    kf_id *order = NULL;
    uint32_t count = 0;
    KF_TRY(kf_graph_topo(g, &order, &count));
    uint32_t *d = kf_calloc((size_t)g->nvalues + 1, sizeof(uint32_t));
    if (!d) {
        kf_free(order);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t k = 0; k < count; k++) {
        const kf_node *n = &g->nodes[order[k]];
        uint32_t dn = 0;
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] && d[n->in[i]] > dn) dn = d[n->in[i]];
        dn += weight(g, n);
        for (int j = 0; j < n->nout; j++)
            if (n->out[j]) d[n->out[j]] = dn;
    }
    for (uint32_t o = 0; o < g->noutputs; o++) out[o] = d[g->outputs[o]];
    kf_free(d);
    kf_free(order);
    return KF_OK;
}

/* A node's roundings: KF_OP_STEP_ROUNDINGS for one that rounds each step. */
static uint32_t roundings(const kf_graph *g, const kf_node *n) {
    (void)g;
    const kf_op_info *info = kf_node_op(n);
    return info && (info->flags & KF_F_ROUNDS_STEPS) ? KF_OP_STEP_ROUNDINGS : 1;
}

kf_status kf_run_output_depths(const kf_model *m, uint32_t *depth) {
    KF_TRY(heaviest_paths(m, roundings, depth));
    for (uint32_t o = 0; o < m->graph->noutputs; o++)
        if (!depth[o]) depth[o] = 1; /* an input passed through */
    return KF_OK;
}

/* 1 for a QuantizeLinear of a computed value, else 0. */
static uint32_t requantizes(const kf_graph *g, const kf_node *n) {
    return n->op == KF_OP_QUANTIZE_LINEAR && n->nin && n->in[0] && g->values[n->in[0]].producer;
}

/* 1 for a QuantizeLinear of a computed value to a small float, else 0.
 * The type as ONNX gives it (the value's may not be inferred yet): the
 * output_dtype attribute, else the zero point's type. */
static uint32_t requantizes_small_float(const kf_graph *g, const kf_node *n) {
    if (!requantizes(g, n)) return 0;
    kf_dtype dt = (kf_dtype)kf_attr_i(n, "output_dtype", 0);
    if (!dt && n->nin > 2 && n->in[2]) dt = g->values[n->in[2]].type.dtype;
    return kf_dtype_is_small_float(dt);
}

kf_status kf_run_output_requants(const kf_model *m, uint32_t *requant) {
    KF_TRY(heaviest_paths(m, requantizes, requant));
    uint32_t n = m->graph->noutputs;
    uint32_t *sf = kf_calloc((size_t)n + 1, sizeof *sf);
    if (!sf) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = heaviest_paths(m, requantizes_small_float, sf);
    for (uint32_t o = 0; !st && o < n; o++)
        if (sf[o]) requant[o] |= KF_RUN_REQUANT_SMALL_FLOAT;
    kf_free(sf);
    return st;
}

double kf_run_sqnr_db(const kf_tensor *got, const kf_tensor *want) {
    if (got->dtype != want->dtype || got->numel != want->numel ||
        !(kf_dtype_is_float(got->dtype) || kf_dtype_is_small_float(got->dtype)))
        return NAN;
    double sig = 0, err = 0;
    for (int64_t i = 0; i < got->numel; i++) {
        double a = kf_get_f64(got, i), b = kf_get_f64(want, i);
        if (!isfinite(a) || !isfinite(b)) {
            if (!(isnan(a) && isnan(b)) && a != b) return NAN;
            continue;
        }
        sig += b * b;
        err += (a - b) * (a - b);
    }
    if (err == 0) return INFINITY;
    return 10 * log10(sig / err);
}

bool kf_run_close_requant(const kf_tensor *got, const kf_tensor *want, kf_precision p, uint32_t depth, uint32_t requant,
                          double *db, char *why, size_t whylen) {
    *db = NAN;
    if (kf_run_close_model(got, want, p, depth, why, whylen)) return true;
    if (!requant || got->dtype != want->dtype || !(kf_dtype_is_float(got->dtype) || kf_dtype_is_small_float(got->dtype)) ||
        got->rank != want->rank)
        return false;
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) return false;
    *db = kf_run_sqnr_db(got, want);
    /* the elements past the elementwise bound, for the message */
    double atol, rtol;
    kf_run_tolerance_prec(got->dtype, p, &atol, &rtol);
    int64_t past = 0;
    for (int64_t i = 0; i < got->numel; i++) {
        double a = kf_get_f64(got, i), b = kf_get_f64(want, i);
        if (isfinite(a) && isfinite(b) && fabs(a - b) > atol + rtol * fabs(b)) past++;
    }
    size_t len = strlen(why);
    bool sf = (requant & KF_RUN_REQUANT_SMALL_FLOAT) != 0;
    double floor_db = sf ? KF_RUN_REQUANT_SMALL_FLOAT_MIN_DB : KF_RUN_REQUANT_MIN_DB;
    if (!(*db >= floor_db)) {
        snprintf(why + len, whylen > len ? whylen - len : 0, "; SQNR %.1f dB, under the %.0f dB of %srequantization flips",
                 *db, floor_db, sf ? "float8 " : "");
        return false;
    }
    snprintf(why, whylen, "%lld of %lld elements past the elementwise bound; SQNR %.1f dB >= %.0f dB (%u %srequantizations "
             "upstream: flips of one step cascade)",
             (long long)past, (long long)got->numel, *db, floor_db, requant & ~KF_RUN_REQUANT_SMALL_FLOAT, sf ? "float8 " : "");
    return true;
}

static bool close_at(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, char *why, size_t whylen) {
    if (got->dtype != want->dtype || got->rank != want->rank || got->numel != want->numel) {
        snprintf(why, whylen, "dtype/shape differ: got dtype %d rank %d numel %lld, want dtype %d rank %d numel %lld",
                 (int)got->dtype, got->rank, (long long)got->numel, (int)want->dtype, want->rank,
                 (long long)want->numel);
        return false;
    }
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) {
            snprintf(why, whylen, "dim %d differs: got %lld, want %lld", d, (long long)got->dims[d],
                     (long long)want->dims[d]);
            return false;
        }
    kf_dtype dt = got->dtype;
    if (dt == KF_DT_STRING || dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) {
        if (kf_tensor_equal(got, want)) return true;
        snprintf(why, whylen, "%s tensors differ", dt == KF_DT_STRING ? "string" : "complex");
        return false;
    }
    for (int64_t i = 0; i < got->numel; i++) {
        if (kf_dtype_is_float(dt)) {
            double a = kf_get_f64(got, i), b = kf_get_f64(want, i);
            bool ok = (isnan(a) && isnan(b)) || (isinf(b) && a == b) ||
                      (isfinite(a) && isfinite(b) && fabs(a - b) <= atol + rtol * fabs(b));
            if (!ok) {
                snprintf(why, whylen, "element %lld: got %.9g, want %.9g (atol %g rtol %g)", (long long)i, a, b,
                         atol, rtol);
                return false;
            }
        } else if (kf_dtype_is_small_float(dt)) { /* float8/6/4 codes: the same value, as integers are */
            double a = kf_get_f64(got, i), b = kf_get_f64(want, i);
            if (!(a == b || (isnan(a) && isnan(b)))) {
                snprintf(why, whylen, "element %lld: got %.9g, want %.9g (%s)", (long long)i, a, b, kf_dtype_name(dt));
                return false;
            }
        } else if (dt == KF_DT_UINT64) {
            if (kf_get_u64(got, i) != kf_get_u64(want, i)) {
                snprintf(why, whylen, "element %lld: got %llu, want %llu", (long long)i,
                         (unsigned long long)kf_get_u64(got, i), (unsigned long long)kf_get_u64(want, i));
                return false;
            }
        } else if (kf_get_i64(got, i) != kf_get_i64(want, i)) {
            snprintf(why, whylen, "element %lld: got %lld, want %lld", (long long)i, (long long)kf_get_i64(got, i),
                     (long long)kf_get_i64(want, i));
            return false;
        }
    }
    return true;
}
