"""The shared machinery of fastadam's ``torch.optim.Optimizer`` subclasses.

Design: a subclass is a real ``torch.optim.Optimizer`` (``param_groups``, ``state``, hooks,
``zero_grad``, ``state_dict`` and ``load_state_dict`` are torch's own), whose ``step`` hands
the tensors to fastadam's public functional steps as NumPy views: ``Tensor.numpy()`` shares
memory with a CPU tensor, so the compiled kernels update the parameters and the state tensors
in place, one compiled call per (group, dtype, step count).  The state keeps torch's names and
types (``step`` a float32 scalar tensor, ``exp_avg`` ... tensors like the parameter), so a
checkpoint moves between ``torch.optim`` and ``fastadam.torch`` both ways.

A subclass says which state tensors a parameter has (``_state_init``) and how a batch of
parameters steps (``_step_dense``, ``_step_sparse``); everything else is here.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import IndexedSlices

#: dtypes the compiled kernels take (float16 is computed in float32)
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16)
#: torch option keys kept in the groups for checkpoint compatibility, accepted only at their
#: no-op values (fastadam is its own fused, multi-threaded implementation)
TORCH_ONLY_FLAGS = ("capturable", "differentiable")


def number(value: Any, name: str) -> float:
    """A Python float from a float, int, 0-d tensor or 0-d array (what schedulers store)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a number or a one-element tensor, got a tensor "
                             f"of shape {tuple(value.shape)}")
        return float(value.item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}") from None


def check_range(value: float, name: str, low: float, high: Optional[float] = None,
                high_open: bool = True) -> float:
    if not np.isfinite(value) or value < low or (
            high is not None and (value >= high if high_open else value > high)):
        bound = "" if high is None else (f" and < {high}" if high_open else f" and <= {high}")
        raise ValueError(f"{name}: expected a finite value >= {low}{bound}, got {value}")
    return value


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


