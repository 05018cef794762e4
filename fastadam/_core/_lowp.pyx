"""The driver of low-precision optimizer states (include/fastadam/lowp_cpu.h, lowp.h): bfloat16
and 8-bit block-quantized state slots, bfloat16 parameters and gradients, for every optimizer
of include/fastadam/optimizers.def, dense and sparse rows (lazy).

The tensors are cut into chunks of whole quantization blocks (about CHUNK elements; a sparse
step: one chunk per row), the chunk list is split statically over the threads, and each chunk
is one call of fa_lowp_chunk_step.  Every element and every block is computed the same way
whatever the chunk, so results are bit-identical for any thread count.  Arguments arrive
validated by the Python layer; this module checks only what it must to stay memory safe (the
array sizes and item sizes each format implies, and that every array it writes is writable)
and whether the kernels take the optimizer's flags, all before anything is written.

Fork: libgomp's thread pool does not survive ``fork``, and a child that enters a parallel
region after its parent ran one hangs.  A thread count resolved before the fork (a prepared
step's or an optimizer's explicit ``num_threads``) is resolved again in a forked child by
fastadam/_core/_threads.py (one thread, one RuntimeWarning), here in the driver, so that no
caller of it can enter a parallel region there.
"""
import os

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

from fastadam._core._coeffs cimport Coefficients
from fastadam._core._levels cimport fa_level_in_use, fa_level_name, fa_use_level

from fastadam._core._cpu_level import LEVEL_IN_USE
from fastadam._core._threads import resolve_num_threads

cnp.import_array()

cdef extern from "fastadam/lowp_cpu.h":
    enum:
        FA_FMT_F32_ "FA_FMT_F32"
        FA_FMT_BF16_ "FA_FMT_BF16"
        FA_FMT_Q8_ "FA_FMT_Q8"
        FA_MAP_DYNAMIC_ "FA_MAP_DYNAMIC"
        FA_MAP_LINEAR_ "FA_MAP_LINEAR"
        FA_ROUND_NEAREST_ "FA_ROUND_NEAREST"
        FA_ROUND_STOCHASTIC_ "FA_ROUND_STOCHASTIC"
        FA_MAX_SLOTS
        FA_LOWP_MAX_BLOCK
        FA_OK
    ctypedef struct fa_lowp_plan:
        int nslots
    ctypedef struct fa_lowp_chunk:
        void *x
        const void *g
        void *s[3]
        float *scale[3]
        float *master
        Py_ssize_t n
        uint32_t key
        uint32_t j0
    int fa_lowp_init()
    int fa_lowp_prepare(fa_lowp_plan *plan, int kind, const void *coeffs, int param_fmt,
                        int grad_fmt, int state_fmt, int block, int qmap,
                        const int *signed_slots, int rounding, int has_master) nogil
    void fa_lowp_chunk_step(const fa_lowp_plan *plan, const fa_lowp_chunk *chunk) noexcept nogil
    int fa_lowp_all_finite(int fmt, const void *g, Py_ssize_t n, double grad_scale) nogil
    void fa_lowp_quantize_blocks(const float *y, Py_ssize_t n, int block, int qmap,
                                 int is_signed, uint8_t *codes, float *scales) nogil
    void fa_lowp_dequantize_blocks(const uint8_t *codes, const float *scales, Py_ssize_t n,
                                   int block, int qmap, int is_signed, float *out) nogil
    void fa_lowp_to_bf16(const float *src, Py_ssize_t n, uint16_t *dst) nogil
    long long fa_lowp_check_codes(int qmap, int is_signed, uint32_t u_begin, uint32_t u_end,
                                  uint32_t stride) nogil
    const float *fa_lowp_map(int qmap, int is_signed)
    uint32_t fa_sr_key(uint32_t seed_lo, uint32_t seed_hi, uint32_t t, uint32_t tensor_index)

FMT_F32, FMT_BF16, FMT_Q8 = FA_FMT_F32_, FA_FMT_BF16_, FA_FMT_Q8_
MAP_DYNAMIC, MAP_LINEAR = FA_MAP_DYNAMIC_, FA_MAP_LINEAR_
ROUND_NEAREST, ROUND_STOCHASTIC = FA_ROUND_NEAREST_, FA_ROUND_STOCHASTIC_
MIN_BLOCK, MAX_BLOCK = 8, FA_LOWP_MAX_BLOCK

