/*
 * kf_quantize.h: post-training static quantization into standard QDQ ONNX
 * (`kfuse quantize`). The float model runs on the reference evaluator over
 * calibration samples; the values its Conv, MatMul and Gemm nodes (and the
 * op types asked for) read are observed; a clipping range is chosen per
 * value (min/max, percentile or entropy); a copy of the model then gets
 * QuantizeLinear -> DequantizeLinear on those values and DequantizeLinear
 * on quantized weight initializers. Any ONNX runtime loads the result.
 *
 * Choices (README, "kfuse quantize"):
 *   int8  weights int8, symmetric (zero point 0), scale max|w| / 127 per
 *         tensor or per output channel; activations uint8 asymmetric (the
 *         range always holds 0, zero point in [0, 255]), as ONNX Runtime's
 *         QDQ quantizer does by default (U8S8)
 *   fp8   float8e4m3fn everywhere, symmetric: scale max|x| / 448, zero
 *         point a float8 0 (opset 19 or newer; older models are raised)
 *   bias  stays float (the DequantizeLinear outputs feed a float op)
 *   what  the inputs of quantized nodes get Q/DQ; outputs are quantized by
 *         whichever quantized node reads them next; graph outputs and the
 *         inputs of nodes that are not quantized stay float
 */
#ifndef KF_QUANTIZE_H
#define KF_QUANTIZE_H

#include <stdio.h>

#include "kf_ir.h"

typedef enum kf_quant_method {
    KF_QUANT_MINMAX = 0,     /* the observed range */
    KF_QUANT_PERCENTILE = 1, /* cut (100 - p) / 2 percent of the values from each tail */
    KF_QUANT_ENTROPY = 2     /* the |x| threshold whose 128-level histogram is closest in KL divergence */
} kf_quant_method;

typedef enum kf_quant_type { KF_QUANT_INT8 = 0, KF_QUANT_FP8 = 1 } kf_quant_type;

typedef struct kf_quant_options {
    kf_quant_method method;
    double percentile;            /* KF_QUANT_PERCENTILE: in (50, 100]; default 99.999 */
    bool per_channel;             /* weights: one scale per output channel */
    kf_quant_type type;
    const char *const *exclude;   /* op types or node names kept in float */
    int nexclude;
    const char *const *include;   /* op types quantized besides Conv, MatMul, Gemm (kf_quant_extra_op) */
    int ninclude;
} kf_quant_options;

void kf_quant_options_default(kf_quant_options *o);
/* True for the op types --include takes: Add, Mul, Concat, MaxPool,
 * AveragePool, GlobalAveragePool (their float inputs get Q/DQ). */
bool kf_quant_extra_op(const char *op_type);
/* Method and type by their CLI names; false for other names. */
bool kf_quant_method_parse(const char *name, kf_quant_method *m);
const char *kf_quant_method_name(kf_quant_method m);

/* One value that gets a QuantizeLinear/DequantizeLinear pair. */
typedef struct kf_quant_act {
    char *name;          /* the value's name */
    double min, max;     /* observed over every sample (finite values only) */
    double lo, hi;       /* the clipping range the method chose (after kf_quant_finish) */
    float scale;         /* of the pair */
    int zero_point;      /* uint8 zero point (int8); 0 for fp8 */
    uint64_t count;      /* finite elements observed */
    uint64_t zeros;      /* of them exactly 0 (ReLU outputs, padding) */
    uint64_t *hist;      /* KF_QUANT_HIST_BINS counts over [-range, range) */
    double range;
    bool seen;           /* observed in at least one sample */
} kf_quant_act;

/* Histogram bins of one observed value. The range doubles (pairs of bins
 * merge, exactly) when a sample reaches past it, so the data always spans
 * more than a quarter of the bins: at least 2048 bins over [0, max|x|]. */
#define KF_QUANT_HIST_BINS 8192

/* One quantized node (a "layer" of the report). */
typedef struct kf_quant_node {
    char *out;           /* name of its first output: nodes are found by it in copies */
    char *label;         /* node name for messages */
    const char *op_type; /* static */
    /* which input slots read a Q/DQ pair (index into acts) or a quantized
     * weight; -1 for neither */
    int act[3];
    bool weight[3];
    int axis[3];         /* the weight's per-channel axis, -1 per tensor */
} kf_quant_node;

