"""The fold a prepared step keeps across steps (fastadam/optim/_prepared.py, spec.retime): a set
of hyper-parameters is checked once and only the step-number fields are recomputed while it is
unchanged.  Every test compares with the functional step, which folds afresh on every call, bit
for bit; where the kept fold could go wrong (another t, another lr, a schedule, a value that
becomes invalid, float32 overflow at one t only, a value changed in place, -0.0 against 0.0)
the step must still raise the functional step's error and write nothing."""
import signal

import numpy as np
import pytest

import fastadam
from fastadam.optim import prepare_step, schedules
from optimizer_table import ELEMENT_CASES as CASES, case_id  # row-wise: no prepared step


def _state(rng, info, options, shapes):
    x = [rng.standard_normal(s) for s in shapes]
    state = {n: [np.abs(rng.standard_normal(s)) for s in shapes] for n in info.slots(options)}
    return x, state


def _copy(x, state):
    return [a.copy() for a in x], {n: [a.copy() for a in lst] for n, lst in state.items()}


def _assert_same(x, state, want_x, want):
    for a, b in zip(x, want_x):
        assert a.tobytes() == b.tobytes()
    for n in state:
        for a, b in zip(state[n], want[n]):
            assert a.tobytes() == b.tobytes(), n


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_any_order_of_steps_and_a_changed_lr_match_the_functional_step(rng, case):
    info, options = case
    shapes = [(5,), (3, 4)]
    x, state = _state(rng, info, options, shapes)
    want_x, want = _copy(x, state)
    prepared = prepare_step(info.name, x, state, num_threads=1)
    f = info.first_t
    lr = options.get("lr", 0.01)
    # repeated t, t going back, a large t, and lr changed then changed back
    plan = [(f + 2, lr), (f, lr), (f + 1, lr), (f + 1, lr), (f + 40, lr), (f + 3, lr / 3),
            (f + 3, lr / 3), (f + 4, lr), (f, -0.0 if info.name == "adam" else 0.0)]
    for t, step_lr in plan:
        opts = dict(options, lr=step_lr)
        g = [rng.standard_normal(s) for s in shapes]
        assert prepared.step(g, t, **opts) is True
        info.dense(want_x, g, want, t, **opts)
        _assert_same(x, state, want_x, want)


def test_negative_zero_lr_is_not_the_fold_of_zero():
    """lr=0.0 and lr=-0.0 compare equal but fold to alphas of opposite sign, which a parameter
    of -0.0 shows: the kept fold must not serve one for the other."""
    def run(lrs):
        x, m, v = np.full(4, -0.0), np.zeros(4), np.zeros(4)
        prepared = prepare_step("adam", x, {"m": m, "v": v})
        for t, lr in enumerate(lrs, 1):
            prepared.step(np.ones(4), t, lr=lr, convention="torch")
        return x

    def functional(lrs):
        x, m, v = np.full(4, -0.0), np.zeros(4), np.zeros(4)
        for t, lr in enumerate(lrs, 1):
            fastadam.step_inplace(x, np.ones(4), m, v, t, lr=lr, convention="torch")
        return x

    for lrs in ([0.0, -0.0], [-0.0, 0.0], [0.0, 0.0], [-0.0, -0.0]):
        assert run(lrs).tobytes() == functional(lrs).tobytes(), lrs
    assert np.signbit(functional([0.0, -0.0])).all() != np.signbit(functional([0.0])).all()


