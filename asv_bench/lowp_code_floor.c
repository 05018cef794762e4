/* asv_bench/lowp_code_floor.c -- how fast can 8-bit codes be made on this CPU?  A measurement
 * for the low-precision speed goals, not part of the package.
 *
 *   gcc -O3 -std=gnu11 -fopenmp-simd -fno-math-errno -ffp-contract=off -march=x86-64-v4 \
 *       -Iinclude asv_bench/lowp_code_floor.c -o lowp_code_floor -lm && ./lowp_code_floor
 *
 * (x86-64 with AVX-512 only.)  One slot of 65536 float32 values in L2, block 256, the signed
 * dynamic map, best of 30 rounds of 50 calls, in ns per element:
 *   requantize  the block's max |y|, the scale, a code per element, the codes stored;
 *   dequantize  map[code] * scale.
 * Three ways each:
 *   shipped    include/fastadam/lowp.c's loops at x86-64-v4 (the file is included: gcc
 *              vectorizes everything but the table loads, which it does lane by lane, one
 *              scalar load per element);
 *   gather     the same work by hand with AVX-512 intrinsics (lowp.c's bins, fa_bins_code's
 *              arithmetic), the table read by VPGATHERDD;
 *   no lookup  the gather variant with the table load left out: the codes are wrong, the time is
 *              a floor for any exact method that still needs the other work.
 * The shipped and gather codes are checked against fa_lowp_code (lowp.h's search).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>

/* the package's own kernels: lowp.c's bins, fa_bins_code and the clones of its loops */
#include "fastadam/lowp.c"

#define BIN_EXP0 FA_BIN_EXP0
#define BIN_EXPS FA_BIN_EXPS

static float block_scale(const float *restrict y, ptrdiff_t len)
{
    fa_u32 big = 0;
#pragma omp simd reduction(max : big)
    for (ptrdiff_t i = 0; i < len; i++) {
        const fa_u32 a = fa_f32_bits(y[i]) & 0x7fffffffu;
        big = a > big ? a : big;
    }
    return fa_bits_f32(big);
}

static const fa_u32 *bins; /* the signed dynamic map's */

__attribute__((noinline)) static void quantize_shipped(const float *y, fa_u8 *c, float *scales,
                                                       ptrdiff_t n, int block)
{
    fa_lowp_quantize_blocks(y, n, block, FA_MAP_DYNAMIC, 1, c, scales);
}

/* LOOKUP 1: the bins by VPGATHERDD; 0: the index stands in for the entry (a floor) */
static inline __attribute__((always_inline)) void quantize_avx512(const float *restrict y,
                                                                  fa_u8 *restrict c,
                                                                  float *restrict scales,
                                                                  ptrdiff_t n, int block,
                                                                  const int LOOKUP)
{
    const __m512i e0 = _mm512_set1_epi32(BIN_EXP0), emax = _mm512_set1_epi32(BIN_EXPS - 1);
    const __m512i ff = _mm512_set1_epi32(0xff), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    const __m512i x80 = _mm512_set1_epi32(0x80), x7f = _mm512_set1_epi32(0x7f);
    for (ptrdiff_t b = 0; b * block < n; b++) {
        const float *yb = y + b * block;
        const float scale = block_scale(yb, block), inv = fa_lowp_inverse(scale);
        scales[b] = scale;
        const __m512 vinv = _mm512_set1_ps(inv);
        for (ptrdiff_t i = 0; i < block; i += 16) {
            const __m512 q = _mm512_mul_ps(_mm512_loadu_ps(yb + i), vinv);
            const __m512i u = _mm512_castps_si512(q);
            __m512i e = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 23), ff), e0);
            e = _mm512_min_epi32(_mm512_max_epi32(e, zero), emax);
            const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), x80);
            const __m512i m7 = _mm512_and_si512(_mm512_srli_epi32(u, 16), x7f);
            const __m512i idx = _mm512_or_si512(_mm512_slli_epi32(e, 8), _mm512_or_si512(sign, m7));
            const __m512i entry = LOOKUP ? _mm512_i32gather_epi32(idx, (const int *)bins, 4) : idx;
            const __m512i flip = _mm512_srai_epi32(u, 31);
            const __m512i low = _mm512_and_si512(_mm512_xor_si512(u, flip), lo16);
            __m512i code = _mm512_srli_epi32(entry, 16);
            const __mmask16 up = _mm512_cmpgt_epi32_mask(low, _mm512_and_si512(entry, lo16));
            code = _mm512_mask_add_epi32(code, up, code, one);
            code = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), code);
            _mm_storeu_si128((__m128i *)(c + b * block + i), _mm512_cvtepi32_epi8(code));
        }
    }
}

__attribute__((noinline)) static void quantize_gather(const float *y, fa_u8 *c, float *s,
                                                      ptrdiff_t n, int block)
{
    quantize_avx512(y, c, s, n, block, 1);
}

