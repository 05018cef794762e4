"""Property-based fuzz of every compiled entry point (issue 25, scope 7).

Each test draws arguments a careless or hostile caller might pass (shapes, strides, dtypes,
byte order, read-only flags, hyper-parameters, corrupt CSR matrices, indices out of range,
labels out of range, conv geometry, an index array another thread writes during the call) and
requires one of two outcomes:

- **refused**: TypeError, ValueError or IndexError (a clear Python exception), and for the
  in-place steps nothing written;
- **accepted**: a result, checked against a float64 reference (tests/reference.py) where the
  input is valid.

Anything else fails the test; a crash or an out-of-bounds access ends the process (under the
sanitizer job, tests/sanitize.sh, ASAN/UBSAN report it even when a plain build would survive).
The number of examples per test is ``FASTADAM_FUZZ_EXAMPLES`` (default 15: seconds in the
normal suite; the sanitizer job runs more).  With ``FASTADAM_FUZZ_COUNTS=path`` the module
writes ``{entry point: {cases, accepted, refused}}`` there as JSON when it finishes.
"""
import json
import os
import threading
from collections import defaultdict

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastadam  # noqa: E402
import fastadam.autodiff as ad  # noqa: E402
from fastadam._core import _autodiff_kernels as C  # noqa: E402
from reference import (adam_reference, conv2d_ref, segment_sum_reference,  # noqa: E402
                       softmax_cross_entropy_grad_ref)

