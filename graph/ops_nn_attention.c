/*
 * ops_nn_attention.c: shape function and reference kernel of Attention
 * (opsets 23-25): softmax(Q K^T * scale + bias) V over 3-D (batch, seq,
 * heads * size) or 4-D (batch, heads, seq, size) inputs, with grouped
 * key/value heads, a past key/value cache the op extends, boolean or
 * additive masks, causal and sliding-window masks aligned to the cache,
 * per-batch counts of valid keys (opset 24), softcap and the optional
 * qk_matmul_output. The op is opaque to the planner for now.
 *
 * Rounding follows the ONNX reference step by step: every intermediate is
 * rounded to the input type where the reference's numpy code rounds it, dot
 * products of 16-bit types accumulate in float32 (as numpy and ml_dtypes
 * do), so float16 and bfloat16 results match its test data bit for bit;
 * float32 and double products accumulate in double. LinearAttention
 * (opset 27) is a recurrence of its own at the end of the file.
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

/* Inputs and outputs by position. */
enum { IN_Q, IN_K, IN_V, IN_MASK, IN_PAST_K, IN_PAST_V, IN_NONPAD, IN_COUNT };
enum { OUT_Y, OUT_PRESENT_K, OUT_PRESENT_V, OUT_QK, OUT_COUNT };

/* Elements of the double rows the kernel keeps per kv head and per query
 * (keys x head size, scores at each stage): one tensor's worth. */
#define ATT_MAX_ROW (KF_MAX_TENSOR_BYTES / (int64_t)sizeof(double))

/* What qk_matmul_output holds. QK_RAW is the product before softcap, as
 * the spec and the op's function body define it; the Python reference of
 * onnx 1.23 returns the softcapped value there (no node test covers a
 * softcap in mode 0). */
enum { QK_RAW, QK_SOFTCAP, QK_BIAS, QK_SOFTMAX };

typedef struct att_attrs {
    int64_t ver;          /* opset; the newest when the node has none */
    bool causal;
    int mode;             /* qk_matmul_output_mode */
    bool has_scale;
    double scale;
    double softcap;       /* 0: none */
    kf_dtype softmax;     /* softmax_precision; 0: the input type */
    int64_t q_heads;      /* 0: not given */
    int64_t kv_heads;
    int64_t left, right;  /* sliding window bounds (opset 25), -1: unbounded */
} att_attrs;

/* One dim as inference knows it: v < 0 unknown, sym names it. */
typedef struct adim {
    int64_t v;
    uint32_t sym;
} adim;

static const adim unknown_dim = {-1, 0};

/* Shapes of one Attention node in 4-D terms: Q (B, Hq, Sq, D), K (B, Hkv,
 * Skv, D), V (B, Hkv, Skv, Dv), past (B, Hkv, P, D | Dv); T = P + Skv keys. */
typedef struct att_geom {
    int rank; /* of Q, K and V: 3 or 4; -1 unknown */
    adim B, Hq, Hkv, Sq, Skv, P, T, D, Dv;
} att_geom;

static bool known(adim d) { return d.v >= 0; }

static adim dim_at(const kf_type *t, int d) {
    if (!t || t->rank <= d) return unknown_dim;
    adim r = {t->dims[d], t->dims[d] < 0 ? t->syms[d] : 0};
    return r;
}

static adim fixed(int64_t v) {
    adim r = {v, 0};
    return r;
}

/* a and b describe the same dim: the known one wins; two known that differ
 * are an error naming what. */
static kf_status unify(const kf_node *n, adim *a, adim b, const char *what) {
    if (known(*a) && known(b) && a->v != b.v)
        return kf_nn_fail(n, KF_ERR_SHAPE, "%s differ (%lld vs %lld)", what, (long long)a->v, (long long)b.v);
    if (!known(*a) && (known(b) || (!a->sym && b.sym))) *a = b;
    return KF_OK;
}

/* hidden / heads for 3-D inputs; hidden must be a multiple of heads. */
static kf_status split_heads(const kf_node *n, adim hidden, int64_t heads, const char *what, adim *out) {
    *out = unknown_dim;
    if (heads == 1) *out = hidden;
    if (!known(hidden)) return KF_OK;
    if (hidden.v % heads != 0)
        return kf_nn_fail(n, KF_ERR_SHAPE, "%s hidden size %lld is not a multiple of its %lld heads", what,
                          (long long)hidden.v, (long long)heads);
    *out = fixed(hidden.v / heads);
    return KF_OK;
}

static kf_status read_heads(const kf_node *n, const char *name, int64_t *v) {
    *v = 0;
    const kf_attr *a = kf_attr_find(n, name);
    if (!a) return KF_OK;
    if (a->type != KF_ATTR_INT || a->i <= 0)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute %s must be a positive integer", name);
    *v = a->i;
    return KF_OK;
}

