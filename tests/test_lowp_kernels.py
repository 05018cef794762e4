"""The compiled core of low-precision optimizer states (fastadam/_core/_lowp.pyx,
include/fastadam/lowp.c, lowp.h) against tests/lowp_reference.py's NumPy oracles.

Two comparisons per optimizer option set x state format x parameter format:
- exact: the oracle's format conversions around fastadam's float32 dense step (a separate
  kernel applying the same float32 element formula) give the low-precision step's bits;
- float64: the oracle's formula in float64 between the same conversions agrees within the
  float32 rounding of the formula (codes and bfloat16 bits within one step: a value a few float32
  ulps from a rounding boundary may land on either side; nearly all are equal).
"""
import numpy as np
import pytest

from fastadam._core import _lowp
from fastadam._core._coeffs import StructCoefficients
from fastadam._core._registry import spec
from lowp_reference import (NONNEGATIVE, Stored, bf16_nearest, bf16_stochastic, bf16_to_f32,
                            codes_of, dequantize, dynamic_map, linear_map, midpoints,
                            quant_map, quantize, sr_bits, sr_key)
from optimizer_table import ELEMENT_CASES as CASES, case_id, fold_options  # no row-wise lowp

FMT = {"f32": _lowp.FMT_F32, "bf16": _lowp.FMT_BF16, "q8": _lowp.FMT_Q8}
STATE_FORMATS = [("f32", 0), ("bf16", 0), ("q8", _lowp.MAP_DYNAMIC), ("q8", _lowp.MAP_LINEAR)]
PARAM_MODES = ["f32", "bf16-nearest", "bf16-stochastic", "bf16-master"]
SIZE, BLOCK, SEED = 1003, 64, 0x1234_5678_9ABC


# ---- maps, codes, bfloat16, keys ---------------------------------------------------------------

@pytest.mark.parametrize("signed", [True, False])
def test_maps_are_the_spec_maps(signed):
    np.testing.assert_array_equal(_lowp.dynamic_map(signed), dynamic_map(signed))
    np.testing.assert_array_equal(_lowp.linear_map(signed), linear_map(signed))
    d = dynamic_map(signed)
    assert np.all(np.diff(d) > 0) and d[-1] == 1.0 and 0.0 in d
    assert (d < 0).sum() == (127 if signed else 0)


def boundary_values(values):
    """Every float32 within 8 ulps of every midpoint of the map, both signs of zero, +-1.5."""
    mids = midpoints(values).astype(np.float32)
    out = [mids]
    for _ in range(8):
        out.append(np.nextafter(out[-1], np.float32(np.inf)))
    down = [mids]
    for _ in range(8):
        down.append(np.nextafter(down[-1], np.float32(-np.inf)))
    return np.concatenate(out + down + [np.float32([0.0, -0.0, 1.0, -1.0])])


