/*
 * pass_qint.c: int8 plans. Where a QDQ model dequantises both operands of
 * a Conv, MatMul or Gemm, the product runs on the 8-bit values: an integer
 * anchor (ConvInteger or MatMulInteger: int32 sums of (q - zero point)
 * products), then one scale per output channel back to float, then the
 * bias; the QuantizeLinear and activation that follow stay where they were
 * and the planner puts them in the anchor's epilogue.
 *
 *   xq ─► DQ(sx, zx) ─┐                       xq ──┐
 *                     Conv ─► (+b) ─► y   ==>       ConvInteger(zx, zw) ─► Cast ─► Mul(sx*sw) ─► (+b) ─► y
 *   wq ─► DQ(sw, zw) ─┘                       wq ──┘
 *
 * The float form sums products of dequantised (rounded) floats; the
 * integer form sums exactly and rounds once when scaling, so the two
 * differ by float rounding, about a unit of the output's last place: a
 * value on a rounding boundary of the next QuantizeLinear may move by one
 * step (DESIGN.md, Numerics). Only precision INT8 runs this pass.
 *
 * Two exact rewrites give the products the form tensor-core integer GEMMs
 * take (signed 8-bit operands, no zero points; kernels/libanchor.c):
 *   - uint8 activations move to int8. A QuantizeLinear to uint8 whose every
 *     reader is a DequantizeLinear of the same zero point z writes int8 with
 *     zero point z - 128 instead, and its readers read that: every value
 *     drops by 128 together with its zero point, so x - z is unchanged.
 *   - an activation zero point leaves the product. With weights W of zero
 *     point 0, sum_k (x - zx) W[k,n] = sum_k x W[k,n] - zx colsum(W)[n]: a
 *     MatMulInteger without zero points plus an int32 constant per column.
 */
#include <stdio.h>
#include <string.h>

#include "kf_cost.h"
#include "kf_ops.h"
#include "kf_precision.h"
#include "kf_ref.h"

/* Is constant t all zeros? */
static bool all_zero(const kf_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++)
        if (kf_get_f64(t, i) != 0) return false;
    return true;
}

/* A DequantizeLinear feeding operand slot of n: its node, or 0 when the
 * operand is something else or a form the integer anchor does not take
 * (8-bit values, float32 result, constant float32 scale per tensor or of
 * len elements along axis `axis` of the operand, zero point of the same
 * shape or absent, no blocks). len 0: per tensor only. */
static kf_id dq_operand(const kf_model *m, const kf_node *n, int slot, int axis, int64_t len) {
    const kf_graph *g = m->graph;
    if (slot >= n->nin || !n->in[slot]) return 0;
    kf_id d = g->values[n->in[slot]].producer;
    if (!d) return 0;
    const kf_node *dn = &g->nodes[d];
    if (dn->op != KF_OP_DEQUANTIZE_LINEAR || dn->nin < 2 || !dn->in[0] || !dn->in[1]) return 0;
    const kf_type *qt = &g->values[dn->in[0]].type;
    const kf_value *sv = &g->values[dn->in[1]];
    if ((qt->dtype != KF_DT_INT8 && qt->dtype != KF_DT_UINT8) || g->values[dn->out[0]].type.dtype != KF_DT_FLOAT ||
        kf_attr_i(dn, "block_size", 0) != 0 || !kf_value_is_constant(m, dn->in[1]) || sv->init->dtype != KF_DT_FLOAT)
        return 0;
    bool per_axis = sv->init->numel != 1;
    if (per_axis) {
        int64_t a = kf_attr_i(dn, "axis", 1);
        if (a < 0) a += qt->rank;
        if (len <= 0 || a != axis || sv->init->rank != 1 || sv->init->numel != len) return 0;
    }
    if (dn->nin > 2 && dn->in[2]) {
        const kf_type *zt = &g->values[dn->in[2]].type;
        if (!kf_type_is_static(zt)) return 0;
        int64_t e = 1;
        for (int k = 0; k < zt->rank; k++) e *= zt->dims[k];
        if (e != 1 && (!per_axis || zt->rank != 1 || e != len)) return 0;
    }
    return d;
}

/* A Conv bias of len channels that the integer form can add as a constant:
 * a float32 constant, or a DequantizeLinear of constants (ONNX Runtime's
 * quantize_static writes an int32 bias with the scale sx * sw so, which an
 * int8 plan leaves unfolded). */
