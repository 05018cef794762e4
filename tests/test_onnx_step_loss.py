"""``TrainingSession.step()`` returns the loss (issue 42): also when the loss is an output of the
model itself (``make_training_model(model, loss="<output name>")``), where it is no algorithm
output.  Oracle: the loss computed in float64 NumPy from the initializers before the step."""
import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402


def _model_with_its_own_loss():
    W = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm"),
             helper.make_node("Sub", ["Y", "target"], ["d"], name="sub"),
             helper.make_node("Mul", ["d", "d"], ["sq"], name="sq"),
             helper.make_node("ReduceMean", ["sq"], ["loss"], name="mean", keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4]),
                     helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _oracle(W, X, target):
    d = X.astype(np.float64) @ W.astype(np.float64) - target
    return float(np.mean(d * d))


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_step_returns_the_loss_when_it_is_a_model_output(optimizer):
    session = fo.TrainingSession(fo.make_training_model(_model_with_its_own_loss(), loss="loss",
                                                        optimizer=optimizer, lr=0.05))
    assert session.default_outputs() == ["loss"]
    rng = np.random.default_rng(42)
    losses = []
    for _ in range(4):
        X = rng.standard_normal((6, 4)).astype(np.float32)
        target = rng.standard_normal((6, 2)).astype(np.float32)
        expected = _oracle(session.initializers["W"], X, target)  # before the update
        out = session.step({"X": X, "target": target})
        assert set(out) == {"loss"}
        np.testing.assert_allclose(out["loss"], expected, rtol=1e-5)
        losses.append(float(out["loss"]))
    # fit keeps it too
    X = rng.standard_normal((6, 4)).astype(np.float32)
    target = X @ np.ones((4, 2), np.float32)
    kept = session.fit([{"X": X, "target": target}] * 30, progress=False)
    assert kept["loss"].shape == (30,) and kept["loss"][-1] < kept["loss"][0]


def test_the_loss_a_builder_adds_is_returned_once():
    model = _model_with_its_own_loss()
    session = fo.TrainingSession(fo.make_training_model(model, loss="mse", output="Y"))
    names = session.default_outputs()
    assert len(names) == 1 and names[0] != "loss"
    X = np.eye(4, dtype=np.float32)
    out = session.step({"X": X, "target": np.zeros((4, 2), np.float32),
                        "labels": np.zeros((4, 2), np.float32)})
    assert list(out) == names
