"""Gradient nodes: the onnx package's backend models, agreement with fastadam.autodiff, finite
differences to second order (a Gradient of a Gradient), intermediate and re-fed xs, errors."""
import importlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.autodiff as ad  # noqa: E402
import fastadam.onnx as fo  # noqa: E402

D = TensorProto.DOUBLE
TRAIN = fo.TRAINING_DOMAIN


@pytest.mark.parametrize("name", ["test_gradient_of_add", "test_gradient_of_add_and_mul"])
def test_backend_models(name):
    from onnx.backend.test.case import model as cases
    from onnx.backend.test.runner import Runner
    importlib.import_module("onnx.backend.test.case.model.gradient")
    case = {c.name: c for c in cases._SimpleModelTestCases}[name]
    m = case.model
    for inputs, expected in case.data_sets:
        out = fo.run(m, {vi.name: a for vi, a in zip(m.graph.input, inputs)})
        Runner.assert_similar_outputs(list(expected), [out[o.name] for o in m.graph.output],
                                      case.rtol, case.atol)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s)
                                           for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(TRAIN, 1)])
    model.ir_version = 8
    return model


def _cnn_graph():
    """A float64 function of X (2, 2, 6, 6) and W (3, 2, 3, 3) through most differentiable ops."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(3), "scale"),
             numpy_helper.from_array(rng.standard_normal(3), "bias"),
             numpy_helper.from_array(rng.standard_normal(3), "mean"),
             numpy_helper.from_array(rng.random(3) + 0.5, "var"),
             numpy_helper.from_array(rng.standard_normal((4, 27)), "V"),
             numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "shape"),
             numpy_helper.from_array(np.array(1.5), "p"),
             numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "lab")]
    nodes = [helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("LeakyRelu", ["bn"], ["lr"], alpha=0.1),
             helper.make_node("MaxPool", ["lr"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["mp"], ["ap"], kernel_shape=[2, 2],
                              pads=[0, 0, 1, 1]),
             helper.make_node("Reshape", ["ap", "shape"], ["flat"]),
             helper.make_node("Sigmoid", ["flat"], ["sg"]),
             helper.make_node("Pow", ["sg", "p"], ["pw"]),
             helper.make_node("Gemm", ["pw", "V"], ["logits"], transB=1),
             helper.make_node("Tanh", ["logits"], ["th"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["th", "lab"], ["loss"])]
    return nodes, inits


CONSTS = ["scale", "bias", "mean", "var", "V", "shape", "p", "lab"]  # the zs of the Gradients


def _feeds(rng):
    return {"X": rng.standard_normal((2, 2, 6, 6)), "W": rng.standard_normal((3, 2, 3, 3)) * 0.5}


def _directional_fd(model, feeds, out, v, eps=1e-6):
    plus = {k: a + eps * v[k] if k in v else a for k, a in feeds.items()}
    minus = {k: a - eps * v[k] if k in v else a for k, a in feeds.items()}
    return (float(np.sum(fo.run(model, plus, [out])[out])) -
            float(np.sum(fo.run(model, minus, [out])[out]))) / (2 * eps)


def test_gradient_and_hessian_vector_match_finite_differences(rng):
    nodes, inits = _cnn_graph()
    u = {"X": rng.standard_normal((2, 2, 6, 6)), "W": rng.standard_normal((3, 2, 3, 3))}
    inits += [numpy_helper.from_array(u["X"], "uX"), numpy_helper.from_array(u["W"], "uW")]
    nodes += [
        helper.make_node("Gradient", ["X", "W"] + CONSTS, ["dX", "dW"], domain=TRAIN,
                         xs=["X", "W"], zs=CONSTS, y="loss"),
        # s = <grad, u>: its gradient is the Hessian times u (a Gradient of a Gradient)
        helper.make_node("Mul", ["dX", "uX"], ["pX"]),
        helper.make_node("Mul", ["dW", "uW"], ["pW"]),
        helper.make_node("ReduceSum", ["pX"], ["sX"], keepdims=0),
        helper.make_node("ReduceSum", ["pW"], ["sW"], keepdims=0),
        helper.make_node("Add", ["sX", "sW"], ["s"]),
        helper.make_node("Gradient", ["X", "W"] + CONSTS + ["uX", "uW"], ["hX", "hW"],
                         domain=TRAIN, xs=["X", "W"], zs=CONSTS + ["uX", "uW"], y="s")]
    model = _model(nodes, [("X", D, [2, 2, 6, 6]), ("W", D, [3, 2, 3, 3])],
                   [("loss", D, []), ("dX", D, [2, 2, 6, 6]), ("dW", D, [3, 2, 3, 3]), ("s", D, []),
                    ("hX", D, [2, 2, 6, 6]), ("hW", D, [3, 2, 3, 3])], inits)
    feeds = _feeds(rng)
    out = fo.run(model, feeds)
    v = {"X": rng.standard_normal((2, 2, 6, 6)), "W": rng.standard_normal((3, 2, 3, 3))}
    first = float(np.sum(out["dX"] * v["X"]) + np.sum(out["dW"] * v["W"]))
    np.testing.assert_allclose(first, _directional_fd(model, feeds, "loss", v), rtol=1e-5,
                               atol=1e-8)
    np.testing.assert_allclose(float(out["s"]), float(np.sum(out["dX"] * u["X"]) +
                                                      np.sum(out["dW"] * u["W"])), rtol=1e-12)
    second = float(np.sum(out["hX"] * v["X"]) + np.sum(out["hW"] * v["W"]))
    np.testing.assert_allclose(second, _directional_fd(model, feeds, "s", v), rtol=1e-5,
                               atol=1e-8)


def test_gradient_matches_autodiff(rng):
    nodes, inits = _cnn_graph()
    nodes.append(helper.make_node("Gradient", ["X", "W"] + CONSTS, ["dX", "dW"], domain=TRAIN,
                                  xs=["X", "W"], zs=CONSTS, y="loss"))
    model = _model(nodes, [("X", D, [2, 2, 6, 6]), ("W", D, [3, 2, 3, 3])],
                   [("dX", D, [2, 2, 6, 6]), ("dW", D, [3, 2, 3, 3])], inits)
    feeds = _feeds(rng)
    out = fo.run(model, feeds)
    c = {t.name: numpy_helper.to_array(t) for t in inits}
    X = ad.Tensor(feeds["X"], requires_grad=True)
    W = ad.Tensor(feeds["W"], requires_grad=True)
    h = ad.conv2d(X, W, padding=1)
    # ONNX float attributes are float32, the schema's defaults (epsilon 1e-5) included
    h = ad.batch_norm(h, c["scale"], c["bias"], c["mean"], c["var"],
                      epsilon=float(np.float32(1e-5)))
    alpha = float(np.float32(0.1))
    h = ad.avg_pool2d(ad.max_pool2d(ad.leaky_relu(h, alpha), (2, 2), (2, 2)), (2, 2),
                      pads=(0, 0, 1, 1))
    h = ad.sigmoid(ad.reshape(h, (2, -1))) ** ad.Tensor(c["p"])
    loss = ad.softmax_cross_entropy(ad.tanh(h @ ad.Tensor(c["V"]).T), c["lab"])
    dX, dW = ad.gradient(loss, [X, W])
    np.testing.assert_allclose(out["dX"], dX.data, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["dW"], dW.data, rtol=1e-12, atol=1e-15)


def _hidden_model():
    """H = Tanh(X W); Y = sum(H * H * Z): dY/dH = 2 H Z at whatever H the Gradient gets."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Tanh", ["XW"], ["H"]),
             helper.make_node("Mul", ["H", "H"], ["HH"]),
             helper.make_node("Mul", ["HH", "Z"], ["HHZ"]),
             helper.make_node("ReduceSum", ["HHZ"], ["Y"], keepdims=0),
             helper.make_node("Gradient", ["H", "Z"], ["dH", "dZ"], domain=TRAIN,
                              xs=["H", "Z"], y="Y"),
             helper.make_node("Gradient", ["H1", "Z"], ["dH1", "dZ1"], domain=TRAIN,
                              xs=["H", "Z"], y="Y")]
    return _model(nodes, [("X", D, [3, 4]), ("W", D, [4, 2]), ("Z", D, [3, 2]),
                          ("H1", D, [3, 2])],
                  [(n, D, [3, 2]) for n in ("H", "dH", "dZ", "dH1", "dZ1")])


