/*
 * kf_tensor.h: dtypes, dense tensors and static/symbolic tensor types.
 * A kf_tensor owns its data. A kf_type is what shape inference knows about a
 * value before it runs: dtype, rank and dims, each maybe unknown or symbolic.
 */
#ifndef KF_TENSOR_H
#define KF_TENSOR_H

#include "kf_base.h"

/* Numbers equal ONNX TensorProto.DataType, so they never shift. */
typedef enum kf_dtype {
    KF_DT_UNDEFINED = 0,
    KF_DT_FLOAT = 1,
    KF_DT_UINT8 = 2,
    KF_DT_INT8 = 3,
    KF_DT_UINT16 = 4,
    KF_DT_INT16 = 5,
    KF_DT_INT32 = 6,
    KF_DT_INT64 = 7,
    KF_DT_STRING = 8,
    KF_DT_BOOL = 9,
    KF_DT_FLOAT16 = 10,
    KF_DT_DOUBLE = 11,
    KF_DT_UINT32 = 12,
    KF_DT_UINT64 = 13,
    KF_DT_COMPLEX64 = 14,
    KF_DT_COMPLEX128 = 15,
    KF_DT_BFLOAT16 = 16,
    /* storage types of quantized and microscaled models (dtype_small.c):
     * one byte per element in memory, packed below 8 bits in files */
    KF_DT_FLOAT8E4M3FN = 17,
    KF_DT_FLOAT8E4M3FNUZ = 18,
    KF_DT_FLOAT8E5M2 = 19,
    KF_DT_FLOAT8E5M2FNUZ = 20,
    KF_DT_UINT4 = 21,
    KF_DT_INT4 = 22,
    KF_DT_FLOAT4E2M1 = 23,
    KF_DT_FLOAT8E8M0 = 24,
    KF_DT_UINT2 = 25,
    KF_DT_INT2 = 26,
    KF_DT_FLOAT6E2M3 = 27,
    KF_DT_FLOAT6E3M2 = 28,
    KF_DT_COUNT_ = 29
} kf_dtype;

/* A string element: bytes, not necessarily NUL-terminated (ONNX strings are
 * byte strings). ptr is owned by the tensor; NUL is appended for convenience. */
typedef struct kf_bytes {
    char *ptr;
    size_t len;
} kf_bytes;

typedef struct kf_tensor {
    kf_dtype dtype;
    int rank;
    int64_t dims[KF_MAX_RANK];
    int64_t numel;
    void *data; /* owned; numel * elem size bytes; kf_bytes[] for strings */
    /* bytes not assembled yet (tensor_parts.c): when set, data is NULL and
     * the contents are these parts side by side along one axis */
    struct kf_tensor_parts *parts;
} kf_tensor;

/* What inference knows of a value. rank -1: unknown rank. dims[i] -1:
 * unknown; syms[i] != 0 names it (graph symbol id) so equal names unify. */
typedef struct kf_type {
    kf_dtype dtype;
    int rank;
    int64_t dims[KF_MAX_RANK];
    uint32_t syms[KF_MAX_RANK];
} kf_type;

/* Size in bytes of one element; 0 for undefined/unknown dtypes. */
size_t kf_dtype_size(kf_dtype dt);
/* ONNX spelling ("float", "int64", ...); "?" for unknown numbers. */
const char *kf_dtype_name(kf_dtype dt);
bool kf_dtype_valid(int dt);
bool kf_dtype_is_float(kf_dtype dt); /* float16/bfloat16/float/double */
bool kf_dtype_is_int(kf_dtype dt);   /* signed or unsigned integer, not bool */
bool kf_dtype_is_signed(kf_dtype dt);

/* Element count of a shape; fails with KF_ERR_BAD_MODEL on negative dims,
 * overflow, or a total over KF_MAX_TENSOR_BYTES for element size esz. */
kf_status kf_shape_numel(int rank, const int64_t *dims, size_t esz, int64_t *numel);

/* (Re)initialises t as a zero-filled tensor of the given shape. Any old data
 * of t is freed first. Errors: bad shape (see kf_shape_numel), out of memory.
 * On failure t is left empty (data NULL, numel 0). */
/* Hints that the fresh allocation p of the given bytes, about to be written
 * whole, be backed by 2 MiB pages where the kernel offers them (nothing for
 * allocations under 4 MiB). */
void kf_advise_huge(void *p, size_t bytes);
kf_status kf_tensor_alloc(kf_tensor *t, kf_dtype dt, int rank, const int64_t *dims);
/* Frees data (and string elements); leaves t empty but reusable. */
void kf_tensor_release(kf_tensor *t);
/* Deep copy into dst (released first). */
kf_status kf_tensor_copy(kf_tensor *dst, const kf_tensor *src);
/* Heap-allocated empty tensor / destroy (release + free). */
kf_tensor *kf_tensor_new(void);
void kf_tensor_free(kf_tensor *t);
/* Moves src into dst (dst released first); src is left empty. */
void kf_tensor_move(kf_tensor *dst, kf_tensor *src);

/* Element access by linear index, converting through double or int64.
 * Strings: get returns 0, set is a no-op. Booleans read as 0/1 and store
 * v != 0. Float->int set truncates toward zero (like C casts) with saturation
 * instead of undefined behaviour; NaN stores 0. */
double kf_get_f64(const kf_tensor *t, int64_t i);
int64_t kf_get_i64(const kf_tensor *t, int64_t i);
uint64_t kf_get_u64(const kf_tensor *t, int64_t i);
void kf_set_f64(kf_tensor *t, int64_t i, double v);
void kf_set_i64(kf_tensor *t, int64_t i, int64_t v);
void kf_set_u64(kf_tensor *t, int64_t i, uint64_t v);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float kf_half_to_float(uint16_t h);
uint16_t kf_float_to_half(float f);
float kf_bf16_to_float(uint16_t h);
uint16_t kf_float_to_bf16(float f);

