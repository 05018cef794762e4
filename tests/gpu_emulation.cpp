// tests/gpu_emulation.cpp -- include/fastadam/cuda/kernels.cu compiled as C++ for the host, so
// that a machine without a GPU can run the GPU kernels (tests/test_gpu_emulation.py).
//
// The CUDA keywords become nothing, blockIdx/threadIdx/blockDim/gridDim are globals, and a
// launch runs its blocks one after another and each block's threads one after another.  That is
// a faithful schedule for these kernels when (a) __syncthreads_or is only used with one thread
// per block (the non-finite reduction is launched with blockDim 1 here) and (b) a block of
// fa_sparse_rows handles one segment (grid >= nseg): thread 0 then writes the block's shared
// `idle` before the other threads read it.  The low-precision kernels (fa_lowp_*) hold real
// barriers and warp shuffles (the 8-bit block's absmax is reduced between two phases), so they
// are launched on fibers instead (launch_fibers: one ucontext per thread of the block, switched at
// every __syncthreads, round-robin; each round takes every thread to its next barrier, as a
// barrier does).  What it cannot show: races, the real launch limits, NVRTC itself
// (test_gpu_compile.py compiles the same source with NVRTC).
//
// Built by the test with: g++ -std=c++17 -O1 -ffp-contract=off -shared -fPIC -I include
#include <cmath>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <utility>
#include <vector>

#define FA_CUDA_HOST_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(threads)

struct fa_emu_dim3 { unsigned x = 0, y = 0, z = 0; };
static fa_emu_dim3 blockIdx, threadIdx, blockDim, gridDim;
// Fibers of launch_fibers: while they run, __syncthreads switches back to the scheduler.
static bool emu_on_fibers = false;
static ucontext_t emu_scheduler;
static std::vector<ucontext_t> emu_fiber;
static std::vector<int> emu_finished;
static unsigned emu_current = 0;
static inline void __syncthreads()
{
    if (emu_on_fibers) swapcontext(&emu_fiber[emu_current], &emu_scheduler);
}
// A warp shuffle on fibers: every thread of the block calls it at the same point (the kernels
// only shuffle where all threads do), so two barriers around an exchange array are faithful.
static unsigned emu_exchange[1024];
static inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask)
{
    (void)mask;
    emu_exchange[emu_current] = v;
    __syncthreads();
    const unsigned other = emu_exchange[emu_current ^ (unsigned)lane_mask];
    __syncthreads();
    return other;
}
static inline int __syncthreads_or(int p) { return p; }  // one thread per block only
static inline int atomicOr(int *a, int v) { const int old = *a; *a |= v; return old; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }

#include "fastadam/cuda/kernels.cu"

template <typename F> static void launch(long long grid, unsigned block, F body)
{
    gridDim.x = (unsigned)grid;
    blockDim.x = block;
    for (long long b = 0; b < grid; b++) {
        blockIdx.x = (unsigned)b;
        for (unsigned t = 0; t < block; t++) {
            threadIdx.x = t;
            body();
        }
    }
}

// One launch whose threads meet at barriers: each block's threads are fibers with their own
// stacks, run round-robin, each up to its next __syncthreads (or its end).
static const std::function<void()> *emu_body = nullptr;
static void emu_fiber_entry()
{
    (*emu_body)();
    emu_finished[emu_current] = 1;  // then uc_link resumes the scheduler
}

template <typename F> static void launch_fibers(long long grid, unsigned block, F body)
{
    static std::vector<char> stacks;
    const size_t stack = 64 * 1024;  // up to FA_LOWP_THREADS (1024) fibers
    const std::function<void()> fn = body;
    emu_body = &fn;
    if (stacks.size() < block * stack) stacks.resize(block * stack);
    emu_fiber.resize(block);
    emu_finished.assign(block, 0);
    gridDim.x = (unsigned)grid;
    blockDim.x = block;
    emu_on_fibers = true;
    for (long long b = 0; b < grid; b++) {
        blockIdx.x = (unsigned)b;
        for (unsigned t = 0; t < block; t++) {
            getcontext(&emu_fiber[t]);
            emu_fiber[t].uc_stack.ss_sp = stacks.data() + t * stack;
            emu_fiber[t].uc_stack.ss_size = stack;
            emu_fiber[t].uc_link = &emu_scheduler;
            makecontext(&emu_fiber[t], emu_fiber_entry, 0);
            emu_finished[t] = 0;
        }
        for (bool running = true; running;) {
            running = false;
            for (unsigned t = 0; t < block; t++) {
                if (emu_finished[t]) continue;
                emu_current = t;
                threadIdx.x = t;
                swapcontext(&emu_scheduler, &emu_fiber[t]);
                running = running || !emu_finished[t];
            }
        }
    }
    emu_on_fibers = false;
}

