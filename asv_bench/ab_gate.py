"""Wall-time A/B gate (issue 21): the base and the candidate timed side by side, in one run.

    python asv_bench/ab_gate.py                   # base: the newest ancestor with stored counts
    python asv_bench/ab_gate.py --base-root DIR   # base: an already built checkout in DIR
    python asv_bench/ab_gate.py --rounds 15 --cases 'sparse'

A stored wall time from another day proves little on a shared 2-core machine, where the load
moves timings by 20-50%.  Here three worker processes run at once: one imports the base's
fastadam, two the candidate's.  Every round asks each worker, in a rotating order, to time a
case (REPEATS calls after a warm-up, one thread, the median of a few batches), so the load
of that moment hits all of them alike.  Per round two ratios come out:

- A/B: candidate / base, the change being judged;
- A/A: candidate / candidate (the two candidate workers), what the noise alone gives.

The gate fails a case when the median A/B ratio exceeds BOTH the floor (x1.10) and the A/A
band: ``exp(|median log A/A| + 3 * sigma)``, where sigma is the standard error of a median
estimated from the A/A ratios' spread (1.2533 * 1.4826 * MAD / sqrt(rounds)).  A case that
fails is measured again with twice the rounds, in three fresh worker processes, and fails the
gate only if it fails again (a burst of load rarely lasts through both, and a process's memory
layout, which it keeps for life, is drawn anew).  A case that fails twice does not fail the gate
when the base and the candidate ran the same code: every file of fastadam the case loaded
(Python modules and compiled extensions) byte-identical in both (the sparse case moved by
x1.12-1.43 between two checkouts of identical binaries in CI, and by x0.82-0.95 here: where
memory lands, not code).  So a quiet machine catches a 1.25x slowdown and a
loaded one widens its own band instead of crying wolf
(tests/test_asv_ab_gate.py injects a 1.3x slowdown and checks that the gate fails, and that
an unchanged build passes).

The base checkout is built with ``git worktree add`` + ``setup.py build_ext --inplace`` in a
temporary directory (ccache makes that quick where present), unless --base-root names one.
The cases are those of the instruction gate (asv_bench/instructions.py) named in CASES.
Exit status: 0 pass (or no stored ancestor to compare with), 1 a case is slower.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOOR = 1.10
SIGMAS = 3.0
ROUNDS = 15
BATCHES = 5  # per request a worker times BATCHES batches of the case's calls: the median batch
# name (a case of asv_bench/instructions.py) -> calls per timed batch (each batch ~5-20 ms)
CASES = {
    "step_inplace/adam/1000": 2000,
    "step_inplace/adam/100000": 100,
    "optimizer_step/Adam/1000": 1000,
    "step_inplace/list100x1000": 40,
    "sparse/lazy/zipf/row64": 20,
    "segment_sum/zipf": 20,
    "onnx/session_step/mlp64x64x10/b64": 50,
}
# FASTADAM_AB_SLOWDOWN="case=1.3" makes a candidate worker run 1.3x the calls of that case
# and report them as one batch: a slowdown the gate's own test injects.
INJECT = "FASTADAM_AB_SLOWDOWN"


# ---- the worker: one process per build, answering "case calls" lines -------------------------

def fixed_layout():
    """Make where a worker's large arrays land independent of what the process did before.

    With identical kernels, segment_sum ran 1.2x apart between a base and a candidate worker
    (CI, twice; 30.6 against 47.2 us here): its output and scratch arrays land where the heap
    puts them, and the heap depends on the modules each build imports.  So every allocation of
    64 KiB or more is its own mmap (page-aligned, the same offsets in every process), and NumPy
    asks for no transparent huge pages (whether a table gets them depends on the kernel's free
    memory at that moment).  Both sides run the same allocations; only the code differs."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD (glibc)
    except (AttributeError, OSError):
        pass
    import numpy as np

    for where in ("_core", "core"):
        mod = getattr(getattr(np, where, None), "multiarray", None)
        if hasattr(mod, "_set_madvise_hugepage"):
            mod._set_madvise_hugepage(False)
            break


