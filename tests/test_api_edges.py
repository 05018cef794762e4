"""Edges a user hits at the API boundary: 0-d arrays as numbers (what JAX/optax schedules
return), and post_decay outside [0, 1) refused instead of flipping the parameters' sign."""
import numpy as np
import pytest

import fastadam


def arrays():
    x = np.linspace(-1, 1, 8).astype(np.float32)
    return x, np.full_like(x, 0.5), np.zeros_like(x), np.zeros_like(x)


@pytest.mark.parametrize("lr", [np.array(0.01), np.array(0.01, np.float32), np.float32(0.01)])
def test_zero_d_array_learning_rate_equals_the_float(lr):
    x, g, m, v = arrays()
    y, _, n, w = arrays()
    fastadam.step_inplace(x, g, m, v, 1, lr=lr)
    fastadam.step_inplace(y, g, n, w, 1, lr=float(lr))
    np.testing.assert_array_equal(x, y)


def test_schedule_returning_zero_d_array():
    x, g, _, _ = arrays()
    y = x.copy()
    fastadam.Adam([x], lr=lambda k: np.array(0.01) / (1 + k)).step([g])
    fastadam.Adam([y], lr=lambda k: 0.01 / (1 + k)).step([g])
    np.testing.assert_array_equal(x, y)


def test_non_scalar_array_learning_rate_still_refused():
    x, g, m, v = arrays()
    with pytest.raises(TypeError, match="lr"):
        fastadam.step_inplace(x, g, m, v, 1, lr=np.array([0.01]))


@pytest.mark.parametrize("post_decay", [1.0, 2.0, -0.1])
def test_post_decay_out_of_range_refused_before_any_write(post_decay):
    x, g, m, v = arrays()
    before = x.copy()
    with pytest.raises(ValueError, match="post_decay: expected 0 <= post_decay < 1"):
        fastadam.step_inplace(x, g, m, v, 1, post_decay=post_decay)
    np.testing.assert_array_equal(x, before)
    assert not m.any() and not v.any()
