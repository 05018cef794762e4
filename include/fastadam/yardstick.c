/* fastadam/yardstick.c -- the memory-bandwidth yardstick of the benchmarks (never used by the
 * optimizers: it lives in the bench extension, fastadam/bench/_yardstick.pyx).
 *
 * fa_stream_rw_f32 reads a, d, b, c and writes a, b, c: 28 bytes per float32 element, the
 * traffic of a float32 Adam step, with no arithmetic worth counting.  Compiled with the same
 * runtime dispatch as the kernels, so both use the same vector width.
 *   a, b, c  IN/OUT n;  d  IN n.  Preconditions: no overlap.  O(n), thread safe on disjoint ranges.
 * fa_stream_rw2_f32 reads a, d, b and writes a, b: 20 bytes per element, the traffic of a
 * float32 Adagrad or momentum step (one state slot).
 * fa_stream_rw_bits: the traffic of a low-precision step (issue 24), any widths: x (xw = 4 or 2
 * bytes) read and written, g (gw = 4 or 2 bytes) read, two state arrays a, b (sw = 4, 2 or 1
 * bytes) read and written.  The arrays are treated as unsigned bit containers and g's bits are
 * added (truncated) to the others: one integer add per stored element, no float arithmetic, so
 * the loop is as close to a pure byte stream as the float32 one.  The block scales of 8-bit
 * states (one float32 per block and slot, read and written) are streamed by the caller.
 *   x, a, b  IN/OUT n;  g  IN n.  Preconditions: no overlap; the widths are among those listed
 *   (returns -1 and touches nothing otherwise, 0 on success).
 * All are static FA_DISPATCH functions behind their exported fa_ names, which call the clone of
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

/* One clone set per (x width, g width, state width): the loop of fa_stream_rw_bits. */
#define FA_STREAM_BITS(NAME, XT, GT, ST)                                                         \
    FA_DISPATCH                                                                                  \
    static void NAME(XT *restrict x, const GT *restrict g, ST *restrict a, ST *restrict b,      \
                     ptrdiff_t n)                                                                \
    {                                                                                            \
        _Pragma("omp simd")                                                                      \
        for (ptrdiff_t i = 0; i < n; i++) {                                                      \
            const GT gi = g[i];                                                                  \
            x[i] = (XT)(x[i] + gi);                                                              \
            a[i] = (ST)(a[i] + gi);                                                              \
            b[i] = (ST)(b[i] + gi);                                                              \
        }                                                                                        \
    }                                                                                            \
    FA_CLONES(NAME)

FA_STREAM_BITS(stream_x4_g4_s4, uint32_t, uint32_t, uint32_t);
FA_STREAM_BITS(stream_x4_g4_s2, uint32_t, uint32_t, uint16_t);
FA_STREAM_BITS(stream_x4_g4_s1, uint32_t, uint32_t, uint8_t);
FA_STREAM_BITS(stream_x2_g2_s4, uint16_t, uint16_t, uint32_t);
FA_STREAM_BITS(stream_x2_g2_s2, uint16_t, uint16_t, uint16_t);
FA_STREAM_BITS(stream_x2_g2_s1, uint16_t, uint16_t, uint8_t);
FA_STREAM_BITS(stream_x2_g4_s2, uint16_t, uint32_t, uint16_t);
FA_STREAM_BITS(stream_x2_g4_s1, uint16_t, uint32_t, uint8_t);

int fa_stream_rw_bits(void *x, int xw, const void *g, int gw, void *a, void *b, int sw,
                      ptrdiff_t n)
{
#define FA_STREAM_CASE(XW, GW, SW, XT, GT, ST, NAME)                                             \
    if (xw == XW && gw == GW && sw == SW) {                                                      \
        FA_AT_LEVEL(NAME)((XT *)x, (const GT *)g, (ST *)a, (ST *)b, n);                          \
        return 0;                                                                                \
    }
    FA_STREAM_CASE(4, 4, 4, uint32_t, uint32_t, uint32_t, stream_x4_g4_s4)
    FA_STREAM_CASE(4, 4, 2, uint32_t, uint32_t, uint16_t, stream_x4_g4_s2)
    FA_STREAM_CASE(4, 4, 1, uint32_t, uint32_t, uint8_t, stream_x4_g4_s1)
    FA_STREAM_CASE(2, 2, 4, uint16_t, uint16_t, uint32_t, stream_x2_g2_s4)
    FA_STREAM_CASE(2, 2, 2, uint16_t, uint16_t, uint16_t, stream_x2_g2_s2)
    FA_STREAM_CASE(2, 2, 1, uint16_t, uint16_t, uint8_t, stream_x2_g2_s1)
    FA_STREAM_CASE(2, 4, 2, uint16_t, uint32_t, uint16_t, stream_x2_g4_s2)
    FA_STREAM_CASE(2, 4, 1, uint16_t, uint32_t, uint8_t, stream_x2_g4_s1)
#undef FA_STREAM_CASE
    return -1;
}
