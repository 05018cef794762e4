"""The optimizer objects as a user drives them: Tensor parameters with backward(), mixed dense /
IndexedSlices / CSR gradients, several dtypes, groups, setters, skip_nonfinite and grad_scale.

References: the functional steps called directly on copies (the objects must make exactly those
calls, so most comparisons are bit for bit) and the float64 oracle of tests/reference.py."""
import numpy as np
import pytest

import fastadam
import fastadam.autodiff as ad
from fastadam.optim import schedules
from reference import adam_reference

scipy_sparse = pytest.importorskip("scipy.sparse")

HAS_ADAGRAD = hasattr(fastadam.optim, "adagrad_step_inplace")
HAS_MOMENTUM = hasattr(fastadam.optim, "momentum_step_inplace")


def copies(arrays):
    return [a.copy() for a in arrays]


def test_tensor_params_read_grad_after_backward(rng):
    table = rng.standard_normal((30, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    T, W = ad.Tensor(table.copy(), requires_grad=True), ad.Tensor(w.copy(), requires_grad=True)
    opt = fastadam.Adam([T, W], lr=0.05, convention="torch")
    ref = [table.copy(), w.copy()]
    mt, vt, mw, vw = (np.zeros_like(table), np.zeros_like(table), np.zeros_like(w),
                      np.zeros_like(w))
    for t in range(1, 6):
        idx = rng.integers(0, 30, size=8)
        labels = rng.integers(0, 3, size=8)
        ad.backward(ad.softmax_cross_entropy(ad.take(T, idx) @ W, labels))
        assert isinstance(T.grad, fastadam.IndexedSlices)
        g_table, g_w = T.grad, W.grad.data.copy()
        assert opt.step() is True
        fastadam.sparse_step_inplace(ref[0], g_table, mt, vt, t, lr=0.05, convention="torch")
        fastadam.step_inplace(ref[1], g_w, mw, vw, t, lr=0.05, convention="torch")
        opt.zero_grad()
        assert T.grad is None and W.grad is None
    assert opt.t == 5
    assert T.data.tobytes() == ref[0].tobytes() and W.data.tobytes() == ref[1].tobytes()


def test_tensor_without_grad_is_left_alone(rng):
    a, b = ad.Tensor(np.ones(3), requires_grad=True), ad.Tensor(np.ones(2), requires_grad=True)
    opt = fastadam.Adam([a, b], lr=0.1)
    ad.backward(ad.sum(a * a))
    assert b.grad is None
    opt.step()
    assert np.all(a.data < 1.0) and np.all(b.data == 1.0)
    assert not opt.state(b)["m"].any() and opt.state(a)["m"].any()


def test_step_after_backward_bumps_the_version(rng):
    # a graph recorded before the step saw the old values: backward through it must refuse
    a = ad.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = ad.sum(a * a)
    ad.backward(y, retain_graph=True)
    fastadam.SGD([a], lr=0.1).step() if HAS_MOMENTUM else fastadam.Adam([a]).step()
    with pytest.raises(RuntimeError, match="modified"):
        ad.backward(y)


def mixed_problem(rng):
    table = rng.standard_normal((20, 4)).astype(np.float32)
    mat = rng.standard_normal((6, 5)).astype(np.float32)
    vec = rng.standard_normal(7).astype(np.float32)
    w64 = rng.standard_normal((3, 3))
    return [table, mat, vec, w64]


def mixed_gradients(rng, params):
    table, mat, vec, w64 = params
    idx = np.array([3, 17, 3, 0, 9], dtype=np.int64)
    slices = fastadam.IndexedSlices(rng.standard_normal((5, 4)).astype(np.float32), idx, (20, 4))
    dense = rng.standard_normal(mat.shape).astype(np.float32)
    dense[rng.random(mat.shape) < 0.6] = 0
    csr = scipy_sparse.csr_matrix(dense)
    return [slices, csr, rng.standard_normal(7).astype(np.float32), rng.standard_normal((3, 3))]


@pytest.mark.parametrize("sparse_mode", ["lazy", "dense"])
def test_mixed_gradients_equal_the_functional_steps(rng, sparse_mode):
    params = mixed_problem(rng)
    ref = copies(params)
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    hp = dict(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6, convention="tf", weight_decay=0.02)
    opt = fastadam.Adam(params, lr=0.01, betas=(0.8, 0.95), eps=1e-6, convention="tf",
                        weight_decay=0.02, sparse_mode=sparse_mode)
    for t in range(1, 4):
        grads = mixed_gradients(rng, params)
        assert opt.step(grads)
        for i in (0, 1):
            fastadam.sparse_step_inplace(ref[i], grads[i], *moments[i], t, mode=sparse_mode, **hp)
        for i in (2, 3):
            fastadam.step_inplace(ref[i], grads[i], *moments[i], t, **hp)
    for p, r, (m, v), i in zip(params, ref, moments, range(4)):
        assert p.tobytes() == r.tobytes(), i
        assert opt.m[i].tobytes() == m.tobytes() and opt.v[i].tobytes() == v.tobytes()


def test_one_compiled_call_per_group_and_dtype(rng, monkeypatch):
    from fastadam.optim import PreparedStep

    calls = []
    real = PreparedStep._step

    def counting(self, *args):  # a bucket's prepared step: one driver call
        calls.append([str(a.dtype) for a in self._bound.xs])
        return real(self, *args)

    monkeypatch.setattr(PreparedStep, "_step", counting)
    params = [rng.standard_normal(5).astype(d) for d in
              (np.float32, np.float16, np.float64, np.float32, np.float16)]
    opt = fastadam.Adam([{"params": params[:4]}, {"params": params[4:], "lr": 0.5}])
    calls.clear()
    opt.step([np.ones_like(p) for p in params])
    assert sorted(calls) == sorted([["float32", "float32"], ["float16"], ["float64"],
                                    ["float16"]])


def test_several_dtypes_follow_the_reference(rng):
    params = [rng.standard_normal(9).astype(d) for d in (np.float16, np.float32, np.float64)]
    start = [p.astype(np.float64) for p in params]
    opt = fastadam.Adam(params, lr=0.01, convention="torch")
    states = [(x, np.zeros(9), np.zeros(9)) for x in start]
    for t in range(1, 11):
        grads = [rng.standard_normal(9) for _ in params]
        opt.step([g.astype(p.dtype) for g, p in zip(grads, params)])
        states = [adam_reference(x, g.astype(p.dtype), m, v, t, lr=0.01, convention="torch")[:3]
                  for (x, m, v), g, p in zip(states, grads, params)]
    for p, (x, _, _), rtol in zip(params, states, (5e-3, 1e-5, 1e-13)):
        np.testing.assert_allclose(p, x, rtol=rtol, atol=rtol)


def test_groups_have_their_own_hyperparameters(rng):
    a, b = rng.standard_normal(6), rng.standard_normal(6)
    ra, rb = a.copy(), b.copy()
    opt = fastadam.Adam([{"params": [a]}, {"params": [b], "weight_decay": 0.1, "lr": 0.05}],
                        lr=0.01, convention="torch")
    sa = (ra, np.zeros(6), np.zeros(6))
    sb = (rb, np.zeros(6), np.zeros(6))
    for t in range(1, 6):
        g = rng.standard_normal(6)
        opt.step([g, g])
        sa = adam_reference(sa[0], g, sa[1], sa[2], t, lr=0.01, convention="torch")[:3]
        sb = adam_reference(sb[0], g, sb[1], sb[2], t, lr=0.05, weight_decay=0.1,
                            convention="torch")[:3]
    np.testing.assert_allclose(a, sa[0], rtol=1e-13)
    np.testing.assert_allclose(b, sb[0], rtol=1e-13)


def test_params_may_be_any_iterable(rng):
    arrays = [rng.standard_normal(3), rng.standard_normal(2)]
    opt = fastadam.Adam(a for a in arrays)
    assert opt.params == arrays
    opt.add_param_group({"params": iter([rng.standard_normal(4)]), "lr": 0.5})
    assert len(opt.params) == 3 and opt.param_groups[1]["lr"] == 0.5


def test_add_param_group_and_set_hyperparameters(rng):
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    opt = fastadam.Adam([a], lr=0.01)
    opt.add_param_group({"params": [b], "lr": 0.2})
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.2]
    assert opt.param_groups[1]["params"][0] is b and opt.params == [a, b]
    opt.set_hyperparameters(group=0, lr=0.3, betas=(0.5, 0.6))
    assert opt.param_groups[0]["lr"] == 0.3 and opt.param_groups[0]["betas"] == (0.5, 0.6)
    opt.set_hyperparameters(group=None, weight_decay=0.5)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.5]
    # eps=None is the convention's default, as in the constructor
    opt.set_hyperparameters(group=1, convention="onnx", eps=None)
    assert opt.param_groups[1]["eps"] == 1e-6


