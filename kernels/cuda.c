/*
 * cuda.c: the run half of the CUDA backend. The driver (libcuda.so.1) is
 * loaded with dlopen the first time a CUDA device is asked for, so kfuse
 * and libkfuse start on machines without one; the few entry points used
 * are declared here with the driver ABI's types (no cuda.h needed). Kernels
 * come from NVRTC (nvrtc.c) as CUBIN. Exercised by bench/gpu_check.sh: no
 * machine in CI has a GPU.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_exec.h"
#include "kf_libanchor.h"

/* ---- the driver ABI (stable since CUDA 11.4; *_v2 are the current names) */

typedef int CUresult; /* 0: CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec;

#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_STREAM_NON_BLOCKING 1
/* thread-local capture: other threads' legal calls do not break ours */
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_STATUS_NONE 0
/* the legacy and per-thread default streams' handles: never captured */
#define CU_STREAM_PER_THREAD_HANDLE ((uintptr_t)0x2)

/* Threads per block: a multiple of the 32-thread warp that lets an SM
 * hold 8 blocks; the grid-stride loop makes the choice a speed matter only. */
#define CU_BLOCK 256
/* Blocks at most: 132 SMs x 8 resident blocks x 4 waves; past this the
 * grid-stride loop is cheaper than more blocks. */
#define CU_MAX_BLOCKS 4224

static struct {
    pthread_once_t once;
    const char *why; /* NULL: loaded and a device answers */
    char whybuf[256];
    void *lib;
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*StreamIsCapturing)(CUstream, int *);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu = {.once = PTHREAD_ONCE_INIT};

const char *kf_dl_resolve(void *lib, const kf_dl_sym *syms, size_t n) {
    for (size_t i = 0; i < n; i++) {
        void *f = dlsym(lib, syms[i].name);
        if (!f) return syms[i].name;
        memcpy(syms[i].slot, &f, sizeof f); /* object to function pointer, as POSIX dlsym allows */
    }
    return NULL;
}

static void load_driver(void) {
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) {
        const char *e = dlerror();
        snprintf(cu.whybuf, sizeof cu.whybuf, "the driver library libcuda.so.1 could not be loaded (%s)", e ? e : "?");
        cu.why = cu.whybuf;
        return;
    }
    const kf_dl_sym syms[] = {
#define SYM(field, name) {(void **)&cu.field, name}
        SYM(Init, "cuInit"), SYM(DeviceGet, "cuDeviceGet"), SYM(DeviceGetCount, "cuDeviceGetCount"),
        SYM(DeviceGetAttribute, "cuDeviceGetAttribute"), SYM(DeviceGetName, "cuDeviceGetName"),
        SYM(DriverGetVersion, "cuDriverGetVersion"), SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"), SYM(CtxSetCurrent, "cuCtxSetCurrent"),
        SYM(ModuleLoadData, "cuModuleLoadData"), SYM(ModuleUnload, "cuModuleUnload"),
        SYM(ModuleGetFunction, "cuModuleGetFunction"), SYM(LaunchKernel, "cuLaunchKernel"),
        SYM(MemAlloc, "cuMemAlloc_v2"), SYM(MemFree, "cuMemFree_v2"),
        SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"), SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
        SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"), SYM(StreamGetCtx, "cuStreamGetCtx"),
        SYM(StreamCreate, "cuStreamCreate"), SYM(StreamDestroy, "cuStreamDestroy_v2"),
        SYM(StreamSynchronize, "cuStreamSynchronize"), SYM(StreamBeginCapture, "cuStreamBeginCapture_v2"),
        SYM(StreamEndCapture, "cuStreamEndCapture"), SYM(StreamIsCapturing, "cuStreamIsCapturing"),
        SYM(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
        SYM(GraphLaunch, "cuGraphLaunch"), SYM(GraphExecDestroy, "cuGraphExecDestroy"),
        SYM(GraphDestroy, "cuGraphDestroy"), SYM(GetErrorString, "cuGetErrorString"),
#undef SYM
    };
    const char *missing = kf_dl_resolve(cu.lib, syms, sizeof syms / sizeof syms[0]);
    if (missing) {
        snprintf(cu.whybuf, sizeof cu.whybuf, "the driver lacks %s (older than CUDA 11.4?)", missing);
        cu.why = cu.whybuf;
        return;
    }
    int n = 0;
    CUresult r = cu.Init(0);
    if (r == 0) r = cu.DeviceGetCount(&n);
    if (r != 0 || n == 0) {
        const char *s = NULL;
        if (r) cu.GetErrorString(r, &s);
        snprintf(cu.whybuf, sizeof cu.whybuf, r ? "cuInit failed: %s (error %d)" : "the driver sees no device%s",
                 r ? (s ? s : "?") : "", r);
        cu.why = cu.whybuf;
    }
}

