"""``embedding_bag_step_inplace``: the backward of pooled embedding lookups fused with a lazy
sparse step of any registered optimizer, over one or several tables in one call.

Design.  An embedding bag ``out[b] = sum_{j in bag b} s_j * weight[ids[j]]`` (torch's
``nn.EmbeddingBag``: ``s_j`` is 1, the bag's ``1/len`` for ``"mean"``, or the per-sample
weight) has the row gradient ``s_j * grad_out[b]`` for each of its ids.  This module checks
every table's ids, offsets, weights, gradients and state, for all tables before the first
write, and folds the hyper-parameters once with the optimizer's spec
(fastadam/_core/_registry.py).  Then, per table, two compiled calls of the sparse driver
(fastadam/_core/_sparse.pyx) that every sparse step uses: the stable radix sort of the ids,
and the row walk, which sums each touched row's gradient rows in the ids' original order and
applies the optimizer's element formula.  The walk reads a gradient row through an index
(``values[source[j]]``), so the bags' rows are never expanded into one row per id: it reads
``grad_out`` (scaled once per bag for ``"mean"``) through each id's bag.  Per-sample
weights, a scale per id, go through one more compiled call (_bag_kernels.pyx) that sums each
touched row's ``grad_out[bag] * weight`` without writing the products.  The products and the
order of the sums are those of the optimizer's own sparse step on the expanded gradient, so
the result is that step's, bit for bit, for any thread count.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .._core import _sparse
from .._core._registry import OptimizerSpec, spec as _spec
from .._core._sparse_host import KIND_SEGMENT_SUM, run_threaded
from .._core._threads import resolve_num_threads
from .._core._validation import check_array, check_disjoint
from ._coefficients import step_number
from ._functional import check_compute_dtype
from ._guard import sigint_deferred
from ._bag_kernels import weighted_segment_sums
from ._sparse_functional import KIND_SPARSE_STEP, _identity

__all__ = ["embedding_bag_slots", "embedding_bag_step_inplace"]

POOLINGS = ("sum", "mean")
_INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))
_TABLE_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: other names accepted for ``optimizer``: (registry name, keywords it implies)
OPTIMIZER_ALIASES = {"adamw": ("adam", {"decoupled_weight_decay": True}),
                     "sgd": ("momentum", {})}

Arrays = Union[np.ndarray, Sequence[np.ndarray]]


def _resolve_optimizer(optimizer: Any, hyper: Dict[str, Any]):
    """(spec, hyper with the alias's keywords and the spec's defaults) of ``optimizer``."""
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer: expected a name such as 'adam', got "
                        f"{type(optimizer).__name__}")
    name, implied = OPTIMIZER_ALIASES.get(optimizer, (optimizer, {}))
    spec = _spec(name)
    for key, value in implied.items():
        if key in hyper and hyper[key] != value:
            raise ValueError(f"{key}: optimizer={optimizer!r} means {key}={value!r}, "
                             f"got {hyper[key]!r}")
    return spec, {**spec.defaults, **implied, **hyper}


def embedding_bag_slots(optimizer: str = "adam", pooling: str = "sum",
                        **hyper: Any) -> Tuple[OptimizerSpec, Tuple[str, ...]]:
    """The optimizer and the state :func:`fastadam.embedding_bag_step_inplace` needs.

    Checks ``optimizer`` (a registry name, ``"adamw"`` or ``"sgd"``), ``pooling`` and the
    hyper-parameters as the step does (its fold at ``t = 1``), and returns the optimizer's
    :class:`~fastadam.optim.OptimizerSpec` and the names of the state arrays the step reads
    with these options, in slot order (``("m", "v")`` for Adam, ``("h",)`` for Adagrad ...).
    For front-ends that allocate the state once (``fastadam.torch.FusedEmbeddingBag``).
    """
    spec, _, names = _fold(optimizer, pooling, 1, hyper)
    return spec, names


def _fold(optimizer, pooling, t, hyper):
    """(spec, coefficient object of step t, state names in slot order), every option checked."""
    if not isinstance(pooling, str) or pooling not in POOLINGS:
        raise ValueError(f"pooling: expected one of {POOLINGS}, got {pooling!r}")
    spec, merged = _resolve_optimizer(optimizer, hyper)
    coeffs = spec.fold(t, **merged)
    if coeffs.flags not in spec.sparse_flag_sets():
        raise ValueError(f"optimizer: {spec.name} with these options (flags {coeffs.flags}) has "
                         f"no sparse step")
    return spec, coeffs, tuple(spec.slots[i] for i in spec.slot_indices(coeffs.flags))


def _slot_shape(spec, name, shape):
    """The shape of state ``name`` of a table of ``shape``: the table's, or one value per row
    for a row-wise optimizer's row slot (``OptimizerSpec.slot_shape`` where the spec has it)."""
    slot_shape = getattr(spec, "slot_shape", None)
    return tuple(shape) if slot_shape is None else tuple(slot_shape(name, shape))


