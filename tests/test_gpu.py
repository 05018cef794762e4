"""The CuPy GPU path (fastadam.gpu) against the float64 oracles of tests/reference.py and
against the CPU kernels, which it must equal bit for bit (the same formula headers, no FMA
contraction, IEEE division and square root on both sides).

Every test here is marked ``gpu`` and the module skips without CuPy or a CUDA device.  The
compile check that needs no GPU is in test_gpu_compile.py.
"""
import numpy as np
import pytest

import fastadam
from fastadam._core import _config
from reference import (adagrad_reference, adam_reference, momentum_reference,
                       segment_sum_reference, sparse_adam_reference)
from test_adagrad_momentum import (ADAGRAD_CASES, MOMENTUM_CASES, STEPS, adagrad_state,
                                   check_close)
from test_dense import OPTION_SETS, make_state, operands_of, ulp_distance

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="the GPU path needs CuPy (the gpu extra: cupy-cuda13x)")
if not fastadam.gpu.available():
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

DTYPES = [np.float32, np.float64, np.float16]


def on_gpu(*arrays):
    return [None if a is None else cp.asarray(a) for a in arrays]


def cpu_has(dtype):
    return dtype != np.float16 or _config.has_float16()


def assert_bitwise(gpu_arrays, cpu_arrays):
    for i, (a, b) in enumerate(zip(gpu_arrays, cpu_arrays)):
        if a is None:
            continue
        np.testing.assert_array_equal(cp.asnumpy(a).view(np.uint8), b.view(np.uint8),
                                      err_msg=f"array {i}")


# ------------------------------------------------------------------------------------------
# Dense steps
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("convention", ["tf", "torch", "onnx"])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 1000])
def test_adam_matches_reference_and_cpu(rng, convention, options, dtype, t):
    # the CPU suite's sample size: its ulp bounds were set on 257 elements (the bit-for-bit
    # comparison with the CPU kernels below holds for any size)
    x, g, m, v, v_max = make_state(rng, (257,), dtype, options.get("amsgrad", False))
    kwargs = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-6, convention=convention, **options)
    ref = adam_reference(x, g, m, v, t, v_max=v_max, **kwargs)
    operands = operands_of(x.astype(np.float64), g, m.copy(), v.copy(), **kwargs)
    dx, dg, dm, dv, dvm = on_gpu(x, g, m, v, v_max)
    assert fastadam.step_inplace(dx, dg, dm, dv, t, v_max=dvm, **kwargs) is True
    limit = 6 if dtype != np.float16 else 1
    for name, got, want in zip(("x", "m", "v", "v_max"), (dx, dm, dv, dvm), ref):
        if got is not None:
            assert ulp_distance(cp.asnumpy(got), want, dtype, *operands[name]).max() <= limit
    np.testing.assert_array_equal(cp.asnumpy(dg), g)
    if cpu_has(dtype):
        fastadam.step_inplace(x, g, m, v, t, v_max=v_max, **kwargs)
        assert_bitwise([dx, dm, dv, dvm], [x, m, v, v_max])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ADAGRAD_CASES)
def test_adagrad_matches_reference_and_cpu(rng, case, dtype):
    eps = case.get("eps", {"torch": 1e-10, "onnx": 1e-6, "keras": 1e-7}[case["convention"]])
    for t in STEPS[case["convention"]]:
        x, g, h = adagrad_state(rng, (3, 4099), dtype)
        kw = dict(case, lr=0.05)
        want_x, want_h = adagrad_reference(x, g, h, t, **dict(kw, eps=eps))
        dx, dg, dh = on_gpu(x, g, h)
        assert fastadam.adagrad_step_inplace(dx, dg, dh, t, **kw) is True
        limit = 2 if dtype == np.float16 else 8
        check_close(cp.asnumpy(dh), want_h, dtype, (), limit)
        check_close(cp.asnumpy(dx), want_x, dtype, (x, want_x - x.astype(np.float64)), limit)
        if cpu_has(dtype):
            fastadam.adagrad_step_inplace(x, g, h, t, **kw)
            assert_bitwise([dx, dh], [x, h])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MOMENTUM_CASES)
