"""Array kernels behind the hot primitives: compiled (fastadam._core._autodiff_kernels) for
contiguous float32/float64 arrays, NumPy otherwise (other dtypes, strided views).

Every function takes and returns ndarrays; none is recorded.  Large outputs come from ``empty``,
a small per-thread buffer pool: a training loop builds the same graph every step, and a fresh
multi-megabyte array page-faults once glibc has given the freed memory back to the OS (several
times the cost of the kernel that fills it).  A pooled array is handed out again only when
nothing but the pool refers to it (its reference count), so reuse is never visible.
"""
import sys
import threading

import numpy as np

try:
    from .._core import _autodiff_kernels as _C
except ImportError:  # pragma: no cover - source tree without a build
    _C = None
try:
    from . import _transformer_kernels as _TK
except ImportError:  # pragma: no cover - source tree without a build
    _TK = None

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


# ---- buffer pool --------------------------------------------------------------------------

POOL_MIN_BYTES = 256 * 1024        # smaller arrays come from np.empty (malloc reuses them well)
POOL_BYTES = 64 * 1024 * 1024      # per thread, at most this much is kept

_pool_state = threading.local()
_refcount = sys.getrefcount


def empty(shape, dtype):
    """``np.empty(shape, dtype)``, reusing a pooled array nobody else refers to when large."""
    dtype = np.dtype(dtype)
    size = dtype.itemsize
    for d in shape:
        size *= d
    if size < POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    pool = getattr(_pool_state, "pool", None)
    if pool is None:
        pool = _pool_state.pool = {}
        _pool_state.nbytes = 0
    key = (shape, dtype)
    arrays = pool.get(key)
    if arrays is None:
        arrays = pool[key] = []
    for a in arrays:
        if _refcount(a) == 3:  # the list, the loop variable and the argument: free
            return a
    if _pool_state.nbytes + size > POOL_BYTES:
        _evict(pool)
        if _pool_state.nbytes + size > POOL_BYTES:
            return np.empty(shape, dtype)
    a = np.empty(shape, dtype)
    arrays.append(a)
    _pool_state.nbytes += size
    return a


def _evict(pool):
    """Drop every free pooled array (the graph shape changed, or the pool is full)."""
    for key in list(pool):
        kept = []
        for a in pool[key]:
            if _refcount(a) > 3:  # more than the list, the loop variable and the argument
                kept.append(a)
            else:
                _pool_state.nbytes -= a.nbytes
        if kept:
            pool[key] = kept
        else:
            del pool[key]


def pool_bytes():
    """Bytes held by the calling thread's buffer pool."""
    return getattr(_pool_state, "nbytes", 0)


def release_pool():
    """Forget the calling thread's pool (arrays still in use stay valid)."""
    _pool_state.pool = {}
    _pool_state.nbytes = 0


def _fast_python(*arrays):
    if _C is None:
        return False
    dt = arrays[0].dtype
    for a in arrays:
        if a.dtype != dt or dt not in _FAST or not a.flags.c_contiguous:
            return False
    return True


# contiguous float32/float64 arrays of one dtype: the compiled kernels apply (one C call)
_fast = _fast_python if _C is None else _C.is_fast


def _out(x):
    """Where a kernel writes its output like ``x``: a pooled array when large, else None (the
    kernel allocates: a small array costs less than the pool's bookkeeping)."""
    if x.nbytes < POOL_MIN_BYTES:
        return None
    return empty(x.shape, x.dtype)


def _size(shape):
    """The element count of ``shape`` (a row's length: ``reshape(rows, -1)`` cannot infer it
    when there are no rows)."""
    n = 1
    for d in shape:
        n *= d
    return n


