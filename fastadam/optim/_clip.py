"""Global-norm gradient clipping and the one read of the gradients it needs.

Design: the optimizers never rescale a gradient array.  ``sum_of_squares`` reads each gradient
once (one BLAS dot per dense tensor); the clip factor ``min(1, max_norm / (norm + 1e-6))`` (torch's
``clip_grad_norm_``) is then folded into the step's ``grad_scale``, so clipping costs one extra
read and no write.  The same sum tells ``skip_nonfinite`` whether any gradient is NaN or infinite
(a sum of squares is finite exactly when every value is, once overflow is ruled out).

Sparse gradients are measured as the dense tensors they stand for: duplicate indices are summed
first (``fastadam.segment_sum``; SciPy's ``sum_duplicates`` for CSR), so the norm equals that of
``IndexedSlices.to_dense()``.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..sparse import IndexedSlices
from ..sparse import segment_sum

__all__ = ["global_norm", "clip_grad_norm"]

CLIP_EPS = 1e-6  # added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does
_HALF = np.dtype(np.float16)


def _dense_sum_of_squares(a: np.ndarray) -> float:
    flat = a.reshape(-1)
    if flat.dtype == _HALF:  # no BLAS for float16, and its range overflows at 65504
        flat = flat.astype(np.float32)
    s = float(np.dot(flat, flat))
    if math.isfinite(s) or not np.isfinite(flat).all():
        return s
    # every value is finite but the squares overflowed: scale by the largest magnitude
    big = float(np.abs(flat).max())
    scaled = flat.astype(np.float64) / big
    return float(np.dot(scaled, scaled)) * big * big


def is_scipy_sparse(grad: Any) -> bool:
    return (type(grad).__module__ or "").startswith("scipy.sparse")


def coalesce(grad: Any) -> Any:
    """The gradient with duplicate indices summed (a new object; dense arrays are returned)."""
    if isinstance(grad, IndexedSlices):
        rows, sums = segment_sum(np.asarray(grad.indices), np.asarray(grad.values))
        return IndexedSlices(sums, rows, grad.dense_shape)
    if is_scipy_sparse(grad):
        out = grad.copy()
        out.sum_duplicates()
        return out
    return grad


def sum_of_squares(grad: Any) -> float:
    """Squared L2 norm of one gradient (dense array, coalesced IndexedSlices or coalesced CSR)."""
    if isinstance(grad, IndexedSlices):
        return _dense_sum_of_squares(np.ascontiguousarray(grad.values))
    if is_scipy_sparse(grad):
        return _dense_sum_of_squares(np.ascontiguousarray(grad.data))
    grad = np.asarray(grad)
    if grad.dtype.kind != "f":  # bfloat16 (ml_dtypes): summed in float32
        grad = grad.astype(np.float32)
    return _dense_sum_of_squares(grad)


def total_sum_of_squares(grads: Sequence[Any]) -> float:
    """Sum of the squared L2 norms of dense arrays and coalesced sparse gradients: one BLAS dot
    per float32/float64 array (the careful per-array path only runs if the sum is not finite,
    to tell an overflow of the squares from a NaN or infinity)."""
    total = 0.0
    for g in grads:
        if type(g) is np.ndarray and g.dtype.kind == "f" and g.dtype != _HALF:
            total += float(np.vdot(g, g))
        else:
            total += sum_of_squares(g)
    if math.isfinite(total):
        return total
    return math.fsum(sum_of_squares(g) for g in grads)


def _as_gradient(g: Any) -> Any:
    data = getattr(g, "data", None)  # a fastadam.autodiff.Tensor: its array
    if isinstance(data, np.ndarray) and not isinstance(g, np.ndarray) and not is_scipy_sparse(g):
        return data
    return g


def global_norm(grads: Sequence[Any]) -> float:
    """L2 norm of all gradients together, ``sqrt(sum_i ||g_i||^2)``, in float64.

    ``grads``: arrays, ``fastadam.autodiff.Tensor`` objects, ``IndexedSlices`` or SciPy CSR matrices
    (``None`` entries are skipped).  Sparse gradients count as their dense form (duplicate
    indices summed).  NaN or infinity in any gradient gives a non-finite norm.
    """
    return math.sqrt(total_sum_of_squares(
        [coalesce(_as_gradient(g)) for g in grads if g is not None]))


def clip_grad_norm(grads: Sequence[Any], max_norm: float) -> float:
    """Scale the gradients in place so that their global norm is at most ``max_norm``; returns
    the norm before clipping (``torch.nn.utils.clip_grad_norm_``'s rule: multiply by
    ``min(1, max_norm / (norm + 1e-6))``).  A non-finite norm leaves the gradients unchanged.

    The optimizers' ``clip_grad_norm=`` option does the same without writing the gradients (the
    factor is folded into the step); use this function when the clipped gradients are needed.
    Sparse gradients are scaled through their values (IndexedSlices ``values``, CSR ``data``).
    """
    max_norm = float(max_norm)
    if not (math.isfinite(max_norm) and max_norm > 0.0):
        raise ValueError(f"max_norm: expected a finite number > 0, got {max_norm}")
    grads = [_as_gradient(g) for g in grads if g is not None]
    for i, g in enumerate(grads):
        arr = g.values if isinstance(g, IndexedSlices) else g.data if is_scipy_sparse(g) else g
        if not isinstance(arr, np.ndarray) or not arr.flags.writeable:
            raise ValueError(f"grads[{i}]: clip_grad_norm scales gradients in place; expected "
                             f"a writable array")
    norm = global_norm(grads)
    factor = max_norm / (norm + CLIP_EPS)
    if math.isfinite(norm) and factor < 1.0:
        for g in grads:
            arr = g.values if isinstance(g, IndexedSlices) else g.data if is_scipy_sparse(g) else g
            arr *= arr.dtype.type(factor)
    return norm