EXAMPLES = int(os.environ.get("FASTADAM_FUZZ_EXAMPLES", "15"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="FASTADAM_FUZZ_SEED" not in
                os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
REFUSED = (TypeError, ValueError, IndexError)
COUNTS = defaultdict(lambda: {"cases": 0, "accepted": 0, "refused": 0})


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    yield
    path = os.environ.get("FASTADAM_FUZZ_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump(dict(COUNTS), f, indent=1, sort_keys=True)


def _outcome(name, call):
    """Run call(); count it; return (True, result) if accepted, (False, exc) if refused."""
    COUNTS[name]["cases"] += 1
    try:
        result = call()
    except REFUSED as exc:
        COUNTS[name]["refused"] += 1
        return False, exc
    COUNTS[name]["accepted"] += 1
    return True, result


# ---- arrays as a careless caller builds them ---------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.complex64, np.bool_,
          np.dtype(">f4"), np.dtype(">f8")]
LAYOUTS = ["contiguous", "reversed", "every_other", "readonly", "fortran", "list", "scalar"]


@st.composite
def float_array(draw, shape, dtypes=DTYPES, layouts=LAYOUTS):
    """An array of ``shape`` (or something else) in a drawn dtype and layout."""
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    layout = draw(st.sampled_from(layouts))
    seed = draw(st.integers(0, 2**32 - 1))
    base = np.random.default_rng(seed).standard_normal(
        (2 * shape[0],) + tuple(shape[1:]) if shape else ()) * 0.5
    if layout == "scalar":
        return 1.5
    a = base.astype(dtype)
    if layout == "list":
        return a[:shape[0]].tolist() if shape else a.tolist()
    if not shape:
        return a
    if layout == "every_other":
        return a[::2]
    if layout == "reversed":
        return a[::-1][:shape[0]]
    a = np.ascontiguousarray(a[:shape[0]])
    if layout == "fortran" and a.ndim >= 2:
        return np.asfortranarray(a)
    if layout == "readonly":
        a.flags.writeable = False
    return a


def _shape(draw, max_dims=3, max_side=6):
    return tuple(draw(st.lists(st.integers(0, max_side), min_size=1, max_size=max_dims)))


def _snapshot(arrays):
    return [np.array(a, copy=True) if isinstance(a, np.ndarray) else None for a in arrays]


def _unchanged(arrays, before):
    for a, b in zip(arrays, before):
        if b is not None:
            np.testing.assert_array_equal(np.asarray(a), b)


HYPER = st.fixed_dictionaries({}, optional={
    "lr": st.sampled_from([1e-3, 0.0, -1.0, float("nan"), float("inf"), 1e40]),
    "beta1": st.sampled_from([0.9, 0.0, 1.0, -0.1, float("nan")]),
    "eps": st.sampled_from([1e-8, 0.0, -1e-8, 1e-50]),
    "weight_decay": st.sampled_from([0.0, 0.01, float("nan")]),
    "num_threads": st.sampled_from([None, 1, 2, 0, -1, 2.5, 10**6]),
})


# ---- dense steps -------------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_dense_steps(data):
    shape = _shape(data.draw)
    x = data.draw(float_array(shape))
    others = [data.draw(float_array(data.draw(st.sampled_from([shape, shape[::-1], shape[:1]]))))
              for _ in range(3)]
    t = data.draw(st.sampled_from([1, 2, 0, -1, 2**70, 1.5, np.int64(3)]))
    hyper = data.draw(HYPER)
    which = data.draw(st.sampled_from(["adam", "adagrad", "momentum"]))
    arrays = [x] + others
    before = _snapshot(arrays)
    if which == "adam":
        call = lambda: fastadam.step_inplace(x, *others, t, **hyper)  # noqa: E731
    elif which == "adagrad":
        hyper.pop("beta1", None)
        call = lambda: fastadam.adagrad_step_inplace(x, *others[:2], t, **hyper)  # noqa: E731
    else:
        hyper.pop("beta1", None)
        hyper.pop("eps", None)
        call = lambda: fastadam.momentum_step_inplace(x, *others[:2], t, **hyper)  # noqa: E731
    ok, _ = _outcome(f"dense {which}", call)
    if not ok:
        _unchanged(arrays, before)
    elif which == "adam" and all(isinstance(a, np.ndarray) and a.dtype == np.float64
                                 for a in arrays) and "num_threads" not in hyper:
        ref = adam_reference(before[0], *before[1:], t, **hyper)
        for got, want in zip([x] + others[1:], [ref[0], ref[2], ref[3]]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ---- sparse steps and segment_sum --------------------------------------------------------------

INDEX_DTYPES = [np.int32, np.int64, np.uint32, np.uint64, np.int8, np.float64,
                np.dtype(">i8")]


@st.composite
def index_array(draw, n_rows, k):
    dtype = np.dtype(draw(st.sampled_from(INDEX_DTYPES)))
    lo = draw(st.sampled_from([0, 0, 0, -3]))
    hi = n_rows + draw(st.sampled_from([0, 0, 0, 2]))
    seed = draw(st.integers(0, 2**32 - 1))
    vals = np.random.default_rng(seed).integers(lo, max(hi, lo + 1), k)
    with np.errstate(all="ignore"):
        a = vals.astype(dtype)
    if draw(st.booleans()):
        a = np.repeat(a, 2)[::2]  # a strided view
    return a


@FUZZ
@given(data=st.data())
def test_fuzz_sparse_steps(data):
    n_rows = data.draw(st.integers(0, 8))
    row_shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=2)))
    shape = (n_rows,) + row_shape
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    m, v = np.zeros_like(x), np.full_like(x, 0.5)
    k = data.draw(st.integers(0, 10))
    idx = data.draw(index_array(n_rows, k))
    values = data.draw(float_array(data.draw(st.sampled_from(
        [(k,) + row_shape, (k + 1,) + row_shape, (k,)])), dtypes=[dtype, np.float16]))
    mode = data.draw(st.sampled_from(["lazy", "dense", "catchup", "eager"]))
    last = None
    if mode == "catchup" or data.draw(st.booleans()):
        last = np.random.default_rng(1).integers(-1, 4, n_rows).astype(
            data.draw(st.sampled_from([np.int64, np.int32])))
    t = data.draw(st.sampled_from([1, 3, 0, -2]))
    sorted_unique = data.draw(st.booleans())
    nt = data.draw(st.sampled_from([None, 1, 2]))
    arrays = [x, m, v, last]
    before = _snapshot(arrays)
    ok, _ = _outcome(f"sparse adam ({mode})", lambda: fastadam.sparse_step_inplace(
        x, (idx, values), m, v, t, mode=mode, last_step=last,
        indices_sorted_unique=sorted_unique, num_threads=nt))
    if not ok:
        _unchanged(arrays, before)
    elif mode == "lazy" and t >= 1:
        ref = adam_reference_rows(before[0], idx, values, before[1], before[2], t)
        for got, want in zip((x, m, v), ref):
            np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float32 else 1e-12,
                                       atol=1e-5 if dtype == np.float32 else 1e-12)