static kf_status read_attrs(const kf_node *n, att_attrs *a) {
    memset(a, 0, sizeof *a);
    a->ver = n->opset ? n->opset : 25;
    a->causal = kf_attr_i(n, "is_causal", 0) != 0;
    int64_t mode = kf_attr_i(n, "qk_matmul_output_mode", QK_RAW);
    if (mode < QK_RAW || mode > QK_SOFTMAX)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "qk_matmul_output_mode must be 0..3, not %lld", (long long)mode);
    a->mode = (int)mode;
    const kf_attr *sc = kf_attr_find(n, "scale");
    if (sc) {
        a->has_scale = true;
        a->scale = kf_attr_f(n, "scale", 1.0f);
        if (!(a->scale > 0) || isinf(a->scale))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "scale must be a positive number, not %g", a->scale);
    }
    a->softcap = kf_attr_f(n, "softcap", 0.0f);
    if (!(a->softcap >= 0) || isinf(a->softcap))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "softcap must be a number >= 0, not %g", a->softcap);
    if (kf_attr_find(n, "softmax_precision")) {
        int64_t p = kf_attr_i(n, "softmax_precision", 0);
        if (p != KF_DT_FLOAT && p != KF_DT_FLOAT16 && p != KF_DT_DOUBLE && p != KF_DT_BFLOAT16)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "softmax_precision %lld is not float, float16, double or bfloat16",
                              (long long)p);
        a->softmax = (kf_dtype)p;
    }
    KF_TRY(read_heads(n, "q_num_heads", &a->q_heads));
    KF_TRY(read_heads(n, "kv_num_heads", &a->kv_heads));
    a->left = a->right = -1;
    if (a->ver >= 25) {
        a->left = kf_attr_i(n, "left_window_size", -1);
        a->right = kf_attr_i(n, "right_window_size", -1);
        if (a->left < -1 || a->right < -1)
            return kf_nn_fail(n, KF_ERR_BAD_MODEL, "window sizes must be -1 or >= 0 (left %lld, right %lld)",
                              (long long)a->left, (long long)a->right);
    }
    return KF_OK;
}

static const kf_type *input(int nin, const kf_type *const *in, int i) { return i < nin ? in[i] : NULL; }

static kf_status check_dtypes(const kf_node *n, int nin, const kf_type *const *in) {
    static const char *const names[IN_COUNT] = {"Q", "K", "V", "attn_mask", "past_key", "past_value",
                                                "nonpad_kv_seqlen"};
    for (int i = IN_Q; i <= IN_PAST_V; i++)
        if (i != IN_MASK && input(nin, in, i))
            KF_TRY(kf_nn_check_dtype(n, in[i]->dtype, names[i], kf_nn_float_types));
    /* K and past_key share Q's type; past_value V's */
    static const int pairs[3][2] = {{IN_Q, IN_K}, {IN_Q, IN_PAST_K}, {IN_V, IN_PAST_V}};
    for (int p = 0; p < 3; p++) {
        const kf_type *a = input(nin, in, pairs[p][0]), *b = input(nin, in, pairs[p][1]);
        if (a && b && a->dtype && b->dtype && a->dtype != b->dtype)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s has dtype %s, %s has %s", names[pairs[p][1]],
                              kf_dtype_name(b->dtype), names[pairs[p][0]], kf_dtype_name(a->dtype));
    }
    const kf_type *mask = input(nin, in, IN_MASK);
    if (mask && mask->dtype && mask->dtype != KF_DT_BOOL && !kf_dtype_is_float(mask->dtype) &&
        !kf_dtype_is_int(mask->dtype))
        return kf_nn_fail(n, KF_ERR_SHAPE, "attn_mask has dtype %s, expected bool or a number type",
                          kf_dtype_name(mask->dtype));
    const kf_type *nonpad = input(nin, in, IN_NONPAD);
    if (nonpad && nonpad->dtype && nonpad->dtype != KF_DT_INT64)
        return kf_nn_fail(n, KF_ERR_SHAPE, "nonpad_kv_seqlen has dtype %s, expected int64",
                          kf_dtype_name(nonpad->dtype));
    return KF_OK;
}

/* Checks every input against the others and fills g with what the types
 * say (unknown where they do not). Used by shape inference on partial
 * types and by the kernel on concrete ones, so both judge alike. */
