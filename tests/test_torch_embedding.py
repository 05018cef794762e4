"""fastadam.torch.FusedEmbeddingBag(Collection): embedding bags whose backward is the step.

A DLRM-shaped model (two pooled tables, a small MLP trained by torch.optim.Adam) trained with
the fused tables follows, loss for loss, the same model built on ``nn.EmbeddingBag(sparse=True)``
with the matching torch sparse optimizer (SparseAdam for lazy Adam, Adagrad, SGD); the state
dict round trip continues training bit for bit; the per-sample weights' gradient is torch's.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastadam.torch as ft  # noqa: E402

TABLES = [(30, 6), (17, 6)]


class DLRM(torch.nn.Module):
    """Two pooled tables and dense features into a small MLP."""

    def __init__(self, embeddings):
        super().__init__()
        self.embeddings = embeddings
        self.mlp = torch.nn.Sequential(torch.nn.Linear(6 + 6 + 3, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 1))

    def forward(self, dense, ids, offsets, weights):
        if isinstance(self.embeddings, torch.nn.ModuleList):
            pooled = [bag(i, o, per_sample_weights=w)
                      for bag, i, o, w in zip(self.embeddings, ids, offsets, weights)]
        else:
            pooled = self.embeddings(ids, offsets, weights)
        return self.mlp(torch.cat(pooled + [dense], dim=1)).squeeze(1)


def batches(seed, n_steps, batch=8, weighted=False):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_steps):
        ids, offsets, weights = [], [], []
        for n, _ in TABLES:
            lengths = rng.integers(0, 5, batch)
            a = rng.integers(0, n, int(lengths.sum()))
            a[: len(a) // 2] = rng.integers(0, 3, len(a) // 2)  # hot rows
            ids.append(torch.from_numpy(a))
            offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]])))
            weights.append(torch.from_numpy(rng.uniform(0.5, 1.5, len(a))) if weighted
                           else None)
        out.append((torch.from_numpy(rng.standard_normal((batch, 3))), ids, offsets, weights,
                    torch.from_numpy(rng.standard_normal(batch))))
    return out


def train(model, optimizers, data):
    losses = []
    for dense, ids, offsets, weights, y in data:
        for opt in optimizers:
            opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(dense, ids, offsets, weights), y)
        loss.backward()
        for opt in optimizers:
            opt.step()
        losses.append(loss.item())
    return losses


def twin_models(mode, optimizer, hyper, torch_sparse):
    """(fused model, its torch twin, torch twin's sparse optimizer) with equal weights."""
    torch.manual_seed(0)
    fused = ft.FusedEmbeddingBagCollection(TABLES, mode=mode, optimizer=optimizer,
                                           dtype=torch.float64, **hyper)
    model = DLRM(fused).double()
    bags = torch.nn.ModuleList([
        torch.nn.EmbeddingBag(n, d, mode=mode, sparse=True, dtype=torch.float64,
                              _weight=fused.tables[i].weight.clone())
        for i, (n, d) in enumerate(TABLES)])
    twin = DLRM(bags).double()
    twin.mlp.load_state_dict(model.mlp.state_dict())
    return model, twin, torch_sparse(bags.parameters())


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("mean", False), ("sum", True)])
@pytest.mark.parametrize("optimizer,hyper,torch_sparse", [
    ("adam", dict(lr=0.03), lambda p: torch.optim.SparseAdam(p, lr=0.03)),
    ("adagrad", dict(lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
    ("sgd", dict(lr=0.2, momentum=0.0), lambda p: torch.optim.SGD(p, lr=0.2)),
], ids=["SparseAdam", "Adagrad", "SGD"])
def test_dlrm_trains_as_embedding_bag_with_torch_sparse_optimizer(mode, weighted, optimizer,
                                                                  hyper, torch_sparse):
    model, twin, sparse_opt = twin_models(mode, optimizer, hyper, torch_sparse)
    # the dense part: torch's Adam in both (it never sees the fused tables)
    assert all(p.dim() < 2 or p.shape[0] != TABLES[0][0] for p in model.parameters())
    data = batches(1, 12, weighted=weighted)
    losses = train(model, [torch.optim.Adam(model.parameters(), lr=0.01)], data)
    want = train(twin, [torch.optim.Adam(twin.mlp.parameters(), lr=0.01), sparse_opt], data)
    np.testing.assert_allclose(losses, want, rtol=1e-10)
    assert losses[-1] != losses[0]
    for i, bag in enumerate(twin.embeddings):
        np.testing.assert_allclose(model.embeddings.tables[i].weight, bag.weight.detach(),
                                   rtol=1e-10, atol=1e-12)
        assert model.embeddings.tables[i].weight.grad is None
    if optimizer == "adam":  # the state under torch's names, equal to SparseAdam's
        for i, bag in enumerate(twin.embeddings):
            s = sparse_opt.state[bag.weight]
            table = model.embeddings.tables[i]
            assert float(table.step) == float(s["step"])
            np.testing.assert_allclose(table.exp_avg, s["exp_avg"], rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(table.exp_avg_sq, s["exp_avg_sq"], rtol=1e-10,
                                       atol=1e-15)


def test_float32_dlrm_close_to_torch():
    torch.manual_seed(0)
    fused = ft.FusedEmbeddingBagCollection(TABLES, mode="mean", lr=0.03)
    model = DLRM(fused).float()
    bags = torch.nn.ModuleList([
        torch.nn.EmbeddingBag(n, d, mode="mean", sparse=True,
                              _weight=fused.tables[i].weight.clone())
        for i, (n, d) in enumerate(TABLES)])
    twin = DLRM(bags).float()
    twin.mlp.load_state_dict(model.mlp.state_dict())
    data = [(d.float(), i, o, w, y.float()) for d, i, o, w, y in batches(2, 10)]
    losses = train(model, [torch.optim.Adam(model.parameters(), lr=0.01)], data)
    want = train(twin, [torch.optim.Adam(twin.mlp.parameters(), lr=0.01),
                        torch.optim.SparseAdam(bags.parameters(), lr=0.03)], data)
    np.testing.assert_allclose(losses, want, rtol=1e-5)


def test_state_dict_round_trip_continues_bit_for_bit():
    torch.manual_seed(0)
    data = batches(3, 8)
    model = DLRM(ft.FusedEmbeddingBagCollection(TABLES, mode="sum", optimizer="adamw",
                                                lr=0.02, weight_decay=0.1,
                                                dtype=torch.float64)).double()
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, [dense_opt], data[:4])
    saved = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(dense_opt.state_dict())
    assert {"embeddings.tables.0.weight", "embeddings.tables.0.exp_avg",
            "embeddings.tables.0.exp_avg_sq", "embeddings.tables.0.step"} <= set(saved)
    assert float(saved["embeddings.tables.1.step"]) == 4.0
    rest = train(model, [dense_opt], data[4:])

    torch.manual_seed(1)  # other initial tables: the load must replace them
    other = DLRM(ft.FusedEmbeddingBagCollection(TABLES, mode="sum", optimizer="adamw",
                                                lr=0.02, weight_decay=0.1,
                                                dtype=torch.float64)).double()
    other.load_state_dict(saved)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.01)
    other_opt.load_state_dict(saved_opt)
    assert train(other, [other_opt], data[4:]) == rest
    for a, b in zip(model.embeddings.tables, other.embeddings.tables):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.exp_avg_sq, b.exp_avg_sq)


