/*
 * test_cg_anchor.c: codegen/cg_anchor.c, the anchor templates (tiled GEMM
 * for MatMul/Gemm, direct convolution for Conv) with their fused prologues
 * and epilogues, run on OpenCL (PoCL on the CPU) against the reference
 * evaluator on random data; the CUDA text through NVRTC (sm_80/sm_90, no
 * spills); and the reasons for the anchor groups still declined.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"

/* DESIGN.md numerics, fused vs unfused: fp32 and fp16 (cgu_dot_atol for long K) */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3

/* When set, every output is held to this tolerance instead (outputs Cast
 * to float32 from 16-bit values carry the 16-bit rounding). */
static double cast_atol, cast_rtol;

typedef struct anchor_seen {
    char **body;     /* the first generated body, when asked for */
    uint32_t *rowred; /* anchor groups with a row reduction, when asked for */
} anchor_seen;

static void seen_anchor(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    anchor_seen *a = ctx;
    if (a->body && !*a->body) *a->body = kf_strdup(k->body);
    if (a->rowred && p->groups[gi].reduction) ++*a->rowred;
}

/* Plans text, generates every anchor group (all must be accepted), runs
 * each on OpenCL and compares each output with the reference; returns the
 * number of anchor kernels run. The first generated body goes to *body_out
 * when not NULL (caller frees). */
static uint32_t check_anchors(const char *text, int64_t K, char **body_out, uint32_t *rowred) {
    anchor_seen seen = {body_out, rowred};
    cgu_run_opts o = {1u << KF_GROUP_ANCHOR, NULL, cast_atol ? cast_atol : cgu_dot_atol(K), cast_rtol ? cast_rtol : RTOL,
                      cast_atol ? cast_atol : ATOL16, cast_rtol ? cast_rtol : RTOL16, seen_anchor, &seen};
    return cgu_run_groups(text, &o);
}


/* ---- graphs ------------------------------------------------------------ */

/* sizes off the 64 x 64 x 16 tiles on every side; bias + Relu epilogue */
#define MM_BIAS_RELU                                                                                  \
    "input x float[70, 45]\nconst w float[45, 33] = random\nconst b float[33] = random\n"             \
    "y = MatMul(x, w)\nz = Add(y, b)\nr = Relu(z)\noutput r\n"
/* batch dims broadcast (A [2, 3, 17, 40] x B [3, 40, 20]) with a residual Add */
#define MM_BATCHED                                                                                    \
    "input a float[2, 3, 17, 40]\ninput b float[3, 40, 20]\ninput res float[2, 3, 17, 20]\n"          \
    "y = MatMul(a, b)\nz = Add(y, res)\nt = Tanh(z)\noutput t\n"
/* 1-D operands: [40] x [2, 40, 7] -> [2, 7]; [5, 40] x [40] -> [5] */
#define MM_VECTORS                                                                                    \
    "input v float[40]\ninput b float[2, 40, 7]\ninput a float[5, 40]\ninput u float[40]\n"           \
    "y = MatMul(v, b)\ne = Exp(y)\nz = MatMul(a, u)\nn = Neg(z)\noutput e\noutput n\n"
/* Gemm: transA, transB, alpha, beta, C of [N] and C of [M, 1] */
#define GEMM_T                                                                                        \
    "input a float[37, 66]\ninput b float[70, 37]\nconst c float[70] = random\n"                     \
    "y = Gemm(a, b, c) {transA=1, transB=1, alpha=0.5, beta=2.0}\ns = Sigmoid(y)\noutput s\n"        \
    "input p float[66, 20]\ninput q float[20, 9]\nconst cm float[66, 1] = random\n"                   \
    "g = Gemm(p, q, cm) {beta=-1.5}\nh = Relu(g)\noutput h\n"
