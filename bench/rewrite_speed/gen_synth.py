#!/usr/bin/env python3
"""Writes synthetic ONNX graphs of N elementwise nodes for the rewrite-speed benchmark.

The graph repeats one 16-node block: a chain with a diamond (two branches joined by an
Add), over a [batch, 16] float tensor. A quarter of the nodes are rewrite opportunities
(multiply by one, add zero, divide by one, in both operand orders; Identity; a double
Neg; a Relu of a Relu), the rest are ops no rule removes. N is hit exactly (the last block
is cut short). Only the structure matters: the tensors are tiny so that time per node
measures the rewriter, not arithmetic. Needs `onnx` and `numpy`:

    python3 bench/rewrite_speed/gen_synth.py N OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def block(i, x):
    """One block's nodes as (op, inputs) with output names p<i>_<k>; returns (nodes, last)."""
    p = f"b{i}_"
    spec = [
        ("Relu", [x]),
        ("Mul", ["@0", "one"]),        # mul_by_one
        ("Sigmoid", ["@1"]),
        ("Add", ["zero", "@2"]),       # add_zero, constant first
        ("Tanh", ["@3"]),              # diamond: left branch
        ("Abs", ["@3"]),               # diamond: right branch
        ("Neg", ["@5"]),
        ("Neg", ["@6"]),               # double negation
        ("Add", ["@4", "@7"]),         # join
        ("Identity", ["@8"]),
        ("Div", ["@9", "one"]),        # div_by_one
        ("Relu", ["@10"]),
        ("Relu", ["@11"]),             # relu of relu
        ("Mul", ["@12", "half"]),
        ("Sub", ["@13", "@0"]),        # second diamond: reaches back to the block's first node
        ("Exp", ["@14"]),
    ]
    nodes = []
    for k, (op, ins) in enumerate(spec):
        ins = [p + str(int(s[1:])) if s.startswith("@") else s for s in ins]
        nodes.append(helper.make_node(op, ins, [p + str(k)], name=p + op + str(k)))
    return nodes


def make(n):
    nodes, x, i = [], "x", 0
    while len(nodes) < n:
        b = block(i, x)[: n - len(nodes)]
        nodes += b
        x = b[-1].output[0]
        i += 1
    graph = helper.make_graph(
        nodes, f"synth_{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("one", 1.0), ("zero", 0.0), ("half", 0.5))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kfuse-bench")
    m.ir_version = 8
    return m


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    m = make(int(sys.argv[1]))
    onnx.save(m, sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
