/*
 * test_util.h: small builders for unit tests: standalone nodes with
 * attributes, tensors from literals or random values (seeded, seed printed),
 * and tolerance comparison per DESIGN.md's numerics policy.
 */
#ifndef KF_TEST_UTIL_H
#define KF_TEST_UTIL_H

#include "kf_ref.h"

/* A node outside any graph: op looked up in the default domain, every input
 * and output slot present (ids 1..n), opset as given. Free with tu_node_free. */
kf_node *tu_node(const char *op_type, int nin, int nout, int64_t opset);
void tu_node_free(kf_node *n);
void tu_attr_i(kf_node *n, const char *name, int64_t v);
void tu_attr_f(kf_node *n, const char *name, float v);
void tu_attr_s(kf_node *n, const char *name, const char *v);
void tu_attr_ints(kf_node *n, const char *name, int count, const int64_t *v);
void tu_attr_floats(kf_node *n, const char *name, int count, const float *v);
void tu_attr_t(kf_node *n, const char *name, const kf_tensor *t);

/* Tensors from literals (copied). */
kf_tensor tu_tensor(kf_dtype dt, int rank, const int64_t *dims, const double *vals);
kf_tensor tu_f32(int rank, const int64_t *dims, const float *vals);
kf_tensor tu_i64(int rank, const int64_t *dims, const int64_t *vals);
/* Random values uniform in [lo, hi) from the test seed. */
kf_tensor tu_rand(kf_dtype dt, int rank, const int64_t *dims, double lo, double hi);

/* The source tree the tests read models from: $KF_SOURCE_DIR when set (a
 * test binary carried to another machine, bench/gpu_check.sh), else the
 * tree it was built from. */
const char *tu_source_dir(void);

/* The run's seed: $KF_SEED or the clock, printed once. */
uint64_t tu_seed(void);
/* A suite's private kernel cache: a fresh folder under /tmp named from
 * prefix, set as KFUSE_CACHE_DIR (tu_cache_dir_begin, a suite's .init),
 * then emptied and removed (tu_cache_dir_end, its .fini). */
void tu_cache_dir_begin(const char *prefix);
void tu_cache_dir_end(void);
double tu_uniform(double lo, double hi);

/* |got - want| <= atol + rtol*|want| elementwise, NaN matches NaN, Inf
 * matches Inf of the same sign; shapes and dtypes must match. On mismatch
 * writes a description into why (if not NULL) and returns false. */
bool tu_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, char *why,
              size_t whylen);

/* Runs one node through kf_eval_node; asserts success (Criterion). */
void tu_eval(const kf_node *n, int nin, const kf_tensor *const *in, kf_tensor *out);

/* The kfuse CLI next to the test binary (build/tools/kfuse) into bin; the
 * test is skipped, its reason printed with `suite`, when there is none. */
void tu_cli_find(const char *suite, char *bin, size_t len);
/* `ENV timeout 120 BIN ARGS` with stderr merged into out (cut to len):
 * the exit code; asserts the process exited normally (Criterion). */
int tu_cli_run(const char *bin, const char *env, const char *args, char *out, size_t len);
/* tu_cli_run with no environment and ARGS built printf-style. */
int tu_cli_runf(const char *bin, char *out, size_t len, const char *fmt, ...);
/* tu_cli_find, then a fresh folder /tmp/kf_SUITE_XXXXXX into dir (Criterion
 * .init of the CLI tests); tu_cli_dir_remove removes it (.fini). */
void tu_cli_setup(const char *suite, char *bin, size_t blen, char *dir, size_t dlen);
void tu_cli_dir_remove(const char *dir);

#endif
