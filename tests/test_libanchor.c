/*
 * test_libanchor.c: library anchors (kernels/kf_libanchor.h) without a GPU.
 * For every anchor group that maps onto cuBLASLt, the host model of the
 * call (kf_la_gemm_host, which reads m, n, k, transposes, leading dims,
 * batch strides, alpha/beta, bias and activation exactly as they are
 * handed to the library) must equal the reference evaluator's value of
 * what the library writes, and that value run through the generated
 * epilogue kernel on OpenCL must equal the reference group outputs. Also
 * the declines with their reasons, and cuBLASLt's clean "not available".
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"
#include "kf_cost.h"
#include "kf_exec.h"
#include "kf_libanchor.h"
#include "kf_opt.h"
#include "kf_precision.h"

/* DESIGN.md numerics, fused vs unfused */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3
#define ATOLBF 2e-2
#define RTOLBF 1e-2

static char *exec_matches_ref(const kf_model *m, bool lib);

/* When set, every epilogue kernel also compiles for CUDA (NVRTC sm_90, no spills). */
static bool nvrtc_epilogues;

typedef struct tally {
    uint32_t mapped, declined, with_epilogue, acts, biases, convs, ints, residuals;
    char first_reason[512];
} tally;

/* Checks every anchor group of m (planned by p, reference r). */
static void check_groups(const kf_model *m, const kf_plan *p, const cgu_refvals *r, tally *t) {
    const kf_graph *g = m->graph;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        if (p->groups[gi].kind != KF_GROUP_ANCHOR) continue;
        kf_la_anchor la, la2;
        char why[512];
        kf_status st = kf_la_plan_group(m, p, gi, &la, why, sizeof why);
        if (st == KF_ERR_UNSUPPORTED) {
            if (getenv("KF_TEST_VERBOSE")) fprintf(stderr, "libanchor: group %u declined: %s\n", gi, why);
            if (!t->declined++) snprintf(t->first_reason, sizeof t->first_reason, "%s", why);
            continue;
        }
        cr_assert_eq(st, KF_OK, "group %u", gi);
        cr_assert_eq(kf_la_plan_group(m, p, gi, &la2, why, sizeof why), KF_OK);
        cr_assert(!memcmp(&la.gemm, &la2.gemm, sizeof la.gemm), "descriptor not deterministic");
        cr_assert(!memcmp(&la.conv, &la2.conv, sizeof la.conv), "descriptor not deterministic");
        if (la.has_epilogue) cr_assert_str_eq(la.epilogue.body, la2.epilogue.body);
        kf_la_anchor_release(&la2);
        t->mapped++;
        t->convs += la.is_conv;
        const kf_la_gemm *G = &la.gemm;
        const kf_la_conv *C = &la.conv;
        kf_id lv[5];
        kf_la_anchor_values(&la, lv);
        t->acts += (la.is_conv ? C->act : G->act) != KF_LA_ACT_NONE;
        t->biases += lv[3] != 0;
        t->residuals += la.is_conv && C->z;
        const kf_type *dt = &g->values[lv[4]].type;
        kf_tensor d = {0};
        cr_assert_eq(kf_tensor_alloc(&d, dt->dtype, dt->rank, dt->dims), KF_OK);
        int64_t K = G->k;
        if (la.is_conv) {
            K = C->c / C->groups;
            for (int i = 0; i < C->nspatial; i++) K *= C->kern[i];
            cr_assert_eq(kf_la_conv_host(C, &r->t[C->x], &r->t[C->w], C->z ? &r->t[C->z] : NULL,
                                         C->bias ? &r->t[C->bias] : NULL, &d),
                         KF_OK,
                         "group %u: %s", gi, kf_last_error());
        } else {
            kf_tensor a = {0}; /* A as the device holds it */
            cr_assert_eq(kf_la_const_layout(G, &r->t[G->a], &a), KF_OK, "%s", kf_last_error());
            cr_assert_eq(kf_la_gemm_host(G, &a, &r->t[G->b], G->c ? &r->t[G->c] : NULL,
                                         G->bias ? &r->t[G->bias] : NULL, &d),
                         KF_OK, "group %u: %s", gi, kf_last_error());
            kf_tensor_release(&a);
            t->ints += G->dtype == KF_DT_INT8;
        }
        bool half = dt->dtype == KF_DT_FLOAT16, bf16 = dt->dtype == KF_DT_BFLOAT16;
        double atol = bf16 ? ATOLBF : half ? ATOL16 : cgu_dot_atol(K), rtol = bf16 ? RTOLBF : half ? RTOL16 : RTOL;
        if (dt->dtype == KF_DT_INT32) atol = rtol = 0; /* the integer GEMM's sums are exact */
        char w[256];
        cr_assert(tu_close(&d, &r->t[lv[4]], atol, rtol, w, sizeof w),
                  "group %u: library output '%s' (%s; gemm m %lld n %lld k %lld batch %lld ta %d tb %d): %s", gi,
                  g->values[lv[4]].name, la.is_conv ? "conv" : "gemm", (long long)G->m, (long long)G->n,
                  (long long)G->k, (long long)G->batch, G->trans_a, G->trans_b, w);
        if (la.has_epilogue) {
            t->with_epilogue++;
            const kf_cg_kernel *k = &la.epilogue;
            const kf_tensor *in[KF_CG_MAX_PARAMS];
            bool reads_d = false;
            for (uint32_t i = 0; i < k->nins; i++) {
                in[i] = k->ins[i].value == lv[4] ? &d : &r->t[k->ins[i].value];
                reads_d |= k->ins[i].value == lv[4];
            }
            cr_assert(reads_d, "group %u: the epilogue does not read the library output", gi);
            if (nvrtc_epilogues) cgu_nvrtc_check(k, "sm_90");
            kf_tensor out[KF_PLAN_MAX_OUTPUTS] = {0};
            cr_assert_eq(kf_cl_run_kernel(k, in, out), KF_OK, "group %u: %s\n%s", gi, kf_last_error(), k->body);
            for (uint32_t o = 0; o < k->nouts; o++) {
                /* the epilogue may amplify the GEMM's rounding (LayerNorm
                 * divides by a row's spread): allow the GEMM's tolerance */
                cr_assert(tu_close(&out[o], &r->t[k->outs[o].value], atol * 4, rtol * 4, w, sizeof w),
                          "group %u epilogue output %u: %s\n%s", gi, o, w, k->body);
                kf_tensor_release(&out[o]);
            }
        }
        kf_tensor_release(&d);
        kf_la_anchor_release(&la);
    }
}

static tally check_text(const char *text) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cgu_refvals r = cgu_reference(m);
    tally t = {0};
    check_groups(m, p, &r, &t);
    cgu_refvals_free(&r);
    kf_plan_free(p);
    kf_model_free(m);
    return t;
}

/* A decline's reason for the (single) anchor group of text. */
static void expect_decline(const char *text, const char *part) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    bool seen = false;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        if (p->groups[gi].kind != KF_GROUP_ANCHOR) continue;
        kf_la_anchor la;
        char why[512] = "";
        cr_assert_eq(kf_la_plan_group(m, p, gi, &la, why, sizeof why), KF_ERR_UNSUPPORTED);
        cr_assert_not_null(strstr(why, part), "reason '%s' lacks '%s'", why, part);
        seen = true;
    }
    cr_assert(seen, "no anchor group");
    kf_plan_free(p);
    kf_model_free(m);
}

