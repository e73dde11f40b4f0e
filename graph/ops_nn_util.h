/*
 * ops_nn_util.h: helpers private to the nn-family reference kernels
 * (ops_nn_*.c): conv/pool window geometry from attributes, dense
 * double/int64 copies of tensors, the batched matrix-product core and
 * broadcasting of quantisation parameters. Nothing outside ops_nn_*.c uses it.
 */
#ifndef KF_OPS_NN_UTIL_H
#define KF_OPS_NN_UTIL_H

#include "kf_ref.h"

/* ---- errors ---------------------------------------------------------------- */

/* kf_fail with "node 'X' (Op): " in front of the message. */
kf_status kf_nn_fail(const kf_node *n, kf_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* True when dt is one of the listed dtypes (list ends with KF_DT_UNDEFINED). */
bool kf_nn_dtype_in(kf_dtype dt, const kf_dtype *list);
/* KF_ERR_SHAPE naming the node and input `what` unless dt is in list; an
 * unknown dtype (0) passes, so shape functions can call it on partial types. */
kf_status kf_nn_check_dtype(const kf_node *n, kf_dtype dt, const char *what, const kf_dtype *list);

extern const kf_dtype kf_nn_float_types[]; /* float16, bfloat16, float, double */
extern const kf_dtype kf_nn_q8_types[];    /* int8, uint8 */

/* ---- dense copies ------------------------------------------------------------ */

/* Malloc'ed copy of t's elements as double / as int64 (exact for every
 * integer dtype; uint64 wraps, which the modular integer kernels expect).
 * NULL with the error set on out of memory. Caller frees with kf_free. */
double *kf_nn_to_f64(const kf_tensor *t);
int64_t *kf_nn_to_i64(const kf_tensor *t);

/* ---- conv / pool window geometry -------------------------------------------- */

enum { KF_NN_NOTSET = 0, KF_NN_SAME_UPPER, KF_NN_SAME_LOWER, KF_NN_VALID };

typedef struct kf_nn_geom {
    int nsp;      /* spatial dims */
    int auto_pad; /* KF_NN_NOTSET ... */
    bool ceil_mode;
    int64_t in[KF_MAX_RANK]; /* input spatial dims; -1 unknown */
    int64_t kernel[KF_MAX_RANK];
    int64_t stride[KF_MAX_RANK];
    int64_t dil[KF_MAX_RANK];
    int64_t pb[KF_MAX_RANK]; /* padding before / after; final once out is known */
    int64_t pe[KF_MAX_RANK];
    int64_t out[KF_MAX_RANK]; /* output spatial dims; -1 unknown */
} kf_nn_geom;

/* Reads kernel_shape, strides, dilations, pads, auto_pad and ceil_mode of a
 * conv/pool node with nsp spatial dims into g (in/out left unknown).
 * wkernel: the kernel dims taken from W (entries -1 when unknown), or NULL
 * when kernel_shape is required (pools). use_dil/use_ceil: whether the op
 * version has those attributes (ignored otherwise). Bad attributes are
 * KF_ERR_BAD_MODEL naming the node. */
kf_status kf_nn_geom_parse(const kf_node *n, int nsp, const int64_t *wkernel, bool use_dil,
                           bool use_ceil, kf_nn_geom *g);
/* Output dims and final pads of a forward window op (conv, pools) from
 * g->in, following the ONNX formulas (auto_pad, ceil_mode; with ceil_mode a
 * window that would start in the end padding is dropped). Unknown input or
 * kernel dims give unknown outputs. A window larger than the padded input
 * is KF_ERR_SHAPE. */
kf_status kf_nn_geom_forward(const kf_node *n, kf_nn_geom *g);

/* Iterates a small N-d index space in row-major order ("odometer").
 * Returns false when idx wrapped around to all zeros. */
bool kf_nn_next(int rank, const int64_t *dims, int64_t *idx);

/* ---- matrix products ----------------------------------------------------------- */

/* C[M x N] += A[M x K] * B[K x N], operands addressed by row and column
 * strides (so transposes are free). Double and modular uint64 variants. */
void kf_nn_gemm_f64(int64_t M, int64_t N, int64_t K, const double *a, int64_t ars, int64_t acs,
                    const double *b, int64_t brs, int64_t bcs, double *c);
void kf_nn_gemm_u64(int64_t M, int64_t N, int64_t K, const uint64_t *a, int64_t ars, int64_t acs,
                    const uint64_t *b, int64_t brs, int64_t bcs, uint64_t *c);

/* numpy.matmul shape rule. a/b: input types; out receives the product's
 * type (dtype of a). KF_ERR_SHAPE when K differs or batch dims do not
 * broadcast. */
kf_status kf_nn_matmul_shape(const kf_node *n, const kf_type *a, const kf_type *b, kf_type *out);

/* Geometry of a numpy.matmul of concrete shapes: batch iteration and offsets. */
typedef struct kf_nn_mm {
    int64_t M, N, K;
    int brank; /* rank of the broadcast batch dims */
    int64_t bdims[KF_MAX_RANK];
    int64_t astr[KF_MAX_RANK], bstr[KF_MAX_RANK]; /* batch strides, 0 when broadcast */
    int64_t nbatch;
    kf_type out; /* output type (static) */
} kf_nn_mm;
kf_status kf_nn_mm_init(const kf_node *n, const kf_tensor *a, const kf_tensor *b, kf_nn_mm *mm);
/* Element offsets of batch `i` in A and B (in units of elements). */
void kf_nn_mm_batch(const kf_nn_mm *mm, int64_t i, int64_t *aoff, int64_t *boff);

/* ---- quantisation parameters --------------------------------------------------- */

/* Expands a quantisation parameter p (scale or zero point) over a target
 * shape into a malloc'ed array of target numel values (as double or int64):
 * p with one element is per tensor; a 1-D p whose length equals
 * dims[axis1d] (axis1d >= 0) applies along that axis; otherwise p must
 * broadcast to the target numpy-style. p NULL gives zeros. what names the
 * input in errors (KF_ERR_SHAPE). */
kf_status kf_nn_expand_param_f64(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                                 const int64_t *dims, int axis1d, double **out);
kf_status kf_nn_expand_param_i64(const kf_node *n, const kf_tensor *p, const char *what, int rank,
                                 const int64_t *dims, int axis1d, int64_t **out);

/* Round half to even (the ONNX quantisation rounding). */
double kf_nn_round_even(double v);
/* v as an element of float dtype dt holds it (float16 and bfloat16 through
 * float32, as numpy-style arithmetic that computes 16-bit types in float32
 * rounds them); other dtypes return v unchanged. Kernels that must agree
 * with the ONNX reference bit for bit in 16-bit types round after every
 * step it rounds. */
double kf_nn_round_to(kf_dtype dt, double v);
/* Softmax of x[0..n) in place, computed in dtype p the way ONNX's
 * reference computes it: max-shifted exponentials rounded to p, their sum
 * rounded to p, quotients rounded to p. bf16_step_sum: in bfloat16 the sum
 * rounds after every addition (numpy's sum of bfloat16 does, and the
 * Attention op's test data follow it); otherwise it accumulates in double
 * and rounds once, as ReduceSum does. masked_zero: a row of -inf gives
 * zeros (the Attention op's rule) instead of NaN (Softmax's). */
void kf_nn_softmax_row(kf_dtype p, double *x, int64_t n, bool masked_zero, bool bf16_step_sum);
/* Smallest/largest value of an integer dtype as double. */
void kf_nn_int_range(kf_dtype dt, double *lo, double *hi);

#endif
