/* fastadam/autodiff_kernels.h -- kernels behind the hot primitives of fastadam.autodiff.
 *
 * Design: each kernel is the math of one primitive (or of its VJP) over [0, n) of contiguous
 * arrays, written once as a macro body and instantiated with _f32 / _f64 suffixes.  The Cython
 * driver (fastadam/_core/_autodiff_kernels.pyx) allocates outputs, validates shapes/dtypes before
 * releasing the GIL, and splits large arrays into static chunks over OpenMP threads; every
 * element (row, column, plane) is computed by exactly one call, so results are identical for any
 * thread count.  Compute type = the storage type (float32 math stays float32, as NumPy does).
 * No allocation, no globals, no I/O.  Thread safety: calls on disjoint outputs may run at once.
 *
 * Formulas (T = float or double):
 *   relu:          y = x < 0 ? 0 : x            (NaN stays NaN, as torch.relu)
 *   relu_grad:     out = x <= 0 ? 0 : g         (relu_grad_scalar: the same with one scalar g;
 *                                               a NaN x passes g on, as PyTorch's backward)
 *   sigmoid:       e = exp(-|x|); y = x >= 0 ? 1 / (1 + e) : e / (1 + e)   (never overflows)
 *   sigmoid_grad:  out = g * s * (1 - s)
 *   tanh_grad:     out = g * (1 - t * t)
 *   sum_rows:      out[j] = sum_{i in [0, rows)} x[i, j], i ascending         (x is rows x cols)
 *   sce_rows:      loss[i] = m_i + log(sum_j exp(x[i,j] - m_i)) - x[i, label[i]], m_i = max_j x[i,j]
 *   sce_grad_rows: out[i,j] = scale * (exp(x[i,j] - m_i) / s_i - [j == label[i]])
 *   im2col:        cols[n, r, (p, q)] = xpad[n, c, p*sh + i*dh, q*sw + j*dw], r = (c, i, j)
 *                  (cols is N x (C*kh*kw) x (Ho*Wo): one GEMM per sample gives NCHW directly)
 *   col2im:        the adjoint of im2col: x[n, c, h, w] += cols[n, (c, i, j), (p, q)] for every
 *                  (i, j, p, q) with p*sh + i*dh - ph = h and q*sw + j*dw - pw = w
 */
#ifndef FASTADAM_AUTODIFF_KERNELS_H
#define FASTADAM_AUTODIFF_KERNELS_H

#include "fastadam/common.h"

/* Convolution geometry (im2col/col2im). */
typedef struct {
    ptrdiff_t n, c, h, w;     /* input N, C, H, W */
    ptrdiff_t kh, kw;         /* kernel size */
    ptrdiff_t sh, sw;         /* stride */
    ptrdiff_t ph, pw;         /* zero padding on each side */
    ptrdiff_t dh, dw;         /* dilation */
    ptrdiff_t ho, wo;         /* output size */
} fa_conv_geom;

#define FA_AD_DECLARE(T, S)                                                                     \
    /* y[0,n) OUT = relu(x[0,n) IN). */                                                          \
    void fa_ad_relu_##S(const T *x, T *y, ptrdiff_t n);                                          \
    /* out[0,n) OUT = x > 0 ? g : 0; g, x IN, length n. */                                       \
    void fa_ad_relu_grad_##S(const T *g, const T *x, T *out, ptrdiff_t n);                       \
    /* out[0,n) OUT = x > 0 ? g : 0 for one scalar g (a broadcast cotangent); x IN. */          \
    void fa_ad_relu_grad_scalar_##S(T g, const T *x, T *out, ptrdiff_t n);                       \
    /* y[0,n) OUT = sigmoid(x[0,n) IN), overflow-free. */                                        \
    void fa_ad_sigmoid_##S(const T *x, T *y, ptrdiff_t n);                                       \
    /* out OUT = g * s * (1 - s); g, s IN, length n. */                                          \
    void fa_ad_sigmoid_grad_##S(const T *g, const T *s, T *out, ptrdiff_t n);                    \
    /* out OUT = g * (1 - t * t); g, t IN, length n. */                                          \
    void fa_ad_tanh_grad_##S(const T *g, const T *t, T *out, ptrdiff_t n);                       \
    /* out[j0, j1) OUT = column sums of x (rows x cols, row-major, IN) over i ascending.         \
     * Complexity O(rows * (j1 - j0)). */                                                        \
    void fa_ad_sum_rows_##S(const T *x, T *out, ptrdiff_t rows, ptrdiff_t cols,                  \
                            ptrdiff_t j0, ptrdiff_t j1);                                         \
    /* loss[i0, i1) OUT: per-row softmax cross-entropy of logits (rows x cols, IN) and labels    \
     * (IN, values in [0, cols), checked by the caller; a row whose label is outside gets NaN:  \
     * the kernel never reads or writes outside x's row).  O((i1 - i0) * cols). */              \
    void fa_ad_sce_rows_##S(const T *x, const intptr_t *labels, T *loss, ptrdiff_t cols,         \
                            ptrdiff_t i0, ptrdiff_t i1);                                         \
    /* out rows [i0, i1) OUT = scale * (softmax(x[i]) - onehot(labels[i])).  x IN, no aliasing. \
     * A label outside [0, cols) fills its row of out with NaN (never indexes outside it). */   \
    void fa_ad_sce_grad_rows_##S(const T *x, const intptr_t *labels, T *out, ptrdiff_t cols,     \
                                 T scale, ptrdiff_t i0, ptrdiff_t i1);                           \
    /* rows u = n*R + r in [u0, u1) OUT of the N x R x (Ho*Wo) im2col array of x (N,C,H,W IN), \
     * R = C*kh*kw.  O((u1 - u0) * Ho * Wo). */                                                  \
    void fa_ad_im2col_##S(const T *x, T *cols, const fa_conv_geom *g, ptrdiff_t u0,             \
                          ptrdiff_t u1);                                                         \
    /* x planes [k0, k1) (k = n*C + c) OUT, overwritten, of col2im(cols IN). */                  \
    void fa_ad_col2im_##S(const T *cols, T *x, const fa_conv_geom *g, ptrdiff_t k0,             \
                          ptrdiff_t k1);

FA_AD_DECLARE(float, f32)
FA_AD_DECLARE(double, f64)

#endif /* FASTADAM_AUTODIFF_KERNELS_H */
