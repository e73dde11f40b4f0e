/*
 * kf_opt.h: the optimizer entry point behind `kfuse opt`: built-in and
 * user rules, C-callback passes, dead-code elimination, run to a fixed
 * point; and the numerical rule checker behind `kfuse patterns check`.
 */
#ifndef KF_OPT_H
#define KF_OPT_H

#include <stdio.h>

#include "kf_pattern.h"

typedef struct kf_opt_options {
    const char *const *pattern_files; /* extra .kfp files */
    int npattern_files;
    bool no_builtin;                  /* skip the built-in rules */
    int64_t fuel;                     /* < 0 unlimited; default from KFUSE_FUEL */
    bool trace;                       /* default from KFUSE_TRACE containing "rules" */
} kf_opt_options;

/* Defaults from the environment (KFUSE_FUEL, KFUSE_TRACE). */
void kf_opt_options_default(kf_opt_options *o);

typedef struct kf_opt_result {
    uint32_t nodes_before, nodes_after;
    uint64_t rewrites;
    kf_ruleset rules; /* with per-rule statistics; caller frees (kf_rules_free) */
} kf_opt_result;

/* Optimizes m in place. On success res holds the statistics (free its
 * rules with kf_rules_free); on failure the model may be partly rewritten
 * but is still a valid graph (each rewrite is atomic). */
kf_status kf_optimize(kf_model *m, const kf_opt_options *o, kf_opt_result *res);

typedef struct kf_check_result {
    int rules, passed, failed;
} kf_check_result;

/* Checks every rule of rs numerically (random shapes satisfying the guards
 * and examples, random and edge-case values, source vs replacement through
 * the reference evaluator). Prints one line per rule and a counterexample
 * for each failure to `out`. seed 0 picks one from the clock (printed). */
kf_status kf_rules_check(kf_ruleset *rs, uint64_t seed, FILE *out, kf_check_result *res);

#endif
