"""Embedding-bag modules whose backward is the optimizer step (FBGEMM's table-batched
embedding, on fastadam's kernels).

Design.  The tables and their optimizer state are **buffers**, not parameters: the user's
optimizer never sees them.  The forward is torch's own pooled lookup
(``torch.nn.functional.embedding_bag``) inside an autograd Function; its backward hands the
output gradients, ids, offsets and per-sample weights of every table to
:func:`fastadam.embedding_bag_step_inplace`, one call for all tables, which updates the touched
rows of the tables and of their state in place through NumPy views, all or nothing.  No
gradient of a table is formed.  The state keeps the names ``torch.optim`` gives it (SparseAdam's
``step``, ``exp_avg``, ``exp_avg_sq``; Adagrad's ``sum``; SGD's ``momentum_buffer``), one set
per table, so the module's ``state_dict`` carries the tables, the optimizer state and the step
count under names a ``torch.optim`` or ``fastadam.torch`` checkpoint uses for one parameter.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import embedding_bag_step_inplace
from ..optim import embedding_bag_slots
from ._optimizer import new_step, numpy_view, step_count

__all__ = ["FusedEmbeddingBag", "FusedEmbeddingBagCollection"]

#: torch.optim's names for Adam's slots (the other optimizers' object names are torch's)
_ADAM_KEYS = {"m": "exp_avg", "v": "exp_avg_sq", "v_max": "max_exp_avg_sq"}
_DTYPES = (torch.float32, torch.float64)


class _Table(torch.nn.Module):
    """One table: ``weight``, the optimizer's state tensors and ``step``, as buffers."""

    def __init__(self, num_embeddings, embedding_dim, dtype, slot_keys, initial, weight):
        """``slot_keys``: (state name, shape given the table's shape) pairs."""
        super().__init__()
        if weight is None:
            weight = torch.empty(num_embeddings, embedding_dim, dtype=dtype)
            torch.nn.init.normal_(weight)  # nn.EmbeddingBag's initialisation
        else:
            if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (
                    num_embeddings, embedding_dim):
                raise ValueError(f"_weight: expected a tensor of shape ({num_embeddings}, "
                                 f"{embedding_dim}), got "
                                 f"{getattr(weight, 'shape', type(weight).__name__)}")
            weight = weight.detach().to(dtype=dtype, device="cpu", copy=True).contiguous()
        self.register_buffer("weight", weight)
        for key, shape_of in slot_keys:
            self.register_buffer(key, torch.full(shape_of(tuple(weight.shape)),
                                                 initial.get(key, 0.0), dtype=dtype))
        self.register_buffer("step", new_step())


