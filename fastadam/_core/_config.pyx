"""Build and runtime facts of the compiled core: OpenMP, thread counts, the CPU's SIMD level."""

cdef extern from "fastadam/common.h":
    int fa_cpu_best_level() nogil
    int fa_openmp_enabled() nogil
    int fa_omp_max_threads() nogil
    int fa_keep_freed_memory(int nbytes) nogil
    int FA_HAVE_DISPATCH
    int FA_HAVE_HALF


def openmp_enabled():
    """True when this extension was compiled with OpenMP."""
    return bool(fa_openmp_enabled())


def omp_max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS and threadpoolctl limits; 1 without OpenMP."""
    return fa_omp_max_threads()


def cpu_best_level():
    """The best level this CPU runs, as an index of fastadam._core._cpu_level.LEVELS (the test
    the kernels' clones were chosen by: include/fastadam/common.h); -1 in a build without
    runtime dispatch.  The level the kernels run is fastadam._core._cpu_level.IN_USE."""
    return fa_cpu_best_level()


def has_runtime_dispatch():
    return bool(FA_HAVE_DISPATCH)


def has_float16():
    return bool(FA_HAVE_HALF)


def keep_freed_memory(nbytes=256 * 1024 * 1024):
    """Let glibc keep up to ``nbytes`` of freed memory for reuse (process-wide, opt-in).

    A training loop allocates and frees the same multi-megabyte arrays every step (activations,
    gradients).  By default glibc gives such blocks back to the OS on free, and the next step
    page-faults every 4 KiB page in again -- on a conv layer that costs more than the
    arithmetic.  This raises glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to ``nbytes`` (at most
    32 MiB is honoured for the mmap threshold by glibc; larger blocks are still mmapped), so
    freed blocks are reused.  The cost is up to ``nbytes`` of resident memory kept after a peak.
    Returns True if applied, False where the C library has no ``mallopt`` (non-glibc).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes: expected an int, got {type(nbytes).__name__}")
    if not 0 < nbytes < 2**31:
        raise ValueError(f"nbytes: expected 0 < nbytes < 2**31, got {nbytes}")
    return bool(fa_keep_freed_memory(nbytes))
