"""The low-precision GPU steps (``fastadam.gpu.lowp_dense_step`` / ``lowp_rows_step``, the CPU
driver's arguments on CuPy arrays) against the oracle of tests/gpu_lowp_oracle.py (the
definitions of issue 24 and the float32 CPU step) and, where the CPU driver is built, against
it: the same bits for every optimizer x parameter format x state format, stochastic rounding
included; and the bad inputs, refused before anything is written.

Marked ``gpu``; the module skips without CuPy or a CUDA device.  test_gpu_emulation_lowp.py
runs this file through tests/fake_cupy (the kernels on the host emulation), which is not a GPU
run.  bfloat16 arrays are uint16 bit arrays on the GPU (CuPy has no bfloat16).
"""
import numpy as np
import pytest

import fastadam
from fastadam.gpu import _source
from gpu_lowp_oracle import (BF16, CASES, F32, NEAREST, Q8, STOCHASTIC, State,
                             assert_same_bits, assert_same_state, case_id, fold)

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="the GPU path needs CuPy (the gpu extra: cupy-cuda13x)")
if not fastadam.gpu.available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

PARAMS = {"f32": (F32, NEAREST, False), "bf16": (BF16, NEAREST, False),
          "bf16-sr": (BF16, STOCHASTIC, False), "bf16-master": (BF16, NEAREST, True)}
STATES = {"f32": F32, "bf16": BF16, "int8": Q8}
SHAPES = [(1,), (255,), (256,), (257,), (3, 700), (0,), (5000,)]
SEED = 0xDEAD_BEEF_0123_4567


def device(arrays):
    xs, gs, states, scales, masters = arrays
    return ([cp.asarray(a) for a in xs], [cp.asarray(a) for a in gs],
            [[cp.asarray(a) for a in lst] for lst in states],
            [[cp.asarray(a) for a in lst] for lst in scales], [cp.asarray(a) for a in masters])


def host(arrays):
    return [cp.asnumpy(a) if not isinstance(a, list) else host(a) for a in arrays]


def check(got, want):
    xs, states, scales, masters = got
    assert_same_state(xs, states, scales, masters, want)


def dense(st, arrays, rounding=NEAREST, seed=SEED, skip_nonfinite=False, block=None):
    xs, gs, states, scales, masters = arrays
    return fastadam.gpu.lowp_dense_step(st.coeffs, xs, gs, states, scales, masters,
                                        st.param_fmt, st.grad_fmt, st.state_fmt,
                                        block or st.block, st.qkind, st.signed, rounding, seed,
                                        st.t, skip_nonfinite)


def cpu_driver():
    """The CPU driver where it is built (fastadam._core._lowp, issue 24), else None."""
    try:
        from fastadam._core import _lowp
    except ImportError:
        return None
    return _lowp


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dense_step_equals_the_oracle_and_the_cpu_driver(rng, case, param, state):
    name, hyper = case
    param_fmt, rounding, master = PARAMS[param]
    grad_fmt = BF16 if param != "f32" else F32
    st = State(rng, name, hyper, SHAPES, param_fmt, grad_fmt, STATES[state], block=256,
               master=master)
    dev = device(st.arrays())
    assert dense(st, dev, rounding) is True
    xs, _, states, scales, masters = host(dev)
    check((xs, states, scales, masters), st.expected(rounding, SEED))
    driver = cpu_driver()
    if driver is not None:
        cx, cg, cstates, cscales, cmasters = st.arrays()
        driver.dense_step(st.coeffs, cx, cg, cstates, cscales, cmasters, st.param_fmt,
                          st.grad_fmt, st.state_fmt, st.block, st.qkind, st.signed, rounding,
                          SEED, st.t, False, 1)
        check((xs, states, scales, masters), (cx, cstates, cscales, cmasters))


@pytest.mark.parametrize("block", [8, 100, 256, 4096])
def test_int8_blocks_of_every_size(rng, block):
    st = State(rng, "adam", CASES[1][1], [(3 * block + 5,), (7,)], F32, F32, Q8, block=block)
    dev = device(st.arrays())
    dense(st, dev)
    xs, _, states, scales, masters = host(dev)
    check((xs, states, scales, masters), st.expected())


def test_stochastic_rounding_is_reproducible(rng):
    st = State(rng, "adam", CASES[0][1], SHAPES, BF16, F32, BF16)
    runs = []
    for seed in (SEED, SEED, SEED + 1):
        dev = device(st.arrays())
        dense(st, dev, STOCHASTIC, seed)
        runs.append(host(dev)[0])
    assert_same_bits(runs[0], runs[1], "x")
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0], runs[2]))


