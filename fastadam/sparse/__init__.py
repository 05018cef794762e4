"""fastadam.sparse: sparse gradients and the segment machinery under them.

- ``_indexed_slices.py``: ``IndexedSlices`` (TensorFlow's rows-plus-indices gradient).
- ``_segments.py``: ``segment_sum`` (a deterministic sorted segment sum) and
  ``csr_transpose_dot`` (a linear layer's weight gradient ``X.T @ dz`` for CSR ``X``, already
  summed, sorted and unique, for the steps' ``indices_sorted_unique=True`` path that skips the
  sort).
- ``_batches.py``: ``CSRBatches``, a CSR matrix checked once and read by mini-batches of rows
  (forward product and weight gradient of a linear layer; the scikit-learn estimators use it).
- ``_csr.pyx``: the CSR row kernels under ``csr_transpose_dot`` and ``CSRBatches``.
- The compiled driver is ``fastadam/_core/_sparse.pyx``; the kernels (radix sort, segment
  tables, segment sum, row walks) are ``include/fastadam/sparse.h``.

The sparse optimizer steps (``sparse_step_inplace`` for Adam, ``sparse_adagrad_step_inplace``,
``sparse_momentum_step_inplace``) live beside the dense ones in ``fastadam.optim``
(fastadam/optim/_sparse_functional.py) and are exported as ``fastadam.sparse_step_inplace``
etc.; ``fastadam.sparse.<step>`` still answers, with a DeprecationWarning.  This package
imports nothing from ``fastadam.optim``: the optimizers depend on the gradient types, not the
other way round.
"""
from ._batches import CSRBatch, CSRBatches
from ._indexed_slices import IndexedSlices
from ._segments import csr_transpose_dot, segment_sum

__all__ = ["CSRBatch", "CSRBatches", "IndexedSlices", "csr_transpose_dot", "segment_sum"]

_MOVED_TO_OPTIM = ("sparse_step_inplace", "sparse_adagrad_step_inplace",
                   "sparse_momentum_step_inplace")


def __getattr__(name):
    """The sparse steps' old home: forward to fastadam.optim with a DeprecationWarning."""
    if name in _MOVED_TO_OPTIM:
        import warnings

        warnings.warn(f"fastadam.sparse.{name} moved to fastadam.optim.{name} (also "
                      f"fastadam.{name})", DeprecationWarning, stacklevel=2)
        from .. import optim  # at attribute access only: no import cycle

        return getattr(optim, name)
    raise AttributeError(f"module 'fastadam.sparse' has no attribute {name!r}")
