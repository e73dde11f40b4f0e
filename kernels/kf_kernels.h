/*
 * kf_kernels.h: compiling and running the kernels codegen/ writes. This
 * slice: OpenCL (any ICD; PoCL on the CPU in CI) compiles and runs one
 * kernel on host tensors, and NVRTC compiles the CUDA text for an arch and
 * reports ptxas' register and spill figures. Nothing here needs a GPU to
 * build; a backend compiled out or without a device says so in a reason.
 */
#ifndef KF_KERNELS_H
#define KF_KERNELS_H

#include "kf_codegen.h"

/* Work-items launched at most: the grid-stride loop covers the rest. 65536
 * fills every CPU core and an H100's 132 SMs x 2048 threads within 4x while
 * keeping per-item loops long enough to hide the launch. */
#define KF_CL_MAX_GLOBAL 65536

/* NULL when OpenCL can run kernels here (a platform with a device), else a
 * static reason ("kfuse was built without OpenCL", "no OpenCL platform").
 * Only decides skipping tests and backend choice; never affects results. */
const char *kf_cl_unavailable(void);

/* Builds k's OpenCL source (prelude + body) and runs it once.
 *   in[i]   host tensors matching k->ins[i] (dtype and dims), i < k->nins
 *   out[j]  j < k->nouts: released, then allocated with k->outs[j]'s dtype
 *           and dims and filled; the caller owns them afterwards
 * Errors: KF_ERR_COMPILE with the build log in the message, KF_ERR_NO_DEVICE,
 * KF_ERR_INVALID_ARG (tensor does not match its parameter), KF_ERR_RUNTIME
 * (an OpenCL call failed, its code named), KF_ERR_NOMEM. */
kf_status kf_cl_run_kernel(const kf_cg_kernel *k, const kf_tensor *const *in, kf_tensor *out);

/* What NVRTC + ptxas said about one compile. */
typedef struct kf_nvrtc_report {
    size_t binary_bytes;    /* CUBIN size */
    int registers;          /* -1 when ptxas printed no figures */
    int64_t spill_stores;   /* bytes; -1 when not reported */
    int64_t spill_loads;
    char log[2048];         /* the compile log, cut short (2 KiB holds ptxas -v for a few kernels) */
} kf_nvrtc_report;

/* NULL when NVRTC is linked and usable, else a static reason. */
const char *kf_nvrtc_unavailable(void);

/* Compiles CUDA source src (kernel text with the CUDA prelude) for arch
 * ("sm_80", "sm_90") to CUBIN with ptxas -v and fills r. Needs no GPU.
 * Errors: KF_ERR_COMPILE with the log, KF_ERR_NO_DEVICE when NVRTC is
 * compiled out, KF_ERR_NOMEM. */
kf_status kf_nvrtc_compile(const char *src, const char *arch, kf_nvrtc_report *r);

#endif
