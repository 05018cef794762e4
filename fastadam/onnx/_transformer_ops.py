"""``ai.onnx`` operators of transformer models exported from PyTorch (both exporters):
LayerNormalization, Gelu, Erf, Split, Slice, Expand, ConstantOfShape, Range, Trilu, Equal,
Less, Greater, Not, And, Or, Max, Min, Sum, Dropout (inference form), CastLike.  Same calling
convention and registration as ``_core_ops``.

Floating-point tensors go through recorded autodiff primitives (``fastadam.autodiff``'s
``layer_norm``, ``gelu``, ``erf``, ``maximum``, ``minimum``, slicing, broadcasting), so a
Gradient node differentiates them; shape and mask computations (integers, booleans) are plain
NumPy.  A Dropout that would drop (training mode with a ratio above 0) raises
``UnsupportedOperatorError``: its random mask cannot equal another runtime's.
"""
import math

import numpy as np
from onnx import helper

from .. import autodiff as ad
from ._budget import broadcast_shape, reserve, reserve_broadcast
from ._core_ops import (UnsupportedOperatorError, cast, const, ints, is_float, register,
                        same_dtype)


def _axis(axis, ndim, name="axis"):
    """``axis`` in ``[0, ndim)`` (negative counts from the end), or ValueError."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


# ---------------------------------------------------------------------------------------------
# normalisation and activations
# ---------------------------------------------------------------------------------------------


@register("LayerNormalization", since=17)
def layer_normalization(inputs, attrs, opset, n_outputs=1):
    x, scale = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    same_dtype("LayerNormalization", x, scale, bias)
    if not is_float(x):
        raise TypeError(f"X: expected a floating-point tensor, got {x.data.dtype}")
    if x.data.dtype not in (np.float32, np.float64):  # stash_type: the statistics in float32
        raise UnsupportedOperatorError(f"LayerNormalization: only float32 and float64 inputs "
                                       f"are supported, got {x.data.dtype}")
    axis = _axis(attrs.get("axis", -1), x.ndim)
    eps = float(np.float32(attrs.get("epsilon", 1e-5)))  # a float attribute: float32
    norm = x.shape[axis:]
    for name, t in (("Scale", scale), ("B", bias)):
        # (broadcast to the normalised shape, never past it: the output is x's size)
        if t is not None and (t.ndim > len(norm) or broadcast_shape(name, t.shape, norm) != norm):
            raise ValueError(f"{name}: shape {t.shape} does not broadcast to the normalised "
                             f"shape {norm}")
    if n_outputs == 1:
        return [ad.layer_norm(x, scale, bias, axis=axis, epsilon=eps)]
    # Mean and InvStdDev wanted too: the composite form, every output differentiable
    axes = tuple(range(axis, x.ndim))
    mean = ad.mean(x, axis=axes, keepdims=True)
    d = ad.subtract(x, mean)
    inv = ad.power(ad.add(ad.mean(ad.multiply(d, d), axis=axes, keepdims=True), eps), -0.5)
    y = ad.multiply(ad.multiply(d, inv), scale)
    if bias is not None:
        y = ad.add(y, bias)
    return [y, mean, inv][:n_outputs]


@register("Gelu", since=20)
def gelu(inputs, attrs, opset):
    x, = inputs
    if not is_float(x):
        raise TypeError(f"X: expected a floating-point tensor, got {x.data.dtype}")
    return [ad.gelu(x, approximate=attrs.get("approximate", "none"))]


@register("Erf", since=9)
def erf(inputs, attrs, opset):
    x, = inputs
    if not is_float(x):
        raise UnsupportedOperatorError(f"Erf: only floating-point inputs are supported, got "
                                       f"{x.data.dtype}")
    return [ad.erf(x)]


@register("Dropout", since=7)
def dropout(inputs, attrs, opset, n_outputs=1):
    x = inputs[0]
    if opset >= 12:
        ratio = float(inputs[1].data) if len(inputs) > 1 and inputs[1] is not None else 0.5
        training = bool(inputs[2].data) if len(inputs) > 2 and inputs[2] is not None else False
    else:  # opset 7 to 11: always the inference form
        ratio, training = attrs.get("ratio", 0.5), False
    if training and ratio > 0:
        raise UnsupportedOperatorError(f"Dropout: training mode with ratio {ratio} draws a random "
                                       f"mask; only the inference form (training_mode false, or "
                                       f"ratio 0) is supported")
    out = [x]
    if n_outputs > 1:
        out.append(const(np.ones(x.shape, dtype=bool)))
    return out


@register("CastLike", since=15)
def cast_like(inputs, attrs, opset):
    """Cast to ``like``'s type: exactly Cast with ``to`` that type (saturate included)."""
    x, like = inputs
    try:
        to = helper.np_dtype_to_tensor_dtype(like.data.dtype)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"CastLike: target_type has dtype {like.data.dtype}, which is no ONNX "
                         f"tensor type") from None
    return cast([x], dict(attrs, to=to), opset)


