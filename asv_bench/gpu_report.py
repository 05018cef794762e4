"""Side-by-side GPU report for issue 10: ``python asv_bench/gpu_report.py``.

Times the closures of asv_bench/benchmarks/bench_gpu.py in one process, interleaved, medians of
wall-clock time per step (host overhead included: ``steps`` calls, then one synchronize), and
prints the table of the issue: fastadam vs the read-4/write-3 stream kernel (fraction of its
bandwidth) vs ``torch.optim.Adam(fused=True)``; 1000 tensors in one call; the sparse lazy step vs
``torch.optim.SparseAdam``; Adam with bfloat16 and 8-bit states (issue 24) against the float32
step and the ratio of the bytes each moves.  Needs CuPy and a CUDA device (and CUDA torch for its columns).
Its figures on an H100 are in docs/guide/gpu.md.
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))
import bench_gpu  # noqa: E402


def per_step_seconds(fns, repeat=7, steps=50):
    """Median seconds per step of each closure, interleaved so drifts hit all alike."""
    import cupy

    for fn in fns.values():  # warm up: compile, allocate
        for _ in range(3):
            fn()
    cupy.cuda.Device().synchronize()
    samples = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            cupy.cuda.Device().synchronize()
            samples[name].append((time.perf_counter() - t0) / steps)
    return {name: statistics.median(s) for name, s in samples.items()}


def optional(build, *args):
    try:
        return build(*args)
    except NotImplementedError as exc:
        print(f"  (skipped {build.__name__}: {exc})")
        return None


def main():
    try:
        cupy = bench_gpu.need_gpu()
    except NotImplementedError as exc:
        sys.exit(f"gpu_report: {exc}")
    import fastadam
    print(fastadam.config()["gpu"])
    print("\nOne float32 tensor (us per step; fraction of the stream kernel's time)")
    print(f"{'size':>10} {'fastadam':>10} {'stream':>10} {'% stream':>9} {'torch fused':>12}")
    for size in [10**3, 10**6, 10**7, 10**8]:
        fns = {"fastadam": bench_gpu.build_fastadam([size]),
               "stream": bench_gpu.build_stream(size)}
        torch_fn = optional(bench_gpu.build_torch, [size])
        if torch_fn:
            fns["torch"] = torch_fn
        t = per_step_seconds(fns, steps=20 if size >= 10**8 else 100)
        torch_us = f"{t['torch'] * 1e6:12.1f}" if "torch" in t else f"{'-':>12}"
        print(f"{size:>10.0e} {t['fastadam'] * 1e6:10.1f} {t['stream'] * 1e6:10.1f} "
              f"{100 * t['stream'] / t['fastadam']:8.1f}% {torch_us}")
        del fns
        cupy.get_default_memory_pool().free_all_blocks()

    sizes = bench_gpu.many_sizes()
    print(f"\n{len(sizes)} tensors of 1e3..1e4 elements ({sum(sizes):.2e} in all), one call")
    fns = {"fastadam": bench_gpu.build_fastadam(sizes)}
    for mode in ("fused", "foreach"):
        fn = optional(bench_gpu.build_torch, sizes, mode)
        if fn:
            fns[f"torch {mode}"] = fn
    for name, sec in per_step_seconds(fns, steps=20).items():
        print(f"  {name:>14}: {sec * 1e6:10.1f} us/step")

    print("\nLow-precision Adam states, 1e7 elements (speed-up over the float32 step; the limit"
          " is the ratio of bytes moved)")
    fns = {"float32": bench_gpu.build_fastadam([10**7])}
    fns.update({fmt: bench_gpu.build_lowp(10**7, fmt) for fmt in bench_gpu.LOWP_FORMATS})
    t = per_step_seconds(fns, steps=50)
    for fmt, sec in t.items():
        limit = bench_gpu.LOWP_BYTES["float32"] / bench_gpu.LOWP_BYTES[fmt]
        print(f"  {fmt:>14}: {sec * 1e6:10.1f} us/step  {t['float32'] / sec:5.2f}x "
              f"(limit {limit:.2f}x)")
    del fns
    cupy.get_default_memory_pool().free_all_blocks()

    print("\nSparse lazy step, 1e6 x 64 table, batch 4096 Zipf indices")
    fns = {"fastadam": bench_gpu.build_sparse_fastadam()}
    fn = optional(bench_gpu.build_sparse_torch)
    if fn:
        fns["torch SparseAdam"] = fn
    t = per_step_seconds(fns, steps=20)
    for name, sec in t.items():
        print(f"  {name:>16}: {sec * 1e6:10.1f} us/step")
    if "torch SparseAdam" in t:
        print(f"  fastadam is {t['torch SparseAdam'] / t['fastadam']:.2f}x faster")


if __name__ == "__main__":
    main()
