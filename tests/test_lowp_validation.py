"""Bad input to low-precision steps (issue 24): each raises a clear error naming the argument,
before anything is written (every array's bytes compared before and after).

Covers ``prepare_step`` with bfloat16 arrays, QuantizedState slots and masters, the optimizer
objects' ``state_dtype`` options, sparse rows that are not whole blocks, and checkpoints of
another format; plus ``OptimizerSpec.nonnegative_slots`` against the optimizers' own updates.
"""
import sys

import numpy as np
import pytest

import fastadam
from fastadam.optim import Adam, Adagrad, QuantizedState, prepare_step, optimizer_spec

import lowp_reference as R

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
pytest.importorskip("fastadam._core._lowp", reason="the low-precision driver is not built")


snapshot = R.array_bytes


def q8_slots(shape, block=256):
    return {"m": QuantizedState.zeros(shape, block), "v": QuantizedState.zeros(shape, block,
                                                                                 signed=False)}


# ---- the registry's nonnegative slots ------------------------------------------------------------
@pytest.mark.parametrize("name, hyper, slots", [
    ("adam", dict(lr=0.1, amsgrad=True), ("m", "v", "v_max")),
    ("adagrad", dict(lr=0.1), ("h",)),
    ("momentum", dict(lr=0.1, momentum=0.9), ("v",)),
    ("rmsprop", dict(lr=0.01, momentum=0.9, centered=True),
     ("square_avg", "momentum_buffer", "grad_avg")),
    ("lion", dict(lr=0.01), ("m",)),
])
def test_nonnegative_slots_are_those_that_never_go_negative(name, hyper, slots):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200)
    state = {s: np.zeros(200) for s in slots}
    step = prepare_step(name, x, state)
    low = {s: 0.0 for s in slots}
    for t in range(1, 8):
        step.step(rng.standard_normal(200) * 3, t, **hyper)
        for s in slots:
            low[s] = min(low[s], state[s].min())
    spec = optimizer_spec(name)
    assert {s for s in slots if low[s] >= 0} == set(spec.nonnegative_slots) & set(slots)


# ---- prepare_step --------------------------------------------------------------------------------
def test_a_bfloat16_m_with_a_float64_x():
    x = np.ones(8)
    m, v = np.zeros(8, BF16), np.zeros(8, BF16)
    before = snapshot(x, m, v)
    with pytest.raises(TypeError, match=r"^params: expected float32 or bfloat16, got float64 "
                                        r"\(m is bfloat16"):
        prepare_step("adam", x, {"m": m, "v": v})
    assert snapshot(x, m, v) == before


def test_states_in_two_formats():
    x = np.ones(8, np.float32)
    with pytest.raises(TypeError, match=r"^v: expected bfloat16 like m \(every state of a step "
                                        r"in one format\), got float32"):
        prepare_step("adam", x, {"m": np.zeros(8, BF16), "v": np.zeros(8, np.float32)})


def test_a_scale_array_of_the_wrong_length():
    # a QuantizedState's arrays are fixed when it is built, and built consistent
    with pytest.raises(ValueError, match=r"^scales: expected 5 scales \(ceil\(1200 / "
                                         r"block_size 256\)\), got 4"):
        QuantizedState(np.zeros((4, 300), np.uint8), np.zeros(4, np.float32))
    slots = q8_slots((4, 300))
    with pytest.raises(AttributeError, match=r"^scales: a QuantizedState's arrays and options "
                                             r"are fixed"):
        slots["m"].scales = np.zeros(4, np.float32)


def test_codes_of_the_wrong_dtype_or_shape():
    x = np.ones((4, 256), np.float32)
    slots = q8_slots(x.shape)
    slots["v"].codes.dtype = np.int8  # in place: the state still holds this array
    with pytest.raises(TypeError, match=r"^v.codes: expected a uint8 numpy.ndarray, got int8"):
        prepare_step("adam", x, slots)
    slots = q8_slots((256, 4))
    with pytest.raises(ValueError, match=r"^m.codes: expected shape \(4, 256\), got \(256, 4\)"):
        prepare_step("adam", x, slots)


