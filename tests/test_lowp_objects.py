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
    assert opt._lowp is None and opt._plans[0].driver == ("cpu", "float", "float")
    assert opt.state_dtype == "float32" and opt.state_bytes_per_param() == 8.0


@pytest.mark.parametrize("kw", [dict(state_dtype="int8", min_8bit_size=0),
                                dict(state_dtype="bfloat16"),
                                dict(state_dtype="int8", min_8bit_size=0, master_weights=True,
                                     bf16=True),
                                dict(param_rounding="stochastic", seed=3, bf16=True),
                                # 700 elements: float32 states; 768: 8-bit
                                dict(state_dtype="int8", min_8bit_size=701),
                                dict(state_dtype="int8", min_8bit_size=701, master_weights=True,
                                     bf16=True),
                                dict(state_dtype="int8")])  # both float32 states
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
    opt = Adam([a, b, c], lr=1e-2, state_dtype="int8", min_8bit_size=0, block_size=64,
               master_weights=True)
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


# ---- min_8bit_size: small tensors keep float32 states -------------------------------------------
def _formats(opt):
    first = opt.slot_names[0]
    return ["int8" if isinstance(opt.state(i)[first], QuantizedState)
            else str(np.asarray(opt.state(i)[first]).dtype) for i in range(len(opt.params))]


@pytest.mark.parametrize("kind, cls, hyper", CASES)
def test_small_parameters_step_as_the_float32_optimizer_bit_for_bit(kind, cls, hyper):
    rng = np.random.default_rng(20)
    shapes = [(64, 128), (100,), (10, 30), (4096,), (4095,)]  # 8192, 100, 300, 4096, 4095
    x0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(5)]
    xs = [a.copy() for a in x0]
    opt = cls(xs, state_dtype="int8", **hyper)  # min_8bit_size=4096 by default
    assert _formats(opt) == ["int8", "float32", "float32", "int8", "float32"]
    small = [x0[i].copy() for i in (1, 2, 4)]
    f32 = cls(small, **hyper)  # a float32 optimizer of the small ones only
    big = [x0[i].copy() for i in (0, 3)]
    q8 = cls(big, state_dtype="int8", min_8bit_size=0, **hyper)  # the big ones, all 8-bit
    for g in grads:
        assert opt.step([a.copy() for a in g])
        f32.step([g[i].copy() for i in (1, 2, 4)])
        q8.step([g[i].copy() for i in (0, 3)])
    assert raw([xs[i] for i in (1, 2, 4)]) == raw(small)
    assert raw([opt.state(i) for i in (1, 2, 4)]) == raw([f32.state(i) for i in range(3)])
    assert raw([xs[i] for i in (0, 3)]) == raw(big)  # the 8-bit call is unchanged by the split
    assert raw([opt.state(i) for i in (0, 3)]) == raw([q8.state(i) for i in range(2)])


def test_min_8bit_size_zero_puts_every_tensor_in_8_bits_and_bfloat16_is_unaffected():
    xs = [np.ones(10, np.float32), np.ones(5000, np.float32)]
    assert _formats(Adam(xs, state_dtype="int8", min_8bit_size=0)) == ["int8", "int8"]
    assert _formats(Adam(xs, state_dtype="int8", min_8bit_size=5001)) == ["float32", "float32"]
    assert _formats(Adam(xs, state_dtype="bfloat16")) == ["bfloat16", "bfloat16"]
    assert _formats(Adam(xs, state_dtype="bfloat16", min_8bit_size=10 ** 6)) == ["bfloat16"] * 2


def test_state_bytes_count_each_parameter_in_its_format():
    xs = [np.ones((32, 256), np.float32), np.ones(100, np.float32), np.ones(3000, np.float32)]
    opt = Adam(xs, state_dtype="int8")
    # m and v: 8192 one-byte codes and 32 float32 scales each; 3100 float32 elements each
    want = 2 * (8192 + 4 * 32) + 2 * 4 * 3100
    assert opt.state_bytes() == want
    assert opt.state_bytes_per_param() == want / (8192 + 3100)


def test_small_bfloat16_parameters_with_int8_take_float32_states():
    rng = np.random.default_rng(21)
    x0 = rng.standard_normal(300).astype(BF16)
    grads = [rng.standard_normal(300).astype(np.float32) for _ in range(4)]
    runs = []
    for kw in (dict(state_dtype="int8"), dict(state_dtype="float32")):
        x = x0.copy()
        opt = Adam([x], lr=0.01, master_weights=True, **kw)
        for g in grads:
            opt.step([g.copy()])
        runs.append(raw(x, opt.state(0), opt._master_list[0]))
        assert _formats(opt) == ["float32"]
    assert runs[0] == runs[1]