static bool conv_bias_ok(const kf_model *m, kf_id b, int64_t len) {
    const kf_graph *g = m->graph;
    const kf_type *t = &g->values[b].type;
    if (t->dtype != KF_DT_FLOAT || t->rank != 1 || t->dims[0] != len) return false;
    if (kf_value_is_constant(m, b)) return true;
    kf_id d = g->values[b].producer;
    if (!d || g->nodes[d].op != KF_OP_DEQUANTIZE_LINEAR) return false;
    const kf_node *dn = &g->nodes[d];
    for (int i = 0; i < dn->nin; i++)
        if (dn->in[i] && !kf_value_is_constant(m, dn->in[i])) return false;
    return dn->nin >= 2 && dn->in[0] && dn->in[1];
}

/* The float32 values of such a bias into out (len floats): the constant's,
 * or its DequantizeLinear run by the reference evaluator. */
static kf_status conv_bias_values(const kf_model *m, kf_id b, float *out, int64_t len) {
    const kf_graph *g = m->graph;
    if (kf_value_is_constant(m, b)) {
        memcpy(out, g->values[b].init->data, sizeof(float) * (size_t)len);
        return KF_OK;
    }
    const kf_node *dn = &g->nodes[g->values[b].producer];
    const kf_tensor *in[3] = {0};
    for (int i = 0; i < dn->nin && i < 3; i++) in[i] = dn->in[i] ? g->values[dn->in[i]].init : NULL;
    kf_tensor r = {0};
    kf_status st = kf_eval_node(dn, dn->nin < 3 ? dn->nin : 3, in, &r);
    if (!st && (r.dtype != KF_DT_FLOAT || r.numel != len))
        st = kf_fail(KF_ERR_INTERNAL, "node '%s': bias of %lld values, want %lld", kf_node_label(dn), (long long)r.numel,
                     (long long)len);
    if (!st) memcpy(out, r.data, sizeof(float) * (size_t)len);
    kf_tensor_release(&r);
    return st;
}

typedef struct anchor {
    kf_id n, dx, dw;   /* the product and its two DequantizeLinears */
    kf_id view;        /* a Reshape or Flatten between dx and n (0: none) */
    bool transb;       /* Gemm transB: dw's 8-bit constant [N, K] is transposed once */
    int64_t channels;  /* output channels (Conv M, MatMul/Gemm N) */
    bool conv;
    kf_id bias;        /* Conv's B or Gemm's C (0: none) */
} anchor;

/* Can node id run as an integer anchor? Fills a. */
static bool eligible(const kf_model *m, kf_id id, anchor *a) {
    const kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[id];
    *a = (anchor){.n = id};
    if (n->dead || n->nin < 2 || !n->in[0] || !n->in[1] || n->nout < 1 || !n->out[0]) return false;
    const kf_type *wt = &g->values[n->in[1]].type, *xt = &g->values[n->in[0]].type;
    int waxis;
    switch (n->op) {
    case KF_OP_CONV:
        if (wt->rank < 3 || wt->dims[0] <= 0) return false;
        a->conv = true, a->channels = wt->dims[0], waxis = 0;
        a->bias = n->nin > 2 ? n->in[2] : 0;
        break;
    case KF_OP_GEMM:
        /* A * B + C (MatMulInteger has no transposes: a B^T of constant
         * 8-bit weights is transposed once here, as PyTorch's Linear is) */
        if (kf_attr_i(n, "transA", 0) || kf_attr_f(n, "alpha", 1.0f) != 1.0f || kf_attr_f(n, "beta", 1.0f) != 1.0f ||
            wt->rank != 2)
            return false;
        a->bias = n->nin > 2 ? n->in[2] : 0;
        a->transb = kf_attr_i(n, "transB", 0) != 0;
        if (a->transb) {
            a->channels = wt->dims[0], waxis = 0;
            break;
        }
        /* fall through */
    case KF_OP_MATMUL:
        if (wt->rank != 2 || xt->rank < 1 || wt->dims[1] <= 0) return false;
        a->channels = wt->dims[1], waxis = 1;
        break;
    default: return false;
    }
    /* Conv's B is added per channel: reshaped, so it must be a constant */
    if (a->bias && (a->conv ? !conv_bias_ok(m, a->bias, a->channels) : g->values[a->bias].type.dtype != KF_DT_FLOAT))
        return false;
    a->dx = dq_operand(m, n, 0, 0, 0);
    if (!a->dx && !a->conv) {
        /* a flattened activation: DequantizeLinear per tensor commutes with
         * the Reshape, which then moves the 8-bit values */
        kf_id v = g->values[n->in[0]].producer;
        const kf_node *vn = v ? &g->nodes[v] : NULL;
        if (vn && (vn->op == KF_OP_RESHAPE || vn->op == KF_OP_FLATTEN) && (a->dx = dq_operand(m, vn, 0, 0, 0)))
            a->view = v;
    }
    a->dw = dq_operand(m, n, 1, waxis, a->channels);
    if (a->dw && a->transb && !kf_value_is_constant(m, g->nodes[a->dw].in[0])) return false;
    return a->dx && a->dw && a->dx != a->dw;
}

