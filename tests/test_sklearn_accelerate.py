"""fastadam.sklearn.AdamOptimizer / accelerate_mlp(): scikit-learn's own MLP on the fused step
and fastadam's mini-batch loop.

The reference is scikit-learn itself: its private AdamOptimizer step by step, and its MLP fitted
without the swap (same data, same random_state) for fit, partial_fit, warm_start,
early_stopping, sample_weight and sparse X.  Every comparison is exact (np.array_equal, ==):
the accelerated fit must perform scikit-learn's floating-point operations, not approximate them."""
import inspect
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
import scipy.sparse as sp  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.neural_network import _multilayer_perceptron as sk_mlp  # noqa: E402
from sklearn.neural_network import _stochastic_optimizers as sk_opt  # noqa: E402

import fastadam.sklearn as fsk  # noqa: E402
from fastadam.sklearn import _accelerate, _sk_backprop  # noqa: E402

HAS_SAMPLE_WEIGHT = "sample_weight" in inspect.signature(MLPRegressor.fit).parameters
needs_sample_weight = pytest.mark.skipif(not HAS_SAMPLE_WEIGHT,
                                         reason="scikit-learn's MLP takes sample_weight from 1.7 on")


def test_import_fastadam_does_not_import_sklearn():
    code = "import sys, fastadam; assert 'sklearn' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _data(rng, n=120, d=7, k=3):
    X = rng.standard_normal((n, d))
    y = rng.integers(0, k, n)
    return X, y


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_params_matches_sklearn_step_by_step(rng, dtype):
    params = [rng.standard_normal((5, 4)).astype(dtype), rng.standard_normal(4).astype(dtype)]
    ref_params = [p.copy() for p in params]
    ours = fsk.AdamOptimizer(params, 0.01, 0.8, 0.99, 1e-7)
    ref = sk_opt.AdamOptimizer(ref_params, 0.01, 0.8, 0.99, 1e-7)
    for _ in range(6):
        grads = [rng.standard_normal(p.shape).astype(dtype) for p in params]
        ours.update_params(params, grads)
        ref.update_params(ref_params, [g.copy() for g in grads])
        for p, q in zip(params, ref_params):
            np.testing.assert_array_equal(p, q)
    assert ours.t == ref.t == 6
    assert ours.learning_rate == ref.learning_rate
    for a, b in zip(ours.ms + ours.vs, ref.ms + ref.vs):
        np.testing.assert_array_equal(a, b)


def test_is_a_subclass_and_keeps_the_contract():
    assert issubclass(fsk.AdamOptimizer, sk_opt.AdamOptimizer)
    opt = fsk.AdamOptimizer([np.zeros(3)])
    assert opt.trigger_stopping("msg", False) is True
    opt.iteration_ends(10)
    with pytest.raises(NotImplementedError, match="updates in place"):
        opt._get_updates([np.zeros(3)])


def _fit_both(make, fit):
    reference = fit(make())
    with fsk.accelerate_mlp():
        accelerated = fit(make())
    return reference, accelerated


def _assert_same_coefs(a, b):
    """Every fitted number of the two models is the same, bit for bit."""
    assert isinstance(b._optimizer, fsk.AdamOptimizer)
    assert not isinstance(a._optimizer, fsk.AdamOptimizer)
    assert len(a.coefs_) == len(b.coefs_)
    for p, q in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
        assert p.dtype == q.dtype
        assert np.array_equal(p, q), np.abs(p - q).max()
    assert a.n_iter_ == b.n_iter_ and a.t_ == b.t_
    assert a.loss_curve_ == b.loss_curve_
    assert a.loss_ == b.loss_ and type(a.loss_) is type(b.loss_)
    assert a.best_loss_ == b.best_loss_ or (a.best_loss_ is None and b.best_loss_ is None)
    assert a.validation_scores_ == b.validation_scores_
    assert a.best_validation_score_ == b.best_validation_score_
    for p, q in zip(a._optimizer.ms + a._optimizer.vs, b._optimizer.ms + b._optimizer.vs):
        assert np.array_equal(p, q)


