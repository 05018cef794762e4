"""Memory budget of ``fastadam.onnx``: refuse, from shapes alone, a node whose result would be
too large, before anything is allocated.

Design.  Two limits: bytes per tensor (one node output, one padded copy) and bytes per step
(everything the budgeted allocations of one ``run``/``step`` add up to, inputs excluded).  Both
default to a fraction of the machine's physical memory (``TENSOR_FRACTION``,
``STEP_FRACTION``) and are set with :func:`set_memory_budget`.  The operators that can make a
tensor much larger than their inputs -- broadcasting elementwise ops, MatMul/Gemm (outer
products), convolution and pooling padding, and any operator that builds a tensor from a shape
(Expand, ConstantOfShape, Range, Tile) -- call :func:`reserve` with the shape they are about to
allocate; it raises :class:`MemoryBudgetError` (a ValueError) naming the operator, the shape
and the limit, and the graph puts the node's name in front.  The per-step total is counted in
a thread-local scope opened by ``Graph.execute``/``run_program`` (:func:`step_scope`); outside
one, only the per-tensor limit applies.
"""
import math
import os
import threading

import numpy as np

__all__ = ["MemoryBudgetError", "memory_budget", "set_memory_budget"]

TENSOR_FRACTION = 0.25
STEP_FRACTION = 0.5
_FALLBACK_MEMORY = 8 << 30  # when the platform does not say how much memory it has


class MemoryBudgetError(ValueError):
    """A node would allocate more than ``fastadam.onnx.memory_budget()`` allows."""


def physical_memory():
    """Bytes of physical memory (``os.sysconf``), or 8 GiB where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_MEMORY


_limits = {"tensor_bytes": None, "step_bytes": None}  # as set; None: the default fraction
_in_force = []  # [(tensor bytes, step bytes)], computed on first use and on every set
_local = threading.local()


def _resolved():
    if not _in_force:
        memory = physical_memory()
        tensor, step = _limits["tensor_bytes"], _limits["step_bytes"]
        _in_force[:] = [(int(memory * TENSOR_FRACTION) if tensor is None else tensor,
                         int(memory * STEP_FRACTION) if step is None else step)]
    return _in_force[0]


def memory_budget():
    """The limits in force: ``{"tensor_bytes": int, "step_bytes": int}``."""
    tensor, step = _resolved()
    return {"tensor_bytes": tensor, "step_bytes": step}


def _check_limit(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int (bytes) or None (the default), got "
                         f"{value!r}")
    return int(value)


def set_memory_budget(tensor_bytes=None, step_bytes=None):
    """Set the per-tensor and per-step limits, in bytes, for every session and ``run`` of this
    process (``None``: the default, ``TENSOR_FRACTION`` / ``STEP_FRACTION`` of physical
    memory).  Returns the previous settings (as given, ``None`` for defaults), so that
    ``set_memory_budget(**previous)`` restores them."""
    new = {"tensor_bytes": _check_limit(tensor_bytes, "tensor_bytes"),
           "step_bytes": _check_limit(step_bytes, "step_bytes")}
    previous = dict(_limits)
    _limits.update(new)
    _in_force.clear()
    return previous


def _format(nbytes):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def reserve(op_type, shape, dtype, what="output", temporary=False):
    """Account for a tensor of ``shape`` and ``dtype`` that ``op_type`` is about to allocate;
    raises MemoryBudgetError (naming ``op_type`` and ``what``) if it is over a limit.
    ``temporary``: scratch memory freed before the operator returns (checked against both
    limits, not added to the step's total)."""
    nbytes = dtype.itemsize if isinstance(dtype, np.dtype) else np.dtype(dtype).itemsize
    for d in shape:
        nbytes *= int(d)
    tensor_limit, step_limit = _in_force[0] if _in_force else _resolved()
    total = getattr(_local, "total", None)
    if nbytes <= tensor_limit and (total is None or total + nbytes <= step_limit):
        if total is not None and not temporary:
            _local.total = total + nbytes
        return
    shown = f"{tuple(int(d) for d in shape)} ({np.dtype(dtype)}"
    if nbytes > tensor_limit:
        raise MemoryBudgetError(
            f"{op_type}: the {what} of shape {shown}) needs {_format(nbytes)}, over the "
            f"per-tensor budget of {_format(tensor_limit)} (fastadam.onnx.set_memory_budget)")
    raise MemoryBudgetError(
        f"{op_type}: the {what} of shape {shown}, {_format(nbytes)}) brings this step to "
        f"{_format(total + nbytes)}, over the per-step budget of {_format(step_limit)} "
        f"(fastadam.onnx.set_memory_budget)")


def broadcast_shape(op_type, *shapes):
    """NumPy's broadcast of ``shapes`` (tuples of ints), without building arrays; ValueError
    naming ``op_type`` if they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    raise ValueError(f"{op_type}: operands could not be broadcast together "
                                     f"with shapes {' '.join(str(t) for t in shapes)}")
                out[i] = d
    return tuple(out)


def reserve_broadcast(op_type, dtype, *shapes):
    """``reserve`` the result of broadcasting ``shapes`` (nothing to check when they are all
    the same shape: the result is no larger than an input)."""
    first = shapes[0]
    if all(s == first for s in shapes[1:]):
        return
    reserve(op_type, broadcast_shape(op_type, *shapes), dtype)


class step_scope:
    """``with step_scope():`` counts the budgeted allocations of one run/step against the
    per-step limit (a nested scope shares the outer one's count)."""

    __slots__ = ("outer",)

    def __enter__(self):
        self.outer = getattr(_local, "total", None) is not None
        if not self.outer:
            _local.total = 0

    def __exit__(self, *exc):
        if not self.outer:
            _local.total = None
