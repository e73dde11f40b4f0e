/*
 * cuda_lib.c: the vendor-library half of library anchors (kf_libanchor.h):
 * cuBLASLt loaded with dlopen (libcublasLt.so.13, .12, .11 in turn), never
 * linked, so kfuse starts on machines without it. The few entry points
 * and enum values are declared here with the values of cublasLt.h /
 * cublas_api.h / library_types.h (CUDA 13; stable since 11). Needs the
 * CUDA driver too (kf_cu_unavailable). No CI machine has a GPU: the call
 * sequence below is UNEXECUTED there; what it is handed (kf_la_gemm) is
 * checked on the CPU by tests/test_libanchor.c through kf_la_gemm_host.
 *
 * The call sequence (per call; descriptors are cheap host objects):
 *   cublasLtMatmulDescCreate(&op, compute, scale), compute from
 *     kf_la_math_for: COMPUTE_32F (strict fp32, and 16-bit operands),
 *     COMPUTE_32F_FAST_TF32 only when the plan's precision is tf32, scale
 *     CUDA_R_32F; int8 GEMMs COMPUTE_32I with scale CUDA_R_32I (int32
 *     alpha and beta), A/B CUDA_R_8I in the "TN" form, C/D CUDA_R_32I
 *   cublasLtMatmulDescSetAttribute: TRANSA, TRANSB, EPILOGUE
 *     (DEFAULT/RELU/GELU, |BIAS with BIAS_POINTER, BIAS_BATCH_STRIDE 0)
 *   cublasLtMatrixLayoutCreate for A (k x m when transposed), B, C, D;
 *     BATCH_COUNT and STRIDED_BATCH_OFFSET when batch > 1
 *   cublasLtMatmulPreferenceCreate + MAX_WORKSPACE_BYTES
 *   cublasLtMatmulAlgoGetHeuristic (1 result)
 *   cublasLtMatmul(handle, op, &alpha, A, Adesc, B, Bdesc, &beta, C|D, Cdesc,
 *                  D, Ddesc, &algo, workspace, size, stream)
 * cuDNN (convolution) is not mapped yet: Conv groups keep their generated
 * kernel.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kf_exec.h"
#include "kf_libanchor.h"

typedef int cublasStatus_t; /* 0: CUBLAS_STATUS_SUCCESS */
typedef void *cublasLtHandle_t, *cublasLtMatmulDesc_t, *cublasLtMatrixLayout_t, *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

enum {
    LT_OP_N = 0, LT_OP_T = 1,                      /* cublasOperation_t */
    LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8,
    LT_DESC_BIAS_BATCH_STRIDE = 10,
    LT_EPI_DEFAULT = 1, LT_EPI_RELU = 2, LT_EPI_BIAS = 4, LT_EPI_GELU = 32,
    LT_LAYOUT_BATCH_COUNT = 5, LT_LAYOUT_STRIDED_BATCH_OFFSET = 6,
    LT_PREF_MAX_WORKSPACE_BYTES = 1
};

/* Workspace per stream: 32 MiB is what cuBLAS recommends for Hopper
 * (smaller ones rule out split-K algorithms on big GEMMs). */
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)
/* Streams with their own workspace; one per run slot, and runs rarely
 * exceed a few threads. Past this a call gets no workspace (slower, correct). */
#define LT_MAX_STREAMS 64

static struct {
    pthread_once_t once;
    const char *why;
    char whybuf[256];
    void *lib;
    cublasLtHandle_t handle;
    cublasStatus_t (*Create)(cublasLtHandle_t *);
    cublasStatus_t (*DescCreate)(cublasLtMatmulDesc_t *, int, int);
    cublasStatus_t (*DescDestroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*DescSet)(cublasLtMatmulDesc_t, int, const void *, size_t);
    cublasStatus_t (*LayoutCreate)(cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t);
    cublasStatus_t (*LayoutDestroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*LayoutSet)(cublasLtMatrixLayout_t, int, const void *, size_t);
    cublasStatus_t (*PrefCreate)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*PrefDestroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*PrefSet)(cublasLtMatmulPreference_t, int, const void *, size_t);
    cublasStatus_t (*Heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                             const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                             void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, void *);
} lt = {.once = PTHREAD_ONCE_INIT};

