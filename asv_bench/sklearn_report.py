"""Side-by-side report for fastadam.sklearn (issue 11), 1 thread, medians, as ratios.

1. ``fastadam.sklearn.MLPClassifier``/``MLPRegressor`` vs scikit-learn's MLP (solver="adam"),
   same architecture (100,), same epochs, same random_state: test accuracy / R^2 and fit time
   (ratio = sklearn / fastadam: > 1 means fastadam is faster), in X's dtype (float64, as sklearn)
   and with ``dtype="float32"``;
2. scikit-learn's MLP inside ``accelerate_mlp()`` (fused Adam step and fastadam's mini-batch
   loop) against the stock fit: wall- and CPU-time ratios and whether the coefficients and
   ``loss_curve_`` are identical bit for bit, on the problems of 1 and on a wide layer with
   small batches;
3. ``SparseLinearClassifier`` vs ``SGDClassifier(loss="log_loss")`` and
   ``LogisticRegression(solver="saga")``, same epochs, on hashed Zipf text (1e5 documents, 1e5
   and 1e6 features): accuracy, fit time (issue 11 asks fastadam's <= SGD's and saga's), and
   fastadam's time per epoch for both widths.  fastadam runs with batch 1024, rate 0.01,
   alpha 1e-6 (its defaults until they changed): this section times epochs;
   ``sparse_linear_report.py`` compares the estimators' defaults.

Every timed run is printed under its table (``runs``), not only the medians.

The timed fits alternate between implementations (round-robin), so load from other processes
hits all of them alike.  Usage, from the repository root after
``python setup.py build_ext --inplace`` (unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for this
command only, if your environment sets them)::

    python asv_bench/sklearn_report.py [--quick] [--repeats N] [--only mlp|accelerate|sparse]
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))
sys.path.insert(0, os.path.dirname(HERE))

import bench_sklearn as B  # noqa: E402


RUNS = {}  # every timed run, by (section, problem, implementation): printed after each table


def interleaved_medians(fits, repeats, label=""):
    """{name: (median seconds, last model)}: each round fits every implementation once."""
    times = {name: [] for name in fits}
    models = {}
    for _ in range(repeats):
        for name, fit in fits.items():
            t = time.perf_counter()
            models[name] = fit()
            times[name].append(time.perf_counter() - t)
    for name in fits:
        RUNS[(label, name)] = times[name]
    return {name: (float(np.median(times[name])), models[name]) for name in fits}


def print_runs(label):
    for (where, name), times in RUNS.items():
        if where == label:
            print(f"{'':14s} runs {name:20s} " + " ".join(f"{t:.3f}" for t in times))


def max_coef_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a.coefs_ + a.intercepts_,
                                                          b.coefs_ + b.intercepts_))


def mlp_section(epochs, repeats):
    print(f"\n== MLP, hidden (100,), {epochs} epochs, 1 thread "
          f"(ratio = sklearn time / other time) ==")
    print(f"{'problem':14s} {'impl':20s} {'score':>8s} {'fit':>9s} {'ratio':>7s}")
    for problem in B.MLP_PROBLEMS:
        built = {impl: B.build_mlp(problem, impl, epochs=epochs) for impl in B.MLP_IMPLS}
        res = interleaved_medians({impl: f for impl, (f, _) in built.items()}, repeats, problem)
        base = res["sklearn"][0]
        for impl in B.MLP_IMPLS:
            seconds, model = res[impl]
            score = built[impl][1](model)
            print(f"{problem:14s} {impl:20s} {score:8.4f} {seconds:8.3f}s {base / seconds:6.2f}x")
        diff = max_coef_difference(res["sklearn"][1], res["sklearn_accelerated"][1])
        print(f"{'':14s} accelerated vs stock: largest coefficient difference {diff:.3g}")
        print_runs(problem)


def accelerate_section(repeats, epochs=50):
    print(f"\n== scikit-learn's own MLP (solver=\"adam\", hidden (100,), {epochs} epochs, 1 thread): "
          "stock vs inside accelerate_mlp() (fused Adam step + fastadam's mini-batch loop) ==")
    print(f"{'problem':14s} {'stock':>9s} {'accel':>9s} {'ratio':>7s} {'cpu ratio':>9s} "
          f"{'identical':>9s}")
    for problem in B.MLP_PROBLEMS:
        fits = {"stock": B.build_mlp(problem, "sklearn", epochs=epochs)[0],
                "accelerate_mlp()": B.build_mlp(problem, "sklearn_accelerated", epochs=epochs)[0]}
        _accelerate_row(problem, fits, repeats)
    print("wide: MLPClassifier 784 -> 512 -> 10, batch_size=32, 3 epochs (the Adam update is a "
          "larger share of a step)")
    _accelerate_row("wide", {"stock": B.build_accelerated_wide(False),
                             "accelerate_mlp()": B.build_accelerated_wide(True)}, repeats)


def _accelerate_row(problem, fits, repeats):
    """One row: interleaved medians of wall and CPU time (after one untimed fit of each), and
    whether every coefficient, intercept and loss_curve_ entry is the same bit for bit."""
    for fit in fits.values():  # untimed: the first fit imports fastadam.sklearn's modules
        fit()
    cpu = {name: [] for name in fits}

    def cpu_timed(name, fit):
        def run():
            start = time.process_time()
            model = fit()
            cpu[name].append(time.process_time() - start)
            return model
        return run

    res = interleaved_medians({name: cpu_timed(name, fit) for name, fit in fits.items()},
                              repeats, ("accelerate", problem))
    (stock_s, stock), (accel_s, accel) = res["stock"], res["accelerate_mlp()"]
    cpu_ratio = float(np.median(cpu["stock"]) / np.median(cpu["accelerate_mlp()"]))
    identical = (all(np.array_equal(p, q) for p, q in zip(stock.coefs_ + stock.intercepts_,
                                                          accel.coefs_ + accel.intercepts_))
                 and stock.loss_curve_ == accel.loss_curve_)
    print(f"{problem:14s} {stock_s:8.3f}s {accel_s:8.3f}s {stock_s / accel_s:6.2f}x "
          f"{cpu_ratio:8.2f}x {str(identical):>9s}")
    print_runs(("accelerate", problem))
    for name in fits:
        print(f"{'':14s} cpu  {name:20s} " + " ".join(f"{t:.3f}" for t in cpu[name]))


def sparse_section(n_docs, epochs, repeats):
    print(f"\n== sparse text, {n_docs} documents, {epochs} epochs, 1 thread ==")
    print(f"{'features':>9s} {'impl':10s} {'accuracy':>9s} {'fit':>9s} {'per epoch':>10s} "
          f"{'nnz':>9s}")
    per_epoch = {}
    for n_features in (10**5, 10**6):
        built = {impl: B.build_sparse(impl, n_docs, n_features, epochs=epochs)
                 for impl in ("fastadam", "sgd", "saga")}
        res = interleaved_medians({impl: b[0] for impl, b in built.items()}, repeats,
                                  n_features)
        for impl, (seconds, model) in res.items():
            score = built[impl][1](model)
            n_iter = int(np.max(getattr(model, "n_iter_", epochs)))
            print(f"{n_features:9d} {impl:10s} {score:9.4f} {seconds:8.3f}s "
                  f"{seconds / n_iter * 1e3:8.1f}ms {built[impl][2]:9d}")
        # one more epoch of the fitted model (partial_fit): the steady per-epoch cost, without
        # the one-off allocation and first touch of the (n_features, n_classes) tables
        model = res["fastadam"][1]
        X_tr, y_tr = built["fastadam"][3]
        epoch_times = []
        for _ in range(max(3, repeats)):
            t = time.perf_counter()
            model.partial_fit(X_tr, y_tr)
            epoch_times.append(time.perf_counter() - t)
        per_epoch[n_features] = float(np.median(epoch_times))
        print(f"{n_features:9d} fastadam one more epoch (partial_fit): "
              f"{per_epoch[n_features] * 1e3:.1f}ms")
        print(f"{n_features:9d} sparse/SGD fit-time ratio {res['fastadam'][0] / res['sgd'][0]:.2f}, "
              f"sparse/saga {res['fastadam'][0] / res['saga'][0]:.2f} (<= 1: fastadam as fast)")
        print_runs(n_features)
    print(f"fastadam per-epoch time, 1e6 / 1e5 features: "
          f"{per_epoch[10**6] / per_epoch[10**5]:.2f}x (10x the features)")


def main():
    print(f"load average at start: {os.getloadavg()[0]:.1f} (a shared machine inflates every "
          f"time; the ratios are interleaved medians)")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=["mlp", "accelerate", "sparse"],
                        help="run one section (default: all three)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    run = lambda name: args.only in (None, name)  # noqa: E731
    with B._limit_threads():
        if run("mlp"):
            mlp_section(epochs=5 if args.quick else 50, repeats=repeats)
        if run("accelerate"):
            accelerate_section(repeats, epochs=5 if args.quick else 50)
        if run("sparse"):
            sparse_section(n_docs=5000 if args.quick else 10**5, epochs=5, repeats=repeats)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
