"""fastadam.embedding_bag_step_inplace: pooled lookups' backward fused with a lazy sparse step.

Compared against the float64 oracle (tests/reference.py: the bag gradient from torch's
documented formula, then each optimizer's reference on the touched rows), against torch
(``nn.EmbeddingBag(sparse=True)`` with ``SparseAdam``, ``Adagrad``, ``SGD``), and bit for bit
against the optimizer's own sparse step on the gradient expanded row per id (for every thread
count and CPU level).  One test per error message, and all-or-nothing across tables.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import fastadam
from fastadam._core import _cpu_level

from reference import (adagrad_reference, adam_reference, embedding_bag_gradient_reference,
                       lion_reference, momentum_reference, rmsprop_reference)

HERE = os.path.dirname(os.path.abspath(__file__))


def _adam(x, g, s, t, **h):
    x, m, v, _ = adam_reference(x, g, s["m"], s["v"], t, **h)
    return x, {"m": m, "v": v}


def _adamw(x, g, s, t, **h):
    return _adam(x, g, s, t, decoupled_weight_decay=True, **h)


def _adagrad(x, g, s, t, **h):
    x, hh = adagrad_reference(x, g, s["h"], t, **h)
    return x, {"h": hh}


def _momentum(x, g, s, t, **h):
    x, v = momentum_reference(x, g, s["v"], t, **h)
    return x, {"v": v}


def _rmsprop(x, g, s, t, **h):
    x, sq, _, _ = rmsprop_reference(x, g, s["square_avg"], t, **h)
    return x, {"square_avg": sq}


def _lion(x, g, s, t, **h):
    x, m = lion_reference(x, g, s["m"], t, **h)
    return x, {"m": m}


# (optimizer argument, hyper-parameters, state names, float64 reference of one dense step)
OPTIMIZERS = [
    ("adam", dict(lr=0.05, convention="tf"), ("m", "v"), _adam),
    ("adam", dict(lr=0.05, convention="torch", weight_decay=0.1), ("m", "v"), _adam),
    ("adamw", dict(lr=0.05, weight_decay=0.1), ("m", "v"), _adamw),
    ("adagrad", dict(lr=0.1, lr_decay=0.01), ("h",), _adagrad),
    ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True), ("v",), _momentum),
    ("momentum", dict(lr=0.1, momentum=0.0), ("v",), _momentum),
    ("rmsprop", dict(lr=0.01, alpha=0.9), ("square_avg",), _rmsprop),
    ("lion", dict(lr=0.01, beta1=0.9, beta2=0.99), ("m",), _lion),
]


def bags(rng, n_rows, n_bags, max_len, empty=True):
    """ids (with repeats) and torch-style offsets of n_bags bags, some empty."""
    lengths = rng.integers(0 if empty else 1, max_len + 1, n_bags)
    ids = rng.integers(0, n_rows, int(lengths.sum()))
    ids[: len(ids) // 3] = rng.integers(0, 4, len(ids) // 3)  # hot rows: long segments
    rng.shuffle(ids)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return ids.astype(np.int64), offsets


def lazy_oracle(ref, x, state, rows, g, t, hyper):
    x = x.astype(np.float64).copy()
    state = {k: a.astype(np.float64).copy() for k, a in state.items()}
    xr, sr = ref(x[rows], g, {k: a[rows] for k, a in state.items()}, t, **hyper)
    x[rows] = xr
    for k in state:
        state[k][rows] = sr[k]
    return x, state


@pytest.mark.parametrize("optimizer,hyper,names,ref", OPTIMIZERS,
                         ids=[f"{o[0]}-{i}" for i, o in enumerate(OPTIMIZERS)])
@pytest.mark.parametrize("pooling", ["sum", "mean", "weighted"])
def test_two_tables_match_the_float64_oracle(optimizer, hyper, names, ref, pooling):
    rng = np.random.default_rng(7)
    shapes = [(50, 6), (9, 3)]
    tables = [rng.standard_normal(s) for s in shapes]
    states = {k: [np.abs(rng.standard_normal(s)) * 0.1 for s in shapes] for k in names}
    expect_x = [w.copy() for w in tables]
    expect_s = {k: [a.copy() for a in lst] for k, lst in states.items()}
    for t in (1, 2, 3):
        ids, offs, grads, psws = [], [], [], []
        for i, (n, d) in enumerate(shapes):
            a, o = bags(rng, n, 7 + i, 5)
            ids.append(a)
            offs.append(o)
            grads.append(rng.standard_normal((len(o), d)))
            psws.append(rng.uniform(-2, 2, len(a)) if pooling == "weighted" else None)
        fastadam.embedding_bag_step_inplace(
            tables, ids, offs, grads, states, t, optimizer=optimizer,
            pooling="mean" if pooling == "mean" else "sum", per_sample_weights=psws, **hyper)
        for i, (n, d) in enumerate(shapes):
            rows, g = embedding_bag_gradient_reference(
                n, ids[i], offs[i], grads[i], pooling=pooling, per_sample_weights=psws[i])
            expect_x[i], s = lazy_oracle(ref, expect_x[i], {k: expect_s[k][i] for k in names},
                                         rows, g, t, hyper)
            for k in names:
                expect_s[k][i] = s[k]
    for i in range(len(shapes)):
        np.testing.assert_allclose(tables[i], expect_x[i], rtol=1e-12, atol=1e-13)
        for k in names:
            np.testing.assert_allclose(states[k][i], expect_s[k][i], rtol=1e-12, atol=1e-13)


def expanded_gradient(ids, offsets, grad_out, pooling, psw, dtype):
    """One gradient row per id, s_j * grad_out[bag] rounded in dtype (torch's sparse backward:
    ``index_select`` of the bag rows, times ``1 / bag_size`` or the weights)."""
    ends = np.append(offsets, len(ids))
    rows = []
    for b in range(len(offsets)):
        n = ends[b + 1] - ends[b]
        for j in range(ends[b], ends[b + 1]):
            if psw is not None:
                rows.append(grad_out[b] * psw[j])
            elif pooling == "mean":
                rows.append(grad_out[b] * (dtype.type(1) / dtype.type(n)))
            else:
                rows.append(grad_out[b])
    return np.array(rows, dtype=dtype).reshape(len(ids), grad_out.shape[1])


SPARSE_STEPS = {"adam": (fastadam.sparse_step_inplace, ("m", "v")),
                "adagrad": (fastadam.sparse_adagrad_step_inplace, ("h",)),
                "momentum": (fastadam.sparse_momentum_step_inplace, ("v",))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", sorted(SPARSE_STEPS))
@pytest.mark.parametrize("pooling", ["sum", "mean", "weighted"])
def test_bits_equal_the_sparse_step_on_the_expanded_gradient_for_any_thread_count(
        dtype, optimizer, pooling):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(3)
    n, d = 300, 17  # 17: a SIMD width +- 1 and a tail
    ids, offsets = bags(rng, n, 400, 12)
    grad_out = rng.standard_normal((len(offsets), d)).astype(dtype)
    psw = rng.uniform(-1, 1, len(ids)).astype(dtype) if pooling == "weighted" else None
    step, names = SPARSE_STEPS[optimizer]
    x0 = rng.standard_normal((n, d)).astype(dtype)
    s0 = {k: np.abs(rng.standard_normal((n, d))).astype(dtype) for k in names}
    values = expanded_gradient(ids, offsets, grad_out, pooling, psw, dtype)
    want_x, want_s = x0.copy(), {k: a.copy() for k, a in s0.items()}
    step(want_x, (ids, values), *[want_s[k] for k in names], 2, lr=0.01, num_threads=1)
    assert not np.array_equal(want_x, x0)
    for threads in (1, 2, 3):
        x, s = x0.copy(), {k: a.copy() for k, a in s0.items()}
        fastadam.embedding_bag_step_inplace(
            x, ids.astype(np.int32), offsets.astype(np.int32), grad_out, s, 2,
            optimizer=optimizer, pooling="mean" if pooling == "mean" else "sum",
            per_sample_weights=psw, lr=0.01, num_threads=threads)
        assert x.tobytes() == want_x.tobytes(), threads
        for k in names:
            assert s[k].tobytes() == want_s[k].tobytes(), (threads, k)


LEVEL_SCRIPT = """
import sys, numpy as np, fastadam
rng = np.random.default_rng(11)
out = {}
for dtype in (np.float32, np.float64):
    for pooling in ("sum", "mean", "weighted"):
        x = rng.standard_normal((500, 33)).astype(dtype)
        m = np.zeros_like(x); v = np.zeros_like(x)
        ids = rng.integers(0, 500, 3000); offsets = np.arange(0, 3000, 7)
        g = rng.standard_normal((len(offsets), 33)).astype(dtype)
        w = rng.uniform(0, 2, 3000).astype(dtype) if pooling == "weighted" else None
        fastadam.embedding_bag_step_inplace(x, ids, offsets, g, {"m": m, "v": v}, 1, lr=0.1,
                                            pooling="mean" if pooling == "mean" else "sum",
                                            per_sample_weights=w, num_threads=2)
        out[f"{np.dtype(dtype)}-{pooling}"] = x.tobytes().hex()
