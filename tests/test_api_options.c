/*
 * test_api_options.c: kf_compile_options past backend and precision
 * (include/kfuse/kfuse.h): a client built against the first version's
 * size gets the environment's defaults for every later field, exactly as
 * before; each later field (target, device, cache folder, pattern files,
 * fixed dims, fusion and batching switches) changes what it says and
 * overrides its environment variable; bad values are typed errors.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_exec.h"
#include "kf_run.h"
#include "kfuse/kfuse.h"
#include "test_util.h"

/* elementwise chains around a GEMM and a reduction: several groups that
 * fuse, and independent ones that batch */
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
                           "e = Exp(x)\n"
                           "n = Neg(y)\n"
                           "output q\n"
                           "output t\n"
                           "output e\n"
                           "output n\n";
#define NOUT 4

/* Random inputs of the model, made once per test (gt_random_inputs draws
 * fresh values each call) and shared by every run in it. */
static kf_tensor *ins;
static uint32_t nins;

/* a private cache folder per test (KFUSE_CACHE_DIR), and a second one */
static char env_dir[64], own_dir[64];

static void rm_tree(const char *dir) {
    if (!dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

static void setup(void) {
    snprintf(env_dir, sizeof env_dir, "/tmp/kf-opt-env-XXXXXX");
    snprintf(own_dir, sizeof own_dir, "/tmp/kf-opt-own-XXXXXX");
    if (!mkdtemp(env_dir)) env_dir[0] = 0;
    if (!mkdtemp(own_dir)) own_dir[0] = 0;
    setenv("KFUSE_CACHE_DIR", env_dir, 1);
    unsetenv("KFUSE_DISABLE_FUSION");
    unsetenv("KFUSE_DISABLE_BATCHING");
    unsetenv("KFUSE_TARGET");
}

static void teardown(void) {
    for (uint32_t i = 0; ins && i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    ins = NULL;
    rm_tree(env_dir);
    rm_tree(own_dir);
}

TestSuite(api_options, .init = setup, .fini = teardown);

static void need_opencl(void) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
}

/* Files below dir (the cache's entries sit one level down). */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        DIR *s = opendir(sub);
        if (s) {
            closedir(s);
            n += count_files(sub);
        } else
            n++;
    }
    closedir(d);
    return n;
}

static kf_exec_stats stats_of(const kf_compiled *c) {
    kf_exec_stats s;
    kf_exec_get_stats(kf_compiled_exec(c), &s);
    return s;
}

/* Runs c on the test's inputs; outputs into out[NOUT] (caller releases). */
static void run_model(kf_compiled *c, const kf_model *m, kf_output *out) {
    if (!ins) gt_random_inputs(m, &ins, &nins);
    kf_host_tensor h[2];
    for (uint32_t i = 0; i < nins; i++) h[i] = (kf_host_tensor){(int)ins[i].dtype, ins[i].rank, ins[i].dims, ins[i].data};
    cr_assert_eq(kf_run(c, h, (int)nins, out, NOUT), KF_OK, "%s", kf_last_error());
}

/* The options a program compiled against the first kfuse.h passes. */
typedef struct options_v1 {
    size_t struct_size;
    kf_backend backend;
    kf_precision precision;
} options_v1;

/* The first version's size: every later field at its INIT value, so the
 * environment decides as it did (cache folder, fusion, batching), and the
 * plan is the one the full INIT options give. */
