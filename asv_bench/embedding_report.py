"""Embedding-table training steps against their anchors (issue 40): FBGEMM's table-batched
embedding (TorchRec's CPU kernels) and ``nn.EmbeddingBag(sparse=True)`` with torch's sparse
optimizers, side by side with fastadam; median times and ratios, measured in rounds.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \\
        python asv_bench/embedding_report.py [--fbgemm] [--large] [--repeat 7] [--quick]

(from the repository root after ``python setup.py build_ext --inplace``).  ``--fbgemm`` adds
FBGEMM's columns, run by asv_bench/embedding_worker.py in the environment
asv_bench/fbgemm_env.sh builds (``.venv-fbgemm``, or the interpreter FASTADAM_FBGEMM_PYTHON
names); without it, or when that environment is missing, they read "not run".

One step of one float32 table ``(rows, dim)`` (1e6 x 64; ``--large`` adds 1e7 x 128, about
5 GiB per array: every column holds its own table and state at once, so plan 30 GiB), 65536
lookups in bags of ``L`` ids (pooling factor L = 1 and 20, sum pooling, 65536 / L bags), ids
drawn Zipf(1.3) (ranks scattered over the table) or uniformly, 1 and 2 threads on every
side.  A step is the pooled lookup, then the backward and the optimizer update of the touched
rows:
  - FBGEMM: ``out = tbe(ids, offsets); out.backward(grad_out)`` (the backward is the fused
    update: EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD);
  - fastadam: the lookup (``np.take``, then a sum over each bag for L > 1), the bags' gradient
    expanded to one row per id, then ``sparse_adagrad_step_inplace`` /
    ``sparse_rowwise_adagrad_step_inplace`` / ``sparse_step_inplace`` (Adam); and, where
    fastadam has it, the lookup then ``embedding_bag_step_inplace`` (the fused bag step: no
    expanded rows);
  - torch: ``nn.EmbeddingBag(mode="sum", sparse=True)``, ``backward``, then
    ``torch.optim.Adagrad`` / ``torch.optim.SparseAdam`` (``zero_grad`` included).
Same hyper-parameters everywhere (lr 0.01, eps 1e-8, no weight decay; Adam betas 0.9, 0.999).
FBGEMM's CPU kernels have no Adam ("adam is not supported in CPU mode").  A column fastadam
does not have yet reads "not available" (row-wise Adagrad, the fused bag step: feature-detected).

Agreement: before the timing, each FBGEMM optimizer and fastadam's take one step from the same
table; printed: the largest relative difference of the touched rows' weights, of their
updates (weight after - before) and of the optimizer state, ``max|a - b| / max|b|``.

Each round runs every column once, in turn (FBGEMM's step is timed inside its worker, without
the pipe), so a slow spell of a shared machine hits every column alike; each entry is the
median over --repeat rounds, ratios are column / fastadam's unfused step.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import fastadam

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LOOKUPS = 65536
LR, EPS = 0.01, 1e-8
SEED = 0


def fbgemm_python():
    """The interpreter of the FBGEMM environment, or None."""
    path = os.environ.get("FASTADAM_FBGEMM_PYTHON") or os.path.join(REPO, ".venv-fbgemm", "bin",
                                                                     "python")
    return path if os.path.exists(path) else None


def draw_ids(rng, n_rows, k, dist):
    if dist == "uniform":
        return rng.integers(0, n_rows, size=k, dtype=np.int64)
    ranks = (rng.zipf(1.3, size=k) - 1) % n_rows
    return (ranks * 2654435761 % n_rows).astype(np.int64)  # frequent rows are not neighbours


def initial_table(rows, dim):
    return np.random.default_rng(SEED).standard_normal((rows, dim), dtype=np.float32)


class Worker:
    """embedding_worker.py in the FBGEMM environment, one JSON line each way."""

    def __init__(self, python):
        self.proc = subprocess.Popen([python, os.path.join(HERE, "embedding_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the FBGEMM worker stopped (exit code {self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self):
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait()


def lookup(table, ids, offsets, bag):
    """The pooled lookup of bags of `bag` ids each (NumPy: a gather, then a sum over each bag;
    np.add.reduceat over offsets takes 3-4x as long for the same bags)."""
    rows = table.take(ids, axis=0)
    return rows if bag == 1 else rows.reshape(-1, bag, table.shape[1]).sum(axis=1)


class FastadamStep:
    """The lookup, then fastadam's sparse step of ``optimizer`` (unfused: the bags' gradient
    expanded to one row per id; fused: embedding_bag_step_inplace)."""

    def __init__(self, table, optimizer, ids, offsets, grad_out, bag, threads, fused):
        self.x, self.ids, self.offsets, self.grad_out = table, ids, offsets, grad_out
        self.bag, self.nt, self.fused, self.t = bag, threads, fused, 0
        self.optimizer = optimizer
        rows = table.shape[0]
        names = {"adam": ("m", "v"), "adagrad": ("h",), "rowwise_adagrad": ("acc",)}[optimizer]
        if fused:  # the fused step's own names for the optimizer's state
            names = fastadam.optim.embedding_bag_slots(optimizer)[1]  # (spec, names)
        if optimizer == "rowwise_adagrad":  # one accumulator per row
            self.state = {name: np.zeros(rows, table.dtype) for name in names}
        else:
            self.state = {name: np.zeros_like(table) for name in names}

    def step(self):
        self.t += 1
        lookup(self.x, self.ids, self.offsets, self.bag)
        if self.fused:
            name = {"rowwise_adagrad": "rowwise_adagrad"}.get(self.optimizer, self.optimizer)
            hyper = {"lr": LR, "eps": EPS} if self.optimizer != "adam" else {"lr": LR}
            fastadam.embedding_bag_step_inplace(self.x, self.ids, self.offsets[:-1],
                                                self.grad_out, self.state, self.t,
                                                optimizer=name, num_threads=self.nt, **hyper)
            return
        values = self.grad_out if self.bag == 1 else np.repeat(self.grad_out, self.bag, axis=0)
        grad = (self.ids, values)
        if self.optimizer == "adam":
            fastadam.sparse_step_inplace(self.x, grad, self.state["m"], self.state["v"],
                                         self.t, lr=LR, num_threads=self.nt)
        elif self.optimizer == "adagrad":
            fastadam.sparse_adagrad_step_inplace(self.x, grad, self.state["h"], self.t, lr=LR,
                                                 eps=EPS, num_threads=self.nt)
        else:
            fastadam.sparse_rowwise_adagrad_step_inplace(self.x, grad, self.state["acc"],
                                                         self.t, lr=LR, eps=EPS,
                                                         num_threads=self.nt)


class TorchStep:
    """nn.EmbeddingBag(mode="sum", sparse=True) + torch.optim.Adagrad / SparseAdam."""

    def __init__(self, table, optimizer, ids, offsets, grad_out, threads):
        import torch

        self.torch = torch
        self.nt = threads
        self.bag = torch.nn.EmbeddingBag(table.shape[0], table.shape[1], mode="sum",
                                         sparse=True, _weight=torch.from_numpy(table))
        params = list(self.bag.parameters())
        self.opt = (torch.optim.SparseAdam(params, lr=LR) if optimizer == "adam"
                    else torch.optim.Adagrad(params, lr=LR, eps=EPS))
        self.ids = torch.from_numpy(ids)
        self.offsets = torch.from_numpy(offsets[:-1])
        self.grad_out = torch.from_numpy(grad_out)

    def step(self):
        self.torch.set_num_threads(self.nt)
        self.opt.zero_grad(set_to_none=True)
        out = self.bag(self.ids, self.offsets)
        out.backward(self.grad_out)
        self.opt.step()


def rel(a, b):
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b))) / scale if scale else 0.0


def agreement(worker, folder, table0, optimizer, ids, offsets, grad_out, bag, threads):
    """(weights, updates, state) relative differences after one step from table0."""
    touched = np.unique(ids)
    np.savez(os.path.join(folder, "rows.npz"), rows=touched)
    worker.ask(op="steps", n=1)
    out = os.path.join(folder, "out.npz")
    worker.ask(op="rows", rows=os.path.join(folder, "rows.npz"), out=out)
    ours = FastadamStep(table0.copy(), optimizer, ids, offsets, grad_out, bag, threads,
                        fused=False)
    ours.step()
    with np.load(out) as data:
        weight, state = data["weight"], data["state"]
    w = ours.x[touched]
    s = next(iter(ours.state.values()))[touched].reshape(state.shape)
    before = table0[touched]
    return rel(w, weight), rel(w - before, weight - before), rel(s, state)


def fastadam_has(optimizer, fused):
    """Whether this fastadam has the step (row-wise Adagrad and the fused bag step are newer
    than this report): one step on a small table, or the function's absence, tells."""
    if optimizer == "rowwise_adagrad" and not hasattr(fastadam,
                                                      "sparse_rowwise_adagrad_step_inplace"):
        return False
    if not fused:
        return True
    if not hasattr(fastadam, "embedding_bag_step_inplace"):
        return False
    ids, offsets = np.array([0, 1, 1]), np.array([0, 1, 3])
    try:
        step = FastadamStep(np.ones((4, 2), np.float32), optimizer, ids, offsets,
                            np.ones((2, 2), np.float32), 1, 1, fused=True)
        step.step()
    except (AttributeError, TypeError, ValueError, KeyError):  # not this optimizer
        return False
    return True


