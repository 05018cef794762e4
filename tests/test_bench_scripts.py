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
]


@pytest.mark.parametrize("script,args,expect", SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_report_script_runs(script, args, expect):
    if script == "robustness_report.py":
        pytest.importorskip("onnx")  # its second table; the first needs only fastadam
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, os.path.join(REPO, "asv_bench", script), *args],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert expect in run.stdout, run.stdout[-3000:]
