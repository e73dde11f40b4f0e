/*
 * fuse_export.c: the last step of `kfuse fuse`. The planner (kf_plan.h) has
 * put every node into a kernel group; this file writes each multi-node group
 * back into the model as one call of a model-local ONNX function (domain
 * ai.kfuse) whose body is the group's original nodes, so the file stays
 * standard ONNX. It also writes the plan as JSON, a table and Graphviz, and
 * holds a stand-in plan for tests and builds without the planner.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kf_fuse.h"
#include "plan_int.h"

const char *kf_fuse_kind_name(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE: return "elemwise";
    case KF_GROUP_REDUCTION: return "reduction";
    case KF_GROUP_ANCHOR: return "anchor";
    case KF_GROUP_OPAQUE: return "opaque";
    case KF_GROUP_CONST: return "const";
    }
    return "?";
}

static bool has_subgraph(const kf_node *n) {
    for (int i = 0; i < n->nattrs; i++)
        if (n->attrs[i].type == KF_ATTR_GRAPH || n->attrs[i].type == KF_ATTR_GRAPHS) return true;
    return false;
}

/* ---- group interface ---------------------------------------------------- */

/* The values group `gi` reads from outside (first-use order over nodes[])
 * and writes for outside readers or as graph outputs. gid: node -> group.
 * stamp: per value scratch, all entries != the two marks used here. */
typedef struct group_io {
    kf_id *in, *out;
    uint32_t nin, nout;
} group_io;

static kf_status group_interface(const kf_graph *g, const kf_id *nodes, uint32_t nnodes, const uint32_t *gid,
                                 uint32_t gi, uint32_t *stamp, uint32_t mark, group_io *io) {
    uint32_t cap_in = 0, cap_out = 0;
    for (uint32_t k = 0; k < nnodes; k++) {
        cap_in += (uint32_t)g->nodes[nodes[k]].nin;
        cap_out += (uint32_t)g->nodes[nodes[k]].nout;
    }
    io->in = kf_calloc(cap_in + 1, sizeof(kf_id));
    io->out = kf_calloc(cap_out + 1, sizeof(kf_id));
    io->nin = io->nout = 0;
    if (!io->in || !io->out) {
        kf_free(io->in);
        kf_free(io->out);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t k = 0; k < nnodes; k++) {
        const kf_node *n = &g->nodes[nodes[k]];
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i];
            if (!v || stamp[v] == mark) continue;
            kf_id p = g->values[v].producer;
            if (p && gid[p] == gi) continue;
            stamp[v] = mark;
            io->in[io->nin++] = v;
        }
    }
    for (uint32_t k = 0; k < nnodes; k++) {
        const kf_node *n = &g->nodes[nodes[k]];
        for (int j = 0; j < n->nout; j++) {
            kf_id v = n->out[j];
            if (!v || stamp[v] == mark + 1) continue;
            const kf_value *val = &g->values[v];
            bool outside = val->is_output;
            for (uint32_t u = 0; u < val->nusers && !outside; u++) outside = gid[val->users[u]] != gi;
            if (!outside) continue;
            stamp[v] = mark + 1;
            io->out[io->nout++] = v;
        }
    }
    return KF_OK;
}

/* ---- writing groups as functions ------------------------------------------ */

/* Builds the function for one group: inputs, copies of the nodes (body
 * value ids through bmap, main id -> body id, reset by the caller), outputs. */
