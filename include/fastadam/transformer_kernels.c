/* fastadam/transformer_kernels.c -- see transformer_kernels.h for the formulas and contracts.
 * The hot loops are static FA_DISPATCH functions (runtime ISA choice) behind the exported fa_tk_*
 * names, which call the clone of the level in use (common.h). */
#include "fastadam/transformer_kernels.h"

#ifdef _OPENMP
#include <omp.h>
int fa_tk_max_threads(void) { return omp_get_max_threads(); }
#else
int fa_tk_max_threads(void) { return 1; }
#endif

/* FA_DISPATCH (AVX-512 / AVX2 / baseline clones) on the erf and GELU loops; not on the GELU
   derivative, which gcc vectorizes at the baseline level but not in its AVX2 clone. */
/* The clamps below are selects; gcc turns them into vector blends (and so vectorizes the
   loops) only when comparisons may not trap: scoped to these functions. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize ("no-trapping-math")
#endif
/* exp(y) for y <= 0 in float32, vectorizable, the same bits at every level */
#include "fastadam/fastexp.h"
/* two passes over the chunk (in L1): one loop holding both the erf and the exp selects is
   not vectorized by gcc at x86-64-v3 */
FA_DISPATCH static void tk_gelu_grad_f32_loop(const float *g, const float *x, float *o,
                                              ptrdiff_t n) {
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++)
        o[i] = 0.5f * (1.0f + fa_tk_erf_f32(x[i] * 0.70710678118654752f));
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float v = x[i];
        const float density = 0.39894228040143267794f * fa_exp_neg_f32(-0.5f * v * v);
        o[i] = g[i] * (o[i] + v * density);
    }
}
/* softmax of rows of n float32 values: exp(x - max) / sum; an entry more than 87 below
   the row's max (a -inf mask included) is exactly 0 */
FA_DISPATCH static void tk_softmax_f32_rows(const float *x, float *y, ptrdiff_t rows,
                                            ptrdiff_t n) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const float m = fa_fixed_max_f32(xr, n);
        #pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) {
            const float d = xr[i] - m;
            const float e = fa_exp_neg_f32(d);
            yr[i] = d < -87.0f ? 0.0f : e;
        }
        const float inv = 1.0f / fa_fixed_sum_f32(yr, n);  /* fastexp.h: fixed order */
        #pragma omp simd
        for (ptrdiff_t k = 0; k < n; k++) yr[k] *= inv;
    }
}
/* the VJP of softmax per row: dx = y * (g - sum(g * y)) */
FA_DISPATCH static void tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx,
                                                ptrdiff_t rows, ptrdiff_t n) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *gr = g + r * n, *yr = y + r * n;
        float *o = dx + r * n;
        const float dot = fa_fixed_dot_f32(gr, yr, n);  /* fastexp.h: fixed order */
        #pragma omp simd
        for (ptrdiff_t k = 0; k < n; k++) o[k] = yr[k] * (gr[k] - dot);
    }
}
/* Layer normalisation of float32 rows, statistics in float64: the sums run over 8 lanes
   (lane j adds the elements j, j + 8, ... in turn, then the lanes in one fixed order), so
   every CPU level gives the same bits.  Same arithmetic as the float64 Cython loops. */
#define FA_TK_DLANES 8
static inline double fa_tk_dlanes_sum(const double *acc) {
    double s = 0.0;
    for (int j = 0; j < FA_TK_DLANES; j++) s += acc[j];
    return s;
}
/* The rows are taken FA_TK_LN_BLOCK at a time, each step of the row arithmetic run for
   every row of the block in turn: a row's sums are chains of dependent additions (lane by
   lane, then the lanes, then a division and a square root), and the rows of a block are
   independent chains the core overlaps.  Each row's operations and their order are those
   of a block of one (the rows past the last full block), so the bits do not depend on the
   blocking.  R is a constant after inlining: the loops over the block unroll. */
