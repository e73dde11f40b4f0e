/*
 * test_fuse_out.c: `kfuse fuse` output. Model-local functions in the IR
 * (import, export, evaluation with nested calls and caller attributes),
 * groups written as ai.kfuse function calls, the reports, and the
 * acceptance run: every model of the ONNX test data and ../shared/models,
 * optimized, planned, fused, written and read back, gives the original's
 * outputs on its test_data_set_0 inputs through the reference evaluator.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_fuse.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_run.h"

#define TESTDATA "/usr/share/libonnx-testdata/data"
#define SHARED_MODELS KF_SOURCE_DIR "/../shared/models/ort"

/* The acceptance tests fuse with the planner (kf_plan_build), and once more
 * with the stand-in plan, whose runs of 16 mixed nodes make bodies the
 * planner would not (anchors with reductions, shape ops inside). */
static bool use_stand_in;
static kf_status test_plan(kf_model *m, kf_plan **p) {
    if (use_stand_in) return kf_fuse_simple_plan(m, p);
    kf_plan_options o;
    kf_plan_options_default(&o);
    kf_plan *built;
    KF_TRY(kf_plan_build(m, &o, &built));
    kf_status st = kf_fuse_plan_copy(m, built, p); /* the planner's plan reads the model until freed */
    kf_plan_free(built);
    return st;
}
static void test_plan_free(kf_plan *p) { kf_fuse_simple_plan_free(p); }

/* A plan by hand: groups[i] lists node names (NULL-terminated rows). */
static kf_plan *hand_plan(const kf_model *m, const char *const *const *groups, uint32_t ngroups) {
    const kf_graph *g = m->graph;
    kf_plan *p = calloc(1, sizeof *p);
    p->groups = calloc(ngroups + 1, sizeof(kf_group));
    p->group_of = malloc(sizeof(uint32_t) * g->nnodes);
    for (uint32_t i = 0; i < g->nnodes; i++) p->group_of[i] = UINT32_MAX;
    p->ngroups = ngroups;
    p->launches = ngroups;
    for (uint32_t gi = 0; gi < ngroups; gi++) {
        kf_group *grp = &p->groups[gi];
        uint32_t n = 0;
        while (groups[gi][n]) n++;
        grp->nodes = calloc(n + 1, sizeof(kf_id));
        for (uint32_t k = 0; k < n; k++) {
            kf_id id = 0;
            for (kf_id i = 1; i < g->nnodes && !id; i++)
                if (!g->nodes[i].dead && !strcmp(g->nodes[i].name, groups[gi][k])) id = i;
            cr_assert(id, "hand plan: no node '%s'", groups[gi][k]);
            grp->nodes[grp->nnodes++] = id;
            p->group_of[id] = gi;
        }
        grp->bytes_read = grp->bytes_written = grp->flops = -1;
        grp->launch = gi;
    }
    return p;
}

/* Every live node not yet in a group gets a group of its own. */
static kf_plan *hand_plan_rest(const kf_model *m, const char *const *const *groups, uint32_t ngroups) {
    const kf_graph *g = m->graph;
    kf_plan *p = hand_plan(m, groups, ngroups);
    p->groups = realloc(p->groups, sizeof(kf_group) * (ngroups + g->nnodes));
    for (kf_id i = 1; i < g->nnodes; i++) {
        if (g->nodes[i].dead || p->group_of[i] != UINT32_MAX) continue;
        kf_group *grp = &p->groups[p->ngroups];
        memset(grp, 0, sizeof *grp);
        grp->nodes = calloc(2, sizeof(kf_id));
        grp->nodes[0] = i;
        grp->nnodes = 1;
        grp->kind = KF_GROUP_OPAQUE;
        p->group_of[i] = p->ngroups++;
    }
    p->launches = p->ngroups;
    return p;
}

static const char *const *const *G(const char *const *const *x) { return x; }

/* Node name as graph_text writes it: OP_LINE. */
#define ROW(...) ((const char *const[]){__VA_ARGS__, NULL})

static kf_model *fused_copy(const kf_model *m, const kf_plan *p, kf_fuse_stats *st) {
    kf_model *c = gt_copy(m);
    cr_assert_eq(kf_fuse_apply(c, p, st), KF_OK, "%s", kf_last_error());
    kf_model *r = gt_copy(c); /* through ONNX and back */
    kf_model_free(c);
    return r;
}

