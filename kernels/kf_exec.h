/*
 * kf_exec.h: a compiled plan. kf_exec_create optimizes a copy of a model,
 * and for each distinct set of input shapes (memoised) plans fusion,
 * generates every group's kernel and compiles all of them up front, in
 * parallel, through the kernel cache; kf_exec_run then runs the plan many
 * times with intermediates resident on the device (one arena per run slot).
 * Groups codegen declines run on the reference evaluator. The device side
 * is a small table of functions (kf_dev) that opencl.c and cuda.c fill.
 */
#ifndef KF_EXEC_H
#define KF_EXEC_H

#include <stdio.h>

#include "kf_cache.h"
#include "kf_kernels.h"

struct kf_la_anchor;

typedef enum kf_exec_backend { KF_EXEC_REF = 1, KF_EXEC_OPENCL = 2, KF_EXEC_CUDA = 3 } kf_exec_backend;

/* Precisions (kfuse.h's kf_precision, DESIGN.md "Precision"):
 *   FP32  strict: float32 tensors, library calls without TF32 (cuBLASLt
 *         compute 32F, cuDNN FMA math)
 *   TF32  float32 tensors; cuBLASLt and cuDNN may round operands to TF32
 *         on tensor cores; generated kernels as FP32
 *   FP16, BF16  float32 weights and activations become float16/bfloat16
 *         (kf_fuse_precision) before planning; accumulation stays float32
 *   INT8  integer anchors where the model carries QDQ (kf_fuse_int8), the
 *         rest as FP32
 *   INT8_FP16  integer anchors, the rest as FP16
 *   FP8  float8 products on their float8 values (weights kept float8),
 *         the rest as FP16 */
#define KF_PRECISION_COUNT 7

/* Parses a name kf_precision_name gives into *p; false (and *p unchanged)
 * otherwise. */
bool kf_precision_parse(const char *s, kf_precision *p);

/* Whether constant folding keeps DequantizeLinear of constants at p (the
 * integer anchors read the 8-bit weights: INT8, INT8_FP16; float8
 * products their float8 weights: FP8). */
bool kf_precision_keeps_quantized(kf_precision p);

/* The passes precision p runs on an optimized model before planning: the
 * integer anchors (kf_fuse_int8: INT8, INT8_FP16), after which the
 * DequantizeLinear of constants no integer anchor took (weights a float op
 * reads, float8 weights) fold as the optimizer folds them, up to
 * fold_cap_bytes a node (kf_pass_ctx: 0 keeps a saved model from growing);
 * at FP8 the DequantizeLinear of constants fold likewise except the
 * weights of float8 products and convolutions (kf_fp8_anchor: the planner
 * decides per convolution, with the shapes and the target, whether the
 * float8 tile reads them or they become plan-time float16 weights); then
 * the 16-bit values (kf_fuse_precision: FP16, BF16, INT8_FP16, FP8); none
 * at FP32 and TF32. trace (NULL: none) gets a line per pass. Errors: the
 * passes'. */
kf_status kf_precision_passes(kf_model *m, kf_precision p, int64_t fold_cap_bytes, FILE *trace);

/* The precision KFUSE_PRECISION names: FP32 when it is unset or empty,
 * KF_ERR_INVALID_ARG naming the value when it is none of the names. */
kf_status kf_precision_from_env(kf_precision *p);

/* Compile threads at most: kernels are independent and NVRTC/PoCL use one
 * core each, so more than a machine's cores only adds memory. */
#define KF_EXEC_MAX_THREADS 16
/* More kernels than this and the compile prints a progress line on stderr
 * (a handful compiles in well under a second; dozens may take seconds). */
#define KF_EXEC_PROGRESS_KERNELS 32
/* The copy a plan optimizes is never saved, so constant folding may make it
 * larger than the file: a ConstantOfShape of a constant shape (a mask, a
 * zero state) or a weight transform is computed once at compile time instead
 * of on the host every run. A node's folded outputs may take up to this
 * many bytes (a run would hold them in its arena anyway). */
