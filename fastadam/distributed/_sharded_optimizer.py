"""``ShardedOptimizer``: ZeRO stage 1 over any fastadam optimizer object.

Every rank keeps the full parameters; the optimizer state is split.  The parameters of each
dtype are laid end to end in one flat buffer (a single C-contiguous parameter is its own
buffer; several are copied in and out of one), cut into one slice per rank by
``slice_bounds`` (balanced by bytes, boundaries on cache lines).  Each rank owns an inner
optimizer, ``type(opt)(slice_views, **defaults)``, over its slice only, so its state is 1/N of
the unsharded one.  A step, per dtype:

1. ``reduce_scatter_in_rank_order``: the rank receives its slice of every rank's gradient and
   adds them in rank order, then divides by N (the average, as data-parallel training does);
2. the inner optimizer's fused step on the slice;
3. ``Allgatherv`` in place: every rank gets every updated slice.

One reduce-scatter and one all-gather per dtype, whatever the number of tensors.  Because the
reduction order is fixed and the step is elementwise, the parameters equal, bit for bit, those of
the unsharded optimizer stepped with ``(g_0 + g_1 + ... + g_{N-1}) / N`` added left to right.

State travels as the wrapped optimizer's own ``state_dict`` format: per-parameter entries (lists
with one array per parameter, of its shape and dtype) are gathered to or scattered from the root
as full arrays, everything else (step count, hyper-parameters) is copied.  A checkpoint is
therefore an ordinary single-process checkpoint, loadable with any number of ranks.
"""
import numpy as np
from mpi4py import MPI

from ._abort import abort_on_error as install_abort_hook

from ._collectives import (agree_on_errors, allgather_in_place, call_sequence, carrier,
                           gather_slices, on_root, reduce_scatter_chunk,
                           reduce_scatter_in_rank_order, scatter_slices, slice_bounds)


def _constructor_defaults(optimizer):
    """Keyword arguments that rebuild ``optimizer``'s hyper-parameters with ``type(optimizer)``:
    its ``defaults`` (the Optimizer base class), else derived from ``fastadam.Adam``'s
    ``hyperparameters`` (before that base class existed)."""
    if hasattr(optimizer, "defaults"):
        return dict(optimizer.defaults)
    hyper = dict(optimizer.hyperparameters)
    hyper["betas"] = (hyper.pop("beta1"), hyper.pop("beta2"))
    hyper["num_threads"] = getattr(optimizer, "num_threads", None)
    return hyper


def _per_parameter_paths(state, params, path=()):
    """Paths (tuples of keys) of the entries of ``state`` that hold one array per parameter."""
    if isinstance(state, dict):
        return [p for key, value in state.items()
                for p in _per_parameter_paths(value, params, path + (key,))]
    if (isinstance(state, (list, tuple)) and len(state) == len(params) and len(params) > 0
            and all(isinstance(a, np.ndarray) and a.shape == p.shape and a.dtype == p.dtype
                    for a, p in zip(state, params))):
        return [path]
    return []


def _get(state, path):
    for key in path:
        state = state[key]
    return state


