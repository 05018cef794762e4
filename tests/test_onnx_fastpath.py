"""TrainingSession's per-step fast path (compiled programs, the feed check on unchanged names /
dtypes / shapes, state Tensors kept between steps): after good steps it still notices every
change (a new batch size, a new dtype, a missing or unknown feed, bad label values, a binding
whose shape changed, initializers replaced by ``initialize()``, another algorithm's binding) and
raises the same errors with nothing written.  References: torch.optim.Adam for the training,
a fresh session for ``initialize()``, the counters' arithmetic for the bindings."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
HIDDEN = 8


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y.astype(np.int64)


def _weights():
    rng = np.random.default_rng(0)
    return dict(W1=(rng.standard_normal((HIDDEN, 64)) / 8).astype(np.float32),
                b1=np.zeros(HIDDEN, np.float32),
                W2=(rng.standard_normal((10, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32),
                b2=np.zeros(10, np.float32))


def _training_model(lr=1e-2):
    w = _weights()
    nodes = [helper.make_node("Gemm", ["X", "W1", "b1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", F, ["N", 64])],
                              [helper.make_tensor_value_info("logits", F, ["N", 10])],
                              [numpy_helper.from_array(a, n) for n, a in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return fo.make_training_model(model, lr=lr)


def _snapshot(session):
    return {k: v.copy() for k, v in session.initializers.items()}


def _assert_unchanged(session, before):
    now = session.initializers
    assert set(now) == set(before)
    for k, v in now.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def _good_steps(session, X, y, n=3, size=16):
    for k in range(n):
        session.step({"X": X[k * size:(k + 1) * size], "labels": y[k * size:(k + 1) * size]})


def test_batch_sizes_that_change_train_as_torch(digits):
    """Feeds whose batch size changes between steps (the fast path's cache misses, then hits
    again) give torch.optim.Adam's parameters (ONNX's eps placement, in torch's form)."""
    torch = pytest.importorskip("torch")
    X, y = digits
    session = fo.TrainingSession(_training_model(lr=1e-2))
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in _weights().items()}
    opt = torch.optim.Adam(p.values(), lr=1e-2, betas=(0.9, 0.999))
    start = 0
    for t, size in enumerate([16, 16, 7, 7, 16, 31, 16], start=1):
        xb, yb = X[start:start + size], y[start:start + size]
        start += size
        loss = session.step({"X": xb, "labels": yb})["fastadam.loss"]
        for group in opt.param_groups:
            group["eps"] = 1e-6 / np.sqrt(1 - 0.999 ** t)
        opt.zero_grad()
        x = torch.tensor(xb, dtype=torch.float64)
        logits = torch.nn.functional.linear(
            torch.relu(torch.nn.functional.linear(x, p["W1"], p["b1"])), p["W2"], p["b2"])
        ref = torch.nn.functional.cross_entropy(logits, torch.tensor(yb))
        ref.backward()
        opt.step()
        assert abs(float(loss) - ref.item()) <= 1e-4 * max(1.0, abs(ref.item()))
    for name, v in p.items():
        np.testing.assert_allclose(session.initializers[name], v.detach().numpy(), rtol=1e-4,
                                   atol=2e-5)
    assert int(session.initializers["fastadam.T"]) == 7


def test_new_dtype_after_good_steps_changes_nothing(digits):
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y)
    before = _snapshot(session)
    with pytest.raises(TypeError, match=r"feeds\['X'\]: expected dtype float32, got float64"):
        session.step({"X": X[:16].astype(np.float64), "labels": y[:16]})
    _assert_unchanged(session, before)


def test_new_shape_after_good_steps_changes_nothing(digits):
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y)
    before = _snapshot(session)
    with pytest.raises(ValueError, match=r"feeds\['X'\]: expected shape \(\?, 64\), "
                                         r"got \(16, 63\)"):
        session.step({"X": X[:16, :63], "labels": y[:16]})
    with pytest.raises(ValueError, match=r"node 'fastadam.loss' \(SoftmaxCrossEntropyLoss\): "
                                         r"labels: expected shape \(16,\), got \(15,\)"):
        session.step({"X": X[:16], "labels": y[:15]})
    _assert_unchanged(session, before)


def test_missing_and_unknown_feeds_after_good_steps(digits):
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y)
    before = _snapshot(session)
    with pytest.raises(ValueError, match=r"feeds: missing values for the inputs \['labels'\]"):
        session.step({"X": X[:16]})
    with pytest.raises(ValueError, match=r"feeds: \['Y'\] are inputs of no algorithm graph"):
        session.step({"X": X[:16], "labels": y[:16], "Y": X[:16]})
    with pytest.raises(TypeError, match=r"feeds: expected a dict of input name -> array, "
                                        r"got list"):
        session.step([X[:16], y[:16]])
    _assert_unchanged(session, before)


def test_non_array_feed_after_good_steps_is_checked(digits):
    """A list of the right shape and dtype is not an ndarray: it takes the full check."""
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y)
    before = _snapshot(session)
    with pytest.raises(TypeError, match=r"feeds\['labels'\]: expected dtype int64, got float64"):
        session.step({"X": X[:16], "labels": [float(v) for v in y[:16]]})
    _assert_unchanged(session, before)


