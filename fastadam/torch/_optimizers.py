"""fastadam's optimizers as ``torch.optim.Optimizer`` subclasses (see ``_optimizer.py``).

Each class takes the arguments of its ``torch.optim`` namesake, with the same defaults and the
same formula (fastadam's ``"torch"`` convention), and keeps torch's state names, so a
``torch.optim`` checkpoint loads into it and back.  ``foreach`` and ``fused`` are accepted and
ignored (every step is one fused, multi-threaded compiled call per group and dtype);
``capturable`` and ``differentiable`` must stay False.  ``num_threads`` is fastadam's own.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from .. import (rowwise_adagrad_step_inplace, sparse_adagrad_step_inplace,
                sparse_lion_step_inplace, sparse_momentum_step_inplace,
                sparse_rmsprop_step_inplace, sparse_rowwise_adagrad_step_inplace,
                sparse_step_inplace)
from ..optim import optimizer_spec
from ._formats import check_state_options, state_format
from ._optimizer import FastadamOptimizer, check_range, flag, new_step, number, param_name

__all__ = ["Adagrad", "Adam", "AdamW", "Lion", "RMSprop", "RowWiseAdagrad", "SGD", "SparseAdam"]


def _zeros(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p, memory_format=torch.contiguous_format)


def _betas(group: Dict[str, Any], closed: bool = False) -> Tuple[float, float]:
    """The group's (beta1, beta2): in [0, 1), or in [0, 1] when ``closed`` (Lion's, whose
    beta 1 is legal: the interpolation then keeps the momentum, as fastadam.Lion allows)."""
    try:
        beta1, beta2 = group["betas"]
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {group['betas']!r}") \
            from None
    return (check_range(number(beta1, "betas[0]"), "betas[0]", 0.0, 1.0, high_open=not closed),
            check_range(number(beta2, "betas[1]"), "betas[1]", 0.0, 1.0, high_open=not closed))


# ---- torch's constructor checks, in torch's order and with its messages, before the parameter
# list is read (a value that is not a number gets a TypeError naming the argument first)

def _torch_lr(lr: Any, tensor_refused: bool = False) -> None:
    if isinstance(lr, torch.Tensor):
        if tensor_refused:
            raise ValueError("lr as a Tensor is not supported for capturable=False and "
                             "foreach=True")
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= number(lr, "lr"):
        raise ValueError(f"Invalid learning rate: {lr} (lr must be >= 0)")


def _torch_min(value: Any, name: str, what: str, strict: bool = False) -> None:
    v = number(value, name)
    if not (0.0 < v if strict else 0.0 <= v):
        raise ValueError(f"Invalid {what}: {value} ({name} must be {'>' if strict else '>='} 0)")


def _torch_betas(betas: Any) -> None:
    try:
        b0, b1 = betas
    except (TypeError, ValueError):
        raise TypeError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
    for k, b in enumerate((b0, b1)):
        if isinstance(b, torch.Tensor) and b.numel() != 1:
            raise ValueError(f"Tensor betas[{k}] must be 1-element")
        if not 0.0 <= number(b, f"betas[{k}]") < 1.0:
            raise ValueError(f"Invalid beta parameter at index {k}: {b} (betas[{k}] must be "
                             f"in [0, 1))")


def _torch_adam_checks(lr, betas, eps, weight_decay, foreach, capturable) -> None:
    """torch.optim.Adam's (and AdamW's) constructor checks."""
    _torch_lr(lr, isinstance(lr, torch.Tensor) and bool(foreach) and not capturable)
    _torch_min(eps, "eps", "epsilon value")
    _torch_betas(betas)
    _torch_min(weight_decay, "weight_decay", "weight_decay value")
    b0, b1 = betas
    if not ((isinstance(b0, float) and isinstance(b1, float))
            or (isinstance(b0, torch.Tensor) and isinstance(b1, torch.Tensor))):
        raise ValueError("betas must be either both floats or both Tensors")
    for k, b in enumerate(betas):
        if isinstance(b, torch.Tensor) and foreach and not capturable:
            raise ValueError(f"betas[{k}] as a Tensor is not supported for capturable=False "
                             f"and foreach=True")


def _as_list(params: Any) -> list:
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _scalar_betas(betas: Any) -> Tuple[float, float]:
    return tuple(float(b.item()) if isinstance(b, torch.Tensor) else b for b in betas)


def _adam_hyper(h: Dict[str, Any]) -> Dict[str, Any]:
    return dict(lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"],
                convention="torch", weight_decay=h["weight_decay"],
                decoupled_weight_decay=h["decoupled_weight_decay"], amsgrad=h["amsgrad"],
                maximize=h["maximize"])


class Adam(FastadamOptimizer):
    """``torch.optim.Adam`` (and with ``decoupled_weight_decay=True`` AdamW) on fastadam's fused
    kernels.

    Per element, as :func:`fastadam.step_inplace` with ``convention="torch"``::

        g' = (-1 if maximize else 1) * g  (+ weight_decay * x unless decoupled)
        m = beta1*m + (1-beta1)*g';  v = beta2*v + (1-beta2)*g'**2
        x -= lr/(1-beta1**t) * m / (sqrt(max(v_max, v) if amsgrad else v)/sqrt(1-beta2**t) + eps)

    A sparse gradient (``nn.Embedding(sparse=True)``) takes the lazy sparse step with the same
    formula (:func:`fastadam.sparse_step_inplace`, ``convention="torch"``): only the rows it
    touches change, and weight decay applies to those rows only.  This is not the formula of
    ``torch.optim.SparseAdam`` (epsilon after the bias correction): use
    :class:`fastadam.torch.SparseAdam` to reproduce that one.  amsgrad takes dense gradients
    only.
    """

    _state_keys = ("exp_avg", "exp_avg_sq")
    _slot_names = {"exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "v_max"}
    _spec_name = "adam"
    _group_fill = dict(amsgrad=False, maximize=False, foreach=None, capturable=False,
                       differentiable=False, decoupled_weight_decay=False, fused=None)

    def __init__(self, params: Any, lr: Any = 1e-3, betas: Tuple[Any, Any] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, decoupled_weight_decay: bool = False,
                 num_threads: Optional[int] = None, state_dtype: Optional[str] = None,
                 master_weights: bool = False):
        _torch_adam_checks(lr, betas, eps, weight_decay, foreach, capturable)
        defaults = dict(lr=lr, betas=_scalar_betas(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults, num_threads, state_dtype, master_weights)

    def _check_group(self, group):
        beta1, beta2 = _betas(group)
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    beta1=beta1, beta2=beta2,
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    amsgrad=flag(group["amsgrad"], "amsgrad"),
                    maximize=flag(group["maximize"], "maximize"),
                    decoupled_weight_decay=flag(group.get("decoupled_weight_decay", False),
                                                "decoupled_weight_decay"))

    def _state_init(self, p, group):
        state = dict(step=new_step(), exp_avg=_zeros(p), exp_avg_sq=_zeros(p))
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = _zeros(p)
        return state

    def _slot_keys(self, group):
        return self._state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _hyper(self, h):
        return _adam_hyper(h)

    def _sparse_refused(self, h):
        return "amsgrad=True (dense gradients only)" if h["amsgrad"] else None

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_step_inplace(x, grad, slots[0], slots[1], t, mode="lazy", lr=h["lr"],
                            beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"],
                            convention="torch", weight_decay=h["weight_decay"],
                            decoupled_weight_decay=h["decoupled_weight_decay"],
                            maximize=h["maximize"], num_threads=self.num_threads)


class AdamW(Adam):
    """``torch.optim.AdamW``: :class:`Adam` with decoupled weight decay (default 0.01)."""

    def __init__(self, params: Any, lr: Any = 1e-3, betas: Tuple[Any, Any] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, num_threads: Optional[int] = None,
                 state_dtype: Optional[str] = None, master_weights: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, num_threads=num_threads,
                         state_dtype=state_dtype, master_weights=master_weights)

    def _check_group(self, group):
        group["decoupled_weight_decay"] = True
        return super()._check_group(group)

    _group_fill = {**Adam._group_fill, "decoupled_weight_decay": True}


class SparseAdam(FastadamOptimizer):
    """``torch.optim.SparseAdam``: lazy Adam for sparse gradients, with torch's formula.

    torch's SparseAdam adds epsilon after the bias correction (TensorFlow's form)::

        m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g**2      (touched rows only)
        x -= lr*sqrt(1-beta2**t)/(1-beta1**t) * m / (sqrt(v) + eps)

    which is :func:`fastadam.sparse_step_inplace` with ``convention="tf"``, ``mode="lazy"``.
    Like torch's, it refuses dense gradients and has no weight decay.
    """

    _state_keys = ("exp_avg", "exp_avg_sq")
    _takes_dense = False

    def __init__(self, params: Any, lr: Any = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False, *,
                 num_threads: Optional[int] = None):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        _torch_min(lr, "lr", "learning rate", strict=True)
        _torch_min(eps, "eps", "epsilon value", strict=True)
        _torch_betas(betas)
        # torch's checks of the parameters (a Tensor ``params`` is refused by torch's base)
        params = params if isinstance(params, torch.Tensor) else list(params)
        groups = ([] if isinstance(params, torch.Tensor) else params
                  if params and isinstance(params[0], dict) else [{"params": params}])
        sparse = [[gi, i] for gi, g in enumerate(groups)
                  for i, q in enumerate(_as_list(g.get("params", [])))
                  if isinstance(q, torch.Tensor) and q.is_sparse]
        if sparse:
            raise ValueError(f"Sparse params at indices {sparse}: SparseAdam requires dense "
                             f"parameter tensors")
        complex_ = [[gi, i] for gi, g in enumerate(groups)
                    for i, q in enumerate(_as_list(g.get("params", [])))
                    if isinstance(q, torch.Tensor) and q.is_complex()]
        if complex_:
            raise ValueError(f"Complex params at indices {complex_}: SparseAdam does not "
                             f"support complex parameters")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize),
                         num_threads)

    def _check_group(self, group):
        if group.get("state_dtype") is not None or group.get("master_weights"):
            raise ValueError("state_dtype, master_weights: SparseAdam keeps its states in the "
                             "parameter's dtype (the lazy sparse step); use "
                             "fastadam.torch.Adam for low-precision states")
        beta1, beta2 = _betas(group)
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0, None),
                    beta1=beta1, beta2=beta2,
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    maximize=flag(group["maximize"], "maximize"))

    _slot_names = {"exp_avg": "m", "exp_avg_sq": "v"}

    def _state_init(self, p, group):
        # torch's SparseAdam counts steps in a Python int
        return dict(step=0, exp_avg=_zeros(p), exp_avg_sq=_zeros(p))

    def _step_tensor(self, value):
        return value

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_step_inplace(x, grad, slots[0], slots[1], t, mode="lazy", lr=h["lr"],
                            beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"], convention="tf",
                            maximize=h["maximize"], num_threads=self.num_threads)


class Adagrad(FastadamOptimizer):
    """``torch.optim.Adagrad`` (:func:`fastadam.adagrad_step_inplace`, ``convention="torch"``):
    ``h += g'**2;  x -= lr/(1+(t-1)*lr_decay) * g'/(sqrt(h)+eps)``.  As in torch, the
    accumulator ``sum`` of every parameter starts at the constructor's
    ``initial_accumulator_value`` (a group's own value is kept in the group and not used).  A
    sparse gradient updates only its rows (:func:`fastadam.sparse_adagrad_step_inplace`)."""

    _state_keys = ("sum",)
    _slot_names = {"sum": "h"}
    _spec_name = "adagrad"
    _group_fill = dict(foreach=None, maximize=False, differentiable=False, fused=None)

    def __init__(self, params: Any, lr: Any = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach: Optional[bool] = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 num_threads: Optional[int] = None, state_dtype: Optional[str] = None,
                 master_weights: bool = False):
        _torch_lr(lr)
        _torch_min(lr_decay, "lr_decay", "lr_decay value")
        _torch_min(weight_decay, "weight_decay", "weight_decay value")
        _torch_min(initial_accumulator_value, "initial_accumulator_value",
                   "initial_accumulator_value value")
        _torch_min(eps, "eps", "epsilon value")
        check_range(number(initial_accumulator_value, "initial_accumulator_value"),
                    "initial_accumulator_value", 0.0)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults, num_threads, state_dtype, master_weights)
        for gi, group in enumerate(self.param_groups):  # torch fills the state now
            formats = check_state_options(group)
            for i, p in enumerate(group["params"]):
                self.state[p] = self._make_state(
                    p, group, *state_format(p, *formats, param_name(gi, i)))

    def _check_group(self, group):
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    lr_decay=check_range(number(group["lr_decay"], "lr_decay"), "lr_decay",
                                         0.0),
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    maximize=flag(group["maximize"], "maximize"))

    def _new_slot(self, p, key):
        value = number(self.defaults["initial_accumulator_value"], "initial_accumulator_value")
        # torch fills a complex parameter's accumulator with value + value*1j (both halves of
        # its view_as_real)
        return torch.full_like(p, complex(value, value) if p.is_complex() else value,
                               memory_format=torch.contiguous_format)

    def _state_init(self, p, group):
        return dict(step=new_step(), sum=self._new_slot(p, "sum"))

    def _hyper(self, h):
        return dict(lr=h["lr"], lr_decay=h["lr_decay"], eps=h["eps"],
                    weight_decay=h["weight_decay"], maximize=h["maximize"],
                    convention="torch")

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_adagrad_step_inplace(x, grad, slots[0], t, mode="lazy",
                                    num_threads=self.num_threads, **self._hyper(h))


class SGD(FastadamOptimizer):
    """``torch.optim.SGD``.  With momentum (:func:`fastadam.momentum_step_inplace`,
    ``convention="torch"``): ``v = momentum*v + (1-dampening)*g'`` (``v = g'`` on the first
    step), ``x -= lr*v`` or, with nesterov, ``x -= lr*(g' + momentum*v)``; as in torch,
    ``momentum_buffer`` is the whole state (no ``step``).  Plain SGD (``momentum=0``) is one
    ``x -= lr*g'`` per parameter, done with torch's own in-place ops as torch.optim does it
    (no buffer: a fused kernel would need a scratch copy of every parameter)."""

    _state_keys = ("momentum_buffer",)
    _slot_names = {"momentum_buffer": "v"}
    _spec_name = "momentum"
    _counts_steps = False
    _group_fill = dict(nesterov=False, maximize=False, foreach=None, differentiable=False,
                       fused=False)

    def __init__(self, params: Any, lr: Any = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 num_threads: Optional[int] = None, state_dtype: Optional[str] = None,
                 master_weights: bool = False):
        _torch_lr(lr)
        _torch_min(momentum, "momentum", "momentum value")
        _torch_min(weight_decay, "weight_decay", "weight_decay value")
        number(dampening, "dampening")
        if flag(nesterov, "nesterov") and (number(momentum, "momentum") <= 0
                                            or number(dampening, "dampening") != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening "
                             "(nesterov=True needs momentum > 0 and dampening == 0)")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults, num_threads, state_dtype, master_weights)

    def _check_group(self, group):
        h = dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                 momentum=check_range(number(group["momentum"], "momentum"), "momentum", 0.0),
                 dampening=check_range(number(group["dampening"], "dampening"), "dampening",
                                       -math.inf),
                 weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                          "weight_decay", 0.0),
                 nesterov=flag(group["nesterov"], "nesterov"),
                 maximize=flag(group["maximize"], "maximize"))
        if h["nesterov"] and (h["momentum"] <= 0 or h["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening "
                             "(nesterov=True needs momentum > 0 and dampening == 0)")
        return h

    def _slot_keys(self, group):
        return ("momentum_buffer",) if number(group["momentum"], "momentum") != 0 else ()

    def _state_init(self, p, group):
        return dict(momentum_buffer=_zeros(p))

    def _hyper(self, h):
        return dict(lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                    nesterov=h["nesterov"], weight_decay=h["weight_decay"],
                    maximize=h["maximize"], convention="torch")

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_momentum_step_inplace(x, grad, slots[0], t, mode="lazy",
                                     num_threads=self.num_threads, **self._hyper(h))

    # plain SGD: torch's own ops, checked in the plan like every other call
    def _plain(self, h):
        return h["momentum"] == 0

    def _plain_call(self, gi, group, h):
        items = []
        for i, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            name = param_name(gi, i)
            if grad.layout is not torch.strided:
                self._indexed_slices(grad, p, name)  # checked like the kernels' sparse rows
                if h["weight_decay"] != 0:
                    raise ValueError(f"{name}: a sparse gradient cannot be used with "
                                     f"weight_decay != 0 and momentum == 0")
            elif grad.dtype != p.dtype or grad.shape != p.shape:
                raise ValueError(f"{name}: its gradient has dtype {grad.dtype} and shape "
                                 f"{tuple(grad.shape)}, expected {p.dtype} and "
                                 f"{tuple(p.shape)}")
            items.append((p, grad))
        return ("plain", items, h)

    def _apply_plain(self, call):
        """torch.optim.SGD's update, op for op: ``g = -grad if maximize``, ``g = g + wd*p``,
        ``p += -lr*g``; the dense gradients through torch's foreach ops (one call each)."""
        _, items, h = call
        lr, wd = h["lr"], h["weight_decay"]
        dense = [(p, g) for p, g in items if g.layout is torch.strided]
        if dense:
            ps, gs = [p for p, _ in dense], [g for _, g in dense]
            if h["maximize"]:
                gs = torch._foreach_neg(gs)
            if wd != 0:
                gs = torch._foreach_add(gs, ps, alpha=wd)
            torch._foreach_add_(ps, gs, alpha=-lr)
        for p, grad in items:
            if grad.layout is not torch.strided:  # sparse rows (no weight decay: checked)
                p.add_(-grad if h["maximize"] else grad, alpha=-lr)

    def _check_saved_state(self, s, p, keys, name):
        v = s.get("momentum_buffer")
        if keys and v is not None:  # absent or None: the next step is a first step
            self._check_saved_tensor(v, p, f"{name}['momentum_buffer']")


class RMSprop(FastadamOptimizer):
    """``torch.optim.RMSprop`` (:func:`fastadam.rmsprop_step_inplace`, ``convention="torch"``):
    ``v = alpha*v + (1-alpha)*g'**2``; centered: ``a = alpha*a + (1-alpha)*g'``, ``w = v - a**2``;
    ``d = g'/(sqrt(w)+eps)``; with momentum ``b = momentum*b + d; x -= lr*b``, else
    ``x -= lr*d``.  torch's state names: ``square_avg``, ``momentum_buffer`` (momentum > 0),
    ``grad_avg`` (centered).  A sparse gradient takes the lazy sparse step (not with
    ``centered`` and momentum together)."""

    _slot_names = {"square_avg": "square_avg", "momentum_buffer": "momentum_buffer",
                   "grad_avg": "grad_avg"}
    _spec_name = "rmsprop"
    _group_fill = dict(momentum=0, centered=False, foreach=None, maximize=False,
                       differentiable=False, capturable=False)

    def __init__(self, params: Any, lr: Any = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 capturable: bool = False, foreach: Optional[bool] = None,
                 maximize: bool = False, differentiable: bool = False, *,
                 num_threads: Optional[int] = None, state_dtype: Optional[str] = None,
                 master_weights: bool = False):
        _torch_lr(lr)
        _torch_min(eps, "eps", "epsilon value")
        _torch_min(momentum, "momentum", "momentum value")
        _torch_min(weight_decay, "weight_decay", "weight_decay value")
        _torch_min(alpha, "alpha", "alpha value")
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                        momentum=momentum, centered=centered, capturable=capturable,
                        foreach=foreach, maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults, num_threads, state_dtype, master_weights)

    def _check_group(self, group):
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    alpha=check_range(number(group["alpha"], "alpha"), "alpha", 0.0, 1.0,
                                      high_open=False),
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    momentum=check_range(number(group["momentum"], "momentum"), "momentum",
                                         0.0),
                    centered=flag(group["centered"], "centered"),
                    maximize=flag(group["maximize"], "maximize"))

    def _slot_keys(self, group):
        return (("square_avg",)
                + (("momentum_buffer",) if number(group["momentum"], "momentum") > 0 else ())
                + (("grad_avg",) if group["centered"] else ()))

    def _state_init(self, p, group):
        return dict(step=new_step(), **{k: _zeros(p) for k in self._slot_keys(group)})

    def _hyper(self, h):
        return dict(lr=h["lr"], alpha=h["alpha"], eps=h["eps"],
                    weight_decay=h["weight_decay"], momentum=h["momentum"],
                    centered=h["centered"], maximize=h["maximize"], convention="torch")

    def _sparse_refused(self, h):
        return ("centered=True and momentum > 0 together" if h["centered"] and h["momentum"] > 0
                else None)

    def _step_sparse(self, x, grad, slots, t, h):
        it = iter(slots[1:])
        sparse_rmsprop_step_inplace(
            x, grad, slots[0], t, mode="lazy",
            momentum_buffer=next(it) if h["momentum"] > 0 else None,
            grad_avg=next(it) if h["centered"] else None, num_threads=self.num_threads,
            **self._hyper(h))


