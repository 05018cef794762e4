"""fastadam.step_inplace against independent implementations, over many steps:
torch.optim.Adam / AdamW, onnx.reference's Adam, scikit-learn's MLP AdamOptimizer."""
import numpy as np
import pytest

import fastadam

STEPS = 25


def gradients(rng, shape, dtype, steps=STEPS):
    return [np.array(rng.standard_normal(shape), dtype=dtype) for _ in range(steps)]


def assert_close(got, want, dtype):
    want = np.asarray(want, dtype=np.float64)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * np.abs(want).max())


TORCH_CASES = [
    ("Adam", {}),
    ("Adam", {"weight_decay": 0.1}),
    ("Adam", {"amsgrad": True}),
    ("Adam", {"maximize": True}),
    ("Adam", {"amsgrad": True, "maximize": True, "weight_decay": 0.05}),
    ("AdamW", {"weight_decay": 0.1}),
    ("AdamW", {"weight_decay": 0.1, "amsgrad": True}),
]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,options", TORCH_CASES, ids=lambda c: str(c))
def test_matches_torch(rng, cls, options, dtype, fused):
    torch = pytest.importorskip("torch")
    shapes = [(33, 7), (5,), (1000,)]
    xs = [np.array(rng.standard_normal(s), dtype=dtype) for s in shapes]
    params = [torch.tensor(x.copy(), requires_grad=True) for x in xs]
    opt = getattr(torch.optim, cls)(params, lr=0.01, betas=(0.8, 0.95), eps=1e-6, fused=fused,
                                    **options)
    amsgrad = options.get("amsgrad", False)
    ms = [np.zeros_like(x) for x in xs]
    vs = [np.zeros_like(x) for x in xs]
    vmaxs = [np.zeros_like(x) for x in xs] if amsgrad else None
    for t in range(1, STEPS + 1):
        gs = [np.array(rng.standard_normal(s), dtype=dtype) for s in shapes]
        for p, g in zip(params, gs):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
        fastadam.step_inplace(
            xs, gs, ms, vs, t, v_max=vmaxs, lr=0.01, beta1=0.8, beta2=0.95, eps=1e-6,
            convention="torch", weight_decay=options.get("weight_decay", 0.0),
            decoupled_weight_decay=(cls == "AdamW"), amsgrad=amsgrad,
            maximize=options.get("maximize", False))
    for x, m, v, p in zip(xs, ms, vs, params):
        state = opt.state[p]
        assert_close(x, p.detach().numpy(), dtype)
        assert_close(m, state["exp_avg"].numpy(), dtype)
        assert_close(v, state["exp_avg_sq"].numpy(), dtype)


def test_optimizer_object_matches_torch_adamw(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((64, 3)).astype(np.float32)
    p = torch.tensor(x.copy(), requires_grad=True)
    topt = torch.optim.AdamW([p], lr=0.02, weight_decay=0.01)
    opt = fastadam.Adam([x], lr=0.02, convention="torch", weight_decay=0.01,
                        decoupled_weight_decay=True)
    for g in gradients(rng, x.shape, np.float32):
        p.grad = torch.from_numpy(g.copy())
        topt.step()
        opt.step([g])
    assert_close(x, p.detach().numpy(), np.float32)


def onnx_adam_step(r, t, x, g, v, h, **attrs):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    domain = "ai.onnx.preview.training"
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node("Adam", ["R", "T", "X", "G", "V", "H"], ["X_new", "V_new", "H_new"],
                            domain=domain, **attrs)
    inputs = [helper.make_tensor_value_info("R", elem, []),
              helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(n, elem, list(x.shape)) for n in "XGVH"]
    outputs = [helper.make_tensor_value_info(n, elem, list(x.shape))
               for n in ("X_new", "V_new", "H_new")]
    graph = helper.make_graph([node], "adam", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(domain, 1)])
    sess = ReferenceEvaluator(model)
    return sess.run(None, {"R": np.array(r, dtype=x.dtype), "T": np.array(t, dtype=np.int64),
                           "X": x, "G": g, "V": v, "H": h})


@pytest.mark.parametrize("t0", [0, 1])
# ONNX attributes are float32: use values float32 represents exactly, so float64 runs compare.
@pytest.mark.parametrize("norm,post", [(0.0, 0.0), (0.0078125, 0.0), (0.0, 0.015625),
                                       (0.03125, 0.0078125)])
def test_matches_onnx_reference(rng, t0, norm, post):
    dtype = np.float64
    x = rng.standard_normal((4, 5)).astype(dtype)
    xo, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    vo, ho = m.copy(), v.copy()
    attrs = dict(alpha=0.875, beta=0.96875, epsilon=2.0**-16, norm_coefficient=norm,
                 norm_coefficient_post=post)
    for k, g in enumerate(gradients(rng, x.shape, dtype, 10)):
        t = t0 + k if t0 == 1 else 0  # T=0 each step: no bias correction at all
        xo, vo, ho = onnx_adam_step(0.05, t, xo, g, vo, ho, **attrs)
        fastadam.step_inplace(x, g, m, v, t, lr=0.05, beta1=0.875, beta2=0.96875, eps=2.0**-16,
                              convention="onnx", weight_decay=norm, post_decay=post)
    assert_close(x, xo, dtype)
    assert_close(m, vo, dtype)
    assert_close(v, ho, dtype)


def test_matches_sklearn_adam_optimizer(rng):
    pytest.importorskip("sklearn")
    from sklearn.neural_network._stochastic_optimizers import AdamOptimizer

    shapes = [(20, 10), (10,)]
    params = [rng.standard_normal(s) for s in shapes]
    mine = [p.copy() for p in params]
    sk = AdamOptimizer(params, learning_rate_init=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
    opt = fastadam.Adam(mine, lr=0.01, betas=(0.9, 0.999), eps=1e-8, convention="tf")
    for _ in range(STEPS):
        grads = [rng.standard_normal(s) for s in shapes]
        sk.update_params(params, grads)
        opt.step(grads)
    for a, b in zip(mine, params):
        assert_close(a, b, np.float64)
