"""Primitives of transformer models (added for models exported from PyTorch): ``erf``,
``gelu`` (exact and tanh forms), ``layer_norm``, ``maximum`` / ``minimum``.

Same rules as ``_ops``: every VJP is written with recorded primitives, so each op is
differentiable again.  The first-order backward pass of ``gelu`` and ``layer_norm`` (recording
off, the usual training step) goes through fused kernels (``_transformer_kernels``); with
``create_graph=True`` the same formulas are written with the engine's own ops.  The formulas
are in ``_transformer_kernels``' module note.
"""
import math
import weakref

import numpy as np

from . import _tensor
from ._ops import (add, exp, mean, multiply, negative, power, subtract, sum as _sum, tanh,
                   unbroadcast)
from ._registry import as_tensor, defvjp, primitive
from ._tensor import _wrap

try:
    from . import _transformer_kernels as _C
except ImportError:  # pragma: no cover - source tree without a build
    _C = None

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _fast(*arrays):
    return _C is not None and all(a.dtype in _FAST for a in arrays)


def _contiguous(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


# ---------------------------------------------------------------------------------------------
# erf, gelu
# ---------------------------------------------------------------------------------------------


def _erf_array(x):
    if _fast(x):
        return _C.erf(_contiguous(x))
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)  # pragma: no cover


erf = primitive(_erf_array, name="erf")
erf.__doc__ = """The error function ``2 / sqrt(pi) * integral_0^x exp(-t^2) dt`` (ONNX Erf)."""
defvjp(erf, lambda g, ans, x: multiply(g, multiply(exp(negative(multiply(x, x))),
                                                   _TWO_OVER_SQRT_PI)))


@primitive
def _gelu(x):
    if _fast(x):
        return _C.gelu(_contiguous(x))
    return 0.5 * x * (1 + _erf_array(x * np.sqrt(0.5).astype(x.dtype)))  # pragma: no cover


@primitive
def _gelu_grad(g, x):
    """``g * (Phi(x) + x * phi(x))``: the VJP of the exact GELU."""
    if _fast(g, x) and g.shape == x.shape:
        return _C.gelu_grad(_contiguous(g), _contiguous(x))
    phi = np.exp(-0.5 * x * x) * x.dtype.type(_INV_SQRT_2PI)  # pragma: no cover
    return g * (0.5 * (1 + _erf_array(x * x.dtype.type(np.sqrt(0.5)))) + x * phi)


def _gelu_grad_vjp_x(h, ans, g, x):
    # d/dx (Phi(x) + x phi(x)) = phi(x) * (2 - x^2)
    phi = multiply(exp(multiply(multiply(x, x), -0.5)), _INV_SQRT_2PI)
    return multiply(multiply(h, g), multiply(phi, subtract(2.0, multiply(x, x))))


defvjp(_gelu, lambda g, ans, x: _gelu_grad(g, x))
defvjp(_gelu_grad, lambda h, ans, g, x: _gelu_grad(h, x), _gelu_grad_vjp_x)


def gelu(x, approximate="none"):
    """GELU (ONNX Gelu, ``torch.nn.functional.gelu``): ``x * Phi(x)`` with ``Phi`` the standard
    normal CDF (``approximate="none"``), or ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715
    * x^3)))`` (``approximate="tanh"``)."""
    x = as_tensor(x)
    if approximate == "none":
        return _gelu(x)
    if approximate == "tanh":
        inner = multiply(add(x, multiply(power(x, 3.0), 0.044715)), math.sqrt(2.0 / math.pi))
        return multiply(multiply(x, 0.5), add(tanh(inner), 1.0))
    raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")


# ---------------------------------------------------------------------------------------------
# layer normalisation
# ---------------------------------------------------------------------------------------------


