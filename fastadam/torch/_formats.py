"""The parameter and state formats of fastadam.torch: how a torch tensor is seen by the kernels.

Design.  Each parameter dtype is one row of ``KERNEL_VIEWS`` (the NumPy array the kernels
write, sharing the tensor's memory):

- float32, float64, float16: ``Tensor.numpy()`` (the float driver; float16 computed in float32);
- bfloat16: the same bits as an ``ml_dtypes.bfloat16`` array (fastadam's low-precision driver:
  computed in float32, written rounded to nearest even, as ``torch.optim.Adam(fused=True)``
  keeps bfloat16 parameters and states);
- complex64, complex128: ``torch.view_as_real`` (torch.optim steps complex parameters that
  way: real and imaginary parts are separate elements of every state).

A group's ``state_dtype`` (``None``: the parameter's dtype, as torch) and ``master_weights``
decide each parameter's state format (:func:`state_format`): ``"float32"`` or ``"bfloat16"``
states are tensors of that dtype; ``"int8"`` states are a ``uint8`` codes tensor under the
state's own name and a float32 ``<name>_scales`` tensor (one scale per block of 256 values,
the dynamic map: :class:`fastadam.optim.QuantizedState`); with ``master_weights`` a bfloat16
parameter keeps a float32 copy in ``state["master_param"]``.  The low-precision driver takes
float32 and bfloat16 parameters only: other dtypes with a ``state_dtype`` are refused.

A non-contiguous parameter (a channels_last convolution weight, a transposed view) is stepped
through a contiguous copy held by its entry: copied in when the step is planned, written back
after every call of the step has run (so a refused step leaves it as it was).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..optim import QuantizedState, optimizer_spec

REAL_DTYPES = (torch.float32, torch.float64, torch.float16)
COMPLEX_DTYPES = (torch.complex64, torch.complex128)
#: parameter dtypes fastadam.torch steps
SUPPORTED_DTYPES = REAL_DTYPES + (torch.bfloat16,) + COMPLEX_DTYPES
#: a group's ``state_dtype`` values (None: the parameter's dtype, as torch.optim)
STATE_DTYPES = (None, "float32", "bfloat16", "int8")
#: 8-bit states: block size, map and the smallest parameter quantized (fastadam.optim's
#: defaults, bitsandbytes' rule: smaller parameters keep float32 states)
BLOCK_SIZE, QUANT_MAP, MIN_8BIT_SIZE = 256, "dynamic", 4096
MASTER_KEY = "master_param"
_TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.uint8}


def bfloat16_dtype() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("bfloat16 parameters and states are stepped as ml_dtypes.bfloat16 "
                          "NumPy arrays: install ml_dtypes (pip install 'ml_dtypes>=0.3', "
                          "fastadam's bfloat16 extra)") from None
    return np.dtype(ml_dtypes.bfloat16)


_BF16: list = []  # the ml_dtypes dtype, once imported


def _bf16_view(t: torch.Tensor) -> np.ndarray:
    if not _BF16:
        _BF16.append(bfloat16_dtype())
    return t.view(torch.int16).numpy().view(_BF16[0])


def _real_view(t: torch.Tensor) -> np.ndarray:
    return torch.view_as_real(t).numpy()


KERNEL_VIEWS = {torch.float32: torch.Tensor.numpy, torch.float64: torch.Tensor.numpy,
                torch.float16: torch.Tensor.numpy, torch.uint8: torch.Tensor.numpy,
                torch.bfloat16: _bf16_view, torch.complex64: _real_view,
                torch.complex128: _real_view}


def kernel_array(t: torch.Tensor) -> np.ndarray:
    """The NumPy array the kernels write for a detached, contiguous CPU tensor (its memory)."""
    return KERNEL_VIEWS[t.dtype](t)


def strides_non_overlapping(t: torch.Tensor) -> bool:
    """True if no two elements of ``t`` share memory (dims sorted by stride, each stride at
    least the span of the smaller ones; a sufficient test)."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    span = 1
    for st, n in dims:
        if st < span:
            return False
        span = st * n
    return True


