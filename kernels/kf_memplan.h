/*
 * kf_memplan.h: the plan's memory planner. Every intermediate that crosses
 * a group boundary gets a byte offset in one arena, allocated once per
 * compiled plan; values whose lifetimes (in plan steps) do not meet may
 * share bytes. The runtime (kernels/) binds group inputs and outputs to
 * arena + offset.
 */
#ifndef KF_MEMPLAN_H
#define KF_MEMPLAN_H

#include "kf_plan.h"

/* Offsets are rounded up to a multiple of this unless the caller asks for
 * more: CUDA's cudaMalloc returns 256-byte aligned memory and the widest
 * vector access a kernel makes (128-bit) needs 16, while OpenCL devices
 * report CL_DEVICE_MEM_BASE_ADDR_ALIGN (1024 bits = 128 bytes on PoCL, 4096
 * bits on some GPUs) for sub-buffers; 256 covers CUDA and common OpenCL. */
#define KF_MEMPLAN_ALIGN 256
/* Largest alignment accepted: OpenCL's base-address alignment is at most a
 * page on devices seen so far; more is a caller bug. */
#define KF_MEMPLAN_MAX_ALIGN 65536

typedef struct kf_memplan {
    int64_t *offset;          /* per value id (size nvalues+1): byte offset of the value in the
                                 arena, or -1 when it is not in the arena (weights/initializers,
                                 graph inputs, graph outputs, values produced and consumed inside
                                 one group, plan-time constants, string tensors, outputs nothing
                                 reads) */
    uint32_t nvalues;
    int64_t arena_bytes;      /* size of the arena */
    int64_t live_lower_bound; /* max over steps of the bytes live at that step: no packing can
                                 use less */
} kf_memplan;

/* Plans the arena of plan p over model m (the model p was built from, with
 * shapes inferred; neither is changed).
 *
 * Steps are p's groups in order. A value written by a group and read by
 * another group lives from its producer's step to the last step of a group
 * that reads it, both ends included (a kernel reads its inputs while it
 * writes its outputs, so nothing is done in place). Groups batched into one
 * launch run together: a value's lifetime is widened to the first and last
 * step of the launches that write and read it, which stays correct wherever
 * the runtime places a batched launch between its first and last group.
 *
 * View groups (kf_group.view: reshapes only, no kernel) alias: each output
 * of a view group gets the offset of the value it reshapes (followed
 * through chains of views), and that value stays alive until the last
 * reader of any of its views. The runtime binds a view's output to the same
 * bytes and does not copy. A view that is a graph output gets -1 (the
 * runtime copies it into the caller's output); a view of a value that is
 * not in the arena (a graph input, a weight) gets -1 too.
 *
 * Packing is greedy by size with best fit (as TFLite's and ONNX Runtime's
 * arena planners do): values sorted by size, largest first; each goes into
 * the smallest gap, among the values already placed whose lifetimes meet
 * its own, that holds it at an offset aligned to `align`, else after the
 * last of them. Cost O(n^2) time and O(n + steps) memory for n arena values.
 * Deterministic: ties are broken by first step, then value id.
 *
 * align: a power of two from 1 to KF_MEMPLAN_MAX_ALIGN; every offset is a
 * multiple of it (pass KF_MEMPLAN_ALIGN unless the device asks for more).
 *
 * On success *out is filled and owned by the caller (kf_memplan_release);
 * arena_bytes >= live_lower_bound always. Errors: KF_ERR_SHAPE naming the
 * first arena value whose size is unknown (symbolic or unknown dims, unknown
 * dtype: specialise shapes first), KF_ERR_INVALID_ARG (bad align, NULL
 * arguments, a plan that does not match the model), KF_ERR_NOMEM. On
 * failure *out is left empty (offset NULL). */
kf_status kf_memplan_build(const kf_model *m, const kf_plan *p, int64_t align, kf_memplan *out);

/* Frees the offsets and leaves mp empty; NULL or an empty plan is fine. */
void kf_memplan_release(kf_memplan *mp);

#endif
