"""The optimizer objects and QuantizedState with low-precision states (issue 24), against
independent references: tests/lowp_reference.py (the formats from their definitions) with
tests/reference.py's float64 formulas, torch.optim.Adam, and the float32 path itself where the
format promises bit-identity (a float32 master steps exactly as a float32 parameter).
"""
import pickle

import numpy as np
import pytest

import fastadam
from fastadam.optim import SGD, Adagrad, Adam, AdamW, Lion, QuantizedState, RMSprop

import lowp_reference as R
from reference import (adagrad_reference, adam_reference, lion_reference, momentum_reference,
                       rmsprop_reference)

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
pytest.importorskip("fastadam._core._lowp", reason="the low-precision driver is not built")


MAPS = {"dynamic": 0, "linear": 1}


class O:
    """The formats of tests/lowp_reference.py, by this file's names."""

    @staticmethod
    def quant_map(name, signed):
        return R.quant_map(MAPS[name], signed)

    @staticmethod
    def quantize(a, block, signed, name="dynamic"):
        return R.quantize(a, block, O.quant_map(name, signed))

    @staticmethod
    def dequantize(codes, scales, block, signed, name="dynamic"):
        return R.dequantize(codes, scales, block, O.quant_map(name, signed))

    f32_to_bf16_bits = staticmethod(R.bf16_nearest)

    @staticmethod
    def round_bf16(a):
        return R.bf16_to_f32(R.bf16_nearest(a))

    @staticmethod
    def stochastic_bf16(a, seed, t, tensor_index):
        a = np.asarray(a, np.float32)
        bits = R.sr_bits(R.sr_key(seed, t, tensor_index), np.arange(a.size))
        return R.bf16_to_f32(R.bf16_stochastic(a.ravel(), bits)).reshape(a.shape)

    @staticmethod
    def store(values, fmt, block=256, signed=True, name="dynamic"):
        """float64 ``values`` as the format stores them, read back as float64."""
        v32 = np.asarray(values, np.float32)
        if fmt == "float32":
            return v32.astype(np.float64)
        if fmt == "bfloat16":
            return O.round_bf16(v32).astype(np.float64)
        codes, scales = O.quantize(v32, block, signed, name)
        return O.dequantize(codes, scales, block, signed, name).astype(np.float64).reshape(
            v32.shape)


def values(state):
    return state.to_array() if isinstance(state, QuantizedState) else np.asarray(state,
                                                                                   np.float32)


raw = R.array_bytes


# ---- QuantizedState against the oracle ------------------------------------------------------
@pytest.mark.parametrize("size, block", [(0, 256), (1, 8), (255, 64), (257, 256), (1000, 256),
                                         (4096, 4096)])
