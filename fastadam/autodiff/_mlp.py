"""``mlp_loss_and_gradients``: a multi-layer perceptron's mean softmax cross-entropy and its
gradients in one call, without a tape.

Design.  The training step of a small MLP is a dozen BLAS calls and row kernels; recorded on
the tape, each of them also pays for a node, its Tensors and the walk that visits it, which on
a 64-64-10 network costs more than the arithmetic.  This function runs the same calls in the
order the backward walk runs them, on plain arrays: the values are those of the recorded ops
(``gemm(h, w, b, trans_b=True)``, ``relu``, ``softmax_cross_entropy``) and of ``gradient``,
bit for bit, since every value comes from the same kernel on the same operands.
``mlp_fuses`` says whether it takes given operands; ``fastadam.onnx`` runs a training graph's
Gemm/Relu chain, its SoftmaxCrossEntropyLoss and their Gradient node through it when it does.
"""
import numpy as np

from . import _kernels as K
from ._tensor import _wrap

__all__ = ["mlp_fuses", "mlp_loss_and_gradients"]


def mlp_fuses(x, weights, biases, labels):
    """True when :func:`mlp_loss_and_gradients` takes these ndarrays: ``x`` (N, D) of a
    floating dtype, ``weights[k]`` (out_k, in_k) and ``biases[k]`` (out_k,) of that dtype
    chaining from D (``in_0 = D``, ``in_{k+1} = out_k``), at least one layer, and ``labels``
    integers of shape (N,)."""
    dt, shape = x.dtype, x.shape
    if dt.kind != "f" or len(shape) != 2 or labels.shape != shape[:1] or \
            labels.dtype.kind not in "iu" or not weights or len(weights) != len(biases):
        return False
    width = shape[1:]
    for w, b in zip(weights, biases):
        # (a weight (out, width): its shape[1:] is (width,); a bias (out,): w.shape[:1])
        if w.dtype != dt or b.dtype != dt or w.shape[1:] != width or b.shape != w.shape[:1]:
            return False
        width = b.shape
    return True


def _explain(x, weights, biases, labels):
    """The error for operands ``mlp_fuses`` refuses, naming the argument."""
    if x.dtype.kind != "f":
        return TypeError(f"x: expected a floating-point array, got {x.dtype}")
    if x.ndim != 2:
        return ValueError(f"x: expected shape (N, D), got {x.shape}")
    if not weights or len(weights) != len(biases):
        return ValueError(f"weights, biases: expected one bias per weight and at least one "
                          f"layer, got {len(weights)} weights and {len(biases)} biases")
    width = x.shape[1]
    for k, (w, b) in enumerate(zip(weights, biases)):
        for name, a in ((f"weights[{k}]", w), (f"biases[{k}]", b)):
            if a.dtype != x.dtype:
                return TypeError(f"{name}: expected dtype {x.dtype} (the dtype of x), got "
                                 f"{a.dtype}")
        if w.ndim != 2 or w.shape[1] != width:
            return ValueError(f"weights[{k}]: expected shape (out, {width}), got {w.shape}")
        if b.shape != w.shape[:1]:
            return ValueError(f"biases[{k}]: expected shape ({w.shape[0]},), got {b.shape}")
        width = w.shape[0]
    if labels.dtype.kind not in "iu":
        return TypeError(f"labels: expected an integer array, got {labels.dtype}")
    return ValueError(f"labels: expected shape ({x.shape[0]},), got {labels.shape}")


def mlp_loss_and_gradients(x, weights, biases, labels, relu, need=None):
    """The mean softmax cross-entropy of an MLP on ``x`` and its gradients in the weights
    and biases, in one call (no Tensors, nothing recorded).

    With ``h_0 = x``, for each layer ``k``::

        z_k = h_k @ weights[k].T + biases[k]
        h_{k+1} = max(z_k, 0) if relu[k] else z_k        (every layer but the last)
        loss = mean_i (logsumexp(z_last[i]) - z_last[i, labels[i]])

    ``weights[k]`` is (out, in), as ``torch.nn.Linear`` and ONNX ``Gemm`` with ``transB=1``
    store it.  ``relu``: one bool per layer but the last.  ``need``: one bool per entry of
    ``[dW_0, db_0, dW_1, db_1, ...]`` (default: all); the gradients not needed are None and
    not computed (nor is anything below the last layer that needs one).

    Returns ``(loss, grads)`` as :func:`gradient` returns gradients, Tensors that nothing
    recorded: ``loss`` 0-d, of ``x``'s dtype, ``grads`` the list above (fresh arrays).  The
    values are those of ``gemm(h, w, b, trans_b=True)``, ``relu``,
    ``softmax_cross_entropy`` recorded on the tape and ``gradient(loss, params)``, bit for bit.
    Operands :func:`mlp_fuses` refuses raise TypeError/ValueError naming the argument; a label
    outside ``[0, C)`` raises IndexError (as ``softmax_cross_entropy``)."""
    if not mlp_fuses(x, weights, biases, labels):
        raise _explain(x, weights, biases, labels)
    n = len(weights)
    if len(relu) != n - 1:
        raise ValueError(f"relu: expected {n - 1} flags (one per layer but the last), got "
                         f"{len(relu)}")
    if need is None:
        need = (True,) * (2 * n)
    elif len(need) != 2 * n:
        raise ValueError(f"need: expected {2 * n} flags (one per weight and bias), got "
                         f"{len(need)}")
    lab = labels if labels.dtype == np.intp else np.asarray(labels, dtype=np.intp)
    if not lab.flags.c_contiguous:
        lab = np.ascontiguousarray(lab)
    K.check_labels(lab, weights[-1].shape[0], "labels")
    matmul, add, relu_kernel = np.matmul, np.add, K.relu
    inputs, before_relu = [], []
    h = x
    for k, w in enumerate(weights):
        z = matmul(h, w.T)
        add(z, biases[k], out=z)
        inputs.append(h)
        if k < n - 1 and relu[k]:
            before_relu.append(z)
            h = relu_kernel(z)
        else:
            before_relu.append(None)
            h = z
    loss = _wrap(K.softmax_cross_entropy(h, lab))
    g = K.softmax_cross_entropy_grad(h, lab, 1.0)  # the loss's seed, 1, folded in
    grads = [None] * (2 * n)
    lowest = need.index(True) // 2 if True in need else n  # the lowest layer that needs one
    for k in range(n - 1, lowest - 1, -1):
        if need[2 * k]:
            grads[2 * k] = _wrap(matmul(g.T, inputs[k]))
        if need[2 * k + 1]:
            grads[2 * k + 1] = _wrap(_sum_rows(g))
        if k > lowest:
            g = matmul(g, weights[k])
            if before_relu[k - 1] is not None:
                g = K.relu_grad(g, before_relu[k - 1])
    return loss, grads


def _sum_rows(g):
    """``g`` (N, C) summed over its rows, as ``sum_to(g, (C,))`` sums it."""
    if K._fast(g):
        return K._C.sum_rows(g)
    return np.asarray(K.sum_to(g, g.shape[1:]))
