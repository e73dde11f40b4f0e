#!/usr/bin/env bash
# gpu_check.sh: the CUDA backend on a machine with an NVIDIA GPU (written for
# the lent H200), in one call of at most 8 minutes: build kfuse there (or use
# a prebuilt one carried in), check that nothing links libcuda, run the unit
# tests that need a GPU, `kfuse run --backend cuda --check` on the bundled
# models in each precision, the ONNX node tests on cuda, fused-kernel
# bandwidth against a measured device-to-device copy, `kfuse compile`
# cold/warm, `kfuse bench`, BERT-base and ResNet-50 against PyTorch eager,
# torch.compile and torch.compile reduce-overhead in fp32 and fp16 (with
# `kfuse run --check` of both in each precision), and Nsight Compute's
# per-kernel times of both. GPU_CHECK_PARTS picks parts (see `want`).
# Every step has a time limit and its own log section; a failed step
# is reported and the next one runs. Results go under $OUT (default
# ./gpu_check_out): summary.txt (one line per step, the figures) and
# gpu_check.log (everything).
#
#   bench/gpu_check.sh                 on the GPU machine, from the repo root
#   KFUSE_BIN=build/tools/kfuse bench/gpu_check.sh   a dry run without building
#   bench/gpu_check.sh --pack DIR      here: copy build/tools/kfuse, the unit
#                                      test binary, the shared libraries they
#                                      need (not glibc's, not libcuda) and the
#                                      ONNX node tests (node.tar.xz) into DIR,
#                                      for a machine that cannot build (no
#                                      protoc-c, protobuf-c or Criterion)
# The GPU machine installs nothing: without cmake/protoc-c/libprotobuf-c it
# uses $KFUSE_PREBUILT (default .gpucheck/, made by --pack); without
# Criterion the unit tests are skipped and the summary says so.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--pack" ]; then
  dir=${2:?usage: gpu_check.sh --pack DIR}
  bin=${3:-$root/build/tools/kfuse}
  tbin=${4:-$(dirname "$(dirname "$bin")")/tests/kfuse_tests}
  mkdir -p "$dir" || exit 1
  cp "$bin" "$dir/kfuse" || exit 1
  # the libraries a bare machine may lack; libc and friends come from there, and so
  # does NVRTC (the CUDA image has it; at 100+ MB it would not fit the 64 MiB that
  # travels to the GPU machine): KFUSE_PACK_NVRTC=1 carries it anyway
  ldd "$bin" | awk '/=>/ {print $3}' | grep -E 'protobuf-c|OpenCL' | while read -r lib; do
    cp -L "$lib" "$dir/"
  done
  # (kfuse loads NVRTC at run time, so ldd does not show it: the build's CMake cache names it)
  if [ "${KFUSE_PACK_NVRTC:-0}" = 1 ]; then
    nvrtc=$(sed -n 's/^CUDA_nvrtc_LIBRARY:[A-Z]*=//p' "$(dirname "$(dirname "$bin")")/CMakeCache.txt")
    nvrtc=$(readlink -f "$nvrtc")
    cp "$nvrtc" "$dir/" || exit 1
    for b in "$(dirname "$nvrtc")"/libnvrtc-builtins.so*; do
      [ -e "$b" ] && cp -L "$b" "$dir/"
    done
  fi
  # the unit tests and what they link (Criterion and its own dependencies), never
  # glibc's libraries or the driver: the GPU machine has its own
  if [ -x "$tbin" ]; then
    cp "$tbin" "$dir/kfuse_tests"
    ldd "$tbin" | awk '/=>/ {print $3}' |
      grep -vE '/(libc|libm|libdl|librt|libpthread|libresolv|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda|libnvidia[^/]*|libnvrtc[^/]*)\.so' |
      while read -r lib; do cp -nL "$lib" "$dir/"; done
  else
    echo "no unit-test binary at $tbin: the pack runs without unit tests"
  fi
  # examples/embed_stream.c on CUDA (the caller's stream and buffers; CUDA Graph
  # replay), linked to the build's libkfuse.a and the driver's stub library
  lib=$(dirname "$(dirname "$bin")")/libkfuse.a
  cuda=${CUDA_HOME:-/usr/local/cuda}
  if [ -f "$lib" ] && [ -f "$cuda/include/cuda.h" ]; then
    # shellcheck disable=SC2046
    cc -O2 -std=c11 -DEMBED_CUDA -I"$root/include" -I"$cuda/include" "$root/examples/embed_stream.c" "$lib" \
      $(pkg-config --libs libprotobuf-c) -lOpenCL -lm -ldl -lpthread -L"$cuda/lib64/stubs" -lcuda \
      -Wl,-rpath,'$ORIGIN' -o "$dir/embed_stream_cuda" || exit 1
  else
    echo "no $lib or $cuda/include/cuda.h: the pack runs without embed_stream_cuda"
  fi
  # libkfuse.so for the Python module (python/kfuse through KFUSE_LIBRARY)
  cp -L "$(dirname "$(dirname "$bin")")/libkfuse.so" "$dir/" 2>/dev/null ||
    echo "no libkfuse.so next to $bin: the pack runs without the Python check"
  # the ONNX node tests (the GPU image's onnx package carries no test data)
  data=/usr/share/libonnx-testdata/data
  [ -d "$data/node" ] && tar cJf "$dir/node.tar.xz" -C "$data" node
  ls -la "$dir"
  exit 0