static kf_status geometry(const kf_node *n, const att_attrs *a, int nin, const kf_type *const *in, att_geom *g) {
    const kf_type *q = in[IN_Q], *k = in[IN_K], *v = in[IN_V];
    const kf_type *mask = input(nin, in, IN_MASK), *pk = input(nin, in, IN_PAST_K), *pv = input(nin, in, IN_PAST_V);
    const kf_type *nonpad = input(nin, in, IN_NONPAD);
    KF_TRY(check_dtypes(n, nin, in));
    if (!pk != !pv) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "past_key and past_value must be given together");
    if (nonpad && a->ver < 24)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "nonpad_kv_seqlen is an input from opset 24 on");
    if (nonpad && pk)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "nonpad_kv_seqlen cannot be combined with past_key and past_value");

    g->rank = -1;
    g->B = g->Hq = g->Hkv = g->Sq = g->Skv = g->P = g->T = g->D = g->Dv = unknown_dim;
    const kf_type *qkv[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        int r = qkv[i]->rank;
        if (r < 0) continue;
        if (r != 3 && r != 4) return kf_nn_fail(n, KF_ERR_SHAPE, "Q, K and V must have rank 3 or 4, not %d", r);
        if (g->rank >= 0 && r != g->rank)
            return kf_nn_fail(n, KF_ERR_SHAPE, "Q, K and V must have the same rank (%d vs %d)", g->rank, r);
        g->rank = r;
    }
    if (g->rank == 3 && (!a->q_heads || !a->kv_heads))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "3-D inputs need the q_num_heads and kv_num_heads attributes");
    if (g->rank == 4 && a->ver >= 25 && (a->q_heads || a->kv_heads))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "q_num_heads and kv_num_heads must not be given for 4-D inputs");
    if (g->rank < 0) return KF_OK;
    /* every input is now known to have rank g->rank */
    for (int i = 0; i < 3; i++)
        if (qkv[i]->rank < 0) return KF_OK;

    adim Dk;
    KF_TRY(unify(n, &g->B, dim_at(q, 0), "batch sizes of Q, K and V"));
    KF_TRY(unify(n, &g->B, dim_at(k, 0), "batch sizes of Q, K and V"));
    KF_TRY(unify(n, &g->B, dim_at(v, 0), "batch sizes of Q, K and V"));
    if (g->rank == 3) {
        g->Hq = fixed(a->q_heads);
        g->Hkv = fixed(a->kv_heads);
        g->Sq = dim_at(q, 1);
        KF_TRY(unify(n, &g->Skv, dim_at(k, 1), "sequence lengths of K and V"));
        KF_TRY(unify(n, &g->Skv, dim_at(v, 1), "sequence lengths of K and V"));
        KF_TRY(split_heads(n, dim_at(q, 2), a->q_heads, "Q", &g->D));
        KF_TRY(split_heads(n, dim_at(k, 2), a->kv_heads, "K", &Dk));
        KF_TRY(split_heads(n, dim_at(v, 2), a->kv_heads, "V", &g->Dv));
    } else {
        g->Hq = dim_at(q, 1);
        KF_TRY(unify(n, &g->Hkv, dim_at(k, 1), "head counts of K and V"));
        KF_TRY(unify(n, &g->Hkv, dim_at(v, 1), "head counts of K and V"));
        g->Sq = dim_at(q, 2);
        KF_TRY(unify(n, &g->Skv, dim_at(k, 2), "sequence lengths of K and V"));
        KF_TRY(unify(n, &g->Skv, dim_at(v, 2), "sequence lengths of K and V"));
        g->D = dim_at(q, 3);
        Dk = dim_at(k, 3);
        g->Dv = dim_at(v, 3);
        if (a->q_heads) KF_TRY(unify(n, &g->Hq, fixed(a->q_heads), "q_num_heads and the heads of Q"));
        if (a->kv_heads) KF_TRY(unify(n, &g->Hkv, fixed(a->kv_heads), "kv_num_heads and the heads of K"));
    }
    KF_TRY(unify(n, &g->D, Dk, "head sizes of Q and K"));
    if (known(g->Hkv) && known(g->Hq) && (g->Hkv.v == 0 || g->Hq.v % g->Hkv.v != 0))
        return kf_nn_fail(n, KF_ERR_SHAPE, "%lld query heads are not a multiple of %lld key/value heads",
                          (long long)g->Hq.v, (long long)g->Hkv.v);

    g->P = fixed(0);
    if (pk) {
        if (pk->rank >= 0 && pk->rank != 4)
            return kf_nn_fail(n, KF_ERR_SHAPE, "past_key must have rank 4, not %d", pk->rank);
        if (pv->rank >= 0 && pv->rank != 4)
            return kf_nn_fail(n, KF_ERR_SHAPE, "past_value must have rank 4, not %d", pv->rank);
        g->P = unknown_dim;
        KF_TRY(unify(n, &g->B, dim_at(pk, 0), "batch sizes of past_key and Q"));
        KF_TRY(unify(n, &g->B, dim_at(pv, 0), "batch sizes of past_value and Q"));
        KF_TRY(unify(n, &g->Hkv, dim_at(pk, 1), "head counts of past_key and K"));
        KF_TRY(unify(n, &g->Hkv, dim_at(pv, 1), "head counts of past_value and V"));
        KF_TRY(unify(n, &g->P, dim_at(pk, 2), "sequence lengths of past_key and past_value"));
        KF_TRY(unify(n, &g->P, dim_at(pv, 2), "sequence lengths of past_key and past_value"));
        KF_TRY(unify(n, &g->D, dim_at(pk, 3), "head sizes of past_key and K"));
        KF_TRY(unify(n, &g->Dv, dim_at(pv, 3), "head sizes of past_value and V"));
    }
    if (known(g->P) && known(g->Skv)) g->T = fixed(g->P.v + g->Skv.v);
    else if (g->P.v == 0) g->T = g->Skv;
    else if (g->Skv.v == 0) g->T = g->P;

    if (mask && mask->rank >= 0) {
        if (mask->rank < 1 || mask->rank > 4)
            return kf_nn_fail(n, KF_ERR_SHAPE, "attn_mask must have rank 1 to 4, not %d", mask->rank);
        adim target[3] = {g->B, g->Hq, g->Sq};
        static const char *const tname[3] = {"batch size", "query heads", "query length"};
        for (int d = 0; d < mask->rank - 1; d++) {
            int t = 4 - mask->rank + d;
            adim m = dim_at(mask, d);
            if (known(m) && known(target[t]) && m.v != 1 && m.v != target[t].v)
                return kf_nn_fail(n, KF_ERR_SHAPE, "attn_mask dim %d (%lld) does not broadcast to the %s %lld", d,
                                  (long long)m.v, tname[t], (long long)target[t].v);
        }
        adim last = dim_at(mask, mask->rank - 1);
        if (known(last) && known(g->T) && last.v > g->T.v)
            return kf_nn_fail(n, KF_ERR_SHAPE, "attn_mask covers %lld keys, more than the %lld of past_key and K",
                              (long long)last.v, (long long)g->T.v);
    }
    if (nonpad && nonpad->rank >= 0) {
        adim b = dim_at(nonpad, 0);
        if (nonpad->rank != 1 || (known(b) && known(g->B) && b.v != g->B.v))
            return kf_nn_fail(n, KF_ERR_SHAPE, "nonpad_kv_seqlen must have shape (batch_size)");
    }
    return KF_OK;
}

