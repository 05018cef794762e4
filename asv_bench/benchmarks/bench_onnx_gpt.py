"""ONNX training step on a small GPT exported from PyTorch (issue 22): ``TrainingSession.step``
against the same step written by hand with ``fastadam.autodiff`` + ``fastadam.Adam``, and
against PyTorch eager + ``torch.optim.Adam(fused=True)``.

The workload (also what tests/test_onnx_gpt.py trains): token embedding + learned positions,
``layers`` pre-LayerNorm decoder blocks (causal multi-head self-attention through
``scaled_dot_product_attention(is_causal=True)``, or an explicit ``tril`` mask, and a GELU MLP),
a final LayerNorm and an output head (tied to the token embedding or not), mean cross-entropy
over every position.  The torch module returns ``(logits, loss)``; ``export`` writes it with
either of torch's exporters at a given opset with the batch and sequence axes dynamic, and
``make_training_model(model, loss="loss")`` trains it.  Weights come from NumPy's generator
(``weights``), so every implementation starts from the same values whatever torch's RNG does;
LayerNorm scales and biases are drawn too: the exporters merge initializers of equal values
(fresh LayerNorms are all ones / zeros), which would tie parameters that torch trains apart.

Memory: ``TrainingSession.step`` allocates its arrays from a ``fastadam.MemoryPool`` of its own
(the default), which hands the same blocks back every step instead of the C library returning
them to the OS and the next step page-faulting them in again; the hand-written step
(``autodiff_step``) runs inside a pool too, so the two are compared on equal terms
(``memory_pool=False`` on either gives NumPy's allocator; asv_bench/mempool_report.py measures
both ways).
"""
import io
import math

import numpy as np

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-6
# the benchmark's workload (issue 22): batch 16, sequence 64, d 64, 4 heads, 2 blocks
BENCH = dict(vocab=128, seq=64, d=64, heads=4, layers=2, batch=16)
IMPLS = ("session", "autodiff", "torch")


def param_shapes(cfg, tied=False):
    """``{torch parameter name: shape}`` of the GPT (torch's names, in registration order)."""
    v, s, d, n = cfg["vocab"], cfg["seq"], cfg["d"], cfg["layers"]
    shapes = {"tok.weight": (v, d), "pos.weight": (s, d)}
    for i in range(n):
        b = f"blocks.{i}."
        shapes.update({b + "ln1.weight": (d,), b + "ln1.bias": (d,),
                       b + "qkv.weight": (3 * d, d), b + "qkv.bias": (3 * d,),
                       b + "proj.weight": (d, d), b + "proj.bias": (d,),
                       b + "ln2.weight": (d,), b + "ln2.bias": (d,),
                       b + "fc.weight": (4 * d, d), b + "fc.bias": (4 * d,),
                       b + "out.weight": (d, 4 * d), b + "out.bias": (d,)})
    shapes.update({"lnf.weight": (d,), "lnf.bias": (d,)})
    if not tied:
        shapes["head.weight"] = (v, d)
    return shapes


def weights(cfg, tied=False, seed=0, dtype=np.float32):
    """Initial values, ``{torch parameter name: array}`` (see the module note)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg, tied).items():
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "lnf.weight":
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 0.02 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) * (0.3 if "tok" in name or "pos" in name
                                              else 1 / math.sqrt(shape[1]))
        out[name] = a.astype(dtype)
    return out


def torch_model(cfg, tied=False, dtype=np.float32, attention="sdpa", seed=0):
    """The GPT as a torch module returning ``(logits, loss)``, with ``weights(cfg, tied,
    seed)``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, h = cfg["d"], cfg["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
                mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
                att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
                y = att @ v
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg["vocab"], d)
            self.pos = nn.Embedding(cfg["seq"], d)
            self.blocks = nn.ModuleList([Block() for _ in range(cfg["layers"])])
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"], bias=False)
            if tied:
                self.head.weight = self.tok.weight

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(T))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.lnf(x))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            return logits, loss

    tdtype = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
    model = GPT().to(tdtype)
    values = weights(cfg, tied, seed, dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(values[name]))
    return model


