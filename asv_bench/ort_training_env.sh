#!/usr/bin/env bash
# Builds the optional environment of onnxruntime-training for asv_bench/onnx_report.py --ort
# (issue 42: fastadam.onnx against onnxruntime-training on the same MLP).
#
# onnxruntime-training is not a dependency of fastadam, not even an optional one: its last
# release (1.19.2, CPU wheel `onnxruntime-training-cpu`) is built against NumPy 1.x and cannot
# share a virtual environment with the `onnxruntime` of the [onnx] extra (both install the
# package `onnxruntime`).  So it gets a virtual environment of its own, used only by the report,
# which runs it as a subprocess.  Usage, from the repository root:
#
#     bash asv_bench/ort_training_env.sh [VENV]        # default VENV: .venv-ort-training
#     env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/onnx_report.py --ort
#
# (the report looks for .venv-ort-training/bin/python, or the interpreter named by
# FASTADAM_ORT_TRAINING_PYTHON).  PYTHON picks the interpreter that makes the venv (default
# python3; onnxruntime-training-cpu 1.19.2 has wheels for CPython 3.8 to 3.11 on x86-64 Linux).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$here/.venv-ort-training}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# numpy<2: the wheel's extension is compiled against NumPy 1.x; onnx<1.17 and protobuf<5: what
# onnxruntime.training.onnxblock (artifact generation) was written against
"$venv/bin/python" -m pip install --quiet "onnxruntime-training-cpu==1.19.2" "numpy<2" \
    "onnx>=1.16,<1.17" "protobuf<5"
"$venv/bin/python" -c "import numpy, onnx, onnxruntime; \
from onnxruntime.training import artifacts, api; \
print('onnxruntime-training', onnxruntime.__version__, 'numpy', numpy.__version__, \
'onnx', onnx.__version__, 'in', '$venv')"
