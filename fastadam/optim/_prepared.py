"""``prepare_step``: a dense optimizer step whose arrays are checked once, then stepped many
times with only the scalars folded and the gradients checked.

Design.  ``prepare_step(name, params, slots)`` reads the optimizer's spec
(fastadam/_core/_registry.py), checks the parameters and state arrays once (types, dtype,
shapes, contiguity, writability, no two written buffers overlapping) and decides the device
(NumPy or CuPy) once.  ``check(**hyper)`` folds the hyper-parameters into the coefficient
object (the checks of the functional steps, in float64, and those of the arrays' precision)
without writing anything.  ``step(grads, t, **hyper)`` folds, checks only the gradients
(dtype, shape, and that none overlaps a written array), and makes the one driver call.  There
is no dry run and no exception-driven choice of path.

Per-step cost (issue 20).  A step keeps its last fold: while the hyper-parameters are the same
(same keys, exact types and values: ``same_scalars``), only ``t`` is checked and the fields
that depend on it recomputed by the spec's ``retime`` (Adam's in C); the gradients are checked
in one Cython pass (``PreparedArrays.check_grads``) against the written buffers sorted once,
which also re-reads that every written array is still writable and unmoved.  The optimizer
objects keep one prepared step per (group, dtype) bucket and one keyword dict per group.  The
step itself (``_step``), and a CPU float step's check and driver call (``CpuStep``), are
compiled in fastadam/optim/_step_path.pyx.

Low-precision steps (issue 24): when a parameter is ``ml_dtypes.bfloat16``, a state is
bfloat16 or a :class:`~fastadam.optim.QuantizedState`, or a float32 ``master`` is given, the
arrays are checked by ``fastadam/_core/_lowp_validation.py`` and each step is one call of the
low-precision driver (``_lowp.dense_step``); everything float32/float64/float16 keeps the
float driver above, unchanged.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .. import gpu as _gpu
from .._core._registry import spec as _spec
from .._core._threads import resolve_num_threads
from .._core._validation import (PreparedArrays, as_array_list, cacheable_scalars,
                                  check_array, check_disjoint)
from .._core._lowp_state import (FMT_BF16, FMT_F32, FMT_Q8, MAP_CODES, QuantizedState,
                                 check_block_size, check_quant_map)
from .._core._lowp_validation import (ROUND_CODES, check_lowp_grads, check_lowp_step,
                                      check_rounding, check_seed, is_lowp_input)
from .._core import _config, _lowp
from ._functional import check_compute_dtype
from ._step_path import CpuStep, prepared_step

__all__ = ["PreparedStep", "prepare_step"]


_DOUBLE = np.dtype(np.float64).num
_HALF = np.dtype(np.float16).num


def _label(name, i, single):
    return name if single else f"{name}[{i}]"


class PreparedStep:
    """A prepared dense step of one optimizer over fixed parameters and state arrays (build it
    with :func:`prepare_step`).

    Attributes
    ----------
    optimizer : str
        The optimizer's registry name (``"adam"``, ``"adagrad"``, ``"momentum"``,
        ``"rmsprop"``, ``"lion"``).
    slot_names : tuple of str
        The state arrays given, by their functional names.
    device : str
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy), decided once.
    """

    def __init__(self, optimizer: str, params: Any, slots: Dict[str, Any],
                 num_threads: Optional[int] = None, *, master: Any = None,
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", seed: int = 0):
        self._spec = _spec(optimizer)
        if self._spec.row_slots:  # one state value per row: its own driver, no plan yet
            raise ValueError(f"optimizer: {optimizer!r} is row-wise and has no prepared step "
                             f"yet; call its functional step (fastadam.{optimizer}_step_inplace)")
        self.optimizer = optimizer
        if not isinstance(slots, dict):
            raise TypeError(f"slots: expected a dict of state arrays by name "
                            f"{self._spec.slots}, got {type(slots).__name__}")
        unknown = sorted(set(slots) - set(self._spec.slots))
        if unknown:
            raise ValueError(f"slots: unknown state {unknown[0]!r} for {optimizer} (expected "
                             f"names among {self._spec.slots})")
        self._nt = 0 if num_threads is None else resolve_num_threads(num_threads)
        self._num_threads = num_threads  # resolved again per step (a forked child: one)
        first = params[0] if isinstance(params, (list, tuple)) and params else params
        self.device = "gpu" if _gpu.is_device_array(first) else "cpu"
        self._params_arg, self._slots_arg = params, dict(slots)
        self._names_by_flags = {}
        self._lists_by_flags = {}
        self._folded = None  # (hyper, t, coeffs, hyper with defaults): see _coefficients
        self._lowp = self._gpu_lowp = None
        self._cpu = None  # a CPU float step's arrays and driver call (_step_path.CpuStep)
        if self.device == "cpu" and (is_lowp_input(params, slots, master)
                                     or param_rounding != "nearest"):
            self._lowp = check_lowp_step(self._spec, params, slots, master=master,
                                         block_size=block_size, quant_map=quant_map,
                                         param_rounding=param_rounding, seed=seed)
            self._xs, self._single = self._lowp.xs, self._lowp.single
            self._slot_lists = self._lowp.slot_lists
            self.slot_names = self._lowp.slot_names
            self._typenum = np.dtype(np.float32).num  # computed in float32
            # gradients of the parameters' dtype pass a header-only check (PreparedArrays.plain)
            self._arrays = (PreparedArrays(self._lowp.written, self._single,
                                           self._xs[0].dtype.num) if self._xs else None)
            return
        check_block_size(block_size)  # the options of the low-precision path, checked anyway
        check_quant_map(quant_map)
        check_rounding(param_rounding)
        check_seed(seed)
        if self.device == "gpu":  # the GPU path checks its arrays in fastadam.gpu
            self.slot_names = tuple(n for n in self._spec.slots if n in slots)
            self._gpu_lowp = _gpu_lowp_plan(self._spec, params, slots, master, block_size,
                                            quant_map, param_rounding, seed)
            return
        if master is not None:
            raise ValueError("master: a float32 master copy is for bfloat16 params")
        xs, single = as_array_list(params, "params")
        typenum = -1
        for i, x in enumerate(xs):
            x = check_array(x, _label("params", i, single), typenum, None, True)
            typenum = x.dtype.num
        self._typenum = typenum if xs else np.dtype(np.float32).num
        slot_lists = {}
        for name in self._spec.slots:
            if name not in slots:
                continue
            lst, single_s = as_array_list(slots[name], name)
            if single_s != single or len(lst) != len(xs):
                raise ValueError(f"{name}: expected {'one array' if single else len(xs)} "
                                 f"like params, got {len(lst) if not single_s else 'one array'}")
            for i, (a, x) in enumerate(zip(lst, xs)):
                check_array(a, _label(name, i, single), self._typenum, x.shape, True)
            slot_lists[name] = lst
        self._written = [("params", xs, True)] + [(n, l, True) for n, l in slot_lists.items()]
        check_disjoint(self._written, single)
        self._xs, self._single, self._slot_lists = xs, single, slot_lists
        self._arrays = PreparedArrays(self._written, single, self._typenum)
        # the dtype checks of every step: float16 needs _Float16, float32/16 a float32 fold
        self._half_unsupported = (bool(xs) and self._typenum == _HALF
                                  and not _config.has_float16())
        self._check32 = bool(xs) and self._typenum != _DOUBLE
        self.slot_names = tuple(slot_lists)
        self._cpu = CpuStep(self._arrays, xs, self._typenum, self._check32,
                            self._half_unsupported, num_threads, self._lists_by_flags)

    def _fold(self, t, hyper):
        if self._spec.defaults:
            hyper = {**self._spec.defaults, **hyper}
        return self._spec.fold(t, **hyper)

    def _fold_and_keep(self, t, hyper):
        merged = {**self._spec.defaults, **hyper} if self._spec.defaults else hyper
        coeffs = self._spec.fold(t, **merged)
        self._folded = ((hyper, t if type(t) is int else None, coeffs, merged)
                        if cacheable_scalars(hyper) else None)
        return coeffs

    def _slots_for(self, coeffs):
        names = self._names_by_flags.get(coeffs.flags)
        if names is not None:
            return names
        names = [self._spec.slots[i] for i in self._spec.slot_indices(coeffs.flags)]
        missing = [n for n in names if n not in self.slot_names]
        if missing:
            raise ValueError(f"{missing[0]}: these options of {self.optimizer} need the state "
                             f"{missing[0]!r}, which the step was not prepared with")
        if self._lowp is None and self.device == "cpu":
            self._lists_by_flags[coeffs.flags] = [self._slot_lists[n] for n in names]
        self._names_by_flags[coeffs.flags] = names  # the same flags use the same slots
        return names

    def check(self, t: int = 1, **hyper: Any):
        """Validate and fold ``hyper`` for step ``t`` without writing anything; returns the
        coefficient object (TypeError/ValueError naming the argument otherwise)."""
        coeffs = self._fold(t, hyper)
        self._slots_for(coeffs)
        if self.device == "cpu" and self._xs:
            check_compute_dtype(coeffs, self._typenum, "params")
        return coeffs

    def step(self, grads: Any, t: int, *, skip_nonfinite: bool = False, **hyper: Any) -> bool:
        """One step: fold ``hyper`` (the functional step's keywords, e.g. ``lr``, ``beta1``,
        ``convention``, ``grad_scale``) for step ``t``, check ``grads`` (like ``params``), and
        update the parameters and state in place.  Returns False when ``skip_nonfinite`` found
        a NaN or an infinity (nothing written), else True."""
        return self._step(grads, t, hyper, skip_nonfinite)

    # the fold, the gradients' check and the driver call of every step, compiled (one body for
    # the CPU, low-precision and GPU steps): fastadam/optim/_step_path.pyx
    _step = prepared_step

    def _gpu_step(self, coeffs, names, grads, t, skip_nonfinite) -> bool:
        if self._gpu_lowp is not None:
            return self._gpu_lowp_step(coeffs, names, grads, t, skip_nonfinite)
        return _gpu.dense_step(coeffs, self._params_arg, grads,
                               [(n, self._slots_arg[n]) for n in names], skip_nonfinite)

    def _lowp_step(self, coeffs, names, grads, t, skip_nonfinite) -> bool:
        plan = self._lowp
        gs = (self._arrays.plain_grads(grads)
              if type(grads) is list and self._arrays is not None else None)
        if gs is not None:  # the parameters' dtype: float32 or bfloat16, as the parameters
            grad_fmt = plan.param_fmt
        else:
            if self._arrays is not None:  # every written array as prepared, else an error
                self._arrays.check_written()
            gs, grad_fmt = check_lowp_grads(plan, grads)
        coeffs.check_float32()
        lists = self._lists_by_flags.get(coeffs.flags)  # the arrays as prepared
        if lists is None:
            lists = self._lists_by_flags[coeffs.flags] = plan.driver_lists(names)
        slots, scales, signed = lists
        nt = self._nt or resolve_num_threads(None)
        return bool(_lowp.dense_step(coeffs, plan.xs, gs, slots, scales, plan.masters,
                                     plan.param_fmt, grad_fmt, plan.state_fmt, plan.block,
                                     plan.qmap, signed, plan.rounding, plan.seed, int(t),
                                     bool(skip_nonfinite), nt))

    def _gpu_lowp_step(self, coeffs, names, grads, t, skip_nonfinite) -> bool:
        """fastadam.gpu's low-precision step (it checks its arrays itself)."""
        p = self._gpu_lowp
        gs = list(grads) if isinstance(grads, (list, tuple)) else [grads]
        grad_fmt = FMT_BF16 if gs and gs[0].dtype == np.uint16 else FMT_F32
        lists = [p["slots"][n] for n in names]
        if p["state_fmt"] == FMT_Q8:
            slots = [[q.codes for q in lst] for lst in lists]
            scales = [[q.scales for q in lst] for lst in lists]
        else:
            slots, scales = lists, []
        signed = tuple(n not in self._spec.nonnegative_slots for n in names)
        return bool(_gpu.lowp_dense_step(
            coeffs, p["xs"], gs, slots, scales, p["masters"], p["param_fmt"], grad_fmt,
            p["state_fmt"], p["block"], p["qmap"], signed, p["rounding"], p["seed"], int(t),
            bool(skip_nonfinite), self._nt))

    def __repr__(self) -> str:
        n = len(self._xs) if self.device == "cpu" else "?"
        return (f"PreparedStep({self.optimizer!r}, {n} tensors, slots {self.slot_names}, "
                f"device {self.device!r})")


