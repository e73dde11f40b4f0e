/*
 * test_cg_rows.c: codegen's segmented row reductions (several rows per
 * work-group, codegen.c KF_CG_SEGMENT) and bfloat16 storage, run on OpenCL
 * (PoCL on the CPU) against the reference evaluator: every reduction kind
 * over short and medium rows (odd lengths, many rows, a partly empty last
 * work-group), work-group sizes other than the preferred one, fp32/fp16/
 * bf16; bf16 elementwise, injective and Cast (data movement and the Cast's
 * rounding bit for bit); the CUDA text of the new variants through NVRTC.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_util.h"

/* DESIGN.md numerics, fused vs unfused: fp32, fp16, bf16 */
#define ATOL 1e-5
#define RTOL 1e-4
#define ATOL16 2.5e-3
#define RTOL16 1e-3
#define ATOLBF 2e-2
#define RTOLBF 1e-2

static void tol_of(kf_dtype dt, double *atol, double *rtol) {
    *atol = dt == KF_DT_BFLOAT16 ? ATOLBF : dt == KF_DT_FLOAT16 ? ATOL16 : ATOL;
    *rtol = dt == KF_DT_BFLOAT16 ? RTOLBF : dt == KF_DT_FLOAT16 ? RTOL16 : RTOL;
}

/* Runs kernel k on OpenCL with the reference inputs and compares every
 * output with the reference (exact when exact, else the dtype's policy). */
static void run_and_compare(const kf_cg_kernel *k, const cgu_refvals *r, bool exact, const char *what) {
    const kf_tensor *in[KF_CG_MAX_PARAMS];
    for (uint32_t i = 0; i < k->nins; i++) in[i] = &r->t[k->ins[i].value];
    kf_tensor out[KF_PLAN_MAX_OUTPUTS] = {0};
    cr_assert_eq(kf_cl_run_kernel(k, in, out), KF_OK, "%s: %s\n%s", what, kf_last_error(), k->body);
    for (uint32_t o = 0; o < k->nouts; o++) {
        char w[256];
        const kf_tensor *want = &r->t[k->outs[o].value];
        double atol = 0, rtol = 0;
        if (!exact) tol_of(want->dtype, &atol, &rtol);
        cr_assert(tu_close(&out[o], want, atol, rtol, w, sizeof w), "%s (block %u, numel %lld) output %u: %s\n%s", what,
                  k->block, (long long)k->numel, o, w, k->body);
        kf_tensor_release(&out[o]);
    }
}

/* Plans text, generates every elementwise/reduction/anchor group (all must
 * be supported, deterministically) and checks each on OpenCL. exact: the
 * outputs must equal the reference bit for bit. Returns the kernel count;
 * *block gets the last reduction kernel's preferred work-group (0: none). */
static uint32_t check_graph(const char *text, bool exact, uint32_t *block) {
    kf_model *m = gt_parse(text);
    kf_plan *p = cgu_plan(m);
    cgu_refvals r = cgu_reference(m);
    uint32_t count = 0;
    if (block) *block = 0;
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        kf_group_kind kind = p->groups[gi].kind;
        if (kind != KF_GROUP_ELEMWISE && kind != KF_GROUP_REDUCTION && kind != KF_GROUP_ANCHOR) continue;
        char why[512];
        cr_assert_null(kf_cg_unsupported(m, p, gi, why, sizeof why), "group %u declined: %s\n%s", gi, why, text);
        kf_cg_kernel k, k2;
        cr_assert_eq(kf_cg_group(m, p, gi, &k), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_cg_group(m, p, gi, &k2), KF_OK, "%s", kf_last_error());
        cr_assert_str_eq(k.body, k2.body, "generation is not deterministic");
        kf_cg_kernel_release(&k2);
        run_and_compare(&k, &r, exact, text);
        if (block && kind == KF_GROUP_REDUCTION) *block = k.block;
        count++;
        kf_cg_kernel_release(&k);
    }
    cr_assert_geq(count, 1, "no kernel generated:\n%s", text);
    cgu_refvals_free(&r);
    kf_plan_free(p);
    kf_model_free(m);
    return count;
}

