/*
 * tensor.c: dtype facts, tensor allocation and copying, element access
 * through double/int64 for the reference kernels, and half/bfloat16
 * conversion. Everything the evaluator stores passes through here.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__unix__)
#include <sys/mman.h>
#endif

#include "kf_tensor.h"
#include "kf_extdata.h"

static const struct {
    const char *name;
    size_t size;
} dtype_facts[KF_DT_COUNT_] = {
    [KF_DT_UNDEFINED] = {"undefined", 0}, [KF_DT_FLOAT] = {"float", 4},
    [KF_DT_UINT8] = {"uint8", 1},         [KF_DT_INT8] = {"int8", 1},
    [KF_DT_UINT16] = {"uint16", 2},       [KF_DT_INT16] = {"int16", 2},
    [KF_DT_INT32] = {"int32", 4},         [KF_DT_INT64] = {"int64", 8},
    [KF_DT_STRING] = {"string", sizeof(kf_bytes)},
    [KF_DT_BOOL] = {"bool", 1},           [KF_DT_FLOAT16] = {"float16", 2},
    [KF_DT_DOUBLE] = {"double", 8},       [KF_DT_UINT32] = {"uint32", 4},
    [KF_DT_UINT64] = {"uint64", 8},       [KF_DT_COMPLEX64] = {"complex64", 8},
    [KF_DT_COMPLEX128] = {"complex128", 16}, [KF_DT_BFLOAT16] = {"bfloat16", 2},
    [KF_DT_FLOAT8E4M3FN] = {"float8e4m3fn", 1}, [KF_DT_FLOAT8E4M3FNUZ] = {"float8e4m3fnuz", 1},
    [KF_DT_FLOAT8E5M2] = {"float8e5m2", 1},     [KF_DT_FLOAT8E5M2FNUZ] = {"float8e5m2fnuz", 1},
    [KF_DT_UINT4] = {"uint4", 1},               [KF_DT_INT4] = {"int4", 1},
    [KF_DT_FLOAT4E2M1] = {"float4e2m1", 1},     [KF_DT_FLOAT8E8M0] = {"float8e8m0", 1},
    [KF_DT_UINT2] = {"uint2", 1},               [KF_DT_INT2] = {"int2", 1},
    [KF_DT_FLOAT6E2M3] = {"float6e2m3", 1},     [KF_DT_FLOAT6E3M2] = {"float6e3m2", 1},
};

bool kf_dtype_valid(int dt) { return dt > 0 && dt < KF_DT_COUNT_; }

size_t kf_dtype_size(kf_dtype dt) { return kf_dtype_valid(dt) ? dtype_facts[dt].size : 0; }

const char *kf_dtype_name(kf_dtype dt) {
    return (dt >= 0 && dt < KF_DT_COUNT_) ? dtype_facts[dt].name : "?";
}

bool kf_dtype_is_float(kf_dtype dt) {
    return dt == KF_DT_FLOAT || dt == KF_DT_DOUBLE || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16;
}

bool kf_dtype_is_signed(kf_dtype dt) {
    return dt == KF_DT_INT8 || dt == KF_DT_INT16 || dt == KF_DT_INT32 || dt == KF_DT_INT64;
}

bool kf_dtype_is_int(kf_dtype dt) {
    return kf_dtype_is_signed(dt) || dt == KF_DT_UINT8 || dt == KF_DT_UINT16 ||
           dt == KF_DT_UINT32 || dt == KF_DT_UINT64;
}

kf_status kf_shape_numel(int rank, const int64_t *dims, size_t esz, int64_t *numel) {
    if (rank < 0 || rank > KF_MAX_RANK)
        return kf_fail(KF_ERR_BAD_MODEL, "rank %d is outside 0..%d", rank, KF_MAX_RANK);
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0) return kf_fail(KF_ERR_BAD_MODEL, "negative dimension %lld", (long long)dims[i]);
        if (!kf_mul_ok(n, dims[i], &n))
            return kf_fail(KF_ERR_BAD_MODEL, "dimension product overflows");
    }
    if (!kf_dims_fit(rank, dims)) return kf_fail(KF_ERR_BAD_MODEL, "dimension product overflows (an empty tensor's other dims)");
    int64_t bytes;
    if (!kf_mul_ok(n, (int64_t)(esz ? esz : 1), &bytes) || bytes > KF_MAX_TENSOR_BYTES)
        return kf_fail(KF_ERR_BAD_MODEL, "tensor of %lld elements exceeds the %lld-byte limit",
                       (long long)n, (long long)KF_MAX_TENSOR_BYTES);
    *numel = n;
    return KF_OK;
}

/* Weights are written once, whole, right after they are allocated (a load,
 * a fold, a merge). Asked for 2 MiB pages, the kernel faults a large one in
 * 512 times less often than in 4 KiB pages, and those faults were half of
 * merging BERT-base's Q/K/V weights. Only a hint: where transparent huge
 * pages are off, or the region is not fresh, nothing changes. */
