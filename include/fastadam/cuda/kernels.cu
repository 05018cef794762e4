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
 *
 * Thread safety: each kernel writes disjoint elements per thread; launches are ordered on the
 * caller's CuPy stream.
 */
#include "fastadam/formulas.h"

#define FA_CUDA_HEADER 128  /* bytes reserved for the coefficient struct at the table's start */
#define FA_CUDA_CHUNK 4096  /* elements per block of the dense step */
#define FA_CATCHUP_EXACT 64 /* as include/fastadam/sparse.h */

typedef long long fa_i64;

/* One tensor of a multi-tensor table (64 bytes; fastadam/gpu/_launch.py writes the same layout). */
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

/* The tensor of the table whose block range holds block b (entries sorted by block0). */
static __device__ __forceinline__ const fa_cuda_tensor *fa_find_tensor(const unsigned char *table,
                                                                       int ntensors, fa_i64 b)
{
    const fa_cuda_tensor *tab = (const fa_cuda_tensor *)(table + FA_CUDA_HEADER);
    int lo = 0, hi = ntensors - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (tab[mid].block0 <= b) lo = mid;
        else hi = mid - 1;
    }
    return tab + lo;
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
