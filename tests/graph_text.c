/*
 * graph_text.c: small graphs written as text, for pass and rule tests
 * (graph in as text, the pass, the expected graph or fact out). See
 * graph_text.h for the format.
 */
#include "graph_text.h"

#include "kf_onnx.h"
#include "onnx.pb-c.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inputs one node may list (a Concat of 70 feature maps in the codegen
 * tests: past KF_CG_MAX_PARAMS). */
#define GT_MAX_INPUTS 96

typedef struct cur {
    const char *p;
    int line;
} cur;

static void skip_ws(cur *c) {
    while (*c->p == ' ' || *c->p == '\t') c->p++;
}

static bool eat(cur *c, const char *s) {
    skip_ws(c);
    size_t n = strlen(s);
    if (strncmp(c->p, s, n)) return false;
    c->p += n;
    return true;
}

static void ident(cur *c, char *out, size_t n) {
    skip_ws(c);
    size_t k = 0;
    while ((isalnum((unsigned char)*c->p) || *c->p == '_' || *c->p == '.' || *c->p == '/' || *c->p == ':') && k + 1 < n)
        out[k++] = *c->p++;
    out[k] = 0;
    cr_assert(k > 0, "graph text line %d: expected a name at '%.20s'", c->line, c->p);
}

static double number(cur *c) {
    skip_ws(c);
    char *e;
    double v = strtod(c->p, &e);
    cr_assert(e != c->p, "graph text line %d: expected a number at '%.20s'", c->line, c->p);
    c->p = e;
    return v;
}

static kf_dtype dtype_of(const char *s, int line) {
    for (int d = 1; d < KF_DT_COUNT_; d++)
        if (!strcmp(kf_dtype_name((kf_dtype)d), s)) return (kf_dtype)d;
    cr_assert_fail("graph text line %d: unknown dtype '%s'", line, s);
    return KF_DT_UNDEFINED;
}

/* DTYPE[d0, d1, ...] with numbers or symbol names */
static void parse_type(cur *c, kf_graph *g, kf_type *ty) {
    char dt[32];
    ident(c, dt, sizeof dt);
    kf_type_unknown(ty);
    ty->dtype = dtype_of(dt, c->line);
    cr_assert(eat(c, "["), "graph text line %d: expected '['", c->line);
    ty->rank = 0;
    while (!eat(c, "]")) {
        skip_ws(c);
        if (isdigit((unsigned char)*c->p)) {
            ty->dims[ty->rank++] = (int64_t)number(c);
        } else {
            char sym[64];
            ident(c, sym, sizeof sym);
            ty->dims[ty->rank] = -1;
            ty->syms[ty->rank++] = kf_graph_sym(g, sym);
        }
        eat(c, ",");
    }
}

static kf_id value(kf_graph *g, const char *name) {
    kf_id v;
    cr_assert_eq(kf_graph_intern_value(g, name, &v), KF_OK, "%s", kf_last_error());
    return v;
}

/* Bodies ("graph NAME" ... "end") of one graph, for attributes "=@NAME". */
#define GT_MAX_BODIES 16
typedef struct bodies {
    char name[GT_MAX_BODIES][64];
    kf_model *m[GT_MAX_BODIES];
    int n;
} bodies;

static kf_model *parse_text(const char *text, int first_line, const kf_model *outer);

/* Graph attribute `name` of the body graph b: the AttributeProto, packed as
 * the loader keeps it. */
static void pack_body(const kf_model *b, const char *name, kf_attr *a) {
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(b, &buf, &len), KF_OK, "body %s: %s", name, kf_last_error());
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    free(buf);
    cr_assert(mp && mp->graph);
    Onnx__AttributeProto ap;
    onnx__attribute_proto__init(&ap);
    ap.name = (char *)name;
    ap.has_type = 1;
    ap.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
    ap.g = mp->graph;
    a->type = KF_ATTR_GRAPH;
    a->packed_len = onnx__attribute_proto__get_packed_size(&ap);
    a->packed = malloc(a->packed_len + 1);
    cr_assert(a->packed);
    onnx__attribute_proto__pack(&ap, a->packed);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* True for a value of body graph g that the body reads from the graphs
 * around it (used, yet no input, initializer or node output). */
