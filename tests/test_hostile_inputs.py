"""Inputs a hostile or careless caller may pass (issue 25, findings 2, 3, 4, 5 and 10).

- corrupt CSR matrices (an unsigned ``indptr`` that decreases, indices past the columns,
  ``indptr`` past the stored entries) are refused by every entry point that walks them;
- another thread writing into a matrix's ``indptr`` while a compiled walk runs cannot make it
  read out of bounds (the walk reads a private copy);
- ``softmax_cross_entropy`` reads its labels once: refilling the caller's buffer before the
  backward pass changes nothing, and an out-of-range label is refused;
- catch-up mode advances ``last_step`` on zero-width rows;
- a process forked after a parallel region runs the autodiff kernels, a ``multiprocessing.Pool``
  of autodiff workers and ``fastadam.onnx.run`` without hanging (timeouts: a hang fails).

These run in the sanitizer job too (tests/sanitize.sh), where an out-of-bounds access is a
report, not a lucky pass.  References: tests/reference.py's float64 oracles, the same matrix
with signed indices, and the dense product in float64.
"""
import multiprocessing
import threading
import warnings

import numpy as np
import pytest

import fastadam
import fastadam.autodiff as ad
from fastadam._core import _config
from reference import softmax_cross_entropy_grad_ref, sparse_adam_reference

sp = pytest.importorskip("scipy.sparse")
from fastadam.sparse import csr_transpose_dot  # noqa: E402
from fastadam._core._sparse_host import check_csr_structure  # noqa: E402


def _matrix(rng, n=30, n_cols=50, density=0.2, dtype=np.float64):
    X = sp.random(n, n_cols, density=density, format="csr", dtype=dtype,
                  random_state=int(rng.integers(1 << 30)))
    X.data = rng.standard_normal(X.nnz).astype(dtype)
    return X


def _with_index_types(X, indptr_dtype, indices_dtype):
    Y = X.copy()
    Y.indptr = X.indptr.astype(indptr_dtype)
    Y.indices = X.indices.astype(indices_dtype)
    return Y


# ---- corrupt CSR ------------------------------------------------------------------------------

def _decreasing_uint32():
    X = sp.csr_matrix(np.ones((4, 3)))
    X.indptr = np.array([0, 3, 1, 6, 12], dtype=np.uint32)  # np.diff of it never goes below 0
    return X, ValueError, r"invalid CSR indptr \(decreasing: indptr\[2\] = 1 < indptr\[1\] = 3\)"


def _uint64_past_int64():
    X = sp.csr_matrix(np.ones((4, 3)))
    X.indptr = np.array([0, 3, 2**63 + 5, 9, 12], dtype=np.uint64)  # negative once signed
    return X, ValueError, r"invalid CSR indptr \(decreasing"


def _past_the_stored_entries():
    X = sp.csr_matrix(np.ones((4, 3)))
    X.indptr = np.array([0, 3, 6, 9, 40], dtype=np.uint32)
    return X, ValueError, r"invalid CSR indptr \(ends at 40, past the stored entries"


def _not_from_zero():
    X = sp.csr_matrix(np.ones((4, 3)))
    X.indptr = np.array([2, 3, 6, 9, 12], dtype=np.uint16)
    return X, ValueError, r"invalid CSR indptr \(expected 5 entries from 0, got 5 entries from 2"


def _column_past_the_end():
    X = sp.csr_matrix(np.ones((4, 3)))
    X.indices = X.indices.astype(np.uint32)
    X.indices[4] = 2**32 - 1  # -1 if read as int32
    return X, IndexError, r"\.indices: index 4294967295 is out of range for 3 columns"


CORRUPT = [_decreasing_uint32, _uint64_past_int64, _past_the_stored_entries, _not_from_zero,
           _column_past_the_end]


def _transpose_dot(X):
    return csr_transpose_dot(X, np.ones((X.shape[0], 2)))


def _sparse_step(X):
    x = np.zeros(X.shape)
    m, v = np.zeros_like(x), np.zeros_like(x)
    fastadam.sparse_step_inplace(x, X, m, v, 1)
    return x, m, v


