/*
 * cg_anchor.c: kernels of anchor groups (fusion/kf_plan.h "Anchor group
 * shapes"): a tiled GEMM for MatMul/Gemm and a direct convolution for Conv,
 * each with the group's operand prologues (index maps and elementwise ops,
 * applied as operands are loaded) and epilogue (bias, activation, residual,
 * layout maps on the store). It is part of codegen.c's translation unit:
 * codegen.c includes it with KF_CG_ANCHOR_IMPL defined, because it drives the
 * same demand-driven emitter (emit, define, store, memo), which is static
 * there. Compiled on its own (the folder's glob) it is empty.
 */
#ifdef KF_CG_ANCHOR_IMPL

#include "ops_nn_util.h"

/* ---- epilogue: from the anchor's output element to each group output ------
 *
 * The accumulator of one output element of the anchor is bound to the
 * anchor's value at that index (memo), then every group output is asked for
 * its value at the index that holds that element: elementwise ops keep the
 * index, Transpose permutes it, the Reshape family goes through the linear
 * index. emit walks back from the output to the anchor through the inverse
 * maps and meets the memo entry (by names, or by the linear index). */

/* The indentation one block deeper than ind (4 spaces; at most 40). */
static const char *deeper(const char *ind) {
    static const char spaces[] = "                                        "; /* 40: ten blocks deep */
    size_t n = strlen(ind) + 4;
    return spaces + sizeof spaces - 1 - (n < sizeof spaces - 1 ? n : sizeof spaces - 1);
}

static bool from_anchor(const gen *st, kf_id v, kf_id a, int depth) {
    if (v == a) return true;
    kf_id pn = st->g->values[v].producer;
    if (!pn || st->p->group_of[pn] != st->gi || depth > 64) return false; /* 64: deeper than any group's chain */
    const kf_node *n = &st->g->nodes[pn];
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && from_anchor(st, n->in[i], a, depth + 1)) return true;
    return false;
}

static bool forward_step(gen *st, kf_id a, kf_id v, const ix *at, ix *res, int *open);

/* Does n map elements one to one (a cg_expr, or Cast and Q/DQ, which
 * emit_node writes without one)? */
static bool maps_elements(const kf_node *n) {
    const kf_op_info *oi = kf_op_get(n->op);
    return oi && (oi->cg_expr || n->op == KF_OP_CAST || n->op == KF_OP_QUANTIZE_LINEAR ||
                  n->op == KF_OP_DEQUANTIZE_LINEAR);
}

/* Index into value v that holds the anchor element at `at` (of value a).
 * Each value on the way is emitted at its index (and so remembered): a
 * Transpose after a Reshape drops the linear index the Reshape's inverse map
 * would need to meet the anchor's memo entry, but meets this one by names.
 * open: where a Split or a Gather of one index (a select) may be crossed:
 * the element belongs to v only under a condition, so an `if (cond) {` is
 * written and counted in *open (the caller closes them); NULL refuses them. */
static bool forward_ix(gen *st, kf_id a, kf_id v, const ix *at, ix *res, int *open) {
    char name[NAMELEN];
    if (!forward_step(st, a, v, at, res, open)) return false;
    if (v == a) return true;
    if (!res->lin[0]) offset_of(st, &st->g->values[v].type, res, res->lin); /* for a Reshape further on */
    /* remembered under these names too (a hit through the linear index adds no entry) */
    return emit(st, v, res, name) && memo_add(st, v, res, name);
}

static bool forward_step(gen *st, kf_id a, kf_id v, const ix *at, ix *res, int *open) {
    if (v == a) {
        *res = *at;
        return true;
    }
    const kf_node *n = &st->g->nodes[st->g->values[v].producer];
    int src = -1;
    for (int i = 0; i < n->nin && src < 0; i++)
        if (n->in[i] && from_anchor(st, n->in[i], a, 0)) src = i;
    if (src < 0) return fail(st, "value '%s' does not come from the anchor (internal)", st->g->values[v].name);
    ix r0;
    if (!forward_ix(st, a, n->in[src], at, &r0, open)) return false;
    const kf_type *it = &st->g->values[n->in[src]].type, *ot = &st->g->values[v].type;
    if (open && src == 0 && (n->op == KF_OP_SPLIT || n->op == KF_OP_GATHER)) {
        /* a select: output v holds the elements whose index along axis is in
         * [lo, lo + len) (Split: v's slice; Gather of one constant index:
         * that index, the axis dropped when the index is a scalar) */
        int64_t axis = kf_attr_i(n, "axis", 0), lo = 0, len = 0;
        if (axis < 0) axis += it->rank;
        if (axis < 0 || axis >= it->rank) return fail(st, "node '%s': axis out of range", kf_node_label(n));
        bool drop = false;
        if (n->op == KF_OP_SPLIT) {
            int j = 0;
            while (j < n->nout && n->out[j] != v) j++;
            for (int k = 0; k < j; k++) lo += n->out[k] ? st->g->values[n->out[k]].type.dims[axis] : 0;
            len = ot->dims[axis];
            if (j == n->nout || ot->rank != it->rank) return fail(st, "node '%s': Split output (internal)", kf_node_label(n));
        } else {
            const kf_tensor *t = st->g->values[n->in[1]].init;
            if (!t || t->numel != 1 || !kf_dtype_is_int(t->dtype))
                return fail(st, "node '%s': Gather after the anchor selects by a runtime index (not generated)", kf_node_label(n));
            lo = kf_get_i64(t, 0);
            if (lo < 0) lo += it->dims[axis];
            len = 1;
            drop = ot->rank == it->rank - 1;
            if (lo < 0 || lo >= it->dims[axis] || (!drop && ot->rank != it->rank))
                return fail(st, "node '%s': Gather index out of range", kf_node_label(n));
        }
        char x[NAMELEN];
        if (!emit(st, n->in[0], &r0, x)) return false;
        if (len == 1) kf_cg_printf(st->s, "%sif (%s == %lld) {\n", st->ind, r0.c[axis], (long long)lo);
        else kf_cg_printf(st->s, "%sif (%s >= %lld && %s < %lld) {\n", st->ind, r0.c[axis], (long long)lo, r0.c[axis],
                          (long long)(lo + len));
        st->ind = deeper(st->ind);
        ++*open;
        *res = (ix){.rank = ot->rank};
        for (int d = 0, o = 0; d < it->rank; d++) {
            if (d == axis && drop) continue;
            if (d != axis) snprintf(res->c[o++], NAMELEN, "%s", r0.c[d]);
            else if (len == 1) snprintf(res->c[o++], NAMELEN, "0");
            else {
                char e[64]; /* "name - number" */
                snprintf(e, sizeof e, lo ? "%s - %lld" : "%s", r0.c[d], (long long)lo);
                bind(st, res->c[o++], e);
            }
        }
        return memo_add(st, v, res, x); /* the same element, under v's index */
    }
    switch (n->op) {
    case KF_OP_TRANSPOSE: {
        int cnt = 0, r = it->rank;
        const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
        *res = (ix){.rank = r};
        for (int d = 0; d < r; d++) {
            int64_t pd = perm && cnt == r ? perm[d] : r - 1 - d;
            if (pd < 0 || pd >= r) return fail(st, "node '%s': Transpose perm is not a permutation", kf_node_label(n));
            snprintf(res->c[d], NAMELEN, "%s", r0.c[pd]);
        }
        return true;
    }
    case KF_OP_IDENTITY:
    case KF_OP_RESHAPE:
    case KF_OP_FLATTEN:
    case KF_OP_SQUEEZE:
    case KF_OP_UNSQUEEZE:
    case KF_OP_DROPOUT:
        if (src != 0) break;
        reshape_ix(st, &r0, it, ot, res);
        return true;
    default: {
        if (n != st->red && (!maps_elements(n) || n->nout != 1)) break;
        if (!same_dims(it, ot))
            return fail(st, "node '%s': %s broadcasts the anchor's output into a larger space (not generated)",
                        kf_node_label(n), n->op_type);
        *res = r0;
        return true;
    }
    }
    return fail(st, "node '%s': %s after the anchor is not a store index map (not generated)", kf_node_label(n),
                n->op_type);
}

/* Stores output o at the element `at` of value a holds. A select on the way
 * (forward_ix) guards the store; what it emitted is forgotten after. */
static bool store_from(gen *st, kf_id a, uint32_t o, const ix *at) {
    uint32_t mark = st->nmemo;
    const char *ind = st->ind;
    int open = 0;
    ix oix;
    bool ok = forward_ix(st, a, st->k->outs[o].value, at, &oix, &open) && store(st, o, &oix);
    for (; open > 0; open--) {
        size_t w = strlen(ind) + 4 * (size_t)(open - 1);
        kf_cg_printf(st->s, "%.*s}\n", (int)w, "                                                            ");
    }
    st->ind = ind;
    st->nmemo = mark;
    return ok;
}

/* Binds the anchor's value at `at` to rhs (a float expression) and stores
 * every group output at its element; the memo is cut back afterwards, as the
 * names live in the caller's block. With a row reduction (st->red), outputs
 * after it are left to the row pass, and the reduction's input at this
 * element goes to `row_store` (a shared-memory slot) instead. */
static bool epilogue(gen *st, kf_id a, ix *at, const char *rhs, const char *row_store) {
    uint32_t mark = st->nmemo;
    char name[NAMELEN];
    offset_of(st, &st->g->values[a].type, at, at->lin); /* the linear index meets Reshape's inverse map */
    bool ok = define(st, a, name, rhs) && memo_add(st, a, at, name);
    kf_id rin = st->red ? st->red->in[0] : 0, rout = st->red ? st->red->out[0] : 0;
    if (ok && rin) {
        ix xi;
        ok = forward_ix(st, a, rin, at, &xi, NULL) && emit(st, rin, &xi, name);
    }
    for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
        kf_id v = st->k->outs[o].value;
        if (rout && from_anchor(st, v, rout, 0)) continue;
        if (st->grp->anchor2 && a == st->g->nodes[st->grp->anchor2].out[0] && !from_anchor(st, v, a, 0))
            continue; /* back-to-back: stored by the first anchor's pass */
        if (!from_anchor(st, v, a, 0))
            ok = fail(st, "value '%s' is written by the group but does not come from its anchor (not generated)",
                      st->g->values[v].name);
        else ok = store_from(st, a, o, at);
    }
    /* the shared-memory slot last: with it before a float16 output's store,
     * PoCL's default work-group method (loopvec) lost the GEMM's stores and
     * the row slots (random-graph seed 22955471149; the same kernel is right
     * under POCL_WORK_GROUP_METHOD=cbs or loops, and in either order there) */
    if (ok && rin) kf_cg_printf(st->s, "%s%s = %s;\n", st->ind, row_store, name);
    st->nmemo = mark;
    return ok;
}

/* The register type of an anchor's operands and sums. */
static const char *acc_type(const gen *st) { return st->iacc ? "int" : "float"; }

/* Index into a quantisation parameter of type pt (a zero point): its only
 * element, or element `name` of a 1-D one. */
static void param_ix(const kf_type *pt, const char *name, ix *res) {
    *res = (ix){.rank = pt->rank};
    for (int d = 0; d < pt->rank; d++) snprintf(res->c[d], NAMELEN, "0");
    if (numel_of(pt) != 1 && pt->rank == 1) snprintf(res->c[0], NAMELEN, "%s", name);
}

/* Emits operand v at index at inside an `if (cond)` block that assigns the
 * register reg (zero outside: the tile's edge or the conv's padding). An
 * integer anchor's operand is an int less its zero point zp (0: none) read
 * at zat, so the edge and the padding add nothing (ConvInteger pads with
 * the zero point); shift (not 0) is subtracted inside the block too. */
static bool load_guarded(gen *st, const char *reg, const char *cond, kf_id v, const ix *at, kf_id zp, const ix *zat,
                         int shift) {
    const char *outer = st->ind;
    uint32_t mark = st->nmemo;
    char x[NAMELEN], z[NAMELEN];
    kf_cg_printf(st->s, "%s%s %s = 0;\n", outer, acc_type(st), reg);
    if (cond[0]) {
        kf_cg_printf(st->s, "%sif (%s) {\n", outer, cond);
        st->ind = deeper(outer);
    }
    bool ok = emit(st, v, at, x) && (!zp || emit(st, zp, zat, z));
    if (ok) {
        kf_cg_printf(st->s, "%s%s = %s", st->ind, reg, x);
        if (zp) kf_cg_printf(st->s, " - %s", z);
        if (shift) kf_cg_printf(st->s, " - %d", shift);
        kf_cg_puts(st->s, ";\n");
    }
    st->ind = outer;
    if (cond[0]) kf_cg_printf(st->s, "%s}\n", outer);
    st->nmemo = mark;
    return ok;
}

/* Operand `slot` has the type the template computes on: float32 or
 * 16-bit floats, or 8-bit integers for an integer anchor. */
static bool real_operand(gen *st, const kf_node *n, int slot) {
    kf_dtype dt = st->g->values[n->in[slot]].type.dtype;
    if (st->iacc ? dt == KF_DT_INT8 || dt == KF_DT_UINT8 : is_real(dt)) return true;
    return fail(st, "node '%s': %s over %s is not generated (%s templates)", kf_node_label(n), n->op_type,
                kf_dtype_name(dt), st->iacc ? "8-bit integer" : "float");
}

/* Sums of k products of 8-bit values less their zero points (each at most
 * 255 * 255 in size) fit an int when k is at most this. */
#define INT_SUM_MAX_K (INT32_MAX / (255 * 255))

