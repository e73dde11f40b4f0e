/*
 * api.c: the public compile/run API of include/kfuse/kfuse.h over kf_exec
 * (exec.c): backend choice, host tensor views in, caller-owned outputs
 * out. Everything here is argument checking and conversion; the work and
 * the thread-safety are kf_exec's.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_cost.h"
#include "kf_exec.h"
#include "kf_fuse.h"
#include "kf_memplan.h"
#include "kf_opt.h"
#include "kf_precision.h"

struct kf_compiled {
    kf_exec *x;
    kf_backend backend;
    /* kf_compiled_output_info's last answer: a caller asks once per output */
    pthread_mutex_t mu;
    kf_type *info_in, *info_out; /* nin and nout types; NULL until the first */
};

const char *kf_backend_name(kf_backend b) {
    switch (b) {
    case KF_BACKEND_BEST: return "best";
    case KF_BACKEND_REF: return "ref";
    case KF_BACKEND_OPENCL: return "opencl";
    case KF_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

kf_status kf_model_optimize(kf_model *m) {
    if (!m) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_optimize: NULL model");
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    kf_opt_result res;
    memset(&res, 0, sizeof res);
    kf_status st = kf_optimize(m, &oo, &res);
    kf_rules_free(&res.rules);
    return st;
}

/* The fused file and its JSON report, as `kfuse fuse` makes them
 * (tools/cmd_fuse.c): fixed dims bound, optimized with the extra rules,
 * converted at fp16/bf16, planned for the target, groups applied as
 * ai.kfuse functions. */
static kf_status fuse(kf_model *m, const kf_exec_options *o, char **report) {
    kf_fuse_summary sum = {0};
    for (int i = 0; i < o->ndims; i++) {
        bool known = false;
        for (uint32_t y = 1; y < m->graph->nsyms && !known; y++) known = !strcmp(m->graph->syms[y], o->dims[i].name);
        if (known) KF_TRY(kf_graph_bind_sym(m->graph, o->dims[i].name, o->dims[i].value));
    }
    sum.nodes_before = kf_graph_live_nodes(m->graph);
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    oo.keep_quantized = kf_precision_keeps_quantized(o->precision);
    oo.pattern_files = o->pattern_files;
    oo.npattern_files = o->npattern_files;
    kf_opt_result res;
    memset(&res, 0, sizeof res);
    kf_status st = kf_optimize(m, &oo, &res);
    kf_rules_free(&res.rules);
    KF_TRY(st);
    KF_TRY(kf_precision_passes(m, o->precision, 0, NULL));
    sum.nodes_after = kf_graph_live_nodes(m->graph);
    kf_plan_options po;
    kf_plan_options_default(&po);
    if (o->target) po.target = o->target;
    else if (!po.target) po.target = KF_PLAN_DEFAULT_TARGET;
    if (o->fusion != KF_SWITCH_DEFAULT) po.disable = o->fusion == KF_SWITCH_OFF;
    po.math = o->precision == KF_PRECISION_TF32 ? KF_MATH_TF32 : KF_MATH_FP32;
    kf_plan *built = NULL, *p = NULL;
    KF_TRY(kf_plan_build(m, &po, &built));
    st = kf_fuse_plan_copy(m, built, &p);
    kf_plan_free(built);
    KF_TRY(st);
    kf_memplan mp;
    sum.arena_bytes = sum.arena_lower_bound = -1;
    if (kf_memplan_build(m, p, KF_MEMPLAN_ALIGN, &mp) == KF_OK) {
        sum.arena_bytes = mp.arena_bytes;
        sum.arena_lower_bound = mp.live_lower_bound;
        kf_memplan_release(&mp);
    } else
        kf_clear_error(); /* sizes unknown while dims are symbolic */
    kf_fuse_stats fs = {0};
    st = kf_fuse_apply(m, p, &fs);
    sum.functions = fs.functions;
    if (!st && report) {
        size_t len = 0;
        FILE *f = open_memstream(report, &len);
        if (!f) st = kf_fail(KF_ERR_NOMEM, "out of memory for the fusion report");
        else {
            kf_fuse_write_json(f, m, p, &sum);
            if (fclose(f) != 0) st = kf_fail(KF_ERR_NOMEM, "out of memory for the fusion report");
        }
    }
    kf_fuse_simple_plan_free(p);
    return st;
}

kf_status kf_model_fuse(kf_model *m, const kf_compile_options *opts, char **report_json) {
    if (report_json) *report_json = NULL;
    if (!m) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_fuse: NULL model");
    kf_exec_options o;
    KF_TRY(kf_exec_options_from_public(opts, &o));
    /* pattern files are read here, before the model changes: a bad one leaves m as it was */
    for (int i = 0; i < o.npattern_files; i++) {
        if (!o.pattern_files[i]) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_fuse: pattern file %d is NULL", i);
        kf_ruleset rs;
        memset(&rs, 0, sizeof rs);
        kf_status st = kf_rules_load_file(&rs, o.pattern_files[i]);
        kf_rules_free(&rs);
        KF_TRY(st);
    }
    for (int i = 0; i < o.ndims; i++)
        if (!o.dims[i].name || o.dims[i].value < 0)
            return kf_fail(KF_ERR_INVALID_ARG, "kf_model_fuse: fixed dim %d: a name and a size >= 0", i);
    kf_status st = fuse(m, &o, report_json);
    if (st && report_json) {
        free(*report_json);
        *report_json = NULL;
    }
    return st;
}

/* The first kf_compile_options: every later one starts with these fields. */
#define OPTS_V1_SIZE (offsetof(kf_compile_options, precision) + sizeof(kf_precision))

static bool switch_valid(kf_switch s) { return s == KF_SWITCH_DEFAULT || s == KF_SWITCH_ON || s == KF_SWITCH_OFF; }

kf_status kf_exec_options_from_public(const kf_compile_options *opts, kf_exec_options *o) {
    kf_compile_options p = KF_COMPILE_OPTIONS_INIT;
    if (opts) {
        if (opts->struct_size > sizeof p)
            return kf_fail(KF_ERR_UNSUPPORTED,
                           "kf_compile_options: struct_size %zu, this kfuse (%s) knows kf_compile_options of %zu bytes",
                           opts->struct_size, kf_version(), sizeof p);
        if (opts->struct_size != OPTS_V1_SIZE && opts->struct_size != sizeof p)
            return kf_fail(KF_ERR_INVALID_ARG,
                           "kf_compile_options: struct_size %zu, neither the first version's (%zu) nor this one's (%zu)",
                           opts->struct_size, (size_t)OPTS_V1_SIZE, sizeof p);
        memcpy(&p, opts, opts->struct_size); /* later fields keep their INIT values */
    }
    if ((unsigned)p.precision >= KF_PRECISION_COUNT)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compile_options: precision %d (fp32, tf32, fp16, bf16, int8, int8-fp16, fp8)", (int)p.precision);
    if (!switch_valid(p.fusion) || !switch_valid(p.batching))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compile_options: fusion %d, batching %d (KF_SWITCH_DEFAULT, _ON, _OFF)",
                       (int)p.fusion, (int)p.batching);
    if (p.npattern_files < 0 || (p.npattern_files && !p.pattern_files) || p.ndims < 0 || (p.ndims && !p.dims))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compile_options: %d pattern files, %d dims (a count needs its array)",
                       p.npattern_files, p.ndims);
    kf_backend b = p.backend;
    if (b == KF_BACKEND_BEST)
        b = !kf_cu_unavailable() && !kf_nvrtc_unavailable() ? KF_BACKEND_CUDA
            : !kf_cl_unavailable()                          ? KF_BACKEND_OPENCL
                                                            : KF_BACKEND_REF;
    kf_exec_options_default(o);
    switch (b) {
    case KF_BACKEND_REF: o->backend = KF_EXEC_REF; break;
    case KF_BACKEND_OPENCL: o->backend = KF_EXEC_OPENCL; break;
    case KF_BACKEND_CUDA: o->backend = KF_EXEC_CUDA; break;
    default: return kf_fail(KF_ERR_INVALID_ARG, "kf_compile_options: unknown backend %d", (int)p.backend);
    }
    o->precision = p.precision;
    o->target = p.target;
    o->device = p.device;
    o->cache_dir = p.cache_dir;
    o->pattern_files = p.pattern_files;
    o->npattern_files = p.npattern_files;
    o->dims = p.dims;
    o->ndims = p.ndims;
    o->lib_workspace = p.workspace_bytes;
    o->fusion = p.fusion;
    o->batching = p.batching;
    return KF_OK;
}

