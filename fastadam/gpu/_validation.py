"""Checks of CuPy arrays, with the messages of fastadam/_core/_validation.pyx (``numpy.ndarray``
becomes ``cupy.ndarray``), plus the GPU's own: one device per call, no NumPy/CuPy mix, CuPy
installed.  Everything runs before any kernel is launched."""
import sys

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def is_device_array(obj):
    """True for a ``cupy.ndarray``, or for another CUDA array (``__cuda_array_interface__``) so
    that it gets the GPU path's clear error instead of a NumPy conversion."""
    if type(obj) is np.ndarray:  # the CPU path's common case, first
        return False
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return True
    return type(obj).__module__.split(".")[0] == "cupy" or hasattr(obj, "__cuda_array_interface__")


def import_cupy(name):
    """CuPy, or a TypeError naming the argument that looked like a device array."""
    try:
        import cupy
    except ImportError:
        raise TypeError(f"{name}: a CUDA array was passed but CuPy is not installed "
                        f"(pip install cupy-cuda13x or cupy-cuda12x), so fastadam cannot update it") from None
    return cupy


def label(name, i, single):
    return name if single else f"{name}[{i}]"


def check_device_array(cupy, a, name, device):
    """``a`` is a cupy.ndarray on ``device`` (an int; None: any).  Returns its device id."""
    if not isinstance(a, cupy.ndarray):
        if isinstance(a, np.ndarray):
            raise TypeError(f"{name}: a numpy.ndarray in a call on cupy.ndarray arrays; NumPy "
                            f"and CuPy arrays cannot be mixed in one call (cupy.asarray copies "
                            f"it to the GPU)")
        raise TypeError(f"{name}: expected a cupy.ndarray, got {type(a).__name__}")
    dev = a.data.device_id
    if device is not None and dev != device:
        raise ValueError(f"{name}: on GPU {dev}, but x is on GPU {device}; every array of a "
                         f"call must be on one device")
    return dev


def check_array(cupy, a, name, dtype=None, shape=None, device=None, contiguous=True,
                floating=True):
    """One CuPy array: type, device, float dtype, dtype, shape, C-contiguity (CuPy arrays have
    no read-only flag).  Returns the array."""
    check_device_array(cupy, a, name, device)
    if floating and a.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float16, float32 or float64, got {a.dtype}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {a.dtype}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    if contiguous and not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (cupy.ascontiguousarray makes "
                         f"one), got strides {a.strides}")
    return a


def as_array_list(cupy, obj, name):
    if isinstance(obj, cupy.ndarray):
        return [obj], True
    if isinstance(obj, (list, tuple)):
        return list(obj), False
    if isinstance(obj, np.ndarray):
        return [obj], True  # rejected with the mix message by check_array
    raise TypeError(f"{name}: expected a cupy.ndarray or a list of them, "
                    f"got {type(obj).__name__}")


def check_step_arrays(x, g, slots):
    """The dense step's arrays (as fastadam._core._validation.check_step_arrays): cupy.ndarrays on
    one device, or equal-length lists of them.  Returns (xs, gs, slot_lists, dtype, device)."""
    cupy = import_cupy("x")
    xs, single = as_array_list(cupy, x, "x")
    gs, single_g = as_array_list(cupy, g, "g")
    names = ", ".join(name for name, _ in slots)
    if single_g != single:
        raise TypeError(f"x, g, {names}: pass either one ndarray each or a list of ndarrays each")
    n = len(xs)
    if len(gs) != n:
        raise ValueError(f"g: expected a list of {n} arrays like x, got {len(gs)}")
    slot_lists = []
    for name, obj in slots:
        lst, single_s = as_array_list(cupy, obj, name)
        if single_s != single:
            raise TypeError(f"x, g, {names}: pass either one ndarray each or a list of ndarrays "
                            f"each")
        if len(lst) != n:
            raise ValueError(f"{name}: expected a list of {n} arrays like x, got {len(lst)}")
        slot_lists.append(lst)
    dtype, device = None, None
    if n:
        check_array(cupy, xs[0], label("x", 0, single))
        dtype, device = xs[0].dtype, xs[0].data.device_id
    columns = [xs, gs] + slot_lists
    if not _all_plain(cupy.ndarray, columns, dtype, device):
        # some array is not the common case: check each, in the CPU path's order, for the
        # message of the first error (check_array also passes what the shortcut left out)
        for i in range(n):
            xi = check_array(cupy, xs[i], label("x", i, single), dtype, None, device)
            check_array(cupy, gs[i], label("g", i, single), dtype, xi.shape, device)
            for (name, _), lst in zip(slots, slot_lists):
                check_array(cupy, lst[i], label(name, i, single), dtype, xi.shape, device)
    groups = [("x", xs, True), ("g", gs, False)]
    groups += [(name, lst, True) for (name, _), lst in zip(slots, slot_lists)]
    check_disjoint(groups, single)
    return xs, gs, slot_lists, dtype or np.dtype(np.float32), device


def _all_plain(nd, columns, dtype, device):
    """Whether every array of ``columns`` (lists as long as the first, which holds the
    parameters) is a C-contiguous cupy.ndarray of ``dtype`` on ``device`` with its parameter's
    shape: check_array's conditions, tested column by column with nothing else done per array
    (the loop of a step over a thousand tensors)."""
    shapes = [getattr(a, "shape", None) for a in columns[0]]
    for column in columns:
        for a, shape in zip(column, shapes):
            if not (type(a) is nd and a.dtype == dtype and a.shape == shape
                    and a.data.device_id == device and a.flags.c_contiguous):
                return False
    return True


