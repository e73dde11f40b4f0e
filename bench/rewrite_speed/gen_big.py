#!/usr/bin/env python3
"""Writes a model whose weights (about SIZE GiB, default 2) are ONNX external data, for the
rewrite-speed benchmark's large-model row.

The graph is a chain of MatMul layers over an [batch, D] input with D = 8192, each weight a
D x D float32 matrix (256 MiB) stored in one data file, weights.bin, beside the model; each
layer is MatMul -> Add(bias) -> Relu, and every other layer also multiplies by one (a rewrite
that removes a node and no weight). The weights are random bytes written in chunks, so the
script never holds a whole matrix. Needs `onnx` and `numpy`:

    python3 bench/rewrite_speed/gen_big.py OUT_DIR [SIZE_GIB]
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 8192
CHUNK_ROWS = 512


def external(name, dims, location, offset, length):
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    layers = max(1, round(float(sys.argv[2] if len(sys.argv) == 3 else 2) * (1 << 30) / (D * D * 4)))
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    inits, nodes, x, off = [], [], "x", 0
    with open(os.path.join(out, "weights.bin"), "wb") as f:
        for i in range(layers):
            for _ in range(D // CHUNK_ROWS):
                f.write(rng.standard_normal((CHUNK_ROWS, D), dtype=np.float32).tobytes())
            inits.append(external(f"w{i}", [D, D], "weights.bin", off, D * D * 4))
            off += D * D * 4
            inits.append(numpy_helper.from_array(rng.standard_normal(D, dtype=np.float32), f"b{i}"))
            nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                      helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
            x = f"r{i}"
            if i % 2:
                nodes.append(helper.make_node("Mul", [x, "one"], [f"s{i}"], name=f"mul_one{i}"))
                x = f"s{i}"
    inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    graph = helper.make_graph(nodes, "big_external",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", D])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kfuse-bench")
    m.ir_version = 8
    onnx.save(m, os.path.join(out, "model.onnx"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
