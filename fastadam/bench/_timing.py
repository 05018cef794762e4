"""``python -m fastadam bench``: fastadam's dense Adam step side by side with a NumPy
implementation and PyTorch's fused CPU Adam, against the machine's memory bandwidth.

Everything is measured in one process, float32, one tensor per size, median of repeats.  An
fp32 Adam step reads x, g, m, v and writes x, m, v: 28 bytes per element.  The yardstick
``fastadam.bench.stream_rw_f32`` moves exactly that traffic (same chunking and threads) with no
arithmetic, so ``bandwidth / 28 B`` is the most elements per second any Adam step can reach
once the tensors no longer fit in cache: the ceiling drawn in the plot.

The asv suite (asv_bench/benchmarks/) reuses ``numpy_adam_step``, ``torch_fused_adam`` and
``median_seconds`` so that both report the same baselines.
"""
import argparse
import math
import sys
import time

import numpy as np

BYTES_PER_ELEMENT_F32 = 28  # read x, g, m, v; write x, m, v (7 x 4 bytes)
SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)
THREADS = (1, 2)
IMPLS = ("fastadam", "numpy", "torch fused")
STREAM = "stream_rw_f32"

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def numpy_adam_step(x, g, m, v, t, tmp, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS):
    """The baseline: one Adam step ("tf" convention of ``fastadam.step_inplace``) written with
    in-place NumPy ufuncs, ``tmp`` a scratch array like ``x`` (so the step allocates nothing)."""
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    m *= beta1
    np.multiply(g, 1.0 - beta1, out=tmp)
    m += tmp
    v *= beta2
    np.multiply(g, g, out=tmp)
    tmp *= 1.0 - beta2
    v += tmp
    np.sqrt(v, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= alpha
    x -= tmp


def torch_fused_adam(xs, gs):
    """``torch.optim.Adam(fused=True)`` over NumPy arrays (shared memory, no copy), with its
    state created by one warm-up step.  Returns the optimizer; raises ImportError without torch."""
    import torch

    params = []
    for x, g in zip(xs, gs):
        p = torch.from_numpy(x)
        p.grad = torch.from_numpy(g)
        params.append(p)
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, fused=True)
    opt.step()
    return opt


def median_seconds(fn, repeats=5, min_time=0.02):
    """Median wall time of one ``fn()`` call (see :func:`median_seconds_interleaved`)."""
    return median_seconds_interleaved({"fn": fn}, repeats, min_time)["fn"]


def median_seconds_interleaved(cases, repeats=5, min_time=0.02):
    """Median wall time of one call of each function in the dict ``cases``.

    Each function gets a warm-up call and a calibration of how many back-to-back calls last
    about ``min_time`` seconds; then the ``repeats`` rounds time every function in turn, so that
    load from other processes on a shared machine hits all of them alike and ratios stay fair."""
    inner = {}
    for name, fn in cases.items():
        fn()
        start = time.perf_counter()
        fn()
        inner[name] = max(1, int(min_time / max(time.perf_counter() - start, 1e-9)))
    samples = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / inner[name])
    return {name: float(np.median(times)) for name, times in samples.items()}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def measure_dense(sizes=SIZES, threads=THREADS, repeats=5, min_time=0.02, torch=True, seed=0):
    """Time one float32 Adam step per implementation, size and thread count.

    Returns a list of dict rows: ``impl`` (fastadam, numpy, torch fused, stream_rw_f32),
    ``size``, ``threads``, ``seconds`` (median per step), ``elements_per_s`` and ``gb_per_s``
    (28 bytes per element).  NumPy is single-threaded whatever ``threads`` says; PyTorch is
    skipped when it is not importable (or ``torch=False``)."""
    import fastadam
    from fastadam.bench._yardstick import stream_rw_f32

    th = _torch() if torch else None
    rows = []
    rng = np.random.default_rng(seed)
    for size in sizes:
        x0 = rng.standard_normal(size, dtype=np.float32)
        g = rng.standard_normal(size, dtype=np.float32)
        for nt in threads:
            # Separate buffers per implementation (the yardstick adds g to its b and c, which
            # would make a second moment negative).  t stays at 10: every call does the same
            # work, and the values stay finite.
            x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
            xn, mn, vn, tmp = x0.copy(), np.zeros_like(x0), np.zeros_like(x0), np.empty_like(x0)
            sa, sb, sc = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
            # fastadam, NumPy and the yardstick share one OpenMP runtime and are timed in
            # interleaved rounds (fair ratios on a loaded machine).  PyTorch brings its own
            # libgomp, whose threads spin after each parallel region and would steal the cores
            # of the other runtime's next region: it is timed in a block of its own.
            timings = median_seconds_interleaved({
                "fastadam": lambda: fastadam.step_inplace(x, g, m, v, 10, num_threads=nt),
                "numpy": lambda: numpy_adam_step(xn, g, mn, vn, 10, tmp),
                STREAM: lambda: stream_rw_f32(sa, g, sb, sc, nt),
            }, repeats, min_time)
            if th is not None:
                opt = torch_fused_adam([x0.copy()], [g.copy()])
                saved_threads = th.get_num_threads()
                th.set_num_threads(nt)
                try:
                    timings["torch fused"] = median_seconds(opt.step, repeats, min_time)
                finally:
                    th.set_num_threads(saved_threads)
            for impl, seconds in timings.items():
                rows.append(dict(impl=impl, size=size, threads=nt, seconds=seconds,
                                 elements_per_s=size / seconds,
                                 gb_per_s=size * BYTES_PER_ELEMENT_F32 / seconds / 1e9))
    return rows


