"""``Tensor``, tape nodes and the grad-mode switch of fastadam's reverse-mode engine.

Design (HIPS autograd's, with PyTorch's bookkeeping):

* A ``Tensor`` wraps one ndarray.  It is lean on purpose (``__slots__``, no per-op allocation
  besides the output array, the Tensor and, when recording, one ``Node``).
* Applying a primitive to tensors of which one ``requires_grad`` while grad mode is on appends a
  ``Node`` to the tape: the primitive, its tensor inputs, their version numbers, its keyword
  parameters and the output array.  Nodes are numbered in creation order, so the reverse of that
  order is a topological order of the graph: the backward walk is a sort, never a recursion.
* Every in-place operation on a Tensor (``+=``, ``-=``, ``*=``, ``/=``, ``t[i] = v``) bumps its
  version counter.  A node remembers the versions of what it saved and the backward walk refuses
  to use a tensor that changed since (PyTorch's rule).  Writes through the raw ``.data`` array
  are not seen: that is the escape hatch for optimizers, exactly like ``torch.Tensor.data``.
* Views share one version counter: a tensor made by a view primitive (``reshape``,
  ``transpose``, basic ``getitem``, ``broadcast_to``) or by ``detach()`` whose array is a view of
  its input's array has ``_base`` set to the tensor that owns the counter, and reads and bumps
  that one (``version_of``, ``bump_version``).  ``r = reshape(s); r += 1`` is therefore seen as
  a change of ``s`` and the reverse.
* The grad mode is per thread (``_mode``, a ``threading.local``), as in PyTorch: ``no_grad`` and
  the backward walk (which records only under ``create_graph``) never change other threads'
  mode.  A new thread starts with recording on.
"""
import itertools
import threading

import numpy as np


class _GradMode(threading.local):
    enabled = True  # class attribute: the value every new thread starts with


_mode = _GradMode()
_node_ids = itertools.count()


def __getattr__(name):
    # read-only compatibility: code written against the former module-global flag
    if name == "_grad_enabled":
        return _mode.enabled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_grad_enabled():
    """True when operations on tensors that require gradients are recorded (this thread)."""
    return _mode.enabled


def set_grad_enabled(mode):
    """Turn recording on or off for the calling thread; returns its previous mode."""
    m = _mode
    previous = m.enabled
    m.enabled = bool(mode)
    return previous


def version_of(t):
    """The version counter of ``t`` (its base's when ``t`` is a view)."""
    b = t._base
    return t._version if b is None else b._version


def bump_version(t):
    b = t._base
    if b is None:
        t._version += 1
    else:
        b._version += 1


def _root_array(a):
    while True:
        b = a.base
        if not isinstance(b, np.ndarray):
            return a
        a = b


def mark_view(out, of):
    """Make Tensor ``out`` share the version counter of ``of`` when its array views of's array."""
    data = out.data
    if data.base is None:
        return
    if _root_array(data) is _root_array(of.data):
        b = of._base
        out._base = of if b is None else b


class no_grad:
    """Context manager (and decorator) under which nothing is recorded on the tape."""

    __slots__ = ("_previous",)

    def __enter__(self):
        self._previous = set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._previous)
        return False

    def __call__(self, func):
        def wrapper(*args, **kwargs):
            with no_grad():
                return func(*args, **kwargs)
        wrapper.__name__ = getattr(func, "__name__", "wrapper")
        wrapper.__doc__ = getattr(func, "__doc__", None)
        return wrapper


class Node:
    """One recorded primitive application (one entry of the tape).

    ``inputs``: the tensor arguments, in order; ``versions``: their version numbers when recorded
    (None when all were 0);
    ``params``: keyword parameters (non-differentiable); ``out_data``: the output array;
    ``out_ref``: a weak reference to the output Tensor (no reference cycle); ``out_version``:
    its version when recorded (not 0 only for a view of a tensor changed before); ``id``:
    position on the tape.  ``inputs is None`` once freed.
    """

    __slots__ = ("prim", "inputs", "versions", "params", "out_data", "out_ref", "out_version",
                 "id")

    def __init__(self, prim, inputs, params, out_data, versioned=True):
        self.prim = prim
        self.inputs = inputs
        # versions only increase: when they are all 0 (the common case) store None, meaning
        # "every input was at version 0", instead of a tuple
        self.versions = tuple([version_of(t) for t in inputs]) if versioned else None
        self.params = params
        self.out_data = out_data
        self.out_ref = None
        self.out_version = 0
        self.id = next(_node_ids)

    def output(self):
        """The output Tensor (re-wrapped around ``out_data`` if the user dropped it)."""
        ref = self.out_ref
        t = ref() if ref is not None else None
        if t is None:
            t = _wrap(self.out_data, True, self)
        return t

    def __repr__(self):
        state = "freed" if self.inputs is None else f"{len(self.inputs)} inputs"
        return f"<Node {self.prim.name} #{self.id} ({state})>"


