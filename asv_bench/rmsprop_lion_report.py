"""Side-by-side check of RMSprop's and Lion's performance claims (issue 20), in one process.

    python asv_bench/rmsprop_lion_report.py [--repeat N]

Prints medians and ratios (timings alternate between the contenders, so a noisy neighbour hurts
them alike):
  1. one float32 tensor of 1e7 elements, 1 thread: each step vs the stream loop that moves the
     same bytes (fastadam.bench.stream_rw_f32: read x, g and the slots, write x and the slots;
     RMSprop and Lion with one slot move 20 bytes per element, RMSprop with momentum and Adam 28);
     goal >= 0.95 of the stream loop (Adam is printed as the existing optimizer's reference).
     Beside it, the step's compute floor: its time per element with every array in the L2 cache
     (2^15 elements, the call's fixed cost, timed at 16 elements, taken off), scaled to 1e7 and
     given as the fraction of the stream loop it allows.  Where that is below 0.95 the
     arithmetic itself, not the memory traffic, keeps the step from the goal at this level;
  2. RMSprop on one tensor of 1e4 (and 1e3) elements, 1 thread, vs
     torch.optim.RMSprop(foreach=True); goal >= 5x at 1e4.
"""
import argparse

import numpy as np

import fastadam
from fastadam.bench import median_seconds_interleaved, stream_rw_f32

try:
    import torch
except ImportError:  # the report still runs, without the PyTorch column
    torch = None


class Case:
    """One float32 tensor and its state, stepped by one optimizer's functional step."""

    def __init__(self, n, which, seed=0):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal(n).astype(np.float32)
        self.g = rng.standard_normal(n).astype(np.float32)
        self.s = [np.zeros(n, np.float32) for _ in range(2)]
        self.which = which
        self.t = 0

    def step(self, num_threads=1):
        self.t += 1
        if self.which == "rmsprop":
            fastadam.rmsprop_step_inplace(self.x, self.g, self.s[0], self.t,
                                          num_threads=num_threads)
        elif self.which == "rmsprop_momentum":
            fastadam.rmsprop_step_inplace(self.x, self.g, self.s[0], self.t, momentum=0.9,
                                          momentum_buffer=self.s[1], num_threads=num_threads)
        elif self.which == "adam":
            fastadam.step_inplace(self.x, self.g, self.s[0], self.s[1], self.t,
                                  num_threads=num_threads)
        else:
            fastadam.lion_step_inplace(self.x, self.g, self.s[0], self.t,
                                       num_threads=num_threads)


def compute_seconds_per_element(which, repeats):
    """The step's seconds per element with its arrays in the L2 cache, the fixed cost of a call
    (timed on 16 elements in the same rounds) taken off."""
    big, small = 2**15, 16
    r = median_seconds_interleaved({"big": Case(big, which).step,
                                    "small": Case(small, which).step}, repeats=repeats)
    return (r["big"] - r["small"]) / (big - small)


def stream_fn(n, two_slots):
    a, d, b, c = (np.ones(n, np.float32) for _ in range(4))
    return lambda: stream_rw_f32(a, d, b, c if two_slots else None, 1)


def torch_rmsprop(n, seed=0):
    rng = np.random.default_rng(seed)
    p = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).requires_grad_()
    p.grad = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    opt = torch.optim.RMSprop([p], lr=1e-2, foreach=True)
    return opt.step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)
    rep = args.repeat
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, "
          f"torch {torch.__version__ if torch else 'not installed'}; medians of {rep}")
    if torch is not None:
        torch.set_num_threads(1)

    n = 10**7
    print("\n[1] 1e7 float32, 1 thread, vs the stream loop of the same bytes (goal >= 0.95):")
    for which, two in (("rmsprop", False), ("lion", False), ("rmsprop_momentum", True),
                       ("adam", True)):
        case = Case(n, which)
        r = median_seconds_interleaved({"step": case.step, "stream": stream_fn(n, two)},
                                       repeats=rep)
        nbytes = (28 if two else 20) * n
        floor = compute_seconds_per_element(which, rep) * n
        print(f"    {which:17s} {r['step']*1e3:7.2f} ms ({nbytes/r['step']/1e9:5.1f} GB/s), "
              f"stream {r['stream']*1e3:7.2f} ms; fraction {r['stream']/r['step']:.3f}; "
              f"in cache {floor*1e3:5.2f} ms, at most {r['stream']/floor:.2f}")

    if torch is not None:
        print("\n[2] RMSprop, one tensor, 1 thread, vs torch.optim.RMSprop(foreach=True) "
              "(goal >= 5x at 1e4):")
        for n in (10**3, 10**4):
            case = Case(n, "rmsprop")
            r = median_seconds_interleaved({"fastadam": case.step, "torch": torch_rmsprop(n)},
                                           repeats=rep, inner=200)
            print(f"    n={n:.0e}: fastadam {r['fastadam']*1e6:7.2f} us, torch foreach "
                  f"{r['torch']*1e6:7.2f} us; speedup {r['torch']/r['fastadam']:.2f}x")


if __name__ == "__main__":
    main()
