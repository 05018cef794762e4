"""Resolution of ``num_threads`` for every compute entry point (as scikit-learn does it).

``None`` means "as many as OpenMP would use": ``omp_get_max_threads()``, which honours
``OMP_NUM_THREADS`` and ``threadpoolctl.threadpool_limits``, capped by the CPUs this process may
run on (affinity mask and cgroup CPU quota).  A negative value counts back from that maximum
(-1 = all, -2 = all but one).  An explicit count is capped at MAX_THREADS_PER_CPU threads per
usable CPU: more only adds scheduling cost, and libgomp ends the process (exit(1)) when it
cannot start the threads it was asked for.

Fork safety: libgomp's thread pool does not survive ``fork``; a child that enters a parallel
region after its parent ran one hangs.  ``os.register_at_fork`` marks every child process, and
in a child every call resolves to one thread (which never enters a parallel region), with one
RuntimeWarning; use the "spawn" or "forkserver" start methods to get threads back.
"""
import math
import numbers
import os
import warnings
from time import perf_counter as _perf_counter

from ._config import omp_max_threads

_cpu_count_cache = None
MAX_THREADS_PER_CPU = 4
_MIN_CAP = MAX_THREADS_PER_CPU  # every machine has at least one CPU: never capped below this
_forked_child = False
_fork_warned = False


def _mark_forked_child():
    global _forked_child, _fork_warned
    _forked_child = True
    _fork_warned = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked_child)


def in_forked_child():
    """True in a process created by ``fork`` from one that had imported fastadam."""
    return _forked_child


def _cgroup_cpu_limit():
    """CPUs allowed by a cgroup v2 (cpu.max) or v1 (cfs quota) limit, or None."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        if quota > 0 and period > 0:
            return max(1, math.ceil(quota / period))
    except (OSError, ValueError):
        pass
    return None


def cpu_count():
    """CPUs this process may use: affinity mask, capped by any cgroup quota (cached)."""
    global _cpu_count_cache
    if _cpu_count_cache is None:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:
            n = os.cpu_count() or 1
        limit = _cgroup_cpu_limit()
        _cpu_count_cache = min(n, limit) if limit else n
    return _cpu_count_cache


def _single_thread_after_fork():
    global _fork_warned
    if not _fork_warned:
        _fork_warned = True
        warnings.warn("fastadam: this process was created by fork(); OpenMP (libgomp) cannot "
                      "run a parallel region here, so fastadam runs single-threaded in it. Use "
                      "the 'spawn' or 'forkserver' start method for multi-threaded workers.",
                      RuntimeWarning, stacklevel=3)
    return 1


def resolve_num_threads(num_threads):
    """Turn the user's ``num_threads`` into a positive thread count."""
    if type(num_threads) is int and 0 < num_threads <= _MIN_CAP and not _forked_child:
        return num_threads  # the common explicit case: nothing to look up
    if num_threads is not None and type(num_threads) is not int:
        if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
            raise TypeError(f"num_threads: expected None or an int, got "
                            f"{type(num_threads).__name__}")
        num_threads = int(num_threads)
    if num_threads == 0:
        raise ValueError("num_threads: expected a non-zero int (negative counts back from the "
                         "maximum), got 0")
    if _forked_child:
        return _single_thread_after_fork()
    cpus = cpu_count()
    max_threads = min(omp_max_threads(), cpus)
    if num_threads is None:
        return max_threads
    if num_threads < 0:
        return max(max_threads + num_threads + 1, 1)
    return min(num_threads, MAX_THREADS_PER_CPU * cpus)


class AdaptiveThreads:
    """The default thread count of a dense step, chosen by measuring the cores actually free.

    With ``num_threads=None`` a step large enough for a parallel region may still be slower on
    N threads than on one: on a shared or oversubscribed machine (other processes, BLAS threads
    that have just run) the extra workers wait for a core.  For each size class (a power of two
    of elements) this keeps a running estimate of seconds per element on 1 and on N threads and
    runs N threads only when they are clearly faster (estimate below ``MARGIN`` times the serial
    one: a busy machine makes parallel times bimodal, and a lucky one must not win).  Now and
    then it runs the other count once (a probe), which moves the other's estimate halfway to the
    new time, so the speed-up comes back when cores free up.  The probe interval starts at
    ``PROBE_MIN`` steps of the class and doubles after each probe that does not change the
    choice, up to ``PROBE_MAX``, so on a persistently busy machine probes cost under 1% of steps;
    when the running estimate alone changes the choice, the next probe comes soon again.
    Results do not depend on the thread count (every element is computed by the same kernel
    whatever the split), so the choice shows only in the time.
    """
    PROBE_MIN = 16
    PROBE_MAX = 1024
    WEIGHT = 0.25        # weight of the newest measurement in the running estimate
    PROBE_WEIGHT = 0.5   # weight of a probe's measurement
    MARGIN = 0.85        # N threads run when their estimate is below MARGIN x the serial one

    def __init__(self):
        self.classes = {}  # size class -> [steps until probe, interval, serial, parallel]
        self.steps = self.parallel_steps = 0  # counters, for benchmarks

    def reset(self):
        self.classes.clear()
        self.steps = self.parallel_steps = 0

    def choice(self, total):
        """1 or "parallel": what the next step of ``total`` elements runs (None: not known)."""
        state = self.classes.get(total.bit_length())
        if state is None or state[2] is None or state[3] is None:
            return None
        return "parallel" if state[3] < self.MARGIN * state[2] else 1

    def run(self, step, total, nt):
        """Run ``step(num_threads)`` over ``total`` elements with 1 or ``nt`` threads."""
        state = self.classes.get(total.bit_length())
        if state is None:
            state = self.classes[total.bit_length()] = [self.PROBE_MIN, self.PROBE_MIN,
                                                          None, None]
        serial, parallel = state[2], state[3]
        probe = False
        if serial is None:
            use = 1
        elif parallel is None:
            use = nt
        else:
            use = nt if parallel < self.MARGIN * serial else 1
            state[0] -= 1
            if state[0] <= 0:
                probe = True
                use = 1 if use == nt else nt
        self.steps += 1
        self.parallel_steps += use != 1
        t0 = _perf_counter()
        result = step(use)
        per_elem = (_perf_counter() - t0) / total
        slot = 2 if use == 1 else 3
        old = state[slot]
        if old is None:
            state[slot] = per_elem
        else:
            state[slot] = old + (self.PROBE_WEIGHT if probe else self.WEIGHT) * (per_elem - old)
        now_parallel = state[2] is not None and state[3] is not None and \
            state[3] < self.MARGIN * state[2]
        if probe:
            won = now_parallel == (use != 1)  # the probe changed the choice
            state[1] = self.PROBE_MIN if won else min(2 * state[1], self.PROBE_MAX)
            state[0] = state[1]
        elif serial is not None and parallel is not None and now_parallel != (use != 1):
            # The incumbent's own times moved the choice (a busy spell, or its end): the other
            # count's estimate may be as stale, so measure it again soon.
            state[1] = state[0] = self.PROBE_MIN
        return result


adaptive_threads = AdaptiveThreads()
