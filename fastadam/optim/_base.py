"""``Optimizer``: the base class of Adam, AdamW, Adagrad and SGD.

Design: an optimizer owns a flat list of parameters split into groups (each group with its own
hyper-parameters), named state slots per parameter (``m``/``v`` for Adam, ``sum`` for Adagrad,
``momentum_buffer`` for SGD) and a step count ``t``.  A subclass only says which
hyper-parameters it has, how to check them, which slots it keeps and how to call its functional
step (``fastadam.optim._functional``) on a list of dense tensors or on one sparse gradient.

A step makes one compiled call per (group, dtype) for the dense gradients and one call per
sparse gradient, after every gradient has been checked.  Each (group, dtype) bucket keeps a
:class:`~fastadam.optim.PreparedStep` across steps (rebuilt with the buckets when a group is
added), given the group's fold keywords (``step_hyper``): its arrays are checked once, its
fold is reused while the hyper-parameters are unchanged, and a multi-call step checks its
dense calls by their folds before the first writes.  Global-norm clipping and the NaN check
of ``skip_nonfinite`` share one read of the gradients (``_clip``), and the clip factor is folded
into ``grad_scale``, so no gradient is ever rescaled in memory when the functional step takes a
``grad_scale``.  Hyper-parameters change only through ``set_hyperparameters`` (validated);
``param_groups`` are read-only views.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._core._threads import resolve_num_threads
from .._stacklevel import caller_stacklevel
from ..sparse import IndexedSlices
from . import _checkpoint, _lowp_objects
from .._core._lowp_state import is_bfloat16
from ._guard import guarded_step, locked, new_lock
from ._step_path import optimizer_step
from ._checks import check_bool, check_clip, check_real  # noqa: F401  (the subclasses' too)
from ._clip import CLIP_EPS, coalesce, total_sum_of_squares
from ._params import (check_no_shared_memory, gather_gradients, mark_dirty, param_array,
                      tensor_data)
from ._functional import check_compute_dtype
from ._prepared import prepare_step
from .._core._registry import spec as registry_spec

_FLOAT32_NUM = np.dtype(np.float32).num

ParamsLike = Union[Any, Sequence[Any], Sequence[Dict[str, Any]]]


# ---- small checks shared by the subclasses ---------------------------------------------------
def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


def check_lr(value: Any) -> Union[float, Callable[[int], float]]:
    """A learning rate: a finite float >= 0 (negative is an error, as in torch) or a schedule."""
    if callable(value):
        return value
    return check_real(value, "lr")


class ParamGroup(Mapping):
    """A read-only view of one parameter group: ``group["lr"]``, ``group["params"]``.  Change
    hyper-parameters with ``Optimizer.set_hyperparameters(group=i, ...)``."""

    __slots__ = ("_hyper", "_params")

    def __init__(self, hyper: Dict[str, Any], params: List[Any]):
        self._hyper = hyper
        self._params = params

    def __getitem__(self, key: str) -> Any:
        if key == "params":
            return list(self._params)
        return self._hyper[key]

    def __iter__(self) -> Iterator[str]:
        yield "params"
        yield from self._hyper

    def __len__(self) -> int:
        return len(self._hyper) + 1

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError(f"param_groups are read-only: use "
                        f"optimizer.set_hyperparameters(group=..., {key}=...), which checks "
                        f"the value")

    def __repr__(self) -> str:
        return f"ParamGroup({len(self._params)} params, {self._hyper})"


class Optimizer:
    """Base class: parameter groups, named state slots, a step count and checkpoints.

    Subclasses define ``group_keys`` (per-group hyper-parameters), ``structural_options``
    (optimizer-wide flags that decide the slots, such as Adam's ``amsgrad``), ``check_group`` (validate and normalise one group's
    hyper-parameters, raising TypeError/ValueError naming the argument), ``slot_specs``
    (``[(name, initial_value), ...]`` for a group), ``step_hyper`` (the keywords of its fold)
    and ``spec_name`` (its registry entry); every step runs the plans of
    fastadam/optim/_prepared.py.

    Attributes
    ----------
    t : int
        Steps applied so far (a step skipped by ``skip_nonfinite`` does not count).
    defaults : dict
        The constructor's keyword arguments: ``type(opt)(params, **opt.defaults)`` builds an
        optimizer with the same hyper-parameters.
    """

    group_keys: Tuple[str, ...] = ()
    structural_options: Tuple[str, ...] = ()  # options that decide the slots (e.g. amsgrad)

    #: the optimizer's registry name (fastadam/_core/_registry.py): its slots and formats
    spec_name: Optional[str] = None

    #: False for an optimizer of sparse gradients only (SparseAdam): a dense one is refused
    dense_gradients = True

    def __init__(self, params: ParamsLike, defaults: Dict[str, Any]):
        self._lock = new_lock()  # steps and checkpoints one at a time (_guard.py)
        self.defaults: Dict[str, Any] = dict(defaults)
        self._options: Dict[str, Any] = {}
        self._clip = check_clip(defaults.get("clip_grad_norm"))
        # low-precision states (_lowp_objects.py): None keeps the float32 path untouched
        self._lowp = None
        self._lowp_options, self._lowp_wanted = _lowp_objects.check_options(defaults)
        self._master_list: List[Optional[np.ndarray]] = []
        self._num_threads = defaults.get("num_threads")
        if self._num_threads is not None:
            resolve_num_threads(self._num_threads)  # a bad count fails here, not at a step
        for key in self.structural_options:
            self._options[key] = check_bool(defaults[key], key)
        self._group_defaults = {k: defaults[k] for k in self.group_keys}
        self.check_group(dict(self._group_defaults))  # bad defaults fail before any group
        self._params: List[Any] = []
        self._arrays: List[np.ndarray] = []
        self._labels: List[str] = []
        self._groups: List[Dict[str, Any]] = []
        self._group_params: List[List[int]] = []
        self._slots: Dict[str, List[np.ndarray]] = {}
        self._buckets: List[Tuple[int, List[int]]] = []
        self._bucket_slots: List[Dict[str, List[np.ndarray]]] = []
        self._group_of: List[int] = []
        self._tensor_params = False
        self.t = 0
        params = _as_list(params)
        single = not isinstance(params, list)
        as_groups = not single and len(params) > 0 and isinstance(params[0], dict)
        groups = list(params) if as_groups else [{"params": params}]
        for i, group in enumerate(groups):
            if not isinstance(group, dict):
                raise TypeError(f"params: expected parameters or a list of dicts (groups), "
                                f"got a {type(group).__name__} at position {i}")
            self._add_group(group, f"param_groups[{i}]" if as_groups else None, single)

    # ---- subclass hooks --------------------------------------------------------------------
    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        raise NotImplementedError

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        raise NotImplementedError

    def check_precision(self, hyper: Dict[str, Any], arrays: List[Any]) -> None:
        """The checks that depend on the parameters' dtypes (a value the compute precision
        cannot hold: ``eps=1e-50`` rounds to 0 in float32): the fold of the group's plans, with
        no arrays.  The constructor, ``add_param_group``, ``set_hyperparameters`` and ``load``
        all run it, so no step can fail on them later."""
        lr = 0.0 if callable(hyper["lr"]) else hyper["lr"]
        spec = registry_spec(self.spec_name)
        kw = self.step_hyper(hyper, lr, None)
        coeffs = spec.fold(self._step_number(self.t, hyper),
                           **({**spec.defaults, **kw} if spec.defaults else kw))
        for dtype in {a.dtype for a in arrays}:
            # low-precision states and bfloat16 parameters are computed in float32
            check_compute_dtype(coeffs, _FLOAT32_NUM if self._lowp is not None else dtype.num)

    def step_hyper(self, hyper: Dict[str, Any], lr: float,
                   grad_scale: Optional[float]) -> Dict[str, Any]:
        """The keywords of the optimizer's fold (its functional step's hyper-parameters) for
        a group's ``hyper`` at learning rate ``lr``: what its plans are given."""
        raise NotImplementedError

    @staticmethod
    def _step_number(t: int, hyper: Dict[str, Any]) -> int:
        """The step number the functional step takes after ``t`` applied steps: ``t`` plus
        an offset that depends on ``hyper`` only (its convention)."""
        return t + 1

    def sparse_unsupported(self, hyper: Dict[str, Any]) -> Optional[str]:
        """Why a sparse gradient cannot be used with these hyper-parameters (None: it can)."""
        return None

    # ---- groups ----------------------------------------------------------------------------
    def _add_group(self, group: Dict[str, Any], where: Optional[str], single: bool) -> None:
        if "params" not in group:
            raise ValueError(f"{where or 'param_group'}: missing key 'params'")
        unknown = sorted(set(group) - set(self.group_keys) - {"params"})
        if unknown:
            raise ValueError(f"{where or 'param_group'}: unknown hyper-parameter "
                             f"{unknown[0]!r} (expected one of {self.group_keys})")
        hyper = dict(self._group_defaults)
        hyper.update({k: v for k, v in group.items() if k != "params"})
        try:
            hyper = self.check_group(hyper)
        except (TypeError, ValueError) as exc:
            if where is None:
                raise
            raise type(exc)(f"{where}: {exc}") from None
        params = _as_list(group["params"])
        plist = params if isinstance(params, list) else [params]
        start = len(self._params)
        single = single and not isinstance(params, list)
        labels = ["params" if single else f"params[{start + j}]" for j in range(len(plist))]
        arrays = [param_array(p, label) for p, label in zip(plist, labels)]
        if self._lowp is None and (self._lowp_wanted
                                   or any(is_bfloat16(a.dtype) for a in arrays)):
            if self._arrays:
                raise TypeError(f"{where or 'params'}: bfloat16 parameters join an optimizer "
                                f"built with bfloat16 parameters or a low-precision "
                                f"state_dtype; this one keeps float32 states")
            _lowp_objects.check_params(self._lowp_options, self._arrays + arrays,
                                       self._labels + labels)
            self._enable_lowp()
        elif self._lowp is not None:
            _lowp_objects.check_params(self._lowp, self._arrays + arrays, self._labels + labels)
        try:
            self.check_precision(hyper, arrays)
        except (TypeError, ValueError) as exc:
            if where is None:
                raise
            raise type(exc)(f"{where}: {exc}") from None
        check_no_shared_memory(self._arrays + arrays, self._labels + labels)
        specs = self.slot_specs(hyper)
        masters: List[Optional[np.ndarray]] = [None] * len(arrays)
        if self._lowp is None:
            new_slots = {name: [_new_slot(a, fill, self._slot_shape(name, a.shape))
                                for a in arrays] for name, fill in specs}
        else:
            spec = registry_spec(self.spec_name)
            new_slots = {name: [_lowp_objects.new_slot(self._lowp, spec, name, a, fill)
                                for a in arrays] for name, fill in specs}
            if self._lowp.master_weights:
                masters = [a.astype(np.float32) if is_bfloat16(a.dtype) else None
                           for a in arrays]
        # every check passed: commit
        for name, arrs in new_slots.items():
            self._slots.setdefault(name, [None] * start).extend(arrs)
        self._master_list += masters
        self._params += plist
        self._arrays += arrays
        self._labels += labels
        self._groups.append(hyper)
        self._group_params.append(list(range(start, start + len(plist))))
        self._rebuild_buckets()

    def _slot_shape(self, name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The shape of state slot ``name`` of a parameter of ``shape``: the spec's (one value
        per row for a row-wise optimizer's row slots), else ``shape``."""
        return shape if self.spec_name is None else registry_spec(self.spec_name).slot_shape(
            name, shape)

    def _enable_lowp(self) -> None:
        """Keep low-precision states or parameters (an optimizer that has none refuses)."""
        self._lowp = self._lowp_options

    @property
    def _masters(self) -> Dict[int, np.ndarray]:
        """The float32 master of each bfloat16 parameter (by the parameter array's id)."""
        return {id(a): m for a, m in zip(self._arrays, self._master_list) if m is not None}

    @property
    def state_dtype(self) -> str:
        """The format of the optimizer state: "float32", "bfloat16" or "int8"."""
        return self._lowp_options.state_dtype

    def state_bytes(self) -> int:
        """Bytes of optimizer state: every slot (8-bit ones: codes and scales) and the float32
        masters of bfloat16 parameters (``master_weights=True``)."""
        return _lowp_objects.state_bytes(self)

    def state_bytes_per_param(self) -> float:
        """:meth:`state_bytes` per parameter element (float32 Adam 8.0, bfloat16 Adam 4.0,
        8-bit Adam with block 256: 2 + 8/256 = 2.03125)."""
        n = sum(int(a.size) for a in self._arrays)
        return self.state_bytes() / n if n else 0.0

    @locked
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group: ``{"params": [...], **hyper-parameters}``; hyper-parameters not given
        take the constructor's values.  Its state starts fresh."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group: expected a dict, got {type(param_group).__name__}")
        self._add_group(param_group, "param_group", False)

    def _rebuild_buckets(self) -> None:
        """One bucket per (group, dtype, state format): each becomes one compiled call per
        step.  The slot lists of each bucket are kept (the slot arrays are only ever updated in
        place)."""
        self._buckets = []
        for gi, indices in enumerate(self._group_params):
            by_dtype: Dict[Tuple[np.dtype, int], List[int]] = {}
            for i in indices:
                key = (self._arrays[i].dtype, _lowp_objects.state_kind(self, i))
                by_dtype.setdefault(key, []).append(i)
            self._buckets += [(gi, idx) for idx in by_dtype.values()]
        self._bucket_slots = [{name: [arrays[i] for i in idx]
                               for name, arrays in self._slots.items()}
                              for _, idx in self._buckets]
        self._group_of = [gi for gi, idx in enumerate(self._group_params) for _ in idx]
        self._tensor_params = any(tensor_data(p) is not None for p in self._params)
        self._rebuild_plans()

    # ---- plans: one per (group, dtype, state format) bucket --------------------------------
    def _make_plan(self, idx: List[int]) -> Any:
        """The step plan of the parameters ``idx`` (one bucket, or some of its parameters)."""
        spec = registry_spec(self.spec_name)
        functional = dict(zip(spec.object_slots, spec.slots))
        xs = [self._arrays[i] for i in idx]
        lowp = {} if self._lowp is None else _lowp_objects.prepare_options(self, xs)
        return prepare_step(self.spec_name, xs,
                            {functional[name]: [arrays[i] for i in idx]
                             for name, arrays in self._slots.items()},
                            num_threads=self._num_threads, **lowp)

    def _rebuild_plans(self) -> None:
        """A plan per bucket (built again by everything that changes the buckets or the thread
        count), then :meth:`_refresh`."""
        self._plans = [self._make_plan(idx) for _, idx in self._buckets]
        self._where = [(b, k) for b, (_, idx) in enumerate(self._buckets) for k in range(len(idx))]
        order = [i for _, idx in self._buckets for i in idx]
        self._where = [w for _, w in sorted(zip(order, self._where))]
        self._step_hypers = [None] * len(self._groups)
        self._refresh()

    def _refresh(self) -> None:
        """``_common``: (the plan, its group) when one plan covers every parameter and a plain
        list of dense gradients needs nothing else (no clipping, no Tensors to mark, a fixed
        learning rate, no sparse gradients seen): ``optimizer_step`` then runs that plan
        itself (fastadam/optim/_step_path.pyx).  Every method that changes one of these calls
        it."""
        self._common = None
        if (len(self._plans) == 1 and self._clip is None and self.dense_gradients
                and not self._tensor_params and not self.__dict__.get("_sparse_seen")
                and not callable(self._groups[self._buckets[0][0]]["lr"])):
            self._common = (self._plans[0], self._buckets[0][0])

    @property
    def num_threads(self) -> Optional[int]:
        """OpenMP threads per call (None: the measured choice); settable."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, value: Optional[int]) -> None:
        if value is not None:
            resolve_num_threads(value)  # a bad count fails here, not at a step
        with self._lock:
            self._num_threads = value
            if "_plans" in self.__dict__:
                self._rebuild_plans()

    def _hyper_of(self, gi: int, lr: float, grad_scale: Optional[float]) -> Dict[str, Any]:
        """Group ``gi``'s fold keywords: one dict kept while the group, ``lr`` and
        ``grad_scale`` are unchanged (and never changed), so that its plan knows the fold by
        the dict's identity."""
        h = self._groups[gi]
        kept = self._step_hypers[gi]
        if (kept is None or kept[0] is not h or kept[2] != grad_scale
                or not (kept[1] is lr or (lr == kept[1] and lr != 0.0))):
            kept = self._step_hypers[gi] = (h, lr, grad_scale, self.step_hyper(h, lr, grad_scale),
                                            self._step_number(0, h))
        return kept[3]

    @property
    def params(self) -> List[Any]:
        """The parameters, in order (groups one after another), as they were given."""
        return list(self._params)

    @property
    def param_groups(self) -> List[ParamGroup]:
        """Read-only views of the groups (``group["lr"]``, ``group["params"]``, ...)."""
        return [ParamGroup(h, [self._params[i] for i in idx])
                for h, idx in zip(self._groups, self._group_params)]

    @property
    def hyperparameters(self) -> Dict[str, Any]:
        """A copy of the first group's hyper-parameters."""
        return dict(self._groups[0]) if self._groups else dict(self._group_defaults)

    @property
    def slot_names(self) -> Tuple[str, ...]:
        return tuple(self._slots)

    def state(self, param: Union[int, Any]) -> Dict[str, np.ndarray]:
        """The named state slots of one parameter (given by index or by the object itself);
        the arrays themselves, updated in place by every step."""
        i = param if isinstance(param, numbers.Integral) else next(
            (k for k, p in enumerate(self._params) if p is param), None)
        if i is None or not 0 <= i < len(self._params):
            raise IndexError(f"param: {param!r} is not a parameter of this optimizer")
        return {name: arrays[i] for name, arrays in self._slots.items()}

    @property
    def clip_grad_norm(self) -> Optional[float]:
        """The global-norm clipping threshold (None: no clipping); settable."""
        return self._clip

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: Optional[float]) -> None:
        with self._lock:
            self._clip = check_clip(value)
            self._refresh()

    @locked
    def set_hyperparameters(self, group: Optional[int] = 0, **hyper: Any) -> None:
        """Change hyper-parameters of one group (``group=i``) or of every group
        (``group=None``); each value is checked as by the constructor, and nothing changes if
        one is invalid.  ``opt.set_hyperparameters(group=0, lr=1e-4)``."""
        n = len(self._groups)
        if group is None:
            targets = list(range(n))
        elif isinstance(group, numbers.Integral) and not isinstance(group, bool) and 0 <= group < n:
            targets = [int(group)]
        else:
            raise IndexError(f"group: expected a group index in [0, {n}) or None, got {group!r}")
        for key in hyper:
            if key in self.structural_options:
                raise ValueError(f"{key}: fixed when the optimizer is built (it decides the "
                                 f"state slots)")
            if key not in self.group_keys:
                raise ValueError(f"{key}: unknown hyper-parameter (expected one of "
                                 f"{self.group_keys})")
        updated = [self.check_group({**self._groups[gi], **hyper}) for gi in targets]
        for gi, h in zip(targets, updated):
            self.check_precision(h, [self._arrays[i] for i in self._group_params[gi]])
        for gi, h in zip(targets, updated):
            self._groups[gi] = h
        self._refresh()

    # ---- stepping --------------------------------------------------------------------------
    def _lr(self, gi: int) -> float:
        lr = self._groups[gi]["lr"]
        if not callable(lr):
            return lr
        value = lr(self.t)
        try:
            return check_real(value, "lr")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"lr: the schedule of group {gi} returned {value!r} at step "
                            f"{self.t}; expected a finite number >= 0") from None

    # ``opt.step(grads, *, grad_scale=None, skip_nonfinite=False)``, compiled
    # (fastadam/optim/_step_path.pyx): the one-plan case runs that plan, anything else _step
    step = optimizer_step

    @guarded_step
    def _step(self, grads: Any = None, *, grad_scale: Optional[float] = None,
              skip_nonfinite: bool = False) -> bool:
        """:meth:`step`, any gradients: check them all, then one plan run per bucket for the
        dense ones and one per sparse gradient (every run checked before the first writes)."""
        scale = 1.0 if grad_scale is None else check_real(grad_scale, "grad_scale", None)
        if scale == 0.0:
            raise ValueError("grad_scale: expected a non-zero number, got 0.0")
        if skip_nonfinite is not False:
            skip_nonfinite = check_bool(skip_nonfinite, "skip_nonfinite")
        gathered = gather_gradients(grads, self._params, self._arrays, self._labels)
        sparse = [i for i, e in enumerate(gathered) if e is not None and e[0] == "sparse"]
        if not self.dense_gradients:
            for i, e in enumerate(gathered):
                if e is not None and e[0] == "dense":
                    raise TypeError(f"grads[{i}]: {type(self).__name__} takes sparse gradients "
                                    f"only (IndexedSlices or CSR); got a dense one")
        self._note_sparse(gathered, sparse)
        for i in sparse:
            why = self.sparse_unsupported(self._groups[self._group_of[i]])
            if why:
                raise ValueError(f"grads[{i}]: a sparse gradient cannot be used with {why}")
            if self._lowp is not None:
                _lowp_objects.check_sparse(self, i)
        dense_calls = []
        for b, (gi, idx) in enumerate(self._buckets):
            present = [i for i in idx if gathered[i] is not None and gathered[i][0] == "dense"]
            if present:
                dense_calls.append((b, gi, present))
        if self._clip is not None or (skip_nonfinite and (sparse or len(dense_calls) > 1)):
            # one read of every gradient: the global norm, which is finite iff every value is
            for i in sparse:
                gathered[i] = ("sparse", coalesce(gathered[i][1]))
            total = total_sum_of_squares([e[1] for e in gathered if e is not None])
            norm = math.sqrt(total) / abs(scale)
            if not math.isfinite(norm):
                if skip_nonfinite:
                    return False
            elif self._clip is not None:
                factor = self._clip / (norm + CLIP_EPS)
                if factor < 1.0:
                    scale /= factor
            skip_nonfinite = False  # checked above
        lrs = [self._lr(gi) for gi in range(len(self._groups))]
        grad_scale = None if scale == 1.0 else scale
        t, key = self.t, self.t + 1  # key: the step number of stochastic rounding
        runs = []  # (plan, dense gradients or (k, sparse gradient, mode), t, fold keywords)
        for b, gi, present in dense_calls:
            if len(present) == len(self._buckets[b][1]):
                plan = self._plans[b]
            else:  # some of a bucket's parameters: a plan of their own, named as the user does
                _lowp_objects.check_writable(self, present)
                plan = self._make_plan(present)
            gs = [gathered[i][1] for i in present]
            if self._lowp is not None:
                gs = _lowp_objects.grads_for(plan, gs)
            runs.append((plan, gs, t + self._step_number(0, self._groups[gi]),
                         self._hyper_of(gi, lrs[gi], grad_scale)))
        for i in sparse:
            h = self._groups[self._group_of[i]]
            b, k = self._where[i]
            grad = gathered[i][1] if scale == 1.0 else _scaled_sparse(gathered[i][1], scale)
            runs.append((self._plans[b], (k, grad, h.get("sparse_mode", "lazy")),
                         t + self._step_number(0, h), self._hyper_of(self._group_of[i],
                                                                     lrs[self._group_of[i]],
                                                                     None)))
        if len(runs) > 1:  # every fold checked before the first run writes: all or nothing
            for plan, _, tn, hyper in runs:
                plan.check(tn, **hyper)
        applied = True
        for plan, gs, tn, hyper in runs:
            if type(gs) is tuple:
                plan._run_sparse(gs[0], gs[1], tn, hyper, gs[2], key)
            else:
                applied = plan._step(gs, tn, hyper, skip_nonfinite, key)
                if not applied:  # only reachable with a single run: nothing was written
                    return False
        return self._finish(applied, [i for i, e in enumerate(gathered) if e is not None])

    def _note_sparse(self, gathered: Any, sparse: List[int]) -> None:
        """Remember which parameters had sparse gradients; warn once when one gets a dense
        gradient (a dense penalty on an embedding, say: every row steps from then on)."""
        seen = self.__dict__.setdefault("_sparse_seen", set())
        if seen and not self.__dict__.get("_warned_dense_after_sparse"):
            for i in seen:
                if gathered[i] is not None and gathered[i][0] == "dense":
                    self._warned_dense_after_sparse = True
                    warnings.warn(f"grads[{i}]: this parameter had sparse gradients and now has "
                                  f"a dense one: every row steps from now on (a dense term such "
                                  f"as an L2 penalty on an embedding makes its gradient dense)",
                                  RuntimeWarning, stacklevel=caller_stacklevel())
                    break
        if sparse and not seen.issuperset(sparse):
            seen.update(sparse)
            self._refresh()  # a dense step now checks for a parameter that had sparse ones

    def _finish(self, applied: bool, stepped: Any) -> bool:
        if applied:
            self.t += 1
            if self._tensor_params:
                mark_dirty(self._params, stepped)  # changed in place, as autodiff's -= marks
        return applied

    def zero_grad(self) -> None:
        """Clear the ``.grad`` of every ``fastadam.autodiff.Tensor`` parameter (set to None)."""
        for p in self._params:
            if tensor_data(p) is not None:
                p.grad = None

    @locked
    def zero_state(self) -> None:
        """Reset every state slot to its initial value and ``t`` to 0 (hyper-parameters and
        parameters are kept)."""
        for gi, idx in enumerate(self._group_params):
            for name, fill in self.slot_specs(self._groups[gi]):
                for i in idx:
                    self._slots[name][i].fill(fill)
        self.t = 0

    # ---- state and checkpoints (fastadam/optim/_checkpoint.py) -----------------------------
    @locked
    def state_dict(self) -> Dict[str, Any]:
        """A copy of the state: ``t``, the groups' hyper-parameters (schedules by name and
        arguments), the options, and one list of arrays per slot name."""
        return _checkpoint.state_dict(self)

    @locked
    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.  Everything is checked first (keys, types, group
        layout, array dtypes and shapes); a failed load raises and changes nothing."""
        _checkpoint.load_state_dict(self, state)
        self._refresh()

    @locked
    def save(self, path: Any) -> None:
        """Write parameters and state to ``path`` (a zip of ``.npy`` entries, no pickle),
        atomically: a temporary file in the same folder, flushed and fsynced, then renamed over
        ``path``, so a crash or a full disk leaves the previous file whole (a killed process may
        leave a ``.NAME.*.tmp`` file beside it).  :meth:`load` resumes bit-exactly."""
        _checkpoint.save(self, path)

    @locked
    def load(self, path: Any, *, params: bool = True) -> None:
        """Read a file written by :meth:`save` (and, with ``params=True``, copy the saved
        parameter values into the parameters).  The file is not trusted: its layout, every key,
        type and array header are checked before any array is read, and a failed load changes
        nothing."""
        _checkpoint.load(self, path, params=params)
        self._refresh()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]  # a lock is not pickled; a copy gets its own
        for key in ("_plans", "_common", "_step_hypers", "_where"):
            state.pop(key, None)  # plans and their folds are built again on load
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        for key in ("dense_step", "sparse_step", "_step_kept", "_prepared",
                    "_prepared_threads"):
            state.pop(key, None)  # pickled by an older fastadam
        if "num_threads" in state:
            state["_num_threads"] = state.pop("num_threads")
        self.__dict__.update(state)
        self._lock = new_lock()
        if "_lowp_options" not in state:  # pickled before low-precision states existed
            self._lowp = None
            self._lowp_options, self._lowp_wanted = _lowp_objects.check_options({})
            self._master_list = [None] * len(self._arrays)
        self._rebuild_plans()

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}(t={self.t}, clip_grad_norm={self._clip}, "
                 f"num_threads={self.num_threads}"
                 + "".join(f", {k}={v!r}" for k, v in self._options.items())
                 + ("" if self.__dict__.get("_lowp") is None else
                    "".join(f", {k}={v!r}" for k, v in self._lowp.as_dict().items())) + ")"]
        for gi, (h, idx) in enumerate(zip(self._groups, self._group_params)):
            dtypes: Dict[str, int] = {}
            for i in idx:
                dtypes[str(self._arrays[i].dtype)] = dtypes.get(str(self._arrays[i].dtype), 0) + 1
            kinds = ", ".join(f"{n} {d}" for d, n in dtypes.items())
            hypers = ", ".join(f"{k}={v!r}" for k, v in h.items())
            lines.append(f"  group {gi}: {len(idx)} params ({kinds}): {hypers}")
        return "\n".join(lines)


def _new_slot(a: np.ndarray, fill: float, shape: Tuple[int, ...]) -> np.ndarray:
    """A float state slot of parameter ``a`` filled with ``fill``: like ``a``, or of ``shape``
    (one value per row) for a row-wise optimizer's row slot."""
    return np.full_like(a, fill) if shape == a.shape else np.full_like(a, fill, shape=shape)


def _as_list(params: Any) -> Any:
    """A list of parameters from a list, tuple or other iterable (a generator, as torch's
    ``model.parameters()``); a single array or Tensor is returned as it is."""
    if isinstance(params, (np.ndarray, dict, str, bytes)) or tensor_data(params) is not None:
        return params
    if isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        return list(params)
    return params


def _scaled_sparse(grad: Any, scale: float) -> Any:
    """A copy of a sparse gradient divided by ``scale`` (its values only: O(nnz))."""
    if isinstance(grad, IndexedSlices):
        values = (grad.values / np.float64(scale)).astype(grad.values.dtype)
        return IndexedSlices(values, grad.indices, grad.dense_shape)
    out = grad.copy()
    out.data = (out.data / np.float64(scale)).astype(out.data.dtype)
    return out
