/*
 * opencl.c: the OpenCL backend of kernels/, through the ICD loader (PoCL on
 * the CPU in CI, any GPU driver elsewhere). Two ways in: kf_cl_run_kernel
 * builds and runs one generated kernel on host tensors with a context per
 * call (the codegen tests' correctness path), and kf_cl_dev_open gives the
 * kf_dev a compiled plan (exec.c) runs on: one context, program binaries
 * for the kernel cache, a queue per run slot, sub-buffers of the arena.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_exec.h"

#ifndef KF_HAVE_OPENCL

const char *kf_cl_unavailable(void) { return "kfuse was built without OpenCL (not found at configure time)"; }

kf_status kf_cl_run_kernel(const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out) {
    (void)k, (void)in, (void)out;
    return kf_fail(KF_ERR_NO_DEVICE, "%s", kf_cl_unavailable());
}

kf_status kf_cl_dev_open(int device, kf_dev **out) {
    (void)device;
    *out = NULL;
    return kf_fail(KF_ERR_NO_DEVICE, "no OpenCL device: %s", kf_cl_unavailable());
}

#else

/* 1.2: every call used here exists there without deprecation warnings. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

/* Devices counted across platforms in the order the ICD loader lists them;
 * device number `ordinal` (0: the first) and its platform. false, with
 * *count the devices there are, when there is no such device. */
static bool pick_device_at(int ordinal, cl_platform_id *pf, cl_device_id *dev, int *count) {
    cl_platform_id ids[16]; /* 16: more ICDs than any machine installs */
    cl_uint n = 0;
    *count = 0;
    if (ordinal < 0 || clGetPlatformIDs(16, ids, &n) != CL_SUCCESS) return false;
    for (cl_uint i = 0; i < n && i < 16; i++) {
        cl_device_id devs[64]; /* 64: more devices than one platform exposes */
        cl_uint nd = 0;
        if (clGetDeviceIDs(ids[i], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS) continue;
        if (nd > 64) nd = 64;
        if (ordinal < *count + (int)nd) {
            *pf = ids[i];
            *dev = devs[ordinal - *count];
            return true;
        }
        *count += (int)nd;
    }
    return false;
}

/* The first platform with any device, and that device; false when none. */
static bool pick_device(cl_platform_id *pf, cl_device_id *dev) {
    int count;
    return pick_device_at(0, pf, dev, &count);
}

const char *kf_cl_unavailable(void) {
    cl_platform_id pf;
    cl_device_id dev;
    return pick_device(&pf, &dev) ? NULL : "no OpenCL platform with a device (is an ICD such as PoCL installed?)";
}

static bool matches(const kf_cg_param *p, const kf_tensor *t) {
    if (!t || t->dtype != p->dtype || t->rank != p->rank || !t->data) return false;
    for (int d = 0; d < p->rank; d++)
        if (t->dims[d] != p->dims[d]) return false;
    return true;
}

/* Everything one run holds; released in one place. */
typedef struct run {
    cl_context ctx;
    cl_command_queue q;
    cl_program prog;
    cl_kernel kern;
    cl_mem *bufs; /* ins then outs */
    uint32_t nbufs;
} run;

static void run_release(run *r) {
    for (uint32_t i = 0; i < r->nbufs; i++)
        if (r->bufs[i]) clReleaseMemObject(r->bufs[i]);
    kf_free(r->bufs);
    if (r->kern) clReleaseKernel(r->kern);
    if (r->prog) clReleaseProgram(r->prog);
    if (r->q) clReleaseCommandQueue(r->q);
    if (r->ctx) clReleaseContext(r->ctx);
}

static kf_status cl_err(const char *what, cl_int e) {
    return kf_fail(KF_ERR_RUNTIME, "OpenCL %s failed (error %d)", what, (int)e);
}

/* The build log of prog on dev, malloc'ed (caller kf_free), or NULL. */
static char *build_log(cl_program prog, cl_device_id dev) {
    size_t len = 0;
    if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) != CL_SUCCESS) return NULL;
    char *log = kf_malloc(len + 1);
    if (!log) return NULL;
    if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, len, log, NULL) != CL_SUCCESS) len = 0;
    log[len] = 0;
    return log;
}

