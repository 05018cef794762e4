"""fastadam.sklearn.MLPClassifier / MLPRegressor.

References: scikit-learn's own MLP (same random_state: its Glorot draws, shuffles, outputs,
loss scaling and early-stopping split are reproduced, so float64 coefficients agree to
rounding), finite differences for the fused dense-layer and loss primitives, and NumPy for
predict_proba."""
import inspect
import io
import pickle
import warnings
from contextlib import redirect_stdout

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.neural_network import MLPClassifier as SkMLPClassifier  # noqa: E402
from sklearn.neural_network import MLPRegressor as SkMLPRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import fastadam.autodiff as ad  # noqa: E402
from fastadam.sklearn import MLPClassifier, MLPRegressor  # noqa: E402
from fastadam.sklearn._layers import dense  # noqa: E402
from sklearn_reference import (weighted_half_squared_error,  # noqa: E402
                               weighted_multiclass_hinge, weighted_softmax_cross_entropy)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _blobs(rng, n=150, d=6, k=3):
    centers = rng.standard_normal((k, d)) * 3
    y = rng.integers(0, k, n)
    return centers[y] + rng.standard_normal((n, d)), y


def _max_diff(a, b):
    return max(np.abs(p - q).max() for p, q in zip(a.coefs_ + a.intercepts_,
                                                   b.coefs_ + b.intercepts_))


SKLEARN_MLP_SAMPLE_WEIGHT = "sample_weight" in inspect.signature(SkMLPClassifier.fit).parameters
needs_sklearn_mlp_sample_weight = pytest.mark.skipif(
    not SKLEARN_MLP_SAMPLE_WEIGHT, reason="scikit-learn's MLP takes sample_weight from 1.7 on")


@needs_sklearn_mlp_sample_weight
@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_equals_sklearn_mlp(rng, activation, n_classes):
    X, y = _blobs(rng, k=n_classes)
    sw = rng.uniform(0.5, 2, len(y))
    kw = dict(hidden_layer_sizes=(9, 7), activation=activation, random_state=0, max_iter=6,
              batch_size=32, alpha=1e-3)
    ref = SkMLPClassifier(**kw).fit(X, y, sample_weight=sw)
    ours = MLPClassifier(**kw).fit(X, y, sample_weight=sw)
    assert _max_diff(ref, ours) < 1e-12
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-12)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), rtol=1e-10)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    assert [c.shape for c in ours.coefs_] == [c.shape for c in ref.coefs_]


def test_regressor_and_early_stopping_equal_sklearn(rng):
    X = rng.standard_normal((200, 5))
    y = X @ rng.standard_normal(5) + 0.1 * rng.standard_normal(200)
    kw = dict(hidden_layer_sizes=(12,), random_state=2, max_iter=40, early_stopping=True,
              n_iter_no_change=3)
    ref = SkMLPRegressor(**kw).fit(X, y)
    ours = MLPRegressor(**kw).fit(X, y)
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_, rtol=1e-10)
    assert ours.best_validation_score_ == pytest.approx(ref.best_validation_score_, rel=1e-10)
    assert ours.best_loss_ is None
    assert _max_diff(ref, ours) < 1e-12
    # early stopping restores the best epoch's weights
    assert ours.score(*_val_split(X, y)) == pytest.approx(ours.best_validation_score_)


def test_binary_early_stopping_equals_sklearn(rng):
    X, y = _blobs(rng, n=200, k=2)
    kw = dict(hidden_layer_sizes=(10,), random_state=4, max_iter=30, early_stopping=True,
              n_iter_no_change=2, learning_rate_init=0.01)
    ref = SkMLPClassifier(**kw).fit(X, y)
    ours = MLPClassifier(**kw).fit(X, y)
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_)
    assert _max_diff(ref, ours) < 1e-12


