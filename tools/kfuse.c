/*
 * kfuse.c: the command-line tool. Each verb is one function; they share
 * argument parsing and the exit-code policy (0 ok, 1 check/compare failed,
 * 2 usage, 3 bad input or environment). The verbs call the library; this
 * file holds no graph logic of its own.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kf_onnx.h"
#include "kf_opset_raise.h"
#include "kf_opt.h"
#include "kf_precision.h"
#include "kf_ref.h"
#include "kf_sym.h"
#include "kf_run.h"
#include "kfuse_tool.h"

enum { EXIT_OK = 0, EXIT_CHECK = 1, EXIT_USAGE = 2, EXIT_INPUT = 3 };

static int fail_status(kf_status st) {
    fprintf(stderr, "kfuse: %s: %s\n", kf_status_name(st), kf_last_error());
    return EXIT_INPUT;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kfuse VERB [options]\n"
            "  info M.onnx [--values]          opsets, op histogram, inputs/outputs, parameter bytes\n"
            "                                  (--values: every computed value's inferred type)\n"
            "  run M.onnx [--backend ref|opencl|cuda] [--check] [--inputs DIR] [--outputs DIR] [--seed N] [--dim NAME=N]\n"
            "             [--precision fp32|tf32|fp16|bf16|int8|int8-fp16|fp8]\n"
            "                                  run the model; random inputs unless --inputs DIR\n"
            "                                  (DIR: NAME.npy per input, or input_N.pb TensorProto files)\n"
            "                                  (--dim naming a dim the model lacks: a warning)\n"
            "  compile M.onnx --backend cuda|opencl [--arch sm_90] [--dim NAME=N] [--precision P]\n"
            "                                  compile every kernel into the cache without running\n"
            "                                  (also --target T, --device N, --patterns F as bench)\n"
            "  bench M.onnx [--backend opencl|cuda|ref] [--warmup N] [--iters N] [--dim NAME=N] [--precision P]\n"
            "               [--target NAME|FILE] [--device N] [--patterns F.kfp]...\n"
            "                                  latency p50/p99, kernels launched, arena bytes\n"
            "  conform DIR... [--backend ref|opencl] [--verbose]\n"
            "                                  run ONNX backend-test folders, per-op table and summary\n"
            "  opt M.onnx -o OUT.onnx [--patterns F]... [--keep NAME]... [--no-builtin] [--no-raise | --opset N]\n"
            "                 [--dim NAME=N]... [--report] [--json]\n"
            "                                  rewrite to a smaller standard ONNX (--dim: fix a symbolic dim;\n"
            "                                  --opset N: raise to N and use its ops, e.g. Attention at 23)\n"
            "  fuse M.onnx -o OUT.onnx [--report] [--json] [--dot F] [--no-opt] [--dim NAME=N] [--plan-dim NAME=N]\n"
            "                                  plan fusion; groups become ai.kfuse ONNX functions\n"
            "  quantize M.onnx -o Q.onnx [--calib DIR | --random N] [--method minmax|percentile|entropy]\n"
            "                 [--percentile P] [--per-channel] [--type int8|fp8] [--exclude OP|NODE]...\n"
            "                 [--include OP]... [--report] [--seed S] [--dim NAME=N]\n"
            "                                  post-training quantization to QDQ ONNX, calibrated on ref;\n"
            "                                  prints the SQNR against float (--report: per layer)\n"
            "  patterns check F.kfp... [--builtin] [--seed N]\n"
            "                                  verify rewrite rules numerically\n"
            "  cache stats|clear [--dir D]     the kernel cache folder: entries and bytes, or empty it\n"
            "exit codes: 0 ok, 1 check failed, 2 usage, 3 bad input\n");
}

/* ---- shared helpers ------------------------------------------------------- */

static void print_type(const kf_graph *g, const kf_type *ty) {
    printf("%s", ty->dtype ? kf_dtype_name(ty->dtype) : "?");
    if (ty->rank < 0) {
        printf("[?]");
        return;
    }
    printf("[");
    for (int i = 0; i < ty->rank; i++) {
        if (i) printf(",");
        if (ty->dims[i] >= 0) printf("%lld", (long long)ty->dims[i]);
        else if (ty->syms[i]) printf("%s", g->syms[ty->syms[i]]);
        else printf("?");
    }
    printf("]");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir that start with prefix (malloc'ed list, caller frees). */
static char **list_dir(const char *dir, const char *prefix, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, sizeof(char *) * (size_t)cap);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof(char *), cmp_str);
    *count = n;
    return names;
}

