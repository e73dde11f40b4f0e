/*
 * test_api_device.c: device-side runs (kf_run_device, kf_sync,
 * kf_compiled_device_context) on OpenCL: every bundled model run from the
 * test's own buffers on its own queue equals kf_run byte for byte; no host
 * copy or wait happens inside the call (KFUSE_TRACE=host); wrong
 * descriptions, queues and buffers are typed errors; a plan with a host
 * step is refused naming the node; a bad Gather index waits for kf_sync;
 * threads with a queue each agree with one thread; runs with the buffers of
 * the run before replay a captured graph.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_cache.h"
#include "kf_exec.h"
#include "kf_kernels.h"
#include "kf_onnx.h"
#include "kfuse/kfuse.h"
#include "test_util.h"

#ifdef KF_TEST_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

/* Each test compiles into its own cache folder, emptied and removed after. */
static void use_temp_cache(void) { tu_cache_dir_begin("kf-apidev-test"); }
static void remove_temp_cache(void) { tu_cache_dir_end(); }
TestSuite(api_device, .init = use_temp_cache, .fini = remove_temp_cache);

static void need_cl(void) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
}

static kf_compiled *compile_cl(const kf_model *m) {
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_OPENCL;
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    return c;
}

/* The plan's context and its device, and a new in-order queue there. */
static cl_command_queue queue_of(kf_compiled *c, cl_context *ctx_out, cl_command_queue_properties props) {
    void *ctx = NULL;
    cr_assert_eq(kf_compiled_device_context(c, &ctx), KF_OK, "%s", kf_last_error());
    cl_device_id dev;
    cr_assert_eq(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof dev, &dev, NULL), CL_SUCCESS);
    cl_int e = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, props, &e);
    cr_assert(q, "clCreateCommandQueue: %d", (int)e);
    if (ctx_out) *ctx_out = ctx;
    return q;
}

static size_t bytes_of(const kf_tensor *t) { return (size_t)t->numel * kf_dtype_size(t->dtype); }

/* Host inputs of a plan and everything one device-side run needs. */
typedef struct case_ {
    kf_compiled *c;
    int nin, nout;
    kf_tensor *in;       /* host values */
    kf_host_tensor *hin; /* views of in for kf_run */
    kf_output *want;     /* kf_run's outputs */
} case_;

/* Random inputs for c: declared shapes, symbolic dims 2; integer inputs
 * inside the dim they index (kf_index_bound on m). */
static void make_case(case_ *k, const kf_model *m, kf_compiled *c) {
    memset(k, 0, sizeof *k);
    k->c = c;
    k->nin = kf_compiled_num_inputs(c);
    k->nout = kf_compiled_num_outputs(c);
    k->in = calloc((size_t)k->nin + 1, sizeof *k->in);
    k->hin = calloc((size_t)k->nin + 1, sizeof *k->hin);
    k->want = calloc((size_t)k->nout + 1, sizeof *k->want);
    for (int i = 0; i < k->nin; i++) {
        int dtype, rank;
        int64_t dims[8];
        cr_assert_eq(kf_compiled_input_info(c, i, &dtype, &rank, dims), KF_OK, "%s", kf_last_error());
        for (int d = 0; d < rank; d++)
            if (dims[d] < 0) dims[d] = 2;
        bool integer = dtype == KF_DT_INT64 || dtype == KF_DT_INT32;
        int64_t bound = 0;
        if (integer) {
            kf_id v = kf_graph_find(m->graph, kf_compiled_input_name(c, i));
            bound = v ? kf_index_bound(m->graph, v) : 0;
            if (bound <= 0) bound = 2;
        }
        k->in[i] = tu_rand((kf_dtype)dtype, rank, dims, integer ? 0 : -2, integer ? (double)bound - 0.5 : 2);
        k->hin[i] = (kf_host_tensor){dtype, rank, k->in[i].dims, k->in[i].data};
    }
    cr_assert_eq(kf_run(c, k->hin, k->nin, k->want, k->nout), KF_OK, "kf_run: %s", kf_last_error());
}

static void free_case(case_ *k) {
    for (int i = 0; i < k->nin; i++) kf_tensor_release(&k->in[i]);
    for (int o = 0; o < k->nout; o++) kf_output_release(&k->want[o]);
    free(k->in);
    free(k->hin);
    free(k->want);
}