@pytest.mark.parametrize("qmap", [_lowp.MAP_DYNAMIC, _lowp.MAP_LINEAR])
@pytest.mark.parametrize("signed", [True, False])
def test_codes_are_exact_at_every_midpoint(qmap, signed):
    # blocks whose scale is exactly 1 (each holds +-1.0), so q = y: the kernel's code of every
    # float32 near every midpoint equals the float64 midpoint count
    values = quant_map(qmap, signed)
    q = boundary_values(values)
    q = q[np.abs(q) <= 1]
    block = 64
    y = np.ones(-(-q.size // (block - 1)) * block, np.float32)
    mask = np.arange(y.size) % block != 0
    y[np.flatnonzero(mask)[:q.size]] = q
    codes, scales = _lowp.quantize(y, block, signed, qmap)
    assert np.all(scales == 1)
    np.testing.assert_array_equal(codes, codes_of(y, values))


@pytest.mark.parametrize("qmap", [_lowp.MAP_DYNAMIC, _lowp.MAP_LINEAR])
@pytest.mark.parametrize("signed", [True, False])
def test_code_bins_equal_the_threshold_search_on_minus_one_and_a_half_to_one_and_a_half(
        qmap, signed):
    # lowp.c's bins (the kernels) against lowp.h's search (the GPU, checked against the float64
    # midpoints above): every bin edge +-8 ulps, and every 9973rd float32 in [-1.5, 1.5]
    top = int(np.float32(1.5).view(np.uint32)) + 1
    for sign in (0, 0x80000000):
        assert _lowp._check_codes(qmap, signed, sign, sign + top, 9973) == 0
        for e in range(102, 128):
            for m7 in range(128):
                u = sign | (e << 23) | (m7 << 16)
                assert _lowp._check_codes(qmap, signed, u - 8, u + 9, 1) == 0


@pytest.mark.slow
@pytest.mark.parametrize("qmap", [_lowp.MAP_DYNAMIC, _lowp.MAP_LINEAR])
@pytest.mark.parametrize("signed", [True, False])
def test_code_bins_on_every_float32_up_to_one_and_a_half(qmap, signed):
    top = int(np.float32(1.5).view(np.uint32)) + 1  # about 30 s per sign and map
    for sign in (0, 0x80000000):
        assert _lowp._check_codes(qmap, signed, sign, sign + top, 1) == 0


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_and_dequantize_match_the_oracle(signed):
    rng = np.random.default_rng(3)
    y = (rng.standard_normal(5000) * np.exp(rng.uniform(-12, 2, 5000))).astype(np.float32)
    if not signed:
        y = np.abs(y)
    y[256:512] = 0  # a zero block
    y[600] = -0.0
    for qmap in (_lowp.MAP_DYNAMIC, _lowp.MAP_LINEAR):
        values = quant_map(qmap, signed)
        for block in (8, 256, 333, 4096):
            codes, scales = _lowp.quantize(y, block, signed, qmap)
            ref_codes, ref_scales = quantize(y, block, values)
            np.testing.assert_array_equal(scales, ref_scales)
            np.testing.assert_array_equal(codes, ref_codes)
            np.testing.assert_array_equal(_lowp.dequantize(codes, scales, block, signed, qmap),
                                          dequantize(codes, scales, block, values))


def test_quantize_nan_counts_for_nothing_and_an_infinite_one_saturates():
    """A NaN does not count in its block's scale and gets the code of 0 (lowp.h,
    fa_lowp_abs_bits); an infinity makes the scale FLT_MAX (fa_lowp_scale_of: no infinite
    scale), the infinity the top code and the block's ones (q = 1 / FLT_MAX) the code of 0."""
    y = np.ones(64, np.float32)
    y[3] = np.nan
    y[40] = np.inf
    for signed in (True, False):
        values = dynamic_map(signed)
        codes, scales = _lowp.quantize(y, 32, signed, 0)
        assert scales[0] == 1.0 and scales[1] == np.finfo(np.float32).max
        ref_codes, _ = quantize(y[:32], 32, values)
        np.testing.assert_array_equal(codes[:32], ref_codes)
        zero = int(np.flatnonzero(values == 0)[0])
        assert codes[3] == zero and (codes[:3] == codes[4]).all()
        expected = np.full(32, zero)
        expected[40 - 32] = 255
        np.testing.assert_array_equal(codes[32:], expected)


def test_bad_block_sizes_are_refused():
    for block in (0, 7, 4097):
        with pytest.raises(ValueError, match="block_size"):
            _lowp.quantize(np.ones(8, np.float32), block, True, 0)


def bf16_probe_values():
    """Every bfloat16 high half with the low halves that decide rounding, plus a sample."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.uint32([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    u = (hi[:, None] | lows[None, :]).ravel()
    rng = np.random.default_rng(5)
    u = np.concatenate([u, rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint64).astype(np.uint32)])
    return u.view(np.float32)


def test_bf16_nearest_equals_ml_dtypes_on_every_rounding_boundary():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # the bfloat16 extra (and onnx's dependency)
    f = bf16_probe_values()
    ours = _lowp.to_bf16_bits(f)
    with np.errstate(invalid="ignore"):
        theirs = f.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(f)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    assert np.all(np.isnan(bf16_to_f32(ours[nan])))
    assert np.all(ours[nan] & 0x0040)  # quiet
    np.testing.assert_array_equal(ours, bf16_nearest(f))


def test_sr_key_matches_the_oracle():
    for seed, t, i in [(0, 1, 0), (SEED, 7, 3), (2 ** 64 - 1, 2 ** 33 + 5, 2 ** 32 + 1)]:
        assert _lowp.sr_key(seed, t, i) == sr_key(seed, t, i)
    assert len({_lowp.sr_key(0, t, 0) for t in range(100)}) == 100


# ---- one step per optimizer, format and parameter format ----------------------------------------

def coefficients(info, options, t):
    return spec(info.name).fold(t, **fold_options(info.name, options))


def initial_state(info, options, rng, shape):
    state = {}
    for name in info.slots(options):
        if name in NONNEGATIVE[info.name]:
            state[name] = (0.01 * (np.abs(rng.standard_normal(shape)) + 0.5)).astype(np.float32)
        else:
            state[name] = (0.001 * rng.standard_normal(shape)).astype(np.float32)
    return state


class Setup:
    """One option set's arrays in the low-precision formats, and the driver call."""

    def __init__(self, info, options, state_fmt, qmap, param_mode, grad_fmt="f32", shape=(SIZE,),
                 block=BLOCK, seed=11):
        rng = np.random.default_rng(seed)
        self.info, self.options = info, options
        self.state_fmt, self.qmap, self.block = state_fmt, qmap, block
        self.param_mode, self.grad_fmt = param_mode, grad_fmt
        self.names = info.slots(options)
        self.signed = tuple(n not in NONNEGATIVE[info.name] for n in self.names)
        x = rng.standard_normal(shape).astype(np.float32)
        self.g_rng = rng
        self.shape = shape
        self.master = x.copy() if param_mode == "bf16-master" else None
        self.x = Stored("f32" if param_mode == "f32" else "bf16", x)
        init = initial_state(info, options, rng, shape)
        self.state = [Stored(state_fmt, init[n], block, qmap, s)
                      for n, s in zip(self.names, self.signed)]

    def gradient(self):
        g = self.g_rng.standard_normal(self.shape).astype(np.float32)
        return bf16_nearest(g) if self.grad_fmt == "bf16" else g

    def g32(self, g):
        return bf16_to_f32(g) if self.grad_fmt == "bf16" else g

    def rounding(self):
        return _lowp.ROUND_STOCHASTIC if self.param_mode == "bf16-stochastic" else \
            _lowp.ROUND_NEAREST

    def step(self, g, t, num_threads=1, seed=SEED):
        """The driver's step, in place."""
        coeffs = coefficients(self.info, self.options, t)
        slots = [[s.data] for s in self.state]
        scales = [[s.scales] for s in self.state] if self.state_fmt == "q8" else []
        masters = [self.master] if self.master is not None else []
        return _lowp.dense_step(
            coeffs, [self.x.data], [g], slots, scales, masters,
            FMT["f32" if self.param_mode == "f32" else "bf16"], FMT[self.grad_fmt],
            FMT[self.state_fmt], self.block, self.qmap, self.signed, self.rounding(), seed, t,
            False, num_threads)

    def x32(self):
        return self.master.copy() if self.master is not None else self.x.value()

    def expected_exact(self, g, t, seed=SEED):
        """The oracle's conversions around fastadam's float32 dense step: (x data, master,
        [state data], [scales])."""
        x = self.x32()
        state = {n: s.value() for n, s in zip(self.names, self.state)}
        self.info.dense(x, self.g32(g).copy(), state, t, num_threads=1, **self.options)
        return self.convert(x, [state[n] for n in self.names], t, seed)

    def expected_float64(self, g, t, seed=SEED):
        x = self.x32().astype(np.float64)
        state = {n: s.value().astype(np.float64) for n, s in zip(self.names, self.state)}
        x, new = self.info.reference(x, self.g32(g).astype(np.float64), state, t, **self.options)
        return self.convert(np.asarray(x, np.float32),
                            [np.asarray(new[n], np.float32) for n in self.names], t, seed)

    def convert(self, x32, states32, t, seed):
        if self.param_mode == "f32":
            x, master = x32, None
        elif self.param_mode == "bf16-master":
            x, master = bf16_nearest(x32), x32
        elif self.param_mode == "bf16-nearest":
            x, master = bf16_nearest(x32), None
        else:
            j = np.arange(x32.size, dtype=np.uint64).reshape(x32.shape)
            x, master = bf16_stochastic(x32, sr_bits(sr_key(seed, t, 0), j)), None
        new = [s.stored_like(v) for s, v in zip(self.state, states32)]
        return x, master, [s.data for s in new], [getattr(s, "scales", None) for s in new]

    def actual(self):
        return (self.x.data, self.master, [s.data for s in self.state],
                [getattr(s, "scales", None) for s in self.state])


def assert_same(actual, expected):
    x, master, states, scales = actual
    ex, em, es, esc = expected
    np.testing.assert_array_equal(x.view(np.uint8), ex.view(np.uint8))
    if em is not None:
        np.testing.assert_array_equal(master.view(np.uint8), em.view(np.uint8))
    for a, e in zip(states, es):
        np.testing.assert_array_equal(a.view(np.uint8), e.view(np.uint8))
    for a, e in zip(scales, esc):
        if e is not None:
            np.testing.assert_array_equal(a.view(np.uint8), e.view(np.uint8))


def assert_close(actual, expected, setup):
    """float32 kernel vs float64 formula: float32 values within a few ulps of the formula,
    bfloat16 bits and 8-bit codes within one step (a value within float32 rounding of a
    rounding boundary may fall either side), at least 97% exactly equal."""
    x, master, states, scales = actual
    ex, em, es, esc = expected
    for a, e in [(x, ex), (master, em)] + list(zip(states, es)):
        if e is None:
            continue
        if a.dtype == np.float32:
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=1e-6)
            continue
        diff = np.abs(a.astype(np.int64) - e.astype(np.int64))
        if a.dtype == np.uint16:  # bf16 bits: adjacent bit patterns are adjacent values
            diff = np.where(np.sign(bf16_to_f32(a)) == np.sign(bf16_to_f32(e)), diff, 0)
        assert diff.max() <= 1, np.flatnonzero(diff > 1)[:10]
        assert (diff == 0).mean() >= 0.97, (diff == 0).mean()
    for a, e in zip(scales, esc):
        if e is not None:
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=1e-12)


