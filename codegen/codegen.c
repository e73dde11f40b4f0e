/*
 * codegen.c: fusion group -> kernel text in the portable dialect. Sits after
 * the planner (fusion/) and before kernels/, which compiles the text with
 * NVRTC or OpenCL. Elementwise groups (with injective ops through index
 * maps) and row-reduction groups with fused prologue/epilogue; each value
 * one `const` line, from its op's cg_expr or a template here. Everything
 * else is declined with a reason naming the node (kf_cg_unsupported).
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_codegen.h"
#include "kf_cost.h"

/* ---- growable string ----------------------------------------------------- */

static bool reserve(kf_cg_str *s, size_t extra) {
    if (s->oom) return false;
    if (s->len + extra + 1 <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 256; /* 256: one kernel line or two; doubling keeps appends amortised O(1) */
    while (cap < s->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            s->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = kf_realloc(s->p, cap);
    if (!p) {
        s->oom = true;
        return false;
    }
    s->p = p;
    s->cap = cap;
    return true;
}

void kf_cg_puts(kf_cg_str *s, const char *text) {
    size_t n = strlen(text);
    if (!reserve(s, n)) return;
    memcpy(s->p + s->len, text, n + 1);
    s->len += n;
}

void kf_cg_printf(kf_cg_str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(s, (size_t)n)) {
        s->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

char *kf_cg_take(kf_cg_str *s) {
    if (s->oom) {
        kf_cg_str_release(s);
        return NULL;
    }
    char *p = s->p ? s->p : kf_strdup("");
    *s = (kf_cg_str){0};
    return p;
}

void kf_cg_str_release(kf_cg_str *s) {
    kf_free(s->p);
    *s = (kf_cg_str){0};
}

/* ---- the math table: the one place both preludes and the checker read ---- */

static const struct {
    const char *c99;  /* name in cg_expr; also the OpenCL builtin (overloaded on float) */
    const char *cuda; /* the float function of CUDA's device math library */
} k_math[] = {
    {"fabs", "fabsf"},   {"floor", "floorf"}, {"ceil", "ceilf"},   {"rint", "rintf"},
    {"sqrt", "sqrtf"},   {"exp", "expf"},     {"log", "logf"},     {"sin", "sinf"},
    {"cos", "cosf"},     {"tan", "tanf"},     {"asin", "asinf"},   {"acos", "acosf"},
    {"atan", "atanf"},   {"sinh", "sinhf"},   {"cosh", "coshf"},   {"tanh", "tanhf"},
    {"asinh", "asinhf"}, {"acosh", "acoshf"}, {"atanh", "atanhf"}, {"erf", "erff"},
    {"log1p", "log1pf"}, {"expm1", "expm1f"}, {"fmin", "fminf"},   {"fmax", "fmaxf"},
    {"pow", "powf"},     {"isnan", "isnan"},  {"isinf", "isinf"},
};
#define NMATH (sizeof k_math / sizeof k_math[0])

static int math_index(const char *name, size_t len) {
    for (size_t i = 0; i < NMATH; i++)
        if (strlen(k_math[i].c99) == len && !memcmp(k_math[i].c99, name, len)) return (int)i;
    return -1;
}

static void upper(kf_cg_str *s, const char *name) {
    char buf[32]; /* longest math name is 5 letters */
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof buf; i++) buf[i] = (char)toupper((unsigned char)name[i]);
    buf[i] = 0;
    kf_cg_puts(s, buf);
}

void kf_cg_prelude(kf_cg_target t, kf_cg_str *s) {
    if (t == KF_CG_CUDA) {
        kf_cg_puts(s, "/* kfuse prelude: CUDA (NVRTC) */\n"
                      "#define KF_KERNEL extern \"C\" __global__ void\n"
                      "#define KF_GLOBAL\n"
                      "#define KF_RESTRICT __restrict__\n"
                      "#define KF_GLOBAL_ID (blockIdx.x * blockDim.x + threadIdx.x)\n"
                      "#define KF_GLOBAL_SIZE (gridDim.x * blockDim.x)\n"
                      "typedef long long kf_i64;\n"
                      "#define KF_SHARED __shared__\n"
                      "#define KF_BARRIER __syncthreads()\n"
                      "#define KF_LOCAL_ID ((int)threadIdx.x)\n"
                      "#define KF_LOCAL_SIZE ((int)blockDim.x)\n"
                      "#define KF_MAX_BLOCK 1024\n" /* CUDA's threads per block */
                      /* segments under a warp for rows of 8..31 (KF_CG_SEGMENT):
                       * lanes are SIMT threads, so a segment's loads coalesce */
                      "#define KF_SEG_NARROW 1\n"
                      "#define KF_GROUP_ID blockIdx.x\n"
                      "#define KF_NUM_GROUPS gridDim.x\n"
                      "#define KF_INF __int_as_float(0x7f800000)\n"
                      /* float16 storage: PTX converts (NVRTC has no include path for cuda_fp16.h) */
                      "#define KF_HALF unsigned short\n"
                      "__device__ inline float kf_h2f(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
                      "__device__ inline unsigned short kf_f2h(float f) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
                      "#define KF_LOAD_HALF(p, i) kf_h2f((p)[i])\n"
                      "#define KF_STORE_HALF(p, i, v) ((p)[i] = kf_f2h(v))\n"
                      "#define KF_ROUND_HALF(x) kf_h2f(kf_f2h(x))\n"
                      /* bfloat16 storage: the upper 16 bits of a float; kf_f2bf rounds to
                       * nearest even and keeps a NaN quiet, as graph/tensor.c does */
                      "#define KF_BF16 unsigned short\n"
                      "__device__ inline float kf_bf2f(unsigned short b) { return __uint_as_float((unsigned)b << 16); }\n"
                      "__device__ inline unsigned short kf_f2bf(float f) { const unsigned u = __float_as_uint(f); "
                      "return (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u) "
                      ": (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
                      "#define KF_LOAD_BF16(p, i) kf_bf2f((p)[i])\n"
                      "#define KF_STORE_BF16(p, i, v) ((p)[i] = kf_f2bf(v))\n"
                      "#define KF_ROUND_BF16(x) kf_bf2f(kf_f2bf(x))\n"
                      /* 128-bit access: float4 of vector_types.h, which NVRTC always has */
                      "#define KF_F4 float4\n"
                      "#define KF_VLOAD4(p, q) (((const float4 *)(p))[q])\n"
                      "#define KF_VSTORE4(p, q, a, b, c, d) (((float4 *)(p))[q] = make_float4((a), (b), (c), (d)))\n"
                      /* 16-bit values 4 (64-bit) or 8 (128-bit) at a time: the raw words,
                       * value k of a step taken by KF_U16_k */
                      "#define KF_VH4 uint2\n"
                      "#define KF_VH8 uint4\n"
                      "#define KF_VB4 uint2\n"
                      "#define KF_VB8 uint4\n"
                      "#define KF_VLOAD_H4(p, q) (((const uint2 *)(p))[q])\n"
                      "#define KF_VLOAD_H8(p, q) (((const uint4 *)(p))[q])\n"
                      "#define KF_VLOAD_B4(p, q) (((const uint2 *)(p))[q])\n"
                      "#define KF_VLOAD_B8(p, q) (((const uint4 *)(p))[q])\n"
                      "#define KF_U16_0(u) ((unsigned short)(u).x)\n"
                      "#define KF_U16_1(u) ((unsigned short)((u).x >> 16))\n"
                      "#define KF_U16_2(u) ((unsigned short)(u).y)\n"
                      "#define KF_U16_3(u) ((unsigned short)((u).y >> 16))\n"
                      "#define KF_U16_4(u) ((unsigned short)(u).z)\n"
                      "#define KF_U16_5(u) ((unsigned short)((u).z >> 16))\n"
                      "#define KF_U16_6(u) ((unsigned short)(u).w)\n"
                      "#define KF_U16_7(u) ((unsigned short)((u).w >> 16))\n"
                      "#define KF_VH_AT(u, k) kf_h2f(KF_U16_##k(u))\n"
                      "#define KF_VB_AT(u, k) kf_bf2f(KF_U16_##k(u))\n"
                      "#define KF_PACK_H(a, b) ((unsigned)kf_f2h(a) | (unsigned)kf_f2h(b) << 16)\n"
                      "#define KF_PACK_B(a, b) ((unsigned)kf_f2bf(a) | (unsigned)kf_f2bf(b) << 16)\n"
                      "#define KF_VSTORE_H4(p, q, a, b, c, d) (((uint2 *)(p))[q] = make_uint2(KF_PACK_H(a, b), KF_PACK_H(c, d)))\n"
                      "#define KF_VSTORE_H8(p, q, a, b, c, d, e, f, g, h) (((uint4 *)(p))[q] = "
                      "make_uint4(KF_PACK_H(a, b), KF_PACK_H(c, d), KF_PACK_H(e, f), KF_PACK_H(g, h)))\n"
                      "#define KF_VSTORE_B4(p, q, a, b, c, d) (((uint2 *)(p))[q] = make_uint2(KF_PACK_B(a, b), KF_PACK_B(c, d)))\n"
                      "#define KF_VSTORE_B8(p, q, a, b, c, d, e, f, g, h) (((uint4 *)(p))[q] = "
                      "make_uint4(KF_PACK_B(a, b), KF_PACK_B(c, d), KF_PACK_B(e, f), KF_PACK_B(g, h)))\n"
                      /* block reduce: shuffles within each warp, then warp results through
                       * shared memory; every lane returns the block's result; n is a
                       * multiple of 32 (launches use whole warps) */
                      "#define KF_DEF_BLOCK(name, OP) \\\n"
                      "__device__ float name(float v, float *s, int n) { \\\n"
                      "    for (int o = 16; o > 0; o /= 2) v = OP(v, __shfl_xor_sync(0xffffffffu, v, o)); \\\n"
                      "    const int t = (int)threadIdx.x; \\\n"
                      "    __syncthreads(); \\\n"
                      "    if ((t & 31) == 0) s[t / 32] = v; \\\n"
                      "    __syncthreads(); \\\n"
                      "    v = s[0]; \\\n"
                      "    for (int w = 1; w < n / 32; w++) v = OP(v, s[w]); \\\n"
                      "    return v; \\\n"
                      "}\n"
                      /* segmented reduce: the block of n threads is cut into segments of seg
                       * consecutive threads (seg a power of two <= 32 or a multiple of 32;
                       * n a multiple of 32) and every lane returns its own segment's result;
                       * a segment of up to a warp is shuffles only (no barrier), a longer one
                       * sums its warps' results through shared memory */
                      /* tile products of the attention kernel (cg_attention.c): C[16][8] +=
                       * A[16][16] B[16][8], A row-major at A[ao + row * lda + k], B as its
                       * columns at B[bo + col * ldb + k]; lane l holds C rows l/4 and l/4 + 8,
                       * columns 2(l%4) and 2(l%4) + 1 in c[0..3] (PTX's m16n8k16 fragments).
                       * 16-bit data on tensor cores (mma.sync, sm_80+), float32 by FMAs. */
                      /* integer GEMM (cg_anchor.c): four signed 8-bit lanes of a and b
                       * multiplied and added to c (dp4a, sm_61+); KF_PACK4 packs the low
                       * bytes of four ints, the first lowest */
                      "__device__ inline int kf_dot4(int a, int b, int c) { int d; "
                      "asm(\"dp4a.s32.s32 %0, %1, %2, %3;\" : \"=r\"(d) : \"r\"(a), \"r\"(b), \"r\"(c)); return d; }\n"
                      "#define KF_DOT4(a, b, c) kf_dot4((a), (b), (c))\n"
                      "#define KF_PACK4(a, b, c, d) ((int)(((unsigned)(a) & 255u) | ((unsigned)(b) & 255u) << 8 | "
                      "((unsigned)(c) & 255u) << 16 | (unsigned)(d) << 24))\n"
                      "#define KF_UNROLL _Pragma(\"unroll\")\n"
                      "#define KF_SHALF unsigned short\n"
                      "#define KF_SLOAD_HALF(p, i) kf_h2f((p)[i])\n"
                      "#define KF_SSTORE_HALF(p, i, v) ((p)[i] = kf_f2h(v))\n"
                      "#define KF_ALIGN16 __attribute__((aligned(16)))\n"
                      "#define KF_MMA_F(c, A, ao, lda, B, bo, ldb, lane) { \\\n"
                      "    const int g_ = (lane) >> 2, t_ = ((lane) & 3) * 2; \\\n"
                      "    _Pragma(\"unroll\") for (int k_ = 0; k_ < 16; k_++) { \\\n"
                      "        const float a0_ = (A)[(ao) + g_ * (lda) + k_], a1_ = (A)[(ao) + (g_ + 8) * (lda) + k_]; \\\n"
                      "        const float b0_ = (B)[(bo) + t_ * (ldb) + k_], b1_ = (B)[(bo) + (t_ + 1) * (ldb) + k_]; \\\n"
                      "        (c)[0] += a0_ * b0_; (c)[1] += a0_ * b1_; (c)[2] += a1_ * b0_; (c)[3] += a1_ * b1_; \\\n"
                      "    } }\n"
                      "#define KF_MMA_16(TY, c, A, ao, lda, B, bo, ldb, lane) { \\\n"
                      "    const unsigned short *a_ = (A) + (ao) + ((lane) >> 2) * (lda) + ((lane) & 3) * 2; \\\n"
                      "    const unsigned short *b_ = (B) + (bo) + ((lane) >> 2) * (ldb) + ((lane) & 3) * 2; \\\n"
                      "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.\" TY \".\" TY \".f32 \" \\\n"
                      "                 \"{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" \\\n"
                      "                 : \"+f\"((c)[0]), \"+f\"((c)[1]), \"+f\"((c)[2]), \"+f\"((c)[3]) \\\n"
                      "                 : \"r\"(*(const unsigned *)a_), \"r\"(*(const unsigned *)(a_ + 8 * (lda))), \\\n"
                      "                   \"r\"(*(const unsigned *)(a_ + 8)), \"r\"(*(const unsigned *)(a_ + 8 * (lda) + 8)), \\\n"
                      "                   \"r\"(*(const unsigned *)b_), \"r\"(*(const unsigned *)(b_ + 8))); }\n"
                      "#define KF_MMA_H(c, A, ao, lda, B, bo, ldb, lane) KF_MMA_16(\"f16\", c, A, ao, lda, B, bo, ldb, lane)\n"
                      "#define KF_MMA_B(c, A, ao, lda, B, bo, ldb, lane) KF_MMA_16(\"bf16\", c, A, ao, lda, B, bo, ldb, lane)\n"
                      /* integer tile products (cg_anchor.c, gen_iconv): C[16][8] (int) +=
                       * A[16][32] B[32][8] of signed 8-bit values packed four k to a word
                       * (KF_PACK4), A's rows at A[ao + row * lda + word], B's columns at
                       * B[bo + col * ldb + word], 8 words per row or column; C's fragment
                       * as KF_MMA_F's. Tensor cores (mma.sync m16n8k32 s8, sm_80+):
                       * its A and B fragments hold the same bytes as m16n8k16's halves */
                      /* four 8-bit values as one word (4-byte aligned: buffers are 256-byte aligned) */
                      "#define KF_LOAD_W4(p, q) (((const int *)(p))[q])\n"
                      "#define KF_MMA_I8(c, A, ao, lda, B, bo, ldb, lane) { \\\n"
                      "    const int *a_ = (A) + (ao) + ((lane) >> 2) * (lda) + ((lane) & 3); \\\n"
                      "    const int *b_ = (B) + (bo) + ((lane) >> 2) * (ldb) + ((lane) & 3); \\\n"
                      "    asm volatile(\"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 \" \\\n"
                      "                 \"{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" \\\n"
                      "                 : \"+r\"((c)[0]), \"+r\"((c)[1]), \"+r\"((c)[2]), \"+r\"((c)[3]) \\\n"
                      "                 : \"r\"(a_[0]), \"r\"(a_[8 * (lda)]), \"r\"(a_[4]), \"r\"(a_[8 * (lda) + 4]), \\\n"
                      "                   \"r\"(b_[0]), \"r\"(b_[4])); }\n"
                      /* a statistic of the four lanes holding one row of a fragment */
                      "__device__ inline float kf_quad_max(float v) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); "
                      "return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2)); }\n"
                      "__device__ inline float kf_quad_sum(float v) { v += __shfl_xor_sync(0xffffffffu, v, 1); "
                      "return v + __shfl_xor_sync(0xffffffffu, v, 2); }\n"
                      "#define KF_QUAD_MAX(v, s) kf_quad_max(v)\n"
                      /* a bad index read from data (kf_cg_check): the first writes its code and value */
                      "__device__ inline void kf_index_fail(int *e, int code, long long v) { "
                      "if (atomicCAS(e, 0, code) == 0) { e[1] = (int)(unsigned)(v & 0xffffffffLL); e[2] = (int)(v >> 32); } }\n"
                      "#define KF_QUAD_SUM(v, s) kf_quad_sum(v)\n"
                      "#define KF_DEF_SEG(name, OP) \\\n"
                      "__device__ float name(float v, float *s, int seg, int n) { \\\n"
                      "    for (int o = (seg < 32 ? seg : 32) / 2; o > 0; o /= 2) v = OP(v, __shfl_xor_sync(0xffffffffu, v, o)); \\\n"
                      "    if (seg <= 32) return v; \\\n"
                      "    const int t = (int)threadIdx.x; \\\n"
                      "    __syncthreads(); \\\n"
                      "    if ((t & 31) == 0) s[t / 32] = v; \\\n"
                      "    __syncthreads(); \\\n"
                      "    const int w0 = t / seg * (seg / 32); \\\n"
                      "    v = s[w0]; \\\n"
                      "    for (int w = 1; w < seg / 32 && w0 + w < n / 32; w++) v = OP(v, s[w0 + w]); \\\n"
                      "    return v; \\\n"
                      "}\n");
    } else {
        kf_cg_puts(s, "/* kfuse prelude: OpenCL C 1.2 */\n"
                      "#define KF_KERNEL __kernel void\n"
                      "#define KF_GLOBAL __global\n"
                      "#define KF_RESTRICT restrict\n"
                      "#define KF_GLOBAL_ID get_global_id(0)\n"
                      "#define KF_GLOBAL_SIZE get_global_size(0)\n"
                      "typedef long kf_i64;\n"
                      "#define KF_SHARED __local\n"
                      "#define KF_BARRIER barrier(CLK_LOCAL_MEM_FENCE)\n"
                      "#define KF_LOCAL_ID ((int)get_local_id(0))\n"
                      "#define KF_LOCAL_SIZE ((int)get_local_size(0))\n"
                      /* 4096: the largest work-group PoCL's CPU device forms when the
                       * launcher leaves the size to it; 16 KiB, half of OpenCL's
                       * guaranteed local memory */
                      "#define KF_MAX_BLOCK 4096\n"
                      /* no segments under a warp (KF_CG_SEGMENT): on PoCL's CPU device a
                       * work-group's lanes are iterations of one loop per barrier region,
                       * so a narrow segment coalesces nothing and its barriers split the
                       * loop (LayerNorm over 24: 5x slower, bench/kernel_ab); rows of
                       * 8..31 run one lane per row (kf_seg 1, no barrier) instead */
                      "#define KF_SEG_NARROW 0\n"
                      "#define KF_GROUP_ID get_group_id(0)\n"
                      "#define KF_NUM_GROUPS get_num_groups(0)\n"
                      "#define KF_INF INFINITY\n"
                      /* float16 storage: loads by vload_half (no cl_khr_fp16 needed);
                       * stores and roundings by integer operations, round to nearest
                       * even with the spec's overflow to infinity and NaN kept quiet.
                       * Not vstore_half_rte: PoCL 3.1 (Debian 12) dropped a whole
                       * store block of a kf_gemm_rows kernel that used it
                       * (random_regress/fp16_gemm_rows_with_transposed_outputs_on_opencl).
                       * Both functions gave the bits of vstore_half_rte on all 2^32
                       * float patterns when written. */
                      "#define KF_HALF half\n"
                      "#define KF_LOAD_HALF(p, i) vload_half((i), (p))\n"
                      "ushort kf_f2h(float x) { const uint u = as_uint(x), a = u & 0x7fffffffu, s = (u >> 16) & 0x8000u; "
                      "if (a > 0x7f800000u) return (ushort)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); "
                      "if (a >= 0x477ff000u) return (ushort)(s | 0x7c00u); "
                      "if (a < 0x38800000u) return (ushort)(s | (uint)rint(as_float(a) * 16777216.0f)); "
                      "return (ushort)(s | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - 0x1c000u)); }\n"
                      "float kf_round_half(float x) { const uint u = as_uint(x), a = u & 0x7fffffffu, s = u & 0x80000000u; "
                      "if (a >= 0x7f800000u) return x; "
                      "if (a >= 0x477ff000u) return as_float(s | 0x7f800000u); "
                      "if (a < 0x38800000u) return rint(x * 16777216.0f) * 5.9604644775390625e-8f; "
                      "return as_float(s | ((a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u)); }\n"
                      "#define KF_STORE_HALF(p, i, v) (((__global ushort *)(p))[i] = kf_f2h(v))\n"
                      "#define KF_ROUND_HALF(x) kf_round_half(x)\n"
                      /* bfloat16 storage: bit operations, the same as the CUDA prelude's */
                      "#define KF_BF16 ushort\n"
                      "float kf_bf2f(ushort b) { return as_float((uint)b << 16); }\n"
                      "ushort kf_f2bf(float f) { const uint u = as_uint(f); "
                      "return (u & 0x7fffffffu) > 0x7f800000u ? (ushort)((u >> 16) | 0x40u) "
                      ": (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
                      "#define KF_LOAD_BF16(p, i) kf_bf2f((p)[i])\n"
                      "#define KF_STORE_BF16(p, i, v) ((p)[i] = kf_f2bf(v))\n"
                      "#define KF_ROUND_BF16(x) kf_bf2f(kf_f2bf(x))\n"
                      /* integer GEMM: the four lanes' products summed in int (the same
                       * function as dp4a) */
                      "int kf_dot4(int a, int b, int c) { const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b)); "
                      "return c + p.x + p.y + p.z + p.w; }\n"
                      "#define KF_DOT4(a, b, c) kf_dot4((a), (b), (c))\n"
                      "#define KF_PACK4(a, b, c, d) as_int(((uint)(a) & 255u) | ((uint)(b) & 255u) << 8 | "
                      "((uint)(c) & 255u) << 16 | (uint)(d) << 24)\n"
                      "#define KF_F4 float4\n"
                      "#define KF_VLOAD4(p, q) vload4((q), (p))\n"
                      "#define KF_VSTORE4(p, q, a, b, c, d) vstore4((float4)((a), (b), (c), (d)), (q), (p))\n"
                      /* 16-bit values 4 or 8 at a time: float16 converted by vload_half,
                       * bfloat16 as raw ushorts; value k of a step is component sk */
                      "#define KF_VH4 float4\n"
                      "#define KF_VH8 float8\n"
                      "#define KF_VB4 ushort4\n"
                      "#define KF_VB8 ushort8\n"
                      "#define KF_VLOAD_H4(p, q) vload_half4((q), (p))\n"
                      "#define KF_VLOAD_H8(p, q) vload_half8((q), (p))\n"
                      "#define KF_VLOAD_B4(p, q) vload4((q), (p))\n"
                      "#define KF_VLOAD_B8(p, q) vload8((q), (p))\n"
                      "#define KF_VH_AT(u, k) ((u).s##k)\n"
                      "#define KF_VB_AT(u, k) kf_bf2f((u).s##k)\n"
                      "#define KF_VSTORE_H4(p, q, a, b, c, d) "
                      "vstore4((ushort4)(kf_f2h(a), kf_f2h(b), kf_f2h(c), kf_f2h(d)), (q), (__global ushort *)(p))\n"
                      "#define KF_VSTORE_H8(p, q, a, b, c, d, e, f, g, h) "
                      "vstore8((ushort8)(kf_f2h(a), kf_f2h(b), kf_f2h(c), kf_f2h(d), kf_f2h(e), kf_f2h(f), kf_f2h(g), "
                      "kf_f2h(h)), (q), (__global ushort *)(p))\n"
                      "#define KF_VSTORE_B4(p, q, a, b, c, d) "
                      "vstore4((ushort4)(kf_f2bf(a), kf_f2bf(b), kf_f2bf(c), kf_f2bf(d)), (q), (p))\n"
                      "#define KF_VSTORE_B8(p, q, a, b, c, d, e, f, g, h) "
                      "vstore8((ushort8)(kf_f2bf(a), kf_f2bf(b), kf_f2bf(c), kf_f2bf(d), kf_f2bf(e), kf_f2bf(f), kf_f2bf(g), kf_f2bf(h)), (q), (p))\n"
                      /* block reduce: a tree in local memory over any group size n
                       * (folded to a power of two first); every lane returns the result */
                      "#define KF_DEF_BLOCK(name, OP) \\\n"
                      "float name(float v, __local float *s, int n) { \\\n"
                      "    const int t = (int)get_local_id(0); \\\n"
                      "    barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    s[t] = v; \\\n"
                      "    barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    int p = 1; \\\n"
                      "    while (p < n) p *= 2; \\\n"
                      "    for (int h = p / 2; h > 0; h /= 2) { \\\n"
                      "        if (t < h && t + h < n) s[t] = OP(s[t], s[t + h]); \\\n"
                      "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    } \\\n"
                      "    return s[0]; \\\n"
                      "}\n"
                      /* segmented reduce: segments of seg consecutive work-items (any seg;
                       * the last one may be cut short by n), a local-memory tree in each;
                       * every lane returns its own segment's result; seg is the same for
                       * the whole work-group, so seg 1 may skip the barriers */
                      /* tile products of the attention kernel: the portable twin of the
                       * CUDA prelude's (the same fragment ownership, each lane's four C
                       * elements by FMAs) */
                      "#define KF_UNROLL\n"
                      /* float16 in local memory: ushort words (a half array needs
                       * cl_khr_fp16), loaded through half pointers, stored as kf_f2h bits */
                      "#define KF_SHALF ushort\n"
                      "#define KF_SLOAD_HALF(p, i) vload_half((i), (__local const half *)(p))\n"
                      "#define KF_SSTORE_HALF(p, i, v) ((p)[i] = kf_f2h(v))\n"
                      "#define KF_ALIGN16 __attribute__((aligned(16)))\n"
                      "#define KF_MMA_X(LD, c, A, ao, lda, B, bo, ldb, lane) { \\\n"
                      "    const int g_ = (lane) >> 2, t_ = ((lane) & 3) * 2; \\\n"
                      "    for (int k_ = 0; k_ < 16; k_++) { \\\n"
                      "        const float a0_ = LD(A, (ao) + g_ * (lda) + k_), a1_ = LD(A, (ao) + (g_ + 8) * (lda) + k_); \\\n"
                      "        const float b0_ = LD(B, (bo) + t_ * (ldb) + k_), b1_ = LD(B, (bo) + (t_ + 1) * (ldb) + k_); \\\n"
                      "        (c)[0] += a0_ * b0_; (c)[1] += a0_ * b1_; (c)[2] += a1_ * b0_; (c)[3] += a1_ * b1_; \\\n"
                      "    } }\n"
                      "#define KF_LD_F(p, i) ((p)[i])\n"
                      "#define KF_MMA_F(c, A, ao, lda, B, bo, ldb, lane) KF_MMA_X(KF_LD_F, c, A, ao, lda, B, bo, ldb, lane)\n"
                      "#define KF_MMA_H(c, A, ao, lda, B, bo, ldb, lane) KF_MMA_X(KF_SLOAD_HALF, c, A, ao, lda, B, bo, ldb, lane)\n"
                      "#define KF_MMA_B(c, A, ao, lda, B, bo, ldb, lane) KF_MMA_X(KF_LOAD_BF16, c, A, ao, lda, B, bo, ldb, lane)\n"
                      /* integer tile products: the twin of the CUDA prelude's (each lane's
                       * four C elements by dot products of four 8-bit lanes; the sums are
                       * exact, so the result is the tensor cores' bit for bit) */
                      "#define KF_LOAD_W4(p, q) as_int(vload4((q), (const __global char *)(p)))\n"
                      "#define KF_MMA_I8(c, A, ao, lda, B, bo, ldb, lane) { \\\n"
                      "    const int g_ = (lane) >> 2, t_ = ((lane) & 3) * 2; \\\n"
                      "    for (int w_ = 0; w_ < 8; w_++) { \\\n"
                      "        const int a0_ = (A)[(ao) + g_ * (lda) + w_], a1_ = (A)[(ao) + (g_ + 8) * (lda) + w_]; \\\n"
                      "        const int b0_ = (B)[(bo) + t_ * (ldb) + w_], b1_ = (B)[(bo) + (t_ + 1) * (ldb) + w_]; \\\n"
                      "        (c)[0] = kf_dot4(a0_, b0_, (c)[0]); (c)[1] = kf_dot4(a0_, b1_, (c)[1]); \\\n"
                      "        (c)[2] = kf_dot4(a1_, b0_, (c)[2]); (c)[3] = kf_dot4(a1_, b1_, (c)[3]); \\\n"
                      "    } }\n"
                      /* a statistic of the four lanes holding one row: through local memory
                       * (every lane of the work-group calls it) */
                      "float kf_quad_max(float v, __local float *s) { const int t = (int)get_local_id(0); "
                      "barrier(CLK_LOCAL_MEM_FENCE); s[t] = v; barrier(CLK_LOCAL_MEM_FENCE); const int b = t & ~3; "
                      "return fmax(fmax(s[b], s[b + 1]), fmax(s[b + 2], s[b + 3])); }\n"
                      "float kf_quad_sum(float v, __local float *s) { const int t = (int)get_local_id(0); "
                      "barrier(CLK_LOCAL_MEM_FENCE); s[t] = v; barrier(CLK_LOCAL_MEM_FENCE); const int b = t & ~3; "
                      "return (s[b] + s[b + 1]) + (s[b + 2] + s[b + 3]); }\n"
                      "#define KF_QUAD_MAX(v, s) kf_quad_max((v), (s))\n"
                      "void kf_index_fail(__global int *e, int code, long v) { "
                      "if (atomic_cmpxchg((volatile __global int *)e, 0, code) == 0) { e[1] = (int)(v & 0xffffffffL); e[2] = (int)(v >> 32); } }\n"
                      "#define KF_QUAD_SUM(v, s) kf_quad_sum((v), (s))\n"
                      "#define KF_DEF_SEG(name, OP) \\\n"
                      "float name(float v, __local float *s, int seg, int n) { \\\n"
                      "    if (seg == 1) return v; \\\n"
                      "    const int t = (int)get_local_id(0); \\\n"
                      "    const int b = t - t % seg; \\\n"
                      "    barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    s[t] = v; \\\n"
                      "    barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    int p = 1; \\\n"
                      "    while (p < seg) p *= 2; \\\n"
                      "    for (int h = p / 2; h > 0; h /= 2) { \\\n"
                      "        if (t - b < h && t - b + h < seg && t + h < n) s[t] = OP(s[t], s[t + h]); \\\n"
                      "        barrier(CLK_LOCAL_MEM_FENCE); \\\n"
                      "    } \\\n"
                      "    return s[b]; \\\n"
                      "}\n");
    }
    for (size_t i = 0; i < NMATH; i++) {
        kf_cg_puts(s, "#define KF_");
        upper(s, k_math[i].c99);
        kf_cg_printf(s, " %s\n", t == KF_CG_CUDA ? k_math[i].cuda : k_math[i].c99);
    }
    kf_cg_puts(s, "#define KF_OP_SUM(a, b) ((a) + (b))\n"
                  "#define KF_OP_PROD(a, b) ((a) * (b))\n"
                  "KF_DEF_BLOCK(kf_block_sum, KF_OP_SUM)\n"
                  "KF_DEF_BLOCK(kf_block_prod, KF_OP_PROD)\n"
                  "KF_DEF_BLOCK(kf_block_max, KF_FMAX)\n"
                  "KF_DEF_BLOCK(kf_block_min, KF_FMIN)\n"
                  "KF_DEF_SEG(kf_seg_sum, KF_OP_SUM)\n"
                  "KF_DEF_SEG(kf_seg_prod, KF_OP_PROD)\n"
                  "KF_DEF_SEG(kf_seg_max, KF_FMAX)\n"
                  "KF_DEF_SEG(kf_seg_min, KF_FMIN)\n");
    kf_cg_puts(s, "\n");
}

/* ---- dtypes ------------------------------------------------------------------ */

/* A small float type generated kernels keep a byte a value (float8, and
 * float4 in the low four bits): the optional prelude part that holds its
 * conversions, the suffix of its macros (KF_LOAD_<sfx>, KF_STORE_<sfx>,
 * KF_ROUND_<sfx>) and its format argument. NULL for other types. */
typedef struct small_float {
    uint32_t part;
    const char *sfx, *fmt;
} small_float;

static const small_float *small_float_of(kf_dtype dt) {
    static const small_float e4m3fn = {KF_CG_PART_F8, "F8", "KF_E4M3FN"}, e4m3fnuz = {KF_CG_PART_F8, "F8", "KF_E4M3FNUZ"},
                             e5m2 = {KF_CG_PART_F8, "F8", "KF_E5M2"}, e5m2fnuz = {KF_CG_PART_F8, "F8", "KF_E5M2FNUZ"},
                             e2m1 = {KF_CG_PART_F4, "F4", "KF_E2M1"};
    switch (dt) {
    case KF_DT_FLOAT8E4M3FN: return &e4m3fn;
    case KF_DT_FLOAT8E4M3FNUZ: return &e4m3fnuz;
    case KF_DT_FLOAT8E5M2: return &e5m2;
    case KF_DT_FLOAT8E5M2FNUZ: return &e5m2fnuz;
    case KF_DT_FLOAT4E2M1: return &e2m1;
    default: return NULL;
    }
}

/* Storage types this slice reads and writes: float16 and bfloat16 are kept
 * as 16 bits in memory and computed in float (DESIGN numerics: the fp16 and
 * bf16 tolerances cover the unrounded intermediates), float8 is one byte
 * computed in float and rounded where the graph has a float8 value, bool
 * is one byte, integers compute as they are. */
static bool dtype_ok(kf_dtype dt) {
    return dt == KF_DT_FLOAT || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16 || dt == KF_DT_BOOL ||
           dt == KF_DT_INT32 || dt == KF_DT_INT64 || dt == KF_DT_INT16 || dt == KF_DT_UINT16 || dt == KF_DT_INT8 ||
           dt == KF_DT_UINT8 || dt == KF_DT_INT4 || dt == KF_DT_UINT4 || small_float_of(dt);
}
#define DTYPES_OK                                                                                                      \
    "float32, float16, bfloat16, the four float8 types, float4e2m1, int32, int64, int16, uint16, int8, uint8, int4, " \
    "uint4 and bool are generated"
static bool is_real(kf_dtype dt) { return dt == KF_DT_FLOAT || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16; }

/* The register type values of dt compute in. */
static const char *ctype(kf_dtype dt) {
    switch (dt) {
    case KF_DT_BOOL:
    case KF_DT_INT8:
    case KF_DT_UINT8:
    case KF_DT_INT4:
    case KF_DT_UINT4:
    case KF_DT_INT16: /* products of two fit */
    case KF_DT_INT32: return "int";
    case KF_DT_UINT16: /* 65535 * 65535 does not fit an int */
    case KF_DT_INT64: return "kf_i64";
    default: return "float";
    }
}

/* The element type of a buffer of dt. */
static const char *mtype(kf_dtype dt) {
    switch (dt) {
    case KF_DT_BOOL: return "unsigned char";
    case KF_DT_FLOAT16: return "KF_HALF";
    case KF_DT_BFLOAT16: return "KF_BF16";
    case KF_DT_INT8:
    case KF_DT_INT4: return "signed char"; /* a 4-bit value a byte, sign-extended (graph/dtype_small.c) */
    case KF_DT_UINT8:
    case KF_DT_UINT4: return "unsigned char";
    case KF_DT_INT16: return "short";
    case KF_DT_UINT16: return "unsigned short";
    case KF_DT_INT32: return "int";
    case KF_DT_INT64: return "kf_i64";
    default: return small_float_of(dt) ? "unsigned char" : "float";
    }
}

/* ---- checks --------------------------------------------------------------- */

static const char *kind_reason(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE:
    case KF_GROUP_REDUCTION:
    case KF_GROUP_ANCHOR:
    case KF_GROUP_OPAQUE: return NULL; /* a pooling node has a template; other opaque ops decline in gen_pool */
    case KF_GROUP_CONST: return "plan-time constant groups launch no kernel";
    }
    return "unknown group kind";
}

static bool same_dims(const kf_type *a, const kf_type *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

static int64_t numel_of(const kf_type *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dims[d];
    return n;
}

/* The expression template of node n (its cg_expr), or NULL with a reason. */
static const char *node_expr(const kf_node *n, char *why, size_t whylen) {
    const kf_op_info *oi = kf_op_get(n->op);
    if (!oi || !oi->cg_expr) {
        snprintf(why, whylen, "node '%s': op %s has no codegen expression or template yet", kf_node_label(n),
                 n->op_type);
        return NULL;
    }
    if (n->op == KF_OP_GELU && strcmp(kf_attr_s(n, "approximate", "none"), "none")) {
        /* 0.79788456...: sqrt(2 / pi), the reference's tanh form */
        if (!strcmp(kf_attr_s(n, "approximate", "none"), "tanh"))
            return "(0.5 * x0 * (1 + tanh(0.79788456080286535588 * (x0 + 0.044715 * x0 * x0 * x0))))";
        snprintf(why, whylen, "node '%s': Gelu approximate=\"%s\" is not generated", kf_node_label(n),
                 kf_attr_s(n, "approximate", "none"));
        return NULL;
    }
    if (n->op == KF_OP_CLIP && (n->nin < 3 || !n->in[1] || !n->in[2])) {
        snprintf(why, whylen, "node '%s': Clip without both bound inputs is not generated yet",
                 kf_node_label(n));
        return NULL;
    }
    for (int i = 0; i < n->nin; i++)
        if (!n->in[i]) {
            snprintf(why, whylen, "node '%s': absent optional input %d is not generated yet",
                     kf_node_label(n), i);
            return NULL;
        }
    return oi->cg_expr;
}

/* ---- generation: index maps ---------------------------------------------------
 *
 * The body is written by demand: each group output asks for its value at a
 * multi-index of its own shape, and every value asks its operands at the
 * index its op maps to (broadcast drops dims, Transpose permutes, Reshape
 * goes through the linear index, Slice scales and shifts, ...). A value
 * computed once at an index is remembered, so each is one `const` line. */

/* 24: "v" or "t" and two 32-bit numbers, or a 64-bit literal; every compound
 * index is bound to a temporary so components stay this short */
#define NAMELEN 24

typedef struct ix {
    int rank;
    char c[KF_MAX_RANK][NAMELEN]; /* identifier or non-negative literal per dim */
    char lin[NAMELEN];            /* row-major linear index when known, else "" */
} ix;

typedef struct memo {
    kf_id v;
    ix at;
    char name[NAMELEN];
} memo;

/* Steps of V elements (KF_CG_LANES): a kernel that walks its space V
 * elements at a time along the last axis declares lane l's index on that
 * axis as a name (lanes[l] = step * V + l) and shares the other axes'
 * names between the lanes. A group input read at a lane's index with that
 * lane's name on its own last axis and shared names (or constants)
 * elsewhere is contiguous over the step and starts at a multiple of V: it
 * is loaded once per step in 16-byte pieces (8 bytes for four 16-bit
 * values) and each lane takes its element; an output written at the
 * lanes' indices is stored the same way. Every other read is a scalar load
 * at the declared indices, so any op may sit in such a kernel. */
#define KF_CG_LANES_MAX 8
typedef struct vlanes {
    int V;                                 /* 4 or 8; 0: off */
    bool flat;                             /* steps over the flat space: lane names are linear indices */
    char step[NAMELEN];                    /* the step's index along the last axis, in steps */
    char lane[KF_CG_LANES_MAX][NAMELEN];   /* lane l's index along the last axis */
    int nshared;
    char shared[KF_MAX_RANK][NAMELEN];     /* the other axes' names (the same for every lane) */
} vlanes;

/* A row held on chip (KF_CG_ROW_CACHE): the reduction's input at every
 * element a lane owns, loaded once in steps of V (P steps per lane),
 * named x[i * V + l] for lane l of step i. */
typedef struct rowcache {
    int V, P;
    char x[KF_ROW_CACHE_MAX][NAMELEN];
    vlanes vl[KF_ROW_CACHE_MAX];       /* step i's lanes (only [0, P) used) */
    ix lanes[KF_ROW_CACHE_MAX][KF_CG_LANES_MAX];
} rowcache;

typedef enum rkind { RK_SUM, RK_MEAN, RK_MAX, RK_MIN, RK_PROD, RK_L1, RK_L2, RK_LOGSUM, RK_LOGSUMEXP,
                     RK_SUMSQ, RK_SOFTMAX, RK_LOGSOFTMAX, RK_LAYERNORM, RK_RMSNORM } rkind;

typedef struct gen {
    const kf_model *m;
    const kf_graph *g;
    const kf_plan *p;
    uint32_t gi;
    const kf_group *grp;
    kf_cg_kernel *k;
    const char *ity;     /* index type: "int" or "kf_i64" */
    kf_cg_str *s;        /* where lines go */
    const char *ind;     /* indentation of the current block */
    memo *memo;
    uint32_t nmemo, capmemo;
    kf_id *vals;         /* vals[n]: value shown as v<n> */
    uint32_t nvals;
    uint32_t *uses;      /* instances of v<n> written so far */
    int ntemp;
    vlanes vl;           /* steps of V elements along the space's last axis; V 0 when off */
    int nw;              /* vector temporaries w<n> written so far */
    /* reductions */
    const kf_node *red;  /* the reduction node; NULL in elementwise kernels */
    rkind rk;
    bool mask[KF_MAX_RANK]; /* reduced dims of red's input */
    char stat[2][NAMELEN];  /* row statistics (max and sum, or mean and 1/std) */
    bool stats;             /* stat[] hold the current row's figures */
    ix row;                 /* the current row's index into red's input (row dims only) */
    rowcache *rc;           /* the row on chip; NULL: passes over global memory */
    char *why;
    size_t whylen;
    bool oom;               /* failed for memory (KF_ERR_NOMEM), not unsupported */
    bool iacc;              /* an integer anchor (MatMulInteger, ConvInteger): int tiles and sums */
} gen;

static bool fail(gen *st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static bool fail(gen *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->why, st->whylen, fmt, ap);
    va_end(ap);
    return false;
}

static bool fail_oom(gen *st) {
    st->oom = true;
    return fail(st, "out of memory");
}

/* Writes a float literal that reads back to exactly f (9 significant digits
 * round-trip any float). False for non-finite values. */
static bool put_float(kf_cg_str *s, double f) {
    if (!isfinite(f)) return false;
    char buf[48];
    snprintf(buf, sizeof buf, "%.9g", (double)(float)f);
    kf_cg_puts(s, buf);
    if (!strpbrk(buf, ".e")) kf_cg_puts(s, ".0");
    kf_cg_puts(s, "f");
    return true;
}

/* Node n's epsilon attribute (default 1e-5) as a float literal into eps;
 * false (failed, eps "0.0f") when it is not finite or memory ran out. */
static bool epsilon_literal(gen *st, const kf_node *n, char *eps, size_t len) {
    kf_cg_str lit = {0};
    bool ok = put_float(&lit, kf_attr_f(n, "epsilon", 1e-5f));
    if (!ok) fail(st, "node '%s': epsilon is not finite", kf_node_label(n));
    else if (lit.oom || !lit.p) ok = fail_oom(st);
    snprintf(eps, len, "%s", ok ? lit.p : "0.0f");
    kf_cg_str_release(&lit);
    return ok;
}

/* Expands template e for node n with operand texts ops[0..nops). */
static bool expand(gen *st, kf_cg_str *s, const kf_node *n, const char *e, char ops[][NAMELEN], int nops) {
    for (const char *c = e; *c;) {
        if (isalpha((unsigned char)*c) || *c == '_') {
            const char *b = c;
            while (isalnum((unsigned char)*c) || *c == '_') c++;
            size_t len = (size_t)(c - b);
            if (b[0] == 'x' && len > 1 && isdigit((unsigned char)b[1])) {
                int k = atoi(b + 1);
                if (k >= nops) {
                    snprintf(st->why, st->whylen, "node '%s': cg_expr reads x%d of %d operands",
                             kf_node_label(n), k, nops);
                    return false;
                }
                kf_cg_puts(s, ops[k]);
                continue;
            }
            /* the casts of the integer templates (emit_expr) */
            if (*c == ')' && ((len == 3 && !memcmp(b, "int", 3)) || (len == 8 && !memcmp(b, "unsigned", 8)))) {
                kf_cg_printf(s, "%.*s", (int)len, b);
                continue;
            }
            int mi = math_index(b, len);
            if (mi < 0 || *c != '(') {
                snprintf(st->why, st->whylen, "node '%s': cg_expr of %s names '%.*s', not in the math table",
                         kf_node_label(n), n->op_type, (int)len, b);
                return false;
            }
            kf_cg_puts(s, "KF_");
            upper(s, k_math[mi].c99);
        } else if (isdigit((unsigned char)*c) || (*c == '.' && isdigit((unsigned char)c[1]))) {
            const char *b = c;
            bool real = false;
            while (isdigit((unsigned char)*c) || *c == '.') real |= *c++ == '.';
            if (*c == 'e' || *c == 'E') {
                real = true;
                c++;
                if (*c == '+' || *c == '-') c++;
                while (isdigit((unsigned char)*c)) c++;
            }
            kf_cg_printf(s, "%.*s%s", (int)(c - b), b, real ? "f" : "");
        } else if (*c == '{') {
            const char *b = ++c, *eq = NULL;
            while (*c && *c != '}') {
                if (*c == '=' && !eq) eq = c;
                c++;
            }
            if (!*c || !eq) {
                snprintf(st->why, st->whylen, "op %s: malformed {attr=default} in cg_expr", n->op_type);
                return false;
            }
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(eq - b), b);
            double def = strtod(eq + 1, NULL);
            if (!put_float(s, kf_attr_f(n, name, (float)def))) {
                snprintf(st->why, st->whylen, "node '%s': attribute %s is not finite", kf_node_label(n), name);
                return false;
            }
            c++;
        } else {
            char one[2] = {*c++, 0};
            kf_cg_puts(s, one);
        }
    }
    return true;
}


static int var_of(const gen *st, kf_id v) {
    for (uint32_t k = 0; k < st->nvals; k++)
        if (st->vals[k] == v) return (int)k;
    return -1;
}

/* A fresh name for one instance of value v: v<n>, then v<n>_1, ... */
static void value_name(gen *st, kf_id v, char *name) {
    int n = var_of(st, v);
    uint32_t u = n >= 0 ? st->uses[n]++ : 0;
    if (u == 0) snprintf(name, NAMELEN, "v%d", n);
    else snprintf(name, NAMELEN, "v%d_%u", n, u);
}

/* Binds index expression expr to a fresh temporary named into out; plain
 * identifiers and literals are used as they are. */
static void bind(gen *st, char *out, const char *expr) {
    bool plain = true;
    for (const char *c = expr; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_') plain = false;
    if (plain && strlen(expr) < NAMELEN) {
        snprintf(out, NAMELEN, "%s", expr);
        return;
    }
    snprintf(out, NAMELEN, "t%d", st->ntemp++);
    kf_cg_printf(st->s, "%sconst %s %s = %s;\n", st->ind, st->ity, out, expr);
}

static bool ix_eq(const ix *a, const ix *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (strcmp(a->c[d], b->c[d])) return false;
    return true;
}

static const char *memo_find(const gen *st, kf_id v, const ix *at) {
    for (uint32_t i = st->nmemo; i-- > 0;)
        if (st->memo[i].v == v && (ix_eq(&st->memo[i].at, at) ||
                                   (at->lin[0] && at->rank == st->memo[i].at.rank && !strcmp(at->lin, st->memo[i].at.lin))))
            return st->memo[i].name; /* the same linear index of one value is the same element */
    return NULL;
}

static bool memo_add(gen *st, kf_id v, const ix *at, const char *name) {
    if (st->nmemo == st->capmemo) {
        uint32_t cap = st->capmemo ? st->capmemo * 2 : 32; /* 32: a typical group's values, doubling after */
        memo *p = kf_realloc(st->memo, (size_t)cap * sizeof *p);
        if (!p) return fail_oom(st);
        st->memo = p;
        st->capmemo = cap;
    }
    memo *e = &st->memo[st->nmemo++];
    e->v = v;
    e->at = *at;
    snprintf(e->name, NAMELEN, "%s", name);
    return true;
}

/* Row-major offset of index at in a buffer of type t, bound to a name. */
static void offset_of(gen *st, const kf_type *t, const ix *at, char *out) {
    if (at->lin[0]) {
        snprintf(out, NAMELEN, "%s", at->lin);
        return;
    }
    kf_cg_str e = {0};
    int64_t stride = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        if (t->dims[d] != 1 && strcmp(at->c[d], "0")) {
            if (e.len) kf_cg_puts(&e, " + ");
            if (stride == 1) kf_cg_puts(&e, at->c[d]);
            else kf_cg_printf(&e, "%s * %lld", at->c[d], (long long)stride);
        }
        stride *= t->dims[d];
    }
    bind(st, out, e.p ? e.p : "0");
    if (e.oom) st->s->oom = true; /* the kernel text is incomplete: kf_cg_take reports it */
    kf_cg_str_release(&e);
}

/* Index of an operand of type in that broadcasts into a value of type out
 * (numpy rules: trailing dims align, dims of 1 read element 0). False, with
 * the reason naming node n, when in does not broadcast into out: a declared
 * type the graph could not check (a shape known only at run time) may
 * disagree with its operands (fuzz finding: an Expand to a lower rank). */
static bool bcast_ix(gen *st, const kf_node *n, const ix *at, const kf_type *out, const kf_type *in, ix *res) {
    int shift = out->rank - in->rank;
    bool fits = shift >= 0;
    for (int d = 0; fits && d < in->rank; d++) fits = in->dims[d] == 1 || in->dims[d] == out->dims[d + shift];
    if (!fits)
        return fail(st, "node '%s' (%s): an operand does not broadcast into the output (numpy rules)",
                    kf_node_label(n), n->op_type);
    res->rank = in->rank;
    for (int d = 0; d < in->rank; d++)
        snprintf(res->c[d], NAMELEN, "%s", in->dims[d] == 1 ? "0" : at->c[d + shift]);
    snprintf(res->lin, NAMELEN, "%s", same_dims(out, in) ? at->lin : "");
    return true;
}

/* Index into a value of type in with the same elements in the same row-major
 * order as a value of type out (Reshape and its family): through the linear
 * index, split by in's strides. */
static void reshape_ix(gen *st, const ix *at, const kf_type *out, const kf_type *in, ix *res) {
    char lin[NAMELEN];
    offset_of(st, out, at, lin);
    res->rank = in->rank;
    snprintf(res->lin, NAMELEN, "%s", lin);
    int first = -1;
    for (int d = 0; d < in->rank; d++)
        if (in->dims[d] != 1) {
            first = d;
            break;
        }
    int64_t stride = 1;
    for (int d = in->rank - 1; d >= 0; d--) {
        char e[96]; /* "(name / 20 digits) % 20 digits" */
        if (in->dims[d] == 1) snprintf(e, sizeof e, "0");
        else if (stride == 1 && d == first) snprintf(e, sizeof e, "%s", lin);
        else if (stride == 1) snprintf(e, sizeof e, "%s %% %lld", lin, (long long)in->dims[d]);
        else if (d == first) snprintf(e, sizeof e, "%s / %lld", lin, (long long)stride);
        else snprintf(e, sizeof e, "(%s / %lld) %% %lld", lin, (long long)stride, (long long)in->dims[d]);
        bind(st, res->c[d], e);
        stride *= in->dims[d];
    }
}

static int param_of(const gen *st, kf_id v) {
    for (uint32_t i = 0; i < st->k->nins; i++)
        if (st->k->ins[i].value == v) return (int)i;
    return -1;
}

/* A constant input's integers (an initializer), or false with a reason. */
static bool const_ints(gen *st, const kf_node *n, int slot, int64_t *vals, int *count, int cap) {
    kf_id v = slot < n->nin ? n->in[slot] : 0;
    const kf_tensor *t = v ? st->g->values[v].init : NULL;
    if (!t || !kf_dtype_is_int(t->dtype) || t->numel > cap)
        return fail(st, "node '%s': input %d of %s is not a small constant integer tensor", kf_node_label(n), slot,
                    n->op_type);
    for (int64_t i = 0; i < t->numel; i++) vals[i] = kf_get_i64(t, i);
    *count = (int)t->numel;
    return true;
}

static bool emit(gen *st, kf_id v, const ix *at, char *name);

/* Writes `const T name = rhs;` for value v (emit remembers it). */
static bool define(gen *st, kf_id v, char *name, const char *rhs) {
    value_name(st, v, name);
    kf_dtype dt = st->g->values[v].type.dtype;
    if (dt == KF_DT_FLOAT16) /* a float16 value holds what 16 bits hold, as unfused */
        kf_cg_printf(st->s, "%sconst float %s = KF_ROUND_HALF(%s);\n", st->ind, name, rhs);
    else if (dt == KF_DT_BFLOAT16) /* the same for bfloat16 */
        kf_cg_printf(st->s, "%sconst float %s = KF_ROUND_BF16(%s);\n", st->ind, name, rhs);
    else kf_cg_printf(st->s, "%sconst %s %s = %s;\n", st->ind, ctype(dt), name, rhs);
    return true;
}

/* Elementwise/broadcast node from its cg_expr. Variadic ops fold left
 * through temporaries, so every operand stays a plain name. */
static bool emit_expr(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    /* Mean: the operands' sum, folded as Sum's, over their count */
    const char *e = n->op == KF_OP_MEAN ? "(x0 + x1)" : node_expr(n, st->why, st->whylen);
    if (!e) return false;
    const kf_type *ot = &st->g->values[v].type;
    bool ints = !is_real(ot->dtype) && ot->dtype != KF_DT_BOOL;
    for (int i = 0; i < n->nin; i++) {
        kf_dtype dt = st->g->values[n->in[i]].type.dtype;
        if (!is_real(dt) && dt != KF_DT_BOOL) ints = true;
    }
    /* Max and Min of integers (a Relu moved onto quantised values is a Max
     * with the zero point): exact, no NaN to order */
    if (ints && (n->op == KF_OP_MAX || n->op == KF_OP_MIN)) {
        e = n->op == KF_OP_MAX ? "(x1 > x0 ? x1 : x0)" : "(x1 < x0 ? x1 : x0)";
        ints = false;
    }
    /* int32 sums, differences and products (an int8 product's zero-point
     * columns): wrapping like the reference, in unsigned arithmetic */
    if (ints && (n->op == KF_OP_ADD || n->op == KF_OP_SUB || n->op == KF_OP_MUL) && n->nin == 2 &&
        ot->dtype == KF_DT_INT32 && st->g->values[n->in[0]].type.dtype == KF_DT_INT32 &&
        st->g->values[n->in[1]].type.dtype == KF_DT_INT32) {
        e = n->op == KF_OP_ADD ? "((int)((unsigned)x0 + (unsigned)x1))"
            : n->op == KF_OP_SUB ? "((int)((unsigned)x0 - (unsigned)x1))"
                                 : "((int)((unsigned)x0 * (unsigned)x1))";
        ints = false;
    }
    if (ints && n->op != KF_OP_WHERE && n->op != KF_OP_EQUAL && n->op != KF_OP_LESS && n->op != KF_OP_GREATER &&
        n->op != KF_OP_LESS_OR_EQUAL && n->op != KF_OP_GREATER_OR_EQUAL)
        return fail(st, "node '%s': %s on integers is not generated (float templates)", kf_node_label(n),
                    n->op_type);
    if (n->op == KF_OP_WHERE && st->g->values[n->in[0]].type.dtype != KF_DT_BOOL)
        return fail(st, "node '%s': Where condition is not bool", kf_node_label(n));
    if (n->opset > 0 && n->opset < 7 && (n->op == KF_OP_PRELU || kf_attr_i(n, "broadcast", 0)))
        return fail(st, "node '%s': legacy broadcast (opset %lld < 7) is not generated", kf_node_label(n),
                    (long long)n->opset);
    for (int i = 0; i < n->nin; i++) {
        const kf_type *it = &st->g->values[n->in[i]].type;
        bool fits = it->rank <= ot->rank;
        for (int d = 0; fits && d < it->rank; d++)
            fits = it->dims[d] == 1 || it->dims[d] == ot->dims[d + ot->rank - it->rank];
        if (!fits)
            return fail(st, "node '%s': input %d does not broadcast into the output (numpy rules)", kf_node_label(n), i);
    }
    char (*ops)[NAMELEN] = kf_calloc((size_t)n->nin + 1, sizeof *ops);
    if (!ops) return fail_oom(st);
    bool ok = true;
    for (int i = 0; ok && i < n->nin; i++) {
        ix a;
        ok = bcast_ix(st, n, at, ot, &st->g->values[n->in[i]].type, &a) && emit(st, n->in[i], &a, ops[i]);
    }
    kf_cg_str rhs = {0};
    const kf_op_info *oi = kf_op_get(n->op);
    if (ok && (oi->in_max >= 0 || n->nin == 1)) {
        if (oi->in_max >= 0) ok = expand(st, &rhs, n, e, ops, n->nin);
        else kf_cg_puts(&rhs, ops[0]); /* variadic with one operand: identity */
    } else if (ok) {
        char pair[2][NAMELEN];
        snprintf(pair[0], NAMELEN, "%s", ops[0]);
        for (int i = 1; ok && i < n->nin; i++) {
            snprintf(pair[1], NAMELEN, "%s", ops[i]);
            if (i + 1 == n->nin) {
                ok = expand(st, &rhs, n, e, pair, 2);
                break;
            }
            kf_cg_str fold = {0};
            ok = expand(st, &fold, n, e, pair, 2);
            if (ok && fold.oom) ok = fail_oom(st); /* an empty expression would compile wrong */
            /* a fresh temporary: the same node may be emitted several times
             * in one scope (vector lanes, a prologue replayed per output) */
            snprintf(pair[0], NAMELEN, "t%d", st->ntemp++);
            if (ok)
                kf_cg_printf(st->s, "%sconst %s %s = %s;\n", st->ind, ctype(ot->dtype), pair[0], fold.p ? fold.p : "");
            kf_cg_str_release(&fold);
        }
    }
    if (ok && rhs.oom) ok = fail_oom(st); /* same: never define a value from a cut expression */
    if (ok && n->op == KF_OP_MEAN && n->nin > 1) {
        kf_cg_str mean = {0};
        kf_cg_printf(&mean, "(%s) / %d.0f", rhs.p ? rhs.p : "", n->nin);
        kf_cg_str_release(&rhs);
        rhs = mean;
        if (rhs.oom) ok = fail_oom(st);
    }
    if (ok) define(st, v, name, rhs.p ? rhs.p : "");
    kf_cg_str_release(&rhs);
    kf_free(ops);
    return ok;
}

/* Cast/CastLike between the storage types above. */
static bool emit_cast(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    char x[NAMELEN];
    kf_dtype to = st->g->values[v].type.dtype, from = st->g->values[n->in[0]].type.dtype;
    if ((to == KF_DT_INT8 || to == KF_DT_UINT8 || to == KF_DT_INT4 || to == KF_DT_UINT4 || to == KF_DT_INT16 ||
         to == KF_DT_UINT16) &&
        from != to && from != KF_DT_BOOL)
        return fail(st, "node '%s': Cast to %s from %s is not generated (out-of-range values would wrap)",
                    kf_node_label(n), kf_dtype_name(to), kf_dtype_name(from));
    const small_float *sf_to = small_float_of(to), *sf_from = small_float_of(from);
    if ((sf_to && !is_real(from) && !sf_from) || (sf_from && !is_real(to) && !sf_to))
        return fail(st, "node '%s': Cast to %s from %s is not generated (float8 and float4 convert from and to floats)",
                    kf_node_label(n), kf_dtype_name(to), kf_dtype_name(from));
    if (!emit(st, n->in[0], at, x)) return false;
    char rhs[96]; /* a cast of one name */
    if (sf_to) { /* rounded as stored (Cast's saturate: out-of-range to the largest value, else NaN/Inf; float4 always saturates) */
        snprintf(rhs, sizeof rhs, "KF_ROUND_%s(%s, %d, %s)", sf_to->sfx, x, kf_attr_i(n, "saturate", 1) != 0, sf_to->fmt);
        st->k->parts |= sf_to->part;
    } else if (to == KF_DT_BOOL) snprintf(rhs, sizeof rhs, "(%s != 0)", x);
    else snprintf(rhs, sizeof rhs, "(%s)%s", ctype(to), x);
    return define(st, v, name, rhs);
}

/* QuantizeLinear and DequantizeLinear in the forms the planner calls
 * elementwise (fusion/plan.c, qdq_elementwise): the scale and the zero
 * point are read at the element's index along `axis`, or at their only
 * element. Rounding as the reference evaluator's: DequantizeLinear is
 * (float)(q - z) * s, one rounding of an exact product; QuantizeLinear is
 * rint(x / s) + z in float32 (division correctly rounded: see the OpenCL
 * build options; CUDA's `/` is), saturated to the type (8 or 4 bits), NaN
 * to 0. With block_size, the parameters are read at the element's block
 * along axis (x's index there divided by the block) and its own index
 * elsewhere. Float8
 * has no zero point: DequantizeLinear is q * s, QuantizeLinear x / s
 * rounded to the format (saturating unless saturate=0). */
static bool emit_qdq(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    const kf_type *xt = &st->g->values[n->in[0]].type;
    char x[NAMELEN], par[2][NAMELEN] = {"", "0"};
    /* float8: no zero point (the reference ignores it); QuantizeLinear does not round to integers */
    const small_float *sf = small_float_of(n->op == KF_OP_DEQUANTIZE_LINEAR ? xt->dtype : st->g->values[v].type.dtype);
    if (sf && sf->part == KF_CG_PART_F4 && n->op == KF_OP_QUANTIZE_LINEAR && n->nin > 2 && n->in[2])
        return fail(st, "node '%s': QuantizeLinear to float4 with a zero point is not generated", kf_node_label(n));
    if (!emit(st, n->in[0], at, x)) return false;
    for (int slot = 1; slot < (sf ? 2 : 3) && slot < n->nin; slot++) {
        kf_id p = n->in[slot];
        if (!p) continue;
        const kf_type *pt = &st->g->values[p].type;
        ix pi = {.rank = pt->rank};
        for (int d = 0; d < pt->rank; d++) snprintf(pi.c[d], NAMELEN, "0");
        int64_t axis = kf_attr_i(n, "axis", 1), block = kf_attr_i(n, "block_size", 0);
        if (axis < 0) axis += xt->rank;
        if (numel_of(pt) != 1 && block > 0) { /* one value per block of `block` along axis (opset 21) */
            if (pt->rank != xt->rank || axis < 0 || axis >= xt->rank)
                return fail(st, "node '%s': %s block parameters are not of x's rank (not generated)", kf_node_label(n),
                            n->op_type);
            for (int d = 0; d < pt->rank; d++)
                if (pt->dims[d] != 1) snprintf(pi.c[d], NAMELEN, "%s", at->c[d]);
            if (pt->dims[axis] != 1) {
                snprintf(pi.c[axis], NAMELEN, "qb%d", st->ntemp++);
                kf_cg_printf(st->s, "%sconst %s %s = %s / %lld;\n", st->ind, st->ity, pi.c[axis], at->c[axis],
                             (long long)block);
            }
        } else if (numel_of(pt) != 1) {
            if (pt->rank != 1 || axis < 0 || axis >= xt->rank || pt->dims[0] != xt->dims[axis])
                return fail(st, "node '%s': %s parameters are neither per tensor nor along one axis (not generated)",
                            kf_node_label(n), n->op_type);
            snprintf(pi.c[0], NAMELEN, "%s", at->c[axis]);
        }
        if (!emit(st, p, &pi, par[slot - 1])) return false;
    }
    char rhs[192]; /* a few names and two bounds */
    if (sf) {
        if (n->op == KF_OP_DEQUANTIZE_LINEAR) snprintf(rhs, sizeof rhs, "%s * %s", x, par[0]);
        else
            snprintf(rhs, sizeof rhs, "KF_ROUND_%s(%s / %s, %d, %s)", sf->sfx, x, par[0], kf_attr_i(n, "saturate", 1) != 0,
                     sf->fmt);
        st->k->parts |= sf->part;
        return define(st, v, name, rhs);
    }
    if (n->op == KF_OP_DEQUANTIZE_LINEAR) {
        snprintf(rhs, sizeof rhs, "(float)(%s - %s) * %s", x, par[1], par[0]);
        return define(st, v, name, rhs);
    }
    kf_dtype qt = st->g->values[v].type.dtype;
    int lo = qt == KF_DT_UINT8 || qt == KF_DT_UINT4 || qt == KF_DT_UINT16 ? 0
             : qt == KF_DT_INT4                                          ? -8
             : qt == KF_DT_INT16                                         ? -32768
                                                                         : -128;
    int hi = qt == KF_DT_UINT8 ? 255 : qt == KF_DT_UINT4 ? 15 : qt == KF_DT_INT4 ? 7 : qt == KF_DT_INT16 ? 32767
             : qt == KF_DT_UINT16 ? 65535 : 127;
    char t[NAMELEN];
    snprintf(t, NAMELEN, "t%d", st->ntemp++);
    kf_cg_printf(st->s, "%sconst float %s = KF_RINT(%s / %s) + (float)%s;\n", st->ind, t, x, par[0], par[1]);
    snprintf(rhs, sizeof rhs, "(KF_ISNAN(%s) ? 0 : %s <= %d.0f ? %d : %s >= %d.0f ? %d : (int)%s)", t, t, lo, lo, t, hi, hi, t);
    return define(st, v, name, rhs);
}

static bool emit_transpose(gen *st, const kf_node *n, const ix *at, char *name) {
    const kf_type *it = &st->g->values[n->in[0]].type;
    int r = it->rank, cnt = 0;
    const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
    ix a = {.rank = r};
    bool seen[KF_MAX_RANK] = {0};
    for (int d = 0; d < r; d++) {
        int64_t pd = perm && cnt == r ? perm[d] : r - 1 - d;
        if (pd < 0 || pd >= r || seen[pd]) return fail(st, "node '%s': Transpose perm is not a permutation", kf_node_label(n));
        seen[pd] = true;
        snprintf(a.c[pd], NAMELEN, "%s", at->c[d]);
    }
    return emit(st, n->in[0], &a, name);
}

/* Slice with constant starts/axes/steps: in[axis] = start + out[axis] * step. */
static bool emit_slice(gen *st, const kf_node *n, const ix *at, char *name) {
    const kf_type *it = &st->g->values[n->in[0]].type;
    int r = it->rank;
    int64_t starts[KF_MAX_RANK], axes[KF_MAX_RANK], steps[KF_MAX_RANK];
    int ns = 0, na = 0, nst = 0;
    if (n->opset > 0 && n->opset < 10) {
        const int64_t *s = kf_attr_ints(n, "starts", &ns), *a = kf_attr_ints(n, "axes", &na);
        if (!s || ns > KF_MAX_RANK || na > KF_MAX_RANK) return fail(st, "node '%s': Slice without starts", kf_node_label(n));
        memcpy(starts, s, (size_t)ns * sizeof *s);
        if (a) memcpy(axes, a, (size_t)na * sizeof *a);
        else na = 0;
    } else {
        if (!const_ints(st, n, 1, starts, &ns, KF_MAX_RANK)) return false;
        if (n->nin > 3 && n->in[3] && !const_ints(st, n, 3, axes, &na, KF_MAX_RANK)) return false;
        if (n->nin > 4 && n->in[4] && !const_ints(st, n, 4, steps, &nst, KF_MAX_RANK)) return false;
    }
    if (!na) {
        na = ns;
        for (int k = 0; k < ns; k++) axes[k] = k;
    }
    if (na != ns || (nst && nst != ns)) return fail(st, "node '%s': Slice inputs disagree in length", kf_node_label(n));
    ix a = *at;
    a.lin[0] = 0;
    for (int k = 0; k < ns; k++) {
        int64_t ax = axes[k] < 0 ? axes[k] + r : axes[k];
        int64_t step = nst ? steps[k] : 1, dim = ax >= 0 && ax < r ? it->dims[ax] : 0, s = starts[k];
        if (ax < 0 || ax >= r || step == 0) return fail(st, "node '%s': Slice axis or step out of range", kf_node_label(n));
        if (s < 0) s += dim;
        if (step > 0) s = s < 0 ? 0 : s > dim ? dim : s;
        else s = s < 0 ? 0 : s > dim - 1 ? dim - 1 : s;
        char e[96]; /* "name * step + start" */
        if (!strcmp(at->c[ax], "0")) snprintf(e, sizeof e, "%lld", (long long)s);
        else if (step == 1 && s == 0) snprintf(e, sizeof e, "%s", at->c[ax]);
        else if (step == 1) snprintf(e, sizeof e, "%s + %lld", at->c[ax], (long long)s);
        else snprintf(e, sizeof e, "%s * %lld + %lld", at->c[ax], (long long)step, (long long)s);
        bind(st, a.c[ax], e);
    }
    return emit(st, n->in[0], &a, name);
}

/* Split output v: the input at the index shifted along axis by the sizes
 * of the outputs before v (every output is an index map of the input). */
static bool emit_split(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    const kf_type *it = &st->g->values[n->in[0]].type;
    int64_t axis = kf_attr_i(n, "axis", 0);
    if (axis < 0) axis += it->rank;
    if (axis < 0 || axis >= it->rank || at->rank != it->rank)
        return fail(st, "node '%s': Split axis out of range", kf_node_label(n));
    int64_t lo = 0;
    int j = 0;
    for (; j < n->nout && n->out[j] != v; j++) {
        if (!n->out[j]) return fail(st, "node '%s': Split output %d has no value, so its size is unknown", kf_node_label(n), j);
        lo += st->g->values[n->out[j]].type.dims[axis];
    }
    if (j == n->nout) return fail(st, "node '%s': Split output (internal)", kf_node_label(n));
    ix a = *at;
    a.lin[0] = 0;
    if (lo) {
        char e[64]; /* "name + number" */
        if (!strcmp(at->c[axis], "0")) snprintf(e, sizeof e, "%lld", (long long)lo);
        else snprintf(e, sizeof e, "%s + %lld", at->c[axis], (long long)lo);
        bind(st, a.c[axis], e);
    }
    return emit(st, n->in[0], &a, name);
}

/* Clamps index expression e into [0, dim) and binds it. */
static void clamp_bind(gen *st, char *out, const char *e, int64_t dim) {
    char t[NAMELEN];
    bind(st, t, e);
    char c[128]; /* two names and two numbers */
    snprintf(c, sizeof c, "(%s < 0 ? 0 : (%s > %lld ? %lld : %s))", t, t, (long long)(dim - 1), (long long)(dim - 1), t);
    bind(st, out, c);
}

/* Concat: every operand is read at a clamped index (never out of its
 * bounds), then the one whose range holds the index is selected. A 0-D
 * operand of a 1-D Concat (PyTorch 1.4's shape computations; the reference
 * evaluator reads it as a one-element vector, graph/ops_shape.c) is that
 * one element. The operands' lengths must add up to the output's, so the
 * selection always ends in an operand. */
static bool emit_concat(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    const kf_type *ot = &st->g->values[v].type;
    int r = ot->rank;
    int64_t axis = kf_attr_i(n, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return fail(st, "node '%s': Concat axis out of range", kf_node_label(n));
    int64_t total = 0;
    for (int i = 0; i < n->nin; i++) {
        const kf_type *it = &st->g->values[n->in[i]].type;
        bool scalar = it->rank == 0 && r == 1;
        if (!scalar && it->rank != r)
            return fail(st, "node '%s': Concat input %d has rank %d, the output %d", kf_node_label(n), i, it->rank, r);
        if (!kf_add_ok(total, scalar ? 1 : it->dims[axis], &total)) return fail(st, "node '%s': Concat size overflows", kf_node_label(n));
    }
    if (total != ot->dims[axis])
        return fail(st, "node '%s': Concat inputs add up to %lld along axis %lld, the output has %lld", kf_node_label(n),
                    (long long)total, (long long)axis, (long long)ot->dims[axis]);
    kf_cg_str sel = {0};
    int64_t off = 0;
    int open = 0;
    for (int i = 0; i < n->nin; i++) {
        const kf_type *it = &st->g->values[n->in[i]].type;
        bool scalar = it->rank == 0;
        int64_t dk = scalar ? 1 : it->dims[axis];
        if (dk == 0) continue;
        ix a = *at;
        a.lin[0] = 0;
        if (scalar) {
            a.rank = 0;
        } else {
            char e[96]; /* "name - offset" */
            snprintf(e, sizeof e, "%s - %lld", at->c[axis], (long long)off);
            if (!strcmp(at->c[axis], "0")) snprintf(e, sizeof e, "%s", "0");
            clamp_bind(st, a.c[axis], off ? e : at->c[axis], dk);
        }
        char x[NAMELEN];
        if (!emit(st, n->in[i], &a, x)) {
            kf_cg_str_release(&sel);
            return false;
        }
        off += dk;
        if (off < ot->dims[axis]) {
            kf_cg_printf(&sel, "(%s < %lld ? %s : ", at->c[axis], (long long)off, x);
            open++;
        } else kf_cg_puts(&sel, x);
    }
    for (int i = 0; i < open; i++) kf_cg_puts(&sel, ")");
    if (sel.oom) {
        kf_cg_str_release(&sel);
        return fail_oom(st);
    }
    bool ok = sel.p && define(st, v, name, sel.p);
    kf_cg_str_release(&sel);
    return ok || fail(st, "node '%s': Concat has no elements", kf_node_label(n));
}

/* The code of node n's index check in this kernel (kf_cg_check), added
 * on first use; -1 when out of memory. */
static int check_code(gen *st, const kf_node *n, int64_t dim) {
    kf_id id = (kf_id)(n - st->g->nodes);
    for (uint32_t i = 0; i < st->k->nchecks; i++)
        if (st->k->checks[i].node == id && st->k->checks[i].dim == dim) return (int)i + 1;
    kf_cg_check *c = kf_realloc(st->k->checks, (st->k->nchecks + 1) * sizeof *c);
    if (!c) return -1;
    st->k->checks = c;
    c[st->k->nchecks++] = (kf_cg_check){id, dim};
    return (int)st->k->nchecks;
}

/* Constant indices (input 1 of n, element i indexing a dimension of size
 * dims[i % k]) are checked now, as the reference reports a bad one: such a
 * group declines. True when in range or not constant. */
static bool const_indices_ok(gen *st, const kf_node *n, const int64_t *dims, int64_t k) {
    const kf_tensor *ci = st->g->values[n->in[1]].init;
    for (int64_t i = 0; ci && i < ci->numel; i++) {
        int64_t x = kf_get_i64(ci, i), dim = dims[i % k];
        if (x < -dim || x >= dim)
            return fail(st, "node '%s': index %lld is out of range for a dimension of size %lld", kf_node_label(n),
                        (long long)x, (long long)dim);
    }
    return true;
}

/* Data's coordinate from index element idx_at of index input ind (of a
 * dimension of size dim) into coord: a negative index counts from the end;
 * one read from data (not constant) is checked, the first bad one reported
 * through kf_err (kf_cg_check); then clamped, so loads stay in bounds. */
static bool index_coord(gen *st, const kf_node *n, kf_id ind, const ix *idx_at, int64_t dim, char *coord) {
    char idx[NAMELEN], e[128], t[NAMELEN]; /* a cast and a compare of one name */
    if (!emit(st, ind, idx_at, idx)) return false;
    snprintf(e, sizeof e, "(%s)(%s < 0 ? %s + %lld : %s)", st->ity, idx, idx, (long long)dim, idx);
    if (!st->g->values[ind].init && dim > 1) {
        int code = check_code(st, n, dim);
        if (code < 0) return fail_oom(st);
        bind(st, t, e);
        kf_cg_printf(st->s, "%sif (%s < 0 || %s >= %lld) kf_index_fail(kf_err, %d, (kf_i64)%s);\n", st->ind, t, t,
                     (long long)dim, code, idx);
        snprintf(e, sizeof e, "%s", t);
    }
    if (dim == 1) snprintf(coord, NAMELEN, "0");
    else clamp_bind(st, coord, e, dim);
    return true;
}

/* Gather along axis with a runtime or constant index tensor. A negative
 * index counts from the end; an index still out of range is clamped to the
 * nearest element (never a read out of bounds) and reported through
 * kf_err (kf_cg_check), so the run fails as the reference's does; constant
 * indices out of range decline the group (the reference reports them). */
static bool emit_gather(gen *st, const kf_node *n, const ix *at, char *name) {
    const kf_type *dt = &st->g->values[n->in[0]].type, *it = &st->g->values[n->in[1]].type;
    int r = dt->rank, q = it->rank;
    if (r < 1 || q < 0 || r + q - 1 > KF_MAX_RANK)
        return fail(st, "node '%s': %s of data rank %d and indices rank %d is not generated (unknown or too large)",
                    kf_node_label(n), n->op_type, r, q);
    int64_t axis = kf_attr_i(n, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return fail(st, "node '%s': Gather axis out of range", kf_node_label(n));
    if (it->dtype != KF_DT_INT32 && it->dtype != KF_DT_INT64)
        return fail(st, "node '%s': Gather indices are %s", kf_node_label(n), kf_dtype_name(it->dtype));
    ix ia = {.rank = q};
    for (int d = 0; d < q; d++) snprintf(ia.c[d], NAMELEN, "%s", at->c[axis + d]);
    int64_t dim = dt->dims[axis];
    if (!const_indices_ok(st, n, &dt->dims[axis], 1)) return false;
    ix a = {.rank = r};
    for (int d = 0; d < r; d++) {
        if (d < axis) snprintf(a.c[d], NAMELEN, "%s", at->c[d]);
        else if (d > axis) snprintf(a.c[d], NAMELEN, "%s", at->c[d + q - 1]);
    }
    return index_coord(st, n, n->in[1], &ia, dim, a.c[axis]) && emit(st, n->in[0], &a, name);
}

/* GatherND: the output's leading coordinates pick a row of index tuples;
 * tuple element j (negative counts from the end) is data's coordinate
 * batch_dims + j, the output's trailing coordinates the rest. Each element
 * is checked, clamped and reported as Gather's are. */
static bool emit_gathernd(gen *st, const kf_node *n, const ix *at, char *name) {
    const kf_type *dt = &st->g->values[n->in[0]].type, *it = &st->g->values[n->in[1]].type;
    int r = dt->rank, q = it->rank;
    if (r < 1 || q < 0 || r + q - 1 > KF_MAX_RANK)
        return fail(st, "node '%s': %s of data rank %d and indices rank %d is not generated (unknown or too large)",
                    kf_node_label(n), n->op_type, r, q);
    int64_t b = kf_attr_i(n, "batch_dims", 0);
    if (it->dtype != KF_DT_INT64) return fail(st, "node '%s': GatherND indices are %s", kf_node_label(n), kf_dtype_name(it->dtype));
    int64_t k = q >= 1 ? it->dims[q - 1] : -1;
    if (q < 1 || b < 0 || b >= q || k < 1 || b + k > r)
        return fail(st, "node '%s': GatherND shapes are not generated (batch_dims %lld, index tuples of %lld)",
                    kf_node_label(n), (long long)b, (long long)k);
    if (!const_indices_ok(st, n, &dt->dims[b], k)) return false;
    ix a = {.rank = r};
    for (int d = 0; d < b; d++) snprintf(a.c[d], NAMELEN, "%s", at->c[d]);
    for (int d = (int)(b + k); d < r; d++) snprintf(a.c[d], NAMELEN, "%s", at->c[q - 1 + d - b - k]);
    for (int64_t j = 0; j < k; j++) {
        int64_t dim = dt->dims[b + j];
        ix ia = {.rank = q};
        for (int d = 0; d < q - 1; d++) snprintf(ia.c[d], NAMELEN, "%s", at->c[d]);
        snprintf(ia.c[q - 1], NAMELEN, "%lld", (long long)j);
        if (!index_coord(st, n, n->in[1], &ia, dim, a.c[b + j])) return false;
    }
    return emit(st, n->in[0], &a, name);
}

/* RotaryEmbedding (opset 23): element d of a head is x[d] past the rotary
 * dim, else c x[d] - s x[d + half] in the first half of the pairs and
 * s x[d - half] + c x[d] in the second (pairs (2k, 2k + 1) when
 * interleaved), c and s the caches at the position and pair k. A position
 * id read from data is checked (0 <= p < the caches' positions; the first
 * bad one reported through kf_err, as the reference reports it) and
 * clamped, so loads stay in bounds; constant ones out of range decline. */
static bool emit_rotary(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    const kf_type *xt = &st->g->values[n->in[0]].type, *ct = &st->g->values[n->in[1]].type;
    int r = xt->rank;
    kf_id pos = n->nin > 3 ? n->in[3] : 0;
    int64_t H = r == 4 ? xt->dims[1] : kf_attr_i(n, "num_heads", 0);
    int64_t D = r == 4 ? xt->dims[3] : H > 0 ? xt->dims[r - 1] / H : 0;
    int64_t dim = kf_attr_i(n, "rotary_embedding_dim", 0);
    if (!dim) dim = D;
    if ((r != 3 && r != 4) || H <= 0 || D <= 0 || (r == 3 && xt->dims[2] != H * D) || dim < 2 || dim % 2 || dim > D ||
        ct->rank != (pos ? 2 : 3))
        return fail(st, "node '%s': RotaryEmbedding shapes are not generated", kf_node_label(n));
    int64_t half = dim / 2;
    bool il = kf_attr_i(n, "interleaved", 0) != 0;
    const char *b = at->c[0], *s = at->c[r == 4 ? 2 : 1];
    char d[NAMELEN], base[NAMELEN] = "0", e[256], k[NAMELEN], p[NAMELEN], first[NAMELEN];
    if (r == 4) snprintf(d, sizeof d, "%s", at->c[3]);
    else {
        snprintf(e, sizeof e, "%s %% %lld", at->c[2], (long long)D);
        bind(st, d, e);
        snprintf(e, sizeof e, "%s - %s", at->c[2], d);
        bind(st, base, e);
    }
    /* pair k, the partner's coordinate and the half, all valid past the rotary dim too */
    if (il) snprintf(e, sizeof e, "(%s < %lld ? %s / 2 : 0)", d, (long long)dim, d);
    else snprintf(e, sizeof e, "(%s < %lld ? %s : (%s < %lld ? %s - %lld : 0))", d, (long long)half, d, d, (long long)dim,
                  d, (long long)half);
    bind(st, k, e);
    if (il) snprintf(e, sizeof e, "(%s < %lld ? (%s %% 2 == 0 ? %s + 1 : %s - 1) : %s)", d, (long long)dim, d, d, d, d);
    else snprintf(e, sizeof e, "(%s < %lld ? %s + %lld : (%s < %lld ? %s - %lld : %s))", d, (long long)half, d,
                  (long long)half, d, (long long)dim, d, (long long)half, d);
    bind(st, p, e);
    if (il) snprintf(first, sizeof first, "(%s %% 2 == 0)", d);
    else snprintf(first, sizeof first, "(%s < %lld)", d, (long long)half);
    ix pa = *at;
    if (r == 4) snprintf(pa.c[3], NAMELEN, "%s", p);
    else {
        snprintf(e, sizeof e, "%s + %s", base, p);
        bind(st, pa.c[2], e);
    }
    pa.lin[0] = 0;
    /* the caches' row: position_ids[b, s] (dims of 1 broadcast), or (b, s) */
    ix ca = {.rank = ct->rank};
    if (pos) {
        const kf_type *pt = &st->g->values[pos].type;
        int64_t npos = ct->dims[0];
        if (pt->dtype != KF_DT_INT64 || pt->rank != 2)
            return fail(st, "node '%s': RotaryEmbedding position_ids are not generated", kf_node_label(n));
        const kf_tensor *pc = st->g->values[pos].init;
        for (int64_t i = 0; pc && i < pc->numel; i++)
            if (kf_get_i64(pc, i) < 0 || kf_get_i64(pc, i) >= npos)
                return fail(st, "node '%s': position id %lld is outside the caches' %lld positions", kf_node_label(n),
                            (long long)kf_get_i64(pc, i), (long long)npos);
        ix ia = {.rank = 2};
        snprintf(ia.c[0], NAMELEN, "%s", pt->dims[0] == 1 ? "0" : b);
        snprintf(ia.c[1], NAMELEN, "%s", pt->dims[1] == 1 ? "0" : s);
        char id[NAMELEN], t[NAMELEN];
        if (!emit(st, pos, &ia, id)) return false;
        snprintf(e, sizeof e, "(%s)%s", st->ity, id);
        bind(st, t, e);
        if (!pc && npos > 1) {
            int code = check_code(st, n, npos);
            if (code < 0) return fail_oom(st);
            kf_cg_printf(st->s, "%sif (%s < 0 || %s >= %lld) kf_index_fail(kf_err, %d, (kf_i64)%s);\n", st->ind, t, t,
                         (long long)npos, code, id);
        }
        if (npos == 1) snprintf(ca.c[0], NAMELEN, "0");
        else clamp_bind(st, ca.c[0], t, npos);
        snprintf(ca.c[1], NAMELEN, "%s", k);
    } else {
        snprintf(ca.c[0], NAMELEN, "%s", ct->dims[0] == 1 ? "0" : b);
        snprintf(ca.c[1], NAMELEN, "%s", ct->dims[1] == 1 ? "0" : s);
        snprintf(ca.c[2], NAMELEN, "%s", k);
    }
    char xv[NAMELEN], xp[NAMELEN], cv[NAMELEN], sv[NAMELEN];
    if (!emit(st, n->in[0], at, xv) || !emit(st, n->in[0], &pa, xp) || !emit(st, n->in[1], &ca, cv) ||
        !emit(st, n->in[2], &ca, sv))
        return false;
    char rhs[512]; /* names and two numbers */
    snprintf(rhs, sizeof rhs, "(%s < %lld ? (%s ? %s * %s - %s * %s : %s * %s + %s * %s) : %s)", d, (long long)dim, first,
             cv, xv, sv, xp, sv, xp, cv, xv, xv);
    return define(st, v, name, rhs);
}

/* Pad, constant mode: the value where the index falls outside the input,
 * else the input read at the (clamped, so always valid) shifted index. */
static bool emit_pad(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    const kf_type *it = &st->g->values[n->in[0]].type, *ot = &st->g->values[v].type;
    int r = it->rank, np = 0;
    int64_t pads[2 * KF_MAX_RANK];
    double value = 0;
    if (strcmp(kf_attr_s(n, "mode", "constant"), "constant"))
        return fail(st, "node '%s': Pad mode '%s' is not generated (constant only)", kf_node_label(n),
                    kf_attr_s(n, "mode", "constant"));
    if (n->opset > 0 && n->opset < 11) {
        const int64_t *p = kf_attr_ints(n, "pads", &np);
        if (!p || np != 2 * r) return fail(st, "node '%s': Pad pads do not match the rank", kf_node_label(n));
        memcpy(pads, p, (size_t)np * sizeof *p);
        value = kf_attr_f(n, "value", 0);
    } else {
        if (n->nin > 3 && n->in[3]) return fail(st, "node '%s': Pad with an axes input is not generated", kf_node_label(n));
        if (!const_ints(st, n, 1, pads, &np, 2 * KF_MAX_RANK)) return false;
        if (np != 2 * r) return fail(st, "node '%s': Pad pads do not match the rank", kf_node_label(n));
        if (n->nin > 2 && n->in[2]) {
            const kf_tensor *t = st->g->values[n->in[2]].init;
            if (!t || t->numel != 1) return fail(st, "node '%s': Pad value is not a constant scalar", kf_node_label(n));
            value = kf_get_f64(t, 0);
        }
    }
    ix a = {.rank = r};
    kf_cg_str cond = {0};
    for (int d = 0; d < r; d++) {
        if (pads[d] == 0 && it->dims[d] == ot->dims[d]) {
            snprintf(a.c[d], NAMELEN, "%s", at->c[d]);
            continue;
        }
        char e[96], t[NAMELEN]; /* "name - (number)" */
        snprintf(e, sizeof e, "%s - (%lld)", at->c[d], (long long)pads[d]);
        bind(st, t, e);
        kf_cg_printf(&cond, "%s(%s >= 0 && %s < %lld)", cond.len ? " && " : "", t, t, (long long)it->dims[d]);
        if (it->dims[d] == 0) {
            kf_cg_str_release(&cond);
            return fail(st, "node '%s': Pad of an empty dim is not generated", kf_node_label(n));
        }
        clamp_bind(st, a.c[d], t, it->dims[d]);
    }
    char x[NAMELEN];
    if (!emit(st, n->in[0], &a, x)) {
        kf_cg_str_release(&cond);
        return false;
    }
    kf_cg_str rhs = {0}, lit = {0};
    if (is_real(ot->dtype)) {
        if (!put_float(&lit, value)) {
            kf_cg_str_release(&cond);
            return fail(st, "node '%s': Pad value is not finite", kf_node_label(n));
        }
    } else kf_cg_printf(&lit, "%lld", (long long)value);
    if (cond.len) kf_cg_printf(&rhs, "(%s) ? %s : %s", cond.p, x, lit.p);
    else kf_cg_puts(&rhs, x);
    bool ok = rhs.oom || cond.oom || lit.oom ? fail_oom(st) : define(st, v, name, rhs.p);
    kf_cg_str_release(&rhs);
    kf_cg_str_release(&lit);
    kf_cg_str_release(&cond);
    return ok || fail_oom(st);
}

/* The value of the reduction node at index at, from the row statistics. */
static bool emit_red_value(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    if (!st->stats || v != n->out[0])
        return fail(st, "node '%s': %s result is read outside its row (not generated)", kf_node_label(n), n->op_type);
    /* the statistics are the current row's: an epilogue that reads the result
     * at another row (a Transpose moving a row dim, say) would get the wrong
     * ones. Index names are compared, so this may decline a read that is in
     * the row after all, never accept one that is not. */
    for (int d = 0; d < at->rank && d < st->row.rank; d++)
        if (!st->mask[d] && strcmp(at->c[d], st->row.c[d]))
            return fail(st, "node '%s': %s result is read at another row than the one reduced (not generated)",
                        kf_node_label(n), n->op_type);
    char x[NAMELEN], rhs[256]; /* a few names and KF_ calls */
    if (st->rk == RK_SOFTMAX || st->rk == RK_LOGSOFTMAX || st->rk == RK_LAYERNORM || st->rk == RK_RMSNORM) {
        if (!emit(st, n->in[0], at, x)) return false;
    }
    switch (st->rk) {
    case RK_SOFTMAX: snprintf(rhs, sizeof rhs, "KF_EXP(%s - %s) / %s", x, st->stat[0], st->stat[1]); break;
    case RK_LOGSOFTMAX: snprintf(rhs, sizeof rhs, "%s - %s - KF_LOG(%s)", x, st->stat[0], st->stat[1]); break;
    case RK_LAYERNORM: {
        const kf_type *xt = &st->g->values[n->in[0]].type;
        char sc[NAMELEN], bi[NAMELEN] = "";
        ix a;
        if (!bcast_ix(st, n, at, xt, &st->g->values[n->in[1]].type, &a) || !emit(st, n->in[1], &a, sc)) return false;
        if (n->nin > 2 && n->in[2]) {
            if (!bcast_ix(st, n, at, xt, &st->g->values[n->in[2]].type, &a) || !emit(st, n->in[2], &a, bi))
                return false;
        }
        snprintf(rhs, sizeof rhs, "(%s - %s) * %s * %s%s%s", x, st->stat[0], st->stat[1], sc, bi[0] ? " + " : "", bi);
        break;
    }
    case RK_RMSNORM: {
        char sc[NAMELEN];
        ix a;
        if (!bcast_ix(st, n, at, &st->g->values[n->in[0]].type, &st->g->values[n->in[1]].type, &a) ||
            !emit(st, n->in[1], &a, sc))
            return false;
        snprintf(rhs, sizeof rhs, "%s * %s * %s", x, st->stat[1], sc);
        break;
    }
    default:
        return fail(st, "node '%s': %s result is read outside its row (not generated)", kf_node_label(n), n->op_type);
    }
    return define(st, v, name, rhs);
}

static bool emit_node(gen *st, const kf_node *n, kf_id v, const ix *at, char *name) {
    bool ln_stats = st->red && n == st->red && st->rk == RK_LAYERNORM; /* Mean, InvStdDev come from the row */
    if (n->nout > 1 && !ln_stats && n->op != KF_OP_SPLIT)
        for (int j = 1; j < n->nout; j++)
            if (n->out[j] && st->g->values[n->out[j]].nusers + st->g->values[n->out[j]].is_output)
                return fail(st, "node '%s': %s output %d is used (only the first output is generated)",
                            kf_node_label(n), n->op_type, j);
    if (st->red && n == st->red) return emit_red_value(st, n, v, at, name);
    if (st->grp->kind == KF_GROUP_ANCHOR && (kf_id)(n - st->g->nodes) == st->grp->anchor)
        return fail(st, "node '%s': the %s result is read at another element than the one stored (not generated)",
                    kf_node_label(n), n->op_type);
    const kf_type *ot = &st->g->values[v].type;
    switch (n->op) {
    case KF_OP_CAST:
    case KF_OP_CAST_LIKE: return emit_cast(st, n, v, at, name);
    case KF_OP_QUANTIZE_LINEAR:
    case KF_OP_DEQUANTIZE_LINEAR: return emit_qdq(st, n, v, at, name);
    case KF_OP_IDENTITY:
    case KF_OP_RESHAPE:
    case KF_OP_FLATTEN:
    case KF_OP_SQUEEZE:
    case KF_OP_UNSQUEEZE:
    case KF_OP_DROPOUT: {
        if (n->op == KF_OP_DROPOUT && n->nin > 2 && n->in[2] &&
            !(st->g->values[n->in[2]].init && kf_get_i64(st->g->values[n->in[2]].init, 0) == 0))
            return fail(st, "node '%s': Dropout in training mode is not generated", kf_node_label(n));
        /* same dims (Identity, a no-op reshape): the same index, no
         * linearise/unravel round trip (a step's lanes stay contiguous) */
        const kf_type *it = &st->g->values[n->in[0]].type;
        ix a;
        if (same_dims(ot, it)) a = *at;
        else reshape_ix(st, at, ot, it, &a);
        return emit(st, n->in[0], &a, name);
    }
    case KF_OP_EXPAND: {
        ix a;
        return bcast_ix(st, n, at, ot, &st->g->values[n->in[0]].type, &a) && emit(st, n->in[0], &a, name);
    }
    case KF_OP_TRANSPOSE: return emit_transpose(st, n, at, name);
    case KF_OP_SLICE: return emit_slice(st, n, at, name);
    case KF_OP_SPLIT: return emit_split(st, n, v, at, name);
    case KF_OP_CONCAT: return emit_concat(st, n, v, at, name);
    case KF_OP_GATHER: return emit_gather(st, n, at, name);
    case KF_OP_GATHER_ND: return emit_gathernd(st, n, at, name);
    case KF_OP_ROTARY_EMBEDDING: return emit_rotary(st, n, v, at, name);
    case KF_OP_PAD: return emit_pad(st, n, v, at, name);
    default: return emit_expr(st, n, v, at, name);
    }
}

/* ---- steps of V elements (KF_CG_LANES) ---------------------------------------- */

static bool is_literal(const char *c) {
    for (; *c; c++)
        if (!isdigit((unsigned char)*c)) return false;
    return true;
}

/* The lane whose index is at's last component when a value of type t read
 * at `at` is contiguous over the step: its last axis a multiple of V and
 * indexed by a lane name, every other axis by a shared name or a constant.
 * -1 otherwise. */
static int vec_lane(const gen *st, const kf_type *t, const ix *at) {
    const vlanes *vl = &st->vl;
    int l = -1;
    if (vl->V && vl->flat) { /* the same element count read at a lane's linear index */
        for (int k = 0; k < vl->V; k++)
            if (!strcmp(at->lin, vl->lane[k])) l = k;
        return l >= 0 && numel_of(t) == numel_of(&st->g->values[st->k->outs[0].value].type) ? l : -1;
    }
    if (!vl->V || t->rank < 1 || at->rank != t->rank || t->dims[t->rank - 1] % vl->V) return -1;
    for (int k = 0; k < vl->V; k++)
        if (!strcmp(at->c[t->rank - 1], vl->lane[k])) l = k;
    for (int d = 0; l >= 0 && d < t->rank - 1; d++) {
        bool shared = is_literal(at->c[d]);
        for (int k = 0; !shared && k < vl->nshared; k++) shared = !strcmp(at->c[d], vl->shared[k]);
        if (!shared) l = -1;
    }
    return l;
}

/* Values of type dt a vector load or store of one step moves at once:
 * float32 in float4s, 16-bit values in one piece of the whole step. */
static int vec_piece(const gen *st, kf_dtype dt) { return dt == KF_DT_FLOAT ? 4 : st->vl.V; }

/* The index, in pieces of `piece` values, of piece c of the step at `at`
 * (vec_lane holds) in a buffer of type t, bound to a name. The strides of
 * the other axes are multiples of the last axis, so of the piece. */
static void vec_offset(gen *st, const kf_type *t, const ix *at, int piece, int c, char *out) {
    kf_cg_str e = {0};
    const kf_type step_only = {.rank = 1, .dims = {1}}; /* the flat space has no other axes: the step alone */
    if (st->vl.flat) t = &step_only;
    int64_t stride = t->dims[t->rank - 1];
    for (int d = t->rank - 2; d >= 0; d--) {
        if (t->dims[d] != 1 && strcmp(at->c[d], "0")) kf_cg_printf(&e, "%s * %lld + ", at->c[d], (long long)(stride / piece));
        stride *= t->dims[d];
    }
    int per = st->vl.V / piece; /* pieces per step */
    if (per == 1) kf_cg_puts(&e, st->vl.step);
    else kf_cg_printf(&e, "%s * %d + %d", st->vl.step, per, c);
    bind(st, out, e.p ? e.p : "0");
    if (e.oom) st->s->oom = true;
    kf_cg_str_release(&e);
}

static bool vec_dtype(kf_dtype dt) { return dt == KF_DT_FLOAT || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16; }

/* Group input pi (value v) at lane l's index `at`: the step's piece loaded
 * once (remembered under the index with the piece in place of the lane),
 * the lane's element taken from it. */
static bool emit_lane(gen *st, kf_id v, int pi, const ix *at, int l, char *name) {
    const kf_type *t = &st->g->values[v].type;
    int piece = vec_piece(st, t->dtype), c = l / piece, last = t->rank - 1;
    ix key = *at;
    snprintf(key.c[last], NAMELEN, "@%d%s", c, st->vl.step); /* never a name: the step's piece c */
    if (st->vl.flat) /* the lanes' other axes differ: the step alone */
        for (int d = 0; d < last; d++) snprintf(key.c[d], NAMELEN, "@");
    key.lin[0] = 0;
    char w[NAMELEN];
    const char *hit = memo_find(st, v, &key);
    if (hit) snprintf(w, NAMELEN, "%s", hit);
    else {
        char off[NAMELEN];
        vec_offset(st, t, at, piece, c, off);
        snprintf(w, NAMELEN, "w%d", st->nw++);
        const char *type = "KF_F4", *load = "KF_VLOAD4";
        if (t->dtype == KF_DT_FLOAT16) {
            type = piece == 8 ? "KF_VH8" : "KF_VH4";
            load = piece == 8 ? "KF_VLOAD_H8" : "KF_VLOAD_H4";
        } else if (t->dtype == KF_DT_BFLOAT16) {
            type = piece == 8 ? "KF_VB8" : "KF_VB4";
            load = piece == 8 ? "KF_VLOAD_B8" : "KF_VLOAD_B4";
        }
        kf_cg_printf(st->s, "%sconst %s %s = %s(in%d, %s);\n", st->ind, type, w, load, pi, off);
        if (!memo_add(st, v, &key, w)) return false;
    }
    value_name(st, v, name);
    if (t->dtype == KF_DT_FLOAT) kf_cg_printf(st->s, "%sconst float %s = %s.%c;\n", st->ind, name, w, "xyzw"[l % 4]);
    else
        kf_cg_printf(st->s, "%sconst float %s = KF_V%c_AT(%s, %d);\n", st->ind, name,
                     t->dtype == KF_DT_FLOAT16 ? 'H' : 'B', w, l);
    return memo_add(st, v, at, name);
}

static bool store(gen *st, uint32_t o, const ix *at);

/* Output o at the indices of every lane of a step (lanes[l] carries lane
 * l's name on the last axis): one vector store per piece when the output
 * is contiguous over the step, else a store per lane. */
static bool store_lanes(gen *st, uint32_t o, const ix *lanes) {
    kf_id v = st->k->outs[o].value;
    const kf_type *t = &st->g->values[v].type;
    int V = st->vl.V;
    char x[KF_CG_LANES_MAX][NAMELEN];
    for (int l = 0; l < V; l++)
        if (!emit(st, v, &lanes[l], x[l])) return false;
    if (!vec_dtype(t->dtype) || vec_lane(st, t, &lanes[0]) != 0) {
        for (int l = 0; l < V; l++)
            if (!store(st, o, &lanes[l])) return false;
        return true;
    }
    int piece = vec_piece(st, t->dtype);
    for (int c = 0; c < V / piece; c++) {
        char off[NAMELEN];
        vec_offset(st, t, &lanes[0], piece, c, off);
        const char *fn = t->dtype == KF_DT_FLOAT ? "KF_VSTORE4"
                         : t->dtype == KF_DT_FLOAT16 ? (piece == 8 ? "KF_VSTORE_H8" : "KF_VSTORE_H4")
                                                     : (piece == 8 ? "KF_VSTORE_B8" : "KF_VSTORE_B4");
        kf_cg_printf(st->s, "%s%s(out%u, %s", st->ind, fn, o, off);
        for (int l = c * piece; l < (c + 1) * piece; l++) kf_cg_printf(st->s, ", %s", x[l]);
        kf_cg_puts(st->s, ");\n");
    }
    return true;
}

/* Declares the lanes of a step: lane l's index on the last axis of a
 * space of `rank` axes is step * V + l; lanes[l] gets base's components
 * (the shared names) with that name last. */
static void declare_lanes(gen *st, const ix *base, const char *prefix, ix *lanes) {
    vlanes *vl = &st->vl;
    int last = base->rank - 1;
    vl->nshared = 0;
    for (int d = 0; d < last; d++)
        if (!is_literal(base->c[d])) snprintf(vl->shared[vl->nshared++], NAMELEN, "%s", base->c[d]);
    for (int l = 0; l < vl->V; l++) {
        snprintf(vl->lane[l], NAMELEN, "%s_%d", prefix, l);
        kf_cg_printf(st->s, "%sconst %s %s = %s * %d + %d;\n", st->ind, st->ity, vl->lane[l], vl->step, vl->V, l);
        lanes[l] = *base;
        lanes[l].lin[0] = 0;
        snprintf(lanes[l].c[last], NAMELEN, "%s", vl->lane[l]);
    }
}

static bool emit(gen *st, kf_id v, const ix *at, char *name) {
    const char *hit = memo_find(st, v, at);
    if (hit) {
        snprintf(name, NAMELEN, "%s", hit);
        return true;
    }
    const kf_value *val = &st->g->values[v];
    if (!dtype_ok(val->type.dtype))
        return fail(st, "value '%s' is %s: " DTYPES_OK, val->name,
                    kf_dtype_name(val->type.dtype));
    if (!kf_type_is_static(&val->type))
        return fail(st, "value '%s' has a symbolic or unknown shape: kernels are generated per static shape", val->name);
    if (val->type.rank != at->rank) return fail(st, "value '%s' read at an index of another rank (internal)", val->name);
    kf_id pn = val->producer;
    if (pn && st->p->group_of[pn] == st->gi) {
        if (!emit_node(st, &st->g->nodes[pn], v, at, name)) return false;
    } else {
        int pi = param_of(st, v);
        if (pi < 0) return fail(st, "value '%s' is read but is no group input", val->name);
        /* a read contiguous over a step of lanes takes its element from
         * the step's vector load */
        int l = vec_dtype(val->type.dtype) ? vec_lane(st, &val->type, at) : -1;
        if (l >= 0) return emit_lane(st, v, pi, at, l, name);
        char off[NAMELEN] = "";
        offset_of(st, &val->type, at, off);
        value_name(st, v, name);
        kf_dtype dt = val->type.dtype;
        kf_cg_printf(st->s, "%sconst %s %s = ", st->ind, ctype(dt), name);
        if (dt == KF_DT_FLOAT16) kf_cg_printf(st->s, "KF_LOAD_HALF(in%d, %s);\n", pi, off);
        else if (dt == KF_DT_BFLOAT16) kf_cg_printf(st->s, "KF_LOAD_BF16(in%d, %s);\n", pi, off);
        else if (small_float_of(dt)) {
            const small_float *sf = small_float_of(dt);
            kf_cg_printf(st->s, "KF_LOAD_%s(in%d, %s, %s);\n", sf->sfx, pi, off, sf->fmt);
            st->k->parts |= sf->part;
        }
        else if (dt == KF_DT_BOOL) kf_cg_printf(st->s, "in%d[%s] != 0;\n", pi, off);
        else kf_cg_printf(st->s, "in%d[%s];\n", pi, off);
    }
    return memo_add(st, v, at, name);
}

/* Writes value v (output o) at index at of its own shape. */
static bool store(gen *st, uint32_t o, const ix *at) {
    kf_id v = st->k->outs[o].value;
    const kf_type *t = &st->g->values[v].type;
    char x[NAMELEN], off[NAMELEN];
    if (!emit(st, v, at, x)) return false;
    offset_of(st, t, at, off);
    if (t->dtype == KF_DT_FLOAT16) kf_cg_printf(st->s, "%sKF_STORE_HALF(out%u, %s, %s);\n", st->ind, o, off, x);
    else if (t->dtype == KF_DT_BFLOAT16) kf_cg_printf(st->s, "%sKF_STORE_BF16(out%u, %s, %s);\n", st->ind, o, off, x);
    else if (small_float_of(t->dtype)) {
        const small_float *sf = small_float_of(t->dtype);
        kf_cg_printf(st->s, "%sKF_STORE_%s(out%u, %s, %s, %s);\n", st->ind, sf->sfx, o, off, x, sf->fmt);
        st->k->parts |= sf->part;
    } else if (t->dtype == KF_DT_BOOL) kf_cg_printf(st->s, "%sout%u[%s] = (unsigned char)(%s != 0);\n", st->ind, o, off, x);
    else kf_cg_printf(st->s, "%sout%u[%s] = %s;\n", st->ind, o, off, x);
    return true;
}

/* Splits linear index `lin` of the dims selected by sel (in order) into
 * names prefix<d>; unselected dims are left alone. dims of 1 read "0". */
static void split_index(gen *st, const char *lin, const kf_type *t, const bool *sel, bool want, const char *prefix,
                        ix *res) {
    int first = -1;
    for (int d = 0; d < t->rank; d++)
        if (sel[d] == want && t->dims[d] != 1) {
            first = d;
            break;
        }
    int64_t stride = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        if (sel[d] != want) continue;
        if (t->dims[d] == 1) {
            snprintf(res->c[d], NAMELEN, "0");
            continue;
        }
        snprintf(res->c[d], NAMELEN, "%s%d", prefix, d);
        kf_cg_printf(st->s, "%sconst %s %s = ", st->ind, st->ity, res->c[d]);
        if (stride == 1 && d == first) kf_cg_printf(st->s, "%s;\n", lin);
        else if (stride == 1) kf_cg_printf(st->s, "%s %% %lld;\n", lin, (long long)t->dims[d]);
        else if (d == first) kf_cg_printf(st->s, "%s / %lld;\n", lin, (long long)stride);
        else kf_cg_printf(st->s, "(%s / %lld) %% %lld;\n", lin, (long long)stride, (long long)t->dims[d]);
        stride *= t->dims[d];
    }
}

/* ---- templates ---------------------------------------------------------------- */

/* Does text use identifier tok (not as part of a longer name)? */
static bool uses_token(const char *text, const char *tok) {
    size_t n = strlen(tok);
    for (const char *c = text; (c = strstr(c, tok)); c += n) {
        bool before = c > text && (isalnum((unsigned char)c[-1]) || c[-1] == '_');
        bool after = isalnum((unsigned char)c[n]) || c[n] == '_';
        if (!before && !after) return true;
    }
    return false;
}

static void header(gen *st, kf_cg_str *s, const char *what) {
    const kf_cg_param *sp = &st->k->outs[0];
    kf_cg_printf(s, "/* kfuse %s kernel: %u op%s, out0 [", what, st->grp->nnodes, st->grp->nnodes == 1 ? "" : "s");
    for (int d = 0; d < sp->rank; d++) kf_cg_printf(s, "%s%lld", d ? ", " : "", (long long)sp->dims[d]);
    kf_cg_printf(s, "] %s\n", kf_dtype_name(sp->dtype));
    for (uint32_t j = 0; j < st->grp->nnodes; j++) {
        const kf_node *n = &st->g->nodes[st->grp->nodes[j]];
        kf_cg_printf(s, " *   v%d = %s(", var_of(st, n->out[0]), n->op_type);
        for (int i = 0, c = 0; i < n->nin; i++)
            if (n->in[i]) kf_cg_printf(s, "%sv%d", c++ ? ", " : "", var_of(st, n->in[i]));
        kf_cg_puts(s, ")\n");
    }
    kf_cg_puts(s, " */\n");
    kf_cg_printf(s, "KF_KERNEL %s(", st->k->name);
    for (uint32_t i = 0; i < st->k->nins; i++)
        kf_cg_printf(s, "%sconst KF_GLOBAL %s *KF_RESTRICT in%u", i ? ", " : "", mtype(st->k->ins[i].dtype), i);
    for (uint32_t o = 0; o < st->k->nouts; o++)
        kf_cg_printf(s, "%sKF_GLOBAL %s *KF_RESTRICT out%u", st->k->nins || o ? ", " : "", mtype(st->k->outs[o].dtype), o);
    if (st->k->nchecks) kf_cg_puts(s, ", KF_GLOBAL int *KF_RESTRICT kf_err");
    kf_cg_puts(s, ")\n{\n");
}

/* Lanes per step of an elementwise kernel over space (KF_CG_LANES): 8 when
 * a 16-bit value is read or written and the steps allow it, else 4; 0 (one
 * element per work-item) when the space is a few steps or no output is a
 * real number (shape arithmetic on integers gains nothing). Steps run along
 * the last axis when it is a multiple of V (operands broadcast along the
 * leading axes, a bias row, stay vectors); otherwise, when every operand
 * spans the space or is one element, along the flat space (*flat; the
 * last numel % V elements go through the scalar loop). Buffers start
 * aligned (each parameter is its own allocation or an arena slot: OpenCL
 * aligns to CL_DEVICE_MEM_BASE_ADDR_ALIGN, cudaMalloc and the memory plan
 * to 256 bytes), so every step's piece is aligned. */
static int ew_lanes(const gen *st, const kf_type *space, bool *flat) {
    *flat = false;
    if (space->rank < 1 || numel_of(space) < 16) return 0; /* 16: a few steps, else the scalar loop is all there is */
    int64_t W = space->dims[space->rank - 1];
    bool narrow = false, real = false, spans = true;
    for (uint32_t i = 0; i < st->k->nins; i++) {
        const kf_cg_param *pr = &st->k->ins[i];
        if (pr->numel > 1 && (pr->dtype == KF_DT_FLOAT16 || pr->dtype == KF_DT_BFLOAT16)) narrow = true;
        if (pr->numel > 1 && pr->numel != numel_of(space)) spans = false;
    }
    for (uint32_t o = 0; o < st->k->nouts; o++) {
        kf_dtype dt = st->k->outs[o].dtype;
        if (vec_dtype(dt)) real = true;
        if (dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16) narrow = true;
    }
    if (!real) return 0;
    if (narrow && W % 8 == 0) return 8;
    if (W % 4 == 0) return 4;
    *flat = spans;
    return spans ? (narrow ? 8 : 4) : 0;
}

/* The loop of steps of V elements over space (every output spans it):
 * work-item q takes step q. Along the last axis, the other axes' indices
 * come from q / (W / V) and the lanes' from q % (W / V); over the flat
 * space (flat), lane l's linear index is q * V + l, each lane's axes split
 * from it. Reads contiguous over the step load a vector, one-element
 * operands load once per step, outputs store vectors. */
static bool ew_steps(gen *st, kf_cg_str *s, const kf_type *space, int V, bool flat) {
    int R = space->rank;
    int64_t W = flat ? numel_of(space) : space->dims[R - 1], nsteps = numel_of(space) / V;
    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    st->vl.V = V;
    st->vl.flat = flat;
    snprintf(st->vl.step, NAMELEN, "q");
    ix base = {.rank = R}, lanes[KF_CG_LANES_MAX];
    if (flat) {
        bool all[KF_MAX_RANK];
        for (int d = 0; d < R; d++) all[d] = true;
        for (int l = 0; l < V; l++) {
            snprintf(st->vl.lane[l], NAMELEN, "i_%d", l);
            kf_cg_printf(&body, "        const %s i_%d = q * %d + %d;\n", st->ity, l, V, l);
            char prefix[NAMELEN];
            snprintf(prefix, NAMELEN, "i%d_", l);
            lanes[l].rank = R;
            split_index(st, st->vl.lane[l], space, all, true, prefix, &lanes[l]);
            snprintf(lanes[l].lin, NAMELEN, "%s", st->vl.lane[l]);
        }
    } else {
        snprintf(st->vl.step, NAMELEN, "kq");
        if (nsteps > W / V) {
            kf_cg_printf(&body, "        const %s kq = q %% %lld;\n", st->ity, (long long)(W / V));
            kf_cg_printf(&body, "        const %s ko = q / %lld;\n", st->ity, (long long)(W / V));
            bool sel[KF_MAX_RANK] = {0};
            for (int d = 0; d < R - 1; d++) sel[d] = true;
            split_index(st, "ko", space, sel, true, "i", &base);
        } else {
            kf_cg_printf(&body, "        const %s kq = q;\n", st->ity);
            for (int d = 0; d < R - 1; d++) snprintf(base.c[d], NAMELEN, "0");
        }
        char prefix[NAMELEN];
        snprintf(prefix, NAMELEN, "i%d", R - 1);
        declare_lanes(st, &base, prefix, lanes);
    }
    bool ok = true;
    for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
        const kf_type *t = &st->g->values[st->k->outs[o].value].type;
        if (same_dims(t, space)) {
            ok = store_lanes(st, o, lanes);
            continue;
        }
        for (int l = 0; ok && l < V; l++) { /* other dims, same count: through the linear index, a store per lane */
            ix a;
            reshape_ix(st, &lanes[l], space, t, &a);
            ok = store(st, o, &a);
        }
    }
    st->vl.V = 0;
    st->vl.flat = false;
    if (ok) {
        kf_cg_printf(s, "    for (%s q = (%s)KF_GLOBAL_ID; q < %lld; q += (%s)KF_GLOBAL_SIZE) {\n", st->ity, st->ity,
                     (long long)nsteps, st->ity);
        kf_cg_puts(s, body.p ? body.p : "");
        kf_cg_puts(s, "    }\n");
    }
    if (body.oom) s->oom = true;
    kf_cg_str_release(&body);
    return ok;
}

/* Elementwise/broadcast/injective: one grid-stride loop over out0's
 * elements; every output with the same element count is written at the
 * same linear index (through Reshape's map when its dims differ). */
/* The grid-stride loop over space writing every output of space's element
 * count (the others belong to another loop); with `alone` (every output
 * has that count) the 128-bit path may be taken and the header is
 * written. */
static bool ew_loop(gen *st, kf_cg_str *s, const kf_type *space, bool alone) {
    int R = space->rank;
    bool flat = false;
    int V = alone ? ew_lanes(st, space, &flat) : 0;
    int64_t first_i = V ? numel_of(space) / V * V : 0; /* the scalar loop's first element */
    kf_cg_str vbody = {0};
    if (V) {
        uint32_t mark = st->nmemo; /* the steps' names end with their loop */
        bool ok = ew_steps(st, &vbody, space, V, flat);
        st->nmemo = mark;
        if (!ok || first_i == numel_of(space)) {
            if (ok) {
                header(st, s, V == 8 ? "elementwise (8 lanes)" : "elementwise (4 lanes)");
                kf_cg_puts(s, vbody.p ? vbody.p : "");
                kf_cg_puts(s, "}\n");
                st->k->numel = numel_of(space) / V; /* work-items: one per step */
            }
            if (vbody.oom) s->oom = true;
            kf_cg_str_release(&vbody);
            return ok;
        }
    }
    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    ix sp = {.rank = R};
    for (int d = 0; d < R; d++) snprintf(sp.c[d], NAMELEN, space->dims[d] == 1 ? "0" : "i%d", d);
    snprintf(sp.lin, NAMELEN, "i");
    bool ok = true;
    for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
        const kf_type *t = &st->g->values[st->k->outs[o].value].type;
        if (!alone && numel_of(t) != numel_of(space)) continue;
        if (same_dims(t, space)) ok = store(st, o, &sp);
        else if (numel_of(t) == numel_of(space)) {
            ix a;
            reshape_ix(st, &sp, space, t, &a);
            ok = store(st, o, &a);
        } else
            ok = fail(st, "value '%s' has another element count than the group's space (not generated)",
                      st->g->values[st->k->outs[o].value].name);
    }
    if (ok) {
        if (alone) header(st, s, !V ? "elementwise" : V == 8 ? "elementwise (8 lanes)" : "elementwise (4 lanes)");
        kf_cg_puts(s, vbody.p ? vbody.p : "");
        if (first_i) /* the elements past the last whole step */
            kf_cg_printf(s, "    for (%s i = %lld + (%s)KF_GLOBAL_ID; i < %lld; i += (%s)KF_GLOBAL_SIZE) {\n", st->ity,
                         (long long)first_i, st->ity, (long long)numel_of(space), st->ity);
        else
            kf_cg_printf(s, "    for (%s i = (%s)KF_GLOBAL_ID; i < %lld; i += (%s)KF_GLOBAL_SIZE) {\n", st->ity, st->ity,
                         (long long)numel_of(space), st->ity);
        int64_t stride = 1;
        int first = -1;
        for (int d = 0; d < R; d++)
            if (space->dims[d] != 1) {
                first = d;
                break;
            }
        for (int d = R - 1; d >= 0; d--) {
            char tok[NAMELEN];
            snprintf(tok, NAMELEN, "i%d", d);
            if (space->dims[d] != 1 && body.p && uses_token(body.p, tok)) {
                kf_cg_printf(s, "        const %s %s = ", st->ity, tok);
                if (stride == 1 && d == first) kf_cg_puts(s, "i;\n");
                else if (stride == 1) kf_cg_printf(s, "i %% %lld;\n", (long long)space->dims[d]);
                else if (d == first) kf_cg_printf(s, "i / %lld;\n", (long long)stride);
                else kf_cg_printf(s, "(i / %lld) %% %lld;\n", (long long)stride, (long long)space->dims[d]);
            }
            stride *= space->dims[d];
        }
        kf_cg_puts(s, body.p ? body.p : "");
        kf_cg_puts(s, alone ? "    }\n}\n" : "    }\n");
    }
    if (body.oom || vbody.oom) s->oom = true;
    kf_cg_str_release(&body);
    kf_cg_str_release(&vbody);
    if (V) st->k->numel = numel_of(space) / V; /* work-items: one per step; they also cover the tail */
    return ok;
}

