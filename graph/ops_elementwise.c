/*
 * ops_elementwise.c: reference kernels of the elementwise family (unary math
 * and activations, binary arithmetic/logic/comparison, Max/Min/Sum/Mean,
 * Where, Clip). One broadcasting driver applies a scalar function per op from
 * the table below: a double one, and an int64 one where integers must stay
 * exact. A new op is a row here, a row in ops_elementwise.def and a function.
 */
#include <math.h>
#include <string.h>

#include "ops_elementwise.h"

/* ---- dtype sets --------------------------------------------------------- */

#define M(dt) (1u << (dt))
#define T_FLT (M(KF_DT_FLOAT) | M(KF_DT_DOUBLE) | M(KF_DT_FLOAT16) | M(KF_DT_BFLOAT16))
#define T_SINT (M(KF_DT_INT8) | M(KF_DT_INT16) | M(KF_DT_INT32) | M(KF_DT_INT64))
#define T_UINT (M(KF_DT_UINT8) | M(KF_DT_UINT16) | M(KF_DT_UINT32) | M(KF_DT_UINT64))
#define T_INT (T_SINT | T_UINT)
#define T_NUM (T_INT | T_FLT)
#define T_SNUM (T_SINT | T_FLT)
#define T_BOOL M(KF_DT_BOOL)
#define T_STR M(KF_DT_STRING)
#define T_ANY (T_NUM | T_BOOL | T_STR | M(KF_DT_COMPLEX64) | M(KF_DT_COMPLEX128))

/* ---- the op table ------------------------------------------------------- */

/* Constants an op reads from attributes or scalar inputs before it runs. */
typedef struct ew_par {
    double a, b, c;       /* alpha/beta/gamma, lambd/bias, clip bounds */
    int64_t ilo, ihi;     /* clip bounds for the integer path */
    bool has_lo, has_hi;  /* clip bounds present */
    int mode;             /* fmod, shift direction, gelu approximation, isinf sides */
    unsigned umask;       /* bit k: operand k is uint64 (compare/divide unsigned) */
} ew_par;

typedef double (*ew_f64_fn)(const double *x, int nx, const ew_par *p);
typedef int64_t (*ew_i64_fn)(const int64_t *x, int nx, const ew_par *p);
typedef bool (*ew_str_fn)(const kf_bytes *a, const kf_bytes *b);
typedef kf_status (*ew_par_fn)(const kf_node *n, int nin, const kf_tensor *const *in, ew_par *p);

enum {
    EW_BOOL_OUT = 1 << 0, /* output dtype is bool */
    EW_OUT_FROM_1 = 1 << 1, /* output dtype is input 1's (Where) */
    EW_LEGACY = 1 << 2,   /* opset < 7 has the broadcast/axis attributes */
    EW_UNIDIR = 1 << 3,   /* input 1 broadcasts to input 0 only (PRelu) */
    EW_SELECT = 1 << 4,   /* the integer function picks the operand to copy */
    EW_SAME_SHAPE = 1 << 5 /* inputs must have one shape, no broadcasting (SwiGLU) */
};

#define EW_VARIADIC (-1)

typedef struct ew_desc {
    int arity;     /* leading inputs broadcast together; EW_VARIADIC: all */
    unsigned t0;   /* dtypes accepted for input 0 */
    unsigned t1;   /* for inputs 1..: 0 = same dtype as input 0; else this set,
                    * every such input having the same dtype */
    unsigned flags;
    ew_f64_fn f;   /* double path (float operands); NULL: integers only */
    ew_i64_fn i;   /* exact path when every operand is integer or bool */
    ew_str_fn s;   /* string operands */
    ew_par_fn par; /* reads constants; NULL when the op has none */
} ew_desc;

/* ---- scalar functions: double --------------------------------------------
 * Each takes the operands of one output element. NaN propagates where numpy
 * propagates it (Max/Min/Clip/Relu keep a NaN operand). */

#define UF(name, expr)                                                         \
    static double name(const double *x, int nx, const ew_par *p) {            \
        (void)nx;                                                              \
        (void)p;                                                               \
        const double v = x[0];                                                 \
        return (expr);                                                         \
    }
#define BF(name, expr)                                                         \
    static double name(const double *x, int nx, const ew_par *p) {            \
        (void)nx;                                                              \
        (void)p;                                                               \
        const double a = x[0], b = x[1];                                       \
        return (expr);                                                         \
    }

/* clamp that keeps NaN (fmin/fmax would drop it) */
static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static double softplus(double v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }

UF(f_abs, fabs(v))
UF(f_neg, -v)
UF(f_reciprocal, 1.0 / v)
UF(f_floor, floor(v))
UF(f_ceil, ceil(v))
UF(f_round, rint(v)) /* half to even in the default rounding mode */
UF(f_sqrt, sqrt(v))
UF(f_exp, exp(v))
UF(f_log, log(v))
UF(f_sin, sin(v))
UF(f_cos, cos(v))
UF(f_tan, tan(v))
UF(f_asin, asin(v))
UF(f_acos, acos(v))
UF(f_atan, atan(v))
UF(f_sinh, sinh(v))
UF(f_cosh, cosh(v))
UF(f_tanh, tanh(v))
UF(f_asinh, asinh(v))
UF(f_acosh, acosh(v))
UF(f_atanh, atanh(v))
UF(f_erf, erf(v))
UF(f_sign, isnan(v) ? v : (double)((v > 0) - (v < 0)))
UF(f_sigmoid, v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v)))
UF(f_hard_sigmoid, clampd(p->a * v + p->b, 0, 1))
UF(f_hard_swish, v * clampd(v / 6.0 + 0.5, 0, 1))
UF(f_relu, v < 0 ? 0 : v)
UF(f_leaky_relu, v < 0 ? p->a * v : v)
UF(f_elu, v < 0 ? p->a * expm1(v) : v)
UF(f_selu, v <= 0 ? p->c * (p->a * exp(v) - p->a) : p->c * v)
/* max(0,v) + min(0, a*(exp(v/a)-1)): for either sign of a the second term
 * is 0 when v > 0 and the first is 0 otherwise */
