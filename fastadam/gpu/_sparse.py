"""The sparse steps and ``segment_sum`` on CuPy arrays.

The indices are copied once (int64, private), range-checked, ordered by CuPy's stable argsort,
and cut into segments of equal index; one kernel then sums each segment's rows in their
original order (so the sums are deterministic and equal to the CPU's) and applies the
optimizer's formula to the row: lazy and catch-up modes launch one block per touched row, dense
mode one block per row of the table (g = +0 for untouched rows).  The checks and their messages
are those of fastadam/optim/_sparse_functional.py; everything is checked before the first write.
"""
import cupy
import numpy as np

from . import _kernels, _layout, _lowp, _source
from ..drivers import INDEX_TYPES, ROW_TYPES, check_rows
from ._validation import check_array, check_disjoint, check_device_array, import_cupy

_MAX_GRID = 1 << 20  # the kernels loop over rows/segments beyond this many blocks


def check_indices(indices, name, n_rows, device):
    """A private int64 copy of 1-D int32/int64 device indices, checked to lie in [0, n_rows)."""
    check_device_array(cupy, indices, name, device)  # a NumPy array: the mix error
    if indices.dtype not in INDEX_TYPES:
        raise TypeError(f"{name}: expected int32 or int64 indices, got {indices.dtype}")
    if indices.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {indices.shape}")
    private = indices.astype(np.int64, copy=True)
    if private.size:
        lo, hi = (int(v) for v in cupy.stack([private.min(), private.max()]).get())
        if lo < 0:
            raise IndexError(f"{name}: negative index {lo}; negative indices are not allowed "
                             f"(no wrap-around, as in TensorFlow and torch.sparse)")
        if n_rows is not None and hi >= n_rows:
            raise IndexError(f"{name}: index {hi} is out of range for {n_rows} rows")
    return private


def check_values(values, name, k, row_shape, dtype, device):
    check_device_array(cupy, values, name, device)
    return check_rows(values, name, k, row_shape, dtype, cupy)  # the CPU path's rules


def sort_segments(indices):
    return _layout.sort_segments(cupy, indices)


