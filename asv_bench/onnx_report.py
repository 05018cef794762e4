"""Side-by-side timings of one ONNX training step (issue 9): ``fastadam.onnx.TrainingSession.step``
on an MLP model built by ``make_training_model`` (Gemm/Relu/Gemm, SoftmaxCrossEntropyLoss,
Gradient, Adam), against the same step written by hand with ``fastadam.autodiff`` +
``fastadam.Adam`` (what the graph interpretation costs) and against PyTorch eager
(``torch.optim.Adam``, default implementation).  1 thread for everyone (threadpoolctl and
``torch.set_num_threads``), float32, medians of interleaved rounds.  Usage, from the repository
root after ``python setup.py build_ext --inplace``::

    python asv_bench/onnx_report.py [--quick]

Ratios: ``session / hand-written`` (the claim: at most 1.3) and ``torch / session`` (> 1 means
the session is faster than PyTorch eager).  A second line per model gives ``session /
hand-written`` in CPU time of this thread (``time.thread_time``, same interleaved rounds): time
the process spent descheduled on a shared machine does not count there.  A third line counts
the Python bytecode instructions one step executes (``sys.settrace`` with opcode events, after
the timings): a measure of the per-step interpretation work that load on the machine does not
change.

``--gpt`` (issue 22) times instead the GPT of ``bench_onnx_gpt`` (batch 16, sequence 64, d 64,
4 heads, 2 blocks, vocabulary 128) exported by torch's dynamo exporter at opset 20: the session,
the same step hand-written with ``fastadam.autodiff`` + ``fastadam.Adam``, and PyTorch eager +
``torch.optim.Adam(fused=True)``.  Claims: ``session / hand-written <= 1.2`` and
``torch / session > 1``.  Run it with the BLAS variables this machine sets removed and with
both sides at one thread (threadpoolctl and ``torch.set_num_threads``)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/onnx_report.py --gpt

``--ort`` (issue 42) times ``TrainingSession.step`` against onnxruntime-training on the MLPs
both train (``bench_onnx.WORKLOADS``: same weights, batch, loss and Adam), side by side:
onnxruntime-training runs in its own environment (``bash asv_bench/ort_training_env.sh``
builds it; ``FASTADAM_ORT_TRAINING_PYTHON`` names another interpreter), as a subprocess
(``ort_training_worker.py``) whose rounds interleave with the session's.  Per step: the
session's ``step(feeds)`` against ``loss = module(X, labels); optimizer.step();
module.lazy_reset_grad()``.  At 1 thread (fastadam: threadpoolctl limits of 1;
onnxruntime: ``intra_op_num_threads=1``, ``OMP_NUM_THREADS=1``) in CPU time of the stepping
thread and in wall time, and at all threads (the defaults of both) in wall time; medians of
interleaved rounds, ``ORT / fastadam`` (>= 1: fastadam is at least as fast).  A third line
per model times, in the same rounds, the arithmetic of fastadam's step alone (``kernels
only``: ``fastadam.autodiff.mlp_loss_and_gradients``, which the session's step runs for
these models, then ``fastadam.Adam``; no graph, no checks of feeds, no Tensors): the floor
that the session's per-step overhead sits on.  Then both train
the 64-64-10 MLP on scikit-learn's digits (when installed) for a few epochs from the same
weights on the same batches; the report prints their last-epoch losses, test accuracies and
the largest parameter difference::

    bash asv_bench/ort_training_env.sh
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/onnx_report.py --ort
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import bench_onnx as B  # noqa: E402
import bench_onnx_gpt as GPT  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402


def fmt(s):
    return f"{s * 1e6:8.1f} us" if s < 1e-3 else f"{s * 1e3:8.3f} ms"


def cpu_ratio(steps, repeats, min_time):
    """Median over interleaved rounds of (session / hand-written) CPU time of this thread."""
    calls = {}
    for name in ("session", "autodiff"):
        start = time.thread_time()
        steps[name]()
        calls[name] = max(1, int(min_time / max(time.thread_time() - start, 1e-6)))
    ratios = []
    for _ in range(repeats):
        per = {}
        for name in ("session", "autodiff"):
            fn, n = steps[name], calls[name]
            start = time.thread_time()
            for _ in range(n):
                fn()
            per[name] = (time.thread_time() - start) / n
        ratios.append(per["session"] / per["autodiff"])
    return float(np.median(ratios))


def bytecodes_per_step(step):
    """Python bytecode instructions executed by one call of ``step`` (every frame it enters)."""
    count = [0]

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            count[0] += 1
        return trace
    step()  # warm: first-call work (compilation, caches) is not counted
    sys.settrace(trace)
    try:
        step()
    finally:
        sys.settrace(None)
    return count[0]


def gpt_report(repeats, min_time):
    cfg = GPT.BENCH
    print(f"one training step of the GPT (batch {cfg['batch']}, sequence {cfg['seq']}, d "
          f"{cfg['d']}, {cfg['heads']} heads, {cfg['layers']} blocks, vocabulary "
          f"{cfg['vocab']}), float32, 1 thread; medians of {repeats} interleaved rounds")
    # the three implementations train alike (a toy size, the fast exporter)
    GPT.check_same_training(dict(cfg, vocab=32, seq=16, batch=2), "torchscript")
    steps = {impl: GPT.make_step(impl, cfg) for impl in GPT.IMPLS}
    for step in steps.values():
        step()
    t = median_seconds_interleaved(steps, repeats=repeats, min_time=min_time)
    print(f"{'session':>11s} {'hand-written':>13s} {'torch fused':>12s} {'session/hand':>13s} "
          f"{'torch/session':>14s}   (wall time)")
    print(f"{fmt(t['session']):>11s} {fmt(t['autodiff']):>13s} {fmt(t['torch']):>12s} "
          f"{t['session'] / t['autodiff']:12.2f}x {t['torch'] / t['session']:13.2f}x")
    c = GPT.cpu_seconds_interleaved(steps, repeats, min_time)
    print(f"{fmt(c['session']):>11s} {fmt(c['autodiff']):>13s} {fmt(c['torch']):>12s} "
          f"{c['session'] / c['autodiff']:12.2f}x {c['torch'] / c['session']:13.2f}x"
          f"   (CPU time of this thread, time.thread_time)")


ORT_PYTHON = os.path.join(os.path.dirname(HERE), ".venv-ort-training", "bin", "python")


def ort_python():
    """The interpreter of onnxruntime-training's environment, or None (with why on stdout)."""
    python = os.environ.get("FASTADAM_ORT_TRAINING_PYTHON", ORT_PYTHON)
    if not os.path.exists(python):
        print(f"onnxruntime-training: no environment ({python} does not exist); build it with "
              f"`bash asv_bench/ort_training_env.sh` or name an interpreter that has "
              f"onnxruntime-training in FASTADAM_ORT_TRAINING_PYTHON")
        return None
    return python


