"""The sparse steps of every optimizer (``segment_sum`` is in fastadam/sparse/).

Python checks every input before anything is written (a step is all or nothing), folds the
hyper-parameters into the optimizer's coefficient object (fastadam/optim/_coefficients.py, the
same folding as the dense steps), then makes one compiled call to sort the indices and one to
update (fastadam/_core/_sparse.pyx), whose row walk applies the optimizer's own element formula.
Indices are copied once into a private buffer before they are range-checked: the kernels read
only that copy, so another thread changing the caller's array mid-call cannot make them read
out of bounds.
"""
import math
from typing import Any, Optional

import numpy as np

from .. import gpu as _gpu
from .._core import _dense, _sparse
from .._core._threads import resolve_num_threads
from .._core._validation import check_array, check_disjoint, check_indices, check_rows
from ..sparse import IndexedSlices
from .._core._sparse_host import check_csr_structure, run_threaded
from ._coefficients import (adagrad_coefficients, adam_coefficients,
                            momentum_coefficients, step_number)
from ._functional import check_compute_dtype

MODES = ("lazy", "dense", "catchup")
# kind -> True for a row-wise optimizer (one state value per row: include/fastadam/optimizers.def)
_ROWWISE = {row["kind"]: row["rowwise"] for row in _dense.registry()}
_VALUE_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
_KERNEL_INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))  # native byte order


# Kinds of work for the measured thread choice: each keeps its own size classes, since a
# segment sum, a lazy row update and a dense-mode table update cost differently per element.
KIND_SPARSE_STEP = {"lazy": 2, "dense": 3, "catchup": 4}  # KIND_SEGMENT_SUM = 1


def _is_scipy_sparse(grad):
    module = type(grad).__module__ or ""
    return module.startswith("scipy.sparse")


def _gradient_rows(x, grad):
    """(indices, values, n_rows, row_size, element_wise) of a validated gradient for x."""
    if isinstance(grad, IndexedSlices):
        if tuple(grad.dense_shape) != x.shape:
            raise ValueError(f"grad: dense_shape {tuple(grad.dense_shape)} does not match "
                             f"x.shape {x.shape}")
        return grad.indices, grad.values, False
    if isinstance(grad, (tuple, list)) and len(grad) == 2:
        return grad[0], grad[1], False
    if _is_scipy_sparse(grad):
        return _csr_rows(x, grad) + (True,)
    raise TypeError(f"grad: expected an IndexedSlices, an (indices, values) pair or a SciPy "
                    f"CSR matrix, got {type(grad).__name__}")


def _csr_rows(x, grad):
    """Flat element indices (row * ncols + col) and values of a CSR gradient of x."""
    import scipy.sparse

    if not scipy.sparse.issparse(grad) or grad.format != "csr":
        fmt = getattr(grad, "format", type(grad).__name__)
        raise TypeError(f"grad: expected a SciPy CSR matrix or array, got format {fmt!r} "
                        f"(convert with .tocsr())")
    if x.ndim != 2:
        raise ValueError(f"grad: a CSR gradient needs a 2-D x, got x.shape {x.shape}")
    if tuple(grad.shape) != x.shape:
        raise ValueError(f"grad: CSR shape {tuple(grad.shape)} does not match x.shape "
                         f"{x.shape}")
    n_rows, n_cols = x.shape
    indptr, cols, data = check_csr_structure(grad, "grad")  # private, checked copies
    if data.dtype != x.dtype:
        raise TypeError(f"grad.data: expected dtype {x.dtype} (the dtype of x), "
                        f"got {data.dtype}")
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr).astype(np.int64))
    flat = row_of * np.int64(n_cols) + cols.astype(np.int64, copy=False)
    return flat, data


