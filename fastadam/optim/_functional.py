"""The functional optimizer steps: one compiled call per step, arrays updated in place.

Every optimizer object in :mod:`fastadam.optim` is built on these functions (and only these),
so a new backend or a new optimizer only has to provide its functional step.
"""
from .._dense_api import step_inplace
from .._sparse_api import sparse_step_inplace

__all__ = ["step_inplace", "sparse_step_inplace"]