def export(model, exporter, opset, batch=2, seq=None, **kw):
    """``model`` exported by torch's ``exporter`` ("dynamo" or "torchscript") at ``opset``,
    with dynamic batch and sequence axes, as a ModelProto (warnings silenced)."""
    import logging
    import warnings

    import onnx
    import torch
    seq = seq or model.pos.weight.shape[0]
    idx = torch.zeros((batch, seq), dtype=torch.int64)
    targets = torch.ones((batch, seq), dtype=torch.int64)  # another tensor: never aliased
    names = dict(input_names=["idx", "targets"], output_names=["logits", "loss"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            if exporter == "dynamo":
                B = torch.export.Dim("B")
                T = torch.export.Dim("T", max=model.pos.weight.shape[0])
                program = torch.onnx.export(model, (idx, targets), None, dynamo=True,
                                            opset_version=opset, verbose=False,
                                            dynamic_shapes=({0: B, 1: T}, {0: B, 1: T}),
                                            **names, **kw)
                return program.model_proto
            if exporter == "torchscript":
                f = io.BytesIO()
                axes = {"idx": {0: "B", 1: "T"}, "targets": {0: "B", 1: "T"}}
                torch.onnx.export(model, (idx, targets), f, dynamo=False, opset_version=opset,
                                  dynamic_axes=axes, **names, **kw)
                return onnx.load_from_string(f.getvalue())
        finally:
            logging.disable(logging.NOTSET)
    raise ValueError(f"exporter: expected 'dynamo' or 'torchscript', got {exporter!r}")


def batch_data(cfg, batch=None, seq=None, seed=1):
    rng = np.random.default_rng(seed)
    shape = (batch or cfg.get("batch", 4), seq or cfg["seq"])
    return (rng.integers(0, cfg["vocab"], shape).astype(np.int64),
            rng.integers(0, cfg["vocab"], shape).astype(np.int64))


# ---------------------------------------------------------------------------------------------
# the three training steps
# ---------------------------------------------------------------------------------------------


def _session(cfg, exporter="dynamo", opset=20, tied=False, memory_pool=True):
    import fastadam.onnx as fo
    model = export(torch_model(cfg, tied), exporter, opset)
    # the default is left unsaid: a commit before MemoryPool (history runs) has no such argument
    kw = {} if memory_pool is True else {"memory_pool": memory_pool}
    trainer = fo.TrainingSession(fo.make_training_model(model, loss="loss", lr=LR, alpha=BETA1,
                                                        beta=BETA2, epsilon=EPS), **kw)
    idx, targets = batch_data(cfg)
    feeds = {"idx": idx, "targets": targets}
    return trainer, (lambda: trainer.step(feeds))


def session_step(cfg, exporter="dynamo", opset=20, tied=False, memory_pool=True):
    return _session(cfg, exporter, opset, tied, memory_pool)[1]


def check_same_training(cfg, exporter="torchscript", steps=3):
    """The session, the hand-written step and torch give the same parameters after ``steps``
    steps (untied head; the exporters keep torch's parameter names for the embeddings and
    LayerNorms, and a linear layer's weight is the initializer equal to it or to its
    transpose)."""
    import torch
    trainer, step = _session(cfg, exporter)
    values = weights(cfg)
    names = list(values)
    hand = autodiff_step(cfg)
    params = hand.params
    model = torch_model(cfg)
    opt_step = torch_step(cfg, model=model)
    for _ in range(steps):
        step()
        hand()
        opt_step()
    ref = dict(model.named_parameters())
    start = weights(cfg)
    for name in names:
        want = ref[name].detach().numpy()
        np.testing.assert_allclose(params[name].data, want, rtol=1e-4, atol=1e-5, err_msg=name)
        found = [a for a in trainer.initializers.values() if a.shape in (want.shape,
                                                                        want.T.shape)
                 and not np.array_equal(a, start[name]) and not np.array_equal(a, start[name].T)]
        assert any((a.shape == want.shape and np.allclose(a, want, rtol=1e-4, atol=1e-5)) or
                   (a.T.shape == want.shape and np.allclose(a.T, want, rtol=1e-4, atol=1e-5))
                   for a in found), name
    assert torch.is_tensor(ref[names[0]])


def autodiff_forward(cfg, p, idx, targets, tied=False):
    """The GPT's loss, written with ``fastadam.autodiff``; ``p``: ``{torch name: Tensor}``.
    Each linear layer is one 2-D product over the batch and the positions."""
    import fastadam.autodiff as ad
    d, h, v = cfg["d"], cfg["heads"], cfg["vocab"]
    B, T = idx.shape
    hd = d // h
    mask = np.triu(np.ones((T, T), dtype=bool), 1)  # True above the diagonal: masked out

    def linear(x2, w, b=None):  # x2: (B * T, in); w: (out, in) as torch stores it
        y = ad.matmul(x2, ad.transpose(w))
        return y if b is None else ad.add(y, b)

    x = ad.reshape(ad.add(ad.gather(p["tok.weight"], idx), ad.getitem(p["pos.weight"],
                                                                        slice(0, T))), (B * T, d))
    for i in range(cfg["layers"]):
        b = f"blocks.{i}."
        qkv = linear(ad.layer_norm(x, p[b + "ln1.weight"], p[b + "ln1.bias"]),
                     p[b + "qkv.weight"], p[b + "qkv.bias"])
        q, k, val = (ad.transpose(ad.reshape(ad.getitem(qkv, (slice(None),
                                                              slice(j * d, (j + 1) * d))),
                                             (B, T, h, hd)), (0, 2, 1, 3)) for j in range(3))
        att = ad.matmul(ad.multiply(q, 1 / math.sqrt(hd)), ad.transpose(k, (0, 1, 3, 2)))
        att = ad.softmax(ad.where(mask, -np.inf, att), axis=-1)
        y = ad.reshape(ad.transpose(ad.matmul(att, val), (0, 2, 1, 3)), (B * T, d))
        x = ad.add(x, linear(y, p[b + "proj.weight"], p[b + "proj.bias"]))
        hid = ad.gelu(linear(ad.layer_norm(x, p[b + "ln2.weight"], p[b + "ln2.bias"]),
                             p[b + "fc.weight"], p[b + "fc.bias"]))
        x = ad.add(x, linear(hid, p[b + "out.weight"], p[b + "out.bias"]))
    head = p["tok.weight"] if tied else p["head.weight"]
    logits = linear(ad.layer_norm(x, p["lnf.weight"], p["lnf.bias"]), head)
    return ad.softmax_cross_entropy(logits, targets.reshape(-1))


def autodiff_step(cfg, tied=False, memory_pool=True):
    """The hand-written step; with ``memory_pool`` (the default, as ``TrainingSession`` does)
    it runs inside a ``fastadam.MemoryPool`` of its own (see the module note)."""
    import fastadam
    import fastadam.autodiff as ad
    values = weights(cfg, tied)
    names = list(values)
    params = {n: ad.Tensor(values[n], requires_grad=True) for n in names}
    opt = fastadam.Adam([params[n].data for n in names], lr=LR, betas=(BETA1, BETA2), eps=EPS,
                        convention="onnx")
    idx, targets = batch_data(cfg)
    # (a commit before MemoryPool, in a history run, steps without one, as its session did)
    pool = fastadam.MemoryPool() if memory_pool and hasattr(fastadam, "MemoryPool") else None

    def one_step():
        loss = autodiff_forward(cfg, params, idx, targets, tied)
        grads = ad.gradient(loss, [params[n] for n in names])
        opt.step([np.ascontiguousarray(g.data) for g in grads])
        return loss

    def step():
        if pool is None:
            return one_step()
        with pool:
            return one_step()
    step.params = params
    return step


def torch_step(cfg, tied=False, fused=True, model=None):
    import torch
    model = torch_model(cfg, tied) if model is None else model
    params = list(model.parameters())
    # ONNX's epsilon placement in torch's form: eps / sqrt(1 - beta2^t), set per step
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, fused=fused)
    idx, targets = (torch.from_numpy(a) for a in batch_data(cfg))
    state = {"t": 0}

    def step():
        state["t"] += 1
        for group in opt.param_groups:
            group["eps"] = EPS / math.sqrt(1 - BETA2 ** state["t"])
        opt.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        return loss
    return step


def make_step(impl, cfg, tied=False):
    if impl == "session":
        return session_step(cfg, tied=tied)
    if impl == "autodiff":
        return autodiff_step(cfg, tied)
    if impl == "torch":
        return torch_step(cfg, tied)
    raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")


def limit_threads():
    """One thread for OpenMP/BLAS and PyTorch; returns an undo callable."""
    try:
        from bench_onnx import limit_threads as limit
    except ImportError:  # imported as part of the benchmarks package
        from .bench_onnx import limit_threads as limit
    return limit()


class OnnxGptStep:
    """Time of one training step of the GPT (batch 16, sequence 64, d 64, 4 heads, 2 blocks,
    vocabulary 128), float32, 1 thread, per implementation."""

    params = (list(IMPLS),)
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        _api.need("fastadam.onnx", "fastadam.onnx._transformer_ops")
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            raise NotImplementedError("onnx, onnxscript and torch are needed") from None
        self._undo = limit_threads()
        self.step = make_step(impl, BENCH)
        self.step()

    def teardown(self, impl):
        undo = getattr(self, "_undo", None)
        if undo is not None:
            undo()

    def time_training_step(self, impl):
        self.step()


def cpu_seconds_and_faults_interleaved(steps, repeats=7, min_time=0.1):
    """``{name: (median CPU seconds per call, minor page faults per call)}``: as
    ``cpu_seconds_interleaved``, with the process's minor page faults (``getrusage``) counted
    over the same rounds, so every implementation sees the same allocator history (glibc adapts
    its thresholds to the blocks freed so far).  Load does not change the fault counts."""
    import resource
    import time
    calls = {}
    for name, fn in steps.items():
        start = time.thread_time()
        fn()
        calls[name] = max(1, int(min_time / max(time.thread_time() - start, 1e-6)))
    seconds = {name: [] for name in steps}
    faults = dict.fromkeys(steps, 0)
    count = dict.fromkeys(steps, 0)
    for _ in range(repeats):
        for name, fn in steps.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.thread_time()
            for _ in range(calls[name]):
                fn()
            seconds[name].append((time.thread_time() - start) / calls[name])
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            count[name] += calls[name]
    return {name: (float(np.median(seconds[name])), faults[name] / count[name])
            for name in steps}


def cpu_seconds_interleaved(steps, repeats=7, min_time=0.1):
    """``{name: median seconds per call}`` in CPU time of this thread (``time.thread_time``),
    over ``repeats`` interleaved rounds of at least ``min_time`` each: every implementation runs
    on this one thread, and time spent descheduled on a loaded machine does not count."""
    import time
    calls = {}
    for name, fn in steps.items():
        start = time.thread_time()
        fn()
        calls[name] = max(1, int(min_time / max(time.thread_time() - start, 1e-6)))
    per = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.thread_time()
            for _ in range(calls[name]):
                fn()
            per[name].append((time.thread_time() - start) / calls[name])
    return {name: float(np.median(v)) for name, v in per.items()}


class OnnxGptRatio:
    """The ratios issue 22 sets, measured in one process (interleaved rounds, medians of the CPU
    time of this thread, 1 thread): ``hand-written / session`` (the session is at most 1.2x
    slower when >= 0.83) and ``torch eager fused Adam / session`` (> 1: the session is faster
    than PyTorch)."""

    timeout = 600

    def setup(self):
        _api.need("fastadam.onnx", "fastadam.onnx._transformer_ops")
        try:
            import onnxscript  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            raise NotImplementedError("onnxscript and torch are needed") from None
        undo = limit_threads()
        try:
            steps = {impl: make_step(impl, BENCH) for impl in IMPLS}
            seconds = cpu_seconds_interleaved(steps, repeats=7, min_time=0.1)
        finally:
            undo()
        self.vs_autodiff = seconds["autodiff"] / seconds["session"]
        self.vs_torch = seconds["torch"] / seconds["session"]

    def track_session_vs_autodiff(self):
        return self.vs_autodiff

    track_session_vs_autodiff.unit = ("x (hand-written step CPU time / session step CPU time), "
                                      "higher is better")

    def track_session_vs_torch_fused(self):
        return self.vs_torch

    track_session_vs_torch_fused.unit = ("x (torch eager fused-Adam step CPU time / session step "
                                         "CPU time), higher is better")


class OnnxGptMemoryPool:
    """What the session's ``fastadam.MemoryPool`` (its default) gives on the GPT, 1 thread, the
    session with its pool and with ``memory_pool=False`` in one process (interleaved rounds):
    ``track_session_pool_speedup``, the no-pool step's CPU time over the pooled one's; and
    ``track_page_faults_avoided``, the fraction of the no-pool step's minor page faults that
    the pooled step does not take (1.0: none left; load does not move it)."""

    timeout = 600

    def setup(self):
        _api.need("MemoryPool", "fastadam.onnx", "fastadam.onnx._transformer_ops")
        try:
            import onnxscript  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            raise NotImplementedError("onnxscript and torch are needed") from None
        undo = limit_threads()
        try:
            steps = {"pool": session_step(BENCH),
                     "plain": session_step(BENCH, memory_pool=False)}
            measured = cpu_seconds_and_faults_interleaved(steps, repeats=7, min_time=0.1)
        finally:
            undo()
        (pooled, pooled_faults), (plain, plain_faults) = measured["pool"], measured["plain"]
        self.speedup = plain / pooled
        self.avoided = 1.0 if plain_faults == 0 else max(0.0, 1 - pooled_faults / plain_faults)

    def track_session_pool_speedup(self):
        return self.speedup

    track_session_pool_speedup.unit = ("x (session step CPU time with memory_pool=False / with "
                                       "its pool), higher is better")

    def track_page_faults_avoided(self):
        return self.avoided

    track_page_faults_avoided.unit = ("fraction (1 - pooled step's minor page faults / no-pool "
                                      "step's), higher is better")
