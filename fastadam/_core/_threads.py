"""Resolution of ``num_threads`` for every compute entry point (as scikit-learn does it).

``None`` means "as many as OpenMP would use": ``omp_get_max_threads()``, which honours
``OMP_NUM_THREADS`` and ``threadpoolctl.threadpool_limits``, capped by the CPUs this process may
run on (affinity mask and cgroup CPU quota).  A negative value counts back from that maximum
(-1 = all, -2 = all but one).  An explicit count is capped at MAX_THREADS_PER_CPU threads per
usable CPU: more only adds scheduling cost, and libgomp ends the process (exit(1)) when it
cannot start the threads it was asked for.  For the dense and sparse steps and segment_sum,
``None`` is refined by :class:`AdaptiveThreads`: 1 or that maximum, whichever measures faster.

Fork safety: libgomp's thread pool does not survive ``fork``; a child that enters a parallel
region after its parent ran one hangs.  ``os.register_at_fork`` marks every child process, and
in a child every call resolves to one thread (which never enters a parallel region), with one
RuntimeWarning; use the "spawn" or "forkserver" start methods to get threads back.
"""
import math
import numbers
import os
import warnings
from collections import deque
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


class _SizeClass:
    """What the chooser knows about one kind of step of one size class."""
    __slots__ = ("parallel", "countdown", "interval", "serial", "threaded", "ratios",
                 "probes", "switches", "scheduled")

    def __init__(self):
        self.parallel = False  # the incumbent: True = N threads, False = 1 thread
        self.countdown = 0     # steps of the incumbent until the next probe
        self.interval = 0      # the current probe interval (0: still on the first steps)
        self.serial = deque(maxlen=AdaptiveThreads.WINDOW)    # seconds per element, 1 thread
        self.threaded = deque(maxlen=AdaptiveThreads.WINDOW)  # seconds per element, N threads
        self.ratios = deque(maxlen=AdaptiveThreads.WINDOW)  # N / 1 thread, neighbouring steps
        self.probes = self.switches = 0
        self.scheduled = 0     # steps from the last (re)scheduling to the next probe


