"""Operator overloading and methods of ``Tensor`` (attached here, after the primitives exist)."""
from . import _engine, _ops
from ._registry import binary_operator
from ._tensor import Tensor, _wrap

add, subtract, multiply, divide, power, matmul = (
    _ops.add, _ops.subtract, _ops.multiply, _ops.divide, _ops.power, _ops.matmul)


def _data(v):
    return v.data if isinstance(v, Tensor) else v


def _reduction(op, name):
    """``Tensor.sum``/``mean``/``max``: recorded reductions.  They take NumPy's keywords too, so
    ``np.sum(t)`` (which calls ``t.sum(axis=..., dtype=..., out=...)``) records the op; a
    ``dtype``, ``out`` or other NumPy-only option raises a TypeError saying so."""
    def method(a, axis=None, dtype=None, out=None, keepdims=False, **numpy_only):
        given = ([k for k, v in (("dtype", dtype), ("out", out)) if v is not None]
                 + sorted(numpy_only))
        if given:
            raise TypeError(f"Tensor.{name}: {', '.join(given)} not supported (a Tensor's "
                            f"{name} is recorded for gradients: {name}(axis, keepdims) only); "
                            f"use np.{name}(t.data, ...) for NumPy's")
        return op(a, axis, keepdims)
    method.__name__ = name
    return method


def _attach():
    T = Tensor
    T.__add__ = binary_operator(add)
    T.__radd__ = lambda a, b: add(b, a)
    T.__sub__ = binary_operator(subtract)
    T.__rsub__ = lambda a, b: subtract(b, a)
    T.__mul__ = binary_operator(multiply)
    T.__rmul__ = lambda a, b: multiply(b, a)
    T.__truediv__ = binary_operator(divide)
    T.__rtruediv__ = lambda a, b: divide(b, a)
    T.__pow__ = lambda a, b: power(a, b)
    T.__rpow__ = lambda a, b: power(b, a)
    T.__matmul__ = binary_operator(matmul)
    T.__rmatmul__ = lambda a, b: matmul(b, a)
    T.__neg__ = lambda a: _ops.negative(a)
    T.__pos__ = lambda a: a
    T.__getitem__ = lambda a, index: _ops.getitem(a, index)
    # comparisons give non-differentiable boolean tensors (masks); == stays identity (hashing)
    T.__lt__ = lambda a, b: _wrap(a.data < _data(b))
    T.__le__ = lambda a, b: _wrap(a.data <= _data(b))
    T.__gt__ = lambda a, b: _wrap(a.data > _data(b))
    T.__ge__ = lambda a, b: _wrap(a.data >= _data(b))
    T.sum = _reduction(_ops.sum, "sum")
    T.mean = _reduction(_ops.mean, "mean")
    T.max = _reduction(_ops.max, "max")
    T.reshape = lambda a, *shape: _ops.reshape(
        a, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)
    T.transpose = lambda a, *axes: _ops.transpose(
        a, (axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes) or None)
    T.T = property(lambda a: _ops.transpose(a))
    T.backward = _engine_backward


def _engine_backward(self, grad_output=None, retain_graph=False, create_graph=False):
    """Accumulate the gradient of this tensor into ``.grad`` of every leaf requiring gradients."""
    _engine.backward(self, grad_output, retain_graph=retain_graph, create_graph=create_graph)


_attach()
