"""Every array check of fastadam (dense steps, sparse gradients, optimizer parameters): all of
them run before any kernel writes.

A failed check raises TypeError / ValueError naming the argument (``x``, or ``m[3]`` inside a
list), what was expected and what was received.  Written in Cython because a multi-tensor step
checks four arrays per tensor and the per-array cost must stay far below a microsecond.
"""
import weakref

import numpy as np
cimport numpy as cnp
from libc.stdint cimport uintptr_t
from libc.stdlib cimport malloc, free, qsort
from libc.math cimport signbit
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject

cnp.import_array()

FLOAT_TYPES = {cnp.NPY_FLOAT16: "float16", cnp.NPY_FLOAT: "float32", cnp.NPY_DOUBLE: "float64"}


cdef str label(str name, Py_ssize_t i, bint single):
    return name if single else f"{name}[{i}]"


cpdef tuple as_array_list(obj, str name):
    """Return (list_of_objects, single): an ndarray becomes a one-element list."""
    if isinstance(obj, cnp.ndarray):
        return [obj], True
    if isinstance(obj, (list, tuple)):
        return list(obj), False
    raise TypeError(f"{name}: expected a numpy.ndarray or a list of them, "
                    f"got {type(obj).__name__}")


cdef inline str describe_dtype(cnp.ndarray a):
    return str(a.dtype)


cpdef check_array(object a, str name, int typenum=-1, object shape=None, bint writable=False,
                  bint contiguous=True, bint floating=True):
    """Check one array; returns it.  typenum=-1 accepts any supported float dtype."""
    cdef cnp.ndarray arr
    if not isinstance(a, cnp.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(a).__name__}")
    arr = <cnp.ndarray>a
    cdef int t = cnp.PyArray_TYPE(arr)
    if floating and t not in FLOAT_TYPES:
        raise TypeError(f"{name}: expected float16, float32 or float64, "
                        f"got {describe_dtype(arr)}")
    if typenum >= 0 and t != typenum:
        raise TypeError(f"{name}: expected dtype {cnp.PyArray_DescrFromType(typenum)}, "
                        f"got {describe_dtype(arr)}")
    if not cnp.PyArray_ISNOTSWAPPED(arr) or not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name}: expected an aligned array in native byte order")
    if shape is not None and (<object>arr).shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {(<object>arr).shape}")
    if contiguous and not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name}: expected a C-contiguous array (np.ascontiguousarray makes "
                         f"one), got strides {(<object>arr).strides}")
    if writable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name}: is read-only, but it is updated in place")
    return arr


def plain_gradients(list grads, list arrays):
    """True if ``grads[i]`` is an exact ndarray, C-contiguous, of ``arrays[i]``'s dtype and
    shape for every i (equal lengths assumed): the gradients an optimizer object's single-call
    path takes without a second look.  Reads only the array headers (no data, no exception)."""
    cdef Py_ssize_t i, d, n = len(grads)
    cdef object go, xo
    cdef cnp.ndarray g, x
    if len(arrays) != n:
        return False
    for i in range(n):
        go = grads[i]
        xo = arrays[i]
        if type(go) is not cnp.ndarray or type(xo) is not cnp.ndarray:
            return False
        g = <cnp.ndarray>go
        x = <cnp.ndarray>xo
        if (cnp.PyArray_TYPE(g) != cnp.PyArray_TYPE(x) or cnp.PyArray_NDIM(g) != cnp.PyArray_NDIM(x)
                or not cnp.PyArray_IS_C_CONTIGUOUS(g)
                or not cnp.PyArray_ISNOTSWAPPED(g)):
            return False
        for d in range(cnp.PyArray_NDIM(g)):
            if cnp.PyArray_DIM(g, d) != cnp.PyArray_DIM(x, d):
                return False
    return True


def all_ndarrays(obj):
    """True if ``obj`` is a list or tuple whose items are all exact ``numpy.ndarray``s."""
    cdef Py_ssize_t i, n
    if type(obj) is list:
        n = len(<list>obj)
        for i in range(n):
            if type((<list>obj)[i]) is not cnp.ndarray:
                return False
        return True
    if type(obj) is tuple:
        n = len(<tuple>obj)
        for i in range(n):
            if type((<tuple>obj)[i]) is not cnp.ndarray:
                return False
        return True
    return False


