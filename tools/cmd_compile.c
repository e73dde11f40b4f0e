/*
 * cmd_compile.c: `kfuse compile M.onnx --backend cuda|opencl`: every kernel
 * of the model's fusion plan compiled into the kernel cache without running
 * anything (cuda needs NVRTC only, no GPU), with kernels compiled, cache
 * hits and time printed. Also the option parsing and random inputs that
 * `kfuse bench` (cmd_bench.c) shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_exec.h"
#include "kf_onnx.h"
#include "kf_ref.h"
#include "kfuse_tool.h"

enum { EXIT_OK = 0, EXIT_USAGE = 2, EXIT_INPUT = 3 };

int kfuse_cmd_compile(int argc, char **argv);

int kfuse_tool_fail(kf_status st) {
    fprintf(stderr, "kfuse: %s: %s\n", kf_status_name(st), kf_last_error());
    return EXIT_INPUT;
}

kf_status kfuse_tool_load(const char *path, kf_model **m) {
    KF_TRY(kf_model_load(path, m));
    const kf_model *mm = *m;
    if (mm->load_warnings > 1)
        fprintf(stderr, "kfuse: warning: %s: %s (and %u more)\n", path, mm->load_warning, mm->load_warnings - 1);
    else if (mm->load_warnings)
        fprintf(stderr, "kfuse: warning: %s: %s\n", path, mm->load_warning);
    return KF_OK;
}

bool kfuse_tool_dim_arg(kfuse_tool_dims *d, char *arg) {
    char *eq = strchr(arg, '=');
    char *end = NULL;
    long long v = eq && eq[1] >= '0' && eq[1] <= '9' ? strtoll(eq + 1, &end, 10) : -1;
    if (!eq || eq == arg || v < 0 || *end) {
        fprintf(stderr, "kfuse: --dim %s: expected NAME=N with N a non-negative integer\n", arg);
        return false;
    }
    if (d->n == KFUSE_TOOL_MAX_DIMS) {
        fprintf(stderr, "kfuse: more than %d --dim flags\n", KFUSE_TOOL_MAX_DIMS);
        return false;
    }
    *eq = 0;
    d->names[d->n] = arg;
    d->values[d->n++] = v;
    return true;
}

kf_status kfuse_tool_apply_dims(kf_model *m, const kfuse_tool_dims *d, bool bind) {
    kf_graph *g = m->graph;
    for (int i = 0; i < d->n; i++) {
        bool known = false;
        for (uint32_t s = 1; s < g->nsyms && !known; s++) known = !strcmp(g->syms[s], d->names[i]);
        if (!known) fprintf(stderr, "kfuse: warning: --dim %s: the model has no symbolic dimension named '%s'; ignored\n",
                            d->names[i], d->names[i]);
        else if (bind) KF_TRY(kf_graph_bind_sym(g, d->names[i], d->values[i]));
    }
    return KF_OK;
}

bool kfuse_tool_parse(kfuse_tool_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->backend = "opencl";
    a->warmup = 10; /* enough for caches, allocator and clocks to settle */
    a->iters = 100; /* p99 needs at least 100 samples to mean anything */
    a->seed = 1;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(o, "--backend") && more) a->backend = argv[++i];
        else if (!strcmp(o, "--arch") && more) a->arch = argv[++i];
        else if (!strcmp(o, "--precision") && more) a->precision = argv[++i];
        else if (!strcmp(o, "--target") && more) a->target = argv[++i];
        else if (!strcmp(o, "--device") && more) a->device = atoi(argv[++i]);
        else if (!strcmp(o, "--patterns") && more && a->npatterns < KFUSE_TOOL_MAX_PATTERNS)
            a->patterns[a->npatterns++] = argv[++i];
        else if (!strcmp(o, "--warmup") && more) a->warmup = atoi(argv[++i]);
        else if (!strcmp(o, "--iters") && more) a->iters = atoi(argv[++i]);
        else if (!strcmp(o, "--threads") && more) a->threads = atoi(argv[++i]);
        else if (!strcmp(o, "--seed") && more) a->seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(o, "--dim") && more) {
            if (!kfuse_tool_dim_arg(&a->dims, argv[++i])) return false;
        } else if (o[0] != '-' && !a->model) a->model = o;
        else return false;
    }
    if (a->warmup < 0 || a->iters < 1) return false;
    return a->model != NULL;
}

