/*
 * test_cg_lanes.c: codegen's steps of 4 or 8 elements (codegen.c
 * KF_CG_LANES: vector loads and stores of every read contiguous over a
 * step, broadcast rows included, 16-bit values 8 at a time) and rows held
 * in registers (KF_CG_ROW_CACHE: one read of each row), run on OpenCL
 * (PoCL on the CPU) against the reference evaluator in fp32/fp16/bf16,
 * with the texts checked for the vector forms and through NVRTC (sm_80,
 * sm_90, no spills).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cg_util.h"

/* DESIGN.md numerics, fused vs unfused: fp32, then fp16 (bf16 below) */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3
#define ATOLBF 2e-2
#define RTOLBF 1e-2

/* What a kernel's text must and must not hold; visited per kernel. */
typedef struct want {
    const char *has[4];
    const char *lacks[2];
    uint32_t min_block; /* > 0: a row held in registers with this segment */
    uint32_t seen;
} want;

static void check_text(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    want *w = ctx;
    for (int i = 0; i < 4 && w->has[i]; i++) cr_assert_not_null(strstr(k->body, w->has[i]), "no '%s':\n%s", w->has[i], k->body);
    for (int i = 0; i < 2 && w->lacks[i]; i++) cr_assert_null(strstr(k->body, w->lacks[i]), "'%s':\n%s", w->lacks[i], k->body);
    if (w->min_block) cr_assert_eq(k->min_block, w->min_block, "min_block %u:\n%s", k->min_block, k->body);
    w->seen++;
}

/* Every group of text on OpenCL against ref, each kernel's text checked. */
static void run_checked(const char *text, bool bf16, want *w) {
    cgu_run_opts o = {(1u << KF_GROUP_ELEMWISE) | (1u << KF_GROUP_REDUCTION), NULL, ATOL, RTOL,
                      bf16 ? ATOLBF : ATOL16, bf16 ? RTOLBF : RTOL16, check_text, w};
    w->seen = 0;
    cr_assert_geq(cgu_run_groups(text, &o), 1);
    cr_assert_geq(w->seen, 1);
}

/* ---- elementwise steps --------------------------------------------------- */

Test(lanes, float32_steps_with_a_bias_row_a_column_and_a_scalar) {
    cgu_need_opencl();
    /* x and the row b load vectors; the column c and the scalar s load once per step */
    want w = {{"elementwise (4 lanes)", "KF_VLOAD4(in0", "KF_VSTORE4(out0", NULL}, {"i = ", NULL}, 0, 0};
    run_checked("opset 13\ninput x float[6, 40]\ninput b float[40]\ninput c float[6, 1]\ninput s float[]\n"
                "a = Add(x, b)\nm = Mul(a, c)\nd = Sub(m, s)\ny = Tanh(d)\noutput y\n",
                false, &w);
}

Test(lanes, float16_and_bfloat16_take_eight_at_a_time) {
    cgu_need_opencl();
    static const char *const dts[] = {"float16", "bfloat16"};
    for (int i = 0; i < 2; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "opset 20\ninput x %s[6, 40]\ninput b %s[40]\na = Add(x, b)\ny = Gelu(a)\noutput y\noutput a\n", dts[i],
                 dts[i]);
        want w = {{"elementwise (8 lanes)", i ? "KF_VLOAD_B8(in0" : "KF_VLOAD_H8(in0",
                   i ? "KF_VSTORE_B8(out0" : "KF_VSTORE_H8(out0", i ? "KF_VSTORE_B8(out1" : "KF_VSTORE_H8(out1"},
                  {"i = ", NULL}, 0, 0};
        run_checked(text, i == 1, &w);
        /* a last axis of 12: steps of 4, 64-bit pieces */
        snprintf(text, sizeof text, "opset 13\ninput x %s[5, 12]\ninput b %s[12]\na = Mul(x, b)\ny = Exp(a)\noutput y\n",
                 dts[i], dts[i]);
        want w4 = {{"elementwise (4 lanes)", i ? "KF_VLOAD_B4(in0" : "KF_VLOAD_H4(in0", i ? "KF_VSTORE_B4" : "KF_VSTORE_H4", NULL},
                   {NULL, NULL}, 0, 0};
        run_checked(text, i == 1, &w4);
    }
}

Test(lanes, odd_shapes_take_flat_steps_and_a_tail) {
    cgu_need_opencl();
    /* 35 elements: 4 steps of 8 float16 values, then 3 through the scalar loop */
    want w = {{"elementwise (8 lanes)", "KF_VLOAD_H8(in1", "i = 32 +", NULL}, {NULL, NULL}, 0, 0};
    run_checked("opset 13\ninput x float16[5, 7]\ninput y float16[5, 7]\na = Sub(x, y)\nz = Abs(a)\noutput z\n", false, &w);
    /* a row broadcast into an odd last axis: one element per work-item */
    want s = {{"elementwise", NULL}, {"lanes", NULL}, 0, 0};
    run_checked("opset 13\ninput x float[5, 7]\ninput b float[7]\na = Add(x, b)\noutput a\n", false, &s);
}

