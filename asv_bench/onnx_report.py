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
"""
import argparse
import os
import sys
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument("--gpt", action="store_true", help="the GPT of issue 22 instead")
    args = parser.parse_args()
    repeats, min_time = (5, 0.05) if args.quick else (21, 0.1)
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
