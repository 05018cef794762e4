"""The dense multi-tensor step on CuPy arrays: one table upload and one launch per step.

The table (kernels.cu, fa_dense_step) is one uint8 buffer: the coefficient struct in its first
128 bytes, then one 64-byte entry per non-empty tensor (addresses of x, g and the state slots,
element count, first block).  Block b of the grid updates FA_CUDA_CHUNK elements of the tensor
whose block range holds b, so a list of a thousand small tensors is one launch.
"""
import cupy
import numpy as np

from . import _kernels, _layout, _lowp, _source
from ._validation import check_step_arrays


def build_table(coeffs, xs, gs, slot_lists):
    """(device table, number of entries, number of blocks) for the non-empty tensors."""
    pointers = [[a.data.ptr for a in lst] for lst in [xs, gs] + slot_lists]
    host, n, nblocks = _layout.host_table(coeffs, [a.size for a in xs], pointers)
    return _kernels.upload_table(host), n, nblocks


def dense_step(coeffs, x, g, slots, skip_nonfinite):
    """Validate (all before any launch) and run one dense step on the GPU; returns the bool of
    the CPU path (False: skipped by ``skip_nonfinite``).  bfloat16 (uint16 bits) or 8-bit
    arrays go to the low-precision kernels (_lowp.py)."""
    if _lowp.is_lowp_call(x, g, slots):
        return _lowp.dense_step_public(coeffs, x, g, slots, skip_nonfinite)
    xs, gs, slot_lists, dtype, device = check_step_arrays(x, g, slots)
    if dtype != np.float64:
        coeffs.check_float32()  # float32 and float16 compute in float32
    if not xs:
        return True
    with cupy.cuda.Device(device):
        table, n, nblocks = build_table(coeffs, xs, gs, slot_lists)
        if n == 0:
            return True
        flags = coeffs.flags
        if flags not in _source.DENSE_FLAGS[coeffs.kind]:
            raise ValueError(f"the GPU dense step has no kernel for optimizer kind "
                             f"{coeffs.kind} with flags {flags}")
        step = _kernels.function("dense", dtype, coeffs.kind,
                                 _source.dense_name(_kernels.dtype_name(dtype), coeffs.kind, flags))
        if not skip_nonfinite:
            step((nblocks,), (_kernels.THREADS,), (table, np.int32(n), table, np.int32(0)))
            return True
        flag = cupy.zeros(1, dtype=np.int32)
        check = _kernels.function("dense", dtype, coeffs.kind,
                                  _source.nonfinite_name(_kernels.dtype_name(dtype)))
        check((nblocks,), (_kernels.THREADS,),
              (table, np.int32(n), np.float64(coeffs.grad_scale), flag))
        step((nblocks,), (_kernels.THREADS,), (table, np.int32(n), flag, np.int32(1)))
        return not bool(flag.get()[0])
