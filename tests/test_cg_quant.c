/*
 * test_cg_quant.c: quantised values in generated kernels. QuantizeLinear
 * and DequantizeLinear as elementwise ops (per tensor and per axis, int8
 * and uint8, saturation), DequantizeLinear as a float anchor's operand
 * prologue and QuantizeLinear in its epilogue, and the integer anchors
 * MatMulInteger and ConvInteger (8-bit operands less their zero points,
 * int sums) with a requantising epilogue. Each group runs on OpenCL (PoCL)
 * against the reference evaluator: bit for bit wherever the math is
 * integer or the same float operations in the same order; whole plans run
 * nothing on the host; the CUDA text compiles with NVRTC.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cg_util.h"
#include "kf_cost.h"

/* Quantise, dequantise, requantise per channel: uint8 and int8, with and
 * without a zero point, saturating (|x| / 0.005 reaches 400), a NaN-free
 * float chain around them. */
#define QDQ_ELEMENTWISE                                                                                \
    "opset 13\ninput x float[2, 3, 5, 7]\n"                                                            \
    "const s float[] = 0.005\nconst z uint8[] = 128\n"                                                 \
    "const s3 float[3] = 0.01 0.03 0.002\nconst z3 int8[3] = -3 0 5\n"                                 \
    "q = QuantizeLinear(x, s, z)\n"                                                                    \
    "d = DequantizeLinear(q, s, z)\n"                                                                  \
    "r = Relu(d)\n"                                                                                    \
    "p = QuantizeLinear(r, s3, z3) {axis=1}\n"                                                         \
    "e = DequantizeLinear(p, s3, z3) {axis=-3}\n"                                                      \
    "u = QuantizeLinear(x, s)\n"                                                                       \
    "f = DequantizeLinear(u, s)\n"                                                                     \
    "y = Mul(e, f)\n"                                                                                  \
    "output q\noutput p\noutput y\n"

/* A QDQ convolution at float32: the dequantised input and per-channel
 * weights are the operands, quantised again after the Relu. */
#define QDQ_CONV_FLOAT                                                                                 \
    "opset 13\ninput x float[2, 4, 9, 9]\n"                                                            \
    "const w float[6, 4, 3, 3] = random\n"                                                             \
    "const b float[6] = random\n"                                                                      \
    "const sw float[6] = 0.02 0.015 0.03 0.01 0.025 0.02\nconst zw int8[6] = 0\n"                      \
    "const sx float[] = 0.02\nconst zx uint8[] = 128\n"                                                \
    "wq = QuantizeLinear(w, sw, zw) {axis=0}\n"                                                        \
    "xq = QuantizeLinear(x, sx, zx)\n"                                                                 \
    "xd = DequantizeLinear(xq, sx, zx)\n"                                                              \
    "wd = DequantizeLinear(wq, sw, zw) {axis=0}\n"                                                     \
    "c = Conv(xd, wd, b) {pads=[1,1,1,1]}\n"                                                           \
    "output c\n"

/* ConvInteger with per-channel weight zero points, strides and padding
 * (padding adds nothing: the input's zero point pads it), requantised:
 * int32 sums -> float -> scale -> Relu -> uint8. */
#define CONV_INTEGER                                                                                   \
    "opset 13\ninput x float[2, 4, 9, 10]\n"                                                           \
    "const w float[6, 4, 3, 3] = random\n"                                                             \
    "const sw float[6] = 0.02 0.015 0.03 0.01 0.025 0.02\nconst zw int8[6] = 0 1 -2 0 3 0\n"           \
    "const sx float[] = 0.02\nconst zx uint8[] = 128\n"                                                \
    "const sc float[6, 1, 1] = 0.0004 0.0003 0.0006 0.0002 0.0005 0.0004\n"                            \
    "const so float[] = 0.05\nconst zo uint8[] = 0\n"                                                  \
    "wq = QuantizeLinear(w, sw, zw) {axis=0}\n"                                                        \
    "xq = QuantizeLinear(x, sx, zx)\n"                                                                 \
    "acc = ConvInteger(xq, wq, zx, zw) {pads=[1,1,1,1], strides=[2,1]}\n"                             \
    "f = Cast(acc) {to=1}\n"                                                                           \
    "y = Mul(f, sc)\n"                                                                                 \
    "r = Relu(y)\n"                                                                                    \
    "o = QuantizeLinear(r, so, zo)\n"                                                                  \
    "output o\noutput acc\n"