class FusedEmbeddingBagCollection(torch.nn.Module):
    """Several pooled embedding tables whose backward applies ``optimizer`` to the rows the
    batch touched, in place, in one fused call (no table gradient is formed).

    ``forward`` is ``torch.nn.functional.embedding_bag`` per table (``mode`` ``"sum"`` or
    ``"mean"``, ``per_sample_weights`` with ``"sum"``, torch's ``offsets`` convention).  The
    backward of the outputs runs :func:`fastadam.embedding_bag_step_inplace` on all tables
    whose output has a gradient: the lazy sparse step of ``optimizer`` on the touched rows,
    ``t`` the table's ``step`` count plus one (a table whose output was not used is not
    stepped, as torch's optimizers skip a parameter without a gradient).  **The tables are buffers, not parameters**: ``parameters()`` does
    not list them, so the optimizer of the rest of the model never sees them, and their
    ``.grad`` stays None.  Each backward is one step, so run one backward per forward (a
    second forward before the backward steps the tables once per backward, each with its own
    gradient; retain_graph twice steps twice).  ``requires_grad`` of the outputs follows the
    module's ``training`` flag and the grad mode; in eval mode no step is taken.

    Parameters
    ----------
    tables : sequence of (num_embeddings, embedding_dim)
    mode : {"sum", "mean"}
    optimizer : str
        ``"adam"`` (lazy Adam: ``torch.optim.SparseAdam``'s update with the default
        ``convention="tf"``), ``"adamw"``, ``"adagrad"``, ``"sgd"`` (momentum SGD),
        ``"rmsprop"``, ``"lion"``, or any registered optimizer.
    dtype : torch.float32 or torch.float64
    include_last_offset : bool
        As torch's.
    num_threads : int, optional
        As in fastadam's functional steps; the result does not depend on it.
    initial_accumulator_value : float
        The starting value of the state torch calls ``sum`` (Adagrad's, torch's argument of
        that name).
    _weights : list of tensors, optional
        Initial tables (copied); default ``normal(0, 1)`` as ``nn.EmbeddingBag``.
    **hyper
        The optimizer's hyper-parameters as :func:`fastadam.embedding_bag_step_inplace` takes
        them (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``, ``momentum`` ...);
        checked here, kept in ``self.hyper`` (change ``self.hyper["lr"]`` to schedule).

    State dict: ``tables.<i>.weight``, ``tables.<i>.step`` (a scalar tensor, as torch's
    optimizers keep it) and the state under torch's names (``exp_avg``, ``exp_avg_sq`` for
    Adam, ``sum`` for Adagrad, ``momentum_buffer`` for SGD ...).  ``load_state_dict`` copies
    into the buffers in place.
    """

    def __init__(self, tables: Sequence[Tuple[int, int]], *, mode: str = "sum",
                 optimizer: str = "adam", dtype: torch.dtype = torch.float32,
                 include_last_offset: bool = False, num_threads: Optional[int] = None,
                 initial_accumulator_value: float = 0.0,
                 _weights: Optional[Sequence[torch.Tensor]] = None, **hyper: Any):
        super().__init__()
        if dtype not in _DTYPES:
            raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
        try:  # the step's own checks of the options, once here
            spec, names = embedding_bag_slots(optimizer, mode, **hyper)
        except ValueError as exc:
            if str(exc).startswith("pooling:"):
                raise ValueError("mode" + str(exc)[len("pooling"):]) from None
            raise
        keys = (_ADAM_KEYS if spec.name == "adam" else
                dict(zip(spec.slots, spec.object_slots)))
        self._slots = [(name, keys[name]) for name in names]
        # torch's Adagrad starts its ``sum`` at initial_accumulator_value (so does any
        # optimizer whose state torch would call ``sum``, as a row-wise Adagrad's)
        initial = {"sum": float(initial_accumulator_value)}
        slot_shape = getattr(spec, "slot_shape", None)  # row-wise optimizers: per-row state
        shaped = [(key, (lambda shape, n=name: tuple(slot_shape(n, shape))) if slot_shape
                   else (lambda shape: shape)) for name, key in self._slots]
        tables = list(tables)
        weights = [None] * len(tables) if _weights is None else list(_weights)
        if len(weights) != len(tables):
            raise ValueError(f"_weights: expected {len(tables)} tensors, got {len(weights)}")
        built = []
        for i, shape in enumerate(tables):
            try:
                num, dim = (int(s) for s in shape)
            except (TypeError, ValueError):
                raise ValueError(f"tables[{i}]: expected (num_embeddings, embedding_dim), got "
                                 f"{shape!r}") from None
            if num < 1 or dim < 1:
                raise ValueError(f"tables[{i}]: expected positive sizes, got {(num, dim)}")
            built.append(_Table(num, dim, dtype, shaped, initial, weights[i]))
        self.tables = torch.nn.ModuleList(built)
        self.mode = mode
        self.optimizer = optimizer
        self.include_last_offset = bool(include_last_offset)
        self.num_threads = num_threads
        self.hyper = dict(hyper)
        # a leaf that requires grad, so the outputs have a backward; never a parameter, and
        # its gradient is never set
        self._anchor = torch.zeros((), requires_grad=True)

    def forward(self, ids: Sequence[torch.Tensor], offsets: Optional[Sequence[Any]] = None,
                per_sample_weights: Optional[Sequence[Any]] = None) -> List[torch.Tensor]:
        """The pooled lookups of every table: ``ids[i]``, ``offsets[i]`` (None for 2-D ids)
        and ``per_sample_weights[i]`` (or None) of table ``i``; returns one ``(n_bags, dim)``
        tensor per table."""
        n = len(self.tables)
        ids = list(ids)
        offsets = [None] * n if offsets is None else list(offsets)
        weights = [None] * n if per_sample_weights is None else list(per_sample_weights)
        for name, lst in (("ids", ids), ("offsets", offsets), ("per_sample_weights", weights)):
            if len(lst) != n:
                raise ValueError(f"{name}: expected {n} entries (one per table), got {len(lst)}")
        flat = []
        for i in range(n):
            flat += [ids[i], offsets[i], weights[i]]
        if torch.is_grad_enabled() and self.training:
            return list(_BagLookup.apply(self, self._anchor, *flat))
        with torch.no_grad():
            return list(_lookup(self, flat))

    def _step(self, flat: list, grads: Sequence[Optional[torch.Tensor]]) -> None:
        """The fused backward: one :func:`fastadam.embedding_bag_step_inplace` call over the
        tables whose output received a gradient (a table whose output was not used is not
        stepped, as torch's optimizers skip a parameter without a gradient), each at its own
        step count."""
        active = [i for i in range(len(self.tables)) if grads[i] is not None]
        if not active:
            return
        steps, weights, ids, offsets, gouts, psws = [], [], [], [], [], []
        state = {name: [] for name, _ in self._slots}
        for i in active:
            table = self.tables[i]
            steps.append(int(step_count(table.step, f"tables[{i}].step")) + 1)
            w = numpy_view(table.weight, f"tables[{i}].weight")
            weights.append(w)
            for name, key in self._slots:
                state[name].append(numpy_view(getattr(table, key), f"tables[{i}].{key}"))
            a, o, p = flat[3 * i: 3 * i + 3]
            ids.append(_index_view(a, f"ids[{i}]"))
            offsets.append(None if o is None else _index_view(o, f"offsets[{i}]"))
            psws.append(None if p is None else p.detach().contiguous().numpy())
            gouts.append(grads[i].detach().to(table.weight.dtype).contiguous().numpy())
        embedding_bag_step_inplace(
            weights, ids, offsets, gouts, state, steps, optimizer=self.optimizer,
            pooling=self.mode, per_sample_weights=psws,
            include_last_offset=self.include_last_offset, num_threads=self.num_threads,
            **self.hyper)
        for i in active:
            self.tables[i].step.add_(1)

    def extra_repr(self) -> str:
        shapes = [tuple(t.weight.shape) for t in self.tables]
        return f"{shapes}, mode={self.mode!r}, optimizer={self.optimizer!r}, hyper={self.hyper}"


