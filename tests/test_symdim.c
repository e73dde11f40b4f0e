/*
 * test_symdim.c: symbolic dims as expressions (graph/symdim.c), the
 * symbolic contents of shape computations (graph/symval.c), shape
 * inference through them, and the fold pass turning symbolic Reshape and
 * Expand targets into constants or into the smallest computation from the
 * graph inputs' shapes; rewritten models are run against the originals at
 * several sizes of each symbol.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_sym.h"

static kf_sdim sym(kf_graph *g, const char *name) { return (kf_sdim){-1, kf_graph_sym(g, name)}; }
static kf_sdim c(int64_t v) { return kf_sdim_const(v); }

/* ---- the algebra alone ------------------------------------------------- */

Test(symdim, products_commute_and_intern_once) {
    kf_graph *g = kf_graph_new();
    kf_sdim a = sym(g, "a"), b = sym(g, "b");
    kf_sdim ab = kf_sdim_mul(g, a, b), ba = kf_sdim_mul(g, b, a);
    cr_expect(kf_sdim_eq(ab, ba));
    cr_expect(kf_sym_is_expr(g, ab.sym));
    cr_expect_str_eq(kf_sym_name(g, ab.sym), "a*b");
    /* a*b*2 == 2*(b*a), and differs from a*b */
    kf_sdim x = kf_sdim_mul(g, ab, c(2)), y = kf_sdim_mul(g, c(2), ba);
    cr_expect(kf_sdim_eq(x, y));
    cr_expect(!kf_sdim_eq(x, ab));
    cr_expect(!kf_sdim_eq(a, b));
    kf_graph_free(g);
}

/* Answers are remembered by operation and operands: asked again, in any
 * order and after many others (table collisions), each is what a graph
 * that never asked before gives, and a sum is never taken for a product
 * of the same operands. */
Test(symdim, remembered_answers_match_fresh_ones) {
    kf_graph *g = kf_graph_new(), *fresh = kf_graph_new();
    kf_sdim s[4] = {sym(g, "a"), sym(g, "b"), sym(g, "c"), sym(g, "d")};
    for (int i = 0; i < 4; i++) sym(fresh, kf_sym_name(g, s[i].sym)); /* the same ids in both graphs */
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                for (int k = 1; k < 40; k++) {
                    kf_sdim x = kf_sdim_mul(g, s[i], c(k)), y = kf_sdim_add(g, s[j], c(k));
                    kf_sdim p = kf_sdim_mul(g, x, y), q = kf_sdim_add(g, x, y), d = kf_sdim_div(g, p, x);
                    cr_assert(kf_sdim_known(p) && kf_sdim_known(q) && !kf_sdim_eq(p, q));
                    cr_assert(kf_sdim_eq(d, y), "(%s)/%s", kf_sym_name(g, p.sym), kf_sym_name(g, x.sym));
                    if (round < 2) continue;
                    kf_graph *f = fresh;
                    kf_sdim fx = kf_sdim_mul(f, s[i], c(k)), fy = kf_sdim_add(f, s[j], c(k));
                    cr_assert_str_eq(kf_sym_name(g, p.sym), kf_sym_name(f, kf_sdim_mul(f, fx, fy).sym));
                    cr_assert_str_eq(kf_sym_name(g, q.sym), kf_sym_name(f, kf_sdim_add(f, fx, fy).sym));
                }
    kf_graph_free(g);
    kf_graph_free(fresh);
}

Test(symdim, sums_expand_and_cancel) {
    kf_graph *g = kf_graph_new();
    kf_sdim a = sym(g, "a"), b = sym(g, "b");
    /* (a + 1) * b == a*b + b */
    kf_sdim l = kf_sdim_mul(g, kf_sdim_add(g, a, c(1)), b);
    kf_sdim r = kf_sdim_add(g, kf_sdim_mul(g, a, b), b);
    cr_expect(kf_sdim_eq(l, r));
    /* a + b - a == b; a - a == 0 */
    cr_expect(kf_sdim_eq(kf_sdim_sub(g, kf_sdim_add(g, a, b), a), b));
    kf_sdim z = kf_sdim_sub(g, a, a);
    cr_expect(z.sym == 0 && z.v == 0);
    /* constants fold */
    kf_sdim k = kf_sdim_mul(g, kf_sdim_add(g, c(3), c(4)), c(5));
    cr_expect(k.sym == 0 && k.v == 35);
    kf_graph_free(g);
}