def test_a_state_of_another_block_size_map_or_sign():
    x = np.ones(512, np.float32)
    slots = q8_slots(x.shape, block=128)
    with pytest.raises(ValueError, match=r"^m: its block_size is 128, the step's block_size is "
                                         r"256"):
        prepare_step("adam", x, slots)
    prepare_step("adam", x, slots, block_size=128)  # the same states, told their block
    with pytest.raises(ValueError, match=r"^m: its quant_map is 'dynamic', the step's "
                                         r"quant_map is 'linear'"):
        prepare_step("adam", x, q8_slots(x.shape), quant_map="linear")
    bad = {"m": QuantizedState.zeros(512), "v": QuantizedState.zeros(512)}
    with pytest.raises(ValueError, match=r"^v: expected signed=False \(it never goes negative"):
        prepare_step("adam", x, bad)


def test_master_checks():
    x = np.ones(8, BF16)
    slots = {"m": np.zeros(8, BF16), "v": np.zeros(8, BF16)}
    with pytest.raises(ValueError, match=r"^master: expected shape \(8,\), got \(4, 2\)"):
        prepare_step("adam", x, slots, master=np.ones((4, 2), np.float32))
    with pytest.raises(TypeError, match=r"^master: expected a float32 numpy.ndarray, got "
                                        r"bfloat16"):
        prepare_step("adam", x, slots, master=np.ones(8, BF16))
    with pytest.raises(ValueError, match=r"^master: a float32 master copy is for bfloat16 "
                                         r"params; params are float32"):
        prepare_step("adam", np.ones(8, np.float32), slots, master=np.ones(8, np.float32))
    with pytest.raises(ValueError, match=r"^param_rounding: with a float32 master"):
        prepare_step("adam", x, slots, master=np.ones(8, np.float32),
                     param_rounding="stochastic")


def test_stochastic_rounding_of_float32_params():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match=r"^param_rounding: stochastic rounding is for bfloat16 "
                                         r"params; params are float32"):
        prepare_step("adam", x, {"m": np.zeros(8, BF16), "v": np.zeros(8, BF16)},
                     param_rounding="stochastic")
    with pytest.raises(ValueError, match=r"^param_rounding: stochastic rounding is for bfloat16"):
        prepare_step("adam", x, {"m": np.zeros(8, np.float32), "v": np.zeros(8, np.float32)},
                     param_rounding="stochastic")


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(block_size=7), ValueError, r"^block_size: expected an int in \[8, 4096\], got 7"),
    (dict(block_size=8192), ValueError, r"^block_size: expected an int in \[8, 4096\]"),
    (dict(block_size=256.0), TypeError, r"^block_size: expected an int"),
    (dict(quant_map="log"), ValueError, r"^quant_map: expected one of \('dynamic', 'linear'\)"),
    (dict(param_rounding="up"), ValueError, r"^param_rounding: expected one of"),
    (dict(seed=-1), ValueError, r"^seed: expected an int in \[0, 2\*\*64\), got -1"),
    (dict(seed=1.5), TypeError, r"^seed: expected an int"),
])
def test_bad_options(kwargs, exc, message):
    x = np.ones(512, np.float32)
    with pytest.raises(exc, match=message):
        prepare_step("adam", x, q8_slots(x.shape), **kwargs)
    with pytest.raises(exc, match=message):  # the float32 path checks them too
        prepare_step("adam", x, {"m": np.zeros(512, np.float32), "v": np.zeros(512, np.float32)},
                     **kwargs)


