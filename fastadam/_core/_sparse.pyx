"""Driver of the sparse kernels (include/fastadam/sparse.h), for every optimizer.

``sort_segments`` runs the stable radix sort; ``segment_sum`` and ``sparse_step`` then split
the work statically over the threads of one parallel region: segments for the segment sum and
the lazy / catchup modes (cut so that each thread gets about the same number of gradient rows),
table rows for the dense mode (chunks of about CHUNK elements).  A segment is always summed by
one thread in its original order, so results are bit-identical for any thread count.
Arguments arrive validated (fastadam/optim/_sparse_functional.py, fastadam/sparse/_segments.py); this module only reads their pointers.
"""
import threading

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, threadid
from libc.stdint cimport int32_t, int64_t, uint64_t

from fastadam._core._coeffs cimport Coefficients
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

from fastadam._core._cpu_level import LEVEL_IN_USE

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from "fastadam/sparse.h":
    int FA_RADIX_BITS
    int FA_RADIX_MAX_PASSES
    void fa_pack_keys_i32(const int32_t *indices, Py_ssize_t k, uint64_t *a) nogil
    void fa_pack_keys_i64(const int64_t *indices, Py_ssize_t k, uint64_t *a) nogil
    Py_ssize_t fa_sort_segments(uint64_t *a, uint64_t *b, Py_ssize_t k, int key_bits,
                                Py_ssize_t *hist, int64_t *perm, int64_t *rows,
                                int64_t *offsets) nogil
    void fa_segment_sum_f32(const float *values, Py_ssize_t row_size, const int64_t *perm,
                            const int64_t *offsets, Py_ssize_t s0, Py_ssize_t s1,
                            float *out) nogil
    void fa_segment_sum_f64(const double *values, Py_ssize_t row_size, const int64_t *perm,
                            const int64_t *offsets, Py_ssize_t s0, Py_ssize_t s1,
                            double *out) nogil
    void fa_segment_of(const int64_t *perm, const int64_t *offsets, Py_ssize_t nseg,
                       int64_t *seg_of) nogil
    void fa_segment_sum_ordered_f32(const float *values, Py_ssize_t row_size,
                                    const int64_t *seg_of, Py_ssize_t k, Py_ssize_t s0,
                                    Py_ssize_t s1, float *out) nogil
    void fa_segment_sum_ordered_f64(const double *values, Py_ssize_t row_size,
                                    const int64_t *seg_of, Py_ssize_t k, Py_ssize_t s0,
                                    Py_ssize_t s1, double *out) nogil
    int fa_sparse_rows_f32(int kind, const void *coeffs, float *x, float *st0, float *st1,
                            Py_ssize_t row_size, const Py_ssize_t *stride,
                            const float *values, const int64_t *perm,
                            const int64_t *offsets, const int64_t *rows, Py_ssize_t s0,
                            Py_ssize_t s1, float *gbuf, int64_t *last_step, int64_t t) nogil
    int fa_sparse_rows_f64(int kind, const void *coeffs, double *x, double *st0, double *st1,
                            Py_ssize_t row_size, const Py_ssize_t *stride,
                            const double *values, const int64_t *perm,
                            const int64_t *offsets, const int64_t *rows, Py_ssize_t s0,
                            Py_ssize_t s1, double *gbuf, int64_t *last_step, int64_t t) nogil
    int fa_sparse_dense_f32(int kind, const void *coeffs, float *x, float *st0, float *st1,
                             Py_ssize_t row_size, const Py_ssize_t *stride,
                             const float *values, const int64_t *perm,
                             const int64_t *offsets, const int64_t *rows, Py_ssize_t nseg,
                             Py_ssize_t r0, Py_ssize_t r1, float *gbuf) nogil
    int fa_sparse_dense_f64(int kind, const void *coeffs, double *x, double *st0, double *st1,
                             Py_ssize_t row_size, const Py_ssize_t *stride,
                             const double *values, const int64_t *perm,
                             const int64_t *offsets, const int64_t *rows, Py_ssize_t nseg,
                             Py_ssize_t r0, Py_ssize_t r1, double *gbuf) nogil

