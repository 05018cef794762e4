"""GPU benchmarks of fastadam.gpu (issue 10), beside a read-4/write-3 stream kernel (the
bandwidth yardstick) and PyTorch's CUDA optimizers.  Every benchmark raises NotImplementedError
in ``setup`` without CuPy and a CUDA device (asv reports it as skipped), and the PyTorch ones
without a CUDA build of torch.

The ``build_*`` functions return a zero-argument step closure and are shared with
``asv_bench/gpu_report.py``, which times them side by side (figures: docs/guide/gpu.md).
"""
import numpy as np

try:
    from . import _api
except ImportError:  # imported as a top-level module (gpu_report.py puts benchmarks/ on sys.path)
    import _api

STREAM_SOURCE = r"""
extern "C" __global__ void stream_rw43(float *x, const float *g, float *m, float *v, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float gi = g[i];
        const float mi = m[i] + gi, vi = v[i] + gi;
        m[i] = mi;
        v[i] = vi;
        x[i] = x[i] + mi * vi;
    }
}
"""


def need_gpu():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise NotImplementedError("no CUDA device")
    except ImportError:
        raise NotImplementedError("CuPy is not installed") from None
    except Exception as exc:
        raise NotImplementedError(f"no usable CUDA device: {exc}") from None
    return cupy


def need_torch_cuda():
    try:
        import torch
    except ImportError:
        raise NotImplementedError("torch is not installed") from None
    if not torch.cuda.is_available():
        raise NotImplementedError("torch has no CUDA")
    return torch


def _arrays(cupy, sizes, seed=0):
    rng = np.random.default_rng(seed)
    xs = [cupy.asarray(rng.standard_normal(n).astype(np.float32)) for n in sizes]
    gs = [cupy.asarray(rng.standard_normal(n).astype(np.float32)) for n in sizes]
    return xs, gs, [cupy.zeros_like(x) for x in xs], [cupy.zeros_like(x) for x in xs]


def build_fastadam(sizes):
    import fastadam

    cupy = need_gpu()
    xs, gs, ms, vs = _arrays(cupy, sizes)
    return lambda: fastadam.step_inplace(xs, gs, ms, vs, 10, convention="torch")