def test_bad_gradients_change_nothing():
    x = np.ones((2, 256), np.float32)
    slots = q8_slots(x.shape)
    step = prepare_step("adam", x, slots)
    before = snapshot(x, slots)
    with pytest.raises(TypeError, match=r"^grads: expected float32 or bfloat16, got float64"):
        step.step(np.ones((2, 256)), 1)
    with pytest.raises(ValueError, match=r"^grads: expected shape \(2, 256\), got \(256, 2\)"):
        step.step(np.ones((256, 2), np.float32), 1)
    with pytest.raises(ValueError, match=r"share memory|overlap"):
        step.step(x, 1)
    with pytest.raises(ValueError, match=r"^beta1: expected 0 <= beta1 < 1"):
        step.step(np.ones((2, 256), np.float32), 1, beta1=1.5)
    xs = [np.ones(8, np.float32), np.ones(8, np.float32)]
    s2 = {"m": [np.zeros(8, BF16)] * 0 + [np.zeros(8, BF16), np.zeros(8, BF16)],
          "v": [np.zeros(8, BF16), np.zeros(8, BF16)]}
    step2 = prepare_step("adam", xs, s2)
    before2 = snapshot(xs, s2)
    with pytest.raises(TypeError, match=r"^grads\[1\]: expected float32 like grads\[0\] \(one "
                                        r"gradient dtype per step\), got bfloat16"):
        step2.step([np.ones(8, np.float32), np.ones(8, BF16)], 1)
    assert snapshot(x, slots) == before and snapshot(xs, s2) == before2


def test_quantized_state_constructor_checks():
    codes, scales = np.zeros(300, np.uint8), np.zeros(2, np.float32)
    QuantizedState(codes, scales)
    with pytest.raises(ValueError, match=r"^scales: expected 2 scales \(ceil\(300 / block_size "
                                         r"256\)\), got 3"):
        QuantizedState(codes, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match=r"^codes: expected a numpy.ndarray of uint8, got int8"):
        QuantizedState(codes.view(np.int8), scales)
    with pytest.raises(TypeError, match=r"^scales: expected a numpy.ndarray of float32"):
        QuantizedState(codes, np.zeros(2))
    with pytest.raises(ValueError, match=r"^block_size: expected an int in \[8, 4096\], got 4"):
        QuantizedState(codes, scales, block_size=4)
    with pytest.raises(ValueError, match=r"^a: an unsigned \(signed=False\) state holds values "
                                         r">= 0 only"):
        QuantizedState.from_array(-np.ones(4), signed=False)


def test_without_ml_dtypes_only_bfloat16_users_are_told(monkeypatch):
    from fastadam._core._lowp_state import bfloat16
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    with pytest.raises(ImportError, match=r"install ml_dtypes \(pip install "
                                          r"'ml_dtypes>=0.3'"):
        bfloat16()
    with pytest.raises(ImportError, match=r"ml_dtypes"):
        Adam([np.ones(8, np.float32)], state_dtype="bfloat16")
    # 8-bit states do not need it
    opt = Adam([np.ones(256, np.float32)], state_dtype="int8", min_8bit_size=0)
    opt.step([np.ones(256, np.float32)])


# ---- optimizer objects ---------------------------------------------------------------------------
def test_objects_refuse_float64_params_and_bad_options():
    with pytest.raises(TypeError, match=r"^params\[0\]: state_dtype='int8' \(and bfloat16 "
                                        r"parameters\) need float32 or bfloat16 parameters, got "
                                        r"float64"):
        Adam([np.ones(8)], state_dtype="int8", min_8bit_size=0)
    with pytest.raises(ValueError, match=r"^state_dtype: expected one of \('float32', "
                                         r"'bfloat16', 'int8'\), got 'int4'"):
        Adam([np.ones(8, np.float32)], state_dtype="int4")
    with pytest.raises(ValueError, match=r"^param_rounding: stochastic rounding is for bfloat16 "
                                         r"parameters"):
        Adam([np.ones(8, np.float32)], param_rounding="stochastic")
    with pytest.raises(ValueError, match=r"^param_rounding: with master_weights=True"):
        Adam([np.ones(8, BF16)], master_weights=True, param_rounding="stochastic")
    opt = Adam([np.ones(8, np.float32)])
    with pytest.raises(TypeError, match=r"^param_group: bfloat16 parameters join an optimizer "
                                        r"built with"):
        opt.add_param_group({"params": [np.ones(8, BF16)]})


