"""The GPU kernels run on the host: include/fastadam/cuda/kernels.cu compiled as C++ with a
small emulation of the CUDA built-ins (tests/gpu_emulation.cpp), driven with the tables and
segment arrays that fastadam.gpu builds (``_layout.host_table``, ``_layout.sort_segments``), on
NumPy memory.  Results must equal the CPU kernels bit for bit: same formula headers, no FMA
contraction on either side.  This checks the kernels' indexing, table lookup, non-finite flag,
sparse modes and float16 conversions without a GPU; it cannot check CuPy, NVRTC (see
test_gpu_compile.py) or anything about concurrency.  Skips without g++.
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

import fastadam
from fastadam._core import _config
from fastadam.gpu import _layout, _source
from fastadam.optim._coefficients import (adagrad_coefficients, adam_coefficients,
                                          momentum_coefficients)
from gpu_emulation_build import BuildError, build
from reference import segment_sum_reference
from test_adagrad_momentum import ADAGRAD_CASES, MOMENTUM_CASES
from test_dense import OPTION_SETS, make_state

HERE = Path(__file__).resolve().parent
STORAGE = {np.dtype(np.float16): 0, np.dtype(np.float32): 1, np.dtype(np.float64): 2}
FLAG_MASK = {k: max(f) for k, f in _source.DENSE_FLAGS.items()}
THREADS = 3  # an odd block size, so the kernels' strided loops are exercised


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


def run_dense(emu, coeffs, xs, gs, slot_lists, skip_nonfinite=False):
    """What fastadam/gpu/_dense.py does, on NumPy memory: table, optional flag, one launch."""
    dtype = xs[0].dtype
    pointers = [[a.ctypes.data for a in lst] for lst in [xs, gs] + slot_lists]
    host, n, nblocks = _layout.host_table(coeffs, [a.size for a in xs], pointers)
    flags = coeffs.as_dict()["flags"] & FLAG_MASK[coeffs.kind]
    flag = np.zeros(1, np.int32)
    if skip_nonfinite and n:
        emu.emu_nonfinite(STORAGE[dtype], ptr(host), n, ctypes.c_longlong(nblocks),
                          ctypes.c_double(coeffs.grad_scale), ptr(flag))
    if n:
        emu.emu_dense_step(STORAGE[dtype], coeffs.kind, flags, ptr(host), n,
                           ctypes.c_longlong(nblocks), ptr(flag), int(skip_nonfinite), THREADS)
    return not flag[0]


def assert_bitwise(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        if a is not None:
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=str(i))


SHAPES = [(0,), (1,), (4095,), (4096,), (4097,), (3, 3001), (9000,)]


def _needs(dtype):
    if dtype == np.float16 and not _config.has_float16():
        pytest.skip("the CPU build has no float16 kernels to compare with")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("convention", ["tf", "torch"])
def test_adam_kernel_equals_cpu(emu, rng, dtype, options, convention):
    _needs(dtype)
    amsgrad = options.get("amsgrad", False)
    states = [make_state(rng, s, dtype, amsgrad) for s in SHAPES]
    kw = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-6, convention=convention, **options)
    t = 7
    coeffs = adam_coefficients(t, kw["lr"], kw["beta1"], kw["beta2"], kw["eps"], convention,
                               options.get("weight_decay", 0.0),
                               options.get("decoupled_weight_decay", False),
                               options.get("post_decay", 0.0), amsgrad,
                               options.get("nesterov", False), options.get("maximize", False),
                               options.get("grad_scale"))
    dev = [[a.copy() if a is not None else None for a in s] for s in states]
    cols = [[s[i] for s in dev] for i in range(5)]
    slots = cols[2:4] + ([cols[4]] if amsgrad else [])
    assert run_dense(emu, coeffs, cols[0], cols[1], slots) is True
    host = [[s[i] for s in states] for i in range(5)]
    fastadam.step_inplace(host[0], host[1], host[2], host[3], t,
                          v_max=host[4] if amsgrad else None, **kw)
    for c in (0, 2, 3) + ((4,) if amsgrad else ()):
        assert_bitwise(cols[c], host[c])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("which,case", [("adagrad", c) for c in ADAGRAD_CASES]
                         + [("momentum", c) for c in MOMENTUM_CASES])
def test_adagrad_and_momentum_kernels_equal_cpu(emu, rng, dtype, which, case):
    _needs(dtype)
    t = 0 if case["convention"] == "onnx" else 3
    kw = dict(case, lr=0.05)
    states = [[np.array(rng.standard_normal(s), dtype=dtype) for _ in range(2)]
              + [np.array(rng.uniform(0, 2, s), dtype=dtype)] for s in SHAPES]
    fold = adagrad_coefficients if which == "adagrad" else momentum_coefficients
    coeffs = fold(t, **kw)
    dev = [[a.copy() for a in s] for s in states]
    cols = [[s[i] for s in dev] for i in range(3)]
    run_dense(emu, coeffs, cols[0], cols[1], [cols[2]])
    host = [[s[i] for s in states] for i in range(3)]
    step = fastadam.adagrad_step_inplace if which == "adagrad" else \
        fastadam.momentum_step_inplace
    step(host[0], host[1], host[2], t, **kw)
    for c in (0, 2):
        assert_bitwise(cols[c], host[c])


# 70000: finite in float32, overflows once scaled (not a float16 value, so float32 only)
@pytest.mark.parametrize("dtype,bad", [(np.float32, np.nan), (np.float32, np.inf),
                                       (np.float32, 70000.0), (np.float16, np.nan),
                                       (np.float16, np.inf)])
def test_nonfinite_flag_skips_the_whole_step(emu, rng, dtype, bad):
    states = [make_state(rng, s, dtype) for s in SHAPES]
    cols = [[s[i] for s in states] for i in range(4)]
    cols[1][-1][-1] = bad  # 70000 is finite in float32 but, scaled by 1/0.5e-34, is not
    before = [[a.copy() for a in c] for c in cols]
    coeffs = adam_coefficients(1, 1e-3, 0.9, 0.999, 1e-8, "torch", 0.0, False, 0.0, False,
                               False, False, 0.5e-34 if bad == 70000.0 else None)
    assert run_dense(emu, coeffs, cols[0], cols[1], cols[2:4], skip_nonfinite=True) is False
    for c, b in zip(cols, before):
        assert_bitwise(c, b)
    # finite again (and no tiny grad_scale, whose squares would overflow v): applied
    cols[1][-1][-1] = 0.5
    coeffs = adam_coefficients(1, 1e-3, 0.9, 0.999, 1e-8, "torch")
    assert run_dense(emu, coeffs, cols[0], cols[1], cols[2:4], skip_nonfinite=True) is True
    assert not np.array_equal(cols[0][-1], before[0][-1])


def _segments(rng, n_rows, k, dtype, row_shape):
    indices = (rng.zipf(1.5, k) % n_rows).astype(np.int64)
    values = rng.standard_normal((k,) + row_shape).astype(dtype)
    return indices, values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_sum_kernel_is_the_ordered_sum(emu, rng, dtype):
    indices, values = _segments(rng, 50, 3000, dtype, (2, 3))
    perm, rows, offsets = _layout.sort_segments(np, indices)
    out = np.empty((rows.shape[0], 6), dtype)
    emu.emu_segment_sum(STORAGE[np.dtype(dtype)], ptr(values), ctypes.c_longlong(6), ptr(perm),
                        ptr(offsets), ctypes.c_longlong(rows.shape[0]), ptr(out), THREADS)
    want_rows, want = segment_sum_reference(indices, values, dtype=dtype)
    np.testing.assert_array_equal(rows, want_rows)
    assert_bitwise([out.reshape(want.shape)], [want])


def run_sparse(emu, coeffs, x, slots, indices, values, mode, last_step, t):
    """What fastadam/gpu/_sparse.py does after its checks, on NumPy memory."""
    perm, rows, offsets = _layout.sort_segments(np, indices.astype(np.int64))
    n_rows, row_size = x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))
    nseg = rows.shape[0]
    head = np.zeros(_layout.HEADER_BYTES, np.uint8)
    _layout.coefficient_bytes(coeffs, head)
    flags = coeffs.as_dict()["flags"] & 5
    st1 = slots[1] if len(slots) > 1 else slots[0]
    if mode == "dense":
        seg = np.full(n_rows, -1, np.int64)
        seg[rows] = np.arange(nseg)
        target, grid_rows = seg, n_rows
    else:
        target, grid_rows = rows, nseg
    if grid_rows == 0:
        return
    mode_id = {"lazy": 0, "dense": 1, "catchup": 2}[mode]
    emu.emu_sparse(STORAGE[x.dtype], coeffs.kind, flags, mode_id,
                   ptr(head), ptr(x), ptr(slots[0]), ptr(st1), ctypes.c_longlong(row_size),
                   ctypes.c_longlong(n_rows), ptr(values), ptr(perm), ptr(offsets), ptr(target),
                   ctypes.c_longlong(nseg), ptr(last_step), ctypes.c_longlong(t), THREADS)


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("which", ["adam", "adamw", "adagrad", "momentum"])
def test_sparse_kernels_equal_cpu(emu, rng, mode, dtype, which):
    n_rows, row_shape, t = 200, (3, 5), 90  # catch-up gaps up to 89: both decay branches
    indices, values = _segments(rng, n_rows, 700, dtype, row_shape)
    x = rng.standard_normal((n_rows,) + row_shape).astype(dtype)
    nslots = 2 if which.startswith("adam") else 1
    slots = [np.abs(rng.standard_normal(x.shape)).astype(dtype) for _ in range(nslots)]
    last = rng.integers(0, t, n_rows).astype(np.int64) if mode == "catchup" else None
    if which == "adam":
        kw = dict(lr=0.01, convention="torch", weight_decay=0.1)
        coeffs = adam_coefficients(t, 0.01, 0.9, 0.999, 1e-8, "torch", 0.1)
        step = fastadam.sparse_step_inplace
    elif which == "adamw":
        kw = dict(lr=0.01, convention="tf", weight_decay=0.1, decoupled_weight_decay=True,
                  maximize=True)
        coeffs = adam_coefficients(t, 0.01, 0.9, 0.999, 1e-8, "tf", 0.1, True, maximize=True)
        step = fastadam.sparse_step_inplace
    elif which == "adagrad":
        kw = dict(lr=0.05, convention="keras", weight_decay=0.01)
        coeffs = adagrad_coefficients(t, **kw)
        step = fastadam.sparse_adagrad_step_inplace
    else:
        kw = dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)
        coeffs = momentum_coefficients(t, **kw)
        step = fastadam.sparse_momentum_step_inplace
    dev = [a.copy() for a in [x] + slots] + [None if last is None else last.copy()]
    run_sparse(emu, coeffs, dev[0], dev[1:1 + nslots], indices, values, mode, dev[-1], t)
    step(x, (indices, values), *slots, t, mode=mode, last_step=last, **kw)
    assert_bitwise(dev, [x] + slots + [last])


def test_the_gpu_suite_passes_through_a_fake_cupy():
    """tests/test_gpu.py, run with tests/fake_cupy on the path: fastadam.gpu's real Python code
    (dispatch, checks, tables, segment sorting, launch arguments) with NumPy memory as "device"
    memory and the emulated kernels.  Not a GPU run.  Deselected: the one test the fake cannot
    pass (its device arrays are NumPy subclasses, so a "device" g beside a NumPy x is accepted
    by the CPU path)."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the host emulation of the GPU kernels")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "fake_cupy"), str(HERE)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "test_gpu.py"), "-q", "-p",
         "no:cacheprovider", "-k", "not cupy_array_beside_numpy_x"],
        capture_output=True, text=True, cwd=HERE.parent, env=env)
    tail = out.stdout[-3000:]
    assert out.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 200, tail
