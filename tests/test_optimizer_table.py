"""Sweeps driven by the optimizer table (tests/optimizer_table.py): every row's dense step
against its float64 oracle, thread-count independence, its sparse forms against its dense step,
its object against its functional step (checkpoints included), and its GPU kernels, run on the
host, against the CPU bit for bit.  A new optimizer is covered by adding a row."""
import ctypes
import re

import numpy as np
import pytest

import fastadam
from fastadam._core._registry import spec
from fastadam.gpu import _layout
from fastadam.optim import prepare_step
from gpu_emulation_build import BuildError, build
from optimizer_table import (CASES, ERROR_CASES, OPTIMIZERS, RULES, case_id, error_case_id,
                             fold_options)

SIZES = [0, 1, 17, 1000]
STEPS = 3


def random_state(rng, info, options, shape, dtype):
    """Slots after a few float64 oracle steps from zeros: realistic (v >= a**2 and so on)."""
    x = rng.standard_normal(shape)
    state = {name: np.zeros(info.slot_shape(name, shape)) for name in info.slots(options)}
    for t in range(info.first_t, info.first_t + 2):
        x, state = info.reference(x, rng.standard_normal(shape), state, t, **options)
    return x.astype(dtype), {k: v.astype(dtype) for k, v in state.items()}


