"""The one route of ``Optimizer.step`` (fastadam/optim/_step_path.pyx).

Every step runs the optimizer's plans.  When one plan covers every parameter and the gradients
are plain arrays (a list, a tuple or a bare array), ``optimizer_step`` runs that plan's fold and
driver call itself; anything else (here forced by ``grad_scale=1.0``, which changes nothing
else) goes through ``Optimizer._step``, which runs the same plans.  Two twins stepped side by
side, one each way, must hold the same bits after every change an optimizer can go through
between steps, and the first must really have taken the one-plan case where nothing changed
(a spy on ``_step`` counts the general steps)."""
import pickle
import warnings

import numpy as np
import pytest

import fastadam
from fastadam.optim import schedules

N = 257  # not a multiple of any vector width


def spy_general(opt):
    """Count the steps that take Optimizer._step (the general case) on ``opt``."""
    real = opt._step
    opt.general = []

    def spy(*args, **kwargs):
        opt.general.append(1)
        return real(*args, **kwargs)

    opt._step = spy
    return opt


def make(cls=fastadam.Adam, dtype=np.float32, n_params=2, **kw):
    rng = np.random.default_rng(7)
    params = [rng.standard_normal(N + 3 * i).astype(dtype) for i in range(n_params)]
    return (spy_general(cls([p.copy() for p in params], **kw)),
            cls([p.copy() for p in params], **kw))


def grads_for(opt, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(a.shape).astype(a.dtype) for a in opt._arrays]


def assert_twins(kept, python):
    assert kept.t == python.t
    for a, b in zip(kept._arrays, python._arrays):
        assert a.tobytes() == b.tobytes()
    for name in python.slot_names:
        for a, b in zip(kept._slots[name], python._slots[name]):
            if hasattr(a, "codes"):  # an 8-bit state: its codes and scales
                assert a.codes.tobytes() == b.codes.tobytes(), name
                a, b = a.scales, b.scales
            assert a.tobytes() == b.tobytes(), name


def step_both(kept, python, seed, compiled=True, container=list):
    g = grads_for(python, seed)
    before = len(kept.general)
    assert kept.step(container(g)) is True
    assert python.step(list(g), grad_scale=1.0) is True
    if compiled:
        assert len(kept.general) == before, "the one-plan step did not run"
    assert_twins(kept, python)