/* Build option for float division and sqrt correctly rounded, as the
 * reference evaluator and CUDA (prec-div) compute them, when the device
 * offers it: OpenCL 1.2 allows 2.5 ulp otherwise, and QuantizeLinear's
 * x / scale decides a rounding boundary bit for bit. */
static const char *cl_division_option(cl_device_id dev) {
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL) != CL_SUCCESS) return "";
    return (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt" : "";
}

static kf_status run_kernel(run *r, const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out) {
    cl_platform_id pf;
    cl_device_id dev;
    cl_int e = CL_SUCCESS;
    if (!pick_device(&pf, &dev)) return kf_fail(KF_ERR_NO_DEVICE, "%s", kf_cl_unavailable());
    for (uint32_t i = 0; i < k->nins; i++)
        if (!matches(&k->ins[i], in[i]))
            return kf_fail(KF_ERR_INVALID_ARG, "kernel input %u: tensor does not match the generated parameter", i);

    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)pf, 0};
    r->ctx = clCreateContext(props, 1, &dev, NULL, NULL, &e);
    if (!r->ctx) return cl_err("clCreateContext", e);
    r->q = clCreateCommandQueue(r->ctx, dev, 0, &e);
    if (!r->q) return cl_err("clCreateCommandQueue", e);

    char *src;
    KF_TRY(kf_cg_source(k, KF_CG_OPENCL, &src));
    const char *srcs[1] = {src};
    r->prog = clCreateProgramWithSource(r->ctx, 1, srcs, NULL, &e);
    kf_free(src);
    if (!r->prog) return cl_err("clCreateProgramWithSource", e);
    /* -cl-std=CL1.2: the dialect targets 1.2; no fast-math, so results keep
     * the accuracy the numerics policy tolerates */
    char opts[96]; /* the two options below */
    snprintf(opts, sizeof opts, "-cl-std=CL1.2%s", cl_division_option(dev));
    e = clBuildProgram(r->prog, 1, &dev, opts, NULL, NULL);
    if (e != CL_SUCCESS) {
        char *log = build_log(r->prog, dev);
        kf_status st = kf_fail(KF_ERR_COMPILE, "OpenCL build of %s failed (error %d):\n%s", k->name, (int)e,
                               log ? log : "(no log)");
        kf_free(log);
        return st;
    }
    r->kern = clCreateKernel(r->prog, k->name, &e);
    if (!r->kern) return cl_err("clCreateKernel", e);

    r->bufs = kf_calloc((size_t)k->nins + k->nouts + 1, sizeof *r->bufs);
    if (!r->bufs) return kf_fail(KF_ERR_NOMEM, "out of memory");
    r->nbufs = k->nins + k->nouts;
    for (uint32_t i = 0; i < r->nbufs; i++) {
        const kf_cg_param *p = i < k->nins ? &k->ins[i] : &k->outs[i - k->nins];
        size_t bytes = (size_t)p->numel * kf_dtype_size(p->dtype);
        if (bytes == 0) bytes = 1; /* OpenCL refuses empty buffers */
        if (i < k->nins)
            r->bufs[i] = clCreateBuffer(r->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, in[i]->data, &e);
        else
            r->bufs[i] = clCreateBuffer(r->ctx, CL_MEM_WRITE_ONLY, bytes, NULL, &e);
        if (!r->bufs[i]) return cl_err("clCreateBuffer", e);
        if ((e = clSetKernelArg(r->kern, i, sizeof(cl_mem), &r->bufs[i])) != CL_SUCCESS)
            return cl_err("clSetKernelArg", e);
    }
    int32_t err[KF_CG_ERR_INTS] = {0};
    if (k->nchecks) { /* kf_err (kf_cg_check) */
        r->bufs[r->nbufs] = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof err, err, &e);
        if (!r->bufs[r->nbufs]) return cl_err("clCreateBuffer", e);
        if ((e = clSetKernelArg(r->kern, r->nbufs, sizeof(cl_mem), &r->bufs[r->nbufs])) != CL_SUCCESS)
            return cl_err("clSetKernelArg", e);
        r->nbufs++;
    }
    if (k->numel > 0) {
        size_t global = k->numel < KF_CL_MAX_GLOBAL ? (size_t)k->numel : KF_CL_MAX_GLOBAL;
        size_t local = k->block; /* codegen's preferred work-group size; numel is a multiple */
        if (local) global -= global % local;
        e = clEnqueueNDRangeKernel(r->q, r->kern, 1, NULL, &global, local ? &local : NULL, 0, NULL, NULL);
        if (e != CL_SUCCESS) return cl_err("clEnqueueNDRangeKernel", e);
    }
    for (uint32_t o = 0; o < k->nouts; o++) {
        const kf_cg_param *p = &k->outs[o];
        KF_TRY(kf_tensor_alloc(&out[o], p->dtype, p->rank, p->dims));
        size_t bytes = (size_t)p->numel * kf_dtype_size(p->dtype);
        if (bytes == 0) continue;
        e = clEnqueueReadBuffer(r->q, r->bufs[k->nins + o], CL_TRUE, 0, bytes, out[o].data, 0, NULL, NULL);
        if (e != CL_SUCCESS) return cl_err("clEnqueueReadBuffer", e);
    }
    if ((e = clFinish(r->q)) != CL_SUCCESS) return cl_err("clFinish", e);
    if (k->nchecks) {
        e = clEnqueueReadBuffer(r->q, r->bufs[r->nbufs - 1], CL_TRUE, 0, sizeof err, err, 0, NULL, NULL);
        if (e != CL_SUCCESS) return cl_err("clEnqueueReadBuffer", e);
        if (err[0] > 0 && (uint32_t)err[0] <= k->nchecks)
            return kf_fail(KF_ERR_RUNTIME, "kernel %s: index %lld is out of range for a dimension of size %lld", k->name,
                           (long long)(int64_t)(((uint64_t)(uint32_t)err[2] << 32) | (uint32_t)err[1]),
                           (long long)k->checks[err[0] - 1].dim);
    }
    return KF_OK;
}

