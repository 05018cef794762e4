"""The sparse steps on row-strided tables: x and the state slots as column blocks of one wider
buffer (rows contiguous, row stride larger than the row), e.g. x, m, v interleaved per row.

Reference: the same steps on packed (C-contiguous) copies of the blocks, which must give the
same bits for every optimizer, mode, dtype and thread count; the buffer's other columns (the
padding) must not change.  Then one test per error message: rows that are not contiguous, rows
closer than a row apart, a CSR gradient on strided tables, and blocks that overlap (sharing
memory is rejected, interleaving disjoint blocks is not)."""
import numpy as np
import pytest

import fastadam

STEPS = {
    "adam": (lambda x, g, s, t, **kw: fastadam.sparse_step_inplace(
        x, g, s[0], s[1], t, weight_decay=1e-2, **kw), 2),
    "adagrad": (lambda x, g, s, t, **kw: fastadam.sparse_adagrad_step_inplace(
        x, g, s[0], t, weight_decay=1e-2, **kw), 1),
    "momentum": (lambda x, g, s, t, **kw: fastadam.sparse_momentum_step_inplace(
        x, g, s[0], t, weight_decay=1e-2, **kw), 1),
}
PAD = 3  # padding columns after the blocks, filled with a sentinel


def _interleaved(x0, n_slots, pad=PAD):
    """(buffer, x view, slot views): x0's copy and zeroed slots as column blocks of one
    (n, (1 + n_slots) * w + pad) buffer; the padding holds 7.0."""
    n = x0.shape[0]
    w = int(np.prod(x0.shape[1:], dtype=np.int64))
    buf = np.full((n, (1 + n_slots) * w + pad), 7.0, dtype=x0.dtype)
    blocks = [buf[:, q * w:(q + 1) * w].reshape(x0.shape) for q in range(1 + n_slots)]
    blocks[0][...] = x0
    for b in blocks[1:]:
        b[...] = 0
    return buf, blocks[0], blocks[1:]


def _gradient(t, n_rows, row_shape, dtype, sorted_unique):
    rng = np.random.default_rng(t)
    k = 12
    idx = (np.unique(rng.integers(0, n_rows, k)) if sorted_unique
           else rng.integers(0, n_rows, k))  # repeated indices go through the sort
    values = rng.standard_normal((idx.shape[0],) + row_shape).astype(dtype)
    return fastadam.IndexedSlices(values, idx, (n_rows,) + row_shape)


@pytest.mark.parametrize("optimizer", list(STEPS))
@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sorted_unique", [False, True])
def test_strided_tables_equal_packed_tables_bit_for_bit(rng, optimizer, mode, dtype,
                                                        sorted_unique):
    step, n_slots = STEPS[optimizer]
    x0 = rng.standard_normal((40, 5)).astype(dtype)
    packed_x, packed_slots = x0.copy(), [np.zeros_like(x0) for _ in range(n_slots)]
    buf, x, slots = _interleaved(x0, n_slots)
    assert not x.flags.c_contiguous  # the case under test
    last_p = np.zeros(40, np.int64) if mode == "catchup" else None
    last_s = np.zeros(40, np.int64) if mode == "catchup" else None
    for t in range(1, 6):  # rows idle for some steps (catchup replays their decay)
        g = _gradient(t, 40, (5,), dtype, sorted_unique)
        step(packed_x, g, packed_slots, t, mode=mode, last_step=last_p,
             indices_sorted_unique=sorted_unique)
        step(x, g, slots, t, mode=mode, last_step=last_s, indices_sorted_unique=sorted_unique)
    for a, b in zip([packed_x] + packed_slots, [x] + slots):
        assert np.ascontiguousarray(b).tobytes() == a.tobytes()
    assert np.all(buf[:, -PAD:] == 7.0)  # the padding is never written
    if mode == "catchup":
        np.testing.assert_array_equal(last_p, last_s)


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_strided_tables_with_threads_and_3d_rows(rng, mode, num_threads):
    """Large enough for the threaded split; rows of shape (3, 50) (x[i] contiguous)."""
    x0 = rng.standard_normal((3000, 3, 50)).astype(np.float32)
    packed = [x0.copy(), np.zeros_like(x0), np.zeros_like(x0)]
    buf, x, (m, v) = _interleaved(x0, 2, pad=16)
    last_p = np.zeros(3000, np.int64) if mode == "catchup" else None
    last_s = np.zeros(3000, np.int64) if mode == "catchup" else None
    for t in range(1, 4):
        r = np.random.default_rng(t)
        idx = r.integers(0, 3000, 2000)
        values = r.standard_normal((2000, 3, 50)).astype(np.float32)
        fastadam.sparse_step_inplace(packed[0], (idx, values), packed[1], packed[2], t,
                                     mode=mode, last_step=last_p, num_threads=num_threads)
        fastadam.sparse_step_inplace(x, (idx, values), m, v, t, mode=mode, last_step=last_s,
                                     num_threads=num_threads)
    for a, b in zip(packed, (x, m, v)):
        assert np.ascontiguousarray(b).tobytes() == a.tobytes()
    assert np.all(buf[:, -16:] == 7.0)


