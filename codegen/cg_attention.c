/*
 * cg_attention.c: attention as one streaming kernel (included by codegen.c
 * after cg_anchor.c, whose GEMM helpers it uses).
 *
 * The group: MatMul(Q, K') -> elementwise (scale, additive or causal mask,
 * any prologue on the operands) -> Softmax over the keys -> MatMul(., V) ->
 * elementwise/layout epilogue. Instead of holding whole rows of scores on
 * chip (the back-to-back form), a work-group owns 16 x W query rows of one
 * batch (W warps, a warp 16 rows) and streams the keys and values through
 * shared memory BK at a time, FlashAttention style:
 *
 *   for each key tile:  S = Q K'   (16 x BK per warp, m16n8k16 tiles)
 *                       s = epilogue(S)          (scale, mask: per element)
 *                       m' = max(m, rowmax s);  p = exp(s - m')
 *                       l = l e^(m - m') + rowsum p;  O = O e^(m - m') + p V
 *   O / l -> the second MatMul's epilogue -> stores
 *
 * The tile products go through the prelude's KF_MMA_F/H/B (16 x 8 x 16,
 * the fragment layout of PTX mma.m16n8k16: lane l holds C rows l/4 and
 * l/4 + 8, columns 2(l%4) and 2(l%4) + 1). The CUDA prelude runs the 16-bit
 * forms on tensor cores (mma.sync); every other form, and every form in
 * the OpenCL prelude, is the portable twin: each lane computes its own four
 * C elements with FMAs from the same shared tiles, so the twin executes
 * the same fragment ownership, row statistics and stores on any device.
 * Row statistics are shared by the four lanes of a row (KF_QUAD_MAX/SUM:
 * shuffles on CUDA, local memory on OpenCL). Keys past the end score -inf
 * and their values load as 0; a row whose every key is masked to -inf
 * gives 0/0, as the unfused Softmax does.
 *
 * When the probabilities reach the second MatMul through a chain (an int8
 * plan's QuantizeLinear and DequantizeLinear of them: kf_att_passes), each
 * must be normalized before the chain, so the keys are streamed twice: the
 * first pass keeps only each row's max and sum of exponentials, the second
 * recomputes the scores, takes e^(s - m) / l through the chain into the
 * P tile and accumulates O = P V with no rescaling and no final division. */
#ifdef KF_CG_ANCHOR_IMPL

#define ATT_SMEM (46 * 1024) /* shared bytes a work-group may take (CUDA's static 48 KiB, less the quad scratch) */

/* An Attention node (opset 23+) run as the kernel by itself: its layout
 * and what its bias holds. */
typedef struct attop {
    const kf_node *n;
    int rank;                   /* of Q, K, V: 3 (batch, seq, heads * size) or 4 (batch, heads, seq, size) */
    int64_t B, Hq, Hkv, Sq, T, D, Dv;
    int pq, pk, pv, pm;         /* parameters of Q, K, V and the mask (-1: none) */
    kf_dtype mt;                /* the mask's type */
    int64_t mstride[4], mkeys;  /* mask strides over (B, Hq, Sq, keys), 0 broadcasts; keys it covers */
    bool causal;
    double scale, cap;          /* cap 0: no softcap */
} attop;

typedef struct attn {
    const attop *op;    /* NULL: a back-to-back group of graph nodes */
    int w, bk;          /* warps (16 query rows each), keys per tile */
    int64_t d16, dv8;   /* head sizes rounded up to the MMA's k (16) and n (8) */
    int64_t ldq, ldk, ldv, ldp; /* shared row strides, elements */
    int esz;            /* bytes per shared element */
    char kind;          /* 'F' float, 'H' float16, 'B' bfloat16 storage */
    bool two_pass;      /* the probabilities pass through a chain (Q/DQ) before V:
                         * one pass over the keys for each row's max and sum,
                         * a second for the normalized probabilities */
} attn;

static int64_t att_bytes(const attn *a) {
    return (int64_t)a->esz * (16 * a->w * a->ldq + a->bk * a->ldk + a->dv8 * a->ldv + 16 * a->w * a->ldp) +
           4 * 32 * a->w;
}

/* Picks warps and key tile so the tiles fit ATT_SMEM: as many warps as the
 * query rows use (up to 4), then the longest key tile. False: none fits. */