/* A reduction of kind op over rows of K, with a prologue and an epilogue.
 * The prologue maps x in [-2, 2) into [0.99, 1.01) for Prod (a product of
 * 1000 such stays finite) and LogSum (a positive sum), else x * s + x. */
static void reduction_text(char *text, size_t len, const char *op, const char *dt, int64_t rows, int64_t K) {
    bool near_one = !strcmp(op, "ReduceProd") || !strcmp(op, "ReduceLogSum");
    char pro[160];
    if (near_one) snprintf(pro, sizeof pro, "const c float[] = 0.005\nconst one float[] = 1\nq = Mul(x, c)\ny = Add(q, one)\n");
    else snprintf(pro, sizeof pro, "const s float[%lld] = random\nq = Mul(x, s)\ny = Add(q, x)\n", (long long)K);
    if (!strcmp(op, "RMSNormalization"))
        snprintf(text, len,
                 "opset 23\ninput x0 %s[%lld, %lld]\nx = Cast(x0) {to=1}\n%sconst g float[%lld] = random\n"
                 "r = RMSNormalization(y, g) {axis=-1}\nz = Relu(r)\no = Cast(z) {to=%s}\noutput o\n",
                 dt, (long long)rows, (long long)K, pro, (long long)K, dt[0] == 'b' ? "16" : dt[5] == '1' ? "10" : "1");
    else if (!strcmp(op, "LayerNormalization"))
        snprintf(text, len,
                 "opset 18\ninput x0 %s[%lld, %lld]\nx = Cast(x0) {to=1}\n%sconst g float[%lld] = random\n"
                 "const b float[%lld] = random\nr = LayerNormalization(y, g, b) {axis=-1}\nz = Relu(r)\n"
                 "o = Cast(z) {to=%s}\noutput o\n",
                 dt, (long long)rows, (long long)K, pro, (long long)K, (long long)K, dt[0] == 'b' ? "16" : dt[5] == '1' ? "10" : "1");
    else if (!strncmp(op, "Reduce", 6))
        snprintf(text, len,
                 "opset 18\ninput x0 %s[%lld, %lld]\nx = Cast(x0) {to=1}\n%sconst a int64[1] = 1\nr = %s(y, a) {keepdims=1}\n"
                 "const b float[%lld, 1] = random\nz = Add(r, b)\no = Cast(z) {to=%s}\noutput o\n",
                 dt, (long long)rows, (long long)K, pro, op, (long long)rows, dt[0] == 'b' ? "16" : dt[5] == '1' ? "10" : "1");
    else
        snprintf(text, len,
                 "opset 18\ninput x0 %s[%lld, %lld]\nx = Cast(x0) {to=1}\n%sr = %s(y) {axis=-1}\nz = Mul(r, x)\n"
                 "o = Cast(z) {to=%s}\noutput o\n",
                 dt, (long long)rows, (long long)K, pro, op, dt[0] == 'b' ? "16" : dt[5] == '1' ? "10" : "1");
}

static const char *const KINDS[] = {"ReduceSum",       "ReduceMean",      "ReduceMax",  "ReduceMin",
                                    "ReduceProd",      "ReduceL1",        "ReduceL2",   "ReduceLogSum",
                                    "ReduceLogSumExp", "ReduceSumSquare", "Softmax",    "LogSoftmax",
                                    "LayerNormalization", "RMSNormalization"};
#define NKINDS (sizeof KINDS / sizeof *KINDS)

/* Every kind over row lengths from 2 to 1024 (odd ones, powers of two and
 * one past), row counts that leave the last work-group partly empty. */