def test_a_block_size_that_does_not_divide_a_sparse_row_changes_nothing():
    x = np.ones((10, 100), np.float32)
    dense = np.ones(300, np.float32)
    opt = Adam([dense, x], lr=0.1, state_dtype="int8", min_8bit_size=0)
    opt.step([np.ones(300, np.float32), None])
    before = snapshot(dense, x, [opt.state(i) for i in range(2)])
    grad = fastadam.IndexedSlices(np.ones((2, 100), np.float32), np.array([1, 3]), (10, 100))
    with pytest.raises(ValueError, match=r"^block_size: 256 does not divide the row length "
                                         r"D=100 of params\[1\] .*block sizes that divide 100: "
                                         r"\[100, 50, 25\]"):
        opt.step([np.ones(300, np.float32), grad])
    assert snapshot(dense, x, [opt.state(i) for i in range(2)]) == before
    assert opt.t == 1


def test_dense_sparse_mode_is_refused_with_low_precision_states():
    x = np.ones((4, 256), np.float32)
    opt = Adagrad([x], state_dtype="bfloat16", sparse_mode="dense")
    before = snapshot(x, opt.state(0))
    grad = fastadam.IndexedSlices(np.ones((1, 256), np.float32), np.array([2]), (4, 256))
    with pytest.raises(ValueError, match=r"^sparse_mode: low-precision states step sparse "
                                         r"gradients lazily only"):
        opt.step([grad])
    assert snapshot(x, opt.state(0)) == before


def test_bfloat16_params_take_float32_gradients_but_not_float64():
    x = np.ones(16, BF16)
    opt = Adam([x], lr=0.1, state_dtype="bfloat16")
    before = snapshot(x, opt.state(0))
    with pytest.raises(TypeError, match=r"^grads\[0\]: expected dtype bfloat16 or float32 \(the "
                                        r"dtype of params\[0\]\), got float64"):
        opt.step([np.ones(16)])
    assert snapshot(x, opt.state(0)) == before
    opt.step([np.ones(16, np.float32)])
    assert snapshot(x) != before[:1]


# ---- checkpoints ---------------------------------------------------------------------------------
def _trained(state_dtype="int8", min_8bit_size=0, **kw):
    x = np.linspace(-1, 1, 600, dtype=np.float32)
    opt = Adam([x], lr=0.01, state_dtype=state_dtype, min_8bit_size=0, **kw)
    opt.step([np.cos(np.arange(600, dtype=np.float32))])
    return x, opt


@pytest.mark.parametrize("other, message", [
    (dict(state_dtype="bfloat16"), r"\['state_format'\]\['state_dtype'\]: the state was saved "
                                   r"with state_dtype='int8', this optimizer has "
                                   r"state_dtype='bfloat16'"),
    (dict(block_size=128), r"\['state_format'\]\['block_size'\]: the state was saved with "
                           r"block_size=256, this optimizer has block_size=128"),
    (dict(quant_map="linear"), r"\['state_format'\]\['quant_map'\]"),
    (dict(state_dtype="float32"), r"\['state_format'\]: the state holds 'int8' optimizer "
                                  r"states; this optimizer keeps float32 states"),
])
def test_load_refuses_another_format(tmp_path, other, message):
    _, saved = _trained()
    state = saved.state_dict()
    saved.save(tmp_path / "c.zip")
    x, opt = _trained(**{"state_dtype": "int8", **other})
    before = snapshot(x, opt.state(0))
    with pytest.raises(ValueError, match=r"^state" + message):
        opt.load_state_dict(state)
    with pytest.raises(ValueError, match=r"^meta" + message):
        opt.load(tmp_path / "c.zip")
    assert snapshot(x, opt.state(0)) == before and opt.t == 1


