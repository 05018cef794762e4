"""The timers and baselines of fastadam's benchmarks (``python -m fastadam bench``, the asv
suite under asv_bench/benchmarks/ and the report scripts under asv_bench/ all use these).

- ``sample_seconds_interleaved``: the one timing loop (interleaved rounds, calibrated inner
  loop); ``median_seconds_interleaved`` and ``median_seconds`` reduce it to medians.
- ``numpy_adam_step``: an Adam step in in-place NumPy ufuncs; ``torch_fused_adam``: PyTorch's
  fused CPU Adam over NumPy arrays.  An fp32 Adam step reads x, g, m, v and writes x, m, v:
  ``BYTES_PER_ELEMENT_F32`` = 28 bytes per element.
"""
import math
import time

import numpy as np

BYTES_PER_ELEMENT_F32 = 28  # read x, g, m, v; write x, m, v (7 x 4 bytes)


def step_bytes_per_element(param=4, grad=4, state=4, slots=2, block=None, master=False):
    """Bytes an optimizer step moves per parameter element once the arrays leave the caches:
    the parameter read and written (``param`` bytes each way), the gradient read, each of
    ``slots`` states read and written (``state`` bytes), with ``block``: one float32 scale per
    block and slot read and written (8-bit states), with ``master``: a float32 master copy
    read and written beside the parameter, which is then only written.  float32 Adam:
    ``step_bytes_per_element() == 28``; 8-bit states, block 256: 16.0625."""
    total = 2 * param + grad + 2 * slots * state
    if block is not None:
        total += 2 * slots * 4 / block
    if master:
        total += 2 * 4 - param  # the master read and written; the parameter is not read
    return total

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def numpy_adam_step(x, g, m, v, t, tmp, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS):
    """The baseline: one Adam step ("tf" convention of ``fastadam.step_inplace``) written with
    in-place NumPy ufuncs, ``tmp`` a scratch array like ``x`` (so the step allocates nothing)."""
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    m *= beta1
    np.multiply(g, 1.0 - beta1, out=tmp)
    m += tmp
    v *= beta2
    np.multiply(g, g, out=tmp)
    tmp *= 1.0 - beta2
    v += tmp
    np.sqrt(v, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= alpha
    x -= tmp


def torch_fused_adam(xs, gs):
    """``torch.optim.Adam(fused=True)`` over NumPy arrays (shared memory, no copy), with its
    state created by one warm-up step.  Returns the optimizer; raises ImportError without torch."""
    import torch

    params = []
    for x, g in zip(xs, gs):
        p = torch.from_numpy(x)
        p.grad = torch.from_numpy(g)
        params.append(p)
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, fused=True)
    opt.step()
    return opt


def sample_seconds_interleaved(cases, repeats=5, min_time=0.02, inner=None, warmup=1,
                               clock=time.perf_counter):
    """Seconds per call of each function in the dict ``cases``: ``repeats`` samples each.

    The one timer of fastadam's benchmarks.  Each function gets ``warmup`` calls, then (unless
    ``inner`` fixes it) a calibration of how many back-to-back calls last about ``min_time``
    seconds; then each of the ``repeats`` rounds times every function in turn (``inner`` calls,
    divided), so that load from other processes on a shared machine hits all of them alike and
    ratios stay fair.  ``clock`` reads the time: wall time by default; ``time.thread_time``
    counts only the CPU time of the calling thread (for single-threaded contenders on a machine
    shared with other processes, where wall time counts their time slices too).  Returns
    ``{name: ndarray of repeats seconds}``."""
    calls = {}
    for name, fn in cases.items():
        for _ in range(warmup):
            fn()
        if inner is not None:
            calls[name] = int(inner)
            continue
        start = clock()
        fn()
        calls[name] = max(1, int(min_time / max(clock() - start, 1e-9)))
    samples = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            n = calls[name]
            start = clock()
            for _ in range(n):
                fn()
            samples[name].append((clock() - start) / n)
    return {name: np.asarray(times) for name, times in samples.items()}


def median_seconds_interleaved(cases, repeats=5, min_time=0.02, inner=None, warmup=1):
    """Median seconds per call of each function (see :func:`sample_seconds_interleaved`)."""
    samples = sample_seconds_interleaved(cases, repeats, min_time, inner, warmup)
    return {name: float(np.median(times)) for name, times in samples.items()}


def median_seconds(fn, repeats=5, min_time=0.02, inner=None, warmup=1):
    """Median seconds of one ``fn()`` call (see :func:`sample_seconds_interleaved`)."""
    return median_seconds_interleaved({"fn": fn}, repeats, min_time, inner, warmup)["fn"]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


