/*
 * kf_precision.h: the reduced-precision pass (pass_precision.c). A
 * compiled plan at fp16 or bf16 (DESIGN.md "Precision") runs it on its own
 * model copy after optimization and before planning.
 */
#ifndef KF_PRECISION_H
#define KF_PRECISION_H

#include "kf_ir.h"

/* What kf_fuse_precision did. */
typedef struct kf_precision_stats {
    uint32_t nodes_low;         /* nodes that now compute on the low type */
    uint32_t nodes_kept;        /* nodes with a float32 result left in float32 */
    uint32_t casts;             /* Cast nodes added at the boundaries */
    uint32_t weights_converted; /* float32 constants converted (in place or copied) */
} kf_precision_stats;

/* Rewrites m so that its float32 values become `low` (KF_DT_FLOAT16 or
 * KF_DT_BFLOAT16) wherever an op can compute on it, with Casts at every
 * boundary, so that m computes the same function up to the low type's
 * rounding and its graph inputs and outputs keep their declared types.
 * Float32 constants are converted once (rounded to nearest even). Left in
 * float32: nodes kfuse does not know, nodes whose shape function refuses
 * the low type (the reference evaluator has no such kernel), nodes with
 * no float32 result (comparisons, Cast to an integer, ArgMax) whose float
 * operands are all float32 sources (inputs, constants: read exactly; with
 * an operand computed low they compare low, constants rounded alike),
 * and everything that computes a value read
 * as a shape or size (the parameters of shape-from-data ops: Reshape's
 * shape, Resize's scales, Range's bounds...). *st may be NULL.
 * KF_ERR_INVALID_ARG for another `low`; KF_ERR_NOMEM; KF_ERR_INTERNAL
 * when the rewritten graph does not infer (a bug of this pass). */
kf_status kf_fuse_precision(kf_model *m, kf_dtype low, kf_precision_stats *st);

/* What kf_fuse_int8 did. */
typedef struct kf_int8_stats {
    uint32_t anchors; /* Conv/MatMul/Gemm nodes now integer anchors */
    uint32_t activations_signed; /* uint8 QuantizeLinear outputs moved to int8 */
} kf_int8_stats;

/* Rewrites m for precision INT8 (pass_qint.c): every Conv, MatMul and Gemm
 * (not transposed, alpha = beta = 1) whose two operands are
 * DequantizeLinear of 8-bit values, with constant float32 scales per
 * tensor or (weights) per output channel, becomes ConvInteger or
 * MatMulInteger on the 8-bit values, a Cast to float32, a Mul by the
 * constant sx * sw per channel and the bias Add. The result is standard
 * ONNX and differs from m by float rounding (a quantised output may move
 * by one step). Exact rewrites before and within: uint8 activations
 * whose readers are all DequantizeLinears become int8 (values and zero
 * point shifted by 128), and a product with weights of zero point 0 takes
 * the activation's zero point as an int32 Add per column, so the integer
 * product has no zero points (the form cuBLASLt's int8 GEMM runs).
 * Unused DequantizeLinear nodes are removed. *st may be
 * NULL. KF_ERR_NOMEM; KF_ERR_INTERNAL when the rewritten graph does not
 * infer (a bug of this pass). */
kf_status kf_fuse_int8(kf_model *m, kf_int8_stats *st);

/* For precision FP8 (pass_qint.c): a product or convolution whose input
 * is a float8 DequantizeLinear other nodes read too gets its own copy of
 * it where that makes it a float8 anchor (kf_fp8_anchor); then every
 * float8 product whose weights
 * carry one float32 scale per output column (kf_fp8_product_form,
 * fusion/kf_cost.h) becomes the product of the float8 values with unit
 * scales, a Mul by the constant sx * sw per column, and Gemm's C added
 * after; the unit-scale product is then a kf_fp8_product. Standard ONNX,
 * differing from m by float rounding. *rewritten: how many. KF_ERR_NOMEM;
 * KF_ERR_INTERNAL when the result does not infer (a bug of this pass). */
kf_status kf_fuse_fp8(kf_model *m, uint32_t *rewritten);

#endif
