/*
 * kf_libanchor.h: anchors through vendor libraries (DESIGN.md "kernels/",
 * cuda backend). An anchor group of a fusion plan whose GEMM fits one
 * cuBLASLt matmul, or whose Conv fits one cuDNN forward convolution,
 * becomes a "library anchor": the call's parameters as the library reads
 * them (column-major, transposes, batch strides, alpha/beta; pads,
 * strides, dilations, groups; bias and activation in the library's own
 * epilogue), plus ONE generated kernel for the rest of the group's
 * epilogue (residual Add, LayerNorm rows, layout stores...) that reads the
 * library's output buffer.
 *
 * This half is target independent and runs everywhere: the descriptor,
 * the epilogue kernel (an ordinary codegen kernel, run on PoCL in tests)
 * and a host implementation of exactly the semantics handed to the
 * library (kf_la_gemm_host, kf_la_conv_host), so everything but the call
 * itself is executed and checked on a machine without a GPU. cuda_lib.c
 * makes the call.
 */
#ifndef KF_LIBANCHOR_H
#define KF_LIBANCHOR_H

#include "kf_exec.h"

/* Activation applied by the library after alpha*AB + beta*C + bias. */
typedef enum kf_la_act {
    KF_LA_ACT_NONE = 0,
    KF_LA_ACT_RELU = 1,
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): cuBLASLt's GELU is
     * this tanh form (PyTorch maps only gelu(approximate="tanh") onto
     * CUBLASLT_EPILOGUE_GELU), so only ONNX Gelu{approximate="tanh"} maps */
    KF_LA_ACT_GELU_TANH = 2
} kf_la_act;

/* One cuBLASLt matmul in the library's own column-major terms:
 *
 *   for b < batch:  D_b = act(alpha * op(A_b) * op(B_b) + beta * C_b + bias)
 *
 * D_b is m x n column-major, element (i, j) at d + b*stride_d + i + j*ldd;
 * op(A_b) is m x k: A_b stored k x m (ld lda) when trans_a, else m x k;
 * op(B_b) is k x n likewise; bias[i] is added to row i (length m, shared by
 * every batch). Strides are in elements; a stride 0 reads the same matrix
 * for every batch (a broadcast batch dim). The model's row-major
 * Y[M,N] = X[M,K] W[K,N] is the column-major Y^T = W^T X^T, so A is the
 * model's right operand and B its left one (m = N, n = M).
 *
 * dtype int8 is the integer GEMM (an int8 plan's MatMulInteger without
 * zero points, pass_qint.c): A and B int8, D int32, computed exactly in
 * int32 on tensor cores (IMMA), alpha 1, no C, bias or activation.
 * cuBLASLt takes int8 only as "TN" (trans_a set, trans_b not, leading
 * dims multiples of 4), so the constant weights the model holds as [K, N]
 * are stored transposed on the device: a_const_t (kf_la_const_layout).
 *
 * a_dtype/b_dtype set is the float8 GEMM (an fp8 plan's float8 product):
 * A the float8 weights, B the float8 activation, both "TN" as int8's,
 * alpha the product of their two dequantization scales, D and bias
 * float16/bfloat16 (or D float32 without a bias: a product scaled per
 * column after), computed in float32 on float8 tensor cores (sm_89+). */
typedef struct kf_la_gemm {
    int64_t m, n, k;
    bool trans_a, trans_b;
    int64_t lda, ldb, ldc, ldd;
    int64_t batch;
    int64_t stride_a, stride_b, stride_c, stride_d;
    float alpha, beta;      /* beta != 0 only with c */
    kf_dtype dtype;         /* A, B, C, D and bias: float32, float16 or bfloat16; compute float32.
                             * int8: A and B int8, D int32, compute int32 (above) */
    kf_dtype a_dtype, b_dtype; /* float8 GEMM (a float8 product, fusion/kf_cost.h): A's and B's
                             * float8 formats (E4M3FN/E5M2; dtype: D's and bias's, float16,
                             * bfloat16 or float32 without bias); 0: dtype */
    bool a_const_t;         /* A is a constant value whose device copy is the model's
                             * tensor transposed (kf_la_const_layout) */
    kf_precision precision; /* FP32 (0): strict; TF32 lets the library use tensor cores */
    kf_la_act act;
    kf_id a, b;             /* value ids of the buffers passed as A and B */
    kf_id c;                /* value read as C (0: none, beta 0) */
    kf_id bias;             /* value read as the bias vector (0: none) */
    kf_id d;                /* value the library writes */
} kf_la_gemm;

/* Spatial dims of a convolution the library takes (cuDNN's Nd API: 1-D is
 * passed as 2-D with a unit dim, 3-D as 3-D). */
#define KF_LA_MAX_SPATIAL 3

/* One cuDNN forward convolution, NCHW (row-major, dense), cross-correlation:
 *
 *   D[n, k, o...] = act(sum over c < c/groups, q... of
 *                       X[n, (k / (k_out/groups)) * (c/groups) + c, o*stride - pad + q*dilation]
 *                       * W[k, c, q...]  + Z[n, k, o...] + bias[k])
 *
 * X positions outside the input read 0 (symmetric zero padding). Z is a
 * residual of D's shape (ResNet's skip connection: cuDNN's fused op with
 * alpha2 1), taken only with a bias; without one the Z term is 0. */
