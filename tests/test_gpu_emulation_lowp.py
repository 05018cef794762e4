"""The low-precision GPU kernels (fa_lowp_* in include/fastadam/cuda/kernels.cu) run on the host
emulation (tests/gpu_emulation.cpp: the 8-bit kernels' barriers run on fibers), driven with the
tables fastadam.gpu lays out (_layout.lowp_header / lowp_host_table), on NumPy memory, against
the oracle of tests/gpu_lowp_oracle.py (the definitions, and the float32 CPU step) and against
the CPU driver (fastadam._core._lowp): the same bits for every optimizer x parameter format x
gradient format x state format, stochastic rounding included (same seed, same bits), and the
8-bit block's absmax reduction over threads.
Not a GPU run: see test_gpu_lowp.py for that.  Skips without g++.
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastadam._core import _lowp
from fastadam.gpu import _layout, _source
from gpu_emulation_build import BuildError, build
from gpu_lowp_oracle import (BF16, CASES, F32, NEAREST, Q8, STOCHASTIC, State,
                             assert_same_bits, assert_same_state, case_id, fold)


HERE = Path(__file__).resolve().parent
PARAMS = {"f32": (F32, NEAREST, False), "bf16": (BF16, NEAREST, False),
          "bf16-sr": (BF16, STOCHASTIC, False), "bf16-master": (BF16, NEAREST, True)}
STATES = {"f32": F32, "bf16": BF16, "int8": Q8}
SHAPES = [(1,), (63,), (64,), (65,), (3, 70), (0,), (4097,)]  # 4097: two thread blocks


@pytest.fixture(scope="module")
def emu():
    try:
        return build()
    except BuildError as exc:
        if "g++" in str(exc):
            pytest.skip(str(exc).splitlines()[0])
        pytest.fail(f"building the emulation failed:\n{exc}")


def ptr(a):
    return ctypes.c_void_p(a.ctypes.data if a is not None else 0)


def header(st, rounding, seed, masters, span, grad_fmt):
    return _layout.lowp_header(st.coeffs, dict(
        param_fmt=st.param_fmt, grad_fmt=grad_fmt, rounding=rounding,
        has_master=int(bool(masters)), signed_mask=sum(1 << s for s, sg in enumerate(st.signed)
                                                       if sg),
        block=st.block, span=span, qmap=st.qkind, seed_lo=seed, seed_hi=seed >> 32, t=st.t))


def pointers(xs, gs, states, scales, masters):
    cols = {"x": [a.ctypes.data for a in xs], "g": [a.ctypes.data for a in gs]}
    for s, lst in enumerate(states):
        cols[f"s{s}"] = [a.ctypes.data for a in lst]
    for s, lst in enumerate(scales):
        cols[f"scale{s}"] = [a.ctypes.data for a in lst]
    if masters:
        cols["master"] = [a.ctypes.data for a in masters]
    return cols


def run_dense(emu, st, arrays, rounding=NEAREST, seed=0, skip_nonfinite=False, threads=None):
    """What fastadam/gpu/_lowp.py's lowp_dense_step does after its checks, on NumPy memory."""
    xs, gs, states, scales, masters = arrays
    q8 = st.state_fmt == Q8
    span = _layout.lowp_span(q8, st.block)
    head = header(st, rounding, seed, masters, span, st.grad_fmt)
    host, n, nblocks = _layout.lowp_host_table(head, [x.size for x in xs],
                                               pointers(xs, gs, states, scales, masters), span)
    threads = threads or _layout.lowp_threads(q8, st.block)
    flag = np.zeros(1, np.int32)
    if n and skip_nonfinite:
        emu.emu_lowp_nonfinite(st.grad_fmt, ptr(host), n, ctypes.c_longlong(nblocks),
                               ctypes.c_double(st.coeffs.grad_scale), ptr(flag))
    if n:
        emu.emu_lowp_dense(st.state_fmt, st.coeffs.kind, st.coeffs.flags, ptr(host), n,
                           ctypes.c_longlong(nblocks), ptr(flag), int(skip_nonfinite), threads)
    return not flag[0]


