/* fastadam/yardstick.c -- the memory-bandwidth yardstick of the benchmarks (never used by the
 * optimizers: it lives in the bench extension, fastadam/bench/_yardstick.pyx).
 *
 * fa_stream_rw_f32 reads a, d, b, c and writes a, b, c: 28 bytes per float32 element, the
 * traffic of a float32 Adam step, with no arithmetic worth counting.  Compiled with the same
 * runtime dispatch as the kernels, so both use the same vector width.
 *   a, b, c  IN/OUT n;  d  IN n.  Preconditions: no overlap.  O(n), thread safe on disjoint ranges.
 * fa_stream_rw2_f32 reads a, d, b and writes a, b: 20 bytes per element, the traffic of a
 * float32 Adagrad or momentum step (one state slot).
 * Both are static FA_DISPATCH functions behind their exported fa_ names, which call the clone of
 * the level in use (common.h), as the kernels do.
 */
#include "fastadam/yardstick.h"

FA_DISPATCH_LEVEL_STATE

FA_DISPATCH
static void stream_rw_f32(float *restrict a, const float *restrict d, float *restrict b,
                          float *restrict c, ptrdiff_t n)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float di = d[i];
        a[i] = a[i] + di;
        b[i] = b[i] + di;
        c[i] = c[i] + di;
    }
}
FA_CLONES(stream_rw_f32);

void fa_stream_rw_f32(float *a, const float *d, float *b, float *c, ptrdiff_t n)
{
    FA_AT_LEVEL(stream_rw_f32)(a, d, b, c, n);
}

FA_DISPATCH
static void stream_rw2_f32(float *restrict a, const float *restrict d, float *restrict b,
                           ptrdiff_t n)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        const float di = d[i];
        a[i] = a[i] + di;
        b[i] = b[i] + di;
    }
}
FA_CLONES(stream_rw2_f32);

void fa_stream_rw2_f32(float *a, const float *d, float *b, ptrdiff_t n)
{
    FA_AT_LEVEL(stream_rw2_f32)(a, d, b, n);
}
