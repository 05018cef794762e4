"""The optimizer objects against torch.optim over 50 steps: Adam, AdamW, Adagrad, SGD with
parameter groups and learning-rate schedules (torch's schedulers as the reference), global-norm
clipping against torch.nn.utils.clip_grad_norm_, and Adam.from_torch."""
import numpy as np
import pytest

import fastadam
from fastadam.optim import schedules

torch = pytest.importorskip("torch")

HAS_ADAGRAD = hasattr(fastadam.optim, "adagrad_step_inplace")
HAS_MOMENTUM = hasattr(fastadam.optim, "momentum_step_inplace")
STEPS = 50
SHAPES = [(6, 4), (5,), (3, 2)]


def problem(rng):
    """float64 parameters, their torch twins and 50 steps of gradients."""
    params = [rng.standard_normal(s) for s in SHAPES]
    twins = [torch.nn.Parameter(torch.tensor(p)) for p in params]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]
    return params, twins, grads


def run_torch(opt, twins, grads, scheduler=None, clip=None):
    for step_grads in grads:
        for p, g in zip(twins, step_grads):
            p.grad = torch.tensor(g)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(twins, clip)
        opt.step()
        if scheduler is not None:
            scheduler.step()


def assert_close(params, twins, rtol=1e-10):
    for p, t in zip(params, twins):
        np.testing.assert_allclose(p, t.detach().numpy(), rtol=rtol, atol=1e-12)


def groups_of(items, **second):
    return [{"params": items[:2]}, {"params": items[2:], **second}]


@pytest.mark.parametrize("amsgrad, maximize", [(False, False), (True, True)])
def test_adam_with_groups_matches_torch(rng, amsgrad, maximize):
    params, twins, grads = problem(rng)
    kw = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, amsgrad=amsgrad, maximize=maximize)
    ours = fastadam.Adam(groups_of(params, weight_decay=0.1, lr=0.03), **kw)
    theirs = torch.optim.Adam(groups_of(twins, weight_decay=0.1, lr=0.03), **kw)
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads)
    assert ours.t == STEPS
    assert_close(params, twins)


def test_adamw_with_cosine_warmup_matches_torch(rng):
    params, twins, grads = problem(rng)
    ours = fastadam.AdamW(params, lr=schedules.cosine(0.05, STEPS, warmup_steps=5,
                                                      warmup_start_lr=0.005, final_lr=0.001),
                          weight_decay=0.05)
    theirs = torch.optim.AdamW(twins, lr=0.05, weight_decay=0.05)
    warm = torch.optim.lr_scheduler.LinearLR(theirs, start_factor=0.1, total_iters=5)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(theirs, T_max=STEPS - 5, eta_min=0.001)
    sched = torch.optim.lr_scheduler.SequentialLR(theirs, [warm, cos], milestones=[5])
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads, sched)
    assert_close(params, twins)


def test_lambda_schedule_per_group_matches_lambdalr(rng):
    params, twins, grads = problem(rng)
    decay = [lambda k: 0.97 ** k, lambda k: 1.0 / (1 + 0.1 * k)]
    ours = fastadam.Adam(groups_of(params, lr=lambda k: 0.02 * decay[1](k)),
                         lr=lambda k: 0.01 * decay[0](k))
    theirs = torch.optim.Adam(groups_of(twins, lr=0.02), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(theirs, decay)
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads, sched)
    assert_close(params, twins)


def torch_lrs(make, n=STEPS):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = make(opt)
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("ours, make", [
    (schedules.constant(0.1), lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=1.0)),
    (schedules.step(0.1, 7, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 7, 0.5)),
    (schedules.exponential(0.1, 0.93), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.93)),
    (schedules.cosine(0.1, STEPS, final_lr=0.002),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS, eta_min=0.002)),
    (schedules.one_cycle(0.1, STEPS),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=STEPS,
                                                   cycle_momentum=False)),
    (schedules.one_cycle(0.1, STEPS, pct_start=0.4, anneal="linear", three_phase=True,
                         div_factor=10.0, final_div_factor=100.0),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(
         o, 0.1, total_steps=STEPS, pct_start=0.4, anneal_strategy="linear", three_phase=True,
         div_factor=10.0, final_div_factor=100.0, cycle_momentum=False)),
])
def test_schedules_match_torch_schedulers(ours, make):
    expected = torch_lrs(make)
    np.testing.assert_allclose([ours(k) for k in range(STEPS)], expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("warmup", [0, 4])
def test_periodic_cosine_matches_cosine_annealing_lr_past_total_steps(warmup):
    """torch's CosineAnnealingLR is periodic: after T_max it rises back to lr.  The default
    cosine holds final_lr there; periodic=True equals torch at every step (5 periods here)."""
    total, n = 12, 5 * 2 * 8 + 3
    ours = schedules.cosine(0.1, total, warmup_steps=warmup, warmup_start_lr=0.01,
                            final_lr=0.002, periodic=True)

    def make(o):
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=total - warmup, eta_min=0.002)
        if not warmup:
            return cos
        warm = torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=warmup)
        return torch.optim.lr_scheduler.SequentialLR(o, [warm, cos], milestones=[warmup])
    expected = torch_lrs(make, n)
    np.testing.assert_allclose([ours(k) for k in range(n)], expected, rtol=1e-9, atol=1e-15)
    assert max(expected[total + 1:]) > 0.09  # torch does rise again ...
    held = schedules.cosine(0.1, total, warmup_steps=warmup, warmup_start_lr=0.01,
                            final_lr=0.002)
    np.testing.assert_allclose([held(k) for k in range(total + 1)], expected[:total + 1],
                               rtol=1e-9, atol=1e-15)
    assert [held(k) for k in range(total, n)] == [0.002] * (n - total)  # ... the default holds