Test(rows, every_kind_short_and_medium_rows_fp32) {
    cgu_need_opencl();
    static const int64_t Ks[] = {2, 31, 32, 33, 64, 77, 128, 129, 255, 300, 513, 1024};
    static const int64_t Rs[] = {1, 3, 7, 13, 50};
    size_t c = 0;
    for (size_t kind = 0; kind < NKINDS; kind++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki += 2, c++) {
            /* alternate between odd and even K per kind so all 12 lengths are
             * covered by the 13 kinds, with different row counts */
            int64_t K = Ks[(ki + kind) % (sizeof Ks / sizeof *Ks)], R = Rs[c % (sizeof Rs / sizeof *Rs)];
            char text[1024];
            reduction_text(text, sizeof text, KINDS[kind], "float", R, K);
            uint32_t block;
            check_graph(text, false, &block);
            if (K >= 8) cr_assert_gt(block, 0, "%s rows of %lld: no work-group reduce", KINDS[kind], (long long)K);
        }
    /* rows of 8..31 (segments of 4..16 lanes), every kind, in the three
     * real dtypes, row counts that leave the last work-group partly empty */
    static const int64_t shortK[] = {8, 13, 16, 24, 31};
    static const char *const dts[] = {"float", "float16", "bfloat16"};
    for (size_t kind = 0; kind < NKINDS; kind++) {
        int64_t K = shortK[kind % (sizeof shortK / sizeof *shortK)], R = 1 + 11 * (int64_t)kind;
        char text[1024];
        reduction_text(text, sizeof text, KINDS[kind], dts[kind % 3], R, K);
        uint32_t block;
        check_graph(text, false, &block);
        cr_assert_gt(block, 0, "%s rows of %lld: no segmented reduce", KINDS[kind], (long long)K);
    }
    /* many rows: more work-items than the OpenCL launcher's cap, so the row
     * loop strides (Softmax over 48 with a residual epilogue; LayerNorm
     * over 64 of bf16 values) */
    check_graph("opset 13\ninput x float[3001, 48]\ny = Softmax(x)\nz = Add(y, x)\noutput z\n", false, NULL);
    check_graph("opset 18\ninput x bfloat16[2500, 64]\nconst g bfloat16[64] = random\n"
                "y = LayerNormalization(x, g) {axis=-1}\noutput y\n",
                false, NULL);
    /* rows of one element */
    for (size_t kind = 0; kind < NKINDS; kind += 3) {
        char text[1024];
        reduction_text(text, sizeof text, KINDS[kind], "float", 41, 1);
        check_graph(text, false, NULL);
    }
}

Test(rows, fp16_and_bf16_rows) {
    cgu_need_opencl();
    static const int64_t Ks[] = {5, 40, 64, 200, 768};
    for (int half = 0; half < 2; half++)
        for (size_t kind = 0; kind < NKINDS; kind++) {
            int64_t K = Ks[kind % (sizeof Ks / sizeof *Ks)];
            char text[1024];
            reduction_text(text, sizeof text, KINDS[kind], half ? "float16" : "bfloat16", 6 + (int64_t)kind, K);
            check_graph(text, false, NULL);
        }
    /* a reduction whose input and output are bf16 values (no Cast): the
     * statistics in float, the output rounded to bf16 */
    check_graph("opset 13\ninput x bfloat16[9, 96]\ny = Softmax(x)\noutput y\n", false, NULL);
    check_graph("opset 18\ninput x bfloat16[9, 45]\nconst a int64[1] = 1\ny = ReduceMean(x, a)\noutput y\n", false,
                NULL);
}

/* The rule the comment in codegen.c states: segments of the smallest power
 * of two >= K / 4 in [32, 256]; work-group = segment x rows, at most 256. */
