/* fastadam/common.h -- definitions shared by every fastadam kernel.
 *
 * FA_DISPATCH marks a kernel for runtime CPU dispatch: with gcc on x86-64 it is compiled three
 * times (x86-64-v4 = AVX-512, x86-64-v3 = AVX2+FMA, baseline SSE2) and an ifunc resolver picks one
 * when the library is loaded.  Elsewhere it expands to nothing and the portable build is used.
 * The build disables FMA contraction (-ffp-contract=off), so all three clones round identically.
 */
#ifndef FASTADAM_COMMON_H
#define FASTADAM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12 \
    && !defined(FASTADAM_NO_DISPATCH)
#define FA_DISPATCH __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define FA_HAVE_DISPATCH 1
#else
#define FA_DISPATCH
#define FA_HAVE_DISPATCH 0
#endif

#if defined(__FLT16_MAX__)
typedef _Float16 fa_half;
#define FA_HAVE_HALF 1
#else
typedef uint16_t fa_half; /* storage only; float16 kernels are not built */
#define FA_HAVE_HALF 0
#endif

#ifdef _OPENMP
#include <omp.h>
static inline int fa_openmp_enabled(void) { return 1; }
static inline int fa_omp_max_threads(void) { return omp_get_max_threads(); }
#else
static inline int fa_openmp_enabled(void) { return 0; }
static inline int fa_omp_max_threads(void) { return 1; }
#endif

/* Ask glibc to keep up to `bytes` of freed memory mapped instead of returning it to the OS
 * (M_TRIM_THRESHOLD) and to serve blocks below that size from its heap (M_MMAP_THRESHOLD), so a
 * loop that frees and reallocates multi-megabyte arrays stops page-faulting them in every time.
 * Process-wide; returns 1 if applied, 0 where the C library has no mallopt. */
#if defined(__GLIBC__)
#include <malloc.h>
static inline int fa_keep_freed_memory(int bytes)
{
    return mallopt(M_MMAP_THRESHOLD, bytes) == 1 && mallopt(M_TRIM_THRESHOLD, bytes) == 1;
}
#else
static inline int fa_keep_freed_memory(int bytes) { (void)bytes; return 0; }
#endif

/* Status codes returned by kernels; the Cython layer turns them into exceptions. */
enum { FA_OK = 0, FA_ERR_NONFINITE = 1, FA_ERR_INDEX = 2, FA_ERR_UNSUPPORTED = 3 };

/* Name of the code path the dispatcher selects on this CPU ("x86-64-v4", "x86-64-v3",
 * "baseline", or "portable" when the build has no runtime dispatch). */
static inline const char *fa_simd_level(void)
{
#if FA_HAVE_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
    return "baseline";
#else
    return "portable";
#endif
}

#endif /* FASTADAM_COMMON_H */
