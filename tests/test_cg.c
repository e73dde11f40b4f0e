/*
 * test_cg.c: codegen/ elementwise kernels, executed for real on OpenCL
 * (PoCL on the CPU) and compared with the reference evaluator; determinism
 * of the text; the CUDA text through NVRTC for sm_80/sm_90 with ptxas
 * spill figures; and the reasons for groups this slice declines.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"
#include "kf_opt.h"

/* DESIGN.md numerics: fused vs unfused, fp32; fp16 (intermediates stay in float) */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3

static void most_outputs(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    uint32_t *most = ctx;
    if (k->nouts > *most) *most = k->nouts;
}

/* Plans the graph, generates every elementwise and reduction group (all
 * must be supported), runs each on OpenCL and compares every group output
 * with the reference. Returns the largest output count of a group; *ngen
 * gets the number of kernels run. */
static uint32_t check_graph(const char *text, uint32_t *ngen) {
    uint32_t most = 0;
    cgu_run_opts o = {(1u << KF_GROUP_ELEMWISE) | (1u << KF_GROUP_REDUCTION), NULL, ATOL, RTOL, ATOL16, RTOL16,
                      most_outputs, &most};
    *ngen = cgu_run_groups(text, &o);
    return most;
}

/* ---- graphs for the reduction, injective and float16 templates -------- */

/* prologue (Mul by a row vector), ReduceSum over a 300-long row (one
 * work-group per row), epilogue on the reduced space */
#define RED_PRO_EPI                                                                                   \
    "opset 13\ninput x float[6, 300]\nconst s float[300] = random\nconst b float[6, 1] = random\n"     \
    "const ax int64[1] = 1\ny = Mul(x, s)\nr = ReduceSum(y, ax)\nz = Add(r, b)\ne = Exp(z)\noutput e\n"
/* rows of 7 along a middle axis: one work-item per row */
#define RED_SHORT_ROWS "opset 13\ninput x float[5, 7, 3]\nm = ReduceMax(x) {axes=[1], keepdims=0}\nt = Tanh(m)\noutput t\n"
/* Softmax over a middle axis (opset 13: that axis alone) */
#define SOFTMAX_MID_AXIS "opset 13\ninput x float[3, 40, 5]\ny = Softmax(x) {axis=1}\nz = Mul(y, x)\noutput z\n"
#define LAYERNORM                                                                                     \
    "opset 17\ninput x float[4, 6, 48]\nconst g float[48] = random\nconst b float[48] = random\n"     \
    "y = LayerNormalization(x, g, b) {axis=-1, epsilon=0.001}\nz = Relu(y)\noutput z\n"
/* Transpose -> Reshape -> broadcast Add -> Slice with a negative step */
#define INJECTIVE_MIX                                                                                 \
    "opset 13\ninput x float[4, 6]\nconst shp int64[2] = 3 8\nconst c float[8] = random\n"           \
    "const st int64[1] = 7\nconst en int64[1] = -100\nconst ax int64[1] = 1\nconst sp int64[1] = -2\n" \
    "t = Transpose(x) {perm=[1,0]}\nr = Reshape(t, shp)\na = Add(r, c)\n"                              \
    "s = Slice(a, st, en, ax, sp)\nq = Sqrt(s)\noutput q\n"
/* contiguous same-shape operands and a scalar: the 128-bit path */
#define VEC_TAIL                                                                                      \
    "opset 13\ninput x float[5, 7]\ninput y float[5, 7]\nconst k float[] = 0.5\n"                     \
    "a = Mul(x, k)\nb = Add(a, y)\nz = Sigmoid(b)\noutput z\noutput b\n"
/* float16 in and out, computed in float, with Casts both ways */
#define HALF_IO                                                                                       \
    "opset 13\ninput x float16[4, 33]\ninput y float16[33]\ns = Add(x, y)\nf = Cast(s) {to=1}\n"      \
    "g = Sigmoid(f)\nh = Cast(g) {to=10}\noutput h\noutput f\n"

static const char *GELU_ERF = "opset 13\n"
                              "input x float[2, 3, 8]\n"
                              "const b float[8] = random\n"
                              "const s2 float[] = 1.4142135\n"
                              "const one float[] = 1\n"
                              "const half float[] = 0.5\n"
                              "y = Add(x, b)\n"
                              "d = Div(y, s2)\n"
                              "e = Erf(d)\n"
                              "f = Add(e, one)\n"
                              "g = Mul(y, f)\n"
                              "z = Mul(g, half)\n"
                              "output z\n";

/* BERT's attention mask: the ids' Cast and Reshape ([2, 9] -> [2, 1, 1, 9])
 * are read through a broadcast by And and Where over [2, 1, 9, 9]; the
 * planner puts them in the reader's kernel, which recomputes them at each
 * element's broadcast index */
#define MASK_BROADCAST                                                                                \
    "opset 13\ninput ids int64[2, 9]\nconst shp int64[4] = 2 1 1 9\nconst tri bool[1, 1, 9, 1] = 1 1 0 1 1 0 1 1 1\n" \
    "const zero float[] = 0\nconst low float[] = -10000\n"                                              \
    "c = Cast(ids) {to=9}\nr = Reshape(c, shp)\na = And(tri, r)\nw = Where(a, zero, low)\noutput w\n"

/* rotary embedding's rotate-half: the halves' Slices and a Neg, then the
 * Concat, the cos/sin products and their sum; the planner puts the Slices
 * and the Neg in the Concat's kernel, which reads each at its offset */