def _val_split(X, y):
    from sklearn.model_selection import train_test_split
    from sklearn.utils import check_random_state
    rng = check_random_state(2)
    sizes = [(5, 12), (12, 1)]
    for fan_in, fan_out in sizes:  # replay the Glorot draws that precede the split
        rng.uniform(size=(fan_in, fan_out))
        rng.uniform(size=fan_out)
    _, X_val, _, y_val = train_test_split(X, y, random_state=rng, test_size=0.1)
    return X_val, y_val


def test_accuracy_close_to_sklearn_with_shuffling_float32(rng):
    X, y = _blobs(rng, n=300)
    ref = SkMLPClassifier(hidden_layer_sizes=(20,), random_state=0, max_iter=30).fit(X, y)
    ours = MLPClassifier(hidden_layer_sizes=(20,), random_state=0, max_iter=30,
                         dtype="float32").fit(X, y)
    assert ours.coefs_[0].dtype == np.float32
    assert ours.predict_proba(X).dtype == np.float32
    assert abs(ours.score(X, y) - ref.score(X, y)) <= 0.02


def test_reproducible_bit_for_bit_for_any_thread_count(rng):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    X, y = _blobs(rng, n=400, d=30)
    fits = []
    for blas_threads, num_threads in [(1, 1), (2, 2), (2, None)]:
        with threadpoolctl.threadpool_limits(blas_threads):
            m = MLPClassifier(hidden_layer_sizes=(64, 32), random_state=7, max_iter=5,
                              num_threads=num_threads).fit(X, y)
        fits.append(m)
    for m in fits[1:]:
        for p, q in zip(fits[0].coefs_ + fits[0].intercepts_, m.coefs_ + m.intercepts_):
            np.testing.assert_array_equal(p, q)


def test_partial_fit_equals_fit_epoch_by_epoch(rng):
    X, y = _blobs(rng)
    full = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=3, shuffle=False,
                         tol=0).fit(X, y)
    inc = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, shuffle=False)
    for _ in range(3):
        inc.partial_fit(X, y, classes=[0, 1, 2])
    assert inc.n_iter_ == 3 and inc.t_ == 3 * len(y)
    for p, q in zip(full.coefs_, inc.coefs_):
        np.testing.assert_array_equal(p, q)


def test_warm_start_continues_from_the_weights(rng):
    X, y = _blobs(rng)
    m = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=3, warm_start=True)
    m.fit(X, y)
    before = [c.copy() for c in m.coefs_]
    m.fit(X, y)
    assert len(m.loss_curve_) == 6
    cold = clone(m).set_params(warm_start=False).fit(X, y)
    assert len(cold.loss_curve_) == 3
    assert not np.array_equal(before[0], m.coefs_[0])


def test_predict_proba_is_softmax_of_logits(rng):
    X, y = _blobs(rng)
    m = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=5).fit(X, y)
    z = m.decision_function(X)
    expected = np.exp(z - z.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(m.predict_proba(X), expected, rtol=1e-12)
    np.testing.assert_allclose(m.predict_log_proba(X), np.log(expected), rtol=1e-10)
    np.testing.assert_array_equal(m.predict(X), m.classes_[z.argmax(1)])


def test_binary_decision_function_and_string_labels(rng):
    X, y = _blobs(rng, k=2)
    labels = np.array(["no", "yes"])[y]
    m = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=20).fit(X, labels)
    d = m.decision_function(X)
    assert d.shape == (len(y),)
    np.testing.assert_array_equal(m.predict(X), np.where(d > 0, "yes", "no"))


