"""fastadam.sklearn._backprop: the MLP estimators' hand-written forward/backward pass.

References: ``fastadam.autodiff.gradient`` of the same network recorded on the tape (one
``_layers.dense`` node per layer and the loss primitive; must agree bit for bit, since the
hand-written pass performs the tape's VJP operations), and central finite differences in
float64 (independent of both)."""
import numpy as np
import pytest

pytest.importorskip("sklearn")
import fastadam.autodiff as ad  # noqa: E402
from fastadam.sklearn._layers import dense  # noqa: E402
from fastadam.sklearn._losses import _wsce, weighted_softmax_cross_entropy_grad  # noqa: E402
from sklearn_reference import (_wbce, _whse, loss_and_gradients,  # noqa: E402
                               weighted_binary_cross_entropy_grad,
                               weighted_half_squared_error_grad)

LOSSES = {"softmax": (_wsce, weighted_softmax_cross_entropy_grad, "labels", 4),
          "binary": (_wbce, weighted_binary_cross_entropy_grad, "targets", 1),
          "squared": (_whse, weighted_half_squared_error_grad, "targets", 3)}


def _problem(rng, loss, dtype=np.float64, sizes=(6, 9, 7)):
    value, gradient, key, n_out = LOSSES[loss]
    n = 11
    X = rng.standard_normal((n, sizes[0])).astype(dtype)
    units = list(sizes) + [n_out]
    coefs = [(rng.standard_normal((a, b)) * 0.5).astype(dtype) for a, b in zip(units, units[1:])]
    intercepts = [(rng.standard_normal(b) * 0.1).astype(dtype) for b in units[1:]]
    if loss == "softmax":
        targets = rng.integers(0, n_out, n).astype(np.intp)
    elif loss == "binary":
        targets = rng.integers(0, 2, (n, 1)).astype(dtype)
    else:
        targets = rng.standard_normal((n, n_out)).astype(dtype)
    w = rng.uniform(0.5, 2, n)
    w = (w / w.sum()).astype(dtype)
    kw = {key: targets, "weights": w}
    return (X, coefs, intercepts, (lambda z: (value.fun(z, **kw), gradient.fun(z, **kw))),
            (lambda z: value(z, **kw)))


def _tape_gradients(X, coefs, intercepts, activation, tape_loss):
    params = [ad.Tensor(p, requires_grad=True) for p in coefs + intercepts]
    n = len(coefs)
    h = ad.Tensor(X)
    for i in range(n):
        h = dense(h, params[i], params[n + i], activation if i != n - 1 else "identity")
    loss = tape_loss(h)
    return float(loss.data), [g.data for g in ad.gradient(loss, params)]


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_the_autodiff_tape_bit_for_bit(rng, activation, loss, dtype):
    X, coefs, intercepts, primitive_loss, tape_loss = _problem(rng, loss, dtype)
    ours, cg, ig = loss_and_gradients(X, coefs, intercepts, activation, primitive_loss)
    ref_value, ref = _tape_gradients(X, coefs, intercepts, activation, tape_loss)
    assert float(ours) == ref_value
    for a, b in zip(cg + ig, ref):
        assert a.dtype == dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_gradients_by_finite_differences(rng, activation, loss):
    X, coefs, intercepts, primitive_loss, _ = _problem(rng, loss)
    _, cg, ig = loss_and_gradients(X, coefs, intercepts, activation, primitive_loss)
    params = coefs + intercepts
    h = 1e-6
    for p, g in zip(params, cg + ig):
        flat, gflat = p.reshape(-1), g.reshape(-1)
        for j in rng.choice(flat.size, min(6, flat.size), replace=False):
            keep = flat[j]
            flat[j] = keep + h
            up = float(loss_and_gradients(X, coefs, intercepts, activation, primitive_loss)[0])
            flat[j] = keep - h
            down = float(loss_and_gradients(X, coefs, intercepts, activation, primitive_loss)[0])
            flat[j] = keep
            assert gflat[j] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8)


