/* fastadam/dense_body.h -- the dense loops, written once and included by dense.c per storage
 * type with
 *   FA_S        the storage type (fa_half, float, double),
 *   FA_CT       the compute type's suffix function (FA_CF(name): name##_f32 or name##_f64),
 *   FA_K(name)  name with the storage type's suffix (_f16, _f32, _f64),
 *   FA_CTYPE    the compute type (float for float16 and float32, double for float64).
 * No include guard: included once per storage type.  The contract is in dense.h.
 */

/* One loop per optimizer of optimizers.def: load x and the slots the optimizer uses with these
 * flags (fa_<name>_nslots), apply its element formula, store.  FLAGS is a compile-time
 * constant at every call site (always_inline), so each (optimizer, flags) pair is its own
 * branch-free simd loop. */
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    static inline __attribute__((always_inline)) void FA_K(name##_loop)(                       \
        FA_S *restrict x, const FA_S *restrict g, FA_S *restrict s0, FA_S *restrict s1,        \
        FA_S *restrict s2, ptrdiff_t n, const FA_CF(fa_##name##_k) *k, const int FLAGS)        \
    {                                                                                          \
        const int nslots = fa_##name##_nslots(FLAGS);                                          \
        _Pragma("omp simd")                                                                    \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            FA_CTYPE xi = (FA_CTYPE)x[i], a = (FA_CTYPE)s0[i], b = 0, c = 0;                   \
            if (nslots > 1) b = (FA_CTYPE)s1[i];                                               \
            if (nslots > 2) c = (FA_CTYPE)s2[i];                                               \
            FA_CF(fa_##name##_math)(k, FLAGS, (FA_CTYPE)g[i], &xi, &a, &b, &c);                \
            if (nslots > 2) s2[i] = (FA_S)c;                                                   \
            if (nslots > 1) s1[i] = (FA_S)b;                                                   \
            s0[i] = (FA_S)a;                                                                   \
            x[i] = (FA_S)xi;                                                                   \
        }                                                                                      \
    }
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER

/* The kernels of dense.h's table, one per optimizer: prepare the coefficients once, then the
 * loop of the flags (flags outside DENSE_MASK never arrive: the driver asks
 * fa_dense_supported first, and such a case compiles to nothing). */
#define FA_DENSE_CASE(F, name)                                                                 \
    FA_K(name##_loop)((FA_S *)x, (const FA_S *)g, (FA_S *)s0, (FA_S *)s1, (FA_S *)s2, n, &k, F)
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    FA_DISPATCH                                                                                \
    static void FA_K(name##_dense)(void *x, const void *g, void *s0, void *s1, void *s2,      \
                                   ptrdiff_t n, const void *coeffs)                            \
    {                                                                                          \
        const fa_##name##_coeffs *c = (const fa_##name##_coeffs *)coeffs;                     \
        const FA_CF(fa_##name##_k) k = FA_CF(fa_##name##_prepare)(c);                          \
        FA_FLAG_SWITCH(c->flags, DENSE_MASK, FA_DENSE_CASE, name)                              \
    }                                                                                          \
    FA_CLONES(FA_K(name##_dense));
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
#undef FA_DENSE_CASE

/* Non-finite test: OR-reduce "exponent bits all ones" over the (scaled) values, an integer
 * reduction that vectorizes without reassociating floating-point sums. */
FA_DISPATCH
static int FA_K(all_finite)(const void *gv, ptrdiff_t n, double grad_scale)
{
    const FA_S *restrict g = (const FA_S *)gv;
    const FA_CTYPE s = (FA_CTYPE)grad_scale;
    FA_UINT bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_CTYPE y = (FA_CTYPE)g[i] / s;
        FA_UINT bits;
        memcpy(&bits, &y, sizeof bits);
        bad |= (FA_UINT)((bits & FA_EXP_MASK) == FA_EXP_MASK);
    }
    return !bad;
}
FA_CLONES(FA_K(all_finite));