static void free_list(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

/* input_10.pb sorts after input_9.pb */
static int pb_index(const char *name) {
    const char *u = strrchr(name, '_');
    return u ? atoi(u + 1) : 0;
}

static int cmp_pb(const void *a, const void *b) {
    return pb_index(*(char *const *)a) - pb_index(*(char *const *)b);
}

/* out = a/b; false (and out empty) when it does not fit. */
static bool join(char *out, size_t n, const char *a, const char *b) {
    int w = snprintf(out, n, "%s/%s", a, b);
    if (w < 0 || (size_t)w >= n) {
        out[0] = 0;
        return false;
    }
    return true;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- info ------------------------------------------------------------------ */

static int cmd_info(int argc, char **argv) {
    if (argc < 1) {
        usage(stderr);
        return EXIT_USAGE;
    }
    bool values = argc > 1 && !strcmp(argv[1], "--values");
    kf_model *m;
    kf_status st = kfuse_tool_load(argv[0], &m);
    if (st) return fail_status(st);
    const kf_graph *g = m->graph;
    kf_status inferred = kf_infer_shapes(m);
    char infer_msg[512];
    if (inferred) snprintf(infer_msg, sizeof infer_msg, "%s", kf_last_error());
    else if (m->shape_warnings)
        snprintf(infer_msg, sizeof infer_msg, "ok; %u declared shapes disagree with the graph (the graph wins), first: %s",
                 m->shape_warnings, m->shape_warning);
    else snprintf(infer_msg, sizeof infer_msg, "ok");
    printf("model: %s\n", argv[0]);
    printf("ir_version: %lld\n", (long long)m->ir_version);
    printf("opsets:");
    for (int i = 0; i < m->nopsets; i++)
        printf(" %s:%lld", m->opsets[i].domain[0] ? m->opsets[i].domain : "ai.onnx", (long long)m->opsets[i].version);
    printf("\n");
    int64_t params = 0, nparams = 0;
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].init) {
            params += g->values[v].init->numel * (int64_t)kf_dtype_size(g->values[v].init->dtype);
            nparams++;
        }
    uint32_t live = 0;
    for (kf_id i = 1; i < g->nnodes; i++) live += !g->nodes[i].dead;
    printf("nodes: %u\ninitializers: %lld (%lld bytes)\n", live, (long long)nparams, (long long)params);
    printf("inputs:\n");
    for (uint32_t i = 0; i < g->ninputs; i++) {
        const kf_value *v = &g->values[g->inputs[i]];
        if (v->init) continue;
        printf("  %s: ", v->name);
        print_type(g, &v->type);
        printf("\n");
    }
    printf("outputs:\n");
    for (uint32_t i = 0; i < g->noutputs; i++) {
        const kf_value *v = &g->values[g->outputs[i]];
        printf("  %s: ", v->name);
        print_type(g, &v->type);
        printf("\n");
    }
    /* op histogram, most frequent first */
    typedef struct {
        const char *op;
        int count;
    } hist;
    hist *h = calloc(live + 1, sizeof *h);
    int nh = 0;
    for (kf_id i = 1; h && i < g->nnodes; i++) {
        if (g->nodes[i].dead) continue;
        int k = 0;
        while (k < nh && strcmp(h[k].op, g->nodes[i].op_type)) k++;
        if (k == nh) h[nh++].op = g->nodes[i].op_type;
        h[k].count++;
    }
    for (int a = 0; a < nh; a++)
        for (int b = a + 1; b < nh; b++)
            if (h[b].count > h[a].count || (h[b].count == h[a].count && strcmp(h[b].op, h[a].op) < 0)) {
                hist t = h[a];
                h[a] = h[b];
                h[b] = t;
            }
    printf("ops:\n");
    for (int a = 0; a < nh; a++) printf("  %-28s %d\n", h[a].op, h[a].count);
    free(h);
    const char *why = kf_eval_unsupported_reason(m);
    if (values) {
        printf("values (after shape inference):\n");
        for (kf_id v = 1; v < g->nvalues; v++) {
            if (!g->values[v].producer || g->nodes[g->values[v].producer].dead) continue;
            printf("  %s: ", g->values[v].name);
            print_type(g, &g->values[v].type);
            const kf_symvec *sv = g->values[v].symval;
            if (sv) { /* a shape computation's contents */
                printf(" = %s", sv->rank ? "[" : "");
                for (int k = 0; k < sv->n; k++) {
                    kf_sdim e = sv->e[k];
                    if (e.sym) printf("%s%s", k ? "," : "", kf_sym_name(g, e.sym));
                    else printf("%s%lld", k ? "," : "", (long long)e.v);
                }
                printf("%s", sv->rank ? "]" : "");
            }
            printf("  <- %s\n", g->nodes[g->values[v].producer].op_type);
        }
    }
    printf("shape inference: %s\n", infer_msg);
    printf("reference evaluator: %s\n", why ? why : "supports every node");
    kf_model_free(m);
    return EXIT_OK;
}

/* ---- run --------------------------------------------------------------------- */

