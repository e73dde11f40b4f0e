/*
 * pattern_parse.c: reads .kfp rule text into kf_rule records. The language
 * is line oriented (one node, guard or directive per line) so an error is
 * reported as file:line with what was expected. The grammar, with worked
 * examples, is in fusion/patterns/README.md.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_pattern.h"

/* ---- lexer ---------------------------------------------------------------- */

typedef enum { T_END, T_IDENT, T_NUM, T_STR, T_PUNCT } tok_kind;

typedef struct tok {
    tok_kind kind;
    char text[256];
    double num;
    bool is_int;
    bool too_big;   /* an integer past int64 (ival holds the saturated value) */
    int64_t ival;
} tok;

typedef struct lexer {
    const char *p, *end;
    const char *file;
    int line;
    tok t; /* current token */
} lexer;

static kf_status perr(const lexer *lx, const char *fmt, const char *arg) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    return kf_fail(KF_ERR_BAD_MODEL, "%s:%d: %s", lx->file, lx->line, msg);
}

static void next(lexer *lx) {
    tok *t = &lx->t;
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\r')) lx->p++;
    if (lx->p >= lx->end || *lx->p == '\n' || *lx->p == '#') {
        t->kind = T_END;
        t->text[0] = 0;
        return;
    }
    const char *s = lx->p;
    size_t n = 0;
    if (isalpha((unsigned char)*s) || *s == '_') {
        while (lx->p < lx->end && (isalnum((unsigned char)*lx->p) || *lx->p == '_' || *lx->p == '.' ||
                                   (*lx->p == ':' && lx->p + 1 < lx->end && lx->p[1] == ':') ||
                                   (*lx->p == ':' && lx->p > s && lx->p[-1] == ':')))
            lx->p++;
        t->kind = T_IDENT;
    } else if (isdigit((unsigned char)*s) || ((*s == '-' || *s == '+' || *s == '.') && lx->p + 1 < lx->end &&
                                              (isdigit((unsigned char)s[1]) || s[1] == '.'))) {
        /* strtod reads until a non-number character, which may lie past
         * len: the text need not end in NUL, so parse a bounded copy (63
         * characters hold any number worth writing in a rule) */
        char num[64], *e;
        size_t k = 0;
        while (s + k < lx->end && k < sizeof num - 1 &&
               (isalnum((unsigned char)s[k]) || s[k] == '.' || s[k] == '+' || s[k] == '-'))
            k++;
        memcpy(num, s, k);
        num[k] = 0;
        errno = 0;
        t->num = strtod(num, &e);
        t->is_int = true;
        for (const char *q = num; q < e; q++)
            if (*q == '.' || *q == 'e' || *q == 'E' || *q == 'n' || *q == 'i') t->is_int = false;
        errno = 0;
        t->ival = t->is_int ? strtoll(num, NULL, 10) : 0;
        t->too_big = t->is_int && errno == ERANGE;
        lx->p = e > num ? s + (e - num) : s + 1;
        t->kind = T_NUM;
    } else if (*s == '"') {
        lx->p++;
        while (lx->p < lx->end && *lx->p != '"' && *lx->p != '\n') lx->p++;
        n = (size_t)(lx->p - s - 1);
        if (n >= sizeof t->text) n = sizeof t->text - 1;
        memcpy(t->text, s + 1, n);
        t->text[n] = 0;
        if (lx->p < lx->end && *lx->p == '"') lx->p++;
        t->kind = T_STR;
        return;
    } else {
        /* two-character operators first */
        if (lx->p + 1 < lx->end && (s[1] == '=') && (*s == '=' || *s == '!' || *s == '>' || *s == '<')) lx->p += 2;
        else lx->p++;
        t->kind = T_PUNCT;
    }
    n = (size_t)(lx->p - s);
    if (n >= sizeof t->text) n = sizeof t->text - 1;
    memcpy(t->text, s, n);
    t->text[n] = 0;
}

/* The first characters are compared before the strings: most calls ask
 * whether a variable name is one of the section keywords. */
static bool is(const lexer *lx, const char *text) {
    return (lx->t.kind == T_PUNCT || lx->t.kind == T_IDENT) && lx->t.text[0] == text[0] &&
           strcmp(lx->t.text, text) == 0;
}

