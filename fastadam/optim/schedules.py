"""Learning-rate schedules: pure functions of the step count, serialisable by name and arguments.

Design: a schedule is a :class:`Schedule` object, ``schedule(k) -> lr``, where ``k`` is the number
of optimizer steps already applied (0 for the first step).  It holds no state, so resuming a run
only needs the optimizer's ``t``, and a checkpoint stores the schedule as its name and arguments
(``to_dict`` / ``from_dict``).  Any other callable ``f(k) -> float`` may be used as a learning
rate too; it works the same way but is not serialised (a checkpoint records that a user callable
was there, and loading it needs an optimizer built with a callable again).

Built-ins (absolute learning rates, like optax's schedules; the torch scheduler each one equals
at every step is named):

- ``constant(lr)``                                       -- a fixed rate
- ``step(lr, step_size, gamma=0.1)``: ``lr * gamma**(k // step_size)``             (StepLR)
- ``exponential(lr, gamma)``: ``lr * gamma**k``                                 (ExponentialLR)
- ``cosine(lr, total_steps, warmup_steps=0, warmup_start_lr=0.0, final_lr=0.0,
  periodic=False)``: linear warm-up from ``warmup_start_lr`` to ``lr`` over ``warmup_steps``
  steps, then ``final_lr + (lr - final_lr) * (1 + cos(pi * (k - W) / (total_steps - W))) / 2``
  (LinearLR then CosineAnnealingLR in a SequentialLR, up to ``total_steps``).  After
  ``total_steps`` it holds ``final_lr``; torch's CosineAnnealingLR is periodic there (the
  formula goes on: back up to ``lr`` at ``2 * total_steps - W``, and so on), which
  ``periodic=True`` reproduces at every step
- ``one_cycle(max_lr, total_steps, pct_start=0.3, div_factor=25.0, final_div_factor=1e4,
  anneal="cos", three_phase=False)``: up from ``max_lr/div_factor`` to ``max_lr``, then down to
  ``max_lr/div_factor/final_div_factor``; the last value stays after ``total_steps``
  (OneCycleLR with ``cycle_momentum=False``)
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Union

__all__ = ["Schedule", "constant", "step", "exponential", "cosine", "one_cycle", "from_dict"]


def _real(value: Any, name: str, *, low: float = 0.0, low_open: bool = False,
          high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}"
        if high < math.inf:
            bound += f" and <= {high}"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value}")
    return value


def _count(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return int(value)


class Schedule:
    """A built-in learning-rate schedule: ``schedule(k)`` is the rate of the step that follows
    ``k`` applied steps.  Build one with the functions of this module."""

    __slots__ = ("name", "args")

    def __init__(self, name: str, args: Dict[str, Any]):
        self.name = name
        self.args = args

    def __call__(self, k: int) -> float:
        k = _count(k, "k", 0)
        try:
            return _FORMULAS[self.name](k, **self.args)
        except OverflowError:  # gamma**k past float64's range
            raise ValueError(f"{self!r}: the learning rate at step k={k} overflows float64 "
                             f"(gamma**k is out of range)") from None

    def to_dict(self) -> Dict[str, Any]:
        """``{"schedule": name, **arguments}``: JSON-compatible; :func:`from_dict` rebuilds it."""
        return {"schedule": self.name, **self.args}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"schedules.{self.name}({args})"


def constant(lr: float) -> Schedule:
    """The rate ``lr`` at every step."""
    return Schedule("constant", {"lr": _real(lr, "lr")})


def step(lr: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``lr * gamma**(k // step_size)`` (torch's StepLR)."""
    return Schedule("step", {"lr": _real(lr, "lr"), "step_size": _count(step_size, "step_size", 1),
                             "gamma": _real(gamma, "gamma")})


def exponential(lr: float, gamma: float) -> Schedule:
    """``lr * gamma**k`` (torch's ExponentialLR)."""
    return Schedule("exponential", {"lr": _real(lr, "lr"), "gamma": _real(gamma, "gamma")})


def cosine(lr: float, total_steps: int, warmup_steps: int = 0, warmup_start_lr: float = 0.0,
           final_lr: float = 0.0, periodic: bool = False) -> Schedule:
    """Linear warm-up over ``warmup_steps``, then a half cosine down to ``final_lr`` at
    ``total_steps`` (see the module docstring for the formula); after ``total_steps``,
    ``final_lr``, or with ``periodic=True`` the cosine goes on as in torch's
    CosineAnnealingLR (period ``2 * (total_steps - warmup_steps)``)."""
    if not isinstance(periodic, bool):
        raise TypeError(f"periodic: expected a bool, got {type(periodic).__name__}")
    lr = _real(lr, "lr")
    total_steps = _count(total_steps, "total_steps", 1)
    warmup_steps = _count(warmup_steps, "warmup_steps", 0)
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps: expected fewer than total_steps={total_steps}, "
                         f"got {warmup_steps}")
    return Schedule("cosine", {"lr": lr, "total_steps": total_steps,
                               "warmup_steps": warmup_steps,
                               "warmup_start_lr": _real(warmup_start_lr, "warmup_start_lr"),
                               "final_lr": _real(final_lr, "final_lr"),
                               "periodic": bool(periodic)})