def _per_table(obj, name, n, single, optional=False):
    """A list of ``n`` entries from one object (one table) or a list (several)."""
    if single:
        return [obj]
    if optional and obj is None:
        return [None] * n
    if not isinstance(obj, (list, tuple)) or len(obj) != n:
        got = f"{len(obj)} entries" if isinstance(obj, (list, tuple)) else type(obj).__name__
        raise ValueError(f"{name}: expected a list of {n} entries (one per table, as weight), "
                         f"got {got}")
    return list(obj)


def _label(name, i, single):
    return name if single else f"{name}[{i}]"


def _index_array(a, name):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of int32 or int64, "
                        f"got {type(a).__name__}")
    if a.dtype not in _INDEX_TYPES:
        raise TypeError(f"{name}: expected int32 or int64, got {a.dtype}")
    return a


def _bags(ids, offsets, include_last_offset, n_rows, single, i):
    """(private int64 copy of the ids, bag length of each bag) of one table, checked."""
    ids_name, off_name = _label("ids", i, single), _label("offsets", i, single)
    ids = _index_array(ids, ids_name)
    if offsets is None:
        if ids.ndim != 2:
            raise ValueError(f"{ids_name}: without offsets, expected a 2-D array (one bag per "
                             f"row, torch's fixed-length bags), got shape {ids.shape}")
        if include_last_offset:
            raise ValueError("include_last_offset: needs offsets")
        n_bags, length = ids.shape
        flat = np.array(ids, dtype=np.int64, order="C").reshape(-1)
        lengths = np.full(n_bags, length, dtype=np.int64)
    else:
        if ids.ndim != 1:
            raise ValueError(f"{ids_name}: with offsets, expected a 1-D array, got shape "
                             f"{ids.shape}")
        offsets = _index_array(offsets, off_name)
        if offsets.ndim != 1:
            raise ValueError(f"{off_name}: expected a 1-D array, got shape {offsets.shape}")
        flat = np.array(ids, dtype=np.int64, order="C")  # private: read once
        starts = np.array(offsets, dtype=np.int64, order="C")
        k = flat.shape[0]
        if include_last_offset:
            if starts.shape[0] == 0:
                raise ValueError(f"{off_name}: include_last_offset=True needs at least one "
                                 f"entry (the end of the last bag)")
            if starts[-1] != k:
                raise ValueError(f"{off_name}: include_last_offset=True needs the last entry "
                                 f"to be len({ids_name}) = {k}, got {int(starts[-1])}")
            ends = starts
            starts = starts[:-1]
        else:
            ends = np.append(starts, np.int64(k))
        if starts.shape[0] and starts[0] != 0:
            raise ValueError(f"{off_name}: the first bag must start at 0, got "
                             f"{int(starts[0])}")
        lengths = np.diff(ends) if ends.shape[0] > 1 else np.zeros(0, np.int64)
        if lengths.size and lengths.min() < 0:
            at = int(np.argmax(lengths < 0)) + 1
            raise ValueError(f"{off_name}: expected non-decreasing offsets within "
                             f"[0, len({ids_name}) = {k}], but position {at} holds "
                             f"{int(ends[at])} after {int(ends[at - 1])}")
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0:
            raise IndexError(f"{ids_name}: negative id {lo}; ids must lie in [0, {n_rows})")
        if hi >= n_rows:
            raise IndexError(f"{ids_name}: id {hi} is out of range for a table of {n_rows} "
                             f"rows")
    return flat, lengths


