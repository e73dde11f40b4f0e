/*
 * test_cg_float8.c: float8 storage in generated kernels (the prelude part
 * KF_CG_PART_F8). Every code of the four formats decodes as the reference
 * evaluator's; floats round into them as the reference's Cast does (nearest
 * even, saturating or overflowing to NaN/Inf) on every value, tie and
 * neighbour of a tie; QuantizeLinear and DequantizeLinear to and from
 * float8 fuse into elementwise groups and into a float anchor's prologue
 * and epilogue; all on OpenCL (PoCL) against the reference, byte for byte;
 * the CUDA text compiles with NVRTC. Float4 (E2M1, the prelude part
 * KF_CG_PART_F4) the same way: every code, every value, tie and neighbour,
 * and its QuantizeLinear/DequantizeLinear.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"

static const struct {
    kf_dtype dt;
    const char *name;
} k_formats[] = {
    {KF_DT_FLOAT8E4M3FN, "float8e4m3fn"},
    {KF_DT_FLOAT8E4M3FNUZ, "float8e4m3fnuz"},
    {KF_DT_FLOAT8E5M2, "float8e5m2"},
    {KF_DT_FLOAT8E5M2FNUZ, "float8e5m2fnuz"},
};
#define NFORMATS 4

/* Plans text (one group), runs its kernel on OpenCL on inputs in[], and the
 * reference evaluator on the same inputs; asserts each output's bytes are
 * the reference's. Returns the kernel's prelude parts. */
static uint32_t run_one_group(const char *text, const kf_tensor *in, uint32_t nin) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->ngroups, 1, "%u groups", p->ngroups);
    char why[512];
    cr_assert_null(kf_cg_unsupported(m, p, 0, why, sizeof why), "declined: %s", why);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, 0, &k), KF_OK, "%s", kf_last_error());
    const kf_graph *g = m->graph;
    cr_assert_eq(k.nins, nin);
    const kf_tensor *kin[KF_CG_MAX_PARAMS];
    for (uint32_t i = 0; i < nin; i++) {
        cr_assert_eq(k.ins[i].value, g->inputs[i], "kernel input %u is not graph input %u", i, i);
        kin[i] = &in[i];
    }
    kf_tensor got[KF_PLAN_MAX_OUTPUTS] = {0}, *want = calloc(g->noutputs, sizeof *want);
    cr_assert_eq(kf_cl_run_kernel(&k, kin, got), KF_OK, "%s\n%s", kf_last_error(), k.body);
    cr_assert_eq(kf_eval_model(m, in, (int)nin, want, NULL), KF_OK, "%s", kf_last_error());
    cr_assert_eq(k.nouts, g->noutputs);
    for (uint32_t o = 0; o < k.nouts; o++) {
        cr_assert_eq(k.outs[o].value, g->outputs[o]);
        cr_assert_eq(got[o].dtype, want[o].dtype);
        cr_assert_eq(got[o].numel, want[o].numel);
        size_t es = kf_dtype_size(got[o].dtype);
        for (int64_t i = 0; i < got[o].numel; i++) {
            const uint8_t *a = (const uint8_t *)got[o].data + i * es, *b = (const uint8_t *)want[o].data + i * es;
            double x = kf_get_f64(&in[0], i % in[0].numel);
            /* NaN payloads of the wider floats are not specified; float8 NaN codes are */
            bool nans = kf_dtype_is_float(got[o].dtype) && isnan(kf_get_f64(&got[o], i)) && isnan(kf_get_f64(&want[o], i));
            cr_assert(nans || !memcmp(a, b, es), "output %u (%s) element %lld (input %.9g): got %.9g, want %.9g (code %02x, want %02x)",
                      o, kf_dtype_name(got[o].dtype), (long long)i, x, kf_get_f64(&got[o], i), kf_get_f64(&want[o], i),
                      a[0], b[0]);
        }
        kf_tensor_release(&got[o]);
        kf_tensor_release(&want[o]);
    }
    uint32_t parts = k.parts;
    free(want);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
    return parts;
}

/* Every code of each format, to float32, float16, bfloat16 and the other
 * float8 formats (saturating), through one kernel. */