/* Device buffers for k on ctx: inputs filled from the host values,
 * outputs as kf_run's outputs say. */
typedef struct dbufs {
    kf_device_tensor *din, *dout;
    cl_mem *mem; /* inputs then outputs */
} dbufs;

static void make_dbufs(dbufs *b, const case_ *k, cl_context ctx) {
    b->din = calloc((size_t)k->nin + 1, sizeof *b->din);
    b->dout = calloc((size_t)k->nout + 1, sizeof *b->dout);
    b->mem = calloc((size_t)(k->nin + k->nout) + 1, sizeof *b->mem);
    cl_int e = CL_SUCCESS;
    for (int i = 0; i < k->nin; i++) {
        size_t n = bytes_of(&k->in[i]);
        b->mem[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (n ? CL_MEM_COPY_HOST_PTR : 0), n ? n : 1, n ? k->in[i].data : NULL, &e);
        cr_assert(b->mem[i], "clCreateBuffer: %d", (int)e);
        b->din[i] = (kf_device_tensor){k->in[i].dtype, k->in[i].rank, k->in[i].dims, b->mem[i], n};
    }
    for (int o = 0; o < k->nout; o++) {
        const kf_output *w = &k->want[o];
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, w->nbytes ? w->nbytes : 1, NULL, &e);
        cr_assert(m, "clCreateBuffer: %d", (int)e);
        b->mem[k->nin + o] = m;
        b->dout[o] = (kf_device_tensor){w->dtype, w->rank, w->dims, m, w->nbytes};
    }
}

static void free_dbufs(dbufs *b, const case_ *k) {
    for (int i = 0; i < k->nin + k->nout; i++) clReleaseMemObject(b->mem[i]);
    free(b->din);
    free(b->dout);
    free(b->mem);
}

/* Reads output o back and compares it with kf_run's, byte for byte: the
 * same kernels on the same inputs. */
static void expect_outputs(const case_ *k, const dbufs *b, cl_command_queue q, const char *what) {
    for (int o = 0; o < k->nout; o++) {
        const kf_output *w = &k->want[o];
        void *got = malloc(w->nbytes ? w->nbytes : 1);
        if (w->nbytes)
            cr_assert_eq(clEnqueueReadBuffer(q, b->mem[k->nin + o], CL_TRUE, 0, w->nbytes, got, 0, NULL, NULL), CL_SUCCESS);
        cr_expect(!memcmp(got, w->data, w->nbytes), "%s: output '%s' differs from kf_run's", what,
                  kf_compiled_output_name(k->c, o));
        free(got);
    }
}

/* Runs fn with stderr in a temporary file; the lines it printed that
 * contain `word`. */
static int stderr_lines_with(const char *word, kf_status (*fn)(void *), void *arg, kf_status *st) {
    fflush(stderr);
    FILE *f = tmpfile();
    cr_assert(f);
    int saved = dup(2);
    dup2(fileno(f), 2);
    *st = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, word)) n++;
    fclose(f);
    return n;
}

typedef struct call {
    case_ *k;
    dbufs *b;
    cl_command_queue q;
    kf_output *out;
} call;

static kf_status call_device(void *arg) {
    call *c = arg;
    return kf_run_device(c->k->c, c->q, c->b->din, c->k->nin, c->b->dout, c->k->nout);
}

static kf_status call_run(void *arg) {
    call *c = arg;
    return kf_run(c->k->c, c->k->hin, c->k->nin, c->out, c->k->nout);
}

