"""The shared machinery of fastadam's ``torch.optim.Optimizer`` subclasses.

Design: a subclass is a real ``torch.optim.Optimizer`` (``param_groups``, ``state``, hooks,
``zero_grad``, ``state_dict`` are torch's own), whose ``step`` hands the tensors to fastadam's
public prepared steps (:func:`fastadam.optim.prepare_step`) as NumPy views: ``Tensor.numpy()``
shares memory with a CPU tensor, so the compiled kernels update the parameters and the state
tensors in place, one compiled call per (group, dtype, step count).  The state keeps torch's
names and types (``step`` a scalar tensor of torch's scalar dtype, ``exp_avg`` ... tensors
like the parameter), so a checkpoint moves between ``torch.optim`` and ``fastadam.torch``
both ways.

A step is all or nothing, in two phases:

1. **plan** (nothing written): every group's hyper-parameters are checked; every parameter
   with a gradient gets its entry (NumPy views of the parameter and its state, rebuilt when a
   tensor object or its memory changed: ``p.data = ...``, ``state[k].data = ...``, ``.set_()``,
   a tensor put in ``opt.state``); a parameter without state gets new state tensors that are
   not installed yet; the step count is read from each ``state["step"]`` (so an in-place edit
   such as ``.fill_(0)`` is honoured, as in torch); the gradients are checked; the dense calls
   are grouped and their prepared steps built (arrays checked once: dtypes, shapes, no two
   written buffers overlapping); when the step makes more than one compiled call, each call's
   hyper-parameters are folded for its dtype (``PreparedStep.check``), every sparse call is
   checked, and no gradient may overlap a written tensor.
2. **apply**: new state is installed, the calls run, the step counts advance.  With more than
   one call the phase runs under :class:`fastadam.optim.sigint_deferred`, so Ctrl-C arrives
   after the whole step.

A subclass says which state tensors a parameter has (``_state_init``, ``_slot_keys``), the
registry name and slot names of its prepared step (``_spec_name``, ``_slot_names``), its
hyper-parameters as the functional step's keywords (``_hyper``) and its sparse step.
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

from .. import IndexedSlices
from ..optim import prepare_step, sigint_deferred
from . import _formats
from ._formats import (MASTER_KEY, REAL_DTYPES, SUPPORTED_DTYPES, check_state_options,
                       kernel_array, memory_span, state_format, strides_non_overlapping)
#: torch option keys kept in the groups for checkpoint compatibility, accepted only at their
#: no-op values (fastadam is its own fused, multi-threaded implementation)
TORCH_ONLY_FLAGS = ("capturable", "differentiable")
#: the largest step count handled exactly (a float64 holds every whole number below it)
MAX_STEP = 2.0 ** 53
#: prepared steps kept per (group, dtype): the calls of the last few sets of parameters
_PREPARED_KEPT = 4


def number(value: Any, name: str) -> float:
    """A Python float from a float, int, 0-d tensor or 0-d array (what schedulers store)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a number or a one-element tensor, got a tensor "
                             f"of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite number, got {value!r} (too large for a "
                         f"float)") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}") from None


def flag(value: Any, name: str) -> bool:
    """A bool from a bool-like option (``amsgrad``, ``maximize`` ...)."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {value!r}")


def check_range(value: float, name: str, low: float, high: Optional[float] = None,
                high_open: bool = True) -> float:
    if not np.isfinite(value) or value < low or (
            high is not None and (value >= high if high_open else value > high)):
        bound = "" if high is None else (f" and < {high}" if high_open else f" and <= {high}")
        raise ValueError(f"{name}: expected a finite value >= {low}{bound}, got {value}")
    return value


def scalar_dtype() -> torch.dtype:
    """The dtype torch gives a new ``step`` tensor: float64 under a float64 default dtype,
    else float32 (torch.optim.optimizer._get_scalar_dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def new_step() -> torch.Tensor:
    return torch.tensor(0.0, dtype=scalar_dtype())


_LIBRARY_DIRS = (os.path.dirname(sys.modules["fastadam"].__file__) + os.sep,
                 os.path.dirname(torch.__file__) + os.sep)


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first frame outside fastadam and
    torch (torch wraps ``step`` in its hooks and ``no_grad``, so the depth varies)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def param_name(gi: int, i: int) -> str:
    """How errors and warnings name parameter ``i`` of group ``gi``."""
    return f"param_groups[{gi}]['params'][{i}]"


# ---- DTensor parameters (FSDP2's ``fully_shard``): stepped on their local shards -------------
def dtensor_class() -> Optional[type]:
    """``DTensor``, or None while no DTensor can exist (``torch.distributed.tensor`` not
    imported: importing it takes half a second, and a step then pays nothing for DTensors)."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def local_tensor(tensor: Any) -> Any:
    """The tensor a step reads and writes in place: a DTensor's local shard (its memory is
    the DTensor's; a DTensor's own ``data_ptr()`` is 0), any other object itself."""
    dtensor = dtensor_class()
    if dtensor is not None and isinstance(tensor, dtensor):
        return tensor.to_local()  # under no_grad, the DTensor's own local tensor
    return tensor


def check_sharded_like(tensor: torch.Tensor, p: torch.Tensor, label: str) -> None:
    """A state tensor of a DTensor parameter is a DTensor on the same mesh with the same
    placements (as torch.optim makes it: ``torch.zeros_like(p)``), and a plain parameter's
    state is a plain tensor: the kernels step the local shards element by element."""
    dtensor = dtensor_class()
    if dtensor is None:
        return
    if isinstance(p, dtensor) != isinstance(tensor, dtensor):
        want = "a DTensor like the parameter" if isinstance(p, dtensor) else "a plain tensor"
        raise ValueError(f"{label}: expected {want}, got a "
                         f"{'DTensor' if isinstance(tensor, dtensor) else 'plain tensor'}")
    if isinstance(p, dtensor) and (tensor.device_mesh != p.device_mesh
                                   or tuple(tensor.placements) != tuple(p.placements)):
        raise ValueError(f"{label}: expected a DTensor with the parameter's mesh and placements "
                         f"{tuple(p.placements)}, got {tuple(tensor.placements)} on "
                         f"{tensor.device_mesh}")


def check_tensor(tensor: Any, name: str, dtypes: Tuple[Any, ...] = SUPPORTED_DTYPES) -> None:
    """A dense CPU tensor of a dtype the kernels step (see ``_formats.py``)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(tensor).__name__}")
    tensor = local_tensor(tensor)
    if tensor.device.type != "cpu":
        raise ValueError(f"{name}: fastadam.torch steps CPU tensors; got one on "
                         f"{tensor.device} (use torch.optim for device tensors)")
    if tensor.layout is not torch.strided:
        raise ValueError(f"{name}: expected a dense (strided) tensor, got layout "
                         f"{tensor.layout}")
    if tensor.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported by fastadam's kernels "
                        f"(float32, float64, float16, bfloat16 and complex are); keep such "
                        f"parameters in a torch.optim optimizer")