#define ROTATE_HALF                                                                                   \
    "opset 13\ninput x float[2, 3, 8]\ninput cs float[3, 8]\ninput sn float[3, 8]\n"                   \
    "const s0 int64[1] = 0\nconst s4 int64[1] = 4\nconst s8 int64[1] = 8\nconst ax int64[1] = 2\n"      \
    "a = Slice(x, s0, s4, ax)\nb = Slice(x, s4, s8, ax)\nn = Neg(b)\nr = Concat(n, a) {axis=2}\n"        \
    "xc = Mul(x, cs)\nrs = Mul(r, sn)\ny = Add(xc, rs)\noutput y\n"

/* The planner makes text one group (why: what joined), which runs
 * generated on OpenCL and matches ref. */
static void check_one_group(const char *text, const char *why) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cr_expect_eq(p->ngroups, 1, "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
    uint32_t n = 0;
    check_graph(text, &n);
    cr_assert_eq(n, 1);
}

Test(cg, rotate_half_halves_recomputed_in_the_concat_on_opencl) {
    cgu_need_opencl();
    check_one_group(ROTATE_HALF, "the Slices and the Neg join the Concat");
}

Test(cg, mask_producer_recomputed_at_the_broadcast_index_on_opencl) {
    cgu_need_opencl();
    check_one_group(MASK_BROADCAST, "the Cast and Reshape join the And and Where");
}

Test(cg, bias_gelu_erf_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(GELU_ERF, &n);
    cr_assert_eq(n, 1, "bias + Gelu should be one elementwise kernel, got %u", n);
}

Test(cg, bias_gelu_op_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("opset 20\n"
                "input x float[5, 16]\n"
                "const b float[16] = random\n"
                "y = Add(x, b)\n"
                "z = Gelu(y)\n"
                "output z\n",
                &n);
    cr_assert_eq(n, 1);
}

Test(cg, silu_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("input x float[3, 33]\n"
                "s = Sigmoid(x)\n"
                "z = Mul(x, s)\n"
                "output z\n",
                &n);
    cr_assert_eq(n, 1);
}

Test(cg, broadcast_4x1x8_plus_3x1_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("input a float[4, 1, 8]\n"
                "input b float[3, 1]\n"
                "c = Add(a, b)\n"
                "z = Tanh(c)\n"
                "output z\n",
                &n);
    cr_assert_eq(n, 1);
}

Test(cg, where_bool_mask_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("input m bool[4, 8]\n"
                "input a float[4, 8]\n"
                "input b float[8]\n"
                "w = Where(m, a, b)\n"
                "z = Exp(w)\n"
                "output z\n",
                &n);
    cr_assert_eq(n, 1);
}

Test(cg, where_from_comparison_and_bool_output_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("input a float[2, 9]\n"
                "input b float[2, 1]\n"
                "m = Greater(a, b)\n"
                "w = Where(m, a, b)\n"
                "output w\n"
                "output m\n",
                &n);
    cr_assert_geq(n, 1);
}

Test(cg, two_output_group_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    uint32_t most = check_graph("input x float[6, 10]\n"
                                "const b float[10] = random\n"
                                "y = Add(x, b)\n"
                                "r = Relu(y)\n"
                                "s = Sigmoid(y)\n"
                                "output r\n"
                                "output s\n",
                                &n);
    cr_assert_geq(most, 2, "expected a group writing two values");
}

Test(cg, attrs_and_variadics_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("opset 13\n"
                "input a float[3, 7]\n"
                "input b float[7]\n"
                "input c float[3, 1]\n"
                "const lo float[] = -0.5\n"
                "const hi float[] = 0.75\n"
                "x = Max(a, b, c)\n"
                "y = Min(x, b)\n"
                "l = LeakyRelu(y) {alpha=0.2}\n"
                "k = Clip(l, lo, hi)\n"
                "s = Sum(k, a, c)\n"
                "p = Pow(s, c)\n"
                "q = Abs(p)\n"
                "z = Sqrt(q)\n"
                "output z\n",
                &n);
    cr_assert_geq(n, 1);
}

/* Rank-4 space with operands broadcast on different axes and a scalar:
 * every index path (contiguous, strided sum, constant 0) in one kernel. */
Test(cg, rank4_broadcast_mix_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("input a float[2, 3, 4, 5]\n"
                "input b float[3, 1, 5]\n"
                "input c float[2, 1, 4, 1]\n"
                "input d float[]\n"
                "x = Mul(a, b)\n"
                "y = Sub(x, c)\n"
                "z = Div(y, d)\n"
                "w = Neg(z)\n"
                "output w\n",
                &n);
    cr_assert_eq(n, 1);
}