static void model_equals_kf_run(const char *rel) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tu_source_dir(), rel);
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s: %s", rel, kf_last_error());
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    /* the trace lists host copies and waits: kf_run has some, kf_run_device none */
    setenv("KFUSE_TRACE", "host", 1);
    kf_output *again = calloc((size_t)k.nout + 1, sizeof *again);
    call cl = {&k, &b, q, again};
    kf_status st;
    int host_in_run = stderr_lines_with("kfuse: host:", call_run, &cl, &st);
    cr_assert_eq(st, KF_OK, "%s: kf_run: %s", rel, kf_last_error());
    cr_expect_gt(host_in_run, 0, "%s: kf_run traced no host copy (the check below could not fail)", rel);
    int host_in_device = stderr_lines_with("kfuse: host:", call_device, &cl, &st);
    unsetenv("KFUSE_TRACE");
    cr_assert_eq(st, KF_OK, "%s: kf_run_device: %s", rel, kf_last_error());
    cr_expect_eq(host_in_device, 0, "%s: kf_run_device copied or waited %d times", rel, host_in_device);
    /* twice more on the same queue: the stream's arena is reused in order */
    cr_assert_eq(kf_run_device(c, q, b.din, k.nin, b.dout, k.nout), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_run_device(c, q, b.din, k.nin, b.dout, k.nout), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_sync(c, q), KF_OK, "%s: kf_sync: %s", rel, kf_last_error());
    expect_outputs(&k, &b, q, rel);
    for (int o = 0; o < k.nout; o++) kf_output_release(&again[o]);
    free(again);
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_device, tiny_cnn_equals_kf_run, .timeout = 300) {
    need_cl();
    model_equals_kf_run("bench/models/tiny_cnn.onnx");
}
Test(api_device, small_bert_equals_kf_run, .timeout = 600) {
    need_cl();
    model_equals_kf_run("bench/models/small/bert/model.onnx");
}
Test(api_device, small_gpt2_equals_kf_run, .timeout = 600) {
    need_cl();
    model_equals_kf_run("bench/models/small/gpt2/model.onnx");
}
Test(api_device, small_mobilenetv2_equals_kf_run, .timeout = 600) {
    need_cl();
    model_equals_kf_run("bench/models/small/mobilenetv2/model.onnx");
}
Test(api_device, small_resnet50_equals_kf_run, .timeout = 600) {
    need_cl();
    model_equals_kf_run("bench/models/small/resnet50/model.onnx");
}
Test(api_device, small_vit_b16_equals_kf_run, .timeout = 600) {
    need_cl();
    model_equals_kf_run("bench/models/small/vit_b16/model.onnx");
}

/* elementwise, a GEMM, a Softmax; and an output that is the input itself
 * (copied on the device after the launches) */
static const char *MODEL = "opset 13\n"
                           "input x float[6, 10]\n"
                           "const w float[10, 8] = random\n"
                           "t = Tanh(x)\n"
                           "m = MatMul(t, w)\n"
                           "q = Softmax(m) {axis=1}\n"
                           "output q\n"
                           "output x\n";

static kf_status expect_refused(kf_compiled *c, void *q, const kf_device_tensor *in, int nin, const kf_device_tensor *out,
                                int nout, kf_status want, const char *msg, const char *what) {
    kf_status st = kf_run_device(c, q, in, nin, out, nout);
    cr_expect_eq(st, want, "%s: status %d (%s), want %d", what, st, kf_last_error(), want);
    cr_expect(strstr(kf_last_error(), msg), "%s: '%s' lacks '%s'", what, kf_last_error(), msg);
    return st;
}

