/* fastadam/momentum.h -- the momentum (SGD) update of one element: the one place its formula is
 * written (see formula.h for how this header is shared and instantiated).
 *
 * Formula (one element; C = the compute type):
 *   g' = sign * (g / grad_scale)                  sign = -1 when maximizing; / only with FA_SCALE
 *   g' = g' + l2 * x                              only with FA_L2 (weight_decay, ONNX norm_coefficient)
 *   v  = a * v + b * g'
 *   x  = x - lr * v                               standard
 *   x  = x - lr * (g' + an * v)                   with FA_MOMENTUM_NESTEROV
 * with a, b, an folded once per step in float64 (fastadam/optim/_coefficients.py):
 *   "onnx" (Momentum, alpha, beta): a = alpha, b = beta (1 when T == 0), an = alpha
 *   "torch" (SGD, momentum, dampening): a = momentum, b = 1 - dampening, an = momentum; on the
 *            first step (t == 1) a = 0 and b = 1, so v = g' (torch's buffer = clone(grad)); with
 *            momentum == 0, b = 1 and v = g'.
 * An idle step (g = 0, no weight decay) decays v by a (idle rates a and 1).
 * State slot: s0 = v (the momentum buffer).
 */
#ifndef FASTADAM_MOMENTUM_H
#define FASTADAM_MOMENTUM_H

#include "fastadam/formula.h"

enum {
    FA_MOMENTUM_NESTEROV = 4  /* x -= lr * (g' + an * v) */
};

typedef struct {
    double lr;
    double a;           /* decay of v */
    double b;           /* weight of the gradient in v */
    double an;          /* weight of v in the Nesterov step */
    double idle_rate;   /* decay of v over one idle step (the steady-state a) */
    double sign;        /* +1, or -1 to maximize */
    double grad_scale;  /* gradient divisor (FA_SCALE) */
    double l2;          /* coupled weight decay (FA_L2) */
    int flags;          /* FA_L2 | FA_SCALE | FA_MOMENTUM_NESTEROV */
} fa_momentum_coeffs;

FA_INLINE void fa_momentum_idle_rates(const fa_momentum_coeffs *c, double *r0, double *r1)
{
    *r0 = c->idle_rate;
    *r1 = 1.0;
}

FA_INLINE int fa_momentum_nslots(const int flags)
{
    (void)flags;
    return 1;
}

#endif /* FASTADAM_MOMENTUM_H */

#ifdef FA_C
typedef struct {
    FA_C lr, a, b, an, sign, gscale, l2;
} FA_FN(fa_momentum_k);

FA_INLINE FA_FN(fa_momentum_k) FA_FN(fa_momentum_prepare)(const fa_momentum_coeffs *c)
{
    FA_FN(fa_momentum_k) k;
    k.lr = (FA_C)c->lr;
    k.a = (FA_C)c->a;
    k.b = (FA_C)c->b;
    k.an = (FA_C)c->an;
    k.sign = (FA_C)c->sign;
    k.gscale = (FA_C)c->grad_scale;
    k.l2 = (FA_C)c->l2;
    return k;
}

/* One element: IN g; IN/OUT *x, *v (the other slots are not touched). */
FA_INLINE void FA_FN(fa_momentum_math)(const FA_FN(fa_momentum_k) *k, const int flags, FA_C g,
                                      FA_C *x, FA_C *v, FA_C *unused1, FA_C *unused2)
{
    (void)unused1;
    (void)unused2;
    FA_C gi = g;
    const FA_C xi = *x;
    if (flags & FA_SCALE) gi = gi / k->gscale;
    gi = k->sign * gi;
    if (flags & FA_L2) gi = gi + k->l2 * xi;
    const FA_C vi = k->a * *v + k->b * gi;
    *v = vi;
    const FA_C d = (flags & FA_MOMENTUM_NESTEROV) ? gi + k->an * vi : vi;
    *x = xi - k->lr * d;
}
#endif /* FA_C */
