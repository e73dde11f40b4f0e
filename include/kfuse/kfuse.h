/*
 * kfuse public C API.
 *
 * Conventions: every function returns kf_status (KF_OK == 0) unless noted;
 * on failure a human-readable message naming the offending node, tensor or
 * file is available from kf_last_error() on the same thread. Handles are
 * opaque; each function says who owns memory afterwards. Nothing here
 * aborts or exits on bad input.
 */
#ifndef KFUSE_H
#define KFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KF_BUILDING_LIBRARY) && defined(__GNUC__)
#define KF_API __attribute__((visibility("default")))
#else
#define KF_API
#endif

#define KFUSE_VERSION_MAJOR 0
#define KFUSE_VERSION_MINOR 1
#define KFUSE_VERSION_PATCH 0

/* Status codes. Numbers never shift. */
typedef enum kf_status {
    KF_OK = 0,
    KF_ERR_INVALID_ARG = 1, /* caller passed something impossible */
    KF_ERR_BAD_MODEL = 2,   /* the ONNX file is malformed or inconsistent */
    KF_ERR_UNSUPPORTED = 3, /* valid ONNX that kfuse does not handle */
    KF_ERR_SHAPE = 4,       /* shapes or dtypes disagree */
    KF_ERR_NOMEM = 5,       /* allocation failed */
    KF_ERR_IO = 6,          /* a file could not be read or written */
    KF_ERR_RUNTIME = 7,     /* data-dependent failure while running (index out of range) */
    KF_ERR_NO_DEVICE = 8,   /* the requested backend has no usable device */
    KF_ERR_COMPILE = 9,     /* a kernel failed to compile */
    KF_ERR_INTERNAL = 10    /* a kfuse bug that was survivable */
} kf_status;

/* Short name of a status ("bad model"). Static storage. */
KF_API const char *kf_status_name(kf_status s);
/* Last error message of this thread; never NULL; valid until the next kfuse
 * call on the same thread. */
KF_API const char *kf_last_error(void);
/* Library version string ("0.1.0"). Static storage. */
KF_API const char *kf_version(void);

/* Hook called on an internal assertion failure (a kfuse bug). The default
 * prints file:line and aborts; a host may install its own. */
typedef void (*kf_assert_hook)(const char *file, int line, const char *msg);
KF_API void kf_set_assert_hook(kf_assert_hook hook);

/* ---- models ---------------------------------------------------------- */

typedef struct kf_model kf_model;

/* Loads an ONNX model file. External data is resolved relative to the
 * file's folder and must stay inside it. On success *out is owned by the
 * caller (kf_model_free). */
KF_API kf_status kf_model_load(const char *path, kf_model **out);
/* Loads from memory; external data, if any, is resolved against base_dir
 * (NULL: external data is an error). The buffer is not retained. */
KF_API kf_status kf_model_load_memory(const void *data, size_t len, const char *base_dir,
                                      kf_model **out);
/* Writes the model as standard ONNX. */
KF_API kf_status kf_model_save(const kf_model *m, const char *path);
/* Serialises into a malloc'ed buffer the caller frees with free(). */
KF_API kf_status kf_model_save_memory(const kf_model *m, void **data, size_t *len);
KF_API void kf_model_free(kf_model *m);

/* ---- running on the reference evaluator ------------------------------ */

/* A host tensor view: dtype numbers are ONNX TensorProto.DataType. */
typedef struct kf_host_tensor {
    int dtype;
    int rank;
    const int64_t *dims;
    const void *data; /* row-major */
} kf_host_tensor;

/* ---- compiling and running --------------------------------------------
 * Typical use: kf_model_load -> kf_compile -> kf_run (many times, from any
 * number of threads) -> kf_compiled_free. Kernels are compiled through the
 * kernel cache ($KFUSE_CACHE_DIR, else $XDG_CACHE_HOME/kfuse, else
 * ~/.cache/kfuse), so a second process starts warm. */

typedef enum kf_backend {
    KF_BACKEND_BEST = 0,   /* cuda when a CUDA device answers, else opencl when one does, else ref */
    KF_BACKEND_REF = 1,    /* the reference evaluator (CPU, plain C) */
    KF_BACKEND_OPENCL = 2, /* generated kernels on the first OpenCL device */
    KF_BACKEND_CUDA = 3    /* generated kernels via NVRTC on CUDA device 0 */
} kf_backend;