Test(symdim, exact_division_and_floor) {
    kf_graph *g = kf_graph_new();
    kf_sdim a = sym(g, "a"), b = sym(g, "b");
    kf_sdim p = kf_sdim_mul(g, kf_sdim_mul(g, a, b), c(768)); /* a*b*768 */
    /* Reshape's -1: a*b*768 / (a*b*12) == 64 */
    kf_sdim q = kf_sdim_div(g, p, kf_sdim_mul(g, kf_sdim_mul(g, b, a), c(12)));
    cr_expect(q.sym == 0 && q.v == 64, "got %s %lld", kf_sym_name(g, q.sym), (long long)q.v);
    /* (2a + 4b) / 2 == a + 2b */
    kf_sdim s = kf_sdim_add(g, kf_sdim_mul(g, a, c(2)), kf_sdim_mul(g, b, c(4)));
    cr_expect(kf_sdim_eq(kf_sdim_div(g, s, c(2)), kf_sdim_add(g, a, kf_sdim_mul(g, b, c(2)))));
    /* (a + 1) / 2 has no closed form: a floor atom, the same one twice */
    kf_sdim f1 = kf_sdim_div(g, kf_sdim_add(g, a, c(1)), c(2));
    kf_sdim f2 = kf_sdim_div(g, kf_sdim_add(g, c(1), a), c(2));
    cr_expect(kf_sdim_known(f1) && f1.sym && kf_sdim_eq(f1, f2));
    cr_expect_str_eq(kf_sym_name(g, f1.sym), "floor((a+1)/2)");
    /* a / b with b not dividing: unknown */
    cr_expect(!kf_sdim_known(kf_sdim_div(g, a, b)));
    /* constants: floor */
    cr_expect_eq(kf_sdim_div(g, c(-7), c(2)).v, -4);
    cr_expect(!kf_sdim_known(kf_sdim_div(g, c(1), c(0))));
    kf_graph_free(g);
}

Test(symdim, binding_substitutes_into_expressions) {
    kf_graph *g = kf_graph_new();
    kf_sdim a = sym(g, "a"), b = sym(g, "b");
    kf_sdim e = kf_sdim_add(g, kf_sdim_mul(g, a, b), c(1)); /* a*b + 1 */
    kf_sdim e2 = kf_sdim_bind(g, e, a.sym, 3);                /* 3*b + 1 */
    cr_expect(kf_sdim_eq(e2, kf_sdim_add(g, kf_sdim_mul(g, b, c(3)), c(1))));
    kf_sdim e3 = kf_sdim_bind(g, e2, b.sym, 5);
    cr_expect(e3.sym == 0 && e3.v == 16);
    kf_sdim f = kf_sdim_div(g, kf_sdim_add(g, a, c(1)), c(2));
    kf_sdim f2 = kf_sdim_bind(g, f, a.sym, 6);
    cr_expect(f2.sym == 0 && f2.v == 3);
    kf_graph_free(g);
}

Test(symdim, unknowns_overflow_and_signs) {
    kf_graph *g = kf_graph_new();
    kf_sdim a = sym(g, "a");
    cr_expect(!kf_sdim_known(kf_sdim_add(g, a, kf_sdim_unknown())));
    cr_expect(!kf_sdim_known(kf_sdim_mul(g, c(INT64_MAX), c(2))));
    cr_expect(!kf_sdim_known(kf_sdim_mul(g, kf_sdim_mul(g, a, c(INT64_MAX / 2)), c(4))));
    /* seven factors exceed the canonical form */
    kf_sdim p = a;
    for (int i = 0; i < 6; i++) p = kf_sdim_mul(g, p, a);
    cr_expect(!kf_sdim_known(p));
    cr_expect(kf_sdim_nonneg(g, kf_sdim_mul(g, a, c(3))));
    cr_expect(!kf_sdim_nonneg(g, kf_sdim_sub(g, c(1), a)));
    kf_graph_free(g);
}