#define FA_TK_LN_BLOCK 4
static inline __attribute__((always_inline)) void fa_tk_ln_f32_block(
        const float *x, const float *scale, const float *bias, float *y, float *mean,
        float *rstd, ptrdiff_t n, double eps, const int R) {
    double acc[FA_TK_LN_BLOCK][FA_TK_DLANES] = {{0.0}};
    double m[FA_TK_LN_BLOCK], inv[FA_TK_LN_BLOCK];
    ptrdiff_t i = 0;
    for (; i + FA_TK_DLANES <= n; i += FA_TK_DLANES)
        for (int q = 0; q < R; q++) {
            #pragma omp simd
            for (int j = 0; j < FA_TK_DLANES; j++) acc[q][j] += (double)x[q * n + i + j];
        }
    for (int q = 0; q < R; q++) {
        for (int j = 0; i + j < n; j++) acc[q][j] += (double)x[q * n + i + j];
        m[q] = fa_tk_dlanes_sum(acc[q]) / (double)n;
    }
    double acc2[FA_TK_LN_BLOCK][FA_TK_DLANES] = {{0.0}};
    for (i = 0; i + FA_TK_DLANES <= n; i += FA_TK_DLANES)
        for (int q = 0; q < R; q++) {
            #pragma omp simd
            for (int j = 0; j < FA_TK_DLANES; j++) {
                const double d = (double)x[q * n + i + j] - m[q];
                acc2[q][j] += d * d;
            }
        }
    for (int q = 0; q < R; q++) {
        for (int j = 0; i + j < n; j++) {
            const double d = (double)x[q * n + i + j] - m[q];
            acc2[q][j] += d * d;
        }
        inv[q] = 1.0 / __builtin_sqrt(fa_tk_dlanes_sum(acc2[q]) / (double)n + eps);
        mean[q] = (float)m[q];
        rstd[q] = (float)inv[q];
    }
    for (int q = 0; q < R; q++) {
        const float *xr = x + q * n;
        float *yr = y + q * n;
        const double mq = m[q], iq = inv[q];
        if (bias) {
            #pragma omp simd
            for (ptrdiff_t k = 0; k < n; k++)
                yr[k] = (float)(((double)xr[k] - mq) * iq) * scale[k] + bias[k];
        } else {
            #pragma omp simd
            for (ptrdiff_t k = 0; k < n; k++)
                yr[k] = (float)(((double)xr[k] - mq) * iq) * scale[k];
        }
    }
}
FA_DISPATCH static void tk_ln_f32_rows(const float *x, const float *scale, const float *bias,
                                       float *y, float *mean, float *rstd, ptrdiff_t rows,
                                       ptrdiff_t n, double eps) {
    ptrdiff_t r = 0;
    for (; r + FA_TK_LN_BLOCK <= rows; r += FA_TK_LN_BLOCK)
        fa_tk_ln_f32_block(x + r * n, scale, bias, y + r * n, mean + r, rstd + r, n, eps,
                           FA_TK_LN_BLOCK);
    for (; r < rows; r++)
        fa_tk_ln_f32_block(x + r * n, scale, bias, y + r * n, mean + r, rstd + r, n, eps, 1);
}
/* dx of layer normalisation per float32 row: rstd * (gs - mean(gs) - xhat * mean(gs xhat)),
   gs = g * scale, xhat = (x - mean) * rstd, in float64 with the row means (the statistics
   of the forward, rounded to float32 as stored); rows in blocks as above */
