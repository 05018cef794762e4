"""``MLPClassifier`` / ``MLPRegressor``: scikit-learn estimators trained with a hand-written
backward pass and the fused Adam step.

The network, its initialisation (Glorot uniform), the outputs (one logistic unit for two
classes, softmax for more, identity for regression), the loss scaling (``alpha / sum(w_batch)``
L2 on the weights, not the intercepts), the random draws (initialisation, per-epoch shuffle,
early-stopping split, in scikit-learn's order) and the stopping rules (``tol``,
``n_iter_no_change``, ``early_stopping``) follow scikit-learn's MLP, so in float64 a fit follows
the same trajectory as ``sklearn.neural_network.MLPClassifier(solver="adam")`` up to rounding.
What differs is how a step is computed:

- the shuffled rows are gathered into buffers reused all fit (the whole epoch at once for a
  small X, each mini-batch just before its pass for an X over 1 MiB), in ``dtype`` (X's own by
  default; ``dtype="float32"`` halves the BLAS work);
- a mini-batch runs ``_backprop.BatchPass``: the network's shape is fixed, so its gradient is
  written out (dense layer, activation, then a fused, sample-weighted loss whose value and
  gradient come from one pass of ``_kernels``) with the operations of the autodiff VJPs of
  ``_layers.dense`` and the loss primitives, into buffers allocated once per fit
  (tests check it bit for bit against the plain pass of tests/sklearn_reference.py, that against
  ``fastadam.autodiff.gradient`` of the same network, and both against finite differences);
- the update is one Adam step (``fastadam.step_inplace(..., convention="tf")``'s driver and
  kernel) over the whole parameter array, the L2 term added to the weights' gradients
  beforehand (``g + decay * W``, the step's own coupled weight-decay formula; the intercepts
  get none), in the same pass that sums ``W * W`` for the reported penalty;
- an epoch's mini-batches run in one compiled call (``_kernels.EpochTrainer``: the gather,
  the pass, the L2 term and the step, with the step's arrays and hyper-parameters validated
  once per fit; with ReLU hidden layers the pass itself is compiled too, the one compiled twin
  of ``BatchPass``; tested bit for bit against the Python loop of ``BatchPass.run`` and
  ``fastadam.step_inplace``, timed against it and the autodiff tape in ``asv_bench``);
- predictions run ``BatchPass``' forward half into fresh arrays.

Reproducibility: the random draws come from ``random_state`` only, the Adam step is
bit-identical for any thread count, and BLAS products are computed with the rows (batch) on the
inner dimension only through ``X.T @ delta``, so a fit with a fixed ``random_state`` repeats bit
for bit (``tests/test_sklearn_mlp.py`` checks it for 1 and 2 threads).
"""
import numbers
import types
import warnings

import numpy as np
from scipy.special import expit, log_expit

import fastadam
from ._compat import Interval, StrOptions, _check_sample_weight, validate_data
from . import _kernels
from ._backprop import BatchPass
from ._layers import ACTIVATIONS
from ._progress import EpochProgress
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted



# X larger than this (bytes) is gathered one shuffled mini-batch at a time, not once per epoch
_EPOCH_GATHER_BYTES = 1 << 20


