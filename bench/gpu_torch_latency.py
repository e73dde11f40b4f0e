#!/usr/bin/env python3
"""BERT-base and ResNet-50 latency: PyTorch eager, torch.compile and kfuse on one GPU, side by side.

For each model (random weights, bench/models/export.py's builders): batch 1, BERT at sequence
128, ResNet-50 at 3x224x224. PyTorch eager and torch.compile (default mode) in fp32, and with
--fp16 also eager, torch.compile and torch.compile(mode="reduce-overhead") (CUDA graphs) on
the module in float16, are timed with CUDA events, median (p50) and p99 of --iters runs after
--warmup runs; the fp32 module is exported to ONNX with static shapes and `kfuse bench
--backend cuda` times it the same way (its own p50/p99 line), in fp32 and, with --fp16, with
`--precision fp16`. With --int8 the export is also quantized by `kfuse quantize --per-channel
--random N` (static QDQ, int8 weights per channel) and timed with `--precision int8` (integer
anchors, the rest float32) and `--precision int8-fp16` (the rest float16), columns beside kfuse
fp16, and checked with `kfuse run --check` at both; and quantized by `kfuse quantize --type fp8`
(float8 E4M3, weights per tensor) and timed and checked with `--precision fp8` (float8 products on
cuBLASLt's float8 GEMM, the rest float16).
With --check each export also runs `kfuse run --check` on CUDA in every precision kfuse takes. One table on stdout (and --out DIR/torch_latency.md). Used by
bench/gpu_check.sh; a CPU dry run (no GPU) is `--device cpu --no-compile --backend ref`.

    python3 bench/gpu_torch_latency.py --kfuse build/tools/kfuse [--models bert,resnet50] [--out DIR]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "models"))
import export as ex  # noqa: E402  (bench/models/export.py: the model builders)


def inputs_for(name, device):
    g = torch.Generator().manual_seed(7)
    if name == "bert":
        ids = torch.randint(0, 30522, (1, 128), generator=g)
        return {"input_ids": ids.to(device), "attention_mask": torch.ones(1, 128, dtype=torch.int64, device=device)}
    return {"input": torch.randn(1, 3, 224, 224, generator=g).to(device)}


def time_fn(fn, args, device, warmup, iters):
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        ts = []
        for _ in range(iters):
            if device == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn(*args)
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e))
            else:
                t = time.perf_counter()
                fn(*args)
                ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(0.99 * len(ts)))]


def kfuse_bench(kfuse, path, backend, warmup, iters, precision=None):
    cmd = [kfuse, "bench", path, "--backend", backend, "--warmup", str(warmup), "--iters", str(iters)]
    if precision:
        cmd += ["--precision", precision]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    m50 = re.search(r"p50[ =:]+([0-9.]+) ?ms", text)
    m99 = re.search(r"p99[ =:]+([0-9.]+) ?ms", text)
    if r.returncode != 0 or not m50:
        return None, None, text.strip().splitlines()[-1] if text.strip() else f"exit {r.returncode}"
    return float(m50.group(1)), float(m99.group(1)) if m99 else None, text.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default=os.path.join(os.path.dirname(HERE), "build/tools/kfuse"))
    ap.add_argument("--models", default="bert,resnet50")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="cuda", help="kfuse bench backend")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--fp16", action="store_true", help="also the float16 peers and kfuse --precision fp16")
    ap.add_argument("--check", action="store_true", help="kfuse run --check on each export, every precision")
    ap.add_argument("--int8", action="store_true",
                    help="also kfuse quantize the export and time --precision int8, int8-fp16 and (float8) fp8")
    ap.add_argument("--calib", type=int, default=2, help="--int8: random calibration inputs (kfuse quantize --random)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cols = ["PyTorch eager", "torch.compile", "kfuse"]
    if a.fp16:
        cols += ["eager fp16", "torch.compile fp16", "compile fp16 reduce-overhead", "kfuse fp16"]
    if a.int8:
        cols += ["kfuse int8", "kfuse int8-fp16", "kfuse fp8"]
    rows = ["| model | " + " | ".join(c + " p50 / p99" for c in cols) + " | kfuse ÷ compile | kfuse fp16 ÷ reduce-overhead |"
            + (" kfuse int8 ÷ kfuse fp16 | kfuse int8-fp16 ÷ kfuse fp16 | kfuse fp8 ÷ kfuse fp16 |" if a.int8 else ""),
            "|---|" + "---:|" * (len(cols) + 2 + (3 if a.int8 else 0))]
    fmt = lambda p: "—" if p is None or p[0] is None else f"{p[0]:.3f} / {p[1]:.3f} ms"
    ratio = lambda x, y: "—" if x is None or y is None or x[0] is None or y[0] is None else f"{x[0] / y[0]:.2f}x"
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, _, _, outs = ex.build(name, False)
        model.eval().to(a.device)
        inp = inputs_for(name, a.device)
        args = tuple(inp.values())
        res = {"PyTorch eager": time_fn(model, args, a.device, a.warmup, a.iters)}
        if not a.no_compile:
            try:
                res["torch.compile"] = time_fn(torch.compile(model), args, a.device, a.warmup, a.iters)
            except Exception as e:  # torch.compile needs a working Triton/inductor setup
                print(f"{name}: torch.compile failed: {e}", file=sys.stderr)
        path = os.path.join(a.out, f"{name}_static.onnx")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu_model = model.to("cpu")
            torch.onnx.export(cpu_model, tuple(t.cpu() for t in args), path, dynamo=False, opset_version=ex.OPSET,
                              input_names=list(inp), output_names=outs, do_constant_folding=True)
            model.to(a.device)
        k50, k99, last = kfuse_bench(a.kfuse, path, a.backend, a.warmup, a.iters)
        res["kfuse"] = (k50, k99)
        if a.fp16:
            half = model.half()
            hargs = tuple(t.half() if t.is_floating_point() else t for t in args)
            res["eager fp16"] = time_fn(half, hargs, a.device, a.warmup, a.iters)
            if not a.no_compile:
                for col, mode in (("torch.compile fp16", None), ("compile fp16 reduce-overhead", "reduce-overhead")):
                    try:
                        cm = torch.compile(half, mode=mode) if mode else torch.compile(half)
                        res[col] = time_fn(cm, hargs, a.device, a.warmup, a.iters)
                    except Exception as e:
                        print(f"{name}: {col} failed: {e}", file=sys.stderr)
            h50, h99, hlast = kfuse_bench(a.kfuse, path, a.backend, a.warmup, a.iters, "fp16")
            res["kfuse fp16"] = (h50, h99)
            if h50 is None:
                print(f"{name}: kfuse fp16: {hlast}", file=sys.stderr)
            model.float()
        if a.int8:
            for kind, qargs, precs in (("int8", ["--per-channel"], ("int8", "int8-fp16")),
                                       ("fp8", ["--type", "fp8"], ("fp8",))):
                qpath = os.path.join(a.out, f"{name}_static_{kind}.onnx")
                t0 = time.perf_counter()
                r = subprocess.run([a.kfuse, "quantize", path, "-o", qpath] + qargs + ["--random", str(a.calib),
                                    "--seed", "1"], capture_output=True, text=True, timeout=600)
                tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
                print(f"quantize {name} {kind}: exit {r.returncode} in {time.perf_counter() - t0:.0f} s: {tail[0]}", flush=True)
                for prec in precs if r.returncode == 0 else ():
                    q50, q99, qlast = kfuse_bench(a.kfuse, qpath, a.backend, a.warmup, a.iters, prec)
                    res["kfuse " + prec] = (q50, q99)
                    if q50 is None:
                        print(f"{name}: kfuse {prec}: {qlast}", file=sys.stderr)
                    c = subprocess.run([a.kfuse, "run", qpath, "--backend", a.backend, "--check", "--precision", prec],
                                       capture_output=True, text=True, timeout=300)
                    tail = (c.stdout + c.stderr).strip().splitlines()[-1:] or [""]
                    print(f"check {name} {prec}: exit {c.returncode}: {tail[0]}", flush=True)
        if k50 is None:
            print(f"{name}: kfuse: {last}", file=sys.stderr)
        if a.check:
            for prec in ("fp32", "tf32", "fp16", "bf16"):
                cmd = [a.kfuse, "run", path, "--backend", a.backend, "--check"] + ([] if prec == "fp32" else ["--precision", prec])
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
                print(f"check {name} {prec}: exit {r.returncode}: {tail[0]}", flush=True)
        rows.append(f"| {name} | " + " | ".join(fmt(res.get(c)) for c in cols) + f" | {ratio(res.get('kfuse'), res.get('torch.compile'))} | "
                    f"{ratio(res.get('kfuse fp16'), res.get('compile fp16 reduce-overhead'))} |"
                    + (f" {ratio(res.get('kfuse int8'), res.get('kfuse fp16'))} | "
                       f"{ratio(res.get('kfuse int8-fp16'), res.get('kfuse fp16'))} | "
                       f"{ratio(res.get('kfuse fp8'), res.get('kfuse fp16'))} |" if a.int8 else ""))
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    with open(os.path.join(a.out, "torch_latency.md"), "w") as f:
        f.write(f"device {a.device}, batch 1, BERT seq 128, ResNet-50 224x224, {a.iters} iters after {a.warmup}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
