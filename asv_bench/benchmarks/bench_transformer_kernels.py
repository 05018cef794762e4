"""The float32 row kernels of a transformer step against the same results composed from NumPy
operations (the path each replaces; for the fused attention, the unfused nodes' path):
``TransformerKernelRatio.track_numpy_over_kernel``, one ratio per kernel, 1 thread, shapes of
the GPT benchmark's step (batch 16, sequence 64, d 64, 4 heads, vocabulary 128:
bench_onnx_gpt).  ``cases`` is shared with asv_bench/transformer_kernels_report.py, which also
checks each kernel against a float64 oracle.
"""
import math

import numpy as np

try:
    from . import _api
except ImportError:  # imported as a top-level module (the report puts benchmarks/ on sys.path)
    import _api

NAMES = ("softmax (16,4,64,64), causal", "softmax VJP", "GELU VJP (1024,256)",
         "LayerNorm (1024,64)", "LayerNorm dx", "cross-entropy VJP (1024,128)",
         "scatter rows (embedding VJP)", "attention (16,4,64,16), causal", "attention VJP",
         "GELU VJP, Phi kept")


def _kernels():
    """The kernel modules of this commit (NotImplementedError before the row kernels)."""
    try:
        from fastadam._core import _autodiff_kernels as AK
        from fastadam.autodiff import _kernels as K
        from fastadam.autodiff import _transformer_kernels as TK
    except ImportError:
        raise NotImplementedError("this fastadam has no transformer kernels") from None
    if not hasattr(TK, "softmax_last_f32") or not hasattr(K, "scatter_add_rows"):
        raise NotImplementedError("this fastadam has no float32 row kernels")
    return AK, K, TK


def _attention_cases(rng, TK):
    """The fused attention kernels against the unfused path they replace in an exported
    graph's step (MatMul, Add, the softmax kernel, MatMul; the VJPs of those four), on the
    views the session hands them (q and v cut from one (16, 64, 192) projection)."""
    f32, d64 = np.float32, np.float64
    qkv = rng.standard_normal((16, 64, 192)).astype(f32)
    q = qkv[..., :64].reshape(16, 64, 4, 16).transpose(0, 2, 1, 3)
    v = qkv[..., 128:].reshape(16, 64, 4, 16).transpose(0, 2, 1, 3)
    kt = (0.25 * rng.standard_normal((16, 4, 16, 64))).astype(f32)
    mask = np.where(np.triu(np.ones((64, 64), bool), 1), np.finfo(f32).min, 0).astype(f32)
    g = rng.standard_normal((16, 4, 64, 16)).astype(f32)
    mask3, ncols = mask[None], TK.attention_live_columns(mask[None])
    _, probs = TK.attention_f32(q, kt, v, mask3, ncols)

    def unfused():
        return np.matmul(TK.softmax_last_f32(np.matmul(q, kt) + mask), v)

    def unfused_vjp():
        p = TK.softmax_last_f32(np.matmul(q, kt) + mask)  # (as the tape holds it)
        ds = TK.softmax_vjp_last_f32(np.matmul(g, v.swapaxes(-1, -2)), p)
        return (np.matmul(ds, kt.swapaxes(-1, -2)), np.matmul(q.swapaxes(-1, -2), ds),
                np.matmul(p.swapaxes(-1, -2), g))

    qd, ktd, vd, gd = (a.astype(d64) for a in (q, kt, v, g))
    s = qd @ ktd + np.where(mask < 0, -np.inf, 0.0)
    pd = np.exp(s - s.max(-1, keepdims=True))
    pd /= pd.sum(-1, keepdims=True)
    dsd = pd * (gd @ vd.swapaxes(-1, -2))
    dsd -= pd * dsd.sum(-1, keepdims=True)
    oracle_vjp = np.concatenate([(dsd @ ktd.swapaxes(-1, -2)).ravel(),
                                 (qd.swapaxes(-1, -2) @ dsd).ravel(),
                                 (pd.swapaxes(-1, -2) @ gd).ravel()])

    def fused_vjp():
        return TK.attention_backward_f32(g, q, kt, v, probs, ncols)
    flat = lambda fn: lambda: np.concatenate([a.ravel() for a in fn()])  # noqa: E731
    return [
        ("attention (16,4,64,16), causal",
         lambda: TK.attention_f32(q, kt, v, mask3, ncols)[0].reshape(16, 4, 64, 16),
         unfused, pd @ vd, 1e-5),
        ("attention VJP", flat(fused_vjp), flat(unfused_vjp), oracle_vjp, 1e-5),
    ]


def _np_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    e /= e.sum(-1, keepdims=True)
    return e


def _np_gelu_grad(g, x):
    from scipy.special import erf
    return g * (0.5 * (1 + erf(x * np.float32(math.sqrt(0.5))))
                + x * np.exp(-0.5 * x * x) * np.float32(1 / math.sqrt(2 * math.pi)))


