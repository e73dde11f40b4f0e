/*
 * pattern_match.c: matching a rule's source DAG at a node, checking its
 * guards, and applying its replacement. Matching backtracks over operand
 * orders of commutative ops (a flag in the op table, never an op name).
 * A rule either applies completely or declines with a reason (a near miss
 * for the report); it never half-rewrites: every check runs before the
 * first edit.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kf_pattern.h"

typedef struct goal {
    const kf_pat_arg *arg;
    kf_id value;
} goal;

/* One search state: the arrays are sized to the rule (match_pool). */
typedef struct mstate {
    kf_id *bind;    /* value bound to each variable */
    kf_id *node_of; /* graph node matched by each source node */
    int matched;    /* source nodes matched so far */
    goal *goals;
    int ngoals;
    int maxgoals;   /* each source node pushes its operands once: 1 + their sum */
} mstate;

/* A rule's states: [0] is the search's, [k] the copy that an expansion
 * kept while its first operand order is tried, at the depth where it
 * matched its k-th node. A commutative expansion is alive only while the
 * searches below it run, and those match more nodes, so the depths of the
 * copies alive at once differ. */
typedef struct match_pool {
    int nstates;
    mstate states[];
} match_pool;

/* The sizes a rule's search needs: states, and per state variables,
 * source nodes and goals (each source node pushes its operands once). */
typedef struct pool_dims {
    int nstates, nvars, nsrc, maxgoals;
} pool_dims;

static pool_dims dims_of(const kf_rule *r) {
    pool_dims d = {r->nsrc + 1, r->nvars, r->nsrc, 1};
    for (int i = 0; i < r->nsrc; i++) d.maxgoals += r->src[i].nargs;
    return d;
}

