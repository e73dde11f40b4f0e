/*
 * test_random_graphs.c: the CI run of the random-graph differential test
 * (tests/randgraph.h): at least 2,000 random graphs from the printed seed
 * through ref, opt, fuse and opt/fuse with one pass family disabled in
 * turn, every 50th also on OpenCL (KF_RANDGRAPH_COUNT and
 * KF_RANDGRAPH_CL_EVERY override these; 0 turns OpenCL off); plus checks
 * that the harness itself can fail (a wrong rule is caught and shrunk), is
 * reproducible from the seed, prints graphs gt_parse reads back, and covers
 * the ops it claims to. Longer runs: bench/random_graphs/.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_kernels.h"
#include "randgraph.h"

/* Graphs per CI run (KF_RANDGRAPH_COUNT overrides): the issue asks for at
 * least 2,000; on 2 cores the ref paths take ~20 s of CPU. Under ASan
 * (several times slower) the sanitizer stage runs a tenth: its point there
 * is memory errors on varied graphs, the full count runs in the plain build. */
/* Every Nth graph also runs on OpenCL: PoCL compiles each kernel (~0.1-0.5
 * s), so the whole set would not fit the stage's 3-minute budget. Not under
 * ASan: some PoCL/LLVM compiles leave allocations LeakSanitizer reports
 * (third-party), which would fail the sanitizer stage for nothing kfuse
 * did. */
#if defined(__SANITIZE_ADDRESS__)
#define CI_GRAPHS 200
#define CI_CL_EVERY 0
#else
#define CI_GRAPHS 2000
#define CI_CL_EVERY 50
#endif

static long env_long(const char *name, long def) {
    const char *e = getenv(name);
    return e && *e ? strtol(e, NULL, 0) : def;
}

/* Prints the failing graph, its shrunk form and how to reproduce it. */
static void report_failure(const kf_model *m, uint64_t seed, const char *path, const char *why,
                           const rg_check_opts *full) {
    char *t = rg_print(m);
    fprintf(stderr, "random graph seed %llu fails on %s: %s\n%s", (unsigned long long)seed, path, why, t);
    free(t);
    rg_check_opts o = *full;
    o.paths = !strcmp(path, "opt")      ? RG_P_OPT
              : !strcmp(path, "fuse")   ? RG_P_FUSE
              : !strcmp(path, "opencl") ? RG_P_CL
              : !strcmp(path, "opencl-lib") ? RG_P_CL | RG_P_LIB
              : !strcmp(path, "int8")   ? RG_P_INT8
              : !strcmp(path, "int8-opencl") ? RG_P_INT8 | RG_P_CL
              : strstr(path, "-no-")    ? RG_P_FAMILY /* o.family is the graph's family */
                                        : o.paths;
    uint64_t in_seed = seed;
    kf_model *s = rg_shrink(m, &in_seed, &o, path);
    if (s) {
        t = rg_print(s);
        fprintf(stderr, "shrunk to %u nodes (inputs from seed %llu):\n%s", kf_graph_live_nodes(s->graph),
                (unsigned long long)in_seed, t);
        free(t);
        kf_model_free(s);
    }
    fprintf(stderr, "reproduce: kfuse_randgraph --seed %llu --count 1 --print\n", (unsigned long long)seed);
}

