"""More primitives, added for the ONNX front-end: pooling, padding, leaky relu, casts, gathers along
any axis, negative log-likelihood, batch normalisation (inference form).

Same rules as ``_ops``: every VJP is written with recorded primitives, so each op is
differentiable again.  Pooling works on NCHW tensors through a loop over the ``kh * kw`` kernel
offsets (each offset is one strided slice of the padded input), so its adjoints are the same loop
with the slices written instead of read:

- ``avg_pool2d``  -> ``_avg_pool_grad`` (scatter ``g / count`` into every window), whose VJP is
  ``avg_pool2d`` again (the pair is linear and mutually adjoint);
- ``max_pool2d``  -> ``_max_pool_grad`` (scatter ``g`` to each window's first maximum), whose VJP
  in ``g`` is ``_max_pool_select`` (gather at the same positions) and vice versa; the position of
  the maximum is piecewise constant, so nothing flows into ``x`` from the scatter or the gather.
"""
import numpy as np

from . import _kernels as K
from ._ops import (add, divide, getitem, multiply, negative, reshape, sqrt, subtract,
                   sum as _sum_op, where)
from ._registry import as_tensor, defvjp, primitive, zero_vjp
from ._tensor import Tensor, _wrap

# ---------------------------------------------------------------------------------------------
# leaky relu, cast
# ---------------------------------------------------------------------------------------------


@primitive
def _leaky_relu(x, alpha):
    return np.where(x > 0, x, x * x.dtype.type(alpha))


def _leaky_relu_vjp(g, ans, x, alpha):
    return where(x.data > 0, g, multiply(g, alpha))


defvjp(_leaky_relu, _leaky_relu_vjp)


def leaky_relu(x, alpha=0.01):
    """``x if x > 0 else alpha * x`` (ONNX LeakyRelu); the derivative at 0 is ``alpha``."""
    return _leaky_relu(x, alpha=float(alpha))


@primitive
def _cast(x, dtype):
    return x.astype(dtype)


def _cast_vjp(g, ans, x, dtype):
    if x.dtype.kind not in "fc":
        return None
    return _cast(g, dtype=x.dtype)


defvjp(_cast, _cast_vjp)


def cast(x, dtype):
    """``x.astype(dtype)`` (ONNX Cast); floating-point casts are differentiable (cast back)."""
    return _cast(x, dtype=np.dtype(dtype))


# ---------------------------------------------------------------------------------------------
# zero padding
# ---------------------------------------------------------------------------------------------


@primitive
def _pad(x, pads, value):
    return np.pad(x, pads, mode="constant", constant_values=value)


def _pad_vjp(g, ans, x, pads, value):
    index = tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, x.shape))
    return getitem(g, index)


defvjp(_pad, _pad_vjp)


def pad(x, pads, value=0.0):
    """Constant padding: ``pads`` is one ``(before, after)`` pair per axis (``np.pad``'s form)."""
    x = as_tensor(x)
    pads = tuple((int(a), int(b)) for a, b in pads)
    if len(pads) != x.ndim or min(min(p) for p in pads) < 0:
        raise ValueError(f"pads: expected {x.ndim} pairs of non-negative ints, got {pads}")
    return _pad(x, pads=pads, value=value)


# ---------------------------------------------------------------------------------------------
# pooling (NCHW)
# ---------------------------------------------------------------------------------------------


