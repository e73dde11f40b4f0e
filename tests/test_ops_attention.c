/* test_ops_attention.c: Attention and RotaryEmbedding against direct
 * implementations written here (4-D arrays indexed by hand, softmax in
 * double, rotations as complex products) on random data, their shape
 * inference with symbolic dims, and rejection of bad inputs. */
#include <complex.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* A node named "att_<op>" so messages can be checked for the name. */
static kf_node *mk(const char *op, int nin, int nout, int64_t opset) {
    kf_node *n = tu_node(op, nin, nout, opset);
    cr_assert_neq(n->op, KF_OP_UNKNOWN, "op %s is not in the table", op);
    free(n->name);
    n->name = malloc(strlen(op) + 5);
    strcpy(n->name, "att_");
    strcat(n->name, op);
    return n;
}

static void check_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, const char *what) {
    char why[256];
    cr_assert(tu_close(got, want, atol, rtol, why, sizeof why), "%s: %s", what, why);
}

/* Runs n and expects failure with code and a message naming the node and
 * holding `words`. */
static void expect_fail(const kf_node *n, int nin, const kf_tensor *const *in, kf_status code, const char *words) {
    kf_tensor out[4] = {{0}};
    kf_status st = kf_eval_node(n, nin, in, out);
    cr_assert_eq(st, code, "expected status %d, got %d (%s)", code, st, kf_last_error());
    cr_assert(strstr(kf_last_error(), n->name) != NULL, "message names the node: %s", kf_last_error());
    cr_assert(strstr(kf_last_error(), words) != NULL, "message says '%s': %s", words, kf_last_error());
    for (int j = 0; j < 4; j++) kf_tensor_release(&out[j]);
}

/* ---- Attention ------------------------------------------------------------- */

enum { MASK_NONE, MASK_BOOL, MASK_FLOAT };

typedef struct att_case {
    int rank; /* of Q, K, V */
    int64_t B, Hq, Hkv, Sq, Skv, P, D, Dv; /* P > 0: past_key/past_value given */
    bool causal;
    double scale, softcap; /* 0: attribute absent */
    int mask;
    int mask_rank;
    int64_t mask_dims[4];
    int mode;      /* qk_matmul_output_mode */
    bool nonpad;   /* nonpad_kv_seqlen given (opset 24 and later) */
    int64_t left, right; /* window attributes (opset 25); -1 absent */
    kf_dtype dt;
    kf_dtype softmax; /* softmax_precision; 0 absent */
    int64_t opset;
} att_case;

static att_case base_case(void) {
    att_case c = {.rank = 4, .B = 2, .Hq = 2, .Hkv = 2, .Sq = 3, .Skv = 5, .D = 4, .Dv = 4,
                  .left = -1, .right = -1, .dt = KF_DT_FLOAT, .opset = 23};
    return c;
}

/* Inputs of one case: Q, K, V, mask, past_key, past_value, nonpad. */
typedef struct att_inputs {
    kf_tensor t[7];
    bool have[7];
} att_inputs;

static void make_inputs(const att_case *c, att_inputs *x) {
    memset(x, 0, sizeof *x);
    int64_t qd[4], kd[4], vd[4];
    if (c->rank == 4) {
        int64_t q4[4] = {c->B, c->Hq, c->Sq, c->D}, k4[4] = {c->B, c->Hkv, c->Skv, c->D},
                v4[4] = {c->B, c->Hkv, c->Skv, c->Dv};
        memcpy(qd, q4, sizeof qd);
        memcpy(kd, k4, sizeof kd);
        memcpy(vd, v4, sizeof vd);
    } else {
        int64_t q3[3] = {c->B, c->Sq, c->Hq * c->D}, k3[3] = {c->B, c->Skv, c->Hkv * c->D},
                v3[3] = {c->B, c->Skv, c->Hkv * c->Dv};
        memcpy(qd, q3, sizeof q3);
        memcpy(kd, k3, sizeof k3);
        memcpy(vd, v3, sizeof v3);
    }
    x->t[0] = tu_rand(c->dt, c->rank, qd, -1.5, 1.5);
    x->t[1] = tu_rand(c->dt, c->rank, kd, -1.5, 1.5);
    x->t[2] = tu_rand(c->dt, c->rank, vd, -1, 1);
    x->have[0] = x->have[1] = x->have[2] = true;
    if (c->mask == MASK_FLOAT) {
        x->t[3] = tu_rand(c->dt, c->mask_rank, c->mask_dims, -2, 1);
        x->have[3] = true;
    } else if (c->mask == MASK_BOOL) {
        x->t[3] = tu_rand(KF_DT_BOOL, c->mask_rank, c->mask_dims, 0, 1);
        for (int64_t i = 0; i < x->t[3].numel; i++) kf_set_i64(&x->t[3], i, tu_uniform(0, 1) < 0.7);
        x->have[3] = true;
    }
    if (c->P) {
        int64_t pk[4] = {c->B, c->Hkv, c->P, c->D}, pv[4] = {c->B, c->Hkv, c->P, c->Dv};
        x->t[4] = tu_rand(c->dt, 4, pk, -1.5, 1.5);
        x->t[5] = tu_rand(c->dt, 4, pv, -1, 1);
        x->have[4] = x->have[5] = true;
    }
    if (c->nonpad) {
        x->t[6] = tu_rand(KF_DT_INT64, 1, &c->B, 0, 1);
        for (int64_t b = 0; b < c->B; b++) kf_set_i64(&x->t[6], b, c->Skv - (b % 3)); /* 1-2 padded keys too */
        x->have[6] = true;
    }
}

static void free_inputs(att_inputs *x) {
    for (int i = 0; i < 7; i++) kf_tensor_release(&x->t[i]);
}

