/*
 * ops_nn_rnn.c: reference kernels and shape functions of the recurrent
 * ops RNN, GRU and LSTM (opset 7 on): forward, reverse and bidirectional,
 * every activation of the spec with its alpha/beta, clip, sequence_lens,
 * initial states, LSTM peepholes and input_forget, both layouts (opset 14).
 * One step function per op, state kept in double.
 */
#include <math.h>
#include <string.h>

#include "ops_nn_util.h"

enum { K_RNN, K_GRU, K_LSTM };

typedef enum {
    A_RELU,
    A_TANH,
    A_SIGMOID,
    A_AFFINE,
    A_LEAKY,
    A_THRESH,
    A_STANH,
    A_HSIGMOID,
    A_ELU,
    A_SOFTSIGN,
    A_SOFTPLUS
} act_kind;

typedef struct act {
    act_kind k;
    double alpha, beta;
} act;

static double act_apply(const act *a, double x) {
    switch (a->k) {
    case A_RELU: return x > 0 ? x : 0;
    case A_TANH: return tanh(x);
    case A_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case A_AFFINE: return a->alpha * x + a->beta;
    case A_LEAKY: return x >= 0 ? x : a->alpha * x;
    case A_THRESH: return x > a->alpha ? x : 0;
    case A_STANH: return a->alpha * tanh(a->beta * x);
    case A_HSIGMOID: {
        double v = a->alpha * x + a->beta;
        return v < 0 ? 0 : v > 1 ? 1 : v;
    }
    case A_ELU: return x >= 0 ? x : a->alpha * (exp(x) - 1);
    case A_SOFTSIGN: return x / (1 + fabs(x));
    case A_SOFTPLUS: return log1p(exp(-fabs(x))) + (x > 0 ? x : 0);
    }
    return x;
}

/* Name -> kind, default alpha/beta, and how many of them it consumes. */
static const struct {
    const char *name;
    act_kind k;
    double alpha, beta;
    int nalpha, nbeta;
} act_table[] = {
    {"Relu", A_RELU, 0, 0, 0, 0},
    {"Tanh", A_TANH, 0, 0, 0, 0},
    {"Sigmoid", A_SIGMOID, 0, 0, 0, 0},
    {"Affine", A_AFFINE, 1.0, 0.0, 1, 1},
    {"LeakyRelu", A_LEAKY, 0.01, 0, 1, 0},
    {"ThresholdedRelu", A_THRESH, 1.0, 0, 1, 0},
    {"ScaledTanh", A_STANH, 1.0, 1.0, 1, 1},
    {"HardSigmoid", A_HSIGMOID, 0.2, 0.5, 1, 1},
    {"Elu", A_ELU, 1.0, 0, 1, 0},
    {"Softsign", A_SOFTSIGN, 0, 0, 0, 0},
    {"Softplus", A_SOFTPLUS, 0, 0, 0, 0},
};

#define MAX_ACTS 6 /* 3 per direction (LSTM) x 2 directions */

typedef struct rnn_cfg {
    int kind, gates, nacts; /* activations per direction */
    int ndir;               /* 1 or 2 */
    bool reverse_only;
    int64_t H;
    bool layout1;
    double clip; /* <= 0: none */
    bool linear_before_reset, input_forget;
    act acts[MAX_ACTS];
} rnn_cfg;

static int rnn_kind(const kf_node *n) {
    if (strcmp(n->op_type, "GRU") == 0) return K_GRU;
    if (strcmp(n->op_type, "LSTM") == 0) return K_LSTM;
    return K_RNN;
}

/* Reads the attributes (H may stay -1 when neither the attribute nor R's
 * type gives it). */
