/*
 * cg_util.c: helpers the codegen tests share (see cg_util.h).
 */
#include "cg_util.h"

#include "kf_run.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

kf_plan *cgu_plan(kf_model *m) {
    kf_plan_options o = {.fuel = -1};
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
    return p;
}

static void keep(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs) {
    cgu_refvals *r = user;
    const kf_node *n = &g->nodes[node];
    for (int j = 0; j < n->nout; j++)
        if (n->out[j]) cr_assert_eq(kf_tensor_copy(&r->t[n->out[j]], &outs[j]), KF_OK);
}

uint32_t cgu_group_of(const kf_model *m, const kf_plan *p, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].producer, "no produced value '%s'", name);
    return p->group_of[m->graph->values[v].producer];
}

cgu_refvals cgu_reference(const kf_model *m) {
    const kf_graph *g = m->graph;
    cgu_refvals r = {calloc(g->nvalues + 1, sizeof(kf_tensor)), g->nvalues};
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_id *real;
    uint32_t nreal;
    cr_assert_eq(kf_graph_real_inputs(g, &real, &nreal), KF_OK);
    for (uint32_t i = 0; i < nreal; i++) cr_assert_eq(kf_tensor_copy(&r.t[real[i]], &ins[i]), KF_OK);
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].init && !r.t[v].data) cr_assert_eq(kf_tensor_copy(&r.t[v], g->values[v].init), KF_OK);
    kf_tensor *outs = calloc(g->noutputs + 1, sizeof(kf_tensor));
    kf_eval_opts o = {keep, &r};
    cr_assert_eq(kf_eval_model(m, ins, (int)nins, outs, &o), KF_OK, "%s", kf_last_error());
    for (uint32_t i = 0; i < g->noutputs; i++) kf_tensor_release(&outs[i]);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(outs);
    free(ins);
    free(real);
    return r;
}

void cgu_refvals_free(cgu_refvals *r) {
    for (uint32_t v = 0; v <= r->n; v++) kf_tensor_release(&r->t[v]);
    free(r->t);
}

void cgu_need_opencl(void) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
}

void cgu_nvrtc_check(const kf_cg_kernel *k, const char *arch) {
    char *src;
    cr_assert_eq(kf_cg_source(k, KF_CG_CUDA, &src), KF_OK);
    kf_nvrtc_report r;
    cr_assert_eq(kf_nvrtc_compile(src, arch, &r), KF_OK, "%s\n%s", kf_last_error(), src);
    cr_assert_gt(r.binary_bytes, 0);
    cr_assert_geq(r.registers, 0, "ptxas printed no register figure; log:\n%s", r.log);
    cr_assert_eq(r.spill_stores, 0, "%s: spill stores; log:\n%s", arch, r.log);
    cr_assert_eq(r.spill_loads, 0, "%s: spill loads; log:\n%s", arch, r.log);
    kf_free(src);
}

void cgu_assert_one_group(const char *text, kf_group_kind kind) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->ngroups, 1, "%u groups", p->ngroups);
    cr_assert_eq(p->groups[0].kind, kind);
    kf_plan_free(p);
    kf_model_free(m);
}

char *cgu_exec_host_lib_trace(const kf_model *m, const kf_model *want, kf_exec_backend b, kf_precision p) {
    setenv("KFUSE_LIBANCHOR_HOST", "1", 1);
    char *trace = NULL;
    size_t tlen = 0;
    FILE *tf = open_memstream(&trace, &tlen);
    cr_assert_not_null(tf);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = b;
    o.precision = p;
    o.trace = tf;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref_model(x, want, 2, (int)p);
    kf_exec_free(x);
    fclose(tf);
    return trace;
}

void cgu_exec_matches_ref(kf_exec *x, const kf_model *m, int runs) { cgu_exec_matches_ref_model(x, m, runs, -1); }

/* cgu_exec_matches_ref_model's loop; with requant, an output after a
 * requantization may pass on its SQNR as `run --check` allows
 * (kf_run_close_requant). */
