/*
 * test_capture.c: values of the enclosing graph that If branches, Loop and
 * Scan bodies read by name (graph/onnx_scope.c, kf_node.ncap). Each model
 * reads an initializer and node outputs only from inside its bodies (one
 * through a nested If); after load -> kfuse opt -> kfuse fuse -> save ->
 * load, every captured value must still exist, be produced before the node
 * that owns the body, and keep its use. CSE and Identity removal redirect
 * captured slots, so the saved bodies must name the surviving values. A
 * body naming a value nobody defines is a load error naming the node and
 * the value. ONNX Runtime checks the same models numerically, and judges
 * kfuse run (ref, and opencl where available) on the originals
 * (tests/capture_check.py, test capture.onnxruntime_runs_saved_models).
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "body_util.h"
#include "kf_fuse.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_plan.h"
#include "test_util.h"

/* ---- models with bodies ---------------------------------------------------- */

/* If: t1 = x*w is read by the then-branch through Identity (ti) and a
 * nested If that also reads the initializer k; t2 = x*w (CSE folds it into
 * t1) is read by the else-branch only. The If comes first in the file, so
 * export has to move the producers of what it captures before it. */
static Onnx__ModelProto *if_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[2, 3]\n"
                                    "input c bool[]\n"
                                    "const w float[2, 3] = random\n"
                                    "const k float[2, 3] = random\n"
                                    "y = If(c)\n"
                                    "t1 = Mul(x, w)\n"
                                    "t2 = Mul(x, w)\n"
                                    "ti = Identity(t1)\n"
                                    "r = Relu(t1)\n"
                                    "s = Sigmoid(r)\n"
                                    "z = Add(y, s)\n"
                                    "keep = Neg(k)\n"
                                    "output z\n");
    bu_drop_node(mp->graph, "Neg");
    static const char *const inner_outer[] = {"ti", "k"};
    Onnx__GraphProto *inner_then = bu_body("input ti float[2, 3]\ninput k float[2, 3]\na = Add(ti, k)\noutput a\n",
                                        inner_outer, 2);
    Onnx__GraphProto *inner_else = bu_body("input ti float[2, 3]\ninput k float[2, 3]\nb = Sub(ti, k)\noutput b\n",
                                        inner_outer, 2);
    static const char *const then_outer[] = {"c"};
    Onnx__GraphProto *then_b = bu_body("input c bool[]\nyt = If(c)\noutput yt\n", then_outer, 1);
    bu_attach(bu_node(then_b, "If"), "then_branch", inner_then);
    bu_attach(bu_node(then_b, "If"), "else_branch", inner_else);
    static const char *const else_outer[] = {"t2", "x"};
    Onnx__GraphProto *else_b = bu_body("input t2 float[2, 3]\ninput x float[2, 3]\nye = Mul(t2, x)\noutput ye\n",
                                    else_outer, 2);
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch", then_b);
    bu_attach(n, "else_branch", else_b);
    return mp;
}

/* Loop: v += t each iteration, t = x*w read only by the body; the trip
 * count and the loop-carried start value come from the graph. */
static Onnx__ModelProto *loop_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[2, 3]\n"
                                    "input trip int64[]\n"
                                    "input c bool[]\n"
                                    "const w float[2, 3] = random\n"
                                    "const k float[2, 3] = random\n"
                                    "v = Loop(trip, c, x)\n"
                                    "t = Mul(x, w)\n"
                                    "z = Relu(v)\n"
                                    "keep = Neg(k)\n"
                                    "output z\n");
    bu_drop_node(mp->graph, "Neg");
    static const char *const outer[] = {"t", "k"};
    Onnx__GraphProto *b = bu_body("input i int64[]\ninput cin bool[]\ninput v float[2, 3]\n"
                               "input t float[2, 3]\ninput k float[2, 3]\n"
                               "cout = Identity(cin)\nu = Add(v, t)\nv2 = Mul(u, k)\noutput cout, v2\n",
                               outer, 2);
    bu_attach(bu_node(mp->graph, "Loop"), "body", b);
    return mp;
}

/* Scan over the rows of x: state s += row * t, t = x*w read only by the
 * body (and a Relu of t in the graph, which fusion may take). */
static Onnx__ModelProto *scan_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[4, 3]\n"
                                    "input s0 float[3]\n"
                                    "const w float[3] = random\n"
                                    "s, ys = Scan(s0, x)\n"
                                    "t = Mul(s0, w)\n"
                                    "tr = Relu(t)\n"
                                    "z = Add(s, tr)\n"
                                    "output z, ys\n");
    static const char *const outer[] = {"t"};
    Onnx__GraphProto *b = bu_body("input s float[3]\ninput row float[3]\ninput t float[3]\n"
                               "p = Mul(row, t)\ns2 = Add(s, p)\ny = Identity(s2)\noutput s2, y\n",
                               outer, 1);
    Onnx__NodeProto *n = bu_node(mp->graph, "Scan");
    bu_attach(n, "body", b);
    bu_attach_int(n, "num_scan_inputs", 1);
    return mp;
}