/* The elementwise/injective kernel: one loop over out0's elements when
 * every output has its element count; else (a Split's outputs of
 * different sizes) one grid-stride loop per distinct count, in order of
 * first appearance, each over the first output of that count, launched
 * over the largest. */
static bool gen_elementwise(gen *st, kf_cg_str *s) {
    uint32_t first[KF_PLAN_MAX_OUTPUTS], nc = 0;
    int64_t most = 0;
    for (uint32_t o = 0; o < st->k->nouts; o++) {
        int64_t c = numel_of(&st->g->values[st->k->outs[o].value].type);
        uint32_t j = 0;
        while (j < nc && numel_of(&st->g->values[st->k->outs[first[j]].value].type) != c) j++;
        if (j == nc && nc < KF_PLAN_MAX_OUTPUTS) first[nc++] = o;
        if (c > most) most = c;
    }
    if (nc <= 1) return ew_loop(st, s, &st->g->values[st->k->outs[0].value].type, true);
    header(st, s, "elementwise (one loop per output size)");
    bool ok = true;
    for (uint32_t j = 0; ok && j < nc; j++) {
        uint32_t mark = st->nmemo; /* names end with their loop */
        ok = ew_loop(st, s, &st->g->values[st->k->outs[first[j]].value].type, false);
        st->nmemo = mark;
    }
    if (ok) kf_cg_puts(s, "}\n");
    st->k->numel = most;
    return ok;
}

