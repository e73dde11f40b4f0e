/*
 * kf_run.h: running a whole model on the opencl backend (`kfuse run
 * --backend opencl`): optimize, plan, then execute the plan group by group;
 * groups codegen/ supports run as generated OpenCL kernels, every other
 * group runs node by node on the reference evaluator. Also the tolerance
 * comparison `--check` uses (DESIGN.md numerics: fused vs unfused).
 */
#ifndef KF_RUN_H
#define KF_RUN_H

#include <stdio.h>

#include "kf_exec.h"

/* How the groups of one run were executed. */
typedef struct kf_run_summary {
    uint32_t groups_cl;  /* groups run as generated OpenCL kernels */
    uint32_t groups_ref; /* groups run node by node on the reference evaluator
                          * (plan-time constant groups included) */
    uint32_t groups_lib; /* of those on the device: library calls (the host model of
                          * the call on OpenCL, KFUSE_LIBANCHOR_HOST) */
} kf_run_summary;

/* Runs model m once on OpenCL with reference fallback, through a compiled
 * plan (kf_exec) made for this call: a copy of m is optimized and planned;
 * m itself is not changed.
 *   inputs[i]  tensors for m's real inputs (graph inputs without
 *              initializer) in file order AS LOADED, i.e. before the
 *              rewrite; matched to the optimized graph by name
 *   outputs    receives m->graph->noutputs tensors (caller releases each);
 *              the optimizer keeps graph outputs, in order
 *   trace      when not NULL, one line per group: where it ran and why
 *   sum        filled with the group counts (may be NULL)
 * Errors: KF_ERR_NO_DEVICE (OpenCL compiled out or no device; nothing is
 * run), KF_ERR_INVALID_ARG (input count), errors of the optimizer, the
 * planner, kernel compiles and reference nodes, naming the node. */
kf_status kf_run_opencl(kf_model *m, const kf_tensor *inputs, int ninputs, kf_tensor *outputs,
                        FILE *trace, kf_run_summary *sum);
/* The same on backend b at precision prec (KF_EXEC_CUDA: KF_ERR_NO_DEVICE
 * "no CUDA device: ..." without driver or device; KF_EXEC_REF: every
 * group on ref); groups_cl counts the groups run as generated kernels on b. */
kf_status kf_run_backend(kf_model *m, kf_exec_backend b, kf_precision prec, const kf_tensor *inputs, int ninputs,
                         kf_tensor *outputs, FILE *trace, kf_run_summary *sum);
/* kf_run_backend, and one line per group left on the reference evaluator
 * (kf_exec_options.host_steps) to host_steps when not NULL. */
kf_status kf_run_backend_steps(kf_model *m, kf_exec_backend b, kf_precision prec, const kf_tensor *inputs,
                               int ninputs, kf_tensor *outputs, FILE *trace, FILE *host_steps, kf_run_summary *sum);

/* --check tolerance per dtype: float32/float64 atol 1e-5 rtol 1e-4,
 * float16 atol 2.5e-3 rtol 1e-3, bfloat16 atol 2e-2 rtol 1e-2, integers and
 * bool exactly; NaN matches NaN, an infinity matches the same infinity.
 * Returns true when got matches want (dtype and shape too); else writes
 * the first differing element (linear index, both values) into why and
 * returns false. */
bool kf_run_close(const kf_tensor *got, const kf_tensor *want, char *why, size_t whylen);
/* The tolerance kf_run_close holds dtype dt to (0 and 0 for exact dtypes):
 * one statement of DESIGN.md's policy for the CLI and the tests. */
void kf_run_tolerance(kf_dtype dt, double *atol, double *rtol);

/* A plan compiled at precision p against the float32 reference: float
 * outputs are held to the looser of their dtype's tolerance and p's
 * (tf32 and fp16: float16's, bf16: bfloat16's); fp32 is kf_run_tolerance. */
void kf_run_tolerance_prec(kf_dtype dt, kf_precision p, double *atol, double *rtol);
/* kf_run_close at kf_run_tolerance_prec(., p). */
bool kf_run_close_prec(const kf_tensor *got, const kf_tensor *want, kf_precision p, char *why, size_t whylen);

/* The longest dot product whose float32 rounding the whole-model check
 * allows for: 4096 (K of a 3x3 conv over 512 channels is 4608, of a
 * transformer FFN 3072; sqrt(4096) = 64 units of rounding). */
#define KF_RUN_FP32_LONG_DOT 4096