#define HUGE_PAGE ((uintptr_t)2 << 20)
void kf_advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    if (bytes < 2 * HUGE_PAGE) return;
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

kf_status kf_tensor_alloc(kf_tensor *t, kf_dtype dt, int rank, const int64_t *dims) {
    kf_tensor_release(t);
    if (!kf_dtype_valid(dt)) return kf_fail(KF_ERR_BAD_MODEL, "unknown dtype %d", (int)dt);
    int64_t n;
    size_t esz = kf_dtype_size(dt);
    KF_TRY(kf_shape_numel(rank, dims, esz, &n));
    void *data = kf_calloc((size_t)n, esz);
    if (!data) return kf_fail(KF_ERR_NOMEM, "out of memory for a tensor of %lld elements", (long long)n);
    kf_advise_huge(data, (size_t)n * esz);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->numel = n;
    t->data = data;
    return KF_OK;
}

void kf_tensor_release(kf_tensor *t) {
    if (!t) return;
    if (t->dtype == KF_DT_STRING && t->data) {
        kf_bytes *s = t->data;
        for (int64_t i = 0; i < t->numel; i++) kf_free(s[i].ptr);
    }
    if (!kf_extdata_mapped(t->data)) kf_free(t->data); /* mapped data belongs to its model */
    kf_tensor_parts_release(t->parts);
    memset(t, 0, sizeof *t);
}

static bool copy_run(void *ctx, const void *p, size_t n) {
    char **at = ctx;
    memcpy(*at, p, n);
    *at += n;
    return true;
}

kf_status kf_tensor_copy(kf_tensor *dst, const kf_tensor *src) {
    if (dst == src) return KF_OK;
    KF_TRY(kf_tensor_alloc(dst, src->dtype, src->rank, src->dims));
    if (src->dtype == KF_DT_STRING) {
        const kf_bytes *s = src->data;
        kf_bytes *d = dst->data;
        for (int64_t i = 0; i < src->numel; i++) {
            d[i].ptr = kf_strndup(s[i].ptr ? s[i].ptr : "", s[i].len);
            if (!d[i].ptr) {
                kf_tensor_release(dst);
                return kf_fail(KF_ERR_NOMEM, "out of memory copying strings");
            }
            d[i].len = s[i].len;
        }
    } else if (src->numel) {
        char *at = dst->data;
        kf_tensor_visit_bytes(src, copy_run, &at);
    }
    return KF_OK;
}

kf_tensor *kf_tensor_new(void) { return kf_calloc(1, sizeof(kf_tensor)); }

void kf_tensor_free(kf_tensor *t) {
    if (!t) return;
    kf_tensor_release(t);
    kf_free(t);
}

void kf_tensor_move(kf_tensor *dst, kf_tensor *src) {
    if (dst == src) return;
    kf_tensor_release(dst);
    *dst = *src;
    memset(src, 0, sizeof *src);
}

/* ---- half / bfloat16 --------------------------------------------------- */

float kf_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kf_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (man ? 0x200 : 0); /* Inf / NaN */
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00; /* overflow -> Inf */
    if (e <= 0) {                        /* subnormal or zero */
        if (e < -10) return sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return sign | (uint16_t)half;
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into Inf: correct */
    return sign | (uint16_t)half;
}

float kf_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kf_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;
    return (uint16_t)(x >> 16);
}

/* ---- element access ---------------------------------------------------- */

