#!/bin/sh
# Creates bench/.venv with the peers the benchmarks compare kfuse against (PyTorch exporter,
# ONNX Runtime, onnxsim, onnxoptimizer), pinned in bench/requirements.txt. Run once:
#   sh bench/setup_venv.sh
# Re-running reuses the venv and only installs what is missing. Nothing here is needed by CI.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
if [ ! -x "$here/.venv/bin/python" ]; then
    "$py" -m venv "$here/.venv"
fi
"$here/.venv/bin/python" -m pip install --quiet --upgrade pip
"$here/.venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
"$here/.venv/bin/python" - <<'PY'
import torch, torchvision, transformers, onnx, onnxruntime, onnxsim, onnxoptimizer, numpy
print("bench venv ready: torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "onnx", onnx.__version__,
      "onnxruntime", onnxruntime.__version__, "onnxsim", onnxsim.__version__,
      "numpy", numpy.__version__)
PY