static kf_status rnn_config(const kf_node *n, const kf_type *r, rnn_cfg *c) {
    memset(c, 0, sizeof *c);
    c->kind = rnn_kind(n);
    c->gates = c->kind == K_RNN ? 1 : c->kind == K_GRU ? 3 : 4;
    c->nacts = c->kind == K_RNN ? 1 : c->kind == K_GRU ? 2 : 3;
    const char *dir = kf_attr_s(n, "direction", "forward");
    if (strcmp(dir, "forward") == 0) c->ndir = 1;
    else if (strcmp(dir, "reverse") == 0) c->ndir = 1, c->reverse_only = true;
    else if (strcmp(dir, "bidirectional") == 0) c->ndir = 2;
    else
        return kf_nn_fail(n, KF_ERR_BAD_MODEL,
                          "direction '%s' is not forward, reverse or bidirectional", dir);
    c->H = kf_attr_i(n, "hidden_size", -1);
    if (kf_attr_find(n, "hidden_size") && c->H < 1)
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "hidden_size must be >= 1");
    if (c->H < 0 && r && r->rank == 3) c->H = r->dims[2];
    int64_t layout = kf_attr_i(n, "layout", 0);
    if (layout != 0 && layout != 1) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "layout must be 0 or 1");
    c->layout1 = layout == 1;
    const kf_attr *cl = kf_attr_find(n, "clip");
    c->clip = cl ? cl->f : 0;
    if (cl && !(c->clip > 0)) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "clip must be positive");
    c->linear_before_reset = kf_attr_i(n, "linear_before_reset", 0) != 0;
    c->input_forget = kf_attr_i(n, "input_forget", 0) != 0;
    if (kf_attr_find(n, "output_sequence"))
        return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "attribute 'output_sequence' (before opset 7)");
    /* activations: per direction, defaults f = Sigmoid (Tanh for RNN), g = h = Tanh */
    static const char *defs[3][3] = {{"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
    const kf_attr *aa = kf_attr_find(n, "activations");
    int na = aa ? aa->n : 0;
    if (aa && (aa->type != KF_ATTR_STRINGS || (na != c->nacts && na != c->nacts * c->ndir)))
        return kf_nn_fail(n, KF_ERR_BAD_MODEL, "activations must list %d names per direction",
                          c->nacts);
    int nal = 0, nbe = 0;
    const float *al = kf_attr_floats(n, "activation_alpha", &nal);
    const float *be = kf_attr_floats(n, "activation_beta", &nbe);
    int ia = 0, ib = 0;
    for (int j = 0; j < c->nacts * c->ndir; j++) {
        const char *name = defs[c->kind][j % c->nacts];
        size_t len = strlen(name);
        if (aa) {
            const kf_bytes *s = &aa->strings[j % na];
            name = s->ptr;
            len = s->len;
        }
        size_t t = 0, nt = sizeof act_table / sizeof *act_table;
        for (; t < nt; t++)
            if (strlen(act_table[t].name) == len && strncmp(act_table[t].name, name, len) == 0)
                break;
        if (t == nt) return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "activation '%.*s'", (int)len, name);
        c->acts[j].k = act_table[t].k;
        c->acts[j].alpha = act_table[t].alpha;
        c->acts[j].beta = act_table[t].beta;
        if (aa && act_table[t].nalpha && ia < nal) c->acts[j].alpha = al[ia++];
        if (aa && act_table[t].nbeta && ib < nbe) c->acts[j].beta = be[ib++];
    }
    return KF_OK;
}

