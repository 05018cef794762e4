"""``SGD``: stochastic gradient descent with momentum, over ``momentum_step_inplace``.

Design as ``_adam.py``: ``lr`` and ``weight_decay`` >= 0 are checked here (torch's rule); the
functional step's coefficients check the rest (torch convention: ``momentum >= 0``, Nesterov
needs ``momentum > 0`` and ``dampening == 0``, ``momentum == 0`` is plain SGD whatever the
dampening, as in torch.optim.SGD).  The step number follows each convention:
ONNX's ``T`` counts the steps already applied (``T == 0``: first step, ``beta = 1``), torch's
first step is 1 (the buffer starts as the gradient).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ._coefficients import MOMENTUM_CONVENTIONS, momentum_coefficients
from ._base import Optimizer, ParamsLike, check_bool, check_choice, check_lr, check_real

__all__ = ["SGD"]

SPARSE_MODES = ("lazy", "dense")



class SGD(Optimizer):
    """SGD with momentum over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per element (``"torch"``, as ``torch.optim.SGD``; see :func:`fastadam.momentum_step_inplace`
    for ``"onnx"``)::

        g' = (-g if maximize else g) + weight_decay*x
        b  = g' on the first step, else momentum*b + (1 - dampening)*g'
        x -= lr * (g' + momentum*b if nesterov else b)

    with ``b`` the slot ``"momentum_buffer"``.

    Parameters
    ----------
    params, clip_grad_norm, num_threads, sparse_mode
        As for :class:`fastadam.Adam`.
    state_dtype, block_size, quant_map, param_rounding, master_weights, seed, min_8bit_size
        Low-precision states and bfloat16 parameters, as for :class:`fastadam.Adam`.
    lr : float or callable
        >= 0 (default 1e-3, as torch), or a schedule.
    momentum, dampening, weight_decay : float
    nesterov, maximize : bool
    convention : {"torch", "onnx"}
    """

    group_keys = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize",
                  "convention", "sparse_mode")

    def __init__(self, params: ParamsLike, lr: Any = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 maximize: bool = False, convention: str = "torch", sparse_mode: str = "lazy",
                 clip_grad_norm: Optional[float] = None, num_threads: Optional[int] = None,
                 state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        super().__init__(params, dict(
            lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
            weight_decay=weight_decay, maximize=maximize, convention=convention,
            sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm, num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        h["lr"] = check_lr(h["lr"])
        h["momentum"] = check_real(h["momentum"], "momentum", None)
        h["dampening"] = check_real(h["dampening"], "dampening", None)
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay")
        h["nesterov"] = check_bool(h["nesterov"], "nesterov")
        h["maximize"] = check_bool(h["maximize"], "maximize")
        h["convention"] = check_choice(h["convention"], "convention", MOMENTUM_CONVENTIONS)
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        lr_now = 0.0 if callable(h["lr"]) else h["lr"]
        momentum_coefficients(1, **self._scalars(h, lr_now))  # the step's own checks (its fold)
        return h

    @staticmethod
    def _scalars(h: Dict[str, Any], lr: float) -> Dict[str, Any]:
        return dict(lr=lr, momentum=h["momentum"], dampening=h["dampening"],
                    nesterov=h["nesterov"], weight_decay=h["weight_decay"],
                    maximize=h["maximize"], convention=h["convention"])

    @staticmethod
    def _step_number(t: int, h: Dict[str, Any]) -> int:
        return t if h["convention"] == "onnx" else t + 1

    spec_name = "momentum"

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("momentum_buffer", 0.0)]

    def step_hyper(self, h, lr, grad_scale):
        return dict(self._scalars(h, lr), grad_scale=grad_scale)
