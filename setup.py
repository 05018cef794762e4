"""Build script for fastadam's compiled core.

``EXTENSIONS`` below lists every compiled module by name with its sources: the drivers in the
private package ``fastadam._core`` (with the C kernels of include/fastadam/, where runtime CPU
dispatch lives), then each package's own compiled module.  A new extension is one new row
there; no file-name convention decides what is built.

Flags: ``-O3 -fno-math-errno`` (so gcc vectorizes sqrt), ``-ffp-contract=off`` (no FMA contraction:
the SIMD body, the scalar tail and every dispatch target round identically, so results do not depend
on the CPU or the thread count), ``-Werror=implicit-function-declaration`` (an API the headers hide
is a build error, not a missing symbol at import), OpenMP when the compiler has it (``-fopenmp``; Apple clang with
libomp), ``-g0`` unless ``FASTADAM_DEBUG=1``; ``FASTADAM_SANITIZE=1`` adds ASAN and UBSAN (the CI
sanitizer job, tests/sanitize.sh).  Never ``-march=native``:
kernels pick their instruction set at run time (see include/fastadam/common.h).
"""
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def libomp_prefix():
    """macOS: where Homebrew's libomp is (LIBOMP_PREFIX, else ``brew --prefix libomp``)."""
    if os.environ.get("LIBOMP_PREFIX"):
        return os.environ["LIBOMP_PREFIX"]
    try:
        out = subprocess.run(["brew", "--prefix", "libomp"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def openmp_flags():
    """(compile flags, link flags) that build and link an OpenMP program, or None.

    gcc and LLVM clang take ``-fopenmp``; Apple's clang needs ``-Xpreprocessor -fopenmp`` and
    libomp (``brew install libomp``), which delocate then bundles into the macOS wheel."""
    if os.environ.get("FASTADAM_DISABLE_OPENMP"):
        return None
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    prefix = libomp_prefix() if sys.platform == "darwin" else None
    if prefix:
        candidates.append((["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"],
                           [f"-L{prefix}/lib", "-lomp"]))
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    code = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "check_openmp.c"
        src.write_text(code)
        for cflags, lflags in candidates:
            cmd = cc.split() + cflags + [str(src), "-o", str(Path(tmp) / "check_openmp")] + lflags
            try:
                if subprocess.run(cmd, capture_output=True).returncode == 0:
                    return cflags, lflags
            except OSError:
                return None
    return None


OPENMP_FLAGS = openmp_flags()
OPENMP = OPENMP_FLAGS is not None
if not OPENMP:
    hint = " (macOS: brew install libomp, or set LIBOMP_PREFIX)" if sys.platform == "darwin" else ""
    print(f"fastadam: the compiler has no OpenMP{hint}; building a serial extension: every step "
          f"runs on one thread", file=sys.stderr)

# -Werror=implicit-function-declaration: a function the headers hide (NumPy's C-API above the
# target version) is a build error, not an extension that fails to load (undefined symbol)
compile_args = ["-O3", "-fno-math-errno", "-ffp-contract=off", "-std=gnu11",
                "-Werror=implicit-function-declaration"]
link_args = []
# NPY_TARGET_VERSION: the oldest NumPy the extensions run with (pyproject's numpy floor), whatever
# NumPy builds them: NumPy 2.0's headers otherwise target 1.19 and hide the 1.22 memory-handler API
# that fastadam/_core/_mempool.pyx calls (the extension then fails to load: undefined symbol).
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_23_API_VERSION"),
          ("NPY_TARGET_VERSION", "NPY_1_23_API_VERSION"), ("FASTADAM_OPENMP", int(OPENMP))]
if OPENMP:
    compile_args += OPENMP_FLAGS[0]
    link_args += OPENMP_FLAGS[1]
# FASTADAM_SANITIZE=1: AddressSanitizer and UndefinedBehaviorSanitizer in every extension, for
# the CI job tests/sanitize.sh (which builds into a copy of the tree and runs Python with the
# ASAN runtime preloaded).  Never for a wheel: the extensions then need that runtime loaded.
SANITIZE = os.environ.get("FASTADAM_SANITIZE") == "1"
if SANITIZE:
    sanitizers = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                  "-fno-omit-frame-pointer"]
    # after -O3: the later level wins; -O0 compiles the large Cython modules several times
    # faster than -O1 and keeps every access the sanitizers check; -g1: line numbers in reports
    compile_args += sanitizers + ["-O0", "-g1"]
    link_args += sanitizers
