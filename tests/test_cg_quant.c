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

/* The same forms on float16 and bfloat16 (what fp16/bf16 plans of a QDQ
 * model hold, opset 19+): the scale of the float type, int8/uint8 and
 * float8 codes. */
#define QDQ_ELEMENTWISE_16                                                                             \
    "opset 21\ninput x float16[2, 3, 5, 7]\ninput b bfloat16[3, 5]\n"                                  \
    "const s float16[] = 0.005\nconst z uint8[] = 128\nconst s3 float16[3] = 0.01 0.03 0.002\n"          \
    "const z3 int8[3] = -3 0 5\nconst t bfloat16[5] = 0.01 0.02 0.004 0.5 0.001\n"                      \
    "q = QuantizeLinear(x, s, z)\n"                                                                    \
    "d = DequantizeLinear(q, s, z)\n"                                                                  \
    "r = Relu(d)\n"                                                                                    \
    "p = QuantizeLinear(r, s3, z3) {axis=1}\n"                                                         \
    "e = DequantizeLinear(p, s3, z3) {axis=1}\n"                                                       \
    "u = QuantizeLinear(b, t) {axis=1, output_dtype=17}\n"                                             \
    "f = DequantizeLinear(u, t) {axis=1}\n"                                                            \
    "output q\noutput p\noutput e\noutput u\noutput f\n"

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

/* The integer GEMM over several tiles each way (M 70, N 130, K 300: not a
 * multiple of the 32-deep k step nor of the 4 lanes of a word) with
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

/* Enough output tiles for the 64 x 64 integer GEMM tile (5 x 27 = 135 of
 * them, KF_GEMM_FILL_TILES), the other tests' shapes taking 32 x 32. */
#define MATMUL_INTEGER_BIG                                                                             \
    "opset 13\ninput a float[260, 20]\n"                                                              \
    "const b float[20, 1700] = random\n"                                                              \
    "const s float[] = 0.01\nconst za uint8[] = 131\nconst zb int8[] = 3\n"                           \
    "aq = QuantizeLinear(a, s, za)\n"                                                                  \
    "bq = QuantizeLinear(b, s, zb)\n"                                                                  \
    "m = MatMulInteger(aq, bq, za, zb)\n"                                                              \
    "output m\n"

/* Integer convolutions of one group on the tensor-core tiles (kf_iconv),
 * off every multiple the tiles have: M 70 and 40 (fragments of 16), K 180
 * and 60 (k steps of 32), 143 and 48 pixels a batch (columns of 32); int8
 * input with a zero point and no weight zero point (the row sums), uint8
 * input without one (moved to int8: zero point -128) against a per-tensor
 * weight zero point (both sums and the K zx zw term), a 1-D conv with
 * dilation and uneven pads, uint8 weights with per-channel zero points,
 * and a 3-D conv. Padding reads the zero point. */
#define CONV_INTEGER_TILES                                                                             \
    "opset 13\ninput x float[2, 20, 11, 13]\ninput y float[2, 12, 30]\ninput v float[1, 3, 5, 6, 7]\n"     \
    "const w1 float[70, 20, 3, 3] = random\nconst w2 float[40, 20, 1, 1] = random\n"                   \
    "const w3 float[10, 12, 5] = random\nconst w4 float[6, 3, 2, 3, 3] = random\n"                      \
    "const s float[] = 0.01\nconst zs int8[] = -5\nconst zw int8[] = 3\n"                               \
    "const zu uint8[10] = 120 128 131 7 200 0 255 128 90 128\nconst su float[10] = 0.01\n"             \
    "xq = QuantizeLinear(x, s, zs)\n"                                                                  \
    "xu = QuantizeLinear(x, s)\n"                                                                      \
    "yq = QuantizeLinear(y, s, zs)\n"                                                                  \
    "vq = QuantizeLinear(v, s, zs)\n"                                                                  \
    "q1 = QuantizeLinear(w1, s, zs)\nq2 = QuantizeLinear(w2, s, zw)\n"                                 \
    "q3 = QuantizeLinear(w3, su, zu) {axis=0}\nq4 = QuantizeLinear(w4, s, zs)\n"                        \
    "c1 = ConvInteger(xq, q1, zs) {pads=[1,1,1,1]}\n"                                                  \
    "c2 = ConvInteger(xu, q2, , zw) {strides=[2,2]}\n"                                                 \
    "c3 = ConvInteger(yq, q3, zs, zu) {pads=[3,1], dilations=[2]}\n"                                   \
    "c4 = ConvInteger(vq, q4, zs) {pads=[1,0,1,1,1,1]}\n"                                              \
    "f = Cast(c1) {to=1}\n"                                                                            \
    "g = Mul(f, s)\n"                                                                                  \
    "o = QuantizeLinear(g, s, zs)\n"                                                                   \
    "output o\noutput c2\noutput c3\noutput c4\n"

