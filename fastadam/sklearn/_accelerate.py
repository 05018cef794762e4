"""scikit-learn's own MLP on the fused step: a drop-in ``AdamOptimizer`` and ``accelerate_mlp()``.

scikit-learn's ``MLPClassifier``/``MLPRegressor(solver="adam")`` build a private
``sklearn.neural_network._stochastic_optimizers.AdamOptimizer(params, learning_rate_init, beta_1,
beta_2, epsilon)`` and call ``update_params(params, grads)`` once per mini-batch, where ``params``
is ``coefs_ + intercepts_`` (arrays updated in place) and ``grads`` the matching gradients; its
update is Adam in the TensorFlow convention (epsilon outside the bias correction), written as a
dozen NumPy temporaries per array.  ``AdamOptimizer`` below keeps that contract and those
attributes (``t``, ``ms``, ``vs``, ``learning_rate``) and does the update with one
``fastadam.step_inplace(..., convention="tf")`` call for every array, in the same floating-point
order, so the coefficients are those scikit-learn computes.

The MLP looks its optimizer up as the module global ``AdamOptimizer`` of
``sklearn.neural_network._multilayer_perceptron``; ``accelerate_mlp()`` swaps that global for the
duration of a ``with`` block.  Both are private to scikit-learn, so the block is entered only
on a release fastadam was tested with (``_compat``: from 1.7 to the newest CI tests) whose
private contract checks out: ``check_sklearn_contract()`` (names, constructor and method
signatures, activation and loss tables) and, once per process, a probe (a tiny fit with
scikit-learn's loop and with fastadam's, which must agree bit for bit).  Otherwise the block
runs scikit-learn's own MLP, unchanged, with one ``StockFallbackWarning`` saying why.  Building
an ``AdamOptimizer`` directly checks the contract and raises ``RuntimeError`` naming what changed
(importing ``fastadam.sklearn`` never fails on it).

Inside the block the MLP's mini-batch loop is fastadam's too: ``accelerate_mlp()`` also swaps
``BaseMultilayerPerceptron._fit_stochastic`` for ``_sk_backprop.fit_stochastic``, which performs
scikit-learn's very floating-point operations (same NumPy/SciPy/BLAS calls, same order) into
buffers reused across batches, and hands configurations it does not reproduce (sparse ``X``,
other solvers, mixed dtypes) to the stock method.  float64 parameters take the fused step;
other dtypes take ``_numpy_update``, scikit-learn's own update (it computes float32 updates
partly in float64, which the fused float32 kernel does not), so the coefficients are
scikit-learn's bit for bit.
"""
import inspect
import threading
import warnings

import numpy as np

import fastadam

from . import _compat  # the version checks (and a clear ImportError without scikit-learn)

try:  # private modules: their absence must not break ``import fastadam.sklearn``
    from sklearn.neural_network import _multilayer_perceptron as _sk_mlp
    from sklearn.neural_network import _stochastic_optimizers as _sk_opt
except ImportError:  # pragma: no cover - a scikit-learn that reorganised its MLP
    _sk_mlp = _sk_opt = None
try:
    from sklearn.neural_network import _base as _sk_base
except ImportError:  # pragma: no cover
    _sk_base = None

_EXPECTED_INIT = ["self", "params", "learning_rate_init", "beta_1", "beta_2", "epsilon"]
# the MLP methods the accelerated mini-batch loop replaces or calls, with their parameters
_EXPECTED_METHODS = {
    "_fit_stochastic": ["self", "X", "y", "sample_weight", "activations", "deltas", "coef_grads",
                        "intercept_grads", "layer_units", "incremental"],
    "_backprop": ["self", "X", "y", "sample_weight", "activations", "deltas", "coef_grads",
                  "intercept_grads"],
    "_update_no_improvement_count": ["self", "early_stopping", "X", "y", "sample_weight"],
}
_EXPECTED_TABLES = {"ACTIVATIONS": ["identity", "exp", "tanh", "logistic", "relu", "softmax"],
                    "DERIVATIVES": ["identity", "tanh", "logistic", "relu"],
                    "LOSS_FUNCTIONS": ["squared_error", "poisson", "log_loss", "binary_log_loss"]}
_CONTRACT_HINT = ("fastadam.sklearn relies on scikit-learn's private MLP optimizer contract, which "
                  "this scikit-learn version changed; use the stock estimator or "
                  "fastadam.sklearn.MLPClassifier/MLPRegressor")


