"""The package's layering, read from the source: no package uses another's private names (the
front-ends not even the core's), no two packages import each other, and setup.py builds exactly
the compiled modules there are.

Every module of ``fastadam/`` is read without importing it: Python files with ``ast`` (every
import statement, at module level or inside a function: a lazy import is still a dependency),
Cython files (``.pyx``, ``.pxd``) line by line for ``import`` and ``cimport`` statements.

- **No package imports another package's private modules or names**: no module whose dotted
  path has a part starting with ``_`` inside the other package (``fastadam.gpu._validation``,
  ``fastadam.optim._functional``) and no name starting with ``_``.  The one exception is the
  compiled core, ``fastadam._core``, whose private modules the layers of the package itself
  (``optim``, ``sparse``, ``autodiff``, the top-level modules) are built on.
- **Front-ends** (``onnx``, ``sklearn``, ``distributed``, ``gpu``, ``torch``) have no exception:
  not even ``fastadam._core``.
- ``optim`` imports nothing of ``autodiff``: it recognises a tensor parameter by its ``.data``
  and ``.grad`` (fastadam/optim/_params.py), so the optimizers do not depend on the engine.
- **No import cycles between packages**.  A node is a subpackage of ``fastadam`` (``optim``,
  ``sparse``, ``_core``, ...), a top-level module (``fastadam._omp_wait``), or the facade
  ``fastadam/__init__.py``.  One exemption: a package ``__init__``'s module-level
  ``__getattr__`` may forward a moved name to its new home (a deprecated alias, imported at
  attribute access only).
- **No import cycles between two modules of one package**.

The checker is a plain function of a directory, so the tests below also feed it small synthetic
trees with the faults it must find (the private imports and the cycles of the tree before
issue 20).
"""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = ("onnx", "sklearn", "distributed", "gpu", "torch")


# ---------------------------------------------------------------------------------------------
# Reading the imports