/* Longest chain of views (Reshape family, Transpose) between a group output
 * and the reduction's input space that is followed; exporters write one or
 * two. */
#define VIEW_CHAIN_MAX 8

/* The nodes, output first, through which group value v is a view of a
 * value of the reduction's input dims (xt), inside the group; 0 when there
 * is none (v itself of those dims included). */
static int view_chain(const gen *st, kf_id v, const kf_type *xt, const kf_node **chain) {
    for (int depth = 0; v && depth <= VIEW_CHAIN_MAX; depth++) {
        const kf_type *t = &st->g->values[v].type;
        if (same_dims(t, xt)) return depth;
        if (depth == VIEW_CHAIN_MAX || numel_of(t) != numel_of(xt)) return 0;
        kf_id pn = st->g->values[v].producer;
        if (!pn || st->p->group_of[pn] != st->gi) return 0;
        const kf_node *n = &st->g->nodes[pn];
        if (!kf_plan_is_view(n)) return 0;
        chain[depth] = n;
        v = n->in[0];
    }
    return 0;
}

/* The index of the chain's output (chain[0]) that holds the element at
 * `at` of the chain's source: Transpose permutes the components, the
 * Reshape family goes through the linear index. Each view's element there
 * is the source's, named src (remembered, so the store finds it). */
