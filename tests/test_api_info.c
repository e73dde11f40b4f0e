/*
 * test_api_info.c: kf_compiled_output_info (include/kfuse/kfuse.h) against
 * what kf_run returns: every bundled model (bench/models/tiny_cnn.onnx,
 * bench/models/small/NAME/model.onnx) at two batch sizes (and sequence
 * lengths), asked before the run and again once the plan for the shapes
 * exists; a value-dependent dim reads KF_DIM_UNKNOWN; bad arguments are
 * typed errors.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_kernels.h"
#include "kfuse/kfuse.h"
#include "test_util.h"

#define MAX_IO 8

/* Input arrays of one shape set: symbolic dims at axis 0 are `batch`,
 * the others `seq`. Floats in [-1, 1); integers 0 or 1 (token ids,
 * masks: inside every table they index). */
typedef struct inputs {
    kf_host_tensor h[MAX_IO];
    int64_t dims[MAX_IO][8];
    int n;
} inputs;

static void make_inputs(const kf_compiled *c, int64_t batch, int64_t seq, inputs *in) {
    in->n = kf_compiled_num_inputs(c);
    cr_assert_leq(in->n, MAX_IO);
    for (int i = 0; i < in->n; i++) {
        int dtype, rank;
        cr_assert_eq(kf_compiled_input_info(c, i, &dtype, &rank, in->dims[i]), KF_OK, "%s", kf_last_error());
        cr_assert_geq(rank, 0);
        int64_t n = 1;
        for (int d = 0; d < rank; d++) {
            if (in->dims[i][d] < 0) in->dims[i][d] = d == 0 ? batch : seq;
            n *= in->dims[i][d];
        }
        void *data = NULL;
        if (dtype == 1) {
            float *f = malloc((size_t)n * sizeof *f + 1);
            for (int64_t k = 0; k < n; k++) f[k] = (float)tu_uniform(-1, 1);
            data = f;
        } else if (dtype == 7) {
            int64_t *v = malloc((size_t)n * sizeof *v + 1);
            for (int64_t k = 0; k < n; k++) v[k] = tu_uniform(0, 1) < 0.5 ? 0 : 1;
            data = v;
        } else
            cr_assert_fail("input %d: dtype %d not handled by this test", i, dtype);
        in->h[i] = (kf_host_tensor){dtype, rank, in->dims[i], data};
    }
}

static void free_inputs(inputs *in) {
    for (int i = 0; i < in->n; i++) free((void *)in->h[i].data);
}

/* Output info for in equals the outputs kf_run gives on them. */
static void info_matches_run(kf_compiled *c, const char *what, const inputs *in) {
    int nout = kf_compiled_num_outputs(c);
    cr_assert_leq(nout, MAX_IO);
    int dtype[MAX_IO], rank[MAX_IO];
    int64_t dims[MAX_IO][8];
    for (int o = 0; o < nout; o++)
        cr_assert_eq(kf_compiled_output_info(c, in->h, in->n, o, &dtype[o], &rank[o], dims[o]), KF_OK, "%s: %s", what,
                     kf_last_error());
    kf_output out[MAX_IO];
    cr_assert_eq(kf_run(c, in->h, in->n, out, nout), KF_OK, "%s: %s", what, kf_last_error());
    for (int o = 0; o < nout; o++) {
        const char *name = kf_compiled_output_name(c, o);
        cr_expect_eq(dtype[o], out[o].dtype, "%s output '%s': info dtype %d, run %d", what, name, dtype[o], out[o].dtype);
        cr_expect_eq(rank[o], out[o].rank, "%s output '%s': info rank %d, run %d", what, name, rank[o], out[o].rank);
        for (int d = 0; d < out[o].rank && d < rank[o]; d++)
            cr_expect_eq(dims[o][d], out[o].dims[d], "%s output '%s' dim %d: info %lld, run %lld", what, name, d,
                         (long long)dims[o][d], (long long)out[o].dims[d]);
        kf_output_release(&out[o]);
    }
}

static void check_model(const char *path) {
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s: %s", path, kf_last_error());
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s: %s", path, kf_last_error());
    kf_model_free(m);
    inputs a, b;
    make_inputs(c, 1, 4, &a);
    make_inputs(c, 3, 7, &b);
    char what[600];
    snprintf(what, sizeof what, "%s, batch 1", path);
    info_matches_run(c, what, &a);
    snprintf(what, sizeof what, "%s, batch 3", path);
    info_matches_run(c, what, &b);
    /* again at batch 1: now from the plan the run made */
    snprintf(what, sizeof what, "%s, batch 1 again", path);
    info_matches_run(c, what, &a);
    free_inputs(&a);
    free_inputs(&b);
    kf_compiled_free(c);
}

