/* fastadam/lowp_cpu.h -- the CPU kernels of low-precision optimizer states (lowp.c); the element
 * level (formats, maps, rounding) is lowp.h, the driver fastadam/_core/_lowp.pyx.
 *
 * Design: one pass over memory.  The optimizer's float32 element function (fa_<name>_math_f32,
 * the same one the float32 kernels call) runs in one vector loop per optimizer and flag
 * combination, in two variants: float32 slots, and bfloat16 slots converted inside the loop
 * (load: bits << 16; store: nearest even, inline).  With float32 x and g and float32 or
 * bfloat16 states that loop runs straight over the chunk.  Otherwise the chunk is staged per
 * tile: whole quantization blocks (about 1024 elements; for 8-bit states a multiple of the
 * block size) of one tensor; bfloat16 x and g and 8-bit states are converted into float32
 * buffers on the stack (one small loop per format: bf16 -> f32, codes -> map[code] * scale),
 * the element loop runs over them, and x and the slots are rounded or requantized back (per
 * 8-bit block: scale = max |y|, codes by a table of bins of the float32 bits, exact).  Every
 * loop carries FA_DISPATCH (common.h).
 * Every element is computed the same way whatever the tile, chunk or thread, so results are
 * bit-identical for any thread count and CPU level.
 *
 * The driver prepares one plan per call (fa_lowp_prepare) and cuts tensors into chunks of whole
 * blocks (fa_lowp_chunk); chunks are independent and may run on any thread.
 */
#ifndef FASTADAM_LOWP_CPU_H
#define FASTADAM_LOWP_CPU_H

#include "fastadam/common.h"
#include "fastadam/lowp.h"

/* The most elements of one tile (the largest block size). */
#define FA_LOWP_MAX_BLOCK 4096

typedef void (*fa_lowp_elems_fn)(void *x, const void *g, void *s0, void *s1, void *s2,
                                 ptrdiff_t n, const void *k, int flags);

/* One call's fixed facts.  Filled by fa_lowp_prepare. */
typedef struct {
    int kind, flags, nslots;
    int param_fmt, grad_fmt, state_fmt; /* FA_FMT_*; param F32 or BF16, grad F32 or BF16 */
    int block;                          /* FA_FMT_Q8: elements per scale */
    int rounding;                       /* FA_ROUND_*: bf16 x without a master */
    int has_master;                     /* x is BF16 and a float32 master is the x updated */
    int direct;                         /* elems reads and writes the chunk's arrays (no staging) */
    const float *map[FA_MAX_SLOTS];     /* FA_FMT_Q8: each slot's map values */
    const fa_u32 *bins[FA_MAX_SLOTS];   /* FA_FMT_Q8: each slot's code bins */
    fa_lowp_elems_fn elems;             /* the optimizer's element loop at this CPU level */
    double k[32];                       /* its prepared float32 coefficients (fa_<name>_k_f32) */
} fa_lowp_plan;

/* One chunk: n elements (whole blocks; a tensor's last chunk may end in a partial block) of one
 * tensor, starting at flat element j0 (the stochastic rounding index). */
typedef struct {
    void *x;                     /* param_fmt */
    const void *g;               /* grad_fmt */
    void *s[FA_MAX_SLOTS];       /* state_fmt (uint8 codes for FA_FMT_Q8); unused: NULL */
    float *scale[FA_MAX_SLOTS];  /* FA_FMT_Q8: the chunk's first block's scale */
    float *master;               /* has_master: float32 like x */
    ptrdiff_t n;
    fa_u32 key;                  /* fa_sr_key of the tensor */
    fa_u32 j0;
} fa_lowp_chunk;

/* Build the code bins of the four maps; 0 on success, else the map (1 + index) whose bins do
 * not reproduce fa_lowp_code.  Once per process, before any kernel (not thread safe). */
int fa_lowp_init(void);

/* Fill plan for optimizer `kind` (FA_OPT_*) with its coefficient struct `coeffs` and the formats;
 * signed_slots[q]: slot q takes the signed map.  Returns FA_OK, or FA_ERR_UNSUPPORTED when the
 * dense kernels do not take the struct's flags (nothing else is checked: the driver validates). */
int fa_lowp_prepare(fa_lowp_plan *plan, int kind, const void *coeffs, int param_fmt,
                    int grad_fmt, int state_fmt, int block, int qmap, const int *signed_slots,
                    int rounding, int has_master);

/* One chunk of a step.  Writes only the chunk's elements, blocks and scales.  Thread safe for
 * distinct chunks. */
void fa_lowp_chunk_step(const fa_lowp_plan *plan, const fa_lowp_chunk *chunk);

/* 1 if every g[i] / grad_scale of the chunk is finite (fmt FA_FMT_F32 or FA_FMT_BF16), else 0. */
int fa_lowp_all_finite(int fmt, const void *g, ptrdiff_t n, double grad_scale);

/* Quantize n float32 values (blocks of `block`, the last may be partial) into codes and scales;
 * dequantize back.  O(n); thread safe on distinct outputs. */
void fa_lowp_quantize_blocks(const float *y, ptrdiff_t n, int block, int qmap, int is_signed,
                      fa_u8 *codes, float *scales);
void fa_lowp_dequantize_blocks(const fa_u8 *codes, const float *scales, ptrdiff_t n, int block,
                        int qmap, int is_signed, float *out);

/* float32 -> bfloat16 bits, nearest even. */
void fa_lowp_to_bf16(const float *src, ptrdiff_t n, fa_u16 *dst);

/* The code of every float32 whose bits are u_begin, u_begin + stride, ... < u_end, by the bins
 * and by fa_lowp_code: the number that differ (the tests' exactness sweep). */
long long fa_lowp_check_codes(int qmap, int is_signed, fa_u32 u_begin, fa_u32 u_end,
                              fa_u32 stride);

#endif /* FASTADAM_LOWP_CPU_H */
