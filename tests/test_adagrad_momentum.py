"""fastadam.adagrad_step_inplace and momentum_step_inplace against the float64 oracles
(tests/reference.py), torch.optim.Adagrad / SGD, and the onnx package's own test vectors."""
import numpy as np
import pytest

import fastadam
from reference import adagrad_reference, momentum_reference
from test_dense import SIZES, ulp_distance

DTYPES = [np.float32, np.float64, np.float16]

ADAGRAD_CASES = [
    dict(convention="torch"),
    dict(convention="torch", lr_decay=0.05, weight_decay=0.1, eps=1e-6),
    dict(convention="torch", maximize=True, grad_scale=8.0),
    dict(convention="onnx", lr_decay=0.01, weight_decay=0.01),
    dict(convention="onnx", eps=1e-3),
    dict(convention="keras"),
    dict(convention="keras", eps=1e-3, weight_decay=0.2),
]
MOMENTUM_CASES = [
    dict(convention="torch"),
    dict(convention="torch", momentum=0.0),
    dict(convention="torch", dampening=0.3, weight_decay=0.05),
    dict(convention="torch", nesterov=True, maximize=True),
    dict(convention="torch", grad_scale=4.0, momentum=0.5),
    dict(convention="onnx", momentum=0.95, dampening=0.9, weight_decay=0.001),
    dict(convention="onnx", momentum=0.9, dampening=0.0, nesterov=True),
]
STEPS = {"torch": [1, 2, 7], "onnx": [0, 1, 5], "keras": [1, 3]}


def adagrad_state(rng, shape, dtype):
    x = np.array(rng.standard_normal(shape), dtype=dtype)
    g = np.array(rng.standard_normal(shape), dtype=dtype)
    h = np.array(rng.uniform(0.0, 2.0, shape), dtype=dtype)
    return x, g, h


def check_close(got, want, dtype, operands, limit):
    assert ulp_distance(got, want, dtype, *operands).max(initial=0.0) <= limit


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ADAGRAD_CASES)
def test_adagrad_one_step_matches_reference(rng, case, dtype):
    for t in STEPS[case["convention"]]:
        x, g, h = adagrad_state(rng, (3, 67), dtype)
        kw = dict(case, lr=0.05)
        want_x, want_h = adagrad_reference(x, g, h, t, **dict(kw, eps=kw.get(
            "eps", {"torch": 1e-10, "onnx": 1e-6, "keras": 1e-7}[case["convention"]])))
        x0 = x.copy()
        assert fastadam.adagrad_step_inplace(x, g, h, t, **kw) is True
        limit = 2 if dtype == np.float16 else 8
        check_close(h, want_h, dtype, (), limit)
        check_close(x, want_x, dtype, (x0, want_x - x0.astype(np.float64)), limit)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MOMENTUM_CASES)
