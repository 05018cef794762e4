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


def conv2d_ref(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Direct NCHW cross-correlation in float64 (loops over the kernel window only)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    y = np.zeros((n, o, ho, wo))
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                           j * dw:j * dw + sw * (wo - 1) + 1:sw]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if b is not None:
        y += np.asarray(b, dtype=np.float64)[None, :, None, None]
    return y


def softmax_cross_entropy_ref(logits, labels):
    """mean_i(-log softmax(logits_i)[labels_i]) in float64, by the textbook formula."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -np.mean(logp[np.arange(z.shape[0]), np.asarray(labels)])


def softmax_cross_entropy_grad_ref(logits, labels):
    """d/dlogits of softmax_cross_entropy_ref: (softmax - onehot) / N."""
    z = np.asarray(logits, dtype=np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(z.shape[0]), np.asarray(labels)] -= 1.0
    return p / z.shape[0]
