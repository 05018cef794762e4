"""What the interrupt, thread and memory guards of issue 25 cost, side by side in one process.

    python asv_bench/robustness_report.py [--repeats N]

Prints medians (one thread) and ratios for:
  1. the general step path of ``Adam`` (``Optimizer._step``: per-object lock; SIGINT
     deferred when a step makes several compiled calls) vs the same method without its guard
     (``_step.__wrapped__``), for a one-call step (one group, 16 and 1e6 float32 elements)
     and a three-call step (two groups, two dtypes, 3 x 1e3 and 3 x 1e5 elements); beside
     them ``Adam.step`` as shipped, which takes a one-call step through its one plan
     (fastadam/optim/_step_path.pyx: it takes the lock itself, and defers nothing);
  2. ``TrainingSession.step`` of a small MLP (64-32-10, batch 16) with the memory-budget
     checks vs with ``reserve`` replaced by a no-op.
Timings alternate between contenders (fastadam.bench.median_seconds_interleaved), so a noisy
neighbour hurts them alike.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
import fastadam  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402
from fastadam.optim import Optimizer  # noqa: E402


def optimizer_rows(repeats):
    unguarded = Optimizer._step.__wrapped__
    cases = {}  # name: (a function making a new optimizer, the gradients)
    for n in (16, 1_000_000):
        cases[f"1 call, {n} elements"] = (
            lambda n=n: fastadam.Adam([np.ones(n, np.float32)], num_threads=1),
            [np.full(n, 0.1, np.float32)])
    for n in (1000, 100_000):
        def make(n=n):
            params = [np.ones(n, np.float32), np.ones(n), np.ones(n, np.float32)]
            return fastadam.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 0.01}],
                                 num_threads=1)
        cases[f"3 calls, 3 x {n} elements"] = (
            make, [np.full(n, 0.1, np.float32), np.full(n, 0.1), np.full(n, 0.1, np.float32)])
    print("== Adam: the general step guarded (lock, SIGINT deferral) vs unguarded; "
          "step as shipped ==")
    for name, (make, grads) in cases.items():
        shipped, general, bare = make(), make(), make()  # each its own arrays and state
        t = median_seconds_interleaved({"step": lambda: shipped.step(grads),
                                        "guarded": lambda: general._step(grads),
                                        "unguarded": lambda: unguarded(bare, grads)},
                                       repeats=repeats)
        print(f"{name:28s} guarded {t['guarded'] * 1e6:9.1f} us  unguarded "
              f"{t['unguarded'] * 1e6:9.1f} us  ratio {t['guarded'] / t['unguarded']:.3f}  "
              f"(step as shipped {t['step'] * 1e6:9.1f} us)")


def onnx_rows(repeats):
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        print("(onnx not installed: no TrainingSession row)")
        return
    import fastadam.onnx as fo
    from fastadam.onnx import _budget, _core_ops, _nn_ops

    rng = np.random.default_rng(0)
    W1, W2 = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((32, 64), (10, 32)))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W1"], ["h"], transB=1),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2t"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["logits"])], "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(W2.T.copy(), "W2t"),
         numpy_helper.from_array(np.zeros((1, 10), np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"X": rng.standard_normal((16, 64)).astype(np.float32),
             "labels": rng.integers(0, 10, 16)}
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-3))
    real = (_core_ops.reserve, _core_ops.reserve_broadcast, _nn_ops.reserve)

    def unchecked():
        _core_ops.reserve = _core_ops.reserve_broadcast = _nn_ops.reserve = _noop
        try:
            session.step(feeds)
        finally:
            _core_ops.reserve, _core_ops.reserve_broadcast, _nn_ops.reserve = real

    def checked():
        _core_ops.reserve = _core_ops.reserve  # the same attribute traffic as unchecked()
        try:
            session.step(feeds)
        finally:
            _core_ops.reserve = real[0]

    t = median_seconds_interleaved({"budget": checked, "no budget": unchecked}, repeats=repeats)
    print("== TrainingSession.step (MLP 64-32-10, batch 16): memory budget vs none ==")
    print(f"budget {t['budget'] * 1e6:9.1f} us  no budget {t['no budget'] * 1e6:9.1f} us  "
          f"ratio {t['budget'] / t['no budget']:.3f}  (checks per step: "
          f"{_count_reserves(session, feeds, _budget)})")


def _noop(*args, **kwargs):
    return None


def _count_reserves(session, feeds, budget):
    from fastadam.onnx import _core_ops, _nn_ops
    calls = []
    real = budget.reserve

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    saved = (_core_ops.reserve, _nn_ops.reserve, budget.reserve)
    _core_ops.reserve = _nn_ops.reserve = budget.reserve = counting
    try:
        session.step(feeds)
    finally:
        _core_ops.reserve, _nn_ops.reserve, budget.reserve = saved
    return len(calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    optimizer_rows(args.repeats)
    onnx_rows(args.repeats)


if __name__ == "__main__":
    main()