static void print_summary(const char *name, const kf_tensor *t) {
    printf("%s: %s[", name, kf_dtype_name(t->dtype));
    for (int i = 0; i < t->rank; i++) printf("%s%lld", i ? "," : "", (long long)t->dims[i]);
    printf("]");
    if (t->dtype != KF_DT_STRING && t->numel) {
        double sum = 0, mn = INFINITY, mx = -INFINITY;
        for (int64_t i = 0; i < t->numel; i++) {
            double x = kf_get_f64(t, i);
            sum += x;
            if (x < mn) mn = x;
            if (x > mx) mx = x;
        }
        printf(" min %.6g max %.6g mean %.6g", mn, mx, sum / (double)t->numel);
        printf(" first [");
        for (int64_t i = 0; i < t->numel && i < 6; i++) printf("%s%.6g", i ? ", " : "", kf_get_f64(t, i));
        printf("%s]", t->numel > 6 ? ", ..." : "");
    }
    printf("\n");
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Loads the graph's real inputs from dir: NAME.npy (NumPy) for an input
 * named NAME, else the input_*.pb TensorProto files (by name when the file
 * names its tensor, else by position). Two files for one input, a file for
 * no input, or an input without one are errors naming them (kfuse_tool.h). */
kf_status kfuse_tool_load_inputs(const kf_graph *g, const kf_id *real, uint32_t nreal, const char *dir, kf_tensor *ins) {
    int nf;
    char **files = list_dir(dir, "input_", &nf);
    if (!files && nf == 0 && !is_dir(dir)) return kf_fail(KF_ERR_IO, "cannot read folder '%s'", dir);
    if (nf) qsort(files, (size_t)nf, sizeof(char *), cmp_pb);
    kf_status st = KF_OK;
    bool *filled = calloc(nreal + 1, 1);
    const char **from = calloc(nreal + 1, sizeof(char *)); /* the .pb file that filled each input, NULL for .npy */
    if (!filled || !from) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < nreal && !st; i++) {
        const char *name = g->values[real[i]].name;
        char fname[1024], path[4096];
        if (strchr(name, '/') || snprintf(fname, sizeof fname, "%s.npy", name) >= (int)sizeof fname) continue;
        if (!join(path, sizeof path, dir, fname) || !is_file(path)) continue;
        if ((st = kf_npy_read_file(path, &ins[i]))) break;
        filled[i] = true;
    }
    for (int f = 0, pbs = 0; f < nf && !st; f++) {
        if (!ends_with(files[f], ".pb")) continue; /* input_ids.npy is not a TensorProto */
        char path[4096];
        join(path, sizeof path, dir, files[f]);
        kf_tensor t = {0};
        char *name = NULL;
        if ((st = kf_onnx_read_tensor_file(path, &t, &name))) break;
        uint32_t slot = (uint32_t)pbs++;
        if (name && name[0])
            for (uint32_t i = 0; i < nreal; i++)
                if (strcmp(g->values[real[i]].name, name) == 0) slot = i;
        free(name);
        if (slot >= nreal) {
            kf_tensor_release(&t);
            st = kf_fail(KF_ERR_INVALID_ARG, "'%s' does not match any model input", path);
            break;
        }
        if (filled[slot]) {
            kf_tensor_release(&t);
            const char *vname = g->values[real[slot]].name;
            st = from[slot] ? kf_fail(KF_ERR_INVALID_ARG, "'%s' and '%s' both give input '%s'", path, from[slot], vname)
                            : kf_fail(KF_ERR_INVALID_ARG, "'%s' and '%s.npy' both give input '%s'", path, vname, vname);
            break;
        }
        /* ONNX 1.12's test data stores bfloat16 tensors as uint16 bits */
        if (t.dtype == KF_DT_UINT16 && g->values[real[slot]].type.dtype == KF_DT_BFLOAT16) t.dtype = KF_DT_BFLOAT16;
        kf_tensor_move(&ins[slot], &t);
        filled[slot] = true;
        from[slot] = files[f];
    }
    for (uint32_t i = 0; i < nreal && !st; i++)
        if (!filled[i])
            st = kf_fail(KF_ERR_INVALID_ARG, "no data for input '%s' in '%s' (%s.npy, or an input_N.pb)",
                         g->values[real[i]].name, dir, g->values[real[i]].name);
    free(filled);
    free(from);
    free_list(files, nf);
    return st;
}

/* --backend opencl|cuda [--check]: kernels/run.c runs the optimized plan;
 * with --check the unoptimized model runs on ref first and every output
 * must match (at int8, the model with its integer anchors: the kernels
 * compute what the reference does on that graph, and both differ from the
 * float QDQ graph by rounding). Exit 1 on mismatch, 3 without a device. */
static int run_device_backend(kf_model *m, kf_exec_backend b, kf_precision prec, const kf_tensor *ins, int nins,
                              kf_tensor *outs, bool check) {
    uint32_t nout = m->graph->noutputs;
    kf_tensor *want = check ? calloc(nout + 1, sizeof(kf_tensor)) : NULL;
    char **names = calloc(nout + 1, sizeof(char *));
    kf_status st = (check && !want) || !names ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    for (uint32_t o = 0; !st && o < nout; o++)
        if (!(names[o] = strdup(m->graph->values[m->graph->outputs[o]].name))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    uint32_t *depth = check ? calloc(nout + 1, sizeof(uint32_t)) : NULL;
    uint32_t *requant = check ? calloc(nout + 1, sizeof(uint32_t)) : NULL;
    if (!st && check && (!depth || !requant)) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st && check && (prec == KF_PRECISION_INT8 || prec == KF_PRECISION_INT8_FP16)) st = kf_fuse_int8(m, NULL);
    if (!st && check) st = kf_run_output_depths(m, depth);
    if (!st && check) st = kf_run_output_requants(m, requant);
    if (!st && check) st = kf_eval_model(m, ins, nins, want, NULL);
    const char *tr = getenv("KFUSE_TRACE");
    kf_run_summary sum;
    if (!st)
        st = kf_run_backend_steps(m, b, prec, ins, nins, outs, tr && strstr(tr, "backend") ? stderr : NULL, stderr, &sum);
    int rc = st ? fail_status(st) : EXIT_OK;
    if (!st)
        fprintf(stderr, "kfuse: %u groups on %s (generated), %u on the reference evaluator (%s)\n", sum.groups_cl,
                b == KF_EXEC_CUDA ? "CUDA" : b == KF_EXEC_OPENCL ? "OpenCL" : "ref", sum.groups_ref,
                kf_precision_name(prec));
    for (uint32_t o = 0; !st && check && o < nout; o++) {
        char why[640];
        double db;
        if (!kf_run_close_requant(&outs[o], &want[o], prec, depth[o], requant[o], &db, why, sizeof why)) {
            fprintf(stderr, "kfuse: check: output '%s' differs from ref: %s\n", names[o], why);
            rc = EXIT_CHECK;
            break;
        }
        if (!isnan(db)) fprintf(stderr, "kfuse: check: output '%s': %s\n", names[o], why);
    }
    if (!st && check && rc == EXIT_OK)
        fprintf(stderr, "kfuse: check: %u outputs match ref%s\n", nout,
                prec == KF_PRECISION_FP32   ? ""
                : prec == KF_PRECISION_INT8 ? " (ref on the graph with integer anchors)"
                : prec == KF_PRECISION_INT8_FP16
                    ? " (ref on the graph with integer anchors; float16 tolerance, scaled by depth and output magnitude)"
                : prec == KF_PRECISION_BF16 ? " (bfloat16 tolerance, scaled by depth and output magnitude)"
                                            : " (float16 tolerance, scaled by depth and output magnitude)");
    for (uint32_t o = 0; o < nout; o++) {
        if (want) kf_tensor_release(&want[o]);
        if (names) free(names[o]);
    }
    free(want);
    free(names);
    free(depth);
    free(requant);
    return rc;
}

