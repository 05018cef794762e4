"""The bandwidth yardstick of the benchmarks (include/fastadam/yardstick.c): the traffic of a
float32 Adam step, chunked and threaded exactly as the dense driver (fastadam/_core/_dense.pyx)
runs a step, so the two are compared like for like."""
cimport numpy as cnp
from cython.parallel cimport prange
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

from fastadam._core._cpu_level import LEVEL_IN_USE
from fastadam._core._validation import check_array

cnp.import_array()

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


cdef extern from "fastadam/yardstick.h":
    void fa_stream_rw_f32(float *a, const float *d, float *b, float *c, Py_ssize_t n) nogil
    void fa_stream_rw2_f32(float *a, const float *d, float *b, Py_ssize_t n) nogil

# Must match fastadam/_core/_dense.pyx (tests/test_build.py checks the module constants agree).
cdef enum:
    CHUNK = 32768
    PARALLEL_MIN = 131072

CHUNK_ELEMENTS = CHUNK
PARALLEL_MIN_ELEMENTS = PARALLEL_MIN


cdef inline void stream_chunk(float *pa, float *pd, float *pb, float *pc, Py_ssize_t start,
                              Py_ssize_t n) noexcept nogil:
    if pc != NULL:
        fa_stream_rw_f32(pa + start, pd + start, pb + start, pc + start, n)
    else:
        fa_stream_rw2_f32(pa + start, pd + start, pb + start, n)


def stream_rw_f32(cnp.ndarray a, cnp.ndarray d, cnp.ndarray b, c=None, int num_threads=1):
    """Read a, d, b, c and write a, b, c -- the traffic of a float32 Adam step -- cut into the
    same chunks and run on the same number of threads as the dense step would be (serially
    below PARALLEL_MIN elements).  float32, C-contiguous, equal shapes, a/b/c writable.
    With c=None: read a, d, b and write a, b, the traffic of an Adagrad or momentum step."""
    arrays = (("a", a), ("d", d), ("b", b)) + ((("c", c),) if c is not None else ())
    for name, arr in arrays:
        check_array(arr, name, cnp.NPY_FLOAT, (<object>a).shape, name != "d")
    cdef Py_ssize_t n = cnp.PyArray_SIZE(a), nchunks = (n + CHUNK - 1) // CHUNK, k, start
    cdef float *pa = <float *>cnp.PyArray_DATA(a)
    cdef float *pd = <float *>cnp.PyArray_DATA(d)
    cdef float *pb = <float *>cnp.PyArray_DATA(b)
    cdef float *pc = <float *>cnp.PyArray_DATA(<cnp.ndarray>c) if c is not None else NULL
    cdef int nt = 1 if n < PARALLEL_MIN else min(num_threads, <int>nchunks)
    with nogil:
        if nt == 1:
            for k in range(nchunks):
                start = k * CHUNK
                stream_chunk(pa, pd, pb, pc, start, min(CHUNK, n - start))
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                start = k * CHUNK
                stream_chunk(pa, pd, pb, pc, start, min(CHUNK, n - start))