def test_momentum_matches_reference_and_cpu(rng, case, dtype):
    for t in STEPS[case["convention"]]:
        x, g, v = adagrad_state(rng, (5000,), dtype)
        kw = dict(case, lr=0.05)
        want_x, want_v = momentum_reference(x, g, v, t, **kw)
        dx, dg, dv = on_gpu(x, g, v)
        assert fastadam.momentum_step_inplace(dx, dg, dv, t, **kw) is True
        g_eff = np.abs(g.astype(np.float64)) / kw.get("grad_scale", 1.0) + 0.1 * np.abs(x)
        limit = 2 if dtype == np.float16 else 8
        check_close(cp.asnumpy(dv), want_v, dtype, (v, g_eff), limit)
        check_close(cp.asnumpy(dx), want_x, dtype, (x, want_x - x.astype(np.float64), g_eff),
                    limit)
        if cpu_has(dtype):
            fastadam.momentum_step_inplace(x, g, v, t, **kw)
            assert_bitwise([dx, dv], [x, v])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_list_of_tensors_in_one_call_equals_the_cpu(rng, dtype):
    # sizes around the 4096-element block, an empty tensor, several shapes
    shapes = [(0,), (1,), (4095,), (4096,), (4097,), (3, 5, 7), (70001,), (64, 65)]
    shapes += [(int(n),) for n in rng.integers(1000, 10000, 200)]
    cpu = [make_state(rng, s, dtype, amsgrad=True) for s in shapes]
    gpu = [on_gpu(*state) for state in cpu]
    kw = dict(lr=0.01, convention="torch", amsgrad=True, weight_decay=0.01)
    cols = [[s[i] for s in gpu] for i in range(5)]
    assert fastadam.step_inplace(cols[0], cols[1], cols[2], cols[3], 4, v_max=cols[4], **kw)
    if cpu_has(dtype):
        ccols = [[s[i] for s in cpu] for i in range(5)]
        fastadam.step_inplace(ccols[0], ccols[1], ccols[2], ccols[3], 4, v_max=ccols[4], **kw)
        for c in (0, 2, 3, 4):
            assert_bitwise(cols[c], ccols[c])


def test_runs_on_the_current_stream(rng):
    x, g, m, v, _ = make_state(rng, (100000,), np.float32)
    dx, dg, dm, dv = on_gpu(x, g, m, v)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fastadam.step_inplace(dx, dg, dm, dv, 1, convention="torch")
        result = dx.copy()
    stream.synchronize()
    fastadam.step_inplace(x, g, m, v, 1, convention="torch")
    assert_bitwise([result], [x])


@pytest.mark.parametrize("where", ["first", "last"])
def test_skip_nonfinite_decides_on_the_device_and_changes_nothing(rng, where):
    states = [make_state(rng, (n,), np.float32) for n in (10, 5000, 9000)]
    gpu = [on_gpu(*s[:4]) for s in states]
    bad = gpu[0] if where == "first" else gpu[-1]
    bad[1][-1] = np.inf
    before = [[a.copy() for a in s] for s in gpu]
    cols = [[s[i] for s in gpu] for i in range(4)]
    assert fastadam.step_inplace(*cols, 1, convention="torch", skip_nonfinite=True) is False
    for s, b in zip(gpu, before):
        assert_bitwise(s, [cp.asnumpy(a) for a in b])
    bad[1][-1] = 1.0
    assert fastadam.step_inplace(*cols, 1, convention="torch", skip_nonfinite=True) is True
    assert not bool(cp.array_equal(gpu[0][0], before[0][0]))