UF(f_celu, v > 0 ? v : p->a * expm1(v / p->a))
UF(f_thresholded_relu, v > p->a ? v : 0)
UF(f_softplus, softplus(v))
UF(f_softsign, v / (1.0 + fabs(v)))
UF(f_mish, v * tanh(softplus(v)))
UF(f_gelu, p->mode ? 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))
                   : 0.5 * v * (1.0 + erf(v / sqrt(2.0))))
/* Swish (24): v * sigmoid(alpha * v); SwiGLU (28): Swish of the gate a
 * times the value b */
UF(f_swish, v * f_sigmoid(&(double){p->a * v}, 1, p))
UF(f_shrink, v < -p->a ? v + p->b : v > p->a ? v - p->b : 0)
UF(f_isnan, isnan(v))
UF(f_isinf, isinf(v) && (v > 0 ? (p->mode & 1) : (p->mode & 2)))
/* max bound applied last, so min > max gives max everywhere (as the spec says) */
static double f_clip(const double *x, int nx, const ew_par *p) {
    (void)nx;
    double v = x[0];
    if (p->has_lo && v < p->a) v = p->a;
    if (p->has_hi && v > p->b) v = p->b;
    return v;
}

BF(f_add, a + b)
BF(f_sub, a - b)
BF(f_mul, a * b)
BF(f_div, a / b)
BF(f_pow, pow(a, b))
BF(f_equal, a == b)
BF(f_less, a < b)
BF(f_greater, a > b)
BF(f_less_equal, a <= b)
BF(f_greater_equal, a >= b)
BF(f_prelu, a < 0 ? a * b : a)
BF(f_swiglu, a * f_sigmoid(&(double){p->a * a}, 1, p) * b)

/* fmod=1: C fmod (sign of the dividend); fmod=0: numpy mod (sign of the
 * divisor). */
static double f_mod(const double *x, int nx, const ew_par *p) {
    (void)nx;
    double r = fmod(x[0], x[1]);
    if (p->mode) return r;
    if (r != 0 && ((r < 0) != (x[1] < 0))) r += x[1];
    else if (r == 0) r = copysign(0.0, x[1]);
    return r;
}

static double f_max(const double *x, int nx, const ew_par *p) {
    (void)p;
    double r = x[0];
    for (int k = 1; k < nx && !isnan(r); k++) r = (isnan(x[k]) || x[k] > r) ? x[k] : r;
    return r;
}

static double f_min(const double *x, int nx, const ew_par *p) {
    (void)p;
    double r = x[0];
    for (int k = 1; k < nx && !isnan(r); k++) r = (isnan(x[k]) || x[k] < r) ? x[k] : r;
    return r;
}

static double f_sum(const double *x, int nx, const ew_par *p) {
    (void)p;
    double r = 0;
    for (int k = 0; k < nx; k++) r += x[k];
    return r;
}

static double f_mean(const double *x, int nx, const ew_par *p) { return f_sum(x, nx, p) / nx; }

/* ---- scalar functions: int64 -----------------------------------------------
 * Operands are read with kf_get_i64 (uint64 arrives as its bit pattern; the
 * umask says so) and results are stored with kf_set_i64, which keeps the low
 * bits: arithmetic wraps as in numpy. Wrapping is done in uint64 so no
 * signed overflow happens. Division or modulo by zero gives 0; INT64_MIN/-1
 * wraps to INT64_MIN. */

#define UI(name, expr)                                                         \
    static int64_t name(const int64_t *x, int nx, const ew_par *p) {          \
        (void)nx;                                                              \
        const bool u = p->umask & 1;                                           \
        (void)u;                                                               \
        const int64_t v = x[0];                                                \
        return (expr);                                                         \
    }
#define BI(name, expr)                                                         \
    static int64_t name(const int64_t *x, int nx, const ew_par *p) {          \
        (void)nx;                                                              \
        const bool u = p->umask & 1;                                           \
        (void)u;                                                               \
        const int64_t a = x[0], b = x[1];                                      \
        return (expr);                                                         \
    }

/* uint64 -> int64 keeping the bits (GCC and Clang define it as modulo) */
static int64_t wrap(uint64_t v) { return (int64_t)v; }
static bool lt(int64_t a, int64_t b, bool u) { return u ? (uint64_t)a < (uint64_t)b : a < b; }

UI(i_abs, (!u && v < 0) ? wrap(0 - (uint64_t)v) : v)
UI(i_neg, wrap(0 - (uint64_t)v))
UI(i_sign, u ? v != 0 : (v > 0) - (v < 0))
UI(i_relu, (!u && v < 0) ? 0 : v)
UI(i_not, !v)
UI(i_bitwise_not, wrap(~(uint64_t)v))
UI(i_where, v ? 1 : 2) /* EW_SELECT: which operand to copy */

BI(i_add, wrap((uint64_t)a + (uint64_t)b))
BI(i_sub, wrap((uint64_t)a - (uint64_t)b))
BI(i_mul, wrap((uint64_t)a * (uint64_t)b))
BI(i_and, a && b)
BI(i_or, a || b)
BI(i_xor, !a != !b)
BI(i_bitwise_and, a & b)
BI(i_bitwise_or, a | b)
BI(i_bitwise_xor, a ^ b)
BI(i_equal, a == b)
BI(i_less, lt(a, b, u))
BI(i_greater, lt(b, a, u))
BI(i_less_equal, !lt(b, a, u))
BI(i_greater_equal, !lt(a, b, u))
BI(i_prelu, (!u && a < 0) ? wrap((uint64_t)a * (uint64_t)b) : a)