def test_verbose_prints_progress_without_tqdm(rng, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    X, y = _blobs(rng)
    out = io.StringIO()
    with redirect_stdout(out):
        m = MLPClassifier(hidden_layer_sizes=(4,), random_state=0, max_iter=3,
                          verbose=True).fit(X, y)
    lines = out.getvalue().splitlines()
    assert lines[:3] == [f"Iteration {i + 1}, loss = {m.loss_curve_[i]:.8f}" for i in range(3)]


def test_verbose_uses_tqdm_when_installed(rng, capsys):
    pytest.importorskip("tqdm")
    X, y = _blobs(rng)
    MLPClassifier(hidden_layer_sizes=(4,), random_state=0, max_iter=3, verbose=True).fit(X, y)
    assert "loss=" in capsys.readouterr().err


def test_pickle_clone_pipeline_and_gridsearch_two_jobs(rng):
    X, y = _blobs(rng)
    m = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=10).fit(X, y)
    again = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(again.predict_proba(X), m.predict_proba(X))
    assert clone(m).get_params() == m.get_params()
    pipe = make_pipeline(StandardScaler(), MLPClassifier(random_state=0, max_iter=30,
                                                         learning_rate_init=0.02))
    grid = {"mlpclassifier__hidden_layer_sizes": [(4,), (8,)]}
    parallel = GridSearchCV(pipe, grid, cv=2, n_jobs=2).fit(X, y)
    serial = GridSearchCV(pipe, grid, cv=2, n_jobs=1).fit(X, y)
    assert parallel.best_score_ > 0.8
    np.testing.assert_array_equal(parallel.cv_results_["mean_test_score"],
                                  serial.cv_results_["mean_test_score"])


def test_regressor_multi_output(rng):
    X = rng.standard_normal((120, 4))
    Y = np.column_stack([X.sum(1), X[:, 0] - X[:, 1]])
    m = MLPRegressor(hidden_layer_sizes=(16,), random_state=0, max_iter=300,
                     learning_rate_init=0.01).fit(X, Y)
    assert m.predict(X).shape == (120, 2)
    assert m.score(X, Y) > 0.9


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
def test_dense_layer_gradients_by_finite_differences(rng, activation):
    h = rng.standard_normal((5, 3)) + 0.05
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal(4)
    order = 1 if activation == "relu" else 2
    ad.check_grads(lambda h, w, b: ad.sum(dense(h, w, b, activation) ** 2), h, w, b,
                   order=order)


@pytest.mark.parametrize("loss", ["sce", "hse", "hinge"])
def test_weighted_losses_by_finite_differences(rng, loss):
    z = rng.standard_normal((6, 4))
    labels = rng.integers(0, 4, 6).astype(np.intp)
    w = rng.uniform(0.1, 1, 6)
    w /= w.sum()
    targets = rng.standard_normal((6, 4))
    fn = {"sce": lambda z: weighted_softmax_cross_entropy(z, labels, w),
          "hse": lambda z: weighted_half_squared_error(z, targets, w),
          "hinge": lambda z: weighted_multiclass_hinge(z, labels, w)}[loss]
    ad.check_grads(fn, z, order=1)


def test_weighted_softmax_cross_entropy_equals_sklearn_log_loss(rng):
    from sklearn.metrics import log_loss
    z = rng.standard_normal((10, 3))
    labels = rng.integers(0, 3, 10).astype(np.intp)
    sw = rng.uniform(0.5, 2, 10)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    value = weighted_softmax_cross_entropy(ad.Tensor(z), labels, sw / sw.sum()).data
    assert value == pytest.approx(log_loss(labels, p, sample_weight=sw, labels=[0, 1, 2]))


# ---- errors (scikit-learn's own types; one test per message) --------------------------------

def test_partial_fit_needs_classes_first(rng):
    X, y = _blobs(rng)
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        MLPClassifier().partial_fit(X, y)


def test_partial_fit_rejects_unseen_labels(rng):
    X, y = _blobs(rng)
    m = MLPClassifier(max_iter=2).partial_fit(X, y, classes=[0, 1, 2])
    with pytest.raises(ValueError, match=r"Expected only labels in classes_ = \[.*\] but got"):
        m.partial_fit(X, y + 5)