static bool att_tiles(int64_t M, int64_t N, int64_t K, int64_t Nv, char kind, attn *a) {
    a->kind = kind;
    a->esz = kind == 'F' ? 4 : 2;
    int pad = kind == 'F' ? 1 : 8; /* 16-bit rows of 16 bytes + 8 halves: a fragment load hits 32 banks */
    a->d16 = (K + 15) / 16 * 16;
    a->dv8 = (Nv + 7) / 8 * 8;
    a->ldq = a->ldk = a->d16 + pad;
    int wmax = M >= 64 ? 4 : M > 16 ? (int)((M + 15) / 16) : 1;
    if (wmax == 3) wmax = 4;
    int bkmax = N > 32 ? 64 : N > 16 ? 32 : 16;
    for (a->w = wmax; a->w >= 1; a->w /= 2)
        for (a->bk = bkmax; a->bk >= 16; a->bk /= 2) {
            a->ldv = a->ldp = a->bk + pad;
            if (att_bytes(a) <= ATT_SMEM) return true;
        }
    return false;
}

/* Is the back-to-back group n -> r -> n2 attention the streaming kernel can
 * run? Softmax over the keys only (opset 13 or the last axis), its output
 * read by n2 directly (or through Identity; in two passes through Q/DQ:
 * kf_att_passes, into *passes), both anchors MatMuls, every group output
 * after n2, operands of one floating storage type. */
