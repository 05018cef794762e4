"""The ONNX training operators never step uphill on a legal input (issue 41, scope 4).

The schema of ``ai.onnx.preview.training.Adagrad`` computes ``r = R / (1 + T * decay_factor)``
with ``T`` "the number of training iterations conducted" (0 or 1 at the first update): for
``T >= 0`` and ``decay_factor >= 0``, ``r`` is positive.  fastadam.onnx follows the pseudo-code
(and ``onnx.reference``) for every ``T`` where ``1 + T * decay_factor > 0``, negative ``T``
included, and refuses the rest, where ``onnx.reference`` moves X along the gradient (checked
here).  A negative learning rate ``R`` (all three operators) and a negative Momentum ``alpha`` or
``beta`` are refused for the same reason.  Every refusal names the node and the input or
attribute, and leaves a session's initializers as they were."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

TRAIN = fo.TRAINING_DOMAIN
rng = np.random.default_rng(41)


def _optimizer_model(op, n_states, **attrs):
    names = ["R", "T", "X", "G"] + [f"S{k}" for k in range(n_states)]
    outs = ["X_new"] + [f"S{k}_new" for k in range(n_states)]
    node = helper.make_node(op, names, outs, name="opt", domain=TRAIN, **attrs)
    types = {"R": (TensorProto.FLOAT, []), "T": (TensorProto.INT64, [])}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, *types.get(n, (TensorProto.FLOAT, [5])))
                      for n in names],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [5]) for n in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(TRAIN, 1)])


def _feeds(R, T, n_states, zero_states=True):
    x, g = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    feeds = {"R": np.array(R, np.float32), "T": np.array(T, np.int64), "X": x, "G": g}
    for k in range(n_states):
        feeds[f"S{k}"] = np.zeros(5, np.float32) if zero_states else \
            np.abs(rng.standard_normal(5)).astype(np.float32)
    return feeds


def _uphill(x, x_new, g):
    """True when the step moves X along the gradient (increases a loss whose gradient is g)."""
    return float(np.dot(x_new.astype(np.float64) - x, g)) > 0


@pytest.mark.parametrize("T, decay", [(-2, 1.0), (-1, 1.0), (-20, 0.1), (-3, 0.5)])
def test_adagrad_T_that_makes_the_rate_non_positive_is_refused(T, decay):
    model = _optimizer_model("Adagrad", 1, decay_factor=decay)
    feeds = _feeds(0.1, T, 1)
    if 1 + T * decay != 0:  # the reference steps uphill there (or divides by zero)
        x_new, _ = ReferenceEvaluator(model).run(None, feeds)
        assert _uphill(feeds["X"], x_new, feeds["G"])
    with pytest.raises(ValueError, match=rf"^node 'opt' \(Adagrad\): T: {T} with decay_factor "
                                         rf"{decay:g} makes 1 \+ T \* decay_factor = "):
        fo.run(model, feeds)
    with pytest.raises(ValueError, match=rf"^Adagrad: T: {T} with decay_factor {decay:g} "):
        fo.adagrad(feeds["R"], feeds["T"], feeds["X"], feeds["G"], feeds["S0"],
                   decay_factor=decay)


@pytest.mark.parametrize("T, decay", [(-1, 0.5), (-9, 0.1), (0, 1.0), (3, 0.25), (-7, 0.0)])
def test_adagrad_legal_T_matches_onnx_reference(T, decay):
    model = _optimizer_model("Adagrad", 1, decay_factor=decay)
    feeds = _feeds(0.1, T, 1, zero_states=False)
    ref = ReferenceEvaluator(model).run(None, feeds)
    got = fo.run(model, feeds)
    for a, b in zip(got.values(), ref):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # float64 oracle of the pseudo-code
    r = 0.1 / (1 + T * float(np.float32(decay)))
    h = feeds["S0"].astype(np.float64) + feeds["G"].astype(np.float64) ** 2
    x = feeds["X"] - float(np.float32(0.1)) / 0.1 * r * feeds["G"] / (np.sqrt(h) + 1e-6)
    np.testing.assert_allclose(got["X_new"], x, rtol=1e-5, atol=1e-6)
    assert not _uphill(feeds["X"], got["X_new"], feeds["G"])


@pytest.mark.parametrize("op, n_states, attrs", [
    ("Adam", 2, {}), ("Adagrad", 1, {}),
    ("Momentum", 1, dict(alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0))])
def test_negative_learning_rate_is_refused(op, n_states, attrs):
    model = _optimizer_model(op, n_states, **attrs)
    feeds = _feeds(-0.1, 1, n_states)
    x_new = ReferenceEvaluator(model).run(None, feeds)[0]
    assert _uphill(feeds["X"], x_new, feeds["G"])  # what the pseudo-code would do
    with pytest.raises(ValueError, match=rf"^node 'opt' \({op}\): R: expected a finite "
                                         rf"learning rate >= 0, got -0.1"):
        fo.run(model, feeds)


@pytest.mark.parametrize("mode, alpha, beta, name", [
    ("standard", 0.9, -1.0, "beta"), ("nesterov", -2.0, 1.0, "alpha")])
def test_momentum_coefficient_that_turns_the_gradient_around_is_refused(mode, alpha, beta,
                                                                        name):
    model = _optimizer_model("Momentum", 1, alpha=alpha, beta=beta, mode=mode,
                             norm_coefficient=0.0)
    feeds = _feeds(0.1, 1, 1)
    x_new = ReferenceEvaluator(model).run(None, feeds)[0]
    assert _uphill(feeds["X"], x_new, feeds["G"])
    with pytest.raises(ValueError, match=rf"^node 'opt' \(Momentum\): {name}: expected a "
                                         rf"coefficient >= 0"):
        fo.run(model, feeds)


@pytest.mark.parametrize("op, n_states, attrs", [
    ("Adam", 2, {}), ("Adagrad", 1, {}),
    ("Momentum", 1, dict(alpha=0.9, beta=1.0, mode="standard"))])
def test_negative_norm_coefficient_is_refused_as_weight_decay_is(op, n_states, attrs):
    """The L2 coefficient follows fastadam's weight_decay rule (>= 0 in every entry point),
    named by its ONNX attribute; a zero one still runs as the reference does."""
    model = _optimizer_model(op, n_states, norm_coefficient=-0.5, **attrs)
    feeds = _feeds(0.1, 1, n_states)
    with pytest.raises(ValueError, match=rf"^node 'opt' \({op}\): norm_coefficient: expected a "
                                         rf"coefficient >= 0, got -0.5"):
        fo.run(model, feeds)
    model = _optimizer_model(op, n_states, norm_coefficient=0.25, **attrs)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(fo.run(model, feeds)["X_new"], want, rtol=1e-5, atol=1e-6)


def test_no_legal_input_steps_uphill_from_zero_states():
    """Random legal hyper-parameters (R, T >= 0, decays and coefficients in their ranges), zero
    states: every operator moves X against the gradient, as onnx.reference does."""
    for trial in range(60):
        op = ("Adam", "Adagrad", "Momentum")[trial % 3]
        T = int(rng.integers(0, 50))
        if op == "Adam":
            attrs, n = dict(alpha=float(rng.uniform(0, 0.99)), beta=float(rng.uniform(0, 0.999))
                            ), 2
        elif op == "Adagrad":
            attrs, n = dict(decay_factor=float(rng.uniform(0, 2))), 1
        else:
            attrs, n = dict(alpha=float(rng.uniform(0, 1)), beta=float(rng.uniform(0, 1)),
                            mode=("standard", "nesterov")[trial % 2], norm_coefficient=0.0), 1
        model = _optimizer_model(op, n, **attrs)
        feeds = _feeds(float(rng.uniform(0, 1)), T, n)
        got = fo.run(model, feeds)["X_new"]
        ref = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        assert not _uphill(feeds["X"], got, feeds["G"]), (op, T, attrs)


def test_refused_step_leaves_the_session_as_it_was():
    """A training session whose step counter reads T = -2 with decay_factor 1: the step is
    refused, naming the optimizer node and T, and no initializer changes."""
    W = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W")])
    model = fo.make_training_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), loss="mse",
        optimizer="adagrad", lr=0.1, decay_factor=1.0)
    alg = model.training_info[0].algorithm
    t = next(t for t in alg.initializer if t.name.endswith("T"))
    t.CopyFrom(numpy_helper.from_array(np.array(-2, np.int64), t.name))
    session = fo.TrainingSession(model)
    before = {k: v.copy() for k, v in session.initializers.items()}
    feeds = {"X": np.eye(4, dtype=np.float32), "labels": np.zeros((4, 2), np.float32)}
    with pytest.raises(ValueError, match=r"\(Adagrad\): T: -2 with decay_factor 1 makes"):
        session.step(feeds)
    for k, v in session.initializers.items():
        np.testing.assert_array_equal(v, before[k])
