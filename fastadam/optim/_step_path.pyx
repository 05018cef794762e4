"""The code every training step runs, compiled: the step plan's run and ``Optimizer.step``.

Design.  Issue 20 asks ``Adam.step`` on one 1e3-element float32 tensor for at most 1.5 us (issue
38: 1.2 us); in Python, the attribute reads, tuple checks and method calls of a step cost about
2 us above the kernel.  So the two functions every step goes through are here:

- ``plan_step`` is ``PreparedStep._step`` (fastadam/optim/_prepared.py): the fold kept across
  steps and re-timed (``kept_fold``), then the one call of the plan's driver.  ``CpuStep`` is
  the CPU float driver (registered in fastadam/optim/_prepared.py): its arrays, checked once,
  and its compiled call; every other driver (low precision, GPU) is called through its ``run``.
- ``optimizer_step`` is ``Optimizer.step``: when the optimizer has one plan over all its
  parameters (``opt._common``, set by ``Optimizer._refresh`` whenever something changes) and
  the gradients are a plain list of its parameters' dtype and shapes, it runs that plan's fold
  and driver call itself; everything else is ``Optimizer._step``, which runs the same plans.
  There is no kept copy of a step: the plan is the step.
"""
import os

cimport numpy as cnp

from fastadam._core._coeffs cimport Coefficients
from fastadam._core._dense cimport dense_step as driver_step

from fastadam import gpu as _gpu
from fastadam._core import _config
from fastadam._core._dense import dense_step as _dense_step_py  # for the thread chooser
from fastadam._core._dense import set_serial_left
from fastadam._core._threads import adaptive_threads, resolve_num_threads
from fastadam._core._validation import check_step_arrays, same_scalars

cnp.import_array()

KIND_DENSE = 0  # the chooser's kind for dense steps; the driver holds its serial countdowns
adaptive_threads.fast_paths[KIND_DENSE] = set_serial_left

cdef object _run_adaptive = adaptive_threads.run
cdef int _HALF = cnp.NPY_FLOAT16
cdef int _DOUBLE = cnp.NPY_DOUBLE


def check_compute_dtype(coeffs, typenum, name="x"):
    """The dtype checks every step shares once the arrays are validated: float16 needs a build
    with _Float16, and float32/float16 steps need hyper-parameters that float32 can hold."""
    if typenum == _HALF and not _config.has_float16():
        raise TypeError(f"{name}: float16 is not supported by this build of fastadam (its "
                        f"compiler has no _Float16; see fastadam.show_config()); use float32")
    if typenum != _DOUBLE:
        coeffs.check_float32()


def dense_step(coeffs, x, g, slots, skip_nonfinite, num_threads):
    """The functional steps' dense step (fastadam/optim/_functional.py): validate and run one
    dense step of the optimizer ``coeffs`` describes; ``slots`` are its state arguments as
    (name, array or list) pairs in slot order."""
    if type(x) is not cnp.ndarray and _gpu.holds_device_array(x):  # CuPy: fastadam/gpu
        return _gpu.dense_step(coeffs, x, g, slots, skip_nonfinite)
    # None: the measured choice of fastadam/_core/_threads.py (0 here); a bad count raises first
    nt = 0 if num_threads is None else resolve_num_threads(num_threads)
    try:
        xs, gs, slot_lists, typenum = check_step_arrays(x, g, slots)
    except TypeError:
        _gpu.explain_mix([("g", g)] + slots)  # a CuPy array beside a NumPy x: say so
        raise
    if typenum != _DOUBLE and xs:  # no tensor, no dtype: nothing to check it in
        check_compute_dtype(coeffs, typenum)
    return _drive(coeffs, xs, gs, slot_lists, typenum, bool(skip_nonfinite), nt)


cdef object _drive(Coefficients coeffs, list xs, list gs, list slot_lists, int typenum,
                   bint skip, int nt):
    """The driver call on checked arrays.  nt == 0: one thread below PARALLEL_MIN and between
    the chooser's looks, decided in the driver; None back from it means "not run: the
    measured thread choice runs it" (fastadam/_core/_threads.py)."""
    done = driver_step(coeffs, xs, gs, slot_lists, typenum, skip, nt)
    if done is None:
        return _run_adaptive(_dense_step_py, (coeffs, xs, gs, slot_lists, typenum, skip),
                             sum([a.size for a in xs]), KIND_DENSE)
    return done