static kf_node *make_node(const att_case *c) {
    kf_node *n = mk("Attention", c->nonpad ? 7 : 6, 4, c->opset);
    if (c->causal) tu_attr_i(n, "is_causal", 1);
    if (c->scale) tu_attr_f(n, "scale", (float)c->scale);
    if (c->softcap) tu_attr_f(n, "softcap", (float)c->softcap);
    if (c->mode) tu_attr_i(n, "qk_matmul_output_mode", c->mode);
    if (c->rank == 3) {
        tu_attr_i(n, "q_num_heads", c->Hq);
        tu_attr_i(n, "kv_num_heads", c->Hkv);
    }
    if (c->left >= 0) tu_attr_i(n, "left_window_size", c->left);
    if (c->right >= 0) tu_attr_i(n, "right_window_size", c->right);
    if (c->softmax) tu_attr_i(n, "softmax_precision", c->softmax);
    return n;
}

static double get(const kf_tensor *t, int64_t i) { return kf_get_f64(t, i); }

/* Q, K or V element (b, head, pos, d) read straight from the input's layout. */
static double elem(const att_case *c, const kf_tensor *t, int64_t heads, int64_t len, int64_t size, int64_t b,
                   int64_t head, int64_t pos, int64_t d) {
    if (c->rank == 3) return get(t, b * len * heads * size + pos * heads * size + head * size + d);
    return get(t, b * heads * len * size + head * len * size + pos * size + d);
}

/* The key or value row of absolute position j (past first, then K/V). */
static double kv_elem(const att_case *c, const att_inputs *x, bool value, int64_t b, int64_t hk, int64_t j, int64_t d) {
    int64_t size = value ? c->Dv : c->D;
    if (j < c->P) return get(&x->t[value ? 5 : 4], ((b * c->Hkv + hk) * c->P + j) * size + d);
    return elem(c, &x->t[value ? 2 : 1], c->Hkv, c->Skv, size, b, hk, j - c->P, d);
}

/* The mask entry for (b, h, i, j) by numpy broadcasting, right-aligned; keys
 * past the mask's last dim are masked. Returns the additive bias. */
static double mask_bias(const att_case *c, const att_inputs *x, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (c->mask == MASK_NONE) return 0;
    int r = c->mask_rank;
    if (j >= c->mask_dims[r - 1]) return -INFINITY;
    int64_t coord[4] = {b, h, i, j}, idx = 0;
    for (int d = 0; d < r; d++) {
        int64_t k = coord[4 - r + d];
        idx = idx * c->mask_dims[d] + (c->mask_dims[d] == 1 ? 0 : k);
    }
    if (c->mask == MASK_BOOL) return kf_get_i64(&x->t[3], idx) ? 0 : -INFINITY;
    return get(&x->t[3], idx);
}

/* Expected outputs (Y, present_key, present_value, qk_matmul_output) in
 * double, allocated as the case's dtype. */
static void expected(const att_case *c, const att_inputs *x, kf_tensor *want) {
    int64_t T = c->P + c->Skv;
    int64_t yd3[3] = {c->B, c->Sq, c->Hq * c->Dv}, yd4[4] = {c->B, c->Hq, c->Sq, c->Dv};
    int64_t pkd[4] = {c->B, c->Hkv, T, c->D}, pvd[4] = {c->B, c->Hkv, T, c->Dv}, qkd[4] = {c->B, c->Hq, c->Sq, T};
    want[0] = c->rank == 3 ? tu_rand(c->dt, 3, yd3, 0, 1) : tu_rand(c->dt, 4, yd4, 0, 1);
    want[1] = tu_rand(c->dt, 4, pkd, 0, 1);
    want[2] = tu_rand(c->dt, 4, pvd, 0, 1);
    want[3] = tu_rand(c->dt, 4, qkd, 0, 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t hk = 0; hk < c->Hkv; hk++)
            for (int64_t j = 0; j < T; j++) {
                for (int64_t d = 0; d < c->D; d++)
                    kf_set_f64(&want[1], ((b * c->Hkv + hk) * T + j) * c->D + d, kv_elem(c, x, false, b, hk, j, d));
                for (int64_t d = 0; d < c->Dv; d++)
                    kf_set_f64(&want[2], ((b * c->Hkv + hk) * T + j) * c->Dv + d, kv_elem(c, x, true, b, hk, j, d));
            }
    double scale = c->scale ? c->scale : 1 / sqrt((double)c->D);
    double *raw = calloc((size_t)T + 1, sizeof(double)), *cap = calloc((size_t)T + 1, sizeof(double));
    double *biased = calloc((size_t)T + 1, sizeof(double)), *p = calloc((size_t)T + 1, sizeof(double));
    for (int64_t b = 0; b < c->B; b++) {
        int64_t valid = c->nonpad ? kf_get_i64(&x->t[6], b) : T;
        int64_t shift = c->nonpad ? valid - c->Sq : c->P; /* the query block's first position */
        for (int64_t h = 0; h < c->Hq; h++) {
            int64_t hk = h * c->Hkv / c->Hq;
            for (int64_t i = 0; i < c->Sq; i++) {
                bool any = false;
                for (int64_t j = 0; j < T; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < c->D; d++)
                        s += elem(c, &x->t[0], c->Hq, c->Sq, c->D, b, h, i, d) * kv_elem(c, x, false, b, hk, j, d);
                    raw[j] = s * scale;
                    cap[j] = c->softcap ? c->softcap * tanh(raw[j] / c->softcap) : raw[j];
                    double bias = mask_bias(c, x, b, h, i, j);
                    int64_t pos = shift + i; /* absolute position of the query */
                    if (c->causal && j > pos) bias = -INFINITY;
                    if (c->left >= 0 && j < pos - c->left) bias = -INFINITY;
                    if (c->right >= 0 && j > pos + c->right) bias = -INFINITY;
                    if (j >= valid) bias = -INFINITY;
                    any = any || bias != -INFINITY;
                    biased[j] = cap[j] + bias;
                }
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < T; j++) mx = fmax(mx, biased[j]);
                for (int64_t j = 0; j < T; j++) sum += (p[j] = any ? exp(biased[j] - mx) : 0);
                for (int64_t j = 0; j < T; j++) p[j] = any ? p[j] / sum : 0;
                const double *qk = c->mode == 0 ? raw : c->mode == 1 ? cap : c->mode == 2 ? biased : p;
                for (int64_t j = 0; j < T; j++) kf_set_f64(&want[3], ((b * c->Hq + h) * c->Sq + i) * T + j, qk[j]);
                for (int64_t d = 0; d < c->Dv; d++) {
                    double y = 0;
                    for (int64_t j = 0; j < T; j++) y += p[j] * kv_elem(c, x, true, b, hk, j, d);
                    int64_t at = c->rank == 3 ? (b * c->Sq + i) * c->Hq * c->Dv + h * c->Dv + d
                                              : ((b * c->Hq + h) * c->Sq + i) * c->Dv + d;
                    kf_set_f64(&want[0], at, y);
                }
            }
        }
    }
    free(raw);
    free(cap);
    free(biased);
    free(p);
}

