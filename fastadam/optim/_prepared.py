"""``prepare_step``: the step plan.  An optimizer step over fixed parameters and state
arrays, checked once and then run many times with only the scalars folded and the gradients
checked; every front-end steps through one (the optimizer objects keep one per bucket, the
ONNX training operators, ``fastadam.distributed`` and ``fastadam.torch`` one per call site).

Design.  ``prepare_step(name, params, slots)`` reads the optimizer's spec
(fastadam/_core/_registry.py), classifies the arrays once (device, parameter format, state
format) and takes the driver registered for that key (fastadam/_core/_drivers.py): the row's
``prepare`` checks the arrays once (types, dtype, shapes, contiguity, writability, no two
written buffers overlapping) and returns the driver bound to them.  This module registers the
CPU rows: the float driver (``CpuStep``, compiled in fastadam/optim/_step_path.pyx) and the
low-precision one (``LowpStep``: bfloat16 parameters, bfloat16 or 8-bit states, a float32
master); ``fastadam.gpu`` registers its own.  Then

- ``check(t, **hyper)`` folds the hyper-parameters into the coefficient object (the checks of
  the functional steps, in float64, and those of the arrays' precision) without writing;
- ``run(grads, t, **hyper)`` (also ``step``) folds, checks only the gradients and makes the one
  driver call;
- ``run_sparse(k, grad, t, **hyper)`` runs the lazy (or dense-mode) sparse step of parameter
  ``k`` through the same driver.

There is no dry run and no exception-driven choice of path.  A step keeps its last fold: while
the hyper-parameters are the same only ``t`` is checked and the fields that depend on it
recomputed by the spec's ``retime`` (``_step_path.kept_fold``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .._core._drivers import device_of, find_driver, register_driver
from .._core._registry import spec as _spec
from .._core._threads import resolve_num_threads
from .._core._validation import (PreparedArrays, as_array_list, cacheable_scalars,
                                  check_array, check_disjoint)
from .._core._lowp_state import check_block_size, check_quant_map
from .._core._lowp_validation import (check_lowp_grads, check_lowp_step, check_rounding,
                                      check_seed)
from .._core import _lowp
from ..sparse import IndexedSlices
from ._clip import coalesce, is_scipy_sparse
from ._sparse_functional import sparse_step
from ._step_path import CpuStep, KeptFold, plan_step

__all__ = ["PreparedStep", "prepare_step"]


_FLOAT = np.dtype(np.float32).num


def _label(name, i, single):
    return name if single else f"{name}[{i}]"


def _cpu_float(spec, params, slots, options):
    """The CPU float row's ``prepare``: float16/float32/float64 NumPy arrays."""
    if options["master"] is not None or options["param_rounding"] != "nearest":
        # a master or stochastic rounding with float parameters: the low-precision driver's
        # checks say what is wrong
        return LowpStep(spec, params, slots, options)
    xs, single = as_array_list(params, "params")
    typenum = -1
    for i, x in enumerate(xs):
        x = check_array(x, _label("params", i, single), typenum, None, True)
        typenum = x.dtype.num
    typenum = typenum if xs else _FLOAT
    slot_lists = {}
    for name in spec.slots:
        if name not in slots:
            continue
        lst, single_s = as_array_list(slots[name], name)
        if single_s != single or len(lst) != len(xs):
            raise ValueError(f"{name}: expected {'one array' if single else len(xs)} "
                             f"like params, got {len(lst) if not single_s else 'one array'}")
        for i, (a, x) in enumerate(zip(lst, xs)):
            check_array(a, _label(name, i, single), typenum, x.shape, True)
        slot_lists[name] = lst
    written = [("params", xs, True)] + [(n, lst, True) for n, lst in slot_lists.items()]
    check_disjoint(written, single)
    return CpuStep(PreparedArrays(written, single, typenum), xs, slot_lists, typenum,
                   options["num_threads"], sparse_step)


