/*
 * cg_util.h: helpers the codegen tests share (test_cg*.c, test_libanchor.c):
 * a default plan, every value's reference tensor, the OpenCL skip, the
 * NVRTC compile check with its zero-spill assertion, and the tolerance of
 * long fp32 dot products.
 */
#ifndef KF_CG_UTIL_H
#define KF_CG_UTIL_H

#include "graph_text.h"
#include "kf_exec.h"
#include "kf_kernels.h"

/* The default plan of m (fusion on, no fuel limit); asserts it builds. */
kf_plan *cgu_plan(kf_model *m);

/* The group of plan p holding the node that writes value `name` of m
 * (asserts there is one). */
uint32_t cgu_group_of(const kf_model *m, const kf_plan *p, const char *name);

/* Asserts that text's default plan is one group of the given kind. */
void cgu_assert_one_group(const char *text, kf_group_kind kind);

/* Compiles m on backend b at precision p with the library call's host
 * model in place of the vendor library (KFUSE_LIBANCHOR_HOST=1, which
 * stays set), runs it twice against the reference evaluator on want
 * (cgu_exec_matches_ref_model at p) and returns the compile trace (the
 * caller frees it). */
char *cgu_exec_host_lib_trace(const kf_model *m, const kf_model *want, kf_exec_backend b, kf_precision p);

/* Every value's reference tensor by value id (t[v], v <= n), from one run
 * of the reference evaluator on random inputs (seed printed by tu_seed). */
typedef struct cgu_refvals {
    kf_tensor *t;
    uint32_t n;
} cgu_refvals;
cgu_refvals cgu_reference(const kf_model *m);
void cgu_refvals_free(cgu_refvals *r);

/* Skips the test, with the reason, when OpenCL cannot run kernels here. */
void cgu_need_opencl(void);

/* Compiles k's CUDA source with NVRTC for arch; asserts it compiles, that
 * ptxas reported registers, and 0 spill bytes either way. */
void cgu_nvrtc_check(const kf_cg_kernel *k, const char *arch);

/* How cgu_run_groups checks each kernel: which group kinds, the entry
 * point they must have (NULL: any), the tolerances of float32 and of
 * 16-bit outputs, and a visit of each kernel after its check (NULL: none). */
typedef struct cgu_run_opts {
    unsigned kinds; /* 1u << KF_GROUP_* */
    const char *name;
    double atol, rtol, atol16, rtol16;
    void (*visit)(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx);
    void *ctx;
} cgu_run_opts;

/* Plans the graph text; every group of the chosen kinds must generate,
 * deterministically; each kernel runs alone on OpenCL on the reference's
 * inputs and each output is compared with the reference. Returns the
 * number of kernels run. */
uint32_t cgu_run_groups(const char *text, const cgu_run_opts *o);

/* Plans the graph text and runs cgu_nvrtc_check for sm_80 and sm_90 on the
 * kernel of every group whose kind bit is set in kinds (1u << KF_GROUP_*);
 * each must generate. Returns how many kernels were checked. */
uint32_t cgu_nvrtc_check_text(const char *text, unsigned kinds);

/* fp32 absolute tolerance for a dot product of length K with operands in
 * [-1, 1): the reference accumulates in double, a kernel in float, so each
 * of the K additions may round by half an ulp of a partial sum of at most
 * K/4 in expectation; K * 2^-24 * sqrt(K) bounds that with margin for
 * random signs (at least DESIGN.md's 1e-5: it is 1e-5 or less up to
 * K = 128, 2e-4 at K = 1024). */
double cgu_dot_atol(int64_t K);

/* Runs x (built from m) `runs` times on fresh random inputs and asserts
 * every output matches the reference evaluator on m within DESIGN.md's
 * policy (kf_run_close). */
void cgu_exec_matches_ref(kf_exec *x, const kf_model *m, int runs);
/* The same at the whole-model check of a plan at precision prec (a
 * kf_precision: kf_run_close_model, as `kfuse run --check` judges; integer
 * outputs stay exact): for plans with long float dot products whose
 * results may cancel. prec < 0: kf_run_close. */
void cgu_exec_matches_ref_model(kf_exec *x, const kf_model *m, int runs, int prec);
/* The same, an output after a requantization of a computed value also
 * passing on its SQNR as `kfuse run --check` allows (kf_run_close_requant). */
void cgu_exec_matches_ref_requant(kf_exec *x, const kf_model *m, int runs, kf_precision prec);

/* Compiles m for OpenCL with the default options, checks it against the
 * reference `runs` times (cgu_exec_matches_ref) and returns its stats. */
kf_exec_stats cgu_opencl_matches_ref(const kf_model *m, int runs);

#endif
