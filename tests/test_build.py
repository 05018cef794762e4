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


def test_keep_freed_memory_checks_its_argument():
    with pytest.raises(ValueError, match=r"nbytes: expected 0 < nbytes < 2\*\*31, got 0"):
        fastadam.keep_freed_memory(0)
    with pytest.raises(TypeError, match="nbytes: expected an int, got float"):
        fastadam.keep_freed_memory(1.5)
    # glibc accepts the setting (this machine's C library); elsewhere it reports False.
    import platform
    applied = fastadam.keep_freed_memory(64 * 1024 * 1024)
    assert applied is (platform.libc_ver()[0] == "glibc")
