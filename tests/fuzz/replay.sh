#!/usr/bin/env bash
# Replays the committed fuzz regression corpus (tests/fuzz/corpus/) through
# the replay_<target> binaries of a build with tests (gcc or clang, plain or
# ASan), plus tests/hostile/ for the two model targets:
#   tests/fuzz/replay.sh BUILD_DIR
# Exits non-zero on the first target that crashes, aborts or reports.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: tests/fuzz/replay.sh BUILD_DIR}
cmake --build "$build" --target replay_load replay_patterns replay_pipeline >/dev/null
for t in load patterns pipeline; do
  extra=()
  [ "$t" = patterns ] || extra=("$root/tests/hostile")
  printf 'fuzz_%s: ' "$t"
  "$build/tests/fuzz/replay_$t" "$root/tests/fuzz/corpus/fuzz_$t" "${extra[@]}"
done
