"""The sanitizer job's self-check (tests/sanitize.sh): a deliberately bad call into an
instrumented kernel, which the job requires ASAN to report.

It calls the private CSR column walk directly, bypassing ``check_csr_structure``, with a column
index equal to the number of columns: the walk then reads one slot past its int32 column map
(a heap buffer of ``n_cols`` entries).  A plain build reads a stray value and usually survives;
under ASAN this is a heap-buffer-overflow report and the process ends.  Never imported by the
test suite (its name does not start with ``test_``).
"""
import numpy as np

from fastadam.sparse import _csr

n_cols = 4
indptr = np.array([0, 2], np.int64)
indices = np.array([0, n_cols], np.int64)  # the second column is one past the map
data = np.ones(2)
_csr.columns(indptr, indices, data, np.array([0], np.int64), n_cols)
print("self-check: the bad call returned (no sanitizer, or it missed the overflow)")
