"""scikit-learn's whole estimator check suite (``check_estimator``) on every fastadam.sklearn
estimator, one pytest case per check, no expected failures.  ``max_iter=100`` (what
scikit-learn uses for its own MLPs in these checks) keeps it to a few seconds."""
import warnings

import pytest

pytest.importorskip("sklearn")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from fastadam.sklearn import MLPClassifier, MLPRegressor, SparseLinearClassifier  # noqa: E402

ESTIMATORS = [
    MLPClassifier(max_iter=100),
    MLPRegressor(max_iter=100),
    SparseLinearClassifier(max_iter=20),
    SparseLinearClassifier(loss="hinge", mode="catchup", max_iter=20),
]


@parametrize_with_checks(ESTIMATORS)
def test_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)