STEP_CASES = [(case, fmt, mode) for case in CASES for fmt in STATE_FORMATS for mode in PARAM_MODES]


@pytest.mark.parametrize("case,state,mode", STEP_CASES,
                         ids=[f"{case_id(c)}-{f[0]}{'-linear' if f[1] else ''}-{m}"
                              for c, f, m in STEP_CASES])
def test_step_matches_the_oracles(case, state, mode):
    info, options = case
    s = Setup(info, options, state[0], state[1], mode)
    for t in range(info.first_t, info.first_t + 2):
        g = s.gradient()
        exact = s.expected_exact(g, t)
        close = s.expected_float64(g, t)
        assert s.step(g, t) is True
        assert_same(s.actual(), exact)
        assert_close(s.actual(), close, s)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_everything_bfloat16_matches_the_oracle(case):
    """x, g and the states bfloat16, x rounded to nearest (the kernels' fused all-bf16 loop),
    every option set: the oracle's conversions around the float32 dense step, bit for bit."""
    info, options = case
    s = Setup(info, options, "bf16", 0, "bf16-nearest", grad_fmt="bf16")
    for t in range(info.first_t, info.first_t + 2):
        g = s.gradient()
        exact = s.expected_exact(g, t)
        assert s.step(g, t) is True
        assert_same(s.actual(), exact)