def loaded_files():
    """{path inside the package: sha256} of every module of fastadam this process has loaded
    (its Python files and compiled extensions): the code a case ran."""
    import hashlib

    import fastadam
    top = os.path.dirname(os.path.realpath(fastadam.__file__))
    out = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if not path:
            continue
        path = os.path.realpath(path)
        if path.startswith(top + os.sep):
            with open(path, "rb") as f:
                out[os.path.relpath(path, top)] = hashlib.sha256(f.read()).hexdigest()
    return out


def worker():
    fixed_layout()
    sys.path.insert(0, HERE)
    import instructions
    import fastadam

    slow = {}
    if os.environ.get(INJECT):
        name, factor = os.environ[INJECT].rsplit("=", 1)
        slow[name] = float(factor)
    table, built = instructions.cases(), {}
    print(json.dumps({"fastadam": os.path.abspath(fastadam.__file__),
                      "level": fastadam.config()["simd_level"]}), flush=True)
    for line in sys.stdin:
        if line.strip() == "files":
            print(json.dumps({"files": loaded_files()}), flush=True)
            continue
        name, calls = line.split()
        calls = int(calls)
        if name not in built:
            built[name] = table[name]()
            for _ in range(instructions.WARMUP):
                built[name]()
        call = built[name]
        n = int(round(calls * slow.get(name, 1.0)))
        times = []
        for _ in range(BATCHES):
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            times.append((time.perf_counter() - t0) / calls)
        print(json.dumps({"seconds": statistics.median(times)}), flush=True)


class Worker:
    def __init__(self, root, label, env_extra=None):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0",
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("FASTADAM_CPU_LEVEL", None)
        env.pop(INJECT, None)
        env.update(env_extra or {})
        self.label = label
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=root)
        self.facts = self._read()
        want = os.path.realpath(root)
        got = os.path.realpath(self.facts["fastadam"])
        if not got.startswith(want + os.sep):
            self.close()
            raise RuntimeError(f"{label}: imported fastadam from {got}, not from {want} (is "
                               f"the build there in place?)")

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: the worker exited ({self.proc.wait()})")
        return json.loads(line)

    def files(self):
        self.proc.stdin.write("files\n")
        self.proc.stdin.flush()
        return self._read()["files"]

    def time(self, name, calls):
        self.proc.stdin.write(f"{name} {calls}\n")
        self.proc.stdin.flush()
        return self._read()["seconds"]

    def close(self):
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---- statistics ------------------------------------------------------------------------------

def band(aa_logs):
    """The A/A band, as a log ratio: |median| + SIGMAS * (standard error of the median)."""
    med = statistics.median(aa_logs)
    mad = statistics.median([abs(x - med) for x in aa_logs])
    sigma = 1.2533 * 1.4826 * mad / math.sqrt(len(aa_logs))
    return abs(med) + SIGMAS * sigma


def judge(ab_logs, aa_logs, floor=FLOOR):
    """(ratio A/B, the threshold, failed) of one case from its per-round log ratios."""
    ratio = math.exp(statistics.median(ab_logs))
    threshold = max(floor, math.exp(band(aa_logs)))
    return ratio, threshold, ratio > threshold