Test(cg, text_is_deterministic_and_readable) {
    kf_model *m = gt_parse(GELU_ERF);
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    uint32_t gi = p->group_of[m->graph->values[kf_graph_find(m->graph, "z")].producer];
    cr_assert_eq(kf_cg_group(m, p, gi, &k), KF_OK, "%s", kf_last_error());
    char *a, *b, *c;
    cr_assert_eq(kf_cg_source(&k, KF_CG_OPENCL, &a), KF_OK);
    cr_assert_eq(kf_cg_source(&k, KF_CG_OPENCL, &b), KF_OK);
    cr_assert_eq(kf_cg_source(&k, KF_CG_CUDA, &c), KF_OK);
    cr_assert_str_eq(a, b);
    /* the body is byte-identical across targets: both sources end with it */
    size_t lb = strlen(k.body);
    cr_assert(strlen(a) > lb && !strcmp(a + strlen(a) - lb, k.body));
    cr_assert(strlen(c) > lb && !strcmp(c + strlen(c) - lb, k.body));
    cr_assert_neq(strcmp(a, c), 0, "preludes should differ");
    /* ops listed at the top, v-names, math through the prelude */
    cr_assert_not_null(strstr(k.body, "= Erf(v"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_ERF(v"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_GLOBAL_SIZE"), "%s", k.body);
    cr_assert_null(strstr(k.body, "erf("), "raw C99 call left in the body:\n%s", k.body);
    kf_free(a);
    kf_free(b);
    kf_free(c);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg, reduction_with_prologue_and_epilogue_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(RED_PRO_EPI, &n);
    cr_assert_eq(n, 1, "Mul + ReduceSum + Add + Exp should be one kernel, got %u", n);
}

Test(cg, reduction_short_rows_middle_axis_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(RED_SHORT_ROWS, &n);
    cr_assert_eq(n, 1, "got %u kernels", n);
}

/* Every Reduce* op over a non-trailing axis set, keepdims 0 and 1, both
 * through a prologue that keeps values in [1, 3] (LogSum, Prod stay finite). */
Test(cg, every_reduce_op_over_axes_0_2_on_opencl) {
    cgu_need_opencl();
    static const char *const ops[] = {"ReduceSum", "ReduceMean", "ReduceMax",       "ReduceMin",      "ReduceProd",
                                      "ReduceL1",  "ReduceL2",   "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        for (int keep = 0; keep < 2; keep++) {
            char text[512];
            snprintf(text, sizeof text,
                     "opset 11\ninput x float[5, 7, 9]\nconst one float[] = 1\na = Abs(x)\nb = Add(a, one)\n"
                     "r = %s(b) {axes=[0, 2], keepdims=%d}\nz = Neg(r)\noutput z\n",
                     ops[i], keep);
            uint32_t n;
            check_graph(text, &n);
            cr_assert_geq(n, 1, "%s: no kernel", ops[i]);
        }
}

Test(cg, reduce_all_axes_and_mean_variance_chain_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("opset 18\ninput x float[3, 100]\nr = ReduceMean(x) {keepdims=0}\noutput r\n", &n);
    cr_assert_eq(n, 1);
    /* decomposed normalisation: x - mean(x), then mean of its square */
    check_graph("opset 18\ninput x float[8, 64]\nconst ax int64[1] = -1\nm = ReduceMean(x, ax)\n"
                "d = Sub(x, m)\nq = Mul(d, d)\nv = ReduceMean(q, ax)\nw = Sqrt(v)\ny = Div(d, w)\n"
                "output y\noutput v\n",
                &n);
    cr_assert_geq(n, 2, "got %u kernels", n);
}

Test(cg, softmax_logsoftmax_layernorm_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(SOFTMAX_MID_AXIS, &n);
    cr_assert_eq(n, 1);
    check_graph(LAYERNORM, &n);
    cr_assert_eq(n, 1);
    /* Mean and InvStdDev outputs too, normalizing two axes, no bias */
    check_graph("opset 17\ninput x float[3, 4, 40]\nconst g float[4, 40] = random\n"
                "y, mu, rs = LayerNormalization(x, g) {axis=1}\noutput y\noutput mu\noutput rs\n",
                &n);
    cr_assert_eq(n, 1);
    /* opset 11: Softmax flattens from axis to the end; long rows */
    check_graph("opset 11\ninput x float[2, 3, 200]\ny = LogSoftmax(x) {axis=1}\noutput y\n", &n);
    cr_assert_eq(n, 1);
    check_graph("opset 13\ninput x float[4, 1000]\ny = Softmax(x)\noutput y\n", &n);
    cr_assert_eq(n, 1);
}

Test(cg, injective_maps_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(INJECTIVE_MIX, &n);
    cr_assert_geq(n, 1);
    /* Concat of three, one empty-free middle; Expand; Squeeze/Unsqueeze/Flatten */
    check_graph("opset 13\ninput a float[2, 3, 4]\ninput b float[2, 1, 4]\ninput c float[2, 5, 4]\n"
                "k = Concat(a, b, c) {axis=1}\ne = Exp(k)\noutput e\n",
                &n);
    check_graph("opset 13\ninput a float[3, 1]\nconst sh int64[3] = 2 3 5\nx = Expand(a, sh)\n"
                "const ax int64[1] = 0\nu = Unsqueeze(x, ax)\nf = Flatten(u) {axis=2}\ng = Neg(f)\noutput g\n",
                &n);
    check_graph("opset 13\ninput a float[4, 1, 6]\nconst ax int64[1] = 1\nq = Squeeze(a, ax)\nt = Transpose(q)\n"
                "i = Identity(t)\nz = Sigmoid(i)\noutput z\n",
                &n);
}

/* PyTorch 1.4's shape computations: a 1-D Concat of [1] pieces and 0-D
 * constants, kept (not folded) when the batch is symbolic. The 0-D pieces
 * are one element each; they were skipped as empty, and the kernel text
 * ended in "(i0 < 2 ? v1 : )", which no compiler takes. */
#define CONCAT_SCALARS                                                                                \
    "opset 11\ninput a int64[1]\ninput b int64[1]\nconst c int64[] = random\nconst d int64[] = random\n"    \
    "y = Concat(a, b, c, d) {axis=0}\nz = Concat(c, a, d, b) {axis=0}\noutput y\noutput z\n"

static void no_empty_operand(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi, (void)ctx;
    char *src;
    cr_assert_eq(kf_cg_source(k, KF_CG_OPENCL, &src), KF_OK);
    cr_assert(!strstr(src, ": )"), "a Concat operand is missing:\n%s", src);
    kf_free(src);
}

Test(cg, concat_of_scalar_pieces_on_opencl) {
    cgu_need_opencl();
    cgu_run_opts o = {1u << KF_GROUP_ELEMWISE, NULL, 0, 0, 0, 0, no_empty_operand, NULL};
    cr_assert_geq(cgu_run_groups(CONCAT_SCALARS, &o), 1);
}

Test(cg, concat_of_scalar_pieces_cuda_text_compiles_with_nvrtc) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        printf("cg::concat_of_scalar_pieces_cuda_text_compiles_with_nvrtc: skipped, NVRTC: %s\n", why);
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_geq(cgu_nvrtc_check_text(CONCAT_SCALARS, 1u << KF_GROUP_ELEMWISE), 1);
}