fi

OUT=${OUT:-$root/gpu_check_out}
mkdir -p "$OUT"
log=$OUT/gpu_check.log
summary=$OUT/summary.txt
: >"$log"
: >"$summary"
start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-460} # seconds: 8 minutes less time to copy $OUT back
work=$(mktemp -d /tmp/kfuse-gpu-check.XXXXXX)
export KFUSE_CACHE_DIR=$work/cache
jobs=$(nproc 2>/dev/null || echo 4)

note() { echo "$*" | tee -a "$summary" >>"$log"; }
# GPU_CHECK_PARTS: the parts to run, comma-separated (default all): tests (unit tests), models
# (bundled models --check in each precision), node (ONNX node tests), kernels (bandwidth,
# compile, bench of the small models), peers (BERT-base/ResNet-50 against PyTorch, full-size
# --check, Nsight Compute), int8 (BERT-base/ResNet-50 quantized by kfuse quantize, --precision
# int8 and int8-fp16, and --type fp8 at --precision fp8, against fp16; not in the default list:
# run it on its own); a part left out is noted as
# skipped
parts=${GPU_CHECK_PARTS:-tests,models,node,kernels,peers}
want() { case ",$parts," in *",$1,"*) return 0 ;; *) note "SKIP  $2 (not in GPU_CHECK_PARTS)"; return 1 ;; esac; }
left() { echo $((budget - ($(date +%s) - start))); }

# step NAME LIMIT COMMAND...: runs COMMAND under `timeout`, at most LIMIT
# seconds and never past the budget; output into the log; status into the
# summary. Returns the command's status.
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  [ "$limit" -gt "$l" ] && limit=$l
  if [ "$limit" -lt 5 ]; then note "SKIP  $name (out of time)"; return 124; fi
  echo "===== $name (limit ${limit}s): $*" >>"$log"
  local t0; t0=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then # functions run in a child bash (export -f)
    timeout --kill-after=5 "$limit" bash -c '"$@"' step "$@" >>"$log" 2>&1
  else
    timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
  fi
  local rc=$?
  local dt=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then note "ok    $name (${dt}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "TIME  $name (stopped after ${limit}s)"
  else note "FAIL  $name (exit $rc, ${dt}s)"; fi
  echo "===== $name: exit $rc" >>"$log"
  return $rc
}

note "gpu_check $(date -u +%FT%TZ) on $(hostname)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi failed"; } |
  sed 's/^/gpu: /' | tee -a "$summary" >>"$log"

