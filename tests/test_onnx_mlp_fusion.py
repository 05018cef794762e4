"""An MLP's training step without a tape (issue 42): ``fastadam.autodiff.mlp_loss_and_gradients``
against the recorded ops (``gemm(h, w, b, trans_b=True)``, ``relu``, ``softmax_cross_entropy``
and ``gradient``: the same bits) and against a float64 oracle written here from the formulas;
one test per error; and the ONNX session's fused step (``_fusion``) against the same session
with the fusion ruled out (the logits asked for), bit for bit, the fallback when the operands do
not fit, and the loss node's and Gemm nodes' errors with nothing written."""
import numpy as np
import pytest

import fastadam.autodiff as ad

LAYOUTS = {  # (layer widths, relu after each hidden layer)
    "one layer": ((5, 3), ()),
    "two layers": ((7, 6, 4), (True,)),
    "three, linear middle": ((9, 8, 5, 3), (True, False)),
}


def _operands(widths, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, widths[0])).astype(dtype)
    ws = [(rng.standard_normal((o, i)) / np.sqrt(i)).astype(dtype)
          for i, o in zip(widths[:-1], widths[1:])]
    bs = [rng.standard_normal(o).astype(dtype) * 0.1 for o in widths[1:]]
    labels = rng.integers(0, widths[-1], n)
    return x, ws, bs, labels


def _taped(x, ws, bs, labels, relu):
    params = [ad.Tensor(a, requires_grad=True) for pair in zip(ws, bs) for a in pair]
    h = ad.Tensor(x)
    for k in range(len(ws)):
        h = ad.gemm(h, params[2 * k], params[2 * k + 1], trans_b=True)
        if k < len(ws) - 1 and relu[k]:
            h = ad.relu(h)
    loss = ad.softmax_cross_entropy(h, labels)
    return loss.data, [g.data for g in ad.gradient(loss, params)]


def _oracle(x, ws, bs, labels, relu):
    """float64, from the formulas: forward, then the chain rule by hand."""
    x, ws, bs = x.astype(np.float64), [w.astype(np.float64) for w in ws], \
        [b.astype(np.float64) for b in bs]
    hs, zs = [x], []
    for k, (w, b) in enumerate(zip(ws, bs)):
        z = hs[-1] @ w.T + b
        zs.append(z)
        hs.append(np.maximum(z, 0) if k < len(ws) - 1 and relu[k] else z)
    logits = hs[-1]
    m = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - m)
    p /= p.sum(axis=1, keepdims=True)
    n = len(x)
    loss = -np.mean(np.log(p[np.arange(n), labels]))
    g = p.copy()
    g[np.arange(n), labels] -= 1
    g /= n
    grads = [None] * (2 * len(ws))
    for k in range(len(ws) - 1, -1, -1):
        grads[2 * k], grads[2 * k + 1] = g.T @ hs[k], g.sum(axis=0)
        g = g @ ws[k]
        if k > 0 and relu[k - 1]:
            g = g * (zs[k - 1] > 0)
    return loss, grads


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 8, 33])
def test_equals_the_tape_bit_for_bit_and_the_oracle(layout, dtype, n):
    widths, relu = LAYOUTS[layout]
    x, ws, bs, labels = _operands(widths, n, dtype)
    loss, grads = ad.mlp_loss_and_gradients(x, ws, bs, labels, relu)
    assert all(isinstance(t, ad.Tensor) and t._node is None and not t.requires_grad
               for t in [loss, *grads])  # as gradient() returns them: nothing recorded
    loss, grads = loss.data, [g.data for g in grads]
    want_loss, want = _taped(x, ws, bs, labels, relu)
    assert loss.dtype == dtype and loss.shape == ()
    np.testing.assert_array_equal(loss, want_loss)
    assert len(grads) == len(want)
    for got, same in zip(grads, want):
        assert got.dtype == dtype and got.shape == same.shape
        np.testing.assert_array_equal(got, same)
    oracle_loss, oracle = _oracle(x, ws, bs, labels, relu)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(loss, oracle_loss, **tol)
    for got, ref in zip(grads, oracle):
        np.testing.assert_allclose(got, ref, **tol)