/* Operands whose lengths do not add up to the output's are declined with
 * the reason (a type a rewrite left stale must not become a kernel that
 * reads past its selection). */
Test(cg, concat_whose_operands_do_not_add_up_is_declined) {
    kf_model *m = gt_parse("opset 13\ninput a float[2, 3]\ninput b float[2, 4]\nk = Concat(a, b) {axis=1}\noutput k\n");
    kf_plan *p = cgu_plan(m);
    kf_type *kt = &m->graph->values[kf_graph_find(m->graph, "k")].type;
    kt->dims[1] += 1 + (int64_t)tu_uniform(0, 3);
    int declined = 0;
    for (uint32_t g = 0; g < p->ngroups; g++) {
        kf_cg_kernel k;
        kf_status st = kf_cg_group(m, p, g, &k);
        if (st == KF_OK) {
            kf_cg_kernel_release(&k);
            continue;
        }
        cr_assert_eq(st, KF_ERR_UNSUPPORTED, "%s", kf_last_error());
        cr_assert(strstr(kf_last_error(), "Concat inputs add up to 7"), "%s", kf_last_error());
        declined++;
    }
    cr_assert_eq(declined, 1);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg, gather_gathernd_pad_where_cast_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    /* runtime int64 indices (random in [-2, 2]: negatives count from the end) */
    check_graph("opset 13\ninput x float[3, 5, 4]\ninput i int64[2, 3]\ng = Gather(x, i) {axis=1}\n"
                "h = Abs(g)\noutput h\n",
                &n);
    /* constant int32 indices, axis 0 */
    check_graph("opset 13\ninput x float[6, 4]\nconst i int32[3] = 5 0 2\ng = Gather(x, i)\nh = Exp(g)\noutput h\n",
                &n);
    /* GatherND: pairs of indices into the first two dims; batch_dims 1; constant
     * one-element tuples with a negative; the mask lookup of a dynamo-exported Llama */
    check_graph("opset 13\ninput x float[3, 4, 5]\ninput i int64[2, 2]\ng = GatherND(x, i)\nh = Abs(g)\noutput h\n",
                &n);
    cr_assert_eq(n, 1);
    check_graph("opset 13\ninput x float[2, 3, 4]\ninput i int64[2, 5, 1]\ng = GatherND(x, i) {batch_dims=1}\n"
                "h = Neg(g)\noutput h\n",
                &n);
    cr_assert_eq(n, 1);
    check_graph("opset 13\ninput x float[4, 6]\nconst i int64[3, 1] = 3 -1 0\ng = GatherND(x, i)\nh = Exp(g)\noutput h\n",
                &n);
    cr_assert_eq(n, 1);
    check_graph("opset 13\ninput m bool[2, 8]\ninput i int64[2, 1, 1, 8, 2]\ng = GatherND(m, i)\n"
                "input o bool[2, 1, 8, 8]\na = And(g, o)\noutput a\n",
                &n);
    cr_assert_eq(n, 1, "the lookup joins the And reading it through a broadcast (recomputed per element)");
    check_graph("opset 13\ninput x float[3, 5]\nconst p int64[4] = 1 0 2 -1\nconst v float[] = 0.5\n"
                "y = Pad(x, p, v)\nz = Mul(y, y)\noutput z\n",
                &n);
    /* integer Where and comparisons, Cast int64 <-> float, bool output */
    check_graph("opset 13\ninput a int64[4, 5]\ninput b int64[5]\nc = Less(a, b)\nw = Where(c, a, b)\n"
                "f = Cast(w) {to=1}\ng = Exp(f)\nk = Cast(g) {to=6}\noutput k\noutput c\n",
                &n);
}

Test(cg, float16_storage_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(HALF_IO, &n);
    cr_assert_eq(n, 1);
    check_graph("opset 13\ninput x float16[6, 64]\ny = Softmax(x)\noutput y\n", &n);
    cr_assert_eq(n, 1);
}

