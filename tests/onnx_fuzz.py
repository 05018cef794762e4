"""Single-byte corruptions of a small ONNX training model (tests/test_onnx_limits.py runs a
sample; ``python tests/onnx_fuzz.py`` runs every byte position and prints the counts), and the
hostile models of every shape-amplifying operator (``OPERATOR_CASES`` below;
``python tests/onnx_fuzz.py hostile`` runs them and exits non-zero unless all are refused).

Each mutation sets one byte of the serialized model to another value (seeded), writes it to a
file and gives the path to ``fastadam.onnx.TrainingSession``, then runs one step and one
inference pass.  An outcome is "accepted" (it trained), "refused" (a clear error: ValueError
that is not a bare Unicode error, TypeError, NotImplementedError, naming what is wrong) or
"other" (any other exception: a raw KeyError, UnicodeDecodeError, DecodeError...)."""
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import fastadam.onnx as fo

CLEAR = (ValueError, TypeError, NotImplementedError)


def small_model():
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((6, 4)) * 0.3).astype(np.float32)
    b = np.zeros(4, np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["z"], name="add"),
             helper.make_node("Relu", ["z"], ["logits"], name="relu")]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return fo.make_training_model(model, lr=1e-2)


FEEDS = {"X": np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6),
         "labels": np.array([1, 3], np.int64)}


def outcome(data, path):
    with open(path, "wb") as f:
        f.write(data)
    try:
        session = fo.TrainingSession(path)
        session.step(FEEDS)
        session.run({"X": FEEDS["X"]})
    except UnicodeError as exc:
        return "other", exc
    except CLEAR as exc:
        return "refused", exc
    except Exception as exc:  # noqa: BLE001 - what the fuzz counts
        return "other", exc
    return "accepted", None


def mutations(data, positions, seed=0):
    rng = np.random.default_rng(seed)
    for i in positions:
        value = int(rng.integers(0, 255))
        value += value >= data[i]  # another value than the original byte
        yield i, data[:i] + bytes([value]) + data[i + 1:]


def fuzz(positions=None, seed=0):
    data = small_model().SerializeToString()
    positions = range(len(data)) if positions is None else positions
    counts = {"accepted": 0, "refused": 0, "other": 0}
    others = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.onnx")
        for i, mutated in mutations(data, positions, seed):
            kind, exc = outcome(mutated, path)
            counts[kind] += 1
            if kind == "other":
                others.append((i, type(exc).__name__, str(exc)[:200]))
    return len(data), counts, others


def _main():
    if sys.argv[1:2] == ["hostile"]:
        tried, refused, peaks = hostile_outcomes()
        print(f"{tried} hostile models, {refused} refused before allocating; largest traced "
              f"peak {max(peaks.values()) / MiB:.2f} MiB ({max(peaks, key=peaks.get)})")
        sys.exit(0 if refused == tried else 1)
    n, counts, others = fuzz(seed=int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(f"{n} bytes, {sum(counts.values())} mutations: {counts}")
    kinds = {}
    for i, name, msg in others:
        kinds.setdefault(name, []).append((i, msg))
    for name, items in kinds.items():
        print(f"  {name}: {len(items)}, e.g. byte {items[0][0]}: {items[0][1]}")


# ---------------------------------------------------------------------------------------------
# hostile models: a few KB of model and feeds whose node would allocate tens of MiB
# ---------------------------------------------------------------------------------------------
#
# Every operator fastadam.onnx runs is a row of OPERATOR_CASES (tests/test_onnx_budget_ops.py
# fails for one that is not): either "amplifying" (its output, or scratch memory it takes, can be
# much larger than its inputs), with hostile cases that must be refused from shapes alone, under
# the tiny HOSTILE_BUDGET, before the allocation; or "bounded" (its outputs are no larger than its
# inputs), with a case that checks so.  ``python tests/onnx_fuzz.py hostile`` runs them all with
# the default budget, under tracemalloc, and prints the counts.

HOSTILE_BUDGET = dict(tensor_bytes=1 << 20, step_bytes=2 << 20)
MiB = 1 << 20
TRAIN = "ai.onnx.preview.training"


class Case:
    """One node named "hostile" over ``feeds`` (name -> array), with ``attrs``; ``inputs``: the
    node's input names (default: the feeds' names; a name may repeat); ``wants``: the bytes the
    node would allocate (amplifying cases); ``refusal``: the error expected of an amplifying
    case (default: the budget's); ``gradient``: the name of an input the model also
    differentiates a sum of the node's output by (so the node's forward pass is recorded)."""

    def __init__(self, op, feeds, wants=None, n_outputs=1, opset=17, domain="", refusal=None,
                 gradient=None, inputs=None, label="", **attrs):
        self.op, self.feeds, self.wants, self.n_outputs = op, feeds, wants, n_outputs
        self.opset, self.domain, self.refusal, self.gradient = opset, domain, refusal, gradient
        self.inputs = list(feeds) if inputs is None else inputs
        self.attrs, self.label = attrs, label

    @property
    def name(self):
        return f"{self.op}{'-' + self.label if self.label else ''}"

    def model(self):
        ins = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), [f"{n}{k}" for k in range(a.ndim)])
            for n, a in self.feeds.items()]
        outs = [f"Y{k}" for k in range(self.n_outputs)]
        nodes = [helper.make_node(self.op, self.inputs, outs, name="hostile",
                                  domain=self.domain, **self.attrs)]
        opsets = [helper.make_opsetid("", self.opset)]
        if self.gradient is not None or self.domain == TRAIN:
            opsets.append(helper.make_opsetid(TRAIN, 1))
        if self.gradient is not None:
            nodes.append(helper.make_node("ReduceSum", ["Y0"], ["loss"], name="loss",
                                          keepdims=0))
            zs = [n for n in self.feeds if n != self.gradient]
            nodes.append(helper.make_node("Gradient", [self.gradient] + zs, ["dX"], name="grad",
                                          domain=TRAIN, xs=[self.gradient], zs=zs, y="loss"))
            outs = ["dX"]
        graph = helper.make_graph(nodes, "hostile", ins, [_declared(o) for o in outs])
        return helper.make_model(graph, opset_imports=opsets)

    def run(self):
        return fo.run(self.model(), self.feeds)