def check_param(p: Any, name: str) -> None:
    """A parameter fastadam.torch can step (a non-contiguous one through a contiguous copy,
    if no two of its elements share memory)."""
    check_tensor(p, name)
    p = local_tensor(p)  # a DTensor's local shard: the memory the step writes
    if not p.is_contiguous() and (any(st < 0 for st in p.stride())
                                  or not strides_non_overlapping(p)):
        raise ValueError(f"{name}: its elements overlap in memory (strides {p.stride()}); "
                         f"an optimizer step needs one memory location per element")


def numpy_view(tensor: Any, name: str, dtypes: Tuple[Any, ...] = SUPPORTED_DTYPES
               ) -> np.ndarray:
    """The array the kernels write, sharing ``tensor``'s memory (CPU, contiguous, a supported
    dtype; bfloat16 and complex tensors as ``_formats.kernel_array`` sees them); a DTensor's
    is its local shard's."""
    check_tensor(tensor, name, dtypes)
    tensor = local_tensor(tensor)
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (fastadam updates it in place "
                         f"through a NumPy view), got strides {tensor.stride()}")
    return kernel_array(tensor.detach())


#: the dtypes of the state tensors of low-precision formats besides the parameters' (8-bit
#: codes)
STATE_TENSOR_DTYPES = SUPPORTED_DTYPES + (torch.uint8,)