def _classifier_fit(X):
    from fastadam.sklearn import SparseLinearClassifier
    return SparseLinearClassifier(max_iter=2, batch_size=2).fit(X, [0, 1, 0, 1])


def _classifier_partial_fit(X):
    from fastadam.sklearn import SparseLinearClassifier
    return SparseLinearClassifier().partial_fit(X, [0, 1, 0, 1], classes=[0, 1])


ENTRY_POINTS = [_transpose_dot, _sparse_step, _classifier_fit, _classifier_partial_fit]


@pytest.mark.parametrize("corrupt", CORRUPT, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__.strip("_"))
def test_every_csr_entry_point_refuses_a_corrupt_matrix(corrupt, entry):
    if entry in (_classifier_fit, _classifier_partial_fit):
        pytest.importorskip("sklearn")
    X, exc, match = corrupt()
    before = (X.indptr.copy(), X.indices.copy(), X.data.copy())
    with pytest.raises(exc, match=match):
        entry(X)
    for a, b in zip(before, (X.indptr, X.indices, X.data)):
        np.testing.assert_array_equal(a, b)  # the caller's matrix is only read


def test_a_failed_csr_step_writes_nothing():
    X, _, _ = _decreasing_uint32()
    x, m, v = np.ones(X.shape), np.full(X.shape, 0.5), np.full(X.shape, 0.25)
    with pytest.raises(ValueError):
        fastadam.sparse_step_inplace(x, X, m, v, 3)
    assert (x == 1).all() and (m == 0.5).all() and (v == 0.25).all()


@pytest.mark.parametrize("indptr_dtype,indices_dtype",
                         [(np.uint32, np.uint32), (np.uint64, np.int32), (np.int64, np.uint16),
                          (np.dtype(">i4"), np.dtype(">i8"))])
def test_valid_matrices_with_any_integer_index_type_give_the_signed_results(
        rng, indptr_dtype, indices_dtype):
    X = _matrix(rng)
    Y = _with_index_types(X, indptr_dtype, indices_dtype)
    dz = rng.standard_normal((X.shape[0], 3))
    got, ref = csr_transpose_dot(Y, dz), csr_transpose_dot(X, dz)
    np.testing.assert_array_equal(got.indices, ref.indices)
    assert got.values.tobytes() == ref.values.tobytes()
    dense = X.toarray().T @ dz  # the float64 product
    np.testing.assert_allclose(got.to_dense(), dense, rtol=1e-12, atol=1e-12)
    for a, b in zip(_sparse_step(Y), _sparse_step(X)):
        np.testing.assert_array_equal(a, b)


def test_check_csr_structure_returns_private_index_copies(rng):
    X = _matrix(rng)
    indptr, cols, data = check_csr_structure(X, "X")
    assert not np.shares_memory(indptr, X.indptr) and not np.shares_memory(cols, X.indices)
    np.testing.assert_array_equal(indptr, X.indptr)
    np.testing.assert_array_equal(cols, X.indices)
    assert indptr.dtype == cols.dtype and indptr.dtype in (np.int32, np.int64)


def test_the_compiled_walk_refuses_rows_outside_the_matrix(rng):
    from fastadam.sparse import _csr
    X = _matrix(rng, n=5)
    indptr, cols, data = check_csr_structure(X, "X")
    with pytest.raises(IndexError, match="batch_rows: row 5 is out of range for 5 rows"):
        _csr.columns(indptr, cols, data, np.array([0, 5], np.int64), X.shape[1])
    with pytest.raises(IndexError, match="batch_rows: row -1 is out of range"):
        _csr.columns(indptr, cols, data, np.array([-1], np.int64), X.shape[1])


# ---- another thread writes into the matrix during the walk -----------------------------------

def _scribble(indptr, stop, bad):
    """Until ``stop`` is set: set indptr's middle entry to ``bad`` and put it back."""
    k = indptr.shape[0] // 2
    good = indptr[k]
    while not stop.is_set():
        indptr[k] = bad
        indptr[k] = good


