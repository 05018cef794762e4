"""The compiled recording path (fastadam/autodiff/_tape.pyx) against the Python code it replaces.

Both build the same Tensor and Node objects; these tests record the same operations through each
and compare every field (identity where the Python code shares objects), then check gradients
through a graph recorded by a mix of the two.
"""
import numpy as np
import pytest

import fastadam.autodiff as ad
from fastadam.autodiff import _ops, _registry, _tensor
from fastadam.autodiff._tensor import Tensor


def _fields(t):
    node = t._node
    out = {"requires_grad": t.requires_grad, "grad": t.grad, "version": t._version,
           "base": t._base, "dtype": t.data.dtype, "shape": t.data.shape}
    if node is not None:
        out.update(prim=node.prim, inputs=node.inputs, versions=node.versions,
                   params=node.params, out_data_is_data=node.out_data is t.data,
                   out_ref_is_t=node.out_ref() is t, out_version=node.out_version)
    return out


def test_the_compiled_path_is_built():
    assert _tensor._tape is not None
    assert _registry.Primitive.__call__ is _tensor._tape.primitive_call
    assert _tensor._wrap is _tensor._tape.wrap


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "matmul"])
def test_operators_build_what_the_python_operator_builds(name):
    prim = getattr(_ops, name)
    compiled = _registry.binary_operator(prim)
    python = _registry.binary_operator(prim, compiled=False)
    assert compiled is not python and compiled.__name__ == python.__name__ == name
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal((3, 3)).astype(np.float32) + 4)
    for x, y in ((a, b), (b, a), (b, b)):
        c, p = compiled(x, y), python(x, y)
        assert type(c) is Tensor
        np.testing.assert_array_equal(c.data, p.data)
        assert _fields(c) == _fields(p)
        assert (c._node is None) == (not (x.requires_grad or y.requires_grad))
        if c._node is not None:
            assert c._node.inputs[0] is x and c._node.inputs[1] is y
            assert p._node.id == c._node.id + 1  # one counter, in creation order


def test_operators_take_the_slow_path_for_views_changed_tensors_and_arrays():
    a = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    v = a.reshape(3, 2).reshape(2, 3)           # a view: shares a's version counter
    c = v * v
    assert c._node.versions == (0, 0)           # recorded with versions (slow path)
    b = Tensor(np.ones((2, 3)), requires_grad=True)
    b += 1                                      # version 1
    d = b * a
    assert d._node.versions == (1, 0)
    e = a * np.full((2, 3), 2.0)                # an ndarray operand
    np.testing.assert_array_equal(e.data, 2 * a.data)
    assert isinstance(e._node.inputs[1], Tensor)
    z = Tensor(np.float64(2.0), requires_grad=True) * Tensor(np.float64(3.0))
    assert type(z.data) is np.ndarray and z.data.shape == () and z.data == 6.0


def test_no_recording_under_no_grad():
    a = Tensor(np.ones(3), requires_grad=True)
    with ad.no_grad():
        for c in (a * a, ad.relu(a), a.reshape(3, 1)):
            assert c._node is None and c.requires_grad is False


@pytest.mark.parametrize("make", [
    lambda x: ((ad.relu,), {}),
    lambda x: ((_ops._reshape,), {"shape": (3, 2)}),
    lambda x: ((_ops._sum,), {"axes": (0,), "keepdims": True}),
])
def test_primitive_call_builds_what_the_python_call_builds(make):
    x = Tensor(np.array([[1.0, -2.0], [3.0, np.nan], [-0.5, 4.0]]), requires_grad=True)
    (prim,), params = make(x)
    for t in (x, x.reshape(2, 3).reshape(3, 2)):  # a plain tensor and a view
        c = prim(t, **params)
        p = _registry.Primitive._call_python(prim, t, **params)
        np.testing.assert_array_equal(c.data, p.data)
        assert _fields(c) == _fields(p)


def test_user_attribute_on_requires_grad_is_read_as_truth():
    a = Tensor(np.ones(3))
    a.requires_grad = 1  # set directly, not through requires_grad_()
    c = a * a
    assert c._node is not None
    (g,) = ad.gradient(c.sum(), [a])
    np.testing.assert_array_equal(g.data, 2 * np.ones(3))


