"""The bandwidth yardstick of the benchmarks (include/fastadam/yardstick.c): the traffic of a
float32 Adam step (``stream_rw_f32``) and of the low-precision steps of issue 24
(``stream_rw_bits``: any mix of 4-, 2- and 1-byte arrays), chunked and threaded exactly as the
dense driver (fastadam/_core/_dense.pyx) runs a step, so the two are compared like for like."""
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
    int fa_stream_rw_bits(void *x, int xw, const void *g, int gw, void *a, void *b, int sw,
                          Py_ssize_t n) nogil

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


SCALE_BLOCK_MIN = 8  # the smallest block of 8-bit states (LOWP_SPEC: block in [8, 4096])


cdef inline void bits_chunk(char *px, int xw, char *pg, int gw, char *pa, char *pb, int sw,
                            float *psa, float *psb, Py_ssize_t block, Py_ssize_t start,
                            Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j, j0, j1
    fa_stream_rw_bits(px + start * xw, xw, pg + start * gw, gw, pa + start * sw,
                      pb + start * sw, sw, n)
    if psa != NULL:  # the chunk's block scales: read and written once, as an 8-bit step does
        j0 = start // block
        j1 = (start + n + block - 1) // block
        for j in range(j0, j1):
            psa[j] = psa[j] + 1.0
            psb[j] = psb[j] + 1.0


def stream_rw_bits(cnp.ndarray x, cnp.ndarray g, cnp.ndarray a, cnp.ndarray b, scales=None,
                   Py_ssize_t block=256, int num_threads=1):
    """Read x, g, a, b and write x, a, b, with any element widths: the traffic of a
    low-precision Adam step (issue 24) with no arithmetic, chunked and threaded as the dense
    step.  x: 4 or 2 bytes per element (float32 or bfloat16 parameters), g: 4 or 2 (the
    gradient), a and b: 4, 2 or 1 (the two state slots, float32, bfloat16 or 8-bit codes),
    all C-contiguous and of one size, x/a/b writable; the values are treated as bits and
    change (use scratch arrays).  ``scales=(sa, sb)``: two float32 arrays of
    ``ceil(size / block)`` elements, read and written once per block (the block scales of
    8-bit states).  Widths outside x in {4, 2}, g in {4, 2}, a == b in {4, 2, 1} (and
    x 4 with g 2) raise ValueError."""
    cdef Py_ssize_t n = cnp.PyArray_SIZE(x), nchunks, k, start, nblocks
    arrays = (("x", x), ("g", g), ("a", a), ("b", b))
    for name, arr in arrays:
        check_array(arr, name, -1, None, name != "g", True, False)
        if cnp.PyArray_SIZE(arr) != n:
            raise ValueError(f"{name}: expected {n} elements (the size of x), got "
                             f"{cnp.PyArray_SIZE(arr)}")
    cdef int xw = cnp.PyArray_ITEMSIZE(x), gw = cnp.PyArray_ITEMSIZE(g), sw = cnp.PyArray_ITEMSIZE(a)
    if cnp.PyArray_ITEMSIZE(b) != sw:
        raise ValueError(f"b: expected {sw}-byte elements like a, got {cnp.PyArray_ITEMSIZE(b)}")
    if not ((xw == 4 and gw == 4 and sw in (4, 2, 1)) or (xw == 2 and gw in (2, 4)
                                                          and sw in (4, 2, 1)
                                                          and not (gw == 4 and sw == 4))):
        raise ValueError(f"no stream loop for x {xw} bytes, g {gw} bytes, states {sw} bytes "
                         f"(x 4 with g 4, or x 2 with g 2 or 4; states 4, 2 or 1)")
    cdef float *psa = NULL
    cdef float *psb = NULL
    if scales is not None:
        if block < SCALE_BLOCK_MIN or CHUNK % block != 0:
            raise ValueError(f"block: expected a divisor of {CHUNK} >= {SCALE_BLOCK_MIN}, "
                             f"got {block}")
        nblocks = (n + block - 1) // block
        sa, sb = scales
        for name, arr in (("scales[0]", sa), ("scales[1]", sb)):
            check_array(arr, name, cnp.NPY_FLOAT, (nblocks,), True)
        psa = <float *>cnp.PyArray_DATA(<cnp.ndarray>sa)
        psb = <float *>cnp.PyArray_DATA(<cnp.ndarray>sb)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *pg = <char *>cnp.PyArray_DATA(g)
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    nchunks = (n + CHUNK - 1) // CHUNK
    cdef int nt = 1 if n < PARALLEL_MIN else min(num_threads, <int>nchunks)
    with nogil:
        if nt == 1:
            for k in range(nchunks):
                start = k * CHUNK
                bits_chunk(px, xw, pg, gw, pa, pb, sw, psa, psb, block, start,
                           min(CHUNK, n - start))
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                start = k * CHUNK
                bits_chunk(px, xw, pg, gw, pa, pb, sw, psa, psb, block, start,
                           min(CHUNK, n - start))