#define KF_EXEC_FOLD_CAP_BYTES ((int64_t)256 << 20)
/* Distinct input-shape sets specialised per kf_exec: each holds a model
 * copy and its kernels; a caller cycling through more shapes than this is
 * told so instead of growing memory without bound. */
#define KF_EXEC_MAX_SPECS 64

typedef struct kf_exec_options {
    kf_exec_backend backend;
    bool optimize;         /* run kf_optimize on the copy first (default true) */
    const char *arch;      /* cuda: "sm_90"; NULL: the device's, or sm_90 when compiling with no device */
    bool compile_only;     /* compile into the cache, never run (cuda needs no driver then) */
    int threads;           /* compile threads; 0: the online cores, capped at KF_EXEC_MAX_THREADS */
    const char *cache_dir; /* NULL: kf_cache_default_dir() */
    FILE *trace;           /* one line per group when the plan is made (NULL: none) */
    FILE *host_steps;      /* one line per group that runs on the reference evaluator every run,
                            * with its reason, when the plan is made (NULL: none; not for backend ref) */
    bool no_vendor_lib;    /* cuda: anchors stay generated kernels instead of cuBLASLt/cuDNN
                            * calls (kf_libanchor.h); also KFUSE_NO_VENDOR_LIB=1 */
    const char *target;    /* the device profile fusion is planned for (fusion/kf_cost.h):
                            * NULL: KFUSE_TARGET, else KF_PLAN_DEFAULT_TARGET; "none": every
                            * legal merge, no cost model */
    kf_precision precision;/* KF_PRECISION_*; fp16/bf16 convert the model's float32 values
                            * (kf_fuse_precision) before planning */
    int device;            /* ordinal of the OpenCL or CUDA device (0: the first) */
    const char *const *pattern_files; /* extra .kfp rules the optimizer applies with the
                            * built-in ones; each is loaded (and its errors returned) by
                            * kf_exec_create; the paths are copied */
    int npattern_files;
    const kf_dim *dims;    /* symbolic dims fixed (kf_graph_bind_sym on the plan's copy): the
                            * declared input types become static, runs must match them;
                            * names the model lacks are ignored; copied */
    int ndims;
    size_t lib_workspace;  /* cuda: bytes of each run slot's cuBLASLt/cuDNN workspace; 0: default */
    kf_switch fusion;      /* OFF: one group per node (KFUSE_DISABLE_FUSION=1); DEFAULT: the variable */
    kf_switch batching;    /* OFF: no horizontal launches (KFUSE_DISABLE_BATCHING=1); DEFAULT: the variable */
} kf_exec_options;

/* Fills o from the public options (kfuse.h; struct_size checked, fields
 * past it at their KF_COMPILE_OPTIONS_INIT values): backend BEST
 * resolved, everything else of o from kf_exec_options_default. The one
 * path from kf_compile_options to a plan, for kf_compile_ex and the CLI.
 * o points into opts (strings, arrays) until kf_exec_create copies them.
 * Errors: KF_ERR_INVALID_ARG (struct_size, backend, precision, ...),
 * KF_ERR_UNSUPPORTED (a struct_size past this library's). */
kf_status kf_exec_options_from_public(const kf_compile_options *opts, kf_exec_options *o);


/* backend opencl, optimize on, threads 0, precision from KFUSE_PRECISION
 * (fp32 when unset; a value it does not name makes kf_exec_create fail
 * with the reason), everything else NULL/false. */
void kf_exec_options_default(kf_exec_options *o);

/* What compiling one specialisation did, and run figures. */
typedef struct kf_exec_stats {
    uint32_t groups_dev;      /* groups run on the device: generated kernels, and views
                               * that alias their input's bytes (no launch) */
    uint32_t groups_ref;      /* groups on the reference evaluator (consts too) */
    uint32_t groups_lib;      /* of groups_dev and the groups with an epilogue kernel: those
                               * run as a library call (kf_libanchor.h) */
    uint32_t kernels_unique;  /* distinct kernel texts */
    uint32_t kernels_compiled;/* compiled this time (cache misses) */
    uint32_t cache_hits;      /* found in the kernel cache (memory or disk) */
    double compile_seconds;   /* wall time of the parallel compile */
    uint32_t launches;        /* kernel launches per run */
    int64_t arena_bytes;      /* device arena of one run slot */
    int64_t live_lower_bound; /* largest bytes live at once (memplan), -1 unknown */
    bool cuda_graph;          /* runs replay a captured CUDA Graph */
    uint64_t device_replays;  /* device-side runs so far replayed from a captured graph
                               * (kf_exec_run_device with the buffers of the run before) */
    uint64_t body_runs;       /* If/Loop/Scan bodies run so far as compiled plans of their own */
} kf_exec_stats;

