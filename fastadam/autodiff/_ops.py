"""Array primitives: broadcasting arithmetic, matmul, elementwise functions, reductions, shapes.

Every VJP below is written with these same primitives, so it is itself differentiable.
Broadcasting is undone in one place, ``unbroadcast`` (the ``sum_to`` primitive).
"""
import builtins

import numpy as np

from . import _kernels as K
from . import _tensor
from ._registry import as_tensor, defvjp, defvjp_argnum, primitive, zero_vjp
from ._tensor import Tensor, _wrap

# ---------------------------------------------------------------------------------------------
# broadcasting
# ---------------------------------------------------------------------------------------------


@primitive
def sum_to(x, shape):
    """Sum ``x`` down to ``shape`` (undo NumPy broadcasting)."""
    return K.sum_to(x, shape)


@primitive(view=True)
def broadcast_to(x, shape):
    """``np.broadcast_to``: a read-only view (no copy; consumers never write into it)."""
    return np.broadcast_to(x, shape)


defvjp(sum_to, lambda g, ans, x, shape: broadcast_to(g, shape=x.shape))
defvjp(broadcast_to, lambda g, ans, x, shape: sum_to(g, shape=x.shape))


def unbroadcast(g, shape):
    """The cotangent of an operand of shape ``shape`` that was broadcast to ``g.shape``."""
    if g.data.shape == shape:
        return g
    if not _tensor._mode.enabled:  # first order: skip the primitive wrapper
        return _wrap(np.asarray(K.sum_to(g.data, shape)))
    return sum_to(g, shape=shape)


# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------


# NumPy's ufuncs are the primitives' functions themselves: no Python frame between the tape
# and the C loop (the tape's own cost per operation is what the overhead goal measures)
add = primitive(np.add, name="add")
subtract = primitive(np.subtract, name="subtract")
multiply = primitive(np.multiply, name="multiply")
divide = primitive(np.divide, name="divide")
power = primitive(np.power, name="power")
negative = primitive(np.negative, name="negative")


defvjp(add, lambda g, ans, a, b: unbroadcast(g, a.shape),
       lambda g, ans, a, b: unbroadcast(g, b.shape))
defvjp(subtract, lambda g, ans, a, b: unbroadcast(g, a.shape),
       lambda g, ans, a, b: unbroadcast(negative(g), b.shape))
defvjp(multiply, lambda g, ans, a, b: unbroadcast(multiply(g, b), a.shape),
       lambda g, ans, a, b: unbroadcast(multiply(g, a), b.shape))
defvjp(divide, lambda g, ans, a, b: unbroadcast(divide(g, b), a.shape),
       lambda g, ans, a, b: unbroadcast(negative(multiply(g, divide(ans, b))), b.shape))
defvjp(negative, lambda g, ans, a: negative(g))


def _power_vjp_a(g, ans, a, b):
    return unbroadcast(multiply(g, multiply(b, power(a, subtract(b, 1)))), a.shape)


def _power_vjp_b(g, ans, a, b):
    safe = where(a.data > 0, a, 1)
    return unbroadcast(multiply(g, multiply(ans, log(safe))), b.shape)


defvjp(power, _power_vjp_a, _power_vjp_b)

# ---------------------------------------------------------------------------------------------
# matrix products
# ---------------------------------------------------------------------------------------------


matmul = primitive(np.matmul, name="matmul")  # ``a @ b``: NumPy's rules and BLAS


