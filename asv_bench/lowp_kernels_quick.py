"""Low-precision state kernels (issue 24) beside the float32 step: one process, interleaved
rounds, medians.  A quick check for the kernel author; the official report is lowbench's.

    python asv_bench/lowp_kernels_quick.py [--n 10000000] [--rounds 9] [--threads 1 2] [--cpu-time]

Adam (torch convention), float32 gradients unless said ("bf16 x, g, states": everything
bfloat16, x rounded to nearest; "+ SR": stochastic rounding of x; "x + f32 master": bfloat16 x
written beside the float32 master, float32 gradients), block 256, dynamic map.  Each round
runs every case once per thread count, in turn, so a slow spell of a shared machine hits all;
printed: the median ms per step and the ratio float32 / case, beside the byte limit (28 bytes
per element of the float32 step over the bytes the case moves); then the 8-bit conversions
alone, in ns per element and slot (65536 elements, in L2, 1 thread).  --cpu-time times each call
by the process's CPU time instead of the wall clock: on a shared machine it leaves out the time the
process waits for a core (with 2+ threads it is the threads' sum, so use it for 1 thread).
"""
import argparse
import statistics
import time

import numpy as np

import fastadam
from fastadam._core import _lowp
from fastadam._core._registry import spec
from fastadam.bench import median_seconds_interleaved

BYTES = {"float32": 28, "bf16 states": 20, "bf16 x, g, states": 12,
         "bf16 x, g, states + SR": 12, "bf16 states, x + f32 master": 22, "int8 states": 16,
         "int8 + bf16 x, g + SR": 10, "int8 + bf16 x + f32 master": 18}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args()
    n, block = args.n, 256
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    g = rng.standard_normal(n, dtype=np.float32)
    m32, v32 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    xb, gb = _lowp.to_bf16_bits(x), _lowp.to_bf16_bits(g)
    mb, vb = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    mq, ms = _lowp.quantize(m32, block, True, 0)
    vq, vs = _lowp.quantize(v32, block, False, 0)
    master = x.copy()
    coeffs = spec("adam").fold(1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, convention="torch")
    F32, BF16, Q8 = _lowp.FMT_F32, _lowp.FMT_BF16, _lowp.FMT_Q8
    sg = (True, False)

    def lowp(xs, gs, pf, gf, sf, slots, scales, masters, rounding, nt):
        return lambda: _lowp.dense_step(coeffs, xs, gs, slots, scales, masters, pf, gf, sf, block,
                                        0, sg, rounding, 7, 1, False, nt)

    cases = {}
    for nt in args.threads:
        cases[("float32", nt)] = lambda nt=nt: fastadam.step_inplace(
            x, g, m32, v32, 1, lr=1e-3, convention="torch", num_threads=nt)
        cases[("bf16 states", nt)] = lowp([x], [g], F32, F32, BF16, [[mb], [vb]], [], [], 0, nt)
        cases[("bf16 x, g, states", nt)] = lowp([xb], [gb], BF16, BF16, BF16, [[mb], [vb]], [], [],
                                                0, nt)
        cases[("bf16 x, g, states + SR", nt)] = lowp([xb], [gb], BF16, BF16, BF16, [[mb], [vb]],
                                                     [], [], 1, nt)
        cases[("bf16 states, x + f32 master", nt)] = lowp([xb], [g], BF16, F32, BF16,
                                                          [[mb], [vb]], [], [master], 0, nt)
        cases[("int8 states", nt)] = lowp([x], [g], F32, F32, Q8, [[mq], [vq]], [[ms], [vs]], [],
                                          0, nt)
        cases[("int8 + bf16 x, g + SR", nt)] = lowp([xb], [gb], BF16, BF16, Q8, [[mq], [vq]],
                                                    [[ms], [vs]], [], 1, nt)
        cases[("int8 + bf16 x + f32 master", nt)] = lowp([xb], [g], BF16, F32, Q8, [[mq], [vq]],
                                                         [[ms], [vs]], [master], 0, nt)
    clock = time.process_time if args.cpu_time else time.perf_counter
    for f in cases.values():
        f()
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for k, f in cases.items():
            t0 = clock()
            f()
            times[k].append(clock() - t0)
    print(f"n = {n}, {args.rounds} rounds, CPU level {_lowp.simd_level_in_use()}, "
          f"{'CPU' if args.cpu_time else 'wall'} time")
    for nt in args.threads:
        base = statistics.median(times[("float32", nt)])
        for name in BYTES:
            med = statistics.median(times[(name, nt)])
            print(f"{nt} thread(s)  {name:28s} {med * 1e3:8.2f} ms  ratio {base / med:5.2f}  "
                  f"(byte limit {28 / BYTES[name]:.2f})")
    codes_per_element(args.rounds, block)


def codes_per_element(rounds, block, n=65536):
    """The 8-bit conversions alone, one slot, n elements (in L2), 1 thread: what an 8-bit step
    adds per element and slot to the float32 element function (dequantize before it, requantize
    after: the block's max |y|, the scale and a code per element)."""
    rng = np.random.default_rng(1)
    y = rng.standard_normal(n, dtype=np.float32)
    codes, scales = _lowp.quantize(y, block, True, 0)
    cases = {"requantize (max, scale, codes)": lambda: _lowp.quantize(y, block, True, 0),
             "dequantize (map[code] * scale)": lambda: _lowp.dequantize(codes, scales, block,
                                                                        True, 0)}
    times = median_seconds_interleaved(cases, repeats=rounds, min_time=0.005)
    print(f"8-bit codes alone, {n} elements, block {block}, 1 thread (the call's fixed cost "
          f"included):")
    for k in cases:
        print(f"  {k:32s} {times[k] / n * 1e9:6.3f} ns per element and slot")


if __name__ == "__main__":
    main()
