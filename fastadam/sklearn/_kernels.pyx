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
- ``relu_network_pass``: ``BatchPass.run`` for ReLU networks, compiled: NumPy's matrix
  products (``np.matmul`` with ``out=``) and the loss kernel, with the loops above called on
  raw pointers in between (about 10 us less per mini-batch than the Python pass).

The gradients are computed in the arrays' dtype with the roundings of the NumPy expressions
of ``_losses`` / ``_layers`` (C's exp/log may differ from NumPy's by an ulp); the values are
accumulated in double.  Tested against the loss primitives and the estimators against
scikit-learn's MLP.  Single-threaded: the arrays are small.  Written in Cython (typed pointer
loops): nothing here needs SIMD dispatch.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport exp, expf, log, log1p

cnp.import_array()

ctypedef fused real_t:
    float
    double


cdef inline real_t _exp(real_t x) noexcept nogil:
    if real_t is float:
        return expf(x)
    return exp(x)


def softmax_cross_entropy(const real_t[:, ::1] z, const cnp.intp_t[::1] labels,
                          const real_t[::1] weights, real_t[:, ::1] grad):
    """Loss value (float) of z (n, K) and its gradient written to grad (n, K)."""
    cdef Py_ssize_t n = z.shape[0], k = z.shape[1], i, j
    cdef real_t m, s, e
    cdef double value = 0
    with nogil:
        for i in range(n):
            m = z[i, 0]
            for j in range(1, k):
                if z[i, j] > m:
                    m = z[i, j]
            s = 0
            for j in range(k):
                e = _exp(z[i, j] - m)
                grad[i, j] = e
                s = s + e
            value += <double>weights[i] * (log(<double>s) - <double>(z[i, labels[i]] - m))
            for j in range(k):
                grad[i, j] = grad[i, j] / s
            grad[i, labels[i]] = grad[i, labels[i]] - 1
            for j in range(k):
                grad[i, j] = grad[i, j] * weights[i]
    return value


def binary_cross_entropy(const real_t[:, ::1] z, const real_t[:, ::1] targets,
                         const real_t[::1] weights, real_t[:, ::1] grad, double eps):
    """Loss value (float) of one logistic output z (n, 1) and its gradient (n, 1)."""
    cdef Py_ssize_t n = z.shape[0], i
    cdef real_t p
    cdef double q, t, value = 0
    with nogil:
        for i in range(n):
            p = 1 / (1 + _exp(-z[i, 0]))
            q = min(max(<double>p, eps), 1 - eps)
            t = targets[i, 0]
            value -= <double>weights[i] * (t * log(q) + (1 - t) * log1p(-q))
            grad[i, 0] = (p - targets[i, 0]) * weights[i]
    return value


def half_squared_error(const real_t[:, ::1] z, const real_t[:, ::1] targets,
                       const real_t[::1] weights, real_t[:, ::1] grad):
    """Loss value (float) of z (n, K) against targets and its gradient (n, K)."""
    cdef Py_ssize_t n = z.shape[0], k = z.shape[1], i, j
    cdef real_t d, scale
    cdef double row, value = 0
    with nogil:
        for i in range(n):
            scale = weights[i] / <real_t>k
            row = 0
            for j in range(k):
                d = z[i, j] - targets[i, j]
                row += <double>d * d
                grad[i, j] = d * scale
            value += 0.5 * <double>weights[i] * (row / k)
    return value


# ---- row-pointer loops over C-contiguous (n, k) arrays; the def kernels below and
# relu_network_pass call them

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


def add_l2_gradient(real_t[::1] g, const real_t[::1] w, double decay):
    """g = g + decay * w in place (decay rounded to g's dtype first, as NumPy does with a
    Python float; the L2 term of the weights' gradient); returns sum(w * w), accumulated in
    double in four interleaved partial sums (entries i = r mod 4), added as
    ``(s0 + s1) + (s2 + s3)``: one fixed order, with no serial chain of additions."""
    cdef Py_ssize_t n = g.shape[0], i, body = g.shape[0] - g.shape[0] % 4
    cdef real_t s = <real_t>decay
    cdef real_t *gp
    cdef const real_t *wp
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0
    if n == 0:
        return 0.0
    with nogil:
        gp = &g[0]
        wp = &w[0]
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


# ---- BatchPass.run for activation="relu", compiled: the same calls in the same order, with
# the loops above called on raw pointers (no memoryview per call, no interpreter glue)

cdef object _matmul = np.matmul
cdef object _add_reduce = np.add.reduce


cdef inline void *_data(object a):
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline Py_ssize_t _rows(object a):
    return cnp.PyArray_DIM(<cnp.ndarray>a, 0)


cdef inline Py_ssize_t _cols(object a):
    return cnp.PyArray_DIM(<cnp.ndarray>a, 1)


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


def relu_network_pass(X, list coefs, list intercepts, list values, list deltas,
                      list coef_grads, list intercept_grads, loss, targets, weights,
                      tuple extra):
    """``_backprop.BatchPass.run`` for ReLU hidden layers: ``values[i]`` and ``deltas[i]`` are
    the (n, units) buffers of this batch's n rows; every array is C-contiguous and of X's
    dtype (float32 or float64), as BatchPass allocates them.  Returns the loss value."""
    cdef Py_ssize_t last = len(coefs) - 1, i, n, k
    cdef bint dbl = cnp.PyArray_TYPE(<cnp.ndarray>X) == cnp.NPY_DOUBLE
    h = X
    for i in range(last + 1):
        z = values[i]
        _matmul(h, coefs[i], z)
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
    value = loss(h, targets, weights, dz, *extra)
    for i in range(last, -1, -1):
        a = values[i - 1] if i else X
        _matmul(a.T, dz, coef_grads[i])
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
            _matmul(dz, w.T, below)
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