static bool view_forward(gen *st, const kf_node *const *chain, int len, const ix *at, const char *src, ix *res) {
    ix cur = *at;
    for (int k = len - 1; k >= 0; k--) {
        const kf_node *n = chain[k];
        const kf_type *it = &st->g->values[n->in[0]].type, *ot = &st->g->values[n->out[0]].type;
        ix nx = {.rank = ot->rank};
        if (n->op == KF_OP_TRANSPOSE) {
            int cnt = 0;
            const int64_t *perm = kf_attr_ints(n, "perm", &cnt);
            for (int d = 0; d < ot->rank; d++) {
                int64_t pd = perm && cnt == ot->rank ? perm[d] : ot->rank - 1 - d;
                if (pd < 0 || pd >= it->rank) return fail(st, "node '%s': Transpose perm is not a permutation", kf_node_label(n));
                snprintf(nx.c[d], NAMELEN, "%s", cur.c[pd]);
            }
        } else if (same_dims(it, ot)) {
            nx = cur;
        } else {
            reshape_ix(st, &cur, it, ot, &nx);
        }
        cur = nx;
        if (!memo_add(st, n->out[0], &cur, src)) return false;
    }
    *res = cur;
    return true;
}

/* Which dims node n reduces (st->mask) and its kind; false with a reason. */
static bool red_setup(gen *st, const kf_node *n) {
    const kf_type *xt = &st->g->values[n->in[0]].type;
    int r = xt->rank;
    int64_t opset = n->opset > 0 ? n->opset : 21; /* 21: the newest the op table implements */
    memset(st->mask, 0, sizeof st->mask);
    if (!is_real(xt->dtype)) return fail(st, "node '%s': %s over %s is not generated", kf_node_label(n), n->op_type, kf_dtype_name(xt->dtype));
    switch (n->op) {
    case KF_OP_SOFTMAX:
    case KF_OP_LOG_SOFTMAX:
    case KF_OP_LAYER_NORMALIZATION: {
        bool ln = n->op == KF_OP_LAYER_NORMALIZATION;
        int64_t axis = kf_attr_i(n, "axis", ln || opset >= 13 ? -1 : 1);
        if (axis < 0) axis += r;
        if (axis < 0 || axis >= r) return fail(st, "node '%s': axis out of range", kf_node_label(n));
        for (int d = (int)axis; d < r; d++) st->mask[d] = ln || opset < 13 || d == axis;
        st->rk = ln ? RK_LAYERNORM : n->op == KF_OP_SOFTMAX ? RK_SOFTMAX : RK_LOGSOFTMAX;
        return true;
    }
    case KF_OP_RMS_NORMALIZATION: { /* x / sqrt(mean(x^2 over [axis, rank)) + eps) * scale, in float */
        int64_t axis = kf_attr_i(n, "axis", -1);
        if (axis < 0) axis += r;
        if (axis < 0 || axis >= r) return fail(st, "node '%s': axis out of range", kf_node_label(n));
        if (kf_attr_i(n, "stash_type", 1) != 1)
            return fail(st, "node '%s': RMSNormalization with stash_type other than float is not generated", kf_node_label(n));
        for (int d = (int)axis; d < r; d++) st->mask[d] = true;
        st->rk = RK_RMSNORM;
        return true;
    }
    case KF_OP_GLOBAL_AVERAGEPOOL:
    case KF_OP_GLOBAL_MAXPOOL:
    case KF_OP_GLOBAL_LPPOOL: {
        /* a reduction over every spatial dim, kept as 1s */
        if (n->op == KF_OP_GLOBAL_LPPOOL) {
            const kf_attr *pa = kf_attr_find(n, "p");
            double pv = !pa ? 2.0 : pa->type == KF_ATTR_INT ? (double)pa->i : pa->type == KF_ATTR_FLOAT ? pa->f : 0.0;
            if (pv != 1.0 && pv != 2.0)
                return fail(st, "node '%s': GlobalLpPool with p other than 1 or 2 is not generated", kf_node_label(n));
            st->rk = pv == 1.0 ? RK_L1 : RK_L2;
        } else {
            st->rk = n->op == KF_OP_GLOBAL_MAXPOOL ? RK_MAX : RK_MEAN;
        }
        for (int d = 2; d < r; d++) st->mask[d] = true;
        return true;
    }
    default: break;
    }
    static const struct {
        kf_op op;
        rkind rk;
    } kinds[] = {{KF_OP_REDUCE_SUM, RK_SUM},       {KF_OP_REDUCE_MEAN, RK_MEAN},
                 {KF_OP_REDUCE_MAX, RK_MAX},       {KF_OP_REDUCE_MIN, RK_MIN},
                 {KF_OP_REDUCE_PROD, RK_PROD},     {KF_OP_REDUCE_L1, RK_L1},
                 {KF_OP_REDUCE_L2, RK_L2},         {KF_OP_REDUCE_LOG_SUM, RK_LOGSUM},
                 {KF_OP_REDUCE_LOG_SUM_EXP, RK_LOGSUMEXP}, {KF_OP_REDUCE_SUM_SQUARE, RK_SUMSQ}};
    size_t ki = 0;
    while (ki < sizeof kinds / sizeof *kinds && kinds[ki].op != n->op) ki++;
    if (ki == sizeof kinds / sizeof *kinds)
        return fail(st, "node '%s': %s has no reduction template yet", kf_node_label(n), n->op_type);
    st->rk = kinds[ki].rk;
    int64_t from = n->op == KF_OP_REDUCE_SUM ? 13 : 18; /* opsets where axes became an input */
    int64_t axes[KF_MAX_RANK];
    int na = 0;
    if (opset >= from) {
        if (n->nin > 1 && n->in[1] && !const_ints(st, n, 1, axes, &na, KF_MAX_RANK)) return false;
    } else {
        const int64_t *a = kf_attr_ints(n, "axes", &na);
        if (na > KF_MAX_RANK) return fail(st, "node '%s': too many axes", kf_node_label(n));
        if (a) memcpy(axes, a, (size_t)na * sizeof *a);
        else na = 0;
    }
    if (!na && opset >= from && kf_attr_i(n, "noop_with_empty_axes", 0))
        return fail(st, "node '%s': %s with noop_with_empty_axes is a copy (not generated)", kf_node_label(n), n->op_type);
    for (int k = 0; k < na; k++) {
        int64_t a = axes[k] < 0 ? axes[k] + r : axes[k];
        if (a < 0 || a >= r) return fail(st, "node '%s': axis %lld out of range", kf_node_label(n), (long long)axes[k]);
        st->mask[a] = true;
    }
    if (!na)
        for (int d = 0; d < r; d++) st->mask[d] = true;
    return true;
}

