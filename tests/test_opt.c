/* test_opt.c: the optimizer pipeline: names the caller keeps survive,
 * the opset is raised when (and only when) a rule needs it, and fuel stops
 * the whole pipeline. */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_opt.h"

/* erf-form Gelu as PyTorch exports it, at opset 13 */
static const char *gelu13 = "opset 13\n"
                            "input x float[2, 8]\n"
                            "const s float[] = 1.4142135\n"
                            "const one float[] = 1\n"
                            "const half float[] = 0.5\n"
                            "d = Div(x, s)\n"
                            "e = Erf(d)\n"
                            "a = Add(e, one)\n"
                            "h = Mul(x, half)\n"
                            "y = Mul(h, a)\n"
                            "output y\n";

static kf_opt_result run(kf_model *m, kf_opt_options *o) {
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, o, &res), KF_OK, "%s", kf_last_error());
    return res;
}

Test(opt, raises_the_opset_for_a_rule_that_needs_it) {
    kf_model *m = gt_parse(gelu13);
    kf_model *orig = gt_copy(m);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(res.opset_before, 13);
    cr_assert_eq(res.opset_after, 20);
    cr_assert_eq(kf_model_opset(m, ""), 20);
    cr_assert_eq(gt_count(m, "Gelu"), 1);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    gt_expect_same_outputs(orig, m, 1e-5, 1e-4);
    kf_rules_free(&res.rules);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(opt, does_not_raise_when_told_not_to) {
    kf_model *m = gt_parse(gelu13);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    o.no_raise = true;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(kf_model_opset(m, ""), 13);
    cr_assert_eq(gt_count(m, "Gelu"), 0);
    cr_assert_eq(gt_count(m, "Erf"), 1);
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

Test(opt, kept_names_survive_and_stay_off_the_outputs) {
    kf_model *m = gt_parse(gelu13);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    const char *keep[1] = {"e"};
    o.keep = keep;
    o.nkeep = 1;
    kf_opt_result res = run(m, &o);
    const kf_graph *g = m->graph;
    kf_id e = kf_graph_find(g, "e");
    cr_assert_neq(e, 0);
    cr_assert_neq(g->values[e].producer, 0, "the kept value is still computed");
    cr_assert_eq(g->nodes[g->values[e].producer].op, kf_op_lookup("", "Erf"));
    cr_assert_eq(g->noutputs, 1, "kept names are not added to the outputs");
    cr_assert(!g->values[e].is_output);
    cr_assert_eq(gt_count(m, "Gelu"), 0, "the Gelu rule declines: its intermediate is kept");
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

Test(opt, fuel_zero_changes_nothing) {
    kf_model *m = gt_parse(gelu13);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = 0;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(res.rewrites, 0);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 5);
    cr_assert_eq(kf_model_opset(m, ""), 13);
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

/* KFUSE_FUEL, KFUSE_TRACE and KFUSE_DISABLE_PASSES set the defaults (each
 * Criterion test runs in its own process, so the environment is its own). */
Test(opt, defaults_come_from_the_environment) {
    setenv("KFUSE_FUEL", "1", 1);
    setenv("KFUSE_TRACE", "fusion,rules", 1);
    setenv("KFUSE_DISABLE_PASSES", "cse,fold", 1);
    kf_opt_options o;
    kf_opt_options_default(&o);
    cr_assert_eq(o.fuel, 1);
    cr_assert(o.trace);
    cr_assert_str_eq(o.disable, "cse,fold");
    kf_model *m = gt_parse(gelu13);
    kf_opt_result res = run(m, &o);
    cr_assert_eq(res.rewrites, 1, "fuel 1 allows one rewrite, got %llu", (unsigned long long)res.rewrites);
    cr_assert_lt(kf_graph_live_nodes(m->graph), 5);
    kf_rules_free(&res.rules);
    kf_model_free(m);
    setenv("KFUSE_TRACE", "fusion", 1);
    unsetenv("KFUSE_FUEL");
    kf_opt_options_default(&o);
    cr_assert_eq(o.fuel, -1);
    cr_assert(!o.trace, "'fusion' alone does not trace the rules");
}

Test(opt, keeping_a_name_the_model_lacks_is_an_error_naming_it) {
    kf_model *m = gt_parse(gelu13);
    kf_opt_options o;
    kf_opt_options_default(&o);
    const char *keep[2] = {"e", "no_such_value"};
    o.keep = keep;
    o.nkeep = 2;
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, &o, &res), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "'no_such_value'"), "%s", kf_last_error());
    cr_assert_eq(kf_graph_live_nodes(m->graph), 5, "nothing was rewritten");
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

Test(opt, without_builtin_rules_only_the_graph_passes_run) {
    kf_model *m = gt_parse(gelu13);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    o.no_builtin = true;
    kf_opt_result res = run(m, &o);
    cr_assert_gt(res.rules.n, 0, "the graph passes report as rules");
    for (uint32_t i = 0; i < res.rules.n; i++)
        cr_assert_eq(res.rules.rules[i]->nsrc, 0, "rule '%s' has a pattern", res.rules.rules[i]->name);
    cr_assert_eq(gt_count(m, "Gelu"), 0);
    cr_assert_eq(gt_count(m, "Erf"), 1);
    cr_assert_eq(kf_model_opset(m, ""), 13, "no rule asked for a higher opset");
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

/* BERT-style attention at opset 17, [B, H, S, D] with an additive mask */
static const char *attention17 = "input q float[B, 2, S, 4]\n"
                                 "input k float[B, 2, S, 4]\n"
                                 "input v float[B, 2, S, 4]\n"
                                 "input mask float[B, 1, 1, S]\n"
                                 "const c float[] = 0.5\n"
                                 "kt = Transpose(k) {perm=[0, 1, 3, 2]}\n"
                                 "s = MatMul(q, kt)\n"
                                 "t = Mul(s, c)\n"
                                 "a = Add(t, mask)\n"
                                 "p = Softmax(a) {axis=-1}\n"
                                 "y = MatMul(p, v)\n"
                                 "output y\n";

/* The attention rules are opt_in: the default pipeline (which `kfuse
 * run`, `fuse` and `compile` use) keeps the decomposed form the planner
 * fuses, and does not raise the opset for them. */
Test(opt, attention_rules_do_not_run_unasked) {
    kf_model *m = gt_parse(attention17);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(gt_count(m, "Attention"), 0);
    cr_assert_eq(gt_count(m, "Softmax"), 1);
    cr_assert_eq(kf_model_opset(m, ""), 17, "no rule that runs asked for a higher opset");
    cr_assert_eq(gt_hits(&res.rules, "attention_mul_mask"), 0);
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

Test(opt, asked_opset_raises_and_runs_the_attention_rules) {
    kf_model *m = gt_parse(attention17);
    kf_model *orig = gt_copy(m);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    o.opset = 23;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(res.opset_before, 17);
    cr_assert_eq(res.opset_after, 23);
    cr_assert_eq(res.raise_declined[0], 0, "%s", res.raise_declined);
    cr_assert_eq(gt_count(m, "Attention"), 1);
    cr_assert_eq(gt_count(m, "Softmax"), 0);
    cr_assert_eq(gt_count(m, "MatMul"), 0);
    cr_assert_eq(gt_count(m, "Transpose"), 0, "K^T transposed back to K: the two Transposes compose away");
    cr_assert_eq(gt_hits(&res.rules, "attention_mul_mask"), 1);
    gt_expect_same_outputs(orig, m, 1e-5, 1e-4);
    kf_rules_free(&res.rules);
    kf_model_free(m);
    kf_model_free(orig);
}

/* A model the raise cannot take to 23 (a node whose schema history kfuse
 * does not know) keeps its opset, and the rules needing 23 do not fire. */
Test(opt, asked_opset_that_cannot_be_reached_leaves_attention_decomposed) {
    char text[2048];
    /* GroupNormalization-18's scale and bias per group became per channel at 21 */
    snprintf(text, sizeof text, "opset 18\n%s%s", attention17,
             "const g float[2] = 1.5\nz = GroupNormalization(v, g, g) {num_groups=2}\noutput z\n");
    kf_model *m = gt_parse(text);
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.fuel = -1;
    o.opset = 23;
    kf_opt_result res = run(m, &o);
    cr_assert_eq(kf_model_opset(m, ""), 18);
    cr_assert(strstr(res.raise_declined, "opset 23 not reached") && strstr(res.raise_declined, "GroupNormalization"),
              "%s", res.raise_declined);
    cr_assert_eq(gt_count(m, "Attention"), 0);
    cr_assert_eq(gt_count(m, "Softmax"), 1);
    cr_assert(strstr(gt_reasons(&res.rules, "attention_mul_mask"), "needs opset 23"), "%s",
              gt_reasons(&res.rules, "attention_mul_mask"));
    kf_rules_free(&res.rules);
    kf_model_free(m);
}

/* The rules retry only where edits reached (rewrite.c). Here the sibling
 * MatMuls become mergeable only when folding makes b's weight a constant,
 * an edit upstream of b alone: b must be woken, and the merge from b must
 * give the model that trying every node every sweep (from a) gives. */
Test(opt, retrying_where_edits_reached_wakes_the_siblings_of_a_folded_weight) {
    static const char *text = "input x float[2, 4]\n"
                              "const wa float[4, 3] = random\n"
                              "const w1 float[4, 5] = random\n"
                              "const w2 float[4, 5] = random\n"
                              "wb = Add(w1, w2)\n"
                              "a = MatMul(x, wa)\n"
                              "b = MatMul(x, wb)\n"
                              "output a, b\n";
    void *bytes[2];
    size_t len[2];
    kf_model *orig = gt_parse(text); /* parsed once: its random constants are the same in both runs */
    for (int every = 0; every < 2; every++) {
        kf_model *m = gt_copy(orig);
        kf_opt_options o;
        kf_opt_options_default(&o);
        o.fuel = -1;
        o.every_node = every;
        kf_opt_result res = run(m, &o);
        cr_assert_eq(gt_count(m, "MatMul"), 1, "the siblings merge (every node: %d)", every);
        cr_assert_eq(kf_model_save_memory(m, &bytes[every], &len[every]), KF_OK);
        kf_rules_free(&res.rules);
        kf_model_free(m);
    }
    cr_assert(len[0] == len[1] && !memcmp(bytes[0], bytes[1], len[0]),
              "retrying where edits reached gives another model than trying every node");
    free(bytes[0]);
    free(bytes[1]);
    kf_model_free(orig);
}
