"""The array checks of low-precision steps (bfloat16 arrays, 8-bit QuantizedState slots, float32
masters): every one runs before the driver (_lowp.pyx) writes anything.

Beside ``_validation.pyx`` (whose ``check_array`` and ``check_disjoint`` these reuse): a
low-precision step is checked once when it is prepared (parameters, states, masters, options)
and its gradients at each step, so the per-step cost is the gradients' headers only.  Errors
are TypeError / ValueError naming the argument (``m[1]``, ``master``, ``block_size``), what
was expected and what was received.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._lowp_state import (FMT_BF16, FMT_F32, FMT_Q8, MAP_CODES, QuantizedState,
                          check_block_size, check_quant_map, is_bfloat16)
from ._validation import as_array_list, check_array, check_disjoint

__all__ = ["LowpPlan", "check_lowp_step", "check_lowp_grads", "check_sparse_rows",
           "check_rounding", "check_seed", "is_lowp_input", "ROUNDINGS", "FORMAT_NAMES"]

ROUNDINGS = ("nearest", "stochastic")
ROUND_CODES = {"nearest": 0, "stochastic": 1}
FORMAT_NAMES = {FMT_F32: "float32", FMT_BF16: "bfloat16", FMT_Q8: "int8"}
_FLOAT32 = np.dtype(np.float32)
SEED_LIMIT = 2 ** 64


def _label(name: str, i: int, single: bool) -> str:
    return name if single else f"{name}[{i}]"


def check_rounding(param_rounding: Any) -> str:
    if not isinstance(param_rounding, str) or param_rounding not in ROUNDINGS:
        raise ValueError(f"param_rounding: expected one of {ROUNDINGS}, got {param_rounding!r}")
    return param_rounding


def check_seed(seed: Any) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed: expected an int in [0, 2**64), got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed}")
    return seed


def array_format(a: Any) -> Optional[int]:
    """FMT_F32 / FMT_BF16 for a float32 / bfloat16 ndarray, FMT_Q8 for a QuantizedState, else
    None."""
    if isinstance(a, QuantizedState):
        return FMT_Q8
    if isinstance(a, np.ndarray):
        if a.dtype == _FLOAT32:
            return FMT_F32
        if is_bfloat16(a.dtype):
            return FMT_BF16
    return None


def is_lowp_input(params: Any, slots: Dict[str, Any], master: Any) -> bool:
    """True if a step must go the low-precision way: a bfloat16 array, a QuantizedState or a
    master among its arguments (everything float32/float64/float16: today's driver)."""
    if master is not None:
        return True
    for obj in [params] + list(slots.values()):
        for a in (obj if isinstance(obj, (list, tuple)) else [obj]):
            if isinstance(a, QuantizedState) or (isinstance(a, np.ndarray)
                                                 and is_bfloat16(a.dtype)):
                return True
    return False


def _what(a: Any) -> str:
    if isinstance(a, QuantizedState):
        return "a QuantizedState"
    if isinstance(a, np.ndarray):
        return "bfloat16" if is_bfloat16(a.dtype) else str(a.dtype)
    return type(a).__name__


def check_plain(a: Any, name: str, shape: Optional[Tuple[int, ...]], writable: bool,
                fmt: Optional[int] = None) -> np.ndarray:
    """A float32 or bfloat16 ndarray (``fmt`` given: that one), aligned, C-contiguous, of
    ``shape``, writable if ``writable``."""
    got = array_format(a)
    if got not in (FMT_F32, FMT_BF16) or (fmt is not None and got != fmt):
        want = "float32 or bfloat16" if fmt is None else FORMAT_NAMES[fmt]
        raise TypeError(f"{name}: expected a {want} numpy.ndarray, got {_what(a)}")
    return check_array(a, name, -1, shape, writable, True, False)


def _check_quantized(q: QuantizedState, name: str, shape: Tuple[int, ...], block: int,
                     quant_map: str, signed: bool) -> None:
    """A QuantizedState whose attributes (mutable) still hold together, like its parameter."""
    codes, scales = q.codes, q.scales
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8:
        raise TypeError(f"{name}.codes: expected a uint8 numpy.ndarray, got {_what(codes)}")
    check_array(codes, f"{name}.codes", -1, shape, True, True, False)
    if not isinstance(scales, np.ndarray) or scales.dtype != _FLOAT32:
        raise TypeError(f"{name}.scales: expected a float32 numpy.ndarray, got {_what(scales)}")
    check_array(scales, f"{name}.scales", -1, None, True, True, False)
    if q.block_size != block:
        raise ValueError(f"{name}: its block_size is {q.block_size}, the step's block_size is "
                         f"{block} (every state of a step shares one block size)")
    if q.quant_map != quant_map:
        raise ValueError(f"{name}: its quant_map is {q.quant_map!r}, the step's quant_map is "
                         f"{quant_map!r}")
    if q.signed != signed:
        why = ("it never goes negative: the unsigned map" if not signed
               else "it takes both signs: the signed map")
        raise ValueError(f"{name}: expected signed={signed} ({why}), got signed={q.signed}")
    expected = -(-codes.size // block)
    if scales.ndim != 1 or scales.shape[0] != expected:
        raise ValueError(f"{name}.scales: expected shape ({expected},) (ceil({codes.size} / "
                         f"block_size {block})), got {scales.shape}")


@dataclass
class LowpPlan:
    """A checked low-precision step: what the driver call takes but the gradients and scalars."""
    xs: List[np.ndarray]
    single: bool
    param_fmt: int
    state_fmt: int
    slot_names: Tuple[str, ...]
    slot_lists: Dict[str, List[Any]]  # name -> ndarrays or QuantizedStates
    masters: List[np.ndarray]
    signed: Dict[str, bool]
    block: int
    qmap: int
    rounding: int
    seed: int
    written: List[Tuple[str, List[np.ndarray], bool]] = field(default_factory=list)
    # 8-bit slots: name -> (codes, scales), the arrays checked here (what every step writes)
    q8_arrays: Dict[str, Tuple[List[np.ndarray], List[np.ndarray]]] = field(default_factory=dict)

    def driver_lists(self, names: Sequence[str]):
        """(slots, scales, signed) of the driver call for the slots ``names`` in kernel order:
        the arrays checked when the step was prepared."""
        if self.state_fmt == FMT_Q8:
            slots = [self.q8_arrays[n][0] for n in names]
            scales = [self.q8_arrays[n][1] for n in names]
        else:
            slots = [self.slot_lists[n] for n in names]
            scales = []
        return slots, scales, tuple(self.signed[n] for n in names)


def check_lowp_step(spec: Any, params: Any, slots: Dict[str, Any], *, master: Any = None,
                    block_size: Any = 256, quant_map: Any = "dynamic",
                    param_rounding: Any = "nearest", seed: Any = 0) -> LowpPlan:
    """Check a low-precision dense step's arrays and options (see ``prepare_step``)."""
    block = check_block_size(block_size)
    quant_map = check_quant_map(quant_map)
    rounding = check_rounding(param_rounding)
    seed = check_seed(seed)
    xs, single = as_array_list(params, "params")
    param_fmt = None
    for i, x in enumerate(xs):
        fmt = array_format(x)
        if fmt not in (FMT_F32, FMT_BF16):
            culprit = next((n for n, s in slots.items() if _first(s) is not None
                            and array_format(_first(s)) in (FMT_BF16, FMT_Q8)), None)
            why = (f" ({culprit} is {_what(_first(slots[culprit]))}: low-precision states "
                   f"take float32 or bfloat16 params)" if culprit else "")
            raise TypeError(f"{_label('params', i, single)}: expected float32 or bfloat16, got "
                            f"{_what(x)}{why}")
        if param_fmt is not None and fmt != param_fmt:
            raise TypeError(f"{_label('params', i, single)}: expected "
                            f"{FORMAT_NAMES[param_fmt]} like params[0] (one dtype per step), "
                            f"got {_what(x)}")
        param_fmt = fmt
        check_plain(x, _label("params", i, single), None, True)
    if param_fmt is None:
        param_fmt = FMT_F32
    shapes = [x.shape for x in xs]
    state_fmt = None
    first_name = None
    slot_lists: Dict[str, List[Any]] = {}
    signed = {n: n not in spec.nonnegative_slots for n in spec.slots}
    for name in spec.slots:
        if name not in slots:
            continue
        if isinstance(slots[name], QuantizedState):
            lst, single_s = [slots[name]], True
        elif isinstance(slots[name], (list, tuple)):
            lst, single_s = list(slots[name]), False
        else:
            lst, single_s = as_array_list(slots[name], name)
        if single_s != single or len(lst) != len(xs):
            raise ValueError(f"{name}: expected {'one state' if single else len(xs)} like "
                             f"params, got {'one' if single_s else len(lst)}")
        for i, (a, shape) in enumerate(zip(lst, shapes)):
            label = _label(name, i, single)
            fmt = array_format(a)
            if fmt is None:
                raise TypeError(f"{label}: expected a float32 or bfloat16 numpy.ndarray or a "
                                f"QuantizedState, got {_what(a)}")
            if state_fmt is None:
                state_fmt, first_name = fmt, label
            elif fmt != state_fmt:
                raise TypeError(f"{label}: expected {FORMAT_NAMES[state_fmt]} like "
                                f"{first_name} (every state of a step in one format), got "
                                f"{_what(a)}")
            if fmt == FMT_Q8:
                _check_quantized(a, label, shape, block, quant_map, signed[name])
            else:
                check_plain(a, label, shape, True, fmt)
        slot_lists[name] = lst
    if state_fmt is None:
        state_fmt = FMT_F32
    masters: List[np.ndarray] = []
    if master is not None:
        if param_fmt != FMT_BF16:
            raise ValueError("master: a float32 master copy is for bfloat16 params; params "
                             "are float32")
        masters, single_m = as_array_list(master, "master")
        if single_m != single or len(masters) != len(xs):
            raise ValueError(f"master: expected {'one array' if single else len(xs)} like "
                             f"params, got {'one array' if single_m else len(masters)}")
        for i, (a, shape) in enumerate(zip(masters, shapes)):
            check_plain(a, _label("master", i, single), shape, True, FMT_F32)
        if rounding != "nearest":
            raise ValueError("param_rounding: with a float32 master the bfloat16 params are "
                             "written rounded to nearest; got 'stochastic'")
    if rounding == "stochastic" and param_fmt != FMT_BF16:
        raise ValueError("param_rounding: stochastic rounding is for bfloat16 params; params "
                         "are float32")
    written = [("params", xs, True)]
    q8_arrays = {}
    for name, lst in slot_lists.items():
        if state_fmt == FMT_Q8:
            q8_arrays[name] = ([q.codes for q in lst], [q.scales for q in lst])
            written.append((name, q8_arrays[name][0], True))
            written.append((f"{name}.scales", q8_arrays[name][1], True))
        else:
            written.append((name, lst, True))
    if masters:
        written.append(("master", masters, True))
    check_disjoint(written, single)
    return LowpPlan(xs=xs, single=single, param_fmt=param_fmt, state_fmt=state_fmt,
                    slot_names=tuple(slot_lists), slot_lists=slot_lists, masters=masters,
                    signed=signed, block=block, qmap=MAP_CODES[quant_map],
                    rounding=ROUND_CODES[rounding], seed=seed, written=written,
                    q8_arrays=q8_arrays)


def _first(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return obj[0] if obj else None
    return obj


def check_lowp_grads(plan: LowpPlan, grads: Any) -> Tuple[List[np.ndarray], int]:
    """The gradients of one step: float32 or bfloat16 (one dtype), each like its parameter,
    overlapping no written array.  Returns (gs, grad_fmt)."""
    gs, single = as_array_list(grads, "grads")
    n = len(plan.xs)
    if single != plan.single or len(gs) != n:
        raise ValueError(f"grads: expected {'one array' if plan.single else n} like params, "
                         f"got {'one array' if single else len(gs)}")
    grad_fmt = FMT_F32
    for i, (g, x) in enumerate(zip(gs, plan.xs)):
        label = _label("grads", i, single)
        fmt = array_format(g)
        if fmt not in (FMT_F32, FMT_BF16):
            raise TypeError(f"{label}: expected float32 or bfloat16, got {_what(g)}")
        if i and fmt != grad_fmt:
            raise TypeError(f"{label}: expected {FORMAT_NAMES[grad_fmt]} like grads[0] (one "
                            f"gradient dtype per step), got {_what(g)}")
        grad_fmt = fmt
        check_array(g, label, -1, x.shape, False, True, False)
    check_disjoint(plan.written + [("grads", gs, False)], single)
    return gs, grad_fmt


def suggest_divisors(d: int, block: int) -> List[int]:
    """Block sizes in [8, 4096] that divide d, nearest to ``block`` first (at most three)."""
    divs = [b for b in range(8, min(d, 4096) + 1) if d % b == 0]
    return sorted(divs, key=lambda b: (abs(b - block), b))[:3]


def check_sparse_rows(shape: Tuple[int, ...], block: int, name: str) -> None:
    """A parameter stepped by sparse gradients with 8-bit states: 2-D (rows, D) with
    ``D % block_size == 0`` (a row is whole blocks)."""
    if len(shape) != 2:
        raise ValueError(f"{name}: sparse gradients with 8-bit states need a 2-D (rows, D) "
                         f"parameter, got shape {shape}")
    d = shape[1]
    if d % block:
        hint = suggest_divisors(d, block)
        tip = (f"; block sizes that divide {d}: {hint}" if hint
               else f"; no block size in [8, 4096] divides {d}: use state_dtype='bfloat16'")
        raise ValueError(f"block_size: {block} does not divide the row length D={d} of {name} "
                         f"(with 8-bit states a sparse row must be whole blocks){tip}")
