"""The wall-time A/B gate (asv_bench/ab_gate.py): its rule on given per-round ratios (a clean
1.3x fails, noise inside the A/A band passes, a loaded A/A widens the band), and end to end on
this checkout against itself: a case made to run 2x its calls fails, the unchanged build
passes."""
import math
import os
import random
import sys

import pytest


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "asv_bench"))
import ab_gate  # noqa: E402


def noisy_logs(center, spread, n=15, seed=0):
    rng = random.Random(seed)
    return [math.log(center) + rng.gauss(0.0, spread) for _ in range(n)]


def test_a_clean_slowdown_of_thirteen_tenths_fails():
    ratio, threshold, failed = ab_gate.judge(noisy_logs(1.3, 0.03), noisy_logs(1.0, 0.03, seed=1))
    assert failed and 1.25 < ratio < 1.35 and threshold < 1.2


def test_noise_inside_the_band_passes_and_the_floor_holds():
    ratio, threshold, failed = ab_gate.judge(noisy_logs(1.05, 0.03), noisy_logs(1.0, 0.03, seed=1))
    assert not failed and threshold == ab_gate.FLOOR


def test_a_loaded_aa_run_widens_the_band():
    quiet = ab_gate.judge(noisy_logs(1.2, 0.02), noisy_logs(1.0, 0.02, seed=2))
    loaded = ab_gate.judge(noisy_logs(1.2, 0.3), noisy_logs(1.0, 0.3, seed=2))
    assert quiet[2] and not loaded[2]
    assert loaded[1] > quiet[1]


CASES = "step_inplace/list100x1000|sparse/lazy/zipf/row64"


@pytest.fixture
def built_checkout():
    """The end-to-end runs time this checkout's in-place build against itself; against an
    installed fastadam (the wheel's test run) there is no checkout build to time."""
    import fastadam

    here = os.path.realpath(os.path.dirname(os.path.dirname(fastadam.__file__)))
    if here != os.path.realpath(REPO):
        pytest.skip("fastadam is installed, not built in place in this checkout")


def test_the_gate_fails_an_injected_slowdown_end_to_end(capsys, built_checkout):
    status = ab_gate.main(["--base-root", REPO, "--cases", CASES,
                           "--inject", "sparse/lazy/zipf/row64=2.0"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "FAIL: sparse/lazy/zipf/row64" in out


def test_the_gate_passes_the_unchanged_build_end_to_end(capsys, built_checkout):
    status = ab_gate.main(["--base-root", REPO, "--cases", CASES])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "wall-time A/B gate: pass" in out


class _FakeWorker:
    """A worker whose candidate is 1.5x slower on every call, with the given loaded files."""

    files_of = {}

    def __init__(self, root, label, env_extra=None):
        self.label = label
        self.facts = {"fastadam": os.path.join(root, "fastadam", "__init__.py"), "level": "x"}

    def time(self, name, calls):
        return 1.5e-6 if self.label.startswith("candidate") else 1.0e-6

    def files(self):
        return self.files_of[self.label.split("-")[0]]

    def close(self):
        pass


@pytest.mark.parametrize("same", [True, False])
def test_a_slowdown_with_the_same_code_on_both_sides_is_placement(monkeypatch, capsys, same):
    # the rule for a case that fails twice: it fails the gate unless every fastadam file the
    # case loaded is byte-identical in the base and the candidate
    monkeypatch.setattr(ab_gate, "Worker", _FakeWorker)
    monkeypatch.setattr(_FakeWorker, "files_of", {
        "base": {"_core/_sparse.so": "aa", "__init__.py": "bb"},
        "candidate": {"_core/_sparse.so": "aa" if same else "cc", "__init__.py": "bb"}})
    out = ab_gate.measure("/base", "/cand", ["sparse/lazy/zipf/row64"], 5)
    ratio, threshold, failed, aa = out["sparse/lazy/zipf/row64"]
    assert ratio == pytest.approx(1.5) and failed is (not same)
    assert ("not a regression" in capsys.readouterr().out) is same
    # an injected slowdown (the gate's own end-to-end test) is never excused
    injected = ab_gate.measure("/base", "/cand", ["sparse/lazy/zipf/row64"], 5,
                               inject="sparse/lazy/zipf/row64=1.5")
    assert injected["sparse/lazy/zipf/row64"][2] is True
