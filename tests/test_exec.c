/*
 * test_exec.c: compiled plans (kernels/kf_exec.h): one compile, many runs
 * equal to the reference evaluator; identical kernel texts compiled once;
 * a second plan served from the disk cache; symbolic dims specialised once
 * per shape set; device/ref hand-offs in both directions; the arena from
 * the memory planner; CUDA compile-only through NVRTC and a clean "no CUDA
 * device" where there is no driver.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cg_util.h"
#include "graph_text.h"
#include "kf_exec.h"
#include "kf_run.h"
#include "test_util.h"

static void need_cl(void) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
}

/* Fresh cache folders for a test, emptied and removed after it. */
#define MAX_TEMP 4 /* folders one test makes at most */
static char temp_dirs[MAX_TEMP][64];
static int ntemp;

static char *temp_cache(void) {
    cr_assert_lt(ntemp, MAX_TEMP);
    char *dir = temp_dirs[ntemp++];
    snprintf(dir, sizeof temp_dirs[0], "/tmp/kf-exec-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static void remove_temp(void) {
    for (int i = 0; i < ntemp; i++) {
        kf_cache *c = NULL;
        if (kf_cache_open(temp_dirs[i], &c) == KF_OK) kf_cache_clear(c, NULL, NULL);
        kf_cache_close(c);
        rmdir(temp_dirs[i]);
    }
    ntemp = 0;
}

TestSuite(exec, .fini = remove_temp);

static kf_exec *make(const kf_model *m, kf_exec_backend b, const char *cache) {
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = b;
    o.cache_dir = cache;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    return x;
}

/* Runs x on fresh random inputs `runs` times; every output must match the
 * unoptimized model on ref. */
/* device -> ref -> device: an elementwise chain, a GEMM anchor, elementwise
 * again, a row maximum by TopK (no kernel: the reference runs it), then an
 * epilogue */
static const char *MIXED = "opset 13\n"
                           "input x float[4, 6]\n"
                           "const w float[6, 5] = random\n"
                           "const c float[5] = random\n"
                           "const k float[] = 0.25\n"
                           "a = Mul(x, k)\n"
                           "t = Tanh(a)\n"
                           "m = MatMul(t, w)\n"
                           "n = Add(m, c)\n"
                           "u = Sigmoid(n)\n"
                           "const kk int64[1] = 1\n"
                           "s, si = TopK(u, kk) {axis=1}\n"
                           "q = Sub(u, s)\n"
                           "e = Exp(q)\n"
                           "output e\n"
                           "output t\n";

Test(exec, opencl_runs_many_times_equal_to_ref) {
    need_cl();
    kf_model *m = gt_parse(MIXED);
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_log_info("mixed: %u groups as kernels, %u on ref, %u launches", s.groups_dev, s.groups_ref, s.launches);
    cr_assert_geq(s.groups_dev, 1, "no group ran as a kernel");
    cr_assert_geq(s.groups_ref, 1, "TopK (no kernel) should hand off to ref");
    cr_assert_leq(s.launches, s.groups_dev);
    cgu_exec_matches_ref(x, m, 5);
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, ref_backend_matches_ref) {
    kf_model *m = gt_parse(MIXED);
    kf_exec *x = make(m, KF_EXEC_REF, NULL);
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.groups_dev, 0);
    cgu_exec_matches_ref(x, m, 2);
    kf_exec_free(x);
    kf_model_free(m);
}

/* two independent identical chains: two groups, one kernel text */
static const char *TWINS = "opset 13\n"
                           "input x float[3, 7]\n"
                           "input y float[3, 7]\n"
                           "a = Tanh(x)\n"
                           "b = Sigmoid(a)\n"
                           "c = Tanh(y)\n"
                           "d = Sigmoid(c)\n"
                           "output b\n"
                           "output d\n";