def sum_to(x, shape):
    """Sum ``x`` over the axes NumPy broadcasting added or stretched to reach ``x.shape``."""
    xs = x.shape
    if xs == shape:
        return x
    lead = len(xs) - len(shape)
    if lead == 1 and xs[1:] == shape:
        if not _fast(x):
            return np.add.reduce(x, axis=0)
        return _C.sum_rows(x.reshape(xs[0], _size(shape))).reshape(shape)
    if lead >= 1 and xs[lead:] == shape and _fast(x):
        rows = 1
        for d in xs[:lead]:
            rows *= d
        return _C.sum_rows(x.reshape(rows, _size(shape))).reshape(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return np.sum(x, axis=axes).reshape(shape)


def relu(x):
    if _fast(x):
        return _C.relu(x, _out(x))
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def relu_grad(g, x):
    if g.shape == x.shape and _fast(g, x):
        return _C.relu_grad(g, x, _out(x))
    if g.shape == x.shape and _C is not None and g.dtype == x.dtype and _fast(x) \
            and not np.any(g.strides):  # a broadcast scalar (e.g. the VJP of mean)
        return _C.relu_grad_scalar(float(g.flat[0]), x, _out(x))
    return np.where(x <= 0, 0, g).astype(np.result_type(g, x), copy=False)


def sigmoid(x):
    if _fast(x):
        return _C.sigmoid(x, _out(x))
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def sigmoid_grad(g, s):
    if g.shape == s.shape and _fast(g, s):
        return _C.sigmoid_grad(g, s, _out(s))
    return g * s * (1 - s)


def tanh_grad(g, t):
    if g.shape == t.shape and _fast(g, t):
        return _C.tanh_grad(g, t, _out(t))
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
    with np.errstate(invalid="ignore"):  # NaN/inf rows give NaN, silently, as the compiled path
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    picked = logits[np.arange(n), labels]
    return np.asarray(np.mean(lse - picked), dtype=logits.dtype)


def softmax_cross_entropy_grad(logits, labels, scale):
    """scale * (softmax(logits) - onehot(labels)) / n."""
    n, c = logits.shape
    if _fast(logits):
        return _C.sce_backward(logits, labels, float(scale))
    m = logits.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(logits - m)
        p = e / e.sum(axis=1, keepdims=True)
    p[np.arange(n), labels] -= 1
    return (p * (scale / n)).astype(logits.dtype, copy=False)


def _last_axis_f32(x, axis):
    """True when the float32 row kernels of ``_transformer_kernels`` apply: ``axis`` is the
    last one (non-empty) and ``x`` a C-contiguous, aligned, native float32 array."""
    return (_TK is not None and x.dtype == np.float32 and x.ndim > 0
            and axis in (-1, x.ndim - 1) and x.shape[-1] > 0 and _fast(x))


def softmax(x, axis):
    if _last_axis_f32(x, axis):
        return _TK.softmax_last_f32(x)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def scatter_add_rows(out, indices, rows):
    """``out[indices[k]] += rows[k]`` for every k, in the order of k (``np.add.at``'s bits):
    ``out`` (n, ...) zeros, ``indices`` integers in [-n, n), ``rows`` (len(indices), ...).
    Float32/float64 rows go through the compiled loop of ``_transformer_kernels`` (a C-contiguous
    ``out``: about 100x ``np.add.at`` on 1024 rows of 64) or the sorted segment sum (one pass,
    no per-element Python dispatch: about 15x)."""
    if rows.dtype in _FAST and indices.dtype.kind in "iu" and indices.size and out.ndim >= 1:
        idx = indices.astype(np.int64, copy=False)
        if idx.min() < 0:
            idx = np.where(idx < 0, idx + out.shape[0], idx)
        if _TK is not None and out.flags.c_contiguous and out.dtype == rows.dtype and out.size:
            _TK.scatter_add_rows(out.reshape(out.shape[0], -1), np.ascontiguousarray(idx),
                                 np.ascontiguousarray(rows).reshape(len(idx), -1))
            return
        from ..sparse import segment_sum
        unique, sums = segment_sum(idx, rows)
        out[unique] = sums
    else:
        np.add.at(out, indices, rows)


def softmax_vjp(g, y, axis):
    """``y * (g - sum(g * y, axis))`` by the float32 row kernel, or None where it does not
    apply (the caller composes the VJP from the engine's operations)."""
    if _last_axis_f32(y, axis) and g.dtype == np.float32 and g.shape == y.shape:
        return _TK.softmax_vjp_last_f32(np.ascontiguousarray(g), y)
    return None


def log_softmax(x, axis):
    s = x - np.max(x, axis=axis, keepdims=True)
    s -= np.log(np.exp(s).sum(axis=axis, keepdims=True))
    return s


# ---- im2col workspace: per thread, bounded ------------------------------------------------
# A convolution unrolls its input in batch chunks of at most WORKSPACE_BYTES (at least one
# sample) into this thread's workspace, which is kept between calls (a fresh multi-megabyte
# array would page-fault on every step).  It never grows past WORKSPACE_BYTES per dtype: a single
# sample larger than that gets a temporary array, freed after use.

WORKSPACE_BYTES = 16 * 1024 * 1024

_scratch = threading.local()


def _workspace(size, dtype):
    """``size`` elements of scratch memory (contents undefined), valid until this thread's next
    ``_workspace`` call of the same dtype."""
    _scratch.tag = None  # whatever im2col the workspace held is being overwritten
    if size * dtype.itemsize > WORKSPACE_BYTES:
        return np.empty(size, dtype=dtype)
    key = "buf_" + dtype.char
    buf = getattr(_scratch, key, None)
    if buf is None or buf.size < size:
        buf = np.empty(size, dtype=dtype)
        setattr(_scratch, key, buf)
    return buf[:size]


def workspace_bytes():
    """Bytes held by the calling thread's im2col workspaces."""
    return sum(v.nbytes for k, v in vars(_scratch).items() if k.startswith("buf_"))


def release_workspace():
    """Free the calling thread's im2col workspaces."""
    _scratch.tag = None
    for k in [k for k in vars(_scratch) if k.startswith("buf_")]:
        delattr(_scratch, k)


def batch_chunk(per_sample, dtype):
    """How many samples of ``per_sample`` elements fit the workspace (at least 1)."""
    nbytes = per_sample * np.dtype(dtype).itemsize
    return max(1, WORKSPACE_BYTES // nbytes) if nbytes else 1 << 30


def conv_output_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col(x, kh, kw, stride, padding, dilation, out=None):
    """x (N, C, H, W) -> cols (N, C*kh*kw, Ho*Wo): cols[n, (c, i, j), (p, q)] =
    xpad[n, c, p*sh + i*dh, q*sw + j*dw] (zero outside x).  ``out``: where to write (contiguous
    float32/float64 x only; otherwise a strided view of a padded copy is returned)."""
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = conv_output_size(h, kh, sh, ph, dh)
    wo = conv_output_size(w, kw, sw, pw, dw)
    if _fast(x):
        return _C.im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, out), ho, wo
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    s = xp.strides
    win = np.lib.stride_tricks.as_strided(
        xp, (n, c, kh, kw, ho, wo), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw))
    return win.reshape(n, c * kh * kw, ho * wo), ho, wo


