"""Low-precision optimizer states (issue 24): speed against the bytes each format moves, the
8-bit optimizers of other libraries on CPU tensors, and memory, in one process.

    python asv_bench/lowp_report.py [--size N] [--repeats N] [--threads 1,2] [--section S ...]

Sections (all by default):
  formats  one float32 gradient of --size elements (1e7), Adam ("torch" convention), for each
           thread count: ``fastadam.Adam`` with float32 states, bfloat16 states, 8-bit states,
           bfloat16 states with bfloat16 parameters and gradients (no goal: for reference),
           and 8-bit states with bfloat16 parameters and gradients and stochastic rounding,
           all timed in interleaved rounds with the stream loops that move each format's bytes
           (``fastadam.bench.stream_rw_bits``).  Each format: its time as a ratio to the float32
           step beside the byte limit (28 bytes / its bytes per parameter, scales included),
           and as a fraction of its stream loop (stream time / step time).
  others   ``DeepSpeedCPUAdam`` (float32 states), ``bitsandbytes.optim.Adam8bit`` and torchao's
           ``AdamW8bit`` on CPU tensors of about the same size (a multiple of 256: torchao
           keeps float32 states for other sizes), each timed beside fastadam's step of the
           same state format (a separate block per library: their OpenMP runtime is torch's);
           a library that is not installed or refuses CPU tensors is reported with its error.
  memory   ``state_bytes_per_param()`` of each object, and the resident memory of a lazy sparse
           Adam step on a 1e7 x 64 float32 table (65536 rows looked up) with float32 and with
           8-bit states (block 64: a row is whole blocks), each measured in a fresh subprocess,
           scaled to a 1e8 x 64 table.
Medians of interleaved rounds: load from other processes hits every contender alike, but not
perfectly (asv_bench/README.md, "Noise").  A goal missed, or met only within the noise, is
printed as NOT met.  DeepSpeed, bitsandbytes and torchao bring their own torch; run the
``others`` section in the environment that has them, with this checkout on PYTHONPATH.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
import fastadam  # noqa: E402
from fastadam.bench import (BYTES_PER_ELEMENT_F32, median_seconds_interleaved,  # noqa: E402
                            format_stream, step_bytes_per_element)

LR = 1e-3
BLOCK = 256

# label, Adam keywords, parameter and gradient dtype ("float32" / "bfloat16"), state bytes,
# goal (ratio to the float32 step), issue 24's figures
FORMATS = [
    ("float32 states", {}, "float32", 4, None),
    ("bfloat16 states", {"state_dtype": "bfloat16"}, "float32", 2, 1.3),
    ("int8 states", {"state_dtype": "int8", "block_size": BLOCK}, "float32", 1, 1.6),
    ("bfloat16 states, bf16 x and g", {"state_dtype": "bfloat16"}, "bfloat16", 2, None),
    ("int8 states, bf16 x and g, SR", {"state_dtype": "int8", "block_size": BLOCK,
                                       "param_rounding": "stochastic", "seed": 1},
     "bfloat16", 1, 2.5),
]
STREAM_GOAL = 0.90


def format_bytes(dtype, state_bytes):
    """Bytes per parameter of one step of a format (fastadam.bench.step_bytes_per_element)."""
    width = 2 if dtype == "bfloat16" else 4
    return step_bytes_per_element(param=width, grad=width, state=state_bytes,
                                  block=BLOCK if state_bytes == 1 else None)


def as_dtype(a, dtype):
    if dtype == "float32":
        return a.astype(np.float32)
    import ml_dtypes
    return a.astype(ml_dtypes.bfloat16)


def make_format_step(keywords, dtype, size, threads, seed=0):
    """``step()`` of a fastadam.Adam object of this format on seeded arrays, or the reason it
    cannot be built (a string)."""
    rng = np.random.default_rng(seed)
    try:
        x = as_dtype(rng.standard_normal(size, dtype=np.float32), dtype)
        g = as_dtype(rng.standard_normal(size, dtype=np.float32), dtype)
        opt = fastadam.Adam([x], lr=LR, num_threads=threads, **keywords)
        grads = [g]
        opt.step(grads)  # the states exist from here on
    except (TypeError, ValueError, ImportError) as exc:
        return f"not available here: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return lambda: opt.step(grads)


def make_stream(dtype, state_bytes, size, threads):
    """The stream loop that moves the bytes of one format's step (scratch arrays)."""
    return format_stream(2 if dtype == "bfloat16" else 4, state_bytes, size, BLOCK, threads)


