/*
 * test_control.c: If, Loop and Scan on the reference evaluator
 * (graph/ops_control.c): each model's bodies read values of the graphs
 * around them, and each result is checked against the same computation
 * written as a plain C loop here, on random inputs. Also: shapes inferred
 * through bodies, nested control flow, typed errors naming the node, load
 * errors for bodies that do not fit their node, `kfuse opt` keeping the
 * outputs (and optimizing the bodies), and the OpenCL backend running the
 * control flow on the host with each body as a compiled plan.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "body_util.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_precision.h"
#include "kf_run.h"
#include "test_util.h"

#define ATOL 1e-5
#define RTOL 1e-5

static const float *f32(const kf_tensor *t) { return (const float *)t->data; }

/* Runs m on ins[0..nin); outputs into out (m's output count). */
static kf_status run(const kf_model *m, const kf_tensor *ins, int nin, kf_tensor *out) {
    return kf_eval_model(m, ins, nin, out, NULL);
}

static void expect_close(const kf_tensor *got, const kf_tensor *want, const char *what) {
    char why[512];
    cr_assert(tu_close(got, want, ATOL, RTOL, why, sizeof why), "%s: %s", what, why);
}

static void release(kf_tensor *t, int n) {
    for (int i = 0; i < n; i++) kf_tensor_release(&t[i]);
}

/* ---- the models ------------------------------------------------------------ */

/* y = If(sum(x) > 0) then x*w else x-w; both branches read x and the
 * initializer w of the main graph. */
static Onnx__ModelProto *if_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[2, 3]\n"
                                    "const w float[2, 3] = random\n"
                                    "const zero float[] = 0\n"
                                    "s = ReduceSum(x) {keepdims=0}\n"
                                    "c = Greater(s, zero)\n"
                                    "y = If(c)\n"
                                    "keep = Neg(w)\n"
                                    "output y\n");
    bu_drop_node(mp->graph, "Neg"); /* it kept w written; only the branches read it */
    static const char *const outer[] = {"x", "w"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch",
              bu_body("input x float[2, 3]\ninput w float[2, 3]\nt = Mul(x, w)\noutput t\n", outer, 2));
    bu_attach(n, "else_branch",
              bu_body("input x float[2, 3]\ninput w float[2, 3]\ne = Sub(x, w)\noutput e\n", outer, 2));
    return mp;
}

/* acc, ys = Loop(trip, "", a0): acc += i*x, ys[i] = i*x; x is read from
 * the main graph. trip_text: "input trip int64[]" or a constant. */
static Onnx__ModelProto *loop_sum_model(const char *trip_text) {
    char text[512];
    snprintf(text, sizeof text,
             "opset 13\n"
             "input x float[3]\n"
             "input a0 float[3]\n"
             "%s\n"
             "acc, ys = Loop(trip, , a0)\n"
             "output acc, ys\n",
             trip_text);
    Onnx__ModelProto *mp = bu_proto(text);
    static const char *const outer[] = {"x"};
    bu_attach(bu_node(mp->graph, "Loop"), "body",
              bu_body("input i int64[]\ninput cin bool[]\ninput acc float[3]\ninput x float[3]\n"
                      "fi = Cast(i) {to=1}\np = Mul(fi, x)\nacc2 = Add(acc, p)\ncout = Identity(cin)\n"
                      "output cout, acc2, p\n",
                      outer, 1));
    return mp;
}

/* A while loop: v doubles while v < limit (limit read from the main
 * graph); its iteration numbers come out as a scan output. */
static Onnx__ModelProto *while_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input c0 bool[]\n"
                                    "input v0 float[]\n"
                                    "input limit float[]\n"
                                    "v, its = Loop(, c0, v0)\n"
                                    "output v, its\n");
    static const char *const outer[] = {"limit"};
    bu_attach(bu_node(mp->graph, "Loop"), "body",
              bu_body("input i int64[]\ninput cin bool[]\ninput v float[]\ninput limit float[]\n"
                      "const two float[] = 2\n"
                      "v2 = Mul(v, two)\ncout = Less(v2, limit)\nii = Identity(i)\n"
                      "output cout, v2, ii\n",
                      outer, 1));
    return mp;
}

/* A Loop whose body holds an If: even iterations add x, odd ones multiply
 * by x. The branches read acc (a body input) and x (the main graph's). */
