"""Compiled CUDA modules and the coefficient struct's bytes (imports CuPy).

``function(family, dtype, kind, name)`` returns the kernel ``name`` of the module (family, dtype,
kind) on the current device, compiling the module with ``cupy.RawModule`` (NVRTC) the first time
it is needed on that device; ``_source.module_names`` lists what each module instantiates.

``coefficient_bytes(coeffs)`` lays a coefficient object out as its C struct (the field order of
include/fastadam/adam.h, adagrad.h, momentum.h, C alignment), ready to copy to the device.
"""
import cupy
import numpy as np

from .._coeffs import KIND_ADAGRAD, KIND_ADAM, KIND_MOMENTUM
from . import _source

HEADER_BYTES = 128  # FA_CUDA_HEADER in kernels.cu
CHUNK = 4096        # FA_CUDA_CHUNK in kernels.cu
THREADS = 256

# The coefficient structs, field by field in declaration order (the headers are the truth; a
# CPU test checks these lists against them).
STRUCT_FIELDS = {
    KIND_ADAM: ["alpha", "denom_scale", "eps", "beta1", "beta2", "sign", "grad_scale", "l2",
                "decay_mul", "post_mul", "flags"],
    KIND_ADAGRAD: ["lr", "eps", "sign", "grad_scale", "l2", "flags"],
    KIND_MOMENTUM: ["lr", "a", "b", "an", "idle_rate", "sign", "grad_scale", "l2", "flags"],
}
STRUCT_DTYPES = {
    kind: np.dtype([(f, np.int32 if f == "flags" else np.float64) for f in fields], align=True)
    for kind, fields in STRUCT_FIELDS.items()
}

_modules = {}


def dtype_name(dtype):
    return np.dtype(dtype).name


def function(family, dtype, kind, name):
    key = (cupy.cuda.Device().id, family, dtype_name(dtype), kind)
    module = _modules.get(key)
    if module is None:
        names = _source.module_names(family, dtype_name(dtype), kind)
        module = cupy.RawModule(code=_source.source(), options=_source.compile_options(),
                                name_expressions=names)
        _modules[key] = module
    return module.get_function(name)


def coefficient_bytes(coeffs, out):
    """Write the coefficient struct of ``coeffs`` at the start of the uint8 array ``out``."""
    dt = STRUCT_DTYPES[coeffs.kind]
    fields = coeffs.as_dict()
    record = out[:dt.itemsize].view(dt)
    for name in STRUCT_FIELDS[coeffs.kind]:
        record[name] = fields[name]
    return out


def upload_coefficients(coeffs):
    """The coefficient struct in device memory (HEADER_BYTES bytes)."""
    host = np.zeros(HEADER_BYTES, dtype=np.uint8)
    coefficient_bytes(coeffs, host)
    return cupy.asarray(host)
