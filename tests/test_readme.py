"""Every ```python block of README.md runs as written, pasted into a fresh interpreter.

Each block runs in its own subprocess (a fresh namespace, as when pasted) in a temporary folder
(checkpoints land there), against the fastadam this test imports.  A block that imports an
optional library that is not installed is skipped with the library's name.  API signatures
and formulas are fenced as ``text``, not ``python``: they are not meant to be pasted.
"""
import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import fastadam

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_blocks():
    if not README.exists():  # an installed wheel tested outside the checkout
        return []
    text = README.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) == "python":
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(pytest.param(match.group(2), id=f"README.md:{line}"))
    return blocks


def missing_modules(code):
    """Top-level modules the block imports that are not installed here."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def test_readme_has_python_blocks():
    if not README.exists():
        pytest.skip("README.md is not beside this test (installed wheel)")
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("code", python_blocks())
def test_readme_block_runs(code, tmp_path):
    missing = missing_modules(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    root = str(pathlib.Path(fastadam.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"README block failed:\n{code}\n--- stderr:\n{proc.stderr}"