# a forked child resolves every thread count through _threads (one thread, one warning)
cdef bint _forked = False


def _mark_forked():
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


cdef class CpuStep:
    """The CPU float driver bound to a plan's arrays (checked once by ``prepare``) and its one
    compiled call per step."""
    cdef readonly object arrays   # fastadam._core._validation.PreparedArrays
    cdef readonly list xs
    cdef readonly dict slot_lists
    cdef readonly tuple slot_names
    cdef int typenum
    cdef bint check32             # float32/float16 steps check the fold in float32
    cdef bint half_unsupported
    cdef object num_threads       # the user's value
    cdef int fixed_threads        # num_threads when a plain count resolve_num_threads keeps
    cdef public dict lists_by_flags
    cdef object sparse_fn         # fastadam.optim._sparse_functional.sparse_step

    def __init__(self, arrays, list xs, dict slot_lists, int typenum, num_threads, sparse_fn):
        self.arrays = arrays
        self.xs = xs
        self.slot_lists = slot_lists
        self.slot_names = tuple(slot_lists)
        self.typenum = typenum
        self.check32 = bool(xs) and typenum != _DOUBLE
        self.half_unsupported = bool(xs) and typenum == _HALF and not _config.has_float16()
        self.num_threads = num_threads
        self.fixed_threads = 0
        if (type(num_threads) is int and num_threads > 0
                and resolve_num_threads(num_threads) == num_threads):
            self.fixed_threads = num_threads
        self.lists_by_flags = {}
        self.sparse_fn = sparse_fn

    def lists(self, names):
        return [self.slot_lists[n] for n in names]

    def check(self, coeffs):
        """The dtype checks of a fold (a value float32 cannot hold), writing nothing."""
        if self.xs:
            check_compute_dtype(coeffs, self.typenum, "params")

    def run(self, Coefficients coeffs, grads, key, skip):
        return self.drive(coeffs, self.arrays.check_grads(grads), bool(skip))

    cdef object drive(self, Coefficients coeffs, list gs, bint skip):
        """The step on gradients that passed check_grads or plain_grads."""
        cdef int nt
        if self.check32:
            if self.half_unsupported:
                check_compute_dtype(coeffs, self.typenum, "params")
            coeffs.check_float32()
        lists = self.lists_by_flags[coeffs.flags]
        if self.fixed_threads > 0 and not _forked:
            nt = self.fixed_threads
        elif self.num_threads is None:
            nt = 0
        else:
            nt = resolve_num_threads(self.num_threads)
        return _drive(coeffs, self.xs, gs, <list?>lists, self.typenum, skip, nt)

    def run_sparse(self, coeffs, names, Py_ssize_t k, grad, t, mode, key):
        """The sparse step of parameter ``k`` (its arrays as prepared)."""
        self.arrays.check_written()
        return self.sparse_fn(coeffs, self.xs[k], grad,
                            [(n, self.slot_lists[n][k]) for n in names], t, mode, None,
                            self.num_threads)


cdef object _retimed(Coefficients coeffs, t, merged, retime):
    """``coeffs`` (folded from the keywords ``merged``) for step ``t``: in C where the
    coefficients can (Adam's), else by the spec's ``retime``."""
    c = coeffs.retimed(t, merged)
    return c if c is not None else retime(coeffs, t, merged)


cdef class KeptFold:
    """A plan's last fold: the keywords it was given, the step number and coefficients, the
    keywords with the spec's defaults, and the spec's ``retime``."""
    cdef object hyper
    cdef object t              # an int, or None
    cdef Coefficients coeffs
    cdef object merged
    cdef object retime

    def __init__(self, hyper, t, Coefficients coeffs, merged, retime):
        self.hyper, self.t, self.coeffs = hyper, t, coeffs
        self.merged, self.retime = merged, retime