Test(api_device, small_model_and_an_input_passed_through) {
    need_cl();
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    cr_assert_eq(kf_run_device(c, q, b.din, k.nin, b.dout, k.nout), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_sync(c, q), KF_OK, "%s", kf_last_error());
    expect_outputs(&k, &b, q, "small model");
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

static uint64_t device_replays(kf_compiled *c) {
    kf_exec_stats s;
    kf_exec_get_stats(kf_compiled_exec(c), &s);
    return s.device_replays;
}

static void run_on(case_ *k, dbufs *b, cl_command_queue q, uint64_t replays_after, const char *what) {
    cr_assert_eq(kf_run_device(k->c, q, b->din, k->nin, b->dout, k->nout), KF_OK, "%s: %s", what, kf_last_error());
    cr_assert_eq(kf_sync(k->c, q), KF_OK, "%s: kf_sync: %s", what, kf_last_error());
    cr_expect_eq(device_replays(k->c), replays_after, "%s: %llu runs replayed, want %llu", what,
                 (unsigned long long)device_replays(k->c), (unsigned long long)replays_after);
}

/* With a device that captures graphs (OpenCL's recorded graphs stand in
 * for CUDA's here): the second run with the same buffers is captured and
 * replayed, and so are later ones, reading what the buffers hold now;
 * other buffers run launch by launch (a graph holds its pointers) and
 * become the buffers the next capture is for. The host path replays too. */
Test(api_device, graphs_replay_with_the_buffers_of_the_run_before) {
    need_cl();
    setenv("KFUSE_OPENCL_GRAPHS", "record", 1);
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = compile_cl(m);
    kf_exec_stats st;
    kf_exec_get_stats(kf_compiled_exec(c), &st);
    cr_expect(st.cuda_graph, "kf_run of an all-kernel plan replays a graph");
    case_ ka, kb; /* two input draws; kf_run (replayed) gives each one's outputs */
    make_case(&ka, m, c);
    make_case(&kb, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs a, b;
    make_dbufs(&a, &ka, ctx);
    make_dbufs(&b, &kb, ctx);
    run_on(&ka, &a, q, 0, "first run on A");
    expect_outputs(&ka, &a, q, "first run on A");
    run_on(&ka, &a, q, 1, "A again: captured, replayed");
    expect_outputs(&ka, &a, q, "A captured");
    /* B's input written into A's buffer: the replay reads it */
    cr_assert_eq(clEnqueueWriteBuffer(q, a.mem[0], CL_TRUE, 0, bytes_of(&kb.in[0]), kb.in[0].data, 0, NULL, NULL),
                 CL_SUCCESS);
    run_on(&ka, &a, q, 2, "A replayed with new contents");
    expect_outputs(&kb, &a, q, "A replayed with B's input");
    run_on(&kb, &b, q, 2, "B: other buffers, launch by launch");
    expect_outputs(&kb, &b, q, "B");
    run_on(&kb, &b, q, 3, "B again: captured for B");
    expect_outputs(&kb, &b, q, "B captured");
    cr_assert_eq(clEnqueueWriteBuffer(q, a.mem[0], CL_TRUE, 0, bytes_of(&ka.in[0]), ka.in[0].data, 0, NULL, NULL),
                 CL_SUCCESS);
    run_on(&ka, &a, q, 3, "A after B: launch by launch");
    expect_outputs(&ka, &a, q, "A after B");
    expect_outputs(&kb, &b, q, "B untouched by A's runs");
    unsetenv("KFUSE_OPENCL_GRAPHS");
    free_dbufs(&a, &ka);
    free_dbufs(&b, &kb);
    clReleaseCommandQueue(q);
    free_case(&ka);
    free_case(&kb);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_device, wrong_descriptions_queues_and_buffers_are_refused) {
    need_cl();
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    kf_device_tensor out[2], in[1];
    static const int64_t small[2] = {6, 4}, wide[2] = {6, 10}, neg[2] = {6, -1};

    memcpy(out, b.dout, sizeof out);
    out[0].dims = small;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "output 'q' is float[6,8] for these inputs, its buffer is described as float[6,4]", "dims");
    memcpy(out, b.dout, sizeof out);
    out[0].dtype = KF_DT_INT32;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "its buffer is described as int32[6,8]", "dtype");
    memcpy(out, b.dout, sizeof out);
    out[0].nbytes = 6 * 8 * 4 - 1;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "the buffer holds 191 bytes", "nbytes");
    memcpy(out, b.dout, sizeof out);
    out[0].dims = wide; /* described as larger than the cl_mem really is */
    out[0].nbytes = 6 * 10 * 4;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "the buffer holds 192 bytes, the tensor needs 240", "cl_mem size");
    memcpy(out, b.dout, sizeof out);
    out[1].dims = neg;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "dim 1 is -1", "negative dim");
    memcpy(out, b.dout, sizeof out);
    out[1].buffer = NULL;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "output 'x': the buffer is NULL", "NULL buffer");
    memcpy(in, b.din, sizeof in);
    in[0].dtype = KF_DT_INT32;
    expect_refused(c, q, in, 1, b.dout, 2, KF_ERR_INVALID_ARG, "input 'x' is int32, the model declares float", "input dtype");
    expect_refused(c, q, b.din, 1, b.dout, 1, KF_ERR_INVALID_ARG, "the model has 2 outputs, 1 were given", "count");
    expect_refused(c, NULL, b.din, 1, b.dout, 2, KF_ERR_INVALID_ARG, "NULL command queue", "NULL queue");

    /* a queue and a buffer of another context */
    cl_device_id dev;
    cr_assert_eq(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof dev, &dev, NULL), CL_SUCCESS);
    cl_int e;
    cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    cr_assert(other, "clCreateContext: %d", (int)e);
    cl_command_queue oq = clCreateCommandQueue(other, dev, 0, &e);
    cr_assert(oq);
    expect_refused(c, oq, b.din, 1, b.dout, 2, KF_ERR_INVALID_ARG, "belongs to another context", "other queue");
    cl_mem om = clCreateBuffer(other, CL_MEM_READ_WRITE, 6 * 8 * 4, NULL, &e);
    cr_assert(om);
    memcpy(out, b.dout, sizeof out);
    out[0].buffer = om;
    expect_refused(c, q, b.din, 1, out, 2, KF_ERR_INVALID_ARG, "output 'q': the buffer belongs to another context",
                   "other buffer");
    clReleaseMemObject(om);
    clReleaseCommandQueue(oq);
    clReleaseContext(other);
    /* an out-of-order queue, where it exists */
    cl_command_queue ooo = clCreateCommandQueue(ctx, dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    if (ooo) {
        expect_refused(c, ooo, b.din, 1, b.dout, 2, KF_ERR_INVALID_ARG, "out of order", "out-of-order queue");
        clReleaseCommandQueue(ooo);
    }
    /* after every refusal the same buffers still run */
    cr_assert_eq(kf_run_device(c, q, b.din, 1, b.dout, 2), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_sync(c, q), KF_OK, "%s", kf_last_error());
    expect_outputs(&k, &b, q, "after refusals");
    cr_expect_eq(kf_sync(NULL, q), KF_ERR_INVALID_ARG);
    void *none = &none;
    cr_expect_eq(kf_compiled_device_context(NULL, &none), KF_ERR_INVALID_ARG);
    cr_expect_null(none);
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_device, ref_backend_has_no_device_side) {
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    void *ctx = &ctx;
    cr_expect_eq(kf_compiled_device_context(c, &ctx), KF_ERR_UNSUPPORTED);
    cr_expect_null(ctx);
    kf_device_tensor d[2] = {{0}};
    cr_expect_eq(kf_run_device(c, NULL, d, 1, d, 2), KF_ERR_UNSUPPORTED);
    cr_expect(strstr(kf_last_error(), "backend ref"), "%s", kf_last_error());
    cr_expect_eq(kf_sync(c, NULL), KF_ERR_UNSUPPORTED);
    kf_compiled_free(c);
    kf_model_free(m);
}

