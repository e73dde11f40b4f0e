/*
 * test_api.c: the public compile/run API (include/kfuse/kfuse.h) on ref and
 * opencl: outputs equal to the reference evaluator through kf_host_tensor
 * views and caller-owned kf_output; four threads running one kf_compiled
 * at once get exactly what one thread gets; bad arguments are refused with
 * typed errors; BEST resolves to a backend that runs here.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_kernels.h"
#include "kf_run.h"
#include "kfuse/kfuse.h"
#include "test_util.h"

/* elementwise chains, a GEMM and a reduction: kernels and ref hand-offs */
static const char *MODEL = "opset 13\n"
                           "input x float[6, 10]\n"
                           "input y float[10]\n"
                           "const w float[10, 8] = random\n"
                           "const k float[] = 0.5\n"
                           "a = Add(x, y)\n"
                           "b = Mul(a, k)\n"
                           "t = Tanh(b)\n"
                           "m = MatMul(t, w)\n"
                           "s = Sigmoid(m)\n"
                           "r = ReduceMax(s) {axes=[1], keepdims=1}\n"
                           "q = Div(s, r)\n"
                           "output q\n"
                           "output t\n";

/* Each test compiles into its own cache folder, emptied and removed after. */
static void use_temp_cache(void) { tu_cache_dir_begin("kf-api-test"); }
static void remove_temp_cache(void) { tu_cache_dir_end(); }
TestSuite(api, .init = use_temp_cache, .fini = remove_temp_cache);

static void need_backend(kf_backend b) {
    const char *why = b == KF_BACKEND_OPENCL ? kf_cl_unavailable() : NULL;
    if (why) cr_skip_test("OpenCL: %s", why);
}

static kf_host_tensor host(const kf_tensor *t) {
    return (kf_host_tensor){(int)t->dtype, t->rank, t->dims, t->data};
}

/* kf_output -> kf_tensor (copied) for comparison */
static kf_tensor from_output(const kf_output *o) {
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, (kf_dtype)o->dtype, o->rank, o->dims), KF_OK);
    cr_assert_eq((size_t)t.numel * kf_dtype_size(t.dtype), o->nbytes);
    memcpy(t.data, o->data, o->nbytes);
    return t;
}

static void matches_ref(kf_backend b) {
    need_backend(b);
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, b, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_compiled_backend(c), b);
    cr_assert_eq(kf_compiled_num_inputs(c), 2);
    cr_assert_str_eq(kf_compiled_input_name(c, 0), "x");
    cr_assert_str_eq(kf_compiled_input_name(c, 1), "y");
    cr_assert_null(kf_compiled_input_name(c, 2));
    cr_assert_eq(kf_compiled_num_outputs(c), 2);
    cr_assert_str_eq(kf_compiled_output_name(c, 0), "q");
    for (int run = 0; run < 3; run++) {
        kf_tensor *ins;
        uint32_t nins;
        gt_random_inputs(m, &ins, &nins);
        kf_tensor want[2] = {0};
        cr_assert_eq(kf_eval_model(m, ins, 2, want, NULL), KF_OK, "%s", kf_last_error());
        kf_host_tensor h[2] = {host(&ins[0]), host(&ins[1])};
        kf_output out[2];
        cr_assert_eq(kf_run(c, h, 2, out, 2), KF_OK, "%s", kf_last_error());
        for (int o = 0; o < 2; o++) {
            kf_tensor got = from_output(&out[o]);
            char why[256];
            cr_expect(kf_run_close(&got, &want[o], why, sizeof why), "%s run %d output %d: %s", kf_backend_name(b), run,
                      o, why);
            kf_tensor_release(&got);
            kf_tensor_release(&want[o]);
            kf_output_release(&out[o]);
            cr_assert_null(out[o].data);
        }
        for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
        free(ins);
    }
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api, ref_matches_reference) { matches_ref(KF_BACKEND_REF); }
Test(api, opencl_matches_reference) { matches_ref(KF_BACKEND_OPENCL); }

/* ---- concurrency --------------------------------------------------------- */

#define API_THREADS 4
/* runs per thread: enough for the threads' runs to overlap many times */
#define API_RUNS 12

typedef struct worker {
    kf_compiled *c;
    const kf_host_tensor *in;
    const kf_output *want; /* the single-threaded result */
    int mismatches, failures;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int r = 0; r < API_RUNS; r++) {
        kf_output out[2];
        if (kf_run(w->c, w->in, 2, out, 2) != KF_OK) {
            w->failures++;
            continue;
        }
        for (int o = 0; o < 2; o++) {
            if (out[o].nbytes != w->want[o].nbytes || memcmp(out[o].data, w->want[o].data, out[o].nbytes) != 0)
                w->mismatches++;
            kf_output_release(&out[o]);
        }
    }
    return NULL;
}

