/*
 * run.c: `kfuse run --backend opencl`: optimize, plan, then execute the plan
 * group by group in the planner's topological order. A group codegen/
 * supports runs as its generated OpenCL kernel; every other group runs node
 * by node on the reference evaluator, with the reason traced. Tensors live
 * in one slot per value id for the whole run (no early release: this slice
 * targets correctness checks, not memory footprint).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kf_opt.h"
#include "kf_run.h"

/* The tensor holding value v: computed or bound in vals, else its
 * initializer; NULL when neither exists. */
static const kf_tensor *value_of(const kf_graph *g, const kf_tensor *vals, kf_id v) {
    if (vals[v].data || vals[v].dtype) return &vals[v];
    return g->values[v].init;
}

static kf_status missing(const kf_graph *g, kf_id v, const char *who) {
    return kf_fail(KF_ERR_BAD_MODEL, "%s: input '%s' has no value", who, g->values[v].name);
}

/* Runs the nodes of group gr one by one on the reference evaluator. */
static kf_status run_ref_group(const kf_model *m, const kf_group *gr, kf_tensor *vals) {
    const kf_graph *g = m->graph;
    kf_status st = KF_OK;
    for (uint32_t k = 0; k < gr->nnodes && !st; k++) {
        const kf_node *n = &g->nodes[gr->nodes[k]];
        if (kf_model_function(m, n->domain, n->op_type))
            return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' calls model-local function %s::%s, which only --backend ref runs",
                           kf_node_label(n), n->domain, n->op_type);
        const kf_tensor **in = kf_calloc((size_t)n->nin + 1, sizeof(kf_tensor *));
        kf_tensor *out = kf_calloc((size_t)n->nout + 1, sizeof(kf_tensor));
        if (!in || !out) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        for (int i = 0; !st && i < n->nin; i++) {
            if (!n->in[i]) continue;
            if (!(in[i] = value_of(g, vals, n->in[i]))) st = missing(g, n->in[i], kf_node_label(n));
        }
        if (!st) st = kf_eval_node(n, n->nin, in, out);
        for (int j = 0; out && j < n->nout; j++) {
            if (!st && n->out[j]) kf_tensor_move(&vals[n->out[j]], &out[j]);
            kf_tensor_release(&out[j]);
        }
        kf_free(in);
        kf_free(out);
    }
    return st;
}

/* Runs the generated kernel k on OpenCL; its outputs go to vals. */
static kf_status run_cl_group(const kf_graph *g, const kf_cg_kernel *k, kf_tensor *vals) {
    kf_status st = KF_OK;
    const kf_tensor **in = kf_calloc((size_t)k->nins + 1, sizeof(kf_tensor *));
    kf_tensor *out = kf_calloc((size_t)k->nouts + 1, sizeof(kf_tensor));
    if (!in || !out) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; !st && i < k->nins; i++)
        if (!(in[i] = value_of(g, vals, k->ins[i].value))) st = missing(g, k->ins[i].value, k->name);
    if (!st) st = kf_cl_run_kernel(k, in, out);
    for (uint32_t j = 0; out && j < k->nouts; j++) {
        if (!st) kf_tensor_move(&vals[k->outs[j].value], &out[j]);
        kf_tensor_release(&out[j]);
    }
    kf_free(in);
    kf_free(out);
    return st;
}

static const char *kind_name(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE: return "elementwise";
    case KF_GROUP_REDUCTION: return "reduction";
    case KF_GROUP_ANCHOR: return "anchor";
    case KF_GROUP_OPAQUE: return "opaque";
    case KF_GROUP_CONST: return "const";
    }
    return "?";
}

/* Copies the caller's inputs (real inputs of the model as loaded, named
 * in names[]) into vals of the optimized graph, by name. */
static kf_status bind_inputs(const kf_graph *g, char **names, uint32_t nnames, const kf_tensor *inputs,
                             kf_tensor *vals) {
    for (uint32_t i = 0; i < nnames; i++) {
        kf_id v = kf_graph_find(g, names[i]);
        if (!v || g->values[v].init) continue; /* the optimizer dropped an unused input */
        KF_TRY(kf_tensor_copy(&vals[v], &inputs[i]));
    }
    return KF_OK;
}

