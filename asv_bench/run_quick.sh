#!/usr/bin/env bash
# asv step of CI: every benchmark once (--quick), offline, in the current Python
# (--python=same) against the in-place build of this checkout, plus the ratio gate.  Absolute
# timings never fail it; a benchmark that errors does, and so does a track_* ratio that dropped
# by more than its factor against the stored results (asv_bench/gate.py, asv_bench/README.md).
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

# One asv run of every benchmark (--quick, current Python, in-place build, results to a
# temporary directory): fails when a benchmark errors, and when a track_* ratio moved the bad way
# by more than its factor against the newest ancestor with stored results (asv_bench/gate.py).
cd "$HERE"
set +e
"$PYTHON" gate.py --all
rc=$?
set -e
echo "asv smoke run + ratio gate: exit $rc, ${SECONDS}s"
exit $rc
