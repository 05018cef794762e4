"""asv benchmarks of sparse Adam (fastadam.sparse_step_inplace) and fastadam.segment_sum.

An embedding table of N_ROWS x ROW float32/float64 rows; gradients of `batch` indices drawn
uniformly or Zipf-like (so with many duplicates).  Each capability has its NumPy baseline
(np.unique + np.add.at) and, where PyTorch is installed, its torch baseline beside it
(torch.optim.SparseAdam with the gradient's coalescing; torch.Tensor.coalesce for the sum).
asv_bench/sparse_report.py prints the same comparisons side by side as ratios.
"""
import numpy as np

import fastadam

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

N_ROWS = 1_000_000
ROW = 64
# the time_* grids: smaller in CI's smoke run (_api.smoke_grid), where each benchmark runs once
TIME_ROWS = _api.smoke_grid(N_ROWS, 100_000)
TIME_PARAMS = _api.smoke_grid(
    (["float32", "float64"], [4096, 65536], ["uniform", "zipf"], [1, 2]),
    (["float32", "float64"], [4096], ["zipf"], [1, 2]))
ZIPF_A = 1.2  # exponent of the Zipf-like draw: the top row gets ~1/5 of a batch


def draw_indices(rng, n_rows, batch, distribution):
    """Seeded indices: "uniform" over the rows, or "zipf" (heavy repeats, scattered rows)."""
    if distribution == "uniform":
        return rng.integers(0, n_rows, size=batch, dtype=np.int64)
    ranks = (rng.zipf(ZIPF_A, size=batch) - 1) % n_rows  # the rare draws past the end wrap
    # scatter ranks over the table so frequent rows are not neighbours in memory
    return (ranks * 2654435761 % n_rows).astype(np.int64)


def make_table(n_rows, row, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, row), dtype=np.float32).astype(dtype, copy=False)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    return x, m, v