/* MatMulInteger off the tile sizes (M 5, K 37, N 70), batched A, uint8 x
 * int8 with per-column B zero points, and int8 x int8; requantised to
 * int8. */
#define MATMUL_INTEGER                                                                                 \
    "opset 13\ninput a float[2, 5, 37]\n"                                                              \
    "const b float[37, 70] = random\n"                                                                 \
    "const sb float[70] = 0.02\nconst zb int8[70] = 0 1 -1 2\n"                                        \
    "const sa float[] = 0.02\nconst za uint8[] = 100\nconst zs int8[] = -7\n"                          \
    "const so float[] = 0.03\nconst zo int8[] = 3\n"                                                   \
    "aq = QuantizeLinear(a, sa, za)\n"                                                                 \
    "as = QuantizeLinear(a, sa, zs)\n"                                                                 \
    "bq = QuantizeLinear(b, sb, zb) {axis=1}\n"                                                        \
    "m = MatMulInteger(aq, bq, za, zb)\n"                                                              \
    "f = Cast(m) {to=1}\n"                                                                             \
    "y = Mul(f, sb)\n"                                                                                 \
    "t = Mul(y, sa)\n"                                                                                 \
    "o = QuantizeLinear(t, so, zo)\n"                                                                  \
    "n = MatMulInteger(as, bq, zs)\n"                                                                  \
    "output o\noutput n\n"

/* The packed integer GEMM over several tiles each way (M 70, N 130, K 300:
 * not a multiple of the 16-deep k step nor of the 4 lanes of a word) with
 * every zero-point form of its sums: uint8 x uint8 with both zero points
 * (row and column sums and the K za zb term), uint8 without a zero point
 * (moved to int8, its zero point -128), int8 x int8 with none (no sums), and
 * a batch of B broadcast against a 2-D A. */
#define MATMUL_INTEGER_TILES                                                                           \
    "opset 13\ninput a float[70, 300]\ninput c float[2, 300, 130]\n"                                   \
    "const b float[300, 130] = random\n"                                                               \
    "const s float[] = 0.01\nconst za uint8[] = 131\nconst zb uint8[130] = 120 128 140 7\nconst zs int8[] = 0\nconst sb float[130] = 0.01 0.02\n" \
    "aq = QuantizeLinear(a, s, za)\n"                                                                  \
    "bq = QuantizeLinear(b, sb, zb) {axis=1}\n"                                                         \
    "au = QuantizeLinear(a, s)\n"                                                                      \
    "as = QuantizeLinear(a, s, zs)\n"                                                                  \
    "cs = QuantizeLinear(c, s, zs)\n"                                                                  \
    "m1 = MatMulInteger(aq, bq, za, zb)\n"                                                             \
    "m2 = MatMulInteger(au, bq)\n"                                                                     \
    "m3 = MatMulInteger(as, cs)\n"                                                                     \
    "output m1\noutput m2\noutput m3\n"

/* Enough output tiles for the 64 x 64 integer GEMM (5 x 27 = 135 of
 * them, KF_GEMM_FILL_TILES), the other tests' shapes taking 32 x 32. */
#define MATMUL_INTEGER_BIG                                                                             \
    "opset 13\ninput a float[260, 20]\n"                                                              \
    "const b float[20, 1700] = random\n"                                                              \
    "const s float[] = 0.01\nconst za uint8[] = 131\nconst zb int8[] = 3\n"                           \
    "aq = QuantizeLinear(a, s, za)\n"                                                                  \
    "bq = QuantizeLinear(b, s, zb)\n"                                                                  \
    "m = MatMulInteger(aq, bq, za, zb)\n"                                                              \
    "output m\n"

/* Every group of the chosen kinds generates and equals the reference
 * within atol (0: bit for bit); returns how many ran. */
static uint32_t run_kinds(const char *text, unsigned kinds, double atol) {
    cgu_run_opts o = {kinds, NULL, atol, 0, atol, 0, NULL, NULL};
    return cgu_run_groups(text, &o);
}

