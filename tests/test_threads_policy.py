"""The default thread policy: libgomp's bounded wait and the measured choice of 1 or N threads."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastadam
from fastadam import _threads
from fastadam._threads import AdaptiveThreads


class FakeClock:
    """perf_counter that advances by the cost the fake step charges for its thread count."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(_threads, "_perf_counter", c)
    return c


def make_step(clock, cost):
    used = []

    def step(n):
        used.append(n)
        clock.now += cost[n]
        return True

    return step, used


def test_busy_machine_settles_on_one_thread(clock):
    chooser = AdaptiveThreads()
    cost = {1: 1.0, 4: 3.0}  # four threads three times slower: cores are taken
    step, used = make_step(clock, cost)
    for _ in range(2000):
        assert chooser.run(step, 10**6, 4)
    assert used[:2] == [1, 4]  # both measured once
    probes = used[2:].count(4)
    assert 1 <= probes <= 12  # backs off: 16, 32, ..., 1024 steps between probes
    assert chooser.choice(10**6) == 1


def test_idle_machine_keeps_the_speedup_and_recovers_it(clock):
    chooser = AdaptiveThreads()
    cost = {1: 4.0, 2: 1.0}
    step, used = make_step(clock, cost)
    for _ in range(100):
        chooser.run(step, 10**6, 2)
    assert used[2:].count(1) <= 100 // AdaptiveThreads.PROBE_MIN + 1
    cost[2] = 10.0  # another process takes the second core
    for _ in range(20):
        chooser.run(step, 10**6, 2)
    assert chooser.choice(10**6) == 1
    cost[2] = 1.0  # and leaves: the next probe wins it back
    for _ in range(AdaptiveThreads.PROBE_MAX + 5):
        chooser.run(step, 10**6, 2)
    assert chooser.choice(10**6) == "parallel"


def test_size_classes_are_separate(clock):
    chooser = AdaptiveThreads()
    step_small, _ = make_step(clock, {1: 1.0, 2: 3.0})
    step_large, _ = make_step(clock, {1: 30.0, 2: 10.0})
    for _ in range(5):
        chooser.run(step_small, 2**18, 2)
        chooser.run(step_large, 2**23, 2)
    assert chooser.choice(2**18) == 1
    assert chooser.choice(2**23) == "parallel"


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


def test_lucky_parallel_probes_do_not_win_a_busy_machine(clock):
    # A busy machine: N threads are sometimes quick, mostly slow (mean 2.3x serial).
    chooser = AdaptiveThreads()
    times = iter([0.5, 3.0, 3.0, 3.0] * 1000)
    used = []

    def step(n):
        used.append(n)
        clock.now += 1.0 if n == 1 else next(times)
        return True

    for _ in range(2000):
        chooser.run(step, 10**6, 2)
    assert used.count(2) / len(used) < 0.02
