"""The fenced code blocks of the README and the documentation, run as a reader pastes them.

Used by tests/test_readme.py and tests/test_docs_examples.py.  A ```python block runs in its
own subprocess (a fresh namespace) in a temporary folder, against the fastadam the tests import.
A block that imports an optional library that is not installed is skipped with its name.
A block that must not run in the tests (it needs MPI with several ranks, a GPU, the network)
carries the line ``<!-- skip-test: REASON -->`` right above its fence; such blocks are skipped
with that reason, so pytest's summary counts them.  Signatures and formulas are fenced as
``text`` and shell commands as ``bash``: they are not Python to paste.
"""
import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SKIP_MARK = re.compile(r"^<!--\s*skip-test:\s*(\S.*?)\s*-->\s*$")


def python_blocks(path):
    """[(line, code, skip_reason or None)] of the ```python blocks of the file at path."""
    text = pathlib.Path(path).read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = SKIP_MARK.match(before)
        blocks.append((line, match.group(2), mark.group(1) if mark else None))
    return blocks


def count_python_fences(path):
    """Every opening ```python fence, indented or not (the FENCE regex sees column 0 only)."""
    return len(re.findall(r"^[ \t]*```python[ \t]*$", pathlib.Path(path).read_text(), re.M))


def missing_modules(code):
    """Top-level modules the block imports that are not installed here."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def run_block(code, cwd, fastadam_root, timeout=120):
    """Run code in a fresh interpreter in cwd, fastadam_root first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fastadam_root)]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def check_block(code, skip_reason, cwd, what):
    """The test of one block: skipped with its marker's reason or when it imports a module not
    installed here, else run (the checkout's fastadam first on the path) and required to exit 0."""
    import pytest

    if skip_reason:
        pytest.skip(skip_reason)
    missing = missing_modules(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    import fastadam

    proc = run_block(code, cwd, pathlib.Path(fastadam.__file__).resolve().parent.parent)
    assert proc.returncode == 0, f"{what} block failed:\n{code}\n--- stderr:\n{proc.stderr}"
