"""``ShardedEmbedding``: an embedding table whose rows, and their optimizer state, are spread
over the ranks of a communicator.

Rows are dealt cyclically: global row ``i`` lives on rank ``i % N`` as local row ``i // N``.
Ids drawn from a frequency-sorted vocabulary (the hot ids are the small ones) thus spread over
all ranks instead of landing on the first.

- ``lookup(ids)``: each rank asks for the distinct ids of its batch only; ids are grouped by
  owner, counts exchanged with ``Alltoall``, ids and then rows with ``Alltoallv``.
- ``apply_gradients(grad)``: the sender first adds the rows of duplicate ids
  (``fastadam.segment_sum``, batch order), sends each owner the sums for its rows, and the owner
  applies the sparse step (``sparse_step_inplace`` or ``sparse_adagrad_step_inplace``) to the
  rows received, which adds what several ranks sent for one row in rank order.  The table thus
  equals, bit for bit, one unsharded table stepped with the concatenation, in rank order, of the
  ranks' per-rank sums.  Gradients of all ranks are summed, not averaged.
"""
import numpy as np
from mpi4py import MPI

import fastadam

from ._abort import abort_on_error as install_abort_hook

from ._collectives import alltoallv, call_sequence, carrier, exclusive_offsets, on_root, row_type

_OPTIMIZERS = ("adam", "adagrad")


def _step_function(optimizer):
    if optimizer == "adam":
        return fastadam.sparse_step_inplace
    if not hasattr(fastadam, "sparse_adagrad_step_inplace"):
        raise ValueError("optimizer: 'adagrad' needs fastadam.sparse_adagrad_step_inplace, "
                         "which this fastadam does not have")
    return fastadam.sparse_adagrad_step_inplace


