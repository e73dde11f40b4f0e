#!/usr/bin/env python3
"""Writes bench/models/tiny_cnn.onnx: the small example model the README runs.

A CNN block and a transformer-style block in one graph, with the patterns
kfuse exists to fuse: Conv + BatchNorm + Relu, MaxPool, Flatten, MatMul + bias
Add, an erf-form Gelu, a decomposed LayerNorm and Softmax. Weights are random
with a fixed seed; the batch dimension is symbolic ("N").
Needs the `onnx` and `numpy` packages (bench environment only).
"""
import os
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

rng = np.random.default_rng(7)


def init(name, *shape, scale=0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


inits = [
    init("conv_w", 8, 3, 3, 3), init("conv_b", 8),
    numpy_helper.from_array((rng.random(8) + 0.5).astype(np.float32), "bn_scale"),
    init("bn_bias", 8),
    init("bn_mean", 8),
    numpy_helper.from_array((rng.random(8) + 0.5).astype(np.float32), "bn_var"),
    init("fc1_w", 128, 32, scale=0.1), init("fc1_b", 32),
    init("fc2_w", 32, 10, scale=0.2), init("fc2_b", 10),
    numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
    numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
    numpy_helper.from_array((rng.random(32) + 0.5).astype(np.float32), "ln_gamma"),
    init("ln_beta", 32),
]

n = helper.make_node
nodes = [
    n("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
    n("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"], epsilon=1e-5, name="bn"),
    n("Relu", ["bn"], ["r"], name="relu"),
    n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
    n("Flatten", ["p"], ["f"], axis=1, name="flatten"),
    n("MatMul", ["f", "fc1_w"], ["m1"], name="fc1"),
    n("Add", ["m1", "fc1_b"], ["a1"], name="fc1_bias"),
    # Gelu, erf form: 0.5 * x * (1 + erf(x / sqrt(2)))
    n("Div", ["a1", "sqrt2"], ["g1"], name="gelu_div"),
    n("Erf", ["g1"], ["g2"], name="gelu_erf"),
    n("Add", ["g2", "one"], ["g3"], name="gelu_add"),
    n("Mul", ["a1", "g3"], ["g4"], name="gelu_mul"),
    n("Mul", ["g4", "half"], ["g"], name="gelu_half"),
    # LayerNorm, decomposed as exporters write it
    n("ReduceMean", ["g"], ["mu"], axes=[-1], name="ln_mean"),
    n("Sub", ["g", "mu"], ["d"], name="ln_sub"),
    n("Pow", ["d", "two"], ["d2"], name="ln_pow"),
    n("ReduceMean", ["d2"], ["var"], axes=[-1], name="ln_var"),
    n("Add", ["var", "eps"], ["ve"], name="ln_eps"),
    n("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
    n("Div", ["d", "sd"], ["nrm"], name="ln_div"),
    n("Mul", ["nrm", "ln_gamma"], ["ln1"], name="ln_scale"),
    n("Add", ["ln1", "ln_beta"], ["ln"], name="ln_shift"),
    n("MatMul", ["ln", "fc2_w"], ["m2"], name="fc2"),
    n("Add", ["m2", "fc2_b"], ["logits"], name="fc2_bias"),
    n("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
]
graph = helper.make_graph(
    nodes, "tiny_cnn",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
    [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
    inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="kfuse-bench")
model.ir_version = 8
onnx.checker.check_model(model)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_cnn.onnx")
onnx.save(model, out)
print(out, os.path.getsize(out), "bytes")
