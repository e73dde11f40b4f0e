/*
 * cg_util.h: helpers the codegen tests share (test_cg.c, test_cg_anchor.c):
 * a default plan, every value's reference tensor, the OpenCL skip, and the
 * NVRTC compile check with its zero-spill assertion.
 */
#ifndef KF_CG_UTIL_H
#define KF_CG_UTIL_H

#include "graph_text.h"
#include "kf_kernels.h"

/* The default plan of m (fusion on, no fuel limit); asserts it builds. */
kf_plan *cgu_plan(kf_model *m);

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

#endif
