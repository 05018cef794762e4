"""Benchmarks of fastadam.autodiff: forward + backward of one training step, 1 thread.

One class per workload of issues 4 and 12 (the goals are checked by asv_bench/autodiff_report.py),
parametrized over dtype x batch x implementation: ``fastadam`` (this engine), ``numpy`` (a
hand-written forward/backward), ``torch`` (PyTorch eager autograd) and ``autograd`` (HIPS
autograd).  A missing library skips its parameter
combination (``NotImplementedError`` in ``setup``).  Inputs are seeded; the ``build_*``
functions return a zero-argument step closure so ``asv_bench/autodiff_report.py`` times the very
same code side by side.
"""
import numpy as np

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

IMPLS = ["fastadam", "numpy", "torch", "autograd"]
DTYPES = ["float32", "float64"]


def _limit_threads():
    """One thread for OpenMP/BLAS (threadpoolctl) and PyTorch; returns an undo callable.

    fastadam is imported first, so that its OpenMP runtime is loaded (and limited) too."""
    import fastadam.autodiff  # noqa: F401
    undo = []
    try:
        from threadpoolctl import threadpool_limits
        lim = threadpool_limits(1)
        undo.append(lim.restore_original_limits)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        undo.append(lambda: torch.set_num_threads(n))
    except ImportError:
        pass
    return lambda: [u() for u in undo]


def _need(impl):
    if impl == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise NotImplementedError("PyTorch is not installed")
    if impl == "autograd":
        try:
            import autograd  # noqa: F401
        except ImportError:
            raise NotImplementedError("HIPS autograd is not installed")


# ---------------------------------------------------------------------------------------------
# MLP 784-256-256-10, ReLU, softmax cross-entropy
# ---------------------------------------------------------------------------------------------

def _mlp_data(dtype, batch, sizes=(784, 256, 256, 10), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    y = rng.integers(0, sizes[-1], batch)
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype))
        params.append(np.zeros(b, dtype=dtype))
    return x, y, params


def build_mlp(impl, dtype, batch, sizes=(784, 256, 256, 10)):
    _need(impl)
    x, y, params = _mlp_data(dtype, batch, sizes)
    nl = len(params) // 2
    if impl == "fastadam":
        import fastadam.autodiff as ad
        ps = [ad.Tensor(p, requires_grad=True) for p in params]
        X = ad.Tensor(x)

        def step():
            h = X
            for i in range(nl):
                h = h @ ps[2 * i] + ps[2 * i + 1]
                if i < nl - 1:
                    h = ad.relu(h)
            return ad.gradient(ad.softmax_cross_entropy(h, y), ps)
        return step
    if impl == "numpy":
        def step():
            acts = [x]
            h = x
            for i in range(nl):
                h = h @ params[2 * i] + params[2 * i + 1]
                if i < nl - 1:
                    h = np.maximum(h, 0)
                acts.append(h)
            m = h.max(axis=1, keepdims=True)
            e = np.exp(h - m)
            p = e / e.sum(axis=1, keepdims=True)
            p[np.arange(batch), y] -= 1
            g = p / batch
            grads = [None] * len(params)
            for i in reversed(range(nl)):
                grads[2 * i] = acts[i].T @ g
                grads[2 * i + 1] = g.sum(axis=0)
                if i:
                    g = (g @ params[2 * i].T) * (acts[i] > 0)
            return grads
        return step
    if impl == "torch":
        import torch
        F = torch.nn.functional
        ps = [torch.tensor(p, requires_grad=True) for p in params]
        X, Y = torch.tensor(x), torch.tensor(y)

        def step():
            h = X
            for i in range(nl):
                h = h @ ps[2 * i] + ps[2 * i + 1]
                if i < nl - 1:
                    h = torch.relu(h)
            return torch.autograd.grad(F.cross_entropy(h, Y), ps)
        return step
    import autograd
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp

    def loss(ps):
        h = x
        for i in range(nl):
            h = anp.dot(h, ps[2 * i]) + ps[2 * i + 1]
            if i < nl - 1:
                h = anp.maximum(h, 0)
        return anp.mean(logsumexp(h, axis=1) - h[np.arange(batch), y])
    g = autograd.grad(loss)
    return lambda: g(params)


