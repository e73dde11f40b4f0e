#!/usr/bin/env bash
# The main job on the bundled example model: set up, build, describe the
# model and run it on the reference evaluator.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup-deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DKF_TESTS=OFF >/dev/null
cmake --build "$root/build" -j"$(nproc)" >/dev/null
model="$root/bench/models/tiny_cnn.onnx"
"$root/build/tools/kfuse" info "$model"
"$root/build/tools/kfuse" run "$model" --backend ref --seed 1