def test_single_table_matches_embedding_bag_and_weight_gradient():
    """FusedEmbeddingBag: the forward is EmbeddingBag's, the per-sample weights' gradient is
    torch's (taken before the table moves), and eval mode takes no step."""
    torch.manual_seed(0)
    fused = ft.FusedEmbeddingBag(12, 5, mode="sum", optimizer="adagrad", lr=0.1,
                                 dtype=torch.float64, initial_accumulator_value=0.1)
    bag = torch.nn.EmbeddingBag(12, 5, mode="sum", sparse=True, dtype=torch.float64,
                                _weight=fused.weight.clone())
    opt = torch.optim.Adagrad(bag.parameters(), lr=0.1, initial_accumulator_value=0.1)
    ids = torch.tensor([1, 4, 4, 7, 1, 0])
    offsets = torch.tensor([0, 3, 3])
    g = torch.randn(3, 5, dtype=torch.float64)
    w1 = torch.rand(6, dtype=torch.float64, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_(True)
    out = fused(ids, offsets, w1)
    want = bag(ids, offsets, per_sample_weights=w2)
    assert torch.equal(out, want)
    (out * g).sum().backward()
    (want * g).sum().backward()
    opt.step()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-13, atol=0)
    torch.testing.assert_close(fused.weight, bag.weight.detach(), rtol=1e-12, atol=0)
    assert fused.tables[0].sum[2, 0] == 0.1  # untouched row: initial accumulator
    fused.eval()
    before = fused.weight.clone()
    out = fused(ids, offsets, w1.detach())
    assert not out.requires_grad
    assert torch.equal(fused.weight, before)


