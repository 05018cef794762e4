"""Side-by-side check of the dense step's performance claims (issue 2), in one process.

    python asv_bench/dense_report.py [--repeat N]

Prints medians and ratios for:
  1. one float32 tensor of 1e7 elements, 1 thread: fastadam vs the read-4/write-3 stream loop
     (the bandwidth an Adam step can reach) and vs torch.optim.Adam(fused=True);
  2. one tensor of 1e3 and 1e4 elements: fastadam vs torch fused (per-call overhead);
  3. 1000 tensors of 1e3..1e4 elements in one call vs torch fused on the same list;
  4. 1e7 elements with 2 threads vs 1 thread (and 1e3..1e5 elements, to show no regression).
Timings alternate between the contenders, so a noisy neighbour hurts them alike.
"""
import argparse

import numpy as np

import fastadam
from fastadam.bench import median_seconds_interleaved, stream_rw_f32

try:
    import torch
except ImportError:  # the report still runs, without the PyTorch column
    torch = None


def interleaved(fns, repeat, inner=1):
    """Median time of each function, measured round-robin (fastadam.bench's one timer)."""
    return median_seconds_interleaved(fns, repeats=repeat, inner=inner)


class DenseCase:
    """Arrays for a fastadam step and a torch fused Adam over the same shapes."""

    def __init__(self, sizes, seed=0):
        rng = np.random.default_rng(seed)
        self.x = [rng.standard_normal(n).astype(np.float32) for n in sizes]
        self.g = [rng.standard_normal(n).astype(np.float32) for n in sizes]
        self.m = [np.zeros(n, np.float32) for n in sizes]
        self.v = [np.zeros(n, np.float32) for n in sizes]
        self.t = 0
        self.opt = None
        if torch is not None:
            self.params = [torch.from_numpy(x.copy()).requires_grad_() for x in self.x]
            for p, g in zip(self.params, self.g):
                p.grad = torch.from_numpy(g.copy())
            self.opt = torch.optim.Adam(self.params, lr=1e-3, fused=True)

    def fastadam(self, num_threads):
        self.t += 1
        fastadam.step_inplace(self.x, self.g, self.m, self.v, self.t, num_threads=num_threads)

    def torch_fused(self):
        self.opt.step()


def stream_fn(n, num_threads):
    a, d, b, c = (np.ones(n, np.float32) for _ in range(4))
    return lambda: stream_rw_f32(a, d, b, c, num_threads)


def set_torch_threads(n):
    if torch is not None:
        torch.set_num_threads(n)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)
    rep = args.repeat
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, "
          f"torch {torch.__version__ if torch else 'not installed'}; medians of {rep}")

    # 1. 1e7 float32, 1 thread
    n = 10**7
    set_torch_threads(1)
    case = DenseCase([n])
    fns = {"fastadam": lambda: case.fastadam(1), "stream": stream_fn(n, 1)}
    if torch is not None:
        fns["torch_fused"] = case.torch_fused
    r = interleaved(fns, rep)
    bw = 28 * n / r["stream"]
    print(f"\n[1] 1e7 float32, 1 thread: fastadam {r['fastadam']*1e3:.2f} ms "
          f"({28*n/r['fastadam']/1e9:.1f} GB/s), stream loop {r['stream']*1e3:.2f} ms "
          f"({bw/1e9:.1f} GB/s)")
    print(f"    fraction of stream bandwidth: {r['stream']/r['fastadam']:.3f}  (goal >= 0.90)")
    if torch is not None:
        print(f"    torch fused {r['torch_fused']*1e3:.2f} ms; speedup vs torch "
              f"{r['torch_fused']/r['fastadam']:.2f}x  (goal >= 1.0)")

    # 2. small tensors, 1 thread (per-call overhead)
    if torch is not None:
        for n in (10**3, 10**4):
            case = DenseCase([n])
            r = interleaved({"fastadam": lambda: case.fastadam(1),
                             "torch_fused": case.torch_fused}, rep, inner=200)
            print(f"\n[2] one tensor of {n:.0e}: fastadam {r['fastadam']*1e6:.2f} us, torch fused "
                  f"{r['torch_fused']*1e6:.2f} us; speedup {r['torch_fused']/r['fastadam']:.2f}x "
                  f"(goal >= 5)")

    # 3. 1000 tensors of 1e3..1e4 elements in one call
    sizes = np.random.default_rng(1).integers(10**3, 10**4 + 1, size=1000)
    for nt in (1, 2):
        set_torch_threads(nt)
        case = DenseCase(sizes)
        fns = {"fastadam": lambda: case.fastadam(nt)}
        if torch is not None:
            fns["torch_fused"] = case.torch_fused
        r = interleaved(fns, rep)
        line = f"\n[3] 1000 tensors ({sizes.sum():.3g} elements), {nt} thread(s): fastadam " \
               f"{r['fastadam']*1e3:.2f} ms"
        if torch is not None:
            line += f", torch fused {r['torch_fused']*1e3:.2f} ms; speedup " \
                    f"{r['torch_fused']/r['fastadam']:.2f}x (goal >= 1.5)"
        print(line)

    # 4. threads
    print("\n[4] 2 threads vs 1 thread (ratio > 1 means 2 threads are faster):")
    for n in (10**3, 10**4, 10**5, 10**6, 10**7):
        case = DenseCase([n])
        inner = max(1, 10**6 // n)
        r = interleaved({"1": lambda: case.fastadam(1), "2": lambda: case.fastadam(2)}, rep,
                        inner=inner)
        print(f"    n={n:.0e}: 1 thread {r['1']*1e6:9.1f} us, 2 threads {r['2']*1e6:9.1f} us, "
              f"ratio {r['1']/r['2']:.2f}")


if __name__ == "__main__":
    main()