/* ---- shape inference ------------------------------------------------------- */

static const kf_type *type_of(kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value %s", name);
    return &m->graph->values[v].type;
}

/* The dims of value `name` as text ("N,S*N,64"). */
static const char *dims_text(kf_model *m, const char *name) {
    static char buf[256];
    const kf_type *t = type_of(m, name);
    size_t len = 0;
    buf[0] = 0;
    for (int d = 0; d < t->rank; d++) {
        if (t->dims[d] >= 0) len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%lld", d ? "," : "", (long long)t->dims[d]);
        else len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", d ? "," : "", kf_sym_name(m->graph, t->syms[d]));
    }
    return buf;
}

/* The attention head split of a BERT export with batch and sequence
 * symbolic, as the TorchScript exporter writes it. */
#define HEAD_SPLIT                                                                                                     \
    "input x float[N, S, 64]\n"                                                                                        \
    "const i0 int64[] = 0\n"                                                                                           \
    "const i1 int64[] = 1\n"                                                                                           \
    "const ax int64[1] = 0\n"                                                                                          \
    "const heads int64[1] = 2\n"                                                                                       \
    "const hd int64[1] = 32\n"                                                                                         \
    "s = Shape(x)\n"                                                                                                   \
    "n = Gather(s, i0) {axis=0}\n"                                                                                     \
    "l = Gather(s, i1) {axis=0}\n"                                                                                     \
    "n1 = Unsqueeze(n, ax)\n"                                                                                          \
    "l1 = Unsqueeze(l, ax)\n"                                                                                          \
    "t = Concat(n1, l1, heads, hd) {axis=0}\n"                                                                         \
    "r = Reshape(x, t)\n"                                                                                              \
    "p = Transpose(r) {perm=[0, 2, 1, 3]}\n"

