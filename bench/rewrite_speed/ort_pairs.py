"""ORT graph optimization as paired session creations in one process: per pair, one session at
ORT_DISABLE_ALL and one at ORT_ENABLE_ALL (order alternating), CPU provider, 1 thread; the
graph work is the median of the per-pair differences. kfuse's graph work (time_opt_s of
`kfuse opt --json`) is timed between the pairs. run.py's "ORT graph" is the difference of
two medians over separate processes, which on the full transformers is often swamped by the
spread of session creation; this gives the per-pair spread as well (quartiles). Run with
bench/.venv:

    bench/.venv/bin/python bench/rewrite_speed/ort_pairs.py KFUSE RUNS MODEL.onnx...
"""
import json, os, statistics, subprocess, sys, tempfile, time
import onnxruntime as ort
kfuse, runs, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
OUT = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(), "ort_pairs_out.onnx")
def session(model, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    t0 = time.perf_counter()
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t0
for model in models:
    session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # warm the page cache and ORT
    diffs, kf = [], []
    for i in range(runs):
        levels = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]
        if i % 2: levels.reverse()
        t = {lv: session(model, lv) for lv in levels}
        diffs.append(t[ort.GraphOptimizationLevel.ORT_ENABLE_ALL] - t[ort.GraphOptimizationLevel.ORT_DISABLE_ALL])
        r = subprocess.run([kfuse, "opt", model, "-o", OUT, "--json"], capture_output=True, text=True)
        kf.append(json.loads(r.stdout)["time_opt_s"])
    d, k = statistics.median(diffs), statistics.median(kf)
    q = statistics.quantiles(diffs, n=4)
    print(f"{model.split('/')[-2]:10s} ORT graph (median of {runs} paired differences) {d*1e3:7.1f} ms "
          f"(quartiles {q[0]*1e3:.1f} .. {q[2]*1e3:.1f})  kfuse graph {k*1e3:6.1f} ms  ratio {d/k:5.1f}x", flush=True)
os.remove(OUT)
