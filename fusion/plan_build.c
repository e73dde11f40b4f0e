/*
 * plan_build.c: the fusion planner's driver (kf_plan_build). Sets up the
 * singleton groups, runs greedy vertical merges by modeled DRAM bytes saved
 * (deterministic ties), then horizontal merges of siblings sharing an input,
 * then orders the groups, batches small independent ones into shared
 * launches, models bytes and FLOPs, and records a reason on every boundary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_cost.h"
#include "plan_int.h"

/* Greedy rounds over all edges. A round can only enable merges that an
 * earlier refusal in the same round blocked (a cycle through a group that
 * has since joined one side); real models settle in 2-3 rounds. */
#define PL_MAX_ROUNDS 8

void kf_plan_options_default(kf_plan_options *o) {
    memset(o, 0, sizeof *o);
    o->fuel = -1;
    const char *d = getenv("KFUSE_DISABLE_FUSION");
    o->disable = d && *d && strcmp(d, "0") != 0;
    const char *fuel = getenv("KFUSE_FUEL");
    if (fuel && *fuel) o->fuel = strtoll(fuel, NULL, 10);
    const char *trace = getenv("KFUSE_TRACE");
    o->trace = trace && strstr(trace, "fusion");
    const char *target = getenv("KFUSE_TARGET");
    o->target = target && *target ? target : NULL;
}

/* Modeled bytes of value v; -1 when its shape or dtype is not static. */
int64_t pl_value_bytes(const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    size_t esz = kf_dtype_size(t->dtype);
    int64_t numel;
    if (!esz || !kf_type_is_static(t) || kf_shape_numel(t->rank, t->dims, 1, &numel)) return -1;
    int64_t b;
    return kf_mul_ok(numel, (int64_t)esz, &b) ? b : -1;
}

/* Bytes a group reads of value v: all of it, unless every use of v inside
 * the group (member(ctx, node)) is as the data operand (input 0) of an op
 * that reads only the elements its output selects (op table flag
 * KF_F_READS_SUBSET: Gather, Slice); then at most those outputs' size. An
 * embedding table read by a Gather of 128 token ids costs 128 rows, not the
 * table. -1 if unknown. */
int64_t pl_read_bytes(const kf_graph *g, kf_id v, bool (*member)(const void *ctx, kf_id node), const void *ctx) {
    int64_t all = pl_value_bytes(g, v), selected = 0;
    const kf_value *val = &g->values[v];
    for (uint32_t u = 0; u < val->nusers; u++) {
        const kf_node *n = &g->nodes[val->users[u]];
        if (n->dead || !member(ctx, val->users[u])) continue;
        const kf_op_info *info = kf_op_get(n->op);
        bool subset = info && (info->flags & KF_F_READS_SUBSET) && n->in[0] == v;
        for (int q = 1; subset && q < n->nin; q++) subset = n->in[q] != v;
        int64_t out = subset && n->out[0] ? pl_value_bytes(g, n->out[0]) : -1;
        if (!subset || out < 0) return all;
        selected += out;
    }
    return all >= 0 && selected < all ? selected : all;
}

typedef struct final_ctx {
    const uint32_t *group_of;
    uint32_t k;
} final_ctx;

static bool in_final_group(const void *ctx, kf_id node) {
    const final_ctx *c = ctx;
    return c->group_of[node] == c->k;
}

static int64_t read_bytes(const kf_graph *g, const uint32_t *group_of, uint32_t k, kf_id v) {
    final_ctx c = {group_of, k};
    return pl_read_bytes(g, v, in_final_group, &c);
}

static int64_t type_numel(const kf_type *t) {
    int64_t n;
    if (!t || !kf_type_is_static(t) || kf_shape_numel(t->rank, t->dims, 1, &n)) return -1;
    return n;
}

/* Accumulates into *acc; an unknown (-1) term makes the sum unknown. */
static void acc_add(int64_t *acc, int64_t x) {
    if (*acc < 0) return;
    if (x < 0 || !kf_add_ok(*acc, x, acc)) *acc = -1;
}

/* Modeled FLOPs of one node; -1 when shapes are unknown. Elementwise ops
 * count one per output element, data movement none; reductions a few per
 * input element (the passes they make); GEMM/conv two per multiply-add.
 * Opaque ops are not modeled (0). */
