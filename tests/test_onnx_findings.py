"""Issue 22's findings, one test each: negative axes (Softmax/LogSoftmax before opset 13 and their
Gradient, Flatten, and the one helper every operator with an axis reads), Cast to float8 with
``saturate``, ReduceMax over an empty set, Momentum/Adagrad with ``T < 0``, the schemas' float32
attribute defaults.  References: onnxruntime, ``onnx.reference``, torch, ml_dtypes."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

R = np.random.default_rng(22)
TRAIN = fo.TRAINING_DOMAIN


def _model(nodes, inputs, outputs, opset, inits=(), training=False):
    """``inputs`` / ``outputs``: (name, ndarray or (TensorProto type, shape))."""
    def vi(name, spec):
        if isinstance(spec, np.ndarray):
            return helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(spec.dtype), spec.shape)
        if spec[1] is None:  # left to shape inference
            return helper.make_empty_tensor_value_info(name)
        return helper.make_tensor_value_info(name, *spec)
    graph = helper.make_graph(nodes, "g", [vi(n, s) for n, s in inputs],
                              [vi(n, s) for n, s in outputs], list(inits))
    opsets = [helper.make_opsetid("", opset)]
    if training:
        opsets.append(helper.make_opsetid(TRAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---------------------------------------------------------------------------------------------
# negative axes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("shape, axis", [((4, 5), -1), ((4, 5), -2), ((2, 3, 4), -1),
                                         ((2, 3, 4), -2), ((2, 3, 4), -3), ((2, 3, 4), 1)])
def test_softmax_negative_axis_matches_onnxruntime(op, opset, shape, axis):
    x = R.standard_normal(shape).astype(np.float32)
    model = _model([helper.make_node(op, ["x"], ["y"], axis=axis)], [("x", x)],
                   [("y", (TensorProto.FLOAT, shape))], opset)
    got = fo.run(model, {"x": x})["y"]
    ref, = _ort(model, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def _torch_softmax_grad(x, w, axis, log, coerce):
    """d sum(w * softmax(x)) / dx in float64, by torch; ``coerce``: the 2-D form of opsets < 13
    (softmax over the flattened trailing axes from ``axis`` on)."""
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    fun = torch.log_softmax if log else torch.softmax
    if coerce:
        a = axis % x.ndim
        flat = xt.reshape(int(np.prod(x.shape[:a])), -1)
        y = fun(flat, dim=1).reshape(x.shape)
    else:
        y = fun(xt, dim=axis)
    (y * torch.tensor(w)).sum().backward()
    return xt.grad.numpy()


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("shape, axis", [((4, 5), -1), ((2, 3, 4), -2)])
def test_gradient_through_softmax_negative_axis_matches_torch(op, opset, shape, axis):
    x = R.standard_normal(shape)
    w = R.standard_normal(shape)
    nodes = [helper.make_node(op, ["x"], ["y"], axis=axis),
             helper.make_node("Mul", ["y", "w"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),  # over every axis
             helper.make_node("Gradient", ["x", "w"], ["dx"], domain=TRAIN, xs=["x"], zs=["w"],
                              y="loss")]
    model = _model(nodes, [("x", x), ("w", w)], [("dx", (TensorProto.DOUBLE, shape))], opset,
                   training=True)
    got = fo.run(model, {"x": x, "w": w})["dx"]
    ref = _torch_softmax_grad(x, w, axis, op == "LogSoftmax", coerce=opset < 13)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("axis", [-4, -3, -2, -1, 0, 2, 4])
def test_flatten_negative_axis_matches_onnxruntime(axis):
    x = R.standard_normal((2, 3, 4, 5)).astype(np.float32)
    model = _model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [("x", x)],
                   [("y", (TensorProto.FLOAT, None))], 13)
    got = fo.run(model, {"x": x})["y"]
    ref, = _ort(model, {"x": x})
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def test_flatten_negative_axis_shape():  # the example, without onnxruntime
    model = _model([helper.make_node("Flatten", ["x"], ["y"], axis=-1)],
                   [("x", (TensorProto.FLOAT, (2, 3, 4, 5)))], [("y", (TensorProto.FLOAT, None))],
                   13)
    assert fo.run(model, {"x": np.zeros((2, 3, 4, 5), np.float32)})["y"].shape == (24, 5)


I64 = TensorProto.INT64

# (operator, opset, attributes, extra integer inputs as initializers) with an axis out of range
# for the rank-2 input: every operator that takes an axis reads it through normalize_axis
OUT_OF_RANGE = [
    ("Softmax", 13, dict(axis=2), []), ("Softmax", 11, dict(axis=-3), []),
    ("LogSoftmax", 13, dict(axis=-3), []), ("LogSoftmax", 12, dict(axis=2), []),
    ("Flatten", 13, dict(axis=3), []), ("Flatten", 13, dict(axis=-3), []),
    ("Concat", 13, dict(axis=2), []), ("Gather", 13, dict(axis=-3), [np.array([0])]),
    ("ReduceSum", 13, {}, [np.array([2])]), ("ReduceMean", 13, dict(axes=[-3]), []),
    ("ReduceMax", 18, {}, [np.array([5])]), ("ReduceSum", 11, dict(axes=[2]), []),
    ("Unsqueeze", 13, {}, [np.array([3])]), ("Unsqueeze", 11, dict(axes=[-4]), []),
    ("Squeeze", 13, {}, [np.array([2])]), ("Squeeze", 11, dict(axes=[-3]), []),
]


@pytest.mark.parametrize("op, opset, attrs, extra", OUT_OF_RANGE,
                         ids=[f"{c[0]}{c[1]}-{i}" for i, c in enumerate(OUT_OF_RANGE)])
def test_axis_out_of_range_names_node_and_range(op, opset, attrs, extra):
    names = [f"k{i}" for i in range(len(extra))]
    inits = [numpy_helper.from_array(a.astype(np.int64), n) for n, a in zip(names, extra)]
    node = helper.make_node(op, ["x"] + names, ["y"], name="the_node", **attrs)
    model = _model([node], [("x", (TensorProto.FLOAT, (3, 1)))],
                   [("y", (TensorProto.FLOAT, ["d"]))], opset, inits)
    with pytest.raises(ValueError, match=rf"node 'the_node' \({op}\): ax[ie]s: -?\d+ is out of "
                                         r"range for a tensor of rank \d \(expected -\d to \d\)"):
        fo.run(model, {"x": np.ones((3, 1), np.float32)})


def test_normalize_axis_helper():
    from fastadam.onnx._core_ops import normalize_axes, normalize_axis
    assert [normalize_axis(a, 3) for a in (-3, -1, 0, 2)] == [0, 2, 0, 2]
    assert normalize_axis(-1, 3, allow_rank=True) == 2
    assert normalize_axis(3, 3, allow_rank=True) == 3
    assert normalize_axes([-1, 0], 4) == (0, 3)
    with pytest.raises(ValueError, match=r"perm: 3 is out of range for a tensor of rank 3 "
                                         r"\(expected -3 to 2\)"):
        normalize_axis(3, 3, "perm")
    with pytest.raises(ValueError, match=r"axes: \[1, -3\] names an axis twice"):
        normalize_axes([1, -3], 4)
    with pytest.raises(TypeError, match="axis: expected an integer axis, got float"):
        normalize_axis(1.0, 3)


# ---------------------------------------------------------------------------------------------
# Cast to float8 (saturate), ReduceMax over an empty set
# ---------------------------------------------------------------------------------------------

FLOAT8 = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"]
SPECIAL = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 300.0, 470.0, -0.0, 0.1, 1e-9, 57000.0,
                    60000.0], np.float32)


@pytest.mark.parametrize("saturate", [0, 1, None])
@pytest.mark.parametrize("to", FLOAT8)
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_to_float8_honours_saturate(to, saturate, src):
    import ml_dtypes
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(src)  # 1e6 is inf in float16
    attrs = {} if saturate is None else dict(saturate=saturate)
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=getattr(TensorProto, to),
                                     **attrs)],
                   [("x", x)], [("y", (getattr(TensorProto, to), x.shape))], 19)
    got = fo.run(model, {"x": x})["y"]
    ref, = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))
    # an independent oracle from ml_dtypes: saturate (the default) clips to the largest finite
    # value before rounding; otherwise the plain conversion (inf or NaN beyond the range)
    top = float(ml_dtypes.finfo(got.dtype).max)
    expected = (np.clip(x.astype(np.float64), -top, top) if saturate in (1, None) else x)
    np.testing.assert_array_equal(got.astype(np.float32),
                                  expected.astype(got.dtype).astype(np.float32))
    if saturate in (1, None):
        assert got.astype(np.float32)[0] == top  # 1e6 becomes the largest finite value


@pytest.mark.skipif(not hasattr(TensorProto, "FLOAT8E8M0"), reason="onnx without FLOAT8E8M0")
@pytest.mark.parametrize("saturate, round_mode", [(1, "up"), (0, "nearest"), (1, "down"),
                                                  (1, "nearest")])
def test_cast_to_float8e8m0_rounds_as_asked(saturate, round_mode):
    x = np.array([1.0, 3.0, 5.0, 0.3, 6e-39, 1e38, 3.4e38], np.float32)
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0,
                                     saturate=saturate, round_mode=round_mode)],
                   [("x", x)], [("y", (TensorProto.FLOAT8E8M0, x.shape))], 24)
    got = fo.run(model, {"x": x})["y"]
    ref, = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_max_over_empty_set_is_the_lowest_value(opset, dtype, keepdims):
    x = np.zeros((2, 0, 4), dtype)
    if opset >= 18:
        node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    else:
        node = helper.make_node("ReduceMax", ["x"], ["y"], keepdims=keepdims, axes=[1])
        inits = []
    model = _model([node], [("x", x)], [("y", (helper.np_dtype_to_tensor_dtype(x.dtype),
                                               None))], opset, inits)
    got = fo.run(model, {"x": x})["y"]
    lowest = (-np.inf if x.dtype.kind == "f" else False if x.dtype.kind == "b"
              else np.iinfo(dtype).min)
    expected = np.full((2, 1, 4) if keepdims else (2, 4), lowest, dtype)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    if opset >= 18 and x.dtype.kind == "f":
        ref, = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_array_equal(got, ref)


def test_reduce_max_over_empty_set_all_axes_and_non_reduced_empty_axis():
    x = np.zeros((0, 3), np.float32)
    model = _model([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], [("x", x)],
                   [("y", (TensorProto.FLOAT, None))], 18)
    assert fo.run(model, {"x": x})["y"].tolist() == -np.inf  # every axis: one empty set
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    model = _model([helper.make_node("ReduceMax", ["x", "axes"], ["y"])], [("x", x)],
                   [("y", (TensorProto.FLOAT, None))], 18, inits)
    assert fo.run(model, {"x": x})["y"].shape == (0, 1)  # no set to reduce: an empty result


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_integer_max_pool_pads_with_the_least_value(dtype):
    """Found by ONNX's node tests (a uint8 MaxPool): padding cast -inf to the integer dtype."""
    lo = np.iinfo(dtype).min
    x = np.full((1, 1, 3, 3), lo + 3, dtype) - np.arange(9, dtype=dtype).reshape(1, 1, 3, 3) % 3
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                     pads=[1, 1, 1, 1])], [("x", x)],
                   [("y", (helper.np_dtype_to_tensor_dtype(x.dtype), (1, 1, 4, 4)))], 12)
    got = fo.run(model, {"x": x})["y"]
    xp = np.pad(x[0, 0], 1, constant_values=lo)  # the oracle: windows over the padded input
    ref = np.array([[xp[i:i + 2, j:j + 2].max() for j in range(4)] for i in range(4)], dtype)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got[0, 0], ref)
    if dtype != np.int32:  # onnxruntime's integer MaxPool: int8 and uint8
        np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    # H: the last window would start in the bottom padding, so it is dropped (3 rows, not 4)
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[3, 2], pads=[1, 1, 1, 1])),
])
def test_ceil_mode_pooling_and_its_gradient_match_torch(op, attrs):
    """ceil_mode=1 (found by ONNX's node tests): forward and the Gradient against torch's
    ceil_mode pooling (float64), float32 forward against onnxruntime."""
    torch = pytest.importorskip("torch")
    x = R.standard_normal((2, 3, 8, 9))
    nodes = [helper.make_node(op, ["x"], ["y"], ceil_mode=1, **attrs),
             helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
             helper.make_node("Gradient", ["x"], ["dx"], domain=TRAIN, xs=["x"], y="loss")]
    model = _model(nodes, [("x", x)], [("y", (TensorProto.DOUBLE, None)),
                                       ("dx", (TensorProto.DOUBLE, x.shape))], 19, training=True)
    out = fo.run(model, {"x": x})
    xt = torch.tensor(x, requires_grad=True)
    padding = attrs.get("pads", [0, 0])[:2]
    if op == "MaxPool":
        y = torch.nn.functional.max_pool2d(xt, attrs["kernel_shape"], attrs["strides"], padding,
                                           dilation=attrs.get("dilations", [1, 1]),
                                           ceil_mode=True)
    else:
        y = torch.nn.functional.avg_pool2d(xt, attrs["kernel_shape"], attrs["strides"], padding,
                                           ceil_mode=True, count_include_pad=False)
    (y * y).sum().backward()
    assert out["y"].shape == tuple(y.shape)
    np.testing.assert_allclose(out["y"], y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out["dx"], xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    x32 = x.astype(np.float32)
    m32 = _model(nodes[:1], [("x", x32)], [("y", (TensorProto.FLOAT, None))], 19)
    np.testing.assert_allclose(fo.run(m32, {"x": x32})["y"], _ort(m32, {"x": x32})[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, attrs", [
    ("Conv", dict(pads=[1, 2], strides=[2], dilations=[2])),
    ("Conv", dict(auto_pad="SAME_UPPER", group=2)),
    ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2], strides=[2], pads=[1, 1])),
])
def test_1d_convolution_and_pooling_match_torch(op, attrs):
    """1-D (N, C, L) windows, run as 2-D with a height of 1: forward and Gradient against
    torch (float64), float32 forward against onnxruntime."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = R.standard_normal((2, 4, 11))
    feeds, names = {"x": x}, ["x"]
    if op == "Conv":
        feeds["w"] = R.standard_normal((6, 4 // attrs.get("group", 1), 3))
        feeds["b"] = R.standard_normal(6)
        names += ["w", "b"]
    nodes = [helper.make_node(op, names, ["y"], **attrs),
             helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
             helper.make_node("Gradient", names, [f"d{n}" for n in names], domain=TRAIN,
                              xs=names, y="loss")]
    model = _model(nodes, list(feeds.items()),
                   [("y", (TensorProto.DOUBLE, None))] +
                   [(f"d{n}", (TensorProto.DOUBLE, a.shape)) for n, a in feeds.items()], 19,
                   training=True)
    out = fo.run(model, feeds)
    ts = {n: torch.tensor(a, requires_grad=True) for n, a in feeds.items()}
    pads = attrs.get("pads", [0, 0])
    xt = F.pad(ts["x"], pads, value=-np.inf if op == "MaxPool" else 0.0)
    if op == "Conv":
        if attrs.get("auto_pad") == "SAME_UPPER":
            xt = F.pad(ts["x"], [1, 1])
        y = F.conv1d(xt, ts["w"], ts["b"], stride=attrs.get("strides", [1]),
                     dilation=attrs.get("dilations", [1]), groups=attrs.get("group", 1))
    elif op == "MaxPool":
        y = F.max_pool1d(ts["x"], 3, 2, padding=1, ceil_mode=True)
    else:  # padding excluded from the divisor
        y = F.avg_pool1d(ts["x"], 2, 2, padding=1, count_include_pad=False)
    (y * y).sum().backward()
    np.testing.assert_allclose(out["y"], y.detach().numpy(), rtol=1e-12, atol=1e-13)
    for n in names:
        np.testing.assert_allclose(out[f"d{n}"], ts[n].grad.numpy(), rtol=1e-11, atol=1e-12)
    f32 = {n: a.astype(np.float32) for n, a in feeds.items()}
    m32 = _model(nodes[:1], list(f32.items()), [("y", (TensorProto.FLOAT, None))], 19)
    np.testing.assert_allclose(fo.run(m32, f32)["y"], _ort(m32, f32)[0], rtol=1e-5, atol=1e-5)


def test_ceil_mode_average_pool_counting_padding_is_refused():
    model = _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                     strides=[2, 2], ceil_mode=1, count_include_pad=1)],
                   [("x", (TensorProto.FLOAT, (1, 1, 8, 8)))], [("y", (TensorProto.FLOAT, None))],
                   19)
    with pytest.raises(fo.UnsupportedOperatorError, match="ceil_mode=1 with count_include_pad=1"):
        fo.run(model, {"x": np.zeros((1, 1, 8, 8), np.float32)})


# ---------------------------------------------------------------------------------------------
# Momentum and Adagrad with T < 0
# ---------------------------------------------------------------------------------------------


def _reference_optimizer(op, attrs, R_, T_, arrays, n_out):
    names = [f"a{i}" for i in range(len(arrays))]
    outs = [f"o{i}" for i in range(n_out)]
    node = helper.make_node(op, ["R", "T"] + names, outs, domain=TRAIN, **attrs)
    inputs = [("R", np.asarray(R_)), ("T", np.asarray(T_))] + list(zip(names, arrays))
    model = _model([node], inputs, [(o, arrays[0]) for o in outs], 17, training=True)
    feeds = {n: np.asarray(a) for n, a in inputs}
    return ReferenceEvaluator(model).run(None, feeds), fo.run(model, feeds)


@pytest.mark.parametrize("T", [-1, -5, 0, 3])
@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum_negative_T_matches_onnx_reference(T, mode):
    x, g, v = (R.standard_normal(6).astype(np.float32) for _ in range(3))
    attrs = dict(alpha=0.9, beta=0.3, mode=mode, norm_coefficient=0.01)
    ref, via_graph = _reference_optimizer("Momentum", attrs, np.float32(0.1), np.int64(T),
                                          [x, g, v], 2)
    got = fo.momentum(np.float32(0.1), np.int64(T), x, g, v, alpha=float(np.float32(0.9)),
                      beta=float(np.float32(0.3)), mode=mode,
                      norm_coefficient=float(np.float32(0.01)))
    for a, b, c in zip(got, ref, via_graph.values()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(a, c)
    # T <= 0 takes beta = 1: v_new = alpha * v + g'
    if T <= 0:
        g2 = g.astype(np.float64) + np.float32(0.01) * x
        np.testing.assert_allclose(got[1], np.float32(0.9) * v.astype(np.float64) + g2,
                                   rtol=1e-6)


@pytest.mark.parametrize("T", [-1, -3, 0, 2])
def test_adagrad_negative_T_matches_onnx_reference(T):
    x, g = (R.standard_normal(6).astype(np.float32) for _ in range(2))
    h = np.abs(R.standard_normal(6)).astype(np.float32)
    attrs = dict(decay_factor=0.1, epsilon=1e-6, norm_coefficient=0.001)
    ref, via_graph = _reference_optimizer("Adagrad", attrs, np.float32(0.1), np.int64(T),
                                          [x, g, h], 2)
    got = fo.adagrad(np.float32(0.1), np.int64(T), x, g, h,
                     **{k: float(np.float32(v)) for k, v in attrs.items()})
    for a, b, c in zip(got, ref, via_graph.values()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(a, c)
    # float64 oracle of the pseudo-code: r = R / (1 + T * decay_factor)
    d = float(np.float32(0.1))
    r = float(np.float32(0.1)) / (1 + T * d)
    g2 = g.astype(np.float64) + float(np.float32(0.001)) * x
    h_new = h + g2 ** 2
    np.testing.assert_allclose(got[0], x - r * g2 / (np.sqrt(h_new) + float(np.float32(1e-6))),
                               rtol=1e-5, atol=1e-7)


def test_adagrad_T_that_divides_by_zero_raises():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"Adagrad: T: -4 with decay_factor 0.25 makes "
                                         r"1 \+ T \* decay_factor = 0"):
        fo.adagrad(np.float32(0.1), np.int64(-4), x, x, x, decay_factor=0.25)


# ---------------------------------------------------------------------------------------------
# the schemas' float32 defaults
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op, attr, value, inputs, opset", [
    ("LeakyRelu", "alpha", 0.01, 1, 16),
    ("BatchNormalization", "epsilon", 1e-5, 5, 15),
])
def test_missing_float_attribute_is_the_schema_float32_default(op, attr, value, inputs, opset,
                                                               dtype):
    args = [R.standard_normal((2, 3, 4)).astype(dtype)]
    if inputs == 5:
        args += [R.standard_normal(3).astype(dtype) for _ in range(3)]
        args += [np.full(3, 1e-6, dtype)]  # a tiny variance: epsilon matters
    names = [f"i{k}" for k in range(inputs)]
    feeds = dict(zip(names, args))
    outs = {}
    for key, attrs in (("default", {}), ("explicit", {attr: value})):
        model = _model([helper.make_node(op, names, ["y"], **attrs)], list(feeds.items()),
                       [("y", (helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), (2, 3, 4)))],
                       opset)
        outs[key] = fo.run(model, feeds)["y"]
        if dtype == np.float32:  # outputs up to ~400 (a tiny variance): float32 rounding
            ref, = _ort(model, feeds)
            np.testing.assert_allclose(outs[key], ref, rtol=1e-5, atol=1e-4)
        else:  # onnx.reference reads the schema's default, a float32 number
            ref, = ReferenceEvaluator(model).run(None, feeds)
            np.testing.assert_allclose(outs[key], ref, rtol=1e-13, atol=1e-15)
    # the explicit attribute is stored as a float32: a node without it computes the same
    np.testing.assert_array_equal(outs["default"], outs["explicit"])


def test_adam_node_without_attributes_matches_the_same_node_with_them():
    x, g, v = (R.standard_normal(5).astype(np.float32) for _ in range(3))
    h = np.abs(R.standard_normal(5)).astype(np.float32)
    args = (np.float32(0.01), np.int64(3), x, g, v, h)
    names = ["R", "T", "x", "g", "v", "h"]
    feeds = dict(zip(names, args))
    out = {}
    for key, attrs in (("default", {}),
                       ("explicit", dict(alpha=0.9, beta=0.999, epsilon=1e-6))):
        model = _model([helper.make_node("Adam", names, ["x2", "v2", "h2"], domain=TRAIN,
                                         **attrs)],
                       [(n, np.asarray(a)) for n, a in feeds.items()],
                       [(n, x) for n in ("x2", "v2", "h2")], 17, training=True)
        out[key] = fo.run(model, feeds)
        ref = ReferenceEvaluator(model).run(None, feeds)
        for a, b in zip(out[key].values(), ref):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for k in out["default"]:
        np.testing.assert_array_equal(out["default"][k], out["explicit"][k])
    fun = fo.adam(*args)  # the function's defaults are the schema's too
    for a, b in zip(fun, out["explicit"].values()):
        np.testing.assert_array_equal(a, b)


def test_optimizer_defaults_are_the_schema_defaults():
    from fastadam.onnx._graph import schema_defaults
    from fastadam.onnx._training_ops import OPTIMIZERS
    for op, entry in OPTIMIZERS.items():
        schema = schema_defaults(op, 1, TRAIN)
        assert {k: v for k, v in entry[4].items() if v is not None} == schema, op