class OrtWorker:
    """onnxruntime-training's side, in its own environment (``ort_training_worker.py``)."""

    def __init__(self, python, threads):
        env = dict(os.environ)
        if threads == 1:
            env["OMP_NUM_THREADS"] = "1"
        # its stderr goes to a file: onnxruntime logs every graph transformer at set-up
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([python, os.path.join(HERE, "ort_training_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env)
        self.threads = threads

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.log.seek(0)
            errors = [x for x in self.log.read().splitlines() if " [I:onnxruntime" not in x]
            raise RuntimeError(f"onnxruntime-training's worker stopped (exit code {code}) on "
                               f"{request['op']}:\n" + "\n".join(errors[-20:]))
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"onnxruntime-training's worker: {reply['error']}")
        return reply

    def close(self):
        try:
            self.ask(op="quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=30)
        self.log.close()


def _save_inputs(path, sizes, batch):
    weights, X, y = B._data(sizes, batch)
    arrays = {f"{'Wb'[j % 2]}{j // 2}": w for j, w in enumerate(weights)}
    np.savez(path, X=X, labels=y, **arrays)


def kernels_step(sizes, batch):
    """The floor of a fastadam step on the MLP: the same arithmetic as the session's step
    (``fastadam.autodiff.mlp_loss_and_gradients``, the kernels the session's fused step
    calls, then ``fastadam.Adam`` with ONNX's epsilon placement), on the same weights and
    batch, with no graph, no feeds check and no Tensors around it."""
    import fastadam
    import fastadam.autodiff as ad
    weights, X, y = B._data(sizes, batch)
    opt = fastadam.Adam(weights, lr=B.LR, betas=(B.BETA1, B.BETA2), eps=B.EPS,
                        convention="onnx")
    ws, bs = weights[0::2], weights[1::2]
    relu = (True,) * (len(ws) - 1)

    def step():
        loss, grads = ad.mlp_loss_and_gradients(X, ws, bs, y, relu)
        opt.step([g.data for g in grads])
        return loss
    return step


def ort_interleaved(steps, worker, repeats, min_time):
    """Medians per step of each of ``steps`` (``{name: step}``, run in this process) and of
    the worker's step (``"ort"``), over ``repeats`` interleaved rounds of about ``min_time``
    each: ``{side: {clock: seconds}}`` with clocks ``thread`` (CPU time of the stepping
    thread) and ``wall``."""
    counts = {}
    for name, step in steps.items():
        for _ in range(20):
            step()
        start = time.perf_counter()
        for _ in range(5):
            step()
        counts[name] = max(5, int(min_time / max((time.perf_counter() - start) / 5, 1e-7)))
    worker.ask(op="time", n=20)
    probe = worker.ask(op="time", n=5)
    counts["ort"] = max(5, int(min_time / max(probe["wall"] / 5, 1e-7)))
    sides = [*steps, "ort"]
    samples = {side: {"thread": [], "wall": []} for side in sides}
    for r in range(repeats):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            n = counts[side]
            if side == "ort":
                got = worker.ask(op="time", n=n)
            else:
                step = steps[side]
                t0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(n):
                    step()
                got = {"thread": time.thread_time() - t0, "wall": time.perf_counter() - w0}
            for clock in ("thread", "wall"):
                samples[side][clock].append(got[clock] / n)
    return {side: {clock: float(np.median(v)) for clock, v in clocks.items()}
            for side, clocks in samples.items()}


def _digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    train, test = perm[:1437], perm[1437:]
    return X[train], y[train].astype(np.int64), X[test], y[test].astype(np.int64)


def _accuracy(params, X, y):
    n = len(params) // 2
    h = X.astype(np.float64)
    for k in range(n):
        h = h @ params[2 * k].astype(np.float64).T + params[2 * k + 1]
        if k < n - 1:
            h = np.maximum(h, 0)
    return float(np.mean(h.argmax(1) == y))


def ort_training_check(python, folder, epochs=10, batch=64):
    """fastadam and onnxruntime-training train the digits MLP alike (same weights, batches)."""
    data = _digits()
    if data is None:
        print("training check skipped: scikit-learn (its digits data) is not installed")
        return
    Xtr, ytr, Xte, yte = data
    sizes = (64, 64, 10)
    rng = np.random.default_rng(1)
    per_epoch = len(Xtr) // batch
    order = np.stack([rng.permutation(len(Xtr))[:per_epoch * batch].reshape(per_epoch, batch)
                      for _ in range(epochs)]).reshape(-1, batch)
    inputs = os.path.join(folder, "train_in.npz")
    _save_inputs(inputs, sizes, batch)
    np.savez(os.path.join(folder, "train_data.npz"), X=Xtr, labels=ytr, order=order)
    # fastadam
    import fastadam.onnx as fo
    weights = B._data(sizes, batch)[0]
    session = fo.TrainingSession(fo.make_training_model(
        B.mlp_model(weights, sizes[0]), lr=B.LR, alpha=B.BETA1, beta=B.BETA2, epsilon=B.EPS))
    losses_fa = [float(session.step({"X": Xtr[i], "labels": ytr[i]})["fastadam.loss"])
                 for i in order]
    names = [f"{p}{k}" for k in range(len(sizes) - 1) for p in "Wb"]
    params_fa = [np.array(session.initializers[n]) for n in names]
    # onnxruntime-training
    worker = OrtWorker(python, 1)
    try:
        worker.ask(op="setup", npz=inputs, dir=os.path.join(folder, "train_artifacts"),
                   threads=1)
        out = os.path.join(folder, "train_out.npz")
        losses_ort = worker.ask(op="train", npz=os.path.join(folder, "train_data.npz"),
                                out=out)["losses"]
        trained = np.load(out)
        params_ort = [trained[n] for n in names]
    finally:
        worker.close()
    last = slice(-per_epoch, None)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(params_fa, params_ort))
    print(f"training check: digits, MLP 64-64-10, batch {batch}, {epochs} epochs "
          f"({len(order)} steps) from the same weights on the same batches")
    print(f"{'':22s} {'last-epoch loss':>16s} {'test accuracy':>14s}")
    for side, losses, params in (("fastadam.onnx", losses_fa, params_fa),
                                 ("onnxruntime-training", losses_ort, params_ort)):
        print(f"{side:22s} {np.mean(losses[last]):16.6f} {_accuracy(params, Xte, yte):14.4f}")
    loss_diff = float(np.max(np.abs(np.subtract(losses_fa, losses_ort))))
    print(f"largest |loss difference| over the steps {loss_diff:.3g}; largest |parameter "
          f"difference| after training {diff:.3g}")


def ort_report(repeats, min_time):
    python = ort_python()
    if python is None:
        return
    with tempfile.TemporaryDirectory() as folder:
        for threads in (1, 0):
            print(f"one training step, fastadam.onnx.TrainingSession.step against "
                  f"onnxruntime-training, float32, "
                  f"{'1 thread' if threads == 1 else 'all threads (each default)'}; medians "
                  f"of {repeats} interleaved rounds")
            clocks = ("thread", "wall") if threads == 1 else ("wall",)
            print(f"{'model':28s} {'clock':>7s} {'fastadam':>11s} {'ORT-training':>13s} "
                  f"{'ORT/fastadam':>13s}")
            undo = B.limit_threads() if threads == 1 else (lambda: None)
            try:
                for k, (label, sizes, batch) in enumerate(B.WORKLOADS):
                    inputs = os.path.join(folder, f"in{k}.npz")
                    _save_inputs(inputs, sizes, batch)
                    worker = OrtWorker(python, threads)
                    try:
                        info = worker.ask(op="setup", npz=inputs,
                                          dir=os.path.join(folder, f"artifacts{k}_{threads}"),
                                          threads=threads)
                        t = ort_interleaved({"fastadam": B.make_step("session", sizes, batch),
                                             "kernels": kernels_step(sizes, batch)},
                                            worker, repeats, min_time)
                    finally:
                        worker.close()
                    for clock in clocks:
                        fa, ort = t["fastadam"][clock], t["ort"][clock]
                        print(f"{label:28s} {clock:>7s} {fmt(fa):>11s} {fmt(ort):>13s} "
                              f"{ort / fa:12.2f}x")
                    floor = t["kernels"][clocks[0]]
                    print(f"{'  kernels only (the floor)':28s} {clocks[0]:>7s} {fmt(floor):>11s} "
                          f"{'':13s} {t['ort'][clocks[0]] / floor:12.2f}x")
            finally:
                undo()
        print("onnxruntime-training: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
        ort_training_check(python, folder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument("--gpt", action="store_true", help="the GPT of issue 22 instead")
    parser.add_argument("--ort", action="store_true",
                        help="against onnxruntime-training (issue 42) instead")
    args = parser.parse_args()
    repeats, min_time = (5, 0.05) if args.quick else (21, 0.1)
    if args.ort:
        ort_report(repeats, min_time)
        return
    if args.gpt:
        undo = GPT.limit_threads()
        try:
            gpt_report(repeats, min_time)
        finally:
            undo()
        return
    undo = B.limit_threads()
    try:
        print("one training step (forward, loss, gradient, Adam update), float32, 1 thread")
        print(f"{'model':28s} {'session':>11s} {'hand-written':>13s} {'torch eager':>12s} "
              f"{'session/hand':>13s} {'torch/session':>14s}")
        for label, sizes, batch in B.WORKLOADS:
            steps = {impl: B.make_step(impl, sizes, batch) for impl in B.IMPLS}
            B.check_same_training(sizes, batch)
            t = median_seconds_interleaved(steps, repeats=repeats, min_time=min_time)
            print(f"{label:28s} {fmt(t['session']):>11s} {fmt(t['autodiff']):>13s} "
                  f"{fmt(t['torch']):>12s} {t['session'] / t['autodiff']:12.2f}x "
                  f"{t['torch'] / t['session']:13.2f}x")
            print(f"{'  in CPU time (thread_time)':28s} {'':11s} {'':13s} {'':12s} "
                  f"{cpu_ratio(steps, repeats, min_time):12.2f}x")
            ops = {impl: bytecodes_per_step(steps[impl]) for impl in ("session", "autodiff")}
            print(f"{'  Python bytecodes per step':28s} {ops['session']:11d} "
                  f"{ops['autodiff']:13d} {'':12s} {ops['session'] / ops['autodiff']:12.2f}x")
    finally:
        undo()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
