/*
 * test_plan.c: the fusion planner (fusion/plan*.c). Positive tests check
 * which nodes share a group; does_not_* tests build the case for each
 * legality reason and check the exact string recorded on the boundary (or
 * returned by kf_plan_merge_reason for horizontal pairs); invariant tests
 * check every live node is in exactly one group, in topological order.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_text.h"
#include "kf_codegen.h"
#include "kf_opt.h"
#include "kf_plan.h"

#define BERT KF_SOURCE_DIR "/../shared/models/ort/onnxruntime/python/tools/bert/test_data/bert_squad_pytorch1.4_opset11/BertForQuestionAnswering_0.onnx"
#define MNIST KF_SOURCE_DIR "/../shared/models/ort/winml/test/collateral/models/mnist.onnx"

static kf_plan *plan_opts(kf_model *m, const kf_plan_options *o) {
    kf_plan *p = NULL;
    cr_assert_eq(kf_plan_build(m, o, &p), KF_OK, "%s", kf_last_error());
    return p;
}

static kf_plan *plan(kf_model *m) {
    kf_plan_options o = {.fuel = -1};
    return plan_opts(m, &o);
}

/* Group of the node that produces value `name`. */
static uint32_t grp(const kf_model *m, const kf_plan *p, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v && m->graph->values[v].producer, "no produced value %s", name);
    return p->group_of[m->graph->values[v].producer];
}

/* Reason on the boundary carrying value `v` into the group that produces
 * `to`; NULL when there is no such boundary. */
static const char *breason(const kf_model *m, const kf_plan *p, const char *v, const char *to) {
    kf_id id = kf_graph_find(m->graph, v);
    uint32_t gt = grp(m, p, to);
    for (uint32_t i = 0; i < p->nbounds; i++)
        if (p->bounds[i].value == id && p->bounds[i].to == gt) return p->bounds[i].reason;
    return NULL;
}

/* Every live node in exactly one group; group node lists topological;
 * groups listed producers first; every cross-group edge has a boundary
 * with a reason. */
static void check_invariants(const kf_model *m, const kf_plan *p) {
    const kf_graph *g = m->graph;
    uint32_t *seen = calloc(g->nnodes + 1, sizeof *seen);
    uint32_t *pos = calloc(g->nnodes + 1, sizeof *pos);
    uint32_t total = 0, step = 0;
    for (uint32_t k = 0; k < p->ngroups; k++)
        for (uint32_t i = 0; i < p->groups[k].nnodes; i++) {
            kf_id x = p->groups[k].nodes[i];
            cr_assert(!g->nodes[x].dead, "dead node in a group");
            cr_assert_eq(seen[x], 0, "node %u in two groups", x);
            seen[x] = 1;
            cr_assert_eq(p->group_of[x], k);
            pos[x] = ++step;
            total++;
        }
    cr_assert_eq(total, kf_graph_live_nodes(g));
    cr_assert_eq(total, p->nodes);
    /* walking groups in order and their nodes in order is a topological order */
    for (kf_id x = 1; x < g->nnodes; x++) {
        if (g->nodes[x].dead) continue;
        cr_assert(seen[x], "live node %u in no group", x);
        for (int k = 0; k < g->nodes[x].nin; k++) {
            kf_id v = g->nodes[x].in[k];
            kf_id pr = v ? g->values[v].producer : 0;
            if (!pr) continue;
            cr_assert_lt(pos[pr], pos[x], "node %u runs before its producer %u", x, pr);
            if (p->group_of[pr] != p->group_of[x]) {
                bool found = false;
                for (uint32_t b = 0; b < p->nbounds && !found; b++)
                    found = p->bounds[b].from == p->group_of[pr] && p->bounds[b].to == p->group_of[x] &&
                            p->bounds[b].value == v && p->bounds[b].reason && *p->bounds[b].reason;
                cr_assert(found, "edge %u -> %u has no boundary with a reason", pr, x);
            }
        }
    }
    uint32_t maxl = 0;
    for (uint32_t k = 0; k < p->ngroups; k++)
        if (p->groups[k].launch != UINT32_MAX && p->groups[k].launch + 1 > maxl) maxl = p->groups[k].launch + 1;
    cr_assert_eq(maxl, p->launches);
    free(seen);
    free(pos);
}

/* ---- positive ------------------------------------------------------------ */