def _declared(name):
    """A graph output as onnx.checker wants one declared (a type and a shape); fastadam.onnx
    checks the feeds against the declared inputs, and the node decides its outputs."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [])


def _f32(*shape, value=1.0):
    return np.full(shape, value, np.float32)


def _i64(*values):
    return np.array(values, np.int64)


def _wide_pair(dtype=np.float32, n=4096):
    """(n, 1) and (1, n): their broadcast is n*n elements (64 MiB of float32 for n = 4096)."""
    return {"A": np.ones((n, 1), dtype), "B": np.ones((1, n), dtype)}


def _wide(op, dtype=np.float32, itemsize=None, **kw):
    return Case(op, _wide_pair(dtype), wants=4096 * 4096 * (itemsize or np.dtype(dtype).itemsize),
                **kw)


def _empty_reduction(op, opset=17, **attrs):
    """An empty (0, 4096, 4096) input reduced over its empty axis: (4096, 4096)."""
    feeds = {"X": np.ones((0, 4096, 4096), np.float32)}
    if op == "ReduceSum" and opset >= 13:
        feeds["axes"] = _i64(0)
    else:
        attrs["axes"] = [0]
    return Case(op, feeds, wants=64 * MiB, opset=opset, keepdims=0, **attrs)


def _window(op, **attrs):
    return Case(op, {"X": _f32(1, 1, 4, 4)}, wants=4004 * 4004 * 4, kernel_shape=[2, 2],
                pads=[2000] * 4, **attrs)


# op_type -> ("amplifying" | "bounded", [cases]); a bounded case's outputs must be no larger
# than its largest input (plus 512 bytes: Shape of an empty tensor)
OPERATOR_CASES = {
    **{op: ("amplifying", [_wide(op)]) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Sum",
                                                 "Max", "Min")},
    **{op: ("amplifying", [_wide(op, itemsize=1)]) for op in ("Equal", "Less", "Greater")},
    **{op: ("amplifying", [_wide(op, np.bool_)]) for op in ("And", "Or")},
    "Where": ("amplifying", [Case("Where", {"C": np.ones((4096, 1), bool),
                                            "A": _f32(1, 4096), "B": _f32(1)},
                                  wants=64 * MiB)]),
    "MatMul": ("amplifying", [
        Case("MatMul", {"A": _f32(4096, 1), "B": _f32(1, 4096)}, wants=64 * MiB),
        # recorded, over a broadcast batch: A's gradient is (256, 256, 256) before the sum
        Case("MatMul", {"A": _f32(1, 256, 256), "B": _f32(256, 256, 1)}, wants=64 * MiB,
             gradient="A", label="gradient"),
    ]),
    "Gemm": ("amplifying", [
        Case("Gemm", {"A": _f32(4096, 1), "B": _f32(1, 4096)}, wants=64 * MiB),
        # a C of more axes than (M, N) broadcast the output up (the spec: C broadcasts to it)
        Case("Gemm", {"A": _f32(16, 3), "B": _f32(3, 16), "C": _f32(65536, 1, 1)},
             wants=64 * MiB, refusal=r"C: shape \(65536, 1, 1\) does not broadcast to the "
                                     r"output shape \(16, 16\)", label="C"),
    ]),
    "ReduceSum": ("amplifying", [_empty_reduction("ReduceSum")]),
    "ReduceMean": ("amplifying", [_empty_reduction("ReduceMean")]),
    "ReduceMax": ("amplifying", [_empty_reduction("ReduceMax")]),
    "GlobalAveragePool": ("amplifying", [Case("GlobalAveragePool",
                                              {"X": np.ones((4096, 4096, 0), np.float32)},
                                              wants=64 * MiB)]),
    "Concat": ("amplifying", [
        Case("Concat", {"X": _f32(1, 65536)}, inputs=["X"] * 256, wants=64 * MiB, axis=0),
    ]),
    "Gather": ("amplifying", [
        Case("Gather", {"X": _f32(1, 65536), "i": np.zeros(256, np.int64)}, wants=64 * MiB,
             axis=0),
        Case("Gather", {"X": np.ones((1, 32768), np.int64), "i": np.zeros(256, np.int64)},
             wants=64 * MiB, axis=0, label="int64"),
    ]),
    "Cast": ("amplifying", [Case("Cast", {"X": np.ones(1 << 21, bool)}, wants=16 * MiB,
                                 to=TensorProto.DOUBLE)]),
    "CastLike": ("amplifying", [Case("CastLike", {"X": np.ones(1 << 21, bool),
                                                  "like": np.ones(1, np.float64)},
                                     wants=16 * MiB)]),
    "Expand": ("amplifying", [Case("Expand", {"X": _f32(1), "shape": _i64(4096, 4096)},
                                   wants=64 * MiB)]),
    "ConstantOfShape": ("amplifying", [Case("ConstantOfShape", {"shape": _i64(4096, 4096)},
                                            wants=64 * MiB)]),
    "Range": ("amplifying", [
        Case("Range", {"start": np.array(0, np.float32), "limit": np.array(1 << 24, np.float32),
                       "delta": np.array(1, np.float32)}, wants=64 * MiB),
        # the difference overflows int64: counted exactly, not wrapped to an empty range
        Case("Range", {"start": np.array(-2**63, np.int64),
                       "limit": np.array(2**63 - 1, np.int64),
                       "delta": np.array(1, np.int64)}, wants=2**67, label="int64-span"),
    ]),
    "Trilu": ("amplifying", [Case("Trilu", {"X": np.ones((0, 4096, 4096), np.float32)},
                                  wants=16 * MiB)]),
    "Conv": ("amplifying", [
        Case("Conv", {"X": _f32(1, 1, 4, 4), "W": _f32(1, 1, 3, 3)}, wants=4004 * 4004 * 4,
             pads=[2000] * 4, label="pads"),
        # a 64x64 kernel over a 128x128 sample: 4096 rows of 65*65 unrolled (69 MB)
        Case("Conv", {"X": _f32(1, 1, 128, 128), "W": _f32(1, 1, 64, 64)},
             wants=4096 * 65 * 65 * 4, label="unrolled"),
    ]),
    "MaxPool": ("amplifying", [_window("MaxPool")]),
    "AveragePool": ("amplifying", [_window("AveragePool")]),
    "LayerNormalization": ("amplifying", [
        # Scale of more axes than the normalised shape: refused (it would broadcast X up)
        Case("LayerNormalization", {"X": _f32(1, 4096), "Scale": _f32(4096, 1),
                                    "B": _f32(4096)}, wants=64 * MiB, n_outputs=2,
             refusal=r"Scale: shape \(4096, 1\) does not broadcast to the normalised shape",
             label="scale"),
    ]),
    # bounded: outputs no larger than the largest input
    **{op: ("bounded", [Case(op, {"X": _f32(64, 64, value=0.5)})])
       for op in ("Neg", "Abs", "Relu", "Sqrt", "Exp", "Log", "Sigmoid", "Tanh", "LeakyRelu",
                  "Erf", "Identity", "Softmax", "LogSoftmax", "Flatten", "Transpose")},
    "Gelu": ("bounded", [Case("Gelu", {"X": _f32(64, 64)}, opset=20)]),
    "Not": ("bounded", [Case("Not", {"X": np.ones((64, 64), bool)})]),
    "Clip": ("bounded", [Case("Clip", {"X": _f32(64, 64), "lo": np.array(0, np.float32),
                                       "hi": np.array(1, np.float32)})]),
    "Reshape": ("bounded", [Case("Reshape", {"X": _f32(64, 64), "shape": _i64(0, -1, 1, 1)})]),
    "Squeeze": ("bounded", [Case("Squeeze", {"X": _f32(1, 64, 1), "axes": _i64(0, 2)})]),
    "Unsqueeze": ("bounded", [Case("Unsqueeze", {"X": _f32(64),
                                                 "axes": _i64(*range(0, 63))})]),
    "Shape": ("bounded", [Case("Shape", {"X": np.ones((0,) * 32, np.float32)})]),
    "Constant": ("bounded", [Case("Constant", {}, value_floats=[1.0] * 16)]),
    "Split": ("bounded", [Case("Split", {"X": _f32(64, 64), "split": _i64(0, 0, 64)},
                               n_outputs=3)]),
    "Slice": ("bounded", [Case("Slice", {"X": _f32(64, 64), "starts": _i64(-1000, 1000),
                                         "ends": _i64(1000, -1000), "axes": _i64(0, 1),
                                         "steps": _i64(1, -1)})]),
    "Dropout": ("bounded", [Case("Dropout", {"X": _f32(64, 64)}, n_outputs=2)]),
    "BatchNormalization": ("bounded", [Case("BatchNormalization", {
        "X": _f32(4, 3, 8, 8), "scale": _f32(3), "B": _f32(3), "mean": _f32(3),
        "var": _f32(3)})]),
    "NegativeLogLikelihoodLoss": ("bounded", [Case("NegativeLogLikelihoodLoss", {
        "X": _f32(8, 5, 6), "t": np.zeros((8, 6), np.int64)}, reduction="none")]),
    "SoftmaxCrossEntropyLoss": ("bounded", [Case("SoftmaxCrossEntropyLoss", {
        "X": _f32(8, 5, 6), "t": np.zeros((8, 6), np.int64)}, n_outputs=2,
        reduction="none")]),
    # the optimizers: new values of their own inputs' shapes (checked equal to X's)
    "Adam": ("bounded", [Case("Adam", {"R": np.array(0.1, np.float32), "T": _i64(1)[0],
                                       "X": _f32(64), "G": _f32(64), "V": _f32(64),
                                       "H": _f32(64)}, n_outputs=3, domain=TRAIN)]),
    "Adagrad": ("bounded", [Case("Adagrad", {"R": np.array(0.1, np.float32), "T": _i64(1)[0],
                                             "X": _f32(64), "G": _f32(64), "H": _f32(64)},
                                 n_outputs=2, domain=TRAIN)]),
    "Momentum": ("bounded", [Case("Momentum", {"R": np.array(0.1, np.float32),
                                               "T": _i64(1)[0], "X": _f32(64), "G": _f32(64),
                                               "V": _f32(64)}, n_outputs=2, domain=TRAIN,
                                  alpha=0.9, beta=1.0, mode="standard",
                                  norm_coefficient=0.0)]),
    # Gradient: one output per x, of x's shape (the backward passes of the operators above
    # are checked with their forward: MatMul's broadcast batch)
    "Gradient": ("bounded", []),
}


def hostile_cases():
    """(op_type, Case) of every amplifying case."""
    return [(op, c) for op, (kind, cases) in OPERATOR_CASES.items() if kind == "amplifying"
            for c in cases]


def hostile_outcomes():
    """Run every amplifying case under HOSTILE_BUDGET and tracemalloc: ``(tried, refused
    before allocating, {case name: peak traced bytes})``; "refused before allocating": an
    error naming the node, with a peak under a quarter of what the node would allocate."""
    import tracemalloc
    tried, refused, peaks = 0, 0, {}
    previous = fo.set_memory_budget(**HOSTILE_BUDGET)
    try:
        for op, case in hostile_cases():
            tried += 1
            named = False
            tracemalloc.start()
            try:
                case.run()
            except (ValueError, MemoryError) as e:
                named = str(e).startswith("node 'hostile'")
            finally:
                peaks[case.name] = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            refused += named and peaks[case.name] < case.wants // 4
    finally:
        fo.set_memory_budget(**previous)
    return tried, refused, peaks


if __name__ == "__main__":
    _main()
