"""Side-by-side timings of fastadam.autodiff against PyTorch eager and HIPS autograd (issue 4).

Runs the four workloads of asv_bench/benchmarks/bench_autodiff.py in one process, 1 thread,
float32 and float64, and prints median times and ratios (ratio = other / fastadam, so > 1 means
fastadam is faster).  Also reports the tape's per-op overhead.  Usage, from the repository root
after ``python setup.py build_ext --inplace``::

    python asv_bench/autodiff_report.py [--quick] [--keep-freed-memory]

Note: fresh multi-megabyte NumPy outputs (conv activations) page-fault when glibc has returned
the freed memory to the OS; on a virtual machine that costs ~1 ms per 2 MB array and dominates
the conv workload.  ``--keep-freed-memory`` calls the opt-in ``fastadam.keep_freed_memory()``
first (glibc keeps freed blocks for reuse; it applies to every library in the process, the
baselines too), which is what a training loop should do: run the report both ways.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import bench_autodiff as B  # noqa: E402
from fastadam.bench import median_seconds  # noqa: E402


def median_time(step, budget):
    """Median seconds per call over 7 rounds of about budget/7 s each (fastadam.bench's timer)."""
    return median_seconds(step, repeats=7, min_time=budget / 7)


def fmt(s):
    return f"{s * 1e6:9.1f} us" if s < 1e-3 else f"{s * 1e3:9.3f} ms"


def tape_overhead(dtype):
    import fastadam.autodiff as ad
    t = ad.Tensor(np.ones(3, dtype=dtype), requires_grad=True)
    a = np.ones(3, dtype=dtype)
    rec = median_time(lambda: t * t, 0.3)
    raw = median_time(lambda: a * a, 0.3)
    return rec - raw


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="call fastadam.keep_freed_memory() before measuring")
    args = parser.parse_args()
    if args.keep_freed_memory:
        import fastadam

        print(f"fastadam.keep_freed_memory(): {fastadam.keep_freed_memory()}")
    budget = 0.25 if args.quick else 0.7
    undo = B._limit_threads()
    workloads = [
        ("MLP 784-256-256-10", B.build_mlp, [32, 256], ["numpy", "torch", "autograd"]),
        ("logistic regression 20 feat.", B.build_logreg, [16], ["numpy", "torch", "autograd"]),
        ("conv 3->16 3x3 +ReLU+mean", B.build_conv, [32], ["numpy", "torch", "autograd"]),
        ("HVP of MLP loss", B.build_hvp, [32], ["torch", "autograd"]),
    ]
    print("fastadam.autodiff vs PyTorch eager / HIPS autograd / hand-written NumPy; 1 thread; "
          "median per step; ratio = other / fastadam (> 1: fastadam faster)")
    header = f"{'workload':30s} {'dtype':7s} {'batch':>5s} {'fastadam':>12s}"
    for name in ("numpy", "torch", "autograd"):
        header += f" {name:>12s} {'ratio':>6s}"
    print(header)
    for title, build, batches, others in workloads:
        for dtype in (np.float32, np.float64):
            for batch in batches:
                ours = median_time(build("fastadam", dtype, batch), budget)
                line = f"{title:30s} {np.dtype(dtype).name:7s} {batch:5d} {fmt(ours):>12s}"
                for name in ("numpy", "torch", "autograd"):
                    if name not in others:
                        line += f" {'-':>12s} {'-':>6s}"
                        continue
                    try:
                        t = median_time(build(name, dtype, batch), budget)
                    except NotImplementedError:
                        line += f" {'n/a':>12s} {'-':>6s}"
                        continue
                    line += f" {fmt(t):>12s} {t / ours:6.2f}"
                print(line, flush=True)
        if build is B.build_logreg:
            for dtype in (np.float32, np.float64):
                print(f"  tape overhead per recorded op ({np.dtype(dtype).name}): "
                      f"{tape_overhead(dtype) * 1e6:.2f} us (recorded 3-element multiply minus "
                      f"the bare NumPy multiply)")
    undo()


if __name__ == "__main__":
    main()
