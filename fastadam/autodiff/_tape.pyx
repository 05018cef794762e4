"""Compiled hot path of the tape: recording one operation (fastadam.autodiff).

Design.  The tape's classes stay Python (``_tensor.Tensor`` and ``_tensor.Node`` are
``__slots__`` classes, so the backward walk, written in Python, reads their fields at the
interpreter's specialised slot speed).  What every forward pass pays once per operation is done
here in C instead: the operand checks, the NumPy call and the construction of the output Tensor
and of its Node, whose slots are written directly (their offsets are read from the classes' slot
descriptors once, in ``setup``).  The objects built are the very ones the Python code in
``_registry`` builds (same fields, same values, same tape ids from the same counter); that code
remains the fallback when this module is not compiled, and a test compares the two.
"""
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.weakref cimport PyWeakref_NewRef


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    object PyIter_Next(object)
    object PyNumber_MatrixMultiply(object, object)
    int PyObject_IsTrue(object) except -1

cdef extern from *:
    """
    static PyObject *fa_tape_alloc(PyTypeObject *t) { return t->tp_alloc(t, 0); }
    """
    object fa_tape_alloc(PyTypeObject *t)


# operator codes of make_operator
OP_ADD, OP_SUBTRACT, OP_MULTIPLY, OP_DIVIDE, OP_MATMUL = 0, 1, 2, 3, 4

cdef object Tensor_ = None
cdef object Node_ = None
cdef PyTypeObject *tensor_type = NULL
cdef PyTypeObject *node_type = NULL
cdef object ndarray_ = None
cdef object asarray_ = None
cdef object mode_ = None          # this process's threading.local grad mode
cdef object node_ids_ = None      # the tape's id counter (itertools.count)
cdef object version_of_ = None
cdef object mark_view_ = None
cdef object ZERO = 0

cdef Py_ssize_t T_DATA, T_REQUIRES_GRAD, T_GRAD, T_NODE, T_VERSION, T_BASE
cdef Py_ssize_t N_PRIM, N_INPUTS, N_VERSIONS, N_PARAMS, N_OUT_DATA, N_OUT_REF, N_OUT_VERSION, N_ID


cdef Py_ssize_t _offset(cls, str name) except -1:
    descr = cls.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a __slots__ field")
    return (<PyMemberDescrObject *>descr).d_member.offset


def setup(Tensor, Node, mode, node_ids, version_of, mark_view, ndarray, asarray):
    """Bind this module to the tape's classes and state (called once by ``_tensor``)."""
    global Tensor_, Node_, tensor_type, node_type, mode_, node_ids_, version_of_, mark_view_
    global ndarray_, asarray_
    global T_DATA, T_REQUIRES_GRAD, T_GRAD, T_NODE, T_VERSION, T_BASE
    global N_PRIM, N_INPUTS, N_VERSIONS, N_PARAMS, N_OUT_DATA, N_OUT_REF, N_OUT_VERSION, N_ID
    T_DATA = _offset(Tensor, "data")
    T_REQUIRES_GRAD = _offset(Tensor, "requires_grad")
    T_GRAD = _offset(Tensor, "grad")
    T_NODE = _offset(Tensor, "_node")
    T_VERSION = _offset(Tensor, "_version")
    T_BASE = _offset(Tensor, "_base")
    N_PRIM = _offset(Node, "prim")
    N_INPUTS = _offset(Node, "inputs")
    N_VERSIONS = _offset(Node, "versions")
    N_PARAMS = _offset(Node, "params")
    N_OUT_DATA = _offset(Node, "out_data")
    N_OUT_REF = _offset(Node, "out_ref")
    N_OUT_VERSION = _offset(Node, "out_version")
    N_ID = _offset(Node, "id")
    Tensor_, Node_ = Tensor, Node
    tensor_type, node_type = <PyTypeObject *>Tensor, <PyTypeObject *>Node
    mode_, node_ids_, version_of_, mark_view_ = mode, node_ids, version_of, mark_view
    ndarray_, asarray_ = ndarray, asarray


# ---- slots, read and written in place ------------------------------------------------------

cdef inline PyObject *_peek(object o, Py_ssize_t off) noexcept:
    """The slot's object (borrowed; NULL when never set)."""
    return (<PyObject **>((<char *><PyObject *>o) + off))[0]


cdef inline void _put(object o, Py_ssize_t off, object v) noexcept:
    cdef PyObject **p = <PyObject **>((<char *><PyObject *>o) + off)
    cdef PyObject *old = p[0]
    Py_INCREF(v)
    p[0] = <PyObject *>v
    Py_XDECREF(old)


