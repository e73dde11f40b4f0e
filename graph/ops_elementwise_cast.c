/*
 * ops_elementwise_cast.c: Cast and CastLike for every pair of kfuse dtypes.
 * Numbers convert as numpy's astype does (float->int truncates, saturating
 * instead of undefined; int->int wraps; every float result is rounded once);
 * strings are parsed and printed the way numpy prints them ("0.1", "1e-05",
 * "nan", "-inf", "True"), so a string round trip keeps every value. The
 * float8/float6/float4/int4/int2 storage types convert as the Cast spec
 * says (saturate, round_mode; graph/dtype_small.c). BitCast (opset 26)
 * keeps the bits instead.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ops_elementwise.h"

/* ---- the target dtype ------------------------------------------------------ */

/* Cast-1 spells `to` as a TensorProto name ("FLOAT"); later versions as an int. */
static int dtype_from_name(const char *s) {
    for (int dt = 1; dt < KF_DT_COUNT_; dt++)
        if (strcasecmp(s, kf_dtype_name((kf_dtype)dt)) == 0) return dt;
    return -1;
}

/* Target dtype of a Cast (`to`) or CastLike (input 1's dtype, 0 = unknown).
 * Also validates `saturate` (float8 targets) and `round_mode` (E8M0). */
static kf_status cast_target(const kf_node *n, kf_dtype like, kf_dtype *out) {
    const kf_attr *sat = kf_attr_find(n, "saturate");
    if (sat && (sat->type != KF_ATTR_INT || (sat->i != 0 && sat->i != 1)))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute 'saturate' must be 0 or 1",
                       kf_node_label(n), n->op_type);
    const kf_attr *rm = kf_attr_find(n, "round_mode");
    if (rm && (rm->type != KF_ATTR_STRING || !rm->s.ptr ||
               (strcmp(rm->s.ptr, "up") && strcmp(rm->s.ptr, "down") && strcmp(rm->s.ptr, "nearest"))))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute 'round_mode' must be \"up\", \"down\" or \"nearest\"",
                       kf_node_label(n), n->op_type);
    int64_t to;
    if (n->op == KF_OP_CAST_LIKE) {
        to = like;
        if (!to) {
            *out = KF_DT_UNDEFINED;
            return KF_OK;
        }
    } else {
        const kf_attr *a = kf_attr_find(n, "to");
        if (!a)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute 'to' is required",
                           kf_node_label(n), n->op_type);
        if (a->type == KF_ATTR_INT) to = a->i;
        else if (a->type == KF_ATTR_STRING) to = dtype_from_name(a->s.ptr ? a->s.ptr : "");
        else
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute 'to' must be an int",
                           kf_node_label(n), n->op_type);
    }
    if (!kf_dtype_valid((int)to) || to == KF_DT_COMPLEX64 || to == KF_DT_COMPLEX128)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): cannot cast to dtype %lld",
                       kf_node_label(n), n->op_type, (long long)to);
    *out = (kf_dtype)to;
    return KF_OK;
}

static kf_status check_source(const kf_node *n, kf_dtype dt) {
    if (dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): cannot cast from %s", kf_node_label(n),
                       n->op_type, kf_dtype_name(dt));
    return KF_OK;
}

kf_status kf_ew_shape_cast(const kf_node *n, int nin, const kf_type *const *in,
                           const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nout < 1) return KF_OK;
    kf_dtype to;
    KF_TRY(cast_target(n, nin > 1 && in[1] ? in[1]->dtype : KF_DT_UNDEFINED, &to));
    if (nin > 0 && in[0]) {
        if (in[0]->dtype) KF_TRY(check_source(n, in[0]->dtype));
        out[0] = *in[0];
    }
    out[0].dtype = to;
    return KF_OK;
}

/* ---- numbers to strings ------------------------------------------------------ */

/* Does decimal text s read back as v in dtype dt? */
static bool round_trips(const char *s, double v, kf_dtype dt) {
    switch (dt) {
    case KF_DT_FLOAT: return strtof(s, NULL) == (float)v;
    case KF_DT_FLOAT16:
    case KF_DT_BFLOAT16: return kf_ew_narrow16(strtod(s, NULL), dt) == kf_ew_narrow16(v, dt);
    default: return strtod(s, NULL) == v;
    }
}

/* numpy's text for a float of dtype dt: the shortest digits that read back
 * as the same value, positional for 1e-4 <= |v| < a per-dtype bound (1e16
 * for double, 1e6 float/bfloat16, 1e3 float16), else d.ddde+XX. */