Test(symdim_infer, shape_chains_keep_their_symbols) {
    kf_model *m = gt_parse(HEAD_SPLIT "output p\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_expect_str_eq(dims_text(m, "r"), "N,S,2,32");
    cr_expect_str_eq(dims_text(m, "p"), "N,2,S,32");
    const kf_symvec *sv = m->graph->values[kf_graph_find(m->graph, "t")].symval;
    cr_assert(sv && sv->n == 4);
    cr_expect(sv->e[2].sym == 0 && sv->e[2].v == 2);
    kf_model_free(m);
}

Test(symdim_infer, reshape_products_ranges_and_expand) {
    kf_model *m = gt_parse("input x float[N, S, 64]\n"
                           "input y float[1, 64]\n"
                           "const flat int64[2] = -1 64\n"
                           "const i1 int64[] = 1\n"
                           "const z int64[] = 0\n"
                           "const one int64[] = 1\n"
                           "f = Reshape(x, flat)\n"
                           "s = Shape(x)\n"
                           "l = Gather(s, i1) {axis=0}\n"
                           "k = Range(z, l, one)\n"
                           "h = Div(l, one)\n"
                           "sz = Size(x)\n"
                           "e = Expand(y, s)\n"
                           "c = ConstantOfShape(s)\n"
                           "fl = Flatten(x) {axis=2}\n"
                           "output f, k, h, sz, e, c, fl\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_expect_str_eq(dims_text(m, "f"), "N*S,64");
    cr_expect_str_eq(dims_text(m, "k"), "S");
    cr_expect_str_eq(dims_text(m, "e"), "N,S,64");
    cr_expect_str_eq(dims_text(m, "c"), "N,S,64");
    cr_expect_str_eq(dims_text(m, "fl"), "N*S,64");
    const kf_symvec *sz = m->graph->values[kf_graph_find(m->graph, "sz")].symval;
    cr_assert(sz && sz->n == 1 && sz->e[0].sym);
    cr_expect_str_eq(kf_sym_name(m->graph, sz->e[0].sym), "64*N*S");
    /* the same product, however it was reached, is one symbol */
    cr_expect_eq(type_of(m, "f")->syms[0], kf_sdim_div(m->graph, sz->e[0], kf_sdim_const(64)).sym);
    kf_model_free(m);
}

Test(symdim_infer, binding_a_name_fixes_every_expression) {
    kf_model *m = gt_parse("input x float[N, S, 64]\n"
                           "const flat int64[2] = -1 32\n"
                           "f = Reshape(x, flat)\n"
                           "output f\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_expect_str_eq(dims_text(m, "f"), "2*N*S,32");
    cr_assert_eq(kf_graph_bind_sym(m->graph, "N", 3), KF_OK);
    cr_expect_str_eq(dims_text(m, "f"), "6*S,32");
    cr_assert_eq(kf_graph_bind_sym(m->graph, "S", 5), KF_OK);
    cr_expect_str_eq(dims_text(m, "f"), "30,32");
    kf_model_free(m);
}

Test(symdim_infer, expressions_survive_a_file_round_trip) {
    kf_model *m = gt_parse("input x float[N, S, 64]\n"
                           "const flat int64[2] = -1 64\n"
                           "f = Reshape(x, flat)\n"
                           "g = Relu(f)\n"
                           "output g\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_model *b = gt_copy(m); /* writes dim_param "N*S" on f and g */
    cr_assert_eq(kf_infer_shapes(b), KF_OK, "%s", kf_last_error());
    const kf_type *f = type_of(b, "f"), *gg = type_of(b, "g");
    cr_expect_str_eq(dims_text(b, "f"), "N*S,64");
    cr_expect(kf_type_same_shape(f, gg));
    cr_expect(kf_sym_is_expr(b->graph, f->syms[0]), "the inferred expression replaces the declared name");
    kf_model_free(b);
    kf_model_free(m);
}

/* ---- folding --------------------------------------------------------------- */

static uint64_t run_fold(kf_model *m) {
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_pass_ctx ctx = {-1, false, 0, 0, false, NULL, 0};
    cr_assert_eq(kf_pass_fold(m, &ctx), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_dce(m->graph, NULL), KF_OK);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    return ctx.changes;
}

/* Both models at three sizes of every symbol (different per symbol). */
static void expect_same_at_sizes(const kf_model *a, const kf_model *b, double atol, double rtol) {
    for (int64_t base = 1; base <= 5; base += 2) gt_expect_same_outputs_sized(a, b, atol, rtol, base);
}

Test(symdim_fold, head_split_gets_a_constant_target) {
    kf_model *m = gt_parse(HEAD_SPLIT "output p\n");
    kf_model *orig = gt_copy(m);
    cr_expect_gt(run_fold(m), 0);
    cr_expect_eq(gt_count(m, "Shape"), 0);
    cr_expect_eq(gt_count(m, "Gather"), 0);
    cr_expect_eq(gt_count(m, "Concat"), 0);
    const kf_node *r = NULL;
    for (kf_id i = 1; i < m->graph->nnodes; i++)
        if (!m->graph->nodes[i].dead && m->graph->nodes[i].op == KF_OP_RESHAPE) r = &m->graph->nodes[i];
    cr_assert(r);
    const kf_tensor *t = m->graph->values[r->in[1]].init;
    cr_assert(t && t->numel == 4);
    int64_t want[4] = {0, 0, 2, 32};
    for (int k = 0; k < 4; k++) cr_expect_eq(kf_get_i64(t, k), want[k], "target[%d]", k);
    expect_same_at_sizes(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(symdim_fold, merged_dims_are_read_off_the_input) {
    /* [N*S, 192] back to [N, S, 192]: no 0/-1 spelling; the target comes
     * from the graph input's shape, once for both Reshapes */
    kf_model *m = gt_parse("input x float[N, S, 64]\n"
                           "const w float[64, 192] = random\n"
                           "const w2 float[64, 192] = random\n"
                           "const flat int64[2] = -1 64\n"
                           "const i0 int64[] = 0\n"
                           "const i1 int64[] = 1\n"
                           "const ax int64[1] = 0\n"
                           "const k int64[1] = 192\n"
                           "f = Reshape(x, flat)\n"
                           "y = MatMul(f, w)\n"
                           "y2 = MatMul(f, w2)\n"
                           "s = Shape(x)\n"
                           "n = Gather(s, i0) {axis=0}\n"
                           "l = Gather(s, i1) {axis=0}\n"
                           "n1 = Unsqueeze(n, ax)\n"
                           "l1 = Unsqueeze(l, ax)\n"
                           "t = Concat(n1, l1, k) {axis=0}\n"
                           "s2 = Shape(y2)\n"
                           "m0 = Gather(s2, i0) {axis=0}\n"
                           "d0 = Div(m0, l)\n"
                           "d1 = Unsqueeze(d0, ax)\n"
                           "t2 = Concat(d1, l1, k) {axis=0}\n"
                           "r = Reshape(y, t)\n"
                           "r2 = Reshape(y2, t2)\n"
                           "output r, r2\n");
    kf_model *orig = gt_copy(m);
    run_fold(m);
    cr_expect_str_eq(dims_text(m, "r"), "N,S,192");
    cr_expect_str_eq(dims_text(m, "r2"), "N,S,192");
    cr_expect_eq(gt_count(m, "Shape"), 1);
    cr_expect_eq(gt_count(m, "Gather"), 1);
    cr_expect_eq(gt_count(m, "Concat"), 1);
    cr_expect_eq(gt_count(m, "Div"), 0);
    /* a second sweep finds nothing more to do */
    kf_pass_ctx ctx = {-1, false, 0, 0, false, NULL, 0};
    cr_assert_eq(kf_pass_fold(m, &ctx), KF_OK);
    cr_expect_eq(ctx.changes, 0);
    expect_same_at_sizes(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(symdim_fold, static_parts_and_where_equal_fold) {
    /* PyTorch's expand: Where(Equal(shape, -1), ones, shape) */
    kf_model *m = gt_parse("input x float[N, 1, 8]\n"
                           "const i2 int64[] = 2\n"
                           "const ax int64[1] = 0\n"
                           "const one int64[1] = 1\n"
                           "const neg int64[3] = -1\n"
                           "const ones int64[3] = 1\n"
                           "const four int64[1] = 4\n"
                           "s = Shape(x)\n"
                           "n0 = Slice(s, ax, one)\n"
                           "e2 = Gather(s, i2) {axis=0}\n"
                           "sz = Unsqueeze(e2, ax)\n"
                           "shp = Concat(n0, four, sz) {axis=0}\n"
                           "eq = Equal(shp, neg)\n"
                           "tgt = Where(eq, ones, shp)\n"
                           "y = Expand(x, tgt)\n"
                           "output y\n");
    kf_model *orig = gt_copy(m);
    run_fold(m);
    cr_expect_str_eq(dims_text(m, "y"), "N,4,8");
    cr_expect_eq(gt_count(m, "Where"), 0);
    cr_expect_eq(gt_count(m, "Equal"), 0);
    cr_expect_eq(gt_count(m, "Shape"), 0);
    expect_same_at_sizes(orig, m, 0, 0);
    kf_model_free(m);
    kf_model_free(orig);
}

/* ---- real exports: symbolic against static ---------------------------------- */

#include "kf_plan.h"

/* Rules about shapes and layout rather than the model's math: their hits
 * differ by design between a symbolic and a static copy (a static copy
 * folds what a symbolic one keeps as the shape computation that remains). */
static bool shape_rule(const char *name) {
    static const char *const prefixes[] = {"fold", "cse", "remove_", "collapse_", "compose_", "gather_arange", NULL};
    for (int i = 0; prefixes[i]; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

typedef struct opt_run {
    kf_model *m;
    kf_opt_result res;
    uint32_t data_nodes; /* live nodes that read data, not only shapes */
    uint32_t launches;
} opt_run;

/* Live nodes whose outputs depend on graph input data, not only on shapes
 * and constants. */
static uint32_t data_nodes(const kf_model *m) {
    const kf_graph *g = m->graph;
    bool *dep = calloc(g->nvalues + 1, sizeof(bool));
    kf_id *order;
    uint32_t n, count = 0;
    cr_assert_eq(kf_graph_topo(g, &order, &n), KF_OK);
    for (uint32_t i = 0; i < g->ninputs; i++)
        if (!g->values[g->inputs[i]].init) dep[g->inputs[i]] = true;
    for (uint32_t k = 0; k < n; k++) {
        const kf_node *nd = &g->nodes[order[k]];
        bool d = false;
        if (nd->op != KF_OP_SHAPE && nd->op != KF_OP_SIZE)
            for (int i = 0; i < nd->nin; i++) d = d || (nd->in[i] && dep[nd->in[i]]);
        for (int j = 0; j < nd->nout; j++)
            if (nd->out[j]) dep[nd->out[j]] = d;
        count += d;
    }
    free(order);
    free(dep);
    return count;
}

static opt_run optimize_at(const char *path, bool bind) {
    opt_run r;
    memset(&r, 0, sizeof r);
    cr_assert_eq(kf_model_load(path, &r.m), KF_OK, "%s: %s", path, kf_last_error());
    if (bind) {
        cr_assert_eq(kf_graph_bind_sym(r.m->graph, "batch", 2), KF_OK);
        (void)kf_graph_bind_sym(r.m->graph, "seq", 8); /* the CNNs have no seq */
        kf_clear_error();
    }
    kf_opt_options o;
    kf_opt_options_default(&o);
    cr_assert_eq(kf_optimize(r.m, &o, &r.res), KF_OK, "%s: %s", path, kf_last_error());
    r.data_nodes = data_nodes(r.m);
    kf_plan_options po;
    kf_plan_options_default(&po);
    kf_plan *p;
    cr_assert_eq(kf_plan_build(r.m, &po, &p), KF_OK, "%s: %s", path, kf_last_error());
    r.launches = p->launches;
    kf_plan_free(p);
    return r;
}

static uint64_t hits_of(const opt_run *r, const char *name) {
    for (uint32_t i = 0; i < r->res.rules.n; i++)
        if (!strcmp(r->res.rules.rules[i]->name, name)) return r->res.rules.rules[i]->hits;
    return 0;
}

/* Every math rule fires as often on the export with symbolic batch and
 * sequence as with them fixed; the nodes and kernels that read data are
 * the static copy's plus at most `slack` (what still differs is named in
 * each call). */
static void expect_parity(const char *name, uint32_t slack) {
    char path[512];
    snprintf(path, sizeof path, KF_SOURCE_DIR "/bench/models/small/%s/model.onnx", name);
    opt_run sym = optimize_at(path, false), fixed = optimize_at(path, true);
    for (uint32_t i = 0; i < fixed.res.rules.n; i++) {
        const kf_rule *r = fixed.res.rules.rules[i];
        if (shape_rule(r->name)) continue;
        cr_expect_eq(hits_of(&sym, r->name), r->hits, "%s: rule %s: %llu hits symbolic, %llu static", name, r->name,
                     (unsigned long long)hits_of(&sym, r->name), (unsigned long long)r->hits);
    }
    cr_expect_eq(sym.res.opset_after, fixed.res.opset_after, "%s: opset raised differently", name);
    cr_log_info("%s: data nodes %u symbolic, %u static; launches %u symbolic, %u static", name, sym.data_nodes,
                fixed.data_nodes, sym.launches, fixed.launches);
    cr_expect_leq(sym.data_nodes, fixed.data_nodes + slack, "%s: %u data nodes symbolic, %u static", name,
                  sym.data_nodes, fixed.data_nodes);
    cr_expect_leq(sym.launches, fixed.launches + slack, "%s: %u launches symbolic, %u static", name, sym.launches,
                  fixed.launches);
    kf_rules_free(&sym.res.rules);
    kf_rules_free(&fixed.res.rules);
    kf_model_free(sym.m);
    kf_model_free(fixed.m);
}

/* bert/gpt2: the attention mask's Flatten -> Gather -> Reshape of the
 * user's mask keeps a gather with computed indices (static: a reshape);
 * gpt2's token embedding Gather also feeds the Shape its position ids are
 * computed from, which keeps it out of the LayerNorm group. */
Test(symdim_models, bert) { expect_parity("bert", 2); }
Test(symdim_models, gpt2) { expect_parity("gpt2", 3); }
Test(symdim_models, vit_b16) { expect_parity("vit_b16", 0); }
Test(symdim_models, resnet50) { expect_parity("resnet50", 0); }
Test(symdim_models, mobilenetv2) { expect_parity("mobilenetv2", 0); }

/* Planning a symbolic model at nominal sizes: the cost model sees them
 * (the same refusals as the static copy's plan), and the model keeps its
 * symbolic dims afterwards. */
Test(symdim_models, plan_at_nominal_sizes) {
    const char *path = KF_SOURCE_DIR "/bench/models/small/bert/model.onnx";
    opt_run fixed = optimize_at(path, true);
    kf_model *m;
    cr_assert_eq(kf_model_load(path, &m), KF_OK);
    kf_opt_options o;
    kf_opt_options_default(&o);
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, &o, &res), KF_OK, "%s", kf_last_error());
    kf_rules_free(&res.rules);
    kf_plan_options po;
    kf_plan_options_default(&po);
    po.target = KF_PLAN_DEFAULT_TARGET;
    kf_plan *p, *q, *r;
    const char *names[] = {"batch", "seq", "absent"};
    int64_t values[] = {2, 8, 5};
    cr_assert_eq(kf_plan_build_at(m, &po, names, values, 3, &p), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_plan_build(m, &po, &q), KF_OK);
    cr_assert_eq(kf_plan_build(fixed.m, &po, &r), KF_OK);
    cr_log_info("bert: cost refusals %u at nominal sizes, %u symbolic, %u static; launches %u, %u, %u",
                p->cost_refusals, q->cost_refusals, r->cost_refusals, p->launches, q->launches, r->launches);
    cr_expect_gt(r->cost_refusals, 0, "the static plan refuses nothing: the test shows nothing");
    cr_expect_eq(p->cost_refusals, r->cost_refusals, "the cost model did not see the nominal sizes");
    cr_expect_leq(p->launches, r->launches + 2);
    /* the plan says when it could not size its groups (kf_plan.est_unsized) */
    uint32_t launched = 0;
    for (uint32_t k = 0; k < q->ngroups; k++) launched += q->groups[k].launch != UINT32_MAX;
    cr_expect_gt(2 * q->est_unsized, launched, "the symbolic plan's kernels are mostly unsized (%u of %u)",
                 q->est_unsized, launched);
    cr_expect_eq(p->est_unsized, 0, "%u groups unsized at nominal sizes", p->est_unsized);
    cr_expect_eq(r->est_unsized, 0, "%u groups of the static plan unsized", r->est_unsized);
    const kf_type *in = &m->graph->values[m->graph->inputs[0]].type;
    cr_expect(in->dims[0] < 0 && in->syms[0] && in->dims[1] < 0 && in->syms[1], "the input's dims did not stay symbolic");
    int64_t neg[] = {-1};
    kf_plan *bad = NULL;
    cr_expect_eq(kf_plan_build_at(m, &po, names, neg, 1, &bad), KF_ERR_INVALID_ARG);
    cr_expect_null(bad);
    kf_clear_error();
    kf_plan_free(p);
    kf_plan_free(q);
    kf_plan_free(r);
    kf_model_free(m);
    kf_rules_free(&fixed.res.rules);
    kf_model_free(fixed.m);
}
