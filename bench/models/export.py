#!/usr/bin/env python3
"""Exports real architectures from PyTorch to ONNX for kfuse's benchmarks and checks.

Every model is built from its config with random weights (fixed seed); nothing is
downloaded. Full-size models (BERT-base, GPT-2 small, ResNet-50, MobileNetV2, ViT-B/16,
a ~100M-parameter Llama) go to bench/.cache/models/<name>/ (not committed); small versions
with the same op structure go to bench/models/small/<name>/ (committed). Each folder holds
model.onnx and test_data_set_0/{input_N.pb, output_N.pb}, the outputs computed by PyTorch,
so that `kfuse run --inputs` and `kfuse conform` can use it.

Two exporters (--exporter, default both):
  torchscript  torch.onnx.export(dynamo=False), opset 17, constant folding; batch and
               sequence dimensions symbolic ("batch", "seq"). Into small/ and .cache/models/.
  dynamo       today's default, torch.onnx.export with no exporter options (opset 20,
               static shapes), into small_dynamo/ and .cache/models/dynamo/; and for the
               transformers the same with dynamic_shapes (batch and sequence symbolic) into
               small_dynamo_dynamic/ and .cache/models/dynamo_dynamic/. Saved as one file,
               without the exporter's per-node metadata (strip_dynamo_extras).

Run with bench/.venv (bench/setup_venv.sh):

    bench/.venv/bin/python bench/models/export.py [--small] [--full] [--only NAME ...]
        [--exporter torchscript|dynamo|both]
"""
import argparse
import os
import shutil
import sys
import time
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
SMALL_DIR = os.path.join(HERE, "small")
FULL_DIR = os.path.join(BENCH, ".cache", "models")
OPSET = 17
NAMES = ["bert", "gpt2", "resnet50", "mobilenetv2", "vit_b16", "llama"]
# (exporter, dynamic shapes) -> (small root, full root)
ROOTS = {
    ("torchscript", True): (SMALL_DIR, FULL_DIR),
    ("dynamo", False): (os.path.join(HERE, "small_dynamo"), os.path.join(FULL_DIR, "dynamo")),
    ("dynamo", True): (os.path.join(HERE, "small_dynamo_dynamic"), os.path.join(FULL_DIR, "dynamo_dynamic")),
}


class HFWrap(nn.Module):
    """Returns a Hugging Face model's outputs as a plain tuple (the exporter needs one)."""

    def __init__(self, model, keys):
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return tuple(out[k] for k in self.keys)


def llama_config(small):
    """LlamaConfig at a small size (2 layers: 2*2+1 = 5 RMSNorms, 2 SiLU-gated MLPs, 2
    Softmaxes) or about 100M parameters (hidden 768, 12 layers, vocab 32000). Grouped-query
    attention in both: half (small) or a third (full) as many key/value heads as query heads."""
    import transformers
    if small:
        kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
    else:
        kw = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    return transformers.LlamaConfig(attn_implementation="eager", use_cache=False, **kw)


def small_resnet50(widths=(4, 8, 16, 32), num_classes=10):
    """ResNet-50's topology (Bottleneck blocks, 3-4-6-3) at a tiny width."""
    from torchvision.models.resnet import ResNet, Bottleneck

    class SmallResNet(ResNet):
        def __init__(self):
            nn.Module.__init__(self)
            self._norm_layer = nn.BatchNorm2d
            self.inplanes, self.dilation, self.groups, self.base_width = widths[0], 1, 1, 64
            self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(Bottleneck, widths[0], 3)
            self.layer2 = self._make_layer(Bottleneck, widths[1], 4, stride=2)
            self.layer3 = self._make_layer(Bottleneck, widths[2], 6, stride=2)
            self.layer4 = self._make_layer(Bottleneck, widths[3], 3, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[3] * Bottleneck.expansion, num_classes)

    return SmallResNet()