def test_nonfinite_gradient_skips_everything(rng):
    st = State(rng, "adam", CASES[0][1], SHAPES, BF16, F32, Q8, master=True)
    arrays = st.arrays()
    arrays[1][3][7] = np.inf
    dev = device(arrays)
    assert dense(st, dev, skip_nonfinite=True) is False
    after = host(dev)
    for got, want in zip(after, arrays):
        for a, b in zip(got, want):
            if isinstance(a, list):
                assert_same_bits(a, b, "state")
            else:
                np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                              np.asarray(b).view(np.uint8))


SPARSE_CASES = [c for c in CASES + [("rmsprop", dict(lr=0.01, momentum=0.5))]
                if fold(c[0], 5, c[1]).flags in _source.SPARSE_FLAGS[fold(c[0], 5, c[1]).kind]]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_rows_step_equals_the_oracle(rng, case, param, state):
    name, hyper = case
    param_fmt, rounding, master = PARAMS[param]
    st = State(rng, name, hyper, [(50, 256)], param_fmt, F32, STATES[state], block=64,
               master=master)
    rows = np.array([1, 2, 30, 49], np.int64)
    values = rng.standard_normal((len(rows), 256)).astype(np.float32)
    dev = device(st.arrays())
    xs, _, states, scales, masters = dev
    fastadam.gpu.lowp_rows_step(st.coeffs, xs[0], cp.asarray(rows), cp.asarray(values),
                                [lst[0] for lst in states], [lst[0] for lst in scales],
                                masters[0] if masters else None, st.param_fmt, st.state_fmt,
                                st.block, st.qkind, st.signed, rounding, SEED, st.t)
    xs, _, states, scales, masters = host(dev)
    check((xs, states, scales, masters), st.expected_rows(rows, values, rounding, SEED))


# ------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument, nothing written
# ------------------------------------------------------------------------------------------

def _bad_dense(rng, mutate, match, exc=ValueError, state_fmt=Q8):
    st = State(rng, "adam", CASES[0][1], [(300,), (20,)], BF16, F32, state_fmt, block=64)
    arrays = st.arrays()
    dev = list(device(arrays))
    kw = dict(rounding=NEAREST, seed=SEED, skip_nonfinite=False, block=None)
    mutate(st, dev, kw)
    with pytest.raises(exc, match=match):
        dense(st, dev, **kw)
    # x[0] and slot 1 of tensor 0 are never the mutated arrays: unchanged
    assert_same_bits([cp.asnumpy(dev[0][0]), cp.asnumpy(dev[2][1][0])],
                     [arrays[0][0], arrays[2][1][0]], "x[0], slot 1")


def test_bad_scale_length(rng):
    def mutate(st, dev, kw):
        dev[3][0][1] = cp.zeros(3, np.float32)
    _bad_dense(rng, mutate, r"^scales\[0\]\[1\]: expected shape \(1,\), got \(3,\)")


def test_bad_block(rng):
    def mutate(st, dev, kw):
        kw["block"] = 5000
    _bad_dense(rng, mutate, r"^block: expected an int in \[8, 4096\], got 5000")


def test_float32_array_where_bfloat16_is_expected(rng):
    def mutate(st, dev, kw):
        dev[0][1] = cp.zeros(20, np.float32)
    _bad_dense(rng, mutate, r"^xs\[1\]: expected bfloat16", TypeError)


def test_numpy_array_in_a_device_call(rng):
    def mutate(st, dev, kw):
        dev[1][0] = np.zeros(300, np.float32)
    _bad_dense(rng, mutate, r"^gs\[0\]: a numpy.ndarray in a call on cupy.ndarray", TypeError)


def test_a_slot_aliasing_the_parameter(rng):
    def mutate(st, dev, kw):
        dev[2][0][0] = dev[2][1][0]  # two slots, one buffer
    _bad_dense(rng, mutate, r"share memory", ValueError)


def test_rows_block_must_divide_the_row(rng):
    st = State(rng, "adam", CASES[0][1], [(10, 96)], F32, F32, Q8, block=64)
    xs, _, states, scales, _ = device(st.arrays())
    before = cp.asnumpy(xs[0])
    with pytest.raises(ValueError, match=r"^block_size: 64 does not divide the row size D=96"):
        fastadam.gpu.lowp_rows_step(st.coeffs, xs[0], cp.asarray(np.array([1], np.int64)),
                                    cp.zeros((1, 96), np.float32), [lst[0] for lst in states],
                                    [lst[0] for lst in scales], None, F32, Q8, 64, 0,
                                    st.signed, NEAREST, 0, st.t)
    np.testing.assert_array_equal(cp.asnumpy(xs[0]), before)


