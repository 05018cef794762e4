/* fastadam/dense.c -- the dense kernels of every optimizer; the contract is in dense.h, the
 * formulas in adam.h, adagrad.h and momentum.h.
 *
 * dense_body.h holds the loops once; it is included here per storage type (float16 computed in
 * float32, float32, float64).  Each loop is instantiated per flag combination (FA_SWITCH*), so
 * no element loop branches, and vectorizes (sqrt and division included: built with
 * -fno-math-errno).  Each kernel carries FA_DISPATCH and is compiled for AVX-512, AVX2 and
 * baseline; the build disables FMA contraction, so the clones round identically.
 */
#include <math.h>
#include <string.h>

#include "fastadam/dense.h"
#include "fastadam/formulas.h"

/* A switch over flag combinations, each case the loop LOOP(constant flags): FA_SWITCH8 for the
 * 8 combinations of bits 1, 2, 4; FA_SWITCH16 adds bit 8. */
#define FA_SWITCH8_AT(BASE, FLAGS, LOOP)                                                       \
    switch ((FLAGS) & 7) {                                                                     \
    case 0: LOOP((BASE) + 0); break;                                                           \
    case 1: LOOP((BASE) + 1); break;                                                           \
    case 2: LOOP((BASE) + 2); break;                                                           \
    case 3: LOOP((BASE) + 3); break;                                                           \
    case 4: LOOP((BASE) + 4); break;                                                           \
    case 5: LOOP((BASE) + 5); break;                                                           \
    case 6: LOOP((BASE) + 6); break;                                                           \
    default: LOOP((BASE) + 7); break;                                                          \
    }
#define FA_SWITCH8(FLAGS, LOOP) FA_SWITCH8_AT(0, FLAGS, LOOP)
#define FA_SWITCH16(FLAGS, LOOP)                                                               \
    if ((FLAGS) & 8) {                                                                         \
        FA_SWITCH8_AT(8, FLAGS, LOOP)                                                          \
    } else {                                                                                   \
        FA_SWITCH8_AT(0, FLAGS, LOOP)                                                          \
    }

#define FA_K(name) FA_CAT(name, _f32)
#define FA_S float
#define FA_CTYPE float
#define FA_CF(name) FA_CAT(name, _f32)
#define FA_UINT uint32_t
#define FA_EXP_MASK 0x7f800000u
#include "fastadam/dense_body.h"
#undef FA_K
#undef FA_S

#define FA_K(name) FA_CAT(name, _f16)
#define FA_S fa_half
#if FA_HAVE_HALF
#include "fastadam/dense_body.h"
#endif
#undef FA_K
#undef FA_S
#undef FA_CTYPE
#undef FA_CF
#undef FA_UINT
#undef FA_EXP_MASK

#define FA_K(name) FA_CAT(name, _f64)
#define FA_S double
#define FA_CTYPE double
#define FA_CF(name) FA_CAT(name, _f64)
#define FA_UINT uint64_t
#define FA_EXP_MASK 0x7ff0000000000000ull
#include "fastadam/dense_body.h"
#undef FA_K
#undef FA_S
#undef FA_CTYPE
#undef FA_CF
#undef FA_UINT
#undef FA_EXP_MASK

#if FA_HAVE_HALF
#define FA_HALF_KERNEL(name) FA_CAT(name, _f16)
#else
#define FA_HALF_KERNEL(name) NULL
#endif

static const fa_dense_fn fa_dense_table[FA_OPT_COUNT][FA_DTYPE_COUNT] = {
    [FA_OPT_ADAM] = {FA_HALF_KERNEL(adam_dense), adam_dense_f32, adam_dense_f64},
    [FA_OPT_ADAGRAD] = {FA_HALF_KERNEL(adagrad_dense), adagrad_dense_f32, adagrad_dense_f64},
    [FA_OPT_MOMENTUM] = {FA_HALF_KERNEL(momentum_dense), momentum_dense_f32, momentum_dense_f64},
};

fa_dense_fn fa_dense_kernel(int kind, int dtype)
{
    if (kind < 0 || kind >= FA_OPT_COUNT || dtype < 0 || dtype >= FA_DTYPE_COUNT) return NULL;
    return fa_dense_table[kind][dtype];
}

int fa_all_finite(int dtype, const void *g, ptrdiff_t n, double grad_scale)
{
    switch (dtype) {
    case FA_F32: return all_finite_f32(g, n, grad_scale);
    case FA_F64: return all_finite_f64(g, n, grad_scale);
#if FA_HAVE_HALF
    case FA_F16: return all_finite_f16(g, n, grad_scale);
#endif
    default: return 1;
    }
}
