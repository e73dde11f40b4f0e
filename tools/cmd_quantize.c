/*
 * cmd_quantize.c: `kfuse quantize M.onnx -o Q.onnx`: post-training static
 * quantization (fusion/quantize.c) calibrated on sample folders or random
 * inputs, the QDQ model written as standard ONNX, and the signal-to-noise
 * ratio of the quantized model against the float one on the same samples
 * (one line always; per layer with --report).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kf_quantize.h"
#include "kf_ref.h"
#include "kfuse_tool.h"

enum { EXIT_OK = 0, EXIT_USAGE = 2 };

int kfuse_cmd_quantize(int argc, char **argv);

/* --exclude and --include entries at most */
#define MAX_NAMES 256
/* random calibration samples when neither --calib nor --random is given */
#define DEFAULT_RANDOM 16
/* The float model's outputs kept from calibration for the comparison (so
 * the float model runs once per sample, not twice) up to this many bytes;
 * past it the comparison runs the float model again. */
#define KEEP_OUTPUTS_MAX_BYTES ((int64_t)1 << 30)

static void quantize_usage(FILE *f) {
    fprintf(f,
            "usage: kfuse quantize M.onnx -o Q.onnx [--calib DIR | --random N] [--method minmax|percentile|entropy]\n"
            "                      [--percentile P] [--per-channel] [--type int8|fp8] [--exclude OP|NODE]...\n"
            "                      [--include OP]... [--report] [--seed S] [--dim NAME=N]...\n"
            "  calibrates on DIR (one sample folder of input_N.pb / NAME.npy files, or folders of them)\n"
            "  or on N random input sets (default %d, seeds S, S+1, ...); writes QuantizeLinear/\n"
            "  DequantizeLinear ONNX (int8: int8 symmetric weights, uint8 asymmetric activations;\n"
            "  fp8: float8e4m3fn, scale only). Conv, MatMul and Gemm are quantized, --include adds\n"
            "  Add, Mul, Concat, MaxPool, AveragePool, GlobalAveragePool; --exclude keeps an op type\n"
            "  or a node in float. Method default percentile (P = 99.999).\n",
            DEFAULT_RANDOM);
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Whether folder dir holds input files for g: input_*.pb, or NAME.npy for
 * a real input NAME. */
static bool holds_inputs(const kf_graph *g, const kf_id *real, uint32_t nreal, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (!strncmp(e->d_name, "input_", 6) && n > 3 && !strcmp(e->d_name + n - 3, ".pb")) found = true;
        for (uint32_t i = 0; !found && i < nreal; i++) {
            const char *name = g->values[real[i]].name;
            size_t k = strlen(name);
            found = n == k + 4 && !strncmp(e->d_name, name, k) && !strcmp(e->d_name + k, ".npy");
        }
    }
    closedir(d);
    return found;
}

/* The calibration sample folders of --calib DIR: DIR itself when it holds
 * input files, else its sub-folders (sorted by name). */
static kf_status sample_dirs(const kf_graph *g, const kf_id *real, uint32_t nreal, const char *dir, char ***out,
                             int *n) {
    *out = NULL;
    *n = 0;
    if (!is_dir(dir)) return kf_fail(KF_ERR_IO, "--calib '%s' is not a folder", dir);
    char **list = NULL;
    int count = 0;
    if (holds_inputs(g, real, nreal, dir)) {
        list = malloc(sizeof(char *));
        if (!list || !(list[0] = strdup(dir))) {
            free(list);
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
        *out = list;
        *n = 1;
        return KF_OK;
    }
    DIR *d = opendir(dir);
    if (!d) return kf_fail(KF_ERR_IO, "cannot read folder '%s'", dir);
    struct dirent *e;
    kf_status st = KF_OK;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(path, len, "%s/%s", dir, e->d_name);
        if (!is_dir(path)) {
            free(path);
            continue;
        }
        char **nl = realloc(list, sizeof(char *) * (size_t)(count + 1));
        if (!nl) {
            free(path);
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            break;
        }
        list = nl;
        list[count++] = path;
    }
    closedir(d);
    if (!st && !count)
        st = kf_fail(KF_ERR_INVALID_ARG,
                     "--calib '%s' holds no sample: neither input_N.pb or NAME.npy files nor folders of them", dir);
    if (st) {
        for (int i = 0; i < count; i++) free(list[i]);
        free(list);
        return st;
    }
    qsort(list, (size_t)count, sizeof(char *), cmp_str);
    *out = list;
    *n = count;
    return KF_OK;
}

typedef struct samples {
    const kf_model *m;
    kf_id *real;
    uint32_t nreal;
    char **dirs; /* --calib; NULL for random */
    int n;
    kf_type *types; /* random */
    uint64_t seed;
} samples;

