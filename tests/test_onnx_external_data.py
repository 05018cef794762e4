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


# ---------------------------------------------------------------------------------------------
# a ModelProto in memory (issue 41): external data only from the folder the caller names
# ---------------------------------------------------------------------------------------------

CWD_SECRET = b"SECRET-TOKEN-123"  # 16 bytes: four float32 values


@pytest.fixture
def service_cwd(tmp_path, monkeypatch):
    """The process's current folder holds a file a received model must never read."""
    cwd = tmp_path / "service"
    cwd.mkdir()
    (cwd / "service_secret.bin").write_bytes(CWD_SECRET)
    monkeypatch.chdir(cwd)
    return cwd


def received(location="service_secret.bin"):
    """A model "from the network": parsed from bytes, its initializer naming a plain file."""
    return onnx.load_from_string(model_reading(location).SerializeToString())


def test_modelproto_with_external_data_is_refused_without_base_dir(service_cwd):
    """The reproducer's scenario: a file of the current folder is never read."""
    model = received()
    for call in (lambda: fo.run(model, {}), lambda: fo.TrainingSession(model),
                 lambda: fo.make_training_model(model, loss="Y")):
        with pytest.raises(ValueError, match=r"model: initializer 'W' of graph 'g' keeps its "
                                             r"data in an external file \('service_secret\.bin'"
                                             r"\).*pass base_dir"):
            call()
    # the caller's model is left as it was
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL


def test_base_dir_reads_from_that_folder_only(service_cwd, folders):
    model_dir, _ = folders
    (model_dir / "service_secret.bin").write_bytes(SECRET.tobytes())
    model = received()
    out = fo.run(model, {}, base_dir=model_dir)
    np.testing.assert_array_equal(out["Y"], SECRET)  # the folder's bytes, not the cwd's
    session = fo.TrainingSession(model, base_dir=str(model_dir))
    np.testing.assert_array_equal(session.initializers["W"], SECRET)
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # not modified


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink", "missing"])
def test_base_dir_refuses_what_lies_outside_it(service_cwd, folders, where):
    model_dir, outside = folders
    location = {"parent": "../secret.bin", "absolute": str(outside), "symlink": "link.bin",
                "missing": "service_secret.bin"}[where]
    if where == "symlink":
        if not hasattr(os, "symlink"):
            pytest.skip("no symbolic links here")
        os.symlink(outside, model_dir / "link.bin")
    with pytest.raises(ValueError, match=r"model: initializer 'W' of graph 'g': its external "
                                         r"data .* cannot be read from base_dir"):
        fo.run(received(location), {}, base_dir=model_dir)


def test_base_dir_arguments_are_checked(folders, tmp_path):
    model_dir, _ = folders
    with pytest.raises(TypeError, match="base_dir: expected a folder"):
        fo.run(received(), {}, base_dir=1)
    with pytest.raises(ValueError, match="base_dir: .* is not a folder"):
        fo.run(received(), {}, base_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="base_dir: the model .* is given by path"):
        fo.run(write(model_dir, "beside.bin"), {}, base_dir=model_dir)


def test_attribute_tensor_with_external_data_is_refused_or_read_from_base_dir(service_cwd,
                                                                             folders):
    model_dir, _ = folders
    value = numpy_helper.from_array(np.zeros(4, np.float32), "c")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    for key, v in (("location", "service_secret.bin"), ("offset", "0"), ("length", "16")):
        e = value.external_data.add()
        e.key, e.value = key, v
    graph = helper.make_graph([helper.make_node("Constant", [], ["Y"], name="c", value=value)],
                              "g", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                                      [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"model: attribute 'value' of node 'c' in graph 'g' "
                                         r"keeps its data in an external file"):
        fo.run(model, {})
    (model_dir / "service_secret.bin").write_bytes(SECRET.tobytes())
    np.testing.assert_array_equal(fo.run(model, {}, base_dir=model_dir)["Y"], SECRET)


def _training_model_with_external_algorithm_initializer(model_dir):
    """A training model whose algorithm graph keeps an initializer (the learning rate R of
    make_training_model) in "rate.bin" beside the model: onnx.load reads only the inference
    graph's external data."""
    W = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W")])
    model = fo.make_training_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]), loss="mse", optimizer="momentum",
        lr=0.5, alpha=0.0, beta=1.0, mode="standard", norm_coefficient=0.0)
    alg = model.training_info[0].algorithm
    rate = next(t for t in alg.initializer if t.name.endswith("R"))
    np.array(0.25, np.float32).tofile(model_dir / "rate.bin")
    rate.ClearField("raw_data")
    rate.ClearField("float_data")
    rate.data_location = TensorProto.EXTERNAL
    e = rate.external_data.add()
    e.key, e.value = "location", "rate.bin"
    return model, rate.name, W


