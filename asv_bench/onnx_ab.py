"""The ONNX training step of two fastadam checkouts, timed side by side in one process.

Usage, each checkout built in place (``python setup.py build_ext --inplace``)::

    python asv_bench/onnx_ab.py BASE_DIR CANDIDATE_DIR [--rounds N] [--workloads K]

Both packages are imported in this process (the first, then, with ``fastadam`` removed from
``sys.modules``, the second: each step function keeps its own package), so that load on a
shared machine hits both alike.  ``TrainingSession.step`` of each (the workloads of
``benchmarks/bench_onnx.py``, 1 thread) and the hand-written autodiff step of each run in
interleaved rounds; the figure is the median over the rounds of candidate / base CPU time of
this thread (``time.thread_time``).  Load the two in both orders (swap the arguments): the
package imported first has measured a few percent slower on the loaded 2-core VM.
Pure-Python changes are what this compares well; two builds of the same Cython extension
types may refuse to mix in one process.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(root):
    for name in [m for m in sys.modules if m == "fastadam" or m.startswith("fastadam.")
                 or m in ("bench_onnx", "_api")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        import fastadam
        import bench_onnx
        if not os.path.abspath(fastadam.__file__).startswith(os.path.abspath(root)):
            raise SystemExit(f"{root}: imported fastadam from {fastadam.__file__}")
    finally:
        sys.path.remove(root)
    return bench_onnx


def _calls_per_round(fn, min_time):
    start = time.thread_time()
    fn()
    return max(1, int(min_time / max(time.thread_time() - start, 1e-6)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("candidate")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", type=int, default=None, help="the first K workloads")
    parser.add_argument("--min-time", type=float, default=0.05)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, "benchmarks"))
    steps = {}
    for side, root in (("base", args.base), ("candidate", args.candidate)):
        B = _load(root)
        for label, sizes, batch in B.WORKLOADS[:args.workloads]:
            steps[label, side] = B.make_step("session", sizes, batch)
            steps[label, "hand-written " + side] = B.make_step("autodiff", sizes, batch)
    from threadpoolctl import threadpool_limits
    limits = threadpool_limits(1)
    try:
        for label in dict.fromkeys(k[0] for k in steps):
            fns = {k[1]: f for k, f in steps.items() if k[0] == label}
            for fn in fns.values():
                for _ in range(3):
                    fn()
            calls = {k: _calls_per_round(fn, args.min_time) for k, fn in fns.items()}
            samples = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, fn in fns.items():
                    start = time.thread_time()
                    for _ in range(calls[k]):
                        fn()
                    samples[k].append((time.thread_time() - start) / calls[k])
            ratios = [c / b for c, b in zip(samples["candidate"], samples["base"])]
            med = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
            print(f"{label}: session step, CPU time: base {med['base']:.1f} us, candidate "
                  f"{med['candidate']:.1f} us (hand-written {med['hand-written base']:.1f} / "
                  f"{med['hand-written candidate']:.1f} us); candidate / base {np.median(ratios):.3f}"
                  f" (median of {len(ratios)} rounds, min {min(ratios):.3f}, max "
                  f"{max(ratios):.3f})", flush=True)
    finally:
        limits.restore_original_limits()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