static inline __attribute__((always_inline)) void fa_tk_ln_backward_f32_block(
        const float *g, const float *x, const float *scale, const float *mean,
        const float *rstd, float *dx, ptrdiff_t n, const int R) {
    double acc_a[FA_TK_LN_BLOCK][FA_TK_DLANES] = {{0.0}};
    double acc_b[FA_TK_LN_BLOCK][FA_TK_DLANES] = {{0.0}};
    double a[FA_TK_LN_BLOCK], b[FA_TK_LN_BLOCK];
    ptrdiff_t i = 0;
    for (; i + FA_TK_DLANES <= n; i += FA_TK_DLANES)
        for (int q = 0; q < R; q++) {
            const float *gr = g + q * n, *xr = x + q * n;
            const double m = mean[q], inv = rstd[q];
            #pragma omp simd
            for (int j = 0; j < FA_TK_DLANES; j++) {
                const double gs = (double)gr[i + j] * scale[i + j];
                acc_a[q][j] += gs;
                acc_b[q][j] += gs * ((double)xr[i + j] - m) * inv;
            }
        }
    for (int q = 0; q < R; q++) {
        const float *gr = g + q * n, *xr = x + q * n;
        const double m = mean[q], inv = rstd[q];
        for (int j = 0; i + j < n; j++) {
            const double gs = (double)gr[i + j] * scale[i + j];
            acc_a[q][j] += gs;
            acc_b[q][j] += gs * ((double)xr[i + j] - m) * inv;
        }
        a[q] = fa_tk_dlanes_sum(acc_a[q]) / (double)n;
        b[q] = fa_tk_dlanes_sum(acc_b[q]) / (double)n;
    }
    for (int q = 0; q < R; q++) {
        const float *gr = g + q * n, *xr = x + q * n;
        float *o = dx + q * n;
        const double m = mean[q], inv = rstd[q], aq = a[q], bq = b[q];
        #pragma omp simd
        for (ptrdiff_t k = 0; k < n; k++) {
            const double gs = (double)gr[k] * scale[k];
            const double xh = ((double)xr[k] - m) * inv;
            o[k] = (float)(inv * (gs - aq - xh * bq));
        }
    }
}
FA_DISPATCH static void tk_ln_backward_f32_rows(const float *g, const float *x,
                                                const float *scale, const float *mean,
                                                const float *rstd, float *dx,
                                                ptrdiff_t rows, ptrdiff_t n) {
    ptrdiff_t r = 0;
    for (; r + FA_TK_LN_BLOCK <= rows; r += FA_TK_LN_BLOCK)
        fa_tk_ln_backward_f32_block(g + r * n, x + r * n, scale, mean + r, rstd + r,
                                    dx + r * n, n, FA_TK_LN_BLOCK);
    for (; r < rows; r++)
        fa_tk_ln_backward_f32_block(g + r * n, x + r * n, scale, mean + r, rstd + r,
                                    dx + r * n, n, 1);
}
/* The column sums of layer normalisation's parameter gradients, in float64, row after row
   (each column's terms in row order: the bits of the serial Cython loop for float64
   input): dscale[j] += g[r, j] * ((x[r, j] - mean[r]) * rstd[r]), dbias[j] += g[r, j]. */
FA_DISPATCH static void tk_ln_param_grads_f32(const float *restrict g,
                                              const float *restrict x,
                                              const float *restrict mean,
                                              const float *restrict rstd,
                                              double *restrict dscale,
                                              double *restrict dbias, ptrdiff_t rows,
                                              ptrdiff_t n) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *gr = g + r * n, *xr = x + r * n;
        const double m = mean[r], inv = rstd[r];
        #pragma omp simd
        for (ptrdiff_t j = 0; j < n; j++) {
            dscale[j] += (double)gr[j] * (((double)xr[j] - m) * inv);
            dbias[j] += (double)gr[j];
        }
    }
}
FA_DISPATCH static void tk_erf_f32_loop(const float *x, float *y, ptrdiff_t n) {
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) y[i] = fa_tk_erf_f32(x[i]);
}
FA_DISPATCH static void tk_gelu_f32_loop(const float *x, float *y, ptrdiff_t n) {
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++)
        y[i] = 0.5f * x[i] * (1.0f + fa_tk_erf_f32(x[i] * 0.70710678118654752f));
}
/* GELU keeping cdf = Phi(x) for the backward pass: y with the bits of tk_gelu_f32_loop,
   cdf with those of the first pass of tk_gelu_grad_f32_loop; and that backward pass from
   the kept cdf (its second pass), without erf */
