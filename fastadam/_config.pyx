"""Build and runtime facts of the compiled core: OpenMP, thread counts, the SIMD path chosen."""

cdef extern from "fastadam/common.h":
    const char *fa_simd_level() nogil
    int fa_openmp_enabled() nogil
    int fa_omp_max_threads() nogil
    int FA_HAVE_DISPATCH
    int FA_HAVE_HALF


def openmp_enabled():
    """True when this extension was compiled with OpenMP."""
    return bool(fa_openmp_enabled())


def omp_max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS and threadpoolctl limits; 1 without OpenMP."""
    return fa_omp_max_threads()


def simd_level():
    """The code path runtime dispatch picks on this CPU (see include/fastadam/common.h)."""
    return fa_simd_level().decode()


def has_runtime_dispatch():
    return bool(FA_HAVE_DISPATCH)


def has_float16():
    return bool(FA_HAVE_HALF)