def adam_reference_rows(x, idx, values, m, v, t):
    from reference import sparse_adam_reference
    return sparse_adam_reference(x, np.asarray(idx, np.int64), np.asarray(values, np.float64),
                                 m, v, t)[:3]


@FUZZ
@given(data=st.data())
def test_fuzz_segment_sum(data):
    k = data.draw(st.integers(0, 12))
    idx = data.draw(index_array(data.draw(st.integers(0, 2**40)), k))
    values = data.draw(float_array(data.draw(st.sampled_from([(k, 3), (k,), (k + 1, 2)]))))
    nt = data.draw(st.sampled_from([None, 1, 2, 0]))
    ok, out = _outcome("segment_sum", lambda: fastadam.segment_sum(idx, values, num_threads=nt))
    if ok:
        rows, sums = out
        ref_rows, ref_sums = segment_sum_reference(np.asarray(idx, np.int64),
                                                   np.asarray(values, np.float64))
        np.testing.assert_array_equal(rows, ref_rows)
        np.testing.assert_allclose(sums, ref_sums, rtol=1e-3, atol=1e-3)


# ---- CSR: corrupt matrices ---------------------------------------------------------------------

CSR_INDEX_DTYPES = [np.int32, np.int64, np.uint32, np.uint64, np.uint16, np.int16,
                    np.dtype(">i4"), np.float64]