static int cmd_run(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *outputs = NULL, *backend = "ref", *precision = NULL;
    bool check = false;
    kfuse_tool_dims dims = {0};
    uint64_t seed = 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--inputs") && i + 1 < argc) inputs = argv[++i];
        else if (!strcmp(argv[i], "--outputs") && i + 1 < argc) outputs = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--check")) check = true;
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) precision = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            if (!kfuse_tool_dim_arg(&dims, argv[++i])) return EXIT_USAGE;
        } else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!model) {
        usage(stderr);
        return EXIT_USAGE;
    }
    bool opencl = !strcmp(backend, "opencl"), cuda = !strcmp(backend, "cuda");
    if (strcmp(backend, "ref") != 0 && !opencl && !cuda) {
        fprintf(stderr, "kfuse: unknown backend '%s' (ref, opencl, cuda)\n", backend);
        return EXIT_USAGE;
    }
    kf_precision prec;
    if (!kfuse_tool_precision(precision, &prec)) return EXIT_USAGE;
    kf_model *m;
    kf_status st = kfuse_tool_load(model, &m);
    if (st) return fail_status(st);
    const kf_graph *g = m->graph;
    kf_id *real = NULL;
    uint32_t nreal = 0;
    kf_tensor *ins = NULL, *outs = NULL;
    int rc = EXIT_OK;
    if ((st = kfuse_tool_apply_dims(m, &dims, false))) goto done;
    if ((st = kf_graph_real_inputs(g, &real, &nreal))) goto done;
    ins = calloc(nreal + 1, sizeof(kf_tensor));
    outs = calloc(g->noutputs + 1, sizeof(kf_tensor));
    if (!ins || !outs) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (inputs) {
        if ((st = kfuse_tool_load_inputs(g, real, nreal, inputs, ins))) goto done;
    } else {
        kf_type *types = NULL;
        uint32_t n = 0;
        if (!(st = kfuse_tool_types(m, &dims, &types, &n))) st = kfuse_tool_inputs(m, types, n, seed, ins);
        free(types);
        if (st) goto done;
    }
    if (opencl || cuda || prec != KF_PRECISION_FP32) { /* ref at fp16/bf16: the converted model on ref */
        kf_exec_backend b = cuda ? KF_EXEC_CUDA : opencl ? KF_EXEC_OPENCL : KF_EXEC_REF;
        if ((rc = run_device_backend(m, b, prec, ins, (int)nreal, outs, check)) != EXIT_OK) goto done;
    } else if ((st = kf_eval_model(m, ins, (int)nreal, outs, NULL))) goto done;
    for (uint32_t o = 0; o < g->noutputs; o++) {
        print_summary(g->values[g->outputs[o]].name, &outs[o]);
        if (outputs) {
            char path[4096];
            mkdir(outputs, 0777);
            char fname[32];
            snprintf(fname, sizeof fname, "output_%u.pb", o);
            join(path, sizeof path, outputs, fname);
            if ((st = kf_onnx_write_tensor_file(path, &outs[o], g->values[g->outputs[o]].name))) goto done;
        }
    }
done:
    if (st) rc = fail_status(st);
    for (uint32_t i = 0; ins && i < nreal; i++) kf_tensor_release(&ins[i]);
    for (uint32_t o = 0; outs && o < g->noutputs; o++) kf_tensor_release(&outs[o]);
    free(ins);
    free(outs);
    free(real);
    kf_model_free(m);
    return rc;
}

/* ---- conform -------------------------------------------------------------------- */

/* ONNX backend test runner defaults (DESIGN.md, numerics). */
#define CONFORM_RTOL 1e-3
#define CONFORM_ATOL 1e-7
/* the runner widens bfloat16 to two of its ulps (relative 2^-6) */
#define CONFORM_RTOL_BF16 0.015625

typedef enum { R_PASS, R_FAIL, R_SKIP } result;

typedef struct opstat {
    char *op;
    int pass, fail, skip;
    char *skip_reason;
} opstat;

typedef struct conform_state {
    opstat *ops;
    int nops, capops;
    int pass, fail, skip;
    bool verbose;
    bool opencl;            /* --backend opencl: optimized + fused, generated kernels on OpenCL */
    int dirs_generated;     /* opencl: folders where at least one group ran a generated kernel */
    kf_run_summary groups;  /* opencl: groups summed over every data set run */
} conform_state;