def build_stream(n):
    cupy = need_gpu()
    kernel = cupy.RawKernel(STREAM_SOURCE, "stream_rw43")
    (x,), (g,), (m,), (v,) = _arrays(cupy, [n])
    grid = min((n + 255) // 256, 65536)
    return lambda: kernel((grid,), (256,), (x, g, m, v, np.int64(n)))


def build_torch(sizes, mode="fused"):
    torch = need_torch_cuda()
    rng = np.random.default_rng(0)
    params = [torch.nn.Parameter(torch.tensor(rng.standard_normal(n).astype(np.float32),
                                              device="cuda")) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, **{mode: True})
    return opt.step


def build_sparse_fastadam(rows=10**6, dim=64, batch=4096, seed=0):
    import fastadam

    cupy = need_gpu()
    rng = np.random.default_rng(seed)
    x = cupy.asarray(rng.standard_normal((rows, dim)).astype(np.float32))
    m, v = cupy.zeros_like(x), cupy.zeros_like(x)
    idx = cupy.asarray((rng.zipf(1.2, batch) - 1) % rows)
    vals = cupy.asarray(rng.standard_normal((batch, dim)).astype(np.float32))
    return lambda: fastadam.sparse_step_inplace(x, (idx, vals), m, v, 10, convention="tf")


def build_sparse_torch(rows=10**6, dim=64, batch=4096, seed=0):
    torch = need_torch_cuda()
    rng = np.random.default_rng(seed)
    emb = torch.nn.Parameter(torch.tensor(rng.standard_normal((rows, dim)).astype(np.float32),
                                          device="cuda"))
    idx = torch.tensor((rng.zipf(1.2, batch) - 1) % rows, device="cuda")
    vals = torch.tensor(rng.standard_normal((batch, dim)).astype(np.float32), device="cuda")
    opt = torch.optim.SparseAdam([emb], lr=1e-3)

    def step():  # uncoalesced gradient: SparseAdam coalesces it, as fastadam sums duplicates
        emb.grad = torch.sparse_coo_tensor(idx[None], vals, (rows, dim))
        opt.step()
    return step


# Low-precision formats (issue 24): name -> (param_fmt, grad_fmt, state_fmt, rounding) of
# fastadam.gpu.lowp_dense_step, and the bytes an Adam step must move per element
LOWP_FORMATS = {"bfloat16": (0, 0, 1, 0), "int8": (0, 0, 2, 0), "int8_bf16_sr": (1, 1, 2, 1)}
LOWP_BYTES = {"float32": 28, "bfloat16": 20, "int8": 16, "int8_bf16_sr": 10}


def build_lowp(size, fmt, block=256, seed=0):
    """One Adam step of ``size`` elements in a low-precision format of LOWP_FORMATS through
    fastadam.gpu.lowp_dense_step (bfloat16 as uint16 bits, 8-bit states as codes + scales)."""
    import fastadam

    cupy = need_gpu()
    param_fmt, grad_fmt, state_fmt, rounding = LOWP_FORMATS[fmt]
    rng = np.random.default_rng(seed)

    def array(fmt_code):
        a = rng.standard_normal(size).astype(np.float32)
        return cupy.asarray(a if fmt_code == 0 else (a.view(np.uint32) >> 16).astype(np.uint16))

    x, g = array(param_fmt), array(grad_fmt)
    state_type = np.uint16 if state_fmt == 1 else np.uint8
    slots = [[cupy.zeros(size, state_type)], [cupy.zeros(size, state_type)]]
    scales = ([[cupy.zeros(-(-size // block), np.float32)] for _ in range(2)]
              if state_fmt == 2 else [])
    one = np.zeros(1, np.float32)
    coeffs = fastadam.optim.prepare_step("adam", one, {"m": one.copy(), "v": one.copy()}).check(
        10, convention="torch")
    return lambda: fastadam.gpu.lowp_dense_step(coeffs, [x], [g], slots, scales, [], param_fmt,
                                                grad_fmt, state_fmt, block, 0, (True, False),
                                                rounding, 0, 10, False)


def many_sizes(count=1000, seed=0):
    return [int(n) for n in np.random.default_rng(seed).integers(10**3, 10**4, count)]


class _Timed:
    def teardown(self, *args):  # asv calls it even when setup skipped the benchmark
        if getattr(self, "fn", None) is not None:
            import cupy
            cupy.cuda.Device().synchronize()


class GpuDenseStep(_Timed):
    params = (_api.smoke_grid([10**3, 10**6, 10**7, 10**8], [10**3, 10**6]),
              ["fastadam", "stream", "torch_fused"])
    param_names = ["size", "impl"]
    timeout = 300

    def setup(self, size, impl):
        self.fn = {"fastadam": lambda: build_fastadam([size]), "stream": lambda: build_stream(size),
                   "torch_fused": lambda: build_torch([size])}[impl]()

    def time_step(self, size, impl):
        self.fn()


class GpuManyTensors(_Timed):
    params = (["fastadam", "torch_fused", "torch_foreach"],)
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        sizes = many_sizes()
        self.fn = (build_fastadam(sizes) if impl == "fastadam"
                   else build_torch(sizes, impl.split("_")[1]))

    def time_step(self, impl):
        self.fn()


class GpuSparseLazy(_Timed):
    params = (["fastadam", "torch_sparse_adam"],)
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        self.fn = build_sparse_fastadam() if impl == "fastadam" else build_sparse_torch()

    def time_step(self, impl):
        self.fn()


class GpuLowpDense(_Timed):
    """Adam with low-precision states on the GPU beside the float32 step (issue 24's formats)."""
    params = (_api.smoke_grid([10**6, 10**7], [10**6]),
              ["float32"] + list(LOWP_FORMATS))
    param_names = ["size", "format"]
    timeout = 300

    def setup(self, size, fmt):
        self.fn = build_fastadam([size]) if fmt == "float32" else build_lowp(size, fmt)

    def time_step(self, size, fmt):
        self.fn()