def test_a_mixed_step_is_all_or_nothing():
    rng = np.random.default_rng(22)
    xs = [rng.standard_normal(5000).astype(np.float32), rng.standard_normal(50).astype(np.float32)]
    opt = Adam(xs, lr=0.01, state_dtype="int8")
    grads = [rng.standard_normal(5000).astype(np.float32),
             rng.standard_normal(50).astype(np.float32)]
    assert opt.step(grads)
    before = raw(xs, [opt.state(i) for i in range(2)])
    for bad in (0, 1):
        g = [a.copy() for a in grads]
        g[bad][7] = np.nan
        assert opt.step(g, skip_nonfinite=True) is False
        assert raw(xs, [opt.state(i) for i in range(2)]) == before and opt.t == 1


def test_a_small_table_with_float32_states_takes_sparse_rows_of_any_length():
    # 100 x 20: rows are not whole blocks of 64, which only 8-bit states need
    rng = np.random.default_rng(23)
    t0 = rng.standard_normal((100, 20)).astype(np.float32)
    a, b = t0.copy(), t0.copy()
    opt = Adam([a], lr=0.1, state_dtype="int8", block_size=64)
    ref = Adam([b], lr=0.1)
    for _ in range(3):
        g = fastadam.IndexedSlices(rng.standard_normal((3, 20)).astype(np.float32),
                                   rng.integers(0, 100, 3), (100, 20))
        opt.step([g])
        ref.step([g])
    assert raw(a, opt.state(0)) == raw(b, ref.state(0))


@pytest.mark.parametrize("value, exc, match", [
    (-1, ValueError, r"^min_8bit_size: expected an int >= 0 .* got -1$"),
    (1.5, TypeError, r"^min_8bit_size: expected an int >= 0 .* got float$"),
    ("4096", TypeError, r"^min_8bit_size: expected an int >= 0 .* got str$"),
    (True, TypeError, r"^min_8bit_size: expected an int >= 0 .* got bool$"),
    (None, TypeError, r"^min_8bit_size: expected an int >= 0 .* got NoneType$"),
])
@pytest.mark.parametrize("cls", [Adam, AdamW, Adagrad, SGD, RMSprop, Lion])
def test_bad_min_8bit_size_is_refused_and_changes_nothing(cls, value, exc, match):
    x = np.linspace(-1, 1, 64).astype(np.float32)
    before = raw(x)
    with pytest.raises(exc, match=match):
        cls([x], state_dtype="int8", min_8bit_size=value)
    assert raw(x) == before


# ---- min_8bit_size in checkpoints ---------------------------------------------------------------
def _mixed(min_8bit_size=1000, **kw):
    rng = np.random.default_rng(24)
    xs = [rng.standard_normal((4, 256)).astype(np.float32),
          np.linspace(-1, 1, 300, dtype=np.float32)]
    opt = Adam(xs, lr=0.01, state_dtype="int8", min_8bit_size=min_8bit_size, **kw)
    for _ in range(2):
        opt.step([rng.standard_normal(x.shape).astype(np.float32) for x in xs])
    return xs, opt


def _as_before_min_8bit_size(state):
    """A state dict as the code before min_8bit_size wrote it: no per-parameter formats."""
    state = dict(state)
    state["state_format"] = {k: v for k, v in state["state_format"].items()
                             if k not in ("min_8bit_size", "param_states")}
    return state


def _rewrite_meta(path, edit):
    import json
    import zipfile
    with zipfile.ZipFile(path) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    meta_path = path.with_name("meta.npy")
    meta_path.write_bytes(entries["meta.npy"])
    meta = edit(json.loads(np.load(meta_path).tobytes().decode()))
    np.save(meta_path, np.frombuffer(json.dumps(meta).encode(), np.uint8))
    entries["meta.npy"] = meta_path.read_bytes()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)


def test_checkpoint_records_each_parameters_state_format(tmp_path):
    xs, opt = _mixed()
    fmt = opt.state_dict()["state_format"]
    assert fmt["min_8bit_size"] == 1000 and fmt["param_states"] == ["int8", "float32"]
    assert opt.state_dict()["m_scales"][1].size == 0  # float32 states have no scales
    # a different min_8bit_size that makes the same decisions loads (the formats decide)
    xs2, other = _mixed(min_8bit_size=301)
    other.load_state_dict(opt.state_dict())
    assert raw([other.state(i) for i in range(2)]) == raw([opt.state(i) for i in range(2)])