def one_cycle(max_lr: float, total_steps: int, pct_start: float = 0.3, div_factor: float = 25.0,
              final_div_factor: float = 1e4, anneal: str = "cos",
              three_phase: bool = False) -> Schedule:
    """The one-cycle policy (torch's OneCycleLR without momentum cycling)."""
    if anneal not in ("cos", "linear"):
        raise ValueError(f"anneal: expected 'cos' or 'linear', got {anneal!r}")
    if not isinstance(three_phase, bool):
        raise TypeError(f"three_phase: expected a bool, got {type(three_phase).__name__}")
    total_steps = _count(total_steps, "total_steps", 2)
    pct_start = _real(pct_start, "pct_start", low_open=True, high=1.0)
    # every phase must span at least one step, or its end would not lie after its start
    ends = _one_cycle_ends(total_steps, pct_start, three_phase)
    if any(b <= a for a, b in zip([0.0] + ends, ends)):
        raise ValueError(f"pct_start: {pct_start} leaves an empty phase for "
                         f"total_steps={total_steps}")
    return Schedule("one_cycle", {"max_lr": _real(max_lr, "max_lr"), "total_steps": total_steps,
                                  "pct_start": pct_start,
                                  "div_factor": _real(div_factor, "div_factor", low_open=True),
                                  "final_div_factor": _real(final_div_factor, "final_div_factor",
                                                            low_open=True),
                                  "anneal": anneal, "three_phase": three_phase})


def _constant(k, lr):
    return lr


def _step(k, lr, step_size, gamma):
    return lr * gamma ** (k // step_size)


def _exponential(k, lr, gamma):
    return lr * gamma ** k


def _cosine(k, lr, total_steps, warmup_steps, warmup_start_lr, final_lr, periodic=False):
    if k < warmup_steps:
        return warmup_start_lr + (lr - warmup_start_lr) * k / warmup_steps
    if not periodic:
        k = min(k, total_steps)
    span = total_steps - warmup_steps
    return final_lr + (lr - final_lr) * (1.0 + math.cos(math.pi * (k - warmup_steps) / span)) / 2


def _one_cycle_ends(total_steps, pct_start, three_phase):
    up = pct_start * total_steps - 1.0
    if three_phase:
        return [up, 2.0 * pct_start * total_steps - 2.0, total_steps - 1.0]
    return [up, total_steps - 1.0]


def _one_cycle(k, max_lr, total_steps, pct_start, div_factor, final_div_factor, anneal,
               three_phase):
    initial = max_lr / div_factor
    final = initial / final_div_factor
    ends = _one_cycle_ends(total_steps, pct_start, three_phase)
    values = [initial, max_lr, initial, final] if three_phase else [initial, max_lr, final]
    k = min(k, total_steps - 1)
    begin = 0.0
    for i, end in enumerate(ends):
        if k <= end or i == len(ends) - 1:
            pct = (k - begin) / (end - begin)
            start, stop = values[i], values[i + 1]
            if anneal == "cos":
                return stop + (start - stop) / 2.0 * (math.cos(math.pi * pct) + 1.0)
            return (stop - start) * pct + start
        begin = end
    raise AssertionError("unreachable")


_FORMULAS = {"constant": _constant, "step": _step, "exponential": _exponential,
             "cosine": _cosine, "one_cycle": _one_cycle}
_FACTORIES = {"constant": constant, "step": step, "exponential": exponential, "cosine": cosine,
              "one_cycle": one_cycle}


def from_dict(spec: Dict[str, Any]) -> Schedule:
    """Rebuild a schedule from :meth:`Schedule.to_dict`'s output; every argument is checked as
    by the function that builds that schedule."""
    if not isinstance(spec, dict):
        raise TypeError(f"schedule: expected a dict, got {type(spec).__name__}")
    args = dict(spec)
    name = args.pop("schedule", None)
    if name not in _FACTORIES:
        raise ValueError(f"schedule: unknown schedule {name!r} (expected one of "
                         f"{sorted(_FACTORIES)})")
    try:
        return _FACTORIES[name](**args)
    except TypeError as exc:
        if "argument" in str(exc):  # a missing or unexpected key, not a wrong value type
            raise ValueError(f"schedule {name!r}: {exc}") from None
        raise


LearningRate = Union[float, Callable[[int], float]]