static kf_status build_function(const kf_model *m, const kf_id *nodes, uint32_t nnodes, const group_io *io,
                                kf_id *bmap, const char *name, kf_function **out) {
    const kf_graph *g = m->graph;
    kf_function *f = kf_function_new(KF_FUSE_DOMAIN, name);
    if (!f) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_graph *b = f->body;
    kf_status st = KF_OK;
    if (!(f->opsets = kf_calloc((size_t)m->nopsets + 1, sizeof(kf_opset)))) goto nomem;
    for (int i = 0; i < m->nopsets; i++) {
        if (!strcmp(m->opsets[i].domain, KF_FUSE_DOMAIN)) continue;
        if (!(f->opsets[f->nopsets].domain = kf_strdup(m->opsets[i].domain))) goto nomem;
        f->opsets[f->nopsets++].version = m->opsets[i].version;
    }
    for (uint32_t i = 0; i < io->nin; i++) {
        kf_id v = io->in[i];
        if ((st = kf_graph_add_value(b, g->values[v].name, &bmap[v])) || (st = kf_graph_mark_input(b, bmap[v])))
            goto fail;
    }
    for (uint32_t k = 0; k < nnodes; k++) {
        const kf_node *n = &g->nodes[nodes[k]];
        kf_id ids[2 * 64];
        kf_id *in = n->nin + n->nout <= 128 ? ids : kf_calloc((size_t)(n->nin + n->nout), sizeof(kf_id));
        if (!in) goto nomem;
        kf_id *outs = in + n->nin;
        for (int i = 0; i < n->nin; i++) in[i] = n->in[i] ? bmap[n->in[i]] : 0;
        for (int j = 0; j < n->nout && !st; j++) {
            kf_id v = n->out[j];
            outs[j] = 0;
            if (v && !(st = kf_graph_add_value(b, g->values[v].name, &bmap[v]))) outs[j] = bmap[v];
        }
        kf_id nid = 0;
        if (!st) st = kf_graph_add_node(b, n->op_type, n->domain, n->name, in, n->nin, outs, n->nout, &nid);
        if (in != ids) kf_free(in);
        if (st) goto fail;
        kf_node *c = kf_node_at(b, nid);
        c->op = n->op;
        c->opset = n->opset;
        if (n->doc && !(c->doc = kf_strdup(n->doc))) goto nomem;
        for (int i = 0; i < n->nattrs; i++)
            if ((st = kf_node_add_attr(c, &n->attrs[i]))) goto fail;
    }
    for (uint32_t j = 0; j < io->nout; j++)
        if ((st = kf_graph_mark_output(b, bmap[io->out[j]]))) goto fail;
    *out = f;
    return KF_OK;
nomem:
    st = kf_fail(KF_ERR_NOMEM, "out of memory");
fail:
    kf_function_free(f);
    return st;
}

static int cmp_pos(const void *a, const void *b, void *posv) {
    const uint32_t *pos = posv;
    uint32_t x = pos[*(const kf_id *)a], y = pos[*(const kf_id *)b];
    return (x > y) - (x < y);
}

/* Insertion sort by topological position (groups are small; qsort_r is not
 * C11). */
static void sort_by_pos(kf_id *ids, uint32_t n, uint32_t *pos) {
    for (uint32_t i = 1; i < n; i++) {
        kf_id x = ids[i];
        uint32_t j = i;
        while (j > 0 && cmp_pos(&ids[j - 1], &x, pos) > 0) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = x;
    }
}

