"""fastadam.sparse.csr_transpose_dot and the steps' indices_sorted_unique=True path.

References: ``segment_sum`` of the repeated-index gradient ``data[:, None] * dz[row]`` (the
sum the default sparse step computes; the new path must equal it bit for bit), the dense
product ``X.T @ dz`` in float64, and the default (sort + segment sum) step for every optimizer,
mode, dtype and thread count."""
import threading

import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")

import fastadam  # noqa: E402
from fastadam.sparse import csr_transpose_dot, segment_sum  # noqa: E402


def _csr(rng, n=40, n_cols=300, density=0.05, dtype=np.float64, index_dtype=np.int32,
         canonical=True):
    X = sp.random(n, n_cols, density=density, format="csr", dtype=dtype,
                  random_state=int(rng.integers(1 << 30)))
    X.data = rng.standard_normal(X.nnz).astype(dtype)
    if not canonical:  # unsorted columns in each row, duplicates and an explicit zero
        rows = np.repeat(np.arange(n), np.diff(X.indptr))
        extra = rng.integers(0, X.nnz, 15)
        r = np.r_[rows, rows[extra], 0]
        c = np.r_[X.indices, X.indices[extra], 7]
        d = np.r_[X.data, rng.standard_normal(15).astype(dtype), 0].astype(dtype)
        perm = rng.permutation(r.size)
        order = np.lexsort((perm, r))  # rows in order, entries shuffled within each row
        r, c, d = r[order], c[order], d[order]
        indptr = np.r_[0, np.cumsum(np.bincount(r, minlength=n))]
        X = sp.csr_matrix((d, c, indptr), shape=(n, n_cols))
    X.indices = X.indices.astype(index_dtype)
    X.indptr = X.indptr.astype(index_dtype)
    return X