static void exec_matches(kf_exec *x, const kf_model *m, int runs, int prec, bool requant) {
    uint32_t nout = m->graph->noutputs;
    uint32_t *depth = calloc(nout + 1, sizeof *depth), *rq = calloc(nout + 1, sizeof *rq);
    cr_assert(depth && rq);
    if (prec >= 0) cr_assert_eq(kf_run_output_depths(m, depth), KF_OK, "%s", kf_last_error());
    if (requant) cr_assert_eq(kf_run_output_requants(m, rq), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_exec_num_outputs(x), nout);
    for (int r = 0; r < runs; r++) {
        kf_tensor *ins;
        uint32_t nins;
        gt_random_inputs(m, &ins, &nins);
        kf_tensor *want = calloc(nout + 1, sizeof(kf_tensor)), *got = calloc(nout + 1, sizeof(kf_tensor));
        cr_assert_eq(kf_eval_model(m, ins, (int)nins, want, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_exec_run(x, ins, nins, got), KF_OK, "run %d: %s", r, kf_last_error());
        for (uint32_t o = 0; o < nout; o++) {
            char why[640];
            double db;
            bool close = prec < 0  ? kf_run_close(&got[o], &want[o], why, sizeof why)
                         : requant ? kf_run_close_requant(&got[o], &want[o], (kf_precision)prec, depth[o], rq[o], &db,
                                                          why, sizeof why)
                                   : kf_run_close_model(&got[o], &want[o], (kf_precision)prec, depth[o], why, sizeof why);
            cr_assert(close, "run %d output %u: %s", r, o, why);
            kf_tensor_release(&got[o]);
            kf_tensor_release(&want[o]);
        }
        for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
        free(ins);
        free(got);
        free(want);
    }
    free(depth);
    free(rq);
}

void cgu_exec_matches_ref_model(kf_exec *x, const kf_model *m, int runs, int prec) {
    exec_matches(x, m, runs, prec, false);
}

void cgu_exec_matches_ref_requant(kf_exec *x, const kf_model *m, int runs, kf_precision prec) {
    exec_matches(x, m, runs, (int)prec, true);
}

double cgu_dot_atol(int64_t K) {
    double t = (double)K * sqrt((double)K) / 16777216.0;
    return t > 1e-5 ? t : 1e-5;
}

uint32_t cgu_nvrtc_check_text(const char *text, unsigned kinds) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    uint32_t n = 0;
    for (uint32_t g = 0; g < p->ngroups; g++) {
        if (!(kinds & (1u << p->groups[g].kind))) continue;
        kf_cg_kernel k;
        cr_assert_eq(kf_cg_group(m, p, g, &k), KF_OK, "%s", kf_last_error());
        cgu_nvrtc_check(&k, "sm_80");
        cgu_nvrtc_check(&k, "sm_90");
        kf_cg_kernel_release(&k);
        n++;
    }
    kf_plan_free(p);
    kf_model_free(m);
    return n;
}

kf_exec_stats cgu_opencl_matches_ref(const kf_model *m, int runs) {
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_OPENCL;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    cgu_exec_matches_ref(x, m, runs);
    kf_exec_stats s;
    kf_exec_get_stats(x, &s);
    kf_exec_free(x);
    return s;
}

uint32_t cgu_run_groups(const char *text, const cgu_run_opts *o) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cgu_refvals r = cgu_reference(m);
    uint32_t count = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        if (!(o->kinds & (1u << p->groups[gi].kind))) continue;
        char why[512];
        cr_assert_null(kf_cg_unsupported(m, p, gi, why, sizeof why), "group %u declined: %s", gi, why);
        kf_cg_kernel k, k2;
        cr_assert_eq(kf_cg_group(m, p, gi, &k), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_cg_group(m, p, gi, &k2), KF_OK, "%s", kf_last_error());
        cr_assert_str_eq(k.body, k2.body, "generation is not deterministic");
        if (o->name) cr_assert_str_eq(k.name, o->name);
        kf_cg_kernel_release(&k2);
        const kf_tensor *in[KF_CG_MAX_PARAMS];
        for (uint32_t i = 0; i < k.nins; i++) in[i] = &r.t[k.ins[i].value];
        kf_tensor out[KF_PLAN_MAX_OUTPUTS] = {0};
        cr_assert_eq(kf_cl_run_kernel(&k, in, out), KF_OK, "group %u: %s\n%s", gi, kf_last_error(), k.body);
        for (uint32_t q = 0; q < k.nouts; q++) {
            char w[256];
            const kf_tensor *want = &r.t[k.outs[q].value];
            bool half = want->dtype == KF_DT_FLOAT16 || want->dtype == KF_DT_BFLOAT16; /* 16-bit: the *16 tolerances */
            cr_assert(tu_close(&out[q], want, half ? o->atol16 : o->atol, half ? o->rtol16 : o->rtol, w, sizeof w),
                      "group %u output %u: %s\n%s", gi, q, w, k.body);
            kf_tensor_release(&out[q]);
        }
        if (o->visit) o->visit(p, gi, &k, o->ctx);
        count++;
        kf_cg_kernel_release(&k);
    }
    cgu_refvals_free(&r);
    kf_plan_free(p);
    kf_model_free(m);
    return count;
}