/* Tolerances: float32 against the double loops; 16-bit types round every
 * step of a short chain, a few units in their last place. */
static void tolerance(kf_dtype dt, double *atol, double *rtol) {
    *atol = dt == KF_DT_BFLOAT16 ? 6e-2 : dt == KF_DT_FLOAT16 ? 8e-3 : 2e-5;
    *rtol = dt == KF_DT_BFLOAT16 ? 3e-2 : dt == KF_DT_FLOAT16 ? 4e-3 : 1e-4;
}

/* Runs a case and compares all four outputs; returns Y in *y_out when
 * asked (caller releases). */
static void run_case(const att_case *c, kf_tensor *y_out) {
    att_inputs x;
    make_inputs(c, &x);
    kf_node *n = make_node(c);
    const kf_tensor *in[7];
    for (int i = 0; i < 7; i++) in[i] = x.have[i] ? &x.t[i] : NULL;
    kf_tensor got[4] = {{0}}, want[4] = {{0}};
    kf_status st = kf_eval_node(n, n->nin, in, got);
    cr_assert_eq(st, KF_OK, "%s", kf_last_error());
    expected(c, &x, want);
    double atol, rtol;
    tolerance(c->dt, &atol, &rtol);
    static const char *const names[4] = {"Y", "present_key", "present_value", "qk_matmul_output"};
    for (int j = 0; j < 4; j++) {
        /* present key/value are copies: exact */
        check_close(&got[j], &want[j], j == 1 || j == 2 ? 0 : atol, j == 1 || j == 2 ? 0 : rtol, names[j]);
    }
    if (y_out) {
        *y_out = got[0];
        got[0] = (kf_tensor){0};
    }
    for (int j = 0; j < 4; j++) {
        kf_tensor_release(&got[j]);
        kf_tensor_release(&want[j]);
    }
    free_inputs(&x);
    tu_node_free(n);
}

Test(attention, mha_4d_no_mask_value_head_size_differs) {
    att_case c = base_case();
    c.Dv = 3;
    run_case(&c, NULL);
}

Test(attention, gqa_3d_causal) {
    att_case c = base_case();
    c.rank = 3;
    c.Hq = 6;
    c.Hkv = 2;
    c.Sq = c.Skv = 4;
    c.D = 3;
    c.Dv = 5;
    c.causal = true;
    run_case(&c, NULL);
}

Test(attention, mqa_4d_with_scale) {
    att_case c = base_case();
    c.Hq = 4;
    c.Hkv = 1;
    c.scale = 0.3;
    run_case(&c, NULL);
}

Test(attention, bool_mask_broadcast_over_batch_and_heads) {
    att_case c = base_case();
    c.mask = MASK_BOOL;
    c.mask_rank = 2;
    c.mask_dims[0] = c.Sq;
    c.mask_dims[1] = c.Skv;
    run_case(&c, NULL);
}

Test(attention, additive_mask_4d_per_batch_and_rank3_per_head) {
    att_case c = base_case();
    c.mask = MASK_FLOAT;
    c.mask_rank = 4;
    int64_t d4[4] = {c.B, 1, c.Sq, c.Skv};
    memcpy(c.mask_dims, d4, sizeof d4);
    run_case(&c, NULL);
    c.mask_rank = 3;
    int64_t d3[3] = {c.Hq, 1, c.Skv};
    memcpy(c.mask_dims, d3, sizeof d3);
    c.causal = true;
    run_case(&c, NULL);
}

/* A row whose keys are all masked is a zero row of Y and of the softmax
 * output (mode 3), not NaN. */
