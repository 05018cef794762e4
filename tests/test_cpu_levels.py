"""Every compiled CPU level (include/fastadam/common.h, fastadam/_core/_cpu_level.py): the
kernels give the same bits at every level this machine runs, each compiled module runs the level
FASTADAM_CPU_LEVEL asks for, and a bad value or a cap above the CPU is reported.

The levels run in subprocesses (the level is fixed when fastadam is imported) over
tests/cpu_level_kernels.py's fixed set of kernels.  CI also runs the kernel test suites once per
level below the CPU's best (.ci/run)."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import fastadam
from fastadam._core import _cpu_level

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT_OF_FASTADAM = os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__)))


def run_python(args, level):
    """Run python with FASTADAM_CPU_LEVEL=level (None: unset) on the fastadam imported here."""
    env = dict(os.environ)
    env.pop(_cpu_level.ENV, None)
    if level is not None:
        env[_cpu_level.ENV] = level
    env["PYTHONPATH"] = os.pathsep.join([ROOT_OF_FASTADAM, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def kernel_outputs(tmp_path, level):
    path = tmp_path / f"{level}.npz"
    proc = run_python([os.path.join(HERE, "cpu_level_kernels.py"), str(path)], level)
    assert proc.returncode == 0, proc.stderr
    with np.load(path) as data:
        out = {k: data[k] for k in data.files}
    return json.loads(str(out.pop("levels"))), out


def test_every_level_gives_the_same_bits_and_runs_the_level_asked_for(tmp_path):
    levels = _cpu_level.supported_levels()
    results = {}
    for level in levels:
        asked = None if level == _cpu_level.PORTABLE else level
        facts, results[level] = kernel_outputs(tmp_path, asked)
        assert set(facts["modules"].values()) == {level}, facts
        assert facts["config"] == {"simd_level": level, "simd_cpu_best": _cpu_level.CPU_BEST,
                                   "simd_cap": f"{_cpu_level.ENV}={asked}" if asked else "none"}
    first, *others = levels
    assert len(results[first]) > 150  # every optimizer's dense step, sparse, autodiff kernels
    for level in others:
        assert results[level].keys() == results[first].keys()
        differ = [k for k in results[first]
                  if results[level][k].tobytes() != results[first][k].tobytes()]
        assert differ == [], f"{level} differs from {first} in {differ}"
    if len(levels) == 1:
        pytest.skip(f"this machine runs one level only ({first}): nothing to compare")


def test_unset_runs_the_cpus_best_level(tmp_path):
    proc = run_python(["-c", "import fastadam, json; c = fastadam.config(); print(json.dumps("
                       "[c['simd_level'], c['simd_cpu_best'], c['simd_cap']]))"], None)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [_cpu_level.CPU_BEST, _cpu_level.CPU_BEST, "none"]


def test_an_unknown_level_is_refused_at_import():
    proc = run_python(["-c", "import fastadam"], "avx9")
    assert proc.returncode != 0
    assert ("ValueError: FASTADAM_CPU_LEVEL='avx9': expected one of baseline, x86-64-v3, "
            "x86-64-v4 (or unset: the best level this CPU supports)") in proc.stderr


@pytest.mark.skipif(_cpu_level.CPU_BEST in ("x86-64-v4", _cpu_level.PORTABLE),
                    reason="the CPU runs the highest level (or a build without dispatch)")
def test_a_cap_above_the_cpu_runs_the_cpus_best_and_says_so():
    proc = run_python(["-c", "import fastadam; print(fastadam.config()['simd_level'])"],
                      "x86-64-v4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [_cpu_level.CPU_BEST]
    assert (f"RuntimeWarning: FASTADAM_CPU_LEVEL=x86-64-v4: this CPU supports "
            f"{_cpu_level.CPU_BEST} at most; the kernels run {_cpu_level.CPU_BEST}") in proc.stderr


# The resolution itself, for CPUs this machine is not (best: the CPU's level index).
@pytest.mark.parametrize("value, best, want", [
    (None, 2, (None, 2)), ("", 1, (None, 1)), ("  ", 0, (None, 0)),
    ("baseline", 2, ("baseline", 0)), ("X86-64-V3 ", 2, ("x86-64-v3", 1)),
    ("x86-64-v4", 2, ("x86-64-v4", 2)), ("x86-64-v3", 1, ("x86-64-v3", 1)),
    ("baseline", -1, ("baseline", -1)), (None, -1, (None, -1)),  # portable: accepted, ignored
])
def test_resolution_caps_the_cpus_level(value, best, want):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cpu_level._resolve(value, best) == want


@pytest.mark.parametrize("value, best, runs", [("x86-64-v4", 1, 1), ("x86-64-v4", 0, 0),
                                               ("x86-64-v3", 0, 0)])
def test_resolution_warns_when_the_cap_is_above_the_cpu(value, best, runs):
    with pytest.warns(RuntimeWarning, match=f"FASTADAM_CPU_LEVEL={value}: this CPU supports "
                                            f"{_cpu_level.LEVELS[best]} at most"):
        assert _cpu_level._resolve(value, best) == (value, runs)


@pytest.mark.parametrize("value", ["avx2", "v3", "native", "x86-64-v5", "portable"])
def test_resolution_refuses_unknown_values(value):
    with pytest.raises(ValueError, match=f"FASTADAM_CPU_LEVEL='{value}': expected one of "
                                         f"baseline, x86-64-v3, x86-64-v4"):
        _cpu_level._resolve(value, 1)
