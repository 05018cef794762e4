/* fastadam/dense.c -- the dense kernels of every optimizer; the contract is in dense.h, the
 * formulas in adam.h, adagrad.h and momentum.h.
 *
 * dense_body.h holds the loops once; it is included here per storage type (float16 computed in
 * float32, float32, float64).  Each loop is instantiated per flag combination (FA_SWITCH*), so
 * no element loop branches, and vectorizes (sqrt and division included: built with
 * -fno-math-errno).  Each kernel carries FA_DISPATCH and is compiled for AVX-512, AVX2 and
 * baseline; the build disables FMA contraction, so the clones round identically.  The kernel
 * table has one row per level (common.h); fa_dense_kernel hands out the row of the level in use.
 */
#include <math.h>
#include <string.h>

#include "fastadam/dense.h"
#include "fastadam/formulas.h"

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

/* The row-wise optimizers' dense kernels (rowwise_body.h), float32 and float64. */
#define FA_ROWWISE_DENSE 1
#define FA_S float
#define FA_FN(name) FA_CAT(name, _f32)
#include "fastadam/rowwise_body.h"
#undef FA_S
#undef FA_FN
#define FA_S double
#define FA_FN(name) FA_CAT(name, _f64)
#include "fastadam/rowwise_body.h"
#undef FA_S
#undef FA_FN
#undef FA_ROWWISE_DENSE

FA_DISPATCH_LEVEL_STATE

/* fa_dense_table[level][kind][dtype]: one row per level of runtime dispatch (common.h), one row
 * in a build without it. */
#if FA_HAVE_DISPATCH
#define FA_LEVELS FA_LEVEL_COUNT
#define FA_TABLE_LEVEL fa_dispatch_level
#define FA_CLONE(name, level) name##_clones[level]
#else
#define FA_LEVELS 1
#define FA_TABLE_LEVEL 0
#define FA_CLONE(name, level) name
#endif
#if FA_HAVE_HALF
#define FA_HALF_KERNEL(name, level) FA_CLONE(name##_f16, level)
#else
#define FA_HALF_KERNEL(name, level) NULL
#endif

#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    [FA_OPT_##KIND] = {FA_HALF_KERNEL(name##_dense, FA_ROW), FA_CLONE(name##_dense_f32, FA_ROW), \
                       FA_CLONE(name##_dense_f64, FA_ROW)},
static const fa_dense_fn fa_dense_table[FA_LEVELS][FA_OPT_COUNT][FA_DTYPE_COUNT] = {
#define FA_ROW 0
    {
#include "fastadam/optimizers.def"
    },
#undef FA_ROW
#if FA_HAVE_DISPATCH
#define FA_ROW 1
    {
#include "fastadam/optimizers.def"
    },
#undef FA_ROW
#define FA_ROW 2
    {
#include "fastadam/optimizers.def"
    },
#undef FA_ROW
#endif
};
#undef FA_OPTIMIZER

/* The registry of optimizers.def, for the Python layer. */
typedef struct {
    const char *name;
    int dense_mask, sparse_mask;
    size_t coeffs_size;
    int (*nslots)(int flags);
    int rowwise; /* a FA_ROWWISE_OPTIMIZER row: one state value per row */
} fa_registry_entry;

#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    static int fa_nslots_of_##name(int flags) { return fa_##name##_nslots(flags); }
#define FA_ROWWISE_OPTIMIZER FA_OPTIMIZER
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER

static const fa_registry_entry fa_registry[FA_OPT_COUNT] = {
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                                      \
    [FA_OPT_##KIND] = {#name, DENSE_MASK, SPARSE_MASK, sizeof(fa_##name##_coeffs),             \
                       fa_nslots_of_##name, 0},
#define FA_ROWWISE_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                              \
    [FA_OPT_##KIND] = {#name, DENSE_MASK, SPARSE_MASK, sizeof(fa_##name##_coeffs),             \
                       fa_nslots_of_##name, 1},
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
};

int fa_registry_count(void) { return FA_OPT_COUNT; }

const char *fa_registry_name(int kind)
{
    return kind >= 0 && kind < FA_OPT_COUNT ? fa_registry[kind].name : NULL;
}

size_t fa_registry_coeffs_size(int kind)
{
    return kind >= 0 && kind < FA_OPT_COUNT ? fa_registry[kind].coeffs_size : 0;
}

int fa_registry_rowwise(int kind)
{
    return kind >= 0 && kind < FA_OPT_COUNT ? fa_registry[kind].rowwise : 0;
}

int fa_dense_supported(int kind, int flags)
{
    if (kind < 0 || kind >= FA_OPT_COUNT || fa_registry[kind].rowwise) return 0;
    return (flags & ~fa_registry[kind].dense_mask) == 0;
}

int fa_sparse_supported(int kind, int flags)
{
    if (kind < 0 || kind >= FA_OPT_COUNT || fa_registry[kind].rowwise) return 0;
    return (flags & ~fa_registry[kind].sparse_mask) == 0 && fa_registry[kind].nslots(flags) <= 2;
}

int fa_rowwise_supported(int kind, int flags, int sparse)
{
    if (kind < 0 || kind >= FA_OPT_COUNT || !fa_registry[kind].rowwise) return 0;
    return (flags & ~(sparse ? fa_registry[kind].sparse_mask : fa_registry[kind].dense_mask)) == 0;
}

/* The row-wise dense kernels: the clone of the level in use, by kind. */
#define FA_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)
#define FA_ROWWISE_OPTIMIZER(name, KIND, DENSE_MASK, SPARSE_MASK)                              \
    case FA_OPT_##KIND:                                                                        \
        return FA_AT_LEVEL(FA_CAT(name##_rowwise_dense, FA_ROWWISE_SUF))(coeffs, x, g, a,      \
                                                                        n_rows, row_size);
#define FA_ROWWISE_SUF _f32
int fa_rowwise_dense_f32(int kind, const void *coeffs, float *x, const float *g, float *a,
                         ptrdiff_t n_rows, ptrdiff_t row_size)
{
    switch (kind) {
#include "fastadam/optimizers.def"
    default: return FA_ERR_UNSUPPORTED;
    }
}
#undef FA_ROWWISE_SUF
#define FA_ROWWISE_SUF _f64
int fa_rowwise_dense_f64(int kind, const void *coeffs, double *x, const double *g, double *a,
                         ptrdiff_t n_rows, ptrdiff_t row_size)
{
    switch (kind) {
#include "fastadam/optimizers.def"
    default: return FA_ERR_UNSUPPORTED;
    }
}
#undef FA_ROWWISE_SUF
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER

int fa_registry_nslots(int kind, int flags)
{
    return kind >= 0 && kind < FA_OPT_COUNT ? fa_registry[kind].nslots(flags) : -1;
}

fa_dense_fn fa_dense_kernel(int kind, int dtype)
{
    if (kind < 0 || kind >= FA_OPT_COUNT || dtype < 0 || dtype >= FA_DTYPE_COUNT) return NULL;
    return fa_dense_table[FA_TABLE_LEVEL][kind][dtype];
}

int fa_all_finite(int dtype, const void *g, ptrdiff_t n, double grad_scale)
{
    switch (dtype) {
    case FA_F32: return FA_AT_LEVEL(all_finite_f32)(g, n, grad_scale);
    case FA_F64: return FA_AT_LEVEL(all_finite_f64)(g, n, grad_scale);
#if FA_HAVE_HALF
    case FA_F16: return FA_AT_LEVEL(all_finite_f16)(g, n, grad_scale);
#endif
    default: return -1; /* no such storage type: an error, never "finite" */
    }
}
