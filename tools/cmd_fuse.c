/*
 * cmd_fuse.c: the `kfuse fuse` verb. Loads a model, runs the optimizer
 * (`kfuse opt`'s rewrites) unless --no-opt, plans fusion, writes the groups
 * as ai.kfuse model-local functions into OUT.onnx, and prints the plan as a
 * summary line, --json, --report and --dot. Graph logic lives in the library
 * (fusion/fuse_export.c); this file parses arguments and prints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kf_codegen.h"
#include "kf_cost.h"
#include "kf_exec.h"
#include "kf_precision.h"
#include "kf_fuse.h"
#include "kf_memplan.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kfuse_tool.h"

int kfuse_cmd_fuse(int argc, char **argv);

enum { EXIT_OK = 0, EXIT_USAGE = 2, EXIT_INPUT = 3 };

static void fuse_usage(FILE *f) {
    fprintf(f, "usage: kfuse fuse M.onnx -o OUT.onnx [--report] [--json] [--dot F] [--emit DIR] [--no-opt] [--dim NAME=N]...\n"
               "                 [--target NAME|FILE] [--precision P] [--legal-only] [--plan-dim NAME=N]...\n"
               "  --dim     fix a symbolic dimension (batch, sequence) so byte figures are known\n"
               "  --plan-dim  plan (legality, cost-model decisions, figures) as if NAME were N, keeping it\n"
               "            symbolic in the file: the groups a static copy at that size gets\n"
               "  --target  the device the plan is for: h200 (default; KFUSE_TARGET), h100, a100, test, a .target\n"
               "            file, or none (merge whatever is legal, no estimates); merges happen only when the\n"
               "            cost model estimates them faster, and each group gets an estimated time (est_us)\n"
               "  --precision  fp32 (strict FMA) or tf32 (the libraries' tensor cores) for float32 math in the\n"
               "            estimates; fp16/bf16 first convert the model's float32 values (as a compiled plan\n"
               "            at that precision does), so the plan and the file are the 16-bit ones; int8 makes\n"
               "            the integer anchors of a QDQ model, int8-fp16 those and fp16 for the rest, fp8\n"
               "            keeps the float8 weights of float8 products and of the convolutions where the float8\n"
               "            tile pays (float8 tensor cores), and fp16 for the rest\n"
               "  --legal-only  make every legal merge (the bytes-only planner) and estimate that plan\n"
               "  --report  table of groups and boundary reasons (stderr with --json)\n"
               "  --json    one JSON object on stdout\n"
               "  --dot F   Graphviz picture, one cluster per group (F.svg too when dot is installed)\n"
               "  --emit DIR  write each generated kernel as DIR/group_N.cl and DIR/group_N.cu, and each\n"
               "            horizontal launch of several groups as DIR/launch_L.cl and .cu (groups\n"
               "            codegen does not handle yet are listed with the reason); with --plan-dim,\n"
               "            the kernels a run at those sizes compiles\n"
               "  --no-opt  plan the model as loaded, without kfuse opt's rewrites\n");
}

static int fail(kf_status st) {
    fprintf(stderr, "kfuse: %s: %s\n", kf_status_name(st), kf_last_error());
    return EXIT_INPUT;
}

/* The plan of m, from the planner (KFUSE_DISABLE_FUSION, KFUSE_FUEL and
 * KFUSE_TRACE apply through its defaults), as a copy that does not read the
 * model once kf_fuse_apply has changed it (see kf_fuse_plan_copy). */
static kf_status make_plan(kf_model *m, const char *target, int math, bool legal_only, const kfuse_tool_dims *at,
                           kf_plan **p) {
    kf_plan_options o;
    kf_plan_options_default(&o);
    if (target) o.target = target;
    else if (!o.target) o.target = KF_PLAN_DEFAULT_TARGET;
    o.math = math;
    o.legal_only = legal_only;
    kf_plan *built;
    KF_TRY(at->n ? kf_plan_build_at(m, &o, at->names, at->values, at->n, &built) : kf_plan_build(m, &o, &built));
    kf_status st = kf_fuse_plan_copy(m, built, p);
    kf_plan_free(built);
    return st;
}
static void free_plan(kf_plan *p) { kf_fuse_simple_plan_free(p); }