static opstat *op_entry(conform_state *cs, const char *op) {
    for (int i = 0; i < cs->nops; i++)
        if (!strcmp(cs->ops[i].op, op)) return &cs->ops[i];
    if (cs->nops == cs->capops) {
        cs->capops = cs->capops ? cs->capops * 2 : 64;
        cs->ops = realloc(cs->ops, sizeof(opstat) * (size_t)cs->capops);
    }
    opstat *e = &cs->ops[cs->nops++];
    memset(e, 0, sizeof *e);
    e->op = strdup(op);
    return e;
}

/* got against the test data's want. fused: got came from optimized and
 * fused kernels (--backend opencl), whose float16/bfloat16 results round
 * once where the reference (and the test data) round after every op: those
 * are held to DESIGN.md's fused-vs-unfused 16-bit tolerance (kf_run_tolerance:
 * fp16 2.5e-3 / 1e-3, bf16 2e-2 / 1e-2); everything else to the ONNX runner's
 * (onnx.backend.test.runner: rtol 1e-3, atol 1e-7, bfloat16 rtol 2^-6). */
static bool compare(const kf_tensor *got, const kf_tensor *want, bool fused, char *why, size_t n) {
    if (got->dtype != want->dtype) {
        snprintf(why, n, "dtype %s, expected %s", kf_dtype_name(got->dtype), kf_dtype_name(want->dtype));
        return false;
    }
    if (got->rank != want->rank || got->numel != want->numel) {
        snprintf(why, n, "shape rank %d numel %lld, expected rank %d numel %lld", got->rank, (long long)got->numel,
                 want->rank, (long long)want->numel);
        return false;
    }
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) {
            snprintf(why, n, "dim %d is %lld, expected %lld", d, (long long)got->dims[d], (long long)want->dims[d]);
            return false;
        }
    if (got->dtype == KF_DT_STRING) {
        if (!kf_tensor_equal(got, want)) {
            snprintf(why, n, "string elements differ");
            return false;
        }
        return true;
    }
    for (int64_t i = 0; i < got->numel; i++) {
        if (!kf_dtype_is_float(got->dtype)) {
            if (kf_get_u64(got, i) != kf_get_u64(want, i)) {
                snprintf(why, n, "element %lld is %lld, expected %lld", (long long)i, (long long)kf_get_i64(got, i),
                         (long long)kf_get_i64(want, i));
                return false;
            }
            continue;
        }
        double g = kf_get_f64(got, i), w = kf_get_f64(want, i), atol = CONFORM_ATOL, rtol = CONFORM_RTOL;
        if (got->dtype == KF_DT_BFLOAT16) rtol = CONFORM_RTOL_BF16;
        if (fused && (got->dtype == KF_DT_FLOAT16 || got->dtype == KF_DT_BFLOAT16)) kf_run_tolerance(got->dtype, &atol, &rtol);
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= atol + rtol * fabs(w);
        if (!ok) {
            snprintf(why, n, "element %lld is %.9g, expected %.9g", (long long)i, g, w);
            return false;
        }
    }
    return true;
}

/* Runs one test folder; returns the result and a reason for fail/skip. */
/* --backend opencl: runs the test set's inputs through kf_run_opencl on a
 * fresh copy of the model (it optimizes the model in place, and the caller
 * keeps the loaded one to credit its ops). */
static kf_status conform_opencl(const char *model_path, const kf_tensor *ins, uint32_t nreal, kf_tensor *outs,
                                conform_state *cs, bool *generated) {
    kf_model *m2;
    KF_TRY(kf_model_load(model_path, &m2));
    kf_run_summary sum;
    kf_status st = kf_run_opencl(m2, ins, (int)nreal, outs, NULL, &sum);
    kf_model_free(m2);
    cs->groups.groups_cl += sum.groups_cl;
    cs->groups.groups_ref += sum.groups_ref;
    if (sum.groups_cl) *generated = true;
    return st;
}

