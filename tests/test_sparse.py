"""Sparse Adam (fastadam.sparse_step_inplace) and the deterministic segment sum.

Compared with the float64 oracles in tests/reference.py, with fastadam.step_inplace on the
densified gradient (dense mode, bit for bit), with np.add.at (segment sum, bit for bit) and with
torch.optim.SparseAdam when PyTorch is installed (lazy mode).
"""
import numpy as np
import pytest

import fastadam
from reference import (adam_reference, segment_sum_reference, sparse_adam_reference,
                       torch_sparse_adam_formula)

DTYPES = [np.float32, np.float64]
MODES = ["lazy", "dense", "catchup"]
TOL = {np.float32: dict(rtol=2e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}


def make_problem(n_rows, row_shape, k, dtype, seed=0, index_dtype=np.int64, zipf=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows,) + row_shape).astype(dtype)
    m = (0.1 * rng.standard_normal(x.shape)).astype(dtype)
    v = (0.01 * rng.random(x.shape)).astype(dtype)
    if zipf:
        idx = (rng.zipf(1.3, size=k) - 1) % max(n_rows, 1)
    else:
        idx = rng.integers(0, max(n_rows, 1), size=k)
    values = rng.standard_normal((k,) + row_shape).astype(dtype)
    return x, m, v, idx.astype(index_dtype), values


def dense_grad(n_rows, row_shape, idx, values):
    g = np.zeros((n_rows,) + row_shape, dtype=values.dtype)
    np.add.at(g, idx, values)
    return g


# ---------------------------------------------------------------------------------------------
# segment_sum
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("k", [0, 1, 15, 16, 17, 1001])
@pytest.mark.parametrize("row_shape", [(), (3,), (2, 17)])
def test_segment_sum_equals_add_at(dtype, index_dtype, k, row_shape):
    rng = np.random.default_rng(k)
    idx = rng.integers(0, 50, size=k).astype(index_dtype)
    values = rng.standard_normal((k,) + row_shape).astype(dtype)
    rows, sums = fastadam.segment_sum(idx, values)
    ref_rows, ref_sums = segment_sum_reference(idx, values, dtype=dtype)
    assert rows.dtype == index_dtype and sums.dtype == dtype
    assert sums.shape == (len(ref_rows),) + row_shape
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(sums, ref_sums)  # bit for bit: same order of additions


def test_segment_sum_adds_in_original_order():
    # float32 sums that depend on the order: 1e8 + 1 - 1e8 = 0 but 1e8 - 1e8 + 1 = 1.
    idx = np.array([3, 3, 0, 3], dtype=np.int32)
    values = np.array([1e8, 1.0, 7.0, -1e8], dtype=np.float32)
    rows, sums = fastadam.segment_sum(idx, values)
    np.testing.assert_array_equal(rows, [0, 3])
    np.testing.assert_array_equal(sums, np.array([7.0, 0.0], dtype=np.float32))
    rows, sums = fastadam.segment_sum(idx[[0, 3, 2, 1]], values[[0, 3, 2, 1]])
    np.testing.assert_array_equal(sums, np.array([7.0, 1.0], dtype=np.float32))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_segment_sum_wide_keys_take_three_radix_passes(index_dtype):
    idx = np.array([2**31 - 1, 0, 5, 2**31 - 1, 2**20 + 3, 5, 2**11], dtype=index_dtype)
    values = np.arange(7 * 2, dtype=np.float64).reshape(7, 2)
    rows, sums = fastadam.segment_sum(idx, values)
    ref_rows, ref_sums = segment_sum_reference(idx, values)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(sums, ref_sums)


def test_segment_sum_keys_beyond_32_bits_use_the_fallback_sort():
    idx = np.array([2**40, 3, 2**40, 2**33 + 1, 3], dtype=np.int64)
    values = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    rows, sums = fastadam.segment_sum(idx, values)
    np.testing.assert_array_equal(rows, [3, 2**33 + 1, 2**40])
    np.testing.assert_array_equal(sums, [18.0, 8.0, 5.0])