static bool att_shape(gen *st, const kf_node *n, const kf_node *r, const kf_node *n2, char *kind, int *passes) {
    if (!r || r->op != KF_OP_SOFTMAX || n->op != KF_OP_MATMUL || n2->op != KF_OP_MATMUL) return false;
    const kf_type *rx = &st->g->values[r->in[0]].type;
    int64_t opset = r->opset > 0 ? r->opset : 13;
    int64_t axis = kf_attr_i(r, "axis", opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rx->rank;
    if (axis != rx->rank - 1) return false;
    if (!(*passes = kf_att_passes(st->g, n, r, n2))) return false;
    for (kf_id v = n2->in[0]; v != r->out[0];) {
        kf_id p = st->g->values[v].producer; /* kf_att_passes walked here */
        if (st->p->group_of[p] != st->gi) return false;
        v = st->g->nodes[p].in[0];
    }
    for (uint32_t o = 0; o < st->k->nouts; o++)
        if (!from_anchor(st, st->k->outs[o].value, n2->out[0], 0)) return false;
    kf_dtype dt = st->g->values[n->in[0]].type.dtype;
    kf_id ops[3] = {n->in[1], n2->in[1], n2->in[0]};
    for (int i = 0; i < 3; i++)
        if (st->g->values[ops[i]].type.dtype != dt) dt = KF_DT_FLOAT;
    *kind = dt == KF_DT_FLOAT16 ? 'H' : dt == KF_DT_BFLOAT16 ? 'B' : 'F';
    return true;
}

/* Stores register x into shared array arr at element idx in its kind. */
static void att_put(gen *st, const attn *a, const char *arr, const char *idx, const char *x) {
    if (a->kind == 'H') kf_cg_printf(st->s, "%sKF_SSTORE_HALF(%s, %s, %s);\n", st->ind, arr, idx, x);
    else if (a->kind == 'B') kf_cg_printf(st->s, "%sKF_STORE_BF16(%s, %s, %s);\n", st->ind, arr, idx, x);
    else kf_cg_printf(st->s, "%s%s[%s] = %s;\n", st->ind, arr, idx, x);
}

/* A tile load: element e of rows x cols (e / cols, e % cols) of operand
 * slot `slot` of MatMul m (gm its shapes), its k index at "kbase + e % cols"
 * or "kbase + e / cols" (k_is_col), n likewise; into arr at row * ld + col,
 * or col * ld + row (transposed). Outside K/N: 0. */
static bool att_load(gen *st, const attn *a, const kf_node *m, const gemm *gm, int slot, int64_t rows, int64_t cols,
                     const char *rname, const char *rbase, const char *cname, const char *cbase, const char *arr,
                     int64_t ld, bool transposed) {
    const char *I = st->ity;
    kf_cg_str *b = st->s;
    kf_cg_printf(b, "            for (int e = KF_LOCAL_ID; e < %lld; e += KF_LOCAL_SIZE) {\n", (long long)(rows * cols));
    kf_cg_printf(b, "                const int er = e / %lld, ec = e %% %lld;\n", (long long)cols, (long long)cols);
    kf_cg_printf(b, "                const %s %s = %s + er;\n", I, rname, rbase);
    kf_cg_printf(b, "                const %s %s = %s + ec;\n", I, cname, cbase);
    st->ind = "                ";
    /* the operand's (row, col) names: A is (gm, gk), B is (gk, gn) */
    const char *row = slot == 0 ? "gm" : "gk", *col = slot == 0 ? "gk" : "gn";
    int64_t rlim = slot == 0 ? gm->M : gm->K, clim = slot == 0 ? gm->K : gm->N;
    char cond[128];
    snprintf(cond, sizeof cond, "%s < %lld && %s < %lld", row, (long long)rlim, col, (long long)clim);
    ix at;
    operand_ix(gm, &st->g->values[m->in[slot]].type, slot == 0, row, col, &at);
    if (!load_guarded(st, "x", cond, m->in[slot], &at, 0, NULL, 0)) return false;
    char idx[96];
    snprintf(idx, sizeof idx, transposed ? "ec * %lld + er" : "er * %lld + ec", (long long)ld);
    att_put(st, a, arr, idx, "x");
    kf_cg_puts(b, "            }\n");
    return true;
}

/* The element expression of parameter pi (dtype dt) at offset off, as float. */
static void att_read(kf_cg_str *b, kf_dtype dt, int pi, const char *off) {
    if (dt == KF_DT_FLOAT16) kf_cg_printf(b, "KF_LOAD_HALF(in%d, %s)", pi, off);
    else if (dt == KF_DT_BFLOAT16) kf_cg_printf(b, "KF_LOAD_BF16(in%d, %s)", pi, off);
    else kf_cg_printf(b, "(float)in%d[%s]", pi, off);
}

/* The Attention node's tile loads: which 0 (Q rows from rbase, head size
 * columns), 1 (K: keys from rbase) or 2 (V: keys from rbase, value head
 * size columns; stored transposed) into arr. */
static void att_op_load(gen *st, const attn *a, int which, int64_t rows, int64_t cols, const char *rbase,
                        const char *arr, int64_t ld) {
    const attop *op = a->op;
    kf_cg_str *b = st->s;
    const char *I = st->ity;
    int64_t seq = which ? op->T : op->Sq, size = which == 2 ? op->Dv : op->D, heads = which ? op->Hkv : op->Hq;
    int pi = which == 0 ? op->pq : which == 1 ? op->pk : op->pv;
    kf_dtype dt = st->k->ins[pi].dtype;
    const char *head = which ? "hk" : "h";
    kf_cg_printf(b, "            for (int e = KF_LOCAL_ID; e < %lld; e += KF_LOCAL_SIZE) {\n", (long long)(rows * cols));
    kf_cg_printf(b, "                const int er = e / %lld, ec = e %% %lld;\n", (long long)cols, (long long)cols);
    kf_cg_printf(b, "                const %s gr = %s + er;\n", I, rbase);
    kf_cg_puts(b, "                float x = 0.0f;\n");
    char off[160];
    if (op->rank == 4)
        snprintf(off, sizeof off, "((b * %lld + %s) * %lld + gr) * %lld + ec", (long long)heads, head, (long long)seq,
                 (long long)size);
    else
        snprintf(off, sizeof off, "(b * %lld + gr) * %lld + %s * %lld + ec", (long long)seq, (long long)(heads * size),
                 head, (long long)size);
    kf_cg_printf(b, "                if (gr < %lld && ec < %lld) x = ", (long long)seq, (long long)size);
    att_read(b, dt, pi, off);
    kf_cg_puts(b, ";\n");
    st->ind = "                ";
    char idx[96];
    snprintf(idx, sizeof idx, which == 2 ? "ec * %lld + er" : "er * %lld + ec", (long long)ld);
    att_put(st, a, arr, idx, "x");
    kf_cg_puts(b, "            }\n");
}

/* The Attention node's bias on score sv at (query gm, key gn): softcap,
 * mask (boolean: False -> -inf; else added; keys past its last -inf),
 * causal (a key after the query -inf), as the reference orders them. */
static void att_op_bias(gen *st, const attn *a) {
    const attop *op = a->op;
    kf_cg_str *b = st->s;
    if (op->cap > 0) {
        kf_cg_puts(b, "                    sv = ");
        put_float(b, op->cap);
        kf_cg_puts(b, " * KF_TANH(sv / ");
        put_float(b, op->cap);
        kf_cg_puts(b, ");\n");
    }
    if (op->pm >= 0) {
        char off[200];
        snprintf(off, sizeof off, "b * %lld + h * %lld + gm * %lld + gn * %lld", (long long)op->mstride[0],
                 (long long)op->mstride[1], (long long)op->mstride[2], (long long)op->mstride[3]);
        kf_cg_printf(b, "                    if (gn >= %lld) sv = -KF_INF;\n", (long long)op->mkeys);
        if (op->mt == KF_DT_BOOL) kf_cg_printf(b, "                    else if (!in%d[%s]) sv = -KF_INF;\n", op->pm, off);
        else {
            kf_cg_puts(b, "                    else sv += ");
            att_read(b, op->mt, op->pm, off);
            kf_cg_puts(b, ";\n");
        }
    }
    if (op->causal) kf_cg_puts(b, "                    if (gn > gm) sv = -KF_INF;\n");
}

/* The head of a loop over key tiles (kt) and its scores: K's tile (and
 * V's, with_v) loaded, S = Q K' by fragments into sc[nt][4], each score
 * through the first MatMul's epilogue (or the Attention op's scale and
 * bias), -inf past the keys. The loop is left open. */
static bool att_scores(gen *st, const attn *a, const kf_node *n, const gemm *gm1, const kf_node *n2, const gemm *gm2,
                       int64_t BQ, bool with_v) {
    const char *I = st->ity;
    const attop *op = a->op;
    kf_cg_str *b = st->s;
    int64_t nt = a->bk / 8;
    bool ok = true;
    kf_cg_printf(b, "        for (%s kt = 0; kt < %lld; kt += %d) {\n", I, (long long)gm1->N, a->bk);
    kf_cg_puts(b, "            KF_BARRIER;\n");
    /* K' (the first MatMul's B, [k = head dim][n = key]) as kf_k[key][d]; V ([k = key][n = dv]) as kf_v[dv][key] */
    if (op) {
        att_op_load(st, a, 1, a->bk, a->d16, "kt", "kf_k", a->ldk);
        if (with_v) att_op_load(st, a, 2, a->bk, a->dv8, "kt", "kf_v", a->ldv);
    } else {
        ok = att_load(st, a, n, gm1, 1, a->bk, a->d16, "gn", "kt", "gk", "0", "kf_k", a->ldk, false);
        if (with_v) ok = ok && att_load(st, a, n2, gm2, 1, a->bk, a->dv8, "gk", "kt", "gn", "0", "kf_v", a->ldv, true);
    }
    kf_cg_printf(b, "            KF_BARRIER;\n"
                    "            float sc[%lld][4];\n"
                    "            KF_UNROLL for (int j = 0; j < %lld; j++) {\n"
                    "                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;\n"
                    "                KF_UNROLL for (int k0 = 0; k0 < %lld; k0 += 16)\n"
                    "                    KF_MMA_%c(sc[j], kf_q, warp * %lld + k0, %lld, kf_k, j * %lld + k0, %lld, lane);\n"
                    "            }\n",
                 (long long)nt, (long long)nt, (long long)a->d16, a->kind, (long long)(16 * a->ldq), (long long)a->ldq,
                 (long long)(8 * a->ldk), (long long)a->ldk);
    /* the scores through the first MatMul's epilogue, -inf past the keys */
    kf_cg_printf(b, "            KF_UNROLL for (int e = 0; e < %lld; e++) {\n", (long long)(4 * nt));
    kf_cg_printf(b, "                const %s gm = tm * %lld + warp * 16 + lane / 4 + (e %% 4 >= 2 ? 8 : 0);\n", I,
                 (long long)BQ);
    kf_cg_printf(b, "                const %s gn = kt + e / 4 * 8 + lane %% 4 * 2 + e %% 2;\n", I);
    kf_cg_puts(b, "                float sv = -KF_INF;\n");
    kf_cg_printf(b, "                if (gm < %lld && gn < %lld) {\n", (long long)gm1->M, (long long)gm1->N);
    st->ind = "                    ";
    ix oi;
    kf_cg_str rhs = {0};
    uint32_t mark = st->nmemo;
    if (op) {
        kf_cg_puts(b, "                    sv = sc[e / 4][e % 4] * ");
        put_float(b, op->scale);
        kf_cg_puts(b, ";\n");
        att_op_bias(st, a);
    } else
        ok = ok && anchor_value(st, n, gm1, "sc[e / 4][e % 4]", &oi, &rhs) && epilogue(st, n->out[0], &oi, rhs.p, "sv");
    st->nmemo = mark;
    kf_cg_str_release(&rhs);
    kf_cg_puts(b, "                }\n"
                  "                sc[e / 4][e % 4] = sv;\n"
                  "            }\n");
    return ok;
}

/* The new running max n0/n1 of the warp's rows g and g + 8 over this key
 * tile's scores, u0/u1 the max to subtract (0 for a row of -inf only), and
 * c0/c1 the factor rescaling what was summed against the old max. */
static void att_row_max(gen *st, int64_t nt) {
    kf_cg_printf(st->s, "            float x0 = -KF_INF, x1 = -KF_INF;\n"
                        "            KF_UNROLL for (int j = 0; j < %lld; j++) {\n"
                        "                x0 = KF_FMAX(x0, KF_FMAX(sc[j][0], sc[j][1]));\n"
                        "                x1 = KF_FMAX(x1, KF_FMAX(sc[j][2], sc[j][3]));\n"
                        "            }\n"
                        "            x0 = KF_QUAD_MAX(x0, kf_qr);\n"
                        "            x1 = KF_QUAD_MAX(x1, kf_qr);\n"
                        "            const float n0 = KF_FMAX(m0, x0), n1 = KF_FMAX(m1, x1);\n"
                        "            const float u0 = n0 == -KF_INF ? 0.0f : n0, u1 = n1 == -KF_INF ? 0.0f : n1;\n"
                        "            const float c0 = KF_EXP(m0 - u0), c1 = KF_EXP(m1 - u1);\n"
                        "            m0 = n0;\n"
                        "            m1 = n1;\n",
                 (long long)nt);
}

/* Each row's sum of e^(s - u) over this key tile added to l0/l1 (rescaled
 * by c0/c1 first); with store_p, each e^(s - u) also goes to the P tile. */
static void att_row_sums(gen *st, const attn *a, int64_t nt, bool store_p) {
    kf_cg_printf(st->s, "            float p0 = 0.0f, p1 = 0.0f;\n"
                        "            KF_UNROLL for (int e = 0; e < %lld; e++) {\n"
                        "                const float pv = KF_EXP(sc[e / 4][e %% 4] - (e %% 4 >= 2 ? u1 : u0));\n"
                        "                if (e %% 4 >= 2) p1 += pv;\n"
                        "                else p0 += pv;\n",
                 (long long)(4 * nt));
    if (store_p) {
        kf_cg_printf(st->s, "                const int pi = (warp * 16 + lane / 4 + (e %% 4 >= 2 ? 8 : 0)) * %lld + e / 4 * 8 + lane %% 4 * 2 + e %% 2;\n",
                     (long long)a->ldp);
        st->ind = "                ";
        att_put(st, a, "kf_p", "pi", "pv");
    }
    kf_cg_puts(st->s, "            }\n"
                      "            l0 = l0 * c0 + KF_QUAD_SUM(p0, kf_qr);\n"
                      "            l1 = l1 * c1 + KF_QUAD_SUM(p1, kf_qr);\n");
}

static bool gen_attention(gen *st, kf_cg_str *s, const kf_node *n, const kf_node *n2, const gemm *gm1, const gemm *gm2,
                          const attn *a) {
    const char *I = st->ity;
    const kf_node *r = st->red;
    const attop *op = a->op;
    const kf_type *ot = &st->g->values[n->out[0]].type;
    int64_t BQ = 16 * a->w, tm = (gm1->M + BQ - 1) / BQ, nbatch = 1;
    if (op) nbatch = op->B * op->Hq;
    else
        for (int d = 0; d < gm1->nb; d++) nbatch *= ot->dims[d];
    int64_t ntiles = nbatch * tm, nt = a->bk / 8, on = a->dv8 / 8;
    if (ntiles > INT32_MAX / (32 * a->w))
        return fail(st, "node '%s': %lld query tiles (not generated)", kf_node_label(n), (long long)ntiles);
    kf_free(st->k->name);
    if (!(st->k->name = kf_strdup("kf_attention"))) return fail_oom(st);
    st->k->block = (uint32_t)(32 * a->w);
    st->k->min_block = st->k->block; /* warps own query rows: exactly this many */
    st->k->numel = ntiles * st->k->block;

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    kf_cg_printf(&body, "        const %s tm = tile %% %lld;\n", I, (long long)tm);
    if (op) { /* batch b, query head h, its key/value head hk */
        kf_cg_printf(&body, "        const %s b = tile / %lld, h = tile / %lld %% %lld, hk = h / %lld;\n", I,
                     (long long)(tm * op->Hq), (long long)tm, (long long)op->Hq, (long long)(op->Hq / op->Hkv));
    } else {
        if (gm1->nb) kf_cg_printf(&body, "        const %s tb = tile / %lld;\n", I, (long long)tm);
        batch_names(st, gm1, ot);
    }
    char base[48];
    snprintf(base, sizeof base, "tm * %lld", (long long)BQ);
    kf_cg_puts(&body, "        KF_BARRIER;\n");
    /* Q: BQ rows x d16, once */
    bool ok = true;
    if (op) att_op_load(st, a, 0, BQ, a->d16, base, "kf_q", a->ldq);
    else ok = att_load(st, a, n, gm1, 0, BQ, a->d16, "gm", base, "gk", "0", "kf_q", a->ldq, false);
    kf_cg_printf(&body, "        float m0 = -KF_INF, m1 = -KF_INF, l0 = 0.0f, l1 = 0.0f;\n"
                        "        float oc[%lld][4];\n"
                        "        KF_UNROLL for (int j = 0; j < %lld; j++) oc[j][0] = oc[j][1] = oc[j][2] = oc[j][3] = 0.0f;\n",
                 (long long)on, (long long)on);
    uint32_t mark;
    if (a->two_pass) {
        /* pass 1: each row's max and sum of exponentials, nothing else */
        ok = ok && att_scores(st, a, n, gm1, n2, gm2, BQ, false);
        att_row_max(st, nt);
        att_row_sums(st, a, nt, false);
        kf_cg_puts(&body, "        }\n"
                          "        const float u0 = m0 == -KF_INF ? 0.0f : m0, u1 = m1 == -KF_INF ? 0.0f : m1;\n");
    }
    ok = ok && att_scores(st, a, n, gm1, n2, gm2, BQ, true);
    /* online softmax: rows g (elements 0, 1) and g + 8 (2, 3) of the warp's 16 */
    if (!a->two_pass) {
        att_row_max(st, nt);
        att_row_sums(st, a, nt, true);
        kf_cg_printf(&body, "            KF_UNROLL for (int j = 0; j < %lld; j++) {\n"
                            "                oc[j][0] *= c0;\n"
                            "                oc[j][1] *= c0;\n"
                            "                oc[j][2] *= c1;\n"
                            "                oc[j][3] *= c1;\n"
                            "            }\n",
                     (long long)on);
    } else {
        /* pass 2: each probability normalized by its row's final max and
         * sum, then through the chain to the second product's operand */
        kf_cg_printf(&body, "            KF_UNROLL for (int e = 0; e < %lld; e++) {\n", (long long)(4 * nt));
        kf_cg_printf(&body, "                const %s gm = tm * %lld + warp * 16 + lane / 4 + (e %% 4 >= 2 ? 8 : 0);\n",
                     I, (long long)BQ);
        kf_cg_printf(&body, "                const %s gn = kt + e / 4 * 8 + lane %% 4 * 2 + e %% 2;\n", I);
        kf_cg_printf(&body, "                const int pi = (warp * 16 + lane / 4 + (e %% 4 >= 2 ? 8 : 0)) * %lld + e / 4 * 8 + lane %% 4 * 2 + e %% 2;\n"
                            "                float pv = 0.0f;\n"
                            "                if (gm < %lld && gn < %lld) {\n"
                            "                    const float pn = KF_EXP(sc[e / 4][e %% 4] - (e %% 4 >= 2 ? u1 : u0)) / (e %% 4 >= 2 ? l1 : l0);\n",
                     (long long)a->ldp, (long long)gm1->M, (long long)gm1->N);
        st->ind = "                    ";
        ix pi;
        kf_cg_str unused = {0};
        char x[NAMELEN];
        mark = st->nmemo;
        /* the Softmax's input has the first product's shape (kf_att_passes), so
         * its output's element is at the product's index */
        ok = ok && anchor_value(st, n, gm1, "0", &pi, &unused) && memo_add(st, st->red->out[0], &pi, "pn") &&
             emit(st, n2->in[0], &pi, x);
        if (ok) kf_cg_printf(&body, "                    pv = %s;\n", x);
        st->nmemo = mark;
        kf_cg_str_release(&unused);
        kf_cg_puts(&body, "                }\n");
        st->ind = "                ";
        att_put(st, a, "kf_p", "pi", "pv");
        kf_cg_puts(&body, "            }\n");
    }
    kf_cg_printf(&body, "            KF_BARRIER;\n"
                        "            KF_UNROLL for (int j = 0; j < %lld; j++)\n"
                        "                KF_UNROLL for (int k0 = 0; k0 < %d; k0 += 16)\n"
                        "                    KF_MMA_%c(oc[j], kf_p, warp * %lld + k0, %lld, kf_v, j * %lld + k0, %lld, lane);\n"
                        "        }\n",
                 (long long)on, a->bk, a->kind, (long long)(16 * a->ldp), (long long)a->ldp, (long long)(8 * a->ldv),
                 (long long)a->ldv);
    /* O / l through the second MatMul's epilogue */
    kf_cg_printf(&body, "        KF_UNROLL for (int e = 0; e < %lld; e++) {\n", (long long)(4 * on));
    kf_cg_printf(&body, "            const %s gm = tm * %lld + warp * 16 + lane / 4 + (e %% 4 >= 2 ? 8 : 0);\n", I,
                 (long long)BQ);
    kf_cg_printf(&body, "            const %s gn = e / 4 * 8 + lane %% 4 * 2 + e %% 2;\n", I);
    kf_cg_printf(&body, "            if (gm < %lld && gn < %lld) {\n", (long long)gm2->M, (long long)gm2->N);
    kf_cg_puts(&body, "                const float kf_l = e % 4 >= 2 ? l1 : l0;\n");
    /* a query that may attend no key: 0/0 as the unfused Softmax gives; the
     * Attention op gives zeros */
    if (op) kf_cg_puts(&body, "                const float kf_o = kf_l > 0.0f ? oc[e / 4][e % 4] / kf_l : 0.0f;\n");
    else if (a->two_pass) kf_cg_puts(&body, "                const float kf_o = oc[e / 4][e % 4]; /* normalized in pass 2 */\n");
    else kf_cg_puts(&body, "                const float kf_o = oc[e / 4][e % 4] / kf_l;\n");
    st->ind = "                ";
    st->red = NULL;
    kf_cg_str rhs2 = {0};
    ix oi2;
    mark = st->nmemo;
    if (op) {
        char off[160];
        if (op->rank == 4)
            snprintf(off, sizeof off, "((b * %lld + h) * %lld + gm) * %lld + gn", (long long)op->Hq, (long long)op->Sq,
                     (long long)op->Dv);
        else
            snprintf(off, sizeof off, "(b * %lld + gm) * %lld + h * %lld + gn", (long long)op->Sq,
                     (long long)(op->Hq * op->Dv), (long long)op->Dv);
        kf_dtype yt = st->k->outs[0].dtype;
        if (yt == KF_DT_FLOAT16) kf_cg_printf(&body, "                KF_STORE_HALF(out0, %s, kf_o);\n", off);
        else if (yt == KF_DT_BFLOAT16) kf_cg_printf(&body, "                KF_STORE_BF16(out0, %s, kf_o);\n", off);
        else kf_cg_printf(&body, "                out0[%s] = kf_o;\n", off);
    } else
        ok = ok && anchor_value(st, n2, gm2, "kf_o", &oi2, &rhs2) && epilogue(st, n2->out[0], &oi2, rhs2.p, NULL);
    st->nmemo = mark;
    st->red = r;
    kf_cg_str_release(&rhs2);
    kf_cg_puts(&body, "            }\n        }\n");
    if (ok) {
        header(st, s, a->kind == 'F' ? "attention (streamed keys)" : "attention (streamed keys, 16-bit tiles)");
        const char *T = a->kind == 'H' ? "KF_SHALF" : a->kind == 'B' ? "KF_BF16" : "float";
        kf_cg_printf(s, "    KF_SHARED %s kf_q[%lld] KF_ALIGN16;\n", T, (long long)(BQ * a->ldq));
        kf_cg_printf(s, "    KF_SHARED %s kf_k[%lld] KF_ALIGN16;\n", T, (long long)(a->bk * a->ldk));
        kf_cg_printf(s, "    KF_SHARED %s kf_v[%lld] KF_ALIGN16;\n", T, (long long)(a->dv8 * a->ldv));
        kf_cg_printf(s, "    KF_SHARED %s kf_p[%lld] KF_ALIGN16;\n", T, (long long)(BQ * a->ldp));
        kf_cg_printf(s, "    KF_SHARED float kf_qr[%d];\n", 32 * a->w);
        kf_cg_puts(s, "    const int lane = KF_LOCAL_ID % 32, warp = KF_LOCAL_ID / 32;\n");
    }
    return tiles_end(st, s, &body, ntiles, ok);
}

/* An Attention node (opset 23+) as the streaming kernel: Q, K, V of one
 * floating type, 3-D or 4-D, grouped key/value heads, an optional mask
 * (boolean or additive, broadcast, possibly shorter than the keys),
 * is_causal, scale, softcap; only Y is used. Declined (the reference runs
 * it): a past key/value cache, nonpad_kv_seqlen, a sliding window, the
 * present or qk_matmul_output outputs read, head sizes over 128. */
static bool gen_attention_op(gen *st, kf_cg_str *s, const kf_node *n) {
    const char *why = NULL;
    for (int i = 4; i < n->nin && !why; i++)
        if (n->in[i]) why = i < 6 ? "a past key/value cache" : "nonpad_kv_seqlen";
    for (int j = 1; j < n->nout && !why; j++)
        if (n->out[j] && (st->g->values[n->out[j]].nusers || st->g->values[n->out[j]].is_output))
            why = "its present or qk_matmul_output output is read";
    if (!why && (kf_attr_i(n, "left_window_size", -1) >= 0 || kf_attr_i(n, "right_window_size", -1) >= 0))
        why = "a sliding window";
    if (!why && (st->k->nouts != 1 || st->k->outs[0].value != n->out[0])) why = "an output other than Y";
    if (why) return fail(st, "node '%s': Attention with %s is not generated", kf_node_label(n), why);
    const kf_type *q = &st->g->values[n->in[0]].type, *k = &st->g->values[n->in[1]].type,
                  *v = &st->g->values[n->in[2]].type, *mt = n->nin > 3 && n->in[3] ? &st->g->values[n->in[3]].type : NULL;
    if (!kf_type_is_static(q) || !kf_type_is_static(k) || !kf_type_is_static(v) || (mt && !kf_type_is_static(mt)))
        return fail(st, "node '%s': shapes are not static", kf_node_label(n));
    if (q->dtype != k->dtype || q->dtype != v->dtype || !is_real(q->dtype) || q->dtype == KF_DT_DOUBLE ||
        (mt && mt->dtype != KF_DT_BOOL && !is_real(mt->dtype)))
        return fail(st, "node '%s': Attention over %s is not generated", kf_node_label(n), kf_dtype_name(q->dtype));
    attop op = {.n = n, .rank = q->rank, .pm = -1};
    if (q->rank == 4) {
        op.B = q->dims[0], op.Hq = q->dims[1], op.Sq = q->dims[2], op.D = q->dims[3];
        op.Hkv = k->dims[1], op.T = k->dims[2], op.Dv = v->dims[3];
    } else if (q->rank == 3) {
        op.Hq = kf_attr_i(n, "q_num_heads", 0), op.Hkv = kf_attr_i(n, "kv_num_heads", 0);
        if (op.Hq <= 0 || op.Hkv <= 0 || q->dims[2] % op.Hq || k->dims[2] % op.Hkv || v->dims[2] % op.Hkv)
            return fail(st, "node '%s': Attention head counts do not divide the hidden sizes", kf_node_label(n));
        op.B = q->dims[0], op.Sq = q->dims[1], op.D = q->dims[2] / op.Hq;
        op.T = k->dims[1], op.Dv = v->dims[2] / op.Hkv;
    } else return fail(st, "node '%s': Attention of rank %d", kf_node_label(n), q->rank);
    if (op.Hkv <= 0 || op.Hq % op.Hkv || op.B <= 0 || op.Sq <= 0 || op.T <= 0 || op.D <= 0 || op.Dv <= 0)
        return fail(st, "node '%s': Attention shapes are not generated (empty, or heads that do not group)", kf_node_label(n));
    op.pq = param_of(st, n->in[0]), op.pk = param_of(st, n->in[1]), op.pv = param_of(st, n->in[2]);
    if (mt) {
        op.pm = param_of(st, n->in[3]);
        op.mt = mt->dtype;
        if (mt->rank < 1 || mt->rank > 4) return fail(st, "node '%s': attn_mask of rank %d", kf_node_label(n), mt->rank);
        int64_t stride = 1;
        for (int d = mt->rank - 1; d >= 0; d--) {
            if (mt->dims[d] != 1 || d == mt->rank - 1) op.mstride[4 - mt->rank + d] = stride;
            stride *= mt->dims[d];
        }
        op.mkeys = mt->dims[mt->rank - 1];
    }
    if (op.pq < 0 || op.pk < 0 || op.pv < 0 || (mt && op.pm < 0))
        return fail(st, "node '%s': Attention inputs are not kernel parameters (internal)", kf_node_label(n));
    op.causal = kf_attr_i(n, "is_causal", 0) != 0;
    op.scale = kf_attr_find(n, "scale") ? kf_attr_f(n, "scale", 1.0f) : 1.0 / sqrt((double)op.D);
    op.cap = kf_attr_f(n, "softcap", 0.0f);
    if (!(op.scale > 0) || !isfinite(op.scale) || !(op.cap >= 0) || !isfinite(op.cap))
        return fail(st, "node '%s': Attention scale or softcap is not valid", kf_node_label(n));
    attn a;
    char kind = q->dtype == KF_DT_FLOAT16 ? 'H' : q->dtype == KF_DT_BFLOAT16 ? 'B' : 'F';
    if (op.D > 128 || op.Dv > 128 || !att_tiles(op.Sq, op.T, op.D, op.Dv, kind, &a))
        return fail(st, "node '%s': Attention head sizes %lld/%lld are over 128 (not generated)", kf_node_label(n),
                    (long long)op.D, (long long)op.Dv);
    a.op = &op;
    a.two_pass = false;
    gemm g1 = {.M = op.Sq, .N = op.T, .K = op.D, .has_m = true, .has_n = true};
    gemm g2 = {.M = op.Sq, .N = op.Dv, .K = op.T, .has_m = true, .has_n = true};
    const kf_node *red = st->red;
    st->red = NULL;
    bool ok = gen_attention(st, s, n, n, &g1, &g2, &a);
    st->red = red;
    return ok;
}

/* The streaming form for back-to-back group n -> n2 when it is attention
 * (att_shape) and its tiles fit; *taken false leaves the group to the
 * whole-row form. */
static bool att_try(gen *st, kf_cg_str *s, const kf_node *n, const kf_node *n2, const gemm *gm, const gemm *gm2,
                    bool *taken) {
    char kind;
    int passes = 1;
    attn a;
    *taken = att_shape(st, n, st->red, n2, &kind, &passes) && att_tiles(gm->M, gm->N, gm->K, gm2->N, kind, &a);
    a.op = NULL;
    a.two_pass = passes == 2;
    return !*taken || gen_attention(st, s, n, n2, gm, gm2, &a);
}

#else
typedef int kf_cg_attention_empty; /* ISO C: a translation unit declares something */
#endif
