"""RMSprop against torch.optim.RMSprop (every option combination, float64 and float32
trajectories, functional and object forms), Lion's defaults and sign rule against the paper's
oracle (tests/reference.py; torch has no Lion), and the error messages of both."""
import itertools

import numpy as np
import pytest

import fastadam
from reference import lion_reference

torch = pytest.importorskip("torch")

COMBOS = list(itertools.product([False, True], [0.0, 0.9], [0.0, 0.1], [False, True]))


def combo_id(c):
    centered, momentum, wd, maximize = c
    return f"centered={centered}-momentum={momentum}-wd={wd}-maximize={maximize}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_rmsprop_trajectory_equals_torch(rng, combo, dtype):
    centered, momentum, wd, maximize = combo
    shape = (37,)
    x0 = rng.standard_normal(shape).astype(dtype)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(12)]
    hyper = dict(lr=0.01, alpha=0.95, eps=1e-6, weight_decay=wd, momentum=momentum,
                 centered=centered, maximize=maximize)
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    topt = torch.optim.RMSprop([p], foreach=False, **hyper)
    x = x0.copy()
    v, b, a = np.zeros_like(x), np.zeros_like(x), np.zeros_like(x)
    opt_x = x0.copy()
    opt = fastadam.RMSprop([opt_x], **hyper)
    for t, g in enumerate(grads, 1):
        p.grad = torch.from_numpy(g.copy())
        topt.step()
        fastadam.rmsprop_step_inplace(x, g, v, t, momentum_buffer=b if momentum else None,
                                      grad_avg=a if centered else None, **hyper)
        opt.step([g])
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    want = p.detach().numpy()
    np.testing.assert_allclose(x, want, **tol)
    np.testing.assert_array_equal(opt_x, x)  # the object is the functional step
    state = topt.state[p]
    np.testing.assert_allclose(v, state["square_avg"].numpy(), **tol)
    if momentum:
        np.testing.assert_allclose(b, state["momentum_buffer"].numpy(), **tol)
    if centered:
        np.testing.assert_allclose(a, state["grad_avg"].numpy(), **tol)


def test_rmsprop_defaults_are_torchs_and_keras(rng):
    x = rng.standard_normal(9)
    g = rng.standard_normal(9)
    p = torch.nn.Parameter(torch.from_numpy(x.copy()))
    topt = torch.optim.RMSprop([p])
    p.grad = torch.from_numpy(g.copy())
    topt.step()
    ours = x.copy()
    fastadam.rmsprop_step_inplace(ours, g, np.zeros(9), 1)
    np.testing.assert_allclose(ours, p.detach().numpy(), rtol=1e-13)
    # Keras 3: lr 1e-3, rho 0.9, eps 1e-7 inside the root
    ours = x.copy()
    fastadam.rmsprop_step_inplace(ours, g, np.zeros(9), 1, convention="keras")
    np.testing.assert_allclose(ours, x - 1e-3 * g / np.sqrt(0.1 * g * g + 1e-7), rtol=1e-13)


def test_lion_defaults_follow_the_paper(rng):
    x = rng.standard_normal(50)
    m = rng.standard_normal(50)
    g = rng.standard_normal(50)
    want_x, want_m = lion_reference(x, g, m, 1, lr=1e-4, beta1=0.9, beta2=0.99)
    fastadam.lion_step_inplace(x, g, m, 1)
    np.testing.assert_allclose(x, want_x, rtol=1e-14)
    np.testing.assert_allclose(m, want_m, rtol=1e-14)
    # every coordinate moves by exactly lr (no weight decay): the sign update
    x0 = np.zeros(4)
    fastadam.lion_step_inplace(x0, np.array([3.0, -1e-30, 0.0, 7.0]), np.zeros(4), 1, lr=0.5)
    np.testing.assert_array_equal(x0, [-0.5, 0.5, 0.0, -0.5])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("maximize", [False, True])
