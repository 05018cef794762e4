"""fastadam.step_inplace against the float64 reference (tests/reference.py)."""
import itertools

import numpy as np
import pytest

import fastadam
from reference import adam_reference

DTYPES = [np.float32, np.float64, np.float16]
# 0, 1, around the SIMD widths (8/16 float32 lanes), odd, and more than one 32768-element chunk.
SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 33, 1001, 70001]


def ulp_distance(actual, expected, dtype, *operands):
    """|actual - expected| in units of the dtype's spacing at the largest magnitude among the
    expected value and the operands (a sum that cancels is exact only to its operands' ulps)."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = np.abs(expected)
    for op in operands:
        if callable(op):
            op = op(expected)
        scale = np.maximum(scale, np.abs(np.asarray(op, dtype=np.float64)))
    spacing = np.spacing(scale.astype(dtype)).astype(np.float64)
    tiny = np.finfo(dtype).smallest_subnormal
    return np.abs(actual.astype(np.float64) - expected) / np.maximum(spacing, tiny)


def operands_of(x, g, m, v, grad_scale=None, weight_decay=0.0, **_):
    """The magnitudes each output is computed from, for ulp_distance."""
    g_eff = np.abs(g.astype(np.float64)) / (grad_scale or 1.0)
    g_eff = g_eff + abs(weight_decay) * np.abs(x.astype(np.float64))
    # x: the old value and the step taken (the step is computed to a few of its own ulps).
    return {"x": (x, lambda new: new - x), "m": (m, g_eff), "v": (v, g_eff * g_eff), "v_max": ()}


def make_state(rng, shape, dtype, amsgrad=False):
    x = np.array(rng.standard_normal(shape), dtype=dtype)
    g = np.array(rng.standard_normal(shape), dtype=dtype)
    m = np.array(0.1 * rng.standard_normal(shape), dtype=dtype)
    v = np.array(0.01 * rng.random(shape), dtype=dtype)
    v_max = np.array(v + 0.01 * rng.random(shape), dtype=dtype) if amsgrad else None
    return x, g, m, v, v_max


OPTION_SETS = [
    {},
    {"weight_decay": 0.1},
    {"weight_decay": 0.05, "decoupled_weight_decay": True},
    {"post_decay": 0.01},
    {"amsgrad": True},
    {"nesterov": True},
    {"maximize": True},
    {"grad_scale": 128.0},
    {"amsgrad": True, "nesterov": True, "weight_decay": 0.01, "maximize": True,
     "grad_scale": 0.5, "post_decay": 0.001},
]


@pytest.mark.parametrize("convention", ["tf", "torch", "onnx"])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 7, 1000])
def test_one_step_matches_reference_within_ulps(rng, convention, options, dtype, t):
    x, g, m, v, v_max = make_state(rng, (257,), dtype, options.get("amsgrad", False))
    kwargs = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-6, convention=convention, **options)
    ref = adam_reference(x, g, m, v, t, v_max=v_max, **kwargs)
    operands = operands_of(x.astype(np.float64), g, m.copy(), v.copy(), **kwargs)
    g_before = g.copy()
    assert fastadam.step_inplace(x, g, m, v, t, v_max=v_max, **kwargs) is True
    # x takes six roundings (alpha, alpha*m, sqrt, +eps, the division, the subtraction);
    # float16 is computed in float32 and rounded once per stored value.
    limit = 6 if dtype != np.float16 else 1
    for name, got, want in zip(("x", "m", "v", "v_max"), (x, m, v, v_max), ref):
        if got is None:
            continue
        assert ulp_distance(got, want, dtype, *operands[name]).max() <= limit, name
    np.testing.assert_array_equal(g, g_before)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes(rng, size, dtype):
    x, g, m, v, _ = make_state(rng, (size,), dtype)
    ref = adam_reference(x, g, m, v, 3, lr=0.01)
    operands = operands_of(x.astype(np.float64), g, m.copy(), v.copy())
    fastadam.step_inplace(x, g, m, v, 3, lr=0.01)
    limit = 6 if dtype != np.float16 else 1
    for name, got, want in zip("xmv", (x, m, v), ref[:3]):
        assert got.shape == (size,)
        if size:
            assert ulp_distance(got, want, dtype, *operands[name]).max() <= limit


@pytest.mark.parametrize("convention", ["tf", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_steps_follow_reference(rng, convention, dtype):
    x, _, m, v, v_max = make_state(rng, (300,), dtype, amsgrad=True)
    m[:] = 0
    v[:] = 0
    v_max[:] = 0
    state = [a.astype(np.float64) for a in (x, m, v, v_max)]
    for t in range(1, 51):
        g = rng.standard_normal(300).astype(dtype)
        kwargs = dict(lr=0.003, convention=convention, amsgrad=True, weight_decay=0.01)
        fastadam.step_inplace(x, g, m, v, t, v_max=v_max, **kwargs)
        state = list(adam_reference(state[0], g, state[1], state[2], t, v_max=state[3],
                                    **kwargs))
    # Relative to the arrays' scale (x ~ 0.3, m ~ 0.1, v ~ 1e-2): an element that crossed zero
    # keeps an absolute, not a relative, error.
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    for got, want in zip((x, m, v, v_max), state):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * np.abs(want).max())


def test_zero_dim_arrays():
    x, g = np.array(1.5), np.array(0.25)
    m, v = np.array(0.0), np.array(0.0)
    ref = adam_reference(x, g, m, v, 1, lr=0.1)
    fastadam.step_inplace(x, g, m, v, 1, lr=0.1)
    np.testing.assert_allclose([x, m, v], ref[:3], rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_list_of_mixed_shapes_equals_one_call_per_tensor(rng, dtype):
    shapes = [(3, 4), (1,), (), (0,), (40000,), (5, 6, 7), (16,)]
    states = [make_state(rng, s, dtype, amsgrad=True) for s in shapes]
    copies = [[a.copy() for a in st] for st in states]
    kwargs = dict(lr=0.02, amsgrad=True, nesterov=True, convention="torch")
    xs, gs, ms, vs, vms = (list(z) for z in zip(*states))
    fastadam.step_inplace(xs, gs, ms, vs, 5, v_max=vms, **kwargs)
    for (x, g, m, v, vm), got in zip(copies, states):
        fastadam.step_inplace(x, g, m, v, 5, v_max=vm, **kwargs)
        for a, b in zip((x, m, v, vm), (got[0], got[2], got[3], got[4])):
            np.testing.assert_array_equal(a, b)


def test_empty_list_is_a_no_op():
    assert fastadam.step_inplace([], [], [], [], 1) is True


@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_identical_for_any_thread_count(rng, dtype):
    # Several chunks per tensor and tensors of odd sizes, so the split differs per thread count.
    shapes = [(200003,), (70001,), (3,), (131072,)]
    base = [make_state(rng, s, dtype, amsgrad=True) for s in shapes]
    results = []
    for nt in (1, 2, 3, 8):
        xs, gs, ms, vs, vms = ([a.copy() for a in col] for col in zip(*base))
        for t in (1, 2):
            fastadam.step_inplace(xs, gs, ms, vs, t, v_max=vms, amsgrad=True, num_threads=nt,
                                  weight_decay=0.01)
        results.append(xs + ms + vs + vms)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()


def test_read_only_gradient_is_accepted(rng):
    x, g, m, v, _ = make_state(rng, (100,), np.float32)
    g.flags.writeable = False
    ref = adam_reference(x, g, m, v, 2)
    fastadam.step_inplace(x, g, m, v, 2)
    assert ulp_distance(x, ref[0], np.float32).max() <= 4


def test_same_gradient_buffer_for_two_tensors(rng):
    # g is only read, so sharing it between tensors is allowed.
    x1, g, m1, v1, _ = make_state(rng, (64,), np.float64)
    x2, m2, v2 = x1.copy(), m1.copy(), v1.copy()
    fastadam.step_inplace([x1, x2], [g, g], [m1, m2], [v1, v2], 1)
    np.testing.assert_array_equal(x1, x2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", DTYPES)
def test_skip_nonfinite_changes_nothing(rng, bad, dtype):
    shapes = [(50,), (100000,)]
    states = [make_state(rng, s, dtype, amsgrad=True) for s in shapes]
    states[1][1][77777] = bad
    before = [[a.copy() for a in st] for st in states]
    xs, gs, ms, vs, vms = (list(z) for z in zip(*states))
    applied = fastadam.step_inplace(xs, gs, ms, vs, 1, v_max=vms, amsgrad=True,
                                    skip_nonfinite=True, num_threads=2)
    assert applied is False
    for st, b in zip(states, before):
        for a1, a2 in zip(st, b):
            np.testing.assert_array_equal(a1, a2)


def test_skip_nonfinite_sees_overflow_after_unscaling():
    x = np.zeros(4, np.float32)
    g = np.array([1.0, 2.0, 3e38, 0.0], np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    assert not fastadam.step_inplace(x, g, m, v, 1, grad_scale=0.1, skip_nonfinite=True)
    assert not x.any() and not m.any()
    assert fastadam.step_inplace(x, g, m, v, 1, grad_scale=10.0, skip_nonfinite=True)
    assert m[:3].all() and m[3] == 0


def test_nonfinite_propagates_without_skip():
    x, g = np.ones(3), np.array([1.0, np.nan, 1.0])
    m, v = np.zeros(3), np.zeros(3)
    assert fastadam.step_inplace(x, g, m, v, 1) is True
    assert np.isnan(x[1]) and np.isfinite(x[[0, 2]]).all()


def test_onnx_t_zero_means_no_bias_correction(rng):
    x, g, m, v, _ = make_state(rng, (20,), np.float64)
    expected = x - 0.1 * (0.9 * m + 0.1 * g) / (np.sqrt(0.999 * v + 0.001 * g * g) + 1e-8)
    fastadam.step_inplace(x, g, m, v, 0, lr=0.1, convention="onnx")
    np.testing.assert_allclose(x, expected, rtol=1e-14)


def test_large_step_number_is_exact_limit():
    x, g = np.ones(4), np.full(4, 0.5)
    m, v = np.zeros(4), np.zeros(4)
    fastadam.step_inplace(x, g, m, v, 2**62, lr=0.1)
    # beta**t underflows to 0: no bias correction, exactly.
    np.testing.assert_allclose(x, 1 - 0.1 * 0.05 / (np.sqrt(0.001 * 0.25) + 1e-8), rtol=1e-14)


@pytest.mark.parametrize("amsgrad,nesterov", list(itertools.product([False, True], repeat=2)))
def test_float16_is_computed_in_float32(rng, amsgrad, nesterov):
    x, g, m, v, vm = make_state(rng, (1000,), np.float16, amsgrad)
    x32, g32, m32, v32 = (a.astype(np.float32) for a in (x, g, m, v))
    vm32 = vm.astype(np.float32) if amsgrad else None
    kwargs = dict(lr=0.01, amsgrad=amsgrad, nesterov=nesterov)
    fastadam.step_inplace(x, g, m, v, 4, v_max=vm, **kwargs)
    ref = adam_reference(x32, g32, m32, v32, 4, v_max=vm32, **kwargs)
    operands = operands_of(x32.astype(np.float64), g32, m32, v32)
    for name, got, want in zip("xmv", (x, m, v), ref[:3]):
        assert ulp_distance(got, want, np.float16, *operands[name]).max() <= 1
