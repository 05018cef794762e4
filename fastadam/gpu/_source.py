"""Where the CUDA source is and which kernel instantiations each module holds.

No CuPy here: the module lists are shared by the GPU path (``_kernels.py`` compiles them with
``cupy.RawModule``) and by the CPU-only test that compiles the same source to PTX with NVRTC
(``nvrtc_ptx``), so a compile error is caught without a GPU.

The source is ``include/fastadam/cuda/kernels.cu``; it includes the optimizers' formula headers
(``include/fastadam/*.h``), so the include path is the directory holding ``fastadam/``: the
repository's ``include/`` in a source checkout or an editable install, and the copy that
setup.py puts in the package (``fastadam/gpu/include/``) in a wheel.
"""
from pathlib import Path

from .. import drivers

# The optimizers of the registration list (include/fastadam/optimizers.def) that have element
# kernels, by name (the row-wise ones, drivers.ROWWISE_KINDS, have the "rowwise" family below).
KINDS = {name: kind for name, kind in drivers.KINDS.items() if kind not in drivers.ROWWISE_KINDS}
# Storage types of the kernels: float16 is held as its bits and computed in float32.
STORAGE = {"float16": "unsigned short", "float32": "float", "float64": "double"}


def dense_flags(kind):
    """Flag combinations the dense kernel of ``kind`` is instantiated for (the C list's)."""
    return tuple(f for f in range(16) if drivers.dense_supported(kind, f))


def sparse_flags(kind):
    """Flag combinations of the sparse kernels of ``kind`` (never FA_SCALE; two slots at most)."""
    return tuple(f for f in range(16) if drivers.sparse_supported(kind, f))


DENSE_FLAGS = {kind: dense_flags(kind) for kind in KINDS.values()}
SPARSE_FLAGS = {kind: sparse_flags(kind) for kind in KINDS.values()}

# The row-wise optimizers (one state value per row: fa_rowwise_* kernels, one thread per row,
# float32 and float64), by name, and the flag sets of their dense and sparse kernels.
ROWWISE_KINDS = {name: kind for name, kind in drivers.KINDS.items()
                 if kind in drivers.ROWWISE_KINDS}
ROWWISE_DENSE_FLAGS = {kind: tuple(f for f in range(16)
                                   if drivers.rowwise_supported(kind, f, False))
                       for kind in ROWWISE_KINDS.values()}
ROWWISE_SPARSE_FLAGS = {kind: tuple(f for f in range(16)
                                    if drivers.rowwise_supported(kind, f, True))
                        for kind in ROWWISE_KINDS.values()}


# The state formats of the low-precision kernels (fa_lowp_*; FA_FMT_* of fastadam/lowp.h), and
# the gradient formats of their non-finite check.
LOWP_STATES = {"float32": 0, "bfloat16": 1, "int8": 2}
LOWP_GRADS = {"float32": 0, "bfloat16": 1}


