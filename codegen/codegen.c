/*
 * codegen.c: fusion group -> kernel text in the portable dialect. Sits after
 * the planner (fusion/) and before kernels/, which compiles the text with
 * NVRTC or OpenCL. This file writes elementwise/broadcast groups: one
 * grid-stride loop, operands loaded through broadcast index arithmetic over
 * static shapes, each node one `const` line built from its op's cg_expr.
 * Everything else is declined with a reason (kf_cg_unsupported).
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_codegen.h"

/* ---- growable string ----------------------------------------------------- */

static bool reserve(kf_cg_str *s, size_t extra) {
    if (s->oom) return false;
    if (s->len + extra + 1 <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 256; /* 256: one kernel line or two; doubling keeps appends amortised O(1) */
    while (cap < s->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            s->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = kf_realloc(s->p, cap);
    if (!p) {
        s->oom = true;
        return false;
    }
    s->p = p;
    s->cap = cap;
    return true;
}

void kf_cg_puts(kf_cg_str *s, const char *text) {
    size_t n = strlen(text);
    if (!reserve(s, n)) return;
    memcpy(s->p + s->len, text, n + 1);
    s->len += n;
}

void kf_cg_printf(kf_cg_str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(s, (size_t)n)) {
        s->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

char *kf_cg_take(kf_cg_str *s) {
    if (s->oom) {
        kf_cg_str_release(s);
        return NULL;
    }
    char *p = s->p ? s->p : kf_strdup("");
    *s = (kf_cg_str){0};
    return p;
}

void kf_cg_str_release(kf_cg_str *s) {
    kf_free(s->p);
    *s = (kf_cg_str){0};
}

/* ---- the math table: the one place both preludes and the checker read ---- */

static const struct {
    const char *c99;  /* name in cg_expr; also the OpenCL builtin (overloaded on float) */
    const char *cuda; /* the float function of CUDA's device math library */
} k_math[] = {
    {"fabs", "fabsf"},   {"floor", "floorf"}, {"ceil", "ceilf"},   {"rint", "rintf"},
    {"sqrt", "sqrtf"},   {"exp", "expf"},     {"log", "logf"},     {"sin", "sinf"},
    {"cos", "cosf"},     {"tan", "tanf"},     {"asin", "asinf"},   {"acos", "acosf"},
    {"atan", "atanf"},   {"sinh", "sinhf"},   {"cosh", "coshf"},   {"tanh", "tanhf"},
    {"asinh", "asinhf"}, {"acosh", "acoshf"}, {"atanh", "atanhf"}, {"erf", "erff"},
    {"log1p", "log1pf"}, {"expm1", "expm1f"}, {"fmin", "fminf"},   {"fmax", "fmaxf"},
    {"pow", "powf"},     {"isnan", "isnan"},  {"isinf", "isinf"},
};
#define NMATH (sizeof k_math / sizeof k_math[0])

static int math_index(const char *name, size_t len) {
    for (size_t i = 0; i < NMATH; i++)
        if (strlen(k_math[i].c99) == len && !memcmp(k_math[i].c99, name, len)) return (int)i;
    return -1;
}

static void upper(kf_cg_str *s, const char *name) {
    char buf[32]; /* longest math name is 5 letters */
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof buf; i++) buf[i] = (char)toupper((unsigned char)name[i]);
    buf[i] = 0;
    kf_cg_puts(s, buf);
}

void kf_cg_prelude(kf_cg_target t, kf_cg_str *s) {
    if (t == KF_CG_CUDA) {
        kf_cg_puts(s, "/* kfuse prelude: CUDA (NVRTC) */\n"
                      "#define KF_KERNEL extern \"C\" __global__ void\n"
                      "#define KF_GLOBAL\n"
                      "#define KF_RESTRICT __restrict__\n"
                      "#define KF_GLOBAL_ID (blockIdx.x * blockDim.x + threadIdx.x)\n"
                      "#define KF_GLOBAL_SIZE (gridDim.x * blockDim.x)\n"
                      "typedef long long kf_i64;\n");
    } else {
        kf_cg_puts(s, "/* kfuse prelude: OpenCL C 1.2 */\n"
                      "#define KF_KERNEL __kernel void\n"
                      "#define KF_GLOBAL __global\n"
                      "#define KF_RESTRICT restrict\n"
                      "#define KF_GLOBAL_ID get_global_id(0)\n"
                      "#define KF_GLOBAL_SIZE get_global_size(0)\n"
                      "typedef long kf_i64;\n");
    }
    for (size_t i = 0; i < NMATH; i++) {
        kf_cg_puts(s, "#define KF_");
        upper(s, k_math[i].c99);
        kf_cg_printf(s, " %s\n", t == KF_CG_CUDA ? k_math[i].cuda : k_math[i].c99);
    }
    kf_cg_puts(s, "\n");
}

/* ---- checks --------------------------------------------------------------- */

static const char *kind_reason(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE: return NULL;
    case KF_GROUP_REDUCTION: return "reduction groups are not generated yet";
    case KF_GROUP_ANCHOR: return "anchor (GEMM/conv) groups are not generated yet";
    case KF_GROUP_OPAQUE: return "opaque ops are not generated (they run on the reference evaluator)";
    case KF_GROUP_CONST: return "plan-time constant groups launch no kernel";
    }
    return "unknown group kind";
}

static bool dtype_ok(kf_dtype dt) { return dt == KF_DT_FLOAT || dt == KF_DT_BOOL; }

static bool same_dims(const kf_type *a, const kf_type *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

/* The expression template of node n (its cg_expr), or NULL with a reason. */
static const char *node_expr(const kf_node *n, char *why, size_t whylen) {
    const kf_op_info *oi = kf_op_get(n->op);
    if (!oi || !oi->cg_expr) {
        snprintf(why, whylen, "node '%s': op %s has no codegen expression yet", kf_node_label(n),
                 n->op_type);
        return NULL;
    }
    if (n->op == KF_OP_GELU && strcmp(kf_attr_s(n, "approximate", "none"), "none")) {
        snprintf(why, whylen, "node '%s': Gelu approximate=\"%s\" is not generated yet", kf_node_label(n),
                 kf_attr_s(n, "approximate", "none"));
        return NULL;
    }
    if (n->op == KF_OP_CLIP && (n->nin < 3 || !n->in[1] || !n->in[2])) {
        snprintf(why, whylen, "node '%s': Clip without both bound inputs is not generated yet",
                 kf_node_label(n));
        return NULL;
    }
    for (int i = 0; i < n->nin; i++)
        if (!n->in[i]) {
            snprintf(why, whylen, "node '%s': absent optional input %d is not generated yet",
                     kf_node_label(n), i);
            return NULL;
        }
    return oi->cg_expr;
}

const char *kf_cg_unsupported(const kf_model *m, const kf_plan *p, uint32_t gi, char *why,
                              size_t whylen) {
    if (gi >= p->ngroups) {
        snprintf(why, whylen, "no group %u", gi);
        return why;
    }
    const kf_group *g = &p->groups[gi];
    const kf_graph *gr = m->graph;
    const char *r = kind_reason(g->kind);
    if (r) {
        snprintf(why, whylen, "%s", r);
        return why;
    }
    if (!g->noutputs || !g->nnodes) {
        snprintf(why, whylen, "group writes nothing");
        return why;
    }
    const kf_type *space = &gr->values[g->outputs[0]].type;
    if (!kf_type_is_static(space)) {
        snprintf(why, whylen, "value '%s' has a symbolic or unknown shape: kernels are generated per static shape",
                 gr->values[g->outputs[0]].name);
        return why;
    }
    for (uint32_t k = 0; k < g->nnodes; k++) {
        const kf_node *n = &gr->nodes[g->nodes[k]];
        if (!node_expr(n, why, whylen)) return why;
        for (int j = 0; j < n->nout; j++) {
            if (!n->out[j]) continue;
            const kf_value *v = &gr->values[n->out[j]];
            if (!dtype_ok(v->type.dtype)) {
                snprintf(why, whylen, "value '%s' is %s: only float32 and bool are generated yet", v->name,
                         kf_dtype_name(v->type.dtype));
                return why;
            }
            if (!same_dims(&v->type, space)) {
                snprintf(why, whylen,
                         "value '%s' does not span the group's iteration space (a shape change inside the "
                         "group is not generated yet)",
                         v->name);
                return why;
            }
        }
        for (int i = 0; i < n->nin; i++) {
            const kf_value *v = &gr->values[n->in[i]];
            if (!dtype_ok(v->type.dtype)) {
                snprintf(why, whylen, "value '%s' is %s: only float32 and bool are generated yet", v->name,
                         kf_dtype_name(v->type.dtype));
                return why;
            }
            if (!kf_type_is_static(&v->type) || v->type.rank > space->rank) {
                snprintf(why, whylen, "value '%s' has no static shape that broadcasts into the group's space",
                         v->name);
                return why;
            }
        }
        if (n->op == KF_OP_WHERE && gr->values[n->in[0]].type.dtype != KF_DT_BOOL) {
            snprintf(why, whylen, "node '%s': Where condition is not bool", kf_node_label(n));
            return why;
        }
    }
    return NULL;
}

/* ---- generation ------------------------------------------------------------- */

/* Per-kernel state: every value the body names gets vN in first-use order. */
typedef struct gen {
    const kf_graph *g;
    const kf_group *grp;
    kf_id *vals;   /* vals[k] = value named v<k> */
    uint32_t nvals;
    const char *ity; /* index type: "int" or "kf_i64" */
    char *why;
    size_t whylen;
} gen;

static int var_of(const gen *st, kf_id v) {
    for (uint32_t k = 0; k < st->nvals; k++)
        if (st->vals[k] == v) return (int)k;
    return -1;
}

static const char *ctype(kf_dtype dt) { return dt == KF_DT_BOOL ? "int" : "float"; }
static const char *mtype(kf_dtype dt) { return dt == KF_DT_BOOL ? "unsigned char" : "float"; }

/* Writes a float literal that reads back to exactly f (9 significant digits
 * round-trip any float). False for non-finite values. */
static bool put_float(kf_cg_str *s, double f) {
    if (!isfinite(f)) return false;
    char buf[48];
    snprintf(buf, sizeof buf, "%.9g", (double)(float)f);
    kf_cg_puts(s, buf);
    if (!strpbrk(buf, ".e")) kf_cg_puts(s, ".0");
    kf_cg_puts(s, "f");
    return true;
}

/* Expands template e for node n with operand texts ops[0..nops). */
static bool expand(gen *st, kf_cg_str *s, const kf_node *n, const char *e, char ops[][24], int nops) {
    for (const char *c = e; *c;) {
        if (isalpha((unsigned char)*c) || *c == '_') {
            const char *b = c;
            while (isalnum((unsigned char)*c) || *c == '_') c++;
            size_t len = (size_t)(c - b);
            if (b[0] == 'x' && len > 1 && isdigit((unsigned char)b[1])) {
                int k = atoi(b + 1);
                if (k >= nops) {
                    snprintf(st->why, st->whylen, "node '%s': cg_expr reads x%d of %d operands",
                             kf_node_label(n), k, nops);
                    return false;
                }
                kf_cg_puts(s, ops[k]);
                continue;
            }
            int mi = math_index(b, len);
            if (mi < 0 || *c != '(') {
                snprintf(st->why, st->whylen, "node '%s': cg_expr of %s names '%.*s', not in the math table",
                         kf_node_label(n), n->op_type, (int)len, b);
                return false;
            }
            kf_cg_puts(s, "KF_");
            upper(s, k_math[mi].c99);
        } else if (isdigit((unsigned char)*c) || (*c == '.' && isdigit((unsigned char)c[1]))) {
            const char *b = c;
            bool real = false;
            while (isdigit((unsigned char)*c) || *c == '.') real |= *c++ == '.';
            if (*c == 'e' || *c == 'E') {
                real = true;
                c++;
                if (*c == '+' || *c == '-') c++;
                while (isdigit((unsigned char)*c)) c++;
            }
            kf_cg_printf(s, "%.*s%s", (int)(c - b), b, real ? "f" : "");
        } else if (*c == '{') {
            const char *b = ++c, *eq = NULL;
            while (*c && *c != '}') {
                if (*c == '=' && !eq) eq = c;
                c++;
            }
            if (!*c || !eq) {
                snprintf(st->why, st->whylen, "op %s: malformed {attr=default} in cg_expr", n->op_type);
                return false;
            }
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(eq - b), b);
            double def = strtod(eq + 1, NULL);
            if (!put_float(s, kf_attr_f(n, name, (float)def))) {
                snprintf(st->why, st->whylen, "node '%s': attribute %s is not finite", kf_node_label(n), name);
                return false;
            }
            c++;
        } else {
            char one[2] = {*c++, 0};
            kf_cg_puts(s, one);
        }
    }
    return true;
}

/* The right-hand side of node n into rhs: its template over operand names.
 * Variadic ops fold left, f(f(x0, x1), x2), through temporaries written to
 * pre (one line each), so every operand stays a plain name (templates may
 * read an operand twice). */
static bool node_rhs(gen *st, kf_cg_str *pre, kf_cg_str *rhs, const kf_node *n) {
    const char *e = node_expr(n, st->why, st->whylen);
    if (!e) return false;
    const kf_op_info *oi = kf_op_get(n->op);
    int self = var_of(st, n->out[0]);
    char ops[2][24]; /* "v" or "t<n>_<n>" with 32-bit numbers */
    if (oi->in_max >= 0) {
        char (*all)[24] = kf_calloc((size_t)n->nin + 1, sizeof *all);
        if (!all) {
            snprintf(st->why, st->whylen, "out of memory");
            return false;
        }
        for (int i = 0; i < n->nin; i++) snprintf(all[i], sizeof all[i], "v%d", var_of(st, n->in[i]));
        bool ok = expand(st, rhs, n, e, all, n->nin);
        kf_free(all);
        return ok;
    }
    snprintf(ops[0], sizeof ops[0], "v%d", var_of(st, n->in[0]));
    if (n->nin == 1) { /* variadic with one operand: identity */
        kf_cg_puts(rhs, ops[0]);
        return true;
    }
    for (int i = 1; i < n->nin; i++) {
        snprintf(ops[1], sizeof ops[1], "v%d", var_of(st, n->in[i]));
        if (i + 1 == n->nin) return expand(st, rhs, n, e, ops, 2);
        kf_cg_printf(pre, "        const %s t%d_%d = ", ctype(st->g->values[n->out[0]].type.dtype), self, i);
        if (!expand(st, pre, n, e, ops, 2)) return false;
        kf_cg_puts(pre, ";\n");
        snprintf(ops[0], sizeof ops[0], "t%d_%d", self, i);
    }
    return true;
}

/* Offset expression of input param pr inside the space (rank R, dims d):
 * "i" when it walks the space contiguously, "0" when it has one element,
 * else a sum of i<d> * stride over its non-broadcast dims. Sets need[d]. */
static void offset_expr(const kf_cg_param *pr, int R, const int64_t *dims, bool *need, kf_cg_str *s) {
    if (pr->numel == 1) {
        kf_cg_puts(s, "0");
        return;
    }
    int shift = R - pr->rank;
    bool contiguous = true;
    for (int d = 0; d < R; d++)
        if (dims[d] != 1 && (d < shift || pr->dims[d - shift] != dims[d])) contiguous = false;
    if (contiguous) {
        kf_cg_puts(s, "i");
        return;
    }
    int64_t stride = 1;
    bool first = true;
    for (int a = pr->rank - 1; a >= 0; a--) {
        if (pr->dims[a] != 1) {
            need[a + shift] = true;
            if (!first) kf_cg_puts(s, " + ");
            if (stride == 1) kf_cg_printf(s, "i%d", a + shift);
            else kf_cg_printf(s, "i%d * %lld", a + shift, (long long)stride);
            first = false;
        }
        stride *= pr->dims[a];
    }
}

static void set_param(kf_cg_param *pr, const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    pr->value = v;
    pr->dtype = t->dtype;
    pr->rank = t->rank;
    pr->numel = 1;
    for (int d = 0; d < t->rank; d++) {
        pr->dims[d] = t->dims[d];
        pr->numel *= t->dims[d];
    }
}

static kf_status generate(gen *st, kf_cg_kernel *k) {
    const kf_group *g = st->grp;
    const kf_graph *gr = st->g;
    const kf_cg_param *sp = &k->outs[0];
    int R = sp->rank;
    kf_cg_str s = {0}, loads = {0};

    /* header: the ops, one line each, in the names the body uses */
    kf_cg_printf(&s, "/* kfuse elementwise kernel: %u op%s over [", g->nnodes, g->nnodes == 1 ? "" : "s");
    for (int d = 0; d < R; d++) kf_cg_printf(&s, "%s%lld", d ? ", " : "", (long long)sp->dims[d]);
    kf_cg_puts(&s, "] float32\n");
    for (uint32_t j = 0; j < g->nnodes; j++) {
        const kf_node *n = &gr->nodes[g->nodes[j]];
        kf_cg_printf(&s, " *   v%d = %s(", var_of(st, n->out[0]), n->op_type);
        for (int i = 0; i < n->nin; i++) kf_cg_printf(&s, "%sv%d", i ? ", " : "", var_of(st, n->in[i]));
        kf_cg_puts(&s, ")\n");
    }
    kf_cg_puts(&s, " */\n");

    /* signature */
    kf_cg_printf(&s, "KF_KERNEL %s(", k->name);
    for (uint32_t i = 0; i < k->nins; i++)
        kf_cg_printf(&s, "%sconst KF_GLOBAL %s *KF_RESTRICT in%u", i ? ", " : "", mtype(k->ins[i].dtype), i);
    for (uint32_t o = 0; o < k->nouts; o++)
        kf_cg_printf(&s, ", KF_GLOBAL %s *KF_RESTRICT out%u", mtype(k->outs[o].dtype), o);
    kf_cg_puts(&s, ")\n{\n");
    kf_cg_printf(&s, "    for (%s i = (%s)KF_GLOBAL_ID; i < %lld; i += (%s)KF_GLOBAL_SIZE) {\n", st->ity, st->ity,
                 (long long)sp->numel, st->ity);

    /* loads (written aside first: they decide which multi-index dims exist) */
    bool need[KF_MAX_RANK] = {0};
    for (uint32_t i = 0; i < k->nins; i++) {
        const kf_cg_param *pr = &k->ins[i];
        kf_cg_printf(&loads, "        const %s v%d = in%u[", ctype(pr->dtype), var_of(st, pr->value), i);
        offset_expr(pr, R, sp->dims, need, &loads);
        kf_cg_puts(&loads, pr->dtype == KF_DT_BOOL ? "] != 0;\n" : "];\n");
    }
    int dmin = R;
    for (int d = 0; d < R; d++)
        if (need[d]) {
            dmin = d;
            break;
        }
    if (dmin < R) {
        kf_cg_printf(&s, "        %s r = i;\n", st->ity);
        for (int d = R - 1; d >= dmin; d--) {
            kf_cg_puts(&s, "        const ");
            if (d == 0) kf_cg_printf(&s, "%s i0 = r;\n", st->ity);
            else if (d == dmin) kf_cg_printf(&s, "%s i%d = r %% %lld;\n", st->ity, d, (long long)sp->dims[d]);
            else
                kf_cg_printf(&s, "%s i%d = r %% %lld; r /= %lld;\n", st->ity, d, (long long)sp->dims[d],
                             (long long)sp->dims[d]);
        }
    }
    kf_cg_puts(&s, loads.p ? loads.p : "");
    kf_cg_str_release(&loads);

    /* one line per node */
    for (uint32_t j = 0; j < g->nnodes; j++) {
        const kf_node *n = &gr->nodes[g->nodes[j]];
        kf_cg_str pre = {0}, rhs = {0};
        bool ok = node_rhs(st, &pre, &rhs, n);
        if (ok) {
            kf_cg_puts(&s, pre.p ? pre.p : "");
            kf_cg_printf(&s, "        const %s v%d = %s;\n", ctype(gr->values[n->out[0]].type.dtype),
                         var_of(st, n->out[0]), rhs.p ? rhs.p : "");
        }
        kf_cg_str_release(&pre);
        kf_cg_str_release(&rhs);
        if (!ok) {
            kf_cg_str_release(&s);
            return kf_fail(KF_ERR_UNSUPPORTED, "%s", st->why);
        }
    }
    for (uint32_t o = 0; o < k->nouts; o++) {
        int v = var_of(st, k->outs[o].value);
        if (k->outs[o].dtype == KF_DT_BOOL) kf_cg_printf(&s, "        out%u[i] = (unsigned char)(v%d != 0);\n", o, v);
        else kf_cg_printf(&s, "        out%u[i] = v%d;\n", o, v);
    }
    kf_cg_puts(&s, "    }\n}\n");
    k->body = kf_cg_take(&s);
    return k->body ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory writing a kernel");
}

void kf_cg_kernel_release(kf_cg_kernel *k) {
    kf_free(k->name);
    kf_free(k->body);
    kf_free(k->ins);
    kf_free(k->outs);
    *k = (kf_cg_kernel){0};
}

kf_status kf_cg_group(const kf_model *m, const kf_plan *p, uint32_t gi, kf_cg_kernel *k) {
    *k = (kf_cg_kernel){0};
    char why[512];
    if (kf_cg_unsupported(m, p, gi, why, sizeof why)) return kf_fail(KF_ERR_UNSUPPORTED, "group %u: %s", gi, why);
    const kf_group *g = &p->groups[gi];
    const kf_graph *gr = m->graph;
    /* one name per value: inputs first (parameter order), then node outputs */
    kf_id *vals = kf_calloc((size_t)g->ninputs + g->nnodes + 1, sizeof *vals);
    k->name = kf_strdup("kf_ew");
    k->ins = kf_calloc(g->ninputs + 1, sizeof *k->ins);
    k->outs = kf_calloc(g->noutputs, sizeof *k->outs);
    if (!vals || !k->name || !k->ins || !k->outs) {
        kf_free(vals);
        kf_cg_kernel_release(k);
        return kf_fail(KF_ERR_NOMEM, "out of memory generating group %u", gi);
    }
    gen st = {gr, g, vals, 0, "int", why, sizeof why};
    for (uint32_t i = 0; i < g->ninputs; i++) {
        set_param(&k->ins[i], gr, g->inputs[i]);
        vals[st.nvals++] = g->inputs[i];
    }
    for (uint32_t j = 0; j < g->nnodes; j++) vals[st.nvals++] = gr->nodes[g->nodes[j]].out[0];
    for (uint32_t o = 0; o < g->noutputs; o++) set_param(&k->outs[o], gr, g->outputs[o]);
    k->nins = g->ninputs;
    k->nouts = g->noutputs;
    k->numel = k->outs[0].numel;
    /* 32-bit indices are cheaper on GPUs; 64-bit only when a buffer needs them */
    for (uint32_t i = 0; i < k->nins; i++)
        if (k->ins[i].numel > INT32_MAX / 2) st.ity = "kf_i64";
    if (k->numel > INT32_MAX / 2) st.ity = "kf_i64"; /* /2: i += global size must not overflow */
    kf_status rc = generate(&st, k);
    kf_free(vals);
    if (rc) kf_cg_kernel_release(k);
    return rc;
}

kf_status kf_cg_source(const kf_cg_kernel *k, kf_cg_target t, char **text) {
    kf_cg_str s = {0};
    kf_cg_prelude(t, &s);
    kf_cg_puts(&s, k->body);
    *text = kf_cg_take(&s);
    return *text ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory writing a kernel source");
}