Test(plan_fuse, bias_gelu_chain_is_one_group) {
    kf_model *m = gt_parse("opset 20\n"
                           "input x float[4, 8]\n"
                           "const b float[8] = random\n"
                           "y = Add(x, b)\n"
                           "z = Gelu(y)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ELEMWISE);
    cr_expect_eq(p->groups[0].ninputs, 2);
    cr_expect_eq(p->groups[0].noutputs, 1);
    /* x (128) + b (32) read, z (128) written; unfused also writes and reads y */
    cr_expect_eq(p->bytes_fused, 128 + 32 + 128);
    cr_expect_eq(p->bytes_unfused, (128 + 32 + 128) + (128 + 128));
    cr_expect_eq(p->bytes_lower_bound, 128 + 32 + 128);
    cr_expect_eq(p->groups[0].flops, 32 + 32);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, bias_residual_layernorm_is_one_group) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 3, 8]\n"
                           "input r float[2, 3, 8]\n"
                           "const b float[8] = random\n"
                           "const gam float[8] = random\n"
                           "const bet float[8] = random\n"
                           "a = Add(x, b)\n"
                           "c = Add(a, r)\n"
                           "y = LayerNormalization(c, gam, bet) {axis=-1}\n"
                           "output y\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_REDUCTION);
    cr_expect_eq(p->groups[0].anchor, m->graph->values[kf_graph_find(m->graph, "y")].producer);
    cr_expect_eq(p->nbounds, 0);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, scale_mask_softmax_is_one_group) {
    kf_model *m = gt_parse("opset 13\n"
                           "input s float[2, 3, 4, 4]\n"
                           "input mask float[2, 1, 1, 4]\n"
                           "const eight float[] = 8\n"
                           "d = Div(s, eight)\n"
                           "e = Add(d, mask)\n"
                           "y = Softmax(e) {axis=-1}\n"
                           "output y\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_REDUCTION);
    cr_expect_eq(p->groups[0].ninputs, 3);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, reduction_absorbs_epilogues) {
    /* softmax output scaled; a row mean subtracted from its own input */
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "input z float[4, 8]\n"
                           "const c float[8] = random\n"
                           "y = Softmax(x) {axis=-1}\n"
                           "w = Mul(y, c)\n"
                           "mean = ReduceMean(z) {axes=[1], keepdims=1}\n"
                           "d = Sub(z, mean)\n"
                           "output w\n"
                           "output d\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "w"));
    cr_expect_eq(grp(m, p, "mean"), grp(m, p, "d"));
    cr_expect_neq(grp(m, p, "y"), grp(m, p, "d"));
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, matmul_bias_relu_is_one_anchor_group) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 16] = random\n"
                           "const b float[16] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = Add(y, b)\n"
                           "r = Relu(z)\n"
                           "output r\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].kind, KF_GROUP_ANCHOR);
    cr_expect_eq(p->groups[0].anchor, m->graph->values[kf_graph_find(m->graph, "y")].producer);
    cr_expect_eq(p->groups[0].flops, 2 * 4 * 16 * 8 + 64 + 64);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, diamond_is_fused_whole) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "p = Exp(x)\n"
                           "a = Relu(p)\n"
                           "b = Neg(p)\n"
                           "y = Add(a, b)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].nnodes, 4);
    cr_expect_eq(p->bytes_fused, 128 + 128);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, graph_output_inside_a_group_is_written) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "a = Exp(x)\n"
                           "b = Relu(a)\n"
                           "output a\n"
                           "output b\n");
    kf_plan *p = plan(m);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].noutputs, 2);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, siblings_reading_one_input_share_a_kernel) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "a = Relu(x)\n"
                           "b = Sigmoid(x)\n"
                           "output a\n"
                           "output b\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 1);
    cr_expect_eq(p->groups[0].ninputs, 1);
    cr_expect_eq(p->groups[0].noutputs, 2);
    cr_expect_eq(p->bytes_fused, 128 + 256, "x is read once");
    cr_expect_eq(p->bytes_unfused, 2 * (128 + 128));
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, independent_small_groups_share_a_launch) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "input y float[4, 8]\n"
                           "a = Softmax(x) {axis=-1}\n"
                           "b = Softmax(y) {axis=-1}\n"
                           "output a\n"
                           "output b\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_eq(p->launches, 1);
    cr_expect_eq(p->groups[0].launch, p->groups[1].launch);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, shape_of_static_dims_is_a_const_group) {
    kf_model *m = gt_parse("opset 17\n"
                           "input w float[3, 4]\n"
                           "input k int64[2]\n"
                           "s = Shape(w)\n"
                           "y = Add(s, k)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->groups[grp(m, p, "s")].kind, KF_GROUP_CONST);
    cr_expect_eq(p->groups[grp(m, p, "s")].launch, UINT32_MAX);
    cr_expect_eq(p->launches, 1);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_fuse, unknown_shapes_fuse_when_provably_equal) {
    /* the shape is data-dependent, but Relu and Softmax keep it */
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[2, 8]\n"
                           "input s int64[2]\n"
                           "y = Reshape(x, s)\n"
                           "r = Relu(y)\n"
                           "h = Mul(r, r)\n"
                           "z = Softmax(h) {axis=-1}\n"
                           "output z\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(grp(m, p, "r"), grp(m, p, "z"));
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- negative: one test per reason -------------------------------------------- */

/* a feeds the Add directly and through an opaque CumSum */
static const char *CYCLE_TEXT = "opset 17\n"
                                "input x float[4, 8]\n"
                                "const ax int64[] = 1\n"
                                "a = Exp(x)\n"
                                "y = CumSum(a, ax)\n"
                                "c = Add(a, y)\n"
                                "output c\n";

Test(plan_reason, does_not_create_a_cycle_through_an_outside_node) {
    kf_model *m = gt_parse(CYCLE_TEXT);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_neq(grp(m, p, "a"), grp(m, p, "c"));
    cr_expect_str_eq(breason(m, p, "a", "c"), KF_REASON_CYCLE);
    cr_expect_str_eq(breason(m, p, "a", "c"), "would create a cycle through a node outside the group");
    cr_expect_str_eq(kf_plan_merge_reason(p, grp(m, p, "a"), grp(m, p, "c"), false), KF_REASON_CYCLE);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_fuse_into_an_opaque_consumer) {
    kf_model *m = gt_parse(CYCLE_TEXT);
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "a", "y"), KF_REASON_CONSUMER_OPAQUE);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_fuse_an_opaque_producer) {
    kf_model *m = gt_parse(CYCLE_TEXT);
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "c"), KF_REASON_PRODUCER_OPAQUE);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_search_cycles_past_the_budget) {
    /* a reaches the Add through KF_PLAN_CYCLE_BUDGET+ opaque groups */
    size_t cap = 64 * (KF_PLAN_CYCLE_BUDGET + 16);
    char *t = malloc(cap);
    size_t n = (size_t)snprintf(t, cap, "opset 17\ninput x float[4, 8]\nconst ax int64[] = 1\na = Exp(x)\ny0 = CumSum(a, ax)\n");
    for (int i = 1; i <= KF_PLAN_CYCLE_BUDGET + 8; i++) n += (size_t)snprintf(t + n, cap - n, "y%d = CumSum(y%d, ax)\n", i, i - 1);
    snprintf(t + n, cap - n, "c = Add(a, y%d)\noutput c\n", KF_PLAN_CYCLE_BUDGET + 8);
    kf_model *m = gt_parse(t);
    free(t);
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "a", "c"), KF_REASON_CYCLE_BUDGET);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_fuse_a_plan_time_constant) {
    kf_model *m = gt_parse("opset 17\n"
                           "input w float[3, 4]\n"
                           "input k int64[2]\n"
                           "s = Shape(w)\n"
                           "y = Add(s, k)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "s", "y"), KF_REASON_PRODUCER_CONST);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_put_two_reductions_in_one_group) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "y = Softmax(x) {axis=-1}\n"
                           "z = ReduceMax(y) {axes=[1], keepdims=1}\n"
                           "output z\n");
    kf_plan *p = plan(m);
    cr_expect_str_eq(breason(m, p, "y", "z"), KF_REASON_TWO_REDUCTIONS);
    cr_expect_str_eq(breason(m, p, "y", "z"), "two reductions in one group");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_put_two_sibling_anchors_in_one_group) {
    /* two GEMMs of one input summed: neither reads the other's rows */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "const v float[8, 8] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = MatMul(x, v)\n"
                           "s = Add(y, z)\n"
                           "output s\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    uint32_t gs = grp(m, p, "s");
    const char *why = grp(m, p, "y") == gs ? breason(m, p, "z", "s") : breason(m, p, "y", "s");
    cr_expect_str_eq(why, KF_REASON_TWO_ANCHORS);
    cr_expect_str_eq(why, "two anchors in one group");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_chain_three_anchors) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "y = MatMul(x, w)\n"
                           "z = MatMul(y, w)\n"
                           "u = MatMul(z, w)\n"
                           "output u\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "z"), "the first pair is back-to-back");
    cr_expect_str_eq(breason(m, p, "z", "u"), KF_REASON_TWO_ANCHORS);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_put_a_reduction_beside_an_anchor) {
    /* the row mean of another tensor is added to the GEMM output: it is
     * neither after the anchor nor feeding it */
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "input q float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "y = MatMul(x, w)\n"
                           "r = ReduceMean(q) {axes=[1], keepdims=1}\n"
                           "z = Add(y, r)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "z"));
    cr_expect_str_eq(breason(m, p, "r", "z"), KF_REASON_ANCHOR_REDUCTION);
    cr_expect_str_eq(breason(m, p, "r", "z"), "an anchor and a reduction in one group");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_give_an_anchor_a_reduction_prologue) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "r = Softmax(x) {axis=-1}\n"
                           "y = MatMul(r, w)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "r", "y"), KF_REASON_ANCHOR_PROLOGUE);
    cr_expect_str_eq(breason(m, p, "r", "y"), "anchor prologues are elementwise or layout ops only");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_give_an_anchor_a_slice_epilogue) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "const w float[8, 8] = random\n"
                           "const st int64[1] = 1\n"
                           "const en int64[1] = 3\n"
                           "y = MatMul(x, w)\n"
                           "t = Slice(y, st, en)\n"
                           "output t\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "y", "t"), KF_REASON_ANCHOR_INJECTIVE);
    cr_expect_str_eq(breason(m, p, "y", "t"),
                     "anchor data movement is reshape/transpose/split/select only (load/store index maps)");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_exceed_the_input_cap) {
    char t[4096];
    size_t n = (size_t)snprintf(t, sizeof t, "opset 17\n");
    for (int i = 0; i <= KF_PLAN_MAX_INPUTS + 1; i++) n += (size_t)snprintf(t + n, sizeof t - n, "input x%d float[4]\n", i);
    n += (size_t)snprintf(t + n, sizeof t - n, "y1 = Add(x0, x1)\n");
    for (int i = 2; i <= KF_PLAN_MAX_INPUTS + 1; i++) n += (size_t)snprintf(t + n, sizeof t - n, "y%d = Add(y%d, x%d)\n", i, i - 1, i);
    snprintf(t + n, sizeof t - n, "output y%d\n", KF_PLAN_MAX_INPUTS + 1);
    kf_model *m = gt_parse(t);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    char a[16], b[16];
    /* y1..y15 read x0..x16 (16 inputs); adding y16 would read x17 */
    snprintf(a, sizeof a, "y%d", KF_PLAN_MAX_INPUTS - 1);
    snprintf(b, sizeof b, "y%d", KF_PLAN_MAX_INPUTS);
    cr_expect_str_eq(breason(m, p, a, b), KF_REASON_INPUTS);
    cr_expect_str_eq(breason(m, p, a, b), "group would exceed 16 inputs");
    cr_expect_eq(p->groups[grp(m, p, a)].ninputs, KF_PLAN_MAX_INPUTS);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_exceed_the_output_cap) {
    char t[4096];
    size_t n = (size_t)snprintf(t, sizeof t, "opset 17\ninput x float[4]\ny0 = Relu(x)\n");
    for (int i = 1; i <= KF_PLAN_MAX_OUTPUTS + 1; i++) n += (size_t)snprintf(t + n, sizeof t - n, "y%d = Relu(y%d)\n", i, i - 1);
    for (int i = 0; i <= KF_PLAN_MAX_OUTPUTS + 1; i++) n += (size_t)snprintf(t + n, sizeof t - n, "output y%d\n", i);
    kf_model *m = gt_parse(t);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    char a[16], b[16];
    snprintf(a, sizeof a, "y%d", KF_PLAN_MAX_OUTPUTS - 1);
    snprintf(b, sizeof b, "y%d", KF_PLAN_MAX_OUTPUTS);
    cr_expect_str_eq(breason(m, p, a, b), KF_REASON_OUTPUTS);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_exceed_the_register_estimate) {
    size_t cap = 64 * 400;
    char *t = malloc(cap);
    size_t n = (size_t)snprintf(t, cap, "opset 17\ninput x float[4]\ny0 = Relu(x)\n");
    for (int i = 1; i < 300; i++) n += (size_t)snprintf(t + n, cap - n, "y%d = Relu(y%d)\n", i, i - 1);
    snprintf(t + n, cap - n, "output y299\n");
    kf_model *m = gt_parse(t);
    free(t);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_eq(p->nbounds, 1);
    cr_expect_str_eq(p->bounds[0].reason, KF_REASON_REGS);
    cr_expect_str_eq(p->bounds[0].reason, "estimated registers exceed the cap");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_guess_an_unknown_reduction_space) {
    /* Reshape to a data-dependent shape; the Softmax result is then added
     * to another unknown shape: nothing proves the Add matches its rows */
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[2, 8]\n"
                           "input s int64[2]\n"
                           "input q float[4, 4]\n"
                           "input s2 int64[2]\n"
                           "y = Reshape(x, s)\n"
                           "q2 = Reshape(q, s2)\n"
                           "w = Softmax(y) {axis=-1}\n"
                           "z = Add(w, q2)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "w", "z"), KF_REASON_SHAPES_RED);
    cr_expect_str_eq(breason(m, p, "w", "z"),
                     "shapes unknown: cannot prove the elementwise op matches the reduction's iteration space");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_guess_unknown_elementwise_spaces) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[2, 8]\n"
                           "input s int64[2]\n"
                           "input q float[4, 4]\n"
                           "y = Reshape(x, s)\n"
                           "r = Add(y, q)\n"
                           "output r\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "y", "r"), KF_REASON_SHAPES);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_fuse_different_iteration_spaces) {
    /* the reduction's output [4] is broadcast to [3, 4]: neither its input
     * [4, 8] nor its output space */
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "input q float[3, 4]\n"
                           "r = ReduceMax(x) {axes=[1], keepdims=0}\n"
                           "z = Add(r, q)\n"
                           "output z\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "r", "z"), KF_REASON_SPACE);
    cr_expect_str_eq(breason(m, p, "r", "z"), "different iteration spaces");
    kf_plan_free(p);
    kf_model_free(m);
}