Test(attention, fully_masked_row_is_zero) {
    att_case c = base_case();
    c.B = 1;
    c.Hq = c.Hkv = 1;
    c.Sq = 2;
    c.Skv = 3;
    c.mode = 3;
    att_inputs x;
    make_inputs(&c, &x);
    int64_t md[2] = {2, 3};
    double mv[6] = {0, 0, 0, 1, 0, 1};
    x.t[3] = tu_tensor(KF_DT_BOOL, 2, md, mv);
    x.have[3] = true;
    kf_node *n = make_node(&c);
    const kf_tensor *in[6] = {&x.t[0], &x.t[1], &x.t[2], &x.t[3], NULL, NULL};
    kf_tensor got[4] = {{0}};
    cr_assert_eq(kf_eval_node(n, 6, in, got), KF_OK, "%s", kf_last_error());
    for (int64_t d = 0; d < c.Dv; d++) cr_assert_eq(get(&got[0], d), 0.0, "Y[0, 0, 0, %lld]", (long long)d);
    for (int64_t j = 0; j < 3; j++) cr_assert_eq(get(&got[3], j), 0.0, "softmax row 0 key %lld", (long long)j);
    /* row 1 attends keys 0 and 2 only */
    double p0 = get(&got[3], 3), p1 = get(&got[3], 4), p2 = get(&got[3], 5);
    cr_assert_float_eq(p0 + p2, 1.0, 1e-6);
    cr_assert_eq(p1, 0.0);
    cr_assert(p0 > 0 && p2 > 0);
    for (int j = 0; j < 4; j++) kf_tensor_release(&got[j]);
    free_inputs(&x);
    tu_node_free(n);
}

/* past_key/past_value extend the cache: present = concat(past, new) on the
 * sequence axis, and the causal diagonal moves right by the past length;
 * the mask, shorter than past + new, masks the keys it does not cover. */
Test(attention, past_cache_causal_offset_and_short_mask) {
    att_case c = base_case();
    c.P = 4;
    c.Sq = c.Skv = 2;
    c.causal = true;
    c.mask = MASK_FLOAT;
    c.mask_rank = 2;
    c.mask_dims[0] = c.Sq;
    c.mask_dims[1] = c.P + c.Skv - 1;
    run_case(&c, NULL);
    c.rank = 3;
    c.Hq = 4;
    c.mask = MASK_NONE;
    run_case(&c, NULL);
}

Test(attention, softcap_and_every_qk_output_mode) {
    for (int mode = 0; mode < 4; mode++) {
        att_case c = base_case();
        c.softcap = 1.5;
        c.scale = 0.8;
        c.mode = mode;
        c.mask = MASK_FLOAT;
        c.mask_rank = 2;
        c.mask_dims[0] = 1;
        c.mask_dims[1] = c.Skv;
        c.causal = mode == 2;
        run_case(&c, NULL);
    }
}

Test(attention, float16_and_bfloat16) {
    att_case c = base_case();
    c.dt = KF_DT_FLOAT16;
    c.causal = true;
    c.P = 2;
    run_case(&c, NULL);
    c.dt = KF_DT_BFLOAT16;
    c.mask = MASK_BOOL;
    c.mask_rank = 1;
    c.mask_dims[0] = c.P + c.Skv;
    run_case(&c, NULL);
    /* softmax in double while the inputs are float16 */
    c.dt = KF_DT_FLOAT16;
    c.softmax = KF_DT_DOUBLE;
    c.mode = 3;
    run_case(&c, NULL);
}

/* The float16 result is the double one rounded a few times, not something
 * else: compare it with the same inputs run in float32. */
Test(attention, float16_stays_near_float32) {
    att_case c = base_case();
    c.dt = KF_DT_FLOAT16;
    c.Hq = 4;
    c.Hkv = 2;
    c.causal = true;
    att_inputs x;
    make_inputs(&c, &x);
    kf_node *n = make_node(&c);
    const kf_tensor *in[6] = {&x.t[0], &x.t[1], &x.t[2], NULL, NULL, NULL};
    kf_tensor h[4] = {{0}}, f[4] = {{0}}, x32[3] = {{0}};
    cr_assert_eq(kf_eval_node(n, 6, in, h), KF_OK, "%s", kf_last_error());
    for (int i = 0; i < 3; i++) {
        x32[i] = tu_rand(KF_DT_FLOAT, x.t[i].rank, x.t[i].dims, 0, 1);
        for (int64_t k = 0; k < x.t[i].numel; k++) kf_set_f64(&x32[i], k, get(&x.t[i], k));
    }
    const kf_tensor *in32[6] = {&x32[0], &x32[1], &x32[2], NULL, NULL, NULL};
    cr_assert_eq(kf_eval_node(n, 6, in32, f), KF_OK, "%s", kf_last_error());
    cr_assert_eq(h[0].dtype, KF_DT_FLOAT16);
    for (int64_t k = 0; k < f[0].numel; k++)
        cr_assert(fabs(get(&h[0], k) - get(&f[0], k)) <= 4e-3 + 4e-3 * fabs(get(&f[0], k)), "Y[%lld]: %g vs %g",
                  (long long)k, get(&h[0], k), get(&f[0], k));
    for (int j = 0; j < 4; j++) {
        kf_tensor_release(&h[j]);
        kf_tensor_release(&f[j]);
    }
    for (int i = 0; i < 3; i++) kf_tensor_release(&x32[i]);
    free_inputs(&x);
    tu_node_free(n);
}

/* Opset 24's external cache: nonpad_kv_seqlen masks each batch's padding
 * and places its causal diagonal at nonpad - Sq; opset 25's windows. */
Test(attention, nonpad_kv_seqlen_and_sliding_window) {
    att_case c = base_case();
    c.opset = 24;
    c.B = 3;
    c.Skv = 6;
    c.nonpad = true;
    c.causal = true;
    run_case(&c, NULL);
    c.opset = 25;
    c.left = 1;
    run_case(&c, NULL);
    c.nonpad = false;
    c.causal = false;
    c.left = 2;
    c.right = 1;
    c.mask = MASK_BOOL;
    c.mask_rank = 4;
    int64_t md[4] = {c.B, c.Hq, c.Sq, c.Skv};
    memcpy(c.mask_dims, md, sizeof md);
    run_case(&c, NULL);
}

