/*
 * pass_precision.c: fp16/bf16 plans (DESIGN.md "Precision"). Turns the
 * float32 values of a model into float16 or bfloat16 where an op computes
 * on that type, with Casts where float32 must stay; runs on a compiled
 * plan's own copy after optimization, before the fusion planner, so the
 * planner, codegen and the reference evaluator all see an ordinary
 * 16-bit graph. Generated kernels and the evaluator compute in float (or
 * double) and round where a value is 16-bit, and accumulate GEMMs,
 * reductions, Softmax and norms in float32, so the only new error is the
 * rounding of stored values.
 *
 *   x:float32 (input) ─► Cast(to low) ─► Conv ─► Relu ─► ... ─► MatMul ─► Cast(to float) ─► y:float32 (output)
 *                         W:float32 ═══ converted once ═══╝          ║
 *                                                     Shape-like parameters and
 *                                                     ops without a low kernel:
 *                                                     float32, Cast in and out
 *
 * Which nodes go low is asked of the op table, never of op names: a node
 * computes low when it is known, has a float32 result (or, with none, reads
 * a value computed low), and its shape function accepts its float32
 * operands retyped to the low type and gives the low type for every
 * float32 result (the same function is what the evaluator and codegen
 * check dtypes against). At float16, a Cast of int32 and the Mul by a
 * constant scale after it stay float32 (keeps_range): an integer
 * product's sums pass float16's range until they are scaled; so do a
 * float8 product of unit scales, its DequantizeLinears and its Mul.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kf_cost.h"
#include "kf_ops.h"
#include "kf_precision.h"
#include "kf_ref.h"

/* Operands and results of one node the pass looks at; a node with more
 * (a Concat of hundreds) stays float32 behind Casts, which is correct. */
#define KF_PASS_PRECISION_MAX_ARITY 64

/* Input i of n is a shape or size parameter: an operand past the data of
 * a shape-from-data op (Reshape's shape, Resize's scales, Pad's pads), or
 * any operand of one whose data is a scalar (Range's start, limit, delta).
 * Such values keep float32, so the shapes they give do not round. */
static bool shape_slot(const kf_graph *g, const kf_node *n, int i) {
    const kf_op_info *info = kf_node_op(n);
    if (!info || !(info->flags & KF_F_SHAPE_FROM_DATA)) return false;
    if (i > 0) return true;
    return n->in[0] && g->values[n->in[0]].type.rank == 0;
}

typedef struct ctx {
    kf_model *m;
    kf_graph *g;
    kf_dtype low;
    uint32_t nv, nn;  /* values and nodes before the pass (new ones follow) */
    bool *f32;        /* per value: float32 before the pass */
    bool *pinned;     /* per value: computes a shape; stays float32 */
    bool *low_node;   /* per node */
    bool *is_low;     /* per value: retyped to low in place */
    kf_id *low_of;    /* per float32 value: its low twin (Cast or converted constant) */
    kf_id *f32_of;    /* per retyped value: its float32 twin (Cast) */
    kf_precision_stats st;
} ctx;

/* A Cast to float32 of int32, the type of an integer product's sums
 * (MatMulInteger, ConvInteger): its values pass float16's range (65504).
 * (int64 is left alone: in float models it holds ids, masks and positions,
 * which fit.) */
static bool wide_int_cast(const kf_graph *g, kf_id id) {
    const kf_node *n = id ? &g->nodes[id] : NULL;
    if (!n || n->op != KF_OP_CAST || n->nin < 1 || !n->in[0]) return false;
    return g->values[n->in[0]].type.dtype == KF_DT_INT32;
}

/* A float8 product of the float8 values themselves (float32 unit scales:
 * kf_fuse_fp8's), whose sums, unscaled, pass float16's range too. */
static bool unit_fp8_product(const ctx *c, kf_id id) {
    const kf_graph *g = c->g;
    if (!id || !kf_fp8_product(c->m, &g->nodes[id], NULL)) return false;
    for (int i = 0; i < 2; i++) {
        const kf_node *d = &g->nodes[g->values[g->nodes[id].in[i]].producer];
        const kf_tensor *s = g->values[d->in[1]].init;
        if (s->dtype != KF_DT_FLOAT || kf_get_f64(s, 0) != 1.0) return false;
    }
    return true;
}

/* At float16, such a Cast stays float32, and so does a Mul of its result
 * by a constant (the scale that dequantizes an integer product, which
 * brings the values back into range: kf_fuse_int8's Cast and Mul); and
 * likewise a unit-scale float8 product, its two DequantizeLinears and the
 * Mul by its column scales (kf_fuse_fp8's). */
