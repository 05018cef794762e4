"""The transformer operators (fastadam/onnx/_transformer_ops.py) and their autodiff primitives
(fastadam/autodiff/_ops_transformer.py): forward against onnxruntime (one-node models), VJPs
against torch, finite differences to second order, bad input."""
import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import fastadam.autodiff as ad  # noqa: E402
import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx._core_ops import OPERATORS  # noqa: E402

# every operator fastadam/onnx/_transformer_ops.py registers, each run against onnxruntime below
# (tests/test_onnx_ops.py's check that every registered operator is tested reads this set)
TESTED_HERE = {"LayerNormalization", "Gelu", "Erf", "Split", "Slice", "Expand", "ConstantOfShape",
               "Range", "Trilu", "Equal", "Less", "Greater", "Not", "And", "Or", "Max", "Min",
               "Sum", "Dropout", "CastLike"}

F, D, I64, B = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
_TYPES = {np.dtype(np.float32): F, np.dtype(np.float64): D, np.dtype(np.int64): I64,
          np.dtype(np.bool_): B}


def one_node(op_type, inputs, n_out=1, opset=20, **attrs):
    """A model of one node; ``inputs``: {name: array} (None: an omitted optional input)."""
    names = [n if a is not None else "" for n, a in inputs.items()]
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, _TYPES[a.dtype], a.shape)
                      for n, a in inputs.items() if a is not None],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # the outputs' types
    for o in model.graph.output:
        t = next(v for v in list(inferred.graph.output) + list(inferred.graph.value_info)
                 if v.name == o.name)
        o.type.tensor_type.elem_type = t.type.tensor_type.elem_type
        o.type.tensor_type.shape.SetInParent()
    return model


def assert_like_onnxruntime(op_type, inputs, n_out=1, opset=20, rtol=1e-6, atol=1e-6, **attrs):
    ort = pytest.importorskip("onnxruntime")
    model = one_node(op_type, inputs, n_out, opset, **attrs)
    feeds = {n: a for n, a in inputs.items() if a is not None}
    ours = fo.run(model, feeds)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for k, r in enumerate(ref):
        got = np.asarray(ours[f"y{k}"])
        assert got.dtype == r.dtype and got.shape == r.shape, (op_type, k, got.shape, r.shape)
        np.testing.assert_allclose(got, r, rtol=rtol, atol=atol, err_msg=f"{op_type} output {k}")


def run_op(op_type, inputs, attrs=None, opset=20, n_outputs=None):
    fun = OPERATORS[op_type][1]
    if n_outputs is None:
        return fun(inputs, attrs or {}, opset)
    return fun(inputs, attrs or {}, opset, n_outputs=n_outputs)


