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


# ---- the backward walk ----------------------------------------------------------------------
# ``_engine._run`` line for line (see its docstring for the four steps), reading the Tensor and
# Node slots in place; the rare cases (changed versions, freed graphs, shape or dtype fixes, a
# second contribution to a cotangent) call the very helpers of ``_engine``.

cdef object IndexedSlices_ = None
cdef object check_versions_ = None
cdef object check_output_version_ = None
cdef object accumulate_ = None
cdef object conform_ = None
cdef object freed_error_ = None
cdef object node_id_ = None


def setup_walk(IndexedSlices, check_versions, check_output_version, accumulate, conform,
               freed_error, node_id):
    """Bind the walk to ``_engine``'s helpers (called once by ``_engine``)."""
    global IndexedSlices_, check_versions_, check_output_version_, accumulate_, conform_
    global freed_error_, node_id_
    IndexedSlices_, check_versions_, check_output_version_ = IndexedSlices, check_versions, \
        check_output_version
    accumulate_, conform_, freed_error_, node_id_ = accumulate, conform, freed_error, node_id


cdef inline object _field(object o, Py_ssize_t off):
    cdef PyObject *p = _peek(o, off)
    if p == NULL:
        raise AttributeError(f"{type(o).__name__} object has an unset field")
    return <object>p


cdef inline object _key_of(object t):
    """The cotangent key of a tensor: its node, or the tensor itself for a leaf."""
    n = _field(t, T_NODE)
    return t if n is None else n


def run(y, dict keys_x, keys_z, seed, bint create_graph, bint retain_graph):
    """``_engine._run``: the walk shared by ``gradient`` and ``backward``."""
    cdef Py_ssize_t k, i
    cdef list order, idx
    cdef dict grads, wanted
    cdef tuple inputs
    ynode = _field(y, T_NODE)
    ykey = y if ynode is None else ynode
    grads = {ykey: seed}
    if ynode is None or ykey in keys_x or ykey in keys_z:
        return grads
    stop = keys_x.keys() | keys_z if keys_z else keys_x
    # 1. reachable nodes
    order = [ynode]
    seen = {ynode}
    k = 0
    while k < len(order):
        node = order[k]
        k += 1
        ins = _field(node, N_INPUTS)
        if ins is None:
            raise freed_error_(node)
        for t in <tuple>ins:
            n = _field(t, T_NODE)
            if n is not None and n not in seen and n not in stop:
                seen.add(n)
                order.append(n)
    if len(order) > 1:
        order.sort(key=node_id_)
    # 2. relevance
    wanted = {}
    for node in order:
        idx = None
        i = 0
        for t in <tuple>_field(node, N_INPUTS):
            kk = _key_of(t)
            if kk in keys_x or (kk in wanted and kk not in keys_z):
                if idx is None:
                    idx = [i]
                else:
                    idx.append(i)
            i += 1
        if idx is not None:
            wanted[node] = idx
    # 3. reverse walk (records only under create_graph)
    owned = set()
    mode = mode_
    previous = mode.enabled
    mode.enabled = create_graph
    try:
        for node in reversed(order):
            idx = wanted.get(node)
            if idx is None:
                continue
            g = grads.pop(node, None)
            if g is None:
                continue
            inputs = _field(node, N_INPUTS)
            if _field(node, N_VERSIONS) is None:
                for t in inputs:
                    if not _plain(t):
                        check_versions_(node)
                        break
            else:
                check_versions_(node)
            ref = _field(node, N_OUT_REF)
            ans = ref() if ref is not None else None
            if ans is None:
                ans = node.output()
            elif not _plain(ans):
                check_versions_(node)
                check_output_version_(node, ans)
            if type(g) is IndexedSlices_:
                g = _tensor(g.to_dense(), False, None)
            prim = _field(node, N_PRIM)
            params = _field(node, N_PARAMS)
            vjps = prim.vjps
            for i in idx:
                t = inputs[i]
                f = vjps.get(i) or prim.vjp(i)
                gi = f(g, ans, *inputs, **params)
                if gi is None:
                    continue
                td = _field(t, T_DATA)
                if type(gi) is Tensor_:
                    gd = _field(gi, T_DATA)
                    gdt = gd.dtype
                    tdt = td.dtype
                    if gd.shape != td.shape or (gdt is not tdt and gdt != tdt):
                        gi = conform_(gi, gd.shape, gdt, td, prim, i)
                else:
                    gi = conform_(gi, gi.shape, gi.dtype, td, prim, i)
                kk = _key_of(t)
                if kk in grads:
                    accumulate_(grads, owned, kk, gi, create_graph)
                else:
                    grads[kk] = gi
    finally:
        mode.enabled = previous
    if not (retain_graph or create_graph):
        for node in order:
            _put(node, N_INPUTS, None)
            _put(node, N_PARAMS, None)
            _put(node, N_OUT_DATA, None)
    return grads