@pytest.mark.parametrize("via", ["state_dict", "file"])
def test_a_checkpoint_of_other_formats_is_refused_and_changes_nothing(tmp_path, via):
    xs, saved = _mixed(min_8bit_size=1000)  # int8, float32
    xs2, opt = _mixed(min_8bit_size=0)  # int8, int8
    xs2[1] += 1  # differs from the saved parameter
    before = raw(xs2, [opt.state(i) for i in range(2)])
    match = (r"\['state_format'\]\['param_states'\]\[1\]: the state was saved with "
             r"min_8bit_size=1000 and holds float32 states for params\[1\] \(300 elements\); "
             r"this optimizer \(min_8bit_size=0\) keeps int8 states for it")
    with pytest.raises(ValueError, match=match):
        if via == "file":
            saved.save(tmp_path / "c.zip")
            opt.load(tmp_path / "c.zip")
        else:
            opt.load_state_dict(saved.state_dict())
    assert raw(xs2, [opt.state(i) for i in range(2)]) == before and opt.t == 2


@pytest.mark.parametrize("edit, exc, match", [
    (lambda f: f.pop("param_states"), ValueError,
     r"\['state_format'\]: \['min_8bit_size', 'param_states'\] come together"),
    (lambda f: f.update(param_states=["int8"]), ValueError,
     r"\['param_states'\]: expected 2 state formats \(one per parameter\), got 1"),
    (lambda f: f.update(param_states=["int8", "bfloat16"]), ValueError,
     r"\['param_states'\]\[1\]: expected one of \['float32', 'int8'\] .* got 'bfloat16'"),
    (lambda f: f.update(min_8bit_size=-3), ValueError,
     r"\['state_format'\]\['min_8bit_size'\]: expected an int >= 0"),
])
def test_bad_per_parameter_formats_are_refused(edit, exc, match):
    xs, opt = _mixed()
    state = opt.state_dict()
    state["state_format"] = dict(state["state_format"])
    edit(state["state_format"])
    xs2, other = _mixed(min_8bit_size=1000)
    xs2[0] += 1
    before = raw(xs2, [other.state(i) for i in range(2)])
    with pytest.raises(exc, match=match):
        other.load_state_dict(state)
    assert raw(xs2, [other.state(i) for i in range(2)]) == before


@pytest.mark.parametrize("via", ["state_dict", "file"])
def test_checkpoints_from_before_min_8bit_size_load_as_all_8_bit(tmp_path, via):
    # the code before min_8bit_size put every tensor in 8 bits and wrote no per-parameter
    # formats: such a state is min_8bit_size=0's, minus the two keys
    rng = np.random.default_rng(25)
    grads = [[rng.standard_normal((4, 256)).astype(np.float32),
              rng.standard_normal(300).astype(np.float32)] for _ in range(3)]
    xs, old = _mixed(min_8bit_size=0)
    if via == "file":
        old.save(tmp_path / "c.zip")
        _rewrite_meta(tmp_path / "c.zip", _as_before_min_8bit_size)

        def load(o):
            o.load(tmp_path / "c.zip")
    else:
        state = _as_before_min_8bit_size(old.state_dict())

        def load(o):
            o.load_state_dict(state)
    xs2, new = _mixed(min_8bit_size=0)
    xs2[0] += 1
    load(new)
    if via == "state_dict":
        for a, b in zip(xs2, xs):
            a[...] = b
    for g in grads:
        old.step([a.copy() for a in g])
        new.step([a.copy() for a in g])
    assert raw(xs2, [new.state(i) for i in range(2)]) == raw(xs, [old.state(i) for i in range(2)])
    # into the default rule, the 300-element parameter would need float32 states: refused
    xs3, default = _mixed(min_8bit_size=4096)
    before = raw(xs3, [default.state(i) for i in range(2)])
    with pytest.raises(ValueError, match=r"\['param_states'\]\[0\]: the state was saved before "
                                         r"min_8bit_size existed .* int8 states for params\[0\] "
                                         r".* keeps float32 states for it: build it with the "
                                         r"min_8bit_size the state was saved with \(0\)"):
        load(default)
    assert raw(xs3, [default.state(i) for i in range(2)]) == before


def test_pickles_from_before_min_8bit_size_keep_every_tensor_in_8_bits():
    opt = Adam([np.ones(100, np.float32)], state_dtype="int8", min_8bit_size=0)
    del opt._lowp_options.__dict__["min_8bit_size"]  # the options as pickled before the rule
    back = pickle.loads(pickle.dumps(opt))
    back.add_param_group({"params": [np.ones(50, np.float32)]})
    assert _formats(back) == ["int8", "int8"]
    assert back.state_dict()["state_format"]["min_8bit_size"] == 0


