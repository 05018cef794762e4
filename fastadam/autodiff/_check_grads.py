"""``check_grads``: finite-difference checks of reverse-mode derivatives, to any order.

First order: for random directions ``v`` (inputs) and ``u`` (output), the VJP gives
``<d<u, f(x)>/dx, v>``; the central difference ``(<u, f(x + e v)> - <u, f(x - e v)>) / 2e`` must
agree.  Order k + 1: the same check applied to ``x -> <d<u, f(x)>/dx, v>`` computed with
``create_graph=True`` (so the k-th derivatives are themselves differentiated by the engine).
"""
import numpy as np

from ..sparse import IndexedSlices
from ._engine import gradient
from ._tensor import Tensor


def _dense(g):
    if g is None:
        return None
    if isinstance(g, IndexedSlices):
        return g.to_dense()
    return g.data


def check_grads(f, *args, order=2, eps=1e-6, rtol=1e-5, atol=1e-6, seed=0):
    """Check the derivatives of ``f`` at ``args`` by finite differences, up to ``order``.

    Parameters
    ----------
    f : callable
        ``f(*tensors) -> Tensor`` built from fastadam.autodiff operations.
    *args : array_like or Tensor
        Floating-point arguments are differentiated (in float64: float32 is upcast for the check);
        integer arguments (labels, indices) are passed through as constants.
    order : int
        Highest derivative order checked (1, 2, 3, ...).
    eps, rtol, atol : float
        Finite-difference step and tolerances: ``|analytic - numeric| <= atol + rtol * |numeric|``.
    seed : int
        Seed of the random directions.

    Raises
    ------
    AssertionError
        Naming the order and both values when a check fails.
    """
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"order: expected an int >= 1, got {order!r}")
    arrays = []
    for a in args:
        a = np.asarray(a.data if isinstance(a, Tensor) else a)
        if a.dtype.kind == "f" and a.dtype != np.float64:
            a = a.astype(np.float64)
        arrays.append(a)
    diff = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    if not diff:
        raise ValueError("args: no floating-point argument to differentiate")
    rng = np.random.default_rng(seed)
    _check(f, arrays, diff, order, 1, rng, eps, rtol, atol)


def _tensors(arrays, diff):
    return [Tensor(a, requires_grad=(i in diff)) for i, a in enumerate(arrays)]


def _check(f, arrays, diff, order, level, rng, eps, rtol, atol):
    ts = _tensors(arrays, diff)
    y = f(*ts)
    if not isinstance(y, Tensor):
        raise TypeError(f"f: expected a Tensor result, got {type(y).__name__}")
    u = Tensor(rng.standard_normal(y.shape))
    vs = {i: rng.standard_normal(arrays[i].shape) for i in diff}

    def project(ts_):
        y_ = f(*ts_)
        return (y_ * u).sum()

    if y._node is None:
        analytic = 0.0
    else:
        grads = gradient(project(ts), [ts[i] for i in diff], allow_unused=True)
        analytic = sum(float(np.sum(_dense(g) * vs[i])) for g, i in zip(grads, diff)
                       if g is not None)

    def shifted(t):
        vals = [a + t * vs[i] if i in vs else a for i, a in enumerate(arrays)]
        return float(project(_tensors(vals, diff)).data)

    numeric = (shifted(eps) - shifted(-eps)) / (2 * eps)
    if not abs(analytic - numeric) <= atol + rtol * abs(numeric):
        raise AssertionError(f"check_grads: derivative of order {level} does not match finite "
                             f"differences: analytic {analytic!r}, numeric {numeric!r}")
    if order > 1:
        def directional(*ts_):
            y_ = f(*ts_)
            if y_._node is None:
                return Tensor(np.zeros(()))
            gs = gradient((y_ * u).sum(), [ts_[i] for i in diff], create_graph=True,
                          allow_unused=True)
            total = None
            for g, i in zip(gs, diff):
                if g is None:
                    continue
                if isinstance(g, IndexedSlices):
                    g = Tensor(g.to_dense())
                term = (g * Tensor(vs[i])).sum()
                total = term if total is None else total + term
            return total if total is not None else Tensor(np.zeros(()))

        _check(directional, arrays, diff, order - 1, level + 1, rng, eps, rtol, atol)