#define EW (1u << KF_GROUP_ELEMWISE)
#define ANCHOR (1u << KF_GROUP_ANCHOR)

Test(cg_quant, quantize_dequantize_elementwise_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(run_kinds(QDQ_ELEMENTWISE, EW, 0), 1);
}

/* The float anchor reads int8 weights and uint8 inputs and dequantises
 * them as its tiles load; its sums are float (the reference's double). */
Test(cg_quant, dequantized_operands_feed_a_float_conv_on_opencl) {
    cgu_need_opencl();
    cr_assert_geq(run_kinds(QDQ_CONV_FLOAT, ANCHOR, cgu_dot_atol(36)), 1);
}

Test(cg_quant, conv_integer_with_requantize_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cr_assert_geq(run_kinds(CONV_INTEGER, ANCHOR, 0), 1);
}

Test(cg_quant, matmul_integer_with_requantize_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(run_kinds(MATMUL_INTEGER, ANCHOR, 0), 2);
}

/* The planner puts the requantising epilogue in the integer anchor's
 * group, and the whole plan runs nothing on the host. */
Test(cg_quant, packed_integer_gemm_every_zero_point_form_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(run_kinds(MATMUL_INTEGER_TILES, ANCHOR, 0), 3);
}

/* Both tile sizes of the integer GEMM: the kernel text says which it took. */
Test(cg_quant, integer_gemm_takes_64_tiles_only_when_there_are_enough) {
    cr_expect_eq(kf_igemm_tile(128, 768, 1), 32, "BERT-base's 128 x 768: 24 tiles of 64");
    cr_expect_eq(kf_igemm_tile(128, 3072, 1), 32, "96 tiles of 64");
    cr_expect_eq(kf_igemm_tile(512, 3072, 1), 64);
    cr_expect_eq(kf_igemm_tile(128, 768, 8), 64, "a batch of 8: 192 tiles");
    cr_expect_eq(kf_igemm_tile(260, 1700, 1), 64);
    cgu_need_opencl();
    cr_assert_eq(run_kinds(MATMUL_INTEGER_BIG, ANCHOR, 0), 1);
}

Test(cg_quant, integer_anchor_groups_hold_the_requantize_and_nothing_runs_on_the_host) {
    cgu_need_opencl();
    kf_model *m = gt_parse(CONV_INTEGER);
    kf_plan *p = cgu_plan(m);
    const kf_graph *g = m->graph;
    uint32_t ga = p->group_of[g->values[kf_graph_find(g, "acc")].producer];
    cr_assert_eq(p->groups[ga].kind, KF_GROUP_ANCHOR);
    cr_assert_eq(p->group_of[g->values[kf_graph_find(g, "o")].producer], ga, "the requantize is a group of its own");
    kf_plan_free(p);
    kf_exec_stats s = cgu_opencl_matches_ref(m, 2);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_model_free(m);
}

/* Forms the kernels do not compute stay opaque host steps with the
 * reference's semantics: blocked scales, 16-bit integers. */
Test(cg_quant, blocked_and_16_bit_quantization_stay_opaque) {
    kf_model *m = gt_parse("opset 21\ninput x float[4, 6]\n"
                           "const s float[4, 2] = 0.1\nconst z int16[] = 0\nconst t float[] = 0.1\n"
                           "q = QuantizeLinear(x, s) {axis=1, block_size=3}\n"
                           "r = QuantizeLinear(x, t, z)\n"
                           "output q\noutput r\n");
    kf_plan *p = cgu_plan(m);
    const kf_graph *g = m->graph;
    for (int i = 0; i < 2; i++) {
        kf_id v = kf_graph_find(g, i ? "r" : "q");
        cr_assert_eq(p->groups[p->group_of[g->values[v].producer]].kind, KF_GROUP_OPAQUE);
    }
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg_quant, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_eq(cgu_nvrtc_check_text(QDQ_ELEMENTWISE, EW), 1);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_INTEGER, ANCHOR), 1);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER, ANCHOR), 2);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_TILES, ANCHOR), 3);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_BIG, ANCHOR), 1);
}
