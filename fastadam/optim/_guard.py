"""One step or checkpoint at a time per optimizer object, and steps that Ctrl-C cannot split.

Design.  Every optimizer object holds a re-entrant lock; ``step``, ``state_dict``,
``load_state_dict``, ``save``, ``load`` (and the other methods that change the state) run
under it (:func:`locked`), so a checkpoint taken while another thread steps is the state after
a whole number of steps, never a mix of two.

A step that makes several compiled calls (several groups or dtypes, or sparse gradients next to
dense ones) could be split by ``KeyboardInterrupt``: Python raises it between two calls, after
the first has written.  :class:`sigint_deferred` closes that window: in the main thread (the
only one where Python runs signal handlers) it swaps the SIGINT handler for one that records
the signal, and when the step is over (applied or refused) it restores the previous handler
and calls it, so the KeyboardInterrupt (or the user's handler) comes right after a whole step.
A step of one compiled call is not deferred: the call itself cannot be split, and swapping a
handler costs two system calls.  Other signals, and SIGINT handlers not set from Python, are
left alone.
"""
from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Callable, List, TypeVar

from .._core._validation import all_ndarrays

F = TypeVar("F", bound=Callable[..., Any])


def locked(method: F) -> F:
    """Run ``method`` under the object's ``_lock``."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


class sigint_deferred:
    """``with sigint_deferred():`` -- a SIGINT (Ctrl-C) arriving inside the block is delivered
    (to the handler that was installed before) when the block ends, so a step made of several
    compiled calls is never split by a ``KeyboardInterrupt``.  Outside the main thread, or when
    the SIGINT handler was not installed from Python, it does nothing.

    Examples
    --------
    >>> from fastadam.optim import sigint_deferred
    >>> with sigint_deferred():
    ...     pass  # the calls that must all run, or none
    """

    __slots__ = ("previous", "received")

    def __enter__(self) -> "sigint_deferred":
        self.previous = None
        self.received: List[Any] = []
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGINT)
        if previous is None or previous is signal.SIG_IGN:  # not ours to swap, or ignored
            return self
        received = self.received
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
        self.previous = previous
        return self

    def __exit__(self, *exc: Any) -> None:
        previous = self.previous
        if previous is None:
            return
        signal.signal(signal.SIGINT, previous)
        if self.received:
            if previous is signal.SIG_DFL:  # the process ends, as it would have
                signal.raise_signal(signal.SIGINT)
            else:
                previous(signal.SIGINT, self.received[0])


def several_calls(opt: Any, grads: Any) -> bool:
    """Whether ``opt.step(grads)`` may make more than one compiled call (so its calls must not
    be split by an interrupt): more than one (group, dtype) bucket, or gradients that are not
    a plain list of ndarrays (sparse ones, ``None`` entries, Tensors' ``.grad``) next to other
    parameters."""
    if len(opt._buckets) > 1:
        return True
    if len(opt._arrays) <= 1:
        return False
    return not all_ndarrays(grads)


def guarded_step(method: F) -> F:
    """``step`` under the lock, with SIGINT deferred when it makes several compiled calls."""
    @functools.wraps(method)
    def wrapper(self, grads=None, *, grad_scale=None, skip_nonfinite=False):
        with self._lock:
            if (len(self._buckets) > 1 or len(self._arrays) > 1) and several_calls(self, grads):
                with sigint_deferred():
                    return method(self, grads, grad_scale=grad_scale,
                                  skip_nonfinite=skip_nonfinite)
            return method(self, grads, grad_scale=grad_scale, skip_nonfinite=skip_nonfinite)
    return wrapper  # type: ignore[return-value]


def new_lock() -> Any:
    return threading.RLock()
