/*
 * pass_gemm.c: turns a matrix product followed by an Add into one Gemm:
 * MatMul + Add -> Gemm when both MatMul operands are 2-D (no Reshapes are
 * inserted for higher ranks), and Gemm + Add -> Gemm with the addend as (or
 * folded into) C. The addend must broadcast unidirectionally to the product's
 * [M, N], so the Add never enlarges it. Node-local C-callback rules
 * registered through passes.def; per-channel constant epilogues of convs are
 * pass_bn.c's.
 */
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"

/* An initializer the caller cannot replace: from IR version 4 on, an
 * initializer that is also a graph input is only a default value. */
static const kf_tensor *const_init(const kf_model *m, kf_id v) {
    const kf_value *x = &m->graph->values[v];
    if (!x->init || (x->is_input && m->ir_version >= 4)) return NULL;
    return x->init;
}


/* Dtypes Gemm takes for float products at this opset (bfloat16 from 13). */
static bool gemm_float_dtype(kf_dtype dt, int64_t opset) {
    return dt == KF_DT_FLOAT || dt == KF_DT_DOUBLE || dt == KF_DT_FLOAT16 || (dt == KF_DT_BFLOAT16 && opset >= 13);
}

/* The product p (of op kind `op`) feeding Add node e, and the addend x;
 * false when no operand of e is produced by such an op. */
static bool find_product(const kf_graph *g, const kf_node *e, kf_op op, kf_id *p, kf_id *x) {
    if (e->nin != 2 || !e->in[0] || !e->in[1]) return false;
    int orders = kf_op_get(e->op)->flags & KF_F_COMMUTATIVE ? 2 : 1;
    for (int i = 0; i < orders; i++) {
        kf_id pr = g->values[e->in[i]].producer;
        if (pr && !g->nodes[pr].dead && g->nodes[pr].op == op) {
            *p = pr;
            *x = e->in[1 - i];
            return true;
        }
    }
    return false;
}

/* Why Add node e cannot take its product y into a Gemm with addend x as C,
 * or NULL. */
static const char *addend_problem(const kf_model *m, const kf_node *e, kf_id y, kf_id x) {
    const kf_graph *g = m->graph;
    const kf_value *yv = &g->values[y];
    if (yv->is_output) return "the product is a graph output";
    if (yv->nusers != 1) return "the product has other consumers";
    if (e->opset < 7 && kf_attr_i(e, "broadcast", 0) != 0) return "legacy broadcast attribute (opset < 7)";
    if (kf_model_opset(m, "") < 7) return "Gemm before opset 7 broadcasts C only through an attribute";
    const kf_type *xt = &g->values[x].type;
    if (xt->rank < 0 || xt->rank > 2) return "the addend has rank above 2 or unknown";
    if (xt->dtype != yv->type.dtype) return "the addend's dtype differs from the product's";
    if (!kf_type_same_shape(&g->values[e->out[0]].type, &yv->type))
        return "the addend may broadcast the product to a larger shape";
    return NULL;
}

/* Adds Gemm(a, b, c) with attrs of `like` (0: none) and beta set to 1,
 * whose output replaces the uses of e's output; removes e and node `gone`. */
static kf_status emit_gemm(kf_model *m, kf_id e, kf_id like, kf_id gone, kf_id a, kf_id b, kf_id c) {
    kf_graph *g = m->graph;
    kf_id e_out = g->nodes[e].out[0], out, node;
    KF_TRY(kf_graph_fresh_value(g, g->values[e_out].name, &out));
    kf_id in[3] = {a, b, c};
    KF_TRY(kf_graph_add_node(g, "Gemm", "", g->nodes[like ? like : gone].name, in, 3, &out, 1, &node));
    kf_node *n = &g->nodes[node];
    n->op = KF_OP_GEMM;
    n->opset = kf_model_opset(m, "");
    if (like)
        for (int i = 0; i < g->nodes[like].nattrs; i++) {
            const kf_attr *at = &g->nodes[like].attrs[i];
            if (strcmp(at->name, "beta")) KF_TRY(kf_node_add_attr(&g->nodes[node], at));
        }
    KF_TRY(kf_infer_node(m, node));
    KF_TRY(kf_graph_replace_uses(g, e_out, out));
    kf_graph_remove_node(g, e);
    kf_graph_remove_node(g, gone);
    return KF_OK;
}

/* add(matmul(a, b), x) -> gemm(a, b, x) with a, b 2-D and x broadcasting to [M, N] */
static kf_status matmul_add_to_gemm(kf_model *m, kf_id e, void *user, bool *applied, const char **why) {
    (void)user;
    *applied = false;
    kf_graph *g = m->graph;
    const kf_node *en = &g->nodes[e];
    kf_id mm, x;
    if (!find_product(g, en, KF_OP_MATMUL, &mm, &x)) return KF_OK;
    const kf_node *mn = &g->nodes[mm];
    if (mn->nin != 2 || !mn->in[0] || !mn->in[1]) return KF_OK;
    const kf_type *at = &g->values[mn->in[0]].type, *bt = &g->values[mn->in[1]].type;
    if (at->rank != 2) {
        *why = "MatMul input A is not 2-D (Gemm takes 2-D operands; no Reshapes are inserted)";
        return KF_OK;
    }
    if (bt->rank != 2) {
        *why = "MatMul input B is not 2-D (Gemm takes 2-D operands; no Reshapes are inserted)";
        return KF_OK;
    }
    if (!gemm_float_dtype(at->dtype, kf_model_opset(m, ""))) {
        *why = "Gemm does not take this dtype at the model's opset";
        return KF_OK;
    }
    if ((*why = addend_problem(m, en, mn->out[0], x))) return KF_OK;
    KF_TRY(emit_gemm(m, e, 0, mm, mn->in[0], mn->in[1], x));
    *applied = true;
    return KF_OK;
}