class _BaseMLP(BaseEstimator):
    _parameter_constraints = {
        "hidden_layer_sizes": ["array-like", Interval(numbers.Integral, 1, None, closed="left")],
        "activation": [StrOptions(set(ACTIVATIONS))],
        # scikit-learn's spelling of what these estimators do; its other solvers (lbfgs, sgd with
        # momentum and learning-rate schedules) are not reproduced, and are refused with
        # scikit-learn's own InvalidParameterError at fit
        "solver": [StrOptions({"adam"})],
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}), Interval(numbers.Integral, 1, None, closed="left")],
        "learning_rate_init": [Interval(numbers.Real, 0, None, closed="neither")],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left")],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(numbers.Real, 0, 1, closed="neither")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "beta_1": [Interval(numbers.Real, 0, 1, closed="left")],
        "beta_2": [Interval(numbers.Real, 0, 1, closed="left")],
        "epsilon": [Interval(numbers.Real, 0, None, closed="neither")],
        "dtype": [None, StrOptions({"float32", "float64"})],
        "num_threads": [None, numbers.Integral],
    }

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, solver="adam",
                 alpha=1e-4, batch_size="auto", learning_rate_init=1e-3, max_iter=200, tol=1e-4,
                 n_iter_no_change=10, early_stopping=False, validation_fraction=0.1,
                 shuffle=True, random_state=None, warm_start=False, verbose=False, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-8, dtype=None, num_threads=None):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.dtype = dtype
        self.num_threads = num_threads

    # ---- subclass hooks: _encode_targets, _n_outputs, _loss_kernel, _validation_score ------

    def _hidden_sizes(self):
        sizes = self.hidden_layer_sizes
        sizes = [sizes] if isinstance(sizes, numbers.Integral) else list(sizes)
        if not sizes or any(not isinstance(s, numbers.Integral) or s <= 0 for s in sizes):
            raise ValueError(f"hidden_layer_sizes must be positive integers, got {sizes}.")
        return [int(s) for s in sizes]

    def _initialize(self, layer_units, rng):
        """Glorot-uniform weights and intercepts, fresh Adam state and curves."""
        dtype = self._train_dtype
        factor = 2.0 if self.activation == "logistic" else 6.0
        self.coefs_, self.intercepts_ = [], []
        for fan_in, fan_out in zip(layer_units[:-1], layer_units[1:]):
            bound = np.sqrt(factor / (fan_in + fan_out))
            self.coefs_.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype))
            self.intercepts_.append(rng.uniform(-bound, bound, fan_out).astype(dtype))
        self.n_layers_ = len(layer_units)
        self.n_outputs_ = layer_units[-1]
        self.n_iter_ = 0
        self.t_ = 0
        self.loss_curve_ = []
        self._no_improvement_count = 0
        self._reset_optimizer()
        if self.early_stopping:
            self.validation_scores_ = []
            self.best_validation_score_ = -np.inf
            self.best_loss_ = None
        else:
            self.validation_scores_ = None
            self.best_validation_score_ = None
            self.best_loss_ = np.inf

    def _reset_optimizer(self):
        """Adam restarts: step 0, and zero moments for the parameters laid end to end (weights,
        then intercepts: ``_flatten_parameters``' order)."""
        size = sum(p.size for p in self.coefs_ + self.intercepts_)
        self._adam_t = 0
        self._adam_m = np.zeros(size, self._train_dtype)
        self._adam_v = np.zeros(size, self._train_dtype)

    def _flatten_parameters(self):
        """Lay ``coefs_`` then ``intercepts_`` end to end in one new array and make them views
        of it, so a step is one ``step_inplace`` call on one array; returns that array."""
        params = self.coefs_ + self.intercepts_
        flat = np.concatenate([p.reshape(-1) for p in params]).astype(self._train_dtype,
                                                                        copy=False)
        views, start = [], 0
        for p in params:
            views.append(flat[start:start + p.size].reshape(p.shape))
            start += p.size
        n = len(self.coefs_)
        self.coefs_, self.intercepts_ = views[:n], views[n:]
        return flat

    def _forward_numpy(self, X):
        """Output-layer values (before the output function): the training pass's forward half
        (``BatchPass.forward_into``) into fresh arrays."""
        outputs = [np.empty((X.shape[0], w.shape[1]), w.dtype) for w in self.coefs_]
        return BatchPass.forward_into(X, self.coefs_, self.intercepts_, self.activation, outputs)

    def _fit(self, X, y, sample_weight, incremental, classes=None):
        first_pass = not hasattr(self, "coefs_") or (not self.warm_start and not incremental)
        if first_pass:
            self._train_dtype = self._resolve_dtype(X)
        dtype = self._train_dtype
        X, y = validate_data(self, X, y, reset=first_pass, dtype=dtype, order="C",
                             multi_output=not isinstance(self, ClassifierMixin),
                             y_numeric=not isinstance(self, ClassifierMixin))
        targets = self._encode_targets(y, first_pass, incremental, classes)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, dtype=dtype)
        if self.early_stopping and incremental:
            raise ValueError("partial_fit does not support early_stopping=True")
        rng = check_random_state(self.random_state)
        if first_pass:
            self._initialize([X.shape[1]] + self._hidden_sizes() + [self._n_outputs(targets)], rng)
        elif not incremental:
            self._reset_optimizer()  # warm_start: keep the weights, restart Adam as sklearn does
        if self.early_stopping:
            self._best_coefs = [c.copy() for c in self.coefs_]
            self._best_intercepts = [b.copy() for b in self.intercepts_]
            X, X_val, targets, t_val, sample_weight, sw_val = self._split(
                X, targets, sample_weight, rng)
        n_samples = X.shape[0]
        batch_size = (min(200, n_samples) if self.batch_size == "auto"
                      else int(min(max(self.batch_size, 1), n_samples)))
        if self.batch_size != "auto" and self.batch_size > n_samples:
            # stacklevel 3: fit/partial_fit -> _fit, so the warning names the caller's line
            warnings.warn("Got `batch_size` less than 1 or larger than sample size. It is going "
                          "to be clipped", stacklevel=3)
        epochs = 1 if incremental else self.max_iter
        if not incremental:
            self.n_iter_ = 0
        progress = EpochProgress(self.verbose and not incremental, epochs, type(self).__name__)
        stop_message = None
        order = np.arange(n_samples, dtype=np.intp)
        batch = BatchPass(self.coefs_, batch_size, self.activation, dtype)
        loss, extra = self._loss_kernel()
        params = self._flatten_parameters()  # coefs_, intercepts_: views, updated in place
        trainer = _kernels.EpochTrainer(
            batch, self.coefs_, self.intercepts_, loss, extra, params, self._adam_m,
            self._adam_v, self._adam_t, self.learning_rate_init, self.beta_1, self.beta_2,
            self.epsilon, self.alpha, self.num_threads)
        bounds = [(a, min(a + batch_size, n_samples)) for a in range(0, n_samples, batch_size)]
        # Shuffled rows are gathered into reused buffers: the whole epoch at once when X is
        # small, else each mini-batch just before its pass, by the trainer (a large epoch copy
        # has left the cache by the time its last batches are multiplied).
        per_batch = self.shuffle and X.nbytes > _EPOCH_GATHER_BYTES
        if per_batch:
            Xe = np.empty((batch_size,) + X.shape[1:], X.dtype)
            te = np.empty((batch_size,) + targets.shape[1:], targets.dtype)
            xb, tb = [Xe[:b - a] for a, b in bounds], [te[:b - a] for a, b in bounds]
            # the trainer copies whole rows: C-contiguous sources
            gather = (np.ascontiguousarray(X), np.ascontiguousarray(targets), order)
        else:
            if self.shuffle:
                Xe, te = np.empty_like(X), np.empty_like(targets)
            else:
                Xe, te = X, targets
            xb, tb = [Xe[a:b] for a, b in bounds], [te[a:b] for a, b in bounds]
            gather = ()
        # each batch's sample weights, normalised, and its L2 scale 1 / (sum of its weights)
        uniform = {rows: np.full(rows, 1.0 / rows, dtype=dtype) for rows in
                   {b - a for a, b in bounds}}
        weights = [uniform[b - a] for a, b in bounds]
        scales = [1.0 / float(b - a) for a, b in bounds]
        swe = sample_weight
        if self.shuffle and sample_weight is not None:
            swe = np.empty_like(sample_weight)
        try:
            for _ in range(epochs):
                if self.shuffle:
                    # scikit-learn's draw (it permutes the previous epoch's order with a
                    # shuffled arange; shuffling the order in place makes the same swaps)
                    rng.shuffle(order)
                    if not per_batch:
                        np.take(X, order, axis=0, out=Xe, mode="clip")  # valid rows: unbuffered
                        np.take(targets, order, axis=0, out=te, mode="clip")
                    if swe is not None:
                        np.take(sample_weight, order, out=swe, mode="clip")
                if swe is not None:
                    weights, scales = [], []
                    for a, b in bounds:
                        w_sum = float(swe[a:b].sum(dtype=np.float64))
                        weights.append((swe[a:b] / w_sum).astype(dtype, copy=False))
                        scales.append(1.0 / w_sum)
                try:
                    total = trainer.epoch(xb, tb, weights, scales, *gather)
                finally:
                    self._adam_t = trainer.t
                self.n_iter_ += 1
                self.t_ += n_samples
                self.loss_ = total / n_samples
                self.loss_curve_.append(self.loss_)
                val = None
                if self.early_stopping:
                    val = self._validation_score(X_val, t_val, sw_val)
                self._update_no_improvement(val)
                progress.update(self.n_iter_, self.loss_, val)
                if not np.isfinite(self.loss_):
                    break
                if self._no_improvement_count > self.n_iter_no_change:
                    what = "Validation score" if self.early_stopping else "Training loss"
                    stop_message = (f"{what} did not improve more than tol={self.tol:f} for "
                                    f"{self.n_iter_no_change} consecutive epochs. Stopping.")
                    break
                if not incremental and self.n_iter_ == self.max_iter:
                    warnings.warn(f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) "
                                  f"reached and the optimization hasn't converged yet.",
                                  ConvergenceWarning, stacklevel=3)
        finally:
            progress.close(stop_message)
        if self.early_stopping:
            self.coefs_ = self._best_coefs
            self.intercepts_ = self._best_intercepts
        if not all(np.isfinite(p).all() for p in self.coefs_ + self.intercepts_):
            raise ValueError("Solver produced non-finite parameter weights. The input data may "
                             "contain large values and need to be preprocessed.")
        return self

    def _split(self, X, targets, sample_weight, rng):
        stratify = None
        if isinstance(self, ClassifierMixin):
            # as scikit-learn's MLP (which stratifies only single-column, i.e. binary, targets),
            # so that both draw the same validation split from the same random_state
            stratify = targets if len(self.classes_) == 2 else None
        arrays = [X, targets] + ([sample_weight] if sample_weight is not None else [])
        parts = train_test_split(*arrays, random_state=rng, stratify=stratify,
                                 test_size=self.validation_fraction)
        X_tr, X_val, t_tr, t_val = parts[:4]
        sw_tr, sw_val = (parts[4], parts[5]) if sample_weight is not None else (None, None)
        if X_val.shape[0] < 2:
            raise ValueError("The validation set is too small. Increase 'validation_fraction' "
                             "or the size of your dataset.")
        return X_tr, X_val, t_tr, t_val, sw_tr, sw_val

    def _update_no_improvement(self, val):
        if self.early_stopping:
            self.validation_scores_.append(val)
            if val < self.best_validation_score_ + self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if val > self.best_validation_score_:
                self.best_validation_score_ = val
                self._best_coefs = [c.copy() for c in self.coefs_]
                self._best_intercepts = [b.copy() for b in self.intercepts_]
        else:
            if self.loss_curve_[-1] > self.best_loss_ - self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            self.best_loss_ = min(self.best_loss_, self.loss_curve_[-1])

    def _resolve_dtype(self, X):
        """``dtype``, or, when None, X's own float32/float64 (float64 for anything else), as
        scikit-learn's MLP does."""
        if self.dtype is not None:
            return np.dtype(self.dtype)
        return np.dtype(np.float32) if getattr(X, "dtype", None) == np.float32 else np.dtype(np.float64)

    def _check_X(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=self._train_dtype, order="C")

    def fit(self, X, y, sample_weight=None):
        """Fit the network to ``X`` (n_samples, n_features) and ``y``; ``sample_weight``
        (n_samples,) weights each sample's loss.  Returns self."""
        self._validate_params()
        return self._fit(X, y, sample_weight, incremental=False)