def test_need_computes_only_what_is_asked_with_the_same_bits():
    widths, relu = LAYOUTS["three, linear middle"]
    x, ws, bs, labels = _operands(widths, 16, np.float32)
    _, full = ad.mlp_loss_and_gradients(x, ws, bs, labels, relu)
    for need in [(False, False, True, False, False, True), (True,) + (False,) * 5,
                 (False,) * 6]:
        _, grads = ad.mlp_loss_and_gradients(x, ws, bs, labels, relu, need)
        for wanted, got, same in zip(need, grads, full):
            if wanted:
                np.testing.assert_array_equal(got.data, same.data)
            else:
                assert got is None


def test_inputs_are_not_changed():
    widths, relu = LAYOUTS["two layers"]
    operands = _operands(widths, 8, np.float32)
    x, ws, bs, labels = operands
    before = [x.copy(), [w.copy() for w in ws], [b.copy() for b in bs], labels.copy()]
    for a in [x, labels, *ws, *bs]:
        a.flags.writeable = False  # read-only operands are taken
    ad.mlp_loss_and_gradients(x, ws, bs, labels, relu)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(labels, before[3])
    for a, b in zip(ws + bs, before[1] + before[2]):
        np.testing.assert_array_equal(a, b)


def _bad(case):
    x, ws, bs, labels = _operands((4, 3, 2), 5, np.float32)
    relu, need = (True,), None
    if case == "x dtype":
        x = x.astype(np.int32)
    elif case == "x shape":
        x = x[0]
    elif case == "count":
        bs = bs[:1]
    elif case == "weight dtype":
        ws[1] = ws[1].astype(np.float64)
    elif case == "weight shape":
        ws[1] = ws[1][:, :2]
    elif case == "bias shape":
        bs[0] = bs[0][:1]
    elif case == "labels dtype":
        labels = labels.astype(np.float32)
    elif case == "labels shape":
        labels = labels[:4]
    elif case == "relu":
        relu = ()
    elif case == "need":
        need = (True,)
    elif case == "label range":
        labels[2] = 2
    return x, ws, bs, labels, relu, need


@pytest.mark.parametrize("case,error,match", [
    ("x dtype", TypeError, r"^x: expected a floating-point array, got int32"),
    ("x shape", ValueError, r"^x: expected shape \(N, D\), got \(4,\)"),
    ("count", ValueError, r"^weights, biases: expected one bias per weight"),
    ("weight dtype", TypeError, r"^weights\[1\]: expected dtype float32 \(the dtype of x\)"),
    ("weight shape", ValueError, r"^weights\[1\]: expected shape \(out, 3\), got \(2, 2\)"),
    ("bias shape", ValueError, r"^biases\[0\]: expected shape \(3,\), got \(1,\)"),
    ("labels dtype", TypeError, r"^labels: expected an integer array, got float32"),
    ("labels shape", ValueError, r"^labels: expected shape \(5,\), got \(4,\)"),
    ("relu", ValueError, r"^relu: expected 1 flags"),
    ("need", ValueError, r"^need: expected 4 flags"),
    ("label range", IndexError, r"^labels: values must lie in \[0, 2\)"),
])
def test_errors_name_the_argument(case, error, match):
    x, ws, bs, labels, relu, need = _bad(case)
    assert ad.mlp_fuses(x, ws, bs, labels) == (case in ("relu", "need", "label range"))
    with pytest.raises(error, match=match):
        ad.mlp_loss_and_gradients(x, ws, bs, labels, relu, need)


# ---- the ONNX session's fused step ----------------------------------------------------------

onnx = pytest.importorskip("onnx")
import fastadam.onnx as fo  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402