# Elements per dense-mode chunk (as in _dense.pyx), and the work (elements of gradient rows, or
# of table rows in dense mode) below which one thread does everything: starting a parallel
# region costs more than that much arithmetic.
cdef enum:
    CHUNK = 32768
    PARALLEL_MIN = 131072
    PAD = 16  # scratch rows are padded to 64 bytes of float32 so threads share no cache line

# Gradient rows per segment from which segment_sum reads the rows in their original order
# (perm must then be a permutation of the rows, as sort_segments gives it); the lazy and
# catchup steps sum such segments first (fastadam/optim/_sparse_functional.py).  With fewer
# repeats the walk's gather through perm is cheaper than writing and reading the sums.
ORDERED_MIN_RATIO = 2

PARALLEL_MIN_WORK = PARALLEL_MIN  # for the measured thread choice (fastadam/_core/_threads.py)
MODES = {"lazy": 0, "dense": 1, "catchup": 2}
# The packed sort holds an index and a position in 32 bits each.
PACKED_LIMIT = 1 << 32


# Per-thread scratch buffers of the sort, kept between calls: a fresh 512 KiB buffer costs a
# page fault per 4 KiB page on every call (glibc returns freed blocks of that size to the OS),
# which was more than the sort itself.  Each holds as much as the largest batch seen so far, up
# to SCRATCH_MAX items (8 MiB per buffer); larger batches get fresh buffers (NumPy backs those
# with huge pages, so they fault far less per byte).
_workspace = threading.local()
SCRATCH_MAX = 1 << 20


cdef cnp.ndarray scratch(str name, Py_ssize_t n, object dtype):
    """A length-n view of this thread's cached buffer `name` (grown when too small)."""
    if n > SCRATCH_MAX:
        return np.empty(n, dtype=dtype)
    cdef cnp.ndarray buf = getattr(_workspace, name, None)
    if buf is None or buf.shape[0] < n:
        buf = np.empty(max(n, 4096), dtype=dtype)
        setattr(_workspace, name, buf)
    return buf[:n]


def sort_segments(cnp.ndarray indices, n_rows):
    """Stable sort of validated indices (int32 or int64, 1-D, contiguous, in [0, n_rows)).

    Returns (perm, rows, offsets), int64: see fa_sort_segments.  They are views of this
    thread's scratch buffers, valid until its next call: copy what must outlive the step.
    Falls back to NumPy's stable argsort when an index or a position does not fit in 32 bits
    (tables of over 2^32 rows).
    """
    cdef Py_ssize_t k = indices.shape[0]
    if k >= PACKED_LIMIT or n_rows > PACKED_LIMIT:  # n_rows is a Python int: no overflow
        return _sort_segments_numpy(indices)
    cdef int key_bits = int(max(n_rows - 1, 0)).bit_length()
    cdef cnp.ndarray a = scratch("a", k, np.uint64)
    cdef cnp.ndarray b = scratch("b", k, np.uint64)
    cdef cnp.ndarray hist = scratch("hist", FA_RADIX_MAX_PASSES << FA_RADIX_BITS, np.intp)
    cdef cnp.ndarray perm = scratch("perm", k, np.int64)
    cdef cnp.ndarray rows = scratch("rows", k, np.int64)
    cdef cnp.ndarray offsets = scratch("offsets", k + 1, np.int64)
    cdef int typenum = cnp.PyArray_TYPE(indices)
    cdef void *pi = cnp.PyArray_DATA(indices)
    cdef uint64_t *pa = <uint64_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t nseg
    with nogil:
        if typenum == cnp.NPY_INT32:
            fa_pack_keys_i32(<const int32_t *>pi, k, pa)
        else:
            fa_pack_keys_i64(<const int64_t *>pi, k, pa)
        nseg = fa_sort_segments(pa, <uint64_t *>cnp.PyArray_DATA(b), k, key_bits,
                                <Py_ssize_t *>cnp.PyArray_DATA(hist),
                                <int64_t *>cnp.PyArray_DATA(perm),
                                <int64_t *>cnp.PyArray_DATA(rows),
                                <int64_t *>cnp.PyArray_DATA(offsets))
    return perm, rows[:nseg], offsets[:nseg + 1]