static Onnx__ModelProto *nested_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[4]\n"
                                    "input a0 float[4]\n"
                                    "const trip int64[] = 5\n"
                                    "acc = Loop(trip, , a0)\n"
                                    "output acc\n");
    static const char *const body_outer[] = {"x"};
    Onnx__GraphProto *b = bu_body("input i int64[]\ninput cin bool[]\ninput acc float[4]\ninput x float[4]\n"
                                  "const two int64[] = 2\nconst zero int64[] = 0\n"
                                  "r = Mod(i, two)\ne = Equal(r, zero)\na2 = If(e)\ncout = Identity(cin)\n"
                                  "output cout, a2\n",
                                  body_outer, 1);
    static const char *const if_outer[] = {"acc", "x"};
    Onnx__NodeProto *n = bu_node(b, "If");
    bu_attach(n, "then_branch",
              bu_body("input acc float[4]\ninput x float[4]\nt = Add(acc, x)\noutput t\n", if_outer, 2));
    bu_attach(n, "else_branch",
              bu_body("input acc float[4]\ninput x float[4]\ne = Mul(acc, x)\noutput e\n", if_outer, 2));
    bu_attach(bu_node(mp->graph, "Loop"), "body", b);
    return mp;
}

/* Scan over the rows of X backwards: s += row, y = s*w (w read from the
 * main graph), the y stacked along output axis 1. */
static Onnx__ModelProto *scan_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 16\n"
                                    "input s0 float[3]\n"
                                    "input X float[4, 3]\n"
                                    "const w float[3] = random\n"
                                    "s, Y = Scan(s0, X)\n"
                                    "keep = Neg(w)\n"
                                    "output s, Y\n");
    bu_drop_node(mp->graph, "Neg");
    static const char *const outer[] = {"w"};
    Onnx__NodeProto *n = bu_node(mp->graph, "Scan");
    bu_attach(n, "body",
              bu_body("input s float[3]\ninput row float[3]\ninput w float[3]\n"
                      "s2 = Add(s, row)\ny = Mul(s2, w)\noutput s2, y\n",
                      outer, 1));
    bu_attach_int(n, "num_scan_inputs", 1);
    static const int64_t one[] = {1};
    bu_attach_ints(n, "scan_input_directions", 1, one);
    bu_attach_ints(n, "scan_output_axes", 1, one);
    return mp;
}

/* Scan-8: a batch of 2 sequences of 4 rows, the second only 2 long. */
static Onnx__ModelProto *scan8_model(void) {
    Onnx__ModelProto *mp = bu_proto("opset 8\n"
                                    "input lens int64[2]\n"
                                    "input s0 float[2, 3]\n"
                                    "input X float[2, 4, 3]\n"
                                    "s, Y = Scan(lens, s0, X)\n"
                                    "output s, Y\n");
    Onnx__NodeProto *n = bu_node(mp->graph, "Scan");
    bu_attach(n, "body", bu_body("input s float[3]\ninput x float[3]\ns2 = Add(s, x)\ny = Identity(s2)\noutput s2, y\n",
                                 NULL, 0));
    bu_attach_int(n, "num_scan_inputs", 1);
    return mp;
}

static const kf_tensor *init_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].init, "no initializer %s", name);
    return m->graph->values[v].init;
}

/* ---- results against plain C ----------------------------------------------- */