# Shipped extensions carry no debug info (Python's CFLAGS say -g: 3.7 MB of .so instead of
# 0.8 MB); FASTADAM_DEBUG=1 keeps it for a debugger or a profiler.
if not os.environ.get("FASTADAM_DEBUG") and not SANITIZE:
    compile_args.append("-g0")
    if sys.platform.startswith("linux"):
        link_args.append("-Wl,--strip-debug")


# module name: its sources (a Cython module first, then C files compiled into the same extension)
EXTENSIONS = {
    # the compiled drivers (private): fastadam/_core/
    "fastadam._core._coeffs": ["fastadam/_core/_coeffs.pyx"],
    "fastadam._core._config": ["fastadam/_core/_config.pyx"],
    "fastadam._core._validation": ["fastadam/_core/_validation.pyx"],
    "fastadam._core._dense": ["fastadam/_core/_dense.pyx", "include/fastadam/dense.c"],
    "fastadam._core._sparse": ["fastadam/_core/_sparse.pyx", "include/fastadam/sparse.c"],
    "fastadam._core._lowp": ["fastadam/_core/_lowp.pyx", "include/fastadam/lowp.c"],
    "fastadam._core._autodiff_kernels": ["fastadam/_core/_autodiff_kernels.pyx",
                                         "include/fastadam/autodiff_kernels.c"],
    "fastadam._core._mempool": ["fastadam/_core/_mempool.pyx", "include/fastadam/mempool.c"],
    # each package's own compiled module
    "fastadam.autodiff._tape": ["fastadam/autodiff/_tape.pyx"],
    "fastadam.autodiff._transformer_kernels": ["fastadam/autodiff/_transformer_kernels.pyx",
                                               "include/fastadam/transformer_kernels.c"],
    "fastadam.sparse._csr": ["fastadam/sparse/_csr.pyx"],
    "fastadam.optim._bag_kernels": ["fastadam/optim/_bag_kernels.pyx"],
    "fastadam.optim._step_path": ["fastadam/optim/_step_path.pyx"],
    "fastadam.sklearn._kernels": ["fastadam/sklearn/_kernels.pyx"],
    "fastadam.bench._yardstick": ["fastadam/bench/_yardstick.pyx", "include/fastadam/yardstick.c"],
}


def make_extensions():
    extensions = []
    # Every kernel header: a change to one rebuilds the extensions (setuptools does not scan
    # #include lines itself).
    headers = [str(h.relative_to(HERE)) for h in sorted((HERE / "include").rglob("*"))
               if h.suffix in (".h", ".def")]
    for module, sources in EXTENSIONS.items():
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
    return cythonize_cached(extensions, {
        "language_level": 3,
        "boundscheck": False,
        "wraparound": False,
        "cdivision": True,
        "initializedcheck": False,
    })


def children_cpu_seconds():
    """User + system CPU seconds of this process's finished child processes (the compilers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def record_build_time(what, seconds):
    """Append ``seconds<TAB>what`` to the file ``FASTADAM_BUILD_TIMES`` names, if it names one.

    asv_bench/install_report.py --objects reads it: the CPU time of every compiled object (the
    compiler process, not setuptools) and of cythonize, so a change to the kernels' instantiation
    or the flags shows its build cost per file.  Exact with ``FASTADAM_BUILD_JOBS=1``; with
    parallel jobs a compile's interval also counts the compilers that finish beside it."""
    where = os.environ.get("FASTADAM_BUILD_TIMES")
    if where:
        with open(where, "a") as fh:
            fh.write(f"{seconds:.2f}\t{what}\n")