@pytest.mark.parametrize("kwargs", [
    {},
    {"early_stopping": True, "n_iter_no_change": 2},
    {"batch_size": 16, "alpha": 1e-2, "activation": "tanh"},
])
def test_classifier_fit_equals_sklearn(rng, kwargs):
    X, y = _data(rng)
    make = lambda: MLPClassifier(hidden_layer_sizes=(8, 6), max_iter=15, random_state=0,  # noqa: E731
                                 **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a, b = _fit_both(make, lambda m: m.fit(X, y))
    _assert_same_coefs(a, b)


@needs_sample_weight
def test_regressor_sample_weight_and_sparse_X_equal_sklearn(rng):
    X = sp.random(100, 12, density=0.3, format="csr", random_state=0)
    y = rng.standard_normal((100, 2))
    sw = rng.uniform(0.5, 2.0, 100)
    make = lambda: MLPRegressor(hidden_layer_sizes=(10,), max_iter=8, random_state=1)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a, b = _fit_both(make, lambda m: m.fit(X, y, sample_weight=sw))
    _assert_same_coefs(a, b)


def test_float32_fit_equals_sklearn(rng):
    X, y = _data(rng)
    X = X.astype(np.float32)
    make = lambda: MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a, b = _fit_both(make, lambda m: m.fit(X, y))
    assert b.coefs_[0].dtype == np.float32
    _assert_same_coefs(a, b)


def test_partial_fit_and_warm_start_equal_sklearn(rng):
    X, y = _data(rng)

    def partial(m):
        for _ in range(4):
            m.partial_fit(X, y, classes=np.arange(3))
        return m

    a, b = _fit_both(lambda: MLPClassifier(hidden_layer_sizes=(5,), random_state=3), partial)
    _assert_same_coefs(a, b)
    # a model fitted inside the block keeps its optimizer: later partial_fit stays accelerated
    b.partial_fit(X, y)
    a.partial_fit(X, y)
    _assert_same_coefs(a, b)

    def warm(m):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            m.fit(X, y)
            m.set_params(max_iter=3)
            return m.fit(X, y)

    make = lambda: MLPClassifier(hidden_layer_sizes=(5,), max_iter=4, warm_start=True,  # noqa: E731
                                 random_state=0)
    a, b = _fit_both(make, warm)
    _assert_same_coefs(a, b)


def test_pickled_accelerated_model_resumes(rng):
    X, y = _data(rng)
    with fsk.accelerate_mlp():
        model = MLPClassifier(hidden_layer_sizes=(5,), random_state=0)
        model.partial_fit(X, y, classes=np.arange(3))
    clone = pickle.loads(pickle.dumps(model))
    model.partial_fit(X, y)
    clone.partial_fit(X, y)
    for p, q in zip(model.coefs_, clone.coefs_):
        np.testing.assert_array_equal(p, q)


def test_context_manager_restores_and_nests():
    original = sk_mlp.AdamOptimizer
    with fsk.accelerate_mlp():
        with fsk.accelerate_mlp():
            assert sk_mlp.AdamOptimizer is fsk.AdamOptimizer
        assert sk_mlp.AdamOptimizer is fsk.AdamOptimizer
    assert sk_mlp.AdamOptimizer is original
    with pytest.raises(KeyError):
        with fsk.accelerate_mlp():
            raise KeyError("boom")
    assert sk_mlp.AdamOptimizer is original


def test_changed_constructor_fails_loudly(monkeypatch):
    class Changed(sk_opt.AdamOptimizer):
        def __init__(self, params, learning_rate_init=0.001, betas=(0.9, 0.999), epsilon=1e-8):
            pass

    monkeypatch.setattr(sk_opt, "AdamOptimizer", Changed)
    with pytest.raises(RuntimeError, match=r"private MLP optimizer contract.*__init__ takes"):
        _accelerate.check_sklearn_contract()
    with pytest.warns(fsk.StockFallbackWarning, match=r"contract.*__init__ takes") as record:
        with fsk.accelerate_mlp():
            assert sk_mlp.AdamOptimizer is not fsk.AdamOptimizer  # nothing swapped
    assert len(record) == 1


def test_building_the_optimizer_checks_the_contract(monkeypatch):
    monkeypatch.delattr(sk_opt.BaseOptimizer, "trigger_stopping")
    with pytest.raises(RuntimeError, match="AdamOptimizer.trigger_stopping is missing"):
        fsk.AdamOptimizer([np.zeros(3)])


def test_missing_module_global_fails_loudly(monkeypatch):
    monkeypatch.delattr(sk_mlp, "AdamOptimizer")
    with pytest.raises(RuntimeError, match="no longer looks up AdamOptimizer"):
        _accelerate.check_sklearn_contract()


def test_update_params_with_other_arrays_fails_loudly():
    opt = fsk.AdamOptimizer([np.zeros(3), np.zeros(2)])
    with pytest.raises(RuntimeError, match="update_params got 1 params and 1 grads for an "
                                           "optimizer built for 2 arrays"):
        opt.update_params([np.zeros(3)], [np.ones(3)])


# -- the mini-batch loop (_sk_backprop): every configuration it reproduces, exactly -----------

@pytest.fixture
def count_batches(monkeypatch):
    """How many mini-batches went through fastadam's loop (so a test cannot pass by falling
    back to scikit-learn's own)."""
    calls = []
    original = _sk_backprop.Workspace.backprop

    def counting(self, X, y, sample_weight):
        calls.append(X.shape[0])
        return original(self, X, y, sample_weight)

    monkeypatch.setattr(_sk_backprop.Workspace, "backprop", counting)
    return calls


def _fit_quiet(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(*args, **kwargs)


def _targets(rng, kind, n):
    if kind == "binary":
        return rng.integers(0, 2, n)
    if kind == "multiclass":
        return rng.integers(0, 4, n)
    return (rng.random((n, 3)) < 0.4).astype(int)  # multilabel


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("target", ["binary", "multiclass", "multilabel"])
def test_classifier_batches_equal_sklearn_bit_for_bit(rng, count_batches, activation, target):
    X = rng.standard_normal((90, 6))
    y = _targets(rng, target, 90)
    make = lambda: MLPClassifier(hidden_layer_sizes=(7, 5), activation=activation,  # noqa: E731
                                 batch_size=32, max_iter=4, alpha=1e-3, random_state=2)
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    assert count_batches == [32, 32, 26] * 4
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("loss", ["squared_error", "poisson"])
def test_regressor_batches_equal_sklearn_bit_for_bit(rng, count_batches, activation, loss):
    X = rng.standard_normal((70, 5))
    y = rng.standard_normal((70, 2))
    if loss == "poisson":
        y = rng.poisson(2.0, (70, 2)).astype(float)
    make = lambda: MLPRegressor(hidden_layer_sizes=(6,), activation=activation, loss=loss,  # noqa: E731
                                batch_size=25, max_iter=5, random_state=4)
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    assert len(count_batches) == 15


@pytest.mark.parametrize("estimator", ["classifier", "regressor"])
def test_early_stopping_and_no_shuffle_equal_sklearn(rng, count_batches, estimator):
    X = rng.standard_normal((120, 6))
    if estimator == "classifier":
        y = rng.integers(0, 3, 120)
        cls = MLPClassifier
    else:
        y = X @ rng.standard_normal(6) + 0.1 * rng.standard_normal(120)
        cls = MLPRegressor
    for kwargs in ({"early_stopping": True, "n_iter_no_change": 2, "tol": 0.3},
                   {"shuffle": False, "batch_size": 50, "tol": 1e-1, "n_iter_no_change": 1}):
        make = lambda: cls(hidden_layer_sizes=(9,), max_iter=30, random_state=5,  # noqa: E731
                           **kwargs)
        a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
        _assert_same_coefs(a, b)
        assert a.n_iter_ < 30  # the stopping rule ran, and stopped both at the same epoch
    assert count_batches


@needs_sample_weight
@pytest.mark.parametrize("early_stopping", [False, True])
def test_sample_weight_equals_sklearn(rng, count_batches, early_stopping):
    X = rng.standard_normal((100, 5))
    y = rng.integers(0, 3, 100)
    sw = rng.uniform(0.2, 3.0, 100)
    make = lambda: MLPClassifier(hidden_layer_sizes=(6,), max_iter=6, random_state=1,  # noqa: E731
                                 early_stopping=early_stopping, batch_size=40)
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y, sample_weight=sw))
    _assert_same_coefs(a, b)
    assert count_batches