FA_DISPATCH static void tk_gelu_cdf_f32_loop(const float *x, float *y, float *cdf,
                                             ptrdiff_t n) {
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float e1 = 1.0f + fa_tk_erf_f32(x[i] * 0.70710678118654752f);
        y[i] = 0.5f * x[i] * e1;
        cdf[i] = 0.5f * e1;
    }
}
FA_DISPATCH static void tk_gelu_grad_cdf_f32_loop(const float *g, const float *x,
                                                  const float *cdf, float *o,
                                                  ptrdiff_t n) {
    #pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float v = x[i];
        const float density = 0.39894228040143267794f * fa_exp_neg_f32(-0.5f * v * v);
        o[i] = g[i] * (cdf[i] + v * density);
    }
}
/* Fused attention of one batch-head (q: T x d, kt: d x S, v: S x e, mask: T x S, all
   row-major): P = softmax(alpha q kt + mask) over each row, o = P v; P is kept for the
   backward pass.  The softmax is tk_softmax_f32_rows' per element (exp(x - max) by fastexp.h, 0
   more than 87 below the max, times 1 / sum); its max and sum run over 16 lanes combined
   as a tree.  Row i uses its first ncols[i] columns only: the caller found the others
   masked with -FLT_MAX or -inf, whose probabilities the unfused softmax makes exactly 0
   (ncols[i] is S for a row with nothing live).

   The products run as tiles of 4 rows by 16 columns (fa_tk_tile): 4 x 16 accumulators in
   registers, each summing its terms in one order (k ascending), so every CPU level gives
   the same bits (no FMA contraction) and the 4 rows' sums do not wait on each other.  Rows
   go in blocks of 4; a block's columns end at nb, its rows' largest ncols rounded up to
   the tile (at most S); probabilities (and their gradients) between a row's ncols and nb
   are set to exactly 0, so that the products over j < nb add nothing for them. */
#define FA_TK_INLINE static inline __attribute__((always_inline))
#define FA_TK_TW 16
/* C[r, l] = sum_{k0 <= k < K} A[r * sam + k * sak] * B[k * ldb + l] for r < R <= 4,
   l < W <= 16 (a row r >= R reads row 0 of A and is not stored) */
FA_TK_INLINE void fa_tk_tile(const float *restrict A, ptrdiff_t sam, ptrdiff_t sak,
                             const float *restrict B, ptrdiff_t ldb, float *restrict C,
                             ptrdiff_t ldc, ptrdiff_t R, ptrdiff_t W, ptrdiff_t k0,
                             ptrdiff_t K) {
    const float *a0 = A, *a1 = A + (R > 1) * sam, *a2 = A + (R > 2) * 2 * sam;
    const float *a3 = A + (R > 3) * 3 * sam;
    if (W == FA_TK_TW) {
        float c0[FA_TK_TW], c1[FA_TK_TW], c2[FA_TK_TW], c3[FA_TK_TW];
        #pragma omp simd
        for (int l = 0; l < FA_TK_TW; l++) c0[l] = c1[l] = c2[l] = c3[l] = 0.0f;
        for (ptrdiff_t k = k0; k < K; k++) {
            const float *b = B + k * ldb;
            const float x0 = a0[k * sak], x1 = a1[k * sak], x2 = a2[k * sak];
            const float x3 = a3[k * sak];
            #pragma omp simd
            for (int l = 0; l < FA_TK_TW; l++) {
                c0[l] += x0 * b[l];
                c1[l] += x1 * b[l];
                c2[l] += x2 * b[l];
                c3[l] += x3 * b[l];
            }
        }
        #pragma omp simd
        for (int l = 0; l < FA_TK_TW; l++) C[l] = c0[l];
        if (R > 1) {
            #pragma omp simd
            for (int l = 0; l < FA_TK_TW; l++) C[ldc + l] = c1[l];
        }
        if (R > 2) {
            #pragma omp simd
            for (int l = 0; l < FA_TK_TW; l++) C[2 * ldc + l] = c2[l];
        }
        if (R > 3) {
            #pragma omp simd
            for (int l = 0; l < FA_TK_TW; l++) C[3 * ldc + l] = c3[l];
        }
        return;
    }
    for (ptrdiff_t r = 0; r < R; r++)
        for (ptrdiff_t l = 0; l < W; l++) {
            float acc = 0.0f;
            for (ptrdiff_t k = k0; k < K; k++) acc += A[r * sam + k * sak] * B[k * ldb + l];
            C[r * ldc + l] = acc;
        }
}
/* C (M x N, row-major, ldc) = A (M x K) B (K x N, ldb), tile by tile; A[m, k] at
   A[m * sam + k * sak]; the sum starts at k0 */