def object_cache():
    """The folder of cached build products, or None when ``FASTADAM_OBJECT_CACHE=0``."""
    where = os.environ.get("FASTADAM_OBJECT_CACHE", str(HERE / "build" / "object-cache"))
    return None if where == "0" else Path(where)


def cythonize_cached(extensions, directives):
    """``cythonize``, reusing the C it generated before for the same inputs.

    pip's isolated build unpacks NumPy (and its ``.pxd`` files) anew for every install, so
    cythonize finds every module that cimports numpy out of date and regenerates it.  The key
    here is what the C really depends on: Cython's and NumPy's versions, the directives and
    every ``.pyx``/``.pxd``/``.pxi`` of the package.  A hit copies the C beside its ``.pyx``,
    newer than anything cythonize compares it with."""
    import Cython

    cache = object_cache()
    keyed = {}
    if cache is not None:
        digest = hashlib.sha256(repr((Cython.__version__, np.__version__,
                                      sorted(directives.items()))).encode())
        for f in sorted((HERE / "fastadam").rglob("*")):
            if f.suffix in (".pyx", ".pxd", ".pxi"):
                digest.update(str(f.relative_to(HERE)).encode() + b"\0" + f.read_bytes())
        for ext in extensions:
            generated = (HERE / ext.sources[0]).with_suffix(".c")
            keyed[generated] = cache / (hashlib.sha256(
                (digest.hexdigest() + ext.name).encode()).hexdigest() + ".c")
            if keyed[generated].exists():
                shutil.copyfile(keyed[generated], generated)
        if all(cached.exists() for cached in keyed.values()):
            # every module's C is known: compile it as cythonize would, without starting Cython
            # (about a second of each of the three setup.py runs of a pip install)
            for ext in extensions:
                ext.sources[0] = str(Path(ext.sources[0]).with_suffix(".c"))
            return extensions
    from Cython.Build import cythonize

    cpu = time.process_time() + children_cpu_seconds()
    result = cythonize(extensions, compiler_directives=directives,
                       nthreads=int(os.environ.get("FASTADAM_BUILD_JOBS", 0)) or os.cpu_count() or 1)
    record_build_time("cythonize", time.process_time() + children_cpu_seconds() - cpu)
    for generated, cached in keyed.items():
        if generated.exists() and not cached.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(generated, tmp)
            os.replace(tmp, cached)
    return result