def _median(samples):
    s = sorted(samples)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class AdaptiveThreads:
    """The default thread count of a step, chosen by measuring the cores actually free.

    With ``num_threads=None`` a step large enough for a parallel region may still be slower on
    N threads than on one: on a shared or oversubscribed machine (other processes, BLAS threads
    that have just run) the extra workers wait for a core, and a step on N threads can take ten
    times as long as on one.  For each kind of step and size class (a power of two of elements)
    this measures the ratio of a step's time on N threads to its time on one, each ratio from
    neighbouring steps (a probe against the median of the ``PRE_PROBE`` steps just before it:
    the machine's own speed drifts over seconds on a shared machine, and times from different
    moments must not be compared), and decides on the median of the last ``WINDOW`` ratios (a
    preempted step is one outlier among five):

    - the first ``FIRST`` steps of a class alternate 1 and N threads;
    - then N threads are the incumbent only if the median ratio is below ``ENTER`` (a lucky
      parallel step does not win a busy machine), and they stay while it is below ``LEAVE``
      (hysteresis: no flapping between the two on noise);
    - now and then one step runs the other count (a probe), so the speed-up comes back when
      cores free up.  The probe interval starts at ``PROBE_MIN`` steps and doubles after each
      probe that does not change the choice, up to ``PROBE_MAX``; and it is never shorter than
      the one that keeps the measured extra cost of a probe below ``BUDGET`` of the steps in
      between (a probe three times slower than a step waits >= 100 steps);
    - a parallel incumbent whose last steps are no faster than the last serial time (a busy
      spell) goes back to one thread at once, and its old ratios give way to that evidence.

    A serial incumbent runs untimed except for the ``PRE_PROBE`` steps before a probe: in a
    training loop the step runs with its caches and branch predictors cold after the BLAS
    work, and every extra line on the default path costs ten times what it costs in a
    microbenchmark; a driver registered in ``fast_paths`` (the dense one) even counts those
    steps down itself, without calling back into Python.  A parallel incumbent is timed every
    step, so a busy spell sends it back to one thread after two slow steps.  Results do not depend on the thread count (every element is computed by
    the same kernel whatever the split), so the choice shows only in the time.  A size class
    is keyed ``total.bit_length() | kind << 8``.  ``log``, when set to a list, receives one
    ``(key, threads, seconds per element, what)`` tuple per timed step.
    """
    FIRST = 3          # measured steps on each count before the first choice
    WINDOW = 5         # ratios (and times per count) kept
    ENTER = 0.85       # 1 -> N threads when the median ratio N / 1 thread is below ENTER
    LEAVE = 1.0        # N -> 1 thread when the median ratio reaches LEAVE
    PROBE_MIN = 16
    PROBE_MAX = 1024
    BUDGET = 0.02      # a probe's extra time <= BUDGET x the steps between two probes
    PRE_PROBE = 3      # incumbent steps timed just before a probe (its neighbours)

    def __init__(self):
        self.classes = {}  # key -> _SizeClass
        self.fast_paths = {}  # kind -> set_serial_left(size class, steps) of its driver
        self.log = None
        self.steps = self.parallel_steps = 0  # steps seen here (not the drivers' own), on N

    def reset(self):
        for key in self.classes:
            if key >> 8 in self.fast_paths:
                self.fast_paths[key >> 8](key & 255, 0)
        self.classes.clear()
        self.steps = self.parallel_steps = 0

    def choice(self, total, kind=0):
        """1 or "parallel": what the next step of ``total`` elements runs (None: not known)."""
        state = self.classes.get(total.bit_length() | kind << 8)
        if state is None or state.interval == 0:
            return None
        return "parallel" if state.parallel else 1

    def summary(self):
        """{key: dict} of every size class: choice, medians, probes, switches, interval and
        the steps the last schedule set until the next probe (longer than the interval where
        a probe is costly)."""
        out = {}
        for key, st in sorted(self.classes.items()):
            out[key] = {"kind": key >> 8, "elements": f"2^{(key & 255) - 1}..2^{key & 255}",
                        "choice": "N" if st.parallel else 1,
                        "serial_ns_per_elem": _median(st.serial) * 1e9 if st.serial else None,
                        "threaded_ns_per_elem":
                            _median(st.threaded) * 1e9 if st.threaded else None,
                        "ratio": _median(st.ratios) if st.ratios else None,
                        "probes": st.probes, "switches": st.switches,
                        "probe_interval": st.interval, "probe_after": st.scheduled}
        return out

    def run(self, step, args, total, kind=0):
        """``step(*args, num_threads)`` over ``total`` elements on the chosen thread count.

        ``kind`` separates steps whose time per element differs (dense, sparse modes)."""
        state = self.classes.get(total.bit_length() | kind << 8)
        if state is not None and state.countdown > self.PRE_PROBE + 1 and not state.parallel:
            state.countdown -= 1  # the common case: one thread chosen, no probe near
            self.steps += 1
            return step(*args, 1)
        nt = resolve_num_threads(None)
        if nt == 1:
            self.steps += 1
            return step(*args, 1)
        if state is None:
            state = self.classes[total.bit_length() | kind << 8] = _SizeClass()
        return self._measured(state, step, args, total, nt, kind)

    def _measured(self, state, step, args, total, nt, kind):
        first = state.interval == 0  # no choice made yet
        probe = False
        if first:
            use_parallel = len(state.threaded) < len(state.serial)  # 1, N, 1, N, ...
        else:
            state.countdown -= 1
            probe = state.countdown <= 0
            use_parallel = state.parallel != probe
        self.steps += 1
        self.parallel_steps += use_parallel
        t0 = _perf_counter()
        result = step(*args, nt if use_parallel else 1)
        per_elem = (_perf_counter() - t0) / total
        if self.log is not None:
            self.log.append((total.bit_length() | kind << 8, nt if use_parallel else 1,
                             per_elem, "first" if first else "probe" if probe else "step"))
        if first:
            (state.threaded if use_parallel else state.serial).append(per_elem)
            if use_parallel:  # against the serial step just before it
                state.ratios.append(per_elem / state.serial[-1])
                if len(state.ratios) >= self.FIRST:
                    state.parallel = _median(state.ratios) < self.ENTER
                    state.interval = self.PROBE_MIN
                    self._schedule(state, state.ratios[-1], kind, total)
            return result
        if probe:
            # the probe's time against the incumbent's last steps, just before it: the
            # machine's speed drifts over seconds, a ratio of neighbours does not
            if use_parallel:
                ratio = per_elem / _median(list(state.serial)[-self.PRE_PROBE:])
            else:
                ratio = _median(list(state.threaded)[-self.PRE_PROBE:]) / per_elem
            (state.threaded if use_parallel else state.serial).append(per_elem)
            state.ratios.append(ratio)
            state.probes += 1
            was = state.parallel
            state.parallel = _median(state.ratios) < (self.LEAVE if was else self.ENTER)
            if state.parallel != was:
                state.switches += 1
                state.interval = self.PROBE_MIN
            else:
                state.interval = min(2 * state.interval, self.PROBE_MAX)
            self._schedule(state, ratio, kind, total)
            return result
        (state.threaded if use_parallel else state.serial).append(per_elem)
        if use_parallel:
            recent = _median(list(state.threaded)[-self.PRE_PROBE:])
            if recent >= self.LEAVE * state.serial[-1]:
                # a busy spell: back to one thread; the old ratios said otherwise, so they
                # give way to this one and the next probes must show the speed-up again
                state.parallel = False
                state.switches += 1
                state.interval = self.PROBE_MIN
                ratio = recent / state.serial[-1]
                state.ratios = deque([ratio], maxlen=self.WINDOW)  # one rebinding: thread-safe
                self._schedule(state, ratio, kind, total)
        return result

    def _schedule(self, state, last_ratio, kind, total):
        """Set the countdown to the next probe: the interval, or longer where a step on the
        other count (by the median ratio, or the last one if worse) would cost more than
        BUDGET of the steps in between."""
        r = _median(state.ratios)
        if state.parallel:  # a probe runs one thread: it costs 1/ratio
            other_over_incumbent = 1.0 / min(r, last_ratio)
        else:
            other_over_incumbent = max(r, last_ratio)
        extra = other_over_incumbent - 1.0
        state.countdown = state.scheduled = max(state.interval, math.ceil(extra / self.BUDGET))
        hand_over = state.countdown - self.PRE_PROBE - 1
        if not state.parallel and hand_over > 0 and kind in self.fast_paths:
            # the driver runs these serial steps itself and asks again when they are done
            self.fast_paths[kind](total.bit_length(), hand_over)
            state.countdown -= hand_over


adaptive_threads = AdaptiveThreads()