/* The token's text into dst (cap bytes, cut to fit). */
static void copy_text(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static kf_status expect(lexer *lx, const char *text) {
    if (!is(lx, text)) {
        char want[64];
        snprintf(want, sizeof want, "expected '%s' here", text);
        return perr(lx, "%s", want);
    }
    next(lx);
    return KF_OK;
}

/* ---- rule building -------------------------------------------------------- */

typedef enum { SEC_NONE, SEC_MATCH, SEC_WHERE, SEC_REPLACE } section;

static int find_var(const kf_rule *r, const char *name) {
    for (int i = 0; i < r->nvars; i++)
        if (r->vars[i].name[0] == name[0] && strcmp(r->vars[i].name, name) == 0) return i;
    return -1;
}

static kf_status var_ref(lexer *lx, kf_rule *r, const char *name, bool create, int *out) {
    int v = find_var(r, name);
    if (v < 0) {
        if (!create) return perr(lx, "unknown variable '%s'", name);
        if (r->nvars >= KF_PAT_MAX_VARS) return perr(lx, "too many variables (limit reached at '%s')", name);
        v = r->nvars++;
        r->vars[v].name = kf_strdup(name);
        if (!r->vars[v].name) return kf_fail(KF_ERR_NOMEM, "out of memory");
        r->vars[v].src_node = -1;
        r->vars[v].dst_node = -1;
    }
    *out = v;
    return KF_OK;
}

/* A literal attribute value: number, string, or [list]. */
static kf_status parse_attr_value(lexer *lx, const char *name, kf_attr *a) {
    memset(a, 0, sizeof *a);
    a->name = kf_strdup(name);
    if (!a->name) return kf_fail(KF_ERR_NOMEM, "out of memory");
    if (lx->t.kind == T_NUM && lx->t.too_big) return perr(lx, "integer of attribute '%s' is past int64", name);
    if (lx->t.kind == T_NUM) {
        if (lx->t.is_int) {
            a->type = KF_ATTR_INT;
            a->i = lx->t.ival;
        } else {
            a->type = KF_ATTR_FLOAT;
            a->f = (float)lx->t.num;
        }
        next(lx);
        return KF_OK;
    }
    if (lx->t.kind == T_STR) {
        a->type = KF_ATTR_STRING;
        a->s.ptr = kf_strdup(lx->t.text);
        a->s.len = strlen(lx->t.text);
        next(lx);
        return a->s.ptr ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (is(lx, "[")) {
        next(lx);
        double vals[64];
        int64_t ivals[64];
        bool all_int = true;
        int n = 0;
        while (!is(lx, "]")) {
            if (lx->t.kind != T_NUM || n >= 64) return perr(lx, "expected a number in the list for '%s'", name);
            if (lx->t.too_big) return perr(lx, "integer in the list for '%s' is past int64", name);
            ivals[n] = lx->t.ival;
            vals[n++] = lx->t.num;
            all_int &= lx->t.is_int;
            next(lx);
            if (is(lx, ",")) next(lx);
            else if (!is(lx, "]")) return perr(lx, "expected ',' or ']' in the list for '%s'", name);
        }
        next(lx);
        a->n = n;
        if (all_int) {
            a->type = KF_ATTR_INTS;
            a->ints = kf_calloc((size_t)n, sizeof(int64_t));
            if (!a->ints) return kf_fail(KF_ERR_NOMEM, "out of memory");
            memcpy(a->ints, ivals, (size_t)n * sizeof(int64_t));
        } else {
            a->type = KF_ATTR_FLOATS;
            a->floats = kf_calloc((size_t)n, sizeof(float));
            if (!a->floats) return kf_fail(KF_ERR_NOMEM, "out of memory");
            for (int i = 0; i < n; i++) a->floats[i] = (float)vals[i];
        }
        return KF_OK;
    }
    return perr(lx, "expected a value for attribute '%s'", name);
}

/* {name=value, name=@var.attr, name=@var.attr|default} */
static kf_status parse_attrs(lexer *lx, kf_rule *r, kf_pat_node *pn, bool allow_refs) {
    if (!is(lx, "{")) return KF_OK;
    next(lx);
    while (!is(lx, "}")) {
        if (is(lx, "@")) { /* @V.*: every attribute of V's producer */
            if (!allow_refs) return perr(lx, "attribute references (@) are for replacements%s", "");
            next(lx);
            size_t tl = strlen(lx->t.text);
            if (lx->t.kind != T_IDENT || tl < 2 || lx->t.text[tl - 1] != '.' || pn->copy_from)
                return perr(lx, "expected one @variable.* in the attributes%s", "");
            lx->t.text[tl - 1] = 0;
            int v;
            KF_TRY(var_ref(lx, r, lx->t.text, false, &v));
            next(lx);
            KF_TRY(expect(lx, "*"));
            pn->copy_from = v + 1;
            if (is(lx, ",")) next(lx);
            else if (!is(lx, "}")) return perr(lx, "expected ',' or '}' after '@variable.*'%s", "");
            continue;
        }
        if (lx->t.kind != T_IDENT) return perr(lx, "expected an attribute name%s", "");
        char name[256];
        copy_text(name, sizeof name, lx->t.text);
        next(lx);
        KF_TRY(expect(lx, "="));
        kf_pat_attr *na = kf_realloc(pn->attrs, sizeof(kf_pat_attr) * (size_t)(pn->nattrs + 1));
        if (!na) return kf_fail(KF_ERR_NOMEM, "out of memory");
        pn->attrs = na;
        kf_pat_attr *pa = &pn->attrs[pn->nattrs];
        memset(pa, 0, sizeof *pa);
        pa->ref_var = pa->ref_var2 = -1;
        pn->nattrs++;
        bool recip = lx->t.kind == T_NUM && lx->t.is_int && lx->t.ival == 1 && lx->p < lx->end && *lx->p == '/';
        if (recip) { /* 1/$a */
            next(lx);
            next(lx);
            if (!is(lx, "$")) return perr(lx, "expected 1/$variable for '%s'", name);
        }
        if (is(lx, "$")) {
            /* the scalar value of a matched constant, e.g. {epsilon=$eps},
             * or of two multiplied ($a*$b), or its reciprocal (1/$c) */
            if (!allow_refs) return perr(lx, "constant values ($) are for replacements, not '%s'", name);
            next(lx);
            if (lx->t.kind != T_IDENT || strchr(lx->t.text, '.')) return perr(lx, "expected $variable for '%s'", name);
            KF_TRY(var_ref(lx, r, lx->t.text, false, &pa->ref_var));
            pa->ref_value = true;
            pa->ref_recip = recip;
            if (!(pa->value.name = kf_strdup(name))) return kf_fail(KF_ERR_NOMEM, "out of memory");
            next(lx);
            if (is(lx, "*")) {
                next(lx);
                if (!is(lx, "$")) return perr(lx, "expected $variable after '*' for '%s'", name);
                next(lx);
                if (lx->t.kind != T_IDENT || strchr(lx->t.text, '.'))
                    return perr(lx, "expected $variable for '%s'", name);
                KF_TRY(var_ref(lx, r, lx->t.text, false, &pa->ref_var2));
                next(lx);
            }
        } else if (is(lx, "@")) {
            if (!allow_refs) return perr(lx, "attribute references (@) are for replacements, not '%s'", name);
            next(lx);
            if (lx->t.kind != T_IDENT || !strchr(lx->t.text, '.'))
                return perr(lx, "expected @variable.attribute for '%s'", name);
            char *dot = strrchr(lx->t.text, '.');
            *dot = 0;
            KF_TRY(var_ref(lx, r, lx->t.text, false, &pa->ref_var));
            if (!(pa->ref_attr = kf_strdup(dot + 1))) return kf_fail(KF_ERR_NOMEM, "out of memory");
            next(lx);
            if (is(lx, "|")) {
                next(lx);
                KF_TRY(parse_attr_value(lx, name, &pa->value));
                pa->has_default = true;
            } else if (!(pa->value.name = kf_strdup(name))) {
                return kf_fail(KF_ERR_NOMEM, "out of memory");
            }
        } else {
            KF_TRY(parse_attr_value(lx, name, &pa->value));
        }
        if (is(lx, ",")) next(lx);
        else if (!is(lx, "}")) return perr(lx, "expected ',' or '}' after attribute '%s'", name);
    }
    next(lx);
    return KF_OK;
}

/* outs = Op(args) {attrs}   or (replace)   out = var */
static kf_status parse_node_line(lexer *lx, kf_rule *r, section sec) {
    char outs[KF_PAT_MAX_OUTS][256];
    int nouts = 0;
    for (;;) {
        if (lx->t.kind != T_IDENT) return perr(lx, "expected a variable name%s", "");
        if (nouts >= KF_PAT_MAX_OUTS) return perr(lx, "too many outputs on one line%s", "");
        copy_text(outs[nouts++], sizeof outs[0], lx->t.text);
        next(lx);
        if (!is(lx, ",")) break;
        next(lx);
    }
    KF_TRY(expect(lx, "="));
    if (lx->t.kind != T_IDENT) return perr(lx, "expected an op name or a variable%s", "");
    char opname[256];
    copy_text(opname, sizeof opname, lx->t.text);
    next(lx);
    if (!is(lx, "(")) { /* alias: root = capture (replace only) */
        if (sec != SEC_REPLACE || nouts != 1) return perr(lx, "expected '(' after op '%s'", opname);
        int v;
        KF_TRY(var_ref(lx, r, opname, false, &v));
        int root;
        KF_TRY(var_ref(lx, r, outs[0], false, &root));
        if (r->nsrc == 0 || r->src[r->nsrc - 1].outs[0] != root)
            return perr(lx, "only the root ('%s') can be replaced by an existing value", outs[0]);
        r->result_var = v;
        return lx->t.kind == T_END ? KF_OK : perr(lx, "unexpected '%s' after the alias", lx->t.text);
    }
    next(lx);
    bool is_src = sec == SEC_MATCH;
    kf_pat_node *arr = is_src ? r->src : r->dst;
    int *count = is_src ? &r->nsrc : &r->ndst;
    if (*count >= KF_PAT_MAX_NODES) return perr(lx, "too many nodes in one rule (at '%s')", opname);
    kf_pat_node *pn = &arr[*count];
    memset(pn, 0, sizeof *pn);
    pn->line = lx->line;
    char *sep = strstr(opname, "::");
    if (sep) {
        *sep = 0;
        pn->domain = kf_strdup(opname);
        pn->op = kf_strdup(sep + 2);
    } else {
        pn->domain = kf_strdup("");
        pn->op = kf_strdup(opname);
    }
    (*count)++;
    if (!pn->op || !pn->domain) return kf_fail(KF_ERR_NOMEM, "out of memory");
    while (!is(lx, ")")) {
        if (pn->nargs >= KF_PAT_MAX_ARGS) return perr(lx, "too many inputs for '%s'", opname);
        kf_pat_arg *a = &pn->args[pn->nargs++];
        if (lx->t.kind == T_NUM) {
            a->kind = KF_PA_LITERAL;
            a->lit = lx->t.num;
            next(lx);
        } else if (is(lx, "_")) {
            if (!is_src) return perr(lx, "'_' only matches; a replacement needs a value%s", "");
            a->kind = KF_PA_ANY;
            next(lx);
        } else if (lx->t.kind == T_IDENT) {
            a->kind = KF_PA_VAR;
            /* in match, unknown names become captures; in replace they must exist */
            KF_TRY(var_ref(lx, r, lx->t.text, is_src, &a->var));
            if (is_src && r->vars[a->var].src_node < 0 && r->vars[a->var].dst_node < 0) {
                /* capture: fine */
            }
            next(lx);
        } else {
            return perr(lx, "expected an input of '%s'", opname);
        }
        if (is(lx, ",")) next(lx);
        else if (!is(lx, ")")) return perr(lx, "expected ',' or ')' in the inputs of '%s'", opname);
    }
    next(lx);
    KF_TRY(parse_attrs(lx, r, pn, !is_src));
    for (int k = 0; k < nouts; k++) {
        int v = find_var(r, outs[k]);
        if (is_src) {
            if (v >= 0) return perr(lx, "variable '%s' is defined twice", outs[k]);
            KF_TRY(var_ref(lx, r, outs[k], true, &v));
            r->vars[v].src_node = *count - 1;
        } else if (v >= 0) {
            /* assigning the root (or a dst value) from the replacement */
            if (r->vars[v].dst_node >= 0) return perr(lx, "variable '%s' is defined twice", outs[k]);
            if (r->vars[v].src_node < 0 || r->nsrc == 0 || r->src[r->nsrc - 1].outs[0] != v)
                return perr(lx, "a replacement may only redefine the root, not '%s'", outs[k]);
            r->result_var = v;
            /* the root keeps its source definition; remember the new one in a fresh var */
            int nv;
            char fresh[300];
            snprintf(fresh, sizeof fresh, "%s'", outs[k]);
            KF_TRY(var_ref(lx, r, fresh, true, &nv));
            r->vars[nv].dst_node = *count - 1;
            r->result_var = nv;
            v = nv;
        } else {
            KF_TRY(var_ref(lx, r, outs[k], true, &v));
            r->vars[v].dst_node = *count - 1;
        }
        pn->outs[pn->nouts++] = v;
    }
    return lx->t.kind == T_END ? KF_OK : perr(lx, "unexpected '%s' at the end of the line", lx->t.text);
}

static kf_status parse_cmp(lexer *lx, kf_cmp *c) {
    static const struct {
        const char *s;
        kf_cmp c;
    } ops[] = {{"==", KF_CMP_EQ}, {"!=", KF_CMP_NE}, {">=", KF_CMP_GE}, {"<=", KF_CMP_LE}, {">", KF_CMP_GT}, {"<", KF_CMP_LT}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (is(lx, ops[i].s)) {
            *c = ops[i].c;
            next(lx);
            return KF_OK;
        }
    return perr(lx, "expected a comparison (==, !=, >=, <=, >, <)%s", "");
}

static kf_dtype dtype_named(const char *s) {
    for (int d = 1; d < KF_DT_COUNT_; d++)
        if (strcmp(kf_dtype_name((kf_dtype)d), s) == 0) return (kf_dtype)d;
    return KF_DT_UNDEFINED;
}

static kf_status parse_guard(lexer *lx, kf_rule *r) {
    if (r->nguards >= KF_PAT_MAX_GUARDS) return perr(lx, "too many guards%s", "");
    kf_pat_guard *g = &r->guards[r->nguards];
    memset(g, 0, sizeof *g);
    r->nguards++; /* counted now, so rule_free releases a half-parsed guard */
    g->line = lx->line;
    g->var2 = -1;
    char kw[256];
    copy_text(kw, sizeof kw, lx->t.text);
    next(lx);
    if (!strcmp(kw, "last_axis") && lx->t.kind == T_IDENT && !strchr(lx->t.text, '.')) {
        /* last_axis AXES W: AXES is a constant (an axes input) */
        g->kind = KF_G_LAST_AXIS;
        KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var));
        next(lx);
        if (lx->t.kind != T_IDENT) return perr(lx, "expected the variable whose last axis is meant%s", "");
        KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var2));
        next(lx);
    } else if (!strcmp(kw, "same_attr")) {
        /* same_attr V.name[|DEFAULT] W.name[|DEFAULT] */
        g->kind = KF_G_SAME_ATTR;
        for (int k = 0; k < 2; k++) {
            if (lx->t.kind != T_IDENT || !strchr(lx->t.text, '.'))
                return perr(lx, "expected variable.attribute in 'same_attr'%s", "");
            char *dot = strrchr(lx->t.text, '.');
            *dot = 0;
            char *name = kf_strdup(dot + 1);
            if (!name) return kf_fail(KF_ERR_NOMEM, "out of memory");
            *(k ? &g->attr2 : &g->attr) = name;
            KF_TRY(var_ref(lx, r, lx->t.text, false, k ? &g->var2 : &g->var));
            next(lx);
            if (is(lx, "|")) {
                next(lx);
                KF_TRY(parse_attr_value(lx, name, k ? &g->attr_default2 : &g->attr_default));
                *(k ? &g->has_default2 : &g->has_default) = true;
            }
        }
    } else if (!strcmp(kw, "attr") || !strcmp(kw, "last_axis")) {
        if (lx->t.kind != T_IDENT || !strchr(lx->t.text, '.')) return perr(lx, "expected variable.attribute after '%s'", kw);
        char *dot = strrchr(lx->t.text, '.');
        *dot = 0;
        KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var));
        if (!(g->attr = kf_strdup(dot + 1))) return kf_fail(KF_ERR_NOMEM, "out of memory");
        next(lx);
        if (!strcmp(kw, "attr") && is(lx, "|")) { /* attr V.name|DEFAULT == VALUE */
            next(lx);
            KF_TRY(parse_attr_value(lx, g->attr, &g->attr_default));
            g->has_default = true;
        }
        if (!strcmp(kw, "last_axis")) {
            g->kind = KF_G_LAST_AXIS;
            if (lx->t.kind != T_IDENT) return perr(lx, "expected the variable whose last axis is meant%s", "");
            KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var2));
            next(lx);
        } else {
            g->kind = KF_G_ATTR;
            KF_TRY(parse_cmp(lx, &g->cmp));
            KF_TRY(parse_attr_value(lx, g->attr, &g->attr_value));
        }
    } else {
        if (lx->t.kind != T_IDENT) return perr(lx, "expected a variable after '%s'", kw);
        KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var));
        next(lx);
        if (!strcmp(kw, "const")) {
            g->kind = KF_G_CONST;
            if (lx->t.kind != T_END) {
                KF_TRY(parse_cmp(lx, &g->cmp));
                g->kind = g->cmp == KF_CMP_EQ ? KF_G_CONST_EQ : KF_G_CONST_CMP;
                if (lx->t.kind != T_NUM) return perr(lx, "expected a number after the comparison in 'const'%s", "");
                g->value = lx->t.num;
                next(lx);
                if (is(lx, "tol")) {
                    next(lx);
                    if (lx->t.kind != T_NUM) return perr(lx, "expected a tolerance after 'tol'%s", "");
                    g->tol = lx->t.num;
                    next(lx);
                }
            }
        } else if (!strcmp(kw, "scalar")) {
            g->kind = KF_G_SCALAR;
        } else if (!strcmp(kw, "single_use")) {
            g->kind = KF_G_SINGLE_USE;
        } else if (!strcmp(kw, "dtype")) {
            g->kind = KF_G_DTYPE;
            while (lx->t.kind == T_IDENT) {
                kf_dtype d = dtype_named(lx->t.text);
                if (!d) return perr(lx, "unknown dtype '%s'", lx->t.text);
                g->dtypes[g->ndtypes++] = d;
                next(lx);
            }
            if (!g->ndtypes) return perr(lx, "expected dtypes after 'dtype'%s", "");
        } else if (!strcmp(kw, "rank")) {
            g->kind = KF_G_RANK;
            KF_TRY(parse_cmp(lx, &g->cmp));
            if (lx->t.kind != T_NUM) return perr(lx, "expected a number after 'rank'%s", "");
            if (!lx->t.is_int || lx->t.ival < 0 || lx->t.ival > KF_MAX_RANK) {
                char most[16];
                snprintf(most, sizeof most, "%d", KF_MAX_RANK);
                return perr(lx, "a rank is a whole number from 0 to %s", most);
            }
            g->value = lx->t.num;
            next(lx);
        } else if (!strcmp(kw, "same_dim")) {
            /* same_dim A I B J: dim I of A and dim J of B (negative: from the end) */
            g->kind = KF_G_SAME_DIM;
            int *axes[2] = {&g->axis, &g->axis2};
            for (int k = 0; k < 2; k++) {
                if (k) {
                    if (lx->t.kind != T_IDENT) return perr(lx, "expected a second variable in 'same_dim'%s", "");
                    KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var2));
                    next(lx);
                }
                if (lx->t.kind != T_NUM || !lx->t.is_int || lx->t.ival < -KF_MAX_RANK || lx->t.ival >= KF_MAX_RANK)
                    return perr(lx, "expected a dim index after a variable in 'same_dim'%s", "");
                *axes[k] = (int)lx->t.ival;
                next(lx);
            }
        } else if (!strcmp(kw, "same_shape")) {
            g->kind = KF_G_SAME_SHAPE;
            if (lx->t.kind != T_IDENT) return perr(lx, "expected a second variable after 'same_shape'%s", "");
            KF_TRY(var_ref(lx, r, lx->t.text, false, &g->var2));
            next(lx);
        } else {
            return perr(lx, "unknown guard '%s' (const, scalar, single_use, dtype, rank, same_shape, same_dim, attr, same_attr, last_axis)", kw);
        }
    }
    return lx->t.kind == T_END ? KF_OK : perr(lx, "unexpected '%s' at the end of the guard", lx->t.text);
}

