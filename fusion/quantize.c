/*
 * quantize.c: post-training static quantization (`kfuse quantize`). It sits
 * beside the rewrite passes in fusion/ but works on whole models: it runs
 * the float model on the reference evaluator to observe the values its
 * quantized nodes read, picks a clipping range per value, and writes a copy
 * of the model in the QDQ form (QuantizeLinear -> DequantizeLinear before
 * each quantized input, DequantizeLinear after each quantized weight) that
 * ONNX Runtime and other runtimes load. The choices are listed in
 * kf_quantize.h; the report compares both models on the same samples.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_onnx.h"
#include "kf_opset_raise.h"
#include "kf_quantize.h"
#include "kf_ref.h"

/* The symmetric int8 weight range: -127..127 keeps zero exact and the
 * range symmetric (-128 would be unused by max|w| / 127 scales). */
#define WEIGHT_QMAX 127.0
/* Largest finite float8e4m3fn value. */
#define FP8_MAX 448.0
/* Quantized levels the entropy method compares against: 128 for values of
 * both signs (TensorRT's choice: the magnitude of an 8-bit value), 255 for
 * values that are never negative (ReLU outputs), which uint8 covers with
 * every level. */
#define KL_LEVELS 128
#define KL_LEVELS_ONE_SIDED 255
/* The entropy search works on at most this many |x| bins (TensorRT's 2048;
 * finer histograms are merged in pairs first). */
#define KL_MAX_BINS 2048
/* Opsets the output needs: per-axis DequantizeLinear came in 13, float8 in 19. */
#define OPSET_PER_AXIS 13
#define OPSET_FP8 19

struct kf_quantizer {
    kf_model *m;
    kf_quant_options o;
    kf_quant_node *nodes;
    uint32_t nnodes;
    kf_quant_act *acts;
    uint32_t nacts;
    int32_t *act_of; /* value id -> index into acts, -1 */
    kf_id *real;     /* the graph's real inputs */
    uint32_t nreal;
    uint32_t samples;
    bool finished;
    char *warnings;
    size_t wlen;
    kf_status cb_status; /* first failure inside the evaluator callback */
};

void kf_quant_options_default(kf_quant_options *o) {
    memset(o, 0, sizeof *o);
    o->method = KF_QUANT_PERCENTILE;
    o->percentile = 99.999;
    o->type = KF_QUANT_INT8;
}

static const char *const base_ops[] = {"Conv", "MatMul", "Gemm"};
static const char *const extra_ops[] = {"Add", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool"};

#define NEXTRA ((int)(sizeof extra_ops / sizeof *extra_ops))

bool kf_quant_extra_op(const char *op_type) {
    for (int i = 0; i < NEXTRA; i++)
        if (!strcmp(op_type, extra_ops[i])) return true;
    return false;
}

/* The op type as a static string (kf_quant_node.op_type outlives models). */
static const char *static_op_name(const char *op_type) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(op_type, base_ops[i])) return base_ops[i];
    for (int i = 0; i < NEXTRA; i++)
        if (!strcmp(op_type, extra_ops[i])) return extra_ops[i];
    return "?";
}

static const char *const method_names[] = {"minmax", "percentile", "entropy"};

bool kf_quant_method_parse(const char *name, kf_quant_method *m) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, method_names[i])) {
            *m = (kf_quant_method)i;
            return true;
        }
    return false;
}

const char *kf_quant_method_name(kf_quant_method m) { return (unsigned)m < 3 ? method_names[m] : "?"; }

static void warn(kf_quantizer *q, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    size_t n = strlen(line);
    char *nw = kf_realloc(q->warnings, q->wlen + n + 2);
    if (!nw) return; /* a lost warning is survivable */
    q->warnings = nw;
    memcpy(q->warnings + q->wlen, line, n);
    q->wlen += n;
    q->warnings[q->wlen++] = '\n';
    q->warnings[q->wlen] = 0;
}

const char *kf_quant_warnings(const kf_quantizer *q) { return q->warnings ? q->warnings : ""; }

const kf_quant_node *kf_quant_nodes(const kf_quantizer *q, uint32_t *n) {
    *n = q->nnodes;
    return q->nodes;
}

const kf_quant_act *kf_quant_acts(const kf_quantizer *q, uint32_t *n) {
    *n = q->nacts;
    return q->acts;
}

void kf_quant_free(kf_quantizer *q) {
    if (!q) return;
    for (uint32_t i = 0; i < q->nnodes; i++) {
        kf_free(q->nodes[i].out);
        kf_free(q->nodes[i].label);
    }
    for (uint32_t i = 0; i < q->nacts; i++) {
        kf_free(q->acts[i].name);
        kf_free(q->acts[i].hist);
    }
    kf_free(q->nodes);
    kf_free(q->acts);
    kf_free(q->act_of);
    kf_free(q->real);
    kf_free(q->warnings);
    kf_free(q);
}

/* ---- choosing what to quantize ------------------------------------------- */

static bool in_list(const char *s, const char *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] && !strcmp(s, list[i])) return true;
    return false;
}