Test(cg_float8, every_code_decodes_as_the_reference_on_opencl) {
    cgu_need_opencl();
    for (int f = 0; f < NFORMATS; f++) {
        char text[2048];
        int len = snprintf(text, sizeof text, "opset 21\ninput x %s[256]\n"
                                              "a = Cast(x) {to=1}\nb = Cast(x) {to=10}\nc = Cast(x) {to=16}\n",
                           k_formats[f].name);
        for (int t = 0; t < NFORMATS; t++)
            if (t != f) len += snprintf(text + len, sizeof text - (size_t)len, "d%d = Cast(x) {to=%d}\n", t, (int)k_formats[t].dt);
        len += snprintf(text + len, sizeof text - (size_t)len, "output a\noutput b\noutput c\n");
        for (int t = 0; t < NFORMATS; t++)
            if (t != f) len += snprintf(text + len, sizeof text - (size_t)len, "output d%d\n", t);
        int64_t n = 256;
        kf_tensor x = {0};
        cr_assert_eq(kf_tensor_alloc(&x, k_formats[f].dt, 1, &n), KF_OK);
        for (int c = 0; c < 256; c++) ((uint8_t *)x.data)[c] = (uint8_t)c;
        cr_assert_eq(run_one_group(text, &x, 1), KF_CG_PART_F8);
        kf_tensor_release(&x);
    }
}

/* The values every format cares about: each finite value, the ties between
 * neighbours and the floats on either side of each tie, both signs; zeros,
 * infinities, NaNs of both signs, float32 subnormals, the largest float. */
static float *rounding_cases(int64_t *count) {
    size_t cap = 8192, n = 0;
    float *v = malloc(cap * sizeof *v);
    for (int f = 0; f < NFORMATS; f++) {
        double prev = NAN;
        for (int c = 0; c < 128; c++) { /* the non-negative codes, in increasing order */
            double x = kf_small_to_f64(k_formats[f].dt, (uint8_t)c);
            if (!isfinite(x)) continue;
            float cand[4] = {(float)x, NAN, NAN, NAN};
            if (isfinite(prev)) {
                float mid = (float)((x + prev) / 2); /* exact: a few bits */
                cand[1] = mid, cand[2] = nextafterf(mid, 0), cand[3] = nextafterf(mid, INFINITY);
            }
            for (int i = 0; i < 4; i++)
                if (!isnan(cand[i])) v[n++] = cand[i], v[n++] = -cand[i];
            prev = x;
        }
        /* past the largest value: the would-be next value's tie and beyond */
        double step = prev - kf_small_to_f64(k_formats[f].dt, (uint8_t)(k_formats[f].dt == KF_DT_FLOAT8E5M2 ? 0x7a : 0x7e));
        float tie = (float)(prev + step / 2);
        float over[] = {tie, nextafterf(tie, 0), nextafterf(tie, INFINITY), (float)(prev + step), (float)(prev * 1000)};
        for (int i = 0; i < 5; i++) v[n++] = over[i], v[n++] = -over[i];
    }
    float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-40f, FLT_MIN, FLT_MAX, -FLT_MAX, 1e-30f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) v[n++] = specials[i];
    cr_assert_leq(n, cap);
    *count = (int64_t)n;
    return v;
}

/* float32 into each format, saturating and not, through one kernel; the
 * values go on to float (a Cast back) so the rounded value is what later
 * ops read, not only what is stored. */
Test(cg_float8, floats_round_into_every_format_as_the_reference_on_opencl) {
    cgu_need_opencl();
    int64_t n;
    float *cases = rounding_cases(&n);
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 1, &n), KF_OK);
    memcpy(x.data, cases, (size_t)n * sizeof(float));
    for (int f = 0; f < NFORMATS; f++) {
        char text[512];
        snprintf(text, sizeof text,
                 "opset 21\ninput x float[%lld]\n"
                 "q0 = Cast(x) {to=%d, saturate=0}\nr0 = Cast(q0) {to=1}\n"
                 "q1 = Cast(x) {to=%d, saturate=1}\nr1 = Cast(q1) {to=1}\n"
                 "output q0\noutput r0\noutput q1\noutput r1\n",
                 (long long)n, (int)k_formats[f].dt, (int)k_formats[f].dt);
        cr_assert_eq(run_one_group(text, &x, 1), KF_CG_PART_F8);
    }
    kf_tensor_release(&x);
    free(cases);
}

/* QuantizeLinear to float8 (per tensor and per channel, saturating and
 * not: |x| / 0.001 reaches 1000, past E4M3FN's 448) and back, a float op
 * between, to another format: one elementwise group. */
