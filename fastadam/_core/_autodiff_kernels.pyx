"""Cython driver of the autodiff kernels (include/fastadam/autodiff_kernels.h).

Callers (fastadam/autodiff/_kernels.py) pass C-contiguous float32/float64 arrays of one dtype;
this module checks that once more (cheaply), allocates the output, releases the GIL and splits
the work into static chunks over OpenMP threads when it is large enough to pay for the parallel
region.  Each element / row / column / plane is computed by one kernel call whatever the split,
so results do not depend on the thread count.  The thread count comes from
``fastadam._core._threads.resolve_num_threads(None)``, the package's one policy: OpenMP's current
maximum (``OMP_NUM_THREADS``, ``threadpoolctl``) capped by the CPUs this process may use, and
one thread in a forked child (libgomp's pool does not survive ``fork``).
"""
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport intptr_t
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

import numpy as np

from ._cpu_level import LEVEL_IN_USE
from ._threads import resolve_num_threads

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from "fastadam/autodiff_kernels.h":
    ctypedef struct fa_conv_geom:
        Py_ssize_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo
    void fa_ad_relu_f32(const float *x, float *y, Py_ssize_t n) nogil
    void fa_ad_relu_f64(const double *x, double *y, Py_ssize_t n) nogil
    void fa_ad_relu_grad_f32(const float *g, const float *x, float *o, Py_ssize_t n) nogil
    void fa_ad_relu_grad_f64(const double *g, const double *x, double *o, Py_ssize_t n) nogil
    void fa_ad_relu_grad_scalar_f32(float g, const float *x, float *o, Py_ssize_t n) nogil
    void fa_ad_relu_grad_scalar_f64(double g, const double *x, double *o, Py_ssize_t n) nogil
    void fa_ad_sigmoid_f32(const float *x, float *y, Py_ssize_t n) nogil
    void fa_ad_sigmoid_f64(const double *x, double *y, Py_ssize_t n) nogil
    void fa_ad_sigmoid_grad_f32(const float *g, const float *s, float *o, Py_ssize_t n) nogil
    void fa_ad_sigmoid_grad_f64(const double *g, const double *s, double *o, Py_ssize_t n) nogil
    void fa_ad_tanh_grad_f32(const float *g, const float *t, float *o, Py_ssize_t n) nogil
    void fa_ad_tanh_grad_f64(const double *g, const double *t, double *o, Py_ssize_t n) nogil
    void fa_ad_sum_rows_f32(const float *x, float *o, Py_ssize_t rows, Py_ssize_t cols,
                            Py_ssize_t j0, Py_ssize_t j1) nogil
    void fa_ad_sum_rows_f64(const double *x, double *o, Py_ssize_t rows, Py_ssize_t cols,
                            Py_ssize_t j0, Py_ssize_t j1) nogil
    void fa_ad_sce_rows_f32(const float *x, const intptr_t *lab, float *loss, Py_ssize_t cols,
                            Py_ssize_t i0, Py_ssize_t i1) nogil
    void fa_ad_sce_rows_f64(const double *x, const intptr_t *lab, double *loss, Py_ssize_t cols,
                            Py_ssize_t i0, Py_ssize_t i1) nogil
    void fa_ad_sce_grad_rows_f32(const float *x, const intptr_t *lab, float *o, Py_ssize_t cols,
                                 float scale, Py_ssize_t i0, Py_ssize_t i1) nogil
    void fa_ad_sce_grad_rows_f64(const double *x, const intptr_t *lab, double *o,
                                 Py_ssize_t cols, double scale, Py_ssize_t i0, Py_ssize_t i1) nogil
    void fa_ad_im2col_f32(const float *x, float *cols, const fa_conv_geom *g, Py_ssize_t r0,
                          Py_ssize_t r1) nogil
    void fa_ad_im2col_f64(const double *x, double *cols, const fa_conv_geom *g, Py_ssize_t r0,
                          Py_ssize_t r1) nogil
    void fa_ad_col2im_f32(const float *cols, float *x, const fa_conv_geom *g, Py_ssize_t k0,
                          Py_ssize_t k1) nogil
    void fa_ad_col2im_f64(const double *cols, double *x, const fa_conv_geom *g, Py_ssize_t k0,
                          Py_ssize_t k1) nogil