class MLPClassifier(ClassifierMixin, _BaseMLP):
    """Multi-layer perceptron classifier (log-loss) trained with fastadam.

    Parameters and attributes are those of ``sklearn.neural_network.MLPClassifier(solver=
    "adam")``: ``hidden_layer_sizes``, ``activation``, ``solver`` ("adam", the only one: another
    solver is refused at ``fit`` with scikit-learn's ``InvalidParameterError``), ``alpha`` (L2
    on the weights),
    ``batch_size``, ``learning_rate_init``, ``max_iter`` (epochs), ``tol``, ``n_iter_no_change``,
    ``early_stopping``, ``validation_fraction``, ``shuffle``, ``random_state``, ``warm_start``,
    ``verbose`` (a tqdm progress bar with the loss when tqdm is installed, else one line per
    epoch), ``beta_1``, ``beta_2``, ``epsilon``; plus ``dtype`` (None: X's float32/float64 as
    scikit-learn does; "float32" trains and predicts in float32, about twice as fast) and
    ``num_threads`` (the Adam step's threads; results do not depend on it).  As in
    scikit-learn, two classes use one logistic output and more classes a softmax.

    Attributes: ``classes_``, ``coefs_``, ``intercepts_``, ``loss_``, ``loss_curve_``,
    ``n_iter_``, ``t_``, ``best_loss_``, ``validation_scores_``, ``best_validation_score_``,
    ``n_features_in_``, ``n_layers_``, ``n_outputs_``.
    """

    def _encode_targets(self, y, first_pass, incremental, classes):
        check_classification_targets(y)
        if first_pass:
            if incremental:
                if classes is None:
                    raise ValueError("classes must be passed on the first call to partial_fit.")
                self.classes_ = np.unique(classes)
            else:
                self.classes_ = np.unique(y)
            if len(self.classes_) < 2:
                raise ValueError("This solver needs samples of at least 2 classes in the data, "
                                 f"but the data contains only one class: {self.classes_[0]!r}")
        elif classes is not None and not np.array_equal(self.classes_, np.unique(classes)):
            raise ValueError(f"`classes={list(classes)!r}` is not the same as on last call to "
                             f"partial_fit, was: {list(self.classes_)!r}")
        unseen = np.setdiff1d(np.unique(y), self.classes_)
        if unseen.size:
            raise ValueError(f"Expected only labels in classes_ = {list(self.classes_)!r} but "
                             f"got {list(unseen)!r}")
        labels = np.searchsorted(self.classes_, y).astype(np.intp)
        if len(self.classes_) == 2:  # one logistic output: 0/1 targets of shape (n, 1)
            return labels.astype(self._train_dtype).reshape(-1, 1)
        return labels

    def _n_outputs(self, targets):
        return 1 if len(self.classes_) == 2 else len(self.classes_)

    def _loss_kernel(self):
        """``(kernel, extra)``: ``kernel(z, targets, weights, grad, *extra) -> value`` of the
        weighted log-loss, its gradient with respect to the logits ``z`` written to ``grad``
        (``_kernels``)."""
        if len(self.classes_) == 2:
            eps = float(np.finfo(self._train_dtype).eps)  # scikit-learn's clipping of p
            return _kernels.binary_cross_entropy, (eps,)
        return _kernels.softmax_cross_entropy, ()

    @staticmethod
    def _best_index(z):
        return (z[:, 0] > 0).astype(np.intp) if z.shape[1] == 1 else z.argmax(axis=1)

    def _validation_score(self, X, targets, sample_weight):
        labels = targets[:, 0].astype(np.intp) if targets.ndim == 2 else targets
        pred = self._best_index(self._forward_numpy(X))
        return float(accuracy_score(labels, pred, sample_weight=sample_weight))

    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """One epoch over ``(X, y)`` continuing from the current state; ``classes`` (every label
        that can ever appear) is required on the first call.  Returns self."""
        if not hasattr(self, "coefs_"):
            self._validate_params()
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    def _logits(self, X):
        return self._forward_numpy(self._check_X(X))

    def decision_function(self, X):
        """The output layer's values (logits), shape (n_samples, n_classes); for two classes
        the single logit, shape (n_samples,) (positive means ``classes_[1]``)."""
        z = self._logits(X)
        return z[:, 0] if z.shape[1] == 1 else z

    def predict_proba(self, X):
        """Class probabilities, shape (n_samples, n_classes): the softmax of the logits, or
        ``[1 - sigmoid(z), sigmoid(z)]`` for two classes."""
        z = self._logits(X)
        if z.shape[1] == 1:
            p = expit(z)
            return np.hstack([1 - p, p])
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        return z

    def predict_log_proba(self, X):
        """Logarithm of ``predict_proba``."""
        z = self._logits(X)
        if z.shape[1] == 1:
            return np.hstack([log_expit(-z), log_expit(z)])
        z -= z.max(axis=1, keepdims=True)
        z -= np.log(np.exp(z).sum(axis=1, keepdims=True))
        return z

    def predict(self, X):
        """The most probable class of each row."""
        best = self._best_index(self._logits(X))
        return self.classes_[best]