@pytest.mark.parametrize("estimator", ["classifier", "regressor"])
def test_float32_loop_equals_sklearn(rng, count_batches, estimator):
    X = rng.standard_normal((80, 6)).astype(np.float32)
    if estimator == "classifier":
        y, cls = rng.integers(0, 3, 80), MLPClassifier
    else:  # float32 y: the loop runs; float64 y with float32 X goes to scikit-learn's loop
        y, cls = rng.standard_normal(80).astype(np.float32), MLPRegressor
    make = lambda: cls(hidden_layer_sizes=(7,), activation="tanh", max_iter=5,  # noqa: E731
                       batch_size=30, random_state=0)
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    assert b.coefs_[0].dtype == np.float32
    _assert_same_coefs(a, b)
    assert len(count_batches) == 15
    if estimator == "regressor":
        count_batches.clear()
        y64 = y.astype(np.float64)
        a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y64))
        _assert_same_coefs(a, b)
        assert count_batches == []


def test_sparse_X_and_other_solvers_use_sklearns_loop(rng, count_batches):
    X = sp.random(60, 8, density=0.4, format="csr", random_state=3)
    y = rng.integers(0, 3, 60)
    make = lambda: MLPClassifier(hidden_layer_sizes=(5,), max_iter=3, random_state=0)  # noqa: E731
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    with fsk.accelerate_mlp():
        sgd = _fit_quiet(MLPClassifier(hidden_layer_sizes=(5,), solver="sgd", max_iter=3,
                                       random_state=0), X.toarray(), y)
    ref = _fit_quiet(MLPClassifier(hidden_layer_sizes=(5,), solver="sgd", max_iter=3,
                                   random_state=0), X.toarray(), y)
    for p, q in zip(ref.coefs_, sgd.coefs_):
        assert np.array_equal(p, q)
    assert count_batches == []


