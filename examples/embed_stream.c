/*
 * embed_stream.c: a runtime that keeps its tensors on the device and runs
 * kfuse on its own queue (OpenCL) or stream (CUDA, built with EMBED_CUDA).
 * Compiles a model for that backend, makes a queue/stream and buffers in
 * the plan's context (kf_compiled_device_context), writes random inputs
 * into its buffers itself (floats in [-1, 1), integers 0 or 1), enqueues
 * the model with kf_run_device three times with the same buffers (on CUDA
 * the second run is captured into a CUDA Graph and the third replays it),
 * waits with kf_sync, reads the outputs back itself and compares them with
 * kf_run's, byte for byte. With KFUSE_TRACE=host the library prints every
 * host copy and wait it makes; the example counts them and fails if
 * kf_run_device made any. Then it times RUNS more runs (default 50) on the
 * same buffers and prints the microseconds per run.
 *   embed_stream MODEL.onnx [SHAPE...]   SHAPE per input, e.g. 2,3,8,8;
 *                                        without them each input takes its
 *                                        declared shape, symbolic dims 1
 */
#define _POSIX_C_SOURCE 200809L /* dup, fileno, setenv, clock_gettime */

#include <kfuse/kfuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_INPUTS 16  /* plenty for an example; kfuse itself has no such limit */
#define MAX_OUTPUTS 16

static int die(const char *what, kf_status st) {
    fprintf(stderr, "embed_stream: %s: %s: %s\n", what, kf_status_name(st), kf_last_error());
    return 1;
}

static int dev_die(const char *what, int e) {
    fprintf(stderr, "embed_stream: %s failed (error %d)\n", what, e);
    return 1;
}

/* ---- the caller's side of the device: a queue or stream and buffers in
 * the plan's context. Each call returns 0 or the API's error code. */
#ifdef EMBED_CUDA
#include <cuda.h>
#define BACKEND KF_BACKEND_CUDA
typedef struct side {
    CUstream stream;
} side;

static int side_open(side *sd, void *ctx) {
    CUresult e = cuCtxSetCurrent((CUcontext)ctx);
    return e ? (int)e : (int)cuStreamCreate(&sd->stream, CU_STREAM_NON_BLOCKING);
}
static void *side_stream(side *sd) { return sd->stream; }
static int side_alloc(side *sd, size_t n, void **buf) {
    (void)sd;
    CUdeviceptr p = 0;
    CUresult e = cuMemAlloc(&p, n ? n : 1);
    *buf = (void *)(uintptr_t)p;
    return (int)e;
}
/* not waiting: the stream orders it before the run */
static int side_write(side *sd, void *buf, const void *src, size_t n) {
    return n ? (int)cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)buf, src, n, sd->stream) : 0;
}
static int side_read(side *sd, void *buf, void *dst, size_t n) {
    CUresult e = n ? cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)buf, n, sd->stream) : CUDA_SUCCESS;
    return e ? (int)e : (int)cuStreamSynchronize(sd->stream);
}
static void side_free(side *sd, void *buf) {
    (void)sd;
    cuMemFree((CUdeviceptr)(uintptr_t)buf);
}
static void side_close(side *sd) { cuStreamDestroy(sd->stream); }
#else
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define BACKEND KF_BACKEND_OPENCL
typedef struct side {
    cl_context ctx;
    cl_command_queue q;
} side;

static int side_open(side *sd, void *ctx) {
    cl_device_id dev;
    sd->ctx = ctx;
    cl_int e = clGetContextInfo(sd->ctx, CL_CONTEXT_DEVICES, sizeof dev, &dev, NULL);
    if (e == CL_SUCCESS) sd->q = clCreateCommandQueue(sd->ctx, dev, 0, &e);
    return (int)e;
}
static void *side_stream(side *sd) { return sd->q; }
static int side_alloc(side *sd, size_t n, void **buf) {
    cl_int e = CL_SUCCESS;
    *buf = clCreateBuffer(sd->ctx, CL_MEM_READ_WRITE, n ? n : 1, NULL, &e);
    return (int)e;
}
/* not blocking: the queue orders it before the run */
static int side_write(side *sd, void *buf, const void *src, size_t n) {
    return n ? (int)clEnqueueWriteBuffer(sd->q, buf, CL_FALSE, 0, n, src, 0, NULL, NULL) : 0;
}
static int side_read(side *sd, void *buf, void *dst, size_t n) {
    return n ? (int)clEnqueueReadBuffer(sd->q, buf, CL_TRUE, 0, n, dst, 0, NULL, NULL) : 0;
}
static void side_free(side *sd, void *buf) {
    (void)sd;
    clReleaseMemObject(buf);
}
static void side_close(side *sd) { clReleaseCommandQueue(sd->q); }
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Bytes of one element of ONNX dtype dt (numeric types up to bfloat16);
 * 0 for others. */