def step_count(value: Any, name: str) -> float:
    """A step count read from ``state["step"]``: a whole number in [0, 2**53)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a one-element tensor, got shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number or a one-element tensor, got "
                        f"{type(value).__name__}")
    v = float(value) if abs(value) < 1e300 else math.inf
    if not (0.0 <= v < MAX_STEP) or v != math.floor(v):
        raise ValueError(f"{name}: expected a whole number of steps >= 0 and < 2**53, got "
                         f"{value}")
    return v


_KINDS: Dict[Tuple[Any, Any, bool], Tuple[Any, Any, bool]] = {}


def _kind(dtype: Any, fmt: Optional[str], master: bool) -> Tuple[Any, Any, bool]:
    """One tuple object per (array dtype, state format, master): entries compare by
    identity in every step."""
    key = (dtype, fmt, master)
    return _KINDS.setdefault(key, key)


class _Entry:
    """One parameter as the kernels see it: its NumPy view and its state tensors' views, with
    the tensor objects (``step`` included) and the data pointers they were made from (an entry
    is valid while all are unchanged: checked at every step)."""

    __slots__ = ("p", "ptr", "x", "state", "keys", "slots", "views", "step_view",
                 "number_step", "fresh", "written", "kind", "tmp", "master", "plain_grad",
                 "grad_view", "formats")

    def __init__(self, p, x, state, keys, tensor_keys, tensors, views, step_view, number_step,
                 fresh, written, kind=None, tmp=None, master=None, formats=(None, False)):
        self.p, self.x, self.state, self.keys = p, x, state, keys
        self.ptr = local_tensor(p).data_ptr()  # a DTensor's: its local shard's
        # what splits the compiled calls: (array dtype, state format, master copy)
        self.kind = kind if kind is not None else _kind(x.dtype, None, False)
        self.tmp = tmp  # the contiguous copy a non-contiguous parameter steps through
        self.master = master  # the float32 master's array (master_weights), else None
        # the gradient is seen as ``grad.numpy()`` (a real dtype), else through grad_view
        self.plain_grad = p.dtype in REAL_DTYPES
        self.grad_view = _formats.KERNEL_VIEWS[p.dtype]
        self.formats = formats  # the group's (state_dtype, master_weights) it was made for
        self.slots = tuple((k, t, local_tensor(t).data_ptr())
                           for k, t in zip(tensor_keys, tensors))
        self.views = views  # of the state tensors of ``keys``, in the kernel's order
        self.step_view = step_view  # None: no step tensor
        self.number_step = number_step  # ``step`` is a Python number (torch's SparseAdam)
        self.fresh = fresh  # its state is new, not installed yet
        self.written = written  # ((data_ptr, nbytes, label), ...) of what a step writes


class FastadamOptimizer(torch.optim.Optimizer):
    """Base class: see the module docstring."""

    #: state tensors of one parameter besides ``step``, in the order the kernel takes them
    _state_keys: Tuple[str, ...] = ()
    #: the functional (prepared step) name of each state tensor
    _slot_names: Dict[str, str] = {}
    #: the registry name of the dense prepared step (None: no dense gradients)
    _spec_name: Optional[str] = None
    #: whether a gradient may be a sparse COO tensor (nn.Embedding(sparse=True))
    _takes_sparse = True
    _takes_dense = True
    #: whether the state keeps a ``step`` count (torch's SGD has none)
    _counts_steps = True
    #: torch's group defaults filled in by ``__setstate__`` (a state dict of an older torch)
    _group_fill: Dict[str, Any] = {}

    def __init__(self, params: Any, defaults: Dict[str, Any], num_threads: Optional[int],
                 state_dtype: Optional[str] = None, master_weights: bool = False):
        # fastadam's state options join the groups only when asked for (a state dict without
        # them is torch's)
        if state_dtype is not None:
            defaults["state_dtype"] = state_dtype
        if master_weights is not False:
            defaults["master_weights"] = master_weights
        check_state_options(defaults)
        for key in TORCH_ONLY_FLAGS:
            if defaults.get(key):
                raise ValueError(f"{key}: fastadam.torch optimizers do not support "
                                 f"{key}=True (use torch.optim for that)")
        self.num_threads = num_threads
        self._reset_caches()
        self._check_group(dict(defaults))  # the hyper-parameters before the parameter list
        super().__init__(params, defaults)

    def _reset_caches(self) -> None:
        self._entries: Dict[int, _Entry] = {}  # id(parameter): its entry
        self._prepared: Dict[Tuple[int, Any], list] = {}  # (group, dtype): [(entries, step)]
        self._written_ranges = None  # see _check_before_writes
        self._sparse_seen: set = set()
        self._warned_dense_after_sparse = False
        self._writes_back: list = []  # the step's entries stepped through a contiguous copy

    # ---- hooks for subclasses ----------------------------------------------------------------
    def _check_group(self, group: Dict[str, Any]) -> Dict[str, Any]:
        """The group's hyper-parameters as Python numbers, validated (a new dict)."""
        raise NotImplementedError

    def _state_init(self, p: torch.Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        raise NotImplementedError

    def _slot_keys(self, group: Dict[str, Any]) -> Tuple[str, ...]:
        """The state tensors the kernel takes for a parameter of ``group``, in its order."""
        return self._state_keys

    def _hyper(self, h: Dict[str, Any]) -> Dict[str, Any]:
        """The functional step's keywords (no ``num_threads``) for checked hyper-parameters."""
        raise NotImplementedError

    def _step_sparse(self, x, grad, slots, t, h) -> None:
        raise NotImplementedError

    def _plain(self, h: Dict[str, Any]) -> bool:
        """Whether a group with these hyper-parameters steps without the kernels (plain SGD):
        then ``_plain_call`` checks and ``_apply_plain`` applies it."""
        return False

    def _plain_call(self, gi: int, group: Dict[str, Any], h: Dict[str, Any]):
        raise NotImplementedError

    def _apply_plain(self, call) -> None:
        raise NotImplementedError

    def _sparse_refused(self, h: Dict[str, Any]) -> Optional[str]:
        """Why these hyper-parameters take no sparse gradient (None: they do)."""
        return None

    def _slot_shape(self, shape: Tuple[int, ...], key: str) -> Tuple[int, ...]:
        """The shape of state tensor ``key`` of a parameter of ``shape`` (a row-wise
        optimizer's: one value per row, ``shape[:1]``)."""
        return tuple(shape)

    # ---- torch.optim.Optimizer -------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group)  # refuse bad values now, not at the first step
            sd, mw = check_state_options(group)
            for i, p in enumerate(group["params"]):
                check_param(p, f"params[{i}]")
                state_format(p, sd, mw, f"params[{i}]")
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()  # defaults, state, param_groups
        state["num_threads"] = self.num_threads
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """torch's ``__setstate__`` (also called by ``load_state_dict``): a group without a
        newer option gets torch's default, a number ``step`` becomes a tensor; then the caches
        are rebuilt at the next step."""
        super().__setstate__(state)
        self.__dict__.setdefault("num_threads", None)
        for group in self.param_groups:
            for key, value in self._group_fill.items():
                group.setdefault(key, value)
            if not self._counts_steps:
                continue
            for p in group["params"]:
                s = self.state.get(p)
                if s and "step" in s and not torch.is_tensor(s["step"]):
                    s["step"] = self._step_tensor(s["step"])
        self._reset_caches()

    def _step_tensor(self, value: Any) -> Any:
        return torch.tensor(float(value), dtype=scalar_dtype())

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every parameter that has a gradient (``closure``, if given, re-evaluates
        the model and returns the loss, as in torch).  All or nothing: every check of every
        group runs before the first write (see the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        try:
            calls, fresh = self._plan()
            if len(calls) == 1 and not self._writes_back:  # its checks run before it writes
                self._apply(calls, fresh)
            elif calls:
                self._check_before_writes(calls)
                with sigint_deferred():
                    self._apply(calls, fresh)
        except BaseException:
            self._entries.clear()  # a refused step leaves no entry unchecked by a full plan
            raise
        return loss

    # ---- phase 1: plan (nothing written) -----------------------------------------------------
    def _plan(self):
        """``(calls, fresh entries)``; a call is
        ``("dense", prepared, gs, t, hyper, entries, grads, new_step)`` or
        ``("sparse", entry, IndexedSlices, t, h, new_step)``."""
        calls: list = []
        dense: list = []
        fresh: list = []
        self._writes_back = []  # entries stepped through a contiguous copy
        rebuilt = False
        entries, state_of, strided = self._entries, self.state, torch.strided
        counts = self._counts_steps
        dtensor = dtensor_class()  # None: no DTensor anywhere
        for gi, group in enumerate(self.param_groups):
            h = self._check_group(group)
            if self._plain(h):
                calls.append(self._plain_call(gi, group, h))
                continue
            keys = self._slot_keys(group)
            formats = check_state_options(group)
            ents: list = []
            xs: list = []
            gs: list = []
            grads: list = []
            ts: list = []
            for i, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                lp = p  # what the step writes: a DTensor's local shard, with its gradient's
                if dtensor is not None and isinstance(p, dtensor):
                    lp, grad = p.to_local(), local_tensor(grad)
                e = entries.get(id(p))
                state = state_of.get(p)
                # the entry is valid while the parameter, its state dict, the tensors in it
                # (``step`` included) and their memory are the ones it was built from
                if (e is None or e.p is not p or e.state is not state or e.keys != keys
                        or e.ptr != lp.data_ptr() or lp.is_contiguous() != (e.tmp is None)
                        or e.formats != formats
                        or (e.number_step and isinstance(state.get("step"), torch.Tensor))):
                    e = None
                else:
                    for k, tk, ptr in e.slots:
                        if state.get(k) is not tk or ptr != (
                                tk if lp is p else local_tensor(tk)).data_ptr():
                            e = None
                            break
                if e is None:
                    e = self._entry(p, group, keys, gi, i, formats)
                    if not rebuilt:  # no prepared step keeps the replaced tensors alive
                        self._prepared.clear()
                        self._written_ranges = None
                    rebuilt = True
                if e.fresh:
                    fresh.append(e)
                sv = e.step_view
                tv = (sv.item() if sv is not None else
                      step_count(e.state["step"], f"state of {param_name(gi, i)}: 'step'")
                      if counts else (0.0 if e.fresh else 1.0))
                if grad.layout is not strided:
                    calls.append(self._sparse_call(e, grad, tv, h, gi, i))
                    continue
                if not self._takes_dense:
                    raise RuntimeError(f"{type(self).__name__} does not support dense "
                                       f"gradients ({param_name(gi, i)}); use "
                                       f"fastadam.torch.Adam")
                if self._sparse_seen and p in self._sparse_seen:
                    self._warn_dense_after_sparse(gi, i)
                x = e.x
                if e.tmp is not None:  # stepped through its contiguous copy (our memory)
                    if tuple(e.tmp.shape) != tuple(lp.shape) or e.tmp.dtype != lp.dtype:
                        raise ValueError(f"{param_name(gi, i)}: its shape or dtype changed "
                                         f"since its state was made")
                    e.tmp.copy_(lp.detach())
                    self._writes_back.append(e)
                if e.plain_grad:  # a real dtype: the gradient's own array
                    g = grad.numpy() if grad.is_contiguous() else self._grad_view(grad, gi, i)
                elif grad.is_contiguous() and grad.dtype is p.dtype:
                    g = e.grad_view(grad)  # bfloat16 bits, complex parts
                else:
                    g = self._grad_view(grad, gi, i)
                if g.dtype != x.dtype or g.shape != x.shape:
                    raise ValueError(f"{param_name(gi, i)}: its gradient has dtype "
                                     f"{grad.dtype} and shape {tuple(grad.shape)}, expected "
                                     f"{p.dtype} and {tuple(lp.shape)}")
                ents.append(e)
                xs.append(x)
                gs.append(g)
                grads.append(grad)
                ts.append(tv)
            if ents:
                dense.append((gi, h, ents, xs, gs, grads, ts))
        if rebuilt:  # before the prepared steps are built: the error names torch's tensors
            self._check_disjoint([e for c in calls if c[0] == "sparse" for e in (c[1],)]
                                 + [e for d in dense for e in d[2]])
        for gi, h, ents, xs, gs, grads, ts in dense:
            self._dense_calls(calls, gi, h, ents, xs, gs, grads, ts)
        return calls, fresh

    @staticmethod
    def _check_disjoint(ents: list) -> None:
        """No two tensors a step writes (parameters, state, step counts) share memory."""
        written = sorted(w for e in ents for w in e.written)
        for (a, na, la), (b, nb, lb) in zip(written, written[1:]):
            if na and nb and b < a + na:
                raise ValueError(f"{lb}: shares memory with {la}; every parameter and state "
                                 f"tensor a step writes needs its own memory")

    def _grad_view(self, grad: torch.Tensor, gi: int, i: int) -> np.ndarray:
        name = f"{param_name(gi, i)}.grad"
        if grad.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got one on {grad.device}")
        if grad.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: its dtype {grad.dtype} is not the parameter's")
        return kernel_array(grad.detach().contiguous())

    def _warn_dense_after_sparse(self, gi: int, i: int) -> None:
        if not self._warned_dense_after_sparse:
            self._warned_dense_after_sparse = True
            warnings.warn(f"{param_name(gi, i)} had sparse gradients and now has a dense "
                          f"one: it steps every row from now on (a dense term such as weight "
                          f"decay added to an embedding's loss makes its gradient dense)",
                          RuntimeWarning, stacklevel=caller_stacklevel())

    def _dense_calls(self, calls, gi, h, ents, xs, gs, grads, ts) -> None:
        """One call per (step count, dtype) of a group's dense gradients, each with the
        prepared step of its parameters (kept while they are the same entries)."""
        kind = ents[0].kind
        if ts.count(ts[0]) == len(ts) and all(e.kind is kind for e in ents):
            parts = {(ts[0], kind): list(range(len(ents)))}
        else:
            parts = {}
            for k, (tv, e) in enumerate(zip(ts, ents)):
                parts.setdefault((tv, e.kind), []).append(k)
        hyper = self._hyper(h)
        for (tv, dt), idx in parts.items():
            if not 0.0 <= tv < MAX_STEP or tv != math.floor(tv):  # edited in place, NaN ...
                e = ents[idx[0]]
                step_count(tv, e.written[-1][2] if e.step_view is not None else "step")
            if len(idx) != len(ents):
                sub = [ents[k] for k in idx]
                bx, bg, bgr = [xs[k] for k in idx], [gs[k] for k in idx], [grads[k] for k in idx]
            else:
                sub, bx, bg, bgr = ents, xs, gs, grads
            for new_step, part in self._by_new_step(tv, sub):
                if len(part) != len(sub):
                    pick = [sub.index(e) for e in part]
                    px, pg, pgr = [bx[k] for k in pick], [bg[k] for k in pick], \
                        [bgr[k] for k in pick]
                else:
                    px, pg, pgr = bx, bg, bgr
                prepared = self._prepared_for(gi, dt, part, px)
                calls.append(("dense", prepared, pg, int(new_step), hyper, part, pgr,
                              new_step))

    @staticmethod
    def _by_new_step(tv: float, ents: list):
        """The entries by the count their step tensor holds after ``+= 1`` (torch adds in the
        tensor's dtype: a float32 count stops at 2**24)."""
        if tv + 1.0 < 2.0 ** 24:
            return [(tv + 1.0, ents)]
        out: Dict[float, list] = {}
        for e in ents:
            sv = e.step_view
            new = float(sv.dtype.type(tv + 1.0)) if sv is not None else tv + 1.0
            out.setdefault(new, []).append(e)
        return list(out.items())

    def _prepared_for(self, gi: int, kind: Any, ents: list, xs: list):
        kept = self._prepared.setdefault((gi, kind), [])
        for k, (members, prepared) in enumerate(kept):
            if members == ents:
                if k:
                    kept.insert(0, kept.pop(k))
                return prepared
        keys = ents[0].keys
        slots = {self._slot_names[key]: [e.views[j] for e in ents]
                 for j, key in enumerate(keys)}
        master = [e.master for e in ents] if kind[2] else None
        prepared = prepare_step(self._spec_name, xs, slots, num_threads=self.num_threads,
                                master=master, block_size=_formats.BLOCK_SIZE,
                                quant_map=_formats.QUANT_MAP)
        kept.insert(0, (list(ents), prepared))
        del kept[_PREPARED_KEPT:]
        return prepared

    def _sparse_call(self, e: _Entry, grad: torch.Tensor, tv: float, h: Dict[str, Any],
                     gi: int, i: int):
        """A sparse gradient's call, checked (rows in range, values like the parameter's rows,
        options that take sparse gradients)."""
        name = param_name(gi, i)
        p = e.p
        if not self._takes_sparse:
            raise RuntimeError(f"{type(self).__name__} does not support sparse gradients "
                               f"({name})")
        why = self._sparse_refused(h)
        if why:
            raise ValueError(f"{name}: a sparse gradient cannot be used with {why}")
        if p.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name}: a sparse gradient steps float32 or float64 parameters "
                            f"(fastadam's sparse kernels), got {p.dtype}")
        if e.kind[1] is not None or e.kind[2] or e.tmp is not None:
            raise ValueError(f"{name}: a sparse gradient steps a contiguous parameter with "
                             f"states in its own dtype (state_dtype=None, no master_weights)")
        step_count(tv, f"state of {name}: 'step'")
        return ("sparse", e, self._indexed_slices(grad, p, name), int(tv) + 1, h, tv + 1.0)

    @staticmethod
    def _indexed_slices(grad: torch.Tensor, p: torch.Tensor, name: str) -> IndexedSlices:
        """A sparse COO gradient (rows of ``p``, as ``nn.Embedding(sparse=True)`` makes) as
        fastadam's IndexedSlices, checked; duplicate rows are summed by the sparse step."""
        if grad.layout is not torch.sparse_coo:
            raise ValueError(f"{name}: a sparse gradient must be a COO tensor, got layout "
                             f"{grad.layout}")
        if grad.sparse_dim() != 1:
            raise ValueError(f"{name}: a sparse gradient must index rows (sparse_dim 1), got "
                             f"sparse_dim {grad.sparse_dim()}")
        if tuple(grad.shape) != tuple(p.shape):
            raise ValueError(f"{name}: its sparse gradient has shape {tuple(grad.shape)}, "
                             f"expected {tuple(p.shape)}")
        values = grad._values()
        if values.dtype != p.dtype:
            raise ValueError(f"{name}: its sparse gradient has dtype {values.dtype}, expected "
                             f"{p.dtype}")
        idx = grad._indices()[0]
        if idx.numel():
            low, high = (int(v) for v in idx.aminmax())
            if low < 0 or high >= p.shape[0]:
                raise IndexError(f"{name}: its sparse gradient indexes row "
                                 f"{low if low < 0 else high}, outside [0, {p.shape[0]})")
        # (the sparse step copies the indices before its own range check and its reads)
        return IndexedSlices(values.contiguous().numpy(), idx.contiguous().numpy(),
                             tuple(p.shape))

    def _entry(self, p: torch.Tensor, group: Dict[str, Any], keys: Tuple[str, ...],
               gi: int, i: int, formats: Tuple[Optional[str], bool] = (None, False)) -> _Entry:
        """A new entry for ``p``: its view, its state tensors' views (checked like ``p``, in
        the group's state format), its step count; a parameter without state gets new state,
        installed only when the step is applied."""
        name = param_name(gi, i)
        check_param(p, name)
        lp = local_tensor(p)  # a DTensor's local shard, the memory the kernels write
        if lp is not p and (formats[0] == "int8" or formats[1]):
            option = "state_dtype='int8'" if formats[0] == "int8" else "master_weights=True"
            raise ValueError(f"{name}: {option} is not supported for DTensor parameters "
                             f"(FSDP2 shards); use state_dtype None, 'float32' or 'bfloat16' "
                             f"without master_weights")
        fmt, use_master = state_format(p, formats[0], formats[1], name)
        tmp = None
        if lp.is_contiguous():
            x = kernel_array(lp.detach())
        else:  # stepped through a contiguous copy, written back after the step's calls
            tmp = lp.detach().contiguous()
            x = kernel_array(tmp)
        state = self.state.get(p)
        if state is not None and not isinstance(state, dict):
            raise TypeError(f"state of {name}: expected a dict, got {type(state).__name__}")
        fresh = not state
        if fresh:
            state = self._make_state(p, group, fmt, use_master)
        wanted = keys + ((MASTER_KEY,) if use_master else ())
        missing = [k for k in wanted if state.get(k) is None]
        if missing and not fresh:
            # e.g. amsgrad switched on after the first step: a new state dict, installed at
            # the apply phase like a new parameter's
            state = dict(state)
            for k in missing:
                state.update(self._format_slot(p, k, fmt, use_master))
            fresh = True
        span = x.nbytes if tmp is None else memory_span(lp)
        tensors, views, written, tensor_keys = [], [], [(lp.data_ptr(), span, name)], []
        for k in keys:
            view, parts = _formats.state_view(
                state, k, p, fmt, _formats.signed_slot(self._spec_name or "adam",
                                                       self._slot_names.get(k, k)),
                f"state of {name}: {k!r}",
                lambda t, label: numpy_view(t, label, STATE_TENSOR_DTYPES),
                shape=self._slot_shape(tuple(p.shape), k))
            views.append(view)
            for key, tk, label in parts:
                check_sharded_like(tk, p, label)
                lt = local_tensor(tk)
                tensor_keys.append(key)
                tensors.append(tk)
                written.append((lt.data_ptr(), lt.numel() * lt.element_size(), label))
        master = None
        if use_master:
            tm = state[MASTER_KEY]
            label = f"state of {name}: {MASTER_KEY!r}"
            master = numpy_view(tm, label)
            if tm.dtype != torch.float32 or tuple(tm.shape) != tuple(p.shape):
                raise ValueError(f"{label}: expected a float32 tensor of shape "
                                 f"{tuple(p.shape)}, got {tm.dtype} and {tuple(tm.shape)}")
            check_sharded_like(tm, p, label)
            tensor_keys.append(MASTER_KEY)
            tensors.append(tm)
            written.append((local_tensor(tm).data_ptr(), master.nbytes, label))
        tensor_keys, step_view, number_step = tuple(tensor_keys), None, False
        if self._counts_steps:
            step = state.get("step")
            label = f"state of {name}: 'step'"
            if step is None:
                raise ValueError(f"{label}: missing")
            step_count(step, label)
            if isinstance(step, torch.Tensor):
                if step.device.type != "cpu" or step.dtype not in (
                        torch.float32, torch.float64, torch.int32, torch.int64):
                    raise ValueError(f"{label}: expected a CPU tensor of a real dtype, got "
                                     f"{step.dtype} on {step.device}")
                step_view = step.detach().numpy().reshape(())
                tensor_keys = tensor_keys + ("step",)
                tensors.append(step)
                written.append((step.data_ptr(), step.element_size(), label))
            else:
                number_step = True
        e = _Entry(p, x, state, keys, tensor_keys, tuple(tensors), views, step_view,
                   number_step, fresh, tuple(written), kind=_kind(x.dtype, fmt, use_master),
                   tmp=tmp, master=master, formats=formats)
        self._entries[id(p)] = e
        return e

    def _new_slot(self, p: torch.Tensor, key: str) -> torch.Tensor:
        return torch.zeros_like(p, memory_format=torch.contiguous_format)

    def _format_slot(self, p: torch.Tensor, key: str, fmt: Optional[str],
                     use_master: bool) -> Dict[str, Any]:
        """The state tensors of a new slot ``key`` (or the master copy) in format ``fmt``."""
        if key == MASTER_KEY:
            return {key: p.detach().to(torch.float32, memory_format=torch.contiguous_format)}
        t = self._new_slot(p, key)
        if fmt is None:
            return {key: t}
        return _formats.convert_state(t, fmt, key, _formats.signed_slot(
            self._spec_name, self._slot_names[key]))

    def _make_state(self, p: torch.Tensor, group: Dict[str, Any], fmt: Optional[str] = None,
                    use_master: bool = False) -> Dict[str, Any]:
        """A new parameter's state (``_state_init``) in its state format, with its master."""
        state = self._state_init(p, group)
        if fmt is not None:
            for k in self._slot_keys(group):
                state.update(_formats.convert_state(state[k], fmt, k, _formats.signed_slot(
                    self._spec_name, self._slot_names[k])))
        if use_master:
            state.update(self._format_slot(p, MASTER_KEY, None, True))
        return state

    def _check_before_writes(self, calls: list) -> None:
        """The checks a multi-call step needs before its first write: each call's
        hyper-parameters for its dtype, no gradient overlapping a tensor any call writes."""
        # the written tensors' address ranges, sorted: kept while the calls' prepared steps
        # (which hold their entries) and sparse entries are the same objects
        key = tuple(c[1] for c in calls if c[0] != "plain")
        dense = [c for c in calls if c[0] == "dense"]
        kept = self._written_ranges
        if kept is not None and kept[0] == key:
            starts, ends, gn = kept[1], kept[2], kept[3]
        else:
            written = sorted(w for c in calls if c[0] != "plain"
                             for e in (c[5] if c[0] == "dense" else (c[1],))
                             for w in e.written)
            starts = np.array([w[0] for w in written], dtype=np.uint64)
            ends = np.array([w[0] + w[1] for w in written], dtype=np.uint64)
            # a dense gradient has its parameter's size (checked in the plan)
            gn = np.array([e.x.nbytes for c in dense for e in c[5]], dtype=np.uint64)
            self._written_ranges = (key, starts, ends, gn)
        # no gradient overlaps a tensor any call of the step writes (each prepared step
        # checks that for its own tensors only, when it runs): one vectorized search
        gp = np.array([grad.data_ptr() for c in dense for grad in c[6]], dtype=np.uint64)
        k = np.searchsorted(starts, gp, side="right")
        below, above = np.maximum(k, 1) - 1, np.minimum(k, len(starts) - 1)
        hit = (gn > 0) & (((k > 0) & (gp < ends[below]))
                          | ((k < len(starts)) & (starts[above] < gp + gn)))
        if hit.any():
            e = [e for c in dense for e in c[5]][int(np.argmax(hit))]
            raise ValueError(f"the gradient of {e.written[0][2]} shares memory with a tensor "
                             f"the step writes")
        for c in calls:
            if c[0] == "dense":
                _, prepared, gs, t, hyper, ents, grads, _ = c
                prepared.check(t, **hyper)
            elif c[0] == "sparse":
                _, e, grad, t, h, _ = c
                x = e.x
                rows = (0,) + x.shape[1:]
                self._step_sparse(np.empty(rows, x.dtype),
                                  (np.empty(0, np.int64), np.empty(rows, x.dtype)),
                                  [np.empty(self._slot_shape(rows, k), x.dtype)
                                   for k in e.keys], t, h)

    # ---- phase 2: apply ----------------------------------------------------------------------
    def _apply(self, calls: list, fresh: list) -> None:
        """Run the calls, advance the step counts, install the new state (after the calls: a
        single call refused by its own checks leaves no state behind)."""
        counts = self._counts_steps
        for c in calls:
            if c[0] == "dense":
                _, prepared, gs, t, hyper, ents, _, new = c
                prepared.step(gs, t, **hyper)
            elif c[0] == "plain":
                self._apply_plain(c)
                continue
            else:
                _, e, grad, t, h, new = c
                self._step_sparse(e.x, grad, e.views, t, h)
                self._sparse_seen.add(e.p)
                ents = (e,)
            if counts:
                for e in ents:
                    sv = e.step_view
                    if sv is not None:
                        sv[()] = new
                    else:  # a number, as torch's SparseAdam keeps it
                        e.state["step"] = type(e.state["step"])(new)
        for e in self._writes_back:  # every call has run: the copies go back
            local_tensor(e.p).detach().copy_(e.tmp)
        state_of = self.state
        for e in fresh:
            current = state_of.get(e.p)
            if current:  # state keys added (amsgrad switched on): into the same dict
                current.update(e.state)
                e.state = current
            else:
                state_of[e.p] = e.state
            e.fresh = False

    # ---- state dicts -------------------------------------------------------------------------
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's ``load_state_dict``, after checking everything it installs: a refused state
        dict raises and leaves the optimizer as it was."""
        self._check_state_dict(state_dict)
        super().load_state_dict(state_dict)
        self._restore_formats(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                for k in self._slot_keys(group):
                    if state and isinstance(state.get(k), torch.Tensor) \
                            and not local_tensor(state[k]).is_contiguous():
                        state[k] = state[k].contiguous()
        self._reset_caches()

    def _check_state_dict(self, state_dict: Any) -> None:
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise ValueError("state_dict: expected a dict with 'state' and 'param_groups' (as "
                             "Optimizer.state_dict() returns)")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict):
            raise TypeError("state_dict: 'param_groups' must be a list and 'state' a dict")
        if len(saved_groups) != len(self.param_groups):
            return  # torch's own check raises its ValueError before anything changes
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if not isinstance(saved, dict) or "params" not in saved:
                raise ValueError(f"state_dict['param_groups'][{gi}]: expected a dict with "
                                 f"'params'")
            if len(saved["params"]) != len(group["params"]):
                return  # torch's ValueError
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            merged = {**self._group_fill, **{k: v for k, v in saved.items() if k != "params"},
                      "params": group["params"]}
            for key in TORCH_ONLY_FLAGS:
                if merged.get(key):
                    raise ValueError(f"state_dict['param_groups'][{gi}]: {key}=True is not "
                                     f"supported by fastadam.torch")
            try:
                self._check_group(dict(merged))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"state_dict['param_groups'][{gi}]: {exc}") from None
            keys = self._slot_keys(merged)
            for i, (pid, p) in enumerate(zip(saved["params"], group["params"])):
                s = saved_state.get(pid)
                if s is None:
                    continue
                name = f"state_dict['state'][{pid!r}] ({param_name(gi, i)})"
                if not isinstance(s, dict):
                    raise TypeError(f"{name}: expected a dict, got {type(s).__name__}")
                if not s:
                    continue
                self._check_saved_state(s, p, keys, name)
                self._check_saved_formats(s, p, merged, keys, name)

    def _saved_formats(self, p: torch.Tensor, group: Dict[str, Any], keys: Tuple[str, ...],
                       name: str) -> Dict[str, torch.dtype]:
        """The state keys whose dtype is the group's state format, not the parameter's (torch's
        ``load_state_dict`` casts every state tensor to the parameter's dtype), by key."""
        sd, mw = check_state_options(group)
        fmt, use_master = state_format(p, sd, mw, name)
        out: Dict[str, torch.dtype] = {}
        if fmt is not None:
            for k in keys:
                out[k] = _formats.expected_dtype(p, fmt)
                if fmt == "int8":
                    out[_formats.scales_key(k)] = torch.float32
        if use_master:
            out[MASTER_KEY] = torch.float32
        return out

    def _check_saved_formats(self, s: Dict[str, Any], p: torch.Tensor, group: Dict[str, Any],
                             keys: Tuple[str, ...], name: str) -> None:
        """The saved state tensors are in the format the saved group's ``state_dtype`` and
        ``master_weights`` say (an 8-bit state loaded as floats would be garbage)."""
        try:
            wanted = self._saved_formats(p, group, keys, name)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"state_dict: {exc}") from None
        for k in keys:
            v = s.get(k)
            if isinstance(v, torch.Tensor) and k not in wanted and not (
                    v.is_floating_point() or v.is_complex()):
                raise ValueError(f"{name}[{k!r}]: has dtype {v.dtype}; a state of the "
                                 f"parameter's dtype (state_dtype=None in its group) must be "
                                 f"floating point (an 8-bit state needs state_dtype='int8')")
        for k, dtype in wanted.items():
            v = s.get(k)
            label = f"{name}[{k!r}]"
            if not isinstance(v, torch.Tensor):
                raise ValueError(f"{label}: missing (the group's state_dtype "
                                 f"{group.get('state_dtype')!r}, master_weights "
                                 f"{bool(group.get('master_weights', False))})")
            if v.dtype != dtype or v.layout is not torch.strided:
                raise ValueError(f"{label}: expected a dense {dtype} tensor, got {v.dtype}")
        for k in keys:
            sk = _formats.scales_key(k)
            if sk in wanted:
                try:
                    _formats.QuantizedState(
                        s[k].detach().cpu().contiguous().numpy(),
                        s[sk].detach().cpu().contiguous().numpy().copy(), _formats.BLOCK_SIZE,
                        _formats.QUANT_MAP,
                        _formats.signed_slot(self._spec_name, self._slot_names[k]))
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{name}[{k!r}]: {exc}") from None

    def _restore_formats(self, state_dict: Dict[str, Any]) -> None:
        """Undo torch's cast of the state tensors whose dtype is the state format's (checked
        by ``_check_saved_formats``): copies of the saved tensors, contiguous."""
        for gi, (group, saved) in enumerate(zip(self.param_groups,
                                                state_dict["param_groups"])):
            keys = self._slot_keys(group)
            for i, (pid, p) in enumerate(zip(saved["params"], group["params"])):
                s, state = state_dict["state"].get(pid), self.state.get(p)
                if not s or not state:
                    continue
                for k in self._saved_formats(p, group, keys, param_name(gi, i)):
                    state[k] = s[k].detach().to(p.device).clone(
                        memory_format=torch.contiguous_format)

    def _check_saved_state(self, s: Dict[str, Any], p: torch.Tensor, keys: Tuple[str, ...],
                           name: str) -> None:
        if self._counts_steps:
            if "step" not in s:
                raise ValueError(f"{name}: missing 'step'")
            step_count(s["step"], f"{name}['step']")
        for k in keys:
            v = s.get(k)
            if v is None:
                raise ValueError(f"{name}: missing {k!r}")
            self._check_saved_tensor(v, p, f"{name}[{k!r}]",
                                     self._slot_shape(tuple(p.shape), k))

    @staticmethod
    def _check_saved_tensor(v: Any, p: torch.Tensor, label: str,
                            shape: Optional[Tuple[int, ...]] = None) -> None:
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{label}: expected a tensor, got {type(v).__name__}")
        want = tuple(p.shape) if shape is None else shape
        if tuple(v.shape) != want:
            raise ValueError(f"{label}: has shape {tuple(v.shape)}, expected {want} "
                             f"(the parameter's)")
        if v.layout is not torch.strided or v.is_complex() != p.is_complex() \
                or v.dtype == torch.bool:
            kind = "complex" if p.is_complex() else "real"
            raise TypeError(f"{label}: expected a dense {kind} tensor, got {v.dtype} "
                            f"({v.layout})")
