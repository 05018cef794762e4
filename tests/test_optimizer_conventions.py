"""The Adagrad and SGD objects under their non-torch conventions, and with sparse gradients.

References: onnx.reference's own Adagrad / Momentum update functions (ONNX counts T from 0: the
objects must hand the functional step the right count), a float64 NumPy Keras Adagrad written
from Keras 3's source (eps inside the square root, accumulator starting at 0.1), and the
functional sparse steps called directly."""
import numpy as np
import pytest

import fastadam

scipy_sparse = pytest.importorskip("scipy.sparse")


def onnx_training():
    pytest.importorskip("onnx")
    from onnx.reference.ops.aionnx_preview_training import op_adagrad, op_momentum
    return op_adagrad, op_momentum


def test_adagrad_onnx_convention_matches_onnx_reference(rng):
    op_adagrad, _ = onnx_training()
    x = rng.standard_normal(7)
    ref_x, ref_h = x.copy(), np.zeros(7)
    opt = fastadam.Adagrad([x], lr=0.1, lr_decay=0.5, weight_decay=0.01, convention="onnx")
    assert opt.param_groups[0]["eps"] == 1e-6  # ONNX's default epsilon
    for T in range(6):
        g = rng.standard_normal(7)
        opt.step([g])
        ref_x, ref_h = op_adagrad._apply_adagrad(0.1, T, ref_x, g, ref_h, 0.01, 1e-6, 0.5)
    np.testing.assert_allclose(x, ref_x, rtol=1e-13)
    np.testing.assert_allclose(opt.state(x)["sum"], ref_h, rtol=1e-13)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_onnx_convention_matches_onnx_reference(rng, nesterov):
    _, op_momentum = onnx_training()
    apply = op_momentum._apply_nesterov if nesterov else op_momentum._apply_momentum
    x = rng.standard_normal(5)
    ref_x, ref_v = x.copy(), np.zeros(5)
    # ONNX alpha = momentum, beta = 1 - dampening; beta is 1 on the first step (T == 0)
    opt = fastadam.SGD([x], lr=0.05, momentum=0.9, dampening=0.3, nesterov=nesterov,
                       weight_decay=0.02, convention="onnx")
    for T in range(6):
        g = rng.standard_normal(5)
        opt.step([g])
        ref_x, ref_v = apply(0.05, T, ref_x, g, ref_v, 0.02, 0.9, 0.7)
    np.testing.assert_allclose(x, ref_x, rtol=1e-13)
    np.testing.assert_allclose(opt.state(x)["momentum_buffer"], ref_v, rtol=1e-13)


def test_adagrad_keras_convention_defaults(rng):
    x = rng.standard_normal(6)
    ref_x, ref_h = x.copy(), np.full(6, 0.1)
    opt = fastadam.Adagrad([x], convention="keras")
    group = opt.param_groups[0]
    assert (group["lr"], group["eps"], group["initial_accumulator_value"]) == (1e-3, 1e-7, 0.1)
    for _ in range(5):
        g = rng.standard_normal(6)
        opt.step([g])
        ref_h = ref_h + g * g  # keras: accumulator += g^2; var -= lr * g / sqrt(acc + eps)
        ref_x = ref_x - 1e-3 * g / np.sqrt(ref_h + 1e-7)
    np.testing.assert_allclose(x, ref_x, rtol=1e-13)


def sparse_problem(rng):
    table = rng.standard_normal((12, 3))
    mat = rng.standard_normal((4, 5))
    vec = rng.standard_normal(6)
    grads = [fastadam.IndexedSlices(rng.standard_normal((5, 3)), np.array([2, 7, 2, 0, 11]),
                                    (12, 3)),
             scipy_sparse.random(4, 5, density=0.4, format="csr", random_state=3),
             rng.standard_normal(6)]
    return [table, mat, vec], grads


@pytest.mark.parametrize("kind", ["Adagrad", "SGD"])
@pytest.mark.parametrize("sparse_mode", ["lazy", "dense"])
def test_mixed_gradients_equal_the_functional_steps(rng, kind, sparse_mode):
    params, grads = sparse_problem(rng)
    ref = [p.copy() for p in params]
    if kind == "Adagrad":
        hp = dict(lr=0.1, lr_decay=0.01, weight_decay=0.05)
        opt = fastadam.Adagrad(params, sparse_mode=sparse_mode, **hp)
        dense, sparse = fastadam.adagrad_step_inplace, fastadam.sparse_adagrad_step_inplace
    else:
        hp = dict(lr=0.1, momentum=0.8, dampening=0.1, weight_decay=0.05)
        opt = fastadam.SGD(params, sparse_mode=sparse_mode, **hp)
        dense, sparse = fastadam.momentum_step_inplace, fastadam.sparse_momentum_step_inplace
    slots = [np.zeros_like(p) for p in params]
    for t in range(1, 4):
        opt.step(grads)
        for i in (0, 1):
            sparse(ref[i], grads[i], slots[i], t, mode=sparse_mode, **hp)
        dense(ref[2], grads[2], slots[2], t, **hp)
    for p, r in zip(params, ref):
        assert p.tobytes() == r.tobytes()
    name = opt.slot_names[0]
    for i, s in enumerate(slots):
        assert opt.state(i)[name].tobytes() == s.tobytes()