int64_t pl_node_flops(const kf_graph *g, const kf_node *n) {
    kf_fclass fc = pl_fclass(g, n);
    const kf_type *out0 = n->nout > 0 && n->out[0] ? &g->values[n->out[0]].type : NULL;
    const kf_type *in0 = n->nin > 0 && n->in[0] ? &g->values[n->in[0]].type : NULL;
    const kf_type *in1 = n->nin > 1 && n->in[1] ? &g->values[n->in[1]].type : NULL;
    int64_t r, k;
    switch (fc) {
    case KF_FC_ELEMWISE:
    case KF_FC_BROADCAST: return type_numel(out0);
    case KF_FC_INJECTIVE:
    case KF_FC_OPAQUE: return 0;
    case KF_FC_REDUCTION: {
        int64_t per = 1; /* ReduceX, ArgX: one op per element */
        switch (n->op) {
        case KF_OP_SOFTMAX:
        case KF_OP_LOG_SOFTMAX: per = 4; break; /* max, exp(x-max), sum, scale */
        case KF_OP_BATCH_NORMALIZATION: per = 2; break; /* one fused multiply-add */
        case KF_OP_LAYER_NORMALIZATION:
        case KF_OP_GROUP_NORMALIZATION:
        case KF_OP_INSTANCE_NORMALIZATION:
        case KF_OP_MEAN_VARIANCE_NORMALIZATION:
        case KF_OP_RMS_NORMALIZATION: per = 5; break; /* sum, sq-sum, center, scale, affine */
        default: break;
        }
        int64_t e = type_numel(in0);
        return e >= 0 && kf_mul_ok(e, per, &r) ? r : -1;
    }
    case KF_FC_ANCHOR: {
        int64_t e = type_numel(out0);
        if (e < 0 || !in0 || !in1 || in0->rank < 1 || in1->rank < 1) return -1;
        if (n->op == KF_OP_MATMUL || n->op == KF_OP_MATMUL_INTEGER || n->op == KF_OP_GEMM) {
            int ka = in0->rank - 1;
            if (n->op == KF_OP_GEMM && kf_attr_i(n, "transA", 0)) ka = 0;
            k = in0->dims[ka];
        } else { /* Conv: Cin/group*kh*kw per output; ConvTranspose: per input */
            int64_t w = type_numel(in1);
            if (w < 0 || in1->dims[0] <= 0) return -1;
            k = w / in1->dims[0];
            if (n->op == KF_OP_CONV_TRANSPOSE) e = type_numel(in0);
        }
        if (k < 0 || e < 0 || !kf_mul_ok(e, k, &r) || !kf_mul_ok(r, 2, &r)) return -1;
        return r;
    }
    }
    return -1;
}

/* ---- tracing ------------------------------------------------------------------ */

static const char *label(const pl_state *s, uint32_t node) {
    return kf_node_label(&s->g->nodes[node]);
}

static void trace_merge(const pl_state *s, bool on, const char *how, uint32_t a, uint32_t b, kf_id v,
                        const char *why) {
    if (!on) return;
    const char *vn = v && s->g->values[v].name ? s->g->values[v].name : "";
    if (why)
        fprintf(stderr, "kfuse: fusion: %s refused: [%s] + [%s] via '%s': %s\n", how, label(s, a), label(s, b), vn,
                why);
    else
        fprintf(stderr, "kfuse: fusion: %s merge: [%s] + [%s] via '%s'\n", how, label(s, a), label(s, b), vn);
}

/* ---- greedy merging ------------------------------------------------------------- */

typedef struct pl_edge {
    int64_t bytes; /* saved when the edge goes inside one group; -1 unknown */
    kf_id p, c, v;
    bool late;     /* into a select (see select_edge) */
} pl_edge;

/* Is the edge into c a select's input (a Split, or a Gather of one
 * constant index: slices of the value)? Such edges are offered after all
 * others. Taken first, by the most bytes, the select joins its producer:
 * after a library anchor that is an epilogue kernel of its own, which
 * exists only to cut the slices apart (q, k and v of a merged projection
 * after cuBLASLt). Offered last, the select's readers have formed their
 * groups, and one that reads every slice (attention) can take the select
 * as a prologue: it then reads the slices where they lie, and the pass
 * disappears. Where no reader takes it, the producer still can. */
static bool select_edge(const kf_graph *g, const kf_node *c, kf_id v) {
    return (c->op == KF_OP_SPLIT || c->op == KF_OP_GATHER) && c->in[0] == v && pl_layout_op(g, c);
}

/* Selects last, then most bytes first (unknown last), then lowest
 * producer, consumer, value. */
static int edge_cmp(const void *x, const void *y) {
    const pl_edge *a = x, *b = y;
    if (a->late != b->late) return a->late ? 1 : -1;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    if (a->p != b->p) return a->p < b->p ? -1 : 1;
    if (a->c != b->c) return a->c < b->c ? -1 : 1;
    return a->v < b->v ? -1 : a->v > b->v;
}

typedef struct pl_run {
    int64_t fuel;
    bool fuel_out, rounds_out, trace;
    uint32_t merges;
    uint32_t cost_refusals; /* legal merges the cost model refused */
} pl_run;

/* Every KF_REASON_COST_* starts with these words. */
#define PL_COST_PREFIX "estimated slower"