@pytest.fixture
def x3(rng):
    return rng.standard_normal((2, 5, 6)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# forward against onnxruntime
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_normalization_like_onnxruntime(rng, x3, axis, n_out):
    norm = x3.shape[axis:] if axis > 0 else x3.shape[x3.ndim + axis:]
    scale = rng.standard_normal(norm).astype(np.float32)
    bias = rng.standard_normal(norm).astype(np.float32)
    assert_like_onnxruntime("LayerNormalization", dict(x=x3, s=scale, b=bias), n_out, opset=17,
                            rtol=1e-5, atol=1e-5, axis=axis, epsilon=1e-3)
    assert_like_onnxruntime("LayerNormalization", dict(x=x3, s=scale), 1, opset=17, rtol=1e-5,
                            atol=1e-5, axis=axis)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_erf_like_onnxruntime(rng, approximate):
    x = (3 * rng.standard_normal((4, 33))).astype(np.float32)
    assert_like_onnxruntime("Gelu", dict(x=x), approximate=approximate, rtol=1e-5, atol=1e-6)
    assert_like_onnxruntime("Erf", dict(x=x), opset=13)
    x64 = x.astype(np.float64)  # onnxruntime has no float64 Erf: math.erf is the reference
    np.testing.assert_allclose(fo.run(one_node("Erf", dict(x=x64), opset=13), dict(x=x64))["y0"],
                               np.vectorize(math.erf)(x64), rtol=1e-15, atol=1e-16)


@pytest.mark.parametrize("opset,inputs,attrs", [
    (13, {"split": np.array([1, 3, 2])}, {}),
    (18, {}, {"num_outputs": 3}),
    (11, {}, {"split": [2, 2, 2]}),
])
def test_split_like_onnxruntime(x3, opset, inputs, attrs):
    assert_like_onnxruntime("Split", dict(x=x3, **inputs), 3, opset=opset, axis=-1, **attrs)


def test_split_uneven_num_outputs_like_onnxruntime(x3):
    assert_like_onnxruntime("Split", dict(x=x3), 4, opset=18, axis=2, num_outputs=4)  # 2,2,2,0


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [4], [2], [1]),
    ([-1, 0], [-100, 10 ** 10], [-1, 1], [-2, 3]),
    ([4, 0], [0, 2], [2, 0], [-1, 1]),
    ([0], [9223372036854775807], None, None),
    ([10], [20], [1], [1]),  # empty
])
def test_slice_like_onnxruntime(x3, starts, ends, axes, steps):
    inputs = dict(x=x3, starts=np.array(starts), ends=np.array(ends),
                  axes=None if axes is None else np.array(axes),
                  steps=None if steps is None else np.array(steps))
    if axes is None:
        del inputs["axes"], inputs["steps"]
    assert_like_onnxruntime("Slice", inputs, opset=13)


def test_shape_operators_like_onnxruntime(rng, x3):
    assert_like_onnxruntime("Expand", dict(x=x3[:, :1], shape=np.array([3, 1, 4, 6])), opset=13)
    assert_like_onnxruntime("Expand", dict(x=np.arange(3), shape=np.array([2, 1])), opset=13)
    value = helper.make_tensor("v", TensorProto.INT64, [1], [7])
    assert_like_onnxruntime("ConstantOfShape", dict(shape=np.array([2, 3])), opset=13,
                            value=value)
    assert_like_onnxruntime("ConstantOfShape", dict(shape=np.array([0, 3])), opset=13)
    for start, limit, delta in [(0, 7, 2), (10, 2, -3), (3, 3, 1)]:
        assert_like_onnxruntime("Range", dict(a=np.array(start), b=np.array(limit),
                                              c=np.array(delta)), opset=13)
    assert_like_onnxruntime("Range", dict(a=np.array(0.5), b=np.array(2.0), c=np.array(0.3)),
                            opset=13)
    for upper in (0, 1):
        for k in (None, np.array(-1), np.array(2)):
            assert_like_onnxruntime("Trilu", dict(x=x3, k=k), opset=14, upper=upper)
    assert_like_onnxruntime("CastLike", dict(x=x3, like=np.zeros(1)), opset=15)


def test_comparisons_logic_extrema_like_onnxruntime(rng):
    a = rng.integers(0, 3, (4, 5)).astype(np.float32)
    b = rng.integers(0, 3, (5,)).astype(np.float32)
    for op in ("Equal", "Less", "Greater"):
        assert_like_onnxruntime(op, dict(a=a, b=b), opset=13)
    p, q = a > 1, b > 0
    assert_like_onnxruntime("Not", dict(p=p), opset=13)
    for op in ("And", "Or"):
        assert_like_onnxruntime(op, dict(p=p, q=q), opset=13)
    c = rng.integers(0, 3, (1, 5)).astype(np.float32)
    for op in ("Max", "Min", "Sum"):
        assert_like_onnxruntime(op, dict(a=a, b=b, c=c), opset=13)
        assert_like_onnxruntime(op, dict(a=a), opset=13)