np.savez(sys.argv[1], **{k: np.frombuffer(bytes.fromhex(h), np.uint8) for k, h in out.items()})
"""


def test_every_cpu_level_gives_the_same_bits(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__)))
    script = tmp_path / "bags.py"
    script.write_text(LEVEL_SCRIPT)
    results = {}
    for level in _cpu_level.supported_levels():
        env = dict(os.environ)
        env.pop(_cpu_level.ENV, None)
        if level != _cpu_level.PORTABLE:
            env[_cpu_level.ENV] = level
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
        path = tmp_path / f"{level}.npz"
        proc = subprocess.run([sys.executable, str(script), str(path)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        with np.load(path) as data:
            results[level] = {k: data[k].tobytes() for k in data.files}
    first, *others = list(results)
    assert len(results[first]) == 6
    for level in others:
        assert results[level] == results[first], (level, first)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("pooling", ["sum", "mean", "weighted"])
@pytest.mark.parametrize("torch_opt,optimizer,hyper", [
    (lambda p: torch.optim.SparseAdam(p, lr=0.05), "adam", dict(lr=0.05)),
    (lambda p: torch.optim.Adagrad(p, lr=0.1), "adagrad", dict(lr=0.1)),
    (lambda p: torch.optim.SGD(p, lr=0.1), "sgd", dict(lr=0.1, momentum=0.0)),
], ids=["SparseAdam", "Adagrad", "SGD"])
def test_matches_torch_embedding_bag_with_its_sparse_optimizers(pooling, torch_opt, optimizer,
                                                                hyper):
    rng = np.random.default_rng(5)
    n, d = 40, 8
    w0 = rng.standard_normal((n, d))
    bag = torch.nn.EmbeddingBag(n, d, mode="mean" if pooling == "mean" else "sum",
                                sparse=True, dtype=torch.float64)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(w0))
    opt = torch_opt(bag.parameters())
    x = w0.copy()
    names = ("m", "v") if optimizer == "adam" else ("h",) if optimizer == "adagrad" else ("v",)
    state = {k: np.zeros_like(x) for k in names}
    for t in (1, 2, 3, 4):
        ids, offsets = bags(rng, n, 9, 6)
        g = rng.standard_normal((len(offsets), d))
        psw = rng.uniform(0.5, 2, len(ids)) if pooling == "weighted" else None
        opt.zero_grad()
        out = bag(torch.from_numpy(ids), torch.from_numpy(offsets),
                  per_sample_weights=None if psw is None else torch.from_numpy(psw))
        (out * torch.from_numpy(g)).sum().backward()
        opt.step()
        fastadam.embedding_bag_step_inplace(
            x, ids, offsets, g, state, t, optimizer=optimizer,
            pooling="mean" if pooling == "mean" else "sum", per_sample_weights=psw, **hyper)
    np.testing.assert_allclose(x, bag.weight.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert not np.allclose(x, w0)


def test_a_step_number_per_table_equals_separate_calls():
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((30, 5)), rng.standard_normal((20, 5))]
    ms = [np.abs(rng.standard_normal(x.shape)) for x in xs]
    vs = [np.abs(rng.standard_normal(x.shape)) for x in xs]
    ids = [rng.integers(0, 20, 15), rng.integers(0, 20, 9)]
    offsets = [np.array([0, 4, 9]), np.array([0, 1])]
    grads = [rng.standard_normal((3, 5)), rng.standard_normal((2, 5))]
    x0, m0, v0 = [x.copy() for x in xs], [m.copy() for m in ms], [v.copy() for v in vs]
    want = [x.copy() for x in xs]
    for i, t in enumerate((2, 7)):
        fastadam.embedding_bag_step_inplace(want[i], ids[i], offsets[i], grads[i],
                                            {"m": m0[i].copy(), "v": v0[i].copy()}, t, lr=0.1)
    fastadam.embedding_bag_step_inplace(xs, ids, offsets, grads, {"m": ms, "v": vs}, [2, 7],
                                        lr=0.1)
    for x, w in zip(xs, want):
        assert x.tobytes() == w.tobytes()
    at_seven = x0[0].copy()  # the step number matters: table 0 at t=7 ends elsewhere
    fastadam.embedding_bag_step_inplace(at_seven, ids[0], offsets[0], grads[0],
                                        {"m": m0[0].copy(), "v": v0[0].copy()}, 7, lr=0.1)
    assert at_seven.tobytes() != xs[0].tobytes()


def test_offset_forms_agree():
    """2-D ids, include_last_offset, int32 ids, empty bags at both ends, and no ids at all."""
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((20, 4))
    ids = rng.integers(0, 20, (5, 3))
    g = rng.standard_normal((5, 4))
    runs = []
    for form in ("2d", "offsets", "last", "int32"):
        x, h = x0.copy(), np.zeros_like(x0)
        flat, offsets = ids.reshape(-1), np.arange(0, 15, 3)
        args = {"2d": (ids, None), "offsets": (flat, offsets),
                "last": (flat, np.append(offsets, 15)),
                "int32": (flat.astype(np.int32), offsets.astype(np.int32))}[form]
        fastadam.embedding_bag_step_inplace(x, *args, g, {"h": h}, 1, optimizer="adagrad",
                                            include_last_offset=form == "last", pooling="mean")
        runs.append(x)
    for x in runs[1:]:
        assert x.tobytes() == runs[0].tobytes()
    rows, grad = embedding_bag_gradient_reference(20, ids, None, g, pooling="mean")
    want, _ = lazy_oracle(_adagrad, x0, {"h": np.zeros_like(x0)}, rows, grad, 1, dict(lr=1e-2))
    np.testing.assert_allclose(runs[0], want, rtol=1e-13)
    # as many ids as bags, but not one per bag: the bag of each id still counts
    x, h = x0.copy(), np.zeros_like(x0)
    ids2, offsets2, g2 = np.array([5, 6, 7, 8]), np.array([0, 0, 1, 3]), rng.standard_normal((4, 4))
    fastadam.embedding_bag_step_inplace(x, ids2, offsets2, g2, {"h": h}, 1, optimizer="adagrad")
    rows, grad = embedding_bag_gradient_reference(20, ids2, offsets2, g2)
    want, _ = lazy_oracle(_adagrad, x0, {"h": np.zeros_like(x0)}, rows, grad, 1, dict(lr=1e-2))
    np.testing.assert_allclose(x, want, rtol=1e-13)
    # empty bags first and last, and a step without any id
    x, h = x0.copy(), np.zeros_like(x0)
    fastadam.embedding_bag_step_inplace(x, np.array([3, 3]), np.array([0, 0, 2, 2]),
                                        np.ones((4, 4)), {"h": h}, 1, optimizer="adagrad",
                                        pooling="mean")
    changed = np.flatnonzero((x != x0).any(1))
    assert changed.tolist() == [3]
    x = x0.copy()
    fastadam.embedding_bag_step_inplace(x, np.zeros(0, np.int64), np.zeros(3, np.int64),
                                        np.ones((3, 4)), {"h": h}, 1, optimizer="adagrad")
    assert x.tobytes() == x0.tobytes()


# ---- errors: one row per message; nothing written -------------------------------------------

def _args():
    """Two valid tables (the second is where each error row puts its fault)."""
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((10, 3)), rng.standard_normal((6, 3))]
    return dict(weight=w, ids=[np.array([1, 2, 9]), np.array([0, 5, 5])],
                offsets=[np.array([0, 1]), np.array([0, 2])],
                grad_out=[np.ones((2, 3)), np.ones((2, 3))],
                state={"m": [np.zeros((10, 3)), np.zeros((6, 3))],
                       "v": [np.zeros((10, 3)), np.zeros((6, 3))]},
                t=1)


def _set(key, value, i=1):
    def edit(a):
        if isinstance(a[key], list):
            a[key][i] = value
        else:
            a[key] = value
    return edit


def _set_state(name, value):
    def edit(a):
        a["state"][name][1] = value
    return edit


def _kw(**kw):
    def edit(a):
        a.update(kw)
    return edit


ERRORS = [
    (_set("ids", np.array([0, 6, 1])), IndexError, r"ids\[1\]: id 6 is out of range for a "
                                                   r"table of 6 rows"),
    (_set("ids", np.array([0, -1, 1])), IndexError, r"ids\[1\]: negative id -1"),
    (_set("ids", np.array([0.0, 1.0, 2.0])), TypeError, r"ids\[1\]: expected int32 or int64"),
    (_set("ids", [0, 1, 2]), TypeError, r"ids\[1\]: expected a numpy.ndarray"),
    (_set("ids", np.zeros((3, 1), np.int64)), ValueError, r"ids\[1\]: with offsets, expected "
                                                          r"a 1-D array"),
    (_set("offsets", None), ValueError, r"ids\[1\]: without offsets, expected a 2-D array"),
    (_set("offsets", np.array([1, 2])), ValueError, r"offsets\[1\]: the first bag must start "
                                                    r"at 0, got 1"),
    (_set("offsets", np.array([0, 2, 1])), ValueError, r"offsets\[1\]: expected "
                                                       r"non-decreasing offsets.*position 2 "
                                                       r"holds 1 after 2"),
    (_set("offsets", np.array([0, 4])), ValueError, r"offsets\[1\]: expected non-decreasing "
                                                    r"offsets within \[0, len\(ids\[1\]\) = "
                                                    r"3\]"),
    (_set("offsets", np.array([0, 2], np.uint8)), TypeError, r"offsets\[1\]: expected int32 "
                                                             r"or int64"),
    (_kw(include_last_offset=True), ValueError, r"offsets\[0\]: include_last_offset=True "
                                                r"needs the last entry to be len\(ids\[0\]\) "
                                                r"= 3, got 1"),
    (_set("grad_out", np.ones((3, 3))), ValueError, r"grad_out\[1\]: expected shape \(2, 3\)"),
    (_set("grad_out", np.ones((2, 3), np.float32)), TypeError, r"grad_out\[1\]: expected "
                                                               r"dtype float64"),
    (_set("weight", np.zeros((6, 3), np.float32)), TypeError, r"state\['m'\]\[1\]: expected "
                                                              r"dtype float32"),
    (_set("weight", np.zeros(6)), ValueError, r"weight\[1\]: expected a 2-D table"),
    (_set_state("v", np.zeros((6, 4))), ValueError, r"state\['v'\]\[1\]: expected shape "
                                                    r"\(6, 3\)"),
    (_set_state("v", np.zeros((6, 3)).view()), None, None),  # a valid view: runs
    (_kw(per_sample_weights=[None, np.array([1.0, np.nan, 2.0])]), ValueError,
     r"per_sample_weights\[1\]: expected finite weights, got nan at position 1"),
    (_kw(per_sample_weights=[None, np.ones(2)]), ValueError,
     r"per_sample_weights\[1\]: expected shape \(3,\)"),
    (_kw(per_sample_weights=[None, np.ones(3)], pooling="mean"), ValueError,
     r"per_sample_weights\[1\]: per-sample weights need pooling='sum'"),
    (_kw(pooling="max"), ValueError, r"pooling: expected one of \('sum', 'mean'\)"),
    (_kw(optimizer="adamax"), ValueError, r"optimizer: expected one of"),
    (_kw(optimizer="adamw", decoupled_weight_decay=False), ValueError,
     r"decoupled_weight_decay: optimizer='adamw' means decoupled_weight_decay=True"),
    (_kw(lr=-1.0), ValueError, r"lr"),
    (_kw(mode="dense"), TypeError, r"mode: the fused bag step is lazy"),
    (_kw(amsgrad=True), ValueError, r"optimizer: adam with these options .* has no sparse "
                                    r"step|state: adam with these options needs 'v_max'"),
    (_kw(state={"m": None}), ValueError, r"state: adam with these options needs 'v'"),
    (_kw(state={"m": 1, "v": 2, "h": 3}), ValueError, r"state: unknown name 'h'"),
    (_kw(grad_out=[np.ones((2, 3))]), ValueError, r"grad_out: expected a list of 2 entries"),
    (_kw(t=1.5), TypeError, r"t: expected an int step number"),
    (_kw(t=[1, 2, 3]), ValueError, r"t: expected one step number or a list of 2"),
    (_kw(t=[1, 0]), ValueError, r"lr|t"),  # Adam's t=0 with the tf convention: its fold
    (_kw(t=[1, "2"]), TypeError, r"t\[1\]: expected an int step number"),
]


@pytest.mark.parametrize("edit,exc,match", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_each_error_names_the_argument_and_writes_nothing(edit, exc, match):
    a = _args()
    edit(a)
    before = [w.copy() for w in a["weight"]] + [s.copy() for lst in a["state"].values()
                                                 if isinstance(lst, list) for s in lst]
    call = dict(a)
    args = [call.pop(k) for k in ("weight", "ids", "offsets", "grad_out", "state", "t")]
    if exc is None:
        fastadam.embedding_bag_step_inplace(*args, **call)
        return
    with pytest.raises(exc, match=match):
        fastadam.embedding_bag_step_inplace(*args, **call)
    after = [w for w in a["weight"]] + [s for lst in a["state"].values()
                                       if isinstance(lst, list) for s in lst]
    for b, c in zip(before, after):
        assert b.tobytes() == c.tobytes()


def test_overlapping_tables_and_state_are_refused():
    a = _args()
    a["state"]["v"][1] = a["weight"][0][:6]
    with pytest.raises(ValueError, match=r"share memory"):
        fastadam.embedding_bag_step_inplace(a["weight"], a["ids"], a["offsets"], a["grad_out"],
                                            a["state"], 1)
    ro = np.zeros((6, 3))
    ro.flags.writeable = False
    a = _args()
    a["state"]["m"][1] = ro
    with pytest.raises(ValueError, match=r"state\['m'\]\[1\]: is read-only"):
        fastadam.embedding_bag_step_inplace(a["weight"], a["ids"], a["offsets"], a["grad_out"],
                                            a["state"], 1)


def test_inputs_that_are_only_read_do_not_change():
    a = _args()
    read = [a["ids"][0], a["offsets"][1], a["grad_out"][0]]
    for r in read:
        r.flags.writeable = False
    psw = np.array([0.5, 1.0, 2.0])
    psw.flags.writeable = False
    copies = [r.copy() for r in read] + [psw.copy()]
    fastadam.embedding_bag_step_inplace(a["weight"], a["ids"], a["offsets"], a["grad_out"],
                                        a["state"], 1, per_sample_weights=[psw, None])
    for r, c in zip(read + [psw], copies):
        assert r.tobytes() == c.tobytes()
