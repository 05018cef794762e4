"""fastadam.torch against torch.optim on the same torch model, in one process, as ratios.

    python asv_bench/torch_report.py [--threads N] [--repeats N] [--quick]

Times ``optimizer.step()`` (gradients already in ``.grad``, float32) for:
  1. 100 parameters of 1e3 elements: fastadam.torch.Adam vs torch.optim.Adam(foreach=True) and
     Adam(fused=True) — the per-step cost of many small tensors;
  2. one parameter of 1e7 elements: the same three (memory-bandwidth bound);
  3. a sparse embedding (1e6 x 64, 65536 looked-up rows, Zipf(1.3) as in the sparse report):
     fastadam.torch.SparseAdam vs torch.optim.SparseAdam, and fastadam.torch.Adam's lazy step.
DeepSpeed's ``DeepSpeedCPUAdam`` is timed beside row 1 and 2 when ``deepspeed`` imports and
its CPU op builds (about 80 s of JIT compilation on first use); otherwise the report says so.
Timings alternate between contenders (fastadam.bench.median_seconds_interleaved).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
from fastadam.bench import median_seconds_interleaved  # noqa: E402

import torch  # noqa: E402
import fastadam.torch as ft  # noqa: E402


def params_with_grads(count, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(size, generator=g)) for _ in range(count)]
    for p in ps:
        p.grad = torch.randn(size, generator=g)
    return ps


def clone(ps):
    out = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for q, p in zip(out, ps):
        q.grad = p.grad.clone()
    return out


def deepspeed_adam(ps):
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(ps, lr=1e-3, adamw_mode=False)
    except Exception as exc:  # not installed, or its op did not build here
        print(f"      (DeepSpeedCPUAdam unavailable: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0][:80] if str(exc) else ''})")
        return None


def dense_rows(threads, repeats, quick):
    shapes = [("100 x 1e3", 100, 1000)] + ([] if quick else [("1 x 1e7", 1, 10_000_000)])
    for label, count, size in shapes:
        base = params_with_grads(count, size)
        contenders = {}
        ours = ft.Adam(clone(base), lr=1e-3, num_threads=threads)
        contenders["fastadam.torch"] = ours.step
        for name, kw in (("torch foreach", dict(foreach=True)), ("torch fused", dict(fused=True))):
            contenders[name] = torch.optim.Adam(clone(base), lr=1e-3, **kw).step
        ds = None if quick else deepspeed_adam(clone(base))
        if ds is not None:
            contenders["DeepSpeedCPUAdam"] = ds.step
        t = median_seconds_interleaved(contenders, repeats)
        ref = t["fastadam.torch"]
        cells = "  ".join(f"{n} {s * 1e3:8.3f} ms ({s / ref:5.2f}x)" for n, s in t.items()
                          if n != "fastadam.torch")
        print(f"   Adam {label:>10}: fastadam.torch {ref * 1e3:8.3f} ms  {cells}")


def sparse_rows(repeats, quick):
    rows, dim, lookups = (100_000, 64, 8192) if quick else (1_000_000, 64, 65536)
    rng = np.random.default_rng(0)
    idx = np.minimum(rng.zipf(1.3, lookups) - 1, rows - 1)
    idx = torch.from_numpy(rng.permutation(rows)[idx])
    values = torch.from_numpy(rng.standard_normal((lookups, dim)).astype(np.float32))
    grad = torch.sparse_coo_tensor(idx[None], values, (rows, dim))
    weight = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32))

    def make(cls, **kw):
        p = torch.nn.Parameter(weight.clone())
        p.grad = grad
        return cls([p], lr=1e-3, **kw).step
    t = median_seconds_interleaved({
        "fastadam.torch.SparseAdam": make(ft.SparseAdam, num_threads=1),
        "fastadam.torch.Adam (lazy)": make(ft.Adam, num_threads=1),
        "torch.optim.SparseAdam": make(torch.optim.SparseAdam)}, repeats)
    ref = t["torch.optim.SparseAdam"]
    print(f"   sparse embedding {rows:.0e} x {dim}, {lookups} Zipf(1.3) lookups: "
          + "  ".join(f"{n} {s * 1e3:7.2f} ms ({ref / s:4.1f}x faster than SparseAdam)"
                      for n, s in t.items() if n != "torch.optim.SparseAdam")
          + f"  torch.optim.SparseAdam {ref * 1e3:7.2f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"fastadam.torch vs torch.optim, float32, {args.threads} thread(s), medians of "
          f"{args.repeats} interleaved rounds (ratio = other / fastadam)")
    dense_rows(args.threads, args.repeats, args.quick)
    sparse_rows(args.repeats, args.quick)


if __name__ == "__main__":
    main()