def test_dropout_inference_form_like_onnxruntime(x3):
    assert_like_onnxruntime("Dropout", dict(x=x3), 2, opset=13)
    assert_like_onnxruntime("Dropout", dict(x=x3, r=np.array(0.3, np.float32),
                                            t=np.array(False)), 2, opset=13)
    assert_like_onnxruntime("Dropout", dict(x=x3, r=np.array(0.0, np.float32),
                                            t=np.array(True)), 2, opset=13)
    with pytest.raises(fo.UnsupportedOperatorError, match="random mask"):
        fo.run(one_node("Dropout", dict(x=x3, r=np.array(0.3, np.float32), t=np.array(True)),
                        opset=13), dict(x=x3, r=np.array(0.3, np.float32), t=np.array(True)))


# ---------------------------------------------------------------------------------------------
# VJPs against torch
# ---------------------------------------------------------------------------------------------


def vjps(op_type, arrays, attrs=None, opset=20, seed=0, out=0, n_outputs=None, consts=()):
    """(output, gradients of <u, output> for the float arrays) through the ONNX operator."""
    ts = [ad.Tensor(a, requires_grad=a.dtype.kind == "f" and k not in consts)
          if a is not None else None for k, a in enumerate(arrays)]
    y = run_op(op_type, ts, attrs, opset, n_outputs)[out]
    u = np.random.default_rng(seed).standard_normal(y.shape).astype(y.data.dtype)
    xs = [t for t in ts if t is not None and t.requires_grad]
    grads = ad.gradient(ad.sum(ad.multiply(y, u)), xs, allow_unused=True)
    return y.data, [np.zeros_like(x.data) if g is None else np.asarray(g.data if hasattr(
        g, "data") else g.to_dense()) for x, g in zip(xs, grads)], u


def torch_vjps(fun, arrays, u):
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fun(*ts)
    (y * torch.from_numpy(u)).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


def assert_vjps_like_torch(op_type, arrays, fun, attrs=None, opset=20, rtol=1e-10, atol=1e-12,
                           **kw):
    y, grads, u = vjps(op_type, arrays, attrs, opset, **kw)
    ry, rgrads = torch_vjps(fun, [a for a in arrays if a is not None and a.dtype.kind == "f"], u)
    np.testing.assert_allclose(y, ry, rtol=rtol, atol=atol)
    assert len(grads) == len(rgrads)
    for g, r in zip(grads, rgrads):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_layer_norm_vjps_like_torch(rng, dtype, tol):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 4, 8)).astype(dtype)
    s, b = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
    assert_vjps_like_torch(
        "LayerNormalization", [x, s, b],
        lambda x, s, b: torch.nn.functional.layer_norm(x, (8,), s, b, eps=1e-5),
        {"axis": -1, "epsilon": 1e-5}, opset=17, rtol=tol, atol=tol)
    s2, b2 = rng.standard_normal((4, 8)).astype(dtype), rng.standard_normal((4, 8)).astype(dtype)
    assert_vjps_like_torch(
        "LayerNormalization", [x, s2, b2],
        lambda x, s, b: torch.nn.functional.layer_norm(x, (4, 8), s, b, eps=1e-5),
        {"axis": 1, "epsilon": 1e-5}, opset=17, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_gradients_of_any_subset_of_its_arguments(rng, dtype):
    """The first-order backward pass computes dscale and dbias with dx and hands them to the
    other VJPs: each subset of (x, scale, bias) asked for (a constant scale or bias, x not
    differentiated) gets the gradients the full call gives."""
    x = rng.standard_normal((4, 5, 8)).astype(dtype)
    s, b = rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype)
    u = rng.standard_normal(x.shape).astype(dtype)

    def grads(wanted):
        ts = [ad.Tensor(a, requires_grad=k in wanted) for k, a in enumerate((x, s, b))]
        y = ad.layer_norm(*ts)
        return ad.gradient(y, [ts[k] for k in wanted], grad_output=u)
    full = grads((0, 1, 2))
    for wanted in [(0,), (1,), (2,), (1, 2), (0, 2), (0, 1)]:
        for k, got in zip(wanted, grads(wanted)):
            np.testing.assert_array_equal(got.data, full[k].data, err_msg=f"{wanted} {k}")
    # a gradient asked for an argument that does not require one
    ts = [ad.Tensor(x, requires_grad=True), ad.Tensor(s), ad.Tensor(b)]
    got = ad.gradient(ad.layer_norm(*ts), ts, grad_output=u)
    for k in range(3):
        np.testing.assert_array_equal(got[k].data, full[k].data)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_activation_vjps_like_torch(rng, dtype, tol):
    torch = pytest.importorskip("torch")
    x = (3 * rng.standard_normal((5, 7))).astype(dtype)
    for approximate in ("none", "tanh"):
        assert_vjps_like_torch(
            "Gelu", [x], lambda t: torch.nn.functional.gelu(t, approximate=approximate),
            {"approximate": approximate}, rtol=tol, atol=tol)
    assert_vjps_like_torch("Erf", [x], torch.erf, opset=13, rtol=tol, atol=tol)


