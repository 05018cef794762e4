"""Multi-tensor driver of the fused dense Adam kernels (include/fastadam/dense.h).

The tensors are cut into chunks of at most CHUNK elements (a multiple of 64 bytes for every
dtype), the chunk list is split statically over the threads, and each chunk is one kernel call.
Because every element is updated independently, the result is the same for any thread count.
Arguments arrive validated (fastadam/_validation.pyx); this module only reads their pointers.
"""
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport malloc, free

from ._validation import check_array

from fastadam._coeffs cimport fa_adam_coeffs

cnp.import_array()

cdef extern from "fastadam/dense.h":
    ctypedef unsigned short fa_half
    void fa_adam_dense_f32(float *x, const float *g, float *m, float *v, float *v_max,
                           Py_ssize_t n, const fa_adam_coeffs *c) nogil
    void fa_adam_dense_f64(double *x, const double *g, double *m, double *v, double *v_max,
                           Py_ssize_t n, const fa_adam_coeffs *c) nogil
    void fa_adam_dense_f16(fa_half *x, const fa_half *g, fa_half *m, fa_half *v,
                           fa_half *v_max, Py_ssize_t n, const fa_adam_coeffs *c) nogil
    int fa_all_finite_f32(const float *g, Py_ssize_t n, double grad_scale) nogil
    int fa_all_finite_f64(const double *g, Py_ssize_t n, double grad_scale) nogil
    int fa_all_finite_f16(const fa_half *g, Py_ssize_t n, double grad_scale) nogil
    void fa_stream_rw_f32(float *a, const float *d, float *b, float *c, Py_ssize_t n) nogil

# Elements per chunk: 32768 (128 KiB of float32 per array) keeps chunks cheap to schedule and
# large enough to amortize the call; below PARALLEL_MIN total elements the step runs serially,
# because starting a parallel region costs more than updating a small tensor.
cdef enum:
    CHUNK = 32768
    PARALLEL_MIN = 131072

FLAG_L2 = 1
FLAG_SCALE = 2
FLAG_AMSGRAD = 4
FLAG_NESTEROV = 8


cdef struct Chunk:
    char *x
    char *g
    char *m
    char *v
    char *v_max
    Py_ssize_t n


cdef inline void run_chunk(int typenum, Chunk *ch, fa_adam_coeffs *c) noexcept nogil:
    if typenum == cnp.NPY_FLOAT:
        fa_adam_dense_f32(<float *>ch.x, <const float *>ch.g, <float *>ch.m, <float *>ch.v,
                          <float *>ch.v_max, ch.n, c)
    elif typenum == cnp.NPY_DOUBLE:
        fa_adam_dense_f64(<double *>ch.x, <const double *>ch.g, <double *>ch.m, <double *>ch.v,
                          <double *>ch.v_max, ch.n, c)
    else:
        fa_adam_dense_f16(<fa_half *>ch.x, <const fa_half *>ch.g, <fa_half *>ch.m,
                          <fa_half *>ch.v, <fa_half *>ch.v_max, ch.n, c)


cdef inline int chunk_finite(int typenum, Chunk *ch, double grad_scale) noexcept nogil:
    if typenum == cnp.NPY_FLOAT:
        return fa_all_finite_f32(<const float *>ch.g, ch.n, grad_scale)
    elif typenum == cnp.NPY_DOUBLE:
        return fa_all_finite_f64(<const double *>ch.g, ch.n, grad_scale)
    return fa_all_finite_f16(<const fa_half *>ch.g, ch.n, grad_scale)