static kf_status add_node(kf_model *m, const char *op_type, kf_op op, const char *name, const kf_id *in, int nin,
                          kf_id out, kf_id *node) {
    KF_TRY(kf_graph_add_node(m->graph, op_type, "", name, in, nin, &out, 1, node));
    m->graph->nodes[*node].op = op;
    m->graph->nodes[*node].opset = kf_model_opset(m, "");
    return KF_OK;
}

/* Mul(x, scale) named "<label>_<tag>_scale", then (with bias) Add of the
 * bias named "<label>_<tag>_bias": the last one writes y, the Mul writes
 * scaled (y itself when there is no bias). The tail of both rewrites. */
static kf_status scale_then_bias(kf_model *m, const char *label, const char *tag, kf_id x, kf_id scale, kf_id bias,
                                 kf_id scaled, kf_id y) {
    char name[256];
    kf_id id, mul_in[2] = {x, scale}, add_in[2] = {scaled, bias};
    snprintf(name, sizeof name, "%s_%s_scale", label, tag);
    KF_TRY(add_node(m, "Mul", KF_OP_MUL, name, mul_in, 2, scaled, &id));
    if (!bias) return KF_OK;
    snprintf(name, sizeof name, "%s_%s_bias", label, tag);
    return add_node(m, "Add", KF_OP_ADD, name, add_in, 2, y, &id);
}

/* The float32 constant sx * sw[c] per output channel c, shaped to scale
 * the anchor's output: [C] for a product (the last axis), [C, 1, ...] for
 * a convolution's NC... output of rank orank; [] when both are per tensor. */
static kf_status channel_scales(kf_graph *g, const anchor *a, int orank, kf_id *id) {
    const kf_tensor *sx = g->values[g->nodes[a->dx].in[1]].init, *sw = g->values[g->nodes[a->dw].in[1]].init;
    int64_t dims[KF_MAX_RANK];
    int rank = 0;
    if (sw->numel != 1) {
        dims[rank++] = sw->numel;
        while (a->conv && rank < orank - 1) dims[rank++] = 1;
    }
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_FLOAT, rank, dims);
    for (int64_t c = 0; !st && c < sw->numel; c++)
        ((float *)t->data)[c] = ((const float *)sx->data)[0] * ((const float *)sw->data)[c];
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    return kf_graph_add_constant(g, "int8_scale", t, id);
}

/* The zero point of a QuantizeLinear or DequantizeLinear n when it is a
 * one-element uint8 constant; 0 otherwise (absent, int8, per axis). */
static kf_id u8_scalar_zero(const kf_model *m, const kf_node *n) {
    if (kf_node_onnx_nin(n) < 3 || !n->in[2] || !kf_value_is_constant(m, n->in[2])) return 0;
    const kf_tensor *z = m->graph->values[n->in[2]].init;
    return z->dtype == KF_DT_UINT8 && z->numel == 1 ? n->in[2] : 0;
}

/* QuantizeLinear node q writes int8 instead of uint8 when its readers are
 * all DequantizeLinears of the same zero point (see the head of the file).
 * *moved: whether it did. */