def test_extrema_vjps_like_torch_ties_included(rng):
    torch = pytest.importorskip("torch")
    a = rng.integers(0, 3, (4, 5)).astype(np.float64)
    b = rng.integers(0, 3, (5,)).astype(np.float64)
    assert_vjps_like_torch("Max", [a, b], torch.maximum, opset=13)
    assert_vjps_like_torch("Min", [a, b], torch.minimum, opset=13)


def test_slicing_vjps_like_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((4, 6, 5))
    y, grads, u = vjps("Slice", [x, np.array([-1, 0]), np.array([-100, 10]), np.array([-1, 1]),
                                 np.array([-2, 3])], opset=13)
    _, ref = torch_vjps(lambda t: torch.flip(t, [2])[:, ::3, ::2], [x], u)
    np.testing.assert_allclose(grads[0], ref[0])
    for k in range(3):
        y, grads, u = vjps("Split", [x, np.array([1, 2, 3])], {"axis": 1}, 13, out=k,
                           n_outputs=3)
        _, ref = torch_vjps(lambda t: torch.split(t, [1, 2, 3], dim=1)[k], [x], u)
        np.testing.assert_allclose(grads[0], ref[0])
    y, grads, u = vjps("Expand", [x[:, :1], np.array([2, 4, 3, 5])], opset=13)
    _, ref = torch_vjps(lambda t: t.expand(2, 4, 3, 5), [x[:, :1]], u)
    np.testing.assert_allclose(grads[0], ref[0])
    for upper in (0, 1):
        y, grads, u = vjps("Trilu", [x, np.array(1)], {"upper": upper}, 14)
        fun = torch.triu if upper else torch.tril
        _, ref = torch_vjps(lambda t: fun(t, 1), [x], u)
        np.testing.assert_allclose(grads[0], ref[0])


# ---------------------------------------------------------------------------------------------
# second order, bad input
# ---------------------------------------------------------------------------------------------


def test_a_recorded_float32_gelu_keeps_phi_with_the_bits_of_the_plain_kernels(rng):
    """A float32 GELU on the tape keeps Phi(x) for its backward pass: the output and the
    gradient are the kernels' without it, bit for bit, and the float64 formula's within
    rounding; a second-order gradient still works; Phi goes with the output."""
    import gc

    from fastadam.autodiff import _ops_transformer, _transformer_kernels as TK
    x = (rng.standard_normal((7, 33)) * 3).astype(np.float32).T  # strided: (33, 7)
    g = rng.standard_normal((33, 7)).astype(np.float32)
    xc = np.ascontiguousarray(x)
    t = ad.Tensor(x, requires_grad=True)
    y = ad.gelu(t)
    assert len(_ops_transformer._GELU_CDF) == 1
    (dx,) = ad.gradient(ad.sum(ad.multiply(y, g)), [t])
    np.testing.assert_array_equal(y.data, TK.gelu(xc))
    np.testing.assert_array_equal(dx.data, TK.gelu_grad(g, xc))
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(y.data, x64 * cdf, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx.data, g * (cdf + x64 * pdf), rtol=1e-5, atol=1e-6)
    del y, dx
    gc.collect()
    assert _ops_transformer._GELU_CDF == {}
    # second order (the kept Phi is a first-order shortcut): d2/dx2 sum(gelu) = pdf (2 - x^2)
    t = ad.Tensor(x, requires_grad=True)
    (d1,) = ad.gradient(ad.sum(ad.gelu(t)), [t], create_graph=True)
    (d2,) = ad.gradient(ad.sum(d1), [t])
    np.testing.assert_allclose(d2.data, pdf * (2 - x64 * x64), rtol=1e-4, atol=1e-5)