Test(random_graphs, agree_on_every_path) {
    uint64_t base = tu_seed();
    long count = env_long("KF_RANDGRAPH_COUNT", CI_GRAPHS);
    long cl_every = env_long("KF_RANDGRAPH_CL_EVERY", CI_CL_EVERY); /* 0: no OpenCL */
    int nf = rg_family_count();
    cr_assert(nf >= 8, "expected the pass families of passes.def and the .kfp files, got %d", nf);
    rg_stats st = {0};
    long failures = 0;
    for (long i = 0; i < count && failures < 3; i++) {
        uint64_t seed = base + (uint64_t)i;
        kf_model *m = rg_generate(seed);
        cr_assert(m);
        kf_tensor *ins;
        int nins;
        cr_assert_eq(rg_inputs(m, seed, &ins, &nins), KF_OK, "%s", kf_last_error());
        rg_check_opts o = {RG_P_OPT | RG_P_FUSE | RG_P_FAMILY | RG_P_INT8, (int)(i % nf), NULL, KF_DT_FLOAT16};
        /* every other OpenCL run with the library calls' host model */
        if (cl_every > 0 && i % cl_every == 0) o.paths |= RG_P_CL | ((i / cl_every) % 2 ? RG_P_LIB : 0);
        char path[64], why[1024];
        double slow = st.slowest_s;
        if (!rg_check(m, ins, nins, &o, path, sizeof path, why, sizeof why, &st)) {
            failures++;
            report_failure(m, seed, path, why, &o);
        }
        if (st.slowest_s > slow) st.slowest_seed = seed;
        rg_free_tensors(ins, nins);
        kf_model_free(m);
    }
    fprintf(stderr,
            "random graphs: seeds %llu..%llu: %llu graphs (%llu nodes); agreed: ref %llu, opt %llu, fuse %llu, "
            "opencl %llu (skipped %llu: %s; %llu groups as kernels, %llu on ref; %llu graphs with the library "
            "calls' host model, %llu calls), family-disabled %llu, "
            "int8 plans ref %llu opencl %llu (int8-fp16 %llu), fp8 plans opencl %llu; failed %llu; slowest %.3f s (seed %llu)\n",
            (unsigned long long)base, (unsigned long long)(base + (uint64_t)count - 1), (unsigned long long)st.graphs,
            (unsigned long long)st.nodes, (unsigned long long)st.ref, (unsigned long long)st.opt,
            (unsigned long long)st.fuse, (unsigned long long)st.cl, (unsigned long long)st.cl_skipped,
            kf_cl_unavailable() ? kf_cl_unavailable() : "none", (unsigned long long)st.cl_groups_cl,
            (unsigned long long)st.cl_groups_ref, (unsigned long long)st.cl_lib, (unsigned long long)st.cl_groups_lib,
            (unsigned long long)st.family, (unsigned long long)st.int8,
            (unsigned long long)st.int8_cl, (unsigned long long)st.int8_fp16_cl, (unsigned long long)st.fp8_cl, (unsigned long long)st.fail, st.slowest_s,
            (unsigned long long)st.slowest_seed);
    rg_write_rule_hits(stderr);
    cr_assert_eq(st.fail, 0, "%llu random graphs disagree (graphs and shrunk forms above)", (unsigned long long)st.fail);
}

/* Seeds whose graphs once optimized differently when the rules retried only
 * where edits reached: fold refines types node by node, and those edits
 * were not recorded, so a node the refined type made matchable was never
 * tried again. The opt path compares with trying every node every sweep. */
Test(random_graphs, opt_retries_what_fold_refines) {
    static const uint64_t seeds[] = {14131074435ULL, 14131074537ULL};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        kf_model *m = rg_generate(seeds[i]);
        cr_assert(m);
        kf_tensor *ins;
        int nins;
        cr_assert_eq(rg_inputs(m, seeds[i], &ins, &nins), KF_OK, "%s", kf_last_error());
        rg_check_opts o = {RG_P_OPT, -1, NULL, KF_DT_FLOAT16};
        char path[64], why[1024];
        bool ok = rg_check(m, ins, nins, &o, path, sizeof path, why, sizeof why, NULL);
        cr_expect(ok, "seed %llu, path %s: %s", (unsigned long long)seeds[i], path, why);
        rg_free_tensors(ins, nins);
        kf_model_free(m);
    }
}

/* The harness must be able to fail: a deliberately wrong rule (Relu -> Abs)
 * loaded as a user pattern is caught on the opt path, and the shrinker cuts
 * the graph down to the Relu alone. */