def tolerance(dtype):
    return dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dense_step_follows_the_oracle(rng, case, dtype):
    info, options = case
    for size in SIZES:
        x, state = random_state(rng, info, options, (size,), dtype)
        for t in range(info.first_t + 2, info.first_t + 2 + STEPS):
            g = rng.standard_normal(size).astype(dtype)
            want_x, want = info.reference(x, g, state, t, **options)
            g_before = g.copy()
            assert info.dense(x, g, state, t, **options) is True
            np.testing.assert_array_equal(g, g_before)  # the gradient is only read
            np.testing.assert_allclose(x, want_x, **tolerance(dtype), err_msg=f"x size {size}")
            for name, value in want.items():
                np.testing.assert_allclose(state[name], value, **tolerance(dtype),
                                           err_msg=f"{name} size {size}")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dense_step_is_the_same_for_any_thread_count(rng, case):
    info, options = case
    n = 140_001  # above the serial threshold (131072): the threads split the tensor's chunks
    x, state = random_state(rng, info, options, (n,), np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    results = []
    for threads in (1, 2):
        xc, sc = x.copy(), {k: v.copy() for k, v in state.items()}
        info.dense([xc, xc[:0].copy()], [g, g[:0]], {k: [v, v[:0].copy()] for k, v in sc.items()},
                   info.first_t + 2, num_threads=threads, **options)
        results.append([xc] + [sc[k] for k in sorted(sc)])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_every_optimizer_of_the_c_list_has_a_row():
    from fastadam._core import _registry
    assert {info.name for info in OPTIMIZERS} == set(_registry.KINDS)


SPARSE_CASES = [c for c in CASES if c[0].sparse_ok(c[1])]


# the row lengths the sparse kernels specialise at compile time (1, 2, 4, 8) and a generic one
ROWS = [(), (2,), (3,), (8,)]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"row{int(np.prod(r))}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_sparse_lazy_step_is_the_dense_step_on_the_touched_rows(rng, case, dtype, row):
    info, options = case
    n_rows = 40
    x, state = random_state(rng, info, options, (n_rows,) + row, dtype)
    indices = rng.integers(0, n_rows, 60)
    values = rng.standard_normal((60,) + row).astype(dtype)
    t = info.first_t + 2
    touched = np.unique(indices)
    summed = np.zeros((n_rows,) + row, dtype)
    np.add.at(summed, indices, values)
    want_x, want = x.copy(), {k: v.copy() for k, v in state.items()}
    sub_x, sub = want_x[touched], {k: v[touched] for k, v in want.items()}
    info.dense(sub_x, summed[touched], sub, t, **options)
    want_x[touched] = sub_x
    for k in want:
        want[k][touched] = sub[k]
    info.sparse(x, (indices, values), state, t, **options)
    np.testing.assert_array_equal(x, want_x)
    for k in want:
        np.testing.assert_array_equal(state[k], want[k], err_msg=k)


@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_sparse_dense_mode_is_the_dense_step_on_the_densified_gradient(rng, case):
    info, options = case
    n_rows, row = 30, (4,)
    x, state = random_state(rng, info, options, (n_rows,) + row, np.float64)
    indices = rng.integers(0, n_rows, 20)
    values = rng.standard_normal((20,) + row)
    dense_g = np.zeros_like(x)
    np.add.at(dense_g, indices, values)
    want_x, want = x.copy(), {k: v.copy() for k, v in state.items()}
    t = info.first_t + 2
    info.dense(want_x, dense_g, want, t, **options)
    info.sparse(x, (indices, values), state, t, mode="dense", **options)
    np.testing.assert_array_equal(x, want_x)
    for k in want:
        np.testing.assert_array_equal(state[k], want[k], err_msg=k)


@pytest.mark.parametrize("row", ROWS + [(5,)], ids=lambda r: f"row{int(np.prod(r))}")
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_sparse_catchup_decays_the_slots_as_dense_mode(rng, case, row):
    """Without weight decay, a row idle for k steps then touched has the slots dense mode
    gives it (the catch-up replays the idle decays, rounded the same way)."""
    info, options = case
    if options.get("weight_decay"):
        pytest.skip("catch-up does not replay the idle rows' weight decay (documented)")
    n_rows = 6
    x, state = random_state(rng, info, options, (n_rows,) + row, np.float64)
    dense_x, dense = x.copy(), {k: v.copy() for k, v in state.items()}
    last = np.zeros(n_rows, np.int64)
    t0 = info.first_t + 2
    last[:] = t0 - 1
    for t in range(t0, t0 + 5):
        rows = np.array([0]) if t < t0 + 4 else np.array([0, 3])  # row 3 idle, then touched
        values = rng.standard_normal((rows.size,) + row)
        info.sparse(x, (rows, values), state, t, mode="catchup", last_step=last, **options)
        info.sparse(dense_x, (rows, values), dense, t, mode="dense", **options)
    for k in state:
        np.testing.assert_array_equal(state[k][[0, 3]], dense[k][[0, 3]], err_msg=k)
    np.testing.assert_array_equal(last[[0, 3]], t0 + 4)


OBJECT_CASES = [c for c in CASES if c[0].object_options(c[1]) is not None]


@pytest.mark.parametrize("case", OBJECT_CASES, ids=case_id)
def test_object_steps_as_the_functional_step_and_resumes_from_a_checkpoint(rng, case, tmp_path):
    info, options = case
    shapes = [(5,), (3, 4)]
    params = [rng.standard_normal(s) for s in shapes]
    fun_x = [p.copy() for p in params]
    fun_state = {k: [np.zeros(info.slot_shape(k, s)) for s in shapes] for k in info.slots(options)}
    if info.name == "adagrad" and options.get("convention") == "keras":
        fun_state["h"] = [np.full(s, 0.1) for s in shapes]  # Keras's initial accumulator
    opt = info.cls(params, **info.object_options(options))
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(6)]
    t = info.first_t
    for k, g in enumerate(grads):
        if k == 3:  # checkpoint, then continue in a fresh optimizer
            path = tmp_path / "opt.npz"
            opt.save(path)
            params = [p.copy() for p in params]
            opt = info.cls(params, **info.object_options(options))
            opt.load(path)
        assert opt.step(g) is True
        info.dense(fun_x, g, fun_state, t, **options)
        t += 1
    for a, b in zip(params, fun_x):
        np.testing.assert_array_equal(a, b)
    for name, arrays in fun_state.items():
        for a, b in zip(opt.state_dict()[info.object_slot(name)], arrays):
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("info", OPTIMIZERS, ids=lambda i: i.name)
def test_object_follows_a_schedule(rng, info):
    options = info.option_sets[0]
    kw = info.object_options(options)
    sched = fastadam.schedules.exponential(kw["lr"], 0.5)
    x = rng.standard_normal(6)
    want_x = x.copy()
    state = {k: np.zeros(6) for k in info.slots(options)}
    opt = info.cls([x], **dict(kw, lr=sched))
    for k in range(4):
        g = rng.standard_normal(6)
        opt.step([g])
        info.dense(want_x, g, state, info.first_t + k, **dict(options, lr=sched(k)))
    np.testing.assert_array_equal(x, want_x)


