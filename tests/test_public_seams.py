"""The public names the front-ends use instead of the core's private modules (issue 20):
``fastadam.optim.prepare_step`` (the one prepared step: the ONNX training operators and the
scikit-learn estimators' compiled epoch step through it), ``fastadam.drivers``,
``fastadam.sparse.CSRBatches``, and the sparse steps' old home ``fastadam.sparse.<step>`` (a
deprecated alias)."""
import warnings

import numpy as np
import pytest

import fastadam
from fastadam import drivers
from fastadam.optim import prepare_step
from reference import adam_reference

sp = pytest.importorskip("scipy.sparse")


# ---- fastadam.optim.prepare_step, as the front-ends use it ----------------------------------

@pytest.mark.parametrize("convention", ["tf", "torch", "onnx"])
def test_prepared_step_is_adams_formula(convention):
    rng = np.random.default_rng(0)
    x, m, v = rng.standard_normal(1000), np.zeros(1000), np.zeros(1000)
    ref = (x.copy(), m.copy(), v.copy())
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    for t in range(1, 4):
        g = rng.standard_normal(1000)
        assert prepared.step(g, t, lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8,
                             convention=convention, weight_decay=0.1) is True
        ref = adam_reference(ref[0], g, ref[1], ref[2], t, lr=0.01, beta1=0.9, beta2=0.99,
                             eps=1e-8, convention=convention, weight_decay=0.1)[:3]
    for got, want in zip((x, m, v), ref):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prepared_step_on_a_reused_gradient_buffer_is_step_inplace(dtype):
    """The estimators' epoch loop: one gradient buffer refilled before every step."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(500).astype(dtype)
    g, m, v = np.empty_like(x), np.zeros_like(x), np.zeros_like(x)
    twin = [x.copy(), m.copy(), v.copy()]
    ref = [x.astype(np.float64), m.astype(np.float64), v.astype(np.float64)]
    hyper = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, convention="tf")
    prepared = prepare_step("adam", x, {"m": m, "v": v}, num_threads=1)
    for t in range(1, 5):
        g[:] = rng.standard_normal(500)
        prepared.step(g, t, **hyper)
        fastadam.step_inplace(twin[0], g, twin[1], twin[2], t, **hyper)
        ref = list(adam_reference(ref[0], g, ref[1], ref[2], t, lr=0.01, beta1=0.9, beta2=0.99,
                                  eps=1e-8)[:3])
    for got, same, want in zip((x, m, v), twin, ref):
        np.testing.assert_array_equal(got, same)
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-13,
                                   atol=1e-6 if dtype == np.float32 else 1e-15)


def test_prepared_step_rejects_bad_input_before_writing():
    x, g, m, v = (np.zeros(4, dtype=np.float32) for _ in range(4))
    with pytest.raises(ValueError, match="^v"):
        prepare_step("adam", x, {"m": m, "v": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match="share memory"):
        prepare_step("adam", x, {"m": m, "v": m})
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    with pytest.raises(ValueError, match="lr"):  # float32 cannot hold the folded step size
        prepared.check(1, lr=1e40)
    with pytest.raises(ValueError, match="beta2"):
        prepared.check(1, lr=0.1, beta2=1.5)
    with pytest.raises(ValueError, match="t"):
        prepared.step(np.ones(4, np.float32), 0, lr=0.1, convention="tf")
    with pytest.raises(ValueError, match="grads"):
        prepared.step(np.ones(5, np.float32), 1, lr=0.1)
    for a in (x, m, v):
        np.testing.assert_array_equal(a, 0.0)


# ---- fastadam.drivers ------------------------------------------------------------------------

def test_driver_kinds_are_the_coefficient_objects_kinds():
    x, a, b = np.zeros(4), np.zeros(4), np.zeros(4)
    kinds = {name: prepare_step(name, x, slots).check(1, lr=0.01).kind
             for name, slots in [("adam", {"m": a, "v": b}), ("adagrad", {"h": a}),
                                 ("momentum", {"v": a})]}
    assert kinds == {"adam": drivers.KIND_ADAM, "adagrad": drivers.KIND_ADAGRAD,
                     "momentum": drivers.KIND_MOMENTUM}
    assert {k: drivers.KINDS[k] for k in kinds} == kinds


def test_driver_row_checks():
    assert np.dtype(np.int32) in drivers.INDEX_TYPES and np.dtype(np.float16) not in \
        drivers.ROW_TYPES
    rows = drivers.check_rows(np.ones((3, 2), dtype=np.float32)[:, ::-1], "values", 3, (2,),
                              None)
    assert rows.flags.c_contiguous and rows.dtype == np.float32
    with pytest.raises(ValueError, match="values"):
        drivers.check_rows(np.ones((3, 2)), "values", 4, (2,), None)
    with pytest.raises(TypeError, match="values"):
        drivers.check_rows(np.ones((3, 2), dtype=np.int64), "values", 3, (2,), None)


# ---- fastadam.sparse.CSRBatches --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_batches_forward_and_weight_gradient(dtype):
    rng = np.random.default_rng(1)
    X = sp.random(50, 400, density=0.03, format="csr", dtype=dtype, random_state=2)
    w = rng.standard_normal((400, 3)).astype(dtype)
    rows = rng.permutation(50)[:17].astype(np.int64)
    batches = fastadam.sparse.CSRBatches(X)
    z = np.empty((17, 3), dtype=dtype)
    batch = batches.forward(rows, w, z)
    dense = X.toarray().astype(np.float64)[rows]
    np.testing.assert_allclose(z, dense @ w, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
    np.testing.assert_array_equal(batch.columns, np.flatnonzero(np.any(dense != 0, axis=0)))
    dz = rng.standard_normal((17, 3)).astype(dtype)
    grad = batches.weight_gradient(batch, dz)
    assert grad.dense_shape == (400, 3)
    np.testing.assert_allclose(grad.to_dense(), dense.T @ dz,
                               rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_csr_batches_reject_bad_input():
    X = sp.random(10, 20, density=0.2, format="csr", random_state=0)
    batches = fastadam.sparse.CSRBatches(X)
    w, z = np.zeros((20, 2)), np.zeros((3, 2))
    with pytest.raises(TypeError, match="X"):
        fastadam.sparse.CSRBatches(X.tocoo())
    with pytest.raises(IndexError, match="rows"):
        batches.forward(np.array([0, 10, 1]), w, z)
    with pytest.raises(TypeError, match="rows"):
        batches.forward(np.array([0, 1, 2], dtype=np.int32), w, z)
    with pytest.raises(ValueError, match="z"):
        batches.forward(np.array([0, 1]), w, z)
    with pytest.raises(TypeError, match="w"):
        batches.forward(np.array([0, 1, 2]), w.astype(np.float32), z)
    batch = batches.forward(np.array([0, 1, 2]), w, z)
    other = fastadam.sparse.CSRBatches(X)
    with pytest.raises(TypeError, match="batch"):
        other.weight_gradient(batch, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="dz"):
        batches.weight_gradient(batch, np.zeros((4, 2)))


# ---- the sparse steps' old home --------------------------------------------------------------

def test_sparse_steps_old_home_warns_and_forwards():
    for name in ("sparse_step_inplace", "sparse_adagrad_step_inplace",
                 "sparse_momentum_step_inplace"):
        with pytest.warns(DeprecationWarning, match=f"fastadam.optim.{name}"):
            assert getattr(fastadam.sparse, name) is getattr(fastadam, name)
        assert getattr(fastadam.optim, name) is getattr(fastadam, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastadam.sparse.IndexedSlices is fastadam.IndexedSlices
    with pytest.raises(AttributeError, match="no_such_name"):
        fastadam.sparse.no_such_name
