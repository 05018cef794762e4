/* fastadam/dense.c -- fused dense Adam kernels; the contract and the formula are in dense.h.
 *
 * One body, FA_ADAM_BODY, is instantiated for each (dtype, flags) pair: the storage type S, the
 * compute type C and the flags are compile-time constants, so each of the 16 loops per dtype has
 * no per-element branch and vectorizes (sqrt and division included: built with -fno-math-errno).
 * Each exported function carries FA_DISPATCH and is compiled for AVX-512, AVX2 and baseline.
 */
#include <math.h>
#include <string.h>

#include "fastadam/dense.h"

#define FA_ADAM_BODY(S, C, SQRT, FLAGS)                                                        \
    do {                                                                                       \
        const C b1 = (C)c->beta1, b2 = (C)c->beta2;                                            \
        const C omb1 = (C)(1.0 - c->beta1), omb2 = (C)(1.0 - c->beta2);                        \
        const C alpha = (C)c->alpha, dscale = (C)c->denom_scale, eps = (C)c->eps;              \
        const C sign = (C)c->sign, gscale = (C)c->grad_scale, l2 = (C)c->l2;                   \
        const C dmul = (C)c->decay_mul, pmul = (C)c->post_mul;                                 \
        _Pragma("omp simd")                                                                    \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            C gi = (C)g[i];                                                                    \
            C xi = (C)x[i];                                                                    \
            if ((FLAGS) & FA_SCALE) gi = gi / gscale;                                          \
            gi = sign * gi;                                                                    \
            if ((FLAGS) & FA_L2) gi = gi + l2 * xi;                                            \
            xi = dmul * xi;                                                                    \
            C mi = b1 * (C)m[i] + omb1 * gi;                                                   \
            C vi = b2 * (C)v[i] + omb2 * (gi * gi);                                            \
            m[i] = (S)mi;                                                                      \
            v[i] = (S)vi;                                                                      \
            C vh = vi;                                                                         \
            if ((FLAGS) & FA_AMSGRAD) {                                                        \
                C vm = (C)v_max[i];                                                            \
                vh = vm > vi ? vm : vi;                                                        \
                v_max[i] = (S)vh;                                                              \
            }                                                                                  \
            C mu = mi;                                                                         \
            if ((FLAGS) & FA_NESTEROV) mu = b1 * mi + omb1 * gi;                               \
            x[i] = (S)(pmul * (xi - alpha * mu / (SQRT(vh) * dscale + eps)));                  \
        }                                                                                      \
    } while (0)

/* Float16 uses the same body with S = fa_half and C = float: moments are stored in float16
 * (as DirectML does) and every value is computed in float32 between a load and a store. */

/* A switch over the 16 flag combinations, each case a loop with constant flags. */
#define FA_FLAG_SWITCH(BODY, ...)                                                              \
    switch (c->flags & 15) {                                                                   \
    case 0: BODY(__VA_ARGS__ 0); break;                                                        \
    case 1: BODY(__VA_ARGS__ 1); break;                                                        \
    case 2: BODY(__VA_ARGS__ 2); break;                                                        \
    case 3: BODY(__VA_ARGS__ 3); break;                                                        \
    case 4: BODY(__VA_ARGS__ 4); break;                                                        \
    case 5: BODY(__VA_ARGS__ 5); break;                                                        \
    case 6: BODY(__VA_ARGS__ 6); break;                                                        \
    case 7: BODY(__VA_ARGS__ 7); break;                                                        \
    case 8: BODY(__VA_ARGS__ 8); break;                                                        \
    case 9: BODY(__VA_ARGS__ 9); break;                                                        \
    case 10: BODY(__VA_ARGS__ 10); break;                                                      \
    case 11: BODY(__VA_ARGS__ 11); break;                                                      \
    case 12: BODY(__VA_ARGS__ 12); break;                                                      \
    case 13: BODY(__VA_ARGS__ 13); break;                                                      \
    case 14: BODY(__VA_ARGS__ 14); break;                                                      \
    default: BODY(__VA_ARGS__ 15); break;                                                      \
    }

FA_DISPATCH
void fa_adam_dense_f32(float *restrict x, const float *restrict g, float *restrict m,
                       float *restrict v, float *restrict v_max, ptrdiff_t n,
                       const fa_adam_coeffs *c)
{
    FA_FLAG_SWITCH(FA_ADAM_BODY, float, float, sqrtf, )
}

FA_DISPATCH
void fa_adam_dense_f64(double *restrict x, const double *restrict g, double *restrict m,
                       double *restrict v, double *restrict v_max, ptrdiff_t n,
                       const fa_adam_coeffs *c)
{
    FA_FLAG_SWITCH(FA_ADAM_BODY, double, double, sqrt, )
}

FA_DISPATCH
void fa_adam_dense_f16(fa_half *restrict x, const fa_half *restrict g, fa_half *restrict m,
                       fa_half *restrict v, fa_half *restrict v_max, ptrdiff_t n,
                       const fa_adam_coeffs *c)
{
#if FA_HAVE_HALF
    FA_FLAG_SWITCH(FA_ADAM_BODY, fa_half, float, sqrtf, )
#else
    (void)x; (void)g; (void)m; (void)v; (void)v_max; (void)n; (void)c;
#endif
}

/* Non-finite test: OR-reduce "exponent bits all ones" over the (scaled) values, an integer
 * reduction that vectorizes without reassociating floating-point sums. */
FA_DISPATCH
int fa_all_finite_f32(const float *restrict g, ptrdiff_t n, double grad_scale)
{
    const float s = (float)grad_scale;
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++) {
        float y = g[i] / s;
        uint32_t bits;
        memcpy(&bits, &y, sizeof bits);
        bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

FA_DISPATCH
int fa_all_finite_f64(const double *restrict g, ptrdiff_t n, double grad_scale)
{
    uint64_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++) {
        double y = g[i] / grad_scale;
        uint64_t bits;
        memcpy(&bits, &y, sizeof bits);
        bad |= (uint64_t)((bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
    }
    return !bad;
}

FA_DISPATCH
int fa_all_finite_f16(const fa_half *restrict g, ptrdiff_t n, double grad_scale)
{
#if FA_HAVE_HALF
    const float s = (float)grad_scale;
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++) {
        float y = (float)g[i] / s;
        uint32_t bits;
        memcpy(&bits, &y, sizeof bits);
        bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
#else
    (void)g; (void)n; (void)grad_scale;
    return 1;
#endif
}

/* Bandwidth yardstick: reads a, d, b, c and writes a, b, c (28 bytes per float32 element, the
 * traffic of an Adam step), with no arithmetic worth counting. */
FA_DISPATCH
void fa_stream_rw_f32(float *restrict a, const float *restrict d, float *restrict b,
                      float *restrict c, ptrdiff_t n)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float di = d[i];
        a[i] = a[i] + di;
        b[i] = b[i] + di;
        c[i] = c[i] + di;
    }
}
