/*
 * symdim.c: arithmetic on symbolic dims. An expression is a polynomial with
 * int64 coefficients over atoms; an atom is a name of the file or a floor
 * quotient floor(x / c) of another symbol by a constant. Polynomials are
 * canonical (factors sorted within a term, terms sorted, like terms merged,
 * zero terms dropped) and interned in the graph's symbol table, so equal
 * expressions have equal ids and equality needs no algebra.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_sym.h"

#define SX_TERMS 8
#define SX_FACTORS 6

typedef struct term {
    int64_t c;
    int nf;
    uint32_t f[SX_FACTORS]; /* atom ids, ascending */
} term;

typedef struct poly {
    int nt;
    term t[SX_TERMS];
} poly;

enum { SX_POLY = 1, SX_FLOOR = 2 };

struct kf_symexpr {
    int kind;
    poly p;       /* SX_POLY */
    uint32_t num; /* SX_FLOOR: floor(num / den) */
    int64_t den;
};

static const struct kf_symexpr *expr_of(const kf_graph *g, uint32_t sym) {
    return sym && sym < g->nsymx ? g->symx[sym] : NULL;
}

bool kf_sym_is_expr(const kf_graph *g, uint32_t sym) { return expr_of(g, sym) != NULL; }

kf_status kf_sym_take_nomem(kf_graph *g) {
    if (!g->sym_nomem) return KF_OK;
    g->sym_nomem = false;
    return kf_fail(KF_ERR_NOMEM, "out of memory");
}

const char *kf_sym_name(const kf_graph *g, uint32_t sym) {
    return sym && sym != KF_SYM_UNKNOWN && sym < g->nsyms ? g->syms[sym] : "?";
}

kf_sdim kf_type_sdim(const kf_type *t, int d) {
    if (t->rank < 0 || d < 0 || d >= t->rank) return kf_sdim_unknown();
    if (t->dims[d] >= 0) return kf_sdim_const(t->dims[d]);
    return t->syms[d] ? (kf_sdim){-1, t->syms[d]} : kf_sdim_unknown();
}

void kf_type_set_sdim(kf_type *t, int d, kf_sdim s) {
    t->dims[d] = s.sym == 0 && s.v >= 0 ? s.v : -1;
    t->syms[d] = s.sym != 0 && s.sym != KF_SYM_UNKNOWN ? s.sym : 0;
}

/* ---- canonical polynomials ------------------------------------------- */

/* *r = a * b for signed operands; false on overflow. */
static bool smul(int64_t a, int64_t b, int64_t *r) {
    bool over = a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
                      : (b > 0 ? a < INT64_MIN / b : (a != 0 && b < INT64_MAX / a));
    if (over) return false;
    *r = a * b;
    return true;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Terms with more factors first, so expressions read `a*b+a+1`. */
static int cmp_term(const term *a, const term *b) {
    if (a->nf != b->nf) return a->nf > b->nf ? -1 : 1;
    for (int i = 0; i < a->nf; i++)
        if (a->f[i] != b->f[i]) return a->f[i] < b->f[i] ? -1 : 1;
    return 0;
}

static int cmp_term_v(const void *a, const void *b) { return cmp_term(a, b); }

/* Sorts each term's factors and the terms, merges like terms and drops
 * zeros into *p, with unused slots cleared. False on coefficient overflow or more than SX_TERMS terms
 * left. */
static bool canon(term *all, int n, poly *p) {
    for (int i = 0; i < n; i++) qsort(all[i].f, (size_t)all[i].nf, sizeof(uint32_t), cmp_u32);
    qsort(all, (size_t)n, sizeof(term), cmp_term_v);
    int w = 0;
    for (int i = 0; i < n; i++) {
        if (w > 0 && cmp_term(&all[w - 1], &all[i]) == 0) {
            if (!kf_add_ok(all[w - 1].c, all[i].c, &all[w - 1].c)) return false;
        } else {
            all[w++] = all[i];
        }
    }
    memset(p, 0, sizeof *p);
    for (int i = 0; i < w; i++) {
        if (!all[i].c) continue;
        if (p->nt == SX_TERMS) return false;
        p->t[p->nt] = all[i];
        for (int k = all[i].nf; k < SX_FACTORS; k++) p->t[p->nt].f[k] = 0;
        p->nt++;
    }
    return true;
}

/* Field by field: structs may carry padding bytes that memcmp would read. */
static bool poly_eq(const poly *a, const poly *b) {
    if (a->nt != b->nt) return false;
    for (int i = 0; i < a->nt; i++) {
        if (a->t[i].c != b->t[i].c || a->t[i].nf != b->t[i].nf) return false;
        for (int k = 0; k < a->t[i].nf; k++)
            if (a->t[i].f[k] != b->t[i].f[k]) return false;
    }
    return true;
}

static bool expr_eq(const struct kf_symexpr *a, const struct kf_symexpr *b) {
    if (a->kind != b->kind) return false;
    return a->kind == SX_POLY ? poly_eq(&a->p, &b->p) : a->num == b->num && a->den == b->den;
}

/* d as a polynomial; false for unknown dims. */
static bool to_poly(const kf_graph *g, kf_sdim d, poly *p) {
    memset(p, 0, sizeof *p);
    if (!kf_sdim_known(d)) return false;
    if (d.sym == 0) {
        if (d.v) p->t[p->nt++] = (term){d.v, 0, {0}};
        return true;
    }
    const struct kf_symexpr *x = expr_of(g, d.sym);
    if (x && x->kind == SX_POLY) {
        *p = x->p;
        return true;
    }
    p->t[0] = (term){1, 1, {d.sym}};
    p->nt = 1;
    return true;
}

static void put_text(char *buf, size_t cap, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (*len + n + 1 > cap) n = *len + 1 < cap ? cap - *len - 1 : 0;
    memcpy(buf + *len, s, n);
    *len += n;
    buf[*len] = 0;
}

/* The expression's text: terms in canonical order, `+`/`-` between them,
 * coefficients before factors joined by `*`. */
static void poly_text(const kf_graph *g, const poly *p, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < p->nt; i++) {
        const term *t = &p->t[i];
        int64_t c = t->c;
        char num[32];
        if (c < 0) {
            put_text(buf, cap, &len, "-");
            c = c == INT64_MIN ? INT64_MAX : -c;
        } else if (i > 0) {
            put_text(buf, cap, &len, "+");
        }
        bool first = true;
        if (c != 1 || t->nf == 0) {
            snprintf(num, sizeof num, "%lld", (long long)c);
            put_text(buf, cap, &len, num);
            first = false;
        }
        for (int k = 0; k < t->nf; k++) {
            if (!first) put_text(buf, cap, &len, "*");
            put_text(buf, cap, &len, g->syms[t->f[k]]);
            first = false;
        }
    }
}