/* "best", "ref", "opencl", "cuda"; "?" for other numbers. Static storage. */
KF_API const char *kf_backend_name(kf_backend b);

/* The arithmetic a compiled model may use. Numbers never shift.
 *   FP32  strict float32 everywhere (vendor GEMMs and convolutions too:
 *         never TF32 unasked). The default.
 *   TF32  float32 tensors; cuBLASLt/cuDNN calls may round operands to
 *         TF32 on tensor cores. Generated kernels are as FP32.
 *   FP16, BF16  weights converted once at compile time, activations in
 *         float16/bfloat16, accumulation in float32 (GEMMs, reductions,
 *         Softmax, norms). Inputs and outputs keep the model's declared
 *         types: kf_run takes and returns float32 where the model says so.
 *   INT8  for models that carry QDQ (QuantizeLinear/DequantizeLinear):
 *         a Conv, MatMul or Gemm whose operands are both dequantised
 *         8-bit values runs on those values (int32 sums) and is scaled
 *         back to float32 once; the QuantizeLinear after it is its
 *         epilogue. Everything else as FP32.
 *   INT8_FP16  INT8's integer anchors, and FP16 for everything else
 *         (attention, norms, activations, the float GEMMs); the sums of
 *         an integer product are scaled in float32 before they meet
 *         float16 (they pass its range).
 *   FP8   for models that carry float8 QDQ: a MatMul or Gemm whose operands
 *         are both dequantised float8 (E4M3FN/E5M2, one scale each) keeps
 *         its float8 weights and runs on the float8 values (cuBLASLt's
 *         float8 GEMM on sm_89+, the scales as its alpha); everything else
 *         as FP16.
 * Results differ from FP32 by about the type's rounding (INT8: float
 * rounding, so a quantised value on a rounding boundary may move by one
 * step; DESIGN.md, Numerics). */
typedef enum kf_precision {
    KF_PRECISION_FP32 = 0,
    KF_PRECISION_TF32 = 1,
    KF_PRECISION_FP16 = 2,
    KF_PRECISION_BF16 = 3,
    KF_PRECISION_INT8 = 4,
    KF_PRECISION_INT8_FP16 = 5,
    KF_PRECISION_FP8 = 6
} kf_precision;
/* "fp32", "tf32", "fp16", "bf16", "int8", "int8-fp16", "fp8"; "?" for other numbers. Static storage. */
KF_API const char *kf_precision_name(kf_precision p);

/* Rewrites m in place with the built-in rules (what `kfuse opt` does);
 * outputs keep their names and order. m stays the caller's. */
KF_API kf_status kf_model_optimize(kf_model *m);

typedef struct kf_compiled kf_compiled;

/* Optimizes a copy of m, plans fusion and compiles every kernel for
 * backend b (BEST: see kf_backend). m is not retained or changed and may
 * be freed right after. When an input has symbolic dims, kernels for each
 * distinct set of input shapes are compiled at the first kf_run that
 * meets it (and kept). On success *out is the caller's (kf_compiled_free).
 * Errors: KF_ERR_NO_DEVICE ("no CUDA device: <reason>", "no OpenCL
 * device: ...") when b names a backend that cannot run here,
 * KF_ERR_COMPILE (a kernel's log in the message), model errors. */
KF_API kf_status kf_compile(const kf_model *m, kf_backend b, kf_compiled **out);
/* A symbolic input dimension fixed to a size (kf_compile_options.dims):
 * what `kfuse run|compile|bench --dim NAME=N` does. */
typedef struct kf_dim {
    const char *name; /* the dim's name in the model ("batch", "N") */
    int64_t value;    /* >= 0 */
} kf_dim;

/* An on/off option whose default comes from the environment. Numbers
 * never shift. */
typedef enum kf_switch {
    KF_SWITCH_DEFAULT = 0, /* as the environment variable named at the field says */
    KF_SWITCH_ON = 1,
    KF_SWITCH_OFF = 2
} kf_switch;

/* Options of kf_compile_ex. struct_size is the caller's
 * sizeof(kf_compile_options): fields are only ever appended, so a program
 * built against this header keeps working with later libraries. Start
 * from KF_COMPILE_OPTIONS_INIT. The sizes this library takes are the
 * first version's (struct_size through precision: every field after it
 * then keeps its INIT value) and its own; fields left at their INIT value
 * take the default the comment names, often an environment variable's.
 * Pointers (strings, arrays) are read by kf_compile_ex only: they may be
 * freed when it returns. */