@pytest.mark.parametrize("grad_scale", [None, 512.0])
def test_clip_grad_norm_matches_torch(rng, grad_scale):
    params, twins, grads = problem(rng)
    grads = [[3.0 * g for g in step] for step in grads]  # norms around 15: clipping is active
    ours = fastadam.Adam(params, lr=0.01, clip_grad_norm=1.0)
    theirs = torch.optim.Adam(twins, lr=0.01)
    for g in grads:
        if grad_scale is None:
            ours.step(g)
        else:
            ours.step([a * grad_scale for a in g], grad_scale=grad_scale)
    run_torch(theirs, twins, grads, clip=1.0)
    assert_close(params, twins, rtol=1e-9)


def test_clip_grad_norm_function_matches_torch(rng):
    grads = [rng.standard_normal(s) for s in SHAPES]
    twins = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SHAPES]
    for p, g in zip(twins, grads):
        p.grad = torch.tensor(g)
    expected = float(torch.nn.utils.clip_grad_norm_(twins, 0.5))
    assert fastadam.clip_grad_norm(grads, 0.5) == pytest.approx(expected, rel=1e-12)
    for g, p in zip(grads, twins):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-12)


def test_from_torch_continues_the_torch_run(rng):
    params, twins, grads = problem(rng)
    theirs = torch.optim.AdamW(groups_of(twins, lr=0.02), lr=0.01, weight_decay=0.1,
                               amsgrad=True)
    run_torch(theirs, twins, grads[:20])
    ours = fastadam.AdamW.from_torch(theirs)
    assert ours.t == 20
    assert ours.param_groups[1]["lr"] == 0.02
    shadow = [torch.nn.Parameter(t.detach().clone()) for t in twins]
    reference = torch.optim.AdamW(groups_of(shadow, lr=0.02), lr=0.01, weight_decay=0.1,
                                  amsgrad=True)
    reference.load_state_dict(theirs.state_dict())
    for g in grads[20:]:
        ours.step(g)  # updates the torch parameters in place
    run_torch(reference, shadow, grads[20:])
    assert_close([t.detach().numpy() for t in twins], shadow)


def test_from_torch_adam_with_coupled_decay(rng):
    params, twins, grads = problem(rng)
    theirs = torch.optim.Adam(twins, lr=0.01, weight_decay=0.1)
    run_torch(theirs, twins, grads[:3])
    ours = fastadam.Adam.from_torch(theirs)
    assert ours.param_groups[0]["decoupled_weight_decay"] is False
    with pytest.raises(ValueError, match="coupled weight decay"):
        fastadam.AdamW.from_torch(theirs)
    with pytest.raises(TypeError, match="expected a torch.optim.Adam or AdamW, got SGD"):
        fastadam.Adam.from_torch(torch.optim.SGD(twins, lr=0.1))


@pytest.mark.skipif(not HAS_ADAGRAD, reason="needs fastadam.optim.adagrad_step_inplace")
def test_adagrad_with_groups_and_schedule_matches_torch(rng):
    params, twins, grads = problem(rng)
    kw = dict(lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10)
    ours = fastadam.Adagrad(groups_of(params, weight_decay=0.1, maximize=True),
                            lr=schedules.step(0.05, 10, 0.5), **kw)
    theirs = torch.optim.Adagrad(groups_of(twins, weight_decay=0.1, maximize=True), lr=0.05, **kw)
    sched = torch.optim.lr_scheduler.StepLR(theirs, 10, 0.5)
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads, sched)
    assert_close(params, twins)


@pytest.mark.skipif(not HAS_MOMENTUM, reason="needs fastadam.optim.momentum_step_inplace")
def test_sgd_with_groups_and_schedule_matches_torch(rng):
    params, twins, grads = problem(rng)
    second = dict(nesterov=True, dampening=0.0, weight_decay=0.01)
    kw = dict(momentum=0.9, dampening=0.1, maximize=False)
    ours = fastadam.SGD(groups_of(params, **second), lr=schedules.exponential(0.02, 0.97), **kw)
    theirs = torch.optim.SGD(groups_of(twins, **second), lr=0.02, **kw)
    sched = torch.optim.lr_scheduler.ExponentialLR(theirs, 0.97)
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads, sched)
    assert_close(params, twins)


@pytest.mark.skipif(not HAS_MOMENTUM, reason="needs fastadam.optim.momentum_step_inplace")
def test_plain_sgd_ignores_dampening_as_torch(rng):
    params, twins, grads = problem(rng)
    ours = fastadam.SGD(params, lr=0.05, dampening=0.5, maximize=True)
    theirs = torch.optim.SGD(twins, lr=0.05, dampening=0.5, maximize=True)
    for g in grads:
        ours.step(g)
    run_torch(theirs, twins, grads)
    assert_close(params, twins)