/* Whether node n's op is quantized: Conv, MatMul, Gemm, or an --include. */
static bool quantized_op(const kf_quantizer *q, const kf_node *n) {
    if (n->domain[0] && strcmp(n->domain, "ai.onnx")) return false;
    if (!kf_node_op(n)) return false; /* malformed, or a version kfuse does not run */
    if (in_list(n->op_type, base_ops, 3)) return true;
    return in_list(n->op_type, q->o.include, q->o.ninclude);
}

/* Input slots of n that may be quantized, and whether a constant there is
 * a weight (quantized symmetric, maybe per channel) or stays float. */
static int quant_slots(const kf_node *n, bool *weight_role) {
    int onnx_nin = kf_node_onnx_nin(n);
    if (!strcmp(n->op_type, "Conv") || !strcmp(n->op_type, "MatMul") || !strcmp(n->op_type, "Gemm")) {
        weight_role[0] = weight_role[1] = true;
        return onnx_nin < 2 ? onnx_nin : 2; /* Conv's and Gemm's bias stays float */
    }
    weight_role[0] = weight_role[1] = weight_role[2] = false;
    if (!strcmp(n->op_type, "Add") || !strcmp(n->op_type, "Mul")) return onnx_nin < 2 ? onnx_nin : 2;
    if (!strcmp(n->op_type, "Concat")) return onnx_nin; /* every input, but only 3 are recorded */
    return onnx_nin < 1 ? onnx_nin : 1;                 /* pools: X */
}

/* The per-channel axis of a weight in `slot` of n (the output channel), or
 * -1 for per tensor. */
static int weight_axis(const kf_node *n, int slot, int rank) {
    if (!strcmp(n->op_type, "Conv")) return slot == 1 && rank >= 1 ? 0 : -1;
    if (!strcmp(n->op_type, "MatMul")) return slot == 1 && rank >= 2 ? rank - 1 : -1;
    if (!strcmp(n->op_type, "Gemm")) {
        if (slot != 1 || rank != 2) return -1;
        return kf_attr_i(n, "transB", 0) ? 0 : 1;
    }
    return -1;
}

