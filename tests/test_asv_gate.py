"""The comparison logic of the asv regression gate (asv_bench/gate.py) on synthetic asv results
JSON (asv 0.6's results format, version 2): no asv run, no timing.  Each case builds the two
result files by hand, so the expected verdict follows from the numbers written here."""
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "asv_bench"))
import gate  # noqa: E402

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
           "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat",
           "samples", "profile"]
HIGHER = "x (torch time / fastadam time), higher is better"
LOWER = "seconds per step, lower is better"
SPEEDUP = "bench_dense.DenseSpeedupVsTorch.track_speedup_vs_torch_fused"
SPARSE = "bench_sparse.SparseRatioVsTorch.track_speedup_vs_torch_sparse_adam"
TIME = "bench_dense.DenseStep.time_fastadam_step"
UNITS = {SPEEDUP: HIGHER, SPARSE: HIGHER, TIME: "seconds",
         "bench_x.Lower.track_latency": LOWER, "bench_x.Plain.track_score": "accuracy"}


def results_file(commit, benchmarks, date=1):
    """An asv results dict: ``benchmarks`` maps name -> (values, params[, version])."""
    results = {}
    for name, spec in benchmarks.items():
        values, params = spec[0], spec[1]
        version = spec[2] if len(spec) > 2 else "v1"
        results[name] = [values, params, version, 0, 1.0] + [None] * (len(COLUMNS) - 5)
    return {"commit_hash": commit, "env_name": "existing-py", "date": date, "params": {},
            "requirements": {}, "result_columns": COLUMNS, "results": results, "version": 2}


def verdicts(old, new, factors=(("", 1.5),)):
    rows = gate.compare(gate.load_results(json.loads(json.dumps(old))),
                        gate.load_results(json.loads(json.dumps(new))), UNITS, list(factors))
    return {(r[0], r[1]): r[5] for r in rows}, rows


SPEEDUP_PARAMS = [["100000", "10000000"], ["1", "2"]]