def test_skip_nonfinite_sees_overflow_after_grad_scale():
    x, g, m, v = on_gpu(*(np.ones(8, np.float32) for _ in range(4)))
    g[3] = 3e38
    assert fastadam.adagrad_step_inplace(x, g, m, 1, grad_scale=1e-3, skip_nonfinite=True) \
        is False
    np.testing.assert_array_equal(cp.asnumpy(x), 1.0)


# ------------------------------------------------------------------------------------------
# Bad input: every check before anything is written
# ------------------------------------------------------------------------------------------

def _dense_gpu(n=16, dtype=np.float32):
    return [cp.ones(n, dtype=dtype) for _ in range(4)]


def _assert_untouched(arrays):
    for a in arrays:
        if isinstance(a, cp.ndarray):
            assert bool((a == 1).all())


def test_numpy_array_beside_cupy_x_is_rejected():
    args = _dense_gpu()
    args[2] = np.ones(16, np.float32)
    with pytest.raises(TypeError, match=r"^m: a numpy.ndarray in a call on cupy.ndarray arrays"):
        fastadam.step_inplace(*args, 1, convention="torch")
    _assert_untouched(args)


def test_cupy_array_beside_numpy_x_is_rejected():
    args = [np.ones(16, np.float32) for _ in range(4)]
    args[1] = cp.ones(16, np.float32)
    with pytest.raises(TypeError, match=r"^g: a GPU array \(ndarray\) in a call whose x is a "
                                        r"numpy.ndarray"):
        fastadam.step_inplace(*args, 1, convention="torch")
    np.testing.assert_array_equal(args[0], 1.0)


def test_non_contiguous_is_rejected():
    args = _dense_gpu(32)
    args[3] = cp.ones(64, np.float32)[::2]
    with pytest.raises(ValueError, match=r"^v: expected a C-contiguous array"):
        fastadam.step_inplace(*args, 1, convention="torch")
    _assert_untouched(args)


def test_dtype_and_shape_mismatches_are_rejected():
    args = _dense_gpu()
    args[1] = cp.ones(16, np.float64)
    with pytest.raises(TypeError, match=r"^g: expected dtype float32, got float64"):
        fastadam.step_inplace(*args, 1, convention="torch")
    args[1] = cp.ones(15, np.float32)
    with pytest.raises(ValueError, match=r"^g: expected shape \(16,\), got \(15,\)"):
        fastadam.step_inplace(*args, 1, convention="torch")
    args[0] = cp.ones(16, np.int32)
    with pytest.raises(TypeError, match=r"^x: expected float16, float32 or float64, got int32"):
        fastadam.step_inplace(*args, 1, convention="torch")


def test_overlapping_buffers_are_rejected():
    base = cp.ones(32, np.float32)
    args = [base[:16], cp.ones(16, np.float32), base[8:24], cp.ones(16, np.float32)]
    with pytest.raises(ValueError, match=r"^x and m share memory"):
        fastadam.step_inplace(*args, 1, convention="torch")
    _assert_untouched(args + [base])


def _many(n=100, size=8):
    return [[cp.full(size, float(i), np.float32) for i in range(n)] for _ in range(4)]


def _snapshot(arrays):
    return [cp.asnumpy(a).copy() for a in arrays]


def _assert_same(arrays, before):
    for i, (a, b) in enumerate(zip(arrays, before)):
        np.testing.assert_array_equal(cp.asnumpy(a), b, err_msg=f"array {i}")


