"""Primitives of transformer models (added for models exported from PyTorch): ``erf``,
``gelu`` (exact and tanh forms), ``layer_norm``, ``maximum`` / ``minimum``, ``attention``.

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


# Phi(x) of a recorded float32 GELU, kept while its output lives: id(output array) -> (weak
# reference to it, Phi).  The first-order VJP reads it instead of evaluating erf again (the
# same bits: the kernels compute Phi the one way); a missing or foreign output recomputes.
_GELU_CDF = {}


def _forget_cdf(key):
    return lambda _ref: _GELU_CDF.pop(key, None)


@primitive
def _gelu_keep(x):
    y, cdf = _C.gelu_cdf_f32(_contiguous(x))
    y = y.reshape(x.shape)
    key = id(y)
    _GELU_CDF[key] = (weakref.ref(y, _forget_cdf(key)), cdf)
    return y


def _gelu_keep_vjp(g, ans, x):
    if not _tensor._mode.enabled:
        kept = _GELU_CDF.get(id(ans.data))
        gd = g.data
        if kept is not None and kept[0]() is ans.data and gd.dtype == np.float32 and \
                gd.shape == ans.data.shape:
            return _wrap(_C.gelu_grad_cdf_f32(_contiguous(gd), _contiguous(x.data),
                                              kept[1]).reshape(gd.shape))
    return _gelu_grad(g, x)


defvjp(_gelu_keep, _gelu_keep_vjp)


def gelu(x, approximate="none"):
    """GELU (ONNX Gelu, ``torch.nn.functional.gelu``): ``x * Phi(x)`` with ``Phi`` the standard
    normal CDF (``approximate="none"``), or ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715
    * x^3)))`` (``approximate="tanh"``)."""
    x = as_tensor(x)
    if approximate == "none":
        if x.data.dtype == np.float32 and _C is not None and _tensor._mode.enabled and \
                (x.requires_grad or x._node is not None):
            return _gelu_keep(x)  # recorded: Phi is kept for the backward pass
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


# The parameter gradients of the last first-order backward call, (dscale, dbias) from the pass
# that computed dx, handed to the VJPs of scale and bias: [weak ref to ans, weak ref to g,
# {argument: gradient}].
_LN_PARAM_GRADS = [None, None, {}]


def _ln_kernel_backward(g, ans, x, scale, bias, axis, epsilon, want_dx, want_params=None):
    """First order: ``dx`` (or None) by the fused kernel, which also computes the gradients
    of scale and bias (kept in ``_LN_PARAM_GRADS``) when either needs one (``want_params``
    None: when either requires gradients)."""
    x2, m, r = _ln_stats(x.data, axis, epsilon, ans.data)
    if want_params is None:
        want_params = scale.requires_grad or bias.requires_grad
    dx, ds, db = _C.layer_norm_backward(_contiguous(g.data).reshape(x2.shape), x2,
                                        _contiguous(scale.data).reshape(-1), m, r,
                                        want_dx=want_dx, want_params=want_params)
    if want_params:
        _LN_PARAM_GRADS[:] = [weakref.ref(ans.data), weakref.ref(g.data),
                              {1: ds.reshape(scale.shape), 2: db.reshape(bias.shape)}]
    return None if dx is None else dx.reshape(x.shape)


def _ln_kept_param_grad(i, g, ans):
    kept = _LN_PARAM_GRADS
    if kept[0] is not None and kept[0]() is ans.data and kept[1]() is g.data and i in kept[2]:
        out = kept[2].pop(i)
        if not kept[2]:
            kept[:] = [None, None, {}]
        return out
    return None


def _ln_vjp_x(g, ans, x, scale, bias, axis, epsilon):
    if not _tensor._mode.enabled:  # first order: the fused kernel
        return _wrap(_ln_kernel_backward(g, ans, x, scale, bias, axis, epsilon, True))
    xhat, rstd, axes = _composite_parts(x, scale, axis, epsilon)
    gs = multiply(g, scale)
    inner = subtract(subtract(gs, mean(gs, axis=axes, keepdims=True)),
                     multiply(xhat, mean(multiply(gs, xhat), axis=axes, keepdims=True)))
    return multiply(rstd, inner)


def _ln_vjp_scale(g, ans, x, scale, bias, axis, epsilon):
    lead = tuple(range(axis))
    if not _tensor._mode.enabled:
        ds = _ln_kept_param_grad(1, g, ans)
        if ds is None:  # (x needs no gradient: this call computes the parameters' two)
            _ln_kernel_backward(g, ans, x, scale, bias, axis, epsilon, False, True)
            ds = _ln_kept_param_grad(1, g, ans)
        return _wrap(ds)
    xhat, _, _ = _composite_parts(x, scale, axis, epsilon)
    return _sum(multiply(g, xhat), axis=lead) if lead else multiply(g, xhat)


def _ln_vjp_bias(g, ans, x, scale, bias, axis, epsilon):
    lead = tuple(range(axis))
    if not _tensor._mode.enabled:  # the kernel's float64 column sums, as with dscale
        db = _ln_kept_param_grad(2, g, ans)
        if db is None:
            _ln_kernel_backward(g, ans, x, scale, bias, axis, epsilon, False, True)
            db = _ln_kept_param_grad(2, g, ans)
        return _wrap(db)
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



# ---------------------------------------------------------------------------------------------
# attention: softmax(scale * (q @ kt) + mask) @ v in one kernel
# ---------------------------------------------------------------------------------------------

# The forward kernel's operands and probabilities, kept while its output lives (as
# _FORWARD_STATS): id(output array) -> (weak reference to it, parts, probabilities).
_ATTENTION_SAVED = {}
# The last backward call's gradients, handed out one argument at a time (the engine asks for
# each argument's VJP in turn): [weak ref to ans, weak ref to g, {argument: gradient}].
_ATTENTION_GRADS = [None, None, {}]


def _strided_rows(a):
    """``a`` as the attention kernels read it: its rows strided (a view, no copy) when its last
    axis has unit stride and its rows a positive one, else a C-contiguous copy."""
    st, item = a.strides, a.itemsize
    if (a.shape[-1] < 2 or st[-1] == item) and (a.shape[-2] < 2 or st[-2] > 0) and \
            all(x % item == 0 for x in st) and a.flags.aligned:
        return a
    return np.ascontiguousarray(a)


def _attention_parts(q, kt, v, mask):
    """``(q, kt, v, m3, ncols)``: the operands as the float32 kernel takes them (strided
    views where it can read them, the mask (1 or BH, T, S) C-contiguous) and the live
    columns of each mask row; None where the kernel does not apply (another dtype,
    broadcasting batch axes, a mask that does not broadcast by leading axes only)."""
    if not attention_fuses(q, kt, v, mask):
        return None
    T, S = q.shape[-2], kt.shape[-1]
    m3 = _contiguous(mask.reshape(-1, T, S))
    # a row's live columns (above the lowest float32; NaN is live) end at its last live one;
    # a row with none is computed whole
    ncols = _C.attention_live_columns(m3)
    return _strided_rows(q), _strided_rows(kt), _strided_rows(v), m3, ncols


def attention_fuses(q, kt, v, mask):
    """True when ``attention(q, kt, v, mask)`` on these arrays runs the fused kernel: float32
    operands of one rank >= 3 with the same batch axes, ``q`` (..., T, d), ``kt`` (..., d, S),
    ``v`` (..., S, e), none of them empty, and a mask of shape (T, S) with leading axes of 1
    or the batch axes."""
    if _C is None or not (q.dtype == kt.dtype == v.dtype == mask.dtype == np.float32):
        return False
    if q.ndim < 3 or kt.ndim != q.ndim or v.ndim != q.ndim or not 2 <= mask.ndim <= q.ndim:
        return False
    batch, (T, d), S, e = q.shape[:-2], q.shape[-2:], kt.shape[-1], v.shape[-1]
    if kt.shape[:-2] != batch or v.shape[:-2] != batch or kt.shape[-2] != d or \
            v.shape[-2] != S or mask.shape[-2:] != (T, S) or 0 in q.shape + (S, e):
        return False
    lead = mask.shape[:-2]
    return all(n == 1 for n in lead) or lead == batch


def _forget_attention(key):
    return lambda _ref: _ATTENTION_SAVED.pop(key, None)


@primitive
def _attention(q, kt, v, mask, scale):
    parts = _attention_parts(q, kt, v, mask)
    if parts is None:
        from ._kernels import softmax
        s = np.matmul(q, kt)
        if scale != 1.0:
            s = s * s.dtype.type(scale)
        return np.matmul(softmax(s + mask, -1), v)
    o, probs = _C.attention_f32(*parts, alpha=scale)
    o = o.reshape(q.shape[:-1] + v.shape[-1:])
    key = id(o)
    _ATTENTION_SAVED[key] = (weakref.ref(o, _forget_attention(key)), parts, probs)
    return o


def _attention_kernel_grads(g, ans, q, kt, v, mask, scale):
    """``{0: dq, 1: dkt, 2: dv}`` by the backward kernel (the last call's, when ``g`` and
    ``ans`` are the same arrays), or None where the kernel does not apply."""
    cache = _ATTENTION_GRADS
    if cache[0] is not None and cache[0]() is ans and cache[1]() is g:
        return cache[2]
    if g.dtype != np.float32:
        return None
    kept = _ATTENTION_SAVED.get(id(ans))
    if kept is not None and kept[0]() is ans:
        parts, probs = kept[1], kept[2]
    else:
        parts = _attention_parts(q, kt, v, mask)
        if parts is None:
            return None
        _, probs = _C.attention_f32(*parts, alpha=scale)
    q3, kt3, v3, _, ncols = parts
    dq, dkt, dv = _C.attention_backward_f32(_strided_rows(g), q3, kt3, v3, probs,
                                            ncols, alpha=scale)
    grads = {0: dq.reshape(q.shape), 1: dkt.reshape(kt.shape), 2: dv.reshape(v.shape)}
    cache[:] = [weakref.ref(ans), weakref.ref(g), grads]
    return grads


def _attention_composite_vjp(i, g, q, kt, v, mask, scale):
    """The VJP of argument ``i`` with the engine's own operations (recorded when
    ``create_graph`` is on; the mask's gradient; dtypes and shapes the kernel does not
    take)."""
    from ._nn import softmax
    from ._ops import _mT, matmul
    s = matmul(q, kt)
    if scale != 1.0:
        s = multiply(s, scale)
    p = softmax(add(s, mask), axis=-1)
    if i == 2:
        return unbroadcast(matmul(_mT(p), g), v.shape)
    dp = matmul(g, _mT(v))
    ds = multiply(p, subtract(dp, _sum(multiply(dp, p), axis=-1, keepdims=True)))
    if i == 3:
        return unbroadcast(ds, mask.shape)
    if scale != 1.0:
        ds = multiply(ds, scale)
    if i == 0:
        return unbroadcast(matmul(ds, _mT(kt)), q.shape)
    return unbroadcast(matmul(_mT(q), ds), kt.shape)


def _attention_vjp(i):
    def vjp(g, ans, q, kt, v, mask, scale):
        if i < 3 and not _tensor._mode.enabled:  # first order: the fused backward kernel
            grads = _attention_kernel_grads(g.data, ans.data, q.data, kt.data, v.data,
                                            mask.data, scale)
            if grads is not None:
                out = grads.pop(i, None)
                if not grads:
                    _ATTENTION_GRADS[:] = [None, None, {}]
                if out is not None:
                    return _wrap(out)
        return _attention_composite_vjp(i, g, q, kt, v, mask, scale)
    return vjp


defvjp(_attention, *[_attention_vjp(i) for i in range(4)])


def attention(q, kt, v, mask=None, scale=1.0):
    """``softmax(scale * (q @ kt) + mask, axis=-1) @ v`` (scaled dot-product attention with the
    key already transposed, as exported ONNX graphs compute it): ``q`` (..., T, d), ``kt``
    (..., d, S), ``v`` (..., S, e), ``mask`` added to the scores (broadcast; None: no mask),
    ``scale`` a number (not differentiated).

    Float32 operands with the same batch axes and a mask of shape (T, S) (or with leading
    axes of 1, or the full batch) run one fused kernel per batch-head, forward and backward,
    that never forms the (..., T, S) scores in memory, and skips each row's trailing columns
    masked with -inf or the lowest float32 (a causal mask: about half the work); their
    probabilities are exactly 0 in the unfused softmax too.  Everything else runs NumPy's
    matmul and the softmax kernel.  The mask's gradient, and every gradient with
    ``create_graph=True``, is composed from the engine's operations."""
    q, kt, v = as_tensor(q), as_tensor(kt), as_tensor(v)
    if mask is None:
        mask = _wrap(np.zeros((), q.data.dtype))
    return _attention(q, kt, v, as_tensor(mask), scale=float(scale))
