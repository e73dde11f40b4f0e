#!/usr/bin/env bash
# A/B timing of two kfuse builds on kernel-shaped models, side by side in one
# run: for each model, ROUNDS rounds alternating A and B (`kfuse bench
# --backend opencl`), then the median device p50 of each and the ratio A/B.
# Environment per side: A_ENV / B_ENV (e.g. B_ENV=KFUSE_DISABLE_BATCHING=1 to
# compare one build with itself).
#
#   bench/kernel_ab/run.sh KFUSE_A KFUSE_B [ROUNDS] [MODEL.onnx...]
# Models default to bench/kernel_ab/make_models.py's set plus the small BERT.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
a=${1:?usage: run.sh KFUSE_A KFUSE_B [ROUNDS] [MODEL...]} b=${2:?}
rounds=${3:-7}
shift $(( $# >= 3 ? 3 : $# ))
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  dir=$(mktemp -d)
  python3 "$root/bench/kernel_ab/make_models.py" "$dir"
  models=("$dir"/*.onnx "$root/bench/models/small/bert/model.onnx")
fi
p50() { # kfuse env... -- model: device p50 in ms (whole-run p50 when not every group is a kernel)
  local bin=$1 envs=$2 m=$3 out
  # shellcheck disable=SC2086 # envs are NAME=VALUE words
  out=$(env $envs "$bin" bench "$m" --backend opencl --warmup 5 --iters 30 2>&1)
  grep -q "device p50" <<<"$out" && sed -n 's/.*device p50 \([0-9.]*\) ms.*/\1/p' <<<"$out" ||
    sed -n 's/.* p50 \([0-9.]*\) ms.*/\1/p' <<<"$out" | head -1
}
launches() { local envs=$2; env $envs "$1" bench "$3" --backend opencl --warmup 1 --iters 2 2>&1 | sed -n 's/.*bench: \([0-9]*\) kernel launches.*/\1/p'; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
printf "%-28s %9s %9s %7s %10s\n" model "A p50 ms" "B p50 ms" "A/B" "launches"
for m in "${models[@]}"; do
  ta=() tb=()
  for _ in $(seq "$rounds"); do
    ta+=("$(p50 "$a" "${A_ENV:-}" "$m")"); tb+=("$(p50 "$b" "${B_ENV:-}" "$m")")
  done
  ma=$(printf '%s\n' "${ta[@]}" | median) mb=$(printf '%s\n' "${tb[@]}" | median)
  name=$(basename "$m" .onnx); [ "$name" = model ] && name=$(basename "$(dirname "$m")")
  printf "%-28s %9.3f %9.3f %7.2f %4s -> %-4s\n" "$name" "$ma" "$mb" "$(awk -v x="$ma" -v y="$mb" 'BEGIN {print x / y}')" \
    "$(launches "$a" "${A_ENV:-}" "$m")" "$(launches "$b" "${B_ENV:-}" "$m")"
done
