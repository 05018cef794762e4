"""Resolution of ``num_threads`` for every compute entry point (as scikit-learn does it).

``None`` means "as many as OpenMP would use": ``omp_get_max_threads()``, which honours
``OMP_NUM_THREADS`` and ``threadpoolctl.threadpool_limits``, capped by the CPUs this process may
run on (affinity mask and cgroup CPU quota).  A negative value counts back from that maximum
(-1 = all, -2 = all but one).  Note: libgomp cannot be used in a child created by ``fork`` after a
parallel region has run in the parent (it hangs); use the "spawn" or "forkserver" start methods.
"""
import math
import os

from ._config import omp_max_threads

_cpu_count_cache = None


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


def resolve_num_threads(num_threads):
    """Turn the user's ``num_threads`` into a positive thread count."""
    max_threads = min(omp_max_threads(), cpu_count())
    if num_threads is None:
        return max_threads
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise TypeError(f"num_threads: expected None or an int, got {type(num_threads).__name__}")
    if num_threads == 0:
        raise ValueError("num_threads: expected a non-zero int (negative counts back from the "
                         "maximum), got 0")
    if num_threads < 0:
        return max(max_threads + num_threads + 1, 1)
    return num_threads