static bool outer_read(const kf_graph *g, kf_id v) {
    const kf_value *x = &g->values[v];
    return !x->producer && !x->is_input && !x->init && (x->nusers || x->is_output);
}

static void parse_attrs(cur *c, kf_graph *g, kf_id nid, const bodies *bs, bool in_body) {
    kf_node *n = &g->nodes[nid];
    if (!eat(c, "{")) return;
    while (!eat(c, "}")) {
        char name[64];
        ident(c, name, sizeof name);
        cr_assert(eat(c, "="), "graph text line %d: expected '=' after attribute %s", c->line, name);
        kf_attr a = {.name = name};
        skip_ws(c);
        if (*c->p == '@') {
            c->p++;
            char bname[64];
            ident(c, bname, sizeof bname);
            int k = 0;
            while (k < bs->n && strcmp(bs->name[k], bname)) k++;
            cr_assert(k < bs->n, "graph text line %d: no graph '%s' before it", c->line, bname);
            pack_body(bs->m[k], name, &a);
            cr_assert_eq(kf_node_add_attr(n, &a), KF_OK);
            free(a.packed);
            /* the node captures what the body reads from outside */
            const kf_graph *bg = bs->m[k]->graph;
            for (kf_id v = 1; v < bg->nvalues; v++) {
                if (!outer_read(bg, v)) continue;
                const char *vn = bg->values[v].name;
                kf_id ov = kf_graph_find(g, vn);
                cr_assert(ov || in_body, "graph text line %d: graph '%s' reads '%s', which is not defined", c->line,
                          bname, vn);
                if (!ov) ov = value(g, vn);
                bool have = false;
                n = &g->nodes[nid];
                for (int q = 0; q < n->ncap; q++) have = have || !strcmp(n->capname[q], vn);
                if (!have) cr_assert_eq(kf_node_add_capture(g, nid, ov, vn), KF_OK, "%s", kf_last_error());
            }
            n = &g->nodes[nid];
            eat(c, ",");
            continue;
        }
        if (*c->p == '"') {
            const char *s = ++c->p;
            while (*c->p && *c->p != '"') c->p++;
            a.type = KF_ATTR_STRING;
            a.s.ptr = strndup(s, (size_t)(c->p - s));
            a.s.len = (size_t)(c->p - s);
            c->p++;
        } else if (eat(c, "[")) {
            double vals[64];
            int k = 0;
            bool ints = true;
            while (!eat(c, "]")) {
                skip_ws(c);
                const char *start = c->p;
                vals[k] = number(c);
                for (const char *q = start; q < c->p; q++)
                    if (*q == '.' || *q == 'e') ints = false;
                k++;
                eat(c, ",");
            }
            a.n = k;
            if (ints) {
                a.type = KF_ATTR_INTS;
                a.ints = calloc((size_t)k + 1, sizeof(int64_t));
                for (int i = 0; i < k; i++) a.ints[i] = (int64_t)vals[i];
            } else {
                a.type = KF_ATTR_FLOATS;
                a.floats = calloc((size_t)k + 1, sizeof(float));
                for (int i = 0; i < k; i++) a.floats[i] = (float)vals[i];
            }
        } else {
            const char *start = c->p;
            double v = number(c);
            bool isint = true;
            for (const char *q = start; q < c->p; q++)
                if (*q == '.' || *q == 'e') isint = false;
            if (isint) {
                a.type = KF_ATTR_INT;
                a.i = (int64_t)v;
            } else {
                a.type = KF_ATTR_FLOAT;
                a.f = (float)v;
            }
        }
        cr_assert_eq(kf_node_add_attr(n, &a), KF_OK);
        free(a.s.ptr);
        free(a.ints);
        free(a.floats);
        eat(c, ",");
    }
}