/* Outputs the node does not have are neither computed nor allocated. */
Test(attention, absent_outputs_stay_empty) {
    att_case c = base_case();
    att_inputs x;
    make_inputs(&c, &x);
    kf_node *n = make_node(&c);
    n->out[1] = n->out[2] = n->out[3] = 0;
    const kf_tensor *in[6] = {&x.t[0], &x.t[1], &x.t[2], NULL, NULL, NULL};
    kf_tensor got[4] = {{0}};
    cr_assert_eq(kf_eval_node(n, 6, in, got), KF_OK, "%s", kf_last_error());
    cr_assert_eq(got[0].rank, 4);
    for (int j = 1; j < 4; j++) cr_assert_null(got[j].data, "output %d", j);
    for (int j = 0; j < 4; j++) kf_tensor_release(&got[j]);
    free_inputs(&x);
    tu_node_free(n);
}

/* A float type with the given dims; -1 dims take symbol `sym`. */
static kf_type ty(kf_dtype dt, int rank, const int64_t *dims, uint32_t sym) {
    kf_type t;
    kf_type_unknown(&t);
    t.dtype = dt;
    t.rank = rank;
    for (int d = 0; d < rank; d++) {
        t.dims[d] = dims[d];
        t.syms[d] = dims[d] < 0 ? sym + (uint32_t)d : 0;
    }
    return t;
}

Test(attention, shape_keeps_symbols_3d_with_past) {
    kf_node *n = mk("Attention", 6, 4, 23);
    tu_attr_i(n, "q_num_heads", 4);
    tu_attr_i(n, "kv_num_heads", 2);
    int64_t qd[3] = {-1, -1, 32}, kd[3] = {-1, 5, 16}, vd[3] = {-1, 5, 12}, pkd[4] = {-1, 2, 3, 8},
            pvd[4] = {-1, 2, 3, 6};
    /* batch is symbol 10 everywhere; Q's sequence length symbol 11 */
    kf_type q = ty(KF_DT_FLOAT16, 3, qd, 10), k = ty(KF_DT_FLOAT16, 3, kd, 10), v = ty(KF_DT_FLOAT16, 3, vd, 10);
    kf_type pk = ty(KF_DT_FLOAT16, 4, pkd, 10), pv = ty(KF_DT_FLOAT16, 4, pvd, 10);
    const kf_type *in[6] = {&q, &k, &v, NULL, &pk, &pv};
    kf_type out[4];
    for (int j = 0; j < 4; j++) kf_type_unknown(&out[j]);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 6, in, NULL, 4, out), KF_OK, "%s", kf_last_error());
    /* Y (B, Sq, Hq * Dv) = (b, s, 4 * 6) */
    cr_assert_eq(out[0].dtype, KF_DT_FLOAT16);
    cr_assert_eq(out[0].rank, 3);
    cr_assert_eq(out[0].syms[0], 10);
    cr_assert_eq(out[0].syms[1], 11);
    cr_assert_eq(out[0].dims[2], 24);
    /* present (B, Hkv, 3 + 5, D | Dv) */
    int64_t want_pk[4] = {-1, 2, 8, 8}, want_pv[4] = {-1, 2, 8, 6}, want_qk[4] = {-1, 4, -1, 8};
    for (int d = 0; d < 4; d++) {
        cr_assert_eq(out[1].dims[d], want_pk[d], "present_key dim %d", d);
        cr_assert_eq(out[2].dims[d], want_pv[d], "present_value dim %d", d);
        cr_assert_eq(out[3].dims[d], want_qk[d], "qk_matmul_output dim %d", d);
    }
    cr_assert_eq(out[1].syms[0], 10);
    cr_assert_eq(out[3].syms[2], 11);
    tu_node_free(n);
}

Test(attention, shape_4d_symbolic_kv_length_without_past) {
    kf_node *n = mk("Attention", 3, 4, 23);
    int64_t qd[4] = {2, 8, 1, 16}, kd[4] = {2, 2, -1, 16}, vd[4] = {2, 2, -1, 16};
    kf_type q = ty(KF_DT_FLOAT, 4, qd, 0), k = ty(KF_DT_FLOAT, 4, kd, 20), v = ty(KF_DT_FLOAT, 4, vd, 20);
    const kf_type *in[3] = {&q, &k, &v};
    kf_type out[4];
    for (int j = 0; j < 4; j++) kf_type_unknown(&out[j]);
    cr_assert_eq(kf_op_get(n->op)->shape(n, 3, in, NULL, 4, out), KF_OK, "%s", kf_last_error());
    cr_assert_eq(out[0].rank, 4);
    cr_assert_eq(out[0].dims[1], 8);
    cr_assert_eq(out[0].dims[3], 16);
    /* the total key count is K's symbolic length (symbol 20 + dim 2) */
    cr_assert_eq(out[1].dims[2], -1);
    cr_assert_eq(out[1].syms[2], 22);
    cr_assert_eq(out[3].syms[3], 22);
    /* a rank the op does not take is an error even when dims are unknown */
    kf_type bad;
    kf_type_unknown(&bad);
    bad.dtype = KF_DT_FLOAT;
    bad.rank = 5;
    const kf_type *in2[3] = {&q, &bad, &v};
    cr_assert_eq(kf_op_get(n->op)->shape(n, 3, in2, NULL, 4, out), KF_ERR_SHAPE);
    tu_node_free(n);
}