def _gpu_lowp_plan(spec, params, slots, master, block_size, quant_map, param_rounding, seed):
    """The formats of a low-precision step on CuPy arrays (bfloat16 as uint16 bits, CuPy
    having no bfloat16), or None for a float step; fastadam.gpu checks the arrays."""
    def as_list(obj):
        return list(obj) if isinstance(obj, (list, tuple)) else [obj]

    def fmt(a):
        if isinstance(a, QuantizedState):
            return FMT_Q8
        return FMT_BF16 if a.dtype == np.uint16 else FMT_F32

    block = check_block_size(block_size)
    quant_map = check_quant_map(quant_map)
    rounding = check_rounding(param_rounding)
    seed = check_seed(seed)
    xs = as_list(params)
    lists = {n: as_list(slots[n]) for n in spec.slots if n in slots}
    formats = {fmt(a) for lst in lists.values() for a in lst}
    param_fmt = fmt(xs[0]) if xs else FMT_F32
    if (master is None and rounding == "nearest" and param_fmt == FMT_F32
            and formats <= {FMT_F32}):
        return None
    if len(formats) > 1:
        raise TypeError("slots: expected every state in one format (float32, bfloat16 bits as "
                        "uint16, or QuantizedState)")
    for name, lst in lists.items():
        for q in lst:
            if isinstance(q, QuantizedState) and (
                    q.block_size != block or q.quant_map != quant_map
                    or q.signed != (name not in spec.nonnegative_slots)):
                raise ValueError(f"{name}: its block_size, quant_map or signed "
                                 f"({q.block_size}, {q.quant_map!r}, {q.signed}) differ from the "
                                 f"step's ({block}, {quant_map!r}, "
                                 f"{name not in spec.nonnegative_slots})")
    return dict(xs=xs, slots=lists, masters=[] if master is None else as_list(master),
                param_fmt=param_fmt, state_fmt=formats.pop() if formats else FMT_F32,
                block=block, qmap=MAP_CODES[quant_map], rounding=ROUND_CODES[rounding],
                seed=seed)


