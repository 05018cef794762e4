# distutils: libraries = m
"""Fused loops of the MLP estimators' forward/backward pass (fastadam/sklearn/_backprop.py).

A mini-batch of 200 rows makes every NumPy call on its (200, n_outputs) output layer cost more
in call overhead and temporaries than in arithmetic.  These kernels compute a loss's value and
its gradient with respect to the output layer ``z`` in one pass over ``z``, and apply ReLU
forward (with the bias) and backward in one pass over the hidden layer.  Formulas (``w`` the
normalised sample weights, one per row):

- ``softmax_cross_entropy``: value ``sum_i w_i (log s_i - (z_iy - m_i))`` with
  ``m_i = max_j z_ij``, ``s_i = sum_j exp(z_ij - m_i)``; gradient
  ``w_i (exp(z_ij - m_i) / s_i - [j == y_i])``;
- ``binary_cross_entropy`` (one logistic output): ``p = 1 / (1 + exp(-z))``, value
  ``-sum_i w_i (t_i log q_i + (1 - t_i) log(1 - q_i))``, ``q = clip(p, eps, 1 - eps)`` (scikit-
  learn's clipping), gradient ``w_i (p_i - t_i)``;
- ``half_squared_error``: value ``sum_i w_i mean_k (z_ik - t_ik)^2 / 2``, gradient
  ``(z_ik - t_ik) * (w_i / K)``;
- ``bias_relu``: ``h = max(h + b, 0)`` in place (NaN propagates); ``relu_backward``: ``g *= (a > 0)`` in place.

For ``_backprop.BatchPass`` (the estimators' training pass), each equal bit for bit to the NumPy
expression it replaces (tested):

- ``column_sums``: ``g.sum(axis=0)`` for two or more columns (from +0, rows added in order, as
  NumPy does; one column NumPy sums pairwise, and the callers leave that to NumPy);
  ``relu_backward_column_sums``: ``relu_backward``, then ``column_sums``, in one pass;
- ``outer_product``: ``d @ w.T`` with inner dimension 1 (one rounded product per entry; BLAS runs
  this shape slowly); ``outer_relu_backward_column_sums``: that, ``relu_backward`` and
  ``column_sums`` in one pass;
- ``add_l2_gradient``: ``g += decay * w`` (``decay`` rounded to the dtype first, as NumPy
  rounds a Python float), returning ``sum(w * w)`` accumulated in double (the L2 penalty);
- ``EpochTrainer``: the estimators' mini-batch loop for one epoch in one call (gather, pass
  with the loss loop called directly, L2 term, Adam step through fastadam's dense driver with
  the arrays and hyper-parameters validated once per fit), bit for bit the Python loop of
  ``BatchPass.run`` and ``fastadam.step_inplace`` (tested).  With ReLU hidden layers the pass
  is compiled too (``_relu_pass``: NumPy's matrix products, ``np.matmul`` with ``out=`` or
  ``np.dot``, the same gemm call with less dispatch, when no dimension is 1, and the loss
  kernel, with the loops above fused and called on raw pointers in between): the one compiled
  twin of ``BatchPass.run``, timed against it and the autodiff tape in
  ``asv_bench/benchmarks/bench_sklearn.py``.

libm is linked explicitly (the ``distutils`` line above) so that, built against a current
glibc, exp and log bind to their current symbol versions rather than the SVID-wrapper
compatibility ones (the same functions underneath, so the same bits, without the wrapper).

The gradients are computed in the arrays' dtype with the roundings of the NumPy expressions
of ``_losses`` / ``_layers`` (C's exp/log may differ from NumPy's by an ulp); the values are
accumulated in double.  Tested against the loss primitives and the estimators against
scikit-learn's MLP.  Single-threaded: the arrays are small.  Written in Cython (typed pointer
loops): nothing here needs SIMD dispatch.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport exp, expf, log, log1p
from libc.string cimport memcpy


cnp.import_array()


ctypedef fused real_t:
    float
    double


cdef inline real_t _exp(real_t x) noexcept nogil:
    if real_t is float:
        return expf(x)
    return exp(x)


# ---- the losses as pointer loops over C-contiguous (n, k) rows; the def kernels below and
# the compiled training epoch (EpochTrainer) call them

cdef inline double _softmax_cross_entropy(const real_t *z, const cnp.intp_t *labels,
                                          const real_t *weights, real_t *grad, Py_ssize_t n,
                                          Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef real_t m, s, e
    cdef double value = 0
    cdef const real_t *zr
    cdef real_t *gr
    for i in range(n):
        zr = z + i * k
        gr = grad + i * k
        m = zr[0]
        for j in range(1, k):
            if zr[j] > m:
                m = zr[j]
        s = 0
        for j in range(k):
            e = _exp(zr[j] - m)
            gr[j] = e
            s = s + e
        value += <double>weights[i] * (log(<double>s) - <double>(zr[labels[i]] - m))
        for j in range(k):
            gr[j] = gr[j] / s
        gr[labels[i]] = gr[labels[i]] - 1
        for j in range(k):
            gr[j] = gr[j] * weights[i]
    return value


cdef inline double _binary_cross_entropy(const real_t *z, const real_t *targets,
                                         const real_t *weights, real_t *grad, Py_ssize_t n,
                                         double eps) noexcept nogil:
    cdef Py_ssize_t i
    cdef real_t p
    cdef double q, t, value = 0
    for i in range(n):
        p = 1 / (1 + _exp(-z[i]))
        q = min(max(<double>p, eps), 1 - eps)
        t = targets[i]
        value -= <double>weights[i] * (t * log(q) + (1 - t) * log1p(-q))
        grad[i] = (p - targets[i]) * weights[i]
    return value


cdef inline double _half_squared_error(const real_t *z, const real_t *targets,
                                       const real_t *weights, real_t *grad, Py_ssize_t n,
                                       Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef real_t d, scale
    cdef double row, value = 0
    for i in range(n):
        scale = weights[i] / <real_t>k
        row = 0
        for j in range(k):
            d = z[i * k + j] - targets[i * k + j]
            row += <double>d * d
            grad[i * k + j] = d * scale
        value += 0.5 * <double>weights[i] * (row / k)
    return value


cdef int _check_loss_args(Py_ssize_t n, Py_ssize_t k, Py_ssize_t n_targets, Py_ssize_t n_weights,
                          Py_ssize_t grad_rows, Py_ssize_t grad_cols) except -1:
    """The loss kernels' shapes (O(1), every call: the estimators pass their own arrays, but
    these are compiled entry points and must not read past a wrong-sized argument)."""
    if n_targets != n or n_weights != n or grad_rows != n or grad_cols != k:
        raise ValueError(f"loss kernel: z of shape ({n}, {k}) needs {n} targets, {n} weights "
                         f"and a ({n}, {k}) gradient; got {n_targets}, {n_weights} and "
                         f"({grad_rows}, {grad_cols})")
    return 0


def softmax_cross_entropy(const real_t[:, ::1] z, const cnp.intp_t[::1] labels,
                          const real_t[::1] weights, real_t[:, ::1] grad):
    """Loss value (float) of z (n, K) and its gradient written to grad (n, K); labels in
    [0, K) (IndexError otherwise)."""
    cdef Py_ssize_t n = z.shape[0], k = z.shape[1], i
    _check_loss_args(n, k, labels.shape[0], weights.shape[0], grad.shape[0], grad.shape[1])
    for i in range(n):
        if labels[i] < 0 or labels[i] >= k:
            raise IndexError(f"labels: values must lie in [0, {k}), got {labels[i]} at row {i}")
    if n == 0 or k == 0:
        return 0.0
    cdef double value
    with nogil:
        value = _softmax_cross_entropy(&z[0, 0], &labels[0], &weights[0], &grad[0, 0], n, k)
    return value


def binary_cross_entropy(const real_t[:, ::1] z, const real_t[:, ::1] targets,
                         const real_t[::1] weights, real_t[:, ::1] grad, double eps):
    """Loss value (float) of one logistic output z (n, 1) and its gradient (n, 1)."""
    cdef Py_ssize_t n = z.shape[0]
    _check_loss_args(n, z.shape[1], targets.shape[0], weights.shape[0], grad.shape[0],
                     grad.shape[1])
    if targets.shape[1] != z.shape[1]:
        raise ValueError(f"targets: expected shape ({n}, {z.shape[1]}), got "
                         f"({targets.shape[0]}, {targets.shape[1]})")
    if n == 0:
        return 0.0
    cdef double value
    with nogil:
        value = _binary_cross_entropy(&z[0, 0], &targets[0, 0], &weights[0], &grad[0, 0], n,
                                      eps)
    return value


def half_squared_error(const real_t[:, ::1] z, const real_t[:, ::1] targets,
                       const real_t[::1] weights, real_t[:, ::1] grad):
    """Loss value (float) of z (n, K) against targets and its gradient (n, K)."""
    cdef Py_ssize_t n = z.shape[0], k = z.shape[1]
    _check_loss_args(n, k, targets.shape[0], weights.shape[0], grad.shape[0], grad.shape[1])
    if targets.shape[1] != k:
        raise ValueError(f"targets: expected shape ({n}, {k}), got "
                         f"({targets.shape[0]}, {targets.shape[1]})")
    if n == 0 or k == 0:
        return 0.0
    cdef double value
    with nogil:
        value = _half_squared_error(&z[0, 0], &targets[0, 0], &weights[0], &grad[0, 0], n, k)
    return value


# ---- row-pointer loops over C-contiguous (n, k) arrays; the def kernels below and
# _relu_pass call them

cdef inline void _bias_relu(real_t *h, const real_t *b, Py_ssize_t n,
                            Py_ssize_t k) noexcept nogil:
    """h = max(h + b, 0) (NaN stays NaN, as with np.maximum)."""
    cdef Py_ssize_t i, j
    cdef real_t v
    cdef real_t *row
    for i in range(n):
        row = h + i * k
        for j in range(k):
            v = row[j] + b[j]
            row[j] = 0 if v <= 0 else v


cdef inline void _add_bias(real_t *h, const real_t *b, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """h = h + b (the bias broadcast over the rows, as NumPy's h += b)."""
    cdef Py_ssize_t i, j
    cdef real_t *row
    for i in range(n):
        row = h + i * k
        for j in range(k):
            row[j] = row[j] + b[j]


cdef inline void _relu_backward(real_t *g, const real_t *a, Py_ssize_t n,
                                Py_ssize_t k) noexcept nogil:
    """g = g * (a > 0) (g * 0 keeps g's sign of zero, as NumPy's product does)."""
    cdef Py_ssize_t i
    for i in range(n * k):
        g[i] = g[i] * (1 if a[i] > 0 else 0)


cdef inline void _column_sums(const real_t *g, Py_ssize_t n, Py_ssize_t k,
                              real_t *out) noexcept nogil:
    """out[j] = (((0 + g[0, j]) + g[1, j]) + ...): NumPy's order for sum(axis=0) of a
    C-contiguous array with more than one column (from +0, the rows added one after the other;
    +0 first makes a column of -0 sum to +0, as NumPy's does)."""
    cdef Py_ssize_t i, j
    cdef const real_t *row
    for j in range(k):
        out[j] = 0
    for i in range(n):
        row = g + i * k
        for j in range(k):
            out[j] = out[j] + row[j]


cdef inline void _relu_backward_column_sums(real_t *g, const real_t *a, Py_ssize_t n,
                                            Py_ssize_t k, real_t *out) noexcept nogil:
    """_relu_backward, then _column_sums, in one pass."""
    cdef Py_ssize_t i, j
    cdef real_t *grow
    cdef const real_t *arow
    cdef real_t v
    for j in range(k):
        out[j] = 0
    for i in range(n):
        grow = g + i * k
        arow = a + i * k
        for j in range(k):
            v = grow[j] * (1 if arow[j] > 0 else 0)
            grow[j] = v
            out[j] = out[j] + v


cdef inline void _outer_product(const real_t *d, const real_t *w, Py_ssize_t n, Py_ssize_t k,
                                real_t *out) noexcept nogil:
    """out[i, j] = d[i] * w[j]."""
    cdef Py_ssize_t i, j
    cdef real_t di
    cdef real_t *row
    for i in range(n):
        di = d[i]
        row = out + i * k
        for j in range(k):
            row[j] = di * w[j]


cdef inline void _outer_relu_backward_column_sums(const real_t *d, const real_t *w,
                                                  const real_t *a, Py_ssize_t n, Py_ssize_t k,
                                                  real_t *out, real_t *sums) noexcept nogil:
    """_outer_product, _relu_backward and _column_sums in one pass."""
    cdef Py_ssize_t i, j
    cdef real_t di, v
    cdef real_t *row
    cdef const real_t *arow
    for j in range(k):
        sums[j] = 0
    for i in range(n):
        di = d[i]
        row = out + i * k
        arow = a + i * k
        for j in range(k):
            v = (di * w[j]) * (1 if arow[j] > 0 else 0)
            row[j] = v
            sums[j] = sums[j] + v


def bias_relu(real_t[:, ::1] h, const real_t[::1] b):
    """h = max(h + b, 0), in place."""
    cdef Py_ssize_t n = h.shape[0], k = h.shape[1]
    if n == 0 or k == 0:
        return
    with nogil:
        _bias_relu(&h[0, 0], &b[0], n, k)


def relu_backward(real_t[:, ::1] g, const real_t[:, ::1] a):
    """g = g * (a > 0), in place (g * 0 keeps g's sign of zero, as NumPy's product does)."""
    cdef Py_ssize_t n = g.shape[0], k = g.shape[1]
    if n == 0 or k == 0:
        return
    with nogil:
        _relu_backward(&g[0, 0], &a[0, 0], n, k)


# ---- the estimators' batch pass (_backprop.BatchPass): in place, and column sums in row order

def column_sums(const real_t[:, ::1] g, real_t[::1] out):
    """out = g.sum(axis=0) for g (n, k), k >= 2, added row after row from +0 (NumPy's order for
    k >= 2; for one column NumPy sums pairwise, so callers use NumPy there)."""
    cdef Py_ssize_t n = g.shape[0], k = g.shape[1], j
    if k == 0:
        return
    if n == 0:
        for j in range(k):
            out[j] = 0
        return
    with nogil:
        _column_sums(&g[0, 0], n, k, &out[0])


def relu_backward_column_sums(real_t[:, ::1] g, const real_t[:, ::1] a, real_t[::1] out):
    """g = g * (a > 0) in place, then out = g.sum(axis=0) (``column_sums``' order), in one
    pass."""
    cdef Py_ssize_t n = g.shape[0], k = g.shape[1], j
    if k == 0:
        return
    if n == 0:
        for j in range(k):
            out[j] = 0
        return
    with nogil:
        _relu_backward_column_sums(&g[0, 0], &a[0, 0], n, k, &out[0])


def outer_product(const real_t[:, ::1] d, const real_t[:, ::1] w, real_t[:, ::1] out):
    """out = d @ w.T for one output column: d (n, 1), w (k, 1), out (n, k); each entry is the
    one product d[i] * w[j], exactly what a matrix product with inner dimension 1 rounds to."""
    cdef Py_ssize_t n = out.shape[0], k = out.shape[1]
    if n == 0 or k == 0:
        return
    with nogil:
        _outer_product(&d[0, 0], &w[0, 0], n, k, &out[0, 0])


def outer_relu_backward_column_sums(const real_t[:, ::1] d, const real_t[:, ::1] w,
                                    const real_t[:, ::1] a, real_t[:, ::1] out,
                                    real_t[::1] sums):
    """out = (d @ w.T) * (a > 0) for one output column (d (n, 1), w (k, 1), a and out (n, k)),
    then sums = out.sum(axis=0) (row after row), in one pass: ``outer_product``, then
    ``relu_backward_column_sums``, with the same roundings."""
    cdef Py_ssize_t n = out.shape[0], k = out.shape[1], j
    if k == 0:
        return
    if n == 0:
        for j in range(k):
            sums[j] = 0
        return
    with nogil:
        _outer_relu_backward_column_sums(&d[0, 0], &w[0, 0], &a[0, 0], n, k, &out[0, 0],
                                         &sums[0])


cdef inline double _add_l2_gradient(real_t *gp, const real_t *wp, Py_ssize_t n,
                                    double decay) noexcept nogil:
    """gp += decay * wp (decay rounded to real_t first); returns sum(wp * wp) in double, in
    four interleaved partial sums added as (s0 + s1) + (s2 + s3)."""
    cdef Py_ssize_t i, body = n - n % 4
    cdef real_t s = <real_t>decay
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0
    for i in range(n):
        gp[i] = gp[i] + s * wp[i]
    for i in range(0, body, 4):
        s0 += <double>wp[i] * wp[i]
        s1 += <double>wp[i + 1] * wp[i + 1]
        s2 += <double>wp[i + 2] * wp[i + 2]
        s3 += <double>wp[i + 3] * wp[i + 3]
    for i in range(body, n):
        s0 += <double>wp[i] * wp[i]
    return (s0 + s1) + (s2 + s3)


def add_l2_gradient(real_t[::1] g, const real_t[::1] w, double decay):
    """g = g + decay * w in place (decay rounded to g's dtype first, as NumPy does with a
    Python float; the L2 term of the weights' gradient); returns sum(w * w), accumulated in
    double in four interleaved partial sums (entries i = r mod 4), added as
    ``(s0 + s1) + (s2 + s3)``: one fixed order, with no serial chain of additions."""
    cdef Py_ssize_t n = g.shape[0]
    cdef double value
    if n == 0:
        return 0.0
    with nogil:
        value = _add_l2_gradient(&g[0], &w[0], n, decay)
    return value


# ---- BatchPass.run for activation="relu", compiled (EpochTrainer's pass): the same calls in
# the same order, with the loops above called on raw pointers (no memoryview per call, no
# interpreter glue)

cdef object _matmul = np.matmul
cdef object _dot = np.dot
cdef object _add_reduce = np.add.reduce


cdef inline void *_data(object a):
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline Py_ssize_t _rows(object a):
    return cnp.PyArray_DIM(<cnp.ndarray>a, 0)


cdef inline Py_ssize_t _cols(object a):
    return cnp.PyArray_DIM(<cnp.ndarray>a, 1)


cdef inline _product(object a, object b, object out):
    """out = a @ b for 2-D a (n, k) and b (k, m).  With n, k and m all above 1 this is
    ``np.dot``: the same BLAS gemm call as ``np.matmul`` (the same bits) with less dispatch
    (about 1 us less per call).  With a dimension of 1, dot takes its vector or scalar paths,
    whose roundings can differ from matmul's, so matmul itself runs."""
    if _rows(a) > 1 and _cols(a) > 1 and _cols(b) > 1:
        _dot(a, b, out)
    else:
        _matmul(a, b, out)


cdef void _sums_of(object g, object out, bint dbl):
    """out = g.sum(axis=0): NumPy's own reduction for one column (pairwise), else the loop in
    NumPy's row order."""
    cdef Py_ssize_t n = _rows(g), k = _cols(g)
    if k == 1 or n == 0:
        _add_reduce(g, 0, None, out)
    elif dbl:
        _column_sums(<const double *>_data(g), n, k, <double *>_data(out))
    else:
        _column_sums(<const float *>_data(g), n, k, <float *>_data(out))




# loss codes of _relu_pass: a Python callable (``loss(z, targets, weights, dz, *extra)``), or one
# of the pointer loops above, called directly
cdef enum:
    LOSS_CALLABLE = 0
    LOSS_SOFTMAX = 1
    LOSS_BINARY = 2
    LOSS_SQUARED = 3


cdef double _loss(int code, object loss, object z, object targets, object weights, object dz,
                  tuple extra, double eps, bint dbl) except? -1.0:
    """The loss value of the output layer z; d loss / d z written to dz."""
    cdef Py_ssize_t n = _rows(z), k = _cols(z)
    if code == LOSS_CALLABLE:
        return loss(z, targets, weights, dz, *extra)
    if n == 0 or k == 0:
        return 0.0
    if code == LOSS_SOFTMAX:
        if dbl:
            return _softmax_cross_entropy(<const double *>_data(z),
                                          <const cnp.intp_t *>_data(targets),
                                          <const double *>_data(weights), <double *>_data(dz),
                                          n, k)
        return _softmax_cross_entropy(<const float *>_data(z),
                                      <const cnp.intp_t *>_data(targets),
                                      <const float *>_data(weights), <float *>_data(dz), n, k)
    if code == LOSS_BINARY:
        if dbl:
            return _binary_cross_entropy(<const double *>_data(z), <const double *>_data(targets),
                                         <const double *>_data(weights), <double *>_data(dz),
                                         n, eps)
        return _binary_cross_entropy(<const float *>_data(z), <const float *>_data(targets),
                                     <const float *>_data(weights), <float *>_data(dz), n, eps)
    if dbl:
        return _half_squared_error(<const double *>_data(z), <const double *>_data(targets),
                                   <const double *>_data(weights), <double *>_data(dz), n, k)
    return _half_squared_error(<const float *>_data(z), <const float *>_data(targets),
                               <const float *>_data(weights), <float *>_data(dz), n, k)


cdef double _relu_pass(object X, list coefs, list intercepts, list values, list deltas,
                       list coef_grads, list intercept_grads, int loss_code, object loss,
                       object targets, object weights, tuple extra, double eps) except? -1.0:
    """``BatchPass.run`` for ReLU hidden layers, compiled: ``values[i]`` and ``deltas[i]`` are
    the (n, units) buffers of this batch's n rows; every array is C-contiguous and of X's dtype
    (float32 or float64), as BatchPass allocates them; the loss is ``loss_code``'s.  Returns the
    loss value."""
    cdef Py_ssize_t last = len(coefs) - 1, i, n, k
    cdef bint dbl = cnp.PyArray_TYPE(<cnp.ndarray>X) == cnp.NPY_DOUBLE
    cdef double value
    h = X
    for i in range(last + 1):
        z = values[i]
        _product(h, coefs[i], z)
        n, k = _rows(z), _cols(z)
        if i != last:
            if dbl:
                _bias_relu(<double *>_data(z), <const double *>_data(intercepts[i]), n, k)
            else:
                _bias_relu(<float *>_data(z), <const float *>_data(intercepts[i]), n, k)
        elif dbl:
            _add_bias(<double *>_data(z), <const double *>_data(intercepts[i]), n, k)
        else:
            _add_bias(<float *>_data(z), <const float *>_data(intercepts[i]), n, k)
        h = z
    dz = deltas[last]
    value = _loss(loss_code, loss, h, targets, weights, dz, extra, eps, dbl)
    for i in range(last, -1, -1):
        a = values[i - 1] if i else X
        _product(a.T, dz, coef_grads[i])
        if i == last:  # the output layer's bias gradient (hidden ones: below, fused)
            _sums_of(dz, intercept_grads[i], dbl)
        if i == 0:
            break
        below = deltas[i - 1]
        w = coefs[i]
        sums = intercept_grads[i - 1]
        n, k = _rows(below), _cols(below)
        if _cols(w) == 1:
            if k > 1:
                if dbl:
                    _outer_relu_backward_column_sums(
                        <const double *>_data(dz), <const double *>_data(w),
                        <const double *>_data(a), n, k, <double *>_data(below),
                        <double *>_data(sums))
                else:
                    _outer_relu_backward_column_sums(
                        <const float *>_data(dz), <const float *>_data(w),
                        <const float *>_data(a), n, k, <float *>_data(below),
                        <float *>_data(sums))
                dz = below
                continue
            if dbl:
                _outer_product(<const double *>_data(dz), <const double *>_data(w), n, k,
                               <double *>_data(below))
            else:
                _outer_product(<const float *>_data(dz), <const float *>_data(w), n, k,
                               <float *>_data(below))
        else:
            _product(dz, w.T, below)
        if k > 1:  # row order == NumPy's for two or more columns
            if dbl:
                _relu_backward_column_sums(<double *>_data(below), <const double *>_data(a),
                                           n, k, <double *>_data(sums))
            else:
                _relu_backward_column_sums(<float *>_data(below), <const float *>_data(a),
                                           n, k, <float *>_data(sums))
        else:
            if dbl:
                _relu_backward(<double *>_data(below), <const double *>_data(a), n, k)
            else:
                _relu_backward(<float *>_data(below), <const float *>_data(a), n, k)
            _sums_of(below, sums, dbl)
        dz = below
    return value


# ---- the training epoch, compiled: no interpreter between mini-batches

cdef class EpochTrainer:
    """The estimators' mini-batch loop (``_mlp``) for one fit: ``epoch()`` runs every
    mini-batch of an epoch.  Per mini-batch: the shuffled rows copied into the batch buffer,
    the forward/backward pass (``_relu_pass`` with the loss called directly, or
    ``BatchPass.run`` for the other activations), the L2 term (``add_l2_gradient``) and one
    Adam step through fastadam's dense driver.

    The step is ``fastadam.step_inplace(params, gradients, m, v, t, lr=..., beta1=...,
    beta2=..., eps=..., convention="tf", num_threads=...)`` through the public prepared step
    (``fastadam.optim.prepare_step``: the arrays checked once per fit, the hyper-parameters
    checked here, each step folded as step_inplace folds it), so the bits are step_inplace's.
    """
    cdef object batch
    cdef bint relu, dbl
    cdef int loss_code
    cdef object loss
    cdef tuple extra
    cdef double clip
    cdef list coefs, intercepts, coef_grads, intercept_grads
    cdef dict views
    cdef object params, gradients
    cdef Py_ssize_t coef_size
    cdef double alpha
    cdef object adam
    cdef dict hyper
    cdef readonly long long t

    def __init__(self, batch, list coefs, list intercepts, loss, tuple extra, params, m, v,
                 long long t, double lr, double beta1, double beta2, double eps, double alpha,
                 num_threads):
        """``batch``: the fit's BatchPass; ``coefs``/``intercepts``: views of ``params``
        (weights first, then intercepts, as ``batch.gradients``); ``loss, extra``: the
        estimator's ``_loss_kernel()``; ``m, v``: Adam's moments like ``params``, ``t``: the
        steps taken so far; ``alpha``: the L2 strength (0: none)."""
        from fastadam.optim import prepare_step
        self.batch = batch
        self.relu = batch.activation == "relu"
        self.loss = loss
        self.extra = extra
        self.clip = extra[0] if extra else 0.0
        if loss is softmax_cross_entropy:
            self.loss_code = LOSS_SOFTMAX
        elif loss is binary_cross_entropy:
            self.loss_code = LOSS_BINARY
        elif loss is half_squared_error:
            self.loss_code = LOSS_SQUARED
        else:
            self.loss_code = LOSS_CALLABLE
        self.coefs, self.intercepts = coefs, intercepts
        self.coef_grads, self.intercept_grads = batch.coef_grads, batch.intercept_grads
        self.views = {}
        self.params, self.gradients = params, batch.gradients
        self.coef_size = batch.coef_size
        self.alpha = alpha
        self.t = t
        if params.dtype not in (np.float64, np.float32):
            raise TypeError(f"params: expected float32 or float64, got {params.dtype}")
        # every array and hyper-parameter checked once, here: a bad one raises before any step
        self.adam = prepare_step("adam", params, {"m": m, "v": v}, num_threads=num_threads)
        self.hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, convention="tf")
        self.adam.check(t + 1, **self.hyper)
        self.dbl = params.dtype == np.float64

    cdef inline _adam_step(self):
        self.t += 1
        self.adam.step(self.gradients, self.t, **self.hyper)

    def epoch(self, list xb, list tb, list weights, list scales, X=None, targets=None,
              order=None):
        """One pass over the mini-batches ``xb[i], tb[i]`` (rows and targets) with sample
        weights ``weights[i]`` (normalised to sum to 1) and L2 scale ``scales[i]`` (1 / the
        batch's weight sum).  With ``order``, batch i's rows are first copied from
        ``X[order[start:start + rows]]`` (and ``targets``) into ``xb[i]``, ``tb[i]``.
        Returns the sum over the batches of rows * loss."""
        cdef Py_ssize_t b, nb = len(xb), rows, start = 0
        cdef double value, scale, squares, total = 0
        cdef const cnp.intp_t *idx = NULL
        if order is not None:
            idx = <const cnp.intp_t *>_data(order)
        for b in range(nb):
            Xb, Tb, w = xb[b], tb[b], weights[b]
            rows = _rows(Xb)
            if order is not None:
                _gather(X, idx + start, rows, Xb)
                _gather(targets, idx + start, rows, Tb)
            start += rows
            if self.relu:
                views = self.views.get(rows)
                if views is None:
                    views = self.views[rows] = ([v[:rows] for v in self.batch.values],
                                                [d[:rows] for d in self.batch.deltas])
                value = _relu_pass(Xb, self.coefs, self.intercepts, views[0], views[1],
                                   self.coef_grads, self.intercept_grads, self.loss_code,
                                   self.loss, Tb, w, self.extra, self.clip)
            else:
                value = self.batch.run(Xb, self.coefs, self.intercepts, self.loss, Tb, w,
                                       self.extra)
            if self.alpha:
                # L2 on the weights only: g + decay * W, and the penalty of the weights the
                # gradient was taken at, as sklearn reports it
                scale = scales[b]
                if self.dbl:
                    squares = _add_l2_gradient(<double *>_data(self.gradients),
                                               <const double *>_data(self.params),
                                               self.coef_size, self.alpha * scale)
                else:
                    squares = _add_l2_gradient(<float *>_data(self.gradients),
                                               <const float *>_data(self.params),
                                               self.coef_size, self.alpha * scale)
                value += 0.5 * self.alpha * scale * squares
            self._adam_step()
            total += rows * value
        return total


cdef void _gather(object src, const cnp.intp_t *rows, Py_ssize_t n, object dst) noexcept:
    """dst[i] = src[rows[i]] for C-contiguous src and dst (whole rows copied)."""
    cdef Py_ssize_t i, size = cnp.PyArray_STRIDE(<cnp.ndarray>src, 0)
    cdef const char *s = <const char *>_data(src)
    cdef char *d = <char *>_data(dst)
    for i in range(n):
        memcpy(d + i * size, s + rows[i] * size, size)