static void concurrent(kf_backend b) {
    need_backend(b);
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, b, &c), KF_OK, "%s", kf_last_error());
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_host_tensor h[2] = {host(&ins[0]), host(&ins[1])};
    kf_output want[2];
    cr_assert_eq(kf_run(c, h, 2, want, 2), KF_OK, "%s", kf_last_error());
    worker w[API_THREADS];
    pthread_t th[API_THREADS];
    for (int t = 0; t < API_THREADS; t++) {
        w[t] = (worker){c, h, want, 0, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, work, &w[t]), 0);
    }
    for (int t = 0; t < API_THREADS; t++) {
        pthread_join(th[t], NULL);
        cr_expect_eq(w[t].failures, 0, "thread %d: %d runs failed", t, w[t].failures);
        cr_expect_eq(w[t].mismatches, 0, "thread %d: %d outputs differ from the single-threaded run", t, w[t].mismatches);
    }
    kf_output_release(&want[0]);
    kf_output_release(&want[1]);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api, ref_four_threads_equal_one) { concurrent(KF_BACKEND_REF); }
Test(api, opencl_four_threads_equal_one) { concurrent(KF_BACKEND_OPENCL); }

/* ---- arguments and backends ------------------------------------------------ */

Test(api, bad_arguments_are_typed_errors) {
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(NULL, KF_BACKEND_REF, &c), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compile(m, (kf_backend)42, &c), KF_ERR_INVALID_ARG);
    cr_assert_null(c);
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_host_tensor h[2] = {host(&ins[0]), host(&ins[1])};
    kf_output out[2];
    cr_assert_eq(kf_run(c, h, 1, out, 2), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_run(c, h, 2, out, 1), KF_ERR_INVALID_ARG);
    kf_host_tensor bad = h[0];
    bad.dtype = 999;
    kf_host_tensor hb[2] = {bad, h[1]};
    cr_assert_eq(kf_run(c, hb, 2, out, 2), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "'x'") != NULL, "%s", kf_last_error());
    hb[0] = h[0];
    hb[0].dtype = 7; /* int64 where float is declared */
    cr_assert_eq(kf_run(c, hb, 2, out, 2), KF_ERR_INVALID_ARG);
    cr_assert_null(out[0].data);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_compiled_free(c);
    kf_compiled_free(NULL);
    kf_output_release(NULL);
    kf_model_free(m);
}

Test(api, backend_names_and_best) {
    cr_assert_str_eq(kf_backend_name(KF_BACKEND_BEST), "best");
    cr_assert_str_eq(kf_backend_name(KF_BACKEND_REF), "ref");
    cr_assert_str_eq(kf_backend_name(KF_BACKEND_OPENCL), "opencl");
    cr_assert_str_eq(kf_backend_name(KF_BACKEND_CUDA), "cuda");
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_BEST, &c), KF_OK, "%s", kf_last_error());
    kf_backend got = kf_compiled_backend(c);
    cr_assert_neq(got, KF_BACKEND_BEST);
    if (kf_cl_unavailable() == NULL) cr_assert(got == KF_BACKEND_OPENCL || got == KF_BACKEND_CUDA);
    cr_log_info("best is %s here", kf_backend_name(got));
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api, cuda_without_a_device_is_no_device) {
    if (!kf_cu_unavailable()) cr_skip_test("a CUDA driver and device answer here");
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_CUDA, &c), KF_ERR_NO_DEVICE);
    cr_assert_null(c);
    cr_assert(strstr(kf_last_error(), "no CUDA device") != NULL, "%s", kf_last_error());
    kf_model_free(m);
}

Test(api, optimize_keeps_outputs) {
    kf_model *m = gt_parse(MODEL);
    kf_model *o = gt_copy(m);
    cr_assert_eq(kf_model_optimize(o), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_model_optimize(NULL), KF_ERR_INVALID_ARG);
    gt_expect_same_outputs(m, o, 1e-5, 1e-4);
    kf_model_free(o);
    kf_model_free(m);
}

