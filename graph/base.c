/*
 * base.c: error reporting, the assertion hook and allocation wrappers that
 * every other file uses. The last-error message is thread-local so
 * concurrent users of the library never see each other's messages.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_base.h"

/* Long enough for a node name, a tensor name and a compiler log line. */
#define KF_ERROR_MAX 4096

static _Thread_local char last_error[KF_ERROR_MAX];

kf_status kf_fail(kf_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

kf_status kf_fail_context(kf_status code, const char *fmt, ...) {
    char prefix[KF_ERROR_MAX];
    char old[KF_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof last_error - 3) n = sizeof last_error - 3;
    memcpy(last_error, prefix, n);
    memcpy(last_error + n, ": ", 2);
    size_t m = strlen(old);
    if (m > sizeof last_error - n - 3) m = sizeof last_error - n - 3;
    memcpy(last_error + n + 2, old, m);
    last_error[n + 2 + m] = 0;
    return code;
}

void kf_clear_error(void) { last_error[0] = 0; }

const char *kf_last_error(void) { return last_error; }

const char *kf_status_name(kf_status s) {
    switch (s) {
    case KF_OK: return "ok";
    case KF_ERR_INVALID_ARG: return "invalid argument";
    case KF_ERR_BAD_MODEL: return "bad model";
    case KF_ERR_UNSUPPORTED: return "unsupported";
    case KF_ERR_SHAPE: return "shape error";
    case KF_ERR_NOMEM: return "out of memory";
    case KF_ERR_IO: return "i/o error";
    case KF_ERR_RUNTIME: return "runtime error";
    case KF_ERR_NO_DEVICE: return "no device";
    case KF_ERR_COMPILE: return "compile error";
    case KF_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *kf_version(void) { return "0.1.0"; }

static void default_assert_hook(const char *file, int line, const char *msg) {
    fprintf(stderr, "kfuse: internal error at %s:%d: %s\n", file, line, msg);
    abort();
}

static kf_assert_hook assert_hook = default_assert_hook;

void kf_set_assert_hook(kf_assert_hook hook) { assert_hook = hook ? hook : default_assert_hook; }

void kf_assert_fail(const char *file, int line, const char *msg) { assert_hook(file, line, msg); }

/* ---- allocation -------------------------------------------------------- */

/* Fault injection for tests (kf_alloc_fault_*). Per thread, so one test
 * thread failing its allocations never disturbs another; all zero (off)
 * until a test arms it, which costs one thread-local load per allocation. */
static _Thread_local uint64_t fault_count; /* allocations since arming */
static _Thread_local uint64_t fault_at;    /* 1-based call to fail; 0 off */
static _Thread_local bool fault_sticky;    /* fail every call from fault_at on */
static _Thread_local bool fault_fired;
static _Thread_local void (*fault_hook)(uint64_t nth);

static bool fault_now(void) {
    if (!fault_at) return false;
    uint64_t k = ++fault_count;
    if (k == fault_at || (fault_sticky && k > fault_at)) {
        fault_fired = true;
        if (fault_hook) fault_hook(k);
        return true;
    }
    return false;
}

void kf_alloc_fault_set(uint64_t nth, bool sticky) {
    fault_count = 0;
    fault_at = nth;
    fault_sticky = sticky;
    fault_fired = false;
}

void kf_alloc_fault_hook(void (*fn)(uint64_t nth)) { fault_hook = fn; }

uint64_t kf_alloc_fault_count(void) { return fault_count; }

bool kf_alloc_fault_fired(void) { return fault_fired; }

void *kf_malloc(size_t n) { return fault_now() ? NULL : malloc(n ? n : 1); }

void *kf_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    if (fault_now()) return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *kf_realloc(void *p, size_t n) { return fault_now() ? NULL : realloc(p, n ? n : 1); }

void kf_free(void *p) { free(p); }

char *kf_strndup(const char *s, size_t n) {
    char *r = kf_malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

char *kf_strdup(const char *s) { return s ? kf_strndup(s, strlen(s)) : NULL; }

kf_status kf_grow(void **arr, uint32_t *cap, uint32_t need, size_t esz) {
    if (need <= *cap) return KF_OK;
    uint64_t ncap = *cap ? *cap : 8;
    while (ncap < need) ncap *= 2;
    if (ncap > UINT32_MAX || ncap > SIZE_MAX / esz)
        return kf_fail(KF_ERR_NOMEM, "array of %u elements is too large", need);
    void *p = kf_realloc(*arr, (size_t)ncap * esz);
    if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory growing an array to %u elements", need);
    memset((char *)p + (size_t)*cap * esz, 0, (size_t)(ncap - *cap) * esz);
    *arr = p;
    *cap = (uint32_t)ncap;
    return KF_OK;
}
