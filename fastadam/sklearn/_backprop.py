"""Hand-written forward and backward pass of the MLP estimators' fixed architecture: dense
layers ``a_{i+1} = act(a_i @ W_i + b_i)`` (identity on the last one), then a fused,
sample-weighted loss (``_losses``).

The network of ``MLPClassifier`` / ``MLPRegressor`` never changes shape, so recording it on
the autodiff tape at every mini-batch buys nothing but the tape's per-operation Python cost
(about half the time of a batch of 200 rows).  This module computes the same numbers directly,
with the operations, in the order, of the tape's VJPs (``_layers.dense`` and the loss
primitives' gradients), so the result equals ``fastadam.autodiff.gradient`` of the same network
(``tests/test_sklearn_backprop.py`` checks it, and checks both against finite differences).
The ReLU layers and the losses run as fused one-pass loops (``_kernels.pyx``), which keep the
NumPy expressions' roundings up to the last bit of C's exp/log against NumPy's:

    forward:   a_0 = X,  a_{i+1} = act_i(a_i @ W_i + b_i)
    output:    dz_{n-1} = d loss / d z at the output (the loss primitive's gradient)
    backward:  dW_i = a_i.T @ dz_i,  db_i = sum(dz_i, axis=0),
               dz_{i-1} = (dz_i @ W_i.T) * act'(a_i)   (written from the output a_i:
               relu ``a > 0``, tanh ``1 - a*a``, logistic ``a * (1 - a)``)

First order only (the estimators need nothing else); the tape remains the way to higher orders.
"""
import numpy as np

from . import _kernels
from ._layers import activation_inplace


def activation_backward_inplace(name, g, a):
    """``g *= act'(z)`` in place, the derivative written from the activation's output ``a``;
    the same roundings as ``_layers``' VJPs."""
    if name == "relu":
        _kernels.relu_backward(g, a)  # g * (a > 0), one pass
    elif name == "tanh":
        d = a * a
        np.subtract(1, d, out=d)
        g *= d
    elif name == "logistic":
        d = np.subtract(1, a)
        g *= a
        g *= d
    return g


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
