"""The one multi-tensor driver of every dense optimizer step (include/fastadam/dense.h).

The tensors are cut into chunks of at most CHUNK elements (a multiple of 64 bytes for every
dtype), the chunk list is split statically over the threads, and each chunk is one kernel
call.  The kernel is picked once per call from the C table by the coefficient object's kind
(Adam, Adagrad, Momentum) and the dtype; this module knows no optimizer.  Because every element
is updated independently, the result is the same for any thread count.  Arguments arrive
validated (fastadam/_core/_validation.pyx); this module only reads their pointers.
"""
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport malloc, free

from fastadam._core._coeffs cimport Coefficients
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

from fastadam._core._cpu_level import LEVEL_IN_USE

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from "fastadam/dense.h":
    enum:
        FA_F16
        FA_F32
        FA_F64
    ctypedef void (*fa_dense_fn)(void *x, const void *g, void *s0, void *s1, void *s2,
                                 Py_ssize_t n, const void *coeffs) noexcept nogil
    fa_dense_fn fa_dense_kernel(int kind, int dtype) nogil
    int fa_all_finite(int dtype, const void *g, Py_ssize_t n, double grad_scale) nogil
    int fa_registry_count()
    const char *fa_registry_name(int kind)
    size_t fa_registry_coeffs_size(int kind)
    int fa_registry_nslots(int kind, int flags)
    int fa_dense_supported(int kind, int flags)
    int fa_sparse_supported(int kind, int flags)
    int fa_registry_rowwise(int kind)
    int fa_rowwise_supported(int kind, int flags, int sparse)
    int fa_rowwise_dense_f32(int kind, const void *coeffs, float *x, const float *g, float *a,
                             Py_ssize_t n_rows, Py_ssize_t row_size) nogil
    int fa_rowwise_dense_f64(int kind, const void *coeffs, double *x, const double *g,
                             double *a, Py_ssize_t n_rows, Py_ssize_t row_size) nogil

# Elements per chunk: 32768 (128 KiB of float32 per array) keeps chunks cheap to schedule and
# large enough to amortize the call; below PARALLEL_MIN total elements the step runs serially,
# because starting a parallel region costs more than updating a small tensor.
cdef enum:
    CHUNK = 32768
    _PARALLEL_MIN = 131072
    MAX_SLOTS = 3

PARALLEL_MIN = _PARALLEL_MIN  # for fastadam/_core/_threads.py's adaptive choice

# num_threads=0 (the user's None): steps per size class (bit length of the element count) that
# the measured choice (fastadam/_core/_threads.py) lets run on one thread, untimed, before it wants
# to look again; at zero dense_step returns None without writing and the chooser runs it.
cdef int _serial_left[65]


def set_serial_left(int key, int steps):
    """Let the next ``steps`` steps of size class ``key`` run on one thread without asking."""
    if not 0 <= key <= 64:
        raise ValueError(f"key: expected a size class 0..64, got {key}")
    _serial_left[key] = max(steps, 0)


cdef struct Chunk:
    char *x
    char *g
    char *s[MAX_SLOTS]
    Py_ssize_t n


cdef int storage_type(int typenum) except -1:
    if typenum == cnp.NPY_FLOAT:
        return FA_F32
    if typenum == cnp.NPY_DOUBLE:
        return FA_F64
    if typenum == cnp.NPY_FLOAT16:
        return FA_F16
    raise TypeError(f"no dense kernel for dtype {cnp.PyArray_DescrFromType(typenum)}")


def registry():
    """The optimizers of include/fastadam/optimizers.def, in kind order: one dict per kind with
    its ``name``, ``kind`` and the size in bytes of its coefficient struct (``coeffs_size``)."""
    return [dict(name=fa_registry_name(k).decode(), kind=k,
                 coeffs_size=fa_registry_coeffs_size(k), rowwise=bool(fa_registry_rowwise(k)))
            for k in range(fa_registry_count())]


def rowwise_supported(int kind, int flags, bint sparse):
    """True if row-wise optimizer ``kind`` takes ``flags`` in its dense kernel (``sparse``
    False) or in the sparse row walk (True); False for any other kind."""
    return bool(fa_rowwise_supported(kind, flags, sparse))


def nslots(int kind, int flags):
    """State slots optimizer ``kind`` uses with ``flags`` (-1: no such kind)."""
    return fa_registry_nslots(kind, flags)


def dense_supported(int kind, int flags):
    """True if the dense kernels of optimizer ``kind`` take ``flags``."""
    return bool(fa_dense_supported(kind, flags))


def sparse_supported(int kind, int flags):
    """True if the sparse row walk has optimizer ``kind`` with ``flags``."""
    return bool(fa_sparse_supported(kind, flags))