# ---- build ------------------------------------------------------------------
kfuse=""
tests=""
if [ -n "${KFUSE_BIN:-}" ]; then # a dry run elsewhere: skip the build
  kfuse=$KFUSE_BIN
  tests=${KFUSE_TESTS_BIN:-}
elif command -v cmake >/dev/null && command -v protoc-c >/dev/null && pkg-config --exists libprotobuf-c 2>/dev/null &&
   [ -f /usr/include/onnx/onnx.proto ]; then
  crit=OFF
  pkg-config --exists criterion 2>/dev/null && crit=ON
  [ $crit = OFF ] && note "note  Criterion is not installed: unit tests skipped"
  bdir=$work/build
  if step "configure" 60 cmake -S "$root" -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_TESTS=$crit &&
     step "build" 180 cmake --build "$bdir" -j"$jobs"; then
    kfuse=$bdir/tools/kfuse
    [ $crit = ON ] && tests=$bdir/tests/kfuse_tests
  fi
else
  note "note  cannot build here (needs cmake, protoc-c, libprotobuf-c, /usr/include/onnx/onnx.proto)"
  pre=${KFUSE_PREBUILT:-$root/.gpucheck}
  if [ -x "$pre/kfuse" ]; then
    # NVRTC and cuBLASLt where the CUDA image keeps them, cuDNN inside PyTorch's wheels
    libdirs=$pre
    for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/cuda/lib64 \
             $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | xargs -n1 -I{} sh -c 'ls -d {}/nvidia/*/lib 2>/dev/null'); do
      [ -d "$d" ] && libdirs=$libdirs:$d
    done
    export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    kfuse=$pre/kfuse
    note "note  using the prebuilt $pre/kfuse"
    if [ -x "$pre/kfuse_tests" ]; then
      tests=$pre/kfuse_tests
      export KF_SOURCE_DIR=$root # the models the tests read, in this copy of the tree
    else
      note "note  no unit-test binary in $pre: unit tests skipped"
    fi
  else
    note "FAIL  no kfuse: nothing prebuilt at $pre (make one with bench/gpu_check.sh --pack .gpucheck)"
  fi
fi
if [ -z "$kfuse" ]; then note "stop: nothing to check"; exit 1; fi
step "kfuse starts" 10 "$kfuse" --version

export root kfuse work
# ---- no libcuda at link time -------------------------------------------------
nolibcuda() {
  local f bad=0
  for f in "$@"; do
    [ -e "$f" ] || continue
    # cuBLASLt and cuDNN are loaded at run time too (kernels/cuda_lib.c)
    if ldd "$f" | grep -qE 'libcuda\.so|libcublas|libcudnn'; then echo "$f links libcuda/cuBLAS/cuDNN"; bad=1; else echo "$f: no libcuda"; fi
  done
  return $bad
}
export -f nolibcuda
step "ldd: kfuse and libkfuse.so do not link libcuda" 10 nolibcuda "$kfuse" "$(dirname "$(dirname "$kfuse")")/libkfuse.so"

# ---- unit tests that use the GPU ---------------------------------------------
if [ -n "$tests" ] && want tests "unit tests"; then
  step "unit tests exec/*, api/*, libanchor/* (the CUDA ones, cuBLASLt and cuDNN calls run here)" 100 \
    "$tests" --jobs 4 --filter '@(exec|api|libanchor)/*'
  grep -E "Synthesis" "$log" | tail -n 1 | sed 's/^/      /' >>"$summary"
fi

# the precisions `kfuse run` takes (all four once the option exists)
precisions="fp32"
"$kfuse" run --help 2>&1 | grep -q -- "--precision" && precisions="fp32 tf32 fp16 bf16"
export precisions