static result conform_one(const char *dir, char *why, size_t whylen, kf_model **mout, conform_state *cs) {
    char path[4096];
    join(path, sizeof path, dir, "model.onnx");
    *mout = NULL;
    kf_model *m;
    kf_status st = kf_model_load(path, &m);
    if (st == KF_ERR_UNSUPPORTED) {
        snprintf(why, whylen, "%s", kf_last_error());
        return R_SKIP;
    }
    if (st) {
        snprintf(why, whylen, "load: %s", kf_last_error());
        return R_FAIL;
    }
    *mout = m;
    const char *unsup = kf_eval_unsupported_reason(m);
    if (unsup) {
        snprintf(why, whylen, "%s", unsup);
        return R_SKIP;
    }
    const kf_graph *g = m->graph;
    kf_id *real = NULL;
    uint32_t nreal = 0;
    if (kf_graph_real_inputs(g, &real, &nreal)) {
        snprintf(why, whylen, "%s", kf_last_error());
        return R_FAIL;
    }
    char model_path[4096];
    memcpy(model_path, path, sizeof model_path);
    bool generated = false;
    int nsets;
    char **sets = list_dir(dir, "test_data_set_", &nsets);
    result r = nsets ? R_PASS : R_SKIP;
    if (!nsets) snprintf(why, whylen, "no test_data_set_* folder");
    for (int s = 0; s < nsets && r == R_PASS; s++) {
        char sdir[4096];
        join(sdir, sizeof sdir, dir, sets[s]);
        kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
        kf_tensor *outs = calloc(g->noutputs + 1, sizeof(kf_tensor));
        st = kfuse_tool_load_inputs(g, real, nreal, sdir, ins);
        if (st) {
            snprintf(why, whylen, "%s: inputs: %s", sets[s], kf_last_error());
            r = (st == KF_ERR_UNSUPPORTED || st == KF_ERR_BAD_MODEL) ? R_SKIP : R_FAIL;
        } else if ((st = cs->opencl ? conform_opencl(model_path, ins, nreal, outs, cs, &generated)
                                    : kf_eval_model(m, ins, (int)nreal, outs, NULL))) {
            snprintf(why, whylen, "%s: %s", sets[s], kf_last_error());
            r = st == KF_ERR_UNSUPPORTED ? R_SKIP : R_FAIL;
        } else {
            for (uint32_t o = 0; o < g->noutputs && r == R_PASS; o++) {
                char fname[32];
                snprintf(fname, sizeof fname, "output_%u.pb", o);
                join(path, sizeof path, sdir, fname);
                kf_tensor want = {0};
                if ((st = kf_onnx_read_tensor_file(path, &want, NULL))) {
                    snprintf(why, whylen, "%s: expected output %u is not a tensor this build reads: %s", sets[s], o,
                             kf_last_error());
                    r = R_SKIP;
                    break;
                }
                if (want.dtype == KF_DT_UINT16 && outs[o].dtype == KF_DT_BFLOAT16) want.dtype = KF_DT_BFLOAT16;
                char d[512];
                if (!compare(&outs[o], &want, cs->opencl, d, sizeof d)) {
                    snprintf(why, whylen, "%s: output '%s': %s", sets[s], g->values[g->outputs[o]].name, d);
                    r = R_FAIL;
                }
                kf_tensor_release(&want);
            }
        }
        for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
        for (uint32_t o = 0; o < g->noutputs; o++) kf_tensor_release(&outs[o]);
        free(ins);
        free(outs);
    }
    free_list(sets, nsets);
    free(real);
    if (generated) cs->dirs_generated++;
    return r;
}

/* Test folders of Debian's ONNX 1.12 data whose data is wrong, each with
 * why. They still run; a failure there is reported as a skip with this
 * reason, and a pass still counts as a pass. */
static const struct {
    const char *name, *reason;
} known_bad[] = {
    {"test_cast_FLOAT_to_BFLOAT16", "known bad data: expected values are truncated, the spec rounds to nearest even"},
    {"test_castlike_FLOAT_to_BFLOAT16", "known bad data: 'like' has rank 1 where the model declares 2; values truncated"},
    {"test_castlike_FLOAT_to_BFLOAT16_expanded", "known bad data: 'like' has rank 1 where the model declares 2; values truncated"},
    {"test_castlike_BFLOAT16_to_FLOAT", "known bad data: 'like' has rank 1 where the model declares 2"},
    {"test_castlike_BFLOAT16_to_FLOAT_expanded", "known bad data: 'like' has rank 1 where the model declares 2"},
};

static void conform_record(conform_state *cs, const char *dir) {
    char why[1024] = "";
    kf_model *m = NULL;
    result r = conform_one(dir, why, sizeof why, &m, cs);
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    for (size_t k = 0; r == R_FAIL && k < sizeof known_bad / sizeof *known_bad; k++)
        if (!strcmp(name, known_bad[k].name)) {
            char got[1024];
            memcpy(got, why, sizeof got);
            snprintf(why, sizeof why, "%s (got: %.500s)", known_bad[k].reason, got);
            r = R_SKIP;
        }
    if (r == R_PASS) cs->pass++;
    else if (r == R_FAIL) cs->fail++;
    else cs->skip++;
    if (r == R_FAIL) printf("FAIL %s: %s\n", name, why);
    else if (r == R_SKIP && cs->verbose) printf("SKIP %s: %s\n", name, why);
    else if (cs->verbose) printf("PASS %s\n", name);
    fflush(stdout);
    if (!m) {
        opstat *e = op_entry(cs, "(load)");
        if (r == R_FAIL) e->fail++;
        else e->skip++;
        return;
    }
    const kf_graph *g = m->graph;
    /* credit every distinct op of the model */
    for (kf_id i = 1; i < g->nnodes; i++) {
        bool seen = false;
        for (kf_id j = 1; j < i && !seen; j++) seen = !strcmp(g->nodes[j].op_type, g->nodes[i].op_type);
        if (seen) continue;
        opstat *e = op_entry(cs, g->nodes[i].op_type);
        if (r == R_PASS) e->pass++;
        else if (r == R_FAIL) e->fail++;
        else {
            e->skip++;
            if (!e->skip_reason) e->skip_reason = strdup(why);
        }
    }
    kf_model_free(m);
}

static int cmp_opstat(const void *a, const void *b) {
    return strcmp(((const opstat *)a)->op, ((const opstat *)b)->op);
}

