"""Neural-network ``ai.onnx`` operators: Conv, MaxPool, AveragePool, GlobalAveragePool,
BatchNormalization (inference form), Softmax, LogSoftmax, SoftmaxCrossEntropyLoss,
NegativeLogLikelihoodLoss.  Same calling convention as ``_core_ops``.

Convolution and pooling are 2-D (NCHW), and 1-D (NCL) as 2-D with a height of 1;
``auto_pad`` and ``ceil_mode`` are resolved to
explicit pads here; a ``ceil_mode`` AveragePool that counts padding, a pool's ``Indices`` output
and a training-mode BatchNormalization raise ``NotImplementedError`` rather than giving another
runtime's answer approximately.
"""
import numpy as np

from .. import autodiff as ad
from ._budget import reserve
from ._core_ops import (UnsupportedOperatorError, _reshaped, compiler, normalize_axis, register,
                        same_dtype)


def _spatial(x, w_shape, attrs, what):
    """(kernel, strides, dilations, pads as (top, left, bottom, right)) of a 2-D window op."""
    if x.ndim != 4:
        raise UnsupportedOperatorError(f"{what}: only 1-D and 2-D ((N, C, L) and (N, C, H, W)) "
                                       f"inputs are supported, got shape {x.shape}")
    kernel = tuple(attrs.get("kernel_shape", w_shape))
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    if len(kernel) != 2:
        raise ValueError(f"kernel_shape: expected 2 values, got {kernel}")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        pads = tuple(begin + end)
    else:
        raise ValueError(f"auto_pad: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER, got "
                         f"{auto_pad!r}")
    if len(pads) != 4 or len(strides) != 2 or len(dilations) != 2:
        raise ValueError(f"pads, strides, dilations: expected 4, 2 and 2 values, got {pads}, "
                         f"{strides} and {dilations}")
    if any(p < 0 for p in pads) or min(strides) < 1 or min(dilations) < 1:
        raise ValueError(f"pads, strides, dilations: expected pads >= 0, strides >= 1 and "
                         f"dilations >= 1, got {pads}, {strides} and {dilations}")
    return kernel, strides, dilations, pads


def _reserve_padded(x, pads, what):
    """``reserve`` the zero- (or -inf-) padded copy of ``x`` that a window operator makes."""
    if any(pads):
        n, c, h, w = x.shape
        reserve(what, (n, c, h + pads[0] + pads[2], w + pads[1] + pads[3]), x.data.dtype,
                "padded input")


def _lift_1d(attrs):
    """The attributes of a 1-D window operator as those of the 2-D one over (N, C, 1, L)."""
    out = dict(attrs)
    for key in ("kernel_shape", "strides", "dilations"):
        if key in attrs:
            out[key] = [1] + list(attrs[key])
    if "pads" in attrs:
        pads = list(attrs["pads"])
        if len(pads) != 2:
            raise ValueError(f"pads: expected 2 values for a 1-D window, got {pads}")
        out["pads"] = [0, pads[0], 0, pads[1]]
    return out


def _over_1d(run):
    """``run(inputs, attrs, ...)`` of a 2-D window operator, also for 1-D (N, C, L) inputs: run
    on (N, C, 1, L) with a height-1 window, then the height dropped."""
    def body(inputs, attrs, opset, **kw):
        x = inputs[0]
        if x.ndim != 3:
            return run(inputs, attrs, opset, **kw)
        lifted = [_reshaped(t, t.shape[:2] + (1,) + t.shape[2:])
                  if t is not None and t.ndim == 3 else t for t in inputs[:2]] + list(inputs[2:])
        out = run(lifted, _lift_1d(attrs), opset, **kw)
        return [_reshaped(y, y.shape[:2] + y.shape[3:]) for y in out]

    # Graph passes n_outputs to the operators whose code names it
    if "n_outputs" in run.__code__.co_varnames:
        def wrapped(inputs, attrs, opset, n_outputs=1):
            return body(inputs, attrs, opset, n_outputs=n_outputs)
    else:
        def wrapped(inputs, attrs, opset):
            return body(inputs, attrs, opset)
    return wrapped