static bool cost_reason(const char *why) {
    return why && !strncmp(why, PL_COST_PREFIX, sizeof PL_COST_PREFIX - 1);
}

static bool take_fuel(pl_run *r) {
    if (r->fuel == 0) {
        r->fuel_out = true;
        return false;
    }
    if (r->fuel > 0) r->fuel--;
    return true;
}

/* A float8 product, or a float8 convolution where the float8 tile beats
 * the library (kf_fp8_conv_pays), takes its two DequantizeLinears first,
 * where it is legal and the target has float8 tensor cores (or there is
 * no target): the library's float8 GEMM or the float8 convolution tile
 * then reads the float8 values, and a generated GEMM dequantizes them as
 * it loads. Priced one at a time, neither merge would be taken: with one
 * DequantizeLinear in, the group is a generated GEMM or direct
 * convolution. */
static kf_status fp8_operands(pl_state *s, pl_run *run) {
    if (s->target && s->target->tc_tflops_fp8 <= 0) return KF_OK;
    const kf_graph *g = s->g;
    for (uint32_t i = 0; i < s->norder && !run->fuel_out; i++) {
        kf_id a = s->order[i];
        if (!kf_fp8_product(s->m, &g->nodes[a], NULL) && !kf_fp8_conv_pays(s->target, s->math, s->m, a)) continue;
        for (int k = 0; k < 2; k++) {
            kf_id v = g->nodes[a].in[k], d = g->values[v].producer;
            uint32_t ra = pl_find(s, d), rb = pl_find(s, a);
            if (ra == rb) continue;
            const char *why = pl_legal(s, ra, rb, false);
            if (!why && !take_fuel(run)) break;
            trace_merge(s, run->trace, "float8 operand", d, a, v, why);
            if (why) continue;
            KF_TRY(pl_merge(s, ra, rb));
            run->merges++;
        }
    }
    return KF_OK;
}

static kf_status vertical(pl_state *s, pl_run *run) {
    const kf_graph *g = s->g;
    size_t ne = 0, cap = 0;
    for (uint32_t i = 0; i < s->norder; i++) cap += (size_t)g->nodes[s->order[i]].nin;
    pl_edge *e = kf_malloc((cap ? cap : 1) * sizeof *e);
    if (!e) return kf_fail(KF_ERR_NOMEM, "fusion planner: out of memory");
    for (uint32_t i = 0; i < s->norder; i++) {
        const kf_node *n = &g->nodes[s->order[i]];
        for (int k = 0; k < n->nin; k++) {
            kf_id v = n->in[k], p = v ? g->values[v].producer : 0;
            if (!p || s->pos[p] == UINT32_MAX) continue;
            e[ne++] = (pl_edge){pl_value_bytes(g, v), p, s->order[i], v, select_edge(g, n, v)};
        }
    }
    qsort(e, ne, sizeof *e, edge_cmp);
    kf_status st = KF_OK;
    bool merged = true;
    int round;
    for (round = 0; merged && round < PL_MAX_ROUNDS && !run->fuel_out; round++) {
        merged = false;
        for (size_t i = 0; i < ne; i++) {
            uint32_t ra = pl_find(s, e[i].p), rb = pl_find(s, e[i].c);
            if (ra == rb) continue;
            const char *why = pl_decide(s, ra, rb, false);
            if (!why && !take_fuel(run)) break;
            run->cost_refusals += cost_reason(why);
            trace_merge(s, run->trace, "vertical", e[i].p, e[i].c, e[i].v, why);
            if (why) continue;
            if ((st = pl_merge(s, ra, rb))) goto done;
            run->merges++;
            merged = true;
        }
    }
    if (merged && round == PL_MAX_ROUNDS) run->rounds_out = true;
done:
    kf_free(e);
    return st;
}

typedef struct pl_val {
    int64_t bytes;
    kf_id v;
} pl_val;

static int val_cmp(const void *x, const void *y) {
    const pl_val *a = x, *b = y;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return a->v < b->v ? -1 : a->v > b->v;
}

/* Siblings reading one value, largest values first: each elementwise
 * reader group is offered to the first one in turn. */