def _pool_geometry(shape, kernel, stride, pads, dilation):
    """Output size and the slices of the padded input seen by each kernel offset."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    hp = shape[2] + pads[0] + pads[2]
    wp = shape[3] + pads[1] + pads[3]
    ho = (hp - (kh - 1) * dh - 1) // sh + 1
    wo = (wp - (kw - 1) * dw - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"kernel_shape: a {kh}x{kw} window (dilation {dh}x{dw}) does not fit in "
                         f"the padded {hp}x{wp} input")
    slices = []
    for i in range(kh):
        for j in range(kw):
            slices.append((slice(None), slice(None),
                           slice(i * dh, i * dh + (ho - 1) * sh + 1, sh),
                           slice(j * dw, j * dw + (wo - 1) * sw + 1, sw)))
    return ho, wo, slices


def _padded(x, pads, value):
    t, l, b, r = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)


def _crop(xp, shape, pads):
    return xp[:, :, pads[0]:pads[0] + shape[2], pads[1]:pads[1] + shape[3]]


def _avg_count(shape, kernel, stride, pads, dilation, count_include_pad, dtype):
    """Divisor per output position: the window size, or the number of non-padding elements."""
    kh, kw = kernel
    if count_include_pad or not any(pads):
        return dtype.type(kh * kw)
    ones = _padded(np.ones((1, 1) + tuple(shape[2:]), dtype=dtype), pads, 0)
    _, _, slices = _pool_geometry(ones.shape[:2] + shape[2:], kernel, stride, pads, dilation)
    return sum(ones[s] for s in slices)


@primitive
def _avg_pool(x, kernel, stride, pads, dilation, count_include_pad):
    xp = _padded(x, pads, 0)
    _, _, slices = _pool_geometry(x.shape, kernel, stride, pads, dilation)
    total = xp[slices[0]].copy()
    for s in slices[1:]:
        total += xp[s]
    return total / _avg_count(x.shape, kernel, stride, pads, dilation, count_include_pad, x.dtype)


@primitive
def _avg_pool_grad(g, x_shape, kernel, stride, pads, dilation, count_include_pad):
    """The adjoint of ``_avg_pool``: every window receives ``g / count``."""
    _, _, slices = _pool_geometry(x_shape, kernel, stride, pads, dilation)
    gc = g / _avg_count(x_shape, kernel, stride, pads, dilation, count_include_pad, g.dtype)
    gp = np.zeros(x_shape[:2] + (x_shape[2] + pads[0] + pads[2], x_shape[3] + pads[1] + pads[3]),
                  dtype=g.dtype)
    for s in slices:
        gp[s] += gc
    return np.ascontiguousarray(_crop(gp, x_shape, pads))


defvjp(_avg_pool, lambda g, ans, x, **p: _avg_pool_grad(g, x_shape=x.shape, **p))
defvjp(_avg_pool_grad, lambda h, ans, g, x_shape, **p: _avg_pool(h, **p))


def _argmax_offsets(x, kernel, stride, pads, dilation):
    """Per output position, the kernel offset of the window's first maximum (padding: -inf,
    or the least integer of an integer dtype)."""
    xp = _padded(x, pads, -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min)
    _, _, slices = _pool_geometry(x.shape, kernel, stride, pads, dilation)
    best = xp[slices[0]].copy()
    which = np.zeros(best.shape, dtype=np.intp)
    for k, s in enumerate(slices[1:], 1):
        v = xp[s]
        better = v > best
        best[better] = v[better]
        which[better] = k
    return best, which, slices


@primitive
def _max_pool(x, kernel, stride, pads, dilation):
    return _argmax_offsets(x, kernel, stride, pads, dilation)[0]


@primitive
def _max_pool_grad(g, x, kernel, stride, pads, dilation):
    """The VJP of ``_max_pool``: ``g`` added at each window's (first) maximum."""
    _, which, slices = _argmax_offsets(x, kernel, stride, pads, dilation)
    gp = np.zeros(x.shape[:2] + (x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]),
                  dtype=g.dtype)
    for k, s in enumerate(slices):
        gp[s] += np.where(which == k, g, 0)
    return np.ascontiguousarray(_crop(gp, x.shape, pads))


@primitive
def _max_pool_select(h, x, kernel, stride, pads, dilation):
    """The adjoint of ``_max_pool_grad`` in ``g``: ``h`` read at each window's maximum."""
    _, which, slices = _argmax_offsets(x, kernel, stride, pads, dilation)
    hp = _padded(h, pads, 0)
    out = np.zeros(which.shape, dtype=h.dtype)
    for k, s in enumerate(slices):
        out += np.where(which == k, hp[s], 0)
    return out


