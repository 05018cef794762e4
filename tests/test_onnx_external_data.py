"""External data of ONNX models given by path: a tensor whose data lies outside the model's
folder (``../``, an absolute path, a symbolic link to a file elsewhere) is refused with a
ValueError before its bytes are read; data beside the model loads.  These checks are onnx's
own (``onnx.load`` and ``onnx.checker``); this file is what pins the onnx floor in
pyproject.toml (the oldest release that passes it)."""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fastadam.onnx as fo  # noqa: E402

SECRET = np.arange(4, dtype=np.float32) + 7


def model_reading(location):
    t = numpy_helper.from_array(np.zeros(4, np.float32), "W")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["Y"])], "g", [],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])], [t])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def folders(tmp_path):
    outside = tmp_path / "secret.bin"
    SECRET.tofile(outside)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    SECRET.tofile(model_dir / "beside.bin")
    return model_dir, outside


def write(model_dir, location):
    path = model_dir / "m.onnx"
    path.write_bytes(model_reading(location).SerializeToString())
    return path


def test_data_beside_the_model_loads(folders):
    model_dir, _ = folders
    out = fo.run(write(model_dir, "beside.bin"), {})
    np.testing.assert_array_equal(out["Y"], SECRET)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_data_outside_the_models_folder_is_refused(folders, where):
    model_dir, outside = folders
    if where == "parent":
        location = "../secret.bin"
    elif where == "absolute":
        location = str(outside)
    else:
        if not hasattr(os, "symlink"):
            pytest.skip("no symbolic links here")
        os.symlink(outside, model_dir / "link.bin")
        location = "link.bin"
    path = write(model_dir, location)
    with pytest.raises(ValueError, match="onnx refuses its external data"):
        fo.run(path, {})
    with pytest.raises(ValueError, match="onnx refuses its external data"):
        fo.TrainingSession(path)
