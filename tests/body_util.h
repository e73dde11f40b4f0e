/*
 * body_util.h: models with control-flow bodies (If branches, Loop and Scan
 * bodies) for tests. Graph text has no syntax for graph attributes, so a
 * model is written as text, turned into an ONNX ModelProto, and bodies
 * (themselves written as text) are attached to its nodes before it is
 * packed and loaded. Every proto here is malloc'ed, as protobuf-c frees
 * with free().
 */
#ifndef KF_BODY_UTIL_H
#define KF_BODY_UTIL_H

#include "graph_text.h"
#include "onnx.pb-c.h"

/* The ModelProto of a graph-text model (caller frees with
 * onnx__model_proto__free_unpacked(mp, NULL)). */
Onnx__ModelProto *bu_proto(const char *text);
/* A body written as graph text; the names in outer[0..nouter) are declared
 * as inputs there (graph text needs every name defined) and dropped here,
 * so the body reads them from the enclosing scope. */
Onnx__GraphProto *bu_body(const char *text, const char *const *outer, int nouter);
/* The first node with op_type (asserts there is one). */
Onnx__NodeProto *bu_node(Onnx__GraphProto *g, const char *op_type);
/* Attaches graph g (ownership moves) as attribute `name` of n. */
void bu_attach(Onnx__NodeProto *n, const char *name, Onnx__GraphProto *g);
void bu_attach_int(Onnx__NodeProto *n, const char *name, int64_t v);
void bu_attach_ints(Onnx__NodeProto *n, const char *name, int count, const int64_t *v);
/* Drops every node with op_type (a stand-in that kept an initializer written). */
void bu_drop_node(Onnx__GraphProto *g, const char *op_type);
/* Serialized bytes (malloc'ed) and their length. */
void *bu_pack(const Onnx__ModelProto *mp, size_t *len);
/* Packs and loads mp; asserts the load succeeds. */
kf_model *bu_load(const Onnx__ModelProto *mp);
/* Packs and loads mp; returns the status (the model, if any, is freed). */
kf_status bu_try_load(const Onnx__ModelProto *mp);

#endif
