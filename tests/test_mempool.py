"""fastadam.MemoryPool: NumPy's data allocator for a context (NEP 49), a caching pool.

Values written through many allocation cycles read back intact (against copies made outside the
pool); calloc zeroes a reused dirty block; realloc (``ndarray.resize``, ``np.fromiter``) keeps
the data; arrays outlive their pool; ``with`` blocks nest, restore the previous allocator on an
exception and are per thread; the cap and the size-class table bound what is cached; a loop of
8 MB arrays page-faults far less in a pool than outside (counted, not timed); fork; a
TrainingSession trains bit for bit the same with and without its pool; bad arguments.
"""
import copy
import gc
import os
import pickle
import platform
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastadam
from fastadam import MemoryPool

try:  # NumPy 2 moved it; 1.x has it at numpy.core.multiarray
    from numpy._core.multiarray import get_handler_name
except ImportError:  # pragma: no cover - NumPy < 2
    from numpy.core.multiarray import get_handler_name

POOL_NAME = "fastadam_memory_pool"
DEFAULT = get_handler_name()  # this context's allocator before any pool


def block_total(nbytes):
    """A pooled block's size as documented: the request plus a 64-byte header, rounded up to a
    multiple of 4 KiB."""
    return -(-(nbytes + 64) // 4096) * 4096


def test_public_name_and_repr():
    assert "MemoryPool" in fastadam.__all__
    pool = MemoryPool(1 << 20)
    assert repr(pool) == "MemoryPool(max_cached_bytes=1048576, cached_bytes=0, cached_blocks=0)"
    assert pool.max_cached_bytes == 1 << 20
    assert MemoryPool().max_cached_bytes == 256 * 1024 * 1024


def test_arrays_made_inside_use_the_pool_and_outside_do_not():
    pool = MemoryPool()
    before = np.empty(1000)
    with pool as entered:
        assert entered is pool
        assert get_handler_name() == POOL_NAME
        inside = np.empty(1000)
        small = np.empty(3)
    after = np.empty(1000)
    assert get_handler_name() == DEFAULT
    assert get_handler_name(inside) == get_handler_name(small) == POOL_NAME
    assert get_handler_name(before) == get_handler_name(after) == DEFAULT
    assert pool.stats()["fresh"] == 1  # the 8000-byte array; the 24-byte one is not pooled


def test_values_survive_many_cycles_of_varied_sizes():
    """Arrays of sizes around every boundary (malloc/pool at 4 KiB, page multiples) are
    written, some kept, the rest freed and their blocks reused; every kept array still holds
    what was written (checked against copies made outside the pool)."""
    rng = np.random.default_rng(0)
    sizes = [0, 1, 7, 4000, 4031, 4032, 4033, 4095, 4096, 4097, 8128, 8129, 12345, 65536,
             1 << 20, (1 << 20) + 3]
    pool = MemoryPool(64 << 20)
    kept = []
    with pool:
        for cycle in range(30):
            live = []
            for n in rng.permutation(sizes):
                a = np.empty(int(n), np.uint8)
                a[:] = rng.integers(0, 256, a.size, dtype=np.uint8)
                live.append(a)
            for a in live[::3]:
                kept.append((a, a.copy()))
            del live
    assert pool.stats()["reused"] > 0
    copies_inside = [get_handler_name(ref) for _, ref in kept]
    assert set(copies_inside) == {POOL_NAME}
    for a, ref in kept:
        want = np.frombuffer(bytes(ref), np.uint8)  # a copy made by Python, not by the pool
        np.testing.assert_array_equal(a, want)


def test_data_of_pooled_blocks_is_64_byte_aligned():
    with MemoryPool():
        for n in (4096, 5000, 1 << 16, 3 << 20):
            assert np.empty(n, np.uint8).ctypes.data % 64 == 0
            assert np.zeros(n, np.uint8).ctypes.data % 64 == 0


@pytest.mark.parametrize("nbytes", [100, 5000, 1 << 20])
def test_zeros_are_zero_in_a_reused_dirty_block(nbytes):
    pool = MemoryPool()
    with pool:
        dirty = np.full(nbytes, 0xAB, np.uint8)
        address = dirty.ctypes.data
        del dirty
        z = np.zeros(nbytes, np.uint8)
        if nbytes >= 4096:  # pooled: the same block, dirty, came back
            assert z.ctypes.data == address
            assert pool.stats()["reused"] == 1
        assert not z.any()
        f = np.zeros(nbytes // 8, np.float64)
        assert not f.any()


@pytest.mark.parametrize("start,sizes", [
    (10, [20, 3000, 5000, 2_000_000, 1_999_000, 900_000, 100, 0, 50]),
    (5000, [8000, 4000, 6000, 40_000, 30_000, 10]),
])
def test_resize_keeps_the_data(start, sizes):
    """``ndarray.resize`` goes through the handler's realloc: small to small, small to pooled,
    within a pooled block's capacity, to a bigger block, to a small block."""
    rng = np.random.default_rng(1)
    with MemoryPool():
        a = rng.integers(0, 256, start, dtype=np.uint8)
        a = np.array(a)  # owned data, allocated by the pool
        assert get_handler_name(a) == POOL_NAME
        ref = bytes(a)
        for n in sizes:
            a.resize(n, refcheck=False)
            keep = min(len(ref), n)
            np.testing.assert_array_equal(a[:keep], np.frombuffer(ref[:keep], np.uint8))
            assert not a[keep:].any()  # resize fills the new part with zeros
            a[:] = rng.integers(0, 256, n, dtype=np.uint8)
            ref = bytes(a)


def test_fromiter_grows_by_realloc():
    with MemoryPool():
        a = np.fromiter((i * 3 for i in range(100_000)), np.int64)
    np.testing.assert_array_equal(a, np.arange(100_000, dtype=np.int64) * 3)
    assert get_handler_name(a) == POOL_NAME


def test_arrays_outlive_their_pool():
    """The pool object goes first; its arrays still read and write, and free without a crash
    (each holds a reference to the pool's allocator)."""
    rng = np.random.default_rng(2)
    pool = MemoryPool()
    with pool:
        arrays = [rng.standard_normal(n) for n in (10, 1000, 100_000)]
    refs = [bytes(a) for a in arrays]
    del pool
    gc.collect()
    for a, r in zip(arrays, refs):
        assert bytes(a) == r
        a *= 2
    del arrays
    gc.collect()
    with MemoryPool():  # an anonymous pool: freed when its last array goes
        b = np.ones(1 << 16)
    gc.collect()
    assert b.sum() == 1 << 16
    del b


def test_nested_pools_and_exceptions_restore_the_previous_allocator():
    outer, inner = MemoryPool(), MemoryPool()
    with outer:
        with pytest.raises(KeyError):
            with inner:
                assert get_handler_name() == POOL_NAME
                np.empty(1 << 14)
                raise KeyError("boom")
        assert get_handler_name() == POOL_NAME
        np.empty(1 << 14)  # from the outer pool again
        with outer:  # the same pool, nested in itself
            np.empty(1 << 15)
        np.empty(1 << 16)
    assert get_handler_name() == DEFAULT
    assert inner.stats()["fresh"] == 1
    assert outer.stats()["fresh"] == 3
    with pytest.raises(ValueError):
        with outer:
            raise ValueError
    assert get_handler_name() == DEFAULT


def test_exit_without_enter_is_an_error():
    a, b = MemoryPool(), MemoryPool()
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        a.__exit__(None, None, None)
    a.__enter__()
    b.__enter__()
    with pytest.raises(RuntimeError, match="must nest"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    assert get_handler_name() == DEFAULT


def test_each_thread_has_its_own_allocator():
    """A pool entered in one thread is not the allocator of another; arrays made in one thread
    are freed in another."""
    pool, theirs = MemoryPool(), MemoryPool()
    inherits = bool(getattr(sys.flags, "thread_inherit_context", 0))
    seen = {}
    entered, checked = threading.Event(), threading.Event()
    made = []

    def worker():
        seen["start"] = get_handler_name()
        with theirs:
            made.append(np.ones(1 << 17))
            entered.set()
            checked.wait(10)
        seen["end"] = get_handler_name()

    with pool:
        t = threading.Thread(target=worker)
        t.start()
        assert entered.wait(10)
        assert get_handler_name() == POOL_NAME
        mine = np.ones(1 << 17)
        checked.set()
        t.join(10)
    assert seen["start"] == (POOL_NAME if inherits else DEFAULT)
    assert seen["end"] == seen["start"]
    assert theirs.stats()["fresh"] == 1 and pool.stats()["fresh"] == 1
    # freed here, in the main thread: back into the worker's pool
    assert made[0].sum() == 1 << 17
    made.clear()
    assert theirs.cached_blocks == 1
    out = []
    t = threading.Thread(target=lambda: out.append(mine.sum()) or out.append(None))
    t.start()
    t.join(10)
    del mine, t
    gc.collect()
    assert pool.cached_blocks == 1


def test_threads_share_one_pool():
    """Four threads allocate, write, check and free through one pool at once."""
    pool = MemoryPool(8 << 20)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            with pool:
                for _ in range(150):
                    n = int(rng.integers(1, 300_000))
                    a = np.full(n, seed, np.int32)
                    b = np.zeros(int(rng.integers(1, 50_000)), np.int32)
                    if not (a == seed).all() or b.any():
                        errors.append(seed)
                    del a, b
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert pool.cached_bytes <= 8 << 20
    assert pool.stats()["reused"] > 0


def test_the_cap_bounds_what_is_cached():
    n = 1 << 20
    total = block_total(n)
    pool = MemoryPool(3 * total + 100)
    with pool:
        arrays = [np.empty(n, np.uint8) for _ in range(10)]
        del arrays
    assert pool.cached_blocks == 3
    assert pool.cached_bytes == 3 * total <= pool.max_cached_bytes
    none = MemoryPool(0)
    with none:
        for _ in range(3):
            np.ones(n)
    assert none.cached_bytes == 0 and none.stats()["reused"] == 0


def test_a_full_size_class_table_does_not_cache_more_sizes():
    """64 distinct block sizes are cached; a block of a 65th size is freed."""
    pool = MemoryPool()
    sizes = [4096 * k for k in range(1, 71)]  # 70 distinct block sizes
    with pool:
        arrays = [np.empty(s, np.uint8) for s in sizes]
        while arrays:  # freed smallest first (a list frees its items last first)
            arrays.pop(0)
        assert pool.cached_blocks == 64
        assert pool.cached_bytes == sum(block_total(s) for s in sizes[:64])
        again = [np.empty(s, np.uint8) for s in sizes]  # the 64 cached sizes come back
        assert pool.stats()["reused"] == 64
        del again


def test_release_empties_the_pool_and_it_stays_usable():
    pool = MemoryPool()
    with pool:
        for n in (5000, 1 << 16, 1 << 20):
            np.ones(n)
    assert pool.cached_blocks == 3 and pool.cached_bytes > 0
    pool.release()
    assert pool.cached_blocks == 0 and pool.cached_bytes == 0
    with pool:
        a = np.arange(1 << 16)
    assert a[-1] == (1 << 16) - 1
    pool.release()


FAULTS_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import fastadam

    def faults(loops):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(loops):
            a = np.ones(1 << 20)  # 8 MB
            b = a * 2
            del a, b
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults(2)
    outside = faults(20)
    with fastadam.MemoryPool():
        faults(2)  # the pool's first blocks
        inside = faults(20)
    print(outside, inside)
""")


@pytest.mark.skipif(platform.system() != "Linux", reason="counts glibc's mmap behaviour")
def test_a_pool_stops_the_page_faults_of_freed_8mb_arrays():
    """In a fresh process whose malloc returns every 8 MB block to the OS (glibc with a fixed
    mmap threshold, as a process that allocates many sizes ends up), a loop of 8 MB arrays
    faults every page in each time; inside a pool it faults almost none (counted, not timed)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    outside, inside = map(int, out.stdout.split())
    assert outside >= 20  # the baseline does fault: at least once per loop
    assert inside * 10 <= outside, (outside, inside)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_other_threads_use_the_pool():
    """A child forked while another thread allocates from the pool uses the pool (the lock is
    taken around fork, so the child never inherits it held)."""
    pool = MemoryPool()
    stop = threading.Event()

    def churn():
        with pool:
            while not stop.is_set():
                np.ones(1 << 14)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(5):
            pid = os.fork()
            if pid == 0:  # the child: no pytest, no exceptions escaping
                code = 1
                try:
                    with pool:
                        for n in (5000, 1 << 16, 1 << 20):
                            a = np.full(n, 7, np.uint8)
                            code = 0 if (a == 7).all() and not np.zeros(n).any() else 1
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    pytest.fail("the forked child hung (a lock held across fork?)")
                time.sleep(0.01)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        stop.set()
        t.join(10)


def test_copy_and_pickle_give_a_new_empty_pool():
    pool = MemoryPool(12345)
    with pool:
        np.ones(1 << 16)
    for twin in (copy.copy(pool), copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        assert twin is not pool
        assert twin.max_cached_bytes == 12345 and twin.cached_bytes == 0


@pytest.mark.parametrize("bad,error,match", [
    (-1, ValueError, "max_cached_bytes: expected 0 <= max_cached_bytes"),
    (2 ** 64, ValueError, "max_cached_bytes: expected 0 <= max_cached_bytes"),
    (1.5, TypeError, "max_cached_bytes: expected an int, got float"),
    ("1", TypeError, "max_cached_bytes: expected an int, got str"),
    (True, TypeError, "max_cached_bytes: expected an int, got bool"),
    (None, TypeError, "max_cached_bytes: expected an int, got NoneType"),
])
def test_bad_max_cached_bytes(bad, error, match):
    with pytest.raises(error, match=match):
        MemoryPool(bad)


def test_numpy_integer_cap_is_accepted():
    assert MemoryPool(np.int64(4096)).max_cached_bytes == 4096


# ---- TrainingSession --------------------------------------------------------------------------

onnx = pytest.importorskip("onnx")
import fastadam.onnx as fo  # noqa: E402
from test_onnx_session import mlp_model  # noqa: E402


def _train(memory_pool, steps=6):
    model, _ = mlp_model(hidden=300)  # activations of 4 KiB and more: pooled
    session = fo.TrainingSession(fo.make_training_model(model), memory_pool=memory_pool)
    rng = np.random.default_rng(5)
    losses = []
    for _ in range(steps):
        feeds = {"X": rng.standard_normal((64, 64)).astype(np.float32),
                 "labels": rng.integers(0, 10, 64).astype(np.int64)}
        losses.append(session.step(feeds)["fastadam.loss"])
    logits = session.run({"X": np.ones((5, 64), np.float32)})["logits"]
    return session, losses, logits


def test_session_trains_bit_for_bit_the_same_with_and_without_its_pool():
    pooled, losses, logits = _train(True)
    plain, plain_losses, plain_logits = _train(False)
    assert isinstance(pooled.memory_pool, MemoryPool) and plain.memory_pool is None
    assert pooled.memory_pool.stats()["reused"] > 0  # the steps did allocate from it
    assert get_handler_name(losses[-1]) == POOL_NAME
    assert get_handler_name(plain_losses[-1]) == DEFAULT
    np.testing.assert_array_equal(np.array(losses), np.array(plain_losses))
    np.testing.assert_array_equal(logits, plain_logits)
    for name, value in pooled.initializers.items():
        np.testing.assert_array_equal(value, plain.initializers[name], err_msg=name)
    assert get_handler_name() == DEFAULT


def test_session_takes_a_pool_of_your_own_and_copies_get_a_new_one():
    pool = MemoryPool(1 << 20)
    session, _, _ = _train(pool, steps=2)
    assert session.memory_pool is pool
    assert pool.stats()["fresh"] > 0
    twin = copy.deepcopy(session)
    assert isinstance(twin.memory_pool, MemoryPool) and twin.memory_pool is not pool
    assert twin.memory_pool.max_cached_bytes == 1 << 20
    X = np.ones((3, 64), np.float32)
    np.testing.assert_array_equal(twin.run({"X": X})["logits"], session.run({"X": X})["logits"])


def test_a_failing_step_restores_the_allocator():
    session, _, _ = _train(True, steps=1)
    with pytest.raises(ValueError):
        session.step({"X": np.ones((4, 63), np.float32), "labels": np.zeros(4, np.int64)})
    assert get_handler_name() == DEFAULT


def test_session_rejects_a_bad_memory_pool():
    model, _ = mlp_model()
    with pytest.raises(TypeError, match="memory_pool: expected True, False or a "
                                        "fastadam.MemoryPool, got str"):
        fo.TrainingSession(fo.make_training_model(model), memory_pool="yes")