/* store-side layout maps: per-head split (Reshape + Transpose) after the GEMM */
#define MM_HEADS                                                                                      \
    "input x float[2, 10, 48]\nconst w float[48, 48] = random\nconst b float[48] = random\n"          \
    "const shp int64[4] = 2 10 4 12\n"                                                                \
    "y = MatMul(x, w)\nz = Add(y, b)\nr = Reshape(z, shp)\nt = Transpose(r) {perm=[0,2,1,3]}\noutput t\n"
/* QKV-style head split: Reshape, Unsqueeze, a 5-D Transpose, Squeeze (the
 * linear index is lost after the Transpose and rebuilt for the Squeeze) */
#define MM_QKV_SPLIT                                                                                  \
    "input x float[17, 1, 32]\nconst w float[32, 96] = random\nconst b float[96] = random\n"          \
    "const shp int64[4] = 17 1 3 32\nconst ax int64[1] = 0\nconst ax3 int64[1] = 3\n"                 \
    "y = MatMul(x, w)\nz = Add(b, y)\nr = Reshape(z, shp)\nu = Unsqueeze(r, ax)\n"                    \
    "t = Transpose(u) {perm=[3,1,2,0,4]}\ns = Squeeze(t, ax3)\noutput s\n"
/* merged QKV: one GEMM, a Split into three, each split per head (a select
 * on the store: each element is written to the one output that holds it) */
#define MM_QKV_MERGED_SPLIT                                                                           \
    "opset 13\ninput x float[2, 10, 32]\nconst w float[32, 96] = random\nconst b float[96] = random\n"  \
    "const sp int64[3] = 32 32 32\nconst shp int64[4] = 2 10 4 8\n"                                       \
    "y = MatMul(x, w)\nz = Add(y, b)\nq, k, v = Split(z, sp) {axis=-1}\n"                                \
    "qr = Reshape(q, shp)\nqt = Transpose(qr) {perm=[0,2,1,3]}\nkr = Reshape(k, shp)\n"                  \
    "kt = Transpose(kr) {perm=[0,2,3,1]}\nvr = Reshape(v, shp)\nvt = Transpose(vr) {perm=[0,2,1,3]}\n"    \
    "output qt\noutput kt\noutput vt\n"
/* torch's in-projection: [T, B, 3E] -> Reshape [T, B, 3, E] -> Transpose -> Gather 0/1/2 */
#define MM_QKV_GATHER                                                                                 \
    "opset 13\ninput x float[7, 2, 16]\nconst w float[16, 48] = random\nconst b float[48] = random\n"   \
    "const shp int64[4] = 7 2 3 16\nconst i0 int64[] = 0\nconst i1 int64[] = 1\nconst i2 int64[] = -1\n" \
    "y = MatMul(x, w)\nz = Add(b, y)\nr = Reshape(z, shp)\nt = Transpose(r) {perm=[2,0,1,3]}\n"           \
    "q = Gather(t, i0) {axis=0}\nk = Gather(t, i1) {axis=0}\nv = Gather(t, i2) {axis=0}\n"                \
    "output q\noutput k\noutput v\n"
/* operand prologues: K^T as a Transpose, a scale on the left operand */
#define MM_PROLOGUE                                                                                   \
    "input q float[2, 24, 16]\ninput k float[2, 24, 16]\nconst s float[] = 0.25\n"                   \
    "kt = Transpose(k) {perm=[0,2,1]}\nqs = Mul(q, s)\ny = MatMul(qs, kt)\noutput y\n"
/* long K: tolerance from cgu_dot_atol */
#define MM_LONG_K "input x float[9, 1024]\nconst w float[1024, 70] = random\ny = MatMul(x, w)\nz = Relu(y)\noutput z\n"
#define MM_HALF                                                                                       \
    "input x float16[20, 30]\nconst w float16[30, 25] = random\nconst b float16[25] = random\n"       \
    "y = MatMul(x, w)\nz = Add(y, b)\noutput z\n"

/* GEMM + bias + residual + LayerNorm over rows of 100 (off the 64-column
 * chunks), then a Relu after the LayerNorm; the residual sum is also an
 * output (stored from the GEMM pass) */
