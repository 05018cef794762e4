"""How long installs take: a cold first ``pip install -e .``, then two more editable installs
with other extras (what a user does next), each in pip's own isolated build environment.

    python asv_bench/install_report.py [--repo PATH] [--keep] [--objects]

It clones the repository's HEAD into a temporary folder (so no build product or cache of the
working tree is used), makes a virtual environment there and times three commands:

    pip install -e .              cold: nothing cached
    pip install -e '.[sparse]'    second: setup.py's cache of generated C and object files
    pip install -e '.[plot]'      third

pip is upgraded and the extras' own packages (SciPy, Matplotlib) are installed first, untimed:
what is timed is fastadam's build and install, not downloading or unpacking other packages.
Wall seconds and CPU seconds (user + system of every child process) are printed for each.
pip's wheel cache serves setuptools, Cython and NumPy for the build environments, so the first
run of this script on a machine also downloads them; run it twice for the steady figures.
The cold install's CPU seconds are compared with BUDGET_CPU_S, the first build's budget on the
project's 2-core machine (issue 38).

--objects first builds a second clone in place, one job, with an empty object cache
(``setup.py build_ext --inplace``, the build requirements installed in the venv first), and
prints the CPU seconds of cythonize and of every compiled object, largest first (setup.py
records them in the file ``FASTADAM_BUILD_TIMES`` names): where a first build's time goes.
CPU seconds move with the machine's load (a shared core runs slower), so compare two trees in
runs close together, or interleaved.
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd, cwd, env):
    wall, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall, cpu = time.perf_counter() - wall, children_cpu() - cpu
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-4000:]}")
    return wall, cpu


BUDGET_CPU_S = 150


def build_requirements(tree):
    """The ``[build-system] requires`` list of the tree's pyproject.toml."""
    text = (tree / "pyproject.toml").read_text()
    block = re.search(r"^requires\s*=\s*\[(.*?)\]", text, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def per_object_times(tree, python, env, scratch):
    """[(CPU seconds, what)] of an in-place build of ``tree`` with an empty object cache and one
    job, from setup.py's FASTADAM_BUILD_TIMES log, and the CPU seconds of the whole build."""
    log = scratch / "build-times.txt"
    env = dict(env, FASTADAM_OBJECT_CACHE=str(scratch / "empty-object-cache"),
               FASTADAM_BUILD_JOBS="1", FASTADAM_BUILD_TIMES=str(log))
    _, total = timed([python, "setup.py", "build_ext", "--inplace"], tree, env)
    rows = []
    for line in log.read_text().splitlines():
        seconds, what = line.split("\t", 1)
        rows.append((float(seconds), os.path.relpath(what, tree) if os.path.isabs(what) else what))
    return sorted(rows, reverse=True), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--keep", action="store_true", help="keep the temporary clone")
    ap.add_argument("--objects", action="store_true",
                    help="first: the CPU seconds of every compiled object of an in-place build")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fastadam-install-"))
    try:
        tree = root / "fastadam"
        subprocess.run(["git", "clone", "-q", args.repo, str(tree)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
        pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
        env = dict(os.environ)
        env.pop("FASTADAM_OBJECT_CACHE", None)  # the clone's own build/object-cache
        env.pop("PYTHONPATH", None)
        # a current pip (the venv's bundled one, 23.2 with Python 3.11, spends about 5 s more
        # per install making its build environment), and the extras' packages
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
        subprocess.run(pip + ["scipy>=1.9", "matplotlib"], check=True)
        version = subprocess.run(pip[:3] + ["--version"], capture_output=True, text=True)
        print(version.stdout.split(" from ")[0])
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        if args.objects:
            objects_tree = root / "fastadam-objects"
            subprocess.run(["git", "clone", "-q", args.repo, str(objects_tree)], check=True)
            subprocess.run(pip + build_requirements(objects_tree), check=True)
            times, total = per_object_times(objects_tree, pip[0], env, root)
            print("setup.py build_ext --inplace, 1 job, empty object cache: CPU seconds")
            for seconds, what in times:
                print(f"  {seconds:7.1f}  {what}")
            print(f"  {sum(s for s, _ in times):7.1f}  sum of the above; whole build "
                  f"{total:.1f} s CPU", flush=True)
        rows = []
        for label, target in (("cold first", "."), ("second", ".[sparse]"),
                              ("third", ".[plot]")):
            wall, cpu = timed(pip + ["-e", target], tree, env)
            rows.append((label, target, wall, cpu))
            print(f"{label:>10}: pip install -e '{target}'  {wall:6.1f} s wall  "
                  f"{cpu:6.1f} s CPU", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        cold = rows[0][3]
        print(f"cold first install: {cold:.1f} s CPU, budget {BUDGET_CPU_S} s: "
              f"{'within' if cold <= BUDGET_CPU_S else 'OVER'}")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