def test_partial_fit_warm_start_loop_equal_sklearn(rng, count_batches):
    X = rng.standard_normal((75, 4))
    y = rng.integers(0, 3, 75)

    def partial_then_warm(m):
        for _ in range(3):
            m.partial_fit(X, y, classes=np.arange(3))
        m.set_params(warm_start=True, max_iter=3)
        return _fit_quiet(m, X, y)

    a, b = _fit_both(lambda: MLPClassifier(hidden_layer_sizes=(6,), batch_size=20,
                                           random_state=7), partial_then_warm)
    _assert_same_coefs(a, b)
    assert len(count_batches) == 4 * 3 + 4 * 3
    # a stock model continued inside the block: scikit-learn's optimizer, fastadam's loop
    stock = MLPClassifier(hidden_layer_sizes=(6,), batch_size=20, random_state=7)
    stock.partial_fit(X, y, classes=np.arange(3))
    twin = pickle.loads(pickle.dumps(stock))
    stock.partial_fit(X, y)
    with fsk.accelerate_mlp():
        twin.partial_fit(X, y)
    assert type(twin._optimizer) is sk_opt.AdamOptimizer
    for p, q in zip(stock.coefs_ + stock.intercepts_, twin.coefs_ + twin.intercepts_):
        assert np.array_equal(p, q)


