"""Neural-network primitives: conv2d, softmax, log_softmax, softmax_cross_entropy, mse, take.

conv2d is three bilinear primitives (the convolution and its two adjoints), each the VJP of the
others, so every derivative order of a convolution is again a convolution.  They unroll (im2col)
in batch chunks into a bounded per-thread workspace (``_kernels.WORKSPACE_BYTES``) and write
their GEMMs straight into the output.
"""
import numpy as np

from ..sparse import IndexedSlices
from . import _kernels as K
from . import _tensor
from ._ops import _wrap, divide, multiply, subtract, sum as _sum_op
from ._registry import as_tensor, defvjp, primitive, zero_vjp
from ._tensor import Tensor

# ---------------------------------------------------------------------------------------------
# conv2d (NCHW, im2col + one BLAS GEMM per group)
# ---------------------------------------------------------------------------------------------


def _pair(v, name):
    if isinstance(v, (int, np.integer)):
        v = (int(v), int(v))
    v = tuple(int(i) for i in v)
    if len(v) != 2:
        raise ValueError(f"{name}: expected an int or a pair of ints, got {v}")
    return v


def _wmat(w, groups):
    o = w.shape[0]
    return w.reshape(groups, o // groups, -1)


def _conv_forward(x, w, b, stride, padding, dilation, groups):
    n = x.shape[0]
    o, _, kh, kw = w.shape
    ho = K.conv_output_size(x.shape[2], kh, stride[0], padding[0], dilation[0])
    wo = K.conv_output_size(x.shape[3], kw, stride[1], padding[1], dilation[1])
    L = ho * wo
    y = K.empty((n, o, L), np.result_type(x, w))
    wm = _wmat(w, groups)
    for n0, n1, cols in K.im2col_chunks(x, kh, kw, stride, padding, dilation):  # (m, R, L)
        m = n1 - n0
        # one GEMM per sample and group, straight into the output
        np.matmul(wm, cols.reshape(m, groups, -1, L),
                  out=y[n0:n1].reshape(m, groups, o // groups, L))
    if b is not None:
        y += b.reshape(o, 1)
    return y.reshape(n, o, ho, wo)


@primitive
def _conv2d(x, w, stride, padding, dilation, groups):
    return _conv_forward(x, w, None, stride, padding, dilation, groups)


@primitive
def _conv2d_bias(x, w, b, stride, padding, dilation, groups):
    return _conv_forward(x, w, b, stride, padding, dilation, groups)


@primitive
def _conv2d_input_grad(g, w, x_shape, stride, padding, dilation, groups):
    """The adjoint of conv2d in x: the gradient of <conv2d(x, w), g> with respect to x."""
    n, o, ho, wo = g.shape
    _, _, kh, kw = w.shape
    L = ho * wo
    dtype = np.result_type(g, w)
    gx = K.empty(tuple(x_shape), dtype)
    g4 = g.reshape(n, groups, o // groups, L)
    wt = _wmat(w, groups).transpose(0, 2, 1)
    rows = wt.shape[0] * wt.shape[1]  # C*kh*kw
    step = K.batch_chunk(rows * L, dtype)
    for n0 in range(0, n, step):
        m = min(n, n0 + step) - n0
        cols = K._workspace(m * rows * L, dtype).reshape(m, groups, -1, L)
        np.matmul(wt, g4[n0:n0 + m], out=cols)
        K.col2im(cols.reshape(m, rows, L), (m,) + tuple(x_shape[1:]), kh, kw, stride, padding,
                 dilation, ho, wo, out=gx[n0:n0 + m])
    return gx


@primitive
def _conv2d_weight_grad(x, g, w_shape, stride, padding, dilation, groups):
    """The adjoint of conv2d in w: the gradient of <conv2d(x, w), g> with respect to w."""
    n, o, ho, wo = g.shape
    _, _, kh, kw = w_shape
    L = ho * wo
    gw = np.zeros((groups, o // groups, w_shape[1] * kh * kw), dtype=np.result_type(x, g))
    g4 = g.reshape(n, groups, o // groups, L)
    for n0, n1, cols in K.im2col_chunks(x, kh, kw, stride, padding, dilation, reuse=True):
        m = n1 - n0
        part = np.matmul(g4[n0:n1], cols.reshape(m, groups, -1, L).transpose(0, 1, 3, 2))
        gw += part.sum(axis=0)
    return gw.reshape(w_shape)


def _x_vjp(g, ans, x, w, *b, **p):
    return _conv2d_input_grad(g, w, x_shape=x.shape, **p)


def _w_vjp(g, ans, x, w, *b, **p):
    return _conv2d_weight_grad(x, g, w_shape=w.shape, **p)


def _b_vjp(g, ans, x, w, b, **p):
    from ._ops import _sum
    return _sum(g, axes=(0, 2, 3), keepdims=False)


defvjp(_conv2d, _x_vjp, _w_vjp)
defvjp(_conv2d_bias, _x_vjp, _w_vjp, _b_vjp)
defvjp(_conv2d_input_grad,
       lambda h, ans, g, w, x_shape, **p: _conv2d(h, w, **p),
       lambda h, ans, g, w, x_shape, **p: _conv2d_weight_grad(h, g, w_shape=w.shape, **p))
defvjp(_conv2d_weight_grad,
       lambda h, ans, x, g, w_shape, **p: _conv2d_input_grad(g, h, x_shape=x.shape, **p),
       lambda h, ans, x, g, w_shape, **p: _conv2d(x, h, **p))


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation, as ONNX Conv and torch.nn.functional.conv2d), NCHW.

    ``x``: (N, C, H, W) (N may be 0); ``w``: (O, C / groups, kh, kw); ``b``: (O,) or None.
    The output size ``(H + 2 ph - dh (kh - 1) - 1) // sh + 1`` (and the same in W) must be >= 1.
    ``y[n, o, p, q] = b[o] + sum_{c, i, j} w[o, c, i, j] *
    xpad[n, g*C/G + c, p*sh + i*dh, q*sw + j*dw]``
    with ``g = o // (O / groups)`` and ``xpad`` x zero-padded by ``padding`` on each side.
    """
    x = as_tensor(x)
    w = as_tensor(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"conv2d: expected 4-D x (N, C, H, W) and w (O, C/groups, kh, kw), "
                         f"got shapes {x.shape} and {w.shape}")
    groups = int(groups)
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups or \
            w.shape[1] * groups != x.shape[1]:
        raise ValueError(f"conv2d: groups={groups} does not divide the channels: x has "
                         f"{x.shape[1]}, w has shape {w.shape}")
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), \
        _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError("conv2d: expected stride >= 1, dilation >= 1 and padding >= 0, got "
                         f"{stride}, {dilation}, {padding}")
    kh, kw = w.shape[2:]
    if kh < 1 or kw < 1 or w.shape[0] < 1:
        raise ValueError(f"w: expected at least one filter of at least 1x1, got shape {w.shape}")
    h, wd = x.shape[2:]
    ho = K.conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    wo = K.conv_output_size(wd, kw, stride[1], padding[1], dilation[1])
    if ho < 1 or wo < 1:
        raise ValueError(
            f"conv2d: output size {ho}x{wo} is less than 1x1: input {h}x{wd} with padding "
            f"{padding} is smaller than the dilated kernel "
            f"{dilation[0] * (kh - 1) + 1}x{dilation[1] * (kw - 1) + 1} (kernel {kh}x{kw}, "
            f"dilation {dilation})")
    if b is None:
        return _conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    b = as_tensor(b)
    if b.shape != (w.shape[0],):
        raise ValueError(f"b: expected shape ({w.shape[0]},), got {b.shape}")
    return _conv2d_bias(x, w, b, stride=stride, padding=padding, dilation=dilation,
                        groups=groups)


# ---------------------------------------------------------------------------------------------
# softmax family
# ---------------------------------------------------------------------------------------------


@primitive
def _softmax(x, axis):
    return K.softmax(x, axis)


@primitive
def _log_softmax(x, axis):
    return K.log_softmax(x, axis)


def _softmax_vjp(g, ans, x, axis):
    if not _tensor._mode.enabled:  # first order: the row kernel where it applies
        dx = K.softmax_vjp(g.data, ans.data, axis)
        if dx is not None:
            return _wrap(dx)
    gs = multiply(g, ans)
    return subtract(gs, multiply(ans, _sum_op(gs, axis=axis, keepdims=True)))


def _log_softmax_vjp(g, ans, x, axis):
    from ._ops import exp
    return subtract(g, multiply(exp(ans), _sum_op(g, axis=axis, keepdims=True)))


defvjp(_softmax, _softmax_vjp)
defvjp(_log_softmax, _log_softmax_vjp)


def softmax(x, axis=-1):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    return _softmax(x, axis=axis)


def log_softmax(x, axis=-1):
    """``x - max - log(sum(exp(x - max)))`` along ``axis``."""
    return _log_softmax(x, axis=axis)


_sce = primitive(K.softmax_cross_entropy, name="_sce")  # the kernel, no frame in between


@primitive
def _sce_grad(logits, labels):
    """``(softmax(logits) - onehot(labels)) / n``: the gradient of ``_sce`` in logits."""
    return K.softmax_cross_entropy_grad(logits, labels, 1.0)


def _sce_vjp(g, ans, logits, labels):
    if not _tensor._mode.enabled and g.data.ndim == 0:
        # first order: fold the scalar seed into the fused kernel (one pass, one allocation)
        return _wrap(K.softmax_cross_entropy_grad(logits.data, labels.data, float(g.data)))
    return multiply(g, _sce_grad(logits, labels))


def _sce_grad_vjp(h, ans, logits, labels):
    s = _softmax(logits, axis=-1)
    hs = multiply(h, s)
    return divide(subtract(hs, multiply(s, _sum_op(hs, axis=-1, keepdims=True))), logits.shape[0])


defvjp(_sce, _sce_vjp, zero_vjp)
defvjp(_sce_grad, _sce_grad_vjp, zero_vjp)


def softmax_cross_entropy(logits, labels):
    """Mean over the batch of ``-log softmax(logits[i])[labels[i]]`` (fused, stable).

    ``logits``: (N, C) floating; ``labels``: (N,) integers in ``[0, C)`` (not differentiable;
    copied when the loss is recorded, so changing the caller's array before ``gradient()``
    changes nothing).  There is no ignore index: a label outside ``[0, C)`` (e.g. -100) raises
    IndexError.
    Computed as ``logsumexp(logits[i]) - logits[i, labels[i]]`` with the row maximum subtracted.
    """
    logits = as_tensor(logits)
    lab = labels.data if isinstance(labels, Tensor) else np.asarray(labels)
    shape = logits.data.shape
    if len(shape) != 2:
        raise ValueError(f"logits: expected shape (N, C), got {shape}")
    if lab.dtype.kind not in "iu":
        raise TypeError(f"labels: expected an integer array, got {lab.dtype}")
    if lab.shape != shape[:1]:
        raise ValueError(f"labels: expected shape ({shape[0]},), got {lab.shape}")
    # a private, read-only copy: the backward pass reads the labels again, and the caller's
    # buffer may have been refilled (or set to an out-of-range value) by then
    lab = np.array(lab, dtype=np.intp, order="C", copy=True)
    K.check_labels(lab, shape[1], "labels")
    lab.flags.writeable = False
    return _sce(logits, _wrap(lab))


@primitive
def _mse(pred, target):
    d = pred - target
    return np.asarray(np.mean(d * d), dtype=d.dtype)


def _mse_vjp_pred(g, ans, pred, target):
    from ._ops import unbroadcast
    d = subtract(pred, target)
    return unbroadcast(multiply(d, multiply(g, 2.0 / d.data.size)), pred.shape)


def _mse_vjp_target(g, ans, pred, target):
    from ._ops import unbroadcast
    d = subtract(target, pred)
    return unbroadcast(multiply(d, multiply(g, 2.0 / d.data.size)), target.shape)


defvjp(_mse, _mse_vjp_pred, _mse_vjp_target)


def mse(pred, target):
    """Mean squared error ``mean((pred - target) ** 2)`` (broadcasting)."""
    return _mse(pred, target)


# ---------------------------------------------------------------------------------------------
# take: embedding lookup with a sparse gradient
# ---------------------------------------------------------------------------------------------


@primitive
def _take(table, indices):
    return np.take(table, indices, axis=0)


@primitive
def _take_grad(g, indices, shape):
    """Dense scatter-add of rows ``g`` at ``indices`` (used when differentiating twice)."""
    out = np.zeros(shape, dtype=g.dtype)
    K.scatter_add_rows(out, indices.reshape(-1), g.reshape((-1,) + tuple(shape[1:])))
    return out


def _take_vjp(g, ans, table, indices):
    if _tensor._mode.enabled:  # create_graph: a differentiable dense gradient
        return _take_grad(g, indices, shape=table.shape)
    rows = g.data.reshape((-1,) + table.shape[1:])
    return IndexedSlices(rows, indices.data.reshape(-1), table.shape)


defvjp(_take, _take_vjp, zero_vjp)
defvjp(_take_grad, lambda h, ans, g, indices, shape: _take(h, indices), zero_vjp)


def take(table, indices):
    """Rows of ``table`` at integer ``indices`` (any shape): ``table[indices]`` along axis 0.

    The gradient with respect to ``table`` is a ``fastadam.IndexedSlices`` (``values`` = the
    gradient rows, ``indices`` = ``indices.ravel()`` as intp, repeats allowed) rather than a
    dense table, ready for a sparse optimizer step; ``.to_dense()`` gives the dense gradient.
    With ``create_graph=True`` the gradient is dense (so it can be differentiated again).
    """
    table = as_tensor(table)
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer array, got {idx.dtype}")
    if table.ndim < 1:
        raise ValueError("table: expected at least one dimension")
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise IndexError(f"indices: values must lie in [0, {table.shape[0]}), got "
                         f"[{idx.min()}, {idx.max()}]")
    # normalised once (checked in range above, so the cast is exact): contiguous intp, which
    # the IndexedSlices gradient carries on to sparse_step_inplace (int32/int64 only)
    if idx.dtype != np.intp or not idx.flags.c_contiguous:
        idx = np.ascontiguousarray(idx, dtype=np.intp)
    return _take(table, _wrap(idx))
