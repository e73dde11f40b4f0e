"""The kfuse Python module with torch CUDA tensors (run by bench/gpu_check.sh
on a GPU machine): a CUDA tensor in and out through DLPack, zero copies.

For each model: kfuse.compile(backend="cuda"); run on host NumPy inputs
(the answer); run on torch CUDA tensors of the same values: the outputs
must be torch CUDA tensors equal to the answer byte for byte (the same
kernels), the library must have been handed the tensors' own device
pointers (KFUSE_TRACE=api) and made no host copy or wait in the run
(KFUSE_TRACE=host); then runs into bound outputs (outputs=, returned as
given, their pointers kept) and the microseconds per run with bound
outputs (CUDA Graph replays) and with fresh outputs.

    python3 bench/gpu_python.py MODEL.onnx...   (KFUSE_LIBRARY: libkfuse.so)
Prints one line per check; exit status 1 when one failed.
"""

import os
import re
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import kfuse  # noqa: E402


def traced(fn):
    """fn()'s result and what the library printed to stderr meanwhile."""
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            r = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return r, f.read()


def check(path):
    bad = 0
    name = os.path.relpath(path)
    m = kfuse.compile(path, backend="cuda")
    ins = []
    for n, dt, shape in m.inputs:
        shape = tuple(1 if d is None else d for d in shape)
        ins.append(np.random.uniform(-1, 1, shape).astype(np.float32) if dt == np.float32
                   else np.random.randint(0, 2, shape).astype(dt))
    want = m.run(ins)
    tins = [torch.from_numpy(a).cuda() for a in ins]
    os.environ["KFUSE_TRACE"] = "api,host"
    outs, err = traced(lambda: m.run(tins))
    del os.environ["KFUSE_TRACE"]
    torch.cuda.synchronize()
    ptrs = [int(p, 16) for p in re.findall(r"kf_run_device \w+ '[^']*' buffer (0x[0-9a-f]+)", err)]
    kinds = all(isinstance(o, torch.Tensor) and o.is_cuda for o in outs)
    same = kinds and all(np.array_equal(o.cpu().numpy(), w) for o, w in zip(outs, want))
    inplace = ptrs == [t.data_ptr() for t in tins] + [o.data_ptr() for o in outs] if kinds else False
    host = err.count("kfuse: host:")
    ok = kinds and same and inplace and host == 0
    bad += not ok
    print("python: %s: torch CUDA in -> %s out, equal to the host run: %s, pointers in place: %s, host copies "
          "or waits in the run: %d -> %s" % (name, "torch CUDA" if kinds else "NOT torch CUDA", same, inplace, host,
                                             "ok" if ok else "FAILED"))
    bound = [torch.empty_like(o) for o in outs] if kinds else []
    got = m.run(tins, outputs=bound)
    torch.cuda.synchronize()
    ok = all(g is b for g, b in zip(got, bound)) and all(np.array_equal(b.cpu().numpy(), w)
                                                          for b, w in zip(bound, want))
    bad += not ok
    print("python: %s: bound outputs written in place: %s" % (name, "ok" if ok else "FAILED"))
    for label, fn in (("bound outputs (graph replay)", lambda: m.run(tins, outputs=bound)),
                      ("fresh outputs", lambda: m.run(tins))):
        for _ in range(5):
            fn()
        m.sync()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        m.sync()
        torch.cuda.synchronize()
        print("python: %s: %s: %.1f us per run" % (name, label, (time.perf_counter() - t0) * 1e6 / 200))
    return bad


if __name__ == "__main__":
    failed = sum(check(p) for p in sys.argv[1:])
    print("python: %s" % ("ok" if not failed else "%d checks FAILED" % failed))
    sys.exit(1 if failed else 0)
