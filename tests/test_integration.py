"""The capabilities together: an embedding trained with fastadam.autodiff, whose gradient stays
an IndexedSlices, fed to fastadam.sparse_step_inplace; dense parameters to fastadam.Adam."""
import numpy as np

import fastadam
import fastadam.autodiff as ad


def embedding_model_gradients(table, w, idx, labels):
    T = ad.Tensor(table, requires_grad=True)
    W = ad.Tensor(w, requires_grad=True)
    loss = ad.softmax_cross_entropy(ad.take(T, idx) @ W, labels)
    g_table, g_w = ad.gradient(loss, [T, W])
    return float(loss.data), g_table, g_w


def test_embedding_gradient_feeds_the_sparse_step(rng):
    table = rng.standard_normal((50, 8)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    idx = np.array([4, 9, 4, 30, 9, 9])
    labels = np.array([0, 1, 2, 0, 1, 2])
    _, g_table, _ = embedding_model_gradients(table, w, idx, labels)
    assert isinstance(g_table, fastadam.IndexedSlices)

    # dense mode == the dense step on the densified gradient, bit for bit
    a, ma, va = table.copy(), np.zeros_like(table), np.zeros_like(table)
    b, mb, vb = table.copy(), np.zeros_like(table), np.zeros_like(table)
    fastadam.sparse_step_inplace(a, g_table, ma, va, 1, mode="dense", lr=0.1)
    fastadam.step_inplace(b, g_table.to_dense(), mb, vb, 1, lr=0.1)
    assert a.tobytes() == b.tobytes() and ma.tobytes() == mb.tobytes()

    # lazy mode touches exactly the looked-up rows
    c, mc, vc = table.copy(), np.zeros_like(table), np.zeros_like(table)
    fastadam.sparse_step_inplace(c, g_table, mc, vc, 1, lr=0.1)
    changed = np.nonzero((c != table).any(axis=1))[0]
    np.testing.assert_array_equal(changed, np.unique(idx))


def test_training_loop_lowers_the_loss(rng):
    table = (0.1 * rng.standard_normal((40, 6))).astype(np.float32)
    w = (0.1 * rng.standard_normal((6, 4))).astype(np.float32)
    labels_of_row = rng.integers(0, 4, size=40)
    mt, vt = np.zeros_like(table), np.zeros_like(table)
    opt = fastadam.Adam([w], lr=0.05)
    losses = []
    for t in range(1, 61):
        idx = rng.integers(0, 40, size=16)
        loss, g_table, g_w = embedding_model_gradients(table, w, idx, labels_of_row[idx])
        losses.append(loss)
        fastadam.sparse_step_inplace(table, g_table, mt, vt, t, lr=0.05)
        opt.step([g_w.data])
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