/* example VAR dtype[d0, d1, ...]; names are symbols shared across examples */
static kf_status parse_example(lexer *lx, kf_rule *r, char syms[][64], int *nsyms) {
    if (r->nexamples >= KF_PAT_MAX_VARS) return perr(lx, "too many examples%s", "");
    kf_pat_example *e = &r->examples[r->nexamples];
    memset(e, 0, sizeof *e);
    if (lx->t.kind != T_IDENT) return perr(lx, "expected a variable after 'example'%s", "");
    KF_TRY(var_ref(lx, r, lx->t.text, false, &e->var));
    next(lx);
    r->nexamples++; /* counted now, so rule_free releases a half-parsed example */
    if (is(lx, "{")) { /* example VAR {attr=value, ...}: attributes of VAR's producer */
        next(lx);
        while (!is(lx, "}")) {
            if (lx->t.kind != T_IDENT) return perr(lx, "expected an attribute name%s", "");
            char name[256];
            copy_text(name, sizeof name, lx->t.text);
            next(lx);
            KF_TRY(expect(lx, "="));
            kf_attr *na = kf_realloc(e->attrs, sizeof(kf_attr) * (size_t)(e->nattrs + 1));
            if (!na) return kf_fail(KF_ERR_NOMEM, "out of memory");
            e->attrs = na;
            memset(&e->attrs[e->nattrs], 0, sizeof(kf_attr));
            e->nattrs++;
            KF_TRY(parse_attr_value(lx, name, &e->attrs[e->nattrs - 1]));
            if (is(lx, ",")) next(lx);
            else if (!is(lx, "}")) return perr(lx, "expected ',' or '}' after attribute '%s'", name);
        }
        next(lx);
        return lx->t.kind == T_END ? KF_OK : perr(lx, "unexpected '%s' after the example", lx->t.text);
    }
    if (lx->t.kind != T_IDENT || !(e->dtype = dtype_named(lx->t.text))) return perr(lx, "expected a dtype, not '%s'", lx->t.text);
    next(lx);
    KF_TRY(expect(lx, "["));
    while (!is(lx, "]")) {
        if (e->rank >= KF_MAX_RANK) return perr(lx, "example rank too large%s", "");
        if (lx->t.kind == T_NUM && lx->t.is_int && lx->t.ival >= 0) {
            e->dims[e->rank++] = lx->t.ival;
        } else if (lx->t.kind == T_IDENT) {
            int k = 0;
            while (k < *nsyms && strcmp(syms[k], lx->t.text)) k++;
            if (k == *nsyms) {
                if (*nsyms >= 16) return perr(lx, "too many symbols in examples%s", "");
                copy_text(syms[(*nsyms)++], sizeof syms[0], lx->t.text);
            }
            e->dims[e->rank++] = -1 - k;
        } else {
            return perr(lx, "expected a dim (number or symbol), not '%s'", lx->t.text);
        }
        next(lx);
        if (is(lx, ",")) next(lx);
        else if (!is(lx, "]")) return perr(lx, "expected ',' or ']'%s", "");
    }
    next(lx);
    if (is(lx, "=")) { /* = [v, ...]: the capture is a constant with these values */
        next(lx);
        KF_TRY(expect(lx, "["));
        while (!is(lx, "]")) {
            if (lx->t.kind != T_NUM || e->nvalues >= 64) return perr(lx, "expected a number (64 at most) in the values%s", "");
            double *nv = kf_realloc(e->values, sizeof(double) * (size_t)(e->nvalues + 1));
            if (!nv) return kf_fail(KF_ERR_NOMEM, "out of memory");
            e->values = nv;
            e->values[e->nvalues++] = lx->t.num;
            next(lx);
            if (is(lx, ",")) next(lx);
            else if (!is(lx, "]")) return perr(lx, "expected ',' or ']'%s", "");
        }
        next(lx);
        int64_t count = 1;
        for (int d = 0; d < e->rank; d++) /* bounded factors: no overflow on a hostile dim */
            count = e->dims[d] >= 0 && e->dims[d] <= 64 && count <= 64 ? count * e->dims[d] : 65;
        if (count != e->nvalues) return perr(lx, "the values do not fill the example's fixed shape%s", "");
    }
    return lx->t.kind == T_END ? KF_OK : perr(lx, "unexpected '%s' after the example", lx->t.text);
}