@pytest.mark.parametrize("mode", PARAM_MODES)
def test_nonfinite_values_round_like_the_oracle(mode):
    """NaN (both signs, any payload) and +-inf through bfloat16 states and parameters: the
    kernels' NaN handling (quiet bit, no carry) gives the oracle's bits exactly."""
    info, options = CASES[0]
    s = Setup(info, options, "bf16", 0, mode)
    g = s.gradient()
    special = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFFFFFFF,
                        0x7F800000, 0xFF800000], dtype=np.uint32).view(np.float32)
    at = np.arange(special.size) * 97 + 5
    g[at] = special
    exact = s.expected_exact(g, info.first_t)
    assert s.step(g, info.first_t) is True
    assert_same(s.actual(), exact)
    assert np.isnan(bf16_to_f32(s.state[0].data[at[:6]])).all()


@pytest.mark.parametrize("mode", PARAM_MODES)
@pytest.mark.parametrize("state", [("bf16", 0), ("q8", 0)])
def test_bfloat16_gradients(state, mode):
    info, options = next(c for c in CASES if c[0].name == "adam")
    s = Setup(info, options, state[0], state[1], mode, grad_fmt="bf16")
    for t in (1, 2):
        g = s.gradient()
        exact = s.expected_exact(g, t)
        s.step(g, t)
        assert_same(s.actual(), exact)