class build_py_with_cuda_source(build_py):
    """Also copy the CUDA source and the headers it includes into the package
    (fastadam/gpu/include/fastadam/...): the GPU path compiles them with NVRTC at run time, so a
    wheel must carry them (a source checkout reads include/ directly)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "fastadam" / "gpu" / "include"
        for src in sorted((HERE / "include" / "fastadam").rglob("*")):
            if src.suffix in (".h", ".cu", ".def"):  # optimizers.def: the registration list
                dst = target / src.relative_to(HERE / "include")
                dst.parent.mkdir(parents=True, exist_ok=True)
                self.copy_file(str(src), str(dst))


def without_cython_metadata(source):
    """C source without Cython's metadata comment, which records the build's include paths
    (NumPy's moves with pip's temporary build env); the comment compiles to nothing."""
    return re.sub(rb"/\* BEGIN: Cython Metadata.*?END: Cython Metadata \*/", b"", source,
                  count=1, flags=re.DOTALL)


class build_ext_cached(build_ext):
    """Compile the extensions in parallel, and reuse object files across builds.

    pip builds every install (``pip install -e .``, then ``-e '.[test]'``, ...) in a fresh
    temporary folder, so setuptools alone recompiles all of the C each time.  Here each object
    file is stored in ``build/object-cache/`` of the source tree (``FASTADAM_OBJECT_CACHE``
    overrides the folder; ``0`` turns the cache off) under a hash of everything that can change
    it: the source file, every header of ``include/``, NumPy's version, the compiler command, its
    flags and the Python ABI (``compile_key``).  The folders that only name an environment (the
    venv's, pip's temporary NumPy) are replaced by stand-ins first, so every virtual environment
    of a checkout shares the objects.  A hit copies the object instead of compiling.
    Parallel jobs: ``FASTADAM_BUILD_JOBS`` (default: the CPU count)."""

    def initialize_options(self):
        super().initialize_options()
        self.parallel = int(os.environ.get("FASTADAM_BUILD_JOBS", 0)) or os.cpu_count() or 1

    def build_extensions(self):
        self._wrap_compile(object_cache())
        super().build_extensions()

    def _wrap_compile(self, cache):
        """Route each compile through the object cache folder ``cache`` (None: no cache) and
        record the CPU time of each compile that runs (``record_build_time``)."""
        compiler = self.compiler
        if getattr(compiler, "_fastadam_cached", False) or not hasattr(compiler, "_compile"):
            return
        if cache is not None:
            common = compile_key_common(" ".join(getattr(compiler, "compiler_so", []) or []))
            stand_ins = environment_stand_ins()
        original = compiler._compile

        def compile_cached(obj, src, ext, cc_args, extra_postargs, pp_opts):
            if cache is not None:
                key = compile_key(common, Path(src).read_bytes(), ext,
                                  [cc_args, extra_postargs, pp_opts], stand_ins)
                cached = cache / (key + ".o")
                if cached.exists():
                    os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
                    shutil.copyfile(cached, obj)
                    return
            cpu = children_cpu_seconds()
            original(obj, src, ext, cc_args, extra_postargs, pp_opts)
            record_build_time(src, children_cpu_seconds() - cpu)
            if cache is not None:
                cache.mkdir(parents=True, exist_ok=True)
                tmp = cache / (key + f".{os.getpid()}.tmp")
                shutil.copyfile(obj, tmp)
                os.replace(tmp, cached)  # another build may race: each writes whole files

        compiler._compile = compile_cached
        compiler._fastadam_cached = True


def compile_key_common(compiler_command):
    """The part of every object's key that is the same for the whole build: every header of
    ``include/``, NumPy's version (its headers and C-API), the Python ABI (version and SOABI) and
    the compiler command with the flags Python was built with."""
    headers = hashlib.sha256()
    for h in sorted((HERE / "include").rglob("*")):
        if h.is_file():
            headers.update(str(h.relative_to(HERE)).encode() + h.read_bytes())
    return [headers.hexdigest(), np.__version__, sys.version,
            str(sysconfig.get_config_var("SOABI")), compiler_command]


def environment_stand_ins():
    """{folder: stand-in} for the folders that name an environment rather than what it holds.

    pip's isolated build unpacks NumPy into a fresh temporary folder for every install, and
    setuptools adds the virtual environment's own ``include/`` folder to the include path; both
    would change every key, so that a second virtual environment of the same checkout (or a
    second ``pip install``) recompiled everything.  What they stand for is in the key already:
    NumPy's version for its headers, and the sources include nothing from the venv's folder."""
    stand_ins = {os.path.realpath(np.get_include()): "<numpy>", np.get_include(): "<numpy>"}
    for prefix in {sys.prefix, sys.exec_prefix}:
        if prefix != sys.base_prefix and prefix != sys.base_exec_prefix:  # inside a venv
            stand_ins[prefix] = stand_ins[os.path.realpath(prefix)] = "<venv>"
    return stand_ins


def compile_key(common, source, ext, args, stand_ins):
    """The object cache's key of one compiled file: a hash of ``common``
    (``compile_key_common``), the source's bytes (without Cython's metadata comment), its
    extension and the compile arguments (lists of strings), where every folder of ``stand_ins``
    is replaced by its stand-in (``environment_stand_ins``), longest first."""
    folders = sorted(stand_ins, key=len, reverse=True)

    def stable(arg):
        arg = str(arg)
        for folder in folders:
            arg = arg.replace(folder, stand_ins[folder])
        return arg

    text = "\0".join(common + [ext] + [repr([stable(a) for a in group]) for group in args])
    return hashlib.sha256(text.encode() + without_cython_metadata(source)).hexdigest()


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__ too
    setup(ext_modules=make_extensions(),
          cmdclass={"build_py": build_py_with_cuda_source, "build_ext": build_ext_cached})
