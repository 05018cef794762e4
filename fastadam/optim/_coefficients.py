"""Hyper-parameter checks and coefficient folding, once per step, in float64, for every optimizer.

Each ``*_coefficients`` function validates its optimizer's scalars (a clear error naming the
argument), folds them with the step number into the coefficient object its kernels read
(fastadam/_core/_coeffs.pyx; the formulas are in include/fastadam/adam.h, adagrad.h, momentum.h), and
returns it.  :func:`check_in_dtype` then checks the folded values in the precision the kernel
computes in, once the arrays' dtype is known.  The functional steps (``_functional.py``), the
sparse steps and the optimizer objects all fold through here, so a rule is written once.
"""
import math
import numbers

import numpy as np

from .._core._coeffs import (FLAG_AMSGRAD, FLAG_EPS_INSIDE, FLAG_L2, FLAG_MOMENTUM_NESTEROV,
                             FLAG_NESTEROV, FLAG_SCALE, AdagradCoefficients, AdamCoefficients,
                             MomentumCoefficients, StructCoefficients, adam_fold)
from .._core._registry import OptimizerSpec, register

ADAM_CONVENTIONS = ("tf", "torch", "onnx")
ADAGRAD_CONVENTIONS = ("torch", "onnx", "keras")
MOMENTUM_CONVENTIONS = ("torch", "onnx")
# Each library's default epsilon (used when eps=None).
ADAGRAD_EPS = {"torch": 1e-10, "onnx": 1e-6, "keras": 1e-7}
T_LIMIT = 2**63  # step numbers are int64 in the kernels and in checkpoints


def finite_float(value, name):
    """``value`` as a float; TypeError for a non-number, ValueError for inf or NaN."""
    if type(value) is float:  # fast path: the common case skips the ABC checks below
        if value - value == 0.0:  # false for inf and nan
            return value
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if type(value) is np.ndarray and value.ndim == 0 and value.dtype.kind in "iuf":
        value = value.item()  # a 0-d array: what JAX/optax schedules return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    return value


def step_number(t, name="t"):
    """``t`` as an int in [-2**63, 2**63); np.integer is accepted, bool and float are not."""
    if type(t) is not int:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name}: expected an int step number, got {type(t).__name__}")
        t = int(t)
    if not -T_LIMIT <= t < T_LIMIT:
        raise ValueError(f"{name}: expected a step number below 2**63, got {t}")
    return t


def _convention(convention, allowed):
    if convention not in allowed:
        raise ValueError(f"convention: expected one of {allowed}, got {convention!r}")
    return convention


def _grad_scale(grad_scale):
    """(flags, divisor) of an optional loss-scaling factor."""
    if grad_scale is None:
        return 0, 1.0
    grad_scale = finite_float(grad_scale, "grad_scale")
    if grad_scale == 0.0:
        raise ValueError("grad_scale: expected a non-zero number, got 0.0")
    return FLAG_SCALE, grad_scale


def _rate(value, name):
    value = finite_float(value, name)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected 0 <= {name} < 1, got {value}")
    return value


def check_adam_hyperparameters(lr, beta1, beta2, eps, convention, weight_decay, post_decay,
                               grad_scale=None):
    """Validate Adam's scalars (shared by the dense and sparse steps); returns them as floats."""
    # the per-step hot path: the range checks are inlined rather than calls to _rate
    lr = finite_float(lr, "lr")
    beta1 = finite_float(beta1, "beta1")
    beta2 = finite_float(beta2, "beta2")
    eps = finite_float(eps, "eps")
    weight_decay = finite_float(weight_decay, "weight_decay")
    post_decay = finite_float(post_decay, "post_decay")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"beta1: expected 0 <= beta1 < 1, got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"beta2: expected 0 <= beta2 < 1, got {beta2}")
    if not eps > 0.0:
        raise ValueError(f"eps: expected eps > 0, got {eps}")
    if not 0.0 <= post_decay < 1.0:  # x is scaled by 1 - post_decay: >= 1 zeroes or flips it
        raise ValueError(f"post_decay: expected 0 <= post_decay < 1, got {post_decay}")
    if convention not in ADAM_CONVENTIONS:
        _convention(convention, ADAM_CONVENTIONS)
    if grad_scale is not None:
        grad_scale = _grad_scale(grad_scale)[1]
    return lr, beta1, beta2, eps, weight_decay, post_decay, grad_scale