def test_drop_beyond_factor_fails():
    old = results_file("a" * 40, {SPEEDUP: ([4.0, 4.0, 4.0, 4.0], SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([4.0, 2.0, 4.0, 4.0], SPEEDUP_PARAMS)})
    status, rows = verdicts(old, new)
    assert status[(SPEEDUP, ("100000", "2"))] == "REGRESSED"
    assert [s for s in status.values()].count("ok") == 3
    change = next(r[4] for r in rows if r[1] == ("100000", "2"))
    assert change == pytest.approx(0.5)


def test_drop_within_factor_passes():
    old = results_file("a" * 40, {SPEEDUP: ([4.0] * 4, SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([3.0, 2.7, 4.0, 4.0], SPEEDUP_PARAMS)})
    status, _ = verdicts(old, new)  # 4/1.5 = 2.67: both drops stay above it
    assert set(status.values()) == {"ok"}


def test_improvement_passes():
    old = results_file("a" * 40, {SPEEDUP: ([2.0] * 4, SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([20.0] * 4, SPEEDUP_PARAMS)})
    status, _ = verdicts(old, new)
    assert set(status.values()) == {"ok"}


def test_lower_is_better_direction():
    name = "bench_x.Lower.track_latency"
    old = results_file("a" * 40, {name: ([1.0, 1.0], [["small", "large"]])})
    new = results_file("b" * 40, {name: ([0.2, 2.0], [["small", "large"]])})
    status, _ = verdicts(old, new)
    assert status[(name, ("small",))] == "ok"          # 5x lower: better
    assert status[(name, ("large",))] == "REGRESSED"   # 2x higher: worse by more than 1.5


def test_higher_is_better_rise_of_lower_is_better_size_passes():
    # the same 2x rise that regresses a lower-is-better benchmark is fine for a speed-up
    old = results_file("a" * 40, {SPEEDUP: ([1.0] * 4, SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([2.0] * 4, SPEEDUP_PARAMS)})
    status, _ = verdicts(old, new)
    assert set(status.values()) == {"ok"}


def test_missing_and_skipped_are_reported_not_failed():
    old = results_file("a" * 40, {SPEEDUP: ([4.0, 4.0, 4.0, 4.0], SPEEDUP_PARAMS)})
    # new: one combination skipped (NaN), one failed (null), the sparse benchmark only new
    new = results_file("b" * 40, {
        SPEEDUP: ([float("nan"), None, 4.0, 4.0], SPEEDUP_PARAMS),
        SPARSE: ([5.0, 4.0], [["uniform", "zipf"]])})
    status, _ = verdicts(old, new)
    assert status[(SPEEDUP, ("100000", "1"))] == "missing"
    assert status[(SPEEDUP, ("100000", "2"))] == "missing"
    assert status[(SPARSE, ("uniform",))] == "missing"
    assert "REGRESSED" not in status.values()


def test_benchmark_absent_from_new_run_is_reported():
    old = results_file("a" * 40, {SPARSE: ([5.0, 4.0], [["uniform", "zipf"]])})
    new = results_file("b" * 40, {})
    status, _ = verdicts(old, new)
    assert set(status.values()) == {"missing"} and len(status) == 2


def test_whole_benchmark_failed_is_missing():
    old = results_file("a" * 40, {SPARSE: ([5.0, 4.0], [["uniform", "zipf"]])})
    new = results_file("b" * 40, {SPARSE: (None, [["uniform", "zipf"]])})
    status, _ = verdicts(old, new)
    assert set(status.values()) == {"missing"}


def test_time_benchmarks_ignored():
    old = results_file("a" * 40, {TIME: ([1e-6, 1e-3], [["1000", "1000000"]])})
    new = results_file("b" * 40, {TIME: ([1e-3, 1.0], [["1000", "1000000"]])})  # 1000x slower
    status, rows = verdicts(old, new)
    assert rows == []


def test_track_without_direction_not_gated():
    name = "bench_x.Plain.track_score"
    old = results_file("a" * 40, {name: ([0.9], [["digits"]])})
    new = results_file("b" * 40, {name: ([0.1], [["digits"]])})
    status, _ = verdicts(old, new)
    assert status == {(name, ("digits",)): "not gated"}


def test_changed_benchmark_code_not_gated():
    old = results_file("a" * 40, {SPARSE: ([5.0, 4.0], [["uniform", "zipf"]], "v1")})
    new = results_file("b" * 40, {SPARSE: ([1.0, 1.0], [["uniform", "zipf"]], "v2")})
    status, _ = verdicts(old, new)
    assert set(status.values()) == {"changed"}


def test_factor_per_family():
    old = results_file("a" * 40, {SPEEDUP: ([4.0] * 4, SPEEDUP_PARAMS),
                                  SPARSE: ([4.0, 4.0], [["uniform", "zipf"]])})
    new = results_file("b" * 40, {SPEEDUP: ([2.5] * 4, SPEEDUP_PARAMS),
                                  SPARSE: ([2.5, 2.5], [["uniform", "zipf"]])})
    factors = (("bench_sparse.", 2.0), ("", 1.5))   # 4/2.5 = 1.6: between the two factors
    status, _ = verdicts(old, new, factors)
    assert {s for (n, _), s in status.items() if n == SPARSE} == {"ok"}
    assert {s for (n, _), s in status.items() if n == SPEEDUP} == {"REGRESSED"}


def test_unparametrized_benchmark():
    name = "bench_x.Lower.track_latency"
    old = results_file("a" * 40, {name: (1.0, [])})
    new = results_file("b" * 40, {name: (3.0, [])})
    status, _ = verdicts(old, new)
    assert status == {(name, ()): "REGRESSED"}


def test_direction_from_unit():
    assert gate.direction(HIGHER) == 1
    assert gate.direction(LOWER) == -1
    assert gate.direction("GB/s") is None
    assert gate.direction(None) is None


def test_newest_stored_commit_and_merge(tmp_path):
    mdir = tmp_path / gate.MACHINE
    mdir.mkdir()
    (mdir / "machine.json").write_text(json.dumps({"machine": gate.MACHINE}))
    old_a = results_file("a" * 40, {SPARSE: ([5.0, float("nan")], [["uniform", "zipf"]])},
                         date=1)
    old_a2 = results_file("a" * 40, {SPARSE: ([6.0, 3.0], [["uniform", "zipf"]])}, date=2)
    old_c = results_file("c" * 40, {SPARSE: ([1.0, 1.0], [["uniform", "zipf"]])})
    for i, data in enumerate([old_a, old_a2, old_c]):
        (mdir / f"{i}.json").write_text(json.dumps(data))
    by_commit = gate.stored_by_commit(str(mdir))
    assert sorted(by_commit) == ["a" * 40, "c" * 40]
    # newest first: "b" has no results, "a" is the newest with some, "c" is older
    _, commits = gate.baseline(["b" * 40, "a" * 40, "c" * 40], by_commit, depth=1)
    assert commits == ["a" * 40]
    assert gate.baseline(["b" * 40], by_commit) == ({}, [])
    merged = gate.merged_results(by_commit["a" * 40])
    assert merged[(SPARSE, ("uniform",))][0] == 6.0      # the later file wins
    assert merged[(SPARSE, ("zipf",))][0] == 3.0


def test_format_table_lists_every_row():
    old = results_file("a" * 40, {SPEEDUP: ([4.0] * 4, SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([1.0, 4.0, 4.0, 4.0], SPEEDUP_PARAMS)})
    _, rows = verdicts(old, new)
    text = gate.format_table(rows, [("", 1.5)])
    assert text.count("\n") == 4 and "REGRESSED" in text and "0.25" in text
    assert math.isclose(rows[0][4], 0.25)


def test_main_compares_files_and_exits_1_on_regression(tmp_path, capsys):
    old = results_file("a" * 40, {SPEEDUP: ([4.0] * 4, SPEEDUP_PARAMS)})
    # the 1e7, 1-thread ratio falls to a quarter (gated with factor 2 in gate.FACTORS)
    new = results_file("b" * 40, {SPEEDUP: ([4.0, 4.0, 1.0, 4.0], SPEEDUP_PARAMS)})
    (tmp_path / "benchmarks.json").write_text(json.dumps({SPEEDUP: {"unit": HIGHER}}))
    for name, data in (("old.json", old), ("new.json", new)):
        (tmp_path / name).write_text(json.dumps(data))
    argv = ["--results-dir", str(tmp_path), "--baseline", str(tmp_path / "old.json")]
    assert gate.main(argv + ["--new", str(tmp_path / "new.json")]) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert gate.main(argv + ["--new", str(tmp_path / "old.json")]) == 0


def test_factor_per_parameter_combination_and_too_noisy():
    old = results_file("a" * 40, {SPEEDUP: ([4.0] * 4, SPEEDUP_PARAMS)})
    new = results_file("b" * 40, {SPEEDUP: ([1.0] * 4, SPEEDUP_PARAMS)})  # all 4x worse
    factors = ((r"bench_dense\.DenseSpeedupVsTorch\.\w+\(100000, ", None),  # not gated
               (r".*\(10000000, 1\)", 5.0), ("", 1.5))
    status, _ = verdicts(old, new, factors)
    assert status[(SPEEDUP, ("100000", "1"))] == "too noisy"
    assert status[(SPEEDUP, ("100000", "2"))] == "too noisy"
    assert status[(SPEEDUP, ("10000000", "1"))] == "ok"          # 4x is within 5
    assert status[(SPEEDUP, ("10000000", "2"))] == "REGRESSED"   # 4x is beyond 1.5


def test_baseline_is_the_median_of_the_newest_stored_runs(tmp_path):
    # one stored run that caught a noisy moment (8.5 between 3.3 and 3.7) must not set the bar
    by_commit = {}
    for commit, value, version in [("a" * 40, 8.5, "v1"), ("b" * 40, 3.3, "v1"),
                                   ("c" * 40, 3.7, "v1"), ("d" * 40, 100.0, "v1"),
                                   ("e" * 40, 1.0, "v1")]:
        by_commit[commit] = [results_file(commit, {SPEEDUP: ([value] * 4, SPEEDUP_PARAMS),
                                                   SPARSE: ([value, None], [["uniform", "zipf"]],
                                                            version)})]
    ancestors = ["x" * 40, "a" * 40, "b" * 40, "c" * 40, "d" * 40, "e" * 40]
    old, commits = gate.baseline(ancestors, by_commit)
    assert commits == ["a" * 40, "b" * 40, "c" * 40]  # the newest three, "d" and "e" unused
    assert old[(SPEEDUP, ("100000", "1"))] == (3.7, "v1")
    assert old[(SPARSE, ("zipf",))] == (None, "v1")  # skipped everywhere: no value
    new = gate.load_results(results_file("f" * 40, {SPEEDUP: ([2.0] * 4, SPEEDUP_PARAMS)}))
    status = {(r[0], r[1]): r[5] for r in gate.compare(old, new, UNITS, [("", 2.0)])}
    assert status[(SPEEDUP, ("100000", "1"))] == "ok"  # 2.0 / 3.7 = 0.54 > 1/2
    # against the newest run alone (8.5) the same value would have failed
    alone = gate.merged_results(by_commit["a" * 40])
    status = {(r[0], r[1]): r[5] for r in gate.compare(alone, new, UNITS, [("", 2.0)])}
    assert status[(SPEEDUP, ("100000", "1"))] == "REGRESSED"


def test_baseline_counts_only_the_newest_benchmark_version():
    by_commit = {c: [results_file(c, {SPARSE: ([v, v], [["uniform", "zipf"]], ver)})]
                 for c, v, ver in [("a" * 40, 2.0, "v2"), ("b" * 40, 50.0, "v1"),
                                   ("c" * 40, 60.0, "v1")]}
    old, _ = gate.baseline(["a" * 40, "b" * 40, "c" * 40], by_commit)
    assert old[(SPARSE, ("uniform",))] == (2.0, "v2")


def test_slowest_ranks_benchmarks_by_duration_across_files():
    a = results_file("a" * 40, {SPEEDUP: ([1.0], [["1"]]), SPARSE: ([1.0], [["1"]])})
    b = results_file("a" * 40, {TIME: ([1.0], [["1"]])})
    col = COLUMNS.index("duration")
    a["results"][SPEEDUP][col], a["results"][SPARSE][col], b["results"][TIME][col] = 3.0, 40.0, 7.5
    lines = gate.slowest([a, b], n=2)
    assert "50 s over 3 benchmarks" in lines[0]
    assert [line.split()[-1] for line in lines[1:]] == [SPARSE, TIME]
