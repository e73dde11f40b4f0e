#!/usr/bin/env bash
# The SASS of the memory-bound kernels at the figures' shapes (models in
# bench/sass/models, made by make_models.py): each group's emitted .cu is
# compiled alone with nvcc for sm_80 and sm_90 (ptxas: registers, spills) and
# its sm_90 SASS read with cuobjdump. Every global load and store of these
# kernels must be 128-bit (LDG.E.128 / STG.E.128), a row reduction must load
# each element of its row once (its 128-bit loads of the row input = the
# steps a lane holds, no loop over the row), and nothing may spill; the
# attention kernels (attn_*) must hold tensor-core instructions (HMMA), and
# the integer GEMM (kf_imma) and the integer convolution (kf_iconv) int8
# tensor-core instructions (IMMA), the packed integer GEMM of a 1-D operand
# (kf_igemm) dot products of four 8-bit lanes (IDP.4A), the
# float8 convolution (kf_f8conv) float8 tensor-core instructions on sm_89
# (QMMA) and, on sm_90, where mma.sync has no float8 form, float16 ones
# (HMMA) fed by the hardware's float8 unpacking (F2FP ... E4M3.UNPACK).
#   bench/sass/check.sh BUILD_DIR [OUT_DIR]
# cuobjdump: $CUOBJDUMP, PATH, the CUDA toolkit, bench/.venv's nvidia
# package, else pip's nvidia-cuda-cuobjdump installed into a scratch folder;
# without nvcc or cuobjdump it says why and exits 0 (nothing checked).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: bench/sass/check.sh BUILD_DIR [OUT_DIR]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${2:-$work/out}
mkdir -p "$out"
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] || { echo "sass check: no nvcc (PATH, /usr/local/cuda/bin): not checked"; exit 0; }
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
for c in /usr/local/cuda/bin/cuobjdump "$root"/bench/.venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump; do
  [ -z "$cuobjdump" ] && [ -x "$c" ] && cuobjdump=$c
done
if [ -z "$cuobjdump" ]; then
  if python3 -m pip install -q --disable-pip-version-check --break-system-packages --target "$work/pip" \
       nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >"$work/pip.log" 2>&1; then
    cuobjdump=$(find "$work/pip" -name cuobjdump -type f | head -1)
    find "$work/pip" \( -name cuobjdump -o -name nvdisasm \) -type f -exec chmod +x {} +
  fi
  [ -n "$cuobjdump" ] || { tail -3 "$work/pip.log" 2>/dev/null; echo "sass check: no cuobjdump (nor pip's nvidia-cuda-cuobjdump): not checked"; exit 0; }
