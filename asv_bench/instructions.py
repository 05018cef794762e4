"""Instruction-count gate (issue 21): deterministic costs of the hot paths, under callgrind.

    python asv_bench/instructions.py                  # count every case, compare, exit 1 on +25%
    python asv_bench/instructions.py --save           # ... and store the counts of HEAD
    python asv_bench/instructions.py --cases 'sparse' # only the cases whose name matches
    python asv_bench/instructions.py --run-cases REPEATS NAME...   # (internal) the driver

Wall time on a shared 2-core machine moves by 20-50% with the load; the number of instructions
a step executes does not (valgrind counts them exactly; PYTHONHASHSEED is fixed).  Each case is
a small seeded workload (a dense step per optimizer, a list step, sparse steps, segment_sum,
the Adam object with bfloat16 and 8-bit states, and one step of each front-end: the autodiff MLP, the ONNX training session, the scikit-learn
estimators' compiled epoch);
all run in one process under ``valgrind --tool=callgrind``, which counts only the REPEATS calls
of each case after WARMUP uncounted calls (see "measuring" below): the compiled kernel plus the
Python overhead of the call, not start-up or set-up.  The dense cases cover every optimizer
class the package exports (a new optimizer is gated as soon as it is exported).

Counts are stored per commit in asv_bench/instructions/<commit>.json.  The gate compares
against the newest ancestor of HEAD with stored counts and fails when any case costs more than
THRESHOLD (1.25) times its stored count.  Counts depend on the CPU level the kernels run
(fastadam/_core/_cpu_level.py), so each record stores it ("simd_level") and the run counts at
the base's level (FASTADAM_CPU_LEVEL; a record without one was counted at x86-64-v3); --level
picks another.  Valgrind reports the CPU as AVX2 at most: x86-64-v3 or baseline.
Exit status: 0 pass (or no stored ancestor), 1 a case regressed, 2 valgrind missing.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STORE = os.path.join(HERE, "instructions")
THRESHOLD = 1.25
REPEATS = 4
LAYOUT_STRIDE = 1024  # bytes between the page offsets of a dense case's arrays (see placed)
WARMUP = 10  # uncounted calls first: CPython 3.11 specialises a code object after ~8 runs


# ---- the cases: name -> a function returning the call to count (run inside valgrind) ------

def placed(arrays):
    """Copies of `arrays`, the k-th starting LAYOUT_STRIDE * k bytes after a page boundary.

    Where the heap puts a step's arrays relative to each other moves a 1e5-element step's
    wall time by up to 20% on one machine (the same loads and stores, other cache sets), and
    the heap depends on what the process did before: the base and the candidate of the
    wall-time gate import different modules.  A fixed layout makes their ratio about the code.
    """
    import numpy as np

    out = []
    for k, a in enumerate(arrays):
        a = np.ascontiguousarray(a)
        offset = LAYOUT_STRIDE * (k % 4)
        buf = np.empty(a.nbytes + offset + 4096, np.uint8)
        start = -buf.ctypes.data % 4096 + offset
        view = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        out.append(view)
    return out


def _dense_arrays(n, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    return x, g


def _optimizer_classes():
    import fastadam

    # every exported optimizer of dense gradients (SparseAdam takes sparse ones only)
    return sorted((obj for obj in vars(fastadam).values()
                   if isinstance(obj, type) and issubclass(obj, fastadam.Optimizer)
                   and obj is not fastadam.Optimizer and obj.dense_gradients),
                  key=lambda c: c.__name__)


def _optimizer_case(cls, n):
    def build():
        x, g = placed(_dense_arrays(n))
        opt = cls([x], lr=1e-3, num_threads=1)
        return lambda: opt.step([g])
    return build


def _functional_case(n):
    def build():
        import numpy as np

        import fastadam

        x, g = _dense_arrays(n)
        x, g, m, v = placed([x, g, np.zeros_like(x), np.zeros_like(x)])
        return lambda: fastadam.step_inplace(x, g, m, v, 1, num_threads=1)
    return build


def _list_case(count, n):
    def build():
        import numpy as np

        import fastadam

        pairs = [_dense_arrays(n, seed) for seed in range(count)]
        xs, gs = [p[0] for p in pairs], [p[1] for p in pairs]
        ms, vs = [np.zeros_like(x) for x in xs], [np.zeros_like(x) for x in xs]
        return lambda: fastadam.step_inplace(xs, gs, ms, vs, 1, num_threads=1)
    return build


def _sparse_inputs(dist, n_rows=20_000, row=64, batch=4096):
    import numpy as np

    rng = np.random.default_rng(42)
    if dist == "uniform":
        idx = rng.integers(0, n_rows, size=batch, dtype=np.int64)
    else:  # Zipf(1.3) ranks scattered over the table, as asv_bench/benchmarks/bench_sparse.py
        idx = (((rng.zipf(1.3, size=batch) - 1) % n_rows) * 2654435761 % n_rows).astype(np.int64)
    values = rng.standard_normal((batch, row)).astype(np.float32)
    x = rng.standard_normal((n_rows, row), dtype=np.float32)
    return idx, values, x


def _sparse_case(mode, dist, row=64):
    def build():
        import numpy as np

        import fastadam

        idx, values, x = _sparse_inputs(dist, row=row)
        m, v = np.zeros_like(x), np.zeros_like(x)
        last = np.zeros(x.shape[0], np.int64)
        kw = {"last_step": last} if mode == "catchup" else {}
        state = {"t": 1}

        def call():
            state["t"] += 1
            fastadam.sparse_step_inplace(x, (idx, values), m, v, state["t"], mode=mode,
                                         num_threads=1, **kw)
        return call
    return build


def _segment_sum_case(dist):
    def build():
        import fastadam

        idx, values, _ = _sparse_inputs(dist)
        return lambda: fastadam.segment_sum(idx, values, num_threads=1)
    return build


def _lowp_case(state_dtype, n):
    def build():
        import numpy as np

        import fastadam

        # an Adam object with low-precision states (fastadam/_core/_lowp.pyx's kernels)
        x, g = _dense_arrays(n)
        opt = fastadam.Adam([x], lr=1e-3, num_threads=1, state_dtype=state_dtype,
                            min_8bit_size=0)  # 8-bit states at any size
        return lambda: opt.step([g])
    return build


def _benchmark_module(name):
    """A module of asv_bench/benchmarks/ (they run as top-level modules there too)."""
    import importlib

    path = os.path.join(HERE, "benchmarks")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


def _autodiff_case():
    def build():
        import numpy as np

        # the tape engine: forward and backward of the digits-sized MLP (64-64-10, batch 64)
        return _benchmark_module("bench_autodiff").build_mlp("fastadam", np.float32, 64,
                                                             sizes=(64, 64, 10))
    return build


def _onnx_case():
    def build():
        # one TrainingSession step (forward, Gradient node, Adam node) of the same MLP in ONNX
        return _benchmark_module("bench_onnx").make_step("session", (64, 64, 10), 64)
    return build


def _sklearn_case():
    def build():
        # one epoch of the estimators' compiled loop on the digits (9 batches, Adam per batch)
        return _benchmark_module("bench_sklearn").build_mlp_epochs("relu")["compiled"]
    return build


def _have(*modules):
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def cases():
    """The ordered {name: builder} table (names are stable: they key the stored counts).  The
    front-end cases need their extras (onnx, scikit-learn); without them they are left out."""
    table = {}
    for n in (1_000, 100_000):
        table[f"step_inplace/adam/{n}"] = _functional_case(n)
        for cls in _optimizer_classes():
            table[f"optimizer_step/{cls.__name__}/{n}"] = _optimizer_case(cls, n)
    table["step_inplace/list100x1000"] = _list_case(100, 1_000)
    for mode in ("lazy", "catchup"):
        for dist in ("zipf", "uniform"):
            table[f"sparse/{mode}/{dist}/row64"] = _sparse_case(mode, dist)
    table["sparse/lazy/zipf/row8"] = _sparse_case("lazy", "zipf", row=8)
    table["sparse/dense/zipf/row64"] = _sparse_case("dense", "zipf")
    for dist in ("zipf", "uniform"):
        table[f"segment_sum/{dist}"] = _segment_sum_case(dist)
    for state_dtype in ("bfloat16", "int8"):
        if state_dtype != "bfloat16" or _have("ml_dtypes"):
            table[f"lowp/Adam/{state_dtype}/100000"] = _lowp_case(state_dtype, 100_000)
            # one small tensor: the object's per-step path (its prepared and compiled step)
            table[f"lowp/Adam/{state_dtype}/1000"] = _lowp_case(state_dtype, 1_000)
    table["autodiff/mlp64x64x10/b64"] = _autodiff_case()
    if _have("onnx"):
        table["onnx/session_step/mlp64x64x10/b64"] = _onnx_case()
    if _have("sklearn"):
        table["sklearn/mlp_epoch/digits/relu100"] = _sklearn_case()
    return table


# ---- measuring -------------------------------------------------------------------------------
# Every case runs in one valgrind process.  Only what runs inside libc's qsort_r is counted
# (--collect-atstart=no --toggle-collect): the driver sorts a two-element array through ctypes
# with a Python comparator that makes the case's REPEATS calls, and callgrind dumps its counters
# each time qsort_r returns (--dump-after).  The dumps that called a ctypes callback (our
# comparator) are the cases', in order; other libraries' sorts are skipped.  The ctypes callback
# adds the same few thousand instructions to every case on both sides of a comparison.

def run_cases(names, repeats):
    """Driver (inside valgrind): per case, build it, call it WARMUP times (imports, first-call caches,
    the interpreter's specialisation), then `repeats` calls inside qsort_r."""
    import ctypes

    libc = ctypes.CDLL(None)
    compare_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    import fastadam

    print(f"simd_level: {fastadam.config()['simd_level']}", flush=True)
    table = cases()
    for name in names:
        call = table[name]()
        for _ in range(WARMUP):
            call()

        def measured(a, b, call=call):
            for _ in range(repeats):
                call()
            return 0
        pair = (ctypes.c_int * 2)(1, 2)
        libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare_fn(measured))


