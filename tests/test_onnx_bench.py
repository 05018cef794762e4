"""The ONNX benchmark workload (asv_bench/benchmarks/bench_onnx.py) trains the same MLP in every
implementation (so the report compares like with like), at a toy size."""
import os
import sys

import pytest

pytest.importorskip("onnx")
pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "asv_bench", "benchmarks"))
import bench_onnx as B  # noqa: E402


def test_session_hand_written_and_torch_train_alike():
    B.check_same_training((12, 8, 3), 5, steps=4)
