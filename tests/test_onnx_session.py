"""TrainingSession and make_training_model: an MLP and a small CNN trained on scikit-learn's
digits equal the same training with torch.optim.Adam; the saved model runs in onnxruntime;
initialize / fit / model; in-place and functional updates agree; bad models and bindings."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam  # noqa: E402
import fastadam.onnx as fo  # noqa: E402

F = TensorProto.FLOAT
TRAIN = fo.TRAINING_DOMAIN


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y.astype(np.int64)


def _weights(seed, shapes):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * (1 / np.sqrt(np.prod(s[1:]) if len(s) > 1 else 1))
             ).astype(np.float32) if len(s) > 1 else np.zeros(s, np.float32) for s in shapes]


def mlp_model(hidden=32):
    W1, b1, W2, b2 = _weights(0, [(hidden, 64), (hidden,), (10, hidden), (10,)])
    nodes = [helper.make_node("Gemm", ["X", "W1", "b1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", F, ["N", 64])],
                              [helper.make_tensor_value_info("logits", F, ["N", 10])],
                              [numpy_helper.from_array(a, n) for a, n in
                               zip((W1, b1, W2, b2), ("W1", "b1", "W2", "b2"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        dict(W1=W1, b1=b1, W2=W2, b2=b2)


def cnn_model():
    Wc, bc, Wf, bf = _weights(1, [(4, 1, 3, 3), (4,), (10, 64), (10,)])
    bc = np.full(4, 0.01, np.float32)
    nodes = [helper.make_node("Reshape", ["X", "img"], ["x4"]),
             helper.make_node("Conv", ["x4", "Wc", "bc"], ["c"], pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "Wf", "bf"], ["logits"], transB=1)]
    inits = [numpy_helper.from_array(a, n) for a, n in
             zip((Wc, bc, Wf, bf), ("Wc", "bc", "Wf", "bf"))]
    inits.append(numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "img"))
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("X", F, ["N", 64])],
                              [helper.make_tensor_value_info("logits", F, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        dict(Wc=Wc, bc=bc, Wf=Wf, bf=bf)


def torch_forward(torch, kind, p, x):
    F_ = torch.nn.functional
    if kind == "mlp":
        return F_.linear(F_.relu(F_.linear(x, p["W1"], p["b1"])), p["W2"], p["b2"])
    h = F_.max_pool2d(F_.relu(F_.conv2d(x.reshape(-1, 1, 8, 8), p["Wc"], p["bc"], padding=1)), 2)
    return F_.linear(h.flatten(1), p["Wf"], p["bf"])


def _batches(X, y, n, size, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        idx = rng.integers(0, len(X), size)
        yield {"X": X[idx], "labels": y[idx]}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_training_equals_torch_adam_and_reloads_in_onnxruntime(kind, digits, tmp_path):
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    X, y = digits
    model, init = mlp_model() if kind == "mlp" else cnn_model()
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-6
    trained = fo.make_training_model(model, lr=lr, alpha=b1, beta=b2, epsilon=eps)
    session = fo.TrainingSession(trained)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    opt = torch.optim.Adam(params.values(), lr=lr, betas=(b1, b2), eps=eps)
    losses = []
    steps = 25
    for t, feeds in enumerate(_batches(X, y, steps, 64), 1):
        losses.append(float(session.step(feeds)["fastadam.loss"]))
        # ONNX Adam puts epsilon outside the bias correction ("tf"): in torch's form that is
        # eps / sqrt(1 - beta2**t)
        for group in opt.param_groups:
            group["eps"] = eps / np.sqrt(1 - b2 ** t)
        opt.zero_grad()
        out = torch_forward(torch, kind, params, torch.from_numpy(feeds["X"]))
        loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(feeds["labels"]))
        loss.backward()
        opt.step()
        assert abs(losses[-1] - loss.item()) <= 1e-4 * max(1.0, abs(loss.item()))
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    for name, p in params.items():
        np.testing.assert_allclose(session.initializers[name], p.detach().numpy(), rtol=1e-4,
                                   atol=2e-5)
    assert int(session.initializers["fastadam.T"]) == steps
    accuracy = float(np.mean(session.run({"X": X})["logits"].argmax(1) == y))
    path = tmp_path / "trained.onnx"
    session.save(path)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = ref.run(None, {"X": X})[0]
    assert float(np.mean(logits.argmax(1) == y)) == accuracy
    np.testing.assert_allclose(logits, session.run({"X": X})["logits"], rtol=1e-4, atol=1e-4)
    reloaded = onnx.load(str(path))
    assert len(reloaded.training_info) == 1  # training_info kept: training can resume


def test_inplace_and_functional_updates_agree(digits):
    X, y = digits
    model, _ = mlp_model(16)
    trained = fo.make_training_model(model, lr=1e-2)
    fast = fo.TrainingSession(trained)
    slow = fo.TrainingSession(trained)
    alg = slow._algorithms[0]
    assert any(s.inplace for s in alg.plan.steps)
    for s in alg.plan.steps:
        s.inplace = False  # the functional path: fresh outputs, then update_binding
    for feeds in _batches(X, y, 5, 32):
        a, b = fast.step(feeds), slow.step(feeds)
        np.testing.assert_array_equal(a["fastadam.loss"], b["fastadam.loss"])
    for name, v in fast.initializers.items():
        np.testing.assert_array_equal(v, slow.initializers[name])


def test_fit_initialize_and_model(digits):
    X, y = digits
    model, init = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    out = session.fit(list(_batches(X, y, 12, 32)), steps=10, progress=False)
    assert out["fastadam.loss"].shape == (10,)
    assert int(session.initializers["fastadam.T"]) == 10
    assert np.any(session.initializers["fastadam.V.W1"] != 0)
    trained_w = session.initializers["W1"].copy()
    m = session.model()
    by_name = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    np.testing.assert_array_equal(by_name["W1"], trained_w)
    alg_inits = {t.name: numpy_helper.to_array(t) for t in m.training_info[0].algorithm.initializer}
    assert int(alg_inits["fastadam.T"]) == 10
    session.initialize()  # resets the optimizer states and T (the initialization graph)
    assert int(session.initializers["fastadam.T"]) == 0
    assert not np.any(session.initializers["fastadam.V.W1"])
    np.testing.assert_array_equal(session.initializers["W1"], trained_w)  # weights are kept
    session.fit(_batches(X, y, 2, 32), progress=False)  # in-place updates after initialize()...
    session.initialize()  # ...did not write into the initialization graph's constants
    assert not np.any(session.initializers["fastadam.V.W1"])
    assert not np.any(session.initializers["fastadam.H.b2"])


@pytest.mark.skipif(not hasattr(fastadam, "momentum_step_inplace"),
                    reason="fastadam.momentum_step_inplace (issue 8) is not in this build yet")
@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum_training_equals_torch_sgd(mode, digits):
    torch = pytest.importorskip("torch")
    X, y = digits
    model, init = mlp_model(16)
    trained = fo.make_training_model(model, optimizer="momentum", lr=0.05, alpha=0.9, beta=1.0,
                                     mode=mode, norm_coefficient=1e-3)
    session = fo.TrainingSession(trained)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    opt = torch.optim.SGD(params.values(), lr=0.05, momentum=0.9, weight_decay=1e-3,
                          nesterov=(mode == "nesterov"))
    for feeds in _batches(X, y, 10, 32):
        session.step(feeds)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(torch_forward(torch, "mlp", params,
                                                        torch.from_numpy(feeds["X"])),
                                          torch.from_numpy(feeds["labels"])).backward()
        opt.step()
    for name, p in params.items():
        np.testing.assert_allclose(session.initializers[name], p.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.skipif(not hasattr(fastadam, "adagrad_step_inplace"),
                    reason="fastadam.adagrad_step_inplace (issue 8) is not in this build yet")
def test_adagrad_training_equals_torch(digits):
    torch = pytest.importorskip("torch")
    X, y = digits
    model, init = mlp_model(16)
    trained = fo.make_training_model(model, optimizer="adagrad", lr=0.05, decay_factor=0.01,
                                     epsilon=1e-10)
    session = fo.TrainingSession(trained)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    opt = torch.optim.Adagrad(params.values(), lr=0.05, lr_decay=0.01, eps=1e-10)
    for feeds in _batches(X, y, 10, 32):
        session.step(feeds)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(torch_forward(torch, "mlp", params,
                                                        torch.from_numpy(feeds["X"])),
                                          torch.from_numpy(feeds["labels"])).backward()
        opt.step()
    for name, p in params.items():
        np.testing.assert_allclose(session.initializers[name], p.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


# --- bad input ---------------------------------------------------------------------------------

def _trained():
    model, _ = mlp_model(8)
    return fo.make_training_model(model, lr=1e-2)


def test_step_missing_feed_changes_nothing(digits):
    session = fo.TrainingSession(_trained())
    before = {k: v.copy() for k, v in session.initializers.items()}
    with pytest.raises(ValueError, match=r"feeds: missing values for the inputs \['labels'\]"):
        session.step({"X": digits[0][:4]})
    for k, v in session.initializers.items():
        np.testing.assert_array_equal(v, before[k])


def test_step_shape_mismatch_changes_nothing(digits):
    session = fo.TrainingSession(_trained())
    before = {k: v.copy() for k, v in session.initializers.items()}
    with pytest.raises(ValueError, match=r"feeds\['X'\]: expected shape \(\?, 64\), got \(4, 63\)"):
        session.step({"X": digits[0][:4, :63], "labels": digits[1][:4]})
    with pytest.raises(ValueError, match=r"node 'fastadam.loss' \(SoftmaxCrossEntropyLoss\): "
                                         r"labels: expected shape \(4,\), got \(3,\)"):
        session.step({"X": digits[0][:4], "labels": digits[1][:3]})
    for k, v in session.initializers.items():
        np.testing.assert_array_equal(v, before[k])


def test_step_wrong_dtype(digits):
    session = fo.TrainingSession(_trained())
    with pytest.raises(TypeError, match=r"feeds\['X'\]: expected dtype float32, got float64"):
        session.step({"X": digits[0][:4].astype(np.float64), "labels": digits[1][:4]})


def test_unknown_feed():
    session = fo.TrainingSession(_trained())
    with pytest.raises(ValueError, match=r"feeds: \['Y'\] are inputs of no algorithm graph"):
        session.step({"Y": np.zeros(3)})


def test_update_binding_naming_no_initializer():
    m = _trained()
    m.training_info[0].update_binding[0].key = "not_there"
    with pytest.raises(ValueError, match=r"training_info\[0\].update_binding: key 'not_there' "
                                         r"names no initializer"):
        fo.TrainingSession(m)


def test_update_binding_value_not_an_output():
    m = _trained()
    m.training_info[0].update_binding[0].value = "nowhere"
    with pytest.raises(ValueError, match=r"value 'nowhere' \(bound to '\w+'\) is not an output"):
        fo.TrainingSession(m)


def test_initialization_binding_naming_no_initializer():
    m = _trained()
    m.training_info[0].initialization_binding[0].key = "ghost"
    with pytest.raises(ValueError, match=r"initialization_binding: key 'ghost' names no "
                                         r"initializer"):
        fo.TrainingSession(m)


def test_model_failing_the_checker():
    m = _trained()
    m.graph.node[0].input[1] = ""  # Gemm without its B input
    with pytest.raises(ValueError, match="model: onnx.checker rejects it"):
        fo.TrainingSession(m)


def test_not_a_model():
    with pytest.raises(TypeError, match="model: expected an onnx.ModelProto or a path, got dict"):
        fo.TrainingSession({})


def _single(op, domain="", opset=17, **attrs):
    node = helper.make_node(op, ["x"], ["y"], domain=domain, name="n1", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info("y", F, [3])])
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(graph, opset_imports=ops)
    m.ir_version = 8
    return m


def test_unknown_operator():
    with pytest.raises(fo.UnsupportedOperatorError, match=r"node 'n1' \(Elu\): operator Elu of "
                                                          r"domain ai.onnx opset 17 is not "
                                                          r"supported"):
        fo.run(_single("Elu"), {"x": np.ones(3, np.float32)})


def test_unknown_domain():
    with pytest.raises(fo.UnsupportedOperatorError, match=r"node 'n1' \(Foo\): domain "
                                                          r"'com.example'"):
        fo.run(_single("Foo", domain="com.example"), {"x": np.ones(3, np.float32)})


def test_unknown_training_operator():
    with pytest.raises(fo.UnsupportedOperatorError, match=r"node 'n1' \(Rmsprop\): operator "
                                                          r"Rmsprop of domain "
                                                          r"ai.onnx.preview.training"):
        fo.run(_single("Rmsprop", domain=TRAIN), {"x": np.ones(3, np.float32)})


def test_opset_too_old():
    m = _single("Relu", opset=6)
    m.ir_version = 3
    with pytest.raises(fo.UnsupportedOperatorError, match="ai.onnx opset 6 is not supported"):
        fo.run(m, {"x": np.ones(3, np.float32)})


def test_operator_form_not_supported():
    with pytest.raises(fo.UnsupportedOperatorError, match=r"node 'n1' \(MaxPool\): only 1-D and "
                                                          r"2-D .* inputs are supported"):
        fo.run(_single("MaxPool", kernel_shape=[1]), {"x": np.ones(3, np.float32)})


def test_adam_node_input_count():
    node = helper.make_node("Adam", ["R", "T", "x", "g", "v"], ["x2"], domain=TRAIN, name="opt")
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("R", F, []),
        helper.make_tensor_value_info("T", TensorProto.INT64, [])] + [
        helper.make_tensor_value_info(n, F, [3]) for n in "xgv"],
        [helper.make_tensor_value_info("x2", F, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(TRAIN, 1)])
    with pytest.raises(ValueError, match=r"node 'opt' \(Adam\): expected R, T and then a "
                                         r"positive multiple of 4 inputs"):
        fo.run(m, {})


def test_run_missing_input():
    with pytest.raises(ValueError, match=r"feeds: missing values for the inputs \['x'\]"):
        fo.run(_single("Relu"), {})


def test_run_unknown_output_name():
    with pytest.raises(ValueError, match="output_names: 'zz' is not a tensor of the graph"):
        fo.run(_single("Relu"), {"x": np.ones(3, np.float32)}, ["zz"])


def test_broadcast_mismatch_names_the_node():
    node = helper.make_node("Add", ["x", "z"], ["y"], name="plus")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, ["a"]),
                                            helper.make_tensor_value_info("z", F, ["b"])],
                              [helper.make_tensor_value_info("y", F, ["a"])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"node 'plus' \(Add\): operands could not be broadcast"):
        fo.run(m, {"x": np.ones(3, np.float32), "z": np.ones(4, np.float32)})


def test_builder_bad_optimizer():
    model, _ = mlp_model(8)
    with pytest.raises(ValueError, match="optimizer: expected 'adam', 'adagrad' or 'momentum'"):
        fo.make_training_model(model, optimizer="lamb")


def test_builder_param_not_an_initializer():
    model, _ = mlp_model(8)
    with pytest.raises(ValueError, match="params: 'W9' is not an initializer"):
        fo.make_training_model(model, params=["W9"])


def test_fit_progress_line_without_tqdm(digits, capsys, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    X, y = digits
    model, _ = mlp_model(8)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    out = session.fit(_batches(X, y, 3, 16), progress=True)
    assert out["fastadam.loss"].shape == (3,)
    err = capsys.readouterr().err
    assert "fit: step 3" in err
    # each line shows the loss of the step it counts (it once showed the previous step's)
    losses = out["fastadam.loss"]
    assert f"fit: step 1 fastadam.loss={losses[0]:.4g}" in err
    assert f"fit: step 3 fastadam.loss={losses[2]:.4g}" in err


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_model_exported_by_torch_trains(digits):
    """torch.onnx.export (TorchScript exporter) -> run equals torch -> make_training_model."""
    import io
    torch = pytest.importorskip("torch")
    X, y = digits
    torch.manual_seed(0)

    class Images(torch.nn.Module):
        def forward(self, x):
            return x.reshape(-1, 1, 8, 8)

    net = torch.nn.Sequential(Images(), torch.nn.Conv2d(1, 4, 3, padding=1),
                              torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.from_numpy(X[:4]),), buf, dynamo=False, input_names=["X"],
                      output_names=["logits"], dynamic_axes={"X": {0: "N"}}, opset_version=17)
    model = onnx.load_from_string(buf.getvalue())
    with torch.no_grad():
        ref = net(torch.from_numpy(X[:50])).numpy()
    np.testing.assert_allclose(fo.run(model, {"X": X[:50]})["logits"], ref, rtol=1e-4, atol=1e-5)
    session = fo.TrainingSession(fo.make_training_model(model, lr=3e-2))
    losses = session.fit(_batches(X, y, 30, 64), progress=False)["fastadam.loss"]
    assert losses[-5:].mean() < 0.75 * losses[:5].mean()
