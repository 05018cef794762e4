"""Kernels of the transformer primitives (``_ops_transformer``): erf, exact GELU and its
derivative, layer normalisation over the last axis and its backward pass, softmax over the
last axis, fused attention (float32) and the row scatter-add of gathers' gradients.

Design note.  Callers pass C-contiguous float32 or float64 arrays of one dtype (``_ops_transformer``
makes them so); outputs are allocated here.  Elementwise kernels and the per-row layer-norm
kernels release the GIL and split their work in static chunks over OpenMP threads once it is
large enough to pay for the parallel region; each element and each row is computed by the same
code whatever the split, so results do not depend on the thread count.  The column sums of the
layer-norm backward pass (the gradients of scale and bias) are accumulated serially, row by row,
in float64, for the same reason.  Statistics (mean, variance) are accumulated in float64 for
both dtypes.  The attention kernels split their work by batch-head, each computed whole by one
thread (same rule).

Formulas (``Phi`` / ``phi``: the standard normal CDF / density):

- ``erf(x)``: libm's ``erf`` in float64; in float32 a rational approximation on ``[-4, 4]``
  (absolute error below 5e-7, libm's ``erff``: 6e-8) that the compiler vectorizes;
- ``gelu(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))``,
  ``gelu_grad(g, x) = g * (Phi(x) + x * phi(x))``;
- ``layer_norm(x, scale, bias, eps)`` over the rows of ``x`` (rows, cols):
  ``mean = sum(x) / cols``, ``rstd = 1 / sqrt(sum((x - mean)^2) / cols + eps)``,
  ``y = (x - mean) * rstd * scale + bias``;
- ``layer_norm_backward(g, x, scale, mean, rstd)``, with ``xhat = (x - mean) * rstd`` and
  ``gs = g * scale``: ``dx = rstd * (gs - mean(gs) - xhat * mean(gs * xhat))`` per row,
  ``dscale = sum_rows(g * xhat)``, ``dbias = sum_rows(g)``.
"""
cimport numpy as cnp
from cython.parallel cimport prange, threadid
from libc.math cimport erf as c_erf, exp, sqrt
from libc.stdint cimport int32_t
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

import numpy as np

from fastadam._core._cpu_level import LEVEL_IN_USE

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from "fastadam/transformer_kernels.h":
    int fa_tk_max_threads() nogil
    void fa_tk_erf_f32_loop(const float *x, float *y, Py_ssize_t n) nogil
    void fa_tk_gelu_grad_f32_loop(const float *g, const float *x, float *o, Py_ssize_t n) nogil
    void fa_tk_gelu_f32_loop(const float *x, float *y, Py_ssize_t n) nogil
    void fa_tk_gelu_cdf_f32_loop(const float *x, float *y, float *cdf, Py_ssize_t n) nogil
    void fa_tk_gelu_grad_cdf_f32_loop(const float *g, const float *x, const float *cdf,
                                      float *o, Py_ssize_t n) nogil
    void fa_tk_softmax_f32_rows(const float *x, float *y, Py_ssize_t rows, Py_ssize_t n) nogil
    void fa_tk_ln_f32_rows(const float *x, const float *scale, const float *bias, float *y,
                           float *mean, float *rstd, Py_ssize_t rows, Py_ssize_t n,
                           double eps) nogil
    void fa_tk_ln_backward_f32_rows(const float *g, const float *x, const float *scale,
                                    const float *mean, const float *rstd, float *dx,
                                    Py_ssize_t rows, Py_ssize_t n) nogil
    void fa_tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx, Py_ssize_t rows,
                                    Py_ssize_t n) nogil
    void fa_tk_ln_param_grads_f32(const float *g, const float *x, const float *mean,
                                  const float *rstd, double *dscale, double *dbias,
                                  Py_ssize_t rows, Py_ssize_t n) nogil
    float fa_tk_erf_f32(float x) nogil
    void fa_tk_attention_f32(const float *q, Py_ssize_t ldq, const float *kt, Py_ssize_t ldk,
                             const float *v, Py_ssize_t ldv, const float *mask,
                             const int32_t *ncols, float *o, float *P, Py_ssize_t T,
                             Py_ssize_t S, Py_ssize_t d, Py_ssize_t e, float alpha) nogil
    void fa_tk_attention_bwd_f32(const float *g, Py_ssize_t ldg, const float *q, Py_ssize_t ldq,
                                 const float *kt, Py_ssize_t ldk, const float *v, Py_ssize_t ldv,
                                 const float *P, const int32_t *ncols, float *dq, float *dkt,
                                 float *dv, float *dS, float *kk, float *vt, Py_ssize_t T,
                                 Py_ssize_t S, Py_ssize_t d, Py_ssize_t e, float alpha) nogil

