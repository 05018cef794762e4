#!/usr/bin/env bash
# The oldest and the newest supported Python (CI, .ci/run): for each, build the wheel from this
# checkout, install it beside NumPy and what the documentation examples import, import it, take
# a step, and run the documentation examples (tests/test_docs_examples.py) on the installed wheel.
#
# "Supported" is pyproject.toml's: the oldest is requires-python's floor (which must be the lowest
# "Programming Language :: Python :: 3.X" classifier), run with the oldest NumPy the package
# allows (the floor of its numpy dependency); the newest is the highest classifier, with the
# newest NumPy.  Interpreters are found as python3.X on PATH, then under pyenv's versions/.  Both
# must be there: a Python the package claims and CI cannot run is a claim nobody checked.
#
# Kept lean (a few minutes): one plain `pip wheel` per Python (pip's isolated build env, as a
# user's install), whose compiled objects go to the checkout's build/object-cache; the wheel is
# installed with --no-deps; torch, mpi4py and CuPy are not installed, so the examples that
# import them skip (the main test run covers them on the CI venv's Python).
#
#   bash wheels/check_pythons.sh            (from anywhere; exits non-zero on the first failure)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST_PYTHON="${PYTHON:-python3}"   # reads pyproject.toml (tomllib: Python >= 3.11)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fastadam-pythons.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
SECONDS=0
step() { printf '\n=== [%3ds] %s\n' "$SECONDS" "$*"; }

# "OLDEST NEWEST NUMPY_FLOOR CLASSIFIED..." from pyproject.toml, checked for consistency
META="$("$HOST_PYTHON" - "$REPO/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
floor = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"].strip())
if not floor:
    sys.exit(f"requires-python {project['requires-python']!r}: expected '>=3.X'")
minors = sorted(int(m) for c in project["classifiers"]
                for m in re.findall(r"^Programming Language :: Python :: 3\.(\d+)$", c))
if not minors or minors[0] != int(floor.group(1)):
    sys.exit(f"the lowest Python classifier (3.{minors[0] if minors else '?'}) is not "
             f"requires-python's floor ({project['requires-python']})")
numpy = [re.fullmatch(r"numpy\s*>=\s*([0-9.]+)", d.strip()) for d in project["dependencies"]]
numpy = [m.group(1) for m in numpy if m]
if not numpy:
    sys.exit("no 'numpy>=X.Y' in the dependencies")
print(f"3.{minors[0]} 3.{minors[-1]} {numpy[0]} " + ",".join(f"3.{m}" for m in minors))
EOF
)"
read -r OLDEST NEWEST NUMPY_FLOOR CLASSIFIED <<< "$META"

find_python() {  # the interpreter of version $1 (3.X), or nothing
    local candidate
    for candidate in "$(command -v "python$1" || true)" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".*/bin/python3 2>/dev/null | sort -V -r); do
        if [ -n "$candidate" ] && [ -x "$candidate" ] && [ "$("$candidate" -c \
            'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$1" ]; then
            echo "$candidate"
            return
        fi
    done
}

OLDEST_PY="$(find_python "$OLDEST")"
[ -n "$OLDEST_PY" ] || { echo "FAIL: no Python $OLDEST (the oldest supported) on this machine"; exit 1; }
NEWEST_PY="$(find_python "$NEWEST")"
[ -n "$NEWEST_PY" ] || { echo "FAIL: no Python $NEWEST (the newest supported) on this machine"; exit 1; }
[ "$NEWEST" != "$OLDEST" ] || { echo "FAIL: the oldest and newest supported Python are both $OLDEST"; exit 1; }

check_python() {  # $1: interpreter, $2: its version (3.X), $3: NumPy requirement,
                  # $4: the start of the NumPy version it must install ("" for any)
    local py="$1" numpy_req="$3" venv="$WORK/venv-$2" wheels="$WORK/wheel-$2" wheel
    step "$("$py" -V): venv with $numpy_req and what the examples import"
    "$py" -m venv "$venv"
    # what the examples import, beside the NumPy under test (a --no-deps wheel adds nothing)
    "$venv/bin/python" -m pip install -q "$numpy_req" scipy scikit-learn onnx "ml_dtypes>=0.3" \
        pytest
    step "$("$py" -V): pip wheel (isolated build env, objects cached in the checkout)"
    "$venv/bin/python" -m pip wheel -q --no-deps -w "$wheels" "$REPO"
    wheel="$(ls "$wheels"/fastadam-*.whl)"
    case "$(basename "$wheel")" in
        *-cp${2/./}-cp${2/./}-*) ;;
        *) echo "FAIL: $(basename "$wheel") is not a wheel for Python $2"; exit 1 ;;
    esac
    echo "$(basename "$wheel")"
    "$venv/bin/python" -m pip install -q --no-deps "$wheel"
    step "$("$py" -V): import, a step against a float64 reference"
    (cd "$WORK" && EXPECT_PYTHON="$2" EXPECT_NUMPY="$4" "$venv/bin/python" - <<'EOF'
import os
import sys
import sysconfig

import numpy as np

import fastadam

site = os.path.realpath(sysconfig.get_paths()["purelib"])
where = os.path.realpath(fastadam.__file__)
assert where.startswith(site + os.sep), f"fastadam imported from {where}, not {site}"
assert "%d.%d" % sys.version_info[:2] == os.environ["EXPECT_PYTHON"], sys.version
assert np.__version__.startswith(os.environ["EXPECT_NUMPY"]), np.__version__
c = fastadam.config()
assert c["openmp"] and c["runtime_dispatch"], c
rng = np.random.default_rng(0)
x0 = rng.standard_normal(1000)
g = rng.standard_normal(1000)
x, m, v = x0.astype(np.float32), np.zeros(1000, np.float32), np.zeros(1000, np.float32)
fastadam.step_inplace(x, g.astype(np.float32), m, v, 1, lr=1e-3, num_threads=2)
# the first Adam step, from the formula in float64: m_hat = g, v_hat = g**2
expected = x0 - 1e-3 * g / (np.abs(g) + 1e-8)
assert np.allclose(x, expected, rtol=1e-6, atol=1e-6), np.abs(x - expected).max()
print(f"fastadam {fastadam.__version__} on NumPy {np.__version__}: import and step OK "
      f"(SIMD {c['simd_level']}, OpenMP)")
EOF
    )
    step "$("$py" -V): the documentation examples on the installed wheel"
    (cd "$WORK" && "$venv/bin/python" -m pytest "$REPO/tests/test_docs_examples.py" -q \
        -p no:cacheprovider)
}

check_python "$OLDEST_PY" "$OLDEST" "numpy==$NUMPY_FLOOR.*" "$NUMPY_FLOOR."
check_python "$NEWEST_PY" "$NEWEST" "numpy" ""
step "done: Python $OLDEST (NumPy $NUMPY_FLOOR) and Python $NEWEST (newest NumPy)"
