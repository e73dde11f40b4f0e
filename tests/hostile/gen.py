#!/usr/bin/env python3
"""Writes the hostile ONNX files of this folder and their EXPECT list.

Each file is a small valid model with one thing broken (or raw bytes that
are not a model at all). EXPECT gives, per file, the exit code of
`kfuse info`, of `kfuse run`, and a string both messages must contain;
tests/test_onnx_bad.c checks them and tests/fuzz/run.sh seeds the fuzzer with
them. The files are committed, so the tests need no Python; run this again
(python3 tests/hostile/gen.py) only to change them.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
cases = []  # (name, info_rc, run_rc, substring)


def base(nodes=None, inits=None, x_shape=(2, 3)):
    """X float[2,3] -> Add(W) -> Relu -> Y float[2,3], W an initializer."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) * 0.25 - 0.5, "W")
    nodes = nodes or [
        helper.make_node("Add", ["X", "W"], ["S"], name="n_add"),
        helper.make_node("Relu", ["S"], ["Y"], name="n_relu"),
    ]
    g = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[w] + (inits or []),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def save_model(name, model, info_rc, run_rc, want):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(model.SerializeToString())
    cases.append((name, info_rc, run_rc, want))


def save_bytes(name, data, info_rc, run_rc, want):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    cases.append((name, info_rc, run_rc, want))


def init(m, name="W"):
    return next(t for t in m.graph.initializer if t.name == name)


good = base().SerializeToString()

# bytes
save_bytes("empty.onnx", b"", 3, 3, "has no graph")
save_bytes("truncated.onnx", good[: len(good) - 7], 3, 3, "truncated or garbage")
save_bytes("garbage.onnx", b"\x08\x07\x3a\xff\xff\xff\x7fgarbage\x00\xff", 3, 3, "truncated or garbage")
save_bytes("length_past_end.onnx", b"\x3a\xe8\x07" + good, 3, 3, "truncated or garbage")
save_bytes("overlong_varint.onnx", b"\x08" + b"\xff" * 11 + b"\x01", 3, 3, "truncated or garbage")

# tensors
m = base()
init(m).dims[:] = [2**62, 4]
save_model("dim_overflow.onnx", m, 3, 3, "tensor 'W': dimension product overflows")
m = base()
init(m).dims[:] = [2, -3]
save_model("negative_dim.onnx", m, 3, 3, "tensor 'W': negative dimension -3")
m = base()
init(m).raw_data = init(m).raw_data[:20]
save_model("raw_data_short.onnx", m, 3, 3, "tensor 'W': raw_data has 20 bytes")
m = base()
init(m).dims[:] = [2**20, 2**12]  # 16 GiB of float backed by 24 bytes
save_model("huge_shape_little_data.onnx", m, 3, 3, "tensor 'W': raw_data has 24 bytes")
m = base()
t = init(m)
t.ClearField("raw_data")
t.float_data.extend([0.5, -1.5, 2.0, 0.25, -0.75])
save_model("typed_data_count.onnx", m, 3, 3, "tensor 'W': float_data has 5 elements")
m = base()
init(m).data_type = 99
save_model("unknown_dtype.onnx", m, 3, 3, "tensor 'W': unknown data type 99")
m = base()
m.graph.input[0].type.tensor_type.elem_type = 42
save_model("unknown_elem_type.onnx", m, 3, 3, "value 'X': unknown element type 42")
m = base(x_shape=(2**40, 2**40))
save_model("declared_overflow.onnx", m, 3, 3, "value 'X': dimension product overflows")

# external data
for name, loc, want in [
    ("external_dotdot.onnx", "../../../etc/passwd", "'../../../etc/passwd' must be a relative path"),
    ("external_absolute.onnx", "/etc/passwd", "'/etc/passwd' must be a relative path"),
]:
    m = base()
    t = init(m)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", loc
    save_model(name, m, 3, 3, "tensor 'W': external data location " + want)
m = base()
t = init(m)
t.ClearField("raw_data")
t.data_location = TensorProto.EXTERNAL
for k, v in [("location", "EXPECT"), ("offset", "1000000")]:
    e = t.external_data.add()
    e.key, e.value = k, v
save_model("external_offset_past_end.onnx", m, 3, 3, "tensor 'W': external data offset 1000000 + 24 bytes is past the end")

# graph structure
m = base()
m.graph.node[1].input[0] = "nope"
save_model("undefined_input.onnx", m, 3, 3, "node 'n_relu' (Relu): input 'nope' is not defined")
m = base()
m.graph.node[0].input[0] = "Y"  # Add reads what Relu makes of Add's output
save_model("cycle.onnx", m, 3, 3, "graph has a cycle through node 'n_add' (Add)")
m = base()
m.graph.node[1].output[0] = "S"
m.graph.output[0].name = "S"
save_model("duplicate_output.onnx", m, 3, 3, "node 'n_relu' (Relu): output 'S' is already defined")
m = base()
m.graph.output.add().CopyFrom(helper.make_tensor_value_info("X", TensorProto.INT64, [2, 3]))
save_model("output_contradicts_input.onnx", m, 3, 3, "graph output 'X' declares dtype int64 after an earlier declaration of float")
m = base()
m.graph.output.add().CopyFrom(helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 3, 6, 6]))
save_model("output_contradicts_initializer.onnx", m, 3, 3, "graph output 'W' declares a type its initializer does not have")
m = base(nodes=[helper.make_node("FrobnicateXyz", ["X", "W"], ["Y"], name="n_frob")])
save_model("unknown_op.onnx", m, 0, 3, "FrobnicateXyz")