def prepare_step(optimizer: str, params: Any, slots: Dict[str, Any], *,
                 num_threads: Optional[int] = None, master: Any = None, block_size: int = 256,
                 quant_map: str = "dynamic", param_rounding: str = "nearest",
                 seed: int = 0) -> PreparedStep:
    """Prepare a dense step of ``optimizer`` over ``params`` and its state ``slots``.

    The arrays are checked once here: C-contiguous, writable, one float dtype, each slot like
    its parameter, no two of them overlapping; the device (NumPy or CuPy) is decided once.
    While the prepared step lives, NumPy refuses to resize the parameters and states it updates
    (``ndarray.resize``: the step holds a weak reference to each NumPy array).
    Then ``prepared.check(**hyper)`` validates and folds hyper-parameters without writing, and
    ``prepared.step(grads, t, **hyper)`` folds, checks the gradients only and makes one
    compiled call -- what a training loop, an ONNX training operator or a distributed
    optimizer calls every step.

    Low precision: ``params`` may be float32 or ``ml_dtypes.bfloat16``, the slots float32,
    bfloat16 or :class:`~fastadam.optim.QuantizedState` (all in one format; 8-bit slots use
    the unsigned map for the spec's ``nonnegative_slots``), gradients float32 or bfloat16
    (one dtype per step); the update is computed in float32.  See the guide page "Low-precision
    optimizer states".

    Parameters
    ----------
    optimizer : {"adam", "adagrad", "momentum", "rmsprop", "lion"}
        The registry name; its hyper-parameters are its functional step's keywords
        (:func:`fastadam.step_inplace`, :func:`fastadam.adagrad_step_inplace`,
        :func:`fastadam.momentum_step_inplace`, :func:`fastadam.rmsprop_step_inplace`,
        :func:`fastadam.lion_step_inplace`).
    params : ndarray or list of ndarray (or CuPy arrays)
        Updated in place by every step.
    slots : dict
        The state arrays by their functional names: Adam ``m``, ``v`` (``v_max`` for
        ``amsgrad``); Adagrad ``h``; momentum ``v``; RMSprop ``square_avg``
        (``momentum_buffer``, ``grad_avg``); Lion ``m``.  Each like ``params``.
    num_threads : int, optional
        As in the functional steps.
    master : ndarray or list of ndarray, optional
        Float32 master copies of bfloat16 ``params`` (DeepSpeed's mixed-precision layout): the
        step reads and writes the master and writes the params as its nearest bfloat16.
    block_size, quant_map
        What every :class:`~fastadam.optim.QuantizedState` slot must have been built with
        (8-bit states; default 256, ``"dynamic"``).
    param_rounding : {"nearest", "stochastic"}
        How bfloat16 params (without a master) are rounded: to nearest even, or
        stochastically with random bits from (``seed``, ``t``, tensor, element), so results
        do not depend on the thread count.
    seed : int
        In [0, 2**64).

    Examples
    --------
    >>> import numpy as np, fastadam
    >>> x, m, v = np.ones(3), np.zeros(3), np.zeros(3)
    >>> step = fastadam.optim.prepare_step("adam", x, {"m": m, "v": v})
    >>> step.step(np.full(3, 0.5), 1, lr=0.1, convention="torch")
    True
    >>> x
    array([0.9, 0.9, 0.9])
    """
    return PreparedStep(optimizer, params, slots, num_threads, master=master,
                        block_size=block_size, quant_map=quant_map,
                        param_rounding=param_rounding, seed=seed)