/* Workspaces, one per stream, shared by cuBLASLt and cuDNN calls (a
 * stream runs one call at a time). The CUDA runtime's allocator is not
 * ours: they come from the driver through cuMemAlloc, looked up in the
 * driver kf_cu_unavailable already loaded. A stream's workspace is freed
 * when the stream is (kf_culib_release), so at most LT_MAX_STREAMS live
 * streams hold one at a time. */
static struct {
    pthread_mutex_t mu;
    int (*MemAlloc)(unsigned long long *, size_t);
    int (*MemFree)(unsigned long long);
    bool looked;
    void *stream[LT_MAX_STREAMS];
    unsigned long long ptr[LT_MAX_STREAMS];
    size_t bytes[LT_MAX_STREAMS];
    int n;
} ws = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void load_lt(void) {
    const char *drv = kf_cu_unavailable();
    if (drv) {
        snprintf(lt.whybuf, sizeof lt.whybuf, "cuBLASLt: no CUDA device: %s", drv);
        lt.why = lt.whybuf;
        return;
    }
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lt.lib; i++) lt.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lt.lib) {
        const char *e = dlerror();
        snprintf(lt.whybuf, sizeof lt.whybuf, "cuBLASLt could not be loaded (libcublasLt.so.13/.12/.11: %s)", e ? e : "?");
        lt.why = lt.whybuf;
        return;
    }
    const kf_dl_sym syms[] = {
#define SYM(field, name) {(void **)&lt.field, name}
        SYM(Create, "cublasLtCreate"), SYM(DescCreate, "cublasLtMatmulDescCreate"),
        SYM(DescDestroy, "cublasLtMatmulDescDestroy"), SYM(DescSet, "cublasLtMatmulDescSetAttribute"),
        SYM(LayoutCreate, "cublasLtMatrixLayoutCreate"), SYM(LayoutDestroy, "cublasLtMatrixLayoutDestroy"),
        SYM(LayoutSet, "cublasLtMatrixLayoutSetAttribute"), SYM(PrefCreate, "cublasLtMatmulPreferenceCreate"),
        SYM(PrefDestroy, "cublasLtMatmulPreferenceDestroy"), SYM(PrefSet, "cublasLtMatmulPreferenceSetAttribute"),
        SYM(Heuristic, "cublasLtMatmulAlgoGetHeuristic"), SYM(Matmul, "cublasLtMatmul"),
#undef SYM
    };
    const char *missing = kf_dl_resolve(lt.lib, syms, sizeof syms / sizeof syms[0]);
    if (missing) {
        snprintf(lt.whybuf, sizeof lt.whybuf, "cuBLASLt lacks %s", missing);
        lt.why = lt.whybuf;
        return;
    }
    cublasStatus_t r = lt.Create(&lt.handle);
    if (r) {
        snprintf(lt.whybuf, sizeof lt.whybuf, "cublasLtCreate failed (status %d)", r);
        lt.why = lt.whybuf;
    }
}

const char *kf_cublaslt_unavailable(void) {
    pthread_once(&lt.once, load_lt);
    return lt.why;
}

/* The workspace of stream s, or 0; *bytes its size. Allocated at the
 * stream's first call, of want bytes (0: LT_WORKSPACE_BYTES); a later
 * want does not resize it. */
static unsigned long long workspace(void *s, size_t want, size_t *bytes) {
    *bytes = 0;
    unsigned long long p = 0;
    pthread_mutex_lock(&ws.mu);
    if (!ws.looked) {
        ws.looked = true;
        void *drv = kf_cu_unavailable() ? NULL : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        void *f = drv ? dlsym(drv, "cuMemAlloc_v2") : NULL;
        void *g = drv ? dlsym(drv, "cuMemFree_v2") : NULL;
        if (f && g) { /* both or neither: nothing is allocated that cannot be freed */
            memcpy(&ws.MemAlloc, &f, sizeof f);
            memcpy(&ws.MemFree, &g, sizeof g);
        }
    }
    for (int i = 0; i < ws.n && !p; i++)
        if (ws.stream[i] == s) p = ws.ptr[i], *bytes = ws.bytes[i];
    if (!want) want = LT_WORKSPACE_BYTES;
    if (!p && ws.MemAlloc && ws.n < LT_MAX_STREAMS && ws.MemAlloc(&p, want) == 0) {
        ws.stream[ws.n] = s;
        ws.bytes[ws.n] = *bytes = want;
        ws.ptr[ws.n++] = p;
    }
    pthread_mutex_unlock(&ws.mu);
    return p;
}

