"""Threads must never make a training loop slower: fastadam steps interleaved with BLAS work.

    python asv_bench/threads_report.py [--quick] [--blocks N]

A training loop alternates BLAS work (NumPy matmul on OpenBLAS's threads) and optimizer steps.
Each round here is ``H = X @ W`` then one ``fastadam.step_inplace`` (float32, "torch"
convention).  Three arms run in every round, in rotating order, in one process: the default
``num_threads=None``, ``num_threads=1``, and ``num_threads=1`` again under another name (an A/A
control: the spread between two identical arms is the noise of this measurement on this
machine at this moment).  After 100 untimed warm-up rounds (a training loop's steady state:
the default's first steps of a size class try both thread counts), each block of rounds gives
the ratio of medians default / 1 thread (goal: at most 1.10) and control / 1 thread, for the
step alone and for the round (matmul + step), and for the step the median of the per-round
ratios (paired: steps of one round run within milliseconds, so load that changes over
seconds cancels), with the load average at the block's start.
Every block is printed, not the best; the summary gives the median and the worst block.

The chooser's decisions are logged (fastadam._core._threads.AdaptiveThreads.log and summary): the
share of default steps on N threads, probes, switches and its estimates per size class.

Then, with no BLAS work between steps (back-to-back), the speed-up of the default over 1 thread
on a large step, which stays above 1 only on a machine with a free core; and once more in a
child process with libgomp's stock wait (GOMP_SPINCOUNT=300000) and an explicit
``num_threads=<all>``, which is what fastadam did before issue 13.
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
CONTROL = "1 (A/A)"


def interleaved_rounds(size, rounds, arms, gemm=256, warmup=100):
    """{arm: (step seconds, round seconds) lists} for thread settings ``arms`` (the CONTROL arm
    runs num_threads=1), rotating their order each round, BLAS work before every step."""
    import fastadam

    rng = np.random.default_rng(0)
    X = rng.standard_normal((2 * gemm, gemm)).astype(np.float32)
    W = rng.standard_normal((gemm, gemm)).astype(np.float32)
    x = np.zeros(size, np.float32)
    g = rng.standard_normal(size).astype(np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    times = {a: ([], []) for a in arms}
    t = 0
    for r in range(-warmup, rounds):  # warm-up rounds (r < 0) are not timed
        k = r % len(arms)
        for arm in arms[k:] + arms[:k]:
            nt = 1 if arm == CONTROL else arm
            t += 1
            start = time.perf_counter()
            X @ W
            s0 = time.perf_counter()
            fastadam.step_inplace(x, g, m, v, t, lr=1e-3, convention="torch", num_threads=nt)
            end = time.perf_counter()
            if r >= 0:
                times[arm][0].append(end - s0)
                times[arm][1].append(end - start)
    return times


def block_ratios(times):
    """{arm: (step ratio, paired step ratio, round ratio)} of the default and the control
    against 1 thread: ratios of medians, and the median of the per-round ratios (a step and
    the 1-thread step of the same round ran within milliseconds of each other, so load that
    changes over seconds cancels there)."""
    med = statistics.median
    out = {}
    for arm in (None, CONTROL):
        paired = med(a / b for a, b in zip(times[arm][0], times[1][0]))
        out[arm] = (med(times[arm][0]) / med(times[1][0]), paired,
                    med(times[arm][1]) / med(times[1][1]))
    return out


def loop_report(rounds, blocks):
    from fastadam._core._threads import adaptive_threads

    print(f"{'':>21} | {'step: 1 thr':>11} {'default':>7} {'paired':>6} {'A/A':>5} "
          f"{'paired':>6} | {'round: 1 thr':>12} {'default':>7} {'A/A':>5} | {'on N':>5}")
    print(f"{'size':>9} {'block':>5} {'load':>5} | {'(median)':>11} {'ratio':>7} {'ratio':>6} "
          f"{'ratio':>5} {'ratio':>6} | {'(median)':>12} {'ratio':>7} {'ratio':>5} | "
          f"{'thr':>5}")
    worst, summary = 0.0, {}
    for size in SIZES:
        adaptive_threads.reset()
        adaptive_threads.log = []
        step_ratios, paired_ratios, round_ratios, aa, aa_paired = [], [], [], [], []
        for b in range(blocks):
            load = os.getloadavg()[0]
            p0 = adaptive_threads.parallel_steps
            warmup = 100 if b == 0 else 10
            times = interleaved_rounds(size, rounds, [None, 1, CONTROL], warmup=warmup)
            # every default step (the driver runs most serial ones without the chooser)
            share = (adaptive_threads.parallel_steps - p0) / (rounds + warmup)
            r = block_ratios(times)
            step_ratios.append(r[None][0])
            paired_ratios.append(r[None][1])
            round_ratios.append(r[None][2])
            aa.append(r[CONTROL][0])
            aa_paired.append(r[CONTROL][1])
            print(f"{size:>9.1e} {b:>5} {load:>5.1f} | "
                  f"{statistics.median(times[1][0]) * 1e6:>8.0f} us {r[None][0]:>7.2f} "
                  f"{r[None][1]:>6.2f} {r[CONTROL][0]:>5.2f} {r[CONTROL][1]:>6.2f} | "
                  f"{statistics.median(times[1][1]) * 1e6:>9.0f} us {r[None][2]:>7.2f} "
                  f"{r[CONTROL][2]:>5.2f} | {share:>5.1%}")
        worst = max(worst, max(step_ratios), max(paired_ratios))
        summary[size] = (step_ratios, paired_ratios, round_ratios, aa, aa_paired)
        for key, c in adaptive_threads.summary().items():
            print(f"{'':>9} chooser: {c['elements']} elements: runs {c['choice']} thread(s); "
                  f"median ratio N / 1 thread {c['ratio']:.2f}; ns/element 1 thread "
                  f"{c['serial_ns_per_elem']:.3f}, N threads "
                  f"{c['threaded_ns_per_elem']:.3f}; {c['probes']} probes, {c['switches']} "
                  f"switches, last probe scheduled {c['probe_after']} steps ahead")
        adaptive_threads.log = None
    print("summary (median of blocks, worst block):")
    for size, (s, p, r, a, ap) in summary.items():
        print(f"{size:>9.1e}: step {statistics.median(s):.2f} (worst {max(s):.2f}), paired "
              f"{statistics.median(p):.2f} (worst {max(p):.2f}); round "
              f"{statistics.median(r):.2f} (worst {max(r):.2f}); A/A step "
              f"{min(a):.2f}-{max(a):.2f}, paired {min(ap):.2f}-{max(ap):.2f}")
    return worst


def idle_speedup(size, rounds):
    """Median back-to-back step seconds of 1 thread / the default, interleaved."""
    import fastadam
    from fastadam._core._threads import adaptive_threads

    adaptive_threads.reset()
    x = np.zeros(size, np.float32)
    g = np.ones(size, np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    times = {None: [], 1: []}
    for r in range(rounds):
        for nt in ((None, 1) if r % 2 else (1, None)):
            for _ in range(3):
                start = time.perf_counter()
                fastadam.step_inplace(x, g, m, v, 10, lr=1e-3, convention="torch",
                                      num_threads=nt)
                times[nt].append(time.perf_counter() - start)
    share = adaptive_threads.parallel_steps / len(times[None])
    explicit = {1: [], None: []}
    nt_all = fastadam.config()["max_threads"]
    for r in range(rounds):
        for nt in ((nt_all, 1) if r % 2 else (1, nt_all)):
            start = time.perf_counter()
            fastadam.step_inplace(x, g, m, v, 10, lr=1e-3, convention="torch", num_threads=nt)
            explicit[1 if nt == 1 else None].append(time.perf_counter() - start)
    med = statistics.median
    return med(times[1]) / med(times[None]), share, med(explicit[1]) / med(explicit[None])


def stock_child(rounds):
    """The same loop with libgomp's stock spin and an explicit thread count (the old default)."""
    import fastadam

    nt = fastadam.config()["max_threads"]
    print(f"stock libgomp wait (GOMP_SPINCOUNT=300000), num_threads={nt} vs 1, load "
          f"{os.getloadavg()[0]:.1f}:")
    for size in SIZES[1:2]:
        times = interleaved_rounds(size, rounds, [nt, 1])
        med = statistics.median
        sd, s1 = med(times[nt][0]), med(times[1][0])
        rd, r1 = med(times[nt][1]), med(times[1][1])
        print(f"{size:>9.1e} | step {sd * 1e6:.0f} us vs {s1 * 1e6:.0f} us ({sd / s1:.2f}x), "
              f"round {rd * 1e6:.0f} us vs {r1 * 1e6:.0f} us ({rd / r1:.2f}x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--blocks", type=int, default=3, help="blocks of rounds per size")
    parser.add_argument("--no-stock", action="store_true", help="skip the stock-wait child")
    parser.add_argument("--stock-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rounds = 40 if args.quick else 200
    if args.stock_child:
        stock_child(rounds)
        return 0
    import fastadam

    print("wait policy:", fastadam.config().get("omp_wait_policy"))
    print(f"fastadam default vs num_threads=1, BLAS matmul between steps: "
          f"{fastadam.config()['max_threads']} threads available on {os.cpu_count()} CPUs, "
          f"{rounds} rounds per block; ratios of medians")
    worst = loop_report(rounds, args.blocks)
    print(f"worst default/1-thread step ratio of any block, either kind: {worst:.2f} (goal <= "
          f"1.10; compare the A/A columns: the noise of the same measurement)")
    speedup, share, explicit = idle_speedup(IDLE_SIZE, max(rounds // 4, 10))
    print(f"back-to-back {IDLE_SIZE:.0e}-element steps, load {os.getloadavg()[0]:.1f}: default "
          f"{speedup:.2f}x the speed of 1 thread ({share:.0%} of default steps on N threads); "
          f"explicit num_threads={fastadam.config()['max_threads']}: {explicit:.2f}x")
    if not args.no_stock:
        env = dict(os.environ, GOMP_SPINCOUNT="300000")
        subprocess.run([sys.executable, __file__, "--stock-child"]
                       + (["--quick"] if args.quick else []), env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