/* ---- shape ------------------------------------------------------------------------- */

static void set_dims(kf_type *t, int rank, const adim *d) {
    t->rank = rank;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = d[i].v;
        t->syms[i] = d[i].v < 0 ? d[i].sym : 0;
    }
}

/* Hq * Dv, the last dim of a 3-D Y: V's hidden size when the head counts
 * agree (its symbol kept). */
static adim y_hidden(const att_geom *g, const kf_type *v) {
    if (known(g->Hq) && known(g->Hkv) && g->Hq.v == g->Hkv.v) return dim_at(v, 2);
    if (known(g->Hq) && known(g->Dv)) return fixed(g->Hq.v * g->Dv.v);
    return unknown_dim;
}

/* Y like Q in the layout of Q (Dv for the head size); present_key and
 * present_value (B, Hkv, P + Skv, D | Dv) in K's and V's types;
 * qk_matmul_output (B, Hq, Sq, P + Skv) in Q's. Outputs the node does not
 * have stay unknown (the evaluator allocates nothing for them). */
kf_status kf_nn_attention_shape(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                                int nout, kf_type *out) {
    (void)val;
    if (nin < 3 || !in[IN_Q] || !in[IN_K] || !in[IN_V]) return KF_OK;
    att_attrs a;
    KF_TRY(read_attrs(n, &a));
    att_geom g;
    KF_TRY(geometry(n, &a, nin, in, &g));
    for (int j = 0; j < nout && j < OUT_COUNT; j++) {
        if (n->out && !n->out[j]) continue;
        kf_type *o = &out[j];
        o->dtype = j == OUT_PRESENT_K ? in[IN_K]->dtype : j == OUT_PRESENT_V ? in[IN_V]->dtype : in[IN_Q]->dtype;
        if (g.rank < 0 || in[IN_Q]->rank < 0 || in[IN_K]->rank < 0 || in[IN_V]->rank < 0) continue;
        if (j == OUT_Y && g.rank == 3) {
            adim d[3] = {g.B, g.Sq, y_hidden(&g, in[IN_V])};
            set_dims(o, 3, d);
        } else if (j == OUT_Y) {
            adim d[4] = {g.B, g.Hq, g.Sq, g.Dv};
            set_dims(o, 4, d);
        } else if (j == OUT_QK) {
            adim d[4] = {g.B, g.Hq, g.Sq, g.T};
            set_dims(o, 4, d);
        } else {
            adim d[4] = {g.B, g.Hkv, g.T, j == OUT_PRESENT_K ? g.D : g.Dv};
            set_dims(o, 4, d);
        }
    }
    return KF_OK;
}

/* ---- kernel ------------------------------------------------------------------------ */

/* Element (b, h, s, d) of a tensor holding heads either as dim 1 (4-D:
 * B, H, S, D) or inside its last dim (3-D: B, S, H * D). */
static int64_t at4(int rank, int64_t b, int64_t h, int64_t s, int64_t d, int64_t H, int64_t S, int64_t D) {
    return rank == 4 ? ((b * H + h) * S + s) * D + d : ((b * S + s) * H + h) * D + d;
}

/* sum a[i] * b[i * bstride]: in float32 when both operands are 16-bit (as
 * the reference's matmul does), else in double. */
static double dot(bool in_f32, const double *a, const double *b, int64_t n, int64_t bstride) {
    if (in_f32) {
        float s = 0;
        for (int64_t i = 0; i < n; i++) s += (float)a[i] * (float)b[i * bstride];
        return s;
    }
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i * bstride];
    return s;
}

static bool is16(kf_dtype dt) { return dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16; }

/* Everything one evaluation needs beside the tensors. */
typedef struct att_run {
    const kf_node *n;
    att_attrs a;
    att_geom g;
    int64_t B, Hq, Hkv, Sq, Skv, P, T, D, Dv; /* g's dims, all known */
    kf_dtype t;                               /* Q's type: every intermediate is rounded to it */
    double qk_scale;                          /* sqrt(scale) in t, applied to Q and to K */
    double cap;                               /* softcap in t */
    int64_t mstride[4];                       /* attn_mask strides over (B, Hq, Sq, keys); 0 broadcasts */
    int64_t mkeys;                            /* keys the mask covers; the rest are masked */
    const int64_t *nonpad;                    /* per-batch valid keys, or NULL */
} att_run;

/* The additive bias of the keys of query i in head h of batch b: the mask
 * (True -> 0, False -> -inf, or its value), -inf for keys the causal mask,
 * the sliding window or nonpad_kv_seqlen excludes. Causal and window
 * positions count from offset = the past length, or nonpad - Sq with an
 * external cache. */
