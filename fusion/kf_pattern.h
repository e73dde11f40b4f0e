/*
 * kf_pattern.h: rewrite rules as data. A rule is a small source DAG over op
 * types with captures, guards, and a replacement graph; built-in rules are
 * .kfp text files embedded at build time, users load more at run time, and
 * a C callback is the escape hatch for rewrites text cannot express. The
 * driver runs rules to a fixed point and keeps per-rule statistics and near
 * misses. Grammar and examples: fusion/patterns/README.md.
 */
#ifndef KF_PATTERN_H
#define KF_PATTERN_H

#include "kf_ref.h"

/* A rule's source DAG: exporters' decompositions need about a dozen nodes;
 * past these sizes a rewrite belongs in a C callback. */
#define KF_PAT_MAX_NODES 32
#define KF_PAT_MAX_VARS 96
#define KF_PAT_MAX_ARGS 8
#define KF_PAT_MAX_OUTS 4
#define KF_PAT_MAX_GUARDS 48
/* Sweeps over the graph before the driver gives up on a fixed point. Each
 * sweep can apply many rules; real models settle in under ten. */
#define KF_REWRITE_MAX_SWEEPS 64
/* Near misses kept per rule for the report. */
#define KF_PAT_MAX_NEAR 8

typedef enum kf_pat_arg_kind { KF_PA_VAR = 0, KF_PA_LITERAL = 1, KF_PA_ANY = 2 } kf_pat_arg_kind;

typedef struct kf_pat_arg {
    kf_pat_arg_kind kind;
    int var;       /* KF_PA_VAR */
    double lit;    /* KF_PA_LITERAL: a constant whose every element equals lit */
} kf_pat_arg;

/* An attribute in a pattern: a literal value, or (replacements only) a
 * copy of an attribute of the node that produced a matched variable. */
typedef struct kf_pat_attr {
    kf_attr value;   /* literal (name set) */
    int ref_var;     /* >= 0: copy attribute ref_attr of the producer of ref_var */
    char *ref_attr;
    bool has_default; /* ref with a literal default in value when absent */
    bool ref_value;   /* $VAR: the scalar value of the constant bound to ref_var */
    int ref_var2;     /* $VAR*$VAR2: times the scalar value of a second constant (-1: none) */
    bool ref_recip;   /* 1/$VAR (or 1/($VAR*$VAR2)) */
} kf_pat_attr;

typedef struct kf_pat_node {
    char *op;
    char *domain;
    kf_op opid; /* op and domain resolved in the op table (the matcher compares ids) */
    int nargs;
    kf_pat_arg args[KF_PAT_MAX_ARGS];
    int nouts;
    int outs[KF_PAT_MAX_OUTS]; /* variables defined by this node */
    int nattrs;
    kf_pat_attr *attrs;
    int copy_from; /* replacements: 1 + the variable whose producer's attributes are all
                    * copied ({@V.*}); 0 none. Explicit attributes take precedence. */
    int line;
} kf_pat_node;

typedef enum kf_guard_kind {
    KF_G_CONST,       /* var is a constant (initializer) */
    KF_G_CONST_EQ,    /* every element within tol of value */
    KF_G_CONST_CMP,   /* every element compares with value (cmp) */
    KF_G_SCALAR,      /* one element */
    KF_G_SINGLE_USE,  /* one consumer, not a graph output */
    KF_G_DTYPE,       /* dtype among a list */
    KF_G_RANK,        /* rank compared with value */
    KF_G_SAME_SHAPE,  /* shapes of var and var2 known and equal */
    KF_G_ATTR,        /* attribute of var's producer compared with value */
    KF_G_LAST_AXIS,   /* attribute of var's producer (attr set) or the constant var
                       * itself (attr NULL) names the last axis of var2 */
    KF_G_SAME_ATTR,   /* attribute attr of var's producer equals attribute attr2 of
                       * var2's producer (defaults standing in for absent ones) */
    KF_G_SAME_DIM     /* dim axis of var and dim axis2 of var2 known and equal */
} kf_guard_kind;

typedef enum kf_cmp { KF_CMP_EQ, KF_CMP_NE, KF_CMP_GE, KF_CMP_LE, KF_CMP_GT, KF_CMP_LT } kf_cmp;

typedef struct kf_pat_guard {
    kf_guard_kind kind;
    int var, var2;
    kf_cmp cmp;
    double value, tol;
    kf_dtype dtypes[KF_DT_COUNT_];
    int ndtypes;
    char *attr;
    kf_attr attr_value;
    bool has_default;  /* KF_G_ATTR: attr_default stands in for an absent attribute */
    int axis, axis2;   /* KF_G_SAME_DIM: negative counts from the end */
    kf_attr attr_default;
    char *attr2;        /* KF_G_SAME_ATTR: the attribute of var2's producer */
    bool has_default2;
    kf_attr attr_default2;
    int line;
} kf_pat_guard;

typedef struct kf_pat_var {
    char *name;
    int src_node; /* source node defining it, -1 for a capture */
    int dst_node; /* replacement node defining it, -1 otherwise */
} kf_pat_var;

/* An example shape for `patterns check`: dims >= 0 fixed, < 0 a symbol id
 * (-1 - k) shared between vars. */
typedef struct kf_pat_example {
    int var;
    kf_dtype dtype;           /* 0: an attribute example ({...} for var's producer) */
    int rank;
    int64_t dims[KF_MAX_RANK];
    double *values;           /* `= [...]`: the capture is this constant */
    int nvalues;
    kf_attr *attrs;           /* attribute example; one is picked per shape draw */
    int nattrs;
} kf_pat_example;

