"""Optimizer objects under interrupts and threads (fastadam/optim/_guard.py): a step of several
compiled calls is all or nothing under KeyboardInterrupt, and ``t`` always counts the steps the
arrays hold; a checkpoint taken while another thread steps is exactly one step's state; ``load``
runs the constructor's checks (a float32 checkpoint with eps=1e-50 is refused, naming the
field); schedules that overflow raise ValueError."""
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

import fastadam
from fastadam.optim import PreparedStep
from fastadam.optim import schedules

N = 100_000


def two_group_adam(n=N):
    """Two groups and two dtypes: three compiled calls per step."""
    params = [np.linspace(-1, 1, n), np.linspace(1, 2, n).astype(np.float32),
              np.linspace(0, 3, n)]
    opt = fastadam.Adam([{"params": params[:2], "lr": 0.01},
                         {"params": params[2:], "lr": 0.02, "weight_decay": 0.1}])
    grads = [np.cos(np.arange(n) * 0.01), np.sin(np.arange(n) * 0.02).astype(np.float32),
             np.full(n, 0.5)]
    return opt, params, grads


class Reference:
    """The same optimizer stepped without interference: its state after k steps."""

    def __init__(self, n=N):
        self.opt, self.params, self.grads = two_group_adam(n)

    def at(self, t):
        assert self.opt.t <= t
        while self.opt.t < t:
            self.opt.step(self.grads)
        return ([p.copy() for p in self.params],
                {name: [a.copy() for a in self.opt._slots[name]] for name in self.opt.slot_names})

    def assert_matches(self, t, params, slots):
        ref_params, ref_slots = self.at(t)
        for a, b in zip(params, ref_params):
            np.testing.assert_array_equal(a, b)
        for name in ref_slots:
            for a, b in zip(slots[name], ref_slots[name]):
                np.testing.assert_array_equal(a, b)


def state_of(opt, params):
    return [p.copy() for p in params], {n: list(opt._slots[n]) for n in opt.slot_names}


def test_sigint_in_the_middle_of_a_step_comes_after_the_whole_step(monkeypatch, python_sigint):
    """SIGINT raised right after the first compiled call: without deferral KeyboardInterrupt
    left the step half applied with t not advanced."""
    opt, params, grads = two_group_adam(1000)
    ref = Reference(1000)
    real = PreparedStep._step
    calls = []

    def interrupted_after_first(self, *args):  # a plan's run: one compiled call
        out = real(self, *args)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return out

    opt.step(grads)
    # (a handler left by another test would make the raised signal do something else)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.setattr(PreparedStep, "_step", interrupted_after_first)
    with pytest.raises(KeyboardInterrupt):
        opt.step(grads)
    monkeypatch.undo()
    assert len(calls) >= 3  # every call ran before the interrupt was delivered
    assert opt.t == 2
    ref.assert_matches(2, *state_of(opt, params))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_user_sigint_handler_is_called_after_the_step(monkeypatch, python_sigint):
    opt, params, grads = two_group_adam(1000)
    seen = []

    def handler(signum, frame):
        seen.append((signum, opt.t))

    old = signal.signal(signal.SIGINT, handler)
    try:
        real = PreparedStep._step

        def interrupted(self, *args):
            signal.raise_signal(signal.SIGINT)
            return real(self, *args)

        monkeypatch.setattr(PreparedStep, "_step", interrupted)
        opt.step(grads)
        monkeypatch.undo()
        assert seen == [(signal.SIGINT, 1)]  # called once, after t advanced
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, old)


def test_random_ctrl_c_never_splits_a_step(python_sigint):
    """SIGINT sent at random times by another thread while the main thread steps: after each
    KeyboardInterrupt, the arrays hold exactly ``t`` whole steps (before the deferral, 6 of
    13 such interrupts left a two-group step half applied)."""
    opt, params, grads = two_group_adam()
    ref = Reference()
    delays = np.random.default_rng(0).uniform(0.0005, 0.004, 12)
    stepping = threading.Event()
    interrupts = 0

    def ctrl_c():
        for d in delays:
            stepping.wait()
            stepping.clear()
            time.sleep(d)
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=ctrl_c, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a lost interrupt fails the test instead of hanging it
    while interrupts < len(delays):
        try:
            stepping.set()  # the sender waits for this: the signal lands inside this loop
            while time.monotonic() < deadline:
                opt.step(grads)
            pytest.fail(f"only {interrupts} of {len(delays)} SIGINTs raised KeyboardInterrupt "
                        f"within 120 s")
        except KeyboardInterrupt:
            interrupts += 1
            ref.assert_matches(opt.t, *state_of(opt, params))
    thread.join(timeout=10)
    assert opt.t > 0


