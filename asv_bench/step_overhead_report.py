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
from fastadam.bench import median_seconds_interleaved, sample_seconds_interleaved
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
    return x, g


def contenders(k):
    """The calls timed, all on the same arrays (the optimizer's parameters and states, and one
    gradient list), so that a difference between two of them is the cost of the layer, not of
    where the allocator put each one's arrays."""
    x, g = arrays(k)
    opt = fastadam.Adam(x, lr=1e-3, num_threads=1)
    opt.step(g)
    xs = opt.params
    ms = [opt.state(i)["m"] for i in range(k)]
    vs = [opt.state(i)["v"] for i in range(k)]
    gs = pg = g
    prepared = fastadam.optim.prepare_step("adam", xs, {"m": ms, "v": vs}, num_threads=1)
    coeffs = adam_coefficients(1, 1e-3, 0.9, 0.999, 1e-8, "torch")
    dx, dg, dm, dv = xs, g, ms, vs
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
    print("\n[2] 100 tensors of 1e3 in one call; each tensor beyond the first:")
    # one interleaved run of the 1- and 100-tensor calls: per round, the cost of the 99 further
    # tensors of each contender, and Adam.step's above the driver's (the median of the rounds'
    # differences: load that hits a round hits both sides of its difference)
    names = ("Adam.step", "step_inplace", "prepared.step", "driver")
    cases = {}
    for k, fns in ((1, contenders(1)), (100, contenders(100))):
        cases.update({(name, k): fns[name] for name in names})
    rounds = sample_seconds_interleaved(cases, repeats=args.repeat, min_time=0.004)
    per = {name: (np.asarray(rounds[(name, 100)]) - np.asarray(rounds[(name, 1)])) / 99
           for name in names}
    for name in names:
        print(f"    {name:14s} {np.median(rounds[(name, 100)])*1e6:8.1f} us in all, "
              f"{np.median(per[name])*1e9:6.0f} ns per tensor")
    extra = per["Adam.step"] - per["driver"]
    q1, q3 = np.percentile(extra, [25, 75])
    print(f"    Adam.step's cost per tensor above the driver's: {np.median(extra)*1e9:.0f} ns "
          f"(quartiles {q1*1e9:.0f}-{q3*1e9:.0f}; goal <= 30)")


if __name__ == "__main__":
    main()
