"""fastadam.torch steps and loads all or nothing, as torch users probe it (issue 39, item 6).

Each refused step or load is compared with the optimizer before it (every parameter and state
tensor bit for bit, the step counts) and then with torch.optim on the same input: the next
valid step must be the step torch takes, as if the refused one had never been tried."""
import copy
import gc
import pickle
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fastadam.optim  # noqa: E402
import fastadam.torch as ft  # noqa: E402


def snapshot(opt):
    """Every parameter and every state value of ``opt`` (copies)."""
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    state = {i: {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                 for k, v in opt.state[p].items()}
             for i, p in enumerate(p for g in opt.param_groups for p in g["params"])
             if p in opt.state}
    return params, state


def assert_same(before, opt):
    params, state = snapshot(opt)
    for a, b in zip(before[0], params):
        assert torch.equal(a, b)
    assert before[1].keys() == state.keys()
    for i in state:
        assert before[1][i].keys() == state[i].keys()
        for k, v in state[i].items():
            if torch.is_tensor(v):
                assert v.dtype == before[1][i][k].dtype
                torch.testing.assert_close(v, before[1][i][k], rtol=0, atol=0, equal_nan=True)
            else:
                assert v == before[1][i][k]


def two_groups(cls, dtypes=(torch.float64, torch.float64), group1=None, **kw):
    g = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(6, 3, generator=g, dtype=dtypes[0]))
    b = torch.nn.Parameter(torch.randn(5, 3, generator=g, dtype=dtypes[1]))
    opt = cls([{"params": [a]}, {"params": [b], **(group1 or {})}], **kw)
    return opt, a, b


def grads(a, b, seed=1, sparse_b=False):
    g = torch.Generator().manual_seed(seed)
    a.grad = torch.randn(a.shape, generator=g, dtype=a.dtype)
    gb = torch.randn(b.shape, generator=g, dtype=b.dtype)
    b.grad = gb.to_sparse(1) if sparse_b else gb


def torch_twin(opt, cls, **kw):
    """torch.optim's ``cls`` over copies of ``opt``'s parameters, in the same groups."""
    groups = []
    for g in opt.param_groups:
        groups.append({"params": [torch.nn.Parameter(p.detach().clone()) for p in g["params"]],
                       **{k: v for k, v in g.items() if k in ("lr", "eps", "amsgrad",
                                                            "weight_decay", "momentum")}})
    return cls(groups, **kw)


def step_both(ours, theirs, seed=2):
    for o, t in zip(ours.param_groups, theirs.param_groups):
        for p, q in zip(o["params"], t["params"]):
            g = torch.Generator().manual_seed(seed)
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            q.grad = p.grad.clone()
    ours.step()
    theirs.step()
    for o, t in zip(ours.param_groups, theirs.param_groups):
        for p, q in zip(o["params"], t["params"]):
            assert_follows(p, q)


def assert_follows(p, q):
    """``p`` equals torch's ``q``: to 1e-12 in float64, to float32's precision otherwise."""
    tol = dict(rtol=1e-12, atol=1e-14) if p.dtype == torch.float64 else dict(rtol=1e-6,
                                                                            atol=1e-7)
    torch.testing.assert_close(p.detach(), q.detach(), **tol)


# ---- a step refused by a later call leaves every group unstepped -----------------------------

def _eps_float32():
    return two_groups(ft.Adam, (torch.float64, torch.float32), {"eps": 1e-50}, lr=0.1)


def _lr_float32():
    return two_groups(ft.Adam, (torch.float64, torch.float32), {"lr": 1e300}, lr=0.1)


def _amsgrad_sparse():
    return two_groups(ft.Adam, group1={"amsgrad": True}, lr=0.1)


