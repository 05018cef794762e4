"""What ``fastadam.MemoryPool`` changes in an ONNX training step: minor page faults per step and
CPU time per step, with the pool (``TrainingSession``'s default) and without
(``memory_pool=False``: NumPy's allocator, i.e. the C library's malloc), side by side.

Workloads: the GPT of ``bench_onnx_gpt`` (batch 16, sequence 64, d 64, 4 heads, 2 blocks; the
session and the hand-written ``fastadam.autodiff`` step, each with and without a pool, and
PyTorch eager + fused Adam as the yardstick) and the MLPs of ``bench_onnx``. 1 thread for
everyone; times are medians of interleaved rounds of the CPU time of this thread
(``time.thread_time``), so time spent descheduled on a loaded machine does not count. Minor page
faults (``getrusage``'s ``ru_minflt``) per step are counted over the same rounds (without a pool
they depend on what the C library's allocator did before: glibc adapts its thresholds to the
blocks freed so far); load does not change them. Usage, from the repository root after ``python
setup.py build_ext --inplace``, with the BLAS variables of a tuned machine removed::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/mempool_report.py [--quick]

``--fresh-faults`` counts instead the GPT's faults per step with each implementation alone in
a fresh process (what a script that trains only that model sees).
"""
import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import bench_onnx as B  # noqa: E402
import bench_onnx_gpt as GPT  # noqa: E402


def mlp_session(sizes, batch, memory_pool):
    import fastadam.onnx as fo
    weights, X, y = B._data(sizes, batch)
    model = fo.make_training_model(B.mlp_model(weights, sizes[0]), lr=B.LR, alpha=B.BETA1,
                                   beta=B.BETA2, epsilon=B.EPS)
    session = fo.TrainingSession(model, memory_pool=memory_pool)
    feeds = {"X": X, "labels": y}
    return lambda: session.step(feeds)


def report(steps, repeats, min_time):
    print(f"{'step':44s} {'CPU time':>10s} {'faults/step':>12s}")
    for label, names in steps:
        measured = GPT.cpu_seconds_and_faults_interleaved(names, repeats, min_time)
        seconds = {name: m[0] for name, m in measured.items()}
        for name in names:
            print(f"{label + ': ' + name:44s} {seconds[name] * 1e3:8.3f} ms "
                  f"{measured[name][1]:12.1f}")
        pooled = [n for n in names if n.endswith("(pool)")]
        for name in pooled:
            plain = name.replace("(pool)", "(no pool)")
            if plain in names:
                print(f"{'':44s} {name}: {seconds[plain] / seconds[name]:.2f}x faster")
        if "session (pool)" in names and "hand-written (pool)" in names:
            print(f"{'':44s} session / hand-written, both pooled: "
                  f"{seconds['session (pool)'] / seconds['hand-written (pool)']:.2f}x; "
                  f"torch fused / session (pool): "
                  f"{seconds.get('torch fused', np.nan) / seconds['session (pool)']:.2f}x")


GPT_STEPS = {
    "session (pool)": lambda cfg: GPT.session_step(cfg, memory_pool=True),
    "session (no pool)": lambda cfg: GPT.session_step(cfg, memory_pool=False),
    "hand-written (pool)": lambda cfg: GPT.autodiff_step(cfg, memory_pool=True),
    "hand-written (no pool)": lambda cfg: GPT.autodiff_step(cfg, memory_pool=False),
    "torch fused": lambda cfg: GPT.torch_step(cfg),
}


def faults_in_fresh_processes(steps=20):
    """Minor page faults per GPT step, each implementation alone in a fresh process (3 warm-up
    steps, then ``steps``): what a training script that runs only that step sees."""
    print(f"GPT b16 s64: minor page faults per step, each alone in a fresh process, "
          f"{steps} steps after 3")
    for name in GPT_STEPS:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name,
                              "--steps", str(steps)], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        print(f"  {name:24s} {float(out.stdout.split()[-1]):10.1f}")


def one_process(name, steps):
    import resource
    step = GPT_STEPS[name](GPT.BENCH)
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument("--no-gpt", action="store_true", help="only the MLPs")
    parser.add_argument("--fresh-faults", action="store_true",
                        help="only the GPT's faults per step, each step in a fresh process")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # (internal) one fresh process
    parser.add_argument("--steps", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats, min_time = (5, 0.05) if args.quick else (15, 0.1)
    undo = GPT.limit_threads()
    if args.one or args.fresh_faults:
        try:
            if args.one:
                one_process(args.one, args.steps)
            else:
                faults_in_fresh_processes(args.steps)
        finally:
            undo()
        return
    try:
        workloads = []
        if not args.no_gpt:
            cfg = GPT.BENCH
            workloads.append(("GPT b16 s64", {name: make(cfg)
                                              for name, make in GPT_STEPS.items()}))
        for label, sizes, batch in B.WORKLOADS:
            workloads.append((label.split(",")[0], {
                "session (pool)": mlp_session(sizes, batch, True),
                "session (no pool)": mlp_session(sizes, batch, False)}))
        print("one training step, float32, 1 thread; CPU time: medians of "
              f"{repeats} interleaved rounds; faults: minor page faults per step over the "
              "same rounds")
        report(workloads, repeats, min_time)
    finally:
        undo()


if __name__ == "__main__":
    main()
