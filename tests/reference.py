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


# ============================================================================================
# Adagrad and momentum (oracles for fastadam.adagrad_step_inplace, momentum_step_inplace and
# their sparse forms)
# ============================================================================================

def _effective_gradient(x, g, weight_decay, maximize, grad_scale):
    g = np.asarray(g, dtype=np.float64)
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    return g + weight_decay * x


def adagrad_reference(x, g, h, t, *, lr=1e-2, lr_decay=0.0, eps=1e-10, weight_decay=0.0,
                      maximize=False, convention="torch", grad_scale=None):
    """One Adagrad step in float64; returns new (x, h).  Written from torch.optim.Adagrad's
    documented algorithm, the ONNX Adagrad operator page and Keras 3's Adagrad source."""
    x = np.asarray(x, dtype=np.float64).copy()
    g = _effective_gradient(x, g, weight_decay, maximize, grad_scale)
    h = np.asarray(h, dtype=np.float64) + g * g
    if convention == "onnx":
        rate = lr / (1.0 + t * lr_decay)
    elif convention == "torch":
        rate = lr / (1.0 + (t - 1) * lr_decay)
    else:
        rate = lr
    denom = np.sqrt(h + eps) if convention == "keras" else np.sqrt(h) + eps
    return x - rate * g / denom, h


def rowwise_adagrad_reference(x, g, acc, t, *, lr=1e-2, lr_decay=0.0, eps=1e-8,
                              weight_decay=0.0, weight_decay_mode="l2", maximize=False,
                              grad_scale=None):
    """One row-wise Adagrad step in float64; returns new (x, acc).  Written from FBGEMM's
    EXACT_ROWWISE_ADAGRAD update (its ``split_weight_update_cpu``: ``momentum1[row] +=
    mean(d**2)``, ``multiplier = lr / (sqrt(momentum1) + eps)``, ``x = correction * x -
    multiplier * g`` with ``correction`` 1 - multiplier * wd (L2) or 1 - lr * wd (DECOUPLED)),
    plus TorchRec's ``lr_decay`` and torch's maximize/grad_scale conventions.  Rows are the
    first axis (a 0-d x is one row); a row of zero elements is left alone."""
    x = np.asarray(x, dtype=np.float64).copy()
    shape = x.shape
    rows = shape[0] if x.ndim else 1
    x2 = x.reshape(rows, -1) if rows else x.reshape(0, int(np.prod(shape[1:])))
    g2 = np.asarray(g, dtype=np.float64).reshape(x2.shape)
    if grad_scale is not None:
        g2 = g2 / grad_scale
    if maximize:
        g2 = -g2
    acc = np.asarray(acc, dtype=np.float64).reshape(-1).copy()
    if x2.shape[1] == 0:
        return x, acc.reshape(shape[:1])
    rate = lr / (1.0 + (t - 1) * lr_decay)
    l2 = weight_decay if weight_decay_mode == "l2" else 0.0
    acc = acc + np.mean((g2 + l2 * x2) ** 2, axis=1)
    m = rate / (np.sqrt(acc) + eps)
    if weight_decay_mode == "l2":
        c = 1.0 - m * weight_decay
    else:
        c = np.full_like(m, 1.0 - rate * weight_decay)
    x2 = c[:, None] * x2 - m[:, None] * g2
    return x2.reshape(shape), acc.reshape(shape[:1])


def momentum_reference(x, g, v, t, *, lr=1e-2, momentum=0.9, dampening=0.0, nesterov=False,
                       weight_decay=0.0, maximize=False, convention="torch", grad_scale=None):
    """One SGD-with-momentum step in float64; returns new (x, v).  Written from
    torch.optim.SGD's documented algorithm and the ONNX Momentum operator page."""
    x = np.asarray(x, dtype=np.float64).copy()
    g = _effective_gradient(x, g, weight_decay, maximize, grad_scale)
    v = np.asarray(v, dtype=np.float64)
    if convention == "torch":
        if momentum == 0.0:
            return x - lr * g, g
        v = g.copy() if t == 1 else momentum * v + (1.0 - dampening) * g
        step = g + momentum * v if nesterov else v
    else:
        beta = 1.0 - dampening
        v = momentum * v + (beta if t > 0 else 1.0) * g
        step = g + momentum * v if nesterov else v
    return x - lr * step, v


# ============================================================================================
# RMSprop and Lion (oracles for fastadam.rmsprop_step_inplace, lion_step_inplace, their sparse
# forms and objects)
# ============================================================================================

