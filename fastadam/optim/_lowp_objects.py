"""Low-precision states of the optimizer objects (issue 24): options, state allocation, the
dense and lazy sparse steps through the low-precision driver, and memory accounting.

Design.  An optimizer built with ``state_dtype="bfloat16"`` or ``"int8"``, with bfloat16
parameters, ``master_weights=True`` or ``param_rounding="stochastic"`` keeps a
:class:`LowpOptions` in ``opt._lowp``; otherwise ``opt._lowp`` is None and nothing here runs
(the float32 path is today's, call for call).  With it, the base class's step driver --
gradient checks, clipping, ``skip_nonfinite``, schedules, the all-or-nothing rule -- is the
same for every format, and each (group, dtype, state format) bucket steps through a
:class:`~fastadam.optim.PreparedStep` built with the object's formats
(:func:`prepare_options`): one ``_lowp.dense_step`` call per bucket, and the compiled common
step (``fastadam/optim/_step_path.pyx``) once a step has taken it.  The optimizer's
``dense_step`` and ``sparse_step`` are this module's (bound on the instance when the options
are set): the dense one takes what a prepared step must not (:func:`prepared_takes`: a step
number other than the object's ``t + 1``, which keys stochastic rounding, or gradients of
mixed dtypes, read as float32) and the steps of some of a bucket's parameters; the sparse one
makes one ``_lowp.rows_step`` per sparse gradient (coalesced first: sorted unique rows,
summed values).  A bucket whose parameters, states and gradients are all float32 keeps the
float driver.

Small tensors (``min_8bit_size``, bitsandbytes' rule and default): with ``state_dtype="int8"``
a parameter of fewer than ``min_8bit_size`` elements keeps float32 states (one scale per
block is a poor fit for a few hundred values, and their state is small anyway).  The format is
decided per parameter when its slots are made; the base class keeps one bucket per (group,
dtype, state format) (``state_kind``), so each driver call sees one format, and a float32
bucket of float32 parameters is the float driver's call: that parameter steps as a float32
optimizer's would, bit for bit.  bfloat16 states are not affected.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._core._lowp_state import (FMT_BF16, FMT_F32, FMT_Q8, MAP_CODES, QuantizedState,
                                 bfloat16, check_block_size, check_quant_map, check_state_dtype,
                                 is_bfloat16)
from .._core._lowp_validation import (ROUND_CODES, check_rounding, check_seed,
                                      check_sparse_rows)
from .._core._registry import spec as _spec
from .._core._threads import resolve_num_threads
from ..sparse import IndexedSlices
from ._checks import check_bool
from ._clip import coalesce, is_scipy_sparse

LOWP_KEYS = ("state_dtype", "block_size", "quant_map", "param_rounding", "master_weights",
             "seed")  # equal in a checkpoint and the optimizer that loads it
MIN_8BIT_SIZE = 4096  # bitsandbytes' default: smaller tensors keep 32-bit states
_FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class LowpOptions:
    state_dtype: str
    block_size: int
    quant_map: str
    param_rounding: str
    master_weights: bool
    seed: int
    # 0 (every parameter in state_dtype) is what options pickled before the rule existed mean;
    # check_options always sets it (default MIN_8BIT_SIZE)
    min_8bit_size: int = 0

    def as_dict(self) -> Dict[str, Any]:
        """The options a checkpoint must share with the optimizer that loads it."""
        return {k: getattr(self, k) for k in LOWP_KEYS}

    def state_format(self, a: Any) -> str:
        """The state format of a parameter array ``a``: float32 for an 8-bit optimizer's
        parameter of fewer than ``min_8bit_size`` elements, else ``state_dtype``."""
        if self.state_dtype == "int8" and a.size < self.min_8bit_size:
            return "float32"
        return self.state_dtype


def check_min_8bit_size(value: Any, name: str = "min_8bit_size") -> int:
    """An int >= 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= 0 (a parameter of fewer elements keeps "
                        f"float32 states), got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}: expected an int >= 0 (a parameter of fewer elements keeps "
                         f"float32 states), got {int(value)}")
    return int(value)


