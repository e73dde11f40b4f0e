/*
 * test_opt_models.c: `kfuse opt` on real graphs. For every model of the
 * ONNX test data that the reference evaluator runs, and every model in
 * ../shared/models, the optimized model's outputs equal the original's on
 * the model's own test inputs (fp32 atol 1e-5 rtol 1e-4, fp16 2.5e-3/1e-3,
 * bf16 2e-2/1e-2, integers and data movement exactly), and the optimized
 * model survives an ONNX round trip.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_run.h"
#include "graph_text.h"
#include "test_util.h"

#define TESTDATA "/usr/share/libonnx-testdata/data"
#define SHARED_MODELS KF_SOURCE_DIR "/../shared/models/ort"

typedef struct tally {
    int checked, unsupported, failed;
    uint64_t nodes_before, nodes_after;
    char first[1536];
} tally;

static void note(tally *t, const char *fmt, const char *a, const char *b) {
    if (!t->failed++) snprintf(t->first, sizeof t->first, fmt, a, b);
}

static void check_model(const char *path, const char *data_dir, tally *t) {
    kf_model *m, *o;
    if (kf_model_load(path, &m) != KF_OK) return;
    if (kf_eval_unsupported_reason(m)) {
        t->unsupported++;
        kf_model_free(m);
        return;
    }
    cr_assert_eq(kf_model_load(path, &o), KF_OK);
    kf_opt_options opts;
    kf_opt_options_default(&opts);
    opts.fuel = -1;
    kf_opt_result res;
    kf_status st = kf_optimize(o, &opts, &res);
    kf_rules_free(&res.rules);
    if (st) {
        note(t, "%s: optimize: %s", path, kf_last_error());
        goto out;
    }
    t->nodes_before += res.nodes_before;
    t->nodes_after += res.nodes_after;
    {
        void *buf;
        size_t len;
        kf_model *rt;
        if (kf_model_save_memory(o, &buf, &len) != KF_OK || kf_model_load_memory(buf, len, NULL, &rt) != KF_OK) {
            note(t, "%s: optimized model does not round trip: %s", path, kf_last_error());
            goto out;
        }
        free(buf);
        kf_model_free(o);
        o = rt;
    }
    kf_id *real;
    uint32_t nreal;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &nreal), KF_OK);
    kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
    uint32_t nout = m->graph->noutputs;
    kf_tensor *a = calloc(nout + 1, sizeof(kf_tensor)), *b = calloc(nout + 1, sizeof(kf_tensor));
    bool have = true;
    if (data_dir) {
        have = gt_load_dataset_inputs(m, data_dir, ins, nreal, real);
    } else {
        for (uint32_t i = 0; i < nreal && have; i++) {
            const kf_type *ty = &m->graph->values[real[i]].type;
            if (ty->rank < 0 || !ty->dtype) have = false;
            int64_t dims[KF_MAX_RANK];
            for (int d = 0; have && d < ty->rank; d++) dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : 2;
            if (have) ins[i] = tu_rand(ty->dtype, ty->rank, dims, kf_dtype_is_float(ty->dtype) ? -2 : 0,
                                       kf_dtype_is_float(ty->dtype) ? 2 : 2);
        }
    }
    if (have && kf_eval_model(m, ins, (int)nreal, a, NULL) == KF_OK) {
        t->checked++;
        if (o->graph->noutputs != nout) {
            note(t, "%s: output count changed%s", path, "");
        } else if (kf_eval_model(o, ins, (int)nreal, b, NULL) != KF_OK) {
            note(t, "%s: optimized model fails: %s", path, kf_last_error());
        } else {
            for (uint32_t k = 0; k < nout; k++) {
                double atol, rtol;
                kf_run_tolerance(a[k].dtype, &atol, &rtol);
                char why[512];
                if (strcmp(m->graph->values[m->graph->outputs[k]].name, o->graph->values[o->graph->outputs[k]].name)) {
                    note(t, "%s: output name changed (%s)", path, m->graph->values[m->graph->outputs[k]].name);
                    break;
                }
                if (!tu_close(&b[k], &a[k], atol, rtol, why, sizeof why)) {
                    note(t, "%s: optimized output differs: %s", path, why);
                    break;
                }
            }
        }
    }
    for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
    for (uint32_t k = 0; k < nout; k++) {
        kf_tensor_release(&a[k]);
        kf_tensor_release(&b[k]);
    }
    free(ins);
    free(a);
    free(b);
    free(real);
out:
    kf_model_free(m);
    kf_model_free(o);
}

Test(opt_models, testdata_outputs_unchanged_by_optimization, .timeout = 600) {
    static const char *const suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
    tally t = {0};
    int seen = 0;
    for (size_t s = 0; s < 4; s++) {
        char base[512];
        snprintf(base, sizeof base, "%s/%s", TESTDATA, suites[s]);
        DIR *d = opendir(base);
        if (!d) cr_skip_test("Debian's libonnx-testdata is not installed (%s)", base);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char model[1200], data[1200];
            snprintf(model, sizeof model, "%s/%s/model.onnx", base, e->d_name);
            snprintf(data, sizeof data, "%s/%s/test_data_set_0", base, e->d_name);
            check_model(model, data, &t);
            seen++;
        }
        closedir(d);
    }
    cr_log_info("opt over the test data: %d models, %d checked, %d unsupported, nodes %llu -> %llu", seen, t.checked,
                t.unsupported, (unsigned long long)t.nodes_before, (unsigned long long)t.nodes_after);
    cr_assert_gt(t.checked, 700);
    cr_assert_eq(t.failed, 0, "%d models changed under optimization; first: %s", t.failed, t.first);
}

static void check_found(const char *model, const char *data_dir, void *user) { check_model(model, data_dir, user); }

Test(opt_models, shared_models_outputs_unchanged_by_optimization, .timeout = 600) {
    DIR *d = opendir(SHARED_MODELS);
    if (!d) cr_skip_test("../shared/models is not beside the repository (%s)", SHARED_MODELS);
    closedir(d);
    tally t = {0};
    int seen = 0;
    seen = gt_walk_models(SHARED_MODELS, check_found, &t);
    cr_log_info("opt over shared models: %d models, %d checked, nodes %llu -> %llu", seen, t.checked,
                (unsigned long long)t.nodes_before, (unsigned long long)t.nodes_after);
    cr_assert_eq(t.failed, 0, "%s", t.first);
    cr_assert_geq(t.checked, 20, "most shared models run on the reference evaluator (%d of %d)", t.checked, seen);
}
