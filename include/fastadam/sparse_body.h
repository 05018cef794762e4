/* fastadam/sparse_body.h -- the dtype-generic body of the sparse kernels (contracts in
 * sparse.h).  Included once per dtype by sparse.c, with
 *   FA_S     the storage and compute type (float or double),
 *   FA_FN(name)  name with the dtype suffix (_f32 or _f64),
 * after formulas.h (the optimizers' element formulas).  No include guard: this file is meant
 * to be included more than once.
 */

/* The prepared coefficients of the optimizer a call applies: only the member of `kind` is set
 * (one member per optimizer of optimizers.def). */
typedef struct {
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK) FA_FN(fa_##name##_k) name;
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
} FA_FN(fa_prepared);

static inline __attribute__((always_inline)) FA_FN(fa_prepared) FA_FN(prepare)(
    const int KIND, const void *coeffs)
{
    FA_FN(fa_prepared) p;
    memset(&p, 0, sizeof p);
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (KIND == FA_OPT_##K) p.name = FA_FN(fa_##name##_prepare)((const fa_##name##_coeffs *)coeffs);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
    return p;
}

/* One optimizer's update of n contiguous elements (g = +0 when ZERO_G), with its first one or
 * two state slots (the sparse walk keeps at most two).  The gradient used is +0 + g[i]: the
 * segment sum of a single row, so the walk may hand a one-row segment's gradient row straight
 * from `values` (its sum of several rows already starts at +0, and +0 + s == s).  FLAGS and ZERO_G are compile-time
 * constants at every call site (always_inline), so each combination is its own branch-free
 * simd loop. */
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    static inline __attribute__((always_inline)) void FA_FN(name##_rows)(                      \
        FA_S *restrict x, const FA_S *restrict g, FA_S *restrict s0, FA_S *restrict s1,        \
        ptrdiff_t n, const FA_FN(fa_##name##_k) *k, const int FLAGS, const int ZERO_G)         \
    {                                                                                          \
        const int two = fa_##name##_nslots(FLAGS) > 1;                                         \
        _Pragma("omp simd")                                                                    \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            const FA_S gi = ZERO_G ? (FA_S)0 : (FA_S)0 + g[i];                                 \
            FA_S xi = x[i], a = s0[i], b = 0, unused = 0;                                      \
            if (two) b = s1[i];                                                                \
            FA_FN(fa_##name##_math)(k, FLAGS, gi, &xi, &a, &b, &unused);                       \
            if (two) s1[i] = b;                                                                \
            s0[i] = a;                                                                         \
            x[i] = xi;                                                                         \
        }                                                                                      \
    }
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER

/* The update of optimizer KIND (a compile-time constant at every call site). */
static inline __attribute__((always_inline)) void FA_FN(row_update)(
    FA_S *restrict x, const FA_S *restrict g, FA_S *restrict s0, FA_S *restrict s1, ptrdiff_t n,
    const FA_FN(fa_prepared) *p, const int KIND, const int FLAGS, const int ZERO_G)
{
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (KIND == FA_OPT_##K) FA_FN(name##_rows)(x, g, s0, s1, n, &p->name, FLAGS, ZERO_G);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
}

/* slot = rate * slot, `times` times (each rounded, as dense mode's idle steps), or once by
 * rate^times when times > FA_CATCHUP_EXACT.  A rate of exactly 1 needs no work. */
static inline void FA_FN(decay_slot)(FA_S *restrict slot, ptrdiff_t n, double rate, int64_t times)
{
    if (slot == NULL || rate == 1.0 || times <= 0) return;
    if (times > FA_CATCHUP_EXACT) {
        const FA_S d = (FA_S)pow(rate, (double)times);
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) slot[i] = slot[i] * d;
        return;
    }
    const FA_S r = (FA_S)rate;
    for (int64_t q = 0; q < times; q++) {
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) slot[i] = r * slot[i];
    }
}

/* decay_slot on both slots of a row; when both decay by exactly `times` roundings, one loop
 * walks them together (as the lazy walk did before the optimizers shared it: half the passes
 * over the row), each element still rounded once per idle step, as dense mode rounds it. */
static inline void FA_FN(decay_slots)(FA_S *restrict a0, FA_S *restrict a1, ptrdiff_t n,
                                      double r0, double r1, int64_t times)
{
    if (a0 == NULL || a1 == NULL || r0 == 1.0 || r1 == 1.0 || times <= 0
        || times > FA_CATCHUP_EXACT) {
        FA_FN(decay_slot)(a0, n, r0, times);
        FA_FN(decay_slot)(a1, n, r1, times);
        return;
    }
    const FA_S q0 = (FA_S)r0, q1 = (FA_S)r1;
    for (int64_t q = 0; q < times; q++) {
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) {
            a0[i] = q0 * a0[i];
            a1[i] = q1 * a1[i];
        }
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
static void FA_FN(segment_sum)(const FA_S *restrict values, ptrdiff_t row_size,
                               const int64_t *restrict perm, const int64_t *restrict offsets,
                               ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict out)
{
    for (ptrdiff_t s = s0; s < s1; s++)
        FA_FN(sum_segment)(out + s * row_size, values, row_size, perm, offsets[s], offsets[s + 1],
                           offsets[s1]);
}
FA_CLONES(FA_FN(segment_sum));

void FA_FN(fa_segment_sum)(const FA_S *restrict values, ptrdiff_t row_size,
                           const int64_t *restrict perm, const int64_t *restrict offsets,
                           ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict out)
{
    FA_AT_LEVEL(FA_FN(segment_sum))(values, row_size, perm, offsets, s0, s1, out);
}

FA_DISPATCH
static void FA_FN(segment_sum_ordered)(const FA_S *restrict values, ptrdiff_t row_size,
                                       const int64_t *restrict seg_of, ptrdiff_t k, ptrdiff_t s0,
                                       ptrdiff_t s1, FA_S *restrict out)
{
    const ptrdiff_t row_bytes = row_size * (ptrdiff_t)sizeof(FA_S);
    if (s1 <= s0) return;
    memset(out + s0 * row_size, 0, (size_t)((s1 - s0) * row_bytes));
    for (ptrdiff_t j = 0; j < k; j++) {
        if (j + FA_PREFETCH_VALUES < k) {
            const int64_t ahead = seg_of[j + FA_PREFETCH_VALUES];
            if (ahead >= s0 && ahead < s1) fa_prefetch_write(out + ahead * row_size, row_bytes);
        }
        const int64_t s = seg_of[j];
        if (s < s0 || s >= s1) continue;
        FA_S *restrict dst = out + s * row_size;
        const FA_S *restrict src = values + j * row_size;
#pragma omp simd
        for (ptrdiff_t i = 0; i < row_size; i++) dst[i] = dst[i] + src[i];
    }
}
FA_CLONES(FA_FN(segment_sum_ordered));

void FA_FN(fa_segment_sum_ordered)(const FA_S *restrict values, ptrdiff_t row_size,
                                   const int64_t *restrict seg_of, ptrdiff_t k, ptrdiff_t s0,
                                   ptrdiff_t s1, FA_S *restrict out)
{
    FA_AT_LEVEL(FA_FN(segment_sum_ordered))(values, row_size, seg_of, k, s0, s1, out);
}

/* Lazy and catchup share one loop over segments; KIND, FLAGS and ROW are constants here,
 * CATCHUP is not (a test per segment, outside the loops over a row).  ROW > 0 is the row
 * length known at compile time (short rows: the loops over a row become a few whole vectors instead of a scalar remainder of the dispatch width's loop); 0
 * means row_size. */
static inline __attribute__((always_inline)) void FA_FN(lazy_loop)(
    const void *coeffs, FA_S *restrict x, FA_S *restrict st0, FA_S *restrict st1,
    ptrdiff_t row_size, const ptrdiff_t *stride, const FA_S *restrict values,
    const int64_t *restrict perm, const int64_t *restrict offsets, const int64_t *restrict rows,
    ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict gbuf, int64_t *restrict last_step, int64_t t,
    const int KIND, const int FLAGS, const int CATCHUP, const ptrdiff_t ROW)
{
    if (ROW) row_size = ROW;
    const ptrdiff_t row_bytes = row_size * (ptrdiff_t)sizeof(FA_S);
    const FA_FN(fa_prepared) p = FA_FN(prepare)(KIND, coeffs);
    double r0 = 1.0, r1 = 1.0;
    if (CATCHUP) fa_idle_rates(KIND, coeffs, &r0, &r1);
    const ptrdiff_t xs = stride[0], s0s = stride[1], s1s = stride[2];
    for (ptrdiff_t s = s0; s < s1; s++) {
        const ptrdiff_t r = (ptrdiff_t)rows[s];
        if (s + FA_PREFETCH_ROWS < s1) { /* the table rows are random too */
            const ptrdiff_t ahead = (ptrdiff_t)rows[s + FA_PREFETCH_ROWS];
            fa_prefetch_write(x + ahead * xs, row_bytes);
            fa_prefetch_write(st0 + ahead * s0s, row_bytes);
            if (st1) fa_prefetch_write(st1 + ahead * s1s, row_bytes);
        }
        FA_S *restrict a0 = st0 + r * s0s;
        FA_S *restrict a1 = st1 ? st1 + r * s1s : NULL;
        if (CATCHUP) {
            const int64_t idle = t - 1 - last_step[r];
            FA_FN(decay_slots)(a0, a1, row_size, r0, r1, idle);
            last_step[r] = t;
        }
        const int64_t j0 = offsets[s], j1 = offsets[s + 1];
        const FA_S *g = gbuf;
        if (j1 - j0 == 1) { /* one row: used in place (row_update adds it to +0), no copy */
            if (j0 + FA_PREFETCH_VALUES < offsets[s1])
                fa_prefetch_read(values + perm[j0 + FA_PREFETCH_VALUES] * row_size, row_bytes);
            g = values + perm[j0] * row_size;
        } else {
            FA_FN(sum_segment)(gbuf, values, row_size, perm, j0, j1, offsets[s1]);
        }
        FA_FN(row_update)(x + r * xs, g, a0, a1, row_size, &p, KIND, FLAGS, 0);
    }
}

static inline __attribute__((always_inline)) void FA_FN(dense_loop)(
    const void *coeffs, FA_S *restrict x, FA_S *restrict st0, FA_S *restrict st1,
    ptrdiff_t row_size, const ptrdiff_t *stride, const FA_S *restrict values,
    const int64_t *restrict perm, const int64_t *restrict offsets, const int64_t *restrict rows,
    ptrdiff_t nseg, ptrdiff_t r0, ptrdiff_t r1, FA_S *restrict gbuf, const int KIND,
    const int FLAGS)
{
    const FA_FN(fa_prepared) p = FA_FN(prepare)(KIND, coeffs);
    /* First segment whose row is >= r0 (binary search over the sorted rows). */
    ptrdiff_t lo = 0, hi = nseg;
    while (lo < hi) {
        const ptrdiff_t mid = lo + (hi - lo) / 2;
        if (rows[mid] < r0) lo = mid + 1;
        else hi = mid;
    }
    const ptrdiff_t xs = stride[0], s0s = stride[1], s1s = stride[2];
    /* Packed tables: a run of untouched rows is one contiguous loop; strided rows go one by one */
    const int packed = xs == row_size && s0s == row_size && (st1 == NULL || s1s == row_size);
    ptrdiff_t s = lo, r = r0;
    while (r < r1) {
        const ptrdiff_t next = (s < nseg && rows[s] < r1) ? (ptrdiff_t)rows[s] : r1;
        if (next > r && packed) { /* the untouched rows [r, next): g = +0 */
            FA_FN(row_update)(x + r * xs, NULL, st0 + r * s0s, st1 ? st1 + r * s1s : NULL,
                              (next - r) * row_size, &p, KIND, FLAGS, 1);
            r = next;
        }
        for (; r < next; r++)
            FA_FN(row_update)(x + r * xs, NULL, st0 + r * s0s, st1 ? st1 + r * s1s : NULL,
                              row_size, &p, KIND, FLAGS, 1);
        if (r < r1) { /* the touched row r == rows[s] */
            FA_FN(sum_segment)(gbuf, values, row_size, perm, offsets[s], offsets[s + 1],
                               offsets[nseg]);
            FA_FN(row_update)(x + r * xs, gbuf, st0 + r * s0s, st1 ? st1 + r * s1s : NULL,
                              row_size, &p, KIND, FLAGS, 0);
            r++;
            s++;
        }
    }
}

/* The row-wise optimizers' walks (one accumulator per row): rowwise_body.h. */
#define FA_ROWWISE_SPARSE 1
#include "fastadam/rowwise_body.h"
#undef FA_ROWWISE_SPARSE

/* Every (kind, flags) pair of the sparse path is its own instantiation of LOOP(KIND, FLAGS):
 * for each optimizer of optimizers.def, the combinations of its SPARSE_MASK that need at most
 * two state slots.  Anything else -- an unknown kind, a flag outside the mask, three slots --
 * leaves `status` at FA_ERR_UNSUPPORTED, decided before any write.
 * The instantiations of one optimizer make one dispatched function (its flag and row-length
 * cases), not one for every optimizer: gcc's time on a function grows faster than
 * its size, and the per-optimizer functions compile in about half the time of their union
 * (the same loops; one more indirect call per call, not per row). */
#define FA_SPARSE_CASE(F, K)                                                                   \
    if (fa_sparse_nslots(K, F) <= 2) {                                                         \
        FA_LOOP(K, F);                                                                         \
        status = FA_OK;                                                                        \
    }
#define FA_ROWS(K, F, LAST, T, CU, ROW)                                                        \
    FA_FN(lazy_loop)(coeffs, x, st0, st1, row_size, stride, values, perm, offsets, rows, s0, s1, \
                     gbuf, LAST, T, K, F, CU, ROW)
#define FA_BY_ROW(K, F, LAST, T, CU)                                                           \
    switch (row_size) {                                                                        \
    case 1: FA_ROWS(K, F, LAST, T, CU, 1); break;                                              \
    case 2: FA_ROWS(K, F, LAST, T, CU, 2); break;                                              \
    case 4: FA_ROWS(K, F, LAST, T, CU, 4); break;                                              \
    case 8: FA_ROWS(K, F, LAST, T, CU, 8); break;                                              \
    default: FA_ROWS(K, F, LAST, T, CU, 0); break;                                             \
    }
/* Catch-up or not is a run-time value (last_step != NULL): it decides once per segment whether
 * the row's slots decay, and the loops over a row are the same in both modes, so one
 * instantiation serves both (half the row walks to compile; lazy mode pays one predicted
 * branch per segment). */
#define FA_LOOP(K, F) FA_BY_ROW(K, F, last_step, t, last_step != NULL)
#define FA_ROWS_ARGS                                                                           \
    const void *coeffs, FA_S *restrict x, FA_S *restrict st0, FA_S *restrict st1,              \
        ptrdiff_t row_size, const ptrdiff_t *stride, const FA_S *restrict values,              \
        const int64_t *restrict perm, const int64_t *restrict offsets,                         \
        const int64_t *restrict rows, ptrdiff_t s0, ptrdiff_t s1, FA_S *restrict gbuf,         \
        int64_t *restrict last_step, int64_t t
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    FA_DISPATCH                                                                                \
    static int FA_FN(name##_sparse_rows)(const int flags, FA_ROWS_ARGS)                        \
    {                                                                                          \
        int status = FA_ERR_UNSUPPORTED;                                                       \
        FA_FLAG_SWITCH(flags, SPARSE_MASK, FA_SPARSE_CASE, FA_OPT_##K)                         \
        return status;                                                                         \
    }                                                                                          \
    FA_CLONES(FA_FN(name##_sparse_rows));
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
#undef FA_LOOP
#undef FA_BY_ROW
#undef FA_ROWS

static int FA_FN(sparse_rows)(int kind, FA_ROWS_ARGS)
{
    const int flags = fa_coeffs_flags(kind, coeffs);
    if (flags & ~15) return FA_ERR_UNSUPPORTED;
    switch (kind) {
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    case FA_OPT_##K:                                                                           \
        return FA_AT_LEVEL(FA_FN(name##_sparse_rows))(flags, coeffs, x, st0, st1, row_size,    \
                                                      stride, values, perm, offsets, rows, s0, \
                                                      s1, gbuf, last_step, t);
#define FA_ROWWISE_OPTIMIZER FA_OPTIMIZER
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
    default: return FA_ERR_UNSUPPORTED; /* an unknown kind */
    }
}
#undef FA_ROWS_ARGS

int FA_FN(fa_sparse_rows)(int kind, const void *coeffs, FA_S *restrict x, FA_S *restrict st0,
                          FA_S *restrict st1, ptrdiff_t row_size, const ptrdiff_t *stride,
                          const FA_S *restrict values,
                          const int64_t *restrict perm, const int64_t *restrict offsets,
                          const int64_t *restrict rows, ptrdiff_t s0, ptrdiff_t s1,
                          FA_S *restrict gbuf, int64_t *restrict last_step, int64_t t)
{
    return FA_FN(sparse_rows)(kind, coeffs, x, st0, st1, row_size, stride, values, perm, offsets,
                              rows, s0, s1, gbuf, last_step, t);
}

/* Dense mode: one function per optimizer too. */
#define FA_LOOP(K, F)                                                                          \
    FA_FN(dense_loop)(coeffs, x, st0, st1, row_size, stride, values, perm, offsets, rows, nseg, \
                      r0, r1, gbuf, K, F)
#define FA_DENSE_ARGS                                                                          \
    const void *coeffs, FA_S *restrict x, FA_S *restrict st0, FA_S *restrict st1,              \
        ptrdiff_t row_size, const ptrdiff_t *stride, const FA_S *restrict values,              \
        const int64_t *restrict perm, const int64_t *restrict offsets,                         \
        const int64_t *restrict rows, ptrdiff_t nseg, ptrdiff_t r0, ptrdiff_t r1,              \
        FA_S *restrict gbuf
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    FA_DISPATCH                                                                                \
    static int FA_FN(name##_sparse_dense)(const int flags, FA_DENSE_ARGS)                      \
    {                                                                                          \
        int status = FA_ERR_UNSUPPORTED;                                                       \
        FA_FLAG_SWITCH(flags, SPARSE_MASK, FA_SPARSE_CASE, FA_OPT_##K)                         \
        return status;                                                                         \
    }                                                                                          \
    FA_CLONES(FA_FN(name##_sparse_dense));
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
#undef FA_LOOP

static int FA_FN(sparse_dense)(int kind, FA_DENSE_ARGS)
{
    const int flags = fa_coeffs_flags(kind, coeffs);
    if (flags & ~15) return FA_ERR_UNSUPPORTED;
    switch (kind) {
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    case FA_OPT_##K:                                                                           \
        return FA_AT_LEVEL(FA_FN(name##_sparse_dense))(flags, coeffs, x, st0, st1, row_size,   \
                                                       stride, values, perm, offsets, rows,    \
                                                       nseg, r0, r1, gbuf);
#define FA_ROWWISE_OPTIMIZER FA_OPTIMIZER
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
    default: return FA_ERR_UNSUPPORTED; /* an unknown kind */
    }
}
#undef FA_DENSE_ARGS

int FA_FN(fa_sparse_dense)(int kind, const void *coeffs, FA_S *restrict x, FA_S *restrict st0,
                           FA_S *restrict st1, ptrdiff_t row_size, const ptrdiff_t *stride,
                           const FA_S *restrict values,
                           const int64_t *restrict perm, const int64_t *restrict offsets,
                           const int64_t *restrict rows, ptrdiff_t nseg, ptrdiff_t r0,
                           ptrdiff_t r1, FA_S *restrict gbuf)
{
    return FA_FN(sparse_dense)(kind, coeffs, x, st0, st1, row_size, stride, values, perm, offsets,
                               rows, nseg, r0, r1, gbuf);
}

#undef FA_OPTIMIZER
#undef FA_SPARSE_CASE