static void attr_free(kf_pat_attr *a) {
    kf_attr_release(&a->value);
    kf_free(a->ref_attr);
}

/* Frees what a rule gathered while it ran: near misses and search states. */
static void rule_free_run_state(kf_rule *r) {
    for (int i = 0; i < r->nnear; i++) {
        kf_free(r->near[i].node);
        kf_free(r->near[i].reason);
    }
    r->nnear = 0;
    if (!r->match_pool_shared) kf_free(r->match_pool);
    r->match_pool = NULL;
    r->match_pool_shared = false;
}

/* Frees what a rule's list entries, name, file and near misses hold. */
static void rule_free_contents(kf_rule *r) {
    kf_free(r->name);
    kf_free(r->file);
    for (int i = 0; i < r->nvars; i++) kf_free(r->vars[i].name);
    kf_pat_node *lists[2] = {r->src, r->dst};
    int counts[2] = {r->nsrc, r->ndst};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < counts[l]; i++) {
            kf_free(lists[l][i].op);
            kf_free(lists[l][i].domain);
            for (int k = 0; k < lists[l][i].nattrs; k++) attr_free(&lists[l][i].attrs[k]);
            kf_free(lists[l][i].attrs);
        }
    for (int i = 0; i < r->nguards; i++) {
        kf_free(r->guards[i].attr);
        kf_attr_release(&r->guards[i].attr_value);
        kf_attr_release(&r->guards[i].attr_default);
        kf_free(r->guards[i].attr2);
        kf_attr_release(&r->guards[i].attr_default2);
    }
    for (int i = 0; i < r->nexamples; i++) {
        kf_free(r->examples[i].values);
        for (int k = 0; k < r->examples[i].nattrs; k++) kf_attr_release(&r->examples[i].attrs[k]);
        kf_free(r->examples[i].attrs);
    }
    rule_free_run_state(r);
}

