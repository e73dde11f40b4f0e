/*
 * kf_opt.h: the optimizer entry point behind `kfuse opt`: built-in and
 * user rules, C-callback passes, dead-code elimination, run to a fixed
 * point; and the numerical rule checker behind `kfuse patterns check`.
 */
#ifndef KF_OPT_H
#define KF_OPT_H

#include <stdio.h>

#include "kf_pattern.h"

/* What a whole-graph pass gets: fuel to respect (< 0 unlimited; decrement
 * per rewrite, stop at 0), tracing, and a counter of changes it made. */
typedef struct kf_pass_ctx {
    int64_t fuel;
    bool trace;
    uint64_t changes;
    int64_t fold_cap_bytes; /* constant folding: outputs of one node may hold this many bytes
                             * (0: the cap that keeps a saved model from growing) */
    bool keep_quantized;    /* constant folding leaves DequantizeLinear alone */
    const bool *keep;       /* constant folding leaves node id alone where id < nkeep and keep[id] */
    uint32_t nkeep;
} kf_pass_ctx;

typedef kf_status (*kf_graph_pass_fn)(kf_model *m, kf_pass_ctx *ctx);
/* The fold pass's first step alone: Constant nodes become initializers.
 * The optimizer runs it before its first rules sweep, so rules whose
 * guards read constants match in the first round. */
kf_status kf_pass_fold_constant_nodes(kf_model *m, kf_pass_ctx *ctx);

#define KF_RULE_PASS(name) kf_status kf_pass_##name##_rules(kf_ruleset *rs);
#define KF_GRAPH_PASS(name) kf_status kf_pass_##name(kf_model *m, kf_pass_ctx *ctx);
#include "passes.def"
#undef KF_RULE_PASS
#undef KF_GRAPH_PASS

typedef struct kf_opt_options {
    const char *const *pattern_files; /* extra .kfp files */
    int npattern_files;
    bool no_builtin;                  /* skip the built-in rules */
    int64_t fuel;                     /* < 0 unlimited; default from KFUSE_FUEL */
    bool trace;                       /* default from KFUSE_TRACE containing "rules" */
    bool trace_time;                  /* each stage's time to stderr (KFUSE_TRACE containing "time") */
    const char *disable;              /* comma-separated pass or rule names to skip */
    bool no_raise;                    /* never raise the model's opset */
    int64_t opset;                    /* > 0: raise the model to this opset first (all or nothing; when it
                                       * cannot, res->raise_declined says why), raise no further, and run
                                       * the opt_in rules too (rewrites into standard ops that kfuse's own
                                       * kernels run no better, e.g. Attention); 0: neither */
    const char *const *keep;          /* value names never rewritten away (like graph outputs) */
    int nkeep;
    int64_t fold_cap_bytes;           /* larger folds allowed (a model that is compiled, not saved:
                                       * a ConstantOfShape of a constant shape is then computed once);
                                       * 0: folding never inflates the model by more than 1 MiB a node */
    bool keep_quantized;              /* never fold a DequantizeLinear of constants (an int8 plan
                                       * computes on the 8-bit weights: pass_qint.c) */
    bool every_node;                  /* the rules try every node every sweep instead of only where an
                                       * edit reached (the same result, slower; KFUSE_REWRITE=all) */
    bool check_inference;             /* debugging: every shape inference that looks again only where
                                       * edits reached is checked against a whole one; a difference is
                                       * KF_ERR_INTERNAL (KFUSE_REWRITE=check) */
    int64_t defer_concat_bytes;       /* > 0: merged sibling weights of at least this many bytes keep
                                       * their parts (kf_tensor_concat_deferred) until written, for a
                                       * model that is saved next (kfuse opt); 0: merged at once */
} kf_opt_options;

/* Initializers CSE compares byte for byte: at most this size. Larger merged
 * weights may be deferred without changing what CSE sees (kfuse opt defers
 * from KF_CSE_MAX_INIT_BYTES + 1 on). */
#define KF_CSE_MAX_INIT_BYTES ((int64_t)1 << 20)

/* Defaults from the environment (KFUSE_FUEL, KFUSE_TRACE, KFUSE_REWRITE=all|check). */
void kf_opt_options_default(kf_opt_options *o);

typedef struct kf_opt_result {
    uint32_t nodes_before, nodes_after;
    uint64_t rewrites;
    int64_t opset_before, opset_after; /* default domain; raised when a rule needed it */
    char raise_declined[512];          /* why the opset was not raised, when a rule wanted it */
    int rounds;                        /* rounds of (rules, graph passes) run */
    bool converged;                    /* the last round changed nothing (false: stopped by the round
                                        * cap or the fuel; a rewrite and its undoing cycling is a bug) */
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
