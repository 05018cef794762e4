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

``BatchPass`` is the same pass for the estimators' training loop: every temporary (the layers'
values, the deltas, the gradients) lives in buffers allocated once per fit and reused by every
mini-batch (matrix products written with ``out=``).  With ReLU hidden layers the whole pass is
compiled (``_kernels.relu_network_pass``: the same NumPy matrix products, the bias and ReLU in
one loop, the bias gradients summed in the ReLU backward loop, and a one-column output layer's
``dz @ W.T``, a product with inner dimension 1 that BLAS runs slowly, as an outer-product loop
fused with them); other activations run the NumPy expressions below into the buffers.  Each
fused loop rounds as the NumPy expression it replaces (a product with inner dimension 1 is one
rounded multiplication; ``sum(axis=0)`` of a C-contiguous array with two or more columns adds
the rows in order from +0; one column is left to NumPy, which sums it pairwise), so
``BatchPass`` gives the bits of the plain pass (tests/sklearn_reference.py, tested).
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
        self._views = {}  # rows -> (values, deltas) sliced to that many rows

    def run(self, X, coefs, intercepts, loss, targets, weights, extra=()):
        """``loss(network(X))`` and its gradients (in ``coef_grads``, ``intercept_grads``);
        the loss is ``loss(z, targets, weights, grad, *extra)``."""
        n = X.shape[0]
        if self.activation == "relu":  # the same pass, compiled (_kernels.relu_network_pass)
            views = self._views.get(n)
            if views is None:
                views = self._views[n] = ([v[:n] for v in self.values],
                                          [d[:n] for d in self.deltas])
            return _kernels.relu_network_pass(X, coefs, intercepts, views[0], views[1],
                                              self.coef_grads, self.intercept_grads, loss,
                                              targets, weights, extra)
        last = len(coefs) - 1
        activation = self.activation
        h = X
        outputs = []
        for i in range(last + 1):
            z = self.values[i][:n]
            np.matmul(h, coefs[i], out=z)
            z += intercepts[i]
            if i != last:
                activation_inplace(activation, z)
            outputs.append(z)
            h = z
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
        if name == "tanh":
            d = np.multiply(a, a, out=scratch[:a.shape[0]])
            np.subtract(1, d, out=d)
            g *= d
        elif name == "logistic":
            d = np.subtract(1, a, out=scratch[:a.shape[0]])
            g *= a
            g *= d
