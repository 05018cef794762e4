"""Side-by-side report for sparse Adam (issue 3): median times and ratios, measured in one process.

    PYTHONPATH=. python asv_bench/sparse_report.py [--repeat 7] [--quick]

(from the repository root after ``python setup.py build_ext --inplace``, or with fastadam
installed).

Configurations: a 1e6 x 64 float32 embedding table; batches of 4096 and 65536 indices drawn
uniformly and Zipf-like; 1 and 2 threads.
  1. lazy sparse_step_inplace vs torch.optim.SparseAdam (its gradient coalescing included) and
     vs a NumPy np.unique + np.add.at implementation;
  2. segment_sum of 65536 x 64 rows vs np.add.at (and torch coalesce), thread scaling;
  3. dense mode vs a dense step_inplace on the whole table;
  4. where the 1-thread lazy step's time goes (``--section parts``): the step, ``segment_sum``
     alone, the row walk alone (the step given the summed rows at the unique indices), torch's
     SparseAdam, and the time a stream loop (``fastadam.bench.stream_rw_f32``) needs for the
     step's bytes (the gradient rows read once, the touched rows of x, m and v read and
     written) at its measured bandwidth: a floor that ignores the random row order.
  5. every CPU level this machine supports (``--section levels``; FASTADAM_CPU_LEVEL caps the
     level, so each level runs in a process of its own): the lazy step against
     torch.optim.SparseAdam in that process, 1e6 x 64 float32, 65536 indices drawn Zipf(1.3)
     (issue 40's and issue 21's draw, ranks scattered over the table), Zipf(1.2) (this
     report's other sections) and uniformly, 1 and 2 threads on both sides; beside them the
     step's table walk alone (the step given one summed row per touched row,
     ``indices_sorted_unique=True``): what any lazy step must do at least, reading and writing
     the touched rows of x, m and v in random order, measured.
Inputs are built by asv_bench/benchmarks/bench_sparse.py, so the asv suite times the same thing.
Timings on a shared machine are noisy: each entry is the median of --repeat runs, and the
columns of one row are timed round-robin so that their ratios survive a slow spell.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks"))

import fastadam  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402
from bench_sparse import (N_ROWS, ROW, TorchSparseAdam, draw_indices, make_table,  # noqa: E402
                          numpy_segment_sum, numpy_sparse_adam)

try:
    import torch
except ImportError:  # the report still runs, without the torch columns
    torch = None


def median_times(fns, repeat, warmup=1):
    """Median seconds of each function, one call per round, timed round-robin (fn1, fn2, ...,
    fn1, fn2, ...) so that a slow spell of a shared machine hits every column alike."""
    medians = median_seconds_interleaved(dict(enumerate(fns)), repeats=repeat, inner=1,
                                         warmup=warmup)
    return [medians[k] for k in range(len(fns))]


def ms(seconds):
    return f"{seconds * 1e3:9.2f}"


def lazy_section(x, m, v, repeat, batches, distributions, threads_list):
    print("\n1. Lazy sparse Adam step, 1e6 x 64 float32 (ms, median; ratio = baseline / fastadam)")
    print(f"{'batch':>6} {'dist':>8} {'thr':>3} | {'fastadam':>9} {'torch':>9} {'numpy':>9} |"
          f" {'vs torch':>8} {'vs numpy':>8}")
    for batch in batches:
        for dist in distributions:
            rng = np.random.default_rng(42)
            idx = draw_indices(rng, N_ROWS, batch, dist)
            values = rng.standard_normal((batch, ROW)).astype(np.float32)
            nunique = np.unique(idx).size
            for nt in threads_list:
                fns = [lambda: fastadam.sparse_step_inplace(x, (idx, values), m, v, 1,
                                                            num_threads=nt),
                       lambda: numpy_sparse_adam(x, m, v, idx, values, 1)]
                if torch is not None:
                    opt = TorchSparseAdam(x, nt)
                    fns.append(lambda: opt.step(idx, values))
                t_fa, t_np, *t_th = median_times(fns, repeat)
                if torch is not None:
                    del opt
                    th, r_th = ms(t_th[0]), f"{t_th[0] / t_fa:7.1f}x"
                else:
                    th, r_th = f"{'-':>9}", f"{'-':>8}"
                print(f"{batch:6d} {dist:>8} {nt:3d} | {ms(t_fa)} {th} {ms(t_np)} | {r_th}"
                      f" {t_np / t_fa:7.1f}x   ({nunique} unique rows)")


def segment_section(repeat, batch, threads_list):
    print(f"\n2. segment_sum of {batch} x 64 float32 rows (ms, median)")
    print(f"{'dist':>8} {'thr':>3} | {'fastadam':>9} {'np.add.at':>9} {'coalesce':>9} |"
          f" {'vs add.at':>9} {'scaling':>8}")
    for dist in ("uniform", "zipf"):
        rng = np.random.default_rng(7)
        idx = draw_indices(rng, N_ROWS, batch, dist)
        values = rng.standard_normal((batch, ROW)).astype(np.float32)
        t_one = None
        for nt in threads_list:
            fns = [lambda: fastadam.segment_sum(idx, values, num_threads=nt),
                   lambda: numpy_segment_sum(idx, values)]
            if torch is not None:
                torch.set_num_threads(nt)
                coo = torch.sparse_coo_tensor(torch.from_numpy(idx)[None],
                                              torch.from_numpy(values), (N_ROWS, ROW),
                                              check_invariants=False)
                fns.append(lambda: coo.coalesce())
            t_fa, t_np, *t_th = median_times(fns, repeat)
            t_one = t_one or t_fa
            t_th = ms(t_th[0]) if t_th else f"{'-':>9}"
            print(f"{dist:>8} {nt:3d} | {ms(t_fa)} {ms(t_np)} {t_th} | {t_np / t_fa:8.1f}x"
                  f" {t_one / t_fa:7.2f}x")


def dense_section(x, m, v, repeat, batches, threads_list):
    print("\n3. Dense mode (TF1 semantics, every row moves) vs dense step_inplace, whole table")
    print(f"{'batch':>6} {'thr':>3} | {'dense mode':>10} {'step_inplace':>12} | {'ratio':>6}")
    g = np.zeros_like(x)
    for batch in batches:
        rng = np.random.default_rng(3)
        idx = draw_indices(rng, N_ROWS, batch, "uniform")
        values = rng.standard_normal((batch, ROW)).astype(np.float32)
        for nt in threads_list:
            t_sp, t_de = median_times([
                lambda: fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, mode="dense",
                                                     num_threads=nt),
                lambda: fastadam.step_inplace(x, g, m, v, 1, num_threads=nt)], repeat)
            print(f"{batch:6d} {nt:3d} | {ms(t_sp):>10} {ms(t_de):>12} | {t_sp / t_de:5.2f}x")
    del g


def parts_section(x, m, v, repeat, batch):
    from fastadam.bench import stream_rw_f32

    n = 10**7
    a, d, b, c = (np.ones(n, np.float32) for _ in range(4))
    bandwidth = 28 * n / median_times([lambda: stream_rw_f32(a, d, b, c, 1)], repeat)[0]
    del a, d, b, c
    print(f"\n4. The lazy step's parts, 1 thread, {batch} x 64 float32 rows (ms, median); "
          f"stream loop {bandwidth / 1e9:.1f} GB/s")
    print(f"{'dist':>8} {'unique':>6} | {'step':>7} {'seg_sum':>7} {'walk':>7} {'torch':>7}"
          f" {'floor':>7} | {'torch/step':>10} {'torch/walk':>10} {'torch/floor':>11}")
    for dist in ("zipf", "uniform"):
        rng = np.random.default_rng(42)
        idx = draw_indices(rng, N_ROWS, batch, dist)
        values = rng.standard_normal((batch, ROW)).astype(np.float32)
        rows, sums = fastadam.segment_sum(idx, values, num_threads=1)
        fns = [lambda: fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, mode="lazy",
                                                    num_threads=1),
               lambda: fastadam.segment_sum(idx, values, num_threads=1),
               lambda: fastadam.sparse_step_inplace(x, (rows, sums), m, v, 1, mode="lazy",
                                                    num_threads=1)]
        if torch is not None:
            opt = TorchSparseAdam(x, 1)
            fns.append(lambda: opt.step(idx, values))
        t_step, t_sum, t_walk, *t_th = median_times(fns, repeat)
        floor = (values.nbytes + idx.nbytes + rows.size * ROW * 4 * 6) / bandwidth
        th = t_th[0] if t_th else float("nan")
        print(f"{dist:>8} {rows.size:6d} | {t_step * 1e3:7.2f} {t_sum * 1e3:7.2f} "
              f"{t_walk * 1e3:7.2f} {th * 1e3:7.2f} {floor * 1e3:7.2f} | {th / t_step:9.1f}x "
              f"{th / t_walk:9.1f}x {th / floor:10.1f}x")


LEVEL_CHILD = r"""
import json, sys, time
import numpy as np
import torch
import fastadam
sys.path.insert(0, sys.argv[1])
from bench_sparse import TorchSparseAdam, make_table
repeat, threads, clock = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
timer = time.process_time if clock == "cpu" else time.perf_counter


