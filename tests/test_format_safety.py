"""Memory safety on the format axis and no NaN from finite input (issue 38, items 6 and 7).

Each finding of the issue has its scenario here (the reproducers the issue names, as tests):

- a parameter or state whose dtype is narrowed in place after a step was prepared (same buffer,
  twice the elements) is refused, by the optimizer objects (their compiled kept step included)
  and by ``prepare_step``, before anything is written;
- low-precision steps refuse parameters, states, 8-bit codes and scales and masters made
  read-only after the first step, before any write; a QuantizedState's arrays cannot be
  replaced under a prepared step;
- a low-precision step with an explicit ``num_threads``, stepped in a parent and then in a
  forked child, runs single-threaded in the child (the same bits) instead of hanging;
- one finite gradient element whose square overflows float32 leaves an 8-bit block finite;
- checkpoints with NaN, infinite or negative 8-bit scales, or non-finite (or negative, where the
  slot never is) bfloat16 and float32 states are refused at load, before anything is written;
- 1000 steps of a steady gradient keep every optimizer x state format finite (centered RMSprop
  with 8-bit states went NaN: the quantized v - a**2 went negative; now clamped at 0).

The references are written here from the definitions (float64), not read from the code under test.
"""
import mmap
import multiprocessing
import queue as queue_module
import warnings

import numpy as np
import pytest

import fastadam
from fastadam._core import _config
from fastadam.optim import QuantizedState, prepare_step

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
_lowp = pytest.importorskip("fastadam._core._lowp", reason="the low-precision driver is not built")

OPTIMIZERS = {
    "Adam": (fastadam.Adam, {}),
    "Adam-amsgrad": (fastadam.Adam, {"amsgrad": True}),
    "AdamW": (fastadam.AdamW, {}),
    "SGD-momentum": (fastadam.SGD, {"momentum": 0.9}),
    "SGD-nesterov": (fastadam.SGD, {"momentum": 0.9, "nesterov": True}),
    "Adagrad": (fastadam.Adagrad, {}),
    "RMSprop": (fastadam.RMSprop, {}),
    "RMSprop-centered": (fastadam.RMSprop, {"centered": True}),
    "RMSprop-centered-momentum": (fastadam.RMSprop, {"centered": True, "momentum": 0.9}),
    "RMSprop-centered-keras": (fastadam.RMSprop, {"centered": True, "convention": "keras"}),
    "Lion": (fastadam.Lion, {}),
}
FORMATS = ("float32", "bfloat16", "int8")
N = 4096


def build(name, x, state_dtype="float32", **extra):
    cls, kw = OPTIMIZERS[name]
    return cls([x] if isinstance(x, np.ndarray) else x, lr=1e-2, state_dtype=state_dtype,
               min_8bit_size=0, **kw, **extra)


def state_arrays(opt, i=0):
    """Every array of parameter i's state (8-bit: codes and scales), for snapshots."""
    out = []
    for s in opt.state(i).values():
        out += [s.codes, s.scales] if isinstance(s, QuantizedState) else [s]
    return out


def snapshot(arrays):
    return [np.array(a, copy=True).view(np.uint8) for a in arrays]


def same(before, arrays):
    return all(np.array_equal(b, np.array(a, copy=True).view(np.uint8))
               for b, a in zip(before, arrays))


# ---- 1. a dtype narrowed in place after a step was prepared --------------------------------------

@pytest.mark.parametrize("name", ["Adam", "SGD-momentum", "Adagrad", "RMSprop", "Lion"])
def test_objects_refuse_a_parameter_narrowed_in_place(name):
    """objects_dtype_narrowed.py: x.dtype = float16 on a float32 parameter after two steps (the
    second one through the compiled kept step) doubles its element count over the same bytes;
    the next step is refused and writes nothing (a canary after x stays zero)."""
    base = np.zeros(3 * N, np.float32)
    x = base[:N]
    opt = build(name, x)
    g = np.ones(N, np.float32)
    opt.step([g])
    opt.step([g])
    before = snapshot([base] + state_arrays(opt))
    x.dtype = np.float16
    with pytest.raises((TypeError, ValueError), match=r"params\[0\]|grads\[0\]|float16"):
        opt.step([g])
    assert same(before, [base] + state_arrays(opt))
    assert not base[N:].any()


