"""The CPU level the compiled kernels run: the CPU's best, capped by ``FASTADAM_CPU_LEVEL``.

Every FA_DISPATCH kernel is compiled for three x86-64 levels (include/fastadam/common.h):
``x86-64-v4`` (AVX-512), ``x86-64-v3`` (AVX2 + FMA) and ``baseline`` (SSE2).  By default the
kernels run the best level the CPU supports.  ``FASTADAM_CPU_LEVEL`` caps it, as NumPy's
``NPY_DISABLE_CPU_FEATURES`` or OpenBLAS's ``OPENBLAS_CORETYPE`` do: the kernels then run
``min(cap, the CPU's best)``, so a developer with AVX-512 can run (and test) what a user with AVX2
runs.  The variable is read once, when fastadam is imported (the first compiled module loads
this module and each one sets its kernels' level from LEVEL_IN_USE); changing it later has no
effect in that process.  An unknown value raises ``ValueError`` at import; a cap above the
CPU's level runs the CPU's best and says so (``RuntimeWarning``), never an illegal instruction.
A build without runtime dispatch (another compiler or architecture) accepts the same values
and runs its one "portable" build.  The FMA contraction is off in every build, so the levels
give bit-identical results (tests/test_cpu_levels.py).
"""
import os
import warnings

from fastadam._core import _config

ENV = "FASTADAM_CPU_LEVEL"
# index = FA_LEVEL_* of include/fastadam/common.h
LEVELS = ("baseline", "x86-64-v3", "x86-64-v4")
PORTABLE = "portable"


def _resolve(value, best):
    """(cap, index in use) for the variable's value (None: unset) and the CPU's best index
    (-1: a build without dispatch).  Raises ValueError for an unknown value."""
    cap = None
    if value is not None and value.strip():
        cap = value.strip().lower()
        if cap not in LEVELS:
            raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(LEVELS)} "
                             f"(or unset: the best level this CPU supports)")
    if best < 0:
        return cap, -1
    if cap is None:
        return None, best
    wanted = LEVELS.index(cap)
    if wanted > best:
        warnings.warn(f"{ENV}={cap}: this CPU supports {LEVELS[best]} at most; the kernels run "
                      f"{LEVELS[best]}", RuntimeWarning, stacklevel=2)
    return cap, min(wanted, best)


CPU_BEST_INDEX = _config.cpu_best_level()
CAP, LEVEL_IN_USE = _resolve(os.environ.get(ENV), CPU_BEST_INDEX)
CPU_BEST = LEVELS[CPU_BEST_INDEX] if CPU_BEST_INDEX >= 0 else PORTABLE
IN_USE = LEVELS[LEVEL_IN_USE] if LEVEL_IN_USE >= 0 else PORTABLE


def supported_levels():
    """The levels this machine can run, lowest first (("portable",) without dispatch)."""
    return LEVELS[:CPU_BEST_INDEX + 1] if CPU_BEST_INDEX >= 0 else (PORTABLE,)
