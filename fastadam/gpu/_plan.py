"""The GPU rows of the driver registry (fastadam/_core/_drivers.py): what a step plan
(``fastadam.optim.prepare_step``) over CuPy arrays runs.  Registered when ``fastadam.gpu`` is
imported; CuPy itself is imported only when a step runs.

- ``GpuStep``: float16/float32/float64 parameters and states (the kernels of _dense.py and
  _sparse.py, which check the arrays at every call);
- ``GpuLowpStep``: bfloat16 parameters (uint16 bits, CuPy having no bfloat16), bfloat16 or
  8-bit states, a float32 master (_lowp.py).
"""
import numpy as np

from .. import drivers
from ..drivers import (FMT_BF16, FMT_F32, FMT_Q8, MAP_CODES, ROUND_CODES, QuantizedState,
                       check_block_size, check_quant_map, check_rounding, check_seed)
from ._validation import is_device_array

_entry = None  # the fastadam.gpu package: its public step functions (set by register)


def _as_list(obj):
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]


def _fmt(a):
    if isinstance(a, QuantizedState):
        return FMT_Q8
    return FMT_BF16 if a.dtype == np.uint16 else FMT_F32


def _classify(a):
    if isinstance(a, QuantizedState):
        return "int8"
    return "bfloat16" if getattr(a, "dtype", None) == np.uint16 else "float"


class GpuStep:
    """The float GPU driver: the arrays are checked by the kernels' entry at every call."""

    arrays = None  # no header-only gradient check: Optimizer.step takes its general route

    def __init__(self, spec, params, slots, options):
        if options["master"] is not None:
            raise ValueError("master: a float32 master copy is for bfloat16 params")
        self.params, self.slots = params, slots
        self.xs = _as_list(params)
        self.slot_names = tuple(n for n in spec.slots if n in slots)
        self.lists_by_flags = {}

    def lists(self, names):
        return [(n, self.slots[n]) for n in names]

    def check(self, coeffs):
        if any(x.dtype != np.float64 for x in self.xs):
            coeffs.check_float32()

    def run(self, coeffs, grads, key, skip_nonfinite):
        return _entry.dense_step(coeffs, self.params, grads, self.lists_by_flags[coeffs.flags],
                          skip_nonfinite)

    def run_sparse(self, coeffs, names, k, grad, t, mode, key):
        return _entry.sparse_step(coeffs, self.xs[k], grad,
                           [(n, _as_list(self.slots[n])[k]) for n in names], t, mode, None)


class GpuLowpStep:
    """The low-precision GPU driver (``fastadam.gpu.lowp_dense_step`` checks the arrays)."""

    arrays = None

    def __init__(self, spec, params, slots, options):
        self.spec = spec
        block = check_block_size(options["block_size"])
        quant_map = check_quant_map(options["quant_map"])
        self.rounding = ROUND_CODES[check_rounding(options["param_rounding"])]
        self.seed = check_seed(options["seed"])
        self.xs = _as_list(params)
        self.slots = {n: _as_list(slots[n]) for n in spec.slots if n in slots}
        self.slot_names = tuple(self.slots)
        formats = {_fmt(a) for lst in self.slots.values() for a in lst}
        if len(formats) > 1:
            raise TypeError("slots: expected every state in one format (float32, bfloat16 bits "
                            "as uint16, or QuantizedState)")
        for name, lst in self.slots.items():
            for q in lst:
                if isinstance(q, QuantizedState) and (
                        q.block_size != block or q.quant_map != quant_map
                        or q.signed != (name not in spec.nonnegative_slots)):
                    raise ValueError(f"{name}: its block_size, quant_map or signed "
                                     f"({q.block_size}, {q.quant_map!r}, {q.signed}) differ "
                                     f"from the step's ({block}, {quant_map!r}, "
                                     f"{name not in spec.nonnegative_slots})")
        master = options["master"]
        self.masters = [] if master is None else _as_list(master)
        self.param_fmt = _fmt(self.xs[0]) if self.xs else FMT_F32
        self.state_fmt = formats.pop() if formats else FMT_F32
        self.block, self.qmap = block, MAP_CODES[quant_map]
        self.nt = options["nt"]
        self.lists_by_flags = {}

    def lists(self, names):
        lists = [self.slots[n] for n in names]
        if self.state_fmt == FMT_Q8:
            return ([[q.codes for q in lst] for lst in lists],
                    [[q.scales for q in lst] for lst in lists], names)
        return lists, [], names

    def check(self, coeffs):
        coeffs.check_float32()

    def run(self, coeffs, grads, key, skip_nonfinite):
        slots, scales, names = self.lists_by_flags[coeffs.flags]
        gs = list(grads) if isinstance(grads, (list, tuple)) else [grads]
        grad_fmt = FMT_BF16 if gs and gs[0].dtype == np.uint16 else FMT_F32
        signed = tuple(n not in self.spec.nonnegative_slots for n in names)
        return bool(_entry.lowp_dense_step(
            coeffs, self.xs, gs, slots, scales, self.masters, self.param_fmt, grad_fmt,
            self.state_fmt, self.block, self.qmap, signed, self.rounding, self.seed, int(key),
            bool(skip_nonfinite), self.nt))

    def run_sparse(self, coeffs, names, k, grad, t, mode, key):
        return _entry.sparse_step(coeffs, self.xs[k], grad, [(n, self.slots[n][k]) for n in names],
                           t, mode, None)


class GpuRowwiseStep:
    """The GPU driver of a row-wise optimizer (state format ``"rows"``: one value per row),
    through ``fastadam.gpu.rowwise_dense_step`` and the sparse row walk."""

    arrays = None

    def __init__(self, spec, params, slots, options):
        if options["master"] is not None or options["param_rounding"] != "nearest":
            raise ValueError("params: a row-wise optimizer steps float32 or float64 "
                             "parameters (no float32 master, no stochastic rounding)")
        self.params, self.slots = params, slots
        self.xs = _as_list(params)
        self.slot_names = tuple(n for n in spec.slots if n in slots)
        self.lists_by_flags = {}

    def lists(self, names):
        return [self.slots[n] for n in names]

    check = GpuStep.check

    def run(self, coeffs, grads, key, skip_nonfinite):
        (acc,) = self.lists_by_flags[coeffs.flags]
        return _entry.rowwise_dense_step(coeffs, self.params, grads, acc, skip_nonfinite)

    run_sparse = GpuStep.run_sparse


def _float_or_lowp(spec, params, slots, options):
    if options["master"] is not None or options["param_rounding"] != "nearest":
        return GpuLowpStep(spec, params, slots, options)
    return GpuStep(spec, params, slots, options)


def register(package):
    """Register the GPU device and rows; ``package`` is fastadam.gpu, whose public functions
    (``dense_step``, ``lowp_dense_step``, ``sparse_step``: CuPy imported there) the drivers
    call."""
    global _entry
    _entry = package
    drivers.register_device("gpu", is_device_array, _classify)
    drivers.register_driver("gpu", "float", "float", _float_or_lowp)
    for p, s in [("float", "bfloat16"), ("float", "int8"), ("bfloat16", "float"),
                 ("bfloat16", "bfloat16"), ("bfloat16", "int8")]:
        drivers.register_driver("gpu", p, s, GpuLowpStep)
    drivers.register_driver("gpu", "float", "rows", GpuRowwiseStep)