def bandwidth_ceiling(rows, threads):
    """Memory-bandwidth ceiling in elements/s for ``threads``: the stream yardstick at the
    largest size measured (the one least helped by caches), divided by 28 bytes."""
    stream = [r for r in rows if r["impl"] == STREAM and r["threads"] == threads]
    if not stream:
        return None
    return max(stream, key=lambda r: r["size"])["elements_per_s"]


def _lookup(rows):
    return {(r["impl"], r["size"], r["threads"]): r for r in rows}


def print_table(rows, file=None):
    """One line per (threads, size): throughput of each implementation in Melem/s, the
    fastadam/torch and fastadam/numpy speed-ups, and fastadam's fraction of the bandwidth."""
    file = file or sys.stdout
    table = _lookup(rows)
    sizes = sorted({r["size"] for r in rows})
    threads = sorted({r["threads"] for r in rows})
    have_torch = any(r["impl"] == "torch fused" for r in rows)
    head = (f"{'threads':>7} {'size':>9} | {'fastadam':>9} {'numpy':>9} {'torch':>9} "
            f"{'stream':>9}  Melem/s | {'vs torch':>8} {'vs numpy':>8} | {'of stream':>9} "
            f"{'of DRAM':>7}")
    print("fastadam dense Adam step, float32, median per step (28 B/element)", file=file)
    print(head, file=file)
    print("-" * len(head), file=file)
    for nt in threads:
        ceiling = bandwidth_ceiling(rows, nt)
        for size in sizes:
            def rate(impl):
                r = table.get((impl, size, nt))
                return r["elements_per_s"] if r else float("nan")

            fa, npy, tch, st = (rate(i) for i in ("fastadam", "numpy", "torch fused", STREAM))
            print(f"{nt:>7} {size:>9.0e} | {fa / 1e6:>9.1f} {npy / 1e6:>9.1f} "
                  f"{tch / 1e6 if have_torch else float('nan'):>9.1f} {st / 1e6:>9.1f}          | "
                  f"{fa / tch if have_torch else float('nan'):>7.2f}x {fa / npy:>7.2f}x | "
                  f"{fa / st:>9.0%} {fa / ceiling if ceiling else float('nan'):>7.0%}", file=file)
    for nt in threads:
        ceiling = bandwidth_ceiling(rows, nt)
        if ceiling:
            print(f"bandwidth ceiling, {nt} thread(s): {ceiling * BYTES_PER_ELEMENT_F32 / 1e9:.1f} "
                  f"GB/s = {ceiling / 1e6:.0f} Melem/s", file=file)
    if not have_torch:
        print("(PyTorch not importable: no torch column; pip install 'fastadam[torch]')",
              file=file)


def plot(rows, path):
    """Write a PNG: elements/s vs tensor size, one panel per thread count, with the bandwidth
    ceiling as a dashed line.  Returns the path, or None (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'fastadam[plot]')")
        return None
    import fastadam

    threads = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(threads), figsize=(6 * len(threads), 4.6), sharey=True,
                             squeeze=False)
    style = {"fastadam": dict(color="C0", marker="o", lw=2.2),
             "torch fused": dict(color="C3", marker="s"),
             "numpy": dict(color="C2", marker="^"),
             STREAM: dict(color="0.45", marker=".", ls=":", lw=1.2)}
    label = {"fastadam": "fastadam", "torch fused": "PyTorch Adam(fused=True)",
             "numpy": "NumPy (in-place ufuncs)", STREAM: "stream yardstick (28 B/elem, no math)"}
    for ax, nt in zip(axes[0], threads):
        for impl in ("fastadam", "torch fused", "numpy", STREAM):
            pts = sorted((r["size"], r["elements_per_s"]) for r in rows
                         if r["impl"] == impl and r["threads"] == nt)
            if pts:
                ax.plot(*zip(*pts), label=label[impl], **style[impl])
        ceiling = bandwidth_ceiling(rows, nt)
        if ceiling:
            ax.axhline(ceiling, color="k", ls="--", lw=1.2,
                       label=f"memory-bandwidth ceiling "
                             f"({ceiling * BYTES_PER_ELEMENT_F32 / 1e9:.1f} GB/s / 28 B)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensor size (float32 elements)")
        ax.set_title(f"{nt} thread{'s' if nt > 1 else ''}")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("Adam step throughput (elements/s)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    cfg = fastadam.config()
    fig.suptitle(f"fastadam {cfg['version']} dense Adam step, float32 "
                 f"(SIMD {cfg['simd_level']}, {_cpu_name()})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main(argv=None):
    """``python -m fastadam bench [--out PATH] [--quick] [--threads N ...] [--no-torch]``.
    Returns 0 (an exit status); ``measure_dense`` gives the rows themselves."""
    parser = argparse.ArgumentParser(
        prog="python -m fastadam bench",
        description="Time fastadam's dense Adam step against NumPy and PyTorch's fused Adam "
                    "(float32), print a table and write a PNG plot.")
    parser.add_argument("--out", default="fastadam_bench.png",
                        help="PNG file to write (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer, shorter repeats (about 15 s)")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS),
                        help="thread counts to measure (default: 1 2)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if args.quick:
        repeats, min_time = 3, 0.005
    else:
        repeats, min_time = 7, 0.05
    start = time.perf_counter()
    rows = measure_dense(SIZES, tuple(args.threads), repeats, min_time, torch=not args.no_torch)
    print_table(rows)
    if not args.no_plot:
        path = plot(rows, args.out)
        if path:
            print(f"plot written to {path}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0
