#!/usr/bin/env python3
"""Cost-model calibration: the cost model's estimate of every kernel measured on a GPU.

Takes the plans that were measured (BERT-base seq 128 and ResNet-50 224, batch 1, static
shapes, as bench/gpu_torch_latency.py exports them; make them with export_static.py), plans
them with the bytes-only planner they ran with (`kfuse fuse --legal-only`, the plan of main
269162c), and matches the plan's launches in order against Nsight Compute's per-kernel list
(`gpu__time_duration.sum`, ../shared/gpu/ncu_*_fp32.csv):
  - a group that ran as a generated kernel (`kf_*`) is compared with the estimate of its
    generated form (the same target with vendor_lib = 0);
  - a group that ran as library calls (cuBLAS, cuDNN and cuDNN's layout transposes) with the
    estimate of its library form; the measured time is the sum of those calls;
  - cuDNN ran float32 convolutions on TF32 tensor cores there, so library estimates use
    `--precision tf32` (what that run did; strict fp32 is the fix).
Prints one line per kernel (estimate, measured, ratio) and a table per kernel class: count,
geometric mean of estimate / measured, worst ratio, and how many lie within 2x.
With --markdown it prints the tables for bench/RESULTS.md.

    python3 bench/cost_model/calibrate.py --kfuse build/tools/kfuse [--models DIR] [--gpu ../shared/gpu]
"""
import argparse
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def ncu_kernels(path):
    """(name, grid blocks, ns) per launch of one run (the CSV holds the capture run too)."""
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("".join(lines))))
    ks = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        g = [int(x) for x in r["Grid Size"].strip("()").split(",")]
        ks.append((r["Kernel Name"], g[0] * g[1] * g[2], float(r["Metric Value"].replace(",", ""))))
    half = len(ks) // 2
    if half and [k[0] for k in ks[:half]] == [k[0] for k in ks[half:]]:
        # both runs alike: the median of the two figures per kernel
        ks = [(a[0], a[1], (a[2] + b[2]) / 2) for a, b in zip(ks[:half], ks[half:])]
    return ks


def plan(kfuse, model, target, precision):
    """The plan as JSON, and the groups codegen declines (they ran on the host)."""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([kfuse, "fuse", model, "-o", os.path.join(d, "f.onnx"), "--json", "--legal-only",
                            "--target", target, "--precision", precision, "--emit", os.path.join(d, "k")],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"kfuse fuse failed: {r.stderr}")
        host = {int(m.group(1)) for m in re.finditer(r"group (\d+) not generated", r.stderr)}
        return json.loads(r.stdout), host


def kernel_class(name, group):
    if name.startswith("kf_"):
        return name
    if "Gemv" in name or "gemv" in name:
        return "cuBLAS gemv"
    return "cuDNN conv"


def is_layout(name):
    return "nchwToNhwc" in name or "nhwcToNchw" in name


