/* fastadam/cuda/kernels.cu -- the GPU kernels of fastadam.gpu, compiled at first use by NVRTC
 * (cupy.RawModule) with the repository's include/ directory on the include path.
 *
 * One formula, two backends: the element update of every optimizer is the one in its header
 * (the list is fastadam/optimizers.def; through formulas.h, which instantiates them for
 * float and double; formula.h turns FA_INLINE into `static __device__ __forceinline__` under
 * NVRTC).  This file only adds what a GPU needs around them: storage/compute conversion
 * (float16 is held as its 16 bits and computed in float32, as on the CPU), the multi-tensor
 * launch, the non-finite reduction and the sparse row walk.  Nothing here is a formula.
 *
 * Kernels (templates; fastadam/gpu/_source.py lists the instantiations, by name expression):
 *
 *   fa_dense_step<S, KIND, FLAGS>(table, ntensors, skip, check_skip)
 *       One multi-tensor step over every tensor of a list in one launch.  `table` (device
 *       memory, uploaded once per call) holds the coefficient struct of the optimizer KIND in
 *       its first FA_CUDA_HEADER bytes, then `ntensors` fa_cuda_tensor entries (pointers x, g,
 *       s0, s1, s2, element count n >= 1, first block block0; increasing block0).  Block b works
 *       on elements [(b - block0) * FA_CUDA_CHUNK, +FA_CUDA_CHUNK) of the tensor whose range holds
 *       b (binary search over block0).  IN g; IN/OUT x, s0..s2.  If check_skip and *skip != 0,
 *       nothing is written.  Buffers must not overlap (checked in Python).
 *   fa_nonfinite<S>(table, ntensors, grad_scale, flag)
 *       OR-reduction: *flag |= 1 if any (C)g / (C)grad_scale is NaN or infinite (one atomic per
 *       block that saw one).  The dense step of the same stream then reads the flag: the host
 *       never waits between the two.
 *   fa_segment_sum<S>(values, row_size, perm, offsets, nseg, out)
 *       out[s, i] = +0 + values[perm[j0], i] + ... + values[perm[j1 - 1], i] for the segment's
 *       positions [j0, j1) = [offsets[s], offsets[s+1]) of a stable sort (perm), added in that
 *       order by one thread: deterministic, and equal to the CPU's sums.
 *   fa_sparse_rows<S, KIND, FLAGS, CATCHUP>(coeffs, x, st0, st1, row_size, values, perm, offsets,
 *                                            rows, nseg, last_step, t)
 *       Lazy (and catch-up) sparse step: block s updates row rows[s] with its segment's sum; in
 *       catch-up mode the state first decays over the t - 1 - last_step[r] idle steps (one
 *       multiplication per step up to FA_CATCHUP_EXACT, else one by rate^k), then
 *       last_step[r] = t.  Rows are distinct, so blocks never write the same memory.
 *   fa_sparse_dense<S, KIND, FLAGS>(coeffs, x, st0, st1, row_size, n_rows, values, perm,
 *                                   offsets, seg_of_row)
 *       Dense-mode sparse step: every row is updated, with g = its segment's sum when
 *       seg_of_row[r] >= 0 and +0 otherwise (as the CPU's dense mode).
 *   fa_rowwise_dense / fa_rowwise_rows / fa_rowwise_all: the row-wise optimizers' steps, one
 *       thread per row (see their section below).
 *
 * Thread safety: each kernel writes disjoint elements per thread; launches are ordered on the
 * caller's CuPy stream.
 */
#include "fastadam/formulas.h"

#define FA_CUDA_HEADER 128  /* bytes reserved for the coefficient struct at the table's start */
#define FA_CUDA_CHUNK 4096  /* elements per block of the dense step */
#define FA_CATCHUP_EXACT 64 /* as include/fastadam/sparse.h */

typedef long long fa_i64;

/* One tensor of a multi-tensor table (64 bytes; fastadam/gpu/_layout.py writes the same layout). */
typedef struct {
    fa_i64 x, g, s0, s1, s2; /* device addresses (s1, s2 may be 0 when the optimizer has none) */
    fa_i64 n;                /* elements, >= 1 */
    fa_i64 block0;           /* first block of this tensor */
    fa_i64 unused;
} fa_cuda_tensor;

/* Storage S <-> compute type C.  float16 is `unsigned short` (its bits): converted with the
 * PTX cvt instructions, round to nearest even, so no CUDA header is needed. */
