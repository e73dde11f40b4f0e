/*
 * onnx_scope.h: outer-scope values read by subgraph attributes (If
 * branches, Loop and Scan bodies), for graph/onnx.c only. Import records
 * them on the owning node (kf_node.ncap); export renames them inside the
 * bodies when a rewrite redirected a captured slot to another value.
 */
#ifndef KF_ONNX_SCOPE_H
#define KF_ONNX_SCOPE_H

#include "kf_ir.h"
#include "onnx.pb-c.h"

/* Finds every name the subgraph attributes of np (node nid of g, already
 * added) read without defining it, at any nesting depth, and records each
 * as a captured input of the node (kf_node_add_capture). A name that no
 * enclosing scope defines is KF_ERR_BAD_MODEL naming the node, the
 * attribute, the body node that reads it and the name. */
kf_status kf_onnx_node_captures(kf_graph *g, kf_id nid, const Onnx__NodeProto *np);

/* The names graph gp (or a graph nested in it) reads without gp defining
 * them, first reader first. *names is kf_malloc'ed (the caller frees it);
 * the strings point into gp. */
kf_status kf_onnx_outer_names(const Onnx__GraphProto *gp, const char ***names, uint32_t *n);

/* Renames, inside the graphs of attribute ap (of node nname), each reference
 * to from[k] that reaches the enclosing scope into to[k], all at once (a
 * swap stays a swap). A body that defines to[k] itself (the new name would
 * be shadowed) is KF_ERR_UNSUPPORTED naming it; the proto may then be
 * partly renamed, and the caller drops it. Strings are kf_malloc'ed (the
 * protobuf-c allocator of onnx.c frees with kf_free). */
kf_status kf_onnx_rename_captures(Onnx__AttributeProto *ap, const char *const *from, const char *const *to, int n,
                                  const char *nname);

#endif
