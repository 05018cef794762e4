"""The compiled core: OpenMP present, runtime dispatch active, show_config works."""
import os

import numpy as np
import pytest

import fastadam
from fastadam._core import _config
from fastadam._core._threads import resolve_num_threads


def test_openmp_was_not_lost():
    # Set FASTADAM_ALLOW_SERIAL=1 only when building on purpose with a compiler without OpenMP.
    if os.environ.get("FASTADAM_ALLOW_SERIAL") == "1":
        pytest.skip("serial build explicitly allowed")
    assert _config.openmp_enabled(), "the extension was built without OpenMP"
    pytest.importorskip("threadpoolctl")
    runtime = fastadam.config()["openmp_runtime"]
    assert runtime.rsplit("/", 1)[-1].startswith(("libgomp", "libomp", "libiomp")), runtime


# the extensions that open parallel regions: each must have kept OpenMP (a module that
# compiled without it would run every step on one thread and still pass every other test)
PARALLEL_EXTENSIONS = ("fastadam._core._config", "fastadam._core._dense", "fastadam._core._sparse",
                       "fastadam._core._lowp", "fastadam._core._autodiff_kernels",
                       "fastadam.autodiff._transformer_kernels", "fastadam.optim._bag_kernels")


@pytest.mark.parametrize("module", PARALLEL_EXTENSIONS)
def test_each_parallel_extension_links_the_openmp_runtime(module):
    import importlib
    import shutil
    import subprocess
    import sys

    if os.environ.get("FASTADAM_ALLOW_SERIAL") == "1":
        pytest.skip("serial build explicitly allowed")
    if not sys.platform.startswith("linux") or shutil.which("readelf") is None:
        pytest.skip("reads the ELF dynamic section (Linux, binutils)")
    path = importlib.import_module(module).__file__
    needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                            check=True).stdout
    assert "libgomp" in needed or "libomp" in needed, f"{module} was built without OpenMP"


def test_runtime_dispatch_picked_a_path():
    level = fastadam.config()["simd_level"]
    assert level in {"x86-64-v4", "x86-64-v3", "baseline", "portable"}
    if _config.has_runtime_dispatch():
        assert level != "portable"


def test_show_config_prints_every_fact(capsys):
    fastadam.show_config()
    out = capsys.readouterr().out
    for key in ("simd_level", "openmp", "max_threads", "version"):
        assert key in out


def test_thread_resolution_follows_threadpoolctl():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert resolve_num_threads(None) == 1
    assert resolve_num_threads(-1) == resolve_num_threads(None)
    assert resolve_num_threads(3) == 3


def test_stream_yardstick_checks_its_arrays():
    from fastadam.bench import stream_rw_f32

    a = np.zeros(10, np.float32)
    with pytest.raises(TypeError, match="d: expected dtype float32"):
        stream_rw_f32(a, np.zeros(10), a.copy(), a.copy())


