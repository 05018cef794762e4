#!/usr/bin/env bash
# asv smoke run for CI: every benchmark once (--quick), offline, in the current Python
# (--python=same) against the in-place build of this checkout.  Never judges timings; fails
# only when a benchmark errors (or the suite cannot be imported).  See asv_bench/README.md.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PYTHON="${PYTHON:-python3}"
SECONDS=0

if ! "$PYTHON" -c "import asv" 2>/dev/null; then
    echo "asv is not installed in $("$PYTHON" -c 'import sys; print(sys.prefix)'):" >&2
    echo "    pip install -e '$REPO[bench]'    (asv, matplotlib, torch>=2, scipy, autograd)" >&2
    echo "or just asv:  pip install 'asv>=0.6'" >&2
    exit 2
fi

# The in-place build (the CI test step has usually made it already; this is incremental).
if ! (cd /tmp && PYTHONPATH="$REPO" "$PYTHON" -c "import fastadam.bench._yardstick" 2>/dev/null); then
    echo "building fastadam in place"
    (cd "$REPO" && "$PYTHON" setup.py build_ext --inplace -j 2 > /dev/null)
fi

cd "$HERE"
"$PYTHON" -m asv machine --yes > /dev/null
LOG="$(mktemp "${TMPDIR:-/tmp}/fastadam-asv.XXXXXX")"
trap 'rm -f "$LOG"' EXIT
# asv drops PYTHONPATH from the benchmark processes; ASV_PYTHONPATH is the one it honours.
# --dry-run: results are not saved (a smoke run's timings mean nothing).
set +e
ASV_PYTHONPATH="$REPO" "$PYTHON" -m asv run --python=same --quick --show-stderr --dry-run 2>&1 \
    | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
ran=$(grep -cE '^\[ *[0-9.]+%\] ··· .* (ok|failed|n/a)$' "$LOG" || true)
failed=$(grep -E '^\[ *[0-9.]+%\] ··· .* failed$' "$LOG" || true)
echo "asv smoke run: $ran benchmarks reported, exit $rc, ${SECONDS}s"
if [ -n "$failed" ] || [ "$rc" -ne 0 ] || [ "$ran" -eq 0 ]; then
    echo "FAIL: asv benchmarks errored:"
    echo "$failed"
    exit 1
fi
echo "asv smoke run OK"