Test(api_info, bundled_models_match_run) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/models/tiny_cnn.onnx", tu_source_dir());
    check_model(path);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/bench/models/small", tu_source_dir());
    DIR *d = opendir(dir);
    cr_assert(d, "no %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (snprintf(path, sizeof path, "%s/%s/model.onnx", dir, e->d_name) >= (int)sizeof path) continue;
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fclose(f);
        check_model(path);
        n++;
    }
    closedir(d);
    cr_assert_geq(n, 5, "bundled small models: %d", n);
}

/* NonZero's count depends on the values: unknown before the run. */
Test(api_info, value_dependent_dim_is_unknown) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[5]\n"
                           "nz = NonZero(x)\n"
                           "output nz\n");
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    int64_t shape[1] = {5};
    kf_host_tensor x = {1, 1, shape, NULL}; /* data is not read */
    int dtype = 0, rank = 0;
    int64_t dims[8];
    cr_assert_eq(kf_compiled_output_info(c, &x, 1, 0, &dtype, &rank, dims), KF_OK, "%s", kf_last_error());
    cr_assert_eq(dtype, 7);
    cr_assert_eq(rank, 2);
    cr_assert_eq(dims[0], 1);
    cr_assert_eq(dims[1], KF_DIM_UNKNOWN);
    kf_compiled_free(c);
    kf_model_free(m);
}

Test(api_info, bad_arguments) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[N, 4]\n"
                           "input y float[4]\n"
                           "z = Add(x, y)\n"
                           "output z\n");
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    int64_t sx[2] = {2, 4}, sy[1] = {4};
    kf_host_tensor in[2] = {{1, 2, sx, NULL}, {1, 1, sy, NULL}};
    int dtype, rank;
    int64_t dims[8];
    cr_assert_eq(kf_compiled_output_info(c, in, 2, 0, &dtype, &rank, dims), KF_OK, "%s", kf_last_error());
    cr_assert_eq(rank, 2);
    cr_assert_eq(dims[0], 2);
    cr_assert_eq(dims[1], 4);
    cr_assert_eq(kf_compiled_output_info(c, in, 2, 1, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_output_info(c, in, 2, -1, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_output_info(c, in, 1, 0, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_output_info(c, in, 2, 0, NULL, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_compiled_output_info(NULL, in, 2, 0, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    in[1].dtype = 7; /* int64 where float is declared */
    cr_assert_eq(kf_compiled_output_info(c, in, 2, 0, &dtype, &rank, dims), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "'y'"), "%s", kf_last_error());
    in[1].dtype = 1;
    sy[0] = 5; /* [2,4] + [5] does not broadcast */
    cr_assert_eq(kf_compiled_output_info(c, in, 2, 0, &dtype, &rank, dims), KF_ERR_SHAPE);
    cr_log_info("mismatch: %s", kf_last_error());
    kf_compiled_free(c);
    kf_model_free(m);
}

/* ---- threads ------------------------------------------------------------ */

#define INFO_THREADS 4
#define INFO_ROUNDS 20 /* enough for the threads' calls to interleave */

typedef struct info_worker {
    kf_compiled *c;
    int64_t batch0; /* this thread alternates batch0 and batch0 + 1 */
    int wrong, failed;
} info_worker;

static void *info_work(void *arg) {
    info_worker *w = arg;
    for (int r = 0; r < INFO_ROUNDS; r++) {
        int64_t shape[4] = {w->batch0 + r % 2, 3, 8, 8};
        kf_host_tensor x = {1, 4, shape, NULL};
        int dtype, rank;
        int64_t dims[8];
        if (kf_compiled_output_info(w->c, &x, 1, 0, &dtype, &rank, dims) != KF_OK) w->failed++;
        else if (dtype != 1 || rank != 2 || dims[0] != shape[0] || dims[1] != 10) w->wrong++;
    }
    return NULL;
}

/* Threads asking for different shapes at once each get their own answer
 * (the remembered last answer is shared). */
Test(api_info, threads_get_their_own_shapes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/models/tiny_cnn.onnx", tu_source_dir());
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    kf_compiled *c = NULL;
    cr_assert_eq(kf_compile(m, KF_BACKEND_REF, &c), KF_OK, "%s", kf_last_error());
    info_worker w[INFO_THREADS];
    pthread_t th[INFO_THREADS];
    for (int t = 0; t < INFO_THREADS; t++) {
        w[t] = (info_worker){c, 1 + 2 * t, 0, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, info_work, &w[t]), 0);
    }
    for (int t = 0; t < INFO_THREADS; t++) {
        pthread_join(th[t], NULL);
        cr_expect_eq(w[t].failed, 0, "thread %d: %d calls failed", t, w[t].failed);
        cr_expect_eq(w[t].wrong, 0, "thread %d: %d answers were another thread's", t, w[t].wrong);
    }
    kf_compiled_free(c);
    kf_model_free(m);
}