#define MM_LAYERNORM                                                                                  \
    "opset 17\ninput x float[2, 21, 40]\nconst w float[40, 100] = random\nconst b float[100] = random\n" \
    "input res float[2, 21, 100]\nconst g float[100] = random\nconst be float[100] = random\n"          \
    "y = MatMul(x, w)\nz = Add(y, b)\nh = Add(z, res)\nn = LayerNormalization(h, g, be) {axis=-1, epsilon=0.001}\n" \
    "r = Relu(n)\noutput r\noutput h\n"
/* Llama's norm after the attention output projection: GEMM + residual +
 * RMSNormalization over rows of 96, the residual sum also an output */
#define MM_RMSNORM                                                                                    \
    "opset 23\ninput x float[2, 13, 40]\nconst w float[40, 96] = random\n"                            \
    "input res float[2, 13, 96]\nconst g float[96] = random\n"                                          \
    "y = MatMul(x, w)\nh = Add(y, res)\nn = RMSNormalization(h, g) {axis=-1, epsilon=0.000001}\n"      \
    "output n\noutput h\n"
/* BERT's pooler input: GEMM + LayerNorm, then the first token's row only (a
 * select after the row reduction) */
#define MM_LN_CLS                                                                                     \
    "opset 17\ninput x float[2, 9, 24]\nconst w float[24, 40] = random\nconst g float[40] = random\n"   \
    "const i0 int64[] = 0\ny = MatMul(x, w)\nn = LayerNormalization(y, g) {axis=-1}\n"                   \
    "c = Gather(n, i0) {axis=1}\nt = Tanh(c)\noutput t\n"
/* QK^T + scale + mask + Softmax (batched over heads, K^T as a prologue) */
#define QK_SOFTMAX                                                                                    \
    "opset 13\ninput q float[2, 3, 19, 16]\ninput k float[2, 3, 19, 16]\nconst s float[] = 0.25\n"     \
    "input mask float[2, 1, 1, 19]\n"                                                                   \
    "kt = Transpose(k) {perm=[0,1,3,2]}\nm = MatMul(q, kt)\nsc = Mul(m, s)\na = Add(sc, mask)\n"       \
    "p = Softmax(a) {axis=-1}\noutput p\n"
/* a long row (768: 8 rows per work-group), LogSoftmax, Gemm with transB */
#define GEMM_LOGSOFTMAX                                                                               \
    "opset 13\ninput x float[13, 24]\nconst w float[768, 24] = random\nconst c float[768] = random\n"  \
    "y = Gemm(x, w, c) {transB=1}\nl = LogSoftmax(y) {axis=-1}\noutput l\n"

/* GPT-2/ViT style: a 2-D Gemm, Reshape to [T, 1, C], Transpose to [1, T, C] (only a dim of 1
 * moves), residual, LayerNorm */
#define GEMM_RESHAPE_LN                                                                               \
    "opset 17\ninput x float[11, 32]\nconst w float[32, 80] = random\nconst c float[80] = random\n"    \
    "const shp int64[3] = 11 1 80\ninput res float[1, 11, 80]\nconst g float[80] = random\n"           \
    "y = Gemm(x, w, c)\nr = Reshape(y, shp)\nt = Transpose(r) {perm=[1,0,2]}\nh = Add(res, t)\n"        \
    "n = LayerNormalization(h, g) {axis=-1}\noutput n\n"

/* ViT out-projection: Transpose + Reshape prologue, Gemm (transB), Reshape
 * + Transpose epilogue, residual (also an output), LayerNorm */
#define VIT_OUT_PROJ                                                                                  \
    "opset 17\ninput p float[1, 17, 64]\nconst w float[64, 64] = random\nconst b float[64] = random\n"  \
    "const s1 int64[2] = 17 64\nconst s2 int64[3] = 17 1 64\ninput res float[1, 17, 64]\n"            \
    "const g float[64] = random\nconst be float[64] = random\n"                                       \
    "tp = Transpose(p) {perm=[1,0,2]}\na = Reshape(tp, s1)\ny = Gemm(a, w, b) {transB=1}\n"             \
    "r = Reshape(y, s2)\nt = Transpose(r) {perm=[1,0,2]}\nh = Add(t, res)\n"                           \
    "n = LayerNormalization(h, g, be) {axis=-1}\noutput n\noutput h\n"