static bool keeps_range(const ctx *c, const kf_node *n, kf_id id) {
    if (c->low != KF_DT_FLOAT16) return false;
    const kf_graph *g = c->g;
    if (wide_int_cast(g, id) || unit_fp8_product(c, id)) return true;
    if (n->op == KF_OP_DEQUANTIZE_LINEAR && n->nout == 1 && n->out[0] && g->values[n->out[0]].nusers == 1 &&
        unit_fp8_product(c, g->values[n->out[0]].users[0]))
        return true;
    if (n->op != KF_OP_MUL || n->nin != 2 || !n->in[0] || !n->in[1]) return false;
    for (int i = 0; i < 2; i++) {
        kf_id p = g->values[n->in[i]].producer;
        if ((wide_int_cast(g, p) || unit_fp8_product(c, p)) && kf_value_is_constant(c->m, n->in[1 - i])) return true;
    }
    return false;
}

/* Whether node id computes on the low type (see the file comment). An
 * out-of-memory in its shape function is the pass's failure (*nomem), not
 * a refusal: a run must not silently differ for want of memory. */
static bool goes_low(ctx *c, kf_id id, bool *nomem) {
    const kf_graph *g = c->g;
    const kf_node *n = &g->nodes[id];
    const kf_op_info *info = n->dead ? NULL : kf_node_op(n);
    if (!info || !info->shape || n->nin > KF_PASS_PRECISION_MAX_ARITY || n->nout > KF_PASS_PRECISION_MAX_ARITY)
        return false;
    /* the bodies of If, Loop and Scan declare their own float32 types and
     * constants: the node keeps float32 and Casts meet it */
    if (info->flags & KF_F_SUBGRAPHS) return false;
    if (keeps_range(c, n, id)) return false;
    bool f32_out = false, low_in = false, f32_in = false;
    for (int j = 0; j < n->nout; j++)
        if (n->out[j] && c->f32[n->out[j]]) {
            f32_out = true;
            if (c->pinned[n->out[j]]) return false;
        }
    for (int i = 0; i < n->nin; i++) {
        kf_id v = n->in[i], p = v ? g->values[v].producer : 0;
        if (!v || !c->f32[v]) continue;
        f32_in = true;
        low_in |= p && c->low_node[p];
    }
    /* no float result (a comparison, ArgMax, Shape, a Cast to an integer):
     * low only where an operand is computed low anyway, so its constants
     * round with it (x > 0.7534 compares like x and 0.7534 both rounded) and
     * no Cast back is needed; on float32 sources it stays exact */
    if (!f32_out && !(f32_in && low_in)) return false;
    kf_type tin[KF_PASS_PRECISION_MAX_ARITY], tout[KF_PASS_PRECISION_MAX_ARITY];
    const kf_type *pin[KF_PASS_PRECISION_MAX_ARITY];
    const kf_tensor *val[KF_PASS_PRECISION_MAX_ARITY];
    for (int i = 0; i < n->nin; i++) {
        kf_id v = n->in[i];
        pin[i] = NULL, val[i] = NULL;
        if (!v) continue;
        tin[i] = g->values[v].type;
        if (c->f32[v] && !shape_slot(g, n, i)) tin[i].dtype = c->low;
        pin[i] = &tin[i];
        if (kf_value_is_constant(c->m, v)) val[i] = g->values[v].init;
    }
    for (int j = 0; j < n->nout; j++) {
        memset(&tout[j], 0, sizeof tout[j]);
        tout[j].rank = -1;
    }
    kf_status st = info->shape(n, n->nin, pin, val, n->nout, tout);
    if (st == KF_ERR_NOMEM) *nomem = true;
    if (st) {
        if (st != KF_ERR_NOMEM) kf_clear_error(); /* refused: no kernel on the low type */
        return false;
    }
    for (int j = 0; j < n->nout; j++) {
        kf_id v = n->out[j];
        if (!v) continue;
        kf_dtype want = c->f32[v] ? c->low : g->values[v].type.dtype;
        if (tout[j].dtype != want) return false;
    }
    return true;
}

/* A Cast of value from to dtype `to`, written into a fresh value *out. */
static kf_status add_cast(ctx *c, kf_id from, kf_dtype to, kf_id *out) {
    kf_graph *g = c->g;
    char base[256];
    snprintf(base, sizeof base, "%s.%s", g->values[from].name, to == KF_DT_FLOAT ? "f32" : kf_dtype_name(to));
    KF_TRY(kf_graph_fresh_value(g, base, out));
    kf_type t = g->values[from].type;
    t.dtype = to;
    g->values[*out].type = t;
    g->values[*out].has_type = true;
    kf_id id;
    KF_TRY(kf_graph_add_node(g, "Cast", "", NULL, &from, 1, out, 1, &id));
    kf_node *n = &g->nodes[id];
    n->op = kf_op_lookup("", "Cast");
    n->opset = kf_model_opset(c->m, "");
    kf_attr a = {.name = (char *)"to", .type = KF_ATTR_INT, .i = (int64_t)to};
    KF_TRY(kf_node_add_attr(n, &a));
    c->st.casts++;
    return KF_OK;
}

