"""``fastadam.show_config()``: what this build of fastadam runs with."""
import sys

import numpy as np

from . import _config, _omp_wait
from ._threads import cpu_count, resolve_num_threads


def config():
    """The facts as a dict: version, SIMD path picked at run time, OpenMP runtime, threads."""
    from . import __version__

    info = {
        "version": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "simd_level": _config.simd_level(),
        "runtime_dispatch": _config.has_runtime_dispatch(),
        "float16_kernels": _config.has_float16(),
        "openmp": _config.openmp_enabled(),
        "openmp_runtime": None,
        "max_threads": resolve_num_threads(None),
        "cpu_count": cpu_count(),
        "omp_wait_policy": _omp_wait.POLICY,
    }
    if info["openmp"]:
        info["openmp_runtime"] = _openmp_library()
    return info


def _openmp_library():
    """Path of the OpenMP runtime loaded in this process (libgomp, bundled or system)."""
    from . import _dense  # noqa: F401  (loads the OpenMP runtime)

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libgomp" in line or "libomp" in line or "libiomp" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return "unknown"


def show_config():
    """Print :func:`config` one fact a line."""
    for key, value in config().items():
        print(f"{key:>17}: {value}")
