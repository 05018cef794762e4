"""accelerate_mlp() under KeyboardInterrupt: raised from a sys.settrace trace function at every
line of fastadam/sklearn/_accelerate.py that entering and leaving the block run (one position
per try), scikit-learn is never left patched or half patched once the block is gone, and is
wholly patched whenever the block's body runs."""
import sys

import pytest

pytest.importorskip("sklearn")
from sklearn.neural_network import _multilayer_perceptron as sk_mlp  # noqa: E402
from sklearn.neural_network import _stochastic_optimizers as sk_opt  # noqa: E402

from fastadam.sklearn import _accelerate  # noqa: E402
from fastadam.sklearn import _sk_backprop  # noqa: E402

BASE = sk_mlp.BaseMultilayerPerceptron
STOCK_OPTIMIZER = sk_opt.AdamOptimizer
STOCK_FIT = BASE.__dict__["_fit_stochastic"]


def sklearn_state():
    optimizer = sk_mlp.AdamOptimizer
    fit = BASE.__dict__.get("_fit_stochastic")
    if optimizer is STOCK_OPTIMIZER and fit is STOCK_FIT:
        return "stock"
    if optimizer is _accelerate.AdamOptimizer and fit is _sk_backprop.fit_stochastic:
        return "patched"
    return "half patched"


def interrupted_at(k, body):
    """Run ``body()`` with KeyboardInterrupt raised at the k-th line event in _accelerate.py
    (the finalizer, which recovers from an interrupt, is not interrupted itself); returns
    (interrupted, number of line events seen)."""
    seen = [0]

    def local(frame, event, arg):
        if event == "line" and frame.f_code.co_name != "__del__":  # the recovery path
            seen[0] += 1
            if seen[0] == k:
                raise KeyboardInterrupt(f"injected at line {frame.f_lineno}")
        return local

    def global_trace(frame, event, arg):
        return local if frame.f_code.co_filename == _accelerate.__file__ else None

    previous = sys.gettrace()
    sys.settrace(global_trace)
    try:
        body()
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(previous)
    # no gc.collect(): the finalizer must run as the exception unwinds (reference counting)
    return interrupted, seen[0]


def sweep(body, after):
    """Interrupt ``body`` at every line position in turn until one run sees no interrupt;
    ``after()`` checks the state after each run.  Returns the number of positions."""
    k = 1
    while True:
        interrupted, seen = interrupted_at(k, body)
        after(k, interrupted)
        if not interrupted:
            assert seen < k
            return k - 1
        k += 1


def test_every_line_of_enter_and_exit():
    inside = []

    def body():
        with _accelerate.accelerate_mlp():
            inside.append(sklearn_state())

    def after(k, interrupted):
        assert sklearn_state() == "stock", f"interrupt at line event {k}"
        assert _accelerate._PatchState.now == (0, None)
        assert all(s == "patched" for s in inside)

    positions = sweep(body, after)
    assert positions >= 20  # enter (the contract check included) and exit were swept
    assert inside  # the body ran in the runs interrupted in __exit__


def test_every_line_of_a_nested_block():
    def body():
        with _accelerate.accelerate_mlp():
            assert sklearn_state() == "patched"

    def after(k, interrupted):
        assert sklearn_state() == "patched", f"interrupt at line event {k}"
        assert _accelerate._PatchState.now[0] == 1

    with _accelerate.accelerate_mlp():
        assert sweep(body, after) >= 20
    assert sklearn_state() == "stock" and _accelerate._PatchState.now == (0, None)


def test_a_block_object_opens_once():
    block = _accelerate.accelerate_mlp()
    with block:
        with pytest.raises(RuntimeError, match="already open"):
            block.__enter__()
        assert sklearn_state() == "patched"
    assert sklearn_state() == "stock"