/* env_precision: kf_compile's KFUSE_PRECISION instead of opts' precision */
static kf_status compile(const kf_model *m, const kf_compile_options *opts, bool env_precision, kf_compiled **out) {
    if (!out) return kf_fail(KF_ERR_INVALID_ARG, "kf_compile: out is NULL");
    *out = NULL;
    if (!m) return kf_fail(KF_ERR_INVALID_ARG, "kf_compile: NULL model");
    kf_exec_options o;
    KF_TRY(kf_exec_options_from_public(opts, &o));
    if (env_precision) {
        kf_exec_options def;
        kf_exec_options_default(&def);
        o.precision = def.precision; /* an unknown name: kf_exec_create says why */
    }
    kf_compiled *c = kf_calloc(1, sizeof *c);
    if (!c) return kf_fail(KF_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    c->backend = o.backend == KF_EXEC_CUDA ? KF_BACKEND_CUDA : o.backend == KF_EXEC_OPENCL ? KF_BACKEND_OPENCL : KF_BACKEND_REF;
    kf_status st = kf_exec_create(m, &o, &c->x);
    if (st) {
        kf_compiled_free(c);
        return st;
    }
    *out = c;
    return KF_OK;
}

kf_status kf_compile(const kf_model *m, kf_backend b, kf_compiled **out) {
    kf_compile_options o = KF_COMPILE_OPTIONS_INIT;
    o.backend = b;
    return compile(m, &o, true, out);
}

kf_status kf_compile_ex(const kf_model *m, const kf_compile_options *opts, kf_compiled **out) {
    if (out) *out = NULL;
    return compile(m, opts, false, out);
}

kf_exec *kf_compiled_exec(const kf_compiled *c) { return c ? c->x : NULL; }

kf_backend kf_compiled_backend(const kf_compiled *c) { return c ? c->backend : KF_BACKEND_BEST; }
int kf_compiled_num_inputs(const kf_compiled *c) { return c ? (int)kf_exec_num_inputs(c->x) : 0; }
int kf_compiled_num_outputs(const kf_compiled *c) { return c ? (int)kf_exec_num_outputs(c->x) : 0; }

const char *kf_compiled_input_name(const kf_compiled *c, int i) {
    return c && i >= 0 ? kf_exec_input_name(c->x, (uint32_t)i) : NULL;
}

kf_status kf_compiled_input_info(const kf_compiled *c, int i, int *dtype, int *rank, int64_t dims[8]) {
    const kf_type *t = c && i >= 0 ? kf_exec_input_type(c->x, (uint32_t)i) : NULL;
    if (!t || !dtype || !rank || !dims)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_input_info: input %d of %d, or a NULL pointer", i,
                       kf_compiled_num_inputs(c));
    *dtype = (int)t->dtype;
    *rank = t->rank > 8 ? -1 : t->rank; /* kf_run takes at most 8 dims (kf_output's bound) */
    for (int d = 0; d < *rank; d++) dims[d] = t->dims[d] < 0 ? -1 : t->dims[d];
    return KF_OK;
}