Test(lanes, transposed_reads_and_reshaped_outputs_stay_scalar) {
    cgu_need_opencl();
    /* x is read across the step (transposed): element loads; the row b is a vector;
     * the output reshaped to other dims is stored through its linear index */
    want w = {{"elementwise (4 lanes)", "KF_VLOAD4(in1", "KF_VSTORE4(out0", NULL}, {"KF_VLOAD4(in0", NULL}, 0, 0};
    run_checked("opset 13\ninput x float[8, 12]\ninput b float[8]\nconst shp int64[2] = 4 24\n"
                "t = Transpose(x) {perm=[1,0]}\na = Add(t, b)\nr = Reshape(a, shp)\ns = Sigmoid(r)\n"
                "output a\noutput s\n",
                false, &w);
}

/* ---- rows held in registers ------------------------------------------------ */

Test(lanes, rows_in_registers_every_kind_and_dtype) {
    cgu_need_opencl();
    static const char *const dts[] = {"float", "float16", "bfloat16"};
    /* K: one step of 4 per lane (128), a partly filled last step (264 = 8 x 33:
     * float16 steps of 8 over 32 lanes), 4 steps per lane at 256 lanes (4096) */
    static const int64_t Ks[] = {128, 264, 4096};
    static const char *const ops[] = {
        "y = LayerNormalization(a, g, b) {axis=-1, epsilon=0.001}\nz = Relu(y)\n",
        "y = Softmax(a) {axis=-1}\nz = Mul(y, x)\n",
        "y = LogSoftmax(a) {axis=-1}\nz = Neg(y)\n",
        "y = ReduceMax(a) {axes=[1], keepdims=1}\nz = Sub(a, y)\n",
        "y = ReduceSum(a, ax) {keepdims=0}\nz = Sqrt(y)\n",
    };
    for (int d = 0; d < 3; d++)
        for (int ki = 0; ki < 3; ki++)
            for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) {
                int64_t K = Ks[ki];
                char text[1024];
                /* a residual prologue (x + r), 7 rows (a partly empty last work-group) */
                snprintf(text, sizeof text,
                         "opset 17\ninput x %s[7, %lld]\ninput r %s[7, %lld]\nconst g %s[%lld] = random\n"
                         "const b %s[%lld] = random\nconst ax int64[1] = 1\na = Add(x, r)\n%soutput z\n",
                         dts[d], (long long)K, dts[d], (long long)K, dts[d], (long long)K, dts[d], (long long)K, ops[oi]);
                want w = {{"kf_ok0", "kf_seg_", NULL}, {"for (int j", NULL}, 0, 0};
                cgu_run_opts o = {1u << KF_GROUP_REDUCTION, NULL, ATOL, RTOL, d == 2 ? ATOLBF : ATOL16,
                                  d == 2 ? RTOLBF : RTOL16, check_text, &w};
                cr_assert_geq(cgu_run_groups(text, &o), 1, "%s", text);
                cr_assert_eq(w.seen, 1, "%s", text);
            }
}

Test(lanes, rows_in_registers_over_several_axes_and_through_views) {
    cgu_need_opencl();
    /* ReduceMean over [8, 32]: the step's position splits over both axes */
    want w = {{"kf_ok0", "ko0", NULL}, {"for (int j", NULL}, 32, 0};
    run_checked("opset 18\ninput x float[5, 8, 32]\nconst ax int64[2] = 1 2\nm = ReduceMean(x, ax) {keepdims=1}\n"
                "z = Sub(x, m)\noutput z\noutput m\n",
                false, &w);
    /* a LayerNorm's output split per head and transposed: a store per lane */
    want v = {{"kf_ok0", NULL}, {"for (int j", NULL}, 32, 0};
    run_checked("opset 17\ninput x float[6, 128]\nconst g float[128] = random\nconst shp int64[3] = 6 2 64\n"
                "y = LayerNormalization(x, g) {axis=-1}\nr = Reshape(y, shp)\nt = Transpose(r) {perm=[1,0,2]}\noutput t\n",
                false, &v);
}

Test(lanes, cuda_texts_compile_with_nvrtc_without_spills) {
    const char *why = kf_nvrtc_unavailable();
    if (why) cr_skip_test("NVRTC: %s", why);
    static const char *const graphs[] = {
        "opset 20\ninput x float16[64, 1024]\ninput b float16[1024]\na = Add(x, b)\ny = Gelu(a)\noutput y\n",
        "opset 13\ninput x bfloat16[64, 1024]\ninput b bfloat16[1024]\na = Mul(x, b)\noutput a\n",
        "opset 13\ninput x float[64, 1024]\ninput b float[1024]\na = Add(x, b)\ny = Sigmoid(a)\noutput y\n",
        "opset 17\ninput x float[64, 1024]\nconst g float[1024] = random\nconst b float[1024] = random\n"
        "y = LayerNormalization(x, g, b) {axis=-1}\noutput y\n",
        "opset 17\ninput x float16[64, 8192]\nconst g float16[8192] = random\n"
        "y = LayerNormalization(x, g) {axis=-1}\noutput y\n",
        "opset 13\ninput x float[64, 8192]\ny = Softmax(x) {axis=-1}\noutput y\n",
        "opset 13\ninput x bfloat16[64, 1024]\ny = Softmax(x) {axis=-1}\noutput y\n",
    };
    for (size_t i = 0; i < sizeof graphs / sizeof *graphs; i++)
        cr_assert_geq(cgu_nvrtc_check_text(graphs[i], 1u << KF_GROUP_ELEMWISE | 1u << KF_GROUP_REDUCTION), 1);
}