@pytest.mark.parametrize("widths", [(4, 4, 4), (4, 4, 2), (4, 4, 1), (2, 2, 4), (2, 2, 2),
                                    (2, 2, 1), (2, 4, 2), (2, 4, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_stream_bits_moves_every_byte(widths, threads):
    # the low-precision yardstick adds g's bits to x, a and b (truncated to their widths) and
    # 1.0 to each block scale: checked against NumPy's integer arithmetic, with sizes crossing
    # the chunk (32768) and the parallel threshold, and a partial last block
    from fastadam.bench import stream_rw_bits

    kinds = {4: np.uint32, 2: np.uint16, 1: np.uint8}
    xw, gw, sw = widths
    n, block = 3 * 65536 + 37, 256
    rng = np.random.default_rng(sum(widths))
    x, g, a, b = (rng.integers(0, 2**(8 * w), n, dtype=np.uint64).astype(kinds[w])
                  for w in (xw, gw, sw, sw))
    sa, sb = np.arange(-(-n // block), dtype=np.float32), np.zeros(-(-n // block), np.float32)
    want = [(arr.astype(np.uint64) + g) % 2**(8 * arr.itemsize) for arr in (x, a, b)]
    stream_rw_bits(x, g, a, b, scales=(sa, sb), block=block, num_threads=threads)
    for got, expected in zip((x, a, b), want):
        np.testing.assert_array_equal(got.astype(np.uint64), expected)
    np.testing.assert_array_equal(sa, np.arange(sa.size) + 1.0)
    np.testing.assert_array_equal(sb, 1.0)


def test_stream_bits_checks_its_arrays():
    from fastadam.bench import stream_rw_bits

    u8, u16 = np.zeros(10, np.uint8), np.zeros(10, np.uint16)
    with pytest.raises(ValueError, match="no stream loop for x 1 bytes"):
        stream_rw_bits(u8.copy(), u16, u8.copy(), u8.copy())
    with pytest.raises(ValueError, match="b: expected 1-byte elements like a, got 2"):
        stream_rw_bits(u16.copy(), u16, u8.copy(), u16.copy())
    with pytest.raises(ValueError, match="g: expected 10 elements"):
        stream_rw_bits(u16.copy(), u16[:5], u8.copy(), u8.copy())
    with pytest.raises(ValueError, match=r"scales\[0\]: expected shape \(1,\)"):
        stream_rw_bits(u16.copy(), u16, u8.copy(), u8.copy(),
                       scales=(np.zeros(2, np.float32), np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match="block: expected a divisor of 32768"):
        stream_rw_bits(u16.copy(), u16, u8.copy(), u8.copy(), block=100,
                       scales=(np.zeros(1, np.float32), np.zeros(1, np.float32)))


def test_format_stream_builds_each_formats_loop_and_checks_its_widths():
    from fastadam.bench import format_stream

    for param_bytes, state_bytes in [(4, 4), (4, 2), (4, 1), (2, 2), (2, 1)]:
        assert format_stream(param_bytes, state_bytes, 5000, 256, 1)() is None
    with pytest.raises(ValueError, match="state_bytes: expected 4, 2 or 1, got 3"):
        format_stream(4, 3, 5000)
    with pytest.raises(ValueError, match="param_bytes: expected 4 or 2"):
        format_stream(1, 1, 5000)
    with pytest.raises(ValueError, match="block: expected a divisor of 32768"):
        format_stream(4, 1, 5000, block=100)()


def test_step_bytes_per_element_counts_each_format():
    from fastadam.bench import BYTES_PER_ELEMENT_F32, step_bytes_per_element as nbytes

    assert nbytes() == BYTES_PER_ELEMENT_F32 == 7 * 4
    assert nbytes(state=2) == 4 + 4 + 4 + 4 * 2            # x rw, g, m and v rw in bfloat16
    assert nbytes(state=1, block=256) == 16 + 4 * 4 / 256  # + 2 scales read and written / 256
    assert nbytes(2, 2, 1, block=256) == 10 + 16 / 256
    assert nbytes(2, 4, 2, master=True) == 2 + 8 + 4 + 8     # bf16 written, master rw


def test_keep_freed_memory_checks_its_argument():
    with pytest.raises(ValueError, match=r"nbytes: expected 0 < nbytes < 2\*\*31, got 0"):
        fastadam.keep_freed_memory(0)
    with pytest.raises(TypeError, match="nbytes: expected an int, got float"):
        fastadam.keep_freed_memory(1.5)
    # glibc accepts the setting (this machine's C library); elsewhere it reports False.
    import platform
    applied = fastadam.keep_freed_memory(64 * 1024 * 1024)
    assert applied is (platform.libc_ver()[0] == "glibc")


def _setup_module(monkeypatch):
    """setup.py imported as a module (its ``setup()`` call runs only as ``__main__``), or a skip
    where it is not beside the tests (an installed wheel)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")
    if not os.path.isfile(path) or not os.path.isdir(os.path.join(os.path.dirname(path),
                                                                   "include")):
        pytest.skip("setup.py is not beside the tests (installed wheel)")
    pytest.importorskip("setuptools")
    monkeypatch.setenv("FASTADAM_DISABLE_OPENMP", "1")  # no compiler probe on import
    spec = importlib.util.spec_from_file_location("fastadam_setup_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _key(setup, venv, numpy_include, source=b"int f(void) { return 1; }\n",
         flags=("-O3", "-fopenmp"), include="include"):
    """The object key of one compile as setuptools issues it in a venv at ``venv`` (whose
    ``include/`` it adds to the include path) with NumPy's headers at ``numpy_include``."""
    pp_opts = [f"-I{include}", f"-I{numpy_include}", f"-I{venv}/include",
               "-I/opt/python/include/python3.11", "-DNPY_TARGET_VERSION=NPY_1_23_API_VERSION"]
    stand_ins = {numpy_include: "<numpy>", venv: "<venv>"}
    common = ["headers-digest", "2.3.0", "3.11.7 (main)", "cpython-311-x86_64-linux-gnu", "gcc"]
    return setup.compile_key(common, source, ".c", [list(flags), [], pp_opts], stand_ins)


def test_object_cache_key_does_not_depend_on_the_venvs_paths(monkeypatch):
    setup = _setup_module(monkeypatch)
    numpy_a = "/tmp/pip-build-env-a1/overlay/lib/python3.11/site-packages/numpy/_core/include"
    numpy_b = "/tmp/pip-build-env-b2/overlay/lib/python3.11/site-packages/numpy/_core/include"
    key = _key(setup, "/home/u/venv-one", numpy_a)
    # a second venv of the same checkout, NumPy unpacked elsewhere by pip's isolated build
    assert _key(setup, "/home/u/other-env", numpy_b) == key
    # ... but what determines the object still changes the key
    assert _key(setup, "/home/u/venv-one", numpy_a, source=b"int f(void) { return 2; }\n") != key
    assert _key(setup, "/home/u/venv-one", numpy_a, flags=("-O2", "-fopenmp")) != key
    assert _key(setup, "/home/u/venv-one", numpy_a, include="/elsewhere/include") != key
    common = ["headers-digest", "2.3.0", "3.12.1 (main)", "cpython-312-x86_64-linux-gnu", "gcc"]
    assert setup.compile_key(common, b"int f(void) { return 1; }\n", ".c", [[], [], []], {}) != \
        setup.compile_key(common[:2] + ["3.11.7 (main)"] + common[3:],
                          b"int f(void) { return 1; }\n", ".c", [[], [], []], {})
    # Cython's metadata comment records the build's paths; it compiles to nothing
    meta = b"/* BEGIN: Cython Metadata\n{\"include_dirs\": [\"/tmp/x\"]}\nEND: Cython Metadata */\n"
    assert _key(setup, "/home/u/venv-one", numpy_a, source=meta.replace(b"/tmp/x", b"/tmp/y")
                + b"int f(void) { return 1; }\n") == \
        _key(setup, "/home/u/other-env", numpy_b, source=meta + b"int f(void) { return 1; }\n")


def test_this_interpreters_include_folders_get_stand_ins(monkeypatch):
    """The include folders setuptools really passes here (in a venv, the venv's own include/
    among them) and NumPy's: moving them elsewhere, with the stand-ins that interpreter would
    compute, keeps the key."""
    import sys
    setup = _setup_module(monkeypatch)
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext
    cmd = build_ext(Distribution({"ext_modules": []}))
    cmd.finalize_options()
    dirs = list(cmd.include_dirs) + [np.get_include()]
    stand_ins = setup.environment_stand_ins()
    moves = [(np.get_include(), "/tmp/pip-build-env-x/site-packages/numpy/_core/include")]
    if sys.prefix != sys.base_prefix:  # in a venv: its include/ is on setuptools' path
        assert any(d.startswith(sys.prefix + os.sep) for d in cmd.include_dirs), cmd.include_dirs
        moves.append((sys.prefix, "/home/someone/another-venv"))

    def moved(path):
        for old, new in moves:
            path = path.replace(old, new)
        return path

    key = setup.compile_key(["c"], b"", ".c", [[f"-I{d}" for d in dirs]], stand_ins)
    assert setup.compile_key(["c"], b"", ".c", [[f"-I{moved(d)}" for d in dirs]],
                             {moved(k): v for k, v in stand_ins.items()}) == key


class _ChildCompiler:
    """A stand-in for setuptools' compiler: each ``_compile`` runs a child process that spends
    some CPU (as gcc does) and writes the object."""
    compiler_so = ["cc"]

    def __init__(self):
        self.calls = 0

    def _compile(self, obj, src, ext, cc_args, extra_postargs, pp_opts):
        import subprocess
        import sys
        self.calls += 1
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(2_000_000))"], check=True)
        with open(obj, "wb") as fh:
            fh.write(b"object of " + src.encode())


@pytest.mark.parametrize("cached", [True, False])
def test_each_compile_records_its_compilers_cpu_seconds(monkeypatch, tmp_path, cached):
    """FASTADAM_BUILD_TIMES (asv_bench/install_report.py --objects): one line per compile that
    ran, with the CPU seconds of the compiler process (measured here independently, around the
    call), none for an object the cache supplied; with or without the object cache."""
    import resource
    setup = _setup_module(monkeypatch)
    from setuptools import Distribution
    log = tmp_path / "times.txt"
    monkeypatch.setenv("FASTADAM_BUILD_TIMES", str(log))
    cmd = setup.build_ext_cached(Distribution({"ext_modules": []}))
    cmd.compiler = compiler = _ChildCompiler()
    cmd._wrap_compile(tmp_path / "cache" if cached else None)
    src = tmp_path / "kernel.c"
    src.write_text("int f(void) { return 1; }\n")

    def children():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before = children()
    compiler._compile(str(tmp_path / "a.o"), str(src), ".c", ["-O3"], [], [])
    spent = children() - before
    seconds, what = log.read_text().splitlines()[0].split("\t")
    assert what == str(src)
    assert spent > 0.02 and abs(float(seconds) - spent) < 0.015, (seconds, spent)
    compiler._compile(str(tmp_path / "b.o"), str(src), ".c", ["-O3"], [], [])
    assert compiler.calls == (1 if cached else 2)  # a hit copies the object: no compile
    assert (tmp_path / "b.o").read_bytes() == b"object of " + str(src).encode()
    assert len(log.read_text().splitlines()) == compiler.calls