/* 2 x 66 tiles of 64 (KF_GEMM_FILL_TILES): the 64 x 64 integer conv. */
#define CONV_INTEGER_BIG                                                                               \
    "opset 13\ninput x float[1, 8, 66, 64]\n"                                                          \
    "const w float[128, 8, 3, 3] = random\n"                                                          \
    "const s float[] = 0.01\nconst zs int8[] = -128\n"                                                 \
    "xq = QuantizeLinear(x, s, zs)\nwq = QuantizeLinear(w, s)\n"                                       \
    "c = ConvInteger(xq, wq, zs) {pads=[1,1,1,1]}\n"                                                   \
    "output c\n"

/* Float8 convolutions on the same tensor-core tiles (kf_f8conv): float8
 * inputs and weights behind one DequantizeLinear each, their codes loaded
 * as the integer tile loads int8, the float sums scaled after the k loop.
 * The same edges as CONV_INTEGER_TILES: E4M3 x E4M3 with weights scaled
 * per output channel, bias and ReLU, requantized to E4M3 for a next layer;
 * E5M2 input x E4M3 weights with strides; a 1-D conv with E5M2 weights,
 * dilation and uneven pads; a 3-D conv; K 180, 60, 60 and 54 (k steps of
 * 32), M 70, 40, 10, 6. Padding reads code 0. */
#define CONV_FLOAT8_TILES                                                                              \
    "opset 21\ninput x float8e4m3fn[2, 20, 11, 13]\ninput xe float8e5m2[2, 20, 11, 13]\n"              \
    "input y float8e4m3fn[2, 12, 30]\ninput v float8e4m3fn[1, 3, 5, 6, 7]\n"                             \
    "const w1 float8e4m3fn[70, 20, 3, 3] = random\nconst w2 float8e4m3fn[40, 20, 1, 1] = random\n"       \
    "const w3 float8e5m2[10, 12, 5] = random\nconst w4 float8e4m3fn[6, 3, 2, 3, 3] = random\n"           \
    "const s float[] = 0.05\nconst s1 float[70] = 0.01 0.02 0.03 0.04 0.05 0.06 0.07\n"                 \
    "const b1 float[70] = random\nconst so float[] = 0.25\n"                                           \
    "xd = DequantizeLinear(x, s)\nxed = DequantizeLinear(xe, s)\n"                                     \
    "yd = DequantizeLinear(y, s)\nvd = DequantizeLinear(v, s)\n"                                       \
    "d1 = DequantizeLinear(w1, s1) {axis=0}\nd2 = DequantizeLinear(w2, s)\n"                           \
    "d3 = DequantizeLinear(w3, s)\nd4 = DequantizeLinear(w4, s)\n"                                     \
    "c1 = Conv(xd, d1, b1) {pads=[1,1,1,1]}\nr1 = Relu(c1)\n"                                         \
    "o = QuantizeLinear(r1, so) {output_dtype=17}\n"                                                   \
    "c2 = Conv(xed, d2) {strides=[2,2]}\n"                                                            \
    "c3 = Conv(yd, d3) {pads=[3,1], dilations=[2]}\n"                                                  \
    "c4 = Conv(vd, d4) {pads=[1,0,1,1,1,1]}\n"                                                         \
    "output o\noutput c2\noutput c3\noutput c4\n"

/* 2 x 66 tiles of 64: the 64 x 64 float8 conv. */
#define CONV_FLOAT8_BIG                                                                                \
    "opset 21\ninput x float8e4m3fn[1, 8, 66, 64]\n"                                                   \
    "const w float8e4m3fn[128, 8, 3, 3] = random\nconst s float[] = 0.05\n"                            \
    "xd = DequantizeLinear(x, s)\nwd = DequantizeLinear(w, s)\n"                                       \
    "c = Conv(xd, wd) {pads=[1,1,1,1]}\n"                                                             \
    "output c\n"

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

