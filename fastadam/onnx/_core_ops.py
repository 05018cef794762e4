"""Core ``ai.onnx`` operators on fastadam.autodiff Tensors: arithmetic, matrix products, reductions,
shapes, indexing, casts.  Neural-network operators (Conv, pooling, softmax, losses) are in
``_nn_ops``.

Every operator is a function ``f(inputs, attrs, opset) -> list of Tensors`` registered with
``@register(op_type, since)``: ``inputs`` are Tensors (``None`` for an omitted optional input),
``attrs`` the node's attributes as Python values, ``opset`` the model's ``ai.onnx`` version, which
selects the operator's form (attribute or input for ``axes``, Softmax's 2-D coercion before opset
13, ...).  Floating-point tensors go through recorded autodiff primitives (so a Gradient node can
differentiate them); integer and boolean tensors (shapes, indices, masks) are plain NumPy.
"""
import numbers
import operator

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .. import autodiff as ad
from ..autodiff import Tensor
from ._budget import broadcast_shape, reserve, reserve_broadcast

class UnsupportedOperatorError(NotImplementedError):
    """An operator, domain, opset or operator form that fastadam.onnx does not run."""


# op_type -> (lowest supported opset, function)
OPERATORS = {}
# op_type -> compile(attrs, opset) -> run(inputs): the same operator with its attributes resolved
# once per node (for the operators on a training step's hot path); optional
COMPILERS = {}


# the TensorProto.DataType values (UNDEFINED excluded)
VALID_DATA_TYPES = frozenset(v for v in TensorProto.DataType.values() if v)


def onnx_dtype(code, label, field):
    """The NumPy dtype of ONNX data type ``code``; ValueError naming ``label`` and ``field``
    if ``code`` is not one."""
    if code not in VALID_DATA_TYPES:
        raise ValueError(f"{label}: {field}={code} is not an ONNX tensor data type")
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{label}: {field}={code} has no NumPy dtype") from None


def register(op_type, since=7):
    def wrap(fun):
        OPERATORS[op_type] = (since, fun)
        return fun
    return wrap


def compiler(op_type):
    """Register ``compile(attrs, opset)``: what ``OPERATORS[op_type]`` computes, as a function
    of the inputs alone (``Graph`` uses it for single-output nodes)."""
    def wrap(make):
        COMPILERS[op_type] = make
        return make
    return wrap


def is_float(t):
    return t.data.dtype.kind == "f"


def const(array):
    """A non-recorded Tensor around ``array``."""
    return Tensor(np.asarray(array))


# the most values a shape, axes, starts/ends/steps input may hold: a NumPy array has at most
# 64 dimensions (a longer list is refused before it becomes Python ints, 36 bytes each)
MAX_RANK = 64


def ints(t, name="input", limit=MAX_RANK):
    """An integer input tensor (axes, shape, ...) as a tuple of Python ints; ValueError naming
    ``name`` when it holds more than ``limit`` values."""
    a = np.asarray(t.data)
    if a.size > limit:
        raise ValueError(f"{name}: expected at most {limit} values, got {a.size}")
    return tuple(int(v) for v in a.reshape(-1))