def test_a_bad_array_among_many_tensors_is_named_and_nothing_is_written():
    xs, gs, ms, vs = _many()
    before = _snapshot(xs + gs + ms + vs)
    gs[70] = gs[70].astype(np.float64)
    with pytest.raises(TypeError, match=r"^g\[70\]: expected dtype float32, got float64"):
        fastadam.step_inplace(xs, gs, ms, vs, 1, convention="torch")
    # two bad arrays: the first in the CPU path's order (tensor by tensor, x, g, then slots)
    xs[30] = cp.ones(16, np.float32)[::2]
    with pytest.raises(ValueError, match=r"^x\[30\]: expected a C-contiguous array"):
        fastadam.step_inplace(xs, gs, ms, vs, 1, convention="torch")
    vs[10] = cp.ones(9, np.float32)
    with pytest.raises(ValueError, match=r"^v\[10\]: expected shape \(8,\), got \(9,\)"):
        fastadam.step_inplace(xs, gs, ms, vs, 1, convention="torch")
    _assert_same([a for i, a in enumerate(xs + gs + ms + vs) if i not in (30, 170, 310)],
                 [b for i, b in enumerate(before) if i not in (30, 170, 310)])


def test_an_overlap_among_many_tensors_is_named_and_nothing_is_written():
    xs, gs, ms, vs = _many()
    fastadam.step_inplace(xs, gs, ms, vs, 1, convention="torch")  # disjoint: steps
    base = cp.zeros(12, np.float32)
    xs[57], ms[57] = base[:8], base[4:]
    before = _snapshot(xs + gs + ms + vs + [base])
    with pytest.raises(ValueError, match=r"^x\[57\] and m\[57\] share memory"):
        fastadam.step_inplace(xs, gs, ms, vs, 1, convention="torch")
    _assert_same(xs + gs + ms + vs + [base], before)


def test_each_thread_uploads_its_tables_into_its_own_buffer():
    """A step's table goes into a buffer reused by the next step of the same thread on the same
    stream; two threads on the null stream must not share one (a race on the GPU)."""
    import threading

    from fastadam.gpu import _kernels

    host = np.arange(200, dtype=np.uint8)
    buffers = []
    worker = threading.Thread(target=lambda: buffers.append(_kernels.upload_table(host)))
    worker.start()
    worker.join()
    buffers.append(_kernels.upload_table(host[::-1].copy()))
    buffers.append(_kernels.upload_table(host))  # this thread again: its buffer, reused
    assert buffers[0].data.ptr != buffers[1].data.ptr
    assert buffers[2].data.ptr == buffers[1].data.ptr
    np.testing.assert_array_equal(cp.asnumpy(buffers[0])[:200], host)
    np.testing.assert_array_equal(cp.asnumpy(buffers[2])[:200], host)


def test_list_length_mismatch_is_rejected():
    xs = [cp.ones(4, np.float32)] * 1
    with pytest.raises(ValueError, match=r"^g: expected a list of 1 arrays like x, got 2"):
        fastadam.step_inplace(xs, xs * 2, xs, xs, 1)


def test_two_devices_are_rejected():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    x, g, m = _dense_gpu()[:3]
    with cp.cuda.Device(1):
        v = cp.ones(16, np.float32)
    with pytest.raises(ValueError, match=r"^v: on GPU 1, but x is on GPU 0"):
        fastadam.step_inplace(x, g, m, v, 1, convention="torch")
    _assert_untouched([x, g, m, v])


def test_float32_hyper_parameter_checks_apply_on_the_gpu():
    with pytest.raises(ValueError, match=r"^eps: .* rounds to 0 in float32"):
        fastadam.step_inplace(*_dense_gpu(), 1, eps=1e-50, convention="torch")


# ------------------------------------------------------------------------------------------
# Sparse steps and segment_sum
# ------------------------------------------------------------------------------------------

