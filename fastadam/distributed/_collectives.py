"""Collectives for the sharded optimizer and embedding, on top of mpi4py.

MPI only moves bits here: every buffer travels as unsigned integers of its element size (so
float16 works and no MPI reduction operator ever touches a float).  The one reduction,
``reduce_scatter_in_rank_order``, receives the contributions with ``Alltoallv`` and adds them
with NumPy in rank order 0, 1, ..., N-1, so its result depends on nothing but the inputs.
It moves the same bytes per rank as a ring reduce-scatter, ``(N - 1)/N`` of the buffer in and
out, in rounds that keep its receive buffer near ``SCRATCH_BYTES``.

``agree_on_errors`` makes an input error seen by one rank an exception on every rank, so that no
rank is left waiting in a collective that the failing rank will never enter.

``CallSequence`` keeps the ranks of a communicator in step.  Every public method of the sharded
objects starts with ``enter``: one ``allgather`` (the one that already carries the input check
of ``step``, ``lookup`` and ``apply_gradients``) tells every rank which call every other rank
is making and how many it has made on that communicator.  A rank that skipped a call (it caught
an error of its own and went on), made one more (unequal numbers of steps) or called another
method is seen by all of them at once: every rank raises ``CollectiveMismatchError`` naming
the ranks and their calls, and the sequence is broken, so that later calls raise at once
without a collective.  A rank whose program ends while a peer still calls makes one last
``enter`` at exit (``atexit``), so the peer's call finds it instead of waiting for ever.
"""
import atexit
import sys

import numpy as np
from mpi4py import MPI

CACHE_LINE_BYTES = 64
SCRATCH_BYTES = 8 << 20     # receive buffer of the reduce-scatter, per dtype
_CARRIERS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def carrier(array):
    """``array`` (contiguous) viewed as unsigned integers of the same item size."""
    return array.reshape(-1).view(_CARRIERS[array.dtype.itemsize])


_ROW_TYPES = {}


def row_type(itemsize, row_size):
    """A committed MPI datatype of ``row_size`` elements of ``itemsize`` bytes, so that counts
    and displacements are in rows (a 1e8 x 64 table stays far below the 2**31 limit)."""
    key = (itemsize, row_size)
    if key not in _ROW_TYPES:
        base = MPI.Datatype.fromcode(np.dtype(_CARRIERS[itemsize]).char)
        _ROW_TYPES[key] = base.Create_contiguous(row_size).Commit()
    return _ROW_TYPES[key]