def count_all(pattern=None, repeats=REPEATS, level=None):
    """({case: instructions per call}, the level the kernels ran) of the selected cases, from one
    callgrind process at CPU level `level` (None: the best valgrind's CPU offers)."""
    names = [n for n in cases() if not pattern or re.search(pattern, n)]
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("FASTADAM_CPU_LEVEL", None)
    if level:
        env["FASTADAM_CPU_LEVEL"] = level
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=qsort_r",
               "--dump-after=qsort_r", "--compress-strings=no", f"--callgrind-out-file={tmp}/out",
               sys.executable, os.path.abspath(__file__), "--run-cases", str(repeats), *names]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"the driver failed:\n{proc.stderr[-3000:]}")
        ran = re.search(r"^simd_level: (\S+)", proc.stdout, re.M).group(1)
        print(f"  (kernels at CPU level {ran})", flush=True)
        dumps = []  # ours: the qsort calls that ran the ctypes (libffi closure) comparator
        for f in sorted((f for f in os.listdir(tmp) if re.fullmatch(r"out\.\d+", f)),
                        key=lambda f: int(f.split(".")[1])):
            with open(os.path.join(tmp, f)) as fh:
                text = fh.read()
            if "_CallPythonObject" in text:
                dumps.append(text)
        if len(dumps) != len(names):
            raise RuntimeError(f"expected {len(names)} callgrind dumps, found {len(dumps)}")
        counts = {}
        for name, text in zip(names, dumps):
            total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
            counts[name] = round(int(total.group(1)) / repeats)
            print(f"  {name:<40} {counts[name]:>14,d} instructions/call", flush=True)
    return counts, ran