kf_status kf_fuse_apply(kf_model *m, const kf_plan *p, kf_fuse_stats *stats) {
    kf_graph *g = m->graph;
    kf_fuse_stats s = {0};
    kf_status st = KF_OK;
    uint32_t nn = g->nnodes, nv = g->nvalues;
    /* each group adds at most one call node: room for their ids too */
    uint32_t *gid = kf_malloc(sizeof(uint32_t) * ((size_t)nn + p->ngroups)), *pos = kf_calloc(nn, sizeof(uint32_t));
    uint32_t *stamp = kf_calloc(nv, sizeof(uint32_t));
    kf_id *bmap = kf_calloc(nv, sizeof(kf_id)), *order = NULL, *nodes = NULL;
    uint32_t norder = 0;
    if (!gid || !pos || !stamp || !bmap) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < nn + p->ngroups; i++) gid[i] = UINT32_MAX;
    for (uint32_t gi = 0; gi < p->ngroups; gi++)
        for (uint32_t k = 0; k < p->groups[gi].nnodes; k++) {
            kf_id id = p->groups[gi].nodes[k];
            if (!id || id >= nn || g->nodes[id].dead) {
                st = kf_fail(KF_ERR_INVALID_ARG, "plan group %u names node %u, which is not a live node", gi, id);
                goto done;
            }
            if (gid[id] != UINT32_MAX) {
                st = kf_fail(KF_ERR_INVALID_ARG, "node '%s' is in plan groups %u and %u", kf_node_label(&g->nodes[id]),
                             gid[id], gi);
                goto done;
            }
            gid[id] = gi;
        }
    if ((st = kf_graph_topo(g, &order, &norder))) goto done;
    for (uint32_t k = 0; k < norder; k++) pos[order[k]] = k;
    bool any = false;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *grp = &p->groups[gi];
        bool wrap = grp->nnodes > 1;
        for (uint32_t k = 0; wrap && k < grp->nnodes; k++) wrap = !has_subgraph(&g->nodes[grp->nodes[k]]);
        if (!wrap) {
            s.kept++;
            continue;
        }
        kf_free(nodes);
        if (!(nodes = kf_malloc(sizeof(kf_id) * grp->nnodes))) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(nodes, grp->nodes, sizeof(kf_id) * grp->nnodes);
        sort_by_pos(nodes, grp->nnodes, pos);
        group_io io;
        /* marks 2*gi+1 and 2*gi+2 are fresh for every group */
        if ((st = group_interface(g, nodes, grp->nnodes, gid, gi, stamp, 2 * gi + 1, &io))) goto done;
        if (!io.nout) { /* nothing leaves the group: dead code the optimizer would drop */
            kf_free(io.in);
            kf_free(io.out);
            s.kept++;
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "group_%u", gi);
        for (uint32_t k = 2; kf_model_function(m, KF_FUSE_DOMAIN, name); k++)
            snprintf(name, sizeof name, "group_%u_%u", gi, k);
        kf_function *f = NULL;
        st = build_function(m, nodes, grp->nnodes, &io, bmap, name, &f);
        for (uint32_t k = 0; k < grp->nnodes; k++) { /* reset bmap for the next group */
            const kf_node *n = &g->nodes[nodes[k]];
            for (int i = 0; i < n->nin; i++) bmap[n->in[i]] = 0;
            for (int j = 0; j < n->nout; j++) bmap[n->out[j]] = 0;
        }
        if (!st) st = kf_model_add_function(m, f);
        if (!st) {
            for (uint32_t k = 0; k < grp->nnodes; k++) kf_graph_remove_node(g, nodes[k]);
            kf_id call;
            st = kf_graph_add_node(g, name, KF_FUSE_DOMAIN, name, io.in, (int)io.nin, io.out, (int)io.nout, &call);
            if (!st) {
                KF_ASSERT(call < nn + p->ngroups);
                gid[call] = gi; /* later groups see it as outside */
                g->nodes[call].op = KF_OP_UNKNOWN;
                g->nodes[call].opset = KF_FUSE_DOMAIN_VERSION;
            }
        }
        kf_free(io.in);
        kf_free(io.out);
        if (st) goto done;
        s.functions++;
        any = true;
    }
    if (any) {
        if (!kf_model_opset(m, KF_FUSE_DOMAIN) &&
            (st = kf_model_set_opset(m, KF_FUSE_DOMAIN, KF_FUSE_DOMAIN_VERSION)))
            goto done;
        if (m->ir_version < 8) m->ir_version = 8;
        kf_free(order);
        order = NULL;
        if ((st = kf_graph_topo(g, &order, &norder)) && st != KF_ERR_NOMEM) {
            st = kf_fail(KF_ERR_INTERNAL, "a plan group is not convex (its call closes a cycle): %s", kf_last_error());
            goto done;
        }
    }
    s.nodes_after = kf_graph_live_nodes(g);
done:
    kf_free(gid);
    kf_free(pos);
    kf_free(stamp);
    kf_free(bmap);
    kf_free(order);
    kf_free(nodes);
    if (stats) *stats = s;
    return st;
}

/* ---- stand-in plan --------------------------------------------------------------- */

/* Longest run the stand-in plan groups: small enough that a failing
 * comparison points at a handful of nodes, large enough to make multi-level
 * bodies with shape inputs, reductions and anchors. */
#define SIMPLE_MAX_GROUP 16

static const char R_OPAQUE[] = "stand-in plan: opaque, unknown or subgraph op";
static const char R_CAP[] = "stand-in plan: group size cap";
static const char R_ORDER[] = "stand-in plan: not adjacent in topological order";