bool kfuse_tool_backend(const char *name, kf_exec_backend *b) {
    if (!strcmp(name, "opencl")) *b = KF_EXEC_OPENCL;
    else if (!strcmp(name, "cuda")) *b = KF_EXEC_CUDA;
    else if (!strcmp(name, "ref")) *b = KF_EXEC_REF;
    else return false;
    return true;
}

bool kfuse_tool_precision(const char *flag, kf_precision *p) {
    if (flag) {
        if (kf_precision_parse(flag, p)) return true;
        fprintf(stderr, "kfuse: unknown precision '%s' (fp32, tf32, fp16, bf16, int8)\n", flag);
        return false;
    }
    if (kf_precision_from_env(p) == KF_OK) return true;
    fprintf(stderr, "kfuse: %s\n", kf_last_error());
    return false;
}

kf_status kfuse_tool_exec_options(kfuse_tool_args *a, kf_exec_backend b, kf_precision prec, kf_exec_options *o) {
    kf_compile_options c = KF_COMPILE_OPTIONS_INIT;
    c.backend = b == KF_EXEC_CUDA ? KF_BACKEND_CUDA : b == KF_EXEC_OPENCL ? KF_BACKEND_OPENCL : KF_BACKEND_REF;
    c.precision = prec;
    c.target = a->target;
    c.device = a->device;
    c.pattern_files = a->patterns;
    c.npattern_files = a->npatterns;
    for (int i = 0; i < a->dims.n; i++) a->fixed[i] = (kf_dim){a->dims.names[i], a->dims.values[i]};
    c.dims = a->fixed;
    c.ndims = a->dims.n;
    return kf_exec_options_from_public(&c, o);
}

/* The concrete type of real input v: symbolic dims from --dim, else 1. */
static kf_type input_type(const kf_graph *g, const kf_value *v, const kfuse_tool_dims *dims) {
    kf_type t = v->type;
    for (int d = 0; d < t.rank; d++) {
        if (t.dims[d] >= 0) continue;
        t.dims[d] = 1;
        for (int b = 0; b < dims->n; b++)
            if (t.syms[d] && !strcmp(dims->names[b], g->syms[t.syms[d]])) t.dims[d] = dims->values[b];
        t.syms[d] = 0;
    }
    return t;
}