static void rule_free(kf_rule *r) {
    if (!r) return;
    if (r->compiled) { /* the rest is the built-in tables' */
        rule_free_run_state(r);
        kf_free(r);
        return;
    }
    rule_free_contents(r);
    kf_free(r->vars);
    kf_free(r->src);
    kf_free(r->guards);
    kf_free(r->dst);
    kf_free(r->examples);
    kf_free(r);
}

/* The lists of the rule being parsed, at their maxima, uninitialised: every
 * entry is set whole when it is appended (var_ref, parse_node_line,
 * parse_guard, parse_example), and a finished rule takes copies of the
 * entries it used. One set serves every rule of a parse (zeroing the
 * maxima per rule was most of the cost of a rule set). */
typedef struct rule_lists {
    kf_pat_var vars[KF_PAT_MAX_VARS];
    kf_pat_node src[KF_PAT_MAX_NODES];
    kf_pat_guard guards[KF_PAT_MAX_GUARDS];
    kf_pat_node dst[KF_PAT_MAX_NODES];
    kf_pat_example examples[KF_PAT_MAX_VARS];
} rule_lists;

/* Frees a rule whose lists may still be (some of) the scratch lists l: their
 * contents are freed, and only lists of the rule's own. */
static void rule_drop_scratch(kf_rule *r, rule_lists *l) {
    if (!r) return;
    rule_free_contents(r);
    void *lists[5] = {r->vars, r->src, r->guards, r->dst, r->examples};
    void *scratch[5] = {l->vars, l->src, l->guards, l->dst, l->examples};
    for (int i = 0; i < 5; i++)
        if (lists[i] != scratch[i]) kf_free(lists[i]);
    kf_free(r);
}

