"""Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD): one accumulator per row.

Against two oracles written from the formula: tests/reference.py's float64 one (FBGEMM's update,
numpy's own summation), and, below, one that follows the header's contract operation by
operation in the arrays' precision (the eight-lane sum order included), which the kernel must
equal bit for bit.  Then: N-D and 0-d parameters, threads, the sparse modes, every error
before any write, the optimizer object (state of one value per row, checkpoints) and
fastadam.torch's class against both the oracle and the NumPy object.  The table sweeps
(tests/optimizer_table.py's row) and the CPU levels (tests/cpu_level_kernels.py) cover the rest.
"""
import numpy as np
import pytest

import fastadam
from fastadam.sparse import IndexedSlices
from reference import rowwise_adagrad_reference

OPTIONS = [dict(lr=0.05), dict(lr=0.05, weight_decay=0.1),
           dict(lr=0.05, weight_decay=0.1, weight_decay_mode="decoupled", lr_decay=0.2),
           dict(lr=0.05, maximize=True, grad_scale=4.0, eps=1e-6),
           dict(lr=0.05, lr_decay=0.1, weight_decay=0.01)]
WIDTHS = [0, 1, 7, 8, 9, 33, 64, 67]


def exact_oracle(x, g, acc, t, *, lr=1e-2, lr_decay=0.0, eps=1e-8, weight_decay=0.0,
                 weight_decay_mode="l2", maximize=False, grad_scale=None):
    """include/fastadam/rowwise_adagrad.h's contract, one operation at a time in the arrays'
    dtype (NumPy rounds each float32 operation once, as the kernel without FMA contraction):
    the scalars folded in float64 then rounded, d = g' (+ l2 * x), eight lanes l[j] summing
    d[i]**2 for i = j (mod 8) in increasing i, ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))."""
    C = x.dtype.type
    rows = x.shape[0] if x.ndim else 1
    n = int(np.prod(x.shape[1:])) if x.ndim else 1
    x2 = x.reshape(rows, n).copy()
    g2 = g.reshape(rows, n)
    a = acc.reshape(-1).copy()
    rate = lr / (1.0 + (t - 1) * lr_decay) if lr_decay else lr
    l2 = C(weight_decay if weight_decay_mode == "l2" else 0.0)
    decay_mul = C(1.0 - rate * weight_decay if weight_decay_mode == "decoupled" else 1.0)
    lr_c, eps_c, sign = C(rate), C(eps), C(-1.0 if maximize else 1.0)
    for r in range(rows):
        if n == 0:
            continue
        gp = g2[r] / C(grad_scale) if grad_scale is not None else g2[r].copy()
        gp = sign * gp
        d = gp + l2 * x2[r] if weight_decay and weight_decay_mode == "l2" else gp
        lanes = [C(0)] * 8
        for i in range(n):
            lanes[i % 8] = C(lanes[i % 8] + d[i] * d[i])
        s = C(C(C(lanes[0] + lanes[1]) + C(lanes[2] + lanes[3]))
              + C(C(lanes[4] + lanes[5]) + C(lanes[6] + lanes[7])))
        a[r] = C(a[r] + C(s / C(n)))
        m = C(lr_c / C(np.sqrt(a[r]) + eps_c))
        c = C(C(1) - m * l2) if weight_decay and weight_decay_mode == "l2" else decay_mul
        x2[r] = c * x2[r] - m * gp
    return x2.reshape(x.shape), a.reshape(acc.shape)