static kf_status horizontal(pl_state *s, pl_run *run) {
    const kf_graph *g = s->g;
    uint32_t nv = 0;
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].nusers > 1) nv++;
    pl_val *vs = kf_malloc((size_t)(nv ? nv : 1) * sizeof *vs);
    if (!vs) return kf_fail(KF_ERR_NOMEM, "fusion planner: out of memory");
    nv = 0;
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].nusers > 1) vs[nv++] = (pl_val){pl_value_bytes(g, v), v};
    qsort(vs, nv, sizeof *vs, val_cmp);
    kf_status st = KF_OK;
    for (uint32_t i = 0; i < nv && !run->fuel_out; i++) {
        const kf_value *val = &g->values[vs[i].v];
        kf_id p = val->producer;
        uint32_t rp = p && s->pos[p] != UINT32_MAX ? pl_find(s, p) : 0;
        uint32_t cur = 0, curnode = 0;
        for (uint32_t u = 0; u < val->nusers && !run->fuel_out; u++) {
            uint32_t r = pl_find(s, val->users[u]);
            if (r == rp || s->gs[r].kind != KF_GROUP_ELEMWISE) continue;
            if (!cur) {
                cur = r, curnode = val->users[u];
                continue;
            }
            if (r == cur) continue;
            const char *why = pl_decide(s, cur, r, true);
            if (!why && !take_fuel(run)) break;
            run->cost_refusals += cost_reason(why);
            trace_merge(s, run->trace, "horizontal", curnode, val->users[u], vs[i].v, why);
            if (why) continue;
            if ((st = pl_merge(s, cur, r))) goto done;
            run->merges++;
            cur = pl_find(s, cur);
        }
    }
done:
    kf_free(vs);
    return st;
}

/* ---- the final plan ------------------------------------------------------------------ */

typedef struct pl_gsort {
    uint32_t level, minpos, root;
} pl_gsort;

static int gsort_cmp(const void *x, const void *y) {
    const pl_gsort *a = x, *b = y;
    if (a->level != b->level) return a->level < b->level ? -1 : 1;
    return a->minpos < b->minpos ? -1 : a->minpos > b->minpos;
}

static int bound_cmp(const void *x, const void *y) {
    const kf_boundary *a = x, *b = y;
    if (a->from != b->from) return a->from < b->from ? -1 : 1;
    if (a->to != b->to) return a->to < b->to ? -1 : 1;
    return a->value < b->value ? -1 : a->value > b->value;
}

#define NOMEM() kf_fail(KF_ERR_NOMEM, "fusion planner: out of memory")

/* Groups in order (level, first node), levels by Kahn's algorithm over the
 * group graph; fills p->groups[].nodes/level, p->group_of, root_of_group. */
static kf_status order_groups(pl_state *s, kf_plan *p) {
    const kf_graph *g = s->g;
    kf_status st = KF_OK;
    uint32_t ng = 0;
    uint32_t *gi = kf_malloc((size_t)g->nnodes * sizeof *gi); /* root -> provisional index */
    if (!gi) return NOMEM();
    for (uint32_t i = 0; i < s->norder; i++) {
        kf_id x = s->order[i];
        if (pl_find(s, x) == x) gi[x] = ng++;
    }
    pl_gsort *gs = kf_calloc(ng ? ng : 1, sizeof *gs);
    uint32_t *indeg = kf_calloc(ng ? ng : 1, sizeof *indeg);
    uint32_t *ostart = kf_calloc((size_t)ng + 1, sizeof *ostart);
    uint32_t *queue = kf_malloc((size_t)(ng ? ng : 1) * sizeof *queue);
    uint32_t nedge = 0, *adj = NULL, *fill = NULL;
    if (!gs || !indeg || !ostart || !queue) {
        st = NOMEM();
        goto out;
    }
    for (uint32_t i = 0; i < s->norder; i++) {
        kf_id x = s->order[i];
        uint32_t r = pl_find(s, x);
        gs[gi[r]].root = r;
        gs[gi[r]].minpos = s->gs[r].minpos;
    }
    /* CSR of group edges (duplicates kept: in-degrees count them alike) */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < s->norder; i++) {
            const kf_node *n = &g->nodes[s->order[i]];
            uint32_t to = gi[pl_find(s, s->order[i])];
            for (int k = 0; k < n->nin; k++) {
                kf_id v = n->in[k], pr = v ? g->values[v].producer : 0;
                if (!pr || s->pos[pr] == UINT32_MAX) continue;
                uint32_t from = gi[pl_find(s, pr)];
                if (from == to) continue;
                if (pass == 0) {
                    ostart[from + 1]++;
                    indeg[to]++;
                    nedge++;
                } else {
                    adj[fill[from]++] = to;
                }
            }
        }
        if (pass == 0) {
            for (uint32_t k = 0; k < ng; k++) ostart[k + 1] += ostart[k];
            adj = kf_malloc((size_t)(nedge ? nedge : 1) * sizeof *adj);
            fill = kf_malloc((size_t)(ng ? ng : 1) * sizeof *fill);
            if (!adj || !fill) {
                st = NOMEM();
                goto out;
            }
            memcpy(fill, ostart, (size_t)ng * sizeof *fill);
        }
    }
    uint32_t qh = 0, qt = 0;
    for (uint32_t k = 0; k < ng; k++)
        if (!indeg[k]) queue[qt++] = k;
    while (qh < qt) {
        uint32_t k = queue[qh++];
        for (uint32_t j = ostart[k]; j < ostart[k + 1]; j++) {
            uint32_t t = adj[j];
            if (gs[t].level < gs[k].level + 1) gs[t].level = gs[k].level + 1;
            if (--indeg[t] == 0) queue[qt++] = t;
        }
    }
    if (qt != ng) { /* the cycle check failed us */
        st = kf_fail(KF_ERR_INTERNAL, "fusion planner: the group graph has a cycle");
        goto out;
    }
    qsort(gs, ng, sizeof *gs, gsort_cmp);
    p->ngroups = ng;
    p->groups = kf_calloc(ng ? ng : 1, sizeof *p->groups);
    s->root_of_group = kf_malloc((size_t)(ng ? ng : 1) * sizeof *s->root_of_group);
    if (!p->groups || !s->root_of_group) {
        st = NOMEM();
        goto out;
    }
    for (uint32_t k = 0; k < ng; k++) {
        uint32_t r = gs[k].root;
        s->root_of_group[k] = r;
        gi[r] = k;
        kf_group *G = &p->groups[k];
        G->kind = s->gs[r].kind;
        G->anchor = s->gs[r].master;
        if (s->gs[r].nanchor) {
            G->anchor2 = s->gs[r].nanchor > 1 ? s->gs[r].anc[1] : 0;
            G->reduction = s->gs[r].red;
        }
        G->level = gs[k].level;
        G->nodes = kf_malloc((size_t)s->gs[r].nnodes * sizeof *G->nodes);
        if (!G->nodes) {
            st = NOMEM();
            goto out;
        }
    }
    for (uint32_t i = 0; i < s->norder; i++) {
        kf_id x = s->order[i];
        uint32_t k = gi[pl_find(s, x)];
        p->group_of[x] = k;
        p->groups[k].nodes[p->groups[k].nnodes++] = x;
    }