def test_momentum_one_step_matches_reference(rng, case, dtype):
    for t in STEPS[case["convention"]]:
        x, g, v = adagrad_state(rng, (3, 67), dtype)
        kw = dict(case, lr=0.05)
        want_x, want_v = momentum_reference(x, g, v, t, **kw)
        x0, v0 = x.copy(), v.copy()
        assert fastadam.momentum_step_inplace(x, g, v, t, **kw) is True
        limit = 2 if dtype == np.float16 else 8
        geff = np.abs(g.astype(np.float64)) * 2 + np.abs(x0.astype(np.float64))
        check_close(v, want_v, dtype, (v0, geff), limit)
        # x's step is lr * v, and v is exact only to the ulps of the terms it sums
        step_terms = 0.05 * (np.abs(v0.astype(np.float64)) + geff) * 2
        check_close(x, want_x, dtype, (x0, want_x - x0.astype(np.float64), step_terms), limit)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes_and_a_list_in_one_call(rng, size, dtype):
    shapes = [(size,), (3,), (size // 2 + 1,)]
    xs, gs, hs, vs = [], [], [], []
    for shape in shapes:
        x, g, h = adagrad_state(rng, shape, dtype)
        xs.append(x), gs.append(g), hs.append(h), vs.append(h.copy())
    want_a = [adagrad_reference(x, g, h, 2, lr=0.1) for x, g, h in zip(xs, gs, hs)]
    xa = [x.copy() for x in xs]
    fastadam.adagrad_step_inplace(xa, gs, hs, 2, lr=0.1, eps=1e-10)
    want_m = [momentum_reference(x, g, v, 2, lr=0.1) for x, g, v in zip(xs, gs, vs)]
    xm = [x.copy() for x in xs]
    vs0 = [v.copy() for v in vs]
    fastadam.momentum_step_inplace(xm, gs, vs, 2, lr=0.1)
    limit = 2 if dtype == np.float16 else 8
    for i in range(len(shapes)):
        check_close(xa[i], want_a[i][0], dtype, (xs[i], want_a[i][0] - xs[i]), limit)
        check_close(hs[i], want_a[i][1], dtype, (), limit)
        terms = 0.1 * (np.abs(vs0[i].astype(np.float64)) + np.abs(gs[i].astype(np.float64)))
        check_close(xm[i], want_m[i][0], dtype, (xs[i], want_m[i][0] - xs[i], terms), limit)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_bit_identical_for_any_thread_count(rng, dtype):
    n = 300_001
    x, g, h = adagrad_state(rng, (n,), dtype)
    results = []
    for nt in (1, 2, 3):
        xa, ha, xm, vm = x.copy(), h.copy(), x.copy(), h.copy()
        fastadam.adagrad_step_inplace(xa, g, ha, 3, lr=0.1, weight_decay=0.01, num_threads=nt)
        fastadam.momentum_step_inplace(xm, g, vm, 3, lr=0.1, nesterov=True, num_threads=nt)
        results.append((xa, ha, xm, vm))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()


def test_skip_nonfinite_changes_nothing(rng):
    x, g, h = adagrad_state(rng, (50,), np.float32)
    g[17] = np.nan
    before = x.copy(), h.copy()
    assert fastadam.adagrad_step_inplace(x, g, h, 1, skip_nonfinite=True) is False
    assert fastadam.momentum_step_inplace(x, g, h, 1, skip_nonfinite=True) is False
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(h, before[1])


# ---- against PyTorch, 50 steps ----------------------------------------------------------------

def _trajectory_inputs(rng, dtype):
    x0 = rng.standard_normal((4, 33)).astype(dtype)
    grads = [rng.standard_normal((4, 33)).astype(dtype) for _ in range(50)]
    return x0, grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [
    dict(lr=0.05),
    dict(lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.3, eps=1e-8),
    dict(lr=0.02, maximize=True),
])
def test_adagrad_follows_torch(rng, options, dtype):
    torch = pytest.importorskip("torch")
    x0, grads = _trajectory_inputs(rng, dtype)
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt = torch.optim.Adagrad([p], foreach=False, **options)
    x = x0.copy()
    h = np.full_like(x, options.get("initial_accumulator_value", 0.0))
    kw = {k: v for k, v in options.items() if k != "initial_accumulator_value"}
    for t, g in enumerate(grads, start=1):
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        fastadam.adagrad_step_inplace(x, g, h, t, convention="torch", **kw)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(x, p.detach().numpy(), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(h, opt.state[p]["sum"].numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [
    dict(lr=0.01, momentum=0.9),
    dict(lr=0.01, momentum=0.9, dampening=0.5, weight_decay=0.01),
    dict(lr=0.01, momentum=0.8, nesterov=True, maximize=True),
    dict(lr=0.05, momentum=0.0, weight_decay=0.1),
])
def test_momentum_follows_torch_sgd(rng, options, dtype):
    torch = pytest.importorskip("torch")
    x0, grads = _trajectory_inputs(rng, dtype)
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt = torch.optim.SGD([p], foreach=False, **options)
    x, v = x0.copy(), np.zeros_like(x0)
    for t, g in enumerate(grads, start=1):
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        fastadam.momentum_step_inplace(x, g, v, t, convention="torch", **options)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(x, p.detach().numpy(), rtol=rtol, atol=rtol)
    if options["momentum"]:
        np.testing.assert_allclose(v, opt.state[p]["momentum_buffer"].numpy(), rtol=rtol,
                                   atol=rtol)


# ---- against the onnx package's test vectors -----------------------------------------------------

def _onnx_cases(module_name, names):
    """(node, inputs, outputs) of the onnx package's own backend test cases, captured from its
    case generators (they compute the expected outputs with the package's reference code)."""
    pytest.importorskip("onnx")
    import importlib

    module = importlib.import_module(f"onnx.backend.test.case.node.{module_name}")
    captured = []
    original = module.expect
    module.expect = lambda node, inputs, outputs, name, **kw: captured.append(
        (name, node, inputs, outputs))
    try:
        cls = next(v for k, v in vars(module).items() if k.lower() == module_name)
        for name in names:
            getattr(cls, name)()
    finally:
        module.expect = original
    assert len(captured) == len(names), "the onnx case generators produced no test vectors"
    return captured


def _attributes(node):
    import onnx.helper

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _run_onnx_optimizer(node, inputs, step):
    """Apply our step to every (X, G, state) group of an ONNX training node; inputs are
    R, T, X..., G..., S...; outputs X_new..., S_new..."""
    r, t = inputs[0], inputs[1]
    assert t.dtype == np.int64 and r.dtype == np.float32
    rest = inputs[2:]
    n = len(rest) // 3
    xs = [a.copy() for a in rest[:n]]
    gs = rest[n:2 * n]
    ss = [a.copy() for a in rest[2 * n:]]
    step(xs, gs, ss, float(r), int(t), _attributes(node))
    return xs + ss


@pytest.mark.parametrize("case", ["export_adagrad", "export_adagrad_multiple"])
def test_adagrad_equals_onnx_test_vectors(case):
    def step(xs, gs, hs, r, t, attrs):
        fastadam.adagrad_step_inplace(xs, gs, hs, t, lr=r, convention="onnx",
                                      lr_decay=attrs.get("decay_factor", 0.0),
                                      eps=attrs.get("epsilon", 1e-6),
                                      weight_decay=attrs.get("norm_coefficient", 0.0))

    for name, node, inputs, outputs in _onnx_cases("adagrad", [case]):
        got = _run_onnx_optimizer(node, inputs, step)
        assert len(got) == len(outputs)
        for a, b in zip(got, outputs):
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, name
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("case", ["export_momentum", "export_momentum_multiple",
                                  "export_nesterov_momentum"])
def test_momentum_equals_onnx_test_vectors(case):
    def step(xs, gs, vs, r, t, attrs):
        fastadam.momentum_step_inplace(xs, gs, vs, t, lr=r, convention="onnx",
                                       momentum=attrs["alpha"], dampening=1.0 - attrs["beta"],
                                       nesterov=attrs["mode"] == b"nesterov",
                                       weight_decay=attrs["norm_coefficient"])

    for name, node, inputs, outputs in _onnx_cases("momentum", [case]):
        got = _run_onnx_optimizer(node, inputs, step)
        for a, b in zip(got, outputs):
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, name
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)


def test_onnx_reference_runtime_agrees_with_the_vectors():
    """The vectors are also what onnx.reference computes, so the two checks above compare
    fastadam with onnx.reference's Adagrad and Momentum."""
    pytest.importorskip("onnx")
    from onnx.reference.ops.aionnx_preview_training.op_adagrad import Adagrad  # noqa: F401
    from onnx.reference import ReferenceEvaluator
    import onnx.helper

    for module, cases in (("adagrad", ["export_adagrad"]),
                          ("momentum", ["export_momentum", "export_nesterov_momentum"])):
        for name, node, inputs, outputs in _onnx_cases(module, cases):
            graph = onnx.helper.make_graph(
                [node], name,
                [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                 for n in node.input],
                [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                 for n in node.output])
            model = onnx.helper.make_model(graph, opset_imports=[
                onnx.helper.make_opsetid("", 18),
                onnx.helper.make_opsetid("ai.onnx.preview.training", 1)])
            ref = ReferenceEvaluator(model).run(None, dict(zip(node.input, inputs)))
            for a, b in zip(ref, outputs):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)