OPTIMIZERS = [
    (fastadam.Adam, dict(lr=1e-2)),
    (fastadam.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    (fastadam.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (fastadam.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    (fastadam.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (fastadam.RMSprop, dict(lr=1e-2, centered=True, momentum=0.5)),
    (fastadam.Lion, dict(lr=1e-3, weight_decay=0.1)),
]


@pytest.mark.parametrize("cls,kw", OPTIMIZERS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_compiled_steps_hold_the_python_steps_bits(cls, kw, dtype):
    kept, python = make(cls, dtype, **kw)
    for seed in range(12):
        step_both(kept, python, seed, container=list if seed % 2 else tuple)
    assert kept.general == []


def test_a_bare_array_for_one_parameter_takes_the_one_plan_step_too():
    kept, python = make(n_params=1, lr=1e-2)
    for seed in range(5):
        g = grads_for(python, seed)[0]
        kept.step(g)
        python.step((g,), grad_scale=1.0)
        assert_twins(kept, python)
    assert kept.general == []


CHANGES = {
    "lr": lambda o: o.set_hyperparameters(lr=3e-3),
    "betas and weight decay": lambda o: o.set_hyperparameters(betas=(0.8, 0.95),
                                                              weight_decay=0.2),
    "num_threads": lambda o: setattr(o, "num_threads", 2),
    "clipping": lambda o: setattr(o, "clip_grad_norm", 0.05),
    "t set by hand": lambda o: setattr(o, "t", 40),
    "zero_state": lambda o: o.zero_state(),
}


def step_both_any(kept, python, seed):
    g = grads_for(python, seed)
    assert kept.step(list(g)) is True
    assert python.step(list(g), grad_scale=1.0) is True
    assert_twins(kept, python)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_between_steps_gives_the_python_bits(change):
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both(kept, python, seed)
    CHANGES[change](kept)
    CHANGES[change](python)
    for seed in range(3, 7):
        step_both_any(kept, python, seed)
    if change != "clipping":  # still one plan: its step runs
        step_both(kept, python, 7)


def test_a_checkpoint_loaded_between_steps_is_stepped_from():
    kept, python = make(lr=1e-2)
    step_both_any(kept, python, 0)
    state = kept.state_dict()
    for seed in range(1, 4):
        step_both_any(kept, python, seed)
    kept.load_state_dict(state)
    python.load_state_dict(state)
    for seed in range(4, 7):
        step_both_any(kept, python, seed)
    step_both(kept, python, 7)  # the one-plan step over the loaded state


def test_a_schedule_steps_through_python_with_its_rate_each_step():
    kept, python = make(lr=schedules.cosine(1e-2, 50))
    for seed in range(6):
        step_both_any(kept, python, seed)
    assert len(kept.general) == 6  # a schedule's rate: the general step reads it


def test_a_group_added_between_steps():
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    for opt in (kept, python):
        opt.add_param_group({"params": [np.linspace(0, 1, 33, dtype=np.float32)], "lr": 0.5})
    for seed in range(3, 6):
        step_both_any(kept, python, seed)


def test_grad_scale_and_skip_nonfinite_take_the_python_step():
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    g = grads_for(python, 9)
    assert kept.step(list(g), grad_scale=4.0) and python.step(tuple(g), grad_scale=4.0)
    assert_twins(kept, python)
    bad = [a.copy() for a in g]
    bad[1][5] = np.nan
    assert kept.step(list(bad), skip_nonfinite=True) is False
    assert python.step(tuple(bad), skip_nonfinite=True) is False
    assert len(kept.general) == 2
    assert_twins(kept, python)
    for seed in range(10, 13):
        step_both_any(kept, python, seed)


def test_a_dense_gradient_after_sparse_ones_still_warns():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((20, 4)).astype(np.float32)
    opt = fastadam.Adam([table], lr=1e-2)
    dense = np.ones_like(table)
    opt.step([dense])
    opt.step([dense])
    assert opt._common is not None
    opt.step([fastadam.IndexedSlices(np.ones((2, 4), np.float32), np.array([1, 3]), (20, 4))])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt.step([dense])
    assert any("had sparse gradients" in str(w.message) for w in seen)


def test_bad_gradients_after_kept_steps_get_the_python_steps_errors():
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    g = grads_for(python, 5)
    cases = [
        (lambda o: [g[0], g[1].astype(np.float64)], TypeError),
        (lambda o: [g[0], g[1][:-1]], ValueError),
        (lambda o: [g[0]], ValueError),
        (lambda o: [g[0], o._arrays[1]], ValueError),  # a gradient that is a parameter
        (lambda o: [g[0], o._slots["m"][0][:g[1].size]], ValueError),  # inside a state
        (lambda o: [g[0], np.stack([g[1], g[1]], axis=1)[:, 0]], None),  # strided: read as is
    ]
    for grads, exc in cases:
        if exc is None:
            assert kept.step(list(grads(kept))) and python.step(list(grads(python)),
                                                                grad_scale=1.0)
            assert_twins(kept, python)
            continue
        with pytest.raises(exc) as got:
            kept.step(list(grads(kept)))
        with pytest.raises(exc) as want:
            python.step(list(grads(python)), grad_scale=1.0)
        assert str(got.value) == str(want.value)
        assert_twins(kept, python)  # nothing written, t unchanged
    step_both_any(kept, python, 6)


def test_a_parameter_made_read_only_or_resized_is_refused():
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    kept._arrays[0].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kept.step(grads_for(python, 3))
    assert kept.t == 3


def test_a_pickled_optimizer_steps_like_the_original():
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    del kept._step, kept.general  # the spy is not picklable
    copy = spy_general(pickle.loads(pickle.dumps(kept)))
    for seed in range(3, 6):
        g = grads_for(python, seed)
        copy.step(list(g))
        python.step(list(g), grad_scale=1.0)
    assert_twins(copy, python)
    assert copy.general == []


def test_numpy_refuses_to_resize_a_stepped_array_while_the_optimizer_lives():
    """The prepared step holds a weak reference to each written array, so ndarray.resize
    (which the kept step's header pass relies on not moving or resizing a buffer) is refused,
    even with refcheck=False; once the optimizer is gone the arrays are the user's again."""
    import gc

    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    for a in (kept._arrays[0], kept.state(1)["m"], kept.state(0)["v"]):
        with pytest.raises(ValueError, match="cannot resize"):
            a.resize(a.size + 64, refcheck=False)
    step_both(kept, python, 3)  # still the compiled step, same bits
    x = kept._arrays[0]
    del kept
    gc.collect()
    x.resize(x.size + 64, refcheck=False)
    assert x.size == N + 64


@pytest.mark.parametrize("make_grad", [
    lambda a: a.astype(a.dtype.newbyteorder()),  # byte-swapped: read through the Python step
    lambda a: np.frombuffer(b"\0" + a.tobytes(), a.dtype, offset=1),  # misaligned, read-only
], ids=["swapped", "misaligned"])
def test_unusual_gradients_after_kept_steps_take_the_python_step(make_grad):
    kept, python = make(lr=1e-2)
    for seed in range(3):
        step_both_any(kept, python, seed)
    g = grads_for(python, 3)
    odd = [g[0], make_grad(g[1])]
    outcomes = []
    for opt, kw in ((kept, {}), (python, dict(grad_scale=1.0))):
        try:
            outcomes.append(opt.step(list(odd), **kw))
        except (TypeError, ValueError) as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert_twins(kept, python)


def test_a_state_reshaped_in_place_steps_the_same_elements_on_every_path():
    """A written array whose shape is set in place keeps its buffer: the header pass and the
    full check (a gradient subclass takes it) both accept it, and the step updates the same
    flat elements as on the untouched twin."""
    class Sub(np.ndarray):
        pass

    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((8, 16)).astype(np.float32)
    grads = [rng.standard_normal(x0.shape).astype(np.float32) for _ in range(2)]
    results = []
    for reshape in (False, True):
        x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        ps = fastadam.optim.prepare_step("adam", [x], {"m": [m], "v": [v]})
        if reshape:
            m.shape = (16, 8)
        assert ps.step([grads[0]], 1, lr=1e-2)  # the header pass
        assert ps.step([grads[1].view(Sub)], 2, lr=1e-2)  # the full check
        results.append([x.tobytes(), m.tobytes(), v.tobytes()])
    assert results[0] == results[1]
    assert results[0][0] != x0.tobytes()


LOWP = [dict(state_dtype="bfloat16"), dict(state_dtype="int8", min_8bit_size=0, block_size=64)]


@pytest.mark.parametrize("lowp", LOWP, ids=["bfloat16", "int8"])
@pytest.mark.parametrize("change", sorted(CHANGES) + ["checkpoint"])
def test_low_precision_states_kept_and_changed_give_the_python_bits(lowp, change):
    """The low-precision objects' one-plan step against the general one, across every change,
    and a checkpoint loaded between steps."""
    kept, python = make(lr=1e-2, **lowp)
    for seed in range(4):
        step_both(kept, python, seed)
    if change == "checkpoint":
        state = kept.state_dict()
        step_both(kept, python, 4)
        kept.load_state_dict(state)
        python.load_state_dict(state)
    else:
        CHANGES[change](kept)
        CHANGES[change](python)
    for seed in range(5, 9):
        step_both_any(kept, python, seed)
    if change != "clipping":
        step_both(kept, python, 9)
