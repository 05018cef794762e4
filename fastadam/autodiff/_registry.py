"""Primitives and the VJP registry (``primitive``, ``defvjp``).

A primitive is a function of ndarrays (positional tensor arguments, keyword parameters that are
never differentiated) wrapped so that it accepts Tensors and records a tape node.  Its
vector-Jacobian products are registered separately, one per positional argument::

    @primitive
    def cube(x):
        return x ** 3

    defvjp(cube, lambda g, ans, x: g * 3 * x ** 2)

A VJP receives the output cotangent ``g``, the output ``ans`` and the inputs, all as Tensors,
plus the keyword parameters, and returns the cotangent of its argument (same shape).  VJPs are
written with the engine's own operations, so they are recorded when ``create_graph=True`` and
higher-order derivatives need no special code.  An argument whose VJP was never registered raises
``NotImplementedError`` naming the primitive and the argument when a gradient flows through it;
``zero_vjp`` declares an argument non-differentiable (gradient zero: masks, labels, indices).
"""
import functools
from weakref import ref as _weakref

import numpy as np

from . import _tensor
from ._tensor import Node, Tensor, _mode, _tape, _wrap, mark_view, version_of

_new = object.__new__
_next_id = _tensor._node_ids.__next__  # the tape's one counter (Node() draws from it too)
_ndarray = np.ndarray


def zero_vjp(g, ans, *args, **params):
    """Marker VJP: the argument does not influence the output differentiably."""
    return None


class Primitive:
    """A differentiable function of ndarrays.  Call it with Tensors, ndarrays or scalars.

    ``view``: True for primitives whose output may be a view of their first argument (reshape,
    transpose, basic indexing): such an output shares that argument's version counter.
    """

    __slots__ = ("fun", "name", "vjps", "vjp_argnum", "view", "__wrapped__", "__dict__")

    def __init__(self, fun, name=None, view=False):
        self.fun = fun
        self.name = name or fun.__name__
        self.vjps = {}
        self.vjp_argnum = None  # variadic primitives: one VJP taking the argument number
        self.view = view
        self.__doc__ = fun.__doc__
        self.__wrapped__ = fun

    def __call__(self, *args, **params):
        # the hot path of every recorded operation: kept flat on purpose
        need = False
        versioned = False
        for a in args:
            if a.__class__ is not Tensor:
                return self._call_converting(args, params)
            if a.requires_grad:
                need = True
            if a._version or a._base is not None:
                versioned = True
        n = len(args)
        if n == 2:
            out = self.fun(args[0].data, args[1].data, **params)
        elif n == 1:
            out = self.fun(args[0].data, **params)
        else:
            out = self.fun(*[a.data for a in args], **params)
        if out.__class__ is not _ndarray:  # NumPy returns scalars for 0-d results
            out = np.asarray(out)
        if need and _mode.enabled:
            # Node(...) and _wrap(...) inlined: two Python frames less per recorded operation
            node = _new(Node)
            node.prim = self
            node.inputs = args
            node.versions = tuple([version_of(a) for a in args]) if versioned else None
            node.params = params
            node.out_data = out
            node.out_version = 0
            node.id = _next_id()
            t = _new(Tensor)
            t.data = out
            t.requires_grad = True
            t.grad = None
            t._node = node
            t._version = 0
            t._base = None
            node.out_ref = _weakref(t)
            if self.view:
                mark_view(t, args[0])
                node.out_version = version_of(t)
            return t
        t = _wrap(out)
        if self.view:
            mark_view(t, args[0])
        return t

    _call_python = __call__  # the reference the compiled ``_tape.primitive_call`` matches

    def _call_converting(self, args, params):
        """Slow path: some arguments are scalars, ndarrays or Tensor subclasses."""
        tensors = []
        scalars = False
        for a in args:
            if not isinstance(a, Tensor):
                if isinstance(a, (int, float)) and not isinstance(a, bool):
                    scalars = True
                else:
                    a = _wrap(np.asarray(a))
            tensors.append(a)
        if scalars:
            tensors = _scalars_to_tensors(tensors)
        out = np.asarray(self.fun(*[a.data for a in tensors], **params))
        if _mode.enabled and any(a.requires_grad for a in tensors):
            node = Node(self, tuple(tensors), params, out, True)
            t = _wrap(out, True, node)
            node.out_ref = _weakref(t)
            if self.view:
                mark_view(t, tensors[0])
                node.out_version = version_of(t)
            return t
        t = _wrap(out)
        if self.view:
            mark_view(t, tensors[0])
        return t

    def vjp(self, argnum):
        """The VJP of argument ``argnum`` (NotImplementedError if none is registered)."""
        f = self.vjps.get(argnum)
        if f is None:
            if self.vjp_argnum is not None:
                return functools.partial(self.vjp_argnum, argnum)
            raise NotImplementedError(
                f"VJP of primitive '{self.name}' with respect to argument {argnum} is not "
                f"registered; register it with defvjp({self.name}, ...)")
        return f

    def __repr__(self):
        return f"<primitive {self.name}>"


