/*
 * randgraph_main.c: kfuse_randgraph, the long-run driver of the random-graph
 * differential test (tests/randgraph.h). Graph i of a run has seed S+i, so
 * any graph is reproduced with `kfuse_randgraph --seed S+i --count 1 --print`.
 * Exit status: 0 when every graph agreed on every path, 1 on a mismatch,
 * 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kf_kernels.h"
#include "randgraph.h"

static int usage(void) {
    fprintf(stderr,
            "usage: kfuse_randgraph [--seed S] [--count N] [--print] [--opencl-every K]\n"
            "                       [--families all|rotate|none] [--no-shrink] [--max-fail N] [--quiet]\n"
            "                       [--precision fp16|bf16|both]\n"
            "  graph i has seed S+i; --opencl-every 1 runs every graph on OpenCL (0: none; default 20)\n"
            "  --families rotate: graph i disables family i mod F alone (default); all: every family\n"
            "  --precision: every graph also through the fp16/bf16 pass on ref (and on OpenCL where\n"
            "    --opencl-every picks it); both: fp16 and bf16 by turns\n"
            "  KF_RANDGRAPH_SAVE=FILE: each failing graph is saved there as ONNX (for kfuse run)\n");
    return 2;
}

/* The check options that exercise only the failing path (for shrinking). */
static rg_check_opts only(const char *path, kf_dtype low) {
    rg_check_opts o = {0, -1, NULL, low};
    if (!strcmp(path, "opt")) o.paths = RG_P_OPT;
    else if (!strcmp(path, "fuse")) o.paths = RG_P_FUSE;
    else if (!strcmp(path, "opencl")) o.paths = RG_P_CL;
    else if (!strcmp(path, "opencl-lib")) o.paths = RG_P_CL | RG_P_LIB;
    else if (!strcmp(path, "prec")) o.paths = RG_P_PREC;
    else if (!strcmp(path, "prec-opencl")) o.paths = RG_P_PREC | RG_P_CL;
    else if (!strcmp(path, "int8")) o.paths = RG_P_INT8;
    else if (!strcmp(path, "int8-opencl")) o.paths = RG_P_INT8 | RG_P_CL;
    else if (!strncmp(path, "opt-no-", 7) || !strncmp(path, "fuse-no-", 8)) {
        const char *f = strstr(path, "-no-") + 4;
        o.paths = RG_P_FAMILY;
        for (int i = 0; i < rg_family_count(); i++)
            if (!strcmp(rg_family_name(i), f)) o.family = i;
    }
    return o;
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL);
    long count = 100, cl_every = 20, max_fail = 5;
    bool print = false, shrink = true, quiet = false;
    int families = 1; /* 0 none, 1 rotate, 2 all */
    int prec = 0;     /* 0 none, 1 fp16, 2 bf16, 3 both */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--seed") && v) seed = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--count") && v) count = strtol(v, NULL, 0), i++;
        else if (!strcmp(a, "--opencl-every") && v) cl_every = strtol(v, NULL, 0), i++;
        else if (!strcmp(a, "--max-fail") && v) max_fail = strtol(v, NULL, 0), i++;
        else if (!strcmp(a, "--families") && v) {
            families = !strcmp(v, "none") ? 0 : !strcmp(v, "all") ? 2 : !strcmp(v, "rotate") ? 1 : -1;
            if (families < 0) return usage();
            i++;
        } else if (!strcmp(a, "--precision") && v) {
            prec = !strcmp(v, "fp16") ? 1 : !strcmp(v, "bf16") ? 2 : !strcmp(v, "both") ? 3 : -1;
            if (prec < 0) return usage();
            i++;
        } else if (!strcmp(a, "--print")) print = true;
        else if (!strcmp(a, "--no-shrink")) shrink = false;
        else if (!strcmp(a, "--quiet")) quiet = true;
        else return usage();
    }
    const char *nocl = kf_cl_unavailable();
    printf("kfuse_randgraph: seed %llu, %ld graphs, opencl every %ld%s%s, families %s\n", (unsigned long long)seed,
           count, cl_every, nocl ? " (skipped: " : "", nocl ? nocl : "", families == 2 ? "all" : families ? "rotate" : "none");
    if (nocl) printf(")\n");
    rg_stats st = {0};
    long fails = 0;
    int nf = rg_family_count();
    for (long i = 0; i < count && fails < max_fail; i++) {
        uint64_t s = seed + (uint64_t)i;
        kf_model *m = rg_generate(s);
        if (!m) return 3;
        if (print) {
            char *t = rg_print(m);
            printf("# seed %llu\n%s", (unsigned long long)s, t);
            free(t);
        }
        kf_tensor *ins;
        int nins;
        if (rg_inputs(m, s, &ins, &nins)) {
            fprintf(stderr, "seed %llu: inputs: %s\n", (unsigned long long)s, kf_last_error());
            kf_model_free(m);
            return 3;
        }
        rg_check_opts o = {RG_P_OPT | RG_P_FUSE | RG_P_INT8, -1, NULL, KF_DT_FLOAT16};
        /* every other OpenCL run with the library calls' host model */
        if (cl_every > 0 && i % cl_every == 0) o.paths |= RG_P_CL | ((i / cl_every) % 2 ? RG_P_LIB : 0);
        if (prec) {
            o.paths |= RG_P_PREC;
            o.low = prec == 2 || (prec == 3 && i % 2) ? KF_DT_BFLOAT16 : KF_DT_FLOAT16;
        }
        if (families) {
            o.paths |= RG_P_FAMILY;
            o.family = families == 2 ? -1 : (int)(i % nf);
        }
        double slow = st.slowest_s;
        char path[64], why[1024];
        bool ok = rg_check(m, ins, nins, &o, path, sizeof path, why, sizeof why, &st);
        if (st.slowest_s > slow) st.slowest_seed = s;
        rg_free_tensors(ins, nins);
        if (!ok) {
            fails++;
            char *t = rg_print(m);
            printf("FAIL seed %llu path %s: %s\n--- graph (%u nodes) ---\n%s", (unsigned long long)s, path, why,
                   kf_graph_live_nodes(m->graph), t);
            free(t);
            rg_check_opts so = only(path, o.low);
            uint64_t in_seed = s;
            kf_model *sm = shrink && so.paths ? rg_shrink(m, &in_seed, &so, path) : NULL;
            if (sm) {
                t = rg_print(sm);
                printf("--- shrunk (%u nodes; inputs from seed %llu) ---\n%s", kf_graph_live_nodes(sm->graph),
                       (unsigned long long)in_seed, t);
                free(t);
                kf_model_free(sm);
            }
            printf("--- reproduce: kfuse_randgraph --seed %llu --count 1 --print\n", (unsigned long long)s);
            fflush(stdout);
        } else if (!quiet && (i + 1) % (cl_every == 1 ? 100 : 1000) == 0) {
            printf("%ld graphs, %llu failed\n", i + 1, (unsigned long long)st.fail);
            fflush(stdout);
        }
        kf_model_free(m);
    }
    printf("graphs %llu (nodes %llu), agreed: ref %llu, opt %llu, fuse %llu, opencl %llu (skipped %llu), "
           "family-disabled %llu, fp16/bf16 ref %llu opencl %llu (out of range %llu), int8 plans ref %llu "
           "opencl %llu (int8-fp16 %llu), fp8 plans opencl %llu; failed %llu; slowest %.3f s (seed %llu)\n"
           "opencl path: %llu groups ran as generated kernels, %llu on the reference evaluator; "
           "%llu graphs with the library calls' host model (%llu calls)\n",
           (unsigned long long)st.graphs, (unsigned long long)st.nodes, (unsigned long long)st.ref,
           (unsigned long long)st.opt, (unsigned long long)st.fuse, (unsigned long long)st.cl,
           (unsigned long long)st.cl_skipped, (unsigned long long)st.family, (unsigned long long)st.prec,
           (unsigned long long)st.prec_cl, (unsigned long long)st.prec_skipped, (unsigned long long)st.int8,
           (unsigned long long)st.int8_cl, (unsigned long long)st.int8_fp16_cl, (unsigned long long)st.fp8_cl, (unsigned long long)st.fail,
           st.slowest_s, (unsigned long long)st.slowest_seed, (unsigned long long)st.cl_groups_cl,
           (unsigned long long)st.cl_groups_ref, (unsigned long long)st.cl_lib, (unsigned long long)st.cl_groups_lib);
    rg_write_rule_hits(stdout);
    return st.fail ? 1 : 0;
}
