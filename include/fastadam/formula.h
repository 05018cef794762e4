/* fastadam/formula.h -- how the per-optimizer formula headers are written and instantiated.
 *
 * Each optimizer's update of ONE element is written once, in its own header (adam.h,
 * adagrad.h, momentum.h), and shared by every loop that applies it: the dense multi-tensor
 * kernels (dense.c), the sparse row walk (sparse_body.h) and any device kernel.  So a header
 * has two parts:
 *   - a guarded part: the optimizer's coefficient struct (float64 scalars folded once per step
 *     by the Python layer), its flag bits, and its idle-step decay rates;
 *   - an instantiated part, compiled once per compute type: the includer defines
 *       FA_C        the compute type (float or double),
 *       FA_SQRT     its square root (sqrtf or sqrt),
 *       FA_FN(name) name with the type's suffix (_f32 or _f64),
 *     and includes the header again; formulas.h does exactly that for float and double.
 * The code is plain C99 that a CUDA compiler accepts too: no system header (the includer
 * provides sqrt/sqrtf: math.h on the host, built-ins on the device), no restrict, no
 * host-only construct.  FA_INLINE marks the element functions inline on both sides.
 *
 * Element functions take the element's values in compute-type locals and update them through
 * pointers; flag tests are on a `const int flags` that every caller passes as a compile-time
 * constant, so each flag combination becomes its own branch-free loop after inlining.
 */
#ifndef FASTADAM_FORMULA_H
#define FASTADAM_FORMULA_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FA_INLINE static __device__ __forceinline__
#elif defined(__GNUC__)
#define FA_INLINE static inline __attribute__((always_inline))
#else
#define FA_INLINE static inline
#endif

/* Flag bits shared by every optimizer (bits 4 and up are each optimizer's own). */
enum {
    FA_L2 = 1,    /* add l2 * x to the gradient (coupled weight decay) */
    FA_SCALE = 2  /* divide the gradient by grad_scale (loss scaling, clipping) */
};

/* Which optimizer a kernel applies (the kind of its coefficient struct). */
enum { FA_OPT_ADAM = 0, FA_OPT_ADAGRAD = 1, FA_OPT_MOMENTUM = 2, FA_OPT_COUNT = 3 };

#endif /* FASTADAM_FORMULA_H */