def match(measured, groups_lib, groups_gen, host, floor_us, launch_us):
    """Walks the launches of the plan against the measured kernels; yields
    (group id, ops, class, estimate us, measured us, grid est, grid measured).
    A library group takes one main kernel (the GEMM or convolution); the
    layout transposes cuDNN ran around it are rows of their own, estimated as
    the smallest kernel (floor_us: a few hundred KB each at batch 1). Groups
    codegen declined ran on the host (no kernel)."""
    launches = {}
    for g_lib, g_gen in zip(groups_lib, groups_gen):
        if g_lib["launch"] == 4294967295 or g_lib["est_form"] in (None, "none") or g_lib["id"] in host:
            continue
        launches.setdefault(g_lib["launch"], []).append((g_lib, g_gen))
    i = 0
    out = []
    for l in sorted(launches):
        members = launches[l]
        if i >= len(measured):
            break
        name = measured[i][0]
        if name.startswith("kf_"):
            est = sum(g[1]["est_us"] for g in members) - launch_us
            g0 = members[0][1]
            out.append((g0["id"], " ".join(g0["ops"]), name, est, measured[i][2] / 1e3, g0["est_blocks"], measured[i][1]))
            i += 1
            continue
        g0 = members[0][0]
        seen_main, epi = False, 0
        while i < len(measured) and not measured[i][0].startswith("kf_"):
            n, blocks, ns = measured[i]
            if is_layout(n):
                if seen_main and "nchwToNhwc" in n:
                    break  # the next call's input transpose
                out.append((g0["id"], "layout transpose", "cuDNN layout transpose", floor_us, ns / 1e3, "-", blocks))
            else:
                if seen_main:
                    break
                seen_main = True
                epi = g0.get("est_epilogue_us", 0)
                out.append((g0["id"], " ".join(g0["ops"]), kernel_class(n, g0),
                             sum(g[0]["est_us"] for g in members) - epi - launch_us, ns / 1e3, g0["est_blocks"], blocks))
            i += 1
        if epi > 0 and i < len(measured) and measured[i][0].startswith("kf_"):
            n, blocks, ns = measured[i]  # the generated epilogue kernel after the call
            out.append((g0["id"], "epilogue after the library call", n, epi - launch_us, ns / 1e3, "-", blocks))
            i += 1
    return out


# Memory-bound kernels measured one group each (../shared/gpu/README.md, device p50 of
# `kfuse bench --backend cuda`): (name, builder, measured us).
MEMORY_BOUND = [
    ("LayerNormalization fp32 [32768,1024]", "ln", "float32", 187.0),
    ("Softmax fp32 [32768,1024]", "softmax", "float32", 214.0),
    ("Add + Gelu fp32 [32768,1024]", "add_gelu", "float32", 95.0),
    ("LayerNormalization fp16 [32768,1024]", "ln", "float16", 181.0),
    ("4 elementwise ops, 2^26 floats", "ew4", "float32", 165.0),
]


