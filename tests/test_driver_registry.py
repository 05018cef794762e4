"""The driver registry (fastadam/_core/_drivers.py): the second axis of a step as data.

A plan (``fastadam.optim.prepare_step``) takes the row of its arrays' (device, parameter format,
state format); a device and its drivers are registered through the public seam
``fastadam.drivers``, and then every front-end built on plans (the optimizer objects included)
steps through them with no other change."""
import numpy as np
import pytest

import fastadam
from fastadam import drivers
from fastadam._core import _drivers
from fastadam.optim import prepare_step

BF16 = pytest.importorskip("ml_dtypes").bfloat16


def test_each_format_takes_its_row():
    x32 = np.ones(8, np.float32)
    xb = np.ones(8, BF16)
    cases = [
        ((x32, {"m": np.zeros(8, np.float32), "v": np.zeros(8, np.float32)}),
         ("cpu", "float", "float")),
        ((np.ones(8), {"m": np.zeros(8), "v": np.zeros(8)}), ("cpu", "float", "float")),
        ((x32, {"m": np.zeros(8, BF16), "v": np.zeros(8, BF16)}), ("cpu", "float", "bfloat16")),
        ((xb, {"m": np.zeros(8, np.float32), "v": np.zeros(8, np.float32)}),
         ("cpu", "bfloat16", "float")),
        ((xb, {"m": fastadam.optim.QuantizedState.zeros(8, 8, "dynamic", True),
               "v": fastadam.optim.QuantizedState.zeros(8, 8, "dynamic", False)}),
         ("cpu", "bfloat16", "int8")),
    ]
    for (x, slots), key in cases:
        plan = prepare_step("adam", x, slots, block_size=8)
        assert plan.driver == key
        assert plan.run(np.ones(8, x.dtype), 1, lr=0.1)
    keys = {(r.device, r.param_format, r.state_format) for r in drivers.driver_rows()}
    assert {("cpu", p, s) for p in ("float", "bfloat16") for s in ("float", "bfloat16", "int8")
            } <= keys
    assert ("gpu", "float", "float") in keys  # fastadam.gpu registers its own rows


def test_a_key_nobody_registered_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(_drivers._ROWS, ("cpu", "bfloat16", "int8"))
    with pytest.raises(TypeError, match=r"^params: no driver steps bfloat16 parameters with "
                                        r"int8 states on the cpu"):
        prepare_step("adam", np.ones(8, BF16),
                     {"m": fastadam.optim.QuantizedState.zeros(8, 8, "dynamic", True),
                      "v": fastadam.optim.QuantizedState.zeros(8, 8, "dynamic", False)},
                     block_size=8)


class Tagged(np.ndarray):
    """The arrays of a device registered by the test."""


def test_a_new_device_is_one_registered_row_for_every_front_end(monkeypatch):
    """A device registered through fastadam.drivers (its arrays told apart by ``claims``, one
    driver row) is what the plans and the optimizer objects step through: the row's driver
    sees every step, and the result is the CPU's, bit for bit."""
    monkeypatch.setattr(_drivers, "_DEVICES", list(_drivers._DEVICES))
    monkeypatch.setattr(_drivers, "_ROWS", dict(_drivers._ROWS))
    cpu_float = _drivers.find_driver("cpu", "float", "float").prepare
    runs = []

    class Recorder:
        """A driver of the test device: the CPU float driver on the arrays' NumPy views."""

        def __init__(self, spec, params, slots, options):
            plain = [p.view(np.ndarray) for p in params]
            self.inner = cpu_float(spec, plain, {k: [a.view(np.ndarray) for a in v]
                                                 for k, v in slots.items()}, options)
            self.xs, self.slot_names = self.inner.xs, self.inner.slot_names
            self.arrays = None  # no header-only gradient check: the general step runs
            self.lists_by_flags = self.inner.lists_by_flags

        def lists(self, names):
            return self.inner.lists(names)

        def check(self, coeffs):
            self.inner.check(coeffs)

        def run(self, coeffs, grads, key, skip):
            runs.append(len(grads))
            return self.inner.run(coeffs, [g.view(np.ndarray) for g in grads], key, skip)

        def run_sparse(self, coeffs, names, k, grad, t, mode, key):
            runs.append("sparse")
            return self.inner.run_sparse(coeffs, names, k, grad, t, mode, key)

    drivers.register_device("test", lambda a: isinstance(a, Tagged), lambda a: "float")
    drivers.register_driver("test", "float", "float", Recorder)
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((6, 4)).astype(np.float32)
    tagged, plain = x0.copy().view(Tagged), x0.copy()
    a, b = fastadam.Adam([tagged], lr=0.1), fastadam.Adam([plain], lr=0.1)
    assert a._plans[0].driver == ("test", "float", "float")
    for k in range(3):
        g = rng.standard_normal(x0.shape).astype(np.float32)
        assert a.step([g.view(Tagged)]) and b.step([g])
    rows = fastadam.IndexedSlices(np.ones((2, 4), np.float32), np.array([1, 4]), (6, 4))
    assert a.step([rows]) and b.step([rows])
    assert runs == [1, 1, 1, "sparse"]
    assert tagged.tobytes() == plain.tobytes()
    for name in ("m", "v"):
        assert a.state(0)[name].tobytes() == b.state(0)[name].tobytes()


def test_the_core_does_not_import_the_gpu_package():
    import ast
    import pathlib
    root = pathlib.Path(fastadam.__file__).parent / "_core"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(("gpu", "..gpu", "fastadam.gpu")), path
                assert not (node.level >= 2 and (node.module or "").startswith("gpu")), path