# ---- stochastic rounding ---------------------------------------------------------------------------

def test_stochastic_rounding_is_unbiased_reproducible_and_lands_on_a_neighbour():
    info, options = next(c for c in CASES if c[0].name == "momentum")
    results, exact32 = [], None
    for seed in range(400):
        s = Setup(info, options, "f32", 0, "bf16-stochastic", seed=2)
        g = s.gradient()
        x = s.x32()
        st = {n: v.value() for n, v in zip(s.names, s.state)}
        info.dense(x, g.copy(), st, 1, num_threads=1, **options)
        exact32 = x
        s.step(g, 1, seed=seed)
        results.append(bf16_to_f32(s.x.data))
        if seed == 0:
            again = Setup(info, options, "f32", 0, "bf16-stochastic", seed=2)
            again.step(again.gradient(), 1, seed=0)
            np.testing.assert_array_equal(again.x.data, s.x.data)
    r = np.array(results)
    down = bf16_to_f32(bf16_nearest(exact32) - (bf16_to_f32(bf16_nearest(exact32)) > exact32))
    lo = np.minimum(down, exact32)
    ulp = np.abs(bf16_to_f32(bf16_nearest(lo) + 1) - bf16_to_f32(bf16_nearest(lo)))
    assert np.all((r == r.min(axis=0)) | (r == r.max(axis=0)))
    assert np.all(r.max(axis=0) - r.min(axis=0) <= ulp * 1.0001)
    bias = (r.mean(axis=0).astype(np.float64) - exact32) / ulp
    # per element: the mean of 400 Bernoulli draws has sd <= 0.025 ulp; all 1003 within 5 sd
    assert np.abs(bias).max() < 0.125, np.abs(bias).max()
    assert abs(bias.mean()) < 0.01
    assert len({r[i].tobytes() for i in range(10)}) == 10  # the seed matters


# ---- threads, rows, errors -----------------------------------------------------------------------

@pytest.mark.parametrize("state", [("bf16", 0), ("q8", 0)])
def test_results_are_identical_for_any_thread_count(state):
    info, options = next(c for c in CASES if c[0].name == "adam")
    sizes = [100_003, 70_001, 50_000]  # more than the serial threshold in all, ragged ends
    outs = []
    for nt in (1, 2, 3):
        setups = [Setup(info, options, state[0], state[1], "bf16-stochastic", shape=(n,),
                        block=256, seed=i) for i, n in enumerate(sizes)]
        gs = [s.gradient() for s in setups]
        coeffs = coefficients(info, options, 1)
        slots = [[s.state[q].data for s in setups] for q in range(2)]
        scales = [[s.state[q].scales for s in setups] for q in range(2)] if state[0] == "q8" else []
        _lowp.dense_step(coeffs, [s.x.data for s in setups], gs, slots, scales, [],
                         FMT["bf16"], FMT["f32"], FMT[state[0]], 256, 0, setups[0].signed,
                         _lowp.ROUND_STOCHASTIC, SEED, 1, False, nt)
        outs.append(b"".join(a.tobytes() for a in [s.x.data for s in setups] + sum(slots, [])
                             + sum(scales, [])))
    assert outs[0] == outs[1] == outs[2]


