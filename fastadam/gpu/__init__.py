"""fastadam.gpu: the CuPy path of the public steps (experimental).

Design
------
The public functions (``fastadam.step_inplace`` and the other functional steps, the optimizer
objects, ``sparse_*_step_inplace``, ``segment_sum``) keep one signature and one set of checks and
messages; they dispatch on the array module.  When the parameter array ``x`` (or the first of a
list) is a ``cupy.ndarray``, the call comes here; every other array of the call must then be a
``cupy.ndarray`` on the same device (a NumPy/CuPy mix or two devices is a TypeError/ValueError
naming the argument, raised before anything is written).

- Formulas: the CUDA source (``include/fastadam/cuda/kernels.cu``) includes the same
  per-optimizer formula headers as the C kernels (``include/fastadam/adam.h``, ``adagrad.h``,
  ``momentum.h``), so each optimizer's element update is written once for both backends.  The
  hyper-parameters are folded by the same Python code (``fastadam/optim/_coefficients.py``) into
  the same coefficient struct, copied to the device with the tensor table.
- Compilation: ``cupy.RawModule`` (NVRTC) at first use, one module per (kernel family, dtype,
  optimizer) holding every flag combination, cached per device in this process (CuPy also
  caches the binaries on disk).  ``_source.py`` lists the instantiations; a CPU-only test
  compiles them all to PTX with NVRTC so CI catches compile errors without a GPU.
- Multi-tensor: one launch per step over a device-side table of pointers and sizes (one upload),
  not one launch per tensor.  ``skip_nonfinite`` runs one reduction kernel into one device flag
  that the step kernel reads on the device; the host reads the flag once to return the bool.
- Sparse: CuPy's stable argsort of the indices, segment boundaries, then one kernel that sums
  each segment in original order (deterministic, as on the CPU) and applies the optimizer row by
  row (lazy, catch-up) or over every row (dense mode).  float16 is computed in float32 (dense).
- Low precision (issue 24): ``lowp_dense_step`` and ``lowp_rows_step`` take the CPU driver's
  arguments (``fastadam._core._lowp``: bfloat16 or 8-bit block-quantized states, bfloat16
  parameters with nearest/stochastic rounding or a float32 master, bfloat16 gradients) on CuPy
  arrays, bfloat16 held as uint16 bits; their kernels use ``include/fastadam/lowp.h``'s element
  functions and give the driver's bits (see _lowp.py).

``import fastadam`` never imports CuPy: this package's ``__init__`` only tells device arrays
apart by their type; the modules that use CuPy are imported when a CuPy array is passed.
"""
from ._validation import address, explain_mix, import_cupy, is_device_array  # no CuPy
import sys as _sys

from ._plan import register as _register

_register(_sys.modules[__name__])  # the GPU rows of the driver registry (_plan.py)

__all__ = ["is_device_array", "holds_device_array", "available", "describe", "explain_mix",
           "address", "check_parameter", "check_gradient",
           "dense_step", "sparse_step", "segment_sum", "lowp_dense_step", "lowp_rows_step",
           "rowwise_dense_step", "rowwise_sparse_step"]


def holds_device_array(obj):
    """``is_device_array`` of obj, or of the first element of a list or tuple."""
    if isinstance(obj, (list, tuple)):
        return bool(obj) and is_device_array(obj[0])
    return is_device_array(obj)


def describe():
    """One line for ``fastadam.show_config()``: CuPy and CUDA versions and the devices, or why
    the GPU path is not available.  Imports CuPy if it is installed."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return "not available (CuPy not installed: pip install cupy-cuda13x or cupy-cuda12x)"
    try:
        import cupy
        runtime = cupy.cuda.runtime
        count = runtime.getDeviceCount()
        names = []
        for i in range(count):
            props = runtime.getDeviceProperties(i)
            name = props["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            names.append(f"{name} (sm_{props['major']}{props['minor']})")
        return (f"CuPy {cupy.__version__}, CUDA runtime {runtime.runtimeGetVersion()}, "
                f"{count} device(s): {', '.join(names) or 'none'}")
    except Exception as exc:  # a driver or device problem: say what it was
        return f"not available (CuPy is installed but: {exc})"


def available():
    """True if CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "not available"
        return False


