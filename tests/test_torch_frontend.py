"""fastadam.torch against torch.optim, with torch's own optimizer-test idioms: trajectories for
every option, LR schedulers, closures, state_dict round trips both ways, GradScaler with inf and
NaN gradients, sparse embeddings (SparseAdam), a Lightning-style loop, and the error cases."""
import copy
import itertools
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fastadam.torch as ft  # noqa: E402

from reference import lion_reference, sparse_adam_reference  # noqa: E402

STEPS = 30


def model(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3)).to(dtype)


def data(dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g, dtype=dtype), torch.randn(16, 3, generator=g,
                                                                     dtype=dtype)


def train(opt_cls, kwargs, steps=STEPS, dtype=torch.float64, scheduler=None, groups=False,
          closure=False):
    net = model(dtype)
    X, y = data(dtype)
    if groups:  # two groups, the second with its own learning rate
        params = [{"params": net[0].parameters()},
                  {"params": net[2].parameters(), "lr": kwargs.get("lr", 1e-3) * 0.5}]
    else:
        params = net.parameters()
    opt = opt_cls(params, **kwargs)
    sched = scheduler(opt) if scheduler else None
    losses = []
    for _ in range(steps):
        def loss_fn():
            opt.zero_grad()
            loss = ((net(X) - y) ** 2).mean()
            loss.backward()
            return loss
        if closure:
            losses.append(opt.step(loss_fn).item())
        else:
            losses.append(loss_fn().item())
            opt.step()
        if sched:
            sched.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()]), losses, opt


def options(grid):
    keys = list(grid)
    return [dict(zip(keys, vals)) for vals in itertools.product(*grid.values())]


ADAM = options(dict(lr=[1e-2], weight_decay=[0.0, 0.1], amsgrad=[False, True],
                    maximize=[False, True], decoupled_weight_decay=[False, True]))
ADAMW = options(dict(lr=[1e-2], weight_decay=[0.0, 0.05], amsgrad=[False, True],
                     betas=[(0.8, 0.99)]))
ADAGRAD = options(dict(lr=[0.1], lr_decay=[0.0, 0.05], weight_decay=[0.0, 0.1],
                       initial_accumulator_value=[0.0, 0.2], maximize=[False, True]))
SGD = (options(dict(lr=[0.05], momentum=[0.0, 0.9], dampening=[0.0, 0.3],
                    weight_decay=[0.0, 0.1], maximize=[False, True]))
       + [dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)])
RMSPROP = options(dict(lr=[1e-2], alpha=[0.9], weight_decay=[0.0, 0.1], momentum=[0.0, 0.5],
                       centered=[False, True], maximize=[False, True]))
CASES = ([("Adam", k) for k in ADAM] + [("AdamW", k) for k in ADAMW]
         + [("Adagrad", k) for k in ADAGRAD] + [("SGD", k) for k in SGD]
         + [("RMSprop", k) for k in RMSPROP])


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in
                                                    enumerate(CASES)])
def test_trajectory_matches_torch_float64(name, kwargs):
    ref, ref_losses, _ = train(getattr(torch.optim, name), kwargs)
    got, losses, _ = train(getattr(ft, name), kwargs)
    # centered RMSprop subtracts two close numbers (v - a**2): torch's kernels round that
    # subtraction differently (FMA), which the cancellation amplifies to ~1e-10 relative
    rtol = 1e-8 if name == "RMSprop" else 1e-10
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)


@pytest.mark.parametrize("name,kwargs", [("Adam", dict(lr=1e-2)), ("AdamW", dict(lr=1e-2)),
                                         ("Adagrad", dict(lr=0.1)),
                                         ("SGD", dict(lr=0.05, momentum=0.9))])