def include_dir():
    """The directory that holds ``fastadam/formulas.h`` and ``fastadam/cuda/kernels.cu``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "include", here.parents[1] / "include"):
        if (candidate / "fastadam" / "cuda" / "kernels.cu").is_file():
            return candidate
    raise FileNotFoundError("fastadam.gpu: the CUDA source fastadam/cuda/kernels.cu was not "
                            f"found under {here / 'include'} nor {here.parents[1] / 'include'}; "
                            "reinstall fastadam")


def source():
    """The CUDA source text."""
    return (include_dir() / "fastadam" / "cuda" / "kernels.cu").read_text()


def dense_name(storage, kind, flags):
    return f"fa_dense_step<{STORAGE[storage]}, {kind}, {flags}>"


def nonfinite_name(storage):
    return f"fa_nonfinite<{STORAGE[storage]}>"


def segment_sum_name(storage):
    return f"fa_segment_sum<{STORAGE[storage]}>"


def sparse_rows_name(storage, kind, flags, catchup):
    return f"fa_sparse_rows<{STORAGE[storage]}, {kind}, {flags}, {int(catchup)}>"


def sparse_dense_name(storage, kind, flags):
    return f"fa_sparse_dense<{STORAGE[storage]}, {kind}, {flags}>"


def rowwise_dense_name(storage, kind, flags):
    return f"fa_rowwise_dense<{STORAGE[storage]}, {kind}, {flags}>"


def rowwise_rows_name(storage, kind, flags, catchup):
    return f"fa_rowwise_rows<{STORAGE[storage]}, {kind}, {flags}, {int(catchup)}>"


def rowwise_all_name(storage, kind, flags):
    return f"fa_rowwise_all<{STORAGE[storage]}, {kind}, {flags}>"


def lowp_dense_name(state, kind, flags):
    return f"fa_lowp_dense<{LOWP_STATES[state]}, {kind}, {flags}>"


def lowp_rows_name(state, kind, flags):
    return f"fa_lowp_rows<{LOWP_STATES[state]}, {kind}, {flags}>"


def lowp_nonfinite_name(grad):
    return f"fa_lowp_nonfinite<{LOWP_GRADS[grad]}>"


def module_names(family, storage, kind=None):
    """The name expressions of one compiled module.  Families: "dense" (a kind's multi-tensor
    steps for every flag combination, and the non-finite reduction), "sparse" (a kind's lazy,
    catch-up and dense-mode sparse steps), "segment" (the segment sum) and "lowp" (a kind's
    low-precision dense and lazy-rows steps for the state format ``storage``, every flag
    combination, and the non-finite reductions of both gradient formats) and "rowwise" (a
    row-wise optimizer's dense, lazy, catch-up and dense-mode steps)."""
    if family == "lowp":
        return ([lowp_dense_name(storage, kind, f) for f in DENSE_FLAGS[kind]]
                + [lowp_rows_name(storage, kind, f) for f in SPARSE_FLAGS[kind]]
                + [lowp_nonfinite_name(g) for g in LOWP_GRADS])
    if family == "dense":
        return [dense_name(storage, kind, f) for f in DENSE_FLAGS[kind]] + [nonfinite_name(storage)]
    if family == "sparse":
        names = []
        for f in SPARSE_FLAGS[kind]:
            names += [sparse_rows_name(storage, kind, f, c) for c in (0, 1)]
            names.append(sparse_dense_name(storage, kind, f))
        return names
    if family == "segment":
        return [segment_sum_name(storage)]
    if family == "rowwise":
        names = [rowwise_dense_name(storage, kind, f) for f in ROWWISE_DENSE_FLAGS[kind]]
        for f in ROWWISE_SPARSE_FLAGS[kind]:
            names += [rowwise_rows_name(storage, kind, f, c) for c in (0, 1)]
            names.append(rowwise_all_name(storage, kind, f))
        return names
    raise ValueError(f"family: expected 'dense', 'sparse', 'segment', 'rowwise' or 'lowp', got "
                     f"{family!r}")


def all_modules():
    """(family, storage, kind) of every module the GPU path can compile."""
    mods = []
    for storage in STORAGE:
        for kind in KINDS.values():
            mods.append(("dense", storage, kind))
            if storage != "float16":  # the sparse kernels are float32/float64, as on the CPU
                mods.append(("sparse", storage, kind))
        if storage != "float16":
            mods.append(("segment", storage, None))
    for state in LOWP_STATES:
        for kind in KINDS.values():
            mods.append(("lowp", state, kind))
    for storage in ("float32", "float64"):
        for kind in ROWWISE_KINDS.values():
            mods.append(("rowwise", storage, kind))
    return mods


def compile_options():
    """NVRTC options.  --fmad=false: no FMA contraction, as the C build's -ffp-contract=off, so
    every operation of a formula rounds as on the CPU (NVRTC's division and sqrt are IEEE
    round-to-nearest by default): float32/float64 results equal the CPU kernels' bit for bit."""
    return ("-I" + str(include_dir()), "--fmad=false")  # the language standard: NVRTC's default


def cupy_source():
    """The source as given to cupy.RawModule: prefixed by a digest of every header it includes,
    because CuPy's on-disk kernel cache is keyed by the source text and options only (a changed
    formula header must not reuse a stale binary)."""
    import hashlib

    digest = hashlib.sha256()
    for header in sorted((include_dir() / "fastadam").rglob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return f"// fastadam headers {digest.hexdigest()}\n" + source()


def nvrtc_ptx(names, arch="compute_75"):
    """Compile the source with NVRTC (cuda-bindings) for the virtual architecture ``arch`` and
    return (ptx, {name expression: lowered name}).  No GPU needed.  Raises RuntimeError with
    NVRTC's log on a compile error."""
    from cuda.bindings import nvrtc

    def check(result, what, prog=None):
        err = result[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = ""
            if prog is not None:
                _, size = nvrtc.nvrtcGetProgramLogSize(prog)
                buf = b" " * size
                nvrtc.nvrtcGetProgramLog(prog, buf)
                log = buf.decode(errors="replace")
            raise RuntimeError(f"NVRTC {what} failed ({err}):\n{log}")
        return result[1:]

    (prog,) = check(nvrtc.nvrtcCreateProgram(source().encode(), b"kernels.cu", 0, [], []),
                    "create")
    try:
        for name in names:
            check(nvrtc.nvrtcAddNameExpression(prog, name.encode()), "add name", prog)
        opts = [o.encode() for o in compile_options()] + [f"--gpu-architecture={arch}".encode()]
        check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compile", prog)
        (size,) = check(nvrtc.nvrtcGetPTXSize(prog), "PTX size", prog)
        ptx = b" " * size
        check(nvrtc.nvrtcGetPTX(prog, ptx), "PTX", prog)
        lowered = {}
        for name in names:
            (low,) = check(nvrtc.nvrtcGetLoweredName(prog, name.encode()), "lowered name", prog)
            lowered[name] = low.decode() if isinstance(low, bytes) else str(low)
        return ptx.rstrip(b"\x00 ").decode(), lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
