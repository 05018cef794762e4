"""Parameters and gradients of the optimizer objects: checked once, before any array changes.

Design: a parameter is an ndarray or a ``fastadam.autodiff.Tensor`` (whose ``.data`` array is
updated in place).  Parameters are checked when they enter an optimizer (float dtype, writable,
C-contiguous, native and aligned, no two sharing memory).  Gradients are checked at every step,
all of them before the first compiled call, so a bad gradient never leaves a step half applied:
dense arrays (or Tensors) of the parameter's dtype and shape, ``IndexedSlices`` with indices in
range, SciPy CSR matrices that pass SciPy's own full format check.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ..gpu import is_device_array
from ..gpu._validation import address
from .._core._lowp_state import is_bfloat16
from ..sparse import IndexedSlices
from ._clip import is_scipy_sparse

SPARSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


_TENSOR = []


def tensor_type():
    """fastadam.autodiff.Tensor, imported on first use (autodiff imports the sparse package)."""
    if not _TENSOR:
        from ..autodiff import Tensor
        _TENSOR.append(Tensor)
    return _TENSOR[0]


def param_array(p: Any, name: str) -> np.ndarray:
    """The ndarray a parameter updates in place (a Tensor's ``.data``), checked."""
    a = p.data if isinstance(p, tensor_type()) else p
    if type(a) is not np.ndarray and is_device_array(a):  # CuPy: fastadam/gpu
        from ..gpu._validation import check_device_parameter
        return check_device_parameter(a, name)
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
    return g.data if isinstance(g, tensor_type()) else g


def check_gradient(g: Any, x: np.ndarray, name: str, pname: str) -> Tuple[str, Any]:
    """Classify and check one gradient of parameter ``x``: returns (kind, gradient) with kind
    "dense" (a C-contiguous array; a non-contiguous one is copied, it is only read) or
    "sparse" (IndexedSlices or CSR)."""
    if isinstance(g, tensor_type()):
        g = g.data
    if is_device_array(g) or (type(x) is not np.ndarray and is_device_array(x)):  # CuPy
        from ..gpu._validation import check_device_gradient
        return "dense", check_device_gradient(g, x, name, pname)
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
    Tensor = tensor_type()
    if grads is None:
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"grads: required when a parameter is a plain ndarray "
                                f"({labels[i]}); step() without grads reads the .grad of "
                                f"fastadam.autodiff.Tensor parameters")
        grads = [gradient_of_tensor(p) for p in params]
    elif (isinstance(grads, (np.ndarray, IndexedSlices, Tensor)) or is_scipy_sparse(grads)
          or is_device_array(grads)):
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
