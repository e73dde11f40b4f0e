/*
 * test_models.c: whole-model tests over Debian's ONNX backend test data:
 * every model survives import -> export -> import unchanged, and every
 * shape the inference predicts equals the shape the reference kernels
 * actually produce.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_onnx.h"
#include "test_util.h"

#define TESTDATA "/usr/share/libonnx-testdata/data"
static const char *const suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

typedef void (*model_fn)(const char *dir, void *user);

/* Calls fn for every test folder with a model.onnx; returns how many. */
static int each_model(model_fn fn, void *user) {
    int count = 0;
    for (size_t s = 0; s < sizeof suites / sizeof *suites; s++) {
        char base[512];
        snprintf(base, sizeof base, "%s/%s", TESTDATA, suites[s]);
        DIR *d = opendir(base);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char dir[1024];
            if (snprintf(dir, sizeof dir, "%s/%s", base, e->d_name) >= (int)sizeof dir) continue;
            fn(dir, user);
            count++;
        }
        closedir(d);
    }
    return count;
}

static void need_testdata(void) {
    DIR *d = opendir(TESTDATA "/node");
    if (!d) cr_skip_test("Debian's libonnx-testdata is not installed (" TESTDATA ")");
    closedir(d);
}

typedef struct tally {
    int ok, bad;
    char first[1024];
} tally;

static void roundtrip_one(const char *dir, void *user) {
    tally *t = user;
    char path[1200];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    kf_model *a, *b;
    if (kf_model_load(path, &a) != KF_OK) {
        if (!t->bad++) snprintf(t->first, sizeof t->first, "%s: load: %s", path, kf_last_error());
        return;
    }
    void *buf;
    size_t len;
    kf_status st = kf_model_save_memory(a, &buf, &len);
    if (st == KF_OK) {
        st = kf_model_load_memory(buf, len, dir, &b);
        free(buf);
    }
    if (st != KF_OK) {
        if (!t->bad++) snprintf(t->first, sizeof t->first, "%s: %s", path, kf_last_error());
        kf_model_free(a);
        return;
    }
    char why[512];
    if (kf_model_equal(a, b, why, sizeof why)) t->ok++;
    else if (!t->bad++) snprintf(t->first, sizeof t->first, "%s: %s", path, why);
    kf_model_free(a);
    kf_model_free(b);
}

Test(models, every_testdata_model_round_trips, .timeout = 300) {
    need_testdata();
    tally t = {0};
    int n = each_model(roundtrip_one, &t);
    cr_log_info("round trip: %d models, %d equal, %d differ", n, t.ok, t.bad);
    cr_assert_gt(n, 1000, "expected the whole test data, found %d models", n);
    cr_assert_eq(t.bad, 0, "%d models changed in the round trip; first: %s", t.bad, t.first);
}

/* ---- inferred shapes against evaluated shapes ------------------------------ */

typedef struct shape_check {
    tally *t;
    const kf_model *m;
    const char *dir;
    int mismatches;
} shape_check;

static void on_node(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs) {
    shape_check *sc = user;
    const kf_node *n = &g->nodes[node];
    for (int j = 0; j < n->nout; j++) {
        if (!n->out[j]) continue;
        const kf_type *ty = &sc->m->graph->values[n->out[j]].type;
        const kf_tensor *t = &outs[j];
        bool ok = !ty->dtype || ty->dtype == t->dtype;
        if (ok && ty->rank >= 0) {
            ok = ty->rank == t->rank;
            for (int d = 0; ok && d < t->rank; d++) ok = ty->dims[d] < 0 || ty->dims[d] == t->dims[d];
        }
        if (!ok && !sc->mismatches++ && !sc->t->bad)
            snprintf(sc->t->first, sizeof sc->t->first, "%s: node '%s' (%s) output %d: inferred %s rank %d, got %s rank %d",
                     sc->dir, kf_node_label(n), n->op_type, j, kf_dtype_name(ty->dtype), ty->rank,
                     kf_dtype_name(t->dtype), t->rank);
    }
}

static void shapes_one(const char *dir, void *user) {
    tally *t = user;
    char path[1200];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    kf_model *m;
    if (kf_model_load(path, &m) != KF_OK) return;
    if (kf_eval_unsupported_reason(m)) {
        kf_model_free(m);
        return;
    }
    if (kf_infer_shapes(m) != KF_OK) {
        if (!t->bad++) snprintf(t->first, sizeof t->first, "%s: inference: %s", dir, kf_last_error());
        kf_model_free(m);
        return;
    }
    kf_id *real;
    uint32_t nreal;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &nreal), KF_OK);
    kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
    kf_tensor *outs = calloc(m->graph->noutputs + 1, sizeof(kf_tensor));
    bool have = true;
    for (uint32_t i = 0; i < nreal && have; i++) {
        char p[1300];
        snprintf(p, sizeof p, "%s/test_data_set_0/input_%u.pb", dir, i);
        have = kf_onnx_read_tensor_file(p, &ins[i], NULL) == KF_OK;
    }
    shape_check sc = {t, m, dir, 0};
    kf_eval_opts opts = {on_node, &sc};
    if (have && kf_eval_model(m, ins, (int)nreal, outs, &opts) == KF_OK) {
        if (sc.mismatches) t->bad++;
        else t->ok++;
    }
    for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
    for (uint32_t o = 0; o < m->graph->noutputs; o++) kf_tensor_release(&outs[o]);
    free(ins);
    free(outs);
    free(real);
    kf_model_free(m);
}

Test(models, inferred_shapes_match_evaluated_shapes, .timeout = 600) {
    need_testdata();
    tally t = {0};
    each_model(shapes_one, &t);
    cr_log_info("shape inference vs evaluation: %d models agree, %d disagree", t.ok, t.bad);
    cr_assert_eq(t.bad, 0, "%d models where inference disagrees with evaluation; first: %s", t.bad, t.first);
}