Test(api_options, first_version_size_keeps_old_behaviour) {
    need_opencl();
    cr_assert_eq(sizeof(options_v1), offsetof(kf_compile_options, precision) + sizeof(kf_precision));
    kf_model *m = gt_parse(MODEL);
    options_v1 v1 = {sizeof v1, KF_BACKEND_OPENCL, KF_PRECISION_FP32};
    kf_compiled *c1 = NULL, *c2 = NULL;
    cr_assert_eq(kf_compile_ex(m, (const kf_compile_options *)&v1, &c1), KF_OK, "%s", kf_last_error());
    cr_assert_gt(count_files(env_dir), 0, "a first-version client compiles into KFUSE_CACHE_DIR");
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_OPENCL;
    cr_assert_eq(kf_compile_ex(m, &o, &c2), KF_OK, "%s", kf_last_error());
    kf_exec_stats s1 = stats_of(c1), s2 = stats_of(c2);
    cr_assert_eq(s1.launches, s2.launches);
    cr_assert_eq(s1.kernels_unique, s2.kernels_unique);
    cr_assert_eq(s2.kernels_compiled, 0, "the second compile hits the same cache");
    kf_output a[NOUT], b[NOUT];
    run_model(c1, m, a);
    run_model(c2, m, b);
    for (int i = 0; i < NOUT; i++) {
        cr_assert_eq(a[i].nbytes, b[i].nbytes);
        cr_assert(memcmp(a[i].data, b[i].data, a[i].nbytes) == 0, "output %d differs", i);
        kf_output_release(&a[i]);
        kf_output_release(&b[i]);
    }
    kf_compiled_free(c1);
    kf_compiled_free(c2);

    /* the environment's switches still reach a first-version client */
    setenv("KFUSE_DISABLE_FUSION", "1", 1);
    cr_assert_eq(kf_compile_ex(m, (const kf_compile_options *)&v1, &c1), KF_OK, "%s", kf_last_error());
    o.fusion = KF_SWITCH_OFF;
    unsetenv("KFUSE_DISABLE_FUSION");
    cr_assert_eq(kf_compile_ex(m, &o, &c2), KF_OK, "%s", kf_last_error());
    cr_assert_eq(stats_of(c1).launches, stats_of(c2).launches);
    cr_assert_gt(stats_of(c1).launches, s1.launches, "fusion off: more launches (%u vs %u)", stats_of(c1).launches,
                 s1.launches);
    kf_compiled_free(c1);
    kf_compiled_free(c2);
    kf_model_free(m);
}

Test(api_options, struct_sizes) {
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_REF;
    /* between the first version and this one: not a size any kfuse.h had */
    o.struct_size = offsetof(kf_compile_options, cache_dir);
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "struct_size"), "%s", kf_last_error());
    struct {
        kf_compile_options o;
        int later;
    } big = {o, 1};
    big.o.struct_size = sizeof big;
    cr_assert_eq(kf_compile_ex(m, &big.o, &c), KF_ERR_UNSUPPORTED);
    cr_assert_null(c);
    kf_model_free(m);
}

Test(api_options, bad_values_are_typed_errors) {
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_REF;
    o.fusion = (kf_switch)7;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    o.fusion = KF_SWITCH_DEFAULT;
    o.npattern_files = 1;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    o.npattern_files = 0;
    o.ndims = -1;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    kf_dim d = {NULL, 3};
    o.dims = &d;
    o.ndims = 1;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    d = (kf_dim){"N", -2};
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_INVALID_ARG);
    o.ndims = 0;
    o.target = "no-such-target";
    cr_assert_neq(kf_compile_ex(m, &o, &c), KF_OK);
    cr_assert(strstr(kf_last_error(), "no-such-target"), "%s", kf_last_error());
    cr_assert_null(c);
    o.target = "none";
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_options, device_ordinal) {
    need_opencl();
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_OPENCL;
    o.device = 0;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    kf_compiled_free(c);
    o.device = 999;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_NO_DEVICE);
    cr_assert(strstr(kf_last_error(), "999"), "%s", kf_last_error());
    o.device = -1;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_NO_DEVICE);
    o.backend = KF_BACKEND_CUDA;
    o.device = 999;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_NO_DEVICE, "%s", kf_last_error());
    cr_assert_null(c);
    kf_model_free(m);
}

/* cache_dir wins over KFUSE_CACHE_DIR. */
Test(api_options, cache_dir) {
    need_opencl();
    kf_model *m = gt_parse(MODEL);
    kf_compiled *c = NULL;
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_OPENCL;
    char sub[128];
    snprintf(sub, sizeof sub, "%s/made", own_dir); /* created when missing */
    o.cache_dir = sub;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_gt(count_files(sub), 0);
    cr_assert_eq(count_files(env_dir), 0, "nothing went to KFUSE_CACHE_DIR");
    kf_compiled_free(c);
    kf_model_free(m);
}

