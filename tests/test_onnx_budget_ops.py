"""Every operator fastadam.onnx runs against the memory budget (issue 41).

The operator table (``fastadam.onnx.supported_operators()``) must equal the rows of
``onnx_fuzz.OPERATOR_CASES``: a new operator fails here until it is classified.  An
"amplifying" operator (its output or scratch memory can be much larger than its inputs) must
refuse each hostile case -- a few KB of model and feeds whose node would allocate tens of MiB --
under a 1 MiB per-tensor budget, with an error naming the node, before allocating: the peak of
the memory tracemalloc sees (NumPy reports its arrays to it) stays under a quarter of what the
node would have allocated.  A "bounded" operator's outputs are no larger than its largest
input, checked on its case."""
import os
import sys
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("onnx")

import fastadam.onnx as fo  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import onnx_fuzz  # noqa: E402
from onnx_fuzz import HOSTILE_BUDGET, OPERATOR_CASES, Case  # noqa: E402

AMPLIFYING = [pytest.param(c, id=c.name) for op, c in onnx_fuzz.hostile_cases()]
BOUNDED = [pytest.param(c, id=c.name) for op, (kind, cases) in OPERATOR_CASES.items()
           if kind == "bounded" for c in cases]


@pytest.fixture
def tiny_budget():
    previous = fo.set_memory_budget(**HOSTILE_BUDGET)
    yield
    fo.set_memory_budget(**previous)


def test_every_operator_is_classified():
    ops = {op for _, op in fo.supported_operators()}
    assert set(OPERATOR_CASES) == ops, (
        f"unclassified: {sorted(ops - set(OPERATOR_CASES))}; "
        f"not operators: {sorted(set(OPERATOR_CASES) - ops)}")
    for op, (kind, cases) in OPERATOR_CASES.items():
        assert kind in ("amplifying", "bounded"), op
        assert cases or op == "Gradient", f"{op}: no case"
        assert all(c.op == op for c in cases), op


@pytest.mark.parametrize("case", AMPLIFYING)
def test_amplifying_operator_refuses_before_allocating(tiny_budget, case):
    model = case.model()
    refusal = case.refusal or r"over the per-tensor budget of 1\.0 MiB"
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"^node 'hostile' \({case.op}\): .*{refusal}"):
            fo.run(model, case.feeds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert case.wants >= 16 << 20
    assert peak < min(case.wants // 4, 4 << 20), f"{case.name}: {peak} bytes traced"


@pytest.mark.parametrize("case", BOUNDED)
def test_bounded_operator_outputs_no_more_than_its_largest_input(case):
    out = case.run()
    largest = max((a.nbytes for a in case.feeds.values()), default=0)
    if case.op == "Constant":  # the value is the model's own bytes
        largest = 16 * 4
    for name, y in out.items():
        assert y.nbytes <= largest + 512, (case.name, name, y.shape, y.dtype)


def test_hostile_counts():
    """What ``python tests/onnx_fuzz.py hostile`` prints: every hostile model refused before
    allocating."""
    tried, refused, peaks = onnx_fuzz.hostile_outcomes()
    assert tried == len(AMPLIFYING) >= 36
    assert refused == tried, {k: v for k, v in peaks.items()}


@pytest.mark.parametrize("name, value", [("limit", np.inf), ("start", -np.inf),
                                         ("delta", np.nan)])
def test_range_of_a_non_finite_input_names_the_node_and_input(name, value):
    feeds = {"start": np.array(0, np.float32), "limit": np.array(10, np.float32),
             "delta": np.array(1, np.float32)}
    feeds[name] = np.array(value, np.float32)
    with pytest.raises(ValueError, match=rf"node 'hostile' \(Range\): {name}: expected a "
                                         rf"finite number, got {value}"):
        Case("Range", feeds).run()


@pytest.mark.parametrize("start, limit, delta", [(-5, 7, 3), (7, -5, -3), (0, 0, 1), (3, 2, 1),
                                                 (0.5, 2.0, 0.25), (-2**62, 2**62, 2**61)])
def test_range_counts_as_numpy(start, limit, delta):
    dtype = np.float32 if isinstance(start, float) else np.int64
    feeds = {k: np.array(v, dtype) for k, v in (("start", start), ("limit", limit),
                                                 ("delta", delta))}
    np.testing.assert_array_equal(Case("Range", feeds).run()["Y0"],
                                  np.arange(start, limit, delta, dtype=dtype))


def test_an_allocation_that_fails_names_the_node(monkeypatch):
    """A MemoryError (an allocation within the budget that the OS refuses) names its node."""
    from fastadam.onnx import _core_ops

    def refuse(attrs, opset):
        def run(inputs):
            raise MemoryError("Unable to allocate 8.0 GiB for an array")
        return run
    monkeypatch.setitem(_core_ops.COMPILERS, "Relu", refuse)
    with pytest.raises(MemoryError, match=r"^node 'hostile' \(Relu\): Unable to allocate"):
        Case("Relu", {"X": np.ones(3, np.float32)}).run()


def test_shape_inputs_longer_than_any_rank_are_refused():
    with pytest.raises(ValueError, match=r"node 'hostile' \(Reshape\): shape: expected at most "
                                         r"64 values, got 100000"):
        Case("Reshape", {"X": np.ones(1, np.float32),
                         "shape": np.ones(100_000, np.int64)}).run()


def test_budgeted_operators_still_compute_what_numpy_computes():
    """Within the budget the checked operators give NumPy's results (a check that refused
    or reshaped a legal input would show here)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 1)).astype(np.float32), rng.standard_normal((1, 4)).astype(
        np.float32)
    ia, ib = a > 0, b > 0
    for op, feeds, expected in [
            ("Sum", {"A": a, "B": b}, a + b), ("Max", {"A": a, "B": b}, np.maximum(a, b)),
            ("Min", {"A": a, "B": b}, np.minimum(a, b)), ("Less", {"A": a, "B": b}, a < b),
            ("And", {"A": ia, "B": ib}, ia & ib),
            ("Gather", {"X": b, "i": np.array([[0, 0], [0, 0]], np.int64)}, b[[[0, 0], [0, 0]]]),
            ("Cast", {"X": ia}, ia.astype(np.float64))]:
        attrs = {"to": 11} if op == "Cast" else {}
        np.testing.assert_array_equal(Case(op, feeds, **attrs).run()["Y0"], expected)
    got = Case("Concat", {"X": a}, inputs=["X"] * 3, axis=1).run()["Y0"]
    np.testing.assert_array_equal(got, np.concatenate([a] * 3, axis=1))
