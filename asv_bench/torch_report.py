"""fastadam.torch against torch.optim on the same torch model, in one process, as ratios.

    python asv_bench/torch_report.py [--threads N] [--repeats N] [--quick] [--only ROWS]
        [--models | --model NAME]

Times ``optimizer.step()`` (gradients already in ``.grad``, float32) for:
  1. 100 parameters of 1e3 elements: fastadam.torch.Adam vs torch.optim.Adam(foreach=True) and
     Adam(fused=True) — the per-step cost of many small tensors;
  2. one parameter of 1e7 elements: the same three (memory-bandwidth bound);
  3. a sparse embedding (1e6 x 64, 65536 looked-up rows, Zipf(1.3) as in the sparse report):
     fastadam.torch.SparseAdam vs torch.optim.SparseAdam, and fastadam.torch.Adam's lazy step;
  4. with ``--models``, the parameters of real models, defined below in plain torch (no
     torchvision or transformers): GPT-2 small (124M parameters in 148 tensors), ResNet-18
     (11.7M in 62 tensors) and a recommender (a 1e6 x 64 embedding table with dense gradients
     and a small MLP), Adam with torch foreach and fused beside fastadam.torch.
DeepSpeed's ``DeepSpeedCPUAdam`` (ZeRO-Offload's CPU Adam) is timed beside rows 1, 2 and 4 when
``deepspeed`` imports and its CPU op builds; otherwise the report says why on its first lines.
DeepSpeed lives in an environment of its own (``bash asv_bench/deepspeed_env.sh`` builds it and
the op; run this report with that environment's python).  Every contender gets ``--threads``
threads: torch's pool (``torch.set_num_threads``), fastadam's ``num_threads``, and
OMP_NUM_THREADS, set before any OpenMP runtime loads, for DeepSpeed's op (its own libgomp);
the report prints each OpenMP runtime's thread count (threadpoolctl) after the op has loaded.
GPT-2 small needs about 2 GB per contender (parameters, gradients and two states); ``--model``
picks models.  Timings alternate between contenders (fastadam.bench.sample_seconds_interleaved);
``--clock cpu`` times the calling thread's CPU time instead of wall time (``--threads 1`` only:
every contender then runs on that thread), which the time slices of other processes on a
shared machine do not inflate.
"""
import argparse
import os
import sys
import time


def _threads_from_argv(argv):
    """``--threads N`` read before torch and fastadam load their OpenMP runtimes."""
    for k, arg in enumerate(argv):
        if arg == "--threads" and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


os.environ["OMP_NUM_THREADS"] = _threads_from_argv(sys.argv[1:])
os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no GPU: DeepSpeed's CPU accelerator

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
from fastadam.bench import sample_seconds_interleaved  # noqa: E402

import torch  # noqa: E402
import fastadam.torch as ft  # noqa: E402


def params_with_grads(count, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(size, generator=g)) for _ in range(count)]
    for p in ps:
        p.grad = torch.randn(size, generator=g)
    return ps


def clone(ps):
    out = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for q, p in zip(out, ps):
        q.grad = p.grad.clone()
    return out


CLOCK = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = CLOCK["wall"]


def timed_against_fastadam(contenders, repeats):
    """``{name: (median seconds, ratio cell)}``; the ratio is the median over the rounds of
    that round's time over fastadam.torch's (a round times every contender in turn, so the
    load of a shared machine moves both sides of each ratio alike), with its quartiles."""
    samples = sample_seconds_interleaved(contenders, repeats, clock=_clock)
    ours = samples["fastadam.torch"]
    out = {}
    for name, t in samples.items():
        q1, med, q3 = np.percentile(t / ours, [25, 50, 75])
        out[name] = (float(np.median(t)), f"{med:5.2f}x [{q1:.2f}-{q3:.2f}]")
    return out


_DEEPSPEED = {}  # "cls" or "why": probed once