def run_case(args, worker, folder, shape, bag, dist, threads):
    rows, dim = shape
    rng = np.random.default_rng(42)
    n_bags = LOOKUPS // bag  # L = 20: 3276 bags, 65520 lookups
    ids = draw_ids(rng, rows, n_bags * bag, dist)
    offsets = np.arange(n_bags + 1, dtype=np.int64) * bag
    grad_out = rng.standard_normal((n_bags, dim)).astype(np.float32)
    table0 = initial_table(rows, dim)
    npz = os.path.join(folder, "inputs.npz")
    np.savez(npz, ids=ids, offsets=offsets, grad_out=grad_out)
    head = f"{rows:.0e} x {dim}, L={bag:2d}, {dist:>7}, {threads} thr"
    for optimizer in ("adagrad", "rowwise_adagrad", "adam"):
        columns = {}  # name -> step function returning seconds
        keep = []
        for fused in (False, True):
            name = "fastadam fused" if fused else "fastadam"
            if fastadam_has(optimizer, fused):
                step = FastadamStep(table0.copy(), optimizer, ids, offsets, grad_out, bag,
                                    threads, fused)
                keep.append(step)
                columns[name] = timed(step.step, args.clock)
            else:
                columns[name] = None
        if optimizer != "rowwise_adagrad":
            step = TorchStep(table0.copy(), optimizer, ids, offsets, grad_out, threads)
            keep.append(step)
            columns["torch"] = timed(step.step, args.clock)
        agree = ""
        if optimizer != "adam":
            if worker is None:
                columns["FBGEMM"] = "not run"
            else:
                kind = {"adagrad": "exact_adagrad",
                        "rowwise_adagrad": "exact_rowwise_adagrad"}[optimizer]
                info = worker.ask(op="setup", rows=rows, dim=dim, seed=SEED, optimizer=kind,
                                  lr=LR, eps=EPS, threads=threads, npz=npz)
                if abs(info["checksum"] - float(table0[:64].astype(np.float64).sum())) > 1e-6:
                    raise RuntimeError("the FBGEMM worker drew another initial table")
                if fastadam_has(optimizer, False):
                    w, u, s = agreement(worker, folder, table0, optimizer, ids, offsets,
                                        grad_out, bag, threads)
                    agree = f"  agree: w {w:.1e} upd {u:.1e} state {s:.1e}"
                columns["FBGEMM"] = lambda: worker.ask(op="time", n=1,
                                                       clock=args.clock)["times"][0]
        times = {name: [] for name, fn in columns.items() if callable(fn)}
        for name in times:
            columns[name]()  # warm-up
        for _ in range(args.repeat):
            for name in times:
                times[name].append(columns[name]())
        med = {name: float(np.median(v)) for name, v in times.items()}
        base = med.get("fastadam")
        cells = []
        for name, fn in columns.items():
            if fn is None:
                cells.append(f"{name} not available")
            elif isinstance(fn, str):
                cells.append(f"{name} {fn}")
            elif name == "fastadam" or base is None:
                cells.append(f"{name} {med[name] * 1e3:.2f} ms")
            else:
                cells.append(f"{name} {med[name] * 1e3:.2f} ms ({med[name] / base:.2f}x)")
        print(f"{head} | {optimizer:15} | " + " | ".join(cells) + agree, flush=True)
        del keep
        if worker is not None and optimizer != "adam":
            worker.ask(op="free")