static kf_status add_act(kf_quantizer *q, kf_id v, int *index) {
    if (q->act_of[v] >= 0) {
        *index = q->act_of[v];
        return KF_OK;
    }
    kf_quant_act *na = kf_realloc(q->acts, sizeof *na * (q->nacts + 1));
    if (!na) return kf_fail(KF_ERR_NOMEM, "out of memory");
    q->acts = na;
    kf_quant_act *a = &q->acts[q->nacts];
    memset(a, 0, sizeof *a);
    a->name = kf_strdup(q->m->graph->values[v].name);
    a->hist = kf_calloc(KF_QUANT_HIST_BINS, sizeof(uint64_t));
    a->min = INFINITY;
    a->max = -INFINITY;
    if (!a->name || !a->hist) {
        kf_free(a->name);
        kf_free(a->hist);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    q->act_of[v] = (int32_t)q->nacts;
    *index = (int)q->nacts++;
    return KF_OK;
}

/* Whether --exclude entry e names a node or an op type of g. */
static bool names_something(const kf_graph *g, const char *e) {
    for (kf_id i = 1; i < g->nnodes; i++) {
        const kf_node *n = &g->nodes[i];
        if (n->dead) continue;
        if (!strcmp(n->op_type, e) || (n->name && !strcmp(n->name, e))) return true;
    }
    return false;
}

kf_status kf_quant_new(kf_model *m, const kf_quant_options *o, kf_quantizer **out) {
    *out = NULL;
    for (int i = 0; i < o->ninclude; i++)
        if (!kf_quant_extra_op(o->include[i]))
            return kf_fail(KF_ERR_INVALID_ARG,
                           "--include '%s': only Add, Mul, Concat, MaxPool, AveragePool and GlobalAveragePool can be "
                           "added to Conv, MatMul and Gemm",
                           o->include[i]);
    if (o->method == KF_QUANT_PERCENTILE && !(o->percentile > 50 && o->percentile <= 100))
        return kf_fail(KF_ERR_INVALID_ARG, "percentile %g is not in (50, 100]", o->percentile);
    if ((unsigned)o->method > KF_QUANT_ENTROPY || (unsigned)o->type > KF_QUANT_FP8)
        return kf_fail(KF_ERR_INVALID_ARG, "unknown quantization method or type");
    kf_status st = kf_infer_shapes(m);
    if (st) return kf_fail_context(st, "quantize: shape inference");
    kf_quantizer *q = kf_calloc(1, sizeof *q);
    if (!q) return kf_fail(KF_ERR_NOMEM, "out of memory");
    q->m = m;
    q->o = *o;
    const kf_graph *g = m->graph;
    q->act_of = kf_malloc(sizeof(int32_t) * (g->nvalues + 1));
    q->nodes = kf_calloc(g->nnodes + 1, sizeof(kf_quant_node));
    if (!q->act_of || !q->nodes) {
        kf_quant_free(q);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t v = 0; v <= g->nvalues; v++) q->act_of[v] = -1;
    if ((st = kf_graph_real_inputs(g, &q->real, &q->nreal))) {
        kf_quant_free(q);
        return st;
    }
    for (int i = 0; i < o->nexclude; i++)
        if (!names_something(g, o->exclude[i]))
            warn(q, "--exclude '%s' names no node and no op type of the model", o->exclude[i]);
    for (int i = 0; i < o->ninclude; i++)
        if (!names_something(g, o->include[i])) warn(q, "--include '%s': the model has no %s node", o->include[i], o->include[i]);
    for (kf_id id = 1; id < g->nnodes && !st; id++) {
        const kf_node *n = &g->nodes[id];
        if (n->dead || !quantized_op(q, n) || !n->nout || !n->out[0]) continue;
        if (in_list(n->op_type, o->exclude, o->nexclude) || (n->name && in_list(n->name, o->exclude, o->nexclude)))
            continue;
        kf_quant_node *qn = &q->nodes[q->nnodes];
        bool weight_role[3] = {false, false, false}, any = false;
        int nslots = quant_slots(n, weight_role);
        for (int s = 0; s < 3; s++) qn->act[s] = -1, qn->axis[s] = -1;
        for (int s = 0; s < nslots && s < 3; s++) {
            kf_id v = n->in[s];
            if (!v) continue;
            const kf_value *val = &g->values[v];
            if (kf_value_is_constant(m, v)) {
                if (!weight_role[s] || val->init->dtype != KF_DT_FLOAT || val->init->numel == 0) continue;
                qn->weight[s] = true;
                qn->axis[s] = o->per_channel ? weight_axis(n, s, val->init->rank) : -1;
                any = true;
            } else if (val->type.dtype == KF_DT_FLOAT) {
                if ((st = add_act(q, v, &qn->act[s]))) break;
                any = true;
            }
        }
        /* Concat's inputs past the third share the treatment of the others */
        for (int s = 3; !st && !strcmp(n->op_type, "Concat") && s < kf_node_onnx_nin(n); s++) {
            kf_id v = n->in[s];
            int unused;
            if (v && !kf_value_is_constant(m, v) && g->values[v].type.dtype == KF_DT_FLOAT) {
                st = add_act(q, v, &unused);
                any = true;
            }
        }
        if (st || !any) continue;
        qn->out = kf_strdup(g->values[n->out[0]].name);
        qn->label = kf_strdup(kf_node_label(n));
        qn->op_type = static_op_name(n->op_type);
        if (!qn->out || !qn->label) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        q->nnodes++;
    }
    if (st) {
        kf_quant_free(q);
        return st;
    }
    *out = q;
    return KF_OK;
}

/* ---- observing -------------------------------------------------------------- */

/* Doubles the histogram's range: bins merge in pairs into the middle half. */
static void hist_widen(kf_quant_act *a) {
    const int B = KF_QUANT_HIST_BINS;
    uint64_t merged[KF_QUANT_HIST_BINS / 2];
    for (int k = 0; k < B / 2; k++) merged[k] = a->hist[2 * k] + a->hist[2 * k + 1];
    memset(a->hist, 0, sizeof(uint64_t) * (size_t)B);
    memcpy(a->hist + B / 4, merged, sizeof merged);
    a->range *= 2;
}

static void observe_tensor(kf_quantizer *q, kf_quant_act *a, const kf_tensor *t) {
    if (t->dtype != KF_DT_FLOAT) {
        if (!q->cb_status)
            q->cb_status = kf_fail(KF_ERR_UNSUPPORTED, "quantize: value '%s' is %s at run time, not float", a->name,
                                   kf_dtype_name(t->dtype));
        return;
    }
    const float *x = t->data;
    double mx = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        double v = x[i];
        if (!isfinite(v)) continue;
        if (v < a->min) a->min = v;
        if (v > a->max) a->max = v;
        if (fabs(v) > mx) mx = fabs(v);
    }
    a->seen = true;
    if (a->range == 0) {
        /* the first range is the power of two above max|x|: bins stay
         * aligned when it doubles */
        int e = 0;
        if (mx > 0) frexp(mx, &e);
        a->range = mx > 0 ? ldexp(1.0, e) : ldexp(1.0, -100);
    }
    while (mx >= a->range) hist_widen(a);
    const int B = KF_QUANT_HIST_BINS;
    double per = B / (2 * a->range);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = x[i];
        if (!isfinite(v)) continue;
        int64_t b = (int64_t)floor((v + a->range) * per);
        if (b < 0) b = 0;
        if (b >= B) b = B - 1;
        a->hist[b]++;
        a->count++;
        a->zeros += v == 0;
    }
}

static void on_node(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs) {
    kf_quantizer *q = user;
    const kf_node *n = &g->nodes[node];
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (v && q->act_of[v] >= 0) observe_tensor(q, &q->acts[q->act_of[v]], &outs[j]);
    }
}