def memory_span(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to past its last (its strides are non-negative)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def check_state_options(group: Dict[str, Any]) -> Tuple[Optional[str], bool]:
    """A group's ``(state_dtype, master_weights)``, checked."""
    sd = group.get("state_dtype")
    if sd not in STATE_DTYPES:
        raise ValueError(f"state_dtype: expected None (the parameter's dtype), 'float32', "
                         f"'bfloat16' or 'int8', got {sd!r}")
    mw = group.get("master_weights", False)
    if not isinstance(mw, (bool, np.bool_)):
        raise TypeError(f"master_weights: expected a bool, got {mw!r}")
    if sd == "bfloat16":
        bfloat16_dtype()  # the install hint now
    return sd, bool(mw)


def state_format(p: torch.Tensor, sd: Optional[str], mw: bool,
                 name: str) -> Tuple[Optional[str], bool]:
    """``(format, master)`` of parameter ``p``'s states: format None is the parameter's dtype
    (torch's), else "float32", "bfloat16" or "int8"; master: a float32 master copy."""
    dt = p.dtype
    lowp_param = dt in (torch.float32, torch.bfloat16)
    if mw and dt != torch.bfloat16 and dt != torch.float32:
        raise ValueError(f"{name}: master_weights=True keeps a float32 master copy of "
                         f"bfloat16 parameters, got {dt}")
    master = mw and dt == torch.bfloat16
    if sd is None:
        return None, master
    if not lowp_param:
        raise ValueError(f"{name}: state_dtype={sd!r} needs float32 or bfloat16 parameters "
                         f"(fastadam's low-precision driver), got {dt}; leave state_dtype=None "
                         f"for states in the parameter's dtype")
    if sd == "int8" and p.numel() < MIN_8BIT_SIZE:
        sd = "float32"  # small tensors keep 32-bit states (bitsandbytes' rule)
    if (sd == "float32" and dt == torch.float32) or (sd == "bfloat16" and dt == torch.bfloat16):
        return None, master
    return sd, master


def signed_slot(spec_name: str, slot_name: str) -> bool:
    return slot_name not in optimizer_spec(spec_name).nonnegative_slots


def scales_key(key: str) -> str:
    return f"{key}_scales"


def convert_state(t: torch.Tensor, fmt: str, key: str, signed: bool) -> Dict[str, Any]:
    """The state tensors of ``key`` in format ``fmt``, holding the values of ``t`` (a new
    state, in the parameter's dtype)."""
    if fmt == "int8":
        q = QuantizedState.from_array(t.detach().float().numpy(), BLOCK_SIZE, QUANT_MAP, signed)
        return {key: torch.from_numpy(q.codes), scales_key(key): torch.from_numpy(q.scales)}
    return {key: t.detach().to(_TORCH_DTYPE[fmt]).contiguous()}


def expected_dtype(p: torch.Tensor, fmt: Optional[str]) -> torch.dtype:
    return p.dtype if fmt is None else _TORCH_DTYPE[fmt]


def state_view(state: Dict[str, Any], key: str, p: torch.Tensor, fmt: Optional[str],
               signed: bool, label: str, numpy_view,
               shape: Optional[Tuple[int, ...]] = None) -> Tuple[Any, list]:
    """``(kernel view, [(key, tensor, label)])`` of state ``key`` in format ``fmt``, checked
    like the parameter, of ``shape`` (default the parameter's; a row-wise optimizer's row
    state has one value per row) (``numpy_view`` checks a tensor and returns its array)."""
    tk = state[key]
    view = numpy_view(tk, label)
    want = expected_dtype(p, fmt)
    shape = tuple(p.shape) if shape is None else tuple(shape)
    if tk.dtype != want or tuple(tk.shape) != shape:
        why = "" if fmt is None else f" (state_dtype {fmt!r})"
        raise ValueError(f"{label}: expected dtype {want} and shape {shape}{why}, "
                         f"got {tk.dtype} and {tuple(tk.shape)}")
    parts = [(key, tk, label)]
    if fmt == "int8":
        sk = scales_key(key)
        slabel = label[:-len(repr(key))] + repr(sk)
        ts = state.get(sk)
        if ts is None:
            raise ValueError(f"{slabel}: missing (an 8-bit state's scales)")
        if ts.dtype != torch.float32:
            raise ValueError(f"{slabel}: expected float32 scales, got {ts.dtype}")
        scales = numpy_view(ts, slabel)
        try:
            view = QuantizedState(view, scales, BLOCK_SIZE, QUANT_MAP, signed)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{label}: {exc}") from None
        parts.append((sk, ts, slabel))
    return view, parts