static int64_t i_div(const int64_t *x, int nx, const ew_par *p) {
    (void)nx;
    int64_t a = x[0], b = x[1];
    if (b == 0) return 0;
    if (p->umask & 1) return wrap((uint64_t)a / (uint64_t)b);
    if (b == -1) return wrap(0 - (uint64_t)a);
    return a / b;
}

static int64_t i_mod(const int64_t *x, int nx, const ew_par *p) {
    (void)nx;
    int64_t a = x[0], b = x[1];
    if (b == 0) return 0;
    if (p->umask & 1) return wrap((uint64_t)a % (uint64_t)b);
    if (b == -1) return 0;
    int64_t r = a % b;
    if (!p->mode && r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

/* BitShift. mode bit 0: right; bit 1: signed operands (opset 28 added
 * int8..int64). Unsigned shifts are logical. A signed right shift is
 * arithmetic (written on ~a so no negative value is shifted); a signed left
 * shift keeps the low bits, which kf_set_i64 stores. A shift count that is
 * negative or at least 64 leaves only the sign fill: -1 for a right shift of
 * a negative value, else 0. Counts between the element width and 63 come
 * to the same after storing, since operands arrive sign- or zero-extended. */
static int64_t i_bit_shift(const int64_t *x, int nx, const ew_par *p) {
    (void)nx;
    const bool right = p->mode & 1;
    if (p->mode & 2) {
        int64_t a = x[0], s = x[1];
        if (s < 0 || s >= 64) return (right && a < 0) ? -1 : 0;
        if (!right) return wrap((uint64_t)a << s);
        return a < 0 ? ~(~a >> s) : a >> s;
    }
    uint64_t a = (uint64_t)x[0], s = (uint64_t)x[1];
    if (s >= 64) return 0;
    return wrap(right ? a >> s : a << s);
}

/* Exact integer power by squaring (wrapping like numpy). A negative exponent
 * truncates the real result: 1 and -1 keep a value, every other base gives 0. */
static int64_t i_pow(const int64_t *x, int nx, const ew_par *p) {
    (void)nx;
    int64_t base = x[0];
    if (!(p->umask & 2) && x[1] < 0) {
        if (base == 1) return 1;
        if (base == -1) return (x[1] & 1) ? -1 : 1;
        return 0;
    }
    uint64_t e = (uint64_t)x[1], b = (uint64_t)base, r = 1;
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return wrap(r);
}

static int64_t i_max(const int64_t *x, int nx, const ew_par *p) {
    int64_t r = x[0];
    for (int k = 1; k < nx; k++)
        if (lt(r, x[k], p->umask & 1)) r = x[k];
    return r;
}

static int64_t i_min(const int64_t *x, int nx, const ew_par *p) {
    int64_t r = x[0];
    for (int k = 1; k < nx; k++)
        if (lt(x[k], r, p->umask & 1)) r = x[k];
    return r;
}

static int64_t i_clip(const int64_t *x, int nx, const ew_par *p) {
    (void)nx;
    bool u = p->umask & 1;
    int64_t v = x[0];
    if (p->has_lo && lt(v, p->ilo, u)) v = p->ilo;
    if (p->has_hi && lt(p->ihi, v, u)) v = p->ihi;
    return v;
}

static bool s_equal(const kf_bytes *a, const kf_bytes *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

/* ---- attribute and constant readers ------------------------------------- */

int64_t kf_ew_version(const kf_node *n) { return n->opset > 0 ? n->opset : 21; }

/* A float attribute (an int one is accepted too) or def when absent; def is
 * rounded to float as a written attribute would be. */
static kf_status attr_f(const kf_node *n, const char *name, double def, double *out) {
    const kf_attr *a = kf_attr_find(n, name);
    if (!a) *out = (float)def;
    else if (a->type == KF_ATTR_FLOAT) *out = a->f;
    else if (a->type == KF_ATTR_INT) *out = (double)a->i;
    else
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' must be a float",
                       kf_node_label(n), n->op_type, name);
    return KF_OK;
}

static kf_status attr_i(const kf_node *n, const char *name, int64_t def, int64_t *out) {
    const kf_attr *a = kf_attr_find(n, name);
    if (!a) *out = def;
    else if (a->type == KF_ATTR_INT) *out = a->i;
    else
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' must be an int",
                       kf_node_label(n), n->op_type, name);
    return KF_OK;
}

static kf_status attr_flag(const kf_node *n, const char *name, int64_t def, int *out) {
    int64_t v = def;
    KF_TRY(attr_i(n, name, def, &v));
    if (v != 0 && v != 1)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' must be 0 or 1, not %lld",
                       kf_node_label(n), n->op_type, name, (long long)v);
    *out = (int)v;
    return KF_OK;
}

/* A string attribute that must be one of two spellings; *out = index. */
static kf_status attr_choice(const kf_node *n, const char *name, const char *def, const char *c0,
                             const char *c1, int *out) {
    const kf_attr *a = kf_attr_find(n, name);
    const char *s = def;
    if (a) {
        if (a->type != KF_ATTR_STRING)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' must be a string",
                           kf_node_label(n), n->op_type, name);
        s = a->s.ptr ? a->s.ptr : "";
    }
    if (!s)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' is required",
                       kf_node_label(n), n->op_type, name);
    if (strcmp(s, c0) == 0) *out = 0;
    else if (strcmp(s, c1) == 0) *out = 1;
    else
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' is '%s', expected '%s' or '%s'",
                       kf_node_label(n), n->op_type, name, s, c0, c1);
    return KF_OK;
}

#define PAR_FN(name)                                                           \
    static kf_status name(const kf_node *n, int nin, const kf_tensor *const *in, ew_par *p)