/* ---- the checks --------------------------------------------------------------- */

static kf_id find_op(const kf_model *m, const char *op_type) {
    const kf_graph *g = m->graph;
    for (kf_id i = 1; i < g->nnodes; i++)
        if (!g->nodes[i].dead && !strcmp(g->nodes[i].op_type, op_type)) return i;
    return 0;
}

/* The node owning the bodies captures `want` (names) and nothing is lost:
 * each captured value is an input, an initializer, or the output of a node
 * that comes earlier in the file when `saved` (a graph read back keeps the
 * file's order; the test models put the body's owner first on purpose). */
static void check_captures(const kf_model *m, const char *op_type, const char *const *want, int nwant, bool saved) {
    const kf_graph *g = m->graph;
    kf_id n = find_op(m, op_type);
    cr_assert(n, "no %s node left", op_type);
    const kf_node *nd = kf_node_at(g, n);
    cr_assert_geq(nd->ncap, nwant, "%s captures %d values, expected at least %d", op_type, nd->ncap, nwant);
    for (int w = 0; w < nwant; w++) {
        bool found = false;
        for (int k = 0; k < nd->ncap; k++) found = found || !strcmp(nd->capname[k], want[w]);
        cr_assert(found, "%s does not capture '%s'", op_type, want[w]);
    }
    for (int k = 0; k < nd->ncap; k++) {
        kf_id v = nd->in[nd->nin - nd->ncap + k];
        const kf_value *val = kf_value_at(g, v);
        cr_assert_str_eq(val->name, nd->capname[k]);
        cr_assert(val->init || val->is_input || (val->producer && (!saved || val->producer < n)),
                  "captured '%s' is not defined before %s", val->name, op_type);
        bool user = false;
        for (uint32_t u = 0; u < val->nusers; u++) user = user || val->users[u] == n;
        cr_assert(user, "%s is not a user of captured '%s'", op_type, val->name);
    }
}

/* load -> opt -> fuse -> save -> load. *opt_out (may be NULL) receives the
 * optimized model before fusion (caller frees). */
static kf_model *pipeline(const Onnx__ModelProto *mp, kf_model **opt_out) {
    kf_model *m = bu_load(mp);
    kf_opt_options opts;
    kf_opt_options_default(&opts);
    opts.fuel = -1;
    kf_opt_result res;
    kf_status st = kf_optimize(m, &opts, &res);
    kf_rules_free(&res.rules);
    cr_assert_eq(st, KF_OK, "optimize: %s", kf_last_error());
    if (opt_out) *opt_out = gt_copy(m);
    kf_plan_options po;
    kf_plan_options_default(&po);
    po.target = NULL;
    kf_plan *built, *p;
    cr_assert_eq(kf_plan_build(m, &po, &built), KF_OK, "plan: %s", kf_last_error());
    cr_assert_eq(kf_fuse_plan_copy(m, built, &p), KF_OK, "%s", kf_last_error());
    kf_plan_free(built);
    cr_assert_eq(kf_fuse_apply(m, p, NULL), KF_OK, "fuse: %s", kf_last_error());
    kf_fuse_simple_plan_free(p);
    void *b;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &b, &len), KF_OK, "save: %s", kf_last_error());
    kf_model_free(m);
    kf_model *r = NULL;
    st = kf_model_load_memory(b, len, NULL, &r);
    free(b);
    cr_assert_eq(st, KF_OK, "the saved model does not load: %s", kf_last_error());
    return r;
}