def copy_increasing(cnp.ndarray indices):
    """(copy, at): an int64 copy of validated 1-D contiguous int32/int64 indices, and the first
    position at that does not strictly increase (-1 when they all do), found in the same pass.
    The sparse steps' check of ``indices_sorted_unique=True``."""
    cdef Py_ssize_t k = indices.shape[0], j, at = -1
    cdef cnp.ndarray out = np.empty(k, dtype=np.int64)
    cdef int64_t *po = <int64_t *>cnp.PyArray_DATA(out)
    cdef const int32_t *p32 = <const int32_t *>cnp.PyArray_DATA(indices)
    cdef const int64_t *p64 = <const int64_t *>cnp.PyArray_DATA(indices)
    cdef bint wide = cnp.PyArray_TYPE(indices) != cnp.NPY_INT32
    with nogil:
        for j in range(k):
            po[j] = p64[j] if wide else p32[j]
        for j in range(1, k):
            if po[j] <= po[j - 1]:
                at = j
                break
    return out, at


def _sort_segments_numpy(indices):
    perm = np.argsort(indices, kind="stable").astype(np.int64, copy=False)
    keys = indices[perm].astype(np.int64, copy=False)
    starts = (np.flatnonzero(np.r_[True, keys[1:] != keys[:keys.shape[0] - 1]])
              if keys.size else keys[:0])
    offsets = np.r_[starts, keys.size].astype(np.int64)
    return perm, keys[starts], offsets


cdef cnp.ndarray balanced_bounds(cnp.ndarray offsets, int parts):
    """Segment boundaries giving each of `parts` ranges about the same number of rows."""
    cdef Py_ssize_t k = offsets[offsets.shape[0] - 1]
    targets = (np.arange(parts + 1, dtype=np.int64) * k) // parts
    bounds = np.searchsorted(offsets, targets, side="left").astype(np.int64)
    bounds[0] = 0
    bounds[parts] = offsets.shape[0] - 1
    return bounds


def segment_sum(cnp.ndarray values, cnp.ndarray perm, cnp.ndarray offsets, int num_threads):
    """Sums of the segments of a contiguous float32/float64 (k, row_size) array.

    With repeated indices (k >= ORDERED_MIN_RATIO * nseg) the gradient rows are read in their
    original order (fa_segment_sum_ordered: a stream, plus random visits to the fewer sums);
    otherwise each segment gathers its rows through perm (fa_segment_sum).  Both add the rows of
    a segment in the same order, so the choice never changes a bit."""
    cdef Py_ssize_t k = values.shape[0], nseg = offsets.shape[0] - 1, p
    cdef Py_ssize_t row_size = values.shape[1]
    cdef int typenum = cnp.PyArray_TYPE(values)
    cdef cnp.ndarray out = np.empty((nseg, row_size), dtype=values.dtype)
    cdef int nt = num_threads
    if k * row_size < PARALLEL_MIN or nseg < 2:
        nt = 1
    cdef cnp.ndarray bounds_arr = balanced_bounds(offsets, nt)
    cdef int64_t *bounds = <int64_t *>cnp.PyArray_DATA(bounds_arr)
    cdef void *pv = cnp.PyArray_DATA(values)
    cdef void *po = cnp.PyArray_DATA(out)
    cdef const int64_t *pperm = <const int64_t *>cnp.PyArray_DATA(perm)
    cdef const int64_t *poff = <const int64_t *>cnp.PyArray_DATA(offsets)
    cdef bint ordered = k >= ORDERED_MIN_RATIO * nseg and row_size > 0
    cdef cnp.ndarray seg_of_arr
    cdef int64_t *seg_of = NULL
    if ordered:
        seg_of_arr = scratch("seg_of", k, np.int64)
        seg_of = <int64_t *>cnp.PyArray_DATA(seg_of_arr)
    with nogil:
        if ordered:
            fa_segment_of(pperm, poff, nseg, seg_of)
        if nt == 1:
            _segment_sum_part(typenum, pv, row_size, pperm, poff, seg_of, k, 0, nseg, po)
        else:
            for p in prange(nt, schedule="static", num_threads=nt):
                _segment_sum_part(typenum, pv, row_size, pperm, poff, seg_of, k, bounds[p],
                                  bounds[p + 1], po)
    return out


