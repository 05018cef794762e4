"""Single-byte corruptions of a small ONNX training model (tests/test_onnx_limits.py runs a
sample; ``python tests/onnx_fuzz.py`` runs every byte position and prints the counts).

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


if __name__ == "__main__":
    n, counts, others = fuzz(seed=int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(f"{n} bytes, {sum(counts.values())} mutations: {counts}")
    kinds = {}
    for i, name, msg in others:
        kinds.setdefault(name, []).append((i, msg))
    for name, items in kinds.items():
        print(f"  {name}: {len(items)}, e.g. byte {items[0][0]}: {items[0][1]}")