def _sparse_case(rng, dtype, n_rows=300, row_shape=(17,), k=900):
    x = rng.standard_normal((n_rows,) + row_shape).astype(dtype)
    m = (0.1 * rng.standard_normal(x.shape)).astype(dtype)
    v = (0.01 * rng.random(x.shape)).astype(dtype)
    indices = rng.zipf(1.5, k) % n_rows
    values = rng.standard_normal((k,) + row_shape).astype(dtype)
    return x, m, v, indices.astype(np.int64), values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_segment_sum_equals_cpu_and_is_deterministic(rng, dtype, index_dtype):
    _, _, _, indices, values = _sparse_case(rng, dtype, k=5000)
    indices = indices.astype(index_dtype)
    rows, sums = fastadam.segment_sum(cp.asarray(indices), cp.asarray(values))
    want_rows, want_sums = segment_sum_reference(indices, values, dtype=dtype)
    np.testing.assert_array_equal(cp.asnumpy(rows), want_rows)
    assert rows.dtype == index_dtype
    assert_bitwise([sums], [want_sums])
    for _ in range(3):
        again = fastadam.segment_sum(cp.asarray(indices), cp.asarray(values))[1]
        assert_bitwise([again], [want_sums])


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [{}, {"weight_decay": 0.1},
                                     {"weight_decay": 0.1, "decoupled_weight_decay": True,
                                      "maximize": True}], ids=["plain", "l2", "adamw-max"])
def test_sparse_adam_matches_reference_and_cpu(rng, mode, dtype, options):
    x, m, v, indices, values = _sparse_case(rng, dtype)
    t = 9
    last = rng.integers(0, t, x.shape[0]).astype(np.int64) if mode == "catchup" else None
    kw = dict(mode=mode, lr=0.01, convention="torch", **options)
    ref = sparse_adam_reference(x, indices, values, m, v, t, last_step=last, **kw)
    dx, dm, dv, dl = on_gpu(x, m, v, last)
    fastadam.sparse_step_inplace(dx, (cp.asarray(indices), cp.asarray(values)), dm, dv, t,
                                 last_step=dl, **kw)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in zip((dx, dm, dv), ref[:3]):
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=tol, atol=tol)
    fastadam.sparse_step_inplace(x, (indices, values), m, v, t, last_step=last, **kw)
    assert_bitwise([dx, dm, dv, dl], [x, m, v, last])


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
@pytest.mark.parametrize("which", ["adagrad", "momentum"])
def test_sparse_adagrad_momentum_equal_cpu(rng, mode, which):
    x, s, _, indices, values = _sparse_case(rng, np.float32, row_shape=(3, 5))
    s = np.abs(s)
    last = rng.integers(0, 4, x.shape[0]).astype(np.int64) if mode == "catchup" else None
    step = (fastadam.sparse_adagrad_step_inplace if which == "adagrad"
            else fastadam.sparse_momentum_step_inplace)
    kw = dict(mode=mode, lr=0.05, weight_decay=0.01)
    if which == "momentum":
        kw["nesterov"] = True
    dx, ds, dl = on_gpu(x, s, last)
    grad = fastadam.IndexedSlices(cp.asarray(values), cp.asarray(indices), x.shape)
    step(dx, grad, ds, 4, last_step=dl, **kw)
    step(x, (indices, values), s, 4, last_step=last, **kw)
    assert_bitwise([dx, ds, dl], [x, s, last])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [dict(lr=0.05), dict(lr=0.05, weight_decay=0.1),
                                     dict(lr=0.05, weight_decay=0.1, weight_decay_mode="decoupled",
                                          maximize=True, grad_scale=2.0)],
                         ids=["plain", "l2", "decoupled"])
def test_rowwise_adagrad_dense_equals_cpu(rng, dtype, options):
    shapes = [(9, 13), (4, 64), (6,), (2, 0)]
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    gs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    accs = [np.abs(rng.standard_normal(s[:1])).astype(dtype) for s in shapes]
    dxs, dgs, daccs = on_gpu(*xs), on_gpu(*gs), on_gpu(*accs)
    assert fastadam.rowwise_adagrad_step_inplace(dxs, dgs, daccs, 2, **options) is True
    fastadam.rowwise_adagrad_step_inplace(xs, gs, accs, 2, **options)
    assert_bitwise(dxs + daccs, xs + accs)
    bad = gs[0].copy()
    bad[1, 2] = np.inf
    before = cp.asnumpy(dxs[0])
    assert fastadam.rowwise_adagrad_step_inplace(dxs[0], cp.asarray(bad), daccs[0], 3,
                                                 skip_nonfinite=True) is False
    np.testing.assert_array_equal(cp.asnumpy(dxs[0]), before)
    with pytest.raises(ValueError, match=r"^acc: expected shape \(9,\)"):
        fastadam.rowwise_adagrad_step_inplace(dxs[0], dgs[0], cp.zeros((9, 13), dtype), 3)


