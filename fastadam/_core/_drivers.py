"""The driver registry: the second axis of a step (device x parameter format x state format)
as data, the way ``include/fastadam/optimizers.def`` is the first axis.

Design.  A step plan (``fastadam.optim.prepare_step``) classifies its arrays once: the device
that claims the first parameter (NumPy arrays belong to ``"cpu"``; ``fastadam.gpu`` registers
``"gpu"`` for CuPy arrays), the parameters' format and the states' format, as that device's
``classify`` names them (``"float"``: float16/float32/float64 and anything the float driver's
checks refuse by name; ``"bfloat16"``; ``"int8"``: a ``QuantizedState``).  The key
``(device, param_format, state_format)`` names one row, and the row's ``prepare`` builds the
driver bound to those arrays: it checks them once and runs every step (``run``), its checks
without writing (``check``) and the lazy sparse step of one parameter (``run_sparse``).  NumPy's
ufunc dispatching (loops registered as data, the match resolved once and cached by the caller)
is the model.

Rows are registered by the code that owns the driver: the CPU float and low-precision rows by
``fastadam/optim/_prepared.py`` over the compiled drivers of this package, the GPU rows by
``fastadam.gpu`` through ``fastadam.drivers.register_driver``.  This module imports nothing of
either.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Tuple

__all__ = ["Row", "register_device", "register_driver", "device_of", "find_driver", "rows"]


class Row(NamedTuple):
    """One registered driver: ``prepare(spec, params, slots, options) -> bound driver``."""
    device: str
    param_format: str
    state_format: str
    prepare: Callable[..., Any]


class _Device(NamedTuple):
    name: str
    claims: Callable[[Any], bool]       # does this array belong to the device?
    classify: Callable[[Any], str]      # "float", "bfloat16" or "int8"


_ROWS: Dict[Tuple[str, str, str], Row] = {}
_DEVICES: List[_Device] = []


def register_device(name: str, claims: Callable[[Any], bool],
                    classify: Callable[[Any], str]) -> None:
    """Register (or replace) a device: ``claims(array)`` says whether an array is the device's,
    ``classify(array)`` names its format."""
    _DEVICES[:] = [d for d in _DEVICES if d.name != name] + [_Device(name, claims, classify)]


def register_driver(device: str, param_format: str, state_format: str,
                    prepare: Callable[..., Any]) -> None:
    """Register (or replace) the driver of one ``(device, param_format, state_format)`` row."""
    _ROWS[(device, param_format, state_format)] = Row(device, param_format, state_format, prepare)


def device_of(array: Any) -> _Device:
    """The device that claims ``array``: the last registered one that does, else ``"cpu"``."""
    for d in reversed(_DEVICES):
        if d.claims(array):
            return d
    return _DEVICES[0]  # the CPU, registered first


def find_driver(device: str, param_format: str, state_format: str) -> Row:
    """The row of one key; TypeError naming the combination when nothing steps it."""
    row = _ROWS.get((device, param_format, state_format))
    if row is None:
        have = ", ".join(f"{p} parameters with {s} states" for d, p, s in sorted(_ROWS)
                         if d == device)
        raise TypeError(f"params: no driver steps {param_format} parameters with "
                        f"{state_format} states on the {device} (this build has: {have})")
    return row


def rows() -> List[Row]:
    """Every registered row (for ``fastadam.show_config`` and the tests)."""
    return [_ROWS[k] for k in sorted(_ROWS)]


def _cpu_format(a: Any) -> str:
    from ._lowp_state import QuantizedState, is_bfloat16
    if isinstance(a, QuantizedState):
        return "int8"
    dtype = getattr(a, "dtype", None)
    return "bfloat16" if dtype is not None and is_bfloat16(dtype) else "float"


register_device("cpu", lambda a: True, _cpu_format)