/* 2-D conv: stride 2, asymmetric pads, dilation, bias, residual Add, Relu */
#define CONV_2D                                                                                       \
    "input x float[2, 8, 15, 13]\nconst w float[12, 8, 3, 3] = random\nconst b float[12] = random\n"  \
    "input res float[2, 12, 8, 6]\n"                                                                  \
    "y = Conv(x, w, b) {strides=[2,2], pads=[1,0,1,2], dilations=[1,2]}\nz = Add(y, res)\n"          \
    "r = Relu(z)\noutput r\n"
/* grouped (2 groups of 6 -> 2 x 3 channels: one channel per work-item) and depthwise with Clip */
#define CONV_GROUPS                                                                                   \
    "opset 13\ninput x float[1, 12, 9, 9]\nconst w float[6, 6, 3, 3] = random\n"                     \
    "const dw float[12, 1, 3, 3] = random\nconst lo float[] = -0.5\nconst hi float[] = 0.5\n"        \
    "y = Conv(x, w) {group=2, pads=[1,1,1,1]}\ne = Exp(y)\noutput e\n"                               \
    "d = Conv(x, dw) {group=12, auto_pad=\"SAME_UPPER\", strides=[2,2]}\nc = Clip(d, lo, hi)\noutput c\n"
/* 1-D and 3-D */
#define CONV_1D_3D                                                                                    \
    "input x float[2, 4, 31]\nconst w float[8, 4, 5] = random\n"                                      \
    "y = Conv(x, w) {pads=[2,2], strides=[3]}\ns = Sigmoid(y)\noutput s\n"                           \
    "input v float[1, 3, 6, 7, 5]\nconst wv float[4, 3, 3, 2, 3] = random\nconst bv float[4] = random\n" \
    "z = Conv(v, wv, bv) {pads=[1,0,1,1,1,1]}\noutput z\n"

/* conv -> 1x1 conv (back-to-back): ResNet's bottleneck end (1x1 conv + bias
 * + residual + Relu, its output also read by the next block's 1x1 conv and
 * by a later residual Add outside), and MobileNet's depthwise 3x3 + Clip ->
 * 1x1 projection */
#define CONV_B2B_RESNET                                                                               \
    "opset 13\ninput x float[2, 16, 7, 6]\nconst w float[24, 16, 1, 1] = random\nconst b float[24] = random\n" \
    "input res float[2, 24, 7, 6]\nconst w2 float[12, 24, 1, 1] = random\nconst b2 float[12] = random\n"   \
    "y = Conv(x, w, b)\nz = Add(y, res)\nr = Relu(z)\nc = Conv(r, w2, b2)\nq = Relu(c)\n"                \
    "input res2 float[2, 24, 7, 6]\nt = Add(r, res2)\noutput q\noutput t\n"
#define CONV_B2B_MOBILENET                                                                            \
    "opset 13\ninput x float[1, 24, 9, 9]\nconst dw float[24, 1, 3, 3] = random\nconst db float[24] = random\n" \
    "const lo float[] = 0\nconst hi float[] = 6\nconst pw float[40, 24, 1, 1] = random\n"                \
    "y = Conv(x, dw, db) {group=24, pads=[1,1,1,1], strides=[2,2]}\nc = Clip(y, lo, hi)\n"               \
    "p = Conv(c, pw)\noutput p\n"

/* GEMM -> GEMM: an FFN (bias + Relu between, bias + residual after) */
#define FFN_B2B                                                                                       \
    "opset 13\ninput x float[2, 10, 32]\nconst w1 float[32, 100] = random\nconst b1 float[100] = random\n" \
    "const w2 float[100, 32] = random\nconst b2 float[32] = random\n"                                    \
    "h = MatMul(x, w1)\nhb = Add(h, b1)\nr = Relu(hb)\ny = MatMul(r, w2)\nyb = Add(y, b2)\nz = Add(yb, x)\noutput z\n"
