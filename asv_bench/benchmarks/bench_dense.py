"""Dense Adam step: fastadam.step_inplace beside a NumPy implementation and PyTorch's fused
CPU Adam (``torch.optim.Adam(fused=True)``), plus the fraction of memory bandwidth reached.

Inputs are seeded and built in ``setup``; every timed call is one full step (``t`` fixed, so each
call does the same work).  PyTorch benchmarks raise NotImplementedError in ``setup`` when torch
is not importable, which asv reports as skipped.
"""
import numpy as np

import fastadam

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

BYTES_PER_ELEMENT_F32 = 28  # read x, g, m, v; write x, m, v (4 bytes each)

SIZES = [10**3, 10**4, 10**5, 10**6, 10**7]
THREADS = [1, 2]


def _seeded(dtype, shapes, seed=0):
    """x, g (standard normal) and zero m, v for each shape, all of ``dtype``."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    gs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return xs, gs, [np.zeros_like(x) for x in xs], [np.zeros_like(x) for x in xs]


def _torch_or_skip(dtype, threads):
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch is not installed")
    if dtype == "float16":
        raise NotImplementedError("no float16 comparison with torch")
    torch.set_num_threads(threads)
    return torch


class DenseStep:
    """One tensor: dtype x size x threads."""

    params = (["float32", "float64"], _api.smoke_grid(SIZES, [10**3, 10**6]), THREADS)
    param_names = ["dtype", "size", "threads"]
    timeout = 120

    def setup(self, dtype, size, threads):
        (self.x,), (self.g,), (self.m,), (self.v,) = _seeded(dtype, [size])
        self.tmp = np.empty_like(self.x)
        self.numpy_adam_step = _api.bench_attr("numpy_adam_step")

    def time_fastadam_step(self, dtype, size, threads):
        fastadam.step_inplace(self.x, self.g, self.m, self.v, 10, num_threads=threads)

    def time_numpy_step(self, dtype, size, threads):
        self.numpy_adam_step(self.x, self.g, self.m, self.v, 10, self.tmp)

    def peakmem_fastadam_step(self, dtype, size, threads):
        fastadam.step_inplace(self.x, self.g, self.m, self.v, 10, num_threads=threads)


class DenseStepTorch:
    """PyTorch's fused Adam on the same inputs as DenseStep, float32 (the dtype the comparison
    is about; one process per parameter set imports torch, which is what the smoke run's time
    goes on).  Skipped without torch."""

    params = (["float32"], _api.smoke_grid(SIZES, [10**3, 10**6]), THREADS)
    param_names = DenseStep.param_names
    timeout = 120

    def setup(self, dtype, size, threads):
        _torch_or_skip(dtype, threads)
        (x,), (g,), _, _ = _seeded(dtype, [size])
        self.opt = _api.bench_attr("torch_fused_adam")([x], [g])

    def time_torch_fused_step(self, dtype, size, threads):
        self.opt.step()


class DenseMultiTensor:
    """A list of 1000 tensors of 1e3..1e4 elements (seeded sizes): one fused call for all."""

    params = (["float32"], THREADS)
    param_names = ["dtype", "threads"]
    timeout = 120

    def setup(self, dtype, threads):
        sizes = np.random.default_rng(1).integers(10**3, 10**4, size=1000, endpoint=True)
        self.xs, self.gs, self.ms, self.vs = _seeded(dtype, [int(s) for s in sizes])
        self.tmps = [np.empty_like(x) for x in self.xs]
        self.numpy_adam_step = _api.bench_attr("numpy_adam_step")

    def time_fastadam_step(self, dtype, threads):
        fastadam.step_inplace(self.xs, self.gs, self.ms, self.vs, 10, num_threads=threads)

    def time_numpy_step(self, dtype, threads):
        for x, g, m, v, tmp in zip(self.xs, self.gs, self.ms, self.vs, self.tmps):
            self.numpy_adam_step(x, g, m, v, 10, tmp)

    def peakmem_fastadam_step(self, dtype, threads):
        fastadam.step_inplace(self.xs, self.gs, self.ms, self.vs, 10, num_threads=threads)


class DenseMultiTensorTorch:
    """PyTorch's fused Adam over the same 1000 tensors (skipped without torch)."""

    params = DenseMultiTensor.params
    param_names = DenseMultiTensor.param_names
    timeout = 120

    def setup(self, dtype, threads):
        _torch_or_skip(dtype, threads)
        sizes = np.random.default_rng(1).integers(10**3, 10**4, size=1000, endpoint=True)
        xs, gs, _, _ = _seeded(dtype, [int(s) for s in sizes])
        self.opt = _api.bench_attr("torch_fused_adam")(xs, gs)

    def time_torch_fused_step(self, dtype, threads):
        self.opt.step()


class DenseBandwidth:
    """The numbers that matter, measured in one process with interleaved repeats:
    the float32 step's fraction of the memory bandwidth (``stream_rw_f32`` moves the same
    28 bytes per element with no arithmetic), and the bandwidth itself."""

    params = ([10**6, 10**7], THREADS)
    param_names = ["size", "threads"]
    timeout = 120

    def setup(self, size, threads):
        median_seconds_interleaved, stream_rw_f32 = _api.timer(), _api.stream_rw_f32()
        (self.x, self.a), (self.g, self.d), (self.m, self.b), (self.v, self.c) = _seeded(
            "float32", [size, size])
        self.seconds = median_seconds_interleaved({
            "adam": lambda: fastadam.step_inplace(self.x, self.g, self.m, self.v, 10,
                                                  num_threads=threads),
            "stream": lambda: stream_rw_f32(self.a, self.d, self.b, self.c, threads),
        }, repeats=5, min_time=0.02)
        self.size = size

    def track_bandwidth_fraction(self, size, threads):
        return self.seconds["stream"] / self.seconds["adam"]

    track_bandwidth_fraction.unit = "fraction of stream_rw_f32 bandwidth, higher is better"

    def track_stream_bandwidth(self, size, threads):
        return self.size * BYTES_PER_ELEMENT_F32 / self.seconds["stream"] / 1e9

    track_stream_bandwidth.unit = "GB/s"

    def track_step_bandwidth(self, size, threads):
        return self.size * BYTES_PER_ELEMENT_F32 / self.seconds["adam"] / 1e9

    track_step_bandwidth.unit = "GB/s"


class DenseSpeedupVsTorch:
    """fastadam's speed-up over PyTorch's fused Adam, float32, timed in one process (each in a
    block of its own: the two OpenMP runtimes must not interleave).  Skipped without torch."""

    params = ([10**5, 10**7], THREADS)
    param_names = ["size", "threads"]
    timeout = 120

    def setup(self, size, threads):
        _torch_or_skip("float32", threads)
        median_seconds_interleaved = _api.timer()
        (x, xt), (g, gt), (m, _), (v, _) = _seeded("float32", [size, size])
        opt = _api.bench_attr("torch_fused_adam")([xt], [gt])
        fa = median_seconds_interleaved(
            {"fastadam": lambda: fastadam.step_inplace(x, g, m, v, 10, num_threads=threads)},
            repeats=5, min_time=0.02)["fastadam"]
        tf = median_seconds_interleaved({"torch": opt.step}, repeats=5, min_time=0.02)["torch"]
        self.speedup = tf / fa

    def track_speedup_vs_torch_fused(self, size, threads):
        return self.speedup

    track_speedup_vs_torch_fused.unit = "x (torch time / fastadam time), higher is better"