typedef struct kf_la_conv {
    int nspatial;                      /* 1..KF_LA_MAX_SPATIAL */
    int64_t n, c, k, groups;           /* batch, input channels, output channels, groups */
    int64_t in[KF_LA_MAX_SPATIAL], kern[KF_LA_MAX_SPATIAL], out[KF_LA_MAX_SPATIAL];
    int64_t pad[KF_LA_MAX_SPATIAL], stride[KF_LA_MAX_SPATIAL], dilation[KF_LA_MAX_SPATIAL];
    kf_dtype dtype;                    /* X, W, bias, D: float32 or float16; compute float32 */
    kf_precision precision;            /* as kf_la_gemm's */
    kf_la_act act;                     /* NONE or RELU (cuDNN's fused op has no GELU) */
    kf_id x, w, bias, d;               /* value ids; bias 0: none */
    kf_id z;                           /* the residual added before act (0: none) */
} kf_la_conv;

/* An anchor group mapped onto the library. */
typedef struct kf_la_anchor {
    bool is_conv;            /* conv (cuDNN) instead of gemm (cuBLASLt) */
    kf_la_conv conv;
    kf_la_gemm gemm;
    bool has_epilogue;       /* false: the call writes the group's only output */
    kf_cg_kernel epilogue;   /* when has_epilogue: reads gemm.d (and the group's
                              * other inputs), writes the group's other outputs */
    uint32_t lib_nodes;      /* nodes the call replaces (anchor, absorbed
                              * transposes, bias Add, activation) */
} kf_la_anchor;

/* Maps anchor group gi of plan p (planned on m, static shapes) onto one
 * library GEMM plus at most one epilogue kernel. KF_OK: *out is filled
 * and owns the epilogue kernel (kf_la_anchor_release). KF_ERR_UNSUPPORTED:
 * declined, the reason (naming the node or value, like the planner's) is
 * written to why and nothing is owned; the caller keeps the generated
 * anchor kernel, which is always correct. KF_ERR_NOMEM. No kf_fail on a
 * decline: this is a question, asked for every anchor group. Deterministic:
 * the same group gives the same descriptor and epilogue text. */
kf_status kf_la_plan_group(const kf_model *m, const kf_plan *p, uint32_t gi, kf_la_anchor *out, char *why,
                           size_t whylen);
void kf_la_anchor_release(kf_la_anchor *a);

/* The device copy of constant A of g from the model's tensor w: w itself
 * (*out a copy), or with g->a_const_t its [K, N] matrix transposed to
 * [N, K]. KF_ERR_INVALID_ARG when w is not a matrix of g's shape. */
kf_status kf_la_const_layout(const kf_la_gemm *g, const kf_tensor *w, kf_tensor *out);

/* What cuBLASLt computes for g, on the host in float (16-bit storage
 * read and rounded like the library's fp32-compute mode): reads a, b, c
 * (NULL when g->c is 0), bias (NULL when g->bias is 0) as raw element
 * arrays of g->dtype and writes every element of D into d, which must
 * hold at least (batch-1)*stride_d + (n-1)*ldd + m elements of g->dtype.
 * The test of the mapping: this plus the epilogue kernel must equal the
 * reference evaluator's group. int8: exact int32 sums, into an int32 d;
 * a is the device copy (kf_la_const_layout). KF_ERR_INVALID_ARG when a
 * tensor is too small for the strides or of another dtype. */
kf_status kf_la_gemm_host(const kf_la_gemm *g, const kf_tensor *a, const kf_tensor *b, const kf_tensor *c,
                          const kf_tensor *bias, kf_tensor *d);

/* What conv computes, on the host in float, like kf_la_gemm_host: x, w,
 * z (NULL when c->z is 0), bias (NULL when c->bias is 0) raw arrays of
 * c->dtype, d and z of at least n*k*prod(out) elements. KF_ERR_INVALID_ARG
 * for a short buffer. */
kf_status kf_la_conv_host(const kf_la_conv *c, const kf_tensor *x, const kf_tensor *w, const kf_tensor *z,
                          const kf_tensor *bias, kf_tensor *d);

/* The buffers a call reads and writes, in the order of kf_dev.lib's bufs:
 * A, B, C, bias, D for a GEMM; X, W, Z, bias, D for a conv (0: none). */
void kf_la_anchor_values(const kf_la_anchor *a, kf_id v[5]);

/* A kf_dev lib that runs the host model instead of a library: downloads
 * the operands, computes D with kf_la_gemm_host / kf_la_conv_host and uploads it
 * (synchronously). For tests and bisecting on any device: kf_exec installs
 * it when KFUSE_LIBANCHOR_HOST=1 and the device has no library, so the
 * whole library-anchor path (steps, buffers, epilogue launches, CUDA-less
 * runs on OpenCL) runs where no GPU is. a NULL: nothing to prepare. */
