"""Reliability of the compiled core under hostile or unusual use: concurrent index mutation,
thread counts and step numbers that do not fit, fork, hyper-parameters that the compute
precision cannot hold, and builds without float16 support."""
import multiprocessing
import threading
import warnings

import numpy as np
import pytest

import fastadam
from fastadam._core import _config
from fastadam._core._threads import MAX_THREADS_PER_CPU, cpu_count, resolve_num_threads


def test_indices_changed_by_another_thread_never_reach_the_kernel_unchecked():
    """The caller's index array is read once (copied, then range-checked): flipping it between
    valid and out-of-range values from another thread gives IndexError or a valid step, never
    an out-of-bounds access."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    idx = rng.integers(0, 64, 4096).astype(np.int64)
    values = rng.standard_normal((4096, 256)).astype(np.float32)
    stop = threading.Event()

    def mutate():
        while not stop.is_set():
            idx[::7] = 1 << 40
            idx[::7] = 3

    thread = threading.Thread(target=mutate)
    thread.start()
    outcomes = set()
    try:
        for t in range(1, 150):
            try:
                fastadam.sparse_step_inplace(x, (idx, values), m, v, t, num_threads=2)
                outcomes.add("ok")
            except IndexError as err:
                assert "out of range" in str(err)
                outcomes.add("IndexError")
    finally:
        stop.set()
        thread.join()
    assert outcomes and np.isfinite(x).all()


def test_thread_counts_are_capped_and_numpy_integers_accepted():
    cap = MAX_THREADS_PER_CPU * cpu_count()
    assert resolve_num_threads(2**31) == cap
    assert resolve_num_threads(np.int64(1)) == 1
    x = np.ones(200_000, np.float32)
    g, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    assert fastadam.step_inplace(x, g, m, v, np.int64(1), num_threads=2**31)
    idx = np.arange(10, dtype=np.int64)
    fastadam.segment_sum(idx, np.ones((10, 3)), num_threads=2**40)
    fastadam.sparse_step_inplace(x.reshape(-1, 4), (idx, np.ones((10, 4), np.float32)),
                                 m.reshape(-1, 4), v.reshape(-1, 4), 1, num_threads=2**40)
    with pytest.raises(TypeError, match="num_threads: expected None or an int, got float"):
        resolve_num_threads(2.0)


@pytest.mark.parametrize("t", [2**63, 2**70, -2**63 - 1])
def test_step_numbers_beyond_int64_are_value_errors(t):
    x = np.ones((4, 2), np.float32)
    m, v = np.zeros_like(x), np.zeros_like(x)
    with pytest.raises(ValueError, match=r"t: expected a step number below 2\*\*63"):
        fastadam.sparse_step_inplace(x, (np.array([1]), np.ones((1, 2), np.float32)), m, v, t)
    with pytest.raises(ValueError, match=r"t: expected a step number below 2\*\*63"):
        fastadam.step_inplace(x, x.copy(), m, v, t, convention="onnx")
    with pytest.raises(ValueError, match=r"t: expected a step number below 2\*\*63"):
        fastadam.adagrad_step_inplace(x, x.copy(), m, t)


def test_the_largest_valid_index_works_in_segment_sum():
    idx = np.array([2**63 - 1, 5, 2**63 - 1], dtype=np.int64)
    rows, sums = fastadam.segment_sum(idx, np.array([[1.0], [2.0], [4.0]]))
    np.testing.assert_array_equal(rows, [5, 2**63 - 1])
    np.testing.assert_array_equal(sums, [[2.0], [5.0]])


def _step_in_child(queue):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = np.ones(400_000, np.float32)
        fastadam.step_inplace(x, x.copy(), np.zeros_like(x), np.zeros_like(x), 1)
        fastadam.segment_sum(np.arange(300_000) % 7, np.ones((300_000, 1)))
    queue.put([str(w.message) for w in caught])


@pytest.mark.skipif(not _config.openmp_enabled(), reason="a serial build has no thread pool")
def test_a_forked_child_runs_single_threaded_instead_of_hanging():
    x = np.ones(400_000, np.float32)  # a parallel region in the parent first
    fastadam.step_inplace(x, x.copy(), np.zeros_like(x), np.zeros_like(x), 1, num_threads=2)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_step_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung in OpenMP")
    assert child.exitcode == 0
    messages = queue.get(timeout=5)
    assert len(messages) == 1 and "created by fork()" in messages[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_hyperparameters_are_checked_in_the_compute_precision(dtype):
    x = np.ones(8, dtype)
    g, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    with pytest.raises(ValueError, match="eps: 1e-50 rounds to 0 in float32"):
        fastadam.step_inplace(x, g, m, v, 1, eps=1e-50)
    with pytest.raises(ValueError, match="lr: .* overflows float32"):
        fastadam.step_inplace(x, g, m, v, 1, lr=1e40)
    with pytest.raises(ValueError, match="grad_scale: 1e-50 rounds to 0 in float32"):
        fastadam.momentum_step_inplace(x, g, m, 1, grad_scale=1e-50)
    with pytest.raises(ValueError, match="eps: 1e-60 rounds to 0 in float32"):
        fastadam.adagrad_step_inplace(x, g, m, 1, eps=1e-60)
    np.testing.assert_array_equal(x, 1)  # nothing was written
    x64 = np.ones(8)  # float64 holds them: no error
    fastadam.step_inplace(x64, x64.copy(), np.zeros(8), np.zeros(8), 1, eps=1e-50)


def test_float16_is_rejected_by_a_build_without_float16(monkeypatch):
    monkeypatch.setattr(_config, "has_float16", lambda: False)
    x = np.ones(8, np.float16)
    with pytest.raises(TypeError, match="x: float16 is not supported by this build"):
        fastadam.step_inplace(x, x.copy(), np.zeros_like(x), np.zeros_like(x), 1)
    with pytest.raises(TypeError, match="x: float16 is not supported by this build"):
        fastadam.adagrad_step_inplace(x, x.copy(), np.zeros_like(x), 1)
    np.testing.assert_array_equal(x, 1)
    assert "float16_kernels" in fastadam.config()


def test_a_multi_dtype_optimizer_step_is_all_or_nothing():
    """Two dtypes take two compiled calls; a learning rate that float32 cannot hold (from a
    schedule: known only at step time) must fail before the float64 call writes anything.
    (A fixed eps that float32 cannot hold is refused by the constructor already.)"""
    p64, p32 = np.ones(5), np.ones(5, np.float32)
    with pytest.raises(ValueError, match="eps: 1e-50 rounds to 0 in float32"):
        fastadam.Adam([p64, p32], lr=0.1, eps=1e-50)
    opt = fastadam.Adam([p64, p32], lr=lambda k: 1e40)
    with pytest.raises(ValueError, match="lr: .* overflows float32"):
        opt.step([np.ones(5), np.ones(5, np.float32)])
    np.testing.assert_array_equal(p64, 1.0)
    np.testing.assert_array_equal(p32, 1.0)
    assert opt.t == 0
    # the same with a sparse gradient beside the dense one
    table = np.ones((4, 3), np.float32)
    opt = fastadam.Adagrad([p64, table], lr=lambda k: 1e40)
    with pytest.raises(ValueError, match="lr: .* overflows float32"):
        opt.step([np.ones(5), fastadam.IndexedSlices(np.ones((1, 3), np.float32),
                                                     np.array([2]), (4, 3))])
    np.testing.assert_array_equal(p64, 1.0)
    np.testing.assert_array_equal(table, 1.0)