/* fusion and batching switches, both ways against the environment */
Test(api_options, fusion_and_batching_switches) {
    need_opencl();
    kf_model *m = gt_parse(MODEL);
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_OPENCL;
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    kf_exec_stats def = stats_of(c);
    kf_compiled_free(c);
    o.batching = KF_SWITCH_OFF;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    kf_exec_stats nobatch = stats_of(c);
    kf_compiled_free(c);
    cr_assert_gt(nobatch.launches, def.launches, "batching off: %u launches, on: %u", nobatch.launches, def.launches);
    setenv("KFUSE_DISABLE_BATCHING", "1", 1);
    o.batching = KF_SWITCH_ON; /* the field beats the variable */
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(stats_of(c).launches, def.launches);
    kf_compiled_free(c);
    o.batching = KF_SWITCH_DEFAULT; /* the variable decides */
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(stats_of(c).launches, nobatch.launches);
    kf_compiled_free(c);
    unsetenv("KFUSE_DISABLE_BATCHING");
    o.batching = KF_SWITCH_DEFAULT;
    o.fusion = KF_SWITCH_OFF;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_gt(stats_of(c).groups_dev + stats_of(c).groups_ref, def.groups_dev + def.groups_ref);
    kf_output a[NOUT];
    run_model(c, m, a); /* still runs */
    for (int i = 0; i < NOUT; i++) kf_output_release(&a[i]);
    kf_compiled_free(c);
    setenv("KFUSE_DISABLE_FUSION", "1", 1);
    o.fusion = KF_SWITCH_ON;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    cr_assert_eq(stats_of(c).launches, def.launches);
    kf_compiled_free(c);
    kf_model_free(m);
}

/* A rule file reaches the optimizer: tanh(x) -> sigmoid(x) is wrong on
 * purpose, so its effect shows in the output. A file that does not
 * parse, or is missing, fails the compile naming it. */
Test(api_options, pattern_files) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4]\n"
                           "y = Tanh(x)\n"
                           "output y\n");
    char good[128], bad[128];
    snprintf(good, sizeof good, "%s/t2s.kfp", own_dir);
    snprintf(bad, sizeof bad, "%s/bad.kfp", own_dir);
    FILE *f = fopen(good, "w");
    cr_assert(f);
    fputs("rule tanh_to_sigmoid\n  match\n    y = Tanh(x)\n  replace\n    y = Sigmoid(x)\nend\n", f);
    fclose(f);
    f = fopen(bad, "w");
    cr_assert(f);
    fputs("rule broken\n  match\n    y = \n", f);
    fclose(f);
    const char *files[1] = {good};
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_REF;
    o.pattern_files = files;
    o.npattern_files = 1;
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    int64_t dims[1] = {4};
    float x[4] = {-1.5f, -0.25f, 0.5f, 2.0f};
    kf_host_tensor in = {1, 1, dims, x};
    kf_output out;
    cr_assert_eq(kf_run(c, &in, 1, &out, 1), KF_OK, "%s", kf_last_error());
    for (int i = 0; i < 4; i++) {
        float want = 1.0f / (1.0f + expf(-x[i]));
        cr_expect_float_eq(((float *)out.data)[i], want, 1e-5, "element %d: the rule ran", i);
    }
    kf_output_release(&out);
    kf_compiled_free(c);
    files[0] = bad;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "bad.kfp"), "%s", kf_last_error());
    files[0] = "/nonexistent/x.kfp";
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), "/nonexistent/x.kfp"), "%s", kf_last_error());
    cr_assert_null(c);
    kf_model_free(m);
}