/* ---- groups as functions ------------------------------------------------------- */

static const char *CHAIN = "input x float[2, 5]\n"      /* line 1 */
                           "input r float[2, 5]\n"      /* 2 */
                           "const b float[5] = random\n" /* 3 */
                           "a = Add(x, b)\n"            /* 4 */
                           "s = Sigmoid(a)\n"           /* 5 */
                           "m = Mul(a, s)\n"            /* 6 */
                           "t = Add(m, r)\n"            /* 7 */
                           "u = Transpose(t) {perm=[1,0]}\n" /* 8 */
                           "output u, s\n";

Test(fuseout_apply, chain_becomes_one_call_with_equal_outputs) {
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5", "Mul_6", "Add_7")}), 1);
    kf_fuse_stats st;
    kf_model *f = fused_copy(m, p, &st);
    cr_assert_eq(st.functions, 1);
    cr_assert_eq(st.kept, 1, "the one-node Transpose group keeps its node");
    cr_assert_eq(kf_graph_live_nodes(f->graph), 2);
    cr_assert_eq(gt_count(f, "group_0"), 1);
    cr_assert_eq(gt_count(f, "Transpose"), 1);
    cr_assert_eq(f->nfuncs, 1);
    const kf_function *fn = kf_model_function(f, "ai.kfuse", "group_0");
    cr_assert(fn);
    /* inputs in first-use order: x, b (the initializer stays outside), r */
    cr_assert_eq(fn->body->ninputs, 3);
    cr_assert_str_eq(fn->body->values[fn->body->inputs[0]].name, "x");
    cr_assert_str_eq(fn->body->values[fn->body->inputs[1]].name, "b");
    cr_assert_str_eq(fn->body->values[fn->body->inputs[2]].name, "r");
    /* s is a graph output, t feeds the Transpose: both leave the group */
    cr_assert_eq(fn->body->noutputs, 2);
    cr_assert_str_eq(fn->body->values[fn->body->outputs[0]].name, "s");
    cr_assert_str_eq(fn->body->values[fn->body->outputs[1]].name, "t");
    cr_assert_eq(kf_graph_live_nodes(fn->body), 4);
    cr_assert_eq(kf_model_opset(f, "ai.kfuse"), 1);
    cr_assert_eq(kf_function_opset(fn, ""), 17);
    cr_assert_geq(f->ir_version, 8);
    cr_assert(f->graph->values[kf_graph_find(f->graph, "b")].init, "the constant stays a graph initializer");
    gt_expect_same_outputs(m, f, 1e-5, 1e-4);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    kf_model_free(f);
}

Test(fuseout_apply, attributes_travel_into_the_body) {
    kf_model *m = gt_parse("input x float[3, 4]\n"
                           "y = LeakyRelu(x) {alpha=0.25}\n"
                           "z = Transpose(y) {perm=[1,0]}\n"
                           "output z\n");
    kf_plan *p = hand_plan(m, G((const char *const *const[]){ROW("LeakyRelu_2", "Transpose_3")}), 1);
    kf_model *f = fused_copy(m, p, NULL);
    const kf_function *fn = kf_model_function(f, "ai.kfuse", "group_0");
    cr_assert(fn);
    const kf_node *lr = NULL;
    for (kf_id i = 1; i < fn->body->nnodes; i++)
        if (!strcmp(fn->body->nodes[i].op_type, "LeakyRelu")) lr = &fn->body->nodes[i];
    cr_assert(lr);
    cr_assert_float_eq(kf_attr_f(lr, "alpha", 0), 0.25f, 1e-7);
    cr_assert_eq(lr->op, kf_op_lookup("", "LeakyRelu"), "body nodes know their op");
    gt_expect_same_outputs(m, f, 1e-5, 1e-4);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    kf_model_free(f);
}