def im2col_chunks(x, kh, kw, stride, padding, dilation, reuse=False):
    """Yield ``(n0, n1, cols)``: ``im2col(x[n0:n1])`` in this thread's bounded workspace (each
    ``cols`` is overwritten by the next; consume it before asking for the next).

    When the whole batch fits one chunk the workspace is tagged with x (the array object itself,
    kept alive by the tag, and the geometry); ``reuse=True`` (the weight gradient, right after the
    forward pass of the same convolution) skips the unrolling when the tag still matches: any
    other workspace use clears it, and the engine has checked x's version counter (writes
    through ``.data`` are not seen, as everywhere in the engine)."""
    n, c, h, w = x.shape
    if not _fast(x):
        cols, _, _ = im2col(x, kh, kw, stride, padding, dilation)
        yield 0, n, cols
        return
    ho = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    wo = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    per = c * kh * kw * ho * wo
    step = batch_chunk(per, x.dtype)
    if 0 < n <= step and n * per * x.dtype.itemsize <= WORKSPACE_BYTES:
        geometry = (kh, kw, stride, padding, dilation)
        tag = getattr(_scratch, "tag", None)
        if reuse and tag is not None and tag[0] is x and tag[1] == geometry:
            buf = getattr(_scratch, "buf_" + x.dtype.char)[:n * per]
            yield 0, n, buf.reshape(n, c * kh * kw, ho * wo)
            return
        buf = _workspace(n * per, x.dtype).reshape(n, c * kh * kw, ho * wo)
        im2col(x, kh, kw, stride, padding, dilation, buf)
        _scratch.tag = (x, geometry)
        yield 0, n, buf
        return
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        buf = _workspace((n1 - n0) * per, x.dtype).reshape(n1 - n0, c * kh * kw, ho * wo)
        im2col(x[n0:n1], kh, kw, stride, padding, dilation, buf)
        yield n0, n1, buf


def col2im(cols, x_shape, kh, kw, stride, padding, dilation, ho, wo, out=None):
    """The adjoint of im2col: scatter-add cols (N, C*kh*kw, Ho*Wo) back into (N, C, H, W)
    (written into ``out`` when given)."""
    n, c, h, w = x_shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if _fast(cols) and (out is None or _fast(cols, out)):
        return _C.col2im(cols, n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, out)
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    v = cols.reshape(n, c, kh, kw, ho, wo)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols_ = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            xp[:, :, rows, cols_] += v[:, :, i, j]
    if out is not None:
        out[...] = xp[:, :, ph:ph + h, pw:pw + w]
        return out
    return np.ascontiguousarray(xp[:, :, ph:ph + h, pw:pw + w])