cdef inline bint plain_array(object a, int typenum, bint writable):
    """What check_array(a, ..., typenum, None, writable) accepts, for the common case (an
    exact ndarray), read from the header alone; False sends the caller to check_array, which
    raises with the label (or accepts an ndarray subclass)."""
    cdef cnp.ndarray arr
    if type(a) is not cnp.ndarray:
        return False
    arr = <cnp.ndarray>a
    return (cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_ISALIGNED(arr)
            and (not writable or cnp.PyArray_ISWRITEABLE(arr)))


cdef inline bint plain_like(object a, int typenum, cnp.ndarray ref, bint writable):
    """plain_array, and of ``ref``'s shape."""
    cdef int d, nd
    if not plain_array(a, typenum, writable):
        return False
    nd = cnp.PyArray_NDIM(<cnp.ndarray>a)
    if nd != cnp.PyArray_NDIM(ref):
        return False
    for d in range(nd):
        if cnp.PyArray_DIM(<cnp.ndarray>a, d) != cnp.PyArray_DIM(ref, d):
            return False
    return True


cdef enum:
    SMALL_STEP_BUFFERS = 16


cdef inline bint small_step_member(object a, int t, cnp.ndarray ref, bint writable,
                                   uintptr_t *lo, Py_ssize_t *n):
    """plain_like(a, t, ref, writable), recording a's start address at lo[n[0]++]."""
    if not plain_like(a, t, ref, writable):
        return False
    lo[n[0]] = <uintptr_t>cnp.PyArray_DATA(<cnp.ndarray>a)
    n[0] += 1
    return True


cdef object plain_small_step(object x, object g, list slots):
    """check_step_arrays' common small case read from the headers alone: one ndarray each, or
    lists (exact lists) of the same length of at most SMALL_STEP_BUFFERS arrays in all; every
    array an exact ndarray that plain_like the parameter it belongs to accepts (one float dtype,
    its shape, C-contiguous, aligned, native; written ones writable), and no two non-empty
    buffers overlapping (stricter than check_disjoint, which lets two gradients share).  Returns
    check_step_arrays' result, or None to send the caller to the full checks, which raise with
    the label or accept what this does not look at (subclasses, tuples, many tensors)."""
    cdef Py_ssize_t i, k, j, q, n = 0, count, nslots = len(slots)
    cdef uintptr_t lo[SMALL_STEP_BUFFERS]
    cdef uintptr_t hi[SMALL_STEP_BUFFERS]
    cdef cnp.ndarray xa
    cdef uintptr_t nbytes
    cdef int t = -1
    cdef bint single = type(x) is cnp.ndarray
    for q in range(nslots):
        pair = slots[q]
        if type(pair) is not tuple or len(<tuple>pair) != 2:
            return None
    if single:
        count = 1
    elif type(x) is list and type(g) is list and len(<list>x) == len(<list>g):
        count = len(<list>x)
    else:
        return None
    if count == 0 or count * (2 + nslots) > SMALL_STEP_BUFFERS:
        return None
    if not single:
        for q in range(nslots):
            s = (<tuple>slots[q])[1]
            if type(s) is not list or len(<list>s) != count:
                return None
    for i in range(count):
        xo = x if single else (<list>x)[i]
        if type(xo) is not cnp.ndarray:
            return None
        xa = <cnp.ndarray>xo
        if t < 0:
            t = cnp.PyArray_TYPE(xa)
            if t != cnp.NPY_FLOAT and t != cnp.NPY_DOUBLE and t != cnp.NPY_FLOAT16:
                return None
        if not small_step_member(xo, t, xa, True, lo, &n):
            return None
        if not small_step_member(g if single else (<list>g)[i], t, xa, False, lo, &n):
            return None
        for q in range(nslots):
            s = (<tuple>slots[q])[1]
            if not small_step_member(s if single else (<list>s)[i], t, xa, True, lo, &n):
                return None
        nbytes = <uintptr_t>cnp.PyArray_NBYTES(xa)  # the tensor's arrays all have its size
        for k in range(n - 2 - nslots, n):
            hi[k] = lo[k] + nbytes  # empty: [lo, lo), inside another buffer: full checks
    for k in range(n):
        for j in range(k + 1, n):
            if lo[k] < hi[j] and lo[j] < hi[k]:
                return None
    if single:
        return [x], [g], [[(<tuple>pair)[1]] for pair in slots], t
    return list(x), list(g), [list((<tuple>pair)[1]) for pair in slots], t