def test_trajectory_float32_groups_and_closure(name, kwargs):
    ref, _, _ = train(getattr(torch.optim, name), kwargs, dtype=torch.float32, groups=True,
                      closure=True)
    got, _, _ = train(getattr(ft, name), kwargs, dtype=torch.float32, groups=True,
                      closure=True)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_step_returns_closure_loss():
    net = model()
    X, y = data()
    opt = ft.Adam(net.parameters())

    def closure():
        opt.zero_grad()
        loss = ((net(X) - y) ** 2).mean()
        loss.backward()
        return loss
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    assert float(loss) == pytest.approx(float(((model()(X) - y) ** 2).mean()))


SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (1 + k)),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05,
                                                                total_steps=STEPS),
    "LinearLR": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1,
                                                            total_iters=10),
}


@pytest.mark.parametrize("sched", sorted(SCHEDULERS))
def test_lr_schedulers(sched):
    ref, _, ropt = train(torch.optim.AdamW, dict(lr=1e-2), scheduler=SCHEDULERS[sched],
                         groups=True)
    got, _, opt = train(ft.AdamW, dict(lr=1e-2), scheduler=SCHEDULERS[sched], groups=True)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ropt.param_groups]


def test_reduce_lr_on_plateau_and_tensor_lr():
    net = model()
    opt = ft.Adam(net.parameters(), lr=torch.tensor(0.01))
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    X, y = data()
    for _ in range(4):
        opt.zero_grad()
        ((net(X) - y) ** 2).mean().backward()
        opt.step()
        sched.step(1.0)  # never improves: lr halves
    assert float(opt.param_groups[0]["lr"]) < 0.01


def test_param_groups_editable_like_torch():
    def run(cls):
        net = model()
        X, y = data()
        opt = cls(net.parameters(), lr=1e-2)
        for k in range(10):
            if k == 4:
                opt.param_groups[0]["lr"] = 3e-3
                opt.param_groups[0]["betas"] = (0.5, 0.9)
                opt.param_groups[0]["weight_decay"] = 0.2
            opt.zero_grad()
            ((net(X) - y) ** 2).mean().backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in net.parameters()])
    np.testing.assert_allclose(run(ft.Adam).numpy(), run(torch.optim.Adam).numpy(),
                               rtol=1e-10, atol=1e-12)


def test_add_param_group_and_frozen_parameters():
    net = model()
    opt = ft.Adam(net[0].parameters(), lr=1e-2)
    opt.add_param_group({"params": net[2].parameters(), "lr": 1e-3})
    net[2].bias.requires_grad_(False)
    before = net[2].bias.detach().clone()
    X, y = data()
    ((net(X) - y) ** 2).mean().backward()
    opt.step()
    assert torch.equal(net[2].bias, before)  # no gradient: untouched, no state
    assert net[2].bias not in opt.state
    assert int(opt.state[net[2].weight]["step"]) == 1


@pytest.mark.parametrize("name,kwargs", [("Adam", dict(lr=1e-2, amsgrad=True)),
                                         ("AdamW", dict(lr=1e-2)),
                                         ("Adagrad", dict(lr=0.1,
                                                          initial_accumulator_value=0.1)),
                                         ("SGD", dict(lr=0.05, momentum=0.9))])
@pytest.mark.parametrize("direction", ["torch_to_fastadam", "fastadam_to_torch"])
def test_state_dict_round_trip(name, kwargs, direction):
    """Train 10 steps with one library, move its state_dict to the other, train 10 more: equal
    to training all 20 steps with torch."""
    first, second = ((getattr(torch.optim, name), getattr(ft, name))
                     if direction == "torch_to_fastadam"
                     else (getattr(ft, name), getattr(torch.optim, name)))
    X, y = data()

    def steps(net, opt, n):
        for _ in range(n):
            opt.zero_grad()
            ((net(X) - y) ** 2).mean().backward()
            opt.step()
    net = model()
    opt = first(net.parameters(), **kwargs)
    steps(net, opt, 10)
    saved = copy.deepcopy(opt.state_dict())
    opt2 = second(net.parameters(), **kwargs)
    opt2.load_state_dict(saved)
    steps(net, opt2, 10)
    ref_net = model()
    ref = getattr(torch.optim, name)(ref_net.parameters(), **kwargs)
    steps(ref_net, ref, 20)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    # the state keeps torch's schema: the same keys, a float32 scalar step
    ours = opt2.state_dict() if second.__module__.startswith("fastadam") else saved
    for st in ours["state"].values():
        if "step" in st:
            assert st["step"].dtype == torch.float32 and st["step"].ndim == 0


