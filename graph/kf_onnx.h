/*
 * kf_onnx.h: ONNX import and export (protobuf-c over the onnx.proto that
 * Debian's libonnx-dev installs). Import keeps everything it reads; what the
 * IR does not model (functions, training info, sparse initializers, graph
 * attributes of control-flow ops) is carried through to export unchanged.
 * Control-flow bodies are decoded into graphs of their own when the loader
 * checks them and when the evaluator runs them (kf_onnx_node_body).
 */
#ifndef KF_ONNX_H
#define KF_ONNX_H

#include "kf_ir.h"

/* Parses an ONNX model. dir: folder for external data (NULL forbids it);
 * what: the file name used in messages. On success *out is owned by the
 * caller (kf_model_free). Malformed input is KF_ERR_BAD_MODEL with a message
 * naming the node, tensor or field. */
kf_status kf_onnx_parse(const void *data, size_t len, const char *dir, const char *what,
                        kf_model **out);

/* A control-flow body (If branch, Loop or Scan body) as a graph of its own:
 * g->inputs[0..nin) are the body's formal inputs in order; the inputs after
 * them are the names the body (or a body nested in it) reads from the
 * graphs around it, which the owning node's captures supply (kf_node.ncap,
 * matched by capname). Symbolic dims are dropped (the body's symbol table
 * is its own). */
typedef struct kf_body {
    kf_graph *g;
    int nin;
} kf_body;

/* Decodes graph attribute `attr` of node n (kept packed in the IR) into *b,
 * with node versions taken from opsets[0..nopsets) and external data read
 * from dir (NULL forbids it). The caller releases *b. A missing or
 * malformed body is KF_ERR_BAD_MODEL naming the node and attribute. */
kf_status kf_onnx_node_body(const kf_node *n, const char *attr, const kf_opset *opsets, int nopsets, const char *dir,
                            kf_body *b);
void kf_body_release(kf_body *b);
/* The graph of bm (a body decoded by kf_onnx_node_body, nin formal
 * inputs, rewritten since) packed as graph attribute `attr`, the way the IR
 * keeps it: the inputs past the formal ones, names read from the graphs
 * around the body, are not inputs of the packed graph. *packed is the
 * caller's (kf_free). */
kf_status kf_onnx_body_pack(const kf_model *bm, int nin, const char *attr, uint8_t **packed, size_t *len);

/* Reads a serialized TensorProto file (.pb of the ONNX test data) into t. */
kf_status kf_onnx_read_tensor_file(const char *path, kf_tensor *t, char **name);

/* Writes t as a serialized TensorProto file named `name` inside. */
kf_status kf_onnx_write_tensor_file(const char *path, const kf_tensor *t, const char *name);

/* NumPy .npy (format 1.0 to 3.0, C order, numeric and bool dtypes) in
 * bytes b[0..len) into t (released first by kf_tensor_alloc); `path` names
 * the file in errors: KF_ERR_BAD_MODEL for a malformed header or a data
 * length its shape does not give, KF_ERR_UNSUPPORTED for Fortran order,
 * other versions and dtypes. On failure t holds nothing. */
kf_status kf_npy_parse(const uint8_t *b, size_t len, const char *path, kf_tensor *t);
/* kf_npy_parse of the file at path. */
kf_status kf_npy_read_file(const char *path, kf_tensor *t);

/* Reads a whole file into a malloc'ed buffer (caller frees). */
kf_status kf_read_file(const char *path, uint8_t **data, size_t *len);

/* Rejects protobuf input nested deeper than KF_MAX_PROTO_DEPTH (protobuf-c's
 * unpacker recurses without limit) and malformed wire format. */
kf_status kf_proto_check_depth(const uint8_t *data, size_t len, const char *what);

/* True when the two models' graphs are equal: same nodes (op, domain,
 * names, inputs, outputs, attributes), initializers bit for bit, inputs,
 * outputs and declared types. On difference writes a description to why. */
bool kf_model_equal(const kf_model *a, const kf_model *b, char *why, size_t whylen);

#endif