PAR_FN(par_leaky_relu) {
    (void)nin, (void)in;
    return attr_f(n, "alpha", 0.01, &p->a);
}
PAR_FN(par_alpha_1) { /* Elu, ThresholdedRelu, Swish, SwiGLU */
    (void)nin, (void)in;
    return attr_f(n, "alpha", 1.0, &p->a);
}
PAR_FN(par_celu) {
    (void)nin, (void)in;
    KF_TRY(attr_f(n, "alpha", 1.0, &p->a));
    if (p->a == 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): alpha must not be 0", kf_node_label(n),
                       n->op_type);
    return KF_OK;
}
PAR_FN(par_selu) {
    (void)nin, (void)in;
    KF_TRY(attr_f(n, "alpha", 1.67326319217681884765625, &p->a));
    return attr_f(n, "gamma", 1.05070102214813232421875, &p->c);
}
PAR_FN(par_hard_sigmoid) {
    (void)nin, (void)in;
    KF_TRY(attr_f(n, "alpha", 0.2, &p->a));
    return attr_f(n, "beta", 0.5, &p->b);
}
PAR_FN(par_shrink) {
    (void)nin, (void)in;
    KF_TRY(attr_f(n, "lambd", 0.5, &p->a));
    return attr_f(n, "bias", 0.0, &p->b);
}
PAR_FN(par_gelu) {
    (void)nin, (void)in;
    return attr_choice(n, "approximate", "none", "none", "tanh", &p->mode);
}
PAR_FN(par_is_inf) {
    (void)nin, (void)in;
    int pos = 0, neg = 0;
    KF_TRY(attr_flag(n, "detect_positive", 1, &pos));
    KF_TRY(attr_flag(n, "detect_negative", 1, &neg));
    p->mode = pos | neg << 1;
    return KF_OK;
}
PAR_FN(par_mod) {
    (void)nin, (void)in;
    return attr_flag(n, "fmod", 0, &p->mode);
}
PAR_FN(par_bit_shift) {
    (void)nin;
    KF_TRY(attr_choice(n, "direction", NULL, "LEFT", "RIGHT", &p->mode));
    if (in[0] && kf_dtype_is_int(in[0]->dtype) && kf_dtype_is_signed(in[0]->dtype)) {
        if (kf_ew_version(n) < 28)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): signed input %s needs opset 28, the model imports %lld",
                           kf_node_label(n), n->op_type, kf_dtype_name(in[0]->dtype), (long long)kf_ew_version(n));
        p->mode |= 2;
    }
    return KF_OK;
}

/* Saturating double -> int64 for integer clip bounds from float attributes. */
static int64_t bound_i64(double v, bool up) {
    v = up ? ceil(v) : floor(v);
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

/* Clip: min/max attributes before opset 11, optional scalar inputs after. */
PAR_FN(par_clip) {
    if (kf_ew_version(n) < 11) {
        if (!kf_dtype_is_float(in[0]->dtype))
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): before opset 11 the input must be float, not %s",
                           kf_node_label(n), n->op_type, kf_dtype_name(in[0]->dtype));
        if (nin > 1)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): before opset 11 min/max are attributes, not inputs",
                           kf_node_label(n), n->op_type);
        p->has_lo = kf_attr_find(n, "min") != NULL;
        p->has_hi = kf_attr_find(n, "max") != NULL;
        KF_TRY(attr_f(n, "min", 0, &p->a));
        KF_TRY(attr_f(n, "max", 0, &p->b));
        p->ilo = bound_i64(p->a, true);
        p->ihi = bound_i64(p->b, false);
        return KF_OK;
    }
    for (int k = 1; k <= 2; k++) {
        const kf_tensor *t = k < nin ? in[k] : NULL;
        if (!t) continue;
        if (t->numel != 1 || t->rank > 1)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %s must be a scalar, it has %lld elements",
                           kf_node_label(n), n->op_type, k == 1 ? "min" : "max", (long long)t->numel);
        if (k == 1) {
            p->has_lo = true;
            p->a = kf_get_f64(t, 0);
            p->ilo = kf_get_i64(t, 0);
        } else {
            p->has_hi = true;
            p->b = kf_get_f64(t, 0);
            p->ihi = kf_get_i64(t, 0);
        }
    }
    return KF_OK;
}

/* ---- the table ------------------------------------------------------------ */

/* Ids 1-199 belong to this family (kf_ops.h). */
#define EW_ID_END 200