/* A CUDA plan compiled without a driver (NVRTC only) has nothing to run on. */
Test(api_device, compile_only_cuda_plan_has_no_device_side) {
    if (kf_nvrtc_unavailable()) cr_skip_test("NVRTC: %s", kf_nvrtc_unavailable());
    kf_model *m = gt_parse(MODEL);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_CUDA;
    o.compile_only = true;
    kf_exec *e = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &e), KF_OK, "%s", kf_last_error());
    void *ctx = &ctx;
    cr_expect_eq(kf_exec_device_context(e, &ctx), KF_ERR_NO_DEVICE, "%s", kf_last_error());
    cr_expect_null(ctx);
    kf_tensor in[1] = {{0}}, out[2] = {{0}};
    void *bufs[2] = {NULL, NULL};
    cr_expect_eq(kf_exec_run_device(e, NULL, in, bufs, 1, out, bufs, 2), KF_ERR_NO_DEVICE);
    cr_expect(strstr(kf_last_error(), "compiled only"), "%s", kf_last_error());
    cr_expect_eq(kf_exec_sync(e, NULL), KF_ERR_NO_DEVICE);
    kf_exec_free(e);
    kf_model_free(m);
}

Test(api_device, host_step_is_unsupported_naming_the_node) {
    need_cl();
    /* NonZero's output size depends on the values: it runs on the host */
    kf_model *m = gt_parse("opset 13\ninput x float[8]\nr = Relu(x)\nnz = NonZero(r) {}\n"
                           "s = ReduceSum(nz) {keepdims=0}\nc = Cast(s) {to=1}\ny = Add(c, x)\noutput y\n");
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    expect_refused(c, q, b.din, 1, b.dout, 1, KF_ERR_UNSUPPORTED, "(NonZero) runs on the host", "host step");
    cr_expect(strstr(kf_last_error(), "node '"), "%s", kf_last_error());
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_device, bad_gather_index_is_reported_by_kf_sync) {
    need_cl();
    kf_model *m = gt_parse("opset 13\ninput x float[4, 3]\ninput i int64[2]\ng = Gather(x, i) {axis=0}\n"
                           "y = Relu(g)\noutput y\n");
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    int64_t bad[2] = {1, 99}, good[2] = {-4, 3};
    cr_assert_eq(clEnqueueWriteBuffer(q, b.mem[1], CL_TRUE, 0, sizeof bad, bad, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(kf_run_device(c, q, b.din, 2, b.dout, 1), KF_OK, "the run itself does not wait: %s", kf_last_error());
    kf_status st = kf_sync(c, q);
    cr_expect_eq(st, KF_ERR_RUNTIME, "status %d: %s", st, kf_last_error());
    cr_expect(strstr(kf_last_error(), "index 99 is out of range for a dimension of size 4") &&
                  strstr(kf_last_error(), "Gather"),
              "%s", kf_last_error());
    /* reported once: the next kf_sync has nothing to say */
    cr_expect_eq(kf_sync(c, q), KF_OK, "%s", kf_last_error());
    cr_assert_eq(clEnqueueWriteBuffer(q, b.mem[1], CL_TRUE, 0, sizeof good, good, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(kf_run_device(c, q, b.din, 2, b.dout, 1), KF_OK, "%s", kf_last_error());
    cr_expect_eq(kf_sync(c, q), KF_OK, "%s", kf_last_error());
    /* the good indices' result equals kf_run's */
    kf_host_tensor hin[2] = {k.hin[0], {KF_DT_INT64, 1, k.in[1].dims, good}};
    kf_output want[1] = {0};
    cr_assert_eq(kf_run(c, hin, 2, want, 1), KF_OK, "%s", kf_last_error());
    float got[6];
    cr_assert_eq(clEnqueueReadBuffer(q, b.mem[2], CL_TRUE, 0, sizeof got, got, 0, NULL, NULL), CL_SUCCESS);
    cr_expect(!memcmp(got, want[0].data, sizeof got));
    kf_output_release(&want[0]);
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_device, constant_output_is_unsupported) {
    need_cl();
    /* k is a graph output no kernel computes or reads */
    kf_model *m = gt_parse("opset 13\ninput x float[4]\nconst k float[3] = random\ny = Relu(x)\noutput y\noutput k\n");
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    dbufs b;
    make_dbufs(&b, &k, ctx);
    expect_refused(c, q, b.din, 1, b.dout, 2, KF_ERR_UNSUPPORTED, "output 'k' is a constant of the plan", "constant");
    free_dbufs(&b, &k);
    clReleaseCommandQueue(q);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

/* One queue, two shape sets (an arena each): a bad index met in a run of
 * the first is still reported by kf_sync after runs of the second. */
Test(api_device, shape_sets_share_a_queue_and_kf_sync_sees_both) {
    need_cl();
    kf_model *m = gt_parse("opset 13\ninput x float[N, 3]\ninput i int64[2]\ng = Gather(x, i) {axis=0}\n"
                           "y = Relu(g)\noutput y\n");
    kf_compiled *c = compile_cl(m);
    void *vctx;
    cr_assert_eq(kf_compiled_device_context(c, &vctx), KF_OK, "%s", kf_last_error());
    cl_context ctx = vctx;
    cl_command_queue q = queue_of(c, NULL, 0);
    cl_int e;
    float xs[5 * 3];
    for (int j = 0; j < 15; j++) xs[j] = (float)j - 7;
    int64_t bad[2] = {0, 4}, good[2] = {4, -5}, yd[2] = {2, 3};
    cl_mem x = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof xs, xs, &e);
    cl_mem ib = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof bad, bad, &e);
    cl_mem ig = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof good, good, &e);
    cl_mem y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 6 * sizeof(float), NULL, &e);
    cr_assert(x && ib && ig && y);
    int64_t x4[2] = {4, 3}, x5[2] = {5, 3}, two = 2;
    kf_device_tensor in4[2] = {{KF_DT_FLOAT, 2, x4, x, sizeof xs}, {KF_DT_INT64, 1, &two, ib, sizeof bad}};
    kf_device_tensor in5[2] = {{KF_DT_FLOAT, 2, x5, x, sizeof xs}, {KF_DT_INT64, 1, &two, ig, sizeof good}};
    kf_device_tensor out = {KF_DT_FLOAT, 2, yd, y, 6 * sizeof(float)};
    /* index 4 is out of range for N=4 only */
    cr_assert_eq(kf_run_device(c, q, in4, 2, &out, 1), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_run_device(c, q, in5, 2, &out, 1), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_run_device(c, q, in5, 2, &out, 1), KF_OK, "%s", kf_last_error());
    kf_status st = kf_sync(c, q);
    cr_expect_eq(st, KF_ERR_RUNTIME, "status %d: %s", st, kf_last_error());
    cr_expect(strstr(kf_last_error(), "index 4 is out of range for a dimension of size 4"), "%s", kf_last_error());
    cr_expect_eq(kf_sync(c, q), KF_OK, "%s", kf_last_error());
    float got[6];
    cr_assert_eq(clEnqueueReadBuffer(q, y, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL), CL_SUCCESS);
    /* rows 4 and 0 of x (-5 is 0 for N=5), through Relu */
    for (int j = 0; j < 3; j++) {
        cr_expect_eq(got[j], xs[12 + j] > 0 ? xs[12 + j] : 0, "y[0][%d] = %g", j, got[j]);
        cr_expect_eq(got[3 + j], 0, "y[1][%d] = %g", j, got[3 + j]);
    }
    clReleaseMemObject(x);
    clReleaseMemObject(ib);
    clReleaseMemObject(ig);
    clReleaseMemObject(y);
    clReleaseCommandQueue(q);
    kf_compiled_free(c);
    kf_model_free(m);
}

#define THREADS 4
#define RUNS 5

typedef struct worker {
    case_ *k;
    cl_context ctx;
    kf_compiled *c;
    int failures;
    char why[256];
} worker;

/* Its own queue and buffers; RUNS runs, each read back and compared. */
static void *work(void *arg) {
    worker *w = arg;
    void *vctx = NULL;
    kf_compiled_device_context(w->c, &vctx);
    cl_device_id dev;
    clGetContextInfo(vctx, CL_CONTEXT_DEVICES, sizeof dev, &dev, NULL);
    cl_int e;
    cl_command_queue q = clCreateCommandQueue(vctx, dev, 0, &e);
    const case_ *k = w->k;
    cl_mem in = clCreateBuffer(vctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes_of(&k->in[0]), k->in[0].data, &e);
    cl_mem out[2];
    kf_device_tensor din = {k->in[0].dtype, k->in[0].rank, k->in[0].dims, in, bytes_of(&k->in[0])}, dout[2];
    for (int o = 0; o < 2; o++) {
        out[o] = clCreateBuffer(vctx, CL_MEM_READ_WRITE, k->want[o].nbytes, NULL, &e);
        dout[o] = (kf_device_tensor){k->want[o].dtype, k->want[o].rank, k->want[o].dims, out[o], k->want[o].nbytes};
    }
    for (int r = 0; r < RUNS; r++) {
        float zero = 0;
        clEnqueueFillBuffer(q, out[0], &zero, sizeof zero, 0, k->want[0].nbytes, 0, NULL, NULL);
        kf_status st = kf_run_device(w->c, q, &din, 1, dout, 2);
        if (!st) st = kf_sync(w->c, q);
        if (st) {
            w->failures++;
            snprintf(w->why, sizeof w->why, "%s", kf_last_error());
            continue;
        }
        for (int o = 0; o < 2; o++) {
            void *got = malloc(k->want[o].nbytes);
            clEnqueueReadBuffer(q, out[o], CL_TRUE, 0, k->want[o].nbytes, got, 0, NULL, NULL);
            if (memcmp(got, k->want[o].data, k->want[o].nbytes)) {
                w->failures++;
                snprintf(w->why, sizeof w->why, "run %d: output %d differs", r, o);
            }
            free(got);
        }
    }
    clReleaseMemObject(in);
    clReleaseMemObject(out[0]);
    clReleaseMemObject(out[1]);
    clReleaseCommandQueue(q);
    return NULL;
}

Test(api_device, threads_with_a_queue_each_equal_kf_run) {
    need_cl();
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = compile_cl(m);
    case_ k;
    make_case(&k, m, c);
    cl_context ctx;
    cl_command_queue q = queue_of(c, &ctx, 0);
    clReleaseCommandQueue(q);
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (worker){&k, ctx, c, 0, ""};
        cr_assert_eq(pthread_create(&th[t], NULL, work, &w[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++) cr_expect_eq(w[t].failures, 0, "thread %d: %s", t, w[t].why);
    free_case(&k);
    kf_compiled_free(c);
    kf_model_free(m);
}

#else

Test(api_device, needs_opencl_headers) { cr_skip_test("OpenCL was not found at configure time"); }

#endif
