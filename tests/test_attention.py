"""``fastadam.autodiff.attention`` (softmax(q @ kt + mask) @ v in one kernel) and the session's
fusion of exported attention graphs (fastadam/onnx/_fusion.py).

The oracle is the formula in float64 NumPy; the fused float32 kernel must agree with it to
float32 accuracy, with causal masks (-inf and the lowest float32), additive masks, rows with
nothing live, sizes with and without SIMD tails.  The ONNX tests compare a session that fuses
against the same nodes run one by one (``fastadam.onnx.run``, which never fuses) and against
the engine's unfused operations."""
import numpy as np
import pytest

import fastadam.autodiff as ad
from fastadam.autodiff import _transformer_kernels as TK

LOWEST = np.finfo(np.float32).min


def oracle(q, kt, v, mask, g, scale=1.0):
    """float64 forward and VJPs of softmax(scale * (q @ kt) + mask) @ v, from the formulas."""
    q, kt, v, mask, g = (np.asarray(a, np.float64) for a in (q, kt, v, mask, g))
    s = scale * (q @ kt) + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    o = p @ v
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = scale * ds @ np.swapaxes(kt, -1, -2)
    dkt = scale * np.swapaxes(q, -1, -2) @ ds
    dv = np.swapaxes(p, -1, -2) @ g
    dmask = ds.reshape((-1,) + mask.shape[-2:]).sum(axis=0) if mask.ndim == 2 else ds
    return o, dq, dkt, dv, dmask


def causal(T, S, fill=LOWEST):
    return np.where(np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T), fill,
                    0.0).astype(np.float32)


def operands(rng, batch, T, S, d, e, scale=1.0):
    f = lambda *shape: (scale * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    return f(*batch, T, d), f(*batch, d, S), f(*batch, S, e), f(*batch, T, e)


def run_fused(q, kt, v, mask, g, scale=1.0):
    Q, K, V = (ad.Tensor(a, requires_grad=True) for a in (q, kt, v))
    o = ad.attention(Q, K, V, mask, scale=scale)
    grads = ad.gradient(o, [Q, K, V], grad_output=g)
    return [o.data] + [t.data for t in grads]


SHAPES = [  # (batch, T, S, d, e): SIMD tails, T != S, one head, wide rows
    ((2, 4), 64, 64, 16, 16),
    ((3, 2), 11, 11, 5, 7),
    ((1, 1), 1, 1, 1, 1),
    ((2,), 19, 37, 24, 33),
    ((2, 2), 33, 80, 16, 32),
]


@pytest.mark.parametrize("batch,T,S,d,e", SHAPES)
@pytest.mark.parametrize("mask_kind", ["causal_lowest", "causal_inf", "additive", "batch",
                                       "none"])
def test_fused_kernel_equals_the_float64_formula(rng, batch, T, S, d, e, mask_kind):
    q, kt, v, g = operands(rng, batch, T, S, d, e)
    if mask_kind == "causal_lowest":
        mask = causal(T, S)
    elif mask_kind == "causal_inf":
        mask = causal(T, S, -np.inf)
    elif mask_kind == "additive":
        mask = rng.standard_normal((T, S)).astype(np.float32)
    elif mask_kind == "batch":  # a mask per batch entry (its leading axes are the batch's)
        mask = np.where(rng.random(batch + (T, S)) < 0.3, LOWEST,
                        rng.standard_normal(batch + (T, S))).astype(np.float32)
        mask[..., 0] = 0.0  # a live entry per row
    else:
        mask = np.zeros((1,) * len(batch) + (T, S), np.float32)
    assert ad.attention_fuses(q, kt, v, mask)
    got = run_fused(q, kt, v, mask, g)
    want = oracle(q, kt, v, np.where(mask <= LOWEST, -np.inf, mask), g)
    for name, a, b in zip(("o", "dq", "dkt", "dv"), got, want):
        assert a.dtype == np.float32 and a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=name)


def test_masked_entries_get_exactly_zero_probability_and_gradient(rng):
    """A causal mask: the output of row i does not depend on the keys and values after i (a
    change there leaves it bit for bit), and their gradients from row i are exactly 0."""
    q, kt, v, g = operands(rng, (2, 3), 16, 16, 8, 8)
    mask = causal(16, 16)
    o1, dq1, dkt1, dv1 = run_fused(q, kt, v, mask, g)
    kt2, v2 = kt.copy(), v.copy()
    kt2[..., 8:] += 5.0
    v2[..., 8:, :] -= 3.0
    o2, dq2, _, _ = run_fused(q, kt2, v2, mask, g)
    np.testing.assert_array_equal(o1[..., :8, :], o2[..., :8, :])
    np.testing.assert_array_equal(dq1[..., :8, :], dq2[..., :8, :])
    g0 = g.copy()
    g0[..., 4:, :] = 0.0  # only rows 0..3 send gradient: keys and values 4.. get exactly 0
    _, _, dkt, dv = run_fused(q, kt, v, mask, g0)
    assert not dkt[..., 4:].any() and not dv[..., 4:, :].any()
    assert dkt[..., :4].any() and dv[..., :4, :].any()