static void bias_row(const att_run *r, const kf_tensor *mask, int64_t b, int64_t h, int64_t i, double *bias) {
    int64_t offset = r->P;
    if (r->nonpad) offset = r->nonpad[b] - r->Sq;
    int64_t base = b * r->mstride[0] + h * r->mstride[1] + i * r->mstride[2];
    for (int64_t j = 0; j < r->T; j++) {
        double v = 0;
        if (mask && j >= r->mkeys) v = -INFINITY;
        else if (mask && mask->dtype == KF_DT_BOOL) v = kf_get_i64(mask, base + j * r->mstride[3]) ? 0 : -INFINITY;
        else if (mask) v = kf_get_f64(mask, base + j * r->mstride[3]);
        int64_t ahead = i + offset - j; /* > 0: key j precedes query i */
        if (r->a.causal && ahead < 0) v = -INFINITY;
        if (r->a.left >= 0 && ahead > r->a.left) v = -INFINITY;
        if (r->a.right >= 0 && -ahead > r->a.right) v = -INFINITY;
        if (r->nonpad && j >= r->nonpad[b]) v = -INFINITY;
        bias[j] = v;
    }
}

/* The present cache of one kind for batch b, kv head hk: the past rows
 * then those of now (K or V), row j of `size` values at dst[j * size],
 * multiplied by mult and rounded to now's type (keys take sqrt(scale),
 * values 1). Copied unscaled into present when the node has that output. */
static void load_cache(const att_run *r, const kf_tensor *past, const kf_tensor *now, int64_t size, double mult,
                       int64_t b, int64_t hk, double *dst, kf_tensor *present) {
    for (int64_t j = 0; j < r->T; j++) {
        bool in_past = j < r->P;
        int64_t s = in_past ? j : j - r->P;
        for (int64_t d = 0; d < size; d++) {
            double x = in_past ? kf_get_f64(past, ((b * r->Hkv + hk) * r->P + s) * size + d)
                               : kf_get_f64(now, at4(r->g.rank, b, hk, s, d, r->Hkv, r->Skv, size));
            if (present) kf_set_f64(present, ((b * r->Hkv + hk) * r->T + j) * size + d, x);
            dst[j * size + d] = kf_nn_round_to(now->dtype, x * mult);
        }
    }
}

/* Scratch rows of one query: T scores at each stage, and the scaled query. */
typedef struct att_rows {
    double *raw, *capped, *biased, *prob, *bias, *q;
} att_rows;

/* Query i of head h in batch b against the keys ks and values vs of its
 * kv head: writes its row of Y and of qk_matmul_output (when qk). Every
 * arrow rounds to Q's type; the softmax runs in softmax_precision:
 *
 *   (q*sqrt(scale)).(k*sqrt(scale)) -> raw -> softcap -> capped -> + bias -> biased -> softmax -> prob -> prob.V -> Y
 *                                 mode 0               mode 1             mode 2                mode 3
 */
static void attend(const att_run *r, const kf_tensor *const *in, int64_t b, int64_t h, int64_t i, const double *ks,
                   const double *vs, att_rows *w, kf_tensor *y, kf_tensor *qk) {
    const kf_tensor *q = in[IN_Q];
    kf_dtype t = r->t, p = r->a.softmax ? r->a.softmax : t;
    for (int64_t d = 0; d < r->D; d++)
        w->q[d] = kf_nn_round_to(t, kf_get_f64(q, at4(r->g.rank, b, h, i, d, r->Hq, r->Sq, r->D)) * r->qk_scale);
    bias_row(r, in[IN_MASK], b, h, i, w->bias);
    bool all_masked = true;
    for (int64_t j = 0; j < r->T; j++) {
        double s = kf_nn_round_to(t, dot(is16(t), w->q, ks + j * r->D, r->D, 1));
        w->raw[j] = s;
        if (r->cap > 0) {
            double u = kf_nn_round_to(t, tanh(kf_nn_round_to(t, s / r->cap)));
            s = kf_nn_round_to(t, u * r->cap);
        }
        w->capped[j] = s;
        w->biased[j] = kf_nn_round_to(t, s + w->bias[j]);
        w->prob[j] = kf_nn_round_to(p, w->biased[j]);
        all_masked = all_masked && w->bias[j] == -INFINITY;
    }
    kf_nn_softmax_row(p, w->prob, r->T, true, true);
    /* a query that may attend no key gets zeros, decided on the bias (its
     * scores may be NaN) */
    for (int64_t j = 0; j < r->T; j++) w->prob[j] = all_masked ? 0 : kf_nn_round_to(t, w->prob[j]);
    if (qk) {
        const double *src = r->a.mode == QK_RAW      ? w->raw
                            : r->a.mode == QK_SOFTCAP ? w->capped
                            : r->a.mode == QK_BIAS    ? w->biased
                                                      : w->prob;
        int64_t row = ((b * r->Hq + h) * r->Sq + i) * r->T;
        for (int64_t j = 0; j < r->T; j++) kf_set_f64(qk, row + j, src[j]);
    }
    if (!y) return;
    bool in_f32 = is16(t) && is16(in[IN_V]->dtype);
    for (int64_t d = 0; d < r->Dv; d++)
        kf_set_f64(y, at4(r->g.rank, b, h, i, d, r->Hq, r->Sq, r->Dv), dot(in_f32, w->prob, vs + d, r->T, r->Dv));
}