@pytest.mark.parametrize("quant_map", ["dynamic", "linear"])
@pytest.mark.parametrize("signed", [True, False])
def test_quantize_and_dequantize_match_the_oracle(size, block, quant_map, signed):
    rng = np.random.default_rng(size)
    a = rng.standard_normal(size).astype(np.float32) * np.float32(10.0) ** rng.integers(-6, 3,
                                                                                       size)
    if not signed:
        a = np.abs(a)
    if size > 300:
        a[:block] = 0  # an all-zero block: scale 0, the code of 0.0
    q = QuantizedState.from_array(a, block, quant_map, signed)
    codes, scales = O.quantize(a, block, signed, quant_map)
    np.testing.assert_array_equal(q.codes, codes)
    np.testing.assert_array_equal(q.scales, scales)
    np.testing.assert_array_equal(q.to_array(),
                                  O.dequantize(codes, scales, block, signed, quant_map))
    np.testing.assert_array_equal(q.quant_values(), O.quant_map(quant_map, signed))
    assert q.nbytes == size + 4 * -(-size // block)


def test_zeros_and_fill():
    q = QuantizedState.zeros((3, 100), 64, signed=False)
    np.testing.assert_array_equal(q.to_array(), np.zeros((3, 100), np.float32))
    q.fill(0.1)
    np.testing.assert_array_equal(q.to_array(), np.full((3, 100), 0.1, np.float32))


# ---- trajectories against float64 oracles with the format applied after each step ---------------
def oracle_run(kind, x0, grads, fmt, block, hyper):
    x = x0.astype(np.float64)
    if kind == "adam":
        m, v = np.zeros_like(x), np.zeros_like(x)
        for t, g in enumerate(grads, 1):
            x, m, v, _ = adam_reference(x, g, m, v, t, convention="torch", **hyper)
            m, v = O.store(m, fmt, block, True), O.store(v, fmt, block, False)
            x = x.astype(np.float32).astype(np.float64)
        return x, {"m": m, "v": v}
    if kind == "adagrad":
        h = np.zeros_like(x)
        for t, g in enumerate(grads, 1):
            x, h = adagrad_reference(x, g, h, t, eps=1e-10, **hyper)
            h = O.store(h, fmt, block, False)
            x = x.astype(np.float32).astype(np.float64)
        return x, {"sum": h}
    if kind == "rmsprop":
        v, b = np.zeros_like(x), np.zeros_like(x)
        for t, g in enumerate(grads, 1):
            x, v, b, _ = rmsprop_reference(x, g, v, t, momentum_buffer=b, **hyper)
            v, b = O.store(v, fmt, block, False), O.store(b, fmt, block, True)
            x = x.astype(np.float32).astype(np.float64)
        return x, {"square_avg": v, "momentum_buffer": b}
    if kind == "lion":
        m = np.zeros_like(x)
        for t, g in enumerate(grads, 1):
            x, m = lion_reference(x, g, m, t, **{k: v for k, v in hyper.items() if k != "betas"},
                                  beta1=hyper["betas"][0], beta2=hyper["betas"][1])
            m = O.store(m, fmt, block, True)
            x = x.astype(np.float32).astype(np.float64)
        return x, {"exp_avg": m}
    b = np.zeros_like(x)
    for t, g in enumerate(grads, 1):
        x, b = momentum_reference(x, g, b, t, **hyper)
        b = O.store(b, fmt, block, True)
        x = x.astype(np.float32).astype(np.float64)
    return x, {"momentum_buffer": b}


CASES = [
    ("adam", Adam, dict(lr=0.01)),
    ("adam", Adam, dict(lr=0.01, weight_decay=0.1)),
    ("adagrad", Adagrad, dict(lr=0.05)),
    ("momentum", SGD, dict(lr=0.05, momentum=0.9)),
    ("rmsprop", RMSprop, dict(lr=0.01, alpha=0.9, eps=1e-8, momentum=0.9)),
    ("lion", Lion, dict(lr=0.01, betas=(0.9, 0.99))),
]


@pytest.mark.parametrize("kind, cls, hyper", CASES)
@pytest.mark.parametrize("fmt, block", [("bfloat16", 256), ("int8", 256), ("int8", 64)])
def test_trajectory_against_the_oracle(kind, cls, hyper, fmt, block):
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((5, 200)).astype(np.float32)
    grads = [rng.standard_normal(x0.shape).astype(np.float32) for _ in range(6)]
    x = x0.copy()
    opt = cls([x], state_dtype=fmt, min_8bit_size=0, block_size=block, **hyper)
    for g in grads:
        assert opt.step([g])
    want_x, want_state = oracle_run(kind, x0, grads, fmt, block, hyper)
    # the kernel computes in float32 and the oracle in float64: a value at a rounding boundary
    # may land one code (or one bfloat16 ulp) apart, so compare to the format's resolution
    tol = 0.02 if fmt == "int8" else 0.01
    for name, want in want_state.items():
        got = values(opt.state(0)[name]).astype(np.float64)
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=name)
    # a flipped code in a tiny state (RMSprop's square_avg near 0, Lion's sign) moves an
    # element by up to lr per step: allow that for a few elements of the 8-bit runs only
    far = ~np.isclose(x, want_x, rtol=1e-3, atol=2e-3 * hyper["lr"])
    assert far.mean() <= (0.01 if fmt == "int8" else 0.0), far.mean()
    np.testing.assert_allclose(x, want_x, atol=2 * hyper["lr"] * len(grads))


def test_bfloat16_states_track_torch_adam():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal(4096).astype(np.float32)
    grads = [rng.standard_normal(4096).astype(np.float32) for _ in range(5)]
    x = x0.copy()
    opt = Adam([x], lr=1e-3, state_dtype="bfloat16")
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    ref = torch.optim.Adam([p], lr=1e-3)
    for g in grads:
        opt.step([g])
        p.grad = torch.from_numpy(g.copy())
        ref.step()
    moved, want = x - x0, p.detach().numpy() - x0
    # bfloat16 m and v hold 8 bits: the total update within 2% of float32 states'
    assert np.abs(moved - want).max() <= 0.02 * np.abs(want).max()
    m_ref = ref.state[p]["exp_avg"].numpy()
    np.testing.assert_allclose(values(opt.state(0)["m"]), m_ref, rtol=0.02,
                               atol=0.02 * np.abs(m_ref).max())


