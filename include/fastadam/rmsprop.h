/* fastadam/rmsprop.h -- the RMSprop update of one element: the one place its formula is written
 * (see formula.h for how this header is shared and instantiated).
 *
 * Formula (one element; C = the compute type):
 *   g' = sign * (g / grad_scale)                  sign = -1 when maximizing; / only with FA_SCALE
 *   g' = g' + l2 * x                              only with FA_L2 (coupled weight decay)
 *   v  = alpha * v + (1 - alpha) * g'^2
 *   a  = alpha * a + (1 - alpha) * g'             only with FA_CENTERED; w = max(v - a^2, 0),
 *                                                 else w = v
 *   d  = g' / (sqrt(w + eps_in) + eps_out)
 *   b  = momentum * b + buf_in * d;  x = x - lr * b     with FA_RMS_MOMENTUM
 *   x  = x - lr * d                                     without
 * The conventions differ only in where eps and lr sit (folded once per step in float64 by
 * fastadam/optim/_rmsprop.py):
 *   "torch" (torch.optim.RMSprop): eps_in = 0, eps_out = eps, buf_in = 1 (lr outside the buffer)
 *   "keras" (Keras 3, TF1 ApplyRMSProp): eps_in = eps, eps_out = 0, and with momentum
 *            buf_in = lr, lr = 1 (the buffer holds lr * d).
 * Adding 0 and multiplying by 1 do not change a value, so the placements need no flag.  An idle
 * step (g = 0, no weight decay) decays v and a by alpha and b by momentum (idle rates below).
 * State slots: s0 = v (square average), then b (momentum buffer) with FA_RMS_MOMENTUM, then
 * a (gradient average) with FA_CENTERED: s1 = b or a, s2 = a when both.
 * The clamp of the centered w: in exact arithmetic v - a^2 >= 0 (a weighted variance), but v
 * and a are rounded separately -- by float32 now and then, by 8-bit states (a few percent of
 * each, quantized on its own block scale) within a few hundred steps of a steady gradient --
 * and sqrt of a negative w is NaN.  A negative w reads as 0 (the variance it estimates); a
 * NaN w stays NaN (the comparison is false), and w >= 0 keeps its bits.
 */
#ifndef FASTADAM_RMSPROP_H
#define FASTADAM_RMSPROP_H

#include "fastadam/formula.h"

enum {
    FA_CENTERED = 4,    /* keep the gradient average a; normalise by v - a^2 */
    FA_RMS_MOMENTUM = 8 /* keep the momentum buffer b */
};

typedef struct {
    double lr;          /* multiplies the step (torch: lr; keras with momentum: 1) */
    double alpha;       /* decay of v (and a) */
    double momentum;    /* decay of b */
    double buf_in;      /* weight of d in b (torch: 1; keras: lr) */
    double eps_in;      /* added under the root (keras) */
    double eps_out;     /* added to the root (torch) */
    double sign;        /* +1, or -1 to maximize */
    double grad_scale;  /* gradient divisor (FA_SCALE) */
    double l2;          /* coupled weight decay (FA_L2) */
    int flags;          /* FA_L2 | FA_SCALE | FA_CENTERED | FA_RMS_MOMENTUM */
} fa_rmsprop_coeffs;

/* Idle decay of the first two slots: v by alpha; s1 by momentum (b) or alpha (a). */
FA_INLINE void fa_rmsprop_idle_rates(const fa_rmsprop_coeffs *c, double *r0, double *r1)
{
    *r0 = c->alpha;
    *r1 = (c->flags & FA_RMS_MOMENTUM) ? c->momentum : c->alpha;
}

FA_INLINE int fa_rmsprop_nslots(const int flags)
{
    return 1 + ((flags & FA_RMS_MOMENTUM) ? 1 : 0) + ((flags & FA_CENTERED) ? 1 : 0);
}

#endif /* FASTADAM_RMSPROP_H */

#ifdef FA_C
typedef struct {
    FA_C lr, alpha, oma, momentum, buf_in, eps_in, eps_out, sign, gscale, l2;
} FA_FN(fa_rmsprop_k);

FA_INLINE FA_FN(fa_rmsprop_k) FA_FN(fa_rmsprop_prepare)(const fa_rmsprop_coeffs *c)
{
    FA_FN(fa_rmsprop_k) k;
    k.lr = (FA_C)c->lr;
    k.alpha = (FA_C)c->alpha;
    k.oma = (FA_C)(1.0 - c->alpha);
    k.momentum = (FA_C)c->momentum;
    k.buf_in = (FA_C)c->buf_in;
    k.eps_in = (FA_C)c->eps_in;
    k.eps_out = (FA_C)c->eps_out;
    k.sign = (FA_C)c->sign;
    k.gscale = (FA_C)c->grad_scale;
    k.l2 = (FA_C)c->l2;
    return k;
}

/* One element: IN g; IN/OUT *x, *s0 = v, and *s1, *s2 as the flags use them (see above). */
FA_INLINE void FA_FN(fa_rmsprop_math)(const FA_FN(fa_rmsprop_k) *k, const int flags, FA_C g,
                                      FA_C *x, FA_C *s0, FA_C *s1, FA_C *s2)
{
    FA_C gi = g;
    const FA_C xi = *x;
    if (flags & FA_SCALE) gi = gi / k->gscale;
    gi = k->sign * gi;
    if (flags & FA_L2) gi = gi + k->l2 * xi;
    const FA_C vi = k->alpha * *s0 + k->oma * (gi * gi);
    *s0 = vi;
    FA_C w = vi;
    if (flags & FA_CENTERED) {
        FA_C *a = (flags & FA_RMS_MOMENTUM) ? s2 : s1;
        const FA_C ai = k->alpha * *a + k->oma * gi;
        *a = ai;
        w = vi - ai * ai;
        w = w < (FA_C)0 ? (FA_C)0 : w; /* rounding can make it negative: see the top */
    }
    const FA_C d = gi / (FA_SQRT(w + k->eps_in) + k->eps_out);
    if (flags & FA_RMS_MOMENTUM) {
        const FA_C bi = k->momentum * *s1 + k->buf_in * d;
        *s1 = bi;
        *x = xi - k->lr * bi;
    } else {
        *x = xi - k->lr * d;
    }
}
#endif /* FA_C */