/* The loop of a segment's lanes over its row (KF_CG_SEGMENT): lane l takes
 * elements l, l + seg, ...; a lane without a row (the work-group's last
 * rows run out, or the segments do not fill the work-group) starts past the
 * end, so it loads nothing but still reaches every barrier. */
static void seg_loop(gen *st, int64_t K) {
    kf_cg_printf(st->s, "        for (%s j = kf_on ? (%s)kf_lane : %lld; j < %lld; j += (%s)kf_seg) {\n", st->ity, st->ity,
                 (long long)K, (long long)K, st->ity);
}

/* One statistics pass over the current row: acc = fold(map(x)) over the
 * reduced dims, then across the row's segment. */
static bool red_pass(gen *st, const kf_node *n, const kf_type *xt, const ix *rowix, const char *acc, const char *init,
                     const char *fold, const char *map, const char *map2, const char *blockfn, uint32_t block,
                     int64_t K, bool tail) {
    kf_cg_printf(st->s, "        float %s = %s;\n", acc, init);
    if (st->rc) { /* the row on chip: fold every element a lane holds */
        const rowcache *rc = st->rc;
        for (int i = 0; i < rc->P; i++) {
            kf_cg_printf(st->s, "        if (kf_ok%d) {\n", i);
            for (int l = 0; l < rc->V; l++) {
                char m[160], f[400]; /* as below */
                snprintf(m, sizeof m, map, rc->x[i * rc->V + l], map2 ? map2 : rc->x[i * rc->V + l]);
                snprintf(f, sizeof f, fold, acc, m);
                kf_cg_printf(st->s, "            %s = %s;\n", acc, f);
            }
            kf_cg_puts(st->s, "        }\n");
        }
        kf_cg_printf(st->s, "        %s = %s(%s, kf_red, kf_seg, KF_LOCAL_SIZE);\n", acc, blockfn, acc);
        return true;
    }
    if (block) seg_loop(st, K);
    else kf_cg_printf(st->s, "        for (%s j = 0; j < %lld; j++) {\n", st->ity, (long long)K);
    const char *outer = st->ind;
    st->ind = "            ";
    uint32_t mark = st->nmemo;
    ix full = *rowix;
    split_index(st, "j", xt, st->mask, true, "j", &full);
    if (tail) {
        char e[96]; /* "row * K + j" */
        snprintf(e, sizeof e, "row * %lld + j", (long long)K);
        bind(st, full.lin, e);
    }
    char x[NAMELEN];
    if (!emit(st, n->in[0], &full, x)) return false;
    /* map and fold are positional formats: map(%1$s = x, %2$s = map2),
     * fold(%1$s = acc, %2$s = mapped) */
    char m[160], f[400]; /* a KF_ call over two names; a fold over that */
    snprintf(m, sizeof m, map, x, map2 ? map2 : x);
    snprintf(f, sizeof f, fold, acc, m);
    kf_cg_printf(st->s, "            %s = %s;\n        }\n", acc, f);
    st->nmemo = mark;
    st->ind = outer;
    if (block) kf_cg_printf(st->s, "        %s = %s(%s, kf_red, kf_seg, KF_LOCAL_SIZE);\n", acc, blockfn, acc);
    return true;
}