def timed(fn, clock):
    timer = time.process_time if clock == "cpu" else time.perf_counter

    def run():
        start = timer()
        fn()
        return timer() - start
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fbgemm", action="store_true", help="add FBGEMM's columns")
    parser.add_argument("--large", action="store_true", help="add the 1e7 x 128 table")
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds (median)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or each process's CPU time (all its threads: the cost, "
                             "not the latency, of a 2-thread step) for a machine with more "
                             "runnable processes than cores")
    parser.add_argument("--quick", action="store_true",
                        help="a 1e5 x 16 table, L=20, Zipf, 1 thread, 2 rounds: a smoke test")
    args = parser.parse_args()
    worker = None
    python = fbgemm_python() if args.fbgemm else None
    if args.fbgemm and python is None:
        print("FBGEMM environment not found: run asv_bench/fbgemm_env.sh (or set "
              "FASTADAM_FBGEMM_PYTHON)")
    if python:
        worker = Worker(python)
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        sys.exit("the torch columns need PyTorch in this environment")
    print(f"fastadam {fastadam.__version__}, simd {fastadam.config()['simd_level']}, torch "
          f"{torch_version}, numpy {np.__version__}, {os.cpu_count()} CPUs visible; "
          f"ratios: column / fastadam (unfused), medians of {args.repeat if not args.quick else 2}"
          f" rounds of {'CPU' if args.clock == 'cpu' else 'wall'} time")
    if args.quick:
        args.repeat = 2
        cases = [((100_000, 16), 20, "zipf", 1)]
    else:
        shapes = [(1_000_000, 64)] + ([(10_000_000, 128)] if args.large else [])
        cases = [(s, bag, dist, nt) for s in shapes for bag in (1, 20)
                 for dist in ("zipf", "uniform")
                 for nt in (int(n) for n in args.threads.split(","))]
    with tempfile.TemporaryDirectory() as folder:
        try:
            for case in cases:
                run_case(args, worker, folder, *case)
        finally:
            if worker is not None:
                worker.close()


if __name__ == "__main__":
    main()