/* A text rule being parsed, its lists in the scratch lists. */
static kf_rule *rule_new_text(rule_lists *l) {
    kf_rule *r = kf_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->vars = l->vars;
    r->src = l->src;
    r->guards = l->guards;
    r->dst = l->dst;
    r->examples = l->examples;
    return r;
}

/* A copy of the used entries of a scratch list. */
static kf_status take_list(void **list, int n, size_t size) {
    void *p = kf_malloc((size_t)(n > 0 ? n : 1) * size);
    if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory");
    memcpy(p, *list, (size_t)n * size);
    *list = p;
    return KF_OK;
}

/* Gives a finished rule lists of its own. On failure the lists not yet
 * taken are dropped (with their contents) and the rule keeps the rest. */
static kf_status rule_take_lists(kf_rule *r, rule_lists *l) {
    void **lists[5] = {(void **)&r->vars, (void **)&r->src, (void **)&r->guards, (void **)&r->dst,
                       (void **)&r->examples};
    int counts[5] = {r->nvars, r->nsrc, r->nguards, r->ndst, r->nexamples};
    size_t sizes[5] = {sizeof *r->vars, sizeof *r->src, sizeof *r->guards, sizeof *r->dst, sizeof *r->examples};
    for (int i = 0; i < 5; i++)
        if (take_list(lists[i], counts[i], sizes[i])) {
            rule_drop_scratch(r, l);
            return KF_ERR_NOMEM;
        }
    return KF_OK;
}