def _wrap(data, requires_grad=False, node=None):
    """Fast constructor: no validation (``data`` is already an ndarray of a valid dtype)."""
    t = _new(Tensor)
    t.data = data
    t.requires_grad = requires_grad
    t.grad = None
    t._node = node
    t._version = 0
    t._base = None
    return t


_new = object.__new__


def _check_differentiable_dtype(dtype, what):
    if dtype.kind not in "fc":
        raise TypeError(f"{what}: integer and boolean tensors are not differentiable "
                        f"(dtype {dtype}); only floating-point tensors can require gradients")


class Tensor:
    """An ndarray that records the operations applied to it for reverse-mode differentiation.

    Parameters
    ----------
    data : array_like
        Copied only if it is not already an ndarray (``np.asarray``); Python floats become float64.
    requires_grad : bool
        Whether operations on this tensor are recorded.  Only floating-point tensors may require
        gradients; integer tensors (labels, indices) are non-differentiable.

    Notes
    -----
    ``+ - * / ** @``, unary ``-`` and ``t[index]`` are recorded primitives; ``< <= > >=`` give
    non-differentiable boolean tensors (masks); ``==`` is identity (tensors are hashable, as the
    tape needs).  NumPy functions do not accept Tensors (``__array_ufunc__ = None``): use the
    functions of ``fastadam.autodiff``, or ``.data`` for the raw array.  The grad mode
    (``no_grad``) is per thread.  Views (``reshape``, ``transpose``, basic indexing,
    ``detach``) share their base's version counter.
    """

    __slots__ = ("data", "requires_grad", "grad", "_node", "_version", "_base", "__weakref__")
    __array_priority__ = 1000
    __array_ufunc__ = None  # ndarray <op> Tensor defers to Tensor's reflected operator

    def __init__(self, data, requires_grad=False):
        if isinstance(data, Tensor):
            data = data.data
        data = np.asarray(data)
        if requires_grad:
            _check_differentiable_dtype(data.dtype, "requires_grad")
        self.data = data
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._node = None
        self._version = 0
        self._base = None

    # ---- array-like attributes ------------------------------------------------------------
    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def size(self):
        return self.data.size

    @property
    def is_leaf(self):
        """True for tensors not produced by a recorded operation."""
        return self._node is None

    def __len__(self):
        return len(self.data)

    def numpy(self):
        """The underlying ndarray (not a copy)."""
        return self.data

    def item(self):
        return self.data.item()

    def __array__(self, dtype=None, copy=None):
        if dtype is None:
            return self.data
        return self.data.astype(dtype)

    def __float__(self):
        return float(self.data)

    def detach(self):
        """A new leaf sharing this tensor's data (and its version counter), not recorded."""
        t = _wrap(self.data)
        b = self._base
        t._base = self if b is None else b
        return t

    def requires_grad_(self, mode=True):
        if mode:
            _check_differentiable_dtype(self.data.dtype, "requires_grad")
        self.requires_grad = bool(mode)
        return self

    def __repr__(self):
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self._node is not None:
            extra += f", op={self._node.prim.name}"
        return f"Tensor({np.array2string(self.data, threshold=20)}, dtype={self.data.dtype}{extra})"

    __hash__ = object.__hash__

    # ---- in-place updates: not recorded, bump the version counter --------------------------
    def __iadd__(self, other):
        self.data += other.data if isinstance(other, Tensor) else other
        bump_version(self)
        return self

    def __isub__(self, other):
        self.data -= other.data if isinstance(other, Tensor) else other
        bump_version(self)
        return self

    def __imul__(self, other):
        self.data *= other.data if isinstance(other, Tensor) else other
        bump_version(self)
        return self

    def __itruediv__(self, other):
        self.data /= other.data if isinstance(other, Tensor) else other
        bump_version(self)
        return self

    def __setitem__(self, index, value):
        self.data[index] = value.data if isinstance(value, Tensor) else value
        bump_version(self)

    def zero_grad(self):
        self.grad = None

    def mark_dirty(self):
        """Record that ``self.data`` was changed in place outside the engine (an optimizer
        step): a recorded operation that saved this tensor then refuses to differentiate
        through its old values, as after ``t -= ...``."""
        bump_version(self)


# The compiled recording path (``_tape``, built from _tape.pyx) writes Tensor and Node slots
# directly; without a build the Python code of this module and of ``_registry`` runs instead.
try:
    from . import _tape
except ImportError:  # pragma: no cover - source tree without a build
    _tape = None
else:
    _tape.setup(Tensor, Node, _mode, _node_ids, version_of, mark_view, np.ndarray, np.asarray)
    _wrap_python = _wrap
    _wrap = _tape.wrap
