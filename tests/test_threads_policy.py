"""The default thread policy: libgomp's bounded wait and the measured choice of 1 or N threads."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastadam
from fastadam._core import _threads
from fastadam._core._threads import AdaptiveThreads


class FakeClock:
    """perf_counter that advances by the cost the fake step charges for its thread count."""

    def __init__(self):
        self.now = 0.0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(_threads, "_perf_counter", c)
    monkeypatch.setattr(_threads, "resolve_num_threads", lambda n: 4)  # four cores, say
    return c


def make_step(clock, cost):
    """A step whose time is cost[threads] (a number or a zero-argument function)."""
    used = []

    def step(arg, n):
        used.append(n)
        c = cost[n]
        clock.now += c() if callable(c) else c
        return arg

    return step, used


def run_steps(chooser, step, count, total=10**6, kind=0):
    for _ in range(count):
        assert chooser.run(step, ("ok",), total, kind) == "ok"


def test_picks_n_threads_when_measurably_faster(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 4.0, 4: 1.0})
    run_steps(chooser, step, 200)
    assert chooser.choice(10**6) == "parallel"
    assert used[:6] == [1, 4, 1, 4, 1, 4]  # FIRST steps on each count, alternating
    assert used[6:].count(4) >= 190


def test_keeps_one_thread_when_n_threads_are_not_measurably_faster(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 1.0, 4: 0.95})  # 5% faster: inside the noise margin
    run_steps(chooser, step, 500)
    assert chooser.choice(10**6) == 1
    assert used[6:].count(4) <= 500 // AdaptiveThreads.PROBE_MIN


def test_busy_machine_probes_cost_at_most_the_budget(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 1.0, 4: 10.0})  # cores taken: N threads ten times slower
    run_steps(chooser, step, 6)
    start = clock.now
    run_steps(chooser, step, 5000)
    assert chooser.choice(10**6) == 1
    assert used[6:].count(4) >= 1  # it does look again
    assert clock.now - start <= 5000 * (1 + AdaptiveThreads.BUDGET)


def test_idle_machine_serial_probes_cost_at_most_the_budget(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 4.0, 4: 1.0})
    run_steps(chooser, step, 6)
    start = clock.now
    run_steps(chooser, step, 5000)
    assert used[6:].count(1) >= 1
    assert clock.now - start <= 5000 * (1 + AdaptiveThreads.BUDGET)


def test_a_busy_spell_sends_it_back_to_one_thread_and_the_speedup_returns(clock):
    chooser = AdaptiveThreads()
    cost = {1: 4.0, 4: 1.0}
    step, used = make_step(clock, cost)
    run_steps(chooser, step, 100)
    assert chooser.choice(10**6) == "parallel"
    cost[4] = 20.0  # another process takes the other cores
    n = len(used)
    run_steps(chooser, step, 10)
    assert chooser.choice(10**6) == 1
    assert used[n:n + 3] == [4, 4, 1]  # two slow steps move the median of the last three
    cost[4] = 1.0  # and leaves: a later probe wins the speed-up back
    run_steps(chooser, step, int(20 / AdaptiveThreads.BUDGET) + 10)
    assert chooser.choice(10**6) == "parallel"


def test_reprobing_is_bounded_on_a_steady_machine(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 1.0, 4: 1.5})
    run_steps(chooser, step, 20000)
    probes = chooser.summary()[(10**6).bit_length()]["probes"]
    # intervals 16, 32, ..., 1024, then 1024 apart: about 24 probes in 20,000 steps
    assert 5 <= probes <= 20000 // AdaptiveThreads.PROBE_MAX + 8
    assert chooser.summary()[(10**6).bit_length()]["probe_interval"] == AdaptiveThreads.PROBE_MAX


def test_one_thread_runs_untimed_between_probes(clock):
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 1.0, 4: 3.0})
    run_steps(chooser, step, 5000)
    probes = chooser.summary()[(10**6).bit_length()]["probes"]
    timed = 6 + probes * (AdaptiveThreads.PRE_PROBE + 1)
    assert clock.reads <= 2 * timed  # two clock reads per timed step, none on the others


def test_lucky_parallel_probes_do_not_win_a_busy_machine(clock):
    # A busy machine: N threads are sometimes quick, mostly slow (mean 2.3x serial).
    chooser = AdaptiveThreads()
    times = iter([0.5, 3.0, 3.0, 3.0] * 1000)
    step, used = make_step(clock, {1: 1.0, 4: lambda: next(times)})
    run_steps(chooser, step, 2000)
    assert used.count(4) / len(used) < 0.02


def test_a_preempted_serial_step_does_not_flip_the_choice(clock):
    chooser = AdaptiveThreads()
    serial = iter(([1.0] * 40 + [100.0]) * 200)  # one step in 41 loses its core for a while
    step, used = make_step(clock, {1: lambda: next(serial), 4: 2.0})
    run_steps(chooser, step, 4000)
    assert chooser.summary()[(10**6).bit_length()]["switches"] == 0
    assert used[6:].count(4) <= 4000 // 100


def test_a_machine_whose_speed_drifts_does_not_fool_it(clock):
    # Both counts slow down 4x together in spells (other jobs); N threads are always 20%
    # slower than one.  Times from different spells must not be compared with each other.
    chooser = AdaptiveThreads()
    steps = [0]

    def speed():
        steps[0] += 1
        return 4.0 if (steps[0] // 150) % 2 else 1.0

    step, used = make_step(clock, {1: lambda: speed(), 4: lambda: 1.2 * speed()})
    run_steps(chooser, step, 6000)
    assert chooser.summary()[(10**6).bit_length()]["switches"] == 0
    assert used.count(4) / len(used) < 0.02


def test_noise_near_the_margin_does_not_flap(clock):
    chooser = AdaptiveThreads()
    rng = np.random.default_rng(1)
    step, used = make_step(clock, {1: lambda: rng.uniform(0.9, 1.1),
                                   4: lambda: rng.uniform(0.8, 1.0)})  # 0.9x, +-10%
    run_steps(chooser, step, 5000)
    assert chooser.summary()[(10**6).bit_length()]["switches"] <= 2


def test_size_classes_and_kinds_are_separate(clock):
    chooser = AdaptiveThreads()
    step_small, _ = make_step(clock, {1: 1.0, 4: 3.0})
    step_large, _ = make_step(clock, {1: 30.0, 4: 10.0})
    for _ in range(8):
        chooser.run(step_small, (None,), 2**18, 0)
        chooser.run(step_large, (None,), 2**23, 0)
        chooser.run(step_small, (None,), 2**23, 2)
    assert chooser.choice(2**18) == 1
    assert chooser.choice(2**23) == "parallel"
    assert chooser.choice(2**23, 2) == 1


def test_one_usable_thread_never_measures(clock, monkeypatch):
    monkeypatch.setattr(_threads, "resolve_num_threads", lambda n: 1)
    chooser = AdaptiveThreads()
    step, used = make_step(clock, {1: 1.0})
    run_steps(chooser, step, 50)
    assert set(used) == {1} and clock.reads == 0 and chooser.classes == {}


def test_log_records_timed_steps(clock):
    chooser = AdaptiveThreads()
    chooser.log = []
    step, used = make_step(clock, {1: 2.0, 4: 1.0})
    run_steps(chooser, step, 6, total=1000)
    assert [(threads, what) for _, threads, _, what in chooser.log] == [(1, "first"),
                                                                           (4, "first")] * 3
    assert chooser.log[0][2] == pytest.approx(2.0 / 1000)


def test_default_threads_give_the_same_bits_as_one_thread(rng):
    n = 300_000  # above the parallel threshold
    x0 = rng.standard_normal(n).astype(np.float32)
    gs = [rng.standard_normal(n).astype(np.float32) for _ in range(40)]
    out = {}
    for nt in (None, 1):
        x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        for t, g in enumerate(gs, 1):
            fastadam.step_inplace(x, g, m, v, t, convention="torch", num_threads=nt)
        out[nt] = (x, m, v)
    for a, b in zip(out[None], out[1]):
        np.testing.assert_array_equal(a, b)


def test_the_dense_driver_runs_chosen_serial_steps_without_the_chooser(monkeypatch):
    if fastadam.config()["max_threads"] < 2:
        pytest.skip("one usable thread: the chooser never measures")
    ticks = iter(range(10**6))  # every timed step looks equally long: one thread is kept
    monkeypatch.setattr(_threads, "_perf_counter", lambda: float(next(ticks)))
    chooser = _threads.adaptive_threads
    chooser.reset()
    chooser.log = []
    try:
        x = np.zeros(2**18, np.float32)
        g, m, v = np.ones_like(x), np.zeros_like(x), np.zeros_like(x)
        for t in range(1, 401):
            fastadam.step_inplace(x, g, m, v, t, convention="torch")
        summary = chooser.summary()[(2**18).bit_length()]
        assert summary["choice"] == 1
        timed = 2 * AdaptiveThreads.FIRST + summary["probes"] * (AdaptiveThreads.PRE_PROBE + 1)
        assert len(chooser.log) <= timed < 100  # the other steps never reached the chooser
        assert chooser.steps == len(chooser.log)
    finally:
        chooser.log = None
        chooser.reset()


@pytest.mark.parametrize("mode", ["lazy", "dense"])
def test_sparse_default_threads_give_the_same_bits_and_go_through_the_chooser(rng, mode):
    x0 = rng.standard_normal((4000, 128)).astype(np.float32)
    steps = [(rng.integers(0, 4000, 2000), rng.standard_normal((2000, 128)).astype(np.float32))
             for _ in range(12)]
    _threads.adaptive_threads.reset()
    out = {}
    for nt in (None, 1):
        x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        for t, grad in enumerate(steps, 1):
            fastadam.sparse_step_inplace(x, grad, m, v, t, mode=mode, num_threads=nt)
        out[nt] = (x, m, v)
    for a, b in zip(out[None], out[1]):
        np.testing.assert_array_equal(a, b)
    if fastadam.config()["max_threads"] > 1:
        kinds = {c["kind"] for c in _threads.adaptive_threads.summary().values()}
        assert kinds == {{"lazy": 2, "dense": 3}[mode]}


def test_bounded_wait_is_set_for_fastadam_only():
    if not fastadam.config()["openmp"]:
        pytest.skip("serial build")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = ("import os, fastadam; print(fastadam.config()['omp_wait_policy']); "
            "print(os.environ.get('GOMP_SPINCOUNT'))")
    policy, left = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, check=True).stdout.splitlines()
    assert "GOMP_SPINCOUNT=0" in policy
    assert left == "None"  # the environment is put back for other libraries and children


def test_user_wait_policy_is_kept():
    env = dict(os.environ, OMP_WAIT_POLICY="active")
    env.pop("GOMP_SPINCOUNT", None)
    code = ("import os, fastadam; print(fastadam.config()['omp_wait_policy']); "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    policy, kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, check=True).stdout.splitlines()
    assert policy == "user: OMP_WAIT_POLICY=active"
    assert kept == "active"
