/* fastadam/fastexp.h -- exp(y) in float32 for y <= 0, written so that gcc vectorizes it.
 *
 * Cephes' expf: y = n ln2 + r with n = floor(y log2(e) + 1/2) and |r| <= ln2 / 2, a degree-6
 * polynomial in r, times 2^n built in the exponent bits.  Relative error about 2e-7 against the
 * exact value.  Below -87 the result is exp(-87) (callers that need 0 there select it).
 *
 * Every operation is exact or correctly rounded in the same order at every CPU level (the build
 * disables FMA contraction; floorf is exact), so each clone gives the same bits.  At x86-64-v3
 * and above gcc vectorizes floorf; a truncating conversion next to the clamp's select defeats
 * its if-conversion there.  Shared by the autodiff and transformer kernels.
 */
#ifndef FASTADAM_FASTEXP_H
#define FASTADAM_FASTEXP_H

#include <stddef.h>
#include <stdint.h>

static inline float fa_exp_neg_f32(float y)
{
    y = y < -87.0f ? -87.0f : y;
    const float n = __builtin_floorf(y * 1.44269504088896341f + 0.5f);
    const int32_t k = (int32_t)n;
    float r = y - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale;
    scale.i = (k + 127) << 23;
    return p * scale.f;
}

/* Row sums in a fixed order at every CPU level: FA_EXP_LANES lanes, lane j adding the elements
 * j, j + FA_EXP_LANES, ... in turn (a vector of any width does the same), then the lanes added
 * in one fixed order. */
#define FA_EXP_LANES 16

static inline float fa_lanes_sum_f32(const float *acc)
{
    float s = 0.0f;
    for (int j = 0; j < FA_EXP_LANES; j++) s += acc[j];
    return s;
}

/* sum of x[0, n) in the fixed lane order above */
static inline float fa_fixed_sum_f32(const float *x, ptrdiff_t n)
{
    float acc[FA_EXP_LANES] = {0.0f};
    ptrdiff_t i = 0;
    for (; i + FA_EXP_LANES <= n; i += FA_EXP_LANES) {
#ifdef _OPENMP
#pragma omp simd
#endif
        for (int j = 0; j < FA_EXP_LANES; j++) acc[j] += x[i + j];
    }
    for (int j = 0; i + j < n; j++) acc[j] += x[i + j];
    return fa_lanes_sum_f32(acc);
}

/* sum of a[k] * b[k] over k in [0, n) in the same fixed lane order */
static inline float fa_fixed_dot_f32(const float *a, const float *b, ptrdiff_t n)
{
    float acc[FA_EXP_LANES] = {0.0f};
    ptrdiff_t i = 0;
    for (; i + FA_EXP_LANES <= n; i += FA_EXP_LANES) {
#ifdef _OPENMP
#pragma omp simd
#endif
        for (int j = 0; j < FA_EXP_LANES; j++) acc[j] += a[i + j] * b[i + j];
    }
    for (int j = 0; i + j < n; j++) acc[j] += a[i + j] * b[i + j];
    return fa_lanes_sum_f32(acc);
}

/* max of x[0, n) (n >= 1) over the same lanes: the maximum does not depend on the order
 * (a NaN anywhere makes the callers' rows NaN whatever this returns) */
static inline float fa_fixed_max_f32(const float *x, ptrdiff_t n)
{
    float acc[FA_EXP_LANES];
    for (int j = 0; j < FA_EXP_LANES; j++) acc[j] = x[0];
    ptrdiff_t i = 0;
    for (; i + FA_EXP_LANES <= n; i += FA_EXP_LANES) {
#ifdef _OPENMP
#pragma omp simd
#endif
        for (int j = 0; j < FA_EXP_LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    }
    for (int j = 0; i + j < n; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = acc[0];
    for (int j = 1; j < FA_EXP_LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

#endif