fi
# cuobjdump -sass runs nvdisasm: the one beside it first (pip's packages share a bin folder)
nvdisasm=$(find "$(dirname "$cuobjdump")" "$work" -maxdepth 6 -name nvdisasm -type f 2>/dev/null | head -1 || true)
[ -n "$nvdisasm" ] && export PATH="$(dirname "$nvdisasm"):$PATH"
command -v nvdisasm >/dev/null || { echo "sass check: cuobjdump without nvdisasm (PATH, beside cuobjdump, pip's nvidia-cuda-nvdisasm): not checked"; exit 0; }
bad=0
printf "%-16s %-10s %9s %9s %6s %6s %5s %s\n" kernel "" "LDG.128" "STG.128" other "regs" spill note
for m in "$root"/bench/sass/models/*.onnx; do
  name=$(basename "$m" .onnx)
  # float8 QDQ models as `--precision fp8` plans them (float8 weights kept)
  prec=(); case $name in f8*) prec=(--precision fp8) ;; esac
  "$build/tools/kfuse" fuse "$m" -o "$work/$name.onnx" "${prec[@]}" --emit "$out/$name" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; echo "sass check: kfuse fuse --emit failed on $name"; exit 1; }
  for cu in "$out/$name"/*.cu; do
    g=$(basename "$cu" .cu)
    for arch in sm_80 sm_90; do
      "$nvcc" -cubin -arch=$arch -Xptxas -v -o "$out/$name/$g.$arch.cubin" "$cu" 2>"$out/$name/$g.$arch.ptxas" ||
        { cat "$out/$name/$g.$arch.ptxas"; echo "sass check: $name/$g does not compile for $arch"; exit 1; }
    done
    "$cuobjdump" -sass "$out/$name/$g.sm_90.cubin" >"$out/$name/$g.sass"
    ldg128=$(grep -c 'LDG\.E\.128' "$out/$name/$g.sass" || true)
    stg128=$(grep -c 'STG\.E\.128' "$out/$name/$g.sass" || true)
    other=$(grep -E '(LDG|STG)\.' "$out/$name/$g.sass" | grep -vc '\.128' || true)
    regs=$(sed -n 's/.*Used \([0-9]*\) registers.*/\1/p' "$out/$name/$g.sm_90.ptxas" | head -1)
    spill=$(grep -ho '[0-9]* bytes spill [a-z]*' "$out/$name/$g".sm_*.ptxas | awk '{s += $1} END {print s + 0}')
    note=""
    # compute kernels: their products must be on the instruction named; their
    # tile loads are element or byte loads (not held to the 128-bit rule):
    # attention on tensor cores (HMMA) for 16-bit data, the integer GEMM and
    # conv on int8 tensor cores (IMMA), the packed integer GEMM by dot
    # products of four 8-bit lanes (IDP.4A)
    form=""
    for f in "kf_attention:HMMA:attention" "kf_imma:IMMA:integer GEMM" "kf_igemm:IDP\.4A:packed integer GEMM" \
             "kf_iconv:IMMA:integer conv" \
             "kf_f8conv:HMMA:float8 conv"; do
      IFS=: read -r entry instr label <<<"$f"
      grep -q "$entry" "$cu" && { form=$label; break; }
    done
    if [ -n "$form" ]; then
      count=$(grep -c "$instr" "$out/$name/$g.sass" || true)
      [ "$count" -gt 0 ] || { note="no ${instr//\\/}"; bad=1; }
      [ "$spill" -eq 0 ] || { note="$note spills"; bad=1; }
      note="$note $form: $count ${instr//\\/}"
      if [ "$form" = "float8 conv" ]; then
        unpack=$(grep -c 'F2FP\.F16\.E[45]M[23]\.UNPACK' "$out/$name/$g.sass" || true)
        "$nvcc" -cubin -arch=sm_89 -o "$out/$name/$g.sm_89.cubin" "$cu" 2>"$out/$name/$g.sm_89.ptxas" ||
          { cat "$out/$name/$g.sm_89.ptxas"; echo "sass check: $name/$g does not compile for sm_89"; exit 1; }
        qmma=$("$cuobjdump" -sass "$out/$name/$g.sm_89.cubin" | grep -c 'QMMA\.' || true)
        [ "$unpack" -gt 0 ] && [ "$qmma" -gt 0 ] || { note="$note (float8 path missing)"; bad=1; }
        note="$note, $unpack float8 unpacks; sm_89: $qmma QMMA"
      fi
      printf "%-16s %-10s %9s %9s %6s %6s %5s %s\n" "$name" "$g" "$ldg128" "$stg128" "$other" "${regs:-?}" "$spill" "$note"
      continue
    fi
    [ "$ldg128" -gt 0 ] && [ "$stg128" -gt 0 ] || { note="no 128-bit access"; bad=1; }
    [ "$other" -eq 0 ] || { note="$note narrower global access"; bad=1; }
    [ "$spill" -eq 0 ] || { note="$note spills"; bad=1; }
    if grep -q 'kf_reduce' "$cu"; then
      # the row input is in0: its loads are the steps a lane holds, each once
      steps=$(grep -c 'KF_VLOAD[A-Z0-9_]*(in0,' "$cu" || true)
      grep -q 'for (int j' "$cu" && { note="$note row loop (row read per pass)"; bad=1; }
      note="$note row in registers: $steps step loads of in0"
    fi
    printf "%-16s %-10s %9s %9s %6s %6s %5s %s\n" "$name" "$g" "$ldg128" "$stg128" "$other" "${regs:-?}" "$spill" "$note"
  done
done
[ "$bad" -eq 0 ] || { echo "sass check: FAILED (see notes)"; exit 1; }
echo "sass check: every memory-bound kernel 128-bit loads and stores only, attention on HMMA, the integer GEMM and conv on IMMA, the float8 conv on QMMA (sm_89) and unpacked to HMMA (sm_90), no spills (sm_80, sm_90)"