fa_use_level(LEVEL_IN_USE)  # the clones this module's kernels run (include/fastadam/common.h)
if fa_lowp_init() != 0:
    raise ImportError("fastadam._core._lowp: the 8-bit code bins do not reproduce the maps' "
                      "thresholds (include/fastadam/lowp.c)")

# Elements per chunk (rounded down to whole blocks); below _PARALLEL_MIN elements in all, the
# step runs on one thread: starting a parallel region costs more than a small update.
cdef enum:
    CHUNK = 32768
    _PARALLEL_MIN = 131072

cdef int _ITEMSIZE[3]
_ITEMSIZE[:] = [4, 2, 1]

# set in a child created by fork(): every thread count is resolved again (see the top)
cdef bint _forked = False


def _mark_forked():
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def simd_level_in_use():
    """The CPU level this module's kernels run (fastadam/_core/_cpu_level.py)."""
    return fa_level_name(fa_level_in_use()).decode()


def _map_array(int qmap, bint is_signed):
    if qmap != FA_MAP_DYNAMIC_ and qmap != FA_MAP_LINEAR_:
        raise ValueError(f"qmap: expected MAP_DYNAMIC (0) or MAP_LINEAR (1), got {qmap}")
    cdef const float *m = fa_lowp_map(qmap, is_signed)
    return np.array(<float[:256]>m, dtype=np.float32)


def dynamic_map(bint signed):
    """The 256 float32 values of the dynamic quantization map, sorted (bitsandbytes'
    create_dynamic_map(signed, 7, 8) computed in float64, rounded to float32)."""
    return _map_array(FA_MAP_DYNAMIC_, signed)


def linear_map(bint signed):
    """The 256 float32 values of the linear map: (c - 127) / 127 (c = 255: 1.0), or c / 255."""
    return _map_array(FA_MAP_LINEAR_, signed)


cdef int check_block(int block) except -1:
    if not MIN_BLOCK <= block <= MAX_BLOCK:
        raise ValueError(f"block_size: expected an int in [{MIN_BLOCK}, {MAX_BLOCK}], "
                         f"got {block}")
    return 0


