#!/usr/bin/env python3
"""Standard CNN architectures from torchvision, exported two ways, for the host-step check.

Each of resnet50, mobilenet_v2, mobilenet_v3_small, densenet121, inception_v3, vgg16,
efficientnet_b0, convnext_tiny and regnet_y_400mf is built with random weights (no
download), batch 1 at its usual input size, and exported
  - by the TorchScript exporter (`dynamo=False`, opset 17, constant folding), and
  - by today's default exporter (`torch.onnx.export` with no exporter options: dynamo),
as bench/.cache/models/zoo/<name>_<legacy|dynamo>.onnx, with a test_data_set_0 beside each
(`<name>_<exporter>/`: input and PyTorch's fp32 output), so `kfuse run --inputs` reads them.

    bench/.venv/bin/python bench/models/export_zoo.py [--only NAME ...] [--exporters legacy,dynamo]

bench/models/zoo_check.sh runs every exported file through kfuse (host steps, --check).
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export as ex  # noqa: E402  (randomize_constant_params, OPSET)

ZOO = {  # name: input size
    "resnet50": 224, "mobilenet_v2": 224, "mobilenet_v3_small": 224, "densenet121": 224,
    "inception_v3": 299, "vgg16": 224, "efficientnet_b0": 224, "convnext_tiny": 224, "regnet_y_400mf": 224,
}


def build(name):
    import torchvision.models as tvm
    kw = {"weights": None}
    if name == "inception_v3":
        kw.update(aux_logits=False, init_weights=False)
    model = getattr(tvm, name)(**kw).eval()
    ex.randomize_constant_params(model, torch.Generator().manual_seed(1234))
    hw = ZOO[name]
    x = torch.randn(1, 3, hw, hw, generator=torch.Generator().manual_seed(7))
    return model, x


def write_tensor(path, arr, name):
    t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def export_one(name, exporter, root):
    model, x = build(name)
    d = os.path.join(root, f"{name}_{exporter}")
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    path = os.path.join(d, "model.onnx")
    t0 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=ex.OPSET, input_names=["input"],
                              output_names=["output"], do_constant_folding=True)
        else:
            torch.onnx.export(model, (x,), path)  # today's defaults
        y = model(x)
    m = onnx.load(path)
    write_tensor(os.path.join(d, "test_data_set_0", "input_0.pb"), x.numpy(), m.graph.input[0].name)
    write_tensor(os.path.join(d, "test_data_set_0", "output_0.pb"), y.numpy(), m.graph.output[0].name)
    print(f"{name:20s} {exporter:6s} {len(m.graph.node):5d} nodes  {time.perf_counter() - t0:6.1f} s  {path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(ZOO), default=sorted(ZOO))
    ap.add_argument("--exporters", default="legacy,dynamo")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), ".cache", "models", "zoo"))
    a = ap.parse_args()
    failed = 0
    for name in a.only:
        for exporter in a.exporters.split(","):
            try:
                export_one(name, exporter, a.out)
            except Exception as e:  # report and go on: one exporter's failure is a finding, not a stop
                failed += 1
                print(f"{name:20s} {exporter:6s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
