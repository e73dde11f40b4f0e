/*
 * test_pass_norms.c: the built-in rules that recognise decomposed Gelu
 * (erf and tanh), LayerNorm, RMSNorm and Softmax as exporters write them
 * (fusion/patterns/gelu.kfp, norms.kfp, softmax.kfp), and the rule-language
 * additions they use ($constant attribute values, last_axis on an axes
 * input, attribute guards with a default). Each rule family: a positive
 * test (op counts and outputs equal to the original) and does_not_* tests
 * that check the near-miss reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "graph_text.h"
#include "kf_opt.h"

#define ATOL 1e-5
#define RTOL 1e-4

static kf_ruleset builtin(void) {
    kf_ruleset rs = {0};
    cr_assert_eq(kf_rules_add_builtin(&rs), KF_OK, "%s", kf_last_error());
    return rs;
}

/* Runs the built-in rules on a copy of the model's text; returns the copy. */
static kf_model *rewrite(const char *text, kf_ruleset *rs, kf_model **orig) {
    kf_model *m = gt_parse(text);
    *orig = gt_copy(m);
    kf_rewrite_opts o = {-1, false};
    kf_rules_reset_stats(rs);
    cr_assert_eq(kf_rewrite(m, rs, &o, NULL), KF_OK, "rewrite: %s", kf_last_error());
    return m;
}

static const kf_rule *rule_named(const kf_ruleset *rs, const char *name) {
    for (uint32_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->rules[i]->name, name)) return rs->rules[i];
    cr_assert_fail("no rule %s", name);
    return NULL;
}

/* True when rule `name` recorded a near miss whose reason contains `what`. */
static bool near_miss(const kf_ruleset *rs, const char *name, const char *what) {
    const kf_rule *r = rule_named(rs, name);
    for (int i = 0; i < r->nnear; i++)
        if (strstr(r->near[i].reason, what)) return true;
    for (int i = 0; i < r->nnear; i++) fprintf(stderr, "  %s: %s\n", name, r->near[i].reason);
    return false;
}

/* out = text with every `from` replaced by `to`. */
static void subst(const char *text, const char *from, const char *to, char *out, size_t n) {
    size_t k = 0, lf = strlen(from), lt = strlen(to);
    for (const char *p = text; *p && k + lt + 1 < n;) {
        if (!strncmp(p, from, lf)) {
            memcpy(out + k, to, lt);
            k += lt;
            p += lf;
        } else {
            out[k++] = *p++;
        }
    }
    out[k] = 0;
}

static const kf_node *first(const kf_model *m, const char *op) {
    for (kf_id i = 1; i < m->graph->nnodes; i++)
        if (!m->graph->nodes[i].dead && !strcmp(m->graph->nodes[i].op_type, op)) return &m->graph->nodes[i];
    cr_assert_fail("no %s", op);
    return NULL;
}

/* ---- Gelu ------------------------------------------------------------------ */

/* PyTorch / ONNX Runtime's gelu.onnx: x * 0.5 * (1 + erf(x / sqrt 2)), bias in front */
static const char *gelu_erf =
    "opset 20\n"
    "input a float[2, S, 8]\n"
    "input bias float[8]\n"
    "const s float[1] = 1.4142135\n"
    "const one float[1] = 1\n"
    "const half float[1] = 0.5\n"
    "x = Add(a, bias)\n"
    "d = Div(x, s)\n"
    "e = Erf(d)\n"
    "h = Mul(x, half)\n"
    "p = Add(e, one)\n"
    "y = Mul(h, p)\n"
    "output y\n";