typedef struct kf_quantizer kf_quantizer;

/* Chooses what to quantize in m: every Conv, MatMul and Gemm (and op types
 * of o->include) not excluded by op type or node name. Shapes of m are
 * inferred (types updated in place). m must outlive *q. An --exclude or
 * --include entry that names no node or op type of m is a warning
 * (kf_quant_warnings), not an error; an --include of an op type that cannot
 * be quantized is KF_ERR_INVALID_ARG naming it. Caller frees with
 * kf_quant_free. */
kf_status kf_quant_new(kf_model *m, const kf_quant_options *o, kf_quantizer **q);
void kf_quant_free(kf_quantizer *q);
/* Warnings collected so far, newline-separated ("" when none). */
const char *kf_quant_warnings(const kf_quantizer *q);
/* The quantized nodes and the observed values (valid while q lives). */
const kf_quant_node *kf_quant_nodes(const kf_quantizer *q, uint32_t *n);
const kf_quant_act *kf_quant_acts(const kf_quantizer *q, uint32_t *n);

/* Runs the float model on one calibration sample (the graph's real inputs
 * in order, as kf_eval_model takes them) and adds every observed value to
 * its statistics. outputs: NULL, or room for the graph's outputs, which
 * the caller then owns (kf_quant_report_add can reuse them instead of
 * running the float model again). Errors from the run name the node; a
 * wrong input count is KF_ERR_INVALID_ARG. */
kf_status kf_quant_observe(kf_quantizer *q, const kf_tensor *inputs, int ninputs, kf_tensor *outputs);
/* Chooses each value's clipping range, scale and zero point by the method.
 * A value no sample reached gets no Q/DQ (a warning). KF_ERR_INVALID_ARG
 * when no sample was observed. */
kf_status kf_quant_finish(kf_quantizer *q);

/* The quantized model: a copy of the float model with Q/DQ pairs and
 * quantized weights (opset raised to 13 for per-channel, 19 for fp8 when
 * older). Caller frees *out. */
kf_status kf_quant_apply(const kf_quantizer *q, kf_model **out);

/* Signal-to-quantization-noise of the quantized model against the float
 * one, summed over samples: 10 log10(sum ref^2 / sum (q - ref)^2). */
typedef struct kf_quant_sqnr {
    const char *name;     /* layer: the node label; output: the output's name */
    const char *op_type;  /* layers only */
    double signal, noise; /* sums of squares */
    double db;            /* +inf when noise is 0 (kf_quant_report_finish) */
} kf_quant_sqnr;

typedef struct kf_quant_report {
    kf_quant_sqnr *layers; /* one per kf_quant_node; sorted worst first by kf_quant_report_finish */
    uint32_t nlayers;
    kf_quant_sqnr *outputs; /* per float graph output (float outputs only; others keep db NaN) */
    uint32_t noutputs;
    kf_quant_sqnr total;   /* every float output together */
    uint32_t samples;
} kf_quant_report;

/* Runs the float model fm and the quantized model qm on one sample and
 * adds to r (zero-initialise r before the first call). layers: also each
 * quantized node's output (the float run's outputs of those nodes are
 * held for the sample's duration); otherwise only the graph outputs, and
 * float_outputs, when not NULL, are fm's outputs on this sample (from
 * kf_quant_observe), so fm need not run again. */
kf_status kf_quant_report_add(const kf_quantizer *q, const kf_model *fm, const kf_model *qm, const kf_tensor *inputs,
                              int ninputs, const kf_tensor *float_outputs, bool layers, kf_quant_report *r);
/* Computes the dB figures and sorts the layers worst first. */
void kf_quant_report_finish(kf_quant_report *r);
void kf_quant_report_release(kf_quant_report *r);

/* SQNR in dB of sums of squares (+inf for zero noise, NaN for no signal). */
double kf_quant_db(double signal, double noise);

#endif