Test(random_graphs, catches_a_wrong_rule_and_shrinks_it) {
    char file[] = "/tmp/kf_wrong_rule_XXXXXX";
    int fd = mkstemp(file);
    cr_assert(fd >= 0);
    const char *rule = "rule wrong_relu_is_abs\n  match\n    y = Relu(x)\n  replace\n    y = Abs(x)\nend\n";
    cr_assert_eq(write(fd, rule, strlen(rule)), (ssize_t)strlen(rule));
    close(fd);
    uint64_t base = tu_seed();
    rg_check_opts o = {RG_P_OPT, -1, file, KF_DT_FLOAT16};
    bool caught = false;
    for (int i = 0; i < 400 && !caught; i++) {
        uint64_t seed = base + (uint64_t)i;
        kf_model *m = rg_generate(seed);
        kf_tensor *ins;
        int nins;
        cr_assert_eq(rg_inputs(m, seed, &ins, &nins), KF_OK);
        char path[64], why[1024];
        if (!rg_check(m, ins, nins, &o, path, sizeof path, why, sizeof why, NULL)) {
            cr_assert_str_eq(path, "opt", "seed %llu: %s", (unsigned long long)seed, why);
            uint64_t in_seed = seed;
            kf_model *s = rg_shrink(m, &in_seed, &o, path);
            cr_assert(s, "seed %llu: the failure did not reproduce while shrinking", (unsigned long long)seed);
            char *t = rg_print(s);
            cr_expect_eq(kf_graph_live_nodes(s->graph), 1, "shrunk graph:\n%s", t);
            /* the Relu, in the graph or in an If branch (bodies get the rules too) */
            int relus = 0;
            for (const char *q = t; (q = strstr(q, "= Relu(")); q++) relus++;
            cr_expect_eq(relus, 1, "shrunk graph:\n%s", t);
            free(t);
            kf_model_free(s);
            caught = true;
        }
        rg_free_tensors(ins, nins);
        kf_model_free(m);
    }
    unlink(file);
    cr_assert(caught, "no graph among 400 from seed %llu exposed Relu -> Abs", (unsigned long long)base);
}

/* A seed alone fixes the graph, and the printed text is a graph_text.h
 * test case: gt_parse reads it back to the same graph (printed again, the
 * text is identical), and the parsed graph computes the same outputs. */
Test(random_graphs, seed_reproduces_and_text_round_trips) {
    uint64_t base = tu_seed();
    for (int i = 0; i < 100; i++) {
        uint64_t seed = base + (uint64_t)i;
        kf_model *a = rg_generate(seed), *b = rg_generate(seed);
        char *ta = rg_print(a), *tb = rg_print(b);
        cr_assert_str_eq(ta, tb, "seed %llu gave two different graphs", (unsigned long long)seed);
        kf_model *p = gt_parse(ta);
        cr_assert_eq(kf_infer_shapes(p), KF_OK, "seed %llu: %s\n%s", (unsigned long long)seed, kf_last_error(), ta);
        char *tp = rg_print(p);
        cr_assert_str_eq(tp, ta, "seed %llu: text does not round-trip through gt_parse", (unsigned long long)seed);
        gt_expect_same_outputs(a, p, 0, 0);
        free(ta);
        free(tb);
        free(tp);
        kf_model_free(a);
        kf_model_free(b);
        kf_model_free(p);
    }
}

/* The generator reaches every op family the issue lists, fp16 graphs and
 * symbolic dims, within 4,000 graphs (generating them takes ~0.2 s). Log,
 * the rarest, needs an input bounded away from 0 and shows up in ~0.5% of
 * graphs: 1,000 graphs missed it for 7 of 1,500 seeds (session 3), 4,000
 * miss it with probability ~1e-9. */
