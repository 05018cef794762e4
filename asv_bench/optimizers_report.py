"""Side-by-side check of the Adagrad and momentum (SGD) steps' performance claims, in one process.

    PYTHONPATH=. python asv_bench/optimizers_report.py [--repeat N]

For each of fastadam.adagrad_step_inplace and fastadam.momentum_step_inplace (float32, 1 thread):
  1. 1e7 elements: the fraction of the read-3/write-2 stream loop's bandwidth (the traffic of a
     step with one state slot, 20 bytes per element; goal >= 0.90);
  2. one tensor of 1e3 and 1e4 elements: speed-up over the matching torch optimizer with
     foreach=True (torch.optim.Adagrad, torch.optim.SGD(momentum=0.9); goal >= 5x).
Timings alternate between the contenders (medians), so a noisy neighbour hurts them alike.
"""
import argparse

import numpy as np

import fastadam
from fastadam.bench import median_seconds_interleaved, stream_rw_f32

try:
    import torch
except ImportError:  # the report still runs, without the PyTorch column
    torch = None

OPTIMIZERS = {
    "adagrad": (lambda x, g, s, t, nt: fastadam.adagrad_step_inplace(
        x, g, s, t, lr=0.01, num_threads=nt),
        lambda params: torch.optim.Adagrad(params, lr=0.01, foreach=True)),
    "momentum": (lambda x, g, s, t, nt: fastadam.momentum_step_inplace(
        x, g, s, t, lr=0.01, momentum=0.9, num_threads=nt),
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)),
}


class Case:
    def __init__(self, name, n, seed=0):
        rng = np.random.default_rng(seed)
        self.step_fn, make_torch = OPTIMIZERS[name]
        self.x = rng.standard_normal(n).astype(np.float32)
        self.g = rng.standard_normal(n).astype(np.float32)
        self.s = np.zeros(n, np.float32)
        self.t = 0
        if torch is not None:
            self.p = torch.from_numpy(self.x.copy()).requires_grad_()
            self.p.grad = torch.from_numpy(self.g.copy())
            self.opt = make_torch([self.p])

    def fastadam(self):
        self.t += 1
        self.step_fn(self.x, self.g, self.s, self.t, 1)

    def torch(self):
        self.opt.step()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    if torch is not None:
        torch.set_num_threads(1)
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, "
          f"torch {torch.__version__ if torch else 'not installed'}; medians of {args.repeat}")
    for name in OPTIMIZERS:
        n = 10**7
        case = Case(name, n)
        a, d, b = (np.ones(n, np.float32) for _ in range(3))
        r = median_seconds_interleaved({"fastadam": case.fastadam,
                                        "stream": lambda: stream_rw_f32(a, d, b, None, 1)},
                                       repeats=args.repeat)
        print(f"\n{name}: 1e7 float32, 1 thread: fastadam {r['fastadam']*1e3:.2f} ms, stream "
              f"{r['stream']*1e3:.2f} ms ({20*n/r['stream']/1e9:.1f} GB/s); fraction of stream "
              f"bandwidth {r['stream']/r['fastadam']:.3f} (goal >= 0.90)")
        if torch is None:
            continue
        for n in (10**3, 10**4):
            case = Case(name, n)
            r = median_seconds_interleaved({"fastadam": case.fastadam, "torch": case.torch},
                                           repeats=args.repeat)
            print(f"{name}: one tensor of {n:.0e}: fastadam {r['fastadam']*1e6:.2f} us, torch "
                  f"foreach {r['torch']*1e6:.2f} us; speed-up {r['torch']/r['fastadam']:.2f}x "
                  f"(goal >= 5)")


if __name__ == "__main__":
    main()
