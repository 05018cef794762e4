"""Noise of the ratio benchmarks: run this checkout's track_* benchmarks N times in the current
Python (the gate's run, asv_bench/gate.py) and print min / median / max and max/min per
benchmark and parameter combination: the evidence behind the gate's factors.

    python asv_bench/noise.py --runs 5 [--keep DIR]     # DIR keeps each run's results JSON
    python asv_bench/noise.py --from DIR                 # the table again from kept runs
"""
import argparse
import os
import shutil
import statistics
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", help="directory to copy each run's results JSON into")
    ap.add_argument("--from", dest="from_dir", help="make the table from kept runs only")
    args = ap.parse_args(argv)
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