def check_options(defaults: Dict[str, Any]) -> Tuple[LowpOptions, bool]:
    """The checked options, and whether they ask for the low-precision path by themselves."""
    opts = LowpOptions(
        state_dtype=check_state_dtype(defaults.get("state_dtype", "float32")),
        block_size=check_block_size(defaults.get("block_size", 256)),
        quant_map=check_quant_map(defaults.get("quant_map", "dynamic")),
        param_rounding=check_rounding(defaults.get("param_rounding", "nearest")),
        master_weights=check_bool(defaults.get("master_weights", False), "master_weights"),
        seed=check_seed(defaults.get("seed", 0)),
        min_8bit_size=check_min_8bit_size(defaults.get("min_8bit_size", MIN_8BIT_SIZE)))
    if opts.master_weights and opts.param_rounding == "stochastic":
        raise ValueError("param_rounding: with master_weights=True the bfloat16 parameters are "
                         "written rounded to nearest from the float32 master; got 'stochastic'")
    if opts.state_dtype == "bfloat16":
        bfloat16()  # the ImportError with its hint now, not at the first step
    wanted = (opts.state_dtype != "float32" or opts.master_weights
              or opts.param_rounding != "nearest")
    return opts, wanted


def check_params(opts: LowpOptions, arrays: List[np.ndarray], labels: List[str]) -> None:
    """Low-precision steps take float32 and bfloat16 parameters only."""
    for a, label in zip(arrays, labels):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{label}: the optimizer objects keep low-precision states on the "
                            f"CPU; for CuPy arrays use fastadam.optim.prepare_step")
        if a.dtype != _FLOAT32 and not is_bfloat16(a.dtype):
            raise TypeError(f"{label}: state_dtype={opts.state_dtype!r} (and bfloat16 "
                            f"parameters) need float32 or bfloat16 parameters, got {a.dtype}")
    if opts.param_rounding == "stochastic" and not any(is_bfloat16(a.dtype) for a in arrays):
        raise ValueError("param_rounding: stochastic rounding is for bfloat16 parameters; "
                         "these are float32")
    if opts.master_weights and not any(is_bfloat16(a.dtype) for a in arrays):
        # prepare_step's rule (a master is for bfloat16 params); float32 ones beside bfloat16
        # ones step without a copy, being their own master
        raise ValueError("master_weights: a float32 master copy is for bfloat16 parameters; "
                         "these are float32")


def new_slot(opts: LowpOptions, spec: Any, name: str, a: np.ndarray, fill: float) -> Any:
    """One state slot (object name ``name``) of parameter ``a`` in its format
    (:meth:`LowpOptions.state_format`)."""
    fmt = opts.state_format(a)
    if fmt == "float32":
        return np.full(a.shape, fill, np.float32)
    if fmt == "bfloat16":
        slot = np.empty(a.shape, bfloat16())  # filled in place: no float32 temporary
        slot.fill(fill)
        return slot
    functional = spec.slots[spec.object_slots.index(name)]
    state = QuantizedState.zeros(a.shape, opts.block_size, opts.quant_map,
                                 functional not in spec.nonnegative_slots)
    if fill:
        state.fill(fill)
    return state


def _format(a: Any) -> int:
    if isinstance(a, QuantizedState):
        return FMT_Q8
    return FMT_BF16 if is_bfloat16(a.dtype) else FMT_F32


_FORMAT_NAMES = {FMT_F32: "float32", FMT_BF16: "bfloat16", FMT_Q8: "int8"}


def state_kind(opt, i: int) -> int:
    """The state format code of parameter ``i`` (what splits the buckets: one driver call per
    format); 0 for a float optimizer or one without slots."""
    if opt._lowp is None or not opt._slots:
        return 0
    return _format(opt._slots[next(iter(opt._slots))][i])


def param_state_formats(opt) -> List[str]:
    """Each parameter's state format ("float32", "bfloat16" or "int8"), as its slots hold it
    (an optimizer without slots: as the options decide)."""
    if opt._slots:
        return [_FORMAT_NAMES[_format(a)] for a in opt._slots[next(iter(opt._slots))]]
    return [opt._lowp.state_format(a) for a in opt._arrays]


def _threads(opt) -> int:
    return resolve_num_threads(opt.num_threads)


_SLOT_ORDER: Dict[Tuple[str, int], Tuple[List[str], Tuple[bool, ...]]] = {}


def _slot_order(opt, coeffs) -> Tuple[List[str], Tuple[bool, ...]]:
    """(object slot names in kernel order, signed map per slot) of these coefficients' flags."""
    key = (opt.spec_name, coeffs.flags)
    order = _SLOT_ORDER.get(key)
    if order is None:
        spec = _spec(opt.spec_name)
        idx = spec.slot_indices(coeffs.flags)
        order = _SLOT_ORDER[key] = ([spec.object_slots[i] for i in idx],
                                    tuple(spec.slots[i] not in spec.nonnegative_slots
                                          for i in idx))
    return order