/* A copy of float32 tensor t in the low type (rounded to nearest even),
 * finite values past the low type's range saturated to its largest finite
 * value: exporters write masks as float32's lowest value (finfo.min), which
 * rounds to -inf in float16 and in bfloat16 alike, and a Softmax row whose
 * every key is masked then gives NaN where the float32 model gives finite
 * numbers (a left-padded sequence's first row under a causal mask).
 * Infinities and NaN stay what they are. */
static kf_status convert(const kf_tensor *t, kf_dtype low, kf_tensor *out) {
    KF_TRY(kf_tensor_alloc(out, low, t->rank, t->dims));
    const float *src = t->data;
    uint16_t *dst = out->data;
    const uint16_t max_finite = low == KF_DT_FLOAT16 ? 0x7bff : 0x7f7f; /* 65504, 3.39e38 */
    for (int64_t i = 0; i < t->numel; i++) {
        uint16_t h = low == KF_DT_FLOAT16 ? kf_float_to_half(src[i]) : kf_float_to_bf16(src[i]);
        bool overflowed = (h & 0x7fff) == (low == KF_DT_FLOAT16 ? 0x7c00 : 0x7f80) && isfinite(src[i]);
        dst[i] = overflowed ? (uint16_t)((h & 0x8000) | max_finite) : h;
    }
    return KF_OK;
}

/* The low twin of float32 value v, made at its first use: a converted
 * copy of a constant, else a Cast. */
static kf_status low_twin(ctx *c, kf_id v, kf_id *out) {
    if (!c->low_of[v]) {
        kf_graph *g = c->g;
        const kf_tensor *t = g->values[v].init;
        if (t && kf_value_is_constant(c->m, v) && t->dtype == KF_DT_FLOAT) {
            kf_tensor *lt = kf_tensor_new();
            if (!lt) return kf_fail(KF_ERR_NOMEM, "out of memory");
            kf_status st = convert(t, c->low, lt);
            if (st) {
                kf_tensor_free(lt);
                return st;
            }
            KF_TRY(kf_graph_add_constant(g, g->values[v].name, lt, &c->low_of[v]));
            c->st.weights_converted++;
        } else
            KF_TRY(add_cast(c, v, c->low, &c->low_of[v]));
    }
    *out = c->low_of[v];
    return KF_OK;
}

/* A float32 constant that only low nodes read (as data) is converted in
 * place: no float32 copy stays behind to be uploaded or saved. */
static bool convert_in_place(const ctx *c, kf_id v) {
    const kf_value *x = &c->g->values[v];
    if (!x->init || x->init->dtype != KF_DT_FLOAT || x->is_input || x->is_output || !x->nusers) return false;
    for (uint32_t u = 0; u < x->nusers; u++) {
        const kf_node *n = &c->g->nodes[x->users[u]];
        if (!c->low_node[x->users[u]]) return false;
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] == v && shape_slot(c->g, n, i)) return false;
    }
    return true;
}