kf_status kf_quant_observe(kf_quantizer *q, const kf_tensor *inputs, int ninputs, kf_tensor *outputs) {
    if (ninputs != (int)q->nreal)
        return kf_fail(KF_ERR_INVALID_ARG, "quantize: a sample has %d inputs, the model takes %u", ninputs, q->nreal);
    for (uint32_t i = 0; i < q->nreal; i++)
        if (q->act_of[q->real[i]] >= 0) observe_tensor(q, &q->acts[q->act_of[q->real[i]]], &inputs[i]);
    const kf_graph *g = q->m->graph;
    kf_tensor *outs = outputs ? outputs : kf_calloc(g->noutputs + 1, sizeof(kf_tensor));
    if (!outs) return kf_fail(KF_ERR_NOMEM, "out of memory");
    q->cb_status = KF_OK;
    kf_eval_opts opts = {on_node, q};
    kf_status st = kf_eval_model(q->m, inputs, ninputs, outs, &opts);
    if (!st) st = q->cb_status;
    for (uint32_t o = 0; (st || !outputs) && o < g->noutputs; o++) kf_tensor_release(&outs[o]);
    if (!outputs) kf_free(outs);
    if (!st) q->samples++;
    return st;
}

/* ---- choosing ranges ----------------------------------------------------------- */

/* Percentile: the left edge of the bin where more than `cut` values lie
 * below, and the right edge of the bin where more than `cut` lie above. */
static void percentile_range(const kf_quant_act *a, double p, double *lo, double *hi) {
    const int B = KF_QUANT_HIST_BINS;
    double w = 2 * a->range / B, cut = (100.0 - p) / 200.0 * (double)a->count;
    double acc = 0;
    int l = 0, r = B - 1;
    for (; l < B; l++) {
        acc += (double)a->hist[l];
        if (acc > cut) break;
    }
    acc = 0;
    for (; r > 0; r--) {
        acc += (double)a->hist[r];
        if (acc > cut) break;
    }
    *lo = -a->range + l * w;
    *hi = -a->range + (r + 1) * w;
}

/* Smooths a distribution so no bin is 0 (ONNX Runtime's and MXNet's
 * eps = 1e-4 moved from the nonzero bins to the zero ones); false when
 * every bin is zero. */
static bool smooth(double *p, int n) {
    const double eps = 1e-4;
    int zeros = 0;
    for (int i = 0; i < n; i++) zeros += p[i] == 0;
    int nonzeros = n - zeros;
    if (!nonzeros) return false;
    double eps1 = eps * zeros / nonzeros;
    for (int i = 0; i < n; i++) p[i] += p[i] == 0 ? eps : -eps1;
    return true;
}

static double kl_divergence(const double *p, const double *q, int n) {
    double sp = 0, sq = 0, d = 0;
    for (int i = 0; i < n; i++) sp += p[i], sq += q[i];
    for (int i = 0; i < n; i++) {
        double pi = p[i] / sp, qi = q[i] / sq;
        if (pi > 0 && qi > 0) d += pi * log(pi / qi);
    }
    return d;
}

/*
 * Entropy: TensorRT's calibration (Migacz, "8-bit inference with TensorRT",
 * 2017) on the histogram of |x|. For each candidate threshold i (in bins):
 *
 *   P = bins[0..i), with everything past i added to its last bin
 *   Q = bins[0..i) merged into `levels` groups, each group's count spread
 *       evenly over its nonzero bins (what rounding to `levels` levels keeps)
 *
 * and the threshold with the smallest KL(P || Q) wins: it clips where the
 * clipped tail costs less than the coarser steps a wider range would give.
 * Exact zeros are left out (as pytorch-quantization's skip_zeros): every
 * range holds 0 exactly, and the spike of a ReLU output in bin 0, averaged
 * with its neighbours whenever a group merges bins, would otherwise favour
 * thresholds where groups are single bins, clipping far into the values
 * (measured: 13% of a ReLU output's values clipped on the small ResNet-50).
 */