def test_a_value_that_becomes_invalid_raises_and_writes_nothing():
    x, m, v = np.ones(3), np.zeros(3), np.zeros(3)
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    g = np.full(3, 0.5)
    prepared.step(g, 1, lr=0.1, beta1=0.9)
    before = [a.copy() for a in (x, m, v)]
    bad = [(ValueError, r"^beta1: expected 0 <= beta1 < 1, got 1.0", dict(beta1=1.0)),
           (TypeError, r"^lr: expected a real number, got bool", dict(lr=True, beta1=0.9)),
           (ValueError, r"^eps: expected eps > 0, got -0.0", dict(lr=0.1, eps=-0.0)),
           (ValueError, r"^lr: expected a finite number, got nan", dict(lr=float("nan"))),
           (ValueError, r"^convention: expected one of", dict(lr=0.1, convention="keras"))]
    for exc, pattern, hyper in bad:
        with pytest.raises(exc, match=pattern):
            prepared.step(g, 2, **hyper)
        for a, b in zip((x, m, v), before):
            np.testing.assert_array_equal(a, b)
    # lr=1 (an int) was never folded: True, equal to it in Python, must still be refused
    prepared.step(g, 2, lr=1, beta1=0.9)
    with pytest.raises(TypeError, match=r"^lr: expected a real number, got bool"):
        prepared.step(g, 3, lr=True, beta1=0.9)


def test_an_invalid_step_number_after_a_kept_fold():
    x, m, v = np.ones(3), np.zeros(3), np.zeros(3)
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    g = np.full(3, 0.5)
    prepared.step(g, 1, lr=0.1, convention="torch")
    before = x.copy()
    for t, exc, pattern in [(0, ValueError, r"^t: expected a step number >= 1 for convention "
                                            r"'torch', got 0"),
                            (True, TypeError, r"^t: expected an int step number, got bool"),
                            (1.0, TypeError, r"^t: expected an int step number, got float"),
                            (2**63, ValueError, r"^t: expected a step number below 2\*\*63")]:
        with pytest.raises(exc, match=pattern):
            prepared.step(g, t, lr=0.1, convention="torch")
        np.testing.assert_array_equal(x, before)
    prepared.step(g, np.int64(2), lr=0.1, convention="torch")  # an np.integer step is fine
    assert not np.array_equal(x, before)


@pytest.mark.parametrize("name, slots, hyper, t_bad, message", [
    ("adagrad", ("h",), dict(lr=0.1, lr_decay=1.0, convention="onnx"), -1,
     r"^t: 1 \+ t \* lr_decay is 0"),
    ("adagrad", ("h",), dict(lr=0.1), 0, r"^t: expected a step number >= 1 for convention"),
    ("momentum", ("v",), dict(lr=0.1), 0, r"^t: expected a step number >= 1 for convention"),
    ("rmsprop", ("square_avg",), dict(lr=0.1), 0, r"^t: expected a step number >= 1, got 0"),
    ("lion", ("m",), dict(lr=0.1), -3, r"^t: expected a step number >= 1, got -3"),
])
def test_every_retime_checks_t_as_its_fold(name, slots, hyper, t_bad, message):
    x = np.ones(3)
    state = {n: np.zeros(3) for n in slots}
    prepared = prepare_step(name, x, state)
    prepared.step(np.full(3, 0.5), 2, **hyper)
    before = x.copy()
    with pytest.raises(ValueError, match=message):
        prepared.step(np.full(3, 0.5), t_bad, **hyper)
    np.testing.assert_array_equal(x, before)
    spec_fold = fastadam.optim.prepare_step(name, np.ones(3), {n: np.zeros(3) for n in slots})
    with pytest.raises(ValueError, match=message):  # the fold itself says the same
        spec_fold.check(t_bad, **hyper)


def test_float32_overflow_at_one_step_number_only():
    """torch's alpha = lr / (1 - beta1**t) is 10*lr at t=1 and about lr at t=1000: with
    lr=1e38 only the early step overflows float32, so the retimed fold must be checked."""
    x, m, v = (np.ones(3, np.float32) for _ in range(3))
    m[:] = 0
    v[:] = 0
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    g = np.full(3, 0.5, np.float32)
    assert prepared.step(g, 1000, lr=1e38, convention="torch")
    before = [a.copy() for a in (x, m, v)]
    with pytest.raises(ValueError, match=r"^lr: .* overflows float32"):
        prepared.step(g, 1, lr=1e38, convention="torch")
    for a, b in zip((x, m, v), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"^lr: .* overflows float32"):  # and again (kept)
        prepared.step(g, 1, lr=1e38, convention="torch")