def _check_names_and_signatures():
    """``check_sklearn_contract`` without the probe."""
    if _sk_opt is None or _sk_mlp is None:
        raise RuntimeError(f"{_CONTRACT_HINT}: sklearn.neural_network._stochastic_optimizers or "
                           "._multilayer_perceptron cannot be imported")
    problems = []
    base = getattr(_sk_opt, "AdamOptimizer", None)
    if not isinstance(base, type):
        problems.append("sklearn.neural_network._stochastic_optimizers.AdamOptimizer is missing")
    else:
        params = list(inspect.signature(base.__init__).parameters)
        if params != _EXPECTED_INIT:
            problems.append(f"AdamOptimizer.__init__ takes {params}, expected {_EXPECTED_INIT}")
        for name in ("update_params", "iteration_ends", "trigger_stopping", "_get_updates"):
            if not callable(getattr(base, name, None)):
                problems.append(f"AdamOptimizer.{name} is missing")
    if not isinstance(getattr(_sk_mlp, "AdamOptimizer", None), type):
        problems.append("sklearn.neural_network._multilayer_perceptron no longer looks up "
                        "AdamOptimizer as a module global")
    base_mlp = getattr(_sk_mlp, "BaseMultilayerPerceptron", None)
    for name, expected in _EXPECTED_METHODS.items():
        method = getattr(base_mlp, name, None)
        if not callable(method):
            problems.append(f"BaseMultilayerPerceptron.{name} is missing")
            continue
        params = list(inspect.signature(method).parameters)
        if params != expected:
            problems.append(f"BaseMultilayerPerceptron.{name} takes {params}, expected {expected}")
    if _sk_base is None:
        problems.append("sklearn.neural_network._base cannot be imported")
    else:
        for table, names in _EXPECTED_TABLES.items():
            missing = sorted(set(names) - set(getattr(_sk_base, table, {})))
            if missing:
                problems.append(f"sklearn.neural_network._base.{table} lacks {missing}")
    if problems:
        raise RuntimeError(f"{_CONTRACT_HINT}: " + "; ".join(problems))


# subclass scikit-learn's optimizer when it exists; if the contract is broken, the class still
# defines (so the estimators of this package stay importable) and refuses to be built
_BASE = getattr(_sk_opt, "AdamOptimizer", None)
_BASE = _BASE if isinstance(_BASE, type) else object


class AdamOptimizer(_BASE):
    """scikit-learn's MLP ``AdamOptimizer`` with the update done by one fused, threaded call.

    Same constructor, attributes and methods as
    ``sklearn.neural_network._stochastic_optimizers.AdamOptimizer`` (it is a subclass), so the MLP
    uses it unchanged.  ``update_params(params, grads)`` applies, per array and in place::

        t += 1
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        learning_rate = learning_rate_init * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        param -= learning_rate * m / (sqrt(v) + epsilon)

    that is ``fastadam.step_inplace(params, grads, ms, vs, t, convention="tf")``.  ``ms`` and
    ``vs`` are updated in place (scikit-learn rebinds new lists each step).  ``num_threads`` is
    passed to the step; results do not depend on it.
    """

    def __init__(self, params, learning_rate_init=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 num_threads=None):
        check_sklearn_contract()
        super().__init__(params, learning_rate_init, beta_1, beta_2, epsilon)
        # C-contiguous moments whatever the parameters' layout (zeros_like keeps Fortran order)
        self.ms = [np.zeros(np.shape(p), dtype=np.asarray(p).dtype) for p in params]
        self.vs = [np.zeros(np.shape(p), dtype=np.asarray(p).dtype) for p in params]
        self.num_threads = num_threads

    def update_params(self, params, grads):
        """Apply one Adam step to ``params`` (updated in place) with ``grads``."""
        params = list(params)
        grads = list(grads)
        if len(params) != len(self.ms) or len(grads) != len(params):
            raise RuntimeError(
                f"{_CONTRACT_HINT}: update_params got {len(params)} params and {len(grads)} grads "
                f"for an optimizer built for {len(self.ms)} arrays")
        if not all(isinstance(p, np.ndarray) and p.dtype == np.float64 for p in params):
            self._numpy_update(params, grads)
            return
        # the MLP's gradients are fresh BLAS/NumPy results; a non-contiguous one (sparse X) is
        # read only, so a contiguous copy of it is harmless
        grads = [g if isinstance(g, np.ndarray) and g.flags.c_contiguous and g.dtype == p.dtype
                 else np.ascontiguousarray(g, dtype=p.dtype) for p, g in zip(params, grads)]
        self._update_prepared(params, grads)

    def _update_prepared(self, params, grads):
        """``update_params`` for float64 lists the caller guarantees: as many C-contiguous
        gradients of the parameters' dtype as parameters (the accelerated mini-batch loop);
        other dtypes go to ``_numpy_update``."""
        if self.ms[0].dtype != np.float64:
            self._numpy_update(params, grads)
            return
        t = self.t + 1
        fastadam.step_inplace(params, grads, self.ms, self.vs, t, lr=self.learning_rate_init,
                              beta1=self.beta_1, beta2=self.beta_2, eps=self.epsilon,
                              convention="tf", num_threads=self.num_threads)
        self.t = t
        self.learning_rate = (self.learning_rate_init * np.sqrt(1 - self.beta_2 ** t)
                              / (1 - self.beta_1 ** t))

    def _numpy_update(self, params, grads):
        """scikit-learn's own update (its ``_get_updates``, then ``param += update``).

        Used for every dtype but float64: scikit-learn's ``learning_rate`` is a NumPy float64
        scalar, so for float32 arrays ``-learning_rate * m / (sqrt(v) + epsilon)`` is computed
        in float64 and rounded when added, which the fused float32 kernel does not do."""
        for param, update in zip(params, _BASE._get_updates(self, grads)):
            param += update

    def _get_updates(self, grads):
        raise NotImplementedError("fastadam.sklearn.AdamOptimizer updates in place: call "
                                  "update_params(params, grads)")

    def __setstate__(self, state):
        state.setdefault("num_threads", None)
        self.__dict__.update(state)


