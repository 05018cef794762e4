"""fastadam.onnx limits and messages: the memory budget (checked from shapes before anything is
allocated, naming the node), clear errors for malformed attributes and models, and a sample of
the single-byte corruption fuzz (tests/onnx_fuzz.py) with no raw exception left."""
import os
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx import _budget  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import onnx_fuzz  # noqa: E402

F = TensorProto.FLOAT
GiB = 1 << 30


@pytest.fixture
def budget():
    """A 64 MiB per-tensor and 96 MiB per-step budget for the test, restored after."""
    previous = fo.set_memory_budget(tensor_bytes=64 << 20, step_bytes=96 << 20)
    yield
    fo.set_memory_budget(**previous)


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s)
                                           for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_default_budget_is_a_fraction_of_physical_memory():
    limits = fo.memory_budget()
    memory = _budget.physical_memory()
    assert limits == {"tensor_bytes": int(memory * _budget.TENSOR_FRACTION),
                      "step_bytes": int(memory * _budget.STEP_FRACTION)}
    previous = fo.set_memory_budget(tensor_bytes=123, step_bytes=456)
    try:
        assert fo.memory_budget() == {"tensor_bytes": 123, "step_bytes": 456}
    finally:
        fo.set_memory_budget(**previous)
    assert fo.memory_budget() == limits
    with pytest.raises(ValueError, match="tensor_bytes: expected a positive int"):
        fo.set_memory_budget(tensor_bytes=0)
    with pytest.raises(ValueError, match="step_bytes: expected a positive int"):
        fo.set_memory_budget(step_bytes=1.5)


def test_matmul_outer_product_is_refused_before_allocating(budget):
    """A 1.2 MB model and a 0.8 MB feed whose MatMul asks for 240 GB."""
    W = np.ones((1, 300_000), np.float32)
    m = model([helper.make_node("MatMul", ["X", "W"], ["Y"], name="outer")],
              [("X", ["N", 1])], [("Y", ["N", "M"])], [("W", W)])
    with pytest.raises(fo.MemoryBudgetError,
                       match=r"node 'outer' \(MatMul\): the output of shape \(200000, 300000\) "
                             r"\(float32\) needs 223\.5 GiB, over the per-tensor budget of "
                             r"64\.0 MiB"):
        fo.run(m, {"X": np.ones((200_000, 1), np.float32)})


def test_broadcast_add_is_refused(budget):
    m = model([helper.make_node("Add", ["A", "B"], ["Y"], name="wide")],
              [("A", ["N", 1]), ("B", [1, "M"])], [("Y", ["N", "M"])])
    with pytest.raises(fo.MemoryBudgetError, match=r"node 'wide' \(Add\): the output of shape "
                                                   r"\(100000, 100000\)"):
        fo.run(m, {"A": np.ones((100_000, 1), np.float32),
                   "B": np.ones((1, 100_000), np.float32)})
    # within the budget it runs, and equals NumPy
    a, b = np.arange(3, dtype=np.float32)[:, None], np.arange(4, dtype=np.float32)[None]
    np.testing.assert_array_equal(fo.run(m, {"A": a, "B": b})["Y"], a + b)


def test_conv_padding_is_refused(budget):
    Wc = np.ones((1, 1, 3, 3), np.float32)
    m = model([helper.make_node("Conv", ["X", "W"], ["Y"], name="padded", pads=[10**5] * 4)],
              [("X", [1, 1, 4, 4])], [("Y", [1, 1, "H", "W"])], [("W", Wc)])
    with pytest.raises(fo.MemoryBudgetError,
                       match=r"node 'padded' \(Conv\): the padded input of shape "
                             r"\(1, 1, 200004, 200004\)"):
        fo.run(m, {"X": np.ones((1, 1, 4, 4), np.float32)})
    m = model([helper.make_node("MaxPool", ["X"], ["Y"], name="pool", kernel_shape=[2, 2],
                                pads=[10**5] * 4)], [("X", [1, 1, 4, 4])],
              [("Y", [1, 1, "H", "W"])])
    with pytest.raises(fo.MemoryBudgetError, match=r"node 'pool' \(MaxPool\): the padded input"):
        fo.run(m, {"X": np.ones((1, 1, 4, 4), np.float32)})


def test_negative_pads_are_refused():
    m = model([helper.make_node("Conv", ["X", "W"], ["Y"], name="c", pads=[-1, 0, 0, 0])],
              [("X", [1, 1, 4, 4])], [("Y", [1, 1, "H", "W"])],
              [("W", np.ones((1, 1, 3, 3), np.float32))])
    with pytest.raises(ValueError, match=r"node 'c' \(Conv\): pads, strides, dilations: "
                                         r"expected pads >= 0"):
        fo.run(m, {"X": np.ones((1, 1, 4, 4), np.float32)})


