"""``python -m fastadam bench``: fastadam's dense Adam step beside a NumPy implementation and
PyTorch's fused CPU Adam, against the machine's memory bandwidth.

Everything is measured in one process, float32, one tensor per size, in interleaved rounds
(``sample_seconds_interleaved``); each row keeps the median and the quartiles of its rounds.
The yardstick ``stream_rw_f32`` moves an Adam step's 28 bytes per element (same chunking and
threads) with no arithmetic: ``bandwidth / 28 B`` is the most elements per second any Adam
step can reach once the tensors leave the caches, the ceiling drawn in the plot.

Results that cannot be right are flagged, printed with the reason and left out of the plot:
N threads much slower than one (the cores are busy: other processes or spinning threads), a
step far faster than the yardstick that moves its bytes, or rounds that disagree wildly.
"""
import argparse
import sys
import time

import numpy as np

from ._timing import (BYTES_PER_ELEMENT_F32, _torch, numpy_adam_step,
                      sample_seconds_interleaved, torch_fused_adam)

SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)
THREADS = (1, 2)
STREAM = "stream_rw_f32"
IMPLS = ("fastadam", "numpy", "torch fused", STREAM)
SLOWER_WITH_THREADS = 2.0   # N threads this much slower than 1: flagged
ABOVE_YARDSTICK = 1.5       # this much faster than the bytes allow (sizes >= 1e6): flagged
SPREAD = 1.0                # interquartile range above this fraction of the median: flagged


def _row(impl, size, nt, samples):
    q25, med, q75 = np.percentile(samples, [25, 50, 75])
    return dict(impl=impl, size=size, threads=nt, seconds=float(med),
                elements_per_s=size / med, low=size / q75, high=size / q25,
                gb_per_s=size * BYTES_PER_ELEMENT_F32 / med / 1e9,
                spread=float((q75 - q25) / med), flag=None)


def measure_dense(sizes=SIZES, threads=THREADS, repeats=5, min_time=0.02, torch=True, seed=0):
    """Time one float32 Adam step per implementation, size and thread count.

    Returns a list of dict rows: ``impl`` (fastadam, numpy, torch fused, stream_rw_f32),
    ``size``, ``threads``, ``seconds`` (median per step), ``elements_per_s`` with its quartiles
    ``low`` and ``high``, ``gb_per_s`` (28 bytes per element), ``spread`` (interquartile range
    / median) and ``flag`` (None, or why the row is implausible: see :func:`flag_implausible`).
    NumPy is single-threaded whatever ``threads`` says; PyTorch is left out when it is not
    importable (or ``torch=False``)."""
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
            # interleaved rounds.  PyTorch brings its own libgomp, whose threads spin after
            # each parallel region and would steal the cores of the other runtime's next
            # region: it is timed in a block of its own.
            samples = sample_seconds_interleaved({
                "fastadam": lambda: fastadam.step_inplace(x, g, m, v, 10, num_threads=nt),
                "numpy": lambda: numpy_adam_step(xn, g, mn, vn, 10, tmp),
                STREAM: lambda: stream_rw_f32(sa, g, sb, sc, nt),
            }, repeats, min_time)
            if th is not None:
                opt = torch_fused_adam([x0.copy()], [g.copy()])
                saved_threads = th.get_num_threads()
                th.set_num_threads(nt)
                try:
                    samples.update(sample_seconds_interleaved({"torch fused": opt.step},
                                                              repeats, min_time))
                finally:
                    th.set_num_threads(saved_threads)
            rows.extend(_row(impl, size, nt, s) for impl, s in samples.items())
    return flag_implausible(rows)


