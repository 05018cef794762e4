"""``python -m fastadam``: a short demo on built-in data, a self-benchmark, the build's facts.

    python -m fastadam                 demo, then the quick benchmark
    python -m fastadam demo            the demo only
    python -m fastadam bench [...]     fastadam vs NumPy vs PyTorch, table and plot
    python -m fastadam config          build and runtime facts (SIMD path, OpenMP, threads)
    python -m fastadam --version

Every command takes ``--help``.
"""
import argparse
import sys
import time

import numpy as np

import fastadam


def make_data(n_samples=4096, n_features=64, seed=0):
    """A built-in regression problem: y = X @ w_true + noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features)).astype(np.float32)
    w_true = rng.standard_normal(n_features).astype(np.float32)
    y = X @ w_true + np.float32(0.1) * rng.standard_normal(n_samples).astype(np.float32)
    return X, y, w_true


def numpy_adam_step(w, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """The same update written in plain NumPy (TensorFlow convention), for comparison."""
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    lr_t = lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    w -= np.float32(lr_t) * m / (np.sqrt(v) + np.float32(eps))


def demo(epochs=30, batch=256, lr=0.05, num_threads=None):
    X, y, w_true = make_data()
    print(f"demo: least squares on built-in data, X {X.shape}, minibatch {batch}, lr {lr}")
    w = np.zeros(X.shape[1], np.float32)
    b = np.zeros(1, np.float32)
    opt = fastadam.Adam([w, b], lr=lr, convention="tf", eps=1e-8, num_threads=num_threads)
    w_np, b_np = w.copy(), b.copy()
    state_np = [np.zeros_like(w), np.zeros_like(w), np.zeros_like(b), np.zeros_like(b)]
    t_np = 0
    rng = np.random.default_rng(1)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(X))
        for start in range(0, len(X), batch):
            idx = order[start:start + batch]
            xb, yb = X[idx], y[idx]
            for step in ("fastadam", "numpy"):
                ww, bb = (w, b) if step == "fastadam" else (w_np, b_np)
                r = xb @ ww + bb[0] - yb
                gw = (2.0 / len(idx)) * (xb.T @ r)
                gb = np.array([2.0 * r.mean()], np.float32)
                if step == "fastadam":
                    opt.step([gw.astype(np.float32), gb])
                else:
                    t_np += 1
                    numpy_adam_step(w_np, gw.astype(np.float32), state_np[0], state_np[1], t_np, lr)
                    numpy_adam_step(b_np, gb, state_np[2], state_np[3], t_np, lr)
        if epoch in (1, 2, 5, 10, 20, epochs):
            loss = float(np.mean((X @ w + b[0] - y) ** 2))
            print(f"  epoch {epoch:3d}  mse {loss:.5f}")
    err = float(np.max(np.abs(w - w_true)))
    diff = float(np.max(np.abs(w - w_np)))
    print(f"  max |w - w_true| = {err:.4f}; fastadam vs NumPy Adam: max |diff| = {diff:.2e} "
          f"after {opt.t} steps")
    return err


def build_parser():
    from . import bench

    parser = argparse.ArgumentParser(
        prog="python -m fastadam",
        description="fastadam: fused, exact, multi-threaded optimizer steps for NumPy. Without "
                    "a command: the demo, then the quick benchmark.")
    parser.add_argument("--version", action="version", version=f"fastadam {fastadam.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,bench,config}")
    demo_p = sub.add_parser("demo", help="least squares on built-in data, fastadam beside a "
                                         "plain NumPy Adam", description=demo.__doc__)
    demo_p.add_argument("--quick", action="store_true", help="10 epochs instead of 30")
    demo_p.add_argument("--threads", type=int, default=None, metavar="N",
                        help="num_threads of the optimizer (default: fastadam's choice)")
    bench_p = sub.add_parser("bench", help="time the dense Adam step against NumPy and PyTorch; "
                                           "table and plot")
    bench.add_report_arguments(bench_p)
    config_p = sub.add_parser("config", help="build and runtime facts")
    config_p.add_argument("--out", metavar="JSON", default=None,
                          help="also write the facts to this JSON file")
    # Without a command: the demo, then the quick benchmark, with the benchmark's options.
    bench.add_report_arguments(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "config":
        fastadam.show_config()
        if args.out:
            import json

            with open(args.out, "w") as f:
                json.dump(fastadam.config(), f, indent=1, default=str)
            print(f"written to {args.out}")
        return 0
    if args.command == "bench":
        from . import bench

        return bench.run_report(args)
    fastadam.show_config()
    print()
    start = time.perf_counter()
    if args.command == "demo":
        demo(epochs=10 if args.quick else 30, num_threads=args.threads)
        print(f"  ({time.perf_counter() - start:.2f} s)")
        return 0
    demo(epochs=10 if args.quick else 30)
    print(f"  ({time.perf_counter() - start:.2f} s)\n")
    from . import bench

    args.quick = True  # the self-benchmark after the demo is always the quick one
    return bench.run_report(args)


if __name__ == "__main__":
    sys.exit(main())