class LowpStep:
    """The CPU low-precision driver bound to a plan's arrays (``_lowp.dense_step`` and
    ``_lowp.rows_step``; checked once by fastadam/_core/_lowp_validation.py)."""

    def __init__(self, spec, params, slots, options):
        self.spec = spec
        self.plan = plan = check_lowp_step(
            spec, params, slots, master=options["master"], block_size=options["block_size"],
            quant_map=options["quant_map"], param_rounding=options["param_rounding"],
            seed=options["seed"])
        self.xs, self.slot_names = plan.xs, plan.slot_names
        self.nt = options["nt"]
        # gradients of the parameters' dtype pass a header-only check (PreparedArrays.plain)
        self.arrays = (PreparedArrays(plan.written, plan.single, plan.xs[0].dtype.num)
                       if plan.xs else None)
        self.lists_by_flags = {}

    def lists(self, names):
        return self.plan.driver_lists(names)

    def check(self, coeffs):
        coeffs.check_float32()  # computed in float32

    def run(self, coeffs, grads, key, skip_nonfinite):
        plan = self.plan
        gs = (self.arrays.plain_grads(grads)
              if type(grads) is list and self.arrays is not None else None)
        if gs is not None:  # the parameters' dtype: float32 or bfloat16, as the parameters
            grad_fmt = plan.param_fmt
        else:
            if self.arrays is not None:  # every written array as prepared, else an error
                self.arrays.check_written()
            gs, grad_fmt = check_lowp_grads(plan, grads)
        coeffs.check_float32()
        slots, scales, signed = self.lists_by_flags[coeffs.flags]
        return bool(_lowp.dense_step(coeffs, plan.xs, gs, slots, scales, plan.masters,
                                     plan.param_fmt, grad_fmt, plan.state_fmt, plan.block,
                                     plan.qmap, signed, plan.rounding, plan.seed, int(key),
                                     bool(skip_nonfinite), self.nt or resolve_num_threads(None)))

    def run_sparse(self, coeffs, names, k, grad, t, mode, key):
        """The lazy rows step of parameter ``k``: its gradient coalesced (sorted unique rows,
        summed values, float32), then one ``_lowp.rows_step``."""
        if mode != "lazy":
            raise ValueError(f"sparse_mode: low-precision states step sparse gradients lazily "
                             f"only (touched rows); got {mode!r}")
        coeffs.check_float32()
        if self.arrays is not None:
            self.arrays.check_written()
        plan, x = self.plan, self.xs[k]
        rows, values = _rows_values(grad, x.shape)
        if not rows.size or not x.size:
            return None
        r = x.shape[0]
        slots, scales, signed = self.lists_by_flags[coeffs.flags]
        codes = [lst[k].reshape(r, -1) for lst in slots]
        master = plan.masters[k].reshape(r, -1) if plan.masters else None
        _lowp.rows_step(coeffs, x.reshape(r, -1), rows, values, codes,
                        [lst[k] for lst in scales], master, plan.param_fmt, plan.state_fmt,
                        plan.block, plan.qmap, signed, plan.rounding, plan.seed, int(key),
                        self.nt or resolve_num_threads(None))
        return None


def _rows_values(grad, shape):
    """Sorted unique int64 rows and their summed float32 values (len(rows), D)."""
    d = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    if isinstance(grad, IndexedSlices):
        g = coalesce(grad)
        rows, values = g.indices, g.values
    elif is_scipy_sparse(grad):
        g = coalesce(grad)
        rows = np.flatnonzero(np.diff(g.indptr))
        values = g[rows].toarray() if rows.size else np.empty((0, d), np.float32)
    else:
        raise TypeError(f"grad: expected IndexedSlices or CSR, got {type(grad).__name__}")
    rows = np.ascontiguousarray(rows, np.int64)
    values = np.ascontiguousarray(np.asarray(values, np.float32).reshape(rows.size, d))
    return rows, values


register_driver("cpu", "float", "float", _cpu_float)
for _p, _s in [("float", "bfloat16"), ("float", "int8"), ("bfloat16", "float"),
               ("bfloat16", "bfloat16"), ("bfloat16", "int8")]:
    register_driver("cpu", _p, _s, LowpStep)


