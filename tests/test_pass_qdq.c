/*
 * test_pass_qdq.c: the QuantizeLinear/DequantizeLinear rules of
 * fusion/patterns/qdq.kfp. Each rule has a positive test (Q/DQ counts
 * after the whole optimizer, kf_optimize, and outputs bitwise equal to the
 * original's on the reference evaluator, random float inputs) and a
 * does_not_* test checking the near-miss reason; a quantized small bench
 * model (`kfuse quantize`) loses one Q and one DQ per rule hit with its
 * outputs unchanged bit for bit.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "kf_opt.h"

/* The graphs quantize a float input, dequantize, run op(s), quantize again
 * with the same scale and zero point, and dequantize to a float output. */
#define QDQ_HEAD                                                                                                       \
    "opset 17\n"                                                                                                       \
    "const s float[] = 0.037\n"                                                                                        \
    "const z uint8[] = 131\n"                                                                                          \
    "q = QuantizeLinear(x, s, z)\n"                                                                                    \
    "d = DequantizeLinear(q, s, z)\n"

#define QDQ_TAIL                                                                                                       \
    "q2 = QuantizeLinear(t, s, z)\n"                                                                                   \
    "y = DequantizeLinear(q2, s, z)\n"                                                                                 \
    "output y\n"

static kf_status add_qdq(kf_ruleset *rs) { return kf_rules_load_file(rs, KF_SOURCE_DIR "/fusion/patterns/qdq.kfp"); }

/* The whole optimizer takes `rule` once, leaving one Q and one DQ, and
 * the op `op` on the integer type; outputs bitwise equal. */
static void expect_rewritten(const char *text, const char *rule, const char *op) {
    kf_model *m = gt_parse(text);
    kf_model *orig = gt_copy(m);
    cr_assert_eq(gt_count(m, "QuantizeLinear"), 2);
    kf_opt_options o;
    kf_opt_options_default(&o);
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, &o, &res), KF_OK, "%s", kf_last_error());
    cr_expect_eq(gt_hits(&res.rules, rule), 1, "rule %s: %s", rule, gt_reasons(&res.rules, rule));
    cr_expect_eq(gt_count(m, "QuantizeLinear"), 1, "%s", rule);
    cr_expect_eq(gt_count(m, "DequantizeLinear"), 1, "%s", rule);
    if (op) {
        uint32_t on_int = 0;
        for (kf_id n = 1; n < m->graph->nnodes; n++) {
            const kf_node *nd = &m->graph->nodes[n];
            if (!nd->dead && !strcmp(nd->op_type, op) && m->graph->values[nd->out[0]].type.dtype == KF_DT_UINT8) on_int++;
        }
        cr_expect_eq(on_int, 1, "%s: one %s on uint8", rule, op);
    }
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&res.rules);
    kf_model_free(m);
    kf_model_free(orig);
}

/* The qdq rules alone leave the Q/DQ in place, with reason `why`. */
static void expect_kept(const char *text, const char *rule, const char *why) {
    kf_model *m = gt_parse(text);
    kf_ruleset rs = gt_run_rules(m, add_qdq);
    cr_expect_eq(gt_count(m, "QuantizeLinear"), 2, "%s applied", rule);
    cr_expect(strstr(gt_reasons(&rs, rule), why), "rule %s: reason '%s', want '%s'", rule, gt_reasons(&rs, rule), why);
    kf_rules_free(&rs);
    kf_model_free(m);
}

Test(pass_qdq, cancel) {
    expect_rewritten("input x float[2, 3, 4]\n" QDQ_HEAD "t = Neg(d)\n"
                     "q2 = QuantizeLinear(d, s, z)\n"
                     "e = DequantizeLinear(q2, s, z)\n"
                     "y = Add(e, t)\n"
                     "output y\n",
                     "qdq_cancel", NULL);
}