/* ---- tiled GEMM ------------------------------------------------------------
 *
 * One work-group of 16 x 16 work-items owns a 64 x 64 tile of C (of one
 * batch); each work-item accumulates a 4 x 4 register tile, rows ty + 16p,
 * columns tx + 16q (strided, so a warp's shared-memory reads are broadcasts
 * or consecutive words and its stores coalesce along N). K advances 16 at a
 * time through two shared tiles:
 *
 *            kf_bs[16][64]   (B rows k0..k0+15, columns of the tile)
 *   kf_as    +-----------+
 *  [16][65]  | acc 4 x 4 |   A's tile stored k-major, padded to 65 so the
 *  (k-major) | per item  |   transposing store hits 16 distinct banks
 *            +-----------+
 *
 * 64 x 64 x 16: 8.3 KiB of shared memory, 16 loads from it per 16 FMAs per
 * k step; small enough for several groups per SM and for PoCL's CPU
 * work-group loops. Edges: loads outside M/N/K read 0, stores are guarded, so
 * any M, N, K is correct. Operands are read through emit, so a prologue (an
 * elementwise op, a Transpose or Reshape on the way to an operand) runs as the
 * tile is loaded. */

#define GEMM_TM 64   /* tile rows */
#define GEMM_TN 64   /* tile columns */
#define GEMM_TK 16   /* k step: one shared tile of A and of B */
#define GEMM_WG 256  /* 16 x 16 work-items; each a 4 x 4 register tile */

typedef struct gemm {
    kf_id a, b, c;          /* operands (c: Gemm's C, 0 if none) */
    kf_id za, zb;           /* MatMulInteger's zero points (0: none) */
    bool ta, tb;            /* Gemm transA/transB */
    float alpha, beta;
    int64_t M, N, K;
    int nb;                 /* batch dims of the output */
    bool has_m, has_n;      /* the output has an M / N dim (MatMul of 1-D operands drops them) */
} gemm;

static bool gemm_setup(gen *st, const kf_node *n, gemm *gm) {
    *gm = (gemm){.a = n->in[0], .b = n->in[1], .alpha = 1, .beta = 1, .has_m = true, .has_n = true};
    if (!real_operand(st, n, 0) || !real_operand(st, n, 1)) return false;
    const kf_type *at = &st->g->values[gm->a].type, *bt = &st->g->values[gm->b].type,
                  *ot = &st->g->values[n->out[0]].type;
    if (!kf_type_is_static(at) || !kf_type_is_static(bt) || !kf_type_is_static(ot))
        return fail(st, "node '%s': shapes are not static", kf_node_label(n));
    if (n->op == KF_OP_GEMM) {
        if (at->rank != 2 || bt->rank != 2 || ot->rank != 2)
            return fail(st, "node '%s': Gemm operands are not 2-D", kf_node_label(n));
        gm->ta = kf_attr_i(n, "transA", 0) != 0;
        gm->tb = kf_attr_i(n, "transB", 0) != 0;
        gm->alpha = kf_attr_f(n, "alpha", 1.0f);
        gm->beta = kf_attr_f(n, "beta", 1.0f);
        if (!isfinite(gm->alpha) || !isfinite(gm->beta))
            return fail(st, "node '%s': alpha or beta is not finite", kf_node_label(n));
        gm->M = at->dims[gm->ta ? 1 : 0];
        gm->K = at->dims[gm->ta ? 0 : 1];
        gm->N = bt->dims[gm->tb ? 0 : 1];
        if (bt->dims[gm->tb ? 1 : 0] != gm->K) return fail(st, "node '%s': Gemm K differs", kf_node_label(n));
        if (n->nin > 2 && n->in[2]) {
            gm->c = n->in[2];
            if (!real_operand(st, n, 2)) return false;
            const kf_type *ct = &st->g->values[gm->c].type;
            bool fits = ct->rank <= 2;
            for (int d = 0; fits && d < ct->rank; d++) fits = ct->dims[d] == 1 || ct->dims[d] == ot->dims[d + 2 - ct->rank];
            if (!fits) return fail(st, "node '%s': Gemm C does not broadcast to [M, N]", kf_node_label(n));
        }
        return true;
    }
    if (at->rank < 1 || bt->rank < 1) return fail(st, "node '%s': MatMul of a scalar", kf_node_label(n));
    gm->has_m = at->rank > 1;
    gm->has_n = bt->rank > 1;
    gm->K = at->dims[at->rank - 1];
    gm->M = gm->has_m ? at->dims[at->rank - 2] : 1;
    gm->N = gm->has_n ? bt->dims[bt->rank - 1] : 1;
    if (bt->dims[gm->has_n ? bt->rank - 2 : 0] != gm->K) return fail(st, "node '%s': MatMul K differs", kf_node_label(n));
    if (st->iacc) {
        gm->za = n->nin > 2 ? n->in[2] : 0;
        gm->zb = n->nin > 3 ? n->in[3] : 0;
        if (gm->K > INT_SUM_MAX_K)
            return fail(st, "node '%s': K = %lld could overflow the int sums (not generated)", kf_node_label(n), (long long)gm->K);
    }
    gm->nb = ot->rank - gm->has_m - gm->has_n;
    if (gm->nb < 0) return fail(st, "node '%s': MatMul output rank (internal)", kf_node_label(n));
    return true;
}

/* Index of a MatMul operand of type t (A when is_a) at row/col names, with
 * the output's batch names z0.. broadcast into its batch dims. */
static void operand_ix(const gemm *gm, const kf_type *t, bool is_a, const char *row, const char *col, ix *res) {
    *res = (ix){.rank = t->rank};
    if (t->rank == 1) {
        snprintf(res->c[0], NAMELEN, "%s", is_a ? col : row); /* the K dim */
        return;
    }
    int nbt = t->rank - 2;
    for (int d = 0; d < nbt; d++) {
        if (t->dims[d] == 1) snprintf(res->c[d], NAMELEN, "0");
        else snprintf(res->c[d], NAMELEN, "z%d", gm->nb - nbt + d);
    }
    snprintf(res->c[nbt], NAMELEN, "%s", row);
    snprintf(res->c[nbt + 1], NAMELEN, "%s", col);
}

/* The batch names z0.. of output type ot from the batch number tb. */
static void batch_names(gen *st, const gemm *gm, const kf_type *ot) {
    int64_t stride = 1;
    for (int d = gm->nb - 1; d >= 0; d--) {
        if (ot->dims[d] != 1)
            kf_cg_printf(st->s, "        const %s z%d = (tb / %lld) %% %lld;\n", st->ity, d, (long long)stride,
                         (long long)ot->dims[d]);
        else kf_cg_printf(st->s, "        const %s z%d = 0;\n", st->ity, d);
        stride *= ot->dims[d];
    }
}

/* One k step's loads: A's rows [rowbase, rowbase + rows) into kf_as (k-major,
 * padded to rows + 1 columns; none when rows is 0), B's columns [colbase,
 * colbase + 64) into kf_bs; operands outside M/N/K read 0. rowbase/colbase:
 * expressions. */
static bool tile_loads(gen *st, const kf_node *n, const gemm *gm, int rows, const char *rowbase, const char *colbase) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    char cond[128]; /* two compares of a name with a number */
    ix ai, bi;
    if (rows) {
        /* A: element e -> (row e / 16, k e % 16): consecutive work-items read consecutive k */
        kf_cg_printf(b, "            for (int e = KF_LOCAL_ID; e < %d; e += KF_LOCAL_SIZE) {\n", rows * GEMM_TK);
        kf_cg_printf(b, "                const %s gm = %s + e / %d;\n", I, rowbase, GEMM_TK);
        kf_cg_printf(b, "                const %s gk = k0 + e %% %d;\n", I, GEMM_TK);
        st->ind = "                ";
        snprintf(cond, sizeof cond, "gm < %lld && gk < %lld", (long long)gm->M, (long long)gm->K);
        if (n->op == KF_OP_GEMM) {
            ai = (ix){.rank = 2};
            snprintf(ai.c[0], NAMELEN, "%s", gm->ta ? "gk" : "gm");
            snprintf(ai.c[1], NAMELEN, "%s", gm->ta ? "gm" : "gk");
        } else operand_ix(gm, &st->g->values[gm->a].type, true, "gm", "gk", &ai);
        ix zi;
        if (gm->za) param_ix(&st->g->values[gm->za].type, "gm", &zi);
        if (!load_guarded(st, "x", cond, gm->a, &ai, gm->za, &zi, 0)) return false;
        kf_cg_printf(b, "                kf_as[e %% %d][e / %d] = x;\n            }\n", GEMM_TK, GEMM_TK);
    }
    /* B: element e -> (k e / 64, column e % 64): consecutive work-items read consecutive columns */
    kf_cg_printf(b, "            for (int e = KF_LOCAL_ID; e < %d; e += KF_LOCAL_SIZE) {\n", GEMM_TK * GEMM_TN);
    kf_cg_printf(b, "                const %s gk = k0 + e / %d;\n", I, GEMM_TN);
    kf_cg_printf(b, "                const %s gn = %s + e %% %d;\n", I, colbase, GEMM_TN);
    st->ind = "                ";
    snprintf(cond, sizeof cond, "gk < %lld && gn < %lld", (long long)gm->K, (long long)gm->N);
    if (n->op == KF_OP_GEMM) {
        bi = (ix){.rank = 2};
        snprintf(bi.c[0], NAMELEN, "%s", gm->tb ? "gn" : "gk");
        snprintf(bi.c[1], NAMELEN, "%s", gm->tb ? "gk" : "gn");
    } else operand_ix(gm, &st->g->values[gm->b].type, false, "gk", "gn", &bi);
    ix zi;
    if (gm->zb) param_ix(&st->g->values[gm->zb].type, "gn", &zi);
    if (!load_guarded(st, "x", cond, gm->b, &bi, gm->zb, &zi, 0)) return false;
    kf_cg_printf(b, "                kf_bs[e / %d][e %% %d] = x;\n            }\n", GEMM_TN, GEMM_TN);
    return true;
}

/* The anchor's output index at (z.., gm, gn), and the expression of its
 * value from accumulator text acc (Gemm: alpha * acc + beta * C). */
static bool anchor_value(gen *st, const kf_node *n, const gemm *gm, const char *acc, ix *oi, kf_cg_str *rhs) {
    const kf_type *ot = &st->g->values[n->out[0]].type;
    *oi = (ix){.rank = ot->rank};
    for (int d = 0; d < gm->nb; d++) snprintf(oi->c[d], NAMELEN, ot->dims[d] == 1 ? "0" : "z%d", d);
    if (gm->has_m) snprintf(oi->c[gm->nb], NAMELEN, "%s", gm->M == 1 ? "0" : "gm");
    if (gm->has_n) snprintf(oi->c[gm->nb + gm->has_m], NAMELEN, "%s", gm->N == 1 ? "0" : "gn");
    kf_cg_puts(rhs, acc);
    if (gm->alpha != 1.0f) {
        kf_cg_puts(rhs, " * ");
        put_float(rhs, gm->alpha);
    }
    if (gm->c) {
        ix ci;
        char cx[NAMELEN];
        if (!bcast_ix(st, n, oi, ot, &st->g->values[gm->c].type, &ci) ||
            !emit(st, gm->c, &ci, cx))
            return false;
        kf_cg_printf(rhs, " + %s * ", cx);
        put_float(rhs, gm->beta);
    }
    if (rhs->oom) return fail_oom(st);
    return true;
}

/* The end of a tiled kernel whose header and shared arrays are written:
 * a grid-stride loop over ntiles tiles holding body, then body released;
 * returns ok. */
static bool tiles_end(gen *st, kf_cg_str *s, kf_cg_str *body, int64_t ntiles, bool ok) {
    if (ok) {
        kf_cg_printf(s, "    for (%s tile = (%s)KF_GROUP_ID; tile < %lld; tile += (%s)KF_NUM_GROUPS) {\n", st->ity,
                     st->ity, (long long)ntiles, st->ity);
        kf_cg_puts(s, body->p ? body->p : "");
        kf_cg_puts(s, "    }\n}\n");
    }
    if (body->oom) s->oom = true;
    kf_cg_str_release(body);
    return ok;
}

/* ---- integer GEMM: four 8-bit lanes a word ------------------------------------
 *
 * MatMulInteger on the tiled GEMM's 64 x 64 tile and 16 x 16 work-items, its
 * operands packed four k at a time into ints (kf_as[4][65], kf_bs[4][64]
 * per k step of 16) and multiplied by KF_DOT4, the dialect's dot product of
 * four signed 8-bit lanes (dp4a on CUDA): one instruction per four products
 * and a quarter of the shared-memory reads of the int tile. The lanes are
 * signed, so a uint8 operand is moved to int8 by subtracting 128 as it loads,
 * its zero point with it (differences a - za are unchanged). A difference
 * needs 9 bits, so the zero points come after the sums:
 *
 *   sum (a - za)(b - zb) = sum ab - zb sum a - za sum b + K za zb
 *
 * with sum a per row and sum b per column accumulated by the work-items that
 * load them (each loads one word of A and one of B per k step) and gathered
 * through shared memory after the k loop, only where the other operand's
 * zero point is not 0. Tile edges read 0 and add to none of the sums. With
 * K <= INT_SUM_MAX_K every partial result fits an int (|a|, |b| <= 128). */

/* The tile x tile tiles of GEMM gm (output type ot) into *tm, *tn and
 * *ntiles, and the kernel named name launched as one work-group of GEMM_WG
 * per tile;
 * false (failed) past an int's count of work-items. */
static bool gemm_tiles(gen *st, const kf_node *n, const gemm *gm, const kf_type *ot, const char *name, int tile,
                       int64_t *tm, int64_t *tn, int64_t *ntiles) {
    int64_t nbatch = 1;
    *tm = (gm->M + tile - 1) / tile, *tn = (gm->N + tile - 1) / tile;
    for (int d = 0; d < gm->nb; d++) nbatch *= ot->dims[d];
    *ntiles = nbatch * *tm * *tn;
    if (*ntiles > INT32_MAX / GEMM_WG) return fail(st, "node '%s': %lld tiles (not generated)", kf_node_label(n), (long long)*ntiles);
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup(name))) return fail_oom(st);
    st->k->block = GEMM_WG;
    st->k->numel = *ntiles * GEMM_WG;
    return true;
}