class ShardedEmbedding:
    """An embedding table of ``num_rows x dim`` rows sharded over ``comm``, trained in place by
    a sparse Adam or Adagrad step.

    Parameters
    ----------
    num_rows, dim : int
        Global table shape.
    comm : mpi4py.MPI.Comm
        Every method is collective: all ranks call it, in the same order.
    optimizer : {"adam", "adagrad"}
    mode : {"lazy", "catchup"}
        As in :func:`fastadam.sparse_step_inplace`; ``"catchup"`` keeps a ``last_step`` per row.
    dtype : float32 or float64
    init : callable, optional
        ``init(rows)`` returns the initial values (shape ``(len(rows), dim)``) of the global
        rows ``rows`` (int64); called once with this rank's rows, so the table does not depend
        on the number of ranks.  Default: zeros.
    abort_on_error : bool, default True
        Install :func:`fastadam.distributed.abort_on_error`: an uncaught exception on any rank
        aborts the whole job instead of leaving the other ranks waiting in a collective.
    **hyperparameters
        Passed to the sparse step (``lr``, ``beta1``, ``convention``, ...); checked here.

    Attributes
    ----------
    weight : ndarray, shape (local_rows, dim)
        This rank's rows: global rows ``rank, rank + N, rank + 2N, ...``.
    t : int
        Steps applied so far.
    """

    def __init__(self, num_rows, dim, comm, optimizer="adam", mode="lazy", *, dtype=np.float32,
                 init=None, abort_on_error=True, **hyperparameters):
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm: expected an mpi4py.MPI.Comm, got {type(comm).__name__}")
        if not isinstance(abort_on_error, bool):
            raise TypeError(f"abort_on_error: expected a bool, got "
                            f"{type(abort_on_error).__name__}")
        if abort_on_error:
            install_abort_hook()
        for name, value in (("num_rows", num_rows), ("dim", dim)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer: expected one of {_OPTIMIZERS}, got {optimizer!r}")
        if mode not in ("lazy", "catchup"):
            raise ValueError(f"mode: expected 'lazy' or 'catchup', got {mode!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype: expected float32 or float64, got {dtype}")
        self.comm, self.num_rows, self.dim = comm, int(num_rows), int(dim)
        self.optimizer, self.mode, self.dtype = optimizer, mode, dtype
        self._step = _step_function(optimizer)
        self.hyperparameters = dict(hyperparameters)
        size, rank = comm.Get_size(), comm.Get_rank()
        self.rows = np.arange(rank, self.num_rows, size, dtype=np.int64)   # global ids owned
        self.weight = np.zeros((len(self.rows), self.dim), dtype)
        if init is not None:
            values = np.asarray(init(self.rows.copy()))
            if values.shape != self.weight.shape:
                raise ValueError(f"init: expected it to return shape {self.weight.shape} for "
                                 f"{len(self.rows)} rows, got {values.shape}")
            self.weight[...] = values
        self.state = {name: np.zeros_like(self.weight)
                      for name in (("m", "v") if optimizer == "adam" else ("h",))}
        self.last_step = np.zeros(len(self.rows), np.int64) if mode == "catchup" else None
        self.t = 0
        self._apply_local(np.zeros(0, np.int64), np.zeros((0, self.dim), dtype), t=1)  # checks
        self._sequence = call_sequence(comm)
        self._name = self._sequence.label("ShardedEmbedding")
        self._sequence.enter(self._name, "__init__")

    # -- routing -------------------------------------------------------------------------
    def _check_ids(self, ids, name):
        if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer numpy.ndarray, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)}")
        flat = ids.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_rows):
            bad = flat.min() if flat.min() < 0 else flat.max()
            raise IndexError(f"{name}: id {bad} is out of range for {self.num_rows} rows")
        return flat

    def _route(self, unique_ids):
        """Send the sorted distinct ids to their owners.  Returns the order that groups them by
        owner, the counts sent to and received from each rank and the ids received."""
        size = self.comm.Get_size()
        owner = (unique_ids % size).astype(np.int16 if size < 2**15 else np.int64)
        order = np.argsort(owner, kind="stable")
        send_counts = np.bincount(owner, minlength=size).astype(np.int64)
        recv_counts = np.empty(size, np.int64)
        self.comm.Alltoall(send_counts, recv_counts)
        recv_ids = alltoallv(self.comm, unique_ids[order], send_counts, recv_counts)
        return order, send_counts, recv_counts, recv_ids

    def lookup(self, ids):
        """The rows of the global ``ids`` (any integer array): shape ``ids.shape + (dim,)``."""
        flat = self._sequence.enter(self._name, "lookup", self.t,
                                    lambda: self._check_ids(ids, "ids"))
        unique_ids, inverse = np.unique(flat, return_inverse=True)
        order, send_counts, recv_counts, recv_ids = self._route(unique_ids)
        rows = self.weight[recv_ids // self.comm.Get_size()]
        by_owner = alltoallv(self.comm, rows, recv_counts, send_counts)
        unique_rows = np.empty_like(by_owner)
        unique_rows[order] = by_owner
        return unique_rows[inverse.reshape(-1)].reshape(ids.shape + (self.dim,))

    # -- training ------------------------------------------------------------------------
    def _check_grad(self, grad):
        if isinstance(grad, fastadam.IndexedSlices):
            if tuple(grad.dense_shape) != (self.num_rows, self.dim):
                raise ValueError(f"grad: expected dense_shape {(self.num_rows, self.dim)}, "
                                 f"got {tuple(grad.dense_shape)}")
            indices, values = grad.indices, grad.values
        elif isinstance(grad, tuple) and len(grad) == 2:
            indices, values = grad
        else:
            raise TypeError(f"grad: expected fastadam.IndexedSlices or (indices, values), "
                            f"got {type(grad).__name__}")
        indices = self._check_ids(indices, "grad indices")
        if not isinstance(values, np.ndarray) or values.dtype != self.dtype:
            raise TypeError(f"grad values: expected a numpy.ndarray of {self.dtype}, got "
                            f"{getattr(values, 'dtype', type(values).__name__)}")
        if values.shape != (len(indices), self.dim):
            raise ValueError(f"grad values: expected shape {(len(indices), self.dim)}, "
                             f"got {values.shape}")
        return indices, values

    def apply_gradients(self, grad):
        """One optimizer step with this rank's gradient ``grad`` (``fastadam.IndexedSlices``
        of the table, or an ``(indices, values)`` pair of global ids and rows), summed over the
        ranks.  Every rank's ``t`` advances."""
        indices, values = self._sequence.enter(self._name, "apply_gradients", self.t,
                                               lambda: self._check_grad(grad))
        unique_ids, sums = fastadam.segment_sum(indices, values)
        order, send_counts, recv_counts, recv_ids = self._route(unique_ids)
        received = alltoallv(self.comm, sums[order], send_counts, recv_counts)
        self._apply_local(recv_ids // self.comm.Get_size(), received, t=self.t + 1)
        self.t += 1

    def _apply_local(self, local_rows, values, t):
        if self.mode == "catchup":
            extra = {"mode": "catchup", "last_step": self.last_step}
        else:
            extra = {"mode": "lazy"}
        self._step(self.weight, (local_rows, values), *self.state.values(), t,
                   **extra, **self.hyperparameters)

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self, root=0):
        """The full table (``"weight"``), optimizer state (``"m"``, ``"v"`` or ``"h"``,
        ``"last_step"`` in catchup mode) and ``"t"``, gathered on ``root`` (None elsewhere)."""
        self._sequence.enter(self._name, "state_dict", self.t)
        local = dict(weight=self.weight, **self.state)
        if self.last_step is not None:
            local["last_step"] = self.last_step
        full = {"t": self.t} if self.comm.Get_rank() == root else None
        for name, array in local.items():
            gathered = self._gather_rows(array, root)
            if full is not None:
                full[name] = gathered
        return full

    def load_state_dict(self, state, root=0):
        """Load a full state (``state_dict()`` of a table of the same shape, optimizer and mode,
        saved with any number of ranks), read on ``root`` only.  Collective."""
        self._sequence.enter(self._name, "load_state_dict", self.t)
        local = dict(weight=self.weight, **self.state)
        if self.last_step is not None:
            local["last_step"] = self.last_step

        def check():
            if not isinstance(state, dict):
                raise TypeError(f"state: expected a dict (a state_dict()), "
                                f"got {type(state).__name__}")
            for name, array in local.items():
                saved = state.get(name)
                shape = (self.num_rows,) + array.shape[1:]
                if not isinstance(saved, np.ndarray) or saved.shape != shape or \
                        saved.dtype != array.dtype:
                    raise ValueError(f"state['{name}']: expected {array.dtype} of shape {shape}, "
                                     f"got {getattr(saved, 'dtype', type(saved).__name__)} of "
                                     f"shape {getattr(saved, 'shape', None)}")
            t = state.get("t")
            if not isinstance(t, (int, np.integer)) or t < 0:
                raise ValueError(f"state['t']: expected a step count >= 0, got {t!r}")
            return int(t)

        t = self.comm.bcast(on_root(self.comm, root, check), root=root)
        for name, array in local.items():
            self._scatter_rows(state[name] if self.comm.Get_rank() == root else None, array,
                               root)
        self.t = t

    def _row_counts(self, local):
        """Rows per rank, and the MPI datatype of one row of ``local``."""
        size = self.comm.Get_size()
        counts = [len(range(r, self.num_rows, size)) for r in range(size)]
        return counts, row_type(local.dtype.itemsize, int(np.prod(local.shape[1:], dtype=np.int64)))

    def _scatter_rows(self, full, local, root):
        """Each rank's ``local`` receives its rows (``full[rank::N]``) of ``full`` (on root)."""
        size = self.comm.Get_size()
        counts, rows = self._row_counts(local)
        send = None
        if self.comm.Get_rank() == root:
            blocks = np.concatenate([full[r::size] for r in range(size)])
            send = [carrier(blocks), (counts, exclusive_offsets(counts)), rows]
        self.comm.Scatterv(send, [carrier(local), counts[self.comm.Get_rank()], rows], root=root)

    def _gather_rows(self, local, root):
        """Rank-ordered blocks gathered on ``root``, then dealt back into global row order."""
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        is_root = rank == root
        counts, rows = self._row_counts(local)
        blocks = np.empty((self.num_rows,) + local.shape[1:], local.dtype) if is_root else None
        recv = [carrier(blocks), (counts, exclusive_offsets(counts)), rows] if is_root else None
        self.comm.Gatherv([carrier(np.ascontiguousarray(local)), counts[rank], rows], recv,
                          root=root)
        if not is_root:
            return None
        full = np.empty_like(blocks)
        for r, start in enumerate(exclusive_offsets(counts)):
            full[r::size] = blocks[start:start + counts[r]]
        return full