# ---- the objects' low-precision buckets step through their plans ---------------------------
@pytest.mark.parametrize("cls, kw", [
    (Adam, dict(lr=1e-3)),                         # step number t + 1
    (Adagrad, dict(lr=0.05, convention="torch")),
    (Adagrad, dict(lr=0.05, convention="onnx")),   # ONNX's T counts from 0: the key does not
])
def test_stochastic_rounding_keys_count_the_objects_steps(cls, kw):
    """Each step's stochastic rounding draws its bits from (seed, the object's step count,
    tensor, element), whichever path takes the step: checked step by step against a float32
    twin followed by the spec's rounding."""
    rng = np.random.default_rng(11)
    xb = rng.standard_normal(3000).astype(np.float32).astype(BF16)
    x32 = xb.astype(np.float32)
    opt = cls([xb], param_rounding="stochastic", seed=3, **kw)
    twin = cls([x32], **kw)  # float32 x and states (the object's states are float32 too)
    for t in range(1, 6):
        g = rng.standard_normal(3000).astype(np.float32).astype(BF16)  # the parameters' dtype
        x32[...] = xb.astype(np.float32)
        assert opt.step([g]) and twin.step([g.astype(np.float32)])
        np.testing.assert_array_equal(xb.astype(np.float32), O.stochastic_bf16(x32, 3, t, 0),
                                      err_msg=f"step {t}")
    assert opt._common is not None  # every step took the one-plan case


@pytest.mark.parametrize("state_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("master_weights", [False, True])
def test_compiled_low_precision_steps_equal_the_python_steps(state_dtype, master_weights):
    """The one-plan step and the general step give the same bits: one optimizer steps with
    plain gradients, its twin with ``grad_scale=1.0`` (the general path)."""
    rng = np.random.default_rng(12)
    dtype = BF16 if master_weights else np.float32
    x0 = rng.standard_normal((4, 512)).astype(np.float32).astype(dtype)
    a, b = x0.copy(), x0.copy()
    kw = dict(lr=1e-2, state_dtype=state_dtype, master_weights=master_weights,
              min_8bit_size=0)
    oa, ob = Adam([a], **kw), Adam([b], **kw)
    for _ in range(5):
        g = rng.standard_normal(x0.shape).astype(np.float32).astype(dtype)
        assert oa.step([g]) and ob.step((g,), grad_scale=1.0)
    assert oa._common is not None
    assert raw(a) == raw(b)
    for name in ("m", "v"):
        np.testing.assert_array_equal(values(oa.state(0)[name]), values(ob.state(0)[name]))


def test_compiled_low_precision_step_checks_its_gradients():
    """A gradient the one-plan step cannot take (another dtype, a view, one aliasing a state)
    goes to the general step, which converts or refuses it before any write."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal(2048).astype(np.float32)
    opt = Adam([x], lr=1e-2, state_dtype="bfloat16")
    opt.step([rng.standard_normal(2048).astype(np.float32)])
    assert opt._common is not None
    before = (x.copy(), values(opt.state(0)["m"]).copy(), opt.t)
    with pytest.raises((TypeError, ValueError)):
        opt.step([np.ones(2048)])  # float64
    with pytest.raises(ValueError, match="overlap|share"):
        opt.step([x])  # the parameter itself
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(values(opt.state(0)["m"]), before[1])
    assert opt.t == before[2]
    g = np.ones(4096, np.float32)[::2]  # not contiguous: the Python step copies it
    assert opt.step([g]) and opt.t == before[2] + 1


@pytest.mark.parametrize("state_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_parameter_stepped_alone_equals_its_prepared_bucket(state_dtype, rounding):
    """Stepping some of a bucket's parameters runs a plan of those parameters; a bucket of
    that parameter alone runs its own plan: the same bits, stochastic rounding included."""
    rng = np.random.default_rng(14)
    dtype = BF16 if rounding == "stochastic" else np.float32
    x0 = rng.standard_normal(1024).astype(np.float32).astype(dtype)
    other = rng.standard_normal(1024).astype(np.float32).astype(dtype)
    kw = dict(lr=1e-2, state_dtype=state_dtype, min_8bit_size=0, param_rounding=rounding,
              seed=5)
    a, b = x0.copy(), x0.copy()
    pair, alone = Adam([a, other.copy()], **kw), Adam([b], **kw)
    for _ in range(4):
        g = rng.standard_normal(1024).astype(np.float32).astype(dtype)
        assert pair.step([g, None]) and alone.step([g])
    assert alone._plans[0].driver[1:] != ("float", "float")  # the low-precision driver
    assert raw(a) == raw(b)
    for name in ("m", "v"):
        np.testing.assert_array_equal(values(pair.state(0)[name]), values(alone.state(0)[name]))