def adam_step_sizes(t, lr, beta1, beta2, convention):
    """(alpha, denom_scale) of ``x -= alpha * m / (sqrt(v) * denom_scale + eps)`` at step t."""
    t = step_number(t)
    if convention == "onnx" and t <= 0:
        return lr, 1.0
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1 for convention {convention!r}, got {t}")
    # beta**t underflows to 0 for large t, which is the exact limit: no overflow risk.
    bc1 = 1.0 - beta1 ** t
    bc2 = 1.0 - beta2 ** t
    if convention == "torch":
        return lr / bc1, 1.0 / math.sqrt(bc2)
    return lr * math.sqrt(bc2) / bc1, 1.0


def adam_coefficients(t, lr, beta1, beta2, eps, convention, weight_decay=0.0,
                      decoupled_weight_decay=False, post_decay=0.0, amsgrad=False,
                      nesterov=False, maximize=False, grad_scale=None):
    """The AdamCoefficients of step ``t`` (formula: include/fastadam/adam.h).  The arguments
    may be passed by position (the functional steps do: it is the per-step hot path).  The
    common case (exact floats and bools, an int ``t >= 1``) is checked and folded in C
    (``_coeffs.adam_fold``, the same operations); anything else, every error included, here."""
    folded = adam_fold(t, lr, beta1, beta2, eps, convention, weight_decay,
                       decoupled_weight_decay, post_decay, amsgrad, nesterov, maximize,
                       grad_scale)
    if folded is not None:
        return folded
    lr, beta1, beta2, eps, weight_decay, post_decay, _ = check_adam_hyperparameters(
        lr, beta1, beta2, eps, convention, weight_decay, post_decay)
    flags, divisor = (0, 1.0) if grad_scale is None else _grad_scale(grad_scale)
    alpha, denom_scale = adam_step_sizes(t, lr, beta1, beta2, convention)
    l2, decay_mul = 0.0, 1.0
    if weight_decay != 0.0:
        if decoupled_weight_decay:
            decay_mul = 1.0 - lr * weight_decay
        else:
            l2 = weight_decay
            flags |= FLAG_L2
    if amsgrad:
        flags |= FLAG_AMSGRAD
    if nesterov:
        flags |= FLAG_NESTEROV
    return AdamCoefficients(alpha=alpha, denom_scale=denom_scale, eps=eps, beta1=beta1,
                            beta2=beta2, sign=-1.0 if maximize else 1.0, grad_scale=divisor,
                            l2=l2, decay_mul=decay_mul, post_mul=1.0 - post_decay, flags=flags)