def test_setter_checks_and_changes_nothing_on_error():
    opt = fastadam.Adam([np.zeros(3)], lr=0.01)
    with pytest.raises(ValueError, match=r"lr: expected a number >= 0, got -1.0"):
        opt.set_hyperparameters(group=0, weight_decay=0.3, lr=-1.0)
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.param_groups[0]["lr"] == 0.01


def test_param_groups_are_read_only():
    opt = fastadam.Adam([np.zeros(3)])
    with pytest.raises(TypeError, match=r"param_groups are read-only: use "
                                        r"optimizer.set_hyperparameters\(group=..., lr=...\)"):
        opt.param_groups[0]["lr"] = 0.5


@pytest.mark.parametrize("convention, eps", [("torch", 1e-8), ("tf", 1e-7), ("onnx", 1e-6)])
def test_eps_defaults_follow_the_convention(convention, eps):
    assert fastadam.Adam([np.zeros(2)], convention=convention).param_groups[0]["eps"] == eps


def test_adam_defaults_to_torch_and_adamw_decays(rng):
    x = rng.standard_normal(5)
    opt = fastadam.Adam([x.copy()])
    assert opt.param_groups[0]["convention"] == "torch"
    w = fastadam.AdamW([x.copy()])
    assert w.param_groups[0]["weight_decay"] == 1e-2
    p = x.copy()
    fastadam.AdamW([p], lr=0.1).step([np.zeros(5)])
    np.testing.assert_array_equal(p, x * (1 - 0.1 * 1e-2))  # m = 0: only the decay moves x