kf_model *gt_parse(const char *text) { return parse_text(text, 0, NULL); }

/* Reads graph text; outer: the model whose graph encloses this one (a
 * body: names it does not define are read from outside, and its nodes take
 * the outer opset), NULL at the top. first_line: line number before text. */
static kf_model *parse_text(const char *text, int first_line, const kf_model *outer) {
    kf_model *m = calloc(1, sizeof *m);
    m->graph = kf_graph_new();
    m->opsets = calloc(1, sizeof(kf_opset));
    m->opsets[0].domain = strdup("");
    m->opsets[0].version = outer ? outer->opsets[0].version : 17;
    m->nopsets = 1;
    m->ir_version = 8;
    kf_graph *g = m->graph;
    bodies bs = {.n = 0};
    cur c = {text, first_line};
    while (*c.p) {
        c.line++;
        const char *eol = strchr(c.p, '\n');
        size_t len = eol ? (size_t)(eol - c.p) : strlen(c.p);
        char *line = strndup(c.p, len);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        cur lc = {line, c.line};
        skip_ws(&lc);
        if (!*lc.p) {
        } else if (eat(&lc, "graph ")) {
            /* a body up to its matching "end"; nested bodies nest */
            cr_assert(bs.n < GT_MAX_BODIES, "graph text line %d: more than %d graphs", c.line, GT_MAX_BODIES);
            ident(&lc, bs.name[bs.n], sizeof bs.name[bs.n]);
            int start_line = c.line, depth = 1;
            c.p += len;
            if (*c.p == '\n') c.p++;
            const char *start = c.p;
            while (*c.p && depth) {
                c.line++;
                const char *e = strchr(c.p, '\n');
                size_t l = e ? (size_t)(e - c.p) : strlen(c.p);
                cur bc = {c.p, c.line};
                skip_ws(&bc);
                if (!strncmp(bc.p, "graph ", 6)) depth++;
                else if (!strncmp(bc.p, "end", 3) && (bc.p + 3 == c.p + l || bc.p[3] == ' ' || bc.p[3] == '#')) depth--;
                if (depth) c.p += l + (e ? 1 : 0);
                else {
                    char *sub = strndup(start, (size_t)(c.p - start));
                    bs.m[bs.n++] = parse_text(sub, start_line, m);
                    free(sub);
                    len = l;
                }
            }
            cr_assert(!depth, "graph text line %d: graph '%s' has no 'end'", start_line, bs.name[bs.n]);
        } else if (eat(&lc, "opset ")) {
            m->opsets[0].version = (int64_t)number(&lc);
        } else if (eat(&lc, "input ")) {
            char name[128];
            ident(&lc, name, sizeof name);
            kf_id v = value(g, name);
            parse_type(&lc, g, &g->values[v].type);
            g->values[v].has_type = true;
            cr_assert_eq(kf_graph_mark_input(g, v), KF_OK);
        } else if (eat(&lc, "const ")) {
            char name[128];
            ident(&lc, name, sizeof name);
            kf_type ty;
            parse_type(&lc, g, &ty);
            kf_tensor *t = kf_tensor_new();
            cr_assert_eq(kf_tensor_alloc(t, ty.dtype, ty.rank, ty.dims), KF_OK, "%s", kf_last_error());
            cr_assert(eat(&lc, "="), "graph text line %d: const needs '= values' or '= random'", c.line);
            if (eat(&lc, "random")) {
                for (int64_t i = 0; i < t->numel; i++) kf_set_f64(t, i, tu_uniform(-2, 2));
            } else {
                double last = 0;
                for (int64_t i = 0; i < t->numel; i++) {
                    skip_ws(&lc);
                    if (*lc.p) last = number(&lc); /* a short list repeats its last value */
                    kf_set_f64(t, i, last);
                }
            }
            kf_id v = value(g, name);
            g->values[v].init = t;
            kf_type_of_tensor(&g->values[v].type, t);
        } else if (eat(&lc, "output ")) {
            while (*lc.p) {
                char name[128];
                ident(&lc, name, sizeof name);
                kf_id v = kf_graph_find(g, name);
                if (!v && outer) v = value(g, name); /* a body may output an outer value */
                cr_assert(v, "graph text line %d: output '%s' is not defined", c.line, name);
                cr_assert_eq(kf_graph_mark_output(g, v), KF_OK);
                eat(&lc, ",");
                skip_ws(&lc);
            }
        } else {
            kf_id outs[8];
            int nout = 0;
            do {
                char name[128];
                cr_assert(nout < 8, "graph text line %d: more than 8 outputs", c.line);
                ident(&lc, name, sizeof name);
                outs[nout++] = value(g, name);
            } while (eat(&lc, ","));
            cr_assert(eat(&lc, "="), "graph text line %d: expected '='", c.line);
            char op[64];
            ident(&lc, op, sizeof op);
            cr_assert(eat(&lc, "("), "graph text line %d: expected '(' after %s", c.line, op);
            kf_id ins[GT_MAX_INPUTS];
            int nin = 0;
            while (!eat(&lc, ")")) {
                skip_ws(&lc);
                cr_assert(nin < GT_MAX_INPUTS, "graph text line %d: more than %d inputs", c.line, GT_MAX_INPUTS);
                if (*lc.p == ',' ) {
                    ins[nin++] = 0; /* absent optional input: "f(x, , z)" */
                    lc.p++;
                    continue;
                }
                char name[128];
                ident(&lc, name, sizeof name);
                kf_id v = kf_graph_find(g, name);
                if (!v && outer) v = value(g, name); /* read from the enclosing graph */
                cr_assert(v, "graph text line %d: input '%s' is not defined", c.line, name);
                ins[nin++] = v;
                eat(&lc, ",");
            }
            kf_id nid;
            char nname[160];
            snprintf(nname, sizeof nname, "%s_%d", op, c.line);
            cr_assert_eq(kf_graph_add_node(g, op, "", nname, ins, nin, outs, nout, &nid), KF_OK, "line %d: %s", c.line,
                         kf_last_error());
            kf_node *n = &g->nodes[nid];
            n->op = kf_op_lookup("", op);
            n->opset = m->opsets[0].version;
            parse_attrs(&lc, g, nid, &bs, outer != NULL);
        }
        free(line);
        c.p += len;
        if (*c.p == '\n') c.p++;
    }
    for (int k = 0; k < bs.n; k++) kf_model_free(bs.m[k]);
    return m;
}

