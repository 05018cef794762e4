"""fastadam.autodiff primitives added for the ONNX front-end (autodiff/_ops_extra.py): finite
differences to second order, forward results against PyTorch, bad input."""
import numpy as np
import pytest

import fastadam.autodiff as ad

POOLS = [dict(kernel_shape=(2, 2), strides=(2, 2)),
         dict(kernel_shape=(3, 3), strides=(1, 2), pads=(1, 0, 1, 2)),
         dict(kernel_shape=(3, 2), dilations=(2, 1))]


@pytest.fixture
def x4(rng):
    return rng.standard_normal((2, 3, 7, 6))


@pytest.mark.parametrize("p", POOLS)
def test_max_pool_derivatives(x4, p):
    ad.check_grads(lambda t: ad.max_pool2d(t, **p) * ad.max_pool2d(t, **p), x4, order=2)


@pytest.mark.parametrize("p", POOLS)
@pytest.mark.parametrize("include", [False, True])
def test_avg_pool_derivatives(x4, p, include):
    ad.check_grads(lambda t: ad.avg_pool2d(t, count_include_pad=include, **p) ** 2, x4, order=2)


def test_pools_match_torch(x4):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    xt = torch.tensor(x4)
    np.testing.assert_allclose(ad.max_pool2d(x4, (3, 3), (2, 2), (1, 1, 1, 1)).data,
                               F.max_pool2d(xt, 3, 2, 1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ad.max_pool2d(x4, (2, 3), (1, 1), None, (2, 2)).data,
                               F.max_pool2d(xt, (2, 3), 1, 0, (2, 2)).numpy(), rtol=1e-12)
    for include in (False, True):
        np.testing.assert_allclose(
            ad.avg_pool2d(x4, (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=include).data,
            F.avg_pool2d(xt, 3, 2, 1, count_include_pad=include).numpy(), rtol=1e-12)
    # the gradient goes to the window's maximum, as torch's does (no ties in random data)
    t = ad.Tensor(x4, requires_grad=True)
    g, = ad.gradient(ad.max_pool2d(t, (2, 2), (2, 2)).sum(), [t])
    xr = torch.tensor(x4, requires_grad=True)
    F.max_pool2d(xr, 2, 2).sum().backward()
    np.testing.assert_array_equal(g.data, xr.grad.numpy())


def test_leaky_relu(rng):
    x = rng.standard_normal((4, 5))
    ad.check_grads(lambda t: ad.leaky_relu(t, 0.1) ** 2, x, order=2)
    np.testing.assert_allclose(ad.leaky_relu(x, 0.1).data, np.where(x > 0, x, 0.1 * x))


def test_cast_and_pad(rng, x4):
    ad.check_grads(lambda t: ad.cast(ad.cast(t, np.float32), np.float64) ** 2, x4, order=2,
                   eps=1e-3, rtol=1e-3, atol=1e-4)
    ad.check_grads(lambda t: ad.pad(t, ((0, 0), (1, 0), (2, 1), (0, 3))) ** 2, x4, order=2)
    y = ad.pad(x4, ((0, 0), (1, 0), (2, 1), (0, 3)), value=0.0).data
    np.testing.assert_array_equal(y, np.pad(x4, ((0, 0), (1, 0), (2, 1), (0, 3))))


def test_gather_and_take_along_axis(rng, x4):
    idx = np.array([[0, -1], [2, 2]])
    ad.check_grads(lambda t: ad.gather(t, idx, axis=2) ** 2, x4, order=2)
    np.testing.assert_array_equal(ad.gather(x4, idx, axis=2).data, np.take(x4, idx % 7, axis=2))
    along = rng.integers(0, 6, (2, 3, 7, 2))
    ad.check_grads(lambda t: ad.take_along_axis(t, along, axis=-1) ** 2, x4, order=2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_torch(rng, reduction):
    torch = pytest.importorskip("torch")
    lp = rng.standard_normal((5, 4, 3))
    tg = rng.integers(0, 4, (5, 3))
    tg[0, 0] = 2
    w = rng.random(4)
    ours = ad.nll_loss(lp, tg, weight=w, reduction=reduction, ignore_index=2).data
    ref = torch.nn.functional.nll_loss(torch.tensor(lp), torch.tensor(tg), weight=torch.tensor(w),
                                       reduction=reduction, ignore_index=2).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12)
    ad.check_grads(lambda t: ad.nll_loss(ad.log_softmax(t, axis=1), tg, weight=w,
                                         reduction=reduction) ** 2, lp, order=2)


def test_batch_norm(rng, x4):
    torch = pytest.importorskip("torch")
    s, b, m, v = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3), \
        rng.random(3) + 0.5
    ref = torch.nn.functional.batch_norm(torch.tensor(x4), torch.tensor(m), torch.tensor(v),
                                         torch.tensor(s), torch.tensor(b), eps=1e-3).numpy()
    np.testing.assert_allclose(ad.batch_norm(x4, s, b, m, v, 1e-3).data, ref, rtol=1e-12)
    ad.check_grads(lambda t, s_, b_: ad.batch_norm(t, s_, b_, m, v) ** 2, x4, s, b, order=2)


# --- bad input ---------------------------------------------------------------------------------

def test_pool_needs_4d(rng):
    with pytest.raises(ValueError, match=r"x: expected a 4-D \(N, C, H, W\) tensor"):
        ad.max_pool2d(rng.standard_normal((3, 4, 4)), (2, 2))


def test_pool_window_too_large(rng):
    with pytest.raises(ValueError, match="kernel_shape: a 5x5 window"):
        ad.avg_pool2d(rng.standard_normal((1, 1, 4, 4)), (5, 5))


def test_pool_bad_stride(rng):
    with pytest.raises(ValueError, match="must be >= 1"):
        ad.max_pool2d(rng.standard_normal((1, 1, 4, 4)), (2, 2), strides=(0, 1))


def test_gather_out_of_range(rng):
    with pytest.raises(IndexError, match=r"indices: values must lie in \[-3, 3\)"):
        ad.gather(rng.standard_normal((3, 2)), np.array([3]))


def test_gather_float_indices(rng):
    with pytest.raises(TypeError, match="indices: expected an integer array"):
        ad.gather(rng.standard_normal((3, 2)), np.array([1.0]))


def test_nll_target_shape(rng):
    with pytest.raises(ValueError, match=r"target: expected shape \(4,\)"):
        ad.nll_loss(rng.standard_normal((4, 3)), np.zeros(5, np.int64))


def test_nll_target_out_of_range(rng):
    with pytest.raises(IndexError, match=r"target: class indices must lie in \[0, 3\)"):
        ad.nll_loss(rng.standard_normal((2, 3)), np.array([0, 3]))


def test_nll_bad_reduction(rng):
    with pytest.raises(ValueError, match="reduction: expected 'none', 'sum' or 'mean'"):
        ad.nll_loss(rng.standard_normal((2, 3)), np.array([0, 1]), reduction="avg")


def test_pad_bad_pairs(rng):
    with pytest.raises(ValueError, match="pads: expected 2 pairs of non-negative ints"):
        ad.pad(rng.standard_normal((2, 2)), ((0, 1),))