Test(pass_qdq, cancel_per_axis) {
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 3, 4]\n"
                           "const s float[3] = 0.01 0.2 3.5\n"
                           "const z int8[3] = -7 0 100\n"
                           "q = QuantizeLinear(x, s, z) {axis=1}\n"
                           "d = DequantizeLinear(q, s, z) {axis=1}\n"
                           "q2 = QuantizeLinear(d, s, z) {axis=-2}\n"
                           "y = DequantizeLinear(q2, s, z) {axis=1}\n"
                           "output y\n");
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, add_qdq);
    /* axis 1 and -2 name the same axis here, but the guard compares the attributes */
    cr_expect_eq(gt_hits(&rs, "qdq_cancel"), 0);
    cr_expect(strstr(gt_reasons(&rs, "qdq_cancel"), "attributes differ"), "%s", gt_reasons(&rs, "qdq_cancel"));
    kf_rules_free(&rs);
    kf_model_free(m);
    m = gt_copy(orig);
    for (kf_id n = 1; n < m->graph->nnodes; n++)
        if (!strcmp(m->graph->nodes[n].op_type, "QuantizeLinear"))
            for (int k = 0; k < m->graph->nodes[n].nattrs; k++)
                if (!strcmp(m->graph->nodes[n].attrs[k].name, "axis")) m->graph->nodes[n].attrs[k].i = 1;
    rs = gt_run_rules(m, add_qdq);
    cr_expect_eq(gt_hits(&rs, "qdq_cancel"), 1, "%s", gt_reasons(&rs, "qdq_cancel"));
    cr_expect_eq(gt_count(m, "QuantizeLinear"), 1);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

Test(pass_qdq, does_not_cancel_different_scales) {
    expect_kept("input x float[2, 3]\n" QDQ_HEAD "const s2 float[] = 0.05\n"
                "q2 = QuantizeLinear(d, s2, z)\n"
                "y = DequantizeLinear(q2, s2, z)\n"
                "output y\n",
                "qdq_cancel", "must be the same value in both places");
}

Test(pass_qdq, relu_to_max) {
    expect_rewritten("input x float[2, 3, 4]\n" QDQ_HEAD "t = Relu(d)\n" QDQ_TAIL, "qdq_relu_to_max", "Max");
}

Test(pass_qdq, does_not_take_relu_per_axis) {
    expect_kept("input x float[2, 3]\n"
                "const s float[3] = 0.01 0.2 3.5\n"
                "const z uint8[3] = 7 0 200\n"
                "q = QuantizeLinear(x, s, z)\n"
                "d = DequantizeLinear(q, s, z)\n"
                "t = Relu(d)\n" QDQ_TAIL,
                "qdq_relu_to_max", "not a single element");
}

Test(pass_qdq, does_not_take_relu_with_a_negative_scale) {
    expect_kept("input x float[2, 3]\n"
                "const s float[] = -0.02\n"
                "const z uint8[] = 128\n"
                "q = QuantizeLinear(x, s, z)\n"
                "d = DequantizeLinear(q, s, z)\n"
                "t = Relu(d)\n" QDQ_TAIL,
                "qdq_relu_to_max", "does not satisfy the guard");
}

Test(pass_qdq, maxpool) {
    expect_rewritten("input x float[2, 3, 7, 6]\n" QDQ_HEAD
                     "t = MaxPool(d) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}\n" QDQ_TAIL,
                     "qdq_maxpool", "MaxPool");
}

Test(pass_qdq, reshape) {
    expect_rewritten("input x float[2, 3, 4]\n"
                     "const shape int64[2] = 6 -1\n" QDQ_HEAD "t = Reshape(d, shape)\n" QDQ_TAIL,
                     "qdq_reshape", "Reshape");
}

Test(pass_qdq, transpose) {
    expect_rewritten("input x float[2, 3, 4]\n" QDQ_HEAD "t = Transpose(d) {perm=[2, 0, 1]}\n" QDQ_TAIL,
                     "qdq_transpose", "Transpose");
}

