"""TrainingSession's compiled step (``_graph.Program``, run by ``_session._run_schedule``)
against a plain node-by-node interpreter written here, the reference: the same model trained
from the same weights on the same batches gives bit-identical losses, outputs and initializers
(MLP and CNN, Adam in place and functional, Adagrad, Momentum, extra outputs, a Gradient of an
intermediate).  The reference keeps every tensor in a dict, runs every node in the graph's
order, differentiates with ``fastadam.autodiff.gradient`` and applies the optimizer nodes'
functional form (fresh outputs) and then ``update_binding``: none of the program's slots, drops,
in-place updates or forward-reuse decisions."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import fastadam.autodiff as ad  # noqa: E402
import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx._graph import Graph  # noqa: E402
from fastadam.onnx._model import graph_known_names, initializer_arrays, opsets  # noqa: E402

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


class ReferenceTrainer:
    """The training model's one algorithm, interpreted node by node on a dict of Tensors."""

    def __init__(self, model):
        graph, info = model.graph, model.training_info[0]
        self.state = {**initializer_arrays(graph), **initializer_arrays(info.algorithm)}
        self.state = {k: np.array(v) for k, v in self.state.items()}
        self.graph = Graph(list(graph.node) + list(info.algorithm.node), opsets(model),
                           graph_known_names(graph, info.algorithm))
        self.bindings = [(e.key, e.value) for e in info.update_binding]

    def step(self, feeds, output_names):
        grad_names = self.graph.grad_names
        env = {}

        def put(name, t):
            if name in grad_names and t.data.dtype.kind == "f":
                t = ad.Tensor(t.data, requires_grad=True)
            env[name] = t
        for name, a in self.state.items():
            put(name, ad.Tensor(a.copy()))
        for name, a in feeds.items():
            put(name, ad.Tensor(np.asarray(a)))
        previous = ad.set_grad_enabled(True)
        try:
            for step in self.graph.steps:
                inputs = [env[n] if n else None for n in step.inputs]
                if step.kind == "gradient":
                    y, xs = env[step.y], [env[n] for n in step.xs]
                    seed = None if y.data.size == 1 else np.ones_like(y.data)
                    grads = ad.gradient(y, xs, grad_output=seed, retain_graph=True,
                                        allow_unused=True)
                    outs = [ad.Tensor(np.zeros_like(x.data)) if g is None else g
                            for x, g in zip(xs, grads)]
                else:  # core operators, and the optimizers' functional form
                    outs = step.run(inputs)
                for name, t in zip(step.outputs, outs):
                    if name:
                        put(name, t)
        finally:
            ad.set_grad_enabled(previous)
        out = {n: np.array(env[n].data) for n in output_names}
        for key, value in self.bindings:
            self.state[key] = np.array(env[value].data)
        return out


def _train_both(model, digits, output_names=None, functional=False, steps=7):
    X, y = digits
    session, reference = fo.TrainingSession(model), ReferenceTrainer(model)
    if functional:  # optimizer nodes return fresh outputs, then update_binding copies them
        for step in session._algorithms[0].plan.steps:
            step.inplace = False
    names = session.default_outputs() if output_names is None else output_names
    for feeds in _batches(X, y, steps):
        a = session.step(feeds, output_names)
        b = reference.step(feeds, names)
        assert list(a) == list(names)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in a:  # an in-place update's output is the initializer's new value
            if name.startswith("fastadam.new.") and "." not in name[len("fastadam.new."):]:
                np.testing.assert_array_equal(
                    a[name], session.initializers[name[len("fastadam.new."):]])
    after = session.initializers
    assert set(after) == set(reference.state)
    for name in after:
        np.testing.assert_array_equal(after[name], reference.state[name], err_msg=name)
    return session


def _schedules(session):
    return [s for alg in session._algorithms for s in alg.schedules.values()]


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_compiled_step_equals_reference_bit_for_bit(kind, digits):
    model, _ = mlp_model(16) if kind == "mlp" else cnn_model()
    session = _train_both(fo.make_training_model(model, lr=1e-2), digits)
    assert int(session.initializers["fastadam.T"]) == 7


@pytest.mark.parametrize("optimizer,attrs", [
    ("adagrad", dict(decay_factor=0.1)),
    ("momentum", dict(alpha=0.9, beta=1.0, mode="nesterov", norm_coefficient=0.01))])
def test_compiled_step_other_optimizers(optimizer, attrs, digits):
    model, _ = mlp_model(16)
    _train_both(fo.make_training_model(model, lr=1e-2, optimizer=optimizer, **attrs), digits)


def test_compiled_step_functional_optimizer_and_extra_outputs(digits):
    model, _ = cnn_model()
    trained = fo.make_training_model(model, lr=1e-2)
    # a parameter (aliases an initializer: copied), a gradient, the counter's new value (bound
    # by a copy) and an in-place update's new value
    names = ["fastadam.loss", "Wf", "fastadam.grad.Wc", "fastadam.T_next", "fastadam.new.bf"]
    _train_both(trained, digits, output_names=names)
    _train_both(trained, digits, output_names=names, functional=True)


