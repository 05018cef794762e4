"""fastadam.torch behaves as torch.optim where a torch user can see it (issue 39): edits of
``state["step"]``, copies (deepcopy, pickle, torch.save), state dicts of an older torch,
Adagrad's ``initial_accumulator_value``, the ``step`` entry's presence and dtype, and torch's
own error inputs and sample inputs (the ``OptimizerInfo`` database shipped with torch), each
run on fastadam's class and on torch's with the same input."""
import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
# torch.testing._internal (the OptimizerInfo database below) imports expecttest, torch's own
# test-only package: the test extra installs it
pytest.importorskip("expecttest", reason="torch's OptimizerInfo database needs expecttest "
                                         "(in the test extra)")
import fastadam.torch as ft  # noqa: E402

TWINS = ["Adam", "AdamW", "Adagrad", "SGD", "RMSprop", "SparseAdam"]


def net(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2)).to(dtype)


def batch(k, dtype=torch.float64):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randn(8, 4, generator=g, dtype=dtype), torch.randn(8, 2, generator=g,
                                                                    dtype=dtype)


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        X, y = batch(k)
        opt.zero_grad()
        ((model(X) - y) ** 2).mean().backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


KW = {"Adam": dict(lr=1e-2, amsgrad=True), "AdamW": dict(lr=1e-2, weight_decay=0.1),
      "Adagrad": dict(lr=0.1, lr_decay=0.01), "RMSprop": dict(lr=1e-2, centered=True),
      "SGD": dict(lr=0.05, momentum=0.9)}


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adagrad", "RMSprop"])
def test_an_in_place_edit_of_step_is_honoured(name):
    """``state["step"].fill_(0)`` restarts the bias correction (or Adagrad's decay) in torch;
    fastadam read its own count and ended 4-5% away."""
    out = []
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        model = net()
        opt = cls(model.parameters(), **KW[name])
        train(model, opt, 4)
        for s in opt.state.values():
            s["step"].fill_(0)
        train(model, opt, 4, start=4)
        opt.state[next(iter(opt.state))]["step"].fill_(10)  # one parameter on its own count
        train(model, opt, 3, start=8)
        out.append((flat(model), [s["step"].item() for s in opt.state.values()]))
    assert_close(out[1][0], out[0][0])
    assert out[1][1] == out[0][1]


def _copy_deepcopy(opt):
    return copy.deepcopy(opt)


def _copy_pickle(opt):
    return pickle.loads(pickle.dumps(opt))


def _copy_torch_save(opt):
    buf = io.BytesIO()
    torch.save(opt, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("how", [_copy_deepcopy, _copy_pickle, _copy_torch_save],
                         ids=["deepcopy", "pickle", "torch.save"])
@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adagrad", "RMSprop", "SGD"])
def test_a_copied_optimizer_steps_as_torch_s_copy(name, how):
    public = []
    out = []
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        model = net()
        opt = cls(model.parameters(), **KW[name])
        train(model, opt, 3)
        clone = how({"model": model, "opt": opt})
        train(clone["model"], clone["opt"], 3, start=3)
        out.append(flat(clone["model"]))
        assert {k for k in vars(clone["opt"]) if not k.startswith("_")} == \
            {k for k in vars(opt) if not k.startswith("_")}
        public.append({k for k in vars(opt) if not k.startswith("_")})
        train(model, opt, 3, start=3)  # the original is unchanged by the copy's steps
        assert_close(flat(model), out[-1])
    assert_close(out[1], out[0])
    assert public[0] <= public[1]  # torch's public attributes, and num_threads


OLD_KEYS = ("maximize", "foreach", "differentiable", "fused", "capturable",
            "decoupled_weight_decay")


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adagrad", "RMSprop", "SGD"])
@pytest.mark.parametrize("number_step", [False, True])
def test_a_state_dict_of_an_older_torch_loads_as_in_torch(name, number_step):
    """Groups without the newer options (and, older still, ``step`` as a number) get torch's
    defaults, filled by its ``__setstate__``."""
    model = net()
    src = getattr(torch.optim, name)(model.parameters(), **KW[name])
    train(model, src, 3)
    sd = copy.deepcopy(src.state_dict())
    for g in sd["param_groups"]:
        for k in OLD_KEYS:
            g.pop(k, None)
    if number_step:
        for s in sd["state"].values():
            if "step" in s:
                s["step"] = float(s["step"])
    out = []
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        m = copy.deepcopy(model)
        opt = cls(m.parameters(), **KW[name])
        opt.load_state_dict(copy.deepcopy(sd))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        state = {k: {kk: (vv.dtype, vv.shape) for kk, vv in v.items()}
                 for k, v in opt.state_dict()["state"].items()}
        train(m, opt, 3, start=3)
        out.append((flat(m), groups, state))
    assert_close(out[1][0], out[0][0])
    assert out[1][1] == out[0][1]
    assert out[1][2] == out[0][2]


def test_adagrad_initial_accumulator_value_is_the_constructor_s():
    """torch 2.13 starts every parameter's ``sum`` at the constructor's value, whatever its
    group says (a group added later too)."""
    out = []
    for cls in (torch.optim.Adagrad, ft.Adagrad):
        model = net()
        first, second = list(model[0].parameters()), list(model[2].parameters())
        opt = cls([{"params": first}, {"params": second[:1], "initial_accumulator_value": 3.0}],
                  lr=0.1, initial_accumulator_value=0.5)
        opt.add_param_group({"params": second[1:], "initial_accumulator_value": 7.0})
        train(model, opt, 4)
        out.append((flat(model), [s["sum"].clone() for s in opt.state.values()]))
    assert_close(out[1][0], out[0][0])
    for a, b in zip(out[1][1], out[0][1]):
        assert_close(a, b)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_state_after_load_state_dict_is_torch_s(momentum):
    states = []
    for cls in (torch.optim.SGD, ft.SGD):
        model = net()
        opt = cls(model.parameters(), lr=0.05, momentum=momentum)
        train(model, opt, 2)
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        train(model, opt, 1, start=2)
        states.append({k: sorted(v) for k, v in opt.state_dict()["state"].items()})
    assert states[1] == states[0]


def test_sparse_adam_step_is_torch_s_type():
    out = []
    for cls in (torch.optim.SparseAdam, ft.SparseAdam):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True).double()
        opt = cls(emb.parameters(), lr=0.1)
        for k in range(3):
            opt.zero_grad()
            emb(torch.tensor([k, k + 1, 7])).sum().backward()
            opt.step()
        step = opt.state[emb.weight]["step"]
        out.append((type(step), step, emb.weight.detach().clone()))
    assert out[1][0] is out[0][0] and out[1][1] == out[0][1]
    assert_close(out[1][2], out[0][2])


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adagrad", "RMSprop"])
def test_step_dtype_under_a_float64_default_is_torch_s(name, float64_default):
    dtypes = []
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        model = net()
        opt = cls(model.parameters(), **KW[name])
        train(model, opt, 2)
        sd = copy.deepcopy(opt.state_dict())
        for s in sd["state"].values():
            s["step"] = 2  # a number, as an old checkpoint keeps it
        opt.load_state_dict(sd)
        dtypes.append([s["step"].dtype for s in opt.state.values()])
    assert dtypes[1] == dtypes[0]
    assert set(dtypes[0]) == {torch.float64}


