"""Compiled CUDA modules and the coefficient struct's bytes (imports CuPy).

``function(family, dtype, kind, name)`` returns the kernel ``name`` of the module (family, dtype,
kind) on the current device, compiling the module with ``cupy.RawModule`` (NVRTC) the first time
it is needed on that device; ``_source.module_names`` lists what each module instantiates.

``upload_coefficients(coeffs)`` copies a coefficient object's C struct (laid out by
``_layout.py``) to the device; ``upload_table(host)`` copies a step's table into a buffer that
the next step on the same stream reuses.
"""
import threading

import cupy
import numpy as np

from . import _source
from ._layout import HEADER_BYTES, coefficient_bytes

THREADS = 256

_modules = {}    # (device, family, dtype, kind) -> RawModule
_functions = {}  # (device, name expression) -> kernel
_tables = {}     # (device, stream, thread) -> the buffer of the step tables launched there
_MAX_TABLE_BUFFERS = 64


_dtype_names = {}


def dtype_name(dtype):
    """A dtype's name; a str is a name already (the low-precision formats: "bfloat16" needs no
    ml_dtypes here)."""
    if isinstance(dtype, str):
        return dtype
    name = _dtype_names.get(dtype)
    if name is None:  # np.dtype(...).name costs a microsecond or two: once per dtype
        name = _dtype_names[dtype] = np.dtype(dtype).name
    return name


def function(family, dtype, kind, name):
    device = cupy.cuda.runtime.getDevice()
    kernel = _functions.get((device, name))
    if kernel is None:
        key = (device, family, dtype_name(dtype), kind)
        module = _modules.get(key)
        if module is None:
            names = _source.module_names(family, dtype_name(dtype), kind)
            module = cupy.RawModule(code=_source.cupy_source(),
                                    options=_source.compile_options(), name_expressions=names)
            _modules[key] = module
        kernel = _functions[(device, name)] = module.get_function(name)
    return kernel


def upload_coefficients(coeffs):
    """The coefficient struct in device memory (HEADER_BYTES bytes)."""
    host = np.zeros(HEADER_BYTES, dtype=np.uint8)
    coefficient_bytes(coeffs, host)
    return cupy.asarray(host)


def upload_table(host):
    """The uint8 table ``host`` in device memory, for the kernels launched next on the current
    stream; returns a uint8 device array of at least ``host.nbytes`` bytes.

    One cudaMemcpyAsync into a buffer kept per (device, stream, thread): the host does not wait
    for the GPU (a pageable source is staged by the driver before the call returns), and the
    copy is ordered after the kernels this thread already launched on that stream, which read
    the buffer's previous table.  Per thread, because two threads share the null stream: one
    thread's upload could otherwise land between another's upload and launch.
    (``cupy.asarray`` took a pinned staging buffer and recorded an event for every step.)  A
    buffer dropped here goes back to CuPy's pool, which reuses it only on its stream."""
    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.runtime.getDevice(), stream.ptr, threading.get_ident())
    buf = _tables.get(key)
    if buf is None or buf.nbytes < host.nbytes:
        if len(_tables) >= _MAX_TABLE_BUFFERS:  # streams made and dropped: forget them all
            _tables.clear()
        buf = _tables[key] = cupy.empty(max(host.nbytes, 4096), dtype=np.uint8)
    runtime = cupy.cuda.runtime
    runtime.memcpyAsync(buf.data.ptr, host.ctypes.data, host.nbytes,
                        runtime.memcpyHostToDevice, stream.ptr)
    return buf
