"""Low-precision states of the optimizer objects (issue 24): options, state allocation and
memory accounting.

Design.  An optimizer built with ``state_dtype="bfloat16"`` or ``"int8"``, with bfloat16
parameters, ``master_weights=True`` or ``param_rounding="stochastic"`` keeps a
:class:`LowpOptions` in ``opt._lowp``; otherwise ``opt._lowp`` is None and nothing here runs.
The step itself is the base class's, for every format: each (group, dtype, state format)
bucket has a plan (``fastadam.optim.prepare_step`` given :func:`prepare_options`), which the
driver registry resolves to the low-precision driver (``LowpStep`` in _prepared.py) or, for a
bucket whose parameters and states are all float32, to the float driver.  This module only
says how a bucket's gradients reach its plan (:func:`grads_for`) and what a sparse gradient
must satisfy (:func:`check_sparse`).

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
from typing import Any, Dict, List, Tuple

import numpy as np

from .._core._lowp_state import (FMT_BF16, FMT_F32, FMT_Q8, QuantizedState,
                                 bfloat16, check_block_size, check_quant_map, check_state_dtype,
                                 is_bfloat16)
from .._core._lowp_validation import check_rounding, check_seed, check_sparse_rows
from ._checks import check_bool

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


def check_writable(opt, idx: List[int]) -> None:
    """Before a plan of some of a bucket's parameters is built: each parameter of ``idx``, its
    states (8-bit ones: codes and scales) and its master are writable; ValueError naming the
    parameter and the array as the user knows them otherwise."""
    masters = opt.__dict__.get("_master_list") or [None] * len(opt._arrays)
    for i in idx:
        parts = [("", opt._arrays[i])]
        for name, arrays in opt._slots.items():
            a = arrays[i]
            if isinstance(a, QuantizedState):
                parts += [(f" (its {name} codes)", a.codes), (f" (its {name} scales)", a.scales)]
            else:
                parts.append((f" (its {name} state)", a))
        if masters[i] is not None:
            parts.append((" (its float32 master)", masters[i]))
        for what, a in parts:
            if isinstance(a, np.ndarray) and not a.flags.writeable:
                raise ValueError(f"{opt._labels[i]}{what}: is read-only, but it is updated in "
                                 f"place")


def grads_for(plan: Any, gs: List[Any]) -> List[Any]:
    """The dense gradients of a low-precision optimizer's bucket as its plan takes them: one
    dtype per run, so a mix (or gradients of another dtype than a float32 bucket's) is read as
    float32 (bfloat16 widens exactly)."""
    dtypes = {g.dtype for g in gs}
    if len(dtypes) > 1 or (plan.driver[1:] == ("float", "float") and dtypes != {_FLOAT32}):
        return [g if g.dtype == _FLOAT32 else g.astype(np.float32) for g in gs]
    return gs


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


def state_bytes(opt) -> int:
    """Bytes of optimizer state: every slot (codes and scales for 8-bit ones) and masters."""
    total = 0
    for arrays in opt._slots.values():
        total += sum(int(a.nbytes) for a in arrays)
    total += sum(int(m.nbytes) for m in opt.__dict__.get("_master_list", ()) if m is not None)
    return total