def deepspeed_status(threads):
    """One line on the DeepSpeedCPUAdam column: its version and every OpenMP runtime's threads
    once its op has loaded, or why it is not timed (not installed, or its op did not build)."""
    try:
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.ones(4)
        DeepSpeedCPUAdam([p], lr=1e-3, adamw_mode=False).step()  # loads (or JIT-builds) the op
    except Exception as exc:
        first = str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else ""
        _DEEPSPEED["why"] = f"{type(exc).__name__}: {first}"
        return (f"DeepSpeedCPUAdam: not timed ({_DEEPSPEED['why']}); "
                f"bash asv_bench/deepspeed_env.sh builds an environment with it")
    _DEEPSPEED["cls"] = DeepSpeedCPUAdam
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
        threadpool_limits(threads, user_api="openmp")  # the op's runtime, if loaded late
        runtimes = ", ".join(f"{os.path.basename(i['filepath'])} {i['num_threads']}"
                             for i in threadpool_info() if i["user_api"] == "openmp")
    except ImportError:
        runtimes = "threadpoolctl not installed"
    return (f"DeepSpeedCPUAdam: deepspeed {deepspeed.__version__} (adamw_mode=False); "
            f"OpenMP threads: {runtimes}")


def deepspeed_adam(ps):
    cls = _DEEPSPEED.get("cls")
    return None if cls is None else cls(ps, lr=1e-3, adamw_mode=False)


def dense_rows(threads, repeats, quick, rows):
    shapes = [("100 x 1e3", 100, 1000)] + ([] if quick else [("1 x 1e7", 1, 10_000_000)])
    for label, count, size in shapes:
        if ("small" if count > 1 else "large") not in rows:
            continue
        base = params_with_grads(count, size)
        contenders = {}
        ours = ft.Adam(clone(base), lr=1e-3, num_threads=threads)
        contenders["fastadam.torch"] = ours.step
        for name, kw in (("torch foreach", dict(foreach=True)), ("torch fused", dict(fused=True))):
            contenders[name] = torch.optim.Adam(clone(base), lr=1e-3, **kw).step
        ds = None if quick else deepspeed_adam(clone(base))
        if ds is not None:
            contenders["DeepSpeedCPUAdam"] = ds.step
        t = timed_against_fastadam(contenders, repeats)
        ref = t["fastadam.torch"][0]
        cells = "  ".join(f"{n} {s * 1e3:8.3f} ms ({r})" for n, (s, r) in t.items()
                          if n != "fastadam.torch")
        print(f"   Adam {label:>10}: fastadam.torch {ref * 1e3:8.3f} ms  {cells}")


# ---- real models' parameters (shapes as the published models have them) -----------------------
class GPT2Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.c_attn, self.attn_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.c_fc, self.mlp_proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)


class GPT2Small(torch.nn.Module):
    """GPT-2 small's trainable tensors: token and position embeddings, 12 blocks of 12 tensors,
    the final LayerNorm (the head is tied to the token embedding): 148 tensors, 124.4M values."""

    def __init__(self, vocab=50257, context=1024, d=768, layers=12):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.h = torch.nn.ModuleList(GPT2Block(d) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))


class ResNet18(torch.nn.Module):
    """ResNet-18's trainable tensors (1000 classes): 62 tensors, 11.7M values."""

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(64)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(BasicBlock(cin, cout, s), BasicBlock(cout, cout, 1))
            for cin, cout, s in widths)
        self.fc = torch.nn.Linear(512, classes)


class Recommender(torch.nn.Module):
    """A 1e6 x 64 embedding table (dense gradients, as ``nn.Embedding(sparse=False)`` gives)
    and a small MLP over 8 pooled features."""

    def __init__(self, rows=1_000_000, dim=64, features=8):
        super().__init__()
        self.table = torch.nn.Embedding(rows, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(features * dim, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))


MODELS = {"GPT-2 small": GPT2Small, "ResNet-18": ResNet18, "recommender": Recommender}


