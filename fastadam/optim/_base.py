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
import types
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._core._threads import resolve_num_threads
from .._stacklevel import caller_stacklevel
from .._core._validation import plain_gradients
from ..gpu import is_device_array
from ..sparse import IndexedSlices
from . import _checkpoint, _lowp_objects
from .._core._lowp_state import is_bfloat16
from ._guard import guarded_step, locked, new_lock
from ._step_path import keep_common_step, optimizer_step
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
    (``[(name, initial_value), ...]`` for a group), ``dense_step`` and ``sparse_step``.

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

    # the common step's reads, kept by _any_step for the compiled step (_step_path.KeptStep);
    # None: the next step is the Python one
    _step_kept = None

    def __init__(self, params: ParamsLike, defaults: Dict[str, Any]):
        self._lock = new_lock()  # steps and checkpoints one at a time (_guard.py)
        self.defaults: Dict[str, Any] = dict(defaults)
        self._options: Dict[str, Any] = {}
        self._clip = check_clip(defaults.get("clip_grad_norm"))
        # low-precision states (_lowp_objects.py): None keeps the float32 path untouched
        self._lowp = None
        self._lowp_options, self._lowp_wanted = _lowp_objects.check_options(defaults)
        self._master_list: List[Optional[np.ndarray]] = []
        self.num_threads = defaults.get("num_threads")
        if self.num_threads is not None:
            resolve_num_threads(self.num_threads)  # a bad count fails here, not at a step
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

    def dense_step(self, xs, gs, slots, t, hyper, lr, grad_scale, skip_nonfinite) -> bool:
        raise NotImplementedError

    #: the ``dense_step`` that ``step_hyper`` describes: while ``dense_step`` is this
    #: function, the dense buckets step through prepared steps (the same update)
    _prepared_dense_step: Optional[Callable] = None

    def sparse_step(self, x, grad, slots, t, hyper, lr) -> None:
        raise NotImplementedError

    def coefficients(self, t: int, hyper: Dict[str, Any], lr: float,
                     grad_scale: Optional[float]) -> Any:
        """The coefficient object of the step after ``t`` steps (the low-precision steps call
        the driver with it, _lowp_objects.py)."""
        raise NotImplementedError(f"{type(self).__name__} has no low-precision states")

    def check_precision(self, hyper: Dict[str, Any], arrays: List[Any]) -> None:
        """The checks that depend on the parameters' dtypes (a value the compute precision
        cannot hold: ``eps=1e-50`` rounds to 0 in float32): the fold of the optimizer's
        prepared step and its dtype checks, with no arrays (an optimizer with a ``dense_step``
        of its own, or low-precision states, runs that step on empty arrays of each dtype).
        The constructor, ``add_param_group``, ``set_hyperparameters`` and ``load`` all run it,
        so no step can fail on them later."""
        lr = 0.0 if callable(hyper["lr"]) else hyper["lr"]
        if self._prepared_capable():
            # the fold of the prepared step, with no arrays: what its ``check`` runs
            spec = registry_spec(self.spec_name)
            kw = self.step_hyper(hyper, lr, None)
            coeffs = spec.fold(self._step_number(self.t, hyper),
                               **({**spec.defaults, **kw} if spec.defaults else kw))
            for dtype in {a.dtype for a in arrays}:
                # low-precision states and bfloat16 parameters are computed in float32
                check_compute_dtype(coeffs, _FLOAT32_NUM if self._lowp is not None
                                    else dtype.num)
            return
        for dtype in {a.dtype for a in arrays}:  # a dense_step of its own: run it on nothing
            empty = {name: [np.empty(0, dtype)] for name, _ in self.slot_specs(hyper)}
            self.dense_step([np.empty(0, dtype)], [np.empty(0, dtype)], empty, self.t, hyper,
                            lr, None, False)

    def step_hyper(self, hyper: Dict[str, Any], lr: float,
                   grad_scale: Optional[float]) -> Dict[str, Any]:
        """The keywords of the optimizer's fold (its functional step's hyper-parameters) for
        a group's ``hyper`` at learning rate ``lr``: what its prepared step is given.  A
        subclass that defines it (with its own ``dense_step``) steps its dense buckets through
        :class:`~fastadam.optim.PreparedStep` objects kept across steps."""
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
            spec = _lowp_objects._spec(self.spec_name)
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
        """Route this optimizer's steps through the low-precision driver (_lowp_objects.py)."""
        self._lowp = self._lowp_options
        self.dense_step = types.MethodType(_lowp_objects.dense_step, self)
        self.sparse_step = types.MethodType(_lowp_objects.sparse_step, self)

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
        self._prepared = [None] * len(self._buckets)  # built at a bucket's first step
        self._step_hypers = [None] * len(self._groups)
        self._step_kept = None

    # ---- prepared steps: one per (group, dtype) bucket, kept across steps ------------------
    def _prepared_capable(self) -> bool:
        """Whether the dense steps go through prepared steps: a float (not low-precision)
        optimizer whose ``dense_step`` is still the one written beside its ``step_hyper``
        (``_prepared_dense_step``); a subclass or a patch that replaces ``dense_step`` is
        called instead."""
        if self.spec_name is None:
            return False
        own = self.__dict__.get("dense_step")  # bound on the instance: its own step
        if own is not None and not (self._lowp is not None and getattr(own, "__func__", None)
                                    is _lowp_objects.dense_step):
            return False
        cls = type(self)
        return cls.dense_step is cls._prepared_dense_step

    def _prepared_for(self, b: int) -> Any:
        """The prepared step of bucket ``b``, built at its first use; False when the bucket
        steps through ``dense_step`` (a low-precision or GPU optimizer, or a subclass or patch
        with its own ``dense_step``)."""
        if self.__dict__.get("_prepared_threads", self.num_threads) != self.num_threads:
            self._prepared = [None] * len(self._buckets)  # num_threads was set: prepare again
        self._prepared_threads = self.num_threads
        p = self._prepared[b]
        if p is None:
            idx = self._buckets[b][1]
            p = False
            if self._prepared_capable() and type(self._arrays[idx[0]]) is np.ndarray:
                spec = registry_spec(self.spec_name)
                functional = dict(zip(spec.object_slots, spec.slots))
                xs = [self._arrays[i] for i in idx]
                lowp = {} if self._lowp is None else _lowp_objects.prepare_options(self, xs)
                p = prepare_step(self.spec_name, xs,
                                 {functional[name]: arrays
                                  for name, arrays in self._bucket_slots[b].items()},
                                 num_threads=self.num_threads, **lowp)
            self._prepared[b] = p
        return p

    def _hyper_of(self, gi: int, lr: float, grad_scale: Optional[float]) -> Dict[str, Any]:
        """Group ``gi``'s fold keywords: one dict kept while the group, ``lr`` and
        ``grad_scale`` are unchanged (and never changed), so that its prepared step knows
        the fold by the dict's identity."""
        h = self._groups[gi]
        kept = self._step_hypers[gi]
        if (kept is None or kept[0] is not h or kept[2] != grad_scale
                or not (kept[1] is lr or (lr == kept[1] and lr != 0.0))):
            kept = self._step_hypers[gi] = (h, lr, grad_scale, self.step_hyper(h, lr, grad_scale),
                                            self._step_number(0, h))
        return kept[3]

    def _bucket_step(self, b: int, xs: List[Any], gs: List[Any], slots: Dict[str, Any],
                     lr: float, grad_scale: Optional[float], skip_nonfinite: bool) -> bool:
        """One compiled call for bucket ``b`` (``xs`` all of its parameters, or some of them
        with ``slots`` cut to match): through its prepared step when it has one and every
        parameter of the bucket steps, else through ``dense_step``."""
        gi = self._buckets[b][0]
        cls = type(self)
        prepared = self._prepared[b]
        if prepared is None or self.num_threads != self._prepared_threads:
            prepared = self._prepared_for(b)
        if (prepared is False or len(xs) != len(self._buckets[b][1])
                or cls.dense_step is not cls._prepared_dense_step):
            return self.dense_step(xs, gs, slots, self.t, self._groups[gi], lr, grad_scale,
                                   skip_nonfinite)
        h = self._groups[gi]
        kept = self._step_hypers[gi]  # _hyper_of, inline: this is every step's path
        if (kept is None or kept[0] is not h or kept[2] != grad_scale
                or not (kept[1] is lr or (lr == kept[1] and lr != 0.0))):
            kept = self._step_hypers[gi] = (h, lr, grad_scale, self.step_hyper(h, lr, grad_scale),
                                            self._step_number(0, h))
        if prepared._lowp is not None and not _lowp_objects.prepared_takes(kept[4], gs):
            return self.dense_step(xs, gs, slots, self.t, h, lr, grad_scale, skip_nonfinite)
        return prepared._step(gs, self.t + kept[4], kept[3], skip_nonfinite)

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
        self._clip = check_clip(value)
        self._step_kept = None

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
        self._step_kept = None

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

    # ``opt.step(grads, *, grad_scale=None, skip_nonfinite=False)``: the common case (one plain
    # list of dense gradients, one bucket, no clipping) compiled in fastadam/optim/_step_path.pyx,
    # which calls _any_step for everything else
    step = optimizer_step

    @guarded_step
    def _any_step(self, grads: Any = None, *, grad_scale: Optional[float] = None,
                  skip_nonfinite: bool = False) -> bool:
        """:meth:`step`, any case (the compiled ``step`` takes the common one first)."""
        self._step_kept = None
        scale = 1.0 if grad_scale is None else check_real(grad_scale, "grad_scale", None)
        if scale == 0.0:
            raise ValueError("grad_scale: expected a non-zero number, got 0.0")
        if skip_nonfinite is not False:
            skip_nonfinite = check_bool(skip_nonfinite, "skip_nonfinite")
        if (type(grads) is not list and len(self._arrays) == 1
                and (type(grads) is np.ndarray or is_device_array(grads))):
            grads = [grads]
        if (self._clip is None and len(self._buckets) == 1 and self.dense_gradients
                and type(grads) in (list, tuple) and len(grads) == len(self._arrays)
                and plain_gradients(grads if type(grads) is list else list(grads),
                                    self._arrays)):
            # the common case: dense arrays of the parameters' dtype and shapes, one group, one
            # dtype, no clipping: one call, whose own checks (in Cython) run before it writes.
            # Decided up front from the gradients' types, dtypes and shapes: no second try.
            if self.__dict__.get("_sparse_seen"):  # every gradient here is dense
                self._note_sparse([("dense", None)] * len(grads), [])
            gi = self._buckets[0][0]
            lr = self._groups[gi]["lr"]
            applied = self._bucket_step(0, self._arrays, grads, self._bucket_slots[0],
                                        self._lr(gi) if callable(lr) else lr,
                                        None if scale == 1.0 else scale, skip_nonfinite)
            if applied is True and not self._tensor_params:
                self.t += 1
                if scale == 1.0 and skip_nonfinite is False:
                    keep_common_step(self)  # the next such step runs compiled
                return True
            return self._finish(applied, range(len(grads)))
        return self._general_step(grads, scale, skip_nonfinite)

    def _general_step(self, grads: Any, scale: float, skip_nonfinite: bool) -> bool:
        """Any mix of gradients: check them all, then one call per (group, dtype) for the dense
        ones and one per sparse gradient."""
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
        lrs = [self._lr(gi) for gi in range(len(self._groups))]
        dense_calls = []
        for b, (gi, idx) in enumerate(self._buckets):
            present = [k for k, i in enumerate(idx)
                       if gathered[i] is not None and gathered[i][0] == "dense"]
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

        if len(dense_calls) + len(sparse) > 1:
            self._check_calls(dense_calls, sparse, lrs, scale)
        applied = True
        for b, gi, present in dense_calls:
            idx = self._buckets[b][1]
            slots = self._bucket_slots[b]
            if len(present) < len(idx):
                slots = {name: [arrays[k] for k in present] for name, arrays in slots.items()}
            applied = self._bucket_step(b, [self._arrays[idx[k]] for k in present],
                                        [gathered[idx[k]][1] for k in present], slots,
                                        lrs[gi], None if scale == 1.0 else scale,
                                        skip_nonfinite)
            if not applied:  # only reachable with a single call: nothing was written
                return False
        for i in sparse:
            gi = self._group_of[i]
            grad = gathered[i][1] if scale == 1.0 else _scaled_sparse(gathered[i][1], scale)
            slots = {name: arrays[i] for name, arrays in self._slots.items()}
            self.sparse_step(self._arrays[i], grad, slots, self.t, self._groups[gi], lrs[gi])
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
        seen.update(sparse)

    def _check_calls(self, dense_calls: Any, sparse: List[int], lrs: List[float],
                     scale: float) -> None:
        """Check every call of a multi-call step before the first writes: the checks that
        depend on the dtype (a hyper-parameter float32 cannot hold) then fail before any call
        has written, so the step stays all or nothing.  A bucket with a prepared step is
        checked by it (a fold, no arrays); the others, and sparse gradients, by their call
        on empty arrays of its dtype."""
        grad_scale = None if scale == 1.0 else scale
        cls = type(self)
        for b, gi, _ in dense_calls:
            prepared = (self._prepared_for(b) if cls.dense_step is cls._prepared_dense_step
                        else False)
            if prepared is not False:
                h = self._groups[gi]
                prepared.check(self._step_number(self.t, h),
                               **self._hyper_of(gi, lrs[gi], grad_scale))
                continue
            dtype = self._arrays[self._buckets[b][1][0]].dtype
            empty = {name: [np.empty(0, dtype)] for name in self._bucket_slots[b]}
            self.dense_step([np.empty(0, dtype)], [np.empty(0, dtype)], empty, self.t,
                            self._groups[gi], lrs[gi], None if scale == 1.0 else scale, False)
        for i in sparse:
            x = self._arrays[i]
            rows = (0,) + x.shape[1:]
            empty = {name: np.empty(self._slot_shape(name, rows), x.dtype)
                     for name in self._slots}
            gi = self._group_of[i]
            self.sparse_step(np.empty(rows, x.dtype),
                             (np.empty(0, np.int64), np.empty(rows, x.dtype)), empty, self.t,
                             self._groups[gi], lrs[gi])

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
        self._step_kept = None
        _checkpoint.load_state_dict(self, state)

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
        self._step_kept = None
        _checkpoint.load(self, path, params=params)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]  # a lock is not pickled; a copy gets its own
        state.pop("dense_step", None)  # the low-precision steps are bound again on load
        state["_prepared"] = None  # prepared steps and their folds are rebuilt on use
        state["_step_hypers"] = None
        state.pop("sparse_step", None)
        state.pop("_step_kept", None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = new_lock()
        self._prepared = [None] * len(self._buckets)
        self._step_hypers = [None] * len(self._groups)
        if "_lowp_options" not in state:  # pickled before low-precision states existed
            self._lowp = None
            self._lowp_options, self._lowp_wanted = _lowp_objects.check_options({})
            self._master_list = [None] * len(self._arrays)
        if self._lowp is not None:
            self._enable_lowp()

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