Test(cg, vector_path_with_scalar_tail_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    /* 35 elements: 8 quads through KF_VLOAD4/KF_VSTORE4, 3 through the tail */
    check_graph(VEC_TAIL, &n);
    cr_assert_eq(n, 1);
    kf_model *m = gt_parse(VEC_TAIL);
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "z")].producer], &k), KF_OK);
    cr_assert_not_null(strstr(k.body, "KF_VLOAD4(in"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_VSTORE4(out0"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "i = 32 +"), "no scalar tail after 8 quads:\n%s", k.body);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
    /* a broadcast row is contiguous over a step too: x and b load vectors */
    m = gt_parse(GELU_ERF);
    p = cgu_plan(m);
    cr_assert_eq(kf_cg_group(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "z")].producer], &k), KF_OK);
    cr_assert_not_null(strstr(k.body, "KF_VLOAD4(in0"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_VLOAD4(in1"), "%s", k.body);
    cr_assert_null(strstr(k.body, "i = "), "no scalar loop when the last axis is whole steps:\n%s", k.body);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg, index_maps_never_read_out_of_bounds) {
    /* an index out of range is clamped, never read past the buffer (the text
     * clamps every Gather index), and reported: the launch fails as the
     * reference does (kf_cg_check) */
    kf_model *m = gt_parse("opset 13\ninput x float[6, 4]\ninput i int64[3]\ng = Gather(x, i)\noutput g\n");
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "g")].producer], &k), KF_OK,
                 "%s", kf_last_error());
    cr_assert_not_null(strstr(k.body, "> 5 ? 5 :"), "no upper clamp:\n%s", k.body);
    cr_assert_not_null(strstr(k.body, "< 0 ? 0 :"), "no lower clamp:\n%s", k.body);
    cr_assert_not_null(strstr(k.body, "kf_index_fail(kf_err, 1,"), "no report:\n%s", k.body);
    cr_assert_eq(k.nchecks, 1);
    cr_assert_eq(k.checks[0].dim, 6);
    cr_assert_str_eq(m->graph->nodes[k.checks[0].node].op_type, "Gather");
    if (!kf_cl_unavailable()) {
        kf_tensor x = tu_rand(KF_DT_FLOAT, 2, (int64_t[]){6, 4}, -1, 1), idx = {0};
        cr_assert_eq(kf_tensor_alloc(&idx, KF_DT_INT64, 1, (int64_t[]){3}), KF_OK);
        int64_t *iv = idx.data;
        iv[0] = 1000, iv[1] = -1000, iv[2] = -1;
        const kf_tensor *ins[2] = {&x, &idx};
        if (k.ins[0].dtype != KF_DT_FLOAT) ins[0] = &idx, ins[1] = &x;
        kf_tensor out[1] = {0};
        cr_assert_eq(kf_cl_run_kernel(&k, ins, out), KF_ERR_RUNTIME);
        cr_assert(strstr(kf_last_error(), "index 1000 is out of range for a dimension of size 6") ||
                      strstr(kf_last_error(), "index -1000 is out of range for a dimension of size 6"),
                  "%s", kf_last_error());
        iv[0] = 5, iv[1] = -6, iv[2] = -1;
        cr_assert_eq(kf_cl_run_kernel(&k, ins, out), KF_OK, "%s", kf_last_error());
        const float *xv = x.data, *ov = out[0].data;
        for (int c = 0; c < 4; c++) {
            cr_assert_eq(ov[c], xv[5 * 4 + c]);
            cr_assert_eq(ov[4 + c], xv[c]);
            cr_assert_eq(ov[8 + c], xv[5 * 4 + c]);
        }
        kf_tensor_release(&out[0]);
        kf_tensor_release(&x);
        kf_tensor_release(&idx);
    }
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg, reduction_text_uses_prelude_block_reduce) {
    kf_model *m = gt_parse(RED_PRO_EPI);
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    uint32_t g = p->group_of[m->graph->values[kf_graph_find(m->graph, "r")].producer];
    cr_assert_eq(p->groups[g].kind, KF_GROUP_REDUCTION);
    cr_assert_eq(kf_cg_group(m, p, g, &k), KF_OK, "%s", kf_last_error());
    /* 300-long rows held in registers: 75 steps of 4, segments of 32 lanes
     * (3 steps each); 6 rows, so one row per warp-wide group (packing rows
     * waits until the grid has 264 groups) */
    cr_assert_eq(k.block, 32, "6 rows of 300 want 32 lanes, got %u", k.block);
    cr_assert_eq(k.min_block, 32);
    cr_assert_eq(k.numel, 6 * 32);
    cr_assert_not_null(strstr(k.body, "kf_seg_sum("), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_LOCAL_SIZE < 32 ?"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "kf_ok2"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "KF_SHARED float"), "%s", k.body);
    cr_assert_not_null(strstr(k.body, "= ReduceSum(v"), "%s", k.body);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg, generates_anchors_declines_integer_math_and_other_dtypes) {
    kf_model *m = gt_parse("input x float[4, 8]\n"
                           "input i int64[4, 8]\n"
                           "input d double[4, 8]\n"
                           "const w float[8, 3] = random\n"
                           "r = MatMul(x, w)\n"
                           "j = Neg(i)\n"
                           "e = Neg(d)\n"
                           "output r\n"
                           "output j\n"
                           "output e\n");
    kf_plan *p = cgu_plan(m);
    uint32_t gr = p->group_of[m->graph->values[kf_graph_find(m->graph, "r")].producer];
    uint32_t gj = p->group_of[m->graph->values[kf_graph_find(m->graph, "j")].producer];
    uint32_t ge = p->group_of[m->graph->values[kf_graph_find(m->graph, "e")].producer];
    char why[512];
    /* anchors are generated since cg_anchor.c (tests/test_cg_anchor.c has their declines) */
    cr_assert_null(kf_cg_unsupported(m, p, gr, why, sizeof why), "%s", why);
    cr_assert_not_null(kf_cg_unsupported(m, p, gj, why, sizeof why));
    cr_assert_not_null(strstr(why, "Neg on integers"), "%s", why);
    cr_assert_not_null(kf_cg_unsupported(m, p, ge, why, sizeof why));
    cr_assert_not_null(strstr(why, "double"), "%s", why);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, gj, &k), KF_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(kf_last_error(), "Neg"), "%s", kf_last_error());
    kf_plan_free(p);
    kf_model_free(m);
}