def quantize(cnp.ndarray values, int block, bint signed, int qmap):
    """Quantize a C-contiguous float32 1-D array block-wise: returns (codes uint8, scales
    float32 of length ceil(size / block)); scale = max |y| per block, code = the nearest map
    value to y / scale (ties: the lower code)."""
    check_block(block)
    _map_array(qmap, signed)
    if (values.ndim != 1 or cnp.PyArray_TYPE(values) != cnp.NPY_FLOAT
            or not cnp.PyArray_IS_C_CONTIGUOUS(values)):
        raise TypeError("values: expected a C-contiguous float32 1-D array")
    cdef Py_ssize_t n = values.shape[0]
    cdef cnp.ndarray codes = np.empty(n, np.uint8)
    cdef cnp.ndarray scales = np.empty((n + block - 1) // block, np.float32)
    with nogil:
        fa_lowp_quantize_blocks(<const float *>cnp.PyArray_DATA(values), n, block, qmap, signed,
                                <uint8_t *>cnp.PyArray_DATA(codes),
                                <float *>cnp.PyArray_DATA(scales))
    return codes, scales


def dequantize(cnp.ndarray codes, cnp.ndarray scales, int block, bint signed, int qmap):
    """The float32 values map[code] * scale of block-wise codes (uint8 1-D, C-contiguous) and
    their float32 scales (ceil(size / block) of them)."""
    check_block(block)
    _map_array(qmap, signed)
    if (codes.ndim != 1 or cnp.PyArray_TYPE(codes) != cnp.NPY_UINT8
            or not cnp.PyArray_IS_C_CONTIGUOUS(codes)):
        raise TypeError("codes: expected a C-contiguous uint8 1-D array")
    cdef Py_ssize_t n = codes.shape[0]
    if (scales.ndim != 1 or cnp.PyArray_TYPE(scales) != cnp.NPY_FLOAT
            or not cnp.PyArray_IS_C_CONTIGUOUS(scales) or scales.shape[0] != (n + block - 1) // block):
        raise ValueError(f"scales: expected a C-contiguous float32 1-D array of "
                         f"{(n + block - 1) // block} values")
    cdef cnp.ndarray out = np.empty(n, np.float32)
    with nogil:
        fa_lowp_dequantize_blocks(<const uint8_t *>cnp.PyArray_DATA(codes),
                                  <const float *>cnp.PyArray_DATA(scales), n, block, qmap,
                                  signed, <float *>cnp.PyArray_DATA(out))
    return out


def to_bf16_bits(values):
    """The bfloat16 bits (uint16, the shape of values) of a float32 array, rounded to nearest,
    ties to even; a NaN becomes a quiet NaN."""
    cdef cnp.ndarray a = np.ascontiguousarray(values, dtype=np.float32)
    cdef cnp.ndarray out = np.empty(np.shape(a), np.uint16)
    with nogil:
        fa_lowp_to_bf16(<const float *>cnp.PyArray_DATA(a), cnp.PyArray_SIZE(a),
                        <uint16_t *>cnp.PyArray_DATA(out))
    return out


def sr_key(seed, t, tensor_index):
    """The stochastic-rounding key of one tensor in one step (include/fastadam/lowp.h,
    fa_sr_key): seed a uint64, t and tensor_index taken mod 2^32."""
    cdef uint64_t s = <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF)
    return int(fa_sr_key(<uint32_t>(s & 0xFFFFFFFF), <uint32_t>(s >> 32),
                         <uint32_t>(int(t) & 0xFFFFFFFF), <uint32_t>(int(tensor_index) & 0xFFFFFFFF)))


def _check_codes(int qmap, bint signed, uint32_t u_begin, uint64_t u_end, uint32_t stride):
    """Codes of the floats with bits u_begin, u_begin + stride, ... < u_end by lowp.c's bins
    and by lowp.h's threshold search: how many differ (tests/test_lowp_kernels.py)."""
    cdef long long bad
    cdef uint32_t end = <uint32_t>min(u_end, 0xFFFFFFFF)
    with nogil:
        bad = fa_lowp_check_codes(qmap, signed, u_begin, end, stride)
    return bad


cdef object _need(cnp.ndarray a, Py_ssize_t size, int fmt, str what, bint written=False):
    if (cnp.PyArray_SIZE(a) != size or cnp.PyArray_ITEMSIZE(a) != _ITEMSIZE[fmt]
            or not cnp.PyArray_IS_C_CONTIGUOUS(a)):
        raise ValueError(f"{what}: expected a C-contiguous array of {size} elements of "
                         f"{_ITEMSIZE[fmt]} bytes, got {a.size} of {a.itemsize} bytes")
    if written and not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{what}: is read-only, but the step writes it")


cdef int prepare(fa_lowp_plan *plan, Coefficients coeffs, int param_fmt, int grad_fmt,
                 int state_fmt, int block, int qmap, tuple signed_slots, int rounding,
                 bint has_master, Py_ssize_t nslots) except -1:
    if param_fmt not in (FA_FMT_F32_, FA_FMT_BF16_) or grad_fmt not in (FA_FMT_F32_, FA_FMT_BF16_):
        raise ValueError(f"param_fmt, grad_fmt: expected FMT_F32 or FMT_BF16, got "
                         f"{param_fmt}, {grad_fmt}")
    if state_fmt not in (FA_FMT_F32_, FA_FMT_BF16_, FA_FMT_Q8_):
        raise ValueError(f"state_fmt: expected FMT_F32, FMT_BF16 or FMT_Q8, got {state_fmt}")
    if rounding not in (FA_ROUND_NEAREST_, FA_ROUND_STOCHASTIC_):
        raise ValueError(f"rounding: expected ROUND_NEAREST or ROUND_STOCHASTIC, got {rounding}")
    if has_master and param_fmt != FA_FMT_BF16_:
        raise ValueError("masters: a float32 master copy needs bfloat16 parameters (FMT_BF16)")
    if state_fmt == FA_FMT_Q8_:
        check_block(block)
        _map_array(qmap, True)
    cdef int sgn[3]
    sgn[0] = sgn[1] = sgn[2] = 0
    cdef int err = fa_lowp_prepare(plan, coeffs.kind, coeffs.data, param_fmt, grad_fmt,
                                   state_fmt, block, qmap, sgn, rounding, has_master)
    if err != FA_OK:
        raise ValueError(f"the low-precision step has no kernel for optimizer kind {coeffs.kind} "
                         f"with flags {coeffs.flags} (include/fastadam/optimizers.def)")
    if nslots != plan.nslots:
        raise ValueError(f"slots: expected {plan.nslots} state lists for these options, got "
                         f"{nslots}")
    if len(signed_slots) != plan.nslots:
        raise ValueError(f"signed_slots: expected {plan.nslots} flags, got {len(signed_slots)}")
    for q in range(plan.nslots):
        sgn[q] = 1 if signed_slots[q] else 0
    fa_lowp_prepare(plan, coeffs.kind, coeffs.data, param_fmt, grad_fmt, state_fmt, block, qmap,
                    sgn, rounding, has_master)
    return 0


cdef int run_chunks(const fa_lowp_plan *plan, fa_lowp_chunk *chunks, Py_ssize_t nchunks,
                    Py_ssize_t total, int num_threads) except -1:
    cdef Py_ssize_t k
    cdef int nt = num_threads
    if nt <= 0:
        nt = 1
    if _forked and nt > 1 and total >= _PARALLEL_MIN:
        nt = resolve_num_threads(nt)  # one thread (and the warning) in a forked child
    if total < _PARALLEL_MIN or nt > nchunks:
        nt = 1 if total < _PARALLEL_MIN else <int>nchunks
    with nogil:
        if nt == 1:
            for k in range(nchunks):
                fa_lowp_chunk_step(plan, &chunks[k])
        else:
            for k in prange(nchunks, schedule="static", num_threads=nt):
                fa_lowp_chunk_step(plan, &chunks[k])
    return 0


def dense_step(Coefficients coeffs, list xs, list gs, list slots, list scales, list masters,
               int param_fmt, int grad_fmt, int state_fmt, int block, int qmap,
               tuple signed_slots, int rounding, unsigned long long seed, long long t,
               bint skip_nonfinite, int num_threads):
    """One step of the optimizer `coeffs` describes over tensors with low-precision storage.

    xs: parameters in param_fmt (float32 or bfloat16 bits); gs: gradients in grad_fmt; slots:
    one list per state slot the optimizer uses with these flags, arrays in state_fmt (float32,
    bfloat16, or uint8 codes); scales: per slot a list of float32 arrays of ceil(size / block)
    when FMT_Q8, else []; masters: [] or float32 arrays like xs (param_fmt FMT_BF16: the master
    is updated, x written as its nearest bfloat16); signed_slots: per slot, True for the signed
    map; rounding: of bfloat16 x without masters (stochastic: seeded by seed, t and the tensor's
    position); num_threads <= 0 runs one thread.
    Unsupported flags, wrong slot counts, arrays of the wrong size and read-only arrays that
    the step writes raise ValueError before anything is written.  Returns False (nothing
    written) if skip_nonfinite found a non-finite gradient (divided by the coefficients'
    grad_scale), else True.
    """
    cdef fa_lowp_plan plan
    cdef bint has_master = len(masters) > 0
    prepare(&plan, coeffs, param_fmt, grad_fmt, state_fmt, block, qmap, signed_slots, rounding,
            has_master, len(slots))
    cdef Py_ssize_t ntensors = len(xs), i, q, k, size, start, step, nchunks = 0, total = 0
    cdef Py_ssize_t chunk = CHUNK
    cdef bint q8 = state_fmt == FA_FMT_Q8_
    if q8:
        chunk = max(1, CHUNK // block) * block
        if len(scales) != plan.nslots:
            raise ValueError(f"scales: expected {plan.nslots} lists of scales, got {len(scales)}")
    if len(gs) != ntensors or any(len(<list>s) != ntensors for s in slots) or (
            has_master and len(masters) != ntensors) or (
            q8 and any(len(<list>s) != ntensors for s in scales)):
        raise ValueError(f"xs, gs, slots, scales, masters: expected {ntensors} tensors in each")
    for i in range(ntensors):
        size = cnp.PyArray_SIZE(<cnp.ndarray>xs[i])
        _need(xs[i], size, param_fmt, f"xs[{i}]", True)
        _need(gs[i], size, grad_fmt, f"gs[{i}]")
        for q in range(plan.nslots):
            _need((<list>slots[q])[i], size, state_fmt, f"slots[{q}][{i}]", True)
            if q8:
                _need((<list>scales[q])[i], (size + block - 1) // block, FA_FMT_F32_,
                      f"scales[{q}][{i}]", True)
        if has_master:
            _need(masters[i], size, FA_FMT_F32_, f"masters[{i}]", True)
        total += size
        nchunks += (size + chunk - 1) // chunk
    if skip_nonfinite:
        for i in range(ntensors):
            if not fa_lowp_all_finite(grad_fmt, cnp.PyArray_DATA(<cnp.ndarray>gs[i]),
                                      cnp.PyArray_SIZE(<cnp.ndarray>gs[i]), coeffs.grad_scale):
                return False
    if nchunks == 0:
        return True
    cdef fa_lowp_chunk *chunks = <fa_lowp_chunk *>malloc(nchunks * sizeof(fa_lowp_chunk))
    if chunks == NULL:
        raise MemoryError()
    cdef Py_ssize_t xsize = _ITEMSIZE[param_fmt], gsize = _ITEMSIZE[grad_fmt]
    cdef Py_ssize_t ssize = _ITEMSIZE[state_fmt]
    cdef uint32_t key
    cdef char *px
    cdef char *pg
    cdef char *pm
    cdef char *ps[3]
    cdef float *pc[3]
    try:
        k = 0
        for i in range(ntensors):
            size = cnp.PyArray_SIZE(<cnp.ndarray>xs[i])
            key = sr_key(seed, t, i)
            px = <char *>cnp.PyArray_DATA(<cnp.ndarray>xs[i])
            pg = <char *>cnp.PyArray_DATA(<cnp.ndarray>gs[i])
            pm = <char *>cnp.PyArray_DATA(<cnp.ndarray>masters[i]) if has_master else NULL
            for q in range(3):
                ps[q] = <char *>cnp.PyArray_DATA(<cnp.ndarray>(<list>slots[q])[i]) \
                    if q < plan.nslots else NULL
                pc[q] = <float *>cnp.PyArray_DATA(<cnp.ndarray>(<list>scales[q])[i]) \
                    if q8 and q < plan.nslots else NULL
            start = 0
            while start < size:
                step = min(chunk, size - start)
                chunks[k].x = px + start * xsize
                chunks[k].g = pg + start * gsize
                chunks[k].master = <float *>(pm + start * 4) if pm != NULL else NULL
                for q in range(3):
                    chunks[k].s[q] = ps[q] + start * ssize if ps[q] != NULL else NULL
                    chunks[k].scale[q] = pc[q] + start // block if pc[q] != NULL else NULL
                chunks[k].n = step
                chunks[k].key = key
                chunks[k].j0 = <uint32_t>start
                start += step
                k += 1
        run_chunks(&plan, chunks, nchunks, total, num_threads)
    finally:
        free(chunks)
    return True


def rows_step(Coefficients coeffs, cnp.ndarray x, cnp.ndarray rows, cnp.ndarray values,
              list slots, list scales, master, int param_fmt, int state_fmt, int block,
              int qmap, tuple signed_slots, int rounding, unsigned long long seed, long long t,
              int num_threads):
    """The lazy sparse step: the optimizer's update of the listed rows of a (R, D) table only.

    x: (R, D) in param_fmt; rows: int64 1-D, sorted, unique, each in [0, R); values: float32
    (len(rows), D), already summed per row; slots: (R, D) arrays in state_fmt per slot used;
    scales: per slot float32 (R * D / block,) when FMT_Q8 (then D % block == 0), else [];
    master: None or float32 (R, D).  Stochastic rounding draws element row * D + column of
    tensor_index 0.  Returns None.  Bad shapes, rows out of range or out of order, and
    unsupported flags raise ValueError before anything is written.
    """
    cdef fa_lowp_plan plan
    cdef bint has_master = master is not None
    prepare(&plan, coeffs, param_fmt, FA_FMT_F32_, state_fmt, block, qmap, signed_slots,
            rounding, has_master, len(slots))
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D table, got {x.ndim} dimensions")
    cdef Py_ssize_t R = x.shape[0], D = x.shape[1], nrows, i, q, r, prev = -1
    cdef bint q8 = state_fmt == FA_FMT_Q8_
    if q8 and D % block != 0:
        raise ValueError(f"block_size: {block} does not divide the row length D = {D} "
                         f"(a sparse row must be whole blocks)")
    if (rows.ndim != 1 or cnp.PyArray_TYPE(rows) != cnp.NPY_INT64
            or not cnp.PyArray_IS_C_CONTIGUOUS(rows)):
        raise TypeError("rows: expected a C-contiguous int64 1-D array")
    nrows = rows.shape[0]
    _need(x, R * D, param_fmt, "x", True)
    if (cnp.PyArray_TYPE(values) != cnp.NPY_FLOAT or values.ndim != 2
            or values.shape[0] != nrows or values.shape[1] != D):
        raise ValueError(f"values: expected float32 ({nrows}, {D})")
    _need(values, nrows * D, FA_FMT_F32_, "values")
    if q8 and len(scales) != plan.nslots:
        raise ValueError(f"scales: expected {plan.nslots} scale arrays, got {len(scales)}")
    for q in range(plan.nslots):
        _need(slots[q], R * D, state_fmt, f"slots[{q}]", True)
        if q8:
            _need(scales[q], R * D // block, FA_FMT_F32_, f"scales[{q}]", True)
    if has_master:
        _need(master, R * D, FA_FMT_F32_, "master", True)
    cdef const int64_t *pr = <const int64_t *>cnp.PyArray_DATA(rows)
    for i in range(nrows):
        r = pr[i]
        if r <= prev or r >= R:
            raise ValueError(f"rows: expected sorted unique indices in [0, {R}), got {r} at "
                             f"position {i}")
        prev = r
    if nrows == 0 or D == 0:
        return None
    cdef fa_lowp_chunk *chunks = <fa_lowp_chunk *>malloc(nrows * sizeof(fa_lowp_chunk))
    if chunks == NULL:
        raise MemoryError()
    cdef uint32_t key = sr_key(seed, t, 0)
    cdef char *px = <char *>cnp.PyArray_DATA(x)
    cdef char *pg = <char *>cnp.PyArray_DATA(values)
    cdef char *pm = <char *>cnp.PyArray_DATA(<cnp.ndarray>master) if has_master else NULL
    cdef char *ps[3]
    cdef float *pc[3]
    cdef Py_ssize_t xsize = _ITEMSIZE[param_fmt], ssize = _ITEMSIZE[state_fmt]
    for q in range(3):
        ps[q] = <char *>cnp.PyArray_DATA(<cnp.ndarray>slots[q]) if q < plan.nslots else NULL
        pc[q] = <float *>cnp.PyArray_DATA(<cnp.ndarray>scales[q]) if q8 and q < plan.nslots else NULL
    try:
        for i in range(nrows):
            r = pr[i]
            chunks[i].x = px + r * D * xsize
            chunks[i].g = pg + i * D * 4
            chunks[i].master = <float *>(pm + r * D * 4) if pm != NULL else NULL
            for q in range(3):
                chunks[i].s[q] = ps[q] + r * D * ssize if ps[q] != NULL else NULL
                chunks[i].scale[q] = pc[q] + r * D // block if pc[q] != NULL else NULL
            chunks[i].n = D
            chunks[i].key = key
            chunks[i].j0 = <uint32_t>(r * D)
        run_chunks(&plan, chunks, nrows, nrows * D, num_threads)
    finally:
        free(chunks)
    return None