Test(fuseout_apply, export_is_deterministic_and_round_trips) {
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5"), ROW("Mul_6", "Add_7")}), 2);
    kf_model *f = fused_copy(m, p, NULL);
    cr_assert(kf_model_function(f, "ai.kfuse", "group_0") && kf_model_function(f, "ai.kfuse", "group_1"));
    void *b1, *b2;
    size_t l1, l2;
    cr_assert_eq(kf_model_save_memory(f, &b1, &l1), KF_OK);
    kf_model *g = gt_copy(f);
    cr_assert_eq(kf_model_save_memory(g, &b2, &l2), KF_OK);
    cr_assert(l1 == l2 && !memcmp(b1, b2, l1), "saving a loaded fused model gives the same bytes");
    char why[256];
    cr_assert(kf_model_equal(f, g, why, sizeof why), "%s", why);
    /* fusing the same model with the same plan twice gives the same file */
    kf_model *f2 = fused_copy(m, p, NULL);
    void *b3;
    size_t l3;
    cr_assert_eq(kf_model_save_memory(f2, &b3, &l3), KF_OK);
    cr_assert(l1 == l3 && !memcmp(b1, b3, l1));
    free(b1);
    free(b2);
    free(b3);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    kf_model_free(f);
    kf_model_free(f2);
    kf_model_free(g);
}

Test(fuseout_apply, function_name_taken_gets_a_suffix) {
    kf_model *m = gt_parse(CHAIN);
    kf_function *other = kf_function_new("ai.kfuse", "group_0");
    cr_assert_eq(kf_model_add_function(m, other), KF_OK);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5")}), 1);
    kf_model *c = gt_copy(m);
    cr_assert_eq(kf_fuse_apply(c, p, NULL), KF_OK, "%s", kf_last_error());
    cr_assert(kf_model_function(c, "ai.kfuse", "group_0_2"));
    cr_assert_eq(gt_count(c, "group_0_2"), 1);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    kf_model_free(c);
}

Test(fuseout_apply, node_in_two_groups_is_refused) {
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5"), ROW("Sigmoid_5", "Mul_6")}), 2);
    cr_assert_eq(kf_fuse_apply(m, p, NULL), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "Sigmoid_5"), "%s", kf_last_error());
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
}

Test(fuseout_apply, non_convex_group_is_an_internal_error) {
    /* a -> s -> m and a -> m: grouping {a, m} without s closes a cycle */
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Mul_6")}), 1);
    cr_assert_eq(kf_fuse_apply(m, p, NULL), KF_ERR_INTERNAL);
    cr_assert(strstr(kf_last_error(), "not convex"), "%s", kf_last_error());
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
}

/* ---- evaluating function calls --------------------------------------------------- */

/* Moves the graph of a graph-text model into a new function body. */
static kf_function *fn_from_text(const char *domain, const char *name, const char *text) {
    kf_model *b = gt_parse(text);
    kf_function *f = kf_function_new(domain, name);
    kf_graph_free(f->body);
    f->body = b->graph;
    b->graph = kf_graph_new();
    f->opsets = calloc(1, sizeof(kf_opset));
    f->opsets[0].domain = strdup("");
    f->opsets[0].version = 17;
    f->nopsets = 1;
    kf_model_free(b);
    return f;
}

static void set_domain(kf_model *m, const char *op_type, const char *domain) {
    for (kf_id i = 1; i < m->graph->nnodes; i++)
        if (!strcmp(m->graph->nodes[i].op_type, op_type)) {
            free(m->graph->nodes[i].domain);
            m->graph->nodes[i].domain = strdup(domain);
        }
}

Test(fuseout_eval, caller_attribute_reaches_the_body) {
    kf_function *f = fn_from_text("t", "Leaky", "input x float[2, 3]\n"
                                                 "y = LeakyRelu(x) {alpha=0.5}\n"
                                                 "output y\n");
    for (kf_id i = 1; i < f->body->nnodes; i++)
        if (!strcmp(f->body->nodes[i].op_type, "LeakyRelu")) f->body->nodes[i].attrs[0].ref_attr_name = strdup("a");
    f->attrs = calloc(1, sizeof(char *));
    f->attrs[0] = strdup("a");
    f->nattrs = 1;
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "y = Leaky(x) {a=0.3}\n"
                           "output y\n");
    set_domain(m, "Leaky", "t");
    cr_assert_eq(kf_model_add_function(m, f), KF_OK);
    cr_assert_null(kf_eval_unsupported_reason(m), "%s", kf_eval_unsupported_reason(m));
    kf_model *ref = gt_parse("input x float[2, 3]\n"
                             "y = LeakyRelu(x) {alpha=0.3}\n"
                             "output y\n");
    gt_expect_same_outputs(ref, m, 0, 0);
    /* and it survives the ONNX round trip (ref_attr_name and attribute list) */
    kf_model *c = gt_copy(m);
    cr_assert_eq(c->nfuncs, 1);
    cr_assert_eq(c->funcs[0]->nattrs, 1);
    gt_expect_same_outputs(ref, c, 0, 0);
    /* a caller that does not set it gets the op's default (alpha 0.01) */
    kf_model *ref2 = gt_parse("input x float[2, 3]\n"
                              "y = LeakyRelu(x)\n"
                              "output y\n");
    for (kf_id i = 1; i < c->graph->nnodes; i++)
        if (!strcmp(c->graph->nodes[i].op_type, "Leaky")) c->graph->nodes[i].nattrs = 0; /* attrs freed by slot */
    gt_expect_same_outputs(ref2, c, 0, 0);
    for (kf_id i = 1; i < c->graph->nnodes; i++)
        if (!strcmp(c->graph->nodes[i].op_type, "Leaky")) c->graph->nodes[i].nattrs = 1;
    kf_model_free(m);
    kf_model_free(ref);
    kf_model_free(ref2);
    kf_model_free(c);
}