static int cmd_conform(int argc, char **argv) {
    conform_state cs = {0};
    int ndirs = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--verbose")) cs.verbose = true;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (!strcmp(b, "opencl")) cs.opencl = true;
            else if (strcmp(b, "ref")) {
                fprintf(stderr, "kfuse: backend '%s' is not available in this build (only 'ref', 'opencl')\n", b);
                return EXIT_USAGE;
            }
        } else if (argv[i][0] == '-') {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (cs.opencl && kf_cl_unavailable()) {
        fprintf(stderr, "kfuse: --backend opencl: %s\n", kf_cl_unavailable());
        return EXIT_INPUT;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--backend")) {
            i++; /* its value is no folder */
            continue;
        }
        if (argv[i][0] == '-') continue;
        char path[4096];
        join(path, sizeof path, argv[i], "model.onnx");
        if (is_file(path)) {
            conform_record(&cs, argv[i]);
            ndirs++;
            continue;
        }
        if (!is_dir(argv[i])) {
            fprintf(stderr, "kfuse: '%s' is not a test folder\n", argv[i]);
            return EXIT_INPUT;
        }
        int n;
        char **subs = list_dir(argv[i], "", &n);
        for (int k = 0; k < n; k++) {
            if (subs[k][0] == '.') continue;
            char sub[4096];
            join(sub, sizeof sub, argv[i], subs[k]);
            join(path, sizeof path, sub, "model.onnx");
            if (!is_file(path)) continue;
            conform_record(&cs, sub);
            ndirs++;
        }
        free_list(subs, n);
    }
    if (!ndirs) {
        fprintf(stderr, "kfuse: no test folders found\n");
        return EXIT_USAGE;
    }
    qsort(cs.ops, (size_t)cs.nops, sizeof(opstat), cmp_opstat);
    printf("\n%-28s %6s %6s %6s  %s\n", "op", "pass", "fail", "skip", "first skip reason");
    for (int i = 0; i < cs.nops; i++) {
        opstat *e = &cs.ops[i];
        printf("%-28s %6d %6d %6d  %s\n", e->op, e->pass, e->fail, e->skip, e->skip_reason ? e->skip_reason : "");
        free(e->op);
        free(e->skip_reason);
    }
    free(cs.ops);
    if (cs.opencl)
        printf("\nopencl: %d folders ran generated kernels; groups: %u generated, %u on ref\n", cs.dirs_generated,
               cs.groups.groups_cl, cs.groups.groups_ref);
    printf("\n%d passed, %d failed, %d skipped\n", cs.pass, cs.fail, cs.skip);
    return cs.fail ? EXIT_CHECK : EXIT_OK;
}