/* Fills ins (nreal tensors) with sample i. */
static kf_status sample_get(const samples *s, int i, kf_tensor *ins) {
    if (!s->dirs) return kfuse_tool_inputs(s->m, s->types, s->nreal, s->seed + (uint64_t)i, ins);
    kf_status st = kfuse_tool_load_inputs(s->m->graph, s->real, s->nreal, s->dirs[i], ins);
    if (st) kf_fail_context(st, "calibration sample '%s'", s->dirs[i]);
    return st;
}

static void release_ins(kf_tensor *ins, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) kf_tensor_release(&ins[i]);
}

static void print_db(FILE *f, double db) {
    if (isinf(db)) fprintf(f, "%8s", "inf");
    else if (isnan(db)) fprintf(f, "%8s", "-");
    else fprintf(f, "%8.2f", db);
}

int kfuse_cmd_quantize(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *calib = NULL;
    const char *exclude[MAX_NAMES], *include[MAX_NAMES];
    int nexclude = 0, ninclude = 0, nrandom = -1;
    bool report = false;
    uint64_t seed = 1;
    kfuse_tool_dims dims = {0};
    kf_quant_options o;
    kf_quant_options_default(&o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-o") && v) out = v, i++;
        else if (!strcmp(a, "--calib") && v) calib = v, i++;
        else if (!strcmp(a, "--random") && v) {
            char *end;
            long n = strtol(v, &end, 10);
            ok = *v && !*end && n > 0 && n <= 1000000;
            nrandom = (int)n;
            i++;
        } else if (!strcmp(a, "--method") && v) ok = kf_quant_method_parse(v, &o.method), i++;
        else if (!strcmp(a, "--percentile") && v) {
            char *end;
            o.percentile = strtod(v, &end);
            ok = *v && !*end && o.percentile > 50 && o.percentile <= 100;
            i++;
        } else if (!strcmp(a, "--per-channel")) o.per_channel = true;
        else if (!strcmp(a, "--type") && v) {
            ok = !strcmp(v, "int8") || !strcmp(v, "fp8");
            o.type = !strcmp(v, "fp8") ? KF_QUANT_FP8 : KF_QUANT_INT8;
            i++;
        } else if (!strcmp(a, "--exclude") && v && nexclude < MAX_NAMES) exclude[nexclude++] = v, i++;
        else if (!strcmp(a, "--include") && v && ninclude < MAX_NAMES) {
            ok = kf_quant_extra_op(v);
            include[ninclude++] = v;
            i++;
        } else if (!strcmp(a, "--report")) report = true;
        else if (!strcmp(a, "--seed") && v) seed = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--dim") && v) ok = kfuse_tool_dim_arg(&dims, argv[++i]);
        else if (a[0] != '-' && !model) model = a;
        else ok = false;
        if (!ok) {
            fprintf(stderr, "kfuse: quantize: bad argument '%s'%s%s\n", a, v && a[0] == '-' ? " " : "",
                    v && a[0] == '-' ? v : "");
            quantize_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!model || !out || (calib && nrandom > 0)) {
        if (calib && nrandom > 0) fprintf(stderr, "kfuse: quantize: --calib and --random exclude each other\n");
        quantize_usage(stderr);
        return EXIT_USAGE;
    }
    if (!calib && nrandom < 0) nrandom = DEFAULT_RANDOM;
    o.exclude = exclude;
    o.nexclude = nexclude;
    o.include = include;
    o.ninclude = ninclude;

    kf_model *m = NULL, *qm = NULL;
    kf_quantizer *q = NULL;
    kf_tensor *ins = NULL;
    samples s = {0};
    kf_quant_report r = {0};
    kf_status st = kfuse_tool_load(model, &m);
    if (!st) st = kfuse_tool_apply_dims(m, &dims, false);
    if (!st) st = kf_quant_new(m, &o, &q);
    if (q && kf_quant_warnings(q)[0]) fprintf(stderr, "kfuse: quantize: warning: %s", kf_quant_warnings(q));
    if (!st) {
        s.m = m;
        s.seed = seed;
        st = kf_graph_real_inputs(m->graph, &s.real, &s.nreal);
    }
    if (!st && calib) st = sample_dirs(m->graph, s.real, s.nreal, calib, &s.dirs, &s.n);
    else if (!st) {
        uint32_t nt;
        s.n = nrandom;
        st = kfuse_tool_types(m, &dims, &s.types, &nt);
    }
    uint32_t nout = m ? m->graph->noutputs : 0;
    kf_tensor **kept = NULL; /* per sample: the float outputs, or NULL */
    int64_t kept_bytes = 0;
    if (!st && !(ins = calloc(s.nreal + 1, sizeof(kf_tensor)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st && !(kept = calloc((size_t)s.n + 1, sizeof(kf_tensor *)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < s.n; i++) {
        fprintf(stderr, "kfuse: quantize: calibrating sample %d/%d\n", i + 1, s.n);
        if (!report && kept_bytes < KEEP_OUTPUTS_MAX_BYTES) kept[i] = calloc(nout + 1, sizeof(kf_tensor));
        if (!(st = sample_get(&s, i, ins))) {
            st = kf_quant_observe(q, ins, (int)s.nreal, kept[i]);
            if (st && s.dirs) kf_fail_context(st, "calibration sample '%s'", s.dirs[i]);
        }
        for (uint32_t o = 0; !st && kept[i] && o < nout; o++)
            kept_bytes += kept[i][o].numel * (int64_t)kf_dtype_size(kept[i][o].dtype);
        release_ins(ins, s.nreal);
    }
    size_t wlen = q ? strlen(kf_quant_warnings(q)) : 0;
    if (!st) st = kf_quant_finish(q);
    if (q && strlen(kf_quant_warnings(q)) > wlen)
        fprintf(stderr, "kfuse: quantize: warning: %s", kf_quant_warnings(q) + wlen);
    if (!st) st = kf_quant_apply(q, &qm);
    if (!st) st = kf_model_save(qm, out);
    for (int i = 0; !st && i < s.n; i++) {
        fprintf(stderr, "kfuse: quantize: comparing with float, sample %d/%d\n", i + 1, s.n);
        if (!(st = sample_get(&s, i, ins))) st = kf_quant_report_add(q, m, qm, ins, (int)s.nreal, kept[i], report, &r);
        release_ins(ins, s.nreal);
    }
    for (int i = 0; kept && i < s.n; i++) {
        for (uint32_t o = 0; kept[i] && o < nout; o++) kf_tensor_release(&kept[i][o]);
        free(kept[i]);
    }
    free(kept);
    int rc = EXIT_OK;
    if (st) rc = kfuse_tool_fail(st);
    else {
        kf_quant_report_finish(&r);
        uint32_t nn, na, nw = 0, nlive = 0, nbase = 0;
        const kf_quant_node *qn = kf_quant_nodes(q, &nn);
        const kf_quant_act *qa = kf_quant_acts(q, &na);
        for (uint32_t i = 0; i < nn; i++)
            for (int k = 0; k < 3; k++) nw += qn[i].weight[k];
        for (uint32_t i = 0; i < na; i++) nlive += qa[i].seen;
        for (kf_id i = 1; i < m->graph->nnodes; i++) {
            const kf_node *n = &m->graph->nodes[i];
            nbase += !n->dead && (!strcmp(n->op_type, "Conv") || !strcmp(n->op_type, "MatMul") ||
                                  !strcmp(n->op_type, "Gemm"));
        }
        uint32_t qbase = 0;
        for (uint32_t i = 0; i < nn; i++)
            qbase += !strcmp(qn[i].op_type, "Conv") || !strcmp(qn[i].op_type, "MatMul") || !strcmp(qn[i].op_type, "Gemm");
        if (report) {
            printf("%-8s %-18s %s\n", "SQNR dB", "op", "layer (output against float, worst first)");
            for (uint32_t i = 0; i < r.nlayers; i++) {
                print_db(stdout, r.layers[i].db);
                printf(" %-18s %s\n", r.layers[i].op_type, r.layers[i].name);
            }
            printf("\n%-8s %s\n", "SQNR dB", "model output");
            for (uint32_t i = 0; i < r.noutputs; i++) {
                print_db(stdout, r.outputs[i].db);
                printf(" %s\n", r.outputs[i].name);
            }
            printf("\n");
        }
        char method[64];
        if (o.method == KF_QUANT_PERCENTILE) snprintf(method, sizeof method, "percentile %g", o.percentile);
        else snprintf(method, sizeof method, "%s", kf_quant_method_name(o.method));
        printf("kfuse: quantize: %s -> %s: %u of %u Conv/MatMul/Gemm nodes and %u other nodes quantized (%s, %s, "
               "weights %s), %u values with Q/DQ, %u weights; output SQNR ",
               model, out, qbase, nbase, nn - qbase,
               o.type == KF_QUANT_FP8 ? "float8e4m3fn" : "int8 weights, uint8 activations", method,
               o.per_channel ? "per channel" : "per tensor", nlive, nw);
        if (isinf(r.total.db)) printf("inf");
        else printf("%.2f", r.total.db);
        printf(" dB over %u samples\n", r.samples);
    }
    kf_quant_report_release(&r);
    if (s.dirs)
        for (int i = 0; i < s.n; i++) free(s.dirs[i]);
    free(s.dirs);
    free(s.types);
    free(s.real);
    free(ins);
    kf_quant_free(q);
    kf_model_free(qm);
    kf_model_free(m);
    return rc;
}