def test_load_state_dict_refuses_bad_state():
    net = model()
    opt = ft.Adam(net.parameters())
    X, y = data()
    ((net(X) - y) ** 2).mean().backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["exp_avg"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="exp_avg.*shape"):
        ft.Adam(net.parameters()).load_state_dict(sd)
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["eps"] = -1.0
    with pytest.raises(ValueError, match="eps"):
        ft.Adam(net.parameters()).load_state_dict(sd)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_grad_scaler_skips_nonfinite_steps_like_torch(bad):
    def run(cls):
        net = model(torch.float32)
        X, y = data(torch.float32)
        opt = cls(net.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        scales = []
        for k in range(8):
            opt.zero_grad()
            loss = ((net(X) - y) ** 2).mean()
            scaler.scale(loss).backward()
            if k in (2, 5):
                net[0].weight.grad[0, 0] = bad
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return torch.cat([p.detach().flatten() for p in net.parameters()]), scales, opt
    ref, ref_scales, ropt = run(torch.optim.Adam)
    got, scales, opt = run(ft.Adam)
    assert scales == ref_scales  # the same steps were skipped
    assert bool(torch.isfinite(got).all())
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    first = next(iter(opt.state.values()))
    assert int(first["step"]) == 6  # 8 steps, 2 skipped


class TinyModule(torch.nn.Module):
    """What a Lightning module gives the trainer: a model, a training_step and
    configure_optimizers returning an optimizer and a scheduler config."""

    def __init__(self, optim_module):
        super().__init__()
        self.net = model(torch.float32)
        self.optim_module = optim_module

    def training_step(self, batch):
        X, y = batch
        return ((self.net(X) - y) ** 2).mean()

    def configure_optimizers(self):
        opt = self.optim_module.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def lightning_style_fit(module, epochs=4):
    """The loop a trainer runs: isinstance checks, zero_grad(set_to_none=True), backward,
    step, scheduler per epoch, a checkpoint of optimizer and scheduler state at the end."""
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.Optimizer)
    X, y = data(torch.float32)
    batches = [(X[i:i + 4], y[i:i + 4]) for i in range(0, 16, 4)]
    for _ in range(epochs):
        for batch in batches:
            opt.zero_grad(set_to_none=True)
            module.training_step(batch).backward()
            opt.step()
        sched.step()
    return module, {"optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()}


def test_lightning_style_loop():
    ref, ref_ckpt = lightning_style_fit(TinyModule(torch.optim))
    got, ckpt = lightning_style_fit(TinyModule(ft))
    for p, q in zip(got.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    assert ckpt["lr_scheduler"] == ref_ckpt["lr_scheduler"]
    # the checkpoint resumes in plain torch
    torch.optim.AdamW(got.parameters(), lr=1e-2).load_state_dict(ckpt["optimizer"])


# ---- sparse embeddings --------------------------------------------------------------------

def embedding_run(opt_factory, steps=20, dtype=torch.float32, dense_extra=False):
    torch.manual_seed(3)
    emb = torch.nn.Embedding(50, 8, sparse=True).to(dtype)
    head = torch.nn.Linear(8, 1).to(dtype)
    opt = opt_factory(emb.parameters())
    g = torch.Generator().manual_seed(4)
    for _ in range(steps):
        idx = torch.randint(0, 50, (12,), generator=g)  # duplicates on purpose
        target = torch.randn(12, 1, generator=g, dtype=dtype)
        opt.zero_grad()
        loss = ((head(emb(idx)) - target) ** 2).mean()
        if dense_extra:
            loss = loss + 1e-3 * (emb.weight ** 2).sum()  # a dense term: a dense gradient
        loss.backward()
        opt.step()
    return emb.weight.detach().clone(), opt


def test_sparse_adam_matches_torch_sparse_adam():
    ref, _ = embedding_run(lambda p: torch.optim.SparseAdam(p, lr=1e-2))
    got, opt = embedding_run(lambda p: ft.SparseAdam(p, lr=1e-2))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    # and it is not the torch-convention Adam, which ends measurably elsewhere
    other, _ = embedding_run(lambda p: ft.Adam(p, lr=1e-2))
    assert float((other - ref).abs().max()) > 1e-4


def test_sparse_adam_maximize_and_float64():
    ref, _ = embedding_run(lambda p: torch.optim.SparseAdam(p, lr=1e-2, maximize=True),
                           dtype=torch.float64)
    got, _ = embedding_run(lambda p: ft.SparseAdam(p, lr=1e-2, maximize=True),
                           dtype=torch.float64)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)


def test_adam_sparse_gradient_is_lazy_torch_formula():
    """Adam with an Embedding(sparse=True) gradient: the lazy step with the torch convention,
    against the float64 oracle of tests/reference.py."""
    torch.manual_seed(5)
    emb = torch.nn.Embedding(20, 4, sparse=True).double()
    opt = ft.Adam(emb.parameters(), lr=1e-2, weight_decay=0.1)
    x = emb.weight.detach().numpy().copy()
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    g = torch.Generator().manual_seed(6)
    for t in range(1, 6):
        idx = torch.randint(0, 20, (7,), generator=g)
        opt.zero_grad()
        emb(idx).sum().backward()
        grad = emb.weight.grad.coalesce()
        rows = grad.indices()[0].numpy()
        vals = grad.values().numpy()
        opt.step()
        x, m, v, _ = sparse_adam_reference(x, rows, vals, m, v, t, lr=1e-2, eps=1e-8,
                                           convention="torch", weight_decay=0.1)
    np.testing.assert_allclose(emb.weight.detach().numpy(), x, rtol=1e-12, atol=1e-14)
    untouched = np.setdiff1d(np.arange(20), np.flatnonzero(v.any(axis=1)))
    assert untouched.size  # some rows never moved, and their state stayed zero
    assert not opt.state[emb.weight]["exp_avg"].numpy()[untouched].any()


@pytest.mark.parametrize("name,kwargs", [("Adagrad", dict(lr=0.1)), ("SGD", dict(lr=0.1))])
def test_sparse_adagrad_and_sgd_match_torch(name, kwargs):
    ref, _ = embedding_run(lambda p: getattr(torch.optim, name)(p, **kwargs))
    got, _ = embedding_run(lambda p: getattr(ft, name)(p, **kwargs))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_dense_gradient_after_sparse_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embedding_run(lambda p: ft.Adam(p, lr=1e-2), steps=1)
    assert not [w for w in caught if "dense" in str(w.message)]
    torch.manual_seed(3)
    emb = torch.nn.Embedding(10, 2, sparse=True)
    opt = ft.Adam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    opt.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            emb.weight.grad = torch.ones(10, 2)
            opt.step()
    msgs = [w for w in caught if "had sparse gradients" in str(w.message)]
    assert len(msgs) == 1 and msgs[0].filename == __file__


def test_sparse_adam_refuses_dense_gradients():
    p = torch.nn.Parameter(torch.zeros(3, 2))
    opt = ft.SparseAdam([p])
    p.grad = torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="dense gradients"):
        opt.step()
    assert not p.detach().any()