def test_bad_label_values_after_good_steps_change_nothing(digits):
    """Same names, dtypes and shapes as the good steps (the fast path) but a label out of
    range: the loss node refuses it before any initializer changes."""
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y)
    before = _snapshot(session)
    bad = y[:16].copy()
    bad[3] = 10
    with pytest.raises(IndexError, match=r"node 'fastadam.loss' \(SoftmaxCrossEntropyLoss\): "
                                         r"labels: values must lie in \[0, 10\), got \[0, 10\]"):
        session.step({"X": X[:16], "labels": bad})
    _assert_unchanged(session, before)
    session.step({"X": X[:16], "labels": y[:16]})  # and it goes on from there
    assert int(session.initializers["fastadam.T"]) == 4


def test_initialize_after_steps_replaces_the_step_state(digits):
    """initialize() replaces the optimizer states and T: the next steps use the new arrays,
    exactly as a new session built from the model at that point does."""
    X, y = digits
    session = fo.TrainingSession(_training_model())
    _good_steps(session, X, y, n=4)
    session.initialize()
    fresh = fo.TrainingSession(session.model())
    assert int(fresh.initializers["fastadam.T"]) == 0
    for k in range(3):
        feeds = {"X": X[100 + 16 * k:116 + 16 * k], "labels": y[100 + 16 * k:116 + 16 * k]}
        a, b = session.step(feeds), fresh.step(feeds)
        np.testing.assert_array_equal(a["fastadam.loss"], b["fastadam.loss"])
    for name, v in session.initializers.items():
        np.testing.assert_array_equal(v, fresh.initializers[name], err_msg=name)
    assert int(session.initializers["fastadam.T"]) == 3


def _counter_model():
    """Two training_info entries.  The first: C <- C + 1 and S <- ReduceSum(X, axis 0)
    (declared X: (N, M), S: (4,)).  The second reads C (bound by the first) and outputs
    C * 10 and C itself through Identity."""
    c = numpy_helper.from_array(np.array(0, np.int64), "C")
    s = numpy_helper.from_array(np.zeros(4, np.float32), "S")
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "W")
    inference = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                                  [helper.make_tensor_value_info("X", F, ["N", "M"])],
                                  [helper.make_tensor_value_info("Y", F, ["N", 2])], [w, c, s])
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    first = helper.make_graph(
        [helper.make_node("Add", ["C", "one"], ["C_next"]),
         helper.make_node("ReduceSum", ["X", "axes"], ["S_new"], keepdims=0)],
        "first", [], [helper.make_tensor_value_info("C_next", I64, []),
                      helper.make_tensor_value_info("S_new", F, [None])], [one, axes])
    ten = numpy_helper.from_array(np.array(10, np.int64), "ten")
    second = helper.make_graph(
        [helper.make_node("Mul", ["C", "ten"], ["C10"]),
         helper.make_node("Identity", ["C"], ["C_seen"])],
        "second", [], [helper.make_tensor_value_info("C10", I64, []),
                       helper.make_tensor_value_info("C_seen", I64, [])], [ten])
    empty = helper.make_graph([], "init", [], [])
    infos = []
    for alg, bindings in ((first, {"C": "C_next", "S": "S_new"}), (second, {})):
        info = onnx.TrainingInfoProto()
        info.algorithm.CopyFrom(alg)
        info.initialization.CopyFrom(empty)
        for key, value in bindings.items():
            b = info.update_binding.add()
            b.key, b.value = key, value
        infos.append(info)
    model = helper.make_model(inference, opset_imports=[helper.make_opsetid("", 17)])
    model.training_info.extend(infos)
    return model


def test_a_binding_is_seen_by_the_next_algorithm():
    session = fo.TrainingSession(_counter_model())
    X = np.arange(12, dtype=np.float32).reshape(3, 4)
    for k in range(1, 5):
        out = session.step({"X": X}, output_names=["C10", "C_seen"])
        assert int(out["C10"]) == 10 * k  # the second algorithm reads the C the first bound
        assert int(out["C_seen"]) == k
        out["C_seen"][...] = -1  # an output is the caller's: the session's C stays
        assert int(session.initializers["C"]) == k
    np.testing.assert_array_equal(session.initializers["S"], X.sum(0))


def test_binding_shape_change_after_good_steps_changes_nothing():
    session = fo.TrainingSession(_counter_model())
    X = np.ones((3, 4), np.float32)
    for _ in range(3):
        session.step({"X": X})
    before = _snapshot(session)
    with pytest.raises(ValueError, match=r"update_binding: 'S_new' has dtype float32 and shape "
                                         r"\(5,\), but initializer 'S' has float32 and \(4,\)"):
        session.step({"X": np.ones((3, 5), np.float32)})
    _assert_unchanged(session, before)  # C was not incremented either
    session.step({"X": X})
    assert int(session.initializers["C"]) == 4
