/* fastadam/adam.h -- the Adam update of one element: the one place its formula is written
 * (see formula.h for how this header is shared and instantiated).
 *
 * Formula (one element; C = the compute type):
 *   g' = sign * (g / grad_scale)                  sign = -1 when maximizing; / only with FA_SCALE
 *   g' = g' + l2 * x                              only with FA_L2 (Adam weight_decay, ONNX norm_coefficient)
 *   x  = decay_mul * x                            AdamW: decay_mul = 1 - lr*wd, else exactly 1
 *   m  = beta1 * m + (1 - beta1) * g'
 *   v  = beta2 * v + (1 - beta2) * g'^2
 *   v_max = max(v_max, v); vh = v_max             only with FA_AMSGRAD, else vh = v
 *   mu = beta1 * m + (1 - beta1) * g'             only with FA_NESTEROV (TensorFlow's form), else mu = m
 *   x  = post_mul * (x - alpha * mu / (sqrt(vh) * denom_scale + eps))
 * The conventions differ only in alpha and denom_scale (folded once per step in float64 by
 * fastadam/optim/_coefficients.py):
 *   "tf"/"onnx": alpha = lr*sqrt(1-beta2^t)/(1-beta1^t), denom_scale = 1
 *   "torch":     alpha = lr/(1-beta1^t),                 denom_scale = 1/sqrt(1-beta2^t)
 *   "onnx", t<=0: alpha = lr, denom_scale = 1.
 * Multiplications by exactly 1 (decay_mul, post_mul, denom_scale, sign) do not change a value,
 * so those switches need no flag.  An idle step (g = 0, no weight decay) only decays the moments:
 * m = beta1 * m, v = beta2 * v (the rates fa_adam_idle_rates gives the sparse catch-up).
 * State slots: s0 = m, s1 = v, s2 = v_max.
 */
#ifndef FASTADAM_ADAM_H
#define FASTADAM_ADAM_H

#include "fastadam/formula.h"

enum {
    FA_AMSGRAD = 4,  /* keep and use v_max */
    FA_NESTEROV = 8  /* TensorFlow's Nesterov momentum */
};

typedef struct {
    double alpha;        /* step size multiplying mu / denom */
    double denom_scale;  /* multiplies sqrt(vh) */
    double eps;          /* added to the scaled sqrt(vh) */
    double beta1, beta2; /* moment decay rates */
    double sign;         /* +1, or -1 to maximize */
    double grad_scale;   /* gradient divisor (FA_SCALE) */
    double l2;           /* coupled weight decay (FA_L2) */
    double decay_mul;    /* decoupled weight decay factor, 1 when off */
    double post_mul;     /* 1 - post_decay */
    int flags;           /* FA_L2 | FA_SCALE | FA_AMSGRAD | FA_NESTEROV */
} fa_adam_coeffs;

/* Decay rates of the state slots over one idle step (s0 = m, s1 = v). */
FA_INLINE void fa_adam_idle_rates(const fa_adam_coeffs *c, double *r0, double *r1)
{
    *r0 = c->beta1;
    *r1 = c->beta2;
}

/* State slots used: m, v, and v_max with FA_AMSGRAD. */
FA_INLINE int fa_adam_nslots(const int flags) { return (flags & FA_AMSGRAD) ? 3 : 2; }

#endif /* FASTADAM_ADAM_H */

#ifdef FA_C
/* The coefficients in the compute type, converted once per kernel call. */
typedef struct {
    FA_C b1, b2, omb1, omb2, alpha, dscale, eps, sign, gscale, l2, dmul, pmul;
} FA_FN(fa_adam_k);

FA_INLINE FA_FN(fa_adam_k) FA_FN(fa_adam_prepare)(const fa_adam_coeffs *c)
{
    FA_FN(fa_adam_k) k;
    k.b1 = (FA_C)c->beta1;
    k.b2 = (FA_C)c->beta2;
    k.omb1 = (FA_C)(1.0 - c->beta1);
    k.omb2 = (FA_C)(1.0 - c->beta2);
    k.alpha = (FA_C)c->alpha;
    k.dscale = (FA_C)c->denom_scale;
    k.eps = (FA_C)c->eps;
    k.sign = (FA_C)c->sign;
    k.gscale = (FA_C)c->grad_scale;
    k.l2 = (FA_C)c->l2;
    k.dmul = (FA_C)c->decay_mul;
    k.pmul = (FA_C)c->post_mul;
    return k;
}

/* One element: IN g; IN/OUT *x, *m, *v, and *vmax with FA_AMSGRAD (else not touched). */
FA_INLINE void FA_FN(fa_adam_math)(const FA_FN(fa_adam_k) *k, const int flags, FA_C g, FA_C *x,
                                   FA_C *m, FA_C *v, FA_C *vmax)
{
    FA_C gi = g;
    FA_C xi = *x;
    if (flags & FA_SCALE) gi = gi / k->gscale;
    gi = k->sign * gi;
    if (flags & FA_L2) gi = gi + k->l2 * xi;
    xi = k->dmul * xi;
    const FA_C mi = k->b1 * *m + k->omb1 * gi;
    const FA_C vi = k->b2 * *v + k->omb2 * (gi * gi);
    *m = mi;
    *v = vi;
    FA_C vh = vi;
    if (flags & FA_AMSGRAD) {
        vh = *vmax > vi ? *vmax : vi;
        *vmax = vh;
    }
    FA_C mu = mi;
    if (flags & FA_NESTEROV) mu = k->b1 * mi + k->omb1 * gi;
    *x = k->pmul * (xi - k->alpha * mu / (FA_SQRT(vh) * k->dscale + k->eps));
}
#endif /* FA_C */