uint32_t gt_count(const kf_model *m, const char *op_type) {
    uint32_t n = 0;
    const kf_graph *g = m->graph;
    for (kf_id i = 1; i < g->nnodes; i++)
        if (!g->nodes[i].dead && !strcmp(g->nodes[i].op_type, op_type)) n++;
    return n;
}

static void random_inputs(const kf_model *m, int64_t base, kf_tensor **ins, uint32_t *nins) {
    kf_id *real;
    uint32_t n;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &n), KF_OK);
    kf_tensor *t = calloc(n + 1, sizeof(kf_tensor));
    for (uint32_t i = 0; i < n; i++) {
        const kf_type *ty = &m->graph->values[real[i]].type;
        int64_t dims[KF_MAX_RANK];
        for (int d = 0; d < ty->rank; d++)
            dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : base < 0 ? 3 : base + (ty->syms[d] ? ty->syms[d] - 1 : 0);
        t[i] = tu_rand(ty->dtype, ty->rank, dims, -2, 2);
    }
    free(real);
    *ins = t;
    *nins = n;
}

void gt_random_inputs(const kf_model *m, kf_tensor **ins, uint32_t *nins) { random_inputs(m, -1, ins, nins); }

void gt_expect_same_outputs(const kf_model *a, const kf_model *b, double atol, double rtol) {
    gt_expect_same_outputs_sized(a, b, atol, rtol, -1);
}

