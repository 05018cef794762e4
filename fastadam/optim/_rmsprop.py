"""RMSprop: its fold, spec, functional steps (dense and sparse) and optimizer object.

The element formula is include/fastadam/rmsprop.h; this module folds the hyper-parameters into
its struct once per step in float64 (``rmsprop_coefficients``), registers the optimizer's
spec (fastadam/_core/_registry.py) and builds the public functions and the ``RMSprop`` class
on the shared drivers.  Two conventions: ``"torch"`` (``torch.optim.RMSprop``: eps added to the root, lr
outside the momentum buffer) and ``"keras"`` (Keras 3 / TF1 ``ApplyRMSProp``: eps under the
root, the buffer holds ``lr * d``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._core._coeffs import FLAG_L2, StructCoefficients
from .._core._registry import OptimizerSpec, register
from ._base import Optimizer, ParamsLike, check_bool, check_choice, check_real
from ._checks import check_rule, real_or_schedule
from ._coefficients import _convention, _grad_scale, finite_float, retime_from_one, step_number
from ._functional import Arrays, dense_step

__all__ = ["RMSprop", "rmsprop_step_inplace", "sparse_rmsprop_step_inplace"]

FLAG_CENTERED = 4     # FA_CENTERED in rmsprop.h (a test reads the header)
FLAG_RMS_MOMENTUM = 8  # FA_RMS_MOMENTUM
RMSPROP_CONVENTIONS = ("torch", "keras")
#: lr, alpha (Keras: rho) and eps when not given, by convention
RMSPROP_DEFAULTS = {"torch": (1e-2, 0.99, 1e-8), "keras": (1e-3, 0.9, 1e-7)}
FIELDS = ("lr", "alpha", "momentum", "buf_in", "eps_in", "eps_out", "sign", "grad_scale", "l2")
_FINITE32 = ((0, "lr"), (3, "lr"), (4, "eps"), (5, "eps"), (7, "grad_scale"), (8, "weight_decay"))
_NONZERO32 = ((4, "eps"), (5, "eps"), (7, "grad_scale"))
#: One rule per hyper-parameter, (low, high) of a closed range (None: no upper bound).  Every
#: entry point reads it through the fold: the functional and sparse steps, prepare_step (the
#: spec's fold), the RMSprop object (check_group folds; so does each step) and fastadam.torch's
#: RMSprop (its steps are the functional ones); tests/optimizer_table.py makes error rows of it.
HYPER_RULES = {"lr": (0.0, None), "alpha": (0.0, 1.0), "eps": (0.0, None),
               "weight_decay": (0.0, None), "momentum": (0.0, None)}


def rmsprop_coefficients(t, *, lr=None, alpha=None, eps=None, weight_decay=0.0, momentum=0.0,
                         centered=False, maximize=False, convention="torch", grad_scale=None):
    """The coefficient object of RMSprop's step ``t`` (formula: include/fastadam/rmsprop.h).
    ``lr``, ``alpha``, ``eps`` None: the convention's defaults."""
    _convention(convention, RMSPROP_CONVENTIONS)
    d_lr, d_alpha, d_eps = RMSPROP_DEFAULTS[convention]
    rules = HYPER_RULES
    lr = check_rule(finite_float(d_lr if lr is None else lr, "lr"), "lr", rules["lr"])
    alpha = check_rule(finite_float(d_alpha if alpha is None else alpha, "alpha"), "alpha",
                       rules["alpha"])
    eps = check_rule(finite_float(d_eps if eps is None else eps, "eps"), "eps", rules["eps"])
    weight_decay = check_rule(finite_float(weight_decay, "weight_decay"), "weight_decay",
                              rules["weight_decay"])
    momentum = check_rule(finite_float(momentum, "momentum"), "momentum", rules["momentum"])
    t = step_number(t)
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1, got {t}")
    flags, divisor = _grad_scale(grad_scale)
    if weight_decay != 0.0:
        flags |= FLAG_L2
    if centered:
        flags |= FLAG_CENTERED
    step, buf_in = lr, 1.0
    if momentum > 0.0:
        flags |= FLAG_RMS_MOMENTUM
        if convention == "keras":  # the buffer accumulates lr * d; x -= buffer
            step, buf_in = 1.0, lr
    eps_in, eps_out = (eps, 0.0) if convention == "keras" else (0.0, eps)
    values = (step, alpha, momentum, buf_in, eps_in, eps_out, -1.0 if maximize else 1.0,
              divisor, weight_decay)
    return StructCoefficients(SPEC.kind, FIELDS, values, flags, divisor, _FINITE32, _NONZERO32)


def _slots_of(flags):
    """square_avg, then momentum_buffer with momentum, then grad_avg when centered."""
    return ((0,) + ((1,) if flags & FLAG_RMS_MOMENTUM else ())
            + ((2,) if flags & FLAG_CENTERED else ()))


