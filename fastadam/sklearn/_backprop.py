"""Hand-written forward and backward pass of the MLP estimators' fixed architecture: dense
layers ``a_{i+1} = act(a_i @ W_i + b_i)`` (identity on the last one), then a fused,
sample-weighted loss (``_losses``).

The network of ``MLPClassifier`` / ``MLPRegressor`` never changes shape, so recording it on
the autodiff tape at every mini-batch buys nothing but the tape's per-operation Python cost
(about half the time of a batch of 200 rows).  This module computes the same numbers directly,
with the operations, in the order, of the tape's VJPs (``_layers.dense`` and the loss
primitives' gradients), so the result equals ``fastadam.autodiff.gradient`` of the same network
(``tests/test_sklearn_backprop.py`` checks it with the plain pass of tests/sklearn_reference.py,
and checks both against finite differences).
The ReLU layers and the losses run as fused one-pass loops (``_kernels.pyx``), which keep the
NumPy expressions' roundings up to the last bit of C's exp/log against NumPy's:

    forward:   a_0 = X,  a_{i+1} = act_i(a_i @ W_i + b_i)
    output:    dz_{n-1} = d loss / d z at the output (the loss primitive's gradient)
    backward:  dW_i = a_i.T @ dz_i,  db_i = sum(dz_i, axis=0),
               dz_{i-1} = (dz_i @ W_i.T) * act'(a_i)   (written from the output a_i:
               relu ``a > 0``, tanh ``1 - a*a``, logistic ``a * (1 - a)``)

First order only (the estimators need nothing else); the tape remains the way to higher orders.

``BatchPass`` is the same pass for the estimators' training loop, for every activation: every
temporary (the layers' values, the deltas, the gradients) lives in buffers allocated once per
fit and reused by every mini-batch (matrix products written with ``out=``); its forward half,
``forward_into``, also gives the estimators' predictions (into fresh arrays).  The loops it
calls (``_kernels``: bias and ReLU in one pass, ReLU backward, column sums, a one-column output
layer's ``dz @ W.T`` as an outer product, which BLAS runs slowly) each round as the NumPy
expression they replace (a product with inner dimension 1 is one rounded multiplication;
``sum(axis=0)`` of a C-contiguous array with two or more columns adds the rows in order from
+0; one column is left to NumPy, which sums it pairwise), so ``BatchPass`` gives the bits of
the plain pass (tests/sklearn_reference.py, tested).

The one compiled twin: with ReLU hidden layers the estimators' epoch loop
(``_kernels.EpochTrainer``) runs this pass compiled, with those loops fused (the bias gradients
summed in the ReLU backward loop) and no interpreter between mini-batches; it is tested bit
for bit against ``BatchPass.run`` and timed against it and against the autodiff tape
(``asv_bench/benchmarks/bench_sklearn.py``, ``MLPPassRatios``).
"""
import numpy as np

from . import _kernels
from ._layers import activation_inplace


def activation_backward_inplace(name, g, a):
    """``g *= act'(z)`` in place, the derivative written from the activation's output ``a``;
    the same roundings as ``_layers``' VJPs."""
    if name == "relu":
        _kernels.relu_backward(g, a)  # g * (a > 0), one pass
    elif name == "tanh":
        d = a * a
        np.subtract(1, d, out=d)
        g *= d
    elif name == "logistic":
        d = np.subtract(1, a)
        g *= a
        g *= d
    return g


class BatchPass:
    """Forward and backward pass over mini-batches of up to ``max_rows`` rows, into buffers
    allocated once.

    ``run(X, ...)`` fills ``coef_grads`` and ``intercept_grads`` (views of one array,
    ``gradients``: the weights' gradients end to end, then the intercepts'; overwritten by the
    next call) and returns the loss value.  ``loss(z, targets,
    weights, grad, *extra)`` (a ``_kernels`` loss) writes ``d loss / d z`` of the output values
    ``z`` (bias included) into ``grad`` and returns the loss value.
    """

    def __init__(self, coefs, max_rows, activation, dtype):
        dtype = np.dtype(dtype)
        self.activation = activation
        self.values = [np.empty((max_rows, w.shape[1]), dtype) for w in coefs]
        self.deltas = [np.empty((max_rows, w.shape[1]), dtype) for w in coefs]
        # every gradient is a view of one array: the weights' end to end, then the intercepts'
        shapes = [w.shape for w in coefs] + [(w.shape[1],) for w in coefs]
        self.coef_size = sum(w.size for w in coefs)
        self.gradients = np.empty(self.coef_size + sum(w.shape[1] for w in coefs), dtype)
        views, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            views.append(self.gradients[start:start + size].reshape(shape))
            start += size
        self.coef_grads, self.intercept_grads = views[:len(coefs)], views[len(coefs):]
        self.scratch = [np.empty((max_rows, w.shape[1]), dtype)
                        if activation in ("tanh", "logistic") else None for w in coefs]
        self._views = {}  # rows -> the values' buffers sliced to that many rows

    @staticmethod
    def forward_into(X, coefs, intercepts, activation, outputs):
        """The forward pass: ``outputs[i] = act(h @ coefs[i] + intercepts[i])`` (no activation
        on the last layer), each ``outputs[i]`` an (n, units) C-contiguous array of X's dtype;
        returns the last one."""
        last = len(coefs) - 1
        h = X
        for i in range(last + 1):
            z = outputs[i]
            np.matmul(h, coefs[i], out=z)
            if i != last and activation == "relu":
                _kernels.bias_relu(z, intercepts[i])  # max(z + b, 0), one pass
            else:
                z += intercepts[i]
                if i != last:
                    activation_inplace(activation, z)
            h = z
        return h

    def run(self, X, coefs, intercepts, loss, targets, weights, extra=()):
        """``loss(network(X))`` and its gradients (in ``coef_grads``, ``intercept_grads``);
        the loss is ``loss(z, targets, weights, grad, *extra)``."""
        n = X.shape[0]
        last = len(coefs) - 1
        outputs = self._views.get(n)
        if outputs is None:
            outputs = self._views[n] = [v[:n] for v in self.values]
        h = self.forward_into(X, coefs, intercepts, self.activation, outputs)
        dz = self.deltas[last][:n]
        value = loss(h, targets, weights, dz, *extra)
        for i in range(last, -1, -1):
            a = outputs[i - 1] if i else X
            np.matmul(a.T, dz, out=self.coef_grads[i])
            self._column_sums(dz, self.intercept_grads[i])
            if not i:
                break
            below = self.deltas[i - 1][:n]
            w = coefs[i]
            if w.shape[1] == 1:
                _kernels.outer_product(dz, w, below)
            else:
                np.matmul(dz, w.T, out=below)
            self._activation_backward(below, a, self.scratch[i - 1])
            dz = below
        return value

    @staticmethod
    def _column_sums(g, out):
        if g.shape[1] == 1 or g.shape[0] == 0:
            np.add.reduce(g, axis=0, out=out)  # g.sum(axis=0): pairwise for one column
        else:
            _kernels.column_sums(g, out)

    def _activation_backward(self, g, a, scratch):
        """``g *= act'(a)`` with ``_layers``' roundings, temporaries in ``scratch``."""
        name = self.activation
        if name == "relu":
            _kernels.relu_backward(g, a)  # g * (a > 0), one pass
        elif name == "tanh":
            d = np.multiply(a, a, out=scratch[:a.shape[0]])
            np.subtract(1, d, out=d)
            g *= d
        elif name == "logistic":
            d = np.subtract(1, a, out=scratch[:a.shape[0]])
            g *= a
            g *= d