/* BERT's FFN: GEMM + bias + Relu -> GEMM + bias + residual -> LayerNorm (the
 * reduction after the second GEMM) */
#define FFN_B2B_LAYERNORM                                                                             \
    "opset 17\ninput x float[2, 10, 32]\nconst w1 float[32, 100] = random\nconst b1 float[100] = random\n" \
    "const w2 float[100, 32] = random\nconst b2 float[32] = random\nconst g float[32] = random\n"       \
    "const be float[32] = random\n"                                                                       \
    "h = MatMul(x, w1)\nhb = Add(h, b1)\nr = Relu(hb)\ny = MatMul(r, w2)\nyb = Add(y, b2)\nz = Add(yb, x)\n" \
    "n = LayerNormalization(z, g, be) {axis=-1}\noutput n\n"
/* attention as one group: QK^T * scale + mask, Softmax, x V */
#define ATTENTION_B2B                                                                                 \
    "opset 13\ninput q float[2, 3, 19, 16]\ninput k float[2, 3, 19, 16]\ninput v float[2, 3, 19, 16]\n"  \
    "const s float[] = 0.25\ninput mask float[2, 1, 1, 19]\n"                                            \
    "kt = Transpose(k) {perm=[0,1,3,2]}\nm = MatMul(q, kt)\nsc = Mul(m, s)\na = Add(sc, mask)\n"         \
    "p = Softmax(a) {axis=-1}\no = MatMul(p, v)\noutput o\n"

/* a merged QKV projection read by attention: the planner offers the
 * Split to its readers first (plan_build.c, select_edge), so the
 * attention group takes it as a prologue and loads q, k and v where they
 * lie in the projection's output; the GEMM is left alone */
#define QKV_SPLIT_ATTENTION                                                                           \
    "opset 13\ninput x float[2, 19, 32]\nconst w float[32, 144] = random\nconst b float[144] = random\n" \
    "const sp int64[3] = 48 48 48\nconst shp int64[4] = 2 19 3 16\nconst s float[] = 0.05\n"             \
    "input mask float[2, 1, 1, 19]\n"                                                                    \
    "y = MatMul(x, w)\nz = Add(y, b)\nq, k, v = Split(z, sp) {axis=-1}\n"                                \
    "qr = Reshape(q, shp)\nqt = Transpose(qr) {perm=[0,2,1,3]}\nkr = Reshape(k, shp)\n"                  \
    "kt = Transpose(kr) {perm=[0,2,3,1]}\nvr = Reshape(v, shp)\nvt = Transpose(vr) {perm=[0,2,1,3]}\n"    \
    "m = MatMul(qt, kt)\nsc = Mul(m, s)\na = Add(sc, mask)\np = Softmax(a) {axis=-1}\n"                  \
    "o = MatMul(p, vt)\not = Transpose(o) {perm=[0,2,1,3]}\noutput ot\n"

Test(cg_anchor, gemm_bias_relu_off_tile_sizes) {
    cgu_need_opencl();
    char *body = NULL;
    cr_assert_eq(check_anchors(MM_BIAS_RELU, 45, &body, NULL), 1);
    cr_assert_not_null(strstr(body, "kf_gemm("), "%s", body);
    cr_assert_not_null(strstr(body, "KF_BARRIER"), "%s", body);
    cr_assert_not_null(strstr(body, "= Relu(v"), "the epilogue is in the kernel:\n%s", body);
    kf_free(body);
}

Test(cg_anchor, matmul_batch_broadcast_and_residual) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_BATCHED, 40, NULL, NULL), 1);
}

Test(cg_anchor, matmul_of_vectors) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_VECTORS, 40, NULL, NULL), 2);
}

Test(cg_anchor, gemm_transposes_alpha_beta_c_broadcast) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(GEMM_T, 37, NULL, NULL), 2);
}