/* Bad shapes and attributes: typed errors naming the node. */
Test(attention, rejects_bad_inputs) {
    att_case c = base_case();
    att_inputs x;
    make_inputs(&c, &x);
    kf_node *n = make_node(&c);
    int64_t d2[2] = {3, 4}, d4[4] = {2, 2, 5, 3}, d3h[4] = {2, 3, 5, 4}, m[2] = {2, 5}, mlong[2] = {3, 9};
    kf_tensor r2 = tu_rand(KF_DT_FLOAT, 2, d2, -1, 1), ksmall = tu_rand(KF_DT_FLOAT, 4, d4, -1, 1),
              k3 = tu_rand(KF_DT_FLOAT, 4, d3h, -1, 1), badmask = tu_rand(KF_DT_FLOAT, 2, m, -1, 1),
              longmask = tu_rand(KF_DT_FLOAT, 2, mlong, -1, 1);
    const kf_tensor *in[7] = {&r2, &x.t[1], &x.t[2], NULL, NULL, NULL, NULL};
    expect_fail(n, 6, in, KF_ERR_SHAPE, "rank 3 or 4");
    in[0] = &x.t[0];
    in[1] = &ksmall; /* head size 3 against Q's 4 */
    expect_fail(n, 6, in, KF_ERR_SHAPE, "head sizes of Q and K");
    in[1] = &k3; /* 3 kv heads for 2 query heads */
    in[2] = &k3;
    expect_fail(n, 6, in, KF_ERR_SHAPE, "not a multiple");
    in[1] = &x.t[1];
    in[2] = &x.t[2];
    in[3] = &badmask; /* (2, 5) against (Sq = 3, keys 5) */
    expect_fail(n, 6, in, KF_ERR_SHAPE, "does not broadcast");
    in[3] = &longmask;
    expect_fail(n, 6, in, KF_ERR_SHAPE, "more than");
    in[3] = NULL;
    in[4] = &x.t[1]; /* past_key alone */
    expect_fail(n, 6, in, KF_ERR_BAD_MODEL, "together");
    in[4] = NULL;
    tu_node_free(n);

    /* 3-D inputs without head counts; an invalid softmax_precision */
    n = mk("Attention", 3, 1, 23);
    int64_t d3[3] = {1, 3, 4};
    kf_tensor q3 = tu_rand(KF_DT_FLOAT, 3, d3, -1, 1);
    const kf_tensor *in3[3] = {&q3, &q3, &q3};
    expect_fail(n, 3, in3, KF_ERR_BAD_MODEL, "q_num_heads");
    tu_attr_i(n, "q_num_heads", 3);
    tu_attr_i(n, "kv_num_heads", 3);
    expect_fail(n, 3, in3, KF_ERR_SHAPE, "not a multiple of its 3 heads");
    tu_attr_i(n, "softmax_precision", KF_DT_INT32);
    expect_fail(n, 3, in3, KF_ERR_BAD_MODEL, "softmax_precision");
    tu_node_free(n);

    /* nonpad_kv_seqlen: not at opset 23; values outside 0..keys */
    c.nonpad = true;
    att_inputs y;
    make_inputs(&c, &y);
    n = mk("Attention", 7, 1, 23);
    const kf_tensor *in7[7] = {&y.t[0], &y.t[1], &y.t[2], NULL, NULL, NULL, &y.t[6]};
    expect_fail(n, 7, in7, KF_ERR_BAD_MODEL, "opset 24");
    n->opset = 24;
    kf_set_i64(&y.t[6], 0, c.Skv + 1);
    expect_fail(n, 7, in7, KF_ERR_RUNTIME, "nonpad_kv_seqlen[0]");
    /* 4-D inputs with head counts are an error from opset 25 */
    n->opset = 25;
    kf_set_i64(&y.t[6], 0, 1);
    tu_attr_i(n, "q_num_heads", c.Hq);
    expect_fail(n, 7, in7, KF_ERR_BAD_MODEL, "must not be given");
    tu_node_free(n);

    kf_tensor_release(&q3);
    kf_tensor_release(&r2);
    kf_tensor_release(&ksmall);
    kf_tensor_release(&k3);
    kf_tensor_release(&badmask);
    kf_tensor_release(&longmask);
    free_inputs(&x);
    free_inputs(&y);
}

/* An empty K may declare any sequence length (its element count is 0):
 * the kernel refuses to hold such a row of scores instead of trying. */
Test(attention, empty_cache_of_huge_length_is_refused) {
    int64_t qd[4] = {1, 1, 1, 0}, kd[4] = {1, 1, (int64_t)1 << 40, 0};
    kf_tensor q = tu_rand(KF_DT_FLOAT, 4, qd, -1, 1), k = tu_rand(KF_DT_FLOAT, 4, kd, -1, 1);
    kf_node *n = mk("Attention", 3, 4, 23);
    n->out[3] = 0; /* qk_matmul_output would be refused as too large before the kernel runs */
    const kf_tensor *in[3] = {&q, &k, &k};
    expect_fail(n, 3, in, KF_ERR_SHAPE, "do not fit");
    tu_node_free(n);
    kf_tensor_release(&q);
    kf_tensor_release(&k);
}

/* ---- RotaryEmbedding ---------------------------------------------------------- */

typedef struct rot_case {
    int rank;
    int64_t B, H, S, D, dim; /* dim: rotary_embedding_dim, 0 absent */
    bool interleaved, positions;
    kf_dtype dt;
} rot_case;

/* Runs a case: caches hold cos/sin of random angles; the expected output
 * multiplies each pair, as a complex number, by cos + i sin. */