/* ---- storage types narrower than 16 bits (dtype_small.c) ----------------
 * float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), float6, float4, int4,
 * uint4, int2, uint2. In memory: one byte per element, the bit code for
 * floats, the value (sign-extended) for integers. In files: packed LSB
 * first below 8 bits (two 4-bit, four 2-bit, four 6-bit in three bytes). */

/* True for the types above (dtypes 17 and up). */
bool kf_dtype_is_small(kf_dtype dt);
/* True for the small float types (float8, float6, float4). */
bool kf_dtype_is_small_float(kf_dtype dt);
/* Bits per element in a file (8 * size for the other types). */
int kf_dtype_bits(kf_dtype dt);
/* Bytes numel elements take packed in a file (raw_data). */
size_t kf_dtype_packed_bytes(kf_dtype dt, int64_t numel);
/* File bytes <-> one byte per element; out/mem hold kf_dtype_packed_bytes /
 * n bytes. Unused high bits of the last packed byte are written as zero. */
void kf_pack_small(kf_dtype dt, const uint8_t *mem, int64_t n, uint8_t *out);
void kf_unpack_small(kf_dtype dt, const uint8_t *in, int64_t n, uint8_t *mem);
/* The value of an element (NaN, +-Inf where the type has them). */
double kf_small_to_f64(kf_dtype dt, uint8_t code);
/* Rounding of float8 E8M0 (Cast's round_mode): up (away from zero), down,
 * nearest (ties up). */
typedef enum { KF_E8M0_UP, KF_E8M0_DOWN, KF_E8M0_NEAREST } kf_e8m0_round;
/* x as an element of a small type, as ONNX Cast converts: floats round to
 * nearest even; out of range gives the largest finite value when saturate,
 * else NaN or Inf as the type has them (float4/float6 always saturate);
 * E8M0 rounds up; integers truncate toward zero, and out-of-range values
 * (undefined in the spec) give 0 as ONNX's reference does. */
uint8_t kf_f64_to_small(kf_dtype dt, double x, bool saturate);
uint8_t kf_f32_to_e8m0(float x, bool saturate, kf_e8m0_round mode);
/* An integer as an element: small integers keep the low bits (wrap, as
 * Cast between integer types); small floats convert the value saturating. */
uint8_t kf_i64_to_small(kf_dtype dt, int64_t v);

/* ---- deferred concatenation (tensor_parts.c) ----------------------------
 * A tensor may hold its contents as parts not yet put side by side: the
 * optimizer's merge of sibling weights writes a large concatenation only
 * where the bytes are needed, which for `kfuse opt` is straight into the
 * output file. Such a tensor has data NULL; element access (kf_get_*),
 * kf_tensor_copy, kf_tensor_equal and the model writer read the parts; any
 * other reader of data calls kf_tensor_settle first. Nothing sets elements
 * of a deferred tensor. */
typedef struct kf_tensor_parts {
    int axis;          /* the tensor is the parts concatenated along it */
    int n;
    bool owned;        /* false: the parts' data is borrowed (kf_tensor_adopt_parts) */
    kf_tensor part[];  /* same dtype and rank, dims equal but along axis */
} kf_tensor_parts;

/* Makes t (released first) the concatenation of parts[0..n) along axis
 * without copying. t borrows the parts' data until kf_tensor_adopt_parts,
 * so they must stay as they are until then. A part that is itself deferred
 * is settled first. Errors: parts that do not concatenate (KF_ERR_SHAPE),
 * strings or packed small types (KF_ERR_UNSUPPORTED), out of memory. */
kf_status kf_tensor_concat_deferred(kf_tensor *t, kf_tensor *const *parts, int n, int axis);
/* t takes over the data it borrows from parts (the same tensors, in the
 * same order, as kf_tensor_concat_deferred was given); each is left empty. */
void kf_tensor_adopt_parts(kf_tensor *t, kf_tensor *const *parts);
/* Assembles a deferred tensor's bytes into data (nothing for others). */
kf_status kf_tensor_settle(kf_tensor *t);
/* Calls emit with t's bytes in order, in runs as long as the layout allows
 * (one run for a tensor with data); stops at the first false, which it
 * returns. Strings are not bytes: false for them. */
bool kf_tensor_visit_bytes(const kf_tensor *t, bool (*emit)(void *ctx, const void *p, size_t n), void *ctx);
/* Frees what a deferred tensor holds (its parts' data when owned). */
void kf_tensor_parts_release(kf_tensor_parts *ps);
/* The part holding element i of deferred tensor t, *j its index there. */
const kf_tensor *kf_tensor_part_at(const kf_tensor *t, int64_t i, int64_t *j);

/* Row-major strides (in elements) of a shape. */
void kf_strides(int rank, const int64_t *dims, int64_t *strides);

/* Types: a fully unknown type, and a type describing a concrete tensor. */
void kf_type_unknown(kf_type *ty);
void kf_type_of_tensor(kf_type *ty, const kf_tensor *t);
/* True when rank and every dim are known. */
bool kf_type_is_static(const kf_type *ty);
/* True when both shapes are known to be equal: same rank, and each dim
 * equal or the same named symbol. Unknown dims never compare equal. */
bool kf_type_same_shape(const kf_type *a, const kf_type *b);

/* Equality of dtype, shape and every element bit (NaN payloads included);
 * used for round-trip tests. */
bool kf_tensor_equal(const kf_tensor *a, const kf_tensor *b);

#endif
