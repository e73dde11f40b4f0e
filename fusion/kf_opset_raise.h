/*
 * kf_opset_raise.h: converting a model to a newer default-domain opset, so
 * a rewrite whose replacement needs a newer op (LayerNormalization 17, Gelu
 * 20) can apply to a model exported at an older opset.
 */
#ifndef KF_OPSET_RAISE_H
#define KF_OPSET_RAISE_H

#include "kf_ir.h"

/* Newest default-domain opset kf_model_raise_opset knows the changes up to. */
#define KF_RAISE_MAX_OPSET 23

/* Converts every node of the default ONNX domain in m to the semantics of
 * opset `target` (attributes that became inputs become constant inputs,
 * deprecated ops become their replacements, changed defaults are written
 * out), then raises the model's opset import (and its IR version when the
 * new opset needs a newer one). Nodes of other domains are left alone.
 *
 * All or nothing: every node is checked before the first edit. When some
 * node cannot be converted exactly (a change kfuse does not know how to
 * carry over, a subgraph, an op whose kfuse kernel does not cover `target`),
 * nothing changes, the result is KF_ERR_UNSUPPORTED and *why_not (may be
 * NULL) points at a message naming the first blocking node and op (thread-
 * local storage, valid until the next call). On success *why_not is NULL.
 * A model already at or above `target` is left as it is (KF_OK).
 * Other errors (out of memory) may leave the model partly converted. */
kf_status kf_model_raise_opset(kf_model *m, int64_t target, const char **why_not);
/* The same; infer_after false leaves the types as the conversion leaves
 * them, for a caller whose next step is kf_infer_shapes (the optimizer's
 * next round), which gives what inferring here as well would. */
kf_status kf_model_raise_opset_ex(kf_model *m, int64_t target, bool infer_after, const char **why_not);

#endif