/* ---- opt -------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* Monotonic seconds, for the load/optimize/save split of `opt --json`. */
static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmd_opt(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    const char *files[64], *keep[256];
    int nfiles = 0, nkeep = 0;
    bool report = false, json = false;
    kfuse_tool_dims dims = {0};
    kf_opt_options o;
    kf_opt_options_default(&o);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--patterns") && i + 1 < argc && nfiles < 64) files[nfiles++] = argv[++i];
        else if (!strcmp(argv[i], "--no-builtin")) o.no_builtin = true;
        else if (!strcmp(argv[i], "--keep") && i + 1 < argc && nkeep < 256) keep[nkeep++] = argv[++i];
        else if (!strcmp(argv[i], "--no-raise")) o.no_raise = true;
        else if (!strcmp(argv[i], "--opset") && i + 1 < argc) {
            char *end;
            long long v = strtoll(argv[++i], &end, 10);
            if (*end || v < 1 || v > KF_RAISE_MAX_OPSET) {
                fprintf(stderr, "kfuse opt: --opset takes an opset from 1 to %d, not '%s'\n", KF_RAISE_MAX_OPSET,
                        argv[i]);
                return EXIT_USAGE;
            }
            o.opset = v;
        } else if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            if (!kfuse_tool_dim_arg(&dims, argv[++i])) return EXIT_USAGE;
        }
        else if (!strcmp(argv[i], "--report")) report = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!model || !out || (o.no_raise && o.opset)) {
        if (o.no_raise && o.opset) fprintf(stderr, "kfuse opt: --no-raise and --opset exclude each other\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    o.pattern_files = files;
    o.npattern_files = nfiles;
    o.keep = keep;
    o.nkeep = nkeep;
    /* the model is saved next: large merged weights go from their parts
     * straight into the file (KFUSE_DEFER_CONCAT=0 assembles them first) */
    const char *defer = getenv("KFUSE_DEFER_CONCAT");
    if (!(defer && defer[0] == '0')) o.defer_concat_bytes = KF_CSE_MAX_INIT_BYTES + 1;
    kf_model *m;
    double t0 = seconds_now();
    kf_status st = kfuse_tool_load(model, &m);
    if (st) return fail_status(st);
    if ((st = kfuse_tool_apply_dims(m, &dims, true))) {
        kf_model_free(m);
        return fail_status(st);
    }
    double t1 = seconds_now();
    kf_opt_result res;
    st = kf_optimize(m, &o, &res);
    double t2 = seconds_now();
    if (!st) st = kf_model_save(m, out);
    double t3 = seconds_now();
    if (st) {
        kf_rules_free(&res.rules);
        kf_model_free(m);
        return fail_status(st);
    }
    if (json) {
        printf("{\"nodes_before\": %u, \"nodes_after\": %u, \"rewrites\": %llu, \"rounds\": %d, \"converged\": %s, "
               "\"opset_before\": %lld, \"opset_after\": %lld, \"opset_raise_declined\": ",
               res.nodes_before, res.nodes_after, (unsigned long long)res.rewrites, res.rounds,
               res.converged ? "true" : "false", (long long)res.opset_before, (long long)res.opset_after);
        if (res.raise_declined[0]) json_str(stdout, res.raise_declined);
        else printf("null");
        printf(", \"rules\": {");
        bool first = true;
        for (uint32_t i = 0; i < res.rules.n; i++) {
            const kf_rule *r = res.rules.rules[i];
            if (!r->hits) continue;
            printf("%s", first ? "" : ", ");
            json_str(stdout, r->name);
            printf(": %llu", (unsigned long long)r->hits);
            first = false;
        }
        printf("}, \"near_misses\": [");
        first = true;
        for (uint32_t i = 0; i < res.rules.n; i++) {
            const kf_rule *r = res.rules.rules[i];
            for (int k = 0; k < r->nnear; k++) {
                printf("%s{\"rule\": ", first ? "" : ", ");
                json_str(stdout, r->name);
                printf(", \"node\": ");
                json_str(stdout, r->near[k].node);
                printf(", \"reason\": ");
                json_str(stdout, r->near[k].reason);
                printf("}");
                first = false;
            }
        }
        printf("], \"time_load_s\": %.6f, \"time_opt_s\": %.6f, \"time_save_s\": %.6f}\n", t1 - t0, t2 - t1,
               t3 - t2);
    } else {
        printf("%s: %u nodes -> %u nodes (%llu rewrites), written to %s\n", model, res.nodes_before, res.nodes_after,
               (unsigned long long)res.rewrites, out);
        if (res.opset_after != res.opset_before)
            printf("opset raised %lld -> %lld %s\n", (long long)res.opset_before, (long long)res.opset_after,
                   o.opset ? "as asked" : "for rules that need it");
        if (res.raise_declined[0]) printf("%s\n", res.raise_declined);
    }
    if (report) {
        FILE *f = json ? stderr : stdout;
        fprintf(f, "\n%-32s %8s %8s %8s\n", "rule", "attempts", "hits", "misses");
        for (uint32_t i = 0; i < res.rules.n; i++) {
            const kf_rule *r = res.rules.rules[i];
            if (!r->attempts) continue;
            fprintf(f, "%-32s %8llu %8llu %8llu\n", r->name, (unsigned long long)r->attempts,
                    (unsigned long long)r->hits, (unsigned long long)r->misses);
        }
        bool any = false;
        for (uint32_t i = 0; i < res.rules.n; i++) {
            const kf_rule *r = res.rules.rules[i];
            for (int k = 0; k < r->nnear; k++) {
                if (!any) fprintf(f, "\nnear misses (the root matched, something else did not):\n");
                any = true;
                fprintf(f, "  %s at '%s': %s\n", r->name, r->near[k].node, r->near[k].reason);
            }
        }
    }
    kf_rules_free(&res.rules);
    kf_model_free(m);
    return EXIT_OK;
}

/* ---- patterns ---------------------------------------------------------------------- */

static int cmd_patterns(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "check")) {
        usage(stderr);
        return EXIT_USAGE;
    }
    kf_ruleset rs = {0};
    uint64_t seed = 0;
    kf_status st = KF_OK;
    int nfiles = 0;
    for (int i = 1; i < argc && !st; i++) {
        if (!strcmp(argv[i], "--builtin")) st = kf_rules_add_builtin(&rs), nfiles++;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (argv[i][0] == '-') {
            kf_rules_free(&rs);
            usage(stderr);
            return EXIT_USAGE;
        } else {
            st = kf_rules_load_file(&rs, argv[i]);
            nfiles++;
        }
    }
    if (st) {
        kf_rules_free(&rs);
        return fail_status(st);
    }
    if (!nfiles) {
        usage(stderr);
        return EXIT_USAGE;
    }
    kf_check_result res;
    st = kf_rules_check(&rs, seed, stdout, &res);
    kf_rules_free(&rs);
    if (st) return fail_status(st);
    printf("\n%d passed, %d failed\n", res.passed, res.failed);
    return res.failed ? EXIT_CHECK : EXIT_OK;
}

int kfuse_cmd_fuse(int argc, char **argv); /* cmd_fuse.c */
int kfuse_cmd_cache(int argc, char **argv); /* cmd_cache.c */
int kfuse_cmd_compile(int argc, char **argv); /* cmd_compile.c */
int kfuse_cmd_bench(int argc, char **argv);   /* cmd_bench.c */
int kfuse_cmd_quantize(int argc, char **argv); /* cmd_quantize.c */

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *verb = argv[1];
    if (!strcmp(verb, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(verb, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(verb, "conform")) return cmd_conform(argc - 2, argv + 2);
    if (!strcmp(verb, "opt")) return cmd_opt(argc - 2, argv + 2);
    if (!strcmp(verb, "fuse")) return kfuse_cmd_fuse(argc - 2, argv + 2);
    if (!strcmp(verb, "patterns")) return cmd_patterns(argc - 2, argv + 2);
    if (!strcmp(verb, "cache")) return kfuse_cmd_cache(argc - 2, argv + 2);
    if (!strcmp(verb, "compile")) return kfuse_cmd_compile(argc - 2, argv + 2);
    if (!strcmp(verb, "bench")) return kfuse_cmd_bench(argc - 2, argv + 2);
    if (!strcmp(verb, "quantize")) return kfuse_cmd_quantize(argc - 2, argv + 2);
    if (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(verb, "--version")) {
        printf("kfuse %s\n", kf_version());
        return EXIT_OK;
    }
    fprintf(stderr, "kfuse: unknown verb '%s'\n", verb);
    usage(stderr);
    return EXIT_USAGE;
}