static void format_float(double v, kf_dtype dt, char *out, size_t cap) {
    if (isnan(v)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "inf" : "-inf");
        return;
    }
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        if (round_trips(tmp, v, dt)) break;
    }
    /* tmp is [-]d[.ddd]e(+|-)XX */
    char digits[32];
    int nd = 0;
    const char *c = tmp;
    if (*c == '-') c++;
    for (; *c && *c != 'e'; c++)
        if (isdigit((unsigned char)*c) && nd < (int)sizeof digits - 1) digits[nd++] = *c;
    int e = *c == 'e' ? atoi(c + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;

    double a = fabs(v);
    double upper = dt == KF_DT_DOUBLE ? 1e16 : dt == KF_DT_FLOAT16 ? 1e3 : 1e6;
    size_t len = 0;
#define PUT(ch) (len + 1 < cap ? (void)(out[len++] = (ch)) : (void)0)
    if (signbit(v)) PUT('-');
    if (a == 0 || (a >= 1e-4 && a < upper)) {
        if (e >= 0) {
            for (int k = 0; k <= e; k++) PUT(k < nd ? digits[k] : '0');
            PUT('.');
            if (e + 1 >= nd) PUT('0');
            for (int k = e + 1; k < nd; k++) PUT(digits[k]);
        } else {
            PUT('0');
            PUT('.');
            for (int k = 0; k < -e - 1; k++) PUT('0');
            for (int k = 0; k < nd; k++) PUT(digits[k]);
        }
        out[len] = 0;
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int k = 1; k < nd; k++) PUT(digits[k]);
        }
        out[len] = 0;
        snprintf(out + len, cap - len, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef PUT
}

static kf_status to_string(const kf_node *n, const kf_tensor *src, int64_t i, kf_tensor *dst, int64_t j) {
    char buf[64];
    kf_dtype dt = src->dtype;
    if (dt == KF_DT_BOOL) snprintf(buf, sizeof buf, "%s", kf_get_i64(src, i) ? "True" : "False");
    else if (dt == KF_DT_UINT64) snprintf(buf, sizeof buf, "%llu", (unsigned long long)kf_get_u64(src, i));
    else if (kf_dtype_is_int(dt)) snprintf(buf, sizeof buf, "%lld", (long long)kf_get_i64(src, i));
    else format_float(kf_get_f64(src, i), dt, buf, sizeof buf);
    kf_bytes *b = &((kf_bytes *)dst->data)[j];
    b->len = strlen(buf);
    b->ptr = kf_strndup(buf, b->len);
    if (!b->ptr) return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
    return KF_OK;
}

/* ---- strings to numbers ------------------------------------------------------ */

/* Whole-string numeric parses (surrounding whitespace allowed). */
static bool at_end(const char *e) {
    while (isspace((unsigned char)*e)) e++;
    return *e == 0;
}

static bool parse_f64(const char *s, double *v) {
    char *e;
    *v = strtod(s, &e);
    return e != s && at_end(e);
}

static kf_status from_string(const kf_node *n, const kf_bytes *b, kf_tensor *dst, int64_t j) {
    kf_status st = KF_OK;
    char *s = kf_strndup(b->ptr ? b->ptr : "", b->len);
    if (!s) return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
    bool ok = strlen(s) == b->len; /* an embedded NUL never parses */
    kf_dtype dt = dst->dtype;
    double d;
    char *e;
    if (!ok) {
    } else if (dt == KF_DT_FLOAT) {
        float f = strtof(s, &e);
        ok = e != s && at_end(e);
        if (ok) ((float *)dst->data)[j] = f;
    } else if (kf_dtype_is_float(dt)) {
        ok = parse_f64(s, &d);
        if (ok) kf_ew_store_f64(dst, j, d);
    } else if (dt == KF_DT_BOOL) {
        const char *t = s;
        while (isspace((unsigned char)*t)) t++;
        if (strncasecmp(t, "true", 4) == 0 && at_end(t + 4)) kf_set_i64(dst, j, 1);
        else if (strncasecmp(t, "false", 5) == 0 && at_end(t + 5)) kf_set_i64(dst, j, 0);
        else if ((ok = parse_f64(s, &d))) kf_set_f64(dst, j, d);
    } else {
        errno = 0;
        if (dt == KF_DT_UINT64 && !strchr(s, '-')) {
            unsigned long long u = strtoull(s, &e, 10);
            ok = e != s && at_end(e) && errno == 0;
            if (ok) kf_set_u64(dst, j, u);
        } else {
            long long v = strtoll(s, &e, 10);
            ok = e != s && at_end(e) && errno == 0;
            if (ok) kf_set_i64(dst, j, v);
        }
        if (!ok && (ok = parse_f64(s, &d))) kf_set_f64(dst, j, d); /* "2.5", "1e3" */
    }
    if (!ok)
        st = kf_fail(KF_ERR_RUNTIME, "node '%s' (%s): cannot parse \"%.40s\" as %s", kf_node_label(n),
                     n->op_type, s, kf_dtype_name(dt));
    kf_free(s);
    return st;
}

