#!/usr/bin/env bash
# Fuzzes the ONNX loader (fuzz_load.c) with libFuzzer, ASan and UBSan.
#   tests/fuzz/run.sh [SECONDS [libFuzzer flags...]]     default 60 seconds
# Builds with clang in build-fuzz/, seeds from the ONNX backend test models
# (/usr/share/libonnx-testdata) and tests/hostile/, keeps what the fuzzer
# learns in build-fuzz/corpus/ between runs, and exits non-zero on any
# finding (crash, sanitizer report, leak, >10 s input, >2 GiB RSS); the input
# that caused it is written to build-fuzz/artifacts/. A longer run is just
# a bigger number: tests/fuzz/run.sh 3600. Reproduce one finding with
#   build-fuzz/tests/fuzz/fuzz_load build-fuzz/artifacts/crash-...
set -euo pipefail
secs=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/build-fuzz
data=/usr/share/libonnx-testdata/data
# Seeds above this size slow every mutation and add little: the loader's
# branches are all reachable from small models.
max_seed_bytes=65536

command -v clang >/dev/null || { echo "run.sh: clang is needed for libFuzzer"; exit 2; }
# -Wno-unknown-warning-option: the tree's gcc-only warning flags are not errors for clang
cmake -S "$root" -B "$out" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="-Wno-unknown-warning-option" -DKF_FUZZ=ON -DKF_SANITIZE=ON -DKF_TESTS=OFF >/dev/null
cmake --build "$out" --target fuzz_load -j"$(nproc)" >/dev/null

rm -rf "$out/seeds"
mkdir -p "$out/seeds" "$out/corpus" "$out/artifacts"
n=0
for f in "$data"/*/*/model.onnx "$root"/tests/hostile/*.onnx; do
  [ -f "$f" ] || continue
  [ "$(stat -c %s "$f")" -le "$max_seed_bytes" ] || continue
  name=$(echo "$f" | sed "s|^$data/||; s|^$root/||; s|/|_|g")
  cp "$f" "$out/seeds/$name"
  n=$((n + 1))
done
echo "fuzz_load: $n seeds, $secs seconds"

# New inputs go to the first folder (corpus/); seeds are read only.
"$out/tests/fuzz/fuzz_load" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$out/artifacts/" -print_final_stats=1 "$@" "$out/corpus" "$out/seeds"