def normalize_axis(axis, rank, name="axis", *, allow_rank=False):
    """``axis`` of a tensor of rank ``rank`` as an index in ``[0, rank)``: a negative axis counts
    from the end (``axis + rank``).  ``allow_rank``: the range is ``[-rank, rank]`` (an axis that
    splits the shape in two, as Flatten's).  Every operator that takes an axis reads it here.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for an out-of-range axis, naming
    ``name``; ``Graph`` puts the node's name and operator in front of the message.
    """
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name}: expected an integer axis, got {type(axis).__name__}")
    axis = int(axis)
    top = rank if allow_rank else rank - 1
    if not -rank <= axis <= top:
        raise ValueError(f"{name}: {axis} is out of range for a tensor of rank {rank} "
                         f"(expected {-rank} to {top})")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes, rank, name="axes"):
    """``normalize_axis`` of each of ``axes``, as a sorted tuple; a repeated axis (after
    normalisation) raises ``ValueError``."""
    out = [normalize_axis(a, rank, name) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: {list(axes)} names an axis twice for a tensor of rank {rank}")
    return tuple(sorted(out))


def same_dtype(op_type, *ts):
    first = ts[0].data.dtype
    for t in ts:
        if t is not None and t.data.dtype != first:
            break
    else:
        return
    dts = {t.data.dtype for t in ts if t is not None}
    if len(dts) > 1:
        raise TypeError(f"inputs of {op_type} must have one dtype, got "
                        f"{', '.join(sorted(str(d) for d in dts))}")


# ---------------------------------------------------------------------------------------------
# elementwise arithmetic
# ---------------------------------------------------------------------------------------------


def _int_divide(a, b):
    if np.any(b == 0):
        raise ValueError("integer division by zero")
    q = np.abs(a) // np.abs(b)  # C semantics: truncate toward zero
    return (np.sign(a) * np.sign(b) * q).astype(a.dtype)


_INT_RANGES = {}  # integer dtype -> (min, max)


def _int_range(dtype):
    r = _INT_RANGES.get(dtype)
    if r is None:
        info = np.iinfo(dtype)
        r = _INT_RANGES[dtype] = (int(info.min), int(info.max))
    return r


def _binary(op_type, ad_fun, np_fun, py_fun=None):
    """``py_fun``: the operator on Python ints, for two 0-d integer tensors (a step counter's
    ``T + 1``): NumPy's answer whenever the result fits the dtype, else NumPy computes it."""
    def run_inputs(inputs):
        a, b = inputs
        x, y = a.data, b.data
        dtype = x.dtype
        if y.dtype != dtype:
            same_dtype(op_type, a, b)  # NumPy names the shapes that do not broadcast
        if x.shape != y.shape:
            reserve_broadcast(op_type, dtype, x.shape, y.shape)
        if dtype.kind == "f":
            return [ad_fun(a, b)]
        if py_fun is not None and not x.ndim and not y.ndim and dtype.kind in "iu":
            lo, hi = _int_range(dtype)
            v = py_fun(int(x), int(y))
            if lo <= v <= hi:
                return [Tensor(np.array(v, dtype))]
        return [Tensor(np_fun(x, y))]  # a non-recorded Tensor (const)

    @register(op_type)
    def run(inputs, attrs, opset):
        return run_inputs(inputs)

    compiler(op_type)(lambda attrs, opset: run_inputs)
    return run


_binary("Add", ad.add, np.add, operator.add)
_binary("Sub", ad.subtract, np.subtract, operator.sub)
_binary("Mul", ad.multiply, np.multiply, operator.mul)
_binary("Div", ad.divide, _int_divide)


@register("Pow")
def pow_(inputs, attrs, opset):
    x, y = inputs
    reserve_broadcast("Pow", x.data.dtype, x.shape, y.shape)
    if not is_float(x):
        return [const(np.power(x.data, y.data).astype(x.data.dtype))]
    if y.data.dtype != x.data.dtype:  # opset 12+: the exponent may have another type
        y = ad.cast(y, x.data.dtype) if is_float(y) else const(y.data.astype(x.data.dtype))
    return [ad.power(x, y)]


def _unary(op_type, ad_fun, np_fun=None):
    def run_inputs(inputs):
        x, = inputs
        if x.data.dtype.kind == "f":
            return [ad_fun(x)]
        if np_fun is None:
            raise TypeError(f"{op_type}: expected a floating-point input, got {x.data.dtype}")
        return [const(np_fun(x.data))]

    @register(op_type)
    def run(inputs, attrs, opset):
        return run_inputs(inputs)

    compiler(op_type)(lambda attrs, opset: run_inputs)
    return run


_unary("Neg", ad.negative, np.negative)
_unary("Abs", ad.abs, np.abs)
_unary("Relu", ad.relu, lambda a: np.maximum(a, 0))
_unary("Sqrt", ad.sqrt)
_unary("Exp", ad.exp)
_unary("Log", ad.log)
_unary("Sigmoid", ad.sigmoid)
_unary("Tanh", ad.tanh)


@register("LeakyRelu")
def leaky_relu(inputs, attrs, opset):
    return [ad.leaky_relu(inputs[0], attrs.get("alpha", 0.01))]


@register("Where", since=9)
def where(inputs, attrs, opset):
    c, x, y = inputs
    if c.data.dtype != np.bool_:
        raise TypeError(f"condition: expected a bool tensor, got {c.data.dtype}")
    same_dtype("Where", x, y)
    reserve_broadcast("Where", x.data.dtype, c.shape, x.shape, y.shape)
    if is_float(x):
        return [ad.where(c.data, x, y)]
    return [const(np.where(c.data, x.data, y.data))]


@register("Clip", since=6)
def clip(inputs, attrs, opset):
    x = inputs[0]
    if opset < 11:
        lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    else:
        lo = inputs[1].data.item() if len(inputs) > 1 and inputs[1] is not None else None
        hi = inputs[2].data.item() if len(inputs) > 2 and inputs[2] is not None else None
    if is_float(x):
        return [ad.clip(x, lo, hi)]
    return [const(np.clip(x.data, lo, hi).astype(x.data.dtype))]


# ---------------------------------------------------------------------------------------------
# matrix products
# ---------------------------------------------------------------------------------------------


@register("MatMul")
def matmul(inputs, attrs, opset):
    a, b = inputs
    same_dtype("MatMul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"MatMul: expected tensors of rank >= 1, got shapes {a.shape} and "
                         f"{b.shape}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(f"MatMul: shapes {a.shape} and {b.shape} do not match ({ka} != {kb})")
    batch = broadcast_shape("MatMul", a.shape[:-2], b.shape[:-2]) \
        if a.ndim > 2 or b.ndim > 2 else ()
    reserve("MatMul", batch + a.shape[-2:-1] + b.shape[-1:] if b.ndim > 1 else
            batch + a.shape[-2:-1], a.data.dtype)
    if batch and (a.requires_grad or b.requires_grad) and ad.is_grad_enabled():
        # a recorded product over broadcast batch axes: its backward forms each operand's
        # gradient over the whole batch before summing it down (g @ B^T, A^T @ g)
        for name, t in (("A", a), ("B", b)):
            if t.ndim > 1 and t.shape[:-2] != batch:
                reserve("MatMul", batch + t.shape[-2:], a.data.dtype,
                        f"gradient of {name} over the broadcast batch", temporary=True)
    if a.ndim > 2 and b.ndim == 2 and is_float(a):  # (..., k) @ (k, n): one 2-D product,
        y = ad.matmul(ad.reshape(a, (-1, ka)), b)   # not one per leading index (nor in backward)
        return [ad.reshape(y, a.shape[:-1] + (b.shape[1],))]
    return [ad.matmul(a, b)]


@compiler("Gemm")
def compile_gemm(attrs, opset):
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    ia, ib = (0 if ta else 1), (1 if tb else 0)  # where the inner dimension is in A and in B
    gemm = ad.gemm

    def check_shapes(sa, sb):
        if len(sa) != 2 or len(sb) != 2:
            raise ValueError(f"Gemm: expected 2-D A and B, got shapes {sa} and {sb}")
        if sa[ia] != sb[ib]:
            raise ValueError(f"Gemm: A{' (transposed)' if ta else ''} has shape {sa} and "
                             f"B{' (transposed)' if tb else ''} has shape {sb}: {sa[ia]} != "
                             f"{sb[ib]}")

    def run(inputs):
        if len(inputs) > 2:
            a, b, c = inputs
        else:
            (a, b), c = inputs, None
        dtype = a.data.dtype
        if b.data.dtype is not dtype or (c is not None and c.data.dtype is not dtype):
            same_dtype("Gemm", a, b, c)  # raises unless the dtypes are equal after all
        sa, sb = a.data.shape, b.data.shape
        if len(sa) == 2 and len(sb) == 2:
            out = (sa[1 if ta else 0], sb[0 if tb else 1])
            # C broadcasts to (M, N), one way: a C of more axes would make the output larger
            if c is not None and (c.ndim > 2 or any(
                    d != 1 and d != e for d, e in zip(c.data.shape[::-1], out[::-1]))):
                raise ValueError(f"C: shape {c.data.shape} does not broadcast to the output "
                                 f"shape {out}")
            reserve("Gemm", out, dtype)
        try:
            return [gemm(a, b, c, alpha, beta, ta, tb)]
        except ValueError:  # nothing was recorded; wrong shapes of A and B are named here
            check_shapes(a.data.shape, b.data.shape)
            raise
    return run


@register("Gemm")
def gemm(inputs, attrs, opset):
    return compile_gemm(attrs, opset)(inputs)


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------


def _lowest(dtype):
    """ReduceMax's value over an empty set (opset 18): -inf, or the dtype's least value."""
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def _reduce(op_type, ad_fun, np_fun, axes_input_since, empty=None):
    """``empty(dtype)``: the result of a reduction over an empty set (None: NumPy's own)."""
    @register(op_type)
    def run(inputs, attrs, opset):
        x = inputs[0]
        if opset >= axes_input_since:
            axes = ints(inputs[1], "axes") if len(inputs) > 1 and inputs[1] is not None else ()
        else:
            axes = tuple(attrs.get("axes", ()))
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = None
        else:
            axes = normalize_axes(axes, x.ndim)
        if x.data.size == 0:  # an empty input may reduce to a larger output: (0, n, m) -> (n, m)
            reduced = range(x.ndim) if axes is None else axes
            shape = tuple(1 if i in reduced else d for i, d in enumerate(x.shape)
                          if keep or i not in reduced)
            reserve(op_type, shape, x.data.dtype)
            if empty is not None and any(x.shape[a] == 0 for a in reduced):
                # an empty set: the operator's identity
                return [const(np.full(shape, empty(x.data.dtype), x.data.dtype))]
        if is_float(x):
            return [ad_fun(x, axes, keep)]
        return [const(np_fun(x.data, axis=axes, keepdims=keep))]
    return run


_reduce("ReduceSum", ad.sum, np.sum, 13)
_reduce("ReduceMean", ad.mean, np.mean, 18)
_reduce("ReduceMax", ad.max, np.max, 18, empty=_lowest)

# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------


def _reshaped(x, shape):
    return ad.reshape(x, shape) if is_float(x) else const(x.data.reshape(shape))


@register("Reshape", since=5)
def reshape(inputs, attrs, opset):
    x, shape = inputs
    shape = list(ints(shape, "shape"))
    if not attrs.get("allowzero", 0):
        for i, d in enumerate(shape):
            if d == 0:
                if i >= x.ndim:
                    raise ValueError(f"shape: a 0 at position {i} copies a dimension that the "
                                     f"input of shape {x.shape} does not have")
                shape[i] = x.shape[i]
    if any(d < -1 for d in shape):  # (NumPy would read any negative size as -1)
        raise ValueError(f"shape: {tuple(shape)} has a negative size other than -1")
    try:  # (a reshape that fails records nothing and changes nothing)
        return [_reshaped(x, tuple(shape))]
    except ValueError:
        raise ValueError(f"shape: cannot reshape a tensor of shape {x.shape} to "
                         f"{tuple(shape)}") from None


@register("Flatten")
def flatten(inputs, attrs, opset):
    x, = inputs
    axis = normalize_axis(attrs.get("axis", 1), x.ndim, allow_rank=True)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [_reshaped(x, (outer, int(np.prod(x.shape[axis:], dtype=np.int64))))]


@register("Transpose")
def transpose(inputs, attrs, opset):
    x, = inputs
    perm = tuple(attrs.get("perm", range(x.ndim - 1, -1, -1)))
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"perm: {perm} is not a permutation of the {x.ndim} axes")
    return [ad.transpose(x, perm) if is_float(x) else const(x.data.transpose(perm))]


def _axes_of(inputs, attrs, opset):
    if opset >= 13:
        return ints(inputs[1], "axes") if len(inputs) > 1 and inputs[1] is not None else None
    return tuple(attrs["axes"]) if "axes" in attrs else None


@register("Unsqueeze")
def unsqueeze(inputs, attrs, opset):
    x = inputs[0]
    axes = _axes_of(inputs, attrs, opset)
    if not axes:
        raise ValueError("axes: Unsqueeze needs at least one axis")
    axes = normalize_axes(axes, x.ndim + len(axes))  # axes of the output
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [_reshaped(x, tuple(shape))]


@register("Squeeze")
def squeeze(inputs, attrs, opset):
    x = inputs[0]
    axes = _axes_of(inputs, attrs, opset)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = normalize_axes(axes, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise ValueError(f"axes: can only squeeze axes of size 1, got {list(axes)} for shape "
                         f"{x.shape}")
    return [_reshaped(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@register("Concat", since=4)
def concat(inputs, attrs, opset):
    if "axis" not in attrs:
        raise ValueError("axis: Concat needs the axis attribute")
    same_dtype("Concat", *inputs)
    nd = inputs[0].ndim
    axis = normalize_axis(attrs["axis"], nd)
    for t in inputs[1:]:
        if t.ndim != nd or any(d != e for i, (d, e) in enumerate(zip(t.shape, inputs[0].shape))
                               if i != axis):
            raise ValueError(f"Concat: shapes {inputs[0].shape} and {t.shape} differ outside "
                             f"axis {axis}")
    if len(inputs) > 1:  # (one input listed many times makes a large output of a small one)
        shape = list(inputs[0].shape)
        shape[axis] = sum(t.shape[axis] for t in inputs)
        reserve("Concat", shape, inputs[0].data.dtype)
    if is_float(inputs[0]):
        return [ad.concatenate(inputs, axis=axis)]
    return [const(np.concatenate([t.data for t in inputs], axis=axis))]


@register("Shape")
def shape(inputs, attrs, opset):
    dims = np.array(inputs[0].shape, dtype=np.int64)
    if opset >= 15:
        dims = dims[attrs.get("start", 0):attrs.get("end", None)]
    return [const(dims)]


@register("Gather")
def gather(inputs, attrs, opset):
    x, idx = inputs
    axis = normalize_axis(attrs.get("axis", 0), x.ndim)
    n, i = x.shape[axis], idx.data
    if i.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer array, got {i.dtype}")
    # many indices into a small table make a large output: checked before the index pass
    reserve("Gather", x.shape[:axis] + i.shape + x.shape[axis + 1:], x.data.dtype)
    if is_float(x):
        return [ad.gather(x, idx, axis=axis)]
    if i.size and (i.min() < -n or i.max() >= n):
        raise IndexError(f"indices: values must lie in [{-n}, {n}), got [{i.min()}, {i.max()}]")
    return [const(np.take(x.data, np.where(i < 0, i + n, i), axis=axis))]


@register("Identity")
def identity(inputs, attrs, opset):
    return [inputs[0]]


def cast_array(a, to, saturate=1, round_mode="up"):
    """``a`` cast to the ONNX tensor type ``to`` as Cast does (opset 19+ for ``saturate``, 24+
    for ``round_mode``).  To a float8 type with ``saturate`` (the default), a value beyond the
    type's range, infinities included, becomes its largest finite value of the same sign;
    without it, what the type holds (inf for E5M2, NaN for the others).  FLOAT8E8M0 rounds as
    ``round_mode`` says ("up", "down", "nearest")."""
    if to == TensorProto.STRING or a.dtype.kind in "OSU":
        raise UnsupportedOperatorError("Cast: string tensors are not supported")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(to))
    if to in _FLOAT8_SATURATING and saturate:
        import ml_dtypes  # an onnx dependency, which defines the float8 dtypes
        top = float(ml_dtypes.finfo(dtype).max)
        return np.clip(a, -top, top).astype(dtype)
    if to == getattr(TensorProto, "FLOAT8E8M0", None):
        if round_mode not in ("up", "down", "nearest"):
            raise ValueError(f"round_mode: expected 'up', 'down' or 'nearest', got {round_mode!r}")
        return numpy_helper.to_float8e8m0(a, bool(saturate), round_mode).astype(dtype)
    return a.astype(dtype)


_IEEE_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
# the float8 types whose Cast honours ``saturate`` (those of the installed onnx)
_FLOAT8_SATURATING = frozenset(
    getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                      "FLOAT8E5M2FNUZ") if hasattr(TensorProto, n))


@register("Cast", since=6)
def cast(inputs, attrs, opset):
    x, = inputs
    if "to" not in attrs:
        raise ValueError("Cast: missing attribute 'to'")
    to = onnx_dtype(attrs["to"], "Cast", "to")
    if to.itemsize > x.data.dtype.itemsize:  # bool or float8 to float64: 8 times the bytes
        reserve("Cast", x.shape, to)
    if x.data.dtype in _IEEE_FLOATS and to in _IEEE_FLOATS:  # differentiable
        return [ad.cast(x, to)]
    return [const(cast_array(x.data, attrs["to"], attrs.get("saturate", 1),
                             attrs.get("round_mode", "up")))]


@register("Constant")
def constant(inputs, attrs, opset):
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in attrs:
            return [const(np.array(attrs[key], dtype=dtype))]
    if "value" in attrs:
        return [const(attrs["value"])]
    raise UnsupportedOperatorError(f"Constant: only value, value_float(s) and value_int(s) are "
                              f"supported, got {sorted(attrs)}")