def options_id(options):
    return ",".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("options", OPTIONS, ids=options_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_step_is_the_contract_bit_for_bit_and_follows_the_float64_oracle(rng, dtype,
                                                                            options):
    for width in WIDTHS:
        for rows in (0, 1, 5):
            x = rng.standard_normal((rows, width)).astype(dtype)
            acc = np.abs(rng.standard_normal(rows)).astype(dtype) * 0.1
            for t in (1, 2, 3):
                g = rng.standard_normal((rows, width)).astype(dtype)
                g_before = g.copy()
                want_x, want_acc = exact_oracle(x, g, acc, t, **options)
                ref_x, ref_acc = rowwise_adagrad_reference(x, g, acc, t, **options)
                assert fastadam.rowwise_adagrad_step_inplace(x, g, acc, t, **options) is True
                np.testing.assert_array_equal(g, g_before)
                np.testing.assert_array_equal(x, want_x, err_msg=f"row width {width}")
                np.testing.assert_array_equal(acc, want_acc, err_msg=f"row width {width}")
                tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(
                    rtol=2e-5, atol=2e-6)
                np.testing.assert_allclose(x, ref_x, **tol)
                np.testing.assert_allclose(acc, ref_acc, **tol)


def test_fbgemm_formula_by_hand():
    """One row by hand from FBGEMM's split_weight_update_cpu (L2 mode): momentum1 += mean of
    (g + wd*w)**2; multiplier = lr / (sqrt(momentum1) + eps); w = (1 - multiplier*wd)*w -
    multiplier*g."""
    w = np.array([[1.0, -2.0, 0.5, 4.0]])
    g = np.array([[0.5, 0.25, -1.0, 2.0]])
    momentum1 = np.array([0.75])
    lr, eps, wd = 0.1, 1e-8, 0.5
    gw = g[0] + wd * w[0]  # [1.0, -0.75, -0.75, 4.0]
    new_m1 = 0.75 + (1.0 + 0.5625 + 0.5625 + 16.0) / 4
    multiplier = lr / (np.sqrt(new_m1) + eps)
    want = (1.0 - multiplier * wd) * w[0] - multiplier * g[0]
    assert np.isclose(new_m1, 5.28125) and np.allclose(gw, [1.0, -0.75, -0.75, 4.0])
    fastadam.rowwise_adagrad_step_inplace(w, g, momentum1, 1, lr=lr, eps=eps, weight_decay=wd)
    np.testing.assert_allclose(momentum1, [new_m1], rtol=1e-15)
    np.testing.assert_allclose(w[0], want, rtol=1e-15)


def test_rows_are_the_first_axis_of_any_rank(rng):
    x3 = rng.standard_normal((4, 3, 5))
    g3 = rng.standard_normal((4, 3, 5))
    acc3 = np.zeros(4)
    x2, acc2 = x3.reshape(4, 15).copy(), np.zeros(4)
    fastadam.rowwise_adagrad_step_inplace(x3, g3, acc3, 1, lr=0.1)
    fastadam.rowwise_adagrad_step_inplace(x2, g3.reshape(4, 15), acc2, 1, lr=0.1)
    np.testing.assert_array_equal(x3.reshape(4, 15), x2)
    np.testing.assert_array_equal(acc3, acc2)
    # a 1-D parameter: rows of one element (Adagrad's update); a 0-d one: one row
    x1, g1, h1 = rng.standard_normal(6), rng.standard_normal(6), np.zeros(6)
    want, want_h = rowwise_adagrad_reference(x1, g1, h1, 1, lr=0.1)
    fastadam.rowwise_adagrad_step_inplace(x1, g1, h1, 1, lr=0.1)
    np.testing.assert_allclose(x1, want, rtol=1e-14)
    np.testing.assert_allclose(h1, g1 ** 2, rtol=1e-14)
    x0, a0 = np.array(2.0), np.array(0.0)
    fastadam.rowwise_adagrad_step_inplace(x0, np.array(0.5), a0, 1, lr=0.1, eps=0.0 + 1e-8)
    assert a0 == 0.25 and np.isclose(x0, 2.0 - 0.1 * 0.5 / (0.5 + 1e-8))


def test_the_result_does_not_depend_on_the_thread_count(rng):
    """Tables above the serial threshold, cut into chunks of whole rows split over threads."""
    shapes = [(3000, 67), (5, 9), (40000, 8)]
    x = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    acc = [np.abs(rng.standard_normal(s[0])).astype(np.float32) for s in shapes]
    results = []
    for threads in (1, 2, 3):
        xc, ac = [a.copy() for a in x], [a.copy() for a in acc]
        fastadam.rowwise_adagrad_step_inplace(xc, g, ac, 1, lr=0.1, weight_decay=0.01,
                                              num_threads=threads)
        results.append(xc + ac)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    want = [exact_oracle(x[1], g[1], acc[1], 1, lr=0.1, weight_decay=0.01)]
    np.testing.assert_array_equal(results[0][1], want[0][0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_modes(rng, dtype):
    n, d = 50, 9
    x = rng.standard_normal((n, d)).astype(dtype)
    acc = np.abs(rng.standard_normal(n)).astype(dtype)
    idx = rng.integers(0, n, 80)
    vals = rng.standard_normal((80, d)).astype(dtype)
    dense_g = np.zeros_like(x)
    np.add.at(dense_g, idx, vals)
    touched = np.unique(idx)
    untouched = np.setdiff1d(np.arange(n), touched)
    kw = dict(lr=0.05, weight_decay=0.1)
    # lazy: the touched rows step with their summed gradient, the others do not move
    lx, la = x.copy(), acc.copy()
    fastadam.sparse_rowwise_adagrad_step_inplace(lx, IndexedSlices(vals, idx, x.shape), la, 2,
                                                 **kw)
    sx, sa = x[touched].copy(), acc[touched].copy()
    fastadam.rowwise_adagrad_step_inplace(sx, dense_g[touched], sa, 2, **kw)
    np.testing.assert_array_equal(lx[touched], sx)
    np.testing.assert_array_equal(la[touched], sa)
    np.testing.assert_array_equal(lx[untouched], x[untouched])
    np.testing.assert_array_equal(la[untouched], acc[untouched])
    # sorted unique indices: the same bits without the sort
    ux, ua = x.copy(), acc.copy()
    fastadam.sparse_rowwise_adagrad_step_inplace(ux, (touched, dense_g[touched]), ua, 2,
                                                 indices_sorted_unique=True, **kw)
    np.testing.assert_array_equal(ux, lx)
    np.testing.assert_array_equal(ua, la)
    # dense mode: the dense step on the densified gradient (untouched rows decay only)
    dx, da = x.copy(), acc.copy()
    fastadam.sparse_rowwise_adagrad_step_inplace(dx, (idx, vals), da, 2, mode="dense", **kw)
    wx, wa = x.copy(), acc.copy()
    fastadam.rowwise_adagrad_step_inplace(wx, dense_g, wa, 2, **kw)
    np.testing.assert_array_equal(dx, wx)
    np.testing.assert_array_equal(da, wa)
    assert not np.array_equal(dx[untouched], x[untouched])  # L2 decay moved them
    # catchup: lazy, plus the step of every touched row recorded
    cx, ca, last = x.copy(), acc.copy(), np.zeros(n, np.int64)
    fastadam.sparse_rowwise_adagrad_step_inplace(cx, (idx, vals), ca, 2, mode="catchup",
                                                 last_step=last, **kw)
    np.testing.assert_array_equal(cx, lx)
    np.testing.assert_array_equal(ca, la)
    np.testing.assert_array_equal(last[touched], 2)
    np.testing.assert_array_equal(last[untouched], 0)


def test_sparse_step_threads_and_strided_rows(rng):
    n, d = 20000, 16
    buf = rng.standard_normal((n, 2 * d)).astype(np.float32)
    x = buf[:, :d]  # a block of columns of a wider table (rows a stride apart)
    acc = np.zeros(n, np.float32)
    idx = rng.integers(0, n, 30000)
    vals = rng.standard_normal((30000, d)).astype(np.float32)
    results = []
    for threads in (1, 2):
        bc, ac = buf.copy(), acc.copy()
        fastadam.sparse_rowwise_adagrad_step_inplace(bc[:, :d], (idx, vals), ac, 1, lr=0.1,
                                                     num_threads=threads)
        results.append((bc, ac))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0][:, d:], buf[:, d:])  # the other block
    packed, pa = np.ascontiguousarray(x), acc.copy()
    fastadam.sparse_rowwise_adagrad_step_inplace(packed, (idx, vals), pa, 1, lr=0.1)
    np.testing.assert_array_equal(results[0][0][:, :d], packed)


def test_skip_nonfinite_changes_nothing(rng):
    x = rng.standard_normal((4, 5))
    g = rng.standard_normal((4, 5))
    g[3, 4] = np.inf
    acc = np.zeros(4)
    x0 = x.copy()
    assert fastadam.rowwise_adagrad_step_inplace(x, g, acc, 1, skip_nonfinite=True) is False
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(acc, 0)


def _dense_call(x, g, acc, **kw):
    return lambda: fastadam.rowwise_adagrad_step_inplace(x, g, acc, 1, **kw)


@pytest.mark.parametrize("make,error,match", [
    (lambda x, g, a: _dense_call(x, g, np.zeros((5, 3))), ValueError,
     r"^acc: expected shape \(5,\), got \(5, 3\)"),
    (lambda x, g, a: _dense_call(x, g, np.zeros(5, np.float32)), TypeError,
     r"^acc: expected dtype float64"),
    (lambda x, g, a: _dense_call(x.astype(np.float16), g.astype(np.float16),
                                 a.astype(np.float16)), TypeError,
     r"^x: expected float32 or float64 \(row-wise kernels\), got float16"),
    (lambda x, g, a: _dense_call(x, g[:, :2], a), ValueError, r"^g: expected shape \(5, 3\)"),
    (lambda x, g, a: _dense_call(x, g, a[::-1]), ValueError, r"^acc: expected a C-contiguous"),
    (lambda x, g, a: _dense_call(x, g, np.zeros(5), eps=0.0), ValueError,
     r"^eps: expected eps > 0, got 0.0"),
    (lambda x, g, a: _dense_call(x, g, a, lr=-1.0), ValueError, r"^lr: "),
    (lambda x, g, a: _dense_call(x, g, a, weight_decay=-0.1), ValueError, r"^weight_decay: "),
    (lambda x, g, a: _dense_call(x, g, a, weight_decay_mode="l1"), ValueError,
     r"^weight_decay_mode: expected one of \('l2', 'decoupled'\), got 'l1'"),
    (lambda x, g, a: _dense_call(x, g, a, lr=1e40, weight_decay=0.0), None, None),
    (lambda x, g, a: (lambda: fastadam.rowwise_adagrad_step_inplace(x, g, a, 0)), ValueError,
     r"^t: expected a step number >= 1, got 0"),
    (lambda x, g, a: _dense_call([x, x], [g, g], [a, a]), ValueError, r"share memory"),
    (lambda x, g, a: _dense_call([x], [g], [a, a]), ValueError, r"^acc: expected a list of 1"),
    (lambda x, g, a: _dense_call(x, g, [a]), TypeError, r"^x, g, acc: pass either one"),
    (lambda x, g, a: _dense_call(x, g, x[:, 0]), ValueError, r"share memory|C-contiguous"),
])
def test_bad_inputs_are_refused_before_any_write(rng, make, error, match):
    x = rng.standard_normal((5, 3))
    g = rng.standard_normal((5, 3))
    acc = np.zeros(5)
    x0 = x.copy()
    call = make(x, g, acc)
    if error is None:  # lr=1e40 is a valid float64 step: it runs
        call()
        return
    with pytest.raises(error, match=match):
        call()
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(acc, 0)


def test_float32_checks_and_all_or_nothing_over_a_list(rng):
    x = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    g = [a.copy() for a in x]
    acc = [np.zeros(3, np.float32), np.zeros(2, np.float32)]  # the second is wrong
    before = [a.copy() for a in x]
    with pytest.raises(ValueError, match=r"^acc\[1\]: expected shape \(3,\), got \(2,\)"):
        fastadam.rowwise_adagrad_step_inplace(x, g, acc, 1)
    for a, b in zip(x, before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"^lr: 1e\+40 overflows float32"):
        fastadam.rowwise_adagrad_step_inplace(x[0], g[0], np.zeros(3, np.float32), 1, lr=1e40)
    with pytest.raises(ValueError, match=r"^eps: 1e-50 rounds to 0 in float32"):
        fastadam.rowwise_adagrad_step_inplace(x[0], g[0], np.zeros(3, np.float32), 1,
                                              eps=1e-50)
    np.testing.assert_array_equal(x[0], before[0])


def test_sparse_errors_before_any_write(rng):
    x = rng.standard_normal((6, 3))
    acc = np.zeros(6)
    x0 = x.copy()
    with pytest.raises(ValueError, match=r"^acc: expected shape \(6,\), got \(6, 3\)"):
        fastadam.sparse_rowwise_adagrad_step_inplace(x, (np.array([1]), np.ones((1, 3))),
                                                     np.zeros((6, 3)), 1)
    with pytest.raises(IndexError, match=r"out of range"):
        fastadam.sparse_rowwise_adagrad_step_inplace(x, (np.array([1, 6]), np.ones((2, 3))),
                                                     acc, 1)
    scipy_sparse = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match=r"^grad: a CSR gradient is element-wise; a row-wise"):
        fastadam.sparse_rowwise_adagrad_step_inplace(
            x, scipy_sparse.csr_matrix(np.eye(6, 3)), acc, 1)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(acc, 0)