kf_status kf_cl_run_kernel(const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out) {
    if (k->min_block && k->block < k->min_block)
        return kf_fail(KF_ERR_INVALID_ARG, "kernel %s needs a work-group of at least %u work-items, not %u", k->name,
                       k->min_block, k->block);
    run r = {0};
    kf_status st = run_kernel(&r, k, in, out);
    run_release(&r);
    if (st)
        for (uint32_t o = 0; o < k->nouts; o++) kf_tensor_release(&out[o]);
    return st;
}

/* ---- the kf_dev of a compiled plan (exec.c) ------------------------------
 * One context for the device; each run slot has its own in-order queue. A
 * cl_kernel's arguments are state shared by every thread, so setting them
 * and enqueueing is one critical section per kernel (enqueue captures the
 * arguments; the kernel runs outside the lock). */

/* Recorded graphs (KFUSE_OPENCL_GRAPHS=record): OpenCL 1.2 has no graph
 * of its own, so between capture_begin and capture_end on a queue the
 * launches and copies enqueued there are kept, not run, and replay
 * enqueues them again in order. It gives a plan the same capture and
 * replay calls a CUDA device has, so the graph paths of exec.c (host runs
 * and device-side runs) are exercised where no CUDA device is. */
typedef struct cl_op {
    void *kern;                      /* NULL: a copy */
    void *bufs[KF_CG_MAX_PARAMS];    /* copy: dst, src */
    uint32_t nbufs, block;
    int64_t numel;                   /* copy: bytes */
} cl_op;

typedef struct cl_graph {
    void *queue; /* being recorded on this queue, NULL once ended */
    cl_op *ops;
    uint32_t n, cap;
    bool failed; /* an op could not be kept (out of memory): end says so */
} cl_graph;

#define CL_MAX_CAPTURES 64 /* queues recording at once: more than threads enqueue */

typedef struct cl_state {
    cl_platform_id pf;
    cl_device_id dev;
    cl_context ctx;
    bool record;                          /* KFUSE_OPENCL_GRAPHS=record */
    pthread_mutex_t gmu;                  /* guards open */
    cl_graph *open[CL_MAX_CAPTURES];      /* graphs being recorded */
} cl_state;

typedef struct cl_kern {
    cl_program prog;
    cl_kernel kern;
    pthread_mutex_t mu;
} cl_kern;

static cl_state *cst(kf_dev *d) { return d->state; }