class StockFallbackWarning(UserWarning):
    """``accelerate_mlp()`` ran scikit-learn's own MLP: the installed release is not one
    fastadam was tested with, or its private MLP contract changed."""


_PATCH_LOCK = threading.RLock()
_PROBE = None  # the probe's finding, once per process: "" (agrees) or what differed


def _probe():
    """What differs between scikit-learn's loop and fastadam's on a tiny fit ("" if nothing):
    coefficients, intercepts, loss curve and step counts, bit for bit."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    rng = np.random.RandomState(0)
    X = rng.standard_normal((24, 3))
    y = (X[:, 0] > 0).astype(np.intp) + (X[:, 1] > 0)
    w = rng.uniform(0.5, 1.5, 24)

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return MLPClassifier(hidden_layer_sizes=(4,), batch_size=5, max_iter=3,
                                 random_state=0).fit(X, y, sample_weight=w)

    stock = fit()
    block = accelerate_mlp()
    block._swap_in()
    try:
        ours = fit()
    finally:
        block._leave()
    if not isinstance(ours._optimizer, AdamOptimizer):
        return "the MLP did not build fastadam's AdamOptimizer"
    for name in ("coefs_", "intercepts_"):
        if not all(np.array_equal(a, b) for a, b in zip(getattr(stock, name),
                                                          getattr(ours, name))):
            return f"a probe fit's {name} differ from scikit-learn's"
    for name in ("loss_curve_", "n_iter_", "t_"):
        if getattr(stock, name) != getattr(ours, name):
            return f"a probe fit's {name} differs from scikit-learn's"
    return ""


def check_sklearn_contract(deep=False):
    """Raise ``RuntimeError`` if the installed scikit-learn no longer has the private optimizer
    contract ``AdamOptimizer`` and ``accelerate_mlp()`` rely on; return None otherwise.

    Checks names, signatures and the activation/loss tables; ``deep=True`` also runs the probe
    (once per process): a tiny sample-weighted fit with scikit-learn's mini-batch loop and with
    fastadam's, which must give the same coefficients, loss curve and step counts bit for bit."""
    global _PROBE
    _check_names_and_signatures()
    if deep:
        with _PATCH_LOCK:
            if _PROBE is None:
                _PROBE = _probe()
        if _PROBE:
            raise RuntimeError(f"{_CONTRACT_HINT}: {_PROBE}")


def _stock_reason():
    """Why ``accelerate_mlp()`` must run scikit-learn's own MLP ("" if it need not)."""
    if not _compat.mlp_version_known():
        return (f"scikit-learn {_compat.version_string(_compat.SKLEARN_VERSION)} is not a "
                f"release fastadam was tested with "
                f"({_compat.version_string(_compat.SKLEARN_FLOOR)} to "
                f"{_compat.version_string(_compat.SKLEARN_NEWEST_TESTED)})")
    try:
        check_sklearn_contract(deep=True)
    except RuntimeError as exc:
        return str(exc)
    return ""


