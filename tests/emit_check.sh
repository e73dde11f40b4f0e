#!/usr/bin/env bash
# `kfuse fuse --emit DIR` writes every generated kernel as DIR/group_N.cl and
# DIR/group_N.cu; each must compile ON ITS OWN: the .cu with nvcc (a CUDA
# toolkit at /usr/local/cuda or on PATH) for sm_90 (the unit tests compile the
# same text with NVRTC for sm_80 and sm_90 and read the spills), the .cl with
# the first OpenCL device (tests' kfuse_clc). Models: the bundled tiny CNN
# and small BERT and ResNet-50, symbolic dims fixed with --dim; and the small
# BERT with batch and seq left symbolic: its shape computations are
# plan-time constants per shape and every other group has symbolic dims, so
# nothing may be emitted there, but every group not generated must say it is
# for that reason (nothing else may fail). With --plan-dim, the same symbolic
# exports (TorchScript BERT, dynamo Llama) emit the kernels a run at those
# sizes compiles, and those must compile too. And the small BERT quantized
# by `kfuse quantize`, planned --precision int8 (integer GEMM kernels).
#   tests/emit_check.sh BUILD_DIR
# Exits non-zero when a file does not compile or nothing was emitted; says
# why when nvcc or OpenCL is absent and that half is not checked.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: tests/emit_check.sh BUILD_DIR}
kfuse=$build/tools/kfuse
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
models=("tiny_cnn:$root/bench/models/tiny_cnn.onnx:--dim N=2"
        "bert:$root/bench/models/small/bert/model.onnx:--dim batch=2 --dim seq=16"
        "bert_dynamic:$root/bench/models/small/bert/model.onnx:"
        "bert_dynamic_at:$root/bench/models/small/bert/model.onnx:--plan-dim batch=2 --plan-dim seq=16"
        "llama_dynamo_dynamic_at:$root/bench/models/small_dynamo_dynamic/llama/model.onnx:--plan-dim batch=1 --plan-dim seq=16"
        "resnet50:$root/bench/models/small/resnet50/model.onnx:--dim batch=1"
        "bert_int8:$work/bert_int8.onnx:--dim batch=2 --dim seq=16 --precision int8")
# an int8 plan's kernels (integer GEMMs, their row passes, requantization)
# from the small BERT quantized here
"$kfuse" quantize "$root/bench/models/small/bert/model.onnx" -o "$work/bert_int8.onnx" --per-channel --random 2 \
  2>"$work/quantize.log" || { cat "$work/quantize.log"; echo "emit_check: kfuse quantize failed"; exit 1; }
total=0
for entry in "${models[@]}"; do
  IFS=: read -r name path dims <<<"$entry"
  # shellcheck disable=SC2086 # dims are separate words
  "$kfuse" fuse "$path" -o "$work/$name.onnx" --emit "$work/$name" $dims 2>"$work/$name.log" ||
    { cat "$work/$name.log"; echo "emit_check: kfuse fuse --emit failed on $name"; exit 1; }
  n=$(find "$work/$name" -name '*.cu' 2>/dev/null | wc -l)
  if [ -z "$dims" ]; then
    other=$(grep 'not generated:' "$work/$name.log" | grep -vc 'symbolic or unknown shape' || true)
    [ "$other" -eq 0 ] || { cat "$work/$name.log"; echo "emit_check: $name: groups not generated for other reasons"; exit 1; }
  else
    [ "$n" -gt 0 ] || { cat "$work/$name.log"; echo "emit_check: no kernel emitted for $name"; exit 1; }
  fi
  [ "$(find "$work/$name" -name '*.cl' 2>/dev/null | wc -l)" -eq "$n" ] || { echo "emit_check: .cl and .cu counts differ for $name"; exit 1; }
  total=$((total + n))
  echo "$name: $n kernels emitted ($(grep -c 'not generated:' "$work/$name.log" || true) groups not generated)"
done
if [ -x "$build/tests/kfuse_clc" ]; then
  find "$work" -name '*.cl' -print0 | xargs -0 "$build/tests/kfuse_clc"
else
  echo "emit_check: kfuse_clc not built (no OpenCL at configure time): .cl files not compiled"
fi
if [ -n "$nvcc" ]; then
  # shellcheck disable=SC2016 # expanded by the inner shell
  find "$work" -name '*.cu' -print0 |
    xargs -0 -n 1 -P "$(nproc)" bash -c '"$0" -arch=sm_90 -c "$1" -o "$1.o" >"$1.log" 2>&1 || { cat "$1.log"; echo "emit_check: nvcc failed on $1"; exit 255; }' "$nvcc"
  echo "emit_check: $total .cu files compiled with nvcc for sm_90 ($(cat "$work"/*/*.cu.log | grep -c 'warning' || true) warnings, e.g. unused index temporaries)"
else
  echo "emit_check: no nvcc here: .cu files not compiled (NVRTC compiles the same text in the unit tests)"
fi