/* Gelu's tanh form, HardSigmoid with its attributes and HardSwish, on
 * values spread over [-8, 8) so every branch of the clamps is taken */
#define HARD_GELU                                                                                     \
    "opset 20\ninput x float[6, 40]\nconst k float[] = 8\ns = Mul(x, k)\n"                              \
    "y = Gelu(s) {approximate=\"tanh\"}\nz = HardSigmoid(s) {alpha=0.3, beta=0.4}\n"                     \
    "h = HardSwish(s)\nw = HardSigmoid(s)\noutput y\noutput z\noutput h\noutput w\n"

Test(cg, gelu_tanh_hard_sigmoid_hard_swish_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(HARD_GELU, &n);
    cr_assert_eq(n, 1, "one elementwise kernel, got %u", n);
}

/* Swish and SwiGLU (opset 28) with alpha attributes: one elementwise kernel */
Test(cg, swish_and_swiglu_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("opset 28\ninput a float[6, 40]\ninput b float[6, 40]\nconst k float[] = 6\ns = Mul(a, k)\n"
                "y = Swish(s) {alpha=0.7}\nz = SwiGLU(s, b) {alpha=1.3}\nw = Swish(s)\noutput y\noutput z\noutput w\n",
                &n);
    cr_assert_eq(n, 1, "one elementwise kernel, got %u", n);
}

/* NaN and infinities go through the clamps as in the reference */
Test(cg, hard_sigmoid_hard_swish_carry_nan_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph("opset 14\ninput x float[3, 6]\nconst c float[6] = nan inf -inf 0 1 -1\ns = Add(x, c)\n"
                "h = HardSigmoid(s)\nw = HardSwish(s)\noutput h\noutput w\n",
                &n);
    cr_assert_geq(n, 1);
}

Test(cg, gelu_tanh_hard_sigmoid_cuda_text_compiles_with_nvrtc) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_eq(cgu_nvrtc_check_text(HARD_GELU, 1u << KF_GROUP_ELEMWISE), 1);
}

/* the Global pools as row reductions over every spatial dim: 2-D with an
 * epilogue, 1-D with a Flatten and an epilogue after it (written at the
 * row's linear index), 3-D, LpPool with p = 2 and p = 1 */
#define GLOBAL_POOLS                                                                                  \
    "opset 13\ninput x float[2, 5, 7, 9]\ninput y float[3, 4, 6]\ninput z float[2, 3, 2, 3, 4]\n"        \
    "a = GlobalAveragePool(x)\nr = Relu(a)\nm = GlobalMaxPool(y)\nl = GlobalLpPool(z) {p=2}\n"            \
    "l1 = GlobalLpPool(x) {p=1}\nf = Flatten(m)\nt = Tanh(f)\noutput r\noutput t\noutput l\noutput l1\n"

Test(cg, global_pools_as_row_reductions_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    check_graph(GLOBAL_POOLS, &n);
    cr_assert_geq(n, 4, "each Global pool generates, got %u kernels", n);
}

Test(cg, global_pools_cuda_text_compiles_with_nvrtc) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_geq(cgu_nvrtc_check_text(GLOBAL_POOLS, 1u << KF_GROUP_REDUCTION), 4);
}

Test(cg, does_not_generate_global_lppool_of_other_orders) {
    kf_model *m = gt_parse("opset 13\ninput x float[2, 3, 4, 4]\ny = GlobalLpPool(x) {p=3}\noutput y\n");
    kf_plan *p = cgu_plan(m);
    char why[512];
    uint32_t gy = p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer];
    cr_assert_not_null(kf_cg_unsupported(m, p, gy, why, sizeof why));
    cr_assert_not_null(strstr(why, "p other than 1 or 2"), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
}

/* Split with several used outputs as one injective kernel: equal parts
 * after an elementwise op (one loop), unequal parts along a middle axis
 * with epilogues (one loop per output size), an unused output, a Split of
 * a graph input along axis 0 */
#define SPLITS                                                                                        \
    "opset 13\ninput x float[4, 9, 5]\nconst sp int64[3] = 2 3 4\nconst sq int64[2] = 1 3\n"           \
    "input y float[6, 8]\ne = Exp(y)\na, b = Split(e) {axis=1}\n"                                           \
    "p, q, r = Split(x, sp) {axis=1}\nt = Tanh(q)\nu = Neg(r)\n"                                        \
    "input w float[4, 3]\nc, d = Split(w, sq) {axis=0}\nf = Sigmoid(d)\n"                                \
    "output a\noutput b\noutput p\noutput t\noutput u\noutput c\noutput f\n"

Test(cg, split_with_several_outputs_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    uint32_t most = check_graph(SPLITS, &n);
    cr_assert_geq(most, 2, "a Split kernel writes several outputs");
}

Test(cg, split_cuda_text_compiles_with_nvrtc) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_geq(cgu_nvrtc_check_text(SPLITS, 1u << KF_GROUP_ELEMWISE), 3);
}

/* outputs that are views of a LayerNorm's input space: split per head
 * (Reshape), sequence-first (Transpose, as torch's attention wants), and
 * a Reshape after a Transpose; and the normalised value itself */
#define LN_VIEWS                                                                                      \
    "opset 17\ninput x float[2, 6, 16]\nconst g float[16] = random\nconst b float[16] = random\n"          \
    "const shp int64[4] = 2 6 4 4\nconst s2 int64[2] = 6 32\n"                                          \
    "n = LayerNormalization(x, g, b) {axis=-1}\nr = Reshape(n, shp)\nt = Transpose(n) {perm=[1,0,2]}\n" \
    "f = Reshape(t, s2)\ne = Relu(n)\noutput r\noutput t\noutput f\noutput e\n"