def check_step_arrays(x, g, list slots):
    """Validate a dense step's arrays: ndarrays, or equal-length lists of ndarrays.

    ``slots`` lists the optimizer's state arguments as (name, ndarray or list) pairs, in slot
    order (Adam: m, v[, v_max]; Adagrad: h; Momentum: v).  Returns (xs, gs, slot_lists,
    typenum).  x and every slot are C-contiguous, writable, of one float dtype and of x[i]'s
    shape; g likewise but read-only is fine.  No two written buffers overlap and g overlaps none
    of them.
    """
    cdef Py_ssize_t n, i, q, nslots = len(slots)
    cdef int typenum = -1
    cdef cnp.ndarray xi
    fast = plain_small_step(x, g, slots)
    if fast is not None:
        return fast
    if isinstance(x, cnp.ndarray) and isinstance(g, cnp.ndarray) and all(
            isinstance(a, cnp.ndarray) for _, a in slots):
        # One tensor per argument: the common case, without the lists.
        xi = check_array(x, "x", -1, None, True)
        typenum = cnp.PyArray_TYPE(xi)
        shape = (<object>xi).shape
        check_array(g, "g", typenum, shape, False)
        groups = [("x", [x], True), ("g", [g], False)]
        for name, a in slots:
            check_array(a, name, typenum, shape, True)
            groups.append((name, [a], True))
        check_disjoint(groups, True)
        return [x], [g], [[a] for _, a in slots], typenum
    xs, single = as_array_list(x, "x")
    gs, single_g = as_array_list(g, "g")
    if single_g != single:
        raise TypeError(f"x, g, {', '.join(name for name, _ in slots)}: pass either one ndarray "
                        f"each or a list of ndarrays each")
    n = len(xs)
    if len(gs) != n:
        raise ValueError(f"g: expected a list of {n} arrays like x, got {len(gs)}")
    slot_lists = []
    for name, obj in slots:
        lst, single_s = as_array_list(obj, name)
        if single_s != single:
            raise TypeError(f"x, g, {', '.join(nm for nm, _ in slots)}: pass either one ndarray "
                            f"each or a list of ndarrays each")
        if len(lst) != n:
            raise ValueError(f"{name}: expected a list of {n} arrays like x, got {len(lst)}")
        slot_lists.append(lst)
    if n == 0:
        return xs, gs, slot_lists, cnp.NPY_FLOAT
    for i in range(n):
        # the labels are formatted only when a check fails (check_array raises with them)
        if typenum >= 0 and plain_array(xs[i], typenum, True):
            xi = <cnp.ndarray>xs[i]
        else:
            xi = check_array(xs[i], label("x", i, single), typenum, None, True)
            typenum = cnp.PyArray_TYPE(xi)
        if not plain_like(gs[i], typenum, xi, False):
            check_array(gs[i], label("g", i, single), typenum, (<object>xi).shape, False)
        for q in range(nslots):
            if not plain_like((<list>slot_lists[q])[i], typenum, xi, True):
                check_array((<list>slot_lists[q])[i], label(slots[q][0], i, single), typenum,
                            (<object>xi).shape, True)
    groups = [("x", xs, True), ("g", gs, False)]
    for q in range(nslots):
        groups.append((slots[q][0], slot_lists[q], True))
    check_disjoint(groups, single)
    return xs, gs, slot_lists, typenum


# ---- sparse gradients: indices and rows ---------------------------------------------------

INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))
ROW_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_indices(indices, name, n_rows, unit="rows"):
    """A private, contiguous, native-order copy of a 1-D int32/int64 array, checked to lie in
    [0, n_rows).  The copy is what the kernels read (the caller's array is read once)."""
    if not isinstance(indices, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of int32 or int64, "
                        f"got {type(indices).__name__}")
    if indices.dtype not in INDEX_TYPES:
        raise TypeError(f"{name}: expected int32 or int64 indices, got {indices.dtype}")
    if indices.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {indices.shape}")
    indices = np.array(indices, dtype=indices.dtype.newbyteorder("="), order="C", copy=True)
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0:
            raise IndexError(f"{name}: negative index {lo}; negative indices are not allowed "
                             f"(no wrap-around, as in TensorFlow and torch.sparse)")
        if n_rows is not None and hi >= n_rows:
            raise IndexError(f"{name}: index {hi} is out of range for {n_rows} {unit}")
    return indices