@pytest.mark.parametrize("make", [
    lambda p: fastadam.Adam(p, lr=0.02, betas=(0.8, 0.9), amsgrad=True, convention="onnx",
                            clip_grad_norm=2.0, weight_decay=0.1),
    lambda p: fastadam.AdamW(p, lr=schedules.exponential(0.1, 0.9), weight_decay=0.3),
    pytest.param(lambda p: fastadam.Adagrad(p, lr=0.2, weight_decay=0.1, convention="keras"),
                 marks=pytest.mark.skipif(not HAS_ADAGRAD, reason="needs adagrad_step_inplace")),
    pytest.param(lambda p: fastadam.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                 marks=pytest.mark.skipif(not HAS_MOMENTUM, reason="needs momentum_step_inplace")),
])
def test_defaults_rebuild_the_same_optimizer(rng, make):
    params = [rng.standard_normal(4)]
    opt = make(params)
    again = type(opt)(params, **opt.defaults)
    assert [dict(g) for g in again.param_groups] == [dict(g) for g in opt.param_groups]
    assert again.clip_grad_norm == opt.clip_grad_norm
    assert again.slot_names == opt.slot_names


def test_repr_shows_hyperparameters_and_groups():
    opt = fastadam.Adam([{"params": [np.zeros(3, np.float32), np.zeros(2)]},
                         {"params": [np.zeros(1)], "weight_decay": 0.5}], lr=0.25)
    text = repr(opt)
    assert text.startswith("Adam(t=0")
    assert "group 0: 2 params (1 float32, 1 float64): lr=0.25" in text
    assert "group 1: 1 params (1 float64): lr=0.25" in text and "weight_decay=0.5" in text


