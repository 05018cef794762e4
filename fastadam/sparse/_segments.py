"""``segment_sum`` and ``csr_transpose_dot``: the segment machinery of sparse gradients.

``segment_sum`` sorts repeated row indices (a stable radix sort) and sums the rows of each
segment in their original order; ``csr_transpose_dot`` forms a linear layer's weight gradient
``X.T @ dz`` for a CSR ``X`` as an ``IndexedSlices`` with sorted, unique indices.  The compiled
code is the sparse driver (fastadam/_core/_sparse.pyx) and the CSR row kernels (``_csr.pyx``).
The optimizer steps that consume these gradients are in fastadam/optim/_sparse_functional.py.
"""
from typing import Any, Optional, Tuple

import numpy as np

from .. import gpu as _gpu
from .._core import _sparse
from .._core._sparse_host import KIND_SEGMENT_SUM, check_csr_structure, run_threaded
from .._core._threads import resolve_num_threads
from .._core._validation import check_indices, check_rows
from . import _csr
from ._indexed_slices import IndexedSlices

_VALUE_TYPES = (np.dtype(np.float32), np.dtype(np.float64))

def segment_sum(indices: np.ndarray, values: np.ndarray, *,
                num_threads: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the rows of ``values`` that share an index: a deterministic ``unsorted_segment_sum``.

    Returns ``(unique_indices, sums)``: ``unique_indices`` the distinct indices in increasing
    order (dtype of ``indices``) and ``sums[s] = values[indices == unique_indices[s]].sum(0)``,
    each sum starting from +0 and adding the rows **in their original order**.  So the result is
    bit-identical for any thread count and run to run, and equal to ``np.add.at`` on a zeroed
    buffer (TensorFlow's ``_deduplicate_indexed_slices``, PyTorch's ``coalesce``).

    The indices are ordered by a stable LSD radix sort (11-bit digits: O(k) for up to 2^32
    distinct rows), then the segments are split over the threads so that each thread sums about
    the same number of rows; one segment is always summed by one thread.

    Parameters
    ----------
    indices : ndarray of int32 or int64, shape (k,)
        Unsorted, with duplicates; must be >= 0 (negative indices raise IndexError).
    values : ndarray of float32 or float64, shape (k, ...)
        Only read; a non-contiguous array is copied.  NaN and infinities propagate (IEEE).
    num_threads : int, optional
        OpenMP threads (None: as many as OpenMP allows; negative counts back from that).

    Returns
    -------
    unique_indices : ndarray, shape (nseg,)
    sums : ndarray, shape (nseg,) + values.shape[1:], dtype of ``values``
    """
    if _gpu.is_device_array(indices) or _gpu.is_device_array(values):  # CuPy: fastadam/gpu
        return _gpu.segment_sum(indices, values)
    indices = check_indices(indices, "indices", None)
    if not isinstance(values, np.ndarray):
        raise TypeError(f"values: expected a numpy.ndarray, got {type(values).__name__}")
    if values.ndim < 1:
        raise ValueError("values: expected at least one dimension (one row per index), got a "
                         "0-d array")
    values = check_rows(values, "values", indices.shape[0], values.shape[1:], None)
    nt = 0 if num_threads is None else resolve_num_threads(num_threads)  # 0: measured choice
    n_rows = int(indices.max()) + 1 if indices.size else 0
    perm, rows, offsets = _sparse.sort_segments(indices, n_rows)
    row_shape = values.shape[1:]
    flat = values.reshape(values.shape[0], int(np.prod(row_shape, dtype=np.int64)))
    sums = run_threaded(_sparse.segment_sum, (flat, perm, offsets), flat.size, nt, KIND_SEGMENT_SUM)
    # rows is a view of the sort's scratch buffer: astype copies it out
    return rows.astype(indices.dtype), sums.reshape((rows.shape[0],) + row_shape)


def csr_transpose_dot(X: Any, dz: np.ndarray) -> IndexedSlices:
    """``X.T @ dz`` for a SciPy CSR ``X`` as an ``IndexedSlices`` with **sorted, unique**
    indices: the weight gradient of a linear layer ``z = X @ W`` (``dz = d loss / d z``), ready
    for ``sparse_step_inplace(..., indices_sorted_unique=True)``.

    ``indices`` are the distinct column indices stored in ``X`` (int64, increasing) and
    ``values[s] = +0 + X[i1, j] * dz[i1] + X[i2, j] * dz[i2] + ...`` over the stored entries of
    column ``j = indices[s]``, added in storage order (row by row, then in each row's order).
    That is bit for bit ``segment_sum(X.indices, X.data[:, None] * dz[row_of_each_entry])``,
    the sum ``sparse_step_inplace`` would compute from the repeated indices, but found without a
    sort: O(nnz(X) x dz.shape[1] + u) for u distinct columns, independent of
    ``X.shape[1]``.  Explicitly stored zeros count as touched columns; duplicate entries are
    summed in storage order.  Single-threaded.

    Parameters
    ----------
    X : scipy.sparse CSR matrix or array, shape (n, n_features), float32 or float64
        Only read; duplicate and unsorted column indices are allowed.
    dz : ndarray, shape (n, K), X's dtype
        Only read (a non-contiguous array is copied).

    Returns
    -------
    IndexedSlices with ``dense_shape == (n_features, K)``.
    """
    import scipy.sparse

    if not scipy.sparse.issparse(X) or X.format != "csr":
        fmt = getattr(X, "format", type(X).__name__)
        raise TypeError(f"X: expected a SciPy CSR matrix or array, got format {fmt!r} "
                        f"(convert with .tocsr())")
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D matrix, got shape {X.shape}")
    n, n_cols = X.shape
    if X.dtype not in _VALUE_TYPES:
        raise TypeError(f"X: expected float32 or float64 data, got {X.dtype}")
    indptr, cols, data = check_csr_structure(X, "X")
    if not isinstance(dz, np.ndarray):
        raise TypeError(f"dz: expected a numpy.ndarray, got {type(dz).__name__}")
    if dz.dtype != X.dtype:
        raise TypeError(f"dz: expected dtype {X.dtype} (the dtype of X), got {dz.dtype}")
    if dz.ndim != 2 or dz.shape[0] != n:
        raise ValueError(f"dz: expected shape ({n}, K) (one row per row of X), got {dz.shape}")
    dz = np.ascontiguousarray(dz)
    if dz.dtype.byteorder not in "=|":
        dz = dz.astype(dz.dtype.newbyteorder("="))
    rows = np.arange(n, dtype=np.int64)
    unique, entry_rank = _csr.columns(indptr, cols, data, rows, n_cols)
    sums = _csr.sum_rows(indptr, data, rows, entry_rank, dz, unique.shape[0])
    return IndexedSlices(sums, unique, (n_cols, dz.shape[1]))
