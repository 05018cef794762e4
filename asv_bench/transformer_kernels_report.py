"""Side-by-side timings of the float32 row kernels a transformer step runs, each against the
same result composed from NumPy operations (the path they replace), in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/transformer_kernels_report.py

1 thread (threadpoolctl), shapes of the GPT benchmark's step (batch 16, sequence 64, d 64,
4 heads, vocabulary 128: bench_onnx_gpt), medians of interleaved rounds.  Each kernel's result
is checked against a float64 NumPy oracle before it is timed; ``scatter rows`` (the gradient of
an embedding lookup) must equal ``np.add.at`` bit for bit.  The cases and the asv ratio
``TransformerKernelRatio`` live in benchmarks/bench_transformer_kernels.py.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

from bench_transformer_kernels import cases  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        rng = np.random.default_rng(0)
        print(f"1 thread, float32, medians of {args.repeat} interleaved rounds")
        print(f"{'kernel':32s} {'kernel':>10s} {'NumPy':>10s} {'NumPy/kernel':>13s}")
        for name, kernel, numpy_path, oracle, tol in cases(rng):
            got = kernel()
            if tol == 0.0:
                assert np.array_equal(got, oracle), name
            else:
                np.testing.assert_allclose(got, oracle, rtol=tol, atol=tol, err_msg=name)
            t = median_seconds_interleaved({"kernel": kernel, "numpy": numpy_path},
                                           repeats=args.repeat, min_time=0.05)
            print(f"{name:32s} {t['kernel'] * 1e3:8.3f} ms {t['numpy'] * 1e3:8.3f} ms "
                  f"{t['numpy'] / t['kernel']:12.2f}x")


if __name__ == "__main__":
    main()