kf_status kf_run_opencl(kf_model *m, const kf_tensor *inputs, int ninputs, kf_tensor *outputs,
                        FILE *trace, kf_run_summary *sum) {
    if (sum) memset(sum, 0, sizeof *sum);
    const char *nodev = kf_cl_unavailable();
    if (nodev) return kf_fail(KF_ERR_NO_DEVICE, "no OpenCL device: %s", nodev);
    kf_status st = KF_OK;
    kf_id *real = NULL;
    uint32_t nreal = 0;
    char **names = NULL;
    kf_plan *p = NULL;
    kf_tensor *vals = NULL;
    kf_run_summary s = {0, 0};
    KF_TRY(kf_graph_real_inputs(m->graph, &real, &nreal));
    if ((uint32_t)ninputs != nreal) {
        st = kf_fail(KF_ERR_INVALID_ARG, "model has %u inputs, %d were given", nreal, ninputs);
        goto done;
    }
    uint32_t nout_before = m->graph->noutputs;
    if (!(names = kf_calloc(nreal + 1, sizeof(char *)))) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < nreal; i++) {
        const char *nm = m->graph->values[real[i]].name;
        if (!(names[i] = kf_malloc(strlen(nm) + 1))) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto done;
        }
        strcpy(names[i], nm);
    }
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    kf_opt_result res;
    memset(&res, 0, sizeof res);
    st = kf_optimize(m, &oo, &res);
    kf_rules_free(&res.rules);
    if (st) goto done;
    /* specialize: the inputs' concrete shapes replace symbolic dims, so
     * inference makes every shape static and codegen can take the groups */
    for (uint32_t i = 0; i < nreal; i++) {
        kf_id v = kf_graph_find(m->graph, names[i]);
        if (v && !m->graph->values[v].init) kf_type_of_tensor(&m->graph->values[v].type, &inputs[i]);
    }
    kf_plan_options po;
    kf_plan_options_default(&po);
    if ((st = kf_plan_build(m, &po, &p))) goto done;
    const kf_graph *g = m->graph;
    if (g->noutputs != nout_before) {
        st = kf_fail(KF_ERR_INTERNAL, "the optimizer changed the graph outputs (%u -> %u)", nout_before, g->noutputs);
        goto done;
    }
    if (!(vals = kf_calloc(g->nvalues + 1, sizeof(kf_tensor)))) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = bind_inputs(g, names, nreal, inputs, vals))) goto done;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *gr = &p->groups[gi];
        /* 256 bytes hold codegen's reasons, which name one node or value */
        char why[256];
        const char *reason = gr->kind == KF_GROUP_CONST ? "plan-time constant"
                                                        : kf_cg_unsupported(m, p, gi, why, sizeof why);
        if (!reason) {
            kf_cg_kernel k;
            memset(&k, 0, sizeof k);
            if ((st = kf_cg_group(m, p, gi, &k))) goto done;
            st = run_cl_group(g, &k, vals);
            if (trace)
                fprintf(trace, "kfuse: backend: group %u (%s, %u nodes, first '%s'): opencl (generated)\n", gi,
                        kind_name(gr->kind), gr->nnodes, kf_node_label(&g->nodes[gr->nodes[0]]));
            kf_cg_kernel_release(&k);
            if (st) goto done;
            s.groups_cl++;
        } else {
            if (trace)
                fprintf(trace, "kfuse: backend: group %u (%s, %u nodes, first '%s'): ref: %s\n", gi,
                        kind_name(gr->kind), gr->nnodes,
                        gr->nnodes ? kf_node_label(&g->nodes[gr->nodes[0]]) : "-", reason);
            if ((st = run_ref_group(m, gr, vals))) goto done;
            s.groups_ref++;
        }
    }
    for (uint32_t o = 0; o < g->noutputs; o++) {
        const kf_tensor *t = value_of(g, vals, g->outputs[o]);
        if (!t) {
            st = kf_fail(KF_ERR_BAD_MODEL, "graph output '%s' has no value", g->values[g->outputs[o]].name);
            goto done;
        }
        if ((st = kf_tensor_copy(&outputs[o], t))) goto done;
    }
done:
    if (st && outputs)
        for (uint32_t o = 0; o < m->graph->noutputs; o++) kf_tensor_release(&outputs[o]);
    if (sum) *sum = s;
    for (uint32_t v = 0; vals && v <= m->graph->nvalues; v++) kf_tensor_release(&vals[v]);
    kf_free(vals);
    kf_plan_free(p);
    for (uint32_t i = 0; names && i < nreal; i++) kf_free(names[i]);
    kf_free(names);
    kf_free(real);
    return st;
}

/* ---- --check comparison ------------------------------------------------- */

/* DESIGN.md numerics: fused vs unfused tolerances per dtype */
#define RUN_F32_ATOL 1e-5
#define RUN_F32_RTOL 1e-4
#define RUN_F16_ATOL 2.5e-3
#define RUN_F16_RTOL 1e-3

bool kf_run_close(const kf_tensor *got, const kf_tensor *want, char *why, size_t whylen) {
    if (got->dtype != want->dtype || got->rank != want->rank || got->numel != want->numel) {
        snprintf(why, whylen, "dtype/shape differ: got dtype %d rank %d numel %lld, want dtype %d rank %d numel %lld",
                 (int)got->dtype, got->rank, (long long)got->numel, (int)want->dtype, want->rank,
                 (long long)want->numel);
        return false;
    }
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) {
            snprintf(why, whylen, "dim %d differs: got %lld, want %lld", d, (long long)got->dims[d],
                     (long long)want->dims[d]);
            return false;
        }
    kf_dtype dt = got->dtype;
    if (dt == KF_DT_STRING || dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) {
        if (kf_tensor_equal(got, want)) return true;
        snprintf(why, whylen, "%s tensors differ", dt == KF_DT_STRING ? "string" : "complex");
        return false;
    }
    bool half = dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16;
    double atol = half ? RUN_F16_ATOL : RUN_F32_ATOL, rtol = half ? RUN_F16_RTOL : RUN_F32_RTOL;
    for (int64_t i = 0; i < got->numel; i++) {
        if (kf_dtype_is_float(dt)) {
            double a = kf_get_f64(got, i), b = kf_get_f64(want, i);
            bool ok = (isnan(a) && isnan(b)) || (isinf(b) && a == b) ||
                      (isfinite(a) && isfinite(b) && fabs(a - b) <= atol + rtol * fabs(b));
            if (!ok) {
                snprintf(why, whylen, "element %lld: got %.9g, want %.9g (atol %g rtol %g)", (long long)i, a, b,
                         atol, rtol);
                return false;
            }
        } else if (dt == KF_DT_UINT64) {
            if (kf_get_u64(got, i) != kf_get_u64(want, i)) {
                snprintf(why, whylen, "element %lld: got %llu, want %llu", (long long)i,
                         (unsigned long long)kf_get_u64(got, i), (unsigned long long)kf_get_u64(want, i));
                return false;
            }
        } else if (kf_get_i64(got, i) != kf_get_i64(want, i)) {
            snprintf(why, whylen, "element %lld: got %lld, want %lld", (long long)i, (long long)kf_get_i64(got, i),
                     (long long)kf_get_i64(want, i));
            return false;
        }
    }
    return true;
}