/* KF_CG_SEGMENT (several rows per work-group, a segment of lanes per row)
 * and KF_CG_ROW_CACHE (a row read once into registers): the segment, the
 * work-group and the vector steps come from kf_row_form_of
 * (fusion/cost.c), the rule the cost model estimates from. The body takes
 * the segment size from the launch, min(T, work-group size), and the
 * segment count as the work-group size / segment (lanes past the last
 * whole segment idle), so any work-group size up to KF_MAX_BLOCK stays
 * correct (CUDA: whole warps, then a segment is T or the whole block, both
 * as kf_seg_* need); with the row cached the body strides its steps by
 * the launch's segment, which must be at least T (kf_cg_kernel.min_block). */

/* Loads the row on chip (KF_CG_ROW_CACHE): per step i of this lane, its
 * position (kf_q<i>, valid when kf_ok<i>; an invalid step reads step 0 of
 * a valid row, so every load stays in bounds and no branch splits the
 * lanes before the reduces), the lanes' indices and the reduction input
 * at each, remembered for the passes and the epilogue. */
static bool row_cache_load(gen *st, const kf_node *n, const kf_type *xt, const ix *rowix, int64_t K) {
    rowcache *rc = st->rc;
    int r = xt->rank, V = rc->V;
    int64_t W = xt->dims[r - 1], steps = K / V;
    for (int i = 0; i < rc->P; i++) {
        if (i) kf_cg_printf(st->s, "        const %s kf_q%d = %d * kf_seg + kf_lane;\n", st->ity, i, i);
        else kf_cg_printf(st->s, "        const %s kf_q0 = kf_lane;\n", st->ity);
        kf_cg_printf(st->s, "        const int kf_ok%d = kf_on && kf_q%d < %lld;\n", i, i, (long long)steps);
        kf_cg_printf(st->s, "        const %s jq%d = kf_ok%d ? kf_q%d : 0;\n", st->ity, i, i, i);
        ix base = *rowix;
        vlanes *vl = &st->vl;
        vl->V = V;
        vl->flat = false;
        if (K > W) { /* more reduced axes before the last: split the step's row position */
            kf_cg_printf(st->s, "        const %s kq%d = jq%d %% %lld;\n", st->ity, i, i, (long long)(W / V));
            char ko[NAMELEN], prefix[NAMELEN];
            snprintf(ko, NAMELEN, "ko%d", i);
            kf_cg_printf(st->s, "        const %s %s = jq%d / %lld;\n", st->ity, ko, i, (long long)(W / V));
            bool sel[KF_MAX_RANK];
            for (int d = 0; d < r; d++) sel[d] = st->mask[d] && d < r - 1;
            snprintf(prefix, NAMELEN, "j%d_", i);
            split_index(st, ko, xt, sel, true, prefix, &base);
            snprintf(vl->step, NAMELEN, "kq%d", i);
        } else {
            for (int d = 0; d < r - 1; d++)
                if (st->mask[d]) snprintf(base.c[d], NAMELEN, "0");
            snprintf(vl->step, NAMELEN, "jq%d", i);
        }
        char prefix[NAMELEN];
        snprintf(prefix, NAMELEN, "j%d_%d", i, r - 1);
        declare_lanes(st, &base, prefix, rc->lanes[i]);
        rc->vl[i] = *vl;
        for (int l = 0; l < V; l++)
            if (!emit(st, n->in[0], &rc->lanes[i][l], rc->x[i * V + l])) return false;
    }
    return true;
}

