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