@pytest.mark.parametrize("zipf", [False, True])
def test_segment_sum_is_bit_identical_across_threads_and_runs(zipf):
    _, _, _, idx, values = make_problem(5000, (64,), 20000, np.float32, seed=3, zipf=zipf)
    rows1, sums1 = fastadam.segment_sum(idx, values, num_threads=1)
    rows2, sums2 = fastadam.segment_sum(idx, values, num_threads=2)
    rows3, sums3 = fastadam.segment_sum(idx, values, num_threads=2)
    rows4, sums4 = fastadam.segment_sum(idx, values, num_threads=3)
    for r, s in ((rows2, sums2), (rows3, sums3), (rows4, sums4)):
        np.testing.assert_array_equal(r, rows1)
        assert s.tobytes() == sums1.tobytes()
    np.testing.assert_array_equal(sums1, segment_sum_reference(idx, values, np.float32)[1])


def test_segment_sum_accepts_read_only_and_strided_inputs():
    idx = np.array([4, 1, 4, 2, 1, 1], dtype=np.int64)
    values = np.arange(12, dtype=np.float32).reshape(6, 2)
    idx.flags.writeable = False
    values.flags.writeable = False
    rows, sums = fastadam.segment_sum(idx[::2], values[::2, ::-1])
    ref_rows, ref_sums = segment_sum_reference(idx[::2], values[::2, ::-1], np.float32)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(sums, ref_sums)


@pytest.mark.parametrize("idx, values, exc, match", [
    (np.array([0, -1]), np.zeros(2), IndexError, "indices: negative index -1"),
    (np.array([0.0, 1.0]), np.zeros(2), TypeError, "indices: expected int32 or int64"),
    ([0, 1], np.zeros(2), TypeError, "indices: expected a numpy.ndarray"),
    (np.zeros((2, 1), np.int64), np.zeros(2), ValueError, "indices: expected a 1-D array"),
    (np.array([0, 1]), np.zeros(3), ValueError, r"values: expected shape \(2,\)"),
    (np.array([0, 1]), np.zeros(2, np.int64), TypeError, "values: expected float32 or float64"),
    (np.array([0, 1]), np.float64(1.0), TypeError, "values: expected a numpy.ndarray"),
    (np.array([0, 1], np.uint32), np.zeros(2), TypeError, "indices: expected int32 or int64"),
])
def test_segment_sum_errors(idx, values, exc, match):
    with pytest.raises(exc, match=match):
        fastadam.segment_sum(idx, values)


# ---------------------------------------------------------------------------------------------
# sparse_step_inplace: exactness
# ---------------------------------------------------------------------------------------------

