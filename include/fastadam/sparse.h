/* fastadam/sparse.h -- sparse optimizer steps: a stable O(n) index sort, a deterministic segment
 * sum, and the lazy / dense / catchup row walks that apply any optimizer's row update.
 *
 * Design: a sparse gradient is k rows `values[j]` (row_size elements each) aimed at rows
 * `indices[j]` of a table x of n_rows rows.  The Python layer
 * (fastadam/optim/_sparse_functional.py) checks every input; the Cython layer
 * (fastadam/_core/_sparse.pyx) then
 *   1. sorts the indices with fa_sort_segments (LSD radix sort, stable), giving
 *      perm[k]      the original positions in sorted order (equal indices keep their order),
 *      rows[nseg]   the distinct indices, increasing,
 *      offsets[nseg + 1]  segment s is perm[offsets[s] .. offsets[s + 1]);
 *   2. hands contiguous ranges of segments (lazy, catchup, segment sum) or of table rows (dense)
 *      to the threads of one OpenMP parallel region.
 * Each segment is always summed by one thread, starting from +0 and adding its rows in their
 * original order, so sums (and hence every update) are bit-identical for any thread count and
 * equal to np.add.at on a zeroed buffer.  The sum of a segment never leaves a per-thread scratch
 * row `gbuf` (row_size elements, in L1) before the row update uses it.  Lazy and catchup steps
 * are bound by the latency of randomly placed rows (gradient rows in sorted order, table rows):
 * the kernels prefetch both a few positions ahead (sparse.c, FA_PREFETCH_*).
 *
 * The row update is the optimizer's own element formula (the headers optimizers.def lists: the
 * same function the dense kernels call, so dense mode equals the dense step on the densified
 * gradient bit for bit; untouched rows in dense mode use g = +0).  This file knows nothing
 * else about the optimizers: the kernels take the optimizer's kind (FA_OPT_*) and its
 * coefficient struct, and the catch-up of idle steps uses only the rates at which the
 * optimizer's state slots decay over one idle step (fa_<optimizer>_idle_rates).
 * Supported flags: each optimizer's SPARSE_MASK in optimizers.def, with at most two state slots.
 * State slots: s0, s1 as in dense.h (Adam: m, v; Adagrad: h; Momentum: v; RMSprop: v and b or
 * a; Lion: m; unused: NULL).  A row-wise optimizer (a FA_ROWWISE_OPTIMIZER row: row-wise Adagrad)
 * takes the same entry points with one value per row in st0 (the accumulator of row r at
 * st0 + r * stride[1]: stride[1] = 1 for a packed vector) and st1 unused; its walks are
 * rowwise_body.h's.
 */
#ifndef FASTADAM_SPARSE_H
#define FASTADAM_SPARSE_H

#include "fastadam/common.h"
#include "fastadam/optimizers.def" /* the optimizers' headers: their coefficient structs */

/* Longest idle gap that catchup mode replays one decay at a time (see fa_sparse_rows). */
#define FA_CATCHUP_EXACT 64

/* Radix digit width: 2^11 counters (16 KiB) stay in L1; 32-bit keys need at most 3 passes. */
#define FA_RADIX_BITS 11
#define FA_RADIX_MAX_PASSES 3

/* fa_pack_keys_<itype>: a[j] = (indices[j] << 32) | j, the sort's input.
 *   indices IN  k   row indices, each in [0, 2^32)
 *   a       OUT k
 * Preconditions: 0 <= k < 2^32, indices checked non-negative and < 2^32.  O(k), thread safe. */
void fa_pack_keys_i32(const int32_t *indices, ptrdiff_t k, uint64_t *a);
void fa_pack_keys_i64(const int64_t *indices, ptrdiff_t k, uint64_t *a);