def _model(widths=(64, 16, 10), relu=(True,), dtype=np.float32, bias_shapes=None):
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "X"
    for k, (i, o) in enumerate(zip(widths[:-1], widths[1:])):
        w = (rng.standard_normal((o, i)) / np.sqrt(i)).astype(dtype)
        b = np.full(o if bias_shapes is None else bias_shapes[k], 0.01, dtype)
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(b, f"b{k}")]
        out = "logits" if k == len(widths) - 2 else f"z{k}"
        nodes.append(helper.make_node("Gemm", [h, f"W{k}", f"b{k}"], [out], transB=1))
        h = out
        if k < len(widths) - 2 and relu[k]:
            nodes.append(helper.make_node("Relu", [out], [f"h{k}"]))
            h = f"h{k}"
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", elem,
                                                                           ["N", widths[0]])],
                              [helper.make_tensor_value_info("logits", elem, ["N", widths[-1]])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return fo.make_training_model(model, lr=1e-2)


def _batches(widths, dtype, steps=5):
    rng = np.random.default_rng(1)
    for k in range(steps):
        n = 8 + 3 * k
        yield {"X": rng.standard_normal((n, widths[0])).astype(dtype),
               "labels": rng.integers(0, widths[-1], n)}


def _fused_ops(session):
    sched, = session._algorithms[0].schedules.values()
    return [step.label for step, _ in sched.program.ops if "fused with" in step.label]


@pytest.mark.parametrize("widths,relu,dtype,bias_shapes", [
    ((64, 16, 10), (True,), np.float32, None),
    ((12, 9, 7, 5), (True, False), np.float64, None),
    ((12, 9, 5), (True,), np.float32, [(1,), (5,)]),  # a bias to broadcast: the nodes run
])
def test_session_step_equals_the_unfused_step_bit_for_bit(widths, relu, dtype, bias_shapes):
    model = _model(widths, relu, dtype, bias_shapes)
    fused, plain = fo.TrainingSession(model), fo.TrainingSession(model)
    for feeds in _batches(widths, dtype):
        a = fused.step(feeds)
        b = plain.step(feeds, ["fastadam.loss", "logits"])  # the logits kept: no fusion
        np.testing.assert_array_equal(a["fastadam.loss"], b["fastadam.loss"])
    assert len(_fused_ops(fused)) == 1 and not [
        step for sched in plain._algorithms[0].schedules.values()
        for step, _ in sched.program.ops if "fused with" in step.label]
    for name, value in fused.initializers.items():
        np.testing.assert_array_equal(value, plain.initializers[name], err_msg=name)


def test_gradient_outputs_asked_for_are_those_of_the_unfused_step():
    model = _model()
    fused, plain = fo.TrainingSession(model), fo.TrainingSession(model)
    names = ["fastadam.loss", "fastadam.grad.W0", "fastadam.grad.b1"]
    for feeds in _batches((64, 16, 10), np.float32, 3):
        a = fused.step(feeds, names)
        b = plain.step(feeds, names + ["logits"])
        for n in names:
            np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    assert len(_fused_ops(fused)) == 1


def test_label_out_of_range_is_the_loss_nodes_error_and_changes_nothing():
    model = _model()
    fused, plain = fo.TrainingSession(model), fo.TrainingSession(model)
    feeds = next(_batches((64, 16, 10), np.float32, 1))
    fused.step(feeds)
    plain.step(feeds, ["fastadam.loss", "logits"])
    bad = dict(feeds, labels=np.where(np.arange(len(feeds["labels"])) == 3, 10, feeds["labels"]))
    before = {k: v.copy() for k, v in fused.initializers.items()}
    with pytest.raises(IndexError) as fused_error:
        fused.step(bad)
    with pytest.raises(IndexError) as plain_error:
        plain.step(bad, ["fastadam.loss", "logits"])
    assert str(fused_error.value) == str(plain_error.value)
    assert str(fused_error.value).startswith(
        "node 'fastadam.loss' (SoftmaxCrossEntropyLoss): labels: values must lie in [0, 10)")
    for k, v in fused.initializers.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_memory_budget_names_the_gemm_node_and_changes_nothing():
    model = _model()
    session = fo.TrainingSession(model)
    feeds = next(_batches((64, 16, 10), np.float32, 1))
    session.step(feeds)
    before = {k: v.copy() for k, v in session.initializers.items()}
    previous = fo.set_memory_budget(tensor_bytes=len(feeds["X"]) * 16 * 4 - 1)
    try:
        with pytest.raises(fo.MemoryBudgetError, match=r"^node #0 \(Gemm\): the output of "
                                                       r"shape \(8, 16\)"):
            session.step(feeds)
    finally:
        fo.set_memory_budget(**previous)
    for k, v in session.initializers.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