Test(random_graphs, covers_the_listed_ops) {
    static const char *ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Relu", "Sigmoid", "Tanh",
                                "Exp", "Log", "Sqrt", "Erf", "LeakyRelu", "Clip", "Where", "Greater", "Cast",
                                "ReduceSum", "ReduceMean", "ReduceMax", "Softmax", "LogSoftmax", "LayerNormalization",
                                "MatMul", "Gemm", "Conv", "BatchNormalization", "Transpose", "Reshape", "Squeeze",
                                "Unsqueeze", "Concat", "Slice", "Expand", "Gather", "MaxPool", "AveragePool", "LpPool",
                                "GlobalAveragePool", "GlobalMaxPool", "Split", "HardSigmoid", "Attention",
                                "RotaryEmbedding", "If", "Loop", "Swish", "SwiGLU", "RMSNormalization", "GatherND",
                                "Scan", "CumSum", "CumProd", "BitCast", "TensorScatter", "CausalConvWithState",
                                "LinearAttention"};
    enum { NOPS = sizeof ops / sizeof *ops };
    int seen[NOPS] = {0}, fp16 = 0, sym = 0;
    uint64_t base = tu_seed();
    for (int i = 0; i < 4000; i++) {
        kf_model *m = rg_generate(base + (uint64_t)i);
        for (int k = 0; k < NOPS; k++) seen[k] += gt_count(m, ops[k]) > 0;
        const kf_graph *g = m->graph;
        for (uint32_t k = 0; k < g->ninputs; k++) {
            const kf_type *ty = &g->values[g->inputs[k]].type;
            fp16 += ty->dtype == KF_DT_FLOAT16;
            for (int d = 0; d < ty->rank; d++) sym += ty->syms[d] != 0;
        }
        kf_model_free(m);
    }
    for (int k = 0; k < NOPS; k++) cr_expect(seen[k] > 0, "no graph used %s", ops[k]);
    cr_expect(fp16 > 0, "no float16 graph");
    cr_expect(sym > 0, "no symbolic dim");
}

/* Graphs through the fp16/bf16 pass (by turns): the converted graph must
 * infer, run on ref and match ref on the original at the whole-model
 * tolerance, and every PREC_CL_EVERY-th runs on OpenCL as well. Graphs
 * whose float32 outputs already move past that tolerance when their
 * inputs and constants move by one rounding (Floor, integer Casts, ties,
 * cancellations) or that leave the 16-bit range are counted, not judged. */
#define PREC_GRAPHS 400
#define PREC_CL_EVERY 100 /* OpenCL compiles dominate (seconds a graph on 2 cores): 4 of 400 */
Test(random_graphs, precision_pass) {
    uint64_t base = tu_seed();
    long count = env_long("KF_RANDGRAPH_PREC_COUNT", PREC_GRAPHS);
    rg_stats st = {0};
    long failures = 0;
    for (long i = 0; i < count && failures < 3; i++) {
        uint64_t seed = base + (uint64_t)i;
        kf_model *m = rg_generate(seed);
        cr_assert(m);
        kf_tensor *ins;
        int nins;
        cr_assert_eq(rg_inputs(m, seed, &ins, &nins), KF_OK, "%s", kf_last_error());
        rg_check_opts o = {RG_P_PREC, -1, NULL, i % 2 ? KF_DT_BFLOAT16 : KF_DT_FLOAT16};
        if (CI_CL_EVERY > 0 && i % PREC_CL_EVERY == 0) o.paths |= RG_P_CL; /* not under ASan (above) */
        char path[64], why[1024];
        if (!rg_check(m, ins, nins, &o, path, sizeof path, why, sizeof why, &st)) {
            failures++;
            report_failure(m, seed, path, why, &o);
        }
        rg_free_tensors(ins, nins);
        kf_model_free(m);
    }
    fprintf(stderr,
            "random graphs at fp16/bf16: seeds %llu..%llu: %llu graphs; agreed with float32 ref: on ref %llu, on "
            "opencl %llu; not judged (out of range or ill-conditioned) %llu; failed %llu\n",
            (unsigned long long)base, (unsigned long long)(base + (uint64_t)count - 1), (unsigned long long)st.graphs,
            (unsigned long long)st.prec, (unsigned long long)st.prec_cl, (unsigned long long)st.prec_skipped,
            (unsigned long long)st.fail);
    cr_assert_eq(st.fail, 0, "%llu random graphs disagree at a low precision (graphs above)", (unsigned long long)st.fail);
    cr_assert_geq(st.prec, (uint64_t)count / 2, "most graphs must be judged, %llu were", (unsigned long long)st.prec);
}