if _tape is not None:
    Primitive.__call__ = _tape.primitive_call

# the NumPy functions whose ndarray operator the compiled binary operator calls directly
_OPERATOR_CODES = {} if _tape is None else {
    np.add: _tape.OP_ADD, np.subtract: _tape.OP_SUBTRACT, np.multiply: _tape.OP_MULTIPLY,
    np.divide: _tape.OP_DIVIDE, np.matmul: _tape.OP_MATMUL}


def binary_operator(prim, compiled=True):
    """``prim(a, b)`` as a Tensor operator method (``__add__`` ...), with the common case (two
    tensors at version 0, not views) recorded inline: in C (``_tape``) for NumPy's arithmetic
    and matmul, else in one Python frame (also with ``compiled=False``: the reference the
    compiled path is tested against).  Anything else goes through ``prim``."""
    fun = prim.fun
    if prim.view:
        raise ValueError("prim: view primitives are not operators")
    code = _OPERATOR_CODES.get(fun) if compiled else None
    if code is not None:
        return _tape.make_operator(code, prim)

    def operator(a, b):
        if b.__class__ is not Tensor or a.__class__ is not Tensor or a._version or b._version \
                or a._base is not None or b._base is not None:
            return prim(a, b)
        out = fun(a.data, b.data)
        if out.__class__ is not _ndarray:
            out = np.asarray(out)
        t = _new(Tensor)
        t.data = out
        t.grad = None
        t._version = 0
        t._base = None
        if (a.requires_grad or b.requires_grad) and _mode.enabled:
            node = _new(Node)
            node.prim = prim
            node.inputs = (a, b)
            node.versions = None
            node.params = {}
            node.out_data = out
            node.out_version = 0
            node.id = _next_id()
            t.requires_grad = True
            t._node = node
            node.out_ref = _weakref(t)
        else:
            t.requires_grad = False
            t._node = None
        return t

    operator.__name__ = prim.name
    return operator


def primitive(fun=None, *, name=None, view=False):
    """Decorator turning a function of ndarrays into a recorded primitive.

    ``view=True``: the output may be a view of the first argument (it then shares that
    argument's version counter, so in-place changes through either are detected)."""
    if fun is None:
        return lambda f: Primitive(f, name, view)
    return Primitive(fun, name, view)


def defvjp(prim, *vjps, argnums=None):
    """Register VJPs of ``prim``: ``vjps[k]`` is for argument ``argnums[k]`` (default ``k``).

    Pass ``None`` to leave an argument without a VJP (an error if a gradient is asked through it),
    ``zero_vjp`` for an argument that is non-differentiable by nature.
    """
    if not isinstance(prim, Primitive):
        raise TypeError(f"prim: expected a primitive (decorate it with @primitive), "
                        f"got {type(prim).__name__}")
    if argnums is None:
        argnums = range(len(vjps))
    for k, f in zip(argnums, vjps):
        if f is not None:
            prim.vjps[k] = f
    return prim


def defvjp_argnum(prim, vjp):
    """Register one VJP ``vjp(argnum, g, ans, *args, **params)`` for every argument."""
    prim.vjp_argnum = vjp
    return prim


def _scalars_to_tensors(items):
    """Python scalars take the dtype of the first floating-point tensor (no float32 promotion)."""
    dtype = None
    for a in items:
        if isinstance(a, Tensor) and a.data.dtype.kind == "f":
            dtype = a.data.dtype
            break
    return [a if isinstance(a, Tensor) else _wrap(np.asarray(a, dtype=dtype)) for a in items]


def as_tensor(value, dtype=None):
    """``value`` as a Tensor (not recorded).  Python scalars take ``dtype`` when given."""
    if value.__class__ is Tensor:
        return value
    if isinstance(value, Tensor):
        return value
    if dtype is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _wrap(np.asarray(value, dtype=dtype))
    return _wrap(np.asarray(value))
