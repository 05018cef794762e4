"""fastadam.autodiff under threads, views, NaN, odd index/float dtypes and degenerate conv
geometry (issue 12).  References: serial runs (bit for bit), PyTorch, NumPy formulas."""
import sys
import threading

import numpy as np
import pytest

import fastadam
import fastadam.autodiff as ad
from fastadam import IndexedSlices
from fastadam.autodiff import Tensor, gradient
from fastadam.autodiff import _kernels as K

rng = np.random.default_rng(12)


def leaf(*shape, dtype=np.float64):
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


# ---- grad mode is per thread -----------------------------------------------------------------

def test_no_grad_in_one_thread_leaves_other_threads_recording():
    entered, checked = threading.Event(), threading.Event()

    def hold_no_grad():
        with ad.no_grad():
            entered.set()
            checked.wait(10)

    t = threading.Thread(target=hold_no_grad)
    t.start()
    entered.wait(10)
    try:
        assert ad.is_grad_enabled()
        x = leaf(3)
        (g,) = gradient((x * x).sum(), [x])
        np.testing.assert_allclose(g.data, 2 * x.data)
    finally:
        checked.set()
        t.join()


def test_a_new_thread_starts_with_recording_on():
    seen = []
    with ad.no_grad():
        t = threading.Thread(target=lambda: seen.append(ad.is_grad_enabled()))
        t.start()
        t.join()
        assert not ad.is_grad_enabled()
    assert seen == [True] and ad.is_grad_enabled()


