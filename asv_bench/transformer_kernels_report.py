"""Side-by-side timings of the float32 row kernels a transformer step runs, each against the
same result composed from NumPy operations (the path they replace), in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_bench/transformer_kernels_report.py

1 thread (threadpoolctl), shapes of the GPT benchmark's step (batch 16, sequence 64, d 64,
4 heads, vocabulary 128: bench_onnx_gpt), medians of interleaved rounds.  Each kernel's result
is checked against a float64 NumPy oracle before it is timed; ``scatter rows`` (the gradient of
an embedding lookup) must equal ``np.add.at`` bit for bit.
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastadam._core import _autodiff_kernels as AK  # noqa: E402
from fastadam.autodiff import _kernels as K  # noqa: E402
from fastadam.autodiff import _transformer_kernels as TK  # noqa: E402
from fastadam.bench import median_seconds_interleaved  # noqa: E402


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
    K.scatter_add_rows(out, idx, rows)
    return out


def cases(rng):
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
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        rng = np.random.default_rng(0)
        print(f"1 thread, float32, medians of {args.repeat} interleaved rounds")
        print(f"{'kernel':32s} {'kernel':>10s} {'NumPy':>10s} {'NumPy/kernel':>13s}")
        for name, kernel, numpy_path, oracle, tol in cases(rng):
            got = kernel()
            if tol == 0.0:
                assert np.array_equal(got, oracle), name
            else:
                np.testing.assert_allclose(got, oracle, rtol=tol, atol=tol, err_msg=name)
            t = median_seconds_interleaved({"kernel": kernel, "numpy": numpy_path},
                                           repeats=args.repeat, min_time=0.05)
            print(f"{name:32s} {t['kernel'] * 1e3:8.3f} ms {t['numpy'] * 1e3:8.3f} ms "
                  f"{t['numpy'] / t['kernel']:12.2f}x")


if __name__ == "__main__":
    main()
