"""fastadam.sparse: optimizer steps on sparse gradients, and the segment machinery under them.

- ``_indexed_slices.py``: ``IndexedSlices`` (TensorFlow's rows-plus-indices gradient).
- ``_api.py``: ``segment_sum`` (a deterministic sorted segment sum) and the sparse steps of
  every optimizer (``sparse_step_inplace`` for Adam, ``sparse_adagrad_step_inplace``,
  ``sparse_momentum_step_inplace``), in lazy, dense and catchup modes; ``csr_transpose_dot``
  (a linear layer's weight gradient ``X.T @ dz`` for CSR ``X``, already summed, sorted and
  unique, for the steps' ``indices_sorted_unique=True`` path that skips the sort).
- ``_csr.pyx``: the CSR row kernels under ``csr_transpose_dot`` (and the forward product the
  scikit-learn estimators use).
- The compiled driver is ``fastadam/_sparse.pyx``; the kernels (radix sort, segment tables,
  segment sum, row walks) are ``include/fastadam/sparse.h``.  The row walk knows no optimizer:
  it calls the optimizer's element formula (``include/fastadam/<optimizer>.h``).
"""
from ._api import (csr_transpose_dot, segment_sum, sparse_adagrad_step_inplace,
                   sparse_momentum_step_inplace, sparse_step_inplace)
from ._indexed_slices import IndexedSlices

__all__ = ["IndexedSlices", "csr_transpose_dot", "segment_sum", "sparse_adagrad_step_inplace",
           "sparse_momentum_step_inplace", "sparse_step_inplace"]