out:
    kf_free(gi);
    kf_free(gs);
    kf_free(indeg);
    kf_free(ostart);
    kf_free(queue);
    kf_free(adj);
    kf_free(fill);
    return st;
}

/* Inputs and outputs in first-use order, bytes and FLOPs of group k; with
 * `views`, whether it is a view (kf_group.view). The disabled plan has no
 * views: it is the one-kernel-per-node baseline. */
static kf_status fill_group(pl_state *s, kf_plan *p, uint32_t k, bool views) {
    const kf_graph *g = s->g;
    kf_group *G = &p->groups[k];
    uint32_t nin = 0, nout = 0;
    for (uint32_t i = 0; i < G->nnodes; i++) {
        nin += (uint32_t)g->nodes[G->nodes[i]].nin;
        nout += (uint32_t)g->nodes[G->nodes[i]].nout;
    }
    G->inputs = kf_malloc((size_t)(nin ? nin : 1) * sizeof(kf_id));
    G->outputs = kf_malloc((size_t)(nout ? nout : 1) * sizeof(kf_id));
    if (!G->inputs || !G->outputs) return NOMEM();
    if (++s->vstampv == 0) {
        memset(s->vstamp, 0, (size_t)g->nvalues * sizeof *s->vstamp);
        s->vstampv = 1;
    }
    uint32_t st = s->vstampv;
    G->flops = 0;
    for (uint32_t i = 0; i < G->nnodes; i++) {
        const kf_node *n = &g->nodes[G->nodes[i]];
        for (int j = 0; j < n->nin; j++) {
            kf_id v = n->in[j], pr = v ? g->values[v].producer : 0;
            if (!v || s->vstamp[v] == st) continue;
            if (pr && s->pos[pr] != UINT32_MAX && p->group_of[pr] == k) continue;
            s->vstamp[v] = st;
            G->inputs[G->ninputs++] = v;
        }
        for (int j = 0; j < n->nout; j++) {
            kf_id v = n->out[j];
            if (!v) continue;
            const kf_value *val = &g->values[v];
            bool leaves = val->is_output;
            for (uint32_t u = 0; u < val->nusers && !leaves; u++) leaves = p->group_of[val->users[u]] != k;
            if (leaves) G->outputs[G->noutputs++] = v;
        }
        if (G->kind != KF_GROUP_CONST) acc_add(&G->flops, pl_node_flops(g, n));
    }
    G->bytes_read = G->bytes_written = 0;
    G->view = views && G->kind == KF_GROUP_ELEMWISE;
    for (uint32_t i = 0; i < G->nnodes && G->view; i++) G->view = kf_plan_is_reshape(&g->nodes[G->nodes[i]]);
    if (G->kind == KF_GROUP_CONST || G->view) return KF_OK; /* no kernel: no traffic */
    for (uint32_t i = 0; i < G->ninputs; i++) acc_add(&G->bytes_read, read_bytes(g, p->group_of, k, G->inputs[i]));
    for (uint32_t i = 0; i < G->noutputs; i++) acc_add(&G->bytes_written, pl_value_bytes(g, G->outputs[i]));
    return KF_OK;
}

