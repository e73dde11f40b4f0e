#!/usr/bin/env python3
"""ONNX Runtime's own static quantizer as kfuse's input.

For each small bench model (symbolic dims bound to batch 2, seq 16 in the file first, since
the calibration runs want fixed shapes): `onnxruntime.quantization.quantize_static` in the QDQ
format, per channel, uint8 activations and int8 weights, calibrated (MinMax) on 32 random input
sets drawn like bench/quantize/run.py draws them (floats in [-1, 1), token ids below the
embedding table's rows, masks of ones; seeds 1..32). Then, on the held-out set of run.py:

  - kfuse loads the file (`kfuse info`);
  - `kfuse run --backend ref` equals ONNX Runtime on the same quantized file, graph
    optimizations off and all, within one quantization step (the float output's range / 255);
  - `kfuse run --backend opencl --check` passes;
  - `kfuse opt --json`: Q/DQ nodes on activations before and after, and the qdq rules' hits;
  - `kfuse fuse --json`: groups, and how many groups have an integer anchor (ConvInteger,
    MatMulInteger, QLinearConv, QLinearMatMul).

--precision P is passed to `kfuse run` and `kfuse fuse` (for the integer anchors that
`--precision int8` will plan). Run with bench/.venv:

    bench/.venv/bin/python bench/quantize/ort_static.py [--samples 32] [--precision P] [--kfuse K]

Exit 1 when kfuse fails on a file, or disagrees with ORT by more than one step.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_static)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as qrun  # noqa: E402  (the input drawing and the ORT/kfuse runners)

DIMS = {"batch": 2, "seq": 16}
DIM_ARGS = [a for k, v in DIMS.items() for a in ("--dim", f"{k}={v}")]
INT_ANCHORS = {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul"}


def fix_dims(src, dst):
    """src with its graph inputs' and outputs' symbolic dims bound by DIMS."""
    m = onnx.load(src)
    for vi in list(m.graph.input) + list(m.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in DIMS:
                d.dim_value = DIMS[d.dim_param]
    onnx.save(m, dst)


def feeds(path, n):
    """n input sets like run.py's random_feed, from seeds 1..n."""
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    bounds = qrun.index_bounds(m)
    out = []
    for seed in range(1, n + 1):
        rng = np.random.default_rng(seed)
        feed = {}
        for i in m.graph.input:
            if i.name in inits:
                continue
            shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
                feed[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
            elif "mask" in i.name:
                feed[i.name] = np.ones(shape, np.int64)
            else:
                feed[i.name] = rng.integers(0, bounds.get(i.name, qrun.TOKEN_RANGE), shape).astype(np.int64)
        out.append(feed)
    return out


class Reader(CalibrationDataReader):
    def __init__(self, sets):
        self.it = iter(sets)

    def get_next(self):
        return next(self.it, None)


def act_qdq(m):
    """Q and DQ nodes on activations (the first input not an initializer: weight DQs, which
    `kfuse opt` folds into float weights, are not counted)."""
    inits = {t.name for t in m.graph.initializer}
    return sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] not in inits for n in m.graph.node)