def rmsprop_reference(x, g, square_avg, t, *, momentum_buffer=None, grad_avg=None, lr=1e-2,
                      alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                      maximize=False, convention="torch", grad_scale=None):
    """One RMSprop step in float64; returns new (x, square_avg, momentum_buffer, grad_avg).
    Written from torch.optim.RMSprop's documented algorithm ("torch") and Keras 3's RMSprop
    update (``"keras"``: epsilon inside the root, the momentum variable accumulating
    ``lr * g / sqrt(...)``)."""
    x = np.asarray(x, dtype=np.float64).copy()
    g = _effective_gradient(x, g, weight_decay, maximize, grad_scale)
    v = alpha * np.asarray(square_avg, dtype=np.float64) + (1.0 - alpha) * g * g
    a = None
    w = v
    if centered:
        a = alpha * np.asarray(grad_avg, dtype=np.float64) + (1.0 - alpha) * g
        w = v - a * a
    if convention == "keras":
        d = g / np.sqrt(w + eps)
    else:
        d = g / (np.sqrt(w) + eps)
    b = None
    if momentum > 0:
        b = momentum * np.asarray(momentum_buffer, dtype=np.float64)
        if convention == "keras":
            b = b + lr * d
            x = x - b
        else:
            b = b + d
            x = x - lr * b
    else:
        x = x - lr * d
    return x, v, b, a


def lion_reference(x, g, m, t, *, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0,
                   maximize=False, grad_scale=None):
    """One Lion step in float64; returns new (x, m).  Written from Algorithm 2 of Chen et al.
    2023 ("Symbolic Discovery of Optimization Algorithms"): update = sign(beta1*m +
    (1-beta1)*g) + lambda*x, x -= lr*update, m = beta2*m + (1-beta2)*g."""
    x = np.asarray(x, dtype=np.float64)
    g = _effective_gradient(x, g, 0.0, maximize, grad_scale)
    m = np.asarray(m, dtype=np.float64)
    c = beta1 * m + (1.0 - beta1) * g
    x = x - lr * (np.sign(c) + weight_decay * x)
    return x, beta2 * m + (1.0 - beta2) * g


# ============================================================================================
# ONNX (oracles and old behaviours for fastadam.onnx's tests)
# ============================================================================================


def needed_without_y(graph, wanted):
    """``fastadam.onnx``'s ``Graph.needed`` as it was before a Gradient node's ``y`` was computed
    ahead of it: the steps that produce ``wanted``, following only node inputs.  Patched in, it
    makes a Gradient node re-evaluate its sub-graph instead of reusing the forward pass."""
    seen, found, stack = set(), set(), list(wanted)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        k = graph.producer.get(name)
        if k is not None and k not in found:
            found.add(k)
            stack.extend(n for n in graph.steps[k].inputs if n)
    return sorted(found)


# ============================================================================================
# Embedding bags (oracle for fastadam.embedding_bag_step_inplace and fastadam.torch's bags)
# ============================================================================================

def embedding_bag_gradient_reference(n_rows, ids, offsets, grad_out, *, pooling="sum",
                                     per_sample_weights=None, include_last_offset=False):
    """(touched rows increasing, their float64 gradients) of a pooled lookup, from torch's
    ``nn.EmbeddingBag`` documentation: bag ``b`` is ``ids[offsets[b]:offsets[b+1]]`` (the last
    bag ends at ``len(ids)``; with ``include_last_offset`` the last offset is that end), its
    output ``sum_j s_j * weight[ids[j]]`` with ``s_j`` 1, the per-sample weight, or
    ``1 / len(bag)`` for ``"mean"``; so id ``ids[j]`` of bag ``b`` receives
    ``s_j * grad_out[b]``, summed per row.  ``offsets=None``: 2-D ids, one bag per row."""
    ids = np.asarray(ids).astype(np.int64)
    grad_out = np.asarray(grad_out, dtype=np.float64)
    if offsets is None:
        n_bags, size = ids.shape
        bounds = [(b * size, (b + 1) * size) for b in range(n_bags)]
        ids = ids.reshape(-1)
    else:
        ends = list(np.asarray(offsets).astype(np.int64))
        if not include_last_offset:
            ends.append(ids.shape[0])
        bounds = list(zip(ends[:-1], ends[1:]))
    dense = np.zeros((n_rows, grad_out.shape[1]))
    touched = np.zeros(n_rows, dtype=bool)
    for b, (start, end) in enumerate(bounds):
        for j in range(start, end):
            if per_sample_weights is not None:
                s = float(per_sample_weights[j])
            elif pooling == "mean":
                s = 1.0 / (end - start)
            else:
                s = 1.0
            dense[ids[j]] += s * grad_out[b]
            touched[ids[j]] = True
    rows = np.flatnonzero(touched)
    return rows, dense[rows]