def test_linear_map_is_worse_than_the_dynamic_map():
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(1 << 14) * np.exp(rng.standard_normal(1 << 14) * 2)).astype(
        np.float32)
    err = {name: np.abs(QuantizedState.from_array(a, 256, name).to_array() - a).mean()
           for name in ("dynamic", "linear")}
    assert err["dynamic"] < 0.5 * err["linear"]


# ---- bfloat16 parameters ----------------------------------------------------------------------
def test_a_float32_master_steps_exactly_as_a_float32_parameter():
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((8, 256)).astype(np.float32)
    xb = x0.astype(BF16)
    x32 = xb.astype(np.float32)  # the same starting values
    a = Adam([xb], lr=1e-2, state_dtype="int8", min_8bit_size=0, master_weights=True)
    b = Adam([x32], lr=1e-2, state_dtype="int8", min_8bit_size=0)
    for _ in range(4):
        g = rng.standard_normal(x0.shape).astype(np.float32)
        a.step([g])
        b.step([g.copy()])
    master = a._master_list[0]
    np.testing.assert_array_equal(master, x32)
    np.testing.assert_array_equal(xb.view(np.uint16), O.f32_to_bf16_bits(x32))
    assert a.state_bytes_per_param() == pytest.approx(2 + 8 / 256 + 4)


def test_stochastic_rounding_follows_the_spec_and_is_reproducible():
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal(3000).astype(np.float32).astype(BF16)
    g = rng.standard_normal(3000).astype(np.float32)
    xb = x0.copy()
    Adam([xb], lr=1e-3, param_rounding="stochastic", seed=7).step([g])
    x32 = x0.astype(np.float32)  # the same step in float32, then the spec's rounding
    Adam([x32], lr=1e-3, state_dtype="bfloat16").step([g])
    np.testing.assert_array_equal(xb.astype(np.float32), O.stochastic_bf16(x32, 7, 1, 0))
    again, other = x0.copy(), x0.copy()
    Adam([again], lr=1e-3, param_rounding="stochastic", seed=7, num_threads=2).step([g])
    Adam([other], lr=1e-3, param_rounding="stochastic", seed=8).step([g])
    assert raw(again) == raw(xb) and raw(other) != raw(xb)


def test_stochastic_rounding_is_unbiased_where_nearest_stalls():
    x = np.ones(20000, BF16)
    opt = Adam([x], lr=1e-3, param_rounding="stochastic", seed=1)  # steps of ~1e-3 < ulp/2
    near = np.ones(20000, BF16)
    opt_near = Adam([near], lr=1e-3)
    for _ in range(10):
        opt.step([np.ones(20000, np.float32)])
        opt_near.step([np.ones(20000, np.float32)])
    assert np.all(near.astype(np.float32) == 1.0)  # nearest: every update rounds away
    assert abs(x.astype(np.float32).mean() - (1 - 10e-3)) < 1e-3


# ---- sparse lazy steps --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_sparse_rows_step_like_a_dense_table_of_those_rows(fmt):
    rng = np.random.default_rng(6)
    table = rng.standard_normal((12, 128)).astype(np.float32)
    rows = np.array([1, 4, 4, 9])  # 4 twice: summed
    sub = table[[1, 4, 9]].copy()
    opt = Adam([table], lr=0.01, state_dtype=fmt, min_8bit_size=0, block_size=64)
    dense = Adam([sub], lr=0.01, state_dtype=fmt, min_8bit_size=0, block_size=64)
    untouched = [0, 2, 3, 5, 6, 7, 8, 10, 11]
    before = table[untouched].copy()
    for _ in range(3):
        vals = rng.standard_normal((4, 128)).astype(np.float32)
        opt.step([fastadam.IndexedSlices(vals, rows, table.shape)])
        dense.step([np.stack([vals[0], vals[1] + vals[2], vals[3]])])
    np.testing.assert_array_equal(table[[1, 4, 9]], sub)
    np.testing.assert_array_equal(table[untouched], before)
    for name in ("m", "v"):
        got, want = values(opt.state(0)[name]), values(dense.state(0)[name])
        np.testing.assert_array_equal(got[[1, 4, 9]], want)
        assert not got[untouched].any()


def test_sparse_csr_gradient_with_bfloat16_params():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    table = np.ones((6, 64), BF16)
    opt = Adam([table], lr=0.1, state_dtype="int8", min_8bit_size=0, block_size=64)
    dense = np.zeros((6, 64), np.float32)
    dense[2] = 1.0
    opt.step([scipy_sparse.csr_matrix(dense)])
    assert np.all(table[2].astype(np.float32) < 1) and np.all(table[[0, 1, 3, 4, 5]] == 1)