typedef struct kf_exec kf_exec;

/* The plan behind a public kf_compiled (tests and tools: statistics). */
kf_exec *kf_compiled_exec(const kf_compiled *c);

/* Makes a compiled plan of m for o->backend. m is copied (not retained,
 * not changed). When every graph input has static dims, the specialisation
 * for them is compiled now; otherwise at the first run of each shape set
 * (or kf_exec_prepare). On success *out is the caller's (kf_exec_free).
 * Errors: KF_ERR_NO_DEVICE "no OpenCL device: ..." / "no CUDA device:
 * ..." (compile_only cuda needs NVRTC only), errors of the optimizer, the
 * planner, codegen and compiles (naming the kernel, with its log). */
kf_status kf_exec_create(const kf_model *m, const kf_exec_options *o, kf_exec **out);

/* Names of the real inputs (as the model was given, before optimizing)
 * and outputs, in order; owned by e. */
uint32_t kf_exec_num_inputs(const kf_exec *e);
const char *kf_exec_input_name(const kf_exec *e, uint32_t i);
/* Input i's declared type in the model as given (dims -1 where symbolic or
 * unknown, rank -1 when unknown); NULL for i out of range. Owned by e. */
const kf_type *kf_exec_input_type(const kf_exec *e, uint32_t i);
uint32_t kf_exec_num_outputs(const kf_exec *e);
const char *kf_exec_output_name(const kf_exec *e, uint32_t i);
kf_exec_backend kf_exec_get_backend(const kf_exec *e);

/* Compiles the specialisation for inputs of these types (dims of input i:
 * types[i]) without running, e.g. for `kfuse compile --dim`. Memoised. */
kf_status kf_exec_prepare(kf_exec *e, const kf_type *types, uint32_t ntypes, kf_exec_stats *st);

/* The types of e's outputs (kf_exec_num_outputs of them, into out) for
 * inputs of these dtypes and shapes (their data is not read; ninputs as
 * for kf_exec_run): shape inference on the copy a plan starts from
 * (specialised to them, optimized), or the plan already made for them. A dim that depends on input values
 * (NonZero, a Reshape whose shape is an input) is -1, a rank unknown
 * until a run -1. Errors as kf_exec_run's checks of its inputs, and
 * inference's KF_ERR_SHAPE naming the node where they do not fit. */
kf_status kf_exec_output_types(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_type *out);

/* Runs e. inputs[i] in kf_exec_input_name order (ninputs of them);
 * outputs[o] (kf_exec_num_outputs of them) are released and refilled; the
 * caller owns them after. Thread-safe: any number of threads may run one
 * kf_exec at once; each run takes its own slot (queue/stream and arena).
 * Errors: KF_ERR_INVALID_ARG (count, dtype), KF_ERR_RUNTIME (a device call
 * failed, named), reference errors naming the node. */
kf_status kf_exec_run(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_tensor *outputs);

/* kf_exec_run, and *device_s (when not NULL) receives the seconds from
 * the first launch to the device finishing the last, when every group ran
 * as a kernel (inputs uploaded before, outputs downloaded after); else -1.
 * For benchmarks: it adds one synchronisation per run. */
kf_status kf_exec_run_timed(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_tensor *outputs,
                            double *device_s);

