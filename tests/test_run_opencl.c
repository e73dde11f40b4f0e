/*
 * test_run_opencl.c: `kfuse run --backend opencl --check` through its API
 * (kernels/kf_run.h): whole models run on generated OpenCL kernels with the
 * reference evaluator for the rest, outputs equal to the unoptimized model
 * on ref; the group summary proves elementwise groups really run on OpenCL;
 * and the ONNX node test folders as a CI-visible count.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_run.h"

static void need_cl(void) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
}

/* Runs m on ref (before it is rewritten) and on opencl with the same
 * inputs; asserts every output matches. Frees m. Returns the summary. */
static kf_run_summary run_checked(kf_model *m, kf_tensor *ins, uint32_t nins) {
    uint32_t nout = m->graph->noutputs;
    kf_tensor *want = calloc(nout + 1, sizeof(kf_tensor)), *got = calloc(nout + 1, sizeof(kf_tensor));
    cr_assert_eq(kf_eval_model(m, ins, (int)nins, want, NULL), KF_OK, "%s", kf_last_error());
    kf_run_summary s;
    cr_assert_eq(kf_run_opencl(m, ins, (int)nins, got, NULL, &s), KF_OK, "%s", kf_last_error());
    for (uint32_t o = 0; o < nout; o++) {
        char why[512];
        cr_expect(kf_run_close(&got[o], &want[o], why, sizeof why), "output %u: %s", o, why);
        kf_tensor_release(&got[o]);
        kf_tensor_release(&want[o]);
    }
    free(got);
    free(want);
    kf_model_free(m);
    return s;
}

static kf_run_summary run_text(const char *text) {
    kf_model *m = gt_parse(text);
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_run_summary s = run_checked(m, ins, nins);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
    return s;
}

/* elementwise-heavy: a GELU chain with broadcast bias, then a comparison
 * mask (bool) and Where; every group but none should be generatable */
static const char *EW = "opset 13\n"
                        "input x float[2, 3, 8]\n"
                        "const b float[8] = random\n"
                        "const s2 float[] = 1.4142135\n"
                        "const one float[] = 1\n"
                        "const half float[] = 0.5\n"
                        "y = Add(x, b)\n"
                        "d = Div(y, s2)\n"
                        "e = Erf(d)\n"
                        "f = Add(e, one)\n"
                        "g = Mul(y, f)\n"
                        "z = Mul(g, half)\n"
                        "r = Relu(z)\n"
                        "output r\n";

Test(run_opencl, elementwise_graph_runs_generated) {
    need_cl();
    kf_run_summary s = run_text(EW);
    cr_log_info("elementwise graph: %u groups on OpenCL, %u on ref", s.groups_cl, s.groups_ref);
    cr_assert_geq(s.groups_cl, 1, "the elementwise graph fell back to ref everywhere");
}

/* a GEMM anchor and a row maximum by TopK (no kernel: the reference runs
 * it) between elementwise parts: mixed backends */
Test(run_opencl, mixed_graph_matches_ref) {
    need_cl();
    kf_run_summary s = run_text("opset 13\n"
                                "input x float[4, 6]\n"
                                "const w float[6, 5] = random\n"
                                "const c float[5] = random\n"
                                "const k float[] = 0.25\n"
                                "a = Mul(x, k)\n"
                                "t = Tanh(a)\n"
                                "m = MatMul(t, w)\n"
                                "n = Add(m, c)\n"
                                "const kk int64[1] = 1\n"
                                "s, si = TopK(n, kk) {axis=1}\n"
                                "q = Sub(n, s)\n"
                                "e = Exp(q)\n"
                                "output e\n"
                                "output t\n");
    cr_assert_geq(s.groups_ref, 1);
    cr_assert_geq(s.groups_cl + s.groups_ref, 2);
}

/* symbolic batch: the run specializes it from the input (N becomes 3) */
Test(run_opencl, symbolic_dims_are_specialized) {
    need_cl();
    kf_run_summary s = run_text("opset 13\n"
                                "input x float[N, 4]\n"
                                "input y float[N, 4]\n"
                                "a = Add(x, y)\n"
                                "b = Sigmoid(a)\n"
                                "c = Greater(b, y)\n"
                                "output b\n"
                                "output c\n");
    cr_assert_geq(s.groups_cl, 1, "static after specialization, so generated");
}