static kf_status dev_build(kf_dev *d, const char *src, const char *entry, void **bin, size_t *len, char **log) {
    (void)entry;
    *bin = NULL, *len = 0, *log = NULL;
    cl_int e = CL_SUCCESS;
    cl_program prog = clCreateProgramWithSource(cst(d)->ctx, 1, &src, NULL, &e);
    if (!prog) return cl_err("clCreateProgramWithSource", e);
    e = clBuildProgram(prog, 1, &cst(d)->dev, d->options, NULL, NULL);
    *log = build_log(prog, cst(d)->dev);
    kf_status st = KF_OK;
    if (e != CL_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "OpenCL build of %s failed (error %d):\n%s", entry, (int)e, *log ? *log : "(no log)");
    size_t n = 0;
    if (!st && (e = clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL)) != CL_SUCCESS)
        st = cl_err("clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)", e);
    if (!st && n == 0) st = kf_fail(KF_ERR_COMPILE, "OpenCL build of %s gave no program binary", entry);
    unsigned char *b = NULL;
    if (!st && !(b = malloc(n))) st = kf_fail(KF_ERR_NOMEM, "out of memory for a %zu-byte program binary", n);
    if (!st && (e = clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof b, &b, NULL)) != CL_SUCCESS)
        st = cl_err("clGetProgramInfo(CL_PROGRAM_BINARIES)", e);
    clReleaseProgram(prog);
    if (st) {
        free(b);
        return st;
    }
    *bin = b, *len = n;
    return KF_OK;
}

static kf_status dev_load(kf_dev *d, const void *bin, size_t len, const char *entry, void **kern) {
    cl_int e = CL_SUCCESS, be = CL_SUCCESS;
    const unsigned char *b = bin;
    cl_kern *k = kf_calloc(1, sizeof *k);
    if (!k) return kf_fail(KF_ERR_NOMEM, "out of memory");
    k->prog = clCreateProgramWithBinary(cst(d)->ctx, 1, &cst(d)->dev, &len, &b, &be, &e);
    kf_status st = KF_OK;
    if (!k->prog || be != CL_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "OpenCL refused the program binary of %s (error %d/%d)", entry, (int)e, (int)be);
    else if ((e = clBuildProgram(k->prog, 1, &cst(d)->dev, d->options, NULL, NULL)) != CL_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "OpenCL build of the binary of %s failed (error %d)", entry, (int)e);
    else if (!(k->kern = clCreateKernel(k->prog, entry, &e)))
        st = cl_err("clCreateKernel", e);
    if (st) {
        if (k->prog) clReleaseProgram(k->prog);
        kf_free(k);
        return st;
    }
    pthread_mutex_init(&k->mu, NULL);
    *kern = k;
    return KF_OK;
}

static void dev_unload(kf_dev *d, void *kern) {
    (void)d;
    cl_kern *k = kern;
    if (!k) return;
    clReleaseKernel(k->kern);
    clReleaseProgram(k->prog);
    pthread_mutex_destroy(&k->mu);
    kf_free(k);
}

static kf_status dev_stream_new(kf_dev *d, void **s) {
    cl_int e = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(cst(d)->ctx, cst(d)->dev, 0, &e);
    if (!q) return cl_err("clCreateCommandQueue", e);
    *s = q;
    return KF_OK;
}

static void dev_stream_free(kf_dev *d, void *s) {
    (void)d;
    if (s) clReleaseCommandQueue((cl_command_queue)s);
}

static kf_status dev_alloc(kf_dev *d, size_t bytes, void **buf) {
    cl_int e = CL_SUCCESS;
    /* OpenCL refuses empty buffers */
    cl_mem m = clCreateBuffer(cst(d)->ctx, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &e);
    if (!m) return kf_fail(e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_HOST_MEMORY ? KF_ERR_NOMEM : KF_ERR_RUNTIME,
                           "OpenCL clCreateBuffer of %zu bytes failed (error %d)", bytes, (int)e);
    *buf = m;
    return KF_OK;
}

static void dev_free(kf_dev *d, void *buf) {
    (void)d;
    if (buf) clReleaseMemObject((cl_mem)buf);
}

