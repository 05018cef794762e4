"""fastadam.bench: everything that measures fastadam and nothing the optimizers import.

- ``_timing.py``: the timers (median of interleaved repeats), the baselines a user would
  otherwise pick (a NumPy Adam, PyTorch's fused Adam), and ``python -m fastadam bench``.
- ``_yardstick.pyx``: the memory-bandwidth yardstick, ``stream_rw_f32``, which moves an Adam
  step's traffic with no arithmetic (kernel in include/fastadam/yardstick.c).
The asv suite (asv_bench/) and the report scripts import their baselines from here.
"""
from ._timing import (BYTES_PER_ELEMENT_F32, main, measure_dense, median_seconds,
                      median_seconds_interleaved, numpy_adam_step, torch_fused_adam)
from ._yardstick import stream_rw_f32

__all__ = ["BYTES_PER_ELEMENT_F32", "main", "measure_dense", "median_seconds",
           "median_seconds_interleaved", "numpy_adam_step", "stream_rw_f32", "torch_fused_adam"]