# ---- run --check on the bundled models -------------------------------------------
runcheck() { # every bundled model fused in each precision, and (more elementwise kernels) one group per node
  local m p bad=0
  for m in "$root"/bench/models/tiny_cnn.onnx "$root"/bench/models/small/*/model.onnx; do
    [ -f "$m" ] || continue
    echo "--- $m (KFUSE_DISABLE_FUSION=1)"
    KFUSE_DISABLE_FUSION=1 timeout 40 "$kfuse" run "$m" --backend cuda --check || bad=1
    for p in $precisions; do
      echo "--- $m ($p)"
      if [ "$p" = fp32 ]; then timeout 40 "$kfuse" run "$m" --backend cuda --check || bad=1
      else timeout 40 "$kfuse" run "$m" --backend cuda --check --precision "$p" || bad=1; fi
    done
  done
  return $bad
}
export -f runcheck
want models "bundled models" && step "kfuse run --backend cuda --check (bundled models, each precision)" 150 runcheck
grep -E "groups on CUDA|check:" "$log" | sort | uniq -c | sed 's/^/      /' >>"$summary"

# ---- ONNX node tests on cuda ---------------------------------------------------------
nodedir=""
for d in /usr/share/libonnx-testdata/data/node \
         "$(python3 -c 'import onnx, os; print(os.path.dirname(onnx.__file__))' 2>/dev/null)/backend/test/data/node"; do
  [ -d "$d" ] && { nodedir=$d; break; }
done
# the copy the pack carries (Debian's libonnx-testdata node tests)
if [ -z "$nodedir" ] && [ -f "${pre:-$root/.gpucheck}/node.tar.xz" ]; then
  tar xJf "${pre:-$root/.gpucheck}/node.tar.xz" -C "$work" && nodedir=$work/node
fi
conform_cuda() {
  if "$kfuse" --help 2>&1 | grep -E "conform.*cuda" >/dev/null; then
    "$kfuse" conform "$nodedir" --backend cuda
    return $?
  fi
  # no `conform --backend cuda` yet: run --check per folder on its first
  # data set, 8 at a time, stopping at 80 s with what has finished counted
  find "$nodedir" -mindepth 1 -maxdepth 1 -type d | sort |
    timeout 80 xargs -P 8 -I{} bash -c 'conform_one "$1"' _ {} >"$work/conform.txt"
  local pass fail skip
  pass=$(grep -c '^PASS' "$work/conform.txt"); fail=$(grep -c '^FAIL' "$work/conform.txt")
  skip=$(grep -c '^SKIP' "$work/conform.txt")
  grep '^FAIL' "$work/conform.txt"
  echo "$pass passed, $fail failed, $skip skipped (no kernel for cuda or unsupported: exit 3)"
  [ "$fail" -eq 0 ]
}
conform_one() { # one node test folder: PASS, FAIL with the reason, or SKIP
  local d=$1 err
  [ -d "$d/test_data_set_0" ] || return 0
  err=$(timeout 20 "$kfuse" run "$d/model.onnx" --backend cuda --check --inputs "$d/test_data_set_0" 2>&1 >/dev/null)
  case $? in
    0) echo "PASS $(basename "$d")" ;;
    1) echo "FAIL $(basename "$d"): $(echo "$err" | tail -n 1)" ;;
    *) echo "SKIP $(basename "$d")" ;;
  esac
}
export nodedir
export -f conform_cuda conform_one
if ! want node "ONNX node tests"; then :
elif [ -n "$nodedir" ]; then
  step "ONNX node tests on cuda ($nodedir)" 100 conform_cuda
  grep -E "^[0-9]+ passed" "$log" | tail -n 1 | sed 's/^/      /' >>"$summary"
else
  note "SKIP  ONNX node tests: no test data folder (libonnx-testdata or the onnx Python package)"
fi

# ---- fused kernel bandwidth against a device-to-device copy -----------------------------
bandwidth() {
  # the copy ceiling: 1 GiB device-to-device, bytes read + written, median of 20
  python3 - <<'EOF' || echo "copy: torch unavailable; no ceiling measured"
import torch
n = 1 << 28  # floats: 1 GiB, many times the 50 MB L2
a = torch.randn(n, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
ts = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); ms = ts[len(ts) // 2]
print(f"copy: {2 * 4 * n / ms / 1e6:.0f} GB/s (1 GiB device-to-device, median {ms:.3f} ms)")
EOF
  # one fused elementwise kernel over 2^26 floats: reads x once, writes z once
  python3 - "$work/ew.onnx" <<'EOF' || return 1
import sys, onnx
from onnx import helper as h, TensorProto as T
n = 1 << 26
nodes = [h.make_node("Tanh", ["x"], ["a"]), h.make_node("Mul", ["a", "x"], ["b"]),
         h.make_node("Sigmoid", ["b"], ["c"]), h.make_node("Add", ["c", "a"], ["z"])]
g = h.make_graph(nodes, "ew", [h.make_tensor_value_info("x", T.FLOAT, [n])], [h.make_tensor_value_info("z", T.FLOAT, [n])])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), sys.argv[1])
EOF
  local out; out=$("$kfuse" bench "$work/ew.onnx" --backend cuda --warmup 5 --iters 30) || return 1
  echo "$out"
  local ms; ms=$(echo "$out" | sed -n 's/.*device p50 \([0-9.]*\) ms.*/\1/p')
  [ -n "$ms" ] && awk -v ms="$ms" 'BEGIN { printf "fused: %.0f GB/s (4 ops over 2^26 floats, 512 MiB moved, device p50 %s ms)\n", 2 * 4 * 2^26 / ms / 1e6, ms }'
  # the kernels of bench/sass at the figures' shapes ([32768, 1024]: LayerNorm, Softmax,
  # Add + Gelu in fp32 and fp16; bytes = input read once + output written once)
  local m name bytes
  for m in "$root"/bench/sass/models/*.onnx; do
    name=$(basename "$m" .onnx)
    case $name in attn_*) continue ;; esac # timed against scaled_dot_product_attention below
    case $name in *_f16) bytes=$((2 * 2 * 32768 * 1024)) ;; ew4_f32) bytes=$((3 * 4 * 65536 * 1024)) ;; *) bytes=$((2 * 4 * 32768 * 1024)) ;; esac
    out=$("$kfuse" bench "$m" --backend cuda --warmup 5 --iters 30 2>&1) || { echo "fused: $name failed: $(tail -1 <<<"$out")"; continue; }
    ms=$(echo "$out" | sed -n 's/.*device p50 \([0-9.]*\) ms.*/\1/p')
    [ -n "$ms" ] && awk -v ms="$ms" -v b="$bytes" -v n="$name" 'BEGIN { printf "fused: %.0f GB/s (%s, device p50 %s ms)\n", b / ms / 1e6, n, ms }'
  done
  return 0
}
export -f bandwidth
want kernels "kernel bandwidth" && step "fused kernel bandwidth vs device copy" 60 bandwidth
grep -E "^(copy|fused):" "$log" | sed 's/^/      /' >>"$summary"