/* Finds or adds the symbol for expression x (x fully canonical). */
static uint32_t intern(kf_graph *g, const struct kf_symexpr *x) {
    for (uint32_t i = 1; i < g->nsyms; i++) {
        const struct kf_symexpr *y = expr_of(g, i);
        if (y && expr_eq(x, y)) return i;
    }
    char text[512];
    if (x->kind == SX_POLY) {
        poly_text(g, &x->p, text, sizeof text);
    } else {
        const struct kf_symexpr *nx = expr_of(g, x->num);
        bool paren = nx && nx->kind == SX_POLY && nx->p.nt > 1;
        snprintf(text, sizeof text, "floor(%s%s%s/%lld)", paren ? "(" : "", g->syms[x->num], paren ? ")" : "",
                 (long long)x->den);
    }
    /* a name spelled like the expression is that expression: a file kfuse
     * wrote declares `N*S` where inference derives N*S */
    uint32_t named = 0;
    for (uint32_t i = 1; i < g->nsyms && !named; i++)
        if (!expr_of(g, i) && !strcmp(g->syms[i], text)) named = i;
    struct kf_symexpr *copy = kf_malloc(sizeof *copy);
    uint32_t id = !copy ? 0 : named ? named : kf_graph_sym(g, text);
    if (!id || kf_grow((void **)&g->symx, &g->capsymx, g->nsyms, sizeof *g->symx)) {
        kf_free(copy);
        g->sym_nomem = true;
        return 0;
    }
    *copy = *x;
    for (uint32_t i = g->nsymx; i < g->nsyms; i++) g->symx[i] = NULL;
    g->nsymx = g->nsyms;
    g->symx[id] = copy;
    return id;
}

static kf_sdim from_terms(kf_graph *g, term *all, int n) {
    poly pp, *p = &pp;
    if (!canon(all, n, p)) return kf_sdim_unknown();
    if (p->nt == 0) return kf_sdim_const(0);
    if (p->nt == 1 && p->t[0].nf == 0) return kf_sdim_const(p->t[0].c);
    if (p->nt == 1 && p->t[0].nf == 1 && p->t[0].c == 1) return (kf_sdim){-1, p->t[0].f[0]};
    struct kf_symexpr x;
    memset(&x, 0, sizeof x);
    x.kind = SX_POLY;
    x.p = *p;
    uint32_t id = intern(g, &x);
    return id ? (kf_sdim){-1, id} : kf_sdim_unknown();
}

/* ---- arithmetic --------------------------------------------------------- */

/* Answers of add, mul and div on symbolic operands, by operation and
 * operands. Shape inference asks the same ones again and again (a
 * Reshape's element count at every look), and each costs a canonical sort
 * and an intern; symbols only grow, so an answer never goes stale. A
 * direct-mapped table: a collision just computes again. */
