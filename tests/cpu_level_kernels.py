"""Run a fixed set of compiled kernels at the CPU level this process was started with and save
every output, for tests/test_cpu_levels.py, which runs it once per level and compares the bytes.

    FASTADAM_CPU_LEVEL=baseline python tests/cpu_level_kernels.py OUT.npz

Kernels: the dense step of every optimizer option set of tests/optimizer_table.py (every row of
the C registration list), float32 and float64, at a size with a SIMD tail and with non-finite
checks (grad_scale, skip_nonfinite); row-wise Adagrad on 2-D tables (dense at row widths 1 to
67, sparse in every mode); the sparse step in lazy, catchup and dense modes at row
widths 4 (a short-row loop), 64 and 67; segment_sum; the autodiff kernels (relu, sigmoid, their
gradients, tanh's gradient, column sums, softmax cross-entropy) and the transformer's erf,
GELU, softmax, layer normalisation and fused attention; the bandwidth yardstick; the low-precision steps (_lowp: every option set with bfloat16
and 8-bit states, float32 and bfloat16 parameters with stochastic rounding or a master, a sparse
rows step) and 8-bit quantization.  Inputs come from fixed seeds.  Also saved: the level each
compiled module reports (``levels``, JSON) and ``fastadam.config()``'s three level facts.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # optimizer_table, reference

import fastadam  # noqa: E402
from fastadam._core import _autodiff_kernels, _dense, _lowp, _sparse  # noqa: E402
from fastadam._core._registry import spec  # noqa: E402
from fastadam.autodiff import _transformer_kernels  # noqa: E402
from fastadam.bench import _yardstick  # noqa: E402
from lowp_reference import NONNEGATIVE  # noqa: E402
from optimizer_table import CASES, case_id, fold_options  # noqa: E402

MODULES = {"_dense": _dense, "_sparse": _sparse, "_lowp": _lowp, "_autodiff_kernels": _autodiff_kernels,
           "_transformer_kernels": _transformer_kernels, "_yardstick": _yardstick}
SIZE = 1003  # above every vector width, with a tail at each


def dense_steps(out):
    for dtype in (np.float32, np.float64):
        for case in CASES:
            info, options = case
            rng = np.random.default_rng(7)
            x = rng.standard_normal(SIZE).astype(dtype)
            state = {name: np.abs(rng.standard_normal(SIZE)).astype(dtype) * 0.01
                     for name in info.slots(options)}
            for t in range(info.first_t, info.first_t + 3):
                g = rng.standard_normal(SIZE).astype(dtype)
                info.dense(x, g, state, t, num_threads=1, **options)
            key = f"dense/{case_id(case)}/{np.dtype(dtype).name}"
            out[key + "/x"] = x
            for name, value in state.items():
                out[f"{key}/{name}"] = value
        # the non-finite check (all_finite) and a scaled gradient
        rng = np.random.default_rng(8)
        x, m, v = (rng.standard_normal(SIZE).astype(dtype) for _ in range(3))
        v = np.abs(v)
        g = rng.standard_normal(SIZE).astype(dtype) * 1024
        fastadam.step_inplace(x, g, m, v, 1, grad_scale=1024.0, skip_nonfinite=True)
        g[SIZE - 1] = np.inf
        skipped = fastadam.step_inplace(x, g, m, v, 2, grad_scale=1024.0, skip_nonfinite=True)
        out[f"dense/nonfinite/{np.dtype(dtype).name}"] = np.concatenate([x, m, v, [skipped]])


def sparse_steps(out):
    for dtype in (np.float32, np.float64):
        for width in (4, 64, 67):
            for mode in ("lazy", "catchup", "dense"):
                rng = np.random.default_rng(width)
                rows = 300
                x = rng.standard_normal((rows, width)).astype(dtype)
                m = rng.standard_normal((rows, width)).astype(dtype) * 0.1
                v = np.abs(rng.standard_normal((rows, width))).astype(dtype) * 0.01
                last = np.zeros(rows, np.int64) if mode == "catchup" else None
                for t in (1, 2, 5):
                    idx = np.minimum(rng.zipf(1.3, 500) - 1, rows - 1).astype(np.int64)
                    vals = rng.standard_normal((500, width)).astype(dtype)
                    fastadam.sparse_step_inplace(x, (idx, vals), m, v, t, mode=mode,
                                                 last_step=last, lr=0.01, num_threads=1)
                key = f"sparse/{mode}/row{width}/{np.dtype(dtype).name}"
                out[key + "/x"], out[key + "/m"], out[key + "/v"] = x, m, v
        for width in (5, 64):
            rng = np.random.default_rng(3)
            idx = rng.integers(0, 100, 2000)
            vals = rng.standard_normal((2000, width)).astype(dtype)
            unique, sums = fastadam.segment_sum(idx, vals, num_threads=1)
            out[f"segment_sum/row{width}/{np.dtype(dtype).name}"] = sums


def rowwise_steps(out):
    """Row-wise Adagrad on 2-D tables (the row's fixed-order sum of squares): dense at row
    widths around the vector widths and past them, sparse lazy, catchup and dense modes."""
    options = [dict(lr=0.05), dict(lr=0.05, weight_decay=0.1, grad_scale=3.0),
               dict(lr=0.05, weight_decay=0.1, weight_decay_mode="decoupled", maximize=True)]
    for dtype in (np.float32, np.float64):
        name = np.dtype(dtype).name
        for width in (1, 7, 8, 9, 16, 64, 67):
            for k, kw in enumerate(options):
                rng = np.random.default_rng(width + 100 * k)
                x = rng.standard_normal((23, width)).astype(dtype)
                acc = np.zeros(23, dtype)
                for t in (1, 2, 3):
                    g = rng.standard_normal((23, width)).astype(dtype)
                    fastadam.rowwise_adagrad_step_inplace(x, g, acc, t, num_threads=1, **kw)
                out[f"rowwise/dense/row{width}/{k}/{name}"] = np.concatenate([x.ravel(), acc])
        for width in (4, 64, 67):
            for mode in ("lazy", "catchup", "dense"):
                rng = np.random.default_rng(width)
                rows = 300
                x = rng.standard_normal((rows, width)).astype(dtype)
                acc = np.zeros(rows, dtype)
                last = np.zeros(rows, np.int64) if mode == "catchup" else None
                for t in (1, 2, 5):
                    idx = np.minimum(rng.zipf(1.3, 500) - 1, rows - 1).astype(np.int64)
                    vals = rng.standard_normal((500, width)).astype(dtype)
                    fastadam.sparse_rowwise_adagrad_step_inplace(
                        x, (idx, vals), acc, t, mode=mode, last_step=last, lr=0.01,
                        weight_decay=0.01, num_threads=1)
                out[f"rowwise/sparse/{mode}/row{width}/{name}"] = np.concatenate(
                    [x.ravel(), acc])


def autodiff_kernels(out):
    for dtype in (np.float32, np.float64):
        rng = np.random.default_rng(11)
        a = (rng.standard_normal(SIZE) * 6).astype(dtype)
        g = rng.standard_normal(SIZE).astype(dtype)
        s = _autodiff_kernels.sigmoid(a)
        t = np.tanh(a)
        name = np.dtype(dtype).name
        out[f"autodiff/relu/{name}"] = _autodiff_kernels.relu(a)
        out[f"autodiff/sigmoid/{name}"] = s
        out[f"autodiff/relu_grad/{name}"] = _autodiff_kernels.relu_grad(g, a)
        out[f"autodiff/relu_grad_scalar/{name}"] = _autodiff_kernels.relu_grad_scalar(0.5, a)
        out[f"autodiff/sigmoid_grad/{name}"] = _autodiff_kernels.sigmoid_grad(g, s)
        out[f"autodiff/tanh_grad/{name}"] = _autodiff_kernels.tanh_grad(g, t)
        out[f"autodiff/sum_rows/{name}"] = _autodiff_kernels.sum_rows(a[:1000].reshape(40, 25))
        logits = rng.standard_normal((37, 11)).astype(dtype)
        labels = rng.integers(0, 11, 37).astype(np.intp)
        out[f"autodiff/sce_forward/{name}"] = _autodiff_kernels.sce_forward(logits, labels)
        out[f"autodiff/sce_backward/{name}"] = _autodiff_kernels.sce_backward(logits, labels,
                                                                              0.25)
        out[f"transformer/erf/{name}"] = _transformer_kernels.erf(a)
        out[f"transformer/gelu/{name}"] = _transformer_kernels.gelu(a)
        out[f"transformer/gelu_grad/{name}"] = _transformer_kernels.gelu_grad(g, a)
        if dtype == np.float32:  # the GELU that keeps Phi for its backward pass
            y, cdf = _transformer_kernels.gelu_cdf_f32(a)
            out["transformer/gelu_cdf/float32"] = np.concatenate([y, cdf])
            out["transformer/gelu_grad_cdf/float32"] = _transformer_kernels.gelu_grad_cdf_f32(
                g, a, cdf)
    rows = rng.standard_normal((50, 37)).astype(np.float32) * 30
    rows[::3, 5:20] = -np.inf  # masked entries: exactly 0 at every level
    y = _transformer_kernels.softmax_last_f32(rows)
    out["transformer/softmax/float32"] = y
    x = rng.standard_normal((41, 37)).astype(np.float32) * 3 + 1
    scale, bias = (rng.standard_normal(37).astype(np.float32) for _ in range(2))
    ln_y, ln_mean, ln_rstd = _transformer_kernels.layer_norm(x, scale, bias, 1e-5)
    out["transformer/layer_norm/float32"] = np.concatenate([ln_y.ravel(), ln_mean, ln_rstd])
    dx, dscale, dbias = _transformer_kernels.layer_norm_backward(
        rng.standard_normal(x.shape).astype(np.float32), x, scale, ln_mean, ln_rstd)
    out["transformer/layer_norm_backward/float32"] = np.concatenate([dx.ravel(), dscale, dbias])
    out["transformer/softmax_vjp/float32"] = _transformer_kernels.softmax_vjp_last_f32(
        rng.standard_normal(rows.shape).astype(np.float32), y)
    for T, S, d, e in ((19, 37, 5, 7), (64, 64, 16, 16)):  # with and without SIMD tails
        q, kt, v, g = (rng.standard_normal(shape).astype(np.float32)
                       for shape in ((3, T, d), (3, d, S), (3, S, e), (3, T, e)))
        mask = np.where(np.arange(S)[None] > np.arange(T)[:, None] + 3, -np.inf,
                        rng.standard_normal((T, S))).astype(np.float32)[None]
        ncols = np.minimum(np.arange(T) + 4, S).astype(np.int32)[None]
        o, p = _transformer_kernels.attention_f32(q, kt, v, mask, ncols)
        grads = _transformer_kernels.attention_backward_f32(g, q, kt, v, p, ncols)
        out[f"transformer/attention/{T}x{S}"] = np.concatenate(
            [a.ravel() for a in (o, p, *grads)])
    rng = np.random.default_rng(12)
    a, d, b, c = (rng.standard_normal(SIZE).astype(np.float32) for _ in range(4))
    _yardstick.stream_rw_f32(a, d, b, c)
    out["yardstick/stream_rw"] = np.concatenate([a, b, c])


def lowp_steps(out):
    block = 64
    for case in CASES:
        info, options = case
        if not info.element_wise:  # a row-wise optimizer has no low-precision states
            continue
        names = info.slots(options)
        signed = tuple(n not in NONNEGATIVE[info.name] for n in names)
        for state_fmt in (_lowp.FMT_BF16, _lowp.FMT_Q8):
            for param in ("f32", "bf16-sr", "bf16-master", "bf16-all"):
                if param == "bf16-all" and state_fmt != _lowp.FMT_BF16:
                    continue  # x, g and states bfloat16, nearest: one fused loop
                rng = np.random.default_rng(21)
                x32 = rng.standard_normal(SIZE).astype(np.float32)
                x = x32 if param == "f32" else _lowp.to_bf16_bits(x32)
                masters = [x32.copy()] if param == "bf16-master" else []
                init = [(0.01 * (np.abs(rng.standard_normal(SIZE)) + 0.5)) if not sg
                        else 0.001 * rng.standard_normal(SIZE) for sg in signed]
                if state_fmt == _lowp.FMT_Q8:
                    pairs = [_lowp.quantize(v.astype(np.float32), block, sg, _lowp.MAP_DYNAMIC)
                             for v, sg in zip(init, signed)]
                    slots, scales = [[p[0]] for p in pairs], [[p[1]] for p in pairs]
                else:
                    slots, scales = [[_lowp.to_bf16_bits(v)] for v in init], []
                for t in range(info.first_t, info.first_t + 2):
                    g = rng.standard_normal(SIZE).astype(np.float32)
                    gfmt = _lowp.FMT_F32
                    if param == "bf16-all":
                        g, gfmt = _lowp.to_bf16_bits(g), _lowp.FMT_BF16
                    coeffs = spec(info.name).fold(t, **fold_options(info.name, options))
                    _lowp.dense_step(coeffs, [x], [g], slots, scales, masters,
                                     _lowp.FMT_F32 if param == "f32" else _lowp.FMT_BF16,
                                     gfmt, state_fmt, block, _lowp.MAP_DYNAMIC, signed,
                                     _lowp.ROUND_NEAREST if param == "bf16-all"
                                     else _lowp.ROUND_STOCHASTIC, 99, t, False, 1)
                key = f"lowp/{case_id(case)}/{state_fmt}/{param}"
                out[key + "/x"] = x
                for q in range(len(names)):
                    out[f"{key}/s{q}"] = slots[q][0]
                    if scales:
                        out[f"{key}/scale{q}"] = scales[q][0]
                if masters:
                    out[key + "/master"] = masters[0]
    rng = np.random.default_rng(22)
    table = rng.standard_normal((30, 64)).astype(np.float32)
    m, ms = _lowp.quantize((0.01 * rng.standard_normal(30 * 64)).astype(np.float32), 32, True, 0)
    v, vs = _lowp.quantize((0.01 * rng.random(30 * 64)).astype(np.float32), 32, False, 0)
    rows = np.array([1, 2, 7, 29], np.int64)
    coeffs = spec("adam").fold(1, **fold_options("adam", dict(lr=0.01, convention="torch")))
    _lowp.rows_step(coeffs, table, rows, rng.standard_normal((4, 64)).astype(np.float32),
                    [m.reshape(30, 64), v.reshape(30, 64)], [ms, vs], None, _lowp.FMT_F32,
                    _lowp.FMT_Q8, 32, 0, (True, False), 0, 0, 1, 1)
    out["lowp/rows"] = np.concatenate([table.ravel(), m.view(np.float32), v.view(np.float32),
                                       ms, vs])
    y = (rng.standard_normal(SIZE) * np.exp(rng.uniform(-10, 1, SIZE))).astype(np.float32)
    for qmap in (_lowp.MAP_DYNAMIC, _lowp.MAP_LINEAR):
        codes, scales = _lowp.quantize(y, 100, True, qmap)
        out[f"lowp/quantize/{qmap}"] = codes
        out[f"lowp/dequantize/{qmap}"] = _lowp.dequantize(codes, scales, 100, True, qmap)


def main(path):
    out = {}
    dense_steps(out)
    lowp_steps(out)
    sparse_steps(out)
    rowwise_steps(out)
    autodiff_kernels(out)
    cfg = fastadam.config()
    facts = {"modules": {name: mod.simd_level_in_use() for name, mod in MODULES.items()},
             "config": {k: cfg[k] for k in ("simd_level", "simd_cpu_best", "simd_cap")}}
    out["levels"] = np.array(json.dumps(facts))
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