def test_inputs_are_left_alone(rng):
    X, coefs, intercepts, primitive_loss, _ = _problem(rng, "softmax")
    copies = [a.copy() for a in [X] + coefs + intercepts]
    loss_and_gradients(X, coefs, intercepts, "tanh", primitive_loss)
    for a, b in zip([X] + coefs + intercepts, copies):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_loss_kernels_equal_the_loss_primitives(rng, loss, dtype):
    """The estimators' one-pass loss kernels against the NumPy loss primitives (which the
    finite-difference tests of test_sklearn_mlp.py check)."""
    from fastadam.sklearn import _kernels
    value, gradient, key, n_out = LOSSES[loss]
    X, coefs, intercepts, primitive_loss, _ = _problem(rng, loss, dtype)
    z = (rng.standard_normal((11, n_out)) * 3).astype(dtype)
    ref_value, ref_grad = primitive_loss(z)
    grad = np.full_like(z, np.nan)
    # rebuild the targets and weights _problem drew, through the closure's defaults
    cell = dict(zip(primitive_loss.__code__.co_freevars,
                    (c.cell_contents for c in primitive_loss.__closure__)))["kw"]
    if loss == "softmax":
        ours = _kernels.softmax_cross_entropy(z, cell["labels"], cell["weights"], grad)
    elif loss == "binary":
        ours = _kernels.binary_cross_entropy(z, cell["targets"], cell["weights"], grad,
                                             float(np.finfo(dtype).eps))
    else:
        ours = _kernels.half_squared_error(z, cell["targets"], cell["weights"], grad)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    assert ours == pytest.approx(float(ref_value), rel=tol)
    np.testing.assert_allclose(grad, ref_grad, rtol=tol, atol=tol * 1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_relu_kernels_equal_numpy_and_propagate_nan(rng, dtype):
    from fastadam.sklearn import _kernels
    h = rng.standard_normal((7, 5)).astype(dtype)
    b = rng.standard_normal(5).astype(dtype)
    h[0, 0] = np.nan
    ref = np.maximum(h + b, 0)
    out = h.copy()
    _kernels.bias_relu(out, b)
    assert np.isnan(out[0, 0])
    np.testing.assert_array_equal(out, ref)
    g = rng.standard_normal((7, 5)).astype(dtype)
    ref = g * (ref > 0)
    _kernels.relu_backward(g, out)
    assert g.tobytes() == ref.tobytes()


# ---- BatchPass: the estimators' training pass, buffers reused across mini-batches ------------

def _kernel_loss(loss, targets, weights, dtype):
    """(kernel, extra) as the estimators pass them, and the same loss in ``loss_and_gradients``'
    ``z -> (value, dz)`` form: both paths then share the loss's own roundings."""
    from fastadam.sklearn import _kernels
    kernel, extra = {"softmax": (_kernels.softmax_cross_entropy, ()),
                     "binary": (_kernels.binary_cross_entropy, (float(np.finfo(dtype).eps),)),
                     "squared": (_kernels.half_squared_error, ())}[loss]

    def as_pair(z):
        grad = np.empty_like(z)
        return kernel(z, targets, weights, grad, *extra), grad
    return kernel, extra, as_pair


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
@pytest.mark.parametrize("loss,n_out", [("softmax", 4), ("binary", 1), ("squared", 1),
                                        ("squared", 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sizes", [(6, 9), (6, 9, 7), (6, 1)])
def test_batch_pass_equals_loss_and_gradients_bit_for_bit(rng, activation, loss, n_out, dtype,
                                                          sizes):
    """Full and short batches through the same buffers, each equal to the fresh-array pass."""
    from fastadam.sklearn._backprop import BatchPass
    units = list(sizes) + [n_out]
    coefs = [(rng.standard_normal((a, b)) * 0.5).astype(dtype) for a, b in zip(units, units[1:])]
    intercepts = [(rng.standard_normal(b) * 0.1).astype(dtype) for b in units[1:]]
    batch = BatchPass(coefs, 13, activation, dtype)
    for n in (13, 5, 13, 1):
        X = rng.standard_normal((n, sizes[0])).astype(dtype)
        if loss == "softmax":
            targets = rng.integers(0, n_out, n).astype(np.intp)
        elif loss == "binary":
            targets = rng.integers(0, 2, (n, 1)).astype(dtype)
        else:
            targets = rng.standard_normal((n, n_out)).astype(dtype)
        w = rng.uniform(0.5, 2, n)
        w = (w / w.sum()).astype(dtype)
        kernel, extra, as_pair = _kernel_loss(loss, targets, w, dtype)
        ref_value, ref_cg, ref_ig = loss_and_gradients(X, coefs, intercepts, activation, as_pair)
        value = batch.run(X, coefs, intercepts, kernel, targets, w, extra)
        assert value == ref_value
        for a, b in zip(batch.coef_grads + batch.intercept_grads, ref_cg + ref_ig):
            assert a.dtype == dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 2), (2, 3), (13, 2), (200, 10), (37, 100)])
def test_column_sums_kernels_equal_numpy_bit_for_bit(rng, dtype, shape):
    from fastadam.sklearn import _kernels
    g = (rng.standard_normal(shape) * rng.uniform(0.01, 100, shape)).astype(dtype)
    out = np.full(shape[1], np.nan, dtype)
    _kernels.column_sums(g, out)
    assert out.tobytes() == g.sum(axis=0).tobytes()
    a = rng.standard_normal(shape).astype(dtype)
    ref = g * (a > 0)
    _kernels.relu_backward_column_sums(g, a, out)
    assert g.tobytes() == ref.tobytes()
    assert out.tobytes() == ref.sum(axis=0).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k", [(1, 1), (1, 5), (7, 1), (200, 100)])
def test_outer_product_kernels_equal_the_matrix_product(rng, dtype, n, k):
    """A product with inner dimension 1 is one rounded multiplication per entry."""
    from fastadam.sklearn import _kernels
    d = rng.standard_normal((n, 1)).astype(dtype)
    w = rng.standard_normal((k, 1)).astype(dtype)
    a = rng.standard_normal((n, k)).astype(dtype)
    out = np.full((n, k), np.nan, dtype)
    _kernels.outer_product(d, w, out)
    assert out.tobytes() == (d @ w.T).tobytes()
    sums = np.full(k, np.nan, dtype)
    _kernels.outer_relu_backward_column_sums(d, w, a, out, sums)
    ref = (d @ w.T) * (a > 0)
    assert out.tobytes() == ref.tobytes()
    if k >= 2:  # NumPy adds rows in order (one column: pairwise, left to NumPy by BatchPass)
        assert sums.tobytes() == ref.sum(axis=0).tobytes()
    np.testing.assert_allclose(sums, ref.astype(np.float64).sum(axis=0),
                               rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_l2_gradient_equals_numpy(rng, dtype):
    from fastadam.sklearn import _kernels
    g = rng.standard_normal(1001).astype(dtype)
    w = rng.standard_normal(1001).astype(dtype)
    decay = 3.7e-4
    ref = g + decay * w
    squares = _kernels.add_l2_gradient(g, w, decay)
    assert g.tobytes() == ref.tobytes()
    assert squares == pytest.approx(float(np.dot(w.astype(np.float64), w.astype(np.float64))),
                                    rel=1e-13)


# ---- EpochTrainer: the estimators' compiled mini-batch loop ----------------------------------

def _flat_network(rng, units, dtype):
    """coefs and intercepts as views of one flat array (weights first), as the estimators
    lay them out."""
    shapes = [(a, b) for a, b in zip(units, units[1:])] + [(b,) for b in units[1:]]
    flat = (rng.standard_normal(sum(int(np.prod(s)) for s in shapes)) * 0.4).astype(dtype)
    views, start = [], 0
    for s in shapes:
        size = int(np.prod(s))
        views.append(flat[start:start + size].reshape(s))
        start += size
    n = len(units) - 1
    return flat, views[:n], views[n:]


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("loss,n_out", [("softmax", 4), ("binary", 1), ("squared", 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gather", [False, True])
def test_epoch_trainer_equals_the_python_loop_bit_for_bit(rng, activation, loss, n_out, dtype,
                                                         gather):
    """Two epochs of the compiled loop against the loop it replaces, written with the public
    step: BatchPass.run, add_l2_gradient, then fastadam.step_inplace(convention="tf"), over
    the same shuffled rows (copied by the trainer with ``gather``, by X[order] here)."""
    import fastadam
    from fastadam.sklearn import _kernels
    from fastadam.sklearn._backprop import BatchPass
    units, n, size = [5, 8, n_out], 23, 7
    X = rng.standard_normal((n, units[0])).astype(dtype)
    if loss == "softmax":
        targets = rng.integers(0, n_out, n).astype(np.intp)
    elif loss == "binary":
        targets = rng.integers(0, 2, (n, 1)).astype(dtype)
    else:
        targets = rng.standard_normal((n, n_out)).astype(dtype)
    sw = rng.uniform(0.5, 2, n)
    bounds = [(a, min(a + size, n)) for a in range(0, n, size)]
    hyper = dict(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-7)
    alpha = 0.05
    seed = int(rng.integers(1 << 30))
    runs = []
    for compiled in (True, False):
        flat, coefs, intercepts = _flat_network(np.random.default_rng(seed), units, dtype)
        m, v = np.zeros_like(flat), np.zeros_like(flat)
        batch = BatchPass(coefs, size, activation, dtype)
        kernel, extra, _ = _kernel_loss(loss, None, None, dtype)
        trainer = _kernels.EpochTrainer(batch, coefs, intercepts, kernel, extra, flat, m, v, 3,
                                        hyper["lr"], hyper["beta1"], hyper["beta2"],
                                        hyper["eps"], alpha, None)
        t, totals = 3, []
        order = np.arange(n)
        for epoch in range(2):
            np.random.default_rng(epoch).shuffle(order)
            Xs, ts, ws = X[order], targets[order], sw[order]
            weights = [(ws[a:b] / ws[a:b].sum()).astype(dtype) for a, b in bounds]
            scales = [1.0 / float(ws[a:b].sum()) for a, b in bounds]
            if compiled:
                if gather:
                    Xe = np.empty((size, units[0]), dtype)
                    te = np.empty((size,) + targets.shape[1:], targets.dtype)
                    xb, tb = [Xe[:b - a] for a, b in bounds], [te[:b - a] for a, b in bounds]
                    totals.append(trainer.epoch(xb, tb, weights, scales, X, targets, order))
                else:
                    xb, tb = [Xs[a:b] for a, b in bounds], [ts[a:b] for a, b in bounds]
                    totals.append(trainer.epoch(xb, tb, weights, scales))
                t = trainer.t
                continue
            total = 0.0
            for (a, b), w, scale in zip(bounds, weights, scales):
                value = batch.run(Xs[a:b], coefs, intercepts, kernel, ts[a:b], w, extra)
                k = batch.coef_size
                squares = _kernels.add_l2_gradient(batch.gradients[:k], flat[:k], alpha * scale)
                value += 0.5 * alpha * scale * squares
                t += 1
                fastadam.step_inplace(flat, batch.gradients, m, v, t, convention="tf", **hyper)
                total += (b - a) * value
            totals.append(total)
        runs.append((flat, m, v, t, totals))
    (flat, m, v, t, totals), (rflat, rm, rv, rt, rtotals) = runs
    assert t == rt == 3 + 2 * len(bounds)
    assert totals == rtotals
    for a, b in ((flat, rflat), (m, rm), (v, rv)):
        assert a.tobytes() == b.tobytes()