def _bag_scale(lengths, pooling, dtype):
    """``1 / len`` of each bag in ``dtype`` for "mean" (1 for an empty bag), else None."""
    if pooling != "mean":
        return None
    inverse = np.ones(lengths.shape[0], dtype=dtype)
    filled = lengths > 0
    inverse[filled] = dtype.type(1) / lengths[filled].astype(dtype)
    return inverse


def _walk_inputs(grad_out, flat, lengths, pooling, weights, perm, offsets, dtype, nt):
    """(values, source, offsets) for the row walk, which sums ``values[source[j]]`` over the
    ``j`` of each touched row's segment, in the ids' original order, before the update.

    Without per-sample weights an id's scale is its bag's, so each bag's gradient row is
    scaled once (``n_bags x dim``; not at all for "sum" or bags of one id) and ``source`` is
    the bag of each sorted id.  With per-sample weights each touched row's sum of
    ``grad_out[bag] * weight`` is formed first (_bag_kernels.pyx) and the walk reads one row
    per segment.  Either way: the same products, added in the same order from +0, as the
    optimizer's sparse step on the expanded ``k x dim`` rows, bit for bit, without them."""
    values = grad_out
    inverse = _bag_scale(lengths, pooling, dtype)
    if inverse is not None and (lengths > 1).any():
        values = grad_out * inverse[:, None]  # 1/1 = 1: bags of one id keep their row
    values = np.ascontiguousarray(values)
    if values.dtype.byteorder not in "=|":
        values = values.astype(values.dtype.newbyteorder("="))
    if lengths.shape[0] == flat.shape[0] and (lengths == 1).all():  # one id per bag
        source = perm
    else:
        source = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths).take(perm)
    if weights is None:
        return values, source, offsets
    nseg = offsets.shape[0] - 1
    sums = np.empty((nseg, values.shape[1]), dtype=dtype)
    run_threaded(weighted_segment_sums,
                 (values, source, np.ascontiguousarray(weights.take(perm)), offsets, sums),
                 flat.shape[0] * values.shape[1], nt, KIND_SEGMENT_SUM)
    return sums, _identity(nseg), _identity(nseg + 1)


