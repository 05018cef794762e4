#!/usr/bin/env bash
# Builds the optional environment of onnxruntime-training for asv_bench/onnx_report.py --ort
# (issue 42: fastadam.onnx against onnxruntime-training on the same MLP).
#
# onnxruntime-training is not a dependency of fastadam, not even an optional one: its last
# release (1.19.2, CPU wheel `onnxruntime-training-cpu`, CPython <= 3.11) installs the package
# `onnxruntime` itself, so it cannot share a virtual environment with the newer `onnxruntime`
# of the [onnx] extra.  So it gets a virtual environment of its own, used only by the report,
# which runs it as a subprocess.  Usage, from the repository root:
#
#     bash asv_bench/ort_training_env.sh [VENV]        # default VENV: .venv-ort-training
#     env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/onnx_report.py --ort
#
# (the report looks for .venv-ort-training/bin/python, or the interpreter named by
# FASTADAM_ORT_TRAINING_PYTHON).  PYTHON picks the interpreter that makes the venv (default
# python3; onnxruntime-training-cpu 1.19.2 has wheels for CPython 3.8 to 3.11 on x86-64 Linux).
# PyTorch is not installed: the package `onnxruntime.training` imports it in its __init__ (for
# ORTModule and its optimizers), which the on-device training API does not need; the worker
# enters the package without that __init__ (ort_training_worker.py, _import_training).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$here/.venv-ort-training}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# onnx<1.17 and protobuf<5: the versions onnxruntime.training.onnxblock (artifact generation)
# was released with (NumPy 1.26 and 2.4 both work)
"$venv/bin/python" -m pip install --quiet "onnxruntime-training-cpu==1.19.2" numpy \
    "onnx>=1.16,<1.17" "protobuf<5"
"$venv/bin/python" -c "import numpy, onnx, onnxruntime; \
import importlib.util as u, sys; \
sys.modules['onnxruntime.training'] = u.module_from_spec(u.find_spec('onnxruntime.training')); \
from onnxruntime.training import artifacts, api; \
print('onnxruntime-training', onnxruntime.__version__, 'numpy', numpy.__version__, \
'onnx', onnx.__version__, 'in', '$venv')"
