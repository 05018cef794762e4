/* fastadam/lowp.c -- the CPU kernels of low-precision optimizer states; the contract and the
 * design are in lowp_cpu.h, the element level (formats, maps, rounding) in lowp.h, the formulas
 * in the headers optimizers.def lists.
 *
 * Exact codes without a search: a float32 q's bits pick a bin (sign, exponent clamped to
 * [2^-24, 2), the top 7 mantissa bits): 2 * 27 * 128 bins per map.  Every map's thresholds are
 * at least one bin apart (checked when the bins are built), so a bin holds at most one, and
 * code = base + (q beyond the bin's threshold), a comparison of the low 16 mantissa bits:
 * one table load per element instead of eight dependent ones.  Built from fa_lowp_code (the
 * header's search) at import, and the tests sweep it against that.  A NaN gets code 0 as in
 * the search.
 */
#include <math.h>
#include <string.h>

#include "fastadam/formulas.h"
#include "fastadam/lowp_cpu.h"

/* Tiles: about FA_LOWP_TILE elements, whole blocks for FA_FMT_Q8. */
#define FA_LOWP_TILE 1024
#define FA_LOWP_STRIDE (FA_LOWP_MAX_BLOCK + 80) /* floats from one stage buffer to the next */

/* ---- code bins ------------------------------------------------------------------------- */

#define FA_BIN_EXP0 102 /* exponent field of bin 1 minus 1: bin 1 is [2^-24, 2^-23) */
#define FA_BIN_EXPS 27  /* 0: below 2^-24 (and 0), 1..25: one binade each, 26: 2 and up */
#define FA_BINS (2 * FA_BIN_EXPS * 128)

static fa_u32 fa_lowp_bins_table[4][FA_BINS];

static const fa_u32 *fa_bins_of(int qmap, int is_signed)
{
    return fa_lowp_bins_table[(qmap == FA_MAP_LINEAR ? 2 : 0) + (is_signed ? 0 : 1)];
}

/* Builds one map's bins; 0 if they reproduce fa_lowp_code at every bin's ends. */
static int fa_build_bins(const float *thr, fa_u32 *bins)
{
    for (fa_u32 s = 0; s < 2; s++) {
        for (fa_u32 eb = 0; eb < FA_BIN_EXPS; eb++) {
            for (fa_u32 m7 = 0; m7 < 128; m7++) {
                fa_u32 *entry = &bins[(eb << 8) | (s << 7) | m7];
                fa_u32 lo, hi;
                if (eb == 0) { /* every float below 2^-24 in magnitude, zero included */
                    lo = s << 31;
                    hi = (s << 31) | (((FA_BIN_EXP0 + 1u) << 23) - 1u);
                } else if (eb == FA_BIN_EXPS - 1) { /* 2 up to FLT_MAX */
                    lo = (s << 31) | (128u << 23);
                    hi = (s << 31) | 0x7f7fffffu;
                } else {
                    lo = (s << 31) | ((eb + FA_BIN_EXP0) << 23) | (m7 << 16);
                    hi = lo | 0xffffu;
                }
                const int c_lo = fa_lowp_code(fa_bits_f32(lo), thr);
                const int c_hi = fa_lowp_code(fa_bits_f32(hi), thr);
                const int base = s ? c_hi : c_lo; /* the code of the bin's lowest q */
                const int top = s ? c_lo : c_hi;
                if (top == base) {
                    *entry = ((fa_u32)base << 16) | 0xffffu; /* never beyond */
                } else if (top == base + 1 && eb != 0 && eb != FA_BIN_EXPS - 1) {
                    const fa_u32 t = fa_f32_bits(thr[base]); /* the one threshold inside */
                    if ((t >> 16) != (lo >> 16)) return 1;
                    /* positive: q > T <=> low > low(T); negative: <=> low < low(|T|), that is
                     * (low ^ 0xffff) > (low(|T|) ^ 0xffff) */
                    *entry = ((fa_u32)base << 16) | ((t & 0xffffu) ^ (s ? 0xffffu : 0u));
                } else {
                    return 1;
                }
            }
        }
    }
    return 0;
}