const char *kf_cu_unavailable(void) {
    pthread_once(&cu.once, load_driver);
    return cu.why;
}

static kf_status cu_err(const char *what, CUresult r) {
    const char *s = NULL;
    if (cu.GetErrorString) cu.GetErrorString(r, &s);
    return kf_fail(r == 2 ? KF_ERR_NOMEM : KF_ERR_RUNTIME, "CUDA %s failed: %s (error %d)", what, s ? s : "?", r);
}

#define CU_TRY(what, call)                        \
    do {                                          \
        CUresult r_ = (call);                     \
        if (r_ != 0) return cu_err((what), r_);   \
    } while (0)

typedef struct cu_state {
    CUdevice dev;
    CUcontext ctx; /* the primary context; NULL when compile-only */
} cu_state;

typedef struct cu_kern {
    CUmodule mod;
    CUfunction fn;
} cu_kern;

static cu_state *cst(kf_dev *d) { return d->state; }

/* Every driver call runs in the primary context; threads start with none. */
static kf_status bind(kf_dev *d) {
    CU_TRY("cuCtxSetCurrent", cu.CtxSetCurrent(cst(d)->ctx));
    return KF_OK;
}

static kf_status dev_build(kf_dev *d, const char *src, const char *entry, void **bin, size_t *len, char **log) {
    (void)entry;
    *log = NULL;
    kf_nvrtc_report r;
    kf_status st = kf_nvrtc_cubin(src, d->arch, bin, len, &r);
    if (r.log[0]) *log = kf_strdup(r.log);
    return st;
}

static kf_status dev_load(kf_dev *d, const void *bin, size_t len, const char *entry, void **kern) {
    (void)len;
    KF_TRY(bind(d));
    cu_kern *k = kf_calloc(1, sizeof *k);
    if (!k) return kf_fail(KF_ERR_NOMEM, "out of memory");
    CUresult r = cu.ModuleLoadData(&k->mod, bin);
    if (r == 0 && (r = cu.ModuleGetFunction(&k->fn, k->mod, entry)) != 0) cu.ModuleUnload(k->mod);
    if (r != 0) {
        kf_free(k);
        return cu_err(entry, r);
    }
    *kern = k;
    return KF_OK;
}

static void dev_unload(kf_dev *d, void *kern) {
    cu_kern *k = kern;
    if (!k) return;
    if (!bind(d)) cu.ModuleUnload(k->mod);
    kf_free(k);
}

static kf_status dev_stream_new(kf_dev *d, void **s) {
    KF_TRY(bind(d));
    CUstream st = NULL;
    CU_TRY("cuStreamCreate", cu.StreamCreate(&st, CU_STREAM_NON_BLOCKING));
    *s = st;
    return KF_OK;
}

static void dev_stream_free(kf_dev *d, void *s) {
    if (!s || bind(d)) return;
    cu.StreamSynchronize(s); /* the workspace may still be in use by the last library call */
    kf_culib_release(s);
    cu.StreamDestroy(s);
}

static kf_status dev_alloc(kf_dev *d, size_t bytes, void **buf) {
    KF_TRY(bind(d));
    CUdeviceptr p = 0;
    CUresult r = cu.MemAlloc(&p, bytes ? bytes : 1);
    if (r) return kf_fail(r == 2 ? KF_ERR_NOMEM : KF_ERR_RUNTIME, "CUDA cuMemAlloc of %zu bytes failed (error %d)", bytes, r);
    *buf = (void *)(uintptr_t)p;
    return KF_OK;
}

static void dev_free(kf_dev *d, void *buf) {
    if (buf && !bind(d)) cu.MemFree((CUdeviceptr)(uintptr_t)buf);
}

static kf_status dev_view(kf_dev *d, void *base, size_t off, size_t len, void **buf) {
    (void)d, (void)len;
    *buf = (char *)base + off;
    return KF_OK;
}

static void dev_view_free(kf_dev *d, void *buf) { (void)d, (void)buf; }

static kf_status dev_upload(kf_dev *d, void *s, void *buf, const void *src, size_t n) {
    if (n == 0) return KF_OK;
    KF_TRY(bind(d));
    /* from pageable memory the call returns once src is staged, so the
     * caller may free it right after */
    CU_TRY("cuMemcpyHtoDAsync", cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)buf, src, n, s));
    return KF_OK;
}

static kf_status dev_download(kf_dev *d, void *s, void *buf, void *dst, size_t n) {
    if (n == 0) return KF_OK;
    KF_TRY(bind(d));
    CU_TRY("cuMemcpyDtoHAsync", cu.MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)buf, n, s));
    CU_TRY("cuStreamSynchronize", cu.StreamSynchronize(s));
    return KF_OK;
}