cdef object kept_fold(plan, t, hyper):
    """The plan's coefficients for ``hyper`` at step ``t``.  The fold is kept: a set of
    hyper-parameters is folded (and so checked) once; while a step passes the same set (the
    same dict, or one with the same keys, exact types and equal values, the sign of a zero
    included: :func:`same_scalars`), only ``t`` is checked and the fields that depend on it
    recomputed, by the spec's ``retime``.  Values that could change in place (0-d arrays) or
    compare equal across types are never kept."""
    cdef KeptFold k
    f = plan._kept
    if f is not None:
        k = <KeptFold>f
        if hyper is k.hyper or same_scalars(hyper, k.hyper):
            if type(t) is int and k.t is not None and <object>t == k.t:
                return k.coeffs
            if k.retime is not None:
                k.coeffs = <Coefficients?>_retimed(k.coeffs, t, k.merged, k.retime)
                k.t = t if type(t) is int else None
                return k.coeffs
    coeffs = plan._fold_and_keep(t, hyper)
    if (<Coefficients?>coeffs).flags not in plan._names_by_flags:
        plan._slots_for(coeffs)
    return coeffs


def plan_step(self, grads, t, hyper, skip_nonfinite, key=None):
    """``PreparedStep._step``: fold (kept) and one driver call.  ``key`` is the step number of
    stochastic rounding (default ``t``)."""
    coeffs = kept_fold(self, t, hyper)
    bound = self._bound
    if type(bound) is CpuStep:
        return (<CpuStep>bound).run(coeffs, grads, key, skip_nonfinite)
    return bound.run(coeffs, grads, t if key is None else key, bool(skip_nonfinite))


def optimizer_step(self, grads=None, *, grad_scale=None, skip_nonfinite=False):
    """Apply one step; returns True, or False if ``skip_nonfinite`` found a NaN or an
    infinity in a gradient (then nothing changes and ``t`` does not advance).

    Parameters
    ----------
    grads : list, optional
        One gradient per parameter (``None``: leave that parameter and its state alone this
        step): ndarray, ``fastadam.autodiff.Tensor``, ``IndexedSlices`` or SciPy CSR, mixed
        freely.  A single gradient may be passed bare when there is one parameter.  Omitted:
        the ``.grad`` of each ``fastadam.autodiff.Tensor`` parameter.
    grad_scale : float, optional
        Loss-scaling factor: gradients are divided by it (non-zero, finite).
    skip_nonfinite : bool
        Skip the whole step if any gradient (divided by ``grad_scale``) is not finite.
    """
    cdef list gl
    common = self._common
    if common is not None and grad_scale is None and skip_nonfinite is False:
        if type(grads) is list:
            gl = <list>grads
        elif type(grads) is cnp.ndarray or type(grads) is tuple:
            gl = [grads] if type(grads) is cnp.ndarray else list(grads)
        else:
            gl = None
        if gl is not None:
            lock = self._lock
            lock.acquire()
            try:
                if self._common is common:
                    done = _common_step(self, <tuple>common, gl)
                    if done is not None:
                        return done
            finally:
                lock.release()
    return self._step(grads, grad_scale=grad_scale, skip_nonfinite=skip_nonfinite)


cdef object _common_step(opt, tuple common, list gl):
    """The step of an optimizer whose one plan covers every parameter, on plain gradients
    (None when they are not: ``Optimizer._step`` takes them)."""
    plan = common[0]
    gi = common[1]
    bound = plan._bound
    arrays = bound.arrays
    if arrays is None:
        return None
    gs = arrays.plain_grads(gl)
    if gs is None:
        return None
    h = opt._groups[gi]
    kept = opt._step_hypers[gi]  # Optimizer._hyper_of, inline: this is every step's path
    lr = h["lr"]
    if (kept is None or (<tuple>kept)[0] is not h or (<tuple>kept)[2] is not None
            or not ((<tuple>kept)[1] is lr or (lr == (<tuple>kept)[1] and lr != 0.0))):
        opt._hyper_of(gi, lr, None)
        kept = opt._step_hypers[gi]
    t = opt.t + (<tuple>kept)[4]
    coeffs = kept_fold(plan, t, (<tuple>kept)[3])
    if type(bound) is CpuStep:
        done = (<CpuStep>bound).drive(coeffs, <list>gs, False)
    else:
        done = bound.run(coeffs, gs, opt.t + 1, False)
    if done:
        opt.t += 1
    return bool(done)
