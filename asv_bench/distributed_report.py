"""Report for fastadam.distributed (issue 14): memory per rank and the cost of a sharded step.

    PYTHONPATH=. python asv_bench/distributed_report.py [--ranks 2] [--size 1e7] [--repeat 15]

(from the repository root after ``python setup.py build_ext --inplace``, or with fastadam[mpi]
installed).  It starts itself under ``mpiexec -n RANKS --oversubscribe`` with one OpenMP
thread per rank (2 ranks fill the 2-core machine).

1. Memory: resident set (RSS, /proc/self/statm) each rank gains when an optimizer is built and
   stepped over SIZE float32 parameters: unsharded ``fastadam.Adam`` vs ``ShardedOptimizer``.
   The sharded RSS includes, beside the 1/N state, the averaged-gradient slice (1/N) and the
   receive buffer of the reduce-scatter ((N-1)/N), both sized by the gradient, not the state.
2. Time of one step over SIZE float32 parameters (ms, median of rounds; every column timed in
   the same round, round-robin, so that a slow spell hits them alike):
   - ``MPI_Allreduce`` of the gradient (Open MPI's default algorithm), the communication plain
     data-parallel training needs, and the issue's yardstick;
   - the sharded step's collectives alone (rank-order reduce-scatter + all-gather);
   - the fused Adam step on one rank's slice;
   - ``ShardedOptimizer.step`` (all of it);
   - plain data parallel: ``MPI_Allreduce`` + a fused step over all SIZE parameters.
3. ShardedEmbedding, 1e6 x 64 float32, 16384 Zipf-like ids per rank: lookup and
   apply_gradients, against the local sparse step alone.
4. The measured per-rank costs put into the cost model of docs/guide/distributed.md (100 Gb/s links).
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def relaunch(args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        mpiexec = "mpiexec"
    command = [mpiexec, "-n", str(args.ranks), "--oversubscribe", sys.executable, "-m", "mpi4py",
               os.path.abspath(__file__), "--worker", "--size", str(args.size), "--repeat",
               str(args.repeat)]
    return subprocess.call(command, env=env)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median_times(comm, fns, repeat):
    """Median seconds of each ``fn`` (max over ranks of each round), round-robin."""
    times = [[] for _ in fns]
    for round_ in range(repeat + 1):
        for fn, bucket in zip(fns, times):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if round_:                      # the first round warms up
                bucket.append(elapsed)
    return [float(np.median(b)) for b in times]


def memory_section(comm, n):
    rank, size = comm.Get_rank(), comm.Get_size()
    params = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    grad = np.random.default_rng(rank + 100).standard_normal(n).astype(np.float32)
    rows = []
    for name in ("fastadam.Adam (unsharded)", "ShardedOptimizer"):
        comm.Barrier()
        before = rss_bytes()
        opt = fastadam.Adam([params], lr=1e-3, convention="torch")
        if name == "ShardedOptimizer":
            opt = ShardedOptimizer(opt, comm)
            state = sum(a.nbytes for g in opt._groups for a in g.inner.m + g.inner.v)
        else:
            state = sum(a.nbytes for a in opt.m + opt.v)
        opt.step([grad])
        gained = rss_bytes() - before
        rows.append((name, comm.gather(gained), comm.gather(state)))
        del opt
    if rank == 0:
        print(f"\n1. Memory per rank, {n:.0e} float32 parameters ({n * 4 / 1e6:.0f} MB), "
              f"{size} ranks (MB)")
        print(f"{'optimizer':>26} | {'state bytes':>11} | RSS gained by each rank")
        for name, gained, state in rows:
            print(f"{name:>26} | {state[0] / 1e6:11.1f} | "
                  + "  ".join(f"{g / 1e6:7.1f}" for g in gained))
        (_, unsharded, s_full), (_, sharded, s_part) = rows
        print(f"state per rank / unsharded state: {s_part[0] / s_full[0]:.3f} (1/N = "
              f"{1 / size:.3f}); RSS per rank / unsharded RSS: "
              f"{np.mean(sharded) / np.mean(unsharded):.3f}")


def step_section(comm, n, repeat):
    rank, size = comm.Get_rank(), comm.Get_size()
    params = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    grad = np.random.default_rng(rank + 100).standard_normal(n).astype(np.float32)
    summed = np.empty_like(grad)
    sharded = ShardedOptimizer(fastadam.Adam([params], lr=1e-4, convention="torch"), comm)
    group = sharded._groups[0]
    full = fastadam.Adam([params.copy()], lr=1e-4, convention="torch")
    lo, hi = group.lo, group.hi
    slice_m, slice_v = np.zeros(hi - lo, np.float32), np.zeros(hi - lo, np.float32)
    slice_x = params[lo:hi].copy()

    def allreduce():
        comm.Allreduce(grad, summed, op=MPI.SUM)

    def collectives():
        reduce_scatter_in_rank_order(comm, grad, group.bounds, group.scratch, group.grad_slice)
        allgather_in_place(comm, group.flat, group.bounds)

    def local_step():
        fastadam.step_inplace(slice_x, grad[lo:hi], slice_m, slice_v, 1, lr=1e-4,
                              convention="torch", num_threads=1)

    def sharded_step():
        sharded.step([grad])

    def data_parallel():
        comm.Allreduce(grad, summed, op=MPI.SUM)
        full.step([summed])

    names = ["MPI_Allreduce", "reduce-scatter + all-gather", "fused step on the slice",
             "ShardedOptimizer.step", "Allreduce + full fused step"]
    times = median_times(comm, [allreduce, collectives, local_step, sharded_step, data_parallel],
                         repeat)
    if rank == 0:
        print(f"\n2. One step, {n:.0e} float32 parameters, {size} ranks, 1 thread each "
              f"(ms, median of {repeat})")
        for name, t in zip(names, times):
            print(f"{name:>30} {t * 1e3:9.2f}   {t / times[0]:5.2f}x the all-reduce")
        print(f"sharded step / (collectives + step alone): "
              f"{times[3] / (times[1] + times[2]):.2f}")
    return times


def embedding_section(comm, repeat):
    rank, size = comm.Get_rank(), comm.Get_size()
    rows, dim, batch = 10**6, 64, 16384
    table = ShardedEmbedding(rows, dim, comm, lr=1e-3, convention="torch")
    rng = np.random.default_rng(rank)
    ids = np.minimum(rng.zipf(1.2, batch) - 1, rows - 1).astype(np.int64)
    grad_rows = rng.standard_normal((batch, dim)).astype(np.float32)
    unique, sums = fastadam.segment_sum(ids, grad_rows)
    local = np.minimum(unique // size, len(table.rows) - 1)
    x = table.weight.copy()
    m, v = np.zeros_like(x), np.zeros_like(x)

    def lookup():
        table.lookup(ids)

    def apply():
        table.apply_gradients((ids, grad_rows))

    def local_sparse_step():
        fastadam.sparse_step_inplace(x, (local, sums), m, v, 1, lr=1e-3, convention="torch",
                                     num_threads=1)

    times = median_times(comm, [lookup, apply, local_sparse_step], repeat)
    distinct = comm.gather(len(unique))
    if rank == 0:
        print(f"\n3. ShardedEmbedding 1e6 x 64 float32, {batch} Zipf(1.2) ids per rank "
              f"({distinct} distinct), {size} ranks (ms, median of {repeat})")
        for name, t in zip(["lookup", "apply_gradients", "local sparse step (its rows)"], times):
            print(f"{name:>30} {t * 1e3:9.2f}")
    return times, len(unique)


def cost_model(step_times, n, size, embedding_times, distinct):
    """Per-step seconds on N ranks for the two workloads of the issue, from the measured local
    costs and the collectives' bandwidth terms at 100 Gb/s (latency alpha = 5 us)."""
    bandwidth, alpha = 100e9 / 8, 5e-6
    step_per_element = step_times[2] / (n / size)           # measured, one thread
    sparse_per_row = embedding_times[2] / distinct
    print("\n4. Cost model, 100 Gb/s per rank (12.5 GB/s), alpha = 5 us, the measured local "
          f"costs ({step_per_element * 1e9:.2f} ns per Adam element on one thread, "
          f"{sparse_per_row * 1e6:.2f} us per 64-wide sparse row)")
    print(f"{'workload':>38} {'N':>3} | {'comm s':>8} {'local s':>8} {'total s':>8} | "
          f"{'state GB/rank':>13}")
    params = 1e9
    for ranks in (8, 64):
        comm_s = 2 * (ranks - 1) / ranks * params * 4 / bandwidth + 2 * (ranks - 1) * alpha
        local_s = params / ranks * step_per_element
        print(f"{'1e9 float32, ZeRO-1 step':>38} {ranks:>3} | {comm_s:8.3f} {local_s:8.3f} "
              f"{comm_s + local_s:8.3f} | {params * 8 / ranks / 1e9:13.2f}")
        print(f"{'1e9 float32, all-reduce + full step':>38} {ranks:>3} | {comm_s:8.3f} "
              f"{params * step_per_element:8.3f} {comm_s + params * step_per_element:8.3f} | "
              f"{params * 8 / 1e9:13.2f}")
    table_rows, dim, unique = 1e8, 64, 65536
    for ranks in (8, 64):
        # lookup: ids out, rows back; apply: ids and rows out; (N-1)/N of them leave the rank
        bytes_moved = unique * (2 * 8 + 2 * dim * 4) * (ranks - 1) / ranks
        comm_s = bytes_moved / bandwidth + 5 * (ranks - 1) * alpha
        local_s = unique * sparse_per_row
        print(f"{'1e8 x 64 table, 65536 distinct ids/rank':>38} {ranks:>3} | {comm_s:8.4f} "
              f"{local_s:8.4f} {comm_s + local_s:8.4f} | "
              f"{table_rows * dim * 4 * 3 / ranks / 1e9:13.2f}")


def worker(args):
    n = int(float(args.size))
    memory_section(MPI.COMM_WORLD, n)
    step_times = step_section(MPI.COMM_WORLD, n, args.repeat)
    embedding_times, distinct = embedding_section(MPI.COMM_WORLD, args.repeat)
    if MPI.COMM_WORLD.Get_rank() == 0:
        cost_model(step_times, n, MPI.COMM_WORLD.Get_size(), embedding_times, distinct)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="1e7")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker:
        sys.exit(relaunch(args))
    from mpi4py import MPI

    import fastadam
    from fastadam.distributed import ShardedEmbedding, ShardedOptimizer
    from fastadam.distributed._collectives import allgather_in_place, reduce_scatter_in_rank_order
    worker(args)