def model_rows(threads, repeats, names):
    for label in names:
        cls = MODELS[label]
        torch.manual_seed(0)
        base = list(cls().parameters())
        g = torch.Generator().manual_seed(1)
        for p in base:
            p.grad = torch.randn(p.shape, generator=g) * 1e-2
        n, k = sum(p.numel() for p in base), len(base)
        contenders = {"fastadam.torch": ft.Adam(clone(base), lr=1e-3, num_threads=threads).step}
        for name, kw in (("torch foreach", dict(foreach=True)), ("torch fused", dict(fused=True))):
            contenders[name] = torch.optim.Adam(clone(base), lr=1e-3, **kw).step
        ds = deepspeed_adam(clone(base))
        if ds is not None:
            contenders["DeepSpeedCPUAdam"] = ds.step
        del base
        t = timed_against_fastadam(contenders, repeats)
        ref = t["fastadam.torch"][0]
        cells = "  ".join(f"{k} {s * 1e3:8.2f} ms ({r})" for k, (s, r) in t.items()
                          if k != "fastadam.torch")
        print(f"   Adam {label:>12} ({n / 1e6:.1f}M in {k} tensors): "
              f"fastadam.torch {ref * 1e3:8.2f} ms  {cells}")
        del contenders


def sparse_rows(repeats, quick):
    rows, dim, lookups = (100_000, 64, 8192) if quick else (1_000_000, 64, 65536)
    rng = np.random.default_rng(0)
    idx = np.minimum(rng.zipf(1.3, lookups) - 1, rows - 1)
    idx = torch.from_numpy(rng.permutation(rows)[idx])
    values = torch.from_numpy(rng.standard_normal((lookups, dim)).astype(np.float32))
    grad = torch.sparse_coo_tensor(idx[None], values, (rows, dim))
    weight = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32))

    def make(cls, **kw):
        p = torch.nn.Parameter(weight.clone())
        p.grad = grad
        return cls([p], lr=1e-3, **kw).step
    t = sample_seconds_interleaved({
        "fastadam.torch.SparseAdam": make(ft.SparseAdam, num_threads=1),
        "fastadam.torch.Adam (lazy)": make(ft.Adam, num_threads=1),
        "torch.optim.SparseAdam": make(torch.optim.SparseAdam)}, repeats, clock=_clock)
    t = {name: float(np.median(v)) for name, v in t.items()}
    ref = t["torch.optim.SparseAdam"]
    print(f"   sparse embedding {rows:.0e} x {dim}, {lookups} Zipf(1.3) lookups: "
          + "  ".join(f"{n} {s * 1e3:7.2f} ms ({ref / s:4.1f}x faster than SparseAdam)"
                      for n, s in t.items() if n != "torch.optim.SparseAdam")
          + f"  torch.optim.SparseAdam {ref * 1e3:7.2f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--models", action="store_true",
                        help="also the real models' parameters (GPT-2 small, ResNet-18, a "
                             "recommender; about 2 GB per contender)")
    parser.add_argument("--model", action="append", choices=list(MODELS),
                        help="only these models (implies --models; repeatable)")
    parser.add_argument("--only", action="append", choices=["small", "large", "sparse"],
                        help="only these rows: 100 x 1e3, 1 x 1e7, the sparse embedding "
                             "(repeatable; the models come with --models or --model)")
    parser.add_argument("--clock", choices=list(CLOCK), default="wall",
                        help="cpu: the calling thread's CPU time (time.thread_time), for "
                             "--threads 1 on a machine shared with other processes")
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu counts the calling thread only: it needs --threads 1")
    global _clock
    _clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    print(f"fastadam.torch vs torch.optim, float32, {args.threads} thread(s), {args.clock} "
          f"clock, medians of "
          f"{args.repeats} interleaved rounds (ratio: other / fastadam, the median of the "
          f"rounds' ratios [quartiles])")
    if not args.quick:
        print(deepspeed_status(args.threads))
    rows = args.only or ([] if args.model else ["small", "large", "sparse"])
    dense_rows(args.threads, args.repeats, args.quick, rows)
    if "sparse" in rows:
        sparse_rows(args.repeats, args.quick)
    if args.models or args.model:
        model_rows(args.threads, args.repeats, args.model or list(MODELS))


if __name__ == "__main__":
    main()
