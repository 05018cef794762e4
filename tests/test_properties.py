"""Property-based sweeps (hypothesis) of the compiled steps against the float64 oracles.

The parametrized tests elsewhere pick hyper-parameters and sizes by hand; here hypothesis draws
them: sizes around the SIMD widths and the parallel chunk, lists of tensors of mixed sizes,
hyper-parameters over their valid ranges, every flag, thread counts.  The oracles are the ones
in tests/reference.py (written from the formulas), with the same ulp bounds as test_dense.py.

CI runs a fixed, derandomized set of examples (profile "ci"), so a run is reproducible; set
HYPOTHESIS_PROFILE=explore for a longer random search.
"""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings, strategies as st  # noqa: E402

import fastadam  # noqa: E402
from reference import (adagrad_reference, adam_reference, momentum_reference,  # noqa: E402
                       segment_sum_reference)
from test_dense import operands_of, ulp_distance  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          print_blob=True)
settings.register_profile("explore", max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", 2000)),
                          deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DTYPES = st.sampled_from([np.float32, np.float64, np.float16])
# 0 and 1, around 8/16-lane SIMD widths, and past one 32768-element parallel chunk.
SIZES = st.one_of(st.integers(0, 40), st.integers(30000, 34000))
THREADS = st.sampled_from([None, 1, 2])


def _array(seed, shape, dtype, scale=1.0, positive=False):
    rng = np.random.default_rng(seed)
    a = rng.random(shape) if positive else rng.standard_normal(shape)
    return np.asarray(scale * a, dtype=dtype)


def step_terms(x, g, m, v, v_max, t, hyper):
    """The size of x's step before any cancellation: the step's formula with b1*|m| + (1-b1)*|g'|
    in place of the new m, and |g| + weight_decay*|x| in place of g'.  m and g' are rounded at
    the scale of their terms, and the step multiplies that rounding by lr/(sqrt(v)+eps), which
    can be far larger than 1: x is exact only to a few ulps of this size (test_dense.py's cases
    have lr*|m| << |x|, where |x| is the larger)."""
    x = np.asarray(x, dtype=np.float64)
    lr, b1, b2, eps = hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"]
    g_abs = np.abs(np.asarray(g, dtype=np.float64)) / (hyper.get("grad_scale") or 1.0)
    if not hyper.get("decoupled_weight_decay"):
        g_abs = g_abs + hyper.get("weight_decay", 0.0) * np.abs(x)
    mu = b1 * np.abs(m.astype(np.float64)) + (1.0 - b1) * g_abs
    if hyper.get("nesterov"):
        mu = b1 * mu + (1.0 - b1) * g_abs
    _, _, v_new, v_max_new = adam_reference(x, g, m, v, t, v_max=v_max, **hyper)
    vh = np.sqrt(v_max_new if hyper.get("amsgrad") else v_new)
    convention = hyper["convention"]
    if convention == "onnx" and t <= 0:
        return lr * mu / (vh + eps)
    if convention == "torch":
        return (lr / (1.0 - b1**t)) * mu / (vh / np.sqrt(1.0 - b2**t) + eps)
    return lr * np.sqrt(1.0 - b2**t) / (1.0 - b1**t) * mu / (vh + eps)


@st.composite
def adam_case(draw):
    convention = draw(st.sampled_from(["tf", "torch", "onnx"]))
    t = draw(st.integers(0 if convention == "onnx" else 1, 10**6))
    hyper = dict(
        lr=draw(st.floats(1e-6, 1.0)),
        beta1=draw(st.floats(0.0, 0.999)),
        beta2=draw(st.floats(0.9, 0.99999)),
        eps=draw(st.floats(1e-10, 1e-2)),
        convention=convention,
    )
    if draw(st.booleans()):
        hyper["weight_decay"] = draw(st.floats(0.0, 0.5))
        hyper["decoupled_weight_decay"] = draw(st.booleans())
    for flag in ("amsgrad", "nesterov", "maximize"):
        if draw(st.booleans()):
            hyper[flag] = True
    if draw(st.booleans()):
        hyper["post_decay"] = draw(st.floats(0.0, 0.01))
    if draw(st.booleans()):
        hyper["grad_scale"] = draw(st.sampled_from([0.5, 2.0, 128.0, 65536.0]))
    sizes = draw(st.lists(SIZES, min_size=1, max_size=3))
    return t, hyper, sizes


@given(case=adam_case(), dtype=DTYPES, num_threads=THREADS, seed=st.integers(0, 2**32 - 1),
       magnitude=st.sampled_from([1e-3, 1.0, 1e3]))
def test_adam_list_matches_reference(case, dtype, num_threads, seed, magnitude):
    t, hyper, sizes = case
    # float16 holds g*g only below 65504: v of gradients near 1e3 overflows, by its range
    assume(not (dtype == np.float16 and magnitude > 1.0))
    amsgrad = hyper.get("amsgrad", False)
    states = []
    for i, n in enumerate(sizes):
        x = _array(seed + 4 * i, n, dtype, magnitude)
        g = _array(seed + 4 * i + 1, n, dtype, magnitude)
        m = _array(seed + 4 * i + 2, n, dtype, 0.1 * magnitude)
        v = _array(seed + 4 * i + 3, n, dtype, 0.01 * magnitude**2, positive=True)
        v_max = (v + np.asarray(0.01 * magnitude**2, dtype)).astype(dtype) if amsgrad else None
        states.append((x, g, m, v, v_max))
    refs = [adam_reference(x, g, m, v, t, v_max=vm, **hyper) for x, g, m, v, vm in states]
    operands = [operands_of(x.astype(np.float64), g, m.copy(), v.copy(), **hyper)
                for x, g, m, v, _ in states]
    for ops, (x, g, m, v, vm) in zip(operands, states):
        ops["x"] = ops["x"] + (step_terms(x, g, m, v, vm, t, hyper),)
    xs, gs, ms, vs, vms = (list(col) for col in zip(*states))
    applied = fastadam.step_inplace(xs, gs, ms, vs, t, v_max=vms if amsgrad else None,
                                    num_threads=num_threads, **hyper)
    assert applied is True
    limit = 6 if dtype != np.float16 else 1
    for state, ref, ops in zip(states, refs, operands):
        x, _, m, v, v_max = state
        for name, got, want in zip(("x", "m", "v", "v_max"), (x, m, v, v_max), ref):
            if got is None or got.size == 0:
                continue
            dist = ulp_distance(got, want, dtype, *ops[name])
            assert dist.max() <= limit, (name, float(dist.max()))


@given(dtype=st.sampled_from([np.float32, np.float64]), n=SIZES, seed=st.integers(0, 2**32 - 1),
       convention=st.sampled_from(["torch", "onnx"]), t=st.integers(1, 10**5),
       lr=st.floats(1e-5, 1.0), lr_decay=st.floats(0.0, 0.1), weight_decay=st.floats(0.0, 0.5),
       maximize=st.booleans(), num_threads=THREADS)
def test_adagrad_matches_reference(dtype, n, seed, convention, t, lr, lr_decay, weight_decay,
                                   maximize, num_threads):
    x = _array(seed, n, dtype)
    g = _array(seed + 1, n, dtype)
    h = _array(seed + 2, n, dtype, positive=True)
    eps = 1e-10 if convention == "torch" else 1e-6
    hyper = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay, maximize=maximize,
                 convention=convention)
    want_x, want_h = adagrad_reference(x, g, h, t, **hyper)
    fastadam.adagrad_step_inplace(x, g, h, t, num_threads=num_threads, **hyper)
    tol = dict(rtol=3e-6, atol=3e-6) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(h, want_h, **tol)
    np.testing.assert_allclose(x, want_x, **tol)