const char *kf_compiled_output_name(const kf_compiled *c, int i) {
    return c && i >= 0 ? kf_exec_output_name(c->x, (uint32_t)i) : NULL;
}

/* A kf_tensor header over the caller's data (not owned; never released). */
static kf_status view(const kf_compiled *c, int i, const kf_host_tensor *h, bool with_data, kf_tensor *t) {
    const char *name = kf_compiled_input_name(c, i);
    if (!kf_dtype_valid(h->dtype) || h->dtype == KF_DT_UNDEFINED || h->dtype == KF_DT_STRING)
        return kf_fail(KF_ERR_INVALID_ARG, "input '%s': dtype %d is not a numeric ONNX dtype", name, h->dtype);
    if (h->rank < 0 || h->rank > KF_MAX_RANK || (h->rank && !h->dims))
        return kf_fail(KF_ERR_INVALID_ARG, "input '%s': rank %d (at most %d, dims required)", name, h->rank, KF_MAX_RANK);
    memset(t, 0, sizeof *t);
    t->dtype = (kf_dtype)h->dtype;
    t->rank = h->rank;
    for (int d = 0; d < h->rank; d++) {
        if (h->dims[d] < 0) return kf_fail(KF_ERR_INVALID_ARG, "input '%s': dim %d is %lld", name, d, (long long)h->dims[d]);
        t->dims[d] = h->dims[d];
    }
    KF_TRY(kf_shape_numel(t->rank, t->dims, kf_dtype_size(t->dtype), &t->numel));
    if (with_data && t->numel && !h->data) return kf_fail(KF_ERR_INVALID_ARG, "input '%s': data is NULL", name);
    t->data = (void *)h->data; /* read only: kf_exec never writes inputs */
    return KF_OK;
}