static double entropy_threshold(const kf_quant_act *a, int levels) {
    const int B = KF_QUANT_HIST_BINS, H = B / 2;
    double w = a->range / H;
    double *absb = kf_calloc((size_t)H, sizeof(double));
    double *p = kf_calloc((size_t)H, sizeof(double)), *qd = kf_calloc((size_t)H, sizeof(double));
    double best_t = fmax(fabs(a->min), fabs(a->max));
    if (!absb || !p || !qd) goto done; /* the full range is always a safe answer */
    for (int k = 0; k < H; k++) absb[k] = (double)(a->hist[H + k] + a->hist[H - 1 - k]);
    absb[0] -= (double)a->zeros; /* see above: exact zeros do not vote */
    int n = 0;
    for (int k = 0; k < H; k++)
        if (absb[k] > 0) n = k + 1;
    while (n > KL_MAX_BINS) { /* merge pairs: the bin width doubles */
        for (int k = 0; k < (n + 1) / 2; k++) absb[k] = absb[2 * k] + (2 * k + 1 < n ? absb[2 * k + 1] : 0);
        n = (n + 1) / 2;
        w *= 2;
    }
    if (n <= levels) goto done; /* as few bins as levels: nothing to clip */
    double best = INFINITY;
    int best_i = n;
    double total_above = 0;
    for (int k = 0; k < n; k++) total_above += absb[k];
    double below = 0;
    for (int k = 0; k < levels - 1; k++) below += absb[k];
    for (int i = levels; i <= n; i++) {
        below += absb[i - 1];
        double outliers = total_above - below;
        for (int k = 0; k < i; k++) p[k] = absb[k];
        p[i - 1] += outliers;
        int merged = i / levels;
        for (int j = 0; j < levels; j++) {
            int start = j * merged, stop = j == levels - 1 ? i : start + merged;
            double sum = 0;
            int nonzero = 0;
            for (int k = start; k < stop; k++) {
                sum += absb[k];
                nonzero += absb[k] != 0;
            }
            for (int k = start; k < stop; k++) qd[k] = absb[k] != 0 && nonzero ? sum / nonzero : 0;
        }
        if (!smooth(p, i) || !smooth(qd, i)) continue;
        double d = kl_divergence(p, qd, i);
        if (d < best) best = d, best_i = i;
    }
    best_t = best_i * w;
done:
    kf_free(absb);
    kf_free(p);
    kf_free(qd);
    return best_t;
}

kf_status kf_quant_finish(kf_quantizer *q) {
    if (!q->samples) return kf_fail(KF_ERR_INVALID_ARG, "quantize: no calibration sample was observed");
    for (uint32_t i = 0; i < q->nacts; i++) {
        kf_quant_act *a = &q->acts[i];
        if (!a->seen || !a->count) {
            warn(q, "value '%s' was not computed by any sample (or only as NaN/Inf): left in float", a->name);
            a->seen = false;
            continue;
        }
        double lo = a->min, hi = a->max;
        if (q->o.method == KF_QUANT_PERCENTILE) {
            percentile_range(a, q->o.percentile, &lo, &hi);
            lo = fmax(lo, a->min);
            hi = fmin(hi, a->max);
        } else if (q->o.method == KF_QUANT_ENTROPY) {
            bool one_sided = a->min >= 0 && q->o.type == KF_QUANT_INT8;
            double t = entropy_threshold(a, one_sided ? KL_LEVELS_ONE_SIDED : KL_LEVELS);
            lo = fmax(a->min, -t);
            hi = fmin(a->max, t);
        }
        if (lo > 0) lo = 0; /* zero must be exact: padding and ReLU outputs */
        if (hi < 0) hi = 0;
        a->lo = lo;
        a->hi = hi;
        if (q->o.type == KF_QUANT_FP8) {
            double t = fmax(-lo, hi);
            a->scale = t > 0 ? (float)(t / FP8_MAX) : 1.0f;
            a->zero_point = 0;
        } else {
            double s = (hi - lo) / 255.0;
            if (!(s > 0) || !isfinite((float)s)) s = 1.0;
            a->scale = (float)s;
            double zp = nearbyint(-lo / (double)a->scale);
            a->zero_point = zp < 0 ? 0 : zp > 255 ? 255 : (int)zp;
        }
    }
    q->finished = true;
    return KF_OK;
}

/* ---- writing the QDQ model ------------------------------------------------------- */

static kf_status scalar_const(kf_graph *g, const char *base, kf_dtype dt, double v, kf_id *id) {
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, dt, 0, NULL);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    if (dt == KF_DT_FLOAT8E4M3FN) ((uint8_t *)t->data)[0] = kf_f64_to_small(dt, v, true);
    else kf_set_f64(t, 0, v);
    return kf_graph_add_constant(g, base, t, id);
}

/* Adds op(in[0..nin)) -> a fresh value named after base; *outv gets it. */
static kf_status add_qdq_node(kf_model *m, const char *op, const char *base, const char *suffix, const kf_id *in,
                              int nin, int axis, kf_id *outv) {
    kf_graph *g = m->graph;
    char name[600];
    snprintf(name, sizeof name, "%.500s_%s", base, suffix);
    KF_TRY(kf_graph_fresh_value(g, name, outv));
    snprintf(name, sizeof name, "%.500s_%s", base, op);
    kf_id node;
    KF_TRY(kf_graph_add_node(g, op, "", name, in, nin, outv, 1, &node));
    kf_node *n = &g->nodes[node];
    n->op = kf_op_lookup("", op);
    n->opset = kf_model_opset(m, "");
    if (axis >= 0) {
        kf_attr at = {.name = "axis", .type = KF_ATTR_INT, .i = axis};
        KF_TRY(kf_node_add_attr(n, &at));
    }
    return kf_infer_node(m, node);
}

/* QuantizeLinear -> DequantizeLinear on value v; *dq gets the float value
 * the quantized nodes read instead of v. */
