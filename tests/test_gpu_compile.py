"""The GPU path without a GPU: the CUDA source compiles to PTX with NVRTC for every kernel
instantiation (float16/float32/float64, every optimizer, every flag set), the bytes laid out for
the kernels match the C headers, and the dispatch errors that need no device.

The NVRTC tests need the ``gpu-compile`` extra (cuda-bindings, nvidia-cuda-nvrtc) and skip
without it; the GPU tests proper are in test_gpu.py (marked ``gpu``).
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastadam
from fastadam.gpu import _layout, _source
from fastadam.optim._coefficients import (adagrad_coefficients, adam_coefficients,
                                          momentum_coefficients)

MODULES = _source.all_modules()


def module_id(mod):
    family, storage, kind = mod
    return f"{family}-{storage}" + ("" if kind is None else f"-kind{kind}")


@pytest.mark.parametrize("module", MODULES, ids=module_id)
def test_every_instantiation_compiles_to_ptx(module):
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs the gpu-compile extra (NVRTC)")
    names = _source.module_names(*module)
    ptx, lowered = _source.nvrtc_ptx(names)
    assert set(lowered) == set(names)
    for name, low in lowered.items():
        # every instantiation is a kernel entry point of the PTX, under its mangled name
        assert re.search(r"\.entry\s+" + re.escape(low) + r"\s*\(", ptx), name
    # float16 is computed in float32: its kernels convert with cvt, and never hold a double
    # compute type (no .f64 arithmetic beyond the coefficient struct's conversions)
    if module[1] == "float16":
        assert "cvt.f32.f16" in ptx and "cvt.rn.f16.f32" in ptx


def test_a_compile_error_is_reported_with_the_log(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs the gpu-compile extra (NVRTC)")
    monkeypatch.setattr(_source, "source", lambda: "__global__ void k() { undefined_name(); }")
    with pytest.raises(RuntimeError, match="undefined_name"):
        _source.nvrtc_ptx(["k"])


def test_the_cuda_source_includes_the_formula_headers_and_writes_no_formula():
    text = _source.source()
    assert '#include "fastadam/formulas.h"' in text
    # each formula's defining expressions live only in the headers
    for fragment in ("omb1", "omb2", "FA_SQRT(", "k->b1 *", "k->lr *"):
        assert fragment not in text, fragment


def test_constants_match_the_cuda_source():
    text = _source.source()
    defines = dict(re.findall(r"#define (FA_CUDA_\w+|FA_CATCHUP_EXACT) (\d+)", text))
    assert int(defines["FA_CUDA_HEADER"]) == _layout.HEADER_BYTES
    assert int(defines["FA_CUDA_CHUNK"]) == _layout.CHUNK
    sparse_h = (_source.include_dir() / "fastadam" / "sparse.h").read_text()
    cpu = re.search(r"#define FA_CATCHUP_EXACT (\d+)", sparse_h).group(1)
    assert defines["FA_CATCHUP_EXACT"] == cpu
    entry = re.search(r"typedef struct \{(.*?)\} fa_cuda_tensor;", text, re.S).group(1)
    fields = re.findall(r"fa_i64 ([\w, ]+);", entry)
    assert sum(len(f.split(",")) for f in fields) == _layout.ENTRY_WORDS


@pytest.mark.parametrize("header,struct,kind", [
    ("adam.h", "fa_adam_coeffs", "adam"), ("adagrad.h", "fa_adagrad_coeffs", "adagrad"),
    ("momentum.h", "fa_momentum_coeffs", "momentum")])
def test_struct_layout_follows_the_header(header, struct, kind):
    text = (_source.include_dir() / "fastadam" / header).read_text()
    body = re.search(r"typedef struct \{(.*?)\} " + struct + ";", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for ctype, names in re.findall(r"(double|int)\s+([\w\s,]+);", body):
        fields += [(n.strip(), ctype) for n in names.split(",")]
    kind_id = _source.KINDS[kind]
    assert [n for n, _ in fields] == _layout.STRUCT_FIELDS[kind_id]
    dt = _layout.STRUCT_DTYPES[kind_id]
    # C layout: doubles at 8-byte offsets in order, the int right after, size a multiple of 8
    for i, (name, ctype) in enumerate(fields):
        assert dt.fields[name][1] == 8 * i
        assert dt.fields[name][0] == (np.dtype(np.float64) if ctype == "double"
                                      else np.dtype(np.int32))
    assert dt.itemsize % 8 == 0 and dt.itemsize <= _layout.HEADER_BYTES
    # the struct.Struct that writes it each step gives the bytes of a NumPy record of dt
    values = [np.int32(-7) if dt.fields[name][0] == np.int32 else 0.1 * (i + 1) - 1e300 * (i % 2)
              for i, name in enumerate(_layout.STRUCT_FIELDS[kind_id])]
    record = np.zeros(1, dtype=dt)
    record[0] = tuple(values)
    packed = np.full(_layout.HEADER_BYTES, 0xAB, dtype=np.uint8)
    _layout.STRUCT_PACKERS[kind_id].pack_into(packed, 0, *values)
    np.testing.assert_array_equal(packed[:dt.itemsize], record.view(np.uint8))
    assert (packed[dt.itemsize:] == 0xAB).all()  # nothing written past the struct


@pytest.mark.parametrize("coeffs", [
    adam_coefficients(3, 1e-3, 0.9, 0.999, 1e-8, "torch", 0.1, False, 0.0, True, True, True,
                      128.0),
    adagrad_coefficients(2, lr=0.1, lr_decay=0.01, eps=1e-6, weight_decay=0.2, maximize=True,
                         convention="torch", grad_scale=4.0),
    momentum_coefficients(5, lr=0.1, momentum=0.8, dampening=0.1, nesterov=False,
                          weight_decay=0.01, maximize=False, convention="onnx")],
    ids=["adam", "adagrad", "momentum"])
def test_host_table_layout(coeffs):
    sizes = [5, 0, _layout.CHUNK, _layout.CHUNK + 1, 1]
    ptrs = [[1000 * (c + 1) + i for i in range(len(sizes))] for c in range(4)]
    host, n, nblocks = _layout.host_table(coeffs, sizes, ptrs)
    assert n == 4 and nblocks == 1 + 1 + 2 + 1
    record = host[:_layout.STRUCT_DTYPES[coeffs.kind].itemsize].view(
        _layout.STRUCT_DTYPES[coeffs.kind])[0]
    for name, value in coeffs.as_dict().items():
        assert record[name] == value, name
    tab = host[_layout.HEADER_BYTES:].view(np.int64).reshape(n, _layout.ENTRY_WORDS)
    kept = [0, 2, 3, 4]  # the empty tensor has no entry
    np.testing.assert_array_equal(tab[:, 0], [ptrs[0][i] for i in kept])
    np.testing.assert_array_equal(tab[:, 3], [ptrs[3][i] for i in kept])
    np.testing.assert_array_equal(tab[:, 4], 0)  # no fifth column given
    np.testing.assert_array_equal(tab[:, 5], [5, _layout.CHUNK, _layout.CHUNK + 1, 1])
    np.testing.assert_array_equal(tab[:, 6], [0, 1, 2, 4])


def test_import_fastadam_does_not_import_cupy():
    code = ("import sys, numpy as np, fastadam; x = np.ones(4, np.float32); "
            "fastadam.step_inplace(x, x.copy(), np.zeros(4, np.float32), "
            "np.zeros(4, np.float32), 1, convention='torch'); "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(fastadam.__file__).resolve().parents[1], check=True)
    assert out.stdout.strip() == "False"


class FakeDeviceArray:
    """Looks like a CUDA array to the dispatch (a __cuda_array_interface__), is not CuPy."""
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                "version": 3}


def _dense_args():
    return [np.ones(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32),
            np.zeros(4, np.float32)]


@pytest.mark.parametrize("position,name", [(1, "g"), (2, "m"), (3, "v")])
def test_device_array_beside_numpy_x_is_a_clear_error(position, name):
    args = _dense_args()
    before = [a.copy() for a in args]
    args[position] = FakeDeviceArray()
    with pytest.raises(TypeError, match=rf"^{name}: a GPU array \(FakeDeviceArray\) in a call "
                                        rf"whose x is a numpy.ndarray"):
        fastadam.step_inplace(*args, 1, convention="torch")
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


def test_device_array_in_a_list_is_named_with_its_index():
    x, g, m, v = ([a] for a in _dense_args())
    v = [FakeDeviceArray()]
    with pytest.raises(TypeError, match=r"^v\[0\]: a GPU array"):
        fastadam.step_inplace(x, g, m, v, 1, convention="torch")


def test_sparse_values_on_the_device_beside_numpy_x():
    x = np.zeros((4, 2))
    with pytest.raises(TypeError, match=r"^grad\[1\]: a GPU array"):
        fastadam.sparse_step_inplace(x, (np.array([1]), FakeDeviceArray()), np.zeros((4, 2)),
                                     np.zeros((4, 2)), 1)
    np.testing.assert_array_equal(x, 0)


def test_device_array_without_cupy_says_cupy_is_missing():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the 'not installed' error cannot happen")
    with pytest.raises(TypeError, match=r"^x: a CUDA array was passed but CuPy is not "
                                        r"installed"):
        fastadam.momentum_step_inplace(FakeDeviceArray(), *_dense_args()[1:3], 1)
    with pytest.raises(TypeError, match=r"^indices: a CUDA array was passed but CuPy is not"):
        fastadam.segment_sum(FakeDeviceArray(), np.zeros(2))
    with pytest.raises(TypeError, match=r"^x: a CUDA array was passed but CuPy is not"):
        fastadam.sparse_step_inplace(FakeDeviceArray(), (np.array([0]), np.zeros((1,))),
                                     np.zeros(1), np.zeros(1), 1)


def test_show_config_reports_the_gpu_path():
    line = fastadam.config()["gpu"]
    if importlib.util.find_spec("cupy") is None:
        assert line.startswith("not available (CuPy not installed")
    else:
        assert line.startswith("CuPy ") or line.startswith("not available (CuPy is installed")


def test_lowp_constants_match_the_cuda_source():
    text = _source.source()
    defines = dict(re.findall(r"#define (FA_LOWP_\w+|FA_Q8_\w+) (\d+)", text))
    assert int(defines["FA_LOWP_PARAMS"]) == _layout.LOWP_PARAMS_BYTES
    assert int(defines["FA_LOWP_TABLE"]) == _layout.LOWP_TABLE
    assert int(defines["FA_LOWP_THREADS"]) == _layout.LOWP_THREADS
    assert int(defines["FA_Q8_PER_THREAD"]) == _layout.Q8_PER_THREAD
    params = re.search(r"typedef struct \{([^{}]*)\} fa_lowp_params;", text).group(1)
    params = re.sub(r"/\*.*?\*/", "", params, flags=re.S)
    names = [n.strip() for decl in re.findall(r"(?:int|fa_u32)\s+([\w\s,\[\]0-9]+);", params)
             for n in decl.split(",")]
    assert [n for n in names if "[" not in n] == list(_layout.LOWP_PARAM_FIELDS)
    padding = int(re.search(r"unused\[(\d+)\]", params).group(1))
    assert 4 * (len(_layout.LOWP_PARAM_FIELDS) + padding) == _layout.LOWP_PARAMS_BYTES
    entry = re.search(r"typedef struct \{([^{}]*)\} fa_lowp_tensor;", text).group(1)
    entry = re.sub(r"/\*.*?\*/", "", entry, flags=re.S)
    words = 0
    columns = []
    for decl in re.findall(r"fa_i64 ([\w\s,\[\]]+);", entry):
        for name in decl.split(","):
            name = name.strip()
            size = re.search(r"\[(\w+)\]", name)
            count = {"FA_MAX_SLOTS": 3}.get(size.group(1), None) if size else 1
            count = int(size.group(1)) if size and count is None else count
            words += count
            base = name.split("[")[0]
            columns += [base] if count == 1 else [f"{base}{i}" for i in range(count)]
    assert words == _layout.LOWP_ENTRY_WORDS
    # the address columns in the order _layout writes them, then n, block0, index
    assert columns[:9] == ["x", "g", "master", "s0", "s1", "s2", "scale0", "scale1", "scale2"]
    assert columns[9:12] == ["n", "block0", "index"]
    assert len(_layout.LOWP_COLUMNS) == 9


def test_lowp_host_table_layout():
    coeffs = adam_coefficients(3, 1e-3, 0.9, 0.999, 1e-8, "torch")
    head = _layout.lowp_header(coeffs, dict(
        param_fmt=1, grad_fmt=0, rounding=1, has_master=0, signed_mask=1, block=64, span=64,
        qmap=1, seed_lo=2 ** 64 - 1, seed_hi=(2 ** 64 - 1) >> 32, t=7))
    fields = head[_layout.HEADER_BYTES:_layout.LOWP_TABLE].view(np.uint32)
    assert list(fields[:11]) == [1, 0, 1, 0, 1, 64, 64, 1, 0xFFFFFFFF, 0xFFFFFFFF, 7]
    assert not fields[11:].any()
    sizes = [100, 0, 64, 1]
    cols = {"x": [11, 12, 13, 14], "g": [21, 22, 23, 24], "s1": [31, 32, 33, 34]}
    host, n, nblocks = _layout.lowp_host_table(head, sizes, cols, 64)
    assert n == 3 and nblocks == 2 + 1 + 1
    np.testing.assert_array_equal(host[:_layout.LOWP_TABLE], head)
    tab = host[_layout.LOWP_TABLE:].view(np.int64).reshape(n, _layout.LOWP_ENTRY_WORDS)
    np.testing.assert_array_equal(tab[:, 0], [11, 13, 14])
    np.testing.assert_array_equal(tab[:, 1], [21, 23, 24])
    np.testing.assert_array_equal(tab[:, 4], [31, 33, 34])  # s1
    np.testing.assert_array_equal(tab[:, [2, 3, 5, 6, 7, 8]], 0)  # columns not given
    np.testing.assert_array_equal(tab[:, 9], [100, 64, 1])
    np.testing.assert_array_equal(tab[:, 10], [0, 2, 3])
    np.testing.assert_array_equal(tab[:, 11], [0, 2, 3])  # positions in the list: SR keys


@pytest.mark.parametrize("block,threads", [(8, 32), (64, 32), (256, 64), (1000, 256),
                                           (4096, 1024)])
def test_lowp_threads_cover_a_quantization_block(block, threads):
    assert _layout.lowp_threads(True, block) == threads
    assert threads * _layout.Q8_PER_THREAD >= block and threads <= _layout.LOWP_THREADS


def test_lowp_entry_points_without_cupy_say_cupy_is_missing():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the 'not installed' error cannot happen")
    with pytest.raises(TypeError, match=r"^xs: a CUDA array was passed but CuPy is not "
                                        r"installed"):
        fastadam.gpu.lowp_dense_step(None, [FakeDeviceArray()], [], [], [], [], 0, 0, 1, 256, 0,
                                     (), 0, 0, 1, False)
    with pytest.raises(TypeError, match=r"^x: a CUDA array was passed but CuPy is not"):
        fastadam.gpu.lowp_rows_step(None, FakeDeviceArray(), None, None, [], [], None, 0, 1,
                                    256, 0, (), 0, 0, 1)


class _Span:
    """A stand-in with the two attributes check_disjoint reads of a device array."""

    def __init__(self, ptr, nbytes):
        self.data = type("Pointer", (), {"ptr": ptr})()
        self.nbytes = nbytes


@pytest.mark.parametrize("seed", range(40))
def test_the_numpy_overlap_check_agrees_with_the_sweep(seed, monkeypatch):
    """Above _SWEEP_IN_PYTHON spans, NumPy decides whether check_disjoint's sweep would raise; on
    random layouts (many touching or overlapping, some read-only) the two must agree, and a
    layout that overlaps still gets the sweep's message naming both arrays."""
    from fastadam.gpu import _validation

    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 120))
    starts = rng.integers(0, 40 * count, count) * 4
    sizes = rng.integers(0, 30, count) * 4  # zero-size arrays take part in nothing
    if seed % 2:  # a clean layout: back to back, read-only ones allowed to repeat
        starts, sizes = np.cumsum(np.r_[0, sizes[:-1]]), sizes
    written = rng.random(count) < (0.5 if seed % 3 else 0.95)
    groups = [("w", [_Span(int(p), int(n)) for p, n, w in zip(starts, sizes, written) if w], True),
              ("r", [_Span(int(p), int(n)) for p, n, w in zip(starts, sizes, written) if not w],
               False)]
    if seed % 5 == 0:  # read-only arrays that share memory among themselves: allowed
        groups.append(("r2", list(groups[1][1]), False))

    def outcome(limit):
        monkeypatch.setattr(_validation, "_SWEEP_IN_PYTHON", limit)
        try:
            _validation.check_disjoint(groups)
        except ValueError as exc:
            return str(exc)
        return None

    swept, checked = outcome(10**9), outcome(0)
    assert swept == checked
    if swept is not None:
        assert "share memory" in swept


def test_an_overlap_among_many_tensors_is_named():
    from fastadam.gpu import _validation

    xs = [_Span(1000 * i, 400) for i in range(100)]
    ms = [_Span(1000 * i + 500, 400) for i in range(100)]
    _validation.check_disjoint([("x", xs, True), ("m", ms, True)])  # disjoint: passes
    ms[57] = _Span(1000 * 57 + 300, 400)
    with pytest.raises(ValueError, match=r"^x\[57\] and m\[57\] share memory"):
        _validation.check_disjoint([("x", xs, True), ("m", ms, True)])