static kf_status dev_view(kf_dev *d, void *base, size_t off, size_t len, void **buf) {
    (void)d;
    cl_int e = CL_SUCCESS;
    cl_buffer_region r = {off, len ? len : 1};
    cl_mem m = clCreateSubBuffer((cl_mem)base, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
    if (!m) return kf_fail(KF_ERR_RUNTIME, "OpenCL clCreateSubBuffer at %zu (+%zu) failed (error %d)", off, len, (int)e);
    *buf = m;
    return KF_OK;
}

static kf_status dev_upload(kf_dev *d, void *s, void *buf, const void *src, size_t n) {
    (void)d;
    if (n == 0) return KF_OK;
    /* blocking: the host tensor may be released right after */
    cl_int e = clEnqueueWriteBuffer((cl_command_queue)s, (cl_mem)buf, CL_TRUE, 0, n, src, 0, NULL, NULL);
    return e == CL_SUCCESS ? KF_OK : cl_err("clEnqueueWriteBuffer", e);
}

static kf_status dev_download(kf_dev *d, void *s, void *buf, void *dst, size_t n) {
    (void)d;
    if (n == 0) return KF_OK;
    cl_int e = clEnqueueReadBuffer((cl_command_queue)s, (cl_mem)buf, CL_TRUE, 0, n, dst, 0, NULL, NULL);
    return e == CL_SUCCESS ? KF_OK : cl_err("clEnqueueReadBuffer", e);
}

/* The graph being recorded on queue s, or NULL. */
static cl_graph *recording(kf_dev *d, void *s) {
    cl_state *c = cst(d);
    if (!c->record) return NULL;
    cl_graph *g = NULL;
    pthread_mutex_lock(&c->gmu);
    for (int i = 0; i < CL_MAX_CAPTURES && !g; i++)
        if (c->open[i] && c->open[i]->queue == s) g = c->open[i];
    pthread_mutex_unlock(&c->gmu);
    return g;
}

/* Keeps op in graph g (in capture: only its thread adds to it). */
static void record_op(cl_graph *g, const cl_op *op) {
    if (g->n == g->cap) {
        uint32_t cap = g->cap ? 2 * g->cap : 16;
        cl_op *ops = kf_realloc(g->ops, (size_t)cap * sizeof *ops);
        if (!ops) {
            g->failed = true;
            return;
        }
        g->ops = ops, g->cap = cap;
    }
    g->ops[g->n++] = *op;
}

static kf_status enqueue_launch(void *s, void *kern, void *const *bufs, uint32_t nbufs, int64_t numel, uint32_t block);

static kf_status dev_launch(kf_dev *d, void *s, void *kern, void *const *bufs, uint32_t nbufs, int64_t numel,
                            uint32_t block) {
    if (numel <= 0) return KF_OK;
    cl_graph *g = recording(d, s);
    if (g) {
        if (nbufs > KF_CG_MAX_PARAMS) return kf_fail(KF_ERR_INTERNAL, "kernel with %u buffers", nbufs);
        cl_op op = {kern, {0}, nbufs, block, numel};
        memcpy(op.bufs, bufs, nbufs * sizeof *bufs);
        record_op(g, &op);
        return KF_OK;
    }
    return enqueue_launch(s, kern, bufs, nbufs, numel, block);
}

static kf_status enqueue_launch(void *s, void *kern, void *const *bufs, uint32_t nbufs, int64_t numel, uint32_t block) {
    cl_kern *k = kern;
    cl_int e = CL_SUCCESS;
    const char *what = "clSetKernelArg";
    size_t global = numel < KF_CL_MAX_GLOBAL ? (size_t)numel : KF_CL_MAX_GLOBAL;
    size_t local = block; /* the body's work-group size (block reduces); numel is a multiple */
    if (local) global -= global % local;
    pthread_mutex_lock(&k->mu);
    for (uint32_t i = 0; i < nbufs && e == CL_SUCCESS; i++) e = clSetKernelArg(k->kern, i, sizeof(cl_mem), &bufs[i]);
    if (e == CL_SUCCESS) {
        what = "clEnqueueNDRangeKernel";
        e = clEnqueueNDRangeKernel((cl_command_queue)s, k->kern, 1, NULL, &global, local ? &local : NULL, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&k->mu);
    return e == CL_SUCCESS ? KF_OK : cl_err(what, e);
}

static kf_status dev_sync(kf_dev *d, void *s) {
    (void)d;
    cl_int e = clFinish((cl_command_queue)s);
    return e == CL_SUCCESS ? KF_OK : cl_err("clFinish", e);
}

static void *dev_context(kf_dev *d) { return cst(d)->ctx; }

/* A caller's queue: of this context and device, and in order (a plan's
 * launches depend on each other through the arena). */
static kf_status dev_stream_check(kf_dev *d, void *s) {
    cl_context ctx = NULL;
    cl_device_id dev = NULL;
    cl_command_queue_properties props = 0;
    cl_command_queue q = s;
    cl_int e = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL);
    if (e == CL_SUCCESS) e = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof dev, &dev, NULL);
    if (e == CL_SUCCESS) e = clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (e != CL_SUCCESS) return kf_fail(KF_ERR_INVALID_ARG, "the stream is not an OpenCL command queue (error %d)", (int)e);
    if (ctx != cst(d)->ctx || dev != cst(d)->dev)
        return kf_fail(KF_ERR_INVALID_ARG, "the command queue belongs to another %s than the plan's "
                       "(make it in kf_compiled_device_context's context)", ctx != cst(d)->ctx ? "context" : "device");
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return kf_fail(KF_ERR_INVALID_ARG, "the command queue runs out of order; a plan's launches need an in-order queue");
    return KF_OK;
}