def test_steps_in_another_thread_are_not_deferred(python_sigint):
    opt, params, grads = two_group_adam(100)
    errors = []
    thread = threading.Thread(target=lambda: [opt.step(grads) for _ in range(3)])
    thread.start()
    thread.join()
    assert opt.t == 3 and not errors
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_checkpoints_taken_while_another_thread_steps_are_whole_steps(tmp_path):
    """Without the per-object lock, state_dict copied some slots before a step and some after
    (7 of 7 torn); every checkpoint must now equal the state after exactly its ``t`` steps."""
    opt, params, grads = two_group_adam()
    stop = threading.Event()

    def stepper():
        while not stop.is_set():
            opt.step(grads)

    thread = threading.Thread(target=stepper)
    thread.start()
    states, files = [], []

    def after_another_step(seen):
        # the GIL may keep the stepper waiting: let it take at least one step between checkpoints
        deadline = time.monotonic() + 30
        while opt.t == seen and time.monotonic() < deadline:
            time.sleep(0.0005)

    try:
        while len(states) < 12 or len(files) < 4:
            if len(states) < 12:
                states.append(opt.state_dict())
                after_another_step(states[-1]["t"])
            if len(files) < 4:
                path = tmp_path / f"c{len(files)}.npz"
                seen = opt.t
                opt.save(path)
                files.append(path)
                after_another_step(seen)
    finally:
        stop.set()
        thread.join()
    ref = Reference()
    loaded = []
    for path in files:
        fresh, fresh_params, _ = two_group_adam()
        fresh.load(path)
        loaded.append((fresh.t, state_of(fresh, fresh_params)))
    ts = sorted({s["t"] for s in states} | {t for t, _ in loaded})
    assert len(ts) >= 3  # the stepper really ran between checkpoints
    for t in ts:
        ref_params, ref_slots = ref.at(t)
        for s in states:
            if s["t"] == t:
                for name in ref_slots:
                    for a, b in zip(s[name], ref_slots[name]):
                        np.testing.assert_array_equal(a, b)
        for lt, (p, slots) in loaded:
            if lt == t:
                ref.assert_matches(t, p, slots)


def test_load_runs_the_constructors_checks(tmp_path):
    p = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"^eps: 1e-50 rounds to 0 in float32"):
        fastadam.Adam([p], eps=1e-50)
    opt = fastadam.Adam([p])
    with pytest.raises(ValueError, match=r"^eps: 1e-50 rounds to 0 in float32"):
        opt.set_hyperparameters(eps=1e-50)
    # a float64 optimizer may hold it: its checkpoint is refused by a float32 one
    p64 = np.ones(4)
    source = fastadam.Adam([p64], eps=1e-50)
    source.step([np.ones(4)])
    state = source.state_dict()
    state["m"] = [a.astype(np.float32) for a in state["m"]]
    state["v"] = [a.astype(np.float32) for a in state["v"]]
    with pytest.raises(ValueError, match=r"state\['param_groups'\]\[0\]: eps: 1e-50 rounds to "
                                         r"0 in float32"):
        opt.load_state_dict(state)
    assert opt.t == 0 and opt.param_groups[0]["eps"] == 1e-8
    # the same in a file: a float32 checkpoint whose metadata says eps=1e-50
    src32 = fastadam.Adam([np.ones(4, np.float32)], eps=1e-30)
    src32.step([np.ones(4, np.float32)])
    path = tmp_path / "c.npz"
    src32.save(path)
    import io
    import json
    import zipfile
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    meta = json.loads(np.load(io.BytesIO(entries["meta.npy"])).tobytes())
    meta["param_groups"][0]["eps"] = 1e-50
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(json.dumps(meta).encode(), np.uint8))
    entries["meta.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in entries.items():
            zf.writestr(n, data)
    with pytest.raises(ValueError, match=r"meta\['param_groups'\]\[0\]: eps: 1e-50 rounds to 0 "
                                         r"in float32"):
        opt.load(path)
    assert opt.t == 0 and np.all(p == 1)


@pytest.mark.parametrize("schedule", [schedules.exponential(1.0, 10.0),
                                      schedules.step(1.0, 1, 10.0)])
def test_schedules_that_overflow_raise_value_error(schedule):
    assert schedule(10) == pytest.approx(1e10)
    with pytest.raises(ValueError, match=r"learning rate at step k=400 overflows float64"):
        schedule(400)
    opt = fastadam.Adam([np.ones(3)], lr=schedule)
    opt.t = 400
    with pytest.raises(ValueError, match="overflows float64"):
        opt.step([np.ones(3)])
    assert opt.t == 400


def test_schedule_step_numbers_are_checked():
    with pytest.raises(ValueError, match="k: expected an int >= 0, got -1"):
        schedules.constant(0.1)(-1)
    with pytest.raises(TypeError, match="k: expected an int, got float"):
        schedules.constant(0.1)(1.5)


def test_an_optimizer_pickles_without_its_lock():
    opt, params, grads = two_group_adam(10)
    opt.step(grads)
    twin = pickle.loads(pickle.dumps(opt))
    assert twin.t == 1 and twin._lock is not opt._lock
    twin.step([g.copy() for g in grads])
    assert twin.t == 2
