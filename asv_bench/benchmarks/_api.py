"""What the benchmarks need from the fastadam under test, found where each commit keeps it.

asv runs today's benchmark suite against old commits too (history runs, asv_bench/history.sh).
A benchmark that needs something an old commit lacks must be *skipped* there, not fail: asv
reports ``NotImplementedError`` raised in ``setup`` as skipped (``n/a``).  So the benchmark
modules import only ``numpy`` and ``fastadam`` at module level and ask this module, in
``setup``, for the rest:

- ``timer()``: the interleaved median timer, ``fastadam.bench.median_seconds_interleaved``
  (``fastadam._bench`` before issue 8 moved it);
- ``stream_rw_f32(arrays=4)``: the bandwidth yardstick (``fastadam._dense`` before issue 8;
  ``arrays=3``: its read-3/write-2 form);
- ``need(*names)``: public fastadam attributes (``"sparse_step_inplace"``,
  ``"adagrad_step_inplace"``) or modules (``"fastadam.onnx"``), else NotImplementedError.

``smoke_grid(full, smoke)``: the parameter values of a ``time_*``/``peakmem_*`` benchmark, ``full``
normally and ``smoke`` when ``FASTADAM_ASV_SMOKE=1`` (set by ``gate.py --all``, CI's smoke run:
every benchmark must run once, and the largest combinations of the absolute-time benchmarks
are most of its cost). The gated ``track_*`` ratios never use it: their grid is the history's.
"""
import importlib
import os


def smoke_grid(full, smoke):
    """``smoke`` inside CI's asv smoke run (``FASTADAM_ASV_SMOKE=1``), else ``full``."""
    return smoke if os.environ.get("FASTADAM_ASV_SMOKE") == "1" else full


def _first(places, name):
    for module in places:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise NotImplementedError(f"this fastadam has no {name} (looked in {', '.join(places)})")


def timer():
    """``median_seconds_interleaved(cases, repeats=5, min_time=0.02)`` of this commit."""
    return _first(["fastadam.bench", "fastadam._bench"], "median_seconds_interleaved")


def stream_rw_f32(arrays=4):
    """``stream_rw_f32(a, d, b, c, num_threads)`` of this commit.  ``arrays=3``: one that also
    takes ``c=None`` (read 3, write 2; since the Adagrad/momentum benchmarks came)."""
    stream = _first(["fastadam.bench", "fastadam._dense"], "stream_rw_f32")
    if arrays == 3:
        import numpy as np
        empty = np.zeros(0, np.float32)
        try:
            stream(empty, empty.copy(), empty.copy(), None, 1)
        except TypeError:
            raise NotImplementedError("this fastadam's stream_rw_f32 needs four arrays") from None
    return stream


def bench_attr(name):
    """Another name from ``fastadam.bench`` (or ``fastadam._bench`` before issue 8)."""
    return _first(["fastadam.bench", "fastadam._bench"], name)


def need(*names):
    """Import each dotted module name, or check each public ``fastadam`` attribute."""
    import fastadam
    for name in names:
        if "." in name:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise NotImplementedError(f"{name} cannot be imported here: {exc}") from None
        elif not hasattr(fastadam, name):
            raise NotImplementedError(f"this fastadam has no fastadam.{name}")


def torch_or_skip(threads=1):
    """torch with ``threads`` intra-op threads, or NotImplementedError without torch."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch is not installed") from None
    torch.set_num_threads(threads)
    return torch