def sparse_step_inplace(x: np.ndarray, grad: Any, m: np.ndarray, v: np.ndarray, t: int, *,
                        mode: str = "lazy", last_step: Optional[np.ndarray] = None,
                        lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                        eps: float = 1e-8, convention: str = "tf", weight_decay: float = 0.0,
                        decoupled_weight_decay: bool = False, maximize: bool = False,
                        indices_sorted_unique: bool = False,
                        num_threads: Optional[int] = None) -> None:
    """One Adam step with a sparse gradient, in place.

    Duplicate indices are first summed (see :func:`segment_sum`: stable sort, original order,
    bit-identical for any thread count).  Then, for each row ``r`` that is updated, with ``g``
    its summed gradient (0 for untouched rows in dense mode), per element::

        g' = (-1 if maximize else 1) * g
        g' = g' + weight_decay * x                  # unless decoupled_weight_decay
        x  = (1 - lr * weight_decay) * x            # if decoupled_weight_decay (AdamW)
        m  = beta1 * m + (1 - beta1) * g'
        v  = beta2 * v + (1 - beta2) * g'**2
        x  = x - alpha * m / (sqrt(v) * s + eps)

    with ``alpha`` and ``s`` from ``convention`` exactly as in :func:`fastadam.step_inplace`
    (``"tf"``: ``alpha = lr * sqrt(1 - beta2**t) / (1 - beta1**t)``, ``s = 1``; ``"torch"``:
    ``alpha = lr / (1 - beta1**t)``, ``s = 1 / sqrt(1 - beta2**t)``; ``"onnx"``: as ``"tf"``,
    and no bias correction for ``t <= 0``).  PyTorch's ``SparseAdam`` uses the ``"tf"`` form
    (epsilon added after the bias correction), so ``convention="tf"`` reproduces it.

    Modes (which rows change):

    - ``"lazy"``: only the touched rows' ``x``, ``m``, ``v`` change (PyTorch ``SparseAdam``,
      TF-Addons ``LazyAdam``).  Cost proportional to the gradient.
    - ``"dense"``: TensorFlow 1's ``Adam._apply_sparse_shared``: every row's ``m`` and ``v``
      decay and every row of ``x`` moves.  Bit-identical to ``fastadam.step_inplace`` on the
      densified gradient (``IndexedSlices.to_dense``); costs a pass over the whole table.
    - ``"catchup"``: lazy, plus ``last_step`` (int64, one entry per row of ``x``, or per element
      of ``x`` for a CSR gradient; updated in place; 0 = "never touched"): a row last touched at
      step ``s`` and touched again at step ``t`` first applies the ``k = t - 1 - s`` decays it
      missed, ``m *= beta1**k`` and ``v *= beta2**k``, then the step above, then
      ``last_step[r] = t``.  Gaps of up to 64 idle steps are replayed one multiplication at a
      time, rounded as dense mode rounds them, so without weight decay ``m`` and ``v`` are bit
      for bit those of dense mode (up to the sign of a zero); a longer gap is one
      multiplication by ``beta**k`` (a float64 power rounded once: bounded cost per row), which
      agrees with dense mode's ``k`` roundings to a few ulps.  It does **not**
      reproduce the idle steps' movement of ``x`` (dense mode keeps moving an idle row with its
      decaying momentum; catchup leaves it in place) nor, with weight decay, the idle rows'
      decay.  Needs ``t >= 1`` and ``0 <= last_step[r] < t`` for every touched row.

    Weight decay rule: in ``"lazy"`` and ``"catchup"`` modes only the touched rows decay (coupled
    decay is added to their summed gradient, decoupled decay scales their ``x``); in ``"dense"``
    mode every row decays, as in the dense step.  Untouched rows never decay lazily.

    Parameters
    ----------
    x, m, v : ndarray
        Parameters and moments: C-contiguous, writable, float32 or float64, one shape (rank >= 1;
        rows are the first axis; 2-D for a CSR gradient), not overlapping each other nor the
        gradient.  Updated in place.  With an IndexedSlices or (indices, values) gradient, an
        array of rank >= 2 may also be row-strided: C-contiguous rows, at least a row apart, as
        a block of columns of a wider table (``buf[:, 0:4]``, ``buf[:, 4:8]``, ... keep a
        row's parameters and moments side by side); blocks of one buffer may interleave but
        not overlap.  The same holds for the Adagrad and momentum sparse steps.
    grad : IndexedSlices, (indices, values) pair, or SciPy CSR matrix/array
        ``indices``: 1-D int32 or int64, unsorted, duplicates allowed, each in
        ``[0, x.shape[0])``; **negative indices are rejected** (IndexError: there is no
        wrap-around, as in TensorFlow and ``torch.sparse``).  ``values``: ``x``'s dtype, shape
        ``(len(indices),) + x.shape[1:]``.  A CSR gradient (``scipy.sparse.csr_matrix`` or
        ``csr_array`` of ``x.shape``, duplicates and unsorted column indices allowed) is
        element-sparse: each stored entry touches one element of ``x``, so in the lazy modes only
        those elements change.  Only read (non-contiguous inputs are copied).
    t : int
        Step number of this update (1 for the first step).
    mode : {"lazy", "dense", "catchup"}
    last_step : ndarray of int64, required in catchup mode only
        Shape ``x.shape[:1]`` (``x.shape`` for a CSR gradient); updated in place.
    indices_sorted_unique : bool, default False
        The caller's promise that the gradient's indices (for a CSR gradient: its entries'
        flat positions ``row * ncols + col``) are strictly increasing, as
        :func:`csr_transpose_dot` and :func:`segment_sum` return them.  Then no sort and no
        segment sum run: each row's gradient is used as given, which is bit for bit what the
        default path computes for such indices.  The promise is checked (O(k), one pass:
        ValueError naming the first position where an index does not increase); on a GPU array
        it is checked by nothing and changes nothing (the GPU path always sorts).
    num_threads : int, optional
        OpenMP threads (None: as many as OpenMP allows; negative counts back from that).
        The result is bit-identical for any thread count.

    NaN policy: as in the dense step (default ``skip_nonfinite=False``): NaN and infinities in
    the gradient propagate (IEEE) into the rows they touch, and no exception is raised.

    All checks run before any array is written: if one fails (TypeError, ValueError,
    IndexError naming the argument), ``x``, ``m``, ``v`` and ``last_step`` are unchanged.
    """
    coeffs = adam_coefficients(t, lr, beta1, beta2, eps, convention, weight_decay,
                               decoupled_weight_decay, maximize=maximize)
    return sparse_step(coeffs, x, grad, [("m", m), ("v", v)], t, mode, last_step, num_threads,
                       indices_sorted_unique)