def check_rows(values, name, k, row_shape, dtype, xp=np):
    """A float array of shape (k,) + row_shape (contiguous copy if needed: it is only read).
    ``xp`` is the array module (NumPy, or CuPy for the GPU path, which checks the device)."""
    if not isinstance(values, xp.ndarray):
        raise TypeError(f"{name}: expected a {xp.__name__}.ndarray, got {type(values).__name__}")
    if dtype is None:
        if values.dtype not in ROW_TYPES:
            raise TypeError(f"{name}: expected float32 or float64, got {values.dtype}")
    elif values.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the dtype of x), got {values.dtype}")
    expected = (k,) + tuple(row_shape)
    if values.shape != expected:
        raise ValueError(f"{name}: expected shape {expected}, got {values.shape}")
    values = xp.ascontiguousarray(values)
    if values.dtype.byteorder not in "=|":
        values = values.astype(values.dtype.newbyteorder("="))
    return values


def check_parameter_list(params):
    """Validate an optimizer's parameter list: writable, C-contiguous float arrays of one dtype,
    no two sharing memory.  Returns the list."""
    xs, single = as_array_list(params, "params")
    cdef int typenum = -1
    for i in range(len(xs)):
        xi = check_array(xs[i], label("params", i, single), typenum, None, True)
        typenum = cnp.PyArray_TYPE(xi)
    check_disjoint([("params", xs, True)], single)
    return xs


cdef struct Interval:
    uintptr_t lo
    uintptr_t hi
    Py_ssize_t group
    Py_ssize_t index
    int written


cdef int compare_intervals(const void *a, const void *b) noexcept nogil:
    cdef uintptr_t la = (<const Interval *>a).lo, lb = (<const Interval *>b).lo
    return -1 if la < lb else (1 if la > lb else 0)


def check_disjoint(list groups, bint single=False):
    """Reject overlapping memory: groups is a list of (name, list_of_arrays, written).

    Two buffers may share memory only if neither is written.  Sort by start address and sweep:
    O(k log k) for k arrays, so a 1000-tensor step costs microseconds, not a quadratic scan.
    """
    cdef Py_ssize_t k = 0, gi, i, count = 0
    for _, lst, _ in groups:
        count += len(lst)
    if count < 2:
        return
    cdef Interval *iv = <Interval *>malloc(count * sizeof(Interval))
    if iv == NULL:
        raise MemoryError()
    cdef cnp.ndarray a
    cdef uintptr_t lo
    cdef Interval cur, best_any, best_written
    cdef int have_any = 0, have_written = 0
    try:
        for gi in range(len(groups)):
            name, lst, written = groups[gi]
            for i in range(len(lst)):
                a = <cnp.ndarray>lst[i]
                if cnp.PyArray_NBYTES(a) == 0:
                    continue
                lo = <uintptr_t>cnp.PyArray_DATA(a)
                iv[k].lo = lo
                iv[k].hi = lo + <uintptr_t>cnp.PyArray_NBYTES(a)
                iv[k].group = gi
                iv[k].index = i
                iv[k].written = 1 if written else 0
                k += 1
        qsort(iv, k, sizeof(Interval), compare_intervals)
        for i in range(k):
            cur = iv[i]
            if cur.written and have_any and cur.lo < best_any.hi:
                _raise_overlap(groups, best_any, cur, single)
            if not cur.written and have_written and cur.lo < best_written.hi:
                _raise_overlap(groups, best_written, cur, single)
            if not have_any or cur.hi > best_any.hi:
                best_any = cur
                have_any = 1
            if cur.written and (not have_written or cur.hi > best_written.hi):
                best_written = cur
                have_written = 1
    finally:
        free(iv)


cdef _raise_overlap(list groups, Interval a, Interval b, bint single):
    la = label(groups[a.group][0], a.index, single)
    lb = label(groups[b.group][0], b.index, single)
    if a.group == b.group and a.index == b.index:
        lb = "itself"
    raise ValueError(f"{la} and {lb} share memory; arrays that are updated in place must not "
                     f"overlap each other or the gradient")