Test(pass_norms, gelu_erf_with_bias_add_kept) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite(gelu_erf, &rs, &orig);
    cr_assert_eq(gt_count(m, "Gelu"), 1);
    cr_assert_eq(gt_count(m, "Erf") + gt_count(m, "Mul") + gt_count(m, "Div"), 0);
    cr_assert_eq(gt_count(m, "Add"), 1, "the bias Add stays");
    cr_assert_str_eq(kf_attr_s(first(m, "Gelu"), "approximate", "none"), "none");
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, gelu_erf_tf_cdf_form_with_mul_by_inverse_sqrt2) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 20\n"
                                 "input x float[3, 16]\n"
                                 "const s float[] = 0.70710678\n"
                                 "const one float[] = 1\n"
                                 "const half float[] = 0.5\n"
                                 "d = Mul(s, x)\n"
                                 "e = Erf(d)\n"
                                 "p = Add(one, e)\n"
                                 "cdf = Mul(half, p)\n"
                                 "y = Mul(x, cdf)\n"
                                 "output y\n",
                                 &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    cr_assert_eq(gt_count(m, "Gelu"), 1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_gelu_with_another_constant) {
    kf_ruleset rs = builtin();
    char text[2048];
    subst(gelu_erf, "1.4142135", "1.4", text, sizeof text);
    kf_model *orig, *m = rewrite(text, &rs, &orig);
    cr_assert_eq(gt_count(m, "Gelu"), 0);
    cr_assert_eq(gt_count(m, "Erf"), 1);
    cr_assert(near_miss(&rs, "gelu_erf_div_half_x", "not a constant equal to 1.41421"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_gelu_below_opset_20) {
    kf_ruleset rs = builtin();
    char text[2048];
    snprintf(text, sizeof text, "opset 13%s", strchr(gelu_erf, '\n'));
    kf_model *orig, *m = rewrite(text, &rs, &orig);
    cr_assert_eq(gt_count(m, "Gelu"), 0);
    cr_assert(near_miss(&rs, "gelu_erf_div_half_x", "needs opset 20, the model imports 13"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* ONNX Runtime's fast_gelu.onnx: the tanh argument factored as
 * (x * sqrt(2/pi)) * (1 + 0.044715 * x * x) */
Test(pass_norms, gelu_tanh_factored_and_pow_forms) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 20\n"
                                 "input x float[2, 5, 8]\n"
                                 "const k1 float[1] = 0.044715\n"
                                 "const k2 float[1] = 0.7978846\n"
                                 "const one float[1] = 1\n"
                                 "const half float[1] = 0.5\n"
                                 "const three float[] = 3\n"
                                 "m1 = Mul(x, k1)\n"
                                 "m2 = Mul(x, m1)\n"
                                 "a1 = Add(m2, one)\n"
                                 "m3 = Mul(x, k2)\n"
                                 "m4 = Mul(m3, a1)\n"
                                 "t = Tanh(m4)\n"
                                 "a2 = Add(t, one)\n"
                                 "m5 = Mul(x, half)\n"
                                 "y = Mul(m5, a2)\n"
                                 /* PyTorch's form on y: 0.5 * z * (1 + tanh(k2 * (z + k1 * z^3))) */
                                 "c = Pow(y, three)\n"
                                 "q = Mul(c, k1)\n"
                                 "i = Add(y, q)\n"
                                 "b = Mul(i, k2)\n"
                                 "t2 = Tanh(b)\n"
                                 "u = Add(t2, one)\n"
                                 "w = Mul(y, u)\n"
                                 "z = Mul(w, half)\n"
                                 "output z\n",
                                 &rs, &orig);
    cr_assert_eq(gt_count(m, "Gelu"), 2);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 2);
    cr_assert_str_eq(kf_attr_s(first(m, "Gelu"), "approximate", ""), "tanh");
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_gelu_tanh_when_an_intermediate_is_shared) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 20\n"
                                 "input x float[4, 8]\n"
                                 "const k1 float[] = 0.044715\n"
                                 "const k2 float[] = 0.7978846\n"
                                 "const one float[] = 1\n"
                                 "const half float[] = 0.5\n"
                                 "const three float[] = 3\n"
                                 "c = Pow(x, three)\n"
                                 "q = Mul(c, k1)\n"
                                 "i = Add(x, q)\n"
                                 "b = Mul(i, k2)\n"
                                 "t = Tanh(b)\n"
                                 "u = Add(t, one)\n"
                                 "w = Mul(x, u)\n"
                                 "y = Mul(w, half)\n"
                                 "output y\n"
                                 "output t\n",
                                 &rs, &orig);
    cr_assert_eq(gt_count(m, "Gelu"), 0);
    cr_assert(near_miss(&rs, "gelu_tanh_pow_half_last", "is a graph output"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* ---- LayerNorm --------------------------------------------------------------- */

/* ONNX Runtime's layer_norm.onnx (PyTorch): keepdims left to its default */
static const char *ln_pytorch =
    "opset 17\n"
    "input x float[2, S, 16]\n"
    "input gamma float[16]\n"
    "input beta float[16]\n"
    "const two float[] = 2\n"
    "const eps float[] = 1e-12\n"
    "mu = ReduceMean(x) {axes=[-1]}\n"
    "d = Sub(x, mu)\n"
    "p = Pow(d, two)\n"
    "v = ReduceMean(p) {axes=[-1]}\n"
    "ve = Add(v, eps)\n"
    "s = Sqrt(ve)\n"
    "n = Div(d, s)\n"
    "g = Mul(gamma, n)\n"
    "y = Add(g, beta)\n"
    "output y\n";

Test(pass_norms, layernorm_pytorch_form_with_epsilon_from_the_constant) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite(ln_pytorch, &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    const kf_node *ln = first(m, "LayerNormalization");
    cr_assert_eq(ln->nin, 3);
    cr_assert_float_eq(kf_attr_f(ln, "epsilon", 0), 1e-12f, 1e-20);
    cr_assert_eq(kf_attr_i(ln, "axis", 0), -1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* TF: axes as inputs (opset 18), rsqrt as Reciprocal(Sqrt), d reused */
Test(pass_norms, layernorm_tf_form_with_axes_inputs) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 18\n"
                                 "input x float[3, 4, 12]\n"
                                 "input gamma float[12]\n"
                                 "input beta float[12]\n"
                                 "const axl int64[1] = 2\n"
                                 "const eps float[] = 0.001\n"
                                 "mu = ReduceMean(x, axl) {keepdims=1}\n"
                                 "d = Sub(x, mu)\n"
                                 "sq = Mul(d, d)\n"
                                 "v = ReduceMean(sq, axl)\n"
                                 "ve = Add(eps, v)\n"
                                 "s = Sqrt(ve)\n"
                                 "r = Reciprocal(s)\n"
                                 "rg = Mul(r, gamma)\n"
                                 "n = Mul(d, rg)\n"
                                 "y = Add(n, beta)\n"
                                 "output y\n",
                                 &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1, "%u nodes", kf_graph_live_nodes(m->graph));
    cr_assert_float_eq(kf_attr_f(first(m, "LayerNormalization"), "epsilon", 0), 1e-3f, 1e-9);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_layernorm_over_a_middle_axis) {
    kf_ruleset rs = builtin();
    char text[2048];
    subst(ln_pytorch, "axes=[-1]", "axes=[1]", text, sizeof text);
    kf_model *orig, *m = rewrite(text, &rs, &orig);
    cr_assert_eq(gt_count(m, "LayerNormalization"), 0);
    cr_assert(near_miss(&rs, "layernorm_div_attr", "not the last axis"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_layernorm_without_keepdims_or_below_opset_17) {
    kf_ruleset rs = builtin();
    /* keepdims=0 on the mean: Sub broadcasts [2] against [2, 16] */
    kf_model *m0;
    kf_model *m = rewrite("opset 17\n"
                          "input x float[16, 16]\n"
                          "input gamma float[16]\n"
                          "const eps float[] = 1e-5\n"
                          "mu = ReduceMean(x) {axes=[-1], keepdims=0}\n"
                          "d = Sub(x, mu)\n"
                          "sq = Mul(d, d)\n"
                          "v = ReduceMean(sq) {axes=[-1]}\n"
                          "ve = Add(v, eps)\n"
                          "s = Sqrt(ve)\n"
                          "n = Div(d, s)\n"
                          "y = Mul(n, gamma)\n"
                          "output y\n",
                          &rs, &m0);
    cr_assert_eq(gt_count(m, "LayerNormalization"), 0);
    cr_assert(near_miss(&rs, "layernorm_div_attr", "attribute differs"));
    kf_model_free(m0);
    kf_model_free(m);
    char low[2048];
    snprintf(low, sizeof low, "opset 13%s", strchr(ln_pytorch, '\n'));
    m = rewrite(low, &rs, &m0);
    cr_assert_eq(gt_count(m, "LayerNormalization"), 0);
    cr_assert(near_miss(&rs, "layernorm_div_attr", "needs opset 17, the model imports 13"));
    kf_model_free(m0);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* ---- RMSNorm ----------------------------------------------------------------- */

Test(pass_norms, rmsnorm_rsqrt_form) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 23\n"
                                 "input x float[2, 3, 8]\n"
                                 "input gamma float[8]\n"
                                 "const ax int64[1] = -1\n"
                                 "const eps float[] = 1e-6\n"
                                 "const one float[] = 1\n"
                                 "sq = Mul(x, x)\n"
                                 "v = ReduceMean(sq, ax)\n"
                                 "ve = Add(v, eps)\n"
                                 "s = Sqrt(ve)\n"
                                 "r = Div(one, s)\n"
                                 "n = Mul(x, r)\n"
                                 "y = Mul(gamma, n)\n"
                                 "output y\n",
                                 &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    cr_assert_float_eq(kf_attr_f(first(m, "RMSNormalization"), "epsilon", 0), 1e-6f, 1e-12);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* A matrix weight is not RMSNormalization's Scale: the norm is found, the
 * Mul by the weight stays. */
Test(pass_norms, does_not_fold_a_matrix_gamma_into_rmsnorm) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite("opset 23\n"
                                 "input x float[3, 8]\n"
                                 "input gamma float[3, 8]\n"
                                 "const ax int64[1] = -1\n"
                                 "const eps float[] = 1e-6\n"
                                 "sq = Mul(x, x)\n"
                                 "v = ReduceMean(sq, ax)\n"
                                 "ve = Add(v, eps)\n"
                                 "s = Sqrt(ve)\n"
                                 "n = Div(x, s)\n"
                                 "y = Mul(n, gamma)\n"
                                 "output y\n",
                                 &rs, &orig);
    cr_assert_eq(gt_count(m, "RMSNormalization"), 1);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 2);
    cr_assert(near_miss(&rs, "rmsnorm_fold_scale", "rank does not satisfy"));
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* Llama's RMSNorm as the dynamo exporter writes it (Pow, axes input,
 * Reciprocal(Sqrt), weight first; its opset 20 is raised to 23 by kf_optimize,
 * not by the rewrite driver tested here), in a freshly initialised model: the
 * weight is all ones, and mul_by_one removes its Mul before the norm is
 * matched. Its twin with a random weight folds the weight in. */
static const char *rms_dynamo = "opset 23\n"
                                "input x float[2, 8, 16]\n"
                                "const w1 float[16] = 1\n"
                                "input w2 float[16]\n"
                                "const two float[] = 2\n"
                                "const ax int64[1] = -1\n"
                                "const eps float[] = 1e-6\n"
                                "p = Pow(x, two)\n"
                                "v = ReduceMean(p, ax) {keepdims=1, noop_with_empty_axes=0}\n"
                                "ve = Add(v, eps)\n"
                                "s = Sqrt(ve)\n"
                                "r = Reciprocal(s)\n"
                                "n = Mul(x, r)\n"
                                "y = Mul(w1, n)\n"
                                "p2 = Pow(y, two)\n"
                                "v2 = ReduceMean(p2, ax) {keepdims=1, noop_with_empty_axes=0}\n"
                                "ve2 = Add(v2, eps)\n"
                                "s2 = Sqrt(ve2)\n"
                                "r2 = Reciprocal(s2)\n"
                                "n2 = Mul(y, r2)\n"
                                "z = Mul(w2, n2)\n"
                                "output z\n";

Test(pass_norms, rmsnorm_dynamo_form_with_unit_and_random_weights) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite(rms_dynamo, &rs, &orig);
    cr_assert_eq(gt_count(m, "RMSNormalization"), 2);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 2, "%u nodes", kf_graph_live_nodes(m->graph));
    cr_assert_eq(gt_hits(&rs, "rmsnorm_recip_mul_input"), 2);
    cr_assert_eq(gt_hits(&rs, "rmsnorm_fold_scale"), 1, "only the random weight is left to fold");
    cr_assert_eq(gt_hits(&rs, "mul_by_one"), 1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_rmsnorm_whose_mean_drops_the_axis) {
    kf_ruleset rs = builtin();
    char t1[2048], text[2048];
    /* x [16, 16]: the mean [16] still broadcasts against x */
    subst(rms_dynamo, "{keepdims=1, noop_with_empty_axes=0}\nve = ", "{keepdims=0}\nve = ", t1, sizeof t1);
    subst(t1, "[2, 8, 16]", "[16, 16]", text, sizeof text);
    kf_model *orig, *m = rewrite(text, &rs, &orig);
    cr_assert_eq(gt_count(m, "RMSNormalization"), 1, "only the second norm");
    cr_assert(near_miss(&rs, "rmsnorm_recip_mul_input", "attribute differs"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* ---- Softmax ----------------------------------------------------------------- */

static const char *softmax11 = "opset 11\n"
                               "input x float[2, 3, 7]\n"
                               "mx = ReduceMax(x) {axes=[2]}\n"
                               "d = Sub(x, mx)\n"
                               "e = Exp(d)\n"
                               "s = ReduceSum(e) {axes=[-1], keepdims=1}\n"
                               "y = Div(e, s)\n"
                               "output y\n";

Test(pass_norms, softmax_decomposed_at_opset_11_and_18) {
    kf_ruleset rs = builtin();
    kf_model *orig, *m = rewrite(softmax11, &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    cr_assert_eq(kf_attr_i(first(m, "Softmax"), "axis", 0), -1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    m = rewrite("opset 18\n"
                "input x float[4, 9]\n"
                "const a int64[1] = 1\n"
                "mx = ReduceMax(x, a)\n"
                "d = Sub(x, mx)\n"
                "e = Exp(d)\n"
                "s = ReduceSum(e, a)\n"
                "y = Div(e, s)\n"
                "output y\n",
                &rs, &orig);
    cr_assert_eq(kf_graph_live_nodes(m->graph), 1);
    cr_assert_eq(gt_count(m, "Softmax"), 1);
    gt_expect_same_outputs(orig, m, ATOL, RTOL);
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

Test(pass_norms, does_not_fuse_softmax_whose_sum_drops_the_axis) {
    kf_ruleset rs = builtin();
    char t1[1024], text[1024];
    subst(softmax11, "keepdims=1", "keepdims=0", t1, sizeof t1);
    /* Div(e[2,3,7], s[2,3]) would not even broadcast; [1, 7, 7] does */
    subst(t1, "[2, 3, 7]", "[1, 7, 7]", text, sizeof text);
    kf_model *orig, *m = rewrite(text, &rs, &orig);
    cr_assert_eq(gt_count(m, "Softmax"), 0);
    cr_assert(near_miss(&rs, "softmax_attr", "attribute differs"));
    kf_model_free(orig);
    kf_model_free(m);
    kf_rules_free(&rs);
}

/* ---- the rule-language additions ---------------------------------------------- */

Test(pass_norms, constant_values_are_for_replacements_only) {
    kf_ruleset rs = {0};
    const char *bad = "rule r\n  match\n    y = Neg(x) {alpha=$x}\n  replace\n    y = x\nend\n";
    cr_assert_eq(kf_rules_parse(&rs, bad, strlen(bad), "c.kfp"), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "c.kfp:3") && strstr(kf_last_error(), "replacements"), "%s", kf_last_error());
    /* $v of a constant with more than one element declines */
    const char *ok = "rule lrelu\n  match\n    m = Mul(x, k)\n    y = Max(x, m)\n  where\n    const k\n"
                     "  replace\n    y = LeakyRelu(x) {alpha=$k}\nend\n";
    cr_assert_eq(kf_rules_parse(&rs, ok, strlen(ok), "l.kfp"), KF_OK, "%s", kf_last_error());
    kf_model *m = gt_parse("input x float[4]\nconst k float[4] = 0.25\nm = Mul(x, k)\ny = Max(x, m)\noutput y\n");
    kf_rewrite_opts o = {-1, false};
    cr_assert_eq(kf_rewrite(m, &rs, &o, NULL), KF_OK);
    cr_assert_eq(gt_count(m, "LeakyRelu"), 0);
    cr_assert(strstr(rs.rules[0]->near[0].reason, "not a one-element constant"), "%s", rs.rules[0]->near[0].reason);
    kf_model_free(m);
    kf_rules_free(&rs);
}
