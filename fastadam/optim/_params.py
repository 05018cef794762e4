"""Parameters and gradients of the optimizer objects: checked once, before any array changes.

Design: a parameter is an ndarray or a tensor: an object with a ``.data`` ndarray (updated in
place) and a ``.grad`` (``fastadam.autodiff.Tensor`` is one; this package imports nothing of
autodiff: it reads that protocol).  After a step changes a tensor's ``.data``, its
``mark_dirty()`` is called when it has one (autodiff's version counter).  Parameters are checked when they enter an optimizer (float dtype, writable,
C-contiguous, native and aligned, no two sharing memory).  Gradients are checked at every step,
all of them before the first compiled call, so a bad gradient never leaves a step half applied:
dense arrays (or Tensors) of the parameter's dtype and shape, ``IndexedSlices`` with indices in
range, SciPy CSR matrices that pass SciPy's own full format check.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from .. import gpu
from ..gpu import address, is_device_array
from .._core._lowp_state import is_bfloat16
from ..sparse import IndexedSlices
from ._clip import is_scipy_sparse

SPARSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def tensor_data(p: Any) -> Any:
    """``p.data`` when ``p`` is a tensor (not an array itself, with a ``.grad`` and a ``.data``
    that is a NumPy or device array), else None.  A SciPy sparse matrix, whose ``.data`` is an
    ndarray too, has no ``.grad``."""
    if isinstance(p, np.ndarray) or not hasattr(p, "grad"):
        return None
    d = getattr(p, "data", None)
    return d if isinstance(d, np.ndarray) or is_device_array(d) else None


def mark_dirty(params: List[Any], stepped: Any) -> None:
    """Tell the tensors among ``params[i]`` (i in ``stepped``) that their ``.data`` changed in
    place (autodiff's version counter: a recorded operation that saved one refuses to
    differentiate through the old values)."""
    for i in stepped:
        mark = getattr(params[i], "mark_dirty", None)
        if mark is not None and tensor_data(params[i]) is not None:
            mark()


def param_array(p: Any, name: str) -> np.ndarray:
    """The ndarray a parameter updates in place (a tensor's ``.data``), checked."""
    d = tensor_data(p)
    a = p if d is None else d
    if type(a) is not np.ndarray and is_device_array(a):  # CuPy: fastadam/gpu
        return gpu.check_parameter(a, name)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray or a fastadam.autodiff.Tensor, "
                        f"got {type(p).__name__}")
    if (a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4, 8)) and not is_bfloat16(a.dtype):
        raise TypeError(f"{name}: expected float16, float32 or float64, got {a.dtype} "
                        f"(or ml_dtypes.bfloat16 for low-precision steps)")
    if not a.dtype.isnative or not a.flags.aligned:
        raise ValueError(f"{name}: expected an aligned array in native byte order")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (np.ascontiguousarray makes "
                         f"one), got strides {a.strides}")
    if not a.flags.writeable:
        raise ValueError(f"{name}: is read-only, but it is updated in place")
    return a


def check_no_shared_memory(arrays: List[np.ndarray], labels: List[str]) -> None:
    """No two arrays overlap (one sort of the address ranges: O(n log n))."""
    spans = sorted((address(a), a.nbytes, i)
                   for i, a in enumerate(arrays) if a.nbytes)
    for (lo1, n1, i), (lo2, _, j) in zip(spans, spans[1:]):
        if lo2 < lo1 + n1:
            i, j = min(i, j), max(i, j)
            raise ValueError(f"{labels[i]} and {labels[j]} share memory (a parameter may "
                             f"appear only once in an optimizer)")


def gradient_of_tensor(p: Any) -> Any:
    """A Tensor parameter's ``.grad`` as an array or IndexedSlices (None if it has none)."""
    g = p.grad
    d = tensor_data(g)
    return g if d is None else d


def check_gradient(g: Any, x: np.ndarray, name: str, pname: str) -> Tuple[str, Any]:
    """Classify and check one gradient of parameter ``x``: returns (kind, gradient) with kind
    "dense" (a C-contiguous array; a non-contiguous one is copied, it is only read) or
    "sparse" (IndexedSlices or CSR)."""
    d = tensor_data(g)
    if d is not None:
        g = d
    if is_device_array(g) or (type(x) is not np.ndarray and is_device_array(x)):  # CuPy
        return "dense", gpu.check_gradient(g, x, name, pname)
    if isinstance(g, np.ndarray):
        if g.dtype != x.dtype and not (g.dtype == np.float32 and is_bfloat16(x.dtype)):
            also = " or float32" if is_bfloat16(x.dtype) else ""
            raise TypeError(f"{name}: expected dtype {x.dtype}{also} (the dtype of {pname}), "
                            f"got {g.dtype}")
        if g.shape != x.shape:
            raise ValueError(f"{name}: expected shape {x.shape} (the shape of {pname}), "
                             f"got {g.shape}")
        return "dense", np.ascontiguousarray(g)
    if isinstance(g, IndexedSlices) or is_scipy_sparse(g):
        if x.dtype not in SPARSE_DTYPES and not is_bfloat16(x.dtype):
            raise TypeError(f"{name}: sparse gradients need a float32 or float64 parameter, "
                            f"{pname} is {x.dtype} (or a bfloat16 one, with float32 values)")
        if isinstance(g, IndexedSlices):
            _check_indexed_slices(g, x, name, pname)
        else:
            _check_csr(g, x, name, pname)
        return "sparse", g
    raise TypeError(f"{name}: expected a numpy.ndarray, a fastadam.autodiff.Tensor, an "
                    f"IndexedSlices or a SciPy CSR matrix, got {type(g).__name__}")