int fa_lowp_init(void)
{
    for (int m = 0; m < 4; m++) {
        const int qmap = m < 2 ? FA_MAP_DYNAMIC : FA_MAP_LINEAR, is_signed = (m % 2) == 0;
        if (fa_build_bins(fa_lowp_thresholds(qmap, is_signed), fa_lowp_bins_table[m]))
            return m + 1;
    }
    return 0;
}

/* The code of q by the bins: equal to fa_lowp_code(q, that map's thresholds). */
static inline __attribute__((always_inline)) int fa_bins_code(const fa_u32 *bins, float q,
                                                              int zero)
{
    const fa_u32 u = fa_f32_bits(q);
    int e = (int)((u >> 23) & 0xffu) - FA_BIN_EXP0;
    e = e < 0 ? 0 : e;
    e = e > FA_BIN_EXPS - 1 ? FA_BIN_EXPS - 1 : e;
    /* index: binade, sign, top 7 mantissa bits; the sign and mantissa bits are bits 7..0 of
     * u >> 16 with the exponent's bits removed */
    const fa_u32 entry = bins[(fa_u32)(e << 8) | ((u >> 24) & 0x80u) | ((u >> 16) & 0x7fu)];
    const int low = (int)((u ^ (fa_u32)((int)u >> 31)) & 0xffffu);
    const int code = (int)(entry >> 16) + (low > (int)(entry & 0xffffu));
    return q == q ? code : zero; /* a NaN gets the code of 0.0 (fa_lowp_q) */
}

/* lowp.h's fa_bf16_nearest in fewer vector operations: a NaN (v != v: all-ones mask) adds
 * nothing and gets the quiet bit (bit 22, which >> 16 makes 0x0040) before the shift. */
static inline __attribute__((always_inline)) fa_u16 fa_nearest_bits(float v)
{
    const fa_u32 u = fa_f32_bits(v);
    const fa_u32 nan = v != v ? 0xffffffffu : 0u;
    return (fa_u16)(((u + (~nan & (0x7fffu + ((u >> 16) & 1u)))) | (nan & 0x00400000u)) >> 16);
}

/* lowp.h's fa_bf16_stochastic likewise, with 16 random bits r. */
static inline __attribute__((always_inline)) fa_u16 fa_stochastic_bits(float v, fa_u32 r)
{
    const fa_u32 u = fa_f32_bits(v);
    const fa_u32 nan = v != v ? 0xffffffffu : 0u;
    return (fa_u16)(((u + (~nan & r)) | (nan & 0x00400000u)) >> 16);
}

/* ---- format loops (one tile) ------------------------------------------------------------- */

FA_DISPATCH
static void fa_load_bf16(const fa_u16 *restrict src, float *restrict dst, ptrdiff_t n)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) dst[i] = fa_bits_f32((fa_u32)src[i] << 16);
}
FA_CLONES(fa_load_bf16);

FA_DISPATCH
static void fa_store_bf16(const float *restrict src, fa_u16 *restrict dst, ptrdiff_t n)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        dst[i] = fa_nearest_bits(src[i]);
    }
}
FA_CLONES(fa_store_bf16);

FA_DISPATCH
static void fa_store_bf16_sr(const float *restrict src, fa_u16 *restrict dst, ptrdiff_t n,
                             fa_u32 key, fa_u32 j0)
{
#pragma omp simd
    for (ptrdiff_t i = 0; i < n; i++) {
        dst[i] = fa_stochastic_bits(src[i], fa_hash32(key + j0 + (fa_u32)i) >> 16);
    }
}
FA_CLONES(fa_store_bf16_sr);

