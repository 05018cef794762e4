#!/usr/bin/env bash
# Builds the optional environment of DeepSpeed for asv_bench/torch_report.py (issue 39: the
# DeepSpeedCPUAdam column beside fastadam.torch, torch fused and torch foreach).
#
# DeepSpeed is not a dependency of fastadam, not even an optional one: it pulls in pydantic,
# einops, hjson, msgpack, psutil, py-cpuinfo and ninja, and its CPU Adam is a C++ op compiled
# on first use (torch.utils.cpp_extension, with ninja and a C++ compiler; about a minute on two
# cores).  So it gets a virtual environment of its own, used only to run the report, which
# imports fastadam from the checkout (built in place: `python setup.py build_ext --inplace`),
# so the environment's Python must be the one the checkout was built with.  Usage, from the
# repository root:
#
#     bash asv_bench/deepspeed_env.sh [VENV]           # default VENV: .venv-deepspeed
#     env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv-deepspeed/bin/python \
#         asv_bench/torch_report.py --threads 1 --models
#
# PYTHON picks the interpreter that makes the venv (default python3).  TORCH_SPEC picks torch;
# by default the version that PYTHON itself has (e.g. torch==2.13.0+cpu), else plain `torch`.
# On x86-64 Linux the torch wheel on PyPI is the CUDA build (several GB with its libraries);
# for the CPU build point pip at PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL) or at a
# folder of wheels (PIP_FIND_LINKS).  DeepSpeed is built from its source release with
# --no-build-isolation (its setup.py imports torch); DS_BUILD_OPS=0 leaves every op to the JIT.
# DS_ACCELERATOR=cpu: without a GPU DeepSpeed picks its CPU accelerator, whose op builder
# compiles the CPU Adam (csrc/adam/cpu_adam*.cpp) with -fopenmp and the host's SIMD flags.
# The last step builds that op once, so the report does not time a compiler.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$here/.venv-deepspeed}"
python="${PYTHON:-python3}"
if [ -z "${TORCH_SPEC:-}" ]; then
    TORCH_SPEC="$("$python" -c 'import torch; print("torch==" + torch.__version__)' \
        2>/dev/null || echo torch)"
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "$TORCH_SPEC" numpy scipy threadpoolctl setuptools \
    wheel ninja
DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet --no-build-isolation deepspeed
DS_ACCELERATOR=cpu "$venv/bin/python" - <<'EOF'
import torch
import deepspeed
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.zeros(8))
p.grad = torch.ones(8)
DeepSpeedCPUAdam([p], lr=1e-3).step()  # the JIT build of the CPU Adam op, once
assert torch.all(p < 0), p
print("deepspeed", deepspeed.__version__, "torch", torch.__version__, "CPU Adam op built")
EOF
echo "ready: $venv/bin/python asv_bench/torch_report.py (DS_ACCELERATOR=cpu is set by the report)"