def _repeated_rows(X, dz):
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return X.indices[:X.nnz], X.data[:X.nnz, None] * dz[rows]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("canonical", [True, False])
@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_csr_transpose_dot_equals_segment_sum_bit_for_bit(rng, dtype, index_dtype, canonical, k):
    X = _csr(rng, dtype=dtype, index_dtype=index_dtype, canonical=canonical)
    dz = rng.standard_normal((X.shape[0], k)).astype(dtype)
    g = csr_transpose_dot(X, dz)
    unique, sums = segment_sum(*_repeated_rows(X, dz))
    np.testing.assert_array_equal(g.indices, unique)
    assert g.indices.dtype == np.int64 and g.values.dtype == dtype
    assert g.dense_shape == (X.shape[1], k)
    assert g.values.tobytes() == sums.tobytes()
    ref = X.toarray().astype(np.float64).T @ dz.astype(np.float64)  # the dense product
    np.testing.assert_allclose(g.to_dense(), ref, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_csr_transpose_dot_empty_rows_no_entries_and_csr_array(rng):
    X = sp.csr_matrix((5, 20))
    g = csr_transpose_dot(X, np.ones((5, 2)))
    assert g.indices.shape == (0,) and g.values.shape == (0, 2)
    X = sp.csr_array(_csr(rng, n=6, n_cols=10, density=0.3))
    X.indptr[3:] = X.indptr[3]  # rows 3.. empty (entries past indptr[-1] are ignored)
    dz = rng.standard_normal((6, 2))
    g = csr_transpose_dot(X, dz)
    Xd = sp.csr_matrix((X.data[:X.indptr[-1]], X.indices[:X.indptr[-1]], X.indptr),
                       shape=X.shape).toarray()
    np.testing.assert_allclose(g.to_dense(), Xd.T @ dz, rtol=1e-12, atol=1e-14)


def test_csr_transpose_dot_leaves_inputs_alone_and_repeats(rng):
    X = _csr(rng, canonical=False)
    dz = rng.standard_normal((X.shape[0], 3))
    copies = [a.copy() for a in (X.data, X.indices, X.indptr, dz)]
    first = csr_transpose_dot(X, dz)
    other = csr_transpose_dot(_csr(rng, n_cols=50), rng.standard_normal((40, 3)))
    second = csr_transpose_dot(X, dz)  # the per-thread column map was left clean
    assert first.values.tobytes() == second.values.tobytes()
    np.testing.assert_array_equal(first.indices, second.indices)
    assert other.dense_shape == (50, 3)
    for a, b in zip((X.data, X.indices, X.indptr, dz), copies):
        np.testing.assert_array_equal(a, b)


def test_csr_transpose_dot_in_threads_equals_serial(rng):
    cases = [(_csr(rng, n_cols=2000, density=0.02), rng.standard_normal((40, 4)))
             for _ in range(4)]
    serial = [csr_transpose_dot(X, dz) for X, dz in cases]
    results = [None] * len(cases)

    def work(i):
        for _ in range(20):
            results[i] = csr_transpose_dot(*cases[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(serial, results):
        assert a.values.tobytes() == b.values.tobytes()


# ---- the steps' indices_sorted_unique=True path -----------------------------------------------

STEPS = {
    "adam": (lambda x, g, s, t, **kw: fastadam.sparse_step_inplace(
        x, g, s[0], s[1], t, weight_decay=1e-2, **kw), 2),
    "adagrad": (lambda x, g, s, t, **kw: fastadam.sparse_adagrad_step_inplace(
        x, g, s[0], t, weight_decay=1e-2, **kw), 1),
    "momentum": (lambda x, g, s, t, **kw: fastadam.sparse_momentum_step_inplace(
        x, g, s[0], t, weight_decay=1e-2, **kw), 1),
}


@pytest.mark.parametrize("optimizer", list(STEPS))
@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_sorted_unique_path_equals_segment_sum_path(rng, optimizer, mode, dtype, num_threads):
    step, n_slots = STEPS[optimizer]
    x0 = rng.standard_normal((300, 70)).astype(dtype)  # big enough for 2 threads' split
    runs = {}
    for flag in (False, True):
        x = x0.copy()
        slots = [np.zeros_like(x) for _ in range(n_slots)]
        last = np.zeros(x.shape[0], dtype=np.int64) if mode == "catchup" else None
        for t in range(1, 5):  # the same matrices for both runs; rows 0.. idle some steps
            X = _csr(np.random.default_rng(t), n=30, n_cols=300, density=0.1, dtype=dtype,
                     canonical=False)
            dz = np.random.default_rng(100 + t).standard_normal((30, 70)).astype(dtype)
            if flag:
                grad = csr_transpose_dot(X, dz)
            else:
                idx, values = _repeated_rows(X, dz)
                grad = fastadam.IndexedSlices(values, idx, x.shape)
            step(x, grad, slots, t, mode=mode, last_step=last, num_threads=num_threads,
                 indices_sorted_unique=flag)
        runs[flag] = [x] + slots + ([last] if last is not None else [])
    for a, b in zip(runs[False], runs[True]):
        assert a.tobytes() == b.tobytes()


def test_sorted_unique_path_with_a_csr_gradient(rng):
    x0 = rng.standard_normal((20, 30))
    G = _csr(rng, n=20, n_cols=30, density=0.2)  # canonical: flat positions increase
    out = {}
    for flag in (False, True):
        x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        fastadam.sparse_step_inplace(x, G, m, v, 1, indices_sorted_unique=flag)
        out[flag] = (x, m, v)
    for a, b in zip(out[False], out[True]):
        assert a.tobytes() == b.tobytes()


def _step(indices, **kw):
    x = np.zeros((10, 2))
    values = np.ones((len(indices), 2))
    fastadam.sparse_step_inplace(x, fastadam.IndexedSlices(values, np.asarray(indices), x.shape),
                                 np.zeros_like(x), np.zeros_like(x), 1, **kw)
    return x


def test_sorted_unique_rejects_a_repeated_index_and_changes_nothing():
    x = np.zeros((10, 2))
    m, v = np.zeros_like(x), np.zeros_like(x)
    g = fastadam.IndexedSlices(np.ones((3, 2)), np.array([1, 4, 4]), x.shape)
    with pytest.raises(ValueError, match=r"indices: indices_sorted_unique=True needs strictly "
                                         r"increasing indices, but position 2 holds 4 after 4"):
        fastadam.sparse_step_inplace(x, g, m, v, 1, indices_sorted_unique=True)
    assert not x.any() and not m.any() and not v.any()


def test_sorted_unique_rejects_a_decreasing_index():
    with pytest.raises(ValueError, match="position 1 holds 2 after 5"):
        _step([5, 2, 7], indices_sorted_unique=True)


def test_sorted_unique_rejects_a_negative_index():
    with pytest.raises(IndexError, match="indices: negative index -1"):
        _step([-1, 2], indices_sorted_unique=True)


def test_sorted_unique_rejects_an_index_out_of_range():
    with pytest.raises(IndexError, match="indices: index 10 is out of range for 10 rows"):
        _step([2, 10], indices_sorted_unique=True)


def test_sorted_unique_rejects_float_indices():
    x = np.zeros((10, 2))
    with pytest.raises(TypeError, match="indices: expected int32 or int64 indices, got float64"):
        fastadam.sparse_step_inplace(x, (np.array([1.0, 2.0]), np.ones((2, 2))),
                                     np.zeros_like(x), np.zeros_like(x), 1,
                                     indices_sorted_unique=True)


def test_sorted_unique_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="indices_sorted_unique: expected a bool, got int"):
        _step([1, 2], indices_sorted_unique=1)


def test_sorted_unique_rejects_an_unsorted_csr_gradient(rng):
    G = sp.csr_matrix((np.ones(2), np.array([3, 1]), np.array([0, 2, 2])), shape=(2, 5))
    x = np.zeros((2, 5))
    with pytest.raises(ValueError, match="grad: indices_sorted_unique=True needs strictly"):
        fastadam.sparse_step_inplace(x, G, np.zeros_like(x), np.zeros_like(x), 1,
                                     indices_sorted_unique=True)


@pytest.mark.parametrize("layout", ["int32", "int64", "big-endian", "strided", "uint32"])
def test_sorted_unique_check_for_every_index_layout(layout):
    """The one-pass check (native contiguous int32/int64) and the NumPy one (anything else)
    accept the same increasing indices and name the same first bad position."""
    good = np.array([0, 2, 3, 7, 9])
    bad = np.array([0, 2, 2, 7, 9])
    make = {"int32": lambda a: a.astype(np.int32), "int64": lambda a: a.astype(np.int64),
            "big-endian": lambda a: a.astype(">i8"),
            "strided": lambda a: np.repeat(a, 2)[::2],
            "uint32": lambda a: a.astype(np.uint32)}[layout]
    want = _step(good)
    np.testing.assert_array_equal(_step(make(good), indices_sorted_unique=True), want)
    with pytest.raises(ValueError, match="position 2 holds 2 after 2"):
        _step(make(bad), indices_sorted_unique=True)


# ---- csr_transpose_dot's errors (one per message) -------------------------------------------

def test_csr_transpose_dot_rejects_a_dense_X():
    with pytest.raises(TypeError, match="X: expected a SciPy CSR matrix or array, got format "
                                        "'ndarray'"):
        csr_transpose_dot(np.ones((2, 2)), np.ones((2, 1)))


def test_csr_transpose_dot_rejects_csc():
    with pytest.raises(TypeError, match=r"got format 'csc' \(convert with .tocsr\(\)\)"):
        csr_transpose_dot(sp.csc_matrix(np.ones((2, 2))), np.ones((2, 1)))


def test_csr_transpose_dot_rejects_integer_data():
    with pytest.raises(TypeError, match="X: expected float32 or float64 data, got int64"):
        csr_transpose_dot(sp.csr_matrix(np.ones((2, 2), dtype=np.int64)), np.ones((2, 1)))


def test_csr_transpose_dot_rejects_dz_of_another_dtype():
    with pytest.raises(TypeError, match=r"dz: expected dtype float64 \(the dtype of X\), got "
                                        "float32"):
        csr_transpose_dot(sp.csr_matrix(np.ones((2, 2))), np.ones((2, 1), dtype=np.float32))


def test_csr_transpose_dot_rejects_dz_that_is_not_an_array():
    with pytest.raises(TypeError, match="dz: expected a numpy.ndarray, got list"):
        csr_transpose_dot(sp.csr_matrix(np.ones((2, 2))), [[1.0], [2.0]])


def test_csr_transpose_dot_rejects_dz_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"dz: expected shape \(2, K\) \(one row per row of X\), "
                                         r"got \(3, 1\)"):
        csr_transpose_dot(sp.csr_matrix(np.ones((2, 2))), np.ones((3, 1)))


def test_csr_transpose_dot_rejects_a_column_index_out_of_range():
    X = sp.csr_matrix((np.ones(2), np.array([0, 5]), np.array([0, 1, 2])), shape=(2, 3),
                      copy=False)
    with pytest.raises(IndexError, match="X.indices: index 5 is out of range for 3 columns"):
        csr_transpose_dot(X, np.ones((2, 1)))


def test_csr_transpose_dot_rejects_a_decreasing_indptr():
    X = sp.csr_matrix(np.eye(3))
    X.indptr = np.array([0, 2, 1, 3], dtype=X.indptr.dtype)
    with pytest.raises(ValueError, match=r"X: invalid CSR indptr \(decreasing"):
        csr_transpose_dot(X, np.ones((3, 1)))


def test_wide_matrix_ordering_fallback_gives_the_same_result(rng, monkeypatch):
    """Matrices of 2**31 columns or more order the distinct columns with a stable argsort
    instead of the packed (column, slot) sort: forced here on a small matrix."""
    from fastadam.sparse import _csr as csr_kernels
    X = _csr(rng, canonical=False)
    dz = rng.standard_normal((X.shape[0], 3))
    packed = csr_transpose_dot(X, dz)
    monkeypatch.setattr(csr_kernels, "PACK_LIMIT", 0)
    wide = csr_transpose_dot(X, dz)
    np.testing.assert_array_equal(packed.indices, wide.indices)
    assert packed.values.tobytes() == wide.values.tobytes()


def test_a_walk_over_more_entries_than_its_slot_table_holds_is_rejected(rng, monkeypatch):
    """The hash table holds int32 slots: more stored entries in one walk raise a ValueError
    (the limit, 2**31 - 1, is lowered here to test the message)."""
    from fastadam.sparse import _csr as csr_kernels
    monkeypatch.setattr(csr_kernels, "SLOT_LIMIT", 5)
    X = sp.csr_matrix(np.ones((2, 4)))
    with pytest.raises(ValueError, match="the rows hold 8 stored entries; at most 5 per call"):
        csr_transpose_dot(X, np.ones((2, 3)))
    monkeypatch.setattr(csr_kernels, "SLOT_LIMIT", 8)
    np.testing.assert_array_equal(csr_transpose_dot(X, np.ones((2, 3))).values, 2 * np.ones((4, 3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 3, 4, 5])
@pytest.mark.parametrize("lookup", ["column map", "hash table"])
def test_batch_walk_product_equals_scipy_bit_for_bit(rng, dtype, k, lookup, monkeypatch):
    """dot_and_columns' forward product z = X[rows] @ W (k == 4 keeps a row's sums in
    registers) against SciPy's product of the gathered rows, and its columns / entry ranks
    against np.unique, with either slot lookup (the direct column map is left all -1)."""
    from fastadam.sparse import _csr as csr_kernels
    monkeypatch.setattr(csr_kernels, "DIRECT_MAP_RATIO", 10**6 if lookup == "column map" else 0)
    from fastadam._core._sparse_host import check_csr_structure
    X = _csr(rng, n=60, n_cols=500, density=0.05, dtype=dtype, canonical=False)
    W = rng.standard_normal((500, k)).astype(dtype)
    rows = rng.permutation(60)[:45].astype(np.int64)
    indptr, cols, data = check_csr_structure(X, "X")
    z = np.empty((45, k), dtype=dtype)
    touched, rank = csr_kernels.dot_and_columns(indptr, cols, data, rows, 500, W, z)
    assert z.tobytes() == np.asarray(X[rows] @ W).astype(dtype).tobytes()
    walked = np.concatenate([X.indices[X.indptr[r]:X.indptr[r + 1]] for r in rows])
    np.testing.assert_array_equal(touched, np.unique(walked))
    np.testing.assert_array_equal(touched[rank], walked)
    if lookup == "column map":
        assert np.all(csr_kernels._maps.map == -1)