def _cases():
    def eps(opt, a, b):
        grads(a, b)

    def amsgrad_sparse(opt, a, b):
        grads(a, b, sparse_b=True)

    def row_out_of_range(opt, a, b):
        grads(a, b)
        idx = torch.tensor([[1, b.shape[0]]])
        b.grad = torch.sparse_coo_tensor(idx, torch.ones(2, 3, dtype=b.dtype), b.shape,
                                         check_invariants=False)

    def negative_row(opt, a, b):
        grads(a, b)
        b.grad = torch.sparse_coo_tensor(torch.tensor([[-1]]), torch.ones(1, 3, dtype=b.dtype),
                                         b.shape, check_invariants=False)

    def aliased_state(opt, a, b):
        grads(a, b)
        opt.step()
        opt.state[b]["exp_avg_sq"] = opt.state[b]["exp_avg"]

    def state_aliases_other_group(opt, a, b):
        grads(a, b)
        opt.step()
        # b's exp_avg now shares memory with a's (the first 15 of its 18 elements)
        opt.state[b]["exp_avg"] = opt.state[a]["exp_avg"].view(-1)[:15].view(5, 3)

    def wrong_shape_state(opt, a, b):
        grads(a, b)
        opt.step()
        opt.state[b]["exp_avg"] = torch.zeros(3, 5, dtype=b.dtype)

    def wrong_dtype_state(opt, a, b):
        grads(a, b)
        opt.step()
        opt.state[b]["exp_avg_sq"] = opt.state[b]["exp_avg_sq"].float()

    def grad_is_other_param(opt, a, b):
        grads(a, b)
        b.grad = a.detach()[:5]

    def fractional_step(opt, a, b):
        grads(a, b)
        opt.step()
        opt.state[b]["step"].fill_(1.5)

    def nan_step(opt, a, b):
        grads(a, b)
        opt.step()
        opt.state[b]["step"].fill_(float("nan"))

    def nan_eps_in_group(opt, a, b):
        grads(a, b)
        opt.param_groups[1]["eps"] = float("nan")

    two = lambda **g1: (lambda: two_groups(ft.Adam, group1=g1, lr=0.1))  # noqa: E731
    return [
        ("eps float32 cannot hold", _eps_float32, eps, ValueError, "eps"),
        ("lr float32 cannot hold", _lr_float32, eps, ValueError, "lr"),
        ("amsgrad with a sparse gradient", _amsgrad_sparse, amsgrad_sparse, ValueError,
         "amsgrad"),
        ("sparse row out of range", two(), row_out_of_range, IndexError, "row 5"),
        ("negative sparse row", two(), negative_row, IndexError, "row -1"),
        ("aliased state", two(), aliased_state, ValueError, "shares memory"),
        ("state aliasing another group", two(), state_aliases_other_group, ValueError,
         "shares memory"),
        ("wrongly shaped state", two(), wrong_shape_state, ValueError, "exp_avg.*shape"),
        ("wrong state dtype", two(), wrong_dtype_state, ValueError, "exp_avg_sq.*dtype"),
        ("gradient aliasing a parameter", two(), grad_is_other_param, ValueError,
         "shares memory"),
        ("fractional step count", two(), fractional_step, ValueError, "'step'"),
        ("NaN step count", two(), nan_step, ValueError, "'step'"),
        ("NaN eps in a group", two(), nan_eps_in_group, ValueError, "eps"),
    ]


CASES = _cases()


@pytest.mark.parametrize("make,provoke,exc,match", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_refused_step_changes_nothing(make, provoke, exc, match):
    opt, a, b = make()
    provoke(opt, a, b)
    before = snapshot(opt)
    with pytest.raises(exc, match=match):
        opt.step()
    assert_same(before, opt)
    with pytest.raises(exc, match=match):  # refused again: nothing half-built in between
        opt.step()
    assert_same(before, opt)


def test_a_refused_first_step_creates_no_state_and_the_next_step_is_torch_s_first():
    opt, a, b = _eps_float32()
    grads(a, b)
    with pytest.raises(ValueError, match="eps"):
        opt.step()
    assert len(opt.state) == 0
    opt.param_groups[1]["eps"] = 1e-8
    theirs = torch_twin(opt, torch.optim.Adam, lr=0.1)
    step_both(opt, theirs)
    for p in (a, b):
        assert opt.state[p]["step"].item() == 1.0


@pytest.mark.parametrize("cls,kw", [(ft.Adam, dict(lr=0.1)), (ft.SGD, dict(lr=0.1, momentum=0.9)),
                                    (ft.RMSprop, dict(lr=0.1, centered=True))])
def test_a_single_call_refused_by_its_gradient_check_leaves_no_state(cls, kw):
    p = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = cls([p], **kw)
    p.grad = p.detach()  # the gradient is the parameter's own memory
    x = p.detach().clone()
    with pytest.raises(ValueError, match="share memory"):
        opt.step()
    assert len(opt.state) == 0 and torch.equal(p.detach(), x)


def test_sgd_refused_step_creates_no_momentum_buffer():
    """The planning of a refused step made momentum buffers: the next step was torch's second
    step (0.95 instead of 0.9 with dampening 0.5)."""
    def run(provoke):
        a, b = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.ones(4, 4))
        opt = ft.SGD([{"params": [a]}, {"params": [b]}], lr=0.1, momentum=0.9, dampening=0.5)
        if provoke:
            a.grad, b.grad = torch.ones(8), torch.ones(4, 4).to_sparse(2)
            with pytest.raises(ValueError, match="sparse_dim"):
                opt.step()
            assert len(opt.state) == 0
        a.grad, b.grad = torch.ones(8), torch.ones(4, 4)
        opt.step()
        return a.detach().clone()
    ref = torch.nn.Parameter(torch.ones(8))
    t = torch.optim.SGD([ref], lr=0.1, momentum=0.9, dampening=0.5)
    ref.grad = torch.ones(8)
    t.step()
    assert torch.equal(run(False), ref.detach())
    assert torch.equal(run(True), ref.detach())