def verdict(value, goal):
    return "met" if value >= goal else "NOT met"


def formats_section(size, threads_list, repeats):
    print(f"\n[formats] Adam step, {size:.0e} elements, float32 gradients unless stated; "
          f"ratio = float32 step time / format's step time; stream fraction = stream loop "
          f"time / step time (goal >= {STREAM_GOAL})")
    results = {}
    for nt in threads_list:
        cases, unavailable = {}, {}
        for label, keywords, dtype, state_bytes, _ in FORMATS:
            step = make_format_step(keywords, dtype, size, nt)
            if isinstance(step, str):
                unavailable[label] = step
                continue
            cases[label] = step
            cases["stream: " + label] = make_stream(dtype, state_bytes, size, nt)
        seconds = median_seconds_interleaved(cases, repeats)
        base = seconds.get("float32 states")
        print(f"\n  {nt} thread(s)")
        print(f"  {'format':32} {'B/param':>8} {'limit':>6} {'goal':>5} {'ms':>8} "
              f"{'ratio':>6} {'':8} {'stream ms':>9} {'fraction':>8}")
        for label, keywords, dtype, state_bytes, goal in FORMATS:
            nbytes = format_bytes(dtype, state_bytes)
            limit = BYTES_PER_ELEMENT_F32 / nbytes
            if label in unavailable:
                print(f"  {label:32} {nbytes:8.4f} {limit:6.3f}  {unavailable[label]}")
                continue
            t, ts = seconds[label], seconds["stream: " + label]
            ratio = base / t
            fraction = ts / t
            goal_text = f"{goal:5.2f}" if goal else f"{'':5}"
            status = verdict(ratio, goal) if goal else ""
            print(f"  {label:32} {nbytes:8.4f} {limit:6.3f} {goal_text} {t * 1e3:8.3f} "
                  f"{ratio:6.3f} {status:8} {ts * 1e3:9.3f} {fraction:8.3f} "
                  f"{verdict(fraction, STREAM_GOAL)}")
            results[(label, nt)] = dict(ms=t * 1e3, ratio=ratio, limit=limit, fraction=fraction,
                                        bytes=nbytes)
    return results


# ---------------------------------------------------------------------------------------------
# other libraries, on torch tensors
# ---------------------------------------------------------------------------------------------

def torch_contenders():
    """``{name: (fastadam format label, factory(params) -> optimizer)}``."""
    def deepspeed(ps):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(ps, lr=LR, adamw_mode=False)

    def bnb(ps):
        import bitsandbytes.optim
        return bitsandbytes.optim.Adam8bit(ps, lr=LR)

    def torchao(ps):
        from torchao.optim import AdamW8bit
        return AdamW8bit(ps, lr=LR, weight_decay=0.0)

    return {"DeepSpeedCPUAdam": ("float32 states", deepspeed),
            "bitsandbytes Adam8bit": ("int8 states", bnb),
            "torchao AdamW8bit": ("int8 states", torchao)}


