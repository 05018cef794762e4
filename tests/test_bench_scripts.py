"""The report scripts of asv_bench/ that reach into fastadam's internals still run.

They are the commands the docs cite for their figures, and an internal change can break one
without any other test noticing (robustness_report.py read ``Optimizer.step.__wrapped__`` long
after ``step`` had become a compiled function).  Each runs here once at a toy size: the test
checks that it finishes and prints its table, never a timing."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# script, arguments for a short run, a fragment of the table it prints
SCRIPTS = [
    ("robustness_report.py", ["--repeats", "1"], "guarded"),
    ("step_overhead_report.py", ["--repeat", "1"], "Adam.step"),
    ("lowp_kernels_quick.py", ["--n", "20000", "--rounds", "1", "--threads", "1"],
     "int8 states"),
    ("threads_report.py", ["--quick"], "thread"),
    ("embedding_report.py", ["--quick"], "adagrad"),
]


@pytest.mark.parametrize("script,args,expect", SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_report_script_runs(script, args, expect):
    if script == "robustness_report.py":
        pytest.importorskip("onnx")  # its second table; the first needs only fastadam
    if script == "embedding_report.py":
        pytest.importorskip("torch")  # its baselines (FBGEMM's columns are not run here)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, os.path.join(REPO, "asv_bench", script), *args],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert expect in run.stdout, run.stdout[-3000:]


def test_lowp_code_floor_builds_and_its_codes_are_exact(tmp_path):
    """asv_bench/lowp_code_floor.c (the measurement behind the 8-bit paragraph of the
    performance page) builds with the command in its header, and its two exact variants give
    the codes of lowp.h's search."""
    import shutil
    source = os.path.join(REPO, "asv_bench", "lowp_code_floor.c")
    if not os.path.exists(source) or not os.path.isdir(os.path.join(REPO, "include")):
        pytest.skip("needs the source tree (the wheel's test run has only the scripts)")
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    from fastadam._core._cpu_level import CPU_BEST
    if CPU_BEST != "x86-64-v4":
        pytest.skip("needs AVX-512 (x86-64-v4)")
    exe = str(tmp_path / "lowp_code_floor")
    build = subprocess.run(["gcc", "-O3", "-std=gnu11", "-fopenmp-simd", "-fno-math-errno",
                            "-ffp-contract=off", "-march=x86-64-v4", "-Iinclude", source, "-o",
                            exe, "-lm"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("codes exact") == 2, run.stdout
