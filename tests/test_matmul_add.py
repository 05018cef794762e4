"""``fastadam.autodiff.matmul_add`` (``a @ b + c`` as one recorded op) and the ONNX session's
fusion of ``MatMul`` + ``Add`` of a bias into it: values and gradients against a float64
oracle written from the formulas, and bit for bit against the two operations it replaces."""
import numpy as np
import pytest

import fastadam.autodiff as ad


def _grads(f, a, b, c, g):
    """``(y, da, db, dc)`` of ``sum(f(a, b, c) * g)`` by the engine."""
    ts = [ad.Tensor(x, requires_grad=True) for x in (a, b, c)]
    y = f(*ts)
    grads = ad.gradient(ad.sum(ad.multiply(y, g)), ts)
    return [y.data] + [t.data for t in grads]


def _unfused(a, b, c):
    return ad.add(ad.matmul(a, b), c)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead", [(9,), (3, 5), (2, 3, 4)])
def test_values_and_gradients_equal_the_formulas_and_the_two_ops_bit_for_bit(rng, dtype, lead):
    k, n = 6, 7
    a = rng.standard_normal(lead + (k,)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal(lead + (n,)).astype(dtype)
    fused = _grads(ad.matmul_add, a, b, c, g)
    # the float64 formulas: y = a b + c; da = g b^T; db = a^T g (over every row); dc = sum g
    a2, g2 = a.reshape(-1, k).astype(np.float64), g.reshape(-1, n).astype(np.float64)
    b64 = b.astype(np.float64)
    want = [(a2 @ b64 + c).reshape(lead + (n,)), (g2 @ b64.T).reshape(a.shape), a2.T @ g2,
            g2.sum(0)]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for name, got, ref in zip(("y", "da", "db", "dc"), fused, want):
        assert got.dtype == dtype and got.shape == ref.shape, name
        np.testing.assert_allclose(got, ref, err_msg=name, **tol)
    # MatMul then Add, as the engine runs them (a of rank > 2 as one 2-D product, the way
    # fastadam.onnx's MatMul does): the same bits
    if len(lead) == 1:
        two = _grads(_unfused, a, b, c, g)
    else:
        two = _grads(lambda x, w, bias: ad.add(ad.reshape(
            ad.matmul(ad.reshape(x, (-1, k)), w), lead + (n,)), bias), a, b, c, g)
    for name, got, ref in zip(("y", "da", "db", "dc"), fused, two):
        np.testing.assert_array_equal(got, ref, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_an_empty_batch_gives_zero_parameter_gradients(rng, dtype, lead):
    """No rows: the bias gradient is a sum over nothing (zeros of the bias's shape), as the
    weight's is (sum_to could not reshape zero rows before)."""
    k, n = 4, 3
    a = np.zeros(lead + (k,), dtype)
    b, c = rng.standard_normal((k, n)).astype(dtype), rng.standard_normal(n).astype(dtype)
    for f in (ad.matmul_add, _unfused):
        y, da, db, dc = _grads(f, a, b, c, np.ones(lead + (n,), dtype))
        assert y.shape == lead + (n,) and da.shape == a.shape
        np.testing.assert_array_equal(db, np.zeros((k, n), dtype))
        np.testing.assert_array_equal(dc, np.zeros(n, dtype))
        assert dc.dtype == dtype


def test_a_strided_operand_gives_the_bits_of_its_copy(rng):
    a = rng.standard_normal((8, 5)).astype(np.float32).T  # (5, 8), not C-contiguous
    b = rng.standard_normal((8, 3)).astype(np.float32)
    c = rng.standard_normal(3).astype(np.float32)
    g = rng.standard_normal((5, 3)).astype(np.float32)
    for got, ref in zip(_grads(ad.matmul_add, a, b, c, g),
                        _grads(ad.matmul_add, np.ascontiguousarray(a), b, c, g)):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("case", ["bias 2-D", "bias broadcast row", "mixed dtypes", "b 1-D"])
def test_other_operands_run_as_matmul_then_add(rng, case):
    a = rng.standard_normal((4, 3))
    b = rng.standard_normal((3, 2))
    c = rng.standard_normal(2)
    if case == "bias 2-D":
        c = rng.standard_normal((4, 2))
    elif case == "bias broadcast row":
        c = rng.standard_normal((1, 2))
    elif case == "mixed dtypes":
        c = c.astype(np.float32)
    else:
        b = rng.standard_normal(3)
        c = rng.standard_normal(1)
    g = rng.standard_normal(np.broadcast_shapes((a @ b).shape, c.shape))
    for got, ref in zip(_grads(ad.matmul_add, a, b, c, g), _grads(_unfused, a, b, c, g)):
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)


def test_higher_order_derivatives_by_finite_differences(rng):
    a, b, c = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 2)), rng.standard_normal(2)
    ad.check_grads(lambda x, w, bias: ad.sum(ad.multiply(ad.matmul_add(x, w, bias),
                                                         ad.matmul_add(x, w, bias))),
                   a, b, c, order=2)