Test(cg_anchor, gemm_store_side_reshape_transpose) {
    cgu_need_opencl();
    char *body = NULL;
    cr_assert_eq(check_anchors(MM_HEADS, 48, &body, NULL), 1);
    cr_assert_not_null(strstr(body, "Transpose(v"), "the head split is fused:\n%s", body);
    kf_free(body);
}

Test(cg_anchor, gemm_store_side_unsqueeze_transpose_squeeze) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_QKV_SPLIT, 32, NULL, NULL), 1);
}

Test(cg_anchor, gemm_store_side_split_per_head) {
    cgu_need_opencl();
    char *body = NULL;
    cr_assert_eq(check_anchors(MM_QKV_MERGED_SPLIT, 32, &body, NULL), 1);
    cr_assert_not_null(strstr(body, "= Split(v"), "the split is fused:\n%s", body);
    kf_free(body);
}

Test(cg_anchor, gemm_store_side_gather_selects) {
    cgu_need_opencl();
    char *body = NULL;
    cr_assert_eq(check_anchors(MM_QKV_GATHER, 16, &body, NULL), 1);
    cr_assert_not_null(strstr(body, "= Gather(v"), "the selects are fused:\n%s", body);
    kf_free(body);
}

Test(cg_anchor, gemm_operand_prologues) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_PROLOGUE, 16, NULL, NULL), 1);
}

Test(cg_anchor, gemm_long_k) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_LONG_K, 1024, NULL, NULL), 1);
}

Test(cg_anchor, gemm_float16_storage) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(MM_HALF, 30, NULL, NULL), 1);
}

/* an fp16/bf16 plan's exit: the 16-bit GEMM result Cast back to float32
 * in the anchor's epilogue (one kernel, not a reference group) */
Test(cg_anchor, gemm_16bit_then_cast_to_float) {
    cgu_need_opencl();
    static const char *const dts[] = {"float16", "bfloat16"};
    static const double tol[2][2] = {{ATOL16, RTOL16}, {2e-2, 1e-2}}; /* DESIGN.md: bf16 2e-2 / 1e-2 */
    for (int i = 0; i < 2; i++) {
        char text[512];
        cast_atol = tol[i][0], cast_rtol = tol[i][1];
        snprintf(text, sizeof text,
                 "input x %s[20, 30]\nconst w %s[30, 25] = random\nconst b %s[25] = random\n"
                 "y = MatMul(x, w)\nz = Add(y, b)\nr = Relu(z)\nf = Cast(r) {to=1}\noutput f\n",
                 dts[i], dts[i], dts[i]);
        cr_assert_eq(check_anchors(text, 30, NULL, NULL), 1, "%s", dts[i]);
    }
    cast_atol = cast_rtol = 0;
}

Test(cg_anchor, gemm_residual_layernorm_rows) {
    cgu_need_opencl();
    char *body = NULL;
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(MM_LAYERNORM, 40, &body, &rows), 1);
    cr_assert_eq(rows, 1, "the planner fused the LayerNorm into the GEMM group");
    cr_assert_not_null(strstr(body, "kf_gemm_rows("), "%s", body);
    kf_free(body);
}

Test(cg_anchor, gemm_residual_rmsnorm_rows) {
    cgu_need_opencl();
    char *body = NULL;
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(MM_RMSNORM, 40, &body, &rows), 1);
    cr_assert_eq(rows, 1, "the planner fused the RMSNormalization into the GEMM group");
    cr_assert_not_null(strstr(body, "rsq"), "%s", body);
    kf_free(body);
}

Test(cg_anchor, gemm_layernorm_then_select_first_token) {
    cgu_need_opencl();
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(MM_LN_CLS, 24, NULL, &rows), 1);
    cr_assert_eq(rows, 1);
}

Test(cg_anchor, qkt_scale_mask_softmax_rows) {
    cgu_need_opencl();
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(QK_SOFTMAX, 16, NULL, &rows), 1);
    cr_assert_eq(rows, 1);
}