@st.composite
def csr_matrix(draw):
    """(matrix, valid): a random CSR matrix, perhaps corrupted after construction."""
    import scipy.sparse as sp
    n = draw(st.integers(0, 6))
    n_cols = draw(st.integers(0, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, n_cols)) * (rng.random((n, n_cols)) < 0.4)
    X = sp.csr_matrix(dense.astype(draw(st.sampled_from([np.float32, np.float64]))))
    with np.errstate(all="ignore"):
        X.indptr = X.indptr.astype(draw(st.sampled_from(CSR_INDEX_DTYPES)))
        X.indices = X.indices.astype(draw(st.sampled_from(CSR_INDEX_DTYPES)))
    corruption = draw(st.sampled_from([None, None, "swap", "huge", "short", "column", "negative",
                                       "truncate", "start"]))
    valid = corruption is None and X.indptr.dtype.kind in "iu" and X.indices.dtype.kind in "iu"
    ip = X.indptr
    if corruption == "swap" and ip.size > 2:
        ip[1], ip[-1] = ip[-1], ip[1]
    elif corruption == "huge" and ip.size > 1:
        ip[ip.size // 2] = np.iinfo(ip.dtype).max if ip.dtype.kind in "iu" else 1e30
    elif corruption == "short":
        X.indptr = ip[:-1]
    elif corruption == "column" and X.indices.size:
        X.indices[-1] = n_cols + draw(st.integers(0, 2**15))
    elif corruption == "negative" and X.indices.size and X.indices.dtype.kind in "if":
        X.indices[0] = -1
    elif corruption == "truncate" and X.nnz:
        X.data = X.data[:-1]
    elif corruption == "start" and ip.size:
        ip[0] = 1
    else:
        valid = valid and True
    return X, valid


@FUZZ
@given(data=st.data())
def test_fuzz_csr_transpose_dot(data):
    X, valid = data.draw(csr_matrix())
    k = data.draw(st.integers(0, 5))
    dz = data.draw(float_array(data.draw(st.sampled_from([(X.shape[0], k), (X.shape[0] + 1, k)])),
                               dtypes=[X.dtype, X.dtype, np.float16]))
    ok, got = _outcome("csr_transpose_dot", lambda: fastadam.sparse.csr_transpose_dot(X, dz))
    if ok and valid:
        ref = X.toarray().astype(np.float64).T @ np.asarray(dz, np.float64)
        np.testing.assert_allclose(got.to_dense(), ref, rtol=1e-4, atol=1e-4)


@FUZZ
@given(data=st.data())
def test_fuzz_sparse_step_with_a_csr_gradient(data):
    X, valid = data.draw(csr_matrix())
    x = np.zeros(X.shape, X.dtype)
    m, v = np.zeros_like(x), np.zeros_like(x)
    mode = data.draw(st.sampled_from(["lazy", "dense", "catchup"]))
    last = np.zeros(X.shape, np.int64) if mode == "catchup" else None
    before = _snapshot([x, m, v])
    ok, _ = _outcome(f"sparse step, CSR ({mode})", lambda: fastadam.sparse_step_inplace(
        x, X, m, v, 1, mode=mode, last_step=last))
    if not ok:
        _unchanged([x, m, v], before)


@FUZZ
@given(data=st.data())
def test_fuzz_sparse_linear_classifier(data):
    pytest.importorskip("sklearn")
    from fastadam.sklearn import SparseLinearClassifier
    X, valid = data.draw(csr_matrix())
    y = np.arange(X.shape[0]) % 2
    clf = SparseLinearClassifier(max_iter=2, batch_size=2, tol=0, random_state=0,
                                 mode=data.draw(st.sampled_from(["lazy", "catchup"])))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _outcome("SparseLinearClassifier.fit", lambda: clf.fit(X, y))


# ---- autodiff kernels --------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_autodiff_elementwise_kernels(data):
    shape = _shape(data.draw)
    x = data.draw(float_array(shape))
    g = data.draw(float_array(data.draw(st.sampled_from([shape, shape[:1]]))))
    out = data.draw(st.sampled_from([None, "new", "small", "readonly"]))
    if out == "new" and isinstance(x, np.ndarray):
        out = np.empty_like(x)
    elif out == "small":
        out = np.empty(1)
    elif out == "readonly":
        out = np.zeros(3)
        out.flags.writeable = False
    name = data.draw(st.sampled_from(["relu", "sigmoid", "relu_grad", "sigmoid_grad",
                                      "tanh_grad", "relu_grad_scalar", "sum_rows"]))
    kernel = getattr(C, name)
    if name == "sum_rows":
        call = lambda: kernel(x)  # noqa: E731
    elif name == "relu_grad_scalar":
        call = lambda: kernel(0.5, x, out)  # noqa: E731
    elif name.endswith("_grad"):
        call = lambda: kernel(g, x, out)  # noqa: E731
    else:
        call = lambda: kernel(x, out)  # noqa: E731
    ok, y = _outcome(f"autodiff {name}", call)
    if ok and name == "relu":
        np.testing.assert_array_equal(y.reshape(np.shape(x)), np.where(x < 0, 0, x))


@FUZZ
@given(data=st.data())
def test_fuzz_softmax_cross_entropy(data):
    n = data.draw(st.integers(0, 70))
    c = data.draw(st.integers(0, 5))
    logits = data.draw(float_array((n, c), layouts=["contiguous", "reversed", "readonly"]))
    seed = data.draw(st.integers(0, 2**32 - 1))
    lo = data.draw(st.sampled_from([0, 0, -100, -1]))
    labels = np.random.default_rng(seed).integers(lo, max(c, 1) + data.draw(
        st.sampled_from([0, 0, 1])), data.draw(st.sampled_from([n, n, n + 1])))
    labels = labels.astype(data.draw(st.sampled_from([np.int64, np.int32, np.uint8, np.intp,
                                                      np.float64])))
    via = data.draw(st.sampled_from(["tensor", "kernel_forward", "kernel_backward"]))
    if via == "tensor":
        holder = []

        def call():
            t = ad.Tensor(logits, requires_grad=True) if isinstance(logits, np.ndarray) \
                else logits
            holder.append(t)
            loss = ad.softmax_cross_entropy(t, labels)
            labels[...] = -100 if labels.dtype.kind == "i" else 0  # refilled before backward
            return ad.gradient(loss, [t])[0].data
        before = labels.copy()
        ok, g = _outcome("autodiff softmax_cross_entropy", call)
        if ok and n and np.dtype(logits.dtype) == np.float64:
            np.testing.assert_allclose(g, softmax_cross_entropy_grad_ref(logits, before),
                                       rtol=1e-10, atol=1e-12)
    else:
        lab = np.asarray(labels)
        if via == "kernel_forward":
            _outcome("autodiff sce kernel", lambda: C.sce_forward(logits, lab))
        else:
            _outcome("autodiff sce kernel", lambda: C.sce_backward(logits, lab, 1.0))


@FUZZ
@given(data=st.data())
def test_fuzz_conv2d(data):
    n, c, h, w = (data.draw(st.integers(0, 2)), data.draw(st.integers(1, 3)),
                  data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7)))
    groups = data.draw(st.sampled_from([1, 1, c, 2]))
    o = data.draw(st.integers(1, 4)) * (groups if groups > 0 else 1)
    kh, kw = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    stride = data.draw(st.sampled_from([1, 2, 3, 0, -1, (1, 2)]))
    padding = data.draw(st.sampled_from([0, 1, 3, -1, (2, 0)]))
    dilation = data.draw(st.sampled_from([1, 2, 0]))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = ad.Tensor(rng.standard_normal((n, c, h, w)).astype(dtype), requires_grad=True)
    wt = ad.Tensor(rng.standard_normal((o, max(c // max(groups, 1), 1), kh, kw)).astype(dtype),
                   requires_grad=True)

    def call():
        y = ad.conv2d(x, wt, stride=stride, padding=padding, dilation=dilation, groups=groups)
        gx, gw = ad.gradient(ad.sum(y), [x, wt])
        return y.data, gx.data, gw.data
    ok, out = _outcome("autodiff conv2d", call)
    if ok and dtype == np.float64:
        pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
        ref = conv2d_ref(x.data, wt.data, None, pair(stride), pair(padding), pair(dilation),
                         groups)
        np.testing.assert_allclose(out[0], ref, rtol=1e-10, atol=1e-10)


# ---- onnx.run ----------------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_onnx_conv(data):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    import fastadam.onnx as fo
    c, h, w = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)), data.draw(
        st.integers(1, 6))
    kh, kw = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    attrs = {}
    if data.draw(st.booleans()):
        attrs["pads"] = data.draw(st.sampled_from([[0, 0, 0, 0], [1, 2, 1, 2], [-1, 0, 0, 0],
                                                   [0, 0], [5, 5, 5, 5]]))
    if data.draw(st.booleans()):
        attrs["strides"] = data.draw(st.sampled_from([[1, 1], [2, 3], [0, 1], [1]]))
    if data.draw(st.booleans()):
        attrs["dilations"] = data.draw(st.sampled_from([[1, 1], [2, 2], [0, 1]]))
    if data.draw(st.booleans()):
        attrs["group"] = data.draw(st.sampled_from([1, c, 0, -1]))
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((2, data.draw(st.sampled_from([c, 1, c + 1])), kh, kw)).astype(
        np.float32)
    _outcome("onnx.run Conv", lambda: fo.run(model, {"x": x, "w": wt}))
    del onnx


@FUZZ
@given(data=st.data())
def test_fuzz_onnx_hostile_models(data):
    """The hostile models of tests/onnx_fuzz.py (a few KB whose node would allocate tens of
    MiB), each under a drawn budget: refused naming the node (1 MiB) or run (256 MiB)."""
    pytest.importorskip("onnx")
    import fastadam.onnx as fo
    import onnx_fuzz
    op, case = data.draw(st.sampled_from(onnx_fuzz.hostile_cases()))
    tensor_bytes = data.draw(st.sampled_from([1 << 20, 256 << 20]))
    previous = fo.set_memory_budget(tensor_bytes=tensor_bytes, step_bytes=2 * tensor_bytes)
    try:
        ok, out = _outcome("onnx.run hostile model", case.run)
    finally:
        fo.set_memory_budget(**previous)
    if not ok:
        assert str(out).startswith("node 'hostile'"), out
    else:
        assert tensor_bytes > 1 << 20, case.name  # the tiny budget refuses every one


# ---- sklearn loss kernels ----------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_sklearn_loss_kernels(data):
    pytest.importorskip("sklearn")
    from fastadam.sklearn import _kernels
    n, k = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 4))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    z = rng.standard_normal((n, k)).astype(dtype)
    grad = np.empty(data.draw(st.sampled_from([(n, k), (n, k), (max(n - 1, 0), k)])), dtype)
    weights = np.full(data.draw(st.sampled_from([n, n, n + 3])), 1.0, dtype)
    which = data.draw(st.sampled_from(["softmax_cross_entropy", "half_squared_error",
                                       "binary_cross_entropy"]))
    if which == "softmax_cross_entropy":
        labels = rng.integers(data.draw(st.sampled_from([0, -5])), max(k, 1) + data.draw(
            st.sampled_from([0, 3])), data.draw(st.sampled_from([n, n, n + 2]))).astype(np.intp)
        call = lambda: _kernels.softmax_cross_entropy(z, labels, weights, grad)  # noqa: E731
    else:
        targets = rng.standard_normal(data.draw(st.sampled_from(
            [(n, k), (max(n - 1, 0), k), (n, k + 1)]))).astype(dtype)
        extra = (1e-7,) if which == "binary_cross_entropy" else ()
        call = lambda: getattr(_kernels, which)(z, targets, weights, grad, *extra)  # noqa: E731
    _outcome(f"sklearn {which}", call)