def _race(call, X, calls, bad=None):
    stop = threading.Event()
    bad = np.iinfo(X.indptr.dtype).max if bad is None else bad
    t = threading.Thread(target=_scribble, args=(X.indptr, stop, bad))
    t.start()
    outcomes = {"result": 0, "refused": 0}
    try:
        for _ in range(calls):
            try:
                yield call()
                outcomes["result"] += 1
            except (ValueError, IndexError):
                outcomes["refused"] += 1
    finally:
        stop.set()
        t.join()


def test_writing_indptr_during_csr_transpose_dot_cannot_reach_the_walk(rng):
    X = _matrix(rng, n=400, n_cols=3000, density=0.05)
    dz = rng.standard_normal((X.shape[0], 4))
    ref = csr_transpose_dot(X, dz)
    # each call sees the matrix before or after a write: the right result, or a clean refusal
    for got in _race(lambda: csr_transpose_dot(X, dz), X, 150):
        np.testing.assert_array_equal(got.indices, ref.indices)
        assert got.values.tobytes() == ref.values.tobytes()


def test_writing_indptr_during_a_classifier_fit_cannot_reach_the_walk(rng):
    from fastadam.sklearn import SparseLinearClassifier
    X = _matrix(rng, n=300, n_cols=2000, density=0.05)
    y = rng.integers(0, 3, X.shape[0])
    fit = SparseLinearClassifier(max_iter=40, batch_size=300, random_state=0, tol=0,
                                 n_iter_no_change=100)  # whole-matrix walks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning
        ref = fit.fit(X, y).coef_.copy()
        for got in _race(lambda: fit.fit(X, y), X, 6, bad=-10**6):  # a row far before the data
            np.testing.assert_array_equal(got.coef_, ref)  # checked once, copied once


# ---- softmax_cross_entropy reads its labels once ----------------------------------------------

