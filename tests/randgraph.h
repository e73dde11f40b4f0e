/*
 * randgraph.h: random valid graphs for differential testing (DESIGN.md,
 * testing layer 3). A generator draws graphs over the supported ops from a
 * seed alone; a checker runs each through ref, opt, fuse, opencl and opt
 * with each pass family disabled, and compares with kf_run_close; a
 * shrinker deletes nodes while the same path still fails. Graphs print in
 * tests/graph_text.h's format so a failure pastes into a regression test.
 * Independent of Criterion: the CI test and kfuse_randgraph share it.
 */
#ifndef KF_RANDGRAPH_H
#define KF_RANDGRAPH_H

#include <stdio.h>

#include "kf_ref.h"

/* Nodes per graph: the issue asks for 2-40; motifs may end a graph a few
 * nodes short of the target but never past the cap. */
#define RG_MIN_NODES 2
#define RG_MAX_NODES 40
/* fp16 graphs stay shorter: every fp16 op rounds to 11 bits, and a long
 * chain of roundings alone drifts past the fp16 tolerance. */
#define RG_MAX_NODES_FP16 14

/* A new random model drawn from seed alone (same seed, same model, byte for
 * byte). Never NULL except on out of memory. Caller frees (kf_model_free). */
kf_model *rg_generate(uint64_t seed);

/* Inputs for m's real inputs, uniform in [-2, 2) like gt_random_inputs
 * (symbolic dims become 3), drawn from seed. *ins is calloc'ed with *nins
 * tensors; free with rg_free_tensors. */
kf_status rg_inputs(const kf_model *m, uint64_t seed, kf_tensor **ins, int *nins);
void rg_free_tensors(kf_tensor *t, int n);

/* m as graph text (graph_text.h), constants with every value so gt_parse
 * rebuilds the same model. malloc'ed; caller frees. */
char *rg_print(const kf_model *m);
/* Whether d saved to a file (deferred merges written part by part, the
 * file sink's path) gives the bytes m saved in memory gives: NULL when it
 * does, else a static message. */
const char *rg_file_save_differs(const kf_model *d, const kf_model *m);

/* Paths a graph runs through (bit flags for rg_check_opts.paths). */
enum {
    RG_P_OPT = 1 << 0,    /* ref after kf_optimize */
    RG_P_FUSE = 1 << 1,   /* ref after opt + plan + kf_fuse_apply (ai.kfuse functions) */
    RG_P_CL = 1 << 2,     /* kf_run_opencl (skipped when kf_cl_unavailable()) */
    RG_P_FAMILY = 1 << 3, /* opt (and fuse) with one pass family disabled */
    RG_P_PREC = 1 << 4,   /* the fp16/bf16 pass (kf_fuse_precision, rg_check_opts.low) on ref,
                           * and the converted graph on OpenCL when RG_P_CL is set too */
    RG_P_INT8 = 1 << 5,   /* a graph with a QDQ product: its int8 form (kf_fuse_int8) on ref
                           * against the original, and (with RG_P_CL) an int8 plan on OpenCL
                           * against ref on the int8 form; with RG_P_CL and low float16, a
                           * graph with E4M3FN/E5M2 values also as an fp8 plan on OpenCL */
    RG_P_LIB = 1 << 6     /* with RG_P_CL: library anchors run as the host model of their
                           * cuBLASLt/cuDNN call (KFUSE_LIBANCHOR_HOST), path "opencl-lib" */
};

/* Pass/rule families that can be disabled alone: each .kfp file of the
 * built-in rules, each rule pass and each graph pass of passes.def. */
int rg_family_count(void);
const char *rg_family_name(int i);

typedef struct rg_check_opts {
    unsigned paths;   /* RG_P_* */
    int family;       /* with RG_P_FAMILY: one family index, or -1 for all */
    const char *patterns; /* a .kfp file of extra rules for every opt run, or NULL */
    kf_dtype low;     /* with RG_P_PREC: KF_DT_FLOAT16 or KF_DT_BFLOAT16 */
} rg_check_opts;

/* Counters across rg_check calls (per path: graphs compared, skipped). */
typedef struct rg_stats {
    uint64_t graphs, nodes;
    uint64_t ref, opt, fuse, cl, cl_skipped, family;
    uint64_t cl_groups_cl, cl_groups_ref; /* opencl path: groups run as kernels / on ref */
    uint64_t cl_lib, cl_groups_lib;       /* opencl path with RG_P_LIB: graphs agreed, library calls */
    uint64_t prec, prec_cl, prec_skipped; /* RG_P_PREC: agreed on ref / on OpenCL; not judged:
                                           * past the low type's range, or ill-conditioned (the
                                           * float32 graph itself moves past the tolerance when
                                           * inputs and constants move by one rounding) */
    uint64_t int8, int8_cl;  /* RG_P_INT8: graphs with integer products agreed on ref / OpenCL */
    uint64_t int8_fp16_cl;   /* ... and at INT8_FP16 on OpenCL (o->low float16, well conditioned) */
    uint64_t fp8_cl;         /* graphs with float8 values agreed as FP8 plans on OpenCL */
    uint64_t fail;
    double slowest_s;
    uint64_t slowest_seed;
} rg_stats;

/* Runs m (not changed) with inputs through the paths in o. Returns true
 * when every path agrees with ref on the original; else false with the
 * failing path ("opt", "fuse", "opencl", "opt-no-<family>",
 * "fuse-no-<family>", "int8" and "int8-opencl", "prec" and "prec-opencl" (the converted graph on ref
 * and on OpenCL against ref on the original, at kf_run_close_model's
 * tolerance), or "ref" when the original itself does not run) in
 * path and a description in why. st (may be NULL) is updated. */
bool rg_check(const kf_model *m, const kf_tensor *ins, int nins, const rg_check_opts *o, char *path,
              size_t pathlen, char *why, size_t whylen, rg_stats *st);

/* Deletes nodes (their outputs become graph inputs of the same type) and
 * graph outputs while `path` still fails with inputs from *in_seed (or from
 * one of a few other input seeds, since a deleted node's values are drawn
 * afresh). Returns the smallest failing model found (caller frees), or NULL
 * when m does not fail on path at all; *in_seed is then the seed whose
 * inputs (rg_inputs) make the returned model fail. */
kf_model *rg_shrink(const kf_model *m, uint64_t *in_seed, const rg_check_opts *o, const char *path);

/* Per rule: rewrites and graphs it fired in, summed over every opt run
 * with nothing disabled in this process (so a test can show the rules
 * really fire on random graphs). One line. */
void rg_write_rule_hits(FILE *f);

/* Deep copy through ONNX serialisation (also checks export and import). */
kf_status rg_copy(const kf_model *m, kf_model **out);

#endif
