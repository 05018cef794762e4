"""What users see from the scikit-learn estimators: warnings point at the caller's line, errors
name the public class."""
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

from fastadam.sklearn import MLPClassifier, MLPRegressor, SparseLinearClassifier  # noqa: E402


@pytest.mark.parametrize("cls", [MLPClassifier, MLPRegressor])
def test_unknown_keyword_names_the_public_class(cls):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected "
                                        r"keyword argument 'momentum'"):
        cls(momentum=0.9)  # scikit-learn's, for solver="sgd"


@pytest.mark.parametrize("cls", [MLPClassifier, MLPRegressor])
def test_solver_adam_is_accepted_and_others_refused_as_sklearn_does(cls):
    from sklearn import neural_network
    rng = np.random.default_rng(0)
    X, y = rng.random((20, 3)), np.arange(20) % 2
    est = cls(solver="adam", hidden_layer_sizes=(3,), max_iter=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
        ref = cls(hidden_layer_sizes=(3,), max_iter=2, random_state=0).fit(X, y)
    assert est.get_params()["solver"] == "adam" and cls().get_params()["solver"] == "adam"
    assert all(np.array_equal(a, b) for a, b in zip(est.coefs_, ref.coefs_))
    # scikit-learn's own refusal of an unknown solver, with this estimator's single option
    with pytest.raises(ValueError) as theirs:
        getattr(neural_network, cls.__name__)(solver="newton").fit(X, y)
    expected = str(theirs.value).split(" must be ")[0] + " must be a str among {'adam'}. Got 'sgd'"
    with pytest.raises(ValueError) as ours:
        cls(solver="sgd").fit(X, y)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value).startswith(expected), (str(ours.value), expected)


@pytest.mark.parametrize("cls", [MLPClassifier, MLPRegressor])
def test_init_copy_keeps_parameters_and_defaults(cls):
    from sklearn.base import clone
    est = cls(hidden_layer_sizes=(3,), alpha=0.5)
    assert clone(est).get_params()["alpha"] == 0.5
    assert cls().get_params()["hidden_layer_sizes"] == (100,)


def test_fit_warnings_point_at_the_callers_line():
    rng = np.random.default_rng(0)
    X, y = rng.random((20, 3)), np.arange(20) % 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MLPClassifier(hidden_layer_sizes=(4,), max_iter=2, batch_size=50).fit(X, y)
    kinds = {type(w.message) for w in caught}
    assert ConvergenceWarning in kinds and UserWarning in kinds
    for w in caught:
        assert w.filename == __file__, (w.filename, w.message)


def test_sparse_linear_convergence_warning_points_at_the_caller():
    rng = np.random.default_rng(0)
    X, y = rng.random((64, 5)), np.arange(64) % 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SparseLinearClassifier(max_iter=1, tol=0.0).fit(X, y)
    assert any(isinstance(w.message, ConvergenceWarning) for w in caught)
    for w in caught:
        assert w.filename == __file__, (w.filename, w.message)