Test(run_opencl, tiny_cnn_matches_ref) {
    need_cl();
    kf_model *m;
    cr_assert_eq(kf_model_load(KF_SOURCE_DIR "/bench/models/tiny_cnn.onnx", &m), KF_OK, "%s", kf_last_error());
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_run_summary s = run_checked(m, ins, nins);
    cr_log_info("tiny_cnn: %u groups on OpenCL, %u on ref", s.groups_cl, s.groups_ref);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins);
}

Test(run_opencl, close_names_first_difference) {
    int64_t d[1] = {3};
    kf_tensor a = tu_f32(1, d, (const float[]){1, 2, 3}), b = tu_f32(1, d, (const float[]){1, 2.5f, 3});
    char why[256];
    cr_assert(kf_run_close(&a, &a, why, sizeof why));
    cr_assert_not(kf_run_close(&a, &b, why, sizeof why));
    cr_assert(strstr(why, "element 1") != NULL, "%s", why);
    kf_tensor i1 = tu_i64(1, d, (const int64_t[]){1, 2, 3}), i2 = tu_i64(1, d, (const int64_t[]){1, 2, 4});
    cr_assert_not(kf_run_close(&i1, &i2, why, sizeof why));
    cr_assert(strstr(why, "element 2") != NULL, "%s", why);
    kf_tensor_release(&a);
    kf_tensor_release(&b);
    kf_tensor_release(&i1);
    kf_tensor_release(&i2);
}

/* DESIGN.md's policy per dtype: 1 against 1 + 2^-6 is within bfloat16's
 * (atol 2e-2, rtol 1e-2) and outside float16's (2.5e-3, 1e-3). */
Test(run_opencl, close_uses_the_dtype_tolerance) {
    int64_t d[1] = {2};
    kf_dtype dts[2] = {KF_DT_BFLOAT16, KF_DT_FLOAT16};
    for (int k = 0; k < 2; k++) {
        kf_tensor a = {0}, b = {0};
        cr_assert_eq(kf_tensor_alloc(&a, dts[k], 1, d), KF_OK);
        cr_assert_eq(kf_tensor_alloc(&b, dts[k], 1, d), KF_OK);
        kf_set_f64(&a, 0, 1.0);
        kf_set_f64(&b, 0, 1.0 + 1.0 / 64);
        kf_set_f64(&a, 1, -3.0);
        kf_set_f64(&b, 1, -3.0);
        char why[256];
        cr_assert_eq(kf_run_close(&a, &b, why, sizeof why), dts[k] == KF_DT_BFLOAT16, "%s: %s",
                     kf_dtype_name(dts[k]), why);
        kf_tensor_release(&a);
        kf_tensor_release(&b);
    }
}

Test(run_opencl, no_device_is_an_error_not_a_fallback) {
    if (!kf_cl_unavailable()) cr_skip_test("an OpenCL device is present");
    kf_model *m = gt_parse(EW);
    kf_tensor out[2] = {0};
    cr_assert_eq(kf_run_opencl(m, NULL, 0, out, NULL, NULL), KF_ERR_NO_DEVICE);
    kf_model_free(m);
}

/* ---- ONNX node test folders: a CI-visible figure ------------------------ */

#define NODE_DIR "/usr/share/libonnx-testdata/data/node"

/* Reads test_data_set_0/input_<i>.pb of folder dir; false when absent. */
static bool read_inputs(const char *dir, kf_tensor *ins, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%u.pb", dir, i);
        char *name = NULL;
        if (kf_onnx_read_tensor_file(path, &ins[i], &name)) return false;
        free(name);
    }
    return true;
}

/* Every node test the reference evaluator runs also runs on opencl with
 * outputs equal to ref; counts models with a generated group. */