double kf_get_f64(const kf_tensor *t, int64_t i) {
    if (t->parts) {
        int64_t j;
        const kf_tensor *p = kf_tensor_part_at(t, i, &j);
        return kf_get_f64(p, j);
    }
    const void *d = t->data;
    switch (t->dtype) {
    case KF_DT_FLOAT: return ((const float *)d)[i];
    case KF_DT_DOUBLE: return ((const double *)d)[i];
    case KF_DT_FLOAT16: return kf_half_to_float(((const uint16_t *)d)[i]);
    case KF_DT_BFLOAT16: return kf_bf16_to_float(((const uint16_t *)d)[i]);
    case KF_DT_INT8: return ((const int8_t *)d)[i];
    case KF_DT_INT16: return ((const int16_t *)d)[i];
    case KF_DT_INT32: return ((const int32_t *)d)[i];
    case KF_DT_INT64: return (double)((const int64_t *)d)[i];
    case KF_DT_UINT8: return ((const uint8_t *)d)[i];
    case KF_DT_UINT16: return ((const uint16_t *)d)[i];
    case KF_DT_UINT32: return ((const uint32_t *)d)[i];
    case KF_DT_UINT64: return (double)((const uint64_t *)d)[i];
    case KF_DT_BOOL: return ((const uint8_t *)d)[i] != 0;
    default: return kf_dtype_is_small(t->dtype) ? kf_small_to_f64(t->dtype, ((const uint8_t *)d)[i]) : 0;
    }
}