ctypedef fused real:
    float
    double

cdef Py_ssize_t PARALLEL_MIN = 1 << 16  # elements below which one thread does the work
cdef Py_ssize_t CHUNK = 4096            # elements per chunk of an elementwise kernel
cdef double SQRT1_2 = 0.70710678118654752440
cdef double INV_SQRT_2PI = 0.39894228040143267794


cdef inline int _threads(Py_ssize_t work) noexcept nogil:
    if work < PARALLEL_MIN:
        return 1
    return fa_tk_max_threads()


cdef inline Py_ssize_t _rows_per_chunk(Py_ssize_t cols) noexcept nogil:
    """Rows of ``cols`` elements per chunk of a row kernel: about CHUNK elements, at least one
    row (a row is always computed whole by one thread, so the split never changes a bit)."""
    return max(1, CHUNK // max(cols, 1))


cdef inline real _erf(real v) noexcept nogil:
    if real is float:
        return fa_tk_erf_f32(v)
    else:
        return c_erf(v)


cdef void _erf_loop(const real *x, real *y, Py_ssize_t n, int nt) noexcept nogil:
    cdef Py_ssize_t c, i, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * CHUNK
        hi = lo + CHUNK if lo + CHUNK < n else n
        if real is float:
            fa_tk_erf_f32_loop(x + lo, y + lo, hi - lo)
        else:
            for i in range(lo, hi):
                y[i] = _erf(x[i])


cdef void _gelu_loop(const real *x, real *y, Py_ssize_t n, int nt) noexcept nogil:
    cdef Py_ssize_t c, i, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    cdef real half = 0.5, one = 1, s = <real>SQRT1_2
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * CHUNK
        hi = lo + CHUNK if lo + CHUNK < n else n
        if real is float:
            fa_tk_gelu_f32_loop(x + lo, y + lo, hi - lo)
        else:
            for i in range(lo, hi):
                y[i] = half * x[i] * (one + _erf(x[i] * s))


cdef void _gelu_grad_f32(const float *g, const float *x, float *o, Py_ssize_t n,
                         int nt) noexcept nogil:
    cdef Py_ssize_t c, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * CHUNK
        hi = lo + CHUNK if lo + CHUNK < n else n
        fa_tk_gelu_grad_f32_loop(g + lo, x + lo, o + lo, hi - lo)


cdef void _gelu_grad_f64(const double *g, const double *x, double *o, Py_ssize_t n,
                         int nt) noexcept nogil:
    cdef Py_ssize_t c, i, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    cdef double v, density
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * CHUNK
        hi = lo + CHUNK if lo + CHUNK < n else n
        for i in range(lo, hi):
            v = x[i]
            density = INV_SQRT_2PI * exp(-0.5 * v * v)
            o[i] = g[i] * (0.5 * (1 + c_erf(v * SQRT1_2)) + v * density)


cdef void _ln_rows(const real *x, const real *scale, const real *bias, real *y, real *mean,
                   real *rstd, Py_ssize_t rows, Py_ssize_t cols, double eps,
                   int nt) noexcept nogil:
    cdef Py_ssize_t r, j, c, lo, hi, per, chunks
    cdef double m, v, d, inv
    if real is float:  # the vectorized rows (same arithmetic), in chunks of rows
        per = _rows_per_chunk(cols)
        chunks = (rows + per - 1) // per
        for c in prange(chunks, schedule="static", num_threads=nt):
            lo = c * per
            hi = lo + per if lo + per < rows else rows
            fa_tk_ln_f32_rows(x + lo * cols, scale, bias, y + lo * cols, mean + lo, rstd + lo,
                              hi - lo, cols, eps)
    else:
        for r in prange(rows, schedule="static", num_threads=nt):
            m = 0
            for j in range(cols):
                m = m + x[r * cols + j]
            m = m / cols
            v = 0
            for j in range(cols):
                d = x[r * cols + j] - m
                v = v + d * d
            inv = 1.0 / sqrt(v / cols + eps)
            mean[r] = <real>m
            rstd[r] = <real>inv
            if bias != NULL:
                for j in range(cols):
                    y[r * cols + j] = <real>((x[r * cols + j] - m) * inv) * scale[j] + bias[j]
            else:
                for j in range(cols):
                    y[r * cols + j] = <real>((x[r * cols + j] - m) * inv) * scale[j]


cdef void _ln_backward_rows(const real *g, const real *x, const real *scale, const real *mean,
                            const real *rstd, real *dx, Py_ssize_t rows, Py_ssize_t cols,
                            int nt) noexcept nogil:
    cdef Py_ssize_t r, j, c, lo, hi, per, chunks
    cdef double a, b, gs, xh, inv, m
    if real is float:  # the vectorized rows (same arithmetic), in chunks of rows
        per = _rows_per_chunk(cols)
        chunks = (rows + per - 1) // per
        for c in prange(chunks, schedule="static", num_threads=nt):
            lo = c * per
            hi = lo + per if lo + per < rows else rows
            fa_tk_ln_backward_f32_rows(g + lo * cols, x + lo * cols, scale, mean + lo,
                                       rstd + lo, dx + lo * cols, hi - lo, cols)
    else:
        for r in prange(rows, schedule="static", num_threads=nt):
            m = mean[r]
            inv = rstd[r]
            a = 0
            b = 0
            for j in range(cols):
                gs = <double>g[r * cols + j] * scale[j]
                a = a + gs
                b = b + gs * (x[r * cols + j] - m) * inv
            a = a / cols
            b = b / cols
            for j in range(cols):
                gs = <double>g[r * cols + j] * scale[j]
                xh = (x[r * cols + j] - m) * inv
                dx[r * cols + j] = <real>(inv * (gs - a - xh * b))


cdef void _ln_param_grads(const real *g, const real *x, const real *mean, const real *rstd,
                          double *dscale, double *dbias, Py_ssize_t rows,
                          Py_ssize_t cols) noexcept nogil:
    cdef Py_ssize_t r, j
    cdef double m, inv
    if real is float:  # the vectorized loop (same arithmetic, same order)
        fa_tk_ln_param_grads_f32(g, x, mean, rstd, dscale, dbias, rows, cols)
        return
    for r in range(rows):
        m = mean[r]
        inv = rstd[r]
        for j in range(cols):
            dscale[j] += g[r * cols + j] * ((x[r * cols + j] - m) * inv)
            dbias[j] += g[r * cols + j]


cdef _check(cnp.ndarray a, str name, object dtype=None):
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name}: expected float32 or float64, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name}: expected {dtype}, got {a.dtype}")


