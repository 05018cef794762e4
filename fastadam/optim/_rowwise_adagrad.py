"""Row-wise Adagrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``, TorchRec's default for large embedding
tables): its fold, spec, functional steps (dense and sparse) and optimizer object.

One accumulator per row of the parameter (rows: the first axis) instead of one per element:
4 bytes of state per row of a float32 table, where Adagrad keeps 4 per element.  The row
formula is include/fastadam/rowwise_adagrad.h, a ``FA_ROWWISE_OPTIMIZER`` row of the
registration list: the first optimizer whose state slot is not shaped like the parameter, so
its dense step has a driver of its own (``_dense.rowwise_step``: chunks of whole rows) and its
sparse step the shared row walk with a one-value-per-row slot.  This module folds the
hyper-parameters once per step in float64, registers the spec (``row_slots``: the base class
and the sparse step shape the slot from it) and builds the public functions and the
``RowWiseAdagrad`` class.  No low-precision states: the accumulator is already one value per row.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import gpu as _gpu
from .._core import _dense
from .._core._coeffs import FLAG_L2, StructCoefficients
from .._core._drivers import register_driver
from .._core._registry import OptimizerSpec, register
from .._core._threads import resolve_num_threads
from .._core._sparse_host import run_threaded
from .._core._validation import as_array_list, check_array, check_disjoint
from ._base import Optimizer, ParamsLike, check_bool, check_choice, check_real
from ._checks import check_rule, real_or_schedule
from ._coefficients import _grad_scale, finite_float, step_number
from ._functional import Arrays, check_compute_dtype

__all__ = ["RowWiseAdagrad", "rowwise_adagrad_step_inplace",
           "sparse_rowwise_adagrad_step_inplace"]

FIELDS = ("lr", "eps", "sign", "grad_scale", "l2", "decay_mul")
_FINITE32 = ((0, "lr"), (1, "eps"), (3, "grad_scale"), (4, "weight_decay"))
_NONZERO32 = ((1, "eps"), (3, "grad_scale"))
#: FBGEMM's WeightDecayMode: L2 (1) adds weight_decay * x to the gradient of the row's
#: accumulator and scales x by 1 - m * weight_decay; DECOUPLED (2) scales x by
#: 1 - lr * weight_decay.  No decay (NONE, 0) is weight_decay = 0 in either mode.
WEIGHT_DECAY_MODES = ("l2", "decoupled")
#: One rule per hyper-parameter, (low, high) of a closed range (None: no upper bound), applied
#: by the fold, so every entry point (functional, sparse, objects, fastadam.torch) shares it;
#: eps must be > 0 (the denominator of a zero accumulator), checked beside it.
HYPER_RULES = {"lr": (0.0, None), "lr_decay": (0.0, None), "weight_decay": (0.0, None)}
#: FBGEMM's TBE defaults (learning_rate 0.01, eps 1e-8)
DEFAULTS = dict(lr=1e-2, eps=1e-8)
_KIND_DENSE = 5  # the measured thread choice's kind for this driver (_core/_threads.py)


def rowwise_adagrad_coefficients(t, *, lr=1e-2, lr_decay=0.0, eps=1e-8, weight_decay=0.0,
                                 weight_decay_mode="l2", maximize=False, grad_scale=None):
    """The coefficient object of row-wise Adagrad's step ``t`` (formula:
    include/fastadam/rowwise_adagrad.h): this step's rate ``lr / (1 + (t - 1) * lr_decay)``
    (t >= 1), and the weight decay of ``weight_decay_mode``."""
    rules = HYPER_RULES
    lr = check_rule(finite_float(lr, "lr"), "lr", rules["lr"])
    lr_decay = check_rule(finite_float(lr_decay, "lr_decay"), "lr_decay", rules["lr_decay"])
    eps = finite_float(eps, "eps")
    if not eps > 0.0:
        raise ValueError(f"eps: expected eps > 0, got {eps}")
    weight_decay = check_rule(finite_float(weight_decay, "weight_decay"), "weight_decay",
                              rules["weight_decay"])
    if not isinstance(weight_decay_mode, str) or weight_decay_mode not in WEIGHT_DECAY_MODES:
        raise ValueError(f"weight_decay_mode: expected one of {WEIGHT_DECAY_MODES}, got "
                         f"{weight_decay_mode!r}")
    t = step_number(t)
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1, got {t}")
    rate = lr / (1.0 + (t - 1) * lr_decay) if lr_decay else lr
    flags, divisor = _grad_scale(grad_scale)
    l2, decay_mul = 0.0, 1.0
    if weight_decay != 0.0:
        if weight_decay_mode == "l2":
            flags |= FLAG_L2
            l2 = weight_decay
        else:
            decay_mul = 1.0 - rate * weight_decay
    values = (rate, eps, -1.0 if maximize else 1.0, divisor, l2, decay_mul)
    return StructCoefficients(SPEC.kind, FIELDS, values, flags, divisor, _FINITE32, _NONZERO32)


SPEC = register(OptimizerSpec(
    name="rowwise_adagrad", fold=rowwise_adagrad_coefficients, retime=None, fields=FIELDS,
    slots=("acc",), object_slots=("sum",), row_slots=("acc",), onnx_op=None, torch_name=None,
    nonnegative_slots=("acc",), defaults=dict(DEFAULTS)))


def _rows_of(shape):
    """(rows, elements per row) of a parameter of ``shape``: rows are the first axis, and a
    0-d parameter is one row of one element."""
    if not shape:
        return 1, 1
    n = 1
    for d in shape[1:]:
        n *= d
    return shape[0], n


def rowwise_adagrad_step_inplace(x: Arrays, g: Arrays, acc: Arrays, t: int, *,
                                 lr: float = 1e-2, lr_decay: float = 0.0, eps: float = 1e-8,
                                 weight_decay: float = 0.0, weight_decay_mode: str = "l2",
                                 maximize: bool = False, grad_scale: Optional[float] = None,
                                 skip_nonfinite: bool = False,
                                 num_threads: Optional[int] = None) -> bool:
    """One fused row-wise Adagrad step, in place, on one array or a list of arrays.

    One accumulator per row (rows are the first axis: a table of shape ``(n, d)`` has ``n``
    rows of ``d`` elements, a 1-D array ``n`` rows of one element, a 0-d array one row).
    Per row ``r`` (scalars folded in float64 once per call; the row computed in the arrays'
    precision)::

        g' = (-1 if maximize else 1) * g[r] / grad_scale
        d  = g' + weight_decay * x[r]      # "l2"; d = g' for "decoupled"
        acc[r] += mean(d**2)
        m  = rate / (sqrt(acc[r]) + eps)
        c  = 1 - m * weight_decay          # "l2"
        c  = 1 - rate * weight_decay       # "decoupled"
        x[r] = c * x[r] - m * g'

    with ``rate = lr / (1 + (t - 1) * lr_decay)``.  This is FBGEMM's ``EXACT_ROWWISE_ADAGRAD``
    (``momentum1`` is ``acc``; ``weight_decay_mode`` L2 and DECOUPLED; NONE is
    ``weight_decay=0``) and TorchRec's ``RowWiseAdagrad`` (its L2 weight decay).  The sum of
    a row's squares is taken in a fixed order (eight interleaved partial sums), so the result
    is bit-identical for any thread count and CPU level.  A row of zero elements is left alone.

    Parameters
    ----------
    x, g : ndarray or list of ndarray
        Parameters and gradient: C-contiguous, one dtype (float32 or float64), ``g[i]`` of
        ``x[i]``'s shape.  ``x`` is updated in place; ``g`` is only read.
    acc : ndarray or list of ndarray
        The accumulators, ``x[i].shape[:1]`` (one value per row), ``x``'s dtype, C-contiguous,
        updated in place (start them at 0, or TorchRec's ``initial_accumulator_value``).
    t : int
        Step number of this update (>= 1; only ``lr_decay`` uses it).
    lr, lr_decay, weight_decay : float
        >= 0.
    eps : float
        > 0 (FBGEMM's default 1e-8).
    weight_decay_mode : {"l2", "decoupled"}
    grad_scale, skip_nonfinite, num_threads
        As in :func:`fastadam.step_inplace`.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    coeffs = rowwise_adagrad_coefficients(t, lr=lr, lr_decay=lr_decay, eps=eps,
                                          weight_decay=weight_decay,
                                          weight_decay_mode=weight_decay_mode,
                                          maximize=maximize, grad_scale=grad_scale)
    return rowwise_dense_step(coeffs, x, g, acc, skip_nonfinite, num_threads)


def rowwise_dense_step(coeffs, x, g, acc, skip_nonfinite, num_threads):
    """Validate and run one dense step of the row-wise optimizer ``coeffs`` describes (all
    checks before any write)."""
    if _gpu.holds_device_array(x):  # CuPy: fastadam/gpu/_rowwise.py
        return _gpu.rowwise_dense_step(coeffs, x, g, acc, skip_nonfinite)
    if _gpu.holds_device_array(g) or _gpu.holds_device_array(acc):
        _gpu.explain_mix([("g", g), ("acc", acc)])
    nt = None if num_threads is None else resolve_num_threads(num_threads)
    xs, single = as_array_list(x, "x")
    gs, single_g = as_array_list(g, "g")
    accs, single_a = as_array_list(acc, "acc")
    if not single == single_g == single_a:
        raise TypeError("x, g, acc: pass either one ndarray each or a list of ndarrays each")
    if len(gs) != len(xs):
        raise ValueError(f"g: expected a list of {len(xs)} arrays like x, got {len(gs)}")
    if len(accs) != len(xs):
        raise ValueError(f"acc: expected a list of {len(xs)} arrays (one value per row of "
                         f"each x), got {len(accs)}")
    typenum = -1
    for i, (xi, gi, ai) in enumerate(zip(xs, gs, accs)):
        at = "" if single else f"[{i}]"
        xi = check_array(xi, "x" + at, typenum, None, True)
        if typenum < 0:
            typenum = xi.dtype.num
            if xi.dtype not in (np.float32, np.float64):
                raise TypeError(f"x{at}: expected float32 or float64 (row-wise kernels), "
                                f"got {xi.dtype}")
        check_array(gi, "g" + at, typenum, xi.shape, False)
        check_array(ai, "acc" + at, typenum, xi.shape[:1], True)
    if not xs:
        return True
    check_compute_dtype(coeffs, typenum)
    check_disjoint([("x", xs, True), ("g", gs, False), ("acc", accs, True)], single)
    args = (coeffs, xs, gs, accs, typenum, bool(skip_nonfinite))
    work = sum(int(a.size) for a in xs)
    return run_threaded(_dense.rowwise_step, args, work, 0 if nt is None else nt, _KIND_DENSE)


def sparse_rowwise_adagrad_step_inplace(x: np.ndarray, grad: Any, acc: np.ndarray, t: int, *,
                                        mode: str = "lazy",
                                        last_step: Optional[np.ndarray] = None,
                                        lr: float = 1e-2, lr_decay: float = 0.0,
                                        eps: float = 1e-8, weight_decay: float = 0.0,
                                        weight_decay_mode: str = "l2", maximize: bool = False,
                                        indices_sorted_unique: bool = False,
                                        num_threads: Optional[int] = None) -> None:
    """One row-wise Adagrad step with a sparse gradient, in place.

    The update of a row is :func:`fastadam.rowwise_adagrad_step_inplace`'s, with ``g`` the
    row's summed gradient (duplicate indices summed first, as :func:`segment_sum` sums them:
    stable, in their original order).  ``acc`` has shape ``x.shape[:1]``.  Modes, gradient
    forms (an IndexedSlices or an ``(indices, values)`` pair: a CSR gradient is element-wise
    and is refused), ``indices_sorted_unique`` and checks are those of
    :func:`fastadam.sparse_step_inplace`: ``"lazy"`` updates the touched rows only (FBGEMM's
    TBE backward), ``"dense"`` every row (an untouched row with ``g = 0``: only weight decay
    moves it), bit-identical to the dense step on the densified gradient; an accumulator never
    decays, so ``"catchup"`` is ``"lazy"`` that also maintains ``last_step``.
    """
    from ._sparse_functional import sparse_step

    coeffs = rowwise_adagrad_coefficients(t, lr=lr, lr_decay=lr_decay, eps=eps,
                                          weight_decay=weight_decay,
                                          weight_decay_mode=weight_decay_mode,
                                          maximize=maximize)
    return sparse_step(coeffs, x, grad, [("acc", acc)], t, mode, last_step, num_threads,
                       indices_sorted_unique)


SPARSE_MODES = ("lazy", "dense")


class RowWiseAdagrad(Optimizer):
    """Row-wise Adagrad over ndarrays or ``fastadam.autodiff.Tensor`` objects, updated in place.

    Per row ``r`` of each parameter (rows: the first axis), as
    :func:`fastadam.rowwise_adagrad_step_inplace` documents::

        d = g[r] + weight_decay*x[r];  sum[r] += mean(d**2);  m = lr_t / (sqrt(sum[r]) + eps)
        x[r] = (1 - m*weight_decay)*x[r] - m*g[r]          # weight_decay_mode="l2"

    with ``lr_t = lr / (1 + k*lr_decay)`` (``k`` the steps already applied) and the slot
    ``"sum"`` (one value per row, of the parameter's dtype) starting at
    ``initial_accumulator_value``.  It keeps 4 bytes of state per row of a float32 table
    where :class:`fastadam.Adagrad` keeps 4 per element (a 64-wide embedding: 1/64 of the
    memory), at the price of one learning rate per row instead of per element.

    Parameters
    ----------
    params, clip_grad_norm, num_threads, sparse_mode
        As for :class:`fastadam.Adam` (float32 or float64 parameters).
    lr : float or callable
        >= 0 (default 1e-2), or a schedule.
    lr_decay, weight_decay, initial_accumulator_value : float
        >= 0.
    eps : float
        > 0 (default 1e-8, FBGEMM's).
    weight_decay_mode : {"l2", "decoupled"}
        FBGEMM's L2 or DECOUPLED (see above).
    maximize : bool
    state_dtype : {"float32"}
        The accumulators have the parameters' dtype; 8-bit and bfloat16 states (and bfloat16
        parameters) are refused: a row-wise state is already 1/row of Adagrad's.
    """

    group_keys = ("lr", "lr_decay", "eps", "weight_decay", "weight_decay_mode",
                  "initial_accumulator_value", "maximize", "sparse_mode")

    def __init__(self, params: ParamsLike, lr: Any = 1e-2, lr_decay: float = 0.0,
                 eps: float = 1e-8, weight_decay: float = 0.0, weight_decay_mode: str = "l2",
                 initial_accumulator_value: float = 0.0, maximize: bool = False,
                 sparse_mode: str = "lazy", clip_grad_norm: Optional[float] = None,
                 num_threads: Optional[int] = None, state_dtype: str = "float32"):
        if state_dtype != "float32":
            raise ValueError(f"state_dtype: RowWiseAdagrad keeps one accumulator per row in the "
                             f"parameters' dtype (expected 'float32'); 8-bit and bfloat16 "
                             f"row-wise states are not supported, got {state_dtype!r}")
        super().__init__(params, dict(
            lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
            weight_decay_mode=weight_decay_mode,
            initial_accumulator_value=initial_accumulator_value, maximize=maximize,
            sparse_mode=sparse_mode, clip_grad_norm=clip_grad_norm, num_threads=num_threads))

    def check_group(self, hyper: Dict[str, Any]) -> Dict[str, Any]:
        h = dict(hyper)
        # types here; the ranges are HYPER_RULES's and eps > 0, applied by the fold below
        h["lr"] = real_or_schedule(h["lr"])
        h["lr_decay"] = check_real(h["lr_decay"], "lr_decay", None)
        h["eps"] = check_real(h["eps"], "eps", None)
        h["weight_decay"] = check_real(h["weight_decay"], "weight_decay", None)
        h["weight_decay_mode"] = check_choice(h["weight_decay_mode"], "weight_decay_mode",
                                              WEIGHT_DECAY_MODES)
        h["initial_accumulator_value"] = check_real(h["initial_accumulator_value"],
                                                    "initial_accumulator_value")
        h["maximize"] = check_bool(h["maximize"], "maximize")
        h["sparse_mode"] = check_choice(h["sparse_mode"], "sparse_mode", SPARSE_MODES)
        rowwise_adagrad_coefficients(1, **self._scalars(h, 0.0 if callable(h["lr"]) else h["lr"]))
        return h

    def _enable_lowp(self) -> None:
        raise TypeError("params: RowWiseAdagrad takes float32 or float64 parameters (its "
                        "accumulators have their dtype); bfloat16 parameters are not supported")

    @staticmethod
    def _scalars(h: Dict[str, Any], lr: float) -> Dict[str, Any]:
        return dict(lr=lr, lr_decay=h["lr_decay"], eps=h["eps"], weight_decay=h["weight_decay"],
                    weight_decay_mode=h["weight_decay_mode"], maximize=h["maximize"])

    spec_name = "rowwise_adagrad"

    def slot_specs(self, hyper: Dict[str, Any]) -> List[Tuple[str, float]]:
        return [("sum", hyper["initial_accumulator_value"])]

    def step_hyper(self, h, lr, grad_scale):
        return dict(self._scalars(h, lr), grad_scale=grad_scale)


class RowwiseStep:
    """The CPU driver of a row-wise optimizer's plan, registered for the state format
    ``"rows"`` (one state value per row of each parameter; fastadam/_core/_drivers.py): each
    step is :func:`rowwise_dense_step` (its checks and ``_dense.rowwise_step``), and a sparse
    gradient the sparse row walk with the row-wise kind."""

    arrays = None  # no header-only gradient check: Optimizer.step takes its general route

    def __init__(self, spec, params, slots, options):
        if options["master"] is not None or options["param_rounding"] != "nearest":
            raise ValueError("params: a row-wise optimizer steps float32 or float64 "
                             "parameters (no float32 master, no stochastic rounding)")
        self.params, self.slots = params, slots
        self.xs = as_array_list(params, "params")[0]
        self.slot_names = tuple(n for n in spec.slots if n in slots)
        self.num_threads = options["num_threads"]
        self.lists_by_flags = {}

    def lists(self, names):
        return [self.slots[n] for n in names]

    def check(self, coeffs):
        if self.xs and self.xs[0].dtype != np.float64:
            check_compute_dtype(coeffs, self.xs[0].dtype.num)

    def run(self, coeffs, grads, key, skip_nonfinite):
        (acc,) = self.lists_by_flags[coeffs.flags]
        return rowwise_dense_step(coeffs, self.params, grads, acc, skip_nonfinite,
                                  self.num_threads)

    def run_sparse(self, coeffs, names, k, grad, t, mode, key):
        from ._sparse_functional import sparse_step
        slots = [(n, as_array_list(self.slots[n], n)[0][k]) for n in names]
        return sparse_step(coeffs, self.xs[k], grad, slots, t, mode, None, self.num_threads)


register_driver("cpu", "float", "rows", RowwiseStep)
