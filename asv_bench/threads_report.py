"""Threads must never make a training loop slower: fastadam steps interleaved with BLAS work.

    python asv_bench/threads_report.py [--quick]

A training loop alternates BLAS work (NumPy matmul on OpenBLAS's threads) and optimizer steps.
Each round here is ``H = X @ W`` then one ``fastadam.step_inplace`` (float32, "torch"
convention); rounds with the default ``num_threads=None`` and with ``num_threads=1`` alternate in
one process, so load from other processes hits both alike, after 100 untimed warm-up rounds (a
training loop's steady state).  Reported: the median step time and
the median round time (matmul + step) of each, the ratio default / 1 thread, which must stay
at or below 1.10, and the share of default steps that ran on N threads.  A noise floor follows:
the same 1-thread step under two names, interleaved alike.  Then, with no BLAS work between steps ("idle": back-to-back), the speed-up of
the default over 1 thread on a large step, which must stay above 1 on a machine with a free core.

The same rounds are timed once more in a child process that restores libgomp's stock wait
(GOMP_SPINCOUNT=300000) and passes ``num_threads=<all>`` explicitly, which is what fastadam did
before (see fastadam/_omp_wait.py and fastadam._threads.AdaptiveThreads).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SIZES = (2**18, 10**6, 4 * 10**6)
IDLE_SIZE = 4 * 10**6


def interleaved_rounds(size, rounds, threads_a, threads_b, gemm=256, warmup=100):
    """Median step and round seconds for two thread settings, interleaved, BLAS in between.

    The first ``warmup`` rounds are not timed: the default's first steps of a size class try
    both thread counts (AdaptiveThreads), and a training loop runs thousands of steps."""
    import fastadam

    rng = np.random.default_rng(0)
    X = rng.standard_normal((2 * gemm, gemm)).astype(np.float32)
    W = rng.standard_normal((gemm, gemm)).astype(np.float32)
    x = np.zeros(size, np.float32)
    g = rng.standard_normal(size).astype(np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    steps = {threads_a: [], threads_b: []}
    whole = {threads_a: [], threads_b: []}
    t = 0
    for r in range(-warmup, rounds):  # warm-up rounds (r < 0) are not timed
        for nt in ((threads_a, threads_b) if r % 2 else (threads_b, threads_a)):
            t += 1
            start = time.perf_counter()
            X @ W
            s0 = time.perf_counter()
            fastadam.step_inplace(x, g, m, v, t, lr=1e-3, convention="torch", num_threads=nt)
            end = time.perf_counter()
            if r >= 0:
                steps[nt].append(end - s0)
                whole[nt].append(end - start)
    med = statistics.median
    return {nt: (med(steps[nt]), med(whole[nt])) for nt in steps}


def idle_speedup(size, rounds):
    """Median back-to-back step seconds with the default and with 1 thread, interleaved."""
    import fastadam

    x = np.zeros(size, np.float32)
    g = np.ones(size, np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    times = {None: [], 1: []}
    for r in range(rounds):
        for nt in ((None, 1) if r % 2 else (1, None)):
            for _ in range(3):  # the default settles on its choice within a few steps
                start = time.perf_counter()
                fastadam.step_inplace(x, g, m, v, 10, lr=1e-3, convention="torch",
                                      num_threads=nt)
                times[nt].append(time.perf_counter() - start)
    from fastadam._threads import adaptive_threads

    share = adaptive_threads.parallel_steps / max(adaptive_threads.steps, 1)
    return statistics.median(times[1]) / statistics.median(times[None]), share


def report(rounds, label):
    import fastadam

    print(f"{label}: {fastadam.config()['max_threads']} threads available, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'size':>9} | {'step, default':>13} {'step, 1 thr':>11} {'ratio':>6} | "
          f"{'round, default':>14} {'round, 1 thr':>12} {'ratio':>6} | {'on N thr':>8}")
    from fastadam._threads import adaptive_threads

    worst = 0.0
    for size in SIZES:
        adaptive_threads.reset()
        res = interleaved_rounds(size, rounds, None, 1)
        share = adaptive_threads.parallel_steps / max(adaptive_threads.steps, 1)
        (sd, rd), (s1, r1) = res[None], res[1]
        worst = max(worst, sd / s1, rd / r1)
        print(f"{size:>9.1e} | {sd * 1e6:>10.0f} us {s1 * 1e6:>8.0f} us {sd / s1:>6.2f} | "
              f"{rd * 1e6:>11.0f} us {r1 * 1e6:>9.0f} us {rd / r1:>6.2f} | {share:>8.0%}")
    return worst


def stock_child(rounds):
    """The same loop with libgomp's stock spin and an explicit thread count (the old default)."""
    import fastadam

    nt = fastadam.config()["max_threads"]
    print(f"stock libgomp wait (GOMP_SPINCOUNT=300000), num_threads={nt} vs 1:")
    for size in SIZES[1:2]:
        res = interleaved_rounds(size, rounds, nt, 1)
        (sd, rd), (s1, r1) = res[nt], res[1]
        print(f"{size:>9.1e} | step {sd * 1e6:.0f} us vs {s1 * 1e6:.0f} us ({sd / s1:.2f}x), "
              f"round {rd * 1e6:.0f} us vs {r1 * 1e6:.0f} us ({rd / r1:.2f}x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--stock-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rounds = 40 if args.quick else 300
    if args.stock_child:
        stock_child(rounds)
        return 0
    import fastadam

    print("wait policy:", fastadam.config().get("omp_wait_policy"))
    worst = report(rounds, "fastadam default vs num_threads=1, BLAS matmul between steps")
    from fastadam._threads import adaptive_threads

    adaptive_threads.reset()
    speedup, share = idle_speedup(IDLE_SIZE, rounds // 4)
    print(f"back-to-back {IDLE_SIZE:.0e}-element steps: default {speedup:.2f}x the speed of "
          f"1 thread ({share:.0%} of default steps on N threads)")
    print(f"worst default/1-thread ratio in the loop: {worst:.2f} (goal <= 1.10)")
    noise = interleaved_rounds(IDLE_SIZE, rounds, 1, -(os.cpu_count() or 1))  # both 1 thread
    (a, _), (b, _) = noise[1], noise[-(os.cpu_count() or 1)]
    print(f"noise floor: the same 1-thread {IDLE_SIZE:.0e} step under two names, interleaved: "
          f"ratio {b / a:.2f}")
    env = dict(os.environ, GOMP_SPINCOUNT="300000")
    subprocess.run([sys.executable, __file__, "--stock-child"] + (["--quick"] if args.quick else []),
                   env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