#define F8_QDQ                                                                                         \
    "opset 21\ninput x float[2, 3, 5, 7]\n"                                                            \
    "const s float[] = 0.001\nconst s3 float[3] = 0.01 0.002 0.0005\n"                                 \
    "const z float8e4m3fn[] = 0\n"                                                                     \
    "q = QuantizeLinear(x, s, z)\n"                                                                    \
    "d = DequantizeLinear(q, s, z)\n"                                                                  \
    "r = Relu(d)\n"                                                                                    \
    "p = QuantizeLinear(r, s3) {axis=1, output_dtype=17, saturate=0}\n"                                \
    "e = DequantizeLinear(p, s3) {axis=1}\n"                                                           \
    "u = QuantizeLinear(x, s3) {axis=1, output_dtype=19}\n"                                            \
    "f = DequantizeLinear(u, s3) {axis=1}\n"                                                           \
    "y = Mul(e, f)\n"                                                                                  \
    "output q\noutput p\noutput u\noutput y\n"

/* A float8 QDQ MatMul: the activation quantized by the group before, its
 * DequantizeLinear and the weights' in the anchor's prologue, the next
 * QuantizeLinear in its epilogue. */
#define F8_MATMUL                                                                                      \
    "opset 21\ninput x float[6, 40]\n"                                                                 \
    "const w float[40, 24] = random\nconst sw float[24] = 0.004\nconst sx float[] = 0.002\n"            \
    "const so float[] = 0.01\nconst b float[24] = random\n"                                            \
    "wq = QuantizeLinear(w, sw) {axis=1, output_dtype=17}\n"                                           \
    "xq = QuantizeLinear(x, sx) {output_dtype=17}\n"                                                   \
    "xd = DequantizeLinear(xq, sx)\n"                                                                  \
    "wd = DequantizeLinear(wq, sw) {axis=1}\n"                                                         \
    "m = MatMul(xd, wd)\n"                                                                             \
    "a = Add(m, b)\n"                                                                                  \
    "o = QuantizeLinear(a, so) {output_dtype=19}\n"                                                    \
    "output o\n"

#define EW (1u << KF_GROUP_ELEMWISE)
#define ANCHOR (1u << KF_GROUP_ANCHOR)

Test(cg_float8, quantize_dequantize_float8_elementwise_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cgu_run_opts o = {EW, NULL, 0, 0, 0, 0, NULL, NULL};
    cr_assert_eq(cgu_run_groups(F8_QDQ, &o), 1);
}

/* The whole plan runs on OpenCL, nothing on the host; the anchor's output
 * codes are the reference's except where float rounding of the sums moves
 * a value across a tie (the model check's SQNR fallback). */
Test(cg_float8, float8_qdq_matmul_runs_on_the_device_and_matches_the_reference) {
    cgu_need_opencl();
    kf_model *m = gt_parse(F8_MATMUL);
    kf_plan *p = cgu_plan(m);
    uint32_t ga = cgu_group_of(m, p, "m");
    cr_assert_eq(p->groups[ga].kind, KF_GROUP_ANCHOR);
    cr_assert_eq(cgu_group_of(m, p, "xd"), ga, "the dequantize is not the anchor's prologue");
    cr_assert_eq(cgu_group_of(m, p, "o"), ga, "the quantize is not the anchor's epilogue");
    kf_plan_free(p);
    kf_exec_stats s = cgu_opencl_matches_ref(m, 2);
    cr_assert_eq(s.groups_ref, 0, "%u groups ran on the host", s.groups_ref);
    kf_model_free(m);
}

/* ---- float4 (E2M1) ---- */

/* Every code (the low four bits of a byte), to float32, float16, bfloat16
 * and E4M3FN, and a float8 value to float4, in one kernel that takes both
 * parts. */
Test(cg_float8, every_float4_code_decodes_as_the_reference_on_opencl) {
    cgu_need_opencl();
    int64_t n = 16;
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT4E2M1, 1, &n), KF_OK);
    for (int c = 0; c < 16; c++) ((uint8_t *)x.data)[c] = (uint8_t)c;
    const char *text = "opset 23\ninput x float4e2m1[16]\n"
                       "a = Cast(x) {to=1}\nb = Cast(x) {to=10}\nc = Cast(x) {to=16}\nd = Cast(x) {to=17}\n"
                       "e = Cast(d) {to=23}\n"
                       "output a\noutput b\noutput c\noutput d\noutput e\n";
    cr_assert_eq(run_one_group(text, &x, 1), KF_CG_PART_F8 | KF_CG_PART_F4);
    kf_tensor_release(&x);
}

/* float32 into float4 (Cast, saturate 0 and 1: float4 saturates either
 * way) on each value, tie and neighbour of a tie, both signs, past the
 * largest value, zeros, infinities and NaNs of both signs; back to float. */