# ---- one rule per hyper-parameter in every entry point --------------------------------------
def _entry_points(info, options, x, state):
    """(name, argument-name map, call) of every entry point given ``options`` (functional
    keywords) over the parameter ``x`` and its ``state`` (every slot of the spec)."""
    g, t = np.full(x.shape, 0.5), info.first_t
    points = [
        ("functional", {}, lambda: info.dense(x, g, state, t, **options)),
        ("sparse", {}, lambda: info.sparse(x, (np.array([1, 3]), np.ones(2)), state, t,
                                           **options)),
    ]
    if info.element_wise:  # a row-wise optimizer has no prepared step yet
        points.append(("prepare_step", {},
                       lambda: prepare_step(info.name, x, state).step(g, t, **options)))
    kw = info.object_options(options)
    if kw is not None:
        good = info.object_options(info.option_sets[0])
        points += [("object", {}, lambda: info.cls([x], **kw)),
                   ("object.set_hyperparameters", {},
                    lambda: info.cls([x], **good).set_hyperparameters(**kw))]
    torch_kw = info.torch_options(options)
    if torch_kw is not None and info.torch_class is not None:
        torch = pytest.importorskip("torch")
        import fastadam.torch as ft
        param = torch.nn.Parameter(torch.ones(x.shape, dtype=torch.float64))
        points.append(("fastadam.torch", {"beta1": "betas[0]", "beta2": "betas[1]"},
                       lambda: getattr(ft, info.torch_class)([param], **torch_kw)))
    return points


@pytest.mark.parametrize("case", ERROR_CASES, ids=error_case_id)
def test_every_entry_point_refuses_a_bad_hyperparameter_alike(case):
    """A row of the optimizer's error table (for RMSprop and Lion made from its HYPER_RULES):
    the functional and sparse steps, prepare_step, the object (built, or its hyper-parameters
    set) and fastadam.torch raise the same exception naming the same argument, and change
    nothing."""
    info, row = case
    x = np.ones(5)
    state = {name: np.zeros(5) for name in spec(info.name).slots}
    seen = []
    for name, rename, call in _entry_points(info, row.options, x, state):
        arg = rename.get(row.arg, row.arg)
        with pytest.raises(row.error) as caught:
            call()
        # fastadam's messages start with the argument; fastadam.torch may word them as torch
        # does ("Invalid learning rate: -0.5 (lr must be >= 0)"): the argument is one word of it
        pattern = (rf"(^|\W){re.escape(arg)}(\W|$)" if name == "fastadam.torch" else
                   rf"^(param_groups\[0\]: )?{re.escape(arg)}: ")
        assert re.search(pattern, str(caught.value)), (name, str(caught.value))
        np.testing.assert_array_equal(x, 1, err_msg=name)
        for slot, value in state.items():
            np.testing.assert_array_equal(value, 0, err_msg=f"{name} {slot}")
        seen.append(name)
    assert [n for n in seen if n != "prepare_step"][:4] == [
        "functional", "sparse", "object", "object.set_hyperparameters"]
    assert ("prepare_step" in seen) == info.element_wise


BOUND_CASES = [(info, {name: bound}) for info, rules in
               ((i, r) for i in OPTIMIZERS for r in [RULES.get(i.name)] if r)
               for name, (low, high) in rules.items()
               for bound in ([low] if high is None else [low, high])]


@pytest.mark.parametrize("case", BOUND_CASES,
                         ids=lambda c: f"{c[0].name}-{next(iter(c[1].items()))}")
def test_every_entry_point_accepts_the_bounds_of_a_rule(case):
    """The closed ends of an optimizer's HYPER_RULES (Lion's beta 1.0, a zero rate) are legal
    in every entry point alike, fastadam.torch included."""
    info, options = case
    x = np.ones(5)
    state = {name: np.zeros(5) for name in spec(info.name).slots}
    for name, _, call in _entry_points(info, options, x, state):
        call()  # no exception


@pytest.mark.parametrize("info", [i for i in OPTIMIZERS if i.element_wise], ids=lambda i: i.name)
def test_a_master_copy_of_float32_parameters_is_refused_everywhere(info):
    """master_weights=True (the object) and master= (prepare_step) keep a float32 master of
    bfloat16 parameters; for float32 parameters both refuse it, naming their argument."""
    x = np.ones(5, np.float32)
    state = {name: np.zeros(5, np.float32) for name in spec(info.name).slots}
    with pytest.raises(ValueError, match=r"^master: a float32 master copy is for bfloat16 "):
        prepare_step(info.name, x, state, master=np.ones(5, np.float32))
    kw = info.object_options(info.option_sets[0])
    with pytest.raises(ValueError, match=r"^master_weights: a float32 master copy is for "
                                         r"bfloat16 parameters; these are float32"):
        info.cls([x], master_weights=True, **kw)
    with pytest.raises(ValueError, match=r"^master_weights: "):
        info.cls([x], master_weights=True, state_dtype="int8", **kw)
    np.testing.assert_array_equal(x, 1)