def test_program_reads_one_line_per_node(digits):
    """``Program.describe()``: one line per node, in the graph's order, the in-place update
    last, intermediates dropped after their last use."""
    X, y = digits
    model, _ = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    # (the logits asked for: kept, so the chain is not fused and each node has its line)
    session.step({"X": X[:8], "labels": y[:8]}, ["fastadam.loss", "logits"])
    sched, = _schedules(session)
    text = sched.program.describe()
    print(text)
    lines = text.splitlines()
    steps = session._algorithms[0].plan.steps
    assert [line.split(":")[0] for line in lines] == [s.label for s in steps]
    assert lines[-1].startswith("node 'fastadam.adam' (Adam): fastadam.R@")
    # the new values are the updated inputs, which nothing reads after: not kept
    # (nor are the gradients dropped after it: the step's slots go right after)
    assert lines[-1].endswith(" -> " + ", ".join(["(discarded)"] * 12) + "  (in place)")
    assert [len(sched.first), len(sched.last)] == [len(steps) - 1, 1]
    relu = next(line for line in lines if "(Relu)" in line)
    assert relu.endswith("; drop h")  # the Gemm's output, read by the Relu only
    gemm2 = lines[lines.index(relu) + 1]
    assert gemm2.endswith("; drop r")


def test_fused_mlp_step_reads_as_one_line(digits):
    """With the default outputs, the Gemm/Relu chain, the loss and the Gradient node are one
    operation (``_fusion``): one line naming them all, then the counter and the update."""
    X, y = digits
    model, _ = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    session.step({"X": X[:8], "labels": y[:8]})
    sched, = _schedules(session)
    lines = sched.program.describe().splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "node 'fastadam.gradient' (Gradient) (fused with node #0 (Gemm), node #1 (Relu), "
        "node #2 (Gemm), node 'fastadam.loss' (SoftmaxCrossEntropyLoss)): X@2, labels@3, W1@4, "
        "b1@5, W2@6, b2@7 -> fastadam.loss@19, fastadam.grad.b2@23, fastadam.grad.W2@21, "
        "fastadam.grad.b1@22, fastadam.grad.W1@20")
    assert lines[2].startswith("node 'fastadam.adam' (Adam)")


def test_missing_input_names_the_node_that_reads_it():
    from fastadam.onnx._graph import Program
    model, _ = mlp_model(16)
    g = model.graph
    plan = Graph(g.node, opsets(model), graph_known_names(g))
    program = Program(plan, plan.needed([o.name for o in g.output]))
    env = {n: ad.Tensor(a) for n, a in initializer_arrays(g).items()}
    with pytest.raises(ValueError, match=r"node .*\(Gemm\): input 'X' has no value"):
        program.load(env)


@pytest.mark.parametrize("fused", [False, True])
def test_compiled_step_runs_the_forward_pass_once(fused, digits, monkeypatch):
    """The Gradient node differentiates the forward pass the step just ran: each Gemm runs once
    per step (a re-evaluation of the sub-graph would run it twice).  With the logits kept
    (asked for) the nodes run as they are; otherwise the chain, the loss and the Gradient
    node run as one ``mlp_loss_and_gradients`` call per step (``_fusion``) and no Gemm."""
    import fastadam.autodiff as ad
    calls = {"gemm": 0, "mlp": 0}

    def counting(name, real):
        def fun(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return fun
    monkeypatch.setattr(ad, "gemm", counting("gemm", ad.gemm))  # before the runners bind it
    monkeypatch.setattr(ad, "mlp_loss_and_gradients",
                        counting("mlp", ad.mlp_loss_and_gradients))
    X, y = digits
    model, _ = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    outputs = None if fused else ["fastadam.loss", "logits"]
    for k in range(3):
        session.step({"X": X[:16], "labels": y[:16]}, outputs)
        assert calls == ({"gemm": 0, "mlp": k + 1} if fused else {"gemm": 2 * (k + 1), "mlp": 0})


def test_compiled_step_restores_the_grad_mode(digits):
    X, y = digits
    model, _ = mlp_model(16)
    trained = fo.make_training_model(model, lr=1e-2)
    session, reference = fo.TrainingSession(trained), ReferenceTrainer(trained)
    feeds = {"X": X[:16], "labels": y[:16]}
    with ad.no_grad():
        a = session.step(feeds)
        assert not ad.is_grad_enabled()
        b = reference.step(feeds, ["fastadam.loss"])
        before = {k: v.copy() for k, v in session.initializers.items()}
        bad = np.full(16, 99, np.int64)  # fails inside the loss node, with recording on
        with pytest.raises(IndexError, match=r"node 'fastadam.loss' \(SoftmaxCrossEntropyLoss\)"):
            session.step({"X": X[:16], "labels": bad})
        assert not ad.is_grad_enabled()
        for name, v in session.initializers.items():
            np.testing.assert_array_equal(v, before[name], err_msg=name)
    assert ad.is_grad_enabled()
    np.testing.assert_array_equal(a["fastadam.loss"], b["fastadam.loss"])
    for name, v in session.initializers.items():
        np.testing.assert_array_equal(v, reference.state[name], err_msg=name)


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


def test_compiled_step_gradient_of_an_intermediate(digits):
    trained = _model_with_gradient_of_an_intermediate()
    session = _train_both(trained, digits, output_names=["fastadam.loss", "grad.Xs"])
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
