/* fastadam/formula.h -- how the per-optimizer formula headers are written and instantiated.
 *
 * Each optimizer's update of ONE element is written once, in its own header (adam.h,
 * adagrad.h, momentum.h, rmsprop.h, lion.h: the list is optimizers.def), and shared by every
 * loop that applies it: the dense multi-tensor kernels (dense.c), the sparse row walk
 * (sparse_body.h) and any device kernel.  So a header
 * has two parts:
 *   - a guarded part: the optimizer's coefficient struct (float64 scalars folded once per step
 *     by the Python layer), its flag bits, and its idle-step decay rates;
 *   - an instantiated part, compiled once per compute type: the includer defines
 *       FA_C        the compute type (float or double),
 *       FA_SQRT     its square root (sqrtf or sqrt),
 *       FA_FABS, FA_COPYSIGN  its absolute value and copysign (fabsf/fabs, copysignf/copysign),
 *       FA_FN(name) name with the type's suffix (_f32 or _f64),
 *     and includes the header again; formulas.h does exactly that for float and double.
 * The code is plain C99 that a CUDA compiler accepts too: no system header (the includer
 * provides sqrt, fabs, copysign: math.h on the host, built-ins on the device), no restrict, no
 * host-only construct.  FA_INLINE marks the element functions inline on both sides.
 *
 * Every optimizer's element function has one signature, fa_<name>_math_<suffix>(k, flags, g,
 * &x, &s0, &s1, &s2): the element's values in compute-type locals, updated through pointers (a
 * slot the optimizer does not use with these flags is neither read nor written; how many it
 * uses is fa_<name>_nslots(flags), and the used ones are always the first ones); flag tests
 * are on a `const int flags` that every caller passes as a compile-time constant, so each flag
 * combination becomes its own branch-free loop after inlining.
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

/* Which optimizer a kernel applies (the kind of its coefficient struct): one per row of the
 * registration list optimizers.def, numbered in its order. */
enum {
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK) FA_OPT_##KIND,
#define FA_ROWWISE_OPTIMIZER FA_OPTIMIZER
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
    FA_OPT_COUNT
};

/* The most state slots an element function takes (s0, s1, s2). */
#define FA_MAX_SLOTS 3

/* A switch over the 16 combinations of flag bits 1, 2, 4, 8: case F runs CASE(F, ARG) when F
 * has no bit outside MASK (a compile-time test: the other cases compile to nothing). */
#define FA_FLAG_CASE(F, FLAGS, MASK, CASE, ARG)                                                 \
    case F:                                                                                    \
        if (((F) & ~(MASK)) == 0) CASE(F, ARG);                                                \
        break;
#define FA_FLAG_SWITCH(FLAGS, MASK, CASE, ARG)                                                 \
    switch ((FLAGS) & 15) {                                                                    \
        FA_FLAG_CASE(0, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(1, FLAGS, MASK, CASE, ARG)        \
        FA_FLAG_CASE(2, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(3, FLAGS, MASK, CASE, ARG)        \
        FA_FLAG_CASE(4, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(5, FLAGS, MASK, CASE, ARG)        \
        FA_FLAG_CASE(6, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(7, FLAGS, MASK, CASE, ARG)        \
        FA_FLAG_CASE(8, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(9, FLAGS, MASK, CASE, ARG)        \
        FA_FLAG_CASE(10, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(11, FLAGS, MASK, CASE, ARG)      \
        FA_FLAG_CASE(12, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(13, FLAGS, MASK, CASE, ARG)      \
        FA_FLAG_CASE(14, FLAGS, MASK, CASE, ARG) FA_FLAG_CASE(15, FLAGS, MASK, CASE, ARG)      \
    default: break;                                                                            \
    }

#endif /* FASTADAM_FORMULA_H */