def flag_implausible(rows):
    """Set each row's ``flag`` to the reason it cannot be trusted, or leave it None: N threads
    much slower than one, rounds that disagree, then (against an unflagged yardstick row of the
    same size and threads) a step faster than the bytes it moves allow."""
    table = {(r["impl"], r["size"], r["threads"]): r for r in rows}
    for r in rows:
        one = table.get((r["impl"], r["size"], 1))
        if (r["threads"] > 1 and one is not None and r["impl"] != "numpy"
                and one["elements_per_s"] > SLOWER_WITH_THREADS * r["elements_per_s"]):
            r["flag"] = (f"{r['threads']} threads {one['elements_per_s'] / r['elements_per_s']:.0f}x"
                         f" slower than 1: the cores are busy (other processes, or threads of "
                         f"another runtime spinning)")
        elif r["spread"] > SPREAD:
            r["flag"] = f"rounds disagree (interquartile range {r['spread']:.0%} of the median)"
    for r in rows:
        stream = table.get((STREAM, r["size"], r["threads"]))
        if (r["flag"] is None and r["impl"] != STREAM and stream is not None
                and stream["flag"] is None and r["size"] >= 10**6
                and r["elements_per_s"] > ABOVE_YARDSTICK * stream["elements_per_s"]):
            r["flag"] = (f"{r['elements_per_s'] / stream['elements_per_s']:.0%} of the "
                         f"bandwidth yardstick: faster than its bytes allow")
    return rows


def bandwidth_ceiling(rows, threads):
    """Memory-bandwidth ceiling in elements/s for ``threads``: the stream yardstick at the
    largest size measured (the one least helped by caches), divided by 28 bytes; None if that
    row is missing or flagged."""
    stream = [r for r in rows if r["impl"] == STREAM and r["threads"] == threads]
    if not stream:
        return None
    top = max(stream, key=lambda r: r["size"])
    return None if top["flag"] else top["elements_per_s"]


def print_table(rows, file=None):
    """One line per (threads, size): throughput of each implementation (Melem/s, median of the
    rounds, +- half the interquartile range in %), speed-ups, and fractions of the bandwidth.
    Flagged values are marked ``!`` and explained below the table."""
    file = file or sys.stdout
    table = {(r["impl"], r["size"], r["threads"]): r for r in rows}
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    have_torch = "torch fused" in impls
    title = {"fastadam": "fastadam", "numpy": "NumPy", "torch fused": "torch", STREAM: "stream"}
    cols = [f"{title[i] + ' Melem/s':>18}" for i in impls]
    ratios = (["fa/torch (x)"] if have_torch else []) + ["fa/NumPy (x)"]
    head = (f"{'threads':>7} {'size':>7} | " + " ".join(cols) + " | "
            + " ".join(f"{c:>12}" for c in ratios)
            + f" | {'of stream (%)':>13} {'of DRAM (%)':>11}")
    print("fastadam dense Adam step, float32, 28 B/element; median of interleaved rounds "
          "+- half their interquartile range", file=file)
    print(simd_line(), file=file)
    print(head, file=file)
    print("-" * len(head), file=file)
    notes = []
    for nt in sorted({r["threads"] for r in rows}):
        ceiling = bandwidth_ceiling(rows, nt)
        for size in sorted({r["size"] for r in rows}):
            cells = []
            for impl in impls:
                r = table.get((impl, size, nt))
                if r is None:
                    cells.append(f"{'-':>18}")
                    continue
                mark = "!" if r["flag"] else " "
                if r["flag"]:
                    notes.append(f"! {impl}, {nt} thread(s), size {size:.0e}: {r['flag']}")
                cells.append(f"{r['elements_per_s'] / 1e6:>10.1f} +-{r['spread'] * 50:>3.0f}%{mark}")
            fa = table[("fastadam", size, nt)]["elements_per_s"]
            rat = []
            if have_torch:
                rat.append(fa / table[("torch fused", size, nt)]["elements_per_s"])
            rat.append(fa / table[("numpy", size, nt)]["elements_per_s"])
            st = table[(STREAM, size, nt)]["elements_per_s"]
            dram = f"{100 * fa / ceiling:>11.0f}" if ceiling else f"{'-':>11}"
            print(f"{nt:>7} {size:>7.0e} | " + " ".join(cells) + " | "
                  + " ".join(f"{q:>12.2f}" for q in rat) + f" | {100 * fa / st:>13.0f} {dram}",
                  file=file)
    for nt in sorted({r["threads"] for r in rows}):
        ceiling = bandwidth_ceiling(rows, nt)
        if ceiling:
            print(f"bandwidth ceiling, {nt} thread(s): {ceiling * BYTES_PER_ELEMENT_F32 / 1e9:.1f} "
                  f"GB/s = {ceiling / 1e6:.0f} Melem/s", file=file)
    for note in notes:
        print(note, file=file)
    if notes:
        print("flagged values are left out of the plot; rerun on an idle machine", file=file)
    if not have_torch:
        print("(PyTorch not importable: no torch columns; its CPU build installs with "
              "pip install torch --index-url https://download.pytorch.org/whl/cpu)", file=file)


