#!/usr/bin/env python3
"""Rewrite speed: `kfuse opt` against ONNX Runtime's, onnxsim's and onnxoptimizer's graph
optimization on real models, and kfuse's time per node on synthetic graphs.

Each figure is the median of --runs runs, each in a fresh process; within a run every tool
is timed once on the model before the next run starts (side by side), each after a sync (not
timed) so that none pays for the write-back of another's output:
  kfuse opt      wall time of the `kfuse opt M.onnx -o OUT.onnx` process, file to file;
                 "load / opt / save" is the split `kfuse opt --json` reports (time_load_s,
                 time_opt_s, time_save_s: medians of the same runs)
  kfuse graph    time_opt_s alone: the graph work, no file I/O
  ORT graph      ONNX Runtime's graph optimization: the median InferenceSession creation time
                 (CPU provider, 1 thread, no output file) at ORT_ENABLE_ALL minus the median
                 at ORT_DISABLE_ALL, which leaves out loading the model and preparing kernels
  ORT file       InferenceSession creation with ORT_ENABLE_ALL and optimized_model_filepath
                 (load, optimize, write the optimized model, prepare kernels); weights go to
                 external data when the input has them
  copy           a plain read of every byte of the model (its data files too) and a write of
                 the same bytes to the output folder, in a fresh Python process
  onnxsim        onnx.load + onnxsim.simplify (defaults) + onnx.save
  onnxoptimizer  onnx.load + onnxoptimizer.optimize (default passes) + onnx.save
Python's and the libraries' import time is not counted. Models: bench/.cache/models/*
(full size) and bench/models/small/* (export them with bench/models/export.py).
External data: copies of the --external models with every tensor over 1 KiB in one data
file, and a model with about --big GiB of external weights (gen_big.py), made in a temporary
folder; kfuse writes its output once into another folder (the unchanged weights are copied
from the input's data file) and once beside the input (the output refers to the input's
data file; see README, "External data").
Synthetic graphs (gen_synth.py, chains and diamonds of elementwise ops reading shared
constants) of 10k, 100k and 1M nodes give kfuse's µs per node. --perf adds a `perf record`
profile of kfuse on the largest model and the largest synthetic graph. --write replaces
this benchmark's section of bench/RESULTS.md with the results. Run with bench/.venv:

    bench/.venv/bin/python bench/rewrite_speed/run.py [--kfuse build/tools/kfuse] [--runs 5] [--write] [--perf]
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "RESULTS.md")
SYNTH_DIR = os.path.join(BENCH, ".cache", "synth")
BEGIN, END = "<!-- rewrite_speed: begin -->", "<!-- rewrite_speed: end -->"
PEERS = ["ort", "onnxsim", "onnxoptimizer"]


# ---- worker: one timed run of a peer, in its own process ---------------------------------

def worker(tool, model, out):
    import onnx
    if tool.startswith("ort"):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL if tool == "ort_none" else \
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if tool == "ort":
            so.optimized_model_filepath = out
            if external_files(model):
                so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                            os.path.basename(out) + ".data")
                so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                            "1024")
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        t0 = time.perf_counter()
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        dt = time.perf_counter() - t0
    elif tool == "copy":
        t0 = time.perf_counter()
        for src in [model] + external_files(model):
            with open(src, "rb") as f:
                data = f.read()
            with open(os.path.join(os.path.dirname(out), "copy_" + os.path.basename(src)), "wb") as f:
                f.write(data)
            del data
        dt = time.perf_counter() - t0
    elif tool == "onnxsim":
        import onnxsim
        t0 = time.perf_counter()
        m, _ = onnxsim.simplify(onnx.load(model))
        onnx.save(m, out)
        dt = time.perf_counter() - t0
    elif tool == "onnxoptimizer":
        import onnxoptimizer
        t0 = time.perf_counter()
        m = onnxoptimizer.optimize(onnx.load(model))
        onnx.save(m, out)
        dt = time.perf_counter() - t0
    else:
        raise SystemExit(f"unknown tool {tool}")
    print(json.dumps({"seconds": dt}))


def external_files(model):
    """Paths of the external data files the model names (without reading its weights)."""
    import onnx
    m = onnx.load(model, load_external_data=False)
    locs = set()
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                locs.add(e.value)
    return sorted(os.path.join(os.path.dirname(model), loc) for loc in locs)


def make_external(src, folder):
    """A copy of model src with every tensor over 1 KiB in one data file; returns its path."""
    import onnx
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(onnx.load(src), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    return path


# ---- driver --------------------------------------------------------------------------

def default_kfuse():
    for p in [os.environ.get("KFUSE", ""), os.path.join(ROOT, "build", "tools", "kfuse")] + \
            sorted(glob.glob(os.path.join(ROOT, "build*", "tools", "kfuse"))):
        if p and os.access(p, os.X_OK):
            return p
    return os.path.join(ROOT, "build", "tools", "kfuse")


def count_nodes(path):
    import onnx
    try:
        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:
        return None


def time_kfuse(kfuse, model, out, timeout):
    t0 = time.perf_counter()
    r = subprocess.run([kfuse, "opt", model, "-o", out, "--json"], capture_output=True, text=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"kfuse opt rc {r.returncode}: {r.stderr.strip()[:300]}")
    return dt, json.loads(r.stdout)


def time_peer(tool, model, out, timeout):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", tool, model, out],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{tool} rc {r.returncode}: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["seconds"]


def split(reps):
    """Median load / optimize / save seconds of kfuse opt --json reports, as text."""
    keys = ("time_load_s", "time_opt_s", "time_save_s")
    if not reps or any(k not in r for r in reps for k in keys):
        return "—"
    return " / ".join(fmt_s(statistics.median(r[k] for r in reps)) for k in keys)


def median_of(fn, runs):
    return statistics.median(fn() for _ in range(runs))


def machine():
    cpu = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 1024 / 1024:.0f} GiB RAM"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs (nproc), {cpu or platform.processor()}, {mem}"


def versions():
    import onnx
    import onnxruntime
    import onnxsim
    import onnxoptimizer
    return (f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, onnxsim {onnxsim.__version__}, "
            f"onnxoptimizer {getattr(onnxoptimizer, '__version__', '?')}")


def fmt_s(x):
    if x is None:
        return "—"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def fmt_ratio(peer, k):
    return "—" if peer is None or not k else f"{peer / k:.2f}x" if peer / k < 10 else f"{peer / k:.0f}x"


PHASES = ["kf_model_load", "kf_optimize", "kf_model_save"]


def profile(kfuse, model, tmp):
    """perf record of one kfuse opt run; returns [(total %, self %, symbol)] of user-space
    functions, total counting callees, or None when perf is missing or fails."""
    if not shutil.which("perf"):
        return None
    data = os.path.join(tmp, "perf.data")
    r = subprocess.run(["perf", "record", "-F", "999", "--call-graph", "dwarf,16384", "-o", data, kfuse, "opt",
                        model, "-o", os.path.join(tmp, "perf_out.onnx")], capture_output=True, text=True)
    if r.returncode:
        print(f"perf record failed: {r.stderr.strip()[-200:]}", file=sys.stderr)
        return None
    rep = subprocess.run(["perf", "report", "-i", data, "--children", "--sort", "symbol", "-g", "none",
                          "--percent-limit", "0.5", "--stdio"], capture_output=True, text=True).stdout
    os.unlink(data)
    rows, seen = [], set()
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.+?)\s+-\s+-\s*$", line)
        if not m or m.group(3) == "k":
            continue
        sym = m.group(4).replace(" (inlined)", "")
        if sym in seen:
            continue
        seen.add(sym)
        rows.append((float(m.group(1)), float(m.group(2)), sym))
    return rows


NOISE = re.compile(r"^(_start|__libc_start|main$|cmd_opt$|0x|\[|_IO_|__GI_|__fopen|__libc_open|new_do_write|"
                   r"kf_model_load$|kf_optimize$|kf_model_save$)")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default=default_kfuse())
    ap.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    ap.add_argument("--models", choices=["full", "small", "both"], default="both")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="synthetic graph sizes")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of ort,onnxsim,onnxoptimizer (or none)")
    ap.add_argument("--external", default="bert,resnet50",
                    help="comma list of full-size models to also time as external-data copies")
    ap.add_argument("--big", type=float, default=2.0, help="GiB of external weights of the large model (0: none)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one run of one tool")
    ap.add_argument("--perf", action="store_true", help="profile kfuse with perf on the largest inputs")
    ap.add_argument("--write", action="store_true", help="replace this benchmark's section of bench/RESULTS.md")
    a = ap.parse_args()
    peers = [p for p in a.peers.split(",") if p in PEERS]
    others = [p for p in peers if p != "ort"]
    kfuse = os.path.abspath(a.kfuse)
    dirs = []
    if a.models in ("full", "both"):
        dirs += sorted(glob.glob(os.path.join(BENCH, ".cache", "models", "*", "model.onnx")))
    if a.models in ("small", "both"):
        dirs += sorted(glob.glob(os.path.join(BENCH, "models", "small", "*", "model.onnx")))
    out = []

    def say(line=""):
        print(line, flush=True)
        out.append(line)

    started = datetime.datetime.now()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    say(f"- date: {started:%Y-%m-%d %H:%M}")
    say(f"- machine: {machine()}")
    say(f"- kfuse: `{os.path.relpath(kfuse, ROOT)}` at commit {commit}{' + uncommitted changes' if dirty else ''}; "
        f"peers: {versions()}")
    say(f"- command: `bench/.venv/bin/python bench/rewrite_speed/run.py {' '.join(sys.argv[1:])}`".rstrip())
    say(f"- each figure: median of {a.runs} runs (3 at most on the large model and 1M nodes), the tools of one "
        "run side by side (see the script's docstring)")
    say()
    with tempfile.TemporaryDirectory(prefix="kfuse_speed_") as tmp:
        cases = []  # (label, model path, output folder, runs)
        for path in dirs:
            d = os.path.dirname(path)
            cases.append((os.path.basename(d) + (" (small)" if os.path.basename(os.path.dirname(d)) == "small" else ""),
                          path, tmp, a.runs))
        for name in [n for n in a.external.split(",") if n]:
            src = os.path.join(BENCH, ".cache", "models", name, "model.onnx")
            if not os.path.exists(src):
                print(f"no {src}: skipping its external-data copy", file=sys.stderr)
                continue
            ext = make_external(src, os.path.join(tmp, "ext_" + name))
            cases.append((f"{name}, external data, output in another folder", ext, tmp, a.runs))
            cases.append((f"{name}, external data, output beside the input", ext, os.path.dirname(ext), a.runs))
        if a.big > 0:
            folder = os.path.join(tmp, "big")
            subprocess.run([sys.executable, os.path.join(HERE, "gen_big.py"), folder, str(a.big)], check=True)
            big = os.path.join(folder, "model.onnx")
            gib = sum(os.path.getsize(f) for f in [big] + external_files(big)) / (1 << 30)
            runs = max(1, min(a.runs, 3))
            cases.append((f"big_external ({gib:.1f} GiB), output in another folder", big, tmp, runs))
            cases.append((f"big_external ({gib:.1f} GiB), output beside the input", big, folder, runs))
        if cases:
            say("| model | nodes | → nodes | kfuse graph | ORT graph | ORT graph / kfuse graph | kfuse opt | "
                "load / opt / save | copy | kfuse opt / copy | ORT file | ORT file / kfuse opt |" +
                "".join(f" {p} | {p} / kfuse opt |" for p in others))
            say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(others))
        for name, path, odir, runs in cases:
            kout = os.path.join(odir, "kfuse_out.onnx")
            tools = (["ort_all", "ort_none", "ort"] if "ort" in peers else []) + ["copy"] + others
            times = {t: [] for t in ["kfuse"] + tools}
            reps, failed = [], {}
            for _ in range(runs):
                for t in ["kfuse"] + tools:
                    if t in failed:
                        continue
                    try:
                        # written pages of the previous tool are flushed first (untimed), so no
                        # tool pays for another's write-back
                        os.sync()
                        if t == "kfuse":
                            dt, rep = time_kfuse(kfuse, path, kout, a.timeout)
                            reps.append(rep)
                        else:
                            dt = time_peer(t, path, os.path.join(odir, t + "_out.onnx"), a.timeout)
                        times[t].append(dt)
                    except Exception as e:
                        print(f"  {t} on {name}: {e}", file=sys.stderr)
                        failed[t] = str(e)
                for f in glob.glob(os.path.join(odir, "*_out.onnx*")) + glob.glob(os.path.join(odir, "copy_*")):
                    os.unlink(f)
            med = {t: statistics.median(v) if v and t not in failed else None for t, v in times.items()}
            kg = statistics.median(r["time_opt_s"] for r in reps) if reps and "kfuse" not in failed else None
            og = med["ort_all"] - med["ort_none"] if med.get("ort_all") is not None and \
                med.get("ort_none") is not None else None
            if reps:
                row = f"| {name} | {reps[-1]['nodes_before']} | {reps[-1]['nodes_after']} |"
            else:
                row = f"| {name} | {count_nodes(path)} | failed: {failed.get('kfuse', '')[:60]} |"
            row += f" {fmt_s(kg)} | {fmt_s(og)} | {fmt_ratio(og, kg)} | {fmt_s(med['kfuse'])} | {split(reps)} |"
            row += f" {fmt_s(med['copy'])} | {fmt_ratio(med['kfuse'], med['copy'])} |"
            row += f" {fmt_s(med.get('ort'))} | {fmt_ratio(med.get('ort'), med['kfuse'])} |"
            row += "".join(f" {fmt_s(med[p])} | {fmt_ratio(med[p], med['kfuse'])} |" for p in others)
            say(row)
        say()
        sizes = [int(s) for s in a.sizes.split(",") if s]
        if sizes:
            os.makedirs(SYNTH_DIR, exist_ok=True)
            say("| synthetic graph | nodes | → nodes | kfuse opt | load / opt / save | µs/node | "
                "µs/node since previous size |")
            say("|---|---:|---:|---:|---:|---:|---:|")
            prev = None
            for n in sizes:
                path = os.path.join(SYNTH_DIR, f"synth_{n}.onnx")
                if not os.path.exists(path):
                    subprocess.run([sys.executable, os.path.join(HERE, "gen_synth.py"), str(n), path], check=True)
                runs = a.runs if n < 1000000 else max(1, min(a.runs, 3))
                times, reps = [], []
                for _ in range(runs):
                    dt, rep = time_kfuse(kfuse, path, os.path.join(tmp, "synth_out.onnx"), a.timeout)
                    times.append(dt)
                    reps.append(rep)
                t = statistics.median(times)
                slope = f"{(t - prev[1]) / (n - prev[0]) * 1e6:.2f}" if prev else "—"
                say(f"| synth_{n} (median of {runs}) | {rep['nodes_before']} | {rep['nodes_after']} | {fmt_s(t)} | "
                    f"{split(reps)} | {t / n * 1e6:.2f} | {slope} |")
                prev = (n, t)
            say()
        if a.perf:
            targets = [p for p in dirs if "/small/" not in p] + \
                [os.path.join(SYNTH_DIR, f"synth_{n}.onnx") for n in sizes]
            profs = [(t, profile(kfuse, t, tmp)) for t in targets]
            profs = [(t, rows) for t, rows in profs if rows]
            if profs:
                say("Where kfuse's time goes (`perf record --call-graph dwarf` of one `kfuse opt` run; share of "
                    "samples in each phase including callees, then the functions with the most self time):")
                say()
                say("| input | load | optimize | save | top self time |")
                say("|---|---:|---:|---:|---|")
                for t, rows in profs:
                    tot = {sym: total for total, _, sym in rows}
                    top = sorted((r for r in rows if not NOISE.match(r[2]) and r[1] >= 1), key=lambda r: -r[1])[:5]
                    label = os.path.relpath(t, BENCH)
                    say(f"| {label} | " + " | ".join(f"{tot.get(ph, 0.0):.0f}%" for ph in PHASES) + " | " +
                        ", ".join(f"{sym} {self_:.0f}%" for _, self_, sym in top) + " |")
                t, rows = profs[-1]
                say()
                say(f"Inside `kfuse opt {os.path.relpath(t, ROOT)}` (share including callees, and self):")
                say()
                say("| function | total | self |")
                say("|---|---:|---:|")
                for total, self_, sym in [r for r in rows if not NOISE.match(r[2]) or r[2] in PHASES][:25]:
                    say(f"| {sym} | {total:.1f}% | {self_:.1f}% |")
                say()
    if a.write:
        write_section("\n".join(out).rstrip() + "\n")
        print(f"wrote the rewrite-speed section of {os.path.relpath(RESULTS, ROOT)}")
    return 0


def write_section(body):
    section = (f"{BEGIN}\n## Rewrite speed (bench/rewrite_speed/run.py)\n\n"
               "`kfuse opt` against ONNX Runtime's offline graph optimization, onnxsim and onnxoptimizer "
               "on real architectures (random weights), and kfuse's time per node on synthetic graphs. "
               "Targets (issues 3 and 14): the graph work (kfuse's time_opt_s) at least 10x faster than ORT's "
               "graph optimization (session creation at ORT_ENABLE_ALL minus ORT_DISABLE_ALL) on every model; "
               "file to file within 1.2x of plainly reading and writing the same bytes; on external-data models "
               "file to file at least 10x faster than ORT's; time per node flat from 10k to 1M nodes. This section is rewritten by `run.py --write`.\n\n"
               f"{body}{END}\n")
    text = open(RESULTS).read() if os.path.exists(RESULTS) else "# Benchmark results\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(RESULTS, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