def embedding_bag_step_inplace(weight: Arrays, ids: Any, offsets: Any, grad_out: Any,
                               state: Dict[str, Any], t: int, *, optimizer: str = "adam",
                               pooling: str = "sum", per_sample_weights: Any = None,
                               include_last_offset: bool = False,
                               num_threads: Optional[int] = None, **hyper: Any) -> None:
    """The backward of pooled embedding lookups (``nn.EmbeddingBag``) fused with a lazy sparse
    step of ``optimizer``, in place, on one table or several in one call.

    For each table, bag ``b`` holds ``ids[offsets[b]:offsets[b+1]]`` and its pooled output was
    ``out[b] = sum_j s_j * weight[ids[j]]``.  Given ``grad_out = d loss / d out``, the gradient
    of id ``ids[j]`` in bag ``b`` is::

        g_j = s_j * grad_out[b],   s_j = 1 ("sum"), per_sample_weights[j] ("sum" with
                                   weights), or 1 / len(bag b) ("mean")

    each product rounded once in the table's dtype (``1 / len`` too), as torch's sparse
    backward forms it.  The ``g_j`` of one row are summed in the ids' original order (the
    sorted segment sum of :func:`fastadam.segment_sum`), then the optimizer's lazy sparse step
    updates the touched rows of ``weight`` and its state, exactly as
    :func:`fastadam.sparse_step_inplace` (Adam) and the other ``sparse_*_step_inplace``
    functions do on that gradient: the result is bit-identical to them, and for any thread
    count.  Rows no id touches do not change (no weight decay either).

    Parameters
    ----------
    weight : ndarray or list of ndarray
        The tables, each 2-D ``(num_embeddings, dim)``, C-contiguous, writable, float32 or
        float64; updated in place.  A list steps several tables in one call (every other
        per-table argument is then a list of the same length).
    ids : ndarray (int32 or int64) or list
        Each 1-D with ``offsets``, or 2-D ``(n_bags, bag_size)`` with ``offsets=None``
        (fixed-length bags, as torch's 2-D input).  Every id in ``[0, num_embeddings)``.
    offsets : ndarray (int32 or int64), None, or list
        torch's convention: the start of each bag in ``ids``, first 0, non-decreasing, at most
        ``len(ids)``; a bag ends where the next starts (the last at ``len(ids)``).  With
        ``include_last_offset=True`` it has one more entry, ``len(ids)``.  Empty bags are fine.
    grad_out : ndarray or list
        The gradient of each table's pooled output, ``(n_bags, dim)``, the table's dtype.
        Only read; NaN and infinities propagate (IEEE) into the rows they touch.
    state : dict
        The optimizer's state arrays by their functional names (Adam ``m``, ``v``, and
        ``v_max`` for ``amsgrad``; Adagrad ``h``; momentum ``v``; RMSprop ``square_avg``,
        ``momentum_buffer``, ``grad_avg``; Lion ``m``: see
        :func:`fastadam.optim.optimizer_spec`), each an array like ``weight`` (one value per
        row for a row-wise optimizer's per-row state), or a list like the list of tables;
        updated in place.
    t : int or list of int
        The step number (1 for the first step), as in the optimizer's sparse step; with
        several tables, one for all or a list with each table's own.
    optimizer : str
        A registry name (``"adam"``, ``"adagrad"``, ``"momentum"``, ``"rmsprop"``,
        ``"lion"``, and any optimizer registered later), or ``"adamw"`` (``"adam"`` with
        ``decoupled_weight_decay=True``) or ``"sgd"`` (``"momentum"``).
    pooling : {"sum", "mean"}
        torch's ``mode`` (``"max"`` is not supported).
    per_sample_weights : ndarray, None, or list (entries may be None)
        One finite weight per id, the table's dtype; only with ``"sum"`` (as torch).
    include_last_offset : bool
        As in torch, for every table.
    num_threads : int, optional
        OpenMP threads (None: as many as OpenMP allows); the result does not depend on it.
    **hyper
        The optimizer's hyper-parameters, as its sparse step's keywords (``lr``, ``beta1``,
        ``eps``, ``convention``, ``weight_decay`` ...; Adam defaults to ``convention="tf"``,
        the form of ``torch.optim.SparseAdam``).

    All checks of every table run before the first write (TypeError, ValueError or IndexError
    naming the argument): if one fails, no table and no state array has changed.

    Examples
    --------
    >>> import numpy as np, fastadam
    >>> w = np.ones((4, 2)); v = np.zeros_like(w)
    >>> fastadam.embedding_bag_step_inplace(
    ...     w, np.array([1, 3, 1]), np.array([0, 2]), np.ones((2, 2)), {"v": v}, 1,
    ...     optimizer="sgd", lr=0.1, momentum=0.0, pooling="mean")
    >>> w[:, 0]
    array([1.  , 0.85, 1.  , 0.95])
    """
    single = isinstance(weight, np.ndarray)
    if not single and not isinstance(weight, (list, tuple)):
        raise TypeError(f"weight: expected a numpy.ndarray or a list of them, got "
                        f"{type(weight).__name__}")
    tables = [weight] if single else list(weight)
    n = len(tables)
    if isinstance(t, (list, tuple)) and not single:
        if len(t) != n:
            raise ValueError(f"t: expected one step number or a list of {n} (one per table), "
                             f"got a list of {len(t)}")
        steps = [step_number(x, f"t[{i}]") for i, x in enumerate(t)]
    else:
        steps = [step_number(t)] * n
    if not isinstance(include_last_offset, (bool, np.bool_)):
        raise TypeError(f"include_last_offset: expected a bool, got "
                        f"{type(include_last_offset).__name__}")
    if "mode" in hyper:
        raise TypeError("mode: the fused bag step is lazy (only touched rows change); use "
                        "pooling= for torch's 'sum' or 'mean'")
    spec, coeffs, names = _fold(optimizer, pooling, steps[0] if steps else 1, hyper)
    folded = {steps[0]: coeffs} if steps else {}
    for step in steps:  # each step number once (a table's own count: fastadam.torch)
        if step not in folded:
            folded[step] = _fold(optimizer, pooling, step, hyper)[1]
            if folded[step].flags != coeffs.flags:
                raise ValueError(f"t: steps {steps[0]} and {step} use different options of "
                                 f"{spec.name}; step these tables in separate calls")
    if not isinstance(state, dict):
        raise TypeError(f"state: expected a dict of state arrays by name {spec.slots}, got "
                        f"{type(state).__name__}")
    unknown = sorted(set(state) - set(spec.slots))
    if unknown:
        raise ValueError(f"state: unknown name {unknown[0]!r} for {spec.name} (its state is "
                         f"{spec.slots})")
    missing = [n for n in names if n not in state]
    if missing:
        raise ValueError(f"state: {spec.name} with these options needs {missing[0]!r} (an "
                         f"array like weight, updated in place; start it at zeros)")

    ids_l = _per_table(ids, "ids", n, single)
    offsets_l = _per_table(offsets, "offsets", n, single, optional=True)
    grads_l = _per_table(grad_out, "grad_out", n, single)
    weights_l = _per_table(per_sample_weights, "per_sample_weights", n, single, optional=True)
    states = {name: _per_table(state[name], f"state[{name!r}]", n, single) for name in names}

    plans = []
    for i, table in enumerate(tables):
        w_name = _label("weight", i, single)
        table = check_array(table, w_name, -1, None, True)
        if table.dtype not in _TABLE_TYPES:
            raise TypeError(f"{w_name}: expected float32 or float64, got {table.dtype}")
        if table.ndim != 2:
            raise ValueError(f"{w_name}: expected a 2-D table (num_embeddings, dim), got "
                             f"shape {table.shape}")
        check_compute_dtype(folded[steps[i]], table.dtype.num, w_name)
        slot_arrays = [check_array(states[name][i], _label(f"state[{name!r}]", i, single),
                                   table.dtype.num, _slot_shape(spec, name, table.shape), True)
                       for name in names]
        flat, lengths = _bags(ids_l[i], offsets_l[i], include_last_offset, table.shape[0],
                              single, i)
        g_name = _label("grad_out", i, single)
        grad = check_array(grads_l[i], g_name, table.dtype.num, (lengths.shape[0],
                                                                    table.shape[1]),
                           contiguous=False)
        psw = weights_l[i]
        if psw is not None:
            p_name = _label("per_sample_weights", i, single)
            if pooling != "sum":
                raise ValueError(f"{p_name}: per-sample weights need pooling='sum' (as "
                                 f"torch), got pooling={pooling!r}")
            psw = check_array(psw, p_name, table.dtype.num, (flat.shape[0],),
                              contiguous=False)
            if not np.isfinite(psw).all():
                at = int(np.argmin(np.isfinite(psw)))
                raise ValueError(f"{p_name}: expected finite weights, got {psw[at]} at "
                                 f"position {at}")
        plans.append((table, slot_arrays, flat, lengths, grad, psw, steps[i]))

    groups = [("weight", [p[0] for p in plans], True)]
    groups += [(f"state[{name!r}]", [p[1][s] for p in plans], True)
               for s, name in enumerate(names)]
    groups += [("grad_out", [p[4] for p in plans], False)]
    groups += [("per_sample_weights", [p[5] for p in plans if p[5] is not None], False)]
    groups += [("ids", [a for a in ids_l if isinstance(a, np.ndarray)], False),
               ("offsets", [a for a in offsets_l if isinstance(a, np.ndarray)], False)]
    check_disjoint(groups, single)

    nt = 0 if num_threads is None else resolve_num_threads(num_threads)  # 0: measured choice
    with sigint_deferred():  # several compiled calls: a Ctrl-C arrives after the last one
        for table, slot_arrays, flat, lengths, grad, psw, step in plans:
            if flat.shape[0] == 0 or table.size == 0:
                continue
            perm, rows, offsets = _sparse.sort_segments(flat, table.shape[0])
            values, source, offsets = _walk_inputs(grad, flat, lengths, pooling, psw, perm,
                                                   offsets, table.dtype, nt)
            args = (folded[step], table, slot_arrays, values, source, rows, offsets, "lazy",
                    None, step)
            run_threaded(_sparse.sparse_step, args, flat.shape[0] * table.shape[1], nt,
                         KIND_SPARSE_STEP["lazy"])
