"""Noise of the ratio benchmarks: run this checkout's track_* benchmarks N times in the current
Python (the gate's run, asv_bench/gate.py) and print min / median / max and max/min per
benchmark and parameter combination: the evidence behind the gate's factors.

    python asv_bench/noise.py --runs 5 [--keep DIR]     # DIR keeps each run's results JSON
    python asv_bench/noise.py --from DIR                 # the table again from kept runs
    python asv_bench/noise.py --history                  # the stored history, one column a commit
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import gate


def table(runs):
    """Markdown rows: benchmark, params, min, median, max, max/min over the runs' values."""
    keys = sorted({k for r in runs for k in r}, key=lambda k: (k[0], [str(p) for p in k[1]]))
    lines = ["| benchmark | params | runs | min | median | max | max/min |",
             "|---|---|---|---|---|---|---|"]
    for key in keys:
        values = [r[key][0] for r in runs if key in r and r[key][0] is not None]
        if not values:
            continue
        lo, mid, hi = min(values), statistics.median(values), max(values)
        spread = f"{hi / lo:.2f}" if lo > 0 else "-"
        name = key[0].split(".", 1)[1]
        lines.append(f"| {name} | {', '.join(map(str, key[1]))} | {len(values)} | {lo:.3g} | "
                     f"{mid:.3g} | {hi:.3g} | {spread} |")
    return "\n".join(lines)


def history_table(machine_dir):
    """Markdown: one row per gated benchmark and params, one column per stored commit (in
    first-parent order of main, oldest first); "n/a" where the commit skipped it."""
    by_commit = gate.stored_by_commit(machine_dir)
    order = subprocess.run(["git", "rev-list", "--first-parent", "--reverse", "main"],
                           cwd=gate.REPO, capture_output=True, text=True).stdout.split()
    commits = [c for c in order if c in by_commit] + \
        sorted(c for c in by_commit if c not in order)
    results = {c: gate.merged_results(by_commit[c]) for c in commits}
    keys = sorted({k for r in results.values() for k in r},
                  key=lambda k: (k[0], [str(p) for p in k[1]]))
    lines = ["| benchmark | params | " + " | ".join(c[:7] for c in commits) + " |",
             "|---|---|" + "---|" * len(commits)]
    for key in keys:
        cells = []
        for c in commits:
            value = results[c].get(key, (None, None))[0]
            cells.append("n/a" if value is None else f"{value:.3g}")
        lines.append(f"| {key[0].split('.', 1)[1]} | {', '.join(map(str, key[1]))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", help="directory to copy each run's results JSON into")
    ap.add_argument("--from", dest="from_dir", help="make the table from kept runs only")
    ap.add_argument("--history", action="store_true",
                    help="print the stored history of asv_bench/results/ instead")
    args = ap.parse_args(argv)
    if args.history:
        print(history_table(os.path.join(gate.HERE, "results", gate.MACHINE)))
        return 0
    runs = []
    if args.from_dir:
        for fname in sorted(os.listdir(args.from_dir)):
            if fname.endswith(".json"):
                runs.append(gate.load_results(gate.read_json(os.path.join(args.from_dir,
                                                                           fname))))
    else:
        for i in range(args.runs):
            tmp = tempfile.mkdtemp(prefix="fastadam-asv-noise.")
            try:
                results, _, rc, failed = gate.run_asv(sys.executable, gate.TRACK_REGEX, True, tmp)
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    mdir = os.path.join(tmp, "results", gate.MACHINE)
                    for fname in os.listdir(mdir):
                        if fname != "machine.json":
                            shutil.copy(os.path.join(mdir, fname),
                                        os.path.join(args.keep, f"run{i + 1}-{fname}"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print(f"noise: run {i + 1}/{args.runs}: exit {rc}, {len(failed)} failed", flush=True)
            runs.append(results)
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