kf_status kf_culib_prepare(void *stream, size_t bytes) {
    size_t got;
    (void)workspace(stream, bytes, &got);
    return KF_OK;
}

void kf_culib_release(void *stream) {
    pthread_mutex_lock(&ws.mu);
    for (int i = 0; i < ws.n; i++)
        if (ws.stream[i] == stream) {
            ws.MemFree(ws.ptr[i]);
            ws.n--;
            ws.stream[i] = ws.stream[ws.n];
            ws.ptr[i] = ws.ptr[ws.n];
            ws.bytes[i] = ws.bytes[ws.n];
            break;
        }
    pthread_mutex_unlock(&ws.mu);
}

static kf_status lt_err(const char *what, cublasStatus_t r) {
    return kf_fail(KF_ERR_RUNTIME, "cuBLASLt %s failed (status %d)", what, r);
}

static cublasStatus_t layout(cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld,
                             int64_t batch, int64_t stride) {
    cublasStatus_t r = lt.LayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld);
    if (!r && batch > 1) {
        int32_t b = (int32_t)batch;
        r = lt.LayoutSet(*l, LT_LAYOUT_BATCH_COUNT, &b, sizeof b);
        if (!r) r = lt.LayoutSet(*l, LT_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    return r;
}

kf_status kf_cublaslt_gemm(void *stream, const kf_la_gemm *g, const void *a, const void *b, const void *c,
                           const void *bias, void *d) {
    const char *why = kf_cublaslt_unavailable();
    if (why) return kf_fail(KF_ERR_NO_DEVICE, "%s", why);
    if (g->batch > INT32_MAX) return kf_fail(KF_ERR_UNSUPPORTED, "cuBLASLt: batch count %lld", (long long)g->batch);
    kf_la_math mt = kf_la_math_for(g->precision, g->dtype);
    int type = mt.cuda_data, dtype = mt.cuda_data_d;
    /* a float8 GEMM: float8 A and B, D (and bias) as dtype says; compute
     * 32F, alpha the scales; no fast accumulation (the default: the sums
     * are promoted to float32 as they go) */
    int type_a = g->a_dtype == KF_DT_FLOAT8E4M3FN ? KF_CUDA_R_8F_E4M3 : g->a_dtype == KF_DT_FLOAT8E5M2 ? KF_CUDA_R_8F_E5M2 : type;
    int type_b = g->b_dtype == KF_DT_FLOAT8E4M3FN ? KF_CUDA_R_8F_E4M3 : g->b_dtype == KF_DT_FLOAT8E5M2 ? KF_CUDA_R_8F_E5M2 : type;
    bool ints = mt.cublas_scale == KF_CUDA_R_32I; /* alpha and beta are int32 then */
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const char *what = "cublasLtMatmulDescCreate";
    cublasStatus_t r = lt.DescCreate(&op, mt.cublas_compute, mt.cublas_scale);
    int32_t ta = g->trans_a ? LT_OP_T : LT_OP_N, tb = g->trans_b ? LT_OP_T : LT_OP_N;
    uint32_t epi = g->act == KF_LA_ACT_RELU ? LT_EPI_RELU : g->act == KF_LA_ACT_GELU_TANH ? LT_EPI_GELU : 0;
    if (g->bias) epi |= LT_EPI_BIAS;
    if (!epi) epi = LT_EPI_DEFAULT;
    if (!r && (what = "set TRANSA", !(r = lt.DescSet(op, LT_DESC_TRANSA, &ta, sizeof ta))) &&
        (what = "set TRANSB", !(r = lt.DescSet(op, LT_DESC_TRANSB, &tb, sizeof tb))) &&
        (what = "set EPILOGUE", !(r = lt.DescSet(op, LT_DESC_EPILOGUE, &epi, sizeof epi))) && g->bias) {
        int64_t zero = 0; /* one bias vector for every batch */
        if ((what = "set BIAS_POINTER", !(r = lt.DescSet(op, LT_DESC_BIAS_POINTER, &bias, sizeof bias))))
            what = "set BIAS_BATCH_STRIDE", r = lt.DescSet(op, LT_DESC_BIAS_BATCH_STRIDE, &zero, sizeof zero);
    }
    if (!r) {
        what = "cublasLtMatrixLayoutCreate";
        r = layout(&la, type_a, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, g->batch, g->stride_a);
        if (!r) r = layout(&lb, type_b, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, g->batch, g->stride_b);
        if (!r) r = layout(&ld, dtype, g->m, g->n, g->ldd, g->batch, g->stride_d);
        if (!r) r = g->c ? layout(&lc, dtype, g->m, g->n, g->ldc, g->batch, g->stride_c) : 0;
    }
    size_t wsb = 0;
    unsigned long long ws = r ? 0 : workspace(stream, 0, &wsb);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (!r && (what = "cublasLtMatmulPreferenceCreate", !(r = lt.PrefCreate(&pref))) &&
        (what = "set MAX_WORKSPACE_BYTES", !(r = lt.PrefSet(pref, LT_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb))))
        what = "cublasLtMatmulAlgoGetHeuristic",
        r = lt.Heuristic(lt.handle, op, la, lb, lc ? lc : ld, ld, pref, 1, &res, &found);
    kf_status st = KF_OK;
    if (r) st = lt_err(what, r);
    else if (found < 1)
        st = kf_fail(KF_ERR_RUNTIME, "cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM (batch %lld)", (long long)g->m,
                     (long long)g->n, (long long)g->k, (long long)g->batch);
    else {
        float alpha = g->alpha, beta = g->c ? g->beta : 0.0f;
        int32_t ialpha = (int32_t)g->alpha, ibeta = g->c ? (int32_t)g->beta : 0;
        r = lt.Matmul(lt.handle, op, ints ? (const void *)&ialpha : &alpha, a, la, b, lb,
                      ints ? (const void *)&ibeta : &beta, g->c ? c : d, lc ? lc : ld, d, ld, &res.algo,
                      (void *)(uintptr_t)ws, wsb, stream);
        if (r) st = lt_err("cublasLtMatmul", r);
    }
    if (pref) lt.PrefDestroy(pref);
    if (lc) lt.LayoutDestroy(lc);
    if (ld) lt.LayoutDestroy(ld);
    if (lb) lt.LayoutDestroy(lb);
    if (la) lt.LayoutDestroy(la);
    if (op) lt.DescDestroy(op);
    return st;
}

/* ---- cuDNN: convolutions --------------------------------------------------
 * The legacy descriptor API, which cuDNN 9 still ships (deprecated, in
 * libcudnn_cnn/libcudnn_ops behind libcudnn.so.9) and cuDNN 8 has; the
 * backend graph API would fuse longer epilogues (the fused op takes bias,
 * one residual and ReLU).
 * Sequence (UNEXECUTED in CI: no GPU):
 *   cudnnSetStream; tensor descriptors for X, bias ([1,K,1,1]) and Y via
 *   cudnnSetTensorNdDescriptor (NCHW strides), cudnnSetFilterNdDescriptor
 *   (NCHW), cudnnSetConvolutionNdDescriptor (symmetric pads, strides,
 *   dilations, CROSS_CORRELATION, compute FLOAT) + GroupCount + MathType
 *   from kf_la_math_for (FMA for strict fp32: cuDNN would otherwise run
 *   float32 convolutions on TF32 tensor cores, about 1e-3 relative error);
 *   cudnnGetConvolutionForwardAlgorithm_v7, first algorithm whose
 *   workspace fits and whose perf.mathType the precision allows; then
 *   - bias + ReLU: cudnnConvolutionBiasActivationForward (alpha2 0, z = y);
 *     the fused op needs a bias, so libanchor.c takes a ReLU only after one;
 *   - a residual Add after the bias: the same with alpha2 1 and z the
 *     residual (y's descriptor: the same shape and dtype), ReLU or not;
 *   - bias, no activation: the same with IDENTITY, which cuDNN takes only
 *     with IMPLICIT_PRECOMP_GEMM;
 *   - neither: cudnnConvolutionForward. */

typedef int cudnnStatus_t;
typedef void *cudnnHandle_t, *cudnnTensorDescriptor_t, *cudnnFilterDescriptor_t, *cudnnConvolutionDescriptor_t,
    *cudnnActivationDescriptor_t;
typedef struct {
    int algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    int determinism;
    int mathType;
    int reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;

enum {
    DNN_DATA_FLOAT = KF_CUDNN_DATA_FLOAT,
    DNN_TENSOR_NCHW = 0,
    DNN_CROSS_CORRELATION = 1,
    DNN_ACTIVATION_RELU = 1, DNN_ACTIVATION_IDENTITY = 5,
    DNN_NOT_PROPAGATE_NAN = 0,
    DNN_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1
};
/* Algorithms asked of the heuristic: cuDNN 9 lists 8 forward algorithms. */
#define DNN_ALGOS 8

static struct {
    pthread_once_t once;
    const char *why;
    char whybuf[256];
    void *lib;
    cudnnHandle_t handle;
    pthread_mutex_t mu; /* the handle is bound to a stream per call */
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, void *);
    cudnnStatus_t (*CreateTensor)(cudnnTensorDescriptor_t *);
    cudnnStatus_t (*DestroyTensor)(cudnnTensorDescriptor_t);
    cudnnStatus_t (*SetTensorNd)(cudnnTensorDescriptor_t, int, int, const int *, const int *);
    cudnnStatus_t (*CreateFilter)(cudnnFilterDescriptor_t *);
    cudnnStatus_t (*DestroyFilter)(cudnnFilterDescriptor_t);
    cudnnStatus_t (*SetFilterNd)(cudnnFilterDescriptor_t, int, int, int, const int *);
    cudnnStatus_t (*CreateConv)(cudnnConvolutionDescriptor_t *);
    cudnnStatus_t (*DestroyConv)(cudnnConvolutionDescriptor_t);
    cudnnStatus_t (*SetConvNd)(cudnnConvolutionDescriptor_t, int, const int *, const int *, const int *, int, int);
    cudnnStatus_t (*SetGroups)(cudnnConvolutionDescriptor_t, int);
    cudnnStatus_t (*SetMath)(cudnnConvolutionDescriptor_t, int);
    cudnnStatus_t (*CreateAct)(cudnnActivationDescriptor_t *);
    cudnnStatus_t (*DestroyAct)(cudnnActivationDescriptor_t);
    cudnnStatus_t (*SetAct)(cudnnActivationDescriptor_t, int, int, double);
    cudnnStatus_t (*GetAlgo)(cudnnHandle_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t,
                             cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t, int, int *,
                             cudnnConvolutionFwdAlgoPerf_t *);
    cudnnStatus_t (*Forward)(cudnnHandle_t, const void *, cudnnTensorDescriptor_t, const void *, cudnnFilterDescriptor_t,
                             const void *, cudnnConvolutionDescriptor_t, int, void *, size_t, const void *,
                             cudnnTensorDescriptor_t, void *);
    cudnnStatus_t (*BiasAct)(cudnnHandle_t, const void *, cudnnTensorDescriptor_t, const void *, cudnnFilterDescriptor_t,
                             const void *, cudnnConvolutionDescriptor_t, int, void *, size_t, const void *,
                             cudnnTensorDescriptor_t, const void *, cudnnTensorDescriptor_t, const void *,
                             cudnnActivationDescriptor_t, cudnnTensorDescriptor_t, void *);
} dnn = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static void load_dnn(void) {
    const char *drv = kf_cu_unavailable();
    if (drv) {
        snprintf(dnn.whybuf, sizeof dnn.whybuf, "cuDNN: no CUDA device: %s", drv);
        dnn.why = dnn.whybuf;
        return;
    }
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so.8"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !dnn.lib; i++) dnn.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!dnn.lib) {
        const char *e = dlerror();
        snprintf(dnn.whybuf, sizeof dnn.whybuf, "cuDNN could not be loaded (libcudnn.so.9/.8: %s)", e ? e : "?");
        dnn.why = dnn.whybuf;
        return;
    }
    const kf_dl_sym syms[] = {
#define SYM(field, name) {(void **)&dnn.field, name}
        SYM(Create, "cudnnCreate"), SYM(SetStream, "cudnnSetStream"),
        SYM(CreateTensor, "cudnnCreateTensorDescriptor"), SYM(DestroyTensor, "cudnnDestroyTensorDescriptor"),
        SYM(SetTensorNd, "cudnnSetTensorNdDescriptor"), SYM(CreateFilter, "cudnnCreateFilterDescriptor"),
        SYM(DestroyFilter, "cudnnDestroyFilterDescriptor"), SYM(SetFilterNd, "cudnnSetFilterNdDescriptor"),
        SYM(CreateConv, "cudnnCreateConvolutionDescriptor"), SYM(DestroyConv, "cudnnDestroyConvolutionDescriptor"),
        SYM(SetConvNd, "cudnnSetConvolutionNdDescriptor"), SYM(SetGroups, "cudnnSetConvolutionGroupCount"),
        SYM(SetMath, "cudnnSetConvolutionMathType"), SYM(CreateAct, "cudnnCreateActivationDescriptor"),
        SYM(DestroyAct, "cudnnDestroyActivationDescriptor"), SYM(SetAct, "cudnnSetActivationDescriptor"),
        SYM(GetAlgo, "cudnnGetConvolutionForwardAlgorithm_v7"), SYM(Forward, "cudnnConvolutionForward"),
        SYM(BiasAct, "cudnnConvolutionBiasActivationForward"),
#undef SYM
    };
    const char *missing = kf_dl_resolve(dnn.lib, syms, sizeof syms / sizeof syms[0]);
    if (missing) {
        snprintf(dnn.whybuf, sizeof dnn.whybuf, "cuDNN lacks %s", missing);
        dnn.why = dnn.whybuf;
        return;
    }
    cudnnStatus_t r = dnn.Create(&dnn.handle);
    if (r) {
        snprintf(dnn.whybuf, sizeof dnn.whybuf, "cudnnCreate failed (status %d)", r);
        dnn.why = dnn.whybuf;
    }
}