# ---------------------------------------------------------------------------------------------
# slicing, splitting, broadcasting
# ---------------------------------------------------------------------------------------------


def _index(x, index):
    """``x[index]`` (a tuple of slices): recorded for floats, a copy for the rest."""
    if is_float(x):
        return ad.getitem(x, index)
    return const(np.array(x.data[index]))


@register("Split", since=2)
def split(inputs, attrs, opset, n_outputs=1):
    x = inputs[0]
    axis = _axis(attrs.get("axis", 0), x.ndim)
    dim = x.shape[axis]
    if opset >= 13:
        sizes = ints(inputs[1], "split", max(n_outputs, 1)) \
            if len(inputs) > 1 and inputs[1] is not None else None
    else:
        sizes = tuple(attrs["split"]) if "split" in attrs else None
    if sizes is None:
        n = attrs.get("num_outputs", n_outputs) if opset >= 18 else n_outputs
        if opset >= 18 and "num_outputs" in attrs and n != n_outputs:
            raise ValueError(f"num_outputs: {n} differs from the node's {n_outputs} outputs")
        if n < 1:
            raise ValueError(f"num_outputs: expected at least 1, got {n}")
        step = -(-dim // n)  # ceil: the last chunk is smaller when dim % n != 0 (opset 18)
        if opset < 18 and dim % n:
            raise ValueError(f"Split: axis {axis} of size {dim} does not split into {n} equal "
                             f"parts")
        sizes = [min(step, max(dim - k * step, 0)) for k in range(n)]
    if len(sizes) != n_outputs:
        raise ValueError(f"split: {len(sizes)} sizes for {n_outputs} outputs")
    if any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise ValueError(f"split: sizes {tuple(sizes)} do not add up to axis {axis}'s "
                         f"{dim}")
    out, start = [], 0
    for s in sizes:
        index = (slice(None),) * axis + (slice(start, start + s),)
        out.append(_index(x, index))
        start += s
    return out


@register("Slice", since=1)
def slice_(inputs, attrs, opset):
    x = inputs[0]
    if opset >= 10:
        starts, ends = ints(inputs[1], "starts"), ints(inputs[2], "ends")
        axes = ints(inputs[3], "axes") if len(inputs) > 3 and inputs[3] is not None else None
        steps = ints(inputs[4], "steps") if len(inputs) > 4 and inputs[4] is not None else None
    else:
        starts, ends = tuple(attrs["starts"]), tuple(attrs["ends"])
        axes, steps = attrs.get("axes"), None
    if axes is None:
        axes = tuple(range(len(starts)))
    if steps is None:
        steps = (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"Slice: starts, ends, axes and steps differ in length ({len(starts)}, "
                         f"{len(ends)}, {len(axes)}, {len(steps)})")
    index = [slice(None)] * x.ndim
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, x.ndim, "axes")
        if a in seen:
            raise ValueError(f"axes: axis {a} is repeated")
        seen.add(a)
        if st == 0:
            raise ValueError("steps: a step cannot be 0")
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        index[a] = slice(s, None if e < 0 else e, st)
    return [_index(x, tuple(index))]


@register("Expand", since=8)
def expand(inputs, attrs, opset):
    x, shape = inputs
    shape = ints(shape, "shape")
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise ValueError(f"shape: {shape} does not broadcast with the input's shape "
                         f"{x.shape}") from None
    reserve("Expand", out, x.data.dtype)  # the shape comes from data: check before allocating
    if is_float(x):
        return [ad.broadcast_to(x, out)]
    return [const(np.broadcast_to(x.data, out).copy())]


@register("ConstantOfShape", since=9)
def constant_of_shape(inputs, attrs, opset):
    shape = ints(inputs[0], "input")
    if any(d < 0 for d in shape):
        raise ValueError(f"input: a shape cannot have negative dimensions, got {shape}")
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ValueError(f"value: expected a one-element tensor, got shape {value.shape}")
    reserve("ConstantOfShape", shape, value.dtype)
    return [const(np.full(shape, value.reshape(()), dtype=value.dtype))]