kf_status kf_run(kf_compiled *c, const kf_host_tensor *inputs, int ninputs, kf_output *outputs, int noutputs) {
    if (!c || !outputs || (ninputs && !inputs)) return kf_fail(KF_ERR_INVALID_ARG, "kf_run: NULL argument");
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    for (int o = 0; o < noutputs; o++) memset(&outputs[o], 0, sizeof outputs[o]);
    if (ninputs != nin) return kf_fail(KF_ERR_INVALID_ARG, "kf_run: the model has %d inputs, %d were given", nin, ninputs);
    if (noutputs != nout)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run: the model has %d outputs, room for %d was given", nout, noutputs);
    kf_tensor *in = kf_calloc((size_t)nin + 1, sizeof(kf_tensor));
    kf_tensor *out = kf_calloc((size_t)nout + 1, sizeof(kf_tensor));
    kf_status st = in && out ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < nin; i++) st = view(c, i, &inputs[i], true, &in[i]);
    const char *trace = getenv("KFUSE_TRACE");
    /* where each input is read from: bindings check they pass memory without a copy */
    for (int i = 0; !st && trace && strstr(trace, "api") && i < nin; i++)
        fprintf(stderr, "kfuse: api: kf_run input '%s' read at %p (%zu bytes)\n", kf_compiled_input_name(c, i),
                in[i].data, (size_t)in[i].numel * kf_dtype_size(in[i].dtype));
    if (!st) st = kf_exec_run(c->x, in, (uint32_t)nin, out);
    for (int o = 0; !st && o < nout; o++) {
        kf_tensor *t = &out[o];
        if (t->rank > 8 || t->dtype == KF_DT_STRING) {
            st = kf_fail(KF_ERR_INVALID_ARG, "output '%s': %s (kf_output holds rank <= 8, numeric)",
                         kf_compiled_output_name(c, o), t->rank > 8 ? "rank above 8" : "a string tensor");
            break;
        }
        size_t n = (size_t)t->numel * kf_dtype_size(t->dtype);
        kf_output *r = &outputs[o];
        r->dtype = (int)t->dtype;
        r->rank = t->rank;
        memcpy(r->dims, t->dims, (size_t)t->rank * sizeof(int64_t));
        r->nbytes = n;
        /* malloc, not kf_malloc: the caller's memory, freed with free() in
         * kf_output_release whatever allocator hooks kfuse has */
        if (!(r->data = malloc(n ? n : 1))) st = kf_fail(KF_ERR_NOMEM, "out of memory for output '%s'", kf_compiled_output_name(c, o));
        else if (n) memcpy(r->data, t->data, n);
    }
    if (st)
        for (int o = 0; o < noutputs; o++) kf_output_release(&outputs[o]);
    for (int o = 0; out && o < nout; o++) kf_tensor_release(&out[o]);
    kf_free(in);
    kf_free(out);
    return st;
}

