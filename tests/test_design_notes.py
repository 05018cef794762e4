"""Every file a design note, docstring, comment or documentation page names exists.

A path is a word that starts with a top-level folder of the project (``fastadam/``,
``include/``, ``tests/``, ``asv_bench/``, ``wheels/``, ``docs/``, ``.ci/``) and ends in a source
or document extension; ``fastadam/adam.h`` style names (as ``#include`` spells them) resolve
under ``include/``.  Build outputs (``fastadam/gpu/include/``, written by setup.py's build_py)
and asv's work folder are not sources.  The scan reads the product, the kernels, the
benchmarks, the wheels' scripts and the documentation; tests are not read (their synthetic
trees name files that only exist in a temporary folder).
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READ = [("fastadam", ("*.py", "*.pyx", "*.pxd")), ("include", ("*.h", "*.c", "*.cu", "*.def")),
        ("asv_bench", ("*.py", "*.md", "*.c", "*.sh")), ("wheels", ("*.sh", "*.md", "*.py")),
        ("docs", ("*.md", "*.rst", "*.py")), (".", ("README.md", "setup.py", "pyproject.toml")),
        (".ci", ("run",))]
EXTENSIONS = ("py", "pyx", "pxd", "h", "c", "cu", "def", "md", "rst", "sh", "toml", "json",
              "txt", "cpp")
PATH = re.compile(r"(?<![\w/.<-])((?:fastadam|include|tests|asv_bench|wheels|docs|\.ci)"
                  r"/[\w./-]*?\.(?:" + "|".join(EXTENSIONS) + r"))(?![\w/])")
NOT_SOURCES = ("fastadam/gpu/include/", "asv_bench/.asv/")


def files_read():
    for folder, patterns in READ:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for pattern in patterns:
            walk = base.glob(pattern) if folder == "." else base.rglob(pattern)
            for path in walk:
                rel = path.relative_to(ROOT).as_posix()
                # generated C of the Cython modules (git-ignored) is not a source
                if rel.startswith("fastadam/") and path.suffix == ".c":
                    continue
                if path.is_file():
                    yield path


def named_paths(text):
    for match in PATH.finditer(text):
        yield match.group(1)


def exists(name, root=ROOT):
    if name.startswith(NOT_SOURCES):
        return True
    return (root / name).exists() or (root / "include" / name).exists()


def test_the_scan_reads_the_tree_and_finds_paths():
    files = list(files_read())
    if not (ROOT / "include").is_dir():
        pytest.skip("needs the source tree (an installed wheel has no include/)")
    assert len(files) > 100
    found = {p for f in files for p in named_paths(f.read_text(errors="replace"))}
    assert "include/fastadam/optimizers.def" in found
    assert {"fastadam/_core/_dense.pyx", "fastadam/adam.h"} <= found


@pytest.mark.parametrize("text, expected", [
    ("see fastadam/optim/_base.py:294 and include/fastadam/adam.h.", ["fastadam/optim/_base.py",
                                                                     "include/fastadam/adam.h"]),
    ("#include \"fastadam/common.h\"", ["fastadam/common.h"]),
    ("(`tests/reference.py`)", ["tests/reference.py"]),
    ("fastadam.optim._base and fastadam/optim/ and a/fastadam/x.py", []),
])
def test_the_path_pattern(text, expected):
    assert list(named_paths(text)) == expected


def test_a_missing_path_is_found(tmp_path):
    (tmp_path / "include" / "fastadam").mkdir(parents=True)
    (tmp_path / "include" / "fastadam" / "adam.h").write_text("")
    assert not exists("fastadam/optim/_spec.py", tmp_path)
    assert exists("fastadam/adam.h", tmp_path) and exists("include/fastadam/adam.h", tmp_path)
    assert exists("fastadam/gpu/include/fastadam/adam.h", tmp_path)  # a build output


def test_every_named_path_exists():
    if not (ROOT / "include").is_dir():
        pytest.skip("needs the source tree (an installed wheel has no include/)")
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path in files_read()
                      for name in named_paths(path.read_text(errors="replace"))
                      if not exists(name)})
    assert not missing, "\n".join(missing)