def median_seconds_interleaved(fns, repeats, inner, warmup):
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = timer()
            fn()
            times[name].append(timer() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


n, row, k = 1_000_000, 64, 65536
x, m, v = make_table(n, row, np.float32)
out = {"level": fastadam.config()["simd_level"]}
for dist in ("zipf1.3", "zipf1.2", "uniform"):
    rng = np.random.default_rng(42)
    if dist == "uniform":
        idx = rng.integers(0, n, size=k, dtype=np.int64)
    else:
        ranks = (rng.zipf(float(dist[4:]), size=k) - 1) % n
        idx = (ranks * 2654435761 % n).astype(np.int64)
    values = rng.standard_normal((k, row)).astype(np.float32)
    rows, sums = fastadam.segment_sum(idx, values, num_threads=1)
    opt = TorchSparseAdam(x, threads)
    med = median_seconds_interleaved({
        "step": lambda: fastadam.sparse_step_inplace(x, (idx, values), m, v, 1,
                                                     num_threads=threads),
        "walk": lambda: fastadam.sparse_step_inplace(x, (rows, sums), m, v, 1,
                                                     indices_sorted_unique=True,
                                                     num_threads=threads),
        "torch": lambda: opt.step(idx, values)}, repeats=repeat, inner=1, warmup=1)
    out[dist] = dict(med, unique=int(rows.size))
    del opt
print(json.dumps(out))
"""


def levels_section(repeat, threads_list, clock="wall"):
    import json
    import subprocess

    from fastadam._core import _cpu_level

    levels = list(reversed(_cpu_level.supported_levels()))  # best first
    print(f"\n5. Lazy sparse Adam step at each CPU level ({', '.join(levels)}), 1e6 x 64 float32,"
          f" 65536 indices (ms, median of {repeat} interleaved rounds; ratio = torch / fastadam)"
          + ("; CPU time of the process (all its threads)" if clock == "cpu" else ""))
    print(f"{'level':>10} {'dist':>8} {'thr':>3} {'unique':>6} | {'step':>7} {'walk':>7}"
          f" {'torch':>7} | {'torch/step':>10} {'torch/walk':>10}")
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks")
    for level in levels:
        for nt in threads_list:
            env = dict(os.environ, OMP_NUM_THREADS=str(nt))
            env.pop(_cpu_level.ENV, None)
            if level != _cpu_level.PORTABLE:
                env[_cpu_level.ENV] = level
            proc = subprocess.run([sys.executable, "-c", LEVEL_CHILD, bench, str(repeat), str(nt), clock],
                                  env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{level:>10} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            for dist in ("zipf1.3", "zipf1.2", "uniform"):
                r = out[dist]
                print(f"{out['level']:>10} {dist:>8} {nt:3d} {r['unique']:6d} | "
                      f"{r['step'] * 1e3:7.2f} {r['walk'] * 1e3:7.2f} {r['torch'] * 1e3:7.2f} | "
                      f"{r['torch'] / r['step']:9.1f}x {r['torch'] / r['walk']:9.1f}x",
                      flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per entry (median)")
    parser.add_argument("--quick", action="store_true", help="one batch, 3 runs: a smoke test")
    parser.add_argument("--section", choices=["all", "parts", "levels"], default="all",
                        help="parts: only section 4 (the lazy step's parts); levels: only "
                             "section 5 (every CPU level)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="levels section: wall time, or the process's CPU time (on a "
                             "machine with more runnable processes than cores, where a step "
                             "longer than a scheduler slice waits for the CPU)")
    args = parser.parse_args()
    repeat = 3 if args.quick else args.repeat
    batches = [4096] if args.quick else [4096, 65536]
    threads_list = [int(n) for n in args.threads.split(",")]
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, "
          f"torch {torch.__version__ if torch else 'absent'}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs visible")
    if args.section == "levels":
        levels_section(repeat, threads_list, args.clock)
        return
    x, m, v = make_table(N_ROWS, ROW, np.float32)
    if args.section == "parts":
        parts_section(x, m, v, repeat, 65536)
        return
    lazy_section(x, m, v, repeat, batches, ("uniform", "zipf"), threads_list)
    segment_section(repeat, batches[-1], threads_list)
    dense_section(x, m, v, repeat, batches, threads_list)
    parts_section(x, m, v, repeat, batches[-1])
    del x, m, v
    if not args.quick:  # a process per level and thread count, each with its own table
        levels_section(repeat, threads_list, args.clock)


if __name__ == "__main__":
    main()