class Lion(FastadamOptimizer):
    """Lion (Chen et al. 2023; :func:`fastadam.lion_step_inplace`), which torch.optim does not
    have: ``c = beta1*m + (1-beta1)*g'``, ``x = (1-lr*weight_decay)*x - lr*sign(c)``,
    ``m = beta2*m + (1-beta2)*g'``; state ``exp_avg`` (the name the lion-pytorch package uses).
    A sparse gradient takes the lazy sparse step."""

    _state_keys = ("exp_avg",)
    _slot_names = {"exp_avg": "m"}
    _spec_name = "lion"
    _group_fill = dict(maximize=False)

    def __init__(self, params: Any, lr: Any = 1e-4, betas: Tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, maximize: bool = False, *,
                 num_threads: Optional[int] = None, state_dtype: Optional[str] = None,
                 master_weights: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay,
                                      maximize=maximize), num_threads, state_dtype,
                         master_weights)

    def _check_group(self, group):
        beta1, beta2 = _betas(group, closed=True)  # fastadam.Lion's HYPER_RULES: [0, 1]
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0), beta1=beta1,
                    beta2=beta2,
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    maximize=flag(group["maximize"], "maximize"))

    def _state_init(self, p, group):
        return dict(step=new_step(), exp_avg=_zeros(p))

    def _hyper(self, h):
        return dict(lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
                    weight_decay=h["weight_decay"], maximize=h["maximize"])

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_lion_step_inplace(x, grad, slots[0], t, mode="lazy",
                                 num_threads=self.num_threads, **self._hyper(h))


