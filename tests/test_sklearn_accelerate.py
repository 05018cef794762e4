"""fastadam.sklearn.AdamOptimizer / accelerate_mlp(): scikit-learn's own MLP on the fused step.

The reference is scikit-learn itself: its private AdamOptimizer step by step, and its MLP fitted
without the swap (same data, same random_state) for fit, partial_fit, warm_start,
early_stopping, sample_weight and sparse X."""
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
from fastadam.sklearn import _accelerate  # noqa: E402


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
            if dtype == np.float64:
                np.testing.assert_array_equal(p, q)
            else:
                np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    assert ours.t == ref.t == 6
    assert ours.learning_rate == pytest.approx(ref.learning_rate, rel=1e-15)
    for a, b in zip(ours.ms + ours.vs, ref.ms + ref.vs):
        np.testing.assert_allclose(a, b, rtol=1e-5 if dtype == np.float32 else 1e-14, atol=1e-30)


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


def _assert_same_coefs(a, b, rtol=1e-12, atol=1e-12):
    assert isinstance(b._optimizer, fsk.AdamOptimizer)
    assert not isinstance(a._optimizer, fsk.AdamOptimizer)
    for p, q in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
        np.testing.assert_allclose(q, p, rtol=rtol, atol=atol)
    assert a.n_iter_ == b.n_iter_
    np.testing.assert_allclose(b.loss_curve_, a.loss_curve_, rtol=max(rtol, 1e-10))


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


@pytest.mark.skipif("sample_weight" not in inspect.signature(MLPRegressor.fit).parameters,
                    reason="scikit-learn's MLP takes sample_weight from 1.7 on")
def test_regressor_sample_weight_and_sparse_X_equal_sklearn(rng):
    X = sp.random(100, 12, density=0.3, format="csr", random_state=0)
    y = rng.standard_normal((100, 2))
    sw = rng.uniform(0.5, 2.0, 100)
    make = lambda: MLPRegressor(hidden_layer_sizes=(10,), max_iter=8, random_state=1)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a, b = _fit_both(make, lambda m: m.fit(X, y, sample_weight=sw))
    _assert_same_coefs(a, b)


def test_float32_fit_is_close_to_sklearn(rng):
    X, y = _data(rng)
    X = X.astype(np.float32)
    make = lambda: MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a, b = _fit_both(make, lambda m: m.fit(X, y))
    assert b.coefs_[0].dtype == np.float32
    _assert_same_coefs(a, b, rtol=1e-4, atol=1e-5)


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
        with fsk.accelerate_mlp():
            pass


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
