/*
 * opencl.c: the OpenCL backend of kernels/: takes a kernel codegen/ wrote,
 * prepends the OpenCL prelude, builds it through the ICD loader (PoCL on
 * the CPU in CI, any GPU driver elsewhere) and runs it on host tensors.
 * This slice creates a context per run (no cache, no plan); that is the
 * correctness path the tests drive, not the fast one.
 */
#include <stdio.h>
#include <string.h>

#include "kf_kernels.h"

#ifndef KF_HAVE_OPENCL

const char *kf_cl_unavailable(void) { return "kfuse was built without OpenCL (not found at configure time)"; }

kf_status kf_cl_run_kernel(const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out) {
    (void)k, (void)in, (void)out;
    return kf_fail(KF_ERR_NO_DEVICE, "%s", kf_cl_unavailable());
}

#else

/* 1.2: every call used here exists there without deprecation warnings. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

/* The first platform with any device, and that device; false when none. */
static bool pick_device(cl_platform_id *pf, cl_device_id *dev) {
    cl_platform_id ids[16]; /* 16: more ICDs than any machine installs */
    cl_uint n = 0;
    if (clGetPlatformIDs(16, ids, &n) != CL_SUCCESS) return false;
    for (cl_uint i = 0; i < n && i < 16; i++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(ids[i], CL_DEVICE_TYPE_ALL, 1, dev, &nd) == CL_SUCCESS && nd > 0) {
            *pf = ids[i];
            return true;
        }
    }
    return false;
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
    e = clBuildProgram(r->prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
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
    if (k->numel > 0) {
        size_t global = k->numel < KF_CL_MAX_GLOBAL ? (size_t)k->numel : KF_CL_MAX_GLOBAL;
        e = clEnqueueNDRangeKernel(r->q, r->kern, 1, NULL, &global, NULL, 0, NULL, NULL);
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
    return KF_OK;
}

kf_status kf_cl_run_kernel(const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out) {
    run r = {0};
    kf_status st = run_kernel(&r, k, in, out);
    run_release(&r);
    if (st)
        for (uint32_t o = 0; o < k->nouts; o++) kf_tensor_release(&out[o]);
    return st;
}

#endif