def test_a_value_changed_in_place_between_steps_is_folded_again():
    """A 0-d array (what JAX schedules return) can change in place: it is never kept."""
    x, m, v = np.ones(3), np.zeros(3), np.zeros(3)
    ref = [a.copy() for a in (x, m, v)]
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    lr = np.array(0.1)
    for t, value in [(1, 0.1), (2, 0.3), (3, 0.3), (4, 1e-4)]:
        lr[()] = value
        g = np.full(3, 0.25 * t)
        prepared.step(g, t, lr=lr)
        fastadam.step_inplace(ref[0], g, ref[1], ref[2], t, lr=value)
    for a, b in zip((x, m, v), ref):
        assert a.tobytes() == b.tobytes()
    lr[()] = np.nan
    with pytest.raises(ValueError, match=r"^lr: expected a finite number, got nan"):
        prepared.step(np.ones(3), 5, lr=lr)


@pytest.mark.parametrize("case", [c for c in CASES if c[0].cls is not None
                                  and c[0].object_options(c[1]) is not None], ids=case_id)
def test_objects_with_a_schedule_and_changed_hyperparameters_match(rng, case):
    """The optimizer objects step through plans that keep their fold: a schedule (lr changes
    every step), set_hyperparameters and a grad_scale between steps give the bits of a twin
    whose plans are built afresh before every step (nothing kept)."""
    info, options = case
    kwargs = info.object_options(options)
    shapes = [(6,), (2, 3)]
    x = [rng.standard_normal(s) for s in shapes]
    opt = info.cls([a.copy() for a in x], **kwargs)
    ref = info.cls([a.copy() for a in x], **kwargs)
    schedule = schedules.exponential(kwargs.get("lr") or 0.01, 0.5)
    for k in range(6):
        g = [rng.standard_normal(s) for s in shapes]
        if k == 2:
            opt.set_hyperparameters(lr=schedule)
            ref.set_hyperparameters(lr=schedule)
        if k == 4:
            opt.set_hyperparameters(lr=0.002)
            ref.set_hyperparameters(lr=0.002)
        scale = 4.0 if k == 3 else None
        ref._rebuild_plans()  # fresh plans: no fold kept from an earlier step
        assert opt.step(g, grad_scale=scale) == ref.step(g, grad_scale=scale)
        for a, b in zip(opt.params, ref.params):
            assert a.tobytes() == b.tobytes(), k
    for name in opt.slot_names:
        for a, b in zip(opt._slots[name], ref._slots[name]):
            assert a.tobytes() == b.tobytes(), name


def test_prepared_gradients_overlapping_a_written_array_are_named():
    xs = [np.ones(8) for _ in range(3)]
    ms = [np.zeros(8) for _ in range(3)]
    vs = [np.zeros(8) for _ in range(3)]
    prepared = prepare_step("adam", xs, {"m": ms, "v": vs})
    before = [a.copy() for a in xs + ms + vs]
    for grads, pattern in [([np.ones(8), ms[2], np.ones(8)], r"grads\[1\] and m\[2\] share"
                                                             r"|m\[2\] and grads\[1\] share"),
                           ([np.ones(8), np.ones(8), vs[0]], r"v\[0\] and grads\[2\] share"
                                                             r"|grads\[2\] and v\[0\] share")]:
        with pytest.raises(ValueError, match=pattern):
            prepared.step(grads, 1)
        for a, b in zip(xs + ms + vs, before):
            np.testing.assert_array_equal(a, b)
    big = np.ones(40)
    overlapping = [big[:8], big[8:16], big[16:24]]  # gradients may share memory
    assert prepared.step(overlapping, 1)


