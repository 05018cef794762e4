"""Per-step cost of the Python layer (issue 20, scope 7), 1 thread, in one process.

    python asv_bench/step_overhead_report.py [--repeat N]

Prints medians (interleaved rounds) for float32 tensors of 1e3 elements:
  1. one tensor: ``Adam.step`` (goal <= 1.5 us), ``step_inplace`` (goal <= 2 us), a prepared
     step (``fastadam.optim.prepare_step``), the bare driver call on pre-validated arrays (the
     kernel time plus the driver's chunking) and torch's fused Adam beside them;
  2. 100 tensors in one call: the cost of each tensor beyond the first, for ``Adam.step`` and
     the bare driver (goal: ``Adam.step``'s per tensor <= the driver's per tensor + 30 ns).
"""
import argparse

import numpy as np

import fastadam
from fastadam._core import _dense
from fastadam.bench import median_seconds_interleaved
from fastadam.optim._coefficients import adam_coefficients

try:
    import torch
except ImportError:
    torch = None

N = 1000


def arrays(k, seed=0):
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal(N).astype(np.float32) for _ in range(k)]
    g = [rng.standard_normal(N).astype(np.float32) for _ in range(k)]
    return x, g, [np.zeros(N, np.float32) for _ in range(k)], [np.zeros(N, np.float32)
                                                              for _ in range(k)]


def contenders(k):
    x, g, m, v = arrays(k)
    opt = fastadam.Adam([a.copy() for a in x], lr=1e-3, num_threads=1)
    xs, gs, ms, vs = arrays(k, 1)
    prepared = fastadam.optim.prepare_step("adam", arrays(k, 2)[0],
                                           {"m": arrays(k, 2)[2], "v": arrays(k, 2)[3]},
                                           num_threads=1)
    pg = arrays(k, 2)[1]
    coeffs = adam_coefficients(1, 1e-3, 0.9, 0.999, 1e-8, "torch")
    dx, dg, dm, dv = arrays(k, 3)
    state = {"t": 0}

    def step_inplace():
        state["t"] += 1
        fastadam.step_inplace(xs, gs, ms, vs, state["t"], convention="torch", num_threads=1)

    def prepared_step():
        state["t"] += 1
        prepared.step(pg, state["t"], convention="torch")

    fns = {
        "Adam.step": lambda: opt.step(g),
        "step_inplace": step_inplace,
        "prepared.step": prepared_step,
        "driver": lambda: _dense.dense_step(coeffs, dx, dg, [dm, dv], np.dtype(np.float32).num,
                                            False, 1),
    }
    if torch is not None:
        params = [torch.from_numpy(a.copy()).requires_grad_() for a in x]
        for p, gg in zip(params, g):
            p.grad = torch.from_numpy(gg.copy())
        fns["torch fused"] = torch.optim.Adam(params, lr=1e-3, fused=True).step
    return fns


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)
    if torch is not None:
        torch.set_num_threads(1)
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}; "
          f"medians of {args.repeat}, float32, 1 thread")
    one = median_seconds_interleaved(contenders(1), repeats=args.repeat, inner=2000)
    print("\n[1] one tensor of 1e3:")
    for name, sec in one.items():
        line = f"    {name:14s} {sec*1e6:7.2f} us"
        if "torch fused" in one and name != "torch fused":
            line += f"   (torch fused / this: {one['torch fused']/sec:.1f}x)"
        print(line)
    many = median_seconds_interleaved(contenders(100), repeats=args.repeat, inner=100)
    print("\n[2] 100 tensors of 1e3 in one call; each tensor beyond the first:")
    for name in ("Adam.step", "step_inplace", "prepared.step", "driver"):
        per = (many[name] - one[name]) / 99
        print(f"    {name:14s} {many[name]*1e6:8.1f} us in all, {per*1e9:6.0f} ns per tensor")
    extra = ((many["Adam.step"] - one["Adam.step"]) - (many["driver"] - one["driver"])) / 99
    print(f"    Adam.step's cost per tensor above the driver's: {extra*1e9:.0f} ns (goal <= 30)")


if __name__ == "__main__":
    main()