class MLPRegressor(RegressorMixin, _BaseMLP):
    """Multi-layer perceptron regressor (identity output, half squared error) trained with
    fastadam; parameters and attributes as in :class:`MLPClassifier` (without ``classes_``).
    ``y`` may have one or several columns."""

    def _encode_targets(self, y, first_pass, incremental, classes):
        y2 = y.reshape(-1, 1) if y.ndim == 1 else y
        if first_pass:
            self._y_ndim = y.ndim
        elif y2.shape[1] != self.n_outputs_:
            raise ValueError(f"y: expected {self.n_outputs_} target columns as in the previous "
                             f"fit, got {y2.shape[1]}")
        return np.ascontiguousarray(y2, dtype=self._train_dtype)

    def _n_outputs(self, targets):
        return targets.shape[1]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _loss_kernel(self):
        """``(kernel, extra)``: ``kernel(p, targets, weights, grad) -> value`` of the weighted
        half squared error, its gradient with respect to ``p`` written to ``grad``
        (``_kernels``)."""
        return _kernels.half_squared_error, ()

    def _validation_score(self, X, targets, sample_weight):
        return float(r2_score(targets, self._forward_numpy(X), sample_weight=sample_weight))

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over ``(X, y)`` continuing from the current state.  Returns self."""
        if not hasattr(self, "coefs_"):
            self._validate_params()
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X):
        """Predicted targets, shape (n_samples,) or (n_samples, n_outputs) as ``y`` was."""
        pred = self._forward_numpy(self._check_X(X))
        return pred.ravel() if self._y_ndim == 1 else pred


def _own_init(cls):
    """Give ``cls`` a copy of ``_BaseMLP.__init__`` named after ``cls``: Python names the function
    in a wrong-keyword ``TypeError`` (``MLPClassifier.__init__() got an unexpected keyword
    argument 'solver'``), and the private base class is not a name users know."""
    base = _BaseMLP.__init__
    qualname = f"{cls.__name__}.__init__"
    code = base.__code__
    if hasattr(code, "co_qualname"):  # Python >= 3.11 names the code object, not the function
        code = code.replace(co_qualname=qualname)
    init = types.FunctionType(code, base.__globals__, "__init__", base.__defaults__,
                              base.__closure__)
    init.__kwdefaults__ = base.__kwdefaults__
    init.__qualname__, init.__doc__, init.__module__ = qualname, base.__doc__, cls.__module__
    cls.__init__ = init


_own_init(MLPClassifier)
_own_init(MLPRegressor)
