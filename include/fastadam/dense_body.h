/* fastadam/dense_body.h -- the dense loops, written once and included by dense.c per storage
 * type with
 *   FA_S        the storage type (fa_half, float, double),
 *   FA_CT       the compute type's suffix function (FA_CF(name): name##_f32 or name##_f64),
 *   FA_K(name)  name with the storage type's suffix (_f16, _f32, _f64),
 *   FA_CTYPE    the compute type (float for float16 and float32, double for float64).
 * No include guard: included once per storage type.  The contract is in dense.h.
 */

/* The prepared coefficients of the optimizer a call applies: only the member of KIND is set. */
typedef union {
    FA_CF(fa_adam_k) adam;
    FA_CF(fa_adagrad_k) adagrad;
    FA_CF(fa_momentum_k) momentum;
} FA_K(prepared);

/* One loop for every optimizer: load x and the state slots, apply the element formula, store.
 * KIND and FLAGS are compile-time constants at every call site (always_inline), so each
 * (optimizer, flags) pair is its own branch-free simd loop. */
static inline __attribute__((always_inline)) void FA_K(step_loop)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict s0, FA_S *restrict s1,
    FA_S *restrict s2, ptrdiff_t n, const FA_K(prepared) k, const int KIND, const int FLAGS)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_CTYPE xi = (FA_CTYPE)x[i], a = (FA_CTYPE)s0[i], b = 0, c = 0;
        const FA_CTYPE gi = (FA_CTYPE)g[i];
        if (KIND == FA_OPT_ADAM) {
            b = (FA_CTYPE)s1[i];
            if (FLAGS & FA_AMSGRAD) c = (FA_CTYPE)s2[i];
            FA_CF(fa_adam_math)(&k.adam, FLAGS, gi, &xi, &a, &b, &c);
            s1[i] = (FA_S)b;
            if (FLAGS & FA_AMSGRAD) s2[i] = (FA_S)c;
        } else if (KIND == FA_OPT_ADAGRAD) {
            FA_CF(fa_adagrad_math)(&k.adagrad, FLAGS, gi, &xi, &a);
        } else {
            FA_CF(fa_momentum_math)(&k.momentum, FLAGS, gi, &xi, &a);
        }
        s0[i] = (FA_S)a;
        x[i] = (FA_S)xi;
    }
}

/* The kernels of dense.h's table: prepare the coefficients once, then the loop of the flags. */
#define FA_LOOP(F) FA_K(step_loop)((FA_S *)x, (const FA_S *)g, (FA_S *)s0, (FA_S *)s1, \
                                   (FA_S *)s2, n, k, KIND, F)

FA_DISPATCH
static void FA_K(adam_dense)(void *x, const void *g, void *s0, void *s1, void *s2, ptrdiff_t n,
                             const void *coeffs)
{
    enum { KIND = FA_OPT_ADAM };
    const fa_adam_coeffs *c = (const fa_adam_coeffs *)coeffs;
    FA_K(prepared) k;
    k.adam = FA_CF(fa_adam_prepare)(c);
    FA_SWITCH16(c->flags, FA_LOOP)
}

FA_DISPATCH
static void FA_K(adagrad_dense)(void *x, const void *g, void *s0, void *s1, void *s2,
                                ptrdiff_t n, const void *coeffs)
{
    enum { KIND = FA_OPT_ADAGRAD };
    const fa_adagrad_coeffs *c = (const fa_adagrad_coeffs *)coeffs;
    FA_K(prepared) k;
    k.adagrad = FA_CF(fa_adagrad_prepare)(c);
    FA_SWITCH8(c->flags, FA_LOOP)
}

FA_DISPATCH
static void FA_K(momentum_dense)(void *x, const void *g, void *s0, void *s1, void *s2,
                                 ptrdiff_t n, const void *coeffs)
{
    enum { KIND = FA_OPT_MOMENTUM };
    const fa_momentum_coeffs *c = (const fa_momentum_coeffs *)coeffs;
    FA_K(prepared) k;
    k.momentum = FA_CF(fa_momentum_prepare)(c);
    FA_SWITCH8(c->flags, FA_LOOP)
}

#undef FA_LOOP

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