def _mT(t):
    if t.ndim == 2:
        return transpose(t)
    axes = list(range(t.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return transpose(t, tuple(axes))


def _matmul_vjp_a(g, ans, a, b):
    if a.data.ndim == 2 and b.data.ndim == 2:
        if not _tensor._mode.enabled:  # first order: one BLAS call, no wrappers
            return _wrap(np.matmul(g.data, b.data.T))
        return matmul(g, transpose(b))
    if b.ndim == 1:
        if a.ndim == 1:
            return multiply(g, b)
        return unbroadcast(multiply(reshape(g, g.shape + (1,)), b), a.shape)
    if a.ndim == 1:
        gb = matmul(b, reshape(g, g.shape + (1,)))
        return unbroadcast(reshape(gb, gb.shape[:-1]), a.shape)
    return unbroadcast(matmul(g, _mT(b)), a.shape)


def _matmul_vjp_b(g, ans, a, b):
    if a.data.ndim == 2 and b.data.ndim == 2:
        if not _tensor._mode.enabled:
            return _wrap(np.matmul(a.data.T, g.data))
        return matmul(transpose(a), g)
    if a.ndim == 1:
        if b.ndim == 1:
            return multiply(g, a)
        outer = multiply(reshape(a, (a.shape[0], 1)), reshape(g, g.shape[:-1] + (1, g.shape[-1])))
        return unbroadcast(outer, b.shape)
    if b.ndim == 1:
        ga = matmul(reshape(g, g.shape[:-1] + (1, g.shape[-1])), a)
        return unbroadcast(reshape(ga, ga.shape[:-2] + ga.shape[-1:]), b.shape)
    return unbroadcast(matmul(_mT(a), g), b.shape)


defvjp(matmul, _matmul_vjp_a, _matmul_vjp_b)


def _matmul_nt(a, b):
    return np.matmul(a, b.T)


# ``a @ b.T`` for 2-D a and b as one recorded op (ONNX Gemm with transB=1, the layout of
# torch.nn.Linear's weight): no transpose node on the tape, each gradient one BLAS call.
matmul_nt = primitive(_matmul_nt, name="matmul_nt")


def _matmul_nt_vjp_a(g, ans, a, b):
    if not _tensor._mode.enabled:  # first order: one BLAS call, no wrappers
        return _wrap(np.matmul(g.data, b.data))
    return matmul(g, b)


def _matmul_nt_vjp_b(g, ans, a, b):
    if not _tensor._mode.enabled:
        return _wrap(np.matmul(g.data.T, a.data))
    return matmul(transpose(g), a)


defvjp(matmul_nt, _matmul_nt_vjp_a, _matmul_nt_vjp_b)


@primitive
def _matmul_nt_add(a, b, c):
    y = np.matmul(a, b.T)
    np.add(y, c, out=y)  # the product is this op's own: the bias is added in place
    return y


# ``a @ b.T + c`` (Gemm with transB=1 and a bias (n,): a torch.nn.Linear) as one recorded op:
# the values and gradients of ``add(matmul_nt(a, b), c)`` bit for bit, one tape node and one
# allocation less
defvjp(_matmul_nt_add, lambda g, ans, a, b, c: _matmul_nt_vjp_a(g, ans, a, b),
       lambda g, ans, a, b, c: _matmul_nt_vjp_b(g, ans, a, b),
       lambda g, ans, a, b, c: unbroadcast(g, c.shape))


def _rows2(x):
    """``x`` (..., n) as a 2-D (rows, n) array (a view when its layout allows)."""
    return x if x.ndim == 2 else x.reshape(-1, x.shape[-1])


@primitive
def _matmul_add(a, b, c):
    y = np.matmul(_rows2(a), b)
    np.add(y, c, out=y)  # the product is this op's own: the bias is added in place
    return y if a.ndim == 2 else y.reshape(a.shape[:-1] + (b.shape[1],))


def _matmul_add_vjp_a(g, ans, a, b, c):
    if not _tensor._mode.enabled:
        return _wrap(np.matmul(_rows2(g.data), b.data.T).reshape(a.shape))
    return reshape(matmul(reshape(g, (-1, g.shape[-1])), transpose(b)), a.shape)


def _matmul_add_vjp_b(g, ans, a, b, c):
    if not _tensor._mode.enabled:
        return _wrap(np.matmul(_rows2(a.data).T, _rows2(g.data)))
    return matmul(transpose(reshape(a, (-1, a.shape[-1]))), reshape(g, (-1, g.shape[-1])))


defvjp(_matmul_add, _matmul_add_vjp_a, _matmul_add_vjp_b,
       lambda g, ans, a, b, c: unbroadcast(g, c.shape))


def matmul_add(a, b, c):
    """``a @ b + c`` with ``a`` (..., k), ``b`` (k, n) and ``c`` (n,) (a linear layer whose
    weight is stored (in, out), as exported graphs write it: MatMul then Add) as one
    operation: the bias is added into the product's own buffer, and one recorded op replaces
    two.  The values and gradients are those of ``add(matmul(a, b), c)``, bit for bit (the
    same BLAS calls, additions and sums); other shapes or mixed dtypes run as that."""
    a, b, c = as_tensor(a), as_tensor(b), as_tensor(c)
    ad, bd, cd = a.data, b.data, c.data
    if (ad.ndim >= 2 and bd.ndim == 2 and cd.ndim == 1 and ad.shape[-1] == bd.shape[0]
            and cd.shape[0] == bd.shape[1] and ad.dtype == bd.dtype == cd.dtype
            and ad.dtype.kind == "f"):
        return _matmul_add(a, b, c)
    return add(matmul(a, b), c)


def gemm(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    """ONNX Gemm: ``alpha * op(a) @ op(b) + beta * c`` (``op`` transposes when asked); 2-D only."""
    a = as_tensor(a)
    b = as_tensor(b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm: expected 2-D a and b, got shapes {a.shape} and {b.shape}")
    if trans_b and not trans_a:
        if c is not None and alpha == 1 and beta == 1:
            c = as_tensor(c)
            ad, bd, cd = a.data, b.data, c.data
            if cd.ndim == 1 and cd.shape[0] == bd.shape[0] and ad.shape[1] == bd.shape[1] \
                    and ad.dtype == bd.dtype == cd.dtype and ad.dtype.kind == "f":
                return _matmul_nt_add(a, b, c)
        y = matmul_nt(a, b)
    else:
        y = matmul(transpose(a) if trans_a else a, transpose(b) if trans_b else b)
    if alpha != 1:
        y = multiply(y, alpha)
    if c is not None:
        y = add(y, c if beta == 1 else multiply(c, beta))
    return y


# ---------------------------------------------------------------------------------------------
# elementwise functions
# ---------------------------------------------------------------------------------------------


exp = primitive(np.exp, name="exp")


log = primitive(np.log, name="log")


sqrt = primitive(np.sqrt, name="sqrt")


abs = primitive(np.abs, name="abs")  # noqa: A001 - NumPy's name
sign = primitive(np.sign, name="sign")


def _kernel_primitive(kernel, name, doc):
    """The kernel itself as the primitive's function (no Python frame in between)."""
    prim = primitive(kernel, name=name)
    prim.__doc__ = doc
    return prim


relu = _kernel_primitive(
    K.relu, "relu",
    """``max(x, 0)``; the derivative at 0 is taken as 0.  NaN stays NaN (as torch.relu).""")
relu_grad = _kernel_primitive(
    K.relu_grad, "relu_grad",
    """``0 where x <= 0, else g`` (the VJP of relu; a NaN x passes g on, as in PyTorch).""")
sigmoid = _kernel_primitive(
    K.sigmoid, "sigmoid", """``1 / (1 + exp(-x))``, evaluated without overflow.""")
sigmoid_grad = _kernel_primitive(
    K.sigmoid_grad, "sigmoid_grad",
    """``g * s * (1 - s)`` with ``s = sigmoid(x)`` (the VJP of sigmoid).""")
tanh = primitive(np.tanh, name="tanh")
tanh_grad = _kernel_primitive(
    K.tanh_grad, "tanh_grad",
    """``g * (1 - t * t)`` with ``t = tanh(x)`` (the VJP of tanh).""")


defvjp(exp, lambda g, ans, x: multiply(g, ans))
defvjp(log, lambda g, ans, x: divide(g, x))
defvjp(sqrt, lambda g, ans, x: divide(multiply(g, 0.5), ans))
defvjp(abs, lambda g, ans, x: multiply(g, sign(x)))
defvjp(sign, zero_vjp)
defvjp(relu, lambda g, ans, x: relu_grad(g, x))
defvjp(relu_grad, lambda h, ans, g, x: relu_grad(h, x), zero_vjp)
defvjp(sigmoid, lambda g, ans, x: sigmoid_grad(g, ans))
defvjp(sigmoid_grad, lambda h, ans, g, s: sigmoid_grad(h, s),
       lambda h, ans, g, s: multiply(multiply(h, g), subtract(1, multiply(s, 2))))
defvjp(tanh, lambda g, ans, x: tanh_grad(g, ans))
defvjp(tanh_grad, lambda h, ans, g, t: tanh_grad(h, t),
       lambda h, ans, g, t: multiply(multiply(h, g), multiply(t, -2)))


@primitive
def astype(x, dtype):
    """``x.astype(dtype)`` (a copy); the gradient is cast back to ``x``'s dtype."""
    return x.astype(dtype)


defvjp(astype, lambda g, ans, x, dtype: astype(g, dtype=x.dtype))


@primitive
def where(cond, x, y):
    """``np.where(cond, x, y)``; ``cond`` is not differentiable."""
    return np.where(cond, x, y)


defvjp(where, zero_vjp,
       lambda g, ans, c, x, y: unbroadcast(where(c, g, 0), x.shape),
       lambda g, ans, c, x, y: unbroadcast(where(c, 0, g), y.shape))


@primitive
def _clip(x, lo, hi):
    return np.clip(x, lo, hi)


def clip(x, lo=None, hi=None):
    """``np.clip(x, lo, hi)`` (scalar bounds); the gradient is 1 inside ``[lo, hi]``, else 0.
    NaN stays NaN and gets gradient 0 (as torch.clamp)."""
    return _clip(x, lo=lo, hi=hi)


def _clip_vjp(g, ans, x, lo=None, hi=None):
    inside = np.ones(x.shape, dtype=bool)
    if lo is not None:
        inside &= x.data >= lo
    if hi is not None:
        inside &= x.data <= hi
    return where(inside, g, 0)


defvjp(_clip, _clip_vjp)

# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = []
    for a in axis:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"axis: {a} is out of range for a tensor of {ndim} dimensions")
        out.append(a % builtins.max(ndim, 1))
    return tuple(sorted(out))


def _kept_shape(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


@primitive
def _sum(x, axes, keepdims):
    return np.sum(x, axis=axes, keepdims=keepdims)


@primitive
def _mean(x, axes, keepdims):
    return np.mean(x, axis=axes, keepdims=keepdims)


@primitive
def _max(x, axes, keepdims):
    return np.max(x, axis=axes, keepdims=keepdims)


def _expand(g, x, axes, keepdims):
    if not keepdims:
        g = reshape(g, _kept_shape(x.shape, axes))
    return broadcast_to(g, shape=x.shape)


def _mean_vjp(g, ans, x, axes, keepdims):
    count = 1
    for a in axes:
        count *= x.shape[a]
    return _expand(divide(g, count or 1), x, axes, keepdims)  # divide before broadcasting


def _max_vjp(g, ans, x, axes, keepdims):
    xd = x.data
    top = np.max(xd, axis=axes, keepdims=True)
    hit = xd == top
    nan_top = np.isnan(top)
    if nan_top.any():  # NaN is the maximum (as np.max and torch.max): the NaNs share the gradient
        hit |= np.isnan(xd) & nan_top
    mask = hit.astype(x.dtype)
    mask /= mask.sum(axis=axes, keepdims=True)  # ties share the gradient equally
    return multiply(_expand(g, x, axes, keepdims), _wrap(mask))


defvjp(_sum, lambda g, ans, x, axes, keepdims: _expand(g, x, axes, keepdims))
defvjp(_mean, _mean_vjp)
defvjp(_max, _max_vjp)


def sum(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Sum over ``axis`` (int, tuple or None for all)."""
    x = as_tensor(x)
    return _sum(x, axes=_axes(axis, x.ndim), keepdims=bool(keepdims))


def mean(x, axis=None, keepdims=False):
    """Mean over ``axis`` (int, tuple or None for all)."""
    x = as_tensor(x)
    return _mean(x, axes=_axes(axis, x.ndim), keepdims=bool(keepdims))


def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Maximum over ``axis``; tied maxima share the gradient equally.  NaN propagates: a slice
    holding NaN has maximum NaN and its NaN entries share the gradient (as ``torch.max``)."""
    x = as_tensor(x)
    return _max(x, axes=_axes(axis, x.ndim), keepdims=bool(keepdims))


# ---------------------------------------------------------------------------------------------
# shapes, indexing
# ---------------------------------------------------------------------------------------------


@primitive(view=True)
def _reshape(x, shape):
    return x.reshape(shape)  # (the method: np.reshape's dispatch costs a microsecond a call)


defvjp(_reshape, lambda g, ans, x, shape: _reshape(g, shape=x.shape))


def reshape(x, shape):
    """``np.reshape`` (a view when possible)."""
    if isinstance(shape, int):
        shape = (shape,)
    return _reshape(x, shape=tuple(shape))


@primitive(view=True)
def _transpose(x, axes):
    return x.transpose(axes)


_INVERSE_AXES = {}  # axes -> the inverse permutation (a VJP's; np.argsort costs more)


def _inverse_axes(axes):
    inv = _INVERSE_AXES.get(axes)
    if inv is None:
        out = [0] * len(axes)
        for i, a in enumerate(axes):
            out[a % len(axes)] = i
        inv = _INVERSE_AXES[axes] = tuple(out)
    return inv


defvjp(_transpose, lambda g, ans, x, axes: _transpose(
    g, axes=None if axes is None else _inverse_axes(axes)))


def transpose(x, axes=None):
    """``np.transpose`` (a view)."""
    return _transpose(x, axes=None if axes is None else tuple(axes))


@primitive
def _concatenate(*xs, axis):
    return np.concatenate(xs, axis=axis)


def _concatenate_vjp(argnum, g, ans, *xs, axis):
    start = 0
    for t in xs[:argnum]:
        start += t.shape[axis]
    index = [slice(None)] * g.ndim
    index[axis] = slice(start, start + xs[argnum].shape[axis])
    return getitem(g, tuple(index))


defvjp_argnum(_concatenate, _concatenate_vjp)


def concatenate(tensors, axis=0):
    """``np.concatenate`` of a sequence of tensors."""
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("tensors: expected at least one tensor to concatenate")
    return _concatenate(*tensors, axis=axis % tensors[0].ndim)


def _plain_index(index):
    """Tensors inside an index become their arrays (indices are never differentiated)."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def _is_basic(index):
    items = index if isinstance(index, tuple) else (index,)
    for i in items:
        if not (i is None or i is Ellipsis or isinstance(i, (int, slice, np.integer))):
            return False
    return True


@primitive(view=True)
def _getitem(x, index):
    return x[index]


@primitive
def _getitem_grad(g, index, shape):
    """Zeros of ``shape`` with ``g`` added at ``index`` (repeated advanced indices add up)."""
    out = np.zeros(shape, dtype=g.dtype)
    if _is_basic(index):
        out[index] = g
    else:
        np.add.at(out, index, g)
    return out


defvjp(_getitem, lambda g, ans, x, index: _getitem_grad(g, index=index, shape=x.shape))
defvjp(_getitem_grad, lambda h, ans, g, index, shape: _getitem(h, index=index))


def getitem(x, index):
    """``x[index]``: basic and advanced NumPy indexing."""
    return _getitem(x, index=_plain_index(index))
