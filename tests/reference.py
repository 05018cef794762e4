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


# ============================================================================================
# Autodiff (oracles for fastadam.autodiff go here)
# ============================================================================================