/* ---- one element -------------------------------------------------------------- */

/* How a Cast rounds into the small types (kf_tensor.h): `saturate` (float8,
 * default 1) and `round_mode` (E8M0, default "up"). */
typedef struct small_opts {
    bool saturate;
    kf_e8m0_round mode;
} small_opts;

static small_opts small_opts_of(const kf_node *n) {
    const char *rm = kf_attr_s(n, "round_mode", "up");
    small_opts o = {kf_attr_i(n, "saturate", 1) != 0, KF_E8M0_UP};
    if (!strcmp(rm, "down")) o.mode = KF_E8M0_DOWN;
    else if (!strcmp(rm, "nearest")) o.mode = KF_E8M0_NEAREST;
    return o;
}

/* Conversions from or to a small type. Floats go through double, which
 * holds every float32/float16/bfloat16/small value exactly, so each result
 * is rounded once (E8M0 reads float32, as the specification's reference). */
static void convert_small(const kf_tensor *src, int64_t i, kf_tensor *dst, int64_t j, const small_opts *o) {
    kf_dtype sd = src->dtype, dd = dst->dtype;
    bool sfloat = kf_dtype_is_float(sd) || kf_dtype_is_small_float(sd);
    if (!kf_dtype_is_small(dd)) {
        if (sfloat) kf_ew_store_f64(dst, j, kf_get_f64(src, i));
        else kf_set_i64(dst, j, kf_get_i64(src, i)); /* int4/int2 -> wider: the value */
        return;
    }
    uint8_t *out = (uint8_t *)dst->data + j;
    if (!sfloat && !kf_dtype_is_small_float(dd)) {
        *out = kf_i64_to_small(dd, kf_get_i64(src, i)); /* integer -> int4/int2: low bits */
        return;
    }
    double v = sd == KF_DT_UINT64 ? (double)kf_get_u64(src, i) : sfloat ? kf_get_f64(src, i) : (double)kf_get_i64(src, i);
    *out = dd == KF_DT_FLOAT8E8M0 ? kf_f32_to_e8m0((float)v, o->saturate, o->mode) : kf_f64_to_small(dd, v, o->saturate);
}

static kf_status convert(const kf_node *n, const kf_tensor *src, int64_t i, kf_tensor *dst, int64_t j,
                         const small_opts *o) {
    kf_dtype sd = src->dtype, dd = dst->dtype;
    if (sd != dd && sd != KF_DT_STRING && dd != KF_DT_STRING && (kf_dtype_is_small(sd) || kf_dtype_is_small(dd))) {
        convert_small(src, i, dst, j, o);
        return KF_OK;
    }
    if (sd == KF_DT_STRING && dd == KF_DT_STRING) {
        const kf_bytes *b = &((const kf_bytes *)src->data)[i];
        kf_bytes *r = &((kf_bytes *)dst->data)[j];
        r->ptr = kf_strndup(b->ptr ? b->ptr : "", b->len);
        if (!r->ptr) return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
        r->len = b->len;
        return KF_OK;
    }
    if (sd == KF_DT_STRING) return from_string(n, &((const kf_bytes *)src->data)[i], dst, j);
    if (dd == KF_DT_STRING) return to_string(n, src, i, dst, j);
    if (sd == dd) {
        size_t esz = kf_dtype_size(sd);
        memcpy((char *)dst->data + (size_t)j * esz, (const char *)src->data + (size_t)i * esz, esz);
    } else if (kf_dtype_is_float(dd) && !kf_dtype_is_float(sd)) {
        /* integers convert with one rounding; C's int->float casts are exact-rounded */
        if (sd == KF_DT_UINT64) {
            uint64_t u = kf_get_u64(src, i);
            if (dd == KF_DT_FLOAT) ((float *)dst->data)[j] = (float)u;
            else kf_ew_store_f64(dst, j, (double)u);
        } else {
            int64_t v = kf_get_i64(src, i);
            if (dd == KF_DT_FLOAT) ((float *)dst->data)[j] = (float)v;
            else kf_ew_store_f64(dst, j, (double)v);
        }
    } else if (kf_dtype_is_float(sd)) {
        kf_ew_store_f64(dst, j, kf_get_f64(src, i)); /* ints truncate and saturate */
    } else {
        kf_set_i64(dst, j, kf_get_i64(src, i)); /* keeps the low bits, as numpy */
    }
    return KF_OK;
}