static const ew_desc ew_table[EW_ID_END] = {
    [KF_OP_ABS] = {1, T_NUM, 0, 0, f_abs, i_abs, NULL, NULL},
    [KF_OP_NEG] = {1, T_SNUM, 0, 0, f_neg, i_neg, NULL, NULL},
    [KF_OP_RECIPROCAL] = {1, T_FLT, 0, 0, f_reciprocal, NULL, NULL, NULL},
    [KF_OP_FLOOR] = {1, T_FLT, 0, 0, f_floor, NULL, NULL, NULL},
    [KF_OP_CEIL] = {1, T_FLT, 0, 0, f_ceil, NULL, NULL, NULL},
    [KF_OP_ROUND] = {1, T_FLT, 0, 0, f_round, NULL, NULL, NULL},
    [KF_OP_SQRT] = {1, T_FLT, 0, 0, f_sqrt, NULL, NULL, NULL},
    [KF_OP_EXP] = {1, T_FLT, 0, 0, f_exp, NULL, NULL, NULL},
    [KF_OP_LOG] = {1, T_FLT, 0, 0, f_log, NULL, NULL, NULL},
    [KF_OP_SIN] = {1, T_FLT, 0, 0, f_sin, NULL, NULL, NULL},
    [KF_OP_COS] = {1, T_FLT, 0, 0, f_cos, NULL, NULL, NULL},
    [KF_OP_TAN] = {1, T_FLT, 0, 0, f_tan, NULL, NULL, NULL},
    [KF_OP_ASIN] = {1, T_FLT, 0, 0, f_asin, NULL, NULL, NULL},
    [KF_OP_ACOS] = {1, T_FLT, 0, 0, f_acos, NULL, NULL, NULL},
    [KF_OP_ATAN] = {1, T_FLT, 0, 0, f_atan, NULL, NULL, NULL},
    [KF_OP_SINH] = {1, T_FLT, 0, 0, f_sinh, NULL, NULL, NULL},
    [KF_OP_COSH] = {1, T_FLT, 0, 0, f_cosh, NULL, NULL, NULL},
    [KF_OP_TANH] = {1, T_FLT, 0, 0, f_tanh, NULL, NULL, NULL},
    [KF_OP_ASINH] = {1, T_FLT, 0, 0, f_asinh, NULL, NULL, NULL},
    [KF_OP_ACOSH] = {1, T_FLT, 0, 0, f_acosh, NULL, NULL, NULL},
    [KF_OP_ATANH] = {1, T_FLT, 0, 0, f_atanh, NULL, NULL, NULL},
    [KF_OP_ERF] = {1, T_FLT, 0, 0, f_erf, NULL, NULL, NULL},
    [KF_OP_SIGN] = {1, T_NUM, 0, 0, f_sign, i_sign, NULL, NULL},
    [KF_OP_SIGMOID] = {1, T_FLT, 0, 0, f_sigmoid, NULL, NULL, NULL},
    [KF_OP_HARD_SIGMOID] = {1, T_FLT, 0, 0, f_hard_sigmoid, NULL, NULL, par_hard_sigmoid},
    [KF_OP_HARD_SWISH] = {1, T_FLT, 0, 0, f_hard_swish, NULL, NULL, NULL},
    [KF_OP_RELU] = {1, T_SNUM, 0, 0, f_relu, i_relu, NULL, NULL},
    [KF_OP_LEAKY_RELU] = {1, T_FLT, 0, 0, f_leaky_relu, NULL, NULL, par_leaky_relu},
    [KF_OP_ELU] = {1, T_FLT, 0, 0, f_elu, NULL, NULL, par_alpha_1},
    [KF_OP_SELU] = {1, T_FLT, 0, 0, f_selu, NULL, NULL, par_selu},
    [KF_OP_CELU] = {1, T_FLT, 0, 0, f_celu, NULL, NULL, par_celu},
    [KF_OP_THRESHOLDED_RELU] = {1, T_FLT, 0, 0, f_thresholded_relu, NULL, NULL, par_alpha_1},
    [KF_OP_SOFTPLUS] = {1, T_FLT, 0, 0, f_softplus, NULL, NULL, NULL},
    [KF_OP_SOFTSIGN] = {1, T_FLT, 0, 0, f_softsign, NULL, NULL, NULL},
    [KF_OP_MISH] = {1, T_FLT, 0, 0, f_mish, NULL, NULL, NULL},
    [KF_OP_GELU] = {1, T_FLT, 0, 0, f_gelu, NULL, NULL, par_gelu},
    [KF_OP_SWISH] = {1, T_FLT, 0, 0, f_swish, NULL, NULL, par_alpha_1},
    [KF_OP_SHRINK] = {1, T_NUM, 0, 0, f_shrink, NULL, NULL, par_shrink},
    [KF_OP_IS_NAN] = {1, T_FLT, 0, EW_BOOL_OUT, f_isnan, NULL, NULL, NULL},
    [KF_OP_IS_INF] = {1, T_FLT, 0, EW_BOOL_OUT, f_isinf, NULL, NULL, par_is_inf},
    [KF_OP_NOT] = {1, T_BOOL, 0, 0, NULL, i_not, NULL, NULL},
    [KF_OP_BITWISE_NOT] = {1, T_INT, 0, 0, NULL, i_bitwise_not, NULL, NULL},

    [KF_OP_ADD] = {2, T_NUM, 0, EW_LEGACY, f_add, i_add, NULL, NULL},
    [KF_OP_SUB] = {2, T_NUM, 0, EW_LEGACY, f_sub, i_sub, NULL, NULL},
    [KF_OP_MUL] = {2, T_NUM, 0, EW_LEGACY, f_mul, i_mul, NULL, NULL},
    [KF_OP_DIV] = {2, T_NUM, 0, EW_LEGACY, f_div, i_div, NULL, NULL},
    [KF_OP_POW] = {2, T_NUM, T_NUM, EW_LEGACY, f_pow, i_pow, NULL, NULL},
    [KF_OP_MOD] = {2, T_NUM, 0, 0, f_mod, i_mod, NULL, par_mod},
    [KF_OP_BIT_SHIFT] = {2, T_INT, 0, 0, NULL, i_bit_shift, NULL, par_bit_shift},
    [KF_OP_AND] = {2, T_BOOL, 0, EW_LEGACY, NULL, i_and, NULL, NULL},
    [KF_OP_OR] = {2, T_BOOL, 0, EW_LEGACY, NULL, i_or, NULL, NULL},
    [KF_OP_XOR] = {2, T_BOOL, 0, EW_LEGACY, NULL, i_xor, NULL, NULL},
    [KF_OP_EQUAL] = {2, T_NUM | T_BOOL | T_STR, 0, EW_LEGACY | EW_BOOL_OUT, f_equal, i_equal, s_equal, NULL},
    [KF_OP_LESS] = {2, T_NUM, 0, EW_LEGACY | EW_BOOL_OUT, f_less, i_less, NULL, NULL},
    [KF_OP_GREATER] = {2, T_NUM, 0, EW_LEGACY | EW_BOOL_OUT, f_greater, i_greater, NULL, NULL},
    [KF_OP_LESS_OR_EQUAL] = {2, T_NUM, 0, EW_BOOL_OUT, f_less_equal, i_less_equal, NULL, NULL},
    [KF_OP_GREATER_OR_EQUAL] = {2, T_NUM, 0, EW_BOOL_OUT, f_greater_equal, i_greater_equal, NULL, NULL},
    [KF_OP_BITWISE_AND] = {2, T_INT, 0, 0, NULL, i_bitwise_and, NULL, NULL},
    [KF_OP_BITWISE_OR] = {2, T_INT, 0, 0, NULL, i_bitwise_or, NULL, NULL},
    [KF_OP_BITWISE_XOR] = {2, T_INT, 0, 0, NULL, i_bitwise_xor, NULL, NULL},
    [KF_OP_PRELU] = {2, T_NUM, 0, EW_UNIDIR, f_prelu, i_prelu, NULL, NULL},
    [KF_OP_SWIGLU] = {2, T_FLT, 0, EW_SAME_SHAPE, f_swiglu, NULL, NULL, par_alpha_1},

    [KF_OP_MAX] = {EW_VARIADIC, T_NUM, 0, 0, f_max, i_max, NULL, NULL},
    [KF_OP_MIN] = {EW_VARIADIC, T_NUM, 0, 0, f_min, i_min, NULL, NULL},
    [KF_OP_SUM] = {EW_VARIADIC, T_FLT, 0, 0, f_sum, NULL, NULL, NULL},
    [KF_OP_MEAN] = {EW_VARIADIC, T_FLT, 0, 0, f_mean, NULL, NULL, NULL},
    [KF_OP_WHERE] = {3, T_BOOL, T_ANY, EW_SELECT | EW_OUT_FROM_1, NULL, i_where, NULL, NULL},
    [KF_OP_CLIP] = {1, T_NUM, 0, 0, f_clip, i_clip, NULL, par_clip},
};

