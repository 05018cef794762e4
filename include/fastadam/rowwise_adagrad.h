/* fastadam/rowwise_adagrad.h -- row-wise Adagrad: the update of ONE ROW, the one place its
 * formula is written (FBGEMM's EXACT_ROWWISE_ADAGRAD; see formula.h for how a header is
 * shared and instantiated per compute type).
 *
 * The first optimizer of the registration list (optimizers.def, a FA_ROWWISE_OPTIMIZER row)
 * whose state is not shaped like the parameter: one accumulator per row (rows = the first
 * axis), so its step is a reduction over the row then an update of the row, and it has a row
 * function instead of an element function.  The loops that call it are rowwise_body.h's (the
 * dense step, and the sparse row walk of sparse_body.h).
 *
 * Formula (one row of n >= 1 elements x[0..n), its gradient g[0..n) and its accumulator a;
 * C = the compute type):
 *   g'[i] = sign * (g[i] / grad_scale)            sign = -1 when maximizing; / only with FA_SCALE
 *   d[i]  = g'[i] + wd * x[i]   with FA_L2 (FBGEMM's weight_decay_mode L2), else g'[i]
 *   a     = a + S / n           S = sum of d[i]^2 in the fixed order below
 *   m     = lr / (sqrt(a) + eps)
 *   c     = 1 - m * wd          with FA_L2
 *         = decay_mul           otherwise (1 - lr * weight_decay for FBGEMM's DECOUPLED mode,
 *                               exactly 1 with no decay; folded in float64)
 *   x[i]  = c * x[i] - m * g'[i]
 * This is FBGEMM's CPU and CUDA update (momentum1 = a, `correction` = c, `multiplier` = m): with
 * FA_L2 it equals x - m * d up to rounding.  A row of n = 0 elements is left alone.
 * The sum S is taken in eight lanes, lane j adding d[i] for i = j (mod 8) in increasing i, then
 * ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): an order written in C, which no SIMD
 * width nor thread count changes, so every CPU level (the build disables FMA contraction)
 * computes the same bits; it vectorizes at 4 and 8 lanes.
 * Every scalar is folded once per step in float64 (fastadam/optim/_rowwise_adagrad.py).  An idle
 * row (g = 0, no decay) changes nothing: both idle rates are 1.
 * State slot: s0 = a (one value per row).
 */
#ifndef FASTADAM_ROWWISE_ADAGRAD_H
#define FASTADAM_ROWWISE_ADAGRAD_H

#include "fastadam/formula.h"

typedef struct {
    double lr;
    double eps;
    double sign;        /* +1, or -1 to maximize */
    double grad_scale;  /* gradient divisor (FA_SCALE) */
    double l2;          /* weight decay added to the gradient (FA_L2) */
    double decay_mul;   /* 1 - lr * weight_decay (decoupled decay), exactly 1 when off */
    int flags;          /* FA_L2 | FA_SCALE */
} fa_rowwise_adagrad_coeffs;

FA_INLINE void fa_rowwise_adagrad_idle_rates(const fa_rowwise_adagrad_coeffs *c, double *r0,
                                             double *r1)
{
    (void)c;
    *r0 = 1.0;
    *r1 = 1.0;
}

FA_INLINE int fa_rowwise_adagrad_nslots(const int flags)
{
    (void)flags;
    return 1;
}

#endif /* FASTADAM_ROWWISE_ADAGRAD_H */

#ifdef FA_C
typedef struct {
    FA_C lr, eps, sign, gscale, l2, decay_mul;
} FA_FN(fa_rowwise_adagrad_k);

FA_INLINE FA_FN(fa_rowwise_adagrad_k) FA_FN(fa_rowwise_adagrad_prepare)(
    const fa_rowwise_adagrad_coeffs *c)
{
    FA_FN(fa_rowwise_adagrad_k) k;
    k.lr = (FA_C)c->lr;
    k.eps = (FA_C)c->eps;
    k.sign = (FA_C)c->sign;
    k.gscale = (FA_C)c->grad_scale;
    k.l2 = (FA_C)c->l2;
    k.decay_mul = (FA_C)c->decay_mul;
    return k;
}

/* g'[i] of the formula. */
FA_INLINE FA_C FA_FN(fa_rowwise_adagrad_grad)(const FA_FN(fa_rowwise_adagrad_k) *k,
                                             const int flags, FA_C g)
{
    if (flags & FA_SCALE) g = g / k->gscale;
    return k->sign * g;
}

/* One row: IN g[0, n); IN/OUT x[0, n), *a.  g may alias nothing that is written.
 * O(n), two passes over the row (the sum, then the update). */
FA_INLINE void FA_FN(fa_rowwise_adagrad_row)(const FA_FN(fa_rowwise_adagrad_k) *k,
                                            const int flags, const FA_C *g, FA_C *x, FA_C *a,
                                            long long n)
{
    if (n <= 0) return;
    FA_C lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long long i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            FA_C d = FA_FN(fa_rowwise_adagrad_grad)(k, flags, g[i + j]);
            if (flags & FA_L2) d = d + k->l2 * x[i + j];
            lane[j] = lane[j] + d * d;
        }
    }
    for (int j = 0; i + j < n; j++) {
        FA_C d = FA_FN(fa_rowwise_adagrad_grad)(k, flags, g[i + j]);
        if (flags & FA_L2) d = d + k->l2 * x[i + j];
        lane[j] = lane[j] + d * d;
    }
    const FA_C sum = ((lane[0] + lane[1]) + (lane[2] + lane[3]))
                     + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const FA_C acc = *a + sum / (FA_C)n;
    *a = acc;
    const FA_C m = k->lr / (FA_SQRT(acc) + k->eps);
    const FA_C c = (flags & FA_L2) ? (FA_C)1 - m * k->l2 : k->decay_mul;
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#pragma omp simd
#endif
    for (long long q = 0; q < n; q++)
        x[q] = c * x[q] - m * FA_FN(fa_rowwise_adagrad_grad)(k, flags, g[q]);
}
#endif /* FA_C */
