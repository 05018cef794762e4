# cython: language_level=3
"""The weighted segment sum of embedding bags: each touched row's gradient when every id has a
scale of its own (torch's ``per_sample_weights``), without forming one gradient row per id.

``weighted_segment_sums(grad_out, source, weights, offsets, out, num_threads)``::

    out[s] = +0 + grad_out[source[j0]] * weights[j0] + ... + grad_out[source[j1-1]] * weights[j1-1]

for ``j`` in ``[offsets[s], offsets[s+1])``, added left to right, each product rounded once in
the arrays' dtype (``-ffp-contract=off``, setup.py: no FMA), so ``out[s]`` is bit for bit the
segment sum of the expanded rows ``grad_out[bag] * weight`` in the same order.  Arguments
(validated by fastadam/optim/_embedding_bag.py): ``grad_out`` (n_bags, dim) C-contiguous,
``source`` (k,) int64 bags in ``[0, n_bags)``, ``weights`` (k,) the ids' weights in the same
order, ``offsets`` (nseg + 1,) int64 non-decreasing from 0 to k, ``out`` (nseg, dim) written.
Cost O(k x dim).  Threads split the segments statically; one segment is summed by one thread,
so the result does not depend on the thread count.  Written directly in Cython (typed
pointer loops), as fastadam/sparse/_csr.pyx: a few lines, no SIMD or dispatch to share with
include/fastadam.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef extern from *:
    void __builtin_prefetch(const void *addr) nogil

ctypedef fused real:
    float
    double

DEF PREFETCH = 8  # rows ahead: the bags' rows are read in the sorted ids' (random) order


cdef inline void _sum_segment(const real *g, Py_ssize_t dim, const int64_t *source,
                              const real *weights, int64_t j0, int64_t j1, int64_t jend,
                              real *out) noexcept nogil:
    cdef Py_ssize_t i
    cdef int64_t j
    cdef real w
    cdef const real *row
    for i in range(dim):
        out[i] = 0
    for j in range(j0, j1):
        if j + PREFETCH < jend:
            __builtin_prefetch(g + source[j + PREFETCH] * dim)
        row = g + source[j] * dim
        w = weights[j]
        for i in range(dim):
            out[i] = out[i] + row[i] * w


def weighted_segment_sums(const real[:, ::1] grad_out, const int64_t[::1] source,
                          const real[::1] weights, const int64_t[::1] offsets,
                          real[:, ::1] out, int num_threads):
    cdef Py_ssize_t nseg = offsets.shape[0] - 1, dim = grad_out.shape[1], s
    cdef int64_t k = offsets[nseg]
    if nseg <= 0 or dim == 0 or k == 0:
        out[:, :] = 0
        return
    cdef const real *g = &grad_out[0, 0]
    cdef const int64_t *src = &source[0]
    cdef const real *w = &weights[0]
    cdef const int64_t *off = &offsets[0]
    cdef real *o = &out[0, 0]
    if num_threads <= 1 or nseg < 2:
        with nogil:
            for s in range(nseg):
                _sum_segment(g, dim, src, w, off[s], off[s + 1], k, o + s * dim)
        return
    with nogil:
        for s in prange(nseg, schedule="static", num_threads=num_threads):
            _sum_segment(g, dim, src, w, off[s], off[s + 1], k, o + s * dim)