Test(exec, identical_kernels_compile_once_and_cache_serves_the_next_plan) {
    need_cl();
    kf_model *m = gt_parse(TWINS);
    char *cache = temp_cache();
    kf_exec *x = make(m, KF_EXEC_OPENCL, cache);
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.groups_dev, 2, "%u groups as kernels", s.groups_dev);
    cr_assert_eq(s.kernels_unique, 1, "identical texts were not shared");
    cr_assert_eq(s.kernels_compiled, 1);
    cr_assert_eq(s.cache_hits, 0);
    cgu_exec_matches_ref(x, m, 2);
    kf_exec_free(x);
    /* a second plan (a new process would do the same) reads the disk */
    x = make(m, KF_EXEC_OPENCL, cache);
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.kernels_compiled, 0, "compiled again despite the cache");
    cr_assert_eq(s.cache_hits, 1);
    cgu_exec_matches_ref(x, m, 2);
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, symbolic_dims_specialise_once_per_shape_set) {
    need_cl();
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[N, 4]\n"
                           "input y float[N, 4]\n"
                           "a = Add(x, y)\n"
                           "b = Sigmoid(a)\n"
                           "c = Greater(b, y)\n"
                           "output b\n"
                           "output c\n");
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    cr_assert_eq(kf_exec_num_specs(x), 0, "nothing to compile before the shapes are known");
    int64_t ns[3] = {3, 5, 3};
    for (int k = 0; k < 3; k++) {
        int64_t d[2] = {ns[k], 4};
        kf_tensor in[2] = {tu_rand(KF_DT_FLOAT, 2, d, -1, 1), tu_rand(KF_DT_FLOAT, 2, d, -1, 1)}, out[2] = {0}, want[2] = {0};
        cr_assert_eq(kf_exec_run(x, in, 2, out), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_eval_model(m, in, 2, want, NULL), KF_OK, "%s", kf_last_error());
        for (int o = 0; o < 2; o++) {
            char why[256];
            cr_expect(kf_run_close(&out[o], &want[o], why, sizeof why), "N=%lld output %d: %s", (long long)ns[k], o, why);
            kf_tensor_release(&out[o]);
            kf_tensor_release(&want[o]);
        }
        kf_tensor_release(&in[0]);
        kf_tensor_release(&in[1]);
    }
    cr_assert_eq(kf_exec_num_specs(x), 2, "N=3 twice must reuse its plan");
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_geq(s.groups_dev, 1, "static after specialisation, so generated");
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, intermediates_live_in_the_arena) {
    need_cl();
    /* kernel -> ref (CumSum is opaque) -> kernel -> ref -> kernel: t, c, u
     * and d cross groups, both ways between device and host */
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[8, 16]\n"
                           "const ax int64[] = 1\n"
                           "t = Tanh(x)\n"
                           "c = CumSum(t, ax)\n"
                           "u = Sigmoid(c)\n"
                           "d = CumSum(u, ax)\n"
                           "z = Relu(d)\n"
                           "output z\n");
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_log_info("arena %lld bytes, live lower bound %lld", (long long)s.arena_bytes, (long long)s.live_lower_bound);
    cr_assert_geq(s.groups_dev, 3, "Tanh, Sigmoid and Relu are kernels");
    cr_assert_geq(s.live_lower_bound, 8 * 16 * 4, "t alone is 512 bytes");
    cr_assert_geq(s.arena_bytes, s.live_lower_bound);
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, wrong_inputs_are_refused) {
    kf_model *m = gt_parse(TWINS);
    kf_exec *x = make(m, KF_EXEC_REF, NULL);
    int64_t d[2] = {3, 7};
    kf_tensor in[2] = {tu_rand(KF_DT_FLOAT, 2, d, -1, 1), tu_i64(0, NULL, (const int64_t[]){1})}, out[2] = {0};
    cr_assert_eq(kf_exec_run(x, in, 1, out), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_exec_run(x, in, 2, out), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "'y'") != NULL, "%s", kf_last_error());
    kf_tensor_release(&in[0]);
    kf_tensor_release(&in[1]);
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, cuda_compile_only_needs_no_gpu) {
    const char *why = kf_nvrtc_unavailable();
    if (why) cr_skip_test("NVRTC: %s", why);
    kf_model *m = gt_parse(TWINS);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_CUDA;
    o.compile_only = true;
    o.arch = "sm_80";
    o.cache_dir = temp_cache();
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.kernels_unique, 1);
    cr_assert_eq(s.kernels_compiled + s.cache_hits, 1);
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_tensor out[2] = {0};
    cr_assert_eq(kf_exec_run(x, ins, nins, out), KF_ERR_NO_DEVICE, "a compile-only plan must not run");
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    kf_exec_free(x);
    kf_model_free(m);
}

Test(exec, cuda_without_driver_says_no_cuda_device) {
    if (!kf_cu_unavailable()) cr_skip_test("a CUDA driver and device answer here");
    kf_model *m = gt_parse(TWINS);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_CUDA;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_ERR_NO_DEVICE);
    cr_assert_null(x);
    cr_assert(strncmp(kf_last_error(), "no CUDA device: ", 16) == 0, "%s", kf_last_error());
    kf_model_free(m);
}