static int64_t value_bytes(const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    if (!kf_type_is_static(t) || !kf_dtype_size(t->dtype)) return -1;
    int64_t n;
    if (kf_shape_numel(t->rank, t->dims, kf_dtype_size(t->dtype), &n)) return -1;
    return n * (int64_t)kf_dtype_size(t->dtype);
}

/* sum of bytes of vals, -1 if any is unknown */
static int64_t sum_bytes(const kf_graph *g, const kf_id *vals, uint32_t n) {
    int64_t s = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t b = value_bytes(g, vals[i]);
        if (b < 0 || !kf_add_ok(s, b, &s)) return -1;
    }
    return s;
}

static bool fusible(const kf_model *m, const kf_node *n) {
    return pl_fclass(m->graph, n) != KF_FC_OPAQUE && !has_subgraph(n) &&
           !kf_model_function(m, n->domain, n->op_type);
}

void kf_fuse_simple_plan_free(kf_plan *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->ngroups; i++) {
        kf_free(p->groups[i].nodes);
        kf_free(p->groups[i].inputs);
        kf_free(p->groups[i].outputs);
    }
    kf_free(p->groups);
    kf_free(p->group_of);
    kf_free(p->bounds);
    kf_free(p);
}

static kf_id *dup_ids(const kf_id *ids, uint32_t n, bool *ok) {
    kf_id *r = kf_malloc(sizeof(kf_id) * ((size_t)n + 1));
    if (!r) *ok = false;
    else if (n) memcpy(r, ids, sizeof(kf_id) * n);
    return r;
}

kf_status kf_fuse_plan_copy(const kf_model *m, const kf_plan *p, kf_plan **out) {
    *out = NULL;
    kf_plan *c = kf_calloc(1, sizeof *c);
    if (!c) return kf_fail(KF_ERR_NOMEM, "out of memory");
    *c = *p;
    c->state = NULL;
    c->groups = kf_calloc((size_t)p->ngroups + 1, sizeof(kf_group));
    c->group_of = kf_malloc(sizeof(uint32_t) * ((size_t)m->graph->nnodes + 1));
    c->bounds = kf_calloc((size_t)p->nbounds + 1, sizeof(kf_boundary));
    c->ngroups = 0;
    bool ok = c->groups && c->group_of && c->bounds;
    for (uint32_t i = 0; ok && i < p->ngroups; i++) {
        kf_group *d = &c->groups[i];
        *d = p->groups[i];
        d->nodes = dup_ids(p->groups[i].nodes, p->groups[i].nnodes, &ok);
        d->inputs = dup_ids(p->groups[i].inputs, p->groups[i].ninputs, &ok);
        d->outputs = dup_ids(p->groups[i].outputs, p->groups[i].noutputs, &ok);
        c->ngroups++;
    }
    if (!ok) {
        kf_fuse_simple_plan_free(c);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < m->graph->nnodes; i++) c->group_of[i] = p->group_of ? p->group_of[i] : UINT32_MAX;
    if (p->nbounds) memcpy(c->bounds, p->bounds, sizeof(kf_boundary) * p->nbounds);
    *out = c;
    return KF_OK;
}