static kf_status qdq_pair(const kf_quantizer *q, kf_model *m, const kf_quant_act *a, kf_id v, kf_id *dq) {
    kf_graph *g = m->graph;
    bool fp8 = q->o.type == KF_QUANT_FP8;
    char base[600];
    kf_id s, z, qv;
    snprintf(base, sizeof base, "%.500s_scale", a->name);
    KF_TRY(scalar_const(g, base, KF_DT_FLOAT, a->scale, &s));
    snprintf(base, sizeof base, "%.500s_zero_point", a->name);
    KF_TRY(scalar_const(g, base, fp8 ? KF_DT_FLOAT8E4M3FN : KF_DT_UINT8, a->zero_point, &z));
    kf_id in[3] = {v, s, z};
    KF_TRY(add_qdq_node(m, "QuantizeLinear", a->name, "quantized", in, 3, -1, &qv));
    in[0] = qv;
    return add_qdq_node(m, "DequantizeLinear", a->name, "dequantized", in, 3, -1, dq);
}

/* Quantizes weight w (float initializer) symmetric along axis (-1: one
 * scale) and adds its DequantizeLinear; *dq gets the float value. */
static kf_status weight_dq(const kf_quantizer *q, kf_model *m, kf_id w, int axis, kf_id *dq) {
    kf_graph *g = m->graph;
    const kf_tensor *t = g->values[w].init;
    bool fp8 = q->o.type == KF_QUANT_FP8;
    kf_dtype qt = fp8 ? KF_DT_FLOAT8E4M3FN : KF_DT_INT8;
    double qmax = fp8 ? FP8_MAX : WEIGHT_QMAX;
    int64_t channels = axis >= 0 ? t->dims[axis] : 1;
    int64_t inner = 1;
    for (int d = axis + 1; axis >= 0 && d < t->rank; d++) inner *= t->dims[d];
    kf_tensor *wq = kf_tensor_new(), *sc = kf_tensor_new(), *zp = kf_tensor_new();
    kf_status st = !wq || !sc || !zp ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    int64_t cdims[1] = {channels};
    if (!st) st = kf_tensor_alloc(wq, qt, t->rank, t->dims);
    if (!st) st = kf_tensor_alloc(sc, KF_DT_FLOAT, axis >= 0 ? 1 : 0, cdims);
    if (!st) st = kf_tensor_alloc(zp, qt, axis >= 0 ? 1 : 0, cdims); /* zero-filled: 0 in both types */
    if (st) {
        kf_tensor_free(wq);
        kf_tensor_free(sc);
        kf_tensor_free(zp);
        return st;
    }
    const float *x = t->data;
    float *scale = sc->data;
    /* element i belongs to channel (i / inner) % channels */
    for (int64_t c = 0; c < channels; c++) scale[c] = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t c = axis >= 0 ? (i / inner) % channels : 0;
        float v = fabsf(x[i]);
        if (v > scale[c] && isfinite(v)) scale[c] = v;
    }
    for (int64_t c = 0; c < channels; c++) {
        float s = (float)(scale[c] / qmax);
        scale[c] = s > 0 && isfinite(s) ? s : 1.0f; /* an all-zero channel: any scale dequantizes to 0 */
    }
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t c = axis >= 0 ? (i / inner) % channels : 0;
        double v = (double)x[i] / scale[c];
        if (fp8) {
            ((uint8_t *)wq->data)[i] = kf_f64_to_small(qt, isfinite(v) ? v : 0, true);
        } else {
            v = isfinite(v) ? nearbyint(v) : 0;
            ((int8_t *)wq->data)[i] = (int8_t)(v > qmax ? qmax : v < -qmax ? -qmax : v);
        }
    }
    const char *wname = g->values[w].name;
    char base[600];
    kf_id wid, sid, zid;
    snprintf(base, sizeof base, "%.500s_quantized", wname);
    st = kf_graph_add_constant(g, base, wq, &wid);
    snprintf(base, sizeof base, "%.500s_scale", wname);
    if (!st) st = kf_graph_add_constant(g, base, sc, &sid);
    else kf_tensor_free(sc);
    snprintf(base, sizeof base, "%.500s_zero_point", wname);
    if (!st) st = kf_graph_add_constant(g, base, zp, &zid);
    else kf_tensor_free(zp);
    if (st) return st;
    kf_id in[3] = {wid, sid, zid};
    return add_qdq_node(m, "DequantizeLinear", wname, "dequantized", in, 3, axis, dq);
}

/* The opset the output needs: 13 for per-axis DequantizeLinear, 19 for
 * float8 (10 otherwise: QuantizeLinear's first version). */
static int64_t needed_opset(const kf_quantizer *q) {
    if (q->o.type == KF_QUANT_FP8) return OPSET_FP8;
    for (uint32_t i = 0; i < q->nnodes; i++)
        for (int s = 0; s < 3; s++)
            if (q->nodes[i].weight[s] && q->nodes[i].axis[s] >= 0) return OPSET_PER_AXIS;
    return 10;
}