void kf_rules_free(kf_ruleset *rs) {
    for (uint32_t i = 0; i < rs->n; i++) rule_free(rs->rules[i]);
    kf_free(rs->rules);
    kf_free(rs->match_pool);
    memset(rs, 0, sizeof *rs);
}

static kf_status add_rule(kf_ruleset *rs, kf_rule *r) {
    kf_status st = kf_grow((void **)&rs->rules, &rs->cap, rs->n + 1, sizeof(kf_rule *));
    if (st) {
        rule_free(r);
        return st;
    }
    rs->rules[rs->n++] = r;
    return KF_OK;
}

/* Checks a finished rule: a root, a replacement, every replacement input
 * defined, every op known to the op table. */
static kf_status finish_rule(lexer *lx, kf_rule *r) {
    if (!r->nsrc) return perr(lx, "rule '%s' has no match section", r->name);
    kf_pat_node *root = &r->src[r->nsrc - 1];
    if (!root->nouts) return perr(lx, "rule '%s': the root has no output", r->name);
    if (r->result_var < 0) return perr(lx, "rule '%s': the replacement never assigns the root", r->name);
    r->root_op = root->op;
    kf_pat_node *lists[2] = {r->src, r->dst};
    int counts[2] = {r->nsrc, r->ndst};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < counts[l]; i++)
            if (!(lists[l][i].opid = kf_op_lookup(lists[l][i].domain, lists[l][i].op))) {
                lexer at = *lx;
                at.line = lists[l][i].line;
                return perr(&at, "unknown op '%s'", lists[l][i].op);
            }
    /* every source node except the root must feed another source node */
    for (int i = 0; i < r->nsrc - 1; i++) {
        bool used = false;
        for (int j = i + 1; j < r->nsrc && !used; j++)
            for (int a = 0; a < r->src[j].nargs && !used; a++)
                for (int o = 0; o < r->src[i].nouts; o++)
                    if (r->src[j].args[a].kind == KF_PA_VAR && r->src[j].args[a].var == r->src[i].outs[o]) used = true;
        if (!used) {
            lexer at = *lx;
            at.line = r->src[i].line;
            return perr(&at, "match node '%s' does not feed the root (patterns are DAGs with one root)", r->src[i].op);
        }
    }
    r->root_opid = root->opid;
    r->reach = r->nsrc;
    return KF_OK;
}