kf_status kf_fuse_simple_plan(const kf_model *m, kf_plan **out) {
    const kf_graph *g = m->graph;
    *out = NULL;
    kf_id *order = NULL;
    uint32_t norder = 0;
    KF_TRY(kf_graph_topo(g, &order, &norder));
    kf_plan *p = kf_calloc(1, sizeof *p);
    uint32_t *stamp = kf_calloc(g->nvalues, sizeof(uint32_t));
    kf_status st = KF_OK;
    if (!p || !stamp || !(p->group_of = kf_malloc(sizeof(uint32_t) * g->nnodes)) ||
        !(p->groups = kf_calloc(norder + 1, sizeof(kf_group)))) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < g->nnodes; i++) p->group_of[i] = UINT32_MAX;
    /* runs of consecutive fusible nodes: consecutive in a topological order
     * means every path between two members stays inside the run (convex) */
    for (uint32_t k = 0; k < norder;) {
        kf_group *grp = &p->groups[p->ngroups];
        uint32_t len = 1;
        if (fusible(m, &g->nodes[order[k]]))
            while (k + len < norder && len < SIMPLE_MAX_GROUP && fusible(m, &g->nodes[order[k + len]])) len++;
        if (!(grp->nodes = kf_malloc(sizeof(kf_id) * len))) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto done;
        }
        grp->nnodes = len;
        int maxc = -1;
        for (uint32_t j = 0; j < len; j++) {
            kf_id id = order[k + j];
            grp->nodes[j] = id;
            p->group_of[id] = p->ngroups;
            int c = (int)pl_fclass(g, &g->nodes[id]);
            if (c > maxc) {
                maxc = c;
                if (c >= KF_FC_REDUCTION) grp->anchor = id;
            }
        }
        grp->kind = maxc >= KF_FC_OPAQUE   ? KF_GROUP_OPAQUE
                    : maxc == KF_FC_ANCHOR ? KF_GROUP_ANCHOR
                    : maxc == KF_FC_REDUCTION ? KF_GROUP_REDUCTION
                                              : KF_GROUP_ELEMWISE;
        grp->launch = p->ngroups;
        p->ngroups++;
        k += len;
    }
    p->launches = p->ngroups;
    int64_t unfused = 0, fused = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        kf_group *grp = &p->groups[gi];
        group_io io;
        if ((st = group_interface(g, grp->nodes, grp->nnodes, p->group_of, gi, stamp, 2 * gi + 1, &io))) goto done;
        grp->inputs = io.in;
        grp->ninputs = io.nin;
        grp->outputs = io.out;
        grp->noutputs = io.nout;
        grp->bytes_read = sum_bytes(g, io.in, io.nin);
        grp->bytes_written = sum_bytes(g, io.out, io.nout);
        grp->flops = -1;
        if (fused >= 0 && grp->bytes_read >= 0 && grp->bytes_written >= 0)
            fused += grp->bytes_read + grp->bytes_written;
        else fused = -1;
        for (uint32_t k = 0; k < grp->nnodes && unfused >= 0; k++) {
            const kf_node *n = &g->nodes[grp->nodes[k]];
            int64_t r = 0, w = 0;
            for (int i = 0; i < n->nin && r >= 0; i++)
                if (n->in[i]) r = value_bytes(g, n->in[i]) < 0 ? -1 : r + value_bytes(g, n->in[i]);
            for (int j = 0; j < n->nout && w >= 0; j++)
                if (n->out[j]) w = value_bytes(g, n->out[j]) < 0 ? -1 : w + value_bytes(g, n->out[j]);
            unfused = r < 0 || w < 0 ? -1 : unfused + r + w;
        }
    }
    p->bytes_fused = fused;
    p->bytes_unfused = unfused;
    int64_t lb = 0;
    for (kf_id v = 1; v < g->nvalues && lb >= 0; v++) {
        const kf_value *val = &g->values[v];
        if ((val->init && val->nusers) || (val->is_input && val->nusers) || val->is_output) {
            int64_t b = value_bytes(g, v);
            lb = b < 0 ? -1 : lb + b;
        }
    }
    p->bytes_lower_bound = lb;
    /* boundaries: every value flowing between two groups, once per pair */
    uint32_t cap = 0;
    for (uint32_t k = 0; k < norder; k++) {
        const kf_node *n = &g->nodes[order[k]];
        uint32_t to = p->group_of[order[k]];
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i], pr = v ? g->values[v].producer : 0;
            if (!pr || p->group_of[pr] == to) continue;
            uint32_t from = p->group_of[pr];
            bool dup = false;
            for (uint32_t b = 0; b < p->nbounds && !dup; b++)
                dup = p->bounds[b].from == from && p->bounds[b].to == to && p->bounds[b].value == v;
            if (dup) continue;
            if (kf_grow((void **)&p->bounds, &cap, p->nbounds + 1, sizeof(kf_boundary))) {
                st = kf_fail(KF_ERR_NOMEM, "out of memory");
                goto done;
            }
            const char *why = !fusible(m, n) || !fusible(m, &g->nodes[pr]) ? R_OPAQUE
                              : to == from + 1 && p->groups[from].nnodes == SIMPLE_MAX_GROUP ? R_CAP
                                                                                           : R_ORDER;
            p->bounds[p->nbounds++] = (kf_boundary){from, to, v, why};
        }
    }
    *out = p;
    p = NULL;