# ---------------------------------------------------------------------------------------------
# logistic regression, 20 features (two-class softmax regression)
# ---------------------------------------------------------------------------------------------

def build_logreg(impl, dtype, batch, features=20):
    _need(impl)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, features)).astype(dtype)
    y = rng.integers(0, 2, batch)
    w = (rng.standard_normal((features, 2)) * 0.1).astype(dtype)
    b = np.zeros(2, dtype=dtype)
    if impl == "fastadam":
        import fastadam.autodiff as ad
        W, B, X = ad.Tensor(w, requires_grad=True), ad.Tensor(b, requires_grad=True), ad.Tensor(x)
        return lambda: ad.gradient(ad.softmax_cross_entropy(X @ W + B, y), [W, B])
    if impl == "numpy":
        rows = np.arange(batch)

        def step():
            z = x @ w + b
            m = z.max(axis=1, keepdims=True)
            e = np.exp(z - m)
            p = e / e.sum(axis=1, keepdims=True)
            p[rows, y] -= 1
            p /= batch
            return x.T @ p, p.sum(axis=0)
        return step
    if impl == "torch":
        import torch
        F = torch.nn.functional
        W, B = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
        X, Y = torch.tensor(x), torch.tensor(y)
        return lambda: torch.autograd.grad(F.cross_entropy(X @ W + B, Y), [W, B])
    import autograd
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp
    rows = np.arange(batch)

    def loss(w_, b_):
        z = anp.dot(x, w_) + b_
        return anp.mean(logsumexp(z, axis=1) - z[rows, y])
    g = autograd.grad(loss, argnum=(0, 1))
    return lambda: g(w, b)


# ---------------------------------------------------------------------------------------------
# conv: x (batch, 3, 32, 32), 16 filters 3x3 (padding 1), ReLU, mean
# ---------------------------------------------------------------------------------------------

def _im2col_np(x, k=3, pad=1):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    s = xp.strides
    win = np.lib.stride_tricks.as_strided(xp, (c, k, k, n, h, w),
                                          (s[1], s[2], s[3], s[0], s[2], s[3]))
    return win.reshape(c * k * k, n * h * w)


def build_conv(impl, dtype, batch):
    _need(impl)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(dtype)
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(dtype)
    b = (rng.standard_normal(16) * 0.1).astype(dtype)
    if impl == "fastadam":
        import fastadam.autodiff as ad
        W, B, X = ad.Tensor(w, requires_grad=True), ad.Tensor(b, requires_grad=True), ad.Tensor(x)
        return lambda: ad.gradient(ad.relu(ad.conv2d(X, W, B, padding=1)).mean(), [W, B])
    if impl == "numpy":
        def step():
            cols = _im2col_np(x)
            y = w.reshape(16, -1) @ cols + b[:, None]          # (16, N*H*W)
            g = (y > 0).astype(dtype) / y.size
            return (g @ cols.T).reshape(w.shape), g.sum(axis=1)
        return step
    if impl == "torch":
        import torch
        F = torch.nn.functional
        W, B, X = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True), \
            torch.tensor(x)
        return lambda: torch.autograd.grad(torch.relu(F.conv2d(X, W, B, padding=1)).mean(),
                                           [W, B])
    import autograd
    import autograd.numpy as anp

    def loss(w_, b_):
        cols = _im2col_np(x)  # x is a constant: its im2col needs no tape
        y = anp.dot(anp.reshape(w_, (16, -1)), cols) + b_[:, None]
        return anp.mean(anp.maximum(y, 0))
    g = autograd.grad(loss, argnum=(0, 1))
    return lambda: g(w, b)


# ---------------------------------------------------------------------------------------------
# Hessian-vector product of the MLP loss (double backward)
# ---------------------------------------------------------------------------------------------