def owned_buffers(obj, skip):
    """Tensors and NumPy arrays with memory of their own reachable from ``obj`` (not those
    whose memory is one of ``skip``'s)."""
    skip_ptrs = {t.untyped_storage().data_ptr() for t in skip}
    seen, todo, found = set(), [obj], []
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, type(gc))):
            continue
        seen.add(id(o))
        if torch.is_tensor(o):
            if o.untyped_storage().data_ptr() not in skip_ptrs and o.numel() > 1:
                found.append(o)
            continue
        if isinstance(o, np.ndarray):
            if o.base is None and o.size > 1:
                found.append(o)
            continue
        todo.extend(gc.get_referents(o))
    return found


def test_plain_sgd_keeps_no_copy_of_the_parameters():
    ps = [torch.nn.Parameter(torch.randn(1000, dtype=torch.float64)) for _ in range(3)]
    ours = ft.SGD(ps, lr=0.1, weight_decay=0.01, maximize=True)
    theirs = torch_twin(ours, torch.optim.SGD, lr=0.1, weight_decay=0.01, maximize=True)
    for seed in range(3):
        step_both(ours, theirs, seed)
    assert len(ours.state) == 0
    skip = ps + [p.grad for p in ps]
    assert owned_buffers(ours, skip) == []


# ---- Ctrl-C during a two-group step --------------------------------------------------------

def test_ctrl_c_between_two_calls_comes_after_the_whole_step(monkeypatch):
    """SIGINT raised right after the first compiled call of a two-group step: the interrupt
    is delivered when the step is over, both groups stepped and both counts advanced."""
    opt, a, b = two_groups(ft.Adam, lr=0.1)
    theirs = torch_twin(opt, torch.optim.Adam, lr=0.1)
    step_both(opt, theirs, 3)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    real = fastadam.optim.PreparedStep.step
    calls = []

    def interrupted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(fastadam.optim.PreparedStep, "step", interrupted)
    for o, t in zip(opt.param_groups, theirs.param_groups):
        for p, q in zip(o["params"], t["params"]):
            p.grad = torch.full_like(p, 0.25)
            q.grad = p.grad.clone()
    with pytest.raises(KeyboardInterrupt):
        opt.step()
    monkeypatch.undo()
    assert len(calls) == 2
    theirs.step()
    for o, t in zip(opt.param_groups, theirs.param_groups):
        for p, q in zip(o["params"], t["params"]):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-14)
            assert opt.state[p]["step"].item() == 2.0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---- load_state_dict: check everything, then install ----------------------------------------

def _bad_state_dicts():
    def edit(f):
        return f

    @edit
    def fractional_step(sd):
        sd["state"][0]["step"] = torch.tensor(1.5)
        sd["state"][0]["exp_avg"] = torch.full((4,), 123.0, dtype=torch.float64)

    @edit
    def nan_step(sd):
        sd["state"][1]["step"] = torch.tensor(float("nan"))

    @edit
    def negative_step(sd):
        sd["state"][1]["step"] = -1.0

    @edit
    def string_step(sd):
        sd["state"][1]["step"] = "3"

    @edit
    def huge_step(sd):
        sd["state"][1]["step"] = 10 ** 400

    @edit
    def missing_step(sd):
        del sd["state"][1]["step"]

    @edit
    def missing_exp_avg_sq(sd):
        del sd["state"][1]["exp_avg_sq"]

    @edit
    def wrong_shape(sd):
        sd["state"][1]["exp_avg"] = torch.zeros(3, 3, dtype=torch.float64)

    @edit
    def not_a_tensor(sd):
        sd["state"][1]["exp_avg"] = [0.0] * 6

    @edit
    def state_not_a_dict(sd):
        sd["state"][1] = 5

    @edit
    def amsgrad_without_max(sd):
        sd["param_groups"][0]["amsgrad"] = True

    @edit
    def negative_eps(sd):
        sd["param_groups"][0]["eps"] = -1.0

    @edit
    def nan_lr(sd):
        sd["param_groups"][0]["lr"] = float("nan")

    @edit
    def capturable(sd):
        sd["param_groups"][0]["capturable"] = True

    @edit
    def bad_betas(sd):
        sd["param_groups"][0]["betas"] = (0.9,)

    @edit
    def other_group_count(sd):
        sd["param_groups"].append(dict(sd["param_groups"][0]))

    @edit
    def other_param_count(sd):
        sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:1]

    @edit
    def not_a_state_dict(sd):
        sd.pop("state")

    return [(f.__name__, f) for f in (
        fractional_step, nan_step, negative_step, string_step, huge_step, missing_step,
        missing_exp_avg_sq, wrong_shape, not_a_tensor, state_not_a_dict, amsgrad_without_max,
        negative_eps, nan_lr, capturable, bad_betas, other_group_count, other_param_count,
        not_a_state_dict)]


