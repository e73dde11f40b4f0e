#!/usr/bin/env bash
# The main job on the bundled example model: set up, build, describe the
# model, rewrite it, plan its kernel groups (report), run the original and
# the fused file on the reference evaluator with the same inputs, compile
# every kernel for CUDA with NVRTC (no GPU needed), and run the model end to
# end on the best backend present -- CUDA when a GPU is there, else OpenCL
# (PoCL on a CPU) -- checked against the reference evaluator.
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
echo; echo "== every kernel compiled for CUDA sm_90 by NVRTC (into the kernel cache; no GPU needed)"
"$kfuse" compile "$model" --backend cuda --arch sm_90 --dim N=2 || echo "(NVRTC is not available in this build)"
echo; echo "== optimized + fused + compiled, run on the best backend present, checked against ref"
rc=0
"$kfuse" run "$model" --backend cuda --check --seed 1 --dim N=2 || rc=$?
if [ "$rc" -eq 3 ]; then
  echo "(no CUDA device here: OpenCL instead)"
  rc=0
  "$kfuse" run "$model" --backend opencl --check --seed 1 --dim N=2 || rc=$?
  [ "$rc" -ne 3 ] || { echo "(no OpenCL device either: the reference runs above stand)"; rc=0; }
fi
rm -rf "$out"
exit "$rc"