class PreparedStep:
    """A step plan of one optimizer over fixed parameters and state arrays (build it with
    :func:`prepare_step`).

    Attributes
    ----------
    optimizer : str
        The optimizer's registry name (``"adam"``, ``"adagrad"``, ``"momentum"``,
        ``"rmsprop"``, ``"lion"``).
    slot_names : tuple of str
        The state arrays given, by their functional names.
    device : str
        ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy), decided once.
    driver : tuple of str
        The registry row that steps it: (device, parameter format, state format).
    """

    def __init__(self, optimizer: str, params: Any, slots: Dict[str, Any],
                 num_threads: Optional[int] = None, *, master: Any = None,
                 block_size: int = 256, quant_map: str = "dynamic",
                 param_rounding: str = "nearest", seed: int = 0):
        self._spec = _spec(optimizer)
        self.optimizer = optimizer
        if not isinstance(slots, dict):
            raise TypeError(f"slots: expected a dict of state arrays by name "
                            f"{self._spec.slots}, got {type(slots).__name__}")
        unknown = sorted(set(slots) - set(self._spec.slots))
        if unknown:
            raise ValueError(f"slots: unknown state {unknown[0]!r} for {optimizer} (expected "
                             f"names among {self._spec.slots})")
        options = dict(master=master, block_size=check_block_size(block_size),
                       quant_map=check_quant_map(quant_map),
                       param_rounding=check_rounding(param_rounding), seed=check_seed(seed),
                       num_threads=num_threads,
                       nt=0 if num_threads is None else resolve_num_threads(num_threads))
        first = params[0] if isinstance(params, (list, tuple)) and params else params
        device = device_of(first)
        state = next((v for v in slots.values() if v is not None), None)
        if isinstance(state, (list, tuple)):
            state = state[0] if state else None
        state_format = "float" if state is None else device.classify(state)
        if self._spec.row_slots:  # one state value per row (a row-wise optimizer's layout)
            state_format = "rows"
        row = find_driver(device.name, device.classify(first), state_format)
        self.device = device.name
        self.driver = (row.device, row.param_format, row.state_format)
        self._names_by_flags = {}
        self._kept = None  # the last fold (_step_path.KeptFold)
        self._bound = row.prepare(self._spec, params, dict(slots), options)
        self.slot_names = self._bound.slot_names

    def _fold(self, t, hyper):
        if self._spec.defaults:
            hyper = {**self._spec.defaults, **hyper}
        return self._spec.fold(t, **hyper)

    def _fold_and_keep(self, t, hyper):
        merged = {**self._spec.defaults, **hyper} if self._spec.defaults else hyper
        coeffs = self._spec.fold(t, **merged)
        self._kept = (KeptFold(hyper, t if type(t) is int else None, coeffs, merged,
                               self._spec.retime) if cacheable_scalars(hyper) else None)
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
        self._bound.lists_by_flags[coeffs.flags] = self._bound.lists(names)
        self._names_by_flags[coeffs.flags] = names  # the same flags use the same slots
        return names

    def check(self, t: int = 1, **hyper: Any):
        """Validate and fold ``hyper`` for step ``t`` without writing anything; returns the
        coefficient object (TypeError/ValueError naming the argument otherwise)."""
        coeffs = self._fold(t, hyper)
        self._slots_for(coeffs)
        self._bound.check(coeffs)
        return coeffs

    def run(self, grads: Any, t: int, *, skip_nonfinite: bool = False, **hyper: Any) -> bool:
        """One step: fold ``hyper`` (the functional step's keywords, e.g. ``lr``, ``beta1``,
        ``convention``, ``grad_scale``) for step ``t``, check ``grads`` (like ``params``), and
        update the parameters and state in place.  Returns False when ``skip_nonfinite`` found
        a NaN or an infinity (nothing written), else True."""
        return self._step(grads, t, hyper, skip_nonfinite)

    step = run

    def run_sparse(self, k: int, grad: Any, t: int, *, mode: str = "lazy", **hyper: Any) -> None:
        """The sparse step of parameter ``k`` (an index into ``params``): ``grad`` an
        ``IndexedSlices``, an ``(indices, values)`` pair or a SciPy CSR matrix, duplicates
        summed; ``mode`` as in :func:`fastadam.sparse_step_inplace` (low-precision states:
        ``"lazy"`` only).  Checked before anything is written."""
        return self._run_sparse(k, grad, t, hyper, mode)

    def _run_sparse(self, k, grad, t, hyper, mode, key=None):
        coeffs = self._fold(t, hyper)
        names = self._slots_for(coeffs)
        self._bound.check(coeffs)
        return self._bound.run_sparse(coeffs, names, k, grad, t, mode,
                                      t if key is None else key)

    # the fold, the gradients' check and the driver call of every step, compiled
    # (fastadam/optim/_step_path.pyx)
    _step = plan_step

    def __repr__(self) -> str:
        return (f"PreparedStep({self.optimizer!r}, {len(self._bound.xs)} tensors, slots "
                f"{self.slot_names}, driver {self.driver})")


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
