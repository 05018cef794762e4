/* fastadam/dense.h -- the fused dense Adam step.
 *
 * Design: one pass over memory.  Each element of x, g, m, v (and v_max with amsgrad) is read once
 * and x, m, v (, v_max) written once: 28 bytes per float32 element, 4 of them the gradient.
 * The Python layer (fastadam/_dense_api.py) validates everything and folds the hyper-parameters
 * into fa_adam_coeffs in float64; the Cython layer (fastadam/_dense.pyx) splits the tensors into
 * chunks and calls these kernels on [0, n) of a chunk from an OpenMP parallel region.
 *
 * Formula (one element; `C` is the compute type: float for float16/float32, double for float64):
 *   g' = sign * (g / grad_scale)                 sign = -1 when maximizing; / only with FA_SCALE
 *   g' = g' + l2 * x                             only with FA_L2 (Adam weight_decay, ONNX norm_coefficient)
 *   x  = decay_mul * x                           AdamW: decay_mul = 1 - lr*wd, else exactly 1
 *   m  = beta1 * m + (1 - beta1) * g'
 *   v  = beta2 * v + (1 - beta2) * g'^2
 *   v_max = max(v_max, v); vh = v_max            only with FA_AMSGRAD, else vh = v
 *   mu = beta1 * m + (1 - beta1) * g'            only with FA_NESTEROV (TensorFlow's form), else mu = m
 *   x  = post_mul * (x - alpha * mu / (sqrt(vh) * denom_scale + eps))
 * The conventions differ only in alpha and denom_scale (computed once per step in float64):
 *   "tf"/"onnx": alpha = lr*sqrt(1-beta2^t)/(1-beta1^t), denom_scale = 1
 *   "torch":     alpha = lr/(1-beta1^t),                 denom_scale = 1/sqrt(1-beta2^t)
 *   "onnx", t<=0: alpha = lr, denom_scale = 1.
 * Multiplications by exactly 1 (decay_mul, post_mul, denom_scale, sign) do not change a value, so
 * those switches need no branch; the others (FA_L2, FA_SCALE, FA_AMSGRAD, FA_NESTEROV) select one
 * of 16 loops, compiled separately, outside the element loop.
 *
 * Thread safety: the kernels write only [x, m, v, v_max][0, n); disjoint ranges may run at once.
 * Results do not depend on how a tensor is split into chunks (every element is independent).
 */
#ifndef FASTADAM_DENSE_H
#define FASTADAM_DENSE_H

#include "fastadam/common.h"

enum {
    FA_L2 = 1,       /* add l2 * x to the gradient */
    FA_SCALE = 2,    /* divide the gradient by grad_scale */
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

/* fa_adam_dense_<dtype>: one Adam step on n elements.
 *   x     IN/OUT  n  parameters
 *   g     IN      n  gradient (never written)
 *   m, v  IN/OUT  n  first and second moments
 *   v_max IN/OUT  n  running max of v (FA_AMSGRAD only; may be NULL otherwise)
 * Preconditions: the output arrays do not overlap each other nor g; n >= 0.
 * Complexity: O(n), one pass. */
void fa_adam_dense_f32(float *x, const float *g, float *m, float *v, float *v_max, ptrdiff_t n,
                       const fa_adam_coeffs *c);
void fa_adam_dense_f64(double *x, const double *g, double *m, double *v, double *v_max,
                       ptrdiff_t n, const fa_adam_coeffs *c);
void fa_adam_dense_f16(fa_half *x, const fa_half *g, fa_half *m, fa_half *v, fa_half *v_max,
                       ptrdiff_t n, const fa_adam_coeffs *c);

/* fa_all_finite_<dtype>: 1 if every g[i] / grad_scale (or g[i] when grad_scale == 1) is finite,
 * else 0.  IN g[0, n).  O(n), read-only, thread safe. */
int fa_all_finite_f32(const float *g, ptrdiff_t n, double grad_scale);
int fa_all_finite_f64(const double *g, ptrdiff_t n, double grad_scale);
int fa_all_finite_f16(const fa_half *g, ptrdiff_t n, double grad_scale);

/* fa_stream_rw_f32: the memory-bandwidth yardstick for the dense step, with the same traffic
 * (read 4 arrays, write 3): a[i] += d[i]; b[i] += d[i]; c[i] += d[i] * e[i]... see dense.c.
 * Used by benchmarks only. */
void fa_stream_rw_f32(float *a, const float *d, float *b, float *c, ptrdiff_t n);

#endif /* FASTADAM_DENSE_H */
