/*
 * test_cg_attention.c: attention as one streaming kernel
 * (codegen/cg_attention.c). Decomposed attention graphs (QK^T, scale, mask,
 * Softmax, xV) are planned into one group, generated, run on OpenCL (the
 * portable twin of the tensor-core template) and compared with the
 * reference evaluator over the unfused graph: causal, additive-mask and
 * unmasked cases, heads 1-16, head dims 32/64/128, sequences 1-2048,
 * float32/float16/bfloat16. The CUDA text (mma.sync for 16-bit tiles)
 * goes through NVRTC for sm_80 and sm_90 with 0 spills.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cg_util.h"
#include "graph_text.h"
#include "kf_kernels.h"

typedef enum { MASK_NONE, MASK_ADD, MASK_CAUSAL } mask_kind;

typedef struct att_case {
    int b, h, sq, sk, d, dv;
    mask_kind mask;
    const char *dt; /* "float", "float16", "bfloat16" */
} att_case;

/* The graph of c: q [b, h, sq, d], k [b, h, sk, d] (transposed inside the
 * group), v [b, h, sk, dv]; scores scaled by 1/sqrt(d); an additive mask
 * input [b, 1, 1, sk], or a causal mask built from Trilu of ones
 * (-10000 above the diagonal, offset so the last query sees every key). */
static void att_text(const att_case *c, char *text, size_t len) {
    int n = snprintf(text, len,
                     "opset 14\ninput q %s[%d, %d, %d, %d]\ninput k %s[%d, %d, %d, %d]\ninput v %s[%d, %d, %d, %d]\n"
                     "const s %s[] = %.9g\n"
                     "kt = Transpose(k) {perm=[0,1,3,2]}\nm = MatMul(q, kt)\nsc = Mul(m, s)\n",
                     c->dt, c->b, c->h, c->sq, c->d, c->dt, c->b, c->h, c->sk, c->d, c->dt, c->b, c->h, c->sk, c->dv,
                     c->dt, 1.0 / __builtin_sqrt((double)c->d));
    if (c->mask == MASK_ADD)
        n += snprintf(text + n, len - (size_t)n, "input mask %s[%d, 1, 1, %d]\na = Add(sc, mask)\n", c->dt, c->b, c->sk);
    else if (c->mask == MASK_CAUSAL)
        n += snprintf(text + n, len - (size_t)n,
                      "const ones %s[%d, %d] = 1\nconst big %s[] = -10000\nconst kd int64[] = %d\n"
                      "up = Trilu(ones, kd) {upper=1}\ncm = Mul(up, big)\na = Add(sc, cm)\n",
                      c->dt, c->sq, c->sk, c->dt, c->sk - c->sq + 1);
    else n += snprintf(text + n, len - (size_t)n, "a = Identity(sc)\n");
    snprintf(text + n, len - (size_t)n, "p = Softmax(a) {axis=-1}\no = MatMul(p, v)\noutput o\n");
}

typedef struct att_seen {
    uint32_t attention;
    char kind; /* the MMA form the kernel must use */
} att_seen;

static void seen_attention(const kf_plan *p, uint32_t gi, const kf_cg_kernel *k, void *ctx) {
    (void)p, (void)gi;
    att_seen *a = ctx;
    if (strcmp(k->name, "kf_attention")) return;
    a->attention++;
    char want[16];
    snprintf(want, sizeof want, "KF_MMA_%c(", a->kind);
    cr_expect_not_null(strstr(k->body, want), "%s", k->body);
}

static void run_case(const att_case *c) {
    char text[1024];
    att_text(c, text, sizeof text);
    bool bf = !strcmp(c->dt, "bfloat16"), half = !strcmp(c->dt, "float16");
    att_seen seen = {0, bf ? 'B' : half ? 'H' : 'F'};
    /* fp32: the reference's dot products of d terms then of sk terms;
     * 16-bit: DESIGN.md's tolerances (bfloat16 2e-2 / 1e-2) */
    cgu_run_opts o = {1u << KF_GROUP_ANCHOR, NULL, cgu_dot_atol(c->sk > c->d ? c->sk : c->d), 1e-4,
                      bf ? 2e-2 : 2.5e-3, bf ? 1e-2 : 1e-3, seen_attention, &seen};
    cr_assert_eq(cgu_run_groups(text, &o), 1, "%s", text);
    cr_assert_eq(seen.attention, 1, "one streaming attention kernel:\n%s", text);
}

Test(cg_attention, float32_masks_heads_and_head_dims) {
    cgu_need_opencl();
    const att_case cases[] = {
        {1, 1, 1, 1, 32, 32, MASK_NONE, "float"},     /* one query, one key */
        {2, 4, 19, 19, 64, 64, MASK_ADD, "float"},    /* off every tile size */
        {1, 16, 33, 33, 32, 32, MASK_CAUSAL, "float"},
        {1, 2, 128, 128, 128, 128, MASK_ADD, "float"}, /* head dim 128: 2 warps, keys 16 at a time */
        {1, 2, 40, 40, 64, 32, MASK_NONE, "float"},   /* value head size differs */
        {1, 3, 5, 300, 64, 64, MASK_ADD, "float"},    /* cross attention: 5 queries, 300 keys */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

Test(cg_attention, float16_and_bfloat16) {
    cgu_need_opencl();
    const att_case cases[] = {
        {1, 12, 128, 128, 64, 64, MASK_ADD, "float16"}, /* BERT-base's shape */
        {2, 3, 70, 70, 32, 32, MASK_CAUSAL, "float16"},
        {1, 2, 17, 17, 128, 128, MASK_NONE, "float16"},
        {1, 3, 70, 70, 64, 64, MASK_CAUSAL, "bfloat16"},
        {1, 2, 5, 300, 128, 128, MASK_NONE, "bfloat16"},
        {2, 1, 1, 9, 32, 32, MASK_ADD, "bfloat16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

/* 2048 keys: rows far longer than any on-chip row tile, streamed */
Test(cg_attention, long_sequence_causal, .timeout = 600) {
    cgu_need_opencl();
    const att_case cases[] = {
        {1, 1, 2048, 2048, 32, 32, MASK_CAUSAL, "float16"},
        {1, 1, 512, 2048, 64, 64, MASK_NONE, "float"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

Test(cg_attention, cuda_text_compiles_with_nvrtc_sm80_sm90) {
    const char *why = kf_nvrtc_unavailable();
    if (why) {
        cr_skip_test("NVRTC: %s", why);
        return;
    }
    const att_case cases[] = {
        {1, 12, 128, 128, 64, 64, MASK_ADD, "float16"},
        {1, 12, 128, 128, 64, 64, MASK_ADD, "bfloat16"},
        {1, 2, 128, 128, 128, 128, MASK_CAUSAL, "float16"},
        {1, 12, 128, 128, 64, 64, MASK_ADD, "float"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        att_text(&cases[i], text, sizeof text);
        cr_assert_eq(cgu_nvrtc_check_text(text, 1u << KF_GROUP_ANCHOR), 1, "%s", text);
    }
}