static match_pool *pool_new(pool_dims d) {
    size_t per = (size_t)(d.nvars + d.nsrc) * sizeof(kf_id);
    per = (per + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    per += (size_t)d.maxgoals * sizeof(goal);
    size_t head = sizeof(match_pool) + (size_t)d.nstates * sizeof(mstate);
    head = (head + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    match_pool *p = kf_malloc(head + (size_t)d.nstates * per);
    if (!p) return NULL;
    p->nstates = d.nstates;
    for (int k = 0; k < d.nstates; k++) {
        char *base = (char *)p + head + (size_t)k * per;
        mstate *s = &p->states[k];
        s->bind = (kf_id *)base;
        s->node_of = s->bind + d.nvars;
        s->goals = (goal *)(base + per - (size_t)d.maxgoals * sizeof(goal));
        s->maxgoals = d.maxgoals;
        s->matched = s->ngoals = 0;
    }
    return p;
}

static match_pool *pool_for(kf_rule *r) {
    if (!r->match_pool) r->match_pool = pool_new(dims_of(r));
    return r->match_pool;
}

kf_status kf_rules_share_match_pool(kf_ruleset *rs) {
    if (rs->match_pool) return KF_OK;
    pool_dims m = {1, 0, 0, 1};
    uint32_t need = 0;
    for (uint32_t i = 0; i < rs->n; i++) {
        const kf_rule *r = rs->rules[i];
        if (r->fn || r->match_pool) continue;
        need++;
        pool_dims d = dims_of(r);
        if (d.nstates > m.nstates) m.nstates = d.nstates;
        if (d.nvars > m.nvars) m.nvars = d.nvars;
        if (d.nsrc > m.nsrc) m.nsrc = d.nsrc;
        if (d.maxgoals > m.maxgoals) m.maxgoals = d.maxgoals;
    }
    if (need < 2) return KF_OK; /* one rule keeps states of its own (a set wrapping a rule of another set) */
    if (!(rs->match_pool = pool_new(m))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < rs->n; i++) {
        kf_rule *r = rs->rules[i];
        if (r->fn || r->match_pool) continue;
        r->match_pool = rs->match_pool;
        r->match_pool_shared = true;
    }
    return KF_OK;
}

/* A reason for a decline, kept as its pattern and arguments: a try fails
 * many times on its way and only the reason kept in the end is written
 * out (why_text). The arguments are names in the rule or the graph, which
 * stay put until the try returns. */
typedef struct why_note {
    const char *fmt, *a, *b; /* fmt: text with up to two %s; NULL: none */
    bool lit;                /* b is the number `num` */
    double num;
} why_note;

typedef struct mctx {
    const kf_rule *r;
    match_pool *pool;
    const kf_graph *g;
    const kf_model *m;
    why_note why; /* reason of the failure that got furthest */
    int why_depth;
    /* a complete match whose guards failed: the last such guard and what it said */
    const kf_pat_guard *guard;
    char guard_bad[128];
} mctx;

/* Whether a reason given at state s would be kept: the report has room
 * and it got at least as far as the one kept. */
static bool why_wanted(const mctx *c, const mstate *s) {
    return c->r->nnear < KF_PAT_MAX_NEAR && s->matched >= c->why_depth;
}

/* fmt's %s replaced by a, then b ("" for NULL); nothing else is a
 * conversion. Cut at cap - 1 bytes. A report writes hundreds of these, and
 * this is a fraction of snprintf's cost. */
static void put_reason(char *buf, size_t cap, const char *fmt, const char *a, const char *b) {
    size_t len = 0;
    const char *args[2] = {a ? a : "", b ? b : ""};
    int next = 0;
    for (const char *p = fmt; *p && len + 1 < cap; p++) {
        if (p[0] == '%' && p[1] == 's' && next < 2) {
            for (const char *q = args[next++]; *q && len + 1 < cap; q++) buf[len++] = *q;
            p++;
        } else {
            buf[len++] = *p;
        }
    }
    buf[len] = 0;
}

static void fail_at(mctx *c, const mstate *s, const char *fmt, const char *a, const char *b) {
    if (!why_wanted(c, s)) return;
    c->why_depth = s->matched;
    c->why = (why_note){fmt, a, b, false, 0};
}

/* Every element of constant v equals x (relative tolerance tol, at least
 * exact for integers; a zero must be exactly zero, or an epsilon such as
 * 1e-12 would count as 0). NULL constant means "not a constant". */
static bool const_all(const kf_tensor *t, double x, double tol) {
    if (!t || t->dtype == KF_DT_STRING || t->numel == 0) return false;
    for (int64_t i = 0; i < t->numel; i++) {
        double e = kf_get_f64(t, i);
        if (!(fabs(e - x) <= tol * fabs(x))) return false;
    }
    return true;
}

/* Tolerance of a literal operand in a match: float constants written by
 * exporters (sqrt(2), 0.5) survive a float32 round trip to about 1e-7. */
#define LITERAL_TOL 1e-6

static bool attr_equal(const kf_attr *a, const kf_attr *b) {
    if (a->type == KF_ATTR_INT && b->type == KF_ATTR_FLOAT) return (double)a->i == b->f;
    if (a->type == KF_ATTR_FLOAT && b->type == KF_ATTR_INT) return a->f == (double)b->i;
    if (a->type != b->type) return false;
    switch (a->type) {
    case KF_ATTR_INT: return a->i == b->i;
    case KF_ATTR_FLOAT: return a->f == b->f;
    case KF_ATTR_STRING: return a->s.len == b->s.len && memcmp(a->s.ptr, b->s.ptr, a->s.len) == 0;
    case KF_ATTR_INTS: return a->n == b->n && (!a->n || !memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n));
    case KF_ATTR_FLOATS:
        return a->n == b->n && (!a->n || !memcmp(a->floats, b->floats, sizeof(float) * (size_t)a->n));
    default: return false;
    }
}


static bool solve(mctx *c, mstate *s);
static bool guards_hold(mctx *c, const mstate *s);

/* The used part of a search state. */
static void state_copy(mstate *dst, const mstate *src, const kf_rule *r) {
    memcpy(dst->bind, src->bind, (size_t)r->nvars * sizeof *dst->bind);
    memcpy(dst->node_of, src->node_of, (size_t)r->nsrc * sizeof *dst->node_of);
    memcpy(dst->goals, src->goals, (size_t)src->ngoals * sizeof *dst->goals);
    dst->matched = src->matched;
    dst->ngoals = src->ngoals;
}

static void state_clear(mstate *s, const kf_rule *r) {
    memset(s->bind, 0, (size_t)r->nvars * sizeof *s->bind);
    memset(s->node_of, 0, (size_t)r->nsrc * sizeof *s->node_of);
    s->matched = s->ngoals = 0;
}

/* Expands source node sn matched at graph node gn into goals. */
static bool expand(mctx *c, mstate *s, int sn, kf_id gn) {
    const kf_pat_node *pn = &c->r->src[sn];
    const kf_node *n = &c->g->nodes[gn];
    if (pn->opid != n->op) {
        fail_at(c, s, "%s is produced by %s", pn->op, n->op_type);
        return false;
    }
    if (n->nin != pn->nargs) {
        fail_at(c, s, "%s has a different number of inputs%s", pn->op, "");
        return false;
    }
    for (int k = 0; k < pn->nattrs; k++) {
        const kf_attr *want = &pn->attrs[k].value;
        const kf_attr *have = kf_attr_find(n, want->name);
        if (!have || !attr_equal(have, want)) {
            fail_at(c, s, "%s: attribute '%s' differs", pn->op, want->name);
            return false;
        }
    }
    for (int o = 0; o < pn->nouts; o++) {
        kf_id v = o < n->nout ? n->out[o] : 0;
        int var = pn->outs[o];
        if (!v || (s->bind[var] && s->bind[var] != v)) {
            fail_at(c, s, "%s: outputs differ%s", pn->op, "");
            return false;
        }
        s->bind[var] = v;
    }
    s->node_of[sn] = gn;
    s->matched++;
    const kf_op_info *info = kf_op_get(n->op);
    bool comm = info && (info->flags & KF_F_COMMUTATIVE) && pn->nargs == 2;
    if (s->ngoals + pn->nargs > s->maxgoals) return false;
    if (comm) {
        mstate *alt = &c->pool->states[s->matched]; /* see match_pool */
        state_copy(alt, s, c->r);
        s->goals[s->ngoals++] = (goal){&pn->args[0], n->in[0]};
        s->goals[s->ngoals++] = (goal){&pn->args[1], n->in[1]};
        if (solve(c, s)) return true;
        state_copy(s, alt, c->r);
        s->goals[s->ngoals++] = (goal){&pn->args[0], n->in[1]};
        s->goals[s->ngoals++] = (goal){&pn->args[1], n->in[0]};
        return solve(c, s);
    }
    for (int a = pn->nargs - 1; a >= 0; a--) s->goals[s->ngoals++] = (goal){&pn->args[a], n->in[a]};
    return solve(c, s);
}

/* Works through pending goals; true when all are met (s holds the match). */
static bool solve(mctx *c, mstate *s) {
    while (s->ngoals) {
        goal gl = s->goals[--s->ngoals];
        const kf_pat_arg *a = gl.arg;
        kf_id v = gl.value;
        if (a->kind == KF_PA_ANY) continue;
        if (!v) {
            fail_at(c, s, "an input is absent%s%s", "", "");
            return false;
        }
        const kf_value *val = &c->g->values[v];
        if (a->kind == KF_PA_LITERAL) {
            if (!kf_value_is_constant(c->m, v) || !const_all(val->init, a->lit, LITERAL_TOL)) {
                if (why_wanted(c, s)) {
                    fail_at(c, s, "'%s' is not a constant equal to %s", val->name, NULL);
                    c->why.lit = true, c->why.num = a->lit;
                }
                return false;
            }
            continue;
        }
        int var = a->var;
        if (s->bind[var]) {
            if (s->bind[var] != v) {
                fail_at(c, s, "'%s' must be the same value in both places, got '%s'", c->r->vars[var].name, val->name);
                return false;
            }
            continue;
        }
        int sn = c->r->vars[var].src_node;
        if (sn < 0) {
            s->bind[var] = v;
            continue;
        }
        kf_id p = val->producer;
        if (!p || c->g->nodes[p].dead) {
            fail_at(c, s, "'%s' is not computed by a node (pattern wants %s)", val->name, c->r->src[sn].op);
            return false;
        }
        if (s->node_of[sn]) { /* node matched already through another output */
            if (s->node_of[sn] != p) return false;
            continue;
        }
        return expand(c, s, sn, p);
    }
    /* every goal met: the whole pattern is bound. Guards are judged here, so
     * a failing guard sends the search back to the other operand order of
     * a commutative op (Mul(c, kt) where the rule wrote Mul(kt, c)). */
    return guards_hold(c, s);
}

/* ---- guards -------------------------------------------------------------------- */

static bool cmp_ok(kf_cmp c, double a, double b) {
    switch (c) {
    case KF_CMP_EQ: return a == b;
    case KF_CMP_NE: return a != b;
    case KF_CMP_GE: return a >= b;
    case KF_CMP_LE: return a <= b;
    case KF_CMP_GT: return a > b;
    case KF_CMP_LT: return a < b;
    }
    return false;
}


/* Producer of the value bound to var (any node, matched or not). */
static const kf_node *producer_of(const kf_graph *g, kf_id v) {
    kf_id p = v ? g->values[v].producer : 0;
    return p ? &g->nodes[p] : NULL;
}

static const char *check_guard(const kf_model *m, const kf_pat_guard *gd, const mstate *s, char *buf, size_t n) {
    const kf_graph *g = m->graph;
    kf_id v = s->bind[gd->var];
    const kf_value *val = &g->values[v];
    bool fixed = kf_value_is_constant(m, v); /* an initializer the caller cannot override */
    switch (gd->kind) {
    case KF_G_CONST:
        if (!val->init) return "not a constant";
        if (!fixed) return "an initializer the caller may override (a graph input)";
        return NULL;
    case KF_G_CONST_CMP:
        if (!fixed || val->init->dtype == KF_DT_STRING) return "not a constant the model fixes";
        for (int64_t i = 0; i < val->init->numel; i++)
            if (!cmp_ok(gd->cmp, kf_get_f64(val->init, i), gd->value)) return "a constant element does not satisfy the guard";
        return NULL;
    case KF_G_CONST_EQ:
        if (!fixed || !const_all(val->init, gd->value, gd->tol)) {
            snprintf(buf, n, "not a constant equal to %g (tol %g)", gd->value, gd->tol);
            return buf;
        }
        return NULL;
    case KF_G_SCALAR: {
        const kf_type *t = &val->type;
        int64_t cnt = 1;
        if (t->rank < 0) return "shape unknown";
        for (int d = 0; d < t->rank; d++) {
            if (t->dims[d] < 0) return "shape unknown";
            cnt *= t->dims[d];
        }
        return cnt == 1 ? NULL : "not a single element";
    }
    case KF_G_SINGLE_USE:
        if (val->is_output) return "is a graph output";
        return val->nusers == 1 ? NULL : "has other consumers";
    case KF_G_DTYPE:
        for (int i = 0; i < gd->ndtypes; i++)
            if (val->type.dtype == gd->dtypes[i]) return NULL;
        return "dtype not allowed";
    case KF_G_RANK:
        if (val->type.rank < 0) return "rank unknown";
        return cmp_ok(gd->cmp, val->type.rank, gd->value) ? NULL : "rank does not satisfy the guard";
    case KF_G_SAME_SHAPE:
        return kf_type_same_shape(&val->type, &g->values[s->bind[gd->var2]].type) ? NULL : "shapes are not known to be equal";
    case KF_G_SAME_DIM: {
        const kf_type *a = &val->type, *b = &g->values[s->bind[gd->var2]].type;
        if (a->rank < 0 || b->rank < 0) return "rank unknown";
        int i = gd->axis < 0 ? gd->axis + a->rank : gd->axis, j = gd->axis2 < 0 ? gd->axis2 + b->rank : gd->axis2;
        if (i < 0 || i >= a->rank || j < 0 || j >= b->rank) return "no such dim";
        bool same = a->dims[i] >= 0 ? a->dims[i] == b->dims[j] : b->dims[j] < 0 && a->syms[i] && a->syms[i] == b->syms[j];
        return same ? NULL : "dims are not known to be equal";
    }
    case KF_G_ATTR: {
        const kf_node *p = producer_of(g, v);
        const kf_attr *a = p ? kf_attr_find(p, gd->attr) : NULL;
        if (!a && p && gd->has_default) a = &gd->attr_default;
        if (!a) return "attribute absent";
        if (gd->cmp == KF_CMP_EQ) return attr_equal(a, &gd->attr_value) ? NULL : "attribute differs";
        if (gd->cmp == KF_CMP_NE) return attr_equal(a, &gd->attr_value) ? "attribute equal" : NULL;
        double have = a->type == KF_ATTR_INT ? (double)a->i : a->type == KF_ATTR_FLOAT ? a->f : NAN;
        double want = gd->attr_value.type == KF_ATTR_INT ? (double)gd->attr_value.i : gd->attr_value.f;
        return cmp_ok(gd->cmp, have, want) ? NULL : "attribute does not satisfy the guard";
    }
    case KF_G_SAME_ATTR: {
        const kf_node *p = producer_of(g, v), *q = producer_of(g, s->bind[gd->var2]);
        const kf_attr *a = p ? kf_attr_find(p, gd->attr) : NULL, *b = q ? kf_attr_find(q, gd->attr2) : NULL;
        if (!a && p && gd->has_default) a = &gd->attr_default;
        if (!b && q && gd->has_default2) b = &gd->attr_default2;
        if (!a || !b) return "attribute absent";
        return attr_equal(a, b) ? NULL : "attributes differ";
    }
    case KF_G_LAST_AXIS: {
        int rank = g->values[s->bind[gd->var2]].type.rank;
        int64_t ax;
        if (!gd->attr) { /* the axes are the constant v itself */
            const kf_tensor *t = val->init;
            if (!t) return "axes are not a constant";
            if (t->numel != 1 || t->rank > 1 || !kf_dtype_is_int(t->dtype)) return "not a single axis";
            if (rank < 0) return "rank unknown";
            ax = kf_get_i64(t, 0);
            if (ax < 0) ax += rank;
            return ax == rank - 1 ? NULL : "not the last axis";
        }
        const kf_node *p = producer_of(g, v);
        const kf_attr *a = p ? kf_attr_find(p, gd->attr) : NULL;
        if (!a) return "attribute absent";
        if (rank < 0) return "rank unknown";
        if (a->type == KF_ATTR_INT) ax = a->i;
        else if (a->type == KF_ATTR_INTS && a->n == 1) ax = a->ints[0];
        else return "not a single axis";
        if (ax < 0) ax += rank;
        return ax == rank - 1 ? NULL : "not the last axis";
    }
    }
    return "unknown guard";
}

static bool guards_hold(mctx *c, const mstate *s) {
    char buf[128];
    for (int i = 0; i < c->r->nguards; i++) {
        const kf_pat_guard *gd = &c->r->guards[i];
        const char *bad = check_guard(c->m, gd, s, buf, sizeof buf);
        if (bad && c->r->nnear >= KF_PAT_MAX_NEAR) return false; /* the report keeps no more */
        if (bad) {
            c->guard = gd;
            put_reason(c->guard_bad, sizeof c->guard_bad, "%s", bad, NULL); /* bad may be buf */
            return false;
        }
    }
    return true;
}

/* The reason a failed try gives, in buf: its last failed guard, else the
 * failure that got furthest. Not written when the report is full. */
static const char *why_text(const mctx *c, char *buf, size_t n) {
    if (c->r->nnear >= KF_PAT_MAX_NEAR) return "";
    if (c->guard) {
        snprintf(buf, n, "guard at %s:%d on '%s': %s", c->r->file, c->guard->line, c->r->vars[c->guard->var].name,
                 c->guard_bad);
    } else if (c->why.fmt) {
        char lit[32];
        const char *b = c->why.b;
        if (c->why.lit) snprintf(lit, sizeof lit, "%g", c->why.num), b = lit;
        put_reason(buf, n, c->why.fmt, c->why.a, b);
    } else {
        return "structure differs";
    }
    return buf;
}

/* ---- replacement --------------------------------------------------------------- */

static void near_miss(kf_rule *r, const kf_node *n, const char *why) {
    r->misses++;
    if (r->nnear >= KF_PAT_MAX_NEAR) return;
    const char *label = kf_node_label(n);
    for (int k = 0; k < r->nnear; k++) /* a node tried again after an edit elsewhere: one note */
        if (!strcmp(r->near[k].node, label) && !strcmp(r->near[k].reason, why)) return;
    kf_near_miss *nm = &r->near[r->nnear];
    nm->node = kf_strdup(label);
    nm->reason = kf_strdup(why);
    if (nm->node && nm->reason) r->nnear++;
    else {
        kf_free(nm->node);
        kf_free(nm->reason);
    }
}

/* Resolves the attributes of replacement node dn; false when a referenced
 * attribute is absent without default, or a $constant is not a one-element
 * numeric constant (the rule declines). Values of $constants are built in
 * scratch[k] (plain numbers; nothing to release). */
static bool resolve_attrs(const kf_graph *g, const kf_pat_node *dn, const mstate *s, const kf_attr **out,
                          kf_attr *scratch, const char **why) {
    for (int k = 0; k < dn->nattrs; k++) {
        const kf_pat_attr *pa = &dn->attrs[k];
        if (pa->ref_var < 0) {
            out[k] = &pa->value;
            continue;
        }
        if (pa->ref_value) {
            const kf_tensor *t = g->values[s->bind[pa->ref_var]].init;
            const kf_tensor *t2 = pa->ref_var2 >= 0 ? g->values[s->bind[pa->ref_var2]].init : NULL;
            bool arith = pa->ref_var2 >= 0 || pa->ref_recip;
            if (!t || t->numel != 1 || !(kf_dtype_is_float(t->dtype) || kf_dtype_is_int(t->dtype)) ||
                (pa->ref_var2 >= 0 && (!t2 || t2->numel != 1 || !kf_dtype_is_float(t2->dtype))) ||
                (arith && !kf_dtype_is_float(t->dtype))) {
                *why = "a value the replacement reads into an attribute is not a one-element constant";
                return false;
            }
            memset(&scratch[k], 0, sizeof scratch[k]);
            scratch[k].name = pa->value.name;
            if (kf_dtype_is_float(t->dtype)) {
                /* products and quotients in double, rounded once to the attribute's float */
                double x = kf_get_f64(t, 0) * (t2 ? kf_get_f64(t2, 0) : 1.0);
                if (pa->ref_recip) x = 1.0 / x;
                if (!isfinite(x) || fabs(x) > 3.4028234663852886e38) { /* FLT_MAX */
                    *why = "a value the replacement computes for an attribute is not a finite float";
                    return false;
                }
                scratch[k].type = KF_ATTR_FLOAT;
                scratch[k].f = (float)x;
            } else {
                scratch[k].type = KF_ATTR_INT;
                scratch[k].i = kf_get_i64(t, 0);
            }
            out[k] = &scratch[k];
            continue;
        }
        const kf_node *p = producer_of(g, s->bind[pa->ref_var]);
        const kf_attr *a = p ? kf_attr_find(p, pa->ref_attr) : NULL;
        if (!a && !pa->has_default) {
            *why = "an attribute the replacement copies is absent";
            return false;
        }
        out[k] = a ? a : &pa->value;
    }
    return true;
}

static kf_status apply(kf_rule *r, kf_model *m, kf_id root_node, mstate *s) {
    kf_graph *g = m->graph;
    const kf_node *rn = &g->nodes[root_node];
    kf_id root_val = s->bind[r->src[r->nsrc - 1].outs[0]];
    kf_dtype lit_dtype = g->values[root_val].type.dtype;
    char base[512];
    snprintf(base, sizeof base, "%s/%s", g->values[root_val].name, r->name);
    kf_id created[KF_PAT_MAX_VARS] = {0};
    for (int i = 0; i < r->ndst; i++) {
        const kf_pat_node *dn = &r->dst[i];
        kf_id ins[KF_PAT_MAX_ARGS], outs[KF_PAT_MAX_OUTS];
        for (int a = 0; a < dn->nargs; a++) {
            const kf_pat_arg *pa = &dn->args[a];
            if (pa->kind == KF_PA_LITERAL) {
                kf_tensor *t = kf_tensor_new();
                if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
                kf_status st = kf_tensor_alloc(t, lit_dtype, 0, NULL);
                if (st) {
                    kf_tensor_free(t);
                    return st;
                }
                kf_set_f64(t, 0, pa->lit);
                KF_TRY(kf_graph_add_constant(g, base, t, &ins[a]));
            } else {
                int var = pa->var;
                ins[a] = r->vars[var].dst_node >= 0 ? created[var] : s->bind[var];
            }
        }
        for (int o = 0; o < dn->nouts; o++) KF_TRY(kf_graph_fresh_value(g, base, &outs[o]));
        for (int o = 0; o < dn->nouts; o++) created[dn->outs[o]] = outs[o];
        const kf_attr *attrs[64];
        kf_attr scratch[64];
        const char *why = NULL;
        if (dn->nattrs > 64 || !resolve_attrs(g, dn, s, attrs, scratch, &why))
            return kf_fail(KF_ERR_INTERNAL, "rule '%s': attributes changed during the rewrite", r->name);
        kf_id nid;
        char nname[600];
        snprintf(nname, sizeof nname, "%s/%d", base, i);
        KF_TRY(kf_graph_add_node(g, dn->op, dn->domain, nname, ins, dn->nargs, outs, dn->nouts, &nid));
        kf_node *n = &g->nodes[nid];
        n->op = kf_op_lookup(dn->domain, dn->op);
        n->opset = kf_model_opset(m, dn->domain);
        for (int k = 0; k < dn->nattrs; k++) {
            kf_attr copy = *attrs[k];
            copy.name = dn->attrs[k].value.name; /* the replacement's name for it */
            KF_TRY(kf_node_add_attr(n, &copy));
        }
        if (dn->copy_from) { /* {@V.*}: the rest of V's producer's attributes */
            const kf_node *p = producer_of(g, s->bind[dn->copy_from - 1]);
            for (int k = 0; p && k < p->nattrs; k++)
                if (!kf_attr_find(n, p->attrs[k].name)) KF_TRY(kf_node_add_attr(n, &p->attrs[k]));
        }
        KF_TRY(kf_infer_node(m, nid));
    }
    kf_id result = r->vars[r->result_var].dst_node >= 0 ? created[r->result_var] : s->bind[r->result_var];
    (void)rn;
    return kf_graph_replace_uses(g, root_val, result);
}

kf_status kf_rule_try(kf_rule *r, kf_model *m, kf_id node, bool *applied) {
    *applied = false;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    r->attempts++;
    if (r->fn) {
        const char *why = NULL;
        KF_TRY(r->fn(m, node, r->user, applied, &why));
        if (*applied) r->hits++;
        else if (why) near_miss(r, &g->nodes[node], why);
        return KF_OK;
    }
    const kf_pat_node *root = &r->src[r->nsrc - 1];
    if (root->opid != n->op) return KF_OK;
    mctx c;
    c.r = r, c.g = g, c.m = m, c.why_depth = -1;
    c.why.fmt = NULL, c.guard = NULL;
    if (!(c.pool = pool_for(r))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    mstate *s = &c.pool->states[0];
    state_clear(s, r);
    kf_pat_arg root_arg = {KF_PA_VAR, root->outs[0], 0};
    s->goals[s->ngoals++] = (goal){&root_arg, n->out[0]};
    kf_status st = KF_OK;
    char why[384];
    if (!n->out[0] || !solve(&c, s)) {
        near_miss(r, n, why_text(&c, why, sizeof why));
        goto done;
    }
    if (r->min_opset && kf_model_opset(m, "") < r->min_opset) {
        snprintf(why, sizeof why, "needs opset %lld, the model imports %lld", (long long)r->min_opset,
                 (long long)kf_model_opset(m, ""));
        near_miss(r, n, why);
        r->opset_misses++;
        goto done;
    }
    kf_id root_val = s->bind[root->outs[0]];
    if (r->vars[r->result_var].dst_node < 0) {
        const kf_value *rv = &g->values[s->bind[r->result_var]];
        if (g->values[root_val].is_output && (rv->is_input || rv->is_output || rv->init)) {
            near_miss(r, n, "would replace a graph output by a graph input, output or constant");
            goto done;
        }
        if (!kf_type_same_shape(&g->values[root_val].type, &rv->type) ||
            g->values[root_val].type.dtype != rv->type.dtype) {
            near_miss(r, n, "the value that would replace the root may differ in shape or dtype");
            goto done;
        }
    }
    for (int i = 0; i < r->ndst; i++) {
        const kf_attr *attrs[64];
        kf_attr scratch[64];
        const char *bad = NULL;
        if (r->dst[i].nattrs > 64 || !resolve_attrs(g, &r->dst[i], s, attrs, scratch, &bad)) {
            near_miss(r, n, bad ? bad : "too many attributes");
            goto done;
        }
        for (int a = 0; a < r->dst[i].nargs; a++)
            if (r->dst[i].args[a].kind == KF_PA_LITERAL && !kf_dtype_is_float(g->values[root_val].type.dtype) &&
                !kf_dtype_is_int(g->values[root_val].type.dtype)) {
                near_miss(r, n, "the root's dtype is unknown, so a literal cannot be typed");
                goto done;
            }
    }
    st = apply(r, m, node, s);
    if (!st) {
        *applied = true;
        r->hits++;
    }
done:
    return st;
}