def build_hvp(impl, dtype, batch, sizes=(784, 256, 256, 10)):
    if impl == "numpy":
        raise NotImplementedError("no hand-written Hessian-vector product")
    _need(impl)
    x, y, params = _mlp_data(dtype, batch, sizes)
    rng = np.random.default_rng(3)
    vs = [rng.standard_normal(p.shape).astype(dtype) for p in params]
    nl = len(params) // 2
    if impl == "fastadam":
        import fastadam.autodiff as ad
        ps = [ad.Tensor(p, requires_grad=True) for p in params]
        V = [ad.Tensor(v) for v in vs]
        X = ad.Tensor(x)

        def step():
            h = X
            for i in range(nl):
                h = h @ ps[2 * i] + ps[2 * i + 1]
                if i < nl - 1:
                    h = ad.relu(h)
            gs = ad.gradient(ad.softmax_cross_entropy(h, y), ps, create_graph=True)
            dot = (gs[0] * V[0]).sum()
            for g, v in zip(gs[1:], V[1:]):
                dot = dot + (g * v).sum()
            return ad.gradient(dot, ps)
        return step
    if impl == "torch":
        import torch
        F = torch.nn.functional
        ps = [torch.tensor(p, requires_grad=True) for p in params]
        V = [torch.tensor(v) for v in vs]
        X, Y = torch.tensor(x), torch.tensor(y)

        def step():
            h = X
            for i in range(nl):
                h = h @ ps[2 * i] + ps[2 * i + 1]
                if i < nl - 1:
                    h = torch.relu(h)
            gs = torch.autograd.grad(F.cross_entropy(h, Y), ps, create_graph=True)
            return torch.autograd.grad(sum((g * v).sum() for g, v in zip(gs, V)), ps)
        return step
    import autograd
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp

    def loss(ps):
        h = x
        for i in range(nl):
            h = anp.dot(h, ps[2 * i]) + ps[2 * i + 1]
            if i < nl - 1:
                h = anp.maximum(h, 0)
        return anp.mean(logsumexp(h, axis=1) - h[np.arange(batch), y])
    gl = autograd.grad(loss)
    hvp = autograd.grad(lambda ps: sum(anp.sum(g * v) for g, v in zip(gl(ps), vs)))
    return lambda: hvp(params)


# ---------------------------------------------------------------------------------------------
# asv classes
# ---------------------------------------------------------------------------------------------

class _Workload:
    param_names = ["dtype", "batch", "impl"]
    builder = None

    def setup(self, dtype, batch, impl):
        self.step = type(self).builder(impl, np.dtype(dtype).type, batch)
        self._undo = _limit_threads()
        self.step()  # warm-up (allocations, lazy imports)

    def teardown(self, dtype, batch, impl):
        undo = getattr(self, "_undo", None)
        if undo is not None:
            undo()


class TimeMLP(_Workload):
    """MLP 784-256-256-10 (ReLU, softmax cross-entropy): one forward + backward."""
    params = [DTYPES, _api.smoke_grid([32, 256], [32]), IMPLS]
    builder = staticmethod(build_mlp)

    def time_forward_backward(self, dtype, batch, impl):
        self.step()


class TimeLogisticRegression(_Workload):
    """Logistic regression, 20 features: overhead-bound forward + backward."""
    params = [DTYPES, [16], IMPLS]
    builder = staticmethod(build_logreg)

    def time_forward_backward(self, dtype, batch, impl):
        self.step()


class TimeConv(_Workload):
    """Conv (batch, 3, 32, 32) with 16 filters 3x3, ReLU, mean: forward + backward."""
    params = [DTYPES, [32], IMPLS]
    builder = staticmethod(build_conv)

    def time_forward_backward(self, dtype, batch, impl):
        self.step()


class TimeHessianVectorProduct(_Workload):
    """Hessian-vector product of the MLP loss (double backward)."""
    params = [DTYPES, [32], ["fastadam", "torch", "autograd"]]
    builder = staticmethod(build_hvp)

    def time_hessian_vector_product(self, dtype, batch, impl):
        self.step()


class TimeTapeOverhead:
    """Recording one elementwise op on a 3-element tensor vs the bare NumPy op."""
    params = [DTYPES]
    param_names = ["dtype"]

    def setup(self, dtype):
        import fastadam.autodiff as ad
        self.t = ad.Tensor(np.ones(3, dtype=dtype), requires_grad=True)
        self.a = np.ones(3, dtype=dtype)

    def time_recorded_multiply(self, dtype):
        self.t * self.t

    def time_numpy_multiply(self, dtype):
        self.a * self.a