Test(fuseout_eval, nested_calls_run) {
    /* fuse once, then group the call with the next node and fuse again */
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5", "Mul_6")}), 1);
    kf_model *f = fused_copy(m, p, NULL);
    kf_fuse_simple_plan_free(p);
    p = hand_plan_rest(f, G((const char *const *const[]){ROW("group_0", "Add_7")}), 1);
    kf_model *ff = fused_copy(f, p, NULL);
    cr_assert_eq(ff->nfuncs, 2);
    const kf_function *outer = kf_model_function(ff, "ai.kfuse", "group_0_2");
    cr_assert(outer, "the second fuse's group_0 gets a fresh name");
    bool calls_inner = false;
    for (kf_id i = 1; i < outer->body->nnodes; i++) calls_inner |= !strcmp(outer->body->nodes[i].op_type, "group_0");
    cr_assert(calls_inner);
    gt_expect_same_outputs(m, ff, 1e-5, 1e-4);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    kf_model_free(f);
    kf_model_free(ff);
}

Test(fuseout_eval, recursion_is_refused_with_a_reason) {
    kf_function *f = fn_from_text("t", "Loop1", "input x float[2]\n"
                                                "y = Loop1(x)\n"
                                                "output y\n");
    for (kf_id i = 1; i < f->body->nnodes; i++) {
        free(f->body->nodes[i].domain);
        f->body->nodes[i].domain = strdup("t");
    }
    kf_model *m = gt_parse("input x float[2]\n"
                           "y = Loop1(x)\n"
                           "output y\n");
    set_domain(m, "Loop1", "t");
    cr_assert_eq(kf_model_add_function(m, f), KF_OK);
    const char *why = kf_eval_unsupported_reason(m);
    cr_assert(why && strstr(why, "nested deeper"), "%s", why ? why : "(none)");
    kf_tensor in = tu_rand(KF_DT_FLOAT, 1, (int64_t[]){2}, -1, 1), out = {0};
    cr_assert_eq(kf_eval_model(m, &in, 1, &out, NULL), KF_ERR_UNSUPPORTED);
    kf_tensor_release(&in);
    kf_model_free(m);
}

Test(fuseout_eval, unsupported_op_in_a_body_is_named) {
    kf_function *f = fn_from_text("t", "F", "input x float[2]\n"
                                            "y = NoSuchOp(x)\n"
                                            "output y\n");
    kf_model *m = gt_parse("input x float[2]\n"
                           "y = F(x)\n"
                           "output y\n");
    set_domain(m, "F", "t");
    cr_assert_eq(kf_model_add_function(m, f), KF_OK);
    const char *why = kf_eval_unsupported_reason(m);
    cr_assert(why && strstr(why, "NoSuchOp") && strstr(why, "t::F"), "%s", why ? why : "(none)");
    kf_model_free(m);
}

Test(fuseout_eval, function_defined_twice_is_refused) {
    kf_model *m = gt_parse(CHAIN);
    cr_assert_eq(kf_model_add_function(m, kf_function_new("t", "F")), KF_OK);
    cr_assert_eq(kf_model_add_function(m, kf_function_new("t", "F")), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "t::F"), "%s", kf_last_error());
    kf_model_free(m);
}

/* ---- reports ---------------------------------------------------------------------------- */

static char *capture(void (*fn)(FILE *, const kf_model *, const kf_plan *, const void *), const kf_model *m,
                     const kf_plan *p, const void *arg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fn(f, m, p, arg);
    fclose(f);
    return buf;
}

