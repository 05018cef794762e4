"""A stand-in for CuPy on a machine without a GPU -- for tests only, never a backend.

``PYTHONPATH=tests/fake_cupy python -m pytest tests/test_gpu.py`` runs the GPU test-suite through
fastadam.gpu's real Python code (dispatch, checks, table building, segment sorting, launch
arguments) with "device" arrays that are NumPy arrays (a subclass, so that they are told apart
from plain NumPy arrays) and kernel launches executed by include/fastadam/cuda/kernels.cu
compiled as C++ for the host (tests/gpu_emulation.cpp).  A launch is checked against the name
expressions its RawModule was built with.  What this cannot show: anything about CuPy itself,
NVRTC's code, CUDA's arithmetic, streams or concurrency.  Passing here is not a GPU run.
"""
import ctypes
import re
from pathlib import Path

import numpy as np

__version__ = "0.0-fake"
_TESTS = Path(__file__).resolve().parents[2]
_STORAGE = {"unsigned short": 0, "float": 1, "double": 2}


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr
        self.device_id = 0


class _DeviceId:
    def __init__(self, i):
        self.id = i


class ndarray(np.ndarray):
    """A NumPy array playing a device array on device 0."""

    @property
    def data(self):
        return _Pointer(self.__array_interface__["data"][0])

    @property
    def device(self):
        return _DeviceId(0)

    def get(self):
        return np.array(self, copy=True).view(np.ndarray)


def _wrap(a):
    return np.asarray(a).view(ndarray)


def asarray(a, dtype=None):
    return _wrap(np.array(a, dtype=dtype, copy=True))  # a host->device copy


def array(a, dtype=None):
    return asarray(a, dtype)


def asnumpy(a):
    return np.array(a, copy=True).view(np.ndarray)


def zeros(shape, dtype=float):
    return _wrap(np.zeros(shape, dtype))


def ones(shape, dtype=float):
    return _wrap(np.ones(shape, dtype))


def empty(shape, dtype=float):
    return _wrap(np.empty(shape, dtype))


def full(shape, value, dtype=None):
    return _wrap(np.full(shape, value, dtype))


def arange(*args, dtype=None):
    return _wrap(np.arange(*args, dtype=dtype))


def stack(arrays):
    return _wrap(np.stack([np.asarray(a) for a in arrays]))


def concatenate(arrays):
    return _wrap(np.concatenate([np.asarray(a) for a in arrays]))


def argsort(a):
    return _wrap(np.argsort(np.asarray(a), kind="stable"))


def flatnonzero(a):
    return _wrap(np.flatnonzero(np.asarray(a)))


def not_equal(a, b, out=None):
    return np.not_equal(a, b, out=out)


def ascontiguousarray(a):
    return _wrap(np.ascontiguousarray(a))


def array_equal(a, b):
    return _wrap(np.array_equal(np.asarray(a), np.asarray(b)))


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDevice():
        return 0

    memcpyHostToDevice = 1

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):
        assert kind == 1 and stream == 0, "the fake runs host-to-device copies on stream 0"
        ctypes.memmove(dst, src, size)


