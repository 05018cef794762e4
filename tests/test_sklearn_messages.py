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
                                        r"keyword argument 'solver'"):
        cls(solver="adam")


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