def numpy_view(tensor: torch.Tensor, name: str) -> np.ndarray:
    """A NumPy array sharing ``tensor``'s memory (CPU, contiguous, a supported dtype)."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{name}: fastadam.torch steps CPU tensors; got one on "
                         f"{tensor.device} (use torch.optim for device tensors)")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported by fastadam's kernels "
                        f"(float32, float64 and float16 are); keep such parameters in a "
                        f"torch.optim optimizer")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (fastadam updates it in place "
                         f"through a NumPy view), got strides {tensor.stride()}")
    return tensor.detach().numpy()


class FastadamOptimizer(torch.optim.Optimizer):
    """Base class: see the module docstring.  Subclasses set ``_state_keys`` and implement
    ``_state_init``, ``_step_dense`` and (if sparse gradients are taken) ``_step_sparse``."""

    #: state tensors of one parameter besides ``step``, in the order the kernel takes them
    _state_keys: Tuple[str, ...] = ()
    #: whether a gradient may be a sparse COO tensor (nn.Embedding(sparse=True))
    _takes_sparse = True
    _takes_dense = True

    def __init__(self, params: Any, defaults: Dict[str, Any], num_threads: Optional[int]):
        for key in TORCH_ONLY_FLAGS:
            if defaults.get(key):
                raise ValueError(f"{key}: fastadam.torch optimizers do not support "
                                 f"{key}=True (use torch.optim for that)")
        self.num_threads = num_threads
        self._sparse_seen: set = set()
        self._entries: Dict[int, list] = {}  # id(parameter): its entry (see _entry)
        self._warned_dense_after_sparse = False
        super().__init__(params, defaults)

    # ---- hooks for subclasses ----------------------------------------------------------------
    def _check_group(self, group: Dict[str, Any]) -> Dict[str, Any]:
        """The group's hyper-parameters as Python numbers, validated (a new dict)."""
        raise NotImplementedError

    def _state_init(self, p: torch.Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        raise NotImplementedError

    def _slot_keys(self, group: Dict[str, Any]) -> Tuple[str, ...]:
        """The state tensors the kernel takes for a parameter of ``group``, in its order."""
        return self._state_keys

    def _step_dense(self, xs, gs, slots, t, h) -> None:
        raise NotImplementedError

    def _step_sparse(self, x, grad, slots, t, h) -> None:
        raise NotImplementedError

    # ---- torch.optim.Optimizer -------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._check_group(group)  # refuse bad values now, not at the first step
        for i, p in enumerate(group["params"]):
            numpy_view(p, f"params[{i}]")

    def _init_state(self, p: torch.Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state[p]
        if not state:
            state.update(self._state_init(p, group))
        for key in self._slot_keys(group):  # e.g. amsgrad switched on after the first step
            if key not in state:
                state[key] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        return state

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every parameter that has a gradient (``closure``, if given, re-evaluates
        the model and returns the loss, as in torch).  Checks run for every group before any
        parameter changes."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [self._plan_group(gi, group) for gi, group in enumerate(self.param_groups)]
        stepped: List[list] = []
        for h, dense, sparse in plans:
            for (t, _), batch in dense.items():
                self._step_dense(batch["x"], batch["g"], batch["slots"], t, h)
                stepped += batch["entries"]
            for x, grad, slots, t, entry in sparse:
                self._step_sparse(x, grad, slots, t, h)
                stepped.append(entry)
        for e in stepped:
            e[3] += 1
            # state["step"] += 1 as torch adds it (in the tensor's dtype: the sum rounded once
            # from a double), through its NumPy view: about 40x cheaper than
            # torch._foreach_add_ on 0-d tensors, which takes a microsecond per tensor
            e[6][()] = e[6].item() + 1.0
        return loss

    def _entry(self, p: torch.Tensor, group: Dict[str, Any], keys: Tuple[str, ...],
               gi: int, i: int) -> list:
        """``[data_ptr, x view, step tensor, step count, state tensors, state views, step
        view, p, state keys]`` of ``p``, built once and reused while ``p``'s memory and its
        state tensors stay the same objects (``load_state_dict``, ``p.data = ...`` or a state
        tensor put in ``opt.state`` replace them: the entry is rebuilt; _plan_group checks that
        on every step).  Making NumPy views costs about 1 us per tensor, which a step of many
        small tensors would otherwise pay three times per parameter."""
        name = param_name(gi, i)
        x = numpy_view(p, name)
        state = self._init_state(p, group)
        step = state["step"]
        if not isinstance(step, torch.Tensor) or step.device.type != "cpu" or step.numel() != 1:
            raise ValueError(f"state of {name}: 'step' must be a one-element CPU tensor, got "
                             f"{step!r}")
        tensors = tuple(state[k] for k in keys)
        views = [numpy_view(tk, f"state[{name}][{k!r}]") for k, tk in zip(keys, tensors)]
        entry = [p.data_ptr(), x, step, int(step.item()), tensors, views, step.numpy(), p, keys]
        self._entries[id(p)] = entry
        return entry

    def _plan_group(self, gi: int, group: Dict[str, Any]):
        """Validate one group and sort its parameters into compiled calls (nothing written).
        The loop is every step's cost per parameter (about 2 us): the entry's checks, the
        gradient's view and checks, one append per array."""
        h = self._check_group(group)
        keys = self._slot_keys(group)
        dense: Dict[Tuple[int, np.dtype], Dict[str, list]] = {}  # (t, dtype): one call's lists
        sparse = []
        entries, state_of, strided = self._entries, self.state, torch.strided
        for i, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None:
                continue
            entry = entries.get(id(p))
            state = state_of.get(p)
            if (entry is None or entry[7] is not p or state is None or entry[8] != keys
                    or entry[0] != p.data_ptr() or not p.is_contiguous()
                    or state["step"] is not entry[2]):
                entry = self._entry(p, group, keys, gi, i)
            else:
                for k, tk in zip(keys, entry[4]):
                    if state.get(k) is not tk:
                        entry = self._entry(p, group, keys, gi, i)
                        break
            x, t, slots = entry[1], entry[3] + 1, entry[5]
            if grad.layout is not strided:
                name = param_name(gi, i)
                if not self._takes_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse "
                                       f"gradients ({name})")
                self._sparse_seen.add(p)
                sparse.append((x, self._indexed_slices(grad, p, name), slots, t, entry))
                continue
            if not self._takes_dense:
                raise RuntimeError(f"{type(self).__name__} does not support dense gradients "
                                   f"({param_name(gi, i)}); use fastadam.torch.Adam")
            if self._sparse_seen and p in self._sparse_seen and not self._warned_dense_after_sparse:
                self._warned_dense_after_sparse = True
                warnings.warn(f"{param_name(gi, i)} had sparse gradients and now has a dense "
                              f"one: it steps every row from now on (a dense term such as weight "
                              f"decay added to an embedding's loss makes its gradient dense)",
                              RuntimeWarning, stacklevel=caller_stacklevel())
            g = grad.numpy() if grad.is_contiguous() else grad.contiguous().numpy()
            if g.dtype != x.dtype or g.shape != x.shape:
                raise ValueError(f"{param_name(gi, i)}: its gradient has dtype {grad.dtype} and "
                                 f"shape {tuple(grad.shape)}, expected {p.dtype} and "
                                 f"{tuple(p.shape)}")
            key = (t, x.dtype)
            batch = dense.get(key)
            if batch is None:
                batch = dense[key] = dict(x=[], g=[], slots=[[] for _ in slots], entries=[])
            batch["x"].append(x)
            batch["g"].append(g)
            for lst, s in zip(batch["slots"], slots):
                lst.append(s)
            batch["entries"].append(entry)
        return h, dense, sparse

    @staticmethod
    def _indexed_slices(grad: torch.Tensor, p: torch.Tensor, name: str) -> IndexedSlices:
        """A sparse COO gradient (rows of ``p``, as ``nn.Embedding(sparse=True)`` makes) as
        fastadam's IndexedSlices; duplicate rows are summed by the sparse step itself."""
        if grad.sparse_dim() != 1:
            raise ValueError(f"{name}: a sparse gradient must index rows (sparse_dim 1), got "
                             f"sparse_dim {grad.sparse_dim()}")
        indices = grad._indices()[0].numpy()
        values = grad._values()
        if values.dtype != p.dtype:
            raise ValueError(f"{name}: its sparse gradient has dtype {values.dtype}, expected "
                             f"{p.dtype}")
        values = values.contiguous().numpy()
        return IndexedSlices(values, indices, tuple(p.shape))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._entries.clear()
        super().load_state_dict(state_dict)
        for gi, group in enumerate(self.param_groups):
            self._check_group(group)
            for i, p in enumerate(group["params"]):
                state = self.state.get(p)
                if not state:
                    continue
                name = f"state of {param_name(gi, i)}"
                step = state.get("step")
                if not isinstance(step, torch.Tensor):
                    step = torch.tensor(float(step if step is not None else 0.0),
                                        dtype=torch.float32)
                    state["step"] = step
                if step.item() < 0 or step.item() != int(step.item()):
                    raise ValueError(f"{name}: 'step' must be a whole number >= 0, got "
                                     f"{step.item()}")
                for k in self._slot_keys(group):
                    if k not in state:
                        raise ValueError(f"{name}: missing {k!r}")
                    if tuple(state[k].shape) != tuple(p.shape):
                        raise ValueError(f"{name}: {k!r} has shape {tuple(state[k].shape)}, "
                                         f"expected {tuple(p.shape)}")
                    if not state[k].is_contiguous():
                        state[k] = state[k].contiguous()
