#!/usr/bin/env python3
"""Checks that exported models are right and that `kfuse opt` keeps their outputs.

For each model folder (model.onnx + test_data_set_0/, as bench/models/export.py writes
them): ONNX Runtime on the original model against PyTorch's expected outputs, then
`kfuse opt` and ONNX Runtime on kfuse's file against ONNX Runtime on the original, same
inputs (ORT's own graph optimizations off in both sessions, so only kfuse's rewrites
differ). Whole-model tolerance fp32 atol 1e-4, rtol 1e-3; the table shows the largest
absolute difference. With --ref it also runs kfuse's reference evaluator (`kfuse run
--inputs --outputs`) on the original and the optimized model against PyTorch's outputs at
the same tolerance. With --conform it runs `kfuse conform` on both, which uses the ONNX
backend-test tolerance (atol 1e-7, rtol 1e-3): right for single ops, tighter than fp32
PyTorch's own error on a 12-layer model (see bench/models/README.md). Exit 1 if any check
fails. Run with bench/.venv:

    bench/.venv/bin/python bench/models/check_opt.py [--kfuse build/tools/kfuse] [DIR ...]

Without DIRs: every model under bench/models/small/ and bench/.cache/models/.
"""
import argparse
import glob
import json
import os
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
ATOL, RTOL = 1e-4, 1e-3


def default_kfuse():
    for p in [os.environ.get("KFUSE", ""), os.path.join(ROOT, "build", "tools", "kfuse")] + \
            sorted(glob.glob(os.path.join(ROOT, "build*", "tools", "kfuse"))):
        if p and os.access(p, os.X_OK):
            return p
    return os.path.join(ROOT, "build", "tools", "kfuse")


def model_dirs(args):
    if args:
        return args
    found = []
    for root in (os.path.join(HERE, "small"), os.path.join(ROOT, "bench", ".cache", "models")):
        found += sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, "*", "model.onnx")))
    return found


