"""scikit-learn's MLP mini-batch loop, same arithmetic, without its per-batch overhead.

``accelerate_mlp()`` swaps ``BaseMultilayerPerceptron._fit_stochastic`` for :func:`fit_stochastic`
below while its ``with`` block is open.  For the configurations reproduced here (solver="adam",
dense float32/float64 ``X``, hidden activation relu/tanh/logistic/identity, output
softmax/logistic/identity/exp with scikit-learn's matching loss, ``y`` of ``X``'s dtype or the
classifier's boolean indicator matrix, ``sample_weight`` absent or of ``X``'s dtype) it runs the
epoch/batch loop itself; anything else goes to scikit-learn's own method unchanged.

Bit-identical coefficients are the point, so every floating-point operation is the one
scikit-learn performs, in the same order and through the same NumPy/SciPy/BLAS routine:
``np.matmul`` (what ``safe_sparse_dot`` calls for dense arrays) with ``out=`` into buffers reused
across batches, ``np.maximum(z, 0, out=z)``, ``np.tanh``/``scipy.special.expit``/``np.exp`` in
place, the softmax as max-subtract/exp/sum-divide along rows, ``np.mean`` as ``np.add.reduce``
followed by ``true_divide`` by an ``intp`` count (what ``numpy._core._methods._mean`` does),
``x**2`` as ``np.square``, the L2 term as ``np.dot(w.ravel(), w.ravel())`` accumulated in the same
scalar types.  What changes is only where results live (preallocated, C-contiguous, sliced to the
batch) and the Python around them (no ``safe_sparse_dot``/``np.average`` wrappers, no fresh
lists per batch).  Two steps are written differently with provably the same bits: the relu
derivative ``delta[z == 0] = 0`` clears the entries' bits with an AND (the masked store was the
largest non-BLAS cost), and the per-epoch ``shuffle`` draws ``RandomState.shuffle(arange(n))``
as ``resample`` does, without its validation.  Weighted losses call scikit-learn's own loss
function.  A subclass overriding ``_backprop``/``_forward_pass``/``_compute_loss_grad``, or an
activation/loss table entry replaced at run time, takes the stock loop.

The epoch loop keeps scikit-learn's observable behaviour: the optimizer is built through the
module global ``AdamOptimizer`` (fastadam's inside the block), the same random draws (early
stopping split, per-epoch ``shuffle``), ``loss_curve_``, ``n_iter_``, ``t_``, verbose lines,
``_update_no_improvement_count``, ``trigger_stopping``, the ConvergenceWarning, best-weight
restore.  The tests compare every attribute with scikit-learn's own fit bit for bit.
"""
import warnings

import numpy as np
from scipy.special import expit, xlogy

from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import _base as _sk_base
from sklearn.neural_network import _multilayer_perceptron as _sk_mlp
from sklearn.utils import gen_batches, shuffle

#: scikit-learn's stock method, called for every configuration not reproduced here
#: (``accelerate_mlp()`` sets it to the method it swaps out)
original_fit_stochastic = _sk_mlp.BaseMultilayerPerceptron._fit_stochastic

_HIDDEN = ("relu", "tanh", "logistic", "identity")
# output activation -> the loss name scikit-learn's _backprop uses with it
_OUTPUT_LOSS = {("softmax", "log_loss"): "log_loss",
                ("logistic", "log_loss"): "binary_log_loss",
                ("identity", "squared_error"): "squared_error",
                ("exp", "poisson"): "poisson"}


# the per-batch methods the loop stands in for, and the table entries it reproduces, as this
# module found them: a subclass overriding one, or a table entry replaced since, means the loop
# would not do what scikit-learn would, so those fits take the stock loop
_BASE_MLP = _sk_mlp.BaseMultilayerPerceptron
_PER_BATCH_METHODS = {name: getattr(_BASE_MLP, name)
                      for name in ("_backprop", "_forward_pass", "_compute_loss_grad")}
_TABLES = (_sk_mlp.ACTIVATIONS, _sk_mlp.DERIVATIVES, _sk_mlp.LOSS_FUNCTIONS)
_STOCK_ENTRIES = [dict(table) for table in _TABLES]