# ---- attention: the streaming kernel against torch's scaled_dot_product_attention ----------
# bench/sass/models/attn_{f16,bf16}_s{128,512}: BERT-base's 12 heads of 64, additive mask;
# kfuse's device p50 of the one fused kernel and SDPA's median over the same shapes, one run
attention() {
  local m name out ms
  for m in "$root"/bench/sass/models/attn_*.onnx; do
    name=$(basename "$m" .onnx)
    out=$("$kfuse" bench "$m" --backend cuda --warmup 5 --iters 50 2>&1) || { echo "attention: $name failed: $(tail -1 <<<"$out")"; continue; }
    ms=$(echo "$out" | sed -n 's/.*device p50 \([0-9.]*\) ms.*/\1/p')
    echo "attention: kfuse $name device p50 ${ms:-?} ms"
  done
  python3 - <<'EOF' || echo "attention: torch unavailable; SDPA not timed"
import torch
import torch.nn.functional as F
for dt, tag in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
    for seq in (128, 512):
        q, k, v = (torch.randn(1, 12, seq, 64, device="cuda", dtype=dt) for _ in range(3))
        mask = torch.zeros(1, 1, 1, seq, device="cuda", dtype=dt)
        for _ in range(5): F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); F.scaled_dot_product_attention(q, k, v, attn_mask=mask); e.record(); e.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        print(f"attention: torch sdpa attn_{tag}_s{seq} median {ts[len(ts) // 2]:.4f} ms")