template <typename S> struct fa_store;
template <> struct fa_store<float> {
    typedef float C;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float save(float v) { return v; }
};
template <> struct fa_store<double> {
    typedef double C;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double save(double v) { return v; }
};
template <> struct fa_store<unsigned short> {
    typedef float C;
#ifndef FA_CUDA_HOST_EMULATION
    static __device__ __forceinline__ float load(unsigned short h)
    {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ unsigned short save(float f)
    {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
#else /* tests/gpu_emulation.cpp runs these kernels on the host: _Float16 converts the same way */
    static float load(unsigned short h)
    {
        _Float16 v;
        memcpy(&v, &h, sizeof v);
        return (float)v;
    }
    static unsigned short save(float f)
    {
        const _Float16 v = (_Float16)f;
        unsigned short h;
        memcpy(&h, &v, sizeof h);
        return h;
    }
#endif
};

static __device__ __forceinline__ int fa_is_finite(float y)
{
    return (__float_as_uint(y) & 0x7f800000u) != 0x7f800000u;
}
static __device__ __forceinline__ int fa_is_finite(double y)
{
    return (__double_as_longlong(y) & 0x7ff0000000000000LL) != 0x7ff0000000000000LL;
}

/* The optimizer KIND in compute type C: the formula headers' functions under one name, one
 * specialisation per optimizer of the registration list (optimizers.def) and compute type. */
template <int KIND, typename C> struct fa_opt;
#define FA_CUDA_OPT(name, K, C, SUF)                                                           \
    template <> struct fa_opt<FA_OPT_##K, C> {                                                 \
        typedef FA_CAT(fa_##name##_k, SUF) Kc;                                                 \
        static __device__ __forceinline__ Kc prepare(const void *c)                            \
        {                                                                                      \
            return FA_CAT(fa_##name##_prepare, SUF)((const fa_##name##_coeffs *)c);            \
        }                                                                                      \
        static __device__ __forceinline__ void apply(const Kc *k, const int flags, C g, C *x,  \
                                                     C *s0, C *s1, C *s2)                      \
        {                                                                                      \
            FA_CAT(fa_##name##_math, SUF)(k, flags, g, x, s0, s1, s2);                         \
        }                                                                                      \
        static __device__ __forceinline__ void idle_rates(const void *c, double *r0, double *r1) \
        {                                                                                      \
            fa_##name##_idle_rates((const fa_##name##_coeffs *)c, r0, r1);                     \
        }                                                                                      \
        static __device__ __forceinline__ int nslots(const int flags)                          \
        {                                                                                      \
            return fa_##name##_nslots(flags);                                                  \
        }                                                                                      \
    };
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    FA_CUDA_OPT(name, K, float, _f32)                                                          \
    FA_CUDA_OPT(name, K, double, _f64)
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
#undef FA_CUDA_OPT

/* The entry of a tensor table (entries sorted by block0) whose block range holds block b: the
 * dense tables and the low-precision ones search alike. */
template <typename T>
static __device__ __forceinline__ const T *fa_find_block(const T *tab, int ntensors, fa_i64 b)
{
    int lo = 0, hi = ntensors - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (tab[mid].block0 <= b) lo = mid;
        else hi = mid - 1;
    }
    return tab + lo;
}

/* The tensor of the dense table whose block range holds block b. */
static __device__ __forceinline__ const fa_cuda_tensor *fa_find_tensor(const unsigned char *table,
                                                                       int ntensors, fa_i64 b)
{
    return fa_find_block((const fa_cuda_tensor *)(table + FA_CUDA_HEADER), ntensors, b);
}

/* One element of the optimizer KIND on storage S: load x and the slots it uses with FLAGS,
 * apply the formula, store. */
template <typename S, int KIND, int FLAGS>
static __device__ __forceinline__ void fa_update_element(
    const typename fa_opt<KIND, typename fa_store<S>::C>::Kc *k, typename fa_store<S>::C g, S *x,
    S *s0, S *s1, S *s2, fa_i64 i)
{
    typedef fa_store<S> io;
    typedef typename io::C C;
    const int nslots = fa_opt<KIND, C>::nslots(FLAGS);
    C xi = io::load(x[i]), a = io::load(s0[i]), b = (C)0, c = (C)0;
    if (nslots > 1) b = io::load(s1[i]);
    if (nslots > 2) c = io::load(s2[i]);
    fa_opt<KIND, C>::apply(k, FLAGS, g, &xi, &a, &b, &c);
    if (nslots > 2) s2[i] = io::save(c);
    if (nslots > 1) s1[i] = io::save(b);
    s0[i] = io::save(a);
    x[i] = io::save(xi);
}

template <typename S, int KIND, int FLAGS>
__global__ void fa_dense_step(const unsigned char *table, int ntensors, const int *skip,
                              int check_skip)
{
    typedef fa_store<S> io;
    typedef typename io::C C;
    if (check_skip && *skip) return;
    const fa_cuda_tensor *e = fa_find_tensor(table, ntensors, (fa_i64)blockIdx.x);
    const fa_i64 begin = ((fa_i64)blockIdx.x - e->block0) * FA_CUDA_CHUNK;
    const fa_i64 end = begin + FA_CUDA_CHUNK < e->n ? begin + FA_CUDA_CHUNK : e->n;
    const typename fa_opt<KIND, C>::Kc k = fa_opt<KIND, C>::prepare(table);
    S *x = (S *)e->x, *s0 = (S *)e->s0, *s1 = (S *)e->s1, *s2 = (S *)e->s2;
    const S *g = (const S *)e->g;
    for (fa_i64 i = begin + threadIdx.x; i < end; i += blockDim.x)
        fa_update_element<S, KIND, FLAGS>(&k, io::load(g[i]), x, s0, s1, s2, i);
}

template <typename S>
__global__ void fa_nonfinite(const unsigned char *table, int ntensors, double grad_scale,
                             int *flag)
{
    typedef fa_store<S> io;
    typedef typename io::C C;
    const fa_cuda_tensor *e = fa_find_tensor(table, ntensors, (fa_i64)blockIdx.x);
    const fa_i64 begin = ((fa_i64)blockIdx.x - e->block0) * FA_CUDA_CHUNK;
    const fa_i64 end = begin + FA_CUDA_CHUNK < e->n ? begin + FA_CUDA_CHUNK : e->n;
    const S *g = (const S *)e->g;
    const C s = (C)grad_scale;
    int bad = 0;
    for (fa_i64 i = begin + threadIdx.x; i < end; i += blockDim.x)
        bad |= !fa_is_finite(io::load(g[i]) / s);
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, 1);
}

/* Element i of a segment's sum: +0, then the rows in their original order. */
template <typename S>
static __device__ __forceinline__ S fa_segment_element(const S *values, fa_i64 row_size,
                                                       const fa_i64 *perm, fa_i64 j0, fa_i64 j1,
                                                       fa_i64 i)
{
    S acc = (S)0;
    for (fa_i64 j = j0; j < j1; j++) acc = acc + values[perm[j] * row_size + i];
    return acc;
}

template <typename S>
__global__ void fa_segment_sum(const S *values, fa_i64 row_size, const fa_i64 *perm,
                               const fa_i64 *offsets, fa_i64 nseg, S *out)
{
    for (fa_i64 s = blockIdx.x; s < nseg; s += gridDim.x)
        for (fa_i64 i = threadIdx.x; i < row_size; i += blockDim.x)
            out[s * row_size + i] =
                fa_segment_element<S>(values, row_size, perm, offsets[s], offsets[s + 1], i);
}

/* slot = rate * slot over `times` idle steps (as sparse_body.h's decay_slot). */
template <typename S>
static __device__ __forceinline__ S fa_decay(S slot, double rate, fa_i64 times)
{
    if (rate == 1.0 || times <= 0) return slot;
    if (times > FA_CATCHUP_EXACT) return slot * (S)pow(rate, (double)times);
    const S r = (S)rate;
    for (fa_i64 q = 0; q < times; q++) slot = r * slot;
    return slot;
}

template <typename S, int KIND, int FLAGS, int CATCHUP>
__global__ void fa_sparse_rows(const unsigned char *coeffs, S *x, S *st0, S *st1,
                               fa_i64 row_size, const S *values, const fa_i64 *perm,
                               const fa_i64 *offsets, const fa_i64 *rows, fa_i64 nseg,
                               fa_i64 *last_step, fa_i64 t)
{
    typedef fa_store<S> io;
    typedef typename io::C C;
    const typename fa_opt<KIND, C>::Kc k = fa_opt<KIND, C>::prepare(coeffs);
    double r0 = 1.0, r1 = 1.0;
    if (CATCHUP) fa_opt<KIND, C>::idle_rates(coeffs, &r0, &r1);
    __shared__ fa_i64 idle;
    for (fa_i64 s = blockIdx.x; s < nseg; s += gridDim.x) {
        const fa_i64 r = rows[s];
        if (CATCHUP) {
            if (threadIdx.x == 0) {
                idle = t - 1 - last_step[r];
                last_step[r] = t;
            }
            __syncthreads();
        }
        const fa_i64 at = r * row_size;
        for (fa_i64 i = threadIdx.x; i < row_size; i += blockDim.x) {
            if (CATCHUP) {
                st0[at + i] = fa_decay<S>(st0[at + i], r0, idle);
                if (fa_opt<KIND, C>::nslots(FLAGS) > 1)
                    st1[at + i] = fa_decay<S>(st1[at + i], r1, idle);
            }
            const S g =
                fa_segment_element<S>(values, row_size, perm, offsets[s], offsets[s + 1], i);
            S *const b1 = fa_opt<KIND, C>::nslots(FLAGS) > 1 ? st1 + at : st0 + at;
            fa_update_element<S, KIND, FLAGS>(&k, g, x + at, st0 + at, b1, (S *)0, i);
        }
        if (CATCHUP) __syncthreads(); /* `idle` is rewritten by the next segment */
    }
}

template <typename S, int KIND, int FLAGS>
__global__ void fa_sparse_dense(const unsigned char *coeffs, S *x, S *st0, S *st1,
                                fa_i64 row_size, fa_i64 n_rows, const S *values,
                                const fa_i64 *perm, const fa_i64 *offsets,
                                const fa_i64 *seg_of_row)
{
    typedef fa_store<S> io;
    typedef typename io::C C;
    const typename fa_opt<KIND, C>::Kc k = fa_opt<KIND, C>::prepare(coeffs);
    for (fa_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const fa_i64 s = seg_of_row[r];
        const fa_i64 j0 = s >= 0 ? offsets[s] : 0, j1 = s >= 0 ? offsets[s + 1] : 0;
        const fa_i64 at = r * row_size;
        for (fa_i64 i = threadIdx.x; i < row_size; i += blockDim.x) {
            const S g = fa_segment_element<S>(values, row_size, perm, j0, j1, i);
            S *const b1 = fa_opt<KIND, C>::nslots(FLAGS) > 1 ? st1 + at : st0 + at;
            fa_update_element<S, KIND, FLAGS>(&k, g, x + at, st0 + at, b1, (S *)0, i);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Row-wise optimizers (FA_ROWWISE_OPTIMIZER rows of optimizers.def: one state value per row).
 * Their formula is a row function (rowwise_adagrad.h: a fixed-order sum over the row, then the
 * row's update), so these kernels give each row to one thread, which calls it: the same
 * operations in the same order as the CPU kernels (rowwise_body.h), hence the same bits.
 * float32 and float64 only (S is the compute type).
 *
 *   fa_rowwise_dense<S, KIND, FLAGS>(coeffs, x, g, acc, n_rows, row_size)
 *       Thread r (over the grid) updates row r of the packed (n_rows, row_size) x with g's
 *       row r and its accumulator acc[r].  IN g; IN/OUT x, acc.
 *   fa_rowwise_rows<S, KIND, FLAGS, CATCHUP>(coeffs, x, acc, row_size, sums, rows, nseg,
 *                                             last_step, t)
 *       Lazy sparse step: thread s updates row rows[s] with sums[s] (fa_segment_sum's output,
 *       one row per distinct index); CATCHUP also sets last_step[rows[s]] = t (an accumulator
 *       never decays).
 *   fa_rowwise_all<S, KIND, FLAGS>(coeffs, x, acc, row_size, n_rows, sums, zeros, seg_of_row)
 *       Dense-mode sparse step: thread r updates row r with sums[seg_of_row[r]] when it is
 *       >= 0, else with `zeros` (a row of +0), as the CPU's dense mode.
 * ------------------------------------------------------------------------------------------ */
template <int KIND, typename C> struct fa_row_opt;
#define FA_CUDA_ROW_OPT(name, K, C, SUF)                                                       \
    template <> struct fa_row_opt<FA_OPT_##K, C> {                                             \
        typedef FA_CAT(fa_##name##_k, SUF) Kc;                                                 \
        static __device__ __forceinline__ Kc prepare(const void *c)                            \
        {                                                                                      \
            return FA_CAT(fa_##name##_prepare, SUF)((const fa_##name##_coeffs *)c);            \
        }                                                                                      \
        static __device__ __forceinline__ void row(const Kc *k, const int flags, const C *g,   \
                                                   C *x, C *a, fa_i64 n)                       \
        {                                                                                      \
            FA_CAT(fa_##name##_row, SUF)(k, flags, g, x, a, n);                                \
        }                                                                                      \
    };
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    FA_CUDA_ROW_OPT(name, K, float, _f32)                                                      \
    FA_CUDA_ROW_OPT(name, K, double, _f64)
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
#undef FA_CUDA_ROW_OPT

template <typename S, int KIND, int FLAGS>
__global__ void fa_rowwise_dense(const unsigned char *coeffs, S *x, const S *g, S *acc,
                                 fa_i64 n_rows, fa_i64 row_size)
{
    const typename fa_row_opt<KIND, S>::Kc k = fa_row_opt<KIND, S>::prepare(coeffs);
    const fa_i64 step = (fa_i64)gridDim.x * blockDim.x;
    for (fa_i64 r = (fa_i64)blockIdx.x * blockDim.x + threadIdx.x; r < n_rows; r += step)
        fa_row_opt<KIND, S>::row(&k, FLAGS, g + r * row_size, x + r * row_size, acc + r,
                                 row_size);
}

template <typename S, int KIND, int FLAGS, int CATCHUP>
__global__ void fa_rowwise_rows(const unsigned char *coeffs, S *x, S *acc, fa_i64 row_size,
                                const S *sums, const fa_i64 *rows, fa_i64 nseg,
                                fa_i64 *last_step, fa_i64 t)
{
    const typename fa_row_opt<KIND, S>::Kc k = fa_row_opt<KIND, S>::prepare(coeffs);
    const fa_i64 step = (fa_i64)gridDim.x * blockDim.x;
    for (fa_i64 s = (fa_i64)blockIdx.x * blockDim.x + threadIdx.x; s < nseg; s += step) {
        const fa_i64 r = rows[s];
        fa_row_opt<KIND, S>::row(&k, FLAGS, sums + s * row_size, x + r * row_size, acc + r,
                                 row_size);
        if (CATCHUP) last_step[r] = t;
    }
}

template <typename S, int KIND, int FLAGS>
__global__ void fa_rowwise_all(const unsigned char *coeffs, S *x, S *acc, fa_i64 row_size,
                               fa_i64 n_rows, const S *sums, const S *zeros,
                               const fa_i64 *seg_of_row)
{
    const typename fa_row_opt<KIND, S>::Kc k = fa_row_opt<KIND, S>::prepare(coeffs);
    const fa_i64 step = (fa_i64)gridDim.x * blockDim.x;
    for (fa_i64 r = (fa_i64)blockIdx.x * blockDim.x + threadIdx.x; r < n_rows; r += step) {
        const fa_i64 s = seg_of_row[r];
        fa_row_opt<KIND, S>::row(&k, FLAGS, s >= 0 ? sums + s * row_size : zeros,
                                 x + r * row_size, acc + r, row_size);
    }
}

/* ------------------------------------------------------------------------------------------
 * Low-precision formats (issue 24).  The formats, conversions, stochastic-rounding bits, maps
 * and code search are fastadam/lowp.h's (shared with the CPU kernels, lowp.c); the update is the
 * optimizer's fa_<name>_math_f32.  Every element is computed in float32, so the bits equal the
 * CPU driver's (fastadam/_core/_lowp.pyx): bfloat16 or 8-bit block-quantized state slots,
 * float32 or bfloat16 parameters (nearest or stochastic rounding, or a float32 master copy that
 * is the x updated, its nearest bfloat16 written beside it), float32 or bfloat16 gradients.
 *
 *   fa_lowp_dense<SF, KIND, FLAGS>(table, ntensors, skip, check_skip)
 *       The dense step of a list of tensors with state format SF (FA_FMT_F32, _BF16, _Q8), one
 *       launch.  `table` (laid out by fastadam/gpu/_layout.py): the coefficient struct in its
 *       first FA_CUDA_HEADER bytes, then an fa_lowp_params (FA_LOWP_PARAMS bytes), then
 *       `ntensors` fa_lowp_tensor entries (increasing block0).  Block b updates elements
 *       [(b - block0) * span, +span) of its tensor: with SF == FA_FMT_Q8, span is a multiple
 *       of the quantization block (about 1024 elements, so that the maps are copied to shared
 *       memory once per span and a large tensor still makes several waves of blocks) and the thread block does its quantization blocks one
 *       after another (dequantize, update, keep the new states in registers, reduce the block's
 *       absmax by warp shuffles and shared memory, requantize); otherwise span = FA_CUDA_CHUNK.
 *       blockDim.x is a multiple of 32, <= FA_LOWP_THREADS, and for
 *       FA_FMT_Q8 blockDim.x * FA_Q8_PER_THREAD >= the quantization block.  If check_skip and
 *       *skip != 0, nothing is written.
 *   fa_lowp_rows<SF, KIND, FLAGS>(table, rows, nrows, row_size)
 *       The lazy sparse step: the table's one entry is the (R, row_size) parameter table, its g
 *       the (nrows, row_size) coalesced float32 gradient rows of the sorted distinct `rows`.
 *       Block b (looping by gridDim) updates part b % parts of row rows[b / parts], where
 *       parts = row_size / block for FA_FMT_Q8 (the block divides row_size), else 1.
 *   fa_lowp_nonfinite<GF>(table, ntensors, grad_scale, flag)
 *       fa_nonfinite over the low-precision table: gradients in format GF (float32 or bfloat16),
 *       converted to float32 and divided by (float)grad_scale, as the CPU driver checks them.
 * Stochastic rounding: element j (flat index in its tensor; row * row_size + column for the
 * rows step) of the tensor at position `index` rounds with fa_sr_bits(K, j), K = fa_sr_key(seed,
 * t, index): nothing else enters.
 * The 8-bit scale of a block is the largest |y| taken as an integer max of the bits without
 * the sign (exact and independent of the reduction's order; a NaN wins, as in lowp.c).
 * ------------------------------------------------------------------------------------------ */
#include "fastadam/lowp.h"

#define FA_LOWP_PARAMS 64   /* bytes of fa_lowp_params after the coefficient struct */
#define FA_LOWP_TABLE 192   /* FA_CUDA_HEADER + FA_LOWP_PARAMS: the first tensor entry */
#define FA_LOWP_THREADS 1024 /* the most threads per block of the low-precision kernels */
#define FA_Q8_PER_THREAD 4   /* the most elements of one quantization block per thread */
#define FA_LOWP_UNROLL 4     /* elements per thread loaded together by fa_lowp_elementwise */
/* The kernels below are compiled with __launch_bounds__(FA_LOWP_THREADS), so that a launch with
 * that many threads (8-bit blocks of 4096) never asks for more registers than a block has. */

typedef struct {
    int param_fmt;   /* FA_FMT_F32 or FA_FMT_BF16 */
    int grad_fmt;    /* FA_FMT_F32 or FA_FMT_BF16 */
    int rounding;    /* FA_ROUND_NEAREST or FA_ROUND_STOCHASTIC (bf16 parameters, no master) */
    int has_master;  /* bf16 parameters with a float32 master copy */
    int signed_mask; /* bit s: slot s takes the signed map (FA_FMT_Q8) */
    int block;       /* quantization block (FA_FMT_Q8) */
    int span;        /* elements per thread block of fa_lowp_dense */
    int qmap;        /* FA_MAP_DYNAMIC or FA_MAP_LINEAR */
    fa_u32 seed_lo, seed_hi, t; /* stochastic rounding: the seed's halves, the step (mod 2^32) */
    int unused[5];
} fa_lowp_params;

/* One tensor of a low-precision table (16 words). */
typedef struct {
    fa_i64 x, g, master;        /* device addresses; master 0 when none */
    fa_i64 s[FA_MAX_SLOTS];     /* state slots (uint8 codes for FA_FMT_Q8); unused ones 0 */
    fa_i64 scale[FA_MAX_SLOTS]; /* float32 scale per quantization block (FA_FMT_Q8) */
    fa_i64 n;                   /* elements, >= 1 */
    fa_i64 block0;              /* first thread block of this tensor (fa_lowp_dense) */
    fa_i64 index;               /* the tensor's position in the step's list (0: rows step) */
    fa_i64 unused[4];
} fa_lowp_tensor;

static __device__ __forceinline__ const fa_lowp_params *fa_lowp_params_of(const unsigned char *t)
{
    return (const fa_lowp_params *)(t + FA_CUDA_HEADER);
}

static __device__ __forceinline__ const fa_lowp_tensor *fa_lowp_find(const unsigned char *table,
                                                                     int ntensors, fa_i64 b)
{
    return fa_find_block((const fa_lowp_tensor *)(table + FA_LOWP_TABLE), ntensors, b);
}

/* Element i of a float32 or bfloat16 array, as float32. */
static __device__ __forceinline__ float fa_lowp_load(const void *p, int fmt, fa_i64 i)
{
    if (fmt == FA_FMT_BF16) return fa_bf16_to_f32(((const fa_u16 *)p)[i]);
    return ((const float *)p)[i];
}

/* The parameter of element i as the formula reads it: the master when there is one. */
static __device__ __forceinline__ float fa_lowp_load_x(const fa_lowp_params *p,
                                                       const fa_lowp_tensor *e, fa_i64 i)
{
    if (p->has_master) return ((const float *)e->master)[i];
    return fa_lowp_load((const void *)e->x, p->param_fmt, i);
}

/* Write the new parameter of element i: float32; bf16 nearest or stochastic (with the tensor's
 * rounding key, fa_lowp_key); or the master and its nearest bf16 copy. */
static __device__ __forceinline__ void fa_lowp_store_x(const fa_lowp_params *p,
                                                       const fa_lowp_tensor *e, fa_u32 key,
                                                       fa_i64 i, float x)
{
    if (p->param_fmt == FA_FMT_F32) {
        ((float *)e->x)[i] = x;
        return;
    }
    fa_u16 *xb = (fa_u16 *)e->x;
    if (p->has_master) {
        ((float *)e->master)[i] = x;
        xb[i] = fa_bf16_nearest(x);
    } else if (p->rounding == FA_ROUND_STOCHASTIC) {
        xb[i] = fa_bf16_stochastic(x, fa_sr_bits(key, (fa_u32)i));
    } else {
        xb[i] = fa_bf16_nearest(x);
    }
}

/* The stochastic-rounding key of tensor e in this step (once per thread block). */
static __device__ __forceinline__ fa_u32 fa_lowp_key(const fa_lowp_params *p,
                                                     const fa_lowp_tensor *e)
{
    return fa_sr_key(p->seed_lo, p->seed_hi, p->t, (fa_u32)e->index);
}

/* Elements [begin, end) of tensor e with float32 or bfloat16 states (SF); the gradient of
 * element i is gbase[i - gorigin], in format gfmt. */
template <int SF, int KIND, int FLAGS>
static __device__ __forceinline__ void fa_lowp_elementwise(
    const typename fa_opt<KIND, float>::Kc *k, const fa_lowp_params *p, const fa_lowp_tensor *e,
    fa_u32 key, const void *gbase, fa_i64 gorigin, int gfmt, fa_i64 begin, fa_i64 end)
{
    const int nslots = fa_opt<KIND, float>::nslots(FLAGS);
    const fa_i64 stride = blockDim.x;
    for (fa_i64 base = begin + threadIdx.x; base < end; base += FA_LOWP_UNROLL * stride) {
        /* the loads of FA_LOWP_UNROLL elements first, so that they are in flight together (the
         * compiler may not move a load above a store through another pointer) */
        float st[FA_LOWP_UNROLL][FA_MAX_SLOTS], x[FA_LOWP_UNROLL], g[FA_LOWP_UNROLL];
#pragma unroll
        for (int u = 0; u < FA_LOWP_UNROLL; u++) {
            const fa_i64 i = base + u * stride;
            st[u][0] = st[u][1] = st[u][2] = 0.0f;
            x[u] = g[u] = 0.0f;
            if (i < end) {
                for (int s = 0; s < nslots; s++)
                    st[u][s] = fa_lowp_load((const void *)e->s[s], SF, i);
                x[u] = fa_lowp_load_x(p, e, i);
                g[u] = fa_lowp_load(gbase, gfmt, i - gorigin);
            }
        }
#pragma unroll
        for (int u = 0; u < FA_LOWP_UNROLL; u++) {
            const fa_i64 i = base + u * stride;
            if (i >= end) break;
            fa_opt<KIND, float>::apply(k, FLAGS, g[u], &x[u], &st[u][0], &st[u][1], &st[u][2]);
            for (int s = 0; s < nslots; s++) {
                if (SF == FA_FMT_BF16) ((fa_u16 *)e->s[s])[i] = fa_bf16_nearest(st[u][s]);
                else ((float *)e->s[s])[i] = st[u][s];
            }
            fa_lowp_store_x(p, e, key, i, x[u]);
        }
    }
}

/* The maps and thresholds of both signs, copied to shared memory by the whole block. */
typedef struct {
    float map[2][256]; /* [0] unsigned, [1] signed */
    float thr[2][256];
} fa_lowp_maps;

static __device__ __forceinline__ void fa_lowp_load_maps(int qmap, fa_lowp_maps *to)
{
    for (int i = threadIdx.x; i < 2 * 256; i += blockDim.x) {
        to->map[i >> 8][i & 255] = fa_lowp_map(qmap, i >> 8)[i & 255];
        to->thr[i >> 8][i & 255] = fa_lowp_thresholds(qmap, i >> 8)[i & 255];
    }
    __syncthreads();
}

/* The largest v of the 32 lanes of a warp, in every lane (all lanes call it). */
static __device__ __forceinline__ fa_u32 fa_lowp_warp_max(fa_u32 v)
{
    for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
        const fa_u32 other = __shfl_xor_sync(0xffffffffu, v, lane_mask);
        v = other > v ? other : v;
    }
    return v;
}

/* One quantization block [begin, begin + len) of tensor e with 8-bit states; the gradient of
 * element i is gbase[i - gorigin].  Every thread of the block calls it (it holds barriers). */
template <int KIND, int FLAGS>
static __device__ __forceinline__ void fa_lowp_q8_block(
    const typename fa_opt<KIND, float>::Kc *k, const fa_lowp_params *p, const fa_lowp_maps *maps,
    const fa_lowp_tensor *e, fa_u32 key, const void *gbase, fa_i64 gorigin, int gfmt,
    fa_i64 begin, int len)
{
    const int nslots = fa_opt<KIND, float>::nslots(FLAGS);
    const fa_i64 qb = begin / p->block;
    const int tid = threadIdx.x, nt = blockDim.x;
    __shared__ fa_u32 warp_peak[FA_MAX_SLOTS][FA_LOWP_THREADS / 32];
    float scale[FA_MAX_SLOTS];
    fa_u32 peak[FA_MAX_SLOTS] = {0u, 0u, 0u};
    for (int s = 0; s < nslots; s++) scale[s] = ((const float *)e->scale[s])[qb];
    float y[FA_Q8_PER_THREAD][FA_MAX_SLOTS], x[FA_Q8_PER_THREAD], g[FA_Q8_PER_THREAD];
    /* every load first (in flight together), then the updates */
#pragma unroll
    for (int q = 0; q < FA_Q8_PER_THREAD; q++) {
        const int at = q * nt + tid;
        y[q][0] = y[q][1] = y[q][2] = 0.0f;
        x[q] = g[q] = 0.0f;
        if (at < len) {
            const fa_i64 i = begin + at;
            for (int s = 0; s < nslots; s++)
                y[q][s] = fa_lowp_dequantize(((const fa_u8 *)e->s[s])[i], scale[s],
                                             maps->map[(p->signed_mask >> s) & 1]);
            x[q] = fa_lowp_load_x(p, e, i);
            g[q] = fa_lowp_load(gbase, gfmt, i - gorigin);
        }
    }
#pragma unroll
    for (int q = 0; q < FA_Q8_PER_THREAD; q++) {
        const int at = q * nt + tid;
        if (at >= len) break;
        fa_opt<KIND, float>::apply(k, FLAGS, g[q], &x[q], &y[q][0], &y[q][1], &y[q][2]);
        fa_lowp_store_x(p, e, key, begin + at, x[q]);
        for (int s = 0; s < nslots; s++) {
            const fa_u32 a = fa_lowp_abs_bits(y[q][s]);
            peak[s] = a > peak[s] ? a : peak[s];
        }
    }
    /* the block's absmax of each slot: within each warp by shuffles, then every warp reduces
     * the warps' maxima the same way (all threads take part: no divergent shuffle) */
    const int lane = tid & 31, nwarps = nt >> 5;
    for (int s = 0; s < nslots; s++) {
        const fa_u32 w = fa_lowp_warp_max(peak[s]);
        if (lane == 0) warp_peak[s][tid >> 5] = w;
    }
    __syncthreads();
    float inv[FA_MAX_SLOTS];
    for (int s = 0; s < nslots; s++) {
        scale[s] = fa_lowp_scale_of(fa_lowp_warp_max(lane < nwarps ? warp_peak[s][lane] : 0u));
        inv[s] = fa_lowp_inverse(scale[s]);
    }
    __syncthreads(); /* warp_peak is rewritten by the next quantization block */
#pragma unroll
    for (int q = 0; q < FA_Q8_PER_THREAD; q++) {
        const int at = q * nt + tid;
        if (at >= len) break;
        for (int s = 0; s < nslots; s++)
            ((fa_u8 *)e->s[s])[begin + at] =
                fa_lowp_quantize(y[q][s], inv[s], maps->thr[(p->signed_mask >> s) & 1]);
    }
    if (tid == 0)
        for (int s = 0; s < nslots; s++) ((float *)e->scale[s])[qb] = scale[s];
}

template <int SF, int KIND, int FLAGS>
__global__ void __launch_bounds__(FA_LOWP_THREADS) fa_lowp_dense(const unsigned char *table, int ntensors, const int *skip,
                              int check_skip)
{
    if (check_skip && *skip) return;
    const fa_lowp_params *p = fa_lowp_params_of(table);
    const fa_lowp_tensor *e = fa_lowp_find(table, ntensors, (fa_i64)blockIdx.x);
    const fa_i64 begin = ((fa_i64)blockIdx.x - e->block0) * p->span;
    const fa_i64 end = begin + p->span < e->n ? begin + p->span : e->n;
    const typename fa_opt<KIND, float>::Kc k = fa_opt<KIND, float>::prepare(table);
    const fa_u32 key = fa_lowp_key(p, e);
    if (SF == FA_FMT_Q8) {
        __shared__ fa_lowp_maps maps;
        fa_lowp_load_maps(p->qmap, &maps);
        for (fa_i64 at = begin; at < end; at += p->block)
            fa_lowp_q8_block<KIND, FLAGS>(&k, p, &maps, e, key, (const void *)e->g, 0,
                                          p->grad_fmt, at,
                                          (int)(end - at < p->block ? end - at : p->block));
    } else {
        fa_lowp_elementwise<SF, KIND, FLAGS>(&k, p, e, key, (const void *)e->g, 0, p->grad_fmt,
                                             begin, end);
    }
}

template <int SF, int KIND, int FLAGS>
__global__ void __launch_bounds__(FA_LOWP_THREADS) fa_lowp_rows(const unsigned char *table, const fa_i64 *rows, fa_i64 nrows,
                             fa_i64 row_size)
{
    const fa_lowp_params *p = fa_lowp_params_of(table);
    const fa_lowp_tensor *e = fa_lowp_find(table, 1, 0);
    const fa_i64 parts = SF == FA_FMT_Q8 ? row_size / p->block : 1;
    const typename fa_opt<KIND, float>::Kc k = fa_opt<KIND, float>::prepare(table);
    const fa_u32 key = fa_lowp_key(p, e);
    if (SF == FA_FMT_Q8) {
        __shared__ fa_lowp_maps maps;
        fa_lowp_load_maps(p->qmap, &maps);
        for (fa_i64 b = blockIdx.x; b < nrows * parts; b += gridDim.x) {
            const fa_i64 ri = b / parts, origin = rows[ri] * row_size;
            fa_lowp_q8_block<KIND, FLAGS>(&k, p, &maps, e, key,
                                          (const float *)e->g + ri * row_size, origin,
                                          FA_FMT_F32, origin + (b % parts) * p->block, p->block);
        }
    } else {
        for (fa_i64 ri = blockIdx.x; ri < nrows; ri += gridDim.x) {
            const fa_i64 origin = rows[ri] * row_size;
            fa_lowp_elementwise<SF, KIND, FLAGS>(&k, p, e, key,
                                                 (const float *)e->g + ri * row_size, origin,
                                                 FA_FMT_F32, origin, origin + row_size);
        }
    }
}

template <int GF>
__global__ void __launch_bounds__(FA_LOWP_THREADS) fa_lowp_nonfinite(const unsigned char *table, int ntensors, double grad_scale,
                                  int *flag)
{
    const fa_lowp_params *p = fa_lowp_params_of(table);
    const fa_lowp_tensor *e = fa_lowp_find(table, ntensors, (fa_i64)blockIdx.x);
    const fa_i64 begin = ((fa_i64)blockIdx.x - e->block0) * p->span;
    const fa_i64 end = begin + p->span < e->n ? begin + p->span : e->n;
    const float s = (float)grad_scale;
    int bad = 0;
    for (fa_i64 i = begin + threadIdx.x; i < end; i += blockDim.x)
        bad |= !fa_is_finite(fa_lowp_load((const void *)e->g, GF, i) / s);
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, 1);
}