static kf_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return kf_fail(KF_ERR_IO, "cannot write %s", path);
    bool ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? KF_OK : kf_fail(KF_ERR_IO, "cannot write %s", path);
}

/* Writes k as DIR/NAME.cl and DIR/NAME.cu, each self-contained. */
static kf_status write_kernel(const char *dir, const char *name, const kf_cg_kernel *k) {
    static const struct { kf_cg_target t; const char *ext; } targets[] = {{KF_CG_OPENCL, "cl"}, {KF_CG_CUDA, "cu"}};
    kf_status st = KF_OK;
    for (int t = 0; t < 2 && !st; t++) {
        char path[4096], *src = NULL;
        snprintf(path, sizeof path, "%s/%s.%s", dir, name, targets[t].ext);
        st = kf_cg_source(k, targets[t].t, &src);
        if (!st) st = write_text(path, src);
        kf_free(src);
    }
    return st;
}

/* --emit DIR: every group codegen supports, as a self-contained OpenCL and
 * CUDA source (prelude + the shared body), DIR/group_N.{cl,cu}; the others
 * named with their reason on stderr. Each launch of the plan that batches
 * two or more generated groups (horizontal launch) is also written as the
 * one kernel that runs them, DIR/launch_L.{cl,cu}. Runs before
 * kf_fuse_apply changes the model. */
static kf_status emit_kernels(const char *dir, const kf_model *m, const kf_plan *p) {
    uint32_t written = 0, declined = 0, symbolic = 0, batches = 0;
    if (mkdir(dir, 0777) && errno != EEXIST)
        return kf_fail(KF_ERR_IO, "cannot create the kernel folder %s: %s", dir, strerror(errno));
    bool *gen = kf_calloc((size_t)p->ngroups + 1, sizeof *gen);
    if (!gen) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = KF_OK;
    for (uint32_t gi = 0; gi < p->ngroups && !st; gi++) {
        char why[512], name[32];
        if (p->groups[gi].kind == KF_GROUP_CONST) continue;
        if (kf_cg_unsupported(m, p, gi, why, sizeof why)) {
            fprintf(stderr, "kfuse: group %u not generated: %s\n", gi, why);
            declined++;
            symbolic += strstr(why, "symbolic or unknown shape") != NULL;
            continue;
        }
        kf_cg_kernel k;
        if ((st = kf_cg_group(m, p, gi, &k))) break;
        snprintf(name, sizeof name, "group_%u", gi);
        st = write_kernel(dir, name, &k);
        kf_cg_kernel_release(&k);
        gen[gi] = true;
        written++;
    }
    for (uint32_t l = 0; l < p->launches && !st; l++) {
        uint32_t members[KF_PLAN_MAX_BATCH], n = 0;
        for (uint32_t gi = 0; gi < p->ngroups && n < KF_PLAN_MAX_BATCH; gi++) {
            const kf_group *G = &p->groups[gi];
            if (gen[gi] && G->launch == l && (G->kind == KF_GROUP_ELEMWISE || G->kind == KF_GROUP_REDUCTION))
                members[n++] = gi;
        }
        if (n < 2) continue;
        kf_cg_kernel k;
        st = kf_cg_batch(m, p, members, n, &k);
        if (st == KF_ERR_UNSUPPORTED) {
            fprintf(stderr, "kfuse: launch %u not batched: %s\n", l, kf_last_error());
            kf_clear_error();
            st = KF_OK;
            continue;
        }
        if (st) break;
        char name[32];
        snprintf(name, sizeof name, "launch_%u", l);
        st = write_kernel(dir, name, &k);
        kf_cg_kernel_release(&k);
        batches++;
    }
    kf_free(gen);
    if (st) return st;
    fprintf(stderr, "kfuse: %u kernels written to %s (.cl and .cu), %u batched launches, %u groups not generated\n",
            written, dir, batches, declined);
    if (symbolic)
        fprintf(stderr, "kfuse: %u of them have symbolic dims; fix them with --dim NAME=N (see kfuse info) to "
                        "generate those kernels\n", symbolic);
    return KF_OK;
}