Test(control, if_runs_the_branch_its_condition_picks) {
    Onnx__ModelProto *mp = if_model();
    kf_model *m = bu_load(mp);
    const float *w = f32(init_of(m, "w"));
    int64_t dims[2] = {2, 3};
    for (int sign = -1; sign <= 1; sign += 2) {
        kf_tensor x = tu_rand(KF_DT_FLOAT, 2, dims, 0.1, 1.0);
        float *xv = (float *)x.data;
        for (int i = 0; i < 6; i++) xv[i] *= (float)sign;
        kf_tensor want = tu_rand(KF_DT_FLOAT, 2, dims, 0, 1), got = {0};
        for (int i = 0; i < 6; i++) ((float *)want.data)[i] = sign > 0 ? xv[i] * w[i] : xv[i] - w[i];
        cr_assert_eq(run(m, &x, 1, &got), KF_OK, "%s", kf_last_error());
        expect_close(&got, &want, sign > 0 ? "then branch" : "else branch");
        kf_tensor_release(&x);
        kf_tensor_release(&want);
        kf_tensor_release(&got);
    }
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, loop_accumulates_and_stacks_scan_outputs) {
    Onnx__ModelProto *mp = loop_sum_model("input trip int64[]");
    kf_model *m = bu_load(mp);
    int64_t d3[1] = {3};
    kf_tensor in[3];
    in[0] = tu_rand(KF_DT_FLOAT, 1, d3, -2, 2);
    in[1] = tu_rand(KF_DT_FLOAT, 1, d3, -2, 2);
    int64_t trips = 2 + (int64_t)tu_uniform(0, 6);
    in[2] = tu_i64(0, NULL, &trips);
    kf_tensor out[2] = {{0}};
    cr_assert_eq(run(m, in, 3, out), KF_OK, "%s", kf_last_error());
    const float *x = f32(&in[0]), *a0 = f32(&in[1]);
    int64_t ydims[2] = {trips, 3};
    kf_tensor acc = tu_f32(1, d3, a0), ys = tu_rand(KF_DT_FLOAT, 2, ydims, 0, 1);
    for (int64_t i = 0; i < trips; i++)
        for (int k = 0; k < 3; k++) {
            ((float *)acc.data)[k] += (float)i * x[k];
            ((float *)ys.data)[i * 3 + k] = (float)i * x[k];
        }
    expect_close(&out[0], &acc, "acc");
    expect_close(&out[1], &ys, "ys");
    /* no iteration: the start value comes back and the scan output is empty */
    int64_t zero = 0;
    kf_tensor_release(&in[2]);
    in[2] = tu_i64(0, NULL, &zero);
    release(out, 2);
    cr_assert_eq(run(m, in, 3, out), KF_OK, "%s", kf_last_error());
    expect_close(&out[0], &in[1], "acc after no iteration");
    cr_assert_eq(out[1].rank, 2);
    cr_assert_eq(out[1].dims[0], 0);
    cr_assert_eq(out[1].dims[1], 3);
    release(out, 2);
    release(in, 3);
    kf_tensor_release(&acc);
    kf_tensor_release(&ys);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, loop_stops_when_its_body_says_so) {
    Onnx__ModelProto *mp = while_model();
    kf_model *m = bu_load(mp);
    bool yes = true;
    float v0 = (float)tu_uniform(0.5, 1.0), limit = (float)tu_uniform(10, 100);
    kf_tensor in[3];
    in[0] = tu_tensor(KF_DT_BOOL, 0, NULL, (double[]){yes});
    in[1] = tu_f32(0, NULL, &v0);
    in[2] = tu_f32(0, NULL, &limit);
    kf_tensor out[2] = {{0}};
    cr_assert_eq(run(m, in, 3, out), KF_OK, "%s", kf_last_error());
    float v = v0;
    int64_t n = 0;
    bool cond = true;
    while (cond) {
        v *= 2;
        cond = v < limit;
        n++;
    }
    cr_assert_float_eq(f32(&out[0])[0], v, 1e-6, "v is %g, expected %g", f32(&out[0])[0], v);
    cr_assert_eq(out[1].rank, 1);
    cr_assert_eq(out[1].dims[0], n, "%lld iterations, expected %lld", (long long)out[1].dims[0], (long long)n);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(((const int64_t *)out[1].data)[i], i);
    release(out, 2);
    release(in, 3);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, if_inside_a_loop_reads_both_enclosing_scopes) {
    Onnx__ModelProto *mp = nested_model();
    kf_model *m = bu_load(mp);
    int64_t d4[1] = {4};
    kf_tensor in[2];
    in[0] = tu_rand(KF_DT_FLOAT, 1, d4, 0.5, 1.5);
    in[1] = tu_rand(KF_DT_FLOAT, 1, d4, -1, 1);
    kf_tensor got = {0};
    cr_assert_eq(run(m, in, 2, &got), KF_OK, "%s", kf_last_error());
    kf_tensor want = tu_f32(1, d4, f32(&in[1]));
    float *a = (float *)want.data;
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++) a[k] = i % 2 == 0 ? a[k] + f32(&in[0])[k] : a[k] * f32(&in[0])[k];
    expect_close(&got, &want, "acc");
    kf_tensor_release(&got);
    kf_tensor_release(&want);
    release(in, 2);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, scan_runs_backwards_and_stacks_along_an_output_axis) {
    Onnx__ModelProto *mp = scan_model();
    kf_model *m = bu_load(mp);
    const float *w = f32(init_of(m, "w"));
    int64_t d3[1] = {3}, dx[2] = {4, 3}, dy[2] = {3, 4};
    kf_tensor in[2];
    in[0] = tu_rand(KF_DT_FLOAT, 1, d3, -1, 1);
    in[1] = tu_rand(KF_DT_FLOAT, 2, dx, -1, 1);
    kf_tensor out[2] = {{0}};
    cr_assert_eq(run(m, in, 2, out), KF_OK, "%s", kf_last_error());
    kf_tensor s = tu_f32(1, d3, f32(&in[0])), Y = tu_rand(KF_DT_FLOAT, 2, dy, 0, 1);
    float *sv = (float *)s.data;
    for (int t = 0; t < 4; t++) { /* step t reads row 3-t; y of step t is column t */
        for (int k = 0; k < 3; k++) {
            sv[k] += f32(&in[1])[(3 - t) * 3 + k];
            ((float *)Y.data)[k * 4 + t] = sv[k] * w[k];
        }
    }
    expect_close(&out[0], &s, "final state");
    expect_close(&out[1], &Y, "scan output");
    release(out, 2);
    release(in, 2);
    kf_tensor_release(&s);
    kf_tensor_release(&Y);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, scan8_runs_each_batch_item_over_its_own_length) {
    Onnx__ModelProto *mp = scan8_model();
    kf_model *m = bu_load(mp);
    int64_t dl[1] = {2}, ds[2] = {2, 3}, dx[3] = {2, 4, 3};
    int64_t lens[2] = {4, 2};
    kf_tensor in[3];
    in[0] = tu_i64(1, dl, lens);
    in[1] = tu_rand(KF_DT_FLOAT, 2, ds, -1, 1);
    in[2] = tu_rand(KF_DT_FLOAT, 3, dx, -1, 1);
    kf_tensor out[2] = {{0}};
    cr_assert_eq(run(m, in, 3, out), KF_OK, "%s", kf_last_error());
    kf_tensor s = tu_f32(2, ds, f32(&in[1])), Y = tu_rand(KF_DT_FLOAT, 3, dx, 0, 1);
    memset(Y.data, 0, 24 * sizeof(float));
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < lens[b]; t++)
            for (int k = 0; k < 3; k++) {
                ((float *)s.data)[b * 3 + k] += f32(&in[2])[(b * 4 + t) * 3 + k];
                ((float *)Y.data)[(b * 4 + t) * 3 + k] = ((float *)s.data)[b * 3 + k];
            }
    expect_close(&out[0], &s, "final states");
    expect_close(&out[1], &Y, "scan outputs");
    release(out, 2);
    release(in, 3);
    kf_tensor_release(&s);
    kf_tensor_release(&Y);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- shapes ------------------------------------------------------------------- */