/* The value a view group's output shows (views are followed back to the
 * buffer some kernel or the caller wrote): what the lower bound counts. */
static kf_id view_source(const pl_state *s, const kf_plan *p, kf_id v) {
    for (;;) {
        kf_id pr = s->g->values[v].producer;
        if (!pr || s->pos[pr] == UINT32_MAX || !p->groups[p->group_of[pr]].view) return v;
        const kf_node *n = &s->g->nodes[pr];
        if (n->nin < 1 || !n->in[0]) return v;
        v = n->in[0];
    }
}

/* Plan-wide byte figures (see kf_plan). */
static void totals(pl_state *s, kf_plan *p) {
    const kf_graph *g = s->g;
    p->bytes_unfused = p->bytes_fused = p->bytes_lower_bound = 0;
    for (uint32_t i = 0; i < s->norder; i++) {
        kf_id x = s->order[i];
        if (p->groups[p->group_of[x]].kind == KF_GROUP_CONST) continue;
        const kf_node *n = &g->nodes[x];
        for (int j = 0; j < n->nin; j++) {
            bool dup = false;
            for (int q = 0; q < j && !dup; q++) dup = n->in[q] == n->in[j];
            if (n->in[j] && !dup) acc_add(&p->bytes_unfused, pl_value_bytes(g, n->in[j]));
        }
        for (int j = 0; j < n->nout; j++)
            if (n->out[j] && (g->values[n->out[j]].nusers || g->values[n->out[j]].is_output))
                acc_add(&p->bytes_unfused, pl_value_bytes(g, n->out[j]));
    }
    if (++s->vstampv == 0) {
        memset(s->vstamp, 0, (size_t)g->nvalues * sizeof *s->vstamp);
        s->vstampv = 1;
    }
    uint32_t st = s->vstampv;
    for (uint32_t k = 0; k < p->ngroups; k++) {
        const kf_group *G = &p->groups[k];
        if (G->kind == KF_GROUP_CONST) continue;
        acc_add(&p->bytes_fused, G->bytes_read);
        acc_add(&p->bytes_fused, G->bytes_written);
        if (G->view) continue; /* its readers count what it shows */
        for (uint32_t i = 0; i < G->ninputs; i++) {
            kf_id v = view_source(s, p, G->inputs[i]), pr = g->values[v].producer;
            bool outside = !pr || s->pos[pr] == UINT32_MAX || p->groups[p->group_of[pr]].kind == KF_GROUP_CONST;
            if (!outside || s->vstamp[v] == st) continue;
            s->vstamp[v] = st;
            acc_add(&p->bytes_lower_bound, v == G->inputs[i] ? read_bytes(g, p->group_of, k, v) : pl_value_bytes(g, v));
        }
    }
    for (uint32_t i = 0; i < g->noutputs; i++) {
        kf_id v = view_source(s, p, g->outputs[i]), pr = g->values[v].producer;
        if (s->vstamp[v] == st) continue;
        /* a view of an input or weight: no kernel touches it, the caller's
         * buffer is the output */
        if (v != g->outputs[i] && (!pr || s->pos[pr] == UINT32_MAX || p->groups[p->group_of[pr]].kind == KF_GROUP_CONST))
            continue;
        s->vstamp[v] = st;
        acc_add(&p->bytes_lower_bound, pl_value_bytes(g, v));
    }
}

/* Launch indices: groups in order; a small generated-kernel group joins the
 * open batch of its level (same level = no path between them). */
static void launches(kf_plan *p, bool disable) {
    uint32_t next = 0, open_launch = 0, open_level = UINT32_MAX, open_count = 0;
    for (uint32_t k = 0; k < p->ngroups; k++) {
        kf_group *G = &p->groups[k];
        if (G->kind == KF_GROUP_CONST || G->view) {
            G->launch = UINT32_MAX;
            continue;
        }
        int64_t b = G->bytes_read >= 0 && G->bytes_written >= 0 ? G->bytes_read + G->bytes_written : -1;
        bool small = !disable && (G->kind == KF_GROUP_ELEMWISE || G->kind == KF_GROUP_REDUCTION) && b >= 0 &&
                     b <= KF_PLAN_SMALL_BYTES;
        if (small && open_level == G->level && open_count < KF_PLAN_MAX_BATCH) {
            G->launch = open_launch;
            open_count++;
            continue;
        }
        G->launch = next++;
        if (small) open_launch = G->launch, open_level = G->level, open_count = 1;
    }
    p->launches = next;
}

/* The cost model's figures per group and for the whole run (one launch
 * cost per batched launch, not per member). */
