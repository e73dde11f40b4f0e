/*
 * dtype_small.c: the element types narrower than 16 bits that ONNX added
 * for quantized and microscaled models: float8 (E4M3FN, E4M3FNUZ, E5M2,
 * E5M2FNUZ, E8M0), float6 (E2M3, E3M2), float4 (E2M1) and 4- and 2-bit
 * integers. In memory each element takes one byte (floats: their bit code;
 * integers: their value, sign-extended), so shapes, copies and data
 * movement work as for int8; files pack 4-bit types two to a byte, 2-bit
 * types four and 6-bit types four to three bytes, low bits first
 * (onnx.proto). Conversions follow the Cast specification and ONNX's
 * reference implementation (onnx/reference/ops/op_cast.py, ml_dtypes).
 * Part of graph/: the loader, the saver and Cast are built on these.
 */
#include <math.h>
#include <string.h>

#include "kf_tensor.h"

/* ---- formats --------------------------------------------------------------- */

/* A small float: 1 sign bit, ebits exponent bits with bias, mbits mantissa
 * bits. How its special values are spelled:
 *   FN   (E4M3FN):  no Inf; NaN is S.1111.111; -0 exists
 *   IEEE (E5M2):    Inf is S.11111.00, NaN S.11111.1x, as IEEE 754
 *   FNUZ:           no Inf, no -0; 0x80 (the "-0" code) is the only NaN
 *   NONE (float4/6): no Inf and no NaN; out of range saturates */
typedef enum { SF_FN, SF_IEEE, SF_FNUZ, SF_NONE } sf_kind;

typedef struct small_float {
    int bits, mbits, bias;
    sf_kind kind;
    double max; /* largest finite value */
} small_float;

static const small_float *float_format(kf_dtype dt) {
    static const small_float e4m3fn = {8, 3, 7, SF_FN, 448.0}, e4m3fnuz = {8, 3, 8, SF_FNUZ, 240.0},
                             e5m2 = {8, 2, 15, SF_IEEE, 57344.0}, e5m2fnuz = {8, 2, 16, SF_FNUZ, 57344.0},
                             e2m1 = {4, 1, 1, SF_NONE, 6.0}, e2m3 = {6, 3, 1, SF_NONE, 7.5},
                             e3m2 = {6, 2, 3, SF_NONE, 28.0};
    switch (dt) {
    case KF_DT_FLOAT8E4M3FN: return &e4m3fn;
    case KF_DT_FLOAT8E4M3FNUZ: return &e4m3fnuz;
    case KF_DT_FLOAT8E5M2: return &e5m2;
    case KF_DT_FLOAT8E5M2FNUZ: return &e5m2fnuz;
    case KF_DT_FLOAT4E2M1: return &e2m1;
    case KF_DT_FLOAT6E2M3: return &e2m3;
    case KF_DT_FLOAT6E3M2: return &e3m2;
    default: return NULL;
    }
}

int kf_dtype_bits(kf_dtype dt) {
    switch (dt) {
    case KF_DT_UINT4:
    case KF_DT_INT4:
    case KF_DT_FLOAT4E2M1: return 4;
    case KF_DT_UINT2:
    case KF_DT_INT2: return 2;
    case KF_DT_FLOAT6E2M3:
    case KF_DT_FLOAT6E3M2: return 6;
    default: return (int)kf_dtype_size(dt) * 8;
    }
}

bool kf_dtype_is_small(kf_dtype dt) { return dt >= KF_DT_FLOAT8E4M3FN && dt < KF_DT_COUNT_; }

bool kf_dtype_is_small_float(kf_dtype dt) { return float_format(dt) != NULL || dt == KF_DT_FLOAT8E8M0; }

size_t kf_dtype_packed_bytes(kf_dtype dt, int64_t numel) {
    int bits = kf_dtype_bits(dt);
    if (bits >= 8 || numel <= 0) return (size_t)(numel > 0 ? numel : 0) * (size_t)(bits / 8);
    return (size_t)(((uint64_t)numel * (uint64_t)bits + 7) / 8);
}