const char *kf_cudnn_unavailable(void) {
    pthread_once(&dnn.once, load_dnn);
    return dnn.why;
}

/* A dense NCHW tensor descriptor of dims[0..nd) (nd >= 4). */
static cudnnStatus_t tensor_nd(cudnnTensorDescriptor_t *t, int type, int nd, const int *dims) {
    int strides[2 + KF_LA_MAX_SPATIAL + 1];
    strides[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) strides[i] = strides[i + 1] * dims[i + 1];
    cudnnStatus_t r = dnn.CreateTensor(t);
    return r ? r : dnn.SetTensorNd(*t, type, nd, dims, strides);
}

kf_status kf_cudnn_conv(void *stream, const kf_la_conv *c, const void *x, const void *w, const void *z,
                       const void *bias, void *d) {
    const char *why = kf_cudnn_unavailable();
    if (why) return kf_fail(KF_ERR_NO_DEVICE, "%s", why);
    kf_la_math mt = kf_la_math_for(c->precision, c->dtype);
    int type = mt.cudnn_data;
    /* 1-D goes in as 2-D (a unit height): cuDNN's Nd calls need 4 dims */
    int ns = c->nspatial < 2 ? 2 : c->nspatial, nd = ns + 2, off = ns - c->nspatial;
    int xd[2 + KF_LA_MAX_SPATIAL + 1], wd[2 + KF_LA_MAX_SPATIAL + 1], yd[2 + KF_LA_MAX_SPATIAL + 1],
        bd[2 + KF_LA_MAX_SPATIAL + 1];
    int pad[KF_LA_MAX_SPATIAL + 1], str[KF_LA_MAX_SPATIAL + 1], dil[KF_LA_MAX_SPATIAL + 1];
    xd[0] = (int)c->n, xd[1] = (int)c->c, wd[0] = (int)c->k, wd[1] = (int)(c->c / c->groups);
    yd[0] = (int)c->n, yd[1] = (int)c->k, bd[0] = 1, bd[1] = (int)c->k;
    for (int i = 0; i < ns; i++) {
        int j = i - off; /* the padded unit dim first */
        xd[2 + i] = j < 0 ? 1 : (int)c->in[j];
        wd[2 + i] = j < 0 ? 1 : (int)c->kern[j];
        yd[2 + i] = j < 0 ? 1 : (int)c->out[j];
        bd[2 + i] = 1;
        pad[i] = j < 0 ? 0 : (int)c->pad[j];
        str[i] = j < 0 ? 1 : (int)c->stride[j];
        dil[i] = j < 0 ? 1 : (int)c->dilation[j];
    }
    cudnnTensorDescriptor_t tx = NULL, ty = NULL, tb = NULL;
    cudnnFilterDescriptor_t fw = NULL;
    cudnnConvolutionDescriptor_t cv = NULL;
    cudnnActivationDescriptor_t ac = NULL;
    const char *what = "cudnnSetStream";
    pthread_mutex_lock(&dnn.mu);
    cudnnStatus_t r = dnn.SetStream(dnn.handle, stream);
    if (!r) what = "tensor descriptors", r = tensor_nd(&tx, type, nd, xd);
    if (!r) r = tensor_nd(&ty, type, nd, yd);
    if (!r && (c->bias || c->act != KF_LA_ACT_NONE)) r = tensor_nd(&tb, type, nd, bd);
    if (!r && (what = "filter descriptor", !(r = dnn.CreateFilter(&fw)))) r = dnn.SetFilterNd(fw, type, DNN_TENSOR_NCHW, nd, wd);
    if (!r && (what = "convolution descriptor", !(r = dnn.CreateConv(&cv)))) {
        r = dnn.SetConvNd(cv, ns, pad, str, dil, DNN_CROSS_CORRELATION, DNN_DATA_FLOAT);
        if (!r) r = dnn.SetGroups(cv, (int)c->groups);
        if (!r) r = dnn.SetMath(cv, mt.cudnn_math);
    }
    bool fused = c->bias || c->act != KF_LA_ACT_NONE;
    if (!r && fused && (what = "activation descriptor", !(r = dnn.CreateAct(&ac))))
        r = dnn.SetAct(ac, c->act == KF_LA_ACT_RELU ? DNN_ACTIVATION_RELU : DNN_ACTIVATION_IDENTITY, DNN_NOT_PROPAGATE_NAN, 0.0);
    size_t wsb = 0;
    unsigned long long wsp = r ? 0 : workspace(stream, 0, &wsb);
    int algo = DNN_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    if (!r && !(fused && c->act == KF_LA_ACT_NONE)) {
        cudnnConvolutionFwdAlgoPerf_t perf[DNN_ALGOS];
        int got = 0;
        what = "cudnnGetConvolutionForwardAlgorithm_v7";
        r = dnn.GetAlgo(dnn.handle, tx, fw, cv, ty, DNN_ALGOS, &got, perf);
        int pick = -1;
        for (int i = 0; !r && i < got && pick < 0; i++)
            if (perf[i].status == 0 && perf[i].memory <= wsb && perf[i].mathType >= 0 && perf[i].mathType < 32 &&
                (mt.cudnn_algo_math >> perf[i].mathType & 1u))
                pick = i;
        if (!r && pick >= 0) algo = perf[pick].algo;
    }
    kf_status st = KF_OK;
    if (r) st = kf_fail(KF_ERR_RUNTIME, "cuDNN %s failed (status %d)", what, r);
    else if (fused && !bias) {
        /* libanchor.c takes a ReLU only after a bias */
        st = kf_fail(KF_ERR_INTERNAL, "cuDNN: a fused conv without a bias");
    } else {
        float one = 1.0f, zero = 0.0f;
        /* y = act(conv + alpha2 z + bias): z the residual (of y's shape),
         * or y itself scaled by 0 */
        r = fused ? dnn.BiasAct(dnn.handle, &one, tx, x, fw, w, cv, algo, (void *)(uintptr_t)wsp, wsb,
                                c->z ? &one : &zero, ty, c->z ? z : d, tb, bias, ac, ty, d)
                  : dnn.Forward(dnn.handle, &one, tx, x, fw, w, cv, algo, (void *)(uintptr_t)wsp, wsb, &zero, ty, d);
        if (r) st = kf_fail(KF_ERR_RUNTIME, "cuDNN %s failed (status %d)",
                            fused ? "cudnnConvolutionBiasActivationForward" : "cudnnConvolutionForward", r);
    }
    pthread_mutex_unlock(&dnn.mu);
    if (ac) dnn.DestroyAct(ac);
    if (cv) dnn.DestroyConv(cv);
    if (fw) dnn.DestroyFilter(fw);
    if (tb) dnn.DestroyTensor(tb);
    if (ty) dnn.DestroyTensor(ty);
    if (tx) dnn.DestroyTensor(tx);
    return st;
}