/* Fills r from the checked geometry: dims, scale, mask strides, nonpad. */
static kf_status prepare_run(att_run *r, const kf_tensor *const *in, int64_t **nonpad) {
    const att_geom *g = &r->g;
    r->B = g->B.v, r->Hq = g->Hq.v, r->Hkv = g->Hkv.v, r->Sq = g->Sq.v, r->Skv = g->Skv.v;
    r->P = g->P.v, r->T = g->T.v, r->D = g->D.v, r->Dv = g->Dv.v;
    r->t = in[IN_Q]->dtype;
    double scale = r->a.has_scale ? r->a.scale : 1.0 / sqrt((double)r->D);
    r->qk_scale = kf_nn_round_to(r->t, sqrt(scale));
    r->cap = kf_nn_round_to(r->t, r->a.softcap);
    const kf_tensor *mask = in[IN_MASK];
    memset(r->mstride, 0, sizeof r->mstride);
    if (mask) {
        int64_t st[KF_MAX_RANK];
        kf_strides(mask->rank, mask->dims, st);
        for (int d = 0; d < mask->rank; d++)
            if (mask->dims[d] != 1 || d == mask->rank - 1) r->mstride[4 - mask->rank + d] = st[d];
        r->mkeys = mask->dims[mask->rank - 1];
    }
    *nonpad = NULL;
    r->nonpad = NULL;
    if (in[IN_NONPAD]) {
        int64_t count;
        KF_TRY(kf_read_ints(r->n, in[IN_NONPAD], "nonpad_kv_seqlen", nonpad, &count));
        for (int64_t b = 0; b < count; b++)
            if ((*nonpad)[b] < 0 || (*nonpad)[b] > r->T) {
                kf_status st = kf_nn_fail(r->n, KF_ERR_RUNTIME, "nonpad_kv_seqlen[%lld] = %lld is outside 0..%lld",
                                          (long long)b, (long long)(*nonpad)[b], (long long)r->T);
                kf_free(*nonpad);
                *nonpad = NULL;
                return st;
            }
        r->nonpad = *nonpad;
    }
    return KF_OK;
}

/* Y and whichever of present_key, present_value and qk_matmul_output the
 * node has. Errors name the node: inconsistent shapes or attributes (as the
 * shape function judges them), nonpad_kv_seqlen values outside 0..keys
 * (KF_ERR_RUNTIME), rows of keys too large to hold. */
kf_status kf_nn_attention_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    att_run r = {.n = n};
    KF_TRY(read_attrs(n, &r.a));
    kf_type types[IN_COUNT];
    const kf_type *tp[IN_COUNT] = {NULL};
    const kf_tensor *ins[IN_COUNT] = {NULL};
    for (int i = 0; i < nin && i < IN_COUNT; i++) {
        ins[i] = in[i];
        if (!in[i]) continue;
        kf_type_of_tensor(&types[i], in[i]);
        tp[i] = &types[i];
    }
    KF_TRY(geometry(n, &r.a, IN_COUNT, tp, &r.g));
    int64_t *nonpad = NULL;
    KF_TRY(prepare_run(&r, ins, &nonpad));

    kf_tensor *want[OUT_COUNT] = {NULL};
    kf_status st = KF_OK;
    for (int j = 0; j < nout && j < OUT_COUNT; j++)
        if (n->out[j]) want[j] = &out[j];
    /* output shapes: what the shape function gives for these inputs */
    kf_type otypes[OUT_COUNT];
    for (int j = 0; j < OUT_COUNT; j++) kf_type_unknown(&otypes[j]);
    st = kf_nn_attention_shape(n, IN_COUNT, tp, NULL, nout < OUT_COUNT ? nout : OUT_COUNT, otypes);
    for (int j = 0; j < OUT_COUNT && !st; j++)
        if (want[j]) st = kf_output_prepare(n, want[j], otypes[j].dtype, otypes[j].rank, otypes[j].dims);

    /* the key rows of one kv head and the score rows of one query are held
     * in double: each must fit what one tensor may hold (an empty K may
     * declare any sequence length) */
    int64_t T1 = r.T > 0 ? r.T : 1, kn = 0, vn = 0, rn = 0;
    if (!st && (!kf_mul_ok(T1, r.D + 1, &kn) || !kf_mul_ok(T1, r.Dv + 1, &vn) || !kf_mul_ok(T1, 5, &rn) ||
                kn > ATT_MAX_ROW || vn > ATT_MAX_ROW || rn > ATT_MAX_ROW || r.D > ATT_MAX_ROW))
        st = kf_nn_fail(n, KF_ERR_SHAPE, "%lld keys of head sizes %lld and %lld do not fit in memory",
                        (long long)r.T, (long long)r.D, (long long)r.Dv);
    double *ks = NULL, *vs = NULL, *rows = NULL;
    bool work = r.B > 0 && r.Hkv > 0; /* else every output is empty */
    if (!st && work) {
        ks = kf_calloc((size_t)kn, sizeof(double));
        vs = kf_calloc((size_t)vn, sizeof(double));
        rows = kf_calloc((size_t)(rn + r.D + 1), sizeof(double));
        if (!ks || !vs || !rows) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (!st && work) {
        att_rows w = {rows, rows + T1, rows + 2 * T1, rows + 3 * T1, rows + 4 * T1, rows + 5 * T1};
        int64_t group = r.Hq / r.Hkv; /* query heads per kv head, kv head h / group serves head h */
        for (int64_t b = 0; b < r.B; b++)
            for (int64_t hk = 0; hk < r.Hkv; hk++) {
                load_cache(&r, ins[IN_PAST_K], ins[IN_K], r.D, r.qk_scale, b, hk, ks, want[OUT_PRESENT_K]);
                load_cache(&r, ins[IN_PAST_V], ins[IN_V], r.Dv, 1, b, hk, vs, want[OUT_PRESENT_V]);
                for (int64_t h = hk * group; h < (hk + 1) * group; h++)
                    for (int64_t i = 0; i < r.Sq; i++) attend(&r, ins, b, h, i, ks, vs, &w, want[OUT_Y], want[OUT_QK]);
            }
    }
    kf_free(ks);
    kf_free(vs);
    kf_free(rows);
    kf_free(nonpad);
    return st;
}

