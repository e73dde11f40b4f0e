"""Symbolic against static: `kfuse opt` and `kfuse fuse` on exports whose batch and
sequence dims are symbolic (dynamic axes), and on the same files with the dims fixed
(`--dim batch=B --dim seq=S`).

Per model it prints the nodes after opt (all, and those that read data rather than only
shapes: a static copy folds the shape-only ones away), the per-rule hits that differ outside
the shape rules (fold, cse, remove_*, collapse_*, compose_*, gather_arange_*), the opset
reached, and fuse's kernel launches.

    bench/.venv/bin/python bench/models/dyn_parity.py [--kfuse build/tools/kfuse]
        [--batch 1 --seq 128] DIR_OR_MODEL...
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx

SHAPE_RULES = ("fold", "cse", "remove_", "collapse_", "compose_", "gather_arange")


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def data_nodes(path):
    """Nodes whose outputs depend on graph input data, not only on shapes and constants."""
    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    dep = {i.name for i in m.graph.input if i.name not in inits}
    count = 0
    for n in m.graph.node:
        d = n.op_type not in ("Shape", "Size") and any(i in dep for i in n.input if i)
        if d:
            dep.update(n.output)
            count += 1
    return count


def dims_of(path):
    m = onnx.load(path, load_external_data=False)
    return {d.dim_param for i in m.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}


def measure(kfuse, model, dims, tmp):
    flags = []
    for k, v in dims.items():
        flags += ["--dim", f"{k}={v}"]
    out = os.path.join(tmp, "o.onnx")
    opt = run_json([kfuse, "opt", model, "-o", out, "--json"] + flags)
    hits = dict(opt["rules"])  # rules that fired: name -> hits
    fuse = run_json([kfuse, "fuse", model, "-o", os.path.join(tmp, "f.onnx"), "--json"] + flags)
    return {"nodes": opt["nodes_after"], "data": data_nodes(out), "hits": hits, "opset": opt["opset_after"],
            "kernels": fuse["kernels"], "opt_s": opt["time_opt_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "kfuse"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("paths", nargs="+")
    a = ap.parse_args()
    models = []
    for p in a.paths:
        if os.path.isdir(p):
            for root, _, files in sorted(os.walk(p)):
                models += [os.path.join(root, f) for f in sorted(files) if f.endswith(".onnx")]
        else:
            models.append(p)
    print("| model | nodes sym / static | data nodes sym / static | kernels sym / static | opset sym / static "
          "| math-rule hits that differ |")
    print("|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            names = dims_of(m)
            fixed = {k: (a.batch if "batch" in k or k == "N" else a.seq) for k in names}
            s = measure(a.kfuse, m, {}, tmp)
            t = measure(a.kfuse, m, fixed, tmp)
            diff = [f"{r} {s['hits'].get(r, 0)}/{h}" for r, h in sorted(t["hits"].items())
                    if not r.startswith(SHAPE_RULES) and s["hits"].get(r, 0) != h]
            name = os.path.relpath(m)
            print(f"| {name} | {s['nodes']} / {t['nodes']} | {s['data']} / {t['data']} | {s['kernels']} / {t['kernels']} "
                  f"| {s['opset']} / {t['opset']} | {', '.join(diff) or 'none'} |")


if __name__ == "__main__":
    main()
