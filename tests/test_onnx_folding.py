"""Shape computations a session's program runs once per input signature
(fastadam/onnx/_folding.py): the same values as running every node (``fastadam.onnx.run``), a
new batch size recomputes them, an initializer the folded nodes read that is too large to
compare turns folding off, and values read after the program are never folded."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx import _core_ops  # noqa: E402


def shape_model(big_constant=False):
    """x (B, 4) -> Reshape(x, Concat(Shape(x)[0:1], [2, 2])) @ w, plus a causal mask built
    from Shape, Range, Expand, Trilu, Equal, Where, added to (x @ x^T); loss = sum of both."""
    rng = np.random.default_rng(5)
    fill = np.full((5000,) if big_constant else (), -3.0, np.float32)
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w", rng.standard_normal((2, 2)).astype(np.float32)),
        ("two_two", np.array([2, 2], np.int64)),
        ("zero", np.array([0], np.int64)), ("one", np.array([1], np.int64)),
        ("one_f", np.array(1.0, np.float32)), ("zero_f", np.array(0.0, np.float32)),
        ("fill", fill), ("start", np.array(0, np.int64)), ("step", np.array(1, np.int64))]]
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Slice", ["sx", "zero", "one"], ["b"]),
        helper.make_node("Concat", ["b", "two_two"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["x3"]),
        helper.make_node("MatMul", ["x3", "w"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["l1"], keepdims=0),
        helper.make_node("Concat", ["b", "b"], ["bb"], axis=0),
        helper.make_node("Expand", ["one_f", "bb"], ["ones"]),
        helper.make_node("Trilu", ["ones"], ["tril"], upper=0),
        helper.make_node("Equal", ["tril", "zero_f"], ["above"]),
        helper.make_node("ReduceMax", ["fill"], ["fill_max"], keepdims=0),
        helper.make_node("Where", ["above", "fill_max", "zero_f"], ["mask"]),
        helper.make_node("Transpose", ["x"], ["xt"]),
        helper.make_node("MatMul", ["x", "xt"], ["xx"]),
        helper.make_node("Add", ["xx", "mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked"], ["l2"], keepdims=0),
        helper.make_node("Add", ["l1", "l2"], ["loss"]),
        helper.make_node("Squeeze", ["b"], ["batch"]),
        helper.make_node("Range", ["start", "batch", "step"], ["positions"]),
    ]
    graph = helper.make_graph(
        nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("positions", TensorProto.INT64, ["B"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def count_trilu(monkeypatch):
    """A list that grows by one at each Trilu run (of the sessions built after this call)."""
    calls = []
    since, trilu = _core_ops.OPERATORS["Trilu"]

    def counting_trilu(*args, **kw):
        calls.append(1)
        return trilu(*args, **kw)
    monkeypatch.setitem(_core_ops.OPERATORS, "Trilu", (since, counting_trilu))
    return calls


def schedule_program(session):
    (alg,) = session._algorithms
    return [sched.program for sched in alg.schedules.values()]


def test_folded_values_equal_every_node_run_and_follow_the_batch_size(rng, monkeypatch):
    model = shape_model()
    batches = [3, 3, 5, 5, 3]
    xs = [rng.standard_normal((b, 4)).astype(np.float32) for b in batches]
    refs = [fo.run(model, {"x": x}) for x in xs]  # every node, before Trilu is counted
    calls = count_trilu(monkeypatch)
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss", params=["w"],
                                                        lr=0.0))
    for x, ref, trilu_calls in zip(xs, refs, [1, 1, 2, 2, 3]):
        out = session.step({"x": x}, ["loss", "fastadam.grad.w", "positions"])
        np.testing.assert_allclose(out["loss"], ref["loss"], rtol=1e-6)
        np.testing.assert_array_equal(out["positions"], ref["positions"])
        # d loss / d w[i, j]: the sum over the batch and the first reshaped axis of x3[..., i]
        want = np.tile(x.reshape(-1, 2, 2).sum((0, 1))[:, None], 2)
        np.testing.assert_allclose(out["fastadam.grad.w"], want, rtol=1e-5)
        assert len(calls) == trilu_calls  # computed again only for a new batch size
    (program,) = schedule_program(session)
    assert "(folded)" in program.describe()
    folded = {program.ops[k][0].node.op_type for k in program.folded}
    assert {"Shape", "Slice", "Concat", "Expand", "Trilu", "Equal", "Where", "ReduceMax"} <= \
        folded
    # the Reshape and products read x; "positions" (Range) is read after the program
    assert not {"Reshape", "MatMul", "Range"} & folded


def test_a_large_initializer_read_by_folded_nodes_turns_folding_off(rng, monkeypatch):
    model = shape_model(big_constant=True)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ref = fo.run(model, {"x": x})
    calls = count_trilu(monkeypatch)
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss", params=["w"],
                                                        lr=0.0))
    for k in range(3):
        out = session.step({"x": x}, ["loss"])
        np.testing.assert_allclose(out["loss"], ref["loss"], rtol=1e-6)
        assert len(calls) == k + 1  # every step runs every node
