#!/usr/bin/env python3
"""Exports the cost-model calibration models: BERT-base (batch 1, sequence 128) and ResNet-50
(batch 1, 3x224x224) with static shapes, exactly as bench/gpu_torch_latency.py exports them for
`kfuse bench --backend cuda` on a GPU (same builders, seeds, inputs and exporter options), so
the plans made here are the plans that were measured there.

    bench/.venv/bin/python bench/cost_model/export_static.py [--out bench/.cache/models/static]
"""
import argparse
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "models"))
sys.path.insert(0, os.path.dirname(HERE))
import export as ex  # noqa: E402  (bench/models/export.py: the model builders)
from gpu_torch_latency import inputs_for  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), ".cache", "models", "static"))
    ap.add_argument("--models", default="bert,resnet50")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, _, _, outs = ex.build(name, False)
        model.eval()
        inp = inputs_for(name, "cpu")
        path = os.path.join(a.out, f"{name}_static.onnx")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, tuple(inp.values()), path, dynamo=False, opset_version=ex.OPSET,
                              input_names=list(inp), output_names=outs, do_constant_folding=True)
        print(path)


if __name__ == "__main__":
    main()