typedef struct kf_compile_options {
    size_t struct_size;     /* sizeof(kf_compile_options) */
    kf_backend backend;     /* as kf_compile's b */
    kf_precision precision; /* taken as given (KFUSE_PRECISION is not read) */
    /* ---- after the first version ---- */
    /* Device profile fusion is planned for (what `kfuse fuse --target`
     * takes): "h200", "h100", "a100", a .target file, or "none" (every
     * legal merge, no cost model). NULL: KFUSE_TARGET, else "h200". */
    const char *target;
    /* Ordinal of the device of backend OPENCL or CUDA (0: the first;
     * OpenCL devices counted across platforms). One past the last is
     * KF_ERR_NO_DEVICE. BEST resolves the backend on device 0's presence. */
    int device;
    /* Kernel cache folder (created when missing). NULL: KFUSE_CACHE_DIR,
     * else $XDG_CACHE_HOME/kfuse, else ~/.cache/kfuse. */
    const char *cache_dir;
    /* Extra rewrite rules: .kfp files applied with the built-in ones, as
     * `kfuse opt --patterns F`. A file that does not parse fails the
     * compile (KF_ERR_IO, KF_ERR_BAD_MODEL with the line). */
    const char *const *pattern_files;
    int npattern_files;
    /* Symbolic input dims fixed to sizes: the inputs' declared shapes
     * (kf_compiled_input_info) become static, kernels are compiled now, and
     * kf_run of another size for such a dim is KF_ERR_SHAPE. A name the
     * model lacks is ignored (one option set may serve several models). */
    const kf_dim *dims;
    int ndims;
    /* Scratch memory of each concurrent run's vendor-library calls
     * (cuBLASLt, cuDNN) in bytes; smaller rules out some algorithms.
     * 0: 32 MiB. Only the CUDA backend has such calls. */
    size_t workspace_bytes;
    /* OFF: one kernel per node (KFUSE_DISABLE_FUSION=1). */
    kf_switch fusion;
    /* OFF: every kernel group its own launch, no horizontal batching
     * (KFUSE_DISABLE_BATCHING=1). */
    kf_switch batching;
} kf_compile_options;
#define KF_COMPILE_OPTIONS_INIT                                                                                   \
    {sizeof(kf_compile_options), KF_BACKEND_BEST, KF_PRECISION_FP32, NULL, 0, NULL, NULL, 0, NULL, 0, 0,         \
     KF_SWITCH_DEFAULT, KF_SWITCH_DEFAULT}
/* kf_compile with options. opts NULL: KF_COMPILE_OPTIONS_INIT. Errors as
 * kf_compile's, and KF_ERR_INVALID_ARG for a struct_size that is neither
 * the first version's nor this header's (below: a caller that did not
 * set it), an unknown precision, backend or switch, a negative count or
 * a NULL array with a count, a fixed dim without a name or with a
 * negative size; KF_ERR_UNSUPPORTED for a struct_size above this
 * library's (options of a later kfuse it cannot honour);
 * KF_ERR_NO_DEVICE for a device ordinal past the backend's devices.
 * kf_compile(m, b, out) is kf_compile_ex with backend b and precision
 * KFUSE_PRECISION (fp32 when unset), every other field at its INIT
 * value. */
KF_API kf_status kf_compile_ex(const kf_model *m, const kf_compile_options *opts, kf_compiled **out);

/* Rewrites m in place as `kfuse fuse` does: the symbolic dims opts fixes
 * bound, optimized (built-in rules and opts' pattern files), converted to
 * 16 bits at precision FP16/BF16, fusion planned for opts' target (its
 * fusion switch honoured), and each kernel group written as a model-local
 * function in domain ai.kfuse, so any ONNX runtime still runs the result
 * (kf_model_save). Backend, device, cache folder, workspace and batching
 * do not apply. opts NULL: KF_COMPILE_OPTIONS_INIT. report_json (may be
 * NULL) receives the JSON report `kfuse fuse --json` prints, one line,
 * malloc'ed: the caller frees it with free(); NULL on failure. Errors as
 * kf_compile_ex's options checks, pattern files' (before m changes), and
 * the optimizer's and planner's (m may then be partly rewritten, still a
 * valid model). */
KF_API kf_status kf_model_fuse(kf_model *m, const kf_compile_options *opts, char **report_json);

