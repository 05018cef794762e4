"""Small checks of hyper-parameter values shared by the optimizer objects and checkpoints
(``_base.py`` re-exports them; ``_checkpoint.py`` imports them from here, so that neither of the
two imports the other)."""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Tuple

import numpy as np


def scalar_value(value: Any) -> Any:
    """A 0-d NumPy array of a real dtype (what JAX/optax schedules and ``np.float32(x) * 2``
    style arithmetic return) as its Python number; anything else unchanged."""
    if type(value) is np.ndarray and value.ndim == 0 and value.dtype.kind in "iuf":
        return value.item()
    return value


def check_real(value: Any, name: str, low: Optional[float] = 0.0) -> float:
    """A finite real number (not a bool; a 0-d real array counts), ``>= low`` unless low is
    None."""
    value = scalar_value(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} "
                        f"{value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if low is not None and value < low:
        raise ValueError(f"{name}: expected a number >= {low:g}, got {value}")
    return value


def check_rule(value: float, name: str, rule: Tuple[float, Optional[float]]) -> float:
    """``value`` (a finite float) by its row ``rule = (low, high)`` of an optimizer's
    ``HYPER_RULES``: ``low <= value <= high``, ``high`` None for no upper bound."""
    low, high = rule
    if high is None:
        if not value >= low:
            raise ValueError(f"{name}: expected a number >= {low:g}, got {value}")
    elif not low <= value <= high:
        raise ValueError(f"{name}: expected {low:g} <= {name} <= {high:g}, got {value}")
    return value


def real_or_schedule(value: Any, name: str = "lr") -> Any:
    """A real number (type only: its range is the optimizer's table's, checked by its fold)
    or a schedule (a callable)."""
    return value if callable(value) else check_real(value, name, None)


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_clip(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = check_real(value, "clip_grad_norm")
    if value <= 0.0:
        raise ValueError(f"clip_grad_norm: expected a number > 0 or None, got {value}")
    return value