def numpy_sparse_adam(x, m, v, indices, values, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
    """The NumPy baseline: np.unique + np.add.at, then the lazy Adam step on the unique rows."""
    rows, inverse = np.unique(indices, return_inverse=True)
    g = np.zeros((rows.shape[0],) + values.shape[1:], dtype=values.dtype)
    np.add.at(g, inverse, values)
    mr = m[rows]
    vr = v[rows]
    mr *= beta1
    mr += (1 - beta1) * g
    vr *= beta2
    vr += (1 - beta2) * (g * g)
    m[rows] = mr
    v[rows] = vr
    alpha = lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    x[rows] -= (alpha * mr / (np.sqrt(vr) + eps)).astype(x.dtype, copy=False)


def numpy_segment_sum(indices, values):
    rows, inverse = np.unique(indices, return_inverse=True)
    out = np.zeros((rows.shape[0],) + values.shape[1:], dtype=values.dtype)
    np.add.at(out, inverse, values)
    return rows, out


class TorchSparseAdam:
    """torch.optim.SparseAdam on a parameter sharing x's memory; step() includes coalescing."""

    def __init__(self, x, num_threads):
        import torch

        self.torch = torch
        torch.set_num_threads(num_threads)
        self.param = torch.nn.Parameter(torch.from_numpy(x))
        self.opt = torch.optim.SparseAdam([self.param], lr=1e-3)

    def step(self, indices, values):
        torch = self.torch
        self.param.grad = torch.sparse_coo_tensor(torch.from_numpy(indices)[None],
                                                  torch.from_numpy(values),
                                                  tuple(self.param.shape),
                                                  check_invariants=False)
        self.opt.step()


def _torch_or_skip():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise NotImplementedError("torch is not installed")


class _LazyInputs:
    """Seeded table and gradient shared by SparseAdamLazy and SparseAdamLazyTorch."""

    params = TIME_PARAMS
    param_names = ["dtype", "batch", "distribution", "threads"]
    timeout = 300

    def setup(self, dtype, batch, distribution, threads):
        rng = np.random.default_rng(42)
        self.x, self.m, self.v = make_table(TIME_ROWS, ROW, dtype)
        self.indices = draw_indices(rng, TIME_ROWS, batch, distribution)
        self.values = rng.standard_normal((batch, ROW)).astype(dtype)
        self.last = np.zeros(TIME_ROWS, np.int64)
        self.t = 1


class SparseAdamLazy(_LazyInputs):
    """Lazy sparse Adam on a 1e6 x 64 table (fastadam vs NumPy; torch in the next class)."""

    def time_fastadam_lazy(self, dtype, batch, distribution, threads):
        fastadam.sparse_step_inplace(self.x, (self.indices, self.values), self.m, self.v, 1,
                                     num_threads=threads)

    def time_fastadam_catchup(self, dtype, batch, distribution, threads):
        self.t += 1
        fastadam.sparse_step_inplace(self.x, (self.indices, self.values), self.m, self.v,
                                     self.t, mode="catchup", last_step=self.last,
                                     num_threads=threads)

    def time_numpy_unique_add_at(self, dtype, batch, distribution, threads):
        numpy_sparse_adam(self.x, self.m, self.v, self.indices, self.values, 1)


class SparseAdamLazyTorch(_LazyInputs):
    """The torch.optim.SparseAdam baseline of SparseAdamLazy (skipped without torch)."""

    def setup(self, dtype, batch, distribution, threads):
        _torch_or_skip()
        super().setup(dtype, batch, distribution, threads)
        self.torch_opt = TorchSparseAdam(self.x, threads)

    def time_torch_sparse_adam(self, dtype, batch, distribution, threads):
        self.torch_opt.step(self.indices, self.values)


class _SegmentInputs:
    params = TIME_PARAMS
    param_names = ["dtype", "batch", "distribution", "threads"]

    def setup(self, dtype, batch, distribution, threads):
        rng = np.random.default_rng(7)
        self.indices = draw_indices(rng, N_ROWS, batch, distribution)
        self.values = rng.standard_normal((batch, ROW)).astype(dtype)


class SegmentSum(_SegmentInputs):
    """Deterministic segment sum of batch x 64 rows (fastadam vs np.unique + np.add.at)."""

    def time_fastadam_segment_sum(self, dtype, batch, distribution, threads):
        fastadam.segment_sum(self.indices, self.values, num_threads=threads)

    def time_numpy_unique_add_at(self, dtype, batch, distribution, threads):
        numpy_segment_sum(self.indices, self.values)


class SegmentSumTorch(_SegmentInputs):
    """torch.Tensor.coalesce on the same input (skipped without torch)."""

    def setup(self, dtype, batch, distribution, threads):
        _torch_or_skip()
        super().setup(dtype, batch, distribution, threads)
        import torch

        torch.set_num_threads(threads)
        self.coo = torch.sparse_coo_tensor(torch.from_numpy(self.indices)[None],
                                           torch.from_numpy(self.values), (N_ROWS, ROW),
                                           check_invariants=False)

    def time_torch_coalesce(self, dtype, batch, distribution, threads):
        self.coo.coalesce()


class SparseAdamDense:
    """Dense-decay sparse Adam (TensorFlow 1) vs a dense step_inplace on the whole table."""

    params = (["float32"], [4096, 65536], ["uniform"], [1, 2])
    param_names = ["dtype", "batch", "distribution", "threads"]
    timeout = 300

    def setup(self, dtype, batch, distribution, threads):
        rng = np.random.default_rng(3)
        self.x, self.m, self.v = make_table(N_ROWS, ROW, dtype)
        self.indices = draw_indices(rng, N_ROWS, batch, distribution)
        self.values = rng.standard_normal((batch, ROW)).astype(dtype)
        self.g = np.zeros_like(self.x)

    def time_fastadam_dense_mode(self, dtype, batch, distribution, threads):
        fastadam.sparse_step_inplace(self.x, (self.indices, self.values), self.m, self.v, 1,
                                     mode="dense", num_threads=threads)

    def time_dense_step_inplace(self, dtype, batch, distribution, threads):
        fastadam.step_inplace(self.x, self.g, self.m, self.v, 1, num_threads=threads)


class SparseRatioVsTorch:
    """The ratio that matters, measured in one process: lazy sparse Adam's speed-up over
    torch.optim.SparseAdam (coalescing included on both sides: fastadam sums duplicate rows
    itself), float32, 1 thread, 4096 gradient rows of 64 on a 1e5-row table, the two timed in
    interleaved rounds.  Skipped without torch or on a commit without sparse_step_inplace."""

    params = (["uniform", "zipf"],)
    param_names = ["distribution"]
    timeout = 120

    def setup(self, distribution):
        _api.need("sparse_step_inplace")
        median_seconds_interleaved = _api.timer()
        _api.torch_or_skip(1)
        rng = np.random.default_rng(42)
        n_rows, batch = 100_000, 4096
        x, m, v = make_table(n_rows, ROW, "float32")
        indices = draw_indices(rng, n_rows, batch, distribution)
        values = rng.standard_normal((batch, ROW)).astype(np.float32)
        torch_opt = TorchSparseAdam(x.copy(), 1)
        seconds = median_seconds_interleaved({
            "fastadam": lambda: fastadam.sparse_step_inplace(x, (indices, values), m, v, 1,
                                                             num_threads=1),
            "torch": lambda: torch_opt.step(indices, values),
        }, repeats=7, min_time=0.02)
        self.speedup = seconds["torch"] / seconds["fastadam"]

    def track_speedup_vs_torch_sparse_adam(self, distribution):
        return self.speedup

    track_speedup_vs_torch_sparse_adam.unit = "x (torch time / fastadam time), higher is better"