def test_primitives_second_order_finite_differences(rng):
    x = rng.standard_normal((3, 6))
    s, b = rng.standard_normal(6), rng.standard_normal(6)
    ad.check_grads(lambda t: ad.erf(t) * t, x, order=2)
    ad.check_grads(lambda t: ad.gelu(t) * t, x, order=2)
    ad.check_grads(lambda t: ad.gelu(t, approximate="tanh") * t, x, order=2)
    ad.check_grads(lambda t, u, v: ad.layer_norm(t, u, v) * t, x, s, b, order=2)
    y = x + np.where(rng.random((3, 6)) > 0.5, 0.7, -0.7)  # no ties: a smooth function
    ad.check_grads(lambda t, u: ad.maximum(t, u) * ad.minimum(t, u) * t, x, y, order=2)


def test_bad_input_is_named():
    x = ad.Tensor(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        run_op("LayerNormalization", [x, ad.Tensor(np.ones(3))], {"axis": 2}, 17)
    with pytest.raises(fo.UnsupportedOperatorError, match="only float32 and float64"):
        run_op("LayerNormalization", [ad.Tensor(np.zeros((2, 3), np.float16)),
                                      ad.Tensor(np.ones(3, np.float16))], {}, 17)
    with pytest.raises(ValueError, match="scale: shape"):
        ad.layer_norm(x, np.ones(4))
    with pytest.raises(ValueError, match="approximate"):
        ad.gelu(x, approximate="fast")
    with pytest.raises(ValueError, match="do not add up"):
        run_op("Split", [x, ad.Tensor(np.array([1, 1]))], {"axis": 1}, 13, n_outputs=2)
    for target in ([4, 2], [-1, -1], [5, -1]):  # float and integer tensors alike
        for t in (x, ad.Tensor(np.zeros((2, 3), np.int64))):
            with pytest.raises(ValueError, match=r"shape: cannot reshape a tensor of shape "
                                                 r"\(2, 3\) to"):
                run_op("Reshape", [t, ad.Tensor(np.array(target))], {}, 14)
    with pytest.raises(ValueError, match="a negative size other than -1"):  # ONNX: only -1
        run_op("Reshape", [x, ad.Tensor(np.array([-2, 3]))], {}, 14)
    with pytest.raises(ValueError, match="steps: a step cannot be 0"):
        run_op("Slice", [x] + [ad.Tensor(np.array([v])) for v in (0, 1, 0, 0)], {}, 13)
    with pytest.raises(ValueError, match="delta: cannot be 0"):
        run_op("Range", [ad.Tensor(np.array(v)) for v in (0, 3, 0)], {}, 13)
    with pytest.raises(ValueError, match="does not broadcast"):
        run_op("Expand", [x, ad.Tensor(np.array([4, 3, 2]))], {}, 13)
    with pytest.raises(ValueError, match="Trilu needs a tensor of rank >= 2"):
        run_op("Trilu", [ad.Tensor(np.zeros(3))], {}, 14)
    with pytest.raises(TypeError, match="expected bool tensors"):
        run_op("Not", [x], {}, 13)


def test_every_transformer_operator_is_listed():
    registered = {op for op, (_, fun) in OPERATORS.items()
                  if fun.__module__ == "fastadam.onnx._transformer_ops"}
    assert registered == TESTED_HERE