/* ---- packing ------------------------------------------------------------------ */

/* The file code of an in-memory element: its low `bits` bits. */
void kf_pack_small(kf_dtype dt, const uint8_t *mem, int64_t n, uint8_t *out) {
    int bits = kf_dtype_bits(dt);
    if (bits >= 8) {
        memcpy(out, mem, (size_t)n);
        return;
    }
    uint8_t mask = (uint8_t)((1u << bits) - 1);
    memset(out, 0, kf_dtype_packed_bytes(dt, n));
    /* an LSB-first bit stream; a 6-bit element may straddle two bytes */
    for (int64_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)i * (uint64_t)bits;
        unsigned v = (unsigned)(mem[i] & mask) << (bit % 8);
        out[bit / 8] |= (uint8_t)v;
        if (v >> 8) out[bit / 8 + 1] |= (uint8_t)(v >> 8);
    }
}

void kf_unpack_small(kf_dtype dt, const uint8_t *in, int64_t n, uint8_t *mem) {
    int bits = kf_dtype_bits(dt);
    if (bits >= 8) {
        memcpy(mem, in, (size_t)n);
        return;
    }
    unsigned mask = (1u << bits) - 1;
    bool sign = dt == KF_DT_INT4 || dt == KF_DT_INT2;
    size_t nbytes = kf_dtype_packed_bytes(dt, n);
    for (int64_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)i * (uint64_t)bits;
        unsigned v = in[bit / 8];
        if (bit / 8 + 1 < nbytes) v |= (unsigned)in[bit / 8 + 1] << 8;
        v = (v >> (bit % 8)) & mask;
        if (sign && (v >> (bits - 1))) v |= ~mask; /* sign-extend into the byte */
        mem[i] = (uint8_t)v;
    }
}

/* ---- decoding -------------------------------------------------------------------- */

double kf_small_to_f64(kf_dtype dt, uint8_t code) {
    switch (dt) {
    case KF_DT_INT4:
    case KF_DT_INT2: return (int8_t)code;
    case KF_DT_UINT4:
    case KF_DT_UINT2: return code;
    case KF_DT_FLOAT8E8M0: return code == 0xFF ? NAN : ldexp(1.0, (int)code - 127);
    default: break;
    }
    const small_float *f = float_format(dt);
    if (!f) return 0;
    unsigned sbit = 1u << (f->bits - 1), emask = (1u << (f->bits - 1 - f->mbits)) - 1;
    unsigned mant = code & ((1u << f->mbits) - 1), ex = (code >> f->mbits) & emask;
    bool neg = (code & sbit) != 0;
    if (f->kind == SF_FNUZ && code == sbit) return NAN;
    if (f->kind == SF_FN && ex == emask && mant == (1u << f->mbits) - 1) return neg ? -NAN : NAN;
    if (f->kind == SF_IEEE && ex == emask) return mant ? (neg ? -NAN : NAN) : (neg ? -INFINITY : INFINITY);
    double v = ex ? ldexp(1.0 + ldexp(mant, -f->mbits), (int)ex - f->bias) : ldexp(mant, 1 - f->bias - f->mbits);
    return neg ? -v : v;
}

/* ---- encoding ------------------------------------------------------------------------ */

