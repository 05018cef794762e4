"""fastadam.optim.prepare_step: checks once, folds and calls per step; equal bit for bit to the
functional step of every optimizer of the table; errors named, nothing written."""
import numpy as np
import pytest

import fastadam
from fastadam.optim import prepare_step
from optimizer_table import ELEMENT_CASES as CASES, case_id  # row-wise: no prepared step


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prepared_step_equals_the_functional_step(rng, case):
    info, options = case
    shapes = [(7,), (2, 9)]
    names = info.slots(options)
    x = [rng.standard_normal(s) for s in shapes]
    state = {n: [np.abs(rng.standard_normal(s)) for s in shapes] for n in names}
    want_x = [a.copy() for a in x]
    want = {n: [a.copy() for a in lst] for n, lst in state.items()}
    prepared = prepare_step(info.name, x, state, num_threads=1)
    for t in range(info.first_t, info.first_t + 3):
        g = [rng.standard_normal(s) for s in shapes]
        assert prepared.step(g, t, **options) is True
        info.dense(want_x, g, want, t, **options)
    for a, b in zip(x, want_x):
        np.testing.assert_array_equal(a, b)
    for n in names:
        for a, b in zip(state[n], want[n]):
            np.testing.assert_array_equal(a, b, err_msg=n)


def test_check_folds_without_writing():
    x, m = np.ones(3, np.float32), np.zeros(3, np.float32)
    prepared = prepare_step("lion", x, {"m": m})
    c = prepared.check(lr=0.5, weight_decay=0.1)
    assert c.as_dict()["decay_mul"] == 1.0 - 0.05
    np.testing.assert_array_equal(x, 1)
    with pytest.raises(ValueError, match=r"^lr: 1e\+40 overflows float32"):
        prepared.check(lr=1e40)  # the arrays' precision is known once prepared
    with pytest.raises(ValueError, match=r"^beta1: expected 0 <= beta1 <= 1"):
        prepared.step(np.ones(3, np.float32), 1, beta1=2.0)
    np.testing.assert_array_equal(x, 1)


def test_errors_name_the_argument_and_change_nothing():
    x, m, v = np.ones(4), np.zeros(4), np.zeros(4)
    with pytest.raises(ValueError, match=r"^optimizer: expected one of"):
        prepare_step("adamax", x, {"m": m})
    with pytest.raises(ValueError, match=r"^slots: unknown state 'w' for adam"):
        prepare_step("adam", x, {"m": m, "w": v})
    with pytest.raises(ValueError, match=r"overlap"):
        prepare_step("adam", x, {"m": m, "v": m})
    with pytest.raises(ValueError, match=r"read-only|writable"):
        ro = np.zeros(4)
        ro.flags.writeable = False
        prepare_step("adam", x, {"m": ro, "v": v})
    prepared = prepare_step("adam", x, {"m": m, "v": v})
    with pytest.raises(ValueError, match=r"^v_max: these options of adam need the state"):
        prepared.step(np.ones(4), 1, amsgrad=True)
    with pytest.raises(TypeError, match=r"^grads: expected dtype float64"):
        prepared.step(np.ones(4, np.float32), 1)
    with pytest.raises(ValueError, match=r"^grads: expected shape \(4,\)"):
        prepared.step(np.ones(5), 1)
    with pytest.raises(ValueError, match=r"overlap"):
        prepared.step(m, 1)  # the gradient is one of the written arrays
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(m, 0)


def test_skip_nonfinite_and_lists():
    xs = [np.ones(3), np.ones(2)]
    hs = [np.zeros(3), np.zeros(2)]
    prepared = prepare_step("adagrad", xs, {"h": hs})
    assert prepared.step([np.ones(3), np.array([np.nan, 1.0])], 1, skip_nonfinite=True) is False
    np.testing.assert_array_equal(xs[0], 1)
    with pytest.raises(ValueError, match=r"^grads: expected 2 like params, got 1"):
        prepared.step([np.ones(3)], 1)
    assert prepared.step([np.ones(3), np.ones(2)], 1, lr=0.1) is True
    want = np.ones(3)
    fastadam.adagrad_step_inplace(want, np.ones(3), np.zeros(3), 1, lr=0.1)
    np.testing.assert_array_equal(xs[0], want)


def test_the_objects_single_call_path_is_chosen_from_the_gradients_headers():
    from fastadam._core._validation import plain_gradients
    xs = [np.zeros(4, np.float32), np.zeros((2, 3), np.float32)]
    good = [np.ones(4, np.float32), np.ones((2, 3), np.float32)]
    assert plain_gradients(good, xs)
    bad = [
        [np.ones(4, np.float64), good[1]],                      # dtype
        [good[0], np.ones((3, 2), np.float32)],                 # shape
        [good[0], np.ones((2, 6), np.float32)[:, ::2]],         # not contiguous
        [np.ones(4, np.float32).astype(">f4"), good[1]],        # byte order
        [np.ma.masked_array(good[0]), good[1]],                 # a subclass
        [None, good[1]],
        good[:1],
    ]
    for grads in bad:
        assert not plain_gradients(grads, xs)
    # and such gradients still step, by the general path
    opt = fastadam.Adam([np.zeros((2, 3))], lr=0.1)
    assert opt.step([np.ones((2, 6))[:, ::2]]) is True