/* The work-group's tile from its number (tile): column tile tn, row tile
 * tm and batch tb of tm x tn tiles per batch, then the batch dims' names. */
static void tile_coords(gen *st, const gemm *gm, const kf_type *ot, int64_t tm, int64_t tn) {
    const char *I = st->ity;
    kf_cg_printf(st->s, "        const %s tn = tile %% %lld;\n", I, (long long)tn);
    kf_cg_printf(st->s, "        const %s tm = (tile / %lld) %% %lld;\n", I, (long long)tn, (long long)tm);
    if (gm->nb) kf_cg_printf(st->s, "        const %s tb = tile / %lld;\n", I, (long long)(tn * tm));
    batch_names(st, gm, ot);
}

/* The zero point of integer GEMM operand op (zp: its zero-point value, 0 if
 * none) moved as the operand is, at row or column `at`: text into z. */
static bool izero(gen *st, kf_id op, kf_id zp, const char *at, char *z, size_t len) {
    bool u8 = st->g->values[op].type.dtype == KF_DT_UINT8;
    if (!zp) {
        snprintf(z, len, "%s", u8 ? "(-128)" : "0");
        return true;
    }
    ix zi;
    char v[NAMELEN];
    param_ix(&st->g->values[zp].type, at, &zi);
    if (!emit(st, zp, &zi, v)) return false;
    snprintf(z, len, u8 ? "(%s - 128)" : "%s", v);
    return true;
}

/* The work-item's word of operand A (is_a: row KF_LOCAL_ID / 4, word
 * KF_LOCAL_ID % 4) or B (word KF_LOCAL_ID / tile, column KF_LOCAL_ID %
 * tile) for one k step: four values at k0 + 4 word + j, as int8, 0 past
 * the edges, packed into the shared tile; with sum, their sum added to that
 * register. A tile of 64 has a word for each of the 256 work-items; a tile
 * of 32 for the first 128, the others wait at the barrier. */
static bool load_words(gen *st, const gemm *gm, bool is_a, const char *sum, int tile) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    kf_id v = is_a ? gm->a : gm->b;
    const kf_type *t = &st->g->values[v].type;
    int shift = t->dtype == KF_DT_UINT8 ? 128 : 0;
    if (4 * tile < GEMM_WG) kf_cg_printf(b, "            if (KF_LOCAL_ID < %d) {\n", 4 * tile);
    else kf_cg_puts(b, "            {\n");
    char word[32];
    snprintf(word, sizeof word, is_a ? "KF_LOCAL_ID %% 4" : "KF_LOCAL_ID / %d", tile);
    if (is_a) kf_cg_printf(b, "                const %s gm = tm * %d + KF_LOCAL_ID / 4;\n", I, tile);
    else kf_cg_printf(b, "                const %s gn = tn * %d + KF_LOCAL_ID %% %d;\n", I, tile, tile);
    st->ind = "                ";
    bool ok = true;
    for (int j = 0; ok && j < 4; j++) {
        char gk[8], reg[8], cond[128]; /* two compares of a name with a number */
        snprintf(gk, sizeof gk, "gk%d", j);
        snprintf(reg, sizeof reg, "x%d", j);
        kf_cg_printf(b, "                const %s %s = k0 + %s * 4 + %d;\n", I, gk, word, j);
        if (is_a) snprintf(cond, sizeof cond, "gm < %lld && %s < %lld", (long long)gm->M, gk, (long long)gm->K);
        else snprintf(cond, sizeof cond, "%s < %lld && gn < %lld", gk, (long long)gm->K, (long long)gm->N);
        ix at;
        operand_ix(gm, t, is_a, is_a ? "gm" : gk, is_a ? gk : "gn", &at);
        ok = load_guarded(st, reg, cond, v, &at, 0, NULL, shift);
    }
    if (is_a) kf_cg_puts(b, "                kf_as[KF_LOCAL_ID % 4][KF_LOCAL_ID / 4] = KF_PACK4(x0, x1, x2, x3);\n");
    else kf_cg_printf(b, "                kf_bs[KF_LOCAL_ID / %d][KF_LOCAL_ID %% %d] = KF_PACK4(x0, x1, x2, x3);\n", tile, tile);
    if (sum) kf_cg_printf(b, "                %s += x0 + x1 + x2 + x3;\n", sum);
    kf_cg_puts(b, "            }\n");
    return ok;
}