static void json_fn(FILE *f, const kf_model *m, const kf_plan *p, const void *s) { kf_fuse_write_json(f, m, p, s); }
static void report_fn(FILE *f, const kf_model *m, const kf_plan *p, const void *s) {
    (void)s;
    kf_fuse_write_report(f, m, p);
}

Test(fuseout_report, json_table_and_dot_show_groups_and_reasons) {
    kf_model *m = gt_parse(CHAIN);
    kf_plan *p = hand_plan_rest(m, G((const char *const *const[]){ROW("Add_4", "Sigmoid_5", "Mul_6", "Add_7")}), 1);
    p->bounds = calloc(3, sizeof(kf_boundary));
    kf_id t = kf_graph_find(m->graph, "t");
    p->bounds[0] = (kf_boundary){0, 1, t, "consumer is injective"};
    p->bounds[1] = (kf_boundary){0, 1, t, "reason b"};
    p->bounds[2] = (kf_boundary){0, 1, t, "consumer is injective"};
    p->nbounds = 3;
    p->bytes_unfused = 1000;
    p->bytes_fused = 400;
    p->bytes_lower_bound = 300;
    kf_fuse_summary s = {7, 5, 1, 4096, 3072};
    char *j = capture(json_fn, m, p, &s);
    static const char *const keys[] = {"\"nodes_before\": 7", "\"nodes_after\": 5", "\"kernels\": 2",
                                       "\"modeled_bytes_before\": 1000", "\"modeled_bytes_after\": 400",
                                       "\"modeled_bytes_lower_bound\": 300", "\"arena_bytes\": 4096",
                                       "\"arena_lower_bound\": 3072",
                                       "\"ops\": [\"Add\", \"Sigmoid\", \"Mul\", \"Add\"]",
                                       "\"inputs\": [", "\"outputs\": [", "\"bytes_read\": -1",
                                       "{\"from\": 0, \"to\": 1, \"value\": \"t\", \"reason\": \"reason b\"}"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) cr_assert(strstr(j, keys[k]), "missing %s in %s", keys[k], j);
    char *r = capture(report_fn, m, p, NULL);
    char *inj = strstr(r, "2  consumer is injective"), *rb = strstr(r, "1  reason b");
    cr_assert(inj && rb && inj < rb, "reasons aggregated, most frequent first:\n%s", r);
    cr_assert(strstr(r, "Add Sigmoid Mul Add"), "%s", r);
    char path[] = "/tmp/kfuse_fuseout_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    bool svg;
    cr_assert_eq(kf_fuse_write_dot(path, m, p, &svg), KF_OK, "%s", kf_last_error());
    uint8_t *d;
    size_t dl;
    cr_assert_eq(kf_read_file(path, &d, &dl), KF_OK);
    char *dt = strndup((char *)d, dl);
    cr_assert(strstr(dt, "subgraph cluster_0") && strstr(dt, "subgraph cluster_1"), "%s", dt);
    cr_assert(strstr(dt, "fillcolor=lightblue") && strstr(dt, "label=\"t\""), "%s", dt);
    unlink(path);
    if (svg) {
        char sp[64];
        snprintf(sp, sizeof sp, "%s.svg", path);
        unlink(sp);
    }
    free(dt);
    free(d);
    free(j);
    free(r);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
}

/* ---- acceptance over real models ------------------------------------------------------------- */

typedef struct tally {
    int checked, unsupported, failed, fused_models;
    uint64_t functions, nodes_after_opt, nodes_after_fuse;
    char first[1536];
} tally;

static void note(tally *t, const char *fmt, const char *a, const char *b) {
    if (!t->failed++) snprintf(t->first, sizeof t->first, fmt, a, b);
}

/* Fuses the model at path (optimized first) and writes the result to
 * save_to when not NULL. Returns the fused model read back from ONNX, or
 * NULL (reason noted). */