def test_an_array_made_read_only_after_prepare_is_refused():
    x, m, v = np.ones(3), np.zeros(3), np.zeros(3)
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    prepared.step(np.ones(3), 1)
    v.flags.writeable = False
    before = [a.copy() for a in (x, m, v)]
    with pytest.raises(ValueError, match=r"^v: is read-only, but it is updated in place"):
        prepared.step(np.ones(3), 2)
    for a, b in zip((x, m, v), before):
        np.testing.assert_array_equal(a, b)
    p = np.ones(3)
    opt = fastadam.Adam([p])
    opt.step([np.ones(3)])
    p.flags.writeable = False
    with pytest.raises(ValueError, match=r"read-only, but it is updated in place"):
        opt.step([np.ones(3)])
    assert opt.t == 1


def test_a_sigint_between_prepared_calls_comes_after_the_whole_step(monkeypatch, python_sigint):
    """Two dtypes: two prepared calls of the driver; a SIGINT raised after the first is
    delivered after the second, with t advanced."""
    from fastadam.optim import PreparedStep

    params = [np.linspace(-1, 1, 50), np.linspace(1, 2, 50).astype(np.float32)]
    opt = fastadam.Adam(params, lr=0.01)
    want = [p.copy() for p in params]
    ref = fastadam.Adam(want, lr=0.01)
    grads = [np.cos(np.arange(50.0)), np.sin(np.arange(50.0)).astype(np.float32)]
    ref.step(grads)
    ref.step(grads)
    opt.step(grads)
    real = PreparedStep._step  # each bucket's prepared step: one driver call
    calls = []

    def interrupted_after_first(*args):
        out = real(*args)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return out

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.setattr(PreparedStep, "_step", interrupted_after_first)
    with pytest.raises(KeyboardInterrupt):
        opt.step(grads)
    monkeypatch.undo()
    assert len(calls) == 2 and opt.t == 2
    for a, b in zip(params, want):
        assert a.tobytes() == b.tobytes()


def test_step_inplace_lists_name_the_item_that_fails():
    """The list checks read headers only and format a label for the failing item alone."""
    def arrays():
        return ([np.ones(6, np.float32) for _ in range(3)] for _ in range(4))

    cases = []
    x, g, m, v = arrays()
    m[2].flags.writeable = False
    cases.append(((x, g, m, v), ValueError, r"^m\[2\]: is read-only"))
    x, g, m, v = arrays()
    g[1] = np.ones(12, np.float32)[::2]
    cases.append(((x, g, m, v), ValueError, r"^g\[1\]: expected a C-contiguous array"))
    x, g, m, v = arrays()
    v[1] = np.ones(6, np.dtype(np.float32).newbyteorder())
    cases.append(((x, g, m, v), ValueError, r"^v\[1\]: expected an aligned array in native"))
    x, g, m, v = arrays()
    x[2] = np.ones(6)
    cases.append(((x, g, m, v), TypeError, r"^x\[2\]: expected dtype float32, got float64"))
    x, g, m, v = arrays()
    v[0] = np.ones((2, 3), np.float32)
    cases.append(((x, g, m, v), ValueError, r"^v\[0\]: expected shape \(6,\), got \(2, 3\)"))
    for (x, g, m, v), exc, pattern in cases:
        before = [a.copy() for a in x + m + v]
        with pytest.raises(exc, match=pattern):
            fastadam.step_inplace(x, g, m, v, 1)
        for a, b in zip(x + m + v, before):
            np.testing.assert_array_equal(a, b)


def test_an_ndarray_subclass_is_still_accepted_in_lists():
    class Marked(np.ndarray):
        pass

    x = [np.ones(4), np.ones(4)]
    g = [np.full(4, 0.5), np.full(4, 0.5).view(Marked)]
    m, v = [np.zeros(4), np.zeros(4)], [np.zeros(4), np.zeros(4)]
    assert fastadam.step_inplace(x, g, m, v, 1, lr=0.1, convention="torch")
    np.testing.assert_allclose(x[1], 0.9)