def adam_dense(list xs, list gs, list ms, list vs, vmaxs, int typenum, double alpha,
               double denom_scale, double eps, double beta1, double beta2, double sign,
               double grad_scale, double l2, double decay_mul, double post_mul, int flags,
               bint skip_nonfinite, int num_threads):
    """One Adam step over validated tensors; returns False if skipped for non-finite g."""
    cdef fa_adam_coeffs c
    c.alpha = alpha
    c.denom_scale = denom_scale
    c.eps = eps
    c.beta1 = beta1
    c.beta2 = beta2
    c.sign = sign
    c.grad_scale = grad_scale
    c.l2 = l2
    c.decay_mul = decay_mul
    c.post_mul = post_mul
    c.flags = flags
    cdef Py_ssize_t ntensors = len(xs), nchunks = 0, total = 0, i, k, size, start, step
    cdef bint amsgrad = (flags & FLAG_AMSGRAD) != 0
    cdef cnp.ndarray a
    for i in range(ntensors):
        a = <cnp.ndarray>xs[i]
        size = cnp.PyArray_SIZE(a)
        total += size
        nchunks += (size + CHUNK - 1) // CHUNK
    if nchunks == 0:
        return True
    cdef Chunk *chunks = <Chunk *>malloc(nchunks * sizeof(Chunk))
    if chunks == NULL:
        raise MemoryError()
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(<cnp.ndarray>xs[0])
    cdef char *px
    cdef char *pg
    cdef char *pm
    cdef char *pv
    cdef char *pvm
    cdef int nt = num_threads, nbad = 0
    k = 0
    for i in range(ntensors):
        a = <cnp.ndarray>xs[i]
        size = cnp.PyArray_SIZE(a)
        px = <char *>cnp.PyArray_DATA(a)
        pg = <char *>cnp.PyArray_DATA(<cnp.ndarray>gs[i])
        pm = <char *>cnp.PyArray_DATA(<cnp.ndarray>ms[i])
        pv = <char *>cnp.PyArray_DATA(<cnp.ndarray>vs[i])
        pvm = <char *>cnp.PyArray_DATA(<cnp.ndarray>vmaxs[i]) if amsgrad else NULL
        start = 0
        while start < size:
            step = min(CHUNK, size - start)
            chunks[k].x = px + start * itemsize
            chunks[k].g = pg + start * itemsize
            chunks[k].m = pm + start * itemsize
            chunks[k].v = pv + start * itemsize
            chunks[k].v_max = pvm + start * itemsize if amsgrad else NULL
            chunks[k].n = step
            start += step
            k += 1
    if total < PARALLEL_MIN or nt > nchunks:
        nt = 1 if total < PARALLEL_MIN else <int>nchunks
    try:
        with nogil:
            if skip_nonfinite:
                if nt == 1:
                    for k in range(nchunks):
                        if not chunk_finite(typenum, &chunks[k], grad_scale):
                            nbad = 1
                            break
                else:
                    for k in prange(nchunks, schedule="static", num_threads=nt):
                        nbad += 1 - chunk_finite(typenum, &chunks[k], grad_scale)
            if nbad == 0:
                if nt == 1:
                    for k in range(nchunks):
                        run_chunk(typenum, &chunks[k], &c)
                else:
                    for k in prange(nchunks, schedule="static", num_threads=nt):
                        run_chunk(typenum, &chunks[k], &c)
    finally:
        free(chunks)
    return nbad == 0


def stream_rw_f32(cnp.ndarray a, cnp.ndarray d, cnp.ndarray b, cnp.ndarray c, int num_threads=1):
    """Bandwidth yardstick (benchmarks only): read a, d, b, c and write a, b, c -- the traffic of
    a float32 Adam step -- cut into the same chunks and run on the same number of threads as
    adam_dense would be (serially below PARALLEL_MIN elements).  float32, C-contiguous, equal
    shapes, a/b/c writable."""
    for name, arr in (("a", a), ("d", d), ("b", b), ("c", c)):
        check_array(arr, name, cnp.NPY_FLOAT, (<object>a).shape, name != "d")
    cdef Py_ssize_t n = cnp.PyArray_SIZE(a), nchunks = (n + CHUNK - 1) // CHUNK, k, start
    cdef float *pa = <float *>cnp.PyArray_DATA(a)
    cdef float *pd = <float *>cnp.PyArray_DATA(d)
    cdef float *pb = <float *>cnp.PyArray_DATA(b)
    cdef float *pc = <float *>cnp.PyArray_DATA(c)
    cdef int nt = 1 if n < PARALLEL_MIN else min(num_threads, <int>nchunks)
    with nogil:
        if nt == 1:
            for k in range(nchunks):
                start = k * CHUNK
                fa_stream_rw_f32(pa + start, pd + start, pb + start, pc + start,
                                 min(CHUNK, n - start))
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                start = k * CHUNK
                fa_stream_rw_f32(pa + start, pd + start, pb + start, pc + start,
                                 min(CHUNK, n - start))