static const kf_type *type_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value %s", name);
    return &m->graph->values[v].type;
}

Test(control, shapes_come_from_the_bodies) {
    /* branches of different widths: the dim they disagree on is unknown */
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput c bool[]\ninput a float[2, 3]\ninput b float[2, 4]\n"
                                    "y = If(c)\noutput y\n");
    static const char *const ao[] = {"a"}, *const bo[] = {"b"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch", bu_body("input a float[2, 3]\nt = Relu(a)\noutput t\n", ao, 1));
    bu_attach(n, "else_branch", bu_body("input b float[2, 4]\ne = Neg(b)\noutput e\n", bo, 1));
    kf_model *m = bu_load(mp);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    const kf_type *y = type_of(m, "y");
    cr_assert_eq(y->dtype, KF_DT_FLOAT);
    cr_assert_eq(y->rank, 2);
    cr_assert_eq(y->dims[0], 2);
    cr_assert_eq(y->dims[1], -1);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a branch whose shapes cannot work for these inputs is never taken:
     * the other one decides, and the model runs */
    mp = bu_proto("opset 13\ninput c bool[]\ninput a float[2, 3]\nconst k float[4] = random\n"
                  "y = If(c)\nkeep = Neg(k)\noutput y\n");
    bu_drop_node(mp->graph, "Neg");
    static const char *const ako[] = {"a", "k"};
    n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch", bu_body("input a float[2, 3]\ninput k float[4]\nt = Add(a, k)\noutput t\n", ako, 2));
    bu_attach(n, "else_branch", bu_body("input a float[2, 3]\ne = Neg(a)\noutput e\n", ao, 1));
    m = bu_load(mp);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    y = type_of(m, "y");
    cr_assert(y->rank == 2 && y->dims[0] == 2 && y->dims[1] == 3);
    int64_t d23[2] = {2, 3};
    kf_tensor in[2] = {tu_tensor(KF_DT_BOOL, 0, NULL, (double[]){0}), tu_rand(KF_DT_FLOAT, 2, d23, -1, 1)};
    kf_tensor got = {0};
    cr_assert_eq(run(m, in, 2, &got), KF_OK, "%s", kf_last_error());
    for (int i = 0; i < 6; i++) cr_assert_eq(f32(&got)[i], -f32(&in[1])[i]);
    kf_tensor_release(&got);
    release(in, 2);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a constant trip count and no condition: the scan output's length */
    mp = loop_sum_model("const trip int64[] = 6");
    m = bu_load(mp);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    const kf_type *ys = type_of(m, "ys"), *acc = type_of(m, "acc");
    cr_assert(ys->rank == 2 && ys->dims[0] == 6 && ys->dims[1] == 3, "ys is rank %d [%lld, %lld]", ys->rank,
              (long long)ys->dims[0], (long long)ys->dims[1]);
    cr_assert(acc->rank == 1 && acc->dims[0] == 3);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a trip count from the caller: length unknown */
    mp = loop_sum_model("input trip int64[]");
    m = bu_load(mp);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    ys = type_of(m, "ys");
    cr_assert(ys->rank == 2 && ys->dims[0] == -1 && ys->dims[1] == 3);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);

    /* Scan: the steps along the input axis become the output axis */
    mp = scan_model();
    m = bu_load(mp);
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    const kf_type *Y = type_of(m, "Y");
    cr_assert(Y->rank == 2 && Y->dims[0] == 3 && Y->dims[1] == 4);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- errors --------------------------------------------------------------------- */