BAD_LOADS = _bad_state_dicts()


@pytest.mark.parametrize("edit", [f for _, f in BAD_LOADS], ids=[n for n, _ in BAD_LOADS])
def test_a_refused_load_leaves_the_optimizer_as_it_was(edit):
    def make(cls):
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(4, dtype=torch.float64)),
              torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64))]
        return ps, cls(ps, lr=0.1)
    ps, opt = make(ft.Adam)
    qs, ref = make(torch.optim.Adam)
    for k in range(5):
        for p, q in zip(ps, qs):
            p.grad = torch.full_like(p, 0.1 * (k + 1))
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    sd = copy.deepcopy(opt.state_dict())
    edit(sd)
    before = snapshot(opt)
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"}
                                   for g in opt.param_groups])
    with pytest.raises((ValueError, TypeError)):
        opt.load_state_dict(sd)
    assert_same(before, opt)
    assert [{k: v for k, v in g.items() if k != "params"}
            for g in opt.param_groups] == groups_before
    for p, q in zip(ps, qs):  # training goes on as torch's, which never saw the bad load
        p.grad = torch.full_like(p, 0.7)
        q.grad = p.grad.clone()
    opt.step()
    ref.step()
    for p, q in zip(ps, qs):
        assert_follows(p, q)
        assert opt.state[p]["step"].item() == ref.state[q]["step"].item() == 6.0


# ---- state whose storage is swapped ----------------------------------------------------------

@pytest.mark.parametrize("how", ["data", "set_"])
@pytest.mark.parametrize("cls,kw", [(ft.Adam, dict(lr=0.1, amsgrad=True)),
                                    (ft.Adagrad, dict(lr=0.1)),
                                    (ft.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
                                    (ft.SGD, dict(lr=0.1, momentum=0.9))])
def test_swapped_state_storage_is_followed_as_torch_follows_it(how, cls, kw):
    twin = getattr(torch.optim, cls.__name__)
    runs = []
    for c in (twin, cls):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(64, dtype=torch.float64))
        opt = c([p], **kw)
        for k in range(6):
            p.grad = torch.sin(p.detach() * (k + 1))
            opt.step()
            if k == 2:
                for key, v in list(opt.state[p].items()):
                    new = v.detach().clone() * (1.0 if key == "step" else 0.5)
                    if how == "data":
                        v.data = new
                    else:
                        v.set_(new)
        runs.append((p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}))
    (pt, st), (pf, sf) = runs
    torch.testing.assert_close(pf, pt, rtol=1e-12, atol=1e-14)
    assert st.keys() == sf.keys()
    for k in st:
        torch.testing.assert_close(sf[k], st[k], rtol=1e-12, atol=1e-14)


# ---- hostile values ----------------------------------------------------------------------------

