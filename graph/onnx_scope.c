/*
 * onnx_scope.c: name scopes of ONNX subgraphs. A control-flow body (If
 * branch, Loop or Scan body, nested ones too) may read values of the graphs
 * around it by name. Import finds those names so the owning node counts as
 * a user of each (kf_node.ncap: DCE, CSE, fusion and export order then keep
 * them); export renames them when a rewrite redirected a captured slot.
 * Part of the ONNX import/export stage (onnx.c); the bodies themselves stay
 * packed, carried byte for byte.
 *
 *   main graph:  c = Add(a, b)     If(cond) then_branch { y = Mul(x, c) }
 *                                                              ^ captured: the If
 *                                                                is a user of c
 */
#include <string.h>

#include "onnx_scope.h"

/* ---- a set of names (open addressing; the strings are not owned) ------- */

typedef struct nameset {
    const char **slot;
    uint32_t cap, n;
} nameset;

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

static bool ns_has(const nameset *s, const char *name) {
    if (!s->cap) return false;
    for (uint32_t i = name_hash(name) & (s->cap - 1); s->slot[i]; i = (i + 1) & (s->cap - 1))
        if (!strcmp(s->slot[i], name)) return true;
    return false;
}

/* Adds name; *added (may be NULL) says whether it was new. */
static kf_status ns_add(nameset *s, const char *name, bool *added) {
    if (added) *added = false;
    if (ns_has(s, name)) return KF_OK;
    if ((uint64_t)(s->n + 1) * 2 > s->cap) {
        uint64_t cap = s->cap ? (uint64_t)s->cap * 2 : 16;
        if (cap > UINT32_MAX / 2) return kf_fail(KF_ERR_NOMEM, "too many names in a subgraph");
        const char **slot = kf_calloc((size_t)cap, sizeof(char *));
        if (!slot) return kf_fail(KF_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < s->cap; i++) {
            if (!s->slot[i]) continue;
            uint32_t j = name_hash(s->slot[i]) & (uint32_t)(cap - 1);
            while (slot[j]) j = (j + 1) & (uint32_t)(cap - 1);
            slot[j] = s->slot[i];
        }
        kf_free(s->slot);
        s->slot = slot;
        s->cap = (uint32_t)cap;
    }
    uint32_t i = name_hash(name) & (s->cap - 1);
    while (s->slot[i]) i = (i + 1) & (s->cap - 1);
    s->slot[i] = name;
    s->n++;
    if (added) *added = true;
    return KF_OK;
}

static void ns_free(nameset *s) {
    kf_free(s->slot);
    memset(s, 0, sizeof *s);
}

static bool named(const char *s) { return s && s[0]; }

/* The names graph gp defines itself: inputs, initializers (dense and
 * sparse) and node outputs. */
static kf_status graph_defs(const Onnx__GraphProto *gp, nameset *defs) {
    for (size_t i = 0; i < gp->n_input; i++)
        if (gp->input[i] && named(gp->input[i]->name)) KF_TRY(ns_add(defs, gp->input[i]->name, NULL));
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (named(gp->initializer[i]->name)) KF_TRY(ns_add(defs, gp->initializer[i]->name, NULL));
    for (size_t i = 0; i < gp->n_sparse_initializer; i++) {
        const Onnx__SparseTensorProto *sp = gp->sparse_initializer[i];
        if (sp->values && named(sp->values->name)) KF_TRY(ns_add(defs, sp->values->name, NULL));
    }
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t k = 0; k < gp->node[i]->n_output; k++)
            if (named(gp->node[i]->output[k])) KF_TRY(ns_add(defs, gp->node[i]->output[k], NULL));
    return KF_OK;
}

/* ---- import: what a body reads from outside ------------------------------ */

typedef struct scope {
    const struct scope *up;
    nameset defs;
} scope;

static bool in_scope(const scope *s, const char *name) {
    for (; s; s = s->up)
        if (ns_has(&s->defs, name)) return true;
    return false;
}

