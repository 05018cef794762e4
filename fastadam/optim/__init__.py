"""fastadam.optim: the optimizers, in a functional form and as objects.

- ``_coefficients.py``: each optimizer's hyper-parameter checks and float64 folding into the
  coefficient object its kernels read (one place per rule).
- ``_functional.py``: the functional dense steps (``step_inplace`` for Adam,
  ``adagrad_step_inplace``, ``momentum_step_inplace``): validate, fold, one compiled call.
  Their sparse forms are in :mod:`fastadam.sparse`.
- The optimizer objects are built on those functions only.

A new optimizer adds its element formula (``include/fastadam/NAME.h``), a coefficient struct
and class (``fastadam/_coeffs.pyx``), an entry in the kernel table (``include/fastadam/dense.c``
and the sparse row walk), a folding function here, and its functional step.
"""
from ._functional import adagrad_step_inplace, momentum_step_inplace, step_inplace
from ..sparse import (sparse_adagrad_step_inplace, sparse_momentum_step_inplace,
                      sparse_step_inplace)

__all__ = ["adagrad_step_inplace", "momentum_step_inplace", "sparse_adagrad_step_inplace",
           "sparse_momentum_step_inplace", "sparse_step_inplace", "step_inplace"]