/* The backend c runs on (BEST resolved). */
KF_API kf_backend kf_compiled_backend(const kf_compiled *c);
/* Inputs the caller provides (graph inputs without initializer, model
 * order) and outputs; names are owned by c. NULL for i out of range. */
KF_API int kf_compiled_num_inputs(const kf_compiled *c);
KF_API const char *kf_compiled_input_name(const kf_compiled *c, int i);
/* Input i's declared dtype (ONNX number, 0 when undeclared) and shape:
 * *rank (-1 when undeclared) and dims[0..*rank), -1 for a symbolic or
 * unknown dim, which kf_run accepts at any size. KF_ERR_INVALID_ARG for i
 * out of range or a NULL pointer. */
KF_API kf_status kf_compiled_input_info(const kf_compiled *c, int i, int *dtype, int *rank, int64_t dims[8]);
KF_API int kf_compiled_num_outputs(const kf_compiled *c);
KF_API const char *kf_compiled_output_name(const kf_compiled *c, int i);

/* A dim of kf_compiled_output_info that only a run can tell. */
#define KF_DIM_UNKNOWN (-1)
/* Output i's dtype (ONNX number) and shape for a run on inputs of these
 * dtypes and shapes, before running it: inputs as kf_run takes them
 * (ninputs, kf_compiled_input_name order), but their data is not read
 * and may be NULL. Shape inference on the concrete input shapes (on the
 * optimized copy of the model a plan starts from; no kernel is compiled),
 * or the plan kf_run already made for them. A dim that depends on input
 * values rather than shapes (NonZero, Unique, a Reshape, Expand or
 * ConstantOfShape whose shape is an input, TopK with k an input) is
 * KF_DIM_UNKNOWN, and *rank is -1 where even the rank is (dims then
 * untouched): kf_run's kf_output tells. The result is what kf_run
 * returns for such inputs. Asking for every i with the same inputs
 * infers once. Thread-safe like kf_run. Errors: KF_ERR_INVALID_ARG
 * (NULL pointer, counts, i out of range, an input's dtype not the
 * declared one, rank above 8), KF_ERR_SHAPE (shapes the model cannot
 * take, naming the node; a dim kf_compile_options.dims fixed otherwise). */
KF_API kf_status kf_compiled_output_info(const kf_compiled *c, const kf_host_tensor *inputs, int ninputs, int i,
                                         int *dtype, int *rank, int64_t dims[8]);

/* An output tensor: data (nbytes, row-major) is owned by the caller and
 * freed by kf_output_release. dtype numbers are ONNX's. */
typedef struct kf_output {
    int dtype;
    int rank;
    int64_t dims[8];
    void *data;
    size_t nbytes;
} kf_output;

/* Runs c on inputs (ninputs of them, in kf_compiled_input_name order; the
 * data is read, not retained). outputs[0..noutputs) must number
 * kf_compiled_num_outputs; each is overwritten (not released: release
 * earlier results first) and is the caller's after, also on failure
 * (then empty). Thread-safe: several threads may run one kf_compiled at
 * once, each run has its own queue/stream and arena. Errors:
 * KF_ERR_INVALID_ARG (counts, dtype, rank > 8 output), KF_ERR_RUNTIME (a
 * device call failed), errors of reference ops naming the node. */
KF_API kf_status kf_run(kf_compiled *c, const kf_host_tensor *inputs, int ninputs, kf_output *outputs,
                        int noutputs);
/* ---- device-side runs -------------------------------------------------
 * For runtimes that keep tensors on the device: kf_run_device enqueues a
 * compiled plan on the caller's queue/stream, reading inputs from and
 * writing outputs to the caller's device buffers. Nothing is copied
 * through the host and nothing waits: the call returns once every launch
 * is enqueued. Intermediates live in a device arena the plan keeps per
 * stream. Backends OPENCL and CUDA. On CUDA, a run given the same buffers
 * as the run before it on that stream is captured into a CUDA Graph, and
 * later runs with those buffers replay it (one launch for the whole plan):
 * bind buffers once and reuse them to get this. A stream the caller is
 * capturing itself gets the plain launches, which join the caller's graph;
 * the default streams are never captured.
 *
 *   void *ctx;  kf_compiled_device_context(c, &ctx);
 *   // OpenCL: queue = clCreateCommandQueue(ctx, <its device>, 0, ..),
 *   //         buffers = clCreateBuffer(ctx, ..)
 *   kf_compiled_output_info(c, ..)     // size each output buffer
 *   kf_run_device(c, queue, in, nin, out, nout);  // ... more work on queue
 *   kf_sync(c, queue);                 // waits; reports bad indices
 *
 * The plan owns its context rather than taking the caller's: its kernels
 * and weights are built there at kf_compile time, before any stream is
 * known, and on CUDA it is the device's primary context, the one CUDA
 * runtimes (cudart, frameworks) already use. */