def memory_bound_model(kind, dtype, path):
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    et = T.FLOAT16 if dtype == "float16" else T.FLOAT
    if kind == "ew4":
        n = 1 << 26
        nodes = [h.make_node("Tanh", ["x"], ["a"]), h.make_node("Mul", ["a", "x"], ["b"]),
                 h.make_node("Sigmoid", ["b"], ["c"]), h.make_node("Add", ["c", "a"], ["z"])]
        g = h.make_graph(nodes, "ew", [h.make_tensor_value_info("x", et, [n])], [h.make_tensor_value_info("z", et, [n])])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
        return
    shape = [32768, 1024]
    inits = []
    if kind == "ln":
        inits = [nh.from_array(np.ones(1024, dtype=dtype), "s"), nh.from_array(np.zeros(1024, dtype=dtype), "b")]
        nodes = [h.make_node("LayerNormalization", ["x", "s", "b"], ["z"], axis=-1)]
    elif kind == "softmax":
        nodes = [h.make_node("Softmax", ["x"], ["z"], axis=-1)]
    else:
        inits = [nh.from_array(np.full(1024, 0.5, dtype=dtype), "b")]
        nodes = [h.make_node("Add", ["x", "b"], ["y"]), h.make_node("Gelu", ["y"], ["z"])]
    g = h.make_graph(nodes, kind, [h.make_tensor_value_info("x", et, shape)], [h.make_tensor_value_info("z", et, shape)],
                     initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 20)]), path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default=os.path.join(ROOT, "build/tools/kfuse"))
    ap.add_argument("--models", default=os.path.join(ROOT, "bench/.cache/models/static"))
    ap.add_argument("--gpu", default=os.path.join(ROOT, "..", "shared", "gpu"))
    ap.add_argument("--target", default="h200")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    # the same profile without vendor libraries: every anchor as its generated kernel
    tpath = a.target if a.target.endswith(".target") else os.path.join(ROOT, "fusion", "targets", a.target + ".target")
    with open(tpath) as f:
        src = f.read()
    nolib = tempfile.NamedTemporaryFile("w", suffix=".target", delete=False)
    nolib.write("\n".join(("vendor_lib = 0" if l.split("=")[0].strip() == "vendor_lib" else l)
                          for l in src.splitlines()) + "\n")
    nolib.close()
    prof = {k.strip(): v.strip() for k, v in (l.split("#")[0].split("=", 1) for l in src.splitlines() if "=" in l.split("#")[0])}
    # a cuDNN transpose: the smallest kernel of the profile, plus what a launched node costs
    # (its own launch inside the library call is part of the call)
    floor_us = float(prof["kernel_min_us"]) + float(prof["launch_us"])
    launch_us = float(prof["launch_us"])
    rows = []
    for model, csvname in (("bert", "ncu_bert_base_fp32.csv"), ("resnet50", "ncu_resnet50_fp32.csv")):
        path = os.path.join(a.models, f"{model}_static.onnx")
        measured = ncu_kernels(os.path.join(a.gpu, csvname))
        lib, host = plan(a.kfuse, path, tpath, "tf32")
        gen, _ = plan(a.kfuse, path, nolib.name, "fp32")
        for r in match(measured, lib["groups"], gen["groups"], host, floor_us, launch_us):
            rows.append((model,) + r)
    with tempfile.TemporaryDirectory() as d:
        for name, kind, dtype, us in MEMORY_BOUND:
            path = os.path.join(d, kind + dtype + ".onnx")
            memory_bound_model(kind, dtype, path)
            gen, _ = plan(a.kfuse, path, nolib.name, "fp32")
            gs = [g for g in gen["groups"] if g["est_form"] not in (None, "none")]
            if len(gs) != 1:
                sys.exit(f"{name}: expected one kernel group, got {len(gs)}")
            rows.append(("synthetic", gs[0]["id"], name, "kf_" + gs[0]["est_form"] + " (memory-bound)",
                         gs[0]["est_us"] - launch_us, us, gs[0]["est_blocks"], "-"))
    os.unlink(nolib.name)
    classes = {}
    lines = ["| model | ops | kernel | launches | est blocks | grid | estimate µs | measured µs | est / measured |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    same = {}  # identical estimates of one kind of group: one row, measured min-max
    for model, gid, ops, cls, est, meas, eb, mb in rows:
        ratio = est / meas if meas > 0 else float("inf")
        classes.setdefault(cls, []).append(ratio)
        same.setdefault((model, ops, cls, round(est, 1), eb, mb), []).append(meas)
    for (model, ops, cls, est, eb, mb), ms in same.items():
        lo, hi = min(ms), max(ms)
        meas = f"{lo:.1f}" if hi - lo < 0.05 else f"{lo:.1f}–{hi:.1f}"
        rat = f"{est / hi:.2f}" if hi - lo < 0.05 else f"{est / hi:.2f}–{est / lo:.2f}"
        lines.append(f"| {model} | {ops[:48]} | {cls} | {len(ms)} | {eb} | {mb} | {est:.1f} | {meas} | {rat} |")
    summary = ["| kernel class | kernels | geo-mean est / measured | worst | within 2x |", "|---|---:|---:|---:|---:|"]
    allr = []
    for cls, rs in sorted(classes.items()):
        gm = math.exp(sum(math.log(r) for r in rs) / len(rs))
        worst = max(rs, key=lambda r: abs(math.log(r)))
        within = sum(1 for r in rs if 0.5 <= r <= 2.0)
        allr += rs
        summary.append(f"| {cls} | {len(rs)} | {gm:.2f} | {worst:.2f} | {within}/{len(rs)} |")
    within = sum(1 for r in allr if 0.5 <= r <= 2.0)
    gm = math.exp(sum(math.log(r) for r in allr) / len(allr)) if allr else float("nan")
    summary.append(f"| all | {len(allr)} | {gm:.2f} | {max(allr, key=lambda r: abs(math.log(r))):.2f} | {within}/{len(allr)} |")
    print("\n".join(summary))
    print()
    print("\n".join(lines))
    if within != len(allr):
        sys.exit(1)


if __name__ == "__main__":
    main()