static kf_status dev_buf_check(kf_dev *d, void *buf, size_t n) {
    cl_context ctx = NULL;
    size_t size = 0;
    cl_int e = clGetMemObjectInfo((cl_mem)buf, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
    if (e == CL_SUCCESS) e = clGetMemObjectInfo((cl_mem)buf, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (e != CL_SUCCESS) return kf_fail(KF_ERR_INVALID_ARG, "the buffer is not an OpenCL memory object (error %d)", (int)e);
    if (ctx != cst(d)->ctx)
        return kf_fail(KF_ERR_INVALID_ARG, "the buffer belongs to another context than the plan's");
    if (size < n) return kf_fail(KF_ERR_INVALID_ARG, "the buffer holds %zu bytes, the tensor needs %zu", size, n);
    return KF_OK;
}

static kf_status dev_copy(kf_dev *d, void *s, void *dst, void *src, size_t n) {
    if (n == 0) return KF_OK;
    cl_graph *g = recording(d, s);
    if (g) {
        cl_op op = {NULL, {dst, src}, 2, 0, (int64_t)n};
        record_op(g, &op);
        return KF_OK;
    }
    cl_int e = clEnqueueCopyBuffer((cl_command_queue)s, (cl_mem)src, (cl_mem)dst, 0, 0, n, 0, NULL, NULL);
    return e == CL_SUCCESS ? KF_OK : cl_err("clEnqueueCopyBuffer", e);
}

static kf_status dev_capture_begin(kf_dev *d, void *s) {
    cl_state *c = cst(d);
    cl_graph *g = kf_calloc(1, sizeof *g);
    if (!g) return kf_fail(KF_ERR_NOMEM, "out of memory");
    g->queue = s;
    pthread_mutex_lock(&c->gmu);
    int i = 0;
    while (i < CL_MAX_CAPTURES && c->open[i]) i++;
    if (i < CL_MAX_CAPTURES) c->open[i] = g;
    pthread_mutex_unlock(&c->gmu);
    if (i < CL_MAX_CAPTURES) return KF_OK;
    kf_free(g);
    return kf_fail(KF_ERR_UNSUPPORTED, "more than %d queues record graphs at once", CL_MAX_CAPTURES);
}

static void graph_free(kf_dev *d, void *graph) {
    (void)d;
    cl_graph *g = graph;
    if (g) kf_free(g->ops);
    kf_free(g);
}

static kf_status dev_capture_end(kf_dev *d, void *s, void **graph) {
    cl_state *c = cst(d);
    cl_graph *g = NULL;
    pthread_mutex_lock(&c->gmu);
    for (int i = 0; i < CL_MAX_CAPTURES && !g; i++)
        if (c->open[i] && c->open[i]->queue == s) g = c->open[i], c->open[i] = NULL;
    pthread_mutex_unlock(&c->gmu);
    *graph = NULL;
    if (!g) return kf_fail(KF_ERR_INTERNAL, "no graph is being recorded on this queue");
    g->queue = NULL;
    if (g->failed) {
        graph_free(d, g);
        return kf_fail(KF_ERR_NOMEM, "out of memory recording a graph");
    }
    *graph = g;
    return KF_OK;
}

static kf_status dev_replay(kf_dev *d, void *s, void *graph) {
    const cl_graph *g = graph;
    for (uint32_t i = 0; i < g->n; i++) {
        const cl_op *op = &g->ops[i];
        if (op->kern) KF_TRY(dev_launch(d, s, op->kern, op->bufs, op->nbufs, op->numel, op->block));
        else KF_TRY(dev_copy(d, s, op->bufs[0], op->bufs[1], (size_t)op->numel));
    }
    return KF_OK;
}

/* Any in-order queue of the plan's context; none is the caller's own capture. */
static bool dev_can_capture(kf_dev *d, void *s) { return !recording(d, s); }

static void dev_close(kf_dev *d) {
    if (!d) return;
    if (d->state && cst(d)->record) pthread_mutex_destroy(&cst(d)->gmu);
    if (d->state && cst(d)->ctx) clReleaseContext(cst(d)->ctx);
    kf_free(d->state);
    kf_free(d);
}

kf_status kf_cl_dev_open(int device, kf_dev **out) {
    *out = NULL;
    kf_dev *d = kf_calloc(1, sizeof *d);
    cl_state *c = kf_calloc(1, sizeof *c);
    if (!d || !c) {
        kf_free(d), kf_free(c);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    d->state = c;
    int count = 0;
    if (!pick_device_at(device, &c->pf, &c->dev, &count)) {
        dev_close(d);
        if (count > 0 || device < 0)
            return kf_fail(KF_ERR_NO_DEVICE, "no OpenCL device %d: there %s %d (0 to %d)", device,
                           count == 1 ? "is" : "are", count, count - 1);
        return kf_fail(KF_ERR_NO_DEVICE, "no OpenCL device: %s", kf_cl_unavailable());
    }
    cl_int e = CL_SUCCESS;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)c->pf, 0};
    if (!(c->ctx = clCreateContext(props, 1, &c->dev, NULL, NULL, &e))) {
        dev_close(d);
        return cl_err("clCreateContext", e);
    }
    /* 128 bytes each: device names and version strings are far shorter */
    char name[128] = "", ver[128] = "", drv[128] = "", pver[128] = "";
    clGetDeviceInfo(c->dev, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    clGetDeviceInfo(c->dev, CL_DEVICE_VERSION, sizeof ver - 1, ver, NULL);
    clGetDeviceInfo(c->dev, CL_DRIVER_VERSION, sizeof drv - 1, drv, NULL);
    clGetPlatformInfo(c->pf, CL_PLATFORM_VERSION, sizeof pver - 1, pver, NULL);
    cl_uint bits = 0;
    clGetDeviceInfo(c->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL);
    d->name = "opencl";
    snprintf(d->arch, sizeof d->arch, "opencl:%s|%s|%s", name, ver, drv);
    snprintf(d->compiler, sizeof d->compiler, "%s", pver);
    /* -cl-std=CL1.2: the dialect targets 1.2; no fast-math, so results keep
     * the accuracy the numerics policy tolerates */
    snprintf(d->options, sizeof d->options, "-cl-std=CL1.2%s", cl_division_option(c->dev));
    d->target = KF_CG_OPENCL;
    /* at least 256 bytes: aligned for any vector type and for CUDA alike */
    d->align = bits / 8 > 256 ? bits / 8 : 256;
    d->can_run = true;
    d->build = dev_build, d->load = dev_load, d->unload = dev_unload;
    d->stream_new = dev_stream_new, d->stream_free = dev_stream_free;
    d->alloc = dev_alloc, d->free = dev_free, d->view = dev_view, d->view_free = dev_free;
    d->upload = dev_upload, d->download = dev_download, d->launch = dev_launch, d->sync = dev_sync;
    d->context = dev_context, d->stream_check = dev_stream_check, d->buf_check = dev_buf_check, d->copy = dev_copy;
    d->close = dev_close;
    const char *rec = getenv("KFUSE_OPENCL_GRAPHS");
    if (rec && !strcmp(rec, "record") && !pthread_mutex_init(&c->gmu, NULL)) {
        c->record = true;
        d->capture_begin = dev_capture_begin, d->capture_end = dev_capture_end;
        d->replay = dev_replay, d->graph_free = graph_free, d->can_capture = dev_can_capture;
    }
    *out = d;
    return KF_OK;
}

#endif