def test_rows_must_be_sorted_and_distinct(rng):
    st = State(rng, "adam", CASES[0][1], [(10, 64)], F32, F32, BF16)
    xs, _, states, _, _ = device(st.arrays())
    before = cp.asnumpy(xs[0])
    with pytest.raises(ValueError, match=r"^rows: expected sorted distinct row indices"):
        fastadam.gpu.lowp_rows_step(st.coeffs, xs[0], cp.asarray(np.array([3, 3], np.int64)),
                                    cp.zeros((2, 64), np.float32), [lst[0] for lst in states],
                                    [], None, F32, BF16, 64, 0, st.signed, NEAREST, 0, st.t)
    np.testing.assert_array_equal(cp.asnumpy(xs[0]), before)


def _call(st, dev, **change):
    xs, gs, states, scales, masters = dev
    args = dict(coeffs=st.coeffs, xs=xs, gs=gs, slots=states, scales=scales, masters=masters,
                param_fmt=st.param_fmt, grad_fmt=st.grad_fmt, state_fmt=st.state_fmt,
                block=st.block, qmap=st.qkind, signed_slots=st.signed, rounding=NEAREST,
                seed=SEED, t=st.t, skip_nonfinite=False)
    args.update(change)
    return fastadam.gpu.lowp_dense_step(**args)


@pytest.mark.parametrize("change,exc,match", [
    (dict(state_fmt=3), ValueError, r"^state_fmt: expected one of 0 \(float32\), 1 \(bfloat16\), "
                                    r"2 \(int8\), got 3"),
    (dict(param_fmt=2), ValueError, r"^param_fmt: expected one of 0 \(float32\), 1 \(bfloat16\)"),
    (dict(qmap=2), ValueError, r"^qmap: expected one of 0 \(dynamic\), 1 \(linear\), got 2"),
    (dict(rounding=True), ValueError, r"^rounding: expected one of 0 \(nearest\)"),
    (dict(signed_slots=(True,)), ValueError, r"^signed_slots: expected 2 bools"),
    (dict(seed=-1), ValueError, r"^seed: expected an int in \[0, 2\*\*64\)"),
    (dict(state_fmt=BF16), ValueError, r"^scales: only 8-bit states \(state_fmt=2\) have "
                                       r"scales, got 2 for state_fmt=1"),
    (dict(state_fmt=BF16, scales=[]), TypeError, r"^slots\[0\]\[0\]: expected bfloat16 \(on "
                                                 r"the GPU: the bits as uint16\), got uint8"),
    (dict(grad_fmt=BF16), TypeError, r"^gs\[0\]: expected bfloat16"),
])
def test_bad_codes_and_formats(rng, change, exc, match):
    st = State(rng, "adam", CASES[0][1], [(300,), (20,)], F32, F32, Q8, block=64)
    arrays = st.arrays()
    dev = device(arrays)
    with pytest.raises(exc, match=match):
        _call(st, dev, **change)
    assert_same_bits(host(dev[0]), arrays[0], "x")
    assert_same_bits(host(dev[2][0]), arrays[2][0], "slot 0")


def test_masters_go_with_bfloat16_parameters(rng):
    st = State(rng, "adam", CASES[0][1], [(30,)], F32, F32, BF16)
    dev = device(st.arrays())
    with pytest.raises(ValueError, match=r"^masters: float32 master copies go with bfloat16"):
        _call(st, dev, masters=[cp.zeros(30, np.float32)])


def test_slots_for_the_flags_in_use(rng):
    st = State(rng, "adam", CASES[1][1], [(30,)], F32, F32, BF16)  # amsgrad: three slots
    xs, gs, states, scales, masters = device(st.arrays())
    with pytest.raises(ValueError, match=r"^slots: expected 3 arrays, got 2"):
        _call(st, (xs, gs, states[:2], scales, masters))


# ------------------------------------------------------------------------------------------
# Reached from the public steps: bfloat16 (uint16 bits) and 8-bit device arrays
# ------------------------------------------------------------------------------------------

