"""The kernel shapes of the memory-bound figures (../shared/gpu/README.md):
LayerNormalization, Softmax and Add + Gelu over [32768, 1024] in float32 and
float16, and a chain of 4 elementwise ops over 2^26 floats. Small files (the
only weights are 1024-long rows); bench/sass/check.sh reads their kernels'
SASS.

    python3 bench/sass/make_models.py OUT_DIR
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh

R, C = 32768, 1024


def save(nodes, name, dt, shape, inits, out, opset=17, extra_inputs=()):
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", dt, shape)] + list(extra_inputs),
                     [h.make_tensor_value_info("y", dt, shape)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, f"{out}/{name}.onnx")


def main(out):
    rng = np.random.default_rng(1)
    for dt, np_dt, tag in ((T.FLOAT, np.float32, "f32"), (T.FLOAT16, np.float16, "f16")):
        row = lambda n: nh.from_array(rng.standard_normal(C).astype(np_dt), n)
        save([h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
             f"layernorm_{tag}", dt, [R, C], [row("g"), row("b")], out)
        save([h.make_node("Softmax", ["x"], ["y"], axis=-1)], f"softmax_{tag}", dt, [R, C], [], out)
        save([h.make_node("Add", ["x", "b"], ["a"]), h.make_node("Gelu", ["a"], ["y"])],
             f"add_gelu_{tag}", dt, [R, C], [row("b")], out, opset=20)
    # 4 elementwise ops over 2^26 floats, two full-size operands
    nodes = [h.make_node("Add", ["x", "z"], ["a"]), h.make_node("Mul", ["a", "x"], ["m"]),
             h.make_node("Sigmoid", ["m"], ["s"]), h.make_node("Sub", ["s", "z"], ["y"])]
    save(nodes, "ew4_f32", T.FLOAT, [65536, 1024], [], out,
         extra_inputs=[h.make_tensor_value_info("z", T.FLOAT, [65536, 1024])])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
