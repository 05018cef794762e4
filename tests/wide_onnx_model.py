"""A wide two-layer ONNX training model (about 2 MiB of float32 weights, more than the 1 MiB
file-size limit of tests/test_onnx_save_atomic.py), used there and in its subprocesses."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import fastadam.onnx as fo

def training_session(hidden=8192):
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((hidden, 64)) * 0.1).astype(np.float32)
    V = (rng.standard_normal((3, hidden)) * 0.01).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "Wt"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "Vt"], ["logits"])]
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W.T.copy(), "Wt"), numpy_helper.from_array(V.T.copy(), "Vt")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return fo.TrainingSession(fo.make_training_model(model, lr=1e-2))

def feeds(seed):
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((8, 64)).astype(np.float32),
            "labels": rng.integers(0, 3, 8).astype(np.int64)}