def slice_bounds(n, itemsize, size):
    """Split ``n`` elements into ``size`` slices balanced by bytes: every boundary but the last
    falls on a multiple of 64 bytes from the buffer start; slices differ by at most one cache
    line.  Returns the ``size + 1`` boundaries."""
    per_line = max(1, CACHE_LINE_BYTES // itemsize)
    lines = -(-n // per_line)
    bounds = [min(n, (lines * r // size) * per_line) for r in range(size + 1)]
    bounds[-1] = n
    return bounds


def counts_and_displacements(bounds, scale=1):
    counts = [(hi - lo) * scale for lo, hi in zip(bounds[:-1], bounds[1:])]
    return counts, [lo * scale for lo in bounds[:-1]]


def exclusive_offsets(counts):
    return [int(c) for c in np.concatenate(([0], np.cumsum(counts)[:-1]))]


def reduce_scatter_chunk(n_bounds, itemsize, size):
    """Elements per peer and round of ``reduce_scatter_in_rank_order``: the receive buffer,
    ``(size - 1) * chunk`` elements, stays near ``SCRATCH_BYTES`` whatever the buffer size."""
    per_line = max(1, CACHE_LINE_BYTES // itemsize)
    longest = max(hi - lo for lo, hi in zip(n_bounds[:-1], n_bounds[1:]))
    chunk = max(per_line, SCRATCH_BYTES // max(1, size - 1) // itemsize // per_line * per_line)
    return max(1, min(chunk, longest))


def reduce_scatter_in_rank_order(comm, send, bounds, scratch, out):
    """``out = send_0[s] + send_1[s] + ... + send_{N-1}[s]``, added left to right, where
    ``send_r`` is rank r's ``send`` and ``s = bounds[rank]:bounds[rank + 1]``.

    ``send``: 1-D, every rank the same length; ``out``: ``len(s)`` elements.  The slices travel
    in rounds of ``chunk = len(scratch) // (N - 1)`` elements per peer (``Alltoallv``), each
    added into ``out`` as it arrives, so ``scratch`` bounds the memory used.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    lo, hi = bounds[rank], bounds[rank + 1]
    if size == 1:
        np.copyto(out, send[lo:hi])
        return
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    chunk = len(scratch) // (size - 1)
    slot = [r if r < rank else r - 1 for r in range(size)]
    for start in range(0, max(lengths), chunk):
        send_counts = [max(0, min(chunk, length - start)) for length in lengths]
        send_displs = [a + min(start, length) for a, length in zip(bounds[:-1], lengths)]
        send_counts[rank] = 0                   # our own contribution stays here
        k = max(0, min(chunk, lengths[rank] - start))
        recv_counts = [0 if r == rank else k for r in range(size)]
        recv_displs = [slot[r] * k for r in range(size)]
        comm.Alltoallv([carrier(send), (send_counts, send_displs)],
                       [carrier(scratch), (recv_counts, recv_displs)])
        if k == 0:
            continue
        parts = [send[lo + start:lo + start + k] if r == rank else
                 scratch[slot[r] * k:(slot[r] + 1) * k] for r in range(size)]
        target = out[start:start + k]
        np.add(parts[0], parts[1], out=target)
        for part in parts[2:]:
            np.add(target, part, out=target)


def allgather_in_place(comm, flat, bounds):
    """Every rank's slice ``flat[bounds[r]:bounds[r + 1]]`` copied to every rank."""
    if comm.Get_size() > 1:
        counts, displs = counts_and_displacements(bounds)
        comm.Allgatherv(MPI.IN_PLACE, [carrier(flat), (counts, displs)])


def gather_slices(comm, local, bounds, full, root):
    """``full`` (on ``root``, length ``bounds[-1]``) receives every rank's ``local`` slice."""
    counts, displs = counts_and_displacements(bounds)
    recv = [carrier(full), (counts, displs)] if comm.Get_rank() == root else None
    comm.Gatherv(carrier(local), recv, root=root)


def scatter_slices(comm, full, bounds, local, root):
    """Each rank's ``local`` receives its slice of ``full`` (read on ``root`` only)."""
    counts, displs = counts_and_displacements(bounds)
    send = [carrier(full), (counts, displs)] if comm.Get_rank() == root else None
    comm.Scatterv(send, carrier(local), root=root)


def alltoallv(comm, send, send_counts, recv_counts):
    """Send ``send_counts[r]`` consecutive rows (along axis 0) of ``send`` to rank r; returns
    the rows received, in rank order (``recv_counts`` from each)."""
    recv = np.empty((int(sum(recv_counts)),) + send.shape[1:], dtype=send.dtype)
    rows = row_type(send.dtype.itemsize, int(np.prod(send.shape[1:], dtype=np.int64)))
    sc = [int(c) for c in send_counts]
    rc = [int(c) for c in recv_counts]
    comm.Alltoallv([carrier(np.ascontiguousarray(send)), (sc, exclusive_offsets(sc)), rows],
                   [carrier(recv), (rc, exclusive_offsets(rc)), rows])
    return recv


def agree_on_errors(comm, check):
    """Run ``check()`` on every rank; if it raised TypeError, ValueError or IndexError on any
    rank, raise on every rank (the local error where there is one) before any rank goes on
    to a collective.  Returns ``check()``'s value."""
    error, value = None, None
    try:
        value = check()
    except (TypeError, ValueError, IndexError) as exc:
        error = exc
    messages = comm.allgather(None if error is None else (type(error).__name__, str(error)))
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message is not None:
            kind = {"TypeError": TypeError, "IndexError": IndexError}.get(message[0], ValueError)
            raise kind(f"rank {rank}: {message[1]}")
    return value


def on_root(comm, root, action):
    """``action()`` on ``root`` only; an exception there is raised on every rank.  Returns its
    value on ``root`` and None elsewhere."""
    error, value = None, None
    if comm.Get_rank() == root:
        try:
            value = action()
        except Exception as exc:  # re-raised below, on every rank
            error = exc
    message = comm.bcast(None if error is None else (type(error).__name__, str(error)), root=root)
    if error is not None:
        raise error
    if message is not None:
        kind = {"TypeError": TypeError, "IndexError": IndexError,
                "FileNotFoundError": FileNotFoundError}.get(message[0], ValueError)
        raise kind(f"rank {root}: {message[1]}")
    return value


# -- keeping the ranks in step -----------------------------------------------------------------
class CollectiveMismatchError(RuntimeError):
    """The ranks of a communicator are not making the same fastadam.distributed call: a rank
    skipped a call, made one more, or called another method.  Raised on every rank at once;
    the communicator's fastadam.distributed calls raise it from then on."""

    __module__ = "fastadam.distributed"


_KEYVAL = []        # the MPI attribute key under which a communicator keeps its CallSequence
_AT_EXIT = []       # sequences of communicators of 2 or more ranks, for the call at exit


class CallSequence:
    """The fastadam.distributed calls made on one communicator, counted on every rank (kept as
    an MPI attribute of the communicator: every object built on it shares one count)."""

    def __init__(self, comm):
        self.comm, self.calls, self.objects, self.broken = comm, 0, 0, None
        self.freed = False

    def label(self, kind):
        """A name for the next object built on this communicator (``ShardedOptimizer #0``);
        the ranks build them in the same order, so the names agree."""
        self.objects += 1
        return f"{kind} #{self.objects - 1}"

    def enter(self, obj, method, steps=None, check=None):
        """Begin the collective call ``obj.method`` (``steps``: the object's step count, for
        the message) on every rank: one allgather of (call count, call, ``check()``'s error).
        CollectiveMismatchError on every rank if the ranks' calls differ; else, as
        ``agree_on_errors``, the local input error or another rank's, on every rank.
        Returns ``check()``'s value."""
        if self.broken is not None:
            raise CollectiveMismatchError(f"{obj}.{method}: not started, the ranks are out "
                                          f"of step since an earlier call: {self.broken}")
        error, value = None, None
        if check is not None:
            try:
                value = check()
            except (TypeError, ValueError, IndexError) as exc:
                error = exc
        self.calls += 1
        entries = self.comm.allgather((self.calls, obj, method, steps, None if error is None else
                                       (type(error).__name__, str(error))))
        first = entries[0][:3]
        for entry in entries[1:]:
            if entry[:3] != first:
                self.broken = mismatch_message(entries)
                raise CollectiveMismatchError(self.broken)
        if error is not None:
            raise error
        for rank, entry in enumerate(entries):
            if entry[4] is not None:
                kind = {"TypeError": TypeError, "IndexError": IndexError}.get(entry[4][0],
                                                                             ValueError)
                raise kind(f"rank {rank}: {entry[4][1]}")
        return value


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def mismatch_message(entries):
    """What each group of ranks was calling, from the gathered (count, object, method, step)."""
    groups = {}
    for rank, (calls, obj, method, steps, _) in enumerate(entries):
        what = ("the end of the program" if obj is None else
                f"{obj}.{method}" + ("" if steps is None else f" after {steps} steps"))
        groups.setdefault((what, calls), []).append(rank)
    parts = [f"{_ranks(ranks)} reached {what} as {'its' if len(ranks) == 1 else 'their'} "
             f"call {calls}" for (what, calls), ranks in groups.items()]
    return ("the ranks are out of step: " + "; ".join(parts) + ".  Every rank must make the "
            "same fastadam.distributed calls in the same order: a rank skipped a call (an error "
            "caught on that rank only?) or made one more (unequal numbers of steps?)")


def _freed(comm, keyval, sequence):
    """MPI deletes the attribute when the communicator is freed: no call at exit on it."""
    sequence.freed = True


def call_sequence(comm):
    """The CallSequence of ``comm`` (made on first use)."""
    if not _KEYVAL:
        _KEYVAL.append(MPI.Comm.Create_keyval(delete_fn=_freed))
    sequence = comm.Get_attr(_KEYVAL[0])
    if sequence is None:
        sequence = CallSequence(comm)
        comm.Set_attr(_KEYVAL[0], sequence)
        if comm.Get_size() > 1:
            _AT_EXIT.append(sequence)
    return sequence


def _enter_at_exit():
    """A rank's program ends: meet, on each communicator still in use, whatever call the other
    ranks make.  If one of them is still calling (a step more than this rank made), both see
    the mismatch: the peer raises, and this rank reports it and aborts the job (if
    ``abort_on_error`` is installed) instead of leaving the peer waiting."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for sequence in _AT_EXIT:
        if sequence.broken is not None or sequence.freed:
            continue
        try:
            sequence.enter(None, None)
        except CollectiveMismatchError as exc:
            rank = MPI.COMM_WORLD.Get_rank()
            sys.stderr.write(f"fastadam.distributed: rank {rank} at exit: "
                             f"CollectiveMismatchError: {exc}\n")
            sys.stderr.flush()
            if getattr(sys.excepthook, "fastadam_abort_on_error", False):
                MPI.COMM_WORLD.Abort(1)
        except MPI.Exception:  # the communicator was freed through another handle
            continue


atexit.register(_enter_at_exit)
