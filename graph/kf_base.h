/*
 * kf_base.h: the few things every part of kfuse shares: status codes, the
 * thread-local error message, assertions for our own bugs, named limits and
 * overflow-checked arithmetic for anything derived from untrusted input.
 * Everything here is internal; the public header re-exports only kf_status.
 */
#ifndef KF_BASE_H
#define KF_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kfuse/kfuse.h"

/* ---- limits (each says why it has its value) ------------------------- */

/* ONNX sets no bound on rank; 16 covers every exporter we have seen and
 * lets shape records live on the stack. A deeper tensor is a typed error. */
#define KF_MAX_RANK 16
/* One tensor may not exceed 16 GiB: the largest single weight of a real
 * model is far below, and a hostile dim product must not become a malloc. */
#define KF_MAX_TENSOR_BYTES ((int64_t)16 << 30)
/* Subgraph (If/Loop/Scan) nesting accepted before protobuf-c unpacks, since
 * its unpacker recurses without limit. */
#define KF_MAX_PROTO_DEPTH 64

/* ---- errors ----------------------------------------------------------- */

/* Sets the thread-local last-error message (printf-style) and returns code,
 * so a failing path reads `return kf_fail(KF_ERR_SHAPE, "node '%s': ...")`. */
kf_status kf_fail(kf_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prefixes the current message with more context ("while loading X: ..."). */
kf_status kf_fail_context(kf_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void kf_clear_error(void);

/* Our own bug: report file and line through the replaceable hook. */
void kf_assert_fail(const char *file, int line, const char *msg);
#define KF_ASSERT(cond)                                                        \
    do {                                                                       \
        if (!(cond)) kf_assert_fail(__FILE__, __LINE__, #cond);                \
    } while (0)

/* Propagate a failing status. */
#define KF_TRY(expr)                                                           \
    do {                                                                       \
        kf_status kf_try_s_ = (expr);                                          \
        if (kf_try_s_ != KF_OK) return kf_try_s_;                              \
    } while (0)

/* ---- checked arithmetic on sizes from files -------------------------- */

/* *r = a * b; returns false (r untouched) on overflow or negative operand. */
static inline bool kf_mul_ok(int64_t a, int64_t b, int64_t *r) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *r = a * b;
    return true;
}
/* True when the known (>= 0) dims multiply within int64 with every 0
 * counted as 1: an empty tensor's strides are still products of its other
 * dims, and every stride loop of the evaluator and codegen relies on this
 * (fuzz findings: [0, 2^33, 2^34] passed a plain element count of 0).
 * Shapes from files pass this at load, inference and allocation. */
static inline bool kf_dims_fit(int rank, const int64_t *dims) {
    int64_t p = 1;
    for (int d = 0; d < rank; d++)
        if (dims[d] > 0 && !kf_mul_ok(p, dims[d], &p)) return false;
    return true;
}
static inline bool kf_add_ok(int64_t a, int64_t b, int64_t *r) {
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return false;
    *r = a + b;
    return true;
}

/* Allocation wrappers: NULL on failure or size overflow (never abort). The
 * fault-injection tests hook these. kf_calloc zero-fills. */
void *kf_malloc(size_t n);
void *kf_calloc(size_t count, size_t size);
void *kf_realloc(void *p, size_t n);
void kf_free(void *p);
char *kf_strdup(const char *s);
char *kf_strndup(const char *s, size_t n);
/* Grows *arr (element size esz) so it holds at least need elements. */
kf_status kf_grow(void **arr, uint32_t *cap, uint32_t need, size_t esz);

/* Fault injection, for tests only (internal like everything here, so not
 * exported from libkfuse.so). Arms this thread's allocation counter: the
 * nth kf_malloc/kf_calloc/kf_realloc call from now returns NULL (and, when
 * sticky, every call after it too); nth = 0 turns it off. Other threads are
 * never affected. kf_alloc_fault_count: calls counted since arming;
 * kf_alloc_fault_fired: whether a failure was injected. */
void kf_alloc_fault_set(uint64_t nth, bool sticky);
uint64_t kf_alloc_fault_count(void);
/* Called (this thread) with the call's number each time a failure is
 * injected, e.g. to print where; NULL removes it. */
void kf_alloc_fault_hook(void (*fn)(uint64_t nth));
bool kf_alloc_fault_fired(void);

#endif