def check_writable(opt, xs: List[np.ndarray], named: List[Tuple[str, List[np.ndarray]]],
                   masters: List[np.ndarray]) -> None:
    """Before the driver writes: each parameter of ``xs``, its arrays in ``named`` ((what,
    one array per parameter) pairs: states, codes, scales) and its master are writable;
    ValueError naming the parameter and the array otherwise (the driver refuses too, by
    position only).  The steps that do not go through a prepared step (whose one-pass header
    check covers this) call it."""
    for k, x in enumerate(xs):
        parts = [("", x)] + [(f" ({what})", lst[k]) for what, lst in named]
        if masters:
            parts.append((" (its float32 master)", masters[k]))
        for what, a in parts:
            if not a.flags.writeable:
                label = next((lab for p, lab in zip(opt._arrays, opt._labels) if p is x),
                             f"params[{k}]")
                raise ValueError(f"{label}{what}: is read-only, but it is updated in place")


def _named(names: List[str], codes: List[List[np.ndarray]], scales: List[List[np.ndarray]]):
    """(what, arrays) of each written state list, for :func:`check_writable`."""
    named = [(f"its {n} state" if not scales else f"its {n} codes", lst)
             for n, lst in zip(names, codes)]
    return named + [(f"its {n} scales", lst) for n, lst in zip(names, scales)]


def _driver_lists(slots_of_names: List[List[Any]], state_fmt: int):
    if state_fmt == FMT_Q8:
        return ([[q.codes for q in lst] for lst in slots_of_names],
                [[q.scales for q in lst] for lst in slots_of_names])
    return slots_of_names, []


def dense_step(opt, xs, gs, slots, t, h, lr, grad_scale, skip_nonfinite) -> bool:
    """The objects' dense step with low-precision states or parameters (bound as
    ``opt.dense_step``)."""
    from .._core import _lowp
    first = slots[next(iter(slots))][0] if slots and slots[next(iter(slots))] else None
    state_fmt = FMT_F32 if first is None else _format(first)
    param_fmt = _format(xs[0]) if xs else FMT_F32
    if (param_fmt == FMT_F32 and state_fmt == FMT_F32
            and all(g.dtype == _FLOAT32 for g in gs)):
        return type(opt).dense_step(opt, xs, gs, slots, t, h, lr, grad_scale, skip_nonfinite)
    coeffs = opt.coefficients(t, h, lr, grad_scale)
    coeffs.check_float32()  # computed in float32
    if not any(x.size for x in xs):  # the precision checks run on empty arrays: no call
        return True
    names, signed = _slot_order(opt, coeffs)
    missing = [n for n in names if n not in slots]
    if missing:
        raise ValueError(f"{missing[0]}: these options need the state {missing[0]!r}")
    grad_fmt = FMT_BF16 if all(is_bfloat16(g.dtype) for g in gs) else FMT_F32
    if grad_fmt == FMT_F32:  # one gradient dtype per call: bfloat16 ones read as float32
        gs = [g if g.dtype == _FLOAT32 else g.astype(np.float32) for g in gs]
    masters = []
    if param_fmt == FMT_BF16 and opt._lowp.master_weights:
        masters = [opt._masters[id(x)] for x in xs]
    codes, scales = _driver_lists([slots[n] for n in names], state_fmt)
    check_writable(opt, xs, _named(names, codes, scales), masters)
    o = opt._lowp
    return bool(_lowp.dense_step(coeffs, list(xs), list(gs), codes, scales, masters,
                                 param_fmt, grad_fmt, state_fmt, o.block_size,
                                 MAP_CODES[o.quant_map], signed, ROUND_CODES[o.param_rounding],
                                 o.seed, t + 1, bool(skip_nonfinite), _threads(opt)))


def prepare_options(opt, xs: List[np.ndarray]) -> Dict[str, Any]:
    """``prepare_step``'s low-precision keywords for one bucket of parameters ``xs`` (one
    dtype): the format options, and for bfloat16 parameters their rounding and masters."""
    o = opt._lowp
    kw: Dict[str, Any] = dict(block_size=o.block_size, quant_map=o.quant_map, seed=o.seed)
    if xs and is_bfloat16(xs[0].dtype):
        kw["param_rounding"] = o.param_rounding
        if o.master_weights:
            masters = opt._masters
            kw["master"] = [masters[id(x)] for x in xs]
    return kw


