"""Scenarios run under MPI by tests/test_distributed.py:

    mpiexec -n N python -m mpi4py tests/mpi_scenarios.py NAME [NAME ...] [--dir DIR]

Every rank computes the single-process reference itself (the same seeded data) and compares;
a failed check raises, and ``python -m mpi4py`` turns an uncaught exception into MPI_Abort, so
the job ends with the error instead of hanging.  Each scenario prints one ``ok`` line per rank.
The data generators need no MPI, so the pytest side can rebuild the references.
"""
import os
import sys

import numpy as np

import fastadam

SHAPES = [(1000,), (3, 7), (50,), (0,), (1,), (300_001,)]
# fastadam.Adam takes parameters of one dtype: the variants cover float32 and float64
ADAM_VARIANTS = [dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, convention="torch"),
                 dict(lr=3e-3, betas=(0.8, 0.999), eps=1e-6, convention="tf", weight_decay=0.1,
                      decoupled_weight_decay=True, amsgrad=True)]
VARIANT_DTYPES = [np.float32, np.float64]
NUM_ROWS, DIM = 37, 5


def initial_params(dtype=np.float32):
    rng = np.random.default_rng(1234)
    return [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]


def rank_grads(step, rank, dtype=np.float32):
    """Rank ``rank``'s gradients at step ``step`` (1-based)."""
    rng = np.random.default_rng([step, rank, 7])
    return [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]


def mean_in_rank_order(step, size, dtype=np.float32):
    """(g_0 + g_1 + ... + g_{N-1}) / N, added left to right, in the parameters' dtype."""
    per_rank = [rank_grads(step, r, dtype) for r in range(size)]
    means = []
    for i in range(len(SHAPES)):
        total = per_rank[0][i].copy()
        for r in range(1, size):
            total = total + per_rank[r][i]
        means.append(total / total.dtype.type(size) if size > 1 else total)
    return means


def reference_adam(k, steps, size):
    dtype = VARIANT_DTYPES[k]
    opt = fastadam.Adam(initial_params(dtype), **ADAM_VARIANTS[k])
    for step in range(1, steps + 1):
        opt.step(mean_in_rank_order(step, size, dtype))
    return opt


def embedding_init(rows):
    rows = np.asarray(rows, np.float64)[:, None]
    return np.sin(rows * DIM + np.arange(DIM)) .astype(np.float32)


def embedding_batch(step, rank):
    """Ids with duplicates and two ids (0, 1) hot on every rank; rank 1 sends nothing at step 2."""
    rng = np.random.default_rng([step, rank, 11])
    if rank == 1 and step == 2:
        return np.zeros(0, np.int64), np.zeros((0, DIM), np.float32)
    ids = np.concatenate([[0, 1, 0], rng.integers(0, NUM_ROWS, 17)]).astype(np.int64)
    return ids, rng.standard_normal((len(ids), DIM)).astype(np.float32)