#define SDIM_MEMO_SLOTS 256
typedef enum { MEMO_NONE, MEMO_ADD, MEMO_MUL, MEMO_DIV } memo_op;
typedef struct memo_entry {
    kf_sdim a, b, r;
    memo_op op;
} memo_entry;
struct kf_sdim_memo {
    memo_entry e[SDIM_MEMO_SLOTS];
};

static memo_entry *memo_slot(kf_graph *g, memo_op op, kf_sdim a, kf_sdim b) {
    if (!g->sdim_memo && !(g->sdim_memo = kf_calloc(1, sizeof *g->sdim_memo))) return NULL;
    uint64_t h = ((uint64_t)a.v * 0x9E3779B97F4A7C15u) ^ ((uint64_t)a.sym << 7) ^ ((uint64_t)b.v * 0xC2B2AE3D27D4EB4Fu) ^
                 ((uint64_t)b.sym << 17) ^ (uint64_t)op;
    h ^= h >> 29;
    return &g->sdim_memo->e[h % SDIM_MEMO_SLOTS];
}

/* f(g, a, b) on symbolic operands, from the table when it was asked
 * before; an answer made while memory ran out is not kept (that is
 * reported once, by kf_sym_take_nomem, and a later call may succeed). */
static kf_sdim memoized(kf_graph *g, memo_op op, kf_sdim a, kf_sdim b, kf_sdim (*f)(kf_graph *, kf_sdim, kf_sdim)) {
    memo_entry *e = memo_slot(g, op, a, b);
    if (e && e->op == op && e->a.v == a.v && e->a.sym == a.sym && e->b.v == b.v && e->b.sym == b.sym) return e->r;
    kf_sdim r = f(g, a, b);
    if (e && !g->sym_nomem) *e = (memo_entry){a, b, r, op};
    return r;
}

static kf_sdim add_terms(kf_graph *g, kf_sdim a, kf_sdim b) {
    poly p, q;
    if (!to_poly(g, a, &p) || !to_poly(g, b, &q)) return kf_sdim_unknown();
    term all[SX_TERMS * 2];
    int n = 0;
    for (int i = 0; i < p.nt; i++) all[n++] = p.t[i];
    for (int i = 0; i < q.nt; i++) all[n++] = q.t[i];
    return from_terms(g, all, n);
}

/* *r = p * q, canonical; false when it does not fit the form. */
static bool poly_mul(const poly *p, const poly *q, poly *r) {
    if (p->nt * q->nt > SX_TERMS * 2) return false;
    term all[SX_TERMS * 2];
    int n = 0;
    for (int i = 0; i < p->nt; i++)
        for (int j = 0; j < q->nt; j++) {
            term t = {0, 0, {0}};
            if (p->t[i].nf + q->t[j].nf > SX_FACTORS || !smul(p->t[i].c, q->t[j].c, &t.c)) return false;
            for (int k = 0; k < p->t[i].nf; k++) t.f[t.nf++] = p->t[i].f[k];
            for (int k = 0; k < q->t[j].nf; k++) t.f[t.nf++] = q->t[j].f[k];
            all[n++] = t;
        }
    return canon(all, n, r);
}

static kf_sdim mul_terms(kf_graph *g, kf_sdim a, kf_sdim b) {
    poly p, q, r;
    if (!to_poly(g, a, &p) || !to_poly(g, b, &q) || !poly_mul(&p, &q, &r)) return kf_sdim_unknown();
    return from_terms(g, r.t, r.nt);
}

kf_sdim kf_sdim_add(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (!kf_sdim_known(a) || !kf_sdim_known(b)) return kf_sdim_unknown();
    if (a.sym == 0 && b.sym == 0) {
        int64_t r;
        return kf_add_ok(a.v, b.v, &r) ? kf_sdim_const(r) : kf_sdim_unknown();
    }
    return memoized(g, MEMO_ADD, a, b, add_terms);
}

kf_sdim kf_sdim_mul(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (!kf_sdim_known(a) || !kf_sdim_known(b)) return kf_sdim_unknown();
    if (a.sym == 0 && b.sym == 0) {
        int64_t v;
        return smul(a.v, b.v, &v) ? kf_sdim_const(v) : kf_sdim_unknown();
    }
    return memoized(g, MEMO_MUL, a, b, mul_terms);
}

int kf_type_numel_cmp(const kf_graph *g, const kf_type *a, const kf_type *b) {
    poly pr[2];
    const kf_type *ts[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const kf_type *t = ts[k];
        if (t->rank < 0) return -1;
        memset(&pr[k], 0, sizeof pr[k]);
        pr[k].t[0] = (term){1, 0, {0}};
        pr[k].nt = 1;
        for (int d = 0; d < t->rank; d++) {
            poly f, r;
            if (!to_poly(g, kf_type_sdim(t, d), &f) || !poly_mul(&pr[k], &f, &r)) return -1;
            pr[k] = r;
        }
    }
    return poly_eq(&pr[0], &pr[1]);
}

