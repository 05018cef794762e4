#!/usr/bin/env bash
# The sanitizer job (issue 25): every compiled extension built with AddressSanitizer and
# UndefinedBehaviorSanitizer (-fsanitize=address,undefined, FASTADAM_SANITIZE=1 in setup.py),
# Python run with the ASAN runtime preloaded, over the bad-input, concurrency, fork, CSR and
# memory-pool tests, the format axis's memory-safety findings (tests/test_format_safety.py: arrays
# narrowed or made read-only under a prepared step, fork, corrupted 8-bit states), a bounded
# property-based fuzz of every compiled entry point (tests/test_fuzz_entry_points.py), and the
# ONNX front-end's hostile models (memory budget, external data, the training operators' ranges,
# the single-byte corruption sample).
#
# Zero reports passes; any ASAN or UBSAN report fails the job (the reports go to files, so one
# raised in a forked child or a subprocess counts too).  Before the tests, a self-check makes a
# deliberately bad call into an instrumented kernel and requires a report: a job that could not
# see one fails rather than passes.
#
# The build goes into a copy of the tree (git's tracked and unignored files), so the normal
# in-place build is left alone.  Environment: FASTADAM_FUZZ_EXAMPLES (examples per fuzz test,
# default 60), FASTADAM_SANITIZE_DIR (work folder), CC.  Needs gcc (or clang) with libasan.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
WORK="${FASTADAM_SANITIZE_DIR:-${TMPDIR:-/tmp}/fastadam-sanitize}"
rm -rf "$WORK/src" "$WORK/reports" "$WORK/selfcheck"
mkdir -p "$WORK/src" "$WORK/reports" "$WORK/selfcheck"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
# Cython's C output from the normal build, if there is one (same for both builds: the flags only
# change how gcc compiles it); tar keeps the times, so cythonize sees it up to date.
for pyx in $(git ls-files 'fastadam/*.pyx'); do
    if [ -f "${pyx%.pyx}.c" ]; then cp -p "${pyx%.pyx}.c" "$WORK/src/${pyx%.pyx}.c"; fi
done

# setup.py's own build requirements (pip's isolated builds do not leave them installed)
python -c 'import Cython, setuptools' 2> /dev/null || python -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
    | xargs -d '\n' python -m pip install -q
if [ -z "${CC:-}" ]; then
    CC=gcc
    command -v ccache > /dev/null && CC="ccache gcc"
fi
COMPILER=${CC##* }  # the compiler behind ccache
echo "sanitize: building the extensions with ASAN+UBSAN ($CC) in $WORK/src"
(cd "$WORK/src" && CC="$CC" FASTADAM_SANITIZE=1 python setup.py build_ext --inplace -j 2 \
    > "$WORK/build.log" 2>&1) || { tail -40 "$WORK/build.log"; exit 1; }
echo "sanitize: built in $((SECONDS - START)) s"

ASAN_LIB=$("$COMPILER" -print-file-name=libasan.so)
[ -f "$ASAN_LIB" ] || { echo "sanitize: no libasan.so for $COMPILER"; exit 1; }
# libstdc++ loaded with the runtime: ASAN's __cxa_throw interceptor needs the real one at start
# (onnx's and torch's C++ exceptions, thrown from libraries loaded later, abort otherwise)
CXX_LIB=$("$COMPILER" -print-file-name=libstdc++.so)
PRELOAD="$ASAN_LIB${CXX_LIB:+ $CXX_LIB}"
# Every extension must carry the instrumentation (a silently plain build would pass anything).
for so in $(find "$WORK/src/fastadam" -name '*.so'); do
    if ! grep -q '__asan_init' <<< "$(nm -D "$so")"; then  # (no pipe: grep -q + pipefail)
        echo "sanitize: $so is not instrumented"; exit 1
    fi
done

# detect_leaks=0: CPython's and NumPy's own caches are not leaks worth reporting here.
# allocator_may_return_null=1: a huge request (a hostile shape) is a MemoryError, as without
# ASAN, not an abort.  halt_on_error: the first report ends the process with a failure.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:handle_segv=1:detect_stack_use_after_return=0:log_path=$WORK/reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$WORK/reports/ubsan"
export PYTHONPATH="$WORK/src${PYTHONPATH:+:$PYTHONPATH}"
run() { LD_PRELOAD="$PRELOAD" python "$@"; }

# --- self-check: a deliberately bad call must be reported ----------------------------------------
if ASAN_OPTIONS="${ASAN_OPTIONS/log_path=$WORK\/reports/log_path=$WORK/selfcheck}" \
        run "$WORK/src/tests/sanitize_selfcheck.py" > "$WORK/selfcheck.out" 2>&1; then
    echo "sanitize: self-check FAILED: the deliberately bad call ran without a report"
    cat "$WORK/selfcheck.out"; exit 1
fi
if ! grep -qs "heap-buffer-overflow" "$WORK"/selfcheck/asan.*; then
    echo "sanitize: self-check FAILED: no heap-buffer-overflow report"
    cat "$WORK/selfcheck.out" "$WORK"/selfcheck/* 2> /dev/null || true; exit 1
fi
echo "sanitize: self-check passed (the deliberately bad call was reported:" \
     "$(grep -ho 'heap-buffer-overflow on address' "$WORK"/selfcheck/asan.* | head -1))"

# --- the tests ------------------------------------------------------------------------------------
export FASTADAM_FUZZ_EXAMPLES="${FASTADAM_FUZZ_EXAMPLES:-60}"
export FASTADAM_FUZZ_COUNTS="$WORK/fuzz_counts.json"
status=0
(cd "$WORK/src" && LD_PRELOAD="$PRELOAD" python -m pytest -q -p no:cacheprovider \
    tests/test_hostile_inputs.py tests/test_fuzz_entry_points.py \
    tests/test_dense_errors.py tests/test_optimizer_errors.py tests/test_reliability.py \
    tests/test_sparse.py tests/test_sparse_csr.py tests/test_sparse_strided.py \
    tests/test_autodiff_safety.py tests/test_threads_policy.py tests/test_mempool.py \
    tests/test_step_route.py tests/test_format_safety.py tests/test_embedding_bag.py \
    tests/test_onnx_budget_ops.py tests/test_onnx_external_data.py tests/test_onnx_limits.py \
    tests/test_onnx_uphill.py) \
    || status=$?
# ONNX: the hostile models of tests/onnx_fuzz.py (every amplifying operator's), counted
(cd "$WORK/src" && LD_PRELOAD="$PRELOAD" python tests/onnx_fuzz.py hostile | sed 's/^/sanitize: onnx: /') \
    || status=$?

reports=$(find "$WORK/reports" -type f | wc -l)
if [ "$reports" -gt 0 ]; then
    echo "sanitize: $reports sanitizer report(s):"
    for f in "$WORK"/reports/*; do echo "== $f"; head -60 "$f"; done
    status=1
fi
python - "$FASTADAM_FUZZ_COUNTS" <<'EOF' || true
import json, sys
counts = json.load(open(sys.argv[1]))
cases = sum(c["cases"] for c in counts.values())
refused = sum(c["refused"] for c in counts.values())
print(f"sanitize: fuzz cases {cases}, refused cleanly {refused}, accepted {cases - refused}, "
      f"over {len(counts)} entry points")
EOF
echo "sanitize: $reports report(s), pytest status $status, $((SECONDS - START)) s in all"
exit "$status"
