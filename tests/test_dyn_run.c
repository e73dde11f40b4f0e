/*
 * test_dyn_run.c: one compiled plan of a model with symbolic dims runs
 * several input shapes on OpenCL: each distinct shape set is specialised
 * and compiled once (kf_exec_num_specs), a shape met again reuses its
 * plan, and every run equals the reference evaluator on the original model.
 * The models are the committed small exports (bench/models/small), whose
 * batch and sequence dims are symbolic as PyTorch's dynamic axes leave them.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>
#include <string.h>

#include "kf_exec.h"
#include "kf_onnx.h"
#include "kf_run.h"
#include "test_util.h"

#define SMALL KF_SOURCE_DIR "/bench/models/small/"

/* Inputs for the model's real inputs at batch b and sequence s: token ids
 * inside the small BERT's 512-row vocabulary, a mask of ones with the last
 * position of odd rows cleared, images in [-2, 2]. */
static void make_inputs(const kf_model *m, int64_t b, int64_t s, kf_tensor *ins, uint32_t *n) {
    kf_id *real;
    uint32_t nr;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &nr), KF_OK);
    for (uint32_t i = 0; i < nr; i++) {
        const kf_value *v = &m->graph->values[real[i]];
        const kf_type *t = &v->type;
        int64_t dims[KF_MAX_RANK];
        for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d] >= 0 ? t->dims[d] : d == 0 ? b : s;
        if (t->dtype == KF_DT_INT64) {
            cr_assert_eq(kf_tensor_alloc(&ins[i], KF_DT_INT64, t->rank, dims), KF_OK);
            bool mask = strstr(v->name, "mask") != NULL;
            for (int64_t k = 0; k < ins[i].numel; k++) {
                int64_t row = k / dims[t->rank - 1], col = k % dims[t->rank - 1];
                int64_t x = mask ? !(row % 2 && col == dims[t->rank - 1] - 1) : (int64_t)(tu_seed() + 7 * k) % 512;
                kf_set_i64(&ins[i], k, x < 0 ? -x : x);
            }
        } else {
            ins[i] = tu_rand(t->dtype, t->rank, dims, -2, 2);
        }
    }
    free(real);
    *n = nr;
}

static void run_shapes(const char *name, const int64_t (*shapes)[2], int nshapes) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
    char path[512];
    snprintf(path, sizeof path, SMALL "%s/model.onnx", name);
    kf_model *m;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_OPENCL;
    kf_exec *e;
    cr_assert_eq(kf_exec_create(m, &o, &e), KF_OK, "%s", kf_last_error());
    cr_expect_eq(kf_exec_num_specs(e), 0, "%s: compiled before any shape was given", name);
    uint32_t nout = kf_exec_num_outputs(e);
    for (int r = 0; r <= nshapes; r++) {
        int k = r < nshapes ? r : 0; /* the first shape once more at the end */
        kf_tensor ins[8];
        memset(ins, 0, sizeof ins);
        uint32_t nin;
        make_inputs(m, shapes[k][0], shapes[k][1], ins, &nin);
        kf_tensor want[4], got[4];
        memset(want, 0, sizeof want);
        memset(got, 0, sizeof got);
        cr_assert_eq(kf_eval_model(m, ins, (int)nin, want, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_exec_run(e, ins, nin, got), KF_OK, "%s at %lldx%lld: %s", name, (long long)shapes[k][0],
                     (long long)shapes[k][1], kf_last_error());
        for (uint32_t j = 0; j < nout; j++) {
            char msg[512];
            cr_expect(kf_run_close(&got[j], &want[j], msg, sizeof msg), "%s at %lldx%lld, output %u: %s", name,
                      (long long)shapes[k][0], (long long)shapes[k][1], j, msg);
            kf_tensor_release(&got[j]);
            kf_tensor_release(&want[j]);
        }
        for (uint32_t i = 0; i < nin; i++) kf_tensor_release(&ins[i]);
        kf_exec_stats st;
        kf_exec_get_stats(e, &st);
        cr_log_info("%s at %lldx%lld: specialisations %u, launches %u, groups on OpenCL %u, on ref %u", name,
                    (long long)shapes[k][0], (long long)shapes[k][1], kf_exec_num_specs(e), st.launches,
                    st.groups_dev, st.groups_ref);
        cr_expect_eq(kf_exec_num_specs(e), (uint32_t)(r < nshapes ? r + 1 : nshapes),
                     "%s: one compile per distinct shape set", name);
    }
    kf_exec_free(e);
    kf_model_free(m);
}

Test(dyn_run, bert_three_shapes_one_plan, .timeout = 600) {
    static const int64_t shapes[][2] = {{1, 5}, {2, 8}, {3, 11}};
    run_shapes("bert", shapes, 3);
}

Test(dyn_run, resnet50_three_batches_one_plan, .timeout = 600) {
    static const int64_t shapes[][2] = {{1, 0}, {2, 0}, {3, 0}};
    run_shapes("resnet50", shapes, 3);
}