def _train(seed, steps, out):
    """A small MLP trained with fastadam.Adam; evaluates under no_grad every few steps."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((16, 8)).astype(np.float32)
    y = r.integers(0, 3, 16)
    ws = [(r.standard_normal((8, 6)) * 0.3).astype(np.float32), np.zeros(6, np.float32),
          (r.standard_normal((6, 3)) * 0.3).astype(np.float32), np.zeros(3, np.float32)]
    ps = [Tensor(w, requires_grad=True) for w in ws]
    opt = fastadam.Adam(ws, lr=1e-2, convention="torch")
    X = Tensor(x)
    history = []
    for i in range(steps):
        h = ad.relu(X @ ps[0] + ps[1])
        loss = ad.softmax_cross_entropy(h @ ps[2] + ps[3], y)
        grads = gradient(loss, ps)
        opt.step([g.data for g in grads])
        history.append(loss.data.item())
        if i % 5 == 0:
            with ad.no_grad():
                history.append(float(ad.relu(X @ ps[0] + ps[1]).data.sum()))
    out[seed] = (history, [w.copy() for w in ws])


def test_two_training_loops_in_threads_match_serial_runs_bit_for_bit():
    steps = 150
    serial = {}
    for seed in (1, 2):
        _train(seed, steps, serial)
    concurrent = {}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=_train, args=(seed, steps, concurrent))
                   for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    for seed in (1, 2):
        assert seed in concurrent, "a training thread raised"
        assert concurrent[seed][0] == serial[seed][0]
        for a, b in zip(concurrent[seed][1], serial[seed][1]):
            np.testing.assert_array_equal(a, b)


# ---- views share their base's version counter ------------------------------------------------

VIEWS = {
    "reshape": lambda s: ad.reshape(s, (6,)),
    "transpose": lambda s: ad.transpose(s),
    "slice": lambda s: s[1:],
    "detach": lambda s: s.detach(),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_in_place_change_through_a_view_of_a_saved_tensor_raises(view):
    x = leaf(2, 3)
    s = ad.exp(x)                    # exp saves its output s
    r = VIEWS[view](s)
    r += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        gradient(s.sum(), [x])


@pytest.mark.parametrize("view", ["reshape", "slice", "transpose"])  # detach: no path to x
def test_in_place_change_of_the_base_of_a_saved_view_raises(view):
    x = leaf(2, 3)
    s = x * 1.0
    r = VIEWS[view](s)
    y = (r * r).sum()                # multiply saves the view r
    s += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        gradient(y, [x])


def test_view_of_a_tensor_changed_before_recording_differentiates():
    x = leaf(2, 3)
    x += 1.0                         # version 1 before anything is recorded
    r = ad.reshape(ad.transpose(x), (6,))
    (g,) = gradient((r * r).sum(), [x])
    np.testing.assert_allclose(g.data, 2 * x.data)


def test_a_copy_does_not_share_the_version_counter():
    x = leaf(4)
    s = ad.exp(x)
    c = s[[0, 1, 2]]                 # advanced indexing copies
    c += 1.0
    (g,) = gradient(s.sum(), [x])
    np.testing.assert_allclose(g.data, np.exp(x.data))


# ---- NaN propagates the same way on every path, as in PyTorch ----------------------------------

def _paths(a):
    """The compiled path (contiguous) and the NumPy fallback (a strided view) of the same data."""
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    return {"contiguous": a.copy(), "strided": wide[..., ::2]}


NAN_ROW = np.array([1.5, np.nan, -2.0, 0.0, np.nan, 3.0], dtype=np.float32)


@pytest.mark.parametrize("path", ["contiguous", "strided"])
def test_relu_propagates_nan_like_torch(path):
    torch = pytest.importorskip("torch")
    x = Tensor(_paths(NAN_ROW)[path], requires_grad=True)
    y = ad.relu(x)
    (g,) = gradient(ad.sum(y * 2.0), [x])
    tx = torch.tensor(NAN_ROW, requires_grad=True)
    ty = torch.relu(tx)
    (ty * 2.0).sum().backward()
    np.testing.assert_array_equal(y.data, ty.detach().numpy())
    np.testing.assert_array_equal(g.data, tx.grad.numpy())


@pytest.mark.parametrize("path", ["contiguous", "strided"])
def test_max_propagates_nan_like_torch(path):
    torch = pytest.importorskip("torch")
    x = Tensor(_paths(NAN_ROW)[path], requires_grad=True)
    y = ad.max(x)
    (g,) = gradient(y, [x])
    tx = torch.tensor(NAN_ROW, requires_grad=True)
    ty = torch.max(tx)
    ty.backward()
    np.testing.assert_array_equal(y.data, ty.detach().numpy())
    np.testing.assert_array_equal(g.data, tx.grad.numpy())


def test_max_along_an_axis_gives_the_gradient_to_the_nans_of_a_row():
    a = np.array([[1.0, np.nan, np.nan], [1.0, 4.0, 4.0]])
    x = Tensor(a, requires_grad=True)
    (g,) = gradient(ad.sum(ad.max(x, axis=1)), [x])
    np.testing.assert_array_equal(g.data, [[0, 0.5, 0.5], [0, 0.5, 0.5]])


@pytest.mark.parametrize("path", ["contiguous", "strided"])
def test_clip_propagates_nan_like_torch(path):
    torch = pytest.importorskip("torch")
    x = Tensor(_paths(NAN_ROW)[path], requires_grad=True)
    y = ad.clip(x, -1.0, 2.0)
    (g,) = gradient(ad.sum(y), [x])
    tx = torch.tensor(NAN_ROW, requires_grad=True)
    ty = torch.clamp(tx, -1.0, 2.0)
    ty.sum().backward()
    np.testing.assert_array_equal(y.data, ty.detach().numpy())
    np.testing.assert_array_equal(g.data, tx.grad.numpy())


@pytest.mark.parametrize("path", ["contiguous", "strided"])
def test_softmax_cross_entropy_propagates_nan_like_torch(path):
    torch = pytest.importorskip("torch")
    logits = np.array([[np.nan, 1.0, 0.0], [1.0, 2.0, 3.0], [np.inf, 0.0, 1.0]], np.float32)
    labels = np.array([0, 2, 1])
    x = Tensor(_paths(logits)[path], requires_grad=True)
    y = ad.softmax_cross_entropy(x, labels)
    (g,) = gradient(y, [x])
    tx = torch.tensor(logits, requires_grad=True)
    ty = torch.nn.functional.cross_entropy(tx, torch.tensor(labels))
    ty.backward()
    np.testing.assert_array_equal(y.data, ty.detach().numpy())
    assert np.isnan(g.data[0]).all() and np.isnan(g.data[2]).all()
    np.testing.assert_array_equal(np.isnan(g.data), np.isnan(tx.grad.numpy()))
    np.testing.assert_allclose(g.data[1], tx.grad.numpy()[1], rtol=1e-6)


# ---- take(): indices normalised once -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.int32, np.uint64])
def test_take_gradient_feeds_sparse_step_for_any_integer_index_dtype(dtype):
    table = leaf(5, 3)
    idx = np.array([4, 0, 4, 2], dtype=dtype)
    (g,) = gradient(ad.sum(ad.take(table, idx) * 3.0), [table])
    assert isinstance(g, IndexedSlices) and g.indices.dtype == np.intp
    dense = np.zeros((5, 3))
    np.add.at(dense, idx.astype(np.int64), 3.0)
    np.testing.assert_array_equal(g.to_dense(), dense)
    x = table.data.copy()
    m, v = np.zeros_like(x), np.zeros_like(x)
    fastadam.sparse_step_inplace(x, g, m, v, 1, lr=0.1, convention="torch")
    touched = np.zeros(5, bool)
    touched[[0, 2, 4]] = True
    assert np.all(x[touched] != table.data[touched]) and np.all(x[~touched] == table.data[~touched])


def test_take_rejects_out_of_range_unsigned_indices_before_casting():
    with pytest.raises(IndexError, match=r"indices: values must lie in \[0, 5\)"):
        ad.take(leaf(5, 3), np.array([1, 2 ** 63], dtype=np.uint64))


# ---- gradients have their input's dtype --------------------------------------------------------

def test_float32_parameters_get_float32_gradients_from_float64_inputs():
    w, b = leaf(4, 2, dtype=np.float32), leaf(2, dtype=np.float32)
    x = rng.standard_normal((5, 4))            # float64 data: the forward pass promotes
    y = ad.sum(ad.tanh(Tensor(x) @ w + b))
    gw, gb = gradient(y, [w, b])
    assert gw.dtype == np.float32 and gb.dtype == np.float32
    t = 1 - np.tanh(x @ w.data.astype(np.float64) + b.data) ** 2
    np.testing.assert_allclose(gw.data, x.T @ t, rtol=1e-5)
    np.testing.assert_allclose(gb.data, t.sum(0), rtol=1e-5)
    ws = [w.data.copy(), b.data.copy()]
    fastadam.Adam(ws, lr=1e-3, convention="torch").step([gw.data, gb.data])


def test_second_order_gradients_keep_their_input_dtype():
    w = leaf(3, dtype=np.float32)
    x = Tensor(rng.standard_normal(3))
    (g,) = gradient(ad.sum(w * w * x), [w], create_graph=True)
    assert g.dtype == np.float32
    (h,) = gradient(ad.sum(g), [w])
    assert h.dtype == np.float32
    np.testing.assert_allclose(h.data, 2 * x.data, rtol=1e-6)


def test_sparse_gradient_values_keep_the_table_dtype():
    table = leaf(4, 2, dtype=np.float32)
    (g,) = gradient(ad.sum(ad.take(table, [1, 3]) * Tensor(np.ones(2))), [table])
    assert g.values.dtype == np.float32


# ---- conv geometry -----------------------------------------------------------------------------

def test_conv_output_smaller_than_one_raises():
    with pytest.raises(ValueError, match=r"conv2d: output size 0x0 is less than 1x1"):
        ad.conv2d(leaf(1, 1, 2, 2), leaf(1, 1, 3, 3))


def test_conv_huge_dilation_raises_without_allocating():
    with pytest.raises(ValueError, match="output size .* is less than 1x1"):
        ad.conv2d(leaf(1, 1, 8, 8), leaf(1, 1, 3, 3), dilation=10 ** 6)


def test_conv_empty_kernel_raises():
    with pytest.raises(ValueError, match="w: expected at least one filter of at least 1x1"):
        ad.conv2d(leaf(1, 1, 4, 4), leaf(1, 1, 0, 3))


def test_conv_batch_of_zero_matches_torch():
    torch = pytest.importorskip("torch")
    x, w, b = leaf(0, 2, 5, 5), leaf(3, 2, 3, 3), leaf(3)
    y = ad.conv2d(x, w, b, padding=1)
    gx, gw, gb = gradient(ad.sum(y), [x, w, b])
    tx, tw, tb = (torch.tensor(t.data, requires_grad=True) for t in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
    ty.sum().backward()
    assert y.shape == tuple(ty.shape) == (0, 3, 5, 5)
    for ours, theirs in ((gx, tx), (gw, tw), (gb, tb)):
        np.testing.assert_array_equal(ours.data, theirs.grad.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_in_batch_chunks_matches_torch(monkeypatch, dtype):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(K, "WORKSPACE_BYTES", 3000)  # a few samples per chunk
    x, w, b = leaf(5, 4, 7, 6, dtype=dtype), leaf(6, 2, 3, 2, dtype=dtype), leaf(6, dtype=dtype)
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    y = ad.conv2d(x, w, b, **kw)
    seed = rng.standard_normal(y.shape).astype(dtype)
    gx, gw, gb = gradient(y, [x, w, b], grad_output=seed)
    tx, tw, tb = (torch.tensor(t.data, requires_grad=True) for t in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, **kw)
    ty.backward(torch.tensor(seed))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y.data, ty.detach().numpy(), rtol=tol, atol=tol)
    for ours, theirs in ((gx, tx), (gw, tw), (gb, tb)):
        np.testing.assert_allclose(ours.data, theirs.grad.numpy(), rtol=tol, atol=tol)


def test_im2col_workspace_stays_bounded_after_a_large_conv(monkeypatch):
    monkeypatch.setattr(K, "WORKSPACE_BYTES", 1 << 20, raising=False)
    K.release_workspace()
    x = Tensor(np.ones((4, 16, 32, 32), np.float32))     # im2col of it: 2.4 MB
    w = leaf(4, 16, 3, 3, dtype=np.float32)
    (gw,) = gradient(ad.sum(ad.conv2d(x, w, padding=1)), [w])
    assert 0 < K.workspace_bytes() <= 1 << 20
    corner, edge, mid = 4 * 31 * 31, 4 * 31 * 32, 4 * 32 * 32  # taps of a padded all-ones x
    expected = [[corner, edge, corner], [edge, mid, edge], [corner, edge, corner]]
    np.testing.assert_allclose(gw.data[0, 0], expected)
    K.release_workspace()
    assert K.workspace_bytes() == 0


# ---- the engine's buffer pool: reuse is never visible, memory is bounded ------------------------

def test_pooled_outputs_are_reused_only_when_nobody_holds_them():
    K.release_pool()
    x1 = Tensor(rng.standard_normal((256, 512)).astype(np.float32))    # 512 KiB: pooled
    x2 = Tensor(rng.standard_normal((256, 512)).astype(np.float32))
    y1 = ad.relu(x1)
    y2 = ad.relu(x2)                                                    # y1 is held: not reused
    assert not np.shares_memory(y1.data, y2.data)
    np.testing.assert_array_equal(y1.data, np.maximum(x1.data, 0))
    np.testing.assert_array_equal(y2.data, np.maximum(x2.data, 0))
    kept = y1.data[:2]                                                  # a view keeps it alive
    del y1
    y3 = ad.relu(x2)
    assert not np.shares_memory(kept, y3.data)
    np.testing.assert_array_equal(kept, np.maximum(x1.data[:2], 0))
    address = y3.data.__array_interface__["data"][0]
    del y3
    y4 = ad.relu(x1)                                                    # y3's buffer is free
    assert y4.data.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(y4.data, np.maximum(x1.data, 0))


def test_pool_stays_bounded_when_shapes_change(monkeypatch):
    monkeypatch.setattr(K, "POOL_BYTES", 4 << 20)
    K.release_pool()
    for rows in range(64, 64 + 40):
        ad.relu(Tensor(np.ones((rows, 1024), np.float32)))              # 256-400 KiB each
        assert K.pool_bytes() <= 4 << 20
    K.release_pool()


def test_conv_weight_gradient_reusing_the_forward_unrolling_matches_torch():
    # two convolutions of one weight on inputs of one shape: the workspace holds the second
    # unrolling when the first one's weight gradient is computed
    torch = pytest.importorskip("torch")
    x1, x2 = leaf(3, 2, 6, 6), leaf(3, 2, 6, 6)
    w = leaf(4, 2, 3, 3)
    y = ad.sum(ad.relu(ad.conv2d(x1, w, padding=1)) * ad.conv2d(x2, w, padding=1))
    gw, gx1 = gradient(y, [w, x1])
    t1, t2, tw = (torch.tensor(t.data, requires_grad=True) for t in (x1, x2, w))
    F = torch.nn.functional
    (F.relu(F.conv2d(t1, tw, padding=1)) * F.conv2d(t2, tw, padding=1)).sum().backward()
    np.testing.assert_allclose(gw.data, tw.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gx1.data, t1.grad.numpy(), rtol=1e-10, atol=1e-12)