def test_intermediate_xs_and_values_fed_to_the_gradient(rng):
    feeds = {"X": rng.standard_normal((3, 4)), "W": rng.standard_normal((4, 2)),
             "Z": rng.standard_normal((3, 2)), "H1": rng.standard_normal((3, 2))}
    out = fo.run(_hidden_model(), feeds)
    H = np.tanh(feeds["X"] @ feeds["W"])
    np.testing.assert_allclose(out["H"], H)
    np.testing.assert_allclose(out["dH"], 2 * H * feeds["Z"], rtol=1e-12)  # stops at H
    np.testing.assert_allclose(out["dZ"], H * H, rtol=1e-12)
    np.testing.assert_allclose(out["dH1"], 2 * feeds["H1"] * feeds["Z"], rtol=1e-12)
    np.testing.assert_allclose(out["dZ1"], feeds["H1"] ** 2, rtol=1e-12)


def test_non_scalar_y_is_seeded_with_ones(rng):
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], y="y")]
    model = _model(nodes, [("x", D, [5])], [("dx", D, [5])])
    x = rng.standard_normal(5)
    np.testing.assert_allclose(fo.run(model, {"x": x})["dx"], 2 * x)
    with ad.no_grad():  # a Gradient node records its forward pass regardless
        np.testing.assert_allclose(fo.run(model, {"x": x})["dx"], 2 * x)


