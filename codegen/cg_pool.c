/*
 * cg_pool.c: the window kernel of an opaque group whose one node is a
 * MaxPool, AveragePool or LpPool: one work-item per output element,
 * grid-stride, walking the reference's window geometry (kf_nn_geom_*:
 * pads, auto_pad, strides, dilations, ceil_mode). Part of codegen.c's
 * translation unit, like cg_anchor.c (it drives the same static emitter, so
 * codegen.c includes it); compiled on its own it is empty.
 */
#ifdef KF_CG_ANCHOR_IMPL

/* ---- pooling ------------------------------------------------------------------
 *
 *   out[nb, ch, o0, o1, ...]  over the taps  s_d = o_d * stride_d - pad_d + k_d * dil_d
 *
 * Taps outside the input are skipped (bounds tested only on the sides that
 * have padding). MaxPool skips NaN as the reference does (a window of NaN
 * alone gives NaN, a window with no tap -inf); AveragePool divides by the
 * taps inside, or with count_include_pad by the taps inside the padded
 * input; LpPool is (sum |x|^p)^(1/p). Values combine in float (the
 * reference: double). */

/* Which window attributes the node's opset has (the reference's rule). */
static void pool_attr_flags(const kf_node *n, bool *use_dil, bool *use_ceil) {
    bool latest = n->opset == 0;
    if (n->op == KF_OP_MAXPOOL) *use_dil = *use_ceil = true;
    else if (n->op == KF_OP_AVERAGEPOOL) *use_ceil = true, *use_dil = latest || n->opset >= 19;
    else *use_dil = *use_ceil = latest || n->opset >= 18;
}

static bool is_attention(const kf_node *n) { return !strcmp(n->op_type, "Attention") && (!n->domain || !n->domain[0]); }

/* Opaque ops with a kernel: the pools here, and Attention (cg_attention.c). */
static bool opaque_has_kernel(const kf_node *n) {
    return n->op == KF_OP_MAXPOOL || n->op == KF_OP_AVERAGEPOOL || n->op == KF_OP_LPPOOL || is_attention(n);
}