def test_step_budget_counts_every_node_and_changes_nothing(budget):
    """Two 40 MiB broadcasts: each fits the 64 MiB tensor budget, together they pass the 96 MiB
    step budget; the training step is refused at the second, naming it, and no initializer
    changes."""
    n = 3200
    W = np.full((1, n), 0.01, np.float32)
    nodes = [helper.make_node("Add", ["X", "W"], ["h1"], name="first"),
             helper.make_node("Add", ["h1", "W"], ["h2"], name="second"),
             helper.make_node("Add", ["h2", "W"], ["h3"], name="third"),
             helper.make_node("ReduceSum", ["h3"], ["logits"], name="sum", keepdims=0,
                              noop_with_empty_axes=0)]
    m = model(nodes, [("X", ["N", 1])], [("logits", [])], [("W", W)])
    x = np.ones((n, 1), np.float32)
    fo.run(m, {"X": x[:10]})  # small: fine
    with pytest.raises(fo.MemoryBudgetError, match=r"node 'third' \(Add\): the output of shape "
                                                   r"\(3200, 3200\) \(float32, 39\.1 MiB\) brings "
                                                   r"this step to 117\.2 MiB, over the per-step "
                                                   r"budget of 96\.0 MiB"):
        fo.run(m, {"X": x})
    # in a training session: refused before the update, the initializers untouched
    trained = fo.make_training_model(m, loss="mse", lr=0.1)
    session = fo.TrainingSession(trained)
    before = {k: v.copy() for k, v in session.initializers.items()}
    with pytest.raises(fo.MemoryBudgetError, match=r"node 'third' \(Add\)"):
        session.step({"X": x, "labels": np.zeros((), np.float32)})
    for k, v in session.initializers.items():
        np.testing.assert_array_equal(v, before[k])
    session.step({"X": x[:10], "labels": np.zeros((), np.float32)})  # small: trains


def test_cast_to_an_unknown_type_names_the_node_and_field():
    m = model([helper.make_node("Cast", ["X"], ["Y"], name="c", to=9999)], [("X", [2])],
              [("Y", [2])])
    with pytest.raises(ValueError, match=r"node 'c' \(Cast\): to=9999 is not an ONNX tensor "
                                         r"data type"):
        fo.run(m, {"X": np.ones(2, np.float32)})


def test_non_utf8_attribute_names_the_node_and_attribute():
    node = helper.make_node("Conv", ["X", "W"], ["Y"], name="c")
    node.attribute.append(helper.make_attribute("auto_pad", b"\xff\xfe"))
    m = model([node], [("X", [1, 1, 4, 4])], [("Y", [1, 1, "H", "W"])],
              [("W", np.ones((1, 1, 3, 3), np.float32))])
    with pytest.raises(ValueError, match=r"node 'c' \(Conv\): attribute 'auto_pad' is not valid "
                                         r"UTF-8"):
        fo.run(m, {"X": np.ones((1, 1, 4, 4), np.float32)})


def test_input_of_unknown_type_names_it():
    m = model([helper.make_node("Identity", ["X"], ["Y"])], [("X", [2])], [("Y", [2])])
    m.graph.input[0].type.tensor_type.elem_type = 121
    with pytest.raises(ValueError, match="input 'X': elem_type=121 is not an ONNX tensor data "
                                         "type"):
        fo.run(m, {"X": np.ones(2, np.float32)})


def test_corrupt_file_is_a_value_error(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x08\x07\x12\xff\xff\xff\xff\x0f garbage")
    with pytest.raises(ValueError, match="is not a valid ONNX model"):
        fo.TrainingSession(path)


def test_initializer_of_unknown_type_names_it():
    t = numpy_helper.from_array(np.ones(2, np.float32), "W")
    t.data_type = 105
    m = model([helper.make_node("Identity", ["W"], ["Y"])], [], [("Y", [2])])
    m.graph.initializer.append(t)
    with pytest.raises(ValueError, match="initializer 'W' has data_type 105"):
        fo.run(m, {})


def test_single_byte_corruptions_raise_only_clear_errors():
    """Every 6th byte of the serialized training model, set to another value: each mutated
    model trains or is refused with a clear error (``python tests/onnx_fuzz.py`` runs every
    byte: 2845 mutations, 0 other exceptions)."""
    n, counts, others = onnx_fuzz.fuzz(positions=range(0, 2845, 6))
    assert n == 2845
    assert not others, others[:5]
    assert counts["refused"] > 100 and counts["accepted"] > 50


def test_broadcast_shape_equals_numpy():
    rng = np.random.default_rng(0)
    for _ in range(300):
        shapes = [tuple(int(d) for d in rng.choice([1, 2, 3], rng.integers(0, 4)))
                  for _ in range(rng.integers(1, 4))]
        try:
            expected = np.broadcast_shapes(*shapes)
        except ValueError:
            with pytest.raises(ValueError, match="x: operands could not be broadcast"):
                _budget.broadcast_shape("x", *shapes)
        else:
            assert _budget.broadcast_shape("x", *shapes) == expected


def _shape_model(op, extra_inputs, attrs=None, out_type=F):
    """One node whose output shape comes from data: Expand, ConstantOfShape, Range."""
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in extra_inputs]
    node = helper.make_node(op, [n for n, _, _ in extra_inputs], ["Y"], name="big",
                            **(attrs or {}))
    graph = helper.make_graph([node], "g", ins,
                              [helper.make_tensor_value_info("Y", out_type, ["D"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op,inputs,feeds,out_type", [
    ("Expand", [("X", F, [1]), ("S", TensorProto.INT64, [2])],
     {"X": np.ones(1, np.float32), "S": np.array([100_000, 100_000])}, F),
    ("ConstantOfShape", [("S", TensorProto.INT64, [2])],
     {"S": np.array([100_000, 100_000])}, F),
    ("Range", [("A", TensorProto.INT64, []), ("B", TensorProto.INT64, []),
               ("C", TensorProto.INT64, [])],
     {"A": np.array(0), "B": np.array(10 ** 12), "C": np.array(1)}, TensorProto.INT64),
])
def test_shape_from_data_is_refused_before_allocating(budget, op, inputs, feeds, out_type):
    m = _shape_model(op, inputs, out_type=out_type)
    with pytest.raises(fo.MemoryBudgetError, match=rf"node 'big' \({op}\): the output of shape"):
        fo.run(m, feeds)
