"""Benchmarks of fastadam.sklearn (issue 11), 1 thread: fit times of the estimators against
scikit-learn's, on data scikit-learn ships and on a generated sparse text-like problem.

The ``build_*`` functions return ``(fit, score)`` closures so that ``asv_bench/sklearn_report.py``
times the very same code side by side; the asv classes below time one fit each.
"""
import warnings

import numpy as np

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

MLP_PROBLEMS = ["digits", "breast_cancer", "regression"]
MLP_IMPLS = ["sklearn", "sklearn_accelerated", "fastadam", "fastadam_float32"]


def _limit_threads():
    """One thread for BLAS and every OpenMP runtime.  fastadam is imported first: threadpoolctl
    only limits the libraries already loaded, and fastadam's libgomp loads with it."""
    import fastadam  # noqa: F401
    from threadpoolctl import threadpool_limits
    return threadpool_limits(1)


def mlp_problem(name):
    """(X_train, X_test, y_train, y_test, is_classification), seeded."""
    from sklearn.datasets import load_breast_cancer, load_digits, make_regression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    if name == "digits":
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
    elif name == "breast_cancer":
        X, y = load_breast_cancer(return_X_y=True)
        X = StandardScaler().fit_transform(X)
    elif name == "regression":
        X, y = make_regression(n_samples=4000, n_features=50, n_informative=30, noise=10.0,
                               random_state=0)
        y = (y - y.mean()) / y.std()
    else:
        raise ValueError(f"unknown problem {name!r}")
    return (*train_test_split(X, y, test_size=0.25, random_state=0), name != "regression")


def build_mlp(problem, impl, epochs=50, hidden=(100,)):
    """Closures ``fit()`` (returns the model) and ``score(model)`` (test accuracy or R^2)."""
    X_tr, X_te, y_tr, y_te, classification = mlp_problem(problem)
    kw = dict(hidden_layer_sizes=hidden, max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1,
              random_state=0)
    if impl.startswith("sklearn"):
        from sklearn.neural_network import MLPClassifier, MLPRegressor
        kw["solver"] = "adam"
    else:
        from fastadam.sklearn import MLPClassifier, MLPRegressor
        if impl == "fastadam_float32":
            kw["dtype"] = "float32"
    cls = MLPClassifier if classification else MLPRegressor

    def fit():
        from sklearn.exceptions import ConvergenceWarning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if impl == "sklearn_accelerated":
                from fastadam.sklearn import accelerate_mlp
                with accelerate_mlp():
                    return cls(**kw).fit(X_tr, y_tr)
            return cls(**kw).fit(X_tr, y_tr)

    return fit, lambda model: float(model.score(X_te, y_te))


def build_accelerated_wide(accelerated, epochs=3):
    """scikit-learn's MLPClassifier on a wide layer with small batches (784 features, (512,)
    hidden, batch_size=32): the configuration where the Adam update is a large share of a step.
    Returns ``fit()``."""
    from sklearn.datasets import make_classification
    from sklearn.neural_network import MLPClassifier
    X, y = make_classification(n_samples=2000, n_features=784, n_informative=50, n_classes=10,
                               random_state=0)
    make = lambda: MLPClassifier(hidden_layer_sizes=(512,), batch_size=32,  # noqa: E731
                                 max_iter=epochs, random_state=0)

    def fit():
        from sklearn.exceptions import ConvergenceWarning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if accelerated:
                from fastadam.sklearn import accelerate_mlp
                with accelerate_mlp():
                    return make().fit(X, y)
            return make().fit(X, y)

    return fit