@given(dtype=st.sampled_from([np.float32, np.float64]), n=SIZES, seed=st.integers(0, 2**32 - 1),
       t=st.integers(1, 100), lr=st.floats(1e-5, 1.0), momentum=st.floats(0.0, 0.99),
       dampening=st.floats(0.0, 0.9), nesterov=st.booleans(), weight_decay=st.floats(0.0, 0.5),
       maximize=st.booleans(), num_threads=THREADS)
def test_momentum_matches_reference(dtype, n, seed, t, lr, momentum, dampening, nesterov,
                                    weight_decay, maximize, num_threads):
    if nesterov:  # torch's rule: nesterov needs momentum > 0 and no dampening
        momentum, dampening = max(momentum, 0.1), 0.0
    x = _array(seed, n, dtype)
    g = _array(seed + 1, n, dtype)
    v = _array(seed + 2, n, dtype, 0.1)
    hyper = dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                 weight_decay=weight_decay, maximize=maximize)
    want_x, want_v = momentum_reference(x, g, v, t, **hyper)
    fastadam.momentum_step_inplace(x, g, v, t, num_threads=num_threads, **hyper)
    tol = dict(rtol=3e-6, atol=3e-6) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(v, want_v, **tol)
    np.testing.assert_allclose(x, want_x, **tol)


@given(dtype=st.sampled_from([np.float32, np.float64]),
       index_dtype=st.sampled_from([np.int32, np.int64]),
       k=st.integers(0, 3000), n_rows=st.integers(1, 5000),
       row_shape=st.sampled_from([(), (1,), (3,), (2, 5)]), seed=st.integers(0, 2**32 - 1),
       num_threads=THREADS)
def test_segment_sum_is_add_at_in_original_order(dtype, index_dtype, k, n_rows, row_shape, seed,
                                                 num_threads):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_rows, size=k).astype(index_dtype)
    values = rng.standard_normal((k,) + row_shape).astype(dtype)
    rows, sums = fastadam.segment_sum(idx, values, num_threads=num_threads)
    want_rows, want_sums = segment_sum_reference(idx, values, dtype=dtype)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(sums, want_sums)  # bit for bit: the same order of additions


@given(dtype=st.sampled_from([np.float32, np.float64]), k=st.integers(0, 2000),
       n_rows=st.integers(1, 3000), width=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       t=st.integers(1, 1000), convention=st.sampled_from(["tf", "torch"]),
       weight_decay=st.floats(0.0, 0.1), num_threads=THREADS)
def test_sparse_dense_mode_is_the_dense_step(dtype, k, n_rows, width, seed, t, convention,
                                             weight_decay, num_threads):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, width)).astype(dtype)
    m = (0.1 * rng.standard_normal(x.shape)).astype(dtype)
    v = (0.01 * rng.random(x.shape)).astype(dtype)
    idx = rng.integers(0, n_rows, size=k)
    values = rng.standard_normal((k, width)).astype(dtype)
    g = np.zeros_like(x)
    np.add.at(g, idx, values)
    hyper = dict(lr=0.01, convention=convention, weight_decay=weight_decay)
    x2, m2, v2 = x.copy(), m.copy(), v.copy()
    fastadam.step_inplace(x2, g, m2, v2, t, num_threads=1, **hyper)
    grad = fastadam.IndexedSlices(values, idx, x.shape)
    fastadam.sparse_step_inplace(x, grad, m, v, t, mode="dense", num_threads=num_threads,
                                 **hyper)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(m, m2)
    np.testing.assert_array_equal(v, v2)
