#!/usr/bin/env python3
"""ONNX Runtime runs what `kfuse opt` and `kfuse fuse` write for models whose
If branches, Loop and Scan bodies read values of the enclosing graph (an
initializer and node outputs used nowhere else, one through a nested If, a
duplicate that CSE merges, an Identity that no-op removal drops; the Loop
and Scan bodies hold a multiply by one and an add of zero, which the
optimizer removes inside them), and the
outputs equal the original model's on random inputs (DESIGN.md, fp32:
atol 1e-5, rtol 1e-4). kfuse's reference evaluator (`kfuse run`, and
`--backend opencl` where OpenCL is available) runs the original models too
and must give ONNX Runtime's outputs.

    capture_check.py --kfuse build/tools/kfuse [--seed N] [--keep DIR]

Prints one line per model and pipeline, then "N passed, M failed"; exits 1
on any failure. Needs onnx, onnxruntime and numpy (run by
tests/test_capture.c, which skips with the reason when they are missing).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, rng, shape):
    return numpy_helper.from_array(rng.uniform(-2, 2, shape).astype(np.float32), name)


def if_model(rng):
    inner_then = helper.make_graph([helper.make_node("Add", ["ti", "k"], ["a"])], "inner_then", [],
                                   [vi("a", F, [2, 3])])
    inner_else = helper.make_graph([helper.make_node("Sub", ["ti", "k"], ["b"])], "inner_else", [],
                                   [vi("b", F, [2, 3])])
    then_b = helper.make_graph(
        [helper.make_node("If", ["c"], ["yt"], then_branch=inner_then, else_branch=inner_else)], "then", [],
        [vi("yt", F, [2, 3])])
    else_b = helper.make_graph([helper.make_node("Mul", ["t2", "x"], ["ye"])], "else", [], [vi("ye", F, [2, 3])])
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t1"]),
        helper.make_node("Mul", ["x", "w"], ["t2"]),
        helper.make_node("Identity", ["t1"], ["ti"]),
        helper.make_node("Relu", ["t1"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b),
        helper.make_node("Add", ["y", "s"], ["z"]),
    ]
    g = helper.make_graph(nodes, "if_capture", [vi("x", F, [2, 3]), vi("c", TensorProto.BOOL, [])],
                          [vi("z", F, [2, 3])], [const("w", rng, [2, 3]), const("k", rng, [2, 3])])
    feeds = [{"x": rng.uniform(-2, 2, (2, 3)).astype(np.float32), "c": np.array(c)} for c in (True, False)]
    return g, feeds


def loop_model(rng):
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"]),
         helper.make_node("Add", ["v", "t"], ["u"]),
         helper.make_node("Mul", ["u", "one"], ["u1"]),
         helper.make_node("Mul", ["u1", "k"], ["v2"])], "body",
        [vi("i", TensorProto.INT64, []), vi("cin", TensorProto.BOOL, []), vi("v", F, [2, 3])],
        [vi("cout", TensorProto.BOOL, []), vi("v2", F, [2, 3])],
        [numpy_helper.from_array(np.array(1, np.float32), "one")])
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Loop", ["trip", "c", "x"], ["v"], body=body),
        helper.make_node("Relu", ["v"], ["z"]),
    ]
    g = helper.make_graph(nodes, "loop_capture",
                          [vi("x", F, [2, 3]), vi("trip", TensorProto.INT64, []), vi("c", TensorProto.BOOL, [])],
                          [vi("z", F, [2, 3])], [const("w", rng, [2, 3]), const("k", rng, [2, 3])])
    feeds = [{"x": rng.uniform(-1, 1, (2, 3)).astype(np.float32), "trip": np.array(3, dtype=np.int64),
              "c": np.array(True)}]
    return g, feeds


def scan_model(rng):
    body = helper.make_graph(
        [helper.make_node("Mul", ["row", "t"], ["p"]),
         helper.make_node("Add", ["p", "nought"], ["pz"]),
         helper.make_node("Add", ["s", "pz"], ["s2"]),
         helper.make_node("Identity", ["s2"], ["y"])], "body",
        [vi("s", F, [3]), vi("row", F, [3])], [vi("s2", F, [3]), vi("y", F, [3])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "nought")])
    nodes = [
        helper.make_node("Mul", ["s0", "w"], ["t"]),
        helper.make_node("Relu", ["t"], ["tr"]),
        helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1),
        helper.make_node("Add", ["s", "tr"], ["z"]),
    ]
    g = helper.make_graph(nodes, "scan_capture", [vi("x", F, [4, 3]), vi("s0", F, [3])],
                          [vi("z", F, [3]), vi("ys", F, [4, 3])], [const("w", rng, [3])])
    feeds = [{"x": rng.uniform(-2, 2, (4, 3)).astype(np.float32), "s0": rng.uniform(-2, 2, 3).astype(np.float32)}]
    return g, feeds


def run(path, feeds):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def kfuse_run(kfuse, src, feeds, work, backend):
    """Outputs of `kfuse run` on one set of feeds; a string saying why when
    it fails, None when the backend is not available here."""
    ins, outs = os.path.join(work, "in"), os.path.join(work, "out")
    for d in (ins, outs):
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
    names = [i.name for i in onnx.load(src).graph.input]
    for k, n in enumerate(names):
        with open(os.path.join(ins, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[n], n).SerializeToString())
    r = subprocess.run([kfuse, "run", src, "--backend", backend, "--inputs", ins, "--outputs", outs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        err = r.stderr.lower()
        if backend != "ref" and ("no opencl device" in err or "without opencl" in err):
            return None
        return f"kfuse exit {r.returncode}: {r.stderr.strip()}"
    got, k = [], 0
    while os.path.exists(os.path.join(outs, f"output_{k}.pb")):
        t = onnx.TensorProto()
        with open(os.path.join(outs, f"output_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        got.append(numpy_helper.to_array(t))
        k += 1
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kfuse", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", help="folder to keep the models in")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    work = args.keep or tempfile.mkdtemp(prefix="kfuse_capture_")
    os.makedirs(work, exist_ok=True)
    passed = failed = 0
    for name, make in (("if", if_model), ("loop", loop_model), ("scan", scan_model)):
        g, feeds = make(rng)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        src = os.path.join(work, f"{name}.onnx")
        onnx.save(model, src)
        want = [run(src, f) for f in feeds]
        for backend in ("ref", "opencl"):
            bad = []
            for fw, f in zip(want, feeds):
                got = kfuse_run(args.kfuse, src, f, work, backend)
                if got is None:
                    break
                if isinstance(got, str):
                    bad.append(got)
                    continue
                for i, (w, o) in enumerate(zip(fw, got)):
                    if w.shape != o.shape or not np.allclose(o, w, rtol=1e-4, atol=1e-5):
                        bad.append(f"output {i}: {'max |diff| %g' % np.max(np.abs(o - w)) if w.shape == o.shape else 'shape %s, expected %s' % (o.shape, w.shape)}")
                if len(got) != len(fw):
                    bad.append(f"{len(got)} outputs, expected {len(fw)}")
            else:
                if bad:
                    print(f"FAIL {name} run {backend}: {'; '.join(bad)}")
                    failed += 1
                else:
                    print(f"ok   {name} run {backend}")
                    passed += 1
        for verb in ("opt", "fuse"):
            out = os.path.join(work, f"{name}_{verb}.onnx")
            r = subprocess.run([args.kfuse, verb, src, "-o", out], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name} {verb}: kfuse exit {r.returncode}: {r.stderr.strip()}")
                failed += 1
                continue
            try:
                got = [run(out, f) for f in feeds]
            except Exception as e:  # ORT refuses the file
                print(f"FAIL {name} {verb}: onnxruntime: {str(e).splitlines()[0]}")
                failed += 1
                continue
            bad = []
            for fw, fg in zip(want, got):
                for i, (w, o) in enumerate(zip(fw, fg)):
                    if w.shape != o.shape or not np.allclose(o, w, rtol=1e-4, atol=1e-5):
                        bad.append(f"output {i}: max |diff| {np.max(np.abs(o - w)) if w.shape == o.shape else 'shape'}")
            if bad:
                print(f"FAIL {name} {verb}: {'; '.join(bad)}")
                failed += 1
            else:
                print(f"ok   {name} {verb}")
                passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