def reproduced(est, X, y, sample_weight):
    """True when :func:`fit_stochastic` reproduces scikit-learn for this fit."""
    if est.solver != "adam" or est.activation not in _HIDDEN:
        return False
    output = getattr(est, "out_activation_", None)
    if (output, est.loss) not in _OUTPUT_LOSS:
        return False
    cls = type(est)
    if any(getattr(cls, name, None) is not method for name, method in _PER_BATCH_METHODS.items()):
        return False
    used = ((est.activation, output), (est.activation,), (_OUTPUT_LOSS[(output, est.loss)],))
    if any(table.get(name) is not stock.get(name)
           for table, stock, names in zip(_TABLES, _STOCK_ENTRIES, used) for name in names):
        return False
    if type(X) is not np.ndarray or X.ndim != 2 or X.dtype not in (np.float32, np.float64):
        return False
    if type(y) is not np.ndarray or y.ndim != 2 or y.dtype not in (np.bool_, X.dtype):
        return False
    if sample_weight is not None and (type(sample_weight) is not np.ndarray
                                      or sample_weight.dtype != X.dtype):
        return False
    return all(p.dtype == X.dtype and p.flags.c_contiguous
               for p in est.coefs_ + est.intercepts_)


class Workspace:
    """Buffers for one fit: activations, deltas, gradients, for batches of up to ``rows``."""

    def __init__(self, est, layer_units, rows, dtype):
        self.n_layers = len(layer_units) - 1
        self.alpha = est.alpha
        self.hidden = est.activation
        self.output = est.out_activation_
        self.loss_name = _OUTPUT_LOSS[(self.output, est.loss)]
        self.x_rows = np.empty((rows, layer_units[0]), dtype=dtype)
        # acts[i] for i >= 1 and deltas[i]: (rows, layer_units[i]) / (rows, layer_units[i + 1])
        self.acts = [None] + [np.empty((rows, u), dtype=dtype) for u in layer_units[1:]]
        self.deltas = [np.empty((rows, u), dtype=dtype) for u in layer_units[1:]]
        self.scratch = [np.empty((rows, u), dtype=dtype) for u in layer_units[1:]]
        self.masks = [np.empty((rows, u), dtype=bool) for u in layer_units[1:]]
        word = np.int64 if np.dtype(dtype).itemsize == 8 else np.int32
        self.keep_bits = [np.empty((rows, u), dtype=word) for u in layer_units[1:]]
        self.coef_grads = [np.empty((a, b), dtype=dtype)
                           for a, b in zip(layer_units[:-1], layer_units[1:])]
        self.intercept_grads = [np.empty(b, dtype=dtype) for b in layer_units[1:]]
        self.decay = [np.empty_like(g) for g in self.coef_grads]
        self.grads = self.coef_grads + self.intercept_grads
        self.row = np.empty(rows, dtype=dtype)
        out_cols = layer_units[-1]
        self.eps = np.finfo(dtype).eps
        self.one_minus_eps = 1 - self.eps
        self.clipped = np.empty((rows, out_cols), dtype=dtype)
        # xlogy's loop is the first of its signatures the inputs cast to safely: for a boolean
        # y and float32 probabilities that is 'dd->d', so the log terms are float64
        xlogy_dtype = xlogy(np.zeros(1, dtype=bool), np.ones(1, dtype=dtype)).dtype
        self.log_terms = np.empty((rows, out_cols), dtype=xlogy_dtype)
        self.col = np.empty(out_cols, dtype=xlogy_dtype)

    def bind(self, coefs, intercepts):
        self.coefs = coefs
        self.intercepts = intercepts
        self.flat_coefs = [c.ravel() for c in coefs]
        self.coefs_t = [c.T for c in coefs]
        self.layers = list(zip(coefs, self.coef_grads, self.decay, self.intercept_grads))
        self._rows = {}

    def rows(self, n):
        """The buffers cut to a batch of ``n`` rows (C-contiguous leading slices), cached: a fit
        sees two batch sizes, the full one and the last."""
        views = self._rows.get(n)
        if views is None:
            cut = lambda arrays: [a[:n] for a in arrays]  # noqa: E731
            views = self._rows[n] = (
                [None] + cut(self.acts[1:]), cut(self.deltas), cut(self.scratch),
                cut(self.masks), cut(self.keep_bits), self.row[:n], self.clipped[:n],
                self.log_terms[:n], np.intp(n))
        return views

    # -- one mini-batch: scikit-learn's _backprop, operation for operation -------------------
    def backprop(self, X, y, sample_weight):
        n = X.shape[0]
        acts, deltas, scratch, masks, keep_bits, row, clipped, log_terms, count = self.rows(n)
        acts[0] = X
        L = self.n_layers
        coefs, intercepts, hidden = self.coefs, self.intercepts, self.hidden
        matmul, add = np.matmul, np.add
        for i in range(L):
            z = acts[i + 1]
            matmul(acts[i], coefs[i], out=z)
            add(z, intercepts[i], out=z)
            if i + 1 == L:
                break
            if hidden == "relu":
                np.maximum(z, 0, out=z)
            elif hidden == "tanh":
                np.tanh(z, out=z)
            elif hidden == "logistic":
                expit(z, out=z)
        out = acts[L]
        output = self.output
        if output == "softmax":
            shifted = scratch[L - 1]
            np.maximum.reduce(out, axis=1, out=row)
            np.subtract(out, row[:, np.newaxis], out=shifted)
            np.exp(shifted, out=out)
            add.reduce(out, axis=1, out=row)
            np.true_divide(out, row[:, np.newaxis], out=out)
        elif output == "logistic":
            expit(out, out=out)
        elif output == "exp":
            np.exp(out, out=out)

        if sample_weight is None and self.loss_name == "log_loss" and y.dtype == np.bool_ \
                and out.shape[1] > 1 and y.shape[1] > 1:
            # log_loss: clip, xlogy, np.average over rows, sum, negate
            np.clip(out, self.eps, self.one_minus_eps, out=clipped)
            xlogy(y, clipped, out=log_terms)
            col = self.col
            add.reduce(log_terms, axis=0, out=col)
            loss = -np.true_divide(col, count, out=col, casting="unsafe", subok=False).sum()
        else:
            loss = self._loss(y, out, sample_weight, count)
        values = 0
        for s in self.flat_coefs:
            values += np.dot(s, s)
        sw_sum = n if sample_weight is None else sample_weight.sum()
        loss += (0.5 * self.alpha) * values / sw_sum

        last = L - 1
        delta = deltas[last]
        np.subtract(out, y, out=delta)
        if sample_weight is not None:
            np.multiply(delta, sample_weight.reshape(-1, 1), out=delta)
        layers, alpha, divide = self.layers, self.alpha, np.true_divide
        for i in range(last, -1, -1):
            # _compute_loss_grad(i): activations[i].T @ delta + alpha * W, / sw_sum; the
            # intercept gradient np.sum(delta, axis=0) / sw_sum
            coef, cg, decay, ig = layers[i]
            matmul(acts[i].T, delta, out=cg)
            np.multiply(coef, alpha, out=decay)
            add(cg, decay, out=cg)
            divide(cg, sw_sum, out=cg)
            add.reduce(delta, axis=0, out=ig)
            divide(ig, sw_sum, out=ig)
            if i == 0:
                break
            # deltas[i - 1] = delta @ W[i].T, then the hidden activation's derivative at acts[i]
            prev = deltas[i - 1]
            matmul(delta, self.coefs_t[i], out=prev)
            z = acts[i]
            if hidden == "relu":
                # ``prev[z == 0] = 0``: clear every bit of the entries where z == 0 (what
                # storing +0.0 does) by an AND with 0 / all-ones words; 5x faster than the
                # masked store
                mask, keep = masks[i - 1], keep_bits[i - 1]
                np.not_equal(z, 0, out=mask)
                np.copyto(keep, mask)
                np.negative(keep, out=keep)
                words = prev.view(keep.dtype)
                np.bitwise_and(words, keep, out=words)
            elif hidden == "tanh":  # prev *= 1 - z**2
                tmp = scratch[i - 1]
                np.square(z, out=tmp)
                np.subtract(1, tmp, out=tmp)
                np.multiply(prev, tmp, out=prev)
            elif hidden == "logistic":  # prev *= z; prev *= 1 - z
                tmp = scratch[i - 1]
                np.multiply(prev, z, out=prev)
                np.subtract(1, z, out=tmp)
                np.multiply(prev, tmp, out=prev)
            delta = prev
        return loss

    def _loss(self, y, p, sample_weight, count):
        """scikit-learn's loss function for this batch (``LOSS_FUNCTIONS[name]`` itself when
        weighted), with ``np.average(a, axis=0)`` as NumPy computes it."""
        name = self.loss_name
        if sample_weight is not None or name == "log_loss":
            return _sk_base.LOSS_FUNCTIONS[name](y, p, sample_weight)
        if name == "binary_log_loss":
            clipped = np.clip(p, self.eps, self.one_minus_eps)
            terms = xlogy(y, clipped) + xlogy(1 - y, 1 - clipped)
            return -_mean_rows_fresh(terms, count).sum()
        if name == "squared_error":
            return 0.5 * _mean_rows_fresh((y - p) ** 2, count).mean()
        # poisson
        return _mean_rows_fresh(xlogy(y, y / p) - y + p, count).sum()