/* n elements of whole blocks (the last may be partial): dst = map[code] * scale. */
FA_DISPATCH
static void fa_load_q8(const fa_u8 *restrict codes, const float *restrict scales,
                       const float *restrict map, float *restrict dst, ptrdiff_t n, int block)
{
    for (ptrdiff_t b = 0; b * block < n; b++) {
        const ptrdiff_t at = b * block, len = n - at < block ? n - at : block;
        const float scale = scales[b];
#pragma omp simd
        for (ptrdiff_t i = 0; i < len; i++) dst[at + i] = map[codes[at + i]] * scale;
    }
}
FA_CLONES(fa_load_q8);

FA_DISPATCH
static void fa_store_q8(const float *restrict y, fa_u8 *restrict codes, float *restrict scales,
                        const fa_u32 *restrict bins, ptrdiff_t n, int block)
{
    const int zero = fa_bins_code(bins, 0.0f, 0); /* the code a NaN gets */
    for (ptrdiff_t b = 0; b * block < n; b++) {
        const ptrdiff_t at = b * block, len = n - at < block ? n - at : block;
        /* max |y| by an integer max of the bits without the sign (exact, order-free); a NaN
         * counts as 0 and is stored as the code of 0 (fa_lowp_abs_bits); an infinite max
         * saturates to FLT_MAX (fa_lowp_scale_of: no block's scale is infinite) */
        fa_u32 big = 0;
#pragma omp simd reduction(max : big)
        for (ptrdiff_t i = 0; i < len; i++) {
            fa_u32 a = fa_f32_bits(y[at + i]) & 0x7fffffffu;
            a = a > 0x7f800000u ? 0u : a; /* fa_lowp_abs_bits, inline for the vector loop */
            big = a > big ? a : big;
        }
        const float scale = fa_lowp_scale_of(big);
        const float inv = fa_lowp_inverse(scale);
        scales[b] = scale;
#pragma omp simd
        for (ptrdiff_t i = 0; i < len; i++)
            codes[at + i] = (fa_u8)fa_bins_code(bins, y[at + i] * inv, zero);
    }
}
FA_CLONES(fa_store_q8);

/* ---- element loops: one per optimizer and flag combination -------------------------------- */

/* A state slot's element i in its format SB (0: float32, 1: bfloat16 bits), read and written
 * inline so that one vector loop does the conversions (bf16 -> f32 is a shift, f32 -> bf16 the
 * nearest-even rounding of lowp.h, bit for bit). */
static inline __attribute__((always_inline)) float fa_slot_ld(const void *p, ptrdiff_t i,
                                                              const int SB)
{
    if (SB) return fa_bits_f32((fa_u32)((const fa_u16 *)p)[i] << 16);
    return ((const float *)p)[i];
}

static inline __attribute__((always_inline)) void fa_slot_st(void *p, ptrdiff_t i, float v,
                                                             const int SB)
{
    if (SB) {
        ((fa_u16 *)p)[i] = fa_nearest_bits(v);
    } else {
        ((float *)p)[i] = v;
    }
}

/* XB: x and g are bfloat16 too (x rounded to nearest even), else float32. */
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    static inline __attribute__((always_inline)) void name##_lowp_loop(                        \
        void *restrict x, const void *restrict g, void *restrict s0, void *restrict s1,        \
        void *restrict s2, ptrdiff_t n, const fa_##name##_k_f32 *k, const int FLAGS,           \
        const int SB, const int XB)                                                            \
    {                                                                                          \
        const int nslots = fa_##name##_nslots(FLAGS);                                          \
        _Pragma("omp simd")                                                                    \
        for (ptrdiff_t i = 0; i < n; i++) {                                                    \
            float xi = fa_slot_ld(x, i, XB), a = fa_slot_ld(s0, i, SB), b = 0, c = 0;          \
            if (nslots > 1) b = fa_slot_ld(s1, i, SB);                                         \
            if (nslots > 2) c = fa_slot_ld(s2, i, SB);                                         \
            fa_##name##_math_f32(k, FLAGS, fa_slot_ld(g, i, XB), &xi, &a, &b, &c);             \
            if (nslots > 2) fa_slot_st(s2, i, c, SB);                                          \
            if (nslots > 1) fa_slot_st(s1, i, b, SB);                                          \
            fa_slot_st(s0, i, a, SB);                                                          \
            fa_slot_st(x, i, xi, XB);                                                          \
        }                                                                                      \
    }
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER

/* Per optimizer three element loops: float32 slots (also the stage buffers of 8-bit states),
 * bfloat16 slots converted inline, and everything bfloat16 (x, g and slots; x nearest). */
#define FA_LOWP_CASE(F, name)                                                                  \
    name##_lowp_loop(x, g, s0, s1, s2, n, (const fa_##name##_k_f32 *)k, F, 0, 0)
#define FA_LOWP_CASE_BF16(F, name)                                                             \
    name##_lowp_loop(x, g, s0, s1, s2, n, (const fa_##name##_k_f32 *)k, F, 1, 0)
#define FA_LOWP_CASE_ALL16(F, name)                                                            \
    name##_lowp_loop(x, g, s0, s1, s2, n, (const fa_##name##_k_f32 *)k, F, 1, 1)
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    FA_DISPATCH                                                                                \
    static void name##_lowp_elems(void *x, const void *g, void *s0, void *s1, void *s2,        \
                                  ptrdiff_t n, const void *k, int flags)                       \
    {                                                                                          \
        FA_FLAG_SWITCH(flags, DENSE_MASK, FA_LOWP_CASE, name)                                  \
    }                                                                                          \
    FA_CLONES(name##_lowp_elems);                                                              \
    FA_DISPATCH                                                                                \
    static void name##_lowp_elems_bf16(void *x, const void *g, void *s0, void *s1, void *s2,   \
                                       ptrdiff_t n, const void *k, int flags)                  \
    {                                                                                          \
        FA_FLAG_SWITCH(flags, DENSE_MASK, FA_LOWP_CASE_BF16, name)                             \
    }                                                                                          \
    FA_CLONES(name##_lowp_elems_bf16);                                                         \
    FA_DISPATCH                                                                                \
    static void name##_lowp_elems_all16(void *x, const void *g, void *s0, void *s1, void *s2,  \
                                        ptrdiff_t n, const void *k, int flags)                 \
    {                                                                                          \
        FA_FLAG_SWITCH(flags, DENSE_MASK, FA_LOWP_CASE_ALL16, name)                            \
    }                                                                                          \
    FA_CLONES(name##_lowp_elems_all16);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
#undef FA_LOWP_CASE
#undef FA_LOWP_CASE_BF16
#undef FA_LOWP_CASE_ALL16

FA_DISPATCH_LEVEL_STATE

/* ---- plan and chunk step ------------------------------------------------------------------ */

int fa_lowp_prepare(fa_lowp_plan *plan, int kind, const void *coeffs, int param_fmt,
                    int grad_fmt, int state_fmt, int block, int qmap, const int *signed_slots,
                    int rounding, int has_master)
{
    memset(plan, 0, sizeof *plan);
    /* everything bfloat16, x rounded to nearest: one loop converts all of it */
    const int all16 = state_fmt == FA_FMT_BF16 && param_fmt == FA_FMT_BF16
                      && grad_fmt == FA_FMT_BF16 && rounding == FA_ROUND_NEAREST && !has_master;
    /* the element loop reads and writes the arrays themselves, no staging */
    plan->direct = all16 || (state_fmt != FA_FMT_Q8 && param_fmt == FA_FMT_F32
                             && grad_fmt == FA_FMT_F32 && !has_master);
    switch (kind) {
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    case FA_OPT_##KIND: {                                                                      \
        const fa_##name##_coeffs *c = (const fa_##name##_coeffs *)coeffs;                     \
        if ((c->flags & ~(DENSE_MASK)) != 0) return FA_ERR_UNSUPPORTED;                        \
        const fa_##name##_k_f32 k = fa_##name##_prepare_f32(c);                                \
        memcpy(plan->k, &k, sizeof k);                                                         \
        plan->flags = c->flags;                                                                \
        plan->nslots = fa_##name##_nslots(c->flags);                                           \
        plan->elems = FA_AT_LEVEL(name##_lowp_elems);                                          \
        if (state_fmt == FA_FMT_BF16) plan->elems = FA_AT_LEVEL(name##_lowp_elems_bf16);       \
        if (all16) plan->elems = FA_AT_LEVEL(name##_lowp_elems_all16);                         \
        break;                                                                                 \
    }
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
    default: return FA_ERR_UNSUPPORTED;
    }
    plan->kind = kind;
    plan->param_fmt = param_fmt;
    plan->grad_fmt = grad_fmt;
    plan->state_fmt = state_fmt;
    plan->block = block;
    plan->rounding = rounding;
    plan->has_master = has_master;
    for (int q = 0; q < plan->nslots; q++) {
        plan->map[q] = fa_lowp_map(qmap, signed_slots[q]);
        plan->bins[q] = fa_bins_of(qmap, signed_slots[q]);
    }
    return FA_OK;
}

void fa_lowp_chunk_step(const fa_lowp_plan *p, const fa_lowp_chunk *c)
{
    /* staging buffers for x, g (bfloat16 without a master) and 8-bit states (float32 arrays
     * and bfloat16 states are read and written in place by the element loop); FA_LOWP_STRIDE
     * floats apart, not a multiple of 4 KiB, so that they neither share L1 sets nor alias each
     * other's store addresses */
    float buf[(2 + FA_MAX_SLOTS) * FA_LOWP_STRIDE];
    const int q8 = p->state_fmt == FA_FMT_Q8;
    const int sbytes = p->state_fmt == FA_FMT_F32 ? 4 : p->state_fmt == FA_FMT_BF16 ? 2 : 1;
    if (p->direct) { /* one vector loop over the chunk, straight from memory */
        p->elems(c->x, c->g, c->s[0], c->s[1], c->s[2], c->n, p->k, p->flags);
        return;
    }
    const ptrdiff_t tile = q8 ? (ptrdiff_t)p->block * (p->block < FA_LOWP_TILE ? FA_LOWP_TILE / p->block : 1)
                              : FA_LOWP_TILE;
    for (ptrdiff_t off = 0; off < c->n; off += tile) {
        const ptrdiff_t n = c->n - off < tile ? c->n - off : tile;
        const ptrdiff_t first_block = q8 ? off / p->block : 0;
        /* load (float32 and bfloat16 states: in place) */
        float *xb, *gb;
        void *sb[FA_MAX_SLOTS] = {buf + 2 * FA_LOWP_STRIDE, buf + 3 * FA_LOWP_STRIDE,
                                  buf + 4 * FA_LOWP_STRIDE};
        if (p->has_master) {
            xb = c->master + off;
        } else if (p->param_fmt == FA_FMT_BF16) {
            xb = buf;
            FA_AT_LEVEL(fa_load_bf16)((const fa_u16 *)c->x + off, xb, n);
        } else {
            xb = (float *)c->x + off;
        }
        if (p->grad_fmt == FA_FMT_BF16) {
            gb = buf + FA_LOWP_STRIDE;
            FA_AT_LEVEL(fa_load_bf16)((const fa_u16 *)c->g + off, gb, n);
        } else {
            gb = (float *)c->g + off;
        }
        for (int q = 0; q < p->nslots; q++) {
            if (q8)
                FA_AT_LEVEL(fa_load_q8)((const fa_u8 *)c->s[q] + off, c->scale[q] + first_block,
                                        p->map[q], (float *)sb[q], n, p->block);
            else
                sb[q] = (char *)c->s[q] + off * sbytes;
        }
        /* update */
        p->elems(xb, gb, sb[0], sb[1], sb[2], n, p->k, p->flags);
        /* store */
        for (int q = 0; q < p->nslots && q8; q++)
            FA_AT_LEVEL(fa_store_q8)((const float *)sb[q], (fa_u8 *)c->s[q] + off,
                                     c->scale[q] + first_block, p->bins[q], n, p->block);
        if (p->has_master) {
            FA_AT_LEVEL(fa_store_bf16)(xb, (fa_u16 *)c->x + off, n);
        } else if (p->param_fmt == FA_FMT_BF16) {
            if (p->rounding == FA_ROUND_STOCHASTIC)
                FA_AT_LEVEL(fa_store_bf16_sr)(xb, (fa_u16 *)c->x + off, n, c->key,
                                              c->j0 + (fa_u32)off);
            else
                FA_AT_LEVEL(fa_store_bf16)(xb, (fa_u16 *)c->x + off, n);
        }
    }
}

/* ---- helpers of the driver --------------------------------------------------------------- */

FA_DISPATCH
static int fa_finite_f32(const float *restrict g, ptrdiff_t n, float s)
{
    fa_u32 bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++)
        bad |= (fa_u32)((fa_f32_bits(g[i] / s) & 0x7f800000u) == 0x7f800000u);
    return !bad;
}
FA_CLONES(fa_finite_f32);

FA_DISPATCH
static int fa_finite_bf16(const fa_u16 *restrict g, ptrdiff_t n, float s)
{
    fa_u32 bad = 0;
#pragma omp simd reduction(| : bad)
    for (ptrdiff_t i = 0; i < n; i++)
        bad |= (fa_u32)((fa_f32_bits(fa_bits_f32((fa_u32)g[i] << 16) / s) & 0x7f800000u)
                        == 0x7f800000u);
    return !bad;
}
FA_CLONES(fa_finite_bf16);

int fa_lowp_all_finite(int fmt, const void *g, ptrdiff_t n, double grad_scale)
{
    if (fmt == FA_FMT_BF16) return FA_AT_LEVEL(fa_finite_bf16)((const fa_u16 *)g, n, (float)grad_scale);
    return FA_AT_LEVEL(fa_finite_f32)((const float *)g, n, (float)grad_scale);
}

void fa_lowp_quantize_blocks(const float *y, ptrdiff_t n, int block, int qmap, int is_signed,
                      fa_u8 *codes, float *scales)
{
    FA_AT_LEVEL(fa_store_q8)(y, codes, scales, fa_bins_of(qmap, is_signed), n, block);
}

void fa_lowp_dequantize_blocks(const fa_u8 *codes, const float *scales, ptrdiff_t n, int block,
                        int qmap, int is_signed, float *out)
{
    FA_AT_LEVEL(fa_load_q8)(codes, scales, fa_lowp_map(qmap, is_signed), out, n, block);
}

void fa_lowp_to_bf16(const float *src, ptrdiff_t n, fa_u16 *dst)
{
    FA_AT_LEVEL(fa_store_bf16)(src, dst, n);
}

long long fa_lowp_check_codes(int qmap, int is_signed, fa_u32 u_begin, fa_u32 u_end,
                              fa_u32 stride)
{
    const float *thr = fa_lowp_thresholds(qmap, is_signed);
    const fa_u32 *bins = fa_bins_of(qmap, is_signed);
    long long bad = 0;
    for (unsigned long long u = u_begin; u < u_end; u += stride) {
        const float q = fa_bits_f32((fa_u32)u);
        bad += fa_bins_code(bins, q, fa_lowp_code(0.0f, thr)) != fa_lowp_code(q, thr);
    }
    return bad;
}