/* Whole-model check of a plan at precision p (`kfuse run --check`). An
 * fp32 plan is held to kf_run_close plus, on an output L nodes deep,
 *
 *   sqrt(KF_RUN_FP32_LONG_DOT) * 2^-24 * sqrt(L) * max|want|
 *
 * the float32 rounding of long dot products stacked L deep (the reference
 * accumulates in double), relative to the output's scale: full-size
 * ResNet-50 on generated kernels differs from the reference by 4.3e-5 on an
 * output element of 0.047 (max |output| about 5), past 1e-5 + 1e-4 * 0.047
 * yet far under the 1.7e-4 this allows at L = 70; a wrong index or TF32
 * (0.5% of the scale) is still far outside it. A tf32/fp16/bf16 plan rounds every
 * stored value (every library operand, for tf32) to the low type, so its
 * error grows with the number of roundings stacked on an output and with
 * the magnitude of the values rounded, not with each element's own
 * magnitude (an element near 0 after a subtraction carries the error of
 * its operands). With L = depth, the longest chain of nodes to the output,
 * and (a, r) = kf_run_tolerance_prec:
 *
 *   |got - want| <= sqrt(L) * (a + r * max|want|) + sqrt(L) * r * |want|
 *
 * sqrt(L): independent roundings add up like a random walk (the
 * probabilistic rounding-error bound, Higham & Mary 2019), r * max|want|:
 * errors relative to the output's scale, as normwise test ratios are.
 * Bundled models pass at the element tolerance itself; this bound is for
 * deep models and cancellations (a decomposed LayerNorm's x - mean). */
bool kf_run_close_model(const kf_tensor *got, const kf_tensor *want, kf_precision p, uint32_t depth, char *why,
                        size_t whylen);
/* depth[o] for every graph output o of m: the longest chain of nodes from
 * a graph input or constant to it (at least 1), a node that rounds each of
 * its steps (KF_F_ROUNDS_STEPS) counted as KF_OP_STEP_ROUNDINGS (the fp32
 * bound grows with it too: a float32 kernel rounds at each of those steps
 * where the reference keeps double). KF_ERR_BAD_MODEL on a cycle. */
kf_status kf_run_output_depths(const kf_model *m, uint32_t *depth);

/* requant[o] for every graph output o of m: how many QuantizeLinear nodes
 * of computed values (not of a graph input or a constant, whose codes are
 * the same on every backend) lie upstream of it, on the heaviest path;
 * KF_RUN_REQUANT_SMALL_FLOAT (below) set when one upstream writes a float8
 * or float4 type. KF_ERR_BAD_MODEL on a cycle. */
kf_status kf_run_output_requants(const kf_model *m, uint32_t *requant);

/* The SQNR an output of a model that requantizes computed values must
 * keep against the reference when kf_run_close_model's elementwise bound
 * fails. A value within a rounding of a quantization boundary moves a
 * whole step on a last-bit difference, and the step cascades through the
 * following layers: on the 12-layer QDQ BERT-base the reference's own two
 * exact forms (the float QDQ graph and its integer-anchor rewrite) differ
 * by 34.9-36.6 dB, as do OpenCL and the reference on either; a wrong
 * scale or zero point costs far more. */
#define KF_RUN_REQUANT_MIN_DB 30.0
/* The same where a requantization upstream writes float8 (or float4):
 * one step of E4M3 is up to an eighth of the value, and a flip costs that
 * much more. Measured on BERT-base quantized by `kfuse quantize --type
 * fp8` (batch 1, 16 tokens, last_hidden_state / pooler_output): the fp16
 * plan on OpenCL against the reference on the same float8 QDQ graph
 * 25.2 / 22.9 dB, the fp8 plan 25.0 / 23.7 dB. A scale 10% off costs
 * 20 dB by itself. */
#define KF_RUN_REQUANT_SMALL_FLOAT_MIN_DB 20.0
/* Set in kf_run_output_requants' count when one of the requantizations
 * writes a small float. */
#define KF_RUN_REQUANT_SMALL_FLOAT (1u << 31)

/* 10 log10(sum want^2 / sum (got - want)^2) over the elements where both
 * are finite (+inf when they are equal); NAN when the shapes or dtypes
 * differ, an operand is not a float tensor (float8/6/4 included), or a non-finite element of one
 * is not the same in the other. */
double kf_run_sqnr_db(const kf_tensor *got, const kf_tensor *want);

/* kf_run_close_model, and when that fails on an output with requant > 0
 * (kf_run_output_requants) and float elements (float8 too): close when the SQNR against
 * want is at least KF_RUN_REQUANT_MIN_DB (KF_RUN_REQUANT_SMALL_FLOAT_MIN_DB
 * with KF_RUN_REQUANT_SMALL_FLOAT). *db: that SQNR (NAN when the
 * elementwise bound held, or when it was not computed); why as
 * kf_run_close_model's, followed on a pass by SQNR by the count of
 * elements past the elementwise bound and the SQNR. */
bool kf_run_close_requant(const kf_tensor *got, const kf_tensor *want, kf_precision p, uint32_t depth, uint32_t requant,
                          double *db, char *why, size_t whylen);

#endif