/* A kf_tensor header of a device tensor (data NULL) after checking what
 * can be checked without the plan: dims, the buffer's size. */
static kf_status device_view(const char *kind, const char *name, const kf_device_tensor *dt, kf_tensor *t) {
    if (!kf_dtype_valid(dt->dtype) || dt->dtype == KF_DT_UNDEFINED || dt->dtype == KF_DT_STRING)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s': dtype %d is not a numeric ONNX dtype", kind, name,
                       dt->dtype);
    if (dt->rank < 0 || dt->rank > KF_MAX_RANK || (dt->rank && !dt->dims))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s': rank %d (at most %d, dims required)", kind, name,
                       dt->rank, KF_MAX_RANK);
    memset(t, 0, sizeof *t);
    t->dtype = (kf_dtype)dt->dtype;
    t->rank = dt->rank;
    for (int d = 0; d < dt->rank; d++) {
        if (dt->dims[d] < 0)
            return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s': dim %d is %lld", kind, name, d,
                           (long long)dt->dims[d]);
        t->dims[d] = dt->dims[d];
    }
    KF_TRY(kf_shape_numel(t->rank, t->dims, kf_dtype_size(t->dtype), &t->numel));
    size_t need = (size_t)t->numel * kf_dtype_size(t->dtype);
    if (!dt->buffer)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s': the buffer is NULL", kind, name);
    if (dt->nbytes < need)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s': the buffer holds %zu bytes, %s needs %zu", kind, name,
                       dt->nbytes, kf_dtype_name(t->dtype), need);
    return KF_OK;
}

kf_status kf_compiled_device_context(const kf_compiled *c, void **context) {
    if (context) *context = NULL;
    if (!c || !context) return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_device_context: NULL argument");
    return kf_exec_device_context(c->x, context);
}

kf_status kf_run_device(kf_compiled *c, void *stream, const kf_device_tensor *inputs, int ninputs,
                        const kf_device_tensor *outputs, int noutputs) {
    if (!c || (ninputs && !inputs) || (noutputs && !outputs))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: NULL argument");
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    if (ninputs != nin)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: the model has %d inputs, %d were given", nin, ninputs);
    if (noutputs != nout)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: the model has %d outputs, %d were given", nout, noutputs);
    if (c->backend == KF_BACKEND_REF)
        return kf_fail(KF_ERR_UNSUPPORTED, "kf_run_device: backend ref runs on the host; kf_run runs it");
    if (!stream && c->backend == KF_BACKEND_OPENCL)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: NULL command queue");
    kf_tensor *in = kf_calloc((size_t)nin + 1, sizeof(kf_tensor)), *out = kf_calloc((size_t)nout + 1, sizeof(kf_tensor));
    void **ib = kf_calloc((size_t)nin + 1, sizeof(void *)), **ob = kf_calloc((size_t)nout + 1, sizeof(void *));
    kf_status st = in && out && ib && ob ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < nin; i++) {
        ib[i] = inputs[i].buffer;
        st = device_view("input", kf_compiled_input_name(c, i), &inputs[i], &in[i]);
    }
    for (int o = 0; !st && o < nout; o++) {
        ob[o] = outputs[o].buffer;
        st = device_view("output", kf_compiled_output_name(c, o), &outputs[o], &out[o]);
    }
    /* the caller's buffers as given: bindings check they pass memory without a copy */
    const char *trace = getenv("KFUSE_TRACE");
    for (int i = 0; !st && trace && strstr(trace, "api") && i < nin + nout; i++)
        fprintf(stderr, "kfuse: api: kf_run_device %s '%s' buffer %p\n", i < nin ? "input" : "output",
                i < nin ? kf_compiled_input_name(c, i) : kf_compiled_output_name(c, i - nin), i < nin ? ib[i] : ob[i - nin]);
    if (!st) st = kf_exec_run_device(c->x, stream, in, ib, (uint32_t)nin, out, ob, (uint32_t)nout);
    kf_free(in);
    kf_free(out);
    kf_free(ib);
    kf_free(ob);
    return st;
}

