"""Every registered primitive of fastadam.autodiff passes check_grads to order 2 (float64)."""
import numpy as np
import pytest

import fastadam.autodiff as ad
from fastadam.autodiff import _nn, _ops
from fastadam.autodiff._registry import Primitive

rng = np.random.default_rng(1234)


def r(*shape):
    return rng.standard_normal(shape)


def pos(*shape):
    return rng.uniform(0.5, 2.0, shape)


def away(*shape):
    """Normal values kept away from 0 (the kinks of relu/abs/clip)."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 0.2, 0.2 * np.sign(x) + 0.3 * np.sign(x), x)


LABELS = np.array([0, 2, 1, 2, 3])
IDX = np.array([[1, 3], [3, 0], [4, 1]])

CASES = {
    "add": (lambda a, b: a + b, [r(3, 4), r(4)]),
    "add_scalar": (lambda a: 2.5 + a, [r(2, 3)]),
    "multiply_0d_broadcast": (lambda a, b: a * b + a * a, [np.asarray(r()), r(3)]),
    "subtract": (lambda a, b: a - b, [r(3, 1), r(1, 4)]),
    "multiply": (lambda a, b: a * b, [r(2, 3, 4), r(3, 1)]),
    "divide": (lambda a, b: a / b, [r(3, 4), pos(4)]),
    "rdivide": (lambda a: 1.0 / a, [pos(3, 2)]),
    "power": (lambda a, b: a ** b, [pos(3, 4), r(4)]),
    "power_const": (lambda a: a ** 3, [r(3, 4)]),
    "negative": (lambda a: -a, [r(5)]),
    "matmul": (lambda a, b: a @ b, [r(3, 4), r(4, 2)]),
    "matmul_batched": (lambda a, b: ad.matmul(a, b), [r(2, 3, 4), r(4, 5)]),
    "matmul_vec_right": (lambda a, b: a @ b, [r(3, 4), r(4)]),
    "matmul_vec_left": (lambda a, b: a @ b, [r(4), r(4, 3)]),
    "matmul_vec_vec": (lambda a, b: a @ b, [r(4), r(4)]),
    "matmul_batched_vec": (lambda a, b: a @ b, [r(4), r(2, 4, 3)]),
    "gemm": (lambda a, b, c: ad.gemm(a, b, c, alpha=0.7, beta=1.3), [r(3, 4), r(4, 2), r(2)]),
    "gemm_trans": (lambda a, b, c: ad.gemm(a, b, c, trans_a=True, trans_b=True),
                   [r(4, 3), r(2, 4), r(3, 2)]),
    # trans_b alone is one primitive (matmul_nt), the layout of ONNX Gemm(transB=1)
    "gemm_trans_b": (lambda a, b, c: ad.gemm(a, b, c, beta=0.5, trans_b=True),
                     [r(3, 4), r(2, 4), r(2)]),
    # ... and with a bias (n,) at alpha = beta = 1 (a torch.nn.Linear), one op: matmul_nt_add
    "gemm_trans_b_bias": (lambda a, b, c: ad.gemm(a, b, c, trans_b=True),
                          [r(3, 4), r(2, 4), r(2)]),
    "conv2d": (lambda x, w, b: ad.conv2d(x, w, b), [r(2, 3, 5, 6), r(4, 3, 3, 3), r(4)]),
    "conv2d_stride_pad_dil": (lambda x, w: ad.conv2d(x, w, stride=(2, 1), padding=(1, 2),
                                                     dilation=(1, 2)),
                              [r(2, 2, 7, 6), r(3, 2, 3, 2)]),
    "conv2d_groups": (lambda x, w: ad.conv2d(x, w, stride=2, padding=1, groups=2),
                      [r(1, 4, 6, 5), r(6, 2, 3, 3)]),
    "relu": (ad.relu, [away(4, 5)]),
    "relu_grad": (_ops.relu_grad, [r(3, 4), away(3, 4)]),
    "sigmoid": (ad.sigmoid, [r(4, 5)]),
    "sigmoid_grad": (_ops.sigmoid_grad, [r(3, 4), rng.uniform(0.1, 0.9, (3, 4))]),
    "tanh": (ad.tanh, [r(4, 5)]),
    "tanh_grad": (_ops.tanh_grad, [r(3, 4), rng.uniform(-0.9, 0.9, (3, 4))]),
    "exp": (ad.exp, [r(3, 4)]),
    "log": (ad.log, [pos(3, 4)]),
    "sqrt": (ad.sqrt, [pos(3, 4)]),
    "abs": (ad.abs, [away(3, 4)]),
    "softmax": (ad.softmax, [r(3, 5)]),
    "softmax_axis0": (lambda x: ad.softmax(x, axis=0), [r(3, 5)]),
    "log_softmax": (ad.log_softmax, [r(3, 5)]),
    "log_softmax_axis0": (lambda x: ad.log_softmax(x, axis=0), [r(2, 3, 4)]),
    "softmax_cross_entropy": (lambda x, y: ad.softmax_cross_entropy(x, y), [r(5, 4), LABELS]),
    "mse": (ad.mse, [r(3, 4), r(3, 4)]),
    "mse_broadcast": (ad.mse, [r(3, 4), r(4)]),
    "sum": (lambda x: x.sum(), [r(3, 4)]),
    "sum_axis": (lambda x: ad.sum(x, axis=1), [r(3, 4, 2)]),
    "sum_axes_keepdims": (lambda x: x.sum(axis=(0, 2), keepdims=True), [r(3, 4, 2)]),
    "mean": (lambda x: x.mean(), [r(3, 4)]),
    "mean_axis_keepdims": (lambda x: ad.mean(x, axis=-1, keepdims=True), [r(3, 4)]),
    "max": (lambda x: x.max(), [r(3, 4)]),
    "max_axis": (lambda x: ad.max(x, axis=0), [r(3, 4)]),
    "max_axis_keepdims": (lambda x: x.max(axis=1, keepdims=True), [r(3, 4)]),
    "reshape": (lambda x: ad.reshape(x, (6, 2)) * ad.reshape(x, (6, 2)), [r(3, 4)]),
    "reshape_method": (lambda x: x.reshape(2, -1) ** 2, [r(3, 4)]),
    "transpose": (lambda x: ad.transpose(x, (2, 0, 1)) ** 2, [r(2, 3, 4)]),
    "transpose_T": (lambda x: x.T @ x, [r(3, 4)]),
    "concatenate": (lambda a, b: ad.concatenate([a, b * b, a], axis=1), [r(2, 3), r(2, 2)]),
    "getitem_slice": (lambda x: x[1:, ::2] ** 2, [r(3, 5)]),
    "getitem_int": (lambda x: x[1] * x[2], [r(3, 5)]),
    "getitem_advanced_repeats": (lambda x: x[np.array([0, 2, 0])] ** 2, [r(3, 4)]),
    "where": (lambda a, b: ad.where(a.data > 0, a * a, b), [r(3, 4), r(4)]),
    "clip": (lambda x: ad.clip(x, -0.5, 0.7) ** 2, [away(4, 5) * 0.7 + 0.05]),
    "take": (lambda t, i: ad.take(t, i) ** 2, [r(5, 3), IDX]),
    "broadcast_to": (lambda x: ad.broadcast_to(x, shape=(3, 4)) ** 2, [r(4)]),
    "sum_to": (lambda x: ad.sum_to(x, shape=(1, 4)) ** 2, [r(3, 4)]),
    "sign": (lambda x: ad.sign(x) * x, [away(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_grads_order_2(name):
    f, args = CASES[name]
    ad.check_grads(f, *args, order=2)


@pytest.mark.parametrize("name", ["multiply", "tanh", "sigmoid", "softmax_cross_entropy",
                                  "conv2d", "matmul", "log_softmax", "take"])
def test_check_grads_order_3(name):
    f, args = CASES[name]
    ad.check_grads(f, *args, order=3)


def _registered():
    prims = {}
    for mod in (_ops, _nn):
        for v in vars(mod).values():
            if isinstance(v, Primitive):
                prims[v.name] = v
    return prims


def test_every_registered_primitive_has_vjps():
    prims = _registered()
    assert len(prims) >= 35
    for name, p in prims.items():
        assert p.vjps or p.vjp_argnum is not None, name


def test_every_public_primitive_is_covered():
    public = {"add", "subtract", "multiply", "divide", "power", "negative", "matmul", "gemm",
              "conv2d", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "softmax",
              "log_softmax", "softmax_cross_entropy", "mse", "sum", "mean", "max", "reshape",
              "transpose", "concatenate", "getitem", "where", "clip", "take"}
    covered = {k.split("_")[0] for k in CASES} | set(CASES)
    covered |= {"getitem", "log_softmax", "softmax_cross_entropy"}
    assert public <= covered


def test_check_grads_catches_a_wrong_vjp():
    @ad.primitive
    def cube(x):
        return x ** 3

    ad.defvjp(cube, lambda g, ans, x: g * 2 * x * x)  # wrong: should be 3 x^2
    with pytest.raises(AssertionError, match="order 1 does not match"):
        ad.check_grads(cube, r(4), order=1)


def test_check_grads_catches_a_wrong_second_derivative():
    @ad.primitive
    def square(x):
        return x * x

    ad.defvjp(square, lambda g, ans, x: ad.Tensor(2 * g.data * x.data))  # not differentiable
    ad.check_grads(square, r(4), order=1)
    with pytest.raises(AssertionError, match="order 2 does not match"):
        ad.check_grads(square, r(4), order=2)


def test_check_grads_errors():
    with pytest.raises(ValueError, match="order: expected an int >= 1"):
        ad.check_grads(ad.exp, r(3), order=0)
    with pytest.raises(ValueError, match="no floating-point argument"):
        ad.check_grads(lambda i: i, np.arange(3))
    with pytest.raises(TypeError, match="expected a Tensor result"):
        ad.check_grads(lambda x: 3.0, r(3))


def test_transpose_gradient_is_the_inverse_permutation_negative_axes_included():
    x = ad.Tensor(np.arange(120.0).reshape(2, 3, 4, 5), requires_grad=True)
    g = np.random.default_rng(0).standard_normal
    for axes in [(0, 2, 1, 3), (3, 1, 0, 2), (-1, 0, 1, 2), (1, -4, 2, 3), None]:
        y = ad.transpose(x, axes)
        u = g(y.shape)
        (gx,) = ad.gradient(y, [x], grad_output=u)
        perm = np.argsort(np.array(axes) % 4) if axes is not None else None
        np.testing.assert_array_equal(gx.data, np.transpose(u, perm), err_msg=str(axes))