HYPER = [
    dict(),
    dict(convention="torch", lr=3e-3),
    dict(convention="onnx", beta1=0.8, beta2=0.99),
    dict(weight_decay=0.05),
    dict(weight_decay=0.1, decoupled_weight_decay=True, lr=1e-2),
    dict(maximize=True, eps=1e-6),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hyper", HYPER)
@pytest.mark.parametrize("mode", MODES)
def test_one_step_matches_float64_reference(dtype, hyper, mode):
    x, m, v, idx, values = make_problem(40, (5,), 60, dtype, seed=1)
    last = np.random.default_rng(2).integers(0, 4, size=40).astype(np.int64)
    t = 5
    ref = sparse_adam_reference(x, idx, values, m, v, t, mode=mode, last_step=last, **hyper)
    kwargs = dict(last_step=last) if mode == "catchup" else {}
    fastadam.sparse_step_inplace(x, (idx, values), m, v, t, mode=mode, **hyper, **kwargs)
    for got, want in zip((x, m, v), ref[:3]):
        np.testing.assert_allclose(got, want, **TOL[dtype])
    if mode == "catchup":
        np.testing.assert_array_equal(last, ref[3])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hyper", HYPER)
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("k", [0, 1, 17, 3000])
def test_dense_mode_is_step_inplace_on_the_densified_gradient(dtype, hyper, num_threads, k):
    x, m, v, idx, values = make_problem(2500, (64,), k, dtype, seed=k)
    g = dense_grad(2500, (64,), idx, values)
    x2, m2, v2 = x.copy(), m.copy(), v.copy()
    fastadam.step_inplace(x2, g, m2, v2, 3, **hyper)
    grad = fastadam.IndexedSlices(values, idx, x.shape)
    fastadam.sparse_step_inplace(x, grad, m, v, 3, mode="dense", num_threads=num_threads,
                                 **hyper)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(m, m2)
    np.testing.assert_array_equal(v, v2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["lazy", "catchup"])
def test_lazy_modes_change_only_touched_rows_and_equal_dense_step_there(dtype, mode):
    x, m, v, idx, values = make_problem(300, (7,), 100, dtype, seed=4)
    x0, m0, v0 = x.copy(), m.copy(), v.copy()
    last = np.zeros(300, np.int64)
    touched = np.unique(idx)
    untouched = np.setdiff1d(np.arange(300), touched)
    g = dense_grad(300, (7,), idx, values)
    xd, md, vd = x[touched].copy(), m[touched].copy(), v[touched].copy()
    fastadam.step_inplace(xd, g[touched], md, vd, 1, weight_decay=0.01)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, mode=mode, weight_decay=0.01,
                                 last_step=last if mode == "catchup" else None)
    for got, before in ((x, x0), (m, m0), (v, v0)):
        np.testing.assert_array_equal(got[untouched], before[untouched])
    # t = 1 after last_step = 0: no idle step, so catchup is lazy here; both equal the dense
    # kernel on the touched rows bit for bit.
    np.testing.assert_array_equal(x[touched], xd)
    np.testing.assert_array_equal(m[touched], md)
    np.testing.assert_array_equal(v[touched], vd)
    if mode == "catchup":
        assert (last[touched] == 1).all() and (last[untouched] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_step_run_with_idle_rows(dtype):
    """Rows go idle for a while: lazy, dense and catchup against their float64 oracles, and
    catchup's m, v against dense mode's (bit for bit after one idle step, close after more)."""
    n, row = 30, (4,)
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((n,) + row).astype(dtype)
    state = {mode: [x0.copy(), np.zeros_like(x0), np.zeros_like(x0)] for mode in MODES}
    ref = {mode: [x0.astype(np.float64), np.zeros(x0.shape), np.zeros(x0.shape)]
           for mode in MODES}
    last = np.zeros(n, np.int64)
    ref_last = np.zeros(n, np.int64)
    for t in range(1, 25):
        # rows 0-9 every step, 10-19 every 5th step, 20-29 once (at t = 2) and at t = 24
        idx = list(range(10)) * 2
        if t % 5 == 0:
            idx += list(range(10, 20))
        if t in (2, 24):
            idx += list(range(20, 30))
        idx = rng.permutation(np.array(idx, dtype=np.int32))
        values = rng.standard_normal((len(idx),) + row).astype(dtype)
        for mode in MODES:
            xs, ms, vs = state[mode]
            extra = dict(last_step=last) if mode == "catchup" else {}
            fastadam.sparse_step_inplace(xs, (idx, values), ms, vs, t, mode=mode, lr=1e-2,
                                         **extra)
            r = ref[mode]
            out = sparse_adam_reference(r[0], idx, values, r[1], r[2], t, mode=mode, lr=1e-2,
                                        last_step=ref_last if mode == "catchup" else None)
            ref[mode] = list(out[:3])
            if mode == "catchup":
                ref_last = out[3]
        np.testing.assert_array_equal(last, ref_last)
        if t == 6:  # rows 10-19: touched at 5 and 6, and rows 0-9 every step: no idle step yet
            np.testing.assert_array_equal(state["catchup"][1][:10], state["dense"][1][:10])
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-14)
    for mode in MODES:
        for got, want in zip(state[mode], ref[mode]):
            np.testing.assert_allclose(got, want, **tol)
    # catchup keeps m and v where dense mode has them, once the decays still owed since each
    # row's last touch are applied (x differs: idle rows did not move)
    owed = (24 - last).astype(np.float64)[:, None]
    np.testing.assert_allclose(state["catchup"][1] * 0.9 ** owed, state["dense"][1], **tol)
    np.testing.assert_allclose(state["catchup"][2] * 0.999 ** owed, state["dense"][2], **tol)
    assert (last[10:20] == 20).all()  # rows 10-19 still owe 4 decays: the check above needs them
    assert not np.allclose(state["catchup"][0][20:], state["dense"][0][20:], rtol=1e-7, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("maximize", [False, True])
def test_catchup_m_v_are_bit_identical_to_dense_mode_for_short_gaps(dtype, maximize):
    """Gaps of up to 64 idle steps are replayed decay by decay: m and v equal dense mode's bit
    for bit once a row is touched again; a 70-step gap is one multiplication (a few ulps)."""
    n = 8
    x, m, v, _, _ = make_problem(n, (33,), 0, dtype, seed=9)
    xd, md, vd = x.copy(), m.copy(), v.copy()
    last = np.zeros(n, np.int64)
    rng = np.random.default_rng(1)
    gap = {0: 1, 1: 2, 2: 3, 3: 7, 4: 64, 5: 65, 6: 70, 7: 1}  # row -> touched every gap + 1
    final = 2 + 71 * 2
    for t in range(1, final + 1):
        idx = [r for r in range(n) if t == 1 or t == final or (t - 1) % (gap[r] + 1) == 0]
        idx = np.array(idx * 2, dtype=np.int64)
        values = rng.standard_normal((len(idx), 33)).astype(dtype)
        fastadam.sparse_step_inplace(x, (idx, values), m, v, t, mode="catchup", last_step=last,
                                     maximize=maximize)
        fastadam.sparse_step_inplace(xd, (idx, values), md, vd, t, mode="dense",
                                     maximize=maximize)
    assert (last == final).all()
    short = [0, 1, 2, 3, 4, 7]
    np.testing.assert_array_equal(m[short], md[short])
    np.testing.assert_array_equal(v[short], vd[short])
    np.testing.assert_allclose(m[[5, 6]], md[[5, 6]], rtol=1e-5 if dtype == np.float32 else 1e-13)
    np.testing.assert_allclose(v[[5, 6]], vd[[5, 6]], rtol=1e-5 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lazy_mode_matches_torch_sparse_adam(dtype):
    torch = pytest.importorskip("torch")
    x, _, _, _, _ = make_problem(200, (16,), 0, dtype, seed=5)
    m, v = np.zeros_like(x), np.zeros_like(x)
    param = torch.nn.Parameter(torch.from_numpy(x.copy()))
    opt = torch.optim.SparseAdam([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    rng = np.random.default_rng(11)
    xr, mr, vr = x.astype(np.float64), np.zeros(x.shape), np.zeros(x.shape)
    for t in range(1, 8):
        idx = rng.integers(0, 60 if t < 4 else 200, size=150)  # many duplicates, idle rows
        values = rng.standard_normal((150, 16)).astype(dtype)
        param.grad = torch.sparse_coo_tensor(torch.from_numpy(idx)[None], torch.from_numpy(values),
                                             x.shape, check_invariants=True)
        opt.step()
        fastadam.sparse_step_inplace(x, (idx, values), m, v, t, lr=1e-2, beta2=0.99)
        xr, mr, vr = torch_sparse_adam_formula(xr, idx, values, mr, vr, t, lr=1e-2, beta2=0.99)
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(x, param.detach().numpy(), **tol)
    np.testing.assert_allclose(m, opt.state[param]["exp_avg"].numpy(), **tol)
    np.testing.assert_allclose(v, opt.state[param]["exp_avg_sq"].numpy(), **tol)
    np.testing.assert_allclose(x, xr, **tol)


@pytest.mark.parametrize("shape", [(50,), (20, 3, 4)])
@pytest.mark.parametrize("mode", MODES)
def test_any_rank_of_x(shape, mode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    m, v = np.zeros(shape), np.full(shape, 0.5)
    idx = rng.integers(0, shape[0], size=30).astype(np.int32)
    values = rng.standard_normal((30,) + shape[1:])
    last = np.ones(shape[0], np.int64)
    ref = sparse_adam_reference(x, idx, values, m, v, 4, mode=mode, last_step=last)
    fastadam.sparse_step_inplace(x, fastadam.IndexedSlices(values, idx, shape), m, v, 4,
                                 mode=mode, last_step=last if mode == "catchup" else None)
    for got, want in zip((x, m, v), ref[:3]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["empty", "all_duplicates", "every_row", "unsorted"])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_shapes_sweep(dtype, case, mode):
    n = 64
    rng = np.random.default_rng(3)
    idx = {"empty": np.zeros(0, np.int64), "all_duplicates": np.full(500, 17, np.int64),
           "every_row": rng.permutation(np.repeat(np.arange(n), 3)),
           "unsorted": np.arange(n)[::-1].copy()}[case]
    x = rng.standard_normal((n, 9)).astype(dtype)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    values = rng.standard_normal((len(idx), 9)).astype(dtype)
    last = np.zeros(n, np.int64)
    ref = sparse_adam_reference(x, idx, values, m, v, 1, mode=mode, last_step=last)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, mode=mode,
                                 last_step=last if mode == "catchup" else None)
    for got, want in zip((x, m, v), ref[:3]):
        np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("zipf", [False, True])
def test_steps_are_bit_identical_across_threads_and_runs(mode, zipf):
    results = []
    for num_threads in (1, 2, 2, 3):
        x, m, v, idx, values = make_problem(4000, (64,), 6000, np.float32, seed=8, zipf=zipf)
        last = np.zeros(4000, np.int64)
        for t in (1, 2, 3):
            fastadam.sparse_step_inplace(x, (idx[: 6000 // t], values[: 6000 // t]), m, v, t,
                                         mode=mode, num_threads=num_threads, weight_decay=0.01,
                                         last_step=last if mode == "catchup" else None)
        results.append((x.tobytes(), m.tobytes(), v.tobytes(), last.tobytes()))
    assert all(r == results[0] for r in results[1:])


# ---------------------------------------------------------------------------------------------
# CSR gradients
# ---------------------------------------------------------------------------------------------

def make_csr(kind, dtype, shape=(12, 10)):
    sp = pytest.importorskip("scipy.sparse")
    # duplicates (row 2, col 5 three times) and unsorted column indices
    indptr = np.array([0, 2, 2, 6, 6, 6, 8, 8, 8, 8, 8, 9, 9])
    cols = np.array([3, 1, 5, 0, 5, 5, 9, 2, 4])
    data = np.array([1.0, -2.0, 0.5, 3.0, 0.25, -1.5, 2.0, 4.0, -0.75], dtype=dtype)
    cls = sp.csr_array if kind == "array" else sp.csr_matrix
    return cls((data, cols, indptr), shape=shape)


@pytest.mark.parametrize("kind", ["matrix", "array"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_csr_lazy_updates_only_stored_elements(kind, dtype):
    grad = make_csr(kind, dtype)
    assert not grad.has_canonical_format
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 10)).astype(dtype)
    m, v = np.zeros_like(x), np.zeros_like(x)
    x0 = x.copy()
    touched = np.zeros((12, 10), bool)
    coo = grad.tocoo()
    touched[coo.row, coo.col] = True
    g = grad.toarray()
    xr, mr, vr, _ = adam_reference(x, g, m, v, 1)
    fastadam.sparse_step_inplace(x, grad, m, v, 1)
    np.testing.assert_array_equal(x[~touched], x0[~touched])
    np.testing.assert_array_equal(m[~touched], 0)
    np.testing.assert_allclose(x[touched], xr[touched], **TOL[dtype])
    np.testing.assert_allclose(m[touched], mr[touched], **TOL[dtype])


@pytest.mark.parametrize("kind", ["matrix", "array"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_csr_dense_mode_is_step_inplace_on_toarray(kind, dtype):
    grad = make_csr(kind, dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 10)).astype(dtype)
    m, v = np.full_like(x, 0.1), np.full_like(x, 0.2)
    x2, m2, v2 = x.copy(), m.copy(), v.copy()
    fastadam.step_inplace(x2, grad.toarray(), m2, v2, 2, weight_decay=0.1)
    fastadam.sparse_step_inplace(x, grad, m, v, 2, mode="dense", weight_decay=0.1)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(m, m2)
    np.testing.assert_array_equal(v, v2)


def test_csr_catchup_tracks_each_element():
    grad = make_csr("matrix", np.float64)
    x = np.ones((12, 10))
    m, v = np.zeros_like(x), np.zeros_like(x)
    last = np.zeros((12, 10), np.int64)
    fastadam.sparse_step_inplace(x, grad, m, v, 3, mode="catchup", last_step=last)
    np.testing.assert_array_equal(last != 0, grad.toarray() != 0)
    assert last.max() == 3


# ---------------------------------------------------------------------------------------------
# Bad input: clear exceptions, and nothing changed
# ---------------------------------------------------------------------------------------------

def base_args(dtype=np.float32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype(dtype)
    m = np.full_like(x, 0.5)
    v = np.full_like(x, 0.25)
    idx = np.array([1, 3, 3, 9], np.int64)
    values = np.ones((4, 4), dtype)
    return x, m, v, idx, values


def bad_cases():
    f32 = np.float32
    sp = pytest.importorskip("scipy.sparse")
    return [
        (dict(grad=(np.array([1, 10]), np.ones((2, 4), f32))), IndexError,
         "indices: index 10 is out of range for 10 rows"),
        (dict(grad=(np.array([1, -1]), np.ones((2, 4), f32))), IndexError,
         "indices: negative index -1; negative indices are not allowed"),
        (dict(grad=(np.array([1.0, 2.0]), np.ones((2, 4), f32))), TypeError,
         "indices: expected int32 or int64 indices, got float64"),
        (dict(grad=(np.array([1, 2]), np.ones((2, 3), f32))), ValueError,
         r"values: expected shape \(2, 4\), got \(2, 3\)"),
        (dict(grad=(np.array([1, 2]), np.ones((2, 4), np.float64))), TypeError,
         "values: expected dtype float32 \\(the dtype of x\\), got float64"),
        (dict(grad=(np.array([1, 2]), [[1.0] * 4] * 2)), TypeError,
         "values: expected a numpy.ndarray, got list"),
        (dict(grad=np.ones((10, 4), f32)), TypeError,
         "grad: expected an IndexedSlices, an \\(indices, values\\) pair or a SciPy CSR"),
        (dict(grad=fastadam.IndexedSlices(np.ones((1, 4), f32), [0], (11, 4))), ValueError,
         r"grad: dense_shape \(11, 4\) does not match x.shape \(10, 4\)"),
        (dict(grad=sp.csr_matrix((10, 5), dtype=f32)), ValueError,
         r"grad: CSR shape \(10, 5\) does not match x.shape \(10, 4\)"),
        (dict(grad=sp.coo_matrix((10, 4), dtype=f32)), TypeError,
         "grad: expected a SciPy CSR matrix or array, got format 'coo'"),
        (dict(grad=sp.csr_matrix(np.ones((10, 4)))), TypeError,
         "grad.data: expected dtype float32 \\(the dtype of x\\), got float64"),
        (dict(mode="catchup"), ValueError, "last_step: catchup mode needs last_step"),
        (dict(mode="catchup", last_step=np.zeros(9, np.int64)), ValueError,
         r"last_step: expected shape \(10,\), got \(9,\)"),
        (dict(mode="catchup", last_step=np.zeros(10, np.int32)), TypeError,
         "last_step: expected dtype int64, got int32"),
        (dict(mode="catchup", last_step=np.full(10, 5, np.int64)), ValueError,
         "last_step: expected 0 <= last_step < t=5 for every touched row, got 5"),
        (dict(mode="catchup", last_step=np.full(10, -2, np.int64)), ValueError,
         "last_step: expected 0 <= last_step < t=5 for every touched row, got -2"),
        (dict(mode="lazy", last_step=np.zeros(10, np.int64)), ValueError,
         "last_step: only used in catchup mode"),
        (dict(mode="sparse"), ValueError, "mode: expected one of"),
        (dict(beta1=1.0), ValueError, "beta1: expected 0 <= beta1 < 1"),
        (dict(eps=0.0), ValueError, "eps: expected eps > 0"),
        (dict(lr=float("nan")), ValueError, "lr: expected a finite number"),
        (dict(convention="keras"), ValueError, "convention: expected one of"),
        (dict(t=0), ValueError, "t: expected a step number >= 1"),
        (dict(t=1.5), TypeError, "t: expected an int step number"),
        (dict(num_threads=0), ValueError, "num_threads: expected a non-zero int"),
    ]


def test_every_bad_input_raises_and_changes_nothing():
    for overrides, exc, match in bad_cases():
        x, m, v, idx, values = base_args()
        last = overrides.get("last_step")
        last_before = None if last is None else last.copy()
        kwargs = dict(grad=(idx, values), t=5)
        kwargs.update(overrides)
        before = (x.copy(), m.copy(), v.copy())
        with pytest.raises(exc, match=match):
            fastadam.sparse_step_inplace(x, kwargs.pop("grad"), m, v, kwargs.pop("t"),
                                         **kwargs)
        for got, want in zip((x, m, v), before):
            np.testing.assert_array_equal(got, want)
        if last is not None:
            np.testing.assert_array_equal(last, last_before)


@pytest.mark.parametrize("which", ["x", "m", "v"])
def test_read_only_state_is_rejected(which):
    x, m, v, idx, values = base_args()
    arrays = dict(x=x, m=m, v=v)
    arrays[which].flags.writeable = False
    with pytest.raises(ValueError, match=f"{which}: is read-only, but it is updated in place"):
        fastadam.sparse_step_inplace(arrays["x"], (idx, values), arrays["m"], arrays["v"], 1)


def test_state_of_wrong_dtype_shape_or_layout_is_rejected():
    x, m, v, idx, values = base_args()
    with pytest.raises(TypeError, match="m: expected dtype float32, got float64"):
        fastadam.sparse_step_inplace(x, (idx, values), m.astype(np.float64), v, 1)
    with pytest.raises(ValueError, match=r"v: expected shape \(10, 4\), got \(10, 3\)"):
        fastadam.sparse_step_inplace(x, (idx, values), m, v[:, :3].copy(), 1)
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        fastadam.sparse_step_inplace(np.ones((10, 8), np.float32)[:, ::2],
                                     (idx, values), m, v, 1)
    with pytest.raises(TypeError, match="x: expected float32 or float64 \\(sparse kernels\\)"):
        fastadam.sparse_step_inplace(x.astype(np.float16), (idx, values.astype(np.float16)),
                                     m.astype(np.float16), v.astype(np.float16), 1)
    with pytest.raises(ValueError, match="x: expected at least one dimension"):
        fastadam.sparse_step_inplace(np.zeros((), np.float32), (idx, values), m, v, 1)


def test_overlapping_buffers_are_rejected():
    x, m, v, idx, values = base_args()
    with pytest.raises(ValueError, match="share memory"):
        fastadam.sparse_step_inplace(x, (idx, values), x, v, 1)
    with pytest.raises(ValueError, match="x and values share memory"):
        fastadam.sparse_step_inplace(x, (np.arange(3), x[:3]), m, v, 1)
    last = np.zeros(10, np.int64)
    with pytest.raises(ValueError, match="share memory"):
        fastadam.sparse_step_inplace(x, (last[:4], values), m, v, 1, mode="catchup",
                                     last_step=last)


def test_gradient_as_a_list_pair():
    x, m, v, idx, values = base_args()
    ref = sparse_adam_reference(x, idx, values, m, v, 1)
    fastadam.sparse_step_inplace(x, [idx, values], m, v, 1)
    np.testing.assert_allclose(x, ref[0], **TOL[np.float32])


def test_read_only_gradient_is_fine():
    x, m, v, idx, values = base_args()
    idx.flags.writeable = False
    values.flags.writeable = False
    ref = sparse_adam_reference(x, idx, values, m, v, 1)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 1)
    np.testing.assert_allclose(x, ref[0], **TOL[np.float32])


@pytest.mark.parametrize("mode", MODES)
def test_nan_policy_propagates_into_the_touched_rows_only(mode):
    """As the dense step without skip_nonfinite: NaN propagates (IEEE), no exception."""
    x, m, v, idx, values = base_args(np.float64)
    values[1, 2] = np.nan  # row 3
    last = np.zeros(10, np.int64)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, mode=mode,
                                 last_step=last if mode == "catchup" else None)
    assert np.isnan(x[3, 2]) and np.isnan(m[3, 2]) and np.isnan(v[3, 2])
    mask = np.ones_like(x, bool)
    mask[3, 2] = False
    assert np.isfinite(x[mask]).all() and np.isfinite(m[mask]).all()


def test_public_names_are_exported():
    assert "segment_sum" in fastadam.__all__ and "sparse_step_inplace" in fastadam.__all__
    assert fastadam.sparse_step_inplace.__doc__.count("Weight decay rule") == 1


def test_segment_sum_results_do_not_share_the_sort_scratch():
    rows1, sums1 = fastadam.segment_sum(np.array([5, 2, 5]), np.ones((3, 2)))
    fastadam.segment_sum(np.array([9, 7, 8, 1, 0]), np.ones((5, 2)))  # reuses the scratch
    np.testing.assert_array_equal(rows1, [2, 5])
    np.testing.assert_array_equal(sums1, [[1.0, 1.0], [2.0, 2.0]])


def test_zero_width_rows_and_empty_tables():
    x = np.zeros((5, 0), np.float32)
    for mode in ("lazy", "dense"):
        fastadam.sparse_step_inplace(x, (np.array([1, 2]), np.zeros((2, 0), np.float32)),
                                     x.copy(), x.copy(), 1, mode=mode)
    rows, sums = fastadam.segment_sum(np.array([3, 1, 3]), np.zeros((3, 0)))
    np.testing.assert_array_equal(rows, [1, 3])
    assert sums.shape == (2, 0)
    empty = np.zeros((0, 4))
    fastadam.sparse_step_inplace(empty, (np.zeros(0, np.int64), np.zeros((0, 4))),
                                 empty.copy(), empty.copy(), 1, mode="dense")
    with pytest.raises(IndexError, match="indices: index 0 is out of range for 0 rows"):
        fastadam.sparse_step_inplace(empty, (np.array([0]), np.zeros((1, 4))), empty.copy(),
                                     empty.copy(), 1)


def test_csr_column_indices_are_range_checked():
    sp = pytest.importorskip("scipy.sparse")
    x = np.zeros((3, 4))
    for col, match in ((-1, "grad.indices: negative index -1"),
                       (4, "grad.indices: index 4 is out of range for 4 columns")):
        grad = sp.csr_matrix((np.array([1.0]), np.array([col]), np.array([0, 1, 1, 1])),
                             shape=(3, 4))
        with pytest.raises(IndexError, match=match):
            fastadam.sparse_step_inplace(x, grad, np.zeros_like(x), np.zeros_like(x), 1)
        assert not x.any()


def test_segment_sum_of_a_batch_beyond_the_cached_scratch():
    from fastadam._core import _sparse
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 5000, size=_sparse.SCRATCH_MAX + 5).astype(np.int32)
    values = rng.standard_normal(idx.shape[0]).astype(np.float32)
    rows, sums = fastadam.segment_sum(idx, values, num_threads=2)
    ref_rows, ref_sums = segment_sum_reference(idx, values, np.float32)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(sums, ref_sums)


def test_remaining_error_messages():
    x, m, v, idx, values = base_args()
    with pytest.raises(ValueError, match="t: catchup mode counts steps from 1, got t=0"):
        fastadam.sparse_step_inplace(x, (idx, values), m, v, 0, mode="catchup",
                                     convention="onnx", last_step=np.zeros(10, np.int64))
    with pytest.raises(ValueError, match="values: expected at least one dimension"):
        fastadam.segment_sum(np.array([0]), np.zeros(()))
    sp = pytest.importorskip("scipy.sparse")
    grad = sp.csr_matrix(np.ones((10, 4), np.float32))
    grad.indptr = grad.indptr[:5]
    with pytest.raises(ValueError, match="grad: invalid CSR indptr"):
        fastadam.sparse_step_inplace(x, grad, m, v, 1)
    grad = sp.csr_matrix(np.ones((10, 4), np.float32))
    grad.indptr[3] = 1  # decreasing
    with pytest.raises(ValueError, match="grad: invalid CSR indptr"):
        fastadam.sparse_step_inplace(x, grad, m, v, 1)
    with pytest.raises(ValueError, match="grad: a CSR gradient needs a 2-D x"):
        x3 = np.zeros((10, 4, 1), np.float32)
        fastadam.sparse_step_inplace(x3, grad, x3.copy(), x3.copy(), 1)
    np.testing.assert_array_equal(m, 0.5)


def test_onnx_convention_without_bias_correction():
    x, m, v, idx, values = base_args(np.float64)
    ref = sparse_adam_reference(x, idx, values, m, v, 0, convention="onnx")
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 0, convention="onnx")
    np.testing.assert_allclose(x, ref[0], **TOL[np.float64])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", [1, 7, 8, 9, 15, 16, 17, 33])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_threads", [1, 2])
def test_row_widths_around_the_simd_width(dtype, row, mode, num_threads):
    x, m, v, idx, values = make_problem(3000, (row,), 9000, dtype, seed=row, zipf=True)
    last = np.random.default_rng(row).integers(0, 3, size=3000).astype(np.int64)
    ref = sparse_adam_reference(x, idx, values, m, v, 4, mode=mode, last_step=last,
                                weight_decay=0.02)
    fastadam.sparse_step_inplace(x, (idx, values), m, v, 4, mode=mode, weight_decay=0.02,
                                 last_step=last if mode == "catchup" else None,
                                 num_threads=num_threads)
    # Zipf rows sum up to ~1000 float32 gradients: the sum's rounding shows near zero
    tol = dict(rtol=2e-5, atol=1e-5) if dtype == np.float32 else TOL[dtype]
    for got, want in zip((x, m, v), ref[:3]):
        np.testing.assert_allclose(got, want, **tol)