class FusedEmbeddingBag(FusedEmbeddingBagCollection):
    """One pooled embedding table whose backward is the optimizer step:
    :class:`FusedEmbeddingBagCollection` with one table, called like ``nn.EmbeddingBag``
    (``forward(input, offsets=None, per_sample_weights=None)`` returns one tensor).

    ``weight`` (a buffer, not a parameter) is the table; ``state_dict`` keys are
    ``tables.0.weight``, ``tables.0.step`` and the state (``tables.0.exp_avg`` ...).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, mode: str = "sum",
                 optimizer: str = "adam", dtype: torch.dtype = torch.float32,
                 include_last_offset: bool = False, num_threads: Optional[int] = None,
                 initial_accumulator_value: float = 0.0,
                 _weight: Optional[torch.Tensor] = None, **hyper: Any):
        super().__init__([(num_embeddings, embedding_dim)], mode=mode, optimizer=optimizer,
                         dtype=dtype, include_last_offset=include_last_offset,
                         num_threads=num_threads,
                         initial_accumulator_value=initial_accumulator_value,
                         _weights=None if _weight is None else [_weight], **hyper)

    @property
    def weight(self) -> torch.Tensor:
        return self.tables[0].weight

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        return super().forward([input], [offsets], [per_sample_weights])[0]


def _index_view(a: Any, name: str) -> np.ndarray:
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor of int32 or int64, got {type(a).__name__}")
    if a.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected int32 or int64, got {a.dtype}")
    return a.detach().cpu().contiguous().numpy()


def _lookup(owner: FusedEmbeddingBagCollection, flat: list):
    outs = []
    for i, table in enumerate(owner.tables):
        a, o, p = flat[3 * i: 3 * i + 3]
        outs.append(torch.nn.functional.embedding_bag(
            a, table.weight, o, mode=owner.mode, per_sample_weights=p,
            include_last_offset=owner.include_last_offset))
    return tuple(outs)


class _BagLookup(torch.autograd.Function):
    """Forward: the pooled lookups.  Backward: the gradients of the per-sample weights that
    need one (read before the tables move), then the fused step; no table gradient."""

    @staticmethod
    def forward(ctx, owner, anchor, *flat):
        ctx.owner = owner
        ctx.flat = flat
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no step
        return _lookup(owner, list(flat))

    @staticmethod
    def backward(ctx, *grads):
        owner, flat = ctx.owner, list(ctx.flat)
        weight_grads = [None] * len(flat)
        for i, table in enumerate(owner.tables):
            a, o, p = flat[3 * i: 3 * i + 3]
            if p is not None and ctx.needs_input_grad[2 + 3 * i + 2] and grads[i] is not None:
                # d out[b] / d w_j = weight[ids[j]] . grad_out[b]
                bag = _bag_of(a, o, owner.include_last_offset)
                rows = table.weight.index_select(0, a.reshape(-1))
                weight_grads[3 * i + 2] = (rows * grads[i].index_select(0, bag)).sum(1).to(
                    p.dtype)
        owner._step(flat, grads)
        return (None, None) + tuple(weight_grads)


def _bag_of(ids, offsets, include_last_offset):
    """The bag of each id (int64)."""
    if offsets is None:
        n, size = ids.shape
        return torch.arange(n).repeat_interleave(size)
    ends = offsets.to(torch.int64)
    if not include_last_offset:
        ends = torch.cat([ends, torch.tensor([ids.shape[0]])])
    return torch.arange(ends.shape[0] - 1).repeat_interleave(ends.diff())