def assert_bitwise_equal(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{what}: {actual.dtype}{actual.shape} vs {expected.dtype}{expected.shape}")
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    diff = np.flatnonzero(actual.reshape(-1).view(unsigned) != expected.reshape(-1).view(unsigned))
    assert diff.size == 0, (f"{what}: {diff.size} elements differ, first at {diff[0]}: "
                            f"{actual.reshape(-1)[diff[0]]!r} vs {expected.reshape(-1)[diff[0]]!r}")


def assert_states_equal(actual, expected, what):  # fastadam.Adam's state_dict format
    for name in ("m", "v", "v_max"):
        if name in expected:
            for i, (a, b) in enumerate(zip(actual[name], expected[name])):
                assert_bitwise_equal(a, b, f"{what} {name}[{i}]")
    assert actual["t"] == expected["t"], f"{what} t: {actual['t']} vs {expected['t']}"


# -- scenarios ---------------------------------------------------------------------------------
def scenario_dense_exact(comm, workdir):
    from fastadam.distributed import ShardedOptimizer, _collectives
    size, rank = comm.Get_size(), comm.Get_rank()
    steps = 4
    for k, (variant, dtype) in enumerate(zip(ADAM_VARIANTS, VARIANT_DTYPES)):
        params = initial_params(dtype)
        default_scratch = _collectives.SCRATCH_BYTES
        if k == 1:      # the reduce-scatter in many rounds of 16 KiB
            _collectives.SCRATCH_BYTES = 1 << 14
        sharded = ShardedOptimizer(fastadam.Adam(params, **variant), comm)
        _collectives.SCRATCH_BYTES = default_scratch
        assert size == 1 or (k == 1) == (sharded._groups[0].scratch.nbytes <= 1 << 14)
        for step in range(1, steps + 1):
            assert sharded.step(rank_grads(step, rank, dtype)) is True
        reference = reference_adam(k, steps, size)
        for i, (p, q) in enumerate(zip(sharded.params, reference.params)):
            assert p is params[i], "the caller's parameter arrays must be updated in place"
            assert_bitwise_equal(p, q, f"{variant['convention']} param {i}")
        state = sharded.state_dict()
        if rank == 0:
            assert_states_equal(state, reference.state_dict(), "state_dict")
        else:
            assert state is None
        # 1/N of the state: each rank holds the moments of its slice only
        local = sum(a.nbytes for g in sharded._groups for a in g.inner.m + g.inner.v)
        total = sum(a.nbytes for a in reference.m + reference.v)
        assert local <= total / size + 2 * 64 * 2 * len(sharded._groups), (local, total, size)
    # a wrapped optimizer that already stepped hands its state over
    stepped = fastadam.Adam(initial_params(np.float64), **ADAM_VARIANTS[1])
    stepped.step(mean_in_rank_order(1, size, np.float64))
    sharded = ShardedOptimizer(stepped, comm)
    del stepped
    sharded.step(rank_grads(2, rank, np.float64))
    reference = reference_adam(1, 2, size)
    for i, (p, q) in enumerate(zip(sharded.params, reference.params)):
        assert_bitwise_equal(p, q, f"resumed param {i}")
    assert sharded.t == 2


class PlainMomentum:
    """The smallest optimizer object ShardedOptimizer can wrap (params, t, defaults, step,
    state_dict, load_state_dict), here over parameters of mixed dtypes: v = mu v + g,
    x -= lr v; its state nests the moments one level down."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        self.params, self.t = list(params), 0
        self.defaults = dict(lr=lr, momentum=momentum)
        self.v = [np.zeros_like(p) for p in self.params]

    def step(self, grads):
        for p, g, v in zip(self.params, grads, self.v):
            v *= p.dtype.type(self.defaults["momentum"])
            v += g
            p -= p.dtype.type(self.defaults["lr"]) * v
        self.t += 1

    def state_dict(self):
        return {"t": self.t, "state": {"v": [a.copy() for a in self.v]}}

    def load_state_dict(self, state):
        for a, b in zip(self.v, state["state"]["v"]):
            np.copyto(a, b)
        self.t = state["t"]


MIXED = [((100,), np.float32), ((33,), np.float64), ((70,), np.float16), ((5, 5), np.float32),
         ((1,), np.float16)]


def _mixed(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in MIXED]


def scenario_generic_optimizer(comm, workdir):
    """Mixed dtypes (one reduce-scatter and all-gather per dtype, float16 included), nested
    state, parameters assigned between steps."""
    from fastadam.distributed import ShardedOptimizer
    size, rank = comm.Get_size(), comm.Get_rank()
    sharded = ShardedOptimizer(PlainMomentum(_mixed(5), lr=0.05), comm)
    reference = PlainMomentum(_mixed(5), lr=0.05)
    assert len(sharded._groups) == 3
    for step in range(1, 4):
        if step == 3:
            sharded.params[3][...] = 1.5
            reference.params[3][...] = 1.5
        sharded.step(_mixed([step, rank]))
        per_rank = [_mixed([step, r]) for r in range(size)]
        means = []
        for i in range(len(MIXED)):
            total = per_rank[0][i].copy()
            for r in range(1, size):
                total = total + per_rank[r][i]
            means.append(total / total.dtype.type(size))
        reference.step(means)
    for i, (p, q) in enumerate(zip(sharded.params, reference.params)):
        assert_bitwise_equal(p, q, f"mixed param {i}")
    state = sharded.state_dict()
    if rank == 0:
        assert state["t"] == 3
        for i, (a, b) in enumerate(zip(state["state"]["v"], reference.v)):
            assert_bitwise_equal(a, b, f"mixed state v[{i}]")
    fresh = ShardedOptimizer(PlainMomentum([np.zeros(s, d) for s, d in MIXED]), comm)
    fresh.load_state_dict(state)
    again = fresh.state_dict()
    if rank == 0:
        for i, (a, b) in enumerate(zip(again["state"]["v"], reference.v)):
            assert_bitwise_equal(a, b, f"reloaded state v[{i}]")
    assert fresh.t == 3


def scenario_skip_nonfinite(comm, workdir):
    from fastadam.distributed import ShardedOptimizer
    rank = comm.Get_rank()
    sharded = ShardedOptimizer(fastadam.Adam(initial_params(), **ADAM_VARIANTS[0]), comm)
    grads = rank_grads(1, rank)
    if rank == comm.Get_size() - 1:
        grads[0][3] = np.nan          # only the last rank sees it, in the first rank's slice
    before = [p.copy() for p in sharded.params]
    assert sharded.step(grads, skip_nonfinite=True) is False
    for i, (p, q) in enumerate(zip(sharded.params, before)):
        assert_bitwise_equal(p, q, f"skipped step changed param {i}")
    assert sharded.t == 0


def scenario_errors(comm, workdir):
    from fastadam.distributed import ShardedEmbedding, ShardedOptimizer
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    sharded = ShardedOptimizer(fastadam.Adam(initial_params(), **ADAM_VARIANTS[0]), comm)
    grads = rank_grads(1, rank)
    if rank == last:
        grads[1] = grads[1].reshape(7, 3)
    try:
        sharded.step(grads)
    except ValueError as exc:
        expected = "grads[1]: expected float32 of shape (3, 7)"
        assert expected in str(exc) and (rank == last or f"rank {last}" in str(exc)), str(exc)
    else:
        raise AssertionError("a bad gradient on one rank must raise on every rank")
    assert sharded.step(rank_grads(1, rank)) is True       # the ranks are still in step
    table = ShardedEmbedding(NUM_ROWS, DIM, comm, lr=0.1, convention="torch")
    ids = np.array([3, NUM_ROWS if rank == last else 4])
    try:
        table.lookup(ids)
    except IndexError as exc:
        assert f"id {NUM_ROWS} is out of range for {NUM_ROWS} rows" in str(exc), str(exc)
    else:
        raise AssertionError("an out-of-range id on one rank must raise on every rank")
    assert table.lookup(np.array([3, 4])).shape == (2, DIM)


def _checkpoint_roundtrip(comm, sub, path_world, path_sub, k):
    from fastadam.distributed import ShardedOptimizer
    size, variant, dtype = comm.Get_size(), ADAM_VARIANTS[k], VARIANT_DTYPES[k]
    world = ShardedOptimizer(fastadam.Adam(initial_params(dtype), **variant), comm)
    for step in range(1, 4):
        world.step(rank_grads(step, comm.Get_rank(), dtype))
    world.save(path_world)
    expected = reference_adam(k, 3, size)
    # a different number of ranks loads it and gets the same parameters and state
    other = ShardedOptimizer(fastadam.Adam([np.zeros(s, dtype) for s in SHAPES], **variant), sub)
    other.load(path_world)
    for i, (p, q) in enumerate(zip(other.params, expected.params)):
        assert_bitwise_equal(p, q, f"params loaded by {sub.Get_size()} of {size} ranks [{i}]")
    state = other.state_dict()
    if sub.Get_rank() == 0:
        assert_states_equal(state, expected.state_dict(), "state loaded with another rank count")
    # it continues exactly like the unsharded optimizer would
    other.step(rank_grads(4, sub.Get_rank(), dtype))
    expected_sub = reference_adam(k, 3, size)
    expected_sub.step(mean_in_rank_order(4, sub.Get_size(), dtype))
    for i, (p, q) in enumerate(zip(other.params, expected_sub.params)):
        assert_bitwise_equal(p, q, f"step after load [{i}]")
    # and the other way round: the smaller communicator saves, the world loads
    other.save(path_sub)
    comm.Barrier()
    world.load(path_sub)
    assert world.t == 4
    for i, (p, q) in enumerate(zip(world.params, expected_sub.params)):
        assert_bitwise_equal(p, q, f"world loads the sub-communicator's checkpoint [{i}]")


def scenario_checkpoint(comm, workdir):
    size, rank = comm.Get_size(), comm.Get_rank()
    half = max(1, size // 2)
    sub = comm.Split(color=rank // half, key=rank)
    color = rank // half
    for k in range(len(ADAM_VARIANTS)):
        path_world = os.path.join(workdir, f"world_{size}_{k}.npz")
        path_sub = os.path.join(workdir, f"sub_{size}_{color}_{k}.npz")
        _checkpoint_roundtrip(comm, sub, path_world, path_sub, k)
    sub.Free()


def _embedding_scenario(comm, optimizer, mode, step_function, hyper, state_names):
    from fastadam.distributed import ShardedEmbedding
    size, rank = comm.Get_size(), comm.Get_rank()
    table = ShardedEmbedding(NUM_ROWS, DIM, comm, optimizer=optimizer, mode=mode,
                             init=embedding_init, **hyper)
    weight = embedding_init(np.arange(NUM_ROWS))
    state = {name: np.zeros_like(weight) for name in state_names}
    last_step = np.zeros(NUM_ROWS, np.int64)
    for step in range(1, 6):
        ids, grad_rows = embedding_batch(step, rank)
        assert_bitwise_equal(table.lookup(ids.reshape(-1, 1)), weight[ids].reshape(-1, 1, DIM),
                             f"lookup at step {step}")
        grad = (fastadam.IndexedSlices(grad_rows, ids, (NUM_ROWS, DIM)) if step % 2
                else (ids, grad_rows))
        table.apply_gradients(grad)
        # reference: one table, each rank's duplicates added in batch order (np.add.at), the
        # ranks' sums concatenated in rank order, one sparse step
        all_ids, all_rows = [], []
        for r in range(size):
            r_ids, r_rows = embedding_batch(step, r)
            unique = np.unique(r_ids)
            sums = np.zeros((len(unique), DIM), np.float32)
            np.add.at(sums, np.searchsorted(unique, r_ids), r_rows)
            all_ids.append(unique)
            all_rows.append(sums)
        extra = {"mode": mode, "last_step": last_step} if mode == "catchup" else {"mode": mode}
        step_function(weight, (np.concatenate(all_ids), np.concatenate(all_rows)),
                      *state.values(), step, **extra, **hyper)
    gathered = table.state_dict()
    if rank == 0:
        assert gathered["t"] == 5
        assert_bitwise_equal(gathered["weight"], weight, f"{optimizer}/{mode} table")
        for name, array in state.items():
            assert_bitwise_equal(gathered[name], array, f"{optimizer}/{mode} {name}")
        if mode == "catchup":
            assert np.array_equal(gathered["last_step"], last_step)
    assert np.array_equal(table.rows, np.arange(rank, NUM_ROWS, size))
    # another number of ranks loads the state and carries on like the one table
    gathered = comm.bcast(gathered, root=0)
    sub = comm.Split(color=rank // max(1, size // 2), key=rank)
    resumed = ShardedEmbedding(NUM_ROWS, DIM, sub, optimizer=optimizer, mode=mode, **hyper)
    resumed.load_state_dict(gathered if sub.Get_rank() == 0 else None)
    ids = np.arange(NUM_ROWS)
    assert_bitwise_equal(resumed.lookup(ids), weight, f"{optimizer}/{mode} resumed table")
    ids, grad_rows = embedding_batch(6, 0)
    resumed.apply_gradients((ids, grad_rows) if sub.Get_rank() == 0 else
                            (ids[:0], grad_rows[:0]))
    unique = np.unique(ids)
    sums = np.zeros((len(unique), DIM), np.float32)
    np.add.at(sums, np.searchsorted(unique, ids), grad_rows)
    extra = {"mode": mode, "last_step": last_step} if mode == "catchup" else {"mode": mode}
    step_function(weight, (unique, sums), *state.values(), 6, **extra, **hyper)
    after = resumed.state_dict()
    if sub.Get_rank() == 0:
        assert after["t"] == 6
        assert_bitwise_equal(after["weight"], weight, f"{optimizer}/{mode} step after load")
        for name, array in state.items():
            assert_bitwise_equal(after[name], array, f"{optimizer}/{mode} {name} after load")
    sub.Free()


def scenario_embedding_adam(comm, workdir):
    hyper = dict(lr=0.05, beta1=0.9, beta2=0.99, eps=1e-7, convention="torch", weight_decay=0.01)
    for mode in ("lazy", "catchup"):
        _embedding_scenario(comm, "adam", mode, fastadam.sparse_step_inplace, hyper, ("m", "v"))


def scenario_embedding_adagrad(comm, workdir):
    hyper = dict(lr=0.05, eps=1e-10, convention="torch")
    for mode in ("lazy", "catchup"):
        _embedding_scenario(comm, "adagrad", mode, fastadam.sparse_adagrad_step_inplace, hyper,
                            ("h",))


def scenario_abort(comm, workdir):
    """The last rank raises while the others wait in a collective: the job must end."""
    if comm.Get_rank() == comm.Get_size() - 1:
        raise RuntimeError("deliberate failure on the last rank")
    comm.Barrier()


def scenario_abort_plain(comm, workdir):
    """Under plain ``python`` (no ``-m mpi4py``): the last rank raises after building a
    ShardedOptimizer while the others wait in a collective; its excepthook must abort the job."""
    from fastadam.distributed import ShardedOptimizer
    ShardedOptimizer(fastadam.Adam([np.zeros(4, np.float32)]), comm)
    comm.Barrier()
    if comm.Get_rank() == comm.Get_size() - 1:
        raise RuntimeError("deliberate failure on the last rank")
    comm.Barrier()


def _calls(actions):
    """Run each (label, action) in turn as a training loop that catches RuntimeError and goes
    on (the pattern that lets a rank skip a step); returns {label: exception or None}."""
    outcome = {}
    for label, action in actions:
        try:
            action()
            outcome[label] = None
        except RuntimeError as exc:
            outcome[label] = exc
    return outcome


def _assert_out_of_step(outcome, first, later, expected):
    """``outcome[first]`` is the CollectiveMismatchError that every rank raised together, its
    message naming each rank's call (``expected``: substrings); every call in ``later`` raised
    at once, without a collective."""
    from fastadam.distributed import CollectiveMismatchError
    exc = outcome[first]
    assert isinstance(exc, CollectiveMismatchError), (first, outcome)
    message = str(exc)
    assert message.startswith("the ranks are out of step: "), message
    for part in expected:
        assert part in message, (part, message)
    for label in later:
        assert isinstance(outcome[label], CollectiveMismatchError), (label, outcome)
        assert "not started, the ranks are out of step since an earlier call" in str(
            outcome[label]), str(outcome[label])
    print(f"rank {MPI_RANK[0]}: {type(exc).__name__}: {message}", flush=True)


MPI_RANK = [0]


def _others(last):
    """How the message names the ranks before ``last``: "rank 0 reached", "ranks 0, 1, 2
    reached"."""
    return ("rank 0" if last == 1 else "ranks " + ", ".join(map(str, range(last)))) + " reached"


def _their(last):
    return "its" if last == 1 else "their"


def scenario_skipped_step(comm, workdir):
    """The last rank catches an error of its own at step 2 and skips that step; the loop goes
    on and every rank then calls state_dict.  The ranks' calls pair up until the last rank's
    state_dict meets the others' step 4: every rank raises there, naming both, and every later
    call raises without a collective (no hang, whatever the loop catches)."""
    from fastadam.distributed import ShardedOptimizer
    own = comm.Dup()        # the out-of-step communicator is this one, not the world
    rank, last = own.Get_rank(), own.Get_size() - 1
    MPI_RANK[0] = rank
    sharded = ShardedOptimizer(fastadam.Adam(initial_params(), **ADAM_VARIANTS[0]), own)

    def step(k):
        def run():
            if rank == last and k == 2:
                raise RuntimeError("deliberate: no batch for step 2 on the last rank")
            sharded.step(rank_grads(k, rank))
        return run

    outcome = _calls([(f"step {k}", step(k)) for k in range(1, 5)]
                     + [("state_dict", sharded.state_dict), ("step 5", step(5)),
                        ("save", lambda: sharded.save(os.path.join(workdir, "never.npz")))])
    assert outcome["step 1"] is None
    expected = [f"rank {last} reached ShardedOptimizer #0.state_dict after 3 steps as its "
                f"call 5", _others(last) + " ShardedOptimizer #0.step after 3 steps as "
                + _their(last) + " call 5", "a rank skipped a call"]
    if rank == last:
        assert "deliberate" in str(outcome["step 2"])
        assert outcome["step 3"] is None and outcome["step 4"] is None
        _assert_out_of_step(outcome, "state_dict", ["step 5", "save"], expected)
    else:
        assert outcome["step 2"] is None and outcome["step 3"] is None
        _assert_out_of_step(outcome, "step 4", ["state_dict", "step 5", "save"], expected)
    assert sharded.t == 3
    assert not os.path.exists(os.path.join(workdir, "never.npz"))
    own.Free()


def scenario_mismatched_methods(comm, workdir):
    """Unequal numbers of steps on a sharded embedding: the last rank applies one gradient
    more while the others look rows up: every rank raises at that call, naming both."""
    from fastadam.distributed import ShardedEmbedding
    own = comm.Dup()
    rank, last = own.Get_rank(), own.Get_size() - 1
    MPI_RANK[0] = rank
    table = ShardedEmbedding(NUM_ROWS, DIM, own, lr=0.1, convention="torch")
    steps = 3 if rank == last else 2
    actions = [(f"apply {k}", lambda k=k: table.apply_gradients(embedding_batch(k, rank)))
               for k in range(1, steps + 1)]
    outcome = _calls(actions + [("lookup", lambda: table.lookup(np.array([1, 2]))),
                                ("state_dict", table.state_dict)])
    expected = [f"rank {last} reached ShardedEmbedding #0.apply_gradients after 2 steps as "
                f"its call 4", _others(last) + " ShardedEmbedding #0.lookup after 2 steps as "
                + _their(last) + " call 4"]
    first = "apply 3" if rank == last else "lookup"
    later = ["lookup", "state_dict"] if rank == last else ["state_dict"]
    _assert_out_of_step(outcome, first, later, expected)
    assert table.t == 2
    own.Free()


def scenario_unequal_steps(comm, workdir):
    """The last rank makes one step more than the others, which end their program: its step
    meets their exit (no hang): it raises and the job aborts."""
    from fastadam.distributed import ShardedOptimizer
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    sharded = ShardedOptimizer(fastadam.Adam(initial_params(), **ADAM_VARIANTS[0]), comm)
    for k in range(1, 4 if rank == last else 3):
        sharded.step(rank_grads(k, rank))
    print(f"rank {rank} done after {sharded.t} steps", flush=True)


def scenario_skipped_step_at_exit(comm, workdir):
    """The last rank catches an error of its own and skips step 2, then ends its program; the
    others' step 3 meets its exit (no hang): they raise and the job aborts."""
    from fastadam.distributed import ShardedOptimizer
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    sharded = ShardedOptimizer(fastadam.Adam(initial_params(), **ADAM_VARIANTS[0]), comm)
    for k in range(1, 4):
        try:
            if rank == last and k == 2:
                raise ValueError("deliberate: no batch for step 2 on the last rank")
        except ValueError:
            continue
        sharded.step(rank_grads(k, rank))
    print(f"rank {rank} done after {sharded.t} steps", flush=True)


def main(argv):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    workdir = "."
    if "--dir" in argv:
        at = argv.index("--dir")
        workdir = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    for name in argv:
        globals()[f"scenario_{name}"](comm, workdir)
        if name in ENDS_OUT_OF_STEP:
            continue    # a Barrier here would meet the peer's step: the job must end by itself
        comm.Barrier()
        print(f"scenario {name} ok on rank {comm.Get_rank()} of {comm.Get_size()}", flush=True)


# scenarios that leave the ranks out of step on the world communicator when they return
ENDS_OUT_OF_STEP = ("unequal_steps", "skipped_step_at_exit")


if __name__ == "__main__":
    main(sys.argv[1:])