Test(control, if_condition_must_be_one_bool) {
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput c bool[2]\ninput a float[3]\ny = If(c)\noutput y\n");
    static const char *const ao[] = {"a"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    free(n->name);
    n->name = strdup("pick");
    bu_attach(n, "then_branch", bu_body("input a float[3]\nt = Relu(a)\noutput t\n", ao, 1));
    bu_attach(n, "else_branch", bu_body("input a float[3]\ne = Neg(a)\noutput e\n", ao, 1));
    kf_model *m = bu_load(mp);
    int64_t d2[1] = {2}, d3[1] = {3};
    kf_tensor in[2] = {tu_tensor(KF_DT_BOOL, 1, d2, (double[]){1, 0}), tu_rand(KF_DT_FLOAT, 1, d3, -1, 1)};
    kf_tensor out = {0};
    cr_assert_eq(run(m, in, 2, &out), KF_ERR_SHAPE);
    const char *e = kf_last_error();
    cr_assert(strstr(e, "pick") && strstr(e, "condition"), "error does not name the node: %s", e);
    release(in, 2);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, bodies_that_do_not_fit_their_node_are_load_errors) {
    /* an If branch with two outputs for a node with one */
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput c bool[]\ninput a float[3]\ny = If(c)\noutput y\n");
    static const char *const ao[] = {"a"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch", bu_body("input a float[3]\nt = Relu(a)\nu = Neg(a)\noutput t, u\n", ao, 1));
    bu_attach(n, "else_branch", bu_body("input a float[3]\ne = Neg(a)\noutput e\n", ao, 1));
    cr_assert_eq(bu_try_load(mp), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "then_branch") && strstr(kf_last_error(), "If"), "%s", kf_last_error());
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a missing branch */
    mp = bu_proto("opset 13\ninput c bool[]\ninput a float[3]\ny = If(c)\noutput y\n");
    bu_attach(bu_node(mp->graph, "If"), "then_branch", bu_body("input a float[3]\nt = Relu(a)\noutput t\n", ao, 1));
    cr_assert_eq(bu_try_load(mp), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "else_branch"), "%s", kf_last_error());
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a Loop body without the condition input */
    mp = bu_proto("opset 13\ninput t int64[]\ninput a float[3]\nv = Loop(t, , a)\noutput v\n");
    bu_attach(bu_node(mp->graph, "Loop"), "body",
              bu_body("input i int64[]\ninput v float[3]\nc = Constant() {value_int=1}\nb = Cast(c) {to=9}\n"
                      "w = Neg(v)\noutput b, w\n",
                      NULL, 0));
    cr_assert_eq(bu_try_load(mp), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "Loop") && strstr(kf_last_error(), "body takes 2 inputs"), "%s",
              kf_last_error());
    onnx__model_proto__free_unpacked(mp, NULL);

    /* a body reading a name nobody defines, two levels down */
    mp = nested_model();
    Onnx__GraphProto *b = bu_node(mp->graph, "Loop")->attribute[0]->g;
    Onnx__NodeProto *inner = bu_node(b, "If");
    Onnx__NodeProto *add = inner->attribute[0]->g->node[0];
    free(add->input[1]);
    add->input[1] = strdup("nowhere");
    cr_assert_eq(bu_try_load(mp), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "nowhere") && strstr(kf_last_error(), "Loop"), "%s", kf_last_error());
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, scan_inputs_of_different_lengths_fail) {
    Onnx__ModelProto *mp = bu_proto("opset 16\ninput s0 float[3]\ninput X float[N, 3]\ninput Z float[M, 3]\n"
                                    "s = Scan(s0, X, Z)\noutput s\n");
    Onnx__NodeProto *n = bu_node(mp->graph, "Scan");
    bu_attach(n, "body", bu_body("input s float[3]\ninput x float[3]\ninput z float[3]\n"
                                 "p = Add(x, z)\ns2 = Add(s, p)\noutput s2\n",
                                 NULL, 0));
    bu_attach_int(n, "num_scan_inputs", 2);
    kf_model *m = bu_load(mp);
    int64_t d3[1] = {3}, dx[2] = {3, 3}, dz[2] = {4, 3};
    kf_tensor in[3] = {tu_rand(KF_DT_FLOAT, 1, d3, -1, 1), tu_rand(KF_DT_FLOAT, 2, dx, -1, 1),
                       tu_rand(KF_DT_FLOAT, 2, dz, -1, 1)};
    kf_tensor out = {0};
    cr_assert_eq(run(m, in, 3, &out), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "Scan") && strstr(kf_last_error(), "steps"), "%s", kf_last_error());
    /* equal lengths run */
    kf_tensor_release(&in[2]);
    in[2] = tu_rand(KF_DT_FLOAT, 2, dx, -1, 1);
    cr_assert_eq(run(m, in, 3, &out), KF_OK, "%s", kf_last_error());
    kf_tensor want = tu_f32(1, d3, f32(&in[0]));
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 3; k++) ((float *)want.data)[k] += f32(&in[1])[t * 3 + k] + f32(&in[2])[t * 3 + k];
    expect_close(&out, &want, "state");
    kf_tensor_release(&out);
    kf_tensor_release(&want);
    release(in, 3);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, loop_carried_value_must_keep_its_dtype) {
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput t int64[]\ninput a float[3]\nv = Loop(t, , a)\noutput v\n");
    bu_attach(bu_node(mp->graph, "Loop"), "body",
              bu_body("input i int64[]\ninput c bool[]\ninput v float[3]\nw = Cast(v) {to=11}\noutput c, w\n", NULL,
                      0));
    kf_model *m = bu_load(mp);
    int64_t d3[1] = {3}, two = 2;
    kf_tensor in[2] = {tu_i64(0, NULL, &two), tu_rand(KF_DT_FLOAT, 1, d3, -1, 1)};
    kf_tensor out = {0};
    cr_assert_eq(run(m, in, 2, &out), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "Loop") && strstr(kf_last_error(), "loop-carried"), "%s", kf_last_error());
    release(in, 2);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- passes and backends ------------------------------------------------------------ */

