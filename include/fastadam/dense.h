/* fastadam/dense.h -- the dense multi-tensor kernels of every optimizer.
 *
 * Design: one pass over memory.  Each element of x, g and the optimizer's state slots is read
 * once and x and the slots written once (Adam float32: 28 bytes per element, 4 of them the
 * gradient).  The formulas are not here: each optimizer's element update lives in its own
 * header (listed in optimizers.def) and this file's loops only load, call it, and store.
 * The Python layer validates everything and folds the hyper-parameters into the optimizer's
 * coefficient struct in float64; the Cython driver (fastadam/_core/_dense.pyx) cuts the tensors into
 * chunks and calls one kernel per chunk from an OpenMP parallel region.
 *
 * Every kernel has one signature, so the driver picks it once per call from a table
 * (fa_dense_kernel) and never branches on the optimizer again:
 *   x            IN/OUT  n  parameters
 *   g            IN      n  gradient (never written)
 *   s0, s1, s2   IN/OUT  n  state slots, as many as fa_<name>_nslots(flags) (Adam: m, v,
 *                           v_max with FA_AMSGRAD; Adagrad: h; Momentum: v; RMSprop: v, b, a;
 *                           Lion: m); unused slots may be NULL
 *   coeffs       IN         the optimizer's coefficient struct
 * All arrays have the kernel's storage type (float16 is computed in float32).
 * Preconditions: the written arrays do not overlap each other nor g; n >= 0.
 * Complexity: O(n), one pass.  Thread safety: writes only [0, n) of x and the slots; disjoint
 * ranges may run at once, and the result does not depend on how a tensor is split.
 * Flag tests are hoisted out of the element loop: each flag combination is its own loop.
 */
#ifndef FASTADAM_DENSE_H
#define FASTADAM_DENSE_H

#include "fastadam/common.h"
#include "fastadam/optimizers.def" /* the optimizers' headers: their coefficient structs */

/* Storage types of the dense kernels. */
enum { FA_F16 = 0, FA_F32 = 1, FA_F64 = 2, FA_DTYPE_COUNT = 3 };

typedef void (*fa_dense_fn)(void *x, const void *g, void *s0, void *s1, void *s2, ptrdiff_t n,
                            const void *coeffs);

/* The kernel for optimizer `kind` (FA_OPT_*) on storage type `dtype` (FA_F16/32/64), or NULL.
 * It takes only flags that fa_dense_supported accepts. */
fa_dense_fn fa_dense_kernel(int kind, int dtype);

/* fa_all_finite: 1 if every g[i] / grad_scale (or g[i] when grad_scale == 1) of storage type
 * `dtype` is finite, else 0; -1 for a storage type this build has no kernel for.  IN g[0, n).
 * O(n), read-only, thread safe. */
/* The registry of optimizers.def: the number of optimizers, the name of kind `kind` (NULL when
 * out of range), the size of its coefficient struct (0 when out of range), the state slots it
 * uses with `flags` (-1 out of range), and whether the dense kernels / the sparse row walk take
 * those flags (0 or 1; the sparse walk keeps at most two slots). */
int fa_registry_count(void);
const char *fa_registry_name(int kind);
size_t fa_registry_coeffs_size(int kind);
int fa_registry_nslots(int kind, int flags);
int fa_dense_supported(int kind, int flags);
int fa_sparse_supported(int kind, int flags);

int fa_all_finite(int dtype, const void *g, ptrdiff_t n, double grad_scale);

/* The row-wise optimizers (FA_ROWWISE_OPTIMIZER rows of optimizers.def: one state value per
 * row).  fa_registry_rowwise: 1 for such a kind, else 0; fa_dense_supported and
 * fa_sparse_supported (the element kernels, the GPU's included) are 0 for it, and
 * fa_rowwise_supported(kind, flags, sparse) says whether its dense kernel (sparse = 0) or its
 * sparse walk (sparse = 1, fa_sparse_rows / fa_sparse_dense of sparse.h) takes `flags`.
 *
 * fa_rowwise_dense_<dtype>: the optimizer's step on every row of one tensor.
 *   kind, coeffs  IN                   the optimizer (FA_OPT_*) and its coefficient struct
 *   x             IN/OUT n_rows x row_size  parameters (packed rows)
 *   g             IN     n_rows x row_size  gradient (never written)
 *   a             IN/OUT n_rows             the accumulator of each row
 * Returns FA_OK, or FA_ERR_UNSUPPORTED (nothing written) for a kind or flags the list does not
 * give it.  Preconditions: x, g, a do not overlap; n_rows, row_size >= 0.
 * O(n_rows * row_size), two passes over each row.  Thread safety: writes only these rows;
 * disjoint row ranges may run at once, and a row's result does not depend on the split. */
int fa_registry_rowwise(int kind);
int fa_rowwise_supported(int kind, int flags, int sparse);
int fa_rowwise_dense_f32(int kind, const void *coeffs, float *x, const float *g, float *a,
                         ptrdiff_t n_rows, ptrdiff_t row_size);
int fa_rowwise_dense_f64(int kind, const void *coeffs, double *x, const double *g, double *a,
                         ptrdiff_t n_rows, ptrdiff_t row_size);

#endif /* FASTADAM_DENSE_H */
