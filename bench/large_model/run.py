#!/usr/bin/env python3
"""Large models: `kfuse opt` on a model whose weights pass ONNX's 2 GiB protobuf limit.

Builds (once, cached under bench/.cache/large/) a chain of L MatMul+Add blocks with
4096x4096 float32 weights stored as ONNX external data (L=40: 2.5 GiB of weights), plus the
kind of clutter an exporter leaves (Identity, x*1, a Reshape that changes nothing), then:
  1. `kfuse opt` file to file under /usr/bin/time -v: wall time and peak RSS against the
     model's size (issue 3: memory stays within about 2x the model size);
  2. checks the optimized file keeps its weights as external data beside it;
  3. runs original and optimized on the reference evaluator with the same random inputs
     (`kfuse run --seed`) and compares the outputs (`--check`-style tolerance: fp32 atol 1e-5,
     rtol 1e-4).
Prints a markdown table; --write puts it into bench/RESULTS.md between this benchmark's
markers. Needs bench/.venv (onnx, numpy) and about 3x the weights in free disk.

    bench/.venv/bin/python bench/large_model/run.py [--kfuse build/tools/kfuse] [--layers 40] [--write]
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "RESULTS.md")
BEGIN, END = "<!-- large_model: begin -->", "<!-- large_model: end -->"
WIDTH = 4096  # 64 MiB per fp32 weight: few enough tensors to build quickly, big enough to pass 2 GiB


def build(path, layers):
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    cur = "x"
    one = numpy_helper.from_array(np.ones((), np.float32), "one")
    inits.append(one)
    for i in range(layers):
        w = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH)).astype(np.float32)
        b = rng.standard_normal(WIDTH, dtype=np.float32) * 0.1
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"ab{i}"]),
                  helper.make_node("Identity", [f"ab{i}"], [f"id{i}"]),
                  helper.make_node("Mul", [f"id{i}", "one"], [f"m1_{i}"]),
                  helper.make_node("Tanh", [f"m1_{i}"], [f"t{i}"])]
        cur = f"t{i}"
    g = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["N", WIDTH])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(path) + ".data", size_threshold=1024)


def timed(cmd):
    r = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", r.stderr).group(1)
    parts = [float(p) for p in wall.split(":")]
    secs = parts[-1] + 60 * parts[-2] + (3600 * parts[-3] if len(parts) > 2 else 0)
    return secs, rss, r.stdout


def compare(dir_a, dir_b):
    worst = 0.0
    for f in sorted(os.listdir(dir_a)):
        a = numpy_helper.to_array(onnx.load_tensor(os.path.join(dir_a, f)))
        b = numpy_helper.to_array(onnx.load_tensor(os.path.join(dir_b, f)))
        if a.shape != b.shape or not np.allclose(b, a, atol=1e-5, rtol=1e-4):
            return False, float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
        worst = max(worst, float(np.max(np.abs(a - b))))
    return True, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default=os.path.join(ROOT, "build/tools/kfuse"))
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    cache = os.path.join(BENCH, ".cache", "large")
    os.makedirs(cache, exist_ok=True)
    src = os.path.join(cache, f"chain{a.layers}.onnx")
    if not os.path.exists(src) or not os.path.exists(src + ".data"):
        print(f"building {src} ...", flush=True)
        build(src, a.layers)
    size = os.path.getsize(src) + os.path.getsize(src + ".data")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        out = os.path.join(tmp, "opt.onnx")
        secs, rss, js = timed([a.kfuse, "opt", src, "-o", out, "--json"])
        info = re.search(r'"nodes_before":\s*(\d+).*?"nodes_after":\s*(\d+)', js, re.S)
        nb, na = (int(info.group(1)), int(info.group(2))) if info else (-1, -1)
        ext = os.path.exists(out + ".data")
        outsize = os.path.getsize(out) + (os.path.getsize(out + ".data") if ext else 0)
        ra, rb = os.path.join(tmp, "ref_a"), os.path.join(tmp, "ref_b")
        for model, d in ((src, ra), (out, rb)):
            os.makedirs(d)
            subprocess.run([a.kfuse, "run", model, "--dim", "N=2", "--seed", "7", "--outputs", d], check=True,
                           capture_output=True)
        same, worst = compare(ra, rb)
    gib = 1 << 30
    rows = [
        "| model | weights on disk | nodes → after opt | kfuse opt wall | peak RSS | RSS / model size | output external data | outputs equal (max abs diff) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        f"| chain of {a.layers} MatMul+bias blocks, {WIDTH}² fp32 | {size / gib:.2f} GiB | {nb} → {na} | {secs:.1f} s | "
        f"{rss / gib:.2f} GiB | {rss / size:.2f}x | {'yes' if ext else 'NO'} ({outsize / gib:.2f} GiB) | "
        f"{'yes' if same else 'NO'} ({worst:.2g}) |",
    ]
    shown = os.path.relpath(a.kfuse, ROOT)
    if shown.startswith(".."):
        shown = a.kfuse  # a build outside the tree (e.g. a clean checkout): say where
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / gib
    section = "\n".join([
        BEGIN, "## Large model (bench/large_model/run.py)",
        "`kfuse opt` on a model past the 2 GiB protobuf limit (weights as external data). Target (issue 3): "
        "memory within about 2x the model size, weights written back as external data, outputs unchanged. "
        "This section is rewritten by `run.py --write`.",
        f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}",
        f"- machine: {os.cpu_count()} CPUs (nproc), {cpu}, {mem:.0f} GiB RAM",
        f"- kfuse: `{shown}` at commit {git}",
        f"- command: `bench/.venv/bin/python bench/large_model/run.py --kfuse {shown} --layers {a.layers} --write`",
        "", *rows, END])
    print("\n".join(rows))
    if a.write:
        text = open(RESULTS).read()
        if BEGIN in text:
            text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        open(RESULTS, "w").write(text)
    return 0 if same and ext else 1


if __name__ == "__main__":
    sys.exit(main())
