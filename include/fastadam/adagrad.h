/* fastadam/adagrad.h -- the Adagrad update of one element: the one place its formula is written
 * (see formula.h for how this header is shared and instantiated).
 *
 * Formula (one element; C = the compute type):
 *   g' = sign * (g / grad_scale)                  sign = -1 when maximizing; / only with FA_SCALE
 *   g' = g' + l2 * x                              only with FA_L2 (weight_decay, ONNX norm_coefficient)
 *   h  = h + g'^2
 *   x  = x - lr * g' / (sqrt(h) + eps)            eps outside the root (ONNX, PyTorch)
 *   x  = x - lr * g' / sqrt(h + eps)              with FA_EPS_INSIDE (Keras 3)
 * `lr` is this step's rate, folded once per step in float64 (fastadam/optim/_coefficients.py):
 *   "onnx":  lr = R / (1 + T * decay_factor)
 *   "torch": lr = lr / (1 + (t - 1) * lr_decay)
 *   "keras": lr = learning_rate.
 * An idle step (g = 0, no weight decay) changes nothing: both idle rates are 1.
 * State slot: s0 = h (the accumulated squared gradients).
 */
#ifndef FASTADAM_ADAGRAD_H
#define FASTADAM_ADAGRAD_H

#include "fastadam/formula.h"

enum {
    FA_EPS_INSIDE = 4  /* Keras: sqrt(h + eps) instead of sqrt(h) + eps */
};

typedef struct {
    double lr;          /* this step's learning rate (decay folded in) */
    double eps;
    double sign;        /* +1, or -1 to maximize */
    double grad_scale;  /* gradient divisor (FA_SCALE) */
    double l2;          /* coupled weight decay (FA_L2) */
    int flags;          /* FA_L2 | FA_SCALE | FA_EPS_INSIDE */
} fa_adagrad_coeffs;

FA_INLINE void fa_adagrad_idle_rates(const fa_adagrad_coeffs *c, double *r0, double *r1)
{
    (void)c;
    *r0 = 1.0;
    *r1 = 1.0;
}

FA_INLINE int fa_adagrad_nslots(const int flags)
{
    (void)flags;
    return 1;
}

#endif /* FASTADAM_ADAGRAD_H */

#ifdef FA_C
typedef struct {
    FA_C lr, eps, sign, gscale, l2;
} FA_FN(fa_adagrad_k);

FA_INLINE FA_FN(fa_adagrad_k) FA_FN(fa_adagrad_prepare)(const fa_adagrad_coeffs *c)
{
    FA_FN(fa_adagrad_k) k;
    k.lr = (FA_C)c->lr;
    k.eps = (FA_C)c->eps;
    k.sign = (FA_C)c->sign;
    k.gscale = (FA_C)c->grad_scale;
    k.l2 = (FA_C)c->l2;
    return k;
}

/* One element: IN g; IN/OUT *x, *h (the other slots are not touched). */
FA_INLINE void FA_FN(fa_adagrad_math)(const FA_FN(fa_adagrad_k) *k, const int flags, FA_C g,
                                      FA_C *x, FA_C *h, FA_C *unused1, FA_C *unused2)
{
    (void)unused1;
    (void)unused2;
    FA_C gi = g;
    const FA_C xi = *x;
    if (flags & FA_SCALE) gi = gi / k->gscale;
    gi = k->sign * gi;
    if (flags & FA_L2) gi = gi + k->l2 * xi;
    const FA_C hi = *h + gi * gi;
    *h = hi;
    const FA_C denom = (flags & FA_EPS_INSIDE) ? FA_SQRT(hi + k->eps) : FA_SQRT(hi) + k->eps;
    *x = xi - k->lr * gi / denom;
}
#endif /* FA_C */
