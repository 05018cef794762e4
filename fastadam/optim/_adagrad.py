"""``Adagrad``: the optimizer object over ``adagrad_step_inplace`` and its sparse form.

Design as ``_adam.py``: type and torch-style rules here, ranges by the functional step's fold
(no arrays).  ``lr``, ``eps`` and ``initial_accumulator_value`` default to the
convention's library values.  The step number handed to the functional step follows each
convention's count: ONNX's ``T`` is the number of steps already applied (0 first), torch's and
Keras's ``step`` starts at 1.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ._coefficients import ADAGRAD_CONVENTIONS, ADAGRAD_EPS, adagrad_coefficients
from ._base import Optimizer, ParamsLike, check_bool, check_choice, check_lr, check_real

__all__ = ["Adagrad"]

#: lr and initial_accumulator_value when not given, by convention (torch.optim.Adagrad,
#: keras.optimizers.Adagrad; ONNX's R has no default, torch's is used); eps: ADAGRAD_EPS
ADAGRAD_DEFAULTS = {"torch": (1e-2, 0.0), "keras": (1e-3, 0.1), "onnx": (1e-2, 0.0)}
SPARSE_MODES = ("lazy", "dense")



class Adagrad(Optimizer):
    """Adagrad over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per element, as :func:`fastadam.adagrad_step_inplace` documents::

        r = lr / (1 + k*lr_decay);  g' = g + weight_decay*x;  h += g'**2
        x -= r * g' / (sqrt(h) + eps)          # "keras": x -= lr * g' / sqrt(h + eps)

    with ``k`` the number of steps already applied and ``h`` (slot ``"sum"``) starting at
    ``initial_accumulator_value``.

    Parameters
    ----------
    params, clip_grad_norm, num_threads, sparse_mode
        As for :class:`fastadam.Adam`.
    state_dtype, block_size, quant_map, param_rounding, master_weights, seed, min_8bit_size
        Low-precision states and bfloat16 parameters, as for :class:`fastadam.Adam`.
    lr, eps, initial_accumulator_value : float, optional
        None: the convention's default (torch 1e-2, 1e-10, 0; keras 1e-3, 1e-7, 0.1;
        onnx 1e-2, 1e-6, 0).  ``lr`` may be a schedule.
    lr_decay, weight_decay : float
        >= 0.
    maximize : bool
    convention : {"torch", "keras", "onnx"}
    """

    group_keys = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
                  "convention", "maximize", "sparse_mode")

    def __init__(self, params: ParamsLike, lr: Any = None, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: Optional[float] = None,
                 eps: Optional[float] = None, convention: str = "torch", maximize: bool = False,
                 sparse_mode: str = "lazy", clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None, state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        super().__init__(params, dict(
            lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value, eps=eps, convention=convention,
            maximize=maximize, sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm,
            num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        h["convention"] = check_choice(h["convention"], "convention", ADAGRAD_CONVENTIONS)
        lr, acc = ADAGRAD_DEFAULTS[h["convention"]]
        eps = ADAGRAD_EPS[h["convention"]]
        h["lr"] = check_lr(lr if h["lr"] is None else h["lr"])
        h["eps"] = check_real(eps if h["eps"] is None else h["eps"], "eps", None)
        acc = acc if h["initial_accumulator_value"] is None else h["initial_accumulator_value"]
        h["initial_accumulator_value"] = check_real(acc, "initial_accumulator_value")
        h["lr_decay"] = check_real(h["lr_decay"], "lr_decay", None)
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay")
        h["maximize"] = check_bool(h["maximize"], "maximize")
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        lr_now = 0.0 if callable(h["lr"]) else h["lr"]
        adagrad_coefficients(1, **self._scalars(h, lr_now))  # the step's own checks (its fold)
        return h

    @staticmethod
    def _scalars(h: Dict[str, Any], lr: float) -> Dict[str, Any]:
        return dict(lr=lr, lr_decay=h["lr_decay"], eps=h["eps"], weight_decay=h["weight_decay"],
                    maximize=h["maximize"], convention=h["convention"])

    @staticmethod
    def _step_number(t: int, h: Dict[str, Any]) -> int:
        return t if h["convention"] == "onnx" else t + 1

    spec_name = "adagrad"

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("sum", hyper["initial_accumulator_value"])]

    def step_hyper(self, h, lr, grad_scale):
        return dict(self._scalars(h, lr), grad_scale=grad_scale)
