/*
 * libanchor.c: the target-independent half of library anchors
 * (kf_libanchor.h). Reads an anchor group of the fusion plan, decides
 * whether its GEMM is one cuBLASLt matmul (operand transposes, batch
 * strides, Gemm's alpha/beta/C, a bias Add and ReLU/tanh-GELU taken into
 * the library's epilogue), and generates the rest of the group as one
 * ordinary codegen kernel reading the library's output. Also the host
 * model of the call, which the tests run in place of the library.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kf_cost.h"
#include "kf_libanchor.h"

/* Nodes of one anchor group: the planner caps inputs and registers, which
 * keeps real groups far below this; a larger group is declined. */
#define LA_MAX_NODES 256
/* Nodes after the anchor the call can take: a bias Add, an activation and
 * the pure reshapes between them (a 2-D Gemm reshaped back to 3-D). */
#define LA_MAX_TAKEN 6

static kf_status decline(char *why, size_t whylen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static kf_status decline(char *why, size_t whylen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return KF_ERR_UNSUPPORTED;
}

static bool in_group(const kf_plan *p, uint32_t gi, const kf_graph *g, kf_id v) {
    kf_id pn = v ? g->values[v].producer : 0;
    return pn && p->group_of[pn] == gi;
}

static bool is_group_output(const kf_group *gr, kf_id v) {
    for (uint32_t o = 0; o < gr->noutputs; o++)
        if (gr->outputs[o] == v) return true;
    return false;
}

/* A Transpose that swaps the last two axes and nothing else. */
static bool swaps_last_two(const kf_node *n, int rank) {
    int cnt = 0;
    const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
    if (rank < 2) return false;
    if (!perm) return rank == 2; /* default: all axes reversed */
    if (cnt != rank) return false;
    for (int d = 0; d < rank - 2; d++)
        if (perm[d] != d) return false;
    return perm[rank - 2] == rank - 1 && perm[rank - 1] == rank - 2;
}

/* One model operand of the GEMM as stored: logical rows x cols per batch,
 * stored transposed (cols x rows) when t. */
typedef struct operand {
    kf_id value;
    bool t;
    kf_id absorbed; /* the Transpose node taken into t, or 0 */
} operand;

/* The library path takes float32 and float16, and bfloat16 GEMMs
 * (computed in float32), with both operands of the anchor's output dtype.
 * cuDNN's legacy API runs bfloat16 convolutions in NHWC only on most
 * GPUs, so an NCHW bfloat16 conv keeps its generated kernel. */
static kf_status library_dtype(const kf_node *an, const kf_type *xt, const kf_type *wt, const kf_type *yt, bool conv,
                               char *why, size_t whylen) {
    kf_dtype dt = yt->dtype;
    bool ok = dt == KF_DT_FLOAT || dt == KF_DT_FLOAT16 || (dt == KF_DT_BFLOAT16 && !conv);
    if (!ok || xt->dtype != dt || wt->dtype != dt)
        return decline(why, whylen, "node '%s': %s operands: the library path takes float32 and float16%s",
                       kf_node_label(an), kf_dtype_name(xt->dtype), conv ? " convolutions" : ", bfloat16 GEMMs");
    return KF_OK;
}

/* Resolves anchor input v: a group input, a pure reshape of one (the same
 * bytes) or a last-two-axes Transpose of one, whose only reader is the
 * anchor. Shapes are the anchor's view of the operand either way. */
static kf_status resolve(const kf_graph *g, const kf_plan *p, uint32_t gi, const kf_node *an, kf_id v, operand *op,
                         char *why, size_t whylen) {
    op->value = v, op->t = false, op->absorbed = 0;
    if (!in_group(p, gi, g, v)) return KF_OK;
    kf_id pn = g->values[v].producer;
    const kf_node *n = &g->nodes[pn];
    kf_id src = n->nin ? n->in[0] : 0;
    bool tr = n->op == KF_OP_TRANSPOSE && src && swaps_last_two(n, g->values[src].type.rank);
    if (!(tr || kf_plan_is_reshape(n)) || !src || in_group(p, gi, g, src) || g->values[v].nusers != 1 ||
        g->values[v].is_output)
        return decline(why, whylen,
                       "node '%s': operand prologue '%s' (%s) is not a reshape or last-two-axes Transpose the library can take",
                       kf_node_label(an), kf_node_label(n), n->op_type);
    op->value = src, op->t = tr, op->absorbed = pn;
    return KF_OK;
}

static int64_t prod(const int64_t *d, int n) {
    int64_t r = 1;
    for (int i = 0; i < n; i++) r *= d[i];
    return r;
}

/* Batch stride of an operand with batch dims bd[0..nb) (left-padded to the
 * output's ob[0..on)): its matrix size when its batch dims are the
 * output's, 0 when it has one matrix; else the broadcast is partial. */
static bool batch_stride(const int64_t *bd, int nb, const int64_t *ob, int on, int64_t mat, int64_t *stride) {
    int64_t cnt = prod(bd, nb);
    if (cnt == 1) {
        *stride = 0;
        return true;
    }
    for (int i = 0; i < on; i++) {
        int j = i - (on - nb);
        int64_t d = j >= 0 ? bd[j] : 1;
        if (d != ob[i]) return false;
    }
    *stride = mat;
    return true;
}

/* A value usable as a bias of a row-major [.., N] output: [N] or [1, .., 1, N]. */
static bool bias_shape(const kf_type *t, int64_t N) {
    if (t->rank < 1 || t->dims[t->rank - 1] != N) return false;
    for (int d = 0; d < t->rank - 1; d++)
        if (t->dims[d] != 1) return false;
    return true;
}

/* Fills the GEMM part for MatMul/Gemm node an. */
static kf_status map_gemm(const kf_graph *g, const kf_plan *p, uint32_t gi, const kf_node *an, kf_la_gemm *G,
                          kf_id absorbed[2], char *why, size_t whylen) {
    const char *lab = kf_node_label(an);
    bool gemm = an->op == KF_OP_GEMM;
    operand x, w;
    KF_TRY(resolve(g, p, gi, an, an->in[0], &x, why, whylen));
    KF_TRY(resolve(g, p, gi, an, an->in[1], &w, why, whylen));
    absorbed[0] = x.absorbed, absorbed[1] = w.absorbed;
    if (gemm) {
        x.t ^= kf_attr_i(an, "transA", 0) != 0;
        w.t ^= kf_attr_i(an, "transB", 0) != 0;
    }
    const kf_type *xt = &g->values[an->in[0]].type, *wt = &g->values[an->in[1]].type;
    const kf_type *yt = &g->values[an->out[0]].type;
    kf_dtype dt = yt->dtype;
    KF_TRY(library_dtype(an, xt, wt, yt, false, why, whylen));
    if (xt->rank < 2 || wt->rank < 2)
        return decline(why, whylen, "node '%s': a 1-D operand (matrix-vector) is left to the generated kernel", lab);
    /* logical per-batch shapes after the prologue transposes: X M x K, W K x N */
    int64_t M = yt->dims[yt->rank - 2], N = yt->dims[yt->rank - 1];
    int64_t K = xt->dims[xt->rank - 1];
    if (gemm && kf_attr_i(an, "transA", 0)) K = xt->dims[0];
    memset(G, 0, sizeof *G);
    G->dtype = dt;
    G->alpha = gemm ? kf_attr_f(an, "alpha", 1.0f) : 1.0f;
    G->m = N, G->n = M, G->k = K;
    G->a = w.value, G->b = x.value, G->d = an->out[0];
    G->trans_a = w.t, G->trans_b = x.t;
    G->lda = w.t ? K : N;
    G->ldb = x.t ? M : K;
    G->ldd = N;
    G->batch = 1;
    if (!gemm) {
        int on = yt->rank - 2, xn = xt->rank - 2, wn = wt->rank - 2;
        const int64_t *xb = xt->dims, *wb = wt->dims;
        int64_t xcnt = prod(xb, xn), wcnt = prod(wb, wn), ocnt = prod(yt->dims, on);
        if (wcnt == 1 && !x.t && xcnt == ocnt) {
            /* one right matrix: the left's batches are rows of one GEMM */
            G->n = M * ocnt;
        } else {
            G->batch = ocnt;
            if (!batch_stride(xb, xn, yt->dims, on, M * K, &G->stride_b) ||
                !batch_stride(wb, wn, yt->dims, on, K * N, &G->stride_a))
                return decline(why, whylen, "node '%s': batch dims broadcast partially (not one strided batch)", lab);
            G->stride_d = M * N;
        }
    } else if (an->nin > 2 && an->in[2]) {
        const kf_value *cv = &g->values[an->in[2]];
        float beta = kf_attr_f(an, "beta", 1.0f);
        if (in_group(p, gi, g, an->in[2]))
            return decline(why, whylen, "node '%s': Gemm's C is computed in the group (a prologue)", lab);
        if (cv->type.dtype != dt)
            return decline(why, whylen, "node '%s': C is %s", lab, kf_dtype_name(cv->type.dtype));
        if (beta == 1.0f && bias_shape(&cv->type, N)) {
            G->bias = an->in[2];
        } else if (beta != 0.0f && cv->type.rank == 2 && cv->type.dims[0] == M && cv->type.dims[1] == N) {
            G->c = an->in[2], G->beta = beta, G->ldc = N;
        } else if (beta != 0.0f) {
            return decline(why, whylen,
                           "node '%s': C '%s' is neither a [N] bias with beta 1 nor a full [M, N] matrix", lab,
                           cv->name);
        }
    }
    return KF_OK;
}

/* The float8 GEMM of kf_la_gemm for a float8 product (kf_fp8_product)
 * whose two DequantizeLinears are in group gi and read values from
 * outside it: A the float8 weights (stored transposed unless a Gemm's
 * transB has them [N, K] already: cuBLASLt's float8 form is "TN"), B the
 * float8 activation rows, alpha the product of the two scales, D float16,
 * bfloat16 or float32 (kf_fuse_fp8's unit-scale sums, scaled per column
 * by the epilogue kernel). The DequantizeLinears are absorbed.
 * KF_ERR_UNSUPPORTED when an is not one. */
static kf_status map_fp8(const kf_model *m, const kf_plan *p, uint32_t gi, const kf_node *an, kf_la_gemm *G,
                         kf_id absorbed[2], char *why, size_t whylen) {
    const kf_graph *g = m->graph;
    const char *lab = kf_node_label(an);
    kf_dtype fmt[2];
    if (!kf_fp8_product(m, an, fmt)) return decline(why, whylen, "node '%s': not a float8 product", lab);
    const kf_node *dq[2];
    for (int i = 0; i < 2; i++) {
        kf_id d = g->values[an->in[i]].producer;
        dq[i] = &g->nodes[d];
        if (p->group_of[d] != gi || in_group(p, gi, g, dq[i]->in[0]))
            return decline(why, whylen, "node '%s': float8 operand '%s' is not dequantized in the group from outside it",
                           lab, kf_node_label(dq[i]));
        absorbed[i] = d;
    }
    const kf_type *xt = &g->values[dq[0]->in[0]].type, *wt = &g->values[dq[1]->in[0]].type;
    const kf_type *yt = &g->values[an->out[0]].type;
    if (yt->dtype != KF_DT_FLOAT16 && yt->dtype != KF_DT_BFLOAT16 && yt->dtype != KF_DT_FLOAT)
        return decline(why, whylen, "node '%s': a float8 product writing %s (the library writes float16, bfloat16 or float32)",
                       lab, kf_dtype_name(yt->dtype));
    bool tb = an->op == KF_OP_GEMM && kf_attr_i(an, "transB", 0);
    int64_t K = wt->dims[tb ? 1 : 0], N = wt->dims[tb ? 0 : 1], rows = 1;
    for (int d = 0; d < xt->rank - 1; d++) rows *= xt->dims[d];
    memset(G, 0, sizeof *G);
    G->dtype = yt->dtype;
    G->a_dtype = fmt[1], G->b_dtype = fmt[0];
    const kf_tensor *sx = g->values[dq[0]->in[1]].init, *sw = g->values[dq[1]->in[1]].init;
    G->alpha = (float)(kf_get_f64(sx, 0) * kf_get_f64(sw, 0));
    G->m = N, G->n = rows, G->k = K;
    G->a = dq[1]->in[0], G->b = dq[0]->in[0], G->d = an->out[0];
    G->trans_a = true, G->a_const_t = !tb;
    G->lda = K, G->ldb = K, G->ldd = N;
    G->batch = 1;
    if (an->op == KF_OP_GEMM && an->nin > 2 && an->in[2]) {
        const kf_type *ct = &g->values[an->in[2]].type;
        if (in_group(p, gi, g, an->in[2]) || ct->dtype != G->dtype || G->dtype == KF_DT_FLOAT || !bias_shape(ct, N))
            return decline(why, whylen, "node '%s': Gemm's C is not a [N] bias of the output's 16-bit type", lab);
        G->bias = an->in[2];
    }
    return KF_OK;
}

/* Fills the GEMM part for MatMulInteger node an: the int8 GEMM of
 * kf_la_gemm (int8 operands, no zero points, int32 out) with the constant
 * weights stored transposed for cuBLASLt's "TN" form. */
static kf_status map_igemm(const kf_model *m, const kf_plan *p, uint32_t gi, const kf_node *an, kf_la_gemm *G,
                           char *why, size_t whylen) {
    const kf_graph *g = m->graph;
    const char *lab = kf_node_label(an);
    if (kf_node_onnx_nin(an) != 2)
        return decline(why, whylen,
                       "node '%s': zero points in the integer product (an int8 plan moves them out when the "
                       "weights' is 0)", lab);
    kf_id x = an->in[0], w = an->in[1];
    if (in_group(p, gi, g, x) || in_group(p, gi, g, w))
        return decline(why, whylen, "node '%s': an operand is computed in the group (a prologue)", lab);
    const kf_type *xt = &g->values[x].type, *wt = &g->values[w].type;
    if (xt->dtype != KF_DT_INT8 || wt->dtype != KF_DT_INT8)
        return decline(why, whylen, "node '%s': %s x %s operands: cuBLASLt's integer GEMM takes int8 x int8", lab,
                       kf_dtype_name(xt->dtype), kf_dtype_name(wt->dtype));
    if (wt->rank != 2 || xt->rank < 2 || !kf_value_is_constant(m, w) || g->values[w].nusers != 1)
        return decline(why, whylen,
                       "node '%s': the weights '%s' are not a constant matrix read by this product alone (the "
                       "library reads them transposed)", lab, g->values[w].name);
    int64_t K = wt->dims[0], N = wt->dims[1], rows = 1;
    for (int d = 0; d < xt->rank - 1; d++) rows *= xt->dims[d];
    if (K % 4 || N % 4)
        return decline(why, whylen, "node '%s': K %lld and N %lld must be multiples of 4 (cuBLASLt's int8 layout)",
                       lab, (long long)K, (long long)N);
    memset(G, 0, sizeof *G);
    G->dtype = KF_DT_INT8;
    G->alpha = 1.0f;
    G->m = N, G->n = rows, G->k = K;
    G->a = w, G->b = x, G->d = an->out[0];
    G->trans_a = true, G->a_const_t = true;
    G->lda = K, G->ldb = K, G->ldd = N;
    G->batch = 1;
    return KF_OK;
}

/* A per-channel bias of a conv output of rank r with k channels: [k, 1, ..]
 * (rank r-1) or [1, k, 1, ..] (rank r). */
static bool channel_bias_shape(const kf_type *t, int r, int64_t k) {
    int off = t->rank == r ? 1 : t->rank == r - 1 ? 0 : -1;
    if (off < 0 || (off == 1 && t->dims[0] != 1) || t->dims[off] != k) return false;
    for (int d = off + 1; d < t->rank; d++)
        if (t->dims[d] != 1) return false;
    return true;
}

/* What the library's own epilogue can take after the anchor. */
typedef struct libout {
    bool conv;      /* per-channel bias, ReLU only, no reshapes */
    int64_t width;  /* GEMM: N (bias along rows); conv: output channels */
    int rank;       /* conv: the output's rank */
    kf_dtype dtype;
    bool no_bias;   /* no bias Add on top: a GEMM with a C matrix, or a float8 one writing
                     * float32 (whose bias the library reads as bfloat16) */
    kf_id *d, *bias;
    kf_id *z;       /* conv: the residual it adds before act (NULL: none taken) */
    kf_la_act *act;
} libout;

/* Takes a bias Add and an activation after the anchor into the call while
 * each intermediate has no other reader; for a conv, after its bias, also
 * an Add of a residual of the output's shape and dtype (cuDNN's z, before
 * the activation); for a GEMM, pure reshapes that keep the last dim (N, so
 * the bias still runs along rows) pass through, since the call writes the
 * same bytes. Returns the nodes taken (<= LA_MAX_TAKEN). */
static int take_epilogue(const kf_graph *g, const kf_plan *p, uint32_t gi, const kf_group *gr, libout *L,
                         kf_id taken[LA_MAX_TAKEN]) {
    int nt = 0;
    kf_id v = *L->d;
    while (nt < LA_MAX_TAKEN) {
        const kf_value *vv = &g->values[v];
        if (vv->nusers != 1 || vv->is_output || is_group_output(gr, v)) break;
        kf_id un = vv->users[0];
        if (p->group_of[un] != gi) break;
        const kf_node *u = &g->nodes[un];
        const kf_type *ut = u->nout ? &g->values[u->out[0]].type : NULL;
        if (u->op == KF_OP_ADD && !*L->bias && !L->no_bias && *L->act == KF_LA_ACT_NONE && u->nin == 2) {
            kf_id o = u->in[0] == v ? u->in[1] : u->in[0];
            if (u->in[0] == u->in[1] || in_group(p, gi, g, o)) break;
            const kf_type *ot = &g->values[o].type;
            bool shape_ok = L->conv ? channel_bias_shape(ot, L->rank, L->width) : bias_shape(ot, L->width);
            if (ot->dtype != L->dtype || !shape_ok || !kf_type_same_shape(ut, &g->values[v].type)) break;
            *L->bias = o;
        } else if (u->op == KF_OP_ADD && L->z && !*L->z && *L->bias && *L->act == KF_LA_ACT_NONE && u->nin == 2) {
            kf_id o = u->in[0] == v ? u->in[1] : u->in[0];
            if (u->in[0] == u->in[1] || in_group(p, gi, g, o)) break;
            const kf_type *ot = &g->values[o].type;
            if (ot->dtype != L->dtype || !kf_type_same_shape(ot, &g->values[v].type) ||
                !kf_type_same_shape(ut, &g->values[v].type))
                break;
            *L->z = o;
        } else if (!L->conv && kf_plan_is_reshape(u) && u->nout == 1 && ut->rank > 0 && ut->dims[ut->rank - 1] == L->width) {
            /* the same bytes under another shape */
        } else if (u->op == KF_OP_RELU && *L->act == KF_LA_ACT_NONE && (!L->conv || *L->bias)) {
            /* cuDNN's fused op applies ReLU only together with a bias */
            *L->act = KF_LA_ACT_RELU;
        } else if (!L->conv && u->op == KF_OP_GELU && *L->act == KF_LA_ACT_NONE &&
                   !strcmp(kf_attr_s(u, "approximate", "none"), "tanh")) {
            *L->act = KF_LA_ACT_GELU_TANH;
        } else {
            break;
        }
        taken[nt++] = un;
        v = u->out[0];
        *L->d = v;
    }
    return nt;
}

/* Fills the conv part for Conv node an (operands read from outside the group). */
static kf_status map_conv(const kf_graph *g, const kf_plan *p, uint32_t gi, const kf_node *an, kf_la_conv *C,
                          char *why, size_t whylen) {
    const char *lab = kf_node_label(an);
    memset(C, 0, sizeof *C);
    for (int i = 0; i < an->nin; i++)
        if (an->in[i] && in_group(p, gi, g, an->in[i]))
            return decline(why, whylen, "node '%s': operand prologue '%s' would need its own kernel", lab,
                           kf_node_label(&g->nodes[g->values[an->in[i]].producer]));
    const kf_type *xt = &g->values[an->in[0]].type, *wt = &g->values[an->in[1]].type;
    const kf_type *yt = &g->values[an->out[0]].type;
    kf_dtype dt = yt->dtype;
    KF_TRY(library_dtype(an, xt, wt, yt, true, why, whylen));
    int ns = xt->rank - 2;
    if (ns < 1 || ns > KF_LA_MAX_SPATIAL || wt->rank != xt->rank || yt->rank != xt->rank)
        return decline(why, whylen, "node '%s': %d spatial dims (the library path takes 1 to %d)", lab, ns,
                       KF_LA_MAX_SPATIAL);
    const char *ap = kf_attr_s(an, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
        return decline(why, whylen, "node '%s': auto_pad %s (explicit symmetric pads only)", lab, ap);
    int np = 0, nst = 0, ndl = 0;
    const int64_t *pads = kf_attr_ints(an, "pads", &np), *st = kf_attr_ints(an, "strides", &nst),
                  *dl = kf_attr_ints(an, "dilations", &ndl);
    if ((pads && np != 2 * ns) || (st && nst != ns) || (dl && ndl != ns))
        return decline(why, whylen, "node '%s': pads/strides/dilations do not match %d spatial dims", lab, ns);
    C->nspatial = ns;
    C->n = xt->dims[0], C->c = xt->dims[1], C->k = wt->dims[0];
    C->groups = kf_attr_i(an, "group", 1);
    if (C->groups < 1 || C->c % C->groups || C->k % C->groups || wt->dims[1] != C->c / C->groups)
        return decline(why, whylen, "node '%s': group %lld does not divide the channels", lab, (long long)C->groups);
    for (int d = 0; d < ns; d++) {
        C->in[d] = xt->dims[2 + d], C->kern[d] = wt->dims[2 + d], C->out[d] = yt->dims[2 + d];
        C->pad[d] = pads && strcmp(ap, "VALID") ? pads[d] : 0;
        if (pads && strcmp(ap, "VALID") && pads[d] != pads[ns + d])
            return decline(why, whylen, "node '%s': asymmetric pads (cuDNN pads both sides alike)", lab);
        C->stride[d] = st ? st[d] : 1;
        C->dilation[d] = dl ? dl[d] : 1;
        int64_t want = (C->in[d] + 2 * C->pad[d] - C->dilation[d] * (C->kern[d] - 1) - 1) / C->stride[d] + 1;
        if (want != C->out[d])
            return decline(why, whylen, "node '%s': output dim %d is %lld, the conv gives %lld", lab, d,
                           (long long)C->out[d], (long long)want);
    }
    C->dtype = dt;
    C->x = an->in[0], C->w = an->in[1], C->d = an->out[0];
    if (an->nin > 2 && an->in[2]) {
        const kf_type *bt = &g->values[an->in[2]].type;
        if (bt->dtype != dt || bt->rank != 1 || bt->dims[0] != C->k)
            return decline(why, whylen, "node '%s': bias is not a [%lld] %s vector", lab, (long long)C->k,
                           kf_dtype_name(dt));
        C->bias = an->in[2];
    }
    return KF_OK;
}

void kf_la_anchor_release(kf_la_anchor *a) {
    if (!a) return;
    kf_cg_kernel_release(&a->epilogue);
    memset(a, 0, sizeof *a);
}

/* Generates the group minus the library's nodes as one kernel: a view of
 * plan p with one more group holding the remaining nodes, so codegen sees
 * the library output as a value read from outside. */
static kf_status gen_epilogue(const kf_model *m, const kf_plan *p, uint32_t gi, const kf_id *rest, uint32_t nrest,
                              kf_la_anchor *out, char *why, size_t whylen) {
    const kf_graph *g = m->graph;
    const kf_group *gr = &p->groups[gi];
    kf_plan v = *p;
    kf_group eg;
    memset(&eg, 0, sizeof eg);
    kf_id ins[KF_PLAN_MAX_INPUTS + 1], outs[KF_PLAN_MAX_OUTPUTS];
    uint32_t nin = 0, nout = 0;
    v.group_of = kf_calloc((size_t)g->nnodes + 1, sizeof *v.group_of);
    v.groups = kf_calloc((size_t)p->ngroups + 1, sizeof *v.groups);
    if (!v.group_of || !v.groups) {
        kf_free(v.group_of), kf_free(v.groups);
        return KF_ERR_NOMEM;
    }
    memcpy(v.group_of, p->group_of, (size_t)g->nnodes * sizeof *v.group_of); /* nodes [0, nnodes) */
    memcpy(v.groups, p->groups, (size_t)p->ngroups * sizeof *v.groups);
    uint32_t eg_i = p->ngroups;
    for (uint32_t j = 0; j < nrest; j++) v.group_of[rest[j]] = eg_i;
    kf_status st = KF_OK;
    for (uint32_t j = 0; j < nrest && !st; j++) {
        const kf_node *n = &g->nodes[rest[j]];
        for (int i = 0; i < n->nin && !st; i++) {
            kf_id x = n->in[i];
            if (!x || (g->values[x].producer && v.group_of[g->values[x].producer] == eg_i)) continue;
            uint32_t k = 0;
            while (k < nin && ins[k] != x) k++;
            if (k < nin) continue;
            if (nin == KF_PLAN_MAX_INPUTS)
                st = decline(why, whylen, "the epilogue after the library call would read more than %d values",
                             KF_PLAN_MAX_INPUTS);
            else
                ins[nin++] = x;
        }
        for (int o = 0; o < n->nout && !st; o++)
            if (n->out[o] && is_group_output(gr, n->out[o])) outs[nout++] = n->out[o];
    }
    if (!st && !nout)
        st = decline(why, whylen, "the epilogue after the library call writes no group output");
    if (!st) {
        eg.kind = gr->reduction ? KF_GROUP_REDUCTION : KF_GROUP_ELEMWISE;
        eg.nodes = (kf_id *)rest, eg.nnodes = nrest;
        eg.inputs = ins, eg.ninputs = nin;
        eg.outputs = outs, eg.noutputs = nout;
        eg.anchor = gr->reduction;
        eg.launch = gr->launch;
        eg.bytes_read = eg.bytes_written = eg.flops = -1;
        v.groups[eg_i] = eg;
        v.ngroups = p->ngroups + 1;
        char cwhy[512]; /* a codegen reason names one node or value */
        if (kf_cg_unsupported(m, &v, eg_i, cwhy, sizeof cwhy))
            st = !strcmp(cwhy, "out of memory generating the kernel")
                     ? KF_ERR_NOMEM
                     : decline(why, whylen, "epilogue kernel after the library call: %s", cwhy);
        else if (kf_cg_group(m, &v, eg_i, &out->epilogue) != KF_OK)
            st = KF_ERR_NOMEM; /* the question above said it generates */
        else
            out->has_epilogue = true;
    }
    kf_free(v.group_of);
    kf_free(v.groups);
    return st;
}

kf_status kf_la_plan_group(const kf_model *m, const kf_plan *p, uint32_t gi, kf_la_anchor *out, char *why,
                           size_t whylen) {
    memset(out, 0, sizeof *out);
    if (gi >= p->ngroups) return decline(why, whylen, "no group %u", gi);
    const kf_graph *g = m->graph;
    const kf_group *gr = &p->groups[gi];
    if (gr->kind != KF_GROUP_ANCHOR || !gr->anchor) return decline(why, whylen, "not an anchor group");
    const kf_node *an = &g->nodes[gr->anchor];
    const char *lab = kf_node_label(an);
    if (an->op != KF_OP_MATMUL && an->op != KF_OP_GEMM && an->op != KF_OP_CONV && an->op != KF_OP_MATMUL_INTEGER)
        return decline(why, whylen,
                       "node '%s': %s has no library mapping (cuBLASLt takes MatMul/Gemm/MatMulInteger, cuDNN Conv)",
                       lab, an->op_type);
    if (gr->anchor2)
        return decline(why, whylen, "node '%s': back-to-back anchors stay one generated kernel (on-chip rows)", lab);
    if (gr->nnodes > LA_MAX_NODES) return decline(why, whylen, "node '%s': group of %u nodes", lab, gr->nnodes);
    for (uint32_t j = 0; j < gr->nnodes; j++) {
        const kf_node *n = &g->nodes[gr->nodes[j]];
        for (int o = 0; o < n->nout; o++)
            if (n->out[o] && !kf_type_is_static(&g->values[n->out[o]].type))
                return decline(why, whylen, "value '%s' has a symbolic or unknown shape", g->values[n->out[o]].name);
    }
    for (int i = 0; i < an->nin; i++)
        if (an->in[i] && !kf_type_is_static(&g->values[an->in[i]].type))
            return decline(why, whylen, "value '%s' has a symbolic or unknown shape", g->values[an->in[i]].name);
    kf_id absorbed[2] = {0, 0}, taken[LA_MAX_TAKEN] = {0};
    libout L = {0};
    kf_id *lib_d;
    if (an->op == KF_OP_CONV) {
        kf_la_conv *C = &out->conv;
        out->is_conv = true;
        KF_TRY(map_conv(g, p, gi, an, C, why, whylen));
        L = (libout){true, C->k, 2 + C->nspatial, C->dtype, false, &C->d, &C->bias, &C->z, &C->act};
        lib_d = &C->d;
    } else if (an->op == KF_OP_MATMUL_INTEGER) {
        KF_TRY(map_igemm(m, p, gi, an, &out->gemm, why, whylen));
        lib_d = &out->gemm.d;
    } else if (kf_fp8_product(m, an, NULL)) {
        kf_la_gemm *G = &out->gemm;
        KF_TRY(map_fp8(m, p, gi, an, G, absorbed, why, whylen));
        L = (libout){false, G->m, 0, G->dtype, G->dtype == KF_DT_FLOAT, &G->d, &G->bias, NULL, &G->act};
        lib_d = &G->d;
    } else {
        kf_la_gemm *G = &out->gemm;
        KF_TRY(map_gemm(g, p, gi, an, G, absorbed, why, whylen));
        L = (libout){false, G->m, 0, G->dtype, G->c != 0, &G->d, &G->bias, NULL, &G->act};
        lib_d = &G->d;
    }
    /* the integer GEMM takes nothing after it: the int32 sums go to the
     * epilogue kernel (zero-point columns, scales, requantization) */
    int nt = an->op == KF_OP_MATMUL_INTEGER ? 0 : take_epilogue(g, p, gi, gr, &L, taken);
    /* the rest: every group node but the anchor, absorbed transposes and
     * the taken bias/activation. Each must read (transitively) the
     * library's output; a node that does not is an operand prologue the
     * library cannot apply. */
    kf_id rest[LA_MAX_NODES];
    uint32_t nrest = 0;
    out->lib_nodes = 1 + (uint32_t)nt + (absorbed[0] != 0) + (absorbed[1] != 0);
    for (uint32_t j = 0; j < gr->nnodes; j++) {
        kf_id n = gr->nodes[j];
        bool lib = n == gr->anchor || n == absorbed[0] || n == absorbed[1];
        for (int q = 0; q < nt; q++) lib |= n == taken[q];
        if (lib) continue;
        const kf_node *nn = &g->nodes[n];
        bool after = false;
        for (int i = 0; !after && i < nn->nin; i++) {
            kf_id x = nn->in[i], pn = x ? g->values[x].producer : 0;
            if (!pn || p->group_of[pn] != gi) continue;
            after = pn == gr->anchor;
            for (int q = 0; q < nt; q++) after |= pn == taken[q];
            for (uint32_t r = 0; !after && r < nrest; r++) after = rest[r] == pn;
        }
        if (!after)
            return decline(why, whylen, "node '%s': operand prologue '%s' (%s) would need its own kernel", lab,
                           kf_node_label(nn), nn->op_type);
        rest[nrest++] = n;
    }
    if (!nrest) {
        if (gr->noutputs != 1 || gr->outputs[0] != *lib_d)
            return decline(why, whylen, "node '%s': the library output is not the group's output", lab);
        return KF_OK;
    }
    kf_status st = gen_epilogue(m, p, gi, rest, nrest, out, why, whylen);
    if (st) kf_la_anchor_release(out);
    return st;
}

/* ---- the math a call may use -------------------------------------------- */

kf_la_math kf_la_math_for(kf_precision p, kf_dtype dt) {
    kf_la_math r;
    /* tensor cores round float32 operands to TF32; 16-bit operands lose
     * nothing there (their products are exact in the float32 accumulator) */
    bool fast = p != KF_PRECISION_FP32 || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16;
    r.cudnn_math = fast ? KF_CUDNN_TENSOR_OP_MATH : KF_CUDNN_FMA_MATH;
    r.cudnn_algo_math = 1u << KF_CUDNN_FMA_MATH;
    if (fast) r.cudnn_algo_math |= 1u << KF_CUDNN_DEFAULT_MATH | 1u << KF_CUDNN_TENSOR_OP_MATH;
    /* FAST_TF32 only on float32 data: a 16-bit GEMM computes in 32F */
    r.cublas_compute = p == KF_PRECISION_TF32 && dt == KF_DT_FLOAT ? KF_CUBLAS_COMPUTE_32F_FAST_TF32 : KF_CUBLAS_COMPUTE_32F;
    r.cublas_scale = KF_CUDA_R_32F;
    r.cudnn_data = dt == KF_DT_FLOAT16    ? KF_CUDNN_DATA_HALF
                   : dt == KF_DT_BFLOAT16 ? KF_CUDNN_DATA_BFLOAT16
                                          : KF_CUDNN_DATA_FLOAT;
    r.cuda_data = dt == KF_DT_FLOAT16 ? KF_CUDA_R_16F : dt == KF_DT_BFLOAT16 ? KF_CUDA_R_16BF : KF_CUDA_R_32F;
    r.cuda_data_d = r.cuda_data;
    if (dt == KF_DT_INT8) { /* exact at every precision */
        r.cublas_compute = KF_CUBLAS_COMPUTE_32I;
        r.cublas_scale = r.cuda_data_d = KF_CUDA_R_32I;
        r.cuda_data = KF_CUDA_R_8I;
    }
    return r;
}

/* ---- the host model of the call ----------------------------------------- */

static double rd(const kf_tensor *t, int64_t i) {
    if (kf_dtype_is_small_float(t->dtype)) return kf_small_to_f64(t->dtype, ((const uint8_t *)t->data)[i]);
    if (t->dtype == KF_DT_FLOAT16) return kf_half_to_float(((const uint16_t *)t->data)[i]);
    if (t->dtype == KF_DT_BFLOAT16) return kf_bf16_to_float(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

/* Stores y as element i of t, rounded like the library's output. */
static void wr(kf_tensor *t, int64_t i, float y) {
    if (t->dtype == KF_DT_FLOAT16) ((uint16_t *)t->data)[i] = kf_float_to_half(y);
    else if (t->dtype == KF_DT_BFLOAT16) ((uint16_t *)t->data)[i] = kf_float_to_bf16(y);
    else ((float *)t->data)[i] = y;
}

static bool fits(const kf_tensor *t, kf_dtype dt, int64_t last) {
    return t && t->dtype == dt && t->numel > last;
}

/* The dtype of D (and C) of g. */
static kf_dtype d_dtype(const kf_la_gemm *g) { return g->dtype == KF_DT_INT8 ? KF_DT_INT32 : g->dtype; }
/* The dtypes of A and B of g. */
static kf_dtype a_dtype(const kf_la_gemm *g) { return g->a_dtype ? g->a_dtype : g->dtype; }
static kf_dtype b_dtype(const kf_la_gemm *g) { return g->b_dtype ? g->b_dtype : g->dtype; }

kf_status kf_la_const_layout(const kf_la_gemm *g, const kf_tensor *w, kf_tensor *out) {
    if (!g->a_const_t) return kf_tensor_copy(out, w);
    if (w->rank != 2 || w->dims[0] != g->k || w->dims[1] != g->m || w->dtype != a_dtype(g))
        return kf_fail(KF_ERR_INVALID_ARG, "library GEMM: constant A is not a %lld x %lld %s matrix", (long long)g->k,
                       (long long)g->m, kf_dtype_name(a_dtype(g)));
    int64_t dims[2] = {g->m, g->k};
    KF_TRY(kf_tensor_alloc(out, w->dtype, 2, dims));
    size_t esz = kf_dtype_size(w->dtype);
    for (int64_t r = 0; r < g->k; r++)
        for (int64_t c = 0; c < g->m; c++)
            memcpy((char *)out->data + (size_t)(c * g->k + r) * esz, (const char *)w->data + (size_t)(r * g->m + c) * esz,
                   esz);
    return KF_OK;
}

/* The int8 GEMM of kf_la_gemm_host: exact int32 sums (no C, bias or
 * activation; a and b checked by the caller). */
static void igemm_host(const kf_la_gemm *g, const kf_tensor *a, const kf_tensor *b, kf_tensor *d) {
    const int8_t *A = a->data, *B = b->data;
    int32_t *D = d->data;
    for (int64_t bt = 0; bt < g->batch; bt++)
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t i = 0; i < g->m; i++) {
                int64_t acc = 0;
                for (int64_t l = 0; l < g->k; l++) {
                    int64_t ai = bt * g->stride_a + (g->trans_a ? i * g->lda + l : l * g->lda + i);
                    int64_t bi = bt * g->stride_b + (g->trans_b ? l * g->ldb + j : j * g->ldb + l);
                    acc += (int64_t)A[ai] * B[bi];
                }
                D[bt * g->stride_d + j * g->ldd + i] = (int32_t)(uint32_t)acc; /* int32 wraps */
            }
}

kf_status kf_la_gemm_host(const kf_la_gemm *g, const kf_tensor *a, const kf_tensor *b, const kf_tensor *c,
                          const kf_tensor *bias, kf_tensor *d) {
    int64_t bl = g->batch - 1;
    int64_t alast = bl * g->stride_a + (g->trans_a ? (g->m - 1) * g->lda + g->k - 1 : (g->k - 1) * g->lda + g->m - 1);
    int64_t blast = bl * g->stride_b + (g->trans_b ? (g->k - 1) * g->ldb + g->n - 1 : (g->n - 1) * g->ldb + g->k - 1);
    int64_t clast = bl * g->stride_c + (g->n - 1) * g->ldc + g->m - 1;
    int64_t dlast = bl * g->stride_d + (g->n - 1) * g->ldd + g->m - 1;
    if (!fits(a, a_dtype(g), alast) || !fits(b, b_dtype(g), blast) || !fits(d, d_dtype(g), dlast) ||
        (g->c && !fits(c, d_dtype(g), clast)) || (g->bias && !fits(bias, g->dtype, g->m - 1)) ||
        (g->dtype == KF_DT_INT8 && (g->c || g->bias || g->act)))
        return kf_fail(KF_ERR_INVALID_ARG, "library GEMM host model: a buffer is too small or of another dtype");
    if (g->dtype == KF_DT_INT8) {
        igemm_host(g, a, b, d);
        return KF_OK;
    }
    for (int64_t bt = 0; bt < g->batch; bt++)
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t i = 0; i < g->m; i++) {
                float acc = 0.0f; /* fp32 compute, as CUBLAS_COMPUTE_32F */
                for (int64_t l = 0; l < g->k; l++) {
                    int64_t ai = bt * g->stride_a + (g->trans_a ? i * g->lda + l : l * g->lda + i);
                    int64_t bi = bt * g->stride_b + (g->trans_b ? l * g->ldb + j : j * g->ldb + l);
                    acc += (float)rd(a, ai) * (float)rd(b, bi);
                }
                float y = g->alpha * acc; /* float8: the scales as alpha, as the call takes them */
                if (g->c) y += g->beta * (float)rd(c, bt * g->stride_c + j * g->ldc + i);
                if (g->bias) y += (float)rd(bias, i);
                if (g->act == KF_LA_ACT_RELU) y = y > 0.0f ? y : 0.0f;
                else if (g->act == KF_LA_ACT_GELU_TANH)
                    y = 0.5f * y * (1.0f + tanhf(0.7978845608028654f * (y + 0.044715f * y * y * y)));
                wr(d, bt * g->stride_d + j * g->ldd + i, y);
            }
    return KF_OK;
}

/* Elements of each operand the call touches (A, B, C, D), as
 * kf_la_gemm_host checks them. */
static void extents(const kf_la_gemm *g, int64_t n[4]) {
    int64_t bl = g->batch - 1;
    n[0] = bl * g->stride_a + (g->trans_a ? (g->m - 1) * g->lda + g->k : (g->k - 1) * g->lda + g->m);
    n[1] = bl * g->stride_b + (g->trans_b ? (g->k - 1) * g->ldb + g->n : (g->n - 1) * g->ldb + g->k);
    n[2] = g->c ? bl * g->stride_c + (g->n - 1) * g->ldc + g->m : 0;
    n[3] = bl * g->stride_d + (g->n - 1) * g->ldd + g->m;
}

kf_status kf_la_conv_host(const kf_la_conv *c, const kf_tensor *x, const kf_tensor *w, const kf_tensor *z,
                          const kf_tensor *bias, kf_tensor *d) {
    int ns = c->nspatial;
    int64_t osz = 1, isz = 1, ksz = 1, cg = c->c / c->groups, kg = c->k / c->groups;
    for (int i = 0; i < ns; i++) osz *= c->out[i], isz *= c->in[i], ksz *= c->kern[i];
    if (!fits(x, c->dtype, c->n * c->c * isz - 1) || !fits(w, c->dtype, c->k * cg * ksz - 1) ||
        !fits(d, c->dtype, c->n * c->k * osz - 1) || (c->bias && !fits(bias, c->dtype, c->k - 1)) ||
        (c->z && !fits(z, c->dtype, c->n * c->k * osz - 1)))
        return kf_fail(KF_ERR_INVALID_ARG, "library conv host model: a buffer is too small or of another dtype");
    for (int64_t n = 0; n < c->n; n++)
        for (int64_t k = 0; k < c->k; k++)
            for (int64_t o = 0; o < osz; o++) {
                int64_t op[KF_LA_MAX_SPATIAL], r = o;
                for (int i = ns - 1; i >= 0; i--) op[i] = r % c->out[i], r /= c->out[i];
                float acc = 0.0f; /* fp32 compute, as cuDNN's CUDNN_DATA_FLOAT compute type */
                int64_t cbase = (k / kg) * cg;
                for (int64_t ci = 0; ci < cg; ci++)
                    for (int64_t q = 0; q < ksz; q++) {
                        int64_t qp[KF_LA_MAX_SPATIAL], rq = q, xi = 0;
                        for (int i = ns - 1; i >= 0; i--) qp[i] = rq % c->kern[i], rq /= c->kern[i];
                        bool inside = true;
                        for (int i = 0; i < ns && inside; i++) {
                            int64_t pos = op[i] * c->stride[i] - c->pad[i] + qp[i] * c->dilation[i];
                            inside = pos >= 0 && pos < c->in[i];
                            xi = xi * c->in[i] + pos;
                        }
                        if (!inside) continue;
                        acc += (float)rd(x, (n * c->c + cbase + ci) * isz + xi) * (float)rd(w, (k * cg + ci) * ksz + q);
                    }
                int64_t at = (n * c->k + k) * osz + o;
                if (c->z) acc += (float)rd(z, at);
                if (c->bias) acc += (float)rd(bias, k);
                if (c->act == KF_LA_ACT_RELU) acc = acc > 0.0f ? acc : 0.0f;
                wr(d, at, acc);
            }
    return KF_OK;
}

void kf_la_anchor_values(const kf_la_anchor *a, kf_id v[5]) {
    if (a->is_conv) {
        v[0] = a->conv.x, v[1] = a->conv.w, v[2] = a->conv.z, v[3] = a->conv.bias, v[4] = a->conv.d;
    } else {
        v[0] = a->gemm.a, v[1] = a->gemm.b, v[2] = a->gemm.c, v[3] = a->gemm.bias, v[4] = a->gemm.d;
    }
}

kf_status kf_la_dev_host_lib(kf_dev *d, void *s, const kf_la_anchor *a, void *const bufs[5]) {
    if (!a) return KF_OK;
    int64_t count[5] = {0};
    kf_dtype dt, ddt; /* A, B (and bias); C and D */
    if (a->is_conv) {
        const kf_la_conv *c = &a->conv;
        int64_t isz = 1, ksz = 1, osz = 1;
        for (int i = 0; i < c->nspatial; i++) isz *= c->in[i], ksz *= c->kern[i], osz *= c->out[i];
        count[0] = c->n * c->c * isz, count[1] = c->k * (c->c / c->groups) * ksz;
        count[2] = c->z ? c->n * c->k * osz : 0, count[3] = c->bias ? c->k : 0, count[4] = c->n * c->k * osz;
        dt = ddt = c->dtype;
    } else {
        int64_t n[4];
        extents(&a->gemm, n);
        count[0] = n[0], count[1] = n[1], count[2] = n[2], count[3] = a->gemm.bias ? a->gemm.m : 0, count[4] = n[3];
        dt = a->gemm.dtype, ddt = d_dtype(&a->gemm);
    }
    kf_dtype ab[2] = {a->is_conv ? dt : a_dtype(&a->gemm), a->is_conv ? dt : b_dtype(&a->gemm)};
    kf_tensor t[5];
    memset(t, 0, sizeof t);
    kf_status st = KF_OK;
    for (int i = 0; i < 5 && !st; i++) {
        if (!count[i]) continue;
        kf_dtype ti = i == 2 || i == 4 ? ddt : i < 2 ? ab[i] : dt;
        st = kf_tensor_alloc(&t[i], ti, 1, &count[i]);
        if (!st && i < 4) st = d->download(d, s, bufs[i], t[i].data, (size_t)count[i] * kf_dtype_size(ti));
    }
    if (!st && a->is_conv)
        st = kf_la_conv_host(&a->conv, &t[0], &t[1], count[2] ? &t[2] : NULL, count[3] ? &t[3] : NULL, &t[4]);
    else if (!st) st = kf_la_gemm_host(&a->gemm, &t[0], &t[1], count[2] ? &t[2] : NULL, count[3] ? &t[3] : NULL, &t[4]);
    if (!st) st = d->upload(d, s, bufs[4], t[4].data, (size_t)count[4] * kf_dtype_size(ddt));
    if (!st) st = d->sync(d, s); /* t[4] is freed next */
    for (int i = 0; i < 5; i++) kf_tensor_release(&t[i]);
    return st;
}