HOSTILE = [
    (ft.Adam, dict(lr=10 ** 400), ValueError, "lr"),
    (ft.Adam, dict(lr="0.1"), TypeError, "lr"),
    (ft.Adam, dict(lr=None), TypeError, "lr"),
    (ft.Adam, dict(eps=float("nan")), ValueError, "eps"),
    (ft.Adam, dict(betas=(0.9, float("nan"))), ValueError, r"beta.*1"),
    (ft.Adam, dict(betas=0.9), TypeError, "betas"),
    (ft.Adam, dict(weight_decay=10 ** 400), ValueError, "weight_decay"),
    (ft.Adam, dict(amsgrad="yes"), TypeError, "amsgrad"),
    (ft.Adagrad, dict(lr_decay=object()), TypeError, "lr_decay"),
    (ft.Adagrad, dict(initial_accumulator_value=float("inf")), ValueError,
     "initial_accumulator_value"),
    (ft.SGD, dict(lr=0.1, momentum=10 ** 400), ValueError, "momentum"),
    (ft.SGD, dict(lr=0.1, dampening=float("nan")), ValueError, "dampening"),
    (ft.RMSprop, dict(alpha=float("nan")), ValueError, "alpha"),
    (ft.Lion, dict(betas=(0.9, 2.0)), ValueError, r"betas\[1\]"),
    (ft.SparseAdam, dict(eps="x"), TypeError, "eps"),
]


@pytest.mark.parametrize("cls,kw,exc,match", HOSTILE,
                         ids=[f"{c.__name__}-{'-'.join(k)}" for c, k, _, _ in HOSTILE])
def test_hostile_hyper_parameters_get_a_clear_error(cls, kw, exc, match):
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(exc, match=match):
        cls([p], **kw)


@pytest.mark.parametrize("key,value,exc", [("lr", 10 ** 400, ValueError),
                                           ("lr", "x", TypeError),
                                           ("eps", None, TypeError),
                                           ("betas", (0.9, 10 ** 400), ValueError)])
def test_hostile_group_values_at_step_are_refused_before_any_write(key, value, exc):
    opt, a, b = two_groups(ft.Adam, lr=0.1)
    grads(a, b)
    opt.param_groups[1][key] = value
    before = snapshot(opt)
    with pytest.raises(exc, match=key):
        opt.step()
    assert_same(before, opt)


@pytest.mark.parametrize("edit,exc,match", [
    (lambda s: s.__setitem__("step", "3"), TypeError, "'step'"),
    (lambda s: s.__setitem__("step", torch.ones(2)), ValueError, "'step'"),
    (lambda s: s.__setitem__("step", torch.tensor(float("inf"))), ValueError, "'step'"),
    (lambda s: s.__setitem__("exp_avg", "x"), TypeError, "'exp_avg'"),
    (lambda s: s.__setitem__("exp_avg", torch.zeros(5, 3, dtype=torch.int64)), TypeError,
     "'exp_avg'"),
], ids=["string step", "two-element step", "infinite step", "string state",
        "integer state"])
def test_hostile_state_is_refused_before_any_write(edit, exc, match):
    opt, a, b = two_groups(ft.Adam, lr=0.1)
    grads(a, b)
    opt.step()
    edit(opt.state[b])
    before = snapshot(opt)
    with pytest.raises(exc, match=match):
        opt.step()
    assert_same(before, opt)


def test_a_state_that_is_not_a_dict_is_refused():
    opt, a, b = two_groups(ft.Adam, lr=0.1)
    grads(a, b)
    opt.state[b] = 5
    with pytest.raises(TypeError, match="expected a dict"):
        opt.step()
    assert len(opt.state) == 1 and torch.equal(a.detach(), two_groups(ft.Adam, lr=0.1)[1].detach())


def test_pickled_optimizer_refuses_like_the_original():
    opt, a, b = _eps_float32()
    grads(a, b)
    clone = pickle.loads(pickle.dumps(opt))
    grads(*(p for g in clone.param_groups for p in g["params"]))
    with pytest.raises(ValueError, match="eps"):
        clone.step()


def reachable_array_addresses(obj):
    """The data addresses of every NumPy array reachable from ``obj``."""
    seen, todo, out = set(), [obj], set()
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, type(gc))) or torch.is_tensor(o):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            out.add(o.__array_interface__["data"][0])
            continue
        todo.extend(gc.get_referents(o))
    return out


def test_replaced_parameter_memory_is_not_kept_by_the_optimizer():
    """After ``p.data = ...`` the optimizer keeps no view of the old memory (its prepared
    steps are rebuilt, not kept beside the new ones)."""
    ps = [torch.nn.Parameter(torch.randn(100, dtype=torch.float64)) for _ in range(3)]
    opt = ft.Adam([{"params": ps[:2]}, {"params": ps[2:]}], lr=0.1)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    old = {p.data_ptr() for p in ps}
    assert old <= reachable_array_addresses(opt)
    for p in ps:
        p.data = p.data.clone()
    opt.step()
    assert not old & reachable_array_addresses(opt)