/* ---- LinearAttention (opset 27) ---------------------------------------------------- */

/*
 * Recurrent linear attention over 3-D inputs: q [B, T, Hq*dk], k [B, T,
 * Hkv*dk], v [B, T, Hkv*dv]. Each kv head keeps a state S [dk, dv]
 * (past_state [B, Hkv, dk, dv], or zeros) and, for every step t:
 *
 *   gated:  S *= exp(g_t)             g per head, or per key dim (decay)
 *   delta:  v_t = beta_t * (v_t - S^T k_t)                        (beta)
 *   always: S += k_t v_t^T;  out_t(query head h) = scale * S^T q_t
 *
 * with query head h reading kv head h / (Hq / Hkv); update_rule picks the
 * steps: linear (neither), gated, delta, gated_delta (both, the default).
 * scale 0 means 1/sqrt(dk). The state is kept in double and rounded to
 * the output types once; present_state has past_state's type (else q's).
 * chunk_size only tunes chunked implementations and changes nothing here.
 */
static const kf_dtype la_types[] = {KF_DT_FLOAT, KF_DT_FLOAT16, KF_DT_BFLOAT16, KF_DT_UNDEFINED};

typedef struct la_plan {
    int64_t hq, hkv, dk, dv;
    bool gating, delta;
} la_plan;

static kf_status la_attrs(const kf_node *n, la_plan *p) {
    const char *rule = kf_attr_s(n, "update_rule", "gated_delta");
    if (!strcmp(rule, "linear")) p->gating = false, p->delta = false;
    else if (!strcmp(rule, "gated")) p->gating = true, p->delta = false;
    else if (!strcmp(rule, "delta")) p->gating = false, p->delta = true;
    else if (!strcmp(rule, "gated_delta")) p->gating = true, p->delta = true;
    else return kf_nn_fail(n, KF_ERR_BAD_MODEL, "update_rule '%s' is not linear, gated, delta or gated_delta", rule);
    p->hq = kf_attr_i(n, "q_num_heads", 0);
    p->hkv = kf_attr_i(n, "kv_num_heads", 0);
    if (p->hq <= 0 || p->hkv <= 0 || p->hq % p->hkv)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "q_num_heads %lld must be a positive multiple of kv_num_heads %lld",
                          (long long)p->hq, (long long)p->hkv);
    return KF_OK;
}

kf_status kf_nn_linear_attention_shape(const kf_node *n, int nin, const kf_type *const *in,
                                       const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    la_plan p;
    KF_TRY(la_attrs(n, &p));
    const kf_type *q = nin > 0 ? in[0] : NULL, *k = nin > 1 ? in[1] : NULL, *v = nin > 2 ? in[2] : NULL;
    const kf_type *past = nin > 3 ? in[3] : NULL, *decay = nin > 4 ? in[4] : NULL, *beta = nin > 5 ? in[5] : NULL;
    if (p.gating != (decay != NULL) || p.delta != (beta != NULL))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "update_rule %s decay and %s beta", p.gating ? "needs" : "forbids",
                          p.delta ? "needs" : "forbids");
    const char *names[6] = {"query", "key", "value", "past_state", "decay", "beta"};
    for (int i = 0; i < nin && i < 6; i++)
        if (in[i]) KF_TRY(kf_nn_check_dtype(n, in[i]->dtype, names[i], la_types));
    if (!q || !k || !v) return KF_OK;
    for (int i = 0; i < 3; i++)
        if (in[i]->rank >= 0 && in[i]->rank != 3)
            return kf_nn_fail(n, KF_ERR_SHAPE, "%s must be rank 3 (batch, seq, heads * size), it has rank %d",
                              names[i], in[i]->rank);
    if (q->rank != 3 || v->rank != 3) {
        out[0].dtype = q->dtype;
        if (nout > 1) out[1].dtype = past ? past->dtype : q->dtype;
        return KF_OK;
    }
    if ((q->dims[2] >= 0 && q->dims[2] % p.hq) || (v->dims[2] >= 0 && v->dims[2] % p.hkv))
        return kf_nn_fail(n, KF_ERR_SHAPE, "hidden sizes %lld and %lld do not split into %lld and %lld heads",
                          (long long)q->dims[2], (long long)v->dims[2], (long long)p.hq, (long long)p.hkv);
    int64_t dk = q->dims[2] >= 0 ? q->dims[2] / p.hq : -1, dv = v->dims[2] >= 0 ? v->dims[2] / p.hkv : -1;
    out[0] = *q;
    out[0].dims[2] = dv >= 0 ? p.hq * dv : -1;
    out[0].syms[2] = 0;
    if (nout > 1) {
        out[1].dtype = past ? past->dtype : q->dtype;
        out[1].rank = 4;
        int64_t d[4] = {q->dims[0], p.hkv, dk, dv};
        memcpy(out[1].dims, d, sizeof d);
        out[1].syms[0] = q->syms[0];
    }
    return KF_OK;
}

