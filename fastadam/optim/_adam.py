"""``Adam`` and ``AdamW``: the optimizer objects over ``step_inplace`` / ``sparse_step_inplace``.

Design: hyper-parameters are checked here for their type and the torch-style rules (``lr`` and
``weight_decay`` >= 0, flags are bools), then by the functional step's own fold (``_coefficients.py``, no arrays involved),
so the ranges (``0 <= beta < 1``, ``eps > 0``) are written once, in the
functional step.  ``eps`` defaults to the convention's library default.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from ._base import (Optimizer, ParamsLike, check_bool, check_choice, check_lr, check_real)
from ._coefficients import adam_coefficients

__all__ = ["Adam", "AdamW", "SparseAdam"]

#: eps when not given: each convention's library default (PyTorch, TensorFlow/Keras, ONNX)
ADAM_EPS = {"torch": 1e-8, "tf": 1e-7, "onnx": 1e-6}
SPARSE_MODES = ("lazy", "dense")
LR = Union[float, Callable[[int], float]]


class Adam(Optimizer):
    """Adam over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per element, as :func:`fastadam.step_inplace` documents (``betas = (beta1, beta2)``)::

        m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g**2;  x -= alpha*m/(sqrt(v)*s + eps)

    Parameters
    ----------
    params : ndarray, Tensor, list of them, or list of dicts (parameter groups)
        C-contiguous, writable float16/float32/float64 arrays (several dtypes may be mixed; one
        compiled call per group and dtype).  A group dict holds ``"params"`` and any of the
        hyper-parameters below except ``amsgrad``, ``clip_grad_norm`` and ``num_threads``.
    lr : float or callable
        Learning rate >= 0, or a schedule ``lr(k)`` of the number ``k`` of steps already
        applied (see :mod:`fastadam.optim.schedules`).
    betas, eps, weight_decay, decoupled_weight_decay, post_decay, amsgrad, nesterov, maximize
        As in :func:`fastadam.step_inplace`.  ``eps=None``: the convention's default (torch
        1e-8, tf 1e-7, onnx 1e-6).  ``weight_decay >= 0``.
    convention : {"torch", "tf", "onnx"}
        The formula (default ``"torch"``, as ``torch.optim.Adam``).
    sparse_mode : {"lazy", "dense"}
        How sparse gradients (IndexedSlices, CSR) update (:func:`fastadam.sparse_step_inplace`).
        Sparse gradients cannot be combined with amsgrad, nesterov or post_decay.  A sparse
        gradient takes this optimizer's ``convention`` (default ``"torch"``: epsilon added to
        the bias-corrected ``sqrt(v)``); ``torch.optim.SparseAdam`` adds it to the uncorrected
        ``sqrt(v)`` (``convention="tf"``): :class:`SparseAdam` reproduces it.  A dense gradient
        for a parameter that had sparse ones warns once (from then on every row steps).
    clip_grad_norm : float, optional
        Clip the global norm of all gradients to this value before the step (torch's
        ``clip_grad_norm_`` rule), at the cost of one extra read of the gradients.
    num_threads : int, optional
        OpenMP threads per call (results are identical for any count).
    state_dtype : {"float32", "bfloat16", "int8"}
        How the state slots are stored (default ``"float32"``: today's arrays and kernels).
        ``"bfloat16"``: ``ml_dtypes.bfloat16`` arrays; ``"int8"``: a
        :class:`fastadam.optim.QuantizedState` per slot (uint8 codes, one float32 scale per
        ``block_size`` elements).  The update is computed in float32; low-precision states
        need float32 or bfloat16 parameters, and step sparse gradients lazily only
        (``sparse_mode="dense"`` is refused).  See the guide page "Low-precision optimizer
        states".
    block_size : int
        8-bit states: elements per scale, in [8, 4096] (default 256); a parameter stepped by
        sparse gradients needs rows that are whole blocks.
    quant_map : {"dynamic", "linear"}
        8-bit states: the quantization map (default the dynamic tree map of Dettmers et al.).
    param_rounding : {"nearest", "stochastic"}
        How bfloat16 parameters are written back (default to nearest even); stochastic
        rounding draws its bits from (``seed``, step, tensor, element), so it is reproducible
        and independent of the thread count.
    master_weights : bool
        Keep a float32 master copy of each bfloat16 parameter (in the state and checkpoints):
        the step updates it and writes the parameter as its nearest bfloat16.
    seed : int
        Seed of stochastic rounding, in [0, 2**64).
    min_8bit_size : int
        With ``state_dtype="int8"``, a parameter of fewer elements keeps float32 states (and
        steps exactly as with ``state_dtype="float32"``); default 4096, as bitsandbytes'
        8-bit optimizers; ``0``: every parameter in 8 bits.  An int >= 0.  bfloat16 states
        are not affected.
    """

    group_keys = ("lr", "betas", "eps", "convention", "weight_decay", "decoupled_weight_decay",
                  "post_decay", "nesterov", "maximize", "sparse_mode")
    structural_options = ("amsgrad",)
    spec_name = "adam"
    _decoupled: Optional[bool] = None  # None: per group; AdamW: always

    def __init__(self, params: ParamsLike, lr: LR = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: Optional[float] = None,
                 convention: str = "torch", weight_decay: float = 0.0,
                 decoupled_weight_decay: bool = False, post_decay: float = 0.0,
                 amsgrad: bool = False, nesterov: bool = False, maximize: bool = False,
                 sparse_mode: str = "lazy", clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None, state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, convention=convention, weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay, post_decay=post_decay,
            amsgrad=amsgrad, nesterov=nesterov, maximize=maximize, sparse_mode=sparse_mode,
            clip_grad_norm=clip_grad_norm, num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        h["lr"] = check_lr(h["lr"])
        try:
            beta1, beta2 = h["betas"]
        except (TypeError, ValueError):
            raise TypeError(f"betas: expected a pair (beta1, beta2), got {h['betas']!r}") from None
        h["betas"] = (check_real(beta1, "beta1", None), check_real(beta2, "beta2", None))
        h["convention"] = check_choice(h["convention"], "convention", tuple(ADAM_EPS))
        if h["eps"] is None:
            h["eps"] = ADAM_EPS[h["convention"]]
        h["eps"] = check_real(h["eps"], "eps", None)
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay")
        h["post_decay"] = check_real(h["post_decay"], "post_decay")
        for key in ("decoupled_weight_decay", "nesterov", "maximize"):
            if key in h:
                h[key] = check_bool(h[key], key)
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        # the functional step's own range checks: its fold, on no arrays
        adam_coefficients(1, 0.0 if callable(h["lr"]) else h["lr"], h["betas"][0],
                          h["betas"][1], h["eps"], h["convention"], h["weight_decay"], False,
                          h["post_decay"])
        return h

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("m", 0.0), ("v", 0.0)] + ([("v_max", 0.0)] if self._options["amsgrad"] else [])

    def _decoupled_of(self, h: Dict[str, Any]) -> bool:
        return self._decoupled if self._decoupled is not None else h["decoupled_weight_decay"]

    def step_hyper(self, h, lr, grad_scale):
        return dict(lr=lr, beta1=h["betas"][0], beta2=h["betas"][1], eps=h["eps"],
                    convention=h["convention"], weight_decay=h["weight_decay"],
                    decoupled_weight_decay=self._decoupled_of(h), post_decay=h["post_decay"],
                    amsgrad=self._options["amsgrad"], nesterov=h["nesterov"],
                    maximize=h["maximize"], grad_scale=grad_scale)

    def sparse_unsupported(self, h: Dict[str, Any]) -> Optional[str]:
        if self._options["amsgrad"]:
            return "amsgrad=True (the sparse Adam step keeps no v_max)"
        if h["nesterov"]:
            return "nesterov=True (the sparse Adam step has no Nesterov form)"
        if h["post_decay"]:
            return "post_decay != 0 (the sparse Adam step has no post-decay)"
        return None

    # the moments as lists, one array per parameter (the arrays the steps update)
    @property
    def m(self) -> List[np.ndarray]:
        return list(self._slots["m"])

    @property
    def v(self) -> List[np.ndarray]:
        return list(self._slots["v"])

    @property
    def v_max(self) -> Optional[List[np.ndarray]]:
        return list(self._slots["v_max"]) if "v_max" in self._slots else None

    @classmethod
    def from_torch(cls, torch_optimizer: Any) -> "Adam":
        """An optimizer that continues a ``torch.optim.Adam`` / ``AdamW``: its parameters are
        NumPy views of the torch parameters (CPU, contiguous; updated in place, so the torch
        model sees every step), its groups carry torch's hyper-parameters (convention
        ``"torch"``), and its ``m``, ``v``, ``v_max`` and ``t`` are copies of torch's
        ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` and ``step`` (which must be equal for
        every parameter that has state)."""
        from ._torch import adam_from_torch
        return adam_from_torch(cls, torch_optimizer, issubclass(cls, AdamW))


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``): ``x *= 1 - lr*weight_decay``
    before the Adam update; ``weight_decay`` defaults to 1e-2.  Other arguments as
    :class:`Adam`."""

    group_keys = tuple(k for k in Adam.group_keys if k != "decoupled_weight_decay")
    _decoupled = True

    def __init__(self, params: ParamsLike, lr: LR = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: Optional[float] = None,
                 convention: str = "torch", weight_decay: float = 1e-2, post_decay: float = 0.0,
                 amsgrad: bool = False, nesterov: bool = False, maximize: bool = False,
                 sparse_mode: str = "lazy", clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None, state_dtype: str = "float32",
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", master_weights: bool = False, seed: int = 0,
                 min_8bit_size: int = 4096):
        Optimizer.__init__(self, params, dict(
            lr=lr, betas=betas, eps=eps, convention=convention, weight_decay=weight_decay,
            post_decay=post_decay, amsgrad=amsgrad, nesterov=nesterov, maximize=maximize,
            sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm, num_threads=num_threads,
            state_dtype=state_dtype, block_size=block_size,
            quant_map=quant_map, param_rounding=param_rounding, master_weights=master_weights,
            seed=seed, min_8bit_size=min_8bit_size))


class SparseAdam(Adam):
    """``torch.optim.SparseAdam``: lazy Adam for sparse gradients with torch's formula and
    defaults (``lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False``)::

        m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g**2          (touched rows only)
        x -= lr*sqrt(1-beta2**t)/(1-beta1**t) * m/(sqrt(v) + eps)

    that is :func:`fastadam.sparse_step_inplace` with ``convention="tf"``, ``mode="lazy"``.
    Like torch's, it takes sparse gradients only (IndexedSlices, CSR)
    and has no weight decay; a dense gradient raises before anything changes.
    """

    dense_gradients = False

    def __init__(self, params: ParamsLike, lr: LR = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False, clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None):
        Optimizer.__init__(self, params, dict(
            lr=lr, betas=betas, eps=eps, convention="tf", weight_decay=0.0,
            decoupled_weight_decay=False, post_decay=0.0, amsgrad=False, nesterov=False,
            maximize=maximize, sparse_mode="lazy", clip_grad_norm=clip_grad_norm,
            num_threads=num_threads))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = super().check_group(hyper)
        fixed = dict(convention="tf", weight_decay=0.0, post_decay=0.0, nesterov=False,
                     sparse_mode="lazy")
        for key, value in fixed.items():
            if h[key] != value:
                raise ValueError(f"{key}: SparseAdam has torch.optim.SparseAdam's fixed "
                                 f"{key}={value!r}; got {h[key]!r} (use fastadam.Adam)")
        return h
