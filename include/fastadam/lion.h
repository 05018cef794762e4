/* fastadam/lion.h -- the Lion update of one element (Chen et al. 2023, "Symbolic Discovery of
 * Optimization Algorithms"): the one place its formula is written (see formula.h).
 *
 * Formula (one element; C = the compute type):
 *   g' = sign * (g / grad_scale)                  sign = -1 when maximizing; / only with FA_SCALE
 *   c  = beta1 * m + (1 - beta1) * g'             the interpolation whose sign is the step
 *   x  = decay_mul * x - lr * sgn(c)              decay_mul = 1 - lr * weight_decay (decoupled)
 *   m  = beta2 * m + (1 - beta2) * g'
 * sgn(c) is +1 or -1, c itself when c is a zero (so x does not move) or NaN (which propagates).
 * Every scalar is folded once per step in float64 (fastadam/optim/_lion.py).  An idle step
 * (g = 0) decays m by beta2 (the idle rate below); x still moves by lr * sgn(beta1 * m).
 * State slot: s0 = m.
 */
#ifndef FASTADAM_LION_H
#define FASTADAM_LION_H

#include "fastadam/formula.h"

typedef struct {
    double lr;
    double beta1, beta2;
    double decay_mul;   /* 1 - lr * weight_decay, exactly 1 when off */
    double sign;        /* +1, or -1 to maximize */
    double grad_scale;  /* gradient divisor (FA_SCALE) */
    int flags;          /* FA_SCALE */
} fa_lion_coeffs;

FA_INLINE void fa_lion_idle_rates(const fa_lion_coeffs *c, double *r0, double *r1)
{
    *r0 = c->beta2;
    *r1 = 1.0;
}

FA_INLINE int fa_lion_nslots(const int flags)
{
    (void)flags;
    return 1;
}

#endif /* FASTADAM_LION_H */

#ifdef FA_C
typedef struct {
    FA_C lr, b1, omb1, b2, omb2, dmul, gscale;
} FA_FN(fa_lion_k);

FA_INLINE FA_FN(fa_lion_k) FA_FN(fa_lion_prepare)(const fa_lion_coeffs *c)
{
    FA_FN(fa_lion_k) k;
    /* sign (+-1) rides on the gradient's two weights: (+-w) * g == +-(w * g) exactly, as
     * rounding is symmetric, so this is sign * g's result bit for bit, one multiply fewer */
    k.lr = (FA_C)c->lr;
    k.b1 = (FA_C)c->beta1;
    k.omb1 = (FA_C)c->sign * (FA_C)(1.0 - c->beta1);
    k.b2 = (FA_C)c->beta2;
    k.omb2 = (FA_C)c->sign * (FA_C)(1.0 - c->beta2);
    k.dmul = (FA_C)c->decay_mul;
    k.gscale = (FA_C)c->grad_scale;
    return k;
}

/* One element: IN g; IN/OUT *x, *m (the other slots are not touched). */
FA_INLINE void FA_FN(fa_lion_math)(const FA_FN(fa_lion_k) *k, const int flags, FA_C g, FA_C *x,
                                   FA_C *m, FA_C *unused1, FA_C *unused2)
{
    (void)unused1;
    (void)unused2;
    FA_C gi = g;
    if (flags & FA_SCALE) gi = gi / k->gscale;
    const FA_C mi = *m;
    const FA_C c = k->b1 * mi + k->omb1 * gi;
    /* branch-free, so the loop vectorizes in few instructions: +-1 carrying c's sign bit where
     * |c| > 0, c itself for a zero or a NaN (an ordered comparison is false for both) */
    const FA_C u = FA_FABS(c) > (FA_C)0 ? FA_COPYSIGN((FA_C)1, c) : c;
    *x = k->dmul * *x - k->lr * u;
    *m = k->b2 * mi + k->omb2 * gi;
}
#endif /* FA_C */