@functools.lru_cache(maxsize=None)
def module_names(package_dir):
    """{dotted module name: [files]} for every .py, .pyx, .pxd under package_dir (a .pyx and its
    .pxd are one module)."""
    top = package_dir.parent
    mods = {}
    for path in sorted(package_dir.rglob("*")):
        if path.suffix not in (".py", ".pyx", ".pxd") or "include" in path.relative_to(top).parts:
            continue
        parts = list(path.relative_to(top).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods.setdefault(".".join(parts), []).append(path)
    return mods


def _absolute(module, is_package, level, target):
    """The absolute name of a relative import ``from <level dots><target> import ...``."""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _python_imports(path, module):
    """(line, imported module, imported name or None) of every import in a Python file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.stem == "__init__"
    skipped = set()
    for node in tree.body:  # a package's deprecated-alias forwarding: see the module docstring
        if is_package and isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            skipped.update(id(n) for n in ast.walk(node))
    inner_attributes = {id(n.value) for n in ast.walk(tree)
                        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Attribute) and id(node) not in inner_attributes:
            # a dotted use after ``import fastadam``: fastadam.optim._functional.dense_step
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "fastadam":
                parts.reverse()
                yield node.lineno, ".".join(["fastadam"] + parts[:-1]), parts[-1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = (_absolute(module, is_package, node.level, node.module) if node.level
                    else node.module)
            for alias in node.names:
                yield node.lineno, base, alias.name


_CY_FROM = re.compile(r"^\s*from\s+([.\w]+)\s+c?import\s+(.+)$")
_CY_IMPORT = re.compile(r"^\s*c?import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)"
                        r"\s*(?:#.*)?$")


def _cython_imports(path, module):
    """The same for a Cython file, read line by line (parenthesized lists may span lines)."""
    lines = path.read_text().splitlines()
    is_package = path.stem == "__init__"
    i = 0
    while i < len(lines):
        lineno, line = i + 1, lines[i].split("#")[0]
        i += 1
        match = _CY_FROM.match(line)
        if match:
            base, names = match.groups()
            if "(" in names:
                while ")" not in names and i < len(lines):
                    names += " " + lines[i].split("#")[0]
                    i += 1
            if base.startswith("."):
                level = len(base) - len(base.lstrip("."))
                base = _absolute(module, is_package, level, base.lstrip(".") or None)
            for name in names.replace("(", " ").replace(")", " ").split(","):
                name = name.split()[0] if name.split() else ""
                if name and name != "*":
                    yield lineno, base, name
            continue
        match = _CY_IMPORT.match(line)
        if match:
            for item in match.group(1).split(","):
                yield lineno, item.split()[0], None


@functools.lru_cache(maxsize=None)
def read_imports(package_dir):
    """[(importing module, file, line, imported module, imported name or None)] of every import
    of a fastadam module in the tree; ``from A import b`` with ``A.b`` a module counts as an
    import of the module ``A.b``."""
    mods = module_names(package_dir)
    top = package_dir.name
    found = []
    for module, paths in mods.items():
        for path in paths:
            reader = _python_imports if path.suffix == ".py" else _cython_imports
            for line, target, name in reader(path, module):
                if target != top and not target.startswith(top + "."):
                    continue
                if name is not None and f"{target}.{name}" in mods:
                    target, name = f"{target}.{name}", None
                found.append((module, path, line, target, name))
    return found


# ---------------------------------------------------------------------------------------------
# The rules

def _package_of(module, top):
    """The subpackage a module belongs to (its first part after the top package), or None for
    the top package's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == top else None


def private_imports(package_dir, front_ends=FRONT_ENDS):
    """Messages for every import of a private name of another package (for a front-end, the
    core's too)."""
    top = package_dir.name
    problems = []
    for module, path, line, target, name in read_imports(package_dir):
        own, theirs = _package_of(module, top), _package_of(target, top)
        if theirs is None or theirs == own:
            continue
        if own in front_ends:
            first = 1  # the whole path: not even fastadam._core or fastadam._stacklevel
        elif theirs == "_core":
            continue  # the compiled core is open to the package's own layers
        else:
            first = 2  # inside the other package (a top-level module's own name is the top's)
        private_parts = [p for p in target.split(".")[first:] if p.startswith("_")
                         and not (p.startswith("__") and p.endswith("__"))]
        private_name = name is not None and name.startswith("_") and not name.startswith("__")
        if private_parts or private_name:
            what = f"{target}.{name}" if name else target
            where = path.relative_to(package_dir.parent)
            who = f"front-end {own!r}" if own in front_ends else f"{own or top!r}"
            problems.append(f"{where}:{line}: {who} imports the private {what}")
    return problems


def _node(module, mods, top):
    """The node of the package graph a module belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return top  # the facade, fastadam/__init__.py
    if len(parts) == 2 and not any(p.stem == "__init__" for p in mods.get(module, [])):
        return module  # a top-level module
    return f"{top}.{parts[1]}"


def _cycles(edges):
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_cycles(package_dir):
    """Cycles between packages, each with the imports that make it."""
    top = package_dir.name
    mods = module_names(package_dir)
    edges = {}
    for module, path, line, target, name in read_imports(package_dir):
        a, b = _node(module, mods, top), _node(target, mods, top)
        if a != b:
            edges.setdefault((a, b), []).append(f"{path.relative_to(package_dir.parent)}:{line}")
    return [(comp, {e: w for e, w in edges.items() if e[0] in comp and e[1] in comp})
            for comp in _cycles(edges)]


def module_cycles(package_dir):
    """Cycles between modules of one package."""
    top = package_dir.name
    mods = module_names(package_dir)
    edges = set()
    for module, _, _, target, _ in read_imports(package_dir):
        if module != target and _node(module, mods, top) == _node(target, mods, top):
            edges.add((module, target))
    return _cycles(edges)


# ---------------------------------------------------------------------------------------------
# The package as it is

def _package_dir():
    """The fastadam being tested: the source tree, or an installed wheel (which ships its .pyx
    and .pxd files too)."""
    import fastadam

    return Path(fastadam.__file__).resolve().parent


PACKAGE = _package_dir()


def test_the_reader_sees_every_kind_of_import():
    found = {(m, t, n) for m, _, _, t, n in read_imports(PACKAGE)}
    # a relative Python import, a lazy one, a cimport of a .pxd, a Cython import
    assert ("fastadam.optim._adam", "fastadam.optim._base", "Optimizer") in found
    assert ("fastadam.optim._adam", "fastadam.optim._torch", "adam_from_torch") in found
    assert ("fastadam._core._dense", "fastadam._core._coeffs", "Coefficients") in found
    assert any(m == "fastadam.sklearn._kernels" and t.startswith("fastadam.")
               for m, t, _ in found)


def test_no_package_uses_another_packages_private_names():
    problems = private_imports(PACKAGE)
    assert not problems, "\n".join(problems)


def test_optim_does_not_import_autodiff():
    edges = sorted(f"{path.relative_to(PACKAGE.parent)}:{line}"
                   for m, path, line, t, _ in read_imports(PACKAGE)
                   if _package_of(m, "fastadam") == "optim"
                   and _package_of(t, "fastadam") == "autodiff")
    assert not edges, edges


def test_no_import_cycle_between_packages():
    cycles = package_cycles(PACKAGE)
    assert not cycles, "\n".join(f"{comp}: {edges}" for comp, edges in cycles)


def test_no_import_cycle_between_modules_of_a_package():
    cycles = module_cycles(PACKAGE)
    assert not cycles, cycles


def test_the_compiled_drivers_import_nothing_above_them():
    above = sorted({(m, t) for m, _, _, t, _ in read_imports(PACKAGE)
                    if m.startswith("fastadam._core") and not t.startswith("fastadam._core")})
    assert not above, above


def _extension_table():
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXTENSIONS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no EXTENSIONS table")


def test_setup_builds_exactly_the_compiled_modules_of_the_tree():
    if not (ROOT / "setup.py").is_file() or PACKAGE != ROOT / "fastadam":
        pytest.skip("tests run on an installed wheel: setup.py is not beside them")
    table = _extension_table()
    pyx = {".".join(p.relative_to(ROOT).with_suffix("").parts)
           for p in PACKAGE.rglob("*.pyx")}
    assert set(table) == pyx
    for module, sources in table.items():
        assert sources[0] == module.replace(".", "/") + ".pyx"
        for source in sources:
            assert (ROOT / source).is_file(), source
    drivers = {m for m in table if m.startswith("fastadam._core.")}
    assert {"fastadam._core._dense", "fastadam._core._sparse", "fastadam._core._coeffs",
            "fastadam._core._validation"} <= drivers


# ---------------------------------------------------------------------------------------------
# The checker finds what it must (synthetic trees)

def _tree(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "fastadam"


BASE = {
    "fastadam/__init__.py": "from .optim import step\n",
    "fastadam/_core/__init__.py": "",
    "fastadam/_core/_coeffs.pxd": "cdef class AdamCoefficients:\n    pass\n",
    "fastadam/_core/_dense.pyx": "from fastadam._core._coeffs cimport AdamCoefficients\n",
    "fastadam/optim/__init__.py": "from ._functional import step, fold\n",
    "fastadam/optim/_functional.py": "from .._core import _dense\n\ndef step(): pass\n"
                                     "def fold(): pass\n",
    "fastadam/sparse/__init__.py": "from ._slices import IndexedSlices\n",
    "fastadam/sparse/_slices.py": "class IndexedSlices: pass\n",
    "fastadam/sklearn/__init__.py": "",
    "fastadam/sklearn/_mlp.py": "import fastadam\nfrom fastadam.optim import fold\n"
                                "from . import _kernels\n",
    "fastadam/sklearn/_kernels.pyx": "cimport numpy as cnp\nfrom fastadam.optim import fold\n",
}


def test_a_clean_synthetic_tree_passes(tmp_path):
    root = _tree(tmp_path, BASE)
    assert private_imports(root) == []
    assert package_cycles(root) == []
    assert module_cycles(root) == []


@pytest.mark.parametrize("name, text, expected", [
    # the imports of the tree before issue 20, one per kind
    ("fastadam/sklearn/_kernels.pyx",
     "from fastadam._core._coeffs cimport AdamCoefficients\n", "fastadam._core._coeffs.Adam"),
    ("fastadam/sklearn/_kernels.pyx",
     "def f():\n    from fastadam.optim._functional import (KIND_DENSE,\n"
     "                                               check_compute_dtype)\n",
     "fastadam.optim._functional.KIND_DENSE"),
    ("fastadam/sklearn/_sparse_linear.py", "from fastadam.sparse import _slices\n",
     "fastadam.sparse._slices"),
    ("fastadam/onnx/_training_ops.py", "from ..optim._functional import step\n",
     "fastadam.optim._functional.step"),
    ("fastadam/gpu/_layout.py", "from .._core import _coeffs\n", "fastadam._core._coeffs"),
    ("fastadam/torch/_optim.py", "def f():\n    from fastadam.optim import _functional\n",
     "fastadam.optim._functional"),
    ("fastadam/distributed/_opt.py", "from fastadam.optim import _private_name\n",
     "fastadam.optim._private_name"),
    ("fastadam/onnx/_ops.py", "import fastadam\n\ndef f(x):\n"
                              "    return fastadam.optim._functional.step(x)\n",
     "fastadam.optim._functional.step"),
    ("fastadam/sklearn/_x.py", "import fastadam\nN = fastadam._core\n", "fastadam._core"),
    # the layers below the front-ends, as they were before issue 38
    ("fastadam/optim/_params.py", "from ..gpu._validation import address\n",
     "fastadam.gpu._validation"),
    ("fastadam/optim/_sparse_functional.py", "from ..sparse._segments import _threaded\n",
     "fastadam.sparse._segments"),
    ("fastadam/__main__.py", "def f():\n    from .bench import _report\n",
     "fastadam.bench._report"),
    ("fastadam/_core/_x.py", "from ..optim import _base\n", "fastadam.optim._base"),
])
def test_a_private_import_of_another_package_fails(tmp_path, name, text, expected):
    root = _tree(tmp_path, {**BASE, name: text})
    problems = private_imports(root)
    assert problems and expected in problems[0], problems
    assert all(p.startswith(name + ":") for p in problems)


def test_core_and_own_private_imports_are_allowed(tmp_path):
    root = _tree(tmp_path, {**BASE,
                            "fastadam/sklearn/_mlp.py": "from ._kernels import _fit\n",
                            "fastadam/optim/_x.py": "from .._core._dense import _step\n"})
    assert private_imports(root) == []


def test_a_package_cycle_fails(tmp_path):
    # the tree before issue 20: the sparse steps in sparse/ used optim's folding, and optim
    # imported sparse's gradient type
    root = _tree(tmp_path, {**BASE,
                            "fastadam/sparse/_api.py": "def f():\n"
                                                       "    from ..optim import fold\n",
                            "fastadam/optim/_base.py": "from ..sparse import IndexedSlices\n"})
    cycles = package_cycles(root)
    assert [comp for comp, _ in cycles] == [["fastadam.optim", "fastadam.sparse"]]
    edges = cycles[0][1]
    assert edges[("fastadam.sparse", "fastadam.optim")] == ["fastadam/sparse/_api.py:2"]


def test_a_module_cycle_fails_and_deprecated_forwarding_is_exempt(tmp_path):
    root = _tree(tmp_path, {**BASE,
                            "fastadam/optim/_a.py": "from ._b import x\n",
                            "fastadam/optim/_b.py": "def x():\n    from . import _a\n",
                            "fastadam/sparse/__init__.py":
                                "from ._slices import IndexedSlices\n\n"
                                "def __getattr__(name):\n    from .. import optim\n"
                                "    return getattr(optim, name)\n",
                            "fastadam/optim/_c.py": "from ..sparse import IndexedSlices\n"})
    assert module_cycles(root) == [["fastadam.optim._a", "fastadam.optim._b"]]
    assert package_cycles(root) == []