def prepared_takes(offset: int, gs: List[Any]) -> bool:
    """Whether a low-precision bucket's prepared step takes this step exactly as
    :func:`dense_step` would: the functional step number is the object's ``t + 1`` (the
    stochastic rounding key's step; Adagrad's and SGD's "onnx" conventions count from ``t``)
    and the gradients share one dtype (:func:`dense_step` reads a mix as float32)."""
    if offset != 1:
        return False
    dtype = gs[0].dtype if gs else None
    for g in gs:
        if g.dtype is not dtype and g.dtype != dtype:
            return False
    return True


def check_sparse(opt, i: int) -> None:
    """Before any write: a sparse gradient of parameter ``i`` can take the lazy row step."""
    x = opt._arrays[i]
    first = opt._slots[next(iter(opt._slots))][i] if opt._slots else None
    if first is None or (_format(first) == FMT_F32 and _format(x) == FMT_F32):
        return  # the float driver's sparse step
    h = opt._groups[opt._group_of[i]]
    if h.get("sparse_mode", "lazy") != "lazy":
        raise ValueError(f"sparse_mode: low-precision states step sparse gradients lazily "
                         f"only (touched rows); got {h['sparse_mode']!r} for {opt._labels[i]}")
    if _format(first) == FMT_Q8:
        check_sparse_rows(x.shape, opt._lowp.block_size, opt._labels[i])


def _rows_values(grad: Any, shape: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted unique int64 rows and their summed float32 values (len(rows), D)."""
    d = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    if isinstance(grad, tuple):  # (rows, values): already coalesced
        rows, values = grad
    elif isinstance(grad, IndexedSlices):
        g = coalesce(grad)
        rows, values = g.indices, g.values
    elif is_scipy_sparse(grad):
        g = coalesce(grad)
        counts = np.diff(g.indptr)
        rows = np.flatnonzero(counts)
        values = g[rows].toarray() if rows.size else np.empty((0, d), np.float32)
    else:
        raise TypeError(f"grad: expected IndexedSlices or CSR, got {type(grad).__name__}")
    rows = np.ascontiguousarray(rows, np.int64)
    values = np.ascontiguousarray(np.asarray(values, np.float32).reshape(rows.size, d))
    return rows, values


def sparse_step(opt, x, grad, slots, t, h, lr) -> None:
    """The lazy sparse step with low-precision states or parameters (``opt.sparse_step``)."""
    from .._core import _lowp
    first = slots[next(iter(slots))] if slots else None
    state_fmt = FMT_F32 if first is None else _format(first)
    param_fmt = _format(x)
    if param_fmt == FMT_F32 and state_fmt == FMT_F32:
        return type(opt).sparse_step(opt, x, grad, slots, t, h, lr)
    coeffs = opt.coefficients(t, h, lr, None)
    coeffs.check_float32()
    rows, values = _rows_values(grad, x.shape)
    if not rows.size or not x.size:
        return None
    names, signed = _slot_order(opt, coeffs)
    r = x.shape[0]
    x2 = x.reshape(r, -1)
    lst = [slots[n] for n in names]
    if state_fmt == FMT_Q8:
        codes = [q.codes.reshape(r, -1) for q in lst]
        scales = [q.scales for q in lst]
    else:
        codes, scales = [a.reshape(r, -1) for a in lst], []
    master = None
    if param_fmt == FMT_BF16 and opt._lowp.master_weights:
        master = opt._masters[id(x)].reshape(r, -1)
    check_writable(opt, [x], _named(names, [[a] for a in codes], [[a] for a in scales]),
                   [] if master is None else [master])
    o = opt._lowp
    _lowp.rows_step(coeffs, x2, rows, values, codes, scales, master, param_fmt, state_fmt,
                    o.block_size, MAP_CODES[o.quant_map], signed, ROUND_CODES[o.param_rounding],
                    o.seed, t + 1, _threads(opt))
    return None


def state_bytes(opt) -> int:
    """Bytes of optimizer state: every slot (codes and scales for 8-bit ones) and masters."""
    total = 0
    for arrays in opt._slots.values():
        total += sum(int(a.nbytes) for a in arrays)
    total += sum(int(m.nbytes) for m in opt.__dict__.get("_master_list", ()) if m is not None)
    return total
