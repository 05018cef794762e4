/* fastadam/sparse.c -- sparse kernels; the contracts are in sparse.h, the formulas in the headers
 * optimizers.def lists.
 *
 * The index sort is integer-only and shared by both dtypes.  The float kernels are written once,
 * in sparse_body.h, and included here for float32 (_f32) and float64 (_f64).  Every exported
 * float kernel is a static FA_DISPATCH function (AVX-512 / AVX2 / baseline clones that round
 * identically: the build disables FMA contraction) behind its exported fa_ name, which calls the
 * clone of the level in use (common.h).
 */
#include <math.h>
#include <string.h>

#include "fastadam/sparse.h"
#include "fastadam/formulas.h"

/* ---- stable LSD radix sort of packed (index << 32 | position) keys -------------------- */

void fa_pack_keys_i32(const int32_t *restrict indices, ptrdiff_t k, uint64_t *restrict a)
{
    for (ptrdiff_t j = 0; j < k; j++) a[j] = ((uint64_t)(uint32_t)indices[j] << 32) | (uint64_t)j;
}

void fa_pack_keys_i64(const int64_t *restrict indices, ptrdiff_t k, uint64_t *restrict a)
{
    for (ptrdiff_t j = 0; j < k; j++) a[j] = ((uint64_t)indices[j] << 32) | (uint64_t)j;
}

ptrdiff_t fa_sort_segments(uint64_t *restrict a, uint64_t *restrict b, ptrdiff_t k, int key_bits,
                           ptrdiff_t *restrict hist, int64_t *restrict perm,
                           int64_t *restrict rows, int64_t *restrict offsets)
{
    const int passes = key_bits <= 0 ? 0 : (key_bits + FA_RADIX_BITS - 1) / FA_RADIX_BITS;
    const int digit = passes ? (key_bits + passes - 1) / passes : 0;
    const ptrdiff_t nb = (ptrdiff_t)1 << digit;
    const uint64_t mask = (uint64_t)nb - 1;
    memset(hist, 0, (size_t)passes * (size_t)nb * sizeof *hist);
    /* One pass builds every digit's histogram. */
    for (ptrdiff_t j = 0; j < k; j++) {
        const uint64_t key = a[j] >> 32;
        for (int p = 0; p < passes; p++) hist[p * nb + (ptrdiff_t)((key >> (p * digit)) & mask)]++;
    }
    uint64_t *src = a, *dst = b;
    for (int p = 0; p < passes; p++) {
        ptrdiff_t *restrict h = hist + p * nb;
        int trivial = 0; /* every key has the same digit: the pass would be the identity */
        for (ptrdiff_t d = 0; d < nb; d++) {
            if (h[d] == k) trivial = 1;
        }
        if (trivial) continue;
        ptrdiff_t sum = 0;
        for (ptrdiff_t d = 0; d < nb; d++) {
            const ptrdiff_t cnt = h[d];
            h[d] = sum;
            sum += cnt;
        }
        const int shift = 32 + p * digit;
        for (ptrdiff_t j = 0; j < k; j++) {
            const uint64_t e = src[j];
            dst[h[(e >> shift) & mask]++] = e;
        }
        uint64_t *tmp = src;
        src = dst;
        dst = tmp;
    }
    ptrdiff_t nseg = 0;
    uint64_t prev = 0;
    for (ptrdiff_t j = 0; j < k; j++) {
        const uint64_t e = src[j], key = e >> 32;
        perm[j] = (int64_t)(e & 0xffffffffu);
        if (j == 0 || key != prev) {
            rows[nseg] = (int64_t)key;
            offsets[nseg] = j;
            nseg++;
            prev = key;
        }
    }
    offsets[nseg] = k;
    return nseg;
}

void fa_segment_of(const int64_t *restrict perm, const int64_t *restrict offsets, ptrdiff_t nseg,
                   int64_t *restrict seg_of)
{
    for (ptrdiff_t s = 0; s < nseg; s++) {
        for (int64_t j = offsets[s]; j < offsets[s + 1]; j++) seg_of[perm[j]] = s;
    }
}

/* ---- float kernels, one body per dtype ------------------------------------------------- */

/* Software prefetch of one randomly placed row (its first FA_PREFETCH_MAX_BYTES; the hardware
 * prefetcher follows longer rows).  Gathering rows in random order is latency-bound without it.
 * always_inline, not plain inline: fa_sparse_rows instantiates the row walk for every
 * (optimizer, flags, mode, short row) and is past gcc's inlining budget, and a non-inlined
 * prefetch helper has no side effect gcc must keep, so the calls were deleted.  Without the
 * prefetch between them gcc also unroll-and-jams the gradient row loop with the accumulation
 * inside it, and the jammed accumulation is scalar (vaddss per element: issue 21, 2.5x on the
 * lazy step). */
#define FA_PREFETCH_VALUES 16
#define FA_PREFETCH_ROWS 8
#define FA_PREFETCH_MAX_BYTES 512

static inline __attribute__((always_inline)) void fa_prefetch_read(const void *p, ptrdiff_t bytes)
{
    const char *c = (const char *)p;
    if (bytes > FA_PREFETCH_MAX_BYTES) bytes = FA_PREFETCH_MAX_BYTES;
    for (ptrdiff_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

static inline __attribute__((always_inline)) void fa_prefetch_write(const void *p, ptrdiff_t bytes)
{
    const char *c = (const char *)p;
    if (bytes > FA_PREFETCH_MAX_BYTES) bytes = FA_PREFETCH_MAX_BYTES;
    for (ptrdiff_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 1, 3);
}

/* The facts the row walk needs of an optimizer besides its element formula: its flags, the
 * decay rates of its first two slots over an idle step, and how many slots given flags use.
 * An unknown kind has flags -1 (every sparse entry point then returns FA_ERR_UNSUPPORTED). */
static inline int fa_coeffs_flags(int kind, const void *coeffs)
{
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K) return ((const fa_##name##_coeffs *)coeffs)->flags;
#define FA_ROWWISE_OPTIMIZER FA_OPTIMIZER
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
    return -1;
}

static inline void fa_idle_rates(int kind, const void *coeffs, double *r0, double *r1)
{
    *r0 = 1.0;
    *r1 = 1.0;
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K) fa_##name##_idle_rates((const fa_##name##_coeffs *)coeffs, r0, r1);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
}

static inline __attribute__((always_inline)) int fa_sparse_nslots(const int kind, const int flags)
{
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K) return fa_##name##_nslots(flags);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
    return FA_MAX_SLOTS + 1;
}

FA_DISPATCH_LEVEL_STATE

#define FA_S float
#define FA_FN(name) FA_CAT(name, _f32)
#include "fastadam/sparse_body.h"
#undef FA_S
#undef FA_FN

#define FA_S double
#define FA_FN(name) FA_CAT(name, _f64)
#include "fastadam/sparse_body.h"
#undef FA_S
#undef FA_FN
