"""TrainingSession's generated step functions (``_codegen``) against the interpreted programs
(``Graph.run_program``), the reference here: the same model trained from the same weights on
the same batches gives bit-identical losses, outputs and initializers either way (MLP and CNN,
Adam in place and functional, Adagrad, Momentum, extra outputs).  The generated source is
printed and read back: one call per node, in the graph's order."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import fastadam.onnx as fo  # noqa: E402

from test_onnx_session import cnn_model, mlp_model, torch_forward  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y.astype(np.int64)


def _batches(X, y, n, seed=0):
    rng = np.random.default_rng(seed)
    for k in range(n):
        idx = rng.integers(0, len(X), 16 + 8 * (k % 3))  # the batch size changes too
        yield {"X": X[idx], "labels": y[idx]}


def _pair(model):
    generated, interpreted = fo.TrainingSession(model), fo.TrainingSession(model)
    interpreted._codegen = False
    return generated, interpreted


def _schedules(session):
    return [s for alg in session._algorithms for s in alg.schedules.values()]


def _train_both(model, digits, output_names=None, functional=False, steps=7):
    X, y = digits
    generated, interpreted = _pair(model)
    if functional:  # optimizer nodes return fresh outputs, then update_binding copies them
        for session in (generated, interpreted):
            for step in session._algorithms[0].plan.steps:
                step.inplace = False
    for feeds in _batches(X, y, steps):
        a = generated.step(feeds, output_names)
        b = interpreted.step(feeds, output_names)
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in a:  # an in-place update's output is the initializer's new value
            if name.startswith("fastadam.new.") and "." not in name[len("fastadam.new."):]:
                np.testing.assert_array_equal(
                    a[name], generated.initializers[name[len("fastadam.new."):]])
    after_g, after_i = generated.initializers, interpreted.initializers
    assert set(after_g) == set(after_i)
    for name in after_g:
        np.testing.assert_array_equal(after_g[name], after_i[name], err_msg=name)
    assert all(s.run is not None for s in _schedules(generated))
    assert all(s.run is None for s in _schedules(interpreted))
    return generated


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_generated_step_equals_interpreted_bit_for_bit(kind, digits):
    model, _ = mlp_model(16) if kind == "mlp" else cnn_model()
    session = _train_both(fo.make_training_model(model, lr=1e-2), digits)
    assert int(session.initializers["fastadam.T"]) == 7


@pytest.mark.parametrize("optimizer,attrs", [
    ("adagrad", dict(decay_factor=0.1)),
    ("momentum", dict(alpha=0.9, beta=1.0, mode="nesterov", norm_coefficient=0.01))])
def test_generated_step_other_optimizers(optimizer, attrs, digits):
    model, _ = mlp_model(16)
    _train_both(fo.make_training_model(model, lr=1e-2, optimizer=optimizer, **attrs), digits)


def test_generated_step_functional_optimizer_and_extra_outputs(digits):
    model, _ = cnn_model()
    trained = fo.make_training_model(model, lr=1e-2)
    # a parameter (aliases an initializer: copied), a gradient, the counter's new value (bound
    # by a copy) and an in-place update's new value
    names = ["fastadam.loss", "Wf", "fastadam.grad.Wc", "fastadam.T_next", "fastadam.new.bf"]
    _train_both(trained, digits, output_names=names)
    _train_both(trained, digits, output_names=names, functional=True)


def test_generated_source_is_readable(digits):
    X, y = digits
    model, _ = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    session.step({"X": X[:8], "labels": y[:8]})
    sched, = _schedules(session)
    source = sched.run._program_source
    print(source)
    steps = session._algorithms[0].plan.steps
    at = [source.index(f"k = {s.index}  # {s.label}") for s in steps]
    assert at == sorted(at)  # one call per node, in order
    assert "n6(t_fastadam_R.data, t_fastadam_T_next.data, [" in source  # Adam, in place
    assert "[t_b2.data, t_W2.data, t_b1.data, t_W1.data],  # X" in source
    assert "del t_h" in source  # intermediates dropped after their last use
    assert "env[" not in source.split("_load(env)")[1]  # locals only, after the load


def test_generated_step_runs_the_forward_pass_once(digits, monkeypatch):
    """The Gradient node differentiates the forward pass the step just ran: each Gemm runs once
    per step (a re-evaluation of the sub-graph would run it twice)."""
    import fastadam.autodiff as ad
    calls = []
    real = ad.gemm

    def counting_gemm(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(ad, "gemm", counting_gemm)  # before the runners bind it
    X, y = digits
    model, _ = mlp_model(16)
    for codegen in (True, False):
        session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
        session._codegen = codegen
        for k in range(3):
            session.step({"X": X[:16], "labels": y[:16]})
            assert len(calls) == 2 * (k + 1)
        calls.clear()


def test_generated_step_restores_the_grad_mode(digits):
    import fastadam.autodiff as ad
    X, y = digits
    model, _ = mlp_model(16)
    generated, interpreted = _pair(fo.make_training_model(model, lr=1e-2))
    feeds = {"X": X[:16], "labels": y[:16]}
    with ad.no_grad():
        a = generated.step(feeds)
        assert not ad.is_grad_enabled()
        b = interpreted.step(feeds)
        before = {k: v.copy() for k, v in generated.initializers.items()}
        bad = np.full(16, 99, np.int64)  # fails inside the loss node, with recording on
        with pytest.raises(IndexError, match=r"node 'fastadam.loss' \(SoftmaxCrossEntropyLoss\)"):
            generated.step({"X": X[:16], "labels": bad})
        assert not ad.is_grad_enabled()
        for name, v in generated.initializers.items():
            np.testing.assert_array_equal(v, before[name], err_msg=name)
    assert ad.is_grad_enabled()
    np.testing.assert_array_equal(a["fastadam.loss"], b["fastadam.loss"])
    for name, v in generated.initializers.items():
        np.testing.assert_array_equal(v, interpreted.initializers[name], err_msg=name)


def _model_with_gradient_of_an_intermediate():
    """The MLP behind ``Xs = Mul(X, scale)`` (``scale`` not trained, so ``Xs`` is computed
    from tensors nothing records), and a second Gradient node giving d loss / d Xs."""
    from onnx import TensorProto, helper, numpy_helper
    model, _ = mlp_model(16)
    graph = model.graph
    graph.node[0].input[0] = "Xs"
    graph.node.insert(0, helper.make_node("Mul", ["X", "scale"], ["Xs"]))
    graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "scale"))
    trained = fo.make_training_model(model, lr=1e-2, params=["W1", "b1", "W2", "b2"])
    alg = trained.training_info[0].algorithm
    zs = ["W1", "b1", "W2", "b2", "labels"]
    alg.node.append(helper.make_node("Gradient", ["Xs"] + zs, ["grad.Xs"], xs=["Xs"], zs=zs,
                                     y="fastadam.loss", domain=fo.TRAINING_DOMAIN))
    alg.output.append(helper.make_tensor_value_info("grad.Xs", TensorProto.FLOAT, ["N", 64]))
    return trained


def test_generated_step_gradient_of_an_intermediate(digits):
    trained = _model_with_gradient_of_an_intermediate()
    session = _train_both(trained, digits, output_names=["fastadam.loss", "grad.Xs"])
    assert "_leaf(t_Xs)" in _schedules(session)[0].run._program_source
    # the reference: PyTorch's d loss / d Xs at the weights before the step
    torch = pytest.importorskip("torch")
    X, y = digits
    weights = {k: torch.tensor(session.initializers[k].copy()) for k in ("W1", "b1", "W2", "b2")}
    xs = torch.tensor(0.5 * X[:4], requires_grad=True)
    loss = torch.nn.functional.cross_entropy(torch_forward(torch, "mlp", weights, xs),
                                             torch.from_numpy(y[:4]))
    loss.backward()
    out = session.step({"X": X[:4], "labels": y[:4]}, ["grad.Xs"])["grad.Xs"]
    np.testing.assert_allclose(out, xs.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.uint64])
def test_integer_scalar_arithmetic_equals_numpy(dtype):
    """0-d integer Add/Sub/Mul (a step counter's ``T + 1``) are computed on Python ints when the
    result fits: NumPy's values and dtype, wrap-around included, with large and small operands."""
    from onnx import helper
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    info = np.iinfo(dtype)
    nodes = [helper.make_node(op, ["a", "b"], [op]) for op in ("Add", "Sub", "Mul")]
    graph = helper.make_graph(nodes, "ints", [helper.make_tensor_value_info(n, elem, [])
                                              for n in "ab"],
                              [helper.make_tensor_value_info(op, elem, [])
                               for op in ("Add", "Sub", "Mul")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    values = [0, 1, 3, int(info.max), int(info.max) - 1, int(info.min), int(info.min) + 1]
    with np.errstate(over="ignore"):
        for a in values:
            for b in values:
                x, y = np.array(a, dtype), np.array(b, dtype)
                out = fo.run(model, {"a": x, "b": y})
                for op, ref in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)):
                    expected = np.asarray(ref(x, y))
                    assert out[op].dtype == expected.dtype and out[op].shape == ()
                    assert out[op] == expected, (op, a, b)