# attributes
m = base()
a = helper.make_attribute("alpha", 7)  # then its type INT (2) becomes 99 (0x63), same length
m.graph.node[1].attribute.append(a)
ab = a.SerializeToString()
assert ab.count(b"\xa0\x01\x02") == 1
data = m.SerializeToString().replace(ab, ab.replace(b"\xa0\x01\x02", b"\xa0\x01\x63"))
save_bytes("attribute_unknown_type.onnx", data, 3, 3, "node 'n_relu': attribute 'alpha' has unknown type 99")
m = base()
m.graph.node[1].attribute.extend([helper.make_attribute("alpha", 1), helper.make_attribute("alpha", 2)])
save_model("attribute_twice.onnx", m, 3, 3, "node 'n_relu': attribute 'alpha' appears twice")
m = base()
a = m.graph.node[1].attribute.add()
a.type = onnx.AttributeProto.INT
save_model("attribute_no_name.onnx", m, 3, 3, "node 'n_relu': attribute 0 has no name")

# run time: Gather index 3 on a dim of 3 (an unsupported-op message names the node too)
g = numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "G")
m = base(nodes=[helper.make_node("Gather", ["X", "G"], ["Y"], name="n_gather", axis=1)], inits=[g])
save_model("gather_out_of_range.onnx", m, 0, 3, "n_gather")

# Attention: 3 key/value heads cannot serve 2 query heads
kv = numpy_helper.from_array(np.arange(36, dtype=np.float32).reshape(1, 3, 3, 4) * 0.05, "KV")
g = helper.make_graph(
    [helper.make_node("Attention", ["X", "KV", "KV"], ["Y"], name="n_attention")],
    "hostile",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 3, 4])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    initializer=[kv],
)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
save_model("attention_heads_not_dividing.onnx", m, 0, 3, "node 'n_attention' (Attention): 2 query heads")

# nesting: If inside If ... 40 graphs deep (protobuf-c would recurse 120
# levels). Python's protobuf refuses such depth itself, so bytes by hand.
def varint(v):
    out = b""
    while True:
        out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
        v >>= 7
        if not v:
            return out


def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


graph = b""
for i in range(40):
    attr = field(1, b"then_branch") + varint(20 << 3) + varint(5) + field(6, graph)
    node = field(1, b"c") + field(2, b"o") + field(4, b"If") + field(5, attr)
    graph = field(1, node) + field(2, b"g%d" % i)
graph += field(11, field(1, b"c"))
model = varint(1 << 3) + varint(8) + field(8, varint(2 << 3) + varint(13)) + field(7, graph)
save_bytes("deep_nesting.onnx", model, 3, 3, "nested deeper than 64 levels")

# control flow: a branch with more outputs than its If; a Loop with
# neither a trip count nor a condition (loads, never runs)
def body(name, nodes, ins, outs):
    vi = helper.make_tensor_value_info
    return helper.make_graph(nodes, name, [vi(n, t, s) for n, t, s in ins], [vi(n, t, s) for n, t, s in outs])


F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
two = body("two", [helper.make_node("Relu", ["X"], ["a"]), helper.make_node("Neg", ["X"], ["b"])], [],
           [("a", F, [2, 3]), ("b", F, [2, 3])])
one = body("one", [helper.make_node("Neg", ["X"], ["e"])], [], [("e", F, [2, 3])])
c = numpy_helper.from_array(np.array(True), "C")
m = base(nodes=[helper.make_node("If", ["C"], ["Y"], name="n_if", then_branch=two, else_branch=one)], inits=[c])
save_model("if_branch_outputs.onnx", m, 3, 3, "node 'n_if' (If): branch 'then_branch' has 2 outputs, the node 1")
forever = body("forever", [helper.make_node("Identity", ["ci"], ["co"]), helper.make_node("Relu", ["v"], ["v2"])],
               [("i", I64, []), ("ci", B, []), ("v", F, [2, 3])], [("co", B, []), ("v2", F, [2, 3])])
m = base(nodes=[helper.make_node("Loop", ["", "", "X"], ["Y"], name="n_loop", body=forever)])
save_model("loop_without_end.onnx", m, 0, 3, "node 'n_loop' (Loop): has neither a trip count nor a condition")

with open(os.path.join(HERE, "EXPECT"), "w") as f:
    f.write("# Written by gen.py. file, exit code of `kfuse info`, of `kfuse run`, text both messages contain.\n")
    for c in cases:
        f.write("%s %d %d %s\n" % c)
print("wrote %d files" % len(cases))
