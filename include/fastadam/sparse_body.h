/* fastadam/sparse_body.h -- the dtype-generic body of the sparse kernels (contracts and formula
 * in sparse.h).  Included once per dtype by sparse.c, with
 *   FA_S     the storage and compute type (float or double),
 *   FA_SQRT  its square root (sqrtf or sqrt),
 *   FA_FN(name)  name with the dtype suffix (_f32 or _f64).
 * No include guard: this file is meant to be included more than once.  setup.py does not track
 * headers: after editing this file, touch sparse.c (or build_ext --force) so it is recompiled.
 */

/* The Adam update of n contiguous elements.  L2, CATCHUP and ZERO_G are compile-time constants
 * at every call site (always_inline), so each combination is its own branch-free simd loop. */
static inline __attribute__((always_inline)) void FA_FN(row_update)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict m, FA_S *restrict v, ptrdiff_t n,
    const fa_adam_coeffs *c, FA_S d1, FA_S d2, const int L2, const int CATCHUP, const int ZERO_G)
{
    const FA_S b1 = (FA_S)c->beta1, b2 = (FA_S)c->beta2;
    const FA_S omb1 = (FA_S)(1.0 - c->beta1), omb2 = (FA_S)(1.0 - c->beta2);
    const FA_S alpha = (FA_S)c->alpha, dscale = (FA_S)c->denom_scale, eps = (FA_S)c->eps;
    const FA_S sign = (FA_S)c->sign, l2 = (FA_S)c->l2, dmul = (FA_S)c->decay_mul;
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        FA_S gi = ZERO_G ? (FA_S)0 : g[i];
        FA_S xi = x[i];
        gi = sign * gi;
        if (L2) gi = gi + l2 * xi;
        xi = dmul * xi;
        FA_S m0 = m[i], v0 = v[i];
        if (CATCHUP) {
            m0 = m0 * d1;
            v0 = v0 * d2;
        }
        const FA_S mi = b1 * m0 + omb1 * gi;
        const FA_S vi = b2 * v0 + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        x[i] = xi - alpha * mi / (FA_SQRT(vi) * dscale + eps);
    }
}

/* out = +0 + values[perm[j0]] + ... + values[perm[j1 - 1]], added left to right.  The gradient
 * rows are gathered in random order: the row FA_PREFETCH_VALUES positions ahead in perm (up to
 * jend, the end of this thread's range) is prefetched, so the misses overlap. */
static inline __attribute__((always_inline)) void FA_FN(sum_segment)(
    FA_S *restrict out, const FA_S *restrict values, ptrdiff_t row_size,
    const int64_t *restrict perm, int64_t j0, int64_t j1, int64_t jend)
{
    const ptrdiff_t row_bytes = row_size * (ptrdiff_t)sizeof(FA_S);
#pragma omp simd
    for (ptrdiff_t i = 0; i < row_size; i++) out[i] = (FA_S)0;
    for (int64_t j = j0; j < j1; j++) {
        if (j + FA_PREFETCH_VALUES < jend)
            fa_prefetch_read(values + perm[j + FA_PREFETCH_VALUES] * row_size, row_bytes);
        const FA_S *restrict src = values + perm[j] * row_size;
#pragma omp simd
        for (ptrdiff_t i = 0; i < row_size; i++) out[i] = out[i] + src[i];
    }
}

FA_DISPATCH
void FA_FN(fa_segment_sum)(const FA_S *restrict values, ptrdiff_t row_size,
                           const int64_t *restrict perm, const int64_t *restrict offsets,
                           ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict out)
{
    for (ptrdiff_t s = s0; s < s1; s++)
        FA_FN(sum_segment)(out + s * row_size, values, row_size, perm, offsets[s], offsets[s + 1],
                           offsets[s1]);
}

/* Lazy and catchup share one loop over segments; L2 and CATCHUP are constants here too. */
static inline __attribute__((always_inline)) void FA_FN(lazy_loop)(
    FA_S *restrict x, FA_S *restrict m, FA_S *restrict v, ptrdiff_t row_size,
    const FA_S *restrict values, const int64_t *restrict perm, const int64_t *restrict offsets,
    const int64_t *restrict rows, ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict gbuf,
    int64_t *restrict last_step, int64_t t, const fa_adam_coeffs *c, const int L2,
    const int CATCHUP)
{
    const ptrdiff_t row_bytes = row_size * (ptrdiff_t)sizeof(FA_S);
    for (ptrdiff_t s = s0; s < s1; s++) {
        const int64_t r = rows[s];
        const ptrdiff_t at = (ptrdiff_t)r * row_size;
        if (s + FA_PREFETCH_ROWS < s1) { /* the table rows are random too */
            const ptrdiff_t ahead = (ptrdiff_t)rows[s + FA_PREFETCH_ROWS] * row_size;
            fa_prefetch_write(x + ahead, row_bytes);
            fa_prefetch_write(m + ahead, row_bytes);
            fa_prefetch_write(v + ahead, row_bytes);
        }
        FA_S d1 = (FA_S)1, d2 = (FA_S)1; /* multiplying by exactly 1 changes nothing */
        if (CATCHUP) {
            const int64_t idle = t - 1 - last_step[r];
            if (idle > FA_CATCHUP_EXACT) {
                d1 = (FA_S)pow(c->beta1, (double)idle);
                d2 = (FA_S)pow(c->beta2, (double)idle);
            } else if (idle > 0) { /* dense mode's idle steps, one rounding each */
                const FA_S b1 = (FA_S)c->beta1, b2 = (FA_S)c->beta2;
                for (int64_t q = 0; q < idle; q++) {
#pragma omp simd
                    for (ptrdiff_t i = 0; i < row_size; i++) {
                        m[at + i] = b1 * m[at + i];
                        v[at + i] = b2 * v[at + i];
                    }
                }
            }
            last_step[r] = t;
        }
        FA_FN(sum_segment)(gbuf, values, row_size, perm, offsets[s], offsets[s + 1], offsets[s1]);
        FA_FN(row_update)(x + at, gbuf, m + at, v + at, row_size, c, d1, d2, L2, CATCHUP, 0);
    }
}