kf_status kf_la_dev_host_lib(kf_dev *d, void *s, const kf_la_anchor *a, void *const bufs[5]);

/* Library enum values the math choice names (cudnn_ops.h/cudnn_cnn.h,
 * cublas_api.h, library_types.h; stable since cuDNN 8 / CUDA 11). */
enum {
    KF_CUDNN_DEFAULT_MATH = 0, KF_CUDNN_TENSOR_OP_MATH = 1, KF_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
    KF_CUDNN_FMA_MATH = 3,                                             /* cudnnMathType_t */
    KF_CUDNN_DATA_FLOAT = 0, KF_CUDNN_DATA_HALF = 2, KF_CUDNN_DATA_BFLOAT16 = 9, /* cudnnDataType_t */
    KF_CUBLAS_COMPUTE_32F = 68, KF_CUBLAS_COMPUTE_32F_FAST_TF32 = 77,  /* cublasComputeType_t */
    KF_CUBLAS_COMPUTE_32I = 72,
    KF_CUDA_R_32F = 0, KF_CUDA_R_16F = 2, KF_CUDA_R_16BF = 14,         /* cudaDataType */
    KF_CUDA_R_8I = 3, KF_CUDA_R_32I = 10, KF_CUDA_R_8F_E4M3 = 28, KF_CUDA_R_8F_E5M2 = 29
};

/* How a library call computes, from the plan's precision and the call's
 * tensor dtype: what cuda_lib.c hands the libraries. */
typedef struct kf_la_math {
    int cudnn_math;          /* cudnnSetConvolutionMathType */
    unsigned cudnn_algo_math;/* bit (1 << m) set: an algorithm of the heuristic's list whose
                              * perf.mathType is m may be chosen */
    int cudnn_data;          /* tensor/filter descriptors' cudnnDataType_t (compute is FLOAT) */
    int cublas_compute;      /* cublasLtMatmulDescCreate's compute type */
    int cublas_scale;        /* and its scale type (alpha, beta): R_32F, R_32I for int8 */
    int cuda_data;           /* cuBLASLt matrix layouts' cudaDataType: A and B */
    int cuda_data_d;         /* C and D (int8: R_32I) */
} kf_la_math;

/* The math of a call on dt (float32, float16 or bfloat16) at precision p.
 * A pure function, so the choice is tested without a GPU:
 *   FP32: cuDNN FMA math and only FMA algorithms (no TF32 anywhere),
 *         cuBLASLt COMPUTE_32F;
 *   TF32: tensor-op math (and algorithms), COMPUTE_32F_FAST_TF32;
 *   16-bit dt (FP16/BF16 plans, or a float16 model at any precision):
 *         tensor-op math, COMPUTE_32F, i.e. 16-bit operands with float32
 *         accumulation (their products are exact in float32).
 *   int8 dt: COMPUTE_32I with scale R_32I, A/B R_8I, C/D R_32I (exact).
 * Never ALLOW_CONVERSION: it would round float32 operands to float16. */
kf_la_math kf_la_math_for(kf_precision p, kf_dtype dt);

/* ---- cuda_lib.c: the library calls (dlopen; never linked) -------------- */

/* NULL when cuBLASLt (libcublasLt.so.13/.12/.11) loads, a CUDA driver and
 * device answer, and cublasLtCreate succeeds; else a static reason such as
 * "cuBLASLt: no CUDA device: ...". Thread-safe; decided once. */
const char *kf_cublaslt_unavailable(void);

/* Makes stream's library workspace now (a capture may follow), of bytes
 * bytes (0: 32 MiB, what cuBLAS recommends for Hopper); a stream that
 * has one keeps it. KF_OK also when none could be made: cuBLASLt then
 * runs without one (slower, correct), cuDNN with an algorithm that needs
 * none. The calls below use the stream's workspace, whatever its size. */
kf_status kf_culib_prepare(void *stream, size_t bytes);
/* Frees stream's workspace, if it has one; call with the stream idle,
 * before destroying it (a new stream may get the same handle). */
void kf_culib_release(void *stream);
/* Runs g on stream (a CUstream) with device pointers for the values g
 * names (c and bias NULL when g has none). Workspace comes from a small
 * per-stream pool kept by cuda_lib.c. KF_ERR_NO_DEVICE with
 * kf_cublaslt_unavailable's reason; KF_ERR_RUNTIME naming the cuBLASLt
 * call and status (no algorithm for the problem included). */
kf_status kf_cublaslt_gemm(void *stream, const kf_la_gemm *g, const void *a, const void *b, const void *c,
                           const void *bias, void *d);

/* NULL when cuDNN (libcudnn.so.9/.8) loads, a CUDA driver and device
 * answer, and cudnnCreate succeeds; else a static reason. */
const char *kf_cudnn_unavailable(void);
/* Runs c on stream with device pointers x, w, z and bias (NULL when
 * none), d.
 * Errors like kf_cublaslt_gemm's, naming the cuDNN call. */
kf_status kf_cudnn_conv(void *stream, const kf_la_conv *c, const void *x, const void *w, const void *z,
                       const void *bias, void *d);

#endif