def test_lion_sign_at_the_edges_of_the_type(dtype, maximize):
    """sgn of the smallest subnormals, both zeros, the infinities and the largest finite values,
    with beta1 = 0 (so c = g exactly); 17 elements, so both the vector body and the scalar tail
    of each compiled level see them."""
    info = np.finfo(dtype)
    edge = [info.smallest_subnormal, -info.smallest_subnormal, 0.0, -0.0, np.inf, -np.inf,
            info.max, -info.max]
    g = np.array(edge + edge + [info.smallest_subnormal], dtype)
    moved = [-0.5, 0.5, 0.0, 0.0, -0.5, 0.5, -0.5, 0.5]
    want = np.array(moved + moved + [-0.5], dtype)
    x = np.zeros(17, dtype)
    fastadam.lion_step_inplace(x, g, np.zeros(17, dtype), 1, lr=0.5, beta1=0.0,
                               maximize=maximize)
    np.testing.assert_array_equal(x, -want if maximize else want)
    assert not np.signbit(x[[2, 3, 10, 11]]).any()  # x = +0 - lr * (+-0) is +0


def test_lion_propagates_nan_and_skips_with_skip_nonfinite():
    x, m = np.zeros(3), np.zeros(3)
    g = np.array([1.0, np.nan, -1.0])
    assert fastadam.lion_step_inplace(x, g, m, 1, skip_nonfinite=True) is False
    np.testing.assert_array_equal(x, 0)
    fastadam.lion_step_inplace(x, g, m, 1, lr=1.0)
    assert np.isnan(x[1]) and x[0] == -1.0 and x[2] == 1.0


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(alpha=1.5), ValueError, r"^alpha: expected 0 <= alpha <= 1, got 1.5"),
    (dict(eps=-1.0), ValueError, r"^eps: expected a number >= 0, got -1.0"),
    (dict(momentum=-0.1), ValueError, r"^momentum: expected a number >= 0, got -0.1"),
    (dict(lr=float("nan")), ValueError, r"^lr: expected a finite number"),
    (dict(convention="tf"), ValueError, r"^convention: expected one of \('torch', 'keras'\)"),
    (dict(momentum=0.9), ValueError, r"^momentum_buffer: momentum > 0 needs momentum_buffer"),
    (dict(centered=True), ValueError, r"^grad_avg: centered=True needs grad_avg"),
])
def test_rmsprop_errors_change_nothing(kwargs, error, match):
    x, g, v = np.ones(4), np.ones(4), np.zeros(4)
    with pytest.raises(error, match=match):
        fastadam.rmsprop_step_inplace(x, g, v, 1, **kwargs)
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(v, 0)


def test_rmsprop_t_must_be_positive():
    with pytest.raises(ValueError, match=r"^t: expected a step number >= 1, got 0"):
        fastadam.rmsprop_step_inplace(np.ones(2), np.ones(2), np.zeros(2), 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(beta1=1.5), r"^beta1: expected 0 <= beta1 <= 1"),
    (dict(beta2=-0.1), r"^beta2: expected 0 <= beta2 <= 1"),
    (dict(weight_decay=float("inf")), r"^weight_decay: expected a finite number"),
    (dict(grad_scale=0.0), r"^grad_scale: expected a non-zero number"),
])
def test_lion_errors_change_nothing(kwargs, match):
    x, m = np.ones(4), np.zeros(4)
    with pytest.raises(ValueError, match=match):
        fastadam.lion_step_inplace(x, np.ones(4), m, 1, **kwargs)
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(m, 0)


def test_sparse_rmsprop_centered_with_momentum_is_refused():
    x = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"^centered: the sparse RMSprop step keeps at most two"):
        fastadam.sparse_rmsprop_step_inplace(
            x, (np.array([1]), np.ones((1, 2))), np.zeros((4, 2)), 1, momentum=0.9,
            centered=True, momentum_buffer=np.zeros((4, 2)), grad_avg=np.zeros((4, 2)))
    np.testing.assert_array_equal(x, 1)
    opt = fastadam.RMSprop([x], momentum=0.9, centered=True)
    with pytest.raises(ValueError, match="centered=True with momentum > 0"):
        opt.step([fastadam.IndexedSlices(np.ones((1, 2)), np.array([1]), (4, 2))])
    np.testing.assert_array_equal(x, 1)


def test_object_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match=r"alpha: expected 0 <= alpha <= 1"):
        fastadam.RMSprop([np.zeros(3)], alpha=2.0)
    with pytest.raises(ValueError, match=r"^lr: expected a number >= 0"):
        fastadam.Lion([np.zeros(3)], lr=-1.0)
    with pytest.raises(TypeError, match=r"^betas: expected a pair"):
        fastadam.Lion([np.zeros(3)], betas=0.9)
    with pytest.raises(ValueError, match="centered: fixed when the optimizer is built"):
        fastadam.RMSprop([np.zeros(3)]).set_hyperparameters(centered=True)