# ---- the optimizer object ---------------------------------------------------------------------
def test_object_keeps_one_value_per_row_and_steps_as_the_functional_step(rng, tmp_path):
    shapes = [(7, 16), (4,), (3, 2, 5)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fun = [p.copy() for p in params]
    fun_acc = [np.full(s[0], 0.1, np.float32) for s in shapes]
    opt = fastadam.RowWiseAdagrad(params, lr=0.05, weight_decay=0.01,
                                  initial_accumulator_value=0.1)
    assert [opt.state(i)["sum"].shape for i in range(3)] == [(7,), (4,), (3,)]
    assert opt.state_bytes() == 4 * (7 + 4 + 3)
    assert fastadam.Adagrad(params).state_bytes() == 4 * (7 * 16 + 4 + 30)
    for k in range(5):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        if k == 3:  # checkpoint, resume in a fresh optimizer
            path = tmp_path / "rw.npz"
            opt.save(path)
            params = [p.copy() for p in params]
            opt = fastadam.RowWiseAdagrad(params, lr=0.05, weight_decay=0.01,
                                          initial_accumulator_value=0.1)
            opt.load(path)
        assert opt.step(grads) is True
        fastadam.rowwise_adagrad_step_inplace(fun, grads, fun_acc, k + 1, lr=0.05,
                                              weight_decay=0.01)
    for a, b in zip(params, fun):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(opt.state_dict()["sum"], fun_acc):
        np.testing.assert_array_equal(a, b)


def test_object_sparse_gradient_and_a_bad_checkpoint(rng):
    table = rng.standard_normal((10, 4))
    opt = fastadam.RowWiseAdagrad([table], lr=0.1)
    before = table.copy()
    opt.step([IndexedSlices(np.ones((2, 4)), np.array([2, 2]), (10, 4))])
    assert not np.array_equal(table[2], before[2])
    np.testing.assert_array_equal(np.delete(table, 2, 0), np.delete(before, 2, 0))
    np.testing.assert_allclose(opt.state(0)["sum"], np.where(np.arange(10) == 2, 4.0, 0.0))
    state = opt.state_dict()
    state["sum"] = [np.zeros((10, 4))]
    with pytest.raises(ValueError, match=r"expected float64 of shape \(10,\)"):
        opt.load_state_dict(state)
    np.testing.assert_allclose(opt.state(0)["sum"][2], 4.0)


def test_object_refuses_what_it_does_not_have(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^state_dtype: RowWiseAdagrad keeps one accumulator "
                                         r"per row"):
        fastadam.RowWiseAdagrad([x], state_dtype="int8")
    with pytest.raises(ValueError, match=r"^eps: expected eps > 0"):
        fastadam.RowWiseAdagrad([x], eps=0.0)
    with pytest.raises(ValueError, match=r"^weight_decay_mode: expected one of"):
        fastadam.RowWiseAdagrad([x], weight_decay_mode="none")
    with pytest.raises(ValueError, match=r"^lr: "):
        fastadam.RowWiseAdagrad([x], lr=-0.1)
    opt = fastadam.RowWiseAdagrad([x])
    with pytest.raises(ValueError, match=r"^weight_decay: "):
        opt.set_hyperparameters(weight_decay=-1.0)


def test_a_plan_of_the_row_wise_optimizer_steps_as_its_functional_step(rng):
    """prepare_step takes the registry row of the "rows" state format (one value per row)."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ref, acc, acc_ref = x.copy(), np.zeros(3, np.float32), np.zeros(3, np.float32)
    plan = fastadam.optim.prepare_step("rowwise_adagrad", x, {"acc": acc})
    assert plan.driver == ("cpu", "float", "rows")
    for t in (1, 2, 3):
        g = rng.standard_normal(x.shape).astype(np.float32)
        assert plan.run(g, t, lr=0.1, weight_decay=0.01)
        fastadam.rowwise_adagrad_step_inplace(ref, g, acc_ref, t, lr=0.1, weight_decay=0.01)
    assert x.tobytes() == ref.tobytes() and acc.tobytes() == acc_ref.tobytes()
    with pytest.raises(ValueError, match=r"^params: a row-wise optimizer steps float32 or "
                                         r"float64 parameters"):
        fastadam.optim.prepare_step("rowwise_adagrad", x, {"acc": np.zeros(3, np.float32)},
                                    param_rounding="stochastic")


# ---- fastadam.torch ---------------------------------------------------------------------------
def test_torch_class_follows_the_oracle_and_the_numpy_object(rng):
    torch = pytest.importorskip("torch")
    import fastadam.torch as ft
    w = rng.standard_normal((6, 5))
    b = rng.standard_normal(3)
    pw, pb = torch.nn.Parameter(torch.tensor(w)), torch.nn.Parameter(torch.tensor(b))
    opt = ft.RowWiseAdagrad([pw, pb], lr=0.1, weight_decay=0.01, eps=1e-10)
    nw, nb = w.copy(), b.copy()
    obj = fastadam.RowWiseAdagrad([nw, nb], lr=0.1, weight_decay=0.01, eps=1e-10)
    ref = [(w.copy(), np.zeros(6)), (b.copy(), np.zeros(3))]
    for t in range(1, 4):
        grads = [rng.standard_normal(w.shape), rng.standard_normal(b.shape)]
        pw.grad, pb.grad = torch.tensor(grads[0]), torch.tensor(grads[1])
        opt.step()
        obj.step(grads)
        ref = [rowwise_adagrad_reference(x, g, a, t, lr=0.1, weight_decay=0.01, eps=1e-10)
               for (x, a), g in zip(ref, grads)]
    assert tuple(opt.state[pw]["sum"].shape) == (6,)
    np.testing.assert_array_equal(pw.detach().numpy(), nw)
    np.testing.assert_array_equal(pb.detach().numpy(), nb)
    np.testing.assert_array_equal(opt.state[pw]["sum"].numpy(), obj.state(0)["sum"])
    np.testing.assert_allclose(pw.detach().numpy(), ref[0][0], rtol=1e-12)
    np.testing.assert_allclose(opt.state[pb]["sum"].numpy(), ref[1][1], rtol=1e-12)
    # the state dict round trip, and a state of the wrong shape refused
    sd = opt.state_dict()
    opt2 = ft.RowWiseAdagrad([pw, pb], lr=0.1, weight_decay=0.01, eps=1e-10)
    opt2.load_state_dict(sd)
    assert float(opt2.state[pw]["step"]) == 3.0
    bad = opt.state_dict()
    bad["state"][0]["sum"] = torch.zeros(6, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"has shape \(6, 5\), expected \(6,\)"):
        opt2.load_state_dict(bad)


def test_torch_class_sparse_embedding(rng):
    torch = pytest.importorskip("torch")
    import fastadam.torch as ft
    emb = torch.nn.Embedding(20, 8, sparse=True, dtype=torch.float32)
    start = emb.weight.detach().numpy().copy()
    opt = ft.RowWiseAdagrad(emb.parameters(), lr=0.1)
    ids = torch.tensor([3, 5, 3, 11])
    emb(ids).square().sum().backward()
    opt.step()
    table, acc = start.copy(), np.zeros(20, np.float32)
    g = 2 * start[[3, 5, 3, 11]]
    fastadam.sparse_rowwise_adagrad_step_inplace(table, (np.array([3, 5, 3, 11]), g), acc, 1,
                                                 lr=0.1, eps=1e-10)
    np.testing.assert_array_equal(emb.weight.detach().numpy(), table)
    np.testing.assert_array_equal(opt.state[emb.weight]["sum"].numpy(), acc)
    assert (acc != 0).sum() == 3


def test_torch_class_refuses_bad_hyperparameters():
    torch = pytest.importorskip("torch")
    import fastadam.torch as ft
    p = torch.nn.Parameter(torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"^eps: expected eps > 0"):
        ft.RowWiseAdagrad([p], eps=0.0)
    with pytest.raises(ValueError, match=r"^weight_decay_mode: "):
        ft.RowWiseAdagrad([p], weight_decay_mode="l1")
    with pytest.raises(TypeError, match=r"float32 or float64 parameters, got torch.float16"):
        ft.RowWiseAdagrad([torch.nn.Parameter(torch.ones(3, 2, dtype=torch.float16))])


# ---- the GPU kernels, run on the host (tests/gpu_emulation.cpp) -------------------------------
@pytest.fixture(scope="module")
def emu():
    from gpu_emulation_build import BuildError, build
    try:
        return build()
    except BuildError as exc:
        if "g++" in str(exc) or "_Float16" in str(exc):
            pytest.skip(str(exc).splitlines()[0])
        pytest.fail(f"building the emulation failed:\n{exc}")


def _ptr(a):
    import ctypes
    return ctypes.c_void_p(a.ctypes.data if a is not None else 0)


def _gpu_head(options, t):
    from fastadam.gpu import _layout
    coeffs = fastadam.optim.optimizer_spec("rowwise_adagrad").fold(t, **options)
    return coeffs, _layout.coefficient_bytes(coeffs, np.zeros(_layout.HEADER_BYTES, np.uint8))


@pytest.mark.parametrize("options", OPTIONS, ids=options_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_dense_kernel_equals_cpu(emu, rng, dtype, options):
    import ctypes
    ll = ctypes.c_longlong
    for shape in [(9, 13), (4, 64), (3, 1), (2, 0)]:
        x = rng.standard_normal(shape).astype(dtype)
        g = rng.standard_normal(shape).astype(dtype)
        acc = np.abs(rng.standard_normal(shape[0])).astype(dtype)
        dx, dacc = x.copy(), acc.copy()
        coeffs, head = _gpu_head(options, 2)
        emu.emu_rowwise(1 if dtype == np.float32 else 2, coeffs.kind, coeffs.flags, -1,
                        _ptr(head), _ptr(dx), _ptr(g), _ptr(dacc), _ptr(None), ll(shape[0]),
                        ll(shape[1]), _ptr(None), ll(0), _ptr(None), ll(0), 4)
        fastadam.rowwise_adagrad_step_inplace(x, g, acc, 2, **options)
        np.testing.assert_array_equal(dx, x, err_msg=str(shape))
        np.testing.assert_array_equal(dacc, acc, err_msg=str(shape))


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
def test_gpu_sparse_kernels_equal_cpu(emu, rng, mode):
    import ctypes
    from fastadam.gpu._layout import sort_segments
    ll = ctypes.c_longlong
    n_rows, row, t = 30, 11, 7
    options = dict(lr=0.05, weight_decay=0.1)
    x = rng.standard_normal((n_rows, row)).astype(np.float32)
    acc = np.abs(rng.standard_normal(n_rows)).astype(np.float32)
    indices = rng.integers(0, n_rows, 50)
    values = rng.standard_normal((50, row)).astype(np.float32)
    last = rng.integers(0, t, n_rows).astype(np.int64) if mode == "catchup" else None
    dx, dacc = x.copy(), acc.copy()
    dlast = None if last is None else last.copy()
    coeffs, head = _gpu_head(options, t)
    perm, rows, offsets = sort_segments(np, indices.astype(np.int64))
    nseg = rows.shape[0]
    sums = np.empty((nseg, row), np.float32)
    emu.emu_segment_sum(1, _ptr(values), ll(row), _ptr(perm), _ptr(offsets), ll(nseg),
                        _ptr(sums), 3)
    if mode == "dense":
        target = np.full(n_rows, -1, np.int64)
        target[rows] = np.arange(nseg)
    else:
        target = rows
    zeros = np.zeros(row, np.float32)
    emu.emu_rowwise(1, coeffs.kind, coeffs.flags, {"lazy": 0, "dense": 1, "catchup": 2}[mode],
                    _ptr(head), _ptr(dx), _ptr(sums), _ptr(dacc), _ptr(zeros), ll(n_rows),
                    ll(row), _ptr(target), ll(nseg), _ptr(dlast), ll(t), 4)
    fastadam.sparse_rowwise_adagrad_step_inplace(x, (indices, values), acc, t, mode=mode,
                                                 last_step=last, **options)
    np.testing.assert_array_equal(dx, x)
    np.testing.assert_array_equal(dacc, acc)
    if last is not None:
        np.testing.assert_array_equal(dlast, last)