Test(cg_anchor, gemm_logsoftmax_long_rows) {
    cgu_need_opencl();
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(GEMM_LOGSOFTMAX, 24, NULL, &rows), 1);
    cr_assert_eq(rows, 1);
}

Test(cg_anchor, gemm_reshape_residual_layernorm_rows) {
    cgu_need_opencl();
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(GEMM_RESHAPE_LN, 32, NULL, &rows), 1);
    cr_assert_eq(rows, 1);
}

Test(cg_anchor, vit_out_projection_residual_layernorm) {
    cgu_need_opencl();
    uint32_t rows = 0;
    cr_assert_eq(check_anchors(VIT_OUT_PROJ, 64, NULL, &rows), 1);
    cr_assert_eq(rows, 1);
}

Test(cg_anchor, conv2d_strides_pads_dilations_bias_residual) {
    cgu_need_opencl();
    char *body = NULL;
    cr_assert_eq(check_anchors(CONV_2D, 8 * 9, &body, NULL), 1);
    cr_assert_not_null(strstr(body, "kf_conv("), "%s", body);
    cr_assert_not_null(strstr(body, "acc3"), "4 output channels per work-item:\n%s", body);
    kf_free(body);
}

Test(cg_anchor, conv_groups_and_depthwise) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(CONV_GROUPS, 6 * 9, NULL, NULL), 2);
}

Test(cg_anchor, conv_1d_and_3d) {
    cgu_need_opencl();
    cr_assert_eq(check_anchors(CONV_1D_3D, 3 * 18, NULL, NULL), 2);
}

static void check_b2b(const char *text, int64_t K, const char *kernel) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    uint32_t b2b = 0;
    for (uint32_t g = 0; g < p->ngroups; g++) b2b += p->groups[g].anchor2 != 0;
    kf_plan_free(p);
    kf_model_free(m);
    cr_assert_eq(b2b, 1, "the planner made one back-to-back group");
    char *body = NULL;
    cr_assert_eq(check_anchors(text, K, &body, NULL), 1);
    cr_assert_not_null(strstr(body, kernel), "%s", body);
    kf_free(body);
}

Test(cg_anchor, conv_then_1x1_conv_resnet) {
    cgu_need_opencl();
    check_b2b(CONV_B2B_RESNET, 24, "kf_conv_b2b(");
}

Test(cg_anchor, depthwise_then_1x1_conv_mobilenet) {
    cgu_need_opencl();
    check_b2b(CONV_B2B_MOBILENET, 24, "kf_conv_b2b(");
}

Test(cg_anchor, gemm_then_gemm_ffn) {
    cgu_need_opencl();
    check_b2b(FFN_B2B, 100, "kf_gemm_b2b(");
}

Test(cg_anchor, gemm_then_gemm_then_layernorm) {
    cgu_need_opencl();
    check_b2b(FFN_B2B_LAYERNORM, 100, "kf_gemm_b2b(");
}

Test(cg_anchor, attention_qkt_softmax_v) {
    cgu_need_opencl();
    check_b2b(ATTENTION_B2B, 19, "kf_attention(");
}

Test(cg_anchor, attention_takes_the_split_of_a_merged_projection) {
    cgu_need_opencl();
    kf_model *m = gt_parse(QKV_SPLIT_ATTENTION);
    kf_plan *p = cgu_plan(m);
    uint32_t att = cgu_group_of(m, p, "o");
    cr_expect_eq(cgu_group_of(m, p, "q"), att, "the Split is the attention's prologue");
    cr_expect_eq(cgu_group_of(m, p, "m"), att);
    cr_expect_neq(cgu_group_of(m, p, "z"), att);
    cr_expect_eq(cgu_group_of(m, p, "y"), cgu_group_of(m, p, "z"), "the projection keeps its bias");
    kf_plan_free(p);
    kf_model_free(m);
    char *body = NULL;
    /* The attention's outputs sum 19 probabilities times values that are
     * themselves sums of 32 products and a bias (up to about 8 in size),
     * against a reference that rounds its sums otherwise: about 1 seed in
     * 20 put an element past a unit-sized 48-term dot's tolerance (5.9e-5
     * off at -0.31). The tolerance is a 256-term dot's (2.4e-4); an
     * indexing or masking error is off by the values themselves. */
    uint32_t n = check_anchors(QKV_SPLIT_ATTENTION, 256, &body, NULL);
    cr_assert_eq(n, 2, "the projection and the attention");
    kf_free(body);
}

