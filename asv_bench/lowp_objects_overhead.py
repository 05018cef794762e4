"""The optimizer objects' cost with low-precision states beside the functional layer (issue 24).

    python asv_bench/lowp_objects_overhead.py

Per size, interleaved rounds of: the Adam object with float32, bfloat16 and 8-bit states, and
``prepare_step`` with 8-bit QuantizedState slots (the same driver call without the object's
step driver); 1 thread; medians.  At 1e3 elements the gap between the 8-bit object and the
prepared step is the Python the object adds (gradient checks, lock, fold); at 1e6 it is noise
around the driver's own time.  Ratios are of the float32 object step, measured in this run.
"""
import statistics
import time

import numpy as np

import fastadam
from fastadam.optim import QuantizedState, prepare_step


def measure(n, rounds):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n).astype(np.float32)
    cases = {}
    for state_dtype in ("float32", "bfloat16", "int8"):
        x = rng.standard_normal(n).astype(np.float32)
        opt = fastadam.Adam([x], lr=1e-3, state_dtype=state_dtype, num_threads=1,
                            min_8bit_size=0)  # 8-bit states at any size
        cases[f"Adam object, {state_dtype} states"] = lambda opt=opt: opt.step([g])
    x = rng.standard_normal(n).astype(np.float32)
    slots = {"m": QuantizedState.zeros(n), "v": QuantizedState.zeros(n, signed=False)}
    step = prepare_step("adam", x, slots, num_threads=1)
    cases["prepare_step, int8 states"] = lambda: step.step(g, 1, lr=1e-3)
    reps = 2_000 if n < 50_000 else 20
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():
            call()
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            times[name].append((time.perf_counter() - t0) / reps)
    base = statistics.median(times["Adam object, float32 states"])
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{n:>9}  {name:32s} {med * 1e6:10.1f} us   {base / med:5.2f}x the float32 object")


if __name__ == "__main__":
    print("fastadam", fastadam.__version__, "| 1 thread, medians of interleaved rounds")
    measure(1_000, 15)
    measure(1_000_000, 7)
