"""``CSRBatches``: a CSR matrix checked once, then read by mini-batches of its rows.

A linear layer ``z = X @ W`` trained on mini-batches of a sparse ``X`` needs, per batch, the
forward product of the batch's rows and the weight gradient ``X[rows].T @ dz`` over the columns
those rows touch (sorted, unique: ready for ``sparse_step_inplace(...,
indices_sorted_unique=True)``).  The CSR row kernels (``_csr.pyx``) walk the rows in place, in
batch order, without gathering a new matrix; this class is their checked, public face: the
matrix is validated once (``check_csr_structure``), each batch's rows and arrays at every call
(O(rows), never O(nnz)), and the bookkeeping between the two calls stays inside the object
``forward`` returns.
"""
import numpy as np

from . import _csr
from ._indexed_slices import IndexedSlices
from .._core._sparse_host import check_csr_structure


class CSRBatch:
    """What ``CSRBatches.forward`` found about one batch (read by ``weight_gradient``)."""

    __slots__ = ("columns", "_rows", "_entry_rank", "_owner")

    def __init__(self, columns, rows, entry_rank, owner):
        self.columns = columns  # the distinct columns the rows touch, increasing (int64)
        self._rows, self._entry_rank, self._owner = rows, entry_rank, owner


class CSRBatches:
    """A SciPy CSR matrix ``X`` (float32 or float64), checked once, read by batches of rows.

    Parameters
    ----------
    X : scipy.sparse CSR matrix or array, shape (n, n_features)
        Only read; it must not change while this object is used.
    name : str
        The argument name error messages use.
    """

    def __init__(self, X, name="X"):
        import scipy.sparse

        if not scipy.sparse.issparse(X) or X.format != "csr":
            fmt = getattr(X, "format", type(X).__name__)
            raise TypeError(f"{name}: expected a SciPy CSR matrix or array, got format {fmt!r}")
        if X.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D matrix, got shape {X.shape}")
        if X.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: expected float32 or float64 data, got {X.dtype}")
        self.name = name
        self.shape = tuple(X.shape)
        self.dtype = X.dtype
        self._indptr, self._indices, self._data = check_csr_structure(X, name)

    def _check_rows(self, rows):
        if not isinstance(rows, np.ndarray) or rows.dtype != np.int64 or rows.ndim != 1:
            raise TypeError(f"rows: expected a 1-D int64 numpy.ndarray, got "
                            f"{getattr(rows, 'dtype', type(rows).__name__)}")
        rows = np.ascontiguousarray(rows)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows: out of range for the {self.shape[0]} rows of {self.name}")
        return rows

    def _check_matrix(self, a, name, shape, writable=False):
        if not isinstance(a, np.ndarray) or a.dtype != self.dtype:
            raise TypeError(f"{name}: expected a numpy.ndarray of dtype {self.dtype} (the dtype "
                            f"of {self.name}), got {getattr(a, 'dtype', type(a).__name__)}")
        if a.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
        if not a.flags.c_contiguous or (writable and not a.flags.writeable):
            raise ValueError(f"{name}: expected a C-contiguous{' writable' if writable else ''} "
                             f"array")

    def forward(self, rows, w, z):
        """``z[i] = X[rows[i]] @ w`` (z written), and the batch's touched columns.

        ``rows``: int64 row indices (any order, repeats allowed); ``w``: (n_features, K);
        ``z``: (len(rows), K), C-contiguous, X's dtype.  Returns a ``CSRBatch`` whose
        ``columns`` are the distinct columns the rows store entries in, increasing."""
        rows = self._check_rows(rows)
        k = w.shape[1] if isinstance(w, np.ndarray) and w.ndim == 2 else -1
        self._check_matrix(w, "w", (self.shape[1], k))
        self._check_matrix(z, "z", (rows.shape[0], k), writable=True)
        columns, entry_rank = _csr.dot_and_columns(self._indptr, self._indices, self._data,
                                                   rows, self.shape[1], w, z)
        return CSRBatch(columns, rows, entry_rank, self)

    def weight_gradient(self, batch, dz):
        """``X[rows].T @ dz`` over the batch's touched columns, as an ``IndexedSlices`` with
        sorted, unique indices and ``dense_shape (n_features, K)``: each column's terms added
        from +0 in batch order (the rounding of ``segment_sum``, without its sort)."""
        if not isinstance(batch, CSRBatch) or batch._owner is not self:
            raise TypeError("batch: expected the CSRBatch this object's forward() returned")
        k = dz.shape[1] if isinstance(dz, np.ndarray) and dz.ndim == 2 else -1
        self._check_matrix(dz, "dz", (batch._rows.shape[0], k))
        sums = _csr.sum_rows(self._indptr, self._data, batch._rows, batch._entry_rank, dz,
                             batch.columns.shape[0])
        return IndexedSlices(sums, batch.columns, (self.shape[1], k))