def _range_count(start, limit, delta):
    """ONNX Range's ``max(ceil((limit - start) / delta), 0)``: exact (Python ints) for integer
    inputs, whose difference may not fit their dtype; in the inputs' dtype for floats, as the
    reference computes it, or exactly when that quotient overflows.  ValueError naming the
    input for a zero delta or a value that is not finite."""
    if start.dtype.kind in "bcOSU":
        raise TypeError(f"start: expected a real number, got dtype {start.dtype}")
    for name, v in (("start", start), ("limit", limit), ("delta", delta)):
        if start.dtype.kind not in "iu" and not math.isfinite(float(v)):
            raise ValueError(f"{name}: expected a finite number, got {v}")
    if delta == 0:
        raise ValueError("delta: cannot be 0")
    if start.dtype.kind in "iu":
        a, b, d = int(start), int(limit), int(delta)
        return max(-((a - b) // d), 0)  # ceil((b - a) / d)
    with np.errstate(over="ignore"):
        q = (limit - start) / delta
    if np.isfinite(q):
        return max(int(np.ceil(q)), 0)
    import fractions  # the count does not fit the dtype: far over any budget
    q = (fractions.Fraction(float(limit)) - fractions.Fraction(float(start))) / \
        fractions.Fraction(float(delta))
    return max(math.ceil(q), 0)


@register("Range", since=11)
def range_(inputs, attrs, opset):
    start, limit, delta = (t.data for t in inputs)
    for name, v in (("start", start), ("limit", limit), ("delta", delta)):
        if v.size != 1:
            raise ValueError(f"{name}: expected a scalar, got shape {v.shape}")
    same_dtype("Range", *inputs)
    start, limit, delta = start.reshape(()), limit.reshape(()), delta.reshape(())
    n = _range_count(start, limit, delta)
    reserve("Range", (n,), start.dtype)
    # ONNX: start + k * delta, k = 0 .. n-1 (computed in the input's dtype)
    return [const((start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype))]


@register("Trilu", since=14)
def trilu(inputs, attrs, opset):
    x = inputs[0]
    k = int(inputs[1].data.reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    if x.ndim < 2:
        raise ValueError(f"input: Trilu needs a tensor of rank >= 2, got shape {x.shape}")
    n, m = x.shape[-2:]
    reserve("Trilu", (n, m), np.bool_, "mask")  # (an empty x of shape (0, n, m) has n*m of it)
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = (cols - rows >= k) if attrs.get("upper", 1) else (cols - rows <= k)
    if is_float(x):
        return [ad.where(keep, x, const(np.zeros((), x.data.dtype)))]
    return [const(np.where(keep, x.data, np.zeros((), x.data.dtype)))]


# ---------------------------------------------------------------------------------------------
# comparisons, logic, elementwise extrema
# ---------------------------------------------------------------------------------------------


def _compare(op_type, np_fun, since):
    @register(op_type, since=since)
    def run(inputs, attrs, opset):
        a, b = inputs
        same_dtype(op_type, a, b)
        if a.shape != b.shape:
            reserve_broadcast(op_type, np.bool_, a.shape, b.shape)
        return [const(np_fun(a.data, b.data))]
    return run


_compare("Equal", np.equal, 7)
_compare("Less", np.less, 7)
_compare("Greater", np.greater, 7)


def _logical(op_type, np_fun):
    @register(op_type, since=7)
    def run(inputs, attrs, opset):
        for t in inputs:
            if t.data.dtype != np.bool_:
                raise TypeError(f"{op_type}: expected bool tensors, got {t.data.dtype}")
        if len(inputs) > 1:
            reserve_broadcast(op_type, np.bool_, *[t.shape for t in inputs])
        return [const(np_fun(*[t.data for t in inputs]))]
    return run


_logical("Not", np.logical_not)
_logical("And", np.logical_and)
_logical("Or", np.logical_or)


def _reserve_pairwise(op_type, inputs):
    """``reserve`` what the pairwise loop of Sum, Max and Min allocates: one result per input
    after the first, each the broadcast of the inputs so far (the nodes ``Add(Add(a, b), c)``
    would reserve the same); nothing while the shapes are equal."""
    shape, dtype = inputs[0].shape, inputs[0].data.dtype
    broadcast_shape(op_type, *[t.shape for t in inputs])  # ValueError naming the shapes
    for t in inputs[1:]:
        if t.shape != shape:
            shape = broadcast_shape(op_type, shape, t.shape)
            reserve(op_type, shape, dtype)


def _extremum(op_type, ad_fun, np_fun):
    @register(op_type, since=8)
    def run(inputs, attrs, opset):
        if not inputs:
            raise ValueError(f"{op_type}: needs at least one input")
        same_dtype(op_type, *inputs)
        _reserve_pairwise(op_type, inputs)
        out = inputs[0]
        for t in inputs[1:]:
            out = ad_fun(out, t) if is_float(out) else const(np_fun(out.data, t.data))
        return [out]
    return run


_extremum("Max", ad.maximum, np.maximum)
_extremum("Min", ad.minimum, np.minimum)


@register("Sum", since=8)
def sum_(inputs, attrs, opset):
    """The elementwise sum of one or more tensors (multidirectional broadcasting)."""
    if not inputs:
        raise ValueError("Sum: needs at least one input")
    same_dtype("Sum", *inputs)
    _reserve_pairwise("Sum", inputs)
    out = inputs[0]
    for t in inputs[1:]:
        out = ad.add(out, t) if is_float(out) else const(np.add(out.data, t.data))
    return [out]
