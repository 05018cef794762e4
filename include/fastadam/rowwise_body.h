/* fastadam/rowwise_body.h -- the loops of the row-wise optimizers (FA_ROWWISE_OPTIMIZER rows of
 * optimizers.def: one state value per row), written once per storage type.  No include guard:
 * included with
 *   FA_S         the storage and compute type (float or double),
 *   FA_FN(name)  name with its suffix (_f32 or _f64),
 * after formulas.h, and one of
 *   FA_ROWWISE_DENSE   by dense.c: the dense kernels (contract: fa_rowwise_dense in dense.h);
 *   FA_ROWWISE_SPARSE  by sparse_body.h, after its sum_segment and prefetch helpers: the lazy
 *                      and dense-mode walks (contract: fa_sparse_rows / fa_sparse_dense in
 *                      sparse.h, with st0 the accumulators, one per row: stride[1] apart, and
 *                      st1 unused).
 * The formula is the optimizer's row function (rowwise_adagrad.h), called once per row; every
 * row is independent and always computed alike, so the result does not depend on how rows are
 * split over threads, and a dense-mode sparse step equals the dense step on the densified
 * gradient bit for bit.
 */

#ifdef FA_ROWWISE_DENSE
/* Rows [0, n_rows) of a packed (n_rows, row_size) x and g; a[r] the accumulator of row r. */
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    static inline __attribute__((always_inline)) void FA_FN(name##_dense_rows)(                \
        FA_S *restrict x, const FA_S *restrict g, FA_S *restrict a, ptrdiff_t n_rows,          \
        ptrdiff_t row_size, const FA_FN(fa_##name##_k) *k, const int FLAGS)                    \
    {                                                                                          \
        for (ptrdiff_t r = 0; r < n_rows; r++)                                                 \
            FA_FN(fa_##name##_row)(k, FLAGS, g + r * row_size, x + r * row_size, a + r,        \
                                   (long long)row_size);                                       \
    }
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER

#define FA_ROWWISE_DENSE_CASE(F, name)                                                         \
    {                                                                                          \
        FA_FN(name##_dense_rows)(x, g, a, n_rows, row_size, &k, F);                            \
        status = FA_OK;                                                                        \
    }
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    FA_DISPATCH                                                                                \
    static int FA_FN(name##_rowwise_dense)(const void *coeffs, FA_S *restrict x,               \
                                           const FA_S *restrict g, FA_S *restrict a,           \
                                           ptrdiff_t n_rows, ptrdiff_t row_size)               \
    {                                                                                          \
        const fa_##name##_coeffs *c = (const fa_##name##_coeffs *)coeffs;                     \
        const FA_FN(fa_##name##_k) k = FA_FN(fa_##name##_prepare)(c);                          \
        int status = FA_ERR_UNSUPPORTED;                                                       \
        if (c->flags & ~15) return status;                                                     \
        FA_FLAG_SWITCH(c->flags, DENSE_MASK, FA_ROWWISE_DENSE_CASE, name)                      \
        return status;                                                                         \
    }                                                                                          \
    FA_CLONES(FA_FN(name##_rowwise_dense));
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
#undef FA_ROWWISE_DENSE_CASE
#endif /* FA_ROWWISE_DENSE */

#ifdef FA_ROWWISE_SPARSE
/* Lazy (and catchup: last_step not NULL) mode: the touched rows rows[s], s in [s0, s1).  An
 * accumulator never decays, so catch-up only records the step. */
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    static inline __attribute__((always_inline)) void FA_FN(name##_rowwise_lazy)(              \
        const void *coeffs, FA_S *restrict x, FA_S *restrict acc, ptrdiff_t row_size,          \
        const ptrdiff_t *stride, const FA_S *restrict values, const int64_t *restrict perm,    \
        const int64_t *restrict offsets, const int64_t *restrict rows, ptrdiff_t s0,           \
        ptrdiff_t s1, FA_S *restrict gbuf, int64_t *restrict last_step, int64_t t,             \
        const int FLAGS)                                                                       \
    {                                                                                          \
        const FA_FN(fa_##name##_k) k =                                                         \
            FA_FN(fa_##name##_prepare)((const fa_##name##_coeffs *)coeffs);                    \
        const ptrdiff_t xs = stride[0], as = stride[1];                                        \
        const ptrdiff_t row_bytes = row_size * (ptrdiff_t)sizeof(FA_S);                        \
        for (ptrdiff_t s = s0; s < s1; s++) {                                                  \
            const ptrdiff_t r = (ptrdiff_t)rows[s];                                            \
            if (s + FA_PREFETCH_ROWS < s1) {                                                   \
                const ptrdiff_t ahead = (ptrdiff_t)rows[s + FA_PREFETCH_ROWS];                 \
                fa_prefetch_write(x + ahead * xs, row_bytes);                                  \
                fa_prefetch_write(acc + ahead * as, (ptrdiff_t)sizeof(FA_S));                  \
            }                                                                                  \
            FA_FN(sum_segment)(gbuf, values, row_size, perm, offsets[s], offsets[s + 1],       \
                               offsets[s1]);                                                   \
            FA_FN(fa_##name##_row)(&k, FLAGS, gbuf, x + r * xs, acc + r * as,                  \
                                   (long long)row_size);                                       \
            if (last_step) last_step[r] = t;                                                   \
        }                                                                                      \
    }                                                                                          \
    /* Dense mode: every table row in [r0, r1), g = its segment sum or +0 when untouched. */  \
    static inline __attribute__((always_inline)) void FA_FN(name##_rowwise_all)(               \
        const void *coeffs, FA_S *restrict x, FA_S *restrict acc, ptrdiff_t row_size,          \
        const ptrdiff_t *stride, const FA_S *restrict values, const int64_t *restrict perm,    \
        const int64_t *restrict offsets, const int64_t *restrict rows, ptrdiff_t nseg,         \
        ptrdiff_t r0, ptrdiff_t r1, FA_S *restrict gbuf, const int FLAGS)                      \
    {                                                                                          \
        const FA_FN(fa_##name##_k) k =                                                         \
            FA_FN(fa_##name##_prepare)((const fa_##name##_coeffs *)coeffs);                    \
        const ptrdiff_t xs = stride[0], as = stride[1];                                        \
        ptrdiff_t lo = 0, hi = nseg;                                                           \
        while (lo < hi) { /* the first segment whose row is >= r0 */                           \
            const ptrdiff_t mid = lo + (hi - lo) / 2;                                          \
            if (rows[mid] < r0) lo = mid + 1;                                                  \
            else hi = mid;                                                                     \
        }                                                                                      \
        int zeroed = 0; /* gbuf holds +0 */                                                    \
        for (ptrdiff_t r = r0, s = lo; r < r1; r++) {                                          \
            if (s < nseg && rows[s] == r) {                                                    \
                FA_FN(sum_segment)(gbuf, values, row_size, perm, offsets[s], offsets[s + 1],   \
                                   offsets[nseg]);                                             \
                s++;                                                                           \
                zeroed = 0;                                                                    \
            } else if (!zeroed) {                                                              \
                for (ptrdiff_t i = 0; i < row_size; i++) gbuf[i] = (FA_S)0;                    \
                zeroed = 1;                                                                    \
            }                                                                                  \
            FA_FN(fa_##name##_row)(&k, FLAGS, gbuf, x + r * xs, acc + r * as,                  \
                                   (long long)row_size);                                       \
        }                                                                                      \
    }
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER

/* One dispatched function per row-wise optimizer and walk; flags outside SPARSE_MASK leave
 * FA_ERR_UNSUPPORTED, decided before any write. */
#define FA_ROWWISE_LAZY_CASE(F, name)                                                          \
    {                                                                                          \
        FA_FN(name##_rowwise_lazy)(coeffs, x, st0, row_size, stride, values, perm, offsets,    \
                                   rows, s0, s1, gbuf, last_step, t, F);                       \
        status = FA_OK;                                                                        \
    }
#define FA_ROWWISE_ALL_CASE(F, name)                                                           \
    {                                                                                          \
        FA_FN(name##_rowwise_all)(coeffs, x, st0, row_size, stride, values, perm, offsets,     \
                                  rows, nseg, r0, r1, gbuf, F);                                \
        status = FA_OK;                                                                        \
    }
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    FA_DISPATCH                                                                                \
    static int FA_FN(name##_sparse_rows)(                                                      \
        const int flags, const void *coeffs, FA_S *restrict x, FA_S *restrict st0,             \
        FA_S *restrict st1, ptrdiff_t row_size, const ptrdiff_t *stride,                       \
        const FA_S *restrict values, const int64_t *restrict perm,                             \
        const int64_t *restrict offsets, const int64_t *restrict rows, ptrdiff_t s0,           \
        ptrdiff_t s1, FA_S *restrict gbuf, int64_t *restrict last_step, int64_t t)             \
    {                                                                                          \
        int status = FA_ERR_UNSUPPORTED;                                                       \
        (void)st1;                                                                             \
        FA_FLAG_SWITCH(flags, SPARSE_MASK, FA_ROWWISE_LAZY_CASE, name)                         \
        return status;                                                                         \
    }                                                                                          \
    FA_CLONES(FA_FN(name##_sparse_rows));                                                      \
    FA_DISPATCH                                                                                \
    static int FA_FN(name##_sparse_dense)(                                                     \
        const int flags, const void *coeffs, FA_S *restrict x, FA_S *restrict st0,             \
        FA_S *restrict st1, ptrdiff_t row_size, const ptrdiff_t *stride,                       \
        const FA_S *restrict values, const int64_t *restrict perm,                             \
        const int64_t *restrict offsets, const int64_t *restrict rows, ptrdiff_t nseg,         \
        ptrdiff_t r0, ptrdiff_t r1, FA_S *restrict gbuf)                                       \
    {                                                                                          \
        int status = FA_ERR_UNSUPPORTED;                                                       \
        (void)st1;                                                                             \
        FA_FLAG_SWITCH(flags, SPARSE_MASK, FA_ROWWISE_ALL_CASE, name)                          \
        return status;                                                                         \
    }                                                                                          \
    FA_CLONES(FA_FN(name##_sparse_dense));
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
#undef FA_ROWWISE_LAZY_CASE
#undef FA_ROWWISE_ALL_CASE
#endif /* FA_ROWWISE_SPARSE */
