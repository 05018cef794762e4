"""The instruction-count gate (asv_bench/instructions.py): its comparison fails a case that costs
1.3x its stored count and passes one at 1.2x; a case on one side only is reported, not failed;
the base is the newest ancestor with stored counts.  The end-to-end check (valgrind counts a
kernel made to do 1.3x the work and the gate exits 1) is marked slow."""
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "asv_bench"))
import instructions  # noqa: E402


def test_compare_fails_above_the_threshold_only():
    base = {"a": 1000, "b": 1000, "c": 1000}
    new = {"a": 1300, "b": 1200, "c": 700}
    lines, failed = instructions.compare(base, new)
    assert failed == ["a"]
    assert any("a" in ln and "FAIL" in ln for ln in lines)
    assert not any(ln.strip().startswith("b ") and "FAIL" in ln for ln in lines)


def test_compare_reports_a_case_on_one_side_only():
    lines, failed = instructions.compare({"old": 10, "kept": 10}, {"new": 50, "kept": 10})
    assert failed == []
    assert any("old" in ln and "only in base" in ln for ln in lines)
    assert any("new" in ln and "only in new" in ln for ln in lines)


def test_the_cases_cover_every_exported_optimizer():
    import fastadam

    names = instructions.cases()
    exported = [c for c in vars(fastadam).values() if isinstance(c, type)
                and issubclass(c, fastadam.Optimizer) and c is not fastadam.Optimizer
                and c.dense_gradients]  # (SparseAdam takes sparse gradients only)
    assert exported and fastadam.Adam in exported
    for cls in exported:
        for n in (1_000, 100_000):
            assert f"optimizer_step/{cls.__name__}/{n}" in names


def test_placed_arrays_keep_their_values_at_the_fixed_page_offsets():
    import numpy as np

    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(n).astype(dt) for n, dt in
              ((1000, np.float32), (7, np.float64), (100_000, np.float32), (3, np.int64),
               (5, np.float32))]
    junk = [np.empty(k * 977, np.uint8) for k in range(1, 9)]  # another heap history
    out = instructions.placed(arrays)
    del junk
    for k, (a, b) in enumerate(zip(arrays, out)):
        assert b.ctypes.data % 4096 == instructions.LAYOUT_STRIDE * (k % 4)
        assert b.dtype == a.dtype and b.shape == a.shape and b.flags.c_contiguous
        np.testing.assert_array_equal(a, b)
        assert not np.shares_memory(a, b)


def test_the_dense_step_case_places_its_four_arrays():
    import numpy as np

    call = instructions.cases()["step_inplace/adam/100000"]()
    arrays = [c.cell_contents for c in call.__closure__
              if isinstance(c.cell_contents, np.ndarray)]
    assert sorted(a.ctypes.data % 4096 for a in arrays) == [
        instructions.LAYOUT_STRIDE * k for k in range(4)]


def test_stored_ancestor_is_the_newest_stored_ancestor(tmp_path, monkeypatch):
    history = ["c3", "c2", "c1", "c0"]  # newest first, as git rev-list prints it
    monkeypatch.setattr(instructions, "git", lambda *args: "\n".join(history))
    monkeypatch.setattr(instructions, "STORE", str(tmp_path))
    for commit, count in (("c1", 11), ("c0", 10), ("other", 99)):
        (tmp_path / f"{commit}.json").write_text(json.dumps({"counts": {"k": count}}))
    assert instructions.stored_ancestor("c3") == ("c1", {"counts": {"k": 11}})
    history[:] = ["c1", "c0"]  # HEAD itself is never its own base
    assert instructions.stored_ancestor("c1") == ("c0", {"counts": {"k": 10}})


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_gate_fails_when_a_case_does_thirteen_tenths_of_the_work(tmp_path):
    # the base says the case cost 1/1.3 of what it costs now: as if the kernel had become 1.3x
    case = "sparse/lazy/zipf/row8"
    out = tmp_path / "now.json"
    run = [sys.executable, os.path.join(REPO, "asv_bench", "instructions.py"), "--cases",
           f"^{case}$"]
    subprocess.run(run + ["--out", str(out)], check=True, cwd=REPO, capture_output=True)
    record = json.loads(out.read_text())
    now = record["counts"][case]
    assert record["simd_level"] in ("baseline", "x86-64-v3")  # what valgrind's CPU offers
    for factor, expected_rc in ((1.3, 1), (1.0, 0)):
        base = tmp_path / "base.json"
        base.write_text(json.dumps({"counts": {case: round(now / factor)}}))
        proc = subprocess.run(run + ["--baseline", str(base)], cwd=REPO, capture_output=True,
                              text=True)
        assert proc.returncode == expected_rc, proc.stdout + proc.stderr