def _check_indexed_slices(g: IndexedSlices, x: np.ndarray, name: str, pname: str) -> None:
    if tuple(g.dense_shape) != x.shape:
        raise ValueError(f"{name}: dense_shape {tuple(g.dense_shape)} does not match the shape "
                         f"{x.shape} of {pname}")
    want = np.dtype(np.float32) if is_bfloat16(x.dtype) else x.dtype  # bfloat16: float32 values
    if g.values.dtype != want:
        why = f"the dtype of {pname}" if want == x.dtype else f"{pname} is bfloat16"
        raise TypeError(f"{name}: expected values of dtype {want} ({why}), "
                        f"got {g.values.dtype}")
    if g.indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{name}: expected int32 or int64 indices, got {g.indices.dtype}")
    if g.indices.size:
        lo, hi = int(g.indices.min()), int(g.indices.max())
        if lo < 0 or hi >= x.shape[0]:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{name}: index {bad} is out of range for the {x.shape[0]} rows "
                             f"of {pname}")


def _check_csr(g: Any, x: np.ndarray, name: str, pname: str) -> None:
    import scipy.sparse

    if not scipy.sparse.issparse(g) or g.format != "csr":
        raise TypeError(f"{name}: expected a SciPy CSR matrix or array, got format "
                        f"{getattr(g, 'format', type(g).__name__)!r} (convert with .tocsr())")
    if tuple(g.shape) != x.shape:
        raise ValueError(f"{name}: CSR shape {tuple(g.shape)} does not match the shape "
                         f"{x.shape} of {pname}")
    want = np.dtype(np.float32) if is_bfloat16(x.dtype) else x.dtype  # bfloat16: float32 data
    if g.dtype != want:
        why = f"the dtype of {pname}" if want == x.dtype else f"{pname} is bfloat16"
        raise TypeError(f"{name}: expected data of dtype {want} ({why}), "
                        f"got {g.dtype}")
    try:
        g.check_format(full_check=True)
    except ValueError as exc:
        raise ValueError(f"{name}: invalid CSR matrix ({exc})") from None


def gather_gradients(grads: Any, params: List[Any], arrays: List[np.ndarray],
                     labels: List[str]) -> List[Optional[Tuple[str, Any]]]:
    """Every gradient of a step, checked: a list with one (kind, gradient) or None (no gradient:
    the parameter and its state are left alone this step) per parameter."""
    n = len(params)
    if grads is None:
        for i, p in enumerate(params):
            if tensor_data(p) is None:
                raise TypeError(f"grads: required when a parameter is a plain ndarray "
                                f"({labels[i]}); step() without grads reads the .grad of "
                                f"fastadam.autodiff.Tensor parameters")
        grads = [gradient_of_tensor(p) for p in params]
    elif (isinstance(grads, (np.ndarray, IndexedSlices)) or is_scipy_sparse(grads)
          or is_device_array(grads) or tensor_data(grads) is not None):
        if n != 1:
            raise TypeError(f"grads: expected a list of {n} gradients (one per parameter), "
                            f"got a single {type(grads).__name__}")
        grads = [grads]
    elif isinstance(grads, (list, tuple)):
        if len(grads) != n:
            raise ValueError(f"grads: expected {n} gradients (one per parameter), "
                             f"got {len(grads)}")
    else:
        raise TypeError(f"grads: expected a list of gradients, got {type(grads).__name__}")
    single = n == 1 and labels[0] == "params"
    out: List[Optional[Tuple[str, Any]]] = []
    for i, (g, x) in enumerate(zip(grads, arrays)):
        if (type(g) is np.ndarray and g.dtype == x.dtype and g.shape == x.shape
                and g.flags.c_contiguous):
            out.append(("dense", g))  # the common case, checked inline
        elif g is None:
            out.append(None)
        else:
            out.append(check_gradient(g, x, "grads" if single else f"grads[{i}]", labels[i]))
    return out