/* A model copy: serialized and parsed again, so nothing is shared. */
static kf_status copy_model(const kf_model *m, kf_model **out) {
    void *data;
    size_t len;
    KF_TRY(kf_model_save_memory(m, &data, &len));
    kf_status st = kf_model_load_memory(data, len, m->dir, out);
    free(data);
    return st;
}

kf_status kf_quant_apply(const kf_quantizer *q, kf_model **out) {
    *out = NULL;
    if (!q->finished) return kf_fail(KF_ERR_INVALID_ARG, "quantize: ranges not chosen yet (kf_quant_finish)");
    kf_model *m;
    KF_TRY(copy_model(q->m, &m));
    kf_status st = KF_OK;
    int64_t want = needed_opset(q), have = kf_model_opset(m, "");
    if (have < want) {
        const char *why = NULL;
        st = kf_model_raise_opset(m, want, &why);
        if (st)
            st = kf_fail(st, "quantize: the model imports opset %lld, the quantized form needs %lld: %s",
                         (long long)have, (long long)want, why ? why : kf_last_error());
    }
    if (!st) st = kf_infer_shapes(m);
    kf_graph *g = m->graph;
    kf_id *dq_of = kf_calloc(q->nacts + 1, sizeof(kf_id));
    /* quantized weights, shared by every node that reads the same weight
     * along the same axis */
    typedef struct {
        kf_id w, dq;
        int axis;
    } wdq;
    wdq *wd = kf_calloc(q->nnodes * 3 + 1, sizeof(wdq));
    uint32_t nwd = 0;
    if (!st && (!dq_of || !wd)) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < q->nacts && !st; i++) {
        const kf_quant_act *a = &q->acts[i];
        if (!a->seen) continue;
        kf_id v = kf_graph_find(g, a->name);
        if (!v) st = kf_fail(KF_ERR_INTERNAL, "quantize: value '%s' is missing from the copy", a->name);
        else st = qdq_pair(q, m, a, v, &dq_of[i]);
    }
    for (uint32_t i = 0; i < q->nnodes && !st; i++) {
        const kf_quant_node *qn = &q->nodes[i];
        kf_id ov = kf_graph_find(g, qn->out), id = ov ? g->values[ov].producer : 0;
        if (!id || strcmp(g->nodes[id].op_type, qn->op_type)) {
            st = kf_fail(KF_ERR_INTERNAL, "quantize: node '%s' is missing from the copy", qn->label);
            break;
        }
        for (int s = 0; s < 3 && !st; s++) {
            kf_id src = g->nodes[id].in[s < g->nodes[id].nin ? s : 0];
            if (qn->act[s] >= 0 && dq_of[qn->act[s]]) st = kf_graph_set_input(g, id, s, dq_of[qn->act[s]]);
            if (!qn->weight[s]) continue;
            uint32_t k = 0;
            while (k < nwd && !(wd[k].w == src && wd[k].axis == qn->axis[s])) k++;
            if (k == nwd) {
                wd[k].w = src;
                wd[k].axis = qn->axis[s];
                if ((st = weight_dq(q, m, src, qn->axis[s], &wd[k].dq))) break;
                nwd++;
            }
            st = kf_graph_set_input(g, id, s, wd[k].dq);
        }
        /* Concat's further inputs */
        for (int s = 3; !st && !strcmp(qn->op_type, "Concat") && s < kf_node_onnx_nin(&g->nodes[id]); s++) {
            kf_id v = g->nodes[id].in[s];
            kf_id fv = v ? kf_graph_find(q->m->graph, g->values[v].name) : 0;
            int32_t ai = fv ? q->act_of[fv] : -1;
            if (ai >= 0 && dq_of[ai]) st = kf_graph_set_input(g, id, s, dq_of[ai]);
        }
    }
    kf_free(dq_of);
    kf_free(wd);
    if (st) {
        kf_model_free(m);
        return st;
    }
    *out = m;
    return KF_OK;
}

/* ---- the report ------------------------------------------------------------------ */

double kf_quant_db(double signal, double noise) {
    if (!(signal > 0)) return NAN;
    if (noise == 0) return INFINITY;
    return 10.0 * log10(signal / noise);
}

static void accumulate(kf_quant_sqnr *s, const kf_tensor *ref, const kf_tensor *got) {
    if (ref->dtype != KF_DT_FLOAT || got->dtype != KF_DT_FLOAT || ref->numel != got->numel) return;
    const float *r = ref->data, *x = got->data;
    for (int64_t i = 0; i < ref->numel; i++) {
        double d = (double)x[i] - r[i];
        s->signal += (double)r[i] * r[i];
        s->noise += d * d;
    }
}

typedef struct report_ctx {
    int32_t *layer_of; /* value id of the model being run -> layer index, -1 */
    kf_tensor *refs;   /* the float run's layer outputs */
    kf_quant_report *r;
    bool compare;      /* false: store refs; true: compare with them */
    kf_status st;
} report_ctx;

