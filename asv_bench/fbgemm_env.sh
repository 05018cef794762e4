#!/usr/bin/env bash
# Builds the optional environment of FBGEMM for asv_bench/embedding_report.py --fbgemm (issue 40:
# fastadam's sparse steps against FBGEMM's table-batched embedding, TorchRec's CPU kernels).
#
# fbgemm-gpu-cpu is not a dependency of fastadam, not even an optional one: each release loads
# with one PyTorch release only (its compiled operators link against that torch's C++ symbols;
# a mismatched pair fails at `import fbgemm_gpu` with "Could not load this library ... undefined
# symbol"), so it gets a virtual environment of its own, used only by the report, which runs
# asv_bench/embedding_worker.py in it as a subprocess.  Usage, from the repository root:
#
#     bash asv_bench/fbgemm_env.sh [VENV]                # default VENV: .venv-fbgemm
#     env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/embedding_report.py --fbgemm
#
# (the report looks for .venv-fbgemm/bin/python, or the interpreter named by
# FASTADAM_FBGEMM_PYTHON).  TORCH and FBGEMM pick the pair (defaults: torch 2.13.0 with
# fbgemm-gpu-cpu 1.8.0, a pair that loads; fbgemm-gpu-cpu 1.7.0 and 1.9.0 do not load with torch
# 2.13.0; issue 40 reports torch 2.10.0 with fbgemm-gpu-cpu 1.5.0).  PyPI's Linux torch wheels
# carry CUDA and pull the nvidia-* packages (several GB); a CPU-only torch wheel comes from
# PyTorch's own index (TORCH_INDEX=https://download.pytorch.org/whl/cpu) where that index is
# reachable, or from a local wheel pip already finds (PIP_FIND_LINKS).  PYTHON picks the
# interpreter that makes the venv (default python3; CPython 3.11 on x86-64 Linux was tried).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$here/.venv-fbgemm}"
python="${PYTHON:-python3}"
torch_version="${TORCH:-2.13.0}"
fbgemm_version="${FBGEMM:-1.8.0}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
index=()
if [ -n "${TORCH_INDEX:-}" ]; then index=(--index-url "$TORCH_INDEX"); fi
"$venv/bin/python" -m pip install --quiet "${index[@]}" "torch==$torch_version"
"$venv/bin/python" -m pip install --quiet numpy
# --no-deps: fbgemm-gpu-cpu names no torch requirement of its own, and must not move the pair
"$venv/bin/python" -m pip install --quiet --no-deps "fbgemm-gpu-cpu==$fbgemm_version"
"$venv/bin/python" -c "import numpy, torch, fbgemm_gpu; \
from fbgemm_gpu.split_table_batched_embeddings_ops_training import \
SplitTableBatchedEmbeddingBagsCodegen; \
print('fbgemm_gpu', fbgemm_gpu.__version__, 'torch', torch.__version__, 'numpy', \
numpy.__version__, 'in', '$venv')"