def others_section(size, threads_list, repeats):
    # torchao quantizes a state only when its size is a multiple of its block (256), and keeps
    # float32 otherwise: 1e7 is not, so every contender here gets the multiple below it
    size -= size % BLOCK
    print(f"\n[others] other libraries' CPU Adam on one torch tensor of {size:.0e} float32 "
          f"elements, as a multiple of fastadam's float32 step and of its step with the same state "
          f"format")
    try:
        import torch
    except ImportError:
        print("  torch is not installed here: nothing to compare")
        return {}
    results = {}
    formats = {label: (keywords, dtype) for label, keywords, dtype, _, _ in FORMATS}
    for nt in threads_list:
        torch.set_num_threads(nt)
        for name, (label, factory) in torch_contenders().items():
            gen = torch.Generator().manual_seed(0)
            p = torch.nn.Parameter(torch.randn(size, generator=gen))
            p.grad = torch.randn(size, generator=gen)
            try:
                opt = factory([p])
                opt.step()
                state = opt.state[p]
            except Exception as exc:  # not installed, its op did not build, or it refuses CPU
                print(f"  {nt} thread(s) {name:24}: refused: {type(exc).__name__}: "
                      f"{' '.join(str(exc).split())[:160]}")
                continue
            kinds = sorted(f"{k} {type(v).__name__} {str(v.dtype).replace('torch.', '')}"
                           f"[{v.numel()}]"
                           for k, v in state.items() if hasattr(v, "dtype") and v.numel() > 1)
            cases = {"fastadam float32 states": make_format_step(*formats["float32 states"],
                                                                 size, nt)}
            same = make_format_step(*formats[label], size, nt)
            if isinstance(same, str):
                print(f"  {nt} thread(s) {name:24}: (fastadam {label} {same})")
            elif label != "float32 states":
                cases["fastadam " + label] = same
            cases[name] = opt.step
            t = median_seconds_interleaved(cases, repeats)
            ratios = "  ".join(f"{t[name] / t[k]:5.2f}x {k}'s time ({t[k] * 1e3:.3f} ms)"
                               for k in cases if k != name)
            print(f"  {nt} thread(s) {name:24}: {t[name] * 1e3:9.3f} ms = {ratios}; its "
                  f"state: {', '.join(kinds)}")
            results[(name, nt)] = dict(ms=t[name] * 1e3, **{
                k: t[name] / t[k] for k in cases if k != name})
    return results


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------

TABLE_ROWS, TABLE_DIM, LOOKUPS, SPARSE_BLOCK = 10**7, 64, 65536, 64
MEMORY_FORMATS = [("float32 states", {}),
                  ("bfloat16 states", {"state_dtype": "bfloat16"}),
                  ("int8 states (block 64)", {"state_dtype": "int8", "block_size": SPARSE_BLOCK})]