def adagrad_coefficients(t, *, lr, lr_decay=0.0, eps=None, weight_decay=0.0, maximize=False,
                         convention="torch", grad_scale=None):
    """The AdagradCoefficients of step ``t`` (formula: include/fastadam/adagrad.h).

    "onnx": ``r = lr / (1 + t * lr_decay)`` for any t (the operator's pseudo-code; a t with
    ``1 + t * lr_decay == 0`` is refused); "torch": ``lr / (1 + (t - 1) * lr_decay)``, t >= 1;
    "keras": ``lr`` (no decay), eps inside the square root.
    """
    _convention(convention, ADAGRAD_CONVENTIONS)
    lr = finite_float(lr, "lr")
    lr_decay = finite_float(lr_decay, "lr_decay")
    eps = ADAGRAD_EPS[convention] if eps is None else finite_float(eps, "eps")
    weight_decay = finite_float(weight_decay, "weight_decay")
    t = step_number(t)
    if lr_decay < 0.0:
        raise ValueError(f"lr_decay: expected lr_decay >= 0, got {lr_decay}")
    if eps < 0.0:
        raise ValueError(f"eps: expected eps >= 0, got {eps}")
    if convention == "keras" and lr_decay != 0.0:
        raise ValueError("lr_decay: Keras's Adagrad has no lr_decay (use a schedule), got "
                         f"{lr_decay}")
    first = _adagrad_first_step(t, convention)
    flags, divisor = _grad_scale(grad_scale)
    rate = _adagrad_rate(t, first, lr, lr_decay)
    if weight_decay != 0.0:
        flags |= FLAG_L2
    if convention == "keras":
        flags |= FLAG_EPS_INSIDE
    return AdagradCoefficients(lr=rate, eps=eps, sign=-1.0 if maximize else 1.0,
                               grad_scale=divisor, l2=weight_decay, flags=flags)


def _adagrad_first_step(t, convention):
    """The first step number of ``convention`` (ValueError for an earlier ``t``)."""
    first = 0 if convention == "onnx" else 1
    if t < first and convention != "onnx":
        raise ValueError(f"t: expected a step number >= {first} for convention "
                         f"{convention!r}, got {t}")
    return first


def _adagrad_rate(t, first, lr, lr_decay):
    """Adagrad's decayed learning rate at step ``t``."""
    if not lr_decay:
        return lr
    denominator = 1.0 + (t - first) * lr_decay
    if denominator == 0.0:  # ONNX's T < 0 (its pseudo-code would divide by zero)
        raise ValueError(f"t: 1 + t * lr_decay is 0 (t={t}, lr_decay={lr_decay}): the "
                         f"learning rate lr / (1 + t * lr_decay) is undefined")
    return lr / denominator


def momentum_coefficients(t, *, lr, momentum=0.9, dampening=0.0, nesterov=False,
                          weight_decay=0.0, maximize=False, convention="torch", grad_scale=None):
    """The MomentumCoefficients of step ``t`` (formula: include/fastadam/momentum.h).

    "torch" (``torch.optim.SGD``): the first step (t == 1) sets v = g'; "onnx" (``Momentum``,
    alpha = momentum, beta = 1 - dampening): any t, and t <= 0 uses beta = 1 (the operator's
    ``T > 0 ? beta : 1``).
    """
    _convention(convention, MOMENTUM_CONVENTIONS)
    lr = finite_float(lr, "lr")
    momentum = finite_float(momentum, "momentum")
    dampening = finite_float(dampening, "dampening")
    weight_decay = finite_float(weight_decay, "weight_decay")
    t = step_number(t)
    if convention == "torch":
        if momentum < 0.0:
            raise ValueError(f"momentum: expected momentum >= 0, got {momentum}")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("nesterov: Nesterov momentum needs momentum > 0 and dampening = 0 "
                             f"(got momentum={momentum}, dampening={dampening})")
    a, b = _momentum_buffer_coefficients(t, momentum, dampening, convention)
    flags, divisor = _grad_scale(grad_scale)
    if weight_decay != 0.0:
        flags |= FLAG_L2
    if nesterov:
        flags |= FLAG_MOMENTUM_NESTEROV
    return MomentumCoefficients(lr=lr, a=a, b=b, an=momentum, idle_rate=momentum,
                                sign=-1.0 if maximize else 1.0, grad_scale=divisor,
                                l2=weight_decay, flags=flags)


def _momentum_buffer_coefficients(t, momentum, dampening, convention):
    """(a, b) of ``v = a*v + b*g'`` at step ``t`` (ValueError for a torch ``t < 1``)."""
    if convention == "torch":
        if t < 1:
            raise ValueError(f"t: expected a step number >= 1 for convention 'torch', got {t}")
        first = t == 1 or momentum == 0.0
        return (0.0, 1.0) if first else (momentum, 1.0 - dampening)
    return momentum, (1.0 - dampening if t > 0 else 1.0)