static const ew_desc *desc_of(const kf_node *n) {
    if (n->op <= 0 || n->op >= EW_ID_END) return NULL;
    const ew_desc *d = &ew_table[n->op];
    return (d->f || d->i) ? d : NULL;
}

/* ---- type checks and broadcasting ------------------------------------------ */

/* dt[i] == 0: unknown or absent, not checked. */
static kf_status check_dtypes(const kf_node *n, const ew_desc *d, int nin, const kf_dtype *dt) {
    int ref = -1; /* input whose dtype the others must have */
    for (int i = 0; i < nin; i++) {
        if (!dt[i]) continue;
        unsigned set = (i == 0 || !d->t1) ? d->t0 : d->t1;
        if (!kf_dtype_valid(dt[i]) || !(set & M(dt[i])))
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d has unsupported dtype %s",
                           kf_node_label(n), n->op_type, i, kf_dtype_name(dt[i]));
        if (i == 0 && d->t1) continue;
        if (ref < 0) {
            ref = i;
        } else if (dt[i] != dt[ref]) {
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d is %s but input %d is %s",
                           kf_node_label(n), n->op_type, i, kf_dtype_name(dt[i]), ref,
                           kf_dtype_name(dt[ref]));
        }
    }
    return KF_OK;
}

/* How input 1 lines up with input 0 when the op broadcasts one way only
 * (legacy `broadcast`/`axis` of opset < 7, PRelu). Rewrites (*rank1, dims1)
 * into the numpy-broadcastable view and sets *unidir (the result must have
 * input 0's shape) and *exact (shapes must be equal). Dims may be -1 in shape
 * inference; then a size-1 test is simply false.
 *
 *   legacy, broadcast=1, axis=1:   A [2,3,4,5], B [3,4]  ->  B as [1,3,4,1]
 *   PRelu before opset 7:          X [2,3,4],   slope [3] -> slope as [3,1]
 */
static kf_status align_second(const kf_node *n, const ew_desc *d, int rank0, const int64_t *dims0,
                              int *rank1, int64_t *dims1, bool *unidir, bool *exact) {
    *unidir = *exact = false;
    int64_t ver = kf_ew_version(n);
    bool scalar = true;
    for (int k = 0; k < *rank1; k++)
        if (dims1[k] != 1) scalar = false;
    if ((d->flags & EW_LEGACY) && ver < 7) {
        int64_t bc = 0, axis = 0;
        KF_TRY(attr_i(n, "broadcast", 0, &bc));
        *unidir = true;
        if (!bc) {
            *exact = true;
            return KF_OK;
        }
        if (scalar) {
            *rank1 = 0;
            return KF_OK;
        }
        KF_TRY(attr_i(n, "axis", rank0 - *rank1, &axis));
        if (axis < 0) axis += rank0; /* tolerated: later specs count from the end */
        if (axis < 0 || axis + *rank1 > rank0)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): axis %lld does not fit a rank-%d input into rank %d",
                           kf_node_label(n), n->op_type, (long long)axis, *rank1, rank0);
        int64_t v[KF_MAX_RANK];
        for (int k = 0; k < rank0; k++) v[k] = 1;
        for (int k = 0; k < *rank1; k++) v[axis + k] = dims1[k];
        *rank1 = rank0 - (int)axis; /* leading 1s are implied */
        for (int k = 0; k < *rank1; k++) dims1[k] = v[axis + k];
        return KF_OK;
    }
    if (d->flags & EW_SAME_SHAPE) {
        *unidir = *exact = true;
        return KF_OK;
    }
    if (d->flags & EW_UNIDIR) {
        *unidir = true;
        if (ver < 7 && *rank1 == 1 && !scalar && rank0 >= 2 && dims1[0] == dims0[1]) {
            *rank1 = rank0 - 1;
            for (int k = 1; k < *rank1; k++) dims1[k] = 1;
        }
    }
    return KF_OK;
}

/* Checks the broadcast result against input 0 for one-way broadcasting. */
static kf_status check_unidir(const kf_node *n, const kf_type *in0, const kf_type *in1,
                              const kf_type *res, bool exact) {
    bool bad = res->rank != in0->rank;
    for (int k = 0; !bad && k < res->rank; k++)
        if (res->dims[k] >= 0 && in0->dims[k] >= 0 && res->dims[k] != in0->dims[k]) bad = true;
    if (exact) {
        bad = bad || in1->rank != in0->rank;
        for (int k = 0; !bad && k < in0->rank; k++)
            if (in1->dims[k] >= 0 && in0->dims[k] >= 0 && in1->dims[k] != in0->dims[k]) bad = true;
    }
    if (bad)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input 1 cannot be broadcast to the shape of input 0%s",
                       kf_node_label(n), n->op_type, exact ? " (the shapes must be equal)" : "");
    return KF_OK;
}

