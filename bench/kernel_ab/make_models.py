"""Small ONNX models that isolate one kernel shape for A/B timing of two kfuse
builds (bench/kernel_ab/run.sh): short-row reductions (several rows per
work-group; rows of 8..31 with segments under a warp) and independent small
groups (horizontal launches).

    python3 bench/kernel_ab/make_models.py OUT_DIR
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(graph, path, opset=17):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def layernorm(rows, cols, path):
    rng = np.random.default_rng(1)
    scale = numpy_helper.from_array(rng.standard_normal(cols).astype(np.float32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(cols).astype(np.float32), "bias")
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5)
    g = helper.make_graph([node], f"ln_{rows}x{cols}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
                          [scale, bias])
    save(g, path)


def softmax(rows, cols, path):
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    g = helper.make_graph([node], f"softmax_{rows}x{cols}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])])
    save(g, path)


def siblings(branches, path):
    """branches independent chains Softmax -> Exp -> Softmax on [32, 64]: each
    chain is its own groups, all chains at the same levels, so every level is
    one horizontal launch."""
    nodes, outs = [], []
    for b in range(branches):
        nodes += [helper.make_node("Softmax", [f"x{b}"], [f"s{b}"], axis=-1),
                  helper.make_node("Exp", [f"s{b}"], [f"e{b}"]),
                  helper.make_node("Softmax", [f"e{b}"], [f"y{b}"], axis=0)]
        outs.append(helper.make_tensor_value_info(f"y{b}", TensorProto.FLOAT, [32, 64]))
    ins = [helper.make_tensor_value_info(f"x{b}", TensorProto.FLOAT, [32, 64]) for b in range(branches)]
    save(helper.make_graph(nodes, f"siblings{branches}", ins, outs), path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    layernorm(16384, 64, f"{out}/layernorm_16384x64.onnx")
    layernorm(1024, 768, f"{out}/layernorm_1024x768.onnx")
    softmax(8192, 128, f"{out}/softmax_8192x128.onnx")
    # rows of 8..31: segments narrower than a warp (4 and 8 lanes)
    softmax(8192, 16, f"{out}/softmax_8192x16.onnx")
    layernorm(8192, 24, f"{out}/layernorm_8192x24.onnx")
    siblings(8, f"{out}/siblings8.onnx")