@pytest.mark.parametrize("which", ["params", "m", "v"])
def test_prepared_step_refuses_an_array_narrowed_in_place(which):
    """prepared_dtype_narrowed.py, for the parameter and each state."""
    base = np.zeros(3 * N, np.float32)
    arrays = {"params": base[:N], "m": np.zeros(N, np.float32), "v": np.zeros(N, np.float32)}
    step = prepare_step("adam", arrays["params"], {"m": arrays["m"], "v": arrays["v"]})
    g = np.ones(N, np.float32)
    step.step(g, 1, lr=0.1)
    before = snapshot([base, arrays["m"], arrays["v"]])
    arrays[which].dtype = np.float16
    with pytest.raises(ValueError, match=rf"^{which}: its dtype changed from float32 to "
                                         rf"float16 since the step was prepared"):
        step.step(g, 2, lr=0.1)
    assert same(before, [base, arrays["m"], arrays["v"]])
    assert not base[N:].any()


def test_prepared_step_refuses_a_list_member_narrowed_in_place():
    xs = [np.zeros(64, np.float32), np.zeros(N, np.float32)]
    ms = [np.zeros_like(x) for x in xs]
    vs = [np.zeros_like(x) for x in xs]
    step = prepare_step("adam", xs, {"m": ms, "v": vs})
    gs = [np.ones_like(x) for x in xs]
    step.step(gs, 1, lr=0.1)
    vs[1].dtype = np.int16
    with pytest.raises(ValueError, match=r"^v\[1\]: its dtype changed from float32 to int16"):
        step.step(gs, 2, lr=0.1)


