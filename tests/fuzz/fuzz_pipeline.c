/*
 * fuzz_pipeline.c: libFuzzer target for everything after the loader: a
 * model that loads goes through load -> bind symbolic dims -> kf_optimize
 * (its weight merges deferred, then assembled, when the last byte has bit
 * 16) -> the precision passes (fp32, int8 with its quantised weights kept,
 * fp16, int8-fp16 or fp8 with its float8 weights kept)
 * -> kf_plan_build (with the cost model on half the inputs) -> kernel text for every group codegen supports (both
 * targets) and the library-anchor mapping of every anchor group -> fuse export -> save -> load again. Every stage must succeed
 * or return a typed error with a message; the exported model must load.
 * Crashes, sanitizer reports, leaks and the aborts below are findings.
 * NVRTC compiles each CUDA kernel only when KF_FUZZ_NVRTC=1 (tens of ms
 * each, too slow for every input; for a long run on a CUDA machine). Run
 * through tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_codegen.h"
#include "kf_fuse.h"
#include "kf_kernels.h"
#include "kf_libanchor.h"
#include "kf_onnx.h"
#include "kf_precision.h"
#include "kf_opt.h"

/* Symbolic dims become this, so codegen sees static shapes: small, so a
 * fuzzed graph cannot turn a symbol into a large allocation, and not 1, so
 * broadcasting stays visible. */
#define FUZZ_SYM_VALUE 2

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_pipeline: %s: %s\n", what, detail);
    abort();
}

/* A failed stage must say why. */
static kf_status checked(kf_status st, const char *stage) {
    if (st && !kf_last_error()[0]) finding(stage, "failed without a message");
    return st;
}

/* The library-anchor mapping of anchor group gi (kf_libanchor.h): a
 * descriptor and its epilogue kernel's text, or a decline with a reason. */
static kf_status lib_anchor(const kf_model *m, const kf_plan *p, uint32_t gi) {
    kf_la_anchor la;
    char why[256] = "";
    kf_status st = kf_la_plan_group(m, p, gi, &la, why, sizeof why);
    if (st == KF_ERR_UNSUPPORTED) {
        if (!why[0]) finding("a library anchor declined without a reason", "");
        return KF_OK;
    }
    if (st) return checked(st, "library anchor");
    char *src = NULL;
    if (la.has_epilogue) st = kf_cg_source(&la.epilogue, KF_CG_CUDA, &src);
    kf_free(src);
    kf_la_anchor_release(&la);
    return st;
}

static kf_status kernels(const kf_model *m, const kf_plan *p, bool nvrtc) {
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        char why[256];
        if (p->groups[gi].kind == KF_GROUP_ANCHOR) KF_TRY(lib_anchor(m, p, gi));
        if (kf_cg_unsupported(m, p, gi, why, sizeof why)) {
            if (!why[0]) finding("a declined group without a reason", "");
            continue;
        }
        kf_cg_kernel k;
        kf_status st = kf_cg_group(m, p, gi, &k);
        if (st == KF_ERR_UNSUPPORTED) finding("kf_cg_unsupported said yes, kf_cg_group declined", kf_last_error());
        if (st) return st;
        for (int t = 0; !st && t < 2; t++) {
            char *src = NULL;
            st = kf_cg_source(&k, t ? KF_CG_CUDA : KF_CG_OPENCL, &src);
            if (!st && t && nvrtc && !kf_nvrtc_unavailable()) {
                kf_nvrtc_report r;
                st = kf_nvrtc_compile(src, "sm_80", &r);
                /* generated text that does not compile is a codegen bug */
                if (st == KF_ERR_COMPILE) finding("generated CUDA does not compile", kf_last_error());
            }
            kf_free(src);
        }
        kf_cg_kernel_release(&k);
        if (st) return st;
    }
    return KF_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int nvrtc = -1;
    if (nvrtc < 0) nvrtc = getenv("KF_FUZZ_NVRTC") && !strcmp(getenv("KF_FUZZ_NVRTC"), "1");
    kf_model *m = NULL, *back = NULL;
    kf_plan *built = NULL, *p = NULL;
    void *bytes = NULL;
    size_t len = 0;
    if (kf_model_load_memory(data, size, NULL, &m)) return 0; /* the loader's own target covers this */
    kf_status st = KF_OK;
    for (uint32_t i = 1; !st && i < m->graph->nsyms; i++)
        st = checked(kf_graph_bind_sym(m->graph, m->graph->syms[i], FUZZ_SYM_VALUE), "bind");
    /* the precision passes as kernels/exec.c runs them (kf_precision_passes),
     * by the input's last byte: FP32, INT8, FP16, INT8_FP16 or FP8 */
    uint8_t last = data[size - 1];
    kf_precision prec = last & 8   ? KF_PRECISION_FP8
                        : last & 2 ? (last & 4 ? KF_PRECISION_INT8_FP16 : KF_PRECISION_INT8)
                        : last & 4 ? KF_PRECISION_FP16
                                   : KF_PRECISION_FP32;
    if (!st) {
        kf_opt_options o;
        kf_opt_options_default(&o);
        o.keep_quantized = kf_precision_keeps_quantized(prec);
        o.defer_concat_bytes = last & 16 ? 1 : 0; /* merges deferred as kfuse opt does, then assembled */
        o.check_inference = true; /* incremental shape inference must end where a whole one does */
        kf_opt_result res;
        st = checked(kf_optimize(m, &o, &res), "optimize");
        if (st == KF_ERR_INTERNAL) finding("optimize: internal error", kf_last_error());
        kf_rules_free(&res.rules);
        if (!st && o.defer_concat_bytes) st = checked(kf_graph_settle(m->graph), "settle");
    }
    if (!st) st = checked(kf_precision_passes(m, prec, 0, NULL), kf_precision_name(prec));
    if (!st) {
        kf_plan_options po;
        kf_plan_options_default(&po);
        /* both planners: the cost model's (what users get) and every legal
         * merge (the most groups of every shape for codegen), by the input's
         * last byte */
        po.target = data[size - 1] & 1 ? "h200" : "none";
        st = checked(kf_plan_build(m, &po, &built), "plan");
    }
    if (!st) st = checked(kernels(m, built, nvrtc == 1), "codegen");
    if (!st) st = checked(kf_fuse_plan_copy(m, built, &p), "plan copy");
    kf_plan_free(built);
    kf_fuse_stats fs;
    if (!st) st = checked(kf_fuse_apply(m, p, &fs), "fuse");
    if (!st) st = checked(kf_model_save_memory(m, &bytes, &len), "save");
    if (!st && kf_model_load_memory(bytes, len, NULL, &back) && kf_last_error()[0] &&
        !strstr(kf_last_error(), "out of memory"))
        finding("the fused model does not load", kf_last_error());
    kf_model_free(back);
    free(bytes);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    return 0;
}