static kf_status run(ctx *c) {
    kf_graph *g = c->g;
    kf_id *order = NULL;
    uint32_t count = 0;
    KF_TRY(kf_graph_topo(g, &order, &count));
    /* shape parameters, and everything computing them, stay float32 */
    for (uint32_t k = 0; k < count; k++) {
        const kf_node *n = &g->nodes[order[k]];
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] && c->f32[n->in[i]] && shape_slot(g, n, i)) c->pinned[n->in[i]] = true;
    }
    for (uint32_t k = count; k-- > 0;) {
        const kf_node *n = &g->nodes[order[k]];
        bool pin = false;
        for (int j = 0; j < n->nout; j++) pin |= n->out[j] && c->pinned[n->out[j]];
        for (int i = 0; pin && i < n->nin; i++)
            if (n->in[i] && c->f32[n->in[i]]) c->pinned[n->in[i]] = true;
    }
    bool nomem = false;
    for (uint32_t k = 0; k < count && !nomem; k++) {
        kf_id id = order[k];
        c->low_node[id] = goes_low(c, id, &nomem); /* producers first: topological order */
        bool f32_out = false;
        for (int j = 0; j < g->nodes[id].nout; j++) f32_out |= g->nodes[id].out[j] && c->f32[g->nodes[id].out[j]];
        if (c->low_node[id]) c->st.nodes_low++;
        else if (f32_out) c->st.nodes_kept++;
    }
    kf_free(order);
    if (nomem) return KF_ERR_NOMEM; /* the message is the shape function's */
    if (!c->st.nodes_low) return KF_OK;

    /* constants only low nodes read: converted where they are */
    for (kf_id v = 1; v < c->nv; v++)
        if (c->f32[v] && convert_in_place(c, v)) {
            kf_tensor lt = {0};
            KF_TRY(convert(g->values[v].init, c->low, &lt));
            kf_tensor_move(g->values[v].init, &lt);
            g->values[v].type.dtype = c->low;
            c->is_low[v] = true;
            c->st.weights_converted++;
        }

    /* results of low nodes: retyped; a graph output keeps its name and
     * float32 type, written by a Cast of the low result */
    for (kf_id id = 1; id < c->nn; id++) {
        if (!c->low_node[id]) continue;
        for (int j = 0; j < g->nodes[id].nout; j++) {
            kf_id v = g->nodes[id].out[j];
            if (!v || !c->f32[v]) continue;
            if (!g->values[v].is_output) {
                g->values[v].type.dtype = c->low;
                c->is_low[v] = true;
                continue;
            }
            kf_id lv;
            char base[256];
            snprintf(base, sizeof base, "%s.%s", g->values[v].name, kf_dtype_name(c->low));
            KF_TRY(kf_graph_fresh_value(g, base, &lv));
            kf_value *x = &g->values[lv], *y = &g->values[v];
            x->type = y->type;
            x->type.dtype = c->low;
            x->has_type = true;
            g->nodes[id].out[j] = lv;
            x->producer = id;
            y->producer = 0;
            kf_id cast = 0;
            KF_TRY(kf_graph_add_node(g, "Cast", "", NULL, &lv, 1, &v, 1, &cast));
            kf_node *cn = &g->nodes[cast];
            cn->op = kf_op_lookup("", "Cast");
            cn->opset = kf_model_opset(c->m, "");
            kf_attr a = {.name = (char *)"to", .type = KF_ATTR_INT, .i = KF_DT_FLOAT};
            KF_TRY(kf_node_add_attr(cn, &a));
            c->st.casts++;
            c->low_of[v] = lv; /* low readers of the output read the low result */
        }
    }

    /* operands: a low node reads low twins of float32 values, a float32
     * node (or a shape parameter) float32 twins of retyped ones */
    for (kf_id id = 1; id < c->nn; id++) {
        if (g->nodes[id].dead) continue;
        for (int i = 0; i < g->nodes[id].nin; i++) {
            kf_id u = g->nodes[id].in[i];
            if (!u || u >= c->nv || !c->f32[u]) continue;
            bool want_low = c->low_node[id] && !shape_slot(g, &g->nodes[id], i);
            kf_id to = 0;
            if (want_low && !c->is_low[u]) KF_TRY(low_twin(c, u, &to));
            else if (!want_low && c->is_low[u]) {
                if (!c->f32_of[u]) KF_TRY(add_cast(c, u, KF_DT_FLOAT, &c->f32_of[u]));
                to = c->f32_of[u];
            }
            if (to) KF_TRY(kf_graph_set_input(g, id, i, to));
        }
    }
    kf_status st = kf_infer_shapes(c->m);
    if (st && st != KF_ERR_NOMEM)
        return kf_fail(KF_ERR_INTERNAL, "the %s graph does not infer: %s", kf_dtype_name(c->low), kf_last_error());
    return st;
}

kf_status kf_fuse_precision(kf_model *m, kf_dtype low, kf_precision_stats *st) {
    if (st) memset(st, 0, sizeof *st);
    if (low != KF_DT_FLOAT16 && low != KF_DT_BFLOAT16)
        return kf_fail(KF_ERR_INVALID_ARG, "precision pass: %s is not float16 or bfloat16", kf_dtype_name(low));
    KF_TRY(kf_infer_shapes(m)); /* every value's dtype known, whoever made the graph */
    ctx c = {.m = m, .g = m->graph, .low = low, .nv = m->graph->nvalues, .nn = m->graph->nnodes};
    c.f32 = kf_calloc(c.nv + 1, sizeof(bool));
    c.pinned = kf_calloc(c.nv + 1, sizeof(bool));
    c.is_low = kf_calloc(c.nv + 1, sizeof(bool));
    c.low_node = kf_calloc(c.nn + 1, sizeof(bool));
    c.low_of = kf_calloc(c.nv + 1, sizeof(kf_id));
    c.f32_of = kf_calloc(c.nv + 1, sizeof(kf_id));
    kf_status s = c.f32 && c.pinned && c.is_low && c.low_node && c.low_of && c.f32_of
                      ? KF_OK
                      : kf_fail(KF_ERR_NOMEM, "out of memory");
    for (kf_id v = 1; !s && v < c.nv; v++) c.f32[v] = m->graph->values[v].type.dtype == KF_DT_FLOAT;
    if (!s) s = run(&c);
    if (st) *st = c.st;
    kf_free(c.f32);
    kf_free(c.pinned);
    kf_free(c.is_low);
    kf_free(c.low_node);
    kf_free(c.low_of);
    kf_free(c.f32_of);
    return s;
}