def _threads(row_size):
    return int(min(256, max(32, -(-row_size // 32) * 32)))


def segment_sum(indices, values):
    """fastadam.segment_sum on device arrays: (unique indices, sums), deterministic."""
    import_cupy("indices")
    device = check_device_array(cupy, values, "values", None)
    private = check_indices(indices, "indices", None, device)
    if values.ndim < 1:
        raise ValueError("values: expected at least one dimension (one row per index), got a "
                         "0-d array")
    values = check_values(values, "values", private.shape[0], values.shape[1:], None, device)
    with cupy.cuda.Device(device):
        perm, rows, offsets = sort_segments(private)
        row_shape = values.shape[1:]
        row_size = int(np.prod(row_shape, dtype=np.int64))
        nseg = rows.shape[0]
        sums = cupy.empty((nseg, row_size), dtype=values.dtype)
        if nseg and row_size:
            kernel = _kernels.function("segment", values.dtype, None,
                                       _source.segment_sum_name(values.dtype.name))
            kernel((min(nseg, _MAX_GRID),), (_threads(row_size),),
                   (values, np.int64(row_size), perm, offsets, np.int64(nseg), sums))
        return rows.astype(indices.dtype), sums.reshape((nseg,) + row_shape)


def _gradient_rows(x, grad):
    # an IndexedSlices (read by its fields: fastadam.sparse imports this backend, not the
    # other way round)
    if all(hasattr(grad, f) for f in ("indices", "values", "dense_shape")):
        if tuple(grad.dense_shape) != x.shape:
            raise ValueError(f"grad: dense_shape {tuple(grad.dense_shape)} does not match "
                             f"x.shape {x.shape}")
        return grad.indices, grad.values
    if isinstance(grad, (tuple, list)) and len(grad) == 2:
        return grad[0], grad[1]
    module = type(grad).__module__ or ""
    if module.startswith("cupyx.scipy.sparse") or module.startswith("scipy.sparse"):
        raise TypeError("grad: a sparse matrix gradient is not supported on the GPU yet; pass "
                        "(indices, values) or an IndexedSlices of cupy arrays")
    raise TypeError(f"grad: expected an IndexedSlices, an (indices, values) pair or a SciPy "
                    f"CSR matrix, got {type(grad).__name__}")


def sparse_step(coeffs, x, grad, slots, t, mode, last_step):
    """One sparse step on the GPU (mode and t already checked by the caller); bfloat16
    (uint16) or 8-bit arrays go to the low-precision lazy rows step (_lowp.py)."""
    import_cupy("x")
    if _lowp.is_lowp_call(x, None, slots):
        return lowp_sparse_step(coeffs, x, grad, slots, t, mode, last_step)
    x = check_array(cupy, x, "x")
    device = x.device.id
    if x.ndim < 1:
        raise ValueError("x: expected at least one dimension (rows are the first axis), "
                         "got a 0-d array")
    if x.dtype not in ROW_TYPES:
        raise TypeError(f"x: expected float32 or float64 (sparse kernels), got {x.dtype}")
    if x.dtype != np.float64:
        coeffs.check_float32()
    slot_arrays = [check_array(cupy, a, name, x.dtype, x.shape, device) for name, a in slots]
    caller_indices, values = _gradient_rows(x, grad)
    n_rows, row_shape = x.shape[0], x.shape[1:]
    indices = check_indices(caller_indices, "indices", n_rows, device)
    values = check_values(values, "values", indices.shape[0], row_shape, x.dtype, device)
    rows_shape = x.shape[:1]
    if mode == "catchup":
        if last_step is None:
            raise ValueError("last_step: catchup mode needs last_step, an int64 array of "
                             f"shape {rows_shape} updated in place (start it at zeros)")
        check_array(cupy, last_step, "last_step", np.dtype(np.int64), rows_shape, device,
                    floating=False)
    elif last_step is not None:
        raise ValueError(f"last_step: only used in catchup mode, got it with mode={mode!r}")
    groups = [("x", [x], True)] + [(name, [a], True) for (name, _), a in zip(slots, slot_arrays)]
    groups += [("values", [values], False), ("indices", [caller_indices], False)]
    if mode == "catchup":
        groups.append(("last_step", [last_step], True))
    check_disjoint(groups, True)

    with cupy.cuda.Device(device):
        perm, rows, offsets = sort_segments(indices)
        nseg = rows.shape[0]
        if mode == "catchup" and nseg:
            seen = last_step[rows]
            lo, hi = (int(v) for v in cupy.stack([seen.min(), seen.max()]).get())
            if lo < 0 or hi >= t:
                bad = lo if lo < 0 else hi
                raise ValueError(f"last_step: expected 0 <= last_step < t={t} for every touched "
                                 f"row, got {bad}")
        row_size = int(np.prod(row_shape, dtype=np.int64))
        if row_size == 0 or (mode != "dense" and nseg == 0) or n_rows == 0:
            if mode == "catchup" and nseg:
                last_step[rows] = t
            return None
        coeff_dev = _kernels.upload_coefficients(coeffs)
        flags = coeffs.flags
        if flags not in _source.SPARSE_FLAGS[coeffs.kind]:
            raise ValueError(f"the GPU sparse step has no kernel for optimizer kind "
                             f"{coeffs.kind} with flags {flags}")
        st0 = slot_arrays[0]
        st1 = slot_arrays[1] if len(slot_arrays) > 1 else st0  # never touched when unused
        name = x.dtype.name
        if mode == "dense":
            seg_of_row = cupy.full(n_rows, -1, dtype=np.int64)
            if nseg:
                seg_of_row[rows] = cupy.arange(nseg, dtype=np.int64)
            kernel = _kernels.function("sparse", x.dtype, coeffs.kind,
                                       _source.sparse_dense_name(name, coeffs.kind, flags))
            kernel((min(n_rows, _MAX_GRID),), (_threads(row_size),),
                   (coeff_dev, x, st0, st1, np.int64(row_size), np.int64(n_rows), values, perm,
                    offsets, seg_of_row))
            return None
        catchup = mode == "catchup"
        kernel = _kernels.function("sparse", x.dtype, coeffs.kind,
                                   _source.sparse_rows_name(name, coeffs.kind, flags, catchup))
        kernel((min(nseg, _MAX_GRID),), (_threads(row_size),),
               (coeff_dev, x, st0, st1, np.int64(row_size), values, perm, offsets, rows,
                np.int64(nseg), last_step if catchup else perm, np.int64(t)))
        return None


def lowp_sparse_step(coeffs, x, grad, slots, t, mode, last_step):
    """sparse_step when _lowp.is_lowp_call (bfloat16 or 8-bit arrays): lazy mode only;
    duplicate indices are summed (deterministically, as segment_sum), then
    _lowp.lowp_rows_step on the table seen as (rows, row size)."""
    if mode != "lazy":
        raise ValueError(f"mode: low-precision sparse steps are lazy only, got {mode!r}")
    if last_step is not None:
        raise ValueError("last_step: only used in catchup mode")
    param_fmt = _lowp._array_format(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x: a low-precision sparse step updates rows of a table of 2 or more "
                         f"dimensions, got shape {x.shape}")
    n_rows = x.shape[0]
    row_size = x.size // n_rows if n_rows else 0
    state_fmt, codes, scales, block, qmap, signed = _lowp._slot_formats(
        [(n, [a]) for n, a in slots], lambda base, i: base)
    caller_indices, values = _gradient_rows(x, grad)
    indices = check_indices(caller_indices, "indices", n_rows, x.device.id)
    values = check_values(values, "values", indices.shape[0], x.shape[1:],
                          np.dtype(np.float32), x.device.id)
    # the arrays as (rows, row size) views: checked C-contiguous first (a reshaped copy
    # would take the update instead of them)
    _lowp._check_typed(x, "x", param_fmt, None, None)
    for (n, _), (a,) in zip(slots, codes):
        label = n if state_fmt != _lowp.Q8 else f"{n}.codes"
        _lowp._check_typed(a, label, state_fmt, x.shape, x.device.id)
    tables = [a.reshape(n_rows, row_size) for (a,) in codes]
    with cupy.cuda.Device(x.device.id):
        rows, sums = segment_sum(indices, values)
        _lowp.lowp_rows_step(coeffs, x.reshape(n_rows, row_size), rows,
                             sums.reshape(rows.shape[0], row_size), tables,
                             [lst[0] for lst in scales], None, param_fmt, state_fmt, block,
                             qmap, signed, 0, 0, t)
    return None
