/*
 * test_opset_raise.c: raising a model's opset. Attributes that became
 * inputs become constants, changed defaults are written out, a change that
 * cannot be carried over leaves the model untouched and names the node;
 * and every ONNX backend test model the reference evaluator runs keeps its
 * expected outputs after being raised to opset 20.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opset_raise.h"

static void raise_ok(kf_model *m, int64_t target) {
    const char *why = "unset";
    kf_status st = kf_model_raise_opset(m, target, &why);
    cr_assert_eq(st, KF_OK, "raise: %s", kf_last_error());
    cr_assert_null(why);
    cr_assert_eq(kf_model_opset(m, ""), target);
}

static const kf_node *only(const kf_model *m, const char *op) {
    const kf_graph *g = m->graph;
    const kf_node *found = NULL;
    for (kf_id i = 1; i < g->nnodes; i++)
        if (!g->nodes[i].dead && !strcmp(g->nodes[i].op_type, op)) {
            cr_assert_null(found, "more than one %s", op);
            found = &g->nodes[i];
        }
    cr_assert_not_null(found, "no %s", op);
    return found;
}

Test(opset_raise, attributes_become_constant_inputs) {
    kf_model *m = gt_parse("opset 10\n"
                           "input x float[2, 3, 4]\n"
                           "a = ReduceSum(x) {axes=[2], keepdims=1}\n"
                           "b = ReduceMean(x) {axes=[1]}\n"
                           "c = Unsqueeze(x) {axes=[0]}\n"
                           "d = Squeeze(c) {axes=[0]}\n"
                           "s1, s2 = Split(d) {axis=1, split=[1, 2]}\n"
                           "e = Clip(s2) {min=-0.5, max=0.25}\n"
                           "f = Softmax(x) {axis=2}\n"
                           "g = Dropout(f) {ratio=0.25}\n"
                           "output a\n"
                           "output b\n"
                           "output s1\n"
                           "output e\n"
                           "output g\n");
    kf_model *orig = gt_copy(m);
    raise_ok(m, 20);
    cr_assert_eq(only(m, "ReduceSum")->nin, 2);
    cr_assert_null(kf_attr_find(only(m, "ReduceSum"), "axes"));
    cr_assert_eq(only(m, "ReduceMean")->nin, 2);
    cr_assert_eq(only(m, "Unsqueeze")->nin, 2);
    cr_assert_eq(only(m, "Squeeze")->nin, 2);
    cr_assert_eq(only(m, "Split")->nin, 2);
    cr_assert_eq(only(m, "Clip")->nin, 3);
    cr_assert_eq(only(m, "Dropout")->nin, 2);
    const kf_value *axes = &m->graph->values[only(m, "ReduceSum")->in[1]];
    cr_assert(axes->init && axes->init->dtype == KF_DT_INT64 && kf_get_i64(axes->init, 0) == 2);
    cr_assert_eq(kf_attr_i(only(m, "Softmax"), "axis", -99), 2);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(orig);
    kf_model_free(m);
}

Test(opset_raise, slice_pad_topk_and_upsample) {
    kf_model *m = gt_parse("opset 8\n"
                           "input x float[1, 2, 4, 6]\n"
                           "a = Slice(x) {starts=[1, 0], ends=[4, 5], axes=[2, 3]}\n"
                           "b = Pad(a) {pads=[0, 0, 1, 1, 0, 0, 0, 2], value=1.5}\n"
                           "c = Upsample(b) {mode=\"nearest\", scales=[1.0, 1.0, 2.0, 3.0]}\n"
                           "v, i = TopK(c) {k=3}\n"
                           "output v\n"
                           "output i\n");
    kf_model *orig = gt_copy(m);
    raise_ok(m, 13);
    cr_assert_eq(only(m, "Slice")->nin, 4);
    cr_assert_eq(only(m, "Pad")->nin, 3);
    cr_assert_eq(only(m, "TopK")->nin, 2);
    const kf_node *rs = only(m, "Resize");
    cr_assert_str_eq(kf_attr_s(rs, "coordinate_transformation_mode", ""), "asymmetric");
    cr_assert_str_eq(kf_attr_s(rs, "nearest_mode", ""), "floor");
    cr_assert_eq(rs->nin, 3);
    cr_assert_eq(rs->in[1], 0, "roi is optional from opset 13");
    cr_assert_eq(gt_count(m, "Upsample"), 0);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_model_free(orig);
    kf_model_free(m);
}

Test(opset_raise, does_not_raise_a_softmax_over_a_middle_axis) {
    kf_model *m = gt_parse("opset 11\n"
                           "input x float[2, 3, 4]\n"
                           "a = ReduceSum(x) {axes=[-1]}\n"
                           "y = Softmax(x) {axis=1}\n"
                           "output a\n"
                           "output y\n");
    const char *why = NULL;
    cr_assert_eq(kf_model_raise_opset(m, 13, &why), KF_ERR_UNSUPPORTED);
    cr_assert(why && strstr(why, "Softmax") && strstr(why, "not the last one") && strstr(why, "13"), "%s",
              why ? why : "(null)");
    /* nothing changed: the ReduceSum checked before the Softmax keeps its attribute */
    cr_assert_eq(kf_model_opset(m, ""), 11);
    cr_assert_not_null(kf_attr_find(only(m, "ReduceSum"), "axes"));
    cr_assert_eq(only(m, "ReduceSum")->nin, 1);
    kf_model_free(m);
}

