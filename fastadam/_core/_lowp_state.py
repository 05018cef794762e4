"""Low-precision optimizer state on the Python side: bfloat16 arrays and 8-bit block-quantized
states (issue 24; the formats are defined once, in the driver's design note, _lowp.pyx).

- bfloat16 arrays are ``ml_dtypes.bfloat16`` NumPy arrays (itemsize 2, the top half of a
  float32).  ``ml_dtypes`` is an optional dependency (the ``bfloat16`` extra):
  :func:`is_bfloat16` never imports it (no bfloat16 array can exist without it), and
  :func:`bfloat16` imports it only when a caller asks for the dtype, with an install hint.
- :class:`QuantizedState` holds one 8-bit state slot: ``codes`` (uint8, the parameter's shape,
  C-contiguous) indexing a 256-entry quantization map, and ``scales`` (float32, one per block of
  ``block_size`` flat elements); value = ``map[code] * scales[block]``.  Its quantize and
  dequantize are the driver's (``_lowp.quantize`` / ``_lowp.dequantize``): one implementation.
  Its arrays and options are fixed when it is built (a prepared step and an optimizer keep
  the arrays they checked; the step writes into them in place), and its scales are finite and
  non-negative (a NaN, infinite or negative scale makes its whole block NaN or wrong).

The checks of the arrays a low-precision step writes live in ``_lowp_validation.py``.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Tuple

import numpy as np

__all__ = ["QuantizedState", "bfloat16", "is_bfloat16", "STATE_DTYPES", "QUANT_MAPS",
           "BLOCK_MIN", "BLOCK_MAX", "FMT_F32", "FMT_BF16", "FMT_Q8", "MAP_CODES"]

STATE_DTYPES = ("float32", "bfloat16", "int8")
FMT_F32, FMT_BF16, FMT_Q8 = 0, 1, 2
QUANT_MAPS = ("dynamic", "linear")
MAP_CODES = {"dynamic": 0, "linear": 1}
BLOCK_MIN, BLOCK_MAX = 8, 4096
DEFAULT_BLOCK = 256

_FLOAT32 = np.dtype(np.float32)
_UINT8 = np.dtype(np.uint8)


def bfloat16() -> np.dtype:
    """The ``ml_dtypes.bfloat16`` NumPy dtype; ImportError with the install hint without it."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("bfloat16 arrays are ml_dtypes.bfloat16 NumPy arrays: install "
                          "ml_dtypes (pip install 'ml_dtypes>=0.3', fastadam's bfloat16 "
                          "extra)") from None
    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype: Any) -> bool:
    """True if ``dtype`` is ``ml_dtypes.bfloat16`` (without importing ml_dtypes)."""
    module = sys.modules.get("ml_dtypes")
    return module is not None and dtype == module.bfloat16


def check_block_size(block_size: Any, name: str = "block_size") -> int:
    """An int in [8, 4096]."""
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"{name}: expected an int in [{BLOCK_MIN}, {BLOCK_MAX}], got "
                        f"{type(block_size).__name__}")
    block_size = int(block_size)
    if not BLOCK_MIN <= block_size <= BLOCK_MAX:
        raise ValueError(f"{name}: expected an int in [{BLOCK_MIN}, {BLOCK_MAX}], got "
                         f"{block_size}")
    return block_size


def check_quant_map(quant_map: Any, name: str = "quant_map") -> str:
    if not isinstance(quant_map, str) or quant_map not in QUANT_MAPS:
        raise ValueError(f"{name}: expected one of {QUANT_MAPS}, got {quant_map!r}")
    return quant_map


def check_state_dtype(state_dtype: Any, name: str = "state_dtype") -> str:
    if not isinstance(state_dtype, str) or state_dtype not in STATE_DTYPES:
        raise ValueError(f"{name}: expected one of {STATE_DTYPES}, got {state_dtype!r}")
    return state_dtype


def _on_device(a: Any) -> bool:
    """A GPU array (CuPy, or anything with ``__cuda_array_interface__``)."""
    return not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__")


def check_scales(scales: np.ndarray, name: str) -> None:
    """8-bit scales are finite and >= 0 (each is its block's largest magnitude): ValueError
    naming ``name`` and the first bad block otherwise."""
    bad = ~(scales >= 0) | (scales == np.inf)  # NaN fails >= 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected finite scales >= 0 (each block's largest "
                         f"magnitude), got {scales.flat[i]} at block {i}")


def n_blocks(size: int, block_size: int) -> int:
    return -(-size // block_size)


def _shape(shape: Any) -> Tuple[int, ...]:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape: expected an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"shape: expected non-negative sizes, got {shape}")
    return shape