def randomize_constant_params(module, gen):
    """Gives every float parameter or buffer that init left constant (biases and LayerNorm
    shifts at 0, LayerNorm and BatchNorm scales at 1, BatchNorm statistics, ViT's class
    token and head) small random offsets, as trained weights have: a rewrite must not get
    to drop an Add of zeros or a Mul by ones that a real model would not have."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if not t.is_floating_point() or t.numel() == 0:
                continue
            if t.numel() > 1 and bool(t.std(unbiased=False) > 0):
                continue  # already random
            t.add_(torch.randn(t.shape, generator=gen) * 0.05)
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):  # variances must stay positive
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)


def build(name, small):
    """Returns (module, inputs {name: tensor}, dynamic axes, output names)."""
    gen = torch.Generator().manual_seed(1234)
    if name in ("bert", "gpt2", "llama"):
        import transformers
        if name == "llama":
            cfg = llama_config(small)
            model = HFWrap(transformers.LlamaModel(cfg), ["last_hidden_state"])
            outs = ["last_hidden_state"]
            dyn_out = {"last_hidden_state": {0: "batch", 1: "seq"}}
        elif name == "bert":
            kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      vocab_size=512, max_position_embeddings=64) if small else {}
            cfg = transformers.BertConfig(attn_implementation="eager", **kw)
            model = HFWrap(transformers.BertModel(cfg, add_pooling_layer=True), ["last_hidden_state", "pooler_output"])
            outs = ["last_hidden_state", "pooler_output"]
            dyn_out = {"last_hidden_state": {0: "batch", 1: "seq"}, "pooler_output": {0: "batch"}}
        else:
            kw = dict(n_embd=64, n_layer=2, n_head=2, vocab_size=512, n_positions=64,
                      bos_token_id=0, eos_token_id=0) if small else {}
            cfg = transformers.GPT2Config(attn_implementation="eager", use_cache=False, **kw)
            model = HFWrap(transformers.GPT2Model(cfg), ["last_hidden_state"])
            outs = ["last_hidden_state"]
            dyn_out = {"last_hidden_state": {0: "batch", 1: "seq"}}
        randomize_constant_params(model, gen)
        batch, seq = (2, 8) if small else (1, 32)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq - seq // 4:] = 0  # padding at the end of the last sequence
        inputs = {"input_ids": ids, "attention_mask": mask}
        dyn_in = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
        return model, inputs, {**dyn_in, **dyn_out}, outs
    import torchvision.models as tvm
    if name == "resnet50":
        model = small_resnet50() if small else tvm.resnet50(weights=None)
        hw = 64 if small else 224
    elif name == "mobilenetv2":
        model = tvm.mobilenet_v2(weights=None, width_mult=0.25, num_classes=10) if small else tvm.mobilenet_v2(weights=None)
        hw = 64 if small else 224
    elif name == "vit_b16":
        if small:
            from torchvision.models.vision_transformer import VisionTransformer
            model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                      mlp_dim=64, num_classes=10)
            hw = 32
        else:
            model = tvm.vit_b_16(weights=None)
            hw = 224
    else:
        raise SystemExit(f"unknown model {name}")
    randomize_constant_params(model, gen)
    x = torch.randn(2 if small else 1, 3, hw, hw, generator=gen)
    return model, {"input": x}, {"input": {0: "batch"}, "output": {0: "batch"}}, ["output"]


def write_tensor(path, arr, name):
    t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def dynamo_shapes(inputs, dyn):
    """dynamic_axes ({input: {axis: name}}) as dynamo's dynamic_shapes: one Dim per name, in
    the order of the inputs (a tuple: forward's parameter names need not be the inputs')."""
    from torch.export import Dim
    dims = {}
    return tuple({ax: dims.setdefault(n, Dim(n)) for ax, n in dyn[k].items()} for k in inputs)


def run_export(model, args, path, inputs, dyn, outs, exporter, dynamic):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, opset_version=OPSET, input_names=list(inputs),
                              output_names=outs, dynamic_axes=dyn, do_constant_folding=True)
        else:  # today's defaults; names only, so the test data lines up with the graph's inputs
            kw = {"dynamic_shapes": dynamo_shapes(inputs, dyn)} if dynamic else {}
            torch.onnx.export(model, args, path, input_names=list(inputs), output_names=outs, **kw)
            strip_dynamo_extras(path)


def strip_dynamo_extras(path):
    """Rewrites a dynamo export as one file: the weights (which it writes to PATH.data) back
    inside, and without the per-node metadata (Python stack traces with this machine's paths,
    FX node text), which is most of a small model's bytes and nothing a runtime reads."""
    m = onnx.load(path)
    for n in m.graph.node:
        del n.metadata_props[:]
    onnx.save(m, path, save_as_external_data=False)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")


def export(name, small, exporter, dynamic):
    torch.manual_seed(0)
    model, inputs, dyn, outs = build(name, small)
    model.eval()
    root = ROOTS[(exporter, dynamic)][0 if small else 1]
    d = os.path.join(root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, "test_data_set_0"))
    path = os.path.join(d, "model.onnx")
    args = tuple(inputs.values())
    t0 = time.perf_counter()
    try:
        run_export(model, args, path, inputs, dyn, outs, exporter, dynamic)
    except BaseException:
        shutil.rmtree(d)
        raise
    with torch.no_grad():
        expected = model(*args)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    graph_inputs = [i.name for i in m.graph.input]
    for i, (k, v) in enumerate(inputs.items()):
        assert graph_inputs[i] == k, (graph_inputs, k)
        write_tensor(os.path.join(d, "test_data_set_0", f"input_{i}.pb"), v.numpy(), k)
    for i, (k, v) in enumerate(zip(outs, expected)):
        write_tensor(os.path.join(d, "test_data_set_0", f"output_{i}.pb"), v.detach().numpy(), k)
    kind = exporter + ("" if exporter == "torchscript" else "/dynamic" if dynamic else "/static")
    print(f"{name:12s} {'small' if small else 'full ':5s} {kind:15s} {len(m.graph.node):5d} nodes "
          f"{os.path.getsize(path) / 1e6:8.2f} MB  {time.perf_counter() - t0:6.1f} s  {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="only the small models (bench/models/small)")
    ap.add_argument("--full", action="store_true", help="only the full-size models (bench/.cache/models)")
    ap.add_argument("--only", nargs="+", choices=NAMES, default=NAMES)
    ap.add_argument("--exporter", choices=["torchscript", "dynamo", "both"], default="both")
    a = ap.parse_args()
    sizes = [True, False] if a.small == a.full else [a.small]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    # nn.MultiheadAttention's fused inference path (ViT) has no ONNX export; use the plain ops
    torch.backends.mha.set_fastpath_enabled(False)
    kinds = [k for k in ROOTS if a.exporter in ("both", k[0])]
    # The CNNs' one symbolic dim is the batch: their dynamic-shape exports have the static
    # ones' nodes (122, 101) and would only add weights, so only the transformers get one.
    dynamic_names = {"bert", "gpt2", "vit_b16", "llama"}
    failed = 0
    for small in sizes:
        for name in a.only:
            for exporter, dynamic in kinds:
                if exporter == "dynamo" and dynamic and name not in dynamic_names:
                    continue
                try:
                    export(name, small, exporter, dynamic)
                except Exception as e:  # one export's failure is a finding: report it and go on
                    failed += 1
                    print(f"{name:12s} {'small' if small else 'full ':5s} {exporter}{'/dynamic' if dynamic else ''} "
                          f"FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