def test_fortran_ordered_X_and_wide_batch_equal_sklearn(rng, count_batches):
    X = np.asfortranarray(rng.standard_normal((50, 6)))
    y = rng.integers(0, 3, 50)
    make = lambda: MLPClassifier(hidden_layer_sizes=(5,), batch_size=500, max_iter=3,  # noqa: E731
                                 random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # batch_size clipped: scikit-learn's warning
        a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    assert count_batches == [50, 50, 50]


def test_fit_stochastic_restored_after_block_and_exception():
    base = sk_mlp.BaseMultilayerPerceptron
    original = base._fit_stochastic
    with fsk.accelerate_mlp():
        assert base._fit_stochastic is _sk_backprop.fit_stochastic
        with fsk.accelerate_mlp():
            assert base._fit_stochastic is _sk_backprop.fit_stochastic
        assert base._fit_stochastic is _sk_backprop.fit_stochastic
    assert base._fit_stochastic is original
    with pytest.raises(ValueError, match="inside"):
        with fsk.accelerate_mlp():
            raise ValueError("inside")
    assert base._fit_stochastic is original and sk_mlp.AdamOptimizer is not fsk.AdamOptimizer


def test_missing_fit_stochastic_fails_loudly(monkeypatch):
    monkeypatch.delattr(sk_mlp.BaseMultilayerPerceptron, "_fit_stochastic")
    with pytest.warns(fsk.StockFallbackWarning,
                      match="BaseMultilayerPerceptron._fit_stochastic is missing"):
        with fsk.accelerate_mlp():
            pass


def test_changed_fit_stochastic_signature_fails_loudly(monkeypatch):
    def renamed(self, X, y, sample_weight, activations, deltas, coef_grads, intercept_grads,
                layer_units, incremental, batch_size):
        pass

    monkeypatch.setattr(sk_mlp.BaseMultilayerPerceptron, "_fit_stochastic", renamed)
    with pytest.warns(fsk.StockFallbackWarning,
                      match=r"_fit_stochastic takes \[.*'batch_size'\], expected"):
        with fsk.accelerate_mlp():
            pass
    assert sk_mlp.BaseMultilayerPerceptron._fit_stochastic is renamed


def test_renamed_backprop_fails_loudly(monkeypatch):
    monkeypatch.delattr(sk_mlp.BaseMultilayerPerceptron, "_backprop")
    with pytest.raises(RuntimeError, match="BaseMultilayerPerceptron._backprop is missing"):
        _accelerate.check_sklearn_contract()


def test_changed_activation_table_fails_loudly(monkeypatch):
    from sklearn.neural_network import _base as sk_base
    monkeypatch.setattr(sk_base, "DERIVATIVES", {"relu": sk_base.inplace_relu_derivative})
    with pytest.raises(RuntimeError, match=r"_base.DERIVATIVES lacks \['identity', 'logistic', "
                                           r"'tanh'\]"):
        _accelerate.check_sklearn_contract()


@pytest.mark.parametrize("hidden", [(), (4, 3, 5)])
def test_no_hidden_layer_and_deep_network_equal_sklearn(rng, count_batches, hidden):
    X = rng.standard_normal((64, 5))
    y = rng.integers(0, 3, 64)
    make = lambda: MLPClassifier(hidden_layer_sizes=hidden, batch_size=20, max_iter=4,  # noqa: E731
                                 random_state=0)
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    assert len(count_batches) == 16


def test_subclass_with_its_own_backprop_or_patched_tables_use_sklearns_loop(rng, count_batches,
                                                                             monkeypatch):
    X = rng.standard_normal((40, 4))
    y = rng.integers(0, 3, 40)

    class DoubledLoss(MLPClassifier):
        def _backprop(self, *args):
            loss, coef_grads, intercept_grads = super()._backprop(*args)
            return 2 * loss, coef_grads, intercept_grads

    make = lambda: DoubledLoss(hidden_layer_sizes=(5,), max_iter=3, random_state=0)  # noqa: E731
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    plain = _fit_quiet(MLPClassifier(hidden_layer_sizes=(5,), max_iter=3, random_state=0), X, y)
    assert a.loss_curve_[0] == 2 * plain.loss_curve_[0]  # the override ran
    assert count_batches == []

    squared = lambda z: np.square(z, out=z)  # noqa: E731
    monkeypatch.setitem(sk_mlp.ACTIVATIONS, "relu", squared)
    make = lambda: MLPClassifier(hidden_layer_sizes=(5,), max_iter=3, random_state=0)  # noqa: E731
    a, b = _fit_both(make, lambda m: _fit_quiet(m, X, y))
    _assert_same_coefs(a, b)
    assert count_batches == []


def test_verbose_lines_and_warm_started_early_stopping_equal_sklearn(rng, count_batches, capsys):
    X = rng.standard_normal((80, 4))
    y = rng.integers(0, 2, 80)

    def fit_twice(m):
        _fit_quiet(m, X, y)
        m.set_params(max_iter=3)
        return _fit_quiet(m, X, y)

    make = lambda: MLPClassifier(hidden_layer_sizes=(6,), max_iter=4, verbose=True,  # noqa: E731
                                 warm_start=True, early_stopping=True, random_state=0)
    a = fit_twice(make())
    stock_out = capsys.readouterr().out
    with fsk.accelerate_mlp():
        b = fit_twice(make())
    assert capsys.readouterr().out == stock_out and "Validation score" in stock_out
    _assert_same_coefs(a, b)
    assert count_batches


# ---- version gate and deep contract check (issue 20) -----------------------------------------

def _stock_and_block_fit(rng):
    X, y = _data(rng)
    make = lambda: MLPClassifier(hidden_layer_sizes=(6,), max_iter=4, batch_size=16,  # noqa
                                 random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        stock = make().fit(X, y)
        with pytest.warns(fsk.StockFallbackWarning) as record:
            with fsk.accelerate_mlp():
                assert sk_mlp.AdamOptimizer is not fsk.AdamOptimizer  # nothing swapped
                inside = make().fit(X, y)
    assert len([r for r in record if r.category is fsk.StockFallbackWarning]) == 1
    assert not isinstance(inside._optimizer, fsk.AdamOptimizer)
    for p, q in zip(stock.coefs_ + stock.intercepts_, inside.coefs_ + inside.intercepts_):
        assert np.array_equal(p, q)
    assert stock.loss_curve_ == inside.loss_curve_
    return record


@pytest.mark.parametrize("version", [(1, 6), (1, 99), (2, 0)])
def test_an_untested_release_runs_stock_with_one_warning(rng, monkeypatch, version):
    from fastadam.sklearn import _compat

    monkeypatch.setattr(_compat, "SKLEARN_VERSION", version)
    record = _stock_and_block_fit(rng)
    assert f"scikit-learn {version[0]}.{version[1]} is not a release" in str(record[0].message)


def test_the_probe_catches_a_loop_that_computes_differently(rng, monkeypatch):
    # a fastadam loop that drifted from scikit-learn's arithmetic (here: one ulp in the step
    # size) passes every signature check; the probe fit must catch it
    original = fsk.AdamOptimizer._update_prepared

    def drifted(self, params, grads):
        original(self, params, grads)
        params[0][0, 0] = np.nextafter(params[0][0, 0], np.inf)

    monkeypatch.setattr(fsk.AdamOptimizer, "_update_prepared", drifted)
    monkeypatch.setattr(_accelerate, "_PROBE", None)
    _accelerate.check_sklearn_contract()  # the shallow check sees nothing
    with pytest.raises(RuntimeError, match="probe fit's coefs_ differ"):
        _accelerate.check_sklearn_contract(deep=True)
    record = _stock_and_block_fit(rng)
    assert "coefs_ differ" in str(record[0].message)
    monkeypatch.setattr(_accelerate, "_PROBE", None)  # the next test probes afresh


def test_the_probe_passes_on_the_installed_release():
    from fastadam.sklearn import _compat

    assert _compat.mlp_version_known(), "CI runs the floor and the newest tested release"
    _accelerate.check_sklearn_contract(deep=True)
    assert _accelerate._PROBE == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error", fsk.StockFallbackWarning)
        with fsk.accelerate_mlp():
            assert sk_mlp.AdamOptimizer is fsk.AdamOptimizer


def test_version_helpers():
    import sklearn

    from fastadam.sklearn import _compat

    assert _compat.parse_version("1.10.dev0") == (1, 10)
    assert _compat.parse_version(sklearn.__version__) == _compat.SKLEARN_VERSION
    with pytest.raises(ValueError, match="version"):
        _compat.parse_version("latest")
    # the declared floor is the one pyproject.toml asks pip for
    import pathlib
    import re
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.exists():  # (not beside the installed wheel's test run)
        floors = set(re.findall(r'"scikit-learn>=([\d.]+)"', pyproject.read_text()))
        assert floors == {_compat.version_string(_compat.SKLEARN_FLOOR)}