/* Runs e on the device with the caller's buffers and stream (kfuse.h's
 * kf_run_device): inputs[i] give each input's dtype and dims (data
 * unused), in_bufs[i] its device buffer; outputs[o] the dtype and dims the
 * caller allocated out_bufs[o] for, which must be output o's. Enqueues
 * every launch on `stream` and returns: no host copy, no wait. Index
 * errors of checking kernels are kept per stream until kf_exec_sync.
 * Errors: KF_ERR_INVALID_ARG (counts, dtypes, shapes, a stream or buffer
 * the device refuses), KF_ERR_UNSUPPORTED (backend ref; a step of the plan
 * that runs on the host, naming its first node; an output no kernel
 * computes), KF_ERR_NO_DEVICE (compile-only plan), KF_ERR_RUNTIME. */
kf_status kf_exec_run_device(kf_exec *e, void *stream, const kf_tensor *inputs, void *const *in_bufs,
                             uint32_t ninputs, const kf_tensor *outputs, void *const *out_bufs, uint32_t noutputs);
/* Waits until `stream` has finished, then reports (and forgets) the
 * first bad index a checking kernel of a kf_exec_run_device on it met,
 * KF_ERR_RUNTIME naming the node. */
kf_status kf_exec_sync(kf_exec *e, void *stream);
/* The device context of e's plan (cl_context, CUcontext) into *ctx;
 * KF_ERR_UNSUPPORTED for backend ref, KF_ERR_NO_DEVICE compile-only. */
kf_status kf_exec_device_context(const kf_exec *e, void **ctx);

/* Figures of the most recently made specialisation (zeros before any);
 * launches per run and whether runs replay a CUDA Graph included. */
void kf_exec_get_stats(const kf_exec *e, kf_exec_stats *st);

/* Shape sets specialised so far (each compiled once). */
uint32_t kf_exec_num_specs(kf_exec *e);

/* Frees e (NULL is fine). No run may be in flight. */
void kf_exec_free(kf_exec *e);

/* ---- device backends (opencl.c, cuda.c) -------------------------------- */

/* One device a kf_exec runs on: the functions plus their state. A backend
 * fills what it supports; capture/replay may be NULL. Every function that
 * takes a stream may be called from several threads, each with its own
 * stream; kernels and weight buffers are shared read-only. */
