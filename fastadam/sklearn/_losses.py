"""Sample-weighted training losses of the sparse linear model, as ``fastadam.autodiff``
primitives.

Each loss takes the model output as its one differentiable argument and the labels and
normalised sample weights ``w`` (``sum(w) == 1``; ``1/n`` each without ``sample_weight``) as
keyword parameters, so one fused NumPy pass computes the value and one computes the gradient:

- ``_wsce(z, labels=y, weights=w) = -sum_i w_i log softmax(z_i)[y_i]``, gradient
  ``weighted_softmax_cross_entropy_grad``: ``w_i (softmax(z_i) - onehot(y_i))``;
- ``_whinge(z, labels=y, weights=w) = sum_i w_i max(0, 1 + max_{k!=y_i} z_ik - z_iy_i)``
  (Crammer-Singer), gradient ``weighted_multiclass_hinge_grad``: ``+w_i`` at the arg-max rival
  and ``-w_i`` at the label where the margin is violated.

The MLP estimators' losses are the one-pass loops of ``_kernels.pyx``; their reference
primitives (binary cross-entropy, half squared error) are in tests/sklearn_reference.py.
First-order only: the gradients are primitives without a registered VJP, so asking for a
second derivative raises ``NotImplementedError`` naming them.
"""
import threading

import numpy as np

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
