"""Sample-weighted training losses for the estimators, as ``fastadam.autodiff`` primitives.

Each loss takes the network output as its one differentiable argument and the targets and
normalised sample weights ``w`` (``sum(w) == 1``; ``1/n`` each without ``sample_weight``) as
keyword parameters, so one fused NumPy pass computes the value and one computes the gradient:

- ``weighted_softmax_cross_entropy(z, labels=y, weights=w) = -sum_i w_i log softmax(z_i)[y_i]``,
  gradient ``w_i (softmax(z_i) - onehot(y_i))``;
- ``weighted_binary_cross_entropy(z, targets=t, weights=w)`` (one logistic output, binary):
  ``-sum_i w_i (t_i log p_i + (1 - t_i) log(1 - p_i))``, ``p = sigmoid(z)``, gradient
  ``w_i (p_i - t_i)``;
- ``weighted_half_squared_error(p, targets=Y, weights=w) = sum_i w_i mean_k (p_ik - Y_ik)^2 / 2``,
  gradient ``w_i (p_ik - Y_ik) / K``;
- ``weighted_multiclass_hinge(z, labels=y, weights=w) = sum_i w_i max(0, 1 + max_{k!=y_i} z_ik -
  z_iy_i)`` (Crammer-Singer), gradient ``+w_i`` at the arg-max rival and ``-w_i`` at the label
  where the margin is violated.

First-order only: their gradients are primitives without a registered VJP, so asking for a
second derivative raises ``NotImplementedError`` naming them.
"""
import threading

import numpy as np
from scipy.special import expit

from fastadam.autodiff import Tensor, defvjp, is_grad_enabled, multiply, primitive


def _scaled_vjp(grad_primitive):
    """VJP ``g * grad(z)``: one fused array pass in first-order mode, engine ops otherwise."""
    def vjp(g, ans, z, **kw):
        if not is_grad_enabled() and g.data.ndim == 0:
            out = grad_primitive.fun(z.data, **kw)
            if g.data != 1:
                out *= g.data
            return Tensor(out)
        return multiply(g, grad_primitive(z, **kw))
    return vjp


def _softmax_parts(z):
    """``shifted = z - max``, ``e = exp(shifted)``, ``s = e.sum(1)`` (softmax = e / s)."""
    shifted = z - z.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return shifted, e, e.sum(axis=1)


# the forward pass's exp(z - max) and row sums, reused by the gradient of the same z (one entry
# per thread; dropped once used)
_softmax_cache = threading.local()


@primitive
def _wsce(z, *, labels, weights):
    shifted, e, s = _softmax_parts(z)
    picked = shifted[np.arange(z.shape[0]), labels] - np.log(s)
    _softmax_cache.entry = (z, e, s)
    return np.asarray(-np.dot(weights, picked), dtype=z.dtype)


@primitive
def weighted_softmax_cross_entropy_grad(z, *, labels, weights):
    entry = getattr(_softmax_cache, "entry", None)
    if entry is not None and entry[0] is z:
        _softmax_cache.entry = None
        _, p, s = entry
    else:
        _, p, s = _softmax_parts(z)
    p /= s[:, None]
    p[np.arange(z.shape[0]), labels] -= 1
    p *= weights[:, None]
    return p


defvjp(_wsce, _scaled_vjp(weighted_softmax_cross_entropy_grad))


@primitive
def _wbce(z, *, targets, weights):
    p = expit(z)
    _sigmoid_cache.entry = (z, p)
    eps = np.finfo(p.dtype).eps
    q = np.clip(p, eps, 1 - eps)  # scikit-learn's binary_log_loss, so loss_curve_ agrees
    v = targets * np.log(q) + (1 - targets) * np.log1p(-q)
    return np.asarray(-np.dot(weights, v[:, 0]), dtype=z.dtype)


@primitive
def weighted_binary_cross_entropy_grad(z, *, targets, weights):
    entry = getattr(_sigmoid_cache, "entry", None)
    if entry is not None and entry[0] is z:
        _sigmoid_cache.entry = None
        p = entry[1]
    else:
        p = expit(z)
    p -= targets
    p *= weights[:, None]
    return p


_sigmoid_cache = threading.local()
defvjp(_wbce, _scaled_vjp(weighted_binary_cross_entropy_grad))


def weighted_binary_cross_entropy(z, targets, weights):
    """``-sum_i weights[i] * (t_i log p_i + (1 - t_i) log(1 - p_i))`` with ``p = sigmoid(z)``
    (clipped to [eps, 1 - eps] in the value, as scikit-learn does); ``z`` and ``targets`` of
    shape (n, 1), targets 0/1.  Gradient ``weights[i] * (p_i - t_i)``."""
    return _wbce(z, targets=targets, weights=weights)


def weighted_softmax_cross_entropy(z, labels, weights):
    """``-sum_i weights[i] * log softmax(z[i])[labels[i]]``; ``labels`` intp, ``weights`` of
    z's dtype."""
    return _wsce(z, labels=labels, weights=weights)


@primitive
def _whse(p, *, targets, weights):
    d = p - targets
    return np.asarray(0.5 * np.dot(weights, (d * d).mean(axis=1)), dtype=p.dtype)


@primitive
def weighted_half_squared_error_grad(p, *, targets, weights):
    d = p - targets
    d *= (weights / p.shape[1])[:, None]
    return d


defvjp(_whse, _scaled_vjp(weighted_half_squared_error_grad))


def weighted_half_squared_error(p, targets, weights):
    """``sum_i weights[i] * mean_k (p[i, k] - targets[i, k])**2 / 2``."""
    return _whse(p, targets=targets, weights=weights)


def _hinge_parts(z, labels):
    rows = np.arange(z.shape[0])
    own = z[rows, labels]
    rivals = z.copy()
    rivals[rows, labels] = -np.inf
    rival = rivals.argmax(axis=1)
    margin = 1 + rivals[rows, rival] - own
    return rows, rival, margin


@primitive
def _whinge(z, *, labels, weights):
    _, _, margin = _hinge_parts(z, labels)
    return np.asarray(np.dot(weights, np.maximum(margin, 0)), dtype=z.dtype)


@primitive
def weighted_multiclass_hinge_grad(z, *, labels, weights):
    rows, rival, margin = _hinge_parts(z, labels)
    active = np.where(margin > 0, weights, 0).astype(z.dtype)
    grad = np.zeros_like(z)
    grad[rows, rival] += active
    grad[rows, labels] -= active
    return grad


defvjp(_whinge, _scaled_vjp(weighted_multiclass_hinge_grad))


def weighted_multiclass_hinge(z, labels, weights):
    """Crammer-Singer multiclass hinge ``sum_i weights[i] * max(0, 1 + max_{k != y} z[i, k] -
    z[i, y])``."""
    return _whinge(z, labels=labels, weights=weights)