static kf_model *fuse_file(const char *path, tally *t, const char *save_to) {
    kf_model *o;
    if (kf_model_load(path, &o) != KF_OK) return NULL;
    kf_opt_options opts;
    kf_opt_options_default(&opts);
    opts.fuel = -1;
    kf_opt_result res;
    kf_status st = kf_optimize(o, &opts, &res);
    kf_rules_free(&res.rules);
    if (st) {
        note(t, "%s: optimize: %s", path, kf_last_error());
        kf_model_free(o);
        return NULL;
    }
    t->nodes_after_opt += kf_graph_live_nodes(o->graph);
    kf_plan *p;
    kf_fuse_stats fs;
    if ((st = test_plan(o, &p)) == KF_OK) {
        st = kf_fuse_apply(o, p, &fs);
        test_plan_free(p);
    }
    if (st) {
        note(t, "%s: fuse: %s", path, kf_last_error());
        kf_model_free(o);
        return NULL;
    }
    t->functions += fs.functions;
    t->fused_models += fs.functions > 0;
    t->nodes_after_fuse += fs.nodes_after;
    void *buf;
    size_t len;
    kf_model *rt = NULL;
    if (kf_model_save_memory(o, &buf, &len) != KF_OK || kf_model_load_memory(buf, len, NULL, &rt) != KF_OK) {
        note(t, "%s: fused model does not round trip: %s", path, kf_last_error());
        rt = NULL;
    } else if (save_to) {
        FILE *f = fopen(save_to, "wb");
        if (f) {
            fwrite(buf, 1, len, f);
            fclose(f);
        }
    }
    if (buf) free(buf);
    kf_model_free(o);
    return rt;
}

static void check_model(const char *path, const char *data_dir, tally *t) {
    kf_model *m;
    if (kf_model_load(path, &m) != KF_OK) return;
    if (kf_eval_unsupported_reason(m)) {
        t->unsupported++;
        kf_model_free(m);
        return;
    }
    kf_model *o = fuse_file(path, t, NULL);
    if (!o) {
        kf_model_free(m);
        return;
    }
    kf_id *real;
    uint32_t nreal;
    cr_assert_eq(kf_graph_real_inputs(m->graph, &real, &nreal), KF_OK);
    kf_tensor *ins = calloc(nreal + 1, sizeof(kf_tensor));
    uint32_t nout = m->graph->noutputs;
    kf_tensor *a = calloc(nout + 1, sizeof(kf_tensor)), *b = calloc(nout + 1, sizeof(kf_tensor));
    bool have = true;
    if (data_dir) {
        have = gt_load_dataset_inputs(m, data_dir, ins, nreal, real);
    } else {
        for (uint32_t i = 0; i < nreal && have; i++) {
            const kf_type *ty = &m->graph->values[real[i]].type;
            if (ty->rank < 0 || !ty->dtype) have = false;
            int64_t dims[KF_MAX_RANK];
            for (int d = 0; have && d < ty->rank; d++) dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : 2;
            if (have)
                ins[i] = tu_rand(ty->dtype, ty->rank, dims, kf_dtype_is_float(ty->dtype) ? -2 : 0, 2);
        }
    }
    if (have && kf_eval_model(m, ins, (int)nreal, a, NULL) == KF_OK) {
        t->checked++;
        if (o->graph->noutputs != nout) {
            note(t, "%s: output count changed%s", path, "");
        } else if (kf_eval_model(o, ins, (int)nreal, b, NULL) != KF_OK) {
            note(t, "%s: fused model fails: %s", path, kf_last_error());
        } else {
            for (uint32_t k = 0; k < nout; k++) {
                double atol, rtol;
                kf_run_tolerance(a[k].dtype, &atol, &rtol);
                char why[512];
                if (!tu_close(&b[k], &a[k], atol, rtol, why, sizeof why)) {
                    note(t, "%s: fused output differs: %s", path, why);
                    break;
                }
            }
        }
    }
    for (uint32_t i = 0; i < nreal; i++) kf_tensor_release(&ins[i]);
    for (uint32_t k = 0; k < nout; k++) {
        kf_tensor_release(&a[k]);
        kf_tensor_release(&b[k]);
    }
    free(ins);
    free(a);
    free(b);
    free(real);
    kf_model_free(m);
    kf_model_free(o);
}