static kf_status dev_launch(kf_dev *d, void *s, void *kern, void *const *bufs, uint32_t nbufs, int64_t numel,
                            uint32_t block) {
    if (numel <= 0) return KF_OK;
    KF_TRY(bind(d));
    /* a body written for a block size (shared arrays, block reduces) gets
     * it; its loops stride over the grid, so capping blocks stays correct */
    unsigned threads = block ? block : CU_BLOCK;
    int64_t blocks = (numel + threads - 1) / threads;
    if (blocks > CU_MAX_BLOCKS) blocks = CU_MAX_BLOCKS;
    /* kernelParams[i] points at the i-th argument: each buffer is a device
     * pointer, held in bufs[] as a void * of the same 8 bytes */
    void *params[KF_CG_MAX_PARAMS];
    if (nbufs > sizeof params / sizeof params[0]) return kf_fail(KF_ERR_INTERNAL, "kernel with %u buffers", nbufs);
    for (uint32_t i = 0; i < nbufs; i++) params[i] = (void *)&bufs[i];
    CU_TRY("cuLaunchKernel", cu.LaunchKernel(((cu_kern *)kern)->fn, (unsigned)blocks, 1, 1, threads, 1, 1, 0, s, params, NULL));
    return KF_OK;
}

static kf_status dev_sync(kf_dev *d, void *s) {
    KF_TRY(bind(d));
    CU_TRY("cuStreamSynchronize", cu.StreamSynchronize(s));
    return KF_OK;
}

static kf_status dev_capture_begin(kf_dev *d, void *s) {
    KF_TRY(bind(d));
    CU_TRY("cuStreamBeginCapture", cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    return KF_OK;
}

static kf_status dev_capture_end(kf_dev *d, void *s, void **graph) {
    KF_TRY(bind(d));
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CU_TRY("cuStreamEndCapture", cu.StreamEndCapture(s, &g));
    CUresult r = cu.GraphInstantiateWithFlags(&x, g, 0);
    cu.GraphDestroy(g);
    if (r) return cu_err("cuGraphInstantiateWithFlags", r);
    *graph = x;
    return KF_OK;
}

static kf_status dev_replay(kf_dev *d, void *s, void *graph) {
    KF_TRY(bind(d));
    CU_TRY("cuGraphLaunch", cu.GraphLaunch(graph, s));
    return KF_OK;
}

/* A caller's stream: not a default stream (the legacy one cannot be
 * captured), and not being captured by the caller already (then our
 * launches join the caller's graph as they are). */
static bool dev_can_capture(kf_dev *d, void *s) {
    int status = -1;
    if ((uintptr_t)s <= CU_STREAM_PER_THREAD_HANDLE || bind(d)) return false;
    return cu.StreamIsCapturing(s, &status) == 0 && status == CU_STREAM_CAPTURE_STATUS_NONE;
}

static void dev_graph_free(kf_dev *d, void *graph) {
    if (graph && !bind(d)) cu.GraphExecDestroy(graph);
}

static void *dev_context(kf_dev *d) { return cst(d)->ctx; }

/* A caller's stream: of the plan's (primary) context. The legacy default
 * stream (NULL) is the current context's, which bind() makes ours. */
static kf_status dev_stream_check(kf_dev *d, void *s) {
    KF_TRY(bind(d));
    CUcontext ctx = NULL;
    CUresult r = cu.StreamGetCtx(s, &ctx);
    if (r) return kf_fail(KF_ERR_INVALID_ARG, "the stream is not a CUDA stream of this process (error %d)", r);
    if (ctx != cst(d)->ctx)
        return kf_fail(KF_ERR_INVALID_ARG, "the CUDA stream belongs to another context than the plan's "
                       "(device %d's primary context, kf_compiled_device_context)", (int)cst(d)->dev);
    return KF_OK;
}

/* A caller's device pointer: aligned as the arena's are, since generated
 * kernels may load vectors from a buffer's start. Its size is the
 * caller's word (kf_device_tensor.nbytes). */
static kf_status dev_buf_check(kf_dev *d, void *buf, size_t n) {
    (void)n;
    if ((uintptr_t)buf % d->align)
        return kf_fail(KF_ERR_INVALID_ARG, "the device pointer 0x%llx is not %zu-byte aligned (as cuMemAlloc's are)",
                       (unsigned long long)(uintptr_t)buf, d->align);
    return KF_OK;
}

static kf_status dev_copy(kf_dev *d, void *s, void *dst, void *src, size_t n) {
    if (n == 0) return KF_OK;
    KF_TRY(bind(d));
    CU_TRY("cuMemcpyDtoDAsync", cu.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, s));
    return KF_OK;
}

