"""Reference code of the scikit-learn front-end that only the tests use (moved out of
fastadam/sklearn/ in issue 20): the MLP's forward and backward pass written plainly, and the
weighted losses of the MLP estimators as autodiff primitives (the estimators themselves run
the fused loops of ``_kernels.pyx``, tested bit for bit against these).

- ``forward``, ``loss_and_gradients``: the pass of ``fastadam/sklearn/_backprop.py`` as fresh
  arrays per operation (``BatchPass`` must give the same bits);
- ``weighted_binary_cross_entropy`` / ``_wbce``, ``weighted_half_squared_error`` / ``_whse``
  with their gradient primitives, and the wrappers ``weighted_softmax_cross_entropy``,
  ``weighted_multiclass_hinge`` over the primitives the sparse linear model uses.
"""
import threading

import numpy as np
from scipy.special import expit

from fastadam.autodiff import defvjp, primitive
from fastadam.sklearn import _kernels
from fastadam.sklearn._backprop import activation_backward_inplace
from fastadam.sklearn._layers import activation_inplace
from fastadam.sklearn._losses import _scaled_vjp, _whinge, _wsce


def forward(X, coefs, intercepts, activation):
    """The activations ``[a_1, ..., a_n]`` (``a_n`` the output layer's values before the output
    function), each a fresh array."""
    outputs = []
    h = X
    last = len(coefs) - 1
    for i, (w, b) in enumerate(zip(coefs, intercepts)):
        h = h @ w
        if i != last and activation == "relu":
            _kernels.bias_relu(h, b)  # max(h + b, 0), one pass
        else:
            h += b
            if i != last:
                activation_inplace(activation, h)
        outputs.append(h)
    return outputs


def loss_and_gradients(X, coefs, intercepts, activation, loss):
    """``(loss, coef_grads, intercept_grads)`` of ``loss(network(X))``.

    ``loss(z)`` returns ``(value, dz)``: the loss of the output values ``z`` and its gradient
    with respect to ``z`` (a fresh array: the backward pass overwrites it)."""
    outputs = forward(X, coefs, intercepts, activation)
    value, dz = loss(outputs[-1])
    n = len(coefs)
    coef_grads = [None] * n
    intercept_grads = [None] * n
    for i in range(n - 1, -1, -1):
        a = outputs[i - 1] if i else X
        coef_grads[i] = a.T @ dz
        intercept_grads[i] = dz.sum(axis=0)
        if i:
            dz = activation_backward_inplace(activation, dz @ coefs[i].T, a)
    return value, coef_grads, intercept_grads


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


def weighted_multiclass_hinge(z, labels, weights):
    """Crammer-Singer multiclass hinge ``sum_i weights[i] * max(0, 1 + max_{k != y} z[i, k] -
    z[i, y])``."""
    return _whinge(z, labels=labels, weights=weights)
