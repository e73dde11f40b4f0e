#!/usr/bin/env bash
# Installs kfuse's build and test dependencies from Debian's packages.
# Idempotent: packages already present are left alone.
set -euo pipefail
pkgs=(cmake make gcc pkg-config
      libprotobuf-c-dev protobuf-c-compiler libonnx-dev   # ONNX I/O (onnx.proto compiled with protoc-c)
      libcriterion-dev                                   # unit tests
      libonnx-testdata                                   # ONNX backend conformance data
      clang libclang-rt-14-dev                           # libFuzzer targets
      pocl-opencl-icd ocl-icd-opencl-dev opencl-headers  # OpenCL on the CPU (PoCL) for generated kernels
      python3 python3-venv)                              # the Python module stage (pip install . in a venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