static kf_model *optimized(const kf_model *m) {
    kf_model *o = gt_copy(m);
    kf_opt_options opts;
    kf_opt_options_default(&opts);
    opts.fuel = -1;
    kf_opt_result res;
    kf_status st = kf_optimize(o, &opts, &res);
    kf_rules_free(&res.rules);
    cr_assert_eq(st, KF_OK, "optimize: %s", kf_last_error());
    return o;
}

Test(control, opt_keeps_the_outputs) {
    Onnx__ModelProto *(*models[])(void) = {if_model, nested_model, scan_model};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        Onnx__ModelProto *mp = models[k]();
        kf_model *m = bu_load(mp);
        kf_model *o = optimized(m);
        gt_expect_same_outputs(m, o, ATOL, RTOL);
        kf_model_free(o);
        kf_model_free(m);
        onnx__model_proto__free_unpacked(mp, NULL);
    }
    Onnx__ModelProto *mp = loop_sum_model("const trip int64[] = 4");
    kf_model *m = bu_load(mp);
    kf_model *o = optimized(m);
    gt_expect_same_outputs(m, o, ATOL, RTOL);
    kf_model_free(o);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* Op types of body `attr` of the first node of type op in m. */
static int body_count(const kf_model *m, const char *op, const char *attr, const char *of) {
    const kf_graph *g = m->graph;
    for (kf_id i = 1; i < g->nnodes; i++) {
        if (g->nodes[i].dead || strcmp(g->nodes[i].op_type, op)) continue;
        kf_body b;
        cr_assert_eq(kf_onnx_node_body(&g->nodes[i], attr, m->opsets, m->nopsets, NULL, &b), KF_OK, "%s",
                     kf_last_error());
        int n = 0;
        for (kf_id k = 1; k < b.g->nnodes; k++) n += !b.g->nodes[k].dead && !strcmp(b.g->nodes[k].op_type, of);
        kf_body_release(&b);
        return n;
    }
    cr_assert_fail("no %s node", op);
    return -1;
}

/* The optimizer rewrites inside bodies as in the graph: a Softmax spelled
 * out in an If branch (reading the outer x) becomes one Softmax, a multiply
 * by one in a Loop body goes, and an addition of zero in a nested If under
 * it too; the results do not change, the captures still resolve, and a new
 * name inside a body never repeats one of the graph around it. */
