"""``fastadam.show_config()``: what this build of fastadam runs with."""
import sys

import numpy as np

from . import _omp_wait
from ._core import _config, _cpu_level
from ._core._threads import cpu_count, resolve_num_threads


def config():
    """The facts as a dict: version, the SIMD level the kernels run (and the CPU's best, and the
    FASTADAM_CPU_LEVEL cap), OpenMP runtime, threads."""
    from ._version import __version__

    info = {
        "version": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        # the level the kernels run = min(FASTADAM_CPU_LEVEL, the CPU's best): _core/_cpu_level.py
        "simd_level": _cpu_level.IN_USE,
        "simd_cpu_best": _cpu_level.CPU_BEST,
        "simd_cap": f"{_cpu_level.ENV}={_cpu_level.CAP}" if _cpu_level.CAP else "none",
        "runtime_dispatch": _config.has_runtime_dispatch(),
        "float16_kernels": _config.has_float16(),
        "openmp": _config.openmp_enabled(),
        "openmp_runtime": None,
        "max_threads": resolve_num_threads(None),
        "cpu_count": cpu_count(),
        "omp_wait_policy": _omp_wait.POLICY,
    }
    pools = _thread_pools()
    if info["openmp"]:
        info["openmp_runtime"] = _openmp_library(pools)
    info["blas"] = _blas_pools(pools)  # BLAS threads share the cores with fastadam's
    from . import gpu

    info["gpu"] = gpu.describe()  # CuPy, CUDA, devices (imports CuPy only if installed)
    return info


def _thread_pools():
    """threadpoolctl's view of the loaded thread pools (OpenMP runtimes, BLAS), or None."""
    from ._core import _dense  # noqa: F401  (loads the OpenMP runtime)

    try:
        import threadpoolctl
    except ImportError:
        return None
    return threadpoolctl.threadpool_info()


def _openmp_library(pools):
    """Path of fastadam's OpenMP runtime: the wheel's bundled copy (under fastadam.libs), else
    one outside any other package's folder (the system libgomp of a source build)."""
    if pools is None:
        return "unknown (pip install threadpoolctl to see it)"
    paths = [p["filepath"] for p in pools if p.get("user_api") == "openmp"]
    for test in (lambda q: "fastadam" in q, lambda q: "site-packages" not in q, lambda q: True):
        found = [q for q in paths if test(q)]
        if found:
            return found[0]
    return "none loaded"


def _blas_pools(pools):
    if pools is None:
        return "unknown (pip install threadpoolctl to see it)"
    blas = [f"{p['internal_api']} {p.get('threading_layer', '')} {p['num_threads']} threads"
            for p in pools if p.get("user_api") == "blas"]
    return "; ".join(" ".join(b.split()) for b in blas) or "none loaded"


def show_config():
    """Print :func:`config` one fact a line."""
    for key, value in config().items():
        print(f"{key:>17}: {value}")