def rss_bytes():
    """This process's resident set, from /proc (Linux), or its peak elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_child(keywords, rows, dim):
    """In a fresh process: the RSS before the table, with the table, and after two lazy sparse
    steps (the states exist and have been written); prints one JSON line."""
    before = rss_bytes()
    rng = np.random.default_rng(0)
    table = np.empty((rows, dim), np.float32)
    for start in range(0, rows, 1 << 20):  # in slices: no float64 temporary of the table
        stop = min(rows, start + (1 << 20))
        table[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
    with_table = rss_bytes()
    opt = fastadam.Adam([table], lr=LR, **keywords)
    for _ in range(2):
        ids = np.unique(rng.integers(0, rows, LOOKUPS))
        values = rng.standard_normal((ids.size, dim), dtype=np.float32)
        opt.step([fastadam.IndexedSlices(values, ids, table.shape)])
    after = rss_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(dict(before=before, with_table=with_table, after=after, peak=peak,
                          state_bytes=int(opt.state_bytes()),
                          per_param=float(opt.state_bytes_per_param()))))


def memory_section(rows, dim):
    print("\n[memory] state_bytes_per_param() of each object, and the RSS of a lazy sparse Adam "
          f"step on a {rows:.0e} x {dim} float32 table ({LOOKUPS} rows looked up), one fresh "
          f"process per format; 'state' = RSS after the steps - RSS with the table alone")
    scale = 10**8 / rows
    results = {}
    for label, keywords in MEMORY_FORMATS:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child",
                               json.dumps(keywords), "--rows", str(rows), "--dim", str(dim)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"  {label:24}: not available here: "
                  f"{(proc.stderr.strip().splitlines() or ['?'])[-1][:120]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        state = r["after"] - r["with_table"]
        table = r["with_table"] - r["before"]
        print(f"  {label:24}: state_bytes_per_param {r['per_param']:.4f}; table "
              f"{table / 1e9:5.2f} GB, state (RSS) {state / 1e9:5.2f} GB "
              f"(state_bytes() {r['state_bytes'] / 1e9:5.2f} GB), peak RSS "
              f"{r['peak'] / 1e9:5.2f} GB; at 1e8 x {dim}: state {state * scale / 1e9:5.1f} GB")
        results[label] = dict(per_param=r["per_param"], state_gb=state / 1e9,
                              state_1e8_gb=state * scale / 1e9, peak_gb=r["peak"] / 1e9)
    return results


def markdown_formats(results, threads_list):
    """The formats section as a markdown table (ratios with the byte limits beside them)."""
    head = ("| states (Adam, float32 gradients unless said) | bytes / param | byte limit | goal | "
            + " | ".join(f"{nt} thread{'s' if nt > 1 else ''}" for nt in threads_list)
            + f" | of its stream loop ({' / '.join(map(str, threads_list))} threads; goal "
            f"{STREAM_GOAL}) |")
    lines = [head, "|---" * (5 + len(threads_list)) + "|"]
    for label, _, dtype, state_bytes, goal in FORMATS:
        nbytes = format_bytes(dtype, state_bytes)
        cells = []
        for nt in threads_list:
            r = results.get((label, nt))
            cells.append("n/a" if r is None else f"{r['ratio']:.2f}x" + (
                "" if goal is None or r["ratio"] >= goal else " **NOT met**"))
        fractions = [results[(label, nt)]["fraction"] for nt in threads_list
                     if (label, nt) in results]
        frac = " / ".join(f"{f:.2f}" for f in fractions) + (
            " **NOT met**" if any(f < STREAM_GOAL for f in fractions) else "")
        lines.append(f"| {label} | {nbytes:g} | {BYTES_PER_ELEMENT_F32 / nbytes:.3g}x | "
                     f"{f'{goal}x' if goal else ''} | " + " | ".join(cells) + f" | {frac} |")
    return "\n".join(lines) + "\n"


def markdown_others(results, threads_list):
    """The others section as a markdown table: each library's time over fastadam's with float32
    states, and with the library's state format."""
    lines = ["| library, CPU tensors: its time / fastadam's (float32 states; same format) | "
             + " | ".join(f"{nt} thread{'s' if nt > 1 else ''}" for nt in threads_list) + " |",
             "|---" * (1 + len(threads_list)) + "|"]
    for name in torch_contenders():
        cells = []
        for nt in threads_list:
            r = results.get((name, nt))
            cells.append("refused" if r is None else "; ".join(
                f"{v:.2f}x" for k, v in r.items() if k != "ms"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10**7)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated thread counts (default 1 and 2, all cores here)")
    parser.add_argument("--section", action="append", choices=["formats", "others", "memory"])
    parser.add_argument("--rows", type=int, default=TABLE_ROWS)
    parser.add_argument("--dim", type=int, default=TABLE_DIM)
    parser.add_argument("--markdown", help="also write the formats and others tables here")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child is not None:
        memory_child(json.loads(args.memory_child), args.rows, args.dim)
        return
    threads = [int(t) for t in args.threads.split(",")]
    sections = args.section or ["formats", "others", "memory"]
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, "
          f"{os.cpu_count()} CPUs; medians of {args.repeats} interleaved rounds")
    tables = []
    if "formats" in sections:
        tables.append(markdown_formats(formats_section(args.size, threads, args.repeats),
                                       threads))
    if "others" in sections:
        tables.append(markdown_others(others_section(args.size, threads, args.repeats),
                                      threads))
    if "memory" in sections:
        memory_section(args.rows, args.dim)
    if args.markdown and tables:
        with open(args.markdown, "w") as f:
            f.write("\n".join(tables))


if __name__ == "__main__":
    main()