@register("Conv")
@_over_1d
def conv(inputs, attrs, opset):
    x, w = inputs[:2]
    b = inputs[2] if len(inputs) > 2 else None
    same_dtype("Conv", x, w, b)
    if w.ndim != 4:
        raise UnsupportedOperatorError(f"Conv: only 1-D and 2-D convolutions are supported, got "
                                       f"W of shape {w.shape}")
    kernel, strides, dilations, pads = _spatial(x, w.shape[2:], attrs, "Conv")
    if kernel != tuple(w.shape[2:]):
        raise ValueError(f"kernel_shape: {kernel} differs from W's spatial shape {w.shape[2:]}")
    _reserve_padded(x, pads, "Conv")
    t, lft, bot, r = pads
    (sh, sw), (dh, dw) = strides, dilations
    oh = (x.shape[2] + t + bot - (kernel[0] - 1) * dh - 1) // sh + 1
    ow = (x.shape[3] + lft + r - (kernel[1] - 1) * dw - 1) // sw + 1
    if oh > 0 and ow > 0:
        reserve("Conv", (x.shape[0], w.shape[0], oh, ow), x.data.dtype)
        # the product runs on the input unrolled one sample at a time (im2col): a large kernel
        # over a large input makes C*kh*kw rows of oh*ow from one small sample
        reserve("Conv", (x.shape[1] * kernel[0] * kernel[1], oh * ow), x.data.dtype,
                "unrolled input of one sample", temporary=True)
    if (t, lft) != (bot, r):  # asymmetric: pad explicitly, then convolve without padding
        x = ad.pad(x, ((0, 0), (0, 0), (t, bot), (lft, r)))
        t = lft = 0
    return [ad.conv2d(x, w, b, stride=strides, padding=(t, lft), dilation=dilations,
                      groups=attrs.get("group", 1))]


def _pool_checks(attrs, outputs, what):
    if outputs > 1:
        raise UnsupportedOperatorError(f"{what}: the Indices output is not supported")


