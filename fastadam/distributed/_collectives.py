"""Collectives for the sharded optimizer and embedding, on top of mpi4py.

MPI only moves bits here: every buffer travels as unsigned integers of its element size (so
float16 works and no MPI reduction operator ever touches a float).  The one reduction,
``reduce_scatter_in_rank_order``, receives the contributions with ``Alltoallv`` and adds them
with NumPy in rank order 0, 1, ..., N-1, so its result depends on nothing but the inputs.
It moves the same bytes per rank as a ring reduce-scatter, ``(N - 1)/N`` of the buffer in and
out, in rounds that keep its receive buffer near ``SCRATCH_BYTES``.

``agree_on_errors`` makes an input error seen by one rank an exception on every rank, so that no
rank is left waiting in a collective that the failing rank will never enter.
"""
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
