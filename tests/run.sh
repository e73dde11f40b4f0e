#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, build, unit tests
# (random-graph differential tests and fault injection included), ONNX
# conformance on the reference evaluator and on generated OpenCL kernels,
# the bundled models on OpenCL against ref, CUDA kernels compiled by NVRTC
# (no GPU needed), the memory-bound kernels' SASS (nvcc + cuobjdump: 128-bit
# access, no spills), install + embedding, the Python module (pip install . in a fresh
# venv, tested against ONNX Runtime), the same tests under ASan+UBSan,
# the thread tests under TSan, the fuzz regression corpus, and 60 seconds
# of fuzzing per target. Exits non-zero if any stage fails.
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
  local t0=$SECONDS
  if "$@"; then passed=$((passed + 1)); echo "=== $name: ok ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "=== $name: FAILED ($((SECONDS - t0)) s)"; fi
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

conform_opencl() { # kfuse binary: optimized + fused + generated kernels on OpenCL
  local log; log=$(mktemp)
  "$1" conform "${suites[@]}" --backend opencl | tee "$log" | grep -E "^FAIL|^opencl:" ; local rc=${PIPESTATUS[0]}
  tail -n 1 "$log"; rm -f "$log"
  [ "$rc" -eq 0 ] || { echo "conformance (opencl): failures (exit $rc)"; return 1; }
}

run_models_opencl() { # every bundled model and ../shared/models on OpenCL, checked against ref
  local m n=0 skipped=0 out rc
  for m in "$root"/bench/models/tiny_cnn.onnx "$root"/bench/models/small/*/model.onnx; do
    "$root/build/tools/kfuse" run "$m" --backend opencl --check >/dev/null || { echo "FAILED: $m"; return 1; }
    n=$((n + 1))
  done
  local shared="$root/../shared/models"
  [ -d "$shared" ] || { echo "$n bundled models passed; ../shared/models is not beside the checkout: not run"; return 0; }
  while IFS= read -r m; do
    local args=(run "$m" --backend opencl --check)
    [ -d "$(dirname "$m")/test_data_set_0" ] && args+=(--inputs "$(dirname "$m")/test_data_set_0")
    out=$("$root/build/tools/kfuse" "${args[@]}" 2>&1); rc=$?
    if [ "$rc" -eq 3 ] && grep -q "unsupported op" <<<"$out"; then # e.g. com.microsoft contrib ops
      echo "SKIP: ${m#"$shared"/}: $(grep "unsupported op" <<<"$out" | head -1)"; skipped=$((skipped + 1))
    elif [ "$rc" -ne 0 ]; then
      echo "FAILED: $m"; echo "$out" | tail -5; return 1
    else n=$((n + 1)); fi
  done < <(find "$shared" -name '*.onnx' | sort)
  echo "$n models passed on opencl --check, $skipped skipped"
}

run_models_variants() { # the bundled models through the other execution paths, against ref:
  # library anchors (the host model of the cuBLASLt/cuDNN calls + generated epilogue kernels)
  # and every group launched alone (horizontal batching off)
  local m n=0
  for m in "$root"/bench/models/small/*/model.onnx; do
    KFUSE_LIBANCHOR_HOST=1 "$root/build/tools/kfuse" run "$m" --backend opencl --check >/dev/null ||
      { echo "FAILED with library anchors (host model): $m"; return 1; }
    KFUSE_DISABLE_BATCHING=1 "$root/build/tools/kfuse" run "$m" --backend opencl --check >/dev/null ||
      { echo "FAILED without batching: $m"; return 1; }
    n=$((n + 1))
  done
  echo "$n models passed with library anchors (host model) and without batching"
}