def text_problem(n_docs, n_features, n_classes=4, mean_words=40, seed=0):
    """Hashed bag-of-words CSR (float32 counts): Zipf word frequencies, document lengths
    Poisson(mean_words); each class draws half of its words from its own shifted vocabulary."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n_docs)
    lengths = np.maximum(rng.poisson(mean_words, n_docs), 1)
    rows = np.repeat(np.arange(n_docs), lengths)
    ranks = rng.zipf(1.2, rows.size).astype(np.int64)
    topical = rng.random(rows.size) < 0.5
    ranks[topical] = ranks[topical] * n_classes + y[rows[topical]]
    cols = (ranks * 2654435761) % n_features  # hashing trick
    X = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)),
                      shape=(n_docs, n_features))
    X.sum_duplicates()
    return X, y


def build_sparse(impl, n_docs, n_features, epochs=5):
    X, y = text_problem(n_docs, n_features)
    n_train = int(0.8 * n_docs)
    X_tr, X_te, y_tr, y_te = X[:n_train], X[n_train:], y[:n_train], y[n_train:]
    if impl == "fastadam":
        from fastadam.sklearn import SparseLinearClassifier
        make = lambda: SparseLinearClassifier(max_iter=epochs, tol=0.0,  # noqa: E731
                                              n_iter_no_change=epochs + 1, random_state=0)
    elif impl == "sgd":
        from sklearn.linear_model import SGDClassifier
        make = lambda: SGDClassifier(loss="log_loss", alpha=1e-6, max_iter=epochs,  # noqa: E731
                                     tol=None, random_state=0)
    elif impl == "saga":
        from sklearn.linear_model import LogisticRegression
        make = lambda: LogisticRegression(solver="saga", max_iter=epochs, tol=0.0,  # noqa: E731
                                          random_state=0)
    else:
        raise ValueError(f"unknown implementation {impl!r}")

    def fit():
        from sklearn.exceptions import ConvergenceWarning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return make().fit(X_tr, y_tr)

    return fit, lambda model: float(model.score(X_te, y_te)), X_tr.nnz, (X_tr, y_tr)


class MLPFit:
    """One fit of 10 epochs of a (100,) network; ``impl`` as in MLP_IMPLS."""
    params = (MLP_PROBLEMS, MLP_IMPLS)
    param_names = ["problem", "impl"]
    timeout = 300

    def setup(self, problem, impl):
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed")
        _api.need("fastadam.sklearn")
        self.limits = _limit_threads()
        self.fit, self.score = build_mlp(problem, impl, epochs=10)

    def teardown(self, problem, impl):
        self.limits.restore_original_limits()

    def time_fit(self, problem, impl):
        self.fit()

    def track_test_score(self, problem, impl):
        return self.score(self.fit())

    track_test_score.unit = "accuracy or R^2 on the test split (not a ratio, not gated)"


class SparseLinearFit:
    """Two epochs on 1e4 hashed documents, 1e5 and 1e6 features (per-epoch time should follow
    the non-zeros, not the feature count)."""
    params = (["fastadam", "sgd", "saga"], [10**5, 10**6])
    param_names = ["impl", "n_features"]
    timeout = 300

    def setup(self, impl, n_features):
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed")
        _api.need("fastadam.sklearn")
        self.limits = _limit_threads()
        self.fit, self.score, _, _ = build_sparse(impl, 10000, n_features, epochs=2)

    def teardown(self, impl, n_features):
        self.limits.restore_original_limits()

    def time_fit(self, impl, n_features):
        self.fit()


class SparseLinearEpoch:
    """One more epoch (partial_fit) of a fitted model on 1e4 hashed documents: the steady
    per-epoch cost, without allocating and first touching the weight tables."""
    params = (["fastadam", "sgd"], [10**5, 10**6])
    param_names = ["impl", "n_features"]
    timeout = 300

    def setup(self, impl, n_features):
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed")
        _api.need("fastadam.sklearn")
        self.limits = _limit_threads()
        fit, _, _, (self.X, self.y) = build_sparse(impl, 10000, n_features, epochs=1)
        self.model = fit()

    def teardown(self, impl, n_features):
        self.limits.restore_original_limits()

    def time_one_more_epoch(self, impl, n_features):
        self.model.partial_fit(self.X, self.y)


class SklearnRatioVsSklearn:
    """The ratio that matters, measured in one process: fastadam.sklearn.MLPClassifier's fit
    against scikit-learn's MLPClassifier (solver="adam") with the same settings, 3 epochs of a
    (100,) network on the digits data, 1 thread, the two fits timed in interleaved rounds.
    Skipped without scikit-learn or on a commit without fastadam.sklearn."""

    params = (["digits"],)
    param_names = ["problem"]
    timeout = 120

    def setup(self, problem):
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed") from None
        _api.need("fastadam.sklearn")
        median_seconds_interleaved = _api.timer()
        limits = _limit_threads()
        try:
            fits = {impl: build_mlp(problem, impl, epochs=3)[0]
                    for impl in ("sklearn", "fastadam")}
            seconds = median_seconds_interleaved(fits, repeats=5, min_time=0.0)
        finally:
            limits.restore_original_limits()
        self.speedup = seconds["sklearn"] / seconds["fastadam"]

    def track_speedup_vs_sklearn_fit(self, problem):
        return self.speedup

    track_speedup_vs_sklearn_fit.unit = ("x (scikit-learn fit time / fastadam fit time), "
                                         "higher is better")