struct kf_rule;
/* C escape hatch: try to rewrite at node; *applied says whether the graph
 * changed. A decline fills *why (static string) when the root op matched. */
typedef kf_status (*kf_rule_fn)(kf_model *m, kf_id node, void *user, bool *applied, const char **why);

typedef struct kf_near_miss {
    char *node;   /* node name */
    char *reason;
} kf_near_miss;

typedef struct kf_rule {
    char *name;
    char *file;
    int line;
    /* The five lists below hold KF_PAT_MAX_* entries while the rule is
     * parsed and exactly their counts after (NULL in callback rules): at
     * the maxima a rule is 57 KB, and zeroing that for every rule of the
     * set was most of the fixed cost of `kfuse opt`. */
    kf_pat_var *vars;
    int nvars;
    kf_pat_node *src;
    int nsrc;
    kf_pat_guard *guards;
    int nguards;
    kf_pat_node *dst;
    int ndst;
    int result_var;     /* what replaces the root's first output */
    int64_t min_opset;  /* of the default domain, for the replacement */
    bool opt_in;        /* runs only when the caller asks for an output opset (kf_opt_options.opset) */
    bool nan_refined;   /* `patterns check` accepts a number where the source gives NaN */
    kf_pat_example *examples;
    int nexamples;
    const char *root_op; /* op type at the root (callbacks: the op they start from) */
    int reach;           /* nodes upstream of the root the rule reads (its match nodes; callbacks
                          * KF_CALLBACK_REACH) */
    kf_op root_opid;     /* root_op resolved in the op table (0: none) */
    /* A built-in rule (kf_rules_add_builtin): names, lists and attributes
     * are the library's constant tables; only the run state below is the
     * rule's own. */
    bool compiled;
    kf_rule_fn fn;
    void *user;
    /* Search states for matching (pattern_match.c), sized to this rule and
     * made on its first try, or the set's (kf_rules_share_match_pool): a
     * try allocates nothing. */
    void *match_pool;
    bool match_pool_shared;
    /* statistics of the last kf_rewrite run */
    uint64_t attempts, hits, misses;
    uint64_t opset_misses; /* declines only because the model's opset is older than min_opset */
    kf_near_miss near[KF_PAT_MAX_NEAR];
    int nnear;
} kf_rule;

typedef struct kf_ruleset {
    kf_rule **rules;
    uint32_t n, cap;
    /* Search states that the set's text rules share (a try uses them only
     * while it runs): one set sized to the largest rule, so a run touches
     * far less fresh memory than one set per rule. */
    void *match_pool;
} kf_ruleset;

/* Parses .kfp text (file names messages) and appends its rules to rs.
 * Errors: KF_ERR_BAD_MODEL with "file:line: message". */
kf_status kf_rules_parse(kf_ruleset *rs, const char *text, size_t len, const char *file);
kf_status kf_rules_load_file(kf_ruleset *rs, const char *path);
/* Appends the built-in rules (the .kfp files of fusion/patterns), parsed at
 * build time: nothing is parsed here. */
kf_status kf_rules_add_builtin(kf_ruleset *rs);
/* Appends the same rules parsed now from the text embedded in the library
 * (what the build step compiles; the tests compare the two). */
kf_status kf_rules_parse_builtin(kf_ruleset *rs);
/* Appends a C callback rule for nodes of op type root_op. */
kf_status kf_rules_add_callback(kf_ruleset *rs, const char *name, const char *root_op, kf_rule_fn fn,
                                void *user);
void kf_rules_free(kf_ruleset *rs);

/* Gives the set's text rules that have no search states yet one shared
 * set (freed by kf_rules_free; with fewer than two such rules, nothing).
 * Only for speed; rules match the same. */
kf_status kf_rules_share_match_pool(kf_ruleset *rs);

/* Tries rule r at node; on a match applies the replacement and sets
 * *applied. A decline after the root op matched records a near miss. */
kf_status kf_rule_try(kf_rule *r, kf_model *m, kf_id node, bool *applied);

typedef struct kf_rewrite_opts {
    int64_t fuel;     /* < 0: unlimited; else rewrites left (KFUSE_FUEL) */
    bool trace;       /* print each hit to stderr (KFUSE_TRACE=rules) */
} kf_rewrite_opts;

/* How far upstream of its root a C callback rule looks (nodes): what
 * kf_rewrite assumes when it retries only where the graph changed. */
#define KF_CALLBACK_REACH 4

/* Clears every rule's statistics and near misses. */
void kf_rules_reset_stats(kf_ruleset *rs);

/* Runs rules to a fixed point (KF_REWRITE_MAX_SWEEPS sweeps at most;
 * hitting the cap is KF_ERR_INTERNAL naming the last rule applied), with
 * shape inference refreshed first and dead code removed after each sweep.
 * With edit tracking on (kf_graph_track), a node is tried only when an edit
 * since it was last tried touched a value within reach of it (see
 * rewrite.c), which gives the result of trying every node every sweep;
 * g->touch_all (set it for the first call) tries every node once.
 * *rewrites (may be NULL) gets the number of rewrites applied; opts->fuel
 * is decremented. Graph outputs keep their names. Rule statistics add up
 * across calls (see kf_rules_reset_stats). */
kf_status kf_rewrite(kf_model *m, kf_ruleset *rs, kf_rewrite_opts *opts, uint64_t *rewrites);

#endif