/* beta * C + X for constants C and X that broadcast unidirectionally to the
 * Gemm output (ranks <= 2); shape is their broadcast. KF_ERR_SHAPE when
 * they do not broadcast together. */
static kf_status sum_bias(const kf_tensor *c, double beta, const kf_tensor *x, kf_tensor *out) {
    int rank = c->rank > x->rank ? c->rank : x->rank;
    int64_t dims[2] = {1, 1};
    const kf_tensor *t[2] = {c, x};
    int64_t st[2][2];
    for (int k = 0; k < 2; k++) {
        int64_t d0 = t[k]->rank >= 2 ? t[k]->dims[t[k]->rank - 2] : 1, d1 = t[k]->rank >= 1 ? t[k]->dims[t[k]->rank - 1] : 1;
        if ((d0 != 1 && dims[0] != 1 && d0 != dims[0]) || (d1 != 1 && dims[1] != 1 && d1 != dims[1]))
            return kf_fail(KF_ERR_SHAPE, "Gemm bias shapes do not broadcast");
        if (d0 != 1) dims[0] = d0;
        if (d1 != 1) dims[1] = d1;
        st[k][0] = d0 == 1 ? 0 : d1;
        st[k][1] = d1 == 1 ? 0 : 1;
    }
    KF_TRY(kf_tensor_alloc(out, c->dtype, rank, dims + (2 - rank)));
    for (int64_t i = 0; i < dims[0]; i++)
        for (int64_t j = 0; j < dims[1]; j++)
            kf_set_f64(out, i * dims[1] + j,
                       beta * kf_get_f64(c, i * st[0][0] + j * st[0][1]) + kf_get_f64(x, i * st[1][0] + j * st[1][1]));
    return KF_OK;
}

/* add(gemm(a, b), x) -> gemm(a, b, x) with beta 1;
 * add(gemm(a, b, C), X) -> gemm(a, b, beta * C + X) for constants C and X */
static kf_status add_into_gemm(kf_model *m, kf_id e, void *user, bool *applied, const char **why) {
    (void)user;
    *applied = false;
    kf_graph *g = m->graph;
    const kf_node *en = &g->nodes[e];
    kf_id gm, x;
    if (!find_product(g, en, KF_OP_GEMM, &gm, &x)) return KF_OK;
    const kf_node *gn = &g->nodes[gm];
    if (gn->nin < 2 || !gn->in[0] || !gn->in[1]) return KF_OK;
    if ((*why = addend_problem(m, en, gn->out[0], x))) return KF_OK;
    kf_id c = gn->nin > 2 ? gn->in[2] : 0;
    if (c) {
        const kf_tensor *ct = const_init(m, c), *xt = const_init(m, x);
        if (!ct) {
            *why = "the Gemm already has a C that is not a constant";
            return KF_OK;
        }
        if (!xt) {
            *why = "the Gemm already has a C and the addend is not a constant";
            return KF_OK;
        }
        if (!kf_dtype_is_float(ct->dtype)) {
            *why = "the Gemm's C is not floating point";
            return KF_OK;
        }
        kf_tensor *sum = kf_tensor_new();
        if (!sum) return kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_status st = sum_bias(ct, kf_attr_f(gn, "beta", 1.0f), xt, sum);
        if (st) {
            kf_tensor_free(sum);
            if (st != KF_ERR_SHAPE) return st;
            *why = "the Gemm's C and the addend do not broadcast together";
            return KF_OK;
        }
        KF_TRY(kf_graph_add_constant(g, g->values[c].name, sum, &x));
    }
    gn = &g->nodes[gm];
    KF_TRY(emit_gemm(m, e, gm, gm, gn->in[0], gn->in[1], x));
    *applied = true;
    return KF_OK;
}

kf_status kf_pass_gemm_rules(kf_ruleset *rs) {
    /* add(matmul(a, b), x) -> gemm(a, b, x), a and b 2-D, x broadcasting to [M, N] */
    KF_TRY(kf_rules_add_callback(rs, "fuse_matmul_add_into_gemm", "Add", matmul_add_to_gemm, NULL));
    /* add(gemm(a, b), x) -> gemm(a, b, x); add(gemm(a, b, C), X) -> gemm(a, b, beta * C + X) */
    KF_TRY(kf_rules_add_callback(rs, "fold_add_into_gemm_bias", "Add", add_into_gemm, NULL));
    return KF_OK;
}