static bool gen_igemm(gen *st, kf_cg_str *s, const kf_node *n, const gemm *gmp) {
    const gemm gm = *gmp;
    const kf_type *ot = &st->g->values[n->out[0]].type;
    const char *I = st->ity;
    int64_t nb = 1;
    for (int d = 0; d < gm.nb; d++) nb *= ot->dims[d];
    /* 64 x 64 tiles (a 4 x 4 register tile per work-item), or 32 x 32
     * (2 x 2) when the bigger ones would leave the machine idle */
    const int tile = kf_igemm_tile(gm.M, gm.N, nb), r = tile / 16;
    int64_t tm, tn, ntiles;
    if (!gemm_tiles(st, n, &gm, ot, "kf_igemm", tile, &tm, &tn, &ntiles)) return false;
    /* row sums of A matter when B's zero point (as int8) is not 0, column sums of B when A's is not */
    bool rows = gm.zb || st->g->values[gm.b].type.dtype == KF_DT_UINT8;
    bool cols = gm.za || st->g->values[gm.a].type.dtype == KF_DT_UINT8;

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    tile_coords(st, &gm, ot, tm, tn);
    kf_cg_printf(&body, "        int acc[%d][%d];\n"
                        "        for (int p = 0; p < %d; p++)\n"
                        "            for (int q = 0; q < %d; q++) acc[p][q] = 0;\n", r, r, r, r);
    if (rows) kf_cg_puts(&body, "        int ra = 0;\n");
    if (cols) kf_cg_puts(&body, "        int cb = 0;\n");
    kf_cg_printf(&body, "        for (%s k0 = 0; k0 < %lld; k0 += %d) {\n", I, (long long)gm.K, GEMM_TK);
    bool ok = load_words(st, &gm, true, rows ? "ra" : NULL, tile) && load_words(st, &gm, false, cols ? "cb" : NULL, tile);
    kf_cg_printf(&body, "            KF_BARRIER;\n"
                        "            for (int kk = 0; kk < 4; kk++) {\n"
                        "                int fa[%d], fb[%d];\n"
                        "                for (int q = 0; q < %d; q++) {\n"
                        "                    fa[q] = kf_as[kk][ty + 16 * q];\n"
                        "                    fb[q] = kf_bs[kk][tx + 16 * q];\n"
                        "                }\n"
                        "                for (int p = 0; p < %d; p++)\n"
                        "                    for (int q = 0; q < %d; q++) acc[p][q] = KF_DOT4(fa[p], fb[q], acc[p][q]);\n"
                        "            }\n"
                        "            KF_BARRIER;\n"
                        "        }\n", r, r, r, r, r);
    if (rows || cols) {
        kf_cg_printf(&body, "        if (KF_LOCAL_ID < %d) {\n", 4 * tile);
        if (rows) kf_cg_puts(&body, "            kf_ra[KF_LOCAL_ID / 4][KF_LOCAL_ID % 4] = ra;\n");
        if (cols) kf_cg_printf(&body, "            kf_cb[KF_LOCAL_ID / %d][KF_LOCAL_ID %% %d] = cb;\n", tile, tile);
        kf_cg_puts(&body, "        }\n        KF_BARRIER;\n");
    }
    kf_cg_printf(&body, "        for (int p = 0; p < %d; p++) {\n", r);
    kf_cg_printf(&body, "            const %s gm = tm * %d + ty + 16 * p;\n", I, tile);
    if (rows) kf_cg_puts(&body, "            const int sa = kf_ra[ty + 16 * p][0] + kf_ra[ty + 16 * p][1] + "
                                "kf_ra[ty + 16 * p][2] + kf_ra[ty + 16 * p][3];\n");
    kf_cg_printf(&body, "            for (int q = 0; q < %d; q++) {\n", r);
    kf_cg_printf(&body, "                const %s gn = tn * %d + tx + 16 * q;\n", I, tile);
    if (cols) kf_cg_puts(&body, "                const int sb = kf_cb[0][tx + 16 * q] + kf_cb[1][tx + 16 * q] + "
                                "kf_cb[2][tx + 16 * q] + kf_cb[3][tx + 16 * q];\n");
    kf_cg_printf(&body, "                if (gm < %lld && gn < %lld) {\n", (long long)gm.M, (long long)gm.N);
    st->ind = "                    ";
    uint32_t mark = st->nmemo;
    char za[NAMELEN + 16], zb[NAMELEN + 16]; /* "(name - 128)" */
    ok = ok && izero(st, gm.a, gm.za, "gm", za, sizeof za) && izero(st, gm.b, gm.zb, "gn", zb, sizeof zb);
    kf_cg_str sum = {0}, rhs = {0};
    kf_cg_puts(&sum, "(acc[p][q]");
    if (rows) kf_cg_printf(&sum, " - %s * sa", zb);
    if (cols) kf_cg_printf(&sum, " - %s * sb", za);
    if (rows && cols) kf_cg_printf(&sum, " + %lld * %s * %s", (long long)gm.K, za, zb);
    kf_cg_puts(&sum, ")");
    ix oi;
    if (sum.oom) ok = fail_oom(st);
    ok = ok && anchor_value(st, n, &gm, sum.p, &oi, &rhs) && epilogue(st, n->out[0], &oi, rhs.p, NULL);
    st->nmemo = mark;
    kf_cg_str_release(&sum);
    kf_cg_str_release(&rhs);
    kf_cg_puts(&body, "                }\n            }\n        }\n");
    if (ok) {
        header(st, s, tile == 64 ? "tiled integer GEMM, four 8-bit lanes a word"
                                 : "tiled integer GEMM, four 8-bit lanes a word, 32 x 32 tiles");
        kf_cg_printf(s, "    KF_SHARED int kf_as[4][%d];\n    KF_SHARED int kf_bs[4][%d];\n", tile + 1, tile);
        if (rows) kf_cg_printf(s, "    KF_SHARED int kf_ra[%d][4];\n", tile);
        if (cols) kf_cg_printf(s, "    KF_SHARED int kf_cb[4][%d];\n", tile);
        kf_cg_puts(s, "    const int tx = KF_LOCAL_ID % 16, ty = KF_LOCAL_ID / 16;\n");
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

struct conv;
/* The 8-bit operands of the tensor-core tile (gen_mma8): w gives its rows,
 * x its columns. ConvInteger's and MatMulInteger's (int8/uint8 with zero
 * points; MatMulInteger's A is w, B is x), or a float8 convolution's
 * (kf_fp8_conv with both DequantizeLinears in the group): the float8 codes
 * behind the two DequantizeLinears, loaded as bytes into the same packed
 * words, with float sums scaled by sx sw[channel] after the k loop. Float8
 * padding and edges load code 0, which is 0 in both formats. */
typedef struct mma8 {
    kf_id x, w;        /* the values whose bytes the tile loads: columns, rows */
    kf_id sx, sw;      /* float8: the DequantizeLinears' scales; 0 for ConvInteger */
    kf_dtype fx, fw;   /* float8: their formats */
} mma8;

static bool gen_mma8(gen *st, kf_cg_str *s, const kf_node *n, const struct conv *cvp, const gemm *gmp,
                     const mma8 *mm, int T);

static bool gen_gemm(gen *st, kf_cg_str *s, const kf_node *n) {
    gemm gm;
    if (!gemm_setup(st, n, &gm)) return false;
    if (st->iacc) {
        int it = kf_imma_gemm_tile(st->g, n);
        mma8 mm = {.x = gm.b, .w = gm.a}; /* A the rows, B the columns */
        return it ? gen_mma8(st, s, n, NULL, &gm, &mm, it) : gen_igemm(st, s, n, &gm);
    }
    const kf_type *ot = &st->g->values[n->out[0]].type;
    const char *I = st->ity;
    int64_t tm, tn, ntiles;
    if (!gemm_tiles(st, n, &gm, ot, "kf_gemm", GEMM_TM, &tm, &tn, &ntiles)) return false;

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    tile_coords(st, &gm, ot, tm, tn);
    const char *T = acc_type(st);
    kf_cg_printf(&body, "        %s acc[4][4];\n"
                        "        for (int p = 0; p < 4; p++)\n"
                        "            for (int q = 0; q < 4; q++) acc[p][q] = 0;\n", T);
    kf_cg_printf(&body, "        for (%s k0 = 0; k0 < %lld; k0 += %d) {\n", I, (long long)gm.K, GEMM_TK);
    char base[2][48]; /* "tm * 64" */
    snprintf(base[0], sizeof base[0], "tm * %d", GEMM_TM);
    snprintf(base[1], sizeof base[1], "tn * %d", GEMM_TN);
    bool ok = tile_loads(st, n, &gm, GEMM_TM, base[0], base[1]);
    kf_cg_printf(&body, "            KF_BARRIER;\n"
                      "            for (int kk = 0; kk < 16; kk++) {\n"
                      "                %s fa[4], fb[4];\n"
                      "                for (int q = 0; q < 4; q++) {\n"
                      "                    fa[q] = kf_as[kk][ty + 16 * q];\n"
                      "                    fb[q] = kf_bs[kk][tx + 16 * q];\n"
                      "                }\n"
                      "                for (int p = 0; p < 4; p++)\n"
                      "                    for (int q = 0; q < 4; q++) acc[p][q] += fa[p] * fb[q];\n"
                      "            }\n"
                      "            KF_BARRIER;\n"
                      "        }\n", T);
    /* epilogue: per register element, guarded */
    kf_cg_puts(&body, "        for (int p = 0; p < 4; p++) {\n");
    kf_cg_printf(&body, "            const %s gm = tm * %d + ty + 16 * p;\n", I, GEMM_TM);
    kf_cg_puts(&body, "            for (int q = 0; q < 4; q++) {\n");
    kf_cg_printf(&body, "                const %s gn = tn * %d + tx + 16 * q;\n", I, GEMM_TN);
    kf_cg_printf(&body, "                if (gm < %lld && gn < %lld) {\n", (long long)gm.M, (long long)gm.N);
    st->ind = "                    ";
    ix oi;
    kf_cg_str rhs = {0};
    uint32_t mark = st->nmemo;
    ok = ok && anchor_value(st, n, &gm, "acc[p][q]", &oi, &rhs) && epilogue(st, n->out[0], &oi, rhs.p, NULL);
    st->nmemo = mark;
    kf_cg_str_release(&rhs);
    kf_cg_puts(&body, "                }\n            }\n        }\n");
    if (ok) {
        header(st, s, "tiled GEMM");
        kf_cg_printf(s, "    KF_SHARED %s kf_as[%d][%d];\n", T, GEMM_TK, GEMM_TM + 1);
        kf_cg_printf(s, "    KF_SHARED %s kf_bs[%d][%d];\n", T, GEMM_TK, GEMM_TN);
        kf_cg_puts(s, "    const int tx = KF_LOCAL_ID % 16, ty = KF_LOCAL_ID / 16;\n");
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

/* ---- GEMM + row reduction ----------------------------------------------------
 *
 * A work-group owns RM whole output rows (of one batch): the GEMM fills a
 * shared row tile kf_row[RM][N] 64 columns at a time (16 x 16 work-items, the
 * first RM rows of them each accumulating 4 columns), with the epilogue up
 * to the reduction's input applied on the way; then each row is reduced with
 * the block reduces of the reduction template (max/sum of exp for Softmax
 * and LogSoftmax, mean then squared deviations for LayerNorm: two-pass, as
 * the reference) and the reduction's output and its epilogue are written by
 * a strided pass over the row. RM = ROWS_BYTES / (4 N), at most 16: 24 KiB of
 * rows plus 8 KiB of operand tiles and the block reduce's buffer stay inside
 * CUDA's 48 KiB of static shared memory (RM >= 4 for the planner's rows of
 * up to 1536 floats). */

#define ROWS_BYTES (24 * 1024)

/* Does value v come from anchor output a through elementwise ops and the
 * Reshape family only (so its elements are the anchor's, in the same
 * row-major order)? */
static bool linear_path(const gen *st, kf_id v, kf_id a, int depth) {
    if (v == a) return true;
    kf_id pn = st->g->values[v].producer;
    if (!pn || st->p->group_of[pn] != st->gi || depth > 64) return false; /* 64: as from_anchor */
    const kf_node *n = &st->g->nodes[pn];
    switch (n->op) {
    case KF_OP_IDENTITY:
    case KF_OP_RESHAPE:
    case KF_OP_FLATTEN:
    case KF_OP_SQUEEZE:
    case KF_OP_UNSQUEEZE: return linear_path(st, n->in[0], a, depth + 1);
    case KF_OP_TRANSPOSE: { /* one that only moves dims of 1 keeps the order: [T, 1, C] -> [1, T, C] */
        const kf_type *it = &st->g->values[n->in[0]].type;
        int cnt = 0;
        const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
        int64_t last = -1;
        for (int d = 0; d < it->rank; d++) {
            int64_t pd = perm && cnt == it->rank ? perm[d] : it->rank - 1 - d;
            if (pd < 0 || pd >= it->rank) return false;
            if (it->dims[pd] == 1) continue;
            if (pd < last) return false;
            last = pd;
        }
        return linear_path(st, n->in[0], a, depth + 1);
    }
    default: break;
    }
    if (!maps_elements(n)) return false;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && from_anchor(st, n->in[i], a, 0)) {
            if (!same_dims(&st->g->values[n->in[i]].type, &st->g->values[v].type)) return false;
            if (!linear_path(st, n->in[i], a, depth + 1)) return false;
        }
    return true;
}
#define ROWS_MAX 16 /* the 16 rows of work-items */

/* The row pass of reduction r over the rows held in shared buffer buf: the
 * rows of GEMM gm (output type ot), rm per work-group. Statistics by block
 * reduces, then a strided pass storing the outputs after r (but not those
 * after next); with next, the operand next reads (after r) replaces the row
 * in buf. */
static bool row_pass(gen *st, const kf_node *r, const gemm *gmp, const kf_type *ot, int64_t rm, const char *buf,
                     const kf_node *next) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    const gemm gm = *gmp;
    const int64_t N = gm.N;
    const kf_type *xt = &st->g->values[r->in[0]].type;
    bool ok = true;
    /* the rows: statistics by block reduces, then the strided output pass */
    /* the trip count is uniform (a loop bound, not an if around the barriers: PoCL
     * miscompiled block reduces under a uniform if) */
    kf_cg_printf(b, "        const int nrows = %lld - tm * %lld < %lld ? %lld - tm * %lld : %lld;\n", (long long)gm.M,
                 (long long)rm, (long long)rm, (long long)gm.M, (long long)rm, (long long)rm);
    kf_cg_puts(b, "        for (int rr = 0; rr < nrows; rr++) {\n");
    kf_cg_printf(b, "            const %s gm = tm * %lld + rr;\n", I, (long long)rm);
    kf_cg_puts(b, "            {\n");
    const char *loop = "for (%s j = (%s)KF_LOCAL_ID; j < %lld; j += (%s)KF_LOCAL_SIZE)";
    char lp[160]; /* the loop header with three names and a number */
    snprintf(lp, sizeof lp, loop, I, I, (long long)N, I);
    char nf[48]; /* float literal of N */
    kf_cg_str lit = {0};
    put_float(&lit, (double)N);
    if (lit.oom || !lit.p) ok = fail_oom(st); /* a literal cut short must not become a default */
    snprintf(nf, sizeof nf, "%s", lit.p && !lit.oom ? lit.p : "1.0f");
    kf_cg_str_release(&lit);
    char eps[48]; /* a float literal */
    if (st->rk == RK_LAYERNORM) {
        if (!epsilon_literal(st, r, eps, sizeof eps)) ok = false;
        kf_cg_printf(b, "                float rsum = 0.0f;\n                %s rsum += %s[rr][j];\n", lp, buf);
        kf_cg_printf(b, "                const float rmean = kf_block_sum(rsum, kf_red, KF_LOCAL_SIZE) / %s;\n", nf);
        kf_cg_printf(b, "                float rvar = 0.0f;\n                %s rvar += (%s[rr][j] - rmean) * (%s[rr][j] - rmean);\n", lp, buf, buf);
        kf_cg_printf(b, "                const float rstd = 1.0f / KF_SQRT(kf_block_sum(rvar, kf_red, KF_LOCAL_SIZE) / %s + %s);\n",
                     nf, eps);
        snprintf(st->stat[0], NAMELEN, "rmean");
        snprintf(st->stat[1], NAMELEN, "rstd");
    } else if (st->rk == RK_RMSNORM) {
        if (!epsilon_literal(st, r, eps, sizeof eps)) ok = false;
        kf_cg_printf(b, "                float rsq = 0.0f;\n                %s rsq += %s[rr][j] * %s[rr][j];\n", lp, buf, buf);
        kf_cg_printf(b, "                const float rstd = 1.0f / KF_SQRT(kf_block_sum(rsq, kf_red, KF_LOCAL_SIZE) / %s + %s);\n",
                     nf, eps);
        snprintf(st->stat[1], NAMELEN, "rstd");
    } else {
        kf_cg_printf(b, "                float rmax = -KF_INF;\n                %s rmax = KF_FMAX(rmax, %s[rr][j]);\n", lp, buf);
        kf_cg_puts(b, "                rmax = kf_block_max(rmax, kf_red, KF_LOCAL_SIZE);\n");
        kf_cg_printf(b, "                float rsum = 0.0f;\n                %s rsum += KF_EXP(%s[rr][j] - rmax);\n", lp, buf);
        kf_cg_puts(b, "                rsum = kf_block_sum(rsum, kf_red, KF_LOCAL_SIZE);\n");
        snprintf(st->stat[0], NAMELEN, "rmax");
        snprintf(st->stat[1], NAMELEN, "rsum");
    }
    st->stats = true;
    kf_cg_printf(b, "                %s {\n", lp);
    kf_cg_printf(b, "                    const float xr = %s[rr][j];\n", buf);
    st->ind = "                    ";
    ix ai = {.rank = ot->rank}, xi;
    for (int d = 0; d < gm.nb; d++) snprintf(ai.c[d], NAMELEN, ot->dims[d] == 1 ? "0" : "z%d", d);
    snprintf(ai.c[gm.nb], NAMELEN, "%s", gm.M == 1 ? "0" : "gm");
    snprintf(ai.c[gm.nb + 1], NAMELEN, "%s", N == 1 ? "0" : "j");
    if (same_dims(xt, ot)) xi = ai;
    else reshape_ix(st, &ai, ot, xt, &xi); /* the same element of a reshaped row space */
    if (!xi.lin[0]) offset_of(st, xt, &xi, xi.lin);
    uint32_t mark = st->nmemo;
    ok = ok && memo_add(st, r->in[0], &xi, "xr");
    for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
        kf_id v = st->k->outs[o].value;
        if (from_anchor(st, v, r->out[0], 0) && !(next && from_anchor(st, v, next->out[0], 0)))
            ok = store_from(st, r->in[0], o, &xi);
    }
    if (ok && next) { /* the second GEMM's operand replaces the row, element by element */
        char y[NAMELEN];
        ix yi;
        ok = forward_ix(st, r->in[0], next->in[0], &xi, &yi, NULL) && emit(st, next->in[0], &yi, y);
        if (ok) kf_cg_printf(b, "                    %s[rr][j] = %s;\n", buf, y);
    }
    st->nmemo = mark;
    st->stats = false;
    kf_cg_puts(b, "                }\n            }\n        }\n        KF_BARRIER;\n");
    return ok;
}

static bool att_try(gen *st, kf_cg_str *s, const kf_node *n, const kf_node *n2, const gemm *gm, const gemm *gm2,
                    bool *taken);

/* Back-to-back (n2 not NULL): after the rows (and their reduction, if any)
 * the second GEMM reads them from kf_row as its left operand, 64 columns of
 * its output at a time, B tiles from memory as above. */
static bool gen_gemm_rows(gen *st, kf_cg_str *s, const kf_node *n, const kf_node *n2) {
    gemm gm, gm2;
    if (!gemm_setup(st, n, &gm)) return false;
    const kf_node *r = st->red;
    /* the reduction after the second GEMM (its rows in kf_row2), or between */
    bool r_after = r && n2 && from_anchor(st, r->in[0], n2->out[0], 0);
    kf_id rowv = r && !r_after ? r->in[0] : n2->in[0]; /* the value kf_row holds */
    const kf_node *who = r && !r_after ? r : n2;
    const kf_type *ot = &st->g->values[n->out[0]].type, *xt = &st->g->values[rowv].type;
    bool lin = xt->rank >= 1 && xt->dims[xt->rank - 1] == ot->dims[ot->rank - 1] && numel_of(xt) == numel_of(ot) &&
               linear_path(st, rowv, n->out[0], 0);
    if (!gm.has_m || !gm.has_n || !lin)
        return fail(st, "node '%s': the rows of '%s' are not the GEMM's output rows (not generated)", kf_node_label(who),
                    kf_node_label(n));
    if (n2) {
        if (!gemm_setup(st, n2, &gm2)) return false;
        const kf_type *yt = &st->g->values[n2->in[0]].type, *ot2 = &st->g->values[n2->out[0]].type;
        bool fits = same_dims(yt, ot) && !gm2.ta && gm2.has_m && gm2.has_n && gm2.M == gm.M && gm2.K == gm.N &&
                    gm2.nb == gm.nb && !from_anchor(st, n2->in[1], n->out[0], 0) &&
                    !(gm2.c && from_anchor(st, gm2.c, n->out[0], 0));
        for (int d = 0; fits && d < gm.nb; d++) fits = ot2->dims[d] == ot->dims[d];
        if (r && !r_after) fits = fits && from_anchor(st, n2->in[0], r->out[0], 0) && linear_path(st, n2->in[0], r->out[0], 0);
        if (r_after) {
            const kf_type *x2 = &st->g->values[r->in[0]].type;
            fits = fits && x2->rank >= 1 && x2->dims[x2->rank - 1] == gm2.N && numel_of(x2) == numel_of(ot2) &&
                   linear_path(st, r->in[0], n2->out[0], 0);
        }
        if (!fits)
            return fail(st, "node '%s': back-to-back '%s' does not read the first GEMM's rows as its left operand (not generated)",
                        kf_node_label(n), kf_node_label(n2));
    }
    if (r) {
        if (!kf_plan_row_epilogue(r))
            return fail(st, "node '%s': %s after a GEMM is not generated (Softmax, LogSoftmax, LayerNormalization, "
                            "RMSNormalization are)", kf_node_label(r), r->op_type);
        for (int j = 1; j < r->nout; j++)
            if (r->out[j] && st->g->values[r->out[j]].nusers + st->g->values[r->out[j]].is_output)
                return fail(st, "node '%s': %s output %d is used (not generated)", kf_node_label(r), r->op_type, j);
        if (!red_setup(st, r)) return false;
        const kf_type *rx = &st->g->values[r->in[0]].type;
        for (int d = 0; d < rx->rank; d++)
            if (rx->dims[d] != 1 && st->mask[d] != (d == rx->rank - 1))
                return fail(st, "node '%s': reduces other axes than the GEMM's row (not generated)", kf_node_label(r));
    }
    if (n2 && r && !r_after) { /* attention: keys streamed (cg_attention.c) */
        bool taken;
        bool ok = att_try(st, s, n, n2, &gm, &gm2, &taken);
        if (taken) return ok;
    }
    int64_t N = gm.N, width = N + (r_after ? gm2.N : 0), rm = ROWS_BYTES / 4 / (width > 0 ? width : 1);
    if (rm > ROWS_MAX) rm = ROWS_MAX;
    if (rm < 1 || gm.M == 0 || N == 0)
        return fail(st, "node '%s': rows of %lld floats do not fit the row tile (not generated)", kf_node_label(who), (long long)N);
    const char *I = st->ity;
    int64_t tm = (gm.M + rm - 1) / rm, nbatch = 1;
    for (int d = 0; d < gm.nb; d++) nbatch *= ot->dims[d];
    int64_t ntiles = nbatch * tm;
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup(n2 ? "kf_gemm_b2b" : "kf_gemm_rows"))) return fail_oom(st);
    st->k->block = GEMM_WG;
    st->k->numel = ntiles * GEMM_WG;

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    kf_cg_printf(&body, "        const %s tm = tile %% %lld;\n", I, (long long)tm);
    if (gm.nb) kf_cg_printf(&body, "        const %s tb = tile / %lld;\n", I, (long long)tm);
    batch_names(st, &gm, ot);
    /* an integer product (MatMulInteger) sums its 8-bit operands less their
     * zero points exactly in int tiles and accumulators (K <= INT_SUM_MAX_K,
     * checked by gemm_setup); the epilogue scales the sums into the rows */
    const char *T = acc_type(st);
    kf_cg_printf(&body, "        for (%s c0 = 0; c0 < %lld; c0 += %d) {\n", I, (long long)N, GEMM_TN);
    kf_cg_printf(&body, "        %s acc[4];\n"
                        "        for (int q = 0; q < 4; q++) acc[q] = 0;\n", T);
    kf_cg_printf(&body, "        for (%s k0 = 0; k0 < %lld; k0 += %d) {\n", I, (long long)gm.K, GEMM_TK);
    char base[48]; /* "tm * 16" */
    snprintf(base, sizeof base, "tm * %lld", (long long)rm);
    bool ok = tile_loads(st, n, &gm, (int)rm, base, "c0");
    kf_cg_printf(&body, "            KF_BARRIER;\n"
                        "            if (ty < %lld)\n"
                        "                for (int kk = 0; kk < 16; kk++) {\n"
                        "                    const %s fa = kf_as[kk][ty];\n"
                        "                    for (int q = 0; q < 4; q++) acc[q] += fa * kf_bs[kk][tx + 16 * q];\n"
                        "                }\n"
                        "            KF_BARRIER;\n"
                        "        }\n", (long long)rm, T);
    kf_cg_printf(&body, "        const %s gm = tm * %lld + ty;\n", I, (long long)rm);
    kf_cg_puts(&body, "        for (int q = 0; q < 4; q++) {\n");
    kf_cg_printf(&body, "            const %s gn = c0 + tx + 16 * q;\n", I);
    kf_cg_printf(&body, "            if (ty < %lld && gm < %lld && gn < %lld) {\n", (long long)rm, (long long)gm.M, (long long)N);
    st->ind = "                ";
    ix oi;
    kf_cg_str rhs = {0};
    uint32_t mark = st->nmemo;
    st->red = r && !r_after ? r : n2; /* the epilogue stops at the value kf_row holds */
    ok = ok && anchor_value(st, n, &gm, "acc[q]", &oi, &rhs) && epilogue(st, n->out[0], &oi, rhs.p, "kf_row[ty][gn]");
    st->red = r;
    st->nmemo = mark;
    kf_cg_str_release(&rhs);
    kf_cg_puts(&body, "            }\n        }\n        }\n        KF_BARRIER;\n");
    if (r && !r_after) ok = ok && row_pass(st, r, &gm, ot, rm, "kf_row", n2);
    if (n2) {
        const kf_type *ot2 = &st->g->values[n2->out[0]].type;
        st->red = NULL;
        kf_cg_printf(&body, "        for (%s c0 = 0; c0 < %lld; c0 += %d) {\n", I, (long long)gm2.N, GEMM_TN);
        kf_cg_puts(&body, "        float acc[4];\n"
                          "        for (int q = 0; q < 4; q++) acc[q] = 0.0f;\n");
        kf_cg_printf(&body, "        for (%s k0 = 0; k0 < %lld; k0 += %d) {\n", I, (long long)gm2.K, GEMM_TK);
        ok = ok && tile_loads(st, n2, &gm2, 0, "", "c0");
        kf_cg_printf(&body, "            KF_BARRIER;\n"
                            "            if (ty < %lld)\n"
                            "                for (int kk = 0; kk < 16 && k0 + kk < %lld; kk++) {\n"
                            "                    const float fa = kf_row[ty][k0 + kk];\n"
                            "                    for (int q = 0; q < 4; q++) acc[q] += fa * kf_bs[kk][tx + 16 * q];\n"
                            "                }\n"
                            "            KF_BARRIER;\n"
                            "        }\n", (long long)rm, (long long)gm2.K);
        kf_cg_printf(&body, "        const %s gm = tm * %lld + ty;\n", I, (long long)rm);
        kf_cg_puts(&body, "        for (int q = 0; q < 4; q++) {\n");
        kf_cg_printf(&body, "            const %s gn = c0 + tx + 16 * q;\n", I);
        kf_cg_printf(&body, "            if (ty < %lld && gm < %lld && gn < %lld) {\n", (long long)rm, (long long)gm2.M,
                     (long long)gm2.N);
        st->ind = "                ";
        kf_cg_str rhs2 = {0};
        ix oi2;
        mark = st->nmemo;
        st->red = r_after ? r : NULL; /* the epilogue stops at r's input, kept in kf_row2 */
        ok = ok && anchor_value(st, n2, &gm2, "acc[q]", &oi2, &rhs2) &&
             epilogue(st, n2->out[0], &oi2, rhs2.p, r_after ? "kf_row2[ty][gn]" : NULL);
        st->nmemo = mark;
        kf_cg_str_release(&rhs2);
        kf_cg_puts(&body, "            }\n        }\n        }\n        KF_BARRIER;\n");
        st->red = r;
        if (r_after) ok = ok && row_pass(st, r, &gm2, ot2, rm, "kf_row2", NULL);
    }
    if (ok) {
        header(st, s, !n2 ? "GEMM + row reduction" : !r ? "GEMM -> GEMM" : r_after ? "GEMM -> GEMM + row reduction"
                                                                                : "GEMM + row reduction -> GEMM");
        kf_cg_printf(s, "    KF_SHARED %s kf_as[%d][%lld];\n", T, GEMM_TK, (long long)rm + 1);
        kf_cg_printf(s, "    KF_SHARED %s kf_bs[%d][%d];\n", T, GEMM_TK, GEMM_TN);
        kf_cg_printf(s, "    KF_SHARED float kf_row[%lld][%lld];\n", (long long)rm, (long long)N);
        if (r_after) kf_cg_printf(s, "    KF_SHARED float kf_row2[%lld][%lld];\n", (long long)rm, (long long)gm2.N);
        if (r) kf_cg_printf(s, "    KF_SHARED float kf_red[%d];\n", GEMM_WG);
        kf_cg_puts(s, "    const int tx = KF_LOCAL_ID % 16, ty = KF_LOCAL_ID / 16;\n");
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

/* ---- direct convolution -----------------------------------------------------
 *
 * One work-item per output pixel and CONV_CT consecutive output channels of
 * one group (each input element loaded once serves CONV_CT FMAs); consecutive
 * work-items take consecutive pixels, so input reads and output stores
 * coalesce. The window is walked with the reference's geometry
 * (kf_nn_geom_*: pads, auto_pad, strides, dilations); taps in the padding
 * read 0. Any spatial rank (1-D, 2-D, 3-D), groups and depthwise. */

#define CONV_CT 4 /* output channels per work-item: 4 accumulators, and 4x fewer input loads; 1 when a group's channel count is not a multiple */

/* A Conv's shapes and window, checked. */
typedef struct conv {
    const kf_type *xt, *wt, *ot;
    kf_nn_geom g;
    int nsp;
    int64_t N, C, M, cg, mg, npix; /* cg, mg: input/output channels per group */
} conv;

static bool conv_setup(gen *st, const kf_node *n, conv *cv) {
    if (!real_operand(st, n, 0) || !real_operand(st, n, 1)) return false;
    const kf_type *xt = &st->g->values[n->in[0]].type, *wt = &st->g->values[n->in[1]].type,
                  *ot = &st->g->values[n->out[0]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(wt) || !kf_type_is_static(ot) || xt->rank < 3 ||
        wt->rank != xt->rank || ot->rank != xt->rank)
        return fail(st, "node '%s': Conv shapes are not static N-d", kf_node_label(n));
    *cv = (conv){.xt = xt, .wt = wt, .ot = ot, .nsp = xt->rank - 2};
    if (kf_nn_geom_parse(n, cv->nsp, wt->dims + 2, true, false, &cv->g) != KF_OK)
        return fail(st, "node '%s': Conv attributes are not valid", kf_node_label(n));
    for (int d = 0; d < cv->nsp; d++) cv->g.in[d] = xt->dims[2 + d];
    if (kf_nn_geom_forward(n, &cv->g) != KF_OK) return fail(st, "node '%s': Conv window geometry", kf_node_label(n));
    int64_t group = kf_attr_i(n, "group", 1);
    cv->N = xt->dims[0];
    cv->C = xt->dims[1];
    cv->M = ot->dims[1];
    for (int d = 0; d < cv->nsp; d++)
        if (cv->g.out[d] != ot->dims[2 + d]) return fail(st, "node '%s': Conv output dims disagree (internal)", kf_node_label(n));
    if (group < 1 || cv->C % group || cv->M % group || wt->dims[1] != cv->C / group || wt->dims[0] != cv->M)
        return fail(st, "node '%s': Conv channels do not match group %lld", kf_node_label(n), (long long)group);
    if (!st->iacc && n->nin > 2 && n->in[2] && !real_operand(st, n, 2)) return false;
    cv->cg = cv->C / group;
    cv->mg = cv->M / group;
    cv->npix = 1;
    for (int d = 0; d < cv->nsp; d++) cv->npix *= ot->dims[2 + d];
    return true;
}

/* The window loops of output channels co, co1, ... (ct of them, one group)
 * at pixel (nb, o0, o1, ...), accumulating into acc0.. (declared by the
 * caller), written at indentation ind. */
static bool conv_taps(gen *st, const kf_node *n, const conv *cv, int ct, const char *ind) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    kf_cg_printf(b, "%sconst %s cbase = co / %lld * %lld;\n", ind, I, (long long)cv->mg, (long long)cv->cg);
    kf_cg_printf(b, "%sfor (%s c = 0; c < %lld; c++) {\n", ind, I, (long long)cv->cg);
    const char *in = deeper(ind);
    kf_cg_printf(b, "%sconst %s ci = cbase + c;\n", in, I);
    kf_cg_str cond = {0};
    for (int d = 0; d < cv->nsp; d++) {
        int64_t k = cv->wt->dims[2 + d], x = cv->xt->dims[2 + d];
        kf_cg_printf(b, "%sfor (%s k%d = 0; k%d < %lld; k%d++) {\n", in, I, d, d, (long long)k, d);
        in = deeper(in);
        kf_cg_printf(b, "%sconst %s s%d = o%d * %lld - %lld + k%d * %lld;\n", in, I, d, d, (long long)cv->g.stride[d],
                     (long long)cv->g.pb[d], d, (long long)cv->g.dil[d]);
        bool pad_lo = cv->g.pb[d] > 0,
             pad_hi = (cv->ot->dims[2 + d] - 1) * cv->g.stride[d] - cv->g.pb[d] + (k - 1) * cv->g.dil[d] >= x;
        if (pad_lo) kf_cg_printf(&cond, "%ss%d >= 0", cond.len ? " && " : "", d);
        if (pad_hi) kf_cg_printf(&cond, "%ss%d < %lld", cond.len ? " && " : "", d, (long long)x);
    }
    st->ind = in;
    ix xi = {.rank = cv->xt->rank};
    snprintf(xi.c[0], NAMELEN, "%s", cv->N == 1 ? "0" : "nb");
    snprintf(xi.c[1], NAMELEN, "ci");
    for (int d = 0; d < cv->nsp; d++) snprintf(xi.c[2 + d], NAMELEN, "s%d", d);
    /* ConvInteger's zero points: x's per tensor, w's per tensor or output channel */
    kf_id zx = st->iacc && n->nin > 2 ? n->in[2] : 0, zw = st->iacc && n->nin > 3 ? n->in[3] : 0;
    ix zi;
    if (zx) param_ix(&st->g->values[zx].type, "0", &zi);
    bool ok = cond.oom ? fail_oom(st) : load_guarded(st, "x", cond.p ? cond.p : "", n->in[0], &xi, zx, &zi, 0);
    kf_cg_str_release(&cond);
    uint32_t mark = st->nmemo;
    for (int q = 0; ok && q < ct; q++) {
        ix wi = {.rank = cv->wt->rank};
        snprintf(wi.c[0], NAMELEN, q ? "co%d" : "co", q);
        snprintf(wi.c[1], NAMELEN, "%s", cv->cg == 1 ? "0" : "c");
        for (int d = 0; d < cv->nsp; d++) snprintf(wi.c[2 + d], NAMELEN, cv->wt->dims[2 + d] == 1 ? "0" : "k%d", d);
        char wv[NAMELEN], z[NAMELEN];
        ok = emit(st, n->in[1], &wi, wv);
        if (ok && zw) {
            ix wz;
            param_ix(&st->g->values[zw].type, wi.c[0], &wz);
            ok = emit(st, zw, &wz, z);
            if (ok) kf_cg_printf(b, "%sacc%d += x * (%s - %s);\n", st->ind, q, wv, z);
        } else if (ok) kf_cg_printf(b, "%sacc%d += x * %s;\n", st->ind, q, wv);
    }
    st->nmemo = mark;
    for (int d = cv->nsp; d >= 0; d--) {
        /* closing braces back out to ind */
        size_t w = strlen(ind) + 4 * (size_t)d;
        kf_cg_printf(b, "%.*s}\n", (int)w, "                                                            ");
    }
    st->ind = ind;
    return ok;
}