Test(rows, segment_and_block_rule) {
    static const struct {
        int64_t R, K;
        uint32_t block;
        int64_t numel;
        const char *seg;
    } cases[] = {
        /* a group holds more rows only while the grid keeps 264 groups
         * (KF_ROW_FILL_GROUPS): 100 rows of 32+ take 100 groups of one row */
        {100, 64, 32, 100 * 32, "< 32 ?"},
        {100, 128, 32, 100 * 32, "< 32 ?"},   /* K / 4 = 32: 32 steps of 4 held in registers */
        {100, 129, 64, 100 * 64, "< 64 ?"},   /* one past: 64 lanes, no vector steps */
        /* BERT's hidden width: 192 steps of 4 held in registers (KF_CG_ROW_CACHE),
         * segments of 64 lanes with 3 steps each */
        {3, 768, 64, 3 * 64, "< 64 ?"},
        {128, 768, 64, 128 * 64, "< 64 ?"},   /* BERT-base at batch 1: 128 groups, not 32 */
        {32768, 1024, 256, 8192 * 256, "< 64 ?"}, /* many rows: 4 per group of 256 */
        {2, 100, 32, 64, "< 32 ?"},           /* two rows: two warps */
        {1, 5000, 256, 256, "kf_seg = KF_LOCAL_SIZE;"}, /* one long row */
        /* rows of 8..31: segments under a warp, T = max(4, pow2 >= K / 4) */
        {100, 8, 32, 13 * 32, "< 4 ?"},       /* 8 rows per warp */
        {8192, 16, 64, 512 * 64, "< 4 ?"},    /* Softmax over 16 keys: 4 lanes, 16 rows per group, 512 groups */
        {100, 31, 32, 25 * 32, "< 8 ?"},      /* 4 rows per warp */
        {100, 17, 32, 25 * 32, "< 8 ?"},      /* K / 4 just over 4 */
        {3, 16, 32, 32, "< 4 ?"},             /* few rows: still a whole warp */
        {100, 7, 0, 100, NULL},               /* under 8: one work-item per row */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[256];
        snprintf(text, sizeof text, "opset 13\ninput x float[%lld, %lld]\ny = Softmax(x)\noutput y\n",
                 (long long)cases[i].R, (long long)cases[i].K);
        kf_model *m = gt_parse(text);
        kf_plan *p = cgu_plan(m);
        kf_cg_kernel k;
        uint32_t g = p->group_of[m->graph->values[kf_graph_find(m->graph, "y")].producer];
        cr_assert_eq(kf_cg_group(m, p, g, &k), KF_OK, "%s", kf_last_error());
        cr_assert_eq(k.block, cases[i].block, "[%lld, %lld]: block %u", (long long)cases[i].R, (long long)cases[i].K,
                     k.block);
        cr_assert_eq(k.numel, cases[i].numel, "[%lld, %lld]: numel %lld", (long long)cases[i].R,
                     (long long)cases[i].K, (long long)k.numel);
        if (cases[i].seg) {
            cr_assert_not_null(strstr(k.body, cases[i].seg), "%s", k.body);
            cr_assert_not_null(strstr(k.body, "kf_seg_max("), "%s", k.body);
        } else
            cr_assert_null(strstr(k.body, "kf_seg_max("), "%s", k.body);
        kf_cg_kernel_release(&k);
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* pre followed by body, in kf_malloc'd memory (asserted non-NULL). */
static char *with_prefix(const char *pre, const char *body) {
    size_t a = strlen(pre), b = strlen(body);
    char *t = kf_malloc(a + b + 1);
    cr_assert_not_null(t);
    memcpy(t, pre, a);
    memcpy(t + a, body, b + 1);
    return t;
}

/* kf_cg_kernel.block is only a preference: the same kernel run with other
 * work-group sizes (odd, smaller than a segment, not a multiple of it,
 * larger than preferred, left to the OpenCL runtime) and with too few
 * work-groups (the row loop strides) gives the same results; a kernel that
 * holds its rows in registers (min_block) runs with any size from its
 * segment up and refuses smaller ones. */
Test(rows, any_work_group_size) {
    cgu_need_opencl();
    static const char *const graphs[] = {
        "opset 17\ninput x float[37, 200]\nconst g float[200] = random\n"
        "y = LayerNormalization(x, g) {axis=-1}\nz = Tanh(y)\noutput z\n",
        "opset 13\ninput x float[23, 45]\ny = LogSoftmax(x)\noutput y\n",
        "opset 18\ninput x float[19, 64]\nconst a int64[1] = 1\nr = ReduceMax(x, a)\nz = Neg(r)\noutput z\noutput r\n",
        "opset 13\ninput x float[11, 33, 3]\ny = Softmax(x) {axis=1}\noutput y\n",
        /* rows of 8..31 (odd K): segments of 8 and 4 lanes, under a warp */
        "opset 17\ninput x float[53, 23]\nconst g float[23] = random\nconst b float[23] = random\n"
        "y = LayerNormalization(x, g, b) {axis=-1}\nz = Sigmoid(y)\noutput z\n",
        "opset 13\ninput x float[41, 13]\ny = Softmax(x)\noutput y\n",
        "opset 18\ninput x float[29, 9, 2]\nconst a int64[1] = 1\nr = ReduceSum(x, a) {keepdims=0}\noutput r\n",
        /* rows long enough for a whole work-group each (kf_seg = KF_LOCAL_SIZE) */
        "opset 17\ninput x float[5, 777]\nconst g float[777] = random\n"
        "y = LayerNormalization(x, g) {axis=-1}\noutput y\n",
    };
    static const struct {
        uint32_t block;
        int64_t numel;
    } launches[] = {{1, 7}, {3, 300}, {32, 32}, {96, 960}, {100, 100}, {512, 4096}, {1024, 1024}, {0, 1000}};
    for (size_t gi = 0; gi < sizeof graphs / sizeof *graphs; gi++) {
        kf_model *m = gt_parse(graphs[gi]);
        kf_plan *p = cgu_plan(m);
        cgu_refvals r = cgu_reference(m);
        uint32_t n = 0;
        for (uint32_t g = 0; g < p->ngroups; g++) {
            if (p->groups[g].kind != KF_GROUP_REDUCTION) continue;
            kf_cg_kernel k;
            cr_assert_eq(kf_cg_group(m, p, g, &k), KF_OK, "%s", kf_last_error());
            cr_assert_gt(k.block, 0);
            run_and_compare(&k, &r, false, graphs[gi]);
            /* rows of 8..31: the OpenCL prelude runs one lane per row
             * (KF_SEG_NARROW 0); the same body with segments under a warp
             * (CUDA's choice) is run here too, through the local-memory tree */
            bool narrow = strstr(k.body, "KF_SEG_NARROW") != NULL;
            uint32_t block0 = k.block;
            int64_t numel0 = k.numel;
            for (int pass = 0; pass < (narrow ? 2 : 1); pass++) {
                if (pass) {
                    char *forced = with_prefix("#undef KF_SEG_NARROW\n#define KF_SEG_NARROW 1\n", k.body);
                    kf_free(k.body);
                    k.body = forced;
                    k.block = block0;
                    k.numel = numel0;
                    run_and_compare(&k, &r, false, graphs[gi]);
                }
                for (size_t l = 0; l < sizeof launches / sizeof *launches; l++) {
                    k.block = launches[l].block;
                    k.numel = launches[l].numel;
                    if (k.block < k.min_block) { /* a row held in registers: refused, never run wrong */
                        const kf_tensor *in[KF_CG_MAX_PARAMS];
                        for (uint32_t i = 0; i < k.nins; i++) in[i] = &r.t[k.ins[i].value];
                        kf_tensor out[KF_PLAN_MAX_OUTPUTS] = {0};
                        cr_assert_eq(kf_cl_run_kernel(&k, in, out), KF_ERR_INVALID_ARG, "block %u under %u", k.block,
                                     k.min_block);
                        cr_assert_not_null(strstr(kf_last_error(), "needs a work-group of at least"), "%s",
                                           kf_last_error());
                        continue;
                    }
                    run_and_compare(&k, &r, false, graphs[gi]);
                }
            }
            kf_cg_kernel_release(&k);
            n++;
        }
        cr_assert_geq(n, 1);
        cgu_refvals_free(&r);
        kf_plan_free(p);
        kf_model_free(m);
    }
}

/* ---- bfloat16 storage -------------------------------------------------- */

Test(rows, bf16_elementwise_and_data_movement) {
    cgu_need_opencl();
    /* arithmetic: computed in float, every bf16 value rounded as unfused */
    check_graph("opset 13\ninput x bfloat16[5, 37]\ninput y bfloat16[37]\na = Add(x, y)\ns = Sigmoid(a)\n"
                "m = Mul(s, x)\noutput m\noutput a\n",
                false, NULL);
    /* data movement of bf16 values: bit for bit */
    check_graph("opset 13\ninput x bfloat16[4, 6, 5]\nt = Transpose(x) {perm=[2,0,1]}\noutput t\n", true, NULL);
    check_graph("opset 13\ninput a bfloat16[2, 3, 4]\ninput b bfloat16[2, 5, 4]\nk = Concat(a, b) {axis=1}\n"
                "const sh int64[2] = 8 8\nr = Reshape(k, sh)\nt = Transpose(r)\noutput t\n",
                true, NULL);
    check_graph("opset 13\ninput x bfloat16[3, 7]\nconst st int64[1] = 1\nconst en int64[1] = 6\n"
                "const ax int64[1] = 1\ns = Slice(x, st, en, ax)\ninput i int64[4]\ng = Gather(s, i)\noutput g\n",
                true, NULL);
    /* Casts: to bf16 (rounding as graph/tensor.c, bit for bit), from bf16
     * (exact), bf16 -> float16 (one rounding), int -> bf16 */
    check_graph("opset 13\ninput x float[6, 33]\nb = Cast(x) {to=16}\noutput b\n", true, NULL);
    check_graph("opset 13\ninput x bfloat16[6, 33]\nf = Cast(x) {to=1}\nh = Cast(x) {to=10}\noutput f\noutput h\n",
                true, NULL);
    check_graph("opset 13\ninput i int64[4, 9]\nb = Cast(i) {to=16}\nc = Cast(b) {to=7}\noutput b\noutput c\n", true,
                NULL);
}

/* The Cast's rounding on the values where it matters: ties to even either
 * way, the largest float (rounds to infinity), infinities, NaN (stays a
 * quiet NaN), subnormals, negative zero, then random bit patterns. */
Test(rows, bf16_cast_rounding_bit_for_bit) {
    cgu_need_opencl();
    kf_model *m = gt_parse("opset 13\ninput x float[4096]\nb = Cast(x) {to=16}\noutput b\n");
    kf_plan *p = cgu_plan(m);
    kf_cg_kernel k;
    cr_assert_eq(kf_cg_group(m, p, p->group_of[m->graph->values[kf_graph_find(m->graph, "b")].producer], &k), KF_OK,
                 "%s", kf_last_error());
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT, 1, (int64_t[]){4096}), KF_OK);
    uint32_t *bits = x.data;
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu,
                                       0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u,
                                       0x807fffffu, 0x80000000u, 0x00000000u, 0x7f7f8000u};
    size_t ns = sizeof special / sizeof *special;
    for (size_t i = 0; i < 4096; i++)
        bits[i] = i < ns ? special[i] : (uint32_t)(tu_uniform(0, 4294967296.0));
    const kf_tensor *ins[1] = {&x};
    kf_tensor out[1] = {0};
    cr_assert_eq(kf_cl_run_kernel(&k, ins, out), KF_OK, "%s", kf_last_error());
    const uint16_t *got = out[0].data;
    for (size_t i = 0; i < 4096; i++) {
        float f;
        memcpy(&f, &bits[i], 4);
        cr_assert_eq(got[i], kf_float_to_bf16(f), "element %zu: bits %08x -> %04x, expected %04x", i, bits[i], got[i],
                     kf_float_to_bf16(f));
    }
    kf_tensor_release(&out[0]);
    kf_tensor_release(&x);
    kf_cg_kernel_release(&k);
    kf_plan_free(p);
    kf_model_free(m);
}