/* fa_sort_segments: stable LSD radix sort of packed keys, then the segment tables.
 *   a        IN/OUT k  packed keys from fa_pack_keys (clobbered)
 *   b        OUT    k  scratch
 *   key_bits IN        bits of the largest key (0..32): ceil(key_bits / 11) passes
 *   hist     OUT       scratch, FA_RADIX_MAX_PASSES << FA_RADIX_BITS counters
 *   perm     OUT    k  original positions in sorted order (stable)
 *   rows     OUT  <=k  distinct keys, increasing
 *   offsets  OUT <=k+1 segment s is perm[offsets[s] .. offsets[s+1]); offsets[nseg] = k
 * Returns nseg, the number of distinct keys.  Passes whose digit is equal for all keys are
 * skipped.  O(k * passes + passes * 2^11) time, serial; thread safe on distinct buffers. */
ptrdiff_t fa_sort_segments(uint64_t *a, uint64_t *b, ptrdiff_t k, int key_bits, ptrdiff_t *hist,
                           int64_t *perm, int64_t *rows, int64_t *offsets);

/* fa_segment_sum_<dtype>: out[s] = sum of values[perm[j]] for j in segment s, s in [s0, s1).
 *   values   IN   k x row_size   gradient rows (never written)
 *   perm, offsets IN             from fa_sort_segments
 *   out      OUT  nseg x row_size   only rows [s0, s1) are written
 * Each sum starts at +0 and adds in increasing j (= original order): equal to np.add.at.
 * O((offsets[s1] - offsets[s0] + s1 - s0) * row_size).  Disjoint [s0, s1) may run at once. */
void fa_segment_sum_f32(const float *values, ptrdiff_t row_size, const int64_t *perm,
                        const int64_t *offsets, ptrdiff_t s0, ptrdiff_t s1, float *out);
void fa_segment_sum_f64(const double *values, ptrdiff_t row_size, const int64_t *perm,
                        const int64_t *offsets, ptrdiff_t s0, ptrdiff_t s1, double *out);

/* fa_segment_of: seg_of[perm[j]] = s for every j in segment s (the segment of each original
 * position), s in [0, nseg).
 *   perm, offsets IN   from fa_sort_segments (k = offsets[nseg])
 *   seg_of        OUT  k
 * O(k), serial; thread safe on distinct buffers. */
void fa_segment_of(const int64_t *perm, const int64_t *offsets, ptrdiff_t nseg, int64_t *seg_of);

/* fa_segment_sum_ordered_<dtype>: fa_segment_sum's result, found by reading the gradient rows in
 * their original order: rows [s0, s1) of out are zeroed, then out[seg_of[j]] += values[j] for
 * j = 0, 1, ..., k - 1 whose segment is in [s0, s1).  Each sum thus starts at +0 and adds its
 * rows in increasing j, bit for bit fa_segment_sum; the gradient rows stream in order (the
 * hardware prefetcher follows them) and only the sums, fewer than the rows when indices repeat,
 * are visited in random order (prefetched FA_PREFETCH_VALUES positions ahead).
 *   values   IN   k x row_size
 *   seg_of   IN   k               from fa_segment_of
 *   out      OUT  nseg x row_size only rows [s0, s1) are written
 * O(k + (number of rows in [s0, s1) + s1 - s0) * row_size): each caller reads all of seg_of.
 * Disjoint [s0, s1) may run at once. */
void fa_segment_sum_ordered_f32(const float *values, ptrdiff_t row_size, const int64_t *seg_of,
                                ptrdiff_t k, ptrdiff_t s0, ptrdiff_t s1, float *out);
void fa_segment_sum_ordered_f64(const double *values, ptrdiff_t row_size, const int64_t *seg_of,
                                ptrdiff_t k, ptrdiff_t s0, ptrdiff_t s1, double *out);