# ---- errors ---------------------------------------------------------------------------------

def test_errors_name_the_argument():
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="lr"):
        ft.Adam([p], lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        ft.Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="capturable"):
        ft.Adam([p], capturable=True)
    with pytest.raises(TypeError, match=r"params\[0\]: dtype torch.int32"):
        ft.Adam([torch.zeros(4, dtype=torch.int32)])
    with pytest.raises(ValueError, match=r"params\[0\]: its elements overlap"):
        ft.Adam([torch.zeros(1, 3).expand(4, 3)])
    with pytest.raises(ValueError, match="nesterov"):
        ft.SGD([p], lr=0.1, nesterov=True)


def test_bad_group_value_refused_before_any_write():
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3))
    opt = ft.Adam([{"params": [a]}, {"params": [b]}], lr=0.1)
    a.grad = torch.ones(3)
    b.grad = torch.ones(3)
    opt.param_groups[1]["eps"] = float("nan")
    with pytest.raises(ValueError, match="eps"):
        opt.step()
    assert torch.equal(a.detach(), torch.ones(3))  # the first group did not move either


def test_float16_parameters():
    x = torch.nn.Parameter(torch.linspace(-1, 1, 33, dtype=torch.float16))
    opt = ft.Adam([x], lr=1e-2)
    x.grad = torch.full_like(x, 0.5)
    opt.step()
    # first Adam step: x - lr * sign(g) (m/sqrt(v) = 1 after bias correction), up to eps
    expect = torch.linspace(-1, 1, 33, dtype=torch.float32) - 1e-2
    np.testing.assert_allclose(x.detach().float().numpy(), expect.numpy(), atol=2e-3)
    assert opt.state[x]["exp_avg"].dtype == torch.float16


