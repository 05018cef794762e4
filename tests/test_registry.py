"""The registration list (include/fastadam/optimizers.def) and its Python specs
(fastadam/_registry.py): every spec matches its header, and a (kind, flags) pair the list does
not give a path is an error there -- never a silent no-op."""
import re

import numpy as np
import pytest

import fastadam
from fastadam._core import _dense, _registry
from fastadam._core._coeffs import StructCoefficients
from fastadam.gpu import _layout, _source
from fastadam.optim import _lion, _rmsprop
from fastadam.optim._sparse_functional import sparse_step

HEADERS = _source.include_dir() / "fastadam"


def header_struct(name):
    text = (HEADERS / f"{name}.h").read_text()
    body = re.search(r"typedef struct \{(.*?)\} fa_" + name + "_coeffs;", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for ctype, names in re.findall(r"(double|int)\s+([\w\s,]+);", body):
        fields += [(n.strip(), ctype) for n in names.split(",")]
    return fields


def test_the_list_names_every_registered_spec_and_no_other():
    text = (HEADERS / "optimizers.def").read_text()
    listed = re.findall(r"^FA_(?:ROWWISE_)?OPTIMIZER\((\w+),", text, re.M)
    assert listed == [row["name"] for row in _dense.registry()]
    assert set(listed) == set(_registry.SPECS)
    rowwise = re.findall(r"^FA_ROWWISE_OPTIMIZER\((\w+),", text, re.M)
    assert rowwise == [row["name"] for row in _dense.registry() if row["rowwise"]]
    assert rowwise == [name for name, s in _registry.SPECS.items() if s.row_slots]


def test_row_wise_kinds_stay_out_of_the_element_kernels():
    """A row-wise optimizer has no element kernel: the dense driver, the GPU lists and the
    sparse support query (the element walk's) never name it; its own kernels take its masks."""
    kind = _registry.KINDS["rowwise_adagrad"]
    assert not any(_dense.dense_supported(kind, f) or _dense.sparse_supported(kind, f)
                   for f in range(16))
    assert [f for f in range(16) if _dense.rowwise_supported(kind, f, False)] == [0, 1, 2, 3]
    assert [f for f in range(16) if _dense.rowwise_supported(kind, f, True)] == [0, 1]
    assert not _dense.rowwise_supported(_registry.KINDS["adagrad"], 0, False)
    assert kind not in _source.KINDS.values()
    assert _source.ROWWISE_KINDS == {"rowwise_adagrad": kind}
    names = _source.module_names("rowwise", "float32", kind)
    assert "fa_rowwise_dense<float, %d, 3>" % kind in names
    assert "fa_rowwise_rows<float, %d, 1, 1>" % kind in names
    assert ("rowwise", "float64", kind) in _source.all_modules()
    from fastadam.optim._functional import dense_step
    c = _registry.spec("rowwise_adagrad").fold(1, lr=0.1)
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"^the dense step has no kernel for optimizer kind"):
        dense_step(c, x, np.ones((2, 3)), [("acc", np.zeros((2, 3)))], False, 1)
    np.testing.assert_array_equal(x, 1)


def test_a_row_wise_spec_must_match_its_row():
    with pytest.raises(ValueError, match=r"^lion: a row-wise optimizer \(FA_ROWWISE_OPTIMIZER\) "
                                         r"has row_slots and no other has"):
        _registry.register(_registry.OptimizerSpec(
            name="lion", fields=_lion.FIELDS, slots=("m",), object_slots=("exp_avg",),
            row_slots=("m",), fold=None))
    with pytest.raises(ValueError, match=r"row_slots names 'z', which is not one of its slots"):
        _registry.OptimizerSpec(name="lion", fields=(), slots=("m",), object_slots=("exp_avg",),
                                row_slots=("z",), fold=None)
    s = _registry.spec("rowwise_adagrad")
    assert s.rowwise and not _registry.spec("adagrad").rowwise
    assert s.slot_shape("sum", (5, 3)) == (5,) and s.slot_shape("acc", ()) == ()
    assert _registry.spec("adagrad").slot_shape("sum", (5, 3)) == (5, 3)


@pytest.mark.parametrize("name", sorted(_registry.SPECS))
def test_spec_fields_follow_the_header(name):
    fields = header_struct(name)
    assert fields[-1] == ("flags", "int")
    assert all(ctype == "double" for _, ctype in fields[:-1])
    assert [n for n, _ in fields[:-1]] == list(_registry.spec(name).fields)
    assert _layout.STRUCT_FIELDS[_registry.KINDS[name]] == [n for n, _ in fields]