class AutodiffRatioVsTorch:
    """The ratio that matters, measured in one process: fastadam.autodiff's speed-up over
    PyTorch eager autograd on one forward + backward (the ``build_*`` steps above), float32,
    1 thread, the two timed in interleaved rounds: the MLP 784-256-256-10 at batch 32 and the
    overhead-bound logistic regression at batch 16.  Skipped without torch."""

    params = (["mlp", "logreg"],)
    param_names = ["workload"]
    timeout = 120

    def setup(self, workload):
        _api.need("fastadam.autodiff")
        median_seconds_interleaved = _api.timer()
        _need("torch")
        build, batch = {"mlp": (build_mlp, 32), "logreg": (build_logreg, 16)}[workload]
        undo = _limit_threads()
        try:
            steps = {impl: build(impl, np.float32, batch) for impl in ("fastadam", "torch")}
            seconds = median_seconds_interleaved(steps, repeats=7, min_time=0.02)
        finally:
            undo()
        self.speedup = seconds["torch"] / seconds["fastadam"]

    def track_speedup_vs_torch_eager(self, workload):
        return self.speedup

    track_speedup_vs_torch_eager.unit = "x (torch time / fastadam time), higher is better"


class _PythonTape:
    """Inside ``with``: the tape's Python recording and walk (``Primitive._call_python``,
    ``binary_operator(..., compiled=False)``, ``_tensor._wrap_python``, ``_engine._run_python``),
    the paths the compiled ``_tape`` replaces and is tested against; the compiled ones again
    after it."""

    def __init__(self):
        from fastadam.autodiff import (_engine, _methods, _nn, _ops, _ops_extra, _registry,
                                       _tensor)
        T, ops = _tensor.Tensor, _methods
        self.modules = [m for m in (_engine, _methods, _nn, _ops, _ops_extra, _registry)
                        if hasattr(m, "_wrap")]
        self.saved = {
            (_registry.Primitive, "__call__"): _registry.Primitive._call_python,
            (_engine, "_run"): _engine._run_python,
            **{(m, "_wrap"): _tensor._wrap_python for m in self.modules},
            **{(T, name): _registry.binary_operator(prim, compiled=False)
               for name, prim in (("__add__", ops.add), ("__sub__", ops.subtract),
                                  ("__mul__", ops.multiply), ("__truediv__", ops.divide),
                                  ("__matmul__", ops.matmul))}}
        self.python = dict(self.saved)
        self.compiled = {key: getattr(*key) for key in self.saved}

    def __enter__(self):
        for (owner, name), value in self.python.items():
            setattr(owner, name, value)

    def __exit__(self, *exc):
        for (owner, name), value in self.compiled.items():
            setattr(owner, name, value)


class TapeCompiledRatio:
    """The compiled tape (``autodiff/_tape.pyx``: recording and backward walk in C) against the
    Python recording and walk it replaces (kept as the fallback without a build and as the
    reference the tests compare it with), on the overhead-bound workloads: forward + backward
    of logistic regression (20 features, batch 16) and of the 784-256-256-10 MLP (batch 32),
    float32, 1 thread, interleaved rounds in one process.  > 1: the compiled tape is faster."""

    params = (["logreg", "mlp"],)
    param_names = ["workload"]
    timeout = 120

    def setup(self, workload):
        import time
        try:
            from fastadam.autodiff import _tensor
        except ImportError:
            raise NotImplementedError("fastadam.autodiff is not available") from None
        if getattr(_tensor, "_tape", None) is None or not hasattr(_tensor, "_wrap_python"):
            raise NotImplementedError("no compiled tape in this build")
        build = build_logreg if workload == "logreg" else build_mlp
        step = build("fastadam", np.float32, 16 if workload == "logreg" else 32)
        python = _PythonTape()
        undo = _limit_threads()
        try:
            step()
            with python:
                step()
            start = time.perf_counter()
            step()
            calls = max(1, int(0.02 / max(time.perf_counter() - start, 1e-7)))
            ratios = []
            for _ in range(7):
                seconds = []
                for context in (python, None):
                    if context is not None:
                        context.__enter__()
                    try:
                        start = time.perf_counter()
                        for _ in range(calls):
                            step()
                        seconds.append(time.perf_counter() - start)
                    finally:
                        if context is not None:
                            context.__exit__(None, None, None)
                ratios.append(seconds[0] / seconds[1])
        finally:
            undo()
        self.ratio = float(np.median(ratios))

    def track_python_tape_over_compiled(self, workload):
        return self.ratio

    track_python_tape_over_compiled.unit = ("x (Python tape time / compiled tape time), "
                                            "higher is better")