static void estimates(pl_state *s, kf_plan *p) {
    p->est_us = s->target ? 0 : -1;
    p->est_unsized = 0;
    uint32_t last_launch = UINT32_MAX;
    for (uint32_t k = 0; k < p->ngroups; k++) {
        kf_group *G = &p->groups[k];
        G->est_us = -1;
        G->est_blocks = 0;
        G->est_form = G->est_bound = NULL;
        G->est_lib_us = 0;
        if (!s->target) continue;
        kf_cost_group cg;
        kf_cost c;
        kf_cost_of_group(s->m, p, k, &cg);
        kf_cost_estimate(s->target, (kf_cost_math)s->math, s->g, &cg, &c);
        G->est_us = c.us;
        p->est_unsized += !c.known && G->launch != UINT32_MAX;
        G->est_blocks = c.blocks;
        G->est_form = c.form;
        G->est_bound = c.bound;
        G->est_epilogue_us = c.epilogue_us;
        G->est_lib_us = c.lib_us;
        p->est_us += c.us;
        if (G->launch != UINT32_MAX && G->launch == last_launch) p->est_us -= s->target->launch_us;
        if (G->launch != UINT32_MAX) last_launch = G->launch;
    }
}

static kf_status boundaries(pl_state *s, kf_plan *p, const kf_plan_options *o, const pl_run *run) {
    const kf_graph *g = s->g;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->norder; i++) n += (uint32_t)g->nodes[s->order[i]].nin;
    p->bounds = kf_malloc((size_t)(n ? n : 1) * sizeof *p->bounds);
    if (!p->bounds) return NOMEM();
    n = 0;
    for (uint32_t i = 0; i < s->norder; i++) {
        kf_id x = s->order[i];
        const kf_node *nd = &g->nodes[x];
        for (int k = 0; k < nd->nin; k++) {
            kf_id v = nd->in[k], pr = v ? g->values[v].producer : 0;
            if (!pr || s->pos[pr] == UINT32_MAX || p->group_of[pr] == p->group_of[x]) continue;
            p->bounds[n++] = (kf_boundary){p->group_of[pr], p->group_of[x], v, NULL};
        }
    }
    qsort(p->bounds, n, sizeof *p->bounds, bound_cmp);
    uint32_t u = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (u && !bound_cmp(&p->bounds[u - 1], &p->bounds[i])) continue;
        kf_boundary b = p->bounds[i];
        if (o->disable) b.reason = KF_REASON_DISABLED;
        else b.reason = pl_decide(s, s->root_of_group[b.from], s->root_of_group[b.to], false);
        if (!b.reason) b.reason = run->fuel_out ? KF_REASON_FUEL : KF_REASON_ROUNDS;
        p->bounds[u++] = b;
    }
    p->nbounds = u;
    return KF_OK;
}

kf_status kf_plan_build(kf_model *m, const kf_plan_options *o, kf_plan **out) {
    *out = NULL;
    kf_plan_options def;
    if (!o) {
        kf_plan_options_default(&def);
        o = &def;
    }
    KF_TRY(kf_infer_shapes(m));
    const kf_graph *g = m->graph;
    kf_plan *p = kf_calloc(1, sizeof *p);
    pl_state *s = kf_calloc(1, sizeof *s);
    kf_status st = KF_OK;
    if (!p || !s) {
        kf_free(p);
        kf_free(s);
        return NOMEM();
    }
    p->state = s;
    s->m = m;
    s->g = g;
    if (o->target && *o->target && strcmp(o->target, "none")) {
        if ((st = kf_target_get(o->target, &s->target))) goto fail;
        snprintf(p->target, sizeof p->target, "%s", s->target->name);
        s->math = o->math;
        s->legal_only = o->legal_only;
        s->lib = s->target->vendor_lib && !o->no_library;
    }
    if ((st = kf_graph_topo(g, &s->order, &s->norder))) goto fail;
    size_t nn = g->nnodes ? g->nnodes : 1, nv = g->nvalues ? g->nvalues : 1;
    s->parent = kf_malloc(nn * sizeof *s->parent);
    s->pos = kf_malloc(nn * sizeof *s->pos);
    s->gs = kf_calloc(nn, sizeof *s->gs);
    s->ngs = s->gs ? (uint32_t)nn : 0;
    s->stamp = kf_calloc(nn, sizeof *s->stamp);
    s->stack = kf_malloc(nn * sizeof *s->stack);
    s->vstamp = kf_calloc(nv, sizeof *s->vstamp);
    s->sc = kf_malloc(nv * sizeof *s->sc);
    s->next = kf_calloc(nn, sizeof *s->next);
    s->ubuf = kf_malloc(nn * sizeof *s->ubuf);
    s->up = kf_calloc(nn, sizeof *s->up);
    s->dn = kf_calloc(nn, sizeof *s->dn);
    s->cbuf = kf_malloc(nn * sizeof *s->cbuf);
    s->vbuf = kf_malloc(nv * sizeof *s->vbuf);
    p->group_of = kf_malloc(nn * sizeof *p->group_of);
    if (!s->parent || !s->pos || !s->gs || !s->stamp || !s->stack || !s->vstamp || !s->sc || !p->group_of || !s->next ||
        !s->ubuf || !s->up || !s->dn || !s->cbuf || !s->vbuf) {
        st = NOMEM();
        goto fail;
    }
    for (uint32_t i = 0; i < g->nnodes; i++) {
        s->parent[i] = i;
        s->pos[i] = UINT32_MAX;
        p->group_of[i] = UINT32_MAX;
    }
    for (uint32_t i = 0; i < s->norder; i++) s->pos[s->order[i]] = i;
    pl_space_classes(s);
    for (uint32_t i = 0; i < s->norder; i++)
        if ((st = pl_init_node(s, s->order[i]))) goto fail;
    p->nodes = s->norder;
    pl_run run = {o->fuel, false, false, o->trace, 0, 0};
    if (!o->disable) {
        if ((st = fp8_operands(s, &run))) goto fail;
        if ((st = vertical(s, &run))) goto fail;
        if ((st = horizontal(s, &run))) goto fail;
    }
    p->merges = run.merges;
    p->cost_refusals = run.cost_refusals;
    if ((st = order_groups(s, p))) goto fail;
    for (uint32_t k = 0; k < p->ngroups; k++)
        if ((st = fill_group(s, p, k, !o->disable))) goto fail;
    totals(s, p);
    launches(p, o->disable);
    estimates(s, p);
    if ((st = boundaries(s, p, o, &run))) goto fail;
    *out = p;
    return KF_OK;
fail:
    kf_plan_free(p);
    return st;
}

