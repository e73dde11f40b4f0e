#!/usr/bin/env python3
"""Fusion quality: kernels and modeled DRAM bytes of `kfuse fuse` against ONNX Runtime's
optimized graphs, on the full-size real models (bench/.cache/models/*, random weights).

For each model, one run, same shapes for every tool:
  nodes          nodes of the exported model (symbolic batch/seq)
  ORT            nodes of ONNX Runtime's optimized graph: InferenceSession with ORT_ENABLE_ALL,
                 CPU provider, optimized_model_filepath; each node is one kernel call
  ORT-tr         (BERT, GPT-2) nodes after onnxruntime.transformers.optimizer.optimize_model
                 (num_heads=12, hidden_size=768, use_gpu=False) at opt_level 1 (its default for
                 these model types) and 99
  kfuse          `kfuse fuse M.onnx -o OUT.onnx --json`: kernels (launches), modeled DRAM bytes
                 before and after fusion and the lower bound (every weight, input and output
                 touched once), and the boundary reasons of the plan
`kfuse fuse` has no option to fix symbolic dimensions (no --dim), and its byte figures are
-1 (unknown) while batch and sequence are symbolic. So every tool reads a static copy of the
model (bench/.cache/fusion_quality/<name>_b<B>_s<S>.onnx) whose inputs carry --batch and
--seq (and whose outputs' symbolic dims are filled in or cleared); kfuse is also run on the
symbolic original, whose kernel count is reported alongside ("kernels, symbolic").
--write replaces this benchmark's section of bench/RESULTS.md; --chart writes the PNG. Run:

    bench/.venv/bin/python bench/fusion_quality/run.py [--kfuse build/tools/kfuse] [--write]
"""
import argparse
import collections
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "RESULTS.md")
MODELS_DIR = os.path.join(BENCH, ".cache", "models")
STATIC_DIR = os.path.join(BENCH, ".cache", "fusion_quality")
CHART = os.path.join(HERE, "fusion_quality.png")
BEGIN, END = "<!-- fusion_quality: begin -->", "<!-- fusion_quality: end -->"
NAMES = ["bert", "gpt2", "resnet50", "mobilenetv2", "vit_b16"]
LABELS = {"bert": "BERT-base", "gpt2": "GPT-2 small", "resnet50": "ResNet-50",
          "mobilenetv2": "MobileNetV2", "vit_b16": "ViT-B/16"}
TRANSFORMER_TYPE = {"bert": "bert", "gpt2": "gpt2"}  # models the transformers optimizer knows
TR_LEVELS = [1, 99]
# The target for modeled bytes; it names these two models.
BYTES_TARGET, BYTES_MODELS = 1.3, ("bert", "resnet50")


# ---- workers: each peer in its own process (memory, and ORT's global state) ---------------

def worker(tool, model, out, arg):
    import onnx
    if tool == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = out
        so.log_severity_level = 3
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        n = len(onnx.load(out, load_external_data=False).graph.node)
    elif tool == "ort_tr":
        import logging
        logging.disable(logging.WARNING)
        from onnxruntime.transformers import optimizer
        mtype, level = arg.split(":")
        opt = optimizer.optimize_model(model, model_type=mtype, num_heads=12, hidden_size=768,
                                       opt_level=int(level), use_gpu=False)
        n = len(opt.model.graph.node)
    else:
        raise SystemExit(f"unknown tool {tool}")
    print(json.dumps({"nodes": n}))


def run_worker(tool, model, out, arg="", timeout=1800):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", tool, model, out, arg],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{tool} rc {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["nodes"]


# ---- driver --------------------------------------------------------------------------

def default_kfuse():
    for p in [os.environ.get("KFUSE", ""), os.path.join(ROOT, "build", "tools", "kfuse")] + \
            sorted(glob.glob(os.path.join(ROOT, "build*", "tools", "kfuse"))):
        if p and os.access(p, os.X_OK):
            return p
    return os.path.join(ROOT, "build", "tools", "kfuse")