/* A mask's Cast and Reshape ([2, 9] -> [2, 1, 1, 9]) read through a
 * broadcast by And over [2, 1, 9, 9]: the small producer joins its
 * reader, which walks the larger space. It stays apart when its result is
 * also a graph output (stored in its own space), when it is too long to
 * recompute per element, and when a layout op reads it (indexing it by its
 * own shape, not through a broadcast). */
Test(plan_fuse, small_producer_read_through_a_broadcast_joins_its_reader) {
    const char *head = "opset 13\ninput ids int64[2, 9]\nconst shp int64[4] = 2 1 1 9\n"
                       "const tri bool[1, 1, 9, 1] = 1 1 0 1 1 0 1 1 1\nconst shp2 int64[2] = 2 81\n";
    const char *body[4] = {
        "c = Cast(ids) {to=9}\nr = Reshape(c, shp)\na = And(tri, r)\noutput a\n",
        "c = Cast(ids) {to=9}\nr = Reshape(c, shp)\na = And(tri, r)\noutput a\noutput r\n",
        "c = Cast(ids) {to=9}\nn1 = Not(c)\nn2 = Not(n1)\nn3 = Not(n2)\nr = Reshape(n3, shp)\na = And(tri, r)\noutput a\n",
        "c = Cast(ids) {to=9}\nr = Reshape(c, shp)\na = And(tri, r)\nf = Reshape(a, shp2)\nx = Xor(f, f)\noutput x\n",
    };
    for (int i = 0; i < 4; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", head, body[i]);
        kf_model *m = gt_parse(text);
        kf_plan *p = plan(m);
        check_invariants(m, p);
        if (i == 0) {
            cr_expect_eq(p->ngroups, 1, "the mask is one kernel");
        } else if (i < 3) {
            cr_expect_neq(grp(m, p, "r"), grp(m, p, "a"), "case %d", i);
            cr_expect_str_eq(breason(m, p, "r", "a"), KF_REASON_SPACE, "case %d", i);
        } else {
            cr_expect_eq(grp(m, p, "r"), grp(m, p, "a"), "the And still takes it");
        }
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* A ReduceMean after a GEMM (a decomposed RMSNorm) has no row epilogue in
 * the generated anchor: refused without a library. With the target's
 * library the epilogue is a kernel of its own after the call, which
 * computes any reduction, so the merge is legal there; a device without
 * the library (OpenCL) plans as if there were none. */
Test(plan_reason, does_not_give_a_generated_anchor_a_reduce_mean_epilogue) {
    kf_model *m = gt_parse("opset 17\ninput x float[128, 64]\nconst w float[64, 64] = random\n"
                           "y = MatMul(x, w)\nr = ReduceMean(y) {axes=[-1], keepdims=1}\noutput r\n");
    kf_plan_options o = {.fuel = -1};
    kf_plan *p = plan_opts(m, &o);
    check_invariants(m, p);
    cr_expect_str_eq(breason(m, p, "y", "r"), KF_REASON_RED_KIND);
    kf_plan_free(p);
    o.target = "h200", o.legal_only = true;
    p = plan_opts(m, &o);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "r"), "the library call's epilogue kernel reduces");
    kf_plan_free(p);
    o.no_library = true;
    p = plan_opts(m, &o);
    cr_expect_str_eq(breason(m, p, "y", "r"), KF_REASON_RED_KIND);
    kf_plan_free(p);
    kf_model_free(m);
}