Test(cg, row_reduction_outputs_through_views_on_opencl) {
    cgu_need_opencl();
    uint32_t n;
    cr_assert_eq(check_graph(LN_VIEWS, &n), 4, "one LayerNorm kernel writes the four outputs");
    cr_assert_eq(n, 1);
}

Test(cg, does_not_generate_ops_without_expression) {
    kf_model *m = gt_parse("opset 20\n"
                           "input x float[4, 8]\n"
                           "y = ThresholdedRelu(x)\n"
                           "output y\n");
    kf_plan *p = cgu_plan(m);
    char why[512];
    uint32_t gy = p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer];
    cr_assert_not_null(kf_cg_unsupported(m, p, gy, why, sizeof why));
    cr_assert_not_null(strstr(why, "ThresholdedRelu"), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
}

/* Asks codegen whether the group that computes value v generates: want
 * NULL means it must, else the reason must contain want. */
static void expect_declined(const kf_model *m, const kf_plan *p, kf_id v, const char *want) {
    char why[512];
    uint32_t g = p->group_of[m->graph->values[v].producer];
    const char *reason = kf_cg_unsupported(m, p, g, why, sizeof why);
    if (!want) cr_assert_null(reason, "%s", why);
    else cr_assert(reason && strstr(why, want), "%s", reason ? why : "generated");
}

/* A declared type the graph cannot check (Expand's shape known only at run
 * time) may disagree with the operands: codegen declines, naming the node,
 * instead of indexing out of bounds (fuzz finding, session 3: an Expand of
 * a rank-3 input declared rank 2). A consistent declaration generates. */
Test(cg, declines_an_operand_that_does_not_broadcast_into_its_output) {
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[42, 3, 1]\n"
                           "input shape int64[2]\n"
                           "y = Expand(x, shape)\n"
                           "r = Relu(y)\n"
                           "output r\n");
    kf_id y = kf_graph_find(m->graph, "y"), r = kf_graph_find(m->graph, "r");
    kf_type *ty = &m->graph->values[y].type, *tr = &m->graph->values[r].type;
    int64_t bad[2] = {3, 3}, good[3] = {42, 3, 5};
    for (int pass = 0; pass < 2; pass++) {
        const int64_t *dims = pass ? good : bad;
        ty->rank = tr->rank = pass ? 3 : 2;
        for (int d = 0; d < ty->rank; d++) ty->dims[d] = tr->dims[d] = dims[d], ty->syms[d] = tr->syms[d] = 0;
        kf_plan *p = cgu_plan(m);
        expect_declined(m, p, y, pass ? NULL : "does not broadcast into the output");
        kf_plan_free(p);
    }
    kf_model_free(m);
}

/* A row statistic (the Sqrt of a reduced value) written on the reduced
 * space by lane 0 and read again by a row-wide output: the generator
 * defined it inside lane 0's block and used it in the row loop, so the
 * kernel did not compile (fuzz_pipeline under KF_FUZZ_NVRTC=1, from a
 * mutated expanded-LayerNorm model). Both targets, and the OpenCL result. */
#define RED_STAT_TWICE                                                                                  \
    "opset 13\ninput x float[3, 300]\ninput a float[3, 1]\ninput z float[3, 300]\nconst e float[] = 0.5\n" \
    "m = ReduceMean(x) {axes=[1]}\nd = Sub(m, a)\nv = Mul(d, d)\nw = Add(v, e)\ns = Sqrt(w)\n"          \
    "y = Div(z, s)\nr = Reciprocal(s)\noutput y\noutput r\n"

Test(cg, row_statistic_read_by_both_output_spaces) {
    const char *nv = kf_nvrtc_unavailable();
    if (nv) cr_log_warn("NVRTC part not run: %s", nv);
    else cr_assert_eq(cgu_nvrtc_check_text(RED_STAT_TWICE, 1u << KF_GROUP_REDUCTION), 1);
    cgu_need_opencl();
    uint32_t n = 0;
    cr_assert_eq(check_graph(RED_STAT_TWICE, &n), 2, "one kernel writes both outputs");
    cr_assert_eq(n, 1);
}

/* An empty value's strides are products of its other dims: they must fit
 * 64-bit index math too (fuzz finding: a signed overflow in the stride of
 * an elementwise kernel over [0, 2^33, 2^34]). Inference and allocation
 * now refuse such shapes (ir/empty_shape_whose_other_dims_overflow_is_refused);
 * codegen keeps its own check for types set any other way, so the bad
 * dims are written into the graph after planning here. */
