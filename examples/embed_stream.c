/*
 * embed_stream.c: a runtime that keeps its tensors on the device and runs
 * kfuse on its own OpenCL queue. Compiles a model for OpenCL, makes a
 * queue and buffers in the plan's context (kf_compiled_device_context),
 * writes random float inputs into its buffers itself, enqueues the model
 * with kf_run_device, waits with kf_sync, reads the outputs back itself
 * and compares them with kf_run's, byte for byte. With KFUSE_TRACE=host
 * the library prints every host copy and wait it makes; the example
 * counts them and fails if kf_run_device made any.
 *   embed_stream MODEL.onnx [SHAPE...]   SHAPE per input, e.g. 2,3,8,8;
 *                                        without them each input takes its
 *                                        declared shape, symbolic dims 1
 * The CUDA path of kf_run_device is the same call with a CUstream and
 * CUdeviceptr buffers in the device's primary context.
 */
#define _POSIX_C_SOURCE 200809L /* dup, fileno, setenv */
#define CL_TARGET_OPENCL_VERSION 120

#include <CL/cl.h>
#include <kfuse/kfuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_INPUTS 16  /* plenty for an example; kfuse itself has no such limit */
#define MAX_OUTPUTS 16

static int die(const char *what, kf_status st) {
    fprintf(stderr, "embed_stream: %s: %s: %s\n", what, kf_status_name(st), kf_last_error());
    return 1;
}

static int cl_die(const char *what, cl_int e) {
    fprintf(stderr, "embed_stream: %s failed (OpenCL error %d)\n", what, (int)e);
    return 1;
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
    o.backend = KF_BACKEND_OPENCL;
    if ((st = kf_compile_ex(m, &o, &c))) return die("compile", st);
    kf_model_free(m);
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    if (nin > MAX_INPUTS || nout > MAX_OUTPUTS || (argc > 2 && argc - 2 != nin))
        return fprintf(stderr, "embed_stream: the model has %d inputs, %d outputs\n", nin, nout), 2;

    /* host inputs: random floats of the given or declared shapes */
    kf_host_tensor in[MAX_INPUTS];
    int64_t dims[MAX_INPUTS][8];
    size_t in_bytes[MAX_INPUTS];
    srand(42);
    for (int i = 0; i < nin; i++) {
        int dtype, rank;
        if ((st = kf_compiled_input_info(c, i, &dtype, &rank, dims[i]))) return die("input info", st);
        if (dtype != 1 || rank < 0) return fprintf(stderr, "embed_stream: input %d is not a float tensor of known rank\n", i), 2;
        in[i] = (kf_host_tensor){.dtype = 1, .rank = argc > 2 ? 0 : rank, .dims = dims[i]};
        for (int d = 0; argc == 2 && d < rank; d++) dims[i][d] = dims[i][d] < 0 ? 1 : dims[i][d];
        for (char *s = argc > 2 ? argv[2 + i] : "", *end; *s && in[i].rank < 8; s = end + (*end == ',')) {
            dims[i][in[i].rank] = strtoll(s, &end, 10);
            if (end == s || dims[i][in[i].rank] < 0) return fprintf(stderr, "embed_stream: bad shape %s\n", argv[2 + i]), 2;
            in[i].rank++;
        }
        size_t n = 1;
        for (int d = 0; d < in[i].rank; d++) n *= (size_t)dims[i][d];
        float *x = malloc(n * sizeof *x + 1);
        if (!x) return fprintf(stderr, "embed_stream: out of memory\n"), 1;
        for (size_t k = 0; k < n; k++) x[k] = (float)rand() / RAND_MAX * 2 - 1;
        in[i].data = x;
        in_bytes[i] = n * sizeof *x;
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

    /* the caller's side: a queue and buffers in the plan's context */
    void *vctx = NULL;
    if ((st = kf_compiled_device_context(c, &vctx))) return die("device context", st);
    cl_context ctx = vctx;
    cl_device_id dev;
    cl_int e = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof dev, &dev, NULL);
    if (e != CL_SUCCESS) return cl_die("clGetContextInfo", e);
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &e);
    if (!q) return cl_die("clCreateCommandQueue", e);
    kf_device_tensor din[MAX_INPUTS], dout[MAX_OUTPUTS];
    cl_mem bin[MAX_INPUTS], bout[MAX_OUTPUTS];
    int64_t odims[MAX_OUTPUTS][8];
    for (int i = 0; i < nin; i++) {
        if (!(bin[i] = clCreateBuffer(ctx, CL_MEM_READ_ONLY, in_bytes[i] ? in_bytes[i] : 1, NULL, &e)))
            return cl_die("clCreateBuffer", e);
        /* not blocking: the queue orders it before the run */
        if (in_bytes[i] && (e = clEnqueueWriteBuffer(q, bin[i], CL_FALSE, 0, in_bytes[i], in[i].data, 0, NULL, NULL)))
            return cl_die("clEnqueueWriteBuffer", e);
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
        if (!(bout[k] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n ? n : 1, NULL, &e))) return cl_die("clCreateBuffer", e);
        dout[k] = (kf_device_tensor){dtype, rank, odims[k], bout[k], n};
    }

    saved = begin_capture(&cap);
    st = kf_run_device(c, q, din, nin, dout, nout);
    int host_in_device = end_capture(cap, saved);
    if (st) return die("kf_run_device", st);
    printf("kf_run_device: %d host copies and waits traced\n", host_in_device);
    if ((st = kf_sync(c, q))) return die("kf_sync", st);

    int bad = host_in_device != 0 || host_in_run <= 0; /* none inside; and the trace does print */
    for (int k = 0; k < nout; k++) {
        void *got = malloc(dout[k].nbytes + 1);
        if (!got) return fprintf(stderr, "embed_stream: out of memory\n"), 1;
        if (dout[k].nbytes && (e = clEnqueueReadBuffer(q, bout[k], CL_TRUE, 0, dout[k].nbytes, got, 0, NULL, NULL)))
            return cl_die("clEnqueueReadBuffer", e);
        int same = dout[k].nbytes == want[k].nbytes && !memcmp(got, want[k].data, want[k].nbytes);
        printf("%s: dtype %d [", kf_compiled_output_name(c, k), dout[k].dtype);
        for (int d = 0; d < dout[k].rank; d++) printf("%s%lld", d ? "," : "", (long long)odims[k][d]);
        printf("] %s kf_run's\n", same ? "equal to" : "DIFFERENT from");
        bad |= !same;
        free(got);
        kf_output_release(&want[k]);
        clReleaseMemObject(bout[k]);
    }
    for (int i = 0; i < nin; i++) {
        clReleaseMemObject(bin[i]);
        free((void *)in[i].data);
    }
    clReleaseCommandQueue(q);
    kf_compiled_free(c);
    printf("embed_stream: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