def test_load_refuses_float32_state_into_8bit_and_scales_of_the_wrong_length():
    _, f32 = _trained("float32")
    x, opt = _trained()
    before = snapshot(x, opt.state(0))
    with pytest.raises(ValueError, match=r"^state: the state has no 'state_format' \(an "
                                         r"optimizer with float32 states and parameters\); this "
                                         r"optimizer has \{'state_dtype': 'int8'"):
        opt.load_state_dict(f32.state_dict())
    state = opt.state_dict()
    state["m_scales"] = [state["m_scales"][0][:-1]]
    with pytest.raises(ValueError, match=r"^state\['m_scales'\]\[0\]: expected float32 of shape "
                                         r"\(3,\), got float32 of shape \(2,\)"):
        opt.load_state_dict(state)
    state = opt.state_dict()
    state["v"] = [state["v"][0].astype(np.int8)]
    with pytest.raises(ValueError, match=r"^state\['v'\]\[0\]: expected uint8 of shape \(600,\)"):
        opt.load_state_dict(state)
    assert snapshot(x, opt.state(0)) == before


# ---- the GPU path: prepare_step hands CuPy arrays to fastadam.gpu.lowp_dense_step ---------------
class DeviceArray:
    """A stand-in for a CuPy array (what fastadam.gpu recognises: __cuda_array_interface__)."""
    __cuda_array_interface__ = {}

    def __init__(self, a):
        self.a, self.dtype, self.shape, self.ndim = a, a.dtype, a.shape, a.ndim
        self.size, self.nbytes = a.size, a.nbytes


def test_prepare_step_routes_low_precision_device_arrays_to_the_gpu_driver(monkeypatch):
    import fastadam.gpu
    calls = []
    monkeypatch.setattr(fastadam.gpu, "lowp_dense_step",
                        lambda *args: calls.append(args) or True, raising=False)
    x = DeviceArray(np.ones(512, np.uint16))  # bfloat16 bits: CuPy has no bfloat16
    m = QuantizedState(DeviceArray(np.zeros(512, np.uint8)),
                       DeviceArray(np.zeros(2, np.float32)))
    v = QuantizedState(DeviceArray(np.zeros(512, np.uint8)),
                       DeviceArray(np.zeros(2, np.float32)), signed=False)
    master = DeviceArray(np.ones(512, np.float32))
    step = prepare_step("adam", x, {"m": m, "v": v}, master=master, seed=5)
    g = DeviceArray(np.ones(512, np.float32))
    assert step.step(g, 3, lr=0.1) is True
    (coeffs, xs, gs, slots, scales, masters, param_fmt, grad_fmt, state_fmt, block, qmap, signed,
     rounding, seed, t, skip, _), = calls
    assert (xs, gs, masters) == ([x], [g], [master])
    assert slots == [[m.codes], [v.codes]] and scales == [[m.scales], [v.scales]]
    assert (param_fmt, grad_fmt, state_fmt, block, qmap, signed, rounding, seed, t, skip) == (
        1, 0, 2, 256, 0, (True, False), 0, 5, 3, False)
    bad = QuantizedState(DeviceArray(np.zeros(512, np.uint8)),
                         DeviceArray(np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match=r"^v: its block_size, quant_map or signed"):
        prepare_step("adam", x, {"m": m, "v": bad})


def test_sparse_values_of_a_bfloat16_table_are_float32():
    x = np.ones((4, 64), BF16)
    opt = Adam([x], state_dtype="bfloat16")
    before = snapshot(x, opt.state(0))
    with pytest.raises(TypeError, match=r"^grads\[0\]: expected values of dtype float32 "
                                        r"\(params\[0\] is bfloat16\), got float64"):
        opt.step(fastadam.IndexedSlices(np.ones((1, 64)), np.array([1]), (4, 64)))
    assert snapshot(x, opt.state(0)) == before