defvjp(_max_pool, lambda g, ans, x, **p: _max_pool_grad(g, x, **p))
defvjp(_max_pool_grad, lambda h, ans, g, x, **p: _max_pool_select(h, x, **p), zero_vjp)
defvjp(_max_pool_select, lambda g, ans, h, x, **p: _max_pool_grad(g, x, **p), zero_vjp)


def _pool_args(x, kernel_shape, strides, pads, dilations):
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D (N, C, H, W) tensor, got shape {x.shape}")
    kernel = tuple(int(k) for k in kernel_shape)
    stride = tuple(int(s) for s in (strides or (1, 1)))
    pads = tuple(int(p) for p in (pads or (0, 0, 0, 0)))
    dilation = tuple(int(d) for d in (dilations or (1, 1)))
    if len(kernel) != 2 or len(stride) != 2 or len(pads) != 4 or len(dilation) != 2:
        raise ValueError(f"kernel_shape/strides/pads/dilations: expected 2/2/4/2 values for a 2-D "
                         f"pool, got {kernel}, {stride}, {pads}, {dilation}")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(pads) < 0:
        raise ValueError(f"kernel_shape, strides, dilations must be >= 1 and pads >= 0, got "
                         f"{kernel}, {stride}, {dilation}, {pads}")
    return x, dict(kernel=kernel, stride=stride, pads=pads, dilation=dilation)


def max_pool2d(x, kernel_shape, strides=None, pads=None, dilations=None):
    """Max pooling over NCHW windows; ``pads`` is ONNX's ``(top, left, bottom, right)``.

    The gradient goes to each window's first maximum (row-major order within the window).
    """
    x, p = _pool_args(x, kernel_shape, strides, pads, dilations)
    return _max_pool(x, **p)


def avg_pool2d(x, kernel_shape, strides=None, pads=None, dilations=None,
               count_include_pad=False):
    """Average pooling over NCHW windows; ``pads`` is ONNX's ``(top, left, bottom, right)``.

    Padding is excluded from the divisor unless ``count_include_pad`` (ONNX AveragePool).
    """
    x, p = _pool_args(x, kernel_shape, strides, pads, dilations)
    return _avg_pool(x, count_include_pad=bool(count_include_pad), **p)


# ---------------------------------------------------------------------------------------------
# gathers along an axis
# ---------------------------------------------------------------------------------------------


@primitive
def _take_along(x, indices, axis):
    return np.take_along_axis(x, indices, axis=axis)


@primitive
def _put_along(g, indices, axis, shape):
    """Zeros of ``shape`` with ``g`` added at ``indices`` along ``axis`` (repeats add up)."""
    out = np.zeros(shape, dtype=g.dtype)
    grids = list(np.indices(indices.shape, sparse=True))
    grids[axis] = indices
    np.add.at(out, tuple(grids), g)
    return out


defvjp(_take_along, lambda g, ans, x, indices, axis: _put_along(
    g, indices, axis=axis, shape=x.shape), zero_vjp)
defvjp(_put_along, lambda h, ans, g, indices, axis, shape: _take_along(h, indices, axis=axis),
       zero_vjp)


