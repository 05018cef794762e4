"""Compiled CUDA modules and the coefficient struct's bytes (imports CuPy).

``function(family, dtype, kind, name)`` returns the kernel ``name`` of the module (family, dtype,
kind) on the current device, compiling the module with ``cupy.RawModule`` (NVRTC) the first time
it is needed on that device; ``_source.module_names`` lists what each module instantiates.

``upload_coefficients(coeffs)`` copies a coefficient object's C struct (laid out by
``_layout.py``) to the device.
"""
import cupy
import numpy as np

from . import _source
from ._layout import HEADER_BYTES, coefficient_bytes

THREADS = 256

_modules = {}    # (device, family, dtype, kind) -> RawModule
_functions = {}  # (device, name expression) -> kernel


def dtype_name(dtype):
    """A dtype's name; a str is a name already (the low-precision formats: "bfloat16" needs no
    ml_dtypes here)."""
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


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