def test_python_flag_bits_are_the_headers():
    text = (HEADERS / "rmsprop.h").read_text()
    assert int(re.search(r"FA_CENTERED = (\d+)", text).group(1)) == _rmsprop.FLAG_CENTERED
    assert int(re.search(r"FA_RMS_MOMENTUM = (\d+)", text).group(1)) == \
        _rmsprop.FLAG_RMS_MOMENTUM


def test_a_spec_whose_fields_do_not_fill_the_struct_is_refused():
    bad = _registry.OptimizerSpec(name="lion", fields=("lr",), slots=("m",),
                                  object_slots=("exp_avg",), fold=None)
    with pytest.raises(ValueError, match=r"lion: 1 float64 fields and flags take 16 bytes, but "
                                         r"fa_lion_coeffs has 56"):
        _registry.register(bad)
    with pytest.raises(ValueError, match=r"'adamax' is not in include/fastadam/optimizers.def"):
        _registry.register(_registry.OptimizerSpec(name="adamax", fields=(), slots=(),
                                                   object_slots=(), fold=None))
    assert _registry.spec("lion").fields == _lion.FIELDS


def _lion_coeffs(flags, kind=None):
    return StructCoefficients(_registry.KINDS["lion"] if kind is None else kind, _lion.FIELDS,
                              (0.1, 0.9, 0.99, 1.0, 1.0, 1.0), flags)


@pytest.mark.parametrize("flags,kind", [(1, None), (4, None), (16, None), (0, 99)],
                         ids=["L2", "bit4", "bit16", "unknown-kind"])
@pytest.mark.parametrize("mode", ["lazy", "dense", "catchup"])
def test_the_sparse_switch_refuses_what_the_list_does_not_give(flags, kind, mode):
    x = np.ones((5, 2))
    m = np.zeros((5, 2))
    last = np.zeros(5, np.int64) if mode == "catchup" else None
    with pytest.raises(ValueError, match=r"^the sparse step has no kernel for optimizer kind"):
        sparse_step(_lion_coeffs(flags, kind), x, (np.array([1, 3]), np.ones((2, 2))),
                    [("m", m)], 1, mode, last, 1)
    np.testing.assert_array_equal(x, 1)
    np.testing.assert_array_equal(m, 0)


@pytest.mark.parametrize("flags,kind", [(1, None), (4, None), (0, 99)])
def test_the_dense_driver_refuses_what_the_list_does_not_give(flags, kind):
    from fastadam.optim._functional import dense_step
    x = np.ones(5)
    with pytest.raises(ValueError, match=r"^the dense step has no kernel for optimizer kind"):
        dense_step(_lion_coeffs(flags, kind), x, np.ones(5), [("m", np.zeros(5))], False, 1)
    np.testing.assert_array_equal(x, 1)


def test_the_dense_driver_checks_the_slot_count():
    from fastadam.optim._functional import dense_step
    with pytest.raises(ValueError, match=r"^slots: expected 1 state lists for these options"):
        dense_step(_lion_coeffs(0), np.ones(5), np.ones(5),
                   [("m", np.zeros(5)), ("v", np.zeros(5))], False, 1)


def test_registry_queries():
    kinds = _registry.KINDS
    assert _dense.nslots(kinds["adam"], 4) == 3 and _dense.nslots(kinds["adam"], 0) == 2
    assert _dense.nslots(kinds["rmsprop"], 4 | 8) == 3
    assert _dense.nslots(99, 0) == -1
    assert not _dense.sparse_supported(kinds["rmsprop"], 4 | 8)  # three slots
    assert _dense.sparse_supported(kinds["rmsprop"], 1 | 8)
    assert _registry.spec("rmsprop").slot_indices(4) == (0, 2)
    with pytest.raises(ValueError, match=r"^optimizer: expected one of"):
        _registry.spec("adamax")


def test_coefficients_show_their_struct():
    c = fastadam.optim._lion.lion_coefficients(1, lr=0.5, weight_decay=0.1, grad_scale=2.0)
    assert c.as_dict() == dict(lr=0.5, beta1=0.9, beta2=0.99, decay_mul=1.0 - 0.05, sign=1.0,
                               grad_scale=2.0, flags=2)
    with pytest.raises(ValueError, match=r"^lr: 1e\+40 overflows float32"):
        fastadam.lion_step_inplace(np.ones(2, np.float32), np.ones(2, np.float32),
                                   np.zeros(2, np.float32), 1, lr=1e40)


def test_the_specs_are_public_through_fastadam_optim():
    from fastadam.optim import OptimizerSpec, optimizer_spec
    s = optimizer_spec("rmsprop")
    assert isinstance(s, OptimizerSpec)
    assert (s.torch_name, s.onnx_op) == ("RMSprop", None)
    assert optimizer_spec("adam").onnx_op == "Adam"
    assert optimizer_spec("momentum").object_slots == ("momentum_buffer",)
    assert optimizer_spec("lion").slot_indices(0) == (0,)