def _regroup(state, indices):
    """``state`` with its single parameter group holding the parameters ``indices`` (the
    optimizer objects' state_dict lists each group's parameter indices; the sharded optimizer
    keeps one group whose parameters are the full list outside and one slice inside)."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if groups is None:
        return state
    if len(groups) != 1:
        raise ValueError(f"state['param_groups']: ShardedOptimizer supports one parameter "
                         f"group, got {len(groups)}")
    return dict(state, param_groups=[dict(groups[0], params=list(indices))])


def _replace(state, path, value):
    """A copy of the dict tree ``state`` with the entry at ``path`` replaced by ``value``."""
    if not path:
        return value
    state = dict(state)
    state[path[0]] = _replace(state[path[0]], path[1:], value)
    return state


class _DtypeGroup:
    """The parameters of one dtype: flat buffer, slice bounds, inner optimizer and buffers."""

    def __init__(self, dtype, indices, params, comm):
        self.dtype, self.indices = dtype, indices
        sizes = [params[i].size for i in indices]
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(int).tolist()
        n, size, rank = self.offsets[-1], comm.Get_size(), comm.Get_rank()
        self.single = len(indices) == 1
        if self.single:
            self.flat = params[indices[0]].reshape(-1)       # a view: updated in place
        else:
            self.flat = np.empty(n, dtype)
            for i, lo, hi in zip(indices, self.offsets[:-1], self.offsets[1:]):
                self.flat[lo:hi] = params[i].reshape(-1)
            self.grad_flat = np.empty(n, dtype)
        self.bounds = slice_bounds(n, dtype.itemsize, size)
        self.lo, self.hi = self.bounds[rank], self.bounds[rank + 1]
        self.grad_slice = np.empty(self.hi - self.lo, dtype)
        chunk = reduce_scatter_chunk(self.bounds, dtype.itemsize, size)
        self.scratch = np.empty((size - 1) * chunk, dtype)
        self.inner = None

    def flat_of(self, arrays, out=None):
        """The per-parameter ``arrays`` of this group end to end (a view when single)."""
        if self.single:
            return np.ascontiguousarray(arrays[self.indices[0]]).reshape(-1)
        out = np.empty(self.offsets[-1], self.dtype) if out is None else out
        for i, lo, hi in zip(self.indices, self.offsets[:-1], self.offsets[1:]):
            out[lo:hi] = np.asarray(arrays[i]).reshape(-1)
        return out

    def refresh_slice(self, params):
        """Copy this rank's slice of the parameters into the flat buffer (they may have been
        assigned since the last step)."""
        for i, a, b in zip(self.indices, self.offsets[:-1], self.offsets[1:]):
            start, end = max(a, self.lo), min(b, self.hi)
            if start < end:
                self.flat[start:end] = params[i].reshape(-1)[start - a:end - a]

    def unflatten(self, flat, params):
        """``flat`` cut back into arrays shaped like this group's parameters, by index."""
        return {i: flat[lo:hi].reshape(params[i].shape)
                for i, lo, hi in zip(self.indices, self.offsets[:-1], self.offsets[1:])}