Test(capture, if_bodies_keep_outer_values_through_opt_and_fuse) {
    Onnx__ModelProto *mp = if_model();
    kf_model *m = bu_load(mp);
    static const char *const want[] = {"ti", "k", "t2", "x", "c"};
    check_captures(m, "If", want, 5, false);
    kf_model_free(m);
    kf_model *o;
    kf_model *r = pipeline(mp, &o);
    /* CSE merged t2 into t1 and Identity removal replaced ti by t1: the
     * bodies now read t1 (and still k, x, c) */
    cr_assert_eq(gt_count(o, "Mul"), 1, "CSE should leave one Mul");
    cr_assert_eq(gt_count(o, "Identity"), 0, "Identity should be gone");
    kf_model_free(o);
    static const char *const after[] = {"t1", "k", "x", "c"};
    check_captures(r, "If", after, 4, true);
    kf_id k = kf_graph_find(r->graph, "k");
    cr_assert(k && r->graph->values[k].init, "initializer k (read only inside a nested branch) was dropped");
    kf_model_free(r);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(capture, loop_body_keeps_outer_values_through_opt_and_fuse) {
    Onnx__ModelProto *mp = loop_model();
    kf_model *r = pipeline(mp, NULL);
    static const char *const want[] = {"t", "k"};
    check_captures(r, "Loop", want, 2, true);
    kf_model_free(r);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(capture, scan_body_keeps_outer_values_through_opt_and_fuse) {
    Onnx__ModelProto *mp = scan_model();
    kf_model *r = pipeline(mp, NULL);
    static const char *const want[] = {"t"};
    check_captures(r, "Scan", want, 1, true);
    /* t also feeds Relu, which fusion may put in a group with the Mul: t
     * must still be written for the Scan */
    kf_id t = kf_graph_find(r->graph, "t");
    cr_assert(t && r->graph->values[t].producer, "captured t is no longer computed");
    kf_model_free(r);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(capture, dce_keeps_a_value_only_a_body_reads) {
    Onnx__ModelProto *mp = loop_model();
    kf_model *m = bu_load(mp);
    uint32_t before = kf_graph_live_nodes(m->graph), removed = 0;
    cr_assert_eq(kf_graph_dce(m->graph, &removed), KF_OK);
    cr_assert_eq(removed, 0, "DCE removed %u nodes of %u", removed, before);
    cr_assert(find_op(m, "Mul"), "the Mul only the Loop body reads was removed");
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(capture, redirected_capture_is_renamed_inside_nested_bodies) {
    Onnx__ModelProto *mp = if_model();
    kf_model *m = bu_load(mp);
    kf_graph *g = m->graph;
    kf_id ti = kf_graph_find(g, "ti"), t1 = kf_graph_find(g, "t1");
    cr_assert_eq(kf_graph_replace_uses(g, ti, t1), KF_OK, "%s", kf_last_error());
    void *b;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &b, &len), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
    Onnx__ModelProto *saved = onnx__model_proto__unpack(NULL, len, b);
    cr_assert(saved);
    /* the nested If's branches read t1 now, and no body names ti */
    Onnx__GraphProto *then_b = NULL;
    Onnx__NodeProto *n = bu_node(saved->graph, "If");
    for (size_t i = 0; i < n->n_attribute; i++)
        if (!strcmp(n->attribute[i]->name, "then_branch")) then_b = n->attribute[i]->g;
    cr_assert(then_b);
    Onnx__NodeProto *inner = bu_node(then_b, "If");
    for (size_t i = 0; i < inner->n_attribute; i++) {
        Onnx__NodeProto *op = inner->attribute[i]->g->node[0];
        cr_assert_str_eq(op->input[0], "t1", "nested body reads '%s'", op->input[0]);
    }
    onnx__model_proto__free_unpacked(saved, NULL);
    kf_model *r = NULL;
    kf_status st = kf_model_load_memory(b, len, NULL, &r);
    free(b);
    cr_assert_eq(st, KF_OK, "%s", kf_last_error());
    kf_model_free(r);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(capture, body_reading_an_undefined_name_is_a_load_error) {
    Onnx__ModelProto *mp = loop_model();
    Onnx__GraphProto *b = bu_node(mp->graph, "Loop")->attribute[0]->g;
    Onnx__NodeProto *add = bu_node(b, "Add");
    free(add->input[1]);
    add->input[1] = strdup("nowhere");
    size_t len;
    void *buf = bu_pack(mp, &len);
    kf_model *m = NULL;
    kf_status st = kf_model_load_memory(buf, len, NULL, &m);
    free(buf);
    cr_assert_eq(st, KF_ERR_BAD_MODEL, "expected a load error, got %d", st);
    const char *e = kf_last_error();
    cr_assert(strstr(e, "nowhere") && strstr(e, "Loop"), "error does not name the node and value: %s", e);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- ONNX Runtime on the saved files ------------------------------------------- */

static const char *python_with_ort(void) {
    static char venv[PATH_MAX];
    snprintf(venv, sizeof venv, "%s/bench/.venv/bin/python", KF_SOURCE_DIR);
    const char *cands[2] = {venv, "python3"};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && access(venv, X_OK) != 0) continue;
        char cmd[PATH_MAX + 96];
        snprintf(cmd, sizeof cmd, "%s -c 'import onnxruntime, onnx, numpy' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) return cands[i];
    }
    return NULL;
}

Test(capture, onnxruntime_runs_saved_models, .timeout = 300) {
    const char *py = python_with_ort();
    if (!py) cr_skip_test("no python with onnxruntime (bench/.venv after bench/setup_venv.sh, or python3 -m pip install onnxruntime)");
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(n > 0);
    self[n] = 0;
    *strrchr(self, '/') = 0;
    char kfuse[PATH_MAX + 32];
    snprintf(kfuse, sizeof kfuse, "%s/../tools/kfuse", self);
    if (access(kfuse, X_OK) != 0) cr_skip_test("the kfuse binary is not built beside the tests");
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s %s/tests/capture_check.py --kfuse %s --seed %llu 2>&1", py, KF_SOURCE_DIR, kfuse,
             (unsigned long long)tu_seed());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, p)) {
        fputs(line, stderr);
        if (line[0] && line[0] != '\n') snprintf(last, sizeof last, "%s", line);
    }
    int rc = pclose(p);
    cr_assert_eq(rc, 0, "capture_check.py failed: %s", last);
    cr_assert(strstr(last, " 0 failed") != NULL, "expected a summary with 0 failed, got: %s", last);
}
