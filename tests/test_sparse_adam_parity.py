"""fastadam.SparseAdam equals torch.optim.SparseAdam through the object (same gradients, 50
steps, duplicates included); fastadam.Adam with sparse gradients applies its own convention
(and so ends measurably elsewhere, as its docstring says); dense gradients are refused by
SparseAdam, and a dense gradient after sparse ones warns once, pointing at the caller."""
import warnings

import numpy as np
import pytest

import fastadam

torch = pytest.importorskip("torch")

ROWS, DIM, STEPS = 40, 6, 50


def gradients(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        idx = rng.integers(0, ROWS, 9)  # duplicates on purpose
        out.append((idx, rng.standard_normal((9, DIM)).astype(dtype)))
    return out


def torch_run(grads, x0, **kw):
    p = torch.nn.Parameter(torch.tensor(x0))
    opt = torch.optim.SparseAdam([p], **kw)
    for idx, vals in grads:
        p.grad = torch.sparse_coo_tensor(torch.tensor(idx)[None], torch.tensor(vals),
                                         (ROWS, DIM))
        opt.step()
    return p.detach().numpy()


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-10), (np.float32, 2e-5)])
@pytest.mark.parametrize("kw", [dict(lr=1e-2), dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6,
                                                      maximize=True)])
def test_sparse_adam_matches_torch(dtype, rtol, kw):
    grads = gradients(dtype=dtype)
    x0 = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(dtype)
    x = x0.copy()
    opt = fastadam.SparseAdam([x], **kw)
    for idx, vals in grads:
        opt.step([fastadam.IndexedSlices(vals, idx, (ROWS, DIM))])
    np.testing.assert_allclose(x, torch_run(grads, x0, **kw), rtol=rtol, atol=rtol * 1e-2)


def test_adam_default_convention_is_not_sparse_adams():
    # small gradients, where epsilon's place matters (sqrt(v) near eps)
    grads = [(idx, vals * 1e-7) for idx, vals in gradients()]
    x0 = np.random.default_rng(1).standard_normal((ROWS, DIM))
    x = x0.copy()
    opt = fastadam.Adam([x], lr=1e-2)
    for idx, vals in grads:
        opt.step([fastadam.IndexedSlices(vals, idx, (ROWS, DIM))])
    assert np.abs(x - torch_run(grads, x0, lr=1e-2)).max() > 1e-4


def test_sparse_adam_refuses_dense_gradients_and_fixed_options():
    x = np.ones((ROWS, DIM))
    opt = fastadam.SparseAdam([x])
    with pytest.raises(TypeError, match=r"grads\[0\]: SparseAdam takes sparse gradients only"):
        opt.step([np.ones((ROWS, DIM))])
    np.testing.assert_array_equal(x, 1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        opt.set_hyperparameters(weight_decay=0.1)


def test_dense_after_sparse_warns_once_at_the_caller():
    x = np.ones((ROWS, DIM))
    opt = fastadam.Adam([x], lr=1e-2)
    opt.step([fastadam.IndexedSlices(np.ones((2, DIM)), np.array([1, 2]), (ROWS, DIM))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.step([np.ones((ROWS, DIM))])
    msgs = [w for w in caught if "had sparse gradients" in str(w.message)]
    assert len(msgs) == 1 and msgs[0].filename == __file__