cdef inline object _tensor(object data, object requires_grad, object node):
    t = fa_tape_alloc(tensor_type)
    _put(t, T_DATA, data)
    _put(t, T_REQUIRES_GRAD, requires_grad)
    _put(t, T_GRAD, None)
    _put(t, T_NODE, node)
    _put(t, T_VERSION, ZERO)
    _put(t, T_BASE, None)
    return t


cdef inline object _node(object prim, tuple inputs, object versions, object params, object out):
    n = fa_tape_alloc(node_type)
    _put(n, N_PRIM, prim)
    _put(n, N_INPUTS, inputs)
    _put(n, N_VERSIONS, versions)
    _put(n, N_PARAMS, params)
    _put(n, N_OUT_DATA, out)
    _put(n, N_OUT_REF, None)
    _put(n, N_OUT_VERSION, ZERO)
    _put(n, N_ID, PyIter_Next(node_ids_))
    return n


cdef inline bint _requires_grad(object t) except -1:
    cdef PyObject *p = _peek(t, T_REQUIRES_GRAD)
    if p == <PyObject *>True:
        return True
    if p == <PyObject *>False or p == NULL:
        return False
    return PyObject_IsTrue(<object>p)


cdef inline bint _plain(object t) noexcept:
    """A fully built Tensor at version 0 that is not a view (the common case)."""
    return _peek(t, T_VERSION) == <PyObject *>ZERO and _peek(t, T_BASE) == <PyObject *>None \
        and _peek(t, T_DATA) != NULL


def wrap(data, requires_grad=False, node=None):
    """Fast Tensor constructor: no validation (``data`` is already an ndarray)."""
    return _tensor(data, requires_grad, node)


# ---- recording ------------------------------------------------------------------------------

cdef object _binary(int op, object prim, object fun, object a, object b):
    if type(a) is not Tensor_ or type(b) is not Tensor_ or not _plain(a) or not _plain(b):
        return prim(a, b)
    ad = <object>_peek(a, T_DATA)
    bd = <object>_peek(b, T_DATA)
    if type(ad) is ndarray_ and type(bd) is ndarray_:
        # the ndarray operators are NumPy's ufunc calls (the bare ``a * b`` the overhead
        # goal compares with)
        if op == 0:
            out = ad + bd
        elif op == 1:
            out = ad - bd
        elif op == 2:
            out = ad * bd
        elif op == 3:
            out = ad / bd
        else:
            out = PyNumber_MatrixMultiply(ad, bd)
    else:
        out = fun(ad, bd)
    if type(out) is not ndarray_:  # NumPy returns scalars for 0-d results
        out = asarray_(out)
    if (_requires_grad(a) or _requires_grad(b)) and mode_.enabled:
        node = _node(prim, (a, b), None, {}, out)
        t = _tensor(out, True, node)
        _put(node, N_OUT_REF, PyWeakref_NewRef(t, None))
        return t
    return _tensor(out, False, None)


def make_operator(int op, prim):
    """``prim(a, b)`` as a Tensor operator method; ``op`` one of the ``OP_*`` codes (it must
    name the NumPy function of ``prim``: add, subtract, multiply, divide or matmul)."""
    if not 0 <= op <= 4:
        raise ValueError(f"op: expected one of the OP_* codes 0..4, got {op}")
    fun = prim.fun

    def operator(a, b):
        return _binary(op, prim, fun, a, b)
    operator.__name__ = prim.name
    return operator


def primitive_call(self, *args, **params):
    """``Primitive.__call__``: apply the primitive to Tensors, recording a node when one of them
    requires gradients and grad mode is on (anything but Tensors: ``self._call_converting``)."""
    cdef bint need = False, versioned = False
    cdef Py_ssize_t n = len(args)
    for a in args:
        if type(a) is not Tensor_ or _peek(a, T_DATA) == NULL:
            return self._call_converting(args, params)
        if not need and _requires_grad(a):
            need = True
        if not _plain(a):
            versioned = True
    fun = self.fun
    if n == 1:
        out = fun(<object>_peek(args[0], T_DATA), **params)
    elif n == 2:
        out = fun(<object>_peek(args[0], T_DATA), <object>_peek(args[1], T_DATA), **params)
    else:
        out = fun(*[<object>_peek(a, T_DATA) for a in args], **params)
    if type(out) is not ndarray_:
        out = asarray_(out)
    view = self.view
    if need and mode_.enabled:
        versions = tuple([version_of_(a) for a in args]) if versioned else None
        node = _node(self, args, versions, params, out)
        t = _tensor(out, True, node)
        _put(node, N_OUT_REF, PyWeakref_NewRef(t, None))
        if view:
            mark_view_(t, args[0])
            _put(node, N_OUT_VERSION, version_of_(t))
        return t
    t = _tensor(out, False, None)
    if view:
        mark_view_(t, args[0])
    return t