Test(run_opencl, onnx_node_tests, .timeout = 600) {
    need_cl();
    DIR *d = opendir(NODE_DIR);
    if (!d) cr_skip_test("%s is absent", NODE_DIR);
    unsigned ran = 0, generated = 0, mismatched = 0, failed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[4096], path[4200];
        snprintf(dir, sizeof dir, "%s/%s", NODE_DIR, e->d_name);
        snprintf(path, sizeof path, "%s/model.onnx", dir);
        kf_model *m;
        if (kf_model_load(path, &m)) continue;
        kf_id *real = NULL;
        uint32_t nreal = 0;
        kf_tensor *ins = NULL, *want = NULL, *got = NULL;
        uint32_t nout = m->graph->noutputs;
        if (kf_eval_unsupported_reason(m) || kf_graph_real_inputs(m->graph, &real, &nreal)) goto next;
        ins = calloc(nreal + 1, sizeof(kf_tensor));
        want = calloc(nout + 1, sizeof(kf_tensor));
        got = calloc(nout + 1, sizeof(kf_tensor));
        if (!read_inputs(dir, ins, nreal) || kf_eval_model(m, ins, (int)nreal, want, NULL)) goto next;
        kf_run_summary s;
        ran++;
        if (kf_run_opencl(m, ins, (int)nreal, got, NULL, &s)) {
            failed++;
            cr_log_warn("%s: opencl run failed: %s", e->d_name, kf_last_error());
            goto next;
        }
        if (s.groups_cl) generated++;
        for (uint32_t o = 0; o < nout; o++) {
            char why[512];
            if (!kf_run_close(&got[o], &want[o], why, sizeof why)) {
                mismatched++;
                cr_log_error("%s: output %u differs from ref: %s", e->d_name, o, why);
                break;
            }
        }
    next:
        for (uint32_t i = 0; ins && i < nreal; i++) kf_tensor_release(&ins[i]);
        for (uint32_t o = 0; o < nout; o++) {
            if (want) kf_tensor_release(&want[o]);
            if (got) kf_tensor_release(&got[o]);
        }
        free(ins);
        free(want);
        free(got);
        free(real);
        kf_model_free(m);
    }
    closedir(d);
    cr_log_info("onnx node tests on opencl: %u ran, %u with a generated group, %u mismatches, %u failed runs",
                ran, generated, mismatched, failed);
    cr_expect_eq(mismatched, 0);
    cr_expect_eq(failed, 0, "a model ref runs must also run on opencl");
    cr_expect_gt(generated, 0);
}

/* Indices read from data: a bad one fails the run on OpenCL as on ref
 * (KF_ERR_RUNTIME naming the Gather and the index), in an elementwise
 * kernel and in a reduction's prologue; good ones (negative included)
 * run generated and match ref. */
Test(run_opencl, bad_gather_index_fails_the_run_naming_the_node) {
    need_cl();
    static const char *texts[] = {
        "opset 13\ninput x float[4, 3]\ninput i int64[2]\ng = Gather(x, i) {axis=0}\ny = Relu(g)\noutput y\n",
        "opset 13\ninput x float[5, 40]\ninput i int32[3]\ng = Gather(x, i) {axis=0}\ne = Exp(g)\n"
        "y = ReduceMax(e) {axes=[1], keepdims=0}\noutput y\n",
        "opset 13\ninput x float[4, 3]\ninput i int64[2, 2]\ng = GatherND(x, i)\ny = Relu(g)\noutput y\n",
    };
    static const int64_t bad[][4] = {{1, 99, 0, 0}, {0, -6, 2, 0}, {0, 1, 2, -4}},
                         good[][4] = {{-4, 3, 0, 0}, {-5, 4, 0, 0}, {3, -3, 0, 2}};
    static const char *want[] = {"index 99 is out of range for a dimension of size 4",
                                 "index -6 is out of range for a dimension of size 5",
                                 "index -4 is out of range for a dimension of size 3"};
    for (int c = 0; c < 3; c++) {
        kf_model *m = gt_parse(texts[c]);
        kf_tensor *ins;
        uint32_t nins;
        gt_random_inputs(m, &ins, &nins);
        cr_assert_eq(nins, 2);
        for (int64_t j = 0; j < ins[1].numel; j++) kf_set_f64(&ins[1], j, (double)bad[c][j]);
        kf_tensor out[1] = {0};
        kf_run_summary s;
        kf_status st = kf_run_opencl(m, ins, (int)nins, out, NULL, &s);
        cr_expect_eq(st, KF_ERR_RUNTIME, "case %d: status %d: %s", c, st, kf_last_error());
        cr_expect(strstr(kf_last_error(), want[c]) && strstr(kf_last_error(), "Gather"), "case %d: %s", c,
                  kf_last_error());
        kf_tensor_release(&out[0]);
        for (int64_t j = 0; j < ins[1].numel; j++) kf_set_f64(&ins[1], j, (double)good[c][j]);
        s = run_checked(m, ins, nins);
        cr_expect_eq(s.groups_ref, 0, "case %d: every group runs generated", c);
        for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
        free(ins);
    }
}