kf_status kf_nn_linear_attention_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                      kf_tensor *out) {
    la_plan p;
    KF_TRY(la_attrs(n, &p));
    kf_type ty[6], to[2];
    const kf_type *tp[6] = {NULL};
    for (int i = 0; i < nin && i < 6; i++)
        if (in[i]) {
            kf_type_of_tensor(&ty[i], in[i]);
            tp[i] = &ty[i];
        }
    kf_type_unknown(&to[0]);
    kf_type_unknown(&to[1]);
    KF_TRY(kf_nn_linear_attention_shape(n, nin < 6 ? nin : 6, tp, NULL, 2, to));
    const kf_tensor *q = in[0], *k = in[1], *v = in[2];
    const kf_tensor *past = nin > 3 ? in[3] : NULL, *decay = nin > 4 ? in[4] : NULL, *beta = nin > 5 ? in[5] : NULL;
    int64_t B = q->dims[0], T = q->dims[1], dk = q->dims[2] / p.hq, dv = v->dims[2] / p.hkv, group = p.hq / p.hkv;
    if (k->dims[0] != B || v->dims[0] != B || k->dims[1] != T || v->dims[1] != T || k->dims[2] != p.hkv * dk)
        return kf_nn_fail(n, KF_ERR_SHAPE, "key and value must be [%lld, %lld, kv_num_heads * size]", (long long)B,
                          (long long)T);
    int64_t dlast = decay ? decay->dims[decay->rank - 1] : 0, blast = beta ? beta->dims[beta->rank - 1] : 0;
    if (decay && (decay->rank != 3 || decay->dims[0] != B || decay->dims[1] != T ||
                  (dlast != p.hkv && dlast != p.hkv * dk)))
        return kf_nn_fail(n, KF_ERR_SHAPE, "decay must be [%lld, %lld, kv_num_heads or kv_num_heads * %lld]",
                          (long long)B, (long long)T, (long long)dk);
    if (beta && (beta->rank != 3 || beta->dims[0] != B || beta->dims[1] != T || (blast != p.hkv && blast != 1)))
        return kf_nn_fail(n, KF_ERR_SHAPE, "beta must be [%lld, %lld, kv_num_heads or 1]", (long long)B, (long long)T);
    if (past && (past->rank != 4 || past->dims[0] != B || past->dims[1] != p.hkv || past->dims[2] != dk ||
                 past->dims[3] != dv))
        return kf_nn_fail(n, KF_ERR_SHAPE, "past_state must be [%lld, %lld, %lld, %lld]", (long long)B,
                          (long long)p.hkv, (long long)dk, (long long)dv);
    for (int j = 0; j < nout && j < 2; j++)
        if (!out[j].data) KF_TRY(kf_tensor_alloc(&out[j], to[j].dtype, to[j].rank, to[j].dims));
    float sattr = kf_attr_f(n, "scale", 0.0f);
    double scale = sattr == 0.0f ? 1.0 / sqrt((double)dk) : (double)sattr;
    int64_t ssz;
    if (!kf_mul_ok(dk, dv, &ssz)) return kf_nn_fail(n, KF_ERR_SHAPE, "state too large");
    double *S = kf_calloc((size_t)ssz + 1, sizeof(double)), *vt = kf_calloc((size_t)dv + 1, sizeof(double));
    if (!S || !vt) {
        kf_free(S), kf_free(vt);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < p.hkv; h++) {
            for (int64_t e = 0; e < ssz; e++) S[e] = past ? kf_get_f64(past, (b * p.hkv + h) * ssz + e) : 0.0;
            for (int64_t t = 0; t < T; t++) {
                int64_t row = b * T + t;
                const int64_t kb = row * p.hkv * dk + h * dk, vb = row * p.hkv * dv + h * dv;
                if (decay)
                    for (int64_t d = 0; d < dk; d++) {
                        double g = exp(kf_get_f64(decay, row * dlast + (dlast == p.hkv ? h : h * dk + d)));
                        for (int64_t m = 0; m < dv; m++) S[d * dv + m] *= g;
                    }
                for (int64_t m = 0; m < dv; m++) vt[m] = kf_get_f64(v, vb + m);
                if (beta) {
                    double bt = kf_get_f64(beta, row * blast + (blast == 1 ? 0 : h));
                    for (int64_t m = 0; m < dv; m++) {
                        double r = 0;
                        for (int64_t d = 0; d < dk; d++) r += S[d * dv + m] * kf_get_f64(k, kb + d);
                        vt[m] = bt * (vt[m] - r);
                    }
                }
                for (int64_t d = 0; d < dk; d++) {
                    double kd = kf_get_f64(k, kb + d);
                    for (int64_t m = 0; m < dv; m++) S[d * dv + m] += kd * vt[m];
                }
                for (int64_t hq = h * group; hq < (h + 1) * group; hq++) {
                    const int64_t qb = row * p.hq * dk + hq * dk, ob = row * p.hq * dv + hq * dv;
                    for (int64_t m = 0; m < dv; m++) {
                        double o = 0;
                        for (int64_t d = 0; d < dk; d++) o += kf_get_f64(q, qb + d) * S[d * dv + m];
                        kf_set_f64(&out[0], ob + m, scale * o);
                    }
                }
            }
            if (nout > 1)
                for (int64_t e = 0; e < ssz; e++) kf_set_f64(&out[1], (b * p.hkv + h) * ssz + e, S[e]);
        }
    kf_free(S);
    kf_free(vt);
    return KF_OK;
}
