#!/usr/bin/env bash
# Fuzzes kfuse with libFuzzer, ASan and UBSan (clang). Targets:
#   load      the ONNX loader and save/load round trip    (fuzz_load.c)
#   patterns  the .kfp rule parser and rule checker        (fuzz_patterns.c)
#   pipeline  load -> opt -> plan -> codegen -> fuse export (fuzz_pipeline.c)
#
#   tests/fuzz/run.sh [TARGET|all [SECONDS [libFuzzer flags...]]]
#       default: all targets, 60 seconds each (the CI stage); a release's
#       one-hour run per target is `tests/fuzz/run.sh all 3600` (runs
#       longer than 60 s go on past a finding and report every one).
#       (A number alone, `run.sh 60`, means all targets for that long.)
#   tests/fuzz/run.sh replay [TARGET|all]
#       runs the committed regression corpus tests/fuzz/corpus/fuzz_TARGET/
#       once through the fuzzer build (no fuzzing).
#   tests/fuzz/run.sh minimize TARGET ARTIFACT
#       shrinks a finding and adds it to tests/fuzz/corpus/fuzz_TARGET/
#       (commit it with the fix, so every build replays it from then on).
#
# Builds in build-fuzz/; seeds come from the ONNX backend test models
# (/usr/share/libonnx-testdata), tests/hostile/, fusion/patterns/ and the
# regression corpus. What the fuzzer learns is kept in build-fuzz/corpus/
# TARGET/ between runs. Exits non-zero on any finding (crash, sanitizer
# report, leak, >10 s input, >2 GiB RSS); the input is written to
# build-fuzz/artifacts/TARGET/. Reproduce one with
#   build-fuzz/tests/fuzz/fuzz_TARGET build-fuzz/artifacts/TARGET/crash-...
# Environment: KF_FUZZ_NVRTC=1 makes the pipeline target compile every CUDA
# kernel with NVRTC (slow; for long runs on a machine with the toolkit).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/build-fuzz
data=/usr/share/libonnx-testdata/data
all_targets=(load patterns pipeline)
# Seeds above this size slow every mutation and add little: the loader's
# and the pipeline's branches are all reachable from small models.
max_seed_bytes=65536

mode=fuzz
if [ "${1:-}" = replay ] || [ "${1:-}" = minimize ]; then mode=$1; shift; fi
what=${1:-all}
if [[ "$what" =~ ^[0-9]+$ ]]; then what=all; else shift || true; fi
if [ "$what" = all ]; then targets=("${all_targets[@]}"); else targets=("$what"); fi
for t in "${targets[@]}"; do
  [ -f "$root/tests/fuzz/fuzz_$t.c" ] || { echo "run.sh: no target '$t' (have: ${all_targets[*]})"; exit 2; }
done

command -v clang >/dev/null || { echo "run.sh: clang is needed for libFuzzer"; exit 2; }
# -Wno-unknown-warning-option: the tree's gcc-only warning flags are not errors for clang
cmake -S "$root" -B "$out" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="-Wno-unknown-warning-option" -DKF_FUZZ=ON -DKF_SANITIZE=ON -DKF_TESTS=OFF >/dev/null
cmake --build "$out" --target "${targets[@]/#/fuzz_}" -j"$(nproc)" >/dev/null

if [ "$mode" = minimize ]; then
  art=${1:?run.sh minimize TARGET ARTIFACT}
  dest=$root/tests/fuzz/corpus/fuzz_$what
  mkdir -p "$dest"
  name=$(sha1sum "$art" | cut -c1-16)
  # -minimize_crash keeps the smallest input that still fails; 30 s is
  # plenty for the small inputs these targets take.
  "$out/tests/fuzz/fuzz_$what" -minimize_crash=1 -max_total_time=30 -exact_artifact_path="$dest/$name" "$art" || true
  [ -f "$dest/$name" ] || cp "$art" "$dest/$name"
  echo "run.sh: $dest/$name ($(stat -c %s "$dest/$name") bytes); it must pass once the bug is fixed"
  exit 0
fi

if [ "$mode" = replay ]; then
  rc=0
  for t in "${targets[@]}"; do
    files=("$root/tests/fuzz/corpus/fuzz_$t"/*)
    [ -e "${files[0]}" ] || { echo "fuzz_$t: empty corpus"; continue; }
    if "$out/tests/fuzz/fuzz_$t" -runs=0 "${files[@]}" >"$out/replay-$t.log" 2>&1; then
      echo "fuzz_$t: ${#files[@]} corpus inputs pass"
    else
      tail -n 30 "$out/replay-$t.log"; echo "fuzz_$t: FAILED on the corpus"; rc=1
    fi
  done
  exit $rc
fi

seed() { # target, file
  local f=$2 dir=$out/seeds/$1
  [ -f "$f" ] || return 0
  [ "$(stat -c %s "$f")" -le "$max_seed_bytes" ] || return 0
  cp "$f" "$dir/$(echo "$f" | sed "s|^$data/||; s|^$root/||; s|/|_|g")"
}

secs=${1:-60}
shift || true
failed=()
for t in "${targets[@]}"; do
  rm -rf "$out/seeds/$t"
  mkdir -p "$out/seeds/$t" "$out/corpus/$t" "$out/artifacts/$t"
  dict=()
  case $t in
    load|pipeline)
      for f in "$data"/*/*/model.onnx "$root"/tests/hostile/*.onnx; do seed "$t" "$f"; done ;;
    patterns)
      for f in "$root"/fusion/patterns/*.kfp; do
        seed "$t" "$f"
        # one rule per seed too: short inputs reach the checker
        awk -v dir="$out/seeds/$t" -v base="$(basename "$f" .kfp)" \
          '/^rule /{n++} n{print > (dir "/" base "_" n ".kfp")}' "$f"
      done
      dict=(-dict="$root/tests/fuzz/kfp.dict") ;;
  esac
  for f in "$root/tests/fuzz/corpus/fuzz_$t"/*; do seed "$t" "$f"; done
  echo "fuzz_$t: $(ls "$out/seeds/$t" | wc -l) seeds, $secs seconds"
  # Past CI's minute a finding does not end the run (fork mode, one job):
  # a release's hour is an hour, and every finding is kept in artifacts/.
  keep_going=()
  [ "$secs" -gt 60 ] && keep_going=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  before=$(ls "$out/artifacts/$t" | wc -l)
  status=0
  # New inputs go to the first folder (corpus/); seeds are read only.
  "$out/tests/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 "${dict[@]}" "${keep_going[@]}" \
    -artifact_prefix="$out/artifacts/$t/" -print_final_stats=1 "$@" "$out/corpus/$t" "$out/seeds/$t" || status=$?
  new=$(( $(ls "$out/artifacts/$t" | wc -l) - before ))
  if [ "$status" -ne 0 ] || [ "$new" -gt 0 ]; then
    failed+=("$t")
    echo "fuzz_$t: FINDING ($new new input(s)) in $out/artifacts/$t/ (tests/fuzz/run.sh minimize $t FILE adds it to the corpus)"
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "run.sh: findings in: ${failed[*]}"; exit 1; }