def test_strided_table_of_one_row_and_of_none(rng):
    for n in (0, 1):
        x0 = rng.standard_normal((n, 4))
        buf, x, (m, v) = _interleaved(x0, 2)
        px, pm, pv = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
        g = (np.zeros(n, np.int64), np.ones((n, 4)))
        fastadam.sparse_step_inplace(px, g, pm, pv, 1)
        fastadam.sparse_step_inplace(x, g, m, v, 1)
        np.testing.assert_array_equal(x, px)
        np.testing.assert_array_equal(v, pv)


def _args():
    buf = np.zeros((10, 16), np.float32)
    return buf, buf[:, 0:4], buf[:, 4:8], buf[:, 8:12], (np.array([1, 3]), np.ones((2, 4), np.float32))


def test_rows_that_are_not_contiguous_are_rejected():
    buf, x, m, v, g = _args()
    with pytest.raises(ValueError, match="m: expected a C-contiguous array, or one whose rows "
                                         "are C-contiguous"):
        fastadam.sparse_step_inplace(x, g, buf[:, 4:12:2], v, 1)


def test_rows_closer_than_a_row_apart_are_rejected():
    buf = np.zeros(64, np.float32)
    x = np.lib.stride_tricks.as_strided(buf, (10, 4), (8, 4))  # rows overlap each other
    m, v = np.zeros((10, 4), np.float32), np.zeros((10, 4), np.float32)
    g = (np.array([1]), np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"x: expected a C-contiguous array, or one whose rows "
                                         r"are C-contiguous and at least a row apart .*strides "
                                         r"\(8, 4\)"):
        fastadam.sparse_step_inplace(x, g, m, v, 1)
    assert not buf.any()


def test_a_csr_gradient_on_strided_tables_is_rejected():
    sp = pytest.importorskip("scipy.sparse")
    buf, x, m, v, _ = _args()
    G = sp.csr_matrix(np.eye(10, 4, dtype=np.float32))
    with pytest.raises(ValueError, match="grad: a CSR gradient .* needs C-contiguous x"):
        fastadam.sparse_step_inplace(x, G, m, v, 1)
    assert not buf.any()


def test_the_same_block_twice_is_rejected():
    buf, x, m, v, g = _args()
    with pytest.raises(ValueError, match="x and m share memory"):
        fastadam.sparse_step_inplace(x, g, buf[:, 0:4], v, 1)
    assert not buf.any()


def test_partly_overlapping_blocks_are_rejected():
    buf, x, m, v, g = _args()
    with pytest.raises(ValueError, match="m and v share memory"):
        fastadam.sparse_step_inplace(x, g, m, buf[:, 6:10], 1)
    assert not buf.any()


def test_blocks_of_different_strides_that_interleave_are_rejected():
    buf = np.zeros((20, 8), np.float32)
    x = buf[:10, 0:4]  # stride 32 bytes, rows 0..9
    m = buf.reshape(10, 16)[:, 8:12]  # stride 64 bytes: its elements are some of x's rows
    v = np.zeros((10, 4), np.float32)
    g = (np.array([1]), np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match="x and m share memory"):
        fastadam.sparse_step_inplace(x, g, m, v, 1)
    assert not buf.any()


def test_a_gradient_inside_the_table_is_rejected():
    buf, x, m, v, _ = _args()
    values = buf.reshape(-1)[16:24].reshape(2, 4)  # x's and m's row 1, contiguous
    with pytest.raises(ValueError, match="x and values share memory"):
        fastadam.sparse_step_inplace(x, (np.array([1, 3]), values), m, v, 1)


def test_last_step_inside_the_table_is_rejected():
    data = np.zeros((10, 16), np.float64)
    x, m, v = data[:, 0:4], data[:, 4:8], data[:, 8:12]
    last = data.reshape(-1).view(np.int64)[12:22]  # row 0's padding, then x's row 1
    with pytest.raises(ValueError, match="share memory"):
        fastadam.sparse_step_inplace(x, (np.array([1]), np.ones((1, 4))), m, v, 1,
                                     mode="catchup", last_step=last)
    assert not data.any()