kf_status kf_sync(kf_compiled *c, void *stream) {
    if (!c) return kf_fail(KF_ERR_INVALID_ARG, "kf_sync: NULL argument");
    if (!stream && c->backend == KF_BACKEND_OPENCL) return kf_fail(KF_ERR_INVALID_ARG, "kf_sync: NULL command queue");
    return kf_exec_sync(c->x, stream);
}

static bool same_types(const kf_type *a, const kf_type *b, int n) {
    for (int i = 0; i < n; i++) {
        if (a[i].dtype != b[i].dtype || a[i].rank != b[i].rank) return false;
        for (int d = 0; d < a[i].rank && d < KF_MAX_RANK; d++)
            if (a[i].dims[d] != b[i].dims[d]) return false;
    }
    return true;
}

kf_status kf_compiled_output_info(const kf_compiled *cc, const kf_host_tensor *inputs, int ninputs, int i, int *dtype,
                                  int *rank, int64_t dims[8]) {
    kf_compiled *c = (kf_compiled *)cc; /* the cache below is the only state it changes, under c->mu */
    if (!c || !dtype || !rank || !dims || (ninputs && !inputs))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_output_info: NULL argument");
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    if (i < 0 || i >= nout) return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_output_info: output %d of %d", i, nout);
    if (ninputs != nin)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_output_info: the model has %d inputs, %d were given", nin, ninputs);
    kf_tensor *in = kf_calloc((size_t)nin + 1, sizeof(kf_tensor));
    kf_type *tin = kf_calloc((size_t)nin + 1, sizeof(kf_type)), *tout = kf_calloc((size_t)nout + 1, sizeof(kf_type));
    kf_status st = in && tin && tout ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < nin; k++)
        if (!(st = view(c, k, &inputs[k], false, &in[k]))) kf_type_of_tensor(&tin[k], &in[k]);
    bool hit = false;
    if (!st) {
        pthread_mutex_lock(&c->mu);
        if ((hit = c->info_in && same_types(c->info_in, tin, nin))) memcpy(tout, c->info_out, (size_t)nout * sizeof *tout);
        pthread_mutex_unlock(&c->mu);
    }
    if (!st && !hit && !(st = kf_exec_output_types(c->x, in, (uint32_t)nin, tout))) {
        /* remembered for the next output's call; without memory, not at all */
        kf_type *ci = kf_calloc((size_t)nin + 1, sizeof *ci), *co = kf_calloc((size_t)nout + 1, sizeof *co);
        if (ci && co) {
            memcpy(ci, tin, (size_t)nin * sizeof *ci);
            memcpy(co, tout, (size_t)nout * sizeof *co);
            pthread_mutex_lock(&c->mu);
            kf_type *old_in = c->info_in, *old_out = c->info_out;
            c->info_in = ci, c->info_out = co;
            pthread_mutex_unlock(&c->mu);
            ci = old_in, co = old_out;
        }
        kf_free(ci);
        kf_free(co);
    }
    if (!st) {
        const kf_type *t = &tout[i];
        if (t->rank > 8)
            st = kf_fail(KF_ERR_INVALID_ARG, "output '%s': rank %d (kf_output holds rank <= 8)", kf_compiled_output_name(c, i),
                         t->rank);
        else {
            *dtype = (int)t->dtype;
            *rank = t->rank;
            for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d] < 0 ? KF_DIM_UNKNOWN : t->dims[d];
        }
    }
    kf_free(in);
    kf_free(tin);
    kf_free(tout);
    return st;
}

void kf_output_release(kf_output *o) {
    if (!o) return;
    free(o->data);
    memset(o, 0, sizeof *o);
}

void kf_compiled_free(kf_compiled *c) {
    if (!c) return;
    kf_exec_free(c->x);
    pthread_mutex_destroy(&c->mu);
    kf_free(c->info_in);
    kf_free(c->info_out);
    kf_free(c);
}