static kf_status signed_activation(kf_model *m, kf_id q, bool *moved) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[q];
    *moved = false;
    if (n->dead || n->op != KF_OP_QUANTIZE_LINEAR || n->nout < 1 || !n->out[0] || kf_attr_i(n, "block_size", 0) ||
        kf_attr_i(n, "output_dtype", 0) > 0)
        return KF_OK;
    kf_id y = n->out[0], zq = u8_scalar_zero(m, n);
    const kf_value *yv = &g->values[y];
    if (!zq || yv->is_output || !yv->nusers) return KF_OK;
    uint8_t z = ((const uint8_t *)g->values[zq].init->data)[0];
    for (uint32_t u = 0; u < yv->nusers; u++) {
        const kf_node *d = &g->nodes[yv->users[u]];
        kf_id zd = d->op == KF_OP_DEQUANTIZE_LINEAR && d->in[0] == y && d->in[1] != y ? u8_scalar_zero(m, d) : 0;
        if (!zd || ((const uint8_t *)g->values[zd].init->data)[0] != z) return KF_OK;
    }
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_INT8, 0, NULL);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    ((int8_t *)t->data)[0] = (int8_t)((int)z - 128);
    kf_id z8;
    KF_TRY(kf_graph_add_constant(g, "int8_zero_point", t, &z8));
    KF_TRY(kf_graph_set_input(g, q, 2, z8));
    g->values[y].type.dtype = KF_DT_INT8; /* what the file declared changes with it */
    /* moving a reader's zero point leaves y's own use list as it is */
    for (uint32_t u = 0; u < g->values[y].nusers; u++) KF_TRY(kf_graph_set_input(g, g->values[y].users[u], 2, z8));
    *moved = true;
    return KF_OK;
}

/* Column sums of the constant int8/uint8 weights w [K, N] times -zx, as an
 * int32 constant [N]: what the activation zero point zx (a one-element
 * constant) takes from each column of the product. */
static kf_status zero_point_columns(kf_graph *g, kf_id w, kf_id zx, kf_id *id) {
    const kf_tensor *wt = g->values[w].init;
    int64_t K = wt->dims[0], N = wt->dims[1];
    int64_t z = kf_get_i64(g->values[zx].init, 0);
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_INT32, 1, &N);
    for (int64_t n = 0; !st && n < N; n++) {
        int64_t sum = 0; /* |z| <= 255, |w| <= 255, K < 2^31: fits */
        for (int64_t k = 0; k < K; k++) sum += kf_get_i64(wt, k * N + n);
        ((int32_t *)t->data)[n] = (int32_t)(-z * sum);
    }
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    return kf_graph_add_constant(g, "int8_zero_columns", t, id);
}

/* Node a.n becomes the integer anchor, a Cast, the scaling Mul and the
 * bias Add; its output value (name, users) is the last one's. */
