/*
 * ops_shape.h: helpers shared by the shape and layout ops (ops_shape*.c):
 * element copies that deep-copy strings, strided "view" copies that express
 * transpose/slice/expand/split/concat as one loop, and the step that turns
 * an op's own shape function into allocated outputs for its kernel.
 * Private to the ops_shape*.c files.
 */
#ifndef KF_OPS_SHAPE_H
#define KF_OPS_SHAPE_H

#include "kf_ref.h"

/* dst[j] = src[i] for any dtype; strings are deep-copied (dst's old string
 * is freed). dtypes must be equal. Fails only on out of memory. */
kf_status kf_layout_copy_elem(kf_tensor *dst, int64_t j, const kf_tensor *src, int64_t i);

/* Stores the empty string at dst[j] (a string tensor), freeing the old one. */
kf_status kf_layout_set_empty_string(kf_tensor *dst, int64_t j);

/* A strided copy: for every multi-index i over dims[0..rank),
 *   dst[doff + sum i_k*dstr[k]] = src[soff + sum i_k*sstr[k]]
 * Strides may be 0 (broadcast) or negative (reversed). rank may go up to
 * 2*KF_MAX_RANK (Tile views each dim as repeat x dim). The caller makes sure
 * every offset reached lies inside both tensors. */
#define KF_LAYOUT_MAX_VIEW_RANK (2 * KF_MAX_RANK)
typedef struct kf_layout_view {
    int rank;
    int64_t dims[KF_LAYOUT_MAX_VIEW_RANK];
    int64_t sstr[KF_LAYOUT_MAX_VIEW_RANK];
    int64_t dstr[KF_LAYOUT_MAX_VIEW_RANK];
    int64_t soff, doff;
} kf_layout_view;
kf_status kf_layout_copy_view(kf_tensor *dst, const kf_tensor *src, const kf_layout_view *v);

/* Runs shape function fn on the concrete inputs (types and values) and makes
 * sure each output j < nout whose slot is present is allocated with the
 * resulting type (kept when the driver already allocated it so). A result
 * that is not static is KF_ERR_INTERNAL: the kernels rely on their shape
 * function agreeing with them. */
kf_status kf_layout_prepare(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out, kf_shape_fn fn);

/* Reads an integer list given either as attribute `attr` (when attr is not
 * NULL and the node's opset is below `input_from`) or as input `idx` (value
 * in val[idx], NULL when unknown; in[idx] NULL when absent). Outcomes:
 *   KF_OK, *known true:  *vals (malloc'ed, caller frees, may be NULL when
 *                        *count is 0) holds the list, *present true
 *   KF_OK, *known false: list given but its value is not known yet
 *   KF_OK, *present false: neither attribute nor input given (*known true)
 * Malformed lists (non-integer or rank > 1 tensors) are KF_ERR_BAD_MODEL. */
kf_status kf_layout_int_list(const kf_node *n, int nin, const kf_type *const *in,
                             const kf_tensor *const *val, int idx, const char *attr, int64_t input_from, int64_t **vals,
                             int64_t *count, bool *present, bool *known);

/* The node's opset; an unknown (0) opset means the newest semantics. */
int64_t kf_layout_opset(const kf_node *n);

#endif
