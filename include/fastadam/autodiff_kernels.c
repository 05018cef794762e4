/* fastadam/autodiff_kernels.c -- see autodiff_kernels.h for the formulas and contracts.
 * One macro body per kernel, instantiated for float (f32) and double (f64).  Contiguous loops
 * with `#pragma omp simd`; the hot elementwise loops are static FA_DISPATCH functions (runtime ISA
 * choice) behind their exported fa_ad_* names, which call the clone of the level in use
 * (FA_AD_EXPORT; common.h). */
#include <math.h>
#include <string.h>

#include "fastadam/autodiff_kernels.h"

#ifdef _OPENMP
#define FA_SIMD _Pragma("omp simd")
#define FA_SIMD_SUM_S _Pragma("omp simd reduction(+:s)")
#else
#define FA_SIMD
#define FA_SIMD_SUM_S
#endif

FA_DISPATCH_LEVEL_STATE

/* After the static FA_DISPATCH kernel `name`: its clone table and the exported fa_##name. */
#define FA_AD_EXPORT(name, params, args)                                                        \
    FA_CLONES(name);                                                                             \
    void fa_##name params { FA_AT_LEVEL(name) args; }

#define FA_AD_DEFINE(T, S, EXP, LOG)                                                            \
    FA_DISPATCH static void ad_relu_##S(const T *restrict x, T *restrict y, ptrdiff_t n)         \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) y[k] = x[k] < (T)0 ? (T)0 : x[k];              \
    }                                                                                            \
    FA_AD_EXPORT(ad_relu_##S, (const T *restrict x, T *restrict y, ptrdiff_t n), (x, y, n))      \
    FA_DISPATCH static void ad_relu_grad_##S(const T *restrict g, const T *restrict x,           \
                                             T *restrict out, ptrdiff_t n)                       \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) out[k] = x[k] <= (T)0 ? (T)0 : g[k];            \
    }                                                                                            \
    FA_AD_EXPORT(ad_relu_grad_##S,                                                               \
                 (const T *restrict g, const T *restrict x, T *restrict out, ptrdiff_t n),       \
                 (g, x, out, n))                                                                 \
    FA_DISPATCH static void ad_relu_grad_scalar_##S(T g, const T *restrict x, T *restrict out,   \
                                                    ptrdiff_t n)                                 \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) out[k] = x[k] <= (T)0 ? (T)0 : g;               \
    }                                                                                            \
    FA_AD_EXPORT(ad_relu_grad_scalar_##S, (T g, const T *restrict x, T *restrict out, ptrdiff_t n),\
                 (g, x, out, n))                                                                 \
    FA_DISPATCH static void ad_sigmoid_##S(const T *restrict x, T *restrict y, ptrdiff_t n)      \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) {                                              \
            T v = x[k];                                                                          \
            T e = EXP(v >= (T)0 ? -v : v);                                                       \
            T r = (T)1 / ((T)1 + e);                                                             \
            y[k] = v >= (T)0 ? r : e * r;                                                        \
        }                                                                                        \
    }                                                                                            \
    FA_AD_EXPORT(ad_sigmoid_##S, (const T *restrict x, T *restrict y, ptrdiff_t n), (x, y, n))   \
    FA_DISPATCH static void ad_sigmoid_grad_##S(const T *restrict g, const T *restrict s,        \
                                                T *restrict out, ptrdiff_t n)                    \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) out[k] = g[k] * s[k] * ((T)1 - s[k]);          \
    }                                                                                            \
    FA_AD_EXPORT(ad_sigmoid_grad_##S,                                                            \
                 (const T *restrict g, const T *restrict s, T *restrict out, ptrdiff_t n),       \
                 (g, s, out, n))                                                                 \
    FA_DISPATCH static void ad_tanh_grad_##S(const T *restrict g, const T *restrict t,           \
                                             T *restrict out, ptrdiff_t n)                       \
    {                                                                                            \
        FA_SIMD for (ptrdiff_t k = 0; k < n; k++) out[k] = g[k] * ((T)1 - t[k] * t[k]);          \
    }                                                                                            \
    FA_AD_EXPORT(ad_tanh_grad_##S,                                                               \
                 (const T *restrict g, const T *restrict t, T *restrict out, ptrdiff_t n),       \
                 (g, t, out, n))                                                                 \
    FA_DISPATCH static void ad_sum_rows_##S(const T *restrict x, T *restrict out, ptrdiff_t rows,\
                                            ptrdiff_t cols, ptrdiff_t j0, ptrdiff_t j1)          \
    {                                                                                            \
        for (ptrdiff_t j = j0; j < j1; j++) out[j] = (T)0;                                       \
        for (ptrdiff_t i = 0; i < rows; i++) {                                                   \
            const T *restrict row = x + i * cols;                                                \
            FA_SIMD for (ptrdiff_t j = j0; j < j1; j++) out[j] += row[j];                        \
        }                                                                                        \
    }                                                                                            \
    FA_AD_EXPORT(ad_sum_rows_##S,                                                                \
                 (const T *restrict x, T *restrict out, ptrdiff_t rows, ptrdiff_t cols,          \
                  ptrdiff_t j0, ptrdiff_t j1),                                                   \
                 (x, out, rows, cols, j0, j1))                                                   \
    void fa_ad_im2col_##S(const T *restrict x, T *restrict cols, const fa_conv_geom *gm,         \
                          ptrdiff_t u0, ptrdiff_t u1)                                            \
    {                                                                                            \
        const ptrdiff_t L = gm->ho * gm->wo, R = gm->c * gm->kh * gm->kw;                        \
        for (ptrdiff_t u = u0; u < u1; u++) {                                                    \
            const ptrdiff_t n = u / R, r = u % R;                                                \
            const ptrdiff_t c = r / (gm->kh * gm->kw), i = (r / gm->kw) % gm->kh, j = r % gm->kw; \
            T *restrict dst = cols + u * L;                                                      \
            const T *restrict plane = x + (n * gm->c + c) * gm->h * gm->w;                       \
            const ptrdiff_t off = j * gm->dw - gm->pw;                                           \
            for (ptrdiff_t p = 0; p < gm->ho; p++) {                                             \
                T *restrict d = dst + p * gm->wo;                                                \
                const ptrdiff_t hh = p * gm->sh + i * gm->dh - gm->ph;                           \
                if (hh < 0 || hh >= gm->h) {                                                     \
                    memset(d, 0, (size_t)gm->wo * sizeof(T));                                    \
                    continue;                                                                    \
                }                                                                                \
                const T *restrict src = plane + hh * gm->w;                                      \
                if (gm->sw == 1) {                                                               \
                    ptrdiff_t q0 = off < 0 ? -off : 0;                                           \
                    ptrdiff_t q1 = gm->w - off < gm->wo ? gm->w - off : gm->wo;                  \
                    if (q1 < q0) q1 = q0;                                                        \
                    for (ptrdiff_t q = 0; q < q0; q++) d[q] = (T)0;                              \
                    if (q1 > q0) memcpy(d + q0, src + q0 + off, (size_t)(q1 - q0) * sizeof(T));  \
                    for (ptrdiff_t q = q1; q < gm->wo; q++) d[q] = (T)0;                         \
                } else {                                                                         \
                    for (ptrdiff_t q = 0; q < gm->wo; q++) {                                     \
                        const ptrdiff_t ww = q * gm->sw + off;                                   \
                        d[q] = (ww >= 0 && ww < gm->w) ? src[ww] : (T)0;                         \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    void fa_ad_col2im_##S(const T *restrict cols, T *restrict x, const fa_conv_geom *gm,         \
                          ptrdiff_t k0, ptrdiff_t k1)                                            \
    {                                                                                            \
        const ptrdiff_t L = gm->ho * gm->wo, R = gm->c * gm->kh * gm->kw;                        \
        for (ptrdiff_t k = k0; k < k1; k++) {                                                    \
            const ptrdiff_t n = k / gm->c, c = k % gm->c;                                        \
            T *restrict plane = x + k * gm->h * gm->w;                                           \
            memset(plane, 0, (size_t)(gm->h * gm->w) * sizeof(T));                               \
            for (ptrdiff_t i = 0; i < gm->kh; i++)                                               \
                for (ptrdiff_t j = 0; j < gm->kw; j++) {                                         \
                    const T *restrict src = cols + (n * R + (c * gm->kh + i) * gm->kw + j) * L;  \
                    const ptrdiff_t off = j * gm->dw - gm->pw;                                   \
                    for (ptrdiff_t p = 0; p < gm->ho; p++) {                                     \
                        const ptrdiff_t hh = p * gm->sh + i * gm->dh - gm->ph;                   \
                        if (hh < 0 || hh >= gm->h) continue;                                     \
                        T *restrict dst = plane + hh * gm->w;                                    \
                        const T *restrict s = src + p * gm->wo;                                  \
                        if (gm->sw == 1) {                                                       \
                            ptrdiff_t q0 = off < 0 ? -off : 0;                                   \
                            ptrdiff_t q1 = gm->w - off < gm->wo ? gm->w - off : gm->wo;          \
                            FA_SIMD for (ptrdiff_t q = q0; q < q1; q++) dst[q + off] += s[q];    \
                        } else {                                                                 \
                            for (ptrdiff_t q = 0; q < gm->wo; q++) {                             \
                                const ptrdiff_t ww = q * gm->sw + off;                           \
                                if (ww >= 0 && ww < gm->w) dst[ww] += s[q];                      \
                            }                                                                    \
                        }                                                                        \
                    }                                                                            \
                }                                                                                \
        }                                                                                        \
    }

FA_AD_DEFINE(float, f32, expf, logf)
FA_AD_DEFINE(double, f64, exp, log)

/* Softmax cross-entropy rows.  float64: libm's exp and log, serial sums. */
#define FA_AD_SCE_PLAIN(T, S, EXP, LOG)                                                         \
    void fa_ad_sce_rows_##S(const T *restrict x, const intptr_t *restrict labels,                \
                            T *restrict loss, ptrdiff_t cols, ptrdiff_t i0, ptrdiff_t i1)        \
    {                                                                                            \
        for (ptrdiff_t i = i0; i < i1; i++) {                                                    \
            const T *restrict row = x + i * cols;                                                \
            T m = row[0], s = (T)0;                                                              \
            for (ptrdiff_t j = 1; j < cols; j++) m = row[j] > m ? row[j] : m;                    \
            FA_SIMD_SUM_S for (ptrdiff_t j = 0; j < cols; j++) s += EXP(row[j] - m);                   \
            /* a label outside [0, cols) (refused by the caller) gives NaN, never a read */     \
            loss[i] = (uintptr_t)labels[i] < (uintptr_t)cols                                    \
                          ? m + LOG(s) - row[labels[i]] : (T)NAN;                               \
        }                                                                                        \
    }                                                                                            \
    void fa_ad_sce_grad_rows_##S(const T *restrict x, const intptr_t *restrict labels,           \
                                 T *restrict out, ptrdiff_t cols, T scale, ptrdiff_t i0,         \
                                 ptrdiff_t i1)                                                   \
    {                                                                                            \
        for (ptrdiff_t i = i0; i < i1; i++) {                                                    \
            const T *restrict row = x + i * cols;                                                \
            T *restrict o = out + i * cols;                                                      \
            T m = row[0], s = (T)0;                                                              \
            for (ptrdiff_t j = 1; j < cols; j++) m = row[j] > m ? row[j] : m;                    \
            FA_SIMD_SUM_S for (ptrdiff_t j = 0; j < cols; j++) {                                 \
                o[j] = EXP(row[j] - m);                                                          \
                s += o[j];                                                                       \
            }                                                                                    \
            T r = scale / s;                                                                     \
            FA_SIMD for (ptrdiff_t j = 0; j < cols; j++) o[j] *= r;                              \
            if ((uintptr_t)labels[i] < (uintptr_t)cols) o[labels[i]] -= scale;                  \
            else for (ptrdiff_t j = 0; j < cols; j++) o[j] = (T)NAN; /* refused by the caller */ \
        }                                                                                        \
    }
FA_AD_SCE_PLAIN(double, f64, exp, log)

/* float32: the vectorizable exp of fastexp.h and its fixed-order lane sums, so every CPU level
 * gives the same bits; an entry more than 87 below the row's max contributes exactly 0.  The
 * selects vectorize only when comparisons may not trap: scoped to these kernels. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
#include "fastadam/fastexp.h"

/* o[j] = exp(row[j] - m), 0 more than 87 below m */
static inline void fa_ad_exp_shifted_f32(const float *restrict row, float m, float *restrict o,
                                         ptrdiff_t cols)
{
    FA_SIMD for (ptrdiff_t j = 0; j < cols; j++) {
        const float d = row[j] - m;
        const float e = fa_exp_neg_f32(d);
        o[j] = d < -87.0f ? 0.0f : e;
    }
}

FA_DISPATCH static void ad_sce_rows_f32(const float *restrict x, const intptr_t *restrict labels,
                                        float *restrict loss, ptrdiff_t cols, ptrdiff_t i0,
                                        ptrdiff_t i1)
{
    float buf[256];
    for (ptrdiff_t i = i0; i < i1; i++) {
        const float *restrict row = x + i * cols;
        const float m = fa_fixed_max_f32(row, cols);
        float s = 0.0f;
        for (ptrdiff_t j0 = 0; j0 < cols; j0 += 256) {  /* 256 at a time through a buffer */
            const ptrdiff_t w = cols - j0 < 256 ? cols - j0 : 256;
            fa_ad_exp_shifted_f32(row + j0, m, buf, w);
            s += fa_fixed_sum_f32(buf, w);
        }
        /* a label outside [0, cols) (refused by the caller) gives NaN, never a read */
        loss[i] = (uintptr_t)labels[i] < (uintptr_t)cols ? m + logf(s) - row[labels[i]]
                                                         : (float)NAN;
    }
}
FA_AD_EXPORT(ad_sce_rows_f32,
             (const float *restrict x, const intptr_t *restrict labels, float *restrict loss,
              ptrdiff_t cols, ptrdiff_t i0, ptrdiff_t i1),
             (x, labels, loss, cols, i0, i1))

FA_DISPATCH static void ad_sce_grad_rows_f32(const float *restrict x,
                                             const intptr_t *restrict labels,
                                             float *restrict out, ptrdiff_t cols, float scale,
                                             ptrdiff_t i0, ptrdiff_t i1)
{
    for (ptrdiff_t i = i0; i < i1; i++) {
        const float *restrict row = x + i * cols;
        float *restrict o = out + i * cols;
        const float m = fa_fixed_max_f32(row, cols);
        fa_ad_exp_shifted_f32(row, m, o, cols);
        const float r = scale / fa_fixed_sum_f32(o, cols);
        FA_SIMD for (ptrdiff_t j = 0; j < cols; j++) o[j] *= r;
        if ((uintptr_t)labels[i] < (uintptr_t)cols) o[labels[i]] -= scale;
        else for (ptrdiff_t j = 0; j < cols; j++) o[j] = (float)NAN; /* refused by the caller */
    }
}
FA_AD_EXPORT(ad_sce_grad_rows_f32,
             (const float *restrict x, const intptr_t *restrict labels, float *restrict out,
              ptrdiff_t cols, float scale, ptrdiff_t i0, ptrdiff_t i1),
             (x, labels, out, cols, scale, i0, i1))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