done:
    kf_fuse_simple_plan_free(p);
    kf_free(stamp);
    kf_free(order);
    return st;
}

/* ---- JSON ---------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_values(FILE *f, const kf_graph *g, const kf_id *vals, uint32_t n) {
    fputc('[', f);
    for (uint32_t i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        json_str(f, g->values[vals[i]].name);
    }
    fputc(']', f);
}

void kf_fuse_write_json(FILE *f, const kf_model *m, const kf_plan *p, const kf_fuse_summary *s) {
    const kf_graph *g = m->graph;
    fprintf(f,
            "{\"nodes_before\": %u, \"nodes_after\": %u, \"kernels\": %u, \"functions\": %u, "
            "\"modeled_bytes_before\": %lld, \"modeled_bytes_after\": %lld, \"modeled_bytes_lower_bound\": %lld, "
            "\"arena_bytes\": %lld, \"arena_lower_bound\": %lld, \"target\": ",
            s->nodes_before, s->nodes_after, p->launches, s->functions, (long long)p->bytes_unfused,
            (long long)p->bytes_fused, (long long)p->bytes_lower_bound, (long long)s->arena_bytes,
            (long long)s->arena_lower_bound);
    if (*p->target) json_str(f, p->target);
    else fputs("null", f);
    fprintf(f, ", \"est_us\": %.3f, \"cost_refusals\": %u, \"est_unsized\": %u, \"groups\": [", p->est_us,
            p->cost_refusals, p->est_unsized);
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *grp = &p->groups[gi];
        fprintf(f, "%s{\"id\": %u, \"kind\": \"%s\", \"launch\": %u, \"ops\": [", gi ? ", " : "", gi,
                kf_fuse_kind_name(grp->kind), grp->launch);
        for (uint32_t k = 0; k < grp->nnodes; k++) {
            if (k) fputs(", ", f);
            json_str(f, g->nodes[grp->nodes[k]].op_type);
        }
        fputs("], \"nodes\": [", f);
        for (uint32_t k = 0; k < grp->nnodes; k++) {
            if (k) fputs(", ", f);
            json_str(f, kf_node_label(&g->nodes[grp->nodes[k]]));
        }
        fprintf(f, "], \"bytes_read\": %lld, \"bytes_written\": %lld, \"flops\": %lld, \"est_us\": %.3f, "
                   "\"est_blocks\": %lld, \"est_form\": ",
                (long long)grp->bytes_read, (long long)grp->bytes_written, (long long)grp->flops, grp->est_us,
                (long long)grp->est_blocks);
        if (grp->est_form) json_str(f, grp->est_form);
        else fputs("null", f);
        fputs(", \"est_bound\": ", f);
        if (grp->est_bound) json_str(f, grp->est_bound);
        else fputs("null", f);
        fprintf(f, ", \"est_epilogue_us\": %.3f, \"est_lib_us\": %.3f, \"inputs\": ", grp->est_epilogue_us, grp->est_lib_us);
        json_values(f, g, grp->inputs, grp->ninputs);
        fputs(", \"outputs\": ", f);
        json_values(f, g, grp->outputs, grp->noutputs);
        fputc('}', f);
    }
    fputs("], \"boundaries\": [", f);
    for (uint32_t b = 0; b < p->nbounds; b++) {
        const kf_boundary *bd = &p->bounds[b];
        fprintf(f, "%s{\"from\": %u, \"to\": %u, \"value\": ", b ? ", " : "", bd->from, bd->to);
        json_str(f, bd->value ? g->values[bd->value].name : "");
        fputs(", \"reason\": ", f);
        json_str(f, bd->reason ? bd->reason : "");
        fputc('}', f);
    }
    fputs("]}\n", f);
}

/* ---- table ------------------------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t n, int64_t b) {
    if (b < 0) snprintf(buf, n, "?");
    else if (b >= (int64_t)10 << 20) snprintf(buf, n, "%lldM", (long long)(b >> 20));
    else if (b >= (int64_t)10 << 10) snprintf(buf, n, "%lldK", (long long)(b >> 10));
    else snprintf(buf, n, "%lld", (long long)b);
}

typedef struct reason_count {
    const char *reason;
    uint32_t count;
} reason_count;

static int cmp_reason(const void *a, const void *b) {
    const reason_count *x = a, *y = b;
    if (x->count != y->count) return x->count < y->count ? 1 : -1;
    return strcmp(x->reason, y->reason);
}

void kf_plan_write_unsized(FILE *f, const kf_plan *p) {
    if (!p->est_unsized) return;
    uint32_t launched = 0;
    for (uint32_t k = 0; k < p->ngroups; k++) launched += p->groups[k].launch != UINT32_MAX;
    fprintf(f, "%u of %u launched groups have symbolic sizes: the cost model priced them at the launch floor and refused "
               "no merge among them as slower, so the estimate is no run's time; plan at sizes with `kfuse fuse "
               "--plan-dim NAME=N` (kf_plan_build_at; a run plans again per input shape)\n",
            p->est_unsized, launched);
}

void kf_fuse_write_report(FILE *f, const kf_model *m, const kf_plan *p) {
    const kf_graph *g = m->graph;
    char r[32], w[32], lb[32];
    fmt_bytes(r, sizeof r, p->bytes_unfused);
    fmt_bytes(w, sizeof w, p->bytes_fused);
    fmt_bytes(lb, sizeof lb, p->bytes_lower_bound);
    fprintf(f, "%u groups, %u launches; modeled DRAM bytes %s unfused -> %s fused (lower bound %s)\n", p->ngroups,
            p->launches, r, w, lb);
    bool est = *p->target != 0;
    if (est)
        fprintf(f, "estimated time on %s: %.1f us (an estimate of the cost model, not a measurement); %u legal merges "
                   "refused as slower\n",
                p->target, p->est_us, p->cost_refusals);
    if (est && p->est_unsized) kf_plan_write_unsized(f, p);
    fputc('\n', f);
    fprintf(f, "%5s %-9s %6s %5s %8s %8s %10s", "group", "kind", "launch", "nodes", "read", "written", "flops");
    if (est) fprintf(f, " %9s %6s %-9s", "est_us", "blocks", "form");
    fprintf(f, "  %s\n", "ops");
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *grp = &p->groups[gi];
        char ops[96];
        size_t used = 0;
        ops[0] = 0;
        for (uint32_t k = 0; k < grp->nnodes && used < sizeof ops; k++) {
            int n = snprintf(ops + used, sizeof ops - used, "%s%s", k ? " " : "", g->nodes[grp->nodes[k]].op_type);
            if (n < 0 || (size_t)n >= sizeof ops - used) {
                snprintf(ops + (sizeof ops > 5 ? sizeof ops - 5 : 0), 5, " ...");
                break;
            }
            used += (size_t)n;
        }
        char fl[32];
        fmt_bytes(r, sizeof r, grp->bytes_read);
        fmt_bytes(w, sizeof w, grp->bytes_written);
        if (grp->flops < 0) snprintf(fl, sizeof fl, "?");
        else snprintf(fl, sizeof fl, "%lld", (long long)grp->flops);
        fprintf(f, "%5u %-9s %6u %5u %8s %8s %10s", gi, kf_fuse_kind_name(grp->kind), grp->launch, grp->nnodes, r, w,
                fl);
        if (est)
            fprintf(f, " %9.1f %6lld %-9s", grp->est_us, (long long)grp->est_blocks,
                    grp->est_form ? grp->est_form : "-");
        fprintf(f, "  %s\n", ops);
    }
    reason_count *rc = kf_calloc(p->nbounds + 1, sizeof(reason_count));
    uint32_t nrc = 0;
    if (!rc) return;
    for (uint32_t b = 0; b < p->nbounds; b++) {
        const char *why = p->bounds[b].reason ? p->bounds[b].reason : "(no reason recorded)";
        uint32_t i = 0;
        while (i < nrc && strcmp(rc[i].reason, why)) i++;
        if (i == nrc) rc[nrc++] = (reason_count){why, 0};
        rc[i].count++;
    }
    qsort(rc, nrc, sizeof *rc, cmp_reason);
    fprintf(f, "\n%u boundaries between groups:\n", p->nbounds);
    for (uint32_t i = 0; i < nrc; i++) fprintf(f, "%8u  %s\n", rc[i].count, rc[i].reason);
    kf_free(rc);
}

/* ---- Graphviz ---------------------------------------------------------------------- */