cdef inline void _segment_sum_part(int typenum, void *values, Py_ssize_t row_size,
                                   const int64_t *perm, const int64_t *offsets,
                                   const int64_t *seg_of, Py_ssize_t k, Py_ssize_t s0,
                                   Py_ssize_t s1, void *out) noexcept nogil:
    """Segments [s0, s1): read in original order when seg_of is given, else gathered."""
    if seg_of != NULL:
        if typenum == cnp.NPY_FLOAT:
            fa_segment_sum_ordered_f32(<const float *>values, row_size, seg_of, k, s0, s1,
                                       <float *>out)
        else:
            fa_segment_sum_ordered_f64(<const double *>values, row_size, seg_of, k, s0, s1,
                                       <double *>out)
    elif typenum == cnp.NPY_FLOAT:
        fa_segment_sum_f32(<const float *>values, row_size, perm, offsets, s0, s1,
                           <float *>out)
    else:
        fa_segment_sum_f64(<const double *>values, row_size, perm, offsets, s0, s1,
                           <double *>out)


cdef struct Job:
    int typenum
    int mode
    int kind
    const void *coeffs
    char *x
    char *st0
    char *st1
    char *values
    char *gbuf
    const int64_t *perm
    const int64_t *offsets
    const int64_t *rows
    int64_t *last_step
    int64_t t
    Py_ssize_t row_size
    Py_ssize_t stride[3]  # row strides of x, st0, st1, in elements
    Py_ssize_t gbuf_stride
    Py_ssize_t nseg


cdef inline int run_part(Job *j, Py_ssize_t a, Py_ssize_t b, int tid) noexcept nogil:
    """Lazy / catchup: segments [a, b); dense: table rows [a, b).  tid picks the scratch row.
    Returns the kernel's status (0, or FA_ERR_UNSUPPORTED before any write)."""
    cdef Py_ssize_t itemsize = 4 if j.typenum == cnp.NPY_FLOAT else 8
    cdef char *gbuf = j.gbuf + tid * j.gbuf_stride * itemsize
    if j.typenum == cnp.NPY_FLOAT:
        if j.mode == 1:
            return fa_sparse_dense_f32(j.kind, j.coeffs, <float *>j.x, <float *>j.st0, <float *>j.st1,
                                j.row_size, j.stride, <const float *>j.values, j.perm,
                                j.offsets, j.rows, j.nseg, a, b, <float *>gbuf)
        else:
            return fa_sparse_rows_f32(j.kind, j.coeffs, <float *>j.x, <float *>j.st0, <float *>j.st1,
                               j.row_size, j.stride, <const float *>j.values, j.perm,
                               j.offsets, j.rows, a, b, <float *>gbuf, j.last_step, j.t)
    else:
        if j.mode == 1:
            return fa_sparse_dense_f64(j.kind, j.coeffs, <double *>j.x, <double *>j.st0,
                                <double *>j.st1, j.row_size, j.stride,
                                <const double *>j.values, j.perm, j.offsets, j.rows, j.nseg,
                                a, b, <double *>gbuf)
        else:
            return fa_sparse_rows_f64(j.kind, j.coeffs, <double *>j.x, <double *>j.st0,
                               <double *>j.st1, j.row_size, j.stride,
                               <const double *>j.values, j.perm, j.offsets, j.rows, a, b,
                               <double *>gbuf, j.last_step, j.t)