def _np_layer_norm(x, scale, bias, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    d = x - m
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * scale + bias


def _np_sce_grad(logits, labels):
    p = _np_softmax(logits)
    p[np.arange(len(labels)), labels] -= 1
    return p / len(labels)


def _np_scatter(n, idx, rows):
    out = np.zeros((n,) + rows.shape[1:], rows.dtype)
    np.add.at(out, idx, rows)
    return out


def _k_scatter(n, idx, rows):
    out = np.zeros((n,) + rows.shape[1:], rows.dtype)
    _kernels()[1].scatter_add_rows(out, idx, rows)
    return out


def cases(rng):
    """``[(name, kernel(), numpy(), float64 oracle, tolerance)]`` (tolerance 0: bit for bit)."""
    AK, K, TK = _kernels()
    f32 = np.float32
    scores = rng.standard_normal((16, 4, 64, 64)).astype(f32)
    scores[..., np.triu_indices(64, 1)[0], np.triu_indices(64, 1)[1]] = -np.inf  # causal mask
    probs = TK.softmax_last_f32(scores)
    g_scores = rng.standard_normal(scores.shape).astype(f32)
    hidden = rng.standard_normal((1024, 256)).astype(f32)
    g_hidden = rng.standard_normal(hidden.shape).astype(f32)
    x = rng.standard_normal((1024, 64)).astype(f32)
    scale, bias = (rng.standard_normal(64).astype(f32) for _ in range(2))
    _, mean, rstd = TK.layer_norm(x, scale, bias, 1e-5)
    g_x = rng.standard_normal(x.shape).astype(f32)
    logits = rng.standard_normal((1024, 128)).astype(f32)
    labels = rng.integers(0, 128, 1024).astype(np.intp)
    tokens = rng.integers(0, 128, 1024)
    g_emb = rng.standard_normal((1024, 64)).astype(f32)
    d64 = np.float64

    def ln_dx_ref():
        xd, gd, sd = x.astype(d64), g_x.astype(d64), scale.astype(d64)
        m = xd.mean(-1, keepdims=True)
        r = 1 / np.sqrt(((xd - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        xh, gs = (xd - m) * r, gd * sd
        return r * (gs - gs.mean(-1, keepdims=True) - xh * (gs * xh).mean(-1, keepdims=True))

    def ln_dx_numpy():
        m = x.mean(-1, keepdims=True)
        r = 1 / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + np.float32(1e-5))
        xh, gs = (x - m) * r, g_x * scale
        return r * (gs - gs.mean(-1, keepdims=True) - xh * (gs * xh).mean(-1, keepdims=True))

    pd = probs.astype(d64)
    cdf = TK.gelu_cdf_f32(hidden)[1] if hasattr(TK, "gelu_cdf_f32") else None
    return [
        ("softmax (16,4,64,64), causal", lambda: TK.softmax_last_f32(scores),
         lambda: _np_softmax(scores), _np_softmax(scores.astype(d64)), 1e-6),
        ("softmax VJP", lambda: TK.softmax_vjp_last_f32(g_scores, probs),
         lambda: probs * (g_scores - (g_scores * probs).sum(-1, keepdims=True)),
         pd * (g_scores - (g_scores * pd).sum(-1, keepdims=True)), 1e-5),
        ("GELU VJP (1024,256)", lambda: TK.gelu_grad(g_hidden, hidden),
         lambda: _np_gelu_grad(g_hidden, hidden),
         _np_gelu_grad(g_hidden.astype(d64), hidden.astype(d64)), 1e-5),
        ("LayerNorm (1024,64)", lambda: TK.layer_norm(x, scale, bias, 1e-5)[0],
         lambda: _np_layer_norm(x, scale, bias),
         _np_layer_norm(x.astype(d64), scale.astype(d64), bias.astype(d64)), 1e-5),
        ("LayerNorm dx", lambda: TK.layer_norm_backward(g_x, x, scale, mean, rstd,
                                                        want_params=False)[0],
         ln_dx_numpy, ln_dx_ref(), 1e-4),
        ("cross-entropy VJP (1024,128)", lambda: AK.sce_backward(logits, labels, 1.0),
         lambda: _np_sce_grad(logits, labels),
         _np_sce_grad(logits.astype(d64), labels), 1e-6),
        ("scatter rows (embedding VJP)", lambda: _k_scatter(128, tokens, g_emb),
         lambda: _np_scatter(128, tokens, g_emb), _np_scatter(128, tokens, g_emb), 0.0),
    ] + (_attention_cases(rng, TK) if hasattr(TK, "attention_live_columns") else []) + (
        [("GELU VJP, Phi kept",  # (Phi from the recorded forward: no erf in the VJP)
          lambda: TK.gelu_grad_cdf_f32(g_hidden, hidden, cdf),
          lambda: _np_gelu_grad(g_hidden, hidden),
          _np_gelu_grad(g_hidden.astype(d64), hidden.astype(d64)), 1e-5)]
        if hasattr(TK, "gelu_cdf_f32") else [])


def limit_threads():
    try:
        from bench_onnx import limit_threads as limit
    except ImportError:  # imported as part of the benchmarks package
        from .bench_onnx import limit_threads as limit
    return limit()


class TransformerKernelRatio:
    """NumPy composition time / kernel time, per kernel (1 thread; higher is better)."""

    params = (list(NAMES),)
    param_names = ["kernel"]
    timeout = 120

    def setup(self, kernel):
        found = {c[0]: c for c in cases(np.random.default_rng(0))}
        if kernel not in found:
            raise NotImplementedError(f"no case {kernel!r}")
        _, fast, composed, _, _ = found[kernel]
        undo = limit_threads()
        try:
            t = _api.timer()({"kernel": fast, "numpy": composed}, repeats=7, min_time=0.02)
        finally:
            undo()
        self.ratio = t["numpy"] / t["kernel"]

    def track_numpy_over_kernel(self, kernel):
        return self.ratio

    track_numpy_over_kernel.unit = "x (NumPy composition time / kernel time), higher is better"
