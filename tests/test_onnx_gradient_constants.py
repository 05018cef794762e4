"""Constants in a Gradient node's sub-graph (issue 22): an initializer or a Constant output in
neither ``xs`` nor ``zs``, and not bound by the training info, is read at its current value
(integer shape tensors included); graph inputs and trained initializers must still be listed."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402
from reference import needed_without_y  # noqa: E402

D = TensorProto.DOUBLE
TRAIN = fo.TRAINING_DOMAIN
R = np.random.default_rng(2022)
X = R.standard_normal((4, 3, 2))
W = R.standard_normal((6, 5))
W_OTHER = R.standard_normal((6, 5))
SCALE = R.standard_normal(5)


def _forward_nodes():
    """loss = sum(tanh(reshape(X, shape) @ W * scale + c)); ``shape`` (int64) and ``scale`` are
    initializers, ``c`` a Constant node."""
    return [helper.make_node("Reshape", ["X", "shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["h"]),
            helper.make_node("Mul", ["h", "scale"], ["hs"]),
            helper.make_node("Constant", [], ["c"],
                             value=numpy_helper.from_array(np.array(0.25), "c")),
            helper.make_node("Add", ["hs", "c"], ["a"]),
            helper.make_node("Tanh", ["a"], ["t"]),
            helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0)]


def _inits():
    return [numpy_helper.from_array(W, "W"), numpy_helper.from_array(W_OTHER, "W_other"),
            numpy_helper.from_array(SCALE, "scale"),
            numpy_helper.from_array(np.array([4, 6], np.int64), "shape")]


def _expected_grad(w):
    """d loss / d W, from the formula (float64)."""
    flat = X.reshape(4, 6)
    t = np.tanh(flat @ w * SCALE + 0.25)
    return flat.T @ ((1 - t ** 2) * SCALE)


def _model(nodes, outputs, inits, training_info=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", D, [4, 3, 2])],
                              [helper.make_tensor_value_info(n, D, s) for n, s in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(TRAIN, 1)])
    model.ir_version = 8
    model.training_info.extend(training_info)
    return model


@pytest.mark.parametrize("inputs", [["W", "X"], ["W_other", "X"]],
                         ids=["forward-reused", "re-evaluated"])
def test_initializers_and_constant_outside_xs_and_zs_are_constants(inputs):
    """The second form feeds the Gradient another value for W: its sub-graph is re-evaluated,
    reading ``shape``, ``scale`` and ``c`` from the graph."""
    nodes = _forward_nodes() + [helper.make_node("Gradient", inputs, ["dW"], domain=TRAIN,
                                                 xs=["W"], zs=["X"], y="loss")]
    model = _model(nodes, [("loss", []), ("dW", [6, 5])], _inits())
    out = fo.run(model, {"X": X})
    at = W if inputs[0] == "W" else W_OTHER
    np.testing.assert_allclose(out["dW"], _expected_grad(at), rtol=1e-12, atol=1e-14)


def test_graph_input_outside_xs_and_zs_is_still_an_error():
    nodes = _forward_nodes() + [helper.make_node("Gradient", ["W"], ["dW"], name="grad",
                                                 domain=TRAIN, xs=["W"], y="loss")]
    model = _model(nodes, [("dW", [6, 5])], _inits())
    with pytest.raises(ValueError, match=r"node 'grad' \(Gradient\): y 'loss' depends on 'X' "
                                         r"\(a graph input, or an initializer that the training "
                                         r"info updates\), which is in neither xs nor zs"):
        fo.run(model, {"X": X})


def _sgd_training_info(gradient_zs, bind_scale=False):
    """An algorithm W <- W - 0.1 * dW (and, with ``bind_scale``, scale <- scale * 1)."""
    nodes = [helper.make_node("Gradient", ["W"] + gradient_zs, ["dW"], name="grad", domain=TRAIN,
                              xs=["W"], zs=gradient_zs, y="loss"),
             helper.make_node("Mul", ["dW", "lr"], ["step"]),
             helper.make_node("Sub", ["W", "step"], ["W_new"]),
             helper.make_node("Mul", ["scale", "one"], ["scale_new"])]
    outputs = [helper.make_tensor_value_info("W_new", D, [6, 5]),
               helper.make_tensor_value_info("scale_new", D, [5])]
    algorithm = helper.make_graph(nodes, "algorithm", [], outputs,
                                  [numpy_helper.from_array(np.array(0.1), "lr"),
                                   numpy_helper.from_array(np.array(1.0), "one")])
    info = onnx.TrainingInfoProto(algorithm=algorithm)
    binding = info.update_binding.add()
    binding.key, binding.value = "W", "W_new"
    if bind_scale:
        binding = info.update_binding.add()
        binding.key, binding.value = "scale", "scale_new"
    return info


@pytest.mark.parametrize("path", ["forward reused", "sub-graph re-evaluated"])
def test_training_session_reads_unbound_initializers_as_constants(path, monkeypatch):
    from fastadam.onnx._graph import Graph

    if path == "sub-graph re-evaluated":
        monkeypatch.setattr(Graph, "needed", needed_without_y)
    model = _model(_forward_nodes(), [("loss", [])], _inits(), [_sgd_training_info(["X"])])
    session = fo.TrainingSession(model)
    w = W.copy()
    for _ in range(3):
        session.step({"X": X})
        w = w - 0.1 * _expected_grad(w)
        np.testing.assert_allclose(session.initializers["W"], w, rtol=1e-12, atol=1e-14)


def test_initializer_the_training_info_updates_must_be_listed():
    model = _model(_forward_nodes(), [("loss", [])], _inits(),
                   [_sgd_training_info(["X"], bind_scale=True)])
    with pytest.raises(ValueError, match=r"node 'grad' \(Gradient\): y 'loss' depends on 'scale' "
                                         r"\(a graph input, or an initializer that the training "
                                         r"info updates\)"):
        fo.TrainingSession(model)
    # listed in zs, it is fine
    fo.TrainingSession(_model(_forward_nodes(), [("loss", [])], _inits(),
                              [_sgd_training_info(["X", "scale"], bind_scale=True)]))


def test_make_training_model_with_constants_left_out_of_zs_trains_the_same():
    """make_training_model lists every tensor the loss reaches in zs; a Gradient that lists only
    the feeds (as one written by hand would) trains to the same weights."""
    nodes = _forward_nodes()[:-2] + [helper.make_node("Identity", ["a"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", D, [4, 3, 2])],
                              [helper.make_tensor_value_info("logits", D, [4, 5])], _inits())
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    base.ir_version = 8
    full = fo.make_training_model(base, loss="softmax_cross_entropy", optimizer="adam", lr=0.01,
                                  params=["W"])
    lean = onnx.ModelProto()
    lean.CopyFrom(full)
    alg = lean.training_info[0].algorithm
    grad = next(n for n in alg.node if n.op_type == "Gradient")
    attrs = {a.name: helper.get_attribute_value(a) for a in grad.attribute}
    zs = [z.decode() for z in attrs["zs"]]
    feeds = [z for z in zs if z in ("X", "labels")]
    assert set(zs) - set(feeds) >= {"shape", "scale"}  # constants the lean form leaves out
    lean_grad = helper.make_node("Gradient", ["W"] + feeds, list(grad.output), name=grad.name,
                                 domain=TRAIN, xs=["W"], zs=feeds, y=attrs["y"].decode())
    grad.CopyFrom(lean_grad)
    labels = R.integers(0, 5, 4)
    sessions = [fo.TrainingSession(m) for m in (full, lean)]
    for _ in range(3):
        losses = [s.step({"X": X, "labels": labels}) for s in sessions]
        assert losses[0].keys() == losses[1].keys()
        for k in losses[0]:
            np.testing.assert_array_equal(losses[0][k], losses[1][k])
    np.testing.assert_array_equal(sessions[0].initializers["W"], sessions[1].initializers["W"])


def test_torch_default_exporter_reshape_shape_initializer():
    """torch.onnx.export's default (dynamo) exporter stores a Reshape's target shape as an int64
    initializer; a Gradient over the loss listing only the feeds in zs gives torch's gradients."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")  # the default exporter's dependency

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(12, 8)
            self.fc2 = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x.reshape(x.shape[0], 12))))

    torch.manual_seed(0)
    net = Net().double().eval()
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 0])
    model = torch.onnx.export(net, (x,), dynamo=True, opset_version=18, verbose=False).model_proto
    g = model.graph
    params = [t.name for t in g.initializer if t.data_type == TensorProto.DOUBLE]
    ints = [t.name for t in g.initializer if t.data_type == TensorProto.INT64]
    assert ints, "the exporter stored no integer initializer: the test shows nothing"
    x_name, logits = g.input[0].name, g.output[0].name
    g.input.append(helper.make_tensor_value_info("labels", TensorProto.INT64, [5]))
    g.node.extend([
        helper.make_node("SoftmaxCrossEntropyLoss", [logits, "labels"], ["loss"]),
        helper.make_node("Gradient", params + [x_name, "labels"], [f"d_{p}" for p in params],
                         domain=TRAIN, xs=params, zs=[x_name, "labels"], y="loss")])
    dims = {t.name: list(t.dims) for t in g.initializer}
    g.output.extend([helper.make_tensor_value_info(f"d_{p}", D, dims[p]) for p in params])
    model.opset_import.append(helper.make_opsetid(TRAIN, 1))
    out = fo.run(model, {x_name: x.numpy(), "labels": labels.numpy()})
    torch.nn.functional.cross_entropy(net(x), labels).backward()
    named = dict(net.named_parameters())
    for p in params:
        np.testing.assert_allclose(out[f"d_{p}"], named[p].grad.numpy(), rtol=1e-10, atol=1e-13)