__attribute__((noinline)) static void quantize_floor(const float *y, fa_u8 *c, float *s,
                                                     ptrdiff_t n, int block)
{
    quantize_avx512(y, c, s, n, block, 0);
}

__attribute__((noinline)) static void dequantize_shipped(const fa_u8 *c, const float *scales,
                                                         const float *map, float *out,
                                                         ptrdiff_t n, int block)
{
    (void)map;
    fa_lowp_dequantize_blocks(c, scales, n, block, FA_MAP_DYNAMIC, 1, out);
}

static inline __attribute__((always_inline)) void dequantize_avx512(
    const fa_u8 *restrict c, const float *restrict scales, const float *restrict map,
    float *restrict out, ptrdiff_t n, int block, const int LOOKUP)
{
    for (ptrdiff_t b = 0; b * block < n; b++) {
        const __m512 vs = _mm512_set1_ps(scales[b]);
        for (ptrdiff_t i = 0; i < block; i += 16) {
            const __m128i c16 = _mm_loadu_si128((const __m128i *)(c + b * block + i));
            const __m512i k = _mm512_cvtepu8_epi32(c16);
            const __m512 v = LOOKUP ? _mm512_i32gather_ps(k, map, 4) : _mm512_castsi512_ps(k);
            _mm512_storeu_ps(out + b * block + i, _mm512_mul_ps(v, vs));
        }
    }
}

__attribute__((noinline)) static void dequantize_gather(const fa_u8 *c, const float *s,
                                                        const float *map, float *out, ptrdiff_t n,
                                                        int block)
{
    dequantize_avx512(c, s, map, out, n, block, 1);
}

__attribute__((noinline)) static void dequantize_floor(const fa_u8 *c, const float *s,
                                                       const float *map, float *out, ptrdiff_t n,
                                                       int block)
{
    dequantize_avx512(c, s, map, out, n, block, 0);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*quant_fn)(const float *, fa_u8 *, float *, ptrdiff_t, int);
typedef void (*dequant_fn)(const fa_u8 *, const float *, const float *, float *, ptrdiff_t, int);

enum { N = 65536, BLOCK = 256, ROUNDS = 30, CALLS = 50 };

/* codes that differ from the search's */
static long check(const float *y, const fa_u8 *c, const float *scales, const float *thr)
{
    long bad = 0;
    for (int i = 0; i < N; i++)
        bad += c[i] != fa_lowp_code(y[i] * fa_lowp_inverse(scales[i / BLOCK]), thr);
    return bad;
}

int main(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        puts("needs AVX-512 (F, BW)");
        return 1;
    }
    const float *thr = fa_lowp_thresholds(FA_MAP_DYNAMIC, 1), *map = fa_lowp_map(FA_MAP_DYNAMIC, 1);
    if (fa_use_level(FA_LEVEL_V4) != FA_LEVEL_V4 || fa_lowp_init() != 0) {
        puts("needs x86-64-v4, and lowp.c's bins");
        return 1;
    }
    bins = fa_bins_of(FA_MAP_DYNAMIC, 1);
    float *y = malloc(N * sizeof *y), *out = malloc(N * sizeof *out);
    float *scales = malloc(N / BLOCK * sizeof *scales);
    fa_u8 *codes = malloc(N);
    srand(1);
    for (int i = 0; i < N; i++) { /* values over five decades, both signs */
        const float u = (float)rand() / (float)RAND_MAX - 0.5f;
        y[i] = u * (float)(i % 7 + 1) * powf(10.0f, -(float)(i % 5));
    }
    const char *names[3] = {"shipped", "gather", "no lookup"};
    quant_fn q[3] = {quantize_shipped, quantize_gather, quantize_floor};
    dequant_fn d[3] = {dequantize_shipped, dequantize_gather, dequantize_floor};
    printf("one slot, %d float32 values in L2, block %d, best of %d x %d calls, ns per element\n",
           N, BLOCK, ROUNDS, CALLS);
    for (int k = 0; k < 3; k++) {
        double bq = 1e9, bd = 1e9;
        for (int r = 0; r < ROUNDS; r++) {
            double t = now();
            for (int i = 0; i < CALLS; i++) q[k](y, codes, scales, N, BLOCK);
            t = now() - t;
            bq = t < bq ? t : bq;
            t = now();
            for (int i = 0; i < CALLS; i++) d[k](codes, scales, map, out, N, BLOCK);
            t = now() - t;
            bd = t < bd ? t : bd;
        }
        q[k](y, codes, scales, N, BLOCK);
        const long bad = check(y, codes, scales, thr);
        printf("  %-10s requantize %.3f  dequantize %.3f   codes %s\n", names[k],
               bq / CALLS / N * 1e9, bd / CALLS / N * 1e9,
               k == 2 ? "(not codes: a floor)" : bad ? "WRONG" : "exact");
    }
    free(y);
    free(out);
    free(scales);
    free(codes);
    return 0;
}
