"""The code every training step runs, compiled: ``Optimizer.step`` and ``PreparedStep._step``.

Design.  Issue 20 asks ``Adam.step`` on one 1e3-element float32 tensor for at most 1.5 us.
In Python, the step's attribute reads, tuple checks and method calls cost about 2 us above the
kernel.  Three pieces here:

- ``prepared_step`` is ``PreparedStep._step`` (bound in fastadam/optim/_prepared.py): the fold
  kept across steps, then the low-precision, GPU or CPU call;
- ``CpuStep`` is a CPU float prepared step's arrays and its one driver call (the gradients'
  check, the float32 check of the fold, the thread count, ``_dense.dense_step`` called as C);
- ``optimizer_step`` is ``Optimizer.step`` (bound in fastadam/optim/_base.py).  Its common
  case, one plain list of dense gradients through a single bucket's prepared step at a fixed
  learning rate, without ``grad_scale``, ``skip_nonfinite`` or clipping, runs through a
  ``KeptStep``: what that case reads, kept by the Python step (``Optimizer._any_step``) after
  it took the case itself.  Each step re-reads, under the object's lock, the few attributes
  that any change to the optimizer replaces (the group's dict, its kept fold keywords, the
  bucket's prepared step, ``num_threads``, the clipping threshold), and takes the Python step
  when one differs; every Python step drops the kept one first, and methods that change the
  optimizer drop it too.  So nothing here decides differently from the Python step: every
  other case, and every error, is ``_any_step``'s.
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
    """The CPU float arrays of a prepared step, checked once by ``PreparedStep``, and the one
    driver call of each step."""
    cdef object arrays       # fastadam._core._validation.PreparedArrays
    cdef list xs
    cdef int typenum
    cdef bint check32        # float32/float16 steps check the fold in float32
    cdef bint half_unsupported
    cdef object num_threads  # the user's value
    cdef int fixed_threads   # num_threads when a plain count resolve_num_threads returns as is
    cdef dict lists_by_flags  # the PreparedStep's: the slot lists the flags use

    def __init__(self, arrays, list xs, int typenum, bint check32, bint half_unsupported,
                 num_threads, dict lists_by_flags):
        self.arrays = arrays
        self.xs = xs
        self.typenum = typenum
        self.check32 = check32
        self.half_unsupported = half_unsupported
        self.num_threads = num_threads
        self.fixed_threads = 0
        if (type(num_threads) is int and num_threads > 0
                and resolve_num_threads(num_threads) == num_threads):
            self.fixed_threads = num_threads
        self.lists_by_flags = lists_by_flags

    cdef object run(self, Coefficients coeffs, grads, bint skip):
        return self.drive(coeffs, self.arrays.check_grads(grads), skip)

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


cdef object _retimed(Coefficients coeffs, t, merged, retime):
    """``coeffs`` (folded from the keywords ``merged``) for step ``t``: in C where the
    coefficients can (Adam's), else by the spec's ``retime``."""
    c = coeffs.retimed(t, merged)
    return c if c is not None else retime(coeffs, t, merged)


def prepared_step(self, grads, t, hyper, skip_nonfinite):
    """``step`` with the hyper-parameters as a dict (the optimizer objects pass one dict
    per group, which they never change, so the fold is reused by identity).

    The fold is kept: a set of hyper-parameters is folded (and so checked) once; while a
    step passes the same set (same keys, same exact types, equal values, the sign of a
    zero included: :func:`same_scalars`), only ``t`` is checked and the fields that
    depend on it recomputed, by the spec's ``retime``.  Values that could change in place
    (0-d arrays) or compare equal across types are never kept."""
    cdef tuple folded
    f = self._folded
    if f is not None and (hyper is (<tuple>f)[0] or same_scalars(hyper, (<tuple>f)[0])):
        folded = <tuple>f
        if type(t) is int and t == folded[1]:
            coeffs = folded[2]
        else:
            retime = self._spec.retime
            if retime is not None:
                coeffs = _retimed(<Coefficients?>folded[2], t, folded[3], retime)
                self._folded = (folded[0], t if type(t) is int else None, coeffs, folded[3])
            else:
                coeffs = self._fold_and_keep(t, hyper)
    else:
        coeffs = self._fold_and_keep(t, hyper)
    names = self._names_by_flags.get(coeffs.flags)
    if names is None:
        names = self._slots_for(coeffs)
    cpu = self._cpu
    if cpu is not None:
        return (<CpuStep>cpu).run(coeffs, grads, skip_nonfinite is True or bool(skip_nonfinite))
    if self._lowp is not None:
        return self._lowp_step(coeffs, names, grads, t, skip_nonfinite)
    return self._gpu_step(coeffs, names, grads, t, skip_nonfinite)


cdef class KeptStep:
    """What an optimizer object's common step reads (see the module's docstring), kept by
    :func:`keep_common_step`."""
    cdef object lock
    cdef Py_ssize_t gi, n
    cdef object h            # the group's hyper-parameter dict
    cdef object kept         # opt._step_hypers[gi]: (h, lr, None, fold keywords, t offset)
    cdef object hyper        # kept[3]
    cdef object offset       # kept[4]
    cdef object prepared
    cdef CpuStep cpu         # a CPU float step; None for a low-precision one
    cdef object arrays       # the prepared step's PreparedArrays (the gradients' check)
    cdef object num_threads
    cdef object cls          # type(opt), whose dense_step must stay its _prepared_dense_step
    cdef object dense_fn
    cdef object retime       # the spec's retime (Adam's coefficients retime themselves)
    cdef object merged       # the fold's keywords with the spec's defaults
    cdef object t_coeffs     # the step number of coeffs
    cdef Coefficients coeffs

    cdef object run(self, opt, grads):
        cdef list gl
        if type(grads) is list:
            gl = <list>grads
        elif type(grads) is cnp.ndarray:
            gl = [grads]
        else:
            return None
        lock = self.lock
        lock.acquire()
        try:
            if (opt._step_kept is not self or opt._groups[self.gi] is not self.h
                    or opt._step_hypers[self.gi] is not self.kept
                    or opt._prepared[0] is not self.prepared
                    or opt.num_threads is not self.num_threads or opt._clip is not None
                    or type(opt) is not self.cls or self.cls.dense_step is not self.dense_fn):
                return None
            gs = self.arrays.plain_grads(gl)  # None: not the plain case
            if gs is None:
                return None
            t = opt.t + self.offset
            if not (type(t) is int and t == self.t_coeffs):
                self.coeffs = <Coefficients?>_retimed(self.coeffs, t, self.merged, self.retime)
                self.t_coeffs = t
            if self.cpu is not None:
                done = self.cpu.drive(self.coeffs, <list>gs, False)
            else:  # low-precision states or bfloat16 parameters: the plain gradients
                names = self.prepared._names_by_flags.get(self.coeffs.flags)
                if names is None:
                    return None
                done = self.prepared._lowp_step(self.coeffs, names, gs, t, False)
            if done is True:
                opt.t += 1
                return True
            return opt._finish(done, range(self.n))
        finally:
            lock.release()


def keep_common_step(opt):
    """Called by ``Optimizer._any_step`` right after it applied a step of the common case (one
    bucket, no clipping, no ``grad_scale`` or ``skip_nonfinite``, plain dense gradients):
    keeps a :class:`KeptStep` when the bucket's prepared step is a CPU float one, or a
    low-precision one whose step number is the object's ``t + 1`` (the stochastic rounding
    key's; see ``_lowp_objects.prepared_takes``), and the group's learning rate a number, else
    keeps none."""
    cdef KeptStep k
    cdef tuple kept
    opt._step_kept = None
    gi = opt._buckets[0][0]
    h = opt._groups[gi]
    prepared = opt._prepared[0]
    kt = opt._step_hypers[gi]
    if (callable(h["lr"]) or prepared is None or prepared is False
            or kt is None or opt._tensor_params or opt.__dict__.get("_sparse_seen")
            or opt.num_threads != opt._prepared_threads):
        return
    kept = <tuple>kt
    if prepared._cpu is None and (prepared._lowp is None or prepared._arrays is None
                                  or kept[4] != 1):
        return
    folded = prepared._folded
    if kept[0] is not h or kept[2] is not None or folded is None:
        return
    if folded[0] is not kept[3]:
        # the fold was kept from an equal dict the object has since replaced (a checkpoint
        # loaded, the groups rebuilt): know it by the group's dict from now on
        if not same_scalars(kept[3], folded[0]):
            return
        folded = prepared._folded = (kept[3],) + tuple(folded)[1:]
    k = KeptStep.__new__(KeptStep)
    k.lock = opt._lock
    k.gi = gi
    k.h = h
    k.kept = kept
    k.hyper = kept[3]
    k.offset = kept[4]
    k.prepared = prepared
    k.cpu = <CpuStep?>prepared._cpu if prepared._cpu is not None else None
    k.arrays = prepared._arrays if k.cpu is None else k.cpu.arrays
    k.num_threads = opt.num_threads
    k.cls = type(opt)
    k.dense_fn = k.cls._prepared_dense_step
    if k.cls.dense_step is not k.dense_fn:
        return
    k.n = len(opt._arrays)
    k.retime = prepared._spec.retime
    k.merged = folded[3]
    k.t_coeffs = folded[1]
    k.coeffs = <Coefficients?>folded[2]
    if k.retime is None:  # a fold that does not retime: the Python step folds every step
        return
    opt._step_kept = k


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
    if grad_scale is None and skip_nonfinite is False:
        k = self._step_kept
        if k is not None:
            done = (<KeptStep?>k).run(self, grads)
            if done is not None:
                return done
    return self._any_step(grads, grad_scale=grad_scale, skip_nonfinite=skip_nonfinite)
