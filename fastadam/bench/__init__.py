"""fastadam.bench: everything that measures fastadam and nothing the optimizers import.

- ``_timing.py``: the one timer (``sample_seconds_interleaved``: interleaved rounds, medians
  and spread) and the baselines a user would otherwise pick (a NumPy Adam, PyTorch's fused Adam).
- ``_report.py``: ``python -m fastadam bench`` (table, plot with error bars, implausible
  results flagged).
- ``_yardstick.pyx``: the memory-bandwidth yardstick, ``stream_rw_f32``, which moves an Adam
  step's traffic with no arithmetic, and ``stream_rw_bits``, the traffic of a step with
  bfloat16 or 8-bit arrays (kernels in include/fastadam/yardstick.c); ``step_bytes_per_element``
  counts the bytes of each format.
The asv suite (asv_bench/) and the report scripts import their timers and baselines from here.
"""
from ._report import flag_implausible, main, measure_dense
from ._timing import (BYTES_PER_ELEMENT_F32, median_seconds, median_seconds_interleaved,
                      numpy_adam_step, sample_seconds_interleaved, step_bytes_per_element,
                      torch_fused_adam)
from ._yardstick import stream_rw_bits, stream_rw_f32

__all__ = ["BYTES_PER_ELEMENT_F32", "flag_implausible", "main", "measure_dense",
           "median_seconds", "median_seconds_interleaved", "numpy_adam_step",
           "sample_seconds_interleaved", "step_bytes_per_element", "stream_rw_bits",
           "stream_rw_f32", "torch_fused_adam"]