SPEC = register(OptimizerSpec(
    name="rmsprop", fold=rmsprop_coefficients, retime=retime_from_one, fields=FIELDS,
    slots=("square_avg", "momentum_buffer", "grad_avg"),
    object_slots=("square_avg", "momentum_buffer", "grad_avg"),
    flags={"centered": FLAG_CENTERED, "momentum": FLAG_RMS_MOMENTUM}, slots_of=_slots_of,
    onnx_op=None, torch_name="RMSprop", nonnegative_slots=("square_avg",)))


def _state(coeffs, square_avg, momentum_buffer, grad_avg):
    given = {"square_avg": square_avg, "momentum_buffer": momentum_buffer, "grad_avg": grad_avg}
    slots = []
    for i in SPEC.slot_indices(coeffs.flags):
        name = SPEC.slots[i]
        if given[name] is None:
            why = "momentum > 0" if name == "momentum_buffer" else "centered=True"
            raise ValueError(f"{name}: {why} needs {name}, an array like x updated in place "
                             f"(start it at zeros)")
        slots.append((name, given[name]))
    return slots


def rmsprop_step_inplace(x: Arrays, g: Arrays, square_avg: Arrays, t: int, *,
                         momentum_buffer: Optional[Arrays] = None,
                         grad_avg: Optional[Arrays] = None, lr: Optional[float] = None,
                         alpha: Optional[float] = None, eps: Optional[float] = None,
                         weight_decay: float = 0.0, momentum: float = 0.0,
                         centered: bool = False, maximize: bool = False,
                         convention: str = "torch", grad_scale: Optional[float] = None,
                         skip_nonfinite: bool = False, num_threads: Optional[int] = None) -> bool:
    """One fused RMSprop step, in place, on one array or a list of arrays.

    Per element (scalars folded in float64 once per call; float16 computed in float32)::

        g' = (-1 if maximize else 1) * g / grad_scale
        g' = g' + weight_decay * x
        v  = alpha * v + (1 - alpha) * g'**2                 # v = square_avg
        a  = alpha * a + (1 - alpha) * g'                    # centered (a = grad_avg)
        w  = max(v - a**2, 0) if centered else v
        d  = g' / (sqrt(w) + eps)                            # "torch"
        d  = g' / sqrt(w + eps)                              # "keras"
        b  = momentum * b + d;       x = x - lr * b          # "torch", momentum > 0 (b = buffer)
        b  = momentum * b + lr * d;  x = x - b               # "keras", momentum > 0
        x  = x - lr * d                                      # momentum == 0

    The clamp at 0 of the centered ``w``: ``v - a**2`` is a variance, never negative in exact
    arithmetic, but rounding (and more so 8-bit states, which quantize ``v`` and ``a`` each on
    its own block scale) can make it negative, and its square root NaN; a negative ``w`` reads
    as 0, and the step is then ``g' / eps`` ("torch") or ``g' / sqrt(eps)`` ("keras"): large,
    but finite.

    ``"torch"`` is ``torch.optim.RMSprop`` (defaults lr 1e-2, alpha 0.99, eps 1e-8);
    ``"keras"`` is Keras 3's ``RMSprop`` and TF1's ``ApplyRMSProp``/``ApplyCenteredRMSProp``
    (``alpha`` is Keras's ``rho``; defaults lr 1e-3, rho 0.9, eps 1e-7; weight decay here is
    coupled, as torch's).  The two momentum forms agree while ``lr`` is constant.

    Parameters
    ----------
    x, g, square_avg : ndarray or list of ndarray
        Parameters, gradient and the running average of squared gradients, as ``x, g, m`` in
        :func:`fastadam.step_inplace` (``x``, ``square_avg`` updated in place).
    t : int
        Step number (>= 1; RMSprop's update does not depend on it).
    momentum_buffer, grad_avg : like ``x``, required with ``momentum > 0`` / ``centered=True``
        Updated in place; start them at zeros.
    grad_scale, skip_nonfinite, num_threads
        As in :func:`fastadam.step_inplace`.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    coeffs = rmsprop_coefficients(t, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                  momentum=momentum, centered=centered, maximize=maximize,
                                  convention=convention, grad_scale=grad_scale)
    return dense_step(coeffs, x, g, _state(coeffs, square_avg, momentum_buffer, grad_avg),
                      skip_nonfinite, num_threads)


def sparse_rmsprop_step_inplace(x: np.ndarray, grad: Any, square_avg: np.ndarray, t: int, *,
                                momentum_buffer: Optional[np.ndarray] = None,
                                grad_avg: Optional[np.ndarray] = None, mode: str = "lazy",
                                last_step: Optional[np.ndarray] = None,
                                lr: Optional[float] = None, alpha: Optional[float] = None,
                                eps: Optional[float] = None, weight_decay: float = 0.0,
                                momentum: float = 0.0, centered: bool = False,
                                maximize: bool = False, convention: str = "torch",
                                indices_sorted_unique: bool = False,
                                num_threads: Optional[int] = None) -> None:
    """One RMSprop step with a sparse gradient, in place.

    The update of a row is :func:`fastadam.rmsprop_step_inplace`'s formula, with ``g`` the
    row's summed gradient.  Modes, gradient forms, ``indices_sorted_unique``, weight-decay rule
    and checks are those of :func:`fastadam.sparse_step_inplace`; ``"catchup"`` decays
    ``square_avg`` and ``grad_avg`` by ``alpha`` and the momentum buffer by ``momentum`` once
    per missed step.  The sparse walk keeps at most two state arrays: ``centered=True`` with
    ``momentum > 0`` is not available (ValueError).
    """
    from ._sparse_functional import sparse_step

    coeffs = rmsprop_coefficients(t, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                  momentum=momentum, centered=centered, maximize=maximize,
                                  convention=convention)
    if centered and coeffs.flags & FLAG_RMS_MOMENTUM:
        raise ValueError("centered: the sparse RMSprop step keeps at most two state arrays; "
                         "centered=True with momentum > 0 needs three (use a dense gradient)")
    return sparse_step(coeffs, x, grad, _state(coeffs, square_avg, momentum_buffer, grad_avg),
                       t, mode, last_step, num_threads, indices_sorted_unique)


SPARSE_MODES = ("lazy", "dense")


class RMSprop(Optimizer):
    """RMSprop over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per element, as :func:`fastadam.rmsprop_step_inplace` documents (``"torch"``)::

        v = alpha*v + (1-alpha)*g**2;  b = momentum*b + g/(sqrt(v) + eps);  x -= lr*b

    Slots: ``"square_avg"``, ``"momentum_buffer"`` (kept for every parameter, so a group's
    momentum may change; only read when momentum > 0) and, with ``centered=True``,
    ``"grad_avg"``.

    Parameters
    ----------
    params, clip_grad_norm, num_threads, sparse_mode
        As for :class:`fastadam.Adam`.
    state_dtype, block_size, quant_map, param_rounding, master_weights, seed, min_8bit_size
        Low-precision states and bfloat16 parameters, as for :class:`fastadam.Adam`.
    lr, alpha, eps : float, optional
        None: the convention's default (torch 1e-2, 0.99, 1e-8; keras 1e-3, 0.9, 1e-7).
        ``lr`` may be a schedule.
    weight_decay, momentum : float
        >= 0.
    centered : bool
        Fixed for the optimizer (it decides the slots).
    maximize : bool
    convention : {"torch", "keras"}
    """

    group_keys = ("lr", "alpha", "eps", "weight_decay", "momentum", "maximize", "convention",
                  "sparse_mode")
    structural_options = ("centered",)

    def __init__(self, params: ParamsLike, lr: Any = None, alpha: Optional[float] = None,
                 eps: Optional[float] = None, weight_decay: float = 0.0, momentum: float = 0.0,
                 centered: bool = False, maximize: bool = False, convention: str = "torch",
                 sparse_mode: str = "lazy", clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None, state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        super().__init__(params, dict(
            lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
            centered=centered, maximize=maximize, convention=convention,
            sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm, num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        h["convention"] = check_choice(h["convention"], "convention", RMSPROP_CONVENTIONS)
        lr, alpha, eps = RMSPROP_DEFAULTS[h["convention"]]
        # types here; the ranges are HYPER_RULES's, applied by the fold below
        h["lr"] = real_or_schedule(lr if h["lr"] is None else h["lr"])
        h["alpha"] = check_real(alpha if h["alpha"] is None else h["alpha"], "alpha", None)
        h["eps"] = check_real(eps if h["eps"] is None else h["eps"], "eps", None)
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay", None)
        h["momentum"] = check_real(h["momentum"], "momentum", None)
        h["maximize"] = check_bool(h["maximize"], "maximize")
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        rmsprop_coefficients(1, **self._scalars(h, 0.0 if callable(h["lr"]) else h["lr"]))
        return h

    def _scalars(self, h: Dict[str, Any], lr: float) -> Dict[str, Any]:
        return dict(lr=lr, alpha=h["alpha"], eps=h["eps"], weight_decay=h["weight_decay"],
                    momentum=h["momentum"], centered=self._options["centered"],
                    maximize=h["maximize"], convention=h["convention"])

    spec_name = "rmsprop"

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("square_avg", 0.0), ("momentum_buffer", 0.0)] + (
            [("grad_avg", 0.0)] if self._options["centered"] else [])

    def step_hyper(self, h, lr, grad_scale):
        return dict(self._scalars(h, lr), grad_scale=grad_scale)

    def sparse_unsupported(self, h: Dict[str, Any]) -> Optional[str]:
        if self._options["centered"] and h["momentum"] > 0:
            return ("centered=True with momentum > 0 (the sparse RMSprop step keeps at most "
                    "two state arrays)")
        return None