# ---- storing and comparing -------------------------------------------------------------------

def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()


def stored_ancestor(head):
    """(commit, record) of the newest ancestor of head (itself excluded) with stored counts."""
    if not os.path.isdir(STORE):
        return None, None
    stored = {f[:-5] for f in os.listdir(STORE) if f.endswith(".json")}
    for commit in git("rev-list", "--max-count=500", head).split()[1:]:
        if commit in stored:
            with open(os.path.join(STORE, commit + ".json")) as fh:
                return commit, json.load(fh)
    return None, None


def compare(base, new, threshold=THRESHOLD):
    """Lines of the report and the names of the cases that regressed (new > threshold * base).
    A case on one side only is reported, never failed."""
    lines, failed = [], []
    for name in sorted(set(base) | set(new)):
        if name not in base or name not in new:
            lines.append(f"  {name:<40} only in {'new' if name in new else 'base'}")
            continue
        ratio = new[name] / base[name] if base[name] > 0 else float("inf")
        bad = ratio > threshold
        if bad:
            failed.append(name)
        lines.append(f"  {name:<40} {base[name]:>14,d} -> {new[name]:>14,d}  x{ratio:5.3f}"
                     f"{'  FAIL' if bad else ''}")
    return lines, failed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--save", action="store_true", help="store HEAD's counts under instructions/")
    ap.add_argument("--cases", help="regex: only the matching case names")
    ap.add_argument("--baseline", help="a counts JSON file to compare against instead")
    ap.add_argument("--out", help="write this run's counts JSON here")
    ap.add_argument("--level", help="FASTADAM_CPU_LEVEL of the counted run (default: the base's)")
    ap.add_argument("--run-cases", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)  # the checkout's in-place build, as the drivers see it
    if args.run_cases:  # the driver, inside valgrind: REPEATS NAME...
        run_cases(args.run_cases[1:], int(args.run_cases[0]))
        return 0
    if shutil.which("valgrind") is None:
        print("instructions.py: valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    head = git("rev-parse", "HEAD")
    if args.baseline:
        with open(args.baseline) as fh:
            base_commit, base_record = "file " + args.baseline, json.load(fh)
    else:
        base_commit, base_record = stored_ancestor(head)
    base_level = base_record.get("simd_level", "x86-64-v3") if base_record else None
    level = args.level or base_level
    print(f"instruction counts of {head[:10]} (callgrind, {REPEATS} calls per case, "
          f"FASTADAM_CPU_LEVEL={level or 'unset'})")
    counts, ran = count_all(args.cases, level=level)
    record = {"commit": head, "threshold": THRESHOLD, "counts": counts, "simd_level": ran}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
    if args.save:
        os.makedirs(STORE, exist_ok=True)
        with open(os.path.join(STORE, head + ".json"), "w") as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
    if base_record is None:
        print("no stored ancestor: nothing to compare")
        return 0
    if ran != base_level:
        print(f"the base was counted at CPU level {base_level}, this run at {ran}: counts of "
              f"different levels are not compared (run with --level {base_level})")
        return 1
    base = base_record["counts"]
    if args.cases:
        base = {k: v for k, v in base.items() if re.search(args.cases, k)}
    lines, failed = compare(base, counts)
    print(f"against {base_commit} (fail above x{THRESHOLD}):")
    print("\n".join(lines))
    if failed:
        print(f"FAIL: {len(failed)} case(s) execute more than {THRESHOLD}x the instructions of "
              f"the base: {', '.join(failed)}.  Reproduce one with callgrind_annotate on "
              f"'valgrind --tool=callgrind python asv_bench/instructions.py --run-cases 4 NAME'.")
        return 1
    print("instruction gate: pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