/* fa_sparse_rows_<dtype>: the optimizer's step on the touched rows rows[s], s in [s0, s1), only
 * (lazy mode), or, when last_step is not NULL, catchup mode: row r first catches up the idle
 * decays of the k = t - 1 - last_step[r] steps it missed, then last_step[r] = t.  For
 * k <= FA_CATCHUP_EXACT that is k multiplications of each state slot by its idle rate, each
 * rounded as dense mode's idle step rounds it (so the slots are bit-identical to dense mode's,
 * up to the sign of a zero, without weight decay); beyond, one multiplication by rate^k (taken in
 * float64, rounded to the dtype), which bounds the cost per row and agrees with dense mode to a
 * few ulps.
 *   kind, coeffs  IN                    the optimizer (FA_OPT_*) and its coefficient struct
 *   x, st0, st1   IN/OUT n_rows rows of row_size contiguous elements; only rows rows[s0..s1) are
 *                        read or written
 *   stride        IN     3  row strides (in elements, each >= row_size) of x, st0, st1: row r
 *                        of x starts at x + r * stride[0].  Packed tables have stride row_size;
 *                        a larger one reads a block of a wider table (several states
 *                        interleaved in one buffer, so a touched row is one or two cache lines)
 *   values, perm, offsets, rows  IN     gradient and segment tables (rows unique, sorted)
 *   gbuf          OUT    row_size       scratch, private to the calling thread
 *   last_step     IN/OUT n_rows         catchup only (else NULL); entries rows[s0..s1)
 *   t             IN                    this step's number (catchup only)
 * Returns FA_OK, or FA_ERR_UNSUPPORTED (nothing written) when the (kind, flags) pair is not one
 * the registration list (optimizers.def) gives the sparse walk.
 * Preconditions: the elements of x, the slots, values, gbuf do not overlap (interleaved rows
 * of one buffer are fine); rows[s] < n_rows; in catchup mode
 * 0 <= last_step[rows[s]] < t (checked by the caller).
 * O((offsets[s1] - offsets[s0] + s1 - s0) * row_size).  Disjoint [s0, s1) may run at once. */
int fa_sparse_rows_f32(int kind, const void *coeffs, float *x, float *st0, float *st1,
                        ptrdiff_t row_size, const ptrdiff_t *stride, const float *values,
                        const int64_t *perm, const int64_t *offsets, const int64_t *rows,
                        ptrdiff_t s0, ptrdiff_t s1, float *gbuf, int64_t *last_step, int64_t t);
int fa_sparse_rows_f64(int kind, const void *coeffs, double *x, double *st0, double *st1,
                        ptrdiff_t row_size, const ptrdiff_t *stride, const double *values,
                        const int64_t *perm, const int64_t *offsets, const int64_t *rows,
                        ptrdiff_t s0, ptrdiff_t s1, double *gbuf, int64_t *last_step, int64_t t);

/* fa_sparse_dense_<dtype>: dense-decay mode (TensorFlow 1's sparse Adam) on table rows
 * [r0, r1): every row is updated, with g = its segment sum when touched and +0 otherwise.
 * Runs of untouched rows are one contiguous loop that never reads a gradient (row by row when
 * a table is strided).
 *   arguments as fa_sparse_rows, plus nseg (segments in the tables), r0, r1 (table rows);
 *   returns as fa_sparse_rows
 * O((r1 - r0) * row_size + log(nseg) + the touched rows' gradient rows).  Disjoint [r0, r1)
 * may run at once. */
int fa_sparse_dense_f32(int kind, const void *coeffs, float *x, float *st0, float *st1,
                         ptrdiff_t row_size, const ptrdiff_t *stride, const float *values,
                         const int64_t *perm, const int64_t *offsets, const int64_t *rows,
                         ptrdiff_t nseg, ptrdiff_t r0, ptrdiff_t r1, float *gbuf);
int fa_sparse_dense_f64(int kind, const void *coeffs, double *x, double *st0, double *st1,
                         ptrdiff_t row_size, const ptrdiff_t *stride, const double *values,
                         const int64_t *perm, const int64_t *offsets, const int64_t *rows,
                         ptrdiff_t nseg, ptrdiff_t r0, ptrdiff_t r1, double *gbuf);

#endif /* FASTADAM_SPARSE_H */