EOF
}
export -f attention
want kernels "attention" && step "attention kernel vs torch sdpa" 60 attention
grep -E "^attention:" "$log" | sed 's/^/      /' >>"$summary"

# ---- device-side runs: the caller's stream and buffers, CUDA Graph replay ----------------
# examples/embed_stream.c built for CUDA (--pack builds it): outputs equal kf_run's, no host
# copy or wait inside kf_run_device, then microseconds per run on the same buffers with
# graphs (the second run captured, the rest replayed) and with KFUSE_CUDA_GRAPHS=0
embed_cuda() {
  local ex=${KFUSE_PREBUILT:-$root/.gpucheck}/embed_stream_cuda m out rc=0
  [ -x "$ex" ] || { echo "embed: no $ex (bench/gpu_check.sh --pack builds it)"; return 1; }
  for m in bench/models/tiny_cnn.onnx bench/models/small/bert/model.onnx bench/models/small/resnet50/model.onnx; do
    out=$(RUNS=200 "$ex" "$root/$m" 2>&1) || rc=1
    echo "$out" | grep -E "^embed_stream: |DIFFERENT|host copies|us per run" | sed "s|^|embed: $m graphs: |"
    out=$(KFUSE_CUDA_GRAPHS=0 RUNS=200 "$ex" "$root/$m" 2>&1) || rc=1
    echo "$out" | grep -E "us per run" | sed "s|^|embed: $m launches: |"
  done
  return $rc
}
export -f embed_cuda
want kernels "device-side runs" && step "embed_stream on CUDA (kf_run_device, graph replay)" 60 embed_cuda
grep -E "^embed:" "$log" | sed 's/^/      /' >>"$summary"

# ---- the Python module with torch CUDA tensors (DLPack, zero copies) ----------------------
pycuda() {
  local lib=${KFUSE_PREBUILT:-$root/.gpucheck}/libkfuse.so
  [ -f "$lib" ] || { echo "python: no $lib (bench/gpu_check.sh --pack carries it)"; return 1; }
  KFUSE_LIBRARY=$lib python3 "$root/bench/gpu_python.py" "$root/bench/models/tiny_cnn.onnx" \
    "$root/bench/models/small/bert/model.onnx" "$root/bench/models/small/resnet50/model.onnx"
}
export -f pycuda
want kernels "python module" && step "python module: torch CUDA tensors through DLPack" 90 pycuda
grep -E "^python:" "$log" | sed 's/^/      /' >>"$summary"

# ---- compile cold/warm and bench -----------------------------------------------------
bert=$root/bench/models/small/bert/model.onnx
resnet=$root/bench/models/small/resnet50/model.onnx
compile_cw() {
  rm -rf "$KFUSE_CACHE_DIR"
  for m in "$bert" "$resnet"; do
    KFUSE_DISABLE_FUSION=1 "$kfuse" compile "$m" --backend cuda | sed "s|^|cold $(basename "$(dirname "$m")"): |"
    KFUSE_DISABLE_FUSION=1 "$kfuse" compile "$m" --backend cuda | sed "s|^|warm $(basename "$(dirname "$m")"): |"
  done
}
export bert resnet
export -f compile_cw
want kernels "compile cold/warm" && step "kfuse compile --backend cuda, cold then warm" 60 compile_cw
grep -E "^(cold|warm) " "$log" | sed 's/^/      /' >>"$summary"
benches() {
  local m
  for m in "$bert" "$resnet"; do
    "$kfuse" bench "$m" --backend cuda --warmup 10 --iters 100 || return 1
    KFUSE_DISABLE_FUSION=1 "$kfuse" bench "$m" --backend cuda --warmup 10 --iters 100 | sed 's/^/unfused: /'
    # anchors as generated kernels instead of cuBLASLt calls (kf_libanchor.h), side by side
    KFUSE_NO_VENDOR_LIB=1 "$kfuse" bench "$m" --backend cuda --warmup 10 --iters 100 | sed 's/^/no vendor lib: /'
    # every group its own launch (codegen/cg_batch.c off), side by side
    KFUSE_DISABLE_BATCHING=1 "$kfuse" bench "$m" --backend cuda --warmup 10 --iters 100 | sed 's/^/no batching: /'
  done
}
export -f benches
want kernels "bench of the small models" &&
  step "kfuse bench --backend cuda (BERT, ResNet small; fused, unfused, no vendor lib, no batching)" 120 benches