static void dev_close(kf_dev *d) {
    if (!d) return;
    if (d->state && cst(d)->ctx) cu.PrimaryCtxRelease(cst(d)->dev);
    kf_free(d->state);
    kf_free(d);
}

/* Library anchors (kf_libanchor.h): cuBLASLt / cuDNN on this context and stream. */
static kf_status dev_lib(kf_dev *d, void *s, const kf_la_anchor *a, void *const bufs[5]) {
    KF_TRY(bind(d));
    /* made before the first call (and before any capture) at the plan's size */
    KF_TRY(kf_culib_prepare(s, d->lib_workspace));
    if (!a) return KF_OK;
    if (a->is_conv) return kf_cudnn_conv(s, &a->conv, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]);
    return kf_cublaslt_gemm(s, &a->gemm, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]);
}

/* Loads the library on first use (kf_cublaslt_unavailable and
 * kf_cudnn_unavailable load once per process). */
static bool dev_lib_has(kf_dev *d, bool conv) {
    (void)d;
    return conv ? !kf_cudnn_unavailable() : !kf_cublaslt_unavailable();
}

kf_status kf_cu_dev_open(const char *arch, bool compile_only, int device, kf_dev **out) {
    *out = NULL;
    if (device < 0) return kf_fail(KF_ERR_NO_DEVICE, "no CUDA device %d: ordinals start at 0", device);
    const char *nv = kf_nvrtc_unavailable();
    if (nv) return kf_fail(KF_ERR_NO_DEVICE, "no CUDA device: %s", nv);
    const char *why = compile_only ? NULL : kf_cu_unavailable();
    if (why) return kf_fail(KF_ERR_NO_DEVICE, "no CUDA device: %s", why);
    kf_dev *d = kf_calloc(1, sizeof *d);
    cu_state *c = kf_calloc(1, sizeof *c);
    if (!d || !c) {
        kf_free(d), kf_free(c);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    d->state = c;
    d->name = "cuda";
    d->target = KF_CG_CUDA;
    /* 256 bytes: what cudaMalloc guarantees, and enough for any vector load */
    d->align = 256;
    /* compile-only uses the driver's device when there is one, else sm_90
     * (the H100/H200 this project targets) */
    bool run = !compile_only || kf_cu_unavailable() == NULL;
    if (run) {
        int count = 0;
        if (!cu.DeviceGetCount(&count) && device >= count) {
            dev_close(d);
            return kf_fail(KF_ERR_NO_DEVICE, "no CUDA device %d: the driver sees %d (0 to %d)", device, count, count - 1);
        }
        CUresult r = cu.DeviceGet(&c->dev, device);
        int major = 0, minor = 0;
        if (!r) r = cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev);
        if (!r) r = cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev);
        if (!r && !compile_only) r = cu.PrimaryCtxRetain(&c->ctx, c->dev);
        if (r) {
            kf_status st = cu_err("device setup", r);
            dev_close(d);
            return compile_only ? st : kf_fail(KF_ERR_NO_DEVICE, "no CUDA device: %s", kf_last_error());
        }
        snprintf(d->arch, sizeof d->arch, "sm_%d%d", major, minor);
    } else
        snprintf(d->arch, sizeof d->arch, "sm_90");
    if (arch && arch[0]) snprintf(d->arch, sizeof d->arch, "%s", arch);
    kf_nvrtc_version(d->compiler, sizeof d->compiler);
    snprintf(d->options, sizeof d->options, "%s", KF_NVRTC_OPTIONS);
    d->can_run = !compile_only;
    d->build = dev_build, d->load = dev_load, d->unload = dev_unload;
    d->stream_new = dev_stream_new, d->stream_free = dev_stream_free;
    d->alloc = dev_alloc, d->free = dev_free, d->view = dev_view, d->view_free = dev_view_free;
    d->upload = dev_upload, d->download = dev_download, d->launch = dev_launch, d->sync = dev_sync;
    /* KFUSE_CUDA_GRAPHS=0: launch by launch (profilers, and timing what graphs save) */
    const char *graphs = getenv("KFUSE_CUDA_GRAPHS");
    if (!graphs || strcmp(graphs, "0")) {
        d->capture_begin = dev_capture_begin, d->capture_end = dev_capture_end;
        d->replay = dev_replay, d->graph_free = dev_graph_free, d->can_capture = dev_can_capture;
    }
    d->context = dev_context, d->stream_check = dev_stream_check, d->buf_check = dev_buf_check, d->copy = dev_copy;
    d->close = dev_close;
    /* compile-only, or later no library: anchors stay generated kernels */
    if (!compile_only) d->lib = dev_lib, d->lib_has = dev_lib_has;
    *out = d;
    return KF_OK;
}
