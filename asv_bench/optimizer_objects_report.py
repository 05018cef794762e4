"""Side-by-side report for the optimizer objects (issue 8), in one process, as ratios.

    python asv_bench/optimizer_objects_report.py [--threads N] [--repeats N]

Prints medians (float32, one thread unless --threads) for:
  1. the cost of the object layer: ``Adam.step`` vs the functional ``step_inplace`` on the same
     tensors (1000 x 1e2, 100 x 1e4, 1 x 1e6 elements);
  2. the cost of global-norm clipping: ``Adam(clip_grad_norm=1.0).step`` vs ``Adam.step``
     (the claim: one extra read of the gradients);
  3. the objects vs torch.optim (foreach=True; Adam also fused=True) with
     torch.nn.utils.clip_grad_norm_ where clipping is on, on the same tensors.
Timings alternate between contenders (fastadam.bench.median_seconds_interleaved), so a noisy
neighbour hurts them alike.  Run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; BLAS (the
clip's dot products), OpenMP and torch all get --threads threads.
"""
import argparse
import os
import sys

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
import fastadam  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402

try:
    import torch
except ImportError:  # the report still runs, without the PyTorch rows
    torch = None

SHAPES = {"1000 x 1e2": (1000, 100), "100 x 1e4": (100, 10_000), "1 x 1e6": (1, 1_000_000)}


def tensors(count, size, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def object_layer(threads, repeats):
    print("\n1. Object layer: Adam.step vs step_inplace (ms; ratio = object / functional)")
    for label, (count, size) in SHAPES.items():
        x, g = tensors(count, size), tensors(count, size, 1)
        m, v = [np.zeros_like(a) for a in x], [np.zeros_like(a) for a in x]
        opt = fastadam.Adam([a.copy() for a in x], num_threads=threads)
        t = median_seconds_interleaved({
            "functional": lambda: fastadam.step_inplace(x, g, m, v, 1, convention="torch",
                                                        num_threads=threads),
            "object": lambda: opt.step(g)}, repeats)
        print(f"   {label:>11}: functional {t['functional'] * 1e3:8.3f}  object "
              f"{t['object'] * 1e3:8.3f}  ratio {t['object'] / t['functional']:.2f}")


def clipping(threads, repeats):
    print("\n2. Global-norm clipping: Adam(clip_grad_norm=1.0) vs Adam (ms; ratio = clip / none)")
    for label, (count, size) in SHAPES.items():
        x, g = tensors(count, size), tensors(count, size, 1)
        plain = fastadam.Adam([a.copy() for a in x], num_threads=threads)
        clipped = fastadam.Adam([a.copy() for a in x], clip_grad_norm=1.0, num_threads=threads)
        t = median_seconds_interleaved({"none": lambda: plain.step(g),
                                        "clip": lambda: clipped.step(g)}, repeats)
        print(f"   {label:>11}: none {t['none'] * 1e3:8.3f}  clip {t['clip'] * 1e3:8.3f}  "
              f"ratio {t['clip'] / t['none']:.2f}")


def torch_optimizer(kind, params, **options):
    if kind == "Adam":
        return torch.optim.Adam(params, lr=1e-3, **options)
    if kind == "Adagrad":
        return torch.optim.Adagrad(params, lr=1e-2, **options)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **options)


def ours(kind, params, clip, threads):
    cls = {"Adam": fastadam.Adam, "Adagrad": fastadam.Adagrad, "SGD": fastadam.SGD}[kind]
    extra = {"momentum": 0.9} if kind == "SGD" else {}
    return cls(params, clip_grad_norm=clip, num_threads=threads, **extra)


def versus_torch(threads, repeats):
    if torch is None:
        print("\n3. (torch not installed: no comparison)")
        return
    print("\n3. Objects vs torch.optim on the same tensors (ms; ratio = torch / fastadam)")
    for kind in ("Adam", "Adagrad", "SGD"):
        for clip in (None, 1.0):
            for label, (count, size) in SHAPES.items():
                x, g = tensors(count, size), tensors(count, size, 1)
                opt = ours(kind, [a.copy() for a in x], clip, threads)
                twins = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in x]
                for p, a in zip(twins, g):
                    p.grad = torch.from_numpy(a)
                contenders = {"fastadam": lambda: opt.step(g)}
                variants = [("foreach", {"foreach": True})]
                if kind == "Adam":
                    variants.append(("fused", {"fused": True}))
                for name, options in variants:
                    topt = torch_optimizer(kind, twins, **options)

                    def torch_step(topt=topt):
                        if clip is not None:
                            torch.nn.utils.clip_grad_norm_(twins, clip, foreach=True)
                        topt.step()
                    contenders[name] = torch_step
                t = median_seconds_interleaved(contenders, repeats)
                ratios = "  ".join(f"{n} {t[n] * 1e3:8.3f} ({t[n] / t['fastadam']:5.1f}x)"
                                   for n in t if n != "fastadam")
                print(f"   {kind:>7} clip={str(clip):>4} {label:>11}: fastadam "
                      f"{t['fastadam'] * 1e3:8.3f}  {ratios}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        object_layer(args.threads, args.repeats)
        clipping(args.threads, args.repeats)
        versus_torch(args.threads, args.repeats)


if __name__ == "__main__":
    main()
