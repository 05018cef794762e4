"""Float64 NumPy oracles written from the formulas (never from fastadam's code).

Every fast path is compared against these, and against independent libraries where installed.
Sections: dense Adam, sparse Adam, autodiff.
"""
import math

import numpy as np


# ============================================================================================
# Dense Adam
# ============================================================================================

def adam_reference(x, g, m, v, t, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                   convention="tf", weight_decay=0.0, decoupled_weight_decay=False,
                   post_decay=0.0, amsgrad=False, v_max=None, nesterov=False, maximize=False,
                   grad_scale=None):
    """One Adam step in float64; returns new (x, m, v, v_max) without touching the inputs.

    Written from the published formulas: TensorFlow's ApplyAdam (epsilon outside the bias
    correction), PyTorch's Adam/AdamW docs, and the ONNX Adam operator page.
    """
    x = np.asarray(x, dtype=np.float64).copy()
    g = np.asarray(g, dtype=np.float64).copy()
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    if weight_decay and not decoupled_weight_decay:
        g = g + weight_decay * x
    if weight_decay and decoupled_weight_decay:
        x = x * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    vh = v
    if amsgrad:
        v_max = np.maximum(np.asarray(v_max, dtype=np.float64), v)
        vh = v_max
    mu = beta1 * m + (1.0 - beta1) * g if nesterov else m
    if convention == "onnx" and t <= 0:
        x = x - lr * mu / (np.sqrt(vh) + eps)
    elif convention == "torch":
        bc1 = 1.0 - beta1 ** t
        bc2 = 1.0 - beta2 ** t
        x = x - (lr / bc1) * mu / (np.sqrt(vh) / math.sqrt(bc2) + eps)
    else:
        lr_t = lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
        x = x - lr_t * mu / (np.sqrt(vh) + eps)
    x = (1.0 - post_decay) * x
    return x, m, v, v_max


# ============================================================================================
# Sparse Adam (oracles for fastadam.sparse_step_inplace and fastadam.segment_sum go here)
# ============================================================================================

def segment_sum_reference(indices, values, dtype=np.float64):
    """(sorted unique indices, per-index sums): np.add.at on a zeroed buffer of ``dtype``, which
    adds each row in its original order (so with the input's own dtype it is the exact answer
    the deterministic segment sum must reproduce)."""
    indices = np.asarray(indices).astype(np.int64)
    values = np.asarray(values)
    unique, inverse = np.unique(indices, return_inverse=True)
    sums = np.zeros((unique.shape[0],) + values.shape[1:], dtype=dtype)
    np.add.at(sums, inverse.reshape(-1), values.astype(dtype))
    return unique, sums


def sparse_adam_reference(x, indices, values, m, v, t, *, mode="lazy", last_step=None, lr=1e-3,
                          beta1=0.9, beta2=0.999, eps=1e-8, convention="tf", weight_decay=0.0,
                          decoupled_weight_decay=False, maximize=False):
    """One sparse Adam step in float64; returns new (x, m, v, last_step), inputs untouched.

    Rows are the first axis.  The gradient of a row is the float64 sum of its values.
    lazy: the dense formula on the touched rows only.  dense: the dense formula on every row,
    with g = 0 for untouched rows (TensorFlow 1's _apply_sparse_shared).  catchup: lazy, after
    scaling a touched row's m by beta1**k and v by beta2**k, k = t - 1 - last_step[row].
    """
    x = np.asarray(x, dtype=np.float64).copy()
    m = np.asarray(m, dtype=np.float64).copy()
    v = np.asarray(v, dtype=np.float64).copy()
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, convention=convention,
                 weight_decay=weight_decay, decoupled_weight_decay=decoupled_weight_decay,
                 maximize=maximize)
    rows, sums = segment_sum_reference(indices, values)
    if mode == "dense":
        g = np.zeros_like(x)
        g[rows] = sums
        x, m, v, _ = adam_reference(x, g, m, v, t, **hyper)
        return x, m, v, last_step
    if mode == "catchup":
        last_step = np.asarray(last_step).copy()
        idle = t - 1 - last_step[rows]
        shape = (-1,) + (1,) * (x.ndim - 1)
        m[rows] = m[rows] * (beta1 ** idle.astype(np.float64)).reshape(shape)
        v[rows] = v[rows] * (beta2 ** idle.astype(np.float64)).reshape(shape)
        last_step[rows] = t
    xr, mr, vr, _ = adam_reference(x[rows], sums, m[rows], v[rows], t, **hyper)
    x[rows], m[rows], v[rows] = xr, mr, vr
    return x, m, v, last_step


def torch_sparse_adam_formula(x, indices, values, m, v, t, *, lr=1e-3, beta1=0.9, beta2=0.999,
                              eps=1e-8):
    """PyTorch SparseAdam's update as its source writes it, in float64 (for reading the
    comparison): m += (g - m) * (1 - beta1); v += (g*g - v) * (1 - beta2);
    x -= lr * sqrt(1 - beta2**t) / (1 - beta1**t) * m / (sqrt(v) + eps), touched rows only."""
    x = np.asarray(x, dtype=np.float64).copy()
    m = np.asarray(m, dtype=np.float64).copy()
    v = np.asarray(v, dtype=np.float64).copy()
    rows, g = segment_sum_reference(indices, values)
    m[rows] += (g - m[rows]) * (1.0 - beta1)
    v[rows] += (g * g - v[rows]) * (1.0 - beta2)
    step = lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
    x[rows] -= step * m[rows] / (np.sqrt(v[rows]) + eps)
    return x, m, v



# ============================================================================================
# Autodiff (oracles for fastadam.autodiff go here)
# ============================================================================================