/* The anchor's output index of channel name ch at pixel (nb, o0, ...). */
static void conv_out_ix(const conv *cv, const char *ch, ix *oi) {
    *oi = (ix){.rank = cv->ot->rank};
    snprintf(oi->c[0], NAMELEN, "%s", cv->N == 1 ? "0" : "nb");
    snprintf(oi->c[1], NAMELEN, "%s", cv->M == 1 ? "0" : ch);
    for (int d = 0; d < cv->nsp; d++) snprintf(oi->c[2 + d], NAMELEN, cv->ot->dims[2 + d] == 1 ? "0" : "o%d", d);
}

/* acc<q> + bias[channel] as the anchor value's expression. */
static bool conv_value(gen *st, const kf_node *n, const ix *oi, int q, char *rhs, size_t len) {
    snprintf(rhs, len, "acc%d", q);
    if (!st->iacc && n->nin > 2 && n->in[2]) {
        ix b1 = {.rank = 1};
        char bv[NAMELEN];
        snprintf(b1.c[0], NAMELEN, "%s", oi->c[1]);
        if (!emit(st, n->in[2], &b1, bv)) return false;
        snprintf(rhs, len, "acc%d + %s", q, bv);
    }
    return true;
}

/* ---- integer convolution on tensor cores ---------------------------------------
 *
 * A ConvInteger of one group (kf_iconv_tile) as an implicit GEMM: output
 * channels are the rows (A: the weights as [M, C x taps], contiguous in k),
 * batch x output pixels the columns (B: the input's window values, gathered
 * as they load; consecutive work-items take consecutive pixels). A
 * work-group of 4 warps owns a T x T tile, each warp a T/2 x T/2 quarter of
 * 16 x 8 fragments; k advances 32 at a time through kf_a[T][12] and
 * kf_b[T][12]: 8 words of four int8 k values per row (column), padded to 12
 * words so the eight rows a fragment reads fall in distinct banks. The
 * products are the prelude's KF_MMA_I8: tensor cores on CUDA, the exact
 * twin on OpenCL, so both give the same int sums.
 *
 * The lanes are signed: uint8 operands move to int8 by subtracting 128 as
 * they load, their zero points with them. Padding loads the input's zero
 * point, so (x - zx) is 0 there as ConvInteger asks; past K and past the
 * tile edges both operands load 0. The zero points come after the sums,
 * as in the integer GEMM:
 *
 *   sum (x - zx)(w - zw) = sum xw - zw sum x - zx sum w + K zx zw
 *
 * with sum w per row and sum x per column accumulated by the work-items
 * that load them and gathered through shared memory after the k loop, only
 * where the other zero point is not 0. K <= INT_SUM_MAX_K keeps every
 * partial result in an int. */