Test(libanchor, matmul_bias_relu_all_in_the_library) {
    cgu_need_opencl();
    tally t = check_text("input x float[70, 45]\nconst w float[45, 33] = random\nconst b float[33] = random\n"
                         "y = MatMul(x, w)\nz = Add(b, y)\nr = Relu(z)\noutput r\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 0);
    cr_assert_eq(t.acts, 1);
    cr_assert_eq(t.biases, 1);
}

Test(libanchor, batched_matmul_folded_strided_and_broadcast) {
    cgu_need_opencl();
    /* [2,3,17,40] x [40,20]: batches folded into rows; [4,17,40] x [4,40,20]:
     * strided batch; [1,17,40] x [4,40,20]: left operand stride 0 */
    tally t = check_text("input a float[2, 3, 17, 40]\nconst w float[40, 20] = random\n"
                         "input b float[4, 17, 40]\ninput c float[4, 40, 20]\ninput e float[1, 17, 40]\n"
                         "y = MatMul(a, w)\nt = Tanh(y)\noutput t\n"
                         "z = MatMul(b, c)\noutput z\nq = MatMul(e, c)\nn = Neg(q)\noutput n\n");
    cr_assert_eq(t.mapped, 3, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 2);
}

Test(libanchor, transposed_operands_taken_as_trans_flags) {
    cgu_need_opencl();
    tally t = check_text("input x float[2, 40, 17]\ninput w float[2, 23, 40]\n"
                         "xt = Transpose(x) {perm=[0,2,1]}\nwt = Transpose(w) {perm=[0,2,1]}\n"
                         "y = MatMul(xt, wt)\ns = Sigmoid(y)\noutput s\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
}

Test(libanchor, gemm_trans_alpha_beta_full_c_and_bias_c) {
    cgu_need_opencl();
    tally t = check_text("input a float[37, 66]\ninput b float[70, 37]\nconst c float[66, 70] = random\n"
                         "y = Gemm(a, b, c) {transA=1, transB=1, alpha=0.5, beta=2.0}\ns = Sigmoid(y)\noutput s\n"
                         "input p float[66, 20]\ninput q float[20, 9]\nconst cb float[9] = random\n"
                         "g = Gemm(p, q, cb)\nh = Relu(g)\noutput h\n");
    cr_assert_eq(t.mapped, 2, "%s", t.first_reason);
    cr_assert_eq(t.biases, 1);
}

Test(libanchor, residual_layernorm_rows_after_the_call) {
    cgu_need_opencl();
    tally t = check_text("input x float[24, 64]\nconst w float[64, 48] = random\nconst b float[48] = random\n"
                         "input res float[24, 48]\nconst sc float[48] = random\nconst sh float[48] = random\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\nq = Add(z, res)\n"
                         "n = LayerNormalization(q, sc, sh) {axis=-1}\noutput n\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 1);
    cr_assert_eq(t.biases, 1);
}

Test(libanchor, gelu_tanh_in_the_library_erf_gelu_in_the_epilogue) {
    cgu_need_opencl();
    tally t = check_text("opset 20\ninput x float[16, 32]\nconst w float[32, 64] = random\nconst b float[64] = random\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\ng = Gelu(z) {approximate=\"tanh\"}\noutput g\n"
                         "y2 = MatMul(x, w)\nz2 = Add(y2, b)\ng2 = Gelu(z2)\noutput g2\n");
    cr_assert_eq(t.mapped, 2, "%s", t.first_reason);
    cr_assert_eq(t.acts, 1);
    cr_assert_eq(t.with_epilogue, 1);
}

Test(libanchor, float16_bias_relu) {
    cgu_need_opencl();
    tally t = check_text("input x float16[33, 40]\nconst w float16[40, 24] = random\nconst b float16[24] = random\n"
                         "input r float16[33, 24]\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\nq = Relu(z)\np = Add(q, r)\noutput p\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 1);
}

/* A bfloat16 GEMM maps onto cuBLASLt (CUDA_R_16BF, 32F compute); a
 * bfloat16 NCHW conv keeps its generated kernel, with the reason. */
Test(libanchor, bfloat16_gemm_maps_conv_declines) {
    cgu_need_opencl();
    tally t = check_text("input x bfloat16[17, 40]\nconst w bfloat16[40, 24] = random\nconst b bfloat16[24] = random\n"
                         "input r bfloat16[17, 24]\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\nq = Relu(z)\np = Add(q, r)\noutput p\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 1);
    t = check_text("input c bfloat16[1, 4, 8, 8]\nconst cw bfloat16[8, 4, 3, 3] = random\n"
                   "cy = Conv(c, cw) {pads=[1,1,1,1]}\noutput cy\n");
    cr_assert_eq(t.mapped, 0);
    cr_assert(strstr(t.first_reason, "bfloat16 operands: the library path takes float32 and float16 convolutions"), "%s",
              t.first_reason);
}

Test(libanchor, store_side_head_split_in_the_epilogue) {
    cgu_need_opencl();
    tally t = check_text("input x float[2, 10, 48]\nconst w float[48, 48] = random\nconst b float[48] = random\n"
                         "const shp int64[4] = 2 10 4 12\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\nr = Reshape(z, shp)\nt = Transpose(r) {perm=[0,2,1,3]}\n"
                         "output t\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 1);
}

Test(libanchor, declines_with_reasons) {
    expect_decline("input x float[20, 16]\nconst w float[16, 8] = random\n"
                   "e = Relu(x)\ny = MatMul(e, w)\noutput y\n",
                   "operand prologue");
    expect_decline("input x float[1, 3, 8, 8]\nconst w float[4, 3, 3, 3] = random\n"
                   "y = Conv(x, w) {pads=[1,1,0,0]}\nr = Relu(y)\noutput r\n",
                   "asymmetric pads");
    expect_decline("input x float[1, 3, 8, 8]\nconst w float[4, 3, 3, 3] = random\n"
                   "y = Conv(x, w) {auto_pad=\"SAME_UPPER\"}\nr = Relu(y)\noutput r\n",
                   "auto_pad");
    expect_decline("input a float[2, 3, 17, 40]\ninput b float[3, 40, 20]\ny = MatMul(a, b)\noutput y\n",
                   "broadcast partially");
    expect_decline("input a float[5, 40]\ninput u float[40]\ny = MatMul(a, u)\nn = Neg(y)\noutput n\n", "1-D");
}

/* An int8 plan's product (pass_qint.c: int8 operands, the activation's
 * zero point as int32 columns after it): cuBLASLt's int8 GEMM with the
 * weights stored transposed ("TN"), exact int32 sums; the columns, the
 * scale and the requantization in the epilogue kernel. */
#define INT8_DENSE                                                                                     \
    "opset 13\ninput x int8[24, 64]\nconst w int8[64, 48] = random\nconst zc int32[48] = random\n"      \
    "const s float[48] = random\nconst so float[] = 0.25\nconst zo int8[] = 3\n"                        \
    "a = MatMulInteger(x, w)\nb = Add(a, zc)\nf = Cast(b) {to=1}\ny = Mul(f, s)\n"                       \
    "q = QuantizeLinear(y, so, zo)\noutput y\noutput q\n"

Test(libanchor, int8_gemm_in_the_library_the_rest_in_the_epilogue) {
    cgu_need_opencl();
    tally t = check_text(INT8_DENSE);
    cr_assert_eq(t.mapped, 1);
    cr_assert_eq(t.ints, 1);
    cr_assert_eq(t.with_epilogue, 1);
    kf_model *m = gt_parse(INT8_DENSE);
    kf_plan *p = cgu_plan(m);
    kf_la_anchor la;
    char why[512];
    uint32_t gi = 0;
    while (p->groups[gi].kind != KF_GROUP_ANCHOR) gi++;
    cr_assert_eq(kf_la_plan_group(m, p, gi, &la, why, sizeof why), KF_OK, "%s", why);
    const kf_la_gemm *G = &la.gemm;
    cr_assert_eq(G->dtype, KF_DT_INT8);
    cr_assert(G->trans_a && !G->trans_b && G->a_const_t, "cuBLASLt's int8 GEMM is TN");
    cr_assert(G->m == 48 && G->n == 24 && G->k == 64, "m %lld n %lld k %lld", (long long)G->m, (long long)G->n,
              (long long)G->k);
    cr_assert(G->lda == 64 && G->ldb == 64 && G->ldd == 48);
    cr_assert_eq(la.lib_nodes, 1, "nothing after the integer product goes into the call");
    /* the device copy of the weights is their transpose */
    const kf_tensor *w = m->graph->values[G->a].init;
    kf_tensor a = {0};
    cr_assert_eq(kf_la_const_layout(G, w, &a), KF_OK);
    cr_assert(a.dims[0] == 48 && a.dims[1] == 64);
    for (int64_t k = 0; k < 64; k++)
        for (int64_t n = 0; n < 48; n++)
            cr_assert_eq(((int8_t *)a.data)[n * 64 + k], ((int8_t *)w->data)[k * 48 + n]);
    kf_tensor_release(&a);
    kf_la_math mt = kf_la_math_for(KF_PRECISION_INT8, KF_DT_INT8);
    cr_assert_eq(mt.cublas_compute, 72); /* CUBLAS_COMPUTE_32I */
    cr_assert_eq(mt.cublas_scale, 10);   /* CUDA_R_32I */
    cr_assert_eq(mt.cuda_data, 3);       /* CUDA_R_8I */
    cr_assert_eq(mt.cuda_data_d, 10);
    kf_la_anchor_release(&la);
    kf_plan_free(p);
    kf_model_free(m);
}

/* An int8 plan's output projection: the integer product, its scale, the
 * residual, the LayerNorm and the requantization in one group; the call
 * gives the int32 sums, the epilogue kernel does the rest with its row pass. */
Test(libanchor, int8_gemm_residual_layernorm_rows_in_the_epilogue) {
    cgu_need_opencl();
    const char *text = "opset 17\ninput x int8[24, 64]\nconst w int8[64, 48] = random\nconst s float[48] = random\n"
                       "input res float[24, 48]\nconst sc float[48] = random\nconst sh float[48] = random\n"
                       "const so float[] = 0.05\nconst zo int8[] = 0\n"
                       "a = MatMulInteger(x, w)\nf = Cast(a) {to=1}\ny = Mul(f, s)\nr = Add(y, res)\n"
                       "n = LayerNormalization(r, sc, sh) {axis=-1}\nq = QuantizeLinear(n, so, zo)\noutput q\n";
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    uint32_t gi = 0;
    while (p->groups[gi].kind != KF_GROUP_ANCHOR) gi++;
    cr_assert_neq(p->groups[gi].reduction, 0, "the LayerNorm joins the integer product's group");
    cr_assert_eq(p->ngroups, 1);
    kf_plan_free(p);
    kf_model_free(m);
    tally t = check_text(text);
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.ints, 1);
    cr_assert_eq(t.with_epilogue, 1);
}

Test(libanchor, int8_gemm_declines_with_reasons) {
    expect_decline("input x uint8[24, 64]\nconst w int8[64, 48] = random\na = MatMulInteger(x, w)\n"
                   "f = Cast(a) {to=1}\noutput f\n",
                   "takes int8 x int8");
    expect_decline("input x int8[24, 64]\nconst w int8[64, 48] = random\nconst z int8[] = 3\n"
                   "a = MatMulInteger(x, w, z)\nf = Cast(a) {to=1}\noutput f\n",
                   "zero points");
    expect_decline("input x int8[24, 66]\nconst w int8[66, 48] = random\na = MatMulInteger(x, w)\n"
                   "f = Cast(a) {to=1}\noutput f\n",
                   "multiples of 4");
    expect_decline("input x int8[24, 64]\ninput w int8[64, 48]\na = MatMulInteger(x, w)\n"
                   "f = Cast(a) {to=1}\noutput f\n",
                   "not a constant matrix");
}

/* A LayerNorm and a QDQ dense layer with uint8 activations (ONNX
 * Runtime's quantizer's spelling) compiled at precision int8 on OpenCL with the library call
 * replaced by its host model (KFUSE_LIBANCHOR_HOST): the product runs as
 * the library's int8 GEMM on weights uploaded transposed, and the outputs
 * equal the reference on the integer graph. */
static void exec_int8_plan(kf_exec_backend backend) {
    static const char *text =
        "opset 17\ninput x float[2, 12, 64]\nconst sx float[] = 0.02\nconst zx uint8[] = 119\n"
        "const w float[64, 48] = random\nconst sw float[48] = random\nconst zw int8[48] = 0\n"
        "const b float[48] = random\nconst so float[] = 0.05\nconst zo uint8[] = 128\n"
        "const g float[64] = random\nconst h float[64] = random\n"
        "n = LayerNormalization(x, g, h) {axis=-1}\n"
        "xq = QuantizeLinear(n, sx, zx)\nxd = DequantizeLinear(xq, sx, zx)\n"
        "wq = QuantizeLinear(w, sw, zw) {axis=1}\nwd = DequantizeLinear(wq, sw, zw) {axis=1}\n"
        "y = MatMul(xd, wd)\nz = Add(y, b)\nr = Relu(z)\nq = QuantizeLinear(r, so, zo)\noutput q\noutput z\n";
    kf_model *m = gt_parse(text), *want = gt_copy(m);
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    oo.keep_quantized = true;
    kf_opt_result res;
    cr_assert_eq(kf_optimize(want, &oo, &res), KF_OK, "%s", kf_last_error());
    kf_rules_free(&res.rules);
    kf_int8_stats is;
    cr_assert_eq(kf_fuse_int8(want, &is), KF_OK, "%s", kf_last_error());
    cr_assert_eq(is.anchors, 1);
    cr_assert_eq(is.activations_signed, 1);
    char *trace = cgu_exec_host_lib_trace(m, want, backend, KF_PRECISION_INT8);
    cr_assert_not_null(strstr(trace, "library GEMM 48x24x64"), "%s", trace);
    free(trace);
    kf_model_free(want);
    kf_model_free(m);
}

Test(libanchor, exec_int8_plan_with_the_library_gemm) {
    cgu_need_opencl();
    exec_int8_plan(KF_EXEC_OPENCL);
}

/* ---- float8 GEMMs (an fp8 plan's float8 products) ---- */

/* The plan-level form of an fp8 plan's float8 product: a float8
 * activation and float8 weights, dequantized to float16 by one scale each,
 * the product, bias and ReLU. */
#define FP8_DENSE                                                                                      \
    "opset 21\ninput xq float8e4m3fn[24, 64]\nconst w float8e4m3fn[64, 48] = random\n"                 \
    "const sx float16[] = 0.02\nconst sw float16[] = 0.01\nconst b float16[48] = random\n"              \
    "xd = DequantizeLinear(xq, sx)\nwd = DequantizeLinear(w, sw)\n"                                    \
    "y = MatMul(xd, wd)\nz = Add(y, b)\nr = Relu(z)\noutput r\n"

/* The whole group is one call: float8 A (the weights, stored transposed:
 * "TN") and B, the scales as alpha, bias and ReLU in the library's
 * epilogue, both DequantizeLinears absorbed; its host model equals the
 * reference (check_groups). */
Test(libanchor, fp8_gemm_in_the_library_scales_as_alpha) {
    tally t = check_text(FP8_DENSE);
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 0);
    kf_model *m = gt_parse(FP8_DENSE);
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->ngroups, 1, "the DequantizeLinears join the product's group: %u groups", p->ngroups);
    kf_la_anchor la;
    char why[512];
    cr_assert_eq(kf_la_plan_group(m, p, 0, &la, why, sizeof why), KF_OK, "%s", why);
    const kf_la_gemm *G = &la.gemm;
    cr_assert_eq(G->dtype, KF_DT_FLOAT16);
    cr_assert(G->a_dtype == KF_DT_FLOAT8E4M3FN && G->b_dtype == KF_DT_FLOAT8E4M3FN);
    cr_assert(G->trans_a && !G->trans_b && G->a_const_t, "cuBLASLt's float8 GEMM is TN");
    cr_assert(G->m == 48 && G->n == 24 && G->k == 64 && G->lda == 64 && G->ldb == 64 && G->ldd == 48);
    cr_assert_float_eq(G->alpha, kf_half_to_float(kf_float_to_half(0.02f)) * kf_half_to_float(kf_float_to_half(0.01f)),
                       1e-9);
    cr_assert(G->bias && G->act == KF_LA_ACT_RELU);
    cr_assert_eq(la.lib_nodes, 5, "product, two DequantizeLinears, bias, ReLU");
    cr_assert_eq(G->a, kf_graph_find(m->graph, "w"));
    cr_assert_eq(G->b, kf_graph_find(m->graph, "xq"));
    kf_la_anchor_release(&la);
    kf_plan_free(p);
    kf_model_free(m);
}

/* float32 out (kf_fuse_fp8's unit-scale sums, scaled after): the call
 * writes float32 and leaves the scale and the bias to the epilogue kernel
 * (a float8 kernel writing float32 would read its bias as bfloat16) */
Test(libanchor, fp8_gemm_float32_sums_scaled_in_the_epilogue) {
    cgu_need_opencl();
    const char *text = "opset 21\ninput xq float8e4m3fn[24, 64]\nconst w float8e4m3fn[64, 48] = random\n"
                       "const one float[] = 1\nconst s float[48] = random\nconst b float[48] = random\n"
                       "xd = DequantizeLinear(xq, one)\nwd = DequantizeLinear(w, one)\ny = MatMul(xd, wd)\n"
                       "z = Mul(y, s)\nr = Add(z, b)\noutput r\n";
    tally t = check_text(text);
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 1);
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    kf_la_anchor la;
    char why[512];
    cr_assert_eq(kf_la_plan_group(m, p, cgu_group_of(m, p, "y"), &la, why, sizeof why), KF_OK, "%s", why);
    cr_assert(la.gemm.dtype == KF_DT_FLOAT && la.gemm.a_dtype == KF_DT_FLOAT8E4M3FN && la.gemm.alpha == 1.0f);
    cr_assert(!la.gemm.bias && la.lib_nodes == 3, "the call takes the product and its DequantizeLinears alone");
    kf_la_anchor_release(&la);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(libanchor, fp8_gemm_declines_with_reasons) {
    /* Gemm's C in float32 is not the call's bias */
    expect_decline("opset 21\ninput xq float8e4m3fn[24, 64]\nconst w float8e4m3fn[64, 48] = random\n"
                   "const sx float[] = 0.02\nconst sw float[] = 0.01\nconst c float[48] = random\n"
                   "xd = DequantizeLinear(xq, sx)\nwd = DequantizeLinear(w, sw)\ny = Gemm(xd, wd, c)\noutput y\n",
                   "16-bit type");
    /* weights per column: not a float8 product; a dequantizing prologue
     * the float16 GEMM cannot take */
    expect_decline("opset 21\ninput xq float8e4m3fn[24, 64]\nconst w float8e4m3fn[64, 48] = random\n"
                   "const sx float16[] = 0.02\nconst sw float16[48] = random\n"
                   "xd = DequantizeLinear(xq, sx)\nwd = DequantizeLinear(w, sw) {axis=1}\ny = MatMul(xd, wd)\noutput y\n",
                   "operand prologue");
}

/* A chain of two float8 products, the first's output quantized for the
 * second: each product's group takes its own two DequantizeLinears (the
 * activation's read from the float8 values the first group writes) and
 * maps to the library's float8 GEMM on the H200 profile; with no cost
 * model too (where bytes make the chain one back-to-back group); a target
 * without float8 tensor cores (A100) leaves the planner to price them one
 * by one. */
Test(libanchor, fp8_products_take_their_dequantize_operands) {
    const char *text = "opset 21\ninput xq float8e4m3fn[2048, 256]\nconst w float8e4m3fn[256, 512] = random\n"
                       "const w2 float8e4m3fn[512, 256] = random\nconst sx float16[] = 0.02\nconst sw float16[] = 0.01\n"
                       "const s1 float16[] = 0.05\nconst b float16[512] = random\n"
                       "xd = DequantizeLinear(xq, sx)\nwd = DequantizeLinear(w, sw)\n"
                       "y = MatMul(xd, wd)\nz = Add(y, b)\nr = Relu(z)\n"
                       "q1 = QuantizeLinear(r, s1) {output_dtype=17}\nd1 = DequantizeLinear(q1, s1)\n"
                       "wd2 = DequantizeLinear(w2, sw)\ny2 = MatMul(d1, wd2)\noutput y2\n";
    static const char *targets[] = {NULL, "h200", "a100"};
    for (int ti = 0; ti < 3; ti++) {
        kf_model *m = gt_parse(text);
        kf_plan_options o = {.fuel = -1, .target = targets[ti]};
        kf_plan *p = NULL;
        cr_assert_eq(kf_plan_build(m, &o, &p), KF_OK, "%s", kf_last_error());
        uint32_t g1 = cgu_group_of(m, p, "y"), g2 = cgu_group_of(m, p, "y2");
        bool taken = cgu_group_of(m, p, "xd") == g1 && cgu_group_of(m, p, "wd") == g1 &&
                     cgu_group_of(m, p, "d1") == g2 && cgu_group_of(m, p, "wd2") == g2 && cgu_group_of(m, p, "q1") == g1;
        if (ti < 2) cr_assert(taken, "target %s: the DequantizeLinears are not with their products", targets[ti]);
        for (uint32_t gi = 0; ti == 1 && gi < 2; gi++) { /* (no target: one back-to-back group, as bytes say) */
            kf_la_anchor la;
            char why[512];
            cr_assert_eq(kf_la_plan_group(m, p, gi ? g2 : g1, &la, why, sizeof why), KF_OK, "%s", why);
            cr_assert(la.gemm.a_dtype == KF_DT_FLOAT8E4M3FN);
            kf_la_anchor_release(&la);
        }
        if (ti == 1) {
            kf_cost_group cg;
            kf_cost_of_group(m, p, g1, &cg);
            cr_assert(cg.fp8 && !cg.prologue);
            kf_target *t = NULL;
            cr_assert_eq(kf_target_get("h200", &t), KF_OK);
            cr_assert(kf_cost_library(t, m->graph, &cg));
            kf_cost c;
            kf_cost_estimate(t, KF_MATH_FP32, m->graph, &cg, &c);
            cr_assert_str_eq(c.form, "lib_gemm_fp8");
            kf_target_free(t);
        }
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* A float model with float8 QDQ (weights quantized per tensor, folded by
 * the optimizer to float8 constants) at precision fp8 on OpenCL, the call
 * replaced by its host model: the weights stay float8 (uploaded
 * transposed), the product is the library's float8 GEMM, and the outputs
 * equal the float model's within float16's tolerance. */
Test(libanchor, exec_fp8_plan_with_the_library_gemm) {
    cgu_need_opencl();
    static const char *text =
        "opset 21\ninput xq float8e4m3fn[2, 12, 64]\nconst sx float[] = 0.02\n"
        "const w float[64, 48] = random\nconst sw float[] = 0.004\nconst b float[48] = random\n"
        "xd = DequantizeLinear(xq, sx)\n"
        "wq = QuantizeLinear(w, sw) {output_dtype=17}\nwd = DequantizeLinear(wq, sw)\n"
        "y = MatMul(xd, wd)\nz = Add(y, b)\nr = Relu(z)\noutput r\n";
    kf_model *m = gt_parse(text);
    char *trace = cgu_exec_host_lib_trace(m, m, KF_EXEC_OPENCL, KF_PRECISION_FP8);
    cr_assert_not_null(strstr(trace, "fp8: 1 float8 products keep their weights"), "%s", trace);
    cr_assert_not_null(strstr(trace, "library GEMM 48x24x64 (batch 1) on float8e4m3fn weights"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

/* Anchor groups of the bundled models (optimized like kf_exec does):
 * every one that maps is checked; BERT, GPT-2 and ViT each map some. */
static void check_model(const char *rel, bool expect_mapped) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/models/small/%s/model.onnx", tu_source_dir(), rel);
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    /* kf_exec specialises symbolic dims before planning; so does this:
     * batch 1 and 8 tokens keep the reference run short */
    for (uint32_t s = 1; s < m->graph->nsyms; s++)
        if (kf_graph_bind_sym(m->graph, m->graph->syms[s], s == 1 ? 1 : 8) != KF_OK) kf_clear_error();
    kf_opt_options oo;
    kf_opt_options_default(&oo);
    kf_opt_result res;
    memset(&res, 0, sizeof res);
    cr_assert_eq(kf_optimize(m, &oo, &res), KF_OK, "%s", kf_last_error());
    kf_rules_free(&res.rules);
    kf_plan *p = cgu_plan(m);
    cgu_refvals r = cgu_reference(m);
    tally t = {0};
    check_groups(m, p, &r, &t);
    fprintf(stderr, "libanchor: %s: %u anchor groups mapped (%u convs, %u with an epilogue kernel, %u biases, %u activations), %u declined (first: %s)\n",
            rel, t.mapped, t.convs, t.with_epilogue, t.biases, t.acts, t.declined, t.declined ? t.first_reason : "-");
    if (expect_mapped) cr_assert_gt(t.mapped, 0, "%s: none mapped; first reason: %s", rel, t.first_reason);
    cgu_refvals_free(&r);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(libanchor, bundled_bert, .timeout = 300) {
    cgu_need_opencl();
    check_model("bert", true);
}
Test(libanchor, bundled_gpt2, .timeout = 300) {
    cgu_need_opencl();
    check_model("gpt2", true);
}
Test(libanchor, bundled_vit, .timeout = 300) {
    cgu_need_opencl();
    check_model("vit_b16", true);
}

Test(libanchor, bundled_resnet50, .timeout = 300) {
    cgu_need_opencl();
    check_model("resnet50", true);
}
Test(libanchor, bundled_mobilenetv2, .timeout = 300) {
    cgu_need_opencl();
    check_model("mobilenetv2", true);
}

Test(libanchor, conv_bias_relu_all_in_the_library) {
    cgu_need_opencl();
    tally t = check_text("input x float[2, 3, 11, 9]\nconst w float[8, 3, 3, 3] = random\nconst b float[8] = random\n"
                         "y = Conv(x, w, b) {pads=[1,1,1,1], strides=[2,1]}\nr = Relu(y)\noutput r\n");
    cr_assert_eq(t.mapped, 1, "%s", t.first_reason);
    cr_assert_eq(t.convs, 1);
    cr_assert_eq(t.acts, 1);
    cr_assert_eq(t.with_epilogue, 0);
}

Test(libanchor, conv_groups_depthwise_dilation_add_bias_residual) {
    cgu_need_opencl();
    /* grouped conv with a per-channel Add taken as the bias, then a residual
     * the call adds too (cuDNN's z); depthwise with dilation and ReLU
     * without bias (the ReLU stays in the epilogue kernel: cuDNN fuses it
     * only with a bias) */
    tally t = check_text("input x float[1, 8, 10, 10]\nconst w float[12, 4, 3, 3] = random\n"
                         "const cb float[12, 1, 1] = random\ninput res float[1, 12, 10, 10]\n"
                         "y = Conv(x, w) {group=2, pads=[1,1,1,1]}\nz = Add(y, cb)\nq = Add(z, res)\noutput q\n"
                         "const dw float[8, 1, 3, 3] = random\n"
                         "y2 = Conv(x, dw) {group=8, pads=[2,2,2,2], dilations=[2,2]}\nr2 = Relu(y2)\noutput r2\n");
    cr_assert_eq(t.mapped, 2, "%s", t.first_reason);
    cr_assert_eq(t.biases, 1);
    cr_assert_eq(t.residuals, 1);
    cr_assert_eq(t.acts, 0);
    cr_assert_eq(t.with_epilogue, 1);
}

Test(libanchor, conv_residual_and_relu_in_the_call) {
    cgu_need_opencl();
    /* ResNet's block end: conv with bias, the skip connection, ReLU: one
     * call (z = the skip, alpha2 1), no epilogue kernel; the same in
     * float16, and with the residual added first (y + s, s + y alike) */
    tally t = check_text("input x float[2, 8, 6, 6]\nconst w float[16, 8, 3, 3] = random\nconst b float[16] = random\n"
                         "input s float[2, 16, 6, 6]\n"
                         "y = Conv(x, w, b) {pads=[1,1,1,1]}\nz = Add(s, y)\nr = Relu(z)\noutput r\n"
                         "input h float16[1, 4, 5, 5]\nconst wh float16[8, 4, 1, 1] = random\n"
                         "const bh float16[8] = random\ninput sh float16[1, 8, 5, 5]\n"
                         "yh = Conv(h, wh, bh)\nzh = Add(yh, sh)\nrh = Relu(zh)\noutput rh\n");
    cr_assert_eq(t.mapped, 2, "%s", t.first_reason);
    cr_assert_eq(t.residuals, 2);
    cr_assert_eq(t.acts, 2);
    cr_assert_eq(t.with_epilogue, 0);
}

Test(libanchor, conv_residual_the_call_declines) {
    cgu_need_opencl();
    /* what cuDNN's z cannot be: a broadcast residual, one after the ReLU
     * (the call adds z before its activation), one without a bias (the
     * fused op needs a bias), the conv's own output twice: each stays in
     * the epilogue kernel, and the results still match */
    tally t = check_text("input x float[1, 4, 6, 6]\nconst w float[8, 4, 3, 3] = random\nconst b float[8] = random\n"
                         "input sb float[1, 8, 1, 6]\n"
                         "y = Conv(x, w, b) {pads=[1,1,1,1]}\nz = Add(y, sb)\noutput z\n"
                         "const w2 float[8, 4, 3, 3] = random\nconst b2 float[8] = random\ninput s2 float[1, 8, 6, 6]\n"
                         "y2 = Conv(x, w2, b2) {pads=[1,1,1,1]}\nr2 = Relu(y2)\nz2 = Add(r2, s2)\noutput z2\n"
                         "const w3 float[8, 4, 3, 3] = random\ninput s3 float[1, 8, 6, 6]\n"
                         "y3 = Conv(x, w3) {pads=[1,1,1,1]}\nz3 = Add(y3, s3)\noutput z3\n"
                         "const w4 float[8, 4, 3, 3] = random\nconst b4 float[8] = random\n"
                         "y4 = Conv(x, w4, b4) {pads=[1,1,1,1]}\nz4 = Add(y4, y4)\noutput z4\n");
    cr_assert_eq(t.mapped, 4, "%s", t.first_reason);
    cr_assert_eq(t.residuals, 0);
    cr_assert_eq(t.with_epilogue, 4);
}

Test(libanchor, conv_1d_3d_and_float16) {
    cgu_need_opencl();
    tally t = check_text("input a float[2, 4, 17]\nconst wa float[6, 4, 3] = random\nconst ba float[6] = random\n"
                         "ya = Conv(a, wa, ba) {strides=[2]}\nra = Relu(ya)\noutput ra\n"
                         "input v float[1, 2, 5, 6, 7]\nconst wv float[3, 2, 3, 3, 3] = random\n"
                         "yv = Conv(v, wv) {pads=[1,1,1,1,1,1]}\nsv = Sigmoid(yv)\noutput sv\n"
                         "input h float16[1, 4, 8, 8]\nconst wh float16[8, 4, 3, 3] = random\nconst bh float16[8] = random\n"
                         "yh = Conv(h, wh, bh) {pads=[1,1,1,1]}\nrh = Relu(yh)\noutput rh\n");
    cr_assert_eq(t.mapped, 3, "%s", t.first_reason);
    cr_assert_eq(t.convs, 3);
}

Test(libanchor, exec_conv_model_on_opencl, .timeout = 300) {
    cgu_need_opencl();
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/models/small/resnet50/model.onnx", tu_source_dir());
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    for (uint32_t s = 1; s < m->graph->nsyms; s++)
        if (kf_graph_bind_sym(m->graph, m->graph->syms[s], 1) != KF_OK) kf_clear_error();
    char *trace = exec_matches_ref(m, true);
    cr_assert_not_null(strstr(trace, "library conv"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

Test(libanchor, cublaslt_reports_not_available_cleanly) {
    const char *why = kf_cublaslt_unavailable();
    if (!why) cr_skip_test("cuBLASLt and a CUDA device are available here: the call runs in bench/gpu_check.sh");
    cr_assert(strlen(why) > 0);
    kf_la_gemm g = {.m = 4, .n = 4, .k = 4, .lda = 4, .ldb = 4, .ldd = 4, .batch = 1, .alpha = 1, .dtype = KF_DT_FLOAT};
    cr_assert_eq(kf_cublaslt_gemm(NULL, &g, NULL, NULL, NULL, NULL, NULL), KF_ERR_NO_DEVICE);
    cr_assert_not_null(strstr(kf_last_error(), why), "%s", kf_last_error());
    kf_clear_error();
    const char *dwhy = kf_cudnn_unavailable();
    cr_assert_not_null(dwhy, "cuDNN available without cuBLASLt's device?");
    kf_la_conv c = {.nspatial = 2, .n = 1, .c = 1, .k = 1, .groups = 1, .dtype = KF_DT_FLOAT};
    cr_assert_eq(kf_cudnn_conv(NULL, &c, NULL, NULL, NULL, NULL, NULL), KF_ERR_NO_DEVICE);
    cr_assert_not_null(strstr(kf_last_error(), dwhy), "%s", kf_last_error());
    kf_clear_error();
}

Test(libanchor, host_model_rejects_short_buffers) {
    kf_la_gemm g = {.m = 4, .n = 3, .k = 5, .lda = 4, .ldb = 5, .ldd = 4, .batch = 2, .stride_a = 20, .stride_b = 15,
                    .stride_d = 12, .alpha = 1, .dtype = KF_DT_FLOAT};
    kf_tensor a = {0}, b = {0}, d = {0};
    int64_t na = 40, nb = 29, nd = 24; /* b one element short */
    cr_assert_eq(kf_tensor_alloc(&a, KF_DT_FLOAT, 1, &na), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&b, KF_DT_FLOAT, 1, &nb), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&d, KF_DT_FLOAT, 1, &nd), KF_OK);
    cr_assert_eq(kf_la_gemm_host(&g, &a, &b, NULL, NULL, &d), KF_ERR_INVALID_ARG);
    kf_clear_error();
    kf_tensor_release(&a), kf_tensor_release(&b), kf_tensor_release(&d);

    /* a conv whose residual is missing or one element short; whole, it runs */
    kf_la_conv c = {.nspatial = 1, .n = 1, .c = 2, .k = 3, .groups = 1, .in = {4}, .kern = {1}, .out = {4},
                    .stride = {1}, .dilation = {1}, .dtype = KF_DT_FLOAT, .z = 7};
    kf_tensor x = {0}, w = {0}, z = {0}, y = {0};
    int64_t nx = 8, nw = 6, nz = 11, ny = 12;
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 1, &nx), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&w, KF_DT_FLOAT, 1, &nw), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&z, KF_DT_FLOAT, 1, &nz), KF_OK);
    cr_assert_eq(kf_tensor_alloc(&y, KF_DT_FLOAT, 1, &ny), KF_OK);
    cr_assert_eq(kf_la_conv_host(&c, &x, &w, NULL, NULL, &y), KF_ERR_INVALID_ARG);
    kf_clear_error();
    cr_assert_eq(kf_la_conv_host(&c, &x, &w, &z, NULL, &y), KF_ERR_INVALID_ARG);
    kf_clear_error();
    kf_tensor_release(&z);
    cr_assert_eq(kf_tensor_alloc(&z, KF_DT_FLOAT, 1, &ny), KF_OK);
    float *xf = x.data, *wf = w.data, *zf = z.data, *yf = y.data;
    for (int64_t i = 0; i < nx; i++) xf[i] = (float)(i + 1);
    for (int64_t i = 0; i < nw; i++) wf[i] = 0.5f * (float)(i - 2);
    for (int64_t i = 0; i < ny; i++) zf[i] = (float)(3 * i - 7);
    cr_assert_eq(kf_la_conv_host(&c, &x, &w, &z, NULL, &y), KF_OK, "%s", kf_last_error());
    for (int64_t k = 0; k < 3; k++) /* 1x1: y[k, p] = w[k, 0] x[0, p] + w[k, 1] x[1, p] + z[k, p] */
        for (int64_t q = 0; q < 4; q++)
            cr_assert_float_eq(yf[k * 4 + q], wf[k * 2] * xf[q] + wf[k * 2 + 1] * xf[4 + q] + zf[k * 4 + q], 1e-6,
                               "y[%lld, %lld]", (long long)k, (long long)q);
    kf_tensor_release(&x), kf_tensor_release(&w), kf_tensor_release(&z), kf_tensor_release(&y);
}

/* ---- the exec path: library steps on OpenCL through the host model ------ */

/* Runs text through kf_exec on OpenCL with KFUSE_LIBANCHOR_HOST=1 (the
 * library call replaced by kf_la_gemm_host on downloaded buffers, the
 * epilogue kernels on PoCL) and compares every output with the reference
 * evaluator on the unoptimized model; returns the trace (caller frees). */
static char *exec_on(const kf_model *m, bool lib, kf_exec_backend backend, const char *target);
/* no cost model ("none"): at these test sizes it would put the small GEMMs
 * on generated kernels (kf_group.est_lib_us), and these tests are about
 * the library path */
static char *exec_matches_ref(const kf_model *m, bool lib) { return exec_on(m, lib, KF_EXEC_OPENCL, "none"); }

static char *exec_on(const kf_model *m, bool lib, kf_exec_backend backend, const char *target) {
    setenv("KFUSE_LIBANCHOR_HOST", "1", 1);
    char *trace = NULL;
    size_t tlen = 0;
    FILE *tf = open_memstream(&trace, &tlen);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = backend;
    o.trace = tf;
    o.no_vendor_lib = !lib;
    o.target = target;
    char dir[] = "/tmp/kf_libanchor_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    o.cache_dir = dir;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    uint32_t nout = m->graph->noutputs;
    kf_tensor *ins;
    uint32_t nins;
    gt_random_inputs(m, &ins, &nins);
    kf_tensor *want = calloc(nout + 1, sizeof(kf_tensor)), *got = calloc(nout + 1, sizeof(kf_tensor));
    cr_assert_eq(kf_eval_model(m, ins, (int)nins, want, NULL), KF_OK, "%s", kf_last_error());
    for (int run = 0; run < 2; run++) { /* the second run reuses the slot's buffers */
        cr_assert_eq(kf_exec_run(x, ins, nins, got), KF_OK, "run %d: %s", run, kf_last_error());
        for (uint32_t i = 0; i < nout; i++) {
            char why[512];
            /* long dot products in fp32 against the double reference (cgu_dot_atol) */
            bool half = want[i].dtype == KF_DT_FLOAT16;
            cr_assert(tu_close(&got[i], &want[i], half ? ATOL16 : cgu_dot_atol(768), half ? RTOL16 : RTOL * 4, why, sizeof why),
                      "run %d output %u: %s", run, i, why);
            kf_tensor_release(&got[i]);
        }
    }
    for (uint32_t i = 0; i < nout; i++) kf_tensor_release(&want[i]);
    for (uint32_t i = 0; i < nins; i++) kf_tensor_release(&ins[i]);
    free(ins), free(got), free(want);
    kf_exec_free(x);
    fclose(tf);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    return trace;
}

static const char *EXEC_MIX =
    "input x float[24, 64]\nconst w float[64, 48] = random\nconst b float[48] = random\n"
    "input res float[24, 48]\nconst sc float[48] = random\nconst sh float[48] = random\n"
    "y = MatMul(x, w)\nz = Add(y, b)\nq = Add(z, res)\nn = LayerNormalization(q, sc, sh) {axis=-1}\n"
    "const w2 float[48, 32] = random\nconst b2 float[32] = random\n"
    "input x2 float[24, 48]\ny2 = MatMul(x2, w2)\nz2 = Add(y2, b2)\nr2 = Relu(z2)\n"
    "input p float[2, 32, 16]\nconst w3 float[32, 8] = random\n"
    "t = Transpose(p) {perm=[0,2,1]}\ny3 = MatMul(t, w3)\ns3 = Sigmoid(y3)\n"
    "output s3\noutput n\noutput r2\n";

Test(libanchor, exec_runs_library_steps_and_epilogues_on_opencl) {
    cgu_need_opencl();
    kf_model *m = gt_parse(EXEC_MIX);
    char *trace = exec_matches_ref(m, true);
    uint32_t calls = 0, epis = 0;
    for (const char *t = trace; (t = strstr(t, "library GEMM")); t++) {
        calls++;
        const char *nl = strchr(t, '\n');
        const char *ep = strstr(t, "epilogue kernel");
        epis += ep && (!nl || ep < nl);
    }
    cr_assert_eq(calls, 3, "%s", trace);
    cr_assert_eq(epis, 2, "%s", trace);
    free(trace);
    /* and the kill switch: no library step */
    trace = exec_matches_ref(m, false);
    cr_assert_null(strstr(trace, "library GEMM"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

/* With the cost model (h200), a small GEMM runs as its generated kernel,
 * which the plan estimates faster than the call (kf_group.est_lib_us); a
 * BERT-sized projection stays the library call. Both match the reference. */
Test(libanchor, exec_follows_the_plan_estimate_library_or_generated) {
    cgu_need_opencl();
    kf_model *m = gt_parse("input x float[8, 32]\nconst w float[32, 16] = random\ny = MatMul(x, w)\n"
                           "input a float[128, 768]\nconst v float[768, 768] = random\nz = MatMul(a, v)\n"
                           "output y, z\n");
    char *trace = exec_on(m, true, KF_EXEC_OPENCL, "h200");
    uint32_t calls = 0, generated = 0;
    for (const char *t = trace; (t = strstr(t, "library GEMM")); t++) calls++;
    for (const char *t = trace; (t = strstr(t, "generated, not the library")); t++) generated++;
    cr_expect_eq(calls, 1, "%s", trace);
    cr_expect_eq(generated, 1, "%s", trace);
    cr_expect_not_null(strstr(trace, "library GEMM 768x128x768"), "%s", trace); /* the call computes the transpose */
    free(trace);
    kf_model_free(m);
}

Test(libanchor, exec_bundled_bert_with_library_steps, .timeout = 300) {
    cgu_need_opencl();
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/models/small/bert/model.onnx", tu_source_dir());
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s", kf_last_error());
    for (uint32_t s = 1; s < m->graph->nsyms; s++)
        if (kf_graph_bind_sym(m->graph, m->graph->syms[s], s == 1 ? 1 : 8) != KF_OK) kf_clear_error();
    char *trace = exec_matches_ref(m, true);
    cr_assert_not_null(strstr(trace, "library GEMM"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

Test(libanchor, cuda_compile_only_keeps_generated_anchors) {
    const char *nv = kf_nvrtc_unavailable();
    if (nv) cr_skip_test("NVRTC: %s", nv);
    kf_model *m = gt_parse(EXEC_MIX);
    kf_exec_options o;
    kf_exec_options_default(&o);
    o.backend = KF_EXEC_CUDA;
    o.compile_only = true;
    o.arch = "sm_90";
    char dir[] = "/tmp/kf_libanchor_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    o.cache_dir = dir;
    kf_exec *x = NULL;
    cr_assert_eq(kf_exec_create(m, &o, &x), KF_OK, "%s", kf_last_error());
    kf_exec_stats st;
    kf_exec_get_stats(x, &st);
    cr_assert_geq(st.kernels_unique, 3, "every anchor compiles as a generated kernel");
    kf_exec_free(x);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    kf_model_free(m);
}

/* Every allocation of the mapping (the plan view, the epilogue kernel)
 * failing in turn: out of memory is reported as such, never as a decline
 * (which would quietly change what runs), and nothing leaks (ASan build). */
Test(libanchor, allocation_failures_are_out_of_memory_not_declines) {
    kf_model *m = gt_parse("input x float[24, 64]\nconst w float[64, 48] = random\nconst b float[48] = random\n"
                           "input res float[24, 48]\nconst sc float[48] = random\nconst sh float[48] = random\n"
                           "y = MatMul(x, w)\nz = Add(y, b)\nq = Add(z, res)\n"
                           "n = LayerNormalization(q, sc, sh) {axis=-1}\noutput n\n");
    kf_plan *p = cgu_plan(m);
    uint32_t gi = 0;
    while (gi < p->ngroups && p->groups[gi].kind != KF_GROUP_ANCHOR) gi++;
    cr_assert_lt(gi, p->ngroups);
    uint64_t nth = 1, fired = 0;
    for (;; nth++) {
        kf_la_anchor la;
        char why[512] = "";
        kf_alloc_fault_set(nth, false);
        kf_status st = kf_la_plan_group(m, p, gi, &la, why, sizeof why);
        bool f = kf_alloc_fault_fired();
        kf_alloc_fault_set(0, false);
        kf_clear_error();
        if (!f) {
            cr_assert_eq(st, KF_OK, "%s", why);
            kf_la_anchor_release(&la);
            break;
        }
        fired++;
        cr_assert(st == KF_ERR_NOMEM || st == KF_OK, "allocation %llu failing gave status %d: %s", (unsigned long long)nth,
                  (int)st, why);
        if (st == KF_OK) kf_la_anchor_release(&la);
    }
    cr_assert_gt(fired, 2, "the mapping allocates (plan view, kernel)");
    kf_plan_free(p);
    kf_model_free(m);
}

/* Codegen declines a tanh Gelu after a GEMM (today: the group would run on
 * the reference evaluator); the library takes the whole group instead. */
Test(libanchor, exec_library_takes_an_anchor_codegen_declines) {
    cgu_need_opencl();
    kf_model *m = gt_parse("opset 20\ninput x float[16, 32]\nconst w float[32, 64] = random\nconst b float[64] = random\n"
                           "y = Gemm(x, w, b)\ng = Gelu(y) {approximate=\"tanh\"}\noutput g\n");
    char *trace = exec_matches_ref(m, true);
    cr_assert_not_null(strstr(trace, "(library call)"), "%s", trace);
    cr_assert_null(strstr(trace, "ref:"), "%s", trace);
    free(trace);
    trace = exec_matches_ref(m, false);
    cr_assert_null(strstr(trace, "(library call)"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

Test(libanchor, epilogue_kernels_compile_for_cuda) {
    cgu_need_opencl();
    const char *nv = kf_nvrtc_unavailable();
    if (nv) cr_skip_test("NVRTC: %s", nv);
    nvrtc_epilogues = true;
    tally t = check_text("input x float[24, 64]\nconst w float[64, 48] = random\nconst b float[48] = random\n"
                         "input res float[24, 48]\nconst sc float[48] = random\nconst sh float[48] = random\n"
                         "y = MatMul(x, w)\nz = Add(y, b)\nq = Add(z, res)\n"
                         "n = LayerNormalization(q, sc, sh) {axis=-1}\noutput n\n"
                         "input c float16[1, 8, 10, 10]\nconst cw float16[12, 8, 3, 3] = random\n"
                         "input cr float16[1, 12, 10, 10]\ncy = Conv(c, cw) {pads=[1,1,1,1]}\ncq = Add(cy, cr)\n"
                         "cs = Sigmoid(cq)\noutput cs\n");
    cr_assert_eq(t.mapped, 2, "%s", t.first_reason);
    cr_assert_eq(t.with_epilogue, 2);
    t = check_text(INT8_DENSE); /* int32 sums in, float and int8 out */
    cr_assert_eq(t.ints, 1);
    cr_assert_eq(t.with_epilogue, 1);
}

/* On a GPU: the real cuBLASLt and cuDNN calls against the reference
 * (bench/gpu_check.sh runs this suite there). */
Test(libanchor, cuda_library_calls_match_ref, .timeout = 300) {
    const char *why = kf_cu_unavailable();
    if (why) cr_skip_test("no CUDA device: %s", why);
    if ((why = kf_cublaslt_unavailable())) cr_skip_test("%s", why);
    kf_model *m = gt_parse(EXEC_MIX);
    char *trace = exec_on(m, true, KF_EXEC_CUDA, "none");
    cr_assert_not_null(strstr(trace, "library GEMM"), "%s", trace);
    free(trace);
    kf_model_free(m);
    exec_int8_plan(KF_EXEC_CUDA); /* cuBLASLt's int8 GEMM (IMMA) */
    if ((why = kf_cudnn_unavailable())) cr_skip_test("GEMMs checked; cuDNN: %s", why);
    m = gt_parse("input x float[2, 3, 11, 9]\nconst w float[8, 3, 3, 3] = random\nconst b float[8] = random\n"
                 "y = Conv(x, w, b) {pads=[1,1,1,1], strides=[2,1]}\nr = Relu(y)\noutput r\n"
                 "input h float[1, 8, 10, 10]\nconst dw float[8, 1, 3, 3] = random\n"
                 "y2 = Conv(h, dw) {group=8, pads=[2,2,2,2], dilations=[2,2]}\ns2 = Sigmoid(y2)\noutput s2\n");
    trace = exec_on(m, true, KF_EXEC_CUDA, "none");
    cr_assert_not_null(strstr(trace, "library conv"), "%s", trace);
    free(trace);
    kf_model_free(m);
}

/* The math each precision hands the libraries, with the values of the
 * library headers written out: strict float32 never lets cuDNN pick TF32
 * tensor cores (CUDNN_FMA_MATH = 3, and only FMA algorithms from the
 * heuristic's list), nor cuBLASLt (CUBLAS_COMPUTE_32F = 68). */
Test(libanchor, math_per_precision) {
    kf_la_math m = kf_la_math_for(KF_PRECISION_FP32, KF_DT_FLOAT);
    cr_assert_eq(m.cudnn_math, 3, "fp32 conv math %d, want CUDNN_FMA_MATH", m.cudnn_math);
    cr_assert_eq(m.cudnn_algo_math, 1u << 3, "fp32 may pick an algorithm of math mask %#x", m.cudnn_algo_math);
    cr_assert_eq(m.cublas_compute, 68);
    cr_assert_eq(m.cudnn_data, 0);
    cr_assert_eq(m.cuda_data, 0);

    m = kf_la_math_for(KF_PRECISION_TF32, KF_DT_FLOAT);
    cr_assert_eq(m.cudnn_math, 1); /* CUDNN_TENSOR_OP_MATH */
    cr_assert(m.cudnn_algo_math & 1u << 1);
    cr_assert(!(m.cudnn_algo_math & 1u << 2), "ALLOW_CONVERSION would round float32 to float16");
    cr_assert_eq(m.cublas_compute, 77); /* CUBLAS_COMPUTE_32F_FAST_TF32 */
    cr_assert_eq(m.cuda_data, 0);

    m = kf_la_math_for(KF_PRECISION_FP16, KF_DT_FLOAT16);
    cr_assert_eq(m.cudnn_math, 1);
    cr_assert_eq(m.cublas_compute, 68, "16-bit operands accumulate in float32");
    cr_assert_eq(m.cudnn_data, 2);
    cr_assert_eq(m.cuda_data, 2);

    m = kf_la_math_for(KF_PRECISION_BF16, KF_DT_BFLOAT16);
    cr_assert_eq(m.cudnn_math, 1);
    cr_assert_eq(m.cublas_compute, 68);
    cr_assert_eq(m.cudnn_data, 9);
    cr_assert_eq(m.cuda_data, 14);

    /* a float16 model at fp32: tensor cores round nothing there, and the
     * accumulation stays float32 */
    m = kf_la_math_for(KF_PRECISION_FP32, KF_DT_FLOAT16);
    cr_assert_eq(m.cudnn_math, 1);
    cr_assert_eq(m.cublas_compute, 68);
    cr_assert_eq(m.cudnn_data, 2);
    cr_assert_eq(m.cublas_scale, 0);
    cr_assert_eq(m.cuda_data_d, 2);

    /* int8 GEMMs are exact whatever the plan's precision */
    for (int p = 0; p <= KF_PRECISION_INT8; p++) {
        m = kf_la_math_for((kf_precision)p, KF_DT_INT8);
        cr_assert_eq(m.cublas_compute, 72);
        cr_assert_eq(m.cublas_scale, 10);
        cr_assert_eq(m.cuda_data, 3);
        cr_assert_eq(m.cuda_data_d, 10);
    }
}