static kf_status parse_text(kf_ruleset *rs, const char *text, size_t len, const char *file, int line0) {
    lexer lx = {text, text + len, file ? file : "<patterns>", line0, {0}};
    kf_rule *r = NULL;
    rule_lists *scratch = NULL;
    section sec = SEC_NONE;
    char syms[16][64];
    int nsyms = 0;
    kf_status st = KF_OK;
    const char *p = text;
    while (p < text + len && !st) {
        lx.line++;
        const char *eol = memchr(p, '\n', (size_t)(text + len - p));
        if (!eol) eol = text + len;
        lx.p = p;
        lx.end = eol;
        next(&lx);
        p = eol + 1;
        if (lx.t.kind == T_END) continue;
        if (is(&lx, "rule")) {
            if (r) {
                st = perr(&lx, "rule '%s' is missing 'end'", r->name);
                break;
            }
            next(&lx);
            if (lx.t.kind != T_IDENT) {
                st = perr(&lx, "expected a rule name%s", "");
                break;
            }
            if (!scratch && !(scratch = kf_malloc(sizeof *scratch))) {
                st = kf_fail(KF_ERR_NOMEM, "out of memory");
                break;
            }
            r = rule_new_text(scratch);
            if (!r) {
                st = kf_fail(KF_ERR_NOMEM, "out of memory");
                break;
            }
            r->name = kf_strdup(lx.t.text);
            r->file = kf_strdup(lx.file);
            if (!r->name || !r->file) {
                st = kf_fail(KF_ERR_NOMEM, "out of memory");
                break;
            }
            r->line = lx.line;
            r->result_var = -1;
            nsyms = 0;
            sec = SEC_NONE;
            next(&lx);
            if (lx.t.kind != T_END) st = perr(&lx, "unexpected '%s' after the rule name", lx.t.text);
            continue;
        }
        if (!r) {
            st = perr(&lx, "expected 'rule NAME', not '%s'", lx.t.text);
            break;
        }
        if (is(&lx, "end")) {
            if ((st = finish_rule(&lx, r))) break;
            for (uint32_t i = 0; i < rs->n; i++)
                if (!strcmp(rs->rules[i]->name, r->name)) {
                    st = perr(&lx, "rule '%s' is defined twice", r->name);
                    break;
                }
            if (st) break;
            kf_rule *done = r;
            r = NULL; /* rule_take_lists frees it on failure */
            if ((st = rule_take_lists(done, scratch))) break;
            st = add_rule(rs, done);
            continue;
        }
        if (is(&lx, "match") || is(&lx, "where") || is(&lx, "replace")) {
            sec = is(&lx, "match") ? SEC_MATCH : is(&lx, "where") ? SEC_WHERE : SEC_REPLACE;
            if (sec == SEC_REPLACE && !r->nsrc) st = perr(&lx, "'replace' before 'match'%s", "");
            next(&lx);
            if (!st && lx.t.kind != T_END) st = perr(&lx, "unexpected '%s' after the section name", lx.t.text);
            continue;
        }
        if (is(&lx, "requires")) {
            next(&lx);
            if (!is(&lx, "opset")) {
                st = perr(&lx, "expected 'requires opset N'%s", "");
                continue;
            }
            next(&lx);
            if (lx.t.kind != T_NUM || !lx.t.is_int) st = perr(&lx, "expected an opset number%s", "");
            else r->min_opset = lx.t.ival;
            continue;
        }
        if (is(&lx, "opt_in") || is(&lx, "refines")) {
            bool opt_in = is(&lx, "opt_in");
            next(&lx);
            if (opt_in) r->opt_in = true;
            else if (is(&lx, "nan")) r->nan_refined = true, next(&lx);
            else st = perr(&lx, "expected 'refines nan'%s", "");
            if (!st && lx.t.kind != T_END) st = perr(&lx, "unexpected '%s' after the directive", lx.t.text);
            continue;
        }
        if (is(&lx, "example")) {
            next(&lx);
            st = parse_example(&lx, r, syms, &nsyms);
            continue;
        }
        switch (sec) {
        case SEC_MATCH:
        case SEC_REPLACE: st = parse_node_line(&lx, r, sec); break;
        case SEC_WHERE: st = parse_guard(&lx, r); break;
        default: st = perr(&lx, "expected 'match', 'where' or 'replace' before '%s'", lx.t.text);
        }
    }
    if (!st && r) st = perr(&lx, "rule '%s' is missing 'end'", r->name);
    if (st) rule_drop_scratch(r, scratch);
    kf_free(scratch);
    return st;
}

kf_status kf_rules_parse(kf_ruleset *rs, const char *text, size_t len, const char *file) {
    return parse_text(rs, text, len, file, 0);
}

kf_status kf_rules_load_file(kf_ruleset *rs, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return kf_fail(KF_ERR_IO, "cannot open pattern file '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > ((size_t)64 << 20)) {
                kf_free(buf);
                fclose(f);
                return kf_fail(KF_ERR_IO, "pattern file '%s' is larger than 64 MiB", path);
            }
            char *nb = kf_realloc(buf, cap);
            if (!nb) {
                kf_free(buf);
                fclose(f);
                return kf_fail(KF_ERR_NOMEM, "out of memory");
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    kf_status st = kf_rules_parse(rs, buf ? buf : "", len, path);
    kf_free(buf);
    return st;
}

kf_status kf_rules_add_callback(kf_ruleset *rs, const char *name, const char *root_op, kf_rule_fn fn, void *user) {
    kf_rule *r = kf_calloc(1, sizeof *r);
    if (!r) return kf_fail(KF_ERR_NOMEM, "out of memory");
    r->name = kf_strdup(name);
    r->file = kf_strdup("<callback>");
    r->root_op = root_op;
    r->root_opid = root_op ? kf_op_lookup("", root_op) : 0;
    r->reach = KF_CALLBACK_REACH;
    r->fn = fn;
    r->user = user;
    r->result_var = -1;
    if (!r->name || !r->file) {
        rule_free(r);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    return add_rule(rs, r);
}

struct kf_builtin_patterns_entry {
    const char *name;
    const char *text;
    size_t len;
};
extern const struct kf_builtin_patterns_entry kf_builtin_patterns[];

kf_status kf_rules_parse_builtin(kf_ruleset *rs) {
    for (const struct kf_builtin_patterns_entry *p = kf_builtin_patterns; p->name; p++) {
        char file[256];
        snprintf(file, sizeof file, "builtin:%s", p->name);
        KF_TRY(kf_rules_parse(rs, p->text, p->len, file));
    }
    return KF_OK;
}