static void run_rotary(const rot_case *c) {
    int64_t D = c->D, rd = c->dim ? c->dim : D, half = rd / 2, npos = 7;
    int64_t xd4[4] = {c->B, c->H, c->S, D}, xd3[3] = {c->B, c->S, c->H * D};
    kf_tensor x = c->rank == 4 ? tu_rand(c->dt, 4, xd4, -2, 2) : tu_rand(c->dt, 3, xd3, -2, 2);
    int64_t cd2[2] = {npos, half}, cd3[3] = {c->B, c->S, half}, pd[2] = {c->B, c->S};
    kf_tensor cosc = c->positions ? tu_rand(c->dt, 2, cd2, 0, 1) : tu_rand(c->dt, 3, cd3, 0, 1);
    kf_tensor sinc = c->positions ? tu_rand(c->dt, 2, cd2, 0, 1) : tu_rand(c->dt, 3, cd3, 0, 1);
    for (int64_t i = 0; i < cosc.numel; i++) {
        double theta = tu_uniform(-3.1, 3.1);
        kf_set_f64(&cosc, i, cos(theta));
        kf_set_f64(&sinc, i, sin(theta));
    }
    kf_tensor pos = tu_rand(KF_DT_INT64, 2, pd, 0, 1);
    for (int64_t i = 0; i < pos.numel; i++) kf_set_i64(&pos, i, (int64_t)tu_uniform(0, (double)npos - 0.01));
    kf_node *n = mk("RotaryEmbedding", c->positions ? 4 : 3, 1, 23);
    if (c->interleaved) tu_attr_i(n, "interleaved", 1);
    if (c->dim) tu_attr_i(n, "rotary_embedding_dim", c->dim);
    if (c->rank == 3) tu_attr_i(n, "num_heads", c->H);
    const kf_tensor *in[4] = {&x, &cosc, &sinc, &pos};
    kf_tensor got = {0}, want = {0};
    tu_eval(n, c->positions ? 4 : 3, in, &got);
    cr_assert_eq(kf_tensor_copy(&want, &x), KF_OK);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S; s++) {
            int64_t row = c->positions ? kf_get_i64(&pos, b * c->S + s) : b * c->S + s;
            for (int64_t h = 0; h < c->H; h++) {
                int64_t at = c->rank == 4 ? ((b * c->H + h) * c->S + s) * D : (b * c->S + s) * c->H * D + h * D;
                for (int64_t k = 0; k < half; k++) {
                    int64_t re = at + (c->interleaved ? 2 * k : k), im = at + (c->interleaved ? 2 * k + 1 : k + half);
                    double complex z = kf_get_f64(&x, re) + kf_get_f64(&x, im) * I;
                    z *= kf_get_f64(&cosc, row * half + k) + kf_get_f64(&sinc, row * half + k) * I;
                    kf_set_f64(&want, re, creal(z));
                    kf_set_f64(&want, im, cimag(z));
                }
            }
        }
    double tol = c->dt == KF_DT_FLOAT ? 1e-6 : c->dt == KF_DT_FLOAT16 ? 4e-3 : 3e-2;
    check_close(&got, &want, tol, tol, "RotaryEmbedding");
    /* the values past the rotary dim are copies */
    for (int64_t i = 0; i < x.numel; i++)
        if (i % D >= rd) cr_assert_eq(kf_get_f64(&got, i), kf_get_f64(&x, i));
    kf_tensor_release(&got);
    kf_tensor_release(&want);
    kf_tensor_release(&x);
    kf_tensor_release(&cosc);
    kf_tensor_release(&sinc);
    kf_tensor_release(&pos);
    tu_node_free(n);
}

Test(rotary, halves_4d_with_position_ids) {
    rot_case c = {.rank = 4, .B = 2, .H = 3, .S = 4, .D = 8, .positions = true, .dt = KF_DT_FLOAT};
    run_rotary(&c);
}

Test(rotary, interleaved_3d_partial_without_position_ids) {
    rot_case c = {.rank = 3, .B = 2, .H = 2, .S = 3, .D = 8, .dim = 4, .interleaved = true, .dt = KF_DT_FLOAT};
    run_rotary(&c);
    c.interleaved = false;
    c.positions = true;
    run_rotary(&c);
}

Test(rotary, float16_and_bfloat16) {
    rot_case c = {.rank = 4, .B = 1, .H = 2, .S = 5, .D = 6, .interleaved = true, .positions = true,
                  .dt = KF_DT_FLOAT16};
    run_rotary(&c);
    c.dt = KF_DT_BFLOAT16;
    c.dim = 4;
    run_rotary(&c);
}

Test(rotary, rejects_bad_inputs) {
    int64_t xd[4] = {1, 2, 3, 8}, cd[2] = {4, 4}, cd3[2] = {4, 3}, pd[2] = {1, 3}, x3d[3] = {1, 3, 10};
    kf_tensor x = tu_rand(KF_DT_FLOAT, 4, xd, -1, 1), c4 = tu_rand(KF_DT_FLOAT, 2, cd, -1, 1),
              c3 = tu_rand(KF_DT_FLOAT, 2, cd3, -1, 1), x3 = tu_rand(KF_DT_FLOAT, 3, x3d, -1, 1);
    double pv[3] = {0, 3, 4};
    kf_tensor pos = tu_tensor(KF_DT_INT64, 2, pd, pv);
    kf_node *n = mk("RotaryEmbedding", 4, 1, 23);
    const kf_tensor *in[4] = {&x, &c4, &c4, &pos};
    expect_fail(n, 4, in, KF_ERR_RUNTIME, "position id 4");
    in[1] = in[2] = &c3;
    expect_fail(n, 4, in, KF_ERR_SHAPE, "rotary dim / 2");
    tu_attr_i(n, "rotary_embedding_dim", 5);
    expect_fail(n, 4, in, KF_ERR_SHAPE, "must be even");
    in[0] = &x3;
    expect_fail(n, 4, in, KF_ERR_BAD_MODEL, "num_heads");
    tu_attr_i(n, "num_heads", 3);
    expect_fail(n, 4, in, KF_ERR_SHAPE, "not a multiple of num_heads");
    tu_node_free(n);
    kf_tensor_release(&x);
    kf_tensor_release(&c4);
    kf_tensor_release(&c3);
    kf_tensor_release(&x3);
    kf_tensor_release(&pos);
}

