/*
 * test_nvrtc_all.c: every distinct CUDA kernel kfuse generates for the ONNX
 * conformance models (Debian's libonnx-testdata, shapes from each folder's
 * test_data_set_0 inputs) and for the bundled real models compiles with
 * NVRTC for sm_80 and sm_90 with 0 spill bytes, read from ptxas' verbose
 * output. Needs NVRTC only (no GPU); skips with the reason otherwise.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "kf_kernels.h"
#include "kf_onnx.h"
#include "kf_opt.h"

#define TESTDATA "/usr/share/libonnx-testdata/data"

typedef struct kernels {
    char **body; /* distinct kernel sources (CUDA prelude + body) */
    uint32_t n, cap;
    int models, models_with_kernels;
} kernels;

static void add_source(kernels *ks, char *src) {
    for (uint32_t i = 0; i < ks->n; i++)
        if (!strcmp(ks->body[i], src)) {
            kf_free(src);
            return;
        }
    if (ks->n == ks->cap) {
        ks->cap = ks->cap ? 2 * ks->cap : 256;
        ks->body = realloc(ks->body, ks->cap * sizeof *ks->body);
        cr_assert_not_null(ks->body);
    }
    ks->body[ks->n++] = src;
}

/* Loads model, fixes its real inputs' shapes from data_dir's input_N.pb
 * (when given), optimizes and plans as the runtime does, and collects the
 * CUDA source of every group codegen generates. Models the pipeline cannot
 * take (unsupported ops, symbolic shapes left) add nothing. */
static void collect(const char *model, const char *data_dir, void *user) {
    kernels *ks = user;
    kf_model *m = NULL;
    if (kf_model_load(model, &m)) return;
    kf_id *real = NULL;
    uint32_t nreal = 0;
    bool ok = kf_graph_real_inputs(m->graph, &real, &nreal) == KF_OK;
    for (uint32_t i = 0; ok && data_dir && i < nreal; i++) {
        char path[1300];
        snprintf(path, sizeof path, "%s/input_%u.pb", data_dir, i);
        kf_tensor t = {0};
        if (kf_onnx_read_tensor_file(path, &t, NULL)) {
            ok = false;
            break;
        }
        kf_type_of_tensor(&m->graph->values[real[i]].type, &t);
        kf_tensor_release(&t);
    }
    kf_free(real);
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    kf_opt_result res;
    memset(&res, 0, sizeof res);
    kf_plan *p = NULL;
    kf_plan_options po;
    kf_plan_options_default(&po);
    if (ok) ok = kf_optimize(m, &oo, &res) == KF_OK;
    kf_rules_free(&res.rules);
    if (ok) ok = kf_plan_build(m, &po, &p) == KF_OK;
    uint32_t got = 0;
    for (uint32_t gi = 0; ok && gi < p->ngroups; gi++) {
        char why[256];
        if (p->groups[gi].kind == KF_GROUP_CONST || kf_cg_unsupported(m, p, gi, why, sizeof why)) continue;
        kf_cg_kernel k;
        memset(&k, 0, sizeof k);
        cr_assert_eq(kf_cg_group(m, p, gi, &k), KF_OK, "%s: %s", model, kf_last_error());
        char *src = NULL;
        cr_assert_eq(kf_cg_source(&k, KF_CG_CUDA, &src), KF_OK);
        add_source(ks, src);
        kf_cg_kernel_release(&k);
        got++;
    }
    kf_clear_error();
    ks->models++;
    if (got) ks->models_with_kernels++;
    kf_plan_free(p);
    kf_model_free(m);
}

Test(nvrtc_all, every_generated_kernel_compiles_for_sm80_and_sm90_without_spills, .timeout = 1200) {
#if defined(__SANITIZE_ADDRESS__)
    /* a minute of NVRTC time, and NVRTC is not instrumented: the plain
     * build's run of this test makes the same compiles */
    cr_skip_test("skipped in the sanitizer build: the plain build compiles the same kernels");
#endif
    const char *why = kf_nvrtc_unavailable();
    if (why) cr_skip_test("NVRTC: %s", why);
    kernels ks = {0};
    static const char *const suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
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
            collect(model, data, &ks);
        }
        closedir(d);
    }
    int conform_kernels = (int)ks.n;
    int bundled = gt_walk_models(KF_SOURCE_DIR "/bench/models", collect, &ks);
    cr_assert_gt(bundled, 5, "the bundled models are missing (%d found)", bundled);
    cr_assert_gt(conform_kernels, 300, "too few kernels generated from the conformance set (%d)", conform_kernels);
    int failures = 0;
    int max_regs = 0;
    char first[4096] = "";
    static const char *const archs[] = {"sm_80", "sm_90"};
    for (uint32_t i = 0; i < ks.n; i++)
        for (int a = 0; a < 2; a++) {
            kf_nvrtc_report r;
            kf_status st = kf_nvrtc_compile(ks.body[i], archs[a], &r);
            bool bad = st || r.registers < 0 || r.spill_stores != 0 || r.spill_loads != 0;
            if (r.registers > max_regs) max_regs = r.registers;
            if (bad && !failures++)
                snprintf(first, sizeof first, "%s: status %d, registers %d, spill stores %lld, loads %lld: %s\n%.2000s",
                         archs[a], (int)st, r.registers, (long long)r.spill_stores, (long long)r.spill_loads,
                         st ? kf_last_error() : r.log, ks.body[i]);
        }
    cr_log_info("nvrtc: %u distinct kernels (%d from the conformance set, %d models with kernels of %d read), "
                "sm_80 + sm_90, at most %d registers, %d failures",
                ks.n, conform_kernels, ks.models_with_kernels, ks.models, max_regs, failures);
    for (uint32_t i = 0; i < ks.n; i++) kf_free(ks.body[i]);
    free(ks.body);
    cr_assert_eq(failures, 0, "%d compiles failed or spilled; first: %s", failures, first);
}