def test_training_info_external_data_is_read_from_the_models_folder(service_cwd, folders):
    model_dir, _ = folders
    model, rate, W = _training_model_with_external_algorithm_initializer(model_dir)
    (service_cwd / "rate.bin").write_bytes(np.array(100.0, np.float32).tobytes())  # not this
    path = model_dir / "train.onnx"
    path.write_bytes(model.SerializeToString())
    feeds = {"X": np.eye(4, dtype=np.float32), "labels": np.zeros((4, 2), np.float32)}
    expected_lr = {}
    for key, session in (("path", fo.TrainingSession(path)),
                         ("base_dir", fo.TrainingSession(model, base_dir=model_dir))):
        assert session.initializers[rate] == np.float32(0.25), key
        session.step(feeds)
        # one plain gradient step of mse = mean((X W)^2) with X = I: W - lr * 2 W / 8
        np.testing.assert_allclose(session.initializers["W"], W - 0.25 * 2 * W / 8, rtol=1e-6)
        expected_lr[key] = session
    with pytest.raises(ValueError, match=r"training_info\[0\]\.algorithm keeps its data in an "
                                         r"external file \('rate\.bin'\)"):
        fo.TrainingSession(model)


def test_save_writes_only_the_models_own_bytes(service_cwd, folders, tmp_path):
    """A saved model is self-contained: no external reference, no byte of the current
    folder's file, the external data it was loaded with inlined."""
    model_dir, _ = folders
    model, rate, W = _training_model_with_external_algorithm_initializer(model_dir)
    (service_cwd / "rate.bin").write_bytes(CWD_SECRET[:4])
    session = fo.TrainingSession(model, base_dir=model_dir)
    session.step({"X": np.eye(4, dtype=np.float32), "labels": np.zeros((4, 2), np.float32)})
    out = tmp_path / "saved" / "trained.onnx"
    out.parent.mkdir()
    session.save(out)
    data = out.read_bytes()
    assert CWD_SECRET[:4] not in data
    saved = onnx.load_from_string(data)
    from fastadam.onnx._model import model_tensors
    assert not [w for w, t in model_tensors(saved) if t.data_location == TensorProto.EXTERNAL]
    alg = saved.training_info[0].algorithm
    assert numpy_helper.to_array(next(t for t in alg.initializer if t.name == rate)) == \
        np.float32(0.25)
    np.testing.assert_array_equal(
        numpy_helper.to_array(next(t for t in saved.graph.initializer if t.name == "W")),
        session.initializers["W"])
    assert sorted(os.listdir(out.parent)) == ["trained.onnx"]  # no data file beside it


def test_no_reader_after_loading_touches_an_external_reference(service_cwd):
    """Past ``load_model`` nothing reads a file: the initializer and attribute readers refuse a
    tensor that still refers to one (what a caller building graphs by hand would hit)."""
    from fastadam.onnx._graph import attributes
    from fastadam.onnx._model import initializer_arrays
    model = received()
    with pytest.raises(ValueError, match=r"graph 'g': initializer 'W': its data is in an "
                                         r"external file \('service_secret\.bin'\)"):
        initializer_arrays(model.graph)
    node = helper.make_node("Constant", [], ["Y"], name="c",
                            value=model.graph.initializer[0])
    with pytest.raises(ValueError, match=r"node c: attribute 'value': its data is in an "
                                         r"external file"):
        attributes(node, "node c")