/* Row reduction: rows are the kept dims of the reduction's input, in
 * order; the reduced dims (any set, not only trailing) are walked through
 * the index map inside each row. Prologue ops run inside the row passes,
 * epilogue ops after the statistics: on the output's space (one lane per
 * row) or back on the input's space (a last pass over the row). */
static bool gen_reduction(gen *st, kf_cg_str *s, const kf_node *n) {
    if (!red_setup(st, n)) return false;
    const kf_type *xt = &st->g->values[n->in[0]].type, *ot = &st->g->values[n->out[0]].type;
    if (!kf_type_is_static(xt) || !kf_type_is_static(ot))
        return fail(st, "node '%s': shapes are not static", kf_node_label(n));
    int r = xt->rank;
    int64_t nrows = 1, K = 1;
    for (int d = 0; d < r; d++) {
        if (st->mask[d]) K *= xt->dims[d];
        else nrows *= xt->dims[d];
    }
    if (K == 0) return fail(st, "node '%s': %s over zero elements is not generated", kf_node_label(n), n->op_type);
    bool tail = true, seen_red = false;
    for (int d = 0; d < r; d++) {
        if (xt->dims[d] == 1) continue;
        if (st->mask[d]) seen_red = true;
        else if (seen_red) tail = false;
    }
    bool narrow = xt->dtype == KF_DT_FLOAT16 || xt->dtype == KF_DT_BFLOAT16;
    for (uint32_t i = 0; i < st->k->nins; i++)
        if (st->k->ins[i].numel > 1 && (st->k->ins[i].dtype == KF_DT_FLOAT16 || st->k->ins[i].dtype == KF_DT_BFLOAT16))
            narrow = true;
    kf_row_form form = kf_row_form_of(nrows, K, xt->dims[r - 1], narrow, tail && st->mask[r - 1]);
    uint32_t T = form.seg, block = form.block;
    rowcache rc = {.V = form.vec, .P = form.steps};
    if (rc.V) {
        st->rc = &rc;
        st->k->min_block = T;
    }
    st->k->block = block;
    if (block) {
        int64_t per = block / T; /* rows per work-group */
        st->k->numel = (nrows + per - 1) / per * block;
    } else st->k->numel = nrows;
    kf_free(st->k->name);
    st->k->name = kf_strdup("kf_reduce");
    if (!st->k->name) return fail_oom(st);

    kf_cg_str body = {0};
    st->s = &body;
    st->ind = "        ";
    ix rowix = {.rank = r};
    if (st->rc) /* a lane past the last row reads row 0: loads stay in bounds, stores are skipped */
        kf_cg_printf(&body, "        const %s kf_row = kf_on ? row : 0;\n", st->ity);
    split_index(st, st->rc ? "kf_row" : "row", xt, st->mask, false, "r", &rowix);
    st->row = rowix;
    bool ok = !st->rc || row_cache_load(st, n, xt, &rowix, K);
    char m[NAMELEN] = "", sum[NAMELEN] = "";
    const char *bsum = "kf_seg_sum";
    char eps[48] = "", kf[48]; /* float literals */
    kf_cg_str lit = {0};
    put_float(&lit, (double)K);
    bool lit_ok = !lit.oom && lit.p; /* a literal cut short must not become a default (1.0f) */
    if (lit_ok) snprintf(kf, sizeof kf, "%s", lit.p);
    kf_cg_str_release(&lit);
    if (!lit_ok) {
        kf_cg_str_release(&body);
        return fail_oom(st);
    }
    /* a row that did not load (an input without a kernel expression) keeps
     * its reason: the passes below would overwrite ok with their own */
    if (ok) switch (st->rk) {
    case RK_SUM:
    case RK_MEAN:
    case RK_LOGSUM: ok = red_pass(st, n, xt, &rowix, "acc", "0.0f", "%1$s + %2$s", "%1$s", NULL, bsum, block, K, tail); break;
    case RK_L1: ok = red_pass(st, n, xt, &rowix, "acc", "0.0f", "%1$s + %2$s", "KF_FABS(%1$s)", NULL, bsum, block, K, tail); break;
    case RK_L2:
    case RK_SUMSQ: ok = red_pass(st, n, xt, &rowix, "acc", "0.0f", "%1$s + %2$s", "%1$s * %1$s", NULL, bsum, block, K, tail); break;
    case RK_MAX: ok = red_pass(st, n, xt, &rowix, "acc", "-KF_INF", "KF_FMAX(%1$s, %2$s)", "%1$s", NULL, "kf_seg_max", block, K, tail); break;
    case RK_MIN: ok = red_pass(st, n, xt, &rowix, "acc", "KF_INF", "KF_FMIN(%1$s, %2$s)", "%1$s", NULL, "kf_seg_min", block, K, tail); break;
    case RK_PROD: ok = red_pass(st, n, xt, &rowix, "acc", "1.0f", "%1$s * %2$s", "%1$s", NULL, "kf_seg_prod", block, K, tail); break;
    case RK_LOGSUMEXP:
    case RK_SOFTMAX:
    case RK_LOGSOFTMAX:
        ok = red_pass(st, n, xt, &rowix, "rmax", "-KF_INF", "KF_FMAX(%1$s, %2$s)", "%1$s", NULL, "kf_seg_max", block, K, tail) &&
             red_pass(st, n, xt, &rowix, "rsum", "0.0f", "%1$s + %2$s", "KF_EXP(%1$s - %2$s)", "rmax", bsum, block, K, tail);
        snprintf(m, NAMELEN, "rmax");
        snprintf(sum, NAMELEN, "rsum");
        break;
    case RK_LAYERNORM: {
        if (!epsilon_literal(st, n, eps, sizeof eps)) ok = false;
        ok = ok && red_pass(st, n, xt, &rowix, "rsum", "0.0f", "%1$s + %2$s", "%1$s", NULL, bsum, block, K, tail);
        if (ok) kf_cg_printf(&body, "        const float rmean = rsum / %s;\n", kf);
        ok = ok && red_pass(st, n, xt, &rowix, "rvar", "0.0f", "%1$s + %2$s", "(%1$s - %2$s) * (%1$s - %2$s)", "rmean", bsum, block, K, tail);
        if (ok) kf_cg_printf(&body, "        const float rstd = 1.0f / KF_SQRT(rvar / %s + %s);\n", kf, eps);
        snprintf(m, NAMELEN, "rmean");
        snprintf(sum, NAMELEN, "rstd");
        break;
    }
    case RK_RMSNORM: {
        if (!epsilon_literal(st, n, eps, sizeof eps)) ok = false;
        ok = ok && red_pass(st, n, xt, &rowix, "rsq", "0.0f", "%1$s + %2$s", "%1$s * %1$s", NULL, bsum, block, K, tail);
        if (ok) kf_cg_printf(&body, "        const float rstd = 1.0f / KF_SQRT(rsq / %s + %s);\n", kf, eps);
        snprintf(sum, NAMELEN, "rstd");
        break;
    }
    }
    /* the statistics as values: Reduce* gives its output at the row's index */
    ix outix = {.rank = ot->rank};
    snprintf(outix.lin, NAMELEN, "row");
    bool reduce_kind = st->rk <= RK_SUMSQ;
    if (ok && reduce_kind) {
        if (ot->rank == r)
            for (int d = 0; d < r; d++) snprintf(outix.c[d], NAMELEN, "%s", st->mask[d] ? "0" : rowix.c[d]);
        else
            for (int d = 0, o = 0; d < r && o < ot->rank; d++)
                if (!st->mask[d]) snprintf(outix.c[o++], NAMELEN, "%s", rowix.c[d]);
        char rhs[96], name[NAMELEN]; /* a KF_ call of two names */
        switch (st->rk) {
        case RK_MEAN: snprintf(rhs, sizeof rhs, "acc / %s", kf); break;
        case RK_L2: snprintf(rhs, sizeof rhs, "KF_SQRT(acc)"); break;
        case RK_LOGSUM: snprintf(rhs, sizeof rhs, "KF_LOG(acc)"); break;
        case RK_LOGSUMEXP: snprintf(rhs, sizeof rhs, "rmax + KF_LOG(rsum)"); break;
        default: snprintf(rhs, sizeof rhs, "acc"); break;
        }
        ok = define(st, n->out[0], name, rhs) && memo_add(st, n->out[0], &outix, name);
    } else if (ok) {
        snprintf(st->stat[0], NAMELEN, "%s", m);
        snprintf(st->stat[1], NAMELEN, "%s", sum);
        st->stats = true;
    }
    /* LayerNormalization's Mean and InvStdDev: the row statistics, on the
     * input's dims with the normalized ones set to 1 */
    kf_type stat_t = *xt;
    for (int d = 0; d < r; d++)
        if (st->mask[d]) stat_t.dims[d] = 1;
    bool ln_stats = false;
    if (ok && st->rk == RK_LAYERNORM) {
        ot = &stat_t;
        outix.rank = r;
        for (int d = 0; d < r; d++) snprintf(outix.c[d], NAMELEN, "%s", st->mask[d] ? "0" : rowix.c[d]);
        for (int j = 1; ok && j < 3 && j < n->nout; j++)
            if (n->out[j]) {
                kf_dtype dt = st->g->values[n->out[j]].type.dtype;
                if (dt != KF_DT_FLOAT) ok = fail(st, "node '%s': LayerNormalization statistics are %s", kf_node_label(n), kf_dtype_name(dt));
                else ok = memo_add(st, n->out[j], &outix, j == 1 ? "rmean" : "rstd");
                ln_stats = true;
            }
    }
    bool out_space = reduce_kind || ln_stats;
    /* outputs on the reduction's output space: one lane per row */
    bool any_in = false, any_out = false;
    const kf_node *chain[VIEW_CHAIN_MAX];
    /* an output with the output's element count but other dims (a Flatten
     * or Reshape after GlobalAveragePool) is written at the row's linear
     * index: the Reshape map meets the result's memo entry there */
#define ON_OUT_SPACE(t) (out_space && (same_dims(t, ot) || (!same_dims(t, xt) && numel_of(t) == numel_of(ot))))
    for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
        const kf_type *t = &st->g->values[st->k->outs[o].value].type;
        if (ON_OUT_SPACE(t)) any_out = true;
        else if (same_dims(t, xt) || view_chain(st, st->k->outs[o].value, xt, chain)) any_in = true;
        else ok = fail(st, "value '%s' spans neither the input nor the output of '%s' (not generated)",
                       st->g->values[st->k->outs[o].value].name, kf_node_label(n));
    }
    if (ok && any_out) {
        uint32_t mark = st->nmemo;
        if (block) {
            kf_cg_puts(&body, "        if (kf_on && kf_lane == 0) {\n");
            st->ind = "            ";
        }
        for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
            const kf_type *t = &st->g->values[st->k->outs[o].value].type;
            if (same_dims(t, ot)) ok = store(st, o, &outix);
            else if (ON_OUT_SPACE(t)) {
                ix tix;
                int len = view_chain(st, st->k->outs[o].value, ot, chain);
                if (len) {
                    /* the result seen through views (GlobalAveragePool's
                     * [N, C, 1, 1] transposed to [N, 1, 1, C]): the value
                     * before them at this row, carried forward */
                    char src[NAMELEN];
                    ok = emit(st, chain[len - 1]->in[0], &outix, src) && view_forward(st, chain, len, &outix, src, &tix) &&
                         store(st, o, &tix);
                } else {
                    reshape_ix(st, &outix, ot, t, &tix);
                    ok = store(st, o, &tix);
                }
            }
        }
        if (block) {
            kf_cg_puts(&body, "        }\n");
            /* names defined inside the lane-0 block end with it: a row-wide
             * output that reads one of them defines it again (fuzz finding
             * under NVRTC: 'v7' undefined in the row loop) */
            st->nmemo = mark;
        }
        st->ind = "        ";
    }
    if (ok && any_in && st->rc) { /* the epilogue over the lane's steps, from the registers */
        for (int i = 0; ok && i < rc.P; i++) {
            kf_cg_printf(&body, "        if (kf_ok%d) {\n", i);
            st->ind = "            ";
            st->vl = rc.vl[i];
            uint32_t mark = st->nmemo;
            for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
                const kf_type *t = &st->g->values[st->k->outs[o].value].type;
                if (ON_OUT_SPACE(t)) continue;
                if (same_dims(t, xt)) {
                    ok = store_lanes(st, o, rc.lanes[i]);
                    continue;
                }
                /* through views (below): a store per lane */
                int len = view_chain(st, st->k->outs[o].value, xt, chain);
                for (int l = 0; ok && l < rc.V; l++) {
                    ix full = rc.lanes[i][l], tix;
                    offset_of(st, xt, &full, full.lin);
                    char src[NAMELEN];
                    ok = emit(st, chain[len - 1]->in[0], &full, src) && view_forward(st, chain, len, &full, src, &tix) &&
                         store(st, o, &tix);
                }
            }
            st->nmemo = mark;
            kf_cg_puts(&body, "        }\n");
        }
        st->ind = "        ";
    } else if (ok && any_in) {
        if (block) seg_loop(st, K);
        else kf_cg_printf(&body, "        for (%s j = 0; j < %lld; j++) {\n", st->ity, (long long)K);
        st->ind = "            ";
        ix full = rowix;
        split_index(st, "j", xt, st->mask, true, "j", &full);
        if (tail) {
            char e[96]; /* "row * K + j" */
            snprintf(e, sizeof e, "row * %lld + j", (long long)K);
            bind(st, full.lin, e);
        }
        /* the linear index first when some output is a view: every value
         * remembered at this element then carries it */
        for (uint32_t o = 0; o < st->k->nouts && !full.lin[0]; o++)
            if (view_chain(st, st->k->outs[o].value, xt, chain)) offset_of(st, xt, &full, full.lin);
        for (uint32_t o = 0; ok && o < st->k->nouts; o++) {
            const kf_type *t = &st->g->values[st->k->outs[o].value].type;
            if (ON_OUT_SPACE(t)) continue;
            if (same_dims(t, xt)) {
                ok = store(st, o, &full);
                continue;
            }
            /* the input space seen through views (a LayerNorm's output
             * split per head, or transposed to sequence-first): the value
             * before them at this element first, remembered at `full` and
             * its linear index, which the inverse maps meet again */
            char src[NAMELEN];
            int len = view_chain(st, st->k->outs[o].value, xt, chain);
            ix tix;
            ok = emit(st, chain[len - 1]->in[0], &full, src) && view_forward(st, chain, len, &full, src, &tix) &&
                 store(st, o, &tix);
        }
#undef ON_OUT_SPACE
        kf_cg_puts(&body, "        }\n");
    }
    if (ok) {
        header(st, s, "reduction");
        if (block) {
            /* the segment and this lane's place in it (KF_CG_SEGMENT) */
            kf_cg_puts(s, "    KF_SHARED float kf_red[KF_MAX_BLOCK];\n");
            /* a segment of the largest size is the whole work-group (one row
             * per work-group, whatever its size): the segment arithmetic then
             * folds away once the launch's size is known */
            if (T >= KF_ROW_SEG_MAX) kf_cg_puts(s, "    const int kf_seg = KF_LOCAL_SIZE;\n");
            else if (T >= KF_ROW_SEG_MIN_WARP)
                kf_cg_printf(s, "    const int kf_seg = KF_LOCAL_SIZE < %u ? KF_LOCAL_SIZE : %u;\n", T, T);
            else /* a segment under a warp only where the prelude wants one */
                kf_cg_printf(s, "    const int kf_seg = !KF_SEG_NARROW ? 1 : KF_LOCAL_SIZE < %u ? KF_LOCAL_SIZE : %u;\n", T, T);
            kf_cg_puts(s, "    const int kf_nseg = KF_LOCAL_SIZE / kf_seg;\n"
                          "    const int kf_sid = KF_LOCAL_ID / kf_seg;\n"
                          "    const int kf_lane = KF_LOCAL_ID - kf_sid * kf_seg;\n");
            kf_cg_printf(s, "    for (%s row0 = (%s)KF_GROUP_ID * kf_nseg; row0 < %lld; row0 += (%s)KF_NUM_GROUPS * kf_nseg) {\n",
                         st->ity, st->ity, (long long)nrows, st->ity);
            kf_cg_printf(s, "        const %s row = row0 + kf_sid;\n", st->ity);
            kf_cg_printf(s, "        const int kf_on = kf_sid < kf_nseg && row < %lld;\n", (long long)nrows);
        } else
            kf_cg_printf(s, "    for (%s row = (%s)KF_GLOBAL_ID; row < %lld; row += (%s)KF_GLOBAL_SIZE) {\n", st->ity,
                         st->ity, (long long)nrows, st->ity);
        kf_cg_puts(s, body.p ? body.p : "");
        kf_cg_puts(s, "    }\n}\n");
    }
    st->vl.V = 0;
    st->rc = NULL;
    if (body.oom) s->oom = true;
    kf_cg_str_release(&body);
    return ok;
}

/* The end of a one-work-item-per-output kernel (direct convolution,
 * pooling window): when ok, the header and a grid-stride loop of `items`
 * around `body`; releases body. Returns ok. */
static bool per_item_kernel(gen *st, kf_cg_str *s, bool ok, const char *what, int64_t items, kf_cg_str *body) {
    const char *I = st->ity;
    if (ok) {
        header(st, s, what);
        kf_cg_printf(s, "    for (%s w = (%s)KF_GLOBAL_ID; w < %lld; w += (%s)KF_GLOBAL_SIZE) {\n", I, I, (long long)items, I);
        kf_cg_puts(s, body->p ? body->p : "");
        kf_cg_puts(s, "    }\n}\n");
    }
    if (body->oom) s->oom = true;
    kf_cg_str_release(body);
    return ok;
}