def test_bad_shapes_are_named(rng):
    with pytest.raises(ValueError, match="matmul"):
        ad.matmul_add(rng.standard_normal((3, 4)), rng.standard_normal((5, 2)),
                      rng.standard_normal(2))


# ---------------------------------------------------------------------------------------------
# the session fuses MatMul + Add of a bias
# ---------------------------------------------------------------------------------------------


def linear_model(bias_first=False, bias_shape=(5,), extra_output=None, dtype="FLOAT"):
    """An ONNX training model: x (B, T, 4) -> h = x @ w + bias; loss = sum(h * h)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import fastadam.onnx as fo
    rng = np.random.default_rng(7)
    np_dtype = np.float32 if dtype == "FLOAT" else np.float64
    inits = [numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np_dtype), "w"),
             numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np_dtype), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["prod"]),
             helper.make_node("Add", ["bias", "prod"] if bias_first else ["prod", "bias"],
                              ["h"]),
             helper.make_node("Mul", ["h", "h"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    elem = getattr(TensorProto, dtype)
    outputs = [helper.make_tensor_value_info("loss", elem, [])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, elem, ["B", "T", 5]))
    graph = helper.make_graph(nodes, "linear",
                              [helper.make_tensor_value_info("x", elem, ["B", "T", 4])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=9)
    onnx.checker.check_model(model)
    return model, fo


def _linear_labels(session):
    return [s.label for alg in session._algorithms for sched in alg.schedules.values()
            for s, _ in sched.program.ops if "(Add) (fused with" in s.label]


def _reference(session_inits, x):
    """loss and the gradients of w and bias by the engine, MatMul and Add as two ops."""
    w = ad.Tensor(session_inits["w"], requires_grad=True)
    bias = ad.Tensor(session_inits["bias"], requires_grad=True)
    h = ad.add(ad.reshape(ad.matmul(ad.reshape(ad.Tensor(x), (-1, 4)), w), x.shape[:-1] + (5,)),
               bias)
    loss = ad.sum(ad.multiply(h, h))
    dw, db = ad.gradient(loss, [w, bias])
    return loss.data, dw.data, db.data


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("dtype", ["FLOAT", "DOUBLE"])
def test_session_fuses_matmul_and_bias_with_the_bits_of_the_two_nodes(rng, bias_first, dtype):
    model, fo = linear_model(bias_first=bias_first, dtype=dtype)
    trained = fo.make_training_model(model, loss="loss", lr=0.01)
    start = fo.TrainingSession(trained).initializers
    session = fo.TrainingSession(trained)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32 if dtype == "FLOAT" else np.float64)
    out = session.step({"x": x}, ["loss", "fastadam.grad.w", "fastadam.grad.bias"])
    assert len(_linear_labels(session)) == 1
    loss, dw, db = _reference(start, x)
    np.testing.assert_array_equal(out["loss"], loss)
    np.testing.assert_array_equal(out["fastadam.grad.w"], dw)
    np.testing.assert_array_equal(out["fastadam.grad.bias"], db)
    # the nodes one by one (fastadam.onnx.run never fuses): the same loss
    np.testing.assert_array_equal(fo.run(model, {"x": x})["loss"], loss)


def test_a_product_read_elsewhere_is_not_fused(rng):
    model, fo = linear_model(extra_output="prod")
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss"))
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = session.step({"x": x}, ["loss", "prod"])
    assert _linear_labels(session) == []
    w = fo.TrainingSession(fo.make_training_model(model, loss="loss")).initializers["w"]
    np.testing.assert_array_equal(out["prod"], (x.reshape(-1, 4) @ w).reshape(2, 3, 5))


def test_a_bias_that_is_not_one_row_runs_the_two_nodes(rng):
    """Compiled fused, decided at each run: a (T, 5) bias runs MatMul then Add."""
    model, fo = linear_model(bias_shape=(2, 5))
    trained = fo.make_training_model(model, loss="loss", lr=0.01)
    start = fo.TrainingSession(trained).initializers
    session = fo.TrainingSession(trained)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    out = session.step({"x": x}, ["loss", "fastadam.grad.bias"])
    assert len(_linear_labels(session)) == 1
    loss, _, db = _reference(start, x)
    np.testing.assert_array_equal(out["loss"], loss)
    assert out["fastadam.grad.bias"].shape == (2, 5)
    np.testing.assert_array_equal(out["fastadam.grad.bias"], db)


def test_a_bias_of_the_wrong_length_is_the_add_nodes_error(rng):
    model, fo = linear_model(bias_shape=(3,))
    onnx = pytest.importorskip("onnx")
    del onnx
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss"))
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"node #1 \(Add\)"):
        session.step({"x": x})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(9, 6, 7), (1, 1, 1), (64, 64, 10)])
def test_gemm_trans_b_with_a_bias_is_one_op_with_the_bits_of_two(rng, dtype, m, k, n):
    """``gemm(a, b, c, trans_b=True)`` with a bias (n,) (ONNX Gemm(transB=1), a Linear layer)
    records one op, ``_matmul_nt_add``: its values and gradients are the float64 formulas' and,
    bit for bit, those of the product then the addition as two recorded ops."""
    from fastadam.autodiff import _ops
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((n, k)).astype(dtype)
    c = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal((m, n)).astype(dtype)
    fused = _grads(lambda x, w, bias: ad.gemm(x, w, bias, trans_b=True), a, b, c, g)
    a64, b64, g64 = a.astype(np.float64), b.astype(np.float64), g.astype(np.float64)
    want = [a64 @ b64.T + c, g64 @ b64, g64.T @ a64, g64.sum(0)]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for name, got, ref in zip(("y", "da", "db", "dc"), fused, want):
        assert got.dtype == dtype and got.shape == ref.shape, name
        np.testing.assert_allclose(got, ref, err_msg=name, **tol)
    two = _grads(lambda x, w, bias: ad.add(_ops.matmul_nt(x, w), bias), a, b, c, g)
    for name, got, ref in zip(("y", "da", "db", "dc"), fused, two):
        np.testing.assert_array_equal(got, ref, err_msg=name)
    ts = [ad.Tensor(x, requires_grad=True) for x in (a, b, c)]
    assert ad.gemm(*ts, trans_b=True)._node.prim is _ops._matmul_nt_add


@pytest.mark.parametrize("case", ["alpha", "beta", "bias 2-D", "bias row", "mixed dtypes"])
def test_gemm_trans_b_other_biases_run_as_two_ops(rng, case):
    from fastadam.autodiff import _ops
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((2, 3))
    c = {"bias 2-D": rng.standard_normal((4, 2)), "bias row": rng.standard_normal((1, 2)),
         "mixed dtypes": rng.standard_normal(2).astype(np.float32)}.get(
        case, rng.standard_normal(2))
    kw = {"alpha": dict(alpha=0.5), "beta": dict(beta=2.0)}.get(case, {})
    ts = [ad.Tensor(x, requires_grad=True) for x in (a, b, c)]
    y = ad.gemm(*ts, trans_b=True, **kw)
    assert y._node.prim is not _ops._matmul_nt_add
    ref = kw.get("alpha", 1.0) * (a @ b.T) + kw.get("beta", 1.0) * c.astype(np.float64)
    np.testing.assert_allclose(y.data, ref, rtol=1e-6)