/* A tensor in a device buffer the caller owns (kfuse never frees or keeps
 * it past the call; its queued launches use it until the stream reaches
 * them). dtype numbers are ONNX's; dims[0..rank) row-major. */
typedef struct kf_device_tensor {
    int dtype;
    int rank;
    const int64_t *dims;
    /* OpenCL: a cl_mem of the plan's context. CUDA: a CUdeviceptr as
     * (void *)(uintptr_t)ptr, 256-byte aligned as cuMemAlloc's are. The
     * tensor starts at the buffer's first byte. */
    void *buffer;
    size_t nbytes; /* bytes the buffer holds; at least the tensor's */
} kf_device_tensor;

/* The device context c's plan runs in, into *context: a cl_context
 * (OpenCL; clGetContextInfo(CL_CONTEXT_DEVICES) gives its one device) or
 * the CUcontext of the device's primary context (CUDA). Owned by c, valid
 * until kf_compiled_free (retain it to keep it longer). Queues/streams and
 * buffers given to kf_run_device must belong to it. Errors:
 * KF_ERR_INVALID_ARG (NULL), KF_ERR_UNSUPPORTED (backend ref). */
KF_API kf_status kf_compiled_device_context(const kf_compiled *c, void **context);

/* Enqueues a run of c on stream -- an in-order cl_command_queue of c's
 * context (OpenCL) or a CUstream of it (CUDA; NULL: the legacy default
 * stream) -- and returns without waiting. inputs as kf_run's (ninputs, in
 * kf_compiled_input_name order) but in device buffers; outputs[0..noutputs)
 * describe the buffers, allocated by the caller, each output is written to:
 * their dtype and dims must be what kf_compiled_output_info says for these
 * inputs. Launches go in stream order, so input buffers may be written by
 * earlier work on the stream and outputs read by later work; buffers must
 * not be freed before the stream gets past the run.
 * The first call for a set of input shapes compiles its kernels and
 * uploads weights on the plan's own queue (as kf_run's first does); a
 * kf_run or kf_compiled_output_info with those shapes first keeps that
 * out of the hot path. Each stream gets its own device arena per shape
 * set, kept until kf_compiled_free; several threads may run at once, on
 * one stream or several. Index errors a kernel detects (an out-of-range
 * Gather index) are not reported here: kf_sync does. Errors:
 * KF_ERR_INVALID_ARG (NULL, counts, a dtype or dims that differ from the
 * model's or the output's, nbytes too small, a NULL buffer, a stream or
 * buffer of another context, an out-of-order queue), KF_ERR_UNSUPPORTED
 * (backend ref; a plan with a step that runs on the host -- a reference
 * fallback, a data-dependent shape -- naming its first node; an output
 * that is a constant no kernel writes), KF_ERR_SHAPE, KF_ERR_RUNTIME (an
 * enqueue failed; launches before it may have been enqueued). */
KF_API kf_status kf_run_device(kf_compiled *c, void *stream, const kf_device_tensor *inputs, int ninputs,
                               const kf_device_tensor *outputs, int noutputs);

/* Waits until stream has finished all its work, then reports the first
 * out-of-range index any kernel of a kf_run_device on that stream met
 * since the last kf_sync (KF_ERR_RUNTIME naming the node, as kf_run does)
 * and forgets it; outputs of such a run are undefined. Errors also:
 * KF_ERR_INVALID_ARG (NULL c, a stream of another context),
 * KF_ERR_UNSUPPORTED (backend ref), KF_ERR_RUNTIME (the wait failed). */
KF_API kf_status kf_sync(kf_compiled *c, void *stream);

/* Frees o's data and empties it; NULL is fine. */
KF_API void kf_output_release(kf_output *o);
/* Frees c; no kf_run may be in flight, and streams given to kf_run_device
 * must have finished its runs (kf_sync). NULL is fine. */
KF_API void kf_compiled_free(kf_compiled *c);

#ifdef __cplusplus
}
#endif
#endif