/* anchor groups: tiled GEMM and direct convolution (cg_anchor.c), and the
 * window kernel of a pooling node (cg_pool.c); both use this file's static
 * emitter */
#define KF_CG_ANCHOR_IMPL
#include "cg_anchor.c"
#include "cg_pool.c"

/* ---- entry points ---------------------------------------------------------- */

static void set_param(kf_cg_param *pr, const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    pr->value = v;
    pr->dtype = t->dtype;
    pr->rank = t->rank;
    pr->numel = 1;
    for (int d = 0; d < t->rank; d++) {
        pr->dims[d] = t->dims[d];
        pr->numel *= t->dims[d];
    }
}

void kf_cg_kernel_release(kf_cg_kernel *k) {
    kf_free(k->checks);
    kf_free(k->name);
    kf_free(k->body);
    kf_free(k->ins);
    kf_free(k->outs);
    *k = (kf_cg_kernel){0};
}

/* Writes group gi's kernel into k. KF_OK; KF_ERR_UNSUPPORTED with the
 * reason in why (no kf_fail: kf_cg_unsupported is a question); or
 * KF_ERR_NOMEM. On error k is released. */
/* True when text[0..len) holds identifier id as a whole token. */
static bool has_token(const char *text, size_t len, const char *id, size_t idlen) {
    for (size_t i = 0; i + idlen <= len; i++) {
        if (text[i] != id[0] || strncmp(text + i, id, idlen)) continue;
        bool start = i == 0 || !(isalnum((unsigned char)text[i - 1]) || text[i - 1] == '_');
        bool end = i + idlen == len || !(isalnum((unsigned char)text[i + idlen]) || text[i + idlen] == '_');
        if (start && end) return true;
    }
    return false;
}

/* Drops the integer index temporaries the body declares and never reads
 * ("const int t3 = t0 / 1024;" when only some coordinates of an unravelled
 * index are used): the index maps name every coordinate, the kernel needs a
 * few. Only whole lines "const int|kf_i64 NAME = EXPR;" with no comma go;
 * repeated until none is left, since dropping one may orphan the one it
 * read. In place; the text only shrinks. Readability of the generated
 * kernel (and no unused-variable warnings from nvcc on emitted files). */
static void drop_unread_ints(char *body) {
    for (bool again = true; again;) {
        again = false;
        size_t len = strlen(body);
        for (char *line = body; *line;) {
            char *nl = strchr(line, '\n');
            char *end = nl ? nl + 1 : line + strlen(line);
            const char *q = line;
            while (*q == ' ') q++;
            size_t skip = !strncmp(q, "const int ", 10) ? 10 : !strncmp(q, "const kf_i64 ", 13) ? 13 : 0;
            const char *name = q + skip, *ne = name;
            while (skip && (isalnum((unsigned char)*ne) || *ne == '_')) ne++;
            bool decl = skip && ne > name && !strncmp(ne, " = ", 3) && !memchr(line, ',', (size_t)(end - line)) &&
                        end - line >= 2 && end[nl ? -2 : -1] == ';';
            if (decl) {
                /* is the name read anywhere but its own declaration? */
                size_t before = (size_t)(line - body), after = len - (size_t)(end - body);
                size_t idlen = (size_t)(ne - name);
                if (!has_token(body, before, name, idlen) && !has_token(end, after, name, idlen)) {
                    memmove(line, end, after + 1);
                    len -= (size_t)(end - line);
                    again = true;
                    continue;
                }
            }
            line = end;
        }
    }
}

static kf_status build(const kf_model *m, const kf_plan *p, uint32_t gi, kf_cg_kernel *k, char *why, size_t whylen) {
    *k = (kf_cg_kernel){0};
    if (gi >= p->ngroups) {
        snprintf(why, whylen, "no group %u", gi);
        return KF_ERR_UNSUPPORTED;
    }
    const kf_group *g = &p->groups[gi];
    const kf_graph *gr = m->graph;
    const char *r = kind_reason(g->kind);
    if (r) {
        snprintf(why, whylen, "%s", r);
        return KF_ERR_UNSUPPORTED;
    }
    if (!g->noutputs || !g->nnodes) {
        snprintf(why, whylen, "group writes nothing");
        return KF_ERR_UNSUPPORTED;
    }
    if (g->kind == KF_GROUP_OPAQUE) {
        const kf_node *n = &gr->nodes[g->nodes[0]];
        if (g->nnodes != 1 || !opaque_has_kernel(n)) {
            snprintf(why, whylen, "node '%s': opaque op %s is not generated (it runs on the reference evaluator)",
                     kf_node_label(n), n->op_type);
            return KF_ERR_UNSUPPORTED;
        }
    }
    for (uint32_t o = 0; o < g->noutputs; o++) {
        const kf_value *v = &gr->values[g->outputs[o]];
        if (!kf_type_is_static(&v->type)) {
            snprintf(why, whylen, "value '%s' has a symbolic or unknown shape: kernels are generated per static shape",
                     v->name);
            return KF_ERR_UNSUPPORTED;
        }
        if (!dtype_ok(v->type.dtype)) {
            snprintf(why, whylen, "value '%s' is %s: " DTYPES_OK, v->name,
                     kf_dtype_name(v->type.dtype));
            return KF_ERR_UNSUPPORTED;
        }
    }
    const kf_node *red = NULL;
    if (g->kind == KF_GROUP_REDUCTION) {
        for (uint32_t j = 0; j < g->nnodes; j++) {
            const kf_node *n = &gr->nodes[g->nodes[j]];
            const kf_op_info *oi = kf_op_get(n->op);
            if (oi && oi->fclass == KF_FC_REDUCTION) red = n;
        }
        if (!red) {
            snprintf(why, whylen, "reduction group without a reduction node");
            return KF_ERR_UNSUPPORTED;
        }
    }
    /* every element count (and a few multiples of it: bytes, nrows x block)
     * must fit int64: shapes from a hostile model may not (fuzz finding).
     * A zero dim is counted as 1: the strides of an empty value are still
     * products of its other dims (fuzz finding). */
    for (uint32_t j = 0; j <= g->nnodes; j++) {
        const kf_id *vs = j < g->nnodes ? gr->nodes[g->nodes[j]].out : g->inputs;
        uint32_t nvs = j < g->nnodes ? (uint32_t)gr->nodes[g->nodes[j]].nout : g->ninputs;
        for (uint32_t i = 0; i < nvs; i++) {
            if (!vs[i]) continue;
            const kf_type *t = &gr->values[vs[i]].type;
            int64_t count = 1;
            bool fits = true, unknown = false; /* unknown dims are declined later, with their own reason */
            for (int d = 0; fits && !unknown && d < t->rank; d++)
                if (t->dims[d] < 0) unknown = true;
                else fits = kf_mul_ok(count, t->dims[d] ? t->dims[d] : 1, &count);
            if (!unknown && (!fits || count > INT64_MAX / 1024)) {
                snprintf(why, whylen, "value '%s': element count does not fit 64-bit index math (not generated)",
                         gr->values[vs[i]].name);
                return KF_ERR_UNSUPPORTED;
            }
        }
    }
    if (g->ninputs + g->noutputs > KF_CG_MAX_PARAMS) {
        snprintf(why, whylen, "a kernel of %u buffers: more than %d parameters (not generated)",
                 g->ninputs + g->noutputs, KF_CG_MAX_PARAMS);
        return KF_ERR_UNSUPPORTED;
    }
    uint32_t nv = g->ninputs;
    for (uint32_t j = 0; j < g->nnodes; j++) nv += (uint32_t)gr->nodes[g->nodes[j]].nout;
    kf_id *vals = kf_calloc((size_t)nv + 1, sizeof *vals);
    uint32_t *uses = kf_calloc((size_t)nv + 1, sizeof *uses);
    k->name = kf_strdup("kf_ew");
    k->ins = kf_calloc(g->ninputs + 1, sizeof *k->ins);
    k->outs = kf_calloc(g->noutputs, sizeof *k->outs);
    if (!vals || !uses || !k->name || !k->ins || !k->outs) {
        kf_free(vals);
        kf_free(uses);
        kf_cg_kernel_release(k);
        return KF_ERR_NOMEM;
    }
    gen st = {.m = m, .g = gr, .p = p, .gi = gi, .grp = g, .k = k, .ity = "int", .vals = vals, .uses = uses,
              .red = red, .why = why, .whylen = whylen};
    for (uint32_t i = 0; i < g->ninputs; i++) {
        set_param(&k->ins[i], gr, g->inputs[i]);
        vals[st.nvals++] = g->inputs[i];
    }
    for (uint32_t j = 0; j < g->nnodes; j++) {
        const kf_node *n = &gr->nodes[g->nodes[j]];
        for (int o = 0; o < n->nout; o++) vals[st.nvals++] = n->out[o];
    }
    for (uint32_t o = 0; o < g->noutputs; o++) set_param(&k->outs[o], gr, g->outputs[o]);
    k->nins = g->ninputs;
    k->nouts = g->noutputs;
    k->numel = k->outs[0].numel;
    /* 32-bit indices are cheaper on GPUs; 64-bit only when a buffer needs them
     * (/2: i += global size must not overflow) */
    for (uint32_t i = 0; i < k->nins; i++)
        if (k->ins[i].numel > INT32_MAX / 2) st.ity = "kf_i64";
    for (uint32_t o = 0; o < k->nouts; o++)
        if (k->outs[o].numel > INT32_MAX / 2) st.ity = "kf_i64";
    kf_cg_str s = {0};
    bool ok = g->kind == KF_GROUP_ANCHOR ? gen_anchor(&st, &s)
              : g->kind == KF_GROUP_OPAQUE ? gen_pool(&st, &s)
              : red                      ? gen_reduction(&st, &s, red)
                                         : gen_elementwise(&st, &s);
    if (red && k->numel > INT32_MAX / 2 && !strcmp(st.ity, "int")) {
        snprintf(why, whylen, "reduction launch of %lld work-items needs 64-bit indices (not generated)", (long long)k->numel);
        ok = false;
    }
    kf_free(st.memo);
    kf_free(vals);
    kf_free(uses);
    kf_status rc = KF_OK;
    if (!ok) rc = st.oom ? KF_ERR_NOMEM : KF_ERR_UNSUPPORTED;
    else if (!(k->body = kf_cg_take(&s))) rc = KF_ERR_NOMEM;
    else drop_unread_ints(k->body);
    kf_cg_str_release(&s);
    if (rc) kf_cg_kernel_release(k);
    return rc;
}

/* The float8 part (KF_CG_PART_F8). A float8 element is one byte in memory
 * and a float in registers, which holds every float8 value exactly. A
 * format is its mantissa bits m, exponent bias b and how it spells its
 * special values k (0: FN, no Inf, NaN S.1111.111; 1: IEEE, Inf and NaN at
 * the top exponent; 2: FNUZ, no Inf, no -0, NaN 0x80). kf_f8_enc rounds to
 * nearest even and saturates (sat) or overflows to NaN/Inf as Cast and
 * QuantizeLinear specify: the same function as graph/dtype_small.c. */
static const char f8_part[] =
    "KF_F8_FUNC float kf_f8_dec(unsigned c, int m, int b, int k) {\n"
    "    const unsigned s = (c & 128u) << 24, e = (c & 127u) >> m, f = c & ((1u << m) - 1u);\n"
    "    if (k == 2 && c == 128u) return KF_F8_AS_FLOAT(0x7fc00000u); /* FNUZ's one NaN has no sign */\n"
    "    if (k == 0 && (c & 127u) == 127u) return KF_F8_AS_FLOAT(s | 0x7fc00000u);\n"
    "    if (k == 1 && e == 127u >> m) return KF_F8_AS_FLOAT(s | (f ? 0x7fc00000u : 0x7f800000u));\n"
    "    if (e) return KF_F8_AS_FLOAT(s | (e + 127u - (unsigned)b) << 23 | f << (23 - m));\n"
    "    return KF_F8_AS_FLOAT(s | KF_F8_AS_UINT((float)f * KF_F8_AS_FLOAT((unsigned)(128 - b - m) << 23)));\n"
    "}\n"
    "KF_F8_FUNC unsigned kf_f8_enc(float x, int sat, int m, int b, int k) {\n"
    "    const unsigned u = KF_F8_AS_UINT(x), s = (u >> 24) & 128u, a = u & 0x7fffffffu, top = 127u >> m << m;\n"
    "    const unsigned maxc = k == 0 ? 126u : k == 1 ? top - 1u : 127u;\n"
    "    if (a > 0x7f800000u) return k == 0 ? s | 127u : k == 1 ? s | top | 1u << (m - 1) : 128u;\n"
    "    unsigned c;\n"
    "    if (a >= 0x7f800000u) c = 255u;\n"
    "    else if (a >= (unsigned)(128 - b) << 23) /* normal: the top m mantissa bits, rounded */\n"
    "        c = ((a + (1u << (22 - m)) - 1u + ((a >> (23 - m)) & 1u)) >> (23 - m)) - ((unsigned)(127 - b) << m);\n"
    "    else /* subnormal: multiples of 2^(1 - b - m) */\n"
    "        c = (unsigned)KF_RINT(KF_F8_AS_FLOAT(a) * KF_F8_AS_FLOAT((unsigned)(126 + b + m) << 23));\n"
    "    if (c > maxc) return sat ? s | maxc : k == 0 ? s | 127u : k == 1 ? s | top : 128u;\n"
    "    return c == 0u && k == 2 ? 0u : s | c;\n"
    "}\n"
    "#define KF_E4M3FN 3, 7, 0\n"
    "#define KF_E4M3FNUZ 3, 8, 2\n"
    "#define KF_E5M2 2, 15, 1\n"
    "#define KF_E5M2FNUZ 2, 16, 2\n"
    "#define KF_LOAD_F8(p, i, fmt) kf_f8_dec((p)[i], fmt)\n"
    "#define KF_STORE_F8(p, i, v, fmt) ((p)[i] = (unsigned char)kf_f8_enc((v), 0, fmt))\n"
    "#define KF_ROUND_F8(x, sat, fmt) kf_f8_dec(kf_f8_enc((x), (sat), fmt), fmt)\n";

/* The float4 part (KF_CG_PART_F4): E2M1, one byte a value holding the code
 * in its low four bits (graph/dtype_small.c unpacks so), sign in bit 3.
 * The eight magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6; a float rounds to
 * the nearest (ties to the even code: each comparison below is strict where
 * the tie goes down) and saturates at 6 (the format has no Inf and no NaN;
 * NaN becomes -0 for a positive NaN and +0 for a negative one, as the
 * reference, which follows ml_dtypes). */
static const char f4_part[] =
    "KF_F8_FUNC float kf_f4_dec(unsigned c) {\n"
    "    const unsigned e = (c >> 1) & 3u, f = c & 1u;\n"
    "    const float a = e ? (float)(2u + f) * KF_F8_AS_FLOAT((unsigned)(125 + e) << 23) : (float)f * 0.5f;\n"
    "    return (c & 8u) ? -a : a;\n"
    "}\n"
    "KF_F8_FUNC unsigned kf_f4_enc(float x) {\n"
    "    const unsigned s = (KF_F8_AS_UINT(x) >> 28) & 8u;\n"
    "    if (KF_ISNAN(x)) return s ^ 8u;\n"
    "    const float a = KF_F8_AS_FLOAT(KF_F8_AS_UINT(x) & 0x7fffffffu);\n"
    "    return s | (unsigned)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +\n"
    "                          (a > 5.0f));\n"
    "}\n"
    "#define KF_E2M1 0\n"
    "#define KF_LOAD_F4(p, i, fmt) kf_f4_dec((p)[i])\n"
    "#define KF_STORE_F4(p, i, v, fmt) ((p)[i] = (unsigned char)kf_f4_enc(v))\n"
    "#define KF_ROUND_F4(x, sat, fmt) kf_f4_dec(kf_f4_enc(x))\n";

/* The float8 tile product (KF_CG_PART_F8MMA, after the float8 part):
 * C[16][8] (float) += A[16][32] B[32][8] of float8 codes packed four k to
 * a word as the integer tile's KF_MMA_I8 packs int8 (same fragments), A in
 * format FA (PTX name TA), B in FB (TB). CUDA sm_89 and later: one
 * mma.sync m16n8k32 of E4M3/E5M2 operands (sm_90 has no float8 mma.sync:
 * ptxas unpacks the codes to float16 for its float16 tensor cores);
 * elsewhere (OpenCL, older CUDA architectures) the twin decodes each code
 * and adds the products in k order. Every product of two float8 values is
 * exact in float; the sums may differ in their last bits (the tensor
 * cores' order and accumulator precision are their own). */
static const char f8mma_part[] =
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890\n"
    "#define KF_MMA_F8(c, A, ao, lda, B, bo, ldb, lane, TA, TB, FA, FB) { \\\n"
    "    const int *a_ = (A) + (ao) + ((lane) >> 2) * (lda) + ((lane) & 3); \\\n"
    "    const int *b_ = (B) + (bo) + ((lane) >> 2) * (ldb) + ((lane) & 3); \\\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k32.row.col.f32.\" TA \".\" TB \".f32 \" \\\n"
    "                 \"{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" \\\n"
    "                 : \"+f\"((c)[0]), \"+f\"((c)[1]), \"+f\"((c)[2]), \"+f\"((c)[3]) \\\n"
    "                 : \"r\"(a_[0]), \"r\"(a_[8 * (lda)]), \"r\"(a_[4]), \"r\"(a_[8 * (lda) + 4]), \\\n"
    "                   \"r\"(b_[0]), \"r\"(b_[4])); }\n"
    "#else\n"
    "#define KF_MMA_F8(c, A, ao, lda, B, bo, ldb, lane, TA, TB, FA, FB) { \\\n"
    "    const int g_ = (lane) >> 2, t_ = ((lane) & 3) * 2; \\\n"
    "    for (int w_ = 0; w_ < 8; w_++) { \\\n"
    "        const unsigned a0_ = (unsigned)(A)[(ao) + g_ * (lda) + w_], a1_ = (unsigned)(A)[(ao) + (g_ + 8) * (lda) + w_]; \\\n"
    "        const unsigned b0_ = (unsigned)(B)[(bo) + t_ * (ldb) + w_], b1_ = (unsigned)(B)[(bo) + (t_ + 1) * (ldb) + w_]; \\\n"
    "        for (int j_ = 0; j_ < 32; j_ += 8) { \\\n"
    "            const float x0_ = kf_f8_dec((a0_ >> j_) & 255u, FA), x1_ = kf_f8_dec((a1_ >> j_) & 255u, FA); \\\n"
    "            const float y0_ = kf_f8_dec((b0_ >> j_) & 255u, FB), y1_ = kf_f8_dec((b1_ >> j_) & 255u, FB); \\\n"
    "            (c)[0] += x0_ * y0_; (c)[1] += x0_ * y1_; (c)[2] += x1_ * y0_; (c)[3] += x1_ * y1_; \\\n"
    "        } \\\n"
    "    } }\n"
    "#endif\n";

/* The optional parts a kernel uses, after the prelude. The float8 part
 * comes first, its text the same whether float4 follows or not. */
static void prelude_parts(kf_cg_target t, uint32_t parts, kf_cg_str *s) {
    static const struct {
        uint32_t bit;
        const char *title, *text;
    } table[] = {{KF_CG_PART_F8, "float8", f8_part},
                 {KF_CG_PART_F4, "float4", f4_part},
                 {KF_CG_PART_F8MMA, "float8 tile products", f8mma_part}};
    bool helpers = false; /* KF_F8_FUNC and the bit casts, which both parts use */
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!(parts & table[i].bit)) continue;
        kf_cg_printf(s, "/* kfuse prelude part: %s storage */\n", table[i].title);
        if (!helpers && t == KF_CG_CUDA)
            kf_cg_puts(s, "#define KF_F8_FUNC __device__ inline\n"
                          "#define KF_F8_AS_FLOAT(u) __uint_as_float(u)\n"
                          "#define KF_F8_AS_UINT(f) __float_as_uint(f)\n");
        else if (!helpers)
            kf_cg_puts(s, "#define KF_F8_FUNC\n"
                          "#define KF_F8_AS_FLOAT(u) as_float(u)\n"
                          "#define KF_F8_AS_UINT(f) as_uint(f)\n");
        helpers = true;
        kf_cg_puts(s, table[i].text);
        kf_cg_puts(s, "\n");
    }
}

const char *kf_cg_unsupported(const kf_model *m, const kf_plan *p, uint32_t gi, char *why, size_t whylen) {
    kf_cg_kernel k;
    char buf[512]; /* a reason names one node or value */
    kf_status st = build(m, p, gi, &k, buf, sizeof buf);
    if (st == KF_OK) {
        kf_cg_kernel_release(&k);
        return NULL;
    }
    snprintf(why, whylen, "%s", st == KF_ERR_NOMEM ? "out of memory generating the kernel" : buf);
    return why;
}

kf_status kf_cg_group(const kf_model *m, const kf_plan *p, uint32_t gi, kf_cg_kernel *k) {
    char why[512]; /* a reason names one node or value */
    kf_status st = build(m, p, gi, k, why, sizeof why);
    if (st == KF_ERR_NOMEM) return kf_fail(KF_ERR_NOMEM, "out of memory generating group %u", gi);
    if (st) return kf_fail(KF_ERR_UNSUPPORTED, "group %u: %s", gi, why);
    return KF_OK;
}

kf_status kf_cg_source(const kf_cg_kernel *k, kf_cg_target t, char **text) {
    kf_cg_str s = {0};
    kf_cg_prelude(t, &s);
    prelude_parts(t, k->parts, &s);
    kf_cg_puts(&s, k->body);
    *text = kf_cg_take(&s);
    return *text ? KF_OK : kf_fail(KF_ERR_NOMEM, "out of memory writing a kernel source");
}