class DeviceQuantized:
    """An 8-bit state slot on the device, with fastadam.optim.QuantizedState's fields."""

    def __init__(self, codes, scales, block_size, quant_map, signed):
        self.codes, self.scales = codes, scales
        self.block_size, self.quant_map, self.signed = block_size, quant_map, signed


@pytest.mark.parametrize("state", STATES)
def test_step_inplace_takes_low_precision_device_arrays(rng, state):
    st = State(rng, "adam", CASES[0][1], [(300,), (5,)], BF16, F32, STATES[state], block=64)
    xs, gs, states, scales, _ = device(st.arrays())
    if st.state_fmt == Q8:
        m, v = ([DeviceQuantized(c, sc, 64, "dynamic", sg) for c, sc in zip(states[s], scales[s])]
                for s, sg in enumerate(st.signed))
    else:
        m, v = states
    assert fastadam.step_inplace(xs, gs, m, v, st.t, **st.hyper) is True
    wx, wstates, wscales, _ = st.expected()
    check((host(xs), host(states), host(scales), []), (wx, wstates, wscales, []))


def test_prepare_step_takes_bfloat16_device_states(rng):
    name, hyper = CASES[3]  # Adagrad
    st = State(rng, name, hyper, [(40, 3)], F32, BF16, BF16)
    xs, gs, states, _, _ = device(st.arrays())
    step = fastadam.optim.prepare_step(name, xs, {"h": states[0]})
    assert step.step(gs, st.t, **hyper) is True
    wx, wstates, _, _ = st.expected()
    check((host(xs), host(states), [], []), (wx, wstates, [], []))


def test_public_step_refuses_mixed_state_formats(rng):
    st = State(rng, "adam", CASES[0][1], [(30,)], F32, F32, BF16)
    xs, gs, states, _, _ = device(st.arrays())
    before = host(xs)
    with pytest.raises(TypeError, match=r"^v: every state of a low-precision step has one "
                                        r"format, got float32 beside bfloat16"):
        fastadam.step_inplace(xs[0], gs[0], states[0][0], cp.zeros(30, np.float32), st.t,
                              **st.hyper)
    assert_same_bits(host(xs), before, "x")


def test_public_step_refuses_a_numpy_state_beside_device_bfloat16(rng):
    st = State(rng, "adam", CASES[0][1], [(30,)], BF16, F32, BF16)
    xs, gs, states, _, _ = device(st.arrays())
    before = host(xs)
    with pytest.raises(TypeError, match=r"^v: a numpy.ndarray in a call on cupy.ndarray"):
        fastadam.step_inplace(xs[0], gs[0], states[0][0], st.states[1][0], st.t, **st.hyper)
    assert_same_bits(host(xs), before, "x")


@pytest.mark.parametrize("state", STATES)
def test_sparse_step_takes_low_precision_device_arrays(rng, state):
    from reference import segment_sum_reference

    st = State(rng, "adam", dict(lr=0.01, convention="torch"), [(30, 64)], BF16, F32,
               STATES[state], block=32)
    indices = np.array([4, 1, 4, 29, 0, 1], np.int64)
    values = rng.standard_normal((len(indices), 64)).astype(np.float32)
    rows, sums = segment_sum_reference(indices, values, dtype=np.float32)
    xs, _, states, scales, _ = device(st.arrays())
    if st.state_fmt == Q8:
        m, v = (DeviceQuantized(states[s][0], scales[s][0], 32, "dynamic", sg)
                for s, sg in enumerate(st.signed))
    else:
        m, v = states[0][0], states[1][0]
    fastadam.sparse_step_inplace(xs[0], (cp.asarray(indices), cp.asarray(values)), m, v, st.t,
                                 mode="lazy", **st.hyper)
    check((host(xs), host(states), host(scales), []),
          st.expected_rows(rows.astype(np.int64), sums.astype(np.float32)))


def test_sparse_low_precision_is_lazy_only(rng):
    st = State(rng, "adam", dict(lr=0.01, convention="torch"), [(30, 64)], BF16, F32, BF16)
    xs, _, states, _, _ = device(st.arrays())
    before = host(xs)
    with pytest.raises(ValueError, match=r"^mode: low-precision sparse steps are lazy only, "
                                         r"got 'dense'"):
        fastadam.sparse_step_inplace(xs[0], (cp.asarray(np.array([1])),
                                             cp.zeros((1, 64), np.float32)),
                                     states[0][0], states[1][0], st.t, mode="dense",
                                     **st.hyper)
    assert_same_bits(host(xs), before, "x")