/* SwiGLU on a merged gate/up product (one MatMul, a Split, silu(gate) *
 * up) and `Transpose(y) + y`: an epilogue op combining two parts of the
 * product's output, which a generated GEMM (one output element at a time)
 * cannot compute, so without a library it stays out; the library call's
 * epilogue kernel reads the output from memory and takes it. */
Test(plan_reason, does_not_give_a_generated_anchor_an_epilogue_over_two_parts) {
    const char *text[2] = {"opset 13\ninput x float[16, 32]\nconst w float[32, 64] = random\n"
                           "y = MatMul(x, w)\ng, u = Split(y) {axis=1}\nsg = Sigmoid(g)\nsl = Mul(g, sg)\n"
                           "o = Mul(sl, u)\noutput o\n",
                           "opset 13\ninput x float[16, 32]\nconst w float[32, 16] = random\n"
                           "y = MatMul(x, w)\nt = Transpose(y) {perm=[1,0]}\no = Add(t, y)\noutput o\n"};
    for (int i = 0; i < 2; i++) {
        kf_model *m = gt_parse(text[i]);
        kf_plan_options o = {.fuel = -1};
        kf_plan *p = plan_opts(m, &o);
        check_invariants(m, p);
        cr_expect_neq(grp(m, p, "y"), grp(m, p, "o"), "case %d", i);
        kf_plan_free(p);
        o.target = "h200", o.legal_only = true;
        p = plan_opts(m, &o);
        cr_expect_eq(grp(m, p, "y"), grp(m, p, "o"), "case %d: one library call and its epilogue kernel", i);
        kf_plan_free(p);
        o.no_library = true;
        p = plan_opts(m, &o);
        cr_expect_neq(grp(m, p, "y"), grp(m, p, "o"), "case %d", i);
        kf_plan_free(p);
        kf_model_free(m);
    }
    /* a transposed input is no part of the product: it joins */
    kf_model *m = gt_parse("opset 13\ninput x float[16, 32]\ninput u float[16, 16]\nconst w float[32, 16] = random\n"
                           "y = MatMul(x, w)\nt = Transpose(u) {perm=[1,0]}\no = Add(y, t)\noutput o\n");
    kf_plan_options o = {.fuel = -1};
    kf_plan *p = plan_opts(m, &o);
    cr_expect_eq(grp(m, p, "y"), grp(m, p, "o"));
    cr_expect_eq(grp(m, p, "t"), grp(m, p, "o"));
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_merge_siblings_without_a_shared_input) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[4, 8]\n"
                           "input y float[4, 8]\n"
                           "a = Relu(x)\n"
                           "b = Relu(y)\n"
                           "output a\n"
                           "output b\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_eq(p->launches, 1, "independent small groups are batched");
    cr_expect_str_eq(kf_plan_merge_reason(p, grp(m, p, "a"), grp(m, p, "b"), true), KF_REASON_H_NO_SHARED);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_reason, does_not_merge_a_reduction_sideways) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[4, 8]\n"
                           "a = Softmax(x) {axis=-1}\n"
                           "b = Relu(x)\n"
                           "output a\n"
                           "output b\n");
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_str_eq(kf_plan_merge_reason(p, grp(m, p, "a"), grp(m, p, "b"), true), KF_REASON_H_KIND);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ---- switches ------------------------------------------------------------------ */