static void testdata_all(bool stand_in) {
    use_stand_in = stand_in;
    static const char *const suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
    tally t = {0};
    int seen = 0;
    for (size_t s = 0; s < 4; s++) {
        char base[512];
        snprintf(base, sizeof base, "%s/%s", TESTDATA, suites[s]);
        DIR *d = opendir(base);
        if (!d) cr_skip_test("Debian's libonnx-testdata is not installed (%s)", base);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char model[1200], data[1200];
            snprintf(model, sizeof model, "%s/%s/model.onnx", base, e->d_name);
            snprintf(data, sizeof data, "%s/%s/test_data_set_0", base, e->d_name);
            check_model(model, data, &t);
            seen++;
        }
        closedir(d);
    }
    cr_log_info("fuse (%s) over the test data: %d models, %d checked, %d unsupported, %d with functions (%llu), "
                "nodes %llu after opt -> %llu after fuse",
                stand_in ? "stand-in plan" : "planner", seen, t.checked, t.unsupported, t.fused_models, (unsigned long long)t.functions,
                (unsigned long long)t.nodes_after_opt, (unsigned long long)t.nodes_after_fuse);
    cr_assert_gt(t.checked, 700);
    cr_assert_gt(t.fused_models, 100, "the plan fuses something in many models (%d)", t.fused_models);
    cr_assert_eq(t.failed, 0, "%d models differ after fusing; first: %s", t.failed, t.first);
}

Test(fuseout_models, testdata_fused_outputs_equal_original, .timeout = 600) { testdata_all(false); }
Test(fuseout_models, testdata_stand_in_plan_outputs_equal_original, .timeout = 600) { testdata_all(true); }

static void check_found(const char *model, const char *data_dir, void *user) { check_model(model, data_dir, user); }

static void shared_all(bool stand_in) {
    use_stand_in = stand_in;
    DIR *d = opendir(SHARED_MODELS);
    if (!d) cr_skip_test("../shared/models is not beside the repository (%s)", SHARED_MODELS);
    closedir(d);
    tally t = {0};
    int seen = 0;
    seen = gt_walk_models(SHARED_MODELS, check_found, &t);
    cr_log_info("fuse (%s) over shared models: %d models, %d checked, %d with functions (%llu), nodes %llu after "
                "opt -> %llu after fuse",
                stand_in ? "stand-in plan" : "planner", seen, t.checked, t.fused_models,
                (unsigned long long)t.functions, (unsigned long long)t.nodes_after_opt,
                (unsigned long long)t.nodes_after_fuse);
    cr_assert_eq(t.failed, 0, "%s", t.first);
    cr_assert_geq(t.checked, 20, "most shared models run on the reference evaluator (%d of %d)", t.checked, seen);
    cr_assert_gt(t.fused_models, 5);
}

Test(fuseout_models, shared_models_fused_outputs_equal_original, .timeout = 600) { shared_all(false); }
Test(fuseout_models, shared_models_stand_in_plan_outputs_equal_original, .timeout = 600) { shared_all(true); }

/* ONNX's own checker on a few fused files (full check: types through the
 * functions). Skips with the reason when python3 or onnx is missing. */
Test(fuseout_models, onnx_checker_accepts_fused_files, .timeout = 300) {
    if (system("python3 -c 'import onnx' >/dev/null 2>&1") != 0)
        cr_skip_test("python3 with the onnx package is not available");
    static const char *const models[] = {
        "node/test_layer_normalization_4d_axis0_expanded", "node/test_softmax_axis_0_expanded",
        "pytorch-converted/test_ConvTranspose2d", "pytorch-operator/test_operator_add_broadcast",
        "node/test_gemm_all_attributes", "simple/test_expand_shape_model1"};
    char dir[] = "/tmp/kfuse_fuseout_chk_XXXXXX";
    cr_assert(mkdtemp(dir));
    tally t = {0};
    char list[4096] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char in[600], out[600];
        snprintf(in, sizeof in, "%s/%s/model.onnx", TESTDATA, models[i]);
        if (access(in, R_OK)) continue;
        snprintf(out, sizeof out, "%s/m%zu.onnx", dir, i);
        kf_model *f = fuse_file(in, &t, out);
        if (!f) continue;
        kf_model_free(f);
        strncat(list, " ", sizeof list - strlen(list) - 1);
        strncat(list, out, sizeof list - strlen(list) - 1);
        n++;
    }
    cr_assert_eq(t.failed, 0, "%s", t.first);
    if (!n) cr_skip_test("none of the sample models is installed");
    cr_assert_gt(t.functions, 2, "the sample writes functions (%llu)", (unsigned long long)t.functions);
    char cmd[5000];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys, onnx\n"
             "for p in sys.argv[1:]:\n"
             "    onnx.checker.check_model(onnx.load(p), full_check=True)\n'%s",
             list);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "onnx.checker rejected a fused file (see stderr)");
}
