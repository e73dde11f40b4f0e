#!/usr/bin/env bash
# Host steps and correctness of the torchvision zoo (bench/models/export_zoo.py): for each
# exported model, the groups its plan leaves on the reference evaluator (`kfuse compile
# --backend opencl`, with each one's reason from KFUSE_TRACE=backend), then `kfuse run
# --backend opencl --check` on its test data in each precision kfuse takes. One line per
# model and precision; exits non-zero if any model has a host step or fails its check.
#
#   bench/models/zoo_check.sh [--no-run] [DIR...]     (default: bench/.cache/models/zoo/*/)
#
# PoCL runs the full-size models on this CPU: the checks take minutes per model; --no-run
# counts host steps only.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
kfuse=${KFUSE_BIN:-$root/build/tools/kfuse}
run=1
[ "${1:-}" = "--no-run" ] && { run=0; shift; }
dirs=("$@")
[ ${#dirs[@]} -eq 0 ] && dirs=("$root"/bench/.cache/models/zoo/*/)
precisions="fp32"
"$kfuse" run --help 2>&1 | grep -q -- "--precision" && precisions="fp32 fp16 bf16"
bad=0
for d in "${dirs[@]}"; do
  d=${d%/}
  name=$(basename "$d")
  out=$(KFUSE_TRACE=backend "$kfuse" compile "$d/model.onnx" --backend opencl 2>&1)
  ref=$(echo "$out" | sed -n 's/.* \([0-9]*\) on ref.*/\1/p' | tail -n 1)
  echo "$name: ${ref:-?} host steps"
  if [ "${ref:-1}" != 0 ]; then
    bad=1
    echo "$out" | grep -E "on the reference evaluator|: ref" | sed 's/^/    /' | sort | uniq -c | head -5
  fi
  [ $run = 1 ] || continue
  for p in $precisions; do
    args=(run "$d/model.onnx" --backend opencl --check --inputs "$d/test_data_set_0")
    [ "$p" = fp32 ] || args+=(--precision "$p")
    t0=$(date +%s)
    if res=$("$kfuse" "${args[@]}" 2>&1); then echo "$name $p: check passed ($(($(date +%s) - t0)) s)"
    else bad=1; echo "$name $p: FAILED: $(echo "$res" | tail -n 1)"; fi
  done
done
exit $bad
