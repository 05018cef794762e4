"""Sparse Adagrad and momentum (fastadam.sparse_adagrad_step_inplace,
sparse_momentum_step_inplace): the same row walk as sparse Adam with another element formula.

Dense mode must equal the dense step on the densified gradient bit for bit; the lazy modes
must change only the touched rows and equal the dense step restricted to them; catchup must
decay a returning row's momentum buffer as dense mode would have.
"""
import numpy as np
import pytest
import scipy.sparse

import fastadam
from reference import adagrad_reference, momentum_reference
from test_sparse import dense_grad, make_problem

DTYPES = [np.float32, np.float64]
STEPS = {
    "adagrad": (fastadam.adagrad_step_inplace, fastadam.sparse_adagrad_step_inplace,
                [dict(lr=0.1), dict(lr=0.1, weight_decay=0.05, convention="keras"),
                 dict(lr=0.05, lr_decay=0.1, convention="onnx", maximize=True)]),
    "momentum": (fastadam.momentum_step_inplace, fastadam.sparse_momentum_step_inplace,
                 [dict(lr=0.1), dict(lr=0.1, nesterov=True, weight_decay=0.05),
                  dict(lr=0.05, momentum=0.8, dampening=0.2, convention="onnx")]),
}


def problem(dtype, k=40, n_rows=30, row_shape=(5,), seed=0):
    x, m, v, idx, values = make_problem(n_rows, row_shape, k, dtype, seed=seed)
    return x, np.abs(v) + np.abs(m), idx, values   # one state slot, non-negative (Adagrad's h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(STEPS))
@pytest.mark.parametrize("num_threads", [1, 2])
def test_dense_mode_is_the_dense_step_on_the_densified_gradient(dtype, name, num_threads):
    dense, sparse, cases = STEPS[name]
    for hyper in cases:
        x, s, idx, values = problem(dtype, k=3000, n_rows=700, row_shape=(64,))
        g = dense_grad(x.shape[0], x.shape[1:], idx, values)
        xd, sd = x.copy(), s.copy()
        dense(xd, g, sd, 2, **hyper)
        sparse(x, (idx, values), s, 2, mode="dense", num_threads=num_threads, **hyper)
        assert x.tobytes() == xd.tobytes() and s.tobytes() == sd.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(STEPS))
@pytest.mark.parametrize("mode", ["lazy", "catchup"])
def test_lazy_modes_change_only_touched_rows(dtype, name, mode):
    dense, sparse, cases = STEPS[name]
    for hyper in cases:
        x, s, idx, values = problem(dtype)
        touched = np.unique(idx)
        g = dense_grad(x.shape[0], x.shape[1:], idx, values)
        xt, st = x[touched].copy(), s[touched].copy()
        dense(xt, g[touched], st, 1, **hyper)
        before = x.copy(), s.copy()
        last = np.zeros(x.shape[0], np.int64) if mode == "catchup" else None
        sparse(x, fastadam.IndexedSlices(values, idx, x.shape), s, 1, mode=mode,
               last_step=last, **hyper)
        untouched = np.setdiff1d(np.arange(x.shape[0]), touched)
        np.testing.assert_array_equal(x[untouched], before[0][untouched])
        np.testing.assert_array_equal(s[untouched], before[1][untouched])
        assert x[touched].tobytes() == xt.tobytes() and s[touched].tobytes() == st.tobytes()
        if mode == "catchup":
            np.testing.assert_array_equal(last[touched], 1)


def test_lazy_rows_follow_the_float64_oracles():
    x, s, idx, values = problem(np.float64)
    g = dense_grad(x.shape[0], x.shape[1:], idx, values)
    touched = np.unique(idx)
    want_x, want_h = adagrad_reference(x[touched], g[touched], s[touched], 1, lr=0.1)
    xa, ha = x.copy(), s.copy()
    fastadam.sparse_adagrad_step_inplace(xa, (idx, values), ha, 1, lr=0.1, eps=1e-10)
    np.testing.assert_allclose(xa[touched], want_x, rtol=1e-13)
    np.testing.assert_allclose(ha[touched], want_h, rtol=1e-13)
    want_x, want_v = momentum_reference(x[touched], g[touched], s[touched], 3, lr=0.1)
    xm, vm = x.copy(), s.copy()
    fastadam.sparse_momentum_step_inplace(xm, (idx, values), vm, 3, lr=0.1)
    np.testing.assert_allclose(xm[touched], want_x, rtol=1e-13)
    np.testing.assert_allclose(vm[touched], want_v, rtol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_momentum_catchup_buffer_equals_dense_mode(dtype):
    rng = np.random.default_rng(3)
    x, s, _, _ = problem(dtype, n_rows=20)
    xd, vd = x.copy(), np.zeros_like(x)
    xc, vc = x.copy(), np.zeros_like(x)
    last = np.zeros(x.shape[0], np.int64)
    for t in range(1, 90):  # gaps up to 80 idle steps: the exact replay and the power
        idx = rng.choice(20, size=3 if t % 40 else 0, replace=False).astype(np.int64)
        if t == 1:
            idx = np.arange(20, dtype=np.int64)
        values = rng.standard_normal((idx.size,) + x.shape[1:]).astype(dtype)
        fastadam.sparse_momentum_step_inplace(xd, (idx, values), vd, t, mode="dense", lr=0.01)
        fastadam.sparse_momentum_step_inplace(xc, (idx, values), vc, t, mode="catchup",
                                              last_step=last, lr=0.01)
        if idx.size:
            seen = np.unique(idx)
            # rows touched now: the buffer replayed its idle decays, then took the step
            rtol = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(vc[seen], vd[seen], rtol=rtol, atol=1e-30)


def test_csr_gradient_updates_only_stored_elements():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 9))
    h = np.full_like(x, 0.1)
    grad = scipy.sparse.random(6, 9, density=0.2, format="csr", random_state=1)
    before = x.copy()
    fastadam.sparse_adagrad_step_inplace(x, grad, h, 1, lr=0.5)
    stored = grad.toarray() != 0
    np.testing.assert_array_equal(x[~stored], before[~stored])
    want_x, _ = adagrad_reference(before, grad.toarray(), np.full_like(x, 0.1), 1, lr=0.5)
    np.testing.assert_allclose(x[stored], want_x[stored], rtol=1e-13)


def test_sparse_errors_name_the_argument():
    x, s, idx, values = problem(np.float32)
    with pytest.raises(ValueError, match=r"h: expected shape \(30, 5\)"):
        fastadam.sparse_adagrad_step_inplace(x, (idx, values), s[:3], 1)
    with pytest.raises(ValueError, match="mode: expected one of"):
        fastadam.sparse_momentum_step_inplace(x, (idx, values), s, 1, mode="eager")
    with pytest.raises(ValueError, match="v and x share memory|x and v share memory"):
        fastadam.sparse_momentum_step_inplace(x, (idx, values), x, 1)
    with pytest.raises(IndexError, match="indices: index 30 is out of range for 30 rows"):
        fastadam.sparse_adagrad_step_inplace(x, (np.array([30]), values[:1]), s, 1)