def test_skip_nonfinite_across_several_calls_changes_nothing(rng):
    params = mixed_problem(rng)
    opt = fastadam.Adam(params, lr=0.1)
    opt.step(mixed_gradients(rng, params))
    before = copies(params) + copies(opt.m) + copies(opt.v)
    for bad in (3, 0, 1):  # NaN in the last dense call, in an IndexedSlices, in a CSR
        grads = mixed_gradients(rng, params)
        target = grads[bad].values if bad == 0 else grads[bad].data if bad == 1 else grads[bad]
        target.flat[-1] = np.inf if bad == 1 else np.nan
        assert opt.step(grads, skip_nonfinite=True) is False
        assert opt.t == 1
        after = list(params) + opt.m + opt.v
        assert all(a.tobytes() == b.tobytes() for a, b in zip(before, after))


def test_skip_nonfinite_single_call_is_the_kernels(rng):
    p = [rng.standard_normal(4), rng.standard_normal(3)]
    opt = fastadam.Adam(p)
    assert opt.step([np.ones(4), np.array([1.0, np.nan, 1.0])], skip_nonfinite=True) is False
    assert opt.t == 0 and not opt.m[0].any()
    assert opt.step([np.ones(4), np.ones(3)], skip_nonfinite=True) is True and opt.t == 1


def test_grad_scale_equals_unscaled_gradients(rng):
    a = mixed_problem(rng)
    b = copies(a)
    oa, ob = fastadam.Adam(a, lr=0.1), fastadam.Adam(b, lr=0.1)
    for _ in range(3):
        grads = mixed_gradients(rng, a)
        scaled = [fastadam.IndexedSlices(grads[0].values * 1024, grads[0].indices, (20, 4)),
                  grads[1] * np.float32(1024), grads[2] * 1024, grads[3] * 1024]
        oa.step(grads)
        ob.step(scaled, grad_scale=1024.0)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def test_lr_schedule_is_called_with_the_step_count(rng):
    seen = []

    def schedule(k):
        seen.append(k)
        return 0.1

    x = rng.standard_normal(3)
    opt = fastadam.Adam([x], lr=schedule)
    for _ in range(3):
        opt.step([np.ones(3)])
    assert opt.step([np.array([np.nan, 1, 1])], skip_nonfinite=True) is False
    opt.step([np.ones(3)])
    assert seen == [0, 1, 2, 3, 3]


def test_zero_state_restarts(rng):
    x = rng.standard_normal(5)
    start = x.copy()
    opt = fastadam.Adam([x], lr=0.1)
    g = rng.standard_normal(5)
    opt.step([g])
    first = x.copy()
    x[...] = start
    opt.zero_state()
    assert opt.t == 0 and not opt.m[0].any() and not opt.v[0].any()
    opt.step([g])
    assert x.tobytes() == first.tobytes()


def test_state_gives_the_named_slots():
    p = np.zeros(3)
    opt = fastadam.Adam([p], amsgrad=True)
    assert opt.slot_names == ("m", "v", "v_max")
    assert opt.state(p)["v_max"] is opt.v_max[0]
    assert opt.state(0)["m"] is opt.m[0]


def test_clip_grad_norm_function_matches_numpy(rng):
    grads = [rng.standard_normal((4, 3)), rng.standard_normal(5).astype(np.float32)]
    slices = fastadam.IndexedSlices(rng.standard_normal((3, 2)), np.array([1, 1, 4]), (6, 2))
    dense_norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)
                         + float(np.sum(slices.to_dense() ** 2)))
    expected = [g.astype(np.float64) * min(1.0, 1.5 / (dense_norm + 1e-6)) for g in grads]
    assert fastadam.optim.global_norm(grads + [slices]) == pytest.approx(dense_norm, rel=1e-6)
    norm = fastadam.clip_grad_norm(grads + [slices], 1.5)
    assert norm == pytest.approx(dense_norm, rel=1e-6)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_public_names():
    for name in ("Optimizer", "Adam", "AdamW", "Adagrad", "SGD", "clip_grad_norm", "schedules"):
        assert getattr(fastadam, name) is getattr(fastadam.optim, name)
    assert issubclass(fastadam.Adam, fastadam.Optimizer)
    import importlib.resources
    assert importlib.resources.files("fastadam").joinpath("py.typed").is_file()