def test_gradients_through_a_graph_recorded_by_both_paths():
    """The same function recorded by the compiled and by the Python operators: the same
    gradients, and both equal to the formula's (float64 reference)."""
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((4, 3))
    x0 = rng.standard_normal((5, 4))
    py_mul = _registry.binary_operator(_ops.multiply, compiled=False)
    py_mm = _registry.binary_operator(_ops.matmul, compiled=False)
    out = []
    for mm, mul in ((Tensor.__matmul__, Tensor.__mul__), (py_mm, py_mul)):
        w = Tensor(w0, requires_grad=True)
        x = Tensor(x0)
        h = mm(x, w)
        y = ad.sum(mul(h, h))
        out.append(ad.gradient(y, [w])[0].data)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_allclose(out[0], 2 * x0.T @ (x0 @ w0), rtol=1e-12)


def _graph_gradients(walk, monkeypatch):
    """Gradients of a graph exercising accumulation, broadcasting, take and a second order."""
    from fastadam.autodiff import _engine
    monkeypatch.setattr(_engine, "_run", walk)
    rng = np.random.default_rng(2)
    w = Tensor(rng.standard_normal((4, 3)), requires_grad=True)
    b = Tensor(rng.standard_normal(3), requires_grad=True)
    emb = Tensor(rng.standard_normal((6, 4)), requires_grad=True)
    x = ad.take(emb, np.array([1, 4, 1, 0, 5]))
    h = ad.tanh(x @ w + b)
    loss = ad.sum(h * h) + ad.mean(h)            # h used twice: accumulation
    g_w, g_b, g_emb = ad.gradient(loss, [w, b, emb], retain_graph=True)
    (gg,) = ad.gradient(ad.sum(ad.gradient(loss, [w], create_graph=True)[0] ** 2), [w])
    return [g_w.data, g_b.data, g_emb.to_dense(), gg.data]


def test_compiled_walk_equals_the_python_walk(monkeypatch):
    from fastadam.autodiff import _engine
    compiled = _graph_gradients(_tensor._tape.run, monkeypatch)
    python = _graph_gradients(_engine._run_python, monkeypatch)
    for c, p in zip(compiled, python):
        np.testing.assert_array_equal(c, p)
    # and the first-order ones equal a float64 formula
    rng = np.random.default_rng(2)
    w0, b0, e0 = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((6, 4))
    idx = np.array([1, 4, 1, 0, 5])
    x0 = e0[idx]
    h0 = np.tanh(x0 @ w0 + b0)
    gh = 2 * h0 + 1.0 / h0.size
    gz = gh * (1 - h0 ** 2)
    np.testing.assert_allclose(compiled[0], x0.T @ gz, rtol=1e-12)
    np.testing.assert_allclose(compiled[1], gz.sum(axis=0), rtol=1e-12)
    ge = np.zeros_like(e0)
    np.add.at(ge, idx, gz @ w0.T)
    np.testing.assert_allclose(compiled[2], ge, rtol=1e-12)


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_both_walks_refuse_changed_and_freed_tensors(which, monkeypatch):
    from fastadam.autodiff import _engine
    monkeypatch.setattr(_engine, "_run",
                        _tensor._tape.run if which == "compiled" else _engine._run_python)
    a = Tensor(np.ones(3), requires_grad=True)
    s = a * a
    y = ad.sum(s * s)
    s += 1
    with pytest.raises(RuntimeError, match="modified in place"):
        ad.gradient(y, [a])
    y2 = ad.sum(a * a)
    ad.gradient(y2, [a])
    with pytest.raises(RuntimeError, match="second time"):
        ad.gradient(y2, [a])


def test_compiled_fast_test_agrees_with_the_python_one():
    from fastadam.autodiff import _kernels as K
    f32 = np.ones((4, 5), np.float32)
    f64 = np.ones((4, 5))
    cases = [(f32,), (f64,), (f32, f32), (f32, f64), (f32.T,), (f32[:, ::2],),
             (np.ones((4, 5), ">f4"),), (np.ones(3, np.int64),), (np.ones(3, np.float16),),
             (f64, f64[1:]), (np.ones((0, 3), np.float32),)]
    for arrays in cases:
        assert K._fast(*arrays) == K._fast_python(*arrays), arrays
    raw = np.zeros(4 * 5 + 1, np.uint8)[1:].view(np.float32)  # misaligned: not for the kernels
    assert not K._fast(raw)
    assert not K._fast([1.0, 2.0])
