"""Array kernels behind the hot primitives: compiled (fastadam._autodiff_kernels) for contiguous
float32/float64 arrays, NumPy otherwise (other dtypes, strided views).

Every function takes and returns ndarrays and allocates its output; none is recorded.
"""
import threading

import numpy as np

try:
    from .. import _autodiff_kernels as _C
except ImportError:  # pragma: no cover - source tree without a build
    _C = None

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _fast(*arrays):
    if _C is None:
        return False
    dt = arrays[0].dtype
    for a in arrays:
        if a.dtype != dt or dt not in _FAST or not a.flags.c_contiguous:
            return False
    return True


def sum_to(x, shape):
    """Sum ``x`` over the axes NumPy broadcasting added or stretched to reach ``x.shape``."""
    xs = x.shape
    if xs == shape:
        return x
    lead = len(xs) - len(shape)
    if lead == 1 and xs[1:] == shape:
        if x.size < 8192 or not _fast(x):  # small: NumPy's reduction is cheaper to call
            return np.add.reduce(x, axis=0)
        return _C.sum_rows(x.reshape(xs[0], -1)).reshape(shape)
    if lead >= 1 and xs[lead:] == shape and _fast(x):
        rows = 1
        for d in xs[:lead]:
            rows *= d
        return _C.sum_rows(x.reshape(rows, -1)).reshape(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return np.sum(x, axis=axes).reshape(shape)


def relu(x):
    if _fast(x):
        return _C.relu(x)
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def relu_grad(g, x):
    if g.shape == x.shape and _fast(g, x):
        return _C.relu_grad(g, x)
    if g.shape == x.shape and _C is not None and g.dtype == x.dtype and _fast(x) \
            and not np.any(g.strides):  # a broadcast scalar (e.g. the VJP of mean)
        return _C.relu_grad_scalar(float(g.flat[0]), x)
    return np.where(x > 0, g, 0).astype(np.result_type(g, x), copy=False)


def sigmoid(x):
    if _fast(x):
        return _C.sigmoid(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def sigmoid_grad(g, s):
    if g.shape == s.shape and _fast(g, s):
        return _C.sigmoid_grad(g, s)
    return g * s * (1 - s)


def tanh_grad(g, t):
    if g.shape == t.shape and _fast(g, t):
        return _C.tanh_grad(g, t)
    return g * (1 - t * t)


def check_labels(labels, c, name):
    """IndexError unless every value of ``labels`` (contiguous intp) lies in ``[0, c)``."""
    if _C is not None:
        _C.check_labels(labels, c, name)
    elif labels.size and (labels.min() < 0 or labels.max() >= c):
        raise IndexError(f"{name}: values must lie in [0, {c}), got "
                         f"[{labels.min()}, {labels.max()}]")


def softmax_cross_entropy(logits, labels):
    """mean_i (logsumexp(logits[i]) - logits[i, labels[i]]) as a 0-d array of logits' dtype."""
    n, c = logits.shape
    if _fast(logits):
        return np.asarray(_C.sce_forward(logits, labels),
                          dtype=logits.dtype)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    picked = logits[np.arange(n), labels]
    return np.asarray(np.mean(lse - picked), dtype=logits.dtype)


def softmax_cross_entropy_grad(logits, labels, scale):
    """scale * (softmax(logits) - onehot(labels)) / n."""
    n, c = logits.shape
    if _fast(logits):
        return _C.sce_backward(logits, labels, float(scale))
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    p = e / e.sum(axis=1, keepdims=True)
    p[np.arange(n), labels] -= 1
    return (p * (scale / n)).astype(logits.dtype, copy=False)


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax(x, axis):
    s = x - np.max(x, axis=axis, keepdims=True)
    s -= np.log(np.exp(s).sum(axis=axis, keepdims=True))
    return s


_scratch = threading.local()


def _workspace(size, dtype):
    """A per-thread grow-only buffer of ``size`` elements (contents undefined)."""
    key = "buf_" + dtype.char
    buf = getattr(_scratch, key, None)
    if buf is None or buf.size < size:
        buf = np.empty(size, dtype=dtype)
        setattr(_scratch, key, buf)
    return buf[:size]


def im2col(x, kh, kw, stride, padding, dilation, scratch=False):
    """x (N, C, H, W) -> cols (N, C*kh*kw, Ho*Wo): cols[n, (c, i, j), (p, q)] =
    xpad[n, c, p*sh + i*dh, q*sw + j*dw] (zero outside x).

    ``scratch=True``: write into this thread's workspace (valid until the next scratch call on
    the same thread), for callers that consume the result at once (conv forward, weight grad)."""
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if _fast(x):
        out = None
        if scratch:
            out = _workspace(n * c * kh * kw * ho * wo, x.dtype).reshape(n, c * kh * kw, ho * wo)
        return _C.im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, out), ho, wo
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    s = xp.strides
    win = np.lib.stride_tricks.as_strided(
        xp, (n, c, kh, kw, ho, wo), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw))
    return win.reshape(n, c * kh * kw, ho * wo), ho, wo


def col2im(cols, x_shape, kh, kw, stride, padding, dilation, ho, wo):
    """The adjoint of im2col: scatter-add cols (N, C*kh*kw, Ho*Wo) back into (N, C, H, W)."""
    n, c, h, w = x_shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if _fast(cols):
        return _C.col2im(cols, n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo)
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    v = cols.reshape(n, c, kh, kw, ho, wo)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols_ = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            xp[:, :, rows, cols_] += v[:, :, i, j]
    return np.ascontiguousarray(xp[:, :, ph:ph + h, pw:pw + w])