FA_TK_INLINE void fa_tk_product(const float *restrict A, ptrdiff_t sam, ptrdiff_t sak,
                                const float *restrict B, ptrdiff_t ldb, float *restrict C,
                                ptrdiff_t ldc, ptrdiff_t M, ptrdiff_t N, ptrdiff_t k0,
                                ptrdiff_t K) {
    for (ptrdiff_t m = 0; m < M; m += 4) {
        const ptrdiff_t R = M - m < 4 ? M - m : 4;
        for (ptrdiff_t n = 0; n < N; n += FA_TK_TW)
            fa_tk_tile(A + m * sam, sam, sak, B + n, ldb, C + m * ldc + n, ldc, R,
                       N - n < FA_TK_TW ? N - n : FA_TK_TW, k0, K);
    }
}
/* the columns of the row block at i (R rows): its largest ncols rounded up to a tile */
FA_TK_INLINE ptrdiff_t fa_tk_block_cols(const int32_t *ncols, ptrdiff_t i, ptrdiff_t R,
                                         ptrdiff_t S) {
    ptrdiff_t nb = 0;
    for (ptrdiff_t r = 0; r < R; r++) nb = ncols[i + r] > nb ? ncols[i + r] : nb;
    nb = (nb + FA_TK_TW - 1) / FA_TK_TW * FA_TK_TW;
    return nb < S ? nb : S;
}
/* Row reductions over 16 lanes (lane l takes the elements j with j % 16 == l, in turn),
   the lanes then combined as a tree in one fixed order: few dependent steps for short
   rows, and the same bits at every CPU level. */
FA_TK_INLINE float fa_tk_lanes_sum(float *acc) {
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    for (int l = 0; l < 2; l++) acc[l] += acc[l + 2];
    return acc[0] + acc[1];
}
FA_TK_INLINE float fa_tk_lanes_max(float *acc) {
    for (int l = 0; l < 8; l++) acc[l] = acc[l + 8] > acc[l] ? acc[l + 8] : acc[l];
    for (int l = 0; l < 4; l++) acc[l] = acc[l + 4] > acc[l] ? acc[l + 4] : acc[l];
    for (int l = 0; l < 2; l++) acc[l] = acc[l + 2] > acc[l] ? acc[l + 2] : acc[l];
    return acc[1] > acc[0] ? acc[1] : acc[0];
}
/* The probabilities of the R <= 4 rows of a block (row r: P + r S, its mask row mask +
   r S, its live columns ncols[r]): the scores s (n16 of them computed: n rounded up to 16,
   at most S) become softmax(s + mi) over j < n and 0 elsewhere up to S.  The elements
   from n to n16 go through the same vector code as -inf (probability 0), so that a short
   row is whole vectors; a row of S % 16 elements ends in a padded block t.  Each step
   runs for the block's rows in turn: their reductions (tree, division) do not wait on
   each other. */