#define ICONV_WG 128 /* 4 warps */
#define ICONV_LD 12  /* shared words per row / column of a tile */

/* The float8 form of Conv n in the group being generated, into *mm: both
 * DequantizeLinears members, their float8 values group inputs. */
static bool f8conv_operands(gen *st, const kf_node *n, mma8 *mm) {
    kf_dtype f[2];
    if (st->iacc || !kf_fp8_conv(st->m, n, f)) return false;
    kf_id d[2];
    for (int i = 0; i < 2; i++) {
        d[i] = st->g->values[n->in[i]].producer;
        const kf_node *dn = &st->g->nodes[d[i]];
        if (st->p->group_of[d[i]] != st->gi || param_of(st, dn->in[0]) < 0) return false;
    }
    *mm = (mma8){.x = st->g->nodes[d[0]].in[0], .w = st->g->nodes[d[1]].in[0], .sx = st->g->nodes[d[0]].in[1],
                 .sw = st->g->nodes[d[1]].in[1], .fx = f[0], .fw = f[1]};
    return true;
}

/* Register reg (an int) gets the code of float8 value v (a group input) at
 * index at where cond holds, else 0. */
static void load_code(gen *st, const char *reg, const char *cond, kf_id v, const ix *at) {
    const char *outer = st->ind;
    char off[NAMELEN];
    kf_cg_printf(st->s, "%sint %s = 0;\n%sif (%s) {\n", outer, reg, outer, cond);
    st->ind = deeper(outer);
    offset_of(st, &st->g->values[v].type, at, off);
    kf_cg_printf(st->s, "%s%s = in%d[%s];\n%s}\n", st->ind, reg, param_of(st, v), off, outer);
    st->ind = outer;
}

/* The names ci<j> and q<d>_<j> (input channel and window tap) of the k
 * value named gk<j>, written at the current indentation. */
static void iconv_k_split(gen *st, const conv *cv, int j) {
    const char *I = st->ity;
    int64_t taps = 1;
    for (int d = 0; d < cv->nsp; d++) taps *= cv->wt->dims[2 + d];
    if (taps == 1) kf_cg_printf(st->s, "%sconst %s ci%d = gk%d;\n", st->ind, I, j, j);
    else kf_cg_printf(st->s, "%sconst %s ci%d = gk%d / %lld;\n", st->ind, I, j, j, (long long)taps);
    int64_t stride = 1;
    for (int d = cv->nsp - 1; d >= 0; d--) {
        int64_t kd = cv->wt->dims[2 + d];
        if (kd > 1)
            kf_cg_printf(st->s, "%sconst %s q%d_%d = (gk%d / %lld) %% %lld;\n", st->ind, I, d, j, j, (long long)stride,
                         (long long)kd);
        stride *= kd;
    }
}

/* One k step's loads of one operand for the slot of work-item
 * KF_LOCAL_ID + ICONV_WG * slot: the weights' row e / 8, word e % 8
 * (is_w), or the input's column e % T, word e / T; four values packed into
 * the shared tile, their sum added to register sum (when not NULL). */
static bool iconv_load(gen *st, const kf_node *n, const conv *cv, const mma8 *mm, bool is_w, int T, int slot,
                       const char *sum, int64_t K) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    kf_id v = is_w ? mm->w : mm->x, zx = !is_w && !mm->sx && n->nin > 2 ? n->in[2] : 0;
    int shift = st->g->values[v].type.dtype == KF_DT_UINT8 ? 128 : 0;
    int64_t NP = cv->N * cv->npix;
    kf_cg_printf(b, "            {\n                const int e = KF_LOCAL_ID + %d;\n", ICONV_WG * slot);
    st->ind = "                ";
    if (is_w) {
        kf_cg_printf(b, "                const int lr = e / 8, word = e %% 8;\n");
        kf_cg_printf(b, "                const %s gm = tm * %d + lr;\n", I, T);
    } else {
        kf_cg_printf(b, "                const int lc = e %% %d, word = e / %d;\n", T, T);
        kf_cg_printf(b, "                const %s gc = tn * %d + lc;\n", I, T);
        kf_cg_printf(b, "                const %s nb = gc / %lld;\n", I, (long long)cv->npix);
        int64_t stride = 1;
        for (int d = cv->nsp - 1; d >= 0; d--) {
            kf_cg_printf(b, "                const %s o%d = (gc / %lld) %% %lld;\n", I, d, (long long)stride,
                         (long long)cv->ot->dims[2 + d]);
            stride *= cv->ot->dims[2 + d];
        }
    }
    bool ok = true;
    int wp = is_w && K % 4 == 0 ? param_of(st, v) : -1;
    if (wp >= 0) {
        /* weights read as they are stored (a kernel parameter, rows of K a
         * multiple of 4): a word at a time, uint8 moved to int8 lane by lane
         * (x - 128 is x with its top bit flipped) */
        kf_cg_printf(b, "                int wv = 0;\n"
                        "                if (gm < %lld && k0 + word * 4 < %lld) wv = KF_LOAD_W4(in%d, (gm * %lld + k0 + word * 4) / 4)%s;\n"
                        "                kf_a[lr * %d + word] = wv;\n",
                     (long long)cv->M, (long long)K, wp, (long long)K, shift ? " ^ (int)0x80808080u" : "", ICONV_LD);
        if (sum) kf_cg_printf(b, "                %s = KF_DOT4(wv, 0x01010101, %s);\n", sum, sum);
        kf_cg_puts(b, "            }\n");
        return true;
    }
    for (int j = 0; ok && j < 4; j++) {
        kf_cg_printf(b, "                const %s gk%d = k0 + word * 4 + %d;\n", I, j, j);
        iconv_k_split(st, cv, j);
        char reg[8], kcond[96], cond[512]; /* a few compares of names with numbers */
        snprintf(reg, sizeof reg, "x%d", j);
        snprintf(kcond, sizeof kcond, "%s < %lld && gk%d < %lld", is_w ? "gm" : "gc", (long long)(is_w ? cv->M : NP), j,
                 (long long)K);
        ix at = {.rank = cv->xt->rank};
        char inside[384] = "";
        if (is_w) {
            snprintf(at.c[0], NAMELEN, "%s", cv->M == 1 ? "0" : "gm");
            snprintf(at.c[1], NAMELEN, cv->cg == 1 ? "0" : "ci%d", j);
            for (int d = 0; d < cv->nsp; d++) snprintf(at.c[2 + d], NAMELEN, cv->wt->dims[2 + d] == 1 ? "0" : "q%d_%d", d, j);
            /* the weights are contiguous in k: their offset without the split */
            kf_cg_printf(b, "                const %s kw%d = gm * %lld + gk%d;\n", I, j, (long long)K, j);
            snprintf(at.lin, NAMELEN, "kw%d", j);
        } else {
            snprintf(at.c[0], NAMELEN, "%s", cv->N == 1 ? "0" : "nb");
            snprintf(at.c[1], NAMELEN, cv->C == 1 ? "0" : "ci%d", j);
            size_t il = 0;
            for (int d = 0; d < cv->nsp; d++) {
                int64_t kd = cv->wt->dims[2 + d], x = cv->xt->dims[2 + d];
                kf_cg_printf(b, "                const %s s%d_%d = o%d * %lld - %lld", I, d, j, d, (long long)cv->g.stride[d],
                             (long long)cv->g.pb[d]);
                if (kd > 1) kf_cg_printf(b, " + q%d_%d * %lld", d, j, (long long)cv->g.dil[d]);
                kf_cg_puts(b, ";\n");
                snprintf(at.c[2 + d], NAMELEN, "s%d_%d", d, j);
                bool lo = cv->g.pb[d] > 0,
                     hi = (cv->ot->dims[2 + d] - 1) * cv->g.stride[d] - cv->g.pb[d] + (kd - 1) * cv->g.dil[d] >= x;
                if (lo) il += (size_t)snprintf(inside + il, sizeof inside - il, "%ss%d_%d >= 0", il ? " && " : "", d, j);
                if (hi && il < sizeof inside)
                    il += (size_t)snprintf(inside + il, sizeof inside - il, "%ss%d_%d < %lld", il ? " && " : "", d, j,
                                           (long long)x);
                if (il >= sizeof inside) return fail(st, "node '%s': window condition too long (internal)", kf_node_label(n));
            }
        }
        snprintf(cond, sizeof cond, "%s%s%s", kcond, inside[0] ? " && " : "", inside);
        if (mm->sx) {
            load_code(st, reg, cond, v, &at);
            continue;
        }
        ok = load_guarded(st, reg, cond, v, &at, 0, NULL, shift);
        /* padding reads the zero point (as the lanes hold it): 0 difference */
        if (ok && inside[0] && (zx || shift)) {
            char z[NAMELEN + 16]; /* "(name - 128)" */
            uint32_t mark = st->nmemo;
            kf_cg_printf(b, "                if (%s && !(%s)) {\n", kcond, inside);
            st->ind = "                    ";
            ok = izero(st, v, zx, "0", z, sizeof z);
            if (ok) kf_cg_printf(b, "                    %s = %s;\n", reg, z);
            kf_cg_puts(b, "                }\n");
            st->ind = "                ";
            st->nmemo = mark;
        }
    }
    if (is_w) kf_cg_printf(b, "                kf_a[lr * %d + word] = KF_PACK4(x0, x1, x2, x3);\n", ICONV_LD);
    else kf_cg_printf(b, "                kf_b[lc * %d + word] = KF_PACK4(x0, x1, x2, x3);\n", ICONV_LD);
    if (sum) kf_cg_printf(b, "                %s += x0 + x1 + x2 + x3;\n", sum);
    kf_cg_puts(b, "            }\n");
    return ok;
}

/* One k step's loads of a MatMulInteger operand on the 8-bit tile for the
 * slot of work-item KF_LOCAL_ID + ICONV_WG * slot: A's row e / 8, word e % 8
 * (is_a: rows are contiguous in k, eight work-items read one row's 32 k),
 * or B's column e % T, word e / T (consecutive work-items read consecutive
 * columns); four values at k0 + 4 word + j as int8 lanes, 0 past M, N and
 * K, packed into the shared tile, their sum added to register sum (when not
 * NULL). Batch dims broadcast through operand_ix; ot is the output's type. */
