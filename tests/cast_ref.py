#!/usr/bin/env python3
"""Writes Cast test folders (model.onnx + test_data_set_0/{input,output}_0.pb,
the ONNX backend-test layout) whose expected outputs come from ONNX's own
reference implementation (onnx.reference, ml_dtypes), for every pair of
float32/float16/double/int8/uint8 and the small storage types (float8
E4M3FN/E4M3FNUZ/E5M2/E5M2FNUZ/E8M0, float4 E2M1, int4, uint4, int2, uint2),
with saturate 0/1 for float8 targets and every round_mode for E8M0.

    cast_ref.py OUT_DIR [--seed N]

Inputs are random, fresh per seed: magnitudes spread over the target's whole
range and past it, plus 0, -0, +-Inf and NaN for float sources; every code
drawn uniformly for small-type sources. Prints the seed and the number of
folders. Used by tests/test_small_types.c, which evaluates each folder on
the reference evaluator and compares bit for bit.
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

SMALL = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1",
         "INT4", "UINT4", "INT2", "UINT2"]
WIDE = ["FLOAT", "FLOAT16", "DOUBLE"]
INTS = {"INT4": "INT8", "UINT4": "UINT8", "INT2": "INT8", "UINT2": "UINT8"}
F8 = {"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"}
BITS = {"FLOAT4E2M1": 4, "INT4": 4, "UINT4": 4, "INT2": 2, "UINT2": 2}


def np_type(name):
    return helper.tensor_dtype_to_np_dtype(getattr(T, name))


def float_inputs(rng, n, wide):
    """Magnitudes 2^-20 .. 2^20 (past every small type's range both ways),
    small integers and halves (ties), signs, and the special values."""
    mag = np.exp2(rng.uniform(-20, 20, n))
    ties = rng.integers(-40, 40, n) / 2.0
    x = np.where(rng.random(n) < 0.3, ties, mag * np.where(rng.random(n) < 0.5, -1, 1))
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]
    return x.astype(np_type(wide))


def small_inputs(rng, n, name):
    bits = BITS.get(name, 8)
    codes = rng.integers(0, 1 << bits, n, dtype=np.uint8)
    if name in INTS:
        vals = codes.astype(np.int8)
        if name.startswith("INT"):
            vals = np.where(vals >= (1 << (bits - 1)), vals - (1 << bits), vals).astype(np.int8)
        return vals.astype(np_type(name))
    return codes.view(np_type(name))  # one byte per element, the code in the low bits


def tensor(name, arr, dtype_name):
    """A TensorProto holding arr (ml_dtypes array) as raw data."""
    dt = getattr(T, dtype_name)
    bits = BITS.get(dtype_name, 0)
    if bits:  # packed: low bits first
        codes = arr.view(np.uint8) if arr.dtype.itemsize == 1 else arr.astype(np.uint8)
        codes = codes.astype(np.uint8) & ((1 << bits) - 1)
        per = 8 // bits
        pad = (-codes.size) % per
        c = np.concatenate([codes, np.zeros(pad, np.uint8)]).reshape(-1, per)
        packed = np.zeros(c.shape[0], np.uint8)
        for k in range(per):
            packed |= (c[:, k] << (k * bits)).astype(np.uint8)
        return helper.make_tensor(name, dt, arr.shape, packed.tobytes(), raw=True)
    return helper.make_tensor(name, dt, arr.shape, arr.tobytes(), raw=True)


def write_case(out, name, src, dst, x, attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=getattr(T, dst), **attrs)
    g = helper.make_graph([node], name, [helper.make_tensor_value_info("x", getattr(T, src), list(x.shape))],
                          [helper.make_tensor_value_info("y", getattr(T, dst), list(x.shape))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])
    model.ir_version = 11
    (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    with open(os.path.join(d, "test_data_set_0", "input_0.pb"), "wb") as f:
        f.write(tensor("x", x, src).SerializeToString())
    with open(os.path.join(d, "test_data_set_0", "output_0.pb"), "wb") as f:
        f.write(tensor("y", np.asarray(y).astype(np_type(dst)), dst).SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    n = 0
    for dst in SMALL:
        for src in WIDE + ([INTS[dst]] if dst in INTS else []):
            x = float_inputs(rng, 301, src) if src in WIDE else rng.integers(-128 if src == "INT8" else 0, 128 if src == "INT8" else 256, 301).astype(np_type(src))
            variants = [{}]
            if dst in F8:
                variants = [{"saturate": 1}, {"saturate": 0}]
            elif dst == "FLOAT8E8M0":
                if src in WIDE:  # negative values are undefined for E8M0
                    x = np.abs(x)
                variants = [{"saturate": s, "round_mode": m} for s in (1, 0) for m in ("up", "down", "nearest")]
            for v in variants:
                suffix = "".join(f"_{k}_{val}" for k, val in v.items())
                write_case(args.out, f"cast_{src}_to_{dst}{suffix}", src, dst, x, v)
                n += 1
        for back in WIDE + ([INTS[dst]] if dst in INTS else []):
            x = small_inputs(rng, 203, dst)
            write_case(args.out, f"cast_{dst}_to_{back}", dst, back, x, {})
            n += 1
    print(f"{n} folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