kf_status kfuse_tool_types(const kf_model *m, const kfuse_tool_dims *dims, kf_type **types, uint32_t *n) {
    kf_id *real = NULL;
    KF_TRY(kf_graph_real_inputs(m->graph, &real, n));
    *types = calloc(*n + 1, sizeof(kf_type));
    if (!*types) {
        free(real);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_status st = KF_OK;
    for (uint32_t i = 0; i < *n && !st; i++) {
        const kf_value *v = &m->graph->values[real[i]];
        if (v->type.rank < 0 || !v->type.dtype)
            st = kf_fail(KF_ERR_INVALID_ARG, "input '%s' has no declared type; random data needs one", v->name);
        else
            (*types)[i] = input_type(m->graph, v, dims);
    }
    free(real);
    return st;
}

/* Integers that index nothing of known size are drawn below this: small
 * enough for the dims they might index, large enough not to be constant. */
#define RANDOM_INT_RANGE 8

kf_status kfuse_tool_inputs(const kf_model *m, const kf_type *types, uint32_t n, uint64_t seed, kf_tensor *ins) {
    kf_id *real = NULL;
    uint32_t nreal = 0;
    KF_TRY(kf_graph_real_inputs(m->graph, &real, &nreal));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
    kf_status st = nreal == n ? KF_OK : kf_fail(KF_ERR_INVALID_ARG, "%u input types for %u inputs", n, nreal);
    for (uint32_t i = 0; i < n && !st; i++) {
        int64_t range = kf_index_bound(m->graph, real[i]);
        if (range <= 0) range = RANDOM_INT_RANGE;
        if ((st = kf_tensor_alloc(&ins[i], types[i].dtype, types[i].rank, types[i].dims))) {
            kf_fail_context(st, "random data for input '%s'", m->graph->values[real[i]].name);
            break;
        }
        for (int64_t k = 0; k < ins[i].numel; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            double u = (double)(x >> 11) / 9007199254740992.0;
            if (kf_dtype_is_float(ins[i].dtype)) kf_set_f64(&ins[i], k, 2 * u - 1);
            else if (ins[i].dtype == KF_DT_BOOL) kf_set_i64(&ins[i], k, u < 0.5);
            else kf_set_i64(&ins[i], k, (int64_t)(u * (double)range)); /* in [0, range): valid as indices */
        }
    }
    free(real);
    return st;
}

static void compile_usage(FILE *f) {
    fprintf(f, "usage: kfuse compile M.onnx --backend cuda|opencl [--arch sm_90] [--dim NAME=N]... [--threads N]\n"
               "                     [--target NAME|FILE] [--device N] [--patterns F.kfp]...\n"
               "                      [--precision fp32|tf32|fp16|bf16|int8|int8-fp16|fp8]\n"
               "  compiles every kernel of the fusion plan into the kernel cache ($KFUSE_CACHE_DIR);\n"
               "  cuda needs NVRTC only (no GPU); --arch defaults to the device's, else sm_90.\n"
               "  Symbolic input dims: --dim NAME=N, else 1. --precision: default KFUSE_PRECISION, else fp32.\n");
}

int kfuse_cmd_compile(int argc, char **argv) {
    kfuse_tool_args a;
    kf_exec_backend b;
    kf_precision prec;
    if (!kfuse_tool_parse(&a, argc, argv) || !kfuse_tool_backend(a.backend, &b) || b == KF_EXEC_REF) {
        compile_usage(stderr);
        return EXIT_USAGE;
    }
    if (!kfuse_tool_precision(a.precision, &prec)) return EXIT_USAGE;
    kf_model *m = NULL;
    kf_exec *x = NULL;
    kf_type *types = NULL;
    uint32_t n = 0;
    kf_exec_stats s;
    kf_status st = kfuse_tool_load(a.model, &m);
    if (!st) st = kfuse_tool_apply_dims(m, &a.dims, false);
    if (!st) st = kfuse_tool_types(m, &a.dims, &types, &n);
    kf_exec_options o;
    if (!st) st = kfuse_tool_exec_options(&a, b, prec, &o);
    if (!st) {
        o.arch = a.arch;
        o.compile_only = true;
        o.threads = a.threads;
        const char *tr = getenv("KFUSE_TRACE");
        o.trace = tr && strstr(tr, "backend") ? stderr : NULL;
        st = kf_exec_create(m, &o, &x);
    }
    if (!st) st = kf_exec_prepare(x, types, n, &s);
    if (!st)
        printf("kfuse: compile: %u groups as kernels, %u on ref; %u distinct kernels: %u compiled, %u cache hits, "
               "%.2f ms (%s, %s)\n",
               s.groups_dev, s.groups_ref, s.kernels_unique, s.kernels_compiled, s.cache_hits, s.compile_seconds * 1e3,
               a.backend, kf_precision_name(prec));
    int rc = st ? kfuse_tool_fail(st) : EXIT_OK;
    kf_exec_free(x);
    free(types);
    kf_model_free(m);
    return rc;
}