static bool gemm8_load(gen *st, const gemm *gm, const kf_type *ot, bool is_a, int T, int slot, const char *sum) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    kf_id v = is_a ? gm->a : gm->b;
    const kf_type *t = &st->g->values[v].type;
    int shift = t->dtype == KF_DT_UINT8 ? 128 : 0;
    kf_cg_printf(b, "            {\n                const int e = KF_LOCAL_ID + %d;\n", ICONV_WG * slot);
    st->ind = "                ";
    if (is_a) kf_cg_printf(b, "                const int lr = e / 8, word = e %% 8;\n                const %s gm = tm * %d + lr;\n", I, T);
    else kf_cg_printf(b, "                const int lc = e %% %d, word = e / %d;\n                const %s gn = tn * %d + lc;\n", T, T, I, T);
    /* A read as it is stored (a kernel parameter, rows of K a multiple of 4,
     * 2-D or with the output's batch dims): a word at a time, as the conv's
     * weights (uint8 lanes moved to int8 by flipping their top bits) */
    bool stored = is_a && gm->K % 4 == 0 && (t->rank == 2 || t->rank - 2 == gm->nb);
    for (int d = 0; stored && d < t->rank - 2; d++) stored = t->dims[d] == ot->dims[d];
    int wp = stored ? param_of(st, v) : -1;
    if (wp >= 0) {
        char row[64]; /* "(tb * 123456789 + gm)" */
        if (t->rank > 2) snprintf(row, sizeof row, "(tb * %lld + gm)", (long long)gm->M);
        else snprintf(row, sizeof row, "gm");
        kf_cg_printf(b, "                int wv = 0;\n"
                        "                if (gm < %lld && k0 + word * 4 < %lld) wv = KF_LOAD_W4(in%d, (%s * %lld + k0 + word * 4) / 4)%s;\n"
                        "                kf_a[lr * %d + word] = wv;\n",
                     (long long)gm->M, (long long)gm->K, wp, row, (long long)gm->K, shift ? " ^ (int)0x80808080u" : "",
                     ICONV_LD);
        if (sum) kf_cg_printf(b, "                %s = KF_DOT4(wv, 0x01010101, %s);\n", sum, sum);
        kf_cg_puts(b, "            }\n");
        return true;
    }
    bool ok = true;
    for (int j = 0; ok && j < 4; j++) {
        char gk[8], reg[8], cond[128]; /* two compares of a name with a number */
        snprintf(gk, sizeof gk, "gk%d", j);
        snprintf(reg, sizeof reg, "x%d", j);
        kf_cg_printf(b, "                const %s %s = k0 + word * 4 + %d;\n", I, gk, j);
        if (is_a) snprintf(cond, sizeof cond, "gm < %lld && %s < %lld", (long long)gm->M, gk, (long long)gm->K);
        else snprintf(cond, sizeof cond, "%s < %lld && gn < %lld", gk, (long long)gm->K, (long long)gm->N);
        ix at;
        operand_ix(gm, t, is_a, is_a ? "gm" : gk, is_a ? gk : "gn", &at);
        ok = load_guarded(st, reg, cond, v, &at, 0, NULL, shift);
    }
    if (is_a) kf_cg_printf(b, "                kf_a[lr * %d + word] = KF_PACK4(x0, x1, x2, x3);\n", ICONV_LD);
    else kf_cg_printf(b, "                kf_b[lc * %d + word] = KF_PACK4(x0, x1, x2, x3);\n", ICONV_LD);
    if (sum) kf_cg_printf(b, "                %s += x0 + x1 + x2 + x3;\n", sum);
    kf_cg_puts(b, "            }\n");
    return ok;
}

/* The 8-bit tensor-core tile: a convolution's implicit GEMM (cvp; mm its
 * operands: the weights are the rows, the gathered input the columns) or
 * a MatMulInteger (gmp; A the rows, B the columns, per batch of the
 * output), in T x T tiles. The sums, zero points and epilogue are the
 * same for both: only the loads, the output coordinates and which zero
 * point goes with which operand differ. */
static bool gen_mma8(gen *st, kf_cg_str *s, const kf_node *n, const conv *cvp, const gemm *gmp, const mma8 *mm, int T) {
    const char *I = st->ity;
    const bool f8 = mm->sx != 0;
    const kf_type *ot = &st->g->values[n->out[0]].type;
    int64_t M, NP, K, nbatch = 1;
    if (cvp) {
        M = cvp->M;
        NP = cvp->N * cvp->npix;
        K = numel_of(cvp->wt) / (M > 0 ? M : 1);
    } else {
        M = gmp->M;
        NP = gmp->N;
        K = gmp->K;
        for (int d = 0; d < gmp->nb; d++) nbatch *= ot->dims[d];
    }
    int64_t tm = (M + T - 1) / T, tn = (NP + T - 1) / T, ntiles = nbatch * tm * tn;
    if (ntiles > INT32_MAX / ICONV_WG) return fail(st, "node '%s': %lld tiles (not generated)", kf_node_label(n), (long long)ntiles);
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup(f8 ? "kf_f8conv" : cvp ? "kf_iconv" : "kf_imma"))) return fail_oom(st);
    st->k->block = ICONV_WG;
    st->k->numel = ntiles * ICONV_WG;
    if (f8) st->k->parts |= KF_CG_PART_F8 | KF_CG_PART_F8MMA;
    const int slots = T * 8 / ICONV_WG, wt = T / 2, mt = wt / 16, nt = wt / 8;
    /* the rows' and the columns' zero points (ConvInteger: the weights' is
     * per channel, the input's per tensor; MatMulInteger: A's per row or
     * tensor, B's per column or tensor) */
    kf_id zcol = 0, zrow = 0;
    const char *zcol_at = "0";
    if (cvp && !f8) zcol = n->nin > 2 ? n->in[2] : 0, zrow = n->nin > 3 ? n->in[3] : 0;
    if (gmp) zrow = gmp->za, zcol = gmp->zb, zcol_at = "gn";
    /* row sums matter when the columns' zero point (as int8) is not 0, column sums when the rows' is not */
    bool rows = zcol || st->g->values[mm->x].type.dtype == KF_DT_UINT8;
    bool cols = zrow || st->g->values[mm->w].type.dtype == KF_DT_UINT8;

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    if (gmp) tile_coords(st, gmp, ot, tm, tn);
    else {
        kf_cg_printf(&body, "        const %s tn = tile %% %lld;\n", I, (long long)tn);
        kf_cg_printf(&body, "        const %s tm = tile / %lld;\n", I, (long long)tn);
    }
    kf_cg_printf(&body, "        %s acc[%d][%d][4];\n"
                        "        KF_UNROLL for (int p = 0; p < %d; p++)\n"
                        "            KF_UNROLL for (int q = 0; q < %d; q++) acc[p][q][0] = acc[p][q][1] = acc[p][q][2] = acc[p][q][3] = 0;\n",
                 f8 ? "float" : "int", mt, nt, mt, nt);
    for (int sl = 0; sl < slots; sl++) {
        if (rows) kf_cg_printf(&body, "        int ra%d = 0;\n", sl);
        if (cols) kf_cg_printf(&body, "        int cb%d = 0;\n", sl);
    }
    kf_cg_printf(&body, "        for (%s k0 = 0; k0 < %lld; k0 += 32) {\n", I, (long long)K);
    bool ok = true;
    for (int pass = 0; pass < 2; pass++)
        for (int sl = 0; ok && sl < slots; sl++) {
            char sum[8];
            snprintf(sum, sizeof sum, pass ? "cb%d" : "ra%d", sl);
            const char *use = (pass ? cols : rows) ? sum : NULL;
            ok = cvp ? iconv_load(st, n, cvp, mm, !pass, T, sl, use, K) : gemm8_load(st, gmp, ot, !pass, T, sl, use);
        }
    kf_cg_printf(&body, "            KF_BARRIER;\n"
                        "            KF_UNROLL for (int p = 0; p < %d; p++)\n"
                        "                KF_UNROLL for (int q = 0; q < %d; q++)\n"
                        "                    %s(acc[p][q], kf_a, (wr * %d + p * 16) * %d, %d, kf_b, (wc * %d + q * 8) * %d, %d, lane",
                 mt, nt, f8 ? "KF_MMA_F8" : "KF_MMA_I8", wt, ICONV_LD, ICONV_LD, wt, ICONV_LD, ICONV_LD);
    if (f8) {
        const small_float *fw = small_float_of(mm->fw), *fx = small_float_of(mm->fx);
        kf_cg_printf(&body, ", \"%s\", \"%s\", %s, %s", mm->fw == KF_DT_FLOAT8E5M2 ? "e5m2" : "e4m3",
                     mm->fx == KF_DT_FLOAT8E5M2 ? "e5m2" : "e4m3", fw->fmt, fx->fmt);
    }
    kf_cg_puts(&body, ");\n"
                      "            KF_BARRIER;\n"
                      "        }\n");
    if (rows || cols) {
        for (int sl = 0; sl < slots; sl++) {
            if (rows) kf_cg_printf(&body, "        kf_ra[KF_LOCAL_ID + %d] = ra%d;\n", ICONV_WG * sl, sl);
            if (cols) kf_cg_printf(&body, "        kf_cb[KF_LOCAL_ID + %d] = cb%d;\n", ICONV_WG * sl, sl);
        }
        kf_cg_puts(&body, "        KF_BARRIER;\n");
    }
    kf_cg_printf(&body, "        KF_UNROLL for (int p = 0; p < %d; p++)\n"
                        "            KF_UNROLL for (int q = 0; q < %d; q++)\n"
                        "                KF_UNROLL for (int f = 0; f < 4; f++) {\n"
                        "                    const int lr = wr * %d + p * 16 + lane / 4 + 8 * (f / 2);\n"
                        "                    const int lc = wc * %d + q * 8 + 2 * (lane %% 4) + f %% 2;\n"
                        "                    const %s gm = tm * %d + lr;\n"
                        "                    const %s gc = tn * %d + lc;\n",
                 mt, nt, wt, wt, I, T, I, T);
    kf_cg_printf(&body, "                    if (gm < %lld && gc < %lld) {\n", (long long)M, (long long)NP);
    const char *ind = "                        ";
    st->ind = ind;
    if (cvp) {
        kf_cg_printf(&body, "%sconst %s nb = gc / %lld;\n", ind, I, (long long)cvp->npix);
        int64_t stride = 1;
        for (int d = cvp->nsp - 1; d >= 0; d--) {
            kf_cg_printf(&body, "%sconst %s o%d = (gc / %lld) %% %lld;\n", ind, I, d, (long long)stride,
                         (long long)cvp->ot->dims[2 + d]);
            stride *= cvp->ot->dims[2 + d];
        }
    } else kf_cg_printf(&body, "%sconst %s gn = gc;\n", ind, I);
    if (rows) kf_cg_printf(&body, "%sconst int sw = kf_ra[lr * 8] + kf_ra[lr * 8 + 1] + kf_ra[lr * 8 + 2] + kf_ra[lr * 8 + 3] + "
                                  "kf_ra[lr * 8 + 4] + kf_ra[lr * 8 + 5] + kf_ra[lr * 8 + 6] + kf_ra[lr * 8 + 7];\n", ind);
    if (cols) {
        kf_cg_printf(&body, "%sconst int sx = kf_cb[lc]", ind);
        for (int w = 1; w < 8; w++) kf_cg_printf(&body, " + kf_cb[%d + lc]", w * T);
        kf_cg_puts(&body, ";\n");
    }
    uint32_t mark = st->nmemo;
    kf_cg_str sum = {0}, rhs = {0};
    kf_cg_puts(&sum, "(acc[p][q][f]");
    if (f8) {
        /* the float8 sums scaled as the DequantizeLinears scale, then Conv's bias */
        char sxv[NAMELEN], swv[NAMELEN], bv[NAMELEN];
        ix si, wi;
        param_ix(&st->g->values[mm->sx].type, "0", &si);
        param_ix(&st->g->values[mm->sw].type, "gm", &wi);
        ok = ok && emit(st, mm->sx, &si, sxv) && emit(st, mm->sw, &wi, swv);
        if (ok) kf_cg_printf(&sum, " * (%s * %s)", sxv, swv);
        if (ok && n->nin > 2 && n->in[2]) {
            ix bi = {.rank = 1};
            snprintf(bi.c[0], NAMELEN, "gm");
            ok = emit(st, n->in[2], &bi, bv);
            if (ok) kf_cg_printf(&sum, " + %s", bv);
        }
    } else {
        char zcs[NAMELEN + 16], zrs[NAMELEN + 16]; /* "(name - 128)" */
        ok = ok && izero(st, mm->x, zcol, zcol_at, zcs, sizeof zcs) && izero(st, mm->w, zrow, "gm", zrs, sizeof zrs);
        if (cols) kf_cg_printf(&sum, " - %s * sx", zrs);
        if (rows) kf_cg_printf(&sum, " - %s * sw", zcs);
        if (rows && cols) kf_cg_printf(&sum, " + %lld * %s * %s", (long long)K, zcs, zrs);
    }
    kf_cg_puts(&sum, ")");
    if (sum.oom) ok = fail_oom(st);
    ix oi;
    if (cvp) {
        conv_out_ix(cvp, "gm", &oi);
        ok = ok && epilogue(st, n->out[0], &oi, sum.p, NULL);
    } else ok = ok && anchor_value(st, n, gmp, sum.p, &oi, &rhs) && epilogue(st, n->out[0], &oi, rhs.p, NULL);
    st->nmemo = mark;
    kf_cg_str_release(&sum);
    kf_cg_str_release(&rhs);
    kf_cg_puts(&body, "                    }\n                }\n");
    if (ok) {
        char title[96];
        if (cvp)
            snprintf(title, sizeof title, "%s convolution on tensor cores (implicit GEMM, %d x %d tiles)",
                     f8 ? "float8" : "integer", T, T);
        else snprintf(title, sizeof title, "integer GEMM on tensor cores (%d x %d tiles)", T, T);
        header(st, s, title);
        kf_cg_printf(s, "    KF_SHARED int kf_a[%d] KF_ALIGN16;\n    KF_SHARED int kf_b[%d] KF_ALIGN16;\n", T * ICONV_LD,
                     T * ICONV_LD);
        if (rows) kf_cg_printf(s, "    KF_SHARED int kf_ra[%d];\n", T * 8);
        if (cols) kf_cg_printf(s, "    KF_SHARED int kf_cb[%d];\n", T * 8);
        kf_cg_puts(s, "    const int lane = KF_LOCAL_ID % 32, warp = KF_LOCAL_ID / 32;\n"
                      "    const int wr = warp / 2, wc = warp % 2;\n");
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

static bool gen_conv(gen *st, kf_cg_str *s, const kf_node *n) {
    conv cv;
    if (!conv_setup(st, n, &cv)) return false;
    int iconv_t = st->iacc ? kf_iconv_tile(st->g, n) : 0;
    mma8 mm = {.x = n->in[0], .w = n->in[1]};
    if (iconv_t) return gen_mma8(st, s, n, &cv, NULL, &mm, iconv_t);
    if (f8conv_operands(st, n, &mm)) return gen_mma8(st, s, n, &cv, NULL, &mm, kf_mma_conv_tile(cv.ot));
    int64_t taps = numel_of(cv.wt) / (cv.M > 0 ? cv.M : 1); /* products summed per output */
    if (st->iacc && taps > INT_SUM_MAX_K)
        return fail(st, "node '%s': windows of %lld taps could overflow the int sums (not generated)", kf_node_label(n),
                    (long long)taps);
    int ct = cv.mg % CONV_CT == 0 ? CONV_CT : 1;
    int64_t items = cv.N * (cv.M / ct) * cv.npix;
    if (items > INT32_MAX / 2 && !strcmp(st->ity, "int"))
        return fail(st, "node '%s': %lld work-items need 64-bit indices (not generated)", kf_node_label(n), (long long)items);
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup("kf_conv"))) return fail_oom(st);
    st->k->block = 0;
    st->k->numel = items;

    const char *I = st->ity;
    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    int64_t stride = 1;
    for (int d = cv.nsp - 1; d >= 0; d--) {
        kf_cg_printf(&body, "        const %s o%d = (w / %lld) %% %lld;\n", I, d, (long long)stride, (long long)cv.ot->dims[2 + d]);
        stride *= cv.ot->dims[2 + d];
    }
    kf_cg_printf(&body, "        const %s co = (w / %lld) %% %lld * %d;\n", I, (long long)cv.npix, (long long)(cv.M / ct), ct);
    kf_cg_printf(&body, "        const %s nb = w / %lld;\n", I, (long long)(cv.npix * (cv.M / ct)));
    for (int q = 1; q < ct; q++) kf_cg_printf(&body, "        const %s co%d = co + %d;\n", I, q, q);
    for (int q = 0; q < ct; q++) kf_cg_printf(&body, "        %s acc%d = 0;\n", acc_type(st), q);
    bool ok = conv_taps(st, n, &cv, ct, "        ");
    for (int q = 0; ok && q < ct; q++) {
        kf_cg_puts(&body, "        {\n");
        st->ind = "            ";
        ix oi;
        char ch[NAMELEN], rhs[64]; /* "accN + name" */
        snprintf(ch, NAMELEN, q ? "co%d" : "co", q);
        conv_out_ix(&cv, ch, &oi);
        uint32_t mark = st->nmemo;
        ok = conv_value(st, n, &oi, q, rhs, sizeof rhs) && epilogue(st, n->out[0], &oi, rhs, NULL);
        st->nmemo = mark;
        kf_cg_puts(&body, "        }\n");
    }
    return per_item_kernel(st, s, ok, "direct convolution", items, &body);
}