Test(api, input_info_gives_declared_dtype_and_shape) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[N, 10]\n"
                           "input ids int64[3]\n"
                           "const w float[10, 4] = random\n"
                           "y = MatMul(x, w)\n"
                           "c = Cast(ids) {to=1}\n"
                           "output y\n"
                           "output c\n");
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_compiled_num_inputs(c), 2);
    int dtype = 0, rank = 0;
    int64_t dims[8];
    cr_assert_eq(kf_compiled_input_info(c, 0, &dtype, &rank, dims), KF_OK, "%s", kf_last_error());
    cr_assert_eq(dtype, 1); /* float */
    cr_assert_eq(rank, 2);
    cr_assert_eq(dims[0], -1, "a symbolic dim reads -1, got %lld", (long long)dims[0]);
    cr_assert_eq(dims[1], 10);
    cr_assert_eq(kf_compiled_input_info(c, 1, &dtype, &rank, dims), KF_OK, "%s", kf_last_error());
    cr_assert_eq(dtype, 7); /* int64 */
    cr_assert_eq(rank, 1);
    cr_assert_eq(dims[0], 3);
    cr_assert_eq(kf_compiled_input_info(c, 2, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_input_info(c, -1, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_input_info(c, 0, NULL, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_input_info(NULL, 0, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    kf_compiled_free(c);
    kf_model_free(m);
}

/* ---- kf_compile_ex -------------------------------------------------------- */

/* A struct_size the library cannot honour is a typed error naming it;
 * nothing is compiled and *out stays NULL. */
Test(api, compile_ex_struct_size) {
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = (kf_compiled *)&c;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_REF;
    o.struct_size = 0; /* a caller that never set it */
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    cr_assert_null(c);
    cr_assert(strstr(kf_last_error(), "struct_size 0"), "%s", kf_last_error());
    o.struct_size = sizeof o - 1;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    /* a later kfuse's larger options: refused, not half read */
    struct {
        kf_compile_options o;
        uint64_t later_field;
    } big = {o, 1};
    big.o.struct_size = sizeof big;
    c = (kf_compiled *)&c;
    cr_assert_eq(kf_compile_ex(m, &big.o, &c), KF_ERR_UNSUPPORTED);
    cr_assert_null(c);
    cr_assert(strstr(kf_last_error(), "struct_size"), "%s", kf_last_error());
    o.struct_size = sizeof o;
    o.precision = (kf_precision)7;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "precision 7"), "%s", kf_last_error());
    o.precision = KF_PRECISION_FP32;
    o.backend = (kf_backend)9;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    /* exactly this header's size, and NULL options, compile */
    o.backend = KF_BACKEND_REF;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_compiled_backend(c), KF_BACKEND_REF);
    kf_compiled_free(c);
    cr_assert_eq(kf_compile_ex(m, NULL, &c), KF_OK, "%s", kf_last_error());
    kf_compiled_free(c);
    cr_assert_eq(kf_compile_ex(m, &o, NULL), KF_ERR_INVALID_ARG);
    kf_model_free(m);
}

Test(api, precision_names) {
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_FP32), "fp32");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_TF32), "tf32");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_FP16), "fp16");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_BF16), "bf16");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_INT8), "int8");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_INT8_FP16), "int8-fp16");
    cr_assert_str_eq(kf_precision_name(KF_PRECISION_FP8), "fp8");
    cr_assert_str_eq(kf_precision_name((kf_precision)7), "?");
}

/* Each precision on each backend here: outputs keep the model's float32
 * type and match the float32 reference at the precision's tolerance. */
static void compile_ex_matches_ref(kf_backend b, kf_precision p) {
    need_backend(b);
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = b;
    o.precision = p;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_tensor want[2] = {0};
    cr_assert_eq(kf_eval_model(m, ins, 2, want, NULL), KF_OK, "%s", kf_last_error());
    kf_host_tensor h[2] = {host(&ins[0]), host(&ins[1])};
    kf_output out[2];
    cr_assert_eq(kf_run(c, h, 2, out, 2), KF_OK, "%s", kf_last_error());
    for (int o2 = 0; o2 < 2; o2++) {
        cr_assert_eq(out[o2].dtype, 1, "output %d dtype %d: the caller sees the declared float32", o2, out[o2].dtype);
        kf_tensor got = from_output(&out[o2]);
        char why[256];
        cr_expect(kf_run_close_prec(&got, &want[o2], p, why, sizeof why), "%s %s output %d: %s", kf_backend_name(b),
                  kf_precision_name(p), o2, why);
        kf_tensor_release(&got);
        kf_tensor_release(&want[o2]);
        kf_output_release(&out[o2]);
    }
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api, compile_ex_tf32_opencl) { compile_ex_matches_ref(KF_BACKEND_OPENCL, KF_PRECISION_TF32); }
Test(api, compile_ex_fp16_opencl) { compile_ex_matches_ref(KF_BACKEND_OPENCL, KF_PRECISION_FP16); }
Test(api, compile_ex_bf16_opencl) { compile_ex_matches_ref(KF_BACKEND_OPENCL, KF_PRECISION_BF16); }
Test(api, compile_ex_bf16_ref) { compile_ex_matches_ref(KF_BACKEND_REF, KF_PRECISION_BF16); }
