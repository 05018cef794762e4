"""The row-wise optimizers' steps on CuPy arrays (row-wise Adagrad: one state value per row).

Their kernels (kernels.cu, fa_rowwise_*) give each row to one thread, which runs the header's row
function: the CPU's operations in the CPU's order, so the same bits.  The dense step is one
launch per tensor; the sparse step sums the segments first (fa_segment_sum, deterministic, as
the CPU) and then launches one thread per touched row (lazy, catch-up) or per table row (dense
mode, untouched rows with a row of +0).  The checks and their messages are the CPU path's
(fastadam/optim/_rowwise_adagrad.py, _sparse_functional.py); all run before the first write.
"""
import cupy
import numpy as np

from . import _kernels, _source
from ._sparse import _gradient_rows, check_indices, check_values, sort_segments
from ._validation import as_array_list, check_array, check_disjoint, label

_THREADS = 128
_MAX_GRID = 1 << 20  # the kernels loop over rows beyond this many blocks
_ROW_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _grid(n):
    return (min(-(-n // _THREADS), _MAX_GRID),)


def _kernel(dtype, kind, name):
    return _kernels.function("rowwise", dtype, kind, name)


def dense_step(coeffs, x, g, acc, skip_nonfinite):
    """One dense step on device arrays; returns False (nothing written) when
    ``skip_nonfinite`` finds a non-finite ``g / grad_scale``."""
    xs, single = as_array_list(cupy, x, "x")
    gs, single_g = as_array_list(cupy, g, "g")
    accs, single_a = as_array_list(cupy, acc, "acc")
    if not single == single_g == single_a:
        raise TypeError("x, g, acc: pass either one ndarray each or a list of ndarrays each")
    if len(gs) != len(xs):
        raise ValueError(f"g: expected a list of {len(xs)} arrays like x, got {len(gs)}")
    if len(accs) != len(xs):
        raise ValueError(f"acc: expected a list of {len(xs)} arrays (one value per row of "
                         f"each x), got {len(accs)}")
    if not xs:
        return True
    x0 = check_array(cupy, xs[0], label("x", 0, single))
    dtype, device = x0.dtype, x0.data.device_id
    if dtype not in _ROW_TYPES:
        raise TypeError(f"{label('x', 0, single)}: expected float32 or float64 (row-wise "
                        f"kernels), got {dtype}")
    for i, (xi, gi, ai) in enumerate(zip(xs, gs, accs)):
        check_array(cupy, xi, label("x", i, single), dtype, None, device)
        check_array(cupy, gi, label("g", i, single), dtype, xi.shape, device)
        check_array(cupy, ai, label("acc", i, single), dtype, xi.shape[:1], device)
    if dtype != np.float64:
        coeffs.check_float32()
    check_disjoint([("x", xs, True), ("g", gs, False), ("acc", accs, True)], single)
    flags = coeffs.flags
    if flags not in _source.ROWWISE_DENSE_FLAGS[coeffs.kind]:
        raise ValueError(f"the GPU row-wise step has no kernel for optimizer kind {coeffs.kind} "
                         f"with flags {flags}")
    with cupy.cuda.Device(device):
        if skip_nonfinite:
            scale = dtype.type(coeffs.grad_scale)
            for gi in gs:  # y - y is 0 for finite y, NaN for NaN and infinities
                y = gi / scale
                if not bool(((y - y) == 0).all()):
                    return False
        coeff_dev = _kernels.upload_coefficients(coeffs)
        step = _kernel(dtype, coeffs.kind,
                       _source.rowwise_dense_name(dtype.name, coeffs.kind, flags))
        for xi, gi, ai in zip(xs, gs, accs):
            n_rows = xi.shape[0] if xi.ndim else 1
            row_size = xi.size // n_rows if n_rows else 0
            if n_rows and row_size:
                step(_grid(n_rows), (_THREADS,), (coeff_dev, xi, gi, ai, np.int64(n_rows),
                                                  np.int64(row_size)))
    return True


def sparse_step(coeffs, x, grad, acc, t, mode, last_step):
    """One sparse step on device arrays (mode and t already checked by the caller)."""
    x = check_array(cupy, x, "x")
    device = x.data.device_id
    if x.ndim < 1:
        raise ValueError("x: expected at least one dimension (rows are the first axis), "
                         "got a 0-d array")
    if x.dtype not in _ROW_TYPES:
        raise TypeError(f"x: expected float32 or float64 (sparse kernels), got {x.dtype}")
    if x.dtype != np.float64:
        coeffs.check_float32()
    acc = check_array(cupy, acc, "acc", x.dtype, x.shape[:1], device)
    caller_indices, values = _gradient_rows(x, grad)
    n_rows, row_shape = x.shape[0], x.shape[1:]
    indices = check_indices(caller_indices, "indices", n_rows, device)
    values = check_values(values, "values", indices.shape[0], row_shape, x.dtype, device)
    if mode == "catchup":
        if last_step is None:
            raise ValueError("last_step: catchup mode needs last_step, an int64 array of "
                             f"shape {x.shape[:1]} updated in place (start it at zeros)")
        check_array(cupy, last_step, "last_step", np.dtype(np.int64), x.shape[:1], device,
                    floating=False)
    elif last_step is not None:
        raise ValueError(f"last_step: only used in catchup mode, got it with mode={mode!r}")
    groups = [("x", [x], True), ("acc", [acc], True), ("values", [values], False),
              ("indices", [caller_indices], False)]
    if mode == "catchup":
        groups.append(("last_step", [last_step], True))
    check_disjoint(groups, True)
    flags = coeffs.flags
    if flags not in _source.ROWWISE_SPARSE_FLAGS[coeffs.kind]:
        raise ValueError(f"the GPU row-wise sparse step has no kernel for optimizer kind "
                         f"{coeffs.kind} with flags {flags}")
    with cupy.cuda.Device(device):
        perm, rows, offsets = sort_segments(indices)
        nseg = rows.shape[0]
        if mode == "catchup" and nseg:
            seen = last_step[rows]
            lo, hi = (int(v) for v in cupy.stack([seen.min(), seen.max()]).get())
            if lo < 0 or hi >= t:
                raise ValueError(f"last_step: expected 0 <= last_step < t={t} for every touched "
                                 f"row, got {lo if lo < 0 else hi}")
        row_size = int(np.prod(row_shape, dtype=np.int64))
        if row_size == 0 or n_rows == 0 or (mode != "dense" and nseg == 0):
            if mode == "catchup" and nseg:
                last_step[rows] = t
            return None
        name = x.dtype.name
        sums = cupy.empty((max(nseg, 1), row_size), dtype=x.dtype)
        if nseg:
            segment = _kernels.function("segment", x.dtype, None, _source.segment_sum_name(name))
            segment((min(nseg, _MAX_GRID),), (min(256, max(32, -(-row_size // 32) * 32)),),
                    (values, np.int64(row_size), perm, offsets, np.int64(nseg), sums))
        coeff_dev = _kernels.upload_coefficients(coeffs)
        if mode == "dense":
            seg_of_row = cupy.full(n_rows, -1, dtype=np.int64)
            if nseg:
                seg_of_row[rows] = cupy.arange(nseg, dtype=np.int64)
            zeros = cupy.zeros(row_size, dtype=x.dtype)
            kernel = _kernel(x.dtype, coeffs.kind,
                             _source.rowwise_all_name(name, coeffs.kind, flags))
            kernel(_grid(n_rows), (_THREADS,), (coeff_dev, x, acc, np.int64(row_size),
                                                np.int64(n_rows), sums, zeros, seg_of_row))
            return None
        catchup = mode == "catchup"
        kernel = _kernel(x.dtype, coeffs.kind,
                         _source.rowwise_rows_name(name, coeffs.kind, flags, catchup))
        kernel(_grid(nseg), (_THREADS,), (coeff_dev, x, acc, np.int64(row_size), sums, rows,
                                          np.int64(nseg), last_step if catchup else rows,
                                          np.int64(t)))
    return None