/* Reasons for anchor groups not generated yet; each names the node. */
/* GEMM + LayerNorm is generated; a back-to-back GEMM whose second epilogue
 * would read the first's output again (at its own element, another one
 * than the row the first pass stored) is kept apart by the planner
 * (KF_REASON_EPI_PARTS), and every group it makes is generated. */
Test(cg_anchor, back_to_back_reading_the_first_again_stays_apart) {
    kf_model *m = gt_parse("opset 17\ninput x float[8, 32]\nconst w float[32, 32] = random\n"
                           "const w2 float[32, 32] = random\nconst g float[32] = random\n"
                           "y = MatMul(x, w)\nn = LayerNormalization(y, g) {axis=-1}\noutput n\n"
                           "input u float[8, 32]\na = MatMul(u, w)\nr = Relu(a)\nb = MatMul(r, w2)\n"
                           "z = Add(b, r)\noutput z\n");
    kf_plan *p = cgu_plan(m);
    uint32_t gn = p->group_of[m->graph->values[kf_graph_find(m->graph, "n")].producer];
    uint32_t gz = p->group_of[m->graph->values[kf_graph_find(m->graph, "z")].producer];
    uint32_t ga = p->group_of[m->graph->values[kf_graph_find(m->graph, "a")].producer];
    cr_assert(p->groups[gn].reduction, "the planner fused the LayerNorm");
    cr_assert_neq(ga, gz, "the second epilogue reads the first's output: apart");
    bool found = false;
    for (uint32_t i = 0; i < p->nbounds; i++)
        found |= p->bounds[i].to == gz && !strcmp(p->bounds[i].reason, KF_REASON_EPI_PARTS);
    cr_assert(found, "a boundary into the Add's group names the reason");
    char why[512];
    for (uint32_t gi = 0; gi < p->ngroups; gi++)
        cr_assert_null(kf_cg_unsupported(m, p, gi, why, sizeof why), "group %u: %s", gi, why);
    kf_plan_free(p);
    kf_model_free(m);
}

/* An epilogue that reads the GEMM result at another element is declined. */
Test(cg_anchor, does_not_generate_anchor_read_elsewhere) {
    kf_model *m = gt_parse("input x float[16, 16]\nconst w float[16, 16] = random\n"
                           "y = MatMul(x, w)\nt = Transpose(y) {perm=[1,0]}\nz = Add(t, y)\noutput z\n");
    kf_plan *p = cgu_plan(m);
    uint32_t gz = p->group_of[m->graph->values[kf_graph_find(m->graph, "z")].producer];
    uint32_t gy = p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer];
    char why[512];
    if (gz == gy) {
        cr_assert_not_null(kf_cg_unsupported(m, p, gz, why, sizeof why));
        cr_assert_not_null(strstr(why, "MatMul"), "%s", why);
    } else cr_assert_null(kf_cg_unsupported(m, p, gy, why, sizeof why), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
}


Test(cg_anchor, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    const char *graphs[] = {MM_BIAS_RELU, MM_HEADS, MM_HALF, CONV_2D, MM_LAYERNORM, GEMM_LOGSOFTMAX, CONV_B2B_RESNET, FFN_B2B, ATTENTION_B2B, FFN_B2B_LAYERNORM, MM_RMSNORM};
    uint32_t n = 0;
    for (size_t gi = 0; gi < sizeof graphs / sizeof graphs[0]; gi++)
        n += cgu_nvrtc_check_text(graphs[gi], 1u << KF_GROUP_ANCHOR);
    cr_assert_eq(n, 11);
}
