"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): its fold, spec,
functional steps (dense and sparse) and optimizer object.

The element formula is include/fastadam/lion.h: the step is the sign of an interpolation of
the momentum and the gradient, the momentum is updated after it with a second rate, and weight
decay is decoupled (as optax's ``lion``).  This module folds the hyper-parameters once per step
in float64, registers the spec (fastadam/_core/_registry.py) and builds the public functions and the
``Lion`` class on the shared drivers.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._core._coeffs import StructCoefficients
from .._core._registry import OptimizerSpec, register
from ._base import Optimizer, ParamsLike, check_bool, check_choice, check_real
from ._checks import check_rule, real_or_schedule
from ._coefficients import _grad_scale, finite_float, retime_from_one, step_number
from ._functional import Arrays, dense_step

__all__ = ["Lion", "lion_step_inplace", "sparse_lion_step_inplace"]

FIELDS = ("lr", "beta1", "beta2", "decay_mul", "sign", "grad_scale")
_FINITE32 = ((0, "lr"), (5, "grad_scale"))
_NONZERO32 = ((5, "grad_scale"),)
#: One rule per hyper-parameter, (low, high) of a closed range (None: no upper bound).  Every
#: entry point reads it through the fold: the functional and sparse steps, prepare_step (the
#: spec's fold), the Lion object (check_group folds; so does each step) and fastadam.torch's
#: Lion (its steps are the functional ones); tests/optimizer_table.py makes error rows of it.
HYPER_RULES = {"lr": (0.0, None), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0),
               "weight_decay": (0.0, None)}


def lion_coefficients(t, *, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0, maximize=False,
                      grad_scale=None):
    """The coefficient object of Lion's step ``t`` (formula: include/fastadam/lion.h)."""
    rules = HYPER_RULES
    lr = check_rule(finite_float(lr, "lr"), "lr", rules["lr"])
    beta1 = check_rule(finite_float(beta1, "beta1"), "beta1", rules["beta1"])
    beta2 = check_rule(finite_float(beta2, "beta2"), "beta2", rules["beta2"])
    weight_decay = check_rule(finite_float(weight_decay, "weight_decay"), "weight_decay",
                              rules["weight_decay"])
    t = step_number(t)
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1, got {t}")
    flags, divisor = _grad_scale(grad_scale)
    values = (lr, beta1, beta2, 1.0 - lr * weight_decay, -1.0 if maximize else 1.0, divisor)
    return StructCoefficients(SPEC.kind, FIELDS, values, flags, divisor, _FINITE32, _NONZERO32)


SPEC = register(OptimizerSpec(
    name="lion", fold=lion_coefficients, retime=retime_from_one, fields=FIELDS, slots=("m",), object_slots=("exp_avg",),
    onnx_op=None, torch_name=None, nonnegative_slots=()))  # m takes both signs