Test(pass_qdq, squeeze_unsqueeze_flatten) {
    expect_rewritten("input x float[2, 1, 4]\n"
                     "const axes int64[1] = 1\n" QDQ_HEAD "t = Squeeze(d, axes)\n" QDQ_TAIL,
                     "qdq_squeeze", "Squeeze");
    expect_rewritten("input x float[2, 4]\n"
                     "const axes int64[1] = 1\n" QDQ_HEAD "t = Unsqueeze(d, axes)\n" QDQ_TAIL,
                     "qdq_unsqueeze", "Unsqueeze");
    expect_rewritten("input x float[2, 3, 4]\n" QDQ_HEAD "t = Flatten(d) {axis=2}\n" QDQ_TAIL, "qdq_flatten",
                     "Flatten");
}

Test(pass_qdq, concat) {
    kf_model *m = gt_parse("input x float[2, 3]\n"
                           "input x2 float[2, 5]\n" QDQ_HEAD "p = QuantizeLinear(x2, s, z)\n"
                           "e = DequantizeLinear(p, s, z)\n"
                           "t = Concat(d, e) {axis=1}\n" QDQ_TAIL);
    kf_model *orig = gt_copy(m);
    kf_ruleset rs = gt_run_rules(m, add_qdq);
    cr_expect_eq(gt_hits(&rs, "qdq_concat2"), 1, "%s", gt_reasons(&rs, "qdq_concat2"));
    cr_expect_eq(gt_count(m, "QuantizeLinear"), 2);
    cr_expect_eq(gt_count(m, "DequantizeLinear"), 1);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}

/* ---- a quantized bench model ------------------------------------------------------ */

static char bin[PATH_MAX], out[65536], dir[PATH_MAX];

static void cli_setup(void) { tu_cli_setup("pass_qdq", bin, sizeof bin, dir, sizeof dir); }

static void cli_cleanup(void) { tu_cli_dir_remove(dir); }

/* `kfuse quantize` with MaxPool included writes DQ -> MaxPool -> Q, the
 * output's scale and zero point a separate pair of initializers equal to
 * the input's (a MaxPool's range is its input's); CSE merges them, then the
 * rules remove one Q and one DQ per hit and leave the outputs bit for bit
 * (constant folding, which would dequantize the weights, is off). */
Test(pass_qdq, quantized_small_resnet50, .init = cli_setup, .fini = cli_cleanup) {
    int rc = tu_cli_runf(bin, out, sizeof out,
                         "quantize %s/bench/models/small/resnet50/model.onnx -o %s/q.onnx --random 2 --include MaxPool "
                         "--dim batch=2",
                         tu_source_dir(), dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/q.onnx", dir);
    kf_model *m;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    kf_model *orig = gt_copy(m);
    uint32_t q0 = gt_count(m, "QuantizeLinear"), d0 = gt_count(m, "DequantizeLinear");
    kf_opt_options o;
    kf_opt_options_default(&o);
    const char *files[] = {KF_SOURCE_DIR "/fusion/patterns/qdq.kfp"};
    o.no_builtin = true;
    o.pattern_files = files;
    o.npattern_files = 1;
    o.disable = "fold";
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, &o, &res), KF_OK, "%s", kf_last_error());
    kf_ruleset rs = res.rules;
    uint64_t hits = 0;
    for (uint32_t i = 0; i < rs.n; i++)
        if (!strncmp(rs.rules[i]->name, "qdq_", 4)) hits += rs.rules[i]->hits;
    cr_expect_gt(hits, 0);
    cr_expect_eq(gt_hits(&rs, "qdq_maxpool"), gt_count(orig, "MaxPool"), "%s", gt_reasons(&rs, "qdq_maxpool"));
    cr_expect_eq(q0 - gt_count(m, "QuantizeLinear"), hits);
    cr_expect_eq(d0 - gt_count(m, "DequantizeLinear"), hits);
    gt_expect_same_outputs(orig, m, 0, 0);
    kf_rules_free(&rs);
    kf_model_free(m);
    kf_model_free(orig);
}