def _mean_rows_fresh(a, count):
    """``np.average(a, axis=0)`` as NumPy computes it (sum along axis 0, then divide by intp)."""
    col = np.add.reduce(a, axis=0)
    return np.true_divide(col, count, out=col, casting="unsafe", subok=False)


def _shuffled(sample_idx, random_state):
    """``sklearn.utils.shuffle(sample_idx, random_state=random_state)``: for a RandomState it
    draws ``random_state.shuffle(np.arange(n))`` and indexes with it (what ``resample`` does,
    without its validation, about 0.3 ms per call); anything else goes to scikit-learn."""
    if type(random_state) is not np.random.RandomState:
        return shuffle(sample_idx, random_state=random_state)
    order = np.arange(sample_idx.shape[0])
    random_state.shuffle(order)
    return sample_idx[order]


def fit_stochastic(self, X, y, sample_weight, activations, deltas, coef_grads, intercept_grads,
                   layer_units, incremental):
    """Drop-in for ``BaseMultilayerPerceptron._fit_stochastic`` (same signature)."""
    if not reproduced(self, X, y, sample_weight):
        return original_fit_stochastic(self, X, y, sample_weight, activations, deltas,
                                       coef_grads, intercept_grads, layer_units, incremental)
    params = self.coefs_ + self.intercepts_
    if not incremental or not hasattr(self, "_optimizer"):
        self._optimizer = _sk_mlp.AdamOptimizer(params, self.learning_rate_init, self.beta_1,
                                                self.beta_2, self.epsilon)
    if self.early_stopping and incremental:
        raise ValueError("partial_fit does not support early_stopping=True")
    early_stopping = self.early_stopping
    X_val = y_val = sw_val = None
    X_train, y_train, sw_train = X, y, sample_weight
    if early_stopping:
        stratify = y if (is_classifier(self) and self.n_outputs_ == 1) else None
        arrays = (X, y) if sample_weight is None else (X, y, sample_weight)
        split = train_test_split(*arrays, random_state=self._random_state,
                                 test_size=self.validation_fraction, stratify=stratify)
        X_train, X_val, y_train, y_val = split[:4]
        if sample_weight is not None:
            sw_train, sw_val = split[4:]
        if X_val.shape[0] < 2:
            raise ValueError("The validation set is too small. Increase 'validation_fraction' "
                             "or the size of your dataset.")
        if is_classifier(self):
            y_val = self._label_binarizer.inverse_transform(y_val)

    n_samples = X_train.shape[0]
    sample_idx = np.arange(n_samples, dtype=int)
    if self.batch_size == "auto":
        batch_size = min(200, n_samples)
    else:
        if self.batch_size > n_samples:
            warnings.warn("Got `batch_size` less than 1 or larger than sample size. It is "
                          "going to be clipped")
        batch_size = np.clip(self.batch_size, 1, n_samples)

    work = Workspace(self, layer_units, int(batch_size), X.dtype)
    work.bind(self.coefs_, self.intercepts_)
    optimizer = self._optimizer
    step = getattr(optimizer, "_update_prepared", None) or optimizer.update_params
    x_rows = work.x_rows
    grads = work.grads
    try:
        self.n_iter_ = 0
        for _ in range(self.max_iter):
            if self.shuffle:
                sample_idx = _shuffled(sample_idx, self._random_state)
            accumulated_loss = 0.0
            for batch_slice in gen_batches(n_samples, batch_size):
                if self.shuffle:
                    batch_idx = sample_idx[batch_slice]
                    X_batch = np.take(X_train, batch_idx, axis=0, mode="clip",
                                      out=x_rows[:batch_idx.shape[0]])
                else:
                    batch_idx = batch_slice
                    X_batch = X_train[batch_idx]
                y_batch = y_train[batch_idx]
                sw_batch = None if sample_weight is None else sw_train[batch_idx]
                batch_loss = work.backprop(X_batch, y_batch, sw_batch)
                accumulated_loss += batch_loss * (batch_slice.stop - batch_slice.start)
                step(params, grads)

            self.n_iter_ += 1
            self.loss_ = accumulated_loss / X_train.shape[0]
            self.t_ += n_samples
            self.loss_curve_.append(self.loss_)
            if self.verbose:
                print("Iteration %d, loss = %.8f" % (self.n_iter_, self.loss_))
            self._update_no_improvement_count(early_stopping, X_val, y_val, sw_val)
            optimizer.iteration_ends(self.t_)

            if self._no_improvement_count > self.n_iter_no_change:
                if early_stopping:
                    msg = ("Validation score did not improve more than tol=%f for %d "
                           "consecutive epochs." % (self.tol, self.n_iter_no_change))
                else:
                    msg = ("Training loss did not improve more than tol=%f for %d "
                           "consecutive epochs." % (self.tol, self.n_iter_no_change))
                if optimizer.trigger_stopping(msg, self.verbose):
                    break
                self._no_improvement_count = 0
            if incremental:
                break
            if self.n_iter_ == self.max_iter:
                warnings.warn("Stochastic Optimizer: Maximum iterations (%d) reached and the "
                              "optimization hasn't converged yet." % self.max_iter,
                              ConvergenceWarning)
    except KeyboardInterrupt:
        warnings.warn("Training interrupted by user.")

    if early_stopping:
        self.coefs_ = self._best_coefs
        self.intercepts_ = self._best_intercepts