// The arguments of one launch, so that the dispatch below stays short.
struct DenseArgs {
    const unsigned char *table;
    int n;
    long long nblocks;
    const int *skip;
    int check;
    unsigned threads;
};
struct SparseArgs {
    int mode; /* 0 lazy (rows_or_seg = rows), 1 dense (= seg_of_row), 2 catchup (= rows) */
    const unsigned char *coeffs;
    void *x, *st0, *st1;
    long long row_size, n_rows;
    const void *values;
    const long long *perm, *offsets, *rows_or_seg;
    long long nseg;
    long long *last_step;
    long long t;
    unsigned threads;
};

// Runtime (storage, kind, flags) -> the template instantiation, by a fold over the flag values.
template <typename S, int KIND, int F> static void dense_one(const DenseArgs &a)
{
    launch(a.nblocks, a.threads,
           [&] { fa_dense_step<S, KIND, F>(a.table, a.n, a.skip, a.check); });
}

template <typename S, int KIND, int... F>
static void dense_flags(int flags, std::integer_sequence<int, F...>, const DenseArgs &a)
{
    ((flags == F ? dense_one<S, KIND, F>(a) : void()), ...);
}

template <typename S> static void dense_kind(int kind, int flags, const DenseArgs &a)
{
    const auto all = std::make_integer_sequence<int, 16>();
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K) dense_flags<S, FA_OPT_##K>(flags, all, a);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
}

template <typename S, int KIND, int F> static void sparse_one(const SparseArgs &a)
{
    S *x = (S *)a.x, *s0 = (S *)a.st0, *s1 = (S *)a.st1;
    const S *v = (const S *)a.values;
    if (a.mode == 0)
        launch(a.nseg, a.threads, [&] {
            fa_sparse_rows<S, KIND, F, 0>(a.coeffs, x, s0, s1, a.row_size, v, a.perm, a.offsets,
                                          a.rows_or_seg, a.nseg, a.last_step, a.t);
        });
    if (a.mode == 2)
        launch(a.nseg, a.threads, [&] {
            fa_sparse_rows<S, KIND, F, 1>(a.coeffs, x, s0, s1, a.row_size, v, a.perm, a.offsets,
                                          a.rows_or_seg, a.nseg, a.last_step, a.t);
        });
    if (a.mode == 1)
        launch(a.n_rows, a.threads, [&] {
            fa_sparse_dense<S, KIND, F>(a.coeffs, x, s0, s1, a.row_size, a.n_rows, v, a.perm,
                                        a.offsets, a.rows_or_seg);
        });
}

template <typename S, int KIND, int... F>
static void sparse_flags(int flags, std::integer_sequence<int, F...>, const SparseArgs &a)
{
    ((flags == F ? sparse_one<S, KIND, F>(a) : void()), ...);
}

template <typename S> static void sparse_kind(int kind, int flags, const SparseArgs &a)
{
    const auto fl = std::integer_sequence<int, 0, 1, 4, 5, 8, 9, 12, 13>();  // never FA_SCALE
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K) sparse_flags<S, FA_OPT_##K>(flags, fl, a);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
}

// The low-precision kernels: runtime (state format, kind, flags) -> instantiation, only the
// flag sets of the kind's mask (DENSE_MASK or SPARSE_MASK of optimizers.def).
struct LowpArgs {
    const unsigned char *table;
    int n;
    long long grid;
    const int *skip;
    int check;
    const long long *rows;
    long long nrows, row_size;
    unsigned threads;
};

template <int SF, int KIND, int MASK, int ROWS, int... F>
static void lowp_flags(int flags, std::integer_sequence<int, F...>, const LowpArgs &a)
{
    auto one = [&](auto fc) {
        constexpr int FL = decltype(fc)::value;
        if constexpr ((FL & ~MASK) == 0) {
            if (flags != FL) return;
            if (ROWS)
                launch_fibers(a.grid, a.threads, [&] {
                    fa_lowp_rows<SF, KIND, FL>(a.table, a.rows, a.nrows, a.row_size);
                });
            else
                launch_fibers(a.grid, a.threads, [&] {
                    fa_lowp_dense<SF, KIND, FL>(a.table, a.n, a.skip, a.check);
                });
        }
    };
    (one(std::integral_constant<int, F>()), ...);
}