kf_status kf_ew_eval_cast(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    if (nout < 1) return KF_OK;
    if (nin < 1 || !in[0] || (n->op == KF_OP_CAST_LIKE && (nin < 2 || !in[1])))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing input", kf_node_label(n), n->op_type);
    const kf_tensor *x = in[0];
    kf_dtype to;
    KF_TRY(cast_target(n, n->op == KF_OP_CAST_LIKE ? in[1]->dtype : KF_DT_UNDEFINED, &to));
    KF_TRY(check_source(n, x->dtype));
    if (!kf_dtype_valid(x->dtype))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): input has no dtype", kf_node_label(n), n->op_type);
    bool fits = out[0].data && out[0].dtype == to && out[0].rank == x->rank;
    for (int k = 0; fits && k < x->rank; k++) fits = out[0].dims[k] == x->dims[k];
    if (!fits) KF_TRY(kf_tensor_alloc(&out[0], to, x->rank, x->dims));
    small_opts o = small_opts_of(n);
    for (int64_t i = 0; i < x->numel; i++) KF_TRY(convert(n, x, i, &out[0], i, &o));
    return KF_OK;
}

/* ---- BitCast (opset 26) ------------------------------------------------------ */

/* The bit width of an element as BitCast sees it: the packed width of the
 * small types, 8 * size otherwise (bool is one byte). */
static int bitcast_width(kf_dtype dt) { return kf_dtype_bits(dt); }

/* The target dtype (`to`, required) after checking that source and target
 * are numbers of one width. src 0: unknown, only `to` is checked. */
static kf_status bitcast_target(const kf_node *n, kf_dtype src, kf_dtype *to) {
    const kf_attr *a = kf_attr_find(n, "to");
    if (!a || a->type != KF_ATTR_INT)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): integer attribute 'to' is required", kf_node_label(n),
                       n->op_type);
    if (!kf_dtype_valid((int)a->i) || a->i != (int)a->i || a->i == KF_DT_STRING)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): cannot reinterpret as dtype %lld", kf_node_label(n),
                       n->op_type, (long long)a->i);
    *to = (kf_dtype)a->i;
    if (!src) return KF_OK;
    if (!kf_dtype_valid(src) || src == KF_DT_STRING)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input dtype %s has no bit pattern to reinterpret",
                       kf_node_label(n), n->op_type, kf_dtype_name(src));
    if (bitcast_width(src) != bitcast_width(*to))
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %s has %d bits, %s has %d", kf_node_label(n), n->op_type,
                       kf_dtype_name(src), bitcast_width(src), kf_dtype_name(*to), bitcast_width(*to));
    return KF_OK;
}

kf_status kf_ew_shape_bitcast(const kf_node *n, int nin, const kf_type *const *in,
                              const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nout < 1) return KF_OK;
    kf_dtype to = KF_DT_UNDEFINED;
    KF_TRY(bitcast_target(n, nin > 0 && in[0] ? in[0]->dtype : KF_DT_UNDEFINED, &to));
    if (nin > 0 && in[0]) out[0] = *in[0];
    out[0].dtype = to;
    return KF_OK;
}

/* Elements keep their bits. Types of 8 bits and more are copied byte for
 * byte (kfuse runs on little-endian hosts, the order ONNX prescribes); a
 * bool target stores 1 for any nonzero byte, the only other value a kfuse
 * bool holds. Below 8 bits each element is one byte in memory: its low
 * bits are the code, and int4/int2 targets sign-extend it. */
kf_status kf_ew_eval_bitcast(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    if (nout < 1) return KF_OK;
    if (nin < 1 || !in[0])
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): missing input", kf_node_label(n), n->op_type);
    const kf_tensor *x = in[0];
    kf_dtype to = KF_DT_UNDEFINED;
    KF_TRY(bitcast_target(n, x->dtype, &to));
    bool fits = out[0].data && out[0].dtype == to && out[0].rank == x->rank;
    for (int k = 0; fits && k < x->rank; k++) fits = out[0].dims[k] == x->dims[k];
    if (!fits) KF_TRY(kf_tensor_alloc(&out[0], to, x->rank, x->dims));
    if (x->numel == 0) return KF_OK;
    int bits = bitcast_width(to);
    if (bits >= 8) {
        memcpy(out[0].data, x->data, (size_t)x->numel * kf_dtype_size(to));
        if (to == KF_DT_BOOL)
            for (int64_t i = 0; i < x->numel; i++) ((uint8_t *)out[0].data)[i] = ((uint8_t *)out[0].data)[i] != 0;
        return KF_OK;
    }
    const uint8_t *s = x->data;
    uint8_t *d = out[0].data;
    unsigned mask = (1u << bits) - 1, sign = 1u << (bits - 1);
    bool extend = to == KF_DT_INT4 || to == KF_DT_INT2;
    for (int64_t i = 0; i < x->numel; i++) {
        unsigned code = s[i] & mask;
        d[i] = (uint8_t)(extend && (code & sign) ? code | ~mask : code);
    }
    return KF_OK;
}
