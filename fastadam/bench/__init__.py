"""fastadam.bench: everything that measures fastadam and nothing the optimizers import.

- ``_timing.py``: the one timer (``sample_seconds_interleaved``: interleaved rounds, medians
  and spread) and the baselines a user would otherwise pick (a NumPy Adam, PyTorch's fused Adam).
- ``_report.py``: ``python -m fastadam bench`` (table, plot with error bars, implausible
  results flagged).
- ``_yardstick.pyx``: the memory-bandwidth yardstick, ``stream_rw_f32``, which moves an Adam
  step's traffic with no arithmetic, and ``stream_rw_bits``, the traffic of a step with
  bfloat16 or 8-bit arrays (kernels in include/fastadam/yardstick.c); ``step_bytes_per_element``
  counts the bytes of each format, and ``format_stream`` builds the stream loop of one format's
  step on scratch arrays.

The asv suite (asv_bench/) and the report scripts import their timers and baselines from here.
"""
import numpy as _np

from ._report import add_arguments as add_report_arguments
from ._report import flag_implausible, main, measure_dense
from ._report import run as run_report
from ._timing import (BYTES_PER_ELEMENT_F32, median_seconds, median_seconds_interleaved,
                      numpy_adam_step, sample_seconds_interleaved, step_bytes_per_element,
                      torch_fused_adam)
from ._yardstick import stream_rw_bits, stream_rw_f32


def format_stream(param_bytes, state_bytes, size, block=256, num_threads=1):
    """A callable that moves the bytes of one low-precision Adam step of ``size`` elements
    with no arithmetic: ``stream_rw_bits`` on scratch arrays, parameters and gradients of
    ``param_bytes`` (4 float32, 2 bfloat16), two states of ``state_bytes`` (4, 2, or 1 with
    one float32 scale per ``block`` each)."""
    kinds = {4: _np.uint32, 2: _np.uint16, 1: _np.uint8}
    for name, width in (("param_bytes", param_bytes), ("state_bytes", state_bytes)):
        if width not in kinds:
            raise ValueError(f"{name}: expected 4, 2 or 1, got {width!r}")
    if param_bytes == 1:
        raise ValueError("param_bytes: expected 4 or 2 (parameters are float32 or bfloat16)")
    x, g = _np.zeros(size, kinds[param_bytes]), _np.ones(size, kinds[param_bytes])
    a, b = _np.zeros(size, kinds[state_bytes]), _np.zeros(size, kinds[state_bytes])
    scales = None
    if state_bytes == 1:
        scales = tuple(_np.zeros(-(-size // block), _np.float32) for _ in range(2))
    return lambda: stream_rw_bits(x, g, a, b, scales=scales, block=block,
                                  num_threads=num_threads)


__all__ = ["BYTES_PER_ELEMENT_F32", "add_report_arguments", "flag_implausible", "format_stream",
           "main", "measure_dense", "run_report",
           "median_seconds", "median_seconds_interleaved", "numpy_adam_step",
           "sample_seconds_interleaved", "step_bytes_per_element", "stream_rw_bits",
           "stream_rw_f32", "torch_fused_adam"]
