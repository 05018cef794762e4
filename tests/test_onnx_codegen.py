"""TrainingSession's generated step functions (``_codegen``) against the interpreted programs
(``Graph.run_program``), the reference here: the same model trained from the same weights on
the same batches gives bit-identical losses, outputs and initializers either way (MLP and CNN,
Adam in place and functional, Adagrad, Momentum, extra outputs).  The generated source is
printed and read back: one call per node, in the graph's order."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import fastadam.onnx as fo  # noqa: E402

from test_onnx_session import cnn_model, mlp_model  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y.astype(np.int64)


def _batches(X, y, n, seed=0):
    rng = np.random.default_rng(seed)
    for k in range(n):
        idx = rng.integers(0, len(X), 16 + 8 * (k % 3))  # the batch size changes too
        yield {"X": X[idx], "labels": y[idx]}


def _pair(model):
    generated, interpreted = fo.TrainingSession(model), fo.TrainingSession(model)
    interpreted._codegen = False
    return generated, interpreted


def _schedules(session):
    return [s for alg in session._algorithms for s in alg.schedules.values()]


def _train_both(model, digits, output_names=None, functional=False, steps=7):
    X, y = digits
    generated, interpreted = _pair(model)
    if functional:  # optimizer nodes return fresh outputs, then update_binding copies them
        for session in (generated, interpreted):
            for step in session._algorithms[0].plan.steps:
                step.inplace = False
    for feeds in _batches(X, y, steps):
        a = generated.step(feeds, output_names)
        b = interpreted.step(feeds, output_names)
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for name in a:  # an in-place update's output is the initializer's new value
            if name.startswith("fastadam.new.") and "." not in name[len("fastadam.new."):]:
                np.testing.assert_array_equal(
                    a[name], generated.initializers[name[len("fastadam.new."):]])
    after_g, after_i = generated.initializers, interpreted.initializers
    assert set(after_g) == set(after_i)
    for name in after_g:
        np.testing.assert_array_equal(after_g[name], after_i[name], err_msg=name)
    assert all(s.run is not None for s in _schedules(generated))
    assert all(s.run is None for s in _schedules(interpreted))
    return generated


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_generated_step_equals_interpreted_bit_for_bit(kind, digits):
    model, _ = mlp_model(16) if kind == "mlp" else cnn_model()
    session = _train_both(fo.make_training_model(model, lr=1e-2), digits)
    assert int(session.initializers["fastadam.T"]) == 7


@pytest.mark.parametrize("optimizer,attrs", [
    ("adagrad", dict(decay_factor=0.1)),
    ("momentum", dict(alpha=0.9, beta=1.0, mode="nesterov", norm_coefficient=0.01))])
def test_generated_step_other_optimizers(optimizer, attrs, digits):
    model, _ = mlp_model(16)
    _train_both(fo.make_training_model(model, lr=1e-2, optimizer=optimizer, **attrs), digits)


def test_generated_step_functional_optimizer_and_extra_outputs(digits):
    model, _ = cnn_model()
    trained = fo.make_training_model(model, lr=1e-2)
    # a parameter (aliases an initializer: copied), a gradient, the counter's new value (bound
    # by a copy) and an in-place update's new value
    names = ["fastadam.loss", "Wf", "fastadam.grad.Wc", "fastadam.T_next", "fastadam.new.bf"]
    _train_both(trained, digits, output_names=names)
    _train_both(trained, digits, output_names=names, functional=True)


def test_generated_source_is_readable(digits):
    X, y = digits
    model, _ = mlp_model(16)
    session = fo.TrainingSession(fo.make_training_model(model, lr=1e-2))
    session.step({"X": X[:8], "labels": y[:8]})
    sched, = _schedules(session)
    source = sched.run._program_source
    print(source)
    steps = session._algorithms[0].plan.steps
    at = [source.index(f"k = {s.index}  # {s.label}") for s in steps]
    assert at == sorted(at)  # one call per node, in order
    assert "n6(t_fastadam_R.data, t_fastadam_T_next.data, [" in source  # Adam, in place
    assert "[t_b2.data, t_W2.data, t_b1.data, t_W1.data],  # X" in source
    assert "del t_h" in source  # intermediates dropped after their last use
    assert "env[" not in source.split("_load(env)")[1]  # locals only, after the load
