/*
 * test_cg_pool.c: codegen/cg_pool.c, the window kernel of MaxPool,
 * AveragePool and LpPool groups (1-D, 2-D, 3-D; strides, pads, auto_pad,
 * dilations, ceil_mode, count_include_pad), run on OpenCL (PoCL on the CPU)
 * against the reference evaluator on random data; a whole plan with a pool
 * running nothing on the host; the CUDA text through NVRTC; and the reason
 * for the pool still declined (MaxPool's Indices).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"

/* DESIGN.md numerics, fused vs unfused: fp32 and fp16 */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3

/* Plans text, generates every opaque group (all must be pools the template
 * takes), runs each on OpenCL and compares its output with the reference;
 * returns the number of pool kernels run. */
static uint32_t check_pools(const char *text) {
    cgu_run_opts o = {1u << KF_GROUP_OPAQUE, "kf_pool", ATOL, RTOL, ATOL16, RTOL16, NULL, NULL};
    return cgu_run_groups(text, &o);
}

/* ResNet's stem pool, and an off-size one with N = 1 and C = 1 */
#define MAXPOOL_2D                                                                                    \
    "opset 13\ninput x float[2, 3, 13, 11]\ninput y float[1, 1, 7, 9]\n"                               \
    "a = MaxPool(x) {kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]}\n"                              \
    "b = MaxPool(y) {kernel_shape=[2,3], strides=[1,2]}\noutput a\noutput b\n"
/* dilations and ceil_mode (a last window that starts in the input but
 * runs past it), asymmetric pads */
#define MAXPOOL_DIL_CEIL                                                                              \
    "opset 13\ninput x float[2, 2, 10, 12]\n"                                                          \
    "a = MaxPool(x) {kernel_shape=[3,2], strides=[2,3], dilations=[2,1], ceil_mode=1}\n"               \
    "b = MaxPool(x) {kernel_shape=[2,2], strides=[2,2], pads=[0,1,1,0], ceil_mode=1}\noutput a\noutput b\n"
/* AveragePool: count_include_pad both ways, ceil_mode with padding (taps
 * past the end padding count for neither), SAME_UPPER and SAME_LOWER */
#define AVGPOOL_2D                                                                                    \
    "opset 19\ninput x float[2, 3, 9, 10]\n"                                                           \
    "a = AveragePool(x) {kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]}\n"                          \
    "b = AveragePool(x) {kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=1}\n"     \
    "c = AveragePool(x) {kernel_shape=[2,3], strides=[2,2], pads=[0,1,1,1], ceil_mode=1, count_include_pad=1}\n" \
    "d = AveragePool(x) {kernel_shape=[3,2], strides=[2,3], auto_pad=\"SAME_UPPER\"}\n"               \
    "e = AveragePool(x) {kernel_shape=[3,2], strides=[2,1], auto_pad=\"SAME_LOWER\", count_include_pad=1}\n" \
    "f = AveragePool(x) {kernel_shape=[2,2], dilations=[2,3]}\n"                                        \
    "output a\noutput b\noutput c\noutput d\noutput e\noutput f\n"
/* 1-D and 3-D, and LpPool with p = 1, 2 and 3 */
#define POOL_1D_3D_LP                                                                                 \
    "opset 18\ninput x float[2, 4, 17]\ninput v float[1, 2, 5, 6, 7]\n"                                 \
    "a = AveragePool(x) {kernel_shape=[4], strides=[3], pads=[2,1]}\n"                                  \
    "b = MaxPool(x) {kernel_shape=[3], strides=[1], dilations=[3]}\n"                                   \
    "c = MaxPool(v) {kernel_shape=[2,2,3], strides=[2,2,2], pads=[1,0,1,0,1,1]}\n"                      \
    "d = AveragePool(v) {kernel_shape=[3,2,2], count_include_pad=1, pads=[1,1,1,1,1,1]}\n"              \
    "e = LpPool(x) {kernel_shape=[3], strides=[2], p=2}\n"                                              \
    "f = LpPool(v) {kernel_shape=[2,2,2], p=1, pads=[0,1,0,1,0,1]}\n"                                   \
    "g = LpPool(x) {kernel_shape=[2], p=3}\n"                                                           \
    "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\n"
#define POOL_HALF                                                                                     \
    "opset 13\ninput x float16[2, 3, 8, 8]\n"                                                          \
    "a = MaxPool(x) {kernel_shape=[2,2], strides=[2,2]}\n"                                              \
    "b = AveragePool(x) {kernel_shape=[3,3], pads=[1,1,1,1]}\noutput a\noutput b\n"

Test(cg_pool, maxpool_2d_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools(MAXPOOL_2D), 2);
}

Test(cg_pool, maxpool_dilations_ceil_mode_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools(MAXPOOL_DIL_CEIL), 2);
}