def kfuse_ref(kfuse, path, feed, tmp, extra):
    d, o = os.path.join(tmp, "in"), os.path.join(tmp, "out")
    os.makedirs(d, exist_ok=True)
    for name, a in feed.items():
        np.save(os.path.join(d, f"{name}.npy"), a)
    subprocess.run([kfuse, "run", path, "--backend", "ref", "--inputs", d, "--outputs", o] + extra, check=True,
                   stdout=subprocess.DEVNULL)
    outs, k = [], 0
    while os.path.exists(os.path.join(o, f"output_{k}.pb")):
        t = onnx.TensorProto()
        with open(os.path.join(o, f"output_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        outs.append(onnx.numpy_helper.to_array(t))
        k += 1
    return outs


def one(kfuse, name, tmp, args):
    src = os.path.join(qrun.ROOT, "bench", "models", "small", name, "model.onnx")
    static = os.path.join(tmp, f"{name}.static.onnx")
    q = os.path.join(tmp, f"{name}.ort_qdq.onnx")
    fix_dims(src, static)
    quantize_static(static, q, Reader(feeds(static, args.samples)), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    prec = ["--precision", args.precision] if args.precision else []
    row = {"model": name}
    row["load"] = subprocess.run([kfuse, "info", q], capture_output=True, text=True).returncode == 0
    feed = qrun.random_feed(static, DIM_ARGS)
    fl = qrun.ort_run(static, feed, False)
    steps = [(float(f.max()) - float(f.min())) / 255 for f in fl]
    kr = kfuse_ref(kfuse, q, feed, tmp, prec)
    ort_outs = {}
    for key, optimize in (("off", False), ("all", True)):
        ort_outs[key] = o = qrun.ort_run(q, feed, optimize)
        row[key] = max(float(np.abs(a.astype(np.float64) - b).max()) / s for a, b, s in zip(o, kr, steps))
    row["ort_all_off"] = max(float(np.abs(a.astype(np.float64) - b).max()) / s
                             for a, b, s in zip(ort_outs["all"], ort_outs["off"], steps))
    r = subprocess.run([kfuse, "run", q, "--backend", "opencl", "--check"] + prec, capture_output=True, text=True)
    row["opencl"] = r.returncode == 0
    if r.returncode:
        print(f"{name}: opencl --check failed ({r.returncode}): {r.stderr[-1500:]}", file=sys.stderr)
    r = subprocess.run([kfuse, "opt", q, "-o", os.path.join(tmp, "opt.onnx"), "--json"], capture_output=True,
                       text=True, check=True)
    j = json.loads(r.stdout)
    m0, m1 = onnx.load(q, load_external_data=False), onnx.load(os.path.join(tmp, "opt.onnx"), load_external_data=False)
    row["qdq_before"], row["qdq_after"] = act_qdq(m0), act_qdq(m1)
    row["rules"] = {k: v for k, v in j.get("rules", {}).items() if k.startswith("qdq") and v}
    r = subprocess.run([kfuse, "fuse", q, "-o", os.path.join(tmp, "fused.onnx"), "--json"] + prec,
                       capture_output=True, text=True)
    if r.returncode:
        print(f"{name}: kfuse fuse failed ({r.returncode}): {r.stderr[-1500:]}", file=sys.stderr)
        row["groups"], row["int_anchor_groups"] = None, None
    else:
        groups = json.loads(r.stdout)["groups"]
        row["groups"] = len(groups)
        row["int_anchor_groups"] = sum(1 for g in groups if INT_ANCHORS & set(g["ops"]))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kfuse", default=None)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--precision", default=None, help="passed to kfuse run and kfuse fuse")
    ap.add_argument("--models", default=",".join(qrun.SMALL))
    args = ap.parse_args()
    kfuse = args.kfuse or qrun.default_kfuse()
    rows, bad = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            try:
                row = one(kfuse, name, tmp, args)
            except (subprocess.CalledProcessError, RuntimeError, ValueError) as e:
                print(f"{name}: failed: {e}", file=sys.stderr)
                bad = True
                continue
            # ORT's optimized and unoptimized runs differ from each other by
            # several steps on the transformers; kfuse must be within one step
            # of at least one of them.
            ok = row["load"] and row["opencl"] and min(row["off"], row["all"]) <= 1 and row["groups"] is not None
            bad |= not ok
            row["ok"] = ok
            rows.append(row)
            print(f"{name}: {row}", file=sys.stderr)
    print(f"| model (small, batch {DIMS['batch']}, seq {DIMS['seq']}) | kfuse loads | max abs(ORT - kfuse ref) / step, "
          "ORT opt off | same, ORT opt all | ORT all vs ORT off / step | opencl --check | activation Q+DQ nodes before -> after kfuse opt | qdq rule hits "
          "| kfuse fuse groups | integer-anchor groups |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        hits = ", ".join(f"{k} {v}" for k, v in sorted(r["rules"].items())) or "-"
        print(f"| {r['model']} | {'yes' if r['load'] else 'NO'} | {r['off']:.3f} | {r['all']:.3f} | {r['ort_all_off']:.3f} "
              f"| {'pass' if r['opencl'] else 'FAIL'} | {r['qdq_before']} -> {r['qdq_after']} | {hits} "
              f"| {r['groups']} | {r['int_anchor_groups']} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