template <int SF, int ROWS> static void lowp_kind(int kind, int flags, const LowpArgs &a)
{
    const auto all = std::make_integer_sequence<int, 16>();
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                         \
    if (kind == FA_OPT_##K)                                                                    \
        lowp_flags<SF, FA_OPT_##K, ROWS ? (SPARSE_MASK) : (DENSE_MASK), ROWS>(flags, all, a);
#include "fastadam/optimizers.def"
#undef FA_OPTIMIZER
}

template <int ROWS> static void lowp_state(int state, int kind, int flags, const LowpArgs &a)
{
    if (state == FA_FMT_F32) lowp_kind<FA_FMT_F32, ROWS>(kind, flags, a);
    if (state == FA_FMT_BF16) lowp_kind<FA_FMT_BF16, ROWS>(kind, flags, a);
    if (state == FA_FMT_Q8) lowp_kind<FA_FMT_Q8, ROWS>(kind, flags, a);
}

// The row-wise kernels (fa_rowwise_*, one thread per row): runtime (storage, kind, flags) ->
// instantiation, the flag sets of the kind's DENSE_MASK or SPARSE_MASK.
struct RowwiseArgs {
    int mode;  // -1 the dense step; 0 lazy, 1 dense mode, 2 catchup (the sparse step)
    const unsigned char *coeffs;
    void *x;
    const void *g;  // the dense step's gradient, or the segment sums of the sparse step
    void *acc;
    const void *zeros;  // dense mode: a row of +0
    long long n_rows, row_size;
    const long long *rows_or_seg;
    long long nseg;
    long long *last_step;
    long long t;
    unsigned threads;
};

template <typename S, int KIND, int MASK, int... F>
static void rowwise_flags(int flags, std::integer_sequence<int, F...>, const RowwiseArgs &a)
{
    auto one = [&](auto fc) {
        constexpr int FL = decltype(fc)::value;
        if constexpr ((FL & ~MASK) == 0) {
            if (flags != FL) return;
            S *x = (S *)a.x, *acc = (S *)a.acc;
            const S *g = (const S *)a.g;
            const long long grid = ((a.mode == 0 || a.mode == 2 ? a.nseg : a.n_rows)
                                    + a.threads - 1) / a.threads;
            if (a.mode == -1)
                launch(grid, a.threads, [&] {
                    fa_rowwise_dense<S, KIND, FL>(a.coeffs, x, g, acc, a.n_rows, a.row_size);
                });
            if (a.mode == 0)
                launch(grid, a.threads, [&] {
                    fa_rowwise_rows<S, KIND, FL, 0>(a.coeffs, x, acc, a.row_size, g,
                                                    a.rows_or_seg, a.nseg, a.last_step, a.t);
                });
            if (a.mode == 2)
                launch(grid, a.threads, [&] {
                    fa_rowwise_rows<S, KIND, FL, 1>(a.coeffs, x, acc, a.row_size, g,
                                                    a.rows_or_seg, a.nseg, a.last_step, a.t);
                });
            if (a.mode == 1)
                launch(grid, a.threads, [&] {
                    fa_rowwise_all<S, KIND, FL>(a.coeffs, x, acc, a.row_size, a.n_rows, g,
                                                (const S *)a.zeros, a.rows_or_seg);
                });
        }
    };
    (one(std::integral_constant<int, F>()), ...);
}

template <typename S> static void rowwise_kind(int kind, int flags, const RowwiseArgs &a)
{
    const auto all = std::make_integer_sequence<int, 16>();
#define FA_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)
#define FA_ROWWISE_OPTIMIZER(name, K, DENSE_MASK, SPARSE_MASK)                                 \
    if (kind == FA_OPT_##K && a.mode < 0)                                                      \
        rowwise_flags<S, FA_OPT_##K, DENSE_MASK>(flags, all, a);                               \
    if (kind == FA_OPT_##K && a.mode >= 0)                                                     \
        rowwise_flags<S, FA_OPT_##K, SPARSE_MASK>(flags, all, a);
#include "fastadam/optimizers.def"
#undef FA_ROWWISE_OPTIMIZER
#undef FA_OPTIMIZER
}

extern "C" {

// storage: 1 float32, 2 float64; mode as RowwiseArgs
void emu_rowwise(int storage, int kind, int flags, int mode, const unsigned char *coeffs,
                 void *x, const void *g, void *acc, const void *zeros, long long n_rows,
                 long long row_size, const long long *rows_or_seg, long long nseg,
                 long long *last_step, long long t, unsigned threads)
{
    const RowwiseArgs a = {mode, coeffs, x, g, acc, zeros, n_rows, row_size, rows_or_seg, nseg,
                           last_step, t, threads};
    if (storage == 1) rowwise_kind<float>(kind, flags, a);
    if (storage == 2) rowwise_kind<double>(kind, flags, a);
}

void emu_lowp_dense(int state, int kind, int flags, const unsigned char *table, int n,
                    long long nblocks, const int *skip, int check, unsigned threads)
{
    const LowpArgs a = {table, n, nblocks, skip, check, nullptr, 0, 0, threads};
    lowp_state<0>(state, kind, flags, a);
}

void emu_lowp_rows(int state, int kind, int flags, const unsigned char *table,
                   const long long *rows, long long nrows, long long row_size, long long grid,
                   unsigned threads)
{
    const LowpArgs a = {table, 1, grid, nullptr, 0, rows, nrows, row_size, threads};
    lowp_state<1>(state, kind, flags, a);
}

void emu_lowp_nonfinite(int grad, const unsigned char *table, int n, long long nblocks,
                        double gscale, int *flag)
{
    if (grad == FA_FMT_F32)
        launch(nblocks, 1, [&] { fa_lowp_nonfinite<FA_FMT_F32>(table, n, gscale, flag); });
    if (grad == FA_FMT_BF16)
        launch(nblocks, 1, [&] { fa_lowp_nonfinite<FA_FMT_BF16>(table, n, gscale, flag); });
}

// storage: 0 float16, 1 float32, 2 float64 (as fastadam/gpu/_source.STORAGE's order)
void emu_dense_step(int storage, int kind, int flags, const unsigned char *table, int n,
                    long long nblocks, const int *skip, int check, unsigned threads)
{
    const DenseArgs a = {table, n, nblocks, skip, check, threads};
    if (storage == 0) dense_kind<unsigned short>(kind, flags, a);
    if (storage == 1) dense_kind<float>(kind, flags, a);
    if (storage == 2) dense_kind<double>(kind, flags, a);
}

void emu_nonfinite(int storage, const unsigned char *table, int n, long long nblocks,
                   double gscale, int *flag)
{
    if (storage == 0)
        launch(nblocks, 1, [&] { fa_nonfinite<unsigned short>(table, n, gscale, flag); });
    if (storage == 1) launch(nblocks, 1, [&] { fa_nonfinite<float>(table, n, gscale, flag); });
    if (storage == 2) launch(nblocks, 1, [&] { fa_nonfinite<double>(table, n, gscale, flag); });
}

void emu_segment_sum(int storage, const void *values, long long row_size, const long long *perm,
                     const long long *offsets, long long nseg, void *out, unsigned threads)
{
    if (storage == 1)
        launch(nseg, threads, [&] {
            fa_segment_sum<float>((const float *)values, row_size, perm, offsets, nseg,
                                  (float *)out);
        });
    if (storage == 2)
        launch(nseg, threads, [&] {
            fa_segment_sum<double>((const double *)values, row_size, perm, offsets, nseg,
                                   (double *)out);
        });
}

void emu_sparse(int storage, int kind, int flags, int mode, const unsigned char *coeffs,
                void *x, void *st0, void *st1, long long row_size, long long n_rows,
                const void *values, const long long *perm, const long long *offsets,
                const long long *rows_or_seg, long long nseg, long long *last_step, long long t,
                unsigned threads)
{
    const SparseArgs a = {mode,   coeffs,  x,           st0,  st1,       row_size, n_rows, values,
                          perm,   offsets, rows_or_seg, nseg, last_step, t,        threads};
    if (storage == 1) sparse_kind<float>(kind, flags, a);
    if (storage == 2) sparse_kind<double>(kind, flags, a);
}

}  // extern "C"