/* What `fuse` does to a model before its plan is written: the choices of
 * the command line. */
typedef struct fuse_flow {
    bool opt;
    kf_precision prec;
    bool legal_only;
    const char *target;
} fuse_flow;

/* --dim fixed, optimized, the precision passes, planned (at the --plan-dim
 * sizes when at->n): the model and plan `fuse` writes. sum gets the node counts. */
static kf_status prepare(kf_model *m, const fuse_flow *fl, const kfuse_tool_dims *dims, const kfuse_tool_dims *at,
                         kf_fuse_summary *sum, kf_plan **p) {
    KF_TRY(kfuse_tool_apply_dims(m, dims, true));
    sum->nodes_before = kf_graph_live_nodes(m->graph);
    if (fl->opt) {
        kf_opt_options o;
        kf_opt_options_default(&o);
        o.keep_quantized = kf_precision_keeps_quantized(fl->prec);
        kf_opt_result res;
        kf_status st = kf_optimize(m, &o, &res);
        kf_rules_free(&res.rules);
        KF_TRY(st);
    } else {
        KF_TRY(kf_infer_shapes(m)); /* the cost model reads shapes */
    }
    KF_TRY(kf_precision_passes(m, fl->prec, 0, NULL));
    sum->nodes_after = kf_graph_live_nodes(m->graph);
    return make_plan(m, fl->target, fl->prec == KF_PRECISION_TF32 ? KF_MATH_TF32 : KF_MATH_FP32, fl->legal_only, at, p);
}

/* --emit with --plan-dim: the kernels a run at the --plan-dim sizes compiles
 * (the executor specialises a symbolic model to each input shape and plans
 * it again), from a second copy of the model with those dims fixed. */
static kf_status emit_at(const char *dir, const char *path, const fuse_flow *fl, const kfuse_tool_dims *dims,
                         const kfuse_tool_dims *at) {
    kfuse_tool_dims all = *dims;
    for (int i = 0; i < at->n; i++) {
        if (all.n == KFUSE_TOOL_MAX_DIMS) return kf_fail(KF_ERR_INVALID_ARG, "too many --dim and --plan-dim");
        all.names[all.n] = at->names[i];
        all.values[all.n++] = at->values[i];
    }
    kf_model *m;
    KF_TRY(kfuse_tool_load(path, &m));
    kf_fuse_summary sum = {0};
    kf_plan *p = NULL;
    kf_status st = prepare(m, fl, &all, &(kfuse_tool_dims){0}, &sum, &p);
    if (!st) {
        fprintf(stderr, "kfuse: --emit: the kernels of a run at the --plan-dim sizes (their dims fixed)\n");
        st = emit_kernels(dir, m, p);
    }
    if (p) free_plan(p);
    kf_model_free(m);
    return st;
}