Test(cg_quant, quantize_dequantize_on_16_bit_floats_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    kf_model *m = gt_parse(QDQ_ELEMENTWISE_16);
    kf_plan *p = cgu_plan(m);
    for (uint32_t gi = 0; gi < p->ngroups; gi++)
        cr_assert_eq(p->groups[gi].kind, KF_GROUP_ELEMWISE, "group %u is not elementwise", gi);
    kf_plan_free(p);
    kf_model_free(m);
    cr_assert_geq(run_kinds(QDQ_ELEMENTWISE_16, EW, 0), 1);
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

/* The tile size a kf_imma or kf_iconv kernel says it took. */
static void mma8_tile_seen(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    int *tiles = ctx;
    cr_assert_not_null(strstr(k->body, "KF_MMA_I8("), "%s", k->body);
    if (strstr(k->body, "64 x 64 tiles")) tiles[1]++;
    else if (strstr(k->body, "32 x 32 tiles")) tiles[0]++;
}

/* MatMulInteger takes the integer convolution's tensor-core tile: both
 * tile sizes, every zero-point form, a batch of B broadcast against 2-D A;
 * the kernel text says which tile it took. */
Test(cg_quant, integer_gemm_on_tensor_core_tiles_every_zero_point_form_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    int tiles[2] = {0, 0};
    cgu_run_opts o = {ANCHOR, "kf_imma", 0, 0, 0, 0, mma8_tile_seen, tiles};
    cr_assert_eq(cgu_run_groups(MATMUL_INTEGER_TILES, &o), 3);
    cr_assert_eq(cgu_run_groups(MATMUL_INTEGER, &o), 2);
    cr_assert_eq(tiles[0], 5, "32 x 32 tiles for these small outputs");
    cr_assert_eq(cgu_run_groups(MATMUL_INTEGER_BIG, &o), 1);
    cr_assert_eq(tiles[1], 1, "64 x 64 tiles when there are enough");
}

/* A read a word at a time (a kernel parameter, K a multiple of 4): int8 A
 * batched like the output against 2-D and batched B, with A's zero point
 * (B's column sums); uint8 A (lanes flipped to int8) against uint8 B with
 * per-column zero points (both sums and the K za zb term). */
#define MATMUL_INTEGER_STORED                                                                          \
    "opset 13\ninput a int8[2, 40, 96]\ninput u uint8[70, 64]\n"                                       \
    "const b int8[96, 80] = random\nconst c int8[2, 96, 50] = random\nconst w uint8[64, 30] = random\n" \
    "const za int8[] = 3\nconst zu uint8[] = 140\n"                                                    \
    "const zw uint8[30] = 120 128 131 7 200 0 255 128 90 128\n"                                          \
    "m1 = MatMulInteger(a, b, za)\n"                                                                   \
    "m2 = MatMulInteger(a, c)\n"                                                                       \
    "m3 = MatMulInteger(u, w, zu, zw)\n"                                                               \
    "output m1\noutput m2\noutput m3\n"

/* The word loads of A: the kernels read in0 through KF_LOAD_W4. */
static void a_words_seen(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    cr_assert_not_null(strstr(k->body, "KF_LOAD_W4(in0,"), "%s", k->body);
    ++*(int *)ctx;
}

Test(cg_quant, integer_gemm_reads_a_stored_operand_a_word_at_a_time_on_opencl) {
    cgu_need_opencl();
    int seen = 0;
    cgu_run_opts o = {ANCHOR, "kf_imma", 0, 0, 0, 0, a_words_seen, &seen};
    cr_assert_eq(cgu_run_groups(MATMUL_INTEGER_STORED, &o), 3);
    cr_assert_eq(seen, 3);
}

/* Which MatMulInteger takes the tensor-core tile, and which size. */
Test(cg_quant, integer_gemm_tile_choice) {
    kf_model *m = gt_parse("opset 13\ninput a int8[2, 128, 768]\ninput v uint8[768]\ninput f float[128, 768]\n"
                           "input u uint8[512, 768]\n"
                           "const w int8[768, 3072] = random\nconst w2 int8[2, 768, 768] = random\n"
                           "const wf float[768, 768] = random\n"
                           "m1 = MatMulInteger(a, w)\nm2 = MatMulInteger(u, w)\nm3 = MatMulInteger(v, w)\n"
                           "m4 = MatMulInteger(a, w2)\nm5 = MatMul(f, wf)\n"
                           "output m1, m2, m3, m4, m5\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    const kf_graph *g = m->graph;
    int t[5], k = 0;
    for (kf_id i = 1; i < g->nnodes && k < 5; i++)
        if (!g->nodes[i].dead) t[k++] = kf_imma_gemm_tile(g, &g->nodes[i]);
    cr_assert_eq(k, 5);
    cr_expect_eq(t[0], 64, "a batch of 2 x 2 x 48 tiles of 64: %d", t[0]);
    cr_expect_eq(t[1], 64, "8 x 48 tiles of 64: %d", t[1]);
    cr_expect_eq(t[2], 0, "a 1-D A keeps the packed GEMM: %d", t[2]);
    cr_expect_eq(t[3], 32, "2 x 2 x 12 tiles of 64 are too few: %d", t[3]);
    cr_expect_eq(t[4], 0, "a float MatMul: %d", t[4]);
    kf_model_free(m);
}

/* A MatMulInteger of a vector keeps the packed integer GEMM (kf_igemm:
 * four 8-bit lanes a word, KF_DOT4): uint8 vector x int8 matrix with both
 * zero points, and an int8 matrix x uint8 vector. */
#define MATMUL_INTEGER_VECTOR                                                                          \
    "opset 13\ninput a float[37]\ninput c float[70, 37]\n"                                            \
    "const b float[37, 70] = random\n"                                                                 \
    "const s float[] = 0.02\nconst za uint8[] = 131\nconst zb int8[] = -3\n"                          \
    "aq = QuantizeLinear(a, s, za)\n"                                                                  \
    "bq = QuantizeLinear(b, s, zb)\n"                                                                  \
    "cq = QuantizeLinear(c, s, zb)\n"                                                                  \
    "m1 = MatMulInteger(aq, bq, za, zb)\n"                                                             \
    "m2 = MatMulInteger(cq, aq, zb, za)\n"                                                             \
    "output m1\noutput m2\n"

/* Both tile sizes of the packed integer GEMM (kf_igemm_tile), and its
 * vector forms on OpenCL. */
Test(cg_quant, packed_integer_gemm_of_a_vector_bit_for_bit_on_opencl) {
    cr_expect_eq(kf_igemm_tile(128, 768, 1), 32, "BERT-base's 128 x 768: 24 tiles of 64");
    cr_expect_eq(kf_igemm_tile(128, 3072, 1), 32, "96 tiles of 64");
    cr_expect_eq(kf_igemm_tile(512, 3072, 1), 64);
    cr_expect_eq(kf_igemm_tile(128, 768, 8), 64, "a batch of 8: 192 tiles");
    cr_expect_eq(kf_igemm_tile(260, 1700, 1), 64);
    cgu_need_opencl();
    cgu_run_opts o = {ANCHOR, "kf_igemm", 0, 0, 0, 0, NULL, NULL};
    cr_assert_eq(cgu_run_groups(MATMUL_INTEGER_VECTOR, &o), 2);
}

Test(cg_quant, conv_integer_on_tensor_core_tiles_every_zero_point_form_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    int tiles[2] = {0, 0};
    cgu_run_opts o = {ANCHOR, "kf_iconv", 0, 0, 0, 0, mma8_tile_seen, tiles};
    cr_assert_eq(cgu_run_groups(CONV_INTEGER_TILES, &o), 4);
    cr_assert_eq(cgu_run_groups(CONV_INTEGER, &o), 1);
    cr_assert_eq(tiles[0], 5, "32 x 32 tiles for these small outputs");
    cr_assert_eq(cgu_run_groups(CONV_INTEGER_BIG, &o), 1);
    cr_assert_eq(tiles[1], 1, "64 x 64 tiles when there are enough");
}

/* The tile size a kf_f8conv kernel says it took. */
static void f8conv_tile_seen(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    int *tiles = ctx;
    cr_assert_not_null(strstr(k->body, "KF_MMA_F8("), "%s", k->body);
    cr_assert_eq(k->parts, KF_CG_PART_F8 | KF_CG_PART_F8MMA);
    if (strstr(k->body, "64 x 64 tiles")) tiles[1]++;
    else if (strstr(k->body, "32 x 32 tiles")) tiles[0]++;
}

/* Float sums: the reference adds in double, the tile in float. */
Test(cg_quant, float8_conv_on_tensor_core_tiles_on_opencl) {
    cgu_need_opencl();
    int tiles[2] = {0, 0};
    cgu_run_opts o = {ANCHOR, "kf_f8conv", cgu_dot_atol(180), 1e-5, 0, 0, f8conv_tile_seen, tiles};
    cr_assert_eq(cgu_run_groups(CONV_FLOAT8_TILES, &o), 4);
    cr_assert_eq(tiles[0], 4, "32 x 32 tiles for these small outputs");
    cr_assert_eq(cgu_run_groups(CONV_FLOAT8_BIG, &o), 1);
    cr_assert_eq(tiles[1], 1, "64 x 64 tiles when there are enough");
}

/* A grouped ConvInteger keeps the direct template (one work-item per
 * pixel and 4 channels): the tiles hold one group's channels only. */
Test(cg_quant, grouped_conv_integer_keeps_the_direct_template) {
    cgu_need_opencl();
    cgu_run_opts o = {ANCHOR, "kf_conv", 0, 0, 0, 0, NULL, NULL};
    cr_assert_eq(cgu_run_groups("opset 13\ninput x float[2, 8, 7, 7]\nconst w float[8, 4, 3, 3] = random\n"
                                "const s float[] = 0.01\nconst z uint8[] = 100\n"
                                "xq = QuantizeLinear(x, s, z)\nwq = QuantizeLinear(w, s, z)\n"
                                "c = ConvInteger(xq, wq, z, z) {group=2, pads=[1,1,1,1]}\noutput c\n",
                                &o),
                 1);
}

Test(cg_quant, integer_anchor_groups_hold_the_requantize_and_nothing_runs_on_the_host) {
    cgu_need_opencl();
    kf_model *m = gt_parse(CONV_INTEGER);
    kf_plan *p = cgu_plan(m);
    uint32_t ga = cgu_group_of(m, p, "acc");
    cr_assert_eq(p->groups[ga].kind, KF_GROUP_ANCHOR);
    cr_assert_eq(cgu_group_of(m, p, "o"), ga, "the requantize is a group of its own");
    kf_plan_free(p);
    kf_exec_stats s = cgu_opencl_matches_ref(m, 2);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_model_free(m);
}

/* A pooler's select of the first token after the last LayerNorm, at one
 * token per sequence (the Gather keeps the element count) and then
 * quantized: the planner keeps the Gather and what computes on it out of
 * a reduction kernel's group (an anchor's row epilogue takes it), and
 * every group generates. */
Test(cg_quant, a_select_after_a_row_normalization_leaves_its_group) {
    static const char *texts[] = {
        "opset 17\ninput x float[1, 1, 16]\nconst g float[16] = random\nconst i int64[] = 0\n"
        "const s float[] = 0.01\nconst z uint8[] = 128\n"
        "n = LayerNormalization(x, g)\nt = Gather(n, i) {axis=1}\nq = QuantizeLinear(t, s, z)\n"
        "output n\noutput q\n",
        "opset 17\ninput x float[1, 1, 16]\nconst w float[16, 16] = random\nconst g float[16] = random\n"
        "const i int64[] = 0\nconst s float[] = 0.01\nconst z uint8[] = 128\n"
        "m = MatMul(x, w)\nn = LayerNormalization(m, g)\nt = Gather(n, i) {axis=1}\nq = QuantizeLinear(t, s, z)\n"
        "output n\noutput q\n",
    };
    for (int c = 0; c < 2; c++) {
        kf_model *m = gt_parse(texts[c]);
        kf_plan *p = cgu_plan(m);
        if (c == 0) cr_assert_neq(cgu_group_of(m, p, "q"), cgu_group_of(m, p, "n"), "the quantize joined the norm");
        for (uint32_t gi = 0; gi < p->ngroups; gi++) {
            char why[512];
            if (p->groups[gi].kind == KF_GROUP_CONST) continue;
            cr_assert_null(kf_cg_unsupported(m, p, gi, why, sizeof why), "case %d group %u: %s", c, gi, why);
        }
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* Forms the kernels do not compute stay opaque host steps with the
 * reference's semantics: an opset-23 precision. */
Test(cg_quant, reduced_precision_quantization_stays_opaque) {
    kf_model *m = gt_parse("opset 23\ninput x float[4, 6]\n"
                           "const t float[] = 0.1\n"
                           "q = QuantizeLinear(x, t) {precision=10}\n"
                           "output q\n");
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->groups[cgu_group_of(m, p, "q")].kind, KF_GROUP_OPAQUE);
    kf_plan_free(p);
    kf_model_free(m);
}

/* 4-bit integers and blocked scales (opset 21): int4 with blocks of 3 along
 * axis 1 (6 -> 2 blocks) and zero points per block, uint4 per channel,
 * float8 in blocks of 4 along the last axis (10 -> 3, the last one short);
 * saturating (|x| / 0.05 reaches 20, past int4's 7). One elementwise group,
 * bit for bit. */
#define QDQ_4BIT_BLOCKED                                                                               \
    "opset 21\ninput x float[4, 6, 10]\n"                                                              \
    "const s float[4, 2, 10] = 0.05 0.2 0.1 0.3\nconst z int4[4, 2, 10] = 0 -1 2 3 -4\n"                \
    "const t float[10] = 0.1 0.15 0.2 0.25 0.3\nconst u uint4[10] = 8 7 9\n"                           \
    "const b float[4, 6, 3] = 0.01 0.02 0.005\n"                                                       \
    "q = QuantizeLinear(x, s, z) {axis=1, block_size=3}\n"                                             \
    "d = DequantizeLinear(q, s, z) {axis=1, block_size=3}\n"                                           \
    "p = QuantizeLinear(d, t, u) {axis=-1}\n"                                                          \
    "e = DequantizeLinear(p, t, u) {axis=2}\n"                                                         \
    "f = QuantizeLinear(x, b) {axis=2, block_size=4, output_dtype=17}\n"                               \
    "h = DequantizeLinear(f, b) {axis=2, block_size=4}\n"                                              \
    "y = Add(e, h)\n"                                                                                  \
    "output q\noutput p\noutput f\noutput y\n"

Test(cg_quant, four_bit_and_blocked_quantization_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cgu_assert_one_group(QDQ_4BIT_BLOCKED, KF_GROUP_ELEMWISE);
    cr_assert_eq(run_kinds(QDQ_4BIT_BLOCKED, EW, 0), 1);
}

/* 16-bit integers (opset 21): int16 per channel with zero points off the
 * middle, uint16 per tensor, both saturating (inputs in [-2, 2]:
 * 2 / 0.00005 - 1200 passes -32768, 2 / 0.0001 + 31000 passes 32767,
 * 2 / 0.00003 + 30000 passes 65535); one elementwise group, bit for bit. */
#define QDQ_16BIT                                                                                      \
    "opset 21\ninput x float[3, 40]\n"                                                                 \
    "const s float[3] = 0.00005 0.002 0.0001\nconst z int16[3] = -1200 0 31000\n"                      \
    "const t float[] = 0.00003\nconst u uint16[] = 30000\n"                                             \
    "q = QuantizeLinear(x, s, z) {axis=0}\n"                                                           \
    "d = DequantizeLinear(q, s, z) {axis=0}\n"                                                         \
    "p = QuantizeLinear(d, t, u)\n"                                                                    \
    "e = DequantizeLinear(p, t, u)\n"                                                                  \
    "output q\noutput p\noutput e\n"

Test(cg_quant, sixteen_bit_quantization_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cgu_assert_one_group(QDQ_16BIT, KF_GROUP_ELEMWISE);
    cr_assert_eq(run_kinds(QDQ_16BIT, EW, 0), 1);
}

Test(cg_quant, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_eq(cgu_nvrtc_check_text(QDQ_ELEMENTWISE, EW), 1);
    cr_assert_geq(cgu_nvrtc_check_text(QDQ_ELEMENTWISE_16, EW), 1);
    cr_assert_eq(cgu_nvrtc_check_text(QDQ_4BIT_BLOCKED, EW), 1);
    cr_assert_eq(cgu_nvrtc_check_text(QDQ_16BIT, EW), 1);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_INTEGER, ANCHOR), 1);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER, ANCHOR), 2);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_TILES, ANCHOR), 3);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_BIG, ANCHOR), 1);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_VECTOR, ANCHOR), 2);
    cr_assert_eq(cgu_nvrtc_check_text(MATMUL_INTEGER_STORED, ANCHOR), 3);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_INTEGER_TILES, ANCHOR), 4);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_INTEGER_BIG, ANCHOR), 1);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_FLOAT8_TILES, ANCHOR), 4);
    cr_assert_eq(cgu_nvrtc_check_text(CONV_FLOAT8_BIG, ANCHOR), 1);
}
