#!/usr/bin/env bash
# History of the track_* ratio benchmarks on the reference machine (asv_bench/README.md).
#
#   bash asv_bench/history.sh                 # 10 commits spread over main's first-parent line
#   bash asv_bench/history.sh 12              # N commits spread over it (head always included)
#   bash asv_bench/history.sh HASH [HASH...]  # exactly these commits
#
# asv builds each commit into the matrix virtualenv of asv.conf.json (a wheel by pip, PyPI
# needed; torch pinned to 2.13.0), runs today's benchmark suite against it (benchmarks that need
# an API the commit lacks are skipped) and adds the results to asv_bench/results/fastadam-ref/,
# which is committed.  Commits that already have results are skipped (--skip-existing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PYTHON="${PYTHON:-python3}"
BRANCH="${BRANCH:-main}"
SECONDS=0
cd "$HERE"

HASHES="$(mktemp "${TMPDIR:-/tmp}/fastadam-history.XXXXXX")"
trap 'rm -f "$HASHES"' EXIT
if [ $# -eq 0 ] || { [ $# -eq 1 ] && [[ "$1" =~ ^[0-9]{1,3}$ ]]; }; then
    n="${1:-10}"
    # oldest first; pick n evenly spaced, the first commit and the head included
    git -C "$REPO" rev-list --first-parent --reverse "$BRANCH" | awk -v n="$n" '
        { c[NR] = $0 }
        END { if (n > NR) n = NR
              for (i = 0; i < n; i++) {
                  k = (n == 1) ? NR : 1 + int(i * (NR - 1) / (n - 1) + 0.5)
                  if (!(k in seen)) { print c[k]; seen[k] = 1 } } }' > "$HASHES"
else
    for c in "$@"; do git -C "$REPO" rev-parse --verify "$c^{commit}"; done > "$HASHES"
fi
echo "history: $(wc -l < "$HASHES") commits:"
git -C "$REPO" log --no-walk=unsorted --format='  %h %ad %s' --date=short $(cat "$HASHES")

"$PYTHON" gate.py --define-machine
"$PYTHON" -m asv run "HASHFILE:$HASHES" --machine fastadam-ref --skip-existing --quick \
    -b "$("$PYTHON" gate.py --print-track-regex)" --show-stderr
echo "history: done in ${SECONDS}s; results in asv_bench/results/fastadam-ref/ (commit them)"