static kf_status rewrite(kf_model *m, const anchor *a) {
    kf_graph *g = m->graph;
    const kf_node *dx = &g->nodes[a->dx], *dw = &g->nodes[a->dw];
    kf_id in[4] = {dx->in[0], dw->in[0], dx->nin > 2 ? dx->in[2] : 0, dw->nin > 2 ? dw->in[2] : 0};
    /* zero points that are constant zeros are left out: the same sums,
     * and ONNX Runtime's ConvInteger takes weight zero points per tensor only */
    for (int i = 2; i < 4; i++)
        if (in[i] && kf_value_is_constant(m, in[i]) && all_zero(g->values[in[i]].init)) in[i] = 0;
    kf_id y = g->nodes[a->n].out[0], acc, f, scaled, scale, id;
    int orank = g->values[y].type.rank;
    char name[256], label[200];
    if (a->transb) { /* [N, K] -> [K, N], once */
        const kf_tensor *w = g->values[in[1]].init;
        int64_t N = w->dims[0], K = w->dims[1], dims[2] = {K, N};
        kf_tensor *t = kf_tensor_new();
        if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_status st = kf_tensor_alloc(t, w->dtype, 2, dims);
        for (int64_t r = 0; !st && r < N; r++)
            for (int64_t c = 0; c < K; c++) ((uint8_t *)t->data)[c * N + r] = ((const uint8_t *)w->data)[r * K + c];
        if (st) {
            kf_tensor_free(t);
            return st;
        }
        KF_TRY(kf_graph_add_constant(g, "int8_weight_t", t, &in[1]));
    }
    snprintf(label, sizeof label, "%s", kf_node_label(&g->nodes[a->n]));
    if (a->view) { /* the Reshape (or Flatten) again, on the 8-bit values */
        kf_id vin[2] = {in[0], g->nodes[a->view].nin > 1 ? g->nodes[a->view].in[1] : 0}, moved;
        const kf_node *vn = &g->nodes[a->view];
        KF_TRY(kf_graph_fresh_value(g, "int8_view", &moved));
        snprintf(name, sizeof name, "%s_int8", kf_node_label(vn));
        KF_TRY(add_node(m, vn->op_type, vn->op, name, vin, vin[1] ? 2 : 1, moved, &id));
        for (int i = 0; i < g->nodes[a->view].nattrs; i++)
            KF_TRY(kf_node_add_attr(&g->nodes[id], &g->nodes[a->view].attrs[i]));
        in[0] = moved;
    }
    KF_TRY(channel_scales(g, a, orank, &scale));
    KF_TRY(kf_graph_fresh_value(g, "int8_acc", &acc));
    /* the activation's zero point as a constant per column, when the
     * weights have none (see the head of the file) */
    kf_id zcols = 0, raw = acc;
    if (!a->conv && in[2] && !in[3] && kf_value_is_constant(m, in[1]) && g->values[in[1]].init->rank == 2 &&
        kf_value_is_constant(m, in[2]) && g->values[in[2]].init->numel == 1) {
        KF_TRY(zero_point_columns(g, in[1], in[2], &zcols));
        KF_TRY(kf_graph_fresh_value(g, "int8_raw", &raw));
        in[2] = 0;
    }
    KF_TRY(kf_graph_fresh_value(g, "int8_float", &f));
    scaled = y;
    if (a->bias) KF_TRY(kf_graph_fresh_value(g, "int8_scaled", &scaled));
    kf_id bias = a->bias;
    if (bias && a->conv) { /* [M] -> [M, 1, ...] to add along the channels of NC... */
        kf_tensor *t = kf_tensor_new();
        if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
        int64_t dims[KF_MAX_RANK];
        dims[0] = a->channels;
        for (int d = 1; d < orank - 1; d++) dims[d] = 1;
        kf_status st = kf_tensor_alloc(t, KF_DT_FLOAT, orank - 1, dims);
        if (!st) st = conv_bias_values(m, bias, (float *)t->data, a->channels);
        if (st) {
            kf_tensor_free(t);
            return st;
        }
        KF_TRY(kf_graph_add_constant(g, "int8_bias", t, &bias));
    }
    /* the old node goes first: y must have no producer when the last new
     * node writes it (its attributes are copied before) */
    int nattrs = g->nodes[a->n].nattrs;
    snprintf(name, sizeof name, "%s_int8", label);
    KF_TRY(add_node(m, a->conv ? "ConvInteger" : "MatMulInteger", a->conv ? KF_OP_CONV_INTEGER : KF_OP_MATMUL_INTEGER,
                    name, in, in[3] ? 4 : in[2] ? 3 : 2, raw, &id));
    for (int i = 0; a->conv && i < nattrs; i++) KF_TRY(kf_node_add_attr(&g->nodes[id], &g->nodes[a->n].attrs[i]));
    kf_graph_remove_node(g, a->n);
    if (zcols) {
        snprintf(name, sizeof name, "%s_int8_zero_point", label);
        kf_id zin[2] = {raw, zcols};
        KF_TRY(add_node(m, "Add", KF_OP_ADD, name, zin, 2, acc, &id));
    }
    snprintf(name, sizeof name, "%s_int8_cast", label);
    KF_TRY(add_node(m, "Cast", KF_OP_CAST, name, &acc, 1, f, &id));
    kf_attr to = {.name = "to", .type = KF_ATTR_INT, .i = KF_DT_FLOAT};
    KF_TRY(kf_node_add_attr(&g->nodes[id], &to));
    return scale_then_bias(m, label, "int8", f, scale, bias, scaled, y);
}

kf_status kf_fuse_int8(kf_model *m, kf_int8_stats *st) {
    if (st) memset(st, 0, sizeof *st);
    KF_TRY(kf_infer_shapes(m));
    kf_graph *g = m->graph;
    uint32_t moved = 0;
    for (kf_id id = 1; id < g->nnodes; id++) {
        bool mv;
        KF_TRY(signed_activation(m, id, &mv));
        moved += mv;
    }
    if (moved) KF_TRY(kf_infer_shapes(m));
    uint32_t nn = g->nnodes, done = 0;
    for (kf_id id = 1; id < nn; id++) {
        anchor a;
        if (!eligible(m, id, &a)) continue;
        KF_TRY(rewrite(m, &a));
        done++;
    }
    if (st) st->activations_signed = moved;
    KF_TRY(kf_graph_dce(g, NULL));
    if (st) st->anchors = done;
    kf_status s = kf_infer_shapes(m);
    if (s && s != KF_ERR_NOMEM) return kf_fail(KF_ERR_INTERNAL, "the int8 graph does not infer: %s", kf_last_error());
    return s;
}