def check(got, want):
    xs, _, states, scales, masters = got
    assert_same_state(xs, states, scales, masters, want)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dense_step_equals_the_oracle(emu, rng, case, param, state):
    name, hyper = case
    param_fmt, rounding, master = PARAMS[param]
    grad_fmt = BF16 if param != "f32" else F32  # bf16 gradients beside bf16 parameters
    st = State(rng, name, hyper, SHAPES, param_fmt, grad_fmt, STATES[state], master=master)
    arrays = st.arrays()
    seed = 0x1234_5678_9ABC_DEF0
    assert run_dense(emu, st, arrays, rounding, seed) is True
    check(arrays, st.expected(rounding, seed))
    check(arrays, cpu_driver_dense(st, rounding, seed))


def cpu_driver_dense(st, rounding=NEAREST, seed=0):
    """The CPU driver's step on the same inputs: (xs, states, scales, masters)."""
    xs, gs, states, scales, masters = st.arrays()
    assert _lowp.dense_step(st.coeffs, xs, gs, states, scales, masters, st.param_fmt,
                            st.grad_fmt, st.state_fmt, st.block, st.qkind, st.signed, rounding,
                            seed, st.t, False, 2) is True
    return xs, states, scales, masters


@pytest.mark.parametrize("grad_fmt", [F32, BF16])
@pytest.mark.parametrize("state", STATES)
def test_gradient_formats_with_float32_parameters(emu, rng, grad_fmt, state):
    st = State(rng, "adam", CASES[0][1], SHAPES, F32, grad_fmt, STATES[state])
    arrays = st.arrays()
    run_dense(emu, st, arrays)
    check(arrays, st.expected())


@pytest.mark.parametrize("block,threads", [(8, None), (256, None), (256, 256), (100, 32),
                                           (4096, None), (1000, 256)])
def test_int8_block_reduction_for_any_block_and_thread_count(emu, rng, block, threads):
    """The absmax is a tree over the block's threads: any block size (partial last blocks) and
    thread count (several elements per thread, threads beyond the block) give the oracle's
    scales and codes; the linear map too."""
    shapes = [(block * 2 + 3,), (5,)]
    for qkind in (0, 1):
        st = State(rng, "adam", CASES[1][1], shapes, F32, F32, Q8, block=block, qkind=qkind)
        arrays = st.arrays()
        run_dense(emu, st, arrays, threads=threads)
        check(arrays, st.expected())
        check(arrays, cpu_driver_dense(st))


def test_int8_block_with_a_huge_value_and_a_zero_block(emu, rng):
    st = State(rng, "momentum", dict(lr=0.1, momentum=0.9), [(192,)], F32, F32, Q8, block=64)
    st.gs[0][:64] = 0.0  # with a zero state (scale 0): a block that stays zero, scale 0
    st.scales[0][0][0] = 0.0
    st.gs[0][70] = 3e38  # one value dominates its block
    arrays = st.arrays()
    scales = arrays[3]
    run_dense(emu, st, arrays)
    check(arrays, st.expected())
    assert scales[0][0][0] == 0.0


def test_int8_block_whose_v_overflows_saturates_as_the_cpu_driver(emu, rng):
    """g = 3e38: Adam's v = (1 - beta2) * g*g overflows float32; the block's scale saturates at
    FLT_MAX (lowp.h, fa_lowp_scale_of) on the GPU as in the CPU driver, bit for bit."""
    st = State(rng, "adam", CASES[0][1], [(192,)], F32, F32, Q8, block=64)
    st.gs[0][70] = 3e38
    arrays = st.arrays()
    run_dense(emu, st, arrays)
    check(arrays, cpu_driver_dense(st))
    assert arrays[3][1][0][1] == np.finfo(np.float32).max  # v's scale of block 1
    assert all(np.isfinite(a).all() for lst in arrays[3] for a in lst)


@pytest.mark.parametrize("seed", [0, 1, 2 ** 64 - 1])
def test_stochastic_rounding_same_seed_same_bits(emu, rng, seed):
    st = State(rng, "adam", CASES[0][1], SHAPES, BF16, F32, Q8)
    first, second = st.arrays(), st.arrays()
    run_dense(emu, st, first, STOCHASTIC, seed, threads=64)
    run_dense(emu, st, second, STOCHASTIC, seed, threads=128)  # other threads: same bits
    check(first, st.expected(STOCHASTIC, seed))
    check(first, cpu_driver_dense(st, STOCHASTIC, seed))
    assert_same_bits(first[0], second[0], "x")
    other = st.arrays()
    run_dense(emu, st, other, STOCHASTIC, seed ^ 1)
    assert any(not np.array_equal(a, b) for a, b in zip(first[0], other[0]))