def _ceil_pads(x, kernel, strides, dilations, pads):
    """``pads`` with the bottom/right padding that ``ceil_mode=1`` adds: the output size is
    ``ceil((size + pads - dilation * (kernel - 1) - 1) / stride) + 1``, less the last window
    when it would start in the right padding (ONNX and torch ignore such windows)."""
    begin, end = list(pads[:2]), list(pads[2:])
    for i, size in enumerate(x.shape[2:]):
        span = (kernel[i] - 1) * dilations[i] + 1
        total = size + begin[i] + end[i]
        if total < span:
            continue  # the window does not fit: the pool names the problem
        out = -(-(total - span) // strides[i]) + 1
        if (out - 1) * strides[i] >= size + begin[i]:
            out -= 1
        end[i] += max(0, (out - 1) * strides[i] + span - total)
    return tuple(begin + end)


@register("MaxPool", since=8)
@_over_1d
def max_pool(inputs, attrs, opset, n_outputs=1):
    x, = inputs
    _pool_checks(attrs, n_outputs, "MaxPool")
    kernel, strides, dilations, pads = _spatial(x, None, attrs, "MaxPool")
    if attrs.get("ceil_mode", 0):  # the extra padding is -inf: exactly ceil_mode's windows
        pads = _ceil_pads(x, kernel, strides, dilations, pads)
    _reserve_padded(x, pads, "MaxPool")
    return [ad.max_pool2d(x, kernel, strides, pads, dilations)]


@register("AveragePool")
@_over_1d
def average_pool(inputs, attrs, opset):
    x, = inputs
    _pool_checks(attrs, 1, "AveragePool")
    kernel, strides, dilations, pads = _spatial(x, None, attrs, "AveragePool")
    if attrs.get("ceil_mode", 0):
        ceil = _ceil_pads(x, kernel, strides, dilations, pads)
        if ceil != pads and attrs.get("count_include_pad", 0):
            # the divisor would count the explicit pads but not the extra ones
            raise UnsupportedOperatorError("AveragePool: ceil_mode=1 with count_include_pad=1 "
                                           "is not supported")
        pads = ceil  # the extra padding is excluded from the divisor, as ceil_mode wants
    _reserve_padded(x, pads, "AveragePool")
    return [ad.avg_pool2d(x, kernel, strides, pads, dilations,
                          count_include_pad=attrs.get("count_include_pad", 0))]


@register("GlobalAveragePool")
def global_average_pool(inputs, attrs, opset):
    x, = inputs
    if x.ndim < 3:
        raise ValueError(f"GlobalAveragePool: expected (N, C, d1, ...), got shape {x.shape}")
    if x.data.size == 0:  # (N, C, 0) -> (N, C, 1): larger than the empty input
        reserve("GlobalAveragePool", x.shape[:2] + (1,) * (x.ndim - 2), x.data.dtype)
    return [ad.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


@register("BatchNormalization")
def batch_normalization(inputs, attrs, opset):
    x, scale, bias, mean, var = inputs
    if attrs.get("training_mode", 0) or (opset < 9 and not attrs.get("spatial", 1)):
        raise UnsupportedOperatorError("BatchNormalization: only the inference form "
                                       "(training_mode=0, spatial=1) is supported")
    c = x.shape[1] if x.ndim > 1 else None
    for name, t in (("scale", scale), ("B", bias), ("input_mean", mean), ("input_var", var)):
        if t.shape != (c,):
            raise ValueError(f"{name}: expected shape ({c},) (the channels of X), got {t.shape}")
    return [ad.batch_norm(x, scale, bias, mean, var, epsilon=attrs.get("epsilon", 1e-5))]


def _softmax(fun, name):
    @register(name)
    def run(inputs, attrs, opset):
        x, = inputs
        if opset >= 13:
            return [fun(x, axis=normalize_axis(attrs.get("axis", -1), x.ndim))]
        # before opset 13: coerce to 2-D, (prod(shape[:axis]), prod(shape[axis:]))
        axis = normalize_axis(attrs.get("axis", 1), x.ndim)
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        y = fun(ad.reshape(x, (outer, -1)), axis=1)
        return [ad.reshape(y, x.shape)]
    return run


_softmax(ad.softmax, "Softmax")
_softmax(ad.log_softmax, "LogSoftmax")


@register("NegativeLogLikelihoodLoss", since=12)
def nll_loss(inputs, attrs, opset):
    x, target = inputs[:2]
    weight = inputs[2] if len(inputs) > 2 else None
    return [ad.nll_loss(x, target, weight, reduction=attrs.get("reduction", "mean"),
                        ignore_index=attrs.get("ignore_index"))]


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(inputs, attrs, opset, n_outputs=1):
    scores, labels = inputs[:2]
    weight = inputs[2] if len(inputs) > 2 else None
    reduction = attrs.get("reduction", "mean")
    ignore = attrs.get("ignore_index")
    if scores.ndim == 2 and weight is None and reduction == "mean" and n_outputs == 1 \
            and not _ignores_any(labels, ignore):
        return [ad.softmax_cross_entropy(scores, labels)]  # fused kernel
    log_prob = ad.log_softmax(scores, axis=1)
    loss = ad.nll_loss(log_prob, labels, weight, reduction=reduction, ignore_index=ignore)
    return [loss, log_prob][:n_outputs]


def _ignores_any(labels, ignore):
    """True when some label equals ``ignore_index`` (None: no index is ignored).  With none
    ignored, the mean over the kept labels is the plain mean: the fused kernel's loss."""
    return ignore is not None and bool(np.any(labels.data == ignore))


@compiler("SoftmaxCrossEntropyLoss")
def compile_softmax_cross_entropy_loss(attrs, opset):
    if attrs.get("reduction", "mean") != "mean":
        return lambda inputs: softmax_cross_entropy_loss(inputs, attrs, opset)
    ignore = attrs.get("ignore_index")

    def run(inputs):  # the fused kernel's case decided once: only the inputs are left to test
        if len(inputs) == 2 and inputs[0].data.ndim == 2 \
                and not _ignores_any(inputs[1], ignore):
            return [ad.softmax_cross_entropy(inputs[0], inputs[1])]
        return softmax_cross_entropy_loss(inputs, attrs, opset)
    return run
