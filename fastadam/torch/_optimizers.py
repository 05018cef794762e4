"""fastadam's optimizers as ``torch.optim.Optimizer`` subclasses (see ``_optimizer.py``).

Each class takes the arguments of its ``torch.optim`` namesake, with the same defaults and the
same formula (fastadam's ``"torch"`` convention), and keeps torch's state names, so a
``torch.optim`` checkpoint loads into it and back.  ``foreach`` and ``fused`` are accepted and
ignored (every step is one fused, multi-threaded compiled call per group and dtype);
``capturable`` and ``differentiable`` must stay False.  ``num_threads`` is fastadam's own.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import (adagrad_step_inplace, lion_step_inplace, momentum_step_inplace,
                rmsprop_step_inplace, sparse_adagrad_step_inplace, sparse_lion_step_inplace,
                sparse_momentum_step_inplace, sparse_rmsprop_step_inplace, sparse_step_inplace,
                step_inplace)
from ._optimizer import FastadamOptimizer, check_range, number, numpy_view

__all__ = ["Adagrad", "Adam", "AdamW", "Lion", "RMSprop", "SGD", "SparseAdam"]


def _zeros(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p, memory_format=torch.contiguous_format)


def _step0() -> torch.Tensor:
    return torch.tensor(0.0, dtype=torch.float32)


def _betas(group: Dict[str, Any]) -> Tuple[float, float]:
    try:
        beta1, beta2 = group["betas"]
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {group['betas']!r}") \
            from None
    return (check_range(number(beta1, "betas[0]"), "betas[0]", 0.0, 1.0),
            check_range(number(beta2, "betas[1]"), "betas[1]", 0.0, 1.0))


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

    def __init__(self, params: Any, lr: Any = 1e-3, betas: Tuple[Any, Any] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, decoupled_weight_decay: bool = False,
                 num_threads: Optional[int] = None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults, num_threads)

    def _check_group(self, group):
        beta1, beta2 = _betas(group)
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    beta1=beta1, beta2=beta2,
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    amsgrad=bool(group["amsgrad"]), maximize=bool(group["maximize"]),
                    decoupled_weight_decay=bool(group.get("decoupled_weight_decay", False)))

    def _state_init(self, p, group):
        state = dict(step=_step0(), exp_avg=_zeros(p), exp_avg_sq=_zeros(p))
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = _zeros(p)
        return state

    def _slot_keys(self, group):
        return self._state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _step_dense(self, xs, gs, slots, t, h):
        m, v = slots[0], slots[1]
        step_inplace(xs, gs, m, v, t, lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
                     eps=h["eps"], convention="torch", weight_decay=h["weight_decay"],
                     decoupled_weight_decay=h["decoupled_weight_decay"], amsgrad=h["amsgrad"],
                     v_max=slots[2] if h["amsgrad"] else None, maximize=h["maximize"],
                     num_threads=self.num_threads)

    def _step_sparse(self, x, grad, slots, t, h):
        if h["amsgrad"]:
            raise RuntimeError("amsgrad does not take sparse gradients")
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
                 fused: Optional[bool] = None, num_threads: Optional[int] = None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, num_threads=num_threads)

    def _check_group(self, group):
        group["decoupled_weight_decay"] = True
        return super()._check_group(group)


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
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize),
                         num_threads)

    def _check_group(self, group):
        beta1, beta2 = _betas(group)
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0, None),
                    beta1=beta1, beta2=beta2,
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    maximize=bool(group["maximize"]))

    def _state_init(self, p, group):
        return dict(step=_step0(), exp_avg=_zeros(p), exp_avg_sq=_zeros(p))

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_step_inplace(x, grad, slots[0], slots[1], t, mode="lazy", lr=h["lr"],
                            beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"], convention="tf",
                            maximize=h["maximize"], num_threads=self.num_threads)


class Adagrad(FastadamOptimizer):
    """``torch.optim.Adagrad`` (:func:`fastadam.adagrad_step_inplace`, ``convention="torch"``):
    ``h += g'**2;  x -= lr/(1+(t-1)*lr_decay) * g'/(sqrt(h)+eps)``.  The accumulator ``sum``
    starts at ``initial_accumulator_value`` when the optimizer is built, as in torch.  A sparse
    gradient updates only its rows (:func:`fastadam.sparse_adagrad_step_inplace`)."""

    _state_keys = ("sum",)

    def __init__(self, params: Any, lr: Any = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach: Optional[bool] = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 num_threads: Optional[int] = None):
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults, num_threads)
        for group in self.param_groups:  # torch fills the state when the optimizer is built
            for p in group["params"]:
                self._init_state(p, group)

    def _check_group(self, group):
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    lr_decay=check_range(number(group["lr_decay"], "lr_decay"), "lr_decay",
                                         0.0),
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    maximize=bool(group["maximize"]),
                    initial=check_range(number(group["initial_accumulator_value"],
                                               "initial_accumulator_value"),
                                        "initial_accumulator_value", 0.0))

    def _state_init(self, p, group):
        return dict(step=_step0(), sum=torch.full_like(
            p, number(group["initial_accumulator_value"], "initial_accumulator_value"),
            memory_format=torch.contiguous_format))

    def _hyper(self, h):
        return dict(lr=h["lr"], lr_decay=h["lr_decay"], eps=h["eps"],
                    weight_decay=h["weight_decay"], maximize=h["maximize"],
                    convention="torch", num_threads=self.num_threads)

    def _step_dense(self, xs, gs, slots, t, h):
        adagrad_step_inplace(xs, gs, slots[0], t, **self._hyper(h))

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_adagrad_step_inplace(x, grad, slots[0], t, mode="lazy", **self._hyper(h))


class SGD(FastadamOptimizer):
    """``torch.optim.SGD`` (:func:`fastadam.momentum_step_inplace`, ``convention="torch"``):
    ``v = momentum*v + (1-dampening)*g'`` (``v = g'`` on the first step), ``x -= lr*v`` or, with
    nesterov, ``x -= lr*(g' + momentum*v)``.  As in torch, ``momentum_buffer`` exists only
    when ``momentum != 0``; plain SGD steps with a scratch buffer outside the state."""

    def __init__(self, params: Any, lr: Any = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 num_threads: Optional[int] = None):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        self._scratch: Dict[int, Any] = {}
        super().__init__(params, defaults, num_threads)

    def _check_group(self, group):
        h = dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                 momentum=check_range(number(group["momentum"], "momentum"), "momentum", 0.0),
                 dampening=number(group["dampening"], "dampening"),
                 weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                          "weight_decay", 0.0),
                 nesterov=bool(group["nesterov"]), maximize=bool(group["maximize"]))
        if h["nesterov"] and (h["momentum"] <= 0 or h["dampening"] != 0):
            raise ValueError("nesterov: needs momentum > 0 and dampening == 0")
        return h

    # SGD has no step count in torch's state: the momentum buffer's presence is the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        calls = []
        for gi, group in enumerate(self.param_groups):
            h = self._check_group(group)
            batches: Dict[Tuple[int, torch.dtype], list] = {}
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                name = f"param_groups[{gi}]['params'][{i}]"
                x = numpy_view(p, name)
                grad = p.grad
                if h["momentum"] != 0:
                    state = self.state[p]
                    first = state.get("momentum_buffer") is None
                    if first:
                        state["momentum_buffer"] = _zeros(p)
                    v = numpy_view(state["momentum_buffer"],
                                   f"state[{name}]['momentum_buffer']")
                    t = 1 if first else 2
                else:  # plain SGD: v = g' every step (t = 1), v is scratch
                    key = id(p)
                    buf = self._scratch.get(key)
                    if buf is None or buf.shape != tuple(p.shape) or buf.dtype != x.dtype:
                        buf = self._scratch[key] = x.copy()
                    v, t = buf, 1
                if grad.is_sparse:
                    g = self._indexed_slices(grad, p, name)
                    batches.setdefault(("sparse", i), []).append((x, g, v, t))
                    continue
                if grad.dtype != p.dtype or grad.shape != p.shape:
                    raise ValueError(f"{name}: its gradient has dtype {grad.dtype} and shape "
                                     f"{tuple(grad.shape)}, expected {p.dtype} and "
                                     f"{tuple(p.shape)}")
                g = numpy_view(grad if grad.is_contiguous() else grad.contiguous(),
                               f"{name}.grad")
                batches.setdefault((t, p.dtype), []).append((x, g, v, t))
            calls.append((h, batches))
        for h, batches in calls:
            kw = dict(lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                      nesterov=h["nesterov"], weight_decay=h["weight_decay"],
                      maximize=h["maximize"], convention="torch",
                      num_threads=self.num_threads)
            for key, items in batches.items():
                if key[0] == "sparse":
                    (x, g, v, t), = items
                    sparse_momentum_step_inplace(x, g, v, t, mode="lazy", **kw)
                else:
                    momentum_step_inplace([it[0] for it in items], [it[1] for it in items],
                                          [it[2] for it in items], key[0], **kw)
        return loss


class RMSprop(FastadamOptimizer):
    """``torch.optim.RMSprop`` (:func:`fastadam.rmsprop_step_inplace`, ``convention="torch"``):
    ``v = alpha*v + (1-alpha)*g'**2``; centered: ``a = alpha*a + (1-alpha)*g'``, ``w = v - a**2``;
    ``d = g'/(sqrt(w)+eps)``; with momentum ``b = momentum*b + d; x -= lr*b``, else
    ``x -= lr*d``.  torch's state names: ``square_avg``, ``momentum_buffer`` (momentum > 0),
    ``grad_avg`` (centered).  A sparse gradient takes the lazy sparse step (not with
    ``centered`` and momentum together)."""

    def __init__(self, params: Any, lr: Any = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 capturable: bool = False, foreach: Optional[bool] = None,
                 maximize: bool = False, differentiable: bool = False, *,
                 num_threads: Optional[int] = None):
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                        momentum=momentum, centered=centered, capturable=capturable,
                        foreach=foreach, maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults, num_threads)

    def _check_group(self, group):
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0),
                    alpha=check_range(number(group["alpha"], "alpha"), "alpha", 0.0, 1.0,
                                      high_open=False),
                    eps=check_range(number(group["eps"], "eps"), "eps", 0.0),
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    momentum=check_range(number(group["momentum"], "momentum"), "momentum",
                                         0.0),
                    centered=bool(group["centered"]), maximize=bool(group["maximize"]))

    def _slot_keys(self, group):
        return (("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ())
                + (("grad_avg",) if group["centered"] else ()))

    def _state_init(self, p, group):
        return dict(step=_step0(), **{k: _zeros(p) for k in self._slot_keys(group)})

    def _kwargs(self, slots, h):
        it = iter(slots[1:])
        return dict(momentum_buffer=next(it) if h["momentum"] > 0 else None,
                    grad_avg=next(it) if h["centered"] else None, lr=h["lr"],
                    alpha=h["alpha"], eps=h["eps"], weight_decay=h["weight_decay"],
                    momentum=h["momentum"], centered=h["centered"], maximize=h["maximize"],
                    convention="torch", num_threads=self.num_threads)

    def _step_dense(self, xs, gs, slots, t, h):
        rmsprop_step_inplace(xs, gs, slots[0], t, **self._kwargs(slots, h))

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_rmsprop_step_inplace(x, grad, slots[0], t, mode="lazy", **self._kwargs(slots, h))


class Lion(FastadamOptimizer):
    """Lion (Chen et al. 2023; :func:`fastadam.lion_step_inplace`), which torch.optim does not
    have: ``c = beta1*m + (1-beta1)*g'``, ``x = (1-lr*weight_decay)*x - lr*sign(c)``,
    ``m = beta2*m + (1-beta2)*g'``; state ``exp_avg`` (the name the lion-pytorch package uses).
    A sparse gradient takes the lazy sparse step."""

    _state_keys = ("exp_avg",)

    def __init__(self, params: Any, lr: Any = 1e-4, betas: Tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, maximize: bool = False, *,
                 num_threads: Optional[int] = None):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay,
                                      maximize=maximize), num_threads)

    def _check_group(self, group):
        beta1, beta2 = _betas(group)
        return dict(lr=check_range(number(group["lr"], "lr"), "lr", 0.0), beta1=beta1,
                    beta2=beta2,
                    weight_decay=check_range(number(group["weight_decay"], "weight_decay"),
                                             "weight_decay", 0.0),
                    maximize=bool(group["maximize"]))

    def _state_init(self, p, group):
        return dict(step=_step0(), exp_avg=_zeros(p))

    def _kwargs(self, h):
        return dict(lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
                    weight_decay=h["weight_decay"], maximize=h["maximize"],
                    num_threads=self.num_threads)

    def _step_dense(self, xs, gs, slots, t, h):
        lion_step_inplace(xs, gs, slots[0], t, **self._kwargs(h))

    def _step_sparse(self, x, grad, slots, t, h):
        sparse_lion_step_inplace(x, grad, slots[0], t, mode="lazy", **self._kwargs(h))