# Elementwise work is cut into chunks of CHUNK elements (a multiple of 64 bytes); below
# PARALLEL_MIN elements everything runs on the calling thread (a parallel region costs more).
DEF CHUNK = 16384
DEF PARALLEL_MIN = 65536

cdef inline int _threads(Py_ssize_t work, Py_ssize_t parts) except -1:
    """Threads for ``work`` elements in ``parts`` pieces: 1 below PARALLEL_MIN, else the
    package's one policy (fastadam/_core/_threads.py: OpenMP's maximum capped by the usable CPUs,
    and one thread in a process forked after a parallel region ran, where libgomp hangs)."""
    if work < PARALLEL_MIN or parts < 2:
        return 1
    cdef int nt = resolve_num_threads(None)
    if nt > parts:
        nt = <int>parts
    return nt if nt > 1 else 1


cdef inline bint _is_f32(cnp.ndarray a):
    return cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT


cdef _check(cnp.ndarray a, str name):
    cdef int t = cnp.PyArray_TYPE(a)
    if t != cnp.NPY_FLOAT and t != cnp.NPY_DOUBLE:
        raise TypeError(f"{name}: expected float32 or float64, got {a.dtype}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"{name}: expected a C-contiguous array")


def is_fast(*arrays):
    """True when the arrays are aligned, native-order, C-contiguous float32 or float64 ndarrays,
    all of one dtype: what the kernels below take (the Python-side test, in one C call)."""
    cdef int t = -1, ti
    cdef cnp.ndarray x
    for a in arrays:
        if not cnp.PyArray_Check(a):
            return False
        x = <cnp.ndarray>a
        ti = cnp.PyArray_TYPE(x)
        if (ti != cnp.NPY_FLOAT and ti != cnp.NPY_DOUBLE) or not cnp.PyArray_IS_C_CONTIGUOUS(x) \
                or not cnp.PyArray_ISALIGNED(x) or not cnp.PyArray_ISNOTSWAPPED(x):
            return False
        if t == -1:
            t = ti
        elif ti != t:
            return False
    return t != -1


cdef _check_same(cnp.ndarray a, cnp.ndarray b):
    _check(a, "a")
    _check(b, "b")
    if cnp.PyArray_TYPE(a) != cnp.PyArray_TYPE(b) or a.size != b.size:
        raise ValueError("expected two arrays of the same dtype and size")


# ---- elementwise: op 0 relu, 1 sigmoid; binary op 0 relu_grad, 1 sigmoid_grad, 2 tanh_grad ----

cdef void _unary(int op, bint f32, char *x, char *y, Py_ssize_t n) noexcept nogil:
    if op == 0:
        if f32:
            fa_ad_relu_f32(<float *>x, <float *>y, n)
        else:
            fa_ad_relu_f64(<double *>x, <double *>y, n)
    else:
        if f32:
            fa_ad_sigmoid_f32(<float *>x, <float *>y, n)
        else:
            fa_ad_sigmoid_f64(<double *>x, <double *>y, n)


cdef void _binary(int op, bint f32, char *g, char *x, char *o, Py_ssize_t n) noexcept nogil:
    if op == 0:
        if f32:
            fa_ad_relu_grad_f32(<float *>g, <float *>x, <float *>o, n)
        else:
            fa_ad_relu_grad_f64(<double *>g, <double *>x, <double *>o, n)
    elif op == 1:
        if f32:
            fa_ad_sigmoid_grad_f32(<float *>g, <float *>x, <float *>o, n)
        else:
            fa_ad_sigmoid_grad_f64(<double *>g, <double *>x, <double *>o, n)
    else:
        if f32:
            fa_ad_tanh_grad_f32(<float *>g, <float *>x, <float *>o, n)
        else:
            fa_ad_tanh_grad_f64(<double *>g, <double *>x, <double *>o, n)


cdef cnp.ndarray _output(cnp.ndarray x, object out):
    """A new array like x, or ``out`` once checked (writable, C-contiguous, x's dtype and size)."""
    if out is None:
        return cnp.PyArray_EMPTY(x.ndim, x.shape, cnp.PyArray_TYPE(x), 0)
    cdef cnp.ndarray o = out
    if cnp.PyArray_TYPE(o) != cnp.PyArray_TYPE(x) or not cnp.PyArray_IS_C_CONTIGUOUS(o) or \
            o.size != x.size or not o.flags.writeable:
        raise ValueError("out: expected a writable C-contiguous array of the input's dtype "
                         "and size")
    return o


cdef cnp.ndarray _run_unary(int op, cnp.ndarray x, object out=None):
    _check(x, "x")
    cdef cnp.ndarray y = _output(x, out)
    cdef Py_ssize_t n = x.size, isz = x.itemsize, k, nchunks = (n + CHUNK - 1) // CHUNK
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *py = <char *>cnp.PyArray_DATA(y)
    cdef int nt = _threads(n, nchunks)
    with nogil:
        if nt == 1:
            _unary(op, f32, px, py, n)
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                _unary(op, f32, px + k * CHUNK * isz, py + k * CHUNK * isz,
                       min(<Py_ssize_t>CHUNK, n - k * CHUNK))
    return y


cdef cnp.ndarray _run_binary(int op, cnp.ndarray g, cnp.ndarray x, object out=None):
    _check_same(g, x)
    cdef cnp.ndarray o = _output(x, out)
    cdef Py_ssize_t n = x.size, isz = x.itemsize, k, nchunks = (n + CHUNK - 1) // CHUNK
    cdef bint f32 = _is_f32(x)
    cdef char *pg = <char *>cnp.PyArray_DATA(g)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *po = <char *>cnp.PyArray_DATA(o)
    cdef int nt = _threads(n, nchunks)
    with nogil:
        if nt == 1:
            _binary(op, f32, pg, px, po, n)
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                _binary(op, f32, pg + k * CHUNK * isz, px + k * CHUNK * isz,
                        po + k * CHUNK * isz, min(<Py_ssize_t>CHUNK, n - k * CHUNK))
    return o


# ``out``: every elementwise kernel writes into a new array, or into ``out`` when given (a
# buffer the caller reuses across steps; same dtype and size as the input, C-contiguous).

def relu(cnp.ndarray x, out=None):
    """x < 0 ? 0 : x (NaN stays NaN)."""
    return _run_unary(0, x, out)


def sigmoid(cnp.ndarray x, out=None):
    """Overflow-free logistic function."""
    return _run_unary(1, x, out)


def relu_grad(cnp.ndarray g, cnp.ndarray x, out=None):
    """x <= 0 ? 0 : g."""
    return _run_binary(0, g, x, out)


def relu_grad_scalar(double g, cnp.ndarray x, out=None):
    """x <= 0 ? 0 : g for a scalar g (x's dtype)."""
    _check(x, "x")
    cdef cnp.ndarray o = _output(x, out)
    cdef Py_ssize_t n = x.size, isz = x.itemsize, k, nchunks = (n + CHUNK - 1) // CHUNK
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *po = <char *>cnp.PyArray_DATA(o)
    cdef int nt = _threads(n, nchunks)
    cdef Py_ssize_t m
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for k in range(nchunks):
                m = min(<Py_ssize_t>CHUNK, n - k * CHUNK)
                if f32:
                    fa_ad_relu_grad_scalar_f32(<float>g, <float *>(px + k * CHUNK * isz),
                                               <float *>(po + k * CHUNK * isz), m)
                else:
                    fa_ad_relu_grad_scalar_f64(g, <double *>(px + k * CHUNK * isz),
                                               <double *>(po + k * CHUNK * isz), m)
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                m = min(<Py_ssize_t>CHUNK, n - k * CHUNK)
                if f32:
                    fa_ad_relu_grad_scalar_f32(<float>g, <float *>(px + k * CHUNK * isz),
                                               <float *>(po + k * CHUNK * isz), m)
                else:
                    fa_ad_relu_grad_scalar_f64(g, <double *>(px + k * CHUNK * isz),
                                               <double *>(po + k * CHUNK * isz), m)
    return o


def sigmoid_grad(cnp.ndarray g, cnp.ndarray s, out=None):
    """g * s * (1 - s)."""
    return _run_binary(1, g, s, out)


def tanh_grad(cnp.ndarray g, cnp.ndarray t, out=None):
    """g * (1 - t * t)."""
    return _run_binary(2, g, t, out)


def sum_rows(cnp.ndarray x):
    """Column sums of a C-contiguous 2-D array (rows added in ascending order)."""
    _check(x, "x")
    if x.ndim != 2:
        raise ValueError("x: expected a 2-D array")
    cdef Py_ssize_t rows = x.shape[0], cols = x.shape[1], k, nblocks, B = 256
    cdef cnp.npy_intp dim = cols
    cdef cnp.ndarray o = cnp.PyArray_EMPTY(1, &dim, cnp.PyArray_TYPE(x), 0)
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *po = <char *>cnp.PyArray_DATA(o)
    nblocks = (cols + B - 1) // B
    cdef int nt = _threads(rows * cols, nblocks)
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for k in range(nblocks):
                if f32:
                    fa_ad_sum_rows_f32(<float *>px, <float *>po, rows, cols, k * B,
                                       min(cols, (k + 1) * B))
                else:
                    fa_ad_sum_rows_f64(<double *>px, <double *>po, rows, cols, k * B,
                                       min(cols, (k + 1) * B))
        else:
            for k in prange(nblocks, schedule="static", num_threads=nt):
                if f32:
                    fa_ad_sum_rows_f32(<float *>px, <float *>po, rows, cols, k * B,
                                       min(cols, (k + 1) * B))
                else:
                    fa_ad_sum_rows_f64(<double *>px, <double *>po, rows, cols, k * B,
                                       min(cols, (k + 1) * B))
    return o


cdef _check_sce(cnp.ndarray x, cnp.ndarray labels):
    _check(x, "logits")
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError("logits: expected a 2-D array with at least one class")
    if cnp.PyArray_TYPE(labels) != cnp.NPY_INTP or labels.ndim != 1 or \
            labels.shape[0] != x.shape[0] or not cnp.PyArray_IS_C_CONTIGUOUS(labels):
        raise ValueError("labels: expected a contiguous intp array of length N")
    check_labels(labels, x.shape[1])  # O(N) beside the O(N x C) kernel: checked every call


def sce_forward(cnp.ndarray x, cnp.ndarray labels):
    """Mean softmax cross-entropy (a Python float; rows summed in order, in float64)."""
    _check_sce(x, labels)
    cdef Py_ssize_t rows = x.shape[0], cols = x.shape[1], i, B = 64
    cdef cnp.npy_intp dim = rows
    cdef cnp.ndarray loss = cnp.PyArray_EMPTY(1, &dim, cnp.PyArray_TYPE(x), 0)
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *pl = <char *>cnp.PyArray_DATA(loss)
    cdef intptr_t *lab = <intptr_t *>cnp.PyArray_DATA(labels)
    cdef Py_ssize_t nb = (rows + B - 1) // B
    cdef int nt = _threads(rows * cols, nb)
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for i in range(nb):
                if f32:
                    fa_ad_sce_rows_f32(<float *>px, lab, <float *>pl, cols, i * B, min(rows, i * B + B))
                else:
                    fa_ad_sce_rows_f64(<double *>px, lab, <double *>pl, cols, i * B,
                                       min(rows, i * B + B))
        else:
            for i in prange(nb, schedule="static", num_threads=nt):
                if f32:
                    fa_ad_sce_rows_f32(<float *>px, lab, <float *>pl, cols, i * B, min(rows, i * B + B))
                else:
                    fa_ad_sce_rows_f64(<double *>px, lab, <double *>pl, cols, i * B,
                                       min(rows, i * B + B))
    if rows == 0:
        return float("nan")
    cdef double total = 0.0
    if f32:
        for i in range(rows):
            total += (<float *>pl)[i]
    else:
        for i in range(rows):
            total += (<double *>pl)[i]
    return total / rows


def sce_backward(cnp.ndarray x, cnp.ndarray labels, double scale):
    """(scale / N) * (softmax(x) - onehot(labels)) (new array)."""
    _check_sce(x, labels)
    cdef Py_ssize_t rows = x.shape[0], cols = x.shape[1], i, B = 64
    cdef cnp.ndarray o = cnp.PyArray_EMPTY(2, x.shape, cnp.PyArray_TYPE(x), 0)
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *po = <char *>cnp.PyArray_DATA(o)
    cdef intptr_t *lab = <intptr_t *>cnp.PyArray_DATA(labels)
    cdef double s = scale / rows if rows else 0.0
    cdef Py_ssize_t nb = (rows + B - 1) // B
    cdef int nt = _threads(rows * cols, nb)
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for i in range(nb):
                if f32:
                    fa_ad_sce_grad_rows_f32(<float *>px, lab, <float *>po, cols, <float>s, i * B,
                                            min(rows, i * B + B))
                else:
                    fa_ad_sce_grad_rows_f64(<double *>px, lab, <double *>po, cols, s, i * B,
                                            min(rows, i * B + B))
        else:
            for i in prange(nb, schedule="static", num_threads=nt):
                if f32:
                    fa_ad_sce_grad_rows_f32(<float *>px, lab, <float *>po, cols, <float>s, i * B,
                                            min(rows, i * B + B))
                else:
                    fa_ad_sce_grad_rows_f64(<double *>px, lab, <double *>po, cols, s, i * B,
                                            min(rows, i * B + B))
    return o


cdef fa_conv_geom _geom(Py_ssize_t n, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w, Py_ssize_t kh,
                        Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                        Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ho, Py_ssize_t wo):
    cdef fa_conv_geom g
    g.n, g.c, g.h, g.w, g.kh, g.kw = n, c, h, w, kh, kw
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.ho, g.wo = sh, sw, ph, pw, dh, dw, ho, wo
    return g


def im2col(cnp.ndarray x, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
           Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ho,
           Py_ssize_t wo, cnp.ndarray out=None):
    """x (N, C, H, W) -> cols (N, C*kh*kw, ho*wo); see the header for the formula.

    ``out``: optional C-contiguous array of x's dtype and that shape to write into (a reused
    workspace saves the page faults of a fresh multi-megabyte allocation on every call)."""
    _check(x, "x")
    if x.ndim != 4:
        raise ValueError("x: expected a 4-D array")
    cdef fa_conv_geom g = _geom(x.shape[0], x.shape[1], x.shape[2], x.shape[3], kh, kw, sh, sw,
                                ph, pw, dh, dw, ho, wo)
    cdef cnp.npy_intp dims[3]
    dims[0] = g.n
    dims[1] = g.c * kh * kw
    dims[2] = ho * wo
    cdef cnp.ndarray cols
    if out is None:
        cols = cnp.PyArray_EMPTY(3, dims, cnp.PyArray_TYPE(x), 0)
    else:
        if cnp.PyArray_TYPE(out) != cnp.PyArray_TYPE(x) or not cnp.PyArray_IS_C_CONTIGUOUS(out) \
                or out.ndim != 3 or out.shape[0] != dims[0] or out.shape[1] != dims[1] \
                or out.shape[2] != dims[2] or not out.flags.writeable:
            raise ValueError("out: expected a writable C-contiguous array of x's dtype and "
                             f"shape ({dims[0]}, {dims[1]}, {dims[2]})")
        cols = out
    cdef bint f32 = _is_f32(x)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *pc = <char *>cnp.PyArray_DATA(cols)
    cdef Py_ssize_t r, nrows = dims[0] * dims[1]
    cdef int nt = _threads(nrows * dims[2], nrows)
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for r in range(nrows):
                if f32:
                    fa_ad_im2col_f32(<float *>px, <float *>pc, &g, r, r + 1)
                else:
                    fa_ad_im2col_f64(<double *>px, <double *>pc, &g, r, r + 1)
        else:
            for r in prange(nrows, schedule="static", num_threads=nt):
                if f32:
                    fa_ad_im2col_f32(<float *>px, <float *>pc, &g, r, r + 1)
                else:
                    fa_ad_im2col_f64(<double *>px, <double *>pc, &g, r, r + 1)
    return cols


def col2im(cnp.ndarray cols, Py_ssize_t n, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w,
           Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph,
           Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ho, Py_ssize_t wo,
           cnp.ndarray out=None):
    """The adjoint of im2col: cols (N, C*kh*kw, ho*wo) -> x (N, C, H, W) (new, or ``out``)."""
    _check(cols, "cols")
    if cols.ndim != 3 or cols.shape[0] != n or cols.shape[1] != c * kh * kw or \
            cols.shape[2] != ho * wo:
        raise ValueError("cols: expected shape (N, C*kh*kw, ho*wo)")
    cdef fa_conv_geom g = _geom(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo)
    cdef cnp.npy_intp dims[4]
    dims[0], dims[1], dims[2], dims[3] = n, c, h, w
    cdef cnp.ndarray x
    if out is None:
        x = cnp.PyArray_EMPTY(4, dims, cnp.PyArray_TYPE(cols), 0)
    else:
        if cnp.PyArray_TYPE(out) != cnp.PyArray_TYPE(cols) or \
                not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.ndim != 4 or out.shape[0] != n or \
                out.shape[1] != c or out.shape[2] != h or out.shape[3] != w or \
                not out.flags.writeable:
            raise ValueError("out: expected a writable C-contiguous array of cols' dtype and "
                             f"shape ({n}, {c}, {h}, {w})")
        x = out
    cdef bint f32 = _is_f32(cols)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *pc = <char *>cnp.PyArray_DATA(cols)
    cdef Py_ssize_t k, nplanes = n * c
    cdef int nt = _threads(cols.size, nplanes)
    with nogil:
        if nt == 1:  # no parallel region (it costs more than small work)
            for k in range(nplanes):
                if f32:
                    fa_ad_col2im_f32(<float *>pc, <float *>px, &g, k, k + 1)
                else:
                    fa_ad_col2im_f64(<double *>pc, <double *>px, &g, k, k + 1)
        else:
            for k in prange(nplanes, schedule="static", num_threads=nt):
                if f32:
                    fa_ad_col2im_f32(<float *>pc, <float *>px, &g, k, k + 1)
                else:
                    fa_ad_col2im_f64(<double *>pc, <double *>px, &g, k, k + 1)
    return x


def check_labels(cnp.ndarray labels, Py_ssize_t c, str name="labels"):
    """Raise IndexError unless every value of the contiguous intp array lies in [0, c)."""
    if cnp.PyArray_TYPE(labels) != cnp.NPY_INTP or not cnp.PyArray_IS_C_CONTIGUOUS(labels):
        raise ValueError(f"{name}: expected a contiguous intp array")
    cdef Py_ssize_t n = labels.size, i
    cdef intptr_t *p = <intptr_t *>cnp.PyArray_DATA(labels)
    cdef intptr_t lo = 0, hi = 0
    if n == 0:
        return
    lo = p[0]
    hi = p[0]
    with nogil:
        for i in range(n):
            if p[i] < lo:
                lo = p[i]
            if p[i] > hi:
                hi = p[i]
    if lo < 0 or hi >= c:
        raise IndexError(f"{name}: values must lie in [0, {c}), got [{lo}, {hi}]")