def check_parameter_list(params):
    """An optimizer's parameters on the GPU: C-contiguous float cupy.ndarrays of one dtype on one
    device, no two sharing memory."""
    cupy = import_cupy("params")
    xs, single = as_array_list(cupy, params, "params")
    dtype, device = None, None
    for i, a in enumerate(xs):
        check_array(cupy, a, label("params", i, single), dtype, None, device)
        dtype, device = a.dtype, a.device.id
    check_disjoint([("params", xs, True)], single)
    return xs


def check_disjoint(groups, single=False):
    """Reject overlapping device memory, as fastadam._core._validation.check_disjoint: groups is a
    list of (name, arrays, written); two buffers may share memory only if neither is written.
    Sort by start address and sweep (O(k log k))."""
    starts, ends, where = [], [], []
    for gi, (name, lst, written) in enumerate(groups):
        for i, a in enumerate(lst):
            nbytes = a.nbytes
            if nbytes:
                ptr = a.data.ptr
                starts.append(ptr)
                ends.append(ptr + nbytes)
                where.append((gi, i, written))
    if len(starts) > _SWEEP_IN_PYTHON and not _any_overlap(starts, ends, where):
        return
    spans = [(p, e, gi, i, w) for p, e, (gi, i, w) in zip(starts, ends, where)]
    spans.sort(key=lambda s: s[0])
    best_any = best_written = None
    for cur in spans:
        if cur[4] and best_any is not None and cur[0] < best_any[1]:
            _raise_overlap(groups, best_any, cur, single)
        if not cur[4] and best_written is not None and cur[0] < best_written[1]:
            _raise_overlap(groups, best_written, cur, single)
        if best_any is None or cur[1] > best_any[1]:
            best_any = cur
        if cur[4] and (best_written is None or cur[1] > best_written[1]):
            best_written = cur


_SWEEP_IN_PYTHON = 64  # more spans: NumPy first tells whether the sweep has anything to name


def _any_overlap(starts, ends, where):
    """Whether the sweep of check_disjoint would raise, in NumPy: in start order, a written
    span must start at or after the end of every span before it, and any span at or after the
    end of every written span before it."""
    start, end = np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
    written = np.array([w for _, _, w in where], dtype=bool)
    order = np.argsort(start, kind="stable")
    start, end, written = start[order], end[order], written[order]
    lowest = np.iinfo(np.int64).min
    before_any = np.concatenate([[lowest], np.maximum.accumulate(end)[:-1]])
    ends_written = np.where(written, end, lowest)
    before_written = np.concatenate([[lowest], np.maximum.accumulate(ends_written)[:-1]])
    return bool(np.any(np.where(written, start < before_any, start < before_written)))


def _raise_overlap(groups, a, b, single):
    la = label(groups[a[2]][0], a[3], single)
    lb = label(groups[b[2]][0], b[3], single)
    if a[2] == b[2] and a[3] == b[3]:
        lb = "itself"
    raise ValueError(f"{la} and {lb} share memory; arrays that are updated in place must not "
                     f"overlap each other or the gradient")


def explain_mix(named):
    """Called when a CPU check failed: if any of ``named`` ((name, object or list) pairs) holds
    a device array, raise the mix error naming it (the CPU message would not say why)."""
    for name, obj in named:
        if obj is None:
            continue
        items = obj if isinstance(obj, (list, tuple)) else [obj]
        for i, a in enumerate(items):
            if is_device_array(a):
                where = f"{name}[{i}]" if isinstance(obj, (list, tuple)) else name
                raise TypeError(f"{where}: a GPU array ({type(a).__name__}) in a call whose x "
                                f"is a numpy.ndarray; "
                                f"NumPy and CuPy arrays cannot be mixed in one call (pass x "
                                f"on the GPU too, or copy this one with .get())")


def check_device_parameter(a, name):
    """One optimizer parameter on the GPU (fastadam/optim/_params.py's param_array): a
    C-contiguous float cupy.ndarray.  Returns it."""
    cupy = import_cupy(name)
    return check_array(cupy, a, name)


def check_device_gradient(g, x, name, pname):
    """A dense gradient of the device parameter ``x`` (or a device gradient of a NumPy
    parameter: the mix error), with the messages of fastadam/optim/_params.py."""
    cupy = import_cupy(name)
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name}: a GPU array ({type(g).__name__}) for {pname}, a "
                        f"numpy.ndarray; NumPy and CuPy arrays cannot be mixed in one step")
    check_device_array(cupy, g, name, x.device.id)
    if g.dtype != x.dtype:
        raise TypeError(f"{name}: expected dtype {x.dtype} (the dtype of {pname}), "
                        f"got {g.dtype}")
    if g.shape != x.shape:
        raise ValueError(f"{name}: expected shape {x.shape} (the shape of {pname}), "
                         f"got {g.shape}")
    return cupy.ascontiguousarray(g)  # only read: a copy is harmless


def address(a):
    """The first byte of a NumPy or CuPy array."""
    return a.data.ptr if is_device_array(a) else a.__array_interface__["data"][0]