def sparse_adagrad_step_inplace(x: np.ndarray, grad: Any, h: np.ndarray, t: int, *,
                                mode: str = "lazy", last_step: Optional[np.ndarray] = None,
                                lr: float = 1e-2, lr_decay: float = 0.0,
                                eps: Optional[float] = None, weight_decay: float = 0.0,
                                maximize: bool = False, convention: str = "torch",
                                indices_sorted_unique: bool = False,
                                num_threads: Optional[int] = None) -> None:
    """One Adagrad step with a sparse gradient, in place.

    The update of a row is :func:`fastadam.adagrad_step_inplace`'s formula and conventions, with
    ``g`` the row's summed gradient (duplicates summed as in :func:`segment_sum`).  Modes,
    gradient forms, weight-decay rule and checks are those of :func:`sparse_step_inplace`.
    Adagrad's accumulator does not decay, so ``"catchup"`` changes nothing beyond ``"lazy"``
    (it still maintains ``last_step``), and ``"dense"`` differs from ``"lazy"`` only through
    weight decay of the untouched rows.
    """
    coeffs = adagrad_coefficients(t, lr=lr, lr_decay=lr_decay, eps=eps,
                                  weight_decay=weight_decay, maximize=maximize,
                                  convention=convention)
    return sparse_step(coeffs, x, grad, [("h", h)], t, mode, last_step, num_threads,
                       indices_sorted_unique)


