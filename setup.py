"""Build script for fastadam's compiled core.

Every Cython module ``fastadam/[SUBPACKAGE/]_NAME.pyx`` becomes the extension
``fastadam.[SUBPACKAGE.]_NAME``; if a C file ``include/fastadam/NAME.c`` exists it is compiled into
that extension (that is where kernels with runtime CPU dispatch live).  Adding a capability
therefore needs no edit here.

Flags: ``-O3 -fno-math-errno`` (so gcc vectorizes sqrt), ``-ffp-contract=off`` (no FMA contraction:
the SIMD body, the scalar tail and every dispatch target round identically, so results do not depend
on the CPU or the thread count), ``-fopenmp`` when the compiler has it.  Never ``-march=native``:
kernels pick their instruction set at run time (see include/fastadam/common.h).
"""
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent


def compiler_has_openmp():
    """Compile and link a tiny OpenMP program with the compiler Python was built with."""
    if os.environ.get("FASTADAM_DISABLE_OPENMP"):
        return False
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    code = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "check_openmp.c"
        src.write_text(code)
        cmd = cc.split() + ["-fopenmp", str(src), "-o", str(Path(tmp) / "check_openmp")]
        try:
            return subprocess.run(cmd, capture_output=True).returncode == 0
        except OSError:
            return False


OPENMP = compiler_has_openmp()
if not OPENMP:
    print("fastadam: the compiler has no OpenMP; building a serial extension", file=sys.stderr)

compile_args = ["-O3", "-fno-math-errno", "-ffp-contract=off", "-std=gnu11"]
link_args = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_23_API_VERSION"), ("FASTADAM_OPENMP", int(OPENMP))]
if OPENMP:
    compile_args.append("-fopenmp")
    link_args.append("-fopenmp")


def make_extensions():
    extensions = []
    # Every kernel header: a change to one rebuilds the extensions (setuptools does not scan
    # #include lines itself).
    headers = [str(h.relative_to(HERE)) for h in sorted((HERE / "include").rglob("*.h"))]
    for pyx in sorted((HERE / "fastadam").rglob("_*.pyx")):
        name = pyx.stem
        module = ".".join(pyx.relative_to(HERE).with_suffix("").parts)
        sources = [str(pyx.relative_to(HERE))]
        kernel = HERE / "include" / "fastadam" / (name[1:] + ".c")
        if kernel.exists():
            sources.append(str(kernel.relative_to(HERE)))
        extensions.append(
            Extension(
                module,
                sources=sources,
                depends=headers,
                include_dirs=["include", np.get_include()],
                define_macros=macros,
                extra_compile_args=compile_args,
                extra_link_args=link_args,
            )
        )
    return cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )


setup(ext_modules=make_extensions())