class _RowWiseStep:
    """The dense call of one group's parameters of a row-wise optimizer, in the interface of
    the prepared steps the base class keeps (``check(t, **hyper)`` before a multi-call step
    writes, ``step(gs, t, **hyper)``): the functional step on the parameters' and
    accumulators' views (a row-wise optimizer has no prepared step yet)."""

    def __init__(self, xs, accs, num_threads):
        self.xs, self.accs, self.num_threads = xs, accs, num_threads

    def check(self, t, **hyper):
        for dtype in {x.dtype for x in self.xs}:  # the fold and its float32 checks, no write
            empty = np.empty(0, dtype)
            rowwise_adagrad_step_inplace(empty, empty, empty.copy(), t, **hyper)

    def step(self, gs, t, **hyper):
        return rowwise_adagrad_step_inplace(self.xs, gs, self.accs, t, **hyper,
                                            num_threads=self.num_threads)


class RowWiseAdagrad(FastadamOptimizer):
    """Row-wise Adagrad (:func:`fastadam.rowwise_adagrad_step_inplace`), which torch.optim does
    not have: TorchRec's ``RowWiseAdagrad`` arguments and defaults (``eps=1e-10``, L2 weight
    decay) and FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` update: per row ``r`` (the first axis),
    ``sum[r] += mean((g'+wd*x[r])**2)``, ``m = lr_t/(sqrt(sum[r])+eps)``,
    ``x[r] = (1-m*wd)*x[r] - m*g'`` (``weight_decay_mode="decoupled"``: ``1-lr_t*wd`` and
    ``sum[r] += mean(g'**2)``), ``lr_t = lr/(1+(t-1)*lr_decay)``.  State ``sum``: one value
    per row, of the parameter's dtype (float32 or float64), starting at the constructor's
    ``initial_accumulator_value``.  A sparse gradient (``nn.Embedding(sparse=True)``) takes
    the lazy sparse step: only its rows move."""

    _state_keys = ("sum",)
    _slot_names = {"sum": "acc"}
    _spec_name = "rowwise_adagrad"
    _group_fill = dict(maximize=False, weight_decay_mode="l2")

    def __init__(self, params: Any, lr: Any = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, *, maximize: bool = False, weight_decay_mode: str = "l2",
                 num_threads: Optional[int] = None):
        check_range(number(initial_accumulator_value, "initial_accumulator_value"),
                    "initial_accumulator_value", 0.0)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value,
                        maximize=maximize, weight_decay_mode=weight_decay_mode)
        super().__init__(params, defaults, num_threads)

    def _check_group(self, group):
        for p in group.get("params", ()):
            if isinstance(p, torch.Tensor) and p.dtype not in (torch.float32, torch.float64):
                raise TypeError(f"params: RowWiseAdagrad steps float32 or float64 parameters, "
                                f"got {p.dtype}")
        h = dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                 lr_decay=check_range(number(group["lr_decay"], "lr_decay"), "lr_decay", 0.0),
                 eps=number(group["eps"], "eps"),
                 weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                          "weight_decay", 0.0),
                 weight_decay_mode=group["weight_decay_mode"],
                 maximize=flag(group["maximize"], "maximize"))
        optimizer_spec(self._spec_name).fold(1, **h)  # eps > 0, the mode: the fold's rules
        return h

    def _slot_shape(self, shape, key):
        return tuple(shape[:1])

    def _new_slot(self, p, key):
        return torch.full(tuple(p.shape[:1]), number(self.defaults["initial_accumulator_value"],
                                                     "initial_accumulator_value"),
                          dtype=p.dtype)

    def _state_init(self, p, group):
        return dict(step=new_step(), sum=self._new_slot(p, "sum"))

    def _hyper(self, h):
        return dict(h)

    def _prepared_for(self, gi, dtype, ents, xs):
        return _RowWiseStep(xs, [e.views[0] for e in ents], self.num_threads)

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_rowwise_adagrad_step_inplace(x, grad, slots[0], t, mode="lazy",
                                            num_threads=self.num_threads, **self._hyper(h))