Test(control, bodies_are_optimized_like_the_graph) {
    Onnx__ModelProto *mp = bu_proto("opset 13\n"
                                    "input x float[2, 5]\n"
                                    "input a0 float[2, 5]\n"
                                    "const trip int64[] = 3\n"
                                    "s = ReduceSum(x) {keepdims=0}\n"
                                    "const zero float[] = 0\n"
                                    "c = Greater(s, zero)\n"
                                    "y = If(c)\n"
                                    "acc = Loop(trip, , a0)\n"
                                    "output y, acc\n");
    static const char *const ox[] = {"x"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch",
              bu_body("input x float[2, 5]\n"
                      "m = ReduceMax(x) {axes=[-1], keepdims=1}\nd = Sub(x, m)\ne = Exp(d)\n"
                      "const ax int64[1] = -1\nt = ReduceSum(e, ax) {keepdims=1}\nsm = Div(e, t)\noutput sm\n",
                      ox, 1));
    bu_attach(n, "else_branch", bu_body("input x float[2, 5]\nz = Neg(x)\noutput z\n", ox, 1));
    static const char *const oacc[] = {"acc"};
    Onnx__GraphProto *inner = bu_body("input acc float[2, 5]\n"
                                      "const nought float[] = 0\nq = Add(acc, nought)\nr = Relu(q)\noutput r\n", oacc, 1);
    Onnx__GraphProto *body = bu_body("input i int64[]\ninput cin bool[]\ninput acc float[2, 5]\ninput x float[2, 5]\n"
                                     "const one float[] = 1\nconst two int64[] = 2\nconst izero int64[] = 0\n"
                                     "p = Mul(x, one)\nr = Mod(i, two)\nev = Equal(r, izero)\nw = If(ev)\n"
                                     "acc2 = Add(w, p)\ncout = Identity(cin)\noutput cout, acc2\n",
                                     ox, 1);
    bu_attach(bu_node(body, "If"), "then_branch", inner);
    bu_attach(bu_node(body, "If"), "else_branch",
              bu_body("input acc float[2, 5]\nh = Abs(acc)\noutput h\n", oacc, 1));
    bu_attach(bu_node(mp->graph, "Loop"), "body", body);
    kf_model *m = bu_load(mp);
    cr_assert_eq(body_count(m, "If", "then_branch", "Softmax"), 0);
    kf_model *o = optimized(m);
    cr_expect_eq(body_count(o, "If", "then_branch", "Softmax"), 1, "the branch's Softmax was not recognized");
    cr_expect_eq(body_count(o, "If", "then_branch", "Exp"), 0);
    cr_expect_eq(body_count(o, "Loop", "body", "Mul"), 0, "x * 1 is still in the Loop body");
    gt_expect_same_outputs(m, o, ATOL, RTOL);
    /* the nested If inside the Loop body lost its Add of zero */
    const kf_graph *g = o->graph;
    for (kf_id i = 1; i < g->nnodes; i++) {
        if (g->nodes[i].dead || strcmp(g->nodes[i].op_type, "Loop")) continue;
        kf_body b;
        cr_assert_eq(kf_onnx_node_body(&g->nodes[i], "body", o->opsets, o->nopsets, NULL, &b), KF_OK, "%s",
                     kf_last_error());
        kf_model bm = {.graph = b.g, .opsets = o->opsets, .nopsets = o->nopsets};
        cr_expect_eq(body_count(&bm, "If", "then_branch", "Add"), 0, "0 + acc is still in the nested branch");
        kf_body_release(&b);
    }
    /* written and read back, it still runs the same */
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(o, &buf, &len), KF_OK, "%s", kf_last_error());
    kf_model *back = NULL;
    cr_assert_eq(kf_model_load_memory(buf, len, NULL, &back), KF_OK, "%s", kf_last_error());
    kf_free(buf);
    gt_expect_same_outputs(m, back, ATOL, RTOL);
    kf_model_free(back);
    kf_model_free(o);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(control, fresh_names_in_a_body_avoid_the_graph_around_it) {
    kf_graph *outer = kf_graph_new(), *inner = kf_graph_new();
    kf_id v;
    cr_assert_eq(kf_graph_add_value(outer, "t", &v), KF_OK);
    cr_assert_eq(kf_graph_add_value(inner, "u", &v), KF_OK);
    inner->outer = outer;
    cr_assert_eq(kf_graph_fresh_value(inner, "t", &v), KF_OK);
    cr_expect_str_eq(inner->values[v].name, "t__1");
    cr_assert_eq(kf_graph_fresh_value(inner, "u", &v), KF_OK);
    cr_expect_str_eq(inner->values[v].name, "u__1");
    inner->outer = NULL;
    cr_assert_eq(kf_graph_fresh_value(inner, "t", &v), KF_OK);
    cr_expect_str_eq(inner->values[v].name, "t", "without an outer graph the name is free");
    kf_graph_free(inner);
    kf_graph_free(outer);
}

Test(control, a_constant_if_folds_away) {
    /* the condition is a constant, so constant folding runs the If once */
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput a float[3]\nconst c bool[] = 1\nconst k float[3] = random\n"
                                    "y = If(c)\nz = Add(a, y)\nkeep = Neg(k)\noutput z\n");
    bu_drop_node(mp->graph, "Neg");
    static const char *const ko[] = {"k"};
    Onnx__NodeProto *n = bu_node(mp->graph, "If");
    bu_attach(n, "then_branch", bu_body("input k float[3]\nt = Relu(k)\noutput t\n", ko, 1));
    bu_attach(n, "else_branch", bu_body("input k float[3]\ne = Neg(k)\noutput e\n", ko, 1));
    kf_model *m = bu_load(mp);
    kf_model *o = optimized(m);
    cr_assert_eq(gt_count(o, "If"), 0, "the If with a constant condition is still there");
    gt_expect_same_outputs(m, o, ATOL, RTOL);
    kf_model_free(o);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* On OpenCL the control flow runs on the host (conditions, iterations,
 * slices, stacking) and every body as a compiled plan of its own, nested
 * bodies too; the outputs are the reference's, run after run. */
