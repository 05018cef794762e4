"""Host-side helpers of the sparse driver (fastadam/_core/_sparse.pyx), shared by the packages
above it: the CSR structure check that every CSR gradient and batch passes before a kernel walks
it, and the thread choice of the sparse kernels.

- ``check_csr_structure(X, name)``: ``(indptr, indices, data)`` of a SciPy CSR matrix as private,
  checked copies the kernels may walk (used by ``fastadam.sparse`` and ``fastadam.optim``);
- ``run_threaded(kernel, args, work, nt, kind)``: a sparse kernel on ``nt`` threads, or on the
  count ``fastadam/_core/_threads.py`` measures as faster.
"""
import numpy as np

from . import _sparse
from ._threads import adaptive_threads


# Kinds of work for the measured thread choice (the sparse steps use 2 to 4, the row-wise dense
# step 5: fastadam/optim/_rowwise_adagrad.py).
KIND_SEGMENT_SUM = 1


def run_threaded(kernel, args, work, nt, kind):
    """``kernel(*args, threads)``: ``nt`` threads, or (nt == 0, num_threads=None) the count
    fastadam/_core/_threads.py measures as faster; one thread below the kernels' parallel minimum."""
    if nt:
        return kernel(*args, nt)
    if work < _sparse.PARALLEL_MIN_WORK:
        return kernel(*args, 1)
    return adaptive_threads.run(kernel, args, work, kind)


def check_csr_structure(X, name):
    """(indptr, indices, data) of a CSR matrix as arrays the kernels may walk.

    ``indptr`` and ``indices`` are **private copies**, checked after copying (another thread
    changing the matrix's own arrays later cannot make a kernel read out of bounds), in signed
    arithmetic whatever their stored integer type (a ``uint32`` ``indptr`` that decreases is
    caught, not wrapped): ``indptr`` has ``n + 1`` entries, starts at 0, never decreases and
    ends at ``nnz <= min(len(indices), len(data))``; every stored column index lies in
    ``[0, n_cols)``.  Both come back as one kernel index type (int32 when both were stored in
    at most 32 bits, else int64).  ``data[:nnz]`` is returned as a native-order contiguous
    array (a view when it already is one: values are only read, never used as addresses)."""
    n, n_cols = X.shape
    indptr = private_index_copy(X.indptr, f"{name}.indptr")
    cols = X.indices
    data = X.data
    if not isinstance(data, np.ndarray) or data.ndim != 1:
        raise TypeError(f"{name}.data: expected a 1-D numpy.ndarray")
    if indptr.shape != (n + 1,) or indptr[0] != 0:
        raise ValueError(f"{name}: invalid CSR indptr (expected {n + 1} entries from 0, got "
                         f"{indptr.shape[0]} entries" +
                         (f" from {int(indptr[0])})" if indptr.size else ")"))
    down = np.flatnonzero(indptr[1:] < indptr[:-1])
    if down.size:
        r = int(down[0])
        raise ValueError(f"{name}: invalid CSR indptr (decreasing: indptr[{r + 1}] = "
                         f"{int(indptr[r + 1])} < indptr[{r}] = {int(indptr[r])})")
    nnz = int(indptr[-1])
    if nnz > len(cols) or nnz > data.shape[0]:
        raise ValueError(f"{name}: invalid CSR indptr (ends at {nnz}, past the stored entries: "
                         f"{len(cols)} indices, {data.shape[0]} values)")
    cols = private_index_copy(cols[:nnz], f"{name}.indices")
    if nnz:
        lo, hi = int(cols.min()), int(cols.max())
        if lo < 0:
            raise IndexError(f"{name}.indices: negative index {lo}; negative indices are not "
                             f"allowed")
        if hi >= n_cols:
            raise IndexError(f"{name}.indices: index {hi} is out of range for {n_cols} columns")
    if indptr.dtype != cols.dtype:  # one kernel index type: widen the 32-bit one (a copy)
        indptr, cols = indptr.astype(np.int64), cols.astype(np.int64)
    data = np.ascontiguousarray(data[:nnz], dtype=data.dtype.newbyteorder("="))
    return indptr, cols, data


def private_index_copy(a, name):
    """A contiguous private copy of a 1-D integer array as int32 (stored in at most 32 bits and
    signed) or int64 (anything else: unsigned values are converted, and a uint64 past the int64
    range becomes negative, which the structure checks then refuse)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of integers, got {type(a).__name__}")
    if a.dtype.kind not in "iu" or a.dtype.itemsize > 8:
        raise TypeError(f"{name}: expected an integer array, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {a.shape}")
    signed32 = a.dtype.kind == "i" and a.dtype.itemsize <= 4
    return np.array(a, dtype=np.int32 if signed32 else np.int64, order="C", copy=True)


