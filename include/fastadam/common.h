/* fastadam/common.h -- definitions shared by every fastadam kernel.
 *
 * Runtime CPU dispatch.  FA_DISPATCH marks a kernel to be compiled several times: with gcc on
 * x86-64 for three levels (x86-64-v4 = AVX-512, x86-64-v3 = AVX2+FMA, baseline SSE2), by gcc's
 * target_clones.  gcc would pick a clone with its own ifunc resolver when the library loads,
 * which nothing can cap; instead FA_CLONES(kernel) binds the three clones gcc emits
 * (`kernel.default`, `kernel.arch_x86_64_v3`, `kernel.arch_x86_64_v4`, local symbols of the same
 * object) into a table indexed by FA_LEVEL_*, and FA_AT_LEVEL(kernel) calls the clone of the level
 * this extension runs: fa_dispatch_level, set once at import by fa_use_level() to
 * min(FASTADAM_CPU_LEVEL's cap, the CPU's best) (fastadam/_core/_cpu_level.py reads the variable).
 * One indirect call per kernel call, as gcc's ifunc costs.  The build disables FMA contraction
 * (-ffp-contract=off), so the clones round identically.
 * Elsewhere (another compiler or architecture, or -DFASTADAM_NO_DISPATCH) FA_DISPATCH expands to
 * nothing, FA_AT_LEVEL(kernel) is the kernel, and the level is "portable".
 */
#ifndef FASTADAM_COMMON_H
#define FASTADAM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12 \
    && !defined(FASTADAM_NO_DISPATCH)
#define FA_HAVE_DISPATCH 1
#else
#define FA_HAVE_DISPATCH 0
#endif

/* The levels, lowest first: indices of an FA_CLONES table (names: fa_level_name). */
enum { FA_LEVEL_BASELINE = 0, FA_LEVEL_V3 = 1, FA_LEVEL_V4 = 2, FA_LEVEL_COUNT = 3 };

#if FA_HAVE_DISPATCH
/* `used`: the clones are reached through FA_CLONES's table only, never by the kernel's own name,
 * so gcc must not drop (or re-sign, as it may a static function) what it sees as unreferenced. */
#define FA_DISPATCH                                                                            \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), used))
#define FA_HIDDEN __attribute__((visibility("hidden")))
/* The clones of an FA_DISPATCH kernel defined above, in the same file: kernel##_clones[level]. */
#define FA_CLONES(kernel) FA_CLONES_(kernel)
#define FA_CLONES_(kernel)                                                                     \
    extern __typeof__(kernel) kernel##_baseline_ __asm__(#kernel ".default") FA_HIDDEN;        \
    extern __typeof__(kernel) kernel##_v3_ __asm__(#kernel ".arch_x86_64_v3") FA_HIDDEN;       \
    extern __typeof__(kernel) kernel##_v4_ __asm__(#kernel ".arch_x86_64_v4") FA_HIDDEN;       \
    static __typeof__(kernel) *const kernel##_clones[FA_LEVEL_COUNT] = {                       \
        kernel##_baseline_, kernel##_v3_, kernel##_v4_}
/* The clone of `kernel` at the level this extension runs. */
#define FA_AT_LEVEL(kernel) FA_AT_LEVEL_(kernel)
#define FA_AT_LEVEL_(kernel) (kernel##_clones[fa_dispatch_level])
extern int fa_dispatch_level FA_HIDDEN;
/* Once per extension, in the C file of its FA_DISPATCH kernels: the level variable, and the two
 * functions its Cython module calls (fa_use_level at import; fa_level_in_use for the tests). */
#define FA_DISPATCH_LEVEL_STATE                                                                \
    int fa_dispatch_level = FA_LEVEL_BASELINE;                                                 \
    int fa_use_level(int level)                                                                \
    {                                                                                          \
        const int best = fa_cpu_best_level();                                                  \
        fa_dispatch_level = level < FA_LEVEL_BASELINE ? FA_LEVEL_BASELINE                      \
                            : level > best            ? best                                   \
                                                      : level;                                 \
        return fa_dispatch_level;                                                              \
    }                                                                                          \
    int fa_level_in_use(void) { return fa_dispatch_level; }
#else
#define FA_DISPATCH
#define FA_HIDDEN
#define FA_CLONES(kernel) extern int fa_no_clones
#define FA_AT_LEVEL(kernel) kernel
#define FA_DISPATCH_LEVEL_STATE                                                                \
    int fa_use_level(int level) { (void)level; return -1; }                                    \
    int fa_level_in_use(void) { return -1; }
#endif
/* Set this extension's level to min(level, fa_cpu_best_level()) and return it; -1 (portable)
 * in a build without dispatch.  Not thread safe: called once, before any kernel runs. */
FA_HIDDEN int fa_use_level(int level);
FA_HIDDEN int fa_level_in_use(void);

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

/* The best level this CPU runs (FA_LEVEL_*; the test gcc's own resolver makes), or -1 when the
 * build has no runtime dispatch ("portable"). */
static inline int fa_cpu_best_level(void)
{
#if FA_HAVE_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return FA_LEVEL_V4;
    if (__builtin_cpu_supports("x86-64-v3")) return FA_LEVEL_V3;
    return FA_LEVEL_BASELINE;
#else
    return -1;
#endif
}

/* "baseline", "x86-64-v3", "x86-64-v4"; "portable" for -1. */
static inline const char *fa_level_name(int level)
{
    static const char *const names[FA_LEVEL_COUNT] = {"baseline", "x86-64-v3", "x86-64-v4"};
    return level >= 0 && level < FA_LEVEL_COUNT ? names[level] : "portable";
}

#endif /* FASTADAM_COMMON_H */