def test_rowwise_adagrad_object_on_cupy_parameters_equals_cpu(rng):
    w = rng.standard_normal((7, 5)).astype(np.float32)
    dw = cp.asarray(w)
    opt, dopt = fastadam.RowWiseAdagrad([w], lr=0.1), fastadam.RowWiseAdagrad([dw], lr=0.1)
    assert isinstance(dopt.state(0)["sum"], cp.ndarray) and dopt.state(0)["sum"].shape == (7,)
    for _ in range(2):
        g = rng.standard_normal(w.shape).astype(np.float32)
        opt.step([g])
        dopt.step([cp.asarray(g)])
    assert_bitwise([dw, dopt.state(0)["sum"]], [w, opt.state(0)["sum"]])


@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
def test_sparse_rowwise_adagrad_equals_cpu(rng, mode):
    x, s, _, indices, values = _sparse_case(rng, np.float32, row_shape=(3, 5))
    acc = np.abs(s.reshape(s.shape[0], -1)[:, 0]).copy()
    last = rng.integers(0, 4, x.shape[0]).astype(np.int64) if mode == "catchup" else None
    kw = dict(mode=mode, lr=0.05, weight_decay=0.01)
    dx, dacc, dl = on_gpu(x, acc, last)
    grad = fastadam.IndexedSlices(cp.asarray(values), cp.asarray(indices), x.shape)
    fastadam.sparse_rowwise_adagrad_step_inplace(dx, grad, dacc, 4, last_step=dl, **kw)
    fastadam.sparse_rowwise_adagrad_step_inplace(x, (indices, values), acc, 4, last_step=last,
                                                 **kw)
    assert_bitwise([dx, dacc, dl], [x, acc, last])


def test_sparse_dense_mode_equals_the_dense_step_on_the_densified_gradient(rng):
    x, m, v, indices, values = _sparse_case(rng, np.float32)
    dense_g = np.zeros_like(x)
    np.add.at(dense_g, indices, values)
    a = on_gpu(x, m, v)
    b = on_gpu(x, m, v)
    fastadam.sparse_step_inplace(a[0], (cp.asarray(indices), cp.asarray(values)), a[1], a[2],
                                 3, mode="dense", convention="tf")
    fastadam.step_inplace(b[0], cp.asarray(dense_g), b[1], b[2], 3, convention="tf")
    assert_bitwise(a, [cp.asnumpy(c) for c in b])


def test_catchup_long_gap_uses_one_power(rng):
    x, m, v, indices, values = _sparse_case(rng, np.float64)
    last = np.zeros(x.shape[0], np.int64)
    dx, dm, dv, dl = on_gpu(x, m, v, last)
    fastadam.sparse_step_inplace(dx, (cp.asarray(indices), cp.asarray(values)), dm, dv, 500,
                                 mode="catchup", last_step=dl)
    ref = sparse_adam_reference(x, indices, values, m, v, 500, mode="catchup", last_step=last)
    for got, want in zip((dx, dm, dv), ref[:3]):
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-12, atol=1e-300)