FA_TK_INLINE void fa_tk_att_rows(float *restrict P, const float *restrict mask,
                                 const int32_t *ncols, ptrdiff_t R, ptrdiff_t S,
                                 float alpha) {
    float acc[4][16], t[4][16], m[4], inv[4];
    ptrdiff_t n16[4], full[4];
    for (ptrdiff_t r = 0; r < R; r++) {
        const ptrdiff_t n = ncols[r];
        float *s = P + r * S;
        const float *mi = mask + r * S;
        n16[r] = (n + 15) / 16 * 16 < S ? (n + 15) / 16 * 16 : S;
        full[r] = n16[r] / 16 * 16;
        #pragma omp simd
        for (int l = 0; l < 16; l++) acc[r][l] = -INFINITY;
        for (ptrdiff_t j = 0; j < full[r]; j += 16) {
            #pragma omp simd
            for (int l = 0; l < 16; l++) {
                const float x = j + l < n ? alpha * s[j + l] + mi[j + l] : -INFINITY;
                s[j + l] = x;
                acc[r][l] = x > acc[r][l] ? x : acc[r][l];
            }
        }
        if (full[r] < n16[r]) {
            const ptrdiff_t f = full[r];
            for (int l = 0; l < 16; l++)
                t[r][l] = f + l < n ? alpha * s[f + l] + mi[f + l] : -INFINITY;
            #pragma omp simd
            for (int l = 0; l < 16; l++) acc[r][l] = t[r][l] > acc[r][l] ? t[r][l] : acc[r][l];
        }
    }
    for (ptrdiff_t r = 0; r < R; r++) m[r] = fa_tk_lanes_max(acc[r]);
    for (ptrdiff_t r = 0; r < R; r++) {
        float *s = P + r * S;
        const float mr = m[r];
        #pragma omp simd
        for (int l = 0; l < 16; l++) acc[r][l] = 0.0f;
        for (ptrdiff_t j = 0; j < full[r]; j += 16) {
            #pragma omp simd
            for (int l = 0; l < 16; l++) {
                const float dd = s[j + l] - mr;
                const float ex = fa_exp_neg_f32(dd);
                const float p = dd < -87.0f ? 0.0f : ex;
                s[j + l] = p;
                acc[r][l] += p;
            }
        }
        if (full[r] < n16[r]) {
            #pragma omp simd
            for (int l = 0; l < 16; l++) {
                const float dd = t[r][l] - mr;
                const float ex = fa_exp_neg_f32(dd);
                const float p = dd < -87.0f ? 0.0f : ex;
                t[r][l] = p;
                acc[r][l] += p;
            }
        }
    }
    for (ptrdiff_t r = 0; r < R; r++) inv[r] = 1.0f / fa_tk_lanes_sum(acc[r]);
    for (ptrdiff_t r = 0; r < R; r++) {
        float *s = P + r * S;
        const float ir = inv[r];
        for (ptrdiff_t j = 0; j < full[r]; j += 16) {
            #pragma omp simd
            for (int l = 0; l < 16; l++) s[j + l] *= ir;
        }
        for (ptrdiff_t j = full[r]; j < n16[r]; j++) s[j] = t[r][j - full[r]] * ir;
        ptrdiff_t j = n16[r];
        for (; j + 16 <= S; j += 16) {
            #pragma omp simd
            for (int l = 0; l < 16; l++) s[j + l] = 0.0f;
        }
        for (; j < S; j++) s[j] = 0.0f;
    }
}
/* o and the probabilities P (T x S, kept for the backward pass) */
FA_DISPATCH static void tk_attention_f32(const float *q, ptrdiff_t ldq, const float *kt,
                                         ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                                         const float *mask, const int32_t *ncols, float *o,
                                         float *P, ptrdiff_t T, ptrdiff_t S, ptrdiff_t d,
                                         ptrdiff_t e, float alpha) {
    for (ptrdiff_t i = 0; i < T; i += 4) {
        const ptrdiff_t R = T - i < 4 ? T - i : 4;
        const ptrdiff_t nb = fa_tk_block_cols(ncols, i, R, S);
        fa_tk_product(q + i * ldq, ldq, 1, kt, ldk, P + i * S, S, R, nb, 0, d);
        fa_tk_att_rows(P + i * S, mask + i * S, ncols + i, R, S, alpha);
        fa_tk_product(P + i * S, S, 1, v, ldv, o + i * e, e, R, e, 0, nb);
    }
}
/* Its backward pass for the output cotangent g (T x e), from the forward pass's P:
   dp = g v^T, ds = alpha p (dp - sum(dp * p)) (the softmax VJP, times the scores' scale),
   dq = ds kt^T, dkt = q^T ds,
   dv = p^T g; the last two sum over the rows from the first row block whose columns reach
   the tile (the rows before it hold exact zeros there).  Scratch: dS (T x S), kk (S x d:
   kt transposed), vt (e x S: v transposed). */
