"""Kernels of the transformer primitives (``_ops_transformer``): erf, exact GELU and its
derivative, layer normalisation over the last axis and its backward pass.

Design note.  Callers pass C-contiguous float32 or float64 arrays of one dtype (``_ops_transformer``
makes them so); outputs are allocated here.  Elementwise kernels and the per-row layer-norm
kernels release the GIL and split their work in static chunks over OpenMP threads once it is
large enough to pay for the parallel region; each element and each row is computed by the same
code whatever the split, so results do not depend on the thread count.  The column sums of the
layer-norm backward pass (the gradients of scale and bias) are accumulated serially, row by row,
in float64, for the same reason.  Statistics (mean, variance) are accumulated in float64 for
both dtypes.

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
from cython.parallel cimport prange
from libc.math cimport erf as c_erf, exp, sqrt
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

import numpy as np

from fastadam._core._cpu_level import LEVEL_IN_USE

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int fa_tk_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int fa_tk_max_threads(void) { return 1; }
    #endif
    """
    int fa_tk_max_threads() nogil

cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include "fastadam/common.h"
    /* FA_DISPATCH (AVX-512 / AVX2 / baseline clones) on the erf and GELU loops; not on the GELU
       derivative, which gcc vectorizes at the baseline level but not in its AVX2 clone. */
    /* The clamps below are selects; gcc turns them into vector blends (and so vectorizes the
       loops) only when comparisons may not trap: scoped to these functions. */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC push_options
    #pragma GCC optimize ("no-trapping-math")
    #endif
    /* erf in float32 as a rational function of x on [-4, 4] (outside, erf is +-1 in float32):
       odd numerator of degree 13 over an even denominator of degree 8; absolute error below
       5e-7 against the exact value (libm's erff: 6e-8), and it vectorizes. */
    static inline float fa_tk_erf_f32(float x) {
        x = x < -4.0f ? -4.0f : x;
        x = x > 4.0f ? 4.0f : x;
        const float x2 = x * x;
        float p = -2.72614225801306e-10f;
        p = p * x2 + 2.77068142495902e-08f;
        p = p * x2 - 2.10102402082508e-06f;
        p = p * x2 - 5.69250639462346e-05f;
        p = p * x2 - 7.34990630326855e-04f;
        p = p * x2 - 2.95459980854025e-03f;
        p = p * x2 - 1.60960333262415e-02f;
        float q = -1.45660718464996e-05f;
        q = q * x2 - 2.13374055278905e-04f;
        q = q * x2 - 1.68282697438203e-03f;
        q = q * x2 - 7.37332916720468e-03f;
        q = q * x2 - 1.42647390514189e-02f;
        return x * p / q;
    }
    /* exp(y) for y <= 0 in float32, vectorizable, the same bits at every level */
    #include "fastadam/fastexp.h"
    /* two passes over the chunk (in L1): one loop holding both the erf and the exp selects is
       not vectorized by gcc at x86-64-v3 */
    FA_DISPATCH static void tk_gelu_grad_f32_loop(const float *g, const float *x, float *o,
                                                  Py_ssize_t n) {
        #pragma omp simd
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = 0.5f * (1.0f + fa_tk_erf_f32(x[i] * 0.70710678118654752f));
        #pragma omp simd
        for (Py_ssize_t i = 0; i < n; i++) {
            const float v = x[i];
            const float density = 0.39894228040143267794f * fa_exp_neg_f32(-0.5f * v * v);
            o[i] = g[i] * (o[i] + v * density);
        }
    }
    /* softmax of rows of n float32 values: exp(x - max) / sum; an entry more than 87 below
       the row's max (a -inf mask included) is exactly 0 */
    FA_DISPATCH static void tk_softmax_f32_rows(const float *x, float *y, Py_ssize_t rows,
                                                Py_ssize_t n) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            float *yr = y + r * n;
            const float m = fa_fixed_max_f32(xr, n);
            #pragma omp simd
            for (Py_ssize_t i = 0; i < n; i++) {
                const float d = xr[i] - m;
                const float e = fa_exp_neg_f32(d);
                yr[i] = d < -87.0f ? 0.0f : e;
            }
            const float inv = 1.0f / fa_fixed_sum_f32(yr, n);  /* fastexp.h: fixed order */
            #pragma omp simd
            for (Py_ssize_t k = 0; k < n; k++) yr[k] *= inv;
        }
    }
    /* the VJP of softmax per row: dx = y * (g - sum(g * y)) */
    FA_DISPATCH static void tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx,
                                                    Py_ssize_t rows, Py_ssize_t n) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float *gr = g + r * n, *yr = y + r * n;
            float *o = dx + r * n;
            const float dot = fa_fixed_dot_f32(gr, yr, n);  /* fastexp.h: fixed order */
            #pragma omp simd
            for (Py_ssize_t k = 0; k < n; k++) o[k] = yr[k] * (gr[k] - dot);
        }
    }
    /* Layer normalisation of float32 rows, statistics in float64: the sums run over 8 lanes
       (lane j adds the elements j, j + 8, ... in turn, then the lanes in one fixed order), so
       every CPU level gives the same bits.  Same arithmetic as the float64 Cython loops. */
    #define FA_TK_DLANES 8
    static inline double fa_tk_dlanes_sum(const double *acc) {
        double s = 0.0;
        for (int j = 0; j < FA_TK_DLANES; j++) s += acc[j];
        return s;
    }
    FA_DISPATCH static void tk_ln_f32_rows(const float *x, const float *scale, const float *bias,
                                           float *y, float *mean, float *rstd, Py_ssize_t rows,
                                           Py_ssize_t n, double eps) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            float *yr = y + r * n;
            double acc[FA_TK_DLANES] = {0.0};
            Py_ssize_t i = 0;
            for (; i + FA_TK_DLANES <= n; i += FA_TK_DLANES) {
                #pragma omp simd
                for (int j = 0; j < FA_TK_DLANES; j++) acc[j] += (double)xr[i + j];
            }
            for (int j = 0; i + j < n; j++) acc[j] += (double)xr[i + j];
            const double m = fa_tk_dlanes_sum(acc) / (double)n;
            double acc2[FA_TK_DLANES] = {0.0};
            i = 0;
            for (; i + FA_TK_DLANES <= n; i += FA_TK_DLANES) {
                #pragma omp simd
                for (int j = 0; j < FA_TK_DLANES; j++) {
                    const double d = (double)xr[i + j] - m;
                    acc2[j] += d * d;
                }
            }
            for (int j = 0; i + j < n; j++) {
                const double d = (double)xr[i + j] - m;
                acc2[j] += d * d;
            }
            const double inv = 1.0 / __builtin_sqrt(fa_tk_dlanes_sum(acc2) / (double)n + eps);
            mean[r] = (float)m;
            rstd[r] = (float)inv;
            if (bias) {
                #pragma omp simd
                for (Py_ssize_t k = 0; k < n; k++)
                    yr[k] = (float)(((double)xr[k] - m) * inv) * scale[k] + bias[k];
            } else {
                #pragma omp simd
                for (Py_ssize_t k = 0; k < n; k++)
                    yr[k] = (float)(((double)xr[k] - m) * inv) * scale[k];
            }
        }
    }
    /* dx of layer normalisation per float32 row: rstd * (gs - mean(gs) - xhat * mean(gs xhat)),
       gs = g * scale, xhat = (x - mean) * rstd, in float64 with the row means (the statistics
       of the forward, rounded to float32 as stored) */
    FA_DISPATCH static void tk_ln_backward_f32_rows(const float *g, const float *x,
                                                    const float *scale, const float *mean,
                                                    const float *rstd, float *dx,
                                                    Py_ssize_t rows, Py_ssize_t n) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float *gr = g + r * n, *xr = x + r * n;
            float *o = dx + r * n;
            const double m = mean[r], inv = rstd[r];
            double acc_a[FA_TK_DLANES] = {0.0}, acc_b[FA_TK_DLANES] = {0.0};
            Py_ssize_t i = 0;
            for (; i + FA_TK_DLANES <= n; i += FA_TK_DLANES) {
                #pragma omp simd
                for (int j = 0; j < FA_TK_DLANES; j++) {
                    const double gs = (double)gr[i + j] * scale[i + j];
                    acc_a[j] += gs;
                    acc_b[j] += gs * ((double)xr[i + j] - m) * inv;
                }
            }
            for (int j = 0; i + j < n; j++) {
                const double gs = (double)gr[i + j] * scale[i + j];
                acc_a[j] += gs;
                acc_b[j] += gs * ((double)xr[i + j] - m) * inv;
            }
            const double a = fa_tk_dlanes_sum(acc_a) / (double)n;
            const double b = fa_tk_dlanes_sum(acc_b) / (double)n;
            #pragma omp simd
            for (Py_ssize_t k = 0; k < n; k++) {
                const double gs = (double)gr[k] * scale[k];
                const double xh = ((double)xr[k] - m) * inv;
                o[k] = (float)(inv * (gs - a - xh * b));
            }
        }
    }
    FA_DISPATCH static void tk_erf_f32_loop(const float *x, float *y, Py_ssize_t n) {
        #pragma omp simd
        for (Py_ssize_t i = 0; i < n; i++) y[i] = fa_tk_erf_f32(x[i]);
    }
    FA_DISPATCH static void tk_gelu_f32_loop(const float *x, float *y, Py_ssize_t n) {
        #pragma omp simd
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + fa_tk_erf_f32(x[i] * 0.70710678118654752f));
    }
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC pop_options
    #endif
    /* the clone of the level in use (include/fastadam/common.h) */
    FA_DISPATCH_LEVEL_STATE
    FA_CLONES(tk_erf_f32_loop);
    FA_CLONES(tk_gelu_f32_loop);
    FA_CLONES(tk_gelu_grad_f32_loop);
    FA_CLONES(tk_softmax_f32_rows);
    FA_CLONES(tk_softmax_vjp_f32_rows);
    FA_CLONES(tk_ln_f32_rows);
    FA_CLONES(tk_ln_backward_f32_rows);
    static void fa_tk_ln_f32_rows(const float *x, const float *scale, const float *bias,
                                  float *y, float *mean, float *rstd, Py_ssize_t rows,
                                  Py_ssize_t n, double eps) {
        FA_AT_LEVEL(tk_ln_f32_rows)(x, scale, bias, y, mean, rstd, rows, n, eps);
    }
    static void fa_tk_ln_backward_f32_rows(const float *g, const float *x, const float *scale,
                                           const float *mean, const float *rstd, float *dx,
                                           Py_ssize_t rows, Py_ssize_t n) {
        FA_AT_LEVEL(tk_ln_backward_f32_rows)(g, x, scale, mean, rstd, dx, rows, n);
    }
    static void fa_tk_gelu_grad_f32_loop(const float *g, const float *x, float *o,
                                         Py_ssize_t n) {
        FA_AT_LEVEL(tk_gelu_grad_f32_loop)(g, x, o, n);
    }
    static void fa_tk_softmax_f32_rows(const float *x, float *y, Py_ssize_t rows, Py_ssize_t n) {
        FA_AT_LEVEL(tk_softmax_f32_rows)(x, y, rows, n);
    }
    static void fa_tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx,
                                           Py_ssize_t rows, Py_ssize_t n) {
        FA_AT_LEVEL(tk_softmax_vjp_f32_rows)(g, y, dx, rows, n);
    }
    static void fa_tk_erf_f32_loop(const float *x, float *y, Py_ssize_t n) {
        FA_AT_LEVEL(tk_erf_f32_loop)(x, y, n);
    }
    static void fa_tk_gelu_f32_loop(const float *x, float *y, Py_ssize_t n) {
        FA_AT_LEVEL(tk_gelu_f32_loop)(x, y, n);
    }
    """
    void fa_tk_erf_f32_loop(const float *x, float *y, Py_ssize_t n) nogil
    void fa_tk_gelu_grad_f32_loop(const float *g, const float *x, float *o, Py_ssize_t n) nogil
    void fa_tk_gelu_f32_loop(const float *x, float *y, Py_ssize_t n) nogil
    void fa_tk_softmax_f32_rows(const float *x, float *y, Py_ssize_t rows, Py_ssize_t n) nogil
    void fa_tk_ln_f32_rows(const float *x, const float *scale, const float *bias, float *y,
                           float *mean, float *rstd, Py_ssize_t rows, Py_ssize_t n,
                           double eps) nogil
    void fa_tk_ln_backward_f32_rows(const float *g, const float *x, const float *scale,
                                    const float *mean, const float *rstd, float *dx,
                                    Py_ssize_t rows, Py_ssize_t n) nogil
    void fa_tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx, Py_ssize_t rows,
                                    Py_ssize_t n) nogil
    float fa_tk_erf_f32(float x) nogil

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