Test(cg_float8, floats_round_into_float4_as_the_reference_on_opencl) {
    cgu_need_opencl();
    float v[256];
    int64_t n = 0;
    double prev = NAN;
    for (int c = 0; c < 8; c++) {
        double x = kf_small_to_f64(KF_DT_FLOAT4E2M1, (uint8_t)c);
        float cand[4] = {(float)x, NAN, NAN, NAN};
        if (c) {
            float mid = (float)((x + prev) / 2);
            cand[1] = mid, cand[2] = nextafterf(mid, 0), cand[3] = nextafterf(mid, INFINITY);
        }
        for (int i = 0; i < 4; i++)
            if (!isnan(cand[i])) v[n++] = cand[i], v[n++] = -cand[i];
        prev = x;
    }
    float more[] = {7.0f, nextafterf(7.0f, 0), nextafterf(7.0f, INFINITY), 8.0f, 6000.0f, 0.0f, -0.0f, INFINITY,
                    -INFINITY, NAN, -NAN, 1e-40f, -1e-40f, FLT_MAX, -FLT_MAX, 0.1f, -0.2f};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) v[n++] = more[i];
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 1, &n), KF_OK);
    memcpy(x.data, v, (size_t)n * sizeof(float));
    char text[512];
    snprintf(text, sizeof text,
             "opset 23\ninput x float[%lld]\n"
             "q0 = Cast(x) {to=23, saturate=0}\nr0 = Cast(q0) {to=1}\n"
             "q1 = Cast(x) {to=23}\nr1 = Cast(q1) {to=10}\n"
             "output q0\noutput r0\noutput q1\noutput r1\n",
             (long long)n);
    cr_assert_eq(run_one_group(text, &x, 1), KF_CG_PART_F4);
    kf_tensor_release(&x);
}

/* QuantizeLinear to float4 per tensor, per channel and in blocks (no zero
 * point), DequantizeLinear back (a zero point there, which the reference
 * ignores for float4), a float op between: one elementwise group. */
#define F4_QDQ                                                                                         \
    "opset 23\ninput x float[2, 3, 8]\n"                                                               \
    "const s float[] = 0.3\nconst s3 float[3] = 0.1 0.5 2\nconst sb float[2, 3, 2] = 0.2 0.7 1.1\n"     \
    "const z float4e2m1[] = 0\n"                                                                       \
    "q = QuantizeLinear(x, s) {output_dtype=23}\n"                                                     \
    "d = DequantizeLinear(q, s, z)\n"                                                                  \
    "r = Relu(d)\n"                                                                                    \
    "p = QuantizeLinear(r, s3) {axis=1, output_dtype=23}\n"                                            \
    "e = DequantizeLinear(p, s3) {axis=1}\n"                                                           \
    "u = QuantizeLinear(x, sb) {axis=2, block_size=4, output_dtype=23}\n"                              \
    "f = DequantizeLinear(u, sb) {axis=2, block_size=4}\n"                                             \
    "y = Mul(e, f)\n"                                                                                  \
    "output q\noutput p\noutput u\noutput y\n"

Test(cg_float8, quantize_dequantize_float4_elementwise_bit_for_bit_on_opencl) {
    cgu_need_opencl();
    cgu_assert_one_group(F4_QDQ, KF_GROUP_ELEMWISE);
    cgu_run_opts o = {EW, NULL, 0, 0, 0, 0, NULL, NULL};
    cr_assert_eq(cgu_run_groups(F4_QDQ, &o), 1);
}

/* A zero point on a QuantizeLinear to float4 (the reference adds it as a
 * value): not generated, and the planner leaves it to the host. */
Test(cg_float8, float4_quantize_with_a_zero_point_stays_on_the_host) {
    kf_model *m = gt_parse("opset 23\ninput x float[8]\nconst s float[] = 0.5\nconst z float4e2m1[] = 1\n"
                           "q = QuantizeLinear(x, s, z)\nd = DequantizeLinear(q, s)\ny = Relu(d)\noutput y\n");
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->groups[cgu_group_of(m, p, "q")].kind, KF_GROUP_OPAQUE);
    cr_assert_neq(p->groups[cgu_group_of(m, p, "d")].kind, KF_GROUP_OPAQUE);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(cg_float8, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) cr_skip_test("NVRTC: %s", why);
    cr_assert_eq(cgu_nvrtc_check_text(F8_QDQ, EW), 1);
    cr_assert_geq(cgu_nvrtc_check_text(F8_MATMUL, ANCHOR), 1);
    cr_assert_eq(cgu_nvrtc_check_text(F4_QDQ, EW), 1);
}