Test(rows, bf16_anchor_gemm) {
    cgu_need_opencl();
    /* K = 16: the bf16 tolerance holds for a 16-long dot product of values in [-2, 2) */
    check_graph("opset 13\ninput x bfloat16[9, 16]\nconst w bfloat16[16, 12] = random\nconst b bfloat16[12] = random\n"
                "y = MatMul(x, w)\nz = Add(y, b)\nr = Relu(z)\noutput r\n",
                false, NULL);
    /* a 3 x 3 convolution over 4 channels (36-long dot products of values in
     * [-2, 2): within the bf16 tolerance once the output is rounded to bf16) */
    check_graph("opset 13\ninput x bfloat16[1, 4, 7, 7]\nconst w bfloat16[8, 4, 3, 3] = random\n"
                "y = Conv(x, w) {pads=[1,1,1,1]}\nr = Relu(y)\noutput r\n",
                false, NULL);
}

/* ---- CUDA text of the new variants ------------------------------------- */

/* A row read once into registers whose input has no kernel expression
 * (an Elu before the reduction) declines with that reason; the statistics
 * passes once overwrote the failure and emitted folds over empty names
 * (random graph seed 8387941992, then a Mean, which has an expression now:
 * its sum over the operand count, checked on OpenCL here). */
Test(rows, a_cached_row_that_does_not_load_declines) {
    kf_model *m = gt_parse("opset 13\ninput x float[264]\nv = Elu(x)\ny = ReduceMax(v) {axes=[-1]}\noutput y\n");
    kf_plan *p = cgu_plan(m);
    cr_assert_eq(p->ngroups, 1);
    char why[512];
    const char *r = kf_cg_unsupported(m, p, 0, why, sizeof why);
    cr_assert_not_null(r, "generated a kernel for a row whose input has no expression");
    cr_expect(strstr(why, "Elu"), "%s", why);
    kf_plan_free(p);
    kf_model_free(m);
    check_graph("opset 13\ninput x float[264]\nconst c float[264] = random\ninput u float[264]\n"
                "v = Mean(c, x, u)\ny = ReduceMax(v) {axes=[-1]}\nw = Mean(x)\noutput y, w\n",
                false, NULL);
}