/* Output type from the data inputs' types (dtype set later). ty[i] may be
 * NULL for none; unknown ranks give an unknown shape. */
static kf_status out_shape(const kf_node *n, const ew_desc *d, int nd, const kf_type *const *ty,
                           kf_type *out) {
    if (nd == 2 && ty[0] && ty[1] && (d->flags & (EW_LEGACY | EW_UNIDIR | EW_SAME_SHAPE))) {
        kf_type v1 = *ty[1];
        bool unidir = false, exact = false;
        if (ty[0]->rank >= 0 && ty[1]->rank >= 0) {
            KF_TRY(align_second(n, d, ty[0]->rank, ty[0]->dims, &v1.rank, v1.dims, &unidir, &exact));
            if (!exact) memset(v1.syms, 0, sizeof v1.syms);
        }
        if (unidir) {
            const kf_type *pair[2] = {ty[0], &v1};
            kf_type res;
            KF_TRY(kf_broadcast_shapes(n, 2, pair, &res));
            KF_TRY(check_unidir(n, ty[0], &v1, &res, exact));
            *out = *ty[0];
            return KF_OK;
        }
    }
    return kf_broadcast_shapes(n, nd, ty, out);
}

/* ---- shape function -------------------------------------------------------- */

kf_status kf_ew_shape(const kf_node *n, int nin, const kf_type *const *in,
                      const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    const ew_desc *d = desc_of(n);
    if (!d)
        return kf_fail(KF_ERR_INTERNAL, "node '%s' (%s): no elementwise kernel", kf_node_label(n),
                       n->op_type);
    if (nout < 1 || nin < 1) return KF_OK;
    int nd = d->arity == EW_VARIADIC ? nin : (d->arity < nin ? d->arity : nin);
    kf_dtype *dts = kf_calloc((size_t)nin, sizeof(kf_dtype));
    if (!dts) return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
    for (int i = 0; i < nin; i++) dts[i] = in[i] ? in[i]->dtype : KF_DT_UNDEFINED;
    kf_status st = check_dtypes(n, d, nin, dts);
    kf_free(dts);
    KF_TRY(st);
    for (int i = 0; i < nd; i++)
        if (!in[i]) return KF_OK; /* required data input unknown: leave unknown */
    KF_TRY(out_shape(n, d, nd, in, &out[0]));
    if (d->flags & EW_BOOL_OUT) out[0].dtype = KF_DT_BOOL;
    else if ((d->flags & EW_OUT_FROM_1) && nd > 1) out[0].dtype = in[1]->dtype;
    else out[0].dtype = in[0]->dtype;
    return KF_OK;
}

/* ---- the broadcasting driver ----------------------------------------------- */

/* Round to odd in float: rounded to odd with at least two bits more than the
 * narrow type, then to nearest-even in the narrow type, v lands on its own
 * nearest-even value (no double rounding). */
uint16_t kf_ew_narrow16(double v, kf_dtype dt) {
    float f = (float)v;
    if (isfinite(f) && (double)f != v) {
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (!(bits & 1)) f = nextafterf(f, v > (double)f ? INFINITY : -INFINITY);
    }
    return dt == KF_DT_FLOAT16 ? kf_float_to_half(f) : kf_float_to_bf16(f);
}

void kf_ew_store_f64(kf_tensor *t, int64_t i, double v) {
    if (t->dtype == KF_DT_FLOAT16 || t->dtype == KF_DT_BFLOAT16)
        ((uint16_t *)t->data)[i] = kf_ew_narrow16(v, t->dtype);
    else
        kf_set_f64(t, i, v);
}

typedef enum { MODE_F64, MODE_I64, MODE_STR, MODE_SELECT } ew_mode;

/* Odometer over the output shape keeping each operand's element offset. */
typedef struct ew_iter {
    int rank, nin;
    int64_t dims[KF_MAX_RANK], idx[KF_MAX_RANK];
    int64_t *strides; /* nin x KF_MAX_RANK, 0 on broadcast dims */
    int64_t *off;     /* nin */
} ew_iter;

static void iter_next(ew_iter *it) {
    for (int d = it->rank - 1; d >= 0; d--) {
        it->idx[d]++;
        for (int k = 0; k < it->nin; k++) it->off[k] += it->strides[k * KF_MAX_RANK + d];
        if (it->idx[d] < it->dims[d]) return;
        for (int k = 0; k < it->nin; k++) it->off[k] -= it->strides[k * KF_MAX_RANK + d] * it->dims[d];
        it->idx[d] = 0;
    }
}

/* Copies element s of src into element o of dst (same dtype). */
static kf_status copy_elem(const kf_node *n, kf_tensor *dst, int64_t o, const kf_tensor *src, int64_t s) {
    if (dst->dtype == KF_DT_STRING) {
        const kf_bytes *b = &((const kf_bytes *)src->data)[s];
        kf_bytes *r = &((kf_bytes *)dst->data)[o];
        r->ptr = kf_strndup(b->ptr ? b->ptr : "", b->len);
        if (!r->ptr) return kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
        r->len = b->len;
        return KF_OK;
    }
    size_t esz = kf_dtype_size(dst->dtype);
    memcpy((char *)dst->data + (size_t)o * esz, (const char *)src->data + (size_t)s * esz, esz);
    return KF_OK;
}

