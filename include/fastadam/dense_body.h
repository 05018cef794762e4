/* fastadam/dense_body.h -- the dense loops, written once and included by dense.c per storage
 * type with
 *   FA_S        the storage type (fa_half, float, double),
 *   FA_CT       the compute type's suffix function (FA_CF(name): name##_f32 or name##_f64),
 *   FA_K(name)  name with the storage type's suffix (_f16, _f32, _f64),
 *   FA_CTYPE    the compute type (float for float16 and float32, double for float64).
 * No include guard: included once per storage type.  The contract is in dense.h.
 */

static inline __attribute__((always_inline)) void FA_K(adam_loop)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict m, FA_S *restrict v,
    FA_S *restrict vmax, ptrdiff_t n, const FA_CF(fa_adam_k) k, const int flags)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_CTYPE xi = (FA_CTYPE)x[i], mi = (FA_CTYPE)m[i], vi = (FA_CTYPE)v[i], vh = 0;
        if (flags & FA_AMSGRAD) vh = (FA_CTYPE)vmax[i];
        FA_CF(fa_adam_math)(&k, flags, (FA_CTYPE)g[i], &xi, &mi, &vi, &vh);
        m[i] = (FA_S)mi;
        v[i] = (FA_S)vi;
        if (flags & FA_AMSGRAD) vmax[i] = (FA_S)vh;
        x[i] = (FA_S)xi;
    }
}

static inline __attribute__((always_inline)) void FA_K(adagrad_loop)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict h, ptrdiff_t n,
    const FA_CF(fa_adagrad_k) k, const int flags)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_CTYPE xi = (FA_CTYPE)x[i], hi = (FA_CTYPE)h[i];
        FA_CF(fa_adagrad_math)(&k, flags, (FA_CTYPE)g[i], &xi, &hi);
        h[i] = (FA_S)hi;
        x[i] = (FA_S)xi;
    }
}

static inline __attribute__((always_inline)) void FA_K(momentum_loop)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict v, ptrdiff_t n,
    const FA_CF(fa_momentum_k) k, const int flags)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_CTYPE xi = (FA_CTYPE)x[i], vi = (FA_CTYPE)v[i];
        FA_CF(fa_momentum_math)(&k, flags, (FA_CTYPE)g[i], &xi, &vi);
        v[i] = (FA_S)vi;
        x[i] = (FA_S)xi;
    }
}

FA_DISPATCH
static void FA_K(adam_dense)(void *x, const void *g, void *s0, void *s1, void *s2, ptrdiff_t n,
                             const void *coeffs)
{
    const fa_adam_coeffs *c = (const fa_adam_coeffs *)coeffs;
    const FA_CF(fa_adam_k) k = FA_CF(fa_adam_prepare)(c);
#define FA_LOOP(F) FA_K(adam_loop)((FA_S *)x, (const FA_S *)g, (FA_S *)s0, (FA_S *)s1, \
                                   (FA_S *)s2, n, k, F)
    FA_SWITCH16(c->flags, FA_LOOP)
#undef FA_LOOP
}

FA_DISPATCH
static void FA_K(adagrad_dense)(void *x, const void *g, void *s0, void *s1, void *s2,
                                ptrdiff_t n, const void *coeffs)
{
    (void)s1;
    (void)s2;
    const fa_adagrad_coeffs *c = (const fa_adagrad_coeffs *)coeffs;
    const FA_CF(fa_adagrad_k) k = FA_CF(fa_adagrad_prepare)(c);
#define FA_LOOP(F) FA_K(adagrad_loop)((FA_S *)x, (const FA_S *)g, (FA_S *)s0, n, k, F)
    FA_SWITCH8(c->flags, FA_LOOP)
#undef FA_LOOP
}

FA_DISPATCH
static void FA_K(momentum_dense)(void *x, const void *g, void *s0, void *s1, void *s2,
                                 ptrdiff_t n, const void *coeffs)
{
    (void)s1;
    (void)s2;
    const fa_momentum_coeffs *c = (const fa_momentum_coeffs *)coeffs;
    const FA_CF(fa_momentum_k) k = FA_CF(fa_momentum_prepare)(c);
#define FA_LOOP(F) FA_K(momentum_loop)((FA_S *)x, (const FA_S *)g, (FA_S *)s0, n, k, F)
    FA_SWITCH8(c->flags, FA_LOOP)
#undef FA_LOOP
}

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
