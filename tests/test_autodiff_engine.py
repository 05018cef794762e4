"""fastadam.autodiff engine: ONNX Gradient semantics, tape management, errors, dtypes."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastadam
import fastadam.autodiff as ad
from fastadam import IndexedSlices
from fastadam.autodiff import Tensor, gradient

import reference as ref

rng = np.random.default_rng(7)


def leaf(*shape, dtype=np.float64):
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


# ---- ONNX Gradient semantics ---------------------------------------------------------------

def test_gradient_wrt_leaves_matches_analytic():
    w, x = leaf(3, 2), leaf(4, 3)
    y = (x @ w).sum()
    gw, gx = gradient(y, [w, x])
    np.testing.assert_allclose(gw.data, x.data.sum(0)[:, None] * np.ones((1, 2)))
    np.testing.assert_allclose(gx.data, np.ones((4, 2)) @ w.data.T)


def test_intermediate_in_xs_acts_as_independent_input():
    # W -> Conv -> H -> Gemm -> Y, gradient with xs = [H, Z]
    x, w, z = leaf(2, 1, 4, 4), leaf(2, 1, 3, 3), leaf(8, 3)
    h = ad.conv2d(x, w)                    # (2, 2, 2, 2)
    hf = ad.reshape(h, (2, 8))
    y = ad.gemm(hf, z)
    gh, gz = gradient(y, [hf, z], grad_output=np.ones((2, 3)), retain_graph=True)
    np.testing.assert_allclose(gh.data, np.ones((2, 3)) @ z.data.T)
    np.testing.assert_allclose(gz.data, hf.data.T @ np.ones((2, 3)))
    # with both H and W in xs, nothing flows past H: W's gradient only via other paths (none)
    gh2, gw = gradient(y, [hf, w], grad_output=np.ones((2, 3)), allow_unused=True)
    assert gw is None
    np.testing.assert_allclose(gh2.data, gh.data)


def test_zs_are_constants():
    a, b = leaf(3), leaf(3)
    c = a * b
    y = (c * a).sum()           # d/da = 2ab
    (ga,) = gradient(y, [a], retain_graph=True)
    np.testing.assert_allclose(ga.data, 2 * a.data * b.data)
    (ga_z,) = gradient(y, [a], zs=[c])  # c held constant: d/da = c
    np.testing.assert_allclose(ga_z.data, c.data)


def test_none_in_xs_skips_output():
    a, b = leaf(3), leaf(3)
    out = gradient((a * b).sum(), [None, b, None])
    assert out[0] is None and out[2] is None
    np.testing.assert_allclose(out[1].data, a.data)


def test_allow_unused():
    a, b = leaf(3), leaf(3)
    with pytest.raises(ValueError, match=r"xs\[1\] is not used to compute y"):
        gradient((a * 2).sum(), [a, b], retain_graph=True)
    ga, gb = gradient((a * 2).sum(), [a, b], allow_unused=True)
    assert gb is None
    np.testing.assert_allclose(ga.data, 2.0)


def test_y_in_xs_gives_the_seed():
    a = leaf(3)
    y = a * 2
    (gy,) = gradient(y, [y], grad_output=np.full(3, 5.0))
    np.testing.assert_allclose(gy.data, 5.0)


def test_grad_output_seed_for_nonscalar_y():
    a = leaf(2, 3)
    y = a * a
    with pytest.raises(ValueError, match="a non-scalar y needs a grad_output seed"):
        gradient(y, [a], retain_graph=True)
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3\)"):
        gradient(y, [a], grad_output=np.ones(3), retain_graph=True)
    seed = rng.standard_normal((2, 3))
    (ga,) = gradient(y, [a], grad_output=seed)
    np.testing.assert_allclose(ga.data, 2 * a.data * seed)


def test_second_derivative_of_linear_model_is_analytic():
    # O = mean((X W - L)^2): d^2O/dW^2 (contracted with ones) = 2 X^T X 1 / (N M)
    x = leaf(5, 3)
    w = leaf(3, 2)
    lab = Tensor(rng.standard_normal((5, 2)))
    o = ad.mse(ad.gemm(x, w), lab)
    gx, gw = gradient(o, [x, w], zs=[lab], create_graph=True)
    d2x, d2w = gradient(gw.sum(), [x, w], zs=[lab])
    n_m = 5 * 2
    np.testing.assert_allclose(d2w.data, 2 * x.data.T @ x.data @ np.ones((3, 2)) / n_m)
    # d(sum dO/dW)/dX analytic: dO/dW = 2 X^T (XW - L) / nm
    r = x.data @ w.data - lab.data
    expected = 2 * (r.sum(1)[:, None] + x.data.sum(1)[:, None] * w.data.sum(1)[None, :]) / n_m
    np.testing.assert_allclose(d2x.data, expected)


def test_third_derivative():
    x = Tensor(np.array([0.3, -1.2, 2.0]), requires_grad=True)
    y = (x ** 4).sum()
    (g1,) = gradient(y, [x], create_graph=True)
    (g2,) = gradient(g1.sum(), [x], create_graph=True)
    (g3,) = gradient(g2.sum(), [x])
    np.testing.assert_allclose(g3.data, 24 * x.data)


# ---- tape management -------------------------------------------------------------------------

def test_tape_is_freed_unless_retained():
    a = leaf(3)
    y = (ad.exp(a) * a).sum()
    gradient(y, [a], retain_graph=True)
    gradient(y, [a])
    with pytest.raises(RuntimeError, match="pass retain_graph=True to the first gradient call"):
        gradient(y, [a])


def test_backward_freed_graph_error():
    a = leaf(3)
    y = (a * a).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="saved tensors were freed"):
        y.backward()


def test_version_counter_detects_inplace_modification_of_saved_input():
    a, b = leaf(3), leaf(3)
    c = a * 1.0
    y = (c * b).sum()
    c += 1.0
    with pytest.raises(RuntimeError,
                       match=r"saved by 'multiply' \(argument 0\) was modified in place"):
        gradient(y, [a, b])


def test_version_counter_detects_setitem_on_leaf():
    a = leaf(3)
    y = ad.exp(a).sum()
    a[0] = 5.0
    with pytest.raises(RuntimeError, match=r"saved by 'exp' \(argument 0\) was modified"):
        gradient(y, [a])


def test_version_counter_detects_modified_output():
    a = leaf(3)
    s = ad.sigmoid(a)
    s *= 2.0
    with pytest.raises(RuntimeError, match="the output of 'sigmoid' was modified in place"):
        gradient(s, [a], grad_output=np.ones(3))


def test_deep_graph_has_no_recursion_limit():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x
    for _ in range(20000):
        y = y * 1.0001
    (g,) = gradient(y.sum(), [x])
    np.testing.assert_allclose(g.data, 1.0001 ** 20000, rtol=1e-9)
    z = x
    for _ in range(20000):
        z = z + x
    z.sum().backward()
    np.testing.assert_allclose(x.grad.data, 20001.0)


def test_accumulation_does_not_alias():
    a = leaf(4)
    b = a + a  # the same cotangent reaches a twice
    y = (b * 3.0).sum()
    (ga,) = gradient(y, [a])
    np.testing.assert_allclose(ga.data, 6.0)
    # the shared seed buffer must not be modified by accumulation
    seed = np.ones(4)
    c = leaf(4)
    d = c + c + c
    (gc,) = gradient(d, [c], grad_output=seed)
    np.testing.assert_allclose(gc.data, 3.0)
    np.testing.assert_array_equal(seed, np.ones(4))


def test_backward_accumulates_into_leaves():
    a, b = leaf(3), leaf(3)
    ((a * b).sum()).backward()
    np.testing.assert_allclose(a.grad.data, b.data)
    ((a * 2).sum()).backward()
    np.testing.assert_allclose(a.grad.data, b.data + 2)
    c = leaf(3)
    (c + c).sum().backward()
    d, e = leaf(3), leaf(3)
    (d + e).sum().backward()
    assert d.grad.data is not e.grad.data


def test_no_grad_records_nothing():
    a = leaf(3)
    with ad.no_grad():
        y = a * 2
    assert y.is_leaf and not y.requires_grad
    assert ad.is_grad_enabled()


# ---- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved_end_to_end(dtype):
    x = Tensor(rng.standard_normal((6, 5)).astype(dtype))
    w1, b1 = leaf(5, 4, dtype=dtype), leaf(4, dtype=dtype)
    w2 = leaf(2, 2, 3, 3, dtype=dtype)
    t = leaf(7, 3, dtype=dtype)
    h = ad.sigmoid(ad.tanh(x @ w1 + b1) * 2.0 - 1) / 3.0 + 0.5
    h = ad.softmax(h) + ad.log_softmax(h) + ad.sqrt(ad.abs(h) + 1) + ad.exp(-h) + ad.log(h + 2)
    h = ad.clip(h ** 2, 0.0, 5.0)
    img = ad.conv2d(ad.reshape(ad.concatenate([h, h], axis=1), (6, 2, 2, 2)), w2, padding=1)
    emb = ad.take(t, np.array([1, 2, 3, 1, 0, 6]))
    loss = (ad.softmax_cross_entropy(emb @ emb.T, np.arange(6)) + ad.relu(img).mean()
            + ad.mse(img.max(axis=1), 0.5) + ad.where(h.data > 1, h, 0.0).sum())
    assert loss.dtype == dtype
    grads = gradient(loss, [w1, b1, w2, t])
    for g in grads[:3]:
        assert g.dtype == dtype
    assert isinstance(grads[3], IndexedSlices) and grads[3].dtype == dtype


def test_python_scalars_do_not_promote_float32():
    a = leaf(3, dtype=np.float32)
    for y in (a + 1.5, 2.0 * a, a / 3.0, 1.0 - a, a ** 2, 2.0 ** a):
        assert y.dtype == np.float32
        (g,) = gradient(y.sum(), [a])
        assert g.dtype == np.float32


def test_integer_inputs_are_not_differentiable():
    with pytest.raises(TypeError, match="integer and boolean tensors are not differentiable"):
        Tensor(np.arange(3), requires_grad=True)
    a = leaf(3)
    i = Tensor(np.arange(3))
    y = (a * i).sum()
    with pytest.raises(TypeError, match=r"xs\[1\]: integer and boolean tensors are not diff"):
        gradient(y, [a, i])


# ---- take -> IndexedSlices ---------------------------------------------------------------------

def test_take_gradient_is_indexed_slices():
    table = leaf(6, 3)
    idx = np.array([[4, 1], [4, 0]])
    y = (ad.take(table, idx) * np.arange(12.0).reshape(2, 2, 3)).sum()
    (g,) = gradient(y, [table])
    assert isinstance(g, IndexedSlices)
    np.testing.assert_array_equal(g.indices, idx.ravel())
    assert g.values.shape == (4, 3) and g.dense_shape == (6, 3)
    dense = np.zeros((6, 3))
    np.add.at(dense, idx.ravel(), np.arange(12.0).reshape(4, 3))
    np.testing.assert_allclose(g.to_dense(), dense)


def test_take_gradients_stay_sparse_then_densify():
    table = leaf(5, 2)
    y = ad.take(table, np.array([0, 1])).sum() + ad.take(table, np.array([1, 4])).sum()
    (g,) = gradient(y, [table], retain_graph=True)
    assert isinstance(g, IndexedSlices) and g.indices.tolist() in ([1, 4, 0, 1], [0, 1, 1, 4])
    y2 = y + (table * 2).sum()
    (g2,) = gradient(y2, [table])
    np.testing.assert_allclose(g2.data, g.to_dense() + 2)


def test_take_errors():
    t = leaf(3, 2)
    with pytest.raises(TypeError, match="indices: expected an integer array"):
        ad.take(t, np.array([0.0]))
    with pytest.raises(IndexError, match=r"indices: values must lie in \[0, 3\)"):
        ad.take(t, np.array([3]))


# ---- registry ----------------------------------------------------------------------------------

def test_user_primitive_with_defvjp():
    @ad.primitive
    def softplus(x):
        return np.logaddexp(0, x)

    ad.defvjp(softplus, lambda g, ans, x: g * ad.sigmoid(x))
    ad.check_grads(softplus, rng.standard_normal(5), order=2)


def test_missing_vjp_names_op_and_argument():
    @ad.primitive
    def hypot(a, b):
        return np.hypot(a, b)

    ad.defvjp(hypot, lambda g, ans, a, b: g * a / ans)
    a, b = leaf(3), leaf(3)
    y = hypot(a, b).sum()
    gradient(y, [a], retain_graph=True)
    with pytest.raises(NotImplementedError,
                       match="VJP of primitive 'hypot' with respect to argument 1 is not "
                             "registered"):
        gradient(y, [b])


def test_defvjp_rejects_non_primitive():
    with pytest.raises(TypeError, match="prim: expected a primitive"):
        ad.defvjp(np.exp, lambda g, ans, x: g)


def test_wrong_vjp_shape_is_reported():
    @ad.primitive
    def bad(x):
        return x * 2

    ad.defvjp(bad, lambda g, ans, x: g.sum())
    a = leaf(3)
    with pytest.raises(RuntimeError, match=r"VJP of 'bad' for argument 0 returned shape \(\)"):
        gradient(bad(a).sum(), [a])


# ---- argument errors -------------------------------------------------------------------------

def test_argument_errors():
    a = leaf(3)
    with pytest.raises(TypeError, match="y: expected a Tensor"):
        gradient(np.ones(3), [a])
    with pytest.raises(TypeError, match="xs: expected a sequence of Tensors"):
        gradient(a.sum(), a)
    with pytest.raises(TypeError, match=r"xs\[0\]: expected a Tensor or None"):
        gradient(a.sum(), [np.ones(3)])
    with pytest.raises(TypeError, match=r"zs\[0\]: expected a Tensor"):
        gradient(a.sum(), [a], zs=[np.ones(3)])
    with pytest.raises(RuntimeError, match="backward: y does not require gradients"):
        Tensor(np.ones(3)).sum().backward()
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        ad.sum(a, axis=2)
    with pytest.raises(ValueError, match="gemm: expected 2-D a and b"):
        ad.gemm(a, a)
    with pytest.raises(ValueError, match="tensors: expected at least one tensor"):
        ad.concatenate([])


def test_conv2d_errors():
    x, w = leaf(1, 4, 5, 5), leaf(2, 4, 3, 3)
    with pytest.raises(ValueError, match="conv2d: expected 4-D x"):
        ad.conv2d(leaf(4, 5, 5), w)
    with pytest.raises(ValueError, match="conv2d: groups=3 does not divide the channels"):
        ad.conv2d(x, w, groups=3)
    with pytest.raises(ValueError, match="stride: expected an int or a pair of ints"):
        ad.conv2d(x, w, stride=(1, 1, 1))
    with pytest.raises(ValueError, match="conv2d: expected stride >= 1"):
        ad.conv2d(x, w, stride=0)


def test_softmax_cross_entropy_errors():
    x = leaf(3, 4)
    with pytest.raises(ValueError, match=r"logits: expected shape \(N, C\)"):
        ad.softmax_cross_entropy(leaf(3), np.zeros(3, dtype=int))
    with pytest.raises(TypeError, match="labels: expected an integer array"):
        ad.softmax_cross_entropy(x, np.zeros(3))
    with pytest.raises(ValueError, match=r"labels: expected shape \(3,\)"):
        ad.softmax_cross_entropy(x, np.zeros(4, dtype=int))
    with pytest.raises(IndexError, match=r"labels: values must lie in \[0, 4\)"):
        ad.softmax_cross_entropy(x, np.array([0, 4, 1]))


# ---- kernels against the float64 oracles ---------------------------------------------------

@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("n", [1, 7, 17, 300])
def test_softmax_cross_entropy_matches_oracle(dtype, rtol, n):
    z = (rng.standard_normal((n, 11)) * 20).astype(dtype)
    labels = rng.integers(0, 11, n)
    x = Tensor(z, requires_grad=True)
    loss = ad.softmax_cross_entropy(x, labels)
    np.testing.assert_allclose(loss.data, ref.softmax_cross_entropy_ref(z, labels), rtol=rtol)
    (g,) = gradient(loss, [x])
    np.testing.assert_allclose(g.data, ref.softmax_cross_entropy_grad_ref(z, labels),
                               rtol=rtol * 10, atol=rtol / n)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    z = np.array([[1e4, -1e4, 0.0], [-1e30, 1e30, 5.0]])
    loss = ad.softmax_cross_entropy(Tensor(z), np.array([1, 1]))
    assert np.isfinite(loss.data) and np.isclose(loss.data, 1e4)


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-4), (np.float64, 1e-11)])
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2),
                                dict(groups=2, stride=(1, 2), padding=(0, 1))])
def test_conv2d_matches_oracle(dtype, rtol, kw):
    x = rng.standard_normal((3, 4, 9, 8)).astype(dtype)
    w = rng.standard_normal((6, 4 // kw.get("groups", 1), 3, 3)).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    y = ad.conv2d(x, w, b, **kw)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    expected = ref.conv2d_ref(x, w, b, pair(kw.get("stride", 1)), pair(kw.get("padding", 0)),
                              pair(kw.get("dilation", 1)), kw.get("groups", 1))
    assert y.dtype == dtype
    np.testing.assert_allclose(y.data, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 15, 17, 70001])
def test_elementwise_kernels_match_numpy(dtype, n):
    x = (rng.standard_normal(n) * 10).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    np.testing.assert_array_equal(ad.relu(x).data, np.maximum(x, 0))
    s = ad.sigmoid(x).data
    np.testing.assert_allclose(s, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-7)
    from fastadam.autodiff import _ops
    np.testing.assert_allclose(_ops.sigmoid_grad(g, s).data, g * s * (1 - s), rtol=1e-6)
    np.testing.assert_array_equal(_ops.relu_grad(g, x).data, np.where(x > 0, g, 0))


def test_read_only_inputs_are_accepted_and_unchanged():
    x = rng.standard_normal((4, 5))
    x.setflags(write=False)
    before = x.copy()
    w = leaf(5, 3)
    y = ad.relu(Tensor(x) @ w).sum()
    gradient(y, [w])
    np.testing.assert_array_equal(x, before)


_THREADS_SCRIPT = """
import numpy as np, sys
from threadpoolctl import threadpool_limits
import fastadam.autodiff as ad
rng = np.random.default_rng(0)
x = ad.Tensor(rng.standard_normal((64, 3, 40, 40)).astype(np.float32))
w = ad.Tensor(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), requires_grad=True)
z = ad.Tensor(rng.standard_normal((300, 500)).astype(np.float32), requires_grad=True)
s = ad.Tensor(rng.standard_normal(500).astype(np.float32), requires_grad=True)
b = ad.Tensor(rng.standard_normal(500).astype(np.float32))
table = ad.Tensor(rng.standard_normal((50, 1000)).astype(np.float32), requires_grad=True)
ids = rng.integers(0, 50, 300)
out = []
for n in (1, 2, 3):
    with threadpool_limits(n, user_api="openmp"):
        y = ad.relu(ad.conv2d(x, w, padding=1)).mean() + ad.softmax_cross_entropy(
            ad.sigmoid(z), np.arange(300) % 500) + ad.sum(z, axis=0).sum()
        gw, gz = ad.gradient(y, [w, z])
        # the row kernels of a transformer step, above their one-thread size (65536 elements)
        a = ad.softmax(ad.layer_norm(z, s, b), axis=-1)
        e = ad.gather(table, ids, axis=0)  # its gradient: the rows scattered by segment sum
        t = ad.sum(ad.gelu(z) * a) + ad.sum(e * e)
        gz2, gs, gt = ad.gradient(t, [z, s, table])
        out.append((y.data.tobytes(), gw.data.tobytes(), gz.data.tobytes(), a.data.tobytes(),
                    gz2.data.tobytes(), gs.data.tobytes(), gt.data.tobytes()))