def sparse_momentum_step_inplace(x: np.ndarray, grad: Any, v: np.ndarray, t: int, *,
                                 mode: str = "lazy", last_step: Optional[np.ndarray] = None,
                                 lr: float = 1e-2, momentum: float = 0.9, dampening: float = 0.0,
                                 nesterov: bool = False, weight_decay: float = 0.0,
                                 maximize: bool = False, convention: str = "torch",
                                 indices_sorted_unique: bool = False,
                                 num_threads: Optional[int] = None) -> None:
    """One SGD-with-momentum step with a sparse gradient, in place.

    The update of a row is :func:`fastadam.momentum_step_inplace`'s formula and conventions,
    with ``g`` the row's summed gradient.  Modes, gradient forms, ``indices_sorted_unique``,
    weight-decay rule and checks are those of :func:`sparse_step_inplace`: ``"dense"`` keeps every row moving with its
    decaying buffer (as the dense step on the densified gradient, bit for bit), ``"lazy"`` only
    touched rows, and ``"catchup"`` first decays a returning row's buffer by ``momentum`` once
    per missed step (the idle steps' movement of ``x`` is not replayed).  A row touched for the
    first time after step 1 starts from a zero buffer (``v = (1 - dampening) * g'``).
    """
    coeffs = momentum_coefficients(t, lr=lr, momentum=momentum, dampening=dampening,
                                   nesterov=nesterov, weight_decay=weight_decay,
                                   maximize=maximize, convention=convention)
    return sparse_step(coeffs, x, grad, [("v", v)], t, mode, last_step, num_threads,
                       indices_sorted_unique)


