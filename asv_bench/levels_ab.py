"""Every CPU level of one build side by side (issue 21): alternate processes, medians.

    python asv_bench/levels_ab.py [--rounds 5] [--calls 9] [--cases lazy-zipf,lazy-uniform,dense]

The kernels are compiled for several x86-64 levels and the CPU picks one; FASTADAM_CPU_LEVEL
caps it (fastadam/_core/_cpu_level.py).  This runs each case once per level this machine
supports, and the PyTorch baseline, one process each, alternating within every round so that a
slow spell of a shared machine hits all of them; each process reports the median of --calls
steps.  Cases (1 thread, float32):
  lazy-zipf, lazy-uniform   issue 21's sparse lazy step: a 1e6 x 64 table, 65536 indices drawn
                            Zipf(1.3) (ranks scattered over the table) or uniformly, against
                            torch.optim.SparseAdam (coalescing included); asv_bench/sparse_ab.py's
                            child process;
  dense                     the dense Adam step on 1e7 elements, against
                            torch.optim.Adam(fused=True).
Printed per case and level: the level the process reported, the median over rounds (ms), torch
/ this level with its min-max spread over rounds, and the best level / this level.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from sparse_ab import CHILD as SPARSE_CHILD  # noqa: E402

DENSE_CHILD = r'''
import sys, time, numpy as np
kind, calls = sys.argv[1], int(sys.argv[3])
n = 10_000_000
rng = np.random.default_rng(0)
x = rng.standard_normal(n, dtype=np.float32); g = rng.standard_normal(n, dtype=np.float32)
m = np.zeros_like(x); v = np.zeros_like(x)
if kind == "torch":
    import torch
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.from_numpy(x)); p.grad = torch.from_numpy(g)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    def step(t):
        opt.step()
    level = "-"
else:
    import fastadam
    def step(t):
        fastadam.step_inplace(x, g, m, v, t, lr=1e-3, num_threads=1)
    level = fastadam.config()["simd_level"]
times = []
for t in range(1, calls + 2):
    a = time.perf_counter(); step(t); times.append(time.perf_counter() - a)
print(np.median(times[1:]) * 1e3, level)
'''

CASES = {"lazy-zipf": (SPARSE_CHILD, "lazy", "zipf"),
         "lazy-uniform": (SPARSE_CHILD, "lazy", "uniform"),
         "dense": (DENSE_CHILD, "dense", "-")}


def one(child, kind, dist, calls, level):
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    env.pop("FASTADAM_CPU_LEVEL", None)
    if level:
        env["FASTADAM_CPU_LEVEL"] = level
    proc = subprocess.run([sys.executable, "-c", child, kind, dist, str(calls)], cwd=REPO,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    out = proc.stdout.split()
    return float(out[0]), out[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    sys.path.insert(0, REPO)
    from fastadam._core import _cpu_level

    levels = list(reversed(_cpu_level.supported_levels()))  # best first
    print(f"levels of this machine: {', '.join(levels)} (best first); 1 thread, float32, "
          f"{args.rounds} rounds of alternating processes, medians of {args.calls} calls each")
    for case in args.cases.split(","):
        child, kind, dist = CASES[case]
        times = {lv: [] for lv in levels}
        torch_times, reported = [], {}
        for _ in range(args.rounds):
            for lv in levels:
                t, reported[lv] = one(child, kind, dist, args.calls,
                                      None if lv == _cpu_level.PORTABLE else lv)
                times[lv].append(t)
            torch_times.append(one(child, "torch", dist, args.calls, None)[0])
        best = times[levels[0]]
        for lv in levels:
            tr = [a / b for a, b in zip(torch_times, times[lv])]
            br = [a / b for a, b in zip(best, times[lv])]
            print(f"{case:13} level {reported[lv]:10} {statistics.median(times[lv]):8.2f} ms  "
                  f"torch {statistics.median(torch_times):8.2f} ms  torch/this "
                  f"x{statistics.median(tr):.2f} [{min(tr):.2f}-{max(tr):.2f}]  best/this "
                  f"x{statistics.median(br):.2f} [{min(br):.2f}-{max(br):.2f}]", flush=True)


if __name__ == "__main__":
    main()