# ---- the step driver: skip_nonfinite, clipping, schedules, threads ------------------------------
def test_skip_nonfinite_changes_nothing():
    x = np.ones((2, 256), np.float32)
    opt = Adam([x], lr=0.1, state_dtype="int8", min_8bit_size=0)
    opt.step([np.ones_like(x)])
    before = raw(x, opt.state(0))
    g = np.ones_like(x)
    g[1, 7] = np.nan
    assert opt.step([g], skip_nonfinite=True) is False
    assert raw(x, opt.state(0)) == before and opt.t == 1


def test_clipping_and_schedules_fold_into_the_step():
    rng = np.random.default_rng(8)
    g = rng.standard_normal(512).astype(np.float32) * 10
    a, b = np.ones(512, np.float32), np.ones(512, np.float32)
    norm = float(np.linalg.norm(g.astype(np.float64)))
    Adam([a], lr=0.1, state_dtype="bfloat16", clip_grad_norm=1.0, weight_decay=0.0).step([g])
    Adam([b], lr=0.1, state_dtype="bfloat16").step([g * np.float32(1.0 / (norm + 1e-6))])
    np.testing.assert_allclose(a, b, rtol=1e-6)
    c, d = np.ones(512, np.float32), np.ones(512, np.float32)
    sched = Adam([c], lr=lambda k: 0.1 / (k + 1), state_dtype="int8", min_8bit_size=0)
    fixed = Adam([d], lr=0.1, state_dtype="int8", min_8bit_size=0)
    for k in range(3):
        fixed.set_hyperparameters(lr=0.1 / (k + 1))
        sched.step([g])
        fixed.step([g])
    assert raw(c) == raw(d)


@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_results_do_not_depend_on_the_thread_count(fmt):
    rng = np.random.default_rng(9)
    x0 = rng.standard_normal(100_000).astype(np.float32)
    outs = []
    for threads in (1, 2, 3):
        x = x0.astype(BF16)
        opt = AdamW([x], lr=1e-2, state_dtype=fmt, min_8bit_size=0, param_rounding="stochastic",
                    num_threads=threads)
        for k in range(3):
            opt.step([np.sin(x0 * (k + 1))])
        outs.append(raw(x, opt.state(0)))
    assert outs[0] == outs[1] == outs[2]


# ---- memory and checkpoints ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt, per_param", [("float32", 8.0), ("bfloat16", 4.0),
                                             ("int8", 2 + 8 / 256)])
def test_state_bytes_per_param(fmt, per_param):
    xs = [np.ones((4, 256), np.float32), np.ones(512, np.float32)]
    opt = Adam(xs, state_dtype=fmt, min_8bit_size=0)
    assert opt.state_bytes_per_param() == per_param  # int8: 2.03125
    assert opt.state_bytes() == per_param * 1536


def test_float32_keeps_the_float_path():
    opt = Adam([np.ones(8, np.float32)])
    assert opt._lowp is None and "dense_step" not in vars(opt)
    assert opt.state_dtype == "float32" and opt.state_bytes_per_param() == 8.0


@pytest.mark.parametrize("kw", [dict(state_dtype="int8", min_8bit_size=0), dict(state_dtype="bfloat16"),
                                dict(state_dtype="int8", min_8bit_size=0, master_weights=True, bf16=True),
                                dict(param_rounding="stochastic", seed=3, bf16=True)])
def test_checkpoints_round_trip_bit_exactly(tmp_path, kw):
    kw = dict(kw)
    dtype = BF16 if kw.pop("bf16", False) else np.float32
    rng = np.random.default_rng(10)

    def make():
        xs = [np.linspace(-1, 1, 700).astype(dtype), np.ones((3, 256), dtype)]
        return xs, Adam(xs, lr=0.01, **kw)

    grads = [[rng.standard_normal(700).astype(np.float32),
              rng.standard_normal((3, 256)).astype(np.float32)] for _ in range(4)]
    xs, opt = make()
    for g in grads[:2]:
        opt.step(g)
    opt.save(tmp_path / "c.zip")
    state = opt.state_dict()
    xs_file, from_file = make()
    from_file.load(tmp_path / "c.zip")
    xs_dict, from_dict = make()
    from_dict.load_state_dict(state)
    for a, b in zip(xs_dict, xs):
        a[...] = b
    from_pickle = pickle.loads(pickle.dumps(opt))
    xs_pickle = from_pickle._arrays
    for g in grads[2:]:
        for o in (opt, from_file, from_dict, from_pickle):
            o.step([a.copy() for a in g])
    for o, arrays in ((from_file, xs_file), (from_dict, xs_dict), (from_pickle, xs_pickle)):
        assert raw(arrays) == raw(xs)
        assert raw([o.state(i) for i in range(2)]) == raw([opt.state(i) for i in range(2)])
        assert raw(o._master_list[0] if o._master_list[0] is not None else []) == raw(
            opt._master_list[0] if opt._master_list[0] is not None else [])
        assert o.t == opt.t == 4