/* Fixed dims make the declared shape static and bind runs to it. */
Test(api_options, fixed_dims) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[N, 10]\n"
                           "const w float[10, 4] = random\n"
                           "y = MatMul(x, w)\n"
                           "output y\n");
    kf_dim dims[2] = {{"N", 3}, {"not_in_the_model", 5}};
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = KF_BACKEND_REF;
    o.dims = dims;
    o.ndims = 2;
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile_ex(m, &o, &c), KF_OK, "%s", kf_last_error());
    int dtype, rank;
    int64_t d[8];
    cr_assert_eq(kf_compiled_input_info(c, 0, &dtype, &rank, d), KF_OK, "%s", kf_last_error());
    cr_assert_eq(rank, 2);
    cr_assert_eq(d[0], 3);
    float x[4 * 10] = {0.25f, -1.0f, 0.5f};
    int64_t shape[2] = {3, 10};
    kf_host_tensor in = {1, 2, shape, x};
    kf_output out;
    cr_assert_eq(kf_run(c, &in, 1, &out, 1), KF_OK, "%s", kf_last_error());
    cr_assert_eq(out.dims[0], 3);
    kf_output_release(&out);
    shape[0] = 4;
    cr_assert_eq(kf_run(c, &in, 1, &out, 1), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "'x'"), "%s", kf_last_error());
    kf_compiled_free(c);
    kf_model_free(m);
}

/* ---- kf_model_fuse --------------------------------------------------------- */

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* kf_model_fuse writes the file `kfuse fuse` writes, byte for byte, for
 * the same target and dims; its report is the --json one. */
static void fuse_matches_cli(const char *rel, const char *cli_flags, const kf_compile_options *o) {
    static char log[1 << 20]; /* the CLI's JSON report and messages */
    char bin[1024], model[1024], out[256], args[4096];
    tu_cli_find("api_options", bin, sizeof bin);
    snprintf(model, sizeof model, "%s/%s", tu_source_dir(), rel);
    snprintf(out, sizeof out, "%s/cli.onnx", own_dir);
    snprintf(args, sizeof args, "fuse '%s' -o '%s' %s --json", model, out, cli_flags);
    cr_assert_eq(tu_cli_run(bin, "", args, log, sizeof log), 0, "%s", log);
    size_t want_len, got_len;
    void *want = read_all(out, &want_len), *got = NULL;
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(model, &m), KF_OK, "%s", kf_last_error());
    char *report = NULL;
    cr_assert_eq(kf_model_fuse(m, o, &report), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_model_save_memory(m, &got, &got_len), KF_OK, "%s", kf_last_error());
    cr_assert_eq(got_len, want_len, "%s: %zu bytes, the CLI wrote %zu", rel, got_len, want_len);
    cr_assert(memcmp(got, want, got_len) == 0, "%s: the bytes differ from the CLI's", rel);
    cr_assert(report && strstr(report, "\"functions\""), "%s", report ? report : "(none)");
    size_t n = strlen(report);
    while (n && report[n - 1] == '\n') report[--n] = 0;
    cr_assert(strstr(log, report), "%s: the report differs from `kfuse fuse --json`'s", rel);
    free(report);
    free(want);
    free(got);
    kf_model_free(m);
}

Test(api_options, fuse_matches_cli) {
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    fuse_matches_cli("bench/models/tiny_cnn.onnx", "", &o);
    kf_dim dims[2] = {{"batch", 2}, {"seq", 8}};
    o.target = "h100";
    o.dims = dims;
    o.ndims = 2;
    fuse_matches_cli("bench/models/small/bert/model.onnx", "--target h100 --dim batch=2 --dim seq=8", &o);
    o.precision = KF_PRECISION_FP16;
    o.ndims = 1;
    fuse_matches_cli("bench/models/small/resnet50/model.onnx", "--target h100 --dim batch=2 --precision fp16", &o);
}

Test(api_options, fuse_errors) {
    kf_model *m = gt_parse(MODEL);
    cr_assert_eq(kf_model_fuse(NULL, NULL, NULL), KF_ERR_INVALID_ARG);
    const char *files[1] = {"/nonexistent/p.kfp"};
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.pattern_files = files;
    o.npattern_files = 1;
    char *report = (char *)1;
    cr_assert_eq(kf_model_fuse(m, &o, &report), KF_ERR_IO);
    cr_assert_null(report);
    o.npattern_files = 0;
    o.struct_size = 3;
    cr_assert_eq(kf_model_fuse(m, &o, NULL), KF_ERR_INVALID_ARG);
    o.struct_size = sizeof o;
    cr_assert_eq(kf_model_fuse(m, &o, NULL), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
}