def lion_step_inplace(x: Arrays, g: Arrays, m: Arrays, t: int, *, lr: float = 1e-4,
                      beta1: float = 0.9, beta2: float = 0.99, weight_decay: float = 0.0,
                      maximize: bool = False, grad_scale: Optional[float] = None,
                      skip_nonfinite: bool = False, num_threads: Optional[int] = None) -> bool:
    """One fused Lion step, in place, on one array or a list of arrays.

    Per element (scalars folded in float64 once per call; float16 computed in float32)::

        g' = (-1 if maximize else 1) * g / grad_scale
        c  = beta1 * m + (1 - beta1) * g'
        x  = (1 - lr * weight_decay) * x - lr * sign(c)
        m  = beta2 * m + (1 - beta2) * g'

    ``sign(0) = 0`` (a zero ``c`` leaves ``x`` alone) and a NaN propagates.  Defaults are the
    paper's (``beta1 = 0.9``, ``beta2 = 0.99``; its advice: an lr 3-10x smaller and a weight
    decay 3-10x larger than AdamW's).  optax's ``lion`` computes the same update (its decay is
    ``x - lr * (sign(c) + weight_decay * x)``, equal up to rounding).

    Parameters
    ----------
    x, g, m : ndarray or list of ndarray
        Parameters, gradient and momentum, as ``x, g, m`` in :func:`fastadam.step_inplace`.
    t : int
        Step number (>= 1; Lion's update does not depend on it).
    grad_scale, skip_nonfinite, num_threads
        As in :func:`fastadam.step_inplace`.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    coeffs = lion_coefficients(t, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
                               maximize=maximize, grad_scale=grad_scale)
    return dense_step(coeffs, x, g, [("m", m)], skip_nonfinite, num_threads)


def sparse_lion_step_inplace(x: np.ndarray, grad: Any, m: np.ndarray, t: int, *,
                             mode: str = "lazy", last_step: Optional[np.ndarray] = None,
                             lr: float = 1e-4, beta1: float = 0.9, beta2: float = 0.99,
                             weight_decay: float = 0.0, maximize: bool = False,
                             indices_sorted_unique: bool = False,
                             num_threads: Optional[int] = None) -> None:
    """One Lion step with a sparse gradient, in place.

    The update of a row is :func:`fastadam.lion_step_inplace`'s formula, with ``g`` the row's
    summed gradient.  Modes, gradient forms, ``indices_sorted_unique`` and checks are those of
    :func:`fastadam.sparse_step_inplace`: in ``"lazy"`` and ``"catchup"`` modes only touched
    rows move and decay; ``"catchup"`` first decays a returning row's momentum by ``beta2``
    once per missed step; ``"dense"`` moves every row (an untouched row by ``lr *
    sign(beta1 * m)``), as the dense step on the densified gradient.
    """
    from ._sparse_functional import sparse_step

    coeffs = lion_coefficients(t, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
                               maximize=maximize)
    return sparse_step(coeffs, x, grad, [("m", m)], t, mode, last_step, num_threads,
                       indices_sorted_unique)


SPARSE_MODES = ("lazy", "dense")


class Lion(Optimizer):
    """Lion over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per element, as :func:`fastadam.lion_step_inplace` documents (``betas = (beta1, beta2)``)::

        x = (1 - lr*weight_decay)*x - lr*sign(beta1*m + (1-beta1)*g);  m = beta2*m + (1-beta2)*g

    with ``m`` the slot ``"exp_avg"``.

    Parameters
    ----------
    params, clip_grad_norm, num_threads, sparse_mode
        As for :class:`fastadam.Adam`.
    state_dtype, block_size, quant_map, param_rounding, master_weights, seed, min_8bit_size
        Low-precision states and bfloat16 parameters, as for :class:`fastadam.Adam`.
    lr : float or callable
        >= 0 (default 1e-4), or a schedule.
    betas : (float, float)
        Default (0.9, 0.99).
    weight_decay : float
        Decoupled, >= 0.
    maximize : bool
    """

    group_keys = ("lr", "betas", "weight_decay", "maximize", "sparse_mode")

    def __init__(self, params: ParamsLike, lr: Any = 1e-4,
                 betas: Tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 maximize: bool = False, sparse_mode: str = "lazy",
                 clip_grad_norm: Optional[float] = None, num_threads: Optional[int] = None,
                 state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        super().__init__(params, dict(
            lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize,
            sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm, num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        # types here; the ranges are HYPER_RULES's, applied by the fold below
        h["lr"] = real_or_schedule(h["lr"])
        try:
            beta1, beta2 = h["betas"]
        except (TypeError, ValueError):
            raise TypeError(f"betas: expected a pair (beta1, beta2), got {h['betas']!r}") from None
        h["betas"] = (check_real(beta1, "beta1", None), check_real(beta2, "beta2", None))
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay", None)
        h["maximize"] = check_bool(h["maximize"], "maximize")
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        lion_coefficients(1, **self._scalars(h, 0.0 if callable(h["lr"]) else h["lr"]))
        return h

    @staticmethod
    def _scalars(h: Dict[str, Any], lr: float) -> Dict[str, Any]:
        return dict(lr=lr, beta1=h["betas"][0], beta2=h["betas"][1],
                    weight_decay=h["weight_decay"], maximize=h["maximize"])

    spec_name = "lion"

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("exp_avg", 0.0)]

    def step_hyper(self, h, lr, grad_scale):
        return dict(self._scalars(h, lr), grad_scale=grad_scale)