def erf(cnp.ndarray x):
    """``erf(x)`` of a C-contiguous float32/float64 array (a new array)."""
    _check(x, "x")
    cdef cnp.ndarray y = np.empty_like(x)
    cdef Py_ssize_t n = x.size
    cdef int nt = _threads(n)
    if x.dtype == np.float32:
        with nogil:
            _erf_loop(<float *>cnp.PyArray_DATA(x), <float *>cnp.PyArray_DATA(y), n, nt)
    else:
        with nogil:
            _erf_loop(<double *>cnp.PyArray_DATA(x), <double *>cnp.PyArray_DATA(y), n, nt)
    return y


def gelu(cnp.ndarray x):
    """``x * Phi(x)`` (exact GELU) of a C-contiguous float32/float64 array."""
    _check(x, "x")
    cdef cnp.ndarray y = np.empty_like(x)
    cdef Py_ssize_t n = x.size
    cdef int nt = _threads(n)
    if x.dtype == np.float32:
        with nogil:
            _gelu_loop(<float *>cnp.PyArray_DATA(x), <float *>cnp.PyArray_DATA(y), n, nt)
    else:
        with nogil:
            _gelu_loop(<double *>cnp.PyArray_DATA(x), <double *>cnp.PyArray_DATA(y), n, nt)
    return y


def gelu_grad(cnp.ndarray g, cnp.ndarray x):
    """``g * (Phi(x) + x * phi(x))``: ``g`` and ``x`` of one shape and dtype."""
    _check(x, "x")
    _check(g, "g", x.dtype)
    if g.size != x.size:
        raise ValueError(f"g: expected {x.size} elements, got {g.size}")
    cdef cnp.ndarray o = np.empty_like(x)
    cdef Py_ssize_t n = x.size
    cdef int nt = _threads(n)
    if x.dtype == np.float32:
        with nogil:
            _gelu_grad_f32(<float *>cnp.PyArray_DATA(g), <float *>cnp.PyArray_DATA(x),
                           <float *>cnp.PyArray_DATA(o), n, nt)
    else:
        with nogil:
            _gelu_grad_f64(<double *>cnp.PyArray_DATA(g), <double *>cnp.PyArray_DATA(x),
                           <double *>cnp.PyArray_DATA(o), n, nt)
    return o