static uint8_t encode_float(const small_float *f, double x, bool saturate) {
    uint8_t sbit = (uint8_t)(1u << (f->bits - 1));
    uint8_t maxcode = (uint8_t)(sbit - 1 - (f->kind == SF_FN)); /* S.1111.110 for FN; all ones otherwise */
    if (f->kind == SF_IEEE) maxcode = (uint8_t)(((sbit - 1) >> f->mbits << f->mbits) - 1); /* S.11110.11 */
    bool neg = signbit(x) != 0;
    if (isnan(x)) {
        switch (f->kind) {
        case SF_FN: return (uint8_t)(neg ? sbit | (sbit - 1) : sbit - 1);
        case SF_IEEE: return (uint8_t)((neg ? sbit : 0) | (((sbit - 1) >> f->mbits << f->mbits) | (1u << (f->mbits - 1))));
        case SF_FNUZ: return sbit;
        case SF_NONE: return neg ? 0 : sbit; /* as ml_dtypes, which ONNX's reference uses */
        }
    }
    uint8_t sign = neg ? sbit : 0;
    double a = fabs(x);
    if (!isinf(a) && a != 0) {
        int emin = 1 - f->bias;
        int e = ilogb(a);
        if (e < emin) e = emin;
        double q = ldexp(1.0, e - f->mbits);
        a = nearbyint(a / q) * q; /* round half to even (the default rounding mode) */
    }
    if (a > f->max) { /* Inf, or rounds past the largest finite value */
        if (saturate || f->kind == SF_NONE) return sign | maxcode;
        switch (f->kind) {
        case SF_FN: return sign | (uint8_t)(sbit - 1);
        case SF_IEEE: return sign | (uint8_t)((sbit - 1) >> f->mbits << f->mbits);
        default: return sbit; /* FNUZ: NaN */
        }
    }
    if (a == 0) return f->kind == SF_FNUZ ? 0 : sign;
    int emin = 1 - f->bias, e = ilogb(a);
    unsigned ex, mant;
    if (e < emin) {
        ex = 0;
        mant = (unsigned)ldexp(a, f->mbits - emin);
    } else {
        ex = (unsigned)(e + f->bias);
        mant = (unsigned)(ldexp(a, f->mbits - e) - (double)(1u << f->mbits));
    }
    return sign | (uint8_t)(ex << f->mbits | mant);
}

uint8_t kf_f32_to_e8m0(float x, bool saturate, kf_e8m0_round mode) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    unsigned ex = (b >> 23) & 0xFF;
    if (ex == 0xFF) return 0xFF; /* NaN and Inf */
    bool up = false;
    if (mode == KF_E8M0_NEAREST) {
        bool g = b & 0x400000, r = b & 0x200000, s = (b & 0x1FFFFF) != 0, lsb = ex > 0;
        up = g && (r || s || lsb);
    } else if (mode == KF_E8M0_UP) {
        up = (b & 0x7FFFFF) != 0;
    }
    if (up && saturate && ex == 0xFE) up = false;
    return (uint8_t)(ex + up); /* 0xFE + 1 is the NaN code, as the reference */
}

uint8_t kf_f64_to_small(kf_dtype dt, double x, bool saturate) {
    int lo = 0, hi = 0;
    switch (dt) {
    case KF_DT_INT4: lo = -8, hi = 7; break;
    case KF_DT_UINT4: lo = 0, hi = 15; break;
    case KF_DT_INT2: lo = -2, hi = 1; break;
    case KF_DT_UINT2: lo = 0, hi = 3; break;
    case KF_DT_FLOAT8E8M0: return kf_f32_to_e8m0((float)x, saturate, KF_E8M0_UP);
    default: {
        const small_float *f = float_format(dt);
        return f ? encode_float(f, x, saturate) : 0;
    }
    }
    /* out of range is undefined in the spec; ONNX's reference (ml_dtypes)
     * gives 0, and so does kfuse */
    double t = trunc(x);
    if (!(t >= lo && t <= hi)) return 0;
    return (uint8_t)(int8_t)t;
}

uint8_t kf_i64_to_small(kf_dtype dt, int64_t v) {
    int bits = kf_dtype_bits(dt);
    if (kf_dtype_is_small_float(dt)) return kf_f64_to_small(dt, (double)v, true);
    uint64_t mask = (1u << bits) - 1;
    uint64_t u = (uint64_t)v & mask; /* integers keep their low bits */
    if ((dt == KF_DT_INT4 || dt == KF_DT_INT2) && (u >> (bits - 1))) u |= ~mask;
    return (uint8_t)u;
}
