"""The per-step cost of ``fastadam.optim.lowlevel.PreparedAdam.step`` (what the MLP estimators'
compiled epoch loop calls once per mini-batch) against the dense driver alone.

    python asv_bench/prepared_adam_report.py [--sizes 2200 100000] [--rounds 7]

Three arms per size, float64, one thread, in rotating order in one process: the driver call on
arrays validated beforehand (``fastadam._core._dense.dense_step``: the floor any Adam step
pays), ``PreparedAdam.step(t)`` (the fold of step t in float64, a coefficient object, the
same driver call), and ``fastadam.step_inplace`` (everything checked per call).  Each arm is
timed with ``timeit`` (best of 3 runs of 2000 calls) per round; the medians over rounds are
printed with the differences to the driver in microseconds.
"""
import argparse
import statistics
import timeit

import numpy as np

import fastadam
from fastadam._core import _dense
from fastadam._core._validation import check_step_arrays
from fastadam.optim.lowlevel import PreparedAdam, adam_coefficients


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2200, 100000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for n in args.sizes:
        rng = np.random.default_rng(0)
        x, g = rng.standard_normal(n), rng.standard_normal(n)
        m, v = np.zeros(n), np.zeros(n)
        coeffs = adam_coefficients(1, 1e-3, 0.9, 0.999, 1e-8, "tf")
        xs, gs, slots, typenum = check_step_arrays(x, g, [("m", m), ("v", v)])
        prepared = PreparedAdam(x, g, m, v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                num_threads=1)
        arms = {
            "driver": lambda: _dense.dense_step(coeffs, xs, gs, slots, typenum, False, 1),
            "PreparedAdam.step": lambda: prepared.step(5),
            "step_inplace": lambda: fastadam.step_inplace(x, g, m, v, 5, num_threads=1),
        }
        times = {name: [] for name in arms}
        names = list(arms)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                best = min(timeit.repeat(arms[name], number=2000, repeat=3)) / 2000
                times[name].append(best * 1e6)
        med = {name: statistics.median(t) for name, t in times.items()}
        line = ", ".join(f"{name} {t:.2f} us (+{t - med['driver']:.2f})"
                         for name, t in med.items())
        print(f"n={n}: {line}")


if __name__ == "__main__":
    main()
