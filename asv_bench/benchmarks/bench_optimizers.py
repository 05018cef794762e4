"""Adagrad and momentum (SGD) steps: fastadam's functional steps beside the matching torch
optimizer (foreach), and their fraction of the memory bandwidth (a step with one state slot
moves 20 bytes per float32 element, as ``stream_rw_f32(a, d, b)`` does).

The report script asv_bench/optimizers_report.py prints the same ratios side by side.
"""
import numpy as np

import fastadam

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

OPTIMIZERS = ["adagrad", "momentum"]


def _step(name):
    if name == "adagrad":
        return lambda x, g, s, nt: fastadam.adagrad_step_inplace(x, g, s, 10, lr=0.01,
                                                                 num_threads=nt)
    return lambda x, g, s, nt: fastadam.momentum_step_inplace(x, g, s, 10, lr=0.01,
                                                              momentum=0.9, num_threads=nt)


def _torch_optimizer(name, x, g):
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch is not installed")
    torch.set_num_threads(1)
    p = torch.from_numpy(x).requires_grad_()
    p.grad = torch.from_numpy(g)
    if name == "adagrad":
        return torch.optim.Adagrad([p], lr=0.01, foreach=True)
    return torch.optim.SGD([p], lr=0.01, momentum=0.9, foreach=True)


def _seeded(size, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(size).astype(np.float32),
            rng.standard_normal(size).astype(np.float32), np.zeros(size, np.float32))


class OptimizerStep:
    """One float32 tensor, 1 thread: time per step of fastadam's Adagrad and momentum steps."""

    params = (OPTIMIZERS, [10**3, 10**4, 10**6])
    param_names = ["optimizer", "size"]

    def setup(self, optimizer, size):
        _api.need("adagrad_step_inplace", "momentum_step_inplace")
        self.x, self.g, self.s = _seeded(size)
        self.step = _step(optimizer)

    def time_fastadam_step(self, optimizer, size):
        self.step(self.x, self.g, self.s, 1)


class OptimizerRatios:
    """The ratios that matter, measured in one process: speed-up over torch (foreach) at 1e3 and
    1e4 elements (goal >= 5x), and the fraction of stream bandwidth at 1e7 (goal >= 0.9)."""

    params = (OPTIMIZERS,)
    param_names = ["optimizer"]
    timeout = 120

    def setup(self, optimizer):
        _api.need("adagrad_step_inplace", "momentum_step_inplace")
        median_seconds_interleaved = _api.timer()
        stream_rw_f32 = _api.stream_rw_f32(arrays=3)
        step = _step(optimizer)
        self.speedups = {}
        for size in (10**3, 10**4):
            x, g, s = _seeded(size)
            opt = _torch_optimizer(optimizer, x.copy(), g.copy())
            r = median_seconds_interleaved({"fastadam": lambda: step(x, g, s, 1),
                                            "torch": opt.step}, repeats=5, min_time=0.01)
            self.speedups[size] = r["torch"] / r["fastadam"]
        x, g, s = _seeded(10**7)
        a, d, b = _seeded(10**7, seed=1)
        r = median_seconds_interleaved({"fastadam": lambda: step(x, g, s, 1),
                                        "stream": lambda: stream_rw_f32(a, d, b, None, 1)},
                                       repeats=5, min_time=0.02)
        self.fraction = r["stream"] / r["fastadam"]

    def track_speedup_vs_torch_1e3(self, optimizer):
        return self.speedups[10**3]

    track_speedup_vs_torch_1e3.unit = "x (torch time / fastadam time), higher is better"

    def track_speedup_vs_torch_1e4(self, optimizer):
        return self.speedups[10**4]

    track_speedup_vs_torch_1e4.unit = "x (torch time / fastadam time), higher is better"

    def track_bandwidth_fraction(self, optimizer):
        return self.fraction

    track_bandwidth_fraction.unit = ("fraction of stream_rw_f32(a, d, b) bandwidth, "
                                     "higher is better")
