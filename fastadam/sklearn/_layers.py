"""``dense(h, w, b, activation=...)``: one fully connected layer ``act(h @ w + b)`` as a single
``fastadam.autodiff`` primitive.

One tape node per layer instead of three (matmul, add, activation) halves the engine's per-batch
bookkeeping, which dominates small mini-batches.  The VJPs go through ``dz = g * act'(ans)``,
with the derivative written from the output (relu: ``ans > 0``; tanh: ``1 - ans**2``; logistic:
``ans * (1 - ans)``), then ``dh = dz @ w.T``, ``dw = h.T @ dz``, ``db = sum(dz, axis=0)``.  ``dz`` is
computed once per layer and shared by the three VJPs (a per-thread one-entry cache).  When
no graph is being recorded (plain first-order training) they run on the arrays directly; under
``create_graph=True`` they are written with the engine's own ops, so higher orders work.
"""
import threading

import numpy as np

from fastadam import autodiff as ad

ACTIVATIONS = ("identity", "relu", "tanh", "logistic")


def activation_inplace(name, z):
    """Apply the activation ``name`` to the ndarray ``z`` in place and return it."""
    if name == "relu":
        np.maximum(z, 0, out=z)
    elif name == "tanh":
        np.tanh(z, out=z)
    elif name == "logistic":
        np.negative(z, out=z)
        np.exp(z, out=z)
        z += 1
        np.reciprocal(z, out=z)
    return z


@ad.primitive
def _dense(h, w, b, *, activation):
    z = h @ w
    z += b
    return activation_inplace(activation, z)


_cache = threading.local()  # (g, ans, dz) of this thread's latest first-order VJP: w, b, h share it


def _dz_array(g, ans, activation):
    last = getattr(_cache, "last", None)
    if last is None:
        last = _cache.last = [None, None, None]
    if last[0] is g and last[1] is ans:
        return last[2]
    if activation == "relu":
        dz = np.multiply(g, ans > 0, dtype=g.dtype)  # no bool -> float promotion pass
    elif activation == "tanh":
        dz = g * (1 - ans * ans)
    elif activation == "logistic":
        dz = g * ans * (1 - ans)
    else:
        dz = g
    last[0], last[1], last[2] = g, ans, dz
    return dz


def _dz_tensor(g, ans, activation):
    if activation == "relu":
        return ad.multiply(g, ad.sign(ans))  # ans >= 0, so sign is the 0/1 mask
    if activation == "tanh":
        return ad.multiply(g, ad.subtract(1.0, ad.multiply(ans, ans)))
    if activation == "logistic":
        return ad.multiply(g, ad.multiply(ans, ad.subtract(1.0, ans)))
    return g


def _vjp_h(g, ans, h, w, b, *, activation):
    if not ad.is_grad_enabled():
        return ad.Tensor(_dz_array(g.data, ans.data, activation) @ w.data.T)
    return ad.matmul(_dz_tensor(g, ans, activation), ad.transpose(w))


def _vjp_w(g, ans, h, w, b, *, activation):
    if not ad.is_grad_enabled():
        return ad.Tensor(h.data.T @ _dz_array(g.data, ans.data, activation))
    return ad.matmul(ad.transpose(h), _dz_tensor(g, ans, activation))


def _vjp_b(g, ans, h, w, b, *, activation):
    if not ad.is_grad_enabled():
        return ad.Tensor(_dz_array(g.data, ans.data, activation).sum(axis=0))
    return ad.sum(_dz_tensor(g, ans, activation), axis=0)


ad.defvjp(_dense, _vjp_h, _vjp_w, _vjp_b)


def dense(h, w, b, activation="identity"):
    """``activation(h @ w + b)`` for ``h`` (n, k), ``w`` (k, m), ``b`` (m,), recorded as one node.
    ``activation`` is one of "identity", "relu", "tanh", "logistic"."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    return _dense(h, w, b, activation=activation)
