#!/usr/bin/env python3
"""Rewrite speed: `kfuse opt` against ONNX Runtime's, onnxsim's and onnxoptimizer's graph
optimization on real models, and kfuse's time per node on synthetic graphs.

Each figure is the median of --runs runs, each in a fresh process, timed file to file:
  kfuse          wall time of the `kfuse opt M.onnx -o OUT.onnx` process; "load / opt / save"
                 is the split `kfuse opt --json` reports (time_load_s, time_opt_s, time_save_s:
                 medians of the same runs; the rest of the wall time is process start and exit)
  ORT            InferenceSession creation with ORT_ENABLE_ALL and optimized_model_filepath
                 (load, optimize, write the optimized model, prepare kernels), 1 thread
  onnxsim        onnx.load + onnxsim.simplify (defaults) + onnx.save
  onnxoptimizer  onnx.load + onnxoptimizer.optimize (default passes) + onnx.save
Python's and the libraries' import time is not counted. Models: bench/.cache/models/*
(full size) and bench/models/small/* (export them with bench/models/export.py).
Synthetic graphs (gen_synth.py, chains and diamonds of elementwise ops) of 10k, 100k and
1M nodes give kfuse's µs per node. --perf adds a `perf record` profile of kfuse on the
largest model and the largest synthetic graph. --write replaces this benchmark's section
of bench/RESULTS.md with the results. Run with bench/.venv:

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
    if tool == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = out
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        t0 = time.perf_counter()
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
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
    return "—" if peer is None or not k else f"{peer / k:.1f}x"


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
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one run of one tool")
    ap.add_argument("--perf", action="store_true", help="profile kfuse with perf on the largest inputs")
    ap.add_argument("--write", action="store_true", help="replace this benchmark's section of bench/RESULTS.md")
    a = ap.parse_args()
    peers = [p for p in a.peers.split(",") if p in PEERS]
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
    say(f"- each figure: median of {a.runs} runs, file to file (see the script's docstring)")
    say()
    with tempfile.TemporaryDirectory(prefix="kfuse_speed_") as tmp:
        if dirs:
            say("| model | nodes | kfuse opt | load / opt / save | → nodes | " + " | ".join(
                f"{p} | → nodes | {p}/kfuse" for p in peers) + " |")
            say("|---|---:|---:|---:|---:|" + "---:|---:|---:|" * len(peers))
        for path in dirs:
            d = os.path.dirname(path)
            name = os.path.basename(d) + (" (small)" if os.path.basename(os.path.dirname(d)) == "small" else "")
            kout = os.path.join(tmp, "kfuse.onnx")
            try:
                times, reps = [], []
                for _ in range(a.runs):
                    dt, rep = time_kfuse(kfuse, path, kout, a.timeout)
                    times.append(dt)
                    reps.append(rep)
                kt = statistics.median(times)
                row = f"| {name} | {rep['nodes_before']} | {fmt_s(kt)} | {split(reps)} | {rep['nodes_after']} |"
            except Exception as e:
                kt = None
                row = f"| {name} | {count_nodes(path)} | failed: {str(e)[:80]} | — | — |"
            for p in peers:
                pout = os.path.join(tmp, p + ".onnx")
                try:
                    pt = median_of(lambda: time_peer(p, path, pout, a.timeout), a.runs)
                    row += f" {fmt_s(pt)} | {count_nodes(pout)} | {fmt_ratio(pt, kt)} |"
                except Exception as e:
                    print(f"  {p} on {name}: {e}", file=sys.stderr)
                    row += f" failed | — | — |"
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
               "Target (issue 3): kfuse at least 10x faster than ORT's optimization on each model, time per "
               "node flat from 10k to 1M nodes. This section is rewritten by `run.py --write`.\n\n"
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
