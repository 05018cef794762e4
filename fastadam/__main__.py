"""``python -m fastadam``: a short demo on built-in data, then a quick self-benchmark.

    python -m fastadam            demo + quick benchmark table (and plot if matplotlib is there)
    python -m fastadam demo       the demo only
    python -m fastadam bench ...  the benchmark (see ``python -m fastadam bench --help``)
    python -m fastadam config     build and runtime facts (SIMD path, OpenMP, threads)
"""
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


def demo(epochs=30, batch=256, lr=0.05):
    X, y, w_true = make_data()
    print(f"demo: least squares on built-in data, X {X.shape}, minibatch {batch}, lr {lr}")
    w = np.zeros(X.shape[1], np.float32)
    b = np.zeros(1, np.float32)
    opt = fastadam.Adam([w, b], lr=lr)
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


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else None
    if command == "config":
        fastadam.show_config()
        return 0
    if command in (None, "demo"):
        fastadam.show_config()
        print()
        t0 = time.perf_counter()
        demo()
        print(f"  ({time.perf_counter() - t0:.2f} s)\n")
        if command == "demo":
            return 0
        argv = ["--quick"] + argv
    elif command != "bench":
        print(__doc__)
        return 2
    from . import bench as _bench

    return _bench.main(argv) or 0


if __name__ == "__main__":
    sys.exit(main())
