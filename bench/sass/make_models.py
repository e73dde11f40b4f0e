"""The kernel shapes of the memory-bound figures (../shared/gpu/README.md):
LayerNormalization, Softmax and Add + Gelu over [32768, 1024] in float32 and
float16, and a chain of 4 elementwise ops over 2^26 floats; and attention as
exported (QK^T / sqrt(d) + additive mask, Softmax, xV) at BERT-base's heads
(12 x 64) for sequences 128 and 512, float16 and bfloat16; and an integer
GEMM as `--precision int8` plans BERT-base's [128, 768] x [768, 768] (uint8
activations with a zero point, int8 weights, the int32 sums requantised to
uint8 in the epilogue), and two ResNet-50 integer convolutions as
`--precision int8` plans them (int8 tensor-core tiles), and two as `--precision
fp8` plans a float8 QDQ ResNet-50 (float8 tensor-core tiles). Small files (the only weights are 1024-long rows or
scales; the GEMM's weights are an input); bench/sass/check.sh reads their
kernels' SASS.

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
    for dt, tag in ((T.FLOAT16, "f16"), (T.BFLOAT16, "bf16")):
        for seq in (128, 512):
            attention(out, f"attn_{tag}_s{seq}", dt, 12, seq, 64)
    igemm(out, "igemm_u8s8", 128, 768, 768)        # 24 tiles of 64: the 32 x 32 form
    igemm(out, "igemm_u8s8_big", 512, 768, 3072)   # 384 tiles of 64: the 64 x 64 form
    iconv(out, "iconv_l4_3x3", 512, 512, 7, 3)      # ResNet-50 layer4's 3x3: 32 tiles of 32
    iconv(out, "iconv_l1_1x1", 64, 256, 56, 1)      # layer1's 1x1 expansion: 196 tiles of 64
    f8conv(out, "f8conv_l1_3x3", 64, 64, 56, 3)     # layer1's 3x3 at fp8: 49 tiles of 64, 196 of 32
    f8conv(out, "f8conv_l1_1x1", 64, 256, 56, 1)    # layer1's 1x1 expansion at fp8: 196 tiles of 64


def igemm(out, name, m, k, n):
    """x uint8 [m, k] with zero point 128 times w int8 [k, n] (an input, so
    the file stays small), then Cast, the per-column scale and
    QuantizeLinear back to uint8: the group pass_qint.c makes of a QDQ MatMul."""
    inits = [nh.from_array(np.array(128, np.uint8), "zx"),
             nh.from_array(np.linspace(1e-4, 3e-4, n, dtype=np.float32), "s"),
             nh.from_array(np.array(0.05, np.float32), "so"), nh.from_array(np.array(128, np.uint8), "zo")]
    nodes = [h.make_node("MatMulInteger", ["x", "w", "zx"], ["acc"]), h.make_node("Cast", ["acc"], ["f"], to=T.FLOAT),
             h.make_node("Mul", ["f", "s"], ["r"]), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.UINT8, [m, k]),
                                   h.make_tensor_value_info("w", T.INT8, [k, n])],
                     [h.make_tensor_value_info("y", T.UINT8, [m, n])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, f"{out}/{name}.onnx")


def iconv(out, name, c, m, hw, k):
    """x int8 [1, c, hw, hw] with zero point -128 (an activation after a
    Relu, moved from uint8) times w int8 [m, c, k, k] (an input, so the file
    stays small), same padding, then Cast, the per-channel scale, the bias,
    Relu and QuantizeLinear back to int8: the group `--precision int8`
    makes of a QDQ ResNet-50 convolution."""
    inits = [nh.from_array(np.array(-128, np.int8), "zx"),
             nh.from_array(np.linspace(1e-4, 3e-4, m, dtype=np.float32).reshape(m, 1, 1), "s"),
             nh.from_array(np.linspace(-0.1, 0.1, m, dtype=np.float32).reshape(m, 1, 1), "b"),
             nh.from_array(np.array(0.05, np.float32), "so"), nh.from_array(np.array(-128, np.int8), "zo")]
    p = k // 2
    nodes = [h.make_node("ConvInteger", ["x", "w", "zx"], ["acc"], pads=[p] * 4),
             h.make_node("Cast", ["acc"], ["f"], to=T.FLOAT), h.make_node("Mul", ["f", "s"], ["r"]),
             h.make_node("Add", ["r", "b"], ["a"]), h.make_node("Relu", ["a"], ["u"]),
             h.make_node("QuantizeLinear", ["u", "so", "zo"], ["y"])]
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.INT8, [1, c, hw, hw]),
                                   h.make_tensor_value_info("w", T.INT8, [m, c, k, k])],
                     [h.make_tensor_value_info("y", T.INT8, [1, m, hw, hw])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, f"{out}/{name}.onnx")


def f8conv(out, name, c, m, hw, k):
    """x float8 E4M3 [1, c, hw, hw] times w float8 E4M3 [m, c, k, k] (a
    constant: random codes), each behind a DequantizeLinear (w's per output
    channel), same padding, then the bias, Relu and QuantizeLinear back to
    E4M3: the group `--precision fp8` makes of a float8 QDQ ResNet-50
    convolution."""
    codes = rng_codes(m * c * k * k).reshape(m, c, k, k)
    w = h.make_tensor("w", T.FLOAT8E4M3FN, [m, c, k, k], codes.tobytes(), raw=True)
    inits = [w, nh.from_array(np.array(0.05, np.float32), "sx"),
             nh.from_array(np.linspace(1e-2, 3e-2, m, dtype=np.float32), "sw"),
             nh.from_array(np.linspace(-0.1, 0.1, m, dtype=np.float32), "b"),
             nh.from_array(np.array(0.25, np.float32), "so"),
             h.make_tensor("zo", T.FLOAT8E4M3FN, [], np.zeros(1, np.uint8).tobytes(), raw=True)]
    p = k // 2
    nodes = [h.make_node("DequantizeLinear", ["x", "sx"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wd"], axis=0),
             h.make_node("Conv", ["xd", "wd", "b"], ["a"], pads=[p] * 4), h.make_node("Relu", ["a"], ["u"]),
             h.make_node("QuantizeLinear", ["u", "so", "zo"], ["y"])]
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.FLOAT8E4M3FN, [1, c, hw, hw])],
                     [h.make_tensor_value_info("y", T.FLOAT8E4M3FN, [1, m, hw, hw])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    onnx.save(model, f"{out}/{name}.onnx")


def rng_codes(n):
    """n finite E4M3 codes of magnitude up to 2 (exponent fields 0-7),
    either sign: deterministic."""
    r = np.random.default_rng(n)
    return (r.integers(0, 64, n) | (r.integers(0, 2, n) << 7)).astype(np.uint8)


def attention(out, name, dt, heads, seq, d):
    """x is the queries [1, heads, seq, d]; k, v the keys and values, mask
    the additive padding mask [1, 1, 1, seq]; y the context."""
    shape = [1, heads, seq, d]
    scale = h.make_tensor("s", dt, [], [1.0 / d ** 0.5])
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["x", "kt"], ["m"]), h.make_node("Mul", ["m", "s"], ["sc"]),
             h.make_node("Add", ["sc", "mask"], ["a"]), h.make_node("Softmax", ["a"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["y"])]
    save(nodes, name, dt, shape, [scale], out,
         extra_inputs=[h.make_tensor_value_info("k", dt, shape), h.make_tensor_value_info("v", dt, shape),
                       h.make_tensor_value_info("mask", dt, [1, 1, 1, seq])])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