cpdef object dense_step(Coefficients coeffs, list xs, list gs, list slots, int typenum,
                        bint skip_nonfinite, int num_threads):
    """One step of the optimizer `coeffs` describes over validated tensors.

    slots: the optimizer's state lists in slot order, as many as it uses with these flags
    (fa_registry_nslots), each like xs.  Flags the registration list does not give the dense
    kernels raise ValueError before anything is written.
    Returns False (nothing written) if skip_nonfinite found a non-finite gradient.
    """
    if not fa_dense_supported(coeffs.kind, coeffs.flags):
        raise ValueError(f"the dense step has no kernel for optimizer kind {coeffs.kind} with "
                         f"flags {coeffs.flags} (include/fastadam/optimizers.def)")
    cdef int dtype = storage_type(typenum)
    if skip_nonfinite and fa_all_finite(dtype, NULL, 0, 1.0) < 0:
        raise TypeError(f"dtype {cnp.PyArray_DescrFromType(typenum)}: this build of fastadam "
                        f"has no non-finite check for it")
    cdef fa_dense_fn kernel = fa_dense_kernel(coeffs.kind, dtype)
    if kernel == NULL:
        raise TypeError(f"dtype {cnp.PyArray_DescrFromType(typenum)}: this build of fastadam "
                        f"has no kernel for it (float16 needs a compiler with _Float16)")
    cdef Py_ssize_t nslots = len(slots)
    if nslots != fa_registry_nslots(coeffs.kind, coeffs.flags):
        raise ValueError(f"slots: expected {fa_registry_nslots(coeffs.kind, coeffs.flags)} "
                         f"state lists for these options, got {nslots}")
    cdef Py_ssize_t ntensors = len(xs), nchunks = 0, total = 0, i, k, q, size, start, step
    cdef cnp.ndarray a
    for i in range(ntensors):
        size = cnp.PyArray_SIZE(<cnp.ndarray>xs[i])
        total += size
        nchunks += (size + CHUNK - 1) // CHUNK
    if nchunks == 0:
        return True
    cdef int key = 0
    if num_threads == 0:  # the measured choice: serial below PARALLEL_MIN or while allowed
        if total >= _PARALLEL_MIN:
            size = total
            while size:
                key += 1
                size >>= 1
            if _serial_left[key] <= 0:
                return None  # nothing written: fastadam/_core/_threads.py measures this step
            _serial_left[key] -= 1
        num_threads = 1
    cdef Chunk *chunks = <Chunk *>malloc(nchunks * sizeof(Chunk))
    if chunks == NULL:
        raise MemoryError()
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(<cnp.ndarray>xs[0])
    cdef char *px
    cdef char *pg
    cdef char *ps[MAX_SLOTS]
    cdef const void *c = coeffs.data
    cdef double grad_scale = coeffs.grad_scale
    cdef int nt = num_threads, nbad = 0
    k = 0
    for i in range(ntensors):
        a = <cnp.ndarray>xs[i]
        size = cnp.PyArray_SIZE(a)
        px = <char *>cnp.PyArray_DATA(a)
        pg = <char *>cnp.PyArray_DATA(<cnp.ndarray>gs[i])
        for q in range(MAX_SLOTS):
            ps[q] = <char *>cnp.PyArray_DATA(<cnp.ndarray>(<list>slots[q])[i]) if q < nslots else NULL
        start = 0
        while start < size:
            step = min(CHUNK, size - start)
            chunks[k].x = px + start * itemsize
            chunks[k].g = pg + start * itemsize
            for q in range(MAX_SLOTS):
                chunks[k].s[q] = ps[q] + start * itemsize if ps[q] != NULL else NULL
            chunks[k].n = step
            start += step
            k += 1
    if total < _PARALLEL_MIN or nt > nchunks:
        nt = 1 if total < _PARALLEL_MIN else <int>nchunks
    try:
        with nogil:
            if skip_nonfinite:
                if nt == 1:
                    for k in range(nchunks):
                        if fa_all_finite(dtype, chunks[k].g, chunks[k].n, grad_scale) != 1:
                            nbad = 1
                            break
                else:
                    for k in prange(nchunks, schedule="static", num_threads=nt):
                        nbad += fa_all_finite(dtype, chunks[k].g, chunks[k].n, grad_scale) != 1
            if nbad == 0:
                if nt == 1:
                    for k in range(nchunks):
                        kernel(chunks[k].x, chunks[k].g, chunks[k].s[0], chunks[k].s[1],
                               chunks[k].s[2], chunks[k].n, c)
                else:
                    for k in prange(nchunks, schedule="static", num_threads=nt):
                        kernel(chunks[k].x, chunks[k].g, chunks[k].s[0], chunks[k].s[1],
                               chunks[k].s[2], chunks[k].n, c)
    finally:
        free(chunks)
    return nbad == 0


cdef struct RowChunk:
    char *x
    char *g
    char *a
    Py_ssize_t n_rows
    Py_ssize_t row_size