def read_pbs(d, prefix):
    out = []
    i = 0
    while os.path.exists(os.path.join(d, f"{prefix}_{i}.pb")):
        t = onnx.TensorProto()
        with open(os.path.join(d, f"{prefix}_{i}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        out.append(numpy_helper.to_array(t))
        i += 1
    return out


def ort_run(path, inputs):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(s.get_inputs(), inputs)}
    return s.run(None, feeds)


def compare(got, want):
    """(ok, max abs diff) over all outputs, |got - want| <= atol + rtol |want| per element."""
    ok, worst = len(got) == len(want), 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        diff = np.abs(g64 - w64)
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
        ok = ok and bool(np.all(diff <= ATOL + RTOL * np.abs(w64)))
    return ok, worst


def conform(kfuse, model_path, data_dir, tmp):
    """Runs `kfuse conform` on a folder made of model_path + data_dir; returns (ok, detail)."""
    d = tempfile.mkdtemp(dir=tmp)
    os.symlink(os.path.abspath(model_path), os.path.join(d, "model.onnx"))
    os.symlink(os.path.abspath(data_dir), os.path.join(d, "test_data_set_0"))
    r = subprocess.run([kfuse, "conform", d], capture_output=True, text=True)
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
    return r.returncode == 0 and "1 passed" in last, (fails[0] if fails else last)


def ref_run(kfuse, model_path, data_dir, tmp):
    """Runs kfuse's reference evaluator; returns its outputs."""
    out = tempfile.mkdtemp(dir=tmp)
    r = subprocess.run([kfuse, "run", model_path, "--inputs", data_dir, "--outputs", out],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"kfuse run rc {r.returncode}: {r.stderr.strip()[:300]}")
    return read_pbs(out, "output")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--kfuse", default=default_kfuse())
    ap.add_argument("--ref", action="store_true", help="also kfuse's reference evaluator vs PyTorch")
    ap.add_argument("--conform", action="store_true", help="also kfuse conform, original and optimized")
    a = ap.parse_args()
    dirs = model_dirs(a.dirs)
    if not dirs:
        print("no models: run bench/models/export.py first", file=sys.stderr)
        return 2
    print(f"kfuse: {a.kfuse}   onnxruntime {ort.__version__}   atol {ATOL} rtol {RTOL}")
    hdr = f"{'model':34s} {'nodes':>6s} {'->opt':>6s} {'opt s':>6s} {'ORT vs torch':>14s} {'kfuse-opt vs orig':>18s}"
    if a.ref:
        hdr += f" {'ref vs torch':>14s} {'ref(opt) vs torch':>18s}"
    if a.conform:
        hdr += f" {'conform':>8s} {'conform(opt)':>12s}"
    print(hdr)
    failures = []
    with tempfile.TemporaryDirectory(prefix="kfuse_check_") as tmp:
        for d in dirs:
            name = os.path.relpath(d, ROOT)
            data = os.path.join(d, "test_data_set_0")
            inputs, expected = read_pbs(data, "input"), read_pbs(data, "output")
            model = os.path.join(d, "model.onnx")
            orig = ort_run(model, inputs)
            ok1, diff1 = compare(orig, expected)
            optp = os.path.join(tmp, name.replace("/", "_") + ".onnx")
            t0 = time.perf_counter()
            r = subprocess.run([a.kfuse, "opt", model, "-o", optp, "--json"], capture_output=True, text=True)
            dt = time.perf_counter() - t0
            if r.returncode:
                print(f"{name:34s} kfuse opt failed (rc {r.returncode}): {r.stderr.strip()[:300]}")
                failures.append((name, "kfuse opt", r.stderr.strip()))
                continue
            rep = json.loads(r.stdout)
            try:
                ok2, diff2 = compare(ort_run(optp, inputs), orig)
            except Exception as e:  # ORT refuses kfuse's file
                ok2, diff2 = False, float("nan")
                failures.append((name, "ORT refuses kfuse's output", str(e)[:300]))
                m = onnx.load(optp)
                if len({n.name for n in m.graph.node}) < len(m.graph.node):
                    # still compare the numbers, with node names made unique
                    for k, n in enumerate(m.graph.node):
                        n.name = f"{n.name}#{k}"
                    onnx.save(m, optp + ".renamed.onnx")
                    okr, diffr = compare(ort_run(optp + ".renamed.onnx", inputs), orig)
                    failures.append((name, "ORT on kfuse's output with node names made unique",
                                     f"{'ok' if okr else 'BAD'}, max abs diff {diffr:.3g}"))
            line = (f"{name:34s} {rep['nodes_before']:6d} {rep['nodes_after']:6d} {dt:6.2f} "
                    f"{('ok ' if ok1 else 'BAD ') + f'{diff1:.1e}':>14s} {('ok ' if ok2 else 'BAD ') + f'{diff2:.1e}':>18s}")
            if not ok1:
                failures.append((name, "ORT vs PyTorch", f"max abs diff {diff1:.3g}"))
            if not ok2 and not np.isnan(diff2):
                failures.append((name, "ORT(kfuse opt) vs ORT(orig)", f"max abs diff {diff2:.3g}"))
            if a.ref:
                for label, p, width in (("ref", model, 14), ("ref(opt)", optp, 18)):
                    try:
                        okr, diffr = compare(ref_run(a.kfuse, p, data, tmp), expected)
                        line += f" {('ok ' if okr else 'BAD ') + f'{diffr:.1e}':>{width}s}"
                        if not okr:
                            failures.append((name, f"kfuse {label} vs PyTorch", f"max abs diff {diffr:.3g}"))
                    except RuntimeError as e:
                        line += f" {'ERROR':>{width}s}"
                        failures.append((name, f"kfuse {label}", str(e)))
            if a.conform:
                c1, why1 = conform(a.kfuse, model, data, tmp)
                c2, why2 = conform(a.kfuse, optp, data, tmp)
                line += f" {'ok' if c1 else 'FAIL':>8s} {'ok' if c2 else 'FAIL':>12s}"
                if not c1:
                    failures.append((name, "kfuse conform", why1))
                if not c2:
                    failures.append((name, "kfuse conform (optimized)", why2))
            print(line, flush=True)
    for name, what, why in failures:
        print(f"FAIL {name}: {what}: {why}")
    print(f"{len(dirs) - len({f[0] for f in failures})} passed, {len({f[0] for f in failures})} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