static void dot_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static const char *kind_colour(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE: return "lightblue";
    case KF_GROUP_REDUCTION: return "palegreen";
    case KF_GROUP_ANCHOR: return "orange";
    case KF_GROUP_OPAQUE: return "lightgrey";
    case KF_GROUP_CONST: return "lightyellow";
    }
    return "white";
}

/* The full path of an executable `name` on PATH, or false. */
static bool on_path(const char *name, char *out, size_t n) {
    const char *path = getenv("PATH");
    if (!path) return false;
    while (*path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len && len + strlen(name) + 2 <= n) {
            snprintf(out, n, "%.*s/%s", (int)len, path, name);
            struct stat sb;
            if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode) && access(out, X_OK) == 0) return true;
        }
        path += len + (end ? 1 : 0);
        if (!end) break;
    }
    return false;
}

kf_status kf_fuse_write_dot(const char *path, const kf_model *m, const kf_plan *p, bool *svg) {
    const kf_graph *g = m->graph;
    if (svg) *svg = false;
    FILE *f = fopen(path, "w");
    if (!f) return kf_fail(KF_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    fputs("digraph kfuse {\n  rankdir=TB;\n  node [shape=box, style=filled, fillcolor=white, fontsize=10];\n"
          "  edge [fontsize=8];\n",
          f);
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *grp = &p->groups[gi];
        fprintf(f, "  subgraph cluster_%u {\n    style=filled; fillcolor=%s; label=\"group %u (%s)\";\n", gi,
                kind_colour(grp->kind), gi, kf_fuse_kind_name(grp->kind));
        for (uint32_t k = 0; k < grp->nnodes; k++) {
            const kf_node *n = &g->nodes[grp->nodes[k]];
            char label[600];
            snprintf(label, sizeof label, "%s\n%s", n->op_type, kf_node_label(n));
            fprintf(f, "    n%u [label=", grp->nodes[k]);
            dot_str(f, label);
            fputs("];\n", f);
        }
        fputs("  }\n", f);
    }
    for (uint32_t i = 0; i < g->ninputs; i++) {
        kf_id v = g->inputs[i];
        if (g->values[v].init) continue;
        fprintf(f, "  v%u [shape=ellipse, label=", v);
        dot_str(f, g->values[v].name);
        fputs("];\n", f);
    }
    for (uint32_t i = 0; i < g->noutputs; i++) {
        kf_id v = g->outputs[i];
        fprintf(f, "  o%u [shape=ellipse, label=", v);
        dot_str(f, g->values[v].name);
        fputs("];\n", f);
        if (g->values[v].producer) {
            fprintf(f, "  n%u -> o%u;\n", g->values[v].producer, v);
        }
    }
    for (kf_id id = 1; id < g->nnodes; id++) {
        const kf_node *n = &g->nodes[id];
        if (n->dead || (p->group_of && id < g->nnodes && p->group_of[id] == UINT32_MAX)) continue;
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i];
            if (!v) continue;
            const kf_value *val = &g->values[v];
            if (val->producer) fprintf(f, "  n%u -> n%u [label=", val->producer, id);
            else if (val->is_input && !val->init) fprintf(f, "  v%u -> n%u [label=", v, id);
            else continue; /* weights and constants would drown the picture */
            dot_str(f, val->name);
            fputs("];\n", f);
        }
    }
    fputs("}\n", f);
    if (fclose(f) != 0) return kf_fail(KF_ERR_IO, "cannot write '%s'", path);
    char dot[1024];
    if (!svg || !on_path("dot", dot, sizeof dot)) return KF_OK;
    size_t plen = strlen(path) + 5;
    char *out = kf_malloc(plen);
    if (!out) return kf_fail(KF_ERR_NOMEM, "out of memory");
    snprintf(out, plen, "%s.svg", path);
    pid_t pid = fork();
    if (pid == 0) {
        execl(dot, "dot", "-Tsvg", path, "-o", out, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    kf_status st = KF_OK;
    if (pid < 0 || waitpid(pid, &ws, 0) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        st = kf_fail(KF_ERR_IO, "dot could not render '%s' into '%s'", path, out);
    else *svg = true;
    kf_free(out);
    return st;
}