Test(cg_pool, averagepool_pads_ceil_auto_pad_include_pad_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools(AVGPOOL_2D), 6);
}

Test(cg_pool, pools_1d_3d_and_lppool_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools(POOL_1D_3D_LP), 7);
}

Test(cg_pool, float16_pools_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools(POOL_HALF), 2);
}

/* NaN as the reference treats it: skipped by MaxPool unless a window holds
 * nothing else (columns 0 and 1 are NaN: the first 2 x 2 windows give NaN,
 * the 3 x 3 windows with padding take the numbers), carried by AveragePool */
Test(cg_pool, nan_windows_on_opencl) {
    cgu_need_opencl();
    cr_assert_eq(check_pools("opset 13\ninput x float[2, 2, 4, 6]\nconst c float[6] = nan nan 0 0 0 0\n"
                             "s = Add(x, c)\na = MaxPool(s) {kernel_shape=[2,2], strides=[2,2]}\n"
                             "b = MaxPool(s) {kernel_shape=[3,3], pads=[1,1,1,1]}\n"
                             "d = AveragePool(s) {kernel_shape=[2,2], strides=[2,2]}\n"
                             "output a\noutput b\noutput d\n"),
                 3);
}

/* a whole plan: conv, relu, max pool, global average pool, dense layer;
 * nothing runs on the host */
Test(cg_pool, small_cnn_runs_nothing_on_the_host) {
    cgu_need_opencl();
    kf_model *m = gt_parse("opset 13\n"
                           "input x float[2, 3, 12, 12]\n"
                           "const w float[8, 3, 3, 3] = random\n"
                           "const b float[8] = random\n"
                           "const fw float[8, 5] = random\n"
                           "const shp int64[2] = 2 8\n"
                           "c = Conv(x, w, b) {pads=[1,1,1,1]}\n"
                           "r = Relu(c)\n"
                           "p = MaxPool(r) {kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]}\n"
                           "g = GlobalAveragePool(p)\n"
                           "f = Reshape(g, shp)\n"
                           "y = MatMul(f, fw)\n"
                           "output y\n");
    kf_exec_stats s = cgu_opencl_matches_ref(m, 2);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_model_free(m);
}

Test(cg_pool, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    cr_assert_eq(cgu_nvrtc_check_text(MAXPOOL_2D, 1u << KF_GROUP_OPAQUE), 2);
    cr_assert_eq(cgu_nvrtc_check_text(AVGPOOL_2D, 1u << KF_GROUP_OPAQUE), 6);
    cr_assert_eq(cgu_nvrtc_check_text(POOL_1D_3D_LP, 1u << KF_GROUP_OPAQUE), 7);
    cr_assert_eq(cgu_nvrtc_check_text(POOL_HALF, 1u << KF_GROUP_OPAQUE), 2);
}

Test(cg_pool, does_not_generate_maxpool_indices_or_other_opaque_ops) {
    kf_model *m = gt_parse("opset 13\ninput x float[1, 2, 6, 6]\nconst ax int64[] = 1\n"
                           "y, i = MaxPool(x) {kernel_shape=[2,2], strides=[2,2]}\nc = CumSum(x, ax)\n"
                           "output y\noutput i\noutput c\n");
    kf_plan *p = cgu_plan(m);
    char why[512];
    uint32_t gy = p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer];
    cr_assert_not_null(kf_cg_unsupported(m, p, gy, why, sizeof why));
    cr_assert_not_null(strstr(why, "Indices"), "%s", why);
    uint32_t gc = p->group_of[m->graph->values[kf_graph_find(m->graph, "c")].producer];
    cr_assert_not_null(kf_cg_unsupported(m, p, gc, why, sizeof why));
    cr_assert_not_null(strstr(why, "opaque op CumSum"), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
}

/* ConvNeXt's head: the pooled [N, C, 1, 1] seen channels-last through a
 * Transpose, then a LayerNorm over the channels. The pooled result written
 * through the view from the row pass, nothing on the host. */
Test(cg_pool, pooled_result_through_a_transpose_runs_nothing_on_the_host) {
    cgu_need_opencl();
    kf_model *m = gt_parse("opset 17\n"
                           "input x float[2, 8, 5, 5]\n"
                           "const gam float[8] = random\n"
                           "const bet float[8] = random\n"
                           "g = GlobalAveragePool(x)\n"
                           "t = Transpose(g) {perm=[0,2,3,1]}\n"
                           "n = LayerNormalization(t, gam, bet) {axis=-1}\n"
                           "y = Transpose(n) {perm=[0,3,1,2]}\n"
                           "output y\n");
    kf_exec_stats s = cgu_opencl_matches_ref(m, 2);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_model_free(m);
}