def take_along_axis(x, indices, axis):
    """``np.take_along_axis`` (non-negative integer ``indices``), differentiable in ``x``."""
    x = as_tensor(x)
    indices = as_tensor(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer array, got {indices.dtype}")
    return _take_along(x, indices, axis=int(axis) % x.ndim)


@primitive
def _gather(x, indices, axis):
    return np.take(x, indices, axis=axis)


@primitive
def _gather_grad(g, indices, axis, shape):
    """Zeros of ``shape`` with the slices of ``g`` added at ``indices`` along ``axis``."""
    out = np.zeros(shape, dtype=g.dtype)
    moved = np.moveaxis(out, axis, 0)
    gi = np.moveaxis(g, tuple(range(axis, axis + indices.ndim)), tuple(range(indices.ndim)))
    K.scatter_add_rows(moved, indices.reshape(-1), gi.reshape((-1,) + moved.shape[1:]))
    return out


defvjp(_gather, lambda g, ans, x, indices, axis: _gather_grad(
    g, indices, axis=axis, shape=x.shape), zero_vjp)
defvjp(_gather_grad, lambda h, ans, g, indices, axis, shape: _gather(h, indices, axis=axis),
       zero_vjp)


def gather(x, indices, axis=0):
    """ONNX Gather: ``np.take(x, indices, axis)``; negative indices count from the end.

    Out-of-range indices raise ``IndexError``.  The gradient is dense (see ``take`` for the
    sparse embedding gradient along axis 0).
    """
    x = as_tensor(x)
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer array, got {idx.dtype}")
    axis = int(axis)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: {axis} is out of range for a tensor of {x.ndim} dimensions")
    axis %= x.ndim
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"indices: values must lie in [{-n}, {n}), got [{idx.min()}, "
                         f"{idx.max()}]")
    idx = np.where(idx < 0, idx + n, idx).astype(np.intp)
    return _gather(x, _wrap(idx), axis=axis)


# ---------------------------------------------------------------------------------------------
# losses, normalisation
# ---------------------------------------------------------------------------------------------


def nll_loss(log_prob, target, weight=None, reduction="mean", ignore_index=None):
    """ONNX NegativeLogLikelihoodLoss: ``-log_prob[n, target[n, ...], ...] * weight[target]``.

    ``log_prob``: (N, C) or (N, C, d1, ...); ``target``: (N,) or (N, d1, ...) integers in
    ``[0, C)`` (or ``ignore_index``, which contributes 0 and is left out of the mean's weights).
    ``reduction``: "none", "sum", or "mean" (the sum divided by the sum of the weights used).
    """
    log_prob = as_tensor(log_prob)
    tgt = target.data if isinstance(target, Tensor) else np.asarray(target)
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction: expected 'none', 'sum' or 'mean', got {reduction!r}")
    if tgt.dtype.kind not in "iu":
        raise TypeError(f"target: expected an integer array, got {tgt.dtype}")
    shape = log_prob.shape
    if log_prob.ndim < 2 or tgt.shape != shape[:1] + shape[2:]:
        raise ValueError(f"target: expected shape {shape[:1] + shape[2:]} for input of shape "
                         f"{shape}, got {tgt.shape}")
    c = shape[1]
    keep = np.ones(tgt.shape, dtype=bool) if ignore_index is None else tgt != ignore_index
    if np.any(keep & ((tgt < 0) | (tgt >= c))):
        raise IndexError(f"target: class indices must lie in [0, {c}) (or equal ignore_index)")
    safe = np.where(keep, tgt, 0).astype(np.intp)
    picked = reshape(_take_along(log_prob, _wrap(np.expand_dims(safe, 1)), axis=1), tgt.shape)
    w = keep.astype(log_prob.dtype)
    if weight is not None:
        w = w * (weight.data if isinstance(weight, Tensor) else np.asarray(weight))[safe]
    loss = negative(multiply(picked, _wrap(w)))
    if reduction == "none":
        return loss
    total = _sum_op(loss)
    if reduction == "sum":
        return total
    return divide(total, _wrap(np.asarray(w.sum(), dtype=log_prob.dtype)))


def batch_norm(x, scale, bias, mean, var, epsilon=1e-5):
    """Inference batch normalisation over axis 1: ``(x - mean) / sqrt(var + eps) * scale + bias``.

    ``scale``, ``bias``, ``mean``, ``var``: shape (C,); composed of recorded primitives.
    """
    x = as_tensor(x)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    inv = divide(reshape(scale, shape), sqrt(add(reshape(var, shape), epsilon)))
    return add(multiply(subtract(x, reshape(mean, shape)), inv), reshape(bias, shape))