/* ---- float8 products (precision FP8) ------------------------------------------
 *
 * A float8 product whose weights carry one scale per output column
 * (kf_fp8_product_form with per_column; `kfuse quantize --type fp8
 * --per-channel` writes them, and the sibling merge makes them of per-tensor
 * weights with different scales) runs on the float8 values with unit
 * scales, and the scales follow as one Mul per column:
 *
 *   xq ─► DQ(sx) ─┐                     xq ─► DQ(1) ─┐
 *                 MatMul ─► y    ==>                 MatMul ─► Mul(sx * sw) ─► (+ C) ─► y
 *   wq ─► DQ(sw) ─┘                     wq ─► DQ(1) ─┘
 *
 * The sums are of exact products either way (a float8 product is exact in
 * float32); they round once more, when scaled. The unit-scale product then
 * is a kf_fp8_product (the library's float8 GEMM, alpha 1) whose sums,
 * unscaled, may pass float16's range: the fp16 pass keeps it, its
 * DequantizeLinears and the Mul in float32 (pass_precision.c). */

static kf_status f32_constant(kf_graph *g, const char *base, int rank, const int64_t *dims, const float *v, kf_id *id) {
    kf_tensor *t = kf_tensor_new();
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(t, KF_DT_FLOAT, rank, dims);
    if (!st) memcpy(t->data, v, sizeof(float) * (size_t)t->numel);
    if (st) {
        kf_tensor_free(t);
        return st;
    }
    return kf_graph_add_constant(g, base, t, id);
}

static kf_status fp8_per_column(kf_model *m, kf_id id) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[id];
    const kf_node *dx = &g->nodes[g->values[n->in[0]].producer], *dw = &g->nodes[g->values[n->in[1]].producer];
    const kf_tensor *sx = g->values[dx->in[1]].init, *sw = g->values[dw->in[1]].init;
    int64_t N = sw->numel;
    float *col = kf_malloc(sizeof(float) * (size_t)N);
    if (!col) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int64_t c = 0; c < N; c++) col[c] = (float)kf_get_f64(sx, 0) * (float)kf_get_f64(sw, c);
    kf_id one, scale, xq = dx->in[0], wq = dw->in[0], y = n->out[0], c = n->op == KF_OP_GEMM && n->nin > 2 ? n->in[2] : 0;
    float unit = 1.0f;
    kf_status st = f32_constant(g, "fp8_unit_scale", 0, NULL, &unit, &one);
    if (!st) st = f32_constant(g, "fp8_column_scale", 1, &N, col, &scale);
    kf_free(col);
    KF_TRY(st);
    char name[256], label[200];
    snprintf(label, sizeof label, "%s", kf_node_label(n));
    kf_id xd, wd, raw, scaled = y, nid;
    KF_TRY(kf_graph_fresh_value(g, "fp8_x", &xd));
    KF_TRY(kf_graph_fresh_value(g, "fp8_w", &wd));
    KF_TRY(kf_graph_fresh_value(g, "fp8_sums", &raw));
    if (c) KF_TRY(kf_graph_fresh_value(g, "fp8_scaled", &scaled));
    kf_id xin[2] = {xq, one}, win[2] = {wq, one};
    snprintf(name, sizeof name, "%s_fp8_x", label);
    KF_TRY(add_node(m, "DequantizeLinear", KF_OP_DEQUANTIZE_LINEAR, name, xin, 2, xd, &nid));
    snprintf(name, sizeof name, "%s_fp8_w", label);
    KF_TRY(add_node(m, "DequantizeLinear", KF_OP_DEQUANTIZE_LINEAR, name, win, 2, wd, &nid));
    /* the product without C, its attributes (Gemm's transB) kept; the old
     * node goes before the last new one writes y */
    n = &g->nodes[id];
    kf_id pin[2] = {xd, wd};
    bool gemm = n->op == KF_OP_GEMM;
    snprintf(name, sizeof name, "%s_fp8", label);
    KF_TRY(add_node(m, gemm ? "Gemm" : "MatMul", gemm ? KF_OP_GEMM : KF_OP_MATMUL, name, pin, 2, raw, &nid));
    for (int i = 0; gemm && i < g->nodes[id].nattrs; i++) KF_TRY(kf_node_add_attr(&g->nodes[nid], &g->nodes[id].attrs[i]));
    kf_graph_remove_node(g, id);
    return scale_then_bias(m, label, "fp8", raw, scale, c, scaled, y);
}