static void report_node(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs) {
    report_ctx *c = user;
    const kf_node *n = &g->nodes[node];
    if (!n->nout || !n->out[0] || c->st) return;
    int32_t l = c->layer_of[n->out[0]];
    if (l < 0) return;
    if (!c->compare) c->st = kf_tensor_copy(&c->refs[l], &outs[0]);
    else accumulate(&c->r->layers[l], &c->refs[l], &outs[0]);
}

/* layer index per value id of m (by the layers' output names) */
static int32_t *layer_map(const kf_quantizer *q, const kf_model *m) {
    int32_t *map = kf_malloc(sizeof(int32_t) * (m->graph->nvalues + 1));
    if (!map) return NULL;
    for (uint32_t v = 0; v <= m->graph->nvalues; v++) map[v] = -1;
    for (uint32_t i = 0; i < q->nnodes; i++) {
        kf_id v = kf_graph_find(m->graph, q->nodes[i].out);
        if (v) map[v] = (int32_t)i;
    }
    return map;
}

kf_status kf_quant_report_add(const kf_quantizer *q, const kf_model *fm, const kf_model *qm, const kf_tensor *inputs,
                              int ninputs, const kf_tensor *float_outputs, bool layers, kf_quant_report *r) {
    const kf_graph *fg = fm->graph;
    if (qm->graph->noutputs != fg->noutputs)
        return kf_fail(KF_ERR_INVALID_ARG, "quantize: the models have %u and %u outputs", fg->noutputs,
                       qm->graph->noutputs);
    if (!r->layers && !r->outputs) {
        r->layers = kf_calloc(q->nnodes + 1, sizeof(kf_quant_sqnr));
        r->outputs = kf_calloc(fg->noutputs + 1, sizeof(kf_quant_sqnr));
        if (!r->layers || !r->outputs) {
            kf_quant_report_release(r);
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
        r->nlayers = q->nnodes;
        r->noutputs = fg->noutputs;
        for (uint32_t i = 0; i < q->nnodes; i++) {
            r->layers[i].name = q->nodes[i].label;
            r->layers[i].op_type = q->nodes[i].op_type;
        }
        for (uint32_t o = 0; o < fg->noutputs; o++) r->outputs[o].name = fg->values[fg->outputs[o]].name;
        r->total.name = "all outputs";
    }
    kf_tensor *fo = kf_calloc(fg->noutputs + 1, sizeof(kf_tensor)), *qo = kf_calloc(fg->noutputs + 1, sizeof(kf_tensor));
    kf_tensor *refs = layers ? kf_calloc(q->nnodes + 1, sizeof(kf_tensor)) : NULL;
    report_ctx c = {.refs = refs, .r = r};
    kf_status st = !fo || !qo || (layers && !refs) ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    kf_eval_opts opts = {report_node, &c};
    if (!st && layers && !(c.layer_of = layer_map(q, fm))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    bool reuse = float_outputs && !layers;
    if (!st && !reuse) st = kf_eval_model(fm, inputs, ninputs, fo, layers ? &opts : NULL);
    if (!st) st = c.st;
    if (!st && layers) {
        kf_free(c.layer_of);
        c.compare = true;
        if (!(c.layer_of = layer_map(q, qm))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (!st) st = kf_eval_model(qm, inputs, ninputs, qo, layers ? &opts : NULL);
    if (!st) st = c.st;
    for (uint32_t o = 0; !st && o < fg->noutputs; o++) {
        const kf_tensor *ref = reuse ? &float_outputs[o] : &fo[o];
        accumulate(&r->outputs[o], ref, &qo[o]);
        accumulate(&r->total, ref, &qo[o]);
    }
    if (!st) r->samples++;
    for (uint32_t o = 0; fo && qo && o < fg->noutputs; o++) {
        kf_tensor_release(&fo[o]);
        kf_tensor_release(&qo[o]);
    }
    for (uint32_t i = 0; refs && i < q->nnodes; i++) kf_tensor_release(&refs[i]);
    kf_free(refs);
    kf_free(c.layer_of);
    kf_free(fo);
    kf_free(qo);
    return st;
}

static int worst_first(const void *a, const void *b) {
    double x = ((const kf_quant_sqnr *)a)->db, y = ((const kf_quant_sqnr *)b)->db;
    if (isnan(x)) return isnan(y) ? 0 : 1; /* no signal: last */
    if (isnan(y)) return -1;
    return x < y ? -1 : x > y;
}

void kf_quant_report_finish(kf_quant_report *r) {
    for (uint32_t i = 0; i < r->nlayers; i++) r->layers[i].db = kf_quant_db(r->layers[i].signal, r->layers[i].noise);
    for (uint32_t o = 0; o < r->noutputs; o++) r->outputs[o].db = kf_quant_db(r->outputs[o].signal, r->outputs[o].noise);
    r->total.db = kf_quant_db(r->total.signal, r->total.noise);
    if (r->nlayers) qsort(r->layers, r->nlayers, sizeof *r->layers, worst_first);
}

void kf_quant_report_release(kf_quant_report *r) {
    kf_free(r->layers);
    kf_free(r->outputs);
    memset(r, 0, sizeof *r);
}