@pytest.mark.parametrize("kwargs", [dict(lr=1e-3), dict(lr=3e-3, weight_decay=0.1,
                                                        betas=(0.8, 0.95), maximize=True)])
def test_lion_against_float64_oracle(kwargs):
    """Lion (no torch.optim twin) against the paper's algorithm in float64 (tests/reference.py),
    on a model trained with fastadam.torch.Lion: the same gradients replayed on the oracle."""
    net = model()
    X, y = data()
    opt = ft.Lion(net.parameters(), **kwargs)
    xs = [p.detach().numpy().copy() for p in net.parameters()]
    ms = [np.zeros_like(x) for x in xs]
    hyper = dict(lr=kwargs["lr"], weight_decay=kwargs.get("weight_decay", 0.0),
                 maximize=kwargs.get("maximize", False))
    hyper["beta1"], hyper["beta2"] = kwargs.get("betas", (0.9, 0.99))
    for t in range(1, 11):
        opt.zero_grad()
        ((net(X) - y) ** 2).mean().backward()
        grads = [p.grad.numpy().copy() for p in net.parameters()]
        opt.step()
        for i, g in enumerate(grads):
            xs[i], ms[i] = lion_reference(xs[i], g, ms[i], t, **hyper)
    for p, x, m in zip(net.parameters(), xs, ms):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), m, rtol=1e-12, atol=1e-14)


def test_rmsprop_state_dict_round_trip_with_torch():
    X, y = data()

    def steps(net, opt, n):
        for _ in range(n):
            opt.zero_grad()
            ((net(X) - y) ** 2).mean().backward()
            opt.step()
    kw = dict(lr=1e-2, momentum=0.5, centered=True)
    net = model()
    opt = torch.optim.RMSprop(net.parameters(), **kw)
    steps(net, opt, 5)
    ours = ft.RMSprop(net.parameters(), **kw)
    ours.load_state_dict(copy.deepcopy(opt.state_dict()))
    steps(net, ours, 5)
    ref_net = model()
    ref = torch.optim.RMSprop(ref_net.parameters(), **kw)
    steps(ref_net, ref, 10)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)