/* Names read from outside every body scope, first reader first. */
typedef struct outer_reads {
    nameset seen;
    const char **name, **reader; /* reader: the body node (or "output") */
    uint32_t n, cap;
} outer_reads;

static kf_status note_read(outer_reads *r, const char *name, const char *reader) {
    bool added;
    KF_TRY(ns_add(&r->seen, name, &added));
    if (!added) return KF_OK;
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 8;
        const char **nn = kf_realloc(r->name, cap * sizeof(char *));
        if (!nn) return kf_fail(KF_ERR_NOMEM, "out of memory");
        r->name = nn;
        const char **nr = kf_realloc(r->reader, cap * sizeof(char *));
        if (!nr) return kf_fail(KF_ERR_NOMEM, "out of memory");
        r->reader = nr;
        r->cap = cap;
    }
    r->name[r->n] = name;
    r->reader[r->n++] = reader;
    return KF_OK;
}

static kf_status walk_reads(const Onnx__GraphProto *gp, const scope *up, outer_reads *r, int depth);

static kf_status walk_attr_reads(const Onnx__AttributeProto *ap, const scope *s, outer_reads *r, int depth) {
    if (ap->g) KF_TRY(walk_reads(ap->g, s, r, depth + 1));
    for (size_t i = 0; i < ap->n_graphs; i++) KF_TRY(walk_reads(ap->graphs[i], s, r, depth + 1));
    return KF_OK;
}

static kf_status walk_reads(const Onnx__GraphProto *gp, const scope *up, outer_reads *r, int depth) {
    /* the file passed kf_proto_check_depth, so this only guards the stack */
    if (depth > KF_MAX_PROTO_DEPTH)
        return kf_fail(KF_ERR_BAD_MODEL, "subgraphs nested deeper than %d levels", KF_MAX_PROTO_DEPTH);
    scope s = {up, {0}};
    kf_status st = graph_defs(gp, &s.defs);
    for (size_t i = 0; i < gp->n_node && !st; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *label = named(np->name) ? np->name : named(np->op_type) ? np->op_type : "?";
        for (size_t k = 0; k < np->n_input && !st; k++)
            if (named(np->input[k]) && !in_scope(&s, np->input[k])) st = note_read(r, np->input[k], label);
        for (size_t k = 0; k < np->n_attribute && !st; k++) st = walk_attr_reads(np->attribute[k], &s, r, depth);
    }
    for (size_t i = 0; i < gp->n_output && !st; i++) {
        const char *o = gp->output[i] ? gp->output[i]->name : NULL;
        if (named(o) && !in_scope(&s, o)) st = note_read(r, o, "(body output)");
    }
    ns_free(&s.defs);
    return st;
}

kf_status kf_onnx_node_captures(kf_graph *g, kf_id nid, const Onnx__NodeProto *np) {
    outer_reads r = {0};
    kf_status st = KF_OK;
    for (size_t k = 0; k < np->n_attribute && !st; k++) {
        const Onnx__AttributeProto *ap = np->attribute[k];
        uint32_t first = r.n;
        if ((st = walk_attr_reads(ap, NULL, &r, 0))) {
            kf_fail_context(st, "node '%s' attribute '%s'", kf_node_label(kf_node_at(g, nid)), ap->name ? ap->name : "");
            break;
        }
        for (uint32_t i = first; i < r.n && !st; i++) {
            kf_id v = kf_graph_find(g, r.name[i]);
            if (!v) {
                const kf_node *n = kf_node_at(g, nid);
                st = kf_fail(KF_ERR_BAD_MODEL,
                             "node '%s' (%s): attribute '%s': body node '%s' reads '%s', which neither the body nor "
                             "any enclosing graph defines",
                             kf_node_label(n), n->op_type, ap->name ? ap->name : "", r.reader[i], r.name[i]);
            } else {
                st = kf_node_add_capture(g, nid, v, r.name[i]);
            }
        }
    }
    ns_free(&r.seen);
    kf_free(r.name);
    kf_free(r.reader);
    return st;
}