static const char *CHAIN3 = "opset 17\n"
                            "input x float[4, 8]\n"
                            "a = Exp(x)\n"
                            "b = Relu(a)\n"
                            "c = Neg(b)\n"
                            "output c\n";

Test(plan_switch, disable_fusion_gives_one_group_per_node) {
    setenv("KFUSE_DISABLE_FUSION", "1", 1);
    kf_plan_options o;
    kf_plan_options_default(&o);
    cr_expect(o.disable);
    kf_model *m = gt_parse(CHAIN3);
    kf_plan *p = plan_opts(m, &o);
    check_invariants(m, p);
    cr_expect_eq(p->ngroups, 3);
    cr_expect_eq(p->launches, 3);
    cr_expect_eq(p->merges, 0);
    cr_expect_str_eq(breason(m, p, "a", "b"), KF_REASON_DISABLED);
    cr_expect_eq(p->bytes_fused, p->bytes_unfused);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_switch, fuel_stops_after_n_merges) {
    setenv("KFUSE_FUEL", "1", 1);
    setenv("KFUSE_TRACE", "rules,fusion", 1);
    kf_plan_options o;
    kf_plan_options_default(&o);
    cr_expect_eq(o.fuel, 1);
    cr_expect(o.trace);
    kf_model *m = gt_parse(CHAIN3);
    kf_plan *p = plan_opts(m, &o);
    check_invariants(m, p);
    cr_expect_eq(p->merges, 1);
    cr_expect_eq(p->ngroups, 2);
    cr_expect_eq(grp(m, p, "a"), grp(m, p, "b"));
    cr_expect_str_eq(breason(m, p, "b", "c"), KF_REASON_FUEL);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_switch, defaults_without_environment) {
    unsetenv("KFUSE_DISABLE_FUSION");
    unsetenv("KFUSE_FUEL");
    setenv("KFUSE_TRACE", "rules", 1);
    kf_plan_options o;
    kf_plan_options_default(&o);
    cr_expect(!o.disable);
    cr_expect_lt(o.fuel, 0);
    cr_expect(!o.trace);
}