/* ---- LinearAttention ---------------------------------------------------------- */

/* LinearAttention (27) against its closed form rather than its recurrence:
 * with the gated rule and a per-head decay g,
 *   out_t = scale * sum_{s<=t} exp(g_{s+1} + ... + g_t) (q_t . k_s) v_s
 *           + scale * exp(g_1 + ... + g_t) S0^T q_t
 * and the linear rule is the same with g = 0. Two query heads share each
 * kv head; present_state is the final S. The delta rules are covered by
 * ONNX's own test data (kfuse conform); a rule that needs decay refuses
 * to run without it. */
Test(linear_attention, linear_and_gated_match_the_closed_form) {
    enum { B = 2, T = 5, HQ = 4, HKV = 2, DK = 3, DV = 2, G = HQ / HKV };
    int64_t dq[3] = {B, T, HQ * DK}, dk[3] = {B, T, HKV * DK}, dv[3] = {B, T, HKV * DV};
    int64_t dg[3] = {B, T, HKV}, ds[4] = {B, HKV, DK, DV};
    kf_tensor q = tu_rand(KF_DT_FLOAT, 3, dq, -1, 1), k = tu_rand(KF_DT_FLOAT, 3, dk, -1, 1);
    kf_tensor v = tu_rand(KF_DT_FLOAT, 3, dv, -1, 1), g = tu_rand(KF_DT_FLOAT, 3, dg, -0.5, 0);
    kf_tensor s0 = tu_rand(KF_DT_FLOAT, 4, ds, -1, 1);
    for (int gated = 0; gated < 2; gated++) {
        kf_node *n = mk("LinearAttention", 5, 2, 27);
        tu_attr_s(n, "update_rule", gated ? "gated" : "linear");
        tu_attr_i(n, "q_num_heads", HQ);
        tu_attr_i(n, "kv_num_heads", HKV);
        const kf_tensor *in[5] = {&q, &k, &v, &s0, gated ? &g : NULL};
        kf_tensor out[2] = {{0}};
        cr_assert_eq(kf_eval_node(n, 5, in, out), KF_OK, "%s", kf_last_error());
        kf_tensor want = {0};
        cr_assert_eq(kf_tensor_alloc(&want, KF_DT_FLOAT, 3, (int64_t[]){B, T, HQ * DV}), KF_OK);
        double scale = 1 / sqrt((double)DK);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int hq = 0; hq < HQ; hq++) {
                    int h = hq / G;
                    for (int m = 0; m < DV; m++) {
                        double o = 0, gsum = 0; /* gsum: g_{s+1} + ... + g_t */
                        for (int s = t; s >= 0; s--) {
                            double qk = 0;
                            for (int d = 0; d < DK; d++)
                                qk += kf_get_f64(&q, (b * T + t) * HQ * DK + hq * DK + d) *
                                      kf_get_f64(&k, (b * T + s) * HKV * DK + h * DK + d);
                            double gs = gated ? kf_get_f64(&g, (b * T + s) * HKV + h) : 0;
                            o += exp(gsum) * qk * kf_get_f64(&v, (b * T + s) * HKV * DV + h * DV + m);
                            gsum += gs;
                        }
                        double init = 0;
                        for (int d = 0; d < DK; d++)
                            init += kf_get_f64(&q, (b * T + t) * HQ * DK + hq * DK + d) *
                                    kf_get_f64(&s0, ((b * HKV + h) * DK + d) * DV + m);
                        kf_set_f64(&want, (b * T + t) * HQ * DV + hq * DV + m, scale * (o + exp(gsum) * init));
                    }
                }
        check_close(&out[0], &want, 1e-5, 1e-4, gated ? "gated" : "linear");
        /* present_state: sum_s exp(g_{s+1} + ... + g_T) k_s v_s^T + decayed S0 */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HKV; h++)
                for (int d = 0; d < DK; d++)
                    for (int m = 0; m < DV; m++) {
                        double sd = 0, gsum = 0;
                        for (int s = T - 1; s >= 0; s--) {
                            sd += exp(gsum) * kf_get_f64(&k, (b * T + s) * HKV * DK + h * DK + d) *
                                  kf_get_f64(&v, (b * T + s) * HKV * DV + h * DV + m);
                            gsum += gated ? kf_get_f64(&g, (b * T + s) * HKV + h) : 0;
                        }
                        sd += exp(gsum) * kf_get_f64(&s0, ((b * HKV + h) * DK + d) * DV + m);
                        double got = kf_get_f64(&out[1], ((b * HKV + h) * DK + d) * DV + m);
                        cr_assert(fabs(got - sd) <= 1e-5 + 1e-4 * fabs(sd), "state %g, expected %g", got, sd);
                    }
        kf_tensor_release(&want);
        kf_tensor_release(&out[0]);
        kf_tensor_release(&out[1]);
        tu_node_free(n);
    }
    kf_node *n = mk("LinearAttention", 3, 2, 27);
    tu_attr_i(n, "q_num_heads", HQ);
    tu_attr_i(n, "kv_num_heads", HKV);
    const kf_tensor *in3[3] = {&q, &k, &v};
    expect_fail(n, 3, in3, KF_ERR_BAD_MODEL, "decay"); /* gated_delta by default */
    tu_node_free(n);
    kf_tensor_release(&q), kf_tensor_release(&k), kf_tensor_release(&v), kf_tensor_release(&g);
    kf_tensor_release(&s0);
}