Test(control, opencl_runs_bodies_as_compiled_plans) {
    const char *why = kf_cl_unavailable();
    if (why) cr_skip_test("OpenCL: %s", why);
    Onnx__ModelProto *(*models[])(void) = {if_model, nested_model, scan_model, while_model};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        Onnx__ModelProto *mp = models[k]();
        kf_model *m = bu_load(mp);
        kf_exec_options o;
        kf_exec_options_default(&o);
        o.backend = KF_EXEC_OPENCL;
        kf_exec *x = NULL;
        cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "model %zu: %s", k, kf_last_error());
        uint32_t nout = m->graph->noutputs;
        cr_assert_leq(nout, 2);
        for (int run = 0; run < 2; run++) {
            kf_tensor *ins;
            uint32_t nins;
            gt_random_inputs(m, &ins, &nins);
            if (k == 3) { /* the while loop: a start below the limit, and a bool condition */
                kf_set_i64(&ins[0], 0, 1);
                kf_set_f64(&ins[1], 0, 0.75);
                kf_set_f64(&ins[2], 0, 40);
            }
            kf_tensor want[2] = {{0}}, got[2] = {{0}};
            cr_assert_eq(kf_eval_model(m, ins, (int)nins, want, NULL), KF_OK, "%s", kf_last_error());
            cr_assert_eq(kf_exec_run(x, ins, nins, got), KF_OK, "model %zu: %s", k, kf_last_error());
            for (uint32_t q = 0; q < nout; q++) expect_close(&got[q], &want[q], "opencl against ref");
            release(want, 2);
            release(got, 2);
            release(ins, (int)nins);
            free(ins);
        }
        kf_exec_stats st;
        kf_exec_get_stats(x, &st);
        cr_expect_geq(st.groups_ref, 1, "model %zu: the control-flow node runs on the host", k);
        cr_expect_gt(st.body_runs, 0, "model %zu: no body ran as a compiled plan", k);
        kf_exec_free(x);
        kf_model_free(m);
        onnx__model_proto__free_unpacked(mp, NULL);
    }
}

/* The fp16 pass keeps control flow in float32: a branch multiplies by a
 * float32 constant of its own, which a float16 operand would not match. */
Test(control, fp16_pass_leaves_bodies_in_float32) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 3]\n"
                           "input c bool[]\n"
                           "a = Relu(x)\n"
                           "graph neg\n"
                           "  t = Neg(a)\n"
                           "  output t\n"
                           "end\n"
                           "graph scale\n"
                           "  const k float[] = 0.5\n"
                           "  e = Mul(a, k)\n"
                           "  output e\n"
                           "end\n"
                           "y = If(c) {then_branch=@neg, else_branch=@scale}\n"
                           "z = Sigmoid(y)\n"
                           "output z\n");
    kf_model *h = gt_copy(m);
    cr_assert_eq(kf_fuse_precision(h, KF_DT_FLOAT16, NULL), KF_OK, "%s", kf_last_error());
    kf_id y = kf_graph_find(h->graph, "y");
    cr_assert(y && h->graph->values[y].type.dtype == KF_DT_FLOAT, "the If output became %s",
              kf_dtype_name(h->graph->values[y].type.dtype));
    int64_t d[2] = {2, 3};
    for (int take = 0; take < 2; take++) {
        kf_tensor in[2] = {tu_rand(KF_DT_FLOAT, 2, d, -2, 2), tu_tensor(KF_DT_BOOL, 0, NULL, (double[]){take})};
        kf_tensor want = {0}, got = {0};
        cr_assert_eq(run(m, in, 2, &want), KF_OK, "%s", kf_last_error());
        cr_assert_eq(run(h, in, 2, &got), KF_OK, "branch %d after the fp16 pass: %s", take, kf_last_error());
        char why[256];
        cr_assert(tu_close(&got, &want, 2.5e-3, 1e-3, why, sizeof why), "%s", why);
        kf_tensor_release(&want);
        kf_tensor_release(&got);
        release(in, 2);
    }
    kf_model_free(h);
    kf_model_free(m);
}

/* A model that moves sequences cannot run, and the reason says kfuse has no
 * sequence type (ONNX's test_if_seq and test_loop13_seq are such models). */
Test(control, sequence_values_are_named_in_the_reason) {
    Onnx__ModelProto *mp = bu_proto("opset 13\ninput a float[3]\ns = SequenceConstruct(a)\noutput s\n");
    /* declare the output a sequence of float tensors */
    Onnx__ValueInfoProto *out = mp->graph->output[0];
    if (out->type) onnx__type_proto__free_unpacked(out->type, NULL);
    Onnx__TypeProto *tp = malloc(sizeof *tp), *elem = malloc(sizeof *elem);
    Onnx__TypeProto__Sequence *seq = malloc(sizeof *seq);
    Onnx__TypeProto__Tensor *tt = malloc(sizeof *tt);
    cr_assert(tp && elem && seq && tt);
    onnx__type_proto__init(tp);
    onnx__type_proto__init(elem);
    onnx__type_proto__sequence__init(seq);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    elem->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    elem->tensor_type = tt;
    seq->elem_type = elem;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE;
    tp->sequence_type = seq;
    out->type = tp;
    kf_model *m = bu_load(mp);
    const char *why = kf_eval_unsupported_reason(m);
    cr_assert(why && strstr(why, "SequenceConstruct") && strstr(why, "'s' is of kind sequence"), "%s", why ? why : "(none)");
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}