/* ---- conv -> 1x1 conv (back-to-back) ------------------------------------------
 *
 * A work-group owns P pixels (of N x spatial) and all C1 channels of the first
 * conv's output there, in kf_mid[C1][P] (P = 24 KiB / (4 C1), at most 64):
 * first each (channel, pixel) of the first conv with its epilogue up to the
 * second conv's input (outputs read elsewhere, a residual sum say, are
 * stored on the way), then each (channel, pixel) of the 1x1 conv reads its
 * column of kf_mid, and its epilogue is written. Consecutive work-items take
 * consecutive pixels (coalesced stores, conflict-free shared reads). */

#define MID_BYTES (24 * 1024)
#define MID_MAX_PIX 64 /* a warp-friendly pixel tile; more gives no extra reuse */

static bool gen_conv_b2b(gen *st, kf_cg_str *s, const kf_node *n, const kf_node *n2) {
    conv cv, cv2;
    if (!conv_setup(st, n, &cv) || !conv_setup(st, n2, &cv2)) return false;
    kf_id mid = n2->in[0];
    bool ok1x1 = kf_attr_i(n2, "group", 1) == 1 && cv2.npix == cv.npix && cv2.N == cv.N && cv2.C == cv.M;
    for (int d = 0; d < cv2.nsp; d++)
        ok1x1 = ok1x1 && cv2.wt->dims[2 + d] == 1 && cv2.g.stride[d] == 1 && cv2.g.pb[d] == 0 && cv2.g.pe[d] == 0;
    if (!ok1x1 || !same_dims(&st->g->values[mid].type, cv.ot) || !linear_path(st, mid, n->out[0], 0) ||
        from_anchor(st, n2->in[1], n->out[0], 0) || (n2->nin > 2 && n2->in[2] && from_anchor(st, n2->in[2], n->out[0], 0)))
        return fail(st, "node '%s': back-to-back '%s' is not a 1x1 conv of the first conv's elementwise output (not generated)",
                    kf_node_label(n), kf_node_label(n2));
    int64_t P = MID_BYTES / 4 / (cv.M > 0 ? cv.M : 1);
    if (P > MID_MAX_PIX) P = MID_MAX_PIX;
    int64_t NP = cv.N * cv.npix;
    if (P < 1 || NP == 0) return fail(st, "node '%s': %lld channels do not fit the pixel tile", kf_node_label(n), (long long)cv.M);
    int64_t ntiles = (NP + P - 1) / P;
    if (ntiles > INT32_MAX / GEMM_WG) return fail(st, "node '%s': %lld tiles (not generated)", kf_node_label(n), (long long)ntiles);
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup("kf_conv_b2b"))) return fail_oom(st);
    st->k->block = GEMM_WG;
    st->k->numel = ntiles * GEMM_WG;

    const char *I = st->ity;
    kf_cg_str body = {0};
    st->s = &body;
    /* pixel names of pixel gp: nb and o0.. */
    char pix[2][512]; /* the split of gp for each phase: a few short lines */
    for (int ph = 0; ph < 2; ph++) {
        kf_cg_str t = {0};
        int64_t stride = 1;
        for (int d = cv.nsp - 1; d >= 0; d--) {
            kf_cg_printf(&t, "                const %s o%d = (gp / %lld) %% %lld;\n", I, d, (long long)stride, (long long)cv.ot->dims[2 + d]);
            stride *= cv.ot->dims[2 + d];
        }
        kf_cg_printf(&t, "                const %s nb = gp / %lld;\n", I, (long long)cv.npix);
        snprintf(pix[ph], sizeof pix[ph], "%s", t.p ? t.p : "");
        if (t.oom || t.len >= sizeof pix[ph]) body.oom = true;
        kf_cg_str_release(&t);
    }
    /* phase 1: the first conv into kf_mid */
    kf_cg_printf(&body, "        for (int e = KF_LOCAL_ID; e < %lld; e += KF_LOCAL_SIZE) {\n", (long long)(cv.M * P));
    kf_cg_printf(&body, "            const %s co = e / %lld;\n", I, (long long)P);
    kf_cg_printf(&body, "            const %s gp = tile * %lld + e %% %lld;\n", I, (long long)P, (long long)P);
    kf_cg_printf(&body, "            if (gp < %lld) {\n", (long long)NP);
    kf_cg_puts(&body, pix[0]);
    kf_cg_puts(&body, "                float acc0 = 0.0f;\n");
    bool ok = conv_taps(st, n, &cv, 1, "                ");
    ix oi;
    char rhs[64]; /* "acc0 + name" */
    conv_out_ix(&cv, "co", &oi);
    uint32_t mark = st->nmemo;
    st->red = n2; /* the epilogue stops at n2's input (its "row" value) */
    char slot[64]; /* kf_mid index */
    snprintf(slot, sizeof slot, "kf_mid[co][e %% %lld]", (long long)P);
    ok = ok && conv_value(st, n, &oi, 0, rhs, sizeof rhs) && epilogue(st, n->out[0], &oi, rhs, slot);
    st->red = NULL;
    st->nmemo = mark;
    kf_cg_puts(&body, "            }\n        }\n        KF_BARRIER;\n");
    /* phase 2: the 1x1 conv from kf_mid */
    kf_cg_printf(&body, "        for (int e = KF_LOCAL_ID; e < %lld; e += KF_LOCAL_SIZE) {\n", (long long)(cv2.M * P));
    kf_cg_printf(&body, "            const %s co = e / %lld;\n", I, (long long)P);
    kf_cg_printf(&body, "            const %s gp = tile * %lld + e %% %lld;\n", I, (long long)P, (long long)P);
    kf_cg_printf(&body, "            if (gp < %lld) {\n", (long long)NP);
    kf_cg_puts(&body, pix[1]);
    kf_cg_puts(&body, "                float acc0 = 0.0f;\n");
    kf_cg_printf(&body, "                for (%s c = 0; c < %lld; c++) {\n", I, (long long)cv.M);
    st->ind = "                    ";
    ix wi = {.rank = cv2.wt->rank};
    snprintf(wi.c[0], NAMELEN, "%s", cv2.M == 1 ? "0" : "co");
    snprintf(wi.c[1], NAMELEN, "%s", cv.M == 1 ? "0" : "c");
    for (int d = 0; d < cv2.nsp; d++) snprintf(wi.c[2 + d], NAMELEN, "0");
    char wv[NAMELEN];
    mark = st->nmemo;
    ok = ok && emit(st, n2->in[1], &wi, wv);
    st->nmemo = mark;
    if (ok) kf_cg_printf(&body, "                    acc0 += kf_mid[c][e %% %lld] * %s;\n", (long long)P, wv);
    kf_cg_puts(&body, "                }\n");
    st->ind = "                ";
    conv_out_ix(&cv2, "co", &oi);
    ok = ok && conv_value(st, n2, &oi, 0, rhs, sizeof rhs) && epilogue(st, n2->out[0], &oi, rhs, NULL);
    st->nmemo = mark;
    kf_cg_puts(&body, "            }\n        }\n        KF_BARRIER;\n");
    if (ok) {
        header(st, s, "conv -> 1x1 conv");
        kf_cg_printf(s, "    KF_SHARED float kf_mid[%lld][%lld];\n", (long long)cv.M, (long long)P);
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

/* The kernel of an anchor group, or false with a reason naming the node. */
static bool gen_anchor(gen *st, kf_cg_str *s) {
    const kf_group *grp = st->grp;
    if (!grp->anchor) return fail(st, "anchor group without an anchor node");
    const kf_node *n = &st->g->nodes[grp->anchor];
    if (grp->anchor2) {
        const kf_node *n2 = &st->g->nodes[grp->anchor2];
        if (n->op == KF_OP_CONV && n2->op == KF_OP_CONV && !grp->reduction) return gen_conv_b2b(st, s, n, n2);
        bool g1 = n->op == KF_OP_MATMUL || n->op == KF_OP_GEMM, g2 = n2->op == KF_OP_MATMUL || n2->op == KF_OP_GEMM;
        if (g1 && g2) {
            st->red = grp->reduction ? &st->g->nodes[grp->reduction] : NULL;
            return gen_gemm_rows(st, s, n, n2);
        }
        return fail(st, "node '%s': back-to-back anchors (-> '%s') are not generated yet", kf_node_label(n),
                    kf_node_label(n2));
    }
    if (grp->reduction) {
        st->red = &st->g->nodes[grp->reduction];
        st->iacc = n->op == KF_OP_MATMUL_INTEGER;
        if (n->op == KF_OP_MATMUL || n->op == KF_OP_GEMM || st->iacc) return gen_gemm_rows(st, s, n, NULL);
        return fail(st, "node '%s': a row-reduction epilogue ('%s') after a %s is not generated yet",
                    kf_node_label(n), kf_node_label(st->red), n->op_type);
    }
    for (int j = 1; j < n->nout; j++)
        if (n->out[j]) return fail(st, "node '%s': %s output %d is used", kf_node_label(n), n->op_type, j);
    st->iacc = n->op == KF_OP_MATMUL_INTEGER || n->op == KF_OP_CONV_INTEGER;
    switch (n->op) {
    case KF_OP_MATMUL:
    case KF_OP_MATMUL_INTEGER:
    case KF_OP_GEMM: return gen_gemm(st, s, n);
    case KF_OP_CONV:
    case KF_OP_CONV_INTEGER: return gen_conv(st, s, n);
    default: return fail(st, "node '%s': anchor op %s has no template yet", kf_node_label(n), n->op_type);
    }
}

#include "cg_attention.c"

#else
typedef int kf_cg_anchor_empty; /* ISO C: a translation unit declares something */
#endif