def test_a_table_whose_output_is_unused_is_not_stepped():
    """As torch.optim.SparseAdam skips a parameter without a gradient: the unused table and
    its step count stay, the used one steps, here and on the next step, as torch's twin."""
    torch.manual_seed(0)
    fused = ft.FusedEmbeddingBagCollection(TABLES, lr=0.05, dtype=torch.float64)
    bags = [torch.nn.EmbeddingBag(n, d, mode="sum", sparse=True, dtype=torch.float64,
                                  _weight=fused.tables[i].weight.clone())
            for i, (n, d) in enumerate(TABLES)]
    opt = torch.optim.SparseAdam([b.weight for b in bags], lr=0.05)
    rng = np.random.default_rng(4)
    for used in ([0], [0, 1], [1], [0, 1]):
        ids = [torch.from_numpy(rng.integers(0, n, 12)) for n, _ in TABLES]
        offsets = [torch.tensor([0, 5, 5]), torch.tensor([0, 2, 9])]
        g = [torch.from_numpy(rng.standard_normal((3, 6))) for _ in TABLES]
        out = fused(ids, offsets)
        sum((out[i] * g[i]).sum() for i in used).backward()
        opt.zero_grad(set_to_none=True)
        sum((bags[i](ids[i], offsets[i]) * g[i]).sum() for i in used).backward()
        opt.step()
    for i, bag in enumerate(bags):
        assert float(fused.tables[i].step) == float(opt.state[bag.weight]["step"]) == 3.0
        torch.testing.assert_close(fused.tables[i].weight, bag.weight.detach(), rtol=1e-10,
                                   atol=1e-12)


def test_a_refused_backward_changes_no_table():
    fused = ft.FusedEmbeddingBagCollection(TABLES, lr=0.1)
    before = [t.weight.clone() for t in fused.tables]
    out = fused([torch.tensor([0, 1]), torch.tensor([2, 4])],
                [torch.tensor([0]), torch.tensor([0])],
                [None, torch.tensor([1.0, float("nan")])])
    with pytest.raises(ValueError, match=r"per_sample_weights\[1\]: expected finite weights"):
        (out[0].sum() + out[1].sum()).backward()
    for b, t in zip(before, fused.tables):
        assert torch.equal(b, t.weight)
        assert float(t.step) == 0.0


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"mode: expected one of \('sum', 'mean'\)"):
        ft.FusedEmbeddingBag(4, 2, mode="max")
    with pytest.raises(TypeError, match=r"dtype: expected torch.float32 or torch.float64"):
        ft.FusedEmbeddingBag(4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"lr"):
        ft.FusedEmbeddingBag(4, 2, lr=-1.0)
    with pytest.raises(ValueError, match=r"optimizer: expected one of"):
        ft.FusedEmbeddingBag(4, 2, optimizer="adamax")
    with pytest.raises(ValueError, match=r"tables\[1\]: expected positive sizes"):
        ft.FusedEmbeddingBagCollection([(4, 2), (0, 2)])
    with pytest.raises(ValueError, match=r"ids: expected 2 entries"):
        ft.FusedEmbeddingBagCollection([(4, 2), (3, 2)])([torch.tensor([0])])
