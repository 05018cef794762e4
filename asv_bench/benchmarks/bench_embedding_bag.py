"""asv benchmarks of the fused embedding-bag step (fastadam.embedding_bag_step_inplace).

A 1e6 x 64 table (1e5 in CI's smoke run), 65536 lookups in bags of ``pooling_factor`` ids,
drawn uniformly or Zipf-like (bench_sparse.draw_indices).  Beside the fused step: the same step
through the general path (the bags expanded in NumPy into one gradient row per id, then
``sparse_step_inplace``: the number the fused path earns its place with), and, where torch is
installed, ``nn.EmbeddingBag(sparse=True)``'s backward plus ``torch.optim.SparseAdam``'s step
(what a torch model runs; the forward lookup, the same on both sides, is not timed).
``EmbeddingBagRatioVsTorch`` records the speed-up over torch, timed in interleaved rounds.
"""
import numpy as np

import fastadam

try:
    from . import _api
    from .bench_sparse import draw_indices, make_table
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api
    from bench_sparse import draw_indices, make_table

ROW = 64
LOOKUPS = 65536
TIME_ROWS = _api.smoke_grid(1_000_000, 100_000)
TIME_PARAMS = _api.smoke_grid(
    ([1, 20], ["uniform", "zipf"], [1, 2]),
    ([20], ["zipf"], [1]))


def bag_inputs(seed, n_rows, pooling_factor, distribution):
    """ids, offsets (bags of pooling_factor ids), the pooled output's gradient, weights."""
    rng = np.random.default_rng(seed)
    ids = draw_indices(rng, n_rows, LOOKUPS, distribution)
    offsets = np.arange(0, LOOKUPS, pooling_factor, dtype=np.int64)
    grad_out = rng.standard_normal((offsets.shape[0], ROW)).astype(np.float32)
    weights = rng.uniform(0.5, 1.5, LOOKUPS).astype(np.float32)
    return ids, offsets, grad_out, weights


def expanded_rows(offsets, grad_out, n_ids):
    """The general path's input: one gradient row per id (sum pooling)."""
    lengths = np.diff(np.append(offsets, n_ids))
    return grad_out.take(np.repeat(np.arange(offsets.shape[0]), lengths), axis=0)


class TorchEmbeddingBagSparseAdam:
    """nn.EmbeddingBag(sparse=True) on a copy of the table; step(): backward + SparseAdam."""

    def __init__(self, x, ids, offsets, grad_out, threads):
        torch = _api.torch_or_skip(threads)
        self.bag = torch.nn.EmbeddingBag(x.shape[0], x.shape[1], mode="sum", sparse=True,
                                         _weight=torch.from_numpy(x.copy()))
        self.opt = torch.optim.SparseAdam(self.bag.parameters(), lr=1e-3)
        self.out = self.bag(torch.from_numpy(ids), torch.from_numpy(offsets))
        self.grad_out = torch.from_numpy(grad_out)

    def step(self):
        self.opt.zero_grad()
        self.out.backward(self.grad_out, retain_graph=True)
        self.opt.step()


class _Inputs:
    params = TIME_PARAMS
    param_names = ["pooling_factor", "distribution", "threads"]
    timeout = 300

    def setup(self, pooling_factor, distribution, threads):
        _api.need("embedding_bag_step_inplace")
        self.x, self.m, self.v = make_table(TIME_ROWS, ROW, "float32")
        self.ids, self.offsets, self.grad_out, self.weights = bag_inputs(
            42, TIME_ROWS, pooling_factor, distribution)
        self.state = {"m": self.m, "v": self.v}


class EmbeddingBagStep(_Inputs):
    """The fused bag step (lazy Adam) and the general path on the expanded gradient."""

    def time_fastadam_fused_sum(self, pooling_factor, distribution, threads):
        fastadam.embedding_bag_step_inplace(self.x, self.ids, self.offsets, self.grad_out,
                                            self.state, 1, lr=1e-3, num_threads=threads)

    def time_fastadam_fused_mean(self, pooling_factor, distribution, threads):
        fastadam.embedding_bag_step_inplace(self.x, self.ids, self.offsets, self.grad_out,
                                            self.state, 1, pooling="mean", lr=1e-3,
                                            num_threads=threads)

    def time_fastadam_fused_weighted(self, pooling_factor, distribution, threads):
        fastadam.embedding_bag_step_inplace(self.x, self.ids, self.offsets, self.grad_out,
                                            self.state, 1, per_sample_weights=self.weights,
                                            lr=1e-3, num_threads=threads)

    def time_expand_then_sparse_step(self, pooling_factor, distribution, threads):
        rows = expanded_rows(self.offsets, self.grad_out, self.ids.shape[0])
        fastadam.sparse_step_inplace(self.x, (self.ids, rows), self.m, self.v, 1, lr=1e-3,
                                     num_threads=threads)


class EmbeddingBagStepTorch(_Inputs):
    """nn.EmbeddingBag(sparse=True) backward + torch.optim.SparseAdam (skipped without
    torch)."""

    def setup(self, pooling_factor, distribution, threads):
        super().setup(pooling_factor, distribution, threads)
        self.torch_bag = TorchEmbeddingBagSparseAdam(self.x, self.ids, self.offsets,
                                                     self.grad_out, threads)

    def time_torch_backward_sparse_adam(self, pooling_factor, distribution, threads):
        self.torch_bag.step()


class EmbeddingBagRatioVsTorch:
    """The fused bag step's speed-up over nn.EmbeddingBag(sparse=True) + SparseAdam, float32,
    1 thread, both timed in interleaved rounds in one process."""

    params = ([1, 20], ["uniform", "zipf"])
    param_names = ["pooling_factor", "distribution"]
    timeout = 300

    def setup(self, pooling_factor, distribution):
        _api.need("embedding_bag_step_inplace")
        median_seconds_interleaved = _api.timer()
        x, m, v = make_table(TIME_ROWS, ROW, "float32")
        ids, offsets, grad_out, _ = bag_inputs(42, TIME_ROWS, pooling_factor, distribution)
        torch_bag = TorchEmbeddingBagSparseAdam(x, ids, offsets, grad_out, 1)
        state = {"m": m, "v": v}
        seconds = median_seconds_interleaved({
            "fastadam": lambda: fastadam.embedding_bag_step_inplace(
                x, ids, offsets, grad_out, state, 1, lr=1e-3, num_threads=1),
            "torch": torch_bag.step,
        }, repeats=7, min_time=0.05)
        self.speedup = seconds["torch"] / seconds["fastadam"]

    def track_speedup_vs_torch_embedding_bag(self, pooling_factor, distribution):
        return self.speedup

    track_speedup_vs_torch_embedding_bag.unit = "x (torch time / fastadam time), higher is better"
