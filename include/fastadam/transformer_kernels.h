/* fastadam/transformer_kernels.h -- the float32 kernels of the transformer primitives
 * (fastadam/autodiff/_transformer_kernels.pyx is their driver: it checks shapes and dtypes,
 * allocates outputs, splits rows or elements over OpenMP threads and calls these on ranges).
 *
 * Formulas (Phi / phi: the standard normal CDF / density; every statistic in float64):
 *   erf:       a rational approximation on [-4, 4] (|error| < 5e-7), +-1 outside;
 *   gelu:      y = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)));
 *   gelu_grad: o = g * (Phi(x) + x * phi(x)); the _cdf variants keep / read Phi(x);
 *   layer norm over rows of n: mean = sum(x) / n, rstd = 1 / sqrt(sum((x - mean)^2) / n + eps),
 *              y = (x - mean) * rstd * scale + bias; backward with xhat = (x - mean) * rstd and
 *              gs = g * scale: dx = rstd * (gs - mean(gs) - xhat * mean(gs * xhat));
 *              dscale = sum_rows(g * xhat), dbias = sum_rows(g) (float64, row by row);
 *   softmax over rows of n: exp(x - max) / sum (an entry more than 87 below the max is 0);
 *              its VJP dx = y * (g - sum(g * y));
 *   attention per batch-head (T queries, S keys, head size d, value size e):
 *              P = softmax(alpha * q @ kt + mask) over the first ncols[t] keys of row t,
 *              o = P @ v; the backward pass gives dq, dkt, dv from g and the kept P.
 *
 * Arguments: row-major float32 arrays; `ld*` are the row strides (in elements) of operands read
 * in place (the strided views exported graphs make); `rows` x `n` for the row kernels, `n`
 * elements for the elementwise loops.  IN: const pointers; OUT: the others (scratch: dS, kk, vt).
 * Preconditions: no output aliases an input; n >= 1 for the row kernels.
 * Every entry point runs the clone of the CPU level in use (FA_AT_LEVEL, common.h) and computes
 * each element / row by the same code whatever the caller's split: results do not depend on the
 * thread count or the level.  Thread safety: reentrant (no state beyond the level, set once).
 * Complexity: O(rows * n) for the row kernels, O(T * S * (d + e)) per attention head.
 */
#ifndef FASTADAM_TRANSFORMER_KERNELS_H
#define FASTADAM_TRANSFORMER_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "fastadam/common.h"

/* The clamps below are selects; gcc turns them into vector blends (and so vectorizes the
   loops) only when comparisons may not trap: scoped to these functions. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize ("no-trapping-math")
#endif
/* erf in float32 as a rational function of x on [-4, 4] (outside, erf is +-1 in float32):
   odd numerator of degree 13 over an even denominator of degree 8; absolute error below
   5e-7 against the exact value (libm's erff: 6e-8), and it vectorizes. */
static inline float fa_tk_erf_f32(float x) {
    x = x < -4.0f ? -4.0f : x;
    x = x > 4.0f ? 4.0f : x;
    const float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

int fa_tk_max_threads(void);
void fa_tk_erf_f32_loop(const float *x, float *y, ptrdiff_t n);
void fa_tk_gelu_f32_loop(const float *x, float *y, ptrdiff_t n);
void fa_tk_gelu_cdf_f32_loop(const float *x, float *y, float *cdf, ptrdiff_t n);
void fa_tk_gelu_grad_f32_loop(const float *g, const float *x, float *o, ptrdiff_t n);
void fa_tk_gelu_grad_cdf_f32_loop(const float *g, const float *x, const float *cdf, float *o,
                                  ptrdiff_t n);
void fa_tk_softmax_f32_rows(const float *x, float *y, ptrdiff_t rows, ptrdiff_t n);
void fa_tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx, ptrdiff_t rows,
                                ptrdiff_t n);
void fa_tk_ln_f32_rows(const float *x, const float *scale, const float *bias, float *y,
                       float *mean, float *rstd, ptrdiff_t rows, ptrdiff_t n, double eps);
void fa_tk_ln_backward_f32_rows(const float *g, const float *x, const float *scale,
                                const float *mean, const float *rstd, float *dx, ptrdiff_t rows,
                                ptrdiff_t n);
void fa_tk_ln_param_grads_f32(const float *g, const float *x, const float *mean,
                              const float *rstd, double *dscale, double *dbias, ptrdiff_t rows,
                              ptrdiff_t n);
void fa_tk_attention_f32(const float *q, ptrdiff_t ldq, const float *kt, ptrdiff_t ldk,
                         const float *v, ptrdiff_t ldv, const float *mask, const int32_t *ncols,
                         float *o, float *P, ptrdiff_t T, ptrdiff_t S, ptrdiff_t d, ptrdiff_t e,
                         float alpha);
void fa_tk_attention_bwd_f32(const float *g, ptrdiff_t ldg, const float *q, ptrdiff_t ldq,
                             const float *kt, ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                             const float *P, const int32_t *ncols, float *dq, float *dkt,
                             float *dv, float *dS, float *kk, float *vt, ptrdiff_t T,
                             ptrdiff_t S, ptrdiff_t d, ptrdiff_t e, float alpha);

#endif