# ---- the functional layer: prepare_step ---------------------------------------------------------
@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_prepare_step_trajectory_against_the_oracle(fmt):
    from fastadam.optim import prepare_step
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((3, 320)).astype(np.float32)
    grads = [rng.standard_normal(x0.shape).astype(np.float32) for _ in range(5)]
    x = x0.copy()
    if fmt == "int8":
        slots = {"m": QuantizedState.zeros(x.shape, 64),
                 "v": QuantizedState.zeros(x.shape, 64, signed=False)}
    else:
        slots = {"m": np.zeros(x.shape, BF16), "v": np.zeros(x.shape, BF16)}
    step = prepare_step("adam", x, slots, block_size=64)
    for t, g in enumerate(grads, 1):
        assert step.step(g, t, lr=0.01, convention="torch")
    want_x, want = oracle_run("adam", x0, grads, fmt, 64, dict(lr=0.01))
    tol = 0.02 if fmt == "int8" else 0.01
    for name in ("m", "v"):
        np.testing.assert_allclose(values(slots[name]), want[name], rtol=tol,
                                   atol=tol * np.abs(want[name]).max())
    np.testing.assert_allclose(x, want_x, rtol=1e-3, atol=2e-5)


def test_prepare_step_bfloat16_gradients_read_exactly_as_float32():
    from fastadam.optim import prepare_step
    rng = np.random.default_rng(12)
    g = rng.standard_normal(1000).astype(BF16)
    out = []
    for grad in (g, g.astype(np.float32)):
        x = np.linspace(-1, 1, 1000).astype(BF16)
        master = x.astype(np.float32)
        slots = {"m": QuantizedState.zeros(1000), "v": QuantizedState.zeros(1000, signed=False)}
        step = prepare_step("adam", x, slots, master=master)
        step.step(grad, 1, lr=0.01)
        np.testing.assert_array_equal(x.view(np.uint16), O.f32_to_bf16_bits(master))
        out.append(raw(x, master, slots))
    assert out[0] == out[1]


def test_zero_state_resets_low_precision_states():
    x = np.ones(512, np.float32)
    opt = Adagrad([x], lr=0.1, state_dtype="int8", min_8bit_size=0, initial_accumulator_value=0.5)
    np.testing.assert_array_equal(values(opt.state(0)["sum"]), np.full(512, 0.5, np.float32))
    opt.step([np.ones(512, np.float32)])
    opt.zero_state()
    np.testing.assert_array_equal(values(opt.state(0)["sum"]), np.full(512, 0.5, np.float32))
    assert opt.t == 0


def test_float32_and_bfloat16_parameters_in_one_step_are_all_or_nothing():
    rng = np.random.default_rng(13)
    a = rng.standard_normal(700).astype(np.float32)
    b = rng.standard_normal((4, 256)).astype(BF16)
    c = np.ones((6, 64), np.float32)
    opt = Adam([a, b, c], lr=1e-2, state_dtype="int8", min_8bit_size=0, block_size=64, master_weights=True)
    assert opt.state_bytes_per_param() == pytest.approx(
        (2 * (700 + 1024 + 384) + 8 * (11 + 16 + 6) + 4 * 1024) / (700 + 1024 + 384))
    grads = [rng.standard_normal(700).astype(np.float32),
             rng.standard_normal((4, 256)).astype(np.float32),
             fastadam.IndexedSlices(np.ones((2, 64), np.float32), np.array([5, 0]), (6, 64))]
    assert opt.step(grads)
    before = raw(a, b, c, [opt.state(i) for i in range(3)], opt._master_list[1])
    bad = list(grads)
    bad[1] = bad[1].copy()
    bad[1][3, 3] = np.inf
    assert opt.step(bad, skip_nonfinite=True) is False  # three calls: nothing written
    assert raw(a, b, c, [opt.state(i) for i in range(3)], opt._master_list[1]) == before
    assert opt.step(grads) and opt.t == 2
    np.testing.assert_array_equal(b.view(np.uint16), O.f32_to_bf16_bits(opt._master_list[1]))
    assert np.all(c[[1, 2, 3, 4]] == 1) and np.all(c[[0, 5]] < 1)