def measure(base_root, cand_root, names, rounds, inject=None):
    """{case: (ratio, threshold, failed, A/A median)} from `rounds` interleaved rounds."""
    extra = {INJECT: inject} if inject else None

    def start():
        return [Worker(base_root, "base"), Worker(cand_root, "candidate", extra),
                Worker(cand_root, "candidate-2", extra)]

    workers = start()
    try:
        print(f"  base {workers[0].facts['fastadam']} (level {workers[0].facts['level']})")
        print(f"  candidate {workers[1].facts['fastadam']} (level {workers[1].facts['level']})")
        out = {}
        for name in names:
            for attempt, n in enumerate((rounds, 2 * rounds)):
                if attempt:  # fresh processes: a worker keeps its memory's physical layout
                    for w in workers:  # (cache sets) for life, which moved one sparse case
                        w.close()      # x1.12 between two builds of the same code
                    workers = start()
                ab, aa = [], []
                for r in range(n):
                    order = [(r + k) % 3 for k in range(3)]  # who goes first rotates
                    t = [0.0, 0.0, 0.0]
                    for w in order:
                        t[w] = workers[w].time(name, CASES[name])
                    ab.append(math.log(t[1] / t[0]))
                    aa.append(math.log(t[2] / t[1]))
                ratio, threshold, failed = judge(ab, aa)
                out[name] = (ratio, threshold, failed, math.exp(statistics.median(aa)))
                print(f"  {name if attempt == 0 else '  again, ' + str(n) + ' rounds':<32} "
                      f"A/B x{ratio:5.3f}   A/A x{out[name][3]:5.3f}   fails above "
                      f"x{threshold:5.3f}{'  FAIL' if failed else ''}", flush=True)
                if failed and attempt and inject is None and (
                        workers[0].files() == workers[1].files()):
                    # both sides ran byte-identical code (every fastadam module and extension
                    # the case loaded): the difference is where memory landed, not the change
                    failed = False
                    out[name] = (ratio, threshold, False, out[name][3])
                    print(f"  {'':<32} not a regression: the base and the candidate ran the "
                          f"same code (every fastadam file the case loaded is byte-identical)",
                          flush=True)
                if not failed:
                    break  # a first failure is measured again, twice as long: it must repeat
        return out
    finally:
        for w in workers:
            w.close()


# ---- the base checkout -----------------------------------------------------------------------

def git(*args, cwd=REPO):
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd,
                          check=True).stdout.strip()


def build_base(commit, where):
    """A worktree of `commit` in `where`, built in place (needs setup.py's build requirements,
    pyproject.toml's [build-system] requires, installed: pip's isolated builds do not keep
    them)."""
    import importlib.util

    missing = [m for m in ("Cython", "setuptools") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"building the base needs {' and '.join(missing)} (pip install the "
                           f"[build-system] requires of pyproject.toml)")
    git("worktree", "add", "--detach", where, commit)
    env = dict(os.environ)
    if shutil.which("ccache") and "CC" not in env:
        env["CC"] = "ccache gcc"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", "2"],
                          cwd=where, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the base {commit[:10]} failed:\n{proc.stderr[-3000:]}")
    print(f"  built the base {commit[:10]} in {time.time() - t0:.0f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-root", help="an already built checkout to use as the base")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--cases", help="regex: only the matching case names")
    ap.add_argument("--inject", help=argparse.SUPPRESS)  # "case=factor" (the gate's test)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker()
        return 0
    names = [n for n in CASES if not args.cases or re.search(args.cases, n)]
    sys.path.insert(0, HERE)
    import instructions

    tmp = None
    try:
        if args.base_root:
            base_root, label = os.path.abspath(args.base_root), args.base_root
        else:
            head = git("rev-parse", "HEAD")
            commit, _ = instructions.stored_ancestor(head)
            if commit is None:
                print("ab_gate: no ancestor with stored counts: nothing to compare with")
                return 0
            tmp = tempfile.mkdtemp(prefix="fastadam-ab-")
            base_root, label = os.path.join(tmp, "base"), commit[:10]
            build_base(commit, base_root)
        print(f"wall-time A/B: candidate {REPO} vs base {label}, {args.rounds} rounds, "
              f"fails above max(x{FLOOR}, the A/A band)")
        out = measure(base_root, REPO, names, args.rounds, args.inject)
    finally:
        if tmp is not None:
            subprocess.run(["git", "worktree", "remove", "--force", os.path.join(tmp, "base")],
                           cwd=REPO, capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [n for n, r in out.items() if r[2]]
    print(f"wall-time A/B gate: {'FAIL: ' + ', '.join(failed) if failed else 'pass'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
