/*
 * plan_cost.c: the cost model (cost.c) asked on the planner's working
 * state. Describes a group or a tentative union of two groups as the cost
 * model sees it (kind, anchors, bytes, FLOPs) and turns "the merged kernel
 * is estimated slower than the two apart" into a refusal reason, which the
 * planner records like any legality reason.
 */
#include <string.h>

#include "kf_cost.h"
#include "plan_int.h"

typedef struct union_ctx {
    pl_state *s;
    uint32_t ra, rb;
} union_ctx;

static bool in_union(const void *ctx, kf_id node) {
    const union_ctx *c = ctx;
    if (c->s->pos[node] == UINT32_MAX) return false;
    uint32_t r = pl_find(c->s, node);
    return r == c->ra || r == c->rb;
}

/* The union {ra, rb} (rb == ra: the group alone) as kf_cost_group. */
static void describe(pl_state *s, uint32_t ra, uint32_t rb, kf_cost_group *cg) {
    const kf_graph *g = s->g;
    const pl_group *A = &s->gs[ra], *B = &s->gs[rb];
    bool two = ra != rb;
    memset(cg, 0, sizeof *cg);
    int nanc = A->nanchor + (two ? B->nanchor : 0), nred = A->nred + (two ? B->nred : 0);
    if (nanc) cg->kind = KF_GROUP_ANCHOR;
    else if (nred) cg->kind = KF_GROUP_REDUCTION;
    else if (A->kind == KF_GROUP_OPAQUE || A->kind == KF_GROUP_CONST) cg->kind = A->kind;
    else cg->kind = KF_GROUP_ELEMWISE;
    kf_id an[4] = {0, 0, 0, 0};
    int na = 0;
    for (int i = 0; i < A->nanchor && i < 2; i++) an[na++] = A->anc[i];
    for (int i = 0; two && i < B->nanchor && i < 2; i++) an[na++] = B->anc[i];
    for (int i = 1; i < na; i++)
        for (int j = i; j > 0 && s->pos[an[j - 1]] > s->pos[an[j]]; j--) {
            kf_id t = an[j];
            an[j] = an[j - 1];
            an[j - 1] = t;
        }
    cg->anchor = an[0];
    cg->anchor2 = na > 1 ? an[1] : 0;
    cg->reduction = A->red ? A->red : two ? B->red : 0;
    cg->flops = A->flops;
    if (two && (A->flops < 0 || B->flops < 0 || !kf_add_ok(A->flops, B->flops, &cg->flops))) cg->flops = -1;
    cg->space = A->space;
    if (two && B->space && (!cg->space || pl_value_bytes(g, B->space) > pl_value_bytes(g, cg->space)))
        cg->space = B->space;
    /* members, for the view test and the anchor's epilogue */
    uint32_t n = 0;
    bool view = cg->kind == KF_GROUP_ELEMWISE;
    for (uint32_t x = A->head; x; x = s->next[x]) s->cbuf[n++] = x;
    for (uint32_t x = two ? B->head : 0; x; x = s->next[x]) s->cbuf[n++] = x;
    for (uint32_t i = 0; i < n && view; i++) view = kf_plan_is_reshape(&g->nodes[s->cbuf[i]]);
    cg->view = view;
    union_ctx c = {s, ra, rb};
    uint32_t nin = pl_union_inputs(s, ra, rb, s->vbuf);
    for (uint32_t i = 0; i < nin && cg->bytes_read >= 0; i++) {
        int64_t b = pl_read_bytes(g, s->vbuf[i], in_union, &c);
        if (b < 0 || !kf_add_ok(cg->bytes_read, b, &cg->bytes_read)) cg->bytes_read = -1;
    }
    uint32_t nout = pl_union_outputs(s, ra, rb, s->vbuf);
    for (uint32_t i = 0; i < nout && cg->bytes_written >= 0; i++) {
        int64_t b = pl_value_bytes(g, s->vbuf[i]);
        if (b < 0 || !kf_add_ok(cg->bytes_written, b, &cg->bytes_written)) cg->bytes_written = -1;
    }
    if (cg->anchor) kf_cost_describe_anchor(s->m, s->cbuf, n, cg, in_union, &c);
}

void pl_cost(pl_state *s, uint32_t ra, uint32_t rb, kf_cost *c) {
    kf_cost_group cg;
    describe(s, ra, rb, &cg);
    kf_cost_estimate(s->target, (kf_cost_math)s->math, s->g, &cg, c);
}

static bool is_lib(const kf_cost *c) { return !strncmp(c->form, "lib_", 4); }

/* Estimates closer than this are a tie, and a tie merges: one kernel
 * fewer to launch and keep in the plan at no modeled cost. */
#define PL_COST_TIE_US 1e-3

const char *pl_cost_reason(pl_state *s, uint32_t ra, uint32_t rb) {
    if (!s->target || s->legal_only || ra == rb) return NULL;
    kf_cost a, b, m;
    pl_cost(s, ra, ra, &a);
    pl_cost(s, rb, rb, &b);
    pl_cost(s, ra, rb, &m);
    /* unknown shapes: the model has nothing to say, legality decides */
    if (!a.known || !b.known || !m.known) return NULL;
    if (m.us <= a.us + b.us + PL_COST_TIE_US) return NULL;
    int64_t apart = a.blocks > b.blocks ? a.blocks : b.blocks;
    if (m.blocks < s->target->sms && m.blocks < apart) return KF_REASON_COST_BLOCKS;
    if (!strcmp(m.bound, "l2")) return KF_REASON_COST_REREAD;
    if ((is_lib(&a) || is_lib(&b)) && !is_lib(&m)) return KF_REASON_COST_LIBRARY;
    return KF_REASON_COST_SLOWER;
}

const char *pl_decide(pl_state *s, uint32_t ra, uint32_t rb, bool horizontal) {
    const char *why = pl_legal(s, ra, rb, horizontal);
    return why ? why : pl_cost_reason(s, ra, rb);
}