def test_unused_x_gets_zeros(rng):
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"]),
             helper.make_node("Gradient", ["x", "z"], ["dx", "dz"], domain=TRAIN, xs=["x", "z"],
                              y="y")]
    model = _model(nodes, [("x", D, [3]), ("z", D, [2])], [("dz", D, [2])])
    np.testing.assert_array_equal(fo.run(model, {"x": np.ones(3), "z": np.ones(2)})["dz"], 0)


def test_float32_gradient_keeps_dtype(rng):
    F = TensorProto.FLOAT
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], y="y")]
    model = _model(nodes, [("x", F, [4])], [("dx", F, [4])])
    x = rng.standard_normal(4).astype(np.float32)
    dx = fo.run(model, {"x": x})["dx"]
    s = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert dx.dtype == np.float32
    np.testing.assert_allclose(dx, s * (1 - s), rtol=1e-6)


# --- errors ------------------------------------------------------------------------------------

def test_xs_and_zs_must_determine_y():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], y="y",
                              name="grad")]
    model = _model(nodes, [("x", D, [3]), ("w", D, [3])], [("dx", D, [3])])
    with pytest.raises(ValueError, match=r"node 'grad' \(Gradient\): y 'y' depends on 'w' "
                                         r"\(a graph input, or an initializer that the training "
                                         r"info updates\), which is in neither xs nor zs"):
        fo.run(model, {"x": np.ones(3), "w": np.ones(3)})


def test_gradient_input_count():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], zs=["w"],
                              y="y", name="grad")]
    model = _model(nodes, [("x", D, [3]), ("w", D, [3])], [("dx", D, [3])])
    with pytest.raises(ValueError, match=r"node 'grad' \(Gradient\): expected 2 inputs"):
        fo.run(model, {"x": np.ones(3), "w": np.ones(3)})


def test_gradient_of_integer_xs():
    I64 = TensorProto.INT64
    nodes = [helper.make_node("Cast", ["k"], ["kf"], to=D),
             helper.make_node("Mul", ["kf", "x"], ["y"]),
             helper.make_node("Gradient", ["k", "x"], ["dk", "dx"], domain=TRAIN, xs=["k", "x"],
                              y="y", name="grad")]
    model = _model(nodes, [("k", I64, [3]), ("x", D, [3])], [("dx", D, [3])])
    with pytest.raises(TypeError, match=r"node 'grad' \(Gradient\): xs 'k': expected a "
                                        r"floating-point tensor"):
        fo.run(model, {"k": np.ones(3, np.int64), "x": np.ones(3)})


def test_gradient_through_an_optimizer_is_refused():
    nodes = [helper.make_node("Adam", ["R", "T", "x", "g", "v", "h"], ["x2", "v2", "h2"],
                              domain=TRAIN),
             helper.make_node("ReduceSum", ["x2"], ["y"], keepdims=0),
             helper.make_node("Gradient", ["R", "T", "x", "g", "v", "h"], ["dR"], domain=TRAIN,
                              xs=["R"], zs=["T", "x", "g", "v", "h"], y="y", name="grad")]
    model = _model(nodes, [("R", D, []), ("T", TensorProto.INT64, []), ("x", D, [2]),
                           ("g", D, [2]), ("v", D, [2]), ("h", D, [2])], [("dR", D, [])])
    one = np.ones(2)
    with pytest.raises(ValueError, match=r"node 'grad' \(Gradient\): y 'y' depends on node #0 "
                                         r"\(Adam\), which is not differentiable"):
        fo.run(model, {"R": np.array(0.1), "T": np.array(1), "x": one, "g": one, "v": one,
                       "h": one})


def test_second_derivative_at_fed_values_re_evaluates_the_inner_gradient(rng):
    """G2 gets x2 in place of x: its sub-graph (which contains G1) is evaluated again at x2."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["xx"]),
             helper.make_node("Mul", ["xx", "x"], ["xxx"]),
             helper.make_node("ReduceSum", ["xxx"], ["y"], keepdims=0),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], y="y"),
             helper.make_node("Mul", ["dx", "u"], ["du"]),
             helper.make_node("ReduceSum", ["du"], ["s"], keepdims=0),
             helper.make_node("Gradient", ["x2", "u"], ["hx"], domain=TRAIN, xs=["x"],
                              zs=["u"], y="s")]
    model = _model(nodes, [("x", D, [4]), ("u", D, [4]), ("x2", D, [4])],
                   [("dx", D, [4]), ("hx", D, [4])])
    x, u, x2 = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    out = fo.run(model, {"x": x, "u": u, "x2": x2})
    np.testing.assert_allclose(out["dx"], 3 * x * x, rtol=1e-12)
    np.testing.assert_allclose(out["hx"], 6 * x2 * u, rtol=1e-12)
