"""``python -m fastadam``: argparse commands, the demo, and the bench's table and flags."""
import io
import json
import subprocess
import sys

import pytest

import fastadam
import fastadam.__main__ as cli
from fastadam.bench import _report


def test_demo_recovers_the_true_weights(capsys):
    err = cli.demo(epochs=10)
    out = capsys.readouterr().out
    assert err < 0.05
    assert "fastadam vs NumPy Adam" in out


def test_version_prints_only_the_version():
    out = subprocess.run([sys.executable, "-m", "fastadam", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == f"fastadam {fastadam.__version__}"  # no demo ran first


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "bench", "config", "--version"):
        assert command in out
    assert "epoch" not in out


def test_bench_help_names_its_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    for option in ("--threads", "--quick", "--out", "--no-torch"):
        assert option in out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_config_command_writes_json(tmp_path, capsys):
    path = tmp_path / "config.json"
    assert cli.main(["config", "--out", str(path)]) == 0
    assert "simd_level" in capsys.readouterr().out
    assert json.loads(path.read_text())["version"] == fastadam.__version__


def test_demo_command_with_threads(capsys):
    assert cli.main(["demo", "--quick", "--threads", "1"]) == 0
    assert "after 160 steps" in capsys.readouterr().out  # 10 epochs of 16 minibatches


def _rows(rates, spread=0.05):
    """Bench rows from {(impl, size, threads): elements/s}."""
    return [dict(impl=i, size=s, threads=t, seconds=s / r, elements_per_s=r, low=r, high=r,
                 gb_per_s=r * 28e-9, spread=spread, flag=None)
            for (i, s, t), r in rates.items()]


def test_flags_threads_much_slower_than_one():
    rows = _report.flag_implausible(_rows({
        ("fastadam", 10**6, 1): 3e9, ("fastadam", 10**6, 2): 1e8,
        ("stream_rw_f32", 10**6, 1): 3e9, ("stream_rw_f32", 10**6, 2): 4e9}))
    flags = {(r["impl"], r["threads"]): r["flag"] for r in rows}
    assert "2 threads 30x slower than 1" in flags[("fastadam", 2)]
    assert flags[("fastadam", 1)] is None and flags[("stream_rw_f32", 2)] is None


def test_flags_faster_than_the_bandwidth_allows():
    rows = _report.flag_implausible(_rows({
        ("fastadam", 10**7, 1): 3e9, ("stream_rw_f32", 10**7, 1): 1e9,
        ("fastadam", 10**4, 1): 3e9, ("stream_rw_f32", 10**4, 1): 1e9}))  # in cache: allowed
    flags = {(r["impl"], r["size"]): r["flag"] for r in rows}
    assert flags[("fastadam", 10**7)] == "300% of the bandwidth yardstick: faster than its bytes allow"
    assert flags[("fastadam", 10**4)] is None


def test_flags_rounds_that_disagree():
    rows = _report.flag_implausible(_rows({("numpy", 10**5, 1): 1e8}, spread=1.5))
    assert rows[0]["flag"] == "rounds disagree (interquartile range 150% of the median)"


def test_table_without_torch_has_no_torch_column():
    rows = _report.flag_implausible(_rows({
        ("fastadam", 10**6, 1): 2e9, ("numpy", 10**6, 1): 4e8,
        ("stream_rw_f32", 10**6, 1): 2.5e9}))
    out = io.StringIO()
    _report.print_table(rows, file=out)
    text = out.getvalue()
    assert "torch" not in text.splitlines()[1] and "nan" not in text
    assert "fastadam Melem/s" in text and "fa/NumPy (x)" in text and "of DRAM (%)" in text
    assert "no torch columns" in text


def test_measure_dense_rows_have_spread():
    rows = _report.measure_dense(sizes=(4096,), threads=(1,), repeats=3, min_time=0.0,
                                 torch=False)
    assert {r["impl"] for r in rows} == {"fastadam", "numpy", "stream_rw_f32"}
    for r in rows:
        assert r["low"] <= r["elements_per_s"] <= r["high"]


def test_console_script_declared_and_installed():
    """pyproject declares the ``fastadam`` command; where fastadam is installed (CI installs it
    with pip), the command runs and prints the same version as ``python -m fastadam``."""
    import importlib.metadata
    import pathlib
    import shutil

    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.exists() and sys.version_info >= (3, 11):
        import tomllib

        scripts = tomllib.loads(pyproject.read_text())["project"]["scripts"]
        assert scripts["fastadam"] == "fastadam.__main__:main"
    try:
        dist = importlib.metadata.distribution("fastadam")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fastadam is not installed (an in-place build): no console script")
    assert dist.metadata["Author"] or dist.metadata["Author-email"]
    command = shutil.which("fastadam", path=str(pathlib.Path(sys.executable).parent))
    assert command, "the fastadam console script is not installed beside this Python"
    out = subprocess.run([command, "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"fastadam {fastadam.__version__}"
