"""make_training_model and initializers an exporter merged (issue 42): the rule that tells a
merge (several layers read one initializer as their parameter: untied, one copy per layer) from
a tie torch makes on purpose (a Gather reads it too, or anything else that is not a layer's
parameter input: kept), on small hand-written graphs.  The GPT exported by torch's two
exporters is in test_onnx_gpt.py."""
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

D = 4


def model(nodes, inits, output="y", inputs=("x",), extra_outputs=()):
    """An opset-18 model of ``nodes`` with float inputs ``inputs`` of shape (2, D), the
    initializers ``inits`` ({name: array}) and a float output ``output``."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2, D]) for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["a", "b"][:rank])
         for o, rank in [(output, 2)] + [(e, 1) for e in extra_outputs]],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def build(proto, **kw):
    """``(training model, trained names sorted, warning messages)`` for an MSE loss on
    ``y``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = fo.make_training_model(proto, loss="mse", **kw)
    gradient = next(n for n in trained.training_info[0].algorithm.node
                    if n.op_type == "Gradient")
    xs = [s.decode() for s in next(a for a in gradient.attribute if a.name == "xs").strings]
    return trained, sorted(xs), [str(w.message) for w in caught if w.category is UserWarning]


def two_layer_norms(via_identity=False):
    """``y = LN2(LN1(x))``, both LayerNorms reading the scale ``s`` and the bias ``b``
    (TorchScript's form: the second reads them through Identity nodes named as torch's
    parameters)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["h"], name="ln1")]
    if via_identity:
        nodes += [helper.make_node("Identity", ["s"], ["ln2.weight"]),
                  helper.make_node("Identity", ["b"], ["ln2.bias"])]
        nodes.append(helper.make_node("LayerNormalization", ["h", "ln2.weight", "ln2.bias"],
                                      ["y"], name="ln2"))
    else:
        nodes.append(helper.make_node("LayerNormalization", ["h", "s", "b"], ["y"], name="ln2"))
    return model(nodes, {"s": np.ones(D), "b": np.zeros(D)})


FEEDS = {"x": np.random.default_rng(0).standard_normal((2, D)).astype(np.float32),
         "labels": np.random.default_rng(1).standard_normal((2, D)).astype(np.float32)}


def oracle_two_layer_norms(s1, b1, s2, b2, x, labels, eps=1e-5):
    """The loss and the gradients of the four parameters, written from the formulas in float64
    (LayerNormalization over the last axis; MSE as a mean)."""
    def ln(v, s, b):
        mu = v.mean(-1, keepdims=True)
        r = 1 / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps)
        return (v - mu) * r * s + b, (v - mu) * r, r

    def ln_back(g, xhat, r, s):
        gx = g * s
        n = g.shape[-1]
        dv = r / n * (n * gx - gx.sum(-1, keepdims=True)
                      - xhat * (gx * xhat).sum(-1, keepdims=True))
        return dv, (g * xhat).sum(0), g.sum(0)
    x = x.astype(np.float64)
    h, xhat1, r1 = ln(x, s1, b1)
    y, xhat2, r2 = ln(h, s2, b2)
    gy = 2 * (y - labels) / y.size
    gh, gs2, gb2 = ln_back(gy, xhat2, r2, s2)
    _, gs1, gb1 = ln_back(gh, xhat1, r1, s1)
    return ((y - labels) ** 2).mean(), (gs1, gb1, gs2, gb2)


@pytest.mark.parametrize("via_identity", [False, True])
def test_layer_norms_that_read_one_initializer_train_a_copy_each(via_identity):
    trained, xs, messages = build(two_layer_norms(via_identity))
    second = ["ln2.weight", "ln2.bias"] if via_identity else \
        ["fastadam.untied.ln2.scale", "fastadam.untied.ln2.bias"]
    assert xs == sorted(["s", "b"] + second)
    assert len(messages) == 1
    assert "2 initializer(s) feed several layers" in messages[0]
    assert "'s' (2 uses: LayerNormalization scale of nodes 'ln1', 'ln2')" in messages[0]
    assert "tied_initializers='keep'" in messages[0]
    ln2 = next(n for n in trained.graph.node if n.name == "ln2")
    assert list(ln2.input[1:]) == second
    assert not any(n.op_type == "Identity" for n in trained.graph.node)
    session = fo.TrainingSession(trained)
    x = {"x": FEEDS["x"]}
    np.testing.assert_allclose(session.run(x)["y"], fo.run(two_layer_norms(via_identity), x)["y"])
    out = session.step(FEEDS, [f"fastadam.grad.{n}" for n in ("s", "b")] +
                       [f"fastadam.grad.{n}" for n in second])
    one, zero = np.ones(D), np.zeros(D)
    _, grads = oracle_two_layer_norms(one, zero, one, zero, FEEDS["x"], FEEDS["labels"])
    got = [out[f"fastadam.grad.{n}"] for n in ("s", "b", second[0], second[1])]
    for g, want in zip(got, grads):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)
    assert not np.allclose(session.initializers["s"], session.initializers[second[0]])


def test_the_untied_model_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    session = fo.TrainingSession(build(two_layer_norms(via_identity=True))[0])
    session.step(FEEDS)
    path = str(tmp_path / "untied.onnx")
    session.save(path)
    x = {"x": FEEDS["x"]}
    np.testing.assert_allclose(ort.InferenceSession(path).run(["y"], x)[0], session.run(x)["y"],
                               rtol=1e-5, atol=1e-6)


def test_keep_trains_the_shared_initializer_as_one_parameter():
    trained, xs, messages = build(two_layer_norms(), tied_initializers="keep")
    assert xs == ["b", "s"] and messages == []
    session = fo.TrainingSession(trained)
    out = session.step(FEEDS, ["fastadam.grad.s", "fastadam.grad.b"])
    one, zero = np.ones(D), np.zeros(D)
    _, (gs1, gb1, gs2, gb2) = oracle_two_layer_norms(one, zero, one, zero, FEEDS["x"],
                                                     FEEDS["labels"])
    np.testing.assert_allclose(out["fastadam.grad.s"], gs1 + gs2, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out["fastadam.grad.b"], gb1 + gb2, rtol=1e-4, atol=1e-6)


def test_explicit_params_are_untied_too():
    _, xs, messages = build(two_layer_norms(), params=["s"])
    assert xs == sorted(["s", "fastadam.untied.ln2.scale"]) and len(messages) == 1


def test_an_untrained_shared_initializer_is_left_alone():
    trained, xs, messages = build(two_layer_norms(), params=["b"])
    assert xs == ["b", "fastadam.untied.ln2.bias"]
    assert sum(t.name == "s" for t in trained.graph.initializer) == 1
    assert "'s'" not in messages[0]


def linear_pair(bias_reader="MatMul"):
    """Two linear layers ``x @ w + c`` reading one weight ``w`` and one bias ``c``; with
    ``bias_reader="input"`` the second Add adds ``c`` to a graph input instead."""
    second = "h" if bias_reader == "MatMul" else "z"
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "c"], ["h"], name="add1"),
             helper.make_node("MatMul", ["h", "w"], ["m2"], name="fc2"),
             helper.make_node("Add", ["c", "m2" if second == "h" else "z"], ["a2"], name="add2"),
             helper.make_node("Add", ["a2", "m2"], ["y"], name="sum")]
    rng = np.random.default_rng(2)
    return model(nodes, {"w": rng.standard_normal((D, D)), "c": np.zeros(D)},
                 inputs=("x", "z"))


def test_matmul_weights_and_added_biases_are_untied():
    _, xs, messages = build(linear_pair())
    assert xs == sorted(["w", "fastadam.untied.fc2.weight", "c", "fastadam.untied.add2.bias"])
    assert "MatMul weight" in messages[0] and "Add bias" in messages[0]


def test_a_bias_added_to_something_else_than_a_product_stays_tied():
    _, xs, messages = build(linear_pair(bias_reader="input"))
    assert xs == sorted(["w", "fastadam.untied.fc2.weight", "c"])
    assert "'c'" not in messages[0]


def tied_embedding(head="transpose", head_value=None):
    """A tied embedding and output head: ``Gather(E, ids)`` and ``h @ E.T`` (``Transpose``
    then ``MatMul``, ``Gemm(transB=1)``, or ``head="folded"``: ``MatMul`` of an initializer
    ``Et`` holding ``E.T``, as constant folding writes it; ``head_value`` replaces it)."""
    E = np.random.default_rng(3).standard_normal((5, D)).astype(np.float32)
    inits = [numpy_helper.from_array(E, "E")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"])]
    if head == "gemm":
        nodes.append(helper.make_node("Gemm", ["h", "E"], ["y"], transB=1))
    elif head == "transpose":
        nodes += [helper.make_node("Transpose", ["E"], ["Et"]),
                  helper.make_node("MatMul", ["h", "Et"], ["y"])]
    else:
        inits.append(numpy_helper.from_array(E.T.copy() if head_value is None else head_value,
                                             "Et"))
        nodes.append(helper.make_node("MatMul", ["h", "Et"], ["y"], name="head"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("head", ["transpose", "gemm", "folded"])
def test_a_tied_embedding_and_head_stay_one_tensor(head):
    """torch's own tie (GPT-2's): one tensor whose gradient sums both uses; a head that
    constant folding wrote as an initializer equal to ``E.T`` is tied back (with a warning)."""
    trained, xs, messages = build(tied_embedding(head))
    assert xs == ["E"]
    if head == "folded":
        assert len(messages) == 1
        assert "1 output head(s) equal an embedding's transpose" in messages[0]
        assert "'Et' = Transpose('E')" in messages[0]
        assert [n.op_type for n in trained.graph.node][0] == "Transpose"
        assert "Et" not in {t.name for t in trained.graph.initializer}
    else:
        assert messages == []
    ids = np.array([0, 3, 3], np.int64)
    labels = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    E = numpy_helper.to_array(trained.graph.initializer[0]).astype(np.float64)
    y = E[ids] @ E.T
    gy = 2 * (y - labels) / y.size
    want = gy.T @ E[ids]  # the head's use
    np.add.at(want, ids, gy @ E)  # the embedding's use
    out = fo.TrainingSession(trained).step({"ids": ids, "labels": labels}, ["fastadam.grad.E"])
    np.testing.assert_allclose(out["fastadam.grad.E"], want, rtol=1e-4, atol=1e-6)


def test_a_head_that_is_not_the_embeddings_transpose_trains_apart():
    E = numpy_helper.to_array(tied_embedding().graph.initializer[0])
    other = E.T.copy()
    other[0, 0] += 1
    _, xs, messages = build(tied_embedding("folded", other))
    assert xs == ["E", "Et"] and messages == []
    _, xs, messages = build(tied_embedding("folded"), tied_initializers="keep")
    assert xs == ["E", "Et"] and messages == []


def test_a_shared_initializer_that_another_op_reads_stays_tied():
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["h"], name="ln1"),
             helper.make_node("Mul", ["h", "s"], ["y"], name="scale")]
    _, xs, messages = build(model(nodes, {"s": np.ones(D), "b": np.zeros(D)}))
    assert xs == ["b", "s"] and messages == []


def test_a_shared_initializer_that_is_a_graph_output_stays_tied():
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["h"], name="ln1"),
             helper.make_node("LayerNormalization", ["h", "s", "b"], ["y"], name="ln2"),
             helper.make_node("Identity", ["s"], ["s_out"])]
    proto = model(nodes, {"s": np.ones(D), "b": np.zeros(D)}, extra_outputs=("s_out",))
    _, xs, messages = build(proto)
    assert xs == sorted(["s", "b", "fastadam.untied.ln2.bias"])
    assert "'s'" not in messages[0]


def test_tied_initializers_is_checked():
    with pytest.raises(ValueError, match="tied_initializers: expected 'restore' or 'keep', "
                                         "got 'tie'"):
        fo.make_training_model(two_layer_norms(), loss="mse", tied_initializers="tie")
