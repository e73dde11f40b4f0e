/*
 * kfuse_tool.h: what the verbs share: the `compile` and `bench` options,
 * input types with --dim bindings and random inputs (cmd_compile.c), and
 * inputs read from a folder (kfuse.c).
 */
#ifndef KFUSE_TOOL_H
#define KFUSE_TOOL_H

#include "kf_exec.h"

/* --dim bindings at most: a model has a handful of symbolic dims */
#define KFUSE_TOOL_MAX_DIMS 32

/* --dim NAME=N flags, in command-line order */
typedef struct kfuse_tool_dims {
    const char *names[KFUSE_TOOL_MAX_DIMS];
    int64_t values[KFUSE_TOOL_MAX_DIMS];
    int n;
} kfuse_tool_dims;

/* --patterns files at most (as `kfuse opt`) */
#define KFUSE_TOOL_MAX_PATTERNS 64

typedef struct kfuse_tool_args {
    const char *model, *backend, *arch;
    const char *precision; /* --precision, NULL when absent */
    const char *target;    /* --target, NULL when absent (KFUSE_TARGET, else h200) */
    int device;            /* --device N */
    const char *patterns[KFUSE_TOOL_MAX_PATTERNS]; /* --patterns F */
    int npatterns;
    int warmup, iters, threads;
    uint64_t seed;
    kfuse_tool_dims dims;
    kf_dim fixed[KFUSE_TOOL_MAX_DIMS]; /* dims as kf_compile_options takes them */
} kfuse_tool_args;

/* kf_model_load, then the loader's warnings (what it read leniently) on
 * stderr, naming the file. */
kf_status kfuse_tool_load(const char *path, kf_model **m);

/* Adds the value of one --dim flag, NAME=N (arg is split in place: the '='
 * becomes a NUL). false, after saying why on stderr, when it is not a
 * name, '=' and a non-negative integer, or past KFUSE_TOOL_MAX_DIMS. */
bool kfuse_tool_dim_arg(kfuse_tool_dims *d, char *arg);
/* Checks the --dim names against m: a name the model does not have is a
 * warning on stderr, not an error, so one script can fix `batch` across
 * models that do and do not have it. With bind, the names it has are fixed
 * in every type of m's graph (kf_graph_bind_sym). */
kf_status kfuse_tool_apply_dims(kf_model *m, const kfuse_tool_dims *d, bool bind);

/* false on a usage error */
bool kfuse_tool_parse(kfuse_tool_args *a, int argc, char **argv);
bool kfuse_tool_backend(const char *name, kf_exec_backend *b);
/* The precision --precision names (flag), else KFUSE_PRECISION's, else
 * fp32. false after printing why on stderr (a usage error: exit 2). */
bool kfuse_tool_precision(const char *flag, kf_precision *p);
/* The plan options of a, through the library's own path from
 * kf_compile_options (kf_exec_options_from_public): backend b, precision
 * prec, --target, --device, --patterns and --dim; the CLI-only fields
 * (arch, threads, tracing) are the caller's to set. o points into a. */
kf_status kfuse_tool_exec_options(kfuse_tool_args *a, kf_exec_backend b, kf_precision prec, kf_exec_options *o);
/* prints the status and last error; returns exit code 3 */
int kfuse_tool_fail(kf_status st);
/* Concrete types of m's real inputs (symbolic dims bound by --dim, else 1);
 * *types malloc'ed (free). */
kf_status kfuse_tool_types(const kf_model *m, const kfuse_tool_dims *dims, kf_type **types, uint32_t *n);
/* Random data of the types for m's real inputs, from seed: floats in
 * [-1, 1), booleans, integers in [0, kf_index_bound) where the graph uses
 * them as indices into a dim of known size (token type ids: [0, 2)), else
 * small non-negative ones. */
kf_status kfuse_tool_inputs(const kf_model *m, const kf_type *types, uint32_t n, uint64_t seed, kf_tensor *ins);

/* Reads the graph's real inputs real[0..nreal) from folder dir into ins:
 * NAME.npy for an input named NAME, else input_N.pb TensorProto files (by
 * the name inside, else by position). A file for no input, two for one, or
 * an input with none are KF_ERR_INVALID_ARG naming the file or input. */
kf_status kfuse_tool_load_inputs(const kf_graph *g, const kf_id *real, uint32_t nreal, const char *dir, kf_tensor *ins);

#endif