# ---- prepared steps: what is checked on every step --------------------------------------------

cdef inline bint plain_scalar(object v):
    """A value whose equality says everything about it: exact float, int, bool, str or None
    (not a subclass, not an array: a 0-d array can change in place)."""
    cdef type tp = type(v)
    return tp is float or tp is int or tp is bool or tp is str or v is None


def cacheable_scalars(dict hyper):
    """True if every value of ``hyper`` is a plain scalar (exact float, int, bool, str or
    None): then :func:`same_scalars` can tell whether a later set equals it."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    while PyDict_Next(hyper, &pos, &key, &value):
        if not plain_scalar(<object>value):
            return False
    return True


def same_scalars(dict hyper, dict cached):
    """True if ``hyper`` has the keys of ``cached`` (a set that passed
    :func:`cacheable_scalars`) with values of the same exact types and equal values, the sign
    of a float zero included: a fold of one gives the bits of a fold of the other."""
    if len(hyper) != len(cached):
        return False
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef PyObject *other
    cdef object a, b
    while PyDict_Next(hyper, &pos, &key, &value):
        other = PyDict_GetItem(cached, <object>key)
        if other == NULL:
            return False
        a = <object>value
        b = <object>other
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        if type(a) is float:
            if <double>a != <double>b or signbit(<double>a) != signbit(<double>b):
                return False
        elif not plain_scalar(a) or a != b:
            return False
    return True


# NumPy's header accessors on a borrowed array pointer (no reference counting in the per-step
# loops below; the arrays are kept alive by the lists that hold them)
cdef extern from "numpy/arrayobject.h":
    int raw_flags "PyArray_FLAGS"(cnp.PyArrayObject *a) nogil
    void *raw_data "PyArray_DATA"(cnp.PyArrayObject *a) nogil
    int raw_ndim "PyArray_NDIM"(cnp.PyArrayObject *a) nogil
    cnp.npy_intp *raw_dims "PyArray_DIMS"(cnp.PyArrayObject *a) nogil
    int raw_type "PyArray_TYPE"(cnp.PyArrayObject *a) nogil
    bint raw_notswapped "PyArray_ISNOTSWAPPED"(cnp.PyArrayObject *a) nogil
    void *raw_descr "PyArray_DESCR"(cnp.PyArrayObject *a) nogil

cdef extern from "Python.h":
    PyObject *PyList_GET_ITEM(PyObject *lst, Py_ssize_t i) nogil
    void *Py_TYPE(PyObject *o) nogil

cdef void *NDARRAY_TYPE = <void *>cnp.ndarray
cdef int PLAIN_GRAD = (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED)
# what a written array keeps from its preparation to every step (with its dtype, element count
# and data pointer)
cdef int PLAIN_WRITTEN = (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED
                          | cnp.NPY_ARRAY_WRITEABLE)


cdef inline cnp.npy_intp raw_size(cnp.PyArrayObject *a) noexcept:
    # the element count from the header (PyArray_SIZE without the call through NumPy's table)
    cdef int d, nd = raw_ndim(a)
    cdef cnp.npy_intp *dims = raw_dims(a)
    cdef cnp.npy_intp size = 1
    for d in range(nd):
        size *= dims[d]
    return size


cdef class PreparedArrays:
    """The arrays of a prepared dense step (fastadam/optim/_prepared.py), checked once by
    the caller (types, dtype, shapes, contiguity, writability, no two written buffers
    overlapping), and what every step still checks in one pass: the gradients (exact dtype,
    shape and layout; none overlapping a written array, by a binary search in the written
    buffers sorted once) and that each written array still has the header it was prepared
    with: dtype, element count, data pointer, C-contiguous, aligned, native byte order and
    writable (an in-place ``x.dtype = np.float16`` on a float32 array doubles its element count
    over the same bytes; ``x.flags.writeable = False`` or a read-only view swapped in is
    refused).  Each written array may have its own dtype (a low-precision step's uint8 codes,
    float32 scales, bfloat16 states).  It keeps a weak reference to each written array, so
    NumPy refuses to resize one while the step lives (``ndarray.resize`` refuses an array with
    weak references, ``refcheck`` or not): the buffer's size cannot change under the step."""

    cdef list written        # [(name, list of arrays, True), ...]: the labels of messages
    cdef list flat           # every written array
    cdef list flat_labels    # (name, index) of each, formatted only for an error
    cdef list pins           # a weak reference to each written array: NumPy then refuses
                             # to resize it (ndarray.resize, refcheck or not)
    cdef list shapes         # the shape of each parameter (for check_array's message)
    cdef list dtypes         # the dtype of each written array as prepared (for messages)
    cdef bint single
    cdef int typenum
    cdef Py_ssize_t n, nflat, nsorted
    cdef Py_ssize_t *ndim
    cdef cnp.npy_intp *dims  # ndim[i] dims per tensor, one after another
    cdef Py_ssize_t *dim_start
    cdef uintptr_t *data     # of each written array as prepared
    cdef uintptr_t *nbytes
    cdef void **descrs       # of each written array as prepared: its dtype (kept alive by
    cdef int *types          # `dtypes`), type number and element count
    cdef cnp.npy_intp *sizes
    cdef uintptr_t *lo       # the written buffers (non-empty), sorted by start
    cdef uintptr_t *hi

    def __cinit__(self, list written, bint single, int typenum):
        cdef Py_ssize_t i, d, k, total = 0
        cdef cnp.ndarray a
        self.written = written
        self.single = single
        self.typenum = typenum
        xs = written[0][1]
        self.n = len(xs)
        self.shapes = [(<object>x).shape for x in xs]
        self.flat = []
        self.flat_labels = []
        for name, lst, _ in written:
            for i in range(len(lst)):
                self.flat.append(lst[i])
                self.flat_labels.append((name, i))
        self.nflat = len(self.flat)
        self.pins = [weakref.ref(a) for a in self.flat]
        self.dtypes = [a.dtype for a in self.flat]
        for i in range(self.n):
            total += cnp.PyArray_NDIM(<cnp.ndarray>xs[i])
        self.ndim = <Py_ssize_t *>malloc((self.n + 1) * sizeof(Py_ssize_t))
        self.dim_start = <Py_ssize_t *>malloc((self.n + 1) * sizeof(Py_ssize_t))
        self.dims = <cnp.npy_intp *>malloc((total + 1) * sizeof(cnp.npy_intp))
        self.data = <uintptr_t *>malloc((self.nflat + 1) * sizeof(uintptr_t))
        self.nbytes = <uintptr_t *>malloc((self.nflat + 1) * sizeof(uintptr_t))
        self.types = <int *>malloc((self.nflat + 1) * sizeof(int))
        self.descrs = <void **>malloc((self.nflat + 1) * sizeof(void *))
        self.sizes = <cnp.npy_intp *>malloc((self.nflat + 1) * sizeof(cnp.npy_intp))
        self.lo = <uintptr_t *>malloc((self.nflat + 1) * sizeof(uintptr_t))
        self.hi = <uintptr_t *>malloc((self.nflat + 1) * sizeof(uintptr_t))
        if (self.ndim == NULL or self.dim_start == NULL or self.dims == NULL
                or self.data == NULL or self.nbytes == NULL or self.lo == NULL
                or self.hi == NULL or self.types == NULL or self.sizes == NULL
                or self.descrs == NULL):
            raise MemoryError()
        k = 0
        for i in range(self.n):
            a = <cnp.ndarray>xs[i]
            self.ndim[i] = cnp.PyArray_NDIM(a)
            self.dim_start[i] = k
            for d in range(self.ndim[i]):
                self.dims[k] = cnp.PyArray_DIM(a, d)
                k += 1
        cdef Interval *iv = <Interval *>malloc((self.nflat + 1) * sizeof(Interval))
        if iv == NULL:
            raise MemoryError()
        k = 0
        for i in range(self.nflat):
            a = <cnp.ndarray>self.flat[i]
            self.data[i] = <uintptr_t>cnp.PyArray_DATA(a)
            self.nbytes[i] = <uintptr_t>cnp.PyArray_NBYTES(a)
            self.types[i] = cnp.PyArray_TYPE(a)
            self.descrs[i] = raw_descr(<cnp.PyArrayObject *>a)
            self.sizes[i] = cnp.PyArray_SIZE(a)
            if self.nbytes[i] == 0:
                continue
            iv[k].lo = self.data[i]
            iv[k].hi = self.data[i] + self.nbytes[i]
            k += 1
        qsort(iv, k, sizeof(Interval), compare_intervals)
        for i in range(k):
            self.lo[i] = iv[i].lo
            self.hi[i] = iv[i].hi
        self.nsorted = k
        free(iv)

    def __dealloc__(self):
        free(self.ndim)
        free(self.dim_start)
        free(self.dims)
        free(self.data)
        free(self.nbytes)
        free(self.types)
        free(self.descrs)
        free(self.sizes)
        free(self.lo)
        free(self.hi)

    cdef inline bint overlaps_written(self, uintptr_t glo, uintptr_t ghi):
        # the written buffers are disjoint, so sorted by start they are sorted by end too:
        # find the first that ends after glo; g overlaps it iff it starts before ghi
        cdef Py_ssize_t lo = 0, hi = self.nsorted, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.hi[mid] <= glo:
                lo = mid + 1
            else:
                hi = mid
        return lo < self.nsorted and self.lo[lo] < ghi

    cdef inline bint same_dims(self, cnp.PyArrayObject *a, Py_ssize_t tensor) noexcept:
        # a has the shape tensor `tensor` was prepared with (every written array of a tensor
        # has its parameter's shape; ndarray.resize changes it or the data pointer)
        cdef Py_ssize_t d, nd = self.ndim[tensor]
        cdef cnp.npy_intp *ad
        cdef cnp.npy_intp *xd
        if raw_ndim(a) != nd:
            return False
        ad = raw_dims(a)
        xd = &self.dims[self.dim_start[tensor]]
        for d in range(nd):
            if ad[d] != xd[d]:
                return False
        return True

    cdef inline bint written_unchanged(self) noexcept:
        # every written array has the header it was prepared with: C-contiguous, aligned,
        # writable, its dtype (the same descriptor, or one of its type number in native byte
        # order), element count and data pointer (so its bytes are the ones checked then: the
        # pins keep its buffer's size)
        cdef Py_ssize_t i
        cdef cnp.PyArrayObject *a
        for i in range(self.nflat):
            a = <cnp.PyArrayObject *>PyList_GET_ITEM(<PyObject *>self.flat, i)
            if ((raw_flags(a) & PLAIN_WRITTEN) != PLAIN_WRITTEN
                    or <uintptr_t>raw_data(a) != self.data[i]
                    or raw_size(a) != self.sizes[i]):
                return False
            if raw_descr(a) != self.descrs[i] and (raw_type(a) != self.types[i]
                                                   or not raw_notswapped(a)):
                return False
        return True

    cdef bint plain(self, list gs):
        # True when gs is the plain case: as many exact ndarrays as parameters, each of the
        # step's dtype and its parameter's shape, C-contiguous, aligned, in native byte order
        # and overlapping no written array; and every written array unchanged since it was
        # prepared (written_unchanged).  One pass over the headers, without a reference
        # taken; nothing raised.
        cdef Py_ssize_t i
        cdef PyObject *o
        cdef cnp.PyArrayObject *g
        cdef uintptr_t glo, nb
        if len(gs) != self.n:
            return False
        for i in range(self.n):
            o = PyList_GET_ITEM(<PyObject *>gs, i)
            if Py_TYPE(o) != NDARRAY_TYPE:
                return False
            g = <cnp.PyArrayObject *>o
            if (raw_type(g) != self.typenum or (raw_flags(g) & PLAIN_GRAD) != PLAIN_GRAD
                    or not raw_notswapped(g) or not self.same_dims(g, i)):
                return False
            nb = self.nbytes[i]  # the parameter's: g has its dtype and shape
            if nb and self.nsorted:
                glo = <uintptr_t>raw_data(g)
                if self.overlaps_written(glo, glo + nb):
                    return False
        return self.written_unchanged()

    def check_written(self):
        """Raise (ValueError naming the array) unless every written array still has the
        header it was prepared with (see the class); before any write.  The per-step check
        of a step whose gradients are not the plain case (a low-precision step's, say)."""
        cdef Py_ssize_t i
        cdef cnp.ndarray a
        if self.written_unchanged():
            return
        for i in range(self.nflat):
            a = <cnp.ndarray>self.flat[i]
            name, k = self.flat_labels[i]
            where = label(name, k, self.single)
            if not cnp.PyArray_ISWRITEABLE(a):
                raise ValueError(f"{where}: is read-only, but it is updated in place")
            if cnp.PyArray_TYPE(a) != self.types[i] or not cnp.PyArray_ISNOTSWAPPED(a):
                raise ValueError(f"{where}: its dtype changed from {self.dtypes[i]} to "
                                 f"{a.dtype} since the step was prepared (setting .dtype in "
                                 f"place reinterprets the same bytes); prepare the step again")
            if <uintptr_t>cnp.PyArray_DATA(a) != self.data[i]:
                # (its size cannot change while the pins live; its shape may be set in place,
                # which moves no byte: the kernels read flat buffers, as plain() does)
                raise ValueError(f"{where}: its buffer moved or changed size since the step "
                                 f"was prepared (ndarray.resize); prepare the step again")
            if cnp.PyArray_SIZE(a) != self.sizes[i]:
                raise ValueError(f"{where}: holds {a.size} elements, the step was prepared "
                                 f"for {self.sizes[i]}; prepare the step again")
            if not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISALIGNED(a):
                raise ValueError(f"{where}: is no longer a C-contiguous, aligned array (its "
                                 f"strides were set in place since the step was prepared); "
                                 f"prepare the step again")

    def plain_grads(self, list grads):
        """``grads`` itself when it is the plain case (see ``check_grads``), else None:
        nothing raised, the caller then takes the general path, whose checks name any
        problem (the optimizer objects' compiled step, fastadam/optim/_step_path.pyx)."""
        return grads if not self.single and self.plain(grads) else None

    def check_grads(self, grads):
        """The gradients of one step as a list: like the parameters (one array or a list of
        as many), each of the step's dtype, the parameter's shape, C-contiguous, aligned, in
        native byte order, and overlapping no written array; and every written array unchanged
        since the step was prepared (``check_written``).  TypeError/ValueError naming the
        argument, before any write."""
        cdef list gs
        cdef bint single
        cdef Py_ssize_t i, d, nd
        cdef object go
        cdef cnp.ndarray g
        cdef cnp.npy_intp *gd
        cdef cnp.npy_intp *xd
        cdef uintptr_t glo, nb
        cdef bint overlap = False
        if isinstance(grads, cnp.ndarray):
            gs, single = [grads], True
        elif isinstance(grads, (list, tuple)):
            gs, single = list(grads), False
        else:
            raise TypeError(f"grads: expected a numpy.ndarray or a list of them, "
                            f"got {type(grads).__name__}")
        if single != self.single or len(gs) != self.n:
            raise ValueError(f"grads: expected {'one array' if self.single else self.n} like "
                             f"params, got {'one array' if single else len(gs)}")
        if self.plain(gs):
            return gs
        # not the plain case: each check again, naming the first argument that fails
        for i in range(self.n):
            go = gs[i]
            nd = self.ndim[i]
            if (type(go) is not cnp.ndarray
                    or cnp.PyArray_TYPE(<cnp.ndarray>go) != self.typenum
                    or cnp.PyArray_NDIM(<cnp.ndarray>go) != nd
                    or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>go)
                    or not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>go)
                    or not cnp.PyArray_ISALIGNED(<cnp.ndarray>go)):
                check_array(go, label("grads", i, single), self.typenum, self.shapes[i], False)
            g = <cnp.ndarray>go
            if cnp.PyArray_NDIM(g) == nd:
                gd = cnp.PyArray_DIMS(g)
                xd = &self.dims[self.dim_start[i]]
                for d in range(nd):
                    if gd[d] != xd[d]:
                        check_array(go, label("grads", i, single), self.typenum,
                                    self.shapes[i], False)
            nb = self.nbytes[i]  # the parameter's: g has its dtype and shape
            if nb and self.nsorted:
                glo = <uintptr_t>cnp.PyArray_DATA(g)
                if self.overlaps_written(glo, glo + nb):
                    overlap = True
        self.check_written()
        if overlap:  # the sweep names the pair
            check_disjoint(self.written + [("grads", gs, False)], self.single)
        return gs