def test_a_row_with_nothing_live_is_the_unfused_softmax(rng):
    """Every entry of a row masked: the fused step computes that row whole, as the unfused
    nodes do (uniform probabilities with the lowest float32; NaN with -inf)."""
    q, kt, v, g = operands(rng, (2,), 5, 6, 3, 4)
    for fill in (LOWEST, -np.inf):
        mask = causal(5, 6)
        mask[2] = fill
        o, *_ = run_fused(q, kt, v, mask, g)
        s = q.astype(np.float64) @ kt + mask
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(-1, keepdims=True))
        ref = (e / e.sum(-1, keepdims=True)) @ v
        np.testing.assert_allclose(o, ref, rtol=2e-5, atol=2e-5)
        assert np.isnan(o[:, 2]).all() == (fill == -np.inf)


def test_other_operands_take_the_unfused_path_with_the_same_results(rng):
    """float64, broadcasting batch axes, a mask broadcast along another axis: NumPy's
    matmul and the softmax kernel, VJPs composed from the engine's operations."""
    q, kt, v, g = operands(rng, (2, 3), 7, 9, 4, 5)
    mask = causal(7, 9)
    for args in [(q.astype(np.float64), kt.astype(np.float64), v.astype(np.float64),
                  mask.astype(np.float64)),
                 (q, kt[:1], v, mask),                     # kt broadcast over the batch
                 (q, kt, v, rng.standard_normal((7, 1)).astype(np.float32))]:
        assert not ad.attention_fuses(*args)
        got = run_fused(*args[:3], args[3], g.astype(args[0].dtype))
        want = oracle(*args, g)
        for name, a, b in zip(("o", "dq", "dkt", "dv"), got, want):
            if a.shape != b.shape:  # a broadcast argument's gradient is summed over the batch
                b = b.sum(axis=0, keepdims=True)
            tol = 1e-12 if a.dtype == np.float64 else 2e-5
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)


def test_mask_gradient_and_second_order(rng):
    q, kt, v, g = operands(rng, (2, 2), 6, 6, 3, 3)
    mask = rng.standard_normal((6, 6)).astype(np.float32)
    Q, K, V, M = (ad.Tensor(a, requires_grad=True) for a in (q, kt, v, mask))
    dm = ad.gradient(ad.attention(Q, K, V, M), [M], grad_output=g)[0]
    np.testing.assert_allclose(dm.data, oracle(q, kt, v, mask, g)[4], rtol=2e-5, atol=2e-5)
    x = [a.astype(np.float64) for a in (q, kt, v)]
    ad.check_grads(lambda a, b, c: ad.attention(a, b, c, mask.astype(np.float64)), *x, order=2)


def test_first_order_gradients_equal_with_create_graph(rng):
    """create_graph=True composes the VJPs from recorded operations: the same values."""
    q, kt, v, g = operands(rng, (2, 2), 9, 9, 4, 4)
    mask = causal(9, 9)
    Q, K, V = (ad.Tensor(a, requires_grad=True) for a in (q, kt, v))
    fast = ad.gradient(ad.attention(Q, K, V, mask), [Q, K, V], grad_output=g)
    slow = ad.gradient(ad.attention(Q, K, V, mask), [Q, K, V], grad_output=g,
                       create_graph=True)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a.data, b.data, rtol=2e-5, atol=2e-6)