def test_stochastic_rounding_draws_per_tensor_position():
    info, options = next(c for c in CASES if c[0].name == "adam")
    a = Setup(info, options, "q8", 0, "bf16-stochastic", seed=4)
    b = Setup(info, options, "q8", 0, "bf16-stochastic", seed=4)
    g = a.gradient()
    coeffs = coefficients(info, options, 1)
    both = [a, b]
    _lowp.dense_step(coeffs, [s.x.data for s in both], [g, g],
                     [[s.state[q].data for s in both] for q in range(2)],
                     [[s.state[q].scales for s in both] for q in range(2)], [],
                     FMT["bf16"], FMT["f32"], FMT["q8"], BLOCK, 0, a.signed,
                     _lowp.ROUND_STOCHASTIC, SEED, 1, False, 1)
    assert not np.array_equal(a.x.data, b.x.data)


@pytest.mark.parametrize("state", [("f32", 0), ("bf16", 0), ("q8", 0)])
@pytest.mark.parametrize("mode", ["f32", "bf16-nearest", "bf16-stochastic", "bf16-master"])
def test_rows_step_updates_the_listed_rows_only(state, mode):
    info, options = next(c for c in CASES if c[0].name == "adam")
    R, D = 40, 64
    s = Setup(info, options, state[0], state[1], mode, shape=(R, D), block=32)
    rows = np.array([0, 3, 4, 17, 39], np.int64)
    values = s.g_rng.standard_normal((rows.size, D)).astype(np.float32)
    before = [a.copy() for a in [s.x.data] + [st.data for st in s.state]]
    before_scales = [st.scales.copy() for st in s.state] if state[0] == "q8" else []
    # expected: the dense step of the listed rows as one (5, D) tensor, same formats; its
    # stochastic rounding draws flat index row * D + column
    sub = Setup(info, options, state[0], state[1], mode, shape=(rows.size, D), block=32)
    sub.x.data = s.x.data[rows].copy()
    if s.master is not None:
        sub.master = s.master[rows].copy()
    for q, st in enumerate(s.state):
        sub.state[q].data = st.data[rows].copy()
        if state[0] == "q8":
            sub.state[q].scales = st.scales.reshape(R, D // 32)[rows].ravel().copy()
    t = 3
    x32 = sub.x32()
    st32 = {n: v.value() for n, v in zip(sub.names, sub.state)}
    info.dense(x32, values.copy(), st32, t, num_threads=1, **options)
    _, emaster, estates, escales = sub.convert(x32, [st32[n] for n in sub.names], t, SEED)
    if mode == "bf16-stochastic":
        j = (rows[:, None] * D + np.arange(D)[None, :]).astype(np.uint64)
        ex = bf16_stochastic(x32, sr_bits(sr_key(SEED, t, 0), j))
    else:
        ex = sub.convert(x32, [], t, SEED)[0]
    coeffs = coefficients(info, options, t)
    _lowp.rows_step(coeffs, s.x.data, rows, values, [st.data for st in s.state],
                    [st.scales for st in s.state] if state[0] == "q8" else [], s.master,
                    FMT["f32" if mode == "f32" else "bf16"], FMT[state[0]], 32, 0, s.signed,
                    s.rounding(), SEED, t, 1)
    others = np.setdiff1d(np.arange(R), rows)
    for a, b in zip([s.x.data] + [st.data for st in s.state], before):
        np.testing.assert_array_equal(a[others], b[others])
    for st, b in zip(s.state, before_scales):
        np.testing.assert_array_equal(st.scales.reshape(R, -1)[others], b.reshape(R, -1)[others])
    np.testing.assert_array_equal(s.x.data[rows].view(np.uint8), ex.view(np.uint8))
    if emaster is not None:
        np.testing.assert_array_equal(s.master[rows], emaster)
    for q, st in enumerate(s.state):
        np.testing.assert_array_equal(st.data[rows].view(np.uint8), estates[q].view(np.uint8))
        if state[0] == "q8":
            np.testing.assert_array_equal(st.scales.reshape(R, -1)[rows].ravel(), escales[q])


def snapshot(s):
    return [s.x.data.copy()] + [st.data.copy() for st in s.state] + (
        [st.scales.copy() for st in s.state] if s.state_fmt == "q8" else [])


def assert_unchanged(s, snap):
    for a, b in zip(snapshot(s), snap):
        np.testing.assert_array_equal(a, b)


def test_rows_step_refuses_bad_rows_and_blocks_before_writing():
    info, options = next(c for c in CASES if c[0].name == "adam")
    s = Setup(info, options, "q8", 0, "f32", shape=(10, 64), block=32)
    snap = snapshot(s)
    coeffs = coefficients(info, options, 1)
    vals = np.ones((3, 64), np.float32)

    def call(rows, block=32, values=vals):
        _lowp.rows_step(coeffs, s.x.data, np.asarray(rows, np.int64), values,
                        [st.data for st in s.state], [st.scales for st in s.state], None,
                        FMT["f32"], FMT["q8"], block, 0, s.signed, 0, SEED, 1, 1)
    with pytest.raises(ValueError, match="rows"):
        call([0, 5, 5])
    with pytest.raises(ValueError, match="rows"):
        call([3, 1, 2])
    with pytest.raises(ValueError, match="rows"):
        call([0, 1, 10])
    with pytest.raises(ValueError, match="block_size.*D = 64"):
        call([0, 1, 2], block=48)
    with pytest.raises(ValueError, match="values"):
        call([0, 1, 2], values=np.ones((2, 64), np.float32))
    assert_unchanged(s, snap)


def test_unsupported_flags_and_wrong_arrays_raise_before_writing():
    info, options = next(c for c in CASES if c[0].name == "lion")
    s = Setup(info, options, "q8", 0, "f32")
    snap = snapshot(s)
    g = s.gradient()
    good = coefficients(info, options, 1)
    lion = spec("lion")
    bad = StructCoefficients(good.kind, tuple(lion.fields),
                             tuple(0.5 for _ in lion.fields), 1)  # FA_L2: not a Lion flag

    def call(coeffs, slots=None, scales=None, signed=None):
        return _lowp.dense_step(coeffs, [s.x.data], [g],
                                slots if slots is not None else [[s.state[0].data]],
                                scales if scales is not None else [[s.state[0].scales]], [],
                                FMT["f32"], FMT["f32"], FMT["q8"], BLOCK, 0,
                                signed if signed is not None else s.signed, 0, SEED, 1, False, 1)
    with pytest.raises(ValueError, match="no kernel"):
        call(bad)
    with pytest.raises(ValueError, match="slots"):
        call(good, slots=[[s.state[0].data], [s.state[0].data]])
    with pytest.raises(ValueError, match="scales"):
        call(good, scales=[[s.state[0].scales[:-1]]])
    with pytest.raises(ValueError, match="signed_slots"):
        call(good, signed=(True, False))
    with pytest.raises(ValueError, match="slots"):
        call(good, slots=[[s.state[0].data[:-1]]])
    assert_unchanged(s, snap)


def test_skip_nonfinite_writes_nothing():
    info, options = next(c for c in CASES if c[0].name == "adam")
    for grad_fmt in ("f32", "bf16"):
        s = Setup(info, options, "q8", 0, "bf16-stochastic", grad_fmt=grad_fmt)
        snap = snapshot(s)
        g = s.gradient()
        g[500] = bf16_nearest(np.float32(np.inf)) if grad_fmt == "bf16" else np.inf
        coeffs = coefficients(info, options, 1)
        assert _lowp.dense_step(coeffs, [s.x.data], [g], [[st.data] for st in s.state],
                                [[st.scales] for st in s.state], [], FMT["bf16"],
                                FMT[grad_fmt], FMT["q8"], BLOCK, 0, s.signed, 1, SEED, 1,
                                True, 1) is False
        assert_unchanged(s, snap)