Test(exec, cuda_runs_when_a_device_answers) {
    const char *why = kf_cu_unavailable();
    if (why) cr_skip_test("CUDA: %s", why);
    if ((why = kf_nvrtc_unavailable())) cr_skip_test("NVRTC: %s", why);
    kf_model *m = gt_parse(MIXED);
    kf_exec *x = make(m, KF_EXEC_CUDA, temp_cache());
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_free(x);
    kf_model_free(m);
    m = gt_parse(TWINS); /* every group a kernel: replayed from a CUDA Graph */
    x = make(m, KF_EXEC_CUDA, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_expect(s.cuda_graph);
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_free(x);
    kf_model_free(m);
}

/* a reshape between two opaque ops is a view: its output takes the arena
 * bytes of its input, so it costs no launch and the results still match */
Test(exec, views_alias_their_input_without_a_launch) {
    need_cl();
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[8, 16]\n"
                           "const ax int64[] = 1\n"
                           "const sh int64[2] = 4 32\n"
                           "t = Tanh(x)\n"
                           "c = CumSum(t, ax)\n"
                           "r = Reshape(c, sh)\n"
                           "d = CumSum(r, ax)\n"
                           "z = Sigmoid(d)\n"
                           "output z\n");
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_log_info("view graph: %u groups on the device, %u launches", s.groups_dev, s.launches);
    cr_assert_eq(s.groups_dev, 3, "Tanh, the view and Sigmoid");
    cr_assert_eq(s.launches, 2, "the view must not launch a copy");
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_free(x);
    kf_model_free(m);
}

/* every group left on the reference evaluator is named with its reason, once,
 * when the plan is made; plan-time constants and generated groups are not */
Test(exec, host_steps_are_reported_with_their_reason) {
    need_cl();
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[8, 16]\n"
                           "const ax int64[] = 1\n"
                           "t = Tanh(x)\n"
                           "c = CumSum(t, ax)\n"
                           "z = Sigmoid(c)\n"
                           "output z\n");
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_OPENCL;
    o.cache_dir = temp_cache();
    o.host_steps = f;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref(x, m, 1);
    char text[1024] = "";
    rewind(f);
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = 0;
    fclose(f);
    cr_assert_not_null(strstr(text, "kfuse: host step: node 'CumSum_"), "%s", text);
    cr_assert_not_null(strstr(text, "(CumSum): opaque op CumSum is not generated"), "%s", text);
    cr_assert_null(strstr(text, "Tanh"), "%s", text);
    cr_assert_null(strchr(strchr(text, '\n') + 1, '\n'), "one line: %s", text);
    kf_exec_free(x);
    kf_model_free(m);
}

/* a BatchNormalization no conv absorbs (after a pool) and a HardSwish: Mul
 * and Add with per-channel constants, fused as elementwise kernels; nothing
 * runs on the host */
Test(exec, batchnorm_alone_runs_as_elementwise_kernels) {
    need_cl();
    kf_model *m = gt_parse("opset 15\n"
                           "input x float[2, 3, 8, 8]\n"
                           "const scale float[3] = random\n"
                           "const bias float[3] = random\n"
                           "const mean float[3] = random\n"
                           "const var float[3] = 0.5 1.5 0.25\n"
                           "p = MaxPool(x) {kernel_shape=[2,2], strides=[2,2]}\n"
                           "y = BatchNormalization(p, scale, bias, mean, var) {epsilon=0.001}\n"
                           "h = HardSwish(y)\n"
                           "output h\n");
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.groups_ref, 0, "%u groups on the host", s.groups_ref);
    cgu_exec_matches_ref(x, m, 3);
    kf_exec_free(x);
    kf_model_free(m);
}

/* a ConstantOfShape of a constant shape over the saved-model fold cap
 * (2 MiB) and the Add of a constant to it fold when the plan is compiled:
 * one kernel per run, nothing on the host */
Test(exec, large_constant_of_shape_is_computed_once) {
    need_cl();
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[1024, 512]\n"
                           "const shp int64[2] = 1024 512\n"
                           "const k float[512] = random\n"
                           "c = ConstantOfShape(shp)\n"
                           "d = Add(c, k)\n"
                           "y = Add(x, d)\n"
                           "output y\n");
    kf_exec *x = make(m, KF_EXEC_OPENCL, temp_cache());
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    cr_assert_eq(s.groups_ref, 0, "%u groups on the host", s.groups_ref);
    cr_assert_eq(s.launches, 1);
    cgu_exec_matches_ref(x, m, 1);
    kf_exec_free(x);
    kf_model_free(m);
}