# ---- the GPU kernels on the host (tests/gpu_emulation.cpp) ---------------------------------
STORAGE = {np.dtype(np.float16): 0, np.dtype(np.float32): 1, np.dtype(np.float64): 2}


@pytest.fixture(scope="module")
def emu():
    try:
        return build()
    except BuildError as exc:
        if "g++" in str(exc) or "_Float16" in str(exc):
            pytest.skip(str(exc).splitlines()[0])
        pytest.fail(f"building the emulation failed:\n{exc}")


def ptr(a):
    return ctypes.c_void_p(a.ctypes.data if a is not None else 0)


GPU_CASES = [c for c in CASES if c[0].element_wise]  # row-wise: no GPU kernel yet


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_gpu_dense_kernel_equals_cpu(emu, rng, case, dtype):
    info, options = case
    s = spec(info.name)
    t = info.first_t + 2
    shapes = [(1,), (4097,), (3, 5)]
    host = [random_state(rng, info, options, shp, dtype) for shp in shapes]
    grads = [rng.standard_normal(shp).astype(dtype) for shp in shapes]
    dev_x = [x.copy() for x, _ in host]
    names = info.slots(options)
    dev_slots = [[st[n].copy() for _, st in host] for n in names]
    coeffs = s.fold(t, **fold_options(info.name, options))
    pointers = [[a.ctypes.data for a in lst] for lst in [dev_x, grads] + dev_slots]
    table, n, nblocks = _layout.host_table(coeffs, [a.size for a in dev_x], pointers)
    flag = np.zeros(1, np.int32)
    emu.emu_dense_step(STORAGE[np.dtype(dtype)], coeffs.kind, coeffs.flags, ptr(table), n,
                       ctypes.c_longlong(nblocks), ptr(flag), 0, 3)
    cpu_x = [x for x, _ in host]
    info.dense(cpu_x, grads, {k: [st[k] for _, st in host] for k in names}, t, **options)
    for a, b in zip(dev_x, cpu_x):
        np.testing.assert_array_equal(a, b)
    for k, lst in zip(names, dev_slots):
        for a, (_, st) in zip(lst, host):
            np.testing.assert_array_equal(a, st[k], err_msg=k)


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("case", [c for c in SPARSE_CASES if c[0].element_wise], ids=case_id)
def test_gpu_sparse_kernels_equal_cpu(emu, rng, case, mode):
    from fastadam.gpu._layout import sort_segments
    info, options = case
    n_rows, row, t = 30, (2, 3), 80
    x, state = random_state(rng, info, options, (n_rows,) + row, np.float32)
    indices = rng.integers(0, n_rows, 50)
    values = rng.standard_normal((50,) + row).astype(np.float32)
    last = rng.integers(0, t, n_rows).astype(np.int64) if mode == "catchup" else None
    names = info.slots(options)
    dev_x, dev = x.copy(), {k: v.copy() for k, v in state.items()}
    dev_last = None if last is None else last.copy()
    coeffs = spec(info.name).fold(t, **fold_options(info.name, options))
    perm, rows, offsets = sort_segments(np, indices.astype(np.int64))
    head = np.zeros(_layout.HEADER_BYTES, np.uint8)
    _layout.coefficient_bytes(coeffs, head)
    st0 = dev[names[0]]
    st1 = dev[names[1]] if len(names) > 1 else st0
    if mode == "dense":
        target = np.full(n_rows, -1, np.int64)
        target[rows] = np.arange(rows.shape[0])
    else:
        target = rows
    emu.emu_sparse(1, coeffs.kind, coeffs.flags, {"lazy": 0, "dense": 1, "catchup": 2}[mode],
                   ptr(head), ptr(dev_x), ptr(st0), ptr(st1), ctypes.c_longlong(6),
                   ctypes.c_longlong(n_rows), ptr(values), ptr(perm), ptr(offsets), ptr(target),
                   ctypes.c_longlong(rows.shape[0]), ptr(dev_last), ctypes.c_longlong(t), 3)
    info.sparse(x, (indices, values), state, t, mode=mode, last_step=last, **options)
    np.testing.assert_array_equal(dev_x, x)
    for k in names:
        np.testing.assert_array_equal(dev[k], state[k], err_msg=k)
    if last is not None:
        np.testing.assert_array_equal(dev_last, last)