Test(cg, declines_an_empty_value_whose_strides_overflow) {
    int64_t bad[3] = {0, 8589934592LL, 17179869184LL}, good[3] = {0, 8, 16};
    for (int pass = 0; pass < 2; pass++) {
        kf_model *m = gt_parse("opset 13\ninput x float[0, 8, 16]\ny = Relu(x)\noutput y\n");
        kf_id y = kf_graph_find(m->graph, "y");
        kf_id x = kf_graph_find(m->graph, "x");
        kf_plan *p = cgu_plan(m); /* plans (and infers) with the good shape */
        for (int d = 0; d < 3; d++)
            m->graph->values[x].type.dims[d] = m->graph->values[y].type.dims[d] = pass ? good[d] : bad[d];
        expect_declined(m, p, y, pass ? NULL : "does not fit 64-bit index math");
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* Compiles a kernel's CUDA text for arch; checks ptxas reported no spills. */

Test(cg, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    /* one kernel of each template: elementwise, block reduction, row-per-item
     * reduction, softmax, layer norm, injective maps, float16, 128-bit */
    const char *graphs[] = {GELU_ERF,
                            "input m bool[4, 8]\ninput a float[4, 8]\ninput b float[8]\n"
                            "w = Where(m, a, b)\nx = Max(w, a, b)\nz = Exp(x)\nq = Less(z, a)\n"
                            "output z\noutput q\n",
                            RED_PRO_EPI, RED_SHORT_ROWS, SOFTMAX_MID_AXIS, LAYERNORM, INJECTIVE_MIX, HALF_IO, VEC_TAIL};
    for (size_t gi = 0; gi < sizeof graphs / sizeof graphs[0]; gi++)
        cr_assert_gt(cgu_nvrtc_check_text(graphs[gi], 1u << KF_GROUP_ELEMWISE | 1u << KF_GROUP_REDUCTION), 0);
}

Test(cg, opencl_build_error_is_compile_status_with_log) {
    cgu_need_opencl();
    kf_model *m = gt_parse("input x float[4]\ny = Neg(x)\noutput y\n");
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer], &k), KF_OK);
    kf_free(k.body);
    k.body = kf_strdup("KF_KERNEL kf_ew(KF_GLOBAL float *out0) { out0[0] = undeclared_name; }\n");
    kf_tensor in = tu_rand(KF_DT_FLOAT, 1, (int64_t[]){4}, -1, 1);
    const kf_tensor *ins[1] = {&in};
    kf_tensor out[1] = {0};
    cr_assert_eq(kf_cl_run_kernel(&k, ins, out), KF_ERR_COMPILE);
    cr_assert_not_null(strstr(kf_last_error(), "undeclared_name"), "%s", kf_last_error());
    kf_tensor_release(&in);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

/* Every integer temporary a generated body declares is read somewhere
 * (codegen drops the coordinates an index map unravels but never uses):
 * checked on every group of the small BERT, whose GEMM prologues and
 * epilogues read reshaped and transposed values. */
Test(cg, bodies_declare_no_unread_index) {
    kf_model *m;
    cr_assert_eq(kf_model_load(KF_SOURCE_DIR "/bench/models/small/bert/model.onnx", &m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_bind_sym(m->graph, "batch", 2), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_graph_bind_sym(m->graph, "seq", 16), KF_OK, "%s", kf_last_error());
    kf_opt_options o;
    kf_opt_options_default(&o);
    kf_opt_result res;
    cr_assert_eq(kf_optimize(m, &o, &res), KF_OK, "%s", kf_last_error());
    kf_rules_free(&res.rules);
    kf_plan *p = cgu_plan(m);
    uint32_t bodies = 0, decls = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        kf_cg_kernel k;
        if (kf_cg_group(m, p, gi, &k) != KF_OK) {
            kf_clear_error();
            continue;
        }
        bodies++;
        for (const char *q = k.body; (q = strstr(q, "const int ")) != NULL; q += 10) {
            char name[64];
            if (sscanf(q + 10, "%63[A-Za-z0-9_] = ", name) != 1) continue;
            decls++;
            size_t n = strlen(name), uses = 0;
            for (const char *r = k.body; (r = strstr(r, name)) != NULL; r += n) {
                bool start = r == k.body || !(isalnum((unsigned char)r[-1]) || r[-1] == '_');
                bool end = !(isalnum((unsigned char)r[n]) || r[n] == '_');
                uses += start && end;
            }
            cr_assert_gt(uses, 1, "group %u declares %s and never reads it:\n%s", gi, name, k.body);
        }
        kf_cg_kernel_release(&k);
    }
    cr_assert_gt(bodies, 5);
    cr_assert_gt(decls, 50);
    kf_plan_free(p);
    kf_model_free(m);
}

/* A single node may read more buffers than merging may add: DenseNet's
 * Concat of 25 feature maps runs as one generated kernel; past
 * KF_CG_MAX_PARAMS buffers the group is declined with the reason. */
static char *wide_concat(int n) {
    size_t cap = 64 + (size_t)n * 64;
    char *t = malloc(cap);
    cr_assert(t);
    int len = snprintf(t, cap, "opset 13\n");
    for (int i = 0; i < n; i++) len += snprintf(t + len, cap - (size_t)len, "input x%d float[1, 2, 3]\n", i);
    len += snprintf(t + len, cap - (size_t)len, "y = Concat(");
    for (int i = 0; i < n; i++) len += snprintf(t + len, cap - (size_t)len, "%sx%d", i ? ", " : "", i);
    snprintf(t + len, cap - (size_t)len, ") {axis=1}\noutput y\n");
    return t;
}

Test(cg, a_concat_of_many_inputs_is_one_kernel_up_to_the_parameter_cap) {
    cgu_need_opencl();
    char *t = wide_concat(30);
    kf_model *m = gt_parse(t);
    kf_exec_stats s = cgu_opencl_matches_ref(m, 1);
    cr_expect_eq(s.groups_ref, 0, "the 31-buffer Concat ran on the host");
    kf_model_free(m);
    free(t);
    t = wide_concat(KF_CG_MAX_PARAMS);
    m = gt_parse(t);
    kf_plan *p = cgu_plan(m);
    char why[256];
    cr_assert_not_null(kf_cg_unsupported(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer], why,
                                         sizeof why));
    cr_expect(strstr(why, "more than 64 parameters"), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
    free(t);
}
