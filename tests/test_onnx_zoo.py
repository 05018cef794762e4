"""The models the onnx wheel ships (onnx/backend/test/data): each runs in fastadam.onnx and matches
onnxruntime and the wheel's expected outputs, or raises UnsupportedOperatorError (naming an
opset or operator fastadam.onnx does not run); the counts are printed.

- ``pytorch-converted`` / ``pytorch-operator``: small models exported from PyTorch, with inputs
  and outputs; almost all import ai.onnx opset 6, below fastadam.onnx's opset 7;
- ``light``: the model zoo's convolutional networks (AlexNet, DenseNet-121, Inception v1/v2,
  ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512) with generated weights, on a 224x224
  image: SqueezeNet runs here, the larger ones are marked slow (seconds to minutes each in
  NumPy convolutions on one core)."""
import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
LIGHT = sorted(glob.glob(os.path.join(DATA, "light", "*.onnx")))


def _inputs(model):
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _run_or_unsupported(model, feeds):
    try:
        got = fo.run(model, feeds)
    except fo.UnsupportedOperatorError:  # an opset, operator or operator form it does not run
        return None
    return [np.asarray(got[o.name]) for o in model.graph.output]


def test_bundled_pytorch_models_run_or_are_unsupported(capsys):
    dirs = sorted(glob.glob(os.path.join(DATA, "pytorch-*", "*")))
    if not dirs:
        pytest.skip("this onnx wheel ships no pytorch-* test models")
    ran, unsupported = [], []
    for d in dirs:
        model = onnx.load(os.path.join(d, "model.onnx"))
        data = os.path.join(d, "test_data_set_0")
        ins = [numpy_helper.to_array(onnx.load_tensor(f))
               for f in sorted(glob.glob(os.path.join(data, "input_*.pb")))]
        expected = [numpy_helper.to_array(onnx.load_tensor(f))
                    for f in sorted(glob.glob(os.path.join(data, "output_*.pb")))]
        feeds = {i.name: a for i, a in zip(_inputs(model), ins)}
        got = _run_or_unsupported(model, feeds)
        if got is None:
            unsupported.append(os.path.basename(d))
            continue
        ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        for g, r, e in zip(got, ref, expected):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5, err_msg=d)
            np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4, err_msg=d)
        ran.append(os.path.basename(d))
    with capsys.disabled():
        print(f"\nonnx wheel's pytorch models: {len(dirs)} in all, {len(ran)} run and match "
              f"onnxruntime ({', '.join(ran)}), {len(unsupported)} unsupported (opset 6 or an "
              f"unsupported operator)")
    assert ran  # the opset >= 7 ones (MaxPool with dilations, PixelShuffle) run


def _light_params():
    out = []
    for path in LIGHT:
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        marks = () if name == "squeezenet" else (pytest.mark.slow,)
        out.append(pytest.param(path, id=name, marks=marks))
    return out


@pytest.mark.parametrize("path", _light_params())
def test_light_zoo_model_runs_like_onnxruntime_or_is_unsupported(path):
    model = onnx.load(path)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feeds = {_inputs(model)[0].name: x}
    got = _run_or_unsupported(model, feeds)
    if got is None:  # LRN (AlexNet, Inception v1, ZFNet): not an operator fastadam.onnx lists
        return
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-5)