def plot(rows, path):
    """Write a PNG: elements/s vs tensor size (median, error bars from the quartiles), one
    panel per thread count, the bandwidth ceiling dashed; flagged rows are left out.  Returns
    the path, or None (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
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
            pts = sorted((r["size"], r["elements_per_s"], r["low"], r["high"]) for r in rows
                         if r["impl"] == impl and r["threads"] == nt and not r["flag"])
            if pts:
                size, med, low, high = (np.array(c) for c in zip(*pts))
                ax.errorbar(size, med, yerr=[med - low, high - med], capsize=3,
                            label=label[impl], **style[impl])
        ceiling = bandwidth_ceiling(rows, nt)
        if ceiling:
            ax.axhline(ceiling, color="k", ls="--", lw=1.2,
                       label=f"memory-bandwidth ceiling "
                             f"({ceiling * BYTES_PER_ELEMENT_F32 / 1e9:.1f} GB/s / 28 B)")
        if any(r["flag"] and r["threads"] == nt for r in rows):
            ax.text(0.02, 0.02, "some results flagged implausible and left out (see the table)",
                    transform=ax.transAxes, fontsize=7, color="C3")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensor size (float32 elements)")
        ax.set_title(f"{nt} thread{'s' if nt > 1 else ''}")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("Adam step throughput (elements/s)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    cfg = fastadam.config()
    fig.suptitle(f"fastadam {cfg['version']} dense Adam step, float32 "
                 f"(SIMD {cfg['simd_level']}, {_cpu_name()}); median and quartiles", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def simd_line():
    """The CPU level the kernels ran, the CPU's best and the FASTADAM_CPU_LEVEL cap, one line."""
    import fastadam

    cfg = fastadam.config()
    return (f"SIMD level in use: {cfg['simd_level']} (CPU's best {cfg['simd_cpu_best']}, "
            f"cap: {cfg['simd_cap']}), CPU: {_cpu_name()}")


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


def add_arguments(parser):
    """The options of ``python -m fastadam bench`` (shared with the command without a verb)."""
    parser.add_argument("--out", default="fastadam_bench.png", metavar="PNG",
                        help="plot file to write (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (~15 s)")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS), metavar="N",
                        help="thread counts to measure (default: 1 2)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    parser.add_argument("--no-plot", action="store_true", help="print the table only")


def run(args):
    """Measure, print the table, write the plot; returns 0 (an exit status)."""
    repeats, min_time = (5, 0.005) if args.quick else (9, 0.05)
    start = time.perf_counter()
    rows = measure_dense(SIZES, tuple(args.threads), repeats, min_time, torch=not args.no_torch)
    print_table(rows)
    if not args.no_plot:
        path = plot(rows, args.out)
        if path:
            print(f"plot written to {path}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


def main(argv=None):
    """``python -m fastadam bench [--out PNG] [--quick] [--threads N ...] [--no-torch]``."""
    parser = argparse.ArgumentParser(prog="python -m fastadam bench", description=__doc__.split(
        "\n\n")[0].replace("``", ""))
    add_arguments(parser)
    return run(parser.parse_args(argv))