def test_kernel_refuses_bad_arguments():
    q, kt, v = (np.zeros(s, np.float32) for s in ((2, 3, 4), (2, 4, 5), (2, 5, 6)))
    mask, ncols = np.zeros((1, 3, 5), np.float32), np.full((1, 3), 5, np.int32)
    o, p = TK.attention_f32(q, kt, v, mask, ncols)
    assert o.shape == (2, 3, 6) and p.shape == (2, 3, 5)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        TK.attention_f32(q, np.zeros((2, 3, 5), np.float32), v, mask, ncols)
    with pytest.raises(ValueError, match=r"ncols: expected values in \[1, 5\]"):
        TK.attention_f32(q, kt, v, mask, np.full((1, 3), 6, np.int32))
    with pytest.raises(ValueError, match=r"ncols: expected values in \[1, 5\]"):
        TK.attention_f32(q, kt, v, mask, np.zeros((1, 3), np.int32))
    with pytest.raises(TypeError, match="ncols: expected a C-contiguous int32"):
        TK.attention_f32(q, kt, v, mask, ncols.astype(np.int64))
    with pytest.raises(TypeError, match="q: expected .*float32.*, got float64"):
        TK.attention_f32(q.astype(np.float64), kt, v, mask, ncols)
    with pytest.raises(ValueError, match="q: expected its last axis to have unit stride"):
        TK.attention_f32(np.zeros((2, 4, 3), np.float32).transpose(0, 2, 1), kt, v, mask,
                         ncols)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        TK.attention_backward_f32(np.zeros((2, 2, 6), np.float32), q, kt, v, p, ncols)


# ---------------------------------------------------------------------------------------------
# the session's fusion of MatMul, Add, Softmax, MatMul
# ---------------------------------------------------------------------------------------------