def sparse_step(Coefficients coeffs, cnp.ndarray x, list slots, cnp.ndarray values,
                cnp.ndarray perm, cnp.ndarray rows, cnp.ndarray offsets, str mode, last_step,
                long long t, int num_threads):
    """One sparse step of the optimizer `coeffs` describes, on validated (n_rows, row_size)
    x and state slots (1 or 2 arrays like x) and (k, row_size) values.  The rows of x and of
    the slots are contiguous; their row strides may exceed row_size (blocks of a wider table,
    checked by the caller)."""
    cdef Job j
    j.typenum = cnp.PyArray_TYPE(x)
    j.mode = MODES[mode]
    j.kind = coeffs.kind
    j.coeffs = coeffs.data
    j.x = <char *>cnp.PyArray_DATA(x)
    j.st0 = <char *>cnp.PyArray_DATA(<cnp.ndarray>slots[0])
    j.st1 = <char *>cnp.PyArray_DATA(<cnp.ndarray>slots[1]) if len(slots) > 1 else NULL
    j.values = <char *>cnp.PyArray_DATA(values)
    j.perm = <const int64_t *>cnp.PyArray_DATA(perm)
    j.offsets = <const int64_t *>cnp.PyArray_DATA(offsets)
    j.rows = <const int64_t *>cnp.PyArray_DATA(rows)
    j.last_step = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>last_step) if j.mode == 2 else NULL
    j.t = t
    j.row_size = x.shape[1]
    cdef Py_ssize_t itemsize = x.itemsize, q
    for q, table in enumerate([x] + slots):
        j.stride[q] = (<cnp.ndarray>table).strides[0] // itemsize
    if len(slots) < 2:
        j.stride[2] = j.row_size
    j.nseg = rows.shape[0]
    cdef Py_ssize_t n_rows = x.shape[0], k = values.shape[0], nparts, p, rows_per_chunk
    cdef int nt = num_threads
    if j.mode == 1:
        rows_per_chunk = max(1, CHUNK // max(j.row_size, 1))
        nparts = (n_rows + rows_per_chunk - 1) // rows_per_chunk
        if n_rows * j.row_size < PARALLEL_MIN or nparts < 2:
            nt = 1
        nt = min(nt, max(nparts, 1))
    else:
        rows_per_chunk = 0
        if k * j.row_size < PARALLEL_MIN or j.nseg < 2:
            nt = 1
        nparts = nt
    if (j.mode != 1 and j.nseg == 0) or n_rows == 0 or j.row_size == 0:
        return
    j.gbuf_stride = (j.row_size + PAD - 1) // PAD * PAD
    cdef cnp.ndarray gbuf = np.empty(nt * j.gbuf_stride + PAD, dtype=x.dtype)
    j.gbuf = <char *>cnp.PyArray_DATA(gbuf)
    cdef cnp.ndarray bounds_arr
    cdef int64_t *bounds = NULL
    if j.mode != 1:
        bounds_arr = balanced_bounds(offsets, nt)
        bounds = <int64_t *>cnp.PyArray_DATA(bounds_arr)
    cdef int nbad = 0
    with nogil:
        if nt == 1:
            nbad = run_part(&j, 0, n_rows if j.mode == 1 else j.nseg, 0) != 0
        elif j.mode == 1:
            for p in prange(nparts, schedule="static", num_threads=nt):
                nbad += run_part(&j, p * rows_per_chunk, min((p + 1) * rows_per_chunk, n_rows),
                                 threadid()) != 0
        else:
            for p in prange(nparts, schedule="static", num_threads=nt):
                nbad += run_part(&j, bounds[p], bounds[p + 1], threadid()) != 0
    if nbad:  # decided from the kind and flags before any write: nothing changed
        raise ValueError(f"the sparse step has no kernel for optimizer kind {j.kind} with "
                         f"flags {coeffs.flags}: this (optimizer, options) pair is not in the "
                         f"sparse registration list (include/fastadam/optimizers.def)")