int64_t kf_get_i64(const kf_tensor *t, int64_t i) {
    if (t->parts) {
        int64_t j;
        const kf_tensor *p = kf_tensor_part_at(t, i, &j);
        return kf_get_i64(p, j);
    }
    const void *d = t->data;
    switch (t->dtype) {
    case KF_DT_INT8: return ((const int8_t *)d)[i];
    case KF_DT_INT16: return ((const int16_t *)d)[i];
    case KF_DT_INT32: return ((const int32_t *)d)[i];
    case KF_DT_INT64: return ((const int64_t *)d)[i];
    case KF_DT_UINT8: return ((const uint8_t *)d)[i];
    case KF_DT_UINT16: return ((const uint16_t *)d)[i];
    case KF_DT_UINT32: return ((const uint32_t *)d)[i];
    case KF_DT_UINT64: return (int64_t)((const uint64_t *)d)[i];
    case KF_DT_BOOL: return ((const uint8_t *)d)[i] != 0;
    default: {
        double v = kf_get_f64(t, i);
        if (isnan(v)) return 0;
        if (v >= 9.2233720368547758e18) return INT64_MAX;
        if (v <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

uint64_t kf_get_u64(const kf_tensor *t, int64_t i) {
    if (t->dtype == KF_DT_UINT64 && !t->parts) return ((const uint64_t *)t->data)[i];
    return (uint64_t)kf_get_i64(t, i);
}

/* Saturating double -> integer conversion: C leaves out-of-range casts
 * undefined, and the sanitizer build must stay clean. */
static int64_t sat_i64(double v, double lo, double hi) {
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

void kf_set_f64(kf_tensor *t, int64_t i, double v) {
    void *d = t->data;
    switch (t->dtype) {
    case KF_DT_FLOAT: ((float *)d)[i] = (float)v; break;
    case KF_DT_DOUBLE: ((double *)d)[i] = v; break;
    case KF_DT_FLOAT16: ((uint16_t *)d)[i] = kf_float_to_half((float)v); break;
    case KF_DT_BFLOAT16: ((uint16_t *)d)[i] = kf_float_to_bf16((float)v); break;
    case KF_DT_INT8: ((int8_t *)d)[i] = (int8_t)sat_i64(v, -128, 127); break;
    case KF_DT_INT16: ((int16_t *)d)[i] = (int16_t)sat_i64(v, -32768, 32767); break;
    case KF_DT_INT32: ((int32_t *)d)[i] = (int32_t)sat_i64(v, -2147483648.0, 2147483647.0); break;
    case KF_DT_INT64:
        if (isnan(v)) ((int64_t *)d)[i] = 0;
        else if (v >= 9.2233720368547758e18) ((int64_t *)d)[i] = INT64_MAX;
        else if (v <= -9.2233720368547758e18) ((int64_t *)d)[i] = INT64_MIN;
        else ((int64_t *)d)[i] = (int64_t)v;
        break;
    case KF_DT_UINT8: ((uint8_t *)d)[i] = (uint8_t)sat_i64(v, 0, 255); break;
    case KF_DT_UINT16: ((uint16_t *)d)[i] = (uint16_t)sat_i64(v, 0, 65535); break;
    case KF_DT_UINT32: ((uint32_t *)d)[i] = (uint32_t)sat_i64(v, 0, 4294967295.0); break;
    case KF_DT_UINT64:
        if (isnan(v) || v <= 0) ((uint64_t *)d)[i] = 0;
        else if (v >= 1.8446744073709552e19) ((uint64_t *)d)[i] = UINT64_MAX;
        else ((uint64_t *)d)[i] = (uint64_t)v;
        break;
    case KF_DT_BOOL: ((uint8_t *)d)[i] = v != 0; break;
    default:
        if (kf_dtype_is_small(t->dtype)) ((uint8_t *)d)[i] = kf_f64_to_small(t->dtype, v, true);
        break;
    }
}

void kf_set_i64(kf_tensor *t, int64_t i, int64_t v) {
    void *d = t->data;
    switch (t->dtype) {
    case KF_DT_INT8: ((int8_t *)d)[i] = (int8_t)v; break;
    case KF_DT_INT16: ((int16_t *)d)[i] = (int16_t)v; break;
    case KF_DT_INT32: ((int32_t *)d)[i] = (int32_t)v; break;
    case KF_DT_INT64: ((int64_t *)d)[i] = v; break;
    case KF_DT_UINT8: ((uint8_t *)d)[i] = (uint8_t)v; break;
    case KF_DT_UINT16: ((uint16_t *)d)[i] = (uint16_t)v; break;
    case KF_DT_UINT32: ((uint32_t *)d)[i] = (uint32_t)v; break;
    case KF_DT_UINT64: ((uint64_t *)d)[i] = (uint64_t)v; break;
    case KF_DT_BOOL: ((uint8_t *)d)[i] = v != 0; break;
    default:
        if (kf_dtype_is_small(t->dtype) && !kf_dtype_is_small_float(t->dtype)) ((uint8_t *)d)[i] = kf_i64_to_small(t->dtype, v);
        else kf_set_f64(t, i, (double)v);
        break;
    }
}

void kf_set_u64(kf_tensor *t, int64_t i, uint64_t v) {
    if (t->dtype == KF_DT_UINT64) ((uint64_t *)t->data)[i] = v;
    else if (kf_dtype_is_float(t->dtype)) kf_set_f64(t, i, (double)v);
    else kf_set_i64(t, i, (int64_t)v);
}

void kf_strides(int rank, const int64_t *dims, int64_t *strides) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= dims[i];
    }
}

void kf_type_unknown(kf_type *ty) {
    memset(ty, 0, sizeof *ty);
    ty->rank = -1;
    for (int i = 0; i < KF_MAX_RANK; i++) ty->dims[i] = -1; /* a rank set later leaves dims unknown */
}

void kf_type_of_tensor(kf_type *ty, const kf_tensor *t) {
    memset(ty, 0, sizeof *ty);
    ty->dtype = t->dtype;
    ty->rank = t->rank;
    for (int i = 0; i < t->rank; i++) ty->dims[i] = t->dims[i];
}

bool kf_type_is_static(const kf_type *ty) {
    if (ty->rank < 0) return false;
    for (int i = 0; i < ty->rank; i++)
        if (ty->dims[i] < 0) return false;
    return true;
}

bool kf_type_same_shape(const kf_type *a, const kf_type *b) {
    if (a->rank < 0 || a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++) {
        if (a->dims[d] >= 0 || b->dims[d] >= 0) {
            if (a->dims[d] != b->dims[d]) return false;
        } else if (!a->syms[d] || a->syms[d] != b->syms[d]) {
            return false;
        }
    }
    return true;
}

/* Element i's bytes, deferred or not. */
static const void *elem_at(const kf_tensor *t, int64_t i, size_t esz) {
    if (t->parts) t = kf_tensor_part_at(t, i, &i);
    return (const char *)t->data + (size_t)i * esz;
}

bool kf_tensor_equal(const kf_tensor *a, const kf_tensor *b) {
    if (a->dtype != b->dtype || a->rank != b->rank || a->numel != b->numel) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    if (a->dtype == KF_DT_STRING) {
        const kf_bytes *x = a->data, *y = b->data;
        for (int64_t i = 0; i < a->numel; i++)
            if (x[i].len != y[i].len || (x[i].len && memcmp(x[i].ptr, y[i].ptr, x[i].len)))
                return false;
        return true;
    }
    size_t esz = kf_dtype_size(a->dtype);
    if (a->parts || b->parts) { /* rare: tests, and tensors no pass compares in bulk */
        for (int64_t i = 0; i < a->numel; i++)
            if (memcmp(elem_at(a, i, esz), elem_at(b, i, esz), esz)) return false;
        return true;
    }
    return a->numel == 0 || memcmp(a->data, b->data, (size_t)a->numel * esz) == 0;
}