grep -E "bench: .*(p50|launches|arena)" "$log" | sed 's/^/      /' >>"$summary"

# ---- BERT-base and ResNet-50 against PyTorch eager and torch.compile ----------------------
# The image's python3 holds torch, torchvision and transformers (device/KINDS.md); random
# weights, batch 1, BERT at sequence 128: bench/gpu_torch_latency.py times eager and
# torch.compile with CUDA events and `kfuse bench --backend cuda` on the same module exported
# to ONNX. Last, as the longest step: what is left of the budget.
torch_latency() {
  local extra=()
  [ "$precisions" != fp32 ] && extra=(--fp16 --check)
  OUT="$OUT" python3 "$root/bench/gpu_torch_latency.py" --kfuse "$kfuse" --out "$OUT" --iters 30 "${extra[@]}"
}
# Nsight Compute per-kernel times of one run of each static export (the calibration input of
# bench/cost_model/calibrate.py): OUT/ncu_<model>_fp32.csv
ncu_kernels() {
  command -v ncu >/dev/null || { echo "no ncu"; return 1; }
  local m
  for m in bert resnet50; do
    [ -f "$OUT/${m}_static.onnx" ] || continue
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "$kfuse" bench "$OUT/${m}_static.onnx" --backend cuda --warmup 0 --iters 1 >"$OUT/ncu_${m}_fp32.csv" 2>&1
    echo "$m: $(grep -c gpu__time_duration "$OUT/ncu_${m}_fp32.csv") kernels profiled"
  done
}
export root OUT
export -f torch_latency ncu_kernels
if ! want peers "PyTorch comparison"; then :
elif python3 -c "import torch, torchvision, transformers; assert torch.cuda.is_available()" >>"$log" 2>&1; then
  step "BERT-base and ResNet-50: PyTorch eager, torch.compile (fp32, fp16, reduce-overhead), kfuse" 300 torch_latency
  grep -E "^\| (bert|resnet50) " "$OUT/torch_latency.md" 2>/dev/null | sed 's/^/      /' >>"$summary"
  grep -E "^check " "$log" | sed 's/^/      /' >>"$summary"
  step "Nsight Compute: kernels of BERT-base and ResNet-50" 80 ncu_kernels
  grep -E "kernels profiled" "$log" | sed 's/^/      /' >>"$summary"
else
  note "SKIP  PyTorch comparison: python3 lacks torch/torchvision/transformers or a CUDA device"
fi

# ---- int8: BERT-base and ResNet-50 quantized, integer anchors (int8, int8-fp16) and float8 products (fp8) against fp16 ---
int8_latency() {
  OUT="$OUT" python3 "$root/bench/gpu_torch_latency.py" --kfuse "$kfuse" --out "$OUT" --iters 30 --no-compile \
    --fp16 --int8 --calib 2
}
export -f int8_latency
if ! want int8 "int8 against fp16"; then :
elif python3 -c "import torch, torchvision, transformers; assert torch.cuda.is_available()" >>"$log" 2>&1; then
  step "BERT-base and ResNet-50: kfuse int8 and fp8 (kfuse quantize) against kfuse fp16" 500 int8_latency
  grep -E "^\| (bert|resnet50) |^(quantize|check) " "$log" | grep -E "int8|fp8|quantize|\|" | sed 's/^/      /' >>"$summary"
else
  note "SKIP  int8 against fp16: python3 lacks torch/torchvision/transformers or a CUDA device"
fi

note "done in $(($(date +%s) - start))s"
rm -rf "$work"
cat "$summary"