class _PatchState:
    """The process-wide swap: ``now = (open blocks, what was swapped out)``, one attribute so
    that one assignment changes both; what was swapped out is (AdamOptimizer global,
    _fit_stochastic) while a block is open."""
    now = (0, None)


class accelerate_mlp:
    """Make scikit-learn's ``MLPClassifier``/``MLPRegressor(solver="adam")`` use
    :class:`AdamOptimizer` and fastadam's mini-batch loop (``_sk_backprop``: scikit-learn's
    operations into reused buffers) inside the ``with`` block::

        with fastadam.sklearn.accelerate_mlp():
            clf = MLPClassifier(solver="adam", random_state=0).fit(X, y)

    ``fit``, ``partial_fit``, ``warm_start`` and ``early_stopping`` work as usual and give the
    coefficients, ``loss_curve_`` and scores scikit-learn computes, bit for bit.  A model fitted
    inside keeps its fastadam optimizer, so later ``partial_fit`` calls outside the block still
    take the fused step (with scikit-learn's own mini-batch loop).  The swap is process-wide
    (other threads' MLP fits inside the block are accelerated too) and does not reach worker
    processes (``GridSearchCV(n_jobs=2)``): enter the block inside the worker, or use
    ``fastadam.sklearn.MLPClassifier``.  Blocks nest.

    On a scikit-learn release fastadam was not tested with, or whose private MLP contract
    changed (see the module docstring), the block swaps nothing and warns once
    (``StockFallbackWarning``, naming the reason): the fits inside are scikit-learn's own.

    Interrupt safety: entering swaps both scikit-learn names and the block count in one
    assignment on one line that calls nothing (no line event, no eval-breaker check inside),
    and leaving restores them the same way, so a KeyboardInterrupt never leaves them half
    swapped.  If one lands in ``__enter__`` after the swap, or in ``__exit__`` before the
    restore, the block object's finalizer (run as the exception unwinds) restores them.
    """

    _entered = False  # a class default: the finalizer must find it even if __init__ never ran

    def __enter__(self) -> "accelerate_mlp":
        reason = _stock_reason()
        if reason:
            warnings.warn(f"accelerate_mlp(): {reason}; this block runs scikit-learn's own MLP",
                          StockFallbackWarning, stacklevel=2)
            return self
        self._swap_in()
        return self

    def _swap_in(self) -> None:
        from . import _sk_backprop  # imports scikit-learn's private MLP helpers: after the check
        base = _sk_mlp.BaseMultilayerPerceptron
        with _PATCH_LOCK:
            if self._entered:
                raise RuntimeError("accelerate_mlp(): this block is already open (use a new "
                                   "accelerate_mlp() for a nested block)")
            depth, original = _PatchState.now
            if depth == 0:
                original = (_sk_mlp.AdamOptimizer, base.__dict__.get("_fit_stochastic"))
                _sk_backprop.original_fit_stochastic = base._fit_stochastic
                new = (AdamOptimizer, _sk_backprop.fit_stochastic, (1, original), True)
                # the swap: one line, no call
                _sk_mlp.AdamOptimizer, base._fit_stochastic, _PatchState.now, self._entered = new
            else:
                _PatchState.now, self._entered = (depth + 1, original), True

    def __exit__(self, *exc) -> None:
        self._leave()

    def __del__(self):
        if self._entered:  # an interrupt stopped __enter__ after the swap or __exit__ before
            self._leave()

    def _leave(self) -> None:
        base = _sk_mlp.BaseMultilayerPerceptron
        with _PATCH_LOCK:
            if not self._entered:
                return
            depth, original = _PatchState.now
            if depth > 1:
                _PatchState.now, self._entered = (depth - 1, original), False
                return
            optimizer, fit_stochastic = original
            if fit_stochastic is None:  # pragma: no cover - inherited, not defined there
                del base._fit_stochastic
                _sk_mlp.AdamOptimizer, _PatchState.now, self._entered = optimizer, (0, None), False
                return
            old = (optimizer, fit_stochastic, (0, None), False)
            # the restore: one line, no call
            _sk_mlp.AdamOptimizer, base._fit_stochastic, _PatchState.now, self._entered = old