def sparse_step(coeffs, x, grad, slots, t, mode, last_step, num_threads,
                indices_sorted_unique=False):
    """Validate and run one sparse step of the optimizer ``coeffs`` describes; ``slots`` are
    its state arguments as (name, array) pairs in slot order."""
    if not isinstance(indices_sorted_unique, (bool, np.bool_)):
        raise TypeError(f"indices_sorted_unique: expected a bool, got "
                        f"{type(indices_sorted_unique).__name__}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    t = step_number(t)
    if mode == "catchup" and t < 1:
        raise ValueError(f"t: catchup mode counts steps from 1, got t={t}")
    if _gpu.is_device_array(x):  # CuPy: fastadam/gpu
        if _ROWWISE.get(coeffs.kind, False):
            return _gpu.rowwise_sparse_step(coeffs, x, grad, slots[0][1], t, mode, last_step)
        return _gpu.sparse_step(coeffs, x, grad, slots, t, mode, last_step)
    try:
        return _cpu_sparse_step(coeffs, x, grad, slots, t, mode, last_step, num_threads,
                                bool(indices_sorted_unique))
    except TypeError:
        grad_parts = [grad.indices, grad.values] if isinstance(grad, IndexedSlices) else grad
        _gpu.explain_mix(slots + [("grad", grad_parts), ("last_step", last_step)])
        raise


def _cpu_sparse_step(coeffs, x, grad, slots, t, mode, last_step, num_threads,
                     indices_sorted_unique):
    nt = 0 if num_threads is None else resolve_num_threads(num_threads)  # 0: measured choice

    x = _check_table(x, "x", -1, None)
    if x.ndim < 1:
        raise ValueError("x: expected at least one dimension (rows are the first axis), "
                         "got a 0-d array")
    if x.dtype not in _VALUE_TYPES:
        raise TypeError(f"x: expected float32 or float64 (sparse kernels), got {x.dtype}")
    typenum = x.dtype.num
    check_compute_dtype(coeffs, typenum)
    # a row-wise optimizer's slot: one value per row (x.shape[:1]), contiguous
    row_wise = _ROWWISE.get(coeffs.kind, False)
    slot_arrays = [check_array(a, name, typenum, x.shape[:1], True) if row_wise
                   else _check_table(a, name, typenum, x.shape) for name, a in slots]
    strided = not all(a.flags.c_contiguous for a in [x] + slot_arrays)

    indices, values, element_wise = _gradient_rows(x, grad)
    if element_wise and row_wise:
        raise TypeError("grad: a CSR gradient is element-wise; a row-wise optimizer needs "
                        "whole rows: pass an IndexedSlices or an (indices, values) pair")
    if element_wise and strided:
        raise ValueError("grad: a CSR gradient (element-wise indices) needs C-contiguous x and "
                         "state arrays, got row-strided ones")
    caller_indices = indices  # checked for overlap below; the kernels read a private copy
    if element_wise:
        n_rows, row_shape, rows_shape = x.size, (), x.shape
        if indices_sorted_unique:
            indices = _check_sorted_unique(indices, "grad", n_rows)
    else:
        n_rows, row_shape, rows_shape = x.shape[0], x.shape[1:], x.shape[:1]
        if indices_sorted_unique:
            indices = _check_sorted_unique(indices, "indices", n_rows)
        else:
            indices = check_indices(indices, "indices", n_rows)
        values = check_rows(values, "values", indices.shape[0], row_shape, x.dtype)

    if mode == "catchup":
        if last_step is None:
            raise ValueError("last_step: catchup mode needs last_step, an int64 array of "
                             f"shape {rows_shape} updated in place (start it at zeros)")
        check_array(last_step, "last_step", np.dtype(np.int64).num, rows_shape, True,
                    floating=False)
    elif last_step is not None:
        raise ValueError(f"last_step: only used in catchup mode, got it with mode={mode!r}")

    groups = [("x", [x], True)] + [(name, [a], True) for (name, _), a in zip(slots, slot_arrays)]
    groups += [("values", [values], False)]
    if isinstance(caller_indices, np.ndarray):
        groups.append(("indices", [caller_indices], False))
    if mode == "catchup":
        groups.append(("last_step", [last_step], True))
    if strided:
        _check_disjoint_strided(groups)
    else:
        check_disjoint(groups, True)

    if indices_sorted_unique:  # one segment per index, in the given order
        perm, rows, offsets = _identity(indices.shape[0]), indices, _identity(indices.shape[0] + 1)
    else:
        perm, rows, offsets = _sparse.sort_segments(indices, n_rows)
    if mode == "catchup" and rows.size:
        seen = last_step.reshape(-1)[rows]
        if seen.min() < 0 or seen.max() >= t:
            bad = int(seen[(seen < 0) | (seen >= t)][0])
            raise ValueError(f"last_step: expected 0 <= last_step < t={t} for every touched "
                             f"row, got {bad}")

    row_size = math.prod(row_shape)  # Python ints: no overflow, no NumPy call
    if mode == "catchup" and row_size == 0:
        # zero-width rows: no element to update, but the touched rows were seen at step t
        # (the compiled step has nothing to walk and returns at once)
        last_step.reshape(-1)[rows] = t
        return
    slot_width = 1 if row_wise else row_size
    values = values.reshape(values.shape[0], row_size)
    args = (coeffs, x.reshape(n_rows, row_size), [a.reshape(n_rows, slot_width) for a in slot_arrays],
            values, perm, rows, offsets, mode,
            last_step.reshape(-1) if mode == "catchup" else None, t)
    work = (n_rows if mode == "dense" else values.shape[0]) * row_size
    run_threaded(_sparse.sparse_step, args, work, nt, KIND_SPARSE_STEP[mode])


def _check_table(a, name, typenum, shape):
    """x or a state array of a sparse step: written in place, C-contiguous, or (at least 2-D)
    with C-contiguous rows whose stride along the first axis may exceed the row (a block of
    columns of a wider table, e.g. x, m and v interleaved in one buffer)."""
    if not isinstance(a, np.ndarray) or a.ndim < 2 or a.flags.c_contiguous:
        return check_array(a, name, typenum, shape, True)
    check_array(a, name, typenum, shape, True, contiguous=False)
    row_bytes = a.itemsize * math.prod(a.shape[1:])
    stride = a.strides[0]
    if not a[:1].flags.c_contiguous or (a.shape[0] > 1 and (
            stride < row_bytes or stride % a.itemsize)):
        raise ValueError(f"{name}: expected a C-contiguous array, or one whose rows are "
                         f"C-contiguous and at least a row apart (a row stride larger than the "
                         f"row is fine), got shape {a.shape} and strides {a.strides}")
    return a


def _table_extent(a):
    """(first byte, end byte, row stride, row bytes) of an array; one 'row' when contiguous."""
    lo = a.__array_interface__["data"][0]
    if a.flags.c_contiguous or a.ndim < 2 or a.shape[0] < 2:
        return lo, lo + a.nbytes, 0, a.nbytes
    row_bytes = a.nbytes // a.shape[0]
    return lo, lo + (a.shape[0] - 1) * a.strides[0] + row_bytes, a.strides[0], row_bytes


def _check_disjoint_strided(groups):
    """check_disjoint for a step with row-strided tables: two arrays may share memory only if
    neither is written.  Arrays whose byte ranges interleave are disjoint when they have one
    row stride S and their rows occupy disjoint offsets modulo S (x, m, v as column blocks of
    one buffer); any other interleaving counts as an overlap."""
    items = [(name, a, written) for name, arrays, written in groups for a in arrays
             if a.nbytes]
    extents = [_table_extent(a) for _, a, _ in items]
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if not (items[i][2] or items[j][2]):
                continue
            (lo_a, hi_a, sa, wa), (lo_b, hi_b, sb, wb) = extents[i], extents[j]
            if hi_a <= lo_b or hi_b <= lo_a:
                continue
            if sa and sa == sb:
                d = (lo_b - lo_a) % sa
                if wa <= d and d + wb <= sa:
                    continue
            raise ValueError(f"{items[i][0]} and {items[j][0]} share memory; arrays that are "
                             f"updated in place must not overlap each other or the gradient")


def _check_sorted_unique(indices, name, n_rows):
    """A private int64 copy of indices promised strictly increasing, checked to be so and to
    lie in [0, n_rows) (first and last entries, once the order holds)."""
    if not isinstance(indices, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of int32 or int64, "
                        f"got {type(indices).__name__}")
    if indices.dtype.kind not in "iu" or indices.dtype.itemsize not in (4, 8):
        raise TypeError(f"{name}: expected int32 or int64 indices, got {indices.dtype}")
    if indices.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {indices.shape}")
    if indices.dtype in _KERNEL_INDEX_TYPES and indices.flags.c_contiguous:
        idx, at = _sparse.copy_increasing(indices)  # one pass: copy and order check
    else:
        idx = np.array(indices, dtype=np.int64, order="C", copy=True)
        steps = idx[1:] > idx[:-1]
        at = int(np.argmin(steps)) + 1 if idx.size > 1 and not steps.all() else -1
    if at >= 0:
        raise ValueError(f"{name}: indices_sorted_unique=True needs strictly increasing "
                         f"indices, but position {at} holds {int(idx[at])} after "
                         f"{int(idx[at - 1])}")
    if idx.size:
        if idx[0] < 0:
            raise IndexError(f"{name}: negative index {int(idx[0])}; negative indices are not "
                             f"allowed (no wrap-around, as in TensorFlow and torch.sparse)")
        if idx[-1] >= n_rows:
            raise IndexError(f"{name}: index {int(idx[-1])} is out of range for {n_rows} rows")
    return idx


_iota = np.arange(4096, dtype=np.int64)
_iota.flags.writeable = False


def _identity(n):
    """0, 1, ..., n-1 (int64; a read-only view of a shared buffer grown on demand)."""
    global _iota
    buf = _iota
    if buf.shape[0] < n:
        buf = np.arange(max(n, 2 * buf.shape[0]), dtype=np.int64)
        buf.flags.writeable = False
        _iota = buf
    return buf[:n]
