"""Every array check of fastadam (dense steps, sparse gradients, optimizer parameters): all of
them run before any kernel writes.

A failed check raises TypeError / ValueError naming the argument (``x``, or ``m[3]`` inside a
list), what was expected and what was received.  Written in Cython because a multi-tensor step
checks four arrays per tensor and the per-array cost must stay far below a microsecond.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport uintptr_t
from libc.stdlib cimport malloc, free, qsort

cnp.import_array()

FLOAT_TYPES = {cnp.NPY_FLOAT16: "float16", cnp.NPY_FLOAT: "float32", cnp.NPY_DOUBLE: "float64"}


cdef str label(str name, Py_ssize_t i, bint single):
    return name if single else f"{name}[{i}]"


cpdef tuple as_array_list(obj, str name):
    """Return (list_of_objects, single): an ndarray becomes a one-element list."""
    if isinstance(obj, np.ndarray):
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
    if not isinstance(a, np.ndarray):
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


def check_arrays_like(list arrays, str name, int typenum, list shapes, bint single):
    """check_array on each of ``arrays`` (read-only use: gradients) against dtype ``typenum``
    and ``shapes[i]``; the label (``name[i]``, or ``name`` when ``single``) is only formatted
    for the error.  The per-step check of a prepared step's gradients."""
    cdef Py_ssize_t i, n = len(arrays)
    cdef object a
    cdef cnp.ndarray arr
    for i in range(n):
        a = arrays[i]
        if (type(a) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)
                and cnp.PyArray_ISALIGNED(<cnp.ndarray>a) and (<object>a).shape == shapes[i]):
            continue  # the common case, without formatting a label
        check_array(a, label(name, i, single), typenum, shapes[i], False)


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
        if type(go) is not np.ndarray or type(xo) is not np.ndarray:
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
    if isinstance(x, np.ndarray) and isinstance(g, np.ndarray) and all(
            isinstance(a, np.ndarray) for _, a in slots):
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
        xi = check_array(xs[i], label("x", i, single), typenum, None, True)
        if typenum < 0:
            typenum = cnp.PyArray_TYPE(xi)
        shape = (<object>xi).shape
        check_array(gs[i], label("g", i, single), typenum, shape, False)
        for q in range(nslots):
            check_array((<list>slot_lists[q])[i], label(slots[q][0], i, single), typenum, shape,
                        True)
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