def gelu_cdf_f32(cnp.ndarray x):
    """``(gelu(x), Phi(x))`` of a C-contiguous float32 array: ``gelu``'s values and the
    standard normal CDF its backward pass reads (``gelu_grad_cdf_f32``)."""
    _check(x, "x", np.float32)
    cdef cnp.ndarray y = np.empty_like(x)
    cdef cnp.ndarray cdf = np.empty_like(x)
    cdef Py_ssize_t n = x.size, c, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    cdef int nt = _threads(n)
    cdef float *xp = <float *>cnp.PyArray_DATA(x)
    cdef float *yp = <float *>cnp.PyArray_DATA(y)
    cdef float *cp = <float *>cnp.PyArray_DATA(cdf)
    with nogil:
        for c in prange(chunks, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            fa_tk_gelu_cdf_f32_loop(xp + lo, yp + lo, cp + lo, hi - lo)
    return y, cdf


def gelu_grad_cdf_f32(cnp.ndarray g, cnp.ndarray x, cnp.ndarray cdf):
    """``gelu_grad(g, x)`` (its bits) from ``cdf = Phi(x)`` as ``gelu_cdf_f32`` returns it:
    C-contiguous float32 arrays of one size."""
    _check(x, "x", np.float32)
    _check(g, "g", np.float32)
    _check(cdf, "cdf", np.float32)
    if g.size != x.size or cdf.size != x.size:
        raise ValueError(f"g and cdf: expected {x.size} elements, got {g.size} and {cdf.size}")
    cdef cnp.ndarray o = np.empty_like(x)
    cdef Py_ssize_t n = x.size, c, lo, hi, chunks = (n + CHUNK - 1) // CHUNK
    cdef int nt = _threads(n)
    cdef float *gp = <float *>cnp.PyArray_DATA(g)
    cdef float *xp = <float *>cnp.PyArray_DATA(x)
    cdef float *cp = <float *>cnp.PyArray_DATA(cdf)
    cdef float *op = <float *>cnp.PyArray_DATA(o)
    with nogil:
        for c in prange(chunks, schedule="static", num_threads=nt):
            lo = c * CHUNK
            hi = lo + CHUNK if lo + CHUNK < n else n
            fa_tk_gelu_grad_cdf_f32_loop(gp + lo, xp + lo, cp + lo, op + lo, hi - lo)
    return o


cdef void _softmax_f32(const float *x, float *y, Py_ssize_t rows, Py_ssize_t n,
                       int nt) noexcept nogil:
    cdef Py_ssize_t c, lo, hi, per = _rows_per_chunk(n)
    cdef Py_ssize_t chunks = (rows + per - 1) // per
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * per
        hi = lo + per if lo + per < rows else rows
        fa_tk_softmax_f32_rows(x + lo * n, y + lo * n, hi - lo, n)


cdef void _softmax_vjp_f32(const float *g, const float *y, float *dx, Py_ssize_t rows,
                           Py_ssize_t n, int nt) noexcept nogil:
    cdef Py_ssize_t c, lo, hi, per = _rows_per_chunk(n)
    cdef Py_ssize_t chunks = (rows + per - 1) // per
    for c in prange(chunks, schedule="static", num_threads=nt):
        lo = c * per
        hi = lo + per if lo + per < rows else rows
        fa_tk_softmax_vjp_f32_rows(g + lo * n, y + lo * n, dx + lo * n, hi - lo, n)


def softmax_last_f32(cnp.ndarray x):
    """Softmax over the last axis of a C-contiguous float32 array with a last axis of at least
    one element (a new array)."""
    _check(x, "x", np.float32)
    if x.ndim == 0 or x.shape[x.ndim - 1] == 0:
        raise ValueError("x: expected a non-empty last axis")
    cdef cnp.ndarray y = np.empty_like(x)
    cdef Py_ssize_t n = x.shape[x.ndim - 1], rows = x.size // n
    cdef int nt = _threads(x.size)
    with nogil:
        _softmax_f32(<float *>cnp.PyArray_DATA(x), <float *>cnp.PyArray_DATA(y), rows, n, nt)
    return y


def softmax_vjp_last_f32(cnp.ndarray g, cnp.ndarray y):
    """``y * (g - sum(g * y))`` over the last axis: the VJP of ``y = softmax(x)``; ``g`` and
    ``y`` C-contiguous float32 arrays of one shape."""
    _check(y, "y", np.float32)
    _check(g, "g", np.float32)
    if g.ndim != y.ndim or any(g.shape[i] != y.shape[i] for i in range(y.ndim)):
        raise ValueError(f"g: expected shape {(<object>y).shape}, got {(<object>g).shape}")
    if y.ndim == 0 or y.shape[y.ndim - 1] == 0:
        raise ValueError("y: expected a non-empty last axis")
    cdef cnp.ndarray dx = np.empty_like(y)
    cdef Py_ssize_t n = y.shape[y.ndim - 1], rows = y.size // n
    cdef int nt = _threads(y.size)
    with nogil:
        _softmax_vjp_f32(<float *>cnp.PyArray_DATA(g), <float *>cnp.PyArray_DATA(y),
                         <float *>cnp.PyArray_DATA(dx), rows, n, nt)
    return dx


def layer_norm(cnp.ndarray x, cnp.ndarray scale, object bias, double eps):
    """``(y, mean, rstd)`` of ``x`` (rows, cols) normalised per row; ``scale`` and ``bias``
    (or None) have ``cols`` elements; ``mean`` and ``rstd`` have ``rows``."""
    _check(x, "x")
    _check(scale, "scale", x.dtype)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array, got {x.ndim} dimensions")
    cdef Py_ssize_t rows = x.shape[0], cols = x.shape[1]
    if scale.size != cols:
        raise ValueError(f"scale: expected {cols} elements, got {scale.size}")
    cdef cnp.ndarray b = None
    if bias is not None:
        b = bias
        _check(b, "bias", x.dtype)
        if b.size != cols:
            raise ValueError(f"bias: expected {cols} elements, got {b.size}")
    cdef cnp.ndarray y = np.empty_like(x)
    cdef cnp.ndarray mean = np.empty(rows, x.dtype)
    cdef cnp.ndarray rstd = np.empty(rows, x.dtype)
    cdef int nt = _threads(rows * cols)
    if x.dtype == np.float32:
        with nogil:
            _ln_rows(<float *>cnp.PyArray_DATA(x), <float *>cnp.PyArray_DATA(scale),
                     <float *>(cnp.PyArray_DATA(b) if b is not None else NULL),
                     <float *>cnp.PyArray_DATA(y), <float *>cnp.PyArray_DATA(mean),
                     <float *>cnp.PyArray_DATA(rstd), rows, cols, eps, nt)
    else:
        with nogil:
            _ln_rows(<double *>cnp.PyArray_DATA(x), <double *>cnp.PyArray_DATA(scale),
                     <double *>(cnp.PyArray_DATA(b) if b is not None else NULL),
                     <double *>cnp.PyArray_DATA(y), <double *>cnp.PyArray_DATA(mean),
                     <double *>cnp.PyArray_DATA(rstd), rows, cols, eps, nt)
    return y, mean, rstd


def layer_norm_backward(cnp.ndarray g, cnp.ndarray x, cnp.ndarray scale, cnp.ndarray mean,
                        cnp.ndarray rstd, bint want_dx=True, bint want_params=True):
    """``(dx, dscale, dbias)`` of ``layer_norm`` (see the module note); a part not wanted is
    None."""
    _check(x, "x")
    for a, name in ((g, "g"), (scale, "scale"), (mean, "mean"), (rstd, "rstd")):
        _check(a, name, x.dtype)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array, got {x.ndim} dimensions")
    cdef Py_ssize_t rows = x.shape[0], cols = x.shape[1]
    if g.size != x.size or scale.size != cols or mean.size != rows \
            or rstd.size != rows:
        raise ValueError("layer_norm_backward: inconsistent shapes")
    cdef cnp.ndarray dx = None, ds = None, db = None
    cdef int nt = _threads(rows * cols)
    if want_dx:
        dx = np.empty_like(x)
        if x.dtype == np.float32:
            with nogil:
                _ln_backward_rows(<float *>cnp.PyArray_DATA(g), <float *>cnp.PyArray_DATA(x),
                                  <float *>cnp.PyArray_DATA(scale),
                                  <float *>cnp.PyArray_DATA(mean),
                                  <float *>cnp.PyArray_DATA(rstd),
                                  <float *>cnp.PyArray_DATA(dx), rows, cols, nt)
        else:
            with nogil:
                _ln_backward_rows(<double *>cnp.PyArray_DATA(g), <double *>cnp.PyArray_DATA(x),
                                  <double *>cnp.PyArray_DATA(scale),
                                  <double *>cnp.PyArray_DATA(mean),
                                  <double *>cnp.PyArray_DATA(rstd),
                                  <double *>cnp.PyArray_DATA(dx), rows, cols, nt)
    if want_params:
        ds = np.zeros(cols, np.float64)
        db = np.zeros(cols, np.float64)
        if x.dtype == np.float32:
            with nogil:
                _ln_param_grads(<float *>cnp.PyArray_DATA(g), <float *>cnp.PyArray_DATA(x),
                                <float *>cnp.PyArray_DATA(mean), <float *>cnp.PyArray_DATA(rstd),
                                <double *>cnp.PyArray_DATA(ds), <double *>cnp.PyArray_DATA(db),
                                rows, cols)
        else:
            with nogil:
                _ln_param_grads(<double *>cnp.PyArray_DATA(g), <double *>cnp.PyArray_DATA(x),
                                <double *>cnp.PyArray_DATA(mean),
                                <double *>cnp.PyArray_DATA(rstd),
                                <double *>cnp.PyArray_DATA(ds), <double *>cnp.PyArray_DATA(db),
                                rows, cols)
        ds = ds.astype(x.dtype)
        db = db.astype(x.dtype)
    return dx, ds, db


cdef inline cnp.ndarray _attention_operand(cnp.ndarray a, str name):
    _check(a, name, np.float32)
    if a.ndim != 3:
        raise ValueError(f"{name}: expected a 3-D array, got {a.ndim} dimensions")
    return a


cdef cnp.ndarray _row_offsets(cnp.ndarray a, str name, Py_ssize_t *ld):
    """The element offset of each batch entry of ``a`` (float32, rank >= 3: batch axes, then
    rows and columns) from its first element, int64 (batch size,); ``ld[0]``: the row stride
    in elements.  Its last axis must have unit stride and its rows a positive stride (a
    C-contiguous array qualifies; so do the transposed views exported graphs make)."""
    if a.dtype != np.float32:
        raise TypeError(f"{name}: expected float32, got {a.dtype}")
    if a.ndim < 3:
        raise ValueError(f"{name}: expected at least 3 dimensions, got {a.ndim}")
    if not a.flags.aligned:
        raise ValueError(f"{name}: expected an aligned array")
    cdef Py_ssize_t nd = a.ndim, k
    for k in range(nd):
        if a.strides[k] % 4:
            raise ValueError(f"{name}: expected strides of whole elements")
    if a.shape[nd - 1] > 1 and a.strides[nd - 1] != 4:
        raise ValueError(f"{name}: expected its last axis to have unit stride")
    if a.shape[nd - 2] > 1 and a.strides[nd - 2] <= 0:
        raise ValueError(f"{name}: expected its rows to have a positive stride")
    ld[0] = a.strides[nd - 2] // 4 if a.shape[nd - 2] > 1 else a.shape[nd - 1]
    cdef Py_ssize_t n = 1, i, rest, off
    for k in range(nd - 2):
        n *= a.shape[k]
    cdef cnp.ndarray offsets = np.empty(n, np.int64)
    cdef long long *o = <long long *>cnp.PyArray_DATA(offsets)
    for i in range(n):  # batch entry i in C order: its index along each batch axis
        rest, off = i, 0
        for k in range(nd - 3, -1, -1):
            off += (rest % a.shape[k]) * (a.strides[k] // 4)
            rest //= a.shape[k]
        o[i] = off
    return offsets


def attention_f32(cnp.ndarray q, cnp.ndarray kt, cnp.ndarray v, cnp.ndarray mask,
                  cnp.ndarray ncols, float alpha=1.0):
    """``(o, p)``: ``p[b] = softmax(alpha * (q[b] @ kt[b]) + mask[b or 0], axis=-1)`` and
    ``o[b] = p[b] @ v[b]`` for each batch entry ``b`` (the batch axes flattened), row ``i`` of
    ``mask[m]``
    using its first ``ncols[m, i]`` columns (the rest hold -FLT_MAX or -inf: probability 0).
    ``q`` (..., T, d), ``kt`` (..., d, S), ``v`` (..., S, e): float32 of one batch shape, any
    strides with a unit last one and positive rows (such views need no copy); ``mask`` (1 or
    BH, T, S) C-contiguous float32; ``ncols`` int32 of ``mask``'s (M, T), each in [1, S].
    ``o`` (BH, T, e) and ``p`` (BH, T, S) are C-contiguous."""
    cdef Py_ssize_t ldq, ldk, ldv
    cdef cnp.ndarray qo = _row_offsets(q, "q", &ldq)
    cdef cnp.ndarray ko = _row_offsets(kt, "kt", &ldk)
    cdef cnp.ndarray vo = _row_offsets(v, "v", &ldv)
    _attention_operand(mask, "mask")
    if kt.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"attention_f32: q, kt and v have {q.ndim}, {kt.ndim} and {v.ndim} "
                         f"dimensions")
    cdef Py_ssize_t nd = q.ndim, bh = qo.shape[0], T = q.shape[nd - 2], d = q.shape[nd - 1]
    cdef Py_ssize_t S = kt.shape[nd - 1], e = v.shape[nd - 1], mb = mask.shape[0]
    batch = (<object>q).shape[:nd - 2]
    if (<object>kt).shape[:nd - 2] != batch or \
            (<object>v).shape[:nd - 2] != batch or kt.shape[nd - 2] != d or \
            v.shape[nd - 2] != S or mask.shape[1] != T or mask.shape[2] != S or \
            mb not in (1, bh) or S == 0:
        raise ValueError(f"attention_f32: inconsistent shapes q {(<object>q).shape}, kt "
                         f"{(<object>kt).shape}, v {(<object>v).shape}, mask "
                         f"{(<object>mask).shape}")
    cdef cnp.ndarray nc = _attention_ncols(ncols, mb, T, S)
    cdef cnp.ndarray o = np.empty((bh, T, e), np.float32)
    cdef cnp.ndarray p = np.empty((bh, T, S), np.float32)
    cdef int nt = _threads(bh * T * S)
    cdef float *qp = <float *>cnp.PyArray_DATA(q)
    cdef float *kp = <float *>cnp.PyArray_DATA(kt)
    cdef float *vp = <float *>cnp.PyArray_DATA(v)
    cdef long long *qop = <long long *>cnp.PyArray_DATA(qo)
    cdef long long *kop = <long long *>cnp.PyArray_DATA(ko)
    cdef long long *vop = <long long *>cnp.PyArray_DATA(vo)
    cdef float *mp = <float *>cnp.PyArray_DATA(mask)
    cdef int32_t *np_ = <int32_t *>cnp.PyArray_DATA(nc)
    cdef float *op = <float *>cnp.PyArray_DATA(o)
    cdef float *pp = <float *>cnp.PyArray_DATA(p)
    cdef Py_ssize_t b
    cdef Py_ssize_t mstride = 0 if mb == 1 else T * S
    cdef Py_ssize_t nstride = 0 if mb == 1 else T
    with nogil:
        for b in prange(bh, schedule="static", num_threads=nt):
            fa_tk_attention_f32(qp + qop[b], ldq, kp + kop[b], ldk, vp + vop[b], ldv,
                                mp + b * mstride, np_ + b * nstride, op + b * T * e,
                                pp + b * T * S, T, S, d, e, alpha)
    return o, p


def attention_backward_f32(cnp.ndarray g, cnp.ndarray q, cnp.ndarray kt, cnp.ndarray v,
                           cnp.ndarray p, cnp.ndarray ncols, float alpha=1.0):
    """``(dq, dkt, dv)`` of ``attention_f32``, each C-contiguous (BH, rows, columns), for the
    output cotangent ``g`` (..., T, e; strided as the operands may be), from its
    probabilities ``p`` (the other arguments as there; ``ncols`` of shape (1 or BH, T))."""
    cdef Py_ssize_t ldg, ldq, ldk, ldv
    cdef cnp.ndarray go = _row_offsets(g, "g", &ldg)
    cdef cnp.ndarray qo = _row_offsets(q, "q", &ldq)
    cdef cnp.ndarray ko = _row_offsets(kt, "kt", &ldk)
    cdef cnp.ndarray vo = _row_offsets(v, "v", &ldv)
    _attention_operand(p, "p")
    if kt.ndim != q.ndim or v.ndim != q.ndim or g.ndim != q.ndim:
        raise ValueError("attention_backward_f32: g, q, kt and v differ in dimensions")
    cdef Py_ssize_t nd = q.ndim, bh = qo.shape[0], T = q.shape[nd - 2], d = q.shape[nd - 1]
    cdef Py_ssize_t S = kt.shape[nd - 1], e = v.shape[nd - 1]
    cdef Py_ssize_t mb = ncols.shape[0] if ncols.ndim else 0
    batch = (<object>q).shape[:nd - 2]
    if (<object>kt).shape[:nd - 2] != batch or \
            (<object>v).shape[:nd - 2] != batch or (<object>g).shape[:nd - 2] != batch or \
            kt.shape[nd - 2] != d or v.shape[nd - 2] != S or mb not in (1, bh) or S == 0 or \
            g.shape[nd - 2] != T or g.shape[nd - 1] != e or p.shape[0] != bh or \
            p.shape[1] != T or p.shape[2] != S:
        raise ValueError("attention_backward_f32: inconsistent shapes")
    cdef cnp.ndarray nc = _attention_ncols(ncols, mb, T, S)
    cdef cnp.ndarray dq = np.empty((bh, T, d), np.float32)
    cdef cnp.ndarray dkt = np.empty((bh, d, S), np.float32)
    cdef cnp.ndarray dv = np.empty((bh, S, e), np.float32)
    cdef int nt = _threads(bh * T * S)
    cdef Py_ssize_t per = T * S + S * d + e * S
    cdef cnp.ndarray scratch = np.empty((nt, per), np.float32)
    cdef float *gp = <float *>cnp.PyArray_DATA(g)
    cdef float *qp = <float *>cnp.PyArray_DATA(q)
    cdef float *kp = <float *>cnp.PyArray_DATA(kt)
    cdef float *vp = <float *>cnp.PyArray_DATA(v)
    cdef long long *gop = <long long *>cnp.PyArray_DATA(go)
    cdef long long *qop = <long long *>cnp.PyArray_DATA(qo)
    cdef long long *kop = <long long *>cnp.PyArray_DATA(ko)
    cdef long long *vop = <long long *>cnp.PyArray_DATA(vo)
    cdef float *pp = <float *>cnp.PyArray_DATA(p)
    cdef int32_t *np_ = <int32_t *>cnp.PyArray_DATA(nc)
    cdef float *dqp = <float *>cnp.PyArray_DATA(dq)
    cdef float *dkp = <float *>cnp.PyArray_DATA(dkt)
    cdef float *dvp = <float *>cnp.PyArray_DATA(dv)
    cdef float *scr = <float *>cnp.PyArray_DATA(scratch)
    cdef float *w
    cdef Py_ssize_t b
    cdef Py_ssize_t nstride = 0 if mb == 1 else T
    with nogil:
        for b in prange(bh, schedule="static", num_threads=nt):
            w = scr + threadid() * per
            fa_tk_attention_bwd_f32(gp + gop[b], ldg, qp + qop[b], ldq, kp + kop[b], ldk,
                                    vp + vop[b], ldv, pp + b * T * S, np_ + b * nstride,
                                    dqp + b * T * d, dkp + b * d * S, dvp + b * S * e, w,
                                    w + T * S, w + T * S + S * d, T, S, d, e, alpha)
    return dq, dkt, dv


def attention_live_columns(cnp.ndarray mask):
    """``ncols`` (M, T) int32 for a float32 ``mask`` (M, T, S): one past each row's last entry
    above the lowest float32 (NaN counts as live; -inf and the lowest do not), or S for a row
    with none."""
    _attention_operand(mask, "mask")
    cdef Py_ssize_t rows = mask.shape[0] * mask.shape[1], S = mask.shape[2], r, j
    cdef cnp.ndarray out = np.empty((mask.shape[0], mask.shape[1]), np.int32)
    cdef const float *m = <const float *>cnp.PyArray_DATA(mask)
    cdef int32_t *o = <int32_t *>cnp.PyArray_DATA(out)
    cdef float lowest = -3.4028234663852886e38
    with nogil:
        for r in range(rows):
            o[r] = <int32_t>S
            j = S - 1
            while j >= 0:
                if not (m[r * S + j] <= lowest):
                    o[r] = <int32_t>(j + 1)
                    break
                j -= 1
    return out


cdef cnp.ndarray _attention_ncols(cnp.ndarray ncols, Py_ssize_t mb, Py_ssize_t T, Py_ssize_t S):
    """``ncols`` checked: int32, C-contiguous, (mb, T), each in [1, S] (the kernels index
    with it)."""
    if ncols.dtype != np.int32 or not ncols.flags.c_contiguous:
        raise TypeError(f"ncols: expected a C-contiguous int32 array, got {ncols.dtype}")
    if ncols.ndim != 2 or ncols.shape[0] != mb or ncols.shape[1] != T:
        raise ValueError(f"ncols: expected shape {(mb, T)}, got {(<object>ncols).shape}")
    if ncols.size and (ncols.min() < 1 or ncols.max() > S):
        raise ValueError(f"ncols: expected values in [1, {S}]")
    return ncols


cdef void _scatter_add(real *out, const long long *idx, const real *rows, Py_ssize_t k,
                       Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef real *o
    for i in range(k):
        o = out + idx[i] * m
        for j in range(m):
            o[j] = o[j] + rows[i * m + j]


def scatter_add_rows(cnp.ndarray out, cnp.ndarray idx, cnp.ndarray rows):
    """``out[idx[i]] += rows[i]`` for i in order (``np.add.at``'s sums, in its order): ``out``
    (n, m) and ``rows`` (k, m) C-contiguous, of one float dtype; ``idx`` int64 (k,) in
    [0, n)."""
    _check(out, "out")
    _check(rows, "rows", out.dtype)
    if idx.dtype != np.int64 or not idx.flags.c_contiguous or idx.ndim != 1:
        raise TypeError("idx: expected a 1-D C-contiguous int64 array")
    if out.ndim != 2 or rows.ndim != 2 or rows.shape[1] != out.shape[1] \
            or rows.shape[0] != idx.shape[0]:
        raise ValueError(f"scatter_add_rows: shapes out {(<object>out).shape}, idx "
                         f"{(<object>idx).shape}, rows {(<object>rows).shape} do not fit")
    cdef Py_ssize_t k = idx.shape[0], m = out.shape[1], n = out.shape[0]
    if k and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"idx: expected values in [0, {n})")
    if out.dtype == np.float32:
        with nogil:
            _scatter_add(<float *>cnp.PyArray_DATA(out), <long long *>cnp.PyArray_DATA(idx),
                         <float *>cnp.PyArray_DATA(rows), k, m)
    else:
        with nogil:
            _scatter_add(<double *>cnp.PyArray_DATA(out), <long long *>cnp.PyArray_DATA(idx),
                         <double *>cnp.PyArray_DATA(rows), k, m)
