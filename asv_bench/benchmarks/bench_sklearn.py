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
        # the settings these benchmarks always timed (the estimator's defaults until they
        # changed; sparse_linear_report.py compares the new defaults with SGDClassifier's)
        make = lambda: SparseLinearClassifier(  # noqa: E731
            max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1, random_state=0,
            batch_size=1024, learning_rate_init=0.01, alpha=1e-6)
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


def build_mlp_epochs(activation, hidden=(100,), batch_size=200, alpha=1e-4, seed=0):
    """One epoch of mini-batch training (gradient of the L2-regularised mean softmax
    cross-entropy, then an Adam step per batch) of the same (64, *hidden, 10) MLP on the digits
    data, three ways.  Returns ``{impl: epoch()}``:

    - ``compiled``: the estimators' epoch loop, ``_kernels.EpochTrainer`` (with ReLU hidden
      layers the pass is compiled too, the fast twin of ``BatchPass``);
    - ``numpy_pass``: the general hand-written pass, a Python loop of ``BatchPass.run``, the L2
      term and ``fastadam.step_inplace`` (what the compiled loop is tested against bit for bit);
    - ``tape``: the same network written with ``fastadam.autodiff`` (matmul, add, activation,
      ``softmax_cross_entropy`` and the L2 term on the tape, ``autodiff.gradient``), each
      parameter stepped by ``fastadam.step_inplace``: the general path.
    """
    import fastadam
    import fastadam.autodiff as ad
    from fastadam.sklearn import _kernels
    from fastadam.sklearn._backprop import BatchPass
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X = np.ascontiguousarray(X / 16.0)
    y = y.astype(np.intp)
    units = [X.shape[1], *hidden, 10]
    rng = np.random.default_rng(seed)
    bounds = [(a, min(a + batch_size, len(X))) for a in range(0, len(X), batch_size)]
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)

    def network():
        """The parameters as views of one flat array (weights, then intercepts), Adam's
        moments like it."""
        shapes = [(a, b) for a, b in zip(units, units[1:])] + [(b,) for b in units[1:]]
        flat = rng.uniform(-0.1, 0.1, sum(int(np.prod(s)) for s in shapes))
        views, start = [], 0
        for s in shapes:
            size = int(np.prod(s))
            views.append(flat[start:start + size].reshape(s))
            start += size
        n = len(units) - 1
        return flat, views[:n], views[n:], np.zeros_like(flat), np.zeros_like(flat)

    xb = [X[a:b] for a, b in bounds]
    tb = [y[a:b] for a, b in bounds]
    weights = [np.full(b - a, 1.0 / (b - a)) for a, b in bounds]
    scales = [1.0 / (b - a) for a, b in bounds]
    loss = _kernels.softmax_cross_entropy

    flat, coefs, intercepts, m, v = network()
    trainer = _kernels.EpochTrainer(BatchPass(coefs, batch_size, activation, np.float64),
                                    coefs, intercepts, loss, (), flat, m, v, 0, hyper["lr"],
                                    hyper["beta1"], hyper["beta2"], hyper["eps"], alpha, None)

    def compiled():
        return trainer.epoch(xb, tb, weights, scales)

    flat2, coefs2, intercepts2, m2, v2 = network()
    batch = BatchPass(coefs2, batch_size, activation, np.float64)
    state = {"t": 0, "tape_t": 0}

    def numpy_pass():
        total = 0.0
        for Xb, t, w, scale in zip(xb, tb, weights, scales):
            value = batch.run(Xb, coefs2, intercepts2, loss, t, w)
            k = batch.coef_size
            squares = _kernels.add_l2_gradient(batch.gradients[:k], flat2[:k], alpha * scale)
            value += 0.5 * alpha * scale * squares
            state["t"] += 1
            fastadam.step_inplace(flat2, batch.gradients, m2, v2, state["t"], convention="tf",
                                  **hyper)
            total += len(Xb) * value
        return total

    _, coefs3, intercepts3, _, _ = network()
    params = [ad.Tensor(p.copy(), requires_grad=True) for p in coefs3 + intercepts3]
    moments = [(np.zeros_like(p.data), np.zeros_like(p.data)) for p in params]
    act = {"relu": ad.relu, "tanh": ad.tanh, "logistic": ad.sigmoid,
           "identity": lambda h: h}[activation]
    n_layers = len(units) - 1

    def tape():
        total = 0.0
        for Xb, t in zip(xb, tb):
            h = ad.Tensor(Xb)
            for i in range(n_layers):
                h = ad.add(ad.matmul(h, params[i]), params[n_layers + i])
                if i != n_layers - 1:
                    h = act(h)
            value = ad.softmax_cross_entropy(h, t)
            decay = 0.5 * alpha / len(Xb)
            for w in params[:n_layers]:
                value = ad.add(value, ad.multiply(decay, ad.sum(ad.multiply(w, w))))
            grads = ad.gradient(value, params)
            state["tape_t"] += 1
            for p, g, (m_, v_) in zip(params, grads, moments):
                fastadam.step_inplace(p.data, np.ascontiguousarray(g.data), m_, v_,
                                      state["tape_t"], convention="tf", **hyper)
            total += len(Xb) * float(value.data)
        return total

    return {"compiled": compiled, "numpy_pass": numpy_pass, "tape": tape}


class MLPPassRatios:
    """The compiled epoch loop of the MLP estimators (its fast twin of the hand-written pass)
    against the general paths, measured in one process, interleaved rounds, 1 thread: one epoch
    of the digits data through a (100,) network, batches of 200 (the estimators' default) and
    32 (``build_mlp_epochs``).  ``track_numpy_pass_over_compiled`` > 1 is what the compiled
    loop (and, for relu, the compiled pass) earns over the Python loop of ``BatchPass.run``;
    ``track_tape_over_compiled`` what it earns over the autodiff tape.  Measured on a loaded
    2-core machine (2026-11): relu 1.02x / 2.2x at 200 rows, 2.0x / 6.1x at 32 rows; tanh (the
    compiled loop around ``BatchPass.run``) 0.94x / 1.4x at 200 rows, 1.3x / 3.2x at 32."""

    params = (["relu", "tanh"], [200, 32])
    param_names = ["activation", "batch_size"]
    timeout = 180

    def setup(self, activation, batch_size):
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise NotImplementedError("scikit-learn is not installed") from None
        _api.need("fastadam.sklearn")
        median_seconds_interleaved = _api.timer()
        limits = _limit_threads()
        try:
            epochs = build_mlp_epochs(activation, batch_size=batch_size)
            self.seconds = median_seconds_interleaved(epochs, repeats=7, min_time=0.0)
        finally:
            limits.restore_original_limits()

    def track_numpy_pass_over_compiled(self, activation, batch_size):
        return self.seconds["numpy_pass"] / self.seconds["compiled"]

    track_numpy_pass_over_compiled.unit = (
        "x (BatchPass loop time / compiled epoch time), higher is better")

    def track_tape_over_compiled(self, activation, batch_size):
        return self.seconds["tape"] / self.seconds["compiled"]

    track_tape_over_compiled.unit = (
        "x (autodiff tape epoch time / compiled epoch time), higher is better")
