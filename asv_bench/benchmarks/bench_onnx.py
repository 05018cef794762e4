"""ONNX training step (issue 9): ``fastadam.onnx.TrainingSession.step`` on an MLP model vs the
same step hand-written with fastadam.autodiff + fastadam.Adam, and vs PyTorch eager.

The three implementations train the same MLP (Gemm + Relu + Gemm, mean softmax cross-entropy,
Adam with ONNX's epsilon placement) from the same weights on the same batch; ``make_step``
builds each one's step function, ``check_same_training`` asserts that they agree.
"""
import numpy as np

try:
    import onnx  # noqa: F401
    HAVE_ONNX = True
except ImportError:  # pragma: no cover
    HAVE_ONNX = False

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-6
# (label, layer sizes, batch)
WORKLOADS = [("MLP 64-64-10 (digits), b=64", (64, 64, 10), 64),
             ("MLP 784-256-256-10, b=32", (784, 256, 256, 10), 32)]
IMPLS = ("session", "autodiff", "torch")


def limit_threads():
    """One thread for OpenMP/BLAS and PyTorch; returns an undo callable."""
    undo = []
    try:
        from threadpoolctl import threadpool_limits
        undo.append(threadpool_limits(1).restore_original_limits)
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


def _data(sizes, batch, seed=0):
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        weights.append((rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in))
                       .astype(np.float32))
        weights.append(np.zeros(fan_out, np.float32))
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return weights, X, y


def mlp_model(weights, n_in):
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, h = [], [], "X"
    n_layers = len(weights) // 2
    for k in range(n_layers):
        w, b, out = f"W{k}", f"b{k}", ("logits" if k == n_layers - 1 else f"h{k}")
        inits += [numpy_helper.from_array(weights[2 * k], w),
                  numpy_helper.from_array(weights[2 * k + 1], b)]
        nodes.append(helper.make_node("Gemm", [h, w, b], [out], transB=1))
        h = out
        if k < n_layers - 1:
            nodes.append(helper.make_node("Relu", [out], [out + "r"]))
            h = out + "r"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", weights[-1].size])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(sizes, batch):
    import fastadam.onnx as fo
    weights, X, y = _data(sizes, batch)
    model = fo.make_training_model(mlp_model(weights, sizes[0]), lr=LR, alpha=BETA1,
                                   beta=BETA2, epsilon=EPS)
    session = fo.TrainingSession(model)
    feeds = {"X": X, "labels": y}
    names = [f"{p}{k}" for k in range(len(weights) // 2) for p in "Wb"]
    return (lambda: session.step(feeds)), \
        (lambda: [np.array(session.initializers[n]) for n in names])


def _autodiff(sizes, batch):
    import fastadam
    import fastadam.autodiff as ad
    weights, X, y = _data(sizes, batch)
    params = [ad.Tensor(w, requires_grad=True) for w in weights]
    opt = fastadam.Adam([p.data for p in params], lr=LR, betas=(BETA1, BETA2), eps=EPS,
                        convention="onnx")
    Xt = ad.Tensor(X)

    def step():
        h = Xt
        n = len(params) // 2
        for k in range(n):
            h = ad.gemm(h, params[2 * k], params[2 * k + 1], trans_b=True)
            if k < n - 1:
                h = ad.relu(h)
        loss = ad.softmax_cross_entropy(h, y)
        grads = ad.gradient(loss, params)
        opt.step([np.ascontiguousarray(g.data) for g in grads])
        return loss

    return step, (lambda: [np.array(p.data) for p in params])


def _torch(sizes, batch):
    import torch
    weights, X, y = _data(sizes, batch)
    params = [torch.tensor(w, requires_grad=True) for w in weights]
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    state = {"t": 0}

    def step():
        state["t"] += 1
        for group in opt.param_groups:  # ONNX's epsilon placement, in torch's form
            group["eps"] = EPS / np.sqrt(1 - BETA2 ** state["t"])
        opt.zero_grad()
        h = Xt
        n = len(params) // 2
        for k in range(n):
            h = torch.nn.functional.linear(h, params[2 * k], params[2 * k + 1])
            if k < n - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, yt)
        loss.backward()
        opt.step()
        return loss

    return step, (lambda: [p.detach().numpy().copy() for p in params])


_BUILDERS = {"session": _session, "autodiff": _autodiff, "torch": _torch}


def make_step(impl, sizes, batch):
    return _BUILDERS[impl](sizes, batch)[0]


def check_same_training(sizes, batch, steps=5):
    """The three implementations give the same parameters after ``steps`` steps."""
    results = {}
    for impl, build in _BUILDERS.items():
        step, params = build(sizes, batch)
        for _ in range(steps):
            step()
        results[impl] = params()
    for impl in ("autodiff", "torch"):
        for a, b in zip(results["session"], results[impl]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=impl)


class OnnxTrainingStep:
    """Time of one training step of the MLP workloads, per implementation (1 thread)."""

    params = ([w[0] for w in WORKLOADS], list(IMPLS))
    param_names = ["model", "impl"]

    def setup(self, model, impl):
        if not HAVE_ONNX:
            raise NotImplementedError("onnx is not installed")
        if impl == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise NotImplementedError("torch is not installed") from None
        _, sizes, batch = next(w for w in WORKLOADS if w[0] == model)
        self._undo = limit_threads()
        self.step = make_step(impl, sizes, batch)
        self.step()  # warm-up

    def teardown(self, model, impl):
        undo = getattr(self, "_undo", None)
        if undo is not None:
            undo()

    def time_training_step(self, model, impl):
        self.step()


class OnnxRatioVsAutodiff:
    """The ratio that matters, measured in one process: ``TrainingSession.step`` on the ONNX
    training model against the same step hand-written with fastadam.autodiff + fastadam.Adam
    (``_autodiff`` above), 1 thread, interleaved rounds.  Above 1 the session is faster than the
    hand-written step; its interpretation overhead shows as a drop.  Skipped without onnx or on a
    commit without fastadam.onnx."""

    params = ([w[0] for w in WORKLOADS],)
    param_names = ["model"]
    timeout = 120

    def setup(self, model):
        if not HAVE_ONNX:
            raise NotImplementedError("onnx is not installed")
        _api.need("fastadam.onnx", "fastadam.autodiff")
        median_seconds_interleaved = _api.timer()
        _, sizes, batch = next(w for w in WORKLOADS if w[0] == model)
        undo = limit_threads()
        try:
            steps = {impl: make_step(impl, sizes, batch) for impl in ("session", "autodiff")}
            seconds = median_seconds_interleaved(steps, repeats=7, min_time=0.02)
        finally:
            undo()
        self.ratio = seconds["autodiff"] / seconds["session"]

    def track_session_vs_autodiff(self, model):
        return self.ratio

    track_session_vs_autodiff.unit = ("x (autodiff+Adam step time / session step time), "
                                      "higher is better")