# ---- torch's OptimizerInfo database ---------------------------------------------------------

def _optim_db():
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db
    return {info.optim_cls.__name__: info for info in optim_db}, OptimizerErrorEnum


DB, ERROR_ENUM = _optim_db()


def _error_inputs():
    out = []
    for name in TWINS:
        for k, e in enumerate(DB[name].optim_error_inputs_func(device="cpu",
                                                               dtype=torch.float32)):
            out.append(pytest.param(name, k, id=f"{name}-{k}"))
    return out


@pytest.mark.parametrize("name,k", _error_inputs())
def test_torch_error_inputs_raise_torch_s_errors(name, k):
    """Each of torch's error inputs raises (or warns) the same type, with a message that
    matches torch's ``error_regex``: on fastadam's class as on torch's."""
    e = DB[name].optim_error_inputs_func(device="cpu", dtype=torch.float32)[k]
    oi = e.optimizer_error_input
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        if e.error_on == ERROR_ENUM.CONSTRUCTION_ERROR:
            if issubclass(e.error_type, Warning):
                with pytest.warns(e.error_type, match=e.error_regex):
                    cls(oi.params, **oi.kwargs)
            else:
                with pytest.raises(e.error_type, match=e.error_regex):
                    cls(oi.params, **oi.kwargs)
        else:
            opt = cls(oi.params, **oi.kwargs)
            with pytest.raises(e.error_type, match=e.error_regex):
                opt.step()


def _sample_inputs():
    out = []
    for name in TWINS:
        if name == "SparseAdam":
            continue
        for k, si in enumerate(DB[name].optim_inputs_func(device="cpu")):
            kw = si.kwargs
            if kw.get("differentiable") or kw.get("capturable") or kw.get("fused"):
                continue  # the documented refusals
            out.append(pytest.param(name, k, id=f"{name}-{k}-{si.desc}"))
    return out


@pytest.mark.parametrize("name,k", _sample_inputs())
def test_torch_sample_inputs_follow_torch(name, k):
    """torch's sample inputs (hyper-parameters, tensor learning rates and betas, maximize,
    amsgrad, weight decay ...) on two parameter groups: the same trajectory in float64."""
    kw = DB[name].optim_inputs_func(device="cpu")[k].kwargs
    out = []
    for cls in (getattr(torch.optim, name), getattr(ft, name)):
        model = net()
        opt = cls([{"params": model[0].parameters()}, {"params": model[2].parameters()}],
                  **copy.deepcopy(kw))
        train(model, opt, 5)
        out.append(flat(model))
    assert_close(out[1], out[0])
