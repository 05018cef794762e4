"""NumPy's reductions called on an autodiff Tensor (np.sum(t), np.mean(t, axis=0), np.max(t))
record the Tensor's own op, so gradients flow; NumPy-only options raise a TypeError that says
what to do, not an error from inside a lambda."""
import numpy as np
import pytest

from fastadam import autodiff as ad


@pytest.mark.parametrize("np_fn,grad", [
    (np.sum, lambda x: np.ones_like(x)),
    (np.mean, lambda x: np.full_like(x, 1.0 / x.size)),
    (np.max, lambda x: (x == x.max()).astype(x.dtype)),
])
def test_numpy_reduction_records_the_op(np_fn, grad):
    x = np.array([[1.0, -2.0, 3.5], [0.25, 7.0, -1.0]])
    t = ad.Tensor(x.copy(), requires_grad=True)
    out = np_fn(t)
    assert isinstance(out, ad.Tensor)
    assert out.data == pytest.approx(np_fn(x))
    out.backward()
    np.testing.assert_array_equal(t.grad.data if hasattr(t.grad, "data") else t.grad, grad(x))


def test_numpy_reduction_with_axis_and_keepdims():
    x = np.arange(12.0).reshape(3, 4)
    t = ad.Tensor(x)
    np.testing.assert_array_equal(np.sum(t, axis=1).data, x.sum(axis=1))
    np.testing.assert_array_equal(np.mean(t, axis=0, keepdims=True).data,
                                  x.mean(axis=0, keepdims=True))


@pytest.mark.parametrize("kwargs,word", [(dict(dtype=np.float32), "dtype"),
                                         (dict(out=np.zeros(())), "out"),
                                         (dict(where=np.ones((2, 2), bool)), "where")])
def test_numpy_only_options_refused_clearly(kwargs, word):
    t = ad.Tensor(np.ones((2, 2)))
    with pytest.raises(TypeError, match=rf"Tensor\.sum: {word} not supported.*t\.data"):
        np.sum(t, **kwargs)