def attention_model(T=7, d=4, mask_first=False, axis=-1, extra_output=None):
    """An ONNX training model: x (B, T, d) -> q, k, v = x @ wq, x @ wk, x @ wv;
    out = softmax(q @ k^T + mask) @ v (the four nodes), loss = sum(out * out)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import fastadam.onnx as fo
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), n)
             for n in ("wq", "wk", "wv")]
    inits.append(numpy_helper.from_array(causal(T, T), "mask"))
    add_inputs = ["mask", "scores"] if mask_first else ["scores", "mask"]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Add", add_inputs, ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=axis),
             helper.make_node("MatMul", ["probs", "v"], ["out"]),
             helper.make_node("Mul", ["out", "out"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT,
                                                     ["B", T, T]))
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           ["B", T, d])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=9)
    onnx.checker.check_model(model)
    return model, fo


def _fused_labels(session):
    """The labels of the session's fused attention steps (a MatMul + Add fused as a linear
    layer, tests/test_matmul_add.py, is not counted)."""
    return [s.label for alg in session._algorithms for sched in alg.schedules.values()
            for s, _ in sched.program.ops if "fused" in s.label and "(Softmax)" in s.label]


def test_session_runs_the_attention_nodes_fused_with_the_unfused_results(rng):
    x = rng.standard_normal((3, 7, 4)).astype(np.float32)
    for mask_first in (False, True):
        model, fo = attention_model(mask_first=mask_first)
        trained = fo.make_training_model(model, loss="loss", lr=0.01)
        session = fo.TrainingSession(trained)
        out = session.step({"x": x}, ["loss"] + [f"fastadam.grad.{n}" for n in ("wq", "wk",
                                                                                "wv")])
        assert len(_fused_labels(session)) == 1
        # the same nodes one by one (fastadam.onnx.run never fuses), the gradient by the engine
        assert float(out["loss"]) == pytest.approx(float(fo.run(model, {"x": x})["loss"]),
                                                   rel=1e-5)
        w = {n: ad.Tensor(fo.TrainingSession(trained).initializers[n], requires_grad=True)
             for n in ("wq", "wk", "wv")}
        X = ad.Tensor(x)
        q, k, v = (ad.matmul(X, w[n]) for n in ("wq", "wk", "wv"))
        s = ad.add(ad.matmul(q, ad.transpose(k, (0, 2, 1))), causal(7, 7))
        o = ad.matmul(ad.softmax(s, axis=-1), v)
        ref = ad.gradient(ad.sum(ad.multiply(o, o)), [w[n] for n in ("wq", "wk", "wv")])
        for n, r in zip(("wq", "wk", "wv"), ref):
            np.testing.assert_allclose(out[f"fastadam.grad.{n}"], r.data, rtol=1e-4,
                                       atol=1e-5, err_msg=n)


def test_an_intermediate_read_elsewhere_is_not_fused(rng):
    """Asking for the probabilities (or a Softmax over another axis) runs the four nodes as
    they are, and the value asked for is there."""
    x = rng.standard_normal((2, 7, 4)).astype(np.float32)
    model, fo = attention_model(extra_output="probs")
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss"))
    out = session.step({"x": x}, ["loss", "probs"])
    assert _fused_labels(session) == []
    np.testing.assert_allclose(out["probs"].sum(-1), 1.0, rtol=1e-6)
    model, fo = attention_model(axis=1)
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss"))
    session.step({"x": x})
    assert _fused_labels(session) == []


def test_a_fused_step_on_operands_the_kernel_does_not_take_runs_the_nodes(rng):
    """The fusion is decided per run: a 2-D x makes 2-D q, kt, v (rank < 3), which run the
    four nodes one by one."""
    model, fo = attention_model()
    trained = fo.make_training_model(model, loss="loss")
    onnx = pytest.importorskip("onnx")
    # the same graph with x of rank 2: (T, d)
    trained.graph.input[0].CopyFrom(onnx.helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [7, 4]))
    for node in trained.graph.node:
        if node.op_type == "Transpose":
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("perm", [1, 0]))
    session = fo.TrainingSession(trained)
    x = rng.standard_normal((7, 4)).astype(np.float32)
    loss = float(session.step({"x": x}, ["loss"])["loss"])
    assert len(_fused_labels(session)) == 1  # compiled fused, run unfused
    assert loss == pytest.approx(float(fo.run(trained, {"x": x})["loss"]), rel=1e-6)


def test_a_fused_output_that_is_the_next_patterns_scores_stays_fused_once(rng):
    """out1 = softmax(q @ kt + m) @ w (T x T) is itself the scores of a second pattern:
    the first pattern is fused, the second runs its nodes; the loss is the unfused one."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import fastadam.onnx as fo
    T, d = 6, 3
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("wq", rng.standard_normal((d, d)).astype(np.float32)),
        ("w", rng.standard_normal((T, T)).astype(np.float32)),
        ("w2", rng.standard_normal((T, d)).astype(np.float32)),
        ("mask", causal(T, T))]]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Transpose", ["x"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s1"]),
             helper.make_node("Add", ["s1", "mask"], ["m1"]),
             helper.make_node("Softmax", ["m1"], ["p1"], axis=-1),
             helper.make_node("MatMul", ["p1", "w"], ["out1"]),
             helper.make_node("Add", ["out1", "mask"], ["m2"]),
             helper.make_node("Softmax", ["m2"], ["p2"], axis=-1),
             helper.make_node("MatMul", ["p2", "w2"], ["out2"]),
             helper.make_node("ReduceSum", ["out2"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, T, d])], [helper.make_tensor_value_info(
            "loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=9)
    x = rng.standard_normal((2, T, d)).astype(np.float32)
    session = fo.TrainingSession(fo.make_training_model(model, loss="loss",
                                                        params=["wq", "w", "w2"]))
    loss = float(session.step({"x": x}, ["loss"])["loss"])
    assert len(_fused_labels(session)) == 1
    assert loss == pytest.approx(float(fo.run(model, {"x": x})["loss"]), rel=1e-5)


def test_live_columns_end_at_each_rows_last_entry_above_the_lowest_float32():
    m = np.array([[[0, LOWEST, LOWEST], [LOWEST, LOWEST, LOWEST], [np.nan, -np.inf, LOWEST],
                   [1, 2, 3], [LOWEST, 0, -np.inf]]], np.float32)
    np.testing.assert_array_equal(TK.attention_live_columns(m), [[1, 3, 1, 3, 2]])


def test_strided_views_give_the_bits_of_their_contiguous_copies(rng):
    """The exported graphs hand the kernel transposed views ((B, T, H, e) as (B, H, T, e)), a
    reversed batch axis, rows with a gap: read in place, the same bits as contiguous
    copies."""
    B, H, T, d = 2, 3, 13, 8
    base_q = rng.standard_normal((B, T, H, d)).astype(np.float32)
    base_v = rng.standard_normal((B, T, H, 2 * d)).astype(np.float32)[..., ::2][..., :d]
    kt = rng.standard_normal((B, H, d, T)).astype(np.float32)[::-1]
    g = rng.standard_normal((B, T, H, d)).astype(np.float32).transpose(0, 2, 1, 3)
    q, v = base_q.transpose(0, 2, 1, 3), base_v.transpose(0, 2, 1, 3)
    mask = causal(T, T)
    views = run_fused(q, kt, v, mask, g)
    copies = run_fused(*(np.ascontiguousarray(a) for a in (q, kt, v)), mask,
                       np.ascontiguousarray(g))
    for name, a, b in zip(("o", "dq", "dkt", "dv"), views, copies):
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_allclose(views[0], oracle(q, kt, v, mask, g)[0], rtol=2e-5, atol=2e-5)


def test_kernel_refuses_operands_of_different_ranks():
    q, v = np.zeros((2, 3, 4), np.float32), np.zeros((2, 5, 6), np.float32)
    kt4 = np.zeros((1, 2, 4, 5), np.float32)
    mask, ncols = np.zeros((1, 3, 5), np.float32), np.full((1, 3), 5, np.int32)
    with pytest.raises(ValueError, match="q, kt and v have 3, 4 and 3 dimensions"):
        TK.attention_f32(q, kt4, v, mask, ncols)
    with pytest.raises(ValueError, match="differ in dimensions"):
        TK.attention_backward_f32(np.zeros((2, 3, 6), np.float32), q, kt4, v,
                                  np.zeros((2, 3, 5), np.float32), ncols)


@pytest.mark.parametrize("batch,T,S,d,e", SHAPES[:2])
def test_a_scale_on_the_scores_equals_the_formula_fused_and_unfused(rng, batch, T, S, d, e):
    """``scale``: softmax(scale * (q @ kt) + mask) @ v, its gradients scaled inside (the
    session folds the exporters' Mul of q and of kt by a one-element constant into it)."""
    q, kt, v, g = operands(rng, batch, T, S, d, e)
    mask = causal(T, S)
    want = oracle(q, kt, v, np.where(mask <= LOWEST, -np.inf, mask), g, scale=0.3)
    for args in [(q, kt, v), tuple(a.astype(np.float64) for a in (q, kt, v))]:
        m = mask.astype(args[0].dtype)
        got = run_fused(*args, m, g.astype(args[0].dtype), scale=0.3)
        tol = 2e-5 if args[0].dtype == np.float32 else 1e-12
        for name, a, b in zip(("o", "dq", "dkt", "dv"), got, want):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)
    Q, K, V = (ad.Tensor(a, requires_grad=True) for a in (q, kt, v))
    slow = ad.gradient(ad.attention(Q, K, V, mask, scale=0.3), [Q, K, V], grad_output=g,
                       create_graph=True)
    for a, b in zip(slow, want[1:]):
        np.testing.assert_allclose(a.data, b, rtol=2e-5, atol=2e-5)
    x = [a.astype(np.float64)[:1, :1] for a in (q, kt, v)]
    ad.check_grads(lambda a, b, c: ad.attention(a, b, c, mask.astype(np.float64), scale=0.3),
                   *x, order=2)



def scaled_attention_model(T=7, d=4):
    """As ``attention_model``, with q and kt each multiplied by a one-element initializer "c"
    first (as PyTorch's exporters write scaled_dot_product_attention)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import fastadam.onnx as fo
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), n)
             for n in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(causal(T, T), "mask"),
              numpy_helper.from_array(np.array([0.7], np.float32), "c")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Mul", ["q", "c"], ["qs"]),
             helper.make_node("Mul", ["c", "kt"], ["kts"]),
             helper.make_node("MatMul", ["qs", "kts"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["out"]),
             helper.make_node("Mul", ["out", "out"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", T, d])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=9), fo


def _engine_grads(x, w, c, names):
    """The scaled model's loss and gradients, unfused, with the engine's operations."""
    W = {n: ad.Tensor(w[n], requires_grad=True) for n in ("wq", "wk", "wv")}
    C = ad.Tensor(c, requires_grad=True)
    X = ad.Tensor(x)
    q, k, v = (ad.matmul(X, W[n]) for n in ("wq", "wk", "wv"))
    s = ad.matmul(ad.multiply(q, C), ad.multiply(C, ad.transpose(k, (0, 2, 1))))
    o = ad.matmul(ad.softmax(ad.add(s, causal(7, 7)), axis=-1), v)
    loss = ad.sum(ad.multiply(o, o))
    targets = [W[n] if n != "c" else C for n in names]
    return loss.data, [g.data for g in ad.gradient(loss, targets)]


def test_the_exporters_scale_muls_fold_into_the_fused_step(rng):
    """A one-element constant scale on q and kt: the two Muls run inside the fused step (the
    scores scaled by c * c); the loss and gradients are the unfused ones.  Trained, the scale
    needs a gradient: the step runs the nodes as they are, and c gets its gradient."""
    model, fo = scaled_attention_model()
    from onnx import numpy_helper
    x = rng.standard_normal((3, 7, 4)).astype(np.float32)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for names in (["wq", "wk", "wv"], ["wq", "wk", "wv", "c"]):
        session = fo.TrainingSession(fo.make_training_model(model, loss="loss", params=names,
                                                            lr=0.0))
        out = session.step({"x": x}, ["loss"] + [f"fastadam.grad.{n}" for n in names])
        (label,) = _fused_labels(session)
        assert label.count("(Mul)") == 2
        loss, grads = _engine_grads(x, w, w["c"], names)
        np.testing.assert_allclose(out["loss"], loss, rtol=1e-5)
        for n, g in zip(names, grads):
            np.testing.assert_allclose(out[f"fastadam.grad.{n}"], g, rtol=1e-4, atol=1e-5,
                                       err_msg=n)
