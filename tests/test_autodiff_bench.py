"""The benchmark workloads (asv_bench/benchmarks/bench_autodiff.py) compute the same gradients in
every implementation (so the report compares like with like), at toy sizes."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "asv_bench", "benchmarks"))
import bench_autodiff as B  # noqa: E402


def _arrays(out):
    res = []
    for g in out:
        if hasattr(g, "detach"):
            g = g.detach().numpy()
        res.append(np.asarray(getattr(g, "data", g) if not isinstance(g, np.ndarray) else g))
    return res


@pytest.mark.parametrize("workload", ["mlp", "logreg", "conv", "hvp"])
def test_implementations_agree(workload):
    build = {"mlp": lambda i: B.build_mlp(i, np.float64, 4, sizes=(8, 6, 6, 3)),
             "logreg": lambda i: B.build_logreg(i, np.float64, 5),
             "conv": lambda i: B.build_conv(i, np.float64, 2),
             "hvp": lambda i: B.build_hvp(i, np.float64, 4, sizes=(8, 6, 6, 3))}[workload]
    ours = _arrays(build("fastadam")())
    for impl in ("numpy", "torch", "autograd"):
        try:
            other = _arrays(build(impl)())
        except NotImplementedError:
            continue
        assert len(other) == len(ours)
        for a, b in zip(ours, other):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=impl)


def test_transformer_kernel_cases_match_their_oracles():
    """Each float32 row kernel and the NumPy composition it is timed against give the float64
    oracle's values (the embedding scatter: np.add.at's bits), so the ratios compare like with
    like."""
    import bench_transformer_kernels as T
    found = T.cases(np.random.default_rng(1))
    assert [c[0] for c in found] == list(T.NAMES)
    for name, kernel, composed, oracle, tol in found:
        for fn in (kernel, composed):
            got = fn()
            if tol == 0.0:
                np.testing.assert_array_equal(got, oracle, err_msg=name)
            else:
                np.testing.assert_allclose(got, oracle, rtol=tol, atol=tol, err_msg=name)