def rowwise_step(Coefficients coeffs, list xs, list gs, list accs, int typenum,
                 bint skip_nonfinite, int num_threads):
    """One dense step of a row-wise optimizer (fa_rowwise_dense, include/fastadam/dense.h)
    over validated float32/float64 tensors: ``xs[i]``, ``gs[i]`` C-contiguous of one shape,
    ``accs[i]`` C-contiguous with one value per row (rows: the first axis; a 0-d tensor is one
    row).  Each tensor is cut into chunks of whole rows (about CHUNK elements), split
    statically over ``num_threads`` (>= 1) threads; a row is always computed alike, so the
    result does not depend on the split.  Flags the registration list does not give the
    kernel raise ValueError before anything is written.  Returns False (nothing written) if
    ``skip_nonfinite`` found a non-finite gradient."""
    if not fa_rowwise_supported(coeffs.kind, coeffs.flags, 0):
        raise ValueError(f"the row-wise dense step has no kernel for optimizer kind "
                         f"{coeffs.kind} with flags {coeffs.flags} "
                         f"(include/fastadam/optimizers.def)")
    cdef int dtype
    if typenum == cnp.NPY_FLOAT:
        dtype = FA_F32
    elif typenum == cnp.NPY_DOUBLE:
        dtype = FA_F64
    else:
        raise TypeError(f"no row-wise kernel for dtype {cnp.PyArray_DescrFromType(typenum)}")
    cdef Py_ssize_t ntensors = len(xs), nchunks = 0, total = 0, i, k, n_rows, row_size, r, per
    cdef cnp.ndarray a
    for i in range(ntensors):
        a = <cnp.ndarray>xs[i]
        n_rows = a.shape[0] if a.ndim else 1
        row_size = cnp.PyArray_SIZE(a) // n_rows if n_rows else 0
        if n_rows and row_size:
            per = max(1, CHUNK // row_size)
            nchunks += (n_rows + per - 1) // per
            total += n_rows * row_size
    if nchunks == 0:
        return True
    cdef RowChunk *chunks = <RowChunk *>malloc(nchunks * sizeof(RowChunk))
    if chunks == NULL:
        raise MemoryError()
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(<cnp.ndarray>xs[0])
    cdef char *px
    cdef char *pg
    cdef char *pa
    k = 0
    for i in range(ntensors):
        a = <cnp.ndarray>xs[i]
        n_rows = a.shape[0] if a.ndim else 1
        row_size = cnp.PyArray_SIZE(a) // n_rows if n_rows else 0
        if not (n_rows and row_size):
            continue
        per = max(1, CHUNK // row_size)
        px = <char *>cnp.PyArray_DATA(a)
        pg = <char *>cnp.PyArray_DATA(<cnp.ndarray>gs[i])
        pa = <char *>cnp.PyArray_DATA(<cnp.ndarray>accs[i])
        r = 0
        while r < n_rows:
            chunks[k].x = px + r * row_size * itemsize
            chunks[k].g = pg + r * row_size * itemsize
            chunks[k].a = pa + r * itemsize
            chunks[k].n_rows = min(per, n_rows - r)
            chunks[k].row_size = row_size
            r += per
            k += 1
    cdef int nt = num_threads, nbad = 0, nerr = 0, kind = coeffs.kind
    cdef const void *c = coeffs.data
    cdef double grad_scale = coeffs.grad_scale
    if total < _PARALLEL_MIN or nt < 1:
        nt = 1
    if nt > nchunks:
        nt = <int>nchunks
    try:
        with nogil:
            if skip_nonfinite:
                for k in range(nchunks):
                    if fa_all_finite(dtype, chunks[k].g, chunks[k].n_rows * chunks[k].row_size,
                                     grad_scale) != 1:
                        nbad = 1
                        break
            if nbad == 0:
                if nt == 1:
                    for k in range(nchunks):
                        nerr += _rowwise_chunk(kind, c, dtype, &chunks[k]) != 0
                else:
                    for k in prange(nchunks, schedule="static", num_threads=nt):
                        nerr += _rowwise_chunk(kind, c, dtype, &chunks[k]) != 0
    finally:
        free(chunks)
    if nerr:  # unreachable after fa_rowwise_supported: the kernel decides before any write
        raise ValueError(f"the row-wise dense step has no kernel for optimizer kind {kind}")
    return nbad == 0


cdef inline int _rowwise_chunk(int kind, const void *c, int dtype, RowChunk *ch) noexcept nogil:
    if dtype == FA_F32:
        return fa_rowwise_dense_f32(kind, c, <float *>ch.x, <const float *>ch.g, <float *>ch.a,
                                    ch.n_rows, ch.row_size)
    return fa_rowwise_dense_f64(kind, c, <double *>ch.x, <const double *>ch.g, <double *>ch.a,
                                ch.n_rows, ch.row_size)
