"""Build (once, cached by content) the host emulation of the GPU kernels: tests/gpu_emulation.cpp
with include/fastadam/cuda/kernels.cu, as a shared library.  Used by test_gpu_emulation.py and by
the fake CuPy in tests/fake_cupy."""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    pass


def build():
    """The loaded library; BuildError (with the compiler's message) if it cannot be built."""
    from fastadam.gpu import _source

    include = _source.include_dir()
    cpp = HERE / "gpu_emulation.cpp"
    files = [cpp] + sorted(p for p in (include / "fastadam").rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
    lib = Path(tempfile.gettempdir()) / f"fastadam_gpu_emulation_{digest}.so"
    if not lib.exists():
        cxx = shutil.which("g++")
        if cxx is None:
            raise BuildError("needs g++ to build the host emulation of the GPU kernels")
        tmp = lib.with_name(f"{lib.stem}.{os.getpid()}.tmp.so")
        out = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-math-errno",
                              "-shared", "-fPIC", "-I", str(include), str(cpp), "-o", str(tmp)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise BuildError(out.stderr)
        tmp.replace(lib)  # atomic: concurrent builders never load a half-written file
    return ctypes.CDLL(str(lib))