FA_DISPATCH static void tk_attention_bwd_f32(const float *g, ptrdiff_t ldg, const float *q,
                                             ptrdiff_t ldq, const float *kt, ptrdiff_t ldk,
                                             const float *v, ptrdiff_t ldv, const float *P,
                                             const int32_t *ncols, float *dq, float *dkt,
                                             float *dv, float *dS, float *kk, float *vt,
                                             ptrdiff_t T, ptrdiff_t S, ptrdiff_t d,
                                             ptrdiff_t e, float alpha) {
    for (ptrdiff_t k = 0; k < d; k++)
        for (ptrdiff_t j = 0; j < S; j++) kk[j * d + k] = kt[k * ldk + j];
    for (ptrdiff_t j = 0; j < S; j++)
        for (ptrdiff_t c = 0; c < e; c++) vt[c * S + j] = v[j * ldv + c];
    for (ptrdiff_t i = 0; i < T; i += 4) {
        const ptrdiff_t R = T - i < 4 ? T - i : 4;
        const ptrdiff_t nb = fa_tk_block_cols(ncols, i, R, S);
        fa_tk_product(g + i * ldg, ldg, 1, vt, S, dS + i * S, S, R, nb, 0, e);
        for (ptrdiff_t r = 0; r < R; r++) {
            const float *p = P + (i + r) * S;
            float *ds = dS + (i + r) * S;
            /* over j < nb: p is 0 from n on, ds finite there (the product above) */
            float acc[16];
            const ptrdiff_t full = nb / 16 * 16;
            #pragma omp simd
            for (int l = 0; l < 16; l++) acc[l] = 0.0f;
            for (ptrdiff_t j = 0; j < full; j += 16) {
                #pragma omp simd
                for (int l = 0; l < 16; l++) acc[l] += ds[j + l] * p[j + l];
            }
            if (full < nb) {  /* the tail of a row of S % 16 elements, as a block */
                float tail[16];
                for (int l = 0; l < 16; l++)
                    tail[l] = full + l < nb ? ds[full + l] * p[full + l] : 0.0f;
                #pragma omp simd
                for (int l = 0; l < 16; l++) acc[l] += tail[l];
            }
            const float dot = fa_tk_lanes_sum(acc);
            for (ptrdiff_t j = 0; j < full; j += 16) {
                #pragma omp simd
                for (int l = 0; l < 16; l++)
                    ds[j + l] = alpha * (p[j + l] * (ds[j + l] - dot));
            }
            for (ptrdiff_t j = full; j < nb; j++) ds[j] = alpha * (p[j] * (ds[j] - dot));
            ptrdiff_t j = nb;
            for (; j + 16 <= S; j += 16) {
                #pragma omp simd
                for (int l = 0; l < 16; l++) ds[j + l] = 0.0f;
            }
            for (; j < S; j++) ds[j] = 0.0f;
        }
        fa_tk_product(dS + i * S, S, 1, kk, d, dq + i * d, d, R, d, 0, nb);
    }
    /* dkt (d x S) = q^T dS and dv (S x e) = P^T g, a tile of columns (of dkt) or of rows
       (of dv) at a time, each summing from the first row whose block reaches it */
    for (ptrdiff_t j = 0; j < S; j += FA_TK_TW) {
        ptrdiff_t first = 0;
        while (first < T && fa_tk_block_cols(ncols, first, T - first < 4 ? T - first : 4,
                                             S) <= j)
            first += 4;
        if (first > T) first = T;
        const ptrdiff_t W = S - j < FA_TK_TW ? S - j : FA_TK_TW;
        for (ptrdiff_t k = 0; k < d; k += 4)
            fa_tk_tile(q + k, 1, ldq, dS + j, S, dkt + k * S + j, S, d - k < 4 ? d - k : 4,
                       W, first, T);
        for (ptrdiff_t jj = j; jj < j + W; jj += 4)
            fa_tk_product(P + jj, 1, S, g, ldg, dv + jj * e, e,
                          j + W - jj < 4 ? j + W - jj : 4, e, first, T);
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
/* the clone of the level in use (include/fastadam/common.h) */
FA_DISPATCH_LEVEL_STATE
FA_CLONES(tk_erf_f32_loop);
FA_CLONES(tk_gelu_f32_loop);
FA_CLONES(tk_gelu_grad_f32_loop);
FA_CLONES(tk_gelu_cdf_f32_loop);
FA_CLONES(tk_gelu_grad_cdf_f32_loop);
FA_CLONES(tk_softmax_f32_rows);
FA_CLONES(tk_softmax_vjp_f32_rows);
FA_CLONES(tk_attention_f32);
FA_CLONES(tk_attention_bwd_f32);
FA_CLONES(tk_ln_f32_rows);
FA_CLONES(tk_ln_backward_f32_rows);
FA_CLONES(tk_ln_param_grads_f32);
void fa_tk_ln_f32_rows(const float *x, const float *scale, const float *bias,
                              float *y, float *mean, float *rstd, ptrdiff_t rows,
                              ptrdiff_t n, double eps) {
    FA_AT_LEVEL(tk_ln_f32_rows)(x, scale, bias, y, mean, rstd, rows, n, eps);
}
void fa_tk_ln_param_grads_f32(const float *g, const float *x, const float *mean,
                                     const float *rstd, double *dscale, double *dbias,
                                     ptrdiff_t rows, ptrdiff_t n) {
    FA_AT_LEVEL(tk_ln_param_grads_f32)(g, x, mean, rstd, dscale, dbias, rows, n);
}
void fa_tk_ln_backward_f32_rows(const float *g, const float *x, const float *scale,
                                       const float *mean, const float *rstd, float *dx,
                                       ptrdiff_t rows, ptrdiff_t n) {
    FA_AT_LEVEL(tk_ln_backward_f32_rows)(g, x, scale, mean, rstd, dx, rows, n);
}
void fa_tk_gelu_grad_f32_loop(const float *g, const float *x, float *o,
                                     ptrdiff_t n) {
    FA_AT_LEVEL(tk_gelu_grad_f32_loop)(g, x, o, n);
}
void fa_tk_softmax_f32_rows(const float *x, float *y, ptrdiff_t rows, ptrdiff_t n) {
    FA_AT_LEVEL(tk_softmax_f32_rows)(x, y, rows, n);
}
void fa_tk_softmax_vjp_f32_rows(const float *g, const float *y, float *dx,
                                       ptrdiff_t rows, ptrdiff_t n) {
    FA_AT_LEVEL(tk_softmax_vjp_f32_rows)(g, y, dx, rows, n);
}
void fa_tk_attention_f32(const float *q, ptrdiff_t ldq, const float *kt,
                                ptrdiff_t ldk, const float *v, ptrdiff_t ldv,
                                const float *mask, const int32_t *ncols, float *o, float *P,
                                ptrdiff_t T, ptrdiff_t S, ptrdiff_t d, ptrdiff_t e,
                                float alpha) {
    FA_AT_LEVEL(tk_attention_f32)(q, ldq, kt, ldk, v, ldv, mask, ncols, o, P, T, S, d, e,
                                  alpha);
}
void fa_tk_attention_bwd_f32(const float *g, ptrdiff_t ldg, const float *q,
                                    ptrdiff_t ldq, const float *kt, ptrdiff_t ldk,
                                    const float *v, ptrdiff_t ldv, const float *P,
                                    const int32_t *ncols, float *dq, float *dkt, float *dv,
                                    float *dS, float *kk, float *vt, ptrdiff_t T,
                                    ptrdiff_t S, ptrdiff_t d, ptrdiff_t e, float alpha) {
    FA_AT_LEVEL(tk_attention_bwd_f32)(g, ldg, q, ldq, kt, ldk, v, ldv, P, ncols, dq, dkt, dv,
                                      dS, kk, vt, T, S, d, e, alpha);
}
void fa_tk_erf_f32_loop(const float *x, float *y, ptrdiff_t n) {
    FA_AT_LEVEL(tk_erf_f32_loop)(x, y, n);
}
void fa_tk_gelu_f32_loop(const float *x, float *y, ptrdiff_t n) {
    FA_AT_LEVEL(tk_gelu_f32_loop)(x, y, n);
}
void fa_tk_gelu_cdf_f32_loop(const float *x, float *y, float *cdf, ptrdiff_t n) {
    FA_AT_LEVEL(tk_gelu_cdf_f32_loop)(x, y, cdf, n);
}
void fa_tk_gelu_grad_cdf_f32_loop(const float *g, const float *x, const float *cdf,
                                         float *o, ptrdiff_t n) {
    FA_AT_LEVEL(tk_gelu_grad_cdf_f32_loop)(g, x, cdf, o, n);
}