Test(opset_raise, does_not_raise_past_what_the_evaluator_covers) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 3]\n"
                           "y = Relu(x)\n"
                           "output y\n");
    const char *why = NULL;
    cr_assert_eq(kf_model_raise_opset(m, 30, &why), KF_ERR_UNSUPPORTED);
    cr_assert(why && strstr(why, "30"), "%s", why ? why : "(null)");
    cr_assert_eq(kf_model_raise_opset(m, 17, &why), KF_OK, "already there");
    cr_assert_eq(kf_model_opset(m, ""), 17);
    kf_model_free(m);
}

/* ---- the ONNX backend test data ---------------------------------------------- */

#define TESTDATA "/usr/share/libonnx-testdata/data"
#define TARGET 20

static bool close_enough(const kf_tensor *got, const kf_tensor *want) {
    if (got->dtype != want->dtype || got->rank != want->rank || got->numel != want->numel) return false;
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) return false;
    if (got->dtype == KF_DT_STRING) return kf_tensor_equal(got, want);
    for (int64_t i = 0; i < got->numel; i++) {
        if (!kf_dtype_is_float(got->dtype)) {
            if (kf_get_i64(got, i) != kf_get_i64(want, i)) return false;
            continue;
        }
        double g = kf_get_f64(got, i), w = kf_get_f64(want, i);
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= 1e-7 + 1e-3 * fabs(w);
        if (!ok) return false;
    }
    return true;
}

/* Runs m on dir/test_data_set_0; true when every output matches. */
static bool matches_expected(const kf_model *m, const char *dir) {
    const kf_graph *g = m->graph;
    kf_id *real;
    uint32_t nreal;
    if (kf_graph_real_inputs(g, &real, &nreal)) return false;
    kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
    kf_tensor *outs = calloc(g->noutputs + 1, sizeof(kf_tensor));
    bool ok = true;
    char path[4096];
    for (uint32_t i = 0; i < nreal && ok; i++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%u.pb", dir, i);
        ok = kf_onnx_read_tensor_file(path, &ins[i], NULL) == KF_OK;
    }
    if (ok) ok = kf_eval_model(m, ins, (int)nreal, outs, NULL) == KF_OK;
    for (uint32_t o = 0; o < g->noutputs && ok; o++) {
        kf_tensor want = {0};
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%u.pb", dir, o);
        ok = kf_onnx_read_tensor_file(path, &want, NULL) == KF_OK && close_enough(&outs[o], &want);
        kf_tensor_release(&want);
    }
    for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
    for (uint32_t o = 0; o < g->noutputs; o++) kf_tensor_release(&outs[o]);
    free(ins);
    free(outs);
    free(real);
    return ok;
}

Test(opset_raise, testdata_keeps_expected_outputs_at_opset_20, .timeout = 900) {
    static const char *const suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
    int raised = 0, declined = 0, failed = 0, considered = 0;
    char first_fail[1024] = "";
    for (size_t s = 0; s < sizeof suites / sizeof *suites; s++) {
        char sdir[512];
        snprintf(sdir, sizeof sdir, "%s/%s", TESTDATA, suites[s]);
        DIR *d = opendir(sdir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "test_", 5)) continue;
            char dir[1024], path[1100];
            snprintf(dir, sizeof dir, "%s/%s", sdir, e->d_name);
            snprintf(path, sizeof path, "%s/model.onnx", dir);
            kf_model *m;
            if (kf_model_load(path, &m)) continue;
            if (kf_eval_unsupported_reason(m) || kf_model_opset(m, "") >= TARGET || !matches_expected(m, dir)) {
                kf_model_free(m);
                continue;
            }
            considered++;
            const char *why = NULL;
            kf_status st = kf_model_raise_opset(m, TARGET, &why);
            if (st == KF_ERR_UNSUPPORTED) {
                declined++;
                cr_log_info("declined %s: %s", e->d_name, why);
            } else if (st) {
                failed++;
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s: %s", e->d_name, kf_last_error());
            } else {
                raised++;
                const char *unsup = kf_eval_unsupported_reason(m);
                if (unsup || !matches_expected(m, dir)) {
                    failed++;
                    if (!first_fail[0])
                        snprintf(first_fail, sizeof first_fail, "%s: %s", e->d_name,
                                 unsup ? unsup : "outputs differ after raising");
                    cr_log_error("outputs differ after raising %s", e->d_name);
                }
            }
            kf_model_free(m);
        }
        closedir(d);
    }
    cr_log_info("opset raise to %d: %d models, %d raised, %d declined, %d failed", TARGET, considered, raised,
                declined, failed);
    fprintf(stderr, "opset raise to %d: %d models, %d raised, %d declined, %d failed\n", TARGET, considered, raised,
            declined, failed);
    cr_assert_gt(considered, 300, "the test data is missing");
    cr_assert_eq(failed, 0, "%d failed; first: %s", failed, first_fail);
    cr_assert_gt(raised, considered / 2, "most models should convert (%d of %d)", raised, considered);
}