static kf_status run(const kf_node *n, const ew_desc *d, int nd, const kf_tensor *const *v,
                     const kf_type *vt, ew_mode mode, const ew_par *p, kf_tensor *out) {
    kf_status st = KF_OK;
    ew_iter it = {0};
    it.nin = nd;
    it.rank = out->rank;
    for (int k = 0; k < out->rank; k++) it.dims[k] = out->dims[k];
    it.strides = kf_calloc((size_t)nd * KF_MAX_RANK, sizeof(int64_t));
    it.off = kf_calloc((size_t)nd, sizeof(int64_t));
    double *xf = kf_calloc((size_t)nd, sizeof(double));
    int64_t *xi = kf_calloc((size_t)nd, sizeof(int64_t));
    if (!it.strides || !it.off || !xf || !xi) {
        st = kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
        goto done;
    }
    for (int k = 0; k < nd; k++) {
        int shift = out->rank - vt[k].rank;
        int64_t s = 1;
        for (int a = vt[k].rank - 1; a >= 0; a--) {
            it.strides[k * KF_MAX_RANK + a + shift] = vt[k].dims[a] == 1 ? 0 : s;
            s *= vt[k].dims[a];
        }
    }
    for (int64_t e = 0; e < out->numel; e++, iter_next(&it)) {
        switch (mode) {
        case MODE_F64:
            for (int k = 0; k < nd; k++) xf[k] = kf_get_f64(v[k], it.off[k]);
            kf_ew_store_f64(out, e, d->f(xf, nd, p));
            break;
        case MODE_I64:
            for (int k = 0; k < nd; k++) xi[k] = kf_get_i64(v[k], it.off[k]);
            kf_set_i64(out, e, d->i(xi, nd, p));
            break;
        case MODE_STR: {
            const kf_bytes *a = &((const kf_bytes *)v[0]->data)[it.off[0]];
            const kf_bytes *b = &((const kf_bytes *)v[1]->data)[it.off[1]];
            kf_set_i64(out, e, d->s(a, b));
            break;
        }
        case MODE_SELECT: {
            xi[0] = kf_get_i64(v[0], it.off[0]);
            int64_t k = d->i(xi, nd, p);
            if ((st = copy_elem(n, out, e, v[k], it.off[k]))) goto done;
            break;
        }
        }
    }
done:
    kf_free(it.strides);
    kf_free(it.off);
    kf_free(xf);
    kf_free(xi);
    return st;
}

kf_status kf_ew_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    const ew_desc *d = desc_of(n);
    if (!d)
        return kf_fail(KF_ERR_INTERNAL, "node '%s' (%s): no elementwise kernel", kf_node_label(n),
                       n->op_type);
    if (nout < 1) return KF_OK;
    int nd = d->arity == EW_VARIADIC ? nin : d->arity;
    if (nin < nd || nd < 1)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d inputs, expected %d", kf_node_label(n),
                       n->op_type, nin, nd);
    kf_status st = KF_ERR_NOMEM;
    kf_dtype *dts = kf_calloc((size_t)nin, sizeof(kf_dtype));
    kf_type *vt = kf_calloc((size_t)nd, sizeof(kf_type));
    const kf_type **vp = kf_calloc((size_t)nd, sizeof(kf_type *));
    if (!dts || !vt || !vp) {
        st = kf_fail(KF_ERR_NOMEM, "node '%s' (%s): out of memory", kf_node_label(n), n->op_type);
        goto done;
    }
    for (int i = 0; i < nin; i++) {
        if (i < nd && !in[i]) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): input %d is missing", kf_node_label(n),
                         n->op_type, i);
            goto done;
        }
        dts[i] = in[i] ? in[i]->dtype : KF_DT_UNDEFINED;
    }
    if ((st = check_dtypes(n, d, nin, dts))) goto done;
    ew_par p = {0};
    if (d->par && (st = d->par(n, nin, in, &p))) goto done;
    for (int k = 0; k < nd && k < 32; k++) /* only the first operands' signedness is asked */
        if (in[k]->dtype == KF_DT_UINT64) p.umask |= 1u << k;

    /* operand views: input 1 may be re-aligned (legacy broadcast, PRelu) */
    for (int k = 0; k < nd; k++) {
        kf_type_of_tensor(&vt[k], in[k]);
        vp[k] = &vt[k];
    }
    kf_type ot;
    if ((st = out_shape(n, d, nd, vp, &ot))) goto done;
    if (nd == 2 && (d->flags & (EW_LEGACY | EW_UNIDIR))) {
        bool unidir, exact;
        if ((st = align_second(n, d, vt[0].rank, vt[0].dims, &vt[1].rank, vt[1].dims, &unidir, &exact)))
            goto done;
    }
    kf_dtype odt = (d->flags & EW_BOOL_OUT) ? KF_DT_BOOL
                   : (d->flags & EW_OUT_FROM_1) ? in[1]->dtype
                                                : in[0]->dtype;
    bool fits = out[0].data && out[0].dtype == odt && out[0].rank == ot.rank;
    for (int k = 0; fits && k < ot.rank; k++) fits = out[0].dims[k] == ot.dims[k];
    if (!fits && (st = kf_tensor_alloc(&out[0], odt, ot.rank, ot.dims))) goto done;

    ew_mode mode;
    bool all_int = true, any_str = false;
    for (int k = 0; k < nd; k++) {
        if (!kf_dtype_is_int(in[k]->dtype) && in[k]->dtype != KF_DT_BOOL) all_int = false;
        if (in[k]->dtype == KF_DT_STRING) any_str = true;
    }
    if (d->flags & EW_SELECT) mode = MODE_SELECT;
    else if (any_str && d->s) mode = MODE_STR;
    else if (all_int && d->i) mode = MODE_I64;
    else if (d->f && !any_str) mode = MODE_F64;
    else {
        st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): no kernel for input dtype %s", kf_node_label(n),
                     n->op_type, kf_dtype_name(in[0]->dtype));
        goto done;
    }
    st = run(n, d, nd, in, vt, mode, &p, &out[0]);
done:
    kf_free(dts);
    kf_free(vt);
    kf_free(vp);
    return st;
}