FA_DISPATCH
void FA_FN(fa_sparse_lazy)(FA_S *restrict x, FA_S *restrict m, FA_S *restrict v,
                           ptrdiff_t row_size, const FA_S *restrict values,
                           const int64_t *restrict perm, const int64_t *restrict offsets,
                           const int64_t *restrict rows, ptrdiff_t s0, ptrdiff_t s1,
                           FA_S *restrict gbuf, const fa_adam_coeffs *c)
{
    if (c->flags & FA_L2)
        FA_FN(lazy_loop)(x, m, v, row_size, values, perm, offsets, rows, s0, s1, gbuf, NULL, 0,
                         c, 1, 0);
    else
        FA_FN(lazy_loop)(x, m, v, row_size, values, perm, offsets, rows, s0, s1, gbuf, NULL, 0,
                         c, 0, 0);
}

FA_DISPATCH
void FA_FN(fa_sparse_catchup)(FA_S *restrict x, FA_S *restrict m, FA_S *restrict v,
                              ptrdiff_t row_size, const FA_S *restrict values,
                              const int64_t *restrict perm, const int64_t *restrict offsets,
                              const int64_t *restrict rows, ptrdiff_t s0, ptrdiff_t s1,
                              FA_S *restrict gbuf, int64_t *restrict last_step, int64_t t,
                              const fa_adam_coeffs *c)
{
    if (c->flags & FA_L2)
        FA_FN(lazy_loop)(x, m, v, row_size, values, perm, offsets, rows, s0, s1, gbuf,
                         last_step, t, c, 1, 1);
    else
        FA_FN(lazy_loop)(x, m, v, row_size, values, perm, offsets, rows, s0, s1, gbuf,
                         last_step, t, c, 0, 1);
}

static inline __attribute__((always_inline)) void FA_FN(dense_loop)(
    FA_S *restrict x, FA_S *restrict m, FA_S *restrict v, ptrdiff_t row_size,
    const FA_S *restrict values, const int64_t *restrict perm, const int64_t *restrict offsets,
    const int64_t *restrict rows, ptrdiff_t nseg, ptrdiff_t r0, ptrdiff_t r1,
    FA_S *restrict gbuf, const fa_adam_coeffs *c, const int L2)
{
    /* First segment whose row is >= r0 (binary search over the sorted rows). */
    ptrdiff_t lo = 0, hi = nseg;
    while (lo < hi) {
        const ptrdiff_t mid = lo + (hi - lo) / 2;
        if (rows[mid] < r0) lo = mid + 1;
        else hi = mid;
    }
    ptrdiff_t s = lo, r = r0;
    while (r < r1) {
        const ptrdiff_t next = (s < nseg && rows[s] < r1) ? (ptrdiff_t)rows[s] : r1;
        if (next > r) { /* the untouched rows [r, next): g = +0, one contiguous loop */
            const ptrdiff_t at = r * row_size;
            FA_FN(row_update)(x + at, NULL, m + at, v + at, (next - r) * row_size, c, 1, 1, L2,
                              0, 1);
            r = next;
        }
        if (r < r1) { /* the touched row r == rows[s] */
            const ptrdiff_t at = r * row_size;
            FA_FN(sum_segment)(gbuf, values, row_size, perm, offsets[s], offsets[s + 1],
                               offsets[nseg]);
            FA_FN(row_update)(x + at, gbuf, m + at, v + at, row_size, c, 1, 1, L2, 0, 0);
            r++;
            s++;
        }
    }
}

FA_DISPATCH
void FA_FN(fa_sparse_dense)(FA_S *restrict x, FA_S *restrict m, FA_S *restrict v,
                            ptrdiff_t row_size, const FA_S *restrict values,
                            const int64_t *restrict perm, const int64_t *restrict offsets,
                            const int64_t *restrict rows, ptrdiff_t nseg, ptrdiff_t r0,
                            ptrdiff_t r1, FA_S *restrict gbuf, const fa_adam_coeffs *c)
{
    if (c->flags & FA_L2)
        FA_FN(dense_loop)(x, m, v, row_size, values, perm, offsets, rows, nseg, r0, r1, gbuf, c,
                          1);
    else
        FA_FN(dense_loop)(x, m, v, row_size, values, perm, offsets, rows, nseg, r0, r1, gbuf, c,
                          0);
}