static bool gen_pool(gen *st, kf_cg_str *s) {
    const kf_group *grp = st->grp;
    const kf_node *n = &st->g->nodes[grp->nodes[0]];
    if (grp->nnodes == 1 && is_attention(n)) return gen_attention_op(st, s, n);
    if (grp->nnodes != 1 || (n->op != KF_OP_MAXPOOL && n->op != KF_OP_AVERAGEPOOL && n->op != KF_OP_LPPOOL))
        return fail(st, "node '%s': opaque op %s is not generated (it runs on the reference evaluator)",
                    kf_node_label(n), n->op_type);
    if ((n->nout > 1 && n->out[1]) || st->k->nouts != 1 || st->k->outs[0].value != n->out[0])
        return fail(st, "node '%s': MaxPool's Indices output is used (not generated)", kf_node_label(n));
    if (!real_operand(st, n, 0)) return false;
    const kf_type *xt = &st->g->values[n->in[0]].type, *ot = &st->g->values[n->out[0]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(ot) || xt->rank < 3 || ot->rank != xt->rank)
        return fail(st, "node '%s': %s shapes are not static N-d", kf_node_label(n), n->op_type);
    int nsp = xt->rank - 2;
    bool use_dil, use_ceil;
    pool_attr_flags(n, &use_dil, &use_ceil);
    kf_nn_geom g;
    if (kf_nn_geom_parse(n, nsp, NULL, use_dil, use_ceil, &g) != KF_OK) {
        kf_clear_error();
        return fail(st, "node '%s': %s attributes are not valid", kf_node_label(n), n->op_type);
    }
    for (int d = 0; d < nsp; d++) g.in[d] = xt->dims[2 + d];
    if (kf_nn_geom_forward(n, &g) != KF_OK) {
        kf_clear_error();
        return fail(st, "node '%s': %s window geometry", kf_node_label(n), n->op_type);
    }
    for (int d = 0; d < nsp; d++)
        if (g.out[d] != ot->dims[2 + d])
            return fail(st, "node '%s': %s output dims disagree (internal)", kf_node_label(n), n->op_type);
    double p = 2.0;
    if (n->op == KF_OP_LPPOOL) {
        const kf_attr *a = kf_attr_find(n, "p");
        if (a) p = a->type == KF_ATTR_INT ? (double)a->i : a->type == KF_ATTR_FLOAT ? a->f : 0.0;
        if (!(p > 0) || !isfinite(p)) return fail(st, "node '%s': LpPool p is not a positive number", kf_node_label(n));
    }
    bool include_pad = n->op == KF_OP_AVERAGEPOOL && kf_attr_i(n, "count_include_pad", 0) == 1;
    int64_t total = numel_of(ot), outsz = 1;
    for (int d = 0; d < nsp; d++) outsz *= ot->dims[2 + d];
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup("kf_pool"))) return fail_oom(st);
    st->k->block = 0;
    st->k->numel = total;

    const char *I = st->ity;
    kf_cg_str body = {0};
    st->s = &body;
    const char *ind = "        ";
    int64_t stride = 1;
    for (int d = nsp - 1; d >= 0; d--) {
        kf_cg_printf(&body, "%sconst %s o%d = (w / %lld) %% %lld;\n", ind, I, d, (long long)stride, (long long)ot->dims[2 + d]);
        stride *= ot->dims[2 + d];
    }
    kf_cg_printf(&body, "%sconst %s pl = w / %lld;\n", ind, I, (long long)outsz);
    kf_cg_printf(&body, "%sconst %s nb = pl / %lld;\n", ind, I, (long long)xt->dims[1]);
    kf_cg_printf(&body, "%sconst %s ch = pl %% %lld;\n", ind, I, (long long)xt->dims[1]);
    bool mx = n->op == KF_OP_MAXPOOL;
    kf_cg_printf(&body, "%sfloat acc = %s;\n", ind, mx ? "-KF_INF" : "0.0f");
    bool avg = n->op == KF_OP_AVERAGEPOOL;
    if (avg) kf_cg_printf(&body, "%sint cnt = 0;\n", ind);
    if (mx) kf_cg_printf(&body, "%sfloat last = -KF_INF;\n%sint nonnan = 0;\n", ind, ind);
    kf_cg_str cond = {0}, pcond = {0};
    const char *in = ind;
    for (int d = 0; d < nsp; d++) {
        int64_t x = xt->dims[2 + d];
        kf_cg_printf(&body, "%sfor (%s k%d = 0; k%d < %lld; k%d++) {\n", in, I, d, d, (long long)g.kernel[d], d);
        in = deeper(in);
        kf_cg_printf(&body, "%sconst %s s%d = o%d * %lld - %lld + k%d * %lld;\n", in, I, d, d, (long long)g.stride[d],
                     (long long)g.pb[d], d, (long long)g.dil[d]);
        bool pad_lo = g.pb[d] > 0, pad_hi = (ot->dims[2 + d] - 1) * g.stride[d] - g.pb[d] + (g.kernel[d] - 1) * g.dil[d] >= x;
        if (pad_lo) kf_cg_printf(&cond, "%ss%d >= 0", cond.len ? " && " : "", d);
        if (pad_hi) kf_cg_printf(&cond, "%ss%d < %lld", cond.len ? " && " : "", d, (long long)x);
        /* ceil_mode may put a tap past the end padding: it counts for no divisor */
        if (include_pad && pad_hi)
            kf_cg_printf(&pcond, "%ss%d < %lld", pcond.len ? " && " : "", d, (long long)(x + g.pe[d]));
    }
    if (include_pad && pcond.len) kf_cg_printf(&body, "%sif (%s) cnt++;\n", in, pcond.p);
    else if (include_pad) kf_cg_printf(&body, "%scnt++;\n", in);
    const char *tap = in;
    if (cond.len) {
        kf_cg_printf(&body, "%sif (%s) {\n", in, cond.p);
        tap = deeper(in);
    }
    ix xi = {.rank = xt->rank};
    snprintf(xi.c[0], NAMELEN, "%s", xt->dims[0] == 1 ? "0" : "nb");
    snprintf(xi.c[1], NAMELEN, "%s", xt->dims[1] == 1 ? "0" : "ch");
    for (int d = 0; d < nsp; d++) snprintf(xi.c[2 + d], NAMELEN, "s%d", d);
    uint32_t mark = st->nmemo;
    st->ind = tap;
    char x[NAMELEN];
    bool ok = !cond.oom && !pcond.oom && emit(st, n->in[0], &xi, x);
    st->nmemo = mark;
    if (ok) {
        if (mx) kf_cg_printf(&body, "%sacc = KF_FMAX(acc, %s);\n%slast = %s;\n%snonnan |= %s == %s;\n", tap, x, tap, x, tap, x, x);
        else if (avg) {
            if (!include_pad) kf_cg_printf(&body, "%scnt++;\n", tap);
            kf_cg_printf(&body, "%sacc += %s;\n", tap, x);
        }
        else if (p == 1.0) kf_cg_printf(&body, "%sacc += KF_FABS(%s);\n", tap, x);
        else if (p == 2.0) kf_cg_printf(&body, "%sacc += %s * %s;\n", tap, x, x);
        else {
            kf_cg_printf(&body, "%sacc += KF_POW(KF_FABS(%s), ", tap, x);
            put_float(&body, p);
            kf_cg_puts(&body, ");\n");
        }
    }
    if (cond.len) kf_cg_printf(&body, "%s}\n", in);
    for (int d = nsp - 1; d >= 0; d--) {
        size_t wd = strlen(ind) + 4 * (size_t)d;
        kf_cg_printf(&body, "%.*s}\n", (int)wd, "                                                            ");
    }
    kf_cg_str_release(&cond);
    kf_cg_str_release(&pcond);
    kf_cg_str rhs = {0};
    if (mx) kf_cg_puts(&rhs, "nonnan ? acc : last");
    else if (avg) kf_cg_puts(&rhs, "acc / (float)cnt");
    else if (p == 1.0) kf_cg_puts(&rhs, "acc");
    else if (p == 2.0) kf_cg_puts(&rhs, "KF_SQRT(acc)");
    else {
        kf_cg_puts(&rhs, "KF_POW(acc, ");
        put_float(&rhs, 1.0 / p);
        kf_cg_puts(&rhs, ")");
    }
    st->ind = ind;
    if (ok && rhs.oom) ok = fail_oom(st);
    if (ok) {
        ix oi = {.rank = ot->rank};
        snprintf(oi.c[0], NAMELEN, "%s", ot->dims[0] == 1 ? "0" : "nb");
        snprintf(oi.c[1], NAMELEN, "%s", ot->dims[1] == 1 ? "0" : "ch");
        for (int d = 0; d < nsp; d++) snprintf(oi.c[2 + d], NAMELEN, "%s", ot->dims[2 + d] == 1 ? "0" : "");
        for (int d = 0; d < nsp; d++)
            if (!oi.c[2 + d][0]) snprintf(oi.c[2 + d], NAMELEN, "o%d", d);
        snprintf(oi.lin, NAMELEN, "w");
        char name[NAMELEN];
        ok = define(st, n->out[0], name, rhs.p) && memo_add(st, n->out[0], &oi, name) && store(st, 0, &oi);
        st->nmemo = mark;
    }
    kf_cg_str_release(&rhs);
    return per_item_kernel(st, s, ok, "pooling", total, &body);
}

#else
typedef int kf_cg_pool_empty; /* ISO C: a translation unit declares something */
#endif