kf_status kf_nn_rnn_shape(const kf_node *n, int nin, const kf_type *const *in,
                          const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 3 || !in[0]) return KF_OK;
    KF_TRY(kf_nn_check_dtype(n, in[0]->dtype, "X", kf_nn_float_types));
    rnn_cfg c;
    KF_TRY(rnn_config(n, in[2], &c));
    const kf_type *x = in[0];
    for (int j = 0; j < nout; j++) out[j].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    if (x->rank != 3) return kf_nn_fail(n, KF_ERR_SHAPE, "X must have rank 3, not %d", x->rank);
    int sd = c.layout1 ? 1 : 0, bd = c.layout1 ? 0 : 1;
    int64_t S = x->dims[sd], B = x->dims[bd];
    uint32_t ss = x->syms[sd], bs = x->syms[bd];
    /* Y: [S, D, B, H] or [B, S, D, H]; Y_h, Y_c: [D, B, H] or [B, D, H] */
    out[0].rank = 4;
    int64_t y0[4] = {S, c.ndir, B, c.H}, y1[4] = {B, S, c.ndir, c.H};
    uint32_t s0[4] = {ss, 0, bs, 0}, s1[4] = {bs, ss, 0, 0};
    for (int d = 0; d < 4; d++) {
        out[0].dims[d] = c.layout1 ? y1[d] : y0[d];
        out[0].syms[d] = c.layout1 ? s1[d] : s0[d];
    }
    for (int j = 1; j < nout; j++) {
        out[j].rank = 3;
        int64_t h0[3] = {c.ndir, B, c.H}, h1[3] = {B, c.ndir, c.H};
        for (int d = 0; d < 3; d++) {
            out[j].dims[d] = c.layout1 ? h1[d] : h0[d];
            out[j].syms[d] = (c.layout1 ? d == 0 : d == 1) ? bs : 0;
        }
    }
    return KF_OK;
}

static kf_status check_shape(const kf_node *n, const kf_tensor *t, const char *what, int rank,
                             const int64_t *dims) {
    if (!t) return KF_OK;
    bool ok = t->rank == rank;
    for (int d = 0; ok && d < rank; d++) ok = t->dims[d] == dims[d];
    if (!ok) return kf_nn_fail(n, KF_ERR_SHAPE, "input '%s' has the wrong shape", what);
    return KF_OK;
}

/* Gate pre-activations: g[k] = x W_k^T + h R_k^T + biases, for G gates. */
static void gates_in(int64_t G, int64_t H, int64_t I, const double *x, const double *h,
                     const double *W, const double *R, const double *Wb, const double *Rb,
                     double *g) {
    for (int64_t k = 0; k < G * H; k++) {
        double s = Wb ? Wb[k] + Rb[k] : 0;
        for (int64_t i = 0; i < I; i++) s += x[i] * W[k * I + i];
        if (R)
            for (int64_t j = 0; j < H; j++) s += h[j] * R[k * H + j];
        g[k] = s;
    }
}

static double clipped(const rnn_cfg *c, double v) {
    if (c->clip > 0) return v < -c->clip ? -c->clip : v > c->clip ? c->clip : v;
    return v;
}