/* ---- invariants on real models ---------------------------------------------------- */

static kf_model *load_optimized(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    kf_model *m;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    oo.fuel = -1;
    oo.trace = false;
    kf_opt_result r;
    cr_assert_eq(kf_optimize(m, &oo, &r), KF_OK, "%s", kf_last_error());
    kf_rules_free(&r.rules);
    return m;
}

Test(plan_models, bert_plan_is_valid_and_fuses) {
    kf_model *m = load_optimized(BERT);
    if (!m) cr_skip_test("../shared/models is not beside the repository (%s)", BERT);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_lt(p->launches * 2, p->nodes, "launches %u vs nodes %u", p->launches, p->nodes);
    cr_expect_gt(p->bytes_fused, 0);
    cr_expect_lt(p->bytes_fused, p->bytes_unfused);
    cr_expect_geq(p->bytes_fused, p->bytes_lower_bound);
    /* every LayerNormalization took its bias + residual Add prologue or sits
     * right after an anchor group holding them */
    uint32_t ln = 0;
    for (uint32_t k = 0; k < p->ngroups; k++)
        if (p->groups[k].kind == KF_GROUP_REDUCTION) ln++;
    cr_expect_gt(ln, 0);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_models, mnist_plan_is_valid) {
    kf_model *m = load_optimized(MNIST);
    if (!m) cr_skip_test("../shared/models is not beside the repository (%s)", MNIST);
    kf_plan *p = plan(m);
    check_invariants(m, p);
    cr_expect_lt(p->launches, p->nodes);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(plan_models, same_plan_twice) {
    kf_model *m = load_optimized(BERT);
    if (!m) cr_skip_test("../shared/models is not beside the repository (%s)", BERT);
    kf_plan *a = plan(m), *b = plan(m);
    cr_assert_eq(a->ngroups, b->ngroups);
    cr_assert_eq(a->nbounds, b->nbounds);
    cr_expect_eq(a->launches, b->launches);
    for (kf_id x = 1; x < m->graph->nnodes; x++) cr_expect_eq(a->group_of[x], b->group_of[x]);
    for (uint32_t i = 0; i < a->nbounds; i++) {
        cr_expect_eq(a->bounds[i].value, b->bounds[i].value);
        cr_expect_str_eq(a->bounds[i].reason, b->bounds[i].reason);
    }
    kf_plan_free(a);
    kf_plan_free(b);
    kf_model_free(m);
}

/* A long elementwise chain is split by the register cap into groups of a
 * bounded size. Speed is measured in bench/, not asserted here; the
 * timeout only turns an accidental quadratic loop into a failure rather
 * than a hang. */
Test(plan_models, long_chain_is_split_by_the_register_cap, .timeout = 120) {
    enum { N = 100000 };
    kf_model *m = gt_parse("opset 17\ninput x float[64]\n");
    kf_graph *g = m->graph;
    kf_id prev = kf_graph_find(g, "x");
    kf_op relu = kf_op_lookup("", "Relu");
    for (int i = 0; i < N; i++) {
        char nm[32];
        kf_id y, nd;
        snprintf(nm, sizeof nm, "v%d", i);
        cr_assert_eq(kf_graph_add_value(g, nm, &y), KF_OK);
        cr_assert_eq(kf_graph_add_node(g, "Relu", "", NULL, &prev, 1, &y, 1, &nd), KF_OK);
        g->nodes[nd].op = relu;
        g->nodes[nd].opset = 17;
        prev = y;
    }
    cr_assert_eq(kf_graph_mark_output(g, prev), KF_OK);
    clock_t t0 = clock();
    kf_plan *p = plan(m);
    double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
    check_invariants(m, p);
    cr_log_info("planning %d nodes took %.2f s of CPU", N, dt);
    cr_expect_lt(p->ngroups, N / 100);
    cr_expect_gt(p->ngroups, 1, "the cap splits a chain this long");
    kf_plan_free(p);
    kf_model_free(m);
}

/* A Gather reads the rows it selects, not the whole table: the cost model
 * and the lower bound charge 4 rows of a 1000-row embedding table. */
Test(plan_fuse, gather_is_charged_for_the_rows_it_reads) {
    kf_model *m = gt_parse("input ids int64[4]\n"
                           "const table float[1000, 16] = random\n"
                           "e = Gather(table, ids)\n"
                           "y = Relu(e)\n"
                           "output y\n");
    kf_plan *p = plan(m);
    const kf_group *G = &p->groups[grp(m, p, "y")];
    int64_t rows = 4 * 16 * 4, ids = 4 * 8;
    cr_assert_eq(G->bytes_read, rows + ids, "read %lld bytes", (long long)G->bytes_read);
    cr_assert_eq(p->bytes_lower_bound, rows + ids + rows, "lower bound %lld", (long long)p->bytes_lower_bound);
    kf_plan_free(p);
    kf_model_free(m);
}

/* A node the loader carried without judgement (an opset newer than kfuse
 * implements, here with too few inputs) is opaque to the planner, so codegen
 * never reads its inputs by position (fuzz finding, session 3: a one-input
 * Gemm at opset 36 was planned as an anchor and codegen read input 1). */
Test(plan_fuse, malformed_or_unknown_version_node_is_opaque) {
    kf_model *m = gt_parse("opset 13\ninput a float[2, 4]\ninput b float[4, 3]\ny = Gemm(a, b)\nr = Relu(y)\noutput r\n");
    kf_id y = kf_graph_find(m->graph, "y");
    kf_node *n = &m->graph->nodes[m->graph->values[y].producer];
    cr_assert_not_null(kf_node_op(n));
    kf_plan *p = plan(m);
    cr_assert_eq(p->groups[grp(m, p, "y")].kind, KF_GROUP_ANCHOR);
    kf_plan_free(p);
    int64_t opset = n->opset;
    n->opset = 36; /* beyond every version kfuse implements */
    cr_assert_null(kf_node_op(n));
    p = plan(m);
    cr_assert_eq(p->groups[grp(m, p, "y")].kind, KF_GROUP_OPAQUE);
    char why[256];
    cr_assert_not_null(kf_cg_unsupported(m, p, grp(m, p, "y"), why, sizeof why));
    kf_plan_free(p);
    n->opset = opset;
    n->nin = 1; /* too few inputs for Gemm at a version kfuse knows */
    cr_assert_null(kf_node_op(n));
    p = plan(m);
    cr_assert_eq(p->groups[grp(m, p, "y")].kind, KF_GROUP_OPAQUE);
    kf_plan_free(p);
    n->nin = 2;
    kf_model_free(m);
}
