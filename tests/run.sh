#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, build, unit tests,
# ONNX conformance (reference evaluator), the same under ASan+UBSan, and a
# 60-second fuzz run of the loader. Exits non-zero if any stage fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
data=/usr/share/libonnx-testdata/data
suites=("$data/node" "$data/pytorch-converted" "$data/pytorch-operator" "$data/simple")
# The acceptance bar of the foundation issue: at least this many models pass.
min_conform_pass=700
passed=0; failed=0; failed_names=()

stage() { # name, command...
  local name=$1; shift
  echo "=== $name"
  if "$@"; then passed=$((passed + 1)); echo "=== $name: ok"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "=== $name: FAILED"; fi
}

build() { # dir, cmake args...
  local dir=$1; shift
  cmake -S "$root" -B "$dir" "$@" >/dev/null && cmake --build "$dir" -j"$jobs" 2>&1 | grep -E "error|warning" ; test "${PIPESTATUS[0]}" -eq 0
}

conform() { # kfuse binary
  local log; log=$(mktemp)
  "$1" conform "${suites[@]}" | tee "$log" | grep -E "^FAIL" ; local rc=${PIPESTATUS[0]}
  sed -n '/^op  /,$p' "$log"
  local line; line=$(tail -n 1 "$log")
  local npass; npass=$(echo "$line" | awk '{print $1}')
  rm -f "$log"
  [ "$rc" -eq 0 ] || { echo "conformance: failures (exit $rc)"; return 1; }
  [ "${npass:-0}" -ge "$min_conform_pass" ] || { echo "conformance: only $npass passed, need $min_conform_pass"; return 1; }
}

"$root/tools/setup-deps.sh" || { echo "dependency setup failed"; exit 1; }

stage "build" build "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_TESTS=ON
exported_symbols() { # the shared library exports the public API and nothing else
  local extra; extra=$(nm -D --defined-only "$root/build/libkfuse.so" | awk '{print $3}' | grep -v '^kf_' | grep -v '^_')
  [ -z "$extra" ] || { echo "libkfuse.so exports non-API symbols:"; echo "$extra" | head; return 1; }
  echo "libkfuse.so exports $(nm -D --defined-only "$root/build/libkfuse.so" | grep -c ' kf_') kf_ symbols only"
}
stage "exported symbols" exported_symbols
stage "unit tests" "$root/build/tests/kfuse_tests" --jobs "$jobs"
stage "conformance (ref)" conform "$root/build/tools/kfuse"
stage "build (asan+ubsan)" build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DKF_SANITIZE=ON -DKF_TESTS=ON
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
stage "unit tests (asan+ubsan)" "$root/build-asan/tests/kfuse_tests" --jobs "$jobs"
stage "conformance (asan+ubsan)" conform "$root/build-asan/tools/kfuse"
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
stage "fuzz loader 60s" "$root/tests/fuzz/run.sh" 60

echo
[ "$failed" -eq 0 ] || echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