def test_sparse_bad_input_is_rejected_before_any_write(rng):
    x, m, v, indices, values = (cp.asarray(a) for a in _sparse_case(rng, np.float32))
    before = [a.copy() for a in (x, m, v)]
    bad = indices.copy()
    bad[5] = x.shape[0]
    with pytest.raises(IndexError, match=r"^indices: index 300 is out of range for 300 rows"):
        fastadam.sparse_step_inplace(x, (bad, values), m, v, 1)
    bad[5] = -1
    with pytest.raises(IndexError, match=r"^indices: negative index -1"):
        fastadam.sparse_step_inplace(x, (bad, values), m, v, 1)
    with pytest.raises(TypeError, match=r"^values: expected dtype float32 \(the dtype of x\)"):
        fastadam.sparse_step_inplace(x, (indices, values.astype(np.float64)), m, v, 1)
    with pytest.raises(TypeError, match=r"^values: a numpy.ndarray in a call on cupy.ndarray"):
        fastadam.sparse_step_inplace(x, (indices, cp.asnumpy(values)), m, v, 1)
    with pytest.raises(ValueError, match=r"^last_step: catchup mode needs last_step"):
        fastadam.sparse_step_inplace(x, (indices, values), m, v, 1, mode="catchup")
    last = cp.full(x.shape[0], 5, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^last_step: expected 0 <= last_step < t=3"):
        fastadam.sparse_step_inplace(x, (indices, values), m, v, 3, mode="catchup",
                                     last_step=last)
    assert bool((last == 5).all())
    for a, b in zip((x, m, v), before):
        assert bool(cp.array_equal(a, b))


# ------------------------------------------------------------------------------------------
# Optimizer objects and PyTorch on CUDA
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda p: fastadam.Adam(p, lr=0.01, betas=(0.9, 0.99), convention="torch", amsgrad=True),
    lambda p: fastadam.AdamW(p, lr=0.01, weight_decay=0.1),
    lambda p: fastadam.Adagrad(p, lr=0.05, lr_decay=0.01),
    lambda p: fastadam.SGD(p, lr=0.05, momentum=0.9, nesterov=True)],
    ids=["Adam", "AdamW", "Adagrad", "SGD"])
def test_optimizer_objects_on_cupy_parameters_equal_cpu(rng, make):
    params = [rng.standard_normal(s).astype(np.float32) for s in [(10, 20), (20,), (5000,)]]
    gpu_params = [cp.asarray(p) for p in params]
    cpu_opt, gpu_opt = make(params), make(gpu_params)
    for i in range(len(params)):
        assert all(isinstance(a, cp.ndarray) for a in gpu_opt.state(i).values())
    for _ in range(5):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        assert gpu_opt.step([cp.asarray(g) for g in grads]) is True
        cpu_opt.step(grads)
    assert gpu_opt.t == cpu_opt.t == 5
    assert_bitwise(gpu_params, params)


def test_optimizer_object_rejects_a_numpy_gradient_for_a_cupy_parameter(rng):
    x = cp.ones(8, np.float32)
    opt = fastadam.Adam([x], lr=0.1)
    with pytest.raises(TypeError, match=r"^(grads|g\[0\]): a numpy.ndarray in a call on "
                                        r"cupy.ndarray"):
        opt.step(np.ones(8, np.float32))
    assert bool((x == 1).all()) and opt.t == 0


@pytest.mark.parametrize("amsgrad", [False, True])
def test_trajectory_follows_torch_fused_adam_on_cuda(rng, amsgrad):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    x0 = rng.standard_normal(10000).astype(np.float32)
    p = torch.nn.Parameter(torch.tensor(x0, device="cuda"))
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                           amsgrad=amsgrad, fused=True)
    x, m, v, vm = on_gpu(x0, np.zeros_like(x0), np.zeros_like(x0), np.zeros_like(x0))
    for t in range(1, 51):
        g = rng.standard_normal(x0.shape).astype(np.float32)
        p.grad = torch.tensor(g, device="cuda")
        opt.step()
        fastadam.step_inplace(x, cp.asarray(g), m, v, t, lr=1e-3, convention="torch",
                              weight_decay=0.01, amsgrad=amsgrad, v_max=vm if amsgrad else None)
    np.testing.assert_allclose(cp.asnumpy(x), p.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