# ---- indices written by another thread during a call -------------------------------------------

@FUZZ
@given(data=st.data())
def test_fuzz_indices_written_by_another_thread(data):
    n_rows = 64
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    idx = rng.integers(0, n_rows, 5000).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    values = rng.standard_normal((idx.size, 8))
    x, m, v = np.zeros((n_rows, 8)), np.zeros((n_rows, 8)), np.zeros((n_rows, 8))
    bad = data.draw(st.sampled_from([-1, n_rows, np.iinfo(idx.dtype).max]))
    stop = threading.Event()

    def scribble():
        while not stop.is_set():
            idx[::97] = bad
            idx[::97] = 0

    target = data.draw(st.sampled_from(["sparse_step", "segment_sum", "csr"]))
    if target == "csr":
        import scipy.sparse as sp
        X = sp.csr_matrix(rng.standard_normal((50, 300)) * (rng.random((50, 300)) < 0.1))
        X.indptr = X.indptr.astype(idx.dtype)
        X.indices = X.indices.astype(idx.dtype)
        dz = rng.standard_normal((50, 3))
        arr = X.indptr if data.draw(st.booleans()) else X.indices
        good = arr.copy()

        def scribble():  # noqa: F811
            while not stop.is_set():
                arr[::7] = bad
                arr[::7] = good[::7]
        call = lambda: fastadam.sparse.csr_transpose_dot(X, dz)  # noqa: E731
    elif target == "segment_sum":
        call = lambda: fastadam.segment_sum(idx, values, num_threads=2)  # noqa: E731
    else:
        call = lambda: fastadam.sparse_step_inplace(  # noqa: E731
            x, (idx, values), m, v, 1, num_threads=data.draw(st.sampled_from([1, 2])))
    thread = threading.Thread(target=scribble)
    thread.start()
    try:
        for _ in range(5):
            _outcome(f"mutated by a thread: {target}", call)
    finally:
        stop.set()
        thread.join()
