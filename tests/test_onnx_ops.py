"""Forward results of every supported core operator against onnxruntime (onnx.reference where
onnxruntime is missing), on random inputs, in the forms of several opsets."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

R = np.random.default_rng(7)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def pos(*shape):
    return (np.abs(R.standard_normal(shape)) + 0.1).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


def labels(n, c, *rest):
    return R.integers(0, c, (n,) + rest).astype(np.int64)


# (id, op_type, inputs (ndarrays; None = omitted; ("init", a) = an initializer), attributes,
#  opset, number of outputs)
CASES = [
    ("add", "Add", [f32(3, 4), f32(4)], {}, 17, 1),
    ("add_int", "Add", [i64(1, 2, 3), i64(4, 5, 6)], {}, 17, 1),
    ("sub", "Sub", [f32(2, 3), f32(2, 1)], {}, 13, 1),
    ("mul", "Mul", [f32(5), f32(5)], {}, 7, 1),
    ("div", "Div", [f32(2, 3), pos(3)], {}, 14, 1),
    ("div_int", "Div", [i64(7, -7, 9, -9), i64(2, 2, -4, -4)], {}, 14, 1),
    ("neg", "Neg", [f32(4, 2)], {}, 13, 1),
    ("pow", "Pow", [pos(3, 4), f32(4)], {}, 15, 1),
    ("pow_int_exponent", "Pow", [pos(3), i64(2, 3, 1)], {}, 15, 1),
    ("sqrt", "Sqrt", [pos(6)], {}, 13, 1),
    ("exp", "Exp", [f32(2, 3)], {}, 13, 1),
    ("log", "Log", [pos(2, 3)], {}, 13, 1),
    ("abs", "Abs", [f32(7)], {}, 13, 1),
    ("matmul", "MatMul", [f32(2, 3, 4), f32(4, 5)], {}, 13, 1),
    ("matmul_vec", "MatMul", [f32(4), f32(4, 5)], {}, 13, 1),
    ("gemm", "Gemm", [f32(3, 4), f32(5, 4), f32(5)], dict(transB=1, alpha=0.5, beta=2.0), 13, 1),
    ("gemm_transA", "Gemm", [f32(4, 3), f32(4, 5)], dict(transA=1), 11, 1),
    ("conv", "Conv", [f32(2, 3, 7, 6), f32(4, 3, 3, 3), f32(4)], dict(pads=[1, 1, 1, 1]), 11, 1),
    ("conv_strided_dilated", "Conv", [f32(1, 2, 9, 8), f32(3, 2, 2, 3)],
     dict(strides=[2, 1], dilations=[2, 1]), 11, 1),
    ("conv_asym_pads", "Conv", [f32(1, 2, 6, 6), f32(2, 2, 3, 3)], dict(pads=[0, 1, 2, 1]), 11, 1),
    ("conv_groups", "Conv", [f32(1, 4, 5, 5), f32(6, 2, 3, 3)], dict(group=2), 11, 1),
    ("conv_same_upper", "Conv", [f32(1, 2, 7, 7), f32(2, 2, 4, 4)],
     dict(auto_pad="SAME_UPPER", strides=[2, 2]), 11, 1),
    ("relu", "Relu", [f32(3, 5)], {}, 14, 1),
    ("leaky_relu", "LeakyRelu", [f32(3, 5)], dict(alpha=0.2), 16, 1),
    ("leaky_relu_default", "LeakyRelu", [f32(8)], {}, 16, 1),
    ("sigmoid", "Sigmoid", [f32(3, 5)], {}, 13, 1),
    ("tanh", "Tanh", [f32(3, 5)], {}, 13, 1),
    ("softmax13", "Softmax", [f32(2, 3, 4)], dict(axis=1), 13, 1),
    ("softmax13_default", "Softmax", [f32(2, 3, 4)], {}, 13, 1),
    ("softmax11_coerced", "Softmax", [f32(2, 3, 4)], {}, 11, 1),
    ("logsoftmax13", "LogSoftmax", [f32(3, 6)], {}, 13, 1),
    ("logsoftmax11_axis2", "LogSoftmax", [f32(2, 3, 4)], dict(axis=2), 11, 1),
    ("sce_mean", "SoftmaxCrossEntropyLoss", [f32(6, 5), labels(6, 5)], {}, 13, 1),
    ("sce_sum_weights", "SoftmaxCrossEntropyLoss", [f32(6, 5), labels(6, 5), pos(5)],
     dict(reduction="sum"), 13, 1),
    ("sce_nd_ignore_logprob", "SoftmaxCrossEntropyLoss", [f32(3, 4, 2), labels(3, 4, 2)],
     dict(ignore_index=1), 13, 2),
    ("sce_none", "SoftmaxCrossEntropyLoss", [f32(5, 3), labels(5, 3)], dict(reduction="none"),
     13, 1),
    ("nll_mean_weights", "NegativeLogLikelihoodLoss", [f32(5, 4), labels(5, 4), pos(4)], {}, 13,
     1),
    ("nll_nd_none", "NegativeLogLikelihoodLoss", [f32(2, 3, 4), labels(2, 3, 4)],
     dict(reduction="none"), 13, 1),
    ("reducesum13", "ReduceSum", [f32(2, 3, 4), i64(1, -1)], dict(keepdims=0), 13, 1),
    ("reducesum11_attr", "ReduceSum", [f32(2, 3, 4)], dict(axes=[0]), 11, 1),
    ("reducesum13_all", "ReduceSum", [f32(2, 3)], {}, 13, 1),
    ("reducemean13_attr", "ReduceMean", [f32(2, 3, 4)], dict(axes=[2], keepdims=0), 13, 1),
    ("reducemean18_input", "ReduceMean", [f32(2, 3, 4), i64(0, 2)], {}, 18, 1),
    ("reducemax13", "ReduceMax", [f32(2, 3, 4)], dict(axes=[1]), 13, 1),
    ("reducemax18", "ReduceMax", [f32(2, 3, 4), i64(-1)], dict(keepdims=0), 18, 1),
    ("reshape", "Reshape", [f32(2, 3, 4), i64(0, -1)], {}, 14, 1),
    ("transpose", "Transpose", [f32(2, 3, 4)], dict(perm=[2, 0, 1]), 13, 1),
    ("transpose_default", "Transpose", [f32(2, 3, 4)], {}, 13, 1),
    ("flatten", "Flatten", [f32(2, 3, 4, 5)], dict(axis=2), 13, 1),
    ("flatten_default", "Flatten", [f32(2, 3, 4)], {}, 13, 1),
    ("concat", "Concat", [f32(2, 3), f32(2, 1)], dict(axis=-1), 13, 1),
    ("gather0", "Gather", [f32(5, 3), i64(0, 4, -1, 2)], {}, 13, 1),
    ("gather_axis1_2d_indices", "Gather", [f32(2, 5, 3), np.array([[1, -2], [0, 0]])],
     dict(axis=1), 13, 1),
    ("identity", "Identity", [f32(3)], {}, 16, 1),
    ("cast_to_double", "Cast", [f32(4)], dict(to=TensorProto.DOUBLE), 13, 1),
    ("cast_to_int", "Cast", [f32(4) * 10], dict(to=TensorProto.INT64), 13, 1),
    ("where", "Where", [R.random((3, 4)) > 0.5, f32(3, 4), f32(4)], {}, 16, 1),
    ("clip11", "Clip", [f32(10), np.float32(-0.5), np.float32(0.3)], {}, 13, 1),
    ("clip_min_only", "Clip", [f32(10), np.float32(-0.2)], {}, 13, 1),
    ("clip6_attrs", "Clip", [f32(10)], dict(min=-0.1, max=0.2), 7, 1),
    ("shape", "Shape", [f32(2, 3, 4)], {}, 13, 1),
    ("shape15_slice", "Shape", [f32(2, 3, 4)], dict(start=1, end=-1), 15, 1),
    ("unsqueeze13", "Unsqueeze", [f32(3, 4), i64(0, -1)], {}, 13, 1),
    ("unsqueeze11_attr", "Unsqueeze", [f32(3, 4)], dict(axes=[1]), 11, 1),
    ("squeeze13", "Squeeze", [f32(3, 1, 4, 1), i64(1)], {}, 13, 1),
    ("squeeze13_all", "Squeeze", [f32(1, 3, 1)], {}, 13, 1),
    ("squeeze11_attr", "Squeeze", [f32(3, 1, 4)], dict(axes=[1]), 11, 1),
    ("maxpool", "MaxPool", [f32(2, 3, 8, 7)], dict(kernel_shape=[2, 2], strides=[2, 2]), 12, 1),
    ("maxpool_pads_dilation", "MaxPool", [f32(1, 2, 7, 7)],
     dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], dilations=[2, 1]), 12, 1),
    ("maxpool_same_lower", "MaxPool", [f32(1, 2, 6, 5)],
     dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER"), 12, 1),
    ("avgpool", "AveragePool", [f32(2, 3, 6, 6)], dict(kernel_shape=[3, 3], strides=[3, 3]), 19,
     1),
    ("avgpool_pads_exclude", "AveragePool", [f32(1, 2, 5, 5)],
     dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 19, 1),
    ("avgpool_pads_include", "AveragePool", [f32(1, 2, 5, 5)],
     dict(kernel_shape=[2, 3], pads=[1, 1, 0, 1], count_include_pad=1), 19, 1),
    ("global_avgpool", "GlobalAveragePool", [f32(2, 3, 4, 5)], {}, 13, 1),
    ("batchnorm", "BatchNormalization", [f32(2, 3, 4, 4), f32(3), f32(3), f32(3), pos(3)],
     dict(epsilon=1e-3), 15, 1),
    ("batchnorm9", "BatchNormalization", [f32(2, 3, 5), f32(3), f32(3), f32(3), pos(3)], {}, 9, 1),
]


def _model(op, inputs, attrs, opset, n_out):
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    # integer operands after the first (axes, shapes, indices) are initializers, so that shape
    # inference can type the outputs
    inits = [numpy_helper.from_array(np.asarray(a), n) for i, (n, a) in
             enumerate(zip(names, inputs)) if i and n and np.asarray(a).dtype == np.int64]
    init_names = {t.name for t in inits}
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype),
                                         np.shape(a))
           for n, a in zip(names, inputs) if n and n not in init_names]
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name="the_node", **attrs)
    graph = helper.make_graph([node], op, vis, [helper.make_empty_tensor_value_info(o)
                                                for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)  # fills in the outputs' types
    feeds = {n: np.asarray(a) for n, a in zip(names, inputs) if n and n not in init_names}
    return model, feeds


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_onnxruntime(case):
    _, op, inputs, attrs, opset, n_out = case
    model, feeds = _model(op, inputs, attrs, opset, n_out)
    got = fo.run(model, feeds)
    try:
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime lacks this operator form
        if "onnxruntime" in str(type(e).__module__) or "NOT_IMPLEMENTED" in str(e):
            from onnx.reference import ReferenceEvaluator
            ref = ReferenceEvaluator(model).run(None, feeds)
        else:
            raise
    for i, r in enumerate(ref):
        g = got[f"out{i}"]
        assert g.dtype == r.dtype, (g.dtype, r.dtype)
        assert g.shape == r.shape, (g.shape, r.shape)
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


def test_every_listed_operator_is_tested():
    from fastadam.onnx._core_ops import OPERATORS
    from test_onnx_transformer_ops import TESTED_HERE  # the transformer operators' own file
    tested = {c[1] for c in CASES} | {"Constant"} | TESTED_HERE
    assert set(OPERATORS) == tested


def test_constant_forms():
    nodes = [helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(f32(2, 2))),
             helper.make_node("Constant", [], ["b"], value_floats=[1.0, 2.5]),
             helper.make_node("Constant", [], ["c"], value_int=3),
             helper.make_node("Constant", [], ["d"], value_ints=[4, 5])]
    graph = helper.make_graph(nodes, "c", [], [helper.make_empty_tensor_value_info(n)
                                               for n in "abcd"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    got = fo.run(model, {})
    from onnx.reference import ReferenceEvaluator
    for name, ref in zip("abcd", ReferenceEvaluator(model).run(None, {})):
        assert got[name].dtype == ref.dtype
        np.testing.assert_array_equal(got[name], ref)


def test_graph_of_shape_ops_matches_onnxruntime():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx.export writes Flatten."""
    ort = pytest.importorskip("onnxruntime")
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["zero"], value_int=0),
             helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Constant", [], ["ax"], value_ints=[0]),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Constant", [], ["m1"], value_ints=[-1]),
             helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Relu", ["flat"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = f32(4, 2, 3)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(fo.run(model, {"x": x})["y"], ref)