def _rows(x, axis):
    rows = 1
    for d in x.shape[:axis]:
        rows *= d
    return rows, (x.size // rows if rows else 0)


# The forward kernel's per-row statistics, kept while its output lives: id(output array) ->
# (weak reference to it, mean, rstd).  The VJPs of x and of scale read them instead of
# normalising x again; an output they do not find (a replaced or foreign array) is recomputed.
_FORWARD_STATS = {}


def _forget_stats(key):
    return lambda _ref: _FORWARD_STATS.pop(key, None)


def _ln_stats(x, axis, epsilon, ans=None):
    """(x as (rows, cols), mean, rstd): the forward's when ``ans`` is its output, else by the
    kernel."""
    rows, cols = _rows(x, axis)
    x2 = _contiguous(x).reshape(rows, cols)
    if ans is not None:
        kept = _FORWARD_STATS.get(id(ans))
        if kept is not None and kept[0]() is ans:
            return x2, kept[1], kept[2]
    _, m, r = _C.layer_norm(x2, np.ones(cols, x.dtype), None, epsilon)
    return x2, m, r


@primitive
def _layer_norm(x, scale, bias, axis, epsilon):
    rows, cols = _rows(x, axis)
    y, m, r = _C.layer_norm(_contiguous(x).reshape(rows, cols), _contiguous(scale).reshape(-1),
                            _contiguous(bias).reshape(-1), epsilon)
    y = y.reshape(x.shape)
    key = id(y)
    _FORWARD_STATS[key] = (weakref.ref(y, _forget_stats(key)), m, r)
    return y


def _composite_parts(x, scale, axis, epsilon):
    """``xhat`` and ``rstd`` of the normalisation, with the engine's ops (differentiable)."""
    axes = tuple(range(axis, x.ndim))
    d = subtract(x, mean(x, axis=axes, keepdims=True))
    rstd = power(add(mean(multiply(d, d), axis=axes, keepdims=True), epsilon), -0.5)
    return multiply(d, rstd), rstd, axes


def _ln_vjp_x(g, ans, x, scale, bias, axis, epsilon):
    if not _tensor._mode.enabled:  # first order: the fused kernel
        x2, m, r = _ln_stats(x.data, axis, epsilon, ans.data)
        dx, _, _ = _C.layer_norm_backward(_contiguous(g.data).reshape(x2.shape), x2,
                                          _contiguous(scale.data).reshape(-1), m, r,
                                          want_params=False)
        return _wrap(dx.reshape(x.shape))
    xhat, rstd, axes = _composite_parts(x, scale, axis, epsilon)
    gs = multiply(g, scale)
    inner = subtract(subtract(gs, mean(gs, axis=axes, keepdims=True)),
                     multiply(xhat, mean(multiply(gs, xhat), axis=axes, keepdims=True)))
    return multiply(rstd, inner)


def _ln_vjp_scale(g, ans, x, scale, bias, axis, epsilon):
    lead = tuple(range(axis))
    if not _tensor._mode.enabled:
        x2, m, r = _ln_stats(x.data, axis, epsilon, ans.data)
        _, ds, _ = _C.layer_norm_backward(_contiguous(g.data).reshape(x2.shape), x2,
                                          _contiguous(scale.data).reshape(-1), m, r,
                                          want_dx=False)
        return _wrap(ds.reshape(scale.shape))
    xhat, _, _ = _composite_parts(x, scale, axis, epsilon)
    return _sum(multiply(g, xhat), axis=lead) if lead else multiply(g, xhat)


def _ln_vjp_bias(g, ans, x, scale, bias, axis, epsilon):
    lead = tuple(range(axis))
    return _sum(g, axis=lead) if lead else g


defvjp(_layer_norm, _ln_vjp_x, _ln_vjp_scale, _ln_vjp_bias)


def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5):
    """Layer normalisation over the axes ``axis, ..., ndim - 1`` (ONNX LayerNormalization,
    ``torch.nn.functional.layer_norm``): ``(x - mean) / sqrt(var + epsilon) * scale + bias``,
    with the mean and the (biased) variance taken over those axes; ``scale`` and ``bias``
    broadcast to the normalised shape ``x.shape[axis:]``."""
    x, scale = as_tensor(x), as_tensor(scale)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: {axis} is out of range for a tensor of rank {x.ndim}")
    axis %= x.ndim
    norm = x.shape[axis:]
    if bias is None:
        bias = _wrap(np.zeros(norm, x.data.dtype))
    bias = as_tensor(bias)
    for name, t in (("scale", scale), ("bias", bias)):
        if t.data.dtype != x.data.dtype:
            raise TypeError(f"{name}: expected {x.data.dtype} (the dtype of x), got "
                            f"{t.data.dtype}")
        try:
            np.broadcast_shapes(t.shape, norm)
        except ValueError:
            raise ValueError(f"{name}: shape {t.shape} does not broadcast to the normalised "
                             f"shape {norm}") from None
        if len(t.shape) > len(norm):
            raise ValueError(f"{name}: shape {t.shape} has more axes than the normalised shape "
                             f"{norm}")
    if _fast(x.data) and scale.shape == norm and bias.shape == norm and x.data.size:
        return _layer_norm(x, scale, bias, axis=axis, epsilon=float(epsilon))
    xhat, _, _ = _composite_parts(x, scale, axis, epsilon)
    return add(multiply(xhat, scale), bias)


# ---------------------------------------------------------------------------------------------
# elementwise maximum and minimum
# ---------------------------------------------------------------------------------------------


def _share(a, b, bigger):
    """Where the gradient of ``max(a, b)`` (``bigger``) or ``min`` goes to ``a``: 1, 0, or
    1/2 at ties (as torch.maximum / torch.minimum)."""
    win = (a > b) if bigger else (a < b)
    return np.where(win, 1.0, np.where(a == b, 0.5, 0.0)).astype(a.dtype)


maximum = primitive(np.maximum, name="maximum")
minimum = primitive(np.minimum, name="minimum")
defvjp(maximum,
       lambda g, ans, a, b: unbroadcast(multiply(g, _share(a.data, b.data, True)), a.shape),
       lambda g, ans, a, b: unbroadcast(multiply(g, _share(b.data, a.data, True)), b.shape))
defvjp(minimum,
       lambda g, ans, a, b: unbroadcast(multiply(g, _share(a.data, b.data, False)), a.shape),
       lambda g, ans, a, b: unbroadcast(multiply(g, _share(b.data, a.data, False)), b.shape))
maximum.__doc__ = """``np.maximum``; at ties each argument gets half the gradient."""
minimum.__doc__ = """``np.minimum``; at ties each argument gets half the gradient."""

