#!/usr/bin/env python3
"""Quantizes the bench models with `kfuse quantize` and checks the files in ONNX Runtime.

For each model: `kfuse quantize M -o Q --per-channel --method percentile --random N` (int8
weights per channel, uint8 activations, calibrated on N random input sets drawn by kfuse's
own generator, the reference evaluator computing the SQNR of the quantized model against
float over those same sets). Then, on one further input set (drawn like the calibration
sets, from another seed: floats in [-1, 1), token ids below the embedding table's rows,
masks of ones), ONNX Runtime runs the quantized file twice (graph optimizations off, and
ORT's defaults, which may rewrite the Q/DQ pattern into integer kernels) and `kfuse run
--backend ref` runs it once; each output of ORT must lie within one quantization step of
kfuse's, a step being the float output's range / 255. The table also gives ORT's own
quantized-vs-float SQNR on that input and, for the small models, on their test_data_set_0
(PyTorch's inputs: N(0, 1) images, which reach past the [-1, 1) the calibration saw).

Models: the five of bench/models/small/ (symbolic dims bound to batch 2, seq 16), and the
full-size ResNet-50 and BERT-base when they exist (bench/.cache/models/{resnet50,bert}/
model.onnx from bench/models/export.py --full, bound to batch 1, seq 32; else the static
exports bench/.cache/models/static/{resnet50,bert}_static.onnx of this tree or of the one
given by --static-dir). Run with bench/.venv:

    bench/.venv/bin/python bench/quantize/run.py [--samples 32] [--small-only] [--kfuse K]

Exit 1 when ORT fails to load a file or disagrees with kfuse by more than one step.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SMALL = ["resnet50", "bert", "gpt2", "mobilenetv2", "vit_b16"]
FULL = ["resnet50", "bert"]
SMALL_DIMS = ["--dim", "batch=2", "--dim", "seq=16"]
FULL_DIMS = ["--dim", "batch=1", "--dim", "seq=32"]
TOKEN_RANGE = 1000  # token ids below this fit every vocabulary here


def default_kfuse():
    for p in [os.environ.get("KFUSE", ""), os.path.join(ROOT, "build", "tools", "kfuse")]:
        if p and os.access(p, os.X_OK):
            return p
    sys.exit("no kfuse binary: build first (cmake --build build) or pass --kfuse")


def models(args):
    out = [(f"{n} (small)", os.path.join(ROOT, "bench", "models", "small", n, "model.onnx"), SMALL_DIMS,
            os.path.join(ROOT, "bench", "models", "small", n, "test_data_set_0")) for n in SMALL]
    if args.small_only:
        return out
    for n in FULL:
        dyn = os.path.join(ROOT, "bench", ".cache", "models", n, "model.onnx")
        static = [os.path.join(d, f"{n}_static.onnx") for d in
                  [os.path.join(ROOT, "bench", ".cache", "models", "static")] + ([args.static_dir] if args.static_dir else [])]
        if os.path.exists(dyn):
            out.append((f"{n} (full)", dyn, FULL_DIMS, None))
        else:
            for s in static:
                if os.path.exists(s):
                    out.append((f"{n} (full, static)", s, [], None))
                    break
    return out


def index_bounds(m):
    """Input name -> rows of the initializer table a Gather reads with it (token ids),
    directly or through ops that keep the values (Reshape, Cast, ...)."""
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    users = {}
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            users.setdefault(i, []).append((n, k))
    out = {}
    for inp in m.graph.input:
        work, seen = [inp.name], set()
        while work:
            v = work.pop()
            if v in seen:
                continue
            seen.add(v)
            for n, k in users.get(v, []):
                if n.op_type == "Gather" and k == 1 and n.input[0] in inits:
                    out[inp.name] = min(out.get(inp.name, 1 << 62), inits[n.input[0]][0])
                elif n.op_type in ("Reshape", "Cast", "Unsqueeze", "Squeeze", "Flatten", "Identity") and k == 0:
                    work.append(n.output[0])
    return out


def random_feed(model_path, dims):
    """One held-out input set like kfuse's calibration sets, from another seed: floats in
    [-1, 1), token ids below the embedding table's rows, attention masks of ones."""
    m = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    bounds = index_bounds(m)
    bound = dict(d.split("=") for d in dims[1::2])
    rng = np.random.default_rng(1234)
    feed = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else int(bound.get(d.dim_param, 1))
                 for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feed[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        elif "mask" in i.name:
            feed[i.name] = np.ones(shape, np.int64)
        else:
            feed[i.name] = rng.integers(0, bounds.get(i.name, TOKEN_RANGE), shape).astype(np.int64)
    return feed


def test_feed(model_path, data_dir):
    """The test data set's inputs, or None."""
    if not data_dir or not os.path.isdir(data_dir):
        return None
    m = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    feed = {}
    for k, i in enumerate([i for i in m.graph.input if i.name not in inits]):
        t = onnx.TensorProto()
        with open(os.path.join(data_dir, f"input_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        feed[i.name] = numpy_helper.to_array(t)
    return feed


def ort_run(path, feed, optimize):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, feed)


def kfuse_ref(kfuse, path, feed, tmp):
    d = os.path.join(tmp, "in")
    o = os.path.join(tmp, "out")
    os.makedirs(d, exist_ok=True)
    for name, a in feed.items():
        np.save(os.path.join(d, f"{name}.npy"), a)
    subprocess.run([kfuse, "run", path, "--backend", "ref", "--inputs", d, "--outputs", o], check=True,
                   stdout=subprocess.DEVNULL)
    outs = []
    k = 0
    while os.path.exists(os.path.join(o, f"output_{k}.pb")):
        t = onnx.TensorProto()
        with open(os.path.join(o, f"output_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        outs.append(numpy_helper.to_array(t))
        k += 1
    return outs


def sqnr(ref, got):
    s = sum(float((r.astype(np.float64) ** 2).sum()) for r in ref)
    n = sum(float(((g.astype(np.float64) - r) ** 2).sum()) for r, g in zip(ref, got))
    return float("inf") if n == 0 else 10 * np.log10(s / n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kfuse", default=None)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--small-only", action="store_true")
    ap.add_argument("--static-dir", default=None, help="a folder with {resnet50,bert}_static.onnx")
    ap.add_argument("--keep", default=None, help="folder to keep the quantized models in")
    args = ap.parse_args()
    kfuse = args.kfuse or default_kfuse()
    rows, bad = [], False
    with tempfile.TemporaryDirectory() as tmp:
        outdir = args.keep or tmp
        os.makedirs(outdir, exist_ok=True)
        for label, path, dims, data in models(args):
            q = os.path.join(outdir, re.sub(r"[^a-z0-9]+", "_", label).strip("_") + ".onnx")
            t0 = time.time()
            r = subprocess.run([kfuse, "quantize", path, "-o", q, "--per-channel", "--method", "percentile",
                                "--random", str(args.samples), "--seed", "1"] + dims,
                               capture_output=True, text=True)
            secs = time.time() - t0
            if r.returncode:
                print(f"{label}: kfuse quantize failed ({r.returncode}): {r.stderr[-2000:]}", file=sys.stderr)
                bad = True
                continue
            line = [l for l in r.stdout.splitlines() if "output SQNR" in l][-1]
            db = float(re.search(r"output SQNR (\S+) dB", line).group(1))
            nodes = re.search(r"(\d+ of \d+) Conv/MatMul/Gemm", line).group(1)
            feed = random_feed(path, dims)
            fl = ort_run(path, feed, False)
            qn = ort_run(q, feed, False)
            qo = ort_run(q, feed, True)
            kr = kfuse_ref(kfuse, q, feed, tmp)
            steps = [(float(f.max()) - float(f.min())) / 255 for f in fl]
            dn = max(float(np.abs(a - b).max()) / s for a, b, s in zip(qn, kr, steps))
            do = max(float(np.abs(a - b).max()) / s for a, b, s in zip(qo, kr, steps))
            ok = dn <= 1 and do <= 1
            bad |= not ok
            tf = test_feed(path, data)
            tdb = sqnr(ort_run(path, tf, False), ort_run(q, tf, False)) if tf else None
            rows.append((label, nodes, db, sqnr(fl, qn), tdb, dn, do, secs, "yes" if ok else "NO"))
            print(f"{label}: {line}", file=sys.stderr)
    print(f"| model | quantized | SQNR vs fp32, kfuse ref, {args.samples} calibration sets (dB) "
          "| SQNR, ORT, held-out random set (dB) | SQNR, ORT, test_data_set_0 (dB) "
          "| max abs(ORT - kfuse) / step, ORT opt off | same, ORT opt on | within 1 step | quantize time (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tdb = f"{r[4]:.2f}" if r[4] is not None else "-"
        print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {tdb} | {r[5]:.3f} | {r[6]:.3f} | {r[8]} | {r[7]:.0f} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