@pytest.mark.parametrize("labels_as_tensor", [False, True])
def test_refilling_the_label_buffer_before_backward_changes_nothing(rng, labels_as_tensor):
    logits = ad.Tensor(rng.standard_normal((6, 4)), requires_grad=True)
    labels = np.array([0, 3, 1, 2, 2, 0], dtype=np.intp)
    original = labels.copy()
    loss = ad.softmax_cross_entropy(logits, ad.Tensor(labels) if labels_as_tensor else labels)
    labels[:] = [1, 1, 1, 1, 1, 1]  # refilled for the next batch before the backward pass
    (g,) = ad.gradient(loss, [logits], retain_graph=True)
    np.testing.assert_allclose(g.data, softmax_cross_entropy_grad_ref(logits.data, original),
                               rtol=1e-12, atol=1e-15)
    labels[:] = -100  # an "ignore" marker written there cannot reach the kernel either
    (g,) = ad.gradient(loss, [logits])
    np.testing.assert_allclose(g.data, softmax_cross_entropy_grad_ref(logits.data, original),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("bad", [-100, -1, 4, 2**40])
def test_an_out_of_range_label_is_refused(rng, bad):
    logits = ad.Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    with pytest.raises(IndexError, match=r"labels: values must lie in \[0, 4\)"):
        ad.softmax_cross_entropy(logits, np.array([0, bad, 1]))


@pytest.mark.parametrize("kernel", ["sce_forward", "sce_backward"])
def test_the_compiled_kernels_check_the_labels_on_every_call(rng, kernel):
    from fastadam._core import _autodiff_kernels as C
    x = rng.standard_normal((70, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 70).astype(np.intp)
    labels[66] = -100
    args = (x, labels) if kernel == "sce_forward" else (x, labels, 1.0)
    with pytest.raises(IndexError, match=r"labels: values must lie in \[0, 5\), got \[-100, 4\]"):
        getattr(C, kernel)(*args)


# ---- catch-up mode on zero-width rows ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_catchup_advances_last_step_of_zero_width_rows(dtype):
    x = np.zeros((5, 0), dtype)
    m, v = x.copy(), x.copy()
    last = np.array([0, 2, 0, 1, 3], np.int64)
    idx = np.array([3, 1, 3], np.int64)
    values = np.zeros((3, 0), dtype)
    ref = sparse_adam_reference(x, idx, values, m, v, 4, mode="catchup", last_step=last)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 4, mode="catchup", last_step=last)
    np.testing.assert_array_equal(last, ref[3])
    np.testing.assert_array_equal(last, [0, 4, 0, 4, 3])
    for opt, state in ((fastadam.sparse_adagrad_step_inplace, [x.copy()]),
                       (fastadam.sparse_momentum_step_inplace, [x.copy()])):
        last2 = np.zeros(5, np.int64)
        opt(x, (idx, values), *state, 2, mode="catchup", last_step=last2)
        np.testing.assert_array_equal(last2, [0, 2, 0, 2, 0])


def test_catchup_on_zero_width_rows_still_checks_last_step():
    x = np.zeros((5, 0))
    with pytest.raises(ValueError, match=r"last_step: expected 0 <= last_step < t=2"):
        fastadam.sparse_step_inplace(x, (np.array([1]), np.zeros((1, 0))), x.copy(), x.copy(),
                                     2, mode="catchup", last_step=np.full(5, 7, np.int64))


# ---- fork: one thread policy for every compiled kernel ---------------------------------------

def _parallel_region_in_parent():
    x = np.ones(400_000, np.float32)
    fastadam.step_inplace(x, x.copy(), np.zeros_like(x), np.zeros_like(x), 1, num_threads=2)
    ad.relu(ad.Tensor(np.ones(300_000)))  # and one in the autodiff kernels


def _relu_and_conv():
    rng = np.random.default_rng(0)
    x = ad.Tensor(rng.standard_normal((4, 3, 64, 64)), requires_grad=True)
    w = ad.Tensor(rng.standard_normal((8, 3, 3, 3)), requires_grad=True)
    y = ad.relu(ad.conv2d(x, w, padding=1))
    gx, gw = ad.gradient(ad.sum(y), [x, w])
    return float(np.sum(gw.data))


def _onnx_relu():
    import onnx
    from onnx import TensorProto, helper
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.DOUBLE, [300_000])], [helper.make_tensor_value_info(
            "y", TensorProto.DOUBLE, [300_000])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    x = np.linspace(-1, 1, 300_000)
    y = fastadam.onnx.run(model, {"x": x})["y"]
    return bool(np.array_equal(y, np.maximum(x, 0)))


def _in_child(work, queue):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        queue.put(work())


def _run_forked(work, timeout=60):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(work, queue))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"a forked child running {work.__name__} hung (OpenMP after fork)")
    assert child.exitcode == 0
    return queue.get(timeout=10)


needs_openmp = pytest.mark.skipif(not _config.openmp_enabled(),
                                  reason="a serial build has no thread pool to hang")


@needs_openmp
def test_relu_and_conv_in_a_forked_child_finish():
    _parallel_region_in_parent()
    expected = _relu_and_conv()
    assert _run_forked(_relu_and_conv) == expected


@needs_openmp
def test_onnx_run_in_a_forked_child_finishes():
    pytest.importorskip("onnx")
    import fastadam.onnx  # noqa: F401
    _parallel_region_in_parent()
    assert _run_forked(_onnx_relu) is True


def _pool_task(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = ad.Tensor(np.random.default_rng(seed).standard_normal(200_000), requires_grad=True)
        (g,) = ad.gradient(ad.sum(ad.sigmoid(ad.relu(x))), [x])
        return float(np.sum(g.data))


@needs_openmp
def test_a_fork_pool_of_autodiff_workers_finishes():
    _parallel_region_in_parent()
    expected = [_pool_task(s) for s in range(3)]
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        got = pool.map_async(_pool_task, range(3)).get(timeout=60)
    except multiprocessing.TimeoutError:
        pytest.fail("fork Pool workers running autodiff hung (OpenMP after fork)")
    finally:
        pool.terminate()
        pool.join()
    assert got == expected