typedef struct kf_dev {
    const char *name;    /* "opencl", "cuda" */
    char arch[128];      /* cache key "arch": device name+version, "sm_90" */
    char compiler[128];  /* cache key "compiler" */
    char options[128];   /* cache key "options" */
    kf_cg_target target;
    size_t align;        /* sub-buffer offsets must be multiples of this */
    size_t lib_workspace;/* bytes of each stream's library workspace (lib); 0: the default */
    bool can_run;        /* false for compile-only cuda without a driver */
    void *state;
    /* source -> binary (malloc'ed *bin, caller free()); on failure
     * KF_ERR_COMPILE with the log; *log (malloc'ed or NULL) the build log */
    kf_status (*build)(struct kf_dev *d, const char *src, const char *entry, void **bin, size_t *len, char **log);
    /* binary -> kernel handle */
    kf_status (*load)(struct kf_dev *d, const void *bin, size_t len, const char *entry, void **kern);
    void (*unload)(struct kf_dev *d, void *kern);
    kf_status (*stream_new)(struct kf_dev *d, void **s);
    void (*stream_free)(struct kf_dev *d, void *s);
    kf_status (*alloc)(struct kf_dev *d, size_t bytes, void **buf);
    void (*free)(struct kf_dev *d, void *buf);
    /* a view of bytes [off, off+len) of buffer base (off a multiple of align) */
    kf_status (*view)(struct kf_dev *d, void *base, size_t off, size_t len, void **buf);
    void (*view_free)(struct kf_dev *d, void *buf);
    kf_status (*upload)(struct kf_dev *d, void *s, void *buf, const void *src, size_t n);
    /* returns when dst holds the bytes */
    kf_status (*download)(struct kf_dev *d, void *s, void *buf, void *dst, size_t n);
    /* launches kern over numel work items with args bufs[0..nbufs), in
     * work-groups (thread blocks) of `block` items (0: any size) */
    kf_status (*launch)(struct kf_dev *d, void *s, void *kern, void *const *bufs, uint32_t nbufs, int64_t numel,
                        uint32_t block);
    kf_status (*sync)(struct kf_dev *d, void *s);
    /* optional: record the launches between begin and end into *graph,
     * replay it later on the same stream */
    kf_status (*capture_begin)(struct kf_dev *d, void *s);
    kf_status (*capture_end)(struct kf_dev *d, void *s, void **graph);
    kf_status (*replay)(struct kf_dev *d, void *s, void *graph);
    void (*graph_free)(struct kf_dev *d, void *graph);
    /* optional, with capture: whether launches on s may be captured into
     * a graph of ours now (false while the caller captures s into a graph
     * of its own, or for a stream that cannot be captured) */
    bool (*can_capture)(struct kf_dev *d, void *s);
    void (*close)(struct kf_dev *d);
    /* optional (cuda with cuBLASLt/cuDNN): one library anchor call
     * (kf_libanchor.h) on stream s, buffers in kf_la_anchor_values order
     * (NULL where none). a NULL: only make what calls on s need (the
     * workspace), before a capture, where allocating is not allowed.
     * lib_has: whether lib takes convolutions (conv) or GEMMs (!conv);
     * asked only when a group maps, so a library (cuDNN and cuBLASLt are
     * hundreds of MB) loads only for models that use it. */
    kf_status (*lib)(struct kf_dev *d, void *s, const struct kf_la_anchor *a, void *const bufs[5]);
    bool (*lib_has)(struct kf_dev *d, bool conv);
    /* Device-side runs (kf_exec_run_device) on the caller's streams and
     * buffers. context: the cl_context / CUcontext every buffer and stream
     * of the plan lives in. stream_check: KF_ERR_INVALID_ARG, saying why,
     * when s cannot carry a plan's launches (another context; an
     * out-of-order OpenCL queue). buf_check (may be NULL): the same for a
     * caller's buffer that should hold n bytes. copy: enqueues n bytes
     * from src to dst on s, device to device, without waiting. */
    void *(*context)(struct kf_dev *d);
    kf_status (*stream_check)(struct kf_dev *d, void *s);
    kf_status (*buf_check)(struct kf_dev *d, void *buf, size_t n);
    kf_status (*copy)(struct kf_dev *d, void *s, void *dst, void *src, size_t n);
} kf_dev;

/* Opens OpenCL device number `device` (0: the first; devices counted
 * across platforms in the loader's order). KF_ERR_NO_DEVICE with the
 * reason, naming the count when the number is past it. */
kf_status kf_cl_dev_open(int device, kf_dev **out);
/* Opens CUDA device `device` (an ordinal, 0 the first) through the driver
 * loaded at run time (dlopen of libcuda.so.1). compile_only: no driver
 * needed; arch then defaults to sm_90. arch NULL: the device's compute
 * capability. KF_ERR_NO_DEVICE "no CUDA device: <reason>" without driver
 * or device, "no CUDA device N: ..." for an ordinal past the count. */
kf_status kf_cu_dev_open(const char *arch, bool compile_only, int device, kf_dev **out);
/* Run-time loading of the CUDA libraries (cuda.c, cuda_lib.c): one symbol
 * and the function-pointer slot it fills. */
typedef struct kf_dl_sym {
    void **slot;
    const char *name;
} kf_dl_sym;
/* Resolves every symbol of lib into its slot (dlsym); the name of the first
 * one lib lacks, else NULL (slots before it are filled). */
const char *kf_dl_resolve(void *lib, const kf_dl_sym *syms, size_t n);

/* NULL when a CUDA driver and device answer here, else a static reason. */
const char *kf_cu_unavailable(void);

/* "nvrtc 12.4" (the cache key's compiler), "nvrtc none" when compiled out. */
void kf_nvrtc_version(char *buf, size_t len);
/* The options kf_nvrtc_cubin passes after --gpu-architecture (cache key). */
#define KF_NVRTC_OPTIONS "--ptxas-options=-v --std=c++17"
/* Compiles CUDA source to a CUBIN (malloc'ed *cubin, caller free()) and
 * fills r like kf_nvrtc_compile. */
kf_status kf_nvrtc_cubin(const char *src, const char *arch, void **cubin, size_t *len, kf_nvrtc_report *r);

#endif
