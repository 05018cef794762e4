"""Sparse step, two builds side by side (issue 21): alternate processes, medians.

    python asv_bench/sparse_ab.py BASE_CHECKOUT [--rounds 5] [--calls 9]

BASE_CHECKOUT is another checkout with an in-place build (e.g. ``git worktree add ../base
eb75a87`` then ``python setup.py build_ext --inplace`` there).  The case is issue 21's: a
1e6 x 64 float32 table, 65536 indices drawn Zipf(1.3) (ranks scattered over the table) or
uniformly, 1 thread.  Each round runs one process per (build, case), the builds alternating,
so a slow spell of a shared machine hits both; each process reports the median of --calls
steps.  Printed: the CPU level each build's kernels ran (FASTADAM_CPU_LEVEL caps it for both),
the medians over rounds (ms), the ratio base / this checkout with its min-max spread over
rounds, and torch.optim.SparseAdam (coalescing included) beside it.
Only the public API is used, so any two versions compare.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r'''
import sys, time, numpy as np
import fastadam
kind, dist, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(42)
N, R, B = 1_000_000, 64, 65536
if dist == "uniform":
    idx = rng.integers(0, N, size=B, dtype=np.int64)
else:
    idx = (((rng.zipf(1.3, size=B) - 1) % N) * 2654435761 % N).astype(np.int64)
vals = rng.standard_normal((B, R)).astype(np.float32)
x = rng.standard_normal((N, R), dtype=np.float32)
m = np.zeros_like(x); v = np.zeros_like(x); last = np.zeros(N, np.int64)
if kind == "torch":
    import torch
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.from_numpy(x)); opt = torch.optim.SparseAdam([p], lr=1e-3)
    ti = torch.from_numpy(idx).unsqueeze(0); tv = torch.from_numpy(vals)
    def step(t):
        p.grad = torch.sparse_coo_tensor(ti, tv, (N, R)); opt.step()
elif kind == "csr":
    import scipy.sparse as sp
    # a CSR gradient of the table's shape: the batch's rows at their indices
    dense_rows = sp.csr_matrix((vals.ravel(), (np.repeat(idx, R), np.tile(np.arange(R), B))),
                               shape=(N, R))
    def step(t):
        fastadam.sparse_step_inplace(x, dense_rows, m, v, t, num_threads=1)
else:
    kw = {"last_step": last} if kind == "catchup" else {}
    def step(t):
        fastadam.sparse_step_inplace(x, (idx, vals), m, v, t, mode=kind, num_threads=1, **kw)
times = []
for t in range(1, calls + 2):
    a = time.perf_counter(); step(t); times.append(time.perf_counter() - a)
level = getattr(fastadam, "config", lambda: {})().get("simd_level", "?") if kind != "torch" else "-"
print(np.median(times[1:]) * 1e3, level)
'''


def one(checkout, kind, dist, calls):
    env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, dist, str(calls)], cwd=checkout,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # e.g. an older base without CSR gradients
        return float("nan"), "n/a"
    out = proc.stdout.split()
    return float(out[0]), out[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--kinds", default="lazy,catchup,dense,csr")
    args = ap.parse_args()
    base = os.path.abspath(args.base)
    for dist in ("zipf", "uniform"):
        for kind in args.kinds.split(","):
            b, c, th = [], [], []
            for _ in range(args.rounds):
                tb, base_level = one(base, kind, dist, args.calls)
                tc, level = one(REPO, kind, dist, args.calls)
                b.append(tb)
                c.append(tc)
                if kind == "lazy":
                    th.append(one(REPO, "torch", dist, args.calls)[0])
            ratios = [x / y for x, y in zip(b, c)]
            line = (f"{dist:8} {kind:8} level base={base_level} this={level}  "
                    f"base {statistics.median(b):8.2f} ms  "
                    f"this {statistics.median(c):8.2f} ms  base/this x{statistics.median(ratios):.2f}"
                    f" [{min(ratios):.2f}-{max(ratios):.2f}]")
            if th:
                tr = [t / y for t, y in zip(th, c)]
                line += (f"  torch {statistics.median(th):8.2f} ms  torch/this "
                         f"x{statistics.median(tr):.1f} [{min(tr):.1f}-{max(tr):.1f}]")
            print(line, flush=True)


if __name__ == "__main__":
    main()