static size_t elem_size(int dt) {
    static const unsigned char size[17] = {0, 4, 1, 1, 2, 2, 4, 8, 0, 1, 2, 8, 4, 8, 8, 16, 2};
    return dt > 0 && dt < 17 ? size[dt] : 0;
}

/* The library's trace lines ("kfuse: host: ...") while stderr points at a
 * temporary file: begin_capture returns the saved stderr, end_capture the
 * number of such lines (and echoes them, indented). */
static int begin_capture(FILE **f) {
    fflush(stderr);
    *f = tmpfile();
    int saved = dup(2);
    if (*f && saved >= 0) dup2(fileno(*f), 2);
    return saved;
}

static int end_capture(FILE *f, int saved) {
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    if (!f) return -1;
    rewind(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "kfuse: host:")) {
            n++;
            if (n <= 3) fprintf(stderr, "    %s", line);
        }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: embed_stream MODEL.onnx [SHAPE...]\n"), 2;
    /* the host trace, added to whatever the caller traces */
    const char *tr = getenv("KFUSE_TRACE");
    char trace[256];
    snprintf(trace, sizeof trace, "%s%shost", tr ? tr : "", tr && tr[0] ? "," : "");
    setenv("KFUSE_TRACE", trace, 1);

    kf_model *m;
    kf_compiled *c;
    kf_status st;
    if ((st = kf_model_load(argv[1], &m))) return die("load", st);
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = BACKEND;
    if ((st = kf_compile_ex(m, &o, &c))) return die("compile", st);
    kf_model_free(m);
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    if (nin > MAX_INPUTS || nout > MAX_OUTPUTS || (argc > 2 && argc - 2 != nin))
        return fprintf(stderr, "embed_stream: the model has %d inputs, %d outputs\n", nin, nout), 2;

    /* host inputs of the given or declared shapes: random floats, or
     * integers 0 and 1 (valid ids, token types and masks alike) */
    kf_host_tensor in[MAX_INPUTS];
    int64_t dims[MAX_INPUTS][8];
    size_t in_bytes[MAX_INPUTS];
    srand(42);
    for (int i = 0; i < nin; i++) {
        int dtype, rank;
        if ((st = kf_compiled_input_info(c, i, &dtype, &rank, dims[i]))) return die("input info", st);
        if ((dtype != 1 && dtype != 7) || rank < 0)
            return fprintf(stderr, "embed_stream: input %d is not a float or int64 tensor of known rank\n", i), 2;
        in[i] = (kf_host_tensor){.dtype = dtype, .rank = argc > 2 ? 0 : rank, .dims = dims[i]};
        for (int d = 0; argc == 2 && d < rank; d++) dims[i][d] = dims[i][d] < 0 ? 1 : dims[i][d];
        for (char *s = argc > 2 ? argv[2 + i] : "", *end; *s && in[i].rank < 8; s = end + (*end == ',')) {
            dims[i][in[i].rank] = strtoll(s, &end, 10);
            if (end == s || dims[i][in[i].rank] < 0) return fprintf(stderr, "embed_stream: bad shape %s\n", argv[2 + i]), 2;
            in[i].rank++;
        }
        size_t n = 1;
        for (int d = 0; d < in[i].rank; d++) n *= (size_t)dims[i][d];
        in_bytes[i] = n * elem_size(dtype);
        void *x = malloc(in_bytes[i] + 1);
        if (!x) return fprintf(stderr, "embed_stream: out of memory\n"), 1;
        for (size_t k = 0; k < n; k++) {
            if (dtype == 1) ((float *)x)[k] = (float)rand() / RAND_MAX * 2 - 1;
            else ((int64_t *)x)[k] = rand() % 2;
        }
        in[i].data = x;
    }

    /* kf_run first: the answer to compare with, and the kernels for these
     * shapes compiled before the device-side run */
    kf_output want[MAX_OUTPUTS] = {{0}};
    FILE *cap;
    int saved = begin_capture(&cap);
    st = kf_run(c, in, nin, want, nout);
    int host_in_run = end_capture(cap, saved);
    if (st) return die("kf_run", st);
    printf("kf_run: %d host copies and waits traced\n", host_in_run);

    /* the caller's side: a queue or stream and buffers in the plan's context */
    void *ctx = NULL;
    side sd;
    int e;
    if ((st = kf_compiled_device_context(c, &ctx))) return die("device context", st);
    if ((e = side_open(&sd, ctx))) return dev_die("making a queue or stream", e);
    kf_device_tensor din[MAX_INPUTS], dout[MAX_OUTPUTS];
    void *bin[MAX_INPUTS], *bout[MAX_OUTPUTS];
    int64_t odims[MAX_OUTPUTS][8];
    for (int i = 0; i < nin; i++) {
        if ((e = side_alloc(&sd, in_bytes[i], &bin[i]))) return dev_die("allocating an input buffer", e);
        if ((e = side_write(&sd, bin[i], in[i].data, in_bytes[i]))) return dev_die("writing an input", e);
        din[i] = (kf_device_tensor){in[i].dtype, in[i].rank, in[i].dims, bin[i], in_bytes[i]};
    }
    for (int k = 0; k < nout; k++) { /* sized from the input shapes alone */
        int dtype, rank;
        if ((st = kf_compiled_output_info(c, in, nin, k, &dtype, &rank, odims[k]))) return die("output info", st);
        size_t n = elem_size(dtype);
        if (!n) return fprintf(stderr, "embed_stream: output %d has dtype %d\n", k, dtype), 1;
        for (int d = 0; d < rank; d++) {
            if (odims[k][d] < 0) return fprintf(stderr, "embed_stream: output %d's size depends on values\n", k), 1;
            n *= (size_t)odims[k][d];
        }
        if ((e = side_alloc(&sd, n, &bout[k]))) return dev_die("allocating an output buffer", e);
        dout[k] = (kf_device_tensor){dtype, rank, odims[k], bout[k], n};
    }

    /* three runs with the same buffers: launch by launch, captured, replayed */
    int host_in_device = 0;
    for (int r = 0; r < 3; r++) {
        saved = begin_capture(&cap);
        st = kf_run_device(c, side_stream(&sd), din, nin, dout, nout);
        host_in_device += end_capture(cap, saved);
        if (st) return die("kf_run_device", st);
    }
    printf("kf_run_device, 3 runs: %d host copies and waits traced\n", host_in_device);
    if ((st = kf_sync(c, side_stream(&sd)))) return die("kf_sync", st);

    int bad = host_in_device != 0 || host_in_run <= 0; /* none inside; and the trace does print */
    for (int k = 0; k < nout; k++) {
        void *got = malloc(dout[k].nbytes + 1);
        if (!got) return fprintf(stderr, "embed_stream: out of memory\n"), 1;
        if ((e = side_read(&sd, bout[k], got, dout[k].nbytes))) return dev_die("reading an output", e);
        int same = dout[k].nbytes == want[k].nbytes && !memcmp(got, want[k].data, want[k].nbytes);
        printf("%s: dtype %d [", kf_compiled_output_name(c, k), dout[k].dtype);
        for (int d = 0; d < dout[k].rank; d++) printf("%s%lld", d ? "," : "", (long long)odims[k][d]);
        printf("] %s kf_run's\n", same ? "equal to" : "DIFFERENT from");
        bad |= !same;
        free(got);
        kf_output_release(&want[k]);
    }

    /* enqueue-to-finish time per run on the same buffers */
    const char *rs = getenv("RUNS");
    int runs = rs && atoi(rs) > 0 ? atoi(rs) : 50;
    unsetenv("KFUSE_TRACE");
    double t0 = now_s();
    for (int r = 0; r < runs && !st; r++) st = kf_run_device(c, side_stream(&sd), din, nin, dout, nout);
    if (st || (st = kf_sync(c, side_stream(&sd)))) return die("timed runs", st);
    printf("kf_run_device: %.1f us per run (%d runs, same buffers)\n", (now_s() - t0) * 1e6 / runs, runs);

    for (int k = 0; k < nout; k++) side_free(&sd, bout[k]);
    for (int i = 0; i < nin; i++) {
        side_free(&sd, bin[i]);
        free((void *)in[i].data);
    }
    side_close(&sd);
    kf_compiled_free(c);
    printf("embed_stream: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
