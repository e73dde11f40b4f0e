#!/usr/bin/env python3
"""Cold compile vs warm start from the disk kernel cache (`kfuse compile`).

For each backend (opencl through the OpenCL device here, cuda through NVRTC,
which needs no GPU) and each plan (fused as planned, and one group per node
via KFUSE_DISABLE_FUSION=1, which gives many more kernels), N times: empty
the cache folder and compile (cold), then compile again in a new process
(warm: every kernel read from disk). Reports medians of the compile phase
(the parallel compile through the cache, as kfuse prints it) and of the
whole process (load, optimize, plan, codegen, compile).

  bench/compile_cache/run.py [--kfuse build/tools/kfuse] [--model M.onnx] [--runs 5]
                             [--results bench/RESULTS.md]
--results replaces the section between the compile_cache markers there (or
appends it) with the table printed.
"""
import argparse, os, re, shutil, statistics, subprocess, sys, tempfile, time, datetime, platform

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN, END = "<!-- compile_cache: begin -->", "<!-- compile_cache: end -->"


def compile_once(kfuse, model, backend, cache, fused):
    env = dict(os.environ, KFUSE_CACHE_DIR=cache)
    env.pop("KFUSE_TRACE", None)
    if not fused:
        env["KFUSE_DISABLE_FUSION"] = "1"
    t0 = time.perf_counter()
    p = subprocess.run([kfuse, "compile", model, "--backend", backend], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    m = re.search(r"(\d+) distinct kernels: (\d+) compiled, (\d+) cache hits, ([0-9.]+) ms", p.stdout)
    if not m:
        return None, "unexpected output: " + p.stdout.strip()
    return {"kernels": int(m[1]), "compiled": int(m[2]), "hits": int(m[3]), "compile": float(m[4]) / 1e3, "wall": wall}, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kfuse", default=os.path.join(ROOT, "build/tools/kfuse"))
    ap.add_argument("--model", default=os.path.join(ROOT, "bench/models/small/bert/model.onnx"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--results")
    a = ap.parse_args()
    rows = []
    for backend in ("opencl", "cuda"):
        for fused in (True, False):
            cold, warm, why = [], [], None
            for _ in range(a.runs):
                cache = tempfile.mkdtemp(prefix="kf-cc-")
                try:
                    c, why = compile_once(a.kfuse, a.model, backend, cache, fused)
                    w, why2 = compile_once(a.kfuse, a.model, backend, cache, fused) if c else (None, None)
                    why = why or why2
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                if not c or not w:
                    break
                if c["hits"] or w["compiled"]:
                    why = f"cache did not behave: cold {c}, warm {w}"
                    break
                cold.append(c)
                warm.append(w)
            plan = "fused" if fused else "1 group/node"
            if why or not cold:
                rows.append(f"| {backend} | {plan} | - | skipped: {why} | | | | | |")
                continue
            med = lambda xs, k: statistics.median(x[k] for x in xs)
            cc, wc, cw, ww = med(cold, "compile"), med(warm, "compile"), med(cold, "wall"), med(warm, "wall")
            rows.append(f"| {backend} | {plan} | {cold[0]['kernels']} | {cc * 1e3:.1f} | {wc * 1e3:.2f} | "
                        f"{100 * wc / cc:.2f}% | {cw * 1e3:.0f} | {ww * 1e3:.0f} | {100 * ww / cw:.0f}% |")
    model = os.path.relpath(a.model, ROOT)
    lines = [BEGIN, "## Kernel cache: cold compile vs warm start (`bench/compile_cache/run.py`)", "",
             f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} CPUs, shared; OpenCL = PoCL on the CPU, "
             f"cuda = NVRTC compile only), model `{model}`, median of {a.runs} cold/warm pairs; "
             f"command: `bench/compile_cache/run.py --kfuse {os.path.relpath(a.kfuse, ROOT)} --runs {a.runs}`.", "",
             "Compile = the parallel compile phase as `kfuse compile` reports it (cold: build every kernel and "
             "store it; warm: read every kernel from the disk cache in a new process). Process = the whole "
             "`kfuse compile` run (load, optimize, plan, codegen, compile).", "",
             "| backend | plan | kernels | cold compile ms | warm compile ms | warm/cold | cold process ms | warm process ms | warm/cold |",
             "|---|---|---|---|---|---|---|---|---|"] + rows + [END]
    text = "\n".join(lines)
    print(text)
    if a.results:
        old = open(a.results).read() if os.path.exists(a.results) else ""
        if BEGIN in old and END in old:
            new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
        else:
            new = old.rstrip("\n") + "\n\n" + text + "\n"
        open(a.results, "w").write(new)


if __name__ == "__main__":
    sys.exit(main())