@pytest.mark.parametrize("convention", ["tf", "torch", "onnx"])
def test_the_c_fold_of_adam_gives_the_python_folds_bits(rng, convention):
    """adam_coefficients folds exact floats in C (_coeffs.adam_fold); an np.float64 lr takes
    the Python fold: the two give the same bits for every field, t and option."""
    from fastadam.optim._coefficients import adam_coefficients

    for _ in range(40):
        lr = float(10.0 ** rng.uniform(-6, 1))
        beta1, beta2 = float(rng.uniform(0, 0.999)), float(rng.uniform(0.5, 0.99999))
        eps = float(10.0 ** rng.uniform(-12, -1))
        wd = float(rng.choice([0.0, 1e-2, 0.3]))
        post = float(rng.choice([0.0, 1e-3]))
        flags = [bool(b) for b in rng.integers(0, 2, 4)]
        scale = None if rng.random() < 0.5 else float(rng.uniform(0.5, 1024))
        t = int(rng.choice([1, 2, 7, 1000, 2**40]))
        args = (beta1, beta2, eps, convention, wd, flags[0], post, flags[1], flags[2],
                flags[3], scale)
        fast = adam_coefficients(t, lr, *args).as_dict()
        slow = adam_coefficients(t, np.float64(lr), *args).as_dict()
        assert {k: float(v).hex() for k, v in fast.items()} == \
            {k: float(v).hex() for k, v in slow.items()}


def test_an_objects_num_threads_set_between_steps_is_used_and_checked():
    x = [np.linspace(-1, 1, 300_000), np.linspace(0, 1, 7)]
    ref = [a.copy() for a in x]
    opt = fastadam.Adam(x, lr=0.01, num_threads=1)
    want = fastadam.Adam(ref, lr=0.01, num_threads=1)
    g = [np.cos(a) for a in x]
    for threads in (1, 2, -1, None, 1):
        opt.num_threads = threads
        assert opt.step(g) and want.step(g)
    for a, b in zip(x, ref):  # every thread count gives the same bits
        assert a.tobytes() == b.tobytes()
    before = [a.copy() for a in x]
    with pytest.raises(ValueError, match=r"^num_threads: expected a non-zero int"):
        opt.num_threads = 0  # refused when set, not at the next step
    with pytest.raises(TypeError, match=r"^num_threads: expected None or an int, got str"):
        opt.num_threads = "2"
    assert opt.num_threads == 1
    for a, b in zip(x, before):
        np.testing.assert_array_equal(a, b)
    assert opt.t == 5 and opt.step(g) and want.step(g)
    for a, b in zip(x, ref):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("cls", [fastadam.Adam, fastadam.AdamW, fastadam.Adagrad, fastadam.SGD,
                                 fastadam.RMSprop, fastadam.Lion])
def test_precision_checks_fold_without_a_dry_run(cls, monkeypatch):
    """The constructor, add_param_group, set_hyperparameters, load and step check float32's
    limits by the fold alone: no functional step runs on empty arrays."""
    from fastadam.optim import _functional
    real = _functional.dense_step
    calls = []

    def spy(coeffs, x, g, slots, skip_nonfinite, num_threads):
        calls.append([np.shape(a) for a in (x if isinstance(x, list) else [x])])
        return real(coeffs, x, g, slots, skip_nonfinite, num_threads)

    monkeypatch.setattr(_functional, "dense_step", spy)
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(5).astype(np.float32)]
    opt = cls(params, lr=1e-2)
    opt.add_param_group({"params": [rng.standard_normal(3).astype(np.float32)], "lr": 1e-3})
    opt.set_hyperparameters(lr=2e-2)
    opt.load_state_dict(opt.state_dict())
    opt.step([rng.standard_normal(5).astype(np.float32),
              rng.standard_normal(3).astype(np.float32)])
    assert calls == []  # the step itself went through the prepared step
    with pytest.raises(ValueError, match="lr"):
        opt.set_hyperparameters(lr=1e300)  # finite in float64, not in float32
    assert calls == []
    assert opt.param_groups[0]["lr"] == 2e-2  # the refused change wrote nothing