kf_status kf_nn_rnn_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                         kf_tensor *out) {
    const kf_tensor *X = in[0], *W = in[1], *R = in[2];
    const kf_tensor *Bt = nin > 3 ? in[3] : NULL, *SL = nin > 4 ? in[4] : NULL;
    const kf_tensor *H0 = nin > 5 ? in[5] : NULL, *C0 = nin > 6 ? in[6] : NULL,
                    *P = nin > 7 ? in[7] : NULL;
    KF_TRY(kf_nn_check_dtype(n, X->dtype, "X", kf_nn_float_types));
    for (int i = 1; i < nin && i < 8; i++)
        if (in[i] && i != 4 && in[i]->dtype != X->dtype)
            return kf_nn_fail(n, KF_ERR_SHAPE, "input %d has dtype %s, X has %s", i,
                              kf_dtype_name(in[i]->dtype), kf_dtype_name(X->dtype));
    if (SL && SL->dtype != KF_DT_INT32)
        return kf_nn_fail(n, KF_ERR_SHAPE, "sequence_lens must be int32");
    kf_type tx, tr, to[3];
    const kf_type *tp[3] = {&tx, NULL, &tr};
    kf_type_of_tensor(&tx, X);
    kf_type_of_tensor(&tr, R);
    for (int j = 0; j < 3; j++) kf_type_unknown(&to[j]);
    KF_TRY(kf_nn_rnn_shape(n, 3, tp, NULL, nout < 3 ? nout : 3, to));
    rnn_cfg c;
    KF_TRY(rnn_config(n, &tr, &c));
    int64_t S = X->dims[c.layout1 ? 1 : 0], Bn = X->dims[c.layout1 ? 0 : 1], I = X->dims[2];
    int64_t H = c.H, D = c.ndir, G = c.gates, GH;
    if (!kf_mul_ok(G, H, &GH)) return kf_nn_fail(n, KF_ERR_SHAPE, "hidden_size too large");
    KF_TRY(check_shape(n, W, "W", 3, (int64_t[]){D, GH, I}));
    KF_TRY(check_shape(n, R, "R", 3, (int64_t[]){D, GH, H}));
    if (Bt) KF_TRY(check_shape(n, Bt, "B", 2, (int64_t[]){D, 2 * GH}));
    if (SL) KF_TRY(check_shape(n, SL, "sequence_lens", 1, (int64_t[]){Bn}));
    int64_t hdims[3] = {c.layout1 ? Bn : D, c.layout1 ? D : Bn, H};
    KF_TRY(check_shape(n, H0, "initial_h", 3, hdims));
    if (c.kind == K_LSTM) {
        KF_TRY(check_shape(n, C0, "initial_c", 3, hdims));
        if (P) KF_TRY(check_shape(n, P, "P", 2, (int64_t[]){D, 3 * H}));
    }
    for (int j = 0; j < nout && j < 3; j++)
        if (!out[j].data) KF_TRY(kf_tensor_alloc(&out[j], to[j].dtype, to[j].rank, to[j].dims));
    for (int64_t b = 0; SL && b < Bn; b++) {
        int64_t l = kf_get_i64(SL, b);
        if (l < 0 || l > S)
            return kf_nn_fail(n, KF_ERR_RUNTIME, "sequence_lens[%lld] = %lld is outside [0, %lld]",
                              (long long)b, (long long)l, (long long)S);
    }
    kf_status st = KF_OK;
    double *x = kf_nn_to_f64(X), *w = kf_nn_to_f64(W), *r = kf_nn_to_f64(R);
    double *bias = Bt ? kf_nn_to_f64(Bt) : NULL,
           *p = P && c.kind == K_LSTM ? kf_nn_to_f64(P) : NULL;
    double *h = kf_calloc((size_t)(H + 1), sizeof(double)),
           *cs = kf_calloc((size_t)(H + 1), sizeof(double));
    double *g = kf_calloc((size_t)(GH + 1), sizeof(double)),
           *g2 = kf_calloc((size_t)(GH + 1), sizeof(double));
    double *xt = kf_calloc((size_t)(I + 1), sizeof(double)),
           *tmp = kf_calloc((size_t)(H + 1), sizeof(double));
    if (!x || !w || !r || (Bt && !bias) || (P && c.kind == K_LSTM && !p) || !h || !cs || !g ||
        !g2 || !xt || !tmp) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t dir = 0; dir < D; dir++) {
        bool rev = c.reverse_only || dir == 1;
        const act *f = &c.acts[dir * c.nacts], *ga = &c.acts[dir * c.nacts + (c.nacts > 1 ? 1 : 0)];
        const act *ha = &c.acts[dir * c.nacts + (c.nacts > 2 ? 2 : 0)];
        const double *Wd = w + dir * GH * I, *Rd = r + dir * GH * H;
        const double *Wb = bias ? bias + dir * 2 * GH : NULL, *Rb = bias ? Wb + GH : NULL;
        const double *pd = p ? p + dir * 3 * H : NULL;
        for (int64_t b = 0; b < Bn; b++) {
            int64_t len = SL ? kf_get_i64(SL, b) : S;
            /* state offsets: [D, B, H] or [B, D, H] */
            int64_t so = (c.layout1 ? b * D + dir : dir * Bn + b) * H;
            for (int64_t j = 0; j < H; j++) {
                h[j] = H0 ? kf_get_f64(H0, so + j) : 0;
                cs[j] = C0 && c.kind == K_LSTM ? kf_get_f64(C0, so + j) : 0;
            }
            for (int64_t s = 0; s < len; s++) {
                int64_t t = rev ? len - 1 - s : s;
                int64_t xo = (c.layout1 ? b * S + t : t * Bn + b) * I;
                memcpy(xt, x + xo, (size_t)I * sizeof(double));
                if (c.kind == K_RNN) {
                    gates_in(1, H, I, xt, h, Wd, Rd, Wb, Rb, g);
                    for (int64_t j = 0; j < H; j++) h[j] = act_apply(f, clipped(&c, g[j]));
                } else if (c.kind == K_GRU) {
                    /* z and r from x and h; the candidate h~ separately */
                    gates_in(3, H, I, xt, NULL, Wd, NULL, NULL, NULL, g); /* x W^T */
                    for (int64_t k = 0; k < 3 * H; k++) {
                        double s2 = Wb ? Wb[k] : 0;
                        if (k < 2 * H || c.linear_before_reset) {
                            double hr = Rb ? Rb[k] : 0;
                            for (int64_t j = 0; j < H; j++) hr += h[j] * Rd[k * H + j];
                            g2[k] = hr; /* h R^T + Rb */
                        }
                        g[k] += s2;
                    }
                    double *z = tmp;
                    for (int64_t j = 0; j < H; j++) {
                        z[j] = act_apply(f, clipped(&c, g[j] + g2[j]));
                        g[H + j] = act_apply(f, clipped(&c, g[H + j] + g2[H + j])); /* r */
                    }
                    for (int64_t j = 0; j < H; j++) {
                        double pre;
                        if (c.linear_before_reset) {
                            pre = g[2 * H + j] + g[H + j] * g2[2 * H + j];
                        } else {
                            double hr = Rb ? Rb[2 * H + j] : 0;
                            for (int64_t q = 0; q < H; q++)
                                hr += g[H + q] * h[q] * Rd[(2 * H + j) * H + q];
                            pre = g[2 * H + j] + hr;
                        }
                        g2[j] = act_apply(ga, clipped(&c, pre)); /* h~ */
                    }
                    for (int64_t j = 0; j < H; j++) h[j] = (1 - z[j]) * g2[j] + z[j] * h[j];
                } else {
                    gates_in(4, H, I, xt, h, Wd, Rd, Wb, Rb, g); /* i, o, f, c */
                    for (int64_t j = 0; j < H; j++) {
                        double it = g[j] + (pd ? pd[j] * cs[j] : 0);
                        double ft = g[2 * H + j] + (pd ? pd[2 * H + j] * cs[j] : 0);
                        it = act_apply(f, clipped(&c, it));
                        ft = c.input_forget ? 1 - it : act_apply(f, clipped(&c, ft));
                        double ct = act_apply(ga, clipped(&c, g[3 * H + j]));
                        cs[j] = ft * cs[j] + it * ct;
                        double ot = g[H + j] + (pd ? pd[H + j] * cs[j] : 0);
                        ot = act_apply(f, clipped(&c, ot));
                        h[j] = ot * act_apply(ha, cs[j]);
                    }
                }
                if (nout > 0 && n->out[0]) {
                    int64_t yo =
                        (c.layout1 ? ((b * S + t) * D + dir) : ((t * D + dir) * Bn + b)) * H;
                    for (int64_t j = 0; j < H; j++) kf_set_f64(&out[0], yo + j, h[j]);
                }
            }
            for (int64_t j = 0; j < H; j++) {
                if (nout > 1 && n->out[1]) kf_set_f64(&out[1], so + j, h[j]);
                if (nout > 2 && n->out[2]) kf_set_f64(&out[2], so + j, cs[j]);
            }
        }
    }
done:
    kf_free(x);
    kf_free(w);
    kf_free(r);
    kf_free(bias);
    kf_free(p);
    kf_free(h);
    kf_free(cs);
    kf_free(g);
    kf_free(g2);
    kf_free(xt);
    kf_free(tmp);
    return st;
}