Test(rows, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    char ln[1024], prod[1024], sm[1024];
    reduction_text(ln, sizeof ln, "LayerNormalization", "bfloat16", 50, 64);
    reduction_text(prod, sizeof prod, "ReduceProd", "float16", 13, 300);
    reduction_text(sm, sizeof sm, "Softmax", "float", 100, 128);
    /* rows of 8..31: segments of 4 and 8 lanes (shuffles inside a warp) */
    char sm16[1024], ln24[1024], rms[1024];
    reduction_text(sm16, sizeof sm16, "Softmax", "float", 100, 16);
    reduction_text(ln24, sizeof ln24, "LayerNormalization", "float16", 50, 24);
    reduction_text(rms, sizeof rms, "RMSNormalization", "float16", 40, 2048);
    const char *graphs[] = {ln, prod, sm, sm16, ln24, rms,
                            "opset 13\ninput x bfloat16[5, 37]\ninput y bfloat16[37]\na = Add(x, y)\ns = Sigmoid(a)\n"
                            "t = Transpose(s)\nf = Cast(t) {to=10}\noutput f\n",
                            "opset 13\ninput x bfloat16[9, 16]\nconst w bfloat16[16, 12] = random\n"
                            "y = MatMul(x, w)\nr = Relu(y)\noutput r\n"};
    for (size_t gi = 0; gi < sizeof graphs / sizeof graphs[0]; gi++)
        cr_assert_gt(cgu_nvrtc_check_text(graphs[gi], 1u << KF_GROUP_ELEMWISE | 1u << KF_GROUP_REDUCTION |
                                                          1u << KF_GROUP_ANCHOR),
                     0);
}