class _Device:
    def __init__(self, i=None):
        self.id = 0 if i is None else i

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Stream:
    def __init__(self, non_blocking=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    ptr = 0  # every fake stream is the null stream


class cuda:  # noqa: N801 (the module name CuPy uses)
    runtime = _Runtime
    Device = _Device
    Stream = _Stream

    @staticmethod
    def get_current_stream():
        return _Stream()


def _library():
    import sys

    sys.path.insert(0, str(_TESTS))
    try:
        from gpu_emulation_build import build
    finally:
        sys.path.remove(str(_TESTS))
    return build()


_LIB = _library()


def _c(arg):
    if isinstance(arg, np.ndarray):
        return ctypes.c_void_p(arg.__array_interface__["data"][0])
    if isinstance(arg, np.int32):
        return ctypes.c_int(int(arg))
    if isinstance(arg, np.int64):
        return ctypes.c_longlong(int(arg))
    if isinstance(arg, np.float64):
        return ctypes.c_double(float(arg))
    raise TypeError(f"fake RawKernel: unsupported argument {type(arg).__name__}")


class _Kernel:
    def __init__(self, name):
        self.name = name
        m = re.fullmatch(r"(\w+)<(.*)>", name)
        self.base = m.group(1)
        params = [p.strip() for p in m.group(2).split(",")]
        if self.base.startswith("fa_lowp_"):  # every template argument is an int
            self.storage, self.template = None, [int(p) for p in params]
            return
        self.storage = _STORAGE[params[0]]
        self.template = [int(p) for p in params[1:]]

    def __call__(self, grid, block, args):
        a = [_c(x) for x in args]
        threads = ctypes.c_uint(int(block[0]))
        nblocks = ctypes.c_longlong(int(grid[0]))
        lib, s, tp = _LIB, self.storage, self.template
        if self.base == "fa_dense_step":
            assert len(a) == 4
            lib.emu_dense_step(s, tp[0], tp[1], a[0], a[1], nblocks, a[2], a[3], threads)
        elif self.base == "fa_nonfinite":
            assert len(a) == 4
            lib.emu_nonfinite(s, a[0], a[1], nblocks, a[2], a[3])
        elif self.base == "fa_segment_sum":
            assert len(a) == 6
            lib.emu_segment_sum(s, a[0], a[1], a[2], a[3], a[4], a[5], threads)
        elif self.base == "fa_sparse_rows":
            assert len(a) == 12
            assert int(grid[0]) >= args[9], "the emulation needs one block per segment"
            mode = 2 if tp[2] else 0
            lib.emu_sparse(s, tp[0], tp[1], mode, a[0], a[1], a[2], a[3], a[4],
                           ctypes.c_longlong(0), a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                           threads)
        elif self.base == "fa_sparse_dense":
            assert len(a) == 10
            lib.emu_sparse(s, tp[0], tp[1], 1, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                           a[8], a[9], ctypes.c_longlong(0), ctypes.c_void_p(0),
                           ctypes.c_longlong(0), threads)
        elif self.base == "fa_rowwise_dense":
            assert len(a) == 6
            null, zero = ctypes.c_void_p(0), ctypes.c_longlong(0)
            lib.emu_rowwise(s, tp[0], tp[1], -1, a[0], a[1], a[2], a[3], null, a[4], a[5], null,
                            zero, null, zero, threads)
        elif self.base == "fa_rowwise_rows":
            assert len(a) == 9
            null, zero = ctypes.c_void_p(0), ctypes.c_longlong(0)
            lib.emu_rowwise(s, tp[0], tp[1], 2 if tp[2] else 0, a[0], a[1], a[4], a[2], null,
                            zero, a[3], a[5], a[6], a[7] if tp[2] else null, a[8], threads)
        elif self.base == "fa_rowwise_all":
            assert len(a) == 8
            null, zero = ctypes.c_void_p(0), ctypes.c_longlong(0)
            lib.emu_rowwise(s, tp[0], tp[1], 1, a[0], a[1], a[5], a[2], a[6], a[4], a[3], a[7],
                            zero, null, zero, threads)
        elif self.base == "fa_lowp_dense":
            assert len(a) == 4
            lib.emu_lowp_dense(tp[0], tp[1], tp[2], a[0], a[1], nblocks, a[2], a[3], threads)
        elif self.base == "fa_lowp_rows":
            assert len(a) == 4
            lib.emu_lowp_rows(tp[0], tp[1], tp[2], a[0], a[1], a[2], a[3], nblocks, threads)
        elif self.base == "fa_lowp_nonfinite":
            assert len(a) == 4
            lib.emu_lowp_nonfinite(tp[0], a[0], a[1], nblocks, a[2], a[3])
        else:
            raise NotImplementedError(self.base)


class RawModule:
    def __init__(self, code, options=(), name_expressions=()):
        assert '#include "fastadam/formulas.h"' in code
        self.names = set(name_expressions)

    def get_function(self, name):
        if name not in self.names:
            raise KeyError(f"fake RawModule: {name!r} is not among its name expressions")
        return _Kernel(name)