int kfuse_cmd_fuse(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *dot = NULL, *emit = NULL, *target = NULL;
    bool report = false, json = false, opt = true, legal_only = false;
    kf_precision prec = KF_PRECISION_FP32; /* the passes before planning: kf_precision_passes */
    kfuse_tool_dims dims = {0}, plan_at = {0};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            if (!kfuse_tool_dim_arg(&dims, argv[++i])) return EXIT_USAGE;
        }
        else if (!strcmp(argv[i], "--plan-dim") && i + 1 < argc) {
            if (!kfuse_tool_dim_arg(&plan_at, argv[++i])) return EXIT_USAGE;
        }
        else if (!strcmp(argv[i], "--dot") && i + 1 < argc) dot = argv[++i];
        else if (!strcmp(argv[i], "--emit") && i + 1 < argc) emit = argv[++i];
        else if (!strcmp(argv[i], "--report")) report = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--no-opt")) opt = false;
        else if (!strcmp(argv[i], "--target") && i + 1 < argc) target = argv[++i];
        else if (!strcmp(argv[i], "--legal-only")) legal_only = true;
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc && kf_precision_parse(argv[i + 1], &prec)) i++;
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            fuse_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!model || !out) {
        fuse_usage(stderr);
        return EXIT_USAGE;
    }
    fuse_flow fl = {opt, prec, legal_only, target};
    kf_model *m;
    kf_status st = kfuse_tool_load(model, &m);
    if (st) return fail(st);
    kf_fuse_summary sum = {0};
    kf_plan *p = NULL;
    if ((st = prepare(m, &fl, &dims, &plan_at, &sum, &p))) {
        kf_model_free(m);
        return fail(st);
    }
    kf_memplan mp; /* the arena figures; unknown (-1) while symbolic dims are not fixed with --dim */
    sum.arena_bytes = sum.arena_lower_bound = -1;
    if (!(st = kf_memplan_build(m, p, KF_MEMPLAN_ALIGN, &mp))) {
        sum.arena_bytes = mp.arena_bytes;
        sum.arena_lower_bound = mp.live_lower_bound;
        kf_memplan_release(&mp);
    } else if (st == KF_ERR_SHAPE) {
        st = KF_OK;
    }
    bool svg = false;
    if (emit && !st) st = plan_at.n ? emit_at(emit, model, &fl, &dims, &plan_at) : emit_kernels(emit, m, p);
    if (dot && !st) st = kf_fuse_write_dot(dot, m, p, &svg);
    kf_fuse_stats fs = {0};
    if (!st) st = kf_fuse_apply(m, p, &fs);
    if (!st) st = kf_model_save(m, out);
    if (st) {
        free_plan(p);
        kf_model_free(m);
        return fail(st);
    }
    sum.functions = fs.functions;
    if (json) {
        kf_fuse_write_json(stdout, m, p, &sum);
    } else {
        printf("%s: %u nodes -> %u after opt -> %u kernel groups, %u launches; %u functions (ai.kfuse), %u nodes "
               "in %s\n",
               model, sum.nodes_before, sum.nodes_after, p->ngroups, p->launches, fs.functions, fs.nodes_after, out);
        uint32_t rowred = 0, b2b = 0, views = 0;
        for (uint32_t gi = 0; gi < p->ngroups; gi++) {
            rowred += p->groups[gi].kind == KF_GROUP_ANCHOR && p->groups[gi].reduction;
            b2b += p->groups[gi].anchor2 != 0;
            views += p->groups[gi].view;
        }
        if (rowred || b2b || views)
            printf("anchor groups with a row reduction: %u; back-to-back anchors: %u; views (reshapes, no kernel): %u\n",
                   rowred, b2b, views);
        if (*p->target)
            printf("estimated time on %s: %.1f us (cost model estimate); %u legal merges refused as slower\n", p->target,
                   p->est_us, p->cost_refusals);
        if (*p->target && !report) kf_plan_write_unsized(stdout, p); /* --report prints it with the estimate */
        if (dot && svg) printf("picture: %s and %s.svg\n", dot, dot);
        else if (dot) printf("picture: %s (no svg: dot is not installed)\n", dot);
    }
    if (report) {
        kf_fuse_write_report(json ? stderr : stdout, m, p);
        if (sum.arena_bytes < 0)
            fprintf(json ? stderr : stdout, "arena: unknown (symbolic dimensions; fix them with --dim)\n");
        else
            fprintf(json ? stderr : stdout, "arena: %lld bytes for intermediates (live lower bound %lld, ratio %.3f)\n",
                    (long long)sum.arena_bytes, (long long)sum.arena_lower_bound,
                    sum.arena_lower_bound ? (double)sum.arena_bytes / (double)sum.arena_lower_bound : 1.0);
    }
    free_plan(p);
    kf_model_free(m);
    return EXIT_OK;
}