# ---- retiming: the coefficients of another step from a fold of the same hyper-parameters ----
# A prepared step (fastadam/optim/_prepared.py) folds a set of hyper-parameters once and, while
# they are unchanged, asks the spec's ``retime(coeffs, t, hyper)`` for step ``t``: it checks
# ``t`` as the fold does (same errors) and recomputes only the fields that depend on it.
# ``hyper`` is the keyword dict the fold accepted (its values passed the fold's checks).

def adam_retime(coeffs, t, hyper):
    """Adam: the bias corrections (``alpha``, ``denom_scale``) of step ``t`` (for an int
    ``t >= 1`` computed in Cython, the operations of :func:`adam_step_sizes`)."""
    out = coeffs.retimed(t, hyper)  # a prepared step has tried it already: ints t >= 1
    if out is not None:
        return out
    alpha, denom_scale = adam_step_sizes(t, float(hyper["lr"]), float(hyper["beta1"]),
                                         float(hyper["beta2"]), hyper["convention"])
    return coeffs.at_step(alpha, denom_scale)


def adagrad_retime(coeffs, t, hyper):
    """Adagrad: the decayed learning rate of step ``t`` (``lr_decay``)."""
    t = step_number(t)
    first = _adagrad_first_step(t, hyper.get("convention", "torch"))
    lr_decay = float(hyper.get("lr_decay", 0.0))
    if not lr_decay:
        return coeffs
    return coeffs.with_lr(_adagrad_rate(t, first, float(hyper["lr"]), lr_decay))


def momentum_retime(coeffs, t, hyper):
    """Momentum: the buffer coefficients of step ``t`` (torch's first step sets v = g')."""
    t = step_number(t)
    a, b = _momentum_buffer_coefficients(t, float(hyper.get("momentum", 0.9)),
                                         float(hyper.get("dampening", 0.0)),
                                         hyper.get("convention", "torch"))
    return coeffs.with_ab(a, b)


def retime_from_one(coeffs, t, hyper):
    """An optimizer whose coefficients do not depend on ``t`` (RMSprop, Lion): ``t`` is only
    checked (an int >= 1, as their folds check it)."""
    t = step_number(t)
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1, got {t}")
    return coeffs


# ---- the specs of the optimizers folded here (fastadam/_core/_registry.py) -----------------------
# RMSprop and Lion register theirs beside their folds (_rmsprop.py, _lion.py).
register(OptimizerSpec(
    name="adam", fold=adam_coefficients, retime=adam_retime,
    fields=("alpha", "denom_scale", "eps", "beta1", "beta2", "sign", "grad_scale", "l2",
            "decay_mul", "post_mul"),
    slots=("m", "v", "v_max"), object_slots=("m", "v", "v_max"),
    flags={"amsgrad": FLAG_AMSGRAD, "nesterov": FLAG_NESTEROV},
    onnx_op="Adam", torch_name="Adam", nonnegative_slots=("v", "v_max"),
    defaults=dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, convention="tf")))
register(OptimizerSpec(
    name="adagrad", fold=adagrad_coefficients, retime=adagrad_retime,
    fields=("lr", "eps", "sign", "grad_scale", "l2"),
    slots=("h",), object_slots=("sum",), flags={"eps_inside": FLAG_EPS_INSIDE},
    onnx_op="Adagrad", torch_name="Adagrad", defaults=dict(lr=1e-2),
    nonnegative_slots=("h",)))
register(OptimizerSpec(
    name="momentum", fold=momentum_coefficients, retime=momentum_retime,
    fields=("lr", "a", "b", "an", "idle_rate", "sign", "grad_scale", "l2"),
    slots=("v",), object_slots=("momentum_buffer",), flags={"nesterov": FLAG_MOMENTUM_NESTEROV},
    onnx_op="Momentum", torch_name="SGD", defaults=dict(lr=1e-2)))