def test_partial_fit_rejects_changed_classes(rng):
    X, y = _blobs(rng)
    m = MLPClassifier().partial_fit(X, y, classes=[0, 1, 2])
    with pytest.raises(ValueError, match="is not the same as on last call to partial_fit"):
        m.partial_fit(X, y, classes=[0, 1, 2, 3])


def test_one_class_is_rejected(rng):
    X, _ = _blobs(rng)
    with pytest.raises(ValueError, match="at least 2 classes"):
        MLPClassifier().fit(X, np.zeros(len(X)))


def test_multilabel_y_is_rejected(rng):
    X, _ = _blobs(rng)
    with pytest.raises(ValueError, match=r"y should be a 1d array, got an array of shape"):
        MLPClassifier().fit(X, rng.integers(0, 2, (len(X), 2)))


def test_partial_fit_with_early_stopping_is_rejected(rng):
    X, y = _blobs(rng)
    with pytest.raises(ValueError, match="partial_fit does not support early_stopping=True"):
        MLPClassifier(early_stopping=True).partial_fit(X, y, classes=[0, 1, 2])


def test_too_small_validation_set_is_rejected(rng):
    X, y = _blobs(rng, n=8)
    with pytest.raises(ValueError, match="The validation set is too small"):
        MLPRegressor(early_stopping=True, validation_fraction=0.1).fit(X, y.astype(float))


def test_bad_hidden_layer_sizes_are_rejected(rng):
    X, y = _blobs(rng)
    with pytest.raises(ValueError, match="hidden_layer_sizes must be positive integers"):
        MLPClassifier(hidden_layer_sizes=(4, 0)).fit(X, y)


def test_regressor_partial_fit_rejects_other_target_columns(rng):
    X = rng.standard_normal((20, 3))
    m = MLPRegressor().partial_fit(X, rng.standard_normal((20, 2)))
    with pytest.raises(ValueError, match="expected 2 target columns as in the previous fit"):
        m.partial_fit(X, rng.standard_normal((20, 3)))


def test_nan_in_X_is_rejected_with_sklearn_message(rng):
    X, y = _blobs(rng)
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        MLPClassifier().fit(X, y)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_weights_are_reported(rng):
    X, y = _blobs(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.raises(ValueError, match="Solver produced non-finite parameter weights"):
            MLPRegressor(max_iter=5, random_state=0, dtype="float32").fit(X * 1e30, y * 1e30)


@pytest.mark.parametrize("estimator", ["classifier", "regressor"])
@pytest.mark.parametrize("weighted", [False, True])
def test_per_batch_gather_equals_epoch_gather_bit_for_bit(rng, monkeypatch, estimator, weighted):
    """Large X is gathered one shuffled mini-batch at a time, small X once per epoch: the
    same rows in the same order, so the same bits (the per-batch path forced here)."""
    from fastadam.sklearn import _mlp
    X, y = _blobs(rng, n=230, d=5)
    sw = rng.uniform(0.5, 2, len(y)) if weighted else None
    if estimator == "classifier":
        make = lambda: MLPClassifier(hidden_layer_sizes=(7,), random_state=3,  # noqa: E731
                                     max_iter=4, batch_size=64, alpha=1e-3)
    else:
        y = X @ rng.standard_normal(5)
        make = lambda: MLPRegressor(hidden_layer_sizes=(7,), random_state=3,  # noqa: E731
                                    max_iter=4, batch_size=64, alpha=1e-3)
    epoch = make().fit(X, y, sample_weight=sw)
    monkeypatch.setattr(_mlp, "_EPOCH_GATHER_BYTES", 0)
    per_batch = make().fit(X, y, sample_weight=sw)
    assert epoch.loss_curve_ == per_batch.loss_curve_
    for p, q in zip(epoch.coefs_ + epoch.intercepts_, per_batch.coefs_ + per_batch.intercepts_):
        assert p.tobytes() == q.tobytes()