void kf_plan_free(kf_plan *p) {
    if (!p) return;
    for (uint32_t k = 0; k < p->ngroups && p->groups; k++) {
        kf_free(p->groups[k].nodes);
        kf_free(p->groups[k].inputs);
        kf_free(p->groups[k].outputs);
    }
    kf_free(p->groups);
    kf_free(p->group_of);
    kf_free(p->bounds);
    pl_state_free(p->state);
    kf_free(p);
}

static const char *kind_name(kf_group_kind k) {
    static const char *names[] = {"elemwise", "reduction", "anchor", "opaque", "const"};
    return (unsigned)k < 5 ? names[k] : "?";
}

void kf_plan_print(const kf_model *m, const kf_plan *p, FILE *f) {
    const kf_graph *g = m->graph;
    fprintf(f, "nodes %u groups %u launches %u merges %u bytes unfused %lld fused %lld lower bound %lld\n", p->nodes,
            p->ngroups, p->launches, p->merges, (long long)p->bytes_unfused, (long long)p->bytes_fused,
            (long long)p->bytes_lower_bound);
    for (uint32_t k = 0; k < p->ngroups; k++) {
        const kf_group *G = &p->groups[k];
        fprintf(f, "g%u %s L%d lvl%u in%u out%u R%lld W%lld F%lld:", k, kind_name(G->kind),
                G->launch == UINT32_MAX ? -1 : (int)G->launch, G->level, G->ninputs, G->noutputs,
                (long long)G->bytes_read, (long long)G->bytes_written, (long long)G->flops);
        for (uint32_t i = 0; i < G->nnodes; i++) fprintf(f, " %s", g->nodes[G->nodes[i]].op_type);
        fputc('\n', f);
    }
    for (uint32_t i = 0; i < p->nbounds; i++) {
        const kf_boundary *b = &p->bounds[i];
        fprintf(f, "  g%u -> g%u '%s': %s\n", b->from, b->to, g->values[b->value].name, b->reason);
    }
}

kf_status kf_plan_build_at(kf_model *m, const kf_plan_options *o, const char *const *names, const int64_t *values,
                           int n, kf_plan **out) {
    *out = NULL;
    kf_graph *g = m->graph;
    kf_type *saved = kf_malloc(((size_t)g->nvalues + 1) * sizeof *saved);
    if (!saved) return NOMEM();
    for (kf_id v = 0; v < g->nvalues; v++) saved[v] = g->values[v].type;
    kf_status st = KF_OK;
    for (int i = 0; i < n && !st; i++) {
        bool known = false;
        for (uint32_t y = 1; y < g->nsyms && !known; y++) known = !strcmp(g->syms[y], names[i]);
        if (known) st = kf_graph_bind_sym(g, names[i], values[i]);
    }
    uint32_t nvalues = g->nvalues;
    if (!st) st = kf_plan_build(m, o, out);
    /* every type as it was (values planning added keep theirs), and the
     * symbolic contents of shape values recomputed from them */
    for (kf_id v = 0; v < nvalues && v < g->nvalues; v++) g->values[v].type = saved[v];
    kf_free(saved);
    kf_status st2 = kf_infer_shapes(m);
    if (!st) st = st2;
    if (st) {
        kf_plan_free(*out);
        *out = NULL;
    }
    return st;
}
