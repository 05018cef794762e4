"""Side-by-side timings of fastadam.autodiff against PyTorch eager and HIPS autograd (issues 4, 12).

Runs the four workloads of asv_bench/benchmarks/bench_autodiff.py in one process, 1 thread
(threadpoolctl for BLAS/OpenMP, torch.set_num_threads), float32 and float64, and prints median
times and ratios (ratio = other / fastadam, so > 1 means fastadam is faster).  Also reports the
tape's per-op overhead, then checks the goals of issue 12 (float32, default settings).  Usage,
from the repository root after ``python setup.py build_ext --inplace``::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/autodiff_report.py [--quick]

The engine needs no process-wide malloc setting any more (its buffer pool reuses activations
across steps); ``--keep-freed-memory`` still calls the opt-in ``fastadam.keep_freed_memory()``
first, for comparison (it applies to every library in the process, the baselines too).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import bench_autodiff as B  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402


def median_times(steps, budget, repeats=7):
    """Median seconds per call of each step, timed interleaved (fastadam.bench's timer): every
    repeat times each step in turn, so a change of machine load hits all of them alike."""
    r = median_seconds_interleaved(dict(enumerate(steps)), repeats=repeats,
                                   min_time=budget / repeats)
    return [r[i] for i in range(len(steps))]


def median_time(step, budget):
    return median_times([step], budget)[0]


def fmt(s):
    return f"{s * 1e6:9.1f} us" if s < 1e-3 else f"{s * 1e3:9.3f} ms"


def tape_overhead(dtype):
    import fastadam.autodiff as ad
    t = ad.Tensor(np.ones(3, dtype=dtype), requires_grad=True)
    a = np.ones(3, dtype=dtype)
    rec, raw = median_times([lambda: t * t, lambda: a * a], 0.6, repeats=21)
    return rec - raw, raw


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
          "median per step, timed interleaved; ratio = other / fastadam (> 1: fastadam faster)")
    header = f"{'workload':30s} {'dtype':7s} {'batch':>5s} {'fastadam':>12s}"
    for name in ("numpy", "torch", "autograd"):
        header += f" {name:>12s} {'ratio':>6s}"
    print(header)
    torch_ratio = {}  # (workload, batch) -> torch / fastadam, float32
    overhead = {}
    for title, build, batches, others in workloads:
        for dtype in (np.float32, np.float64):
            for batch in batches:
                steps = {"fastadam": build("fastadam", dtype, batch)}
                for name in others:
                    try:
                        steps[name] = build(name, dtype, batch)
                    except NotImplementedError:
                        pass
                measured = dict(zip(steps, median_times(list(steps.values()),
                                                        budget * len(steps))))
                ours = measured["fastadam"]
                line = f"{title:30s} {np.dtype(dtype).name:7s} {batch:5d} {fmt(ours):>12s}"
                for name in ("numpy", "torch", "autograd"):
                    if name not in others:
                        line += f" {'-':>12s} {'-':>6s}"
                        continue
                    if name not in measured:
                        line += f" {'n/a':>12s} {'-':>6s}"
                        continue
                    t = measured[name]
                    line += f" {fmt(t):>12s} {t / ours:6.2f}"
                    if name == "torch" and dtype is np.float32:
                        torch_ratio[build.__name__, batch] = t / ours
                print(line, flush=True)
        if build is B.build_logreg:
            for dtype in (np.float32, np.float64):
                overhead[dtype], bare = tape_overhead(dtype)
                print(f"  tape overhead per recorded op ({np.dtype(dtype).name}): "
                      f"{overhead[dtype] * 1e6:.2f} us (recorded 3-element multiply minus "
                      f"the bare NumPy multiply, which took {bare * 1e6:.2f} us: the machine's "
                      f"load scales both)")
    undo()
    print("\nissue 12 goals (float32, torch / fastadam time; 1 thread both sides):")
    goals = [
        ("conv 32x3x32x32, 16 3x3: within 1.2x of PyTorch", torch_ratio.get(("build_conv", 32)),
         1 / 1.2),
        ("MLP batch 32: >= 1.3x faster", torch_ratio.get(("build_mlp", 32)), 1.3),
        ("MLP batch 256: >= 1.3x faster", torch_ratio.get(("build_mlp", 256)), 1.3),
        ("logistic regression batch 16: >= 3x faster", torch_ratio.get(("build_logreg", 16)), 3.0),
        ("HVP of the MLP: within 1.1x of PyTorch", torch_ratio.get(("build_hvp", 32)), 1 / 1.1),
    ]
    for text, ratio, bar in goals:
        if ratio is None:
            print(f"  {text:52s} not measured (PyTorch missing)")
            continue
        print(f"  {text:52s} ratio {ratio:5.2f} (bar {bar:4.2f}): "
              f"{'met' if ratio >= bar else 'MISSED'}")
    ov = overhead[np.float32] * 1e6
    print(f"  {'tape overhead per op: <= 1 us':52s} {ov:5.2f} us: {'met' if ov <= 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