class QuantizedState:
    """One optimizer state slot stored as 8-bit block-quantized codes.

    Element ``j`` (flat, C order) has the value ``map[codes.flat[j]] * scales[j // block_size]``,
    with ``map`` the 256 float32 values of ``quant_map`` (``"dynamic"``: the dynamic tree map of
    Dettmers et al. 2021, ``"linear"``: evenly spaced), signed or unsigned.  A step updates
    ``codes`` and ``scales`` in place; the attributes themselves cannot be replaced (a
    prepared step or an optimizer holding the state keeps the arrays it checked): write into
    them in place, or build a new state.  Build one with :meth:`zeros` or :meth:`from_array`;
    read it with :meth:`to_array`.  For the GPU path, ``codes`` and ``scales`` may be CuPy
    arrays (``QuantizedState(cupy.asarray(q.codes), cupy.asarray(q.scales), ...)``).

    Parameters
    ----------
    codes : ndarray of uint8
        C-contiguous, writable; its shape is the parameter's.
    scales : ndarray of float32
        1-D, C-contiguous, writable, of length ``ceil(codes.size / block_size)``; finite and
        >= 0 (a block's scale is its largest magnitude).
    block_size : int
        Elements per scale, in [8, 4096] (default 256).
    quant_map : {"dynamic", "linear"}
    signed : bool
        True for a slot that takes both signs (Adam's ``m``), False for a non-negative one
        (Adam's ``v``): the unsigned map spends every code on values >= 0.
    """

    __slots__ = ("_codes", "_scales", "_block_size", "_quant_map", "_signed")

    def __init__(self, codes: np.ndarray, scales: np.ndarray, block_size: int = DEFAULT_BLOCK,
                 quant_map: str = "dynamic", signed: bool = True):
        block_size = check_block_size(block_size)
        quant_map = check_quant_map(quant_map)
        if not isinstance(signed, (bool, np.bool_)):
            raise TypeError(f"signed: expected a bool, got {type(signed).__name__}")
        if _on_device(codes) or _on_device(scales):  # CuPy: fastadam.gpu checks them
            if not (_on_device(codes) and _on_device(scales)):
                raise TypeError("codes, scales: expected both on the GPU or both NumPy arrays")
            if codes.dtype != _UINT8 or scales.dtype != _FLOAT32 or scales.ndim != 1:
                raise TypeError(f"codes, scales: expected uint8 codes and 1-D float32 scales, "
                                f"got {codes.dtype} and {scales.ndim}-D {scales.dtype}")
        else:
            if not isinstance(codes, np.ndarray) or codes.dtype != _UINT8:
                got = codes.dtype if isinstance(codes, np.ndarray) else type(codes).__name__
                raise TypeError(f"codes: expected a numpy.ndarray of uint8, got {got}")
            if not codes.flags.c_contiguous or not codes.flags.writeable:
                raise ValueError("codes: expected a C-contiguous, writable array")
            if not isinstance(scales, np.ndarray) or scales.dtype != _FLOAT32:
                got = scales.dtype if isinstance(scales, np.ndarray) else type(scales).__name__
                raise TypeError(f"scales: expected a numpy.ndarray of float32, got {got}")
            if (scales.ndim != 1 or not scales.flags.c_contiguous or not scales.flags.writeable
                    or not scales.dtype.isnative or not scales.flags.aligned):
                raise ValueError(f"scales: expected a 1-D, C-contiguous, writable, aligned "
                                 f"array in native byte order, got shape {scales.shape}")
        expected = n_blocks(codes.size, block_size)
        if scales.shape[0] != expected:
            raise ValueError(f"scales: expected {expected} scales (ceil({codes.size} / "
                             f"block_size {block_size})), got {scales.shape[0]}")
        if isinstance(scales, np.ndarray):
            check_scales(scales, "scales")
        self._set(codes, scales, block_size, quant_map, bool(signed))

    def _set(self, codes, scales, block_size, quant_map, signed):
        for name, value in (("_codes", codes), ("_scales", scales), ("_block_size", block_size),
                            ("_quant_map", quant_map), ("_signed", signed)):
            object.__setattr__(self, name, value)

    codes = property(lambda self: self._codes,
                     doc="The uint8 codes (the parameter's shape), updated in place.")
    scales = property(lambda self: self._scales,
                      doc="The float32 scales, one per block, updated in place.")
    block_size = property(lambda self: self._block_size, doc="Elements per scale.")
    quant_map = property(lambda self: self._quant_map, doc='"dynamic" or "linear".')
    signed = property(lambda self: self._signed, doc="The signed map (True) or not.")

    def __setattr__(self, name, value):
        if name in ("codes", "scales", "block_size", "quant_map", "signed"):
            raise AttributeError(f"{name}: a QuantizedState's arrays and options are fixed when "
                                 f"it is built (a prepared step or optimizer holding it keeps "
                                 f"the arrays it checked); write into codes and scales in place "
                                 f"(state.{'scales' if name == 'scales' else 'codes'}[...] = "
                                 f"...) or build a new QuantizedState")
        raise AttributeError(f"'QuantizedState' object has no attribute {name!r}")

    def __getstate__(self):
        return (self._codes, self._scales, self._block_size, self._quant_map, self._signed)

    def __setstate__(self, state):
        self._set(*state)

    # ---- construction and reading ------------------------------------------------------------
    @classmethod
    def zeros(cls, shape: Any, block_size: int = DEFAULT_BLOCK, quant_map: str = "dynamic",
              signed: bool = True) -> "QuantizedState":
        """A state of zeros: every scale 0 (then every code reads as 0)."""
        shape = _shape(shape)
        block_size = check_block_size(block_size)
        size = math.prod(shape)
        codes = np.zeros(shape, _UINT8)
        state = cls(codes, np.zeros(n_blocks(size, block_size), _FLOAT32), block_size,
                    quant_map, signed)
        state.codes[...] = state._zero_code()
        return state

    @classmethod
    def from_array(cls, a: Any, block_size: int = DEFAULT_BLOCK, quant_map: str = "dynamic",
                   signed: bool = True) -> "QuantizedState":
        """Quantize ``a`` (any real array, read as float32): per block,
        ``scale = max(abs(a))`` and each code the nearest map value to ``a / scale``."""
        from . import _lowp
        block_size = check_block_size(block_size)
        quant_map = check_quant_map(quant_map)
        a = np.asarray(a)
        if a.dtype.kind not in "fiu" and not is_bfloat16(a.dtype):
            raise TypeError(f"a: expected a real array, got {a.dtype}")
        if a.dtype.kind == "f" or is_bfloat16(a.dtype):
            if a.size and not np.isfinite(a.astype(np.float32)).all():
                raise ValueError("a: expected finite values (a NaN or an infinity has no "
                                 "8-bit code)")
        if not signed and a.size and np.nanmin(a.astype(np.float32)) < 0:
            raise ValueError("a: an unsigned (signed=False) state holds values >= 0 only")
        flat = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        codes, scales = _lowp.quantize(flat, block_size, bool(signed),
                                       MAP_CODES[quant_map])
        return cls(np.asarray(codes, _UINT8).reshape(a.shape), np.asarray(scales, _FLOAT32),
                   block_size, quant_map, signed)

    def to_array(self) -> np.ndarray:
        """The float32 values (a new array of the codes' shape)."""
        from . import _lowp
        codes, scales = self.codes, self.scales
        if _on_device(codes):  # a CuPy state: read back to the host
            codes, scales = codes.get(), scales.get()
        flat = _lowp.dequantize(codes.reshape(-1), scales, self.block_size,
                                self.signed, MAP_CODES[self.quant_map])
        return np.asarray(flat, _FLOAT32).reshape(self.codes.shape)

    def quant_values(self) -> np.ndarray:
        """The 256 float32 values of this state's map (ascending)."""
        from . import _lowp
        maker = _lowp.dynamic_map if self.quant_map == "dynamic" else _lowp.linear_map
        return np.asarray(maker(self.signed), _FLOAT32)

    def _zero_code(self) -> int:
        """The code whose map value is 0.0 (where a zero block's codes point)."""
        values = self.quant_values()
        return int(np.flatnonzero(values == 0.0)[0])

    def fill(self, value: float) -> None:
        """Set every element to ``value`` (exact for ``value >= 0``: the map holds 0 and 1.0,
        the scale is ``abs(value)``)."""
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"value: expected a finite number, got {value}")
        if value == 0.0:
            self.codes[...] = self._zero_code()
            self.scales[...] = 0.0
            return
        if value < 0.0 and not self.signed:
            raise ValueError(f"value: an unsigned state holds values >= 0 only, got {value}")
        values = self.quant_values()
        target = 1.0 if value > 0 else -1.0
        code = int(np.argmin(np.abs(values.astype(np.float64) - target)))
        self.codes[...] = code
        self.scales[...] = np.float32(abs(value))

    def copy(self) -> "QuantizedState":
        state = QuantizedState.__new__(QuantizedState)  # as it is, checked or not
        state._set(self._codes.copy(), self._scales.copy(), self._block_size, self._quant_map,
                   self._signed)
        return state

    # ---- facts --------------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self.codes.shape

    @property
    def size(self) -> int:
        return self.codes.size

    @property
    def nbytes(self) -> int:
        """Bytes held: the codes (1 per element) and the scales (4 per block)."""
        return self.codes.nbytes + self.scales.nbytes

    def __repr__(self) -> str:
        return (f"QuantizedState(shape={self.shape}, block_size={self.block_size}, "
                f"quant_map={self.quant_map!r}, signed={self.signed})")
