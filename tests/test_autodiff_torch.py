"""fastadam.autodiff against PyTorch autograd: an MLP, a conv layer, and the second-derivative
examples of ONNX's Gradient operator (Conv -> Gemm -> loss; d^2O/dW^2 of a linear model)."""
import numpy as np
import pytest

import fastadam.autodiff as ad
from fastadam.autodiff import Tensor, gradient

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(11)
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def pair(a):
    return Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_matches_torch(dtype):
    x = rng.standard_normal((32, 20)).astype(dtype)
    y = rng.integers(0, 10, 32)
    params = [(rng.standard_normal(s) * 0.3).astype(dtype)
              for s in [(20, 16), (16,), (16, 16), (16,), (16, 10), (10,)]]
    ours = [Tensor(p, requires_grad=True) for p in params]
    theirs = [torch.tensor(p, requires_grad=True) for p in params]
    h = Tensor(x)
    th = torch.tensor(x)
    for i in range(0, 6, 2):
        h = h @ ours[i] + ours[i + 1]
        th = th @ theirs[i] + theirs[i + 1]
        if i < 4:
            h, th = ad.relu(h), torch.relu(th)
    loss = ad.softmax_cross_entropy(h, y)
    tloss = F.cross_entropy(th, torch.tensor(y))
    grads = gradient(loss, ours)
    tgrads = torch.autograd.grad(tloss, theirs)
    np.testing.assert_allclose(loss.data, tloss.detach().numpy(), **TOL[dtype])
    for g, tg in zip(grads, tgrads):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.data, tg.numpy(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(stride=1, padding=1), dict(stride=2, padding=0, dilation=2),
                                dict(stride=1, padding=1, groups=3)])
def test_conv_layer_matches_torch(dtype, kw):
    x, tx = pair(rng.standard_normal((4, 6, 11, 10)).astype(dtype))
    w, tw = pair(rng.standard_normal((9, 6 // kw.get("groups", 1), 3, 3)).astype(dtype))
    b, tb = pair(rng.standard_normal(9).astype(dtype))
    loss = ad.relu(ad.conv2d(x, w, b, **kw)).mean()
    tloss = torch.relu(F.conv2d(tx, tw, tb, **kw)).mean()
    np.testing.assert_allclose(loss.data, tloss.detach().numpy(), **TOL[dtype])
    for g, tg in zip(gradient(loss, [x, w, b]), torch.autograd.grad(tloss, [tx, tw, tb])):
        np.testing.assert_allclose(g.data, tg.numpy(), **TOL[dtype])


def test_onnx_conv_gemm_loss_second_derivatives_match_torch():
    # X -> Conv(W) -> H -> Gemm(Z) -> Y -> loss O; dO/dW, dO/dZ, then d(sum dO/dW)/dX and /dZ
    x, tx = pair(rng.standard_normal((3, 2, 6, 6)))
    w, tw = pair(rng.standard_normal((4, 2, 3, 3)))
    z, tz = pair(rng.standard_normal((4 * 4 * 4, 5)))
    labels = rng.integers(0, 5, 3)
    h = ad.reshape(ad.tanh(ad.conv2d(x, w)), (3, 64))
    o = ad.softmax_cross_entropy(ad.gemm(h, z), labels)
    th = torch.tanh(F.conv2d(tx, tw)).reshape(3, 64)
    to = F.cross_entropy(th @ tz, torch.tensor(labels))
    gw, gz = gradient(o, [w, z], zs=[x], create_graph=True)
    tgw, tgz = torch.autograd.grad(to, [tw, tz], create_graph=True)
    np.testing.assert_allclose(gw.data, tgw.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(gz.data, tgz.detach().numpy(), rtol=1e-10)
    d2 = gradient(gw.sum() + (gz * gz).sum(), [x, w, z])
    td2 = torch.autograd.grad(tgw.sum() + (tgz * tgz).sum(), [tx, tw, tz])
    for a, b in zip(d2, td2):
        np.testing.assert_allclose(a.data, b.numpy(), rtol=1e-9, atol=1e-12)


def test_onnx_dh_intermediate_matches_torch():
    x, tx = pair(rng.standard_normal((2, 2, 5, 5)))
    w, tw = pair(rng.standard_normal((3, 2, 3, 3)))
    z, tz = pair(rng.standard_normal((27, 4)))
    h = ad.reshape(ad.conv2d(x, w), (2, 27))
    y = ad.gemm(h, z)
    th = F.conv2d(tx, tw).reshape(2, 27)
    ty = th @ tz
    seed = np.ones((2, 4))
    gh, gz = gradient(y, [h, z], grad_output=seed)
    tgh, tgz = torch.autograd.grad(ty, [th, tz], grad_outputs=torch.ones(2, 4))
    np.testing.assert_allclose(gh.data, tgh.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gz.data, tgz.numpy(), rtol=1e-12)


def test_linear_model_hessian_matches_analytic_and_torch():
    # O = mean((X W - L)^2) with W (3, 1): Hessian d^2O/dW^2 = 2 X^T X / N (analytic)
    xv = rng.standard_normal((8, 3))
    lv = rng.standard_normal((8, 1))
    w, tw = pair(rng.standard_normal((3, 1)))
    x = Tensor(xv)
    o = ad.mse(ad.gemm(x, w), Tensor(lv))
    (gw,) = gradient(o, [w], create_graph=True)
    hessian = np.stack([gradient(gw[k, 0], [w], retain_graph=True)[0].data[:, 0]
                        for k in range(3)])
    np.testing.assert_allclose(hessian, 2 * xv.T @ xv / 8, rtol=1e-12)
    to = F.mse_loss(torch.tensor(xv) @ tw, torch.tensor(lv))
    th = torch.autograd.functional.hessian(lambda t: F.mse_loss(torch.tensor(xv) @ t,
                                                                torch.tensor(lv)), tw.detach())
    np.testing.assert_allclose(hessian, th.numpy().reshape(3, 3), rtol=1e-12)
    assert to.requires_grad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hessian_vector_product_matches_torch(dtype):
    x = rng.standard_normal((16, 12)).astype(dtype)
    y = rng.integers(0, 4, 16)
    pv = [(rng.standard_normal(s) * 0.3).astype(dtype) for s in [(12, 8), (8,), (8, 4), (4,)]]
    vv = [rng.standard_normal(p.shape).astype(dtype) for p in pv]
    ps = [Tensor(p, requires_grad=True) for p in pv]
    tps = [torch.tensor(p, requires_grad=True) for p in pv]
    loss = ad.softmax_cross_entropy(ad.tanh(Tensor(x) @ ps[0] + ps[1]) @ ps[2] + ps[3], y)
    tl = F.cross_entropy(torch.tanh(torch.tensor(x) @ tps[0] + tps[1]) @ tps[2] + tps[3],
                         torch.tensor(y))
    gs = gradient(loss, ps, create_graph=True)
    dot = sum((g * Tensor(v)).sum() for g, v in zip(gs, vv))
    hv = gradient(dot, ps)
    tgs = torch.autograd.grad(tl, tps, create_graph=True)
    thv = torch.autograd.grad(sum((g * torch.tensor(v)).sum() for g, v in zip(tgs, vv)), tps)
    for a, b in zip(hv, thv):
        assert a.dtype == dtype
        np.testing.assert_allclose(a.data, b.numpy(), **{k: v * 10 for k, v in TOL[dtype].items()})