def test_prepared_step_refuses_strides_set_in_place():
    """x.strides set in place (same pointer, same count, no longer contiguous): the kernels
    read flat buffers, so the step is refused rather than updating other elements."""
    base = np.zeros(2 * N, np.float32)
    x = base[:N]
    m, v = np.zeros(N, np.float32), np.zeros(N, np.float32)
    step = prepare_step("adam", x, {"m": m, "v": v})
    g = np.ones(N, np.float32)
    step.step(g, 1, lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        x.strides = (8,)
    before = base.copy()
    with pytest.raises(ValueError, match=r"^params: is no longer a C-contiguous"):
        step.step(g, 2, lr=0.1)
    np.testing.assert_array_equal(base, before)


def test_a_reshape_in_place_still_steps():
    """x.shape set in place moves no byte: still the prepared arrays (the header check counts
    elements, not dimensions)."""
    x = np.zeros(N, np.float32)
    m, v = np.zeros(N, np.float32), np.zeros(N, np.float32)
    step = prepare_step("adam", x, {"m": m, "v": v})
    g = np.ones(N, np.float32)
    step.step(g, 1, lr=0.1)
    x.shape = (64, 64)
    assert step.step(g, 2, lr=0.1)


@pytest.mark.parametrize("target", ["params", "codes", "scales"])
def test_low_precision_prepared_step_refuses_a_dtype_changed_in_place(target):
    x = np.zeros(N, np.float32)
    m, v = QuantizedState.zeros(N), QuantizedState.zeros(N, signed=False)
    step = prepare_step("adam", x, {"m": m, "v": v})
    g = np.ones(N, np.float32)
    step.step(g, 1, lr=0.1)
    arrays = [x, m.codes, m.scales, v.codes, v.scales]
    before = snapshot(arrays)
    a = {"params": x, "codes": m.codes, "scales": m.scales}[target]
    a.dtype = {"params": np.float16, "codes": np.int8, "scales": np.int32}[target]
    with pytest.raises(ValueError, match=r"its dtype changed from"):
        step.step(g, 2, lr=0.1)
    assert same(before, arrays)


# ---- 2. read-only after the first step: low-precision steps -------------------------------------

def lowp_case(front, state_dtype, param_dtype):
    """(step(), arrays the step writes) of a low-precision step by the objects or prepare_step."""
    x = np.ones(8192, np.float32).astype(param_dtype)
    if front == "objects":
        opt = fastadam.Adam([x], lr=0.1, state_dtype=state_dtype, min_8bit_size=0)
        return (lambda: opt.step([np.ones(x.shape, param_dtype)])), [x] + state_arrays(opt)
    if state_dtype == "int8":
        m, v = QuantizedState.zeros(x.shape), QuantizedState.zeros(x.shape, signed=False)
        written = [x, m.codes, m.scales, v.codes, v.scales]
    else:
        m, v = np.zeros(x.shape, BF16), np.zeros(x.shape, BF16)
        written = [x, m, v]
    step = prepare_step("adam", x, {"m": m, "v": v})
    t = [0]

    def run():
        t[0] += 1
        return step.step(np.ones(x.shape, param_dtype), t[0], lr=0.1)
    return run, written


@pytest.mark.parametrize("front", ["objects", "prepared"])
@pytest.mark.parametrize("state_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("param_dtype", [np.float32, BF16], ids=["f32-params", "bf16-params"])
def test_low_precision_steps_refuse_arrays_made_read_only(front, state_dtype, param_dtype):
    """lowp_readonly_written.py, for every array the step writes: the parameter, each state
    (its codes and scales when 8-bit), made read-only after the first step (the second and
    third steps: the Python step, then the compiled kept one)."""
    run, written = lowp_case(front, state_dtype, param_dtype)
    run()
    run()
    for a in written:
        before = snapshot(written)
        a.flags.writeable = False
        with pytest.raises(ValueError, match=r"is read-only, but it is updated in place"):
            run()
        assert same(before, written)
        a.flags.writeable = True
    assert run()  # writable again: it steps


def test_objects_partial_low_precision_step_refuses_a_read_only_state():
    """The objects' low-precision step of some of a bucket's parameters (a None gradient: not
    the prepared step) names the parameter and the array."""
    xs = [np.ones(512, np.float32), np.ones(512, np.float32)]
    opt = fastadam.Adam(xs, lr=0.1, state_dtype="int8", min_8bit_size=0)
    opt.step([np.ones(512, np.float32)] * 2)
    opt.state(1)["v"].scales.flags.writeable = False
    before = snapshot(xs + state_arrays(opt, 0) + state_arrays(opt, 1))
    with pytest.raises(ValueError, match=r"^params\[1\] \(its v scales\): is read-only"):
        opt.step([None, np.ones(512, np.float32)])
    assert same(before, xs + state_arrays(opt, 0) + state_arrays(opt, 1))


def test_objects_sparse_low_precision_step_refuses_a_read_only_parameter():
    x = np.ones((8, 256), np.float32)
    opt = fastadam.Adam([x], lr=0.1, state_dtype="int8", min_8bit_size=0)
    grad = fastadam.IndexedSlices(np.ones((2, 256), np.float32), np.array([1, 5]), x.shape)
    opt.step([grad])
    x.flags.writeable = False
    before = snapshot([x] + state_arrays(opt))
    with pytest.raises(ValueError, match=r"^params\[0\]: is read-only"):
        opt.step([grad])
    assert same(before, [x] + state_arrays(opt))


def test_the_driver_refuses_read_only_arrays_it_writes():
    """The low-precision driver's own check (every caller goes through it)."""
    from fastadam.optim._coefficients import adam_coefficients
    x, g = np.ones(512, np.float32), np.ones(512, np.float32)
    codes = [np.zeros(512, np.uint8), np.zeros(512, np.uint8)]
    scales = [np.zeros(2, np.float32), np.zeros(2, np.float32)]
    scales[1].flags.writeable = False
    coeffs = adam_coefficients(1, 0.1, 0.9, 0.999, 1e-8, "torch")
    with pytest.raises(ValueError, match=r"^scales\[1\]\[0\]: is read-only"):
        _lowp.dense_step(coeffs, [x], [g], [[codes[0]], [codes[1]]], [[scales[0]], [scales[1]]],
                         [], _lowp.FMT_F32, _lowp.FMT_F32, _lowp.FMT_Q8, 256, 0, (True, False), 0,
                         0, 1, False, 1)
    np.testing.assert_array_equal(x, 1)


def test_a_quantized_state_cannot_be_replaced_under_a_prepared_step(tmp_path):
    """lowp_scales_readonly_mmap.py: scales replaced by a read-only mmap after preparing gave
    SIGSEGV in fa_store_q8.  The arrays of a QuantizedState are fixed when it is built; made
    read-only in place, they are refused at the step."""
    x = np.ones(N, np.float32)
    m, v = QuantizedState.zeros(N), QuantizedState.zeros(N, signed=False)
    step = prepare_step("adam", x, {"m": m, "v": v})
    path = tmp_path / "scales.bin"
    np.zeros(m.scales.size, np.float32).tofile(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ro = np.frombuffer(mm, np.float32)
        for attr, value in [("scales", ro), ("codes", m.codes.copy()), ("block_size", 128)]:
            with pytest.raises(AttributeError, match=rf"^{attr}: a QuantizedState's arrays and "
                                                     rf"options are fixed when it is built"):
                setattr(m, attr, value)
        with pytest.raises(ValueError, match=r"^scales: expected a 1-D, C-contiguous, writable"):
            QuantizedState(m.codes.copy(), ro)
        del ro
        mm.close()
    m.scales.flags.writeable = False
    with pytest.raises(ValueError, match=r"^m.scales: is read-only, but it is updated in place"):
        step.step(np.ones(N, np.float32), 1, lr=1e-3)
    np.testing.assert_array_equal(x, 1)


def test_a_quantized_state_still_pickles_and_copies():
    import pickle
    q = QuantizedState.from_array(np.linspace(-1, 1, 300), block_size=64)
    for r in (pickle.loads(pickle.dumps(q)), q.copy()):
        np.testing.assert_array_equal(r.to_array(), q.to_array())
        assert (r.block_size, r.quant_map, r.signed) == (64, "dynamic", True)
        assert r.codes is not q.codes


def test_quantized_state_refuses_bad_scales_and_non_finite_values():
    codes = np.zeros(512, np.uint8)
    for bad in (np.nan, np.inf, -1.0):
        with pytest.raises(ValueError, match=r"^scales: expected finite scales >= 0 .* at "
                                             r"block 1"):
            QuantizedState(codes, np.array([1.0, bad], np.float32))
    with pytest.raises(ValueError, match=r"^a: expected finite values"):
        QuantizedState.from_array(np.array([1.0, np.inf]))


# ---- 3. fork after a parallel low-precision step ------------------------------------------------

FORK_N = 1 << 18  # above the driver's parallel threshold


def _fork_case(state_dtype, front):
    x = np.linspace(-1, 1, FORK_N, dtype=np.float32)
    g = np.cos(np.arange(FORK_N, dtype=np.float32))
    if front == "objects":
        opt = fastadam.Adam([x], lr=1e-3, state_dtype=state_dtype, num_threads=2,
                            min_8bit_size=0)
        return x, lambda: opt.step([g])
    if state_dtype == "int8":
        slots = {"m": QuantizedState.zeros(FORK_N), "v": QuantizedState.zeros(FORK_N,
                                                                              signed=False)}
    else:
        slots = {"m": np.zeros(FORK_N, BF16), "v": np.zeros(FORK_N, BF16)}
    step = prepare_step("adam", x, slots, num_threads=2)
    t = [0]

    def run():
        t[0] += 1
        return step.step(g, t[0], lr=1e-3)
    return x, run


def _child(queue, run, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    queue.put((x.copy(), [str(w.message) for w in caught]))


@pytest.mark.skipif(not _config.openmp_enabled(), reason="a serial build has no thread pool")
@pytest.mark.parametrize("front", ["objects", "prepared"])
@pytest.mark.parametrize("state_dtype", ["bfloat16", "int8"])
def test_a_forked_child_steps_single_threaded_instead_of_hanging(state_dtype, front):
    """lowp_fork_hang.py: the child runs its step on one thread (the same bits as the parent's
    next step: results do not depend on the thread count) and warns once."""
    x, run = _fork_case(state_dtype, front)
    run()
    run()  # parallel regions in the parent
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, run, x))
    child.start()
    try:  # (read before join: the child's queue flushes its 1 MB only to a reader)
        x_child, messages = queue.get(timeout=60)
    except queue_module.Empty:
        child.kill()
        child.join()
        pytest.fail("the forked child hung in OpenMP")
    child.join(timeout=60)
    assert child.exitcode == 0
    run()  # the parent's third step, threaded
    np.testing.assert_array_equal(x_child.view(np.uint32), x.view(np.uint32))
    assert len(messages) == 1 and "created by fork()" in messages[0]


# ---- 4. a finite gradient whose square overflows float32 ----------------------------------------

@pytest.mark.parametrize("name", ["Adam", "Adam-amsgrad", "AdamW", "SGD-momentum", "Adagrad",
                                  "RMSprop", "Lion"])
def test_a_huge_finite_gradient_keeps_an_8bit_block_finite(name):
    """lowp_int8_huge_grad_nan_block.py: g = 3e38 (g*g overflows float32) made the block's v
    scale infinite and the next step turned the block's 256 parameters NaN.  Every optimizer
    whose float32 states stay finite here (centered RMSprop and Nesterov SGD compute inf - inf
    for that element in float32 already)."""
    w = np.zeros(N, np.float32)
    opt = build(name, w, "int8")
    g = np.full(N, 1e-3, np.float32)
    g[100] = 3e38
    opt.step([g], skip_nonfinite=True)
    for _ in range(3):
        opt.step([np.full(N, 1e-3, np.float32)], skip_nonfinite=True)
    assert np.isfinite(w).all()
    for s in opt.state(0).values():
        assert np.isfinite(s.scales).all() and np.isfinite(s.to_array()).all()


def test_an_infinite_block_maximum_saturates_the_scale():
    """The 8-bit store's definition with the saturation: scale = max |y|, or FLT_MAX where that
    is infinite; q = y * (1 / scale); an infinity gets the map's end code."""
    big = np.finfo(np.float32).max
    y = np.zeros(512, np.float32)
    y[:256] = np.linspace(-3, 5, 256)
    y[256:] = 1.0
    y[300], y[301] = np.inf, -np.inf
    codes, scales = _lowp.quantize(y, 256, True, 0)
    assert scales[0] == np.float32(5.0) and scales[1] == big
    qmap = _lowp.dynamic_map(True)
    assert codes[300] == 255 and codes[301] == 0  # the map's ends: 1.0 and its lowest value
    assert qmap[255] == 1.0 and qmap[0] == qmap.min() < 0
    assert (qmap[codes[256:300]] == 0).all()  # 1 / FLT_MAX: far below the map's smallest step
    back = _lowp.dequantize(codes, scales, 256, True, 0)
    assert np.isfinite(back).all() and back[300] == big and back[301] == qmap[0] * big
    # a NaN counts for nothing in its block's scale and is stored as the code of 0
    y[300] = np.nan
    codes, scales = _lowp.quantize(y, 256, True, 0)
    assert scales[1] == big and qmap[codes[300]] == 0.0


@pytest.mark.parametrize("name", ["RMSprop-centered", "RMSprop-centered-momentum",
                                  "SGD-nesterov"])
def test_a_nan_state_element_costs_its_8bit_block_nothing_more_than_float32(name):
    """Centered RMSprop and Nesterov SGD compute inf - inf (a NaN) for the element of a
    gradient whose square overflows float32, with float32 states too.  With 8-bit states that
    element's NaN made its block's scale NaN, and every parameter of the block NaN a step later
    (256 of 4096 for centered RMSprop with momentum): now the 8-bit optimizer has exactly the
    float32 optimizer's non-finite parameters."""
    bad = {}
    for state_dtype in ("float32", "int8"):
        w = np.zeros(N, np.float32)
        opt = build(name, w, state_dtype)
        g = np.full(N, 1e-3, np.float32)
        g[100] = 3e38
        opt.step([g])
        for _ in range(3):
            opt.step([np.full(N, 1e-3, np.float32)])
        bad[state_dtype] = np.flatnonzero(~np.isfinite(w)).tolist()
        if state_dtype == "int8":
            for s in opt.state(0).values():
                assert np.isfinite(s.scales).all()
    assert bad["int8"] == bad["float32"]


# ---- 5. checkpoints with corrupted low-precision states ----------------------------------------

def _trained(state_dtype, name="Adam"):
    x = np.linspace(-1, 1, 1024, dtype=np.float32)
    opt = build(name, x, state_dtype)
    for k in range(3):
        opt.step([np.sin(np.arange(1024, dtype=np.float32) + k)])
    return opt


CORRUPTIONS = [("int8", "m_scales", v) for v in (np.nan, np.inf, -np.inf, -0.5)] \
    + [("int8", "v_scales", v) for v in (np.nan, np.inf, -0.5)] \
    + [("bfloat16", "m", v) for v in (np.nan, np.inf)] \
    + [("bfloat16", "v", v) for v in (np.nan, np.inf, -0.5)]


@pytest.mark.parametrize("state_dtype,key,value", CORRUPTIONS)
def test_load_state_dict_refuses_corrupted_low_precision_values(state_dtype, key, value):
    opt = _trained(state_dtype)
    state = opt.state_dict()
    arr = state[key][0]
    if arr.dtype == BF16:
        arr[7] = value
    else:
        arr[1] = value
    other = _trained(state_dtype)
    before = snapshot([other.params[0]] + state_arrays(other))
    with pytest.raises(ValueError, match=rf"^state\['{key}'\]\[0\]: expected finite"):
        other.load_state_dict(state)
    assert same(before, [other.params[0]] + state_arrays(other))
    assert other.t == 3


@pytest.mark.parametrize("state_dtype,key,value", CORRUPTIONS[::2])
def test_load_refuses_a_checkpoint_file_with_corrupted_values(tmp_path, state_dtype, key, value):
    opt = _trained(state_dtype)
    target = opt.state(0)[key.split("_")[0]]
    a = target.scales if key.endswith("_scales") else target
    a[1] = value  # a corrupted file, as a bad disk or an edited one gives
    path = tmp_path / "ckpt.zip"
    opt.save(path)
    other = _trained(state_dtype)
    before = snapshot([other.params[0]] + state_arrays(other))
    with pytest.raises(ValueError, match=rf"^{key}_0.npy: expected finite"):
        other.load(path)
    assert same(before, [other.params[0]] + state_arrays(other))


@pytest.mark.parametrize("state_dtype", ["bfloat16", "int8"])
def test_a_sound_low_precision_checkpoint_still_loads(tmp_path, state_dtype):
    opt = _trained(state_dtype)
    opt.save(tmp_path / "ok.zip")
    other = _trained(state_dtype)
    other.params[0][...] = 0
    other.load(tmp_path / "ok.zip")
    other.load_state_dict(opt.state_dict())
    for a, b in zip(state_arrays(opt) + [opt.params[0]], state_arrays(other) + [other.params[0]]):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_a_float32_state_of_an_8bit_optimizer_is_checked_too():
    """min_8bit_size: a small parameter of an int8 optimizer keeps float32 states."""
    x = np.ones(16, np.float32)
    opt = fastadam.Adam([x], lr=0.1, state_dtype="int8")  # 16 < min_8bit_size: float32 states
    opt.step([np.ones(16, np.float32)])
    state = opt.state_dict()
    state["v"][0][3] = -1.0
    with pytest.raises(ValueError, match=r"^state\['v'\]\[0\]: expected finite and >= 0 "
                                         r"values, got -1.0 at flat index 3"):
        opt.load_state_dict(state)


# ---- 6. no NaN from finite input: 1000 steps of a steady gradient --------------------------------

@pytest.mark.parametrize("state_dtype", FORMATS)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_steady_gradient_keeps_every_optimizer_and_format_finite(name, state_dtype):
    """1000 steps of one constant gradient (normal values, eight 8-bit blocks); centered
    RMSprop with 8-bit states went NaN within a few steps of this one (issue 38)."""
    x = np.zeros(2048, np.float32)
    opt = build(name, x, state_dtype)
    g = np.random.default_rng(38).standard_normal(2048).astype(np.float32)
    for _ in range(1000):
        opt.step([g])
    assert np.isfinite(x).all()
    for s in opt.state(0).values():
        values = s.to_array() if isinstance(s, QuantizedState) else np.asarray(s, np.float32)
        assert np.isfinite(values).all()


@pytest.mark.parametrize("convention", ["torch", "keras"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_centered_rmsprop_clamps_a_negative_variance_at_zero(convention, dtype):
    """The documented clamp, against the formula in float64: w = max(v - a**2, 0).  States where
    v - a**2 < 0 (v = 0, a = 1: as rounding or 8-bit states leave them) step by g / (sqrt(0 +
    eps_in) + eps_out) instead of NaN; where w >= 0 the clamp changes nothing."""
    alpha, eps, lr = 0.9, 1e-3, 0.1
    g = np.array([0.5, -0.25, 2.0, 1.0], dtype)
    a0 = np.array([1.0, 1.0, 0.0, 0.5], dtype)   # the first two: v - a**2 < 0 after the step
    v0 = np.array([0.0, 0.0, 4.0, 1.0], dtype)
    x, v, a = np.zeros(4, dtype), v0.copy(), a0.copy()
    fastadam.rmsprop_step_inplace(x, g, v, 1, grad_avg=a, lr=lr, alpha=alpha, eps=eps,
                                  centered=True, convention=convention)
    g64 = g.astype(np.float64)
    v64 = alpha * v0 + (1 - alpha) * g64 ** 2
    a64 = alpha * a0 + (1 - alpha) * g64
    w = np.maximum(v64 - a64 ** 2, 0.0)
    assert (v64 - a64 ** 2)[:2].max() < 0 and (v64 - a64 ** 2)[2:].min() > 0
    d = g64 / (np.sqrt(w) + eps) if convention == "torch" else g64 / np.sqrt(w + eps)
    rtol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(x, -lr * d, rtol=rtol)
    assert np.isfinite(x).all()