run_models_precision() { # every bundled model at fp16 and bf16 (weights and activations 16-bit),
  # generated kernels and library anchors (host model), against the float32 reference at the
  # precision's tolerance; a few seconds in all
  local m p n=0
  for p in fp16 bf16; do
    for m in "$root"/bench/models/tiny_cnn.onnx "$root"/bench/models/small/*/model.onnx; do
      "$root/build/tools/kfuse" run "$m" --backend opencl --check --precision "$p" >/dev/null ||
        { echo "FAILED at $p: $m"; return 1; }
      KFUSE_LIBANCHOR_HOST=1 "$root/build/tools/kfuse" run "$m" --backend opencl --check --precision "$p" >/dev/null ||
        { echo "FAILED at $p with library anchors (host model): $m"; return 1; }
      n=$((n + 1))
    done
  done
  echo "$n model runs passed at fp16/bf16, generated and with library anchors (host model)"
}

"$root/tools/setup-deps.sh" || { echo "dependency setup failed"; exit 1; }
# A private kernel cache per run: nothing left by an earlier run (or another
# checkout) is read, and every cache path is exercised cold, then warm.
export KFUSE_CACHE_DIR; KFUSE_CACHE_DIR=$(mktemp -d /tmp/kfuse_ci_cache.XXXXXX)
trap 'rm -rf "$KFUSE_CACHE_DIR"' EXIT

stage "build" build "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_TESTS=ON
exported_symbols() { # the shared library exports the public API and nothing else
  local extra; extra=$(nm -D --defined-only "$root/build/libkfuse.so" | awk '{print $3}' | grep -v '^kf_' | grep -v '^_')
  [ -z "$extra" ] || { echo "libkfuse.so exports non-API symbols:"; echo "$extra" | head; return 1; }
  echo "libkfuse.so exports $(nm -D --defined-only "$root/build/libkfuse.so" | grep -c ' kf_') kf_ symbols only"
}
stage "exported symbols" exported_symbols
no_libcuda() { # the CUDA driver, NVRTC, cuBLASLt and cuDNN are loaded at run time: nothing may need them to start
  if ldd "$root/build/tools/kfuse" "$root/build/libkfuse.so" | grep -qE 'libcuda\.so|libnvrtc|libcublas|libcudnn'; then
    echo "kfuse or libkfuse.so links libcuda, NVRTC, cuBLAS or cuDNN"; return 1; fi
  echo "neither kfuse nor libkfuse.so links libcuda, NVRTC, cuBLAS or cuDNN"
}
stage "no libcuda linked" no_libcuda
stage "unit tests" "$root/build/tests/kfuse_tests" --jobs "$jobs"
stage "conformance (ref)" conform "$root/build/tools/kfuse"
stage "conformance (opencl)" conform_opencl "$root/build/tools/kfuse"
stage "bundled and shared models on opencl --check" run_models_opencl
stage "bundled models: library anchors, no batching" run_models_variants
stage "bundled models at fp16 and bf16" run_models_precision
stage "cuda kernels compile (NVRTC, sm_80 + sm_90)" bash -c "'$root/build/tools/kfuse' compile '$root/bench/models/small/bert/model.onnx' --backend cuda --arch sm_80 && '$root/build/tools/kfuse' compile '$root/bench/models/small/bert/model.onnx' --backend cuda --arch sm_90"
stage "emitted kernels compile on their own (nvcc, OpenCL)" "$root/tests/emit_check.sh" "$root/build"
stage "SASS of the memory-bound kernels: 128-bit access, rows read once, no spills" "$root/bench/sass/check.sh" "$root/build"
stage "install + embed example" "$root/tests/install_check.sh" "$root/build-install"
python_module() { # `pip install .` into a fresh venv (scikit-build-core builds the C library once
  # more and ships libkfuse.so and the CLI inside the package), then python/tests: bert and
  # ResNet-50 against ONNX Runtime, errors as exceptions, inputs read in place. Anything
  # missing fails the stage with the reason; the checkout is left as it was.
  local py; py=$(command -v python3) || { echo "python module: no python3 on PATH"; return 1; }
  "$py" -c 'import venv, ensurepip' 2>/dev/null ||
    { echo "python module: $py cannot make a venv with pip (Debian: apt-get install python3-venv)"; return 1; }
  local tmp rc=0 before after; tmp=$(mktemp -d /tmp/kfuse_python.XXXXXX)
  before=$(git -C "$root" status --porcelain --untracked-files=all 2>&1)
  local vpy="$tmp/venv/bin/python"
  if ! "$py" -m venv "$tmp/venv"; then echo "python module: '$py -m venv' failed"; rc=1
  elif ! "$vpy" -m pip install -q --disable-pip-version-check numpy onnxruntime pytest >"$tmp/pip.log" 2>&1; then
    echo "python module: pip could not install numpy, onnxruntime and pytest:"; tail -n 20 "$tmp/pip.log"; rc=1
  elif ! CMAKE_BUILD_PARALLEL_LEVEL=2 "$vpy" -m pip install -q --disable-pip-version-check "$root" >"$tmp/pip.log" 2>&1; then
    echo "python module: 'pip install .' failed:"; tail -n 40 "$tmp/pip.log"; rc=1
  else
    # from outside the checkout, so `import kfuse` is the installed package; no caches written
    # (a skipped test fails here: ONNX Runtime and an OpenCL device are required)
    (cd "$tmp" && PYTHONDONTWRITEBYTECODE=1 KFUSE_CACHE_DIR="$tmp/cache" KFUSE_TEST_NO_SKIP=1 \
       "$vpy" -m pytest -q -rs -p no:cacheprovider "$root/python/tests") || rc=1
  fi
  after=$(git -C "$root" status --porcelain --untracked-files=all 2>&1)
  if [ "$before" != "$after" ]; then
    echo "python module: the build or the tests changed the checkout:"; diff <(echo "$before") <(echo "$after"); rc=1
  fi
  rm -rf "$tmp"
  return "$rc"
}
stage "python module" python_module
stage "fuzz corpus replay" "$root/tests/fuzz/replay.sh" "$root/build"
stage "build (asan+ubsan)" build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DKF_SANITIZE=ON -DKF_TESTS=ON
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=print_suppressions=0
asan_unit_tests() { # a Criterion worker reports leaks at its exit without failing its test, so
  # the reports are read here: one with a frame in this tree's sources is kfuse's (or a test's)
  # and fails the stage; Criterion's own bookkeeping (frames in libcriterion only) does not
  local log; log=$(mktemp)
  # leaks do not abort or set the exit status here (Criterion's own would, in its main
  # process); memory errors still do, and the reports are judged below
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=exitcode=0:print_suppressions=0 \
    "$root/build-asan/tests/kfuse_tests" --jobs "$jobs" >"$log" 2>&1; local rc=$?
  grep -E "^\[FAIL\]|Synthesis" "$log"
  grep -A3 "Assertion Failed" "$log" | head -60 # what a failing test asserted
  local ours; ours=$(awk -v root="$root/" '/ERROR: LeakSanitizer/ {rep = $0 "\n"; mine = 0; inrep = 1; next}
    inrep { rep = rep $0 "\n"; if (index($0, root)) mine = 1 }
    inrep && /^SUMMARY: AddressSanitizer/ { if (mine) printf "%s", rep; inrep = 0 }' "$log")
  local nrep; nrep=$(grep -c "ERROR: LeakSanitizer" "$log")
  rm -f "$log"
  if [ -n "$ours" ]; then echo "leaks in kfuse or test code:"; echo "$ours" | head -60; return 1; fi
  echo "leak reports: $nrep, none with a frame in this tree"
  [ "$rc" -eq 0 ]
}
stage "unit tests (asan+ubsan)" asan_unit_tests
stage "conformance (asan+ubsan)" conform "$root/build-asan/tools/kfuse"
stage "fuzz corpus replay (asan+ubsan)" "$root/tests/fuzz/replay.sh" "$root/build-asan"
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
tsan_threads() { # Criterion cannot start under TSan, so the thread tests are their own binary
  cmake -S "$root" -B "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_TSAN=ON -DKF_TESTS=ON >/dev/null &&
    cmake --build "$root/build-tsan" --target kfuse_threads -j"$jobs" 2>&1 | grep -E "error|warning"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  TSAN_OPTIONS=halt_on_error=1 "$root/build-tsan/tests/kfuse_threads"
}
stage "thread tests (tsan)" tsan_threads
fuzz_explore() { # a minute per target from the seeds: a NEW finding is printed loudly but does
  # not fail CI (which inputs a random walk reaches differs run to run, so gating on it would
  # make CI flaky); findings are minimized into tests/fuzz/corpus, whose replay above gates.
  # A build or harness failure (no FINDING line) still fails the stage.
  local log; log=$(mktemp)
  "$root/tests/fuzz/run.sh" all 60 2>&1 | tee "$log" | grep -E "FINDING|runtime error|ERROR: " ; local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] && grep -q "FINDING" "$log"; then
    echo "NEW FUZZ FINDINGS (not gating; minimize with tests/fuzz/run.sh minimize TARGET FILE):"
    grep "FINDING" "$log"; rc=0
  fi
  tail -n 3 "$log"; rm -f "$log"
  return "$rc"
}
stage "fuzz 60s per target" fuzz_explore

echo
[ "$failed" -eq 0 ] || echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, $failed failed ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
[ "$failed" -eq 0 ]
