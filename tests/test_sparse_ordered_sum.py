"""The segment sum that reads the gradient rows in their original order (issue 40): taken when
indices repeat (``k >= ORDERED_MIN_RATIO * distinct rows``) by ``segment_sum`` and by the lazy
and catchup steps, which then walk one summed row per touched row.  Its sums must be NumPy's
``np.add.at`` on a zeroed buffer bit for bit (the same order of additions), for any thread
count, and the steps must equal the sorted-unique path given those NumPy sums."""
import numpy as np
import pytest

import fastadam
from fastadam._core import _sparse
from reference import segment_sum_reference


def repeated(rng, n_rows, k, width, dtype):
    """k indices over n_rows rows, heavily repeated (the ordered path), rows of `width`."""
    idx = (rng.zipf(1.3, k) - 1) % n_rows
    values = rng.standard_normal((k, width)).astype(dtype)
    return idx.astype(np.int64), values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [1, 3, 16, 67])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_ordered_segment_sum_is_add_at_bit_for_bit(dtype, width, num_threads):
    rng = np.random.default_rng(width)
    idx, values = repeated(rng, 3000, 40000, width, dtype)
    assert idx.size >= _sparse.ORDERED_MIN_RATIO * np.unique(idx).size  # the ordered path
    rows, sums = fastadam.segment_sum(idx, values, num_threads=num_threads)
    want_rows, want = segment_sum_reference(idx, values, dtype)
    np.testing.assert_array_equal(rows, want_rows)
    assert sums.tobytes() == want.tobytes()


def test_ordered_segment_sum_of_negative_zeros_is_positive_zero():
    # +0 + (-0) = +0: a segment of -0 rows sums to +0, as np.add.at on zeros gives
    idx = np.array([5, 5, 5, 2, 5, 2], dtype=np.int64)
    values = np.full((6, 4), -0.0, dtype=np.float32)
    values[3] = [np.nan, np.inf, -np.inf, 1.5]
    rows, sums = fastadam.segment_sum(idx, values)
    want_rows, want = segment_sum_reference(idx, values, np.float32)
    np.testing.assert_array_equal(rows, want_rows)
    assert sums.tobytes() == want.tobytes()
    assert not np.signbit(sums[1]).any()


@pytest.mark.parametrize("mode", ["lazy", "catchup"])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_lazy_step_with_repeats_is_the_step_on_numpy_sums(mode, num_threads):
    rng = np.random.default_rng(11)
    n_rows, width = 2000, 24
    idx, values = repeated(rng, n_rows, 30000, width, np.float32)
    x0 = rng.standard_normal((n_rows, width)).astype(np.float32)
    runs = []
    for path in ("repeated", "numpy sums"):
        x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        last = np.zeros(n_rows, np.int64) if mode == "catchup" else None
        for t in (1, 2):
            if path == "repeated":
                fastadam.sparse_step_inplace(x, (idx, values), m, v, t, mode=mode,
                                             last_step=last, weight_decay=0.01,
                                             num_threads=num_threads)
            else:
                rows, sums = segment_sum_reference(idx, values, np.float32)
                fastadam.sparse_step_inplace(x, (rows, sums), m, v, t, mode=mode,
                                             last_step=last, weight_decay=0.01,
                                             indices_sorted_unique=True, num_threads=1)
        runs.append((x.tobytes(), m.tobytes(), v.tobytes()))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_row_segments_use_plus_zero_plus_the_row(dtype):
    # every row touched once (one-row segments, read in place): the lazy step is the dense step
    # on the densified gradient, whose -0 entries np.add.at turned into +0, bit for bit
    rng = np.random.default_rng(5)
    n, width = 257, 19
    idx = rng.permutation(n)
    values = rng.standard_normal((n, width)).astype(dtype)
    values[::3, ::2] = -0.0
    x0 = rng.standard_normal((n, width)).astype(dtype)
    m0 = np.where(rng.random((n, width)) < 0.5, -0.0, 0.0).astype(dtype)
    grad = np.zeros((n, width), dtype)
    np.add.at(grad, idx, values)
    runs = []
    for sparse in (True, False):
        x, m, v = x0.copy(), m0.copy(), np.zeros_like(x0)
        if sparse:
            fastadam.sparse_step_inplace(x, (idx, values), m, v, 1, num_threads=1)
        else:
            fastadam.step_inplace(x, grad, m, v, 1, convention="tf", num_threads=1)
        runs.append((x.tobytes(), m.tobytes(), v.tobytes()))
    assert runs[0] == runs[1]
    # the comparison can tell: the dense step given the rows themselves (their -0 entries
    # kept) leaves a -0 where m was -0, and so other bits
    raw = np.empty_like(values)
    raw[idx] = values
    x, m, v = x0.copy(), m0.copy(), np.zeros_like(x0)
    fastadam.step_inplace(x, raw, m, v, 1, convention="tf", num_threads=1)
    assert m.tobytes() != runs[1][1]