kf_status kf_onnx_outer_names(const Onnx__GraphProto *gp, const char ***names, uint32_t *n) {
    outer_reads r = {0};
    kf_status st = walk_reads(gp, NULL, &r, 0);
    ns_free(&r.seen);
    kf_free(r.reader);
    if (st) {
        kf_free(r.name);
        r.name = NULL;
        r.n = 0;
    }
    *names = r.name;
    *n = r.n;
    return st;
}

/* ---- export: renaming captured references --------------------------------- */

static kf_status set_name(char **slot, const char *name) {
    char *c = kf_strdup(name);
    if (!c) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_free(*slot);
    *slot = c;
    return KF_OK;
}

/* Index of name among from[0..n), or -1. */
static int find_name(const char *const *from, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (!strcmp(from[k], name)) return k;
    return -1;
}

static kf_status rename_graph(Onnx__GraphProto *gp, const char *const *from, const char *const *to, int n,
                              const char *nname, const char *aname, int depth);

static kf_status rename_attr(Onnx__AttributeProto *ap, const char *const *from, const char *const *to, int n,
                             const char *nname, int depth) {
    const char *aname = ap->name ? ap->name : "";
    if (ap->g) KF_TRY(rename_graph(ap->g, from, to, n, nname, aname, depth + 1));
    for (size_t i = 0; i < ap->n_graphs; i++) KF_TRY(rename_graph(ap->graphs[i], from, to, n, nname, aname, depth + 1));
    return KF_OK;
}

static kf_status rename_graph(Onnx__GraphProto *gp, const char *const *from, const char *const *to, int n,
                              const char *nname, const char *aname, int depth) {
    if (depth > KF_MAX_PROTO_DEPTH)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s': subgraphs nested deeper than %d levels", nname, KF_MAX_PROTO_DEPTH);
    nameset defs = {0};
    const char **af = kf_calloc((size_t)n + 1, sizeof(char *)), **at = kf_calloc((size_t)n + 1, sizeof(char *));
    kf_status st = !af || !at ? kf_fail(KF_ERR_NOMEM, "out of memory") : graph_defs(gp, &defs);
    /* a body that defines from[k] itself hides the outer value from its
     * nodes and everything nested in them */
    int na = 0;
    for (int k = 0; k < n && !st; k++) {
        if (ns_has(&defs, from[k])) continue;
        if (ns_has(&defs, to[k]))
            st = kf_fail(KF_ERR_UNSUPPORTED,
                         "node '%s': attribute '%s': the body defines '%s' itself, so the captured value '%s' "
                         "cannot be renamed to it",
                         nname, aname, to[k], from[k]);
        af[na] = from[k];
        at[na++] = to[k];
    }
    for (size_t i = 0; i < gp->n_node && !st && na; i++) {
        Onnx__NodeProto *np = gp->node[i];
        for (size_t k = 0; k < np->n_input && !st; k++) {
            int j = named(np->input[k]) ? find_name(af, na, np->input[k]) : -1;
            if (j >= 0) st = set_name(&np->input[k], at[j]);
        }
        for (size_t k = 0; k < np->n_attribute && !st; k++) st = rename_attr(np->attribute[k], af, at, na, nname, depth);
    }
    for (size_t i = 0; i < gp->n_output && !st && na; i++) {
        int j = gp->output[i] && named(gp->output[i]->name) ? find_name(af, na, gp->output[i]->name) : -1;
        if (j >= 0) st = set_name(&gp->output[i]->name, at[j]);
    }
    for (size_t i = 0; i < gp->n_value_info && !st && na; i++) {
        int j = named(gp->value_info[i]->name) ? find_name(af, na, gp->value_info[i]->name) : -1;
        if (j >= 0) st = set_name(&gp->value_info[i]->name, at[j]);
    }
    ns_free(&defs);
    kf_free(af);
    kf_free(at);
    return st;
}

kf_status kf_onnx_rename_captures(Onnx__AttributeProto *ap, const char *const *from, const char *const *to, int n,
                                  const char *nname) {
    return rename_attr(ap, from, to, n, nname, 0);
}