# The entry points the public functions call (fastadam/optim/_functional.py,
# fastadam/optim/_sparse_functional.py, fastadam/sparse/_segments.py): CuPy is imported here,
# with a clear error if it is missing.

def check_parameter(a, name):
    """An optimizer's parameter on the GPU: a C-contiguous float ``cupy.ndarray``, returned as
    it is; TypeError/ValueError naming ``name`` otherwise (the optimizer objects' check of a
    device parameter)."""
    from ._validation import check_device_parameter
    return check_device_parameter(a, name)


def check_gradient(g, x, name, pname):
    """A dense gradient ``g`` (named ``name``) of the parameter ``x`` (named ``pname``) when
    either is on the GPU: both ``cupy.ndarray`` on one device, ``g`` of ``x``'s dtype and shape;
    returns ``g`` C-contiguous (a copy if needed: it is only read)."""
    from ._validation import check_device_gradient
    return check_device_gradient(g, x, name, pname)


def dense_step(coeffs, x, g, slots, skip_nonfinite):
    """One dense step of the optimizer ``coeffs`` on device arrays (see _dense.py)."""
    import_cupy("x")
    from ._dense import dense_step as run
    return run(coeffs, x, g, slots, skip_nonfinite)


def sparse_step(coeffs, x, grad, slots, t, mode, last_step):
    """One sparse step on device arrays (see _sparse.py); mode and t are already checked."""
    import_cupy("x")
    from ._sparse import sparse_step as run
    return run(coeffs, x, grad, slots, t, mode, last_step)


def rowwise_dense_step(coeffs, x, g, acc, skip_nonfinite):
    """One dense step of a row-wise optimizer on device arrays (see _rowwise.py)."""
    import_cupy("x")
    from ._rowwise import dense_step as run
    return run(coeffs, x, g, acc, skip_nonfinite)


def rowwise_sparse_step(coeffs, x, grad, acc, t, mode, last_step):
    """One sparse step of a row-wise optimizer on device arrays (see _rowwise.py)."""
    import_cupy("x")
    from ._rowwise import sparse_step as run
    return run(coeffs, x, grad, acc, t, mode, last_step)


def segment_sum(indices, values):
    """``fastadam.segment_sum`` on device arrays (see _sparse.py)."""
    import_cupy("indices" if is_device_array(indices) else "values")
    from ._sparse import segment_sum as run
    return run(indices, values)


def lowp_dense_step(coeffs, xs, gs, slots, scales, masters, param_fmt, grad_fmt, state_fmt,
                    block, qmap, signed_slots, rounding, seed, t, skip_nonfinite,
                    num_threads=0):
    """The low-precision dense step (bfloat16 / 8-bit states, bfloat16 parameters) on device
    arrays, with the arguments of the CPU driver's ``dense_step`` (see _lowp.py)."""
    import_cupy("xs")
    from ._lowp import lowp_dense_step as run
    return run(coeffs, xs, gs, slots, scales, masters, param_fmt, grad_fmt, state_fmt, block,
               qmap, signed_slots, rounding, seed, t, skip_nonfinite, num_threads)


def lowp_rows_step(coeffs, x, rows, values, slots, scales, master, param_fmt, state_fmt, block,
                   qmap, signed_slots, rounding, seed, t, num_threads=0):
    """The low-precision lazy sparse step on device arrays, with the arguments of the CPU
    driver's ``rows_step`` (see _lowp.py)."""
    import_cupy("x")
    from ._lowp import lowp_rows_step as run
    return run(coeffs, x, rows, values, slots, scales, master, param_fmt, state_fmt, block,
               qmap, signed_slots, rounding, seed, t, num_threads)