/* Product or conv id reads its input through a float8 DequantizeLinear
 * other nodes read too (ResNet's downsampling block: the block's first conv
 * and its shortcut conv share one): gives id a copy of it, so the float8
 * form (kf_fp8_anchor) can hold both its DequantizeLinears in its group;
 * kept only when id is then such an anchor. *copied: 1 when kept. */
static kf_status fp8_own_input(kf_model *m, kf_id id, uint32_t *copied) {
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[id];
    *copied = 0;
    if (n->dead || (n->op != KF_OP_CONV && n->op != KF_OP_MATMUL && n->op != KF_OP_GEMM) || n->nin < 2 || !n->in[0])
        return KF_OK;
    kf_id x = n->in[0], d = g->values[x].producer;
    if (!d || g->values[x].nusers < 2 || g->values[x].is_output || n->in[1] == x) return KF_OK;
    const kf_node *dn = &g->nodes[d];
    if (dn->op != KF_OP_DEQUANTIZE_LINEAR || dn->nout != 1 || !dn->in[0]) return KF_OK;
    kf_dtype q = g->values[dn->in[0]].type.dtype;
    if (q != KF_DT_FLOAT8E4M3FN && q != KF_DT_FLOAT8E5M2) return KF_OK;
    char label[200], name[256];
    snprintf(label, sizeof label, "%s", kf_node_label(n));
    snprintf(name, sizeof name, "%s_fp8_x", label);
    kf_id in[3] = {dn->in[0], dn->in[1], dn->nin > 2 ? dn->in[2] : 0}, out, node;
    KF_TRY(kf_graph_fresh_value(g, "fp8_x", &out));
    KF_TRY(add_node(m, "DequantizeLinear", KF_OP_DEQUANTIZE_LINEAR, name, in, in[2] ? 3 : 2, out, &node));
    for (int i = 0; i < g->nodes[d].nattrs; i++) KF_TRY(kf_node_add_attr(&g->nodes[node], &g->nodes[d].attrs[i]));
    KF_TRY(kf_infer_node(m, node));
    KF_TRY(kf_graph_set_input(g, id, 0, out));
    if (kf_fp8_anchor(m, &g->nodes[id])) {
        *copied = 1;
        return KF_OK;
    }
    KF_TRY(kf_graph_set_input(g, id, 0, x)); /* no float8 form either way: as it was */
    kf_graph_remove_node(g, node);
    return KF_OK;
}

kf_status kf_fuse_fp8(kf_model *m, uint32_t *rewritten) {
    *rewritten = 0;
    KF_TRY(kf_infer_shapes(m));
    kf_graph *g = m->graph;
    uint32_t nn = g->nnodes, copies = 0;
    for (kf_id id = 1; id < nn; id++) {
        uint32_t c;
        KF_TRY(fp8_own_input(m, id, &c));
        copies += c;
    }
    for (kf_id id = 1; id < nn; id++) {
        const kf_node *n = &g->nodes[id];
        if (kf_fp8_product(m, n, NULL) || !kf_fp8_product_form(m, n, true, NULL)) continue;
        /* float32 scales (a float16 model's would give float16 sums) */
        const kf_node *dx = &g->nodes[g->values[n->in[0]].producer], *dw = &g->nodes[g->values[n->in[1]].producer];
        if (g->values[dx->in[1]].init->dtype != KF_DT_FLOAT || g->values[dw->in[1]].init->dtype != KF_DT_FLOAT) continue;
        KF_TRY(fp8_per_column(m, id));
        (*rewritten)++;
    }
    if (!*rewritten && !copies) return KF_OK;
    KF_TRY(kf_graph_dce(g, NULL));
    kf_status s = kf_infer_shapes(m);
    if (s && s != KF_ERR_NOMEM) return kf_fail(KF_ERR_INTERNAL, "the fp8 graph does not infer: %s", kf_last_error());
    return s;
}