@pytest.mark.parametrize("grad_fmt", [F32, BF16])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_gradient_skips_the_whole_step(emu, rng, grad_fmt, bad):
    st = State(rng, "adam", CASES[0][1], SHAPES, BF16, grad_fmt, Q8, master=True)
    arrays = st.arrays()
    before = [np.concatenate([a.ravel().view(np.uint8) for a in lst]) if lst else None
              for lst in (arrays[0], arrays[4])]
    g = arrays[1][-1]
    g[5] = bad if grad_fmt == F32 else np.array([bad], np.float32).view(np.uint32)[0] >> 16
    assert run_dense(emu, st, arrays, skip_nonfinite=True) is False
    after = [np.concatenate([a.ravel().view(np.uint8) for a in lst]) for lst in (arrays[0],
                                                                               arrays[4])]
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
    g[5] = 0
    st.gs[-1][:] = g
    assert run_dense(emu, st, arrays, skip_nonfinite=True) is True
    check(arrays, st.expected())


def test_the_lowp_names_are_in_the_module_lists():
    for state in _source.LOWP_STATES:
        for kind in _source.KINDS.values():
            names = _source.module_names("lowp", state, kind)
            assert _source.lowp_dense_name(state, kind, 0) in names
            assert _source.lowp_nonfinite_name("bfloat16") in names


def run_rows(emu, st, arrays, rows, values, rounding=NEAREST, seed=0, grid=None):
    """What fastadam/gpu/_lowp.py's lowp_rows_step does after its checks, on NumPy memory."""
    (x,), _, states, scales, masters = arrays
    q8 = st.state_fmt == Q8
    D = x.shape[1]
    head = header(st, rounding, seed, masters, st.block if q8 else D, F32)
    host, _, _ = _layout.lowp_host_table(head, [x.size],
                                         pointers([x], [values], states, scales, masters), x.size)
    parts = D // st.block if q8 else 1
    emu.emu_lowp_rows(st.state_fmt, st.coeffs.kind, st.coeffs.flags, ptr(host), ptr(rows),
                      ctypes.c_longlong(len(rows)), ctypes.c_longlong(D),
                      ctypes.c_longlong(grid or len(rows) * parts),
                      _layout.lowp_threads(q8, st.block, D))


# the cases whose flag sets the sparse kernels take (no grad_scale, at most two slots), and
# RMSprop with momentum (two slots)
SPARSE_CASES = [c for c in CASES + [("rmsprop", dict(lr=0.01, momentum=0.5))]
                if fold(c[0], 5, c[1]).flags in _source.SPARSE_FLAGS[fold(c[0], 5, c[1]).kind]]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_rows_step_equals_the_oracle(emu, rng, case, param, state):
    name, hyper = case
    param_fmt, rounding, master = PARAMS[param]
    st = State(rng, name, hyper, [(40, 128)], param_fmt, F32, STATES[state], block=32,
               master=master)
    rows = np.array([0, 3, 4, 17, 39], np.int64)
    values = rng.standard_normal((len(rows), 128)).astype(np.float32)
    arrays = st.arrays()
    seed = 77
    run_rows(emu, st, arrays, rows, values, rounding, seed, grid=3)  # blocks loop over the rest
    xs, _, states, scales, masters = arrays
    check((xs, None, states, scales, masters), st.expected_rows(rows, values, rounding, seed))
    (cx,), _, cstates, cscales, cmasters = st.arrays()
    _lowp.rows_step(st.coeffs, cx, rows, values, [lst[0] for lst in cstates],
                    [lst[0] for lst in cscales], cmasters[0] if cmasters else None,
                    st.param_fmt, st.state_fmt, st.block, st.qkind, st.signed, rounding, seed,
                    st.t, 2)
    check((xs, None, states, scales, masters), ([cx], cstates, cscales, cmasters))


def test_the_gpu_lowp_suite_passes_through_a_fake_cupy():
    """tests/test_gpu_lowp.py with tests/fake_cupy on the path: fastadam.gpu's low-precision
    Python code (checks, table, launch arguments) with NumPy memory as "device" memory and the
    emulated kernels.  Not a GPU run."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the host emulation of the GPU kernels")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "fake_cupy"), str(HERE)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-m", "pytest", str(HERE / "test_gpu_lowp.py"), "-q",
                          "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=HERE.parent, env=env)
    tail = out.stdout[-3000:]
    assert out.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 160, tail