void gt_expect_same_outputs_sized(const kf_model *a, const kf_model *b, double atol, double rtol, int64_t base) {
    kf_tensor *ins;
    uint32_t n;
    random_inputs(a, base, &ins, &n);
    uint32_t no = a->graph->noutputs;
    cr_assert_eq(no, b->graph->noutputs, "output counts differ");
    kf_tensor *oa = calloc(no + 1, sizeof(kf_tensor)), *ob = calloc(no + 1, sizeof(kf_tensor));
    cr_assert_eq(kf_eval_model(a, ins, (int)n, oa, NULL), KF_OK, "original: %s", kf_last_error());
    cr_assert_eq(kf_eval_model(b, ins, (int)n, ob, NULL), KF_OK, "rewritten: %s", kf_last_error());
    for (uint32_t o = 0; o < no; o++) {
        char why[256];
        cr_assert(tu_close(&ob[o], &oa[o], atol, rtol, why, sizeof why), "output %u: %s", o, why);
        kf_tensor_release(&oa[o]);
        kf_tensor_release(&ob[o]);
    }
    for (uint32_t i = 0; i < n; i++) kf_tensor_release(&ins[i]);
    free(ins);
    free(oa);
    free(ob);
}

kf_model *gt_copy(const kf_model *m) {
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &buf, &len), KF_OK, "%s", kf_last_error());
    kf_model *c;
    cr_assert_eq(kf_model_load_memory(buf, len, NULL, &c), KF_OK, "%s", kf_last_error());
    free(buf);
    return c;
}

kf_ruleset gt_run_rules(kf_model *m, kf_status (*add)(kf_ruleset *)) {
    kf_ruleset rs = {0};
    cr_assert_eq(add(&rs), KF_OK, "%s", kf_last_error());
    kf_rewrite_opts o = {-1, false};
    cr_assert_eq(kf_rewrite(m, &rs, &o, NULL), KF_OK, "%s", kf_last_error());
    return rs;
}

const char *gt_reasons(const kf_ruleset *rs, const char *name) {
    static char buf[4096];
    buf[0] = 0;
    for (uint32_t i = 0; i < rs->n; i++) {
        if (strcmp(rs->rules[i]->name, name)) continue;
        for (int k = 0; k < rs->rules[i]->nnear; k++) {
            if (k) strncat(buf, " | ", sizeof buf - strlen(buf) - 1);
            strncat(buf, rs->rules[i]->near[k].reason, sizeof buf - strlen(buf) - 1);
        }
        return buf;
    }
    cr_assert_fail("no rule %s", name);
    return buf;
}

uint64_t gt_hits(const kf_ruleset *rs, const char *name) {
    for (uint32_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->rules[i]->name, name)) return rs->rules[i]->hits;
    return 0;
}

int gt_walk_models(const char *dir, void (*fn)(const char *model, const char *data_dir, void *user), void *user) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t n = strlen(e->d_name);
        if (n <= 5 || strcmp(e->d_name + n - 5, ".onnx")) {
            found += gt_walk_models(p, fn, user);
            continue;
        }
        char data[1100];
        const char *use = NULL;
        static const char *const names[] = {"test_data_set_0", "test_data_0"};
        for (int k = 0; k < 2 && !use; k++) {
            snprintf(data, sizeof data, "%s/%s", dir, names[k]);
            DIR *dd = opendir(data);
            if (dd) {
                closedir(dd);
                use = data;
            }
        }
        fn(p, use, user);
        found++;
    }
    closedir(d);
    return found;
}

bool gt_load_dataset_inputs(const kf_model *m, const char *dir, kf_tensor *ins, uint32_t nreal, const kf_id *real) {
    for (uint32_t i = 0; i < nreal; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/input_%u.pb", dir, i);
        if (kf_onnx_read_tensor_file(p, &ins[i], NULL) != KF_OK) return false;
        if (ins[i].dtype == KF_DT_UINT16 && m->graph->values[real[i]].type.dtype == KF_DT_BFLOAT16)
            ins[i].dtype = KF_DT_BFLOAT16;
    }
    return true;
}