class ShardedOptimizer:
    """ZeRO stage 1 (optimizer state sharded over the ranks of ``comm``) for a fastadam optimizer.

    Parameters
    ----------
    optimizer : fastadam optimizer object (``fastadam.Adam``, ...)
        Gives the parameters, the hyper-parameters and, if it has stepped (``t > 0``), the state
        to start from.  It is not used afterwards: drop your reference
        (``opt = ShardedOptimizer(opt, comm)``) so that its full-size state is freed.
        Every rank must pass the same parameter shapes and dtypes and the same values.
    comm : mpi4py.MPI.Comm, default ``MPI.COMM_WORLD``
        Every method is collective: all ranks of ``comm`` call it, in the same order.
    abort_on_error : bool, default True
        Install :func:`fastadam.distributed.abort_on_error`: an uncaught exception on any rank
        aborts the whole job instead of leaving the other ranks waiting in a collective.

    Attributes
    ----------
    params : list of ndarray
        The wrapped optimizer's parameters, updated in place on every rank by :meth:`step`.
    t : int
        Steps applied so far.
    """

    def __init__(self, optimizer, comm=None, *, abort_on_error=True):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm: expected an mpi4py.MPI.Comm, got {type(comm).__name__}")
        if not isinstance(abort_on_error, bool):
            raise TypeError(f"abort_on_error: expected a bool, got "
                            f"{type(abort_on_error).__name__}")
        if abort_on_error:
            install_abort_hook()
        params = getattr(optimizer, "params", None)
        if not isinstance(params, list) or not hasattr(optimizer, "state_dict"):
            raise TypeError(f"optimizer: expected a fastadam optimizer object (with params and "
                            f"state_dict), got {type(optimizer).__name__}")
        self.comm, self.params = comm, list(params)
        self.optimizer_type = type(optimizer)
        self.defaults = _constructor_defaults(optimizer)
        self._sequence = call_sequence(comm)
        self._name = self._sequence.label("ShardedOptimizer")
        self._sequence.enter(self._name, "__init__")
        layout = [(p.shape, p.dtype.str) for p in self.params]
        agree_on_errors(comm, lambda: self._check_same_layout(comm.allgather(layout)))
        self._groups = []
        for dtype in dict.fromkeys(p.dtype for p in self.params):
            indices = [i for i, p in enumerate(self.params) if p.dtype == dtype]
            group = _DtypeGroup(dtype, indices, self.params, comm)
            group.inner = self.optimizer_type([group.flat[group.lo:group.hi]], **self.defaults)
            self._groups.append(group)
        self.t = 0
        if optimizer.t > 0:   # a fresh optimizer's state is what the inner ones start with
            self._load_full_state(optimizer.state_dict() if comm.Get_rank() == 0 else None, 0)

    @staticmethod
    def _check_same_layout(layouts):
        for rank, layout in enumerate(layouts[1:], 1):
            if layout != layouts[0]:
                raise ValueError(f"optimizer: rank {rank}'s parameters (shapes and dtypes "
                                 f"{layout}) differ from rank 0's ({layouts[0]})")

    def _check_grads(self, grads):
        if isinstance(grads, np.ndarray):
            grads = [grads]
        if not isinstance(grads, (list, tuple)):
            raise TypeError(f"grads: expected a list of ndarray, got {type(grads).__name__}")
        if len(grads) != len(self.params):
            raise ValueError(f"grads: expected {len(self.params)} arrays (one per parameter), "
                             f"got {len(grads)}")
        for i, (g, p) in enumerate(zip(grads, self.params)):
            if not isinstance(g, np.ndarray):
                raise TypeError(f"grads[{i}]: expected a numpy.ndarray, got {type(g).__name__}")
            if g.shape != p.shape or g.dtype != p.dtype:
                raise ValueError(f"grads[{i}]: expected {p.dtype} of shape {p.shape}, "
                                 f"got {g.dtype} of shape {g.shape}")
        return list(grads)

    def step(self, grads, *, skip_nonfinite=False):
        """Average ``grads`` (this rank's gradients, a list like ``params``) over the ranks and
        apply one step.  With ``skip_nonfinite=True`` a NaN or infinity in the averaged gradient
        on any rank skips the step on every rank: nothing changes and False is returned."""
        comm, size = self.comm, self.comm.Get_size()
        # the one allgather that checks the inputs also checks that every rank is at this step
        grads = self._sequence.enter(self._name, "step", self.t,
                                     lambda: self._check_grads(grads))
        for group in self._groups:
            send = group.flat_of(grads, None if group.single else group.grad_flat)
            reduce_scatter_in_rank_order(comm, send, group.bounds, group.scratch,
                                         group.grad_slice)
            if size > 1:
                np.divide(group.grad_slice, size, out=group.grad_slice)
        if skip_nonfinite:
            finite = all(bool(np.isfinite(g.grad_slice).all()) for g in self._groups)
            if not comm.allreduce(finite, op=MPI.LAND):
                return False
        for group in self._groups:
            if not group.single:
                group.refresh_slice(self.params)
            group.inner.step([group.grad_slice])
            allgather_in_place(comm, group.flat, group.bounds)
            if not group.single:
                for i, view in group.unflatten(group.flat, self.params).items():
                    np.copyto(self.params[i], view)
        self.t += 1
        return True

    def state_dict(self, root=0):
        """The full state, in the wrapped optimizer's ``state_dict`` format, gathered on
        ``root`` (None on the other ranks).  Collective."""
        self._sequence.enter(self._name, "state_dict", self.t)
        return self._gather_state(root)

    def _gather_state(self, root):
        comm, is_root = self.comm, self.comm.Get_rank() == root
        states = [group.inner.state_dict() for group in self._groups]
        if not states:
            empty = self.optimizer_type(self.params, **self.defaults)
            return empty.state_dict() if is_root else None
        paths = _per_parameter_paths(states[0], self._groups[0].inner.params)
        full = dict(states[0]) if is_root else None
        for path in paths:
            arrays = [None] * len(self.params)
            for group, state in zip(self._groups, states):
                flat = np.empty(group.offsets[-1], group.dtype) if is_root else None
                gather_slices(comm, _get(state, path)[0], group.bounds, flat, root)
                if is_root:
                    for i, view in group.unflatten(flat, self.params).items():
                        arrays[i] = view
            if is_root:
                full = _replace(full, path, arrays)
        return _regroup(full, range(len(self.params))) if is_root else full

    def load_state_dict(self, state, root=0):
        """Load a full state (``state_dict()`` of this or of an unsharded optimizer with the same
        parameters, from any number of ranks), read on ``root`` only.  Collective."""
        self._sequence.enter(self._name, "load_state_dict", self.t)
        self._load_full_state(state, root)

    def _load_full_state(self, state, root):
        comm, is_root = self.comm, self.comm.Get_rank() == root

        def split():
            if not isinstance(state, dict):
                raise TypeError(f"state: expected a dict (a state_dict()), "
                                f"got {type(state).__name__}")
            paths = _per_parameter_paths(state, self.params)
            if not paths and self.params:
                raise ValueError("state: no entry holds one array per parameter with the "
                                 "parameters' shapes and dtypes")
            rest = state
            for path in paths:
                rest = _replace(rest, path, None)
            return paths, rest

        paths, rest = comm.bcast(on_root(comm, root, split), root=root)
        slices = {}
        for path in paths:
            per_param = _get(state, path) if is_root else None
            for group in self._groups:
                full = group.flat_of(per_param) if is_root else None
                local = np.empty(group.hi - group.lo, group.dtype)
                scatter_slices(comm, full, group.bounds, local, root)
                slices[(path, group.dtype)] = local

        def load_inner():
            for group in self._groups:
                inner_state = rest
                for path in paths:
                    inner_state = _replace(inner_state, path, [slices[(path, group.dtype)]])
                group.inner.load_state_dict(_regroup(inner_state, [0]))

        agree_on_errors(comm, load_inner)
        if self._groups:
            self.t = int(self._groups[0].inner.t)

    def save(self, path, root=0):
        """Write the parameters and the full state to ``path`` on ``root``, in the wrapped
        optimizer's checkpoint format (a single-process optimizer loads it).  Collective."""
        self._sequence.enter(self._name, "save", self.t)
        state = self._gather_state(root)

        def write():
            full = self.optimizer_type(self.params, **self.defaults)
            full.load_state_dict(state)
            full.save(path)

        on_root(self.comm, root, write)

    def load(self, path, *, params=True, root=0):
        """Read a checkpoint written by :meth:`save` or by the unsharded optimizer's ``save``,
        with any number of ranks; ``root`` reads the file.  With ``params=True`` the saved
        parameters are broadcast into ``params`` too.  Collective."""
        self._sequence.enter(self._name, "load", self.t)

        def read():
            full = self.optimizer_type([p.copy() for p in self.params], **self.defaults)
            full.load(path, params=params)
            return full

        full = on_root(self.comm, root, read)
        self._load_full_state(full.state_dict() if full is not None else None, root)
        if params:
            for i, p in enumerate(self.params):
                if full is not None:
                    np.copyto(p, full.params[i])
                self.comm.Bcast(carrier(p), root=root)
            for group in self._groups:
                if not group.single:
                    np.copyto(group.flat, group.flat_of(self.params))
