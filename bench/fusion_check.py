#!/usr/bin/env python3
"""fusion_check.py: does ONNX Runtime run `kfuse fuse` output unchanged?

For each model folder (model.onnx + test_data_set_0), runs `kfuse fuse`,
then ONNX Runtime on the original and on the fused file with the folder's
inputs, and compares outputs (fp32/fp64 atol 1e-5 rtol 1e-4, fp16 2.5e-3/1e-3,
integers and bools exactly: DESIGN.md's policy for fused vs unfused). Prints
one table row per model and a summary; exit 1 when a fused file fails or
differs. Without onnxruntime (bench/.venv has it after setup_venv.sh) it
says so and exits 0.

usage: bench/.venv/bin/python bench/fusion_check.py [--kfuse BIN] [--checker] [DIR...]
  DIR     model folders, or folders of them (default: the ONNX test data)
  --checker  also run onnx.checker.check_model(full_check=True) on each fused file
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import onnxruntime as ort
except ImportError as e:  # pragma: no cover
    print(f"fusion_check: skipped: {e} (run bench/setup_venv.sh, use bench/.venv/bin/python)")
    sys.exit(0)

TESTDATA = "/usr/share/libonnx-testdata/data"
HERE = os.path.dirname(os.path.abspath(__file__))


def find_kfuse():
    for d in sorted(glob.glob(os.path.join(HERE, "..", "build*", "tools", "kfuse"))):
        if os.access(d, os.X_OK):
            return d
    return "kfuse"


def model_dirs(args):
    roots = args or [os.path.join(TESTDATA, s) for s in ("node", "pytorch-converted", "pytorch-operator", "simple")]
    out = []
    for r in roots:
        if os.path.exists(os.path.join(r, "model.onnx")):
            out.append(r)
        else:
            out += sorted(os.path.dirname(p) for p in glob.glob(os.path.join(r, "*", "model.onnx")))
    return out


def tol(dt):
    if dt in (np.float32, np.float64):
        return 1e-5, 1e-4
    if dt == np.float16:
        return 2.5e-3, 1e-3
    return 0.0, 0.0


def load_inputs(d, sess):
    ins = {}
    for i, inp in enumerate(sess.get_inputs()):
        p = os.path.join(d, "test_data_set_0", f"input_{i}.pb")
        t = onnx.TensorProto()
        with open(p, "rb") as f:
            t.ParseFromString(f.read())
        ins[inp.name] = numpy_helper.to_array(t)
    return ins


def close(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf")
    if a.dtype.kind in "fc":
        atol, rtol = tol(a.dtype.type)
        a64, b64 = np.atleast_1d(a.astype(np.float64)), np.atleast_1d(b.astype(np.float64))
        if (np.isnan(a64) != np.isnan(b64)).any():
            return False, float("nan")
        with np.errstate(invalid="ignore"):
            d = np.abs(a64 - b64)
        d[np.isnan(a64) | (np.isinf(a64) & (a64 == b64))] = 0  # NaN matches NaN, Inf matches Inf
        with np.errstate(invalid="ignore"):
            ok = bool(((d == 0) | (d <= atol + rtol * np.abs(b64))).all())
        return ok, float(d.max()) if d.size else 0.0
    return bool((a == b).all()), 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kfuse", default=find_kfuse())
    ap.add_argument("--checker", action="store_true")
    ap.add_argument("dirs", nargs="*")
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    rows, counts = [], {"pass": 0, "fail": 0, "skip": 0, "nofunc": 0}
    tmp = tempfile.mkdtemp(prefix="kfuse_fusion_check_")
    for d in model_dirs(args.dirs):
        name = os.path.relpath(d, TESTDATA) if d.startswith(TESTDATA) else d
        src = os.path.join(d, "model.onnx")
        try:
            s0 = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
            ins = load_inputs(d, s0)
            want = s0.run(None, ins)
        except Exception as e:  # the original itself does not run: not ours to judge
            counts["skip"] += 1
            rows.append((name, "-", "-", "SKIP", f"original does not run in ORT: {str(e).splitlines()[0][:60]}"))
            continue
        out = os.path.join(tmp, name.replace("/", "_") + ".onnx")
        r = subprocess.run([args.kfuse, "fuse", src, "-o", out], capture_output=True, text=True)
        if r.returncode != 0:
            counts["skip"] += 1
            rows.append((name, "-", "-", "SKIP", "kfuse: " + r.stderr.strip().splitlines()[-1][:70]))
            continue
        fm = onnx.load(out)
        nfunc = len(fm.functions)
        if not nfunc:
            counts["nofunc"] += 1
        try:
            if args.checker:
                onnx.checker.check_model(fm, full_check=True)
            s1 = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
            got = s1.run(None, ins)
        except Exception as e:
            counts["fail"] += 1
            rows.append((name, len(fm.graph.node), nfunc, "FAIL", str(e).splitlines()[0][:90]))
            continue
        worst, ok = 0.0, True
        for a, b in zip(got, want):
            good, diff = close(a, b)
            ok &= good
            worst = max(worst, diff) if diff == diff else float("nan")
        counts["pass" if ok else "fail"] += 1
        if nfunc or not ok:
            rows.append((name, len(fm.graph.node), nfunc, "PASS" if ok else "FAIL", f"max |diff| {worst:.3g}"))
    w = max([len(r[0]) for r in rows] + [5])
    print(f"{'model':<{w}} {'nodes':>5} {'funcs':>5} result  note")
    for r in rows:
        print(f"{r[0]:<{w}} {r[1]!s:>5} {r[2]!s:>5} {r[3]:<6}  {r[4]}")
    print(f"\n{counts['pass']} passed ({counts['nofunc']} of them without functions), {counts['fail']} failed, "
          f"{counts['skip']} skipped  [onnxruntime {ort.__version__}, kfuse {args.kfuse}]")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