def static_copy(name, batch, seq):
    """The model with batch and seq fixed on its inputs; output dims named batch/seq are
    filled in, other symbolic output dims cleared (the tools infer them). Cached."""
    import onnx
    src = os.path.join(MODELS_DIR, name, "model.onnx")
    dst = os.path.join(STATIC_DIR, f"{name}_b{batch}_s{seq}.onnx")
    if os.path.exists(dst) and os.path.getmtime(dst) >= os.path.getmtime(src):
        return src, dst
    os.makedirs(STATIC_DIR, exist_ok=True)
    m = onnx.load(src)
    fixed = {"batch": batch, "seq": seq}
    for vi in list(m.graph.input) + list(m.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                if d.dim_param in fixed:
                    d.dim_value = fixed[d.dim_param]
                elif vi in m.graph.input:
                    raise SystemExit(f"{name}: input {vi.name} has unknown symbolic dim {d.dim_param}")
                else:
                    d.ClearField("dim_param")
    del m.graph.value_info[:]
    onnx.save(m, dst + ".tmp")
    os.replace(dst + ".tmp", dst)
    return src, dst


def kfuse_fuse(kfuse, model, out, extra=()):
    r = subprocess.run([kfuse, "fuse", model, "-o", out, *extra], capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise RuntimeError(f"kfuse fuse rc {r.returncode}: {r.stderr.strip()[:400]}")
    return r


def count_nodes(path):
    import onnx
    return len(onnx.load(path, load_external_data=False).graph.node)


def value_bytes(path):
    """{value name: bytes} of the top-level values of a model whose shapes ONNX's shape
    inference can fix (the static copies: all of them); used to weigh boundaries."""
    import numpy as np
    import onnx
    m = onnx.shape_inference.infer_shapes(onnx.load(path), data_prop=True)
    out = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        t = vi.type.tensor_type
        if not t.HasField("shape") or not t.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if None in dims:
            continue
        out[vi.name] = int(np.prod(dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).itemsize
    return out


def machine():
    cpu = ""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name"):
            cpu = line.split(":", 1)[1].strip()
    with open("/proc/meminfo") as f:
        kb = int(f.readline().split()[1])
    return f"{os.cpu_count()} CPUs (nproc), {cpu}, {kb / 1024 / 1024:.0f} GiB RAM"


def git_rev():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    d = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    rev = r.stdout.strip() or "?"
    return rev + (" + uncommitted changes" if d.stdout.strip() else "")


def fmt_bytes(b):
    if b is None or b < 0:
        return "unknown"
    return f"{b / 2**20:,.1f} MiB"


def measure(name, kfuse, batch, seq, tmp, say):
    src, static = static_copy(name, batch, seq)
    row = {"name": name, "nodes": count_nodes(src)}
    t0 = time.perf_counter()
    row["ort"] = run_worker("ort", static, os.path.join(tmp, f"{name}.ort.onnx"))
    if name in TRANSFORMER_TYPE:
        row["ort_tr"] = {lv: run_worker("ort_tr", static, "-", f"{TRANSFORMER_TYPE[name]}:{lv}")
                         for lv in TR_LEVELS}
    t_ort = time.perf_counter() - t0
    out = os.path.join(tmp, f"{name}.kfuse.onnx")
    js = json.loads(kfuse_fuse(kfuse, static, out, ["--json"]).stdout)
    row["kfuse"] = {k: js.get(k) for k in ("nodes_before", "nodes_after", "kernels", "functions",
                                           "modeled_bytes_before", "modeled_bytes_after",
                                           "modeled_bytes_lower_bound")}
    row["kfuse"]["fused_file_nodes"] = count_nodes(out)
    sizes = value_bytes(out)
    groups = js.get("groups", [])
    row["kinds"] = collections.Counter(g.get("kind", "?") for g in groups)
    row["reasons"] = collections.Counter(b.get("reason") or "(none)" for b in js.get("boundaries", []))
    # boundary reasons between distinct launches only (a boundary inside one batched launch
    # does not cost a kernel)
    launch = {g["id"]: g.get("launch") for g in groups}
    row["reasons_launch"] = collections.Counter(
        b.get("reason") or "(none)" for b in js.get("boundaries", [])
        if launch.get(b["from"]) != launch.get(b["to"]))
    # bytes read across boundaries, by reason: each boundary is one (producer group, consumer
    # group, value) triple, so this is what consumer groups read of values other groups wrote
    row["reason_bytes"] = collections.Counter()
    row["reason_unsized"] = collections.Counter()
    for b in js.get("boundaries", []):
        why = b.get("reason") or "(none)"
        if b.get("value") in sizes:
            row["reason_bytes"][why] += sizes[b["value"]]
        else:
            row["reason_unsized"][why] += 1
    row["singletons"] = collections.Counter(g["ops"][0] for g in groups if len(g.get("ops", [])) == 1)
    sym = json.loads(kfuse_fuse(kfuse, src, os.path.join(tmp, f"{name}.sym.onnx"), ["--json"]).stdout)
    row["kfuse_sym_kernels"] = sym.get("kernels")
    row["kfuse_sym_bytes"] = sym.get("modeled_bytes_after")
    say(f"{name}: nodes {row['nodes']}, ORT {row['ort']}, ORT-tr {row.get('ort_tr', '-')} "
        f"({t_ort:.0f} s), kfuse {row['kfuse']['kernels']} kernels (symbolic: {row['kfuse_sym_kernels']}), "
        f"bytes {fmt_bytes(row['kfuse']['modeled_bytes_after'])} / lb "
        f"{fmt_bytes(row['kfuse']['modeled_bytes_lower_bound'])}")
    return row


def ratio(row):
    a, lb = row["kfuse"]["modeled_bytes_after"], row["kfuse"]["modeled_bytes_lower_bound"]
    return a / lb if a is not None and lb and a >= 0 and lb > 0 else None


def best_ort(row):
    return min([row["ort"]] + list(row.get("ort_tr", {}).values()))


def table(rows):
    lines = ["| model | nodes | ORT | ORT-tr L1 | ORT-tr L99 | kfuse opt → nodes | kfuse kernels | "
             "kernels, symbolic | bytes unfused | bytes fused | lower bound | fused / lower bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        k, tr = r["kfuse"], r.get("ort_tr", {})
        rt = ratio(r)
        lines.append(
            f"| {LABELS[r['name']]} | {r['nodes']} | {r['ort']} | {tr.get(1, '—')} | {tr.get(99, '—')} | "
            f"{k['nodes_after']} | {k['kernels']} | {r['kfuse_sym_kernels']} | "
            f"{fmt_bytes(k['modeled_bytes_before'])} | {fmt_bytes(k['modeled_bytes_after'])} | "
            f"{fmt_bytes(k['modeled_bytes_lower_bound'])} | {'unknown' if rt is None else f'{rt:.2f}x'} |")
    return lines


def targets(rows):
    out = []
    miss = [r for r in rows if r["kfuse"]["kernels"] >= best_ort(r)]
    out.append("- fewer kernels than ONNX Runtime on every model (against the smallest ORT count, "
               "ORT-tr included): " + ("**met**" if not miss else "**not met** on " + ", ".join(
                   f"{LABELS[r['name']]} ({r['kfuse']['kernels']} vs {best_ort(r)})" for r in miss)))
    for name in BYTES_MODELS:
        r = next((x for x in rows if x["name"] == name), None)
        if r is None:
            continue
        rt = ratio(r)
        verdict = "unknown (no byte figure)" if rt is None else \
            ("**met**" if rt <= BYTES_TARGET else "**not met**") + f" ({rt:.2f}x)"
        out.append(f"- modeled bytes within {BYTES_TARGET}x of the lower bound on {LABELS[name]}: {verdict}")
    return out


def reasons_table(rows, top=4):
    lines = ["| model | group kinds | boundaries between launches: top reasons (count) | "
             "bytes read across boundaries, by reason | most frequent single-op groups |",
             "|---|---|---|---|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} {n}" for k, n in r["kinds"].most_common())
        rs = "; ".join(f"{n}× {why}" for why, n in r["reasons_launch"].most_common(top))
        rb = "; ".join(f"{fmt_bytes(n)} {why}" for why, n in r["reason_bytes"].most_common(top))
        if r["reason_unsized"]:
            rb += f"; ({sum(r['reason_unsized'].values())} boundaries of unknown size)"
        single = ", ".join(f"{op} {n}" for op, n in r["singletons"].most_common(5))
        lines.append(f"| {LABELS[r['name']]} | {kinds} | {rs} | {rb} | {single} |")
    return lines


def chart(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = [("original nodes", lambda r: r["nodes"], "#b0b0b0"),
              ("ONNX Runtime (ORT_ENABLE_ALL)", lambda r: r["ort"], "#4c72b0"),
              ("ORT transformers optimizer (best level)",
               lambda r: min(r["ort_tr"].values()) if r.get("ort_tr") else None, "#8172b2"),
              ("kfuse fuse (launches)", lambda r: r["kfuse"]["kernels"], "#dd8452")]
    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=120)
    w = 0.2
    for i, (label, fn, color) in enumerate(series):
        for j, r in enumerate(rows):
            v = fn(r)
            if v is None:
                continue
            x = j + (i - 1.5) * w
            ax.bar(x, v, w, color=color, label=label if j == next(
                k for k, rr in enumerate(rows) if fn(rr) is not None) else None)
            ax.text(x, v * 1.04, str(v), ha="center", va="bottom", fontsize=7.5, rotation=90)
    ax.set_yscale("log")
    ax.set_ylim(10, max(r["nodes"] for r in rows) * 4)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([LABELS[r["name"]] for r in rows])
    ax.set_ylabel("nodes / kernel launches (log scale)")
    ax.set_title("Kernels per model: original nodes, ONNX Runtime, kfuse fuse (fewer is better)")
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_section(body):
    section = f"{BEGIN}\n## Fusion quality (bench/fusion_quality/run.py)\n\n" + "\n".join(body) + f"\n{END}\n"
    text = open(RESULTS).read() if os.path.exists(RESULTS) else "# Benchmark results\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(RESULTS, "w") as f:
        f.write(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:6])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kfuse", default=default_kfuse())
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--only", nargs="*", default=NAMES, choices=NAMES)
    ap.add_argument("--write", action="store_true", help="replace this benchmark's section of bench/RESULTS.md")
    ap.add_argument("--chart", default=CHART, help="PNG bar chart of kernels per model ('' for none)")
    ap.add_argument("--json", help="also write the raw figures to this file")
    a = ap.parse_args()
    if not os.access(a.kfuse, os.X_OK):
        raise SystemExit(f"no kfuse at {a.kfuse} (build it, or pass --kfuse)")
    names = [n for n in NAMES if n in a.only and os.path.exists(os.path.join(MODELS_DIR, n, "model.onnx"))]
    missing = [n for n in a.only if n not in names]
    if missing:
        print(f"missing models {missing}: run bench/.venv/bin/python bench/models/export.py", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fusion_quality.") as tmp:
        for n in names:
            rows.append(measure(n, a.kfuse, a.batch, a.seq, tmp, lambda s: print(s, flush=True)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=dict)
    import onnx
    import onnxruntime
    cmd = "bench/.venv/bin/python bench/fusion_quality/run.py " + " ".join(
        x if not x.startswith(ROOT + "/") else os.path.relpath(x, ROOT) for x in sys.argv[1:])
    body = [
        "`kfuse fuse` against ONNX Runtime's optimized graph on the full-size models (random weights). "
        "Kernels: nodes of ORT's optimized graph (each one kernel call), and kfuse's launches. Modeled "
        "DRAM bytes (kfuse's cost model): each group reads its inputs and writes its outputs once; the "
        "lower bound touches every weight, input and output once. Targets (issue 4): fewer kernels than "
        f"ONNX Runtime on every model; modeled bytes within {BYTES_TARGET}x of the lower bound on "
        "BERT-base and ResNet-50. This section is rewritten by `run.py --write`.",
        "",
        f"- date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- machine: {machine()}",
        f"- kfuse: `{os.path.relpath(a.kfuse, ROOT)}` at commit {git_rev()}; peers: onnx {onnx.__version__}, "
        f"onnxruntime {onnxruntime.__version__} (CPU provider)",
        f"- command: `{cmd.strip()}`",
        f"- shapes: batch {a.batch}, sequence {a.seq} (images 3×224×224). `kfuse fuse` has no option to fix "
        "symbolic dims and reports bytes as -1 while they are symbolic, so every tool reads a static copy "
        "of the model with these input shapes; \"kernels, symbolic\" is `kfuse fuse` on the original file.",
        "- ORT-tr: `onnxruntime.transformers.optimizer.optimize_model(..., num_heads=12, hidden_size=768, "
        "use_gpu=False)` at opt_level 1 (its default for bert/gpt2) and 99; BERT and GPT-2 only",
        "",
    ] + table(rows) + ["", "Targets:", ""] + targets(rows) + [
        "", "Where kfuse's kernels come from (plan of the static model; a boundary is a value passed "
        "between two groups, counted here only between different launches):", ""] + reasons_table(rows)
    if a.chart:
        chart(rows, a.chart)
        body += ["", f"![kernels per model]({os.path.relpath(a.chart, BENCH)})"]
    print("\n".join(body))
    if a.write:
        write_section(body)
        print(f"wrote the fusion-quality section of {os.path.relpath(RESULTS, ROOT)}")


if __name__ == "__main__":
    main()