sys.exit(0 if out[0] == out[1] == out[2] else 1)
"""


def test_results_do_not_depend_on_thread_count():
    pytest.importorskip("threadpoolctl")
    env = dict(os.environ, OMP_NUM_THREADS="3")
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], check=True, env=env,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fallback_matches_compiled_kernels(monkeypatch, dtype):
    """The NumPy paths (used for other dtypes and strided arrays) agree with the kernels."""
    from fastadam.autodiff import _kernels as K

    def run():
        r = np.random.default_rng(5)
        x = Tensor(r.standard_normal((3, 4, 9, 8)).astype(dtype))
        w = Tensor(r.standard_normal((6, 2, 3, 3)).astype(dtype), requires_grad=True)
        z = Tensor(r.standard_normal((5, 7)).astype(dtype), requires_grad=True)
        y = ad.sigmoid(ad.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                                 groups=2)).mean() + ad.relu(z).sum() + \
            ad.softmax_cross_entropy(ad.tanh(z), np.array([0, 6, 3, 3, 1])) + \
            ad.sum_to(ad.broadcast_to(z, shape=(2, 5, 7)) * 2.0, shape=(7,)).sum()
        xx = Tensor(x.data, requires_grad=True)
        gx = gradient(ad.conv2d(xx, w, padding=1, groups=2).sum(), [xx])[0]
        return [y.data] + [g.data for g in gradient(y, [w, z])] + [gx.data]

    compiled = run()
    monkeypatch.setattr(K, "_C", None)
    monkeypatch.setattr(K, "_fast", K._fast_python)  # as bound at import without a build
    fallback = run()
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for a, b in zip(compiled, fallback):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_returned_gradients_are_writable_arrays():
    a = leaf(3, 4)
    (g,) = gradient(a.mean(), [a])
    assert g.data.flags.writeable and g.data.flags.c_contiguous
    g.data += 1.0
    y = a * 1.0
    (gy,) = gradient(y.sum(), [y])
    assert gy.data.flags.writeable
    a.sum().backward()
    a.grad.data += 1.0


def test_conv2d_bias_shape_error():
    with pytest.raises(ValueError, match=r"b: expected shape \(2,\), got \(3,\)"):
        ad.conv2d(leaf(1, 4, 5, 5), leaf(2, 4, 3, 3), leaf(3))


def test_kernel_module_argument_errors():
    from fastadam._core import _autodiff_kernels as C
    with pytest.raises(TypeError, match="x: expected float32 or float64, got float16"):
        C.relu(np.ones(3, dtype=np.float16))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        C.sigmoid(np.ones((4, 4))[:, ::2])
    with pytest.raises(ValueError, match="expected two arrays of the same dtype and size"):
        C.relu_grad(np.ones(3), np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match="x: expected a 2-D array"):
        C.sum_rows(np.ones(3))
    with pytest.raises(ValueError, match="labels: expected a contiguous intp array of length N"):
        C.sce_forward(np.ones((2, 3)), np.zeros(3, dtype=np.intp))
    with pytest.raises(ValueError, match="logits: expected a 2-D array"):
        C.sce_backward(np.ones(3), np.zeros(3, dtype=np.intp), 1.0)
    with pytest.raises(ValueError, match="labels: expected a contiguous intp array$"):
        C.check_labels(np.zeros(3, dtype=np.int32), 2)
    x = np.ones((1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"out: expected a writable C-contiguous array"):
        C.im2col(x, 3, 3, 1, 1, 0, 0, 1, 1, 2, 2, np.empty((1, 9, 3)))
    with pytest.raises(ValueError, match="x: expected a 4-D array"):
        C.im2col(np.ones((4, 4)), 3, 3, 1, 1, 0, 0, 1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"cols: expected shape \(N, C\*kh\*kw, ho\*wo\)"):
        C.col2im(np.ones((1, 9, 3)), 1, 1, 4, 4, 3, 3, 1, 1, 0, 0, 1, 1, 2, 2)


def test_float16_uses_the_numpy_paths():
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float16), requires_grad=True)
    y = ad.softmax_cross_entropy(ad.relu(x) + ad.sigmoid(x), np.array([0, 1, 3]))
    (g,) = gradient(y, [x])
    assert y.dtype == np.float16 and g.dtype == np.float16


def test_backward_keeps_embedding_gradients_sparse():
    table = leaf(6, 2)
    ad.take(table, np.array([1, 1, 5])).sum().backward()
    assert isinstance(table.grad, IndexedSlices)
    ad.take(table, np.array([0])).sum().backward()
    assert isinstance(table.grad, IndexedSlices)
    np.testing.assert_allclose(table.grad.to_dense()[:, 0], [1, 2, 0, 0, 0, 1])
    (table * 1.0).sum().backward()
    np.testing.assert_allclose(table.grad.data[:, 0], [2, 3, 1, 1, 1, 2])


def test_zero_dimensional_tensors_accumulate():
    x = Tensor(np.array(2.0), requires_grad=True)
    y = x * x + x * 3.0 + x + ad.exp(x).sum()
    assert isinstance(y.data, np.ndarray)
    (g,) = gradient(y, [x])
    np.testing.assert_allclose(g.data, 2 * 2.0 + 3 + 1 + np.exp(2.0))
    y2 = x * x + x
    y2.backward()
    y2b = x * x + x
    y2b.backward()
    np.testing.assert_allclose(x.grad.data, 10.0)