def _twin_runs(change, steps_before=3, steps_after=3, kwargs=None):
    """The same model trained by torch.optim.Adam and fastadam.torch.Adam, ``change(opt, net)``
    applied to both between two runs of steps; returns both parameter vectors and optimizers."""
    kwargs = kwargs or dict(lr=1e-2, amsgrad=True)
    out = []
    for cls in (torch.optim.Adam, ft.Adam):
        net = model()
        X, y = data()
        opt = cls(net.parameters(), **kwargs)
        for k in range(steps_before + steps_after):
            if k == steps_before:
                change(opt, net)
            opt.zero_grad()
            ((net(X) - y) ** 2).mean().backward()
            opt.step()
        out.append((torch.cat([p.detach().flatten() for p in net.parameters()]), opt))
    return out


def test_parameter_memory_replaced_between_steps():
    # the step keeps NumPy views of each parameter; `p.data = ...` must be seen at the next step
    def change(opt, net):
        w = net[0].weight
        w.data = w.data.clone() * 0.5
    (a, _), (b, _) = _twin_runs(change)
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)


def test_state_tensor_replaced_between_steps():
    # a state tensor put in opt.state by the user is the one the next step updates
    def change(opt, net):
        p = net[2].bias
        opt.state[p]["exp_avg"] = torch.full_like(p, 0.25)
        opt.state[p]["max_exp_avg_sq"] = torch.full_like(p, 0.5)
    (a, ta), (b, fb) = _twin_runs(change)
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)
    p_t, p_f = ta.param_groups[0]["params"][3], fb.param_groups[0]["params"][3]
    np.testing.assert_allclose(fb.state[p_f]["exp_avg"].numpy(),
                               ta.state[p_t]["exp_avg"].numpy(), rtol=1e-12, atol=1e-14)


def test_step_counter_is_torch_s_float32_count():
    (_, ta), (_, fb) = _twin_runs(lambda opt, net: None, kwargs=dict(lr=1e-2))
    for p_t, p_f in zip(ta.param_groups[0]["params"], fb.param_groups[0]["params"]):
        s_t, s_f = ta.state[p_t]["step"], fb.state[p_f]["step"]
        assert s_f.dtype == s_t.dtype == torch.float32 and s_f.shape == s_t.shape == ()
        assert s_f.item() == s_t.item() == 6.0
    # a parameter without a gradient keeps its count; a loaded float64 count stays float64
    net = model()
    opt = ft.Adam(net.parameters(), lr=1e-2)
    X, y = data()
    ((net(X) - y) ** 2).mean().backward()
    opt.step()
    sd = opt.state_dict()
    for s in sd["state"].values():
        s["step"] = torch.tensor(2.0**24, dtype=torch.float32)  # float32 stops counting here
    sd["state"][0]["step"] = torch.tensor(7.0, dtype=torch.float64)
    opt.load_state_dict(sd)
    net[0].bias.grad = None
    for _ in range(2):
        opt.step()
    steps = [opt.state[p]["step"] for p in net.parameters()]
    assert steps[0].dtype == torch.float64 and steps[0].item() == 9.0
    assert steps[1].item() == 2.0**24  # no gradient: not stepped (and float32 would not move)
    assert steps[2].item() == float(torch.tensor(2.0**24) + 1.0 + 1.0) == 2.0**24


def test_parameter_made_noncontiguous_between_steps_steps_like_torch():
    """A parameter whose tensor is re-strided between steps (the same memory, other strides)
    steps through a contiguous copy, as torch.optim steps it."""
    def run(cls):
        net = model()
        opt = cls(net.parameters(), lr=1e-2)
        X, y = data()
        for k in range(3):
            opt.zero_grad()
            ((net(X) - y) ** 2).mean().backward()
            if k == 1:
                w = net[0].weight
                w.data = w.data.as_strided(w.shape, (1, w.shape[0]))
                w.grad = w.grad.as_strided(w.shape, (1, w.shape[0]))
            opt.step()
        assert not net[0].weight.is_contiguous()
        return [p.detach().clone() for p in net.parameters()]
    for a, b in zip(run(ft.Adam), run(torch.optim.Adam)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
