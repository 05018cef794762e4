"""The bytes the GPU kernels read, laid out on the host (NumPy only, so CPU tests check them).

A multi-tensor table (kernels.cu, fa_dense_step) is one uint8 buffer: the optimizer's
coefficient struct in its first HEADER_BYTES bytes (the C struct of the optimizer's header,
listed in include/fastadam/optimizers.def: field order of the header, C alignment), then one 64-byte entry per
non-empty tensor: eight int64 = addresses of x, g, s0, s1, s2, element count, first block, unused.
"""
import struct

import numpy as np

from .. import drivers

HEADER_BYTES = 128  # FA_CUDA_HEADER in kernels.cu
CHUNK = 4096        # FA_CUDA_CHUNK in kernels.cu: elements per block of the dense step
ENTRY_WORDS = 8     # int64 words per table entry (fa_cuda_tensor)


def struct_fields(kind):
    """The coefficient struct of ``kind``, field by field in declaration order (its spec's
    float64 fields, then ``flags``; a CPU test checks these against the headers)."""
    return list(drivers.spec_of_kind(kind).fields) + ["flags"]


def struct_dtype(kind):
    return np.dtype([(f, np.int32 if f == "flags" else np.float64) for f in struct_fields(kind)],
                    align=True)


class _ByKind(dict):
    """kind -> value, computed on first use (the specs of RMSprop and Lion register when
    fastadam.optim is imported)."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, kind):
        value = self[kind] = self._make(kind)
        return value


STRUCT_FIELDS = _ByKind(struct_fields)
STRUCT_DTYPES = _ByKind(struct_dtype)


def struct_packer(kind):
    """A ``struct.Struct`` that writes the coefficient struct of ``kind`` as STRUCT_DTYPES lays
    it out (little-endian, padding bytes as zeros): one call per step instead of a record."""
    dt = STRUCT_DTYPES[kind]
    fmt, pos = "<", 0
    for name in STRUCT_FIELDS[kind]:
        field_type, offset = dt.fields[name][:2]
        fmt += "x" * (offset - pos) + ("i" if field_type == np.int32 else "d")
        pos = offset + field_type.itemsize
    return struct.Struct(fmt + "x" * (dt.itemsize - pos))


STRUCT_PACKERS = _ByKind(struct_packer)


def coefficient_bytes(coeffs, out):
    """Write the coefficient struct of ``coeffs`` at the start of the uint8 array ``out``."""
    fields = coeffs.as_dict()
    STRUCT_PACKERS[coeffs.kind].pack_into(
        out, 0, *[fields[name] for name in STRUCT_FIELDS[coeffs.kind]])
    return out


def host_table(coeffs, sizes, pointers):
    """(uint8 table, number of entries, number of blocks).  ``sizes``: element count of each
    tensor; ``pointers``: one list of device addresses per column (x, g, then up to three state
    slots), each as long as ``sizes``.  Empty tensors get no entry."""
    kept = np.array(sizes, dtype=np.int64)
    columns = np.array(pointers[:5], dtype=np.int64).reshape(len(pointers[:5]), kept.size).T
    if not kept.all():
        nonempty = kept != 0
        kept, columns = kept[nonempty], columns[nonempty]
    n = kept.size
    host = np.zeros(HEADER_BYTES + 8 * ENTRY_WORDS * n, dtype=np.uint8)
    coefficient_bytes(coeffs, host)
    tab = host[HEADER_BYTES:].view(np.int64).reshape(n, ENTRY_WORDS)
    blocks = (kept + CHUNK - 1) // CHUNK
    tab[:, :columns.shape[1]] = columns
    tab[:, 5] = kept
    tab[:, 6] = np.cumsum(blocks) - blocks
    return host, n, int(blocks.sum())


def sort_segments(xp, indices):
    """(perm, rows, offsets) of 1-D int64 indices, with the array module ``xp`` (NumPy or CuPy):
    the stable order of the indices, the distinct indices in increasing order, and where each
    one's run starts in that order, plus the end (the segment sum's contract in kernels.cu)."""
    k = indices.shape[0]
    # CuPy's argsort is always stable; NumPy's must be asked
    perm = xp.argsort(indices, kind="stable") if xp is np else xp.argsort(indices)
    perm = perm.astype(np.int64, copy=False)
    ordered = indices[perm]
    if k == 0:
        return perm, ordered, xp.zeros(1, dtype=np.int64)
    new = xp.empty(k, dtype=bool)
    new[0] = True
    xp.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    starts = xp.flatnonzero(new).astype(np.int64)
    offsets = xp.concatenate([starts, xp.array([k], dtype=np.int64)])
    return perm, ordered[starts], offsets


# ------------------------------------------------------------------------------------------
# The low-precision kernels' table (kernels.cu, fa_lowp_dense / fa_lowp_rows): the coefficient
# struct in its first HEADER_BYTES bytes, then fa_lowp_params (LOWP_PARAM_FIELDS, int32, padded
# to LOWP_PARAMS_BYTES), then one LOWP_ENTRY_WORDS-word entry per non-empty tensor: the
# addresses of LOWP_COLUMNS, then element count, first block, and position in the step's list.

LOWP_PARAMS_BYTES = 64    # FA_LOWP_PARAMS
LOWP_TABLE = HEADER_BYTES + LOWP_PARAMS_BYTES  # FA_LOWP_TABLE
LOWP_ENTRY_WORDS = 16     # int64 words per fa_lowp_tensor
LOWP_THREADS = 1024       # FA_LOWP_THREADS
Q8_PER_THREAD = 4         # FA_Q8_PER_THREAD
# Elements per thread block of the 8-bit dense kernel: its blocks are small (64 threads for
# quantization blocks of 256) and do their quantization blocks one after another, so a span of
# CHUNK left 1e7 elements 1.16 waves of blocks on an H100 (ncu); 1024 makes about 4.6 waves,
# each block copying the 4 KiB of maps for 16 KiB of state and gradient traffic.
Q8_SPAN = 1024
LOWP_PARAM_FIELDS = ("param_fmt", "grad_fmt", "rounding", "has_master", "signed_mask", "block",
                     "span", "qmap", "seed_lo", "seed_hi", "t")
LOWP_COLUMNS = ("x", "g", "master", "s0", "s1", "s2", "scale0", "scale1", "scale2")


def lowp_threads(state_is_q8, block, row_size=None):
    """Threads per block of the low-precision kernels, a multiple of 32: for 8-bit states the
    fewest with which a thread holds at most Q8_PER_THREAD elements of a quantization block
    (64 for the default block of 256); else 256 (fewer for short rows)."""
    if state_is_q8:
        n = -(-block // Q8_PER_THREAD)
    else:
        n = 256 if row_size is None else min(256, row_size)
    return int(min(LOWP_THREADS, max(32, -(-n // 32) * 32)))


def lowp_span(state_is_q8, block):
    """Elements per thread block of fa_lowp_dense: CHUNK, or for 8-bit states the whole
    quantization blocks that fit in Q8_SPAN (at least one)."""
    return block * max(1, Q8_SPAN // block) if state_is_q8 else CHUNK


def lowp_header(coeffs, params):
    """The table's fixed part: the coefficient struct and the params (a dict with every name of
    LOWP_PARAM_FIELDS; seed_lo, seed_hi and t are taken mod 2**32)."""
    host = np.zeros(LOWP_TABLE, dtype=np.uint8)
    coefficient_bytes(coeffs, host)
    fields = host[HEADER_BYTES:LOWP_TABLE].view(np.uint32)
    for i, name in enumerate(LOWP_PARAM_FIELDS):
        fields[i] = int(params[name]) & 0xFFFFFFFF
    return host


def lowp_host_table(header, sizes, pointers, span):
    """(uint8 table, number of entries, number of blocks) of a low-precision step: ``header``
    from lowp_header, ``sizes`` the tensors' element counts, ``pointers`` a dict column name
    (LOWP_COLUMNS) -> one address per tensor (a missing column is 0), ``span`` the elements
    per thread block.  Empty tensors get no entry; each entry keeps its tensor's position."""
    keep = [i for i, n in enumerate(sizes) if n]
    n = len(keep)
    host = np.zeros(LOWP_TABLE + 8 * LOWP_ENTRY_WORDS * n, dtype=np.uint8)
    host[:LOWP_TABLE] = header
    tab = host[LOWP_TABLE:].view(np.int64).reshape(n, LOWP_ENTRY_WORDS)
    for col, name in enumerate(LOWP_COLUMNS):
        if name in pointers:
            tab[:, col] = [pointers[name][i] for i in keep]
    kept = np.array([sizes[i] for i in keep], dtype=np.int64)
    blocks = (kept + span - 1) // span
    tab[:, 9] = kept
    tab[:, 10] = np.cumsum(blocks) - blocks
    tab[:, 11] = keep
    return host, n, int(blocks.sum())