kf_sdim kf_sdim_sub(kf_graph *g, kf_sdim a, kf_sdim b) {
    return kf_sdim_add(g, a, kf_sdim_mul(g, b, kf_sdim_const(-1)));
}

/* Removes the factors of `sub` (sorted) from t's (sorted); false when t
 * does not hold them all. */
static bool take_factors(term *t, const term *sub) {
    uint32_t rest[SX_FACTORS];
    int nr = 0, j = 0;
    for (int i = 0; i < t->nf; i++) {
        if (j < sub->nf && t->f[i] == sub->f[j]) j++;
        else rest[nr++] = t->f[i];
    }
    if (j < sub->nf) return false;
    memset(t->f, 0, sizeof t->f);
    memcpy(t->f, rest, sizeof(uint32_t) * (size_t)nr);
    t->nf = nr;
    return true;
}

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static kf_sdim div_terms(kf_graph *g, kf_sdim a, kf_sdim b);

kf_sdim kf_sdim_div(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (!kf_sdim_known(a) || !kf_sdim_known(b)) return kf_sdim_unknown();
    if (b.sym == 0) {
        if (b.v == 0) return kf_sdim_unknown();
        if (a.sym == 0) return (a.v == INT64_MIN && b.v == -1) ? kf_sdim_unknown() : kf_sdim_const(floor_div(a.v, b.v));
        if (b.v == 1) return a;
    }
    return memoized(g, MEMO_DIV, a, b, div_terms);
}

static kf_sdim div_terms(kf_graph *g, kf_sdim a, kf_sdim b) {
    poly p, q;
    if (!to_poly(g, a, &p) || !to_poly(g, b, &q)) return kf_sdim_unknown();
    /* exact division by a single term: every term of a holds its factors
     * and a multiple of its coefficient */
    if (q.nt == 1 && q.t[0].c != 0) {
        poly r = p;
        bool exact = true;
        for (int i = 0; i < r.nt && exact; i++)
            exact = r.t[i].c % q.t[0].c == 0 && take_factors(&r.t[i], &q.t[0]);
        if (exact) {
            for (int i = 0; i < r.nt; i++) r.t[i].c /= q.t[0].c;
            return from_terms(g, r.t, r.nt);
        }
    }
    if (b.sym != 0 || b.v < 0) return kf_sdim_unknown();
    struct kf_symexpr x;
    memset(&x, 0, sizeof x);
    x.kind = SX_FLOOR;
    x.num = a.sym;
    x.den = b.v;
    uint32_t id = intern(g, &x);
    return id ? (kf_sdim){-1, id} : kf_sdim_unknown();
}

bool kf_sdim_nonneg(const kf_graph *g, kf_sdim d) {
    if (!kf_sdim_known(d)) return false;
    if (d.sym == 0) return d.v >= 0;
    const struct kf_symexpr *x = expr_of(g, d.sym);
    if (!x) return true;
    if (x->kind == SX_FLOOR) return kf_sdim_nonneg(g, (kf_sdim){-1, x->num});
    for (int i = 0; i < x->p.nt; i++) {
        if (x->p.t[i].c < 0) return false;
        for (int k = 0; k < x->p.t[i].nf; k++)
            if (!kf_sdim_nonneg(g, (kf_sdim){-1, x->p.t[i].f[k]})) return false;
    }
    return true;
}

kf_sdim kf_sdim_bind(kf_graph *g, kf_sdim d, uint32_t name, int64_t value) {
    if (!kf_sdim_known(d) || d.sym == 0) return d;
    if (d.sym == name) return kf_sdim_const(value);
    const struct kf_symexpr *x = expr_of(g, d.sym);
    if (!x) return d;
    if (x->kind == SX_FLOOR) {
        uint32_t num = x->num;
        int64_t den = x->den;
        return kf_sdim_div(g, kf_sdim_bind(g, (kf_sdim){-1, num}, name, value), kf_sdim_const(den));
    }
    poly p = x->p; /* interning below may move the table */
    kf_sdim sum = kf_sdim_const(0);
    for (int i = 0; i < p.nt; i++) {
        kf_sdim t = kf_sdim_const(p.t[i].c);
        for (int k = 0; k < p.t[i].nf; k++)
            t = kf_sdim_mul(g, t, kf_sdim_bind(g, (kf_sdim){-1, p.t[i].f[k]}, name, value));
        sum = kf_sdim_add(g, sum, t);
    }
    return sum;
}
